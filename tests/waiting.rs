//! Waiting with wake-ups on a real cluster: release announcements, one subscription per lock
//! per client, cancel safety, re-subscription after failover.

mod common;

use std::time::{Duration, Instant};

use common::netns::Net;
use common::{alive_tasks, eventually, Cluster, Standalone};
use fencelock::{Client, LockOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_share_one_subscription_and_wake_on_release() {
    let cluster = Cluster::start();
    let holder = Client::connect(cluster.urls()).await.unwrap();
    let waiters = Client::connect(cluster.urls()).await.unwrap();
    let name = "wake:one";
    let long = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let keys = holder.keys(name, &long).unwrap();
    let master = cluster.master_of_slot(keys.slot());

    let first = holder.lock(name, &long).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..5 {
        let (client, options) = (waiters.clone(), long.clone());
        tasks.push(tokio::spawn(async move {
            let guard = client.lock(name, &options).await.unwrap();
            let fence = guard.fence();
            guard.release().await.unwrap();
            fence
        }));
    }
    eventually("the waiters' subscription", Duration::from_secs(5), || {
        master.lock_waiters_subscribed(keys.lock_key()) == 1
    })
    .await;
    // One waiter of the client asks Redis (it has the client's turn) and subscribes; the
    // other four queue behind it locally and are handed the lock in turn.
    eventually(
        "the client's turn to find it busy",
        Duration::from_secs(5),
        || waiters.stats().busy >= 1,
    )
    .await;
    assert_eq!(
        master.lock_waiters_subscribed(keys.lock_key()),
        1,
        "five waiters of one client share one subscription"
    );

    let released = Instant::now();
    let first_fence = first.fence();
    first.release().await.unwrap();
    let mut fences = Vec::new();
    for task in tasks {
        fences.push(task.await.unwrap());
    }
    let all_done = released.elapsed();
    assert!(
        all_done < Duration::from_secs(2),
        "five handoffs took {all_done:?}: waiters slept instead of waking (lease was 30 s)"
    );
    fences.sort();
    fences.dedup();
    assert_eq!(fences.len(), 5);
    assert!(fences[0] > first_fence);
    let stats = waiters.stats();
    assert!(stats.wakeups >= 1, "{stats:?}");
    assert_eq!(stats.handoffs, 4, "{stats:?}");
    assert_eq!(stats.grants, 5);
    assert_eq!(stats.waits.count(), 5);

    eventually("the subscription to end", Duration::from_secs(5), || {
        master.lock_waiters_subscribed(keys.lock_key()) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_waiter_leaves_no_lock_subscription_or_task() {
    let cluster = Cluster::start();
    let holder = Client::connect(cluster.urls()).await.unwrap();
    let waiter = Client::connect(cluster.urls()).await.unwrap();
    let name = "wake:cancel";
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let keys = holder.keys(name, &options).unwrap();
    let master = cluster.master_of_slot(keys.slot());
    let first = holder.lock(name, &options).await.unwrap();

    // A first wait, to open every connection the client keeps for good.
    let warm_up = waiter
        .lock(name, &options.clone().timeout(Duration::from_millis(50)))
        .await;
    assert!(warm_up.unwrap_err().is_busy());
    eventually(
        "the warm-up subscription to end",
        Duration::from_secs(5),
        || master.lock_waiters_subscribed(keys.lock_key()) == 0,
    )
    .await;
    let baseline = alive_tasks();

    for _ in 0..3 {
        let waiting = {
            let (client, options) = (waiter.clone(), options.clone());
            tokio::spawn(async move { client.lock(name, &options).await })
        };
        eventually("the waiter to subscribe", Duration::from_secs(5), || {
            master.lock_waiters_subscribed(keys.lock_key()) == 1
        })
        .await;
        waiting.abort();
        assert!(waiting.await.unwrap_err().is_cancelled());
        eventually("the subscription to end", Duration::from_secs(5), || {
            master.lock_waiters_subscribed(keys.lock_key()) == 0
        })
        .await;
        eventually("the dispatcher task to end", Duration::from_secs(5), || {
            alive_tasks() <= baseline
        })
        .await;
    }

    // Cancelled at every point of an acquire against a free lock: nothing stays held.
    first.release().await.unwrap();
    for delay_us in [0u64, 50, 100, 200, 400, 800, 1600] {
        let attempt = waiter.lock(name, &options);
        let _ = tokio::time::timeout(Duration::from_micros(delay_us), attempt).await;
        eventually("no holder left behind", Duration::from_secs(5), || {
            !master.held(keys.lock_key())
        })
        .await;
    }
    eventually(
        "every background release to finish",
        Duration::from_secs(5),
        || alive_tasks() <= baseline,
    )
    .await;
    let guard = holder.try_lock(name, &options).await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_resubscribe_after_failover_and_still_wake_on_release() {
    let cluster = Cluster::start();
    let holder = Client::connect(cluster.urls()).await.unwrap();
    let waiter = Client::connect(cluster.urls()).await.unwrap();
    let name = "wake:failover";
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(25));
    let keys = holder.keys(name, &options).unwrap();
    let old_master = cluster.master_of_slot(keys.slot()).port;
    let replica = cluster.replica_of(old_master).port;
    let first = holder.lock(name, &options).await.unwrap();

    let waiting = {
        let (client, options) = (waiter.clone(), options.clone());
        tokio::spawn(async move {
            let guard = client.lock(name, &options).await.unwrap();
            let fence = guard.fence();
            guard.release().await.unwrap();
            fence
        })
    };
    eventually("the waiter to subscribe", Duration::from_secs(5), || {
        cluster
            .node(old_master)
            .lock_waiters_subscribed(keys.lock_key())
            == 1
    })
    .await;

    // A manual failover waits for the replica to catch up, so the hold survives it; the old
    // master drops the slot's sharded subscribers (it pushes `sunsubscribe`), and the client
    // subscribes again on the new master (a subscription on the demoted master would never
    // see the shard's messages).
    cluster.promote(replica, "", keys.slot(), &[]);
    // Bounded generously: in the full suite three clusters run at once on two cores, and the
    // re-subscription waits for the failover's gossip to reach the client's slot map.
    eventually("the re-subscription", Duration::from_secs(20), || {
        cluster
            .node(replica)
            .lock_waiters_subscribed(keys.lock_key())
            == 1
    })
    .await;
    assert_eq!(
        cluster
            .node(old_master)
            .lock_waiters_subscribed(keys.lock_key()),
        0
    );
    assert!(
        waiter.stats().wakeups >= 1,
        "the unsubscription woke the waiter"
    );

    let released = Instant::now();
    let first_fence = first.fence();
    first.release().await.unwrap();
    let fence = waiting.await.unwrap();
    let handoff = released.elapsed();
    assert!(fence > first_fence);
    assert!(
        handoff < Duration::from_secs(2),
        "the handoff after failover took {handoff:?}: the waiter was not woken (lease 30 s)"
    );
}

/// A failover whose news reaches the rest of the cluster late: the promoted replica and the
/// demoted master are cut off from the other four nodes' cluster bus for a second, so those
/// four still route the slot to the old master. A client that refreshes its slot map from
/// one of them (redis-rs asks one node) would renew its subscription on the demoted master,
/// which accepts it as a replica and never delivers the shard's messages. Five clients, each
/// with its own subscriber connection and its own choice of node: every one must end up
/// subscribed on the new master once the news has spread, none on the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resubscription_lands_on_the_new_master_when_gossip_lags() {
    let (net, cluster) = tokio::task::spawn_blocking(Net::with_cluster)
        .await
        .unwrap();
    let holder = Client::connect(cluster.urls()).await.unwrap();
    let name = "wake:lagging-gossip";
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(25));
    let keys = holder.keys(name, &options).unwrap();
    let old_master = cluster.master_of_slot(keys.slot()).port;
    let replica = cluster.replica_of(old_master).port;
    let first = holder.lock(name, &options).await.unwrap();

    let mut tasks = Vec::new();
    for _ in 0..5 {
        let client = Client::connect(cluster.urls()).await.unwrap();
        let options = options.clone();
        tasks.push(tokio::spawn(async move {
            let guard = client.lock(name, &options).await.unwrap();
            let fence = guard.fence();
            guard.release().await.unwrap();
            fence
        }));
    }
    eventually("the five subscriptions", Duration::from_secs(10), || {
        cluster
            .node(old_master)
            .lock_waiters_subscribed(keys.lock_key())
            == 5
    })
    .await;

    let pair = [
        cluster.node(old_master).host.as_str(),
        cluster.node(replica).host.as_str(),
    ];
    let others: Vec<&str> = cluster
        .nodes
        .iter()
        .map(|n| n.host.as_str())
        .filter(|h| !pair.contains(h))
        .collect();
    net.partition(&pair, &others);
    // TAKEOVER does not wait for the replica: on a loaded machine it could lose the lock's
    // grant and the waiters' places (a fault other tests cover), so wait for it here.
    cluster.wait_caught_up(old_master, replica);
    // TAKEOVER: no votes needed from the masters that cannot hear the replica.
    cluster
        .node(replica)
        .cmd::<()>(redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER"));
    eventually(
        "the old master to step down",
        Duration::from_secs(10),
        || {
            cluster
                .node(old_master)
                .info("replication")
                .contains("role:slave")
        },
    )
    .await;
    // The fault: the news stays with the pair for a second (less than the node timeout, so
    // nobody is marked failed), while the clients renew their subscriptions.
    tokio::time::sleep(Duration::from_secs(1)).await;
    net.heal();

    eventually(
        "every client re-subscribed on the new master",
        Duration::from_secs(15),
        || {
            cluster
                .node(replica)
                .lock_waiters_subscribed(keys.lock_key())
                == 5
        },
    )
    .await;
    assert_eq!(
        cluster
            .node(old_master)
            .lock_waiters_subscribed(keys.lock_key()),
        0,
        "no subscription left on the demoted master"
    );

    let first_fence = first.fence();
    first.release().await.unwrap();
    for task in tasks {
        assert!(task.await.unwrap() > first_fence);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn standalone_waiters_wake_on_release_too() {
    let server = Standalone::start();
    // Two clients: a waiter of the holder's own client would queue behind it locally.
    let holder = Client::connect([server.url()]).await.unwrap();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let first = holder.lock("wake:standalone", &options).await.unwrap();
    let scripts_before = server.node.script_calls();
    let started = Instant::now();
    let waiting = {
        let (client, options) = (client.clone(), options.clone());
        tokio::spawn(async move { client.lock("wake:standalone", &options).await })
    };
    eventually("the waiter to subscribe", Duration::from_secs(5), || {
        server
            .node
            .lock_waiters_subscribed_plain("fencelock:{wake:standalone}:lock")
            == 1
    })
    .await;
    // Once subscribed the waiter looks again (a release may have come before the
    // subscription); release only after that second attempt was answered busy, or it could
    // take the lock without the wake-up.
    eventually(
        "the waiter's look after subscribing",
        Duration::from_secs(5),
        || server.node.script_calls() >= scripts_before + 2,
    )
    .await;
    first.release().await.unwrap();
    let second = waiting.await.unwrap().unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(client.stats().wakeups >= 1);
    second.release().await.unwrap();
}

/// A waiter whose subscribe is refused (here its ACL user may not use the lock's channels yet;
/// a lossy link's timeout is the usual cause) subscribes once it can: a failed subscribe is
/// tried again while the waiter waits (it was not: the waiter polled to the end, and a release
/// reached it only at its next re-check).
#[tokio::test(flavor = "multi_thread")]
async fn a_refused_subscribe_is_tried_again_while_its_waiter_waits() {
    let server = Standalone::start();
    let acl = |rules: &[&str]| {
        server
            .node
            .cmd::<()>(redis::cmd("ACL").arg("SETUSER").arg("waiter").arg(rules));
    };
    acl(&["on", ">pw", "~*", "+@all", "resetchannels"]);
    let holder = Client::connect([server.url()]).await.unwrap();
    let held = holder
        .lock("x", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let url = format!("redis://waiter:pw@{}", server.node.addr());
    let waiter = Client::connect([url]).await.unwrap();
    let waiting = tokio::spawn(async move {
        let options = LockOptions::new().timeout(Duration::from_secs(25));
        let guard = waiter.lock("x", &options).await.expect("granted");
        let granted = Instant::now();
        guard.release().await.expect("released");
        granted
    });
    eventually("the refused subscribe", Duration::from_secs(10), || {
        let log: Vec<redis::Value> = server.node.cmd(redis::cmd("ACL").arg("LOG"));
        format!("{log:?}").contains("channel")
    })
    .await;
    acl(&["allchannels"]);
    eventually("the waiter's subscription", Duration::from_secs(10), || {
        server
            .node
            .lock_waiters_subscribed_plain("fencelock:{x}:lock")
            == 1
    })
    .await;
    let released = Instant::now();
    held.release().await.unwrap();
    let granted = waiting.await.unwrap();
    assert!(
        granted.saturating_duration_since(released) < Duration::from_secs(1),
        "woken {:?} after the release",
        granted.saturating_duration_since(released)
    );
}
