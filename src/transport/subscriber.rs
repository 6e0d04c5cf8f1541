//! The waiters' subscriber: the connection that carries their subscriptions ([`Subscriber`],
//! opened by [`Endpoint::open_subscriber`](super::Endpoint::open_subscriber)), and whether the
//! node it sends a channel's subscription to serves that channel's slot.

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::RedisResult;

/// A connection that carries the waiters' subscriptions: sharded channels on a cluster (the
/// channel lives on the lock's node), plain channels on a standalone server.
pub(crate) enum Subscriber {
    Cluster(ClusterConnection),
    Standalone(MultiplexedConnection),
}

impl Subscriber {
    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Subscriber::Cluster(c) => c.ssubscribe(channel).await,
            Subscriber::Standalone(c) => c.subscribe(channel).await,
        }
    }

    /// Makes the connection learn who serves `channel`'s slot now: a keyed command sent to a
    /// former master answers `MOVED`, which refreshes the slot map. Without it a subscription
    /// renewed after a failover can land on the demoted master, which as a replica accepts it
    /// but (Redis 7.0) never receives the shard's messages.
    pub(crate) async fn locate(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Subscriber::Cluster(c) => redis::cmd("EXISTS").arg(channel).query_async(c).await,
            Subscriber::Standalone(_) => Ok(()),
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Subscriber::Cluster(c) => c.sunsubscribe(channel).await,
            Subscriber::Standalone(c) => c.unsubscribe(channel).await,
        }
    }

    /// Whether the node this connection's slot map names as the master of `channel`'s slot,
    /// the node a `subscribe` of the channel goes to, is that slot's master by its own account
    /// (`CLUSTER NODES`: the `myself` line is a master and lists the slot). False means the
    /// slot map is stale: a failover demoted that node, or the slot moved away from it. True
    /// on a standalone server.
    pub(crate) async fn serves(&mut self, channel: &str) -> RedisResult<bool> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        match self {
            Subscriber::Cluster(c) => {
                let slot = crate::keys::slot_of(channel.as_bytes());
                let route = Route::new(slot, SlotAddr::Master);
                let mut cmd = redis::cmd("CLUSTER");
                cmd.arg("NODES");
                let reply = c
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await?;
                let nodes: String = redis::from_redis_value(reply)?;
                Ok(myself_serves(&nodes, slot))
            }
            Subscriber::Standalone(_) => Ok(true),
        }
    }
}

/// Whether the `myself` line of a `CLUSTER NODES` reply is a master that lists `slot` (a
/// single slot `N` or a range `A-B`; importing and migrating entries, `[N-<-id]` and
/// `[N->-id]`, do not count).
fn myself_serves(nodes: &str, slot: u16) -> bool {
    let Some(line) = nodes.lines().find(|line| {
        line.split(' ')
            .nth(2)
            .is_some_and(|flags| flags.split(',').any(|f| f == "myself"))
    }) else {
        return false;
    };
    let fields: Vec<&str> = line.split(' ').collect();
    if !fields[2].split(',').any(|f| f == "master") {
        return false;
    }
    fields.iter().skip(8).any(|range| {
        let mut ends = range.splitn(2, '-').map(str::parse::<u16>);
        match (ends.next(), ends.next()) {
            (Some(Ok(single)), None) => single == slot,
            (Some(Ok(first)), Some(Ok(last))) => (first..=last).contains(&slot),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::myself_serves;

    #[test]
    fn the_myself_line_tells_whether_a_node_serves_a_slot() {
        let master = "a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460 6000 \
                      [7000->-b2]\n\
                      b2 127.0.0.1:7002@17002 master - 0 1 2 connected 5461-5999 6001-10922\n";
        assert!(myself_serves(master, 0));
        assert!(myself_serves(master, 5460));
        assert!(myself_serves(master, 6000));
        assert!(!myself_serves(master, 5461), "another master's range");
        assert!(
            !myself_serves(master, 7000),
            "a migrating slot is listed in brackets only"
        );
        let demoted = "a1 127.0.0.1:7001@17001 myself,slave c3 0 0 3 connected\n\
                       c3 127.0.0.1:7003@17003 master - 0 1 3 connected 0-5460\n";
        assert!(!myself_serves(demoted, 10), "a replica serves no slot");
        assert!(!myself_serves("", 10));
    }
}
