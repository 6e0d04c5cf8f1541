//! The transport: connections (cluster or standalone detection, timeouts, TLS), their health
//! (a main connection rebuilt after repeated failures), WAIT lanes, and the bounded script calls
//! everything above makes through [`Transport`].

mod batch;
mod tls;

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{
    AsyncPushSender, ConnectionLike, ConnectionManager, ConnectionManagerConfig,
    MultiplexedConnection,
};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, Cmd, ConnectionInfo, IntoConnectionInfo, Pipeline, RedisError};
use redis::{ProtocolVersion, RedisFuture, RedisResult, Value};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};
use crate::human::HumanDuration;
use crate::script::ScriptCall;

pub(crate) use batch::SlotMap;
pub(crate) use tls::TlsFiles;

use batch::{Batcher, Entry};

/// Where the reply of a queued call arrives ([`Transport::queue`]).
pub(crate) type Reply = tokio::sync::oneshot::Receiver<Result<Value>>;

/// What kind of deployment the client talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// A Redis Cluster (`cluster_enabled:1`).
    Cluster,
    /// A single Redis server.
    Standalone,
}

/// Timeouts applied to every connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

/// One handle to Redis: a cluster connection (routes by key, follows MOVED/ASK) or a
/// single-node one.
#[derive(Clone)]
pub(crate) enum Connection {
    Cluster(ClusterConnection),
    Managed(ConnectionManager),
    Direct(MultiplexedConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Cluster(c) => c.req_packed_command(cmd),
            Connection::Managed(c) => c.req_packed_command(cmd),
            Connection::Direct(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Managed(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Direct(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Cluster(c) => c.get_db(),
            Connection::Managed(c) => c.get_db(),
            Connection::Direct(c) => c.get_db(),
        }
    }
}

/// How to open more connections to the same deployment (one per client: size is no concern).
#[allow(clippy::large_enum_variant)]
enum Opener {
    /// Lanes are cluster connections of their own (no response timeout: callers bound them).
    Cluster(ClusterClient),
    Standalone(redis::Client),
    /// A cluster client the application built: every connection (main, lanes, subscriber) is
    /// opened through it, as its initial nodes are not readable.
    Given(ClusterClient),
}

/// Where a client's connections come from.
#[derive(Clone)]
pub(crate) enum Seeds {
    /// URLs, parsed here.
    Urls(Vec<String>),
    /// Connection infos taken from a `redis::Client` (they keep its auth, database, protocol and
    /// TLS parameters).
    Infos(Vec<ConnectionInfo>),
    /// A `redis::cluster::ClusterClient` used as it is.
    Cluster(Box<ClusterClient>),
}

impl Seeds {
    /// The seeds with this user and password in place of the ones they carry.
    pub(crate) fn with_credentials(
        self,
        username: Option<&str>,
        password: Option<&str>,
    ) -> Result<Seeds> {
        let infos = match self {
            Seeds::Urls(urls) => urls
                .iter()
                .map(|url| parse_url(url))
                .collect::<Result<Vec<_>>>()?,
            Seeds::Infos(infos) => infos,
            Seeds::Cluster(_) => {
                return Err(Error::InvalidConfig {
                    reason: "a user or password was set on a client built from a cluster \
                             client: set them on the cluster client's builder"
                        .into(),
                })
            }
        };
        if infos.is_empty() {
            return Ok(Seeds::Urls(Vec::new()));
        }
        Ok(Seeds::Infos(
            infos
                .into_iter()
                .map(|info| {
                    let mut settings = info.redis_settings().clone();
                    if let Some(username) = username {
                        settings = settings.set_username(username);
                    }
                    if let Some(password) = password {
                        settings = settings.set_password(password);
                    } else if username.is_some() && settings.password().is_none() {
                        // redis-rs authenticates only with a password: without one the
                        // connection would silently be the `default` user's.
                        settings = settings.set_password("");
                    }
                    info.set_redis_settings(settings)
                })
                .collect(),
        ))
    }
}

impl std::fmt::Debug for Seeds {
    /// Addresses only: no password is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seeds::Urls(urls) => f
                .debug_list()
                .entries(urls.iter().map(|url| redact(url)))
                .finish(),
            Seeds::Infos(infos) => f
                .debug_list()
                .entries(infos.iter().map(|info| info.addr().to_string()))
                .finish(),
            Seeds::Cluster(_) => f.write_str("ClusterClient"),
        }
    }
}

/// The deployment found at the given URLs.
pub(crate) struct Endpoint {
    pub(crate) topology: Topology,
    pub(crate) nodes: String,
    opener: Opener,
    timeouts: Timeouts,
    seeds: Vec<ConnectionInfo>,
    retries: u32,
    /// Applied to every connection: the seeds carry them, and every cluster builder.
    certs: Option<tls::Certs>,
}

/// After the first seed answers, how long the others get to answer too.
const PROBE_GRACE: Duration = Duration::from_millis(25);

impl Endpoint {
    /// Reads the TLS files, probes every URL at once, detects cluster mode and opens the main
    /// connection through the nodes that answer.
    pub(crate) async fn discover(
        seeds: &Seeds,
        timeouts: Timeouts,
        retries: u32,
        tls_files: &TlsFiles,
    ) -> Result<(Self, Connection)> {
        let seeds = match seeds {
            Seeds::Urls(urls) if urls.is_empty() => {
                return Err(Error::InvalidConfig {
                    reason: "no Redis URL given: pass at least one, e.g. redis://127.0.0.1:6379"
                        .into(),
                })
            }
            Seeds::Urls(urls) => urls
                .iter()
                .map(|url| parse_url(url))
                .collect::<Result<Vec<_>>>()?,
            Seeds::Infos(infos) => infos.clone(),
            Seeds::Cluster(client) => {
                return Self::given((**client).clone(), timeouts, retries, tls_files).await
            }
        };
        let certs = tls::prepare(tls_files, &seeds)?;
        let seeds = seeds
            .into_iter()
            .map(|seed| tls::apply(seed, certs.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        let nodes = seeds
            .iter()
            .map(|i| i.addr().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let (topology, live) = probe_all(&seeds, timeouts, &nodes).await?;
        let opener = match topology {
            Topology::Cluster => Opener::Cluster(
                cluster_builder(&seeds, timeouts, retries, certs.as_ref())
                    .response_timeout(Duration::from_secs(24 * 3600))
                    .overall_response_timeout(None)
                    .build()
                    .map_err(|e| config_error(&nodes, e))?,
            ),
            Topology::Standalone => Opener::Standalone(
                redis::Client::open(live[0].clone()).map_err(|e| config_error(&nodes, e))?,
            ),
        };
        let endpoint = Self {
            topology,
            nodes,
            opener,
            timeouts,
            seeds,
            retries,
            certs,
        };
        let conn = endpoint.connect_through(&live).await?;
        Ok((endpoint, conn))
    }

    /// The endpoint of a cluster client the application built: no probes (it is a cluster),
    /// the connections are opened through the client with this client's timeouts.
    async fn given(
        client: ClusterClient,
        timeouts: Timeouts,
        retries: u32,
        tls_files: &TlsFiles,
    ) -> Result<(Self, Connection)> {
        if tls_files.ca.is_some() || tls_files.client.is_some() {
            return Err(Error::InvalidConfig {
                reason: "TLS files were given with a redis-rs ClusterClient: set the \
                         certificates on its ClusterClientBuilder (`certs`) instead"
                    .into(),
            });
        }
        tls::ensure_provider();
        let endpoint = Self {
            topology: Topology::Cluster,
            nodes: "the given ClusterClient's nodes".into(),
            opener: Opener::Given(client),
            timeouts,
            seeds: Vec::new(),
            retries,
            certs: None,
        };
        let conn = endpoint.main_connection().await?;
        Ok((endpoint, conn))
    }

    /// Connection settings for a connection opened through a given cluster client.
    fn given_config(&self, response: Duration) -> redis::cluster::ClusterConfig {
        redis::cluster::ClusterConfig::new()
            .set_connection_timeout(self.timeouts.connect)
            .set_response_timeout(response)
    }

    /// Opens a fresh main connection (new slot map) through the seeds that answer now.
    pub(crate) async fn main_connection(&self) -> Result<Connection> {
        if let Opener::Given(client) = &self.opener {
            let config = self.given_config(self.timeouts.response);
            return self
                .within(client.get_async_connection_with_config(config))
                .await
                .map(Connection::Cluster);
        }
        let (_, live) = probe_all(&self.seeds, self.timeouts, &self.nodes).await?;
        self.connect_through(&live).await
    }

    /// Opens the connection all lock traffic but WAIT uses, seeded only with nodes that just
    /// answered: redis-rs waits for every seed, and a paused one would stall it.
    async fn connect_through(&self, live: &[ConnectionInfo]) -> Result<Connection> {
        match self.topology {
            Topology::Cluster => {
                let client =
                    cluster_builder(live, self.timeouts, self.retries, self.certs.as_ref())
                        .build()
                        .map_err(|e| config_error(&self.nodes, e))?;
                self.within(client.get_async_connection())
                    .await
                    .map(Connection::Cluster)
            }
            Topology::Standalone => {
                let client = redis::Client::open(live[0].clone())
                    .map_err(|e| config_error(&self.nodes, e))?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeouts.connect))
                    .set_response_timeout(Some(self.timeouts.response))
                    .set_number_of_retries(self.retries as usize)
                    .set_max_delay(Duration::from_millis(500));
                self.within(client.get_connection_manager_with_config(config))
                    .await
                    .map(Connection::Managed)
            }
        }
    }

    /// Bounds opening a connection by the connect and response timeouts, naming the nodes in
    /// the error.
    async fn within<T>(
        &self,
        open: impl std::future::Future<Output = RedisResult<T>>,
    ) -> Result<T> {
        let deadline = self.timeouts.connect + self.timeouts.response;
        match tokio::time::timeout(deadline, open).await {
            Ok(Ok(conn)) => Ok(conn),
            Ok(Err(source)) => Err(connect_error(&self.nodes, source, self.uses_tls())),
            Err(_) => Err(Error::Connect {
                target: self.nodes.clone(),
                reason: format!(
                    "no answer within {}: is Redis running there?",
                    HumanDuration(deadline)
                ),
                source: None,
            }),
        }
    }

    /// Whether the nodes are reached over TLS (`rediss://`).
    fn uses_tls(&self) -> bool {
        self.seeds.iter().any(is_tls)
    }

    /// Opens a RESP3 connection whose server pushes (messages, unsubscriptions, disconnects)
    /// go to `push`, for the waiters' subscriptions; seeded with the nodes that answer now.
    pub(crate) async fn open_subscriber(&self, push: impl AsyncPushSender) -> Result<Subscriber> {
        if let Opener::Given(client) = &self.opener {
            // Pushes arrive only if the application's client speaks RESP3; otherwise the
            // subscription fails and waiters poll.
            let config = self
                .given_config(self.timeouts.response)
                .set_push_sender(push);
            return self
                .within(client.get_async_connection_with_config(config))
                .await
                .map(Subscriber::Cluster);
        }
        let (_, live) = probe_all(&self.seeds, self.timeouts, &self.nodes).await?;
        match self.topology {
            Topology::Cluster => {
                let client =
                    cluster_builder(&live, self.timeouts, self.retries, self.certs.as_ref())
                        .use_protocol(ProtocolVersion::RESP3)
                        .push_sender(push)
                        .build()
                        .map_err(|e| config_error(&self.nodes, e))?;
                self.within(client.get_async_connection())
                    .await
                    .map(Subscriber::Cluster)
            }
            Topology::Standalone => {
                let info = live[0].clone();
                let settings = info
                    .redis_settings()
                    .clone()
                    .set_protocol(ProtocolVersion::RESP3);
                let client = redis::Client::open(info.set_redis_settings(settings))
                    .map_err(|e| config_error(&self.nodes, e))?;
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.timeouts.connect))
                    .set_response_timeout(Some(self.timeouts.response))
                    .set_push_sender(push);
                self.within(client.get_multiplexed_async_connection_with_config(&config))
                    .await
                    .map(Subscriber::Standalone)
            }
        }
    }

    /// Opens a connection that nothing else uses, for commands that block it (WAIT).
    ///
    /// It has no response timeout of its own: the caller bounds every request and drops the
    /// connection when a deadline passes.
    async fn open_lane(&self) -> RedisResult<Connection> {
        match &self.opener {
            Opener::Cluster(client) => client.get_async_connection().await.map(Connection::Cluster),
            Opener::Given(client) => client
                .get_async_connection_with_config(self.given_config(Duration::from_secs(24 * 3600)))
                .await
                .map(Connection::Cluster),
            Opener::Standalone(client) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.timeouts.connect))
                    .set_response_timeout(None);
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                    .map(Connection::Direct)
            }
        }
    }
}

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

fn cluster_builder(
    infos: &[ConnectionInfo],
    timeouts: Timeouts,
    retries: u32,
    certs: Option<&tls::Certs>,
) -> ClusterClientBuilder {
    let builder = ClusterClientBuilder::new(infos.to_vec())
        .connection_timeout(timeouts.connect)
        .response_timeout(timeouts.response)
        .overall_response_timeout(Some(timeouts.response * (retries + 1)))
        .retries(retries)
        .min_retry_wait(10)
        .max_retry_wait(300)
        .retry_wait_formula(10, 2);
    // The seeds carry the certificates already; the nodes the cluster reports do not.
    tls::apply_to_cluster(builder, certs)
}

fn parse_url(url: &str) -> Result<ConnectionInfo> {
    url.into_connection_info()
        .map_err(|e| Error::InvalidConfig {
            reason: format!(
                "{:?} is not a usable Redis URL ({e}): expected redis://[user:password@]host:port \
             or rediss://… (TLS needs the `tls` feature)",
                redact(url)
            ),
        })
}

/// The URL with any password replaced, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}://***{}", &url[..scheme_end], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Probes every seed at once. Returns the topology and the seeds that answered (the first, and
/// any others within [`PROBE_GRACE`] of it), or, when none did, the most telling failure: a
/// refusal such as a wrong password is returned at once, as no other seed will fare better.
async fn probe_all(
    seeds: &[ConnectionInfo],
    timeouts: Timeouts,
    nodes: &str,
) -> Result<(Topology, Vec<ConnectionInfo>)> {
    let mut probes = tokio::task::JoinSet::new();
    for seed in seeds {
        let seed = seed.clone();
        probes.spawn(async move {
            let outcome = probe(&seed, timeouts).await;
            (seed, outcome)
        });
    }
    let (mut topology, mut live, mut failure) = (None, Vec::new(), None);
    let mut grace_end = None;
    loop {
        let joined = match grace_end {
            Some(end) => match tokio::time::timeout_at(end, probes.join_next()).await {
                Ok(joined) => joined,
                Err(_) => break,
            },
            None => probes.join_next().await,
        };
        let Some(joined) = joined else { break };
        let Ok((seed, outcome)) = joined else {
            continue;
        };
        match outcome {
            Ok(found) => {
                topology.get_or_insert(found);
                live.push(seed);
                grace_end.get_or_insert(tokio::time::Instant::now() + PROBE_GRACE);
            }
            Err(err) if live.is_empty() && is_refusal(&err) => return Err(err),
            Err(err) => {
                failure.get_or_insert(err);
            }
        }
    }
    match topology {
        Some(topology) => Ok((topology, live)),
        None => Err(failure.unwrap_or_else(|| Error::Connect {
            target: nodes.to_owned(),
            reason: "no node answered".into(),
            source: None,
        })),
    }
}

/// Asks one node whether it runs in cluster mode.
async fn probe(info: &ConnectionInfo, timeouts: Timeouts) -> Result<Topology> {
    let target = info.addr().to_string();
    let attempt = async {
        let client = redis::Client::open(info.clone())?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeouts.connect))
            .set_response_timeout(Some(timeouts.response));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("INFO")
            .arg("cluster")
            .query_async::<String>(&mut conn)
            .await
    };
    let deadline = timeouts.connect + timeouts.response;
    match tokio::time::timeout(deadline, attempt).await {
        Ok(Ok(info)) if info.contains("cluster_enabled:1") => Ok(Topology::Cluster),
        Ok(Ok(_)) => Ok(Topology::Standalone),
        Ok(Err(source)) => Err(connect_error(&target, source, is_tls(info))),
        Err(_) => Err(Error::Connect {
            target,
            reason: format!(
                "no answer within {}: is Redis running there?",
                HumanDuration(deadline)
            ),
            source: None,
        }),
    }
}

fn is_auth_failure(source: &RedisError) -> bool {
    source.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(source.code(), Some("NOAUTH" | "WRONGPASS"))
}

fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. })
}

/// The [`Error::Connect`] for a failed connection to `target` (`tls`: over `rediss://`): the
/// reason tells a DNS failure, a refused connection, a TLS mismatch (a plain URL for a TLS
/// port, `rediss://` for a plain one), a failed handshake and refused credentials apart and
/// does not repeat `source`'s text, which the error's `source()` carries.
fn connect_error(target: &str, source: RedisError, tls: bool) -> Error {
    Error::Connect {
        target: target.to_owned(),
        reason: connect_reason(&source, tls).to_owned(),
        source: Some(source),
    }
}

fn connect_reason(source: &RedisError, tls: bool) -> &'static str {
    use std::io::ErrorKind;
    if let Some(reason) = tls::failure(source) {
        return reason;
    }
    if is_auth_failure(source) {
        return "authentication failed: check the user name and password";
    }
    let io = io_error(source);
    // std's resolver errors say so on every platform; redis-rs keeps only the text of some.
    let text = source.to_string();
    if text.contains("lookup address information") || text.contains("no address") {
        return "the host name could not be resolved (DNS): check the host name in the URL";
    }
    match io.map(std::io::Error::kind) {
        Some(ErrorKind::ConnectionRefused) => {
            "connection refused: nothing listens on that port; is Redis running there?"
        }
        // A TLS port closes a connection that does not start a TLS handshake.
        Some(ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe)
            if !tls =>
        {
            "the server closed the connection at once: if that port speaks TLS, use a rediss:// \
             URL"
        }
        // A plain port reads the TLS handshake as a command and waits for the rest of it.
        Some(ErrorKind::TimedOut | ErrorKind::WouldBlock) if tls => {
            "no answer to the TLS handshake: if that port speaks plain Redis (no TLS), use a \
             redis:// URL; else is Redis running there?"
        }
        Some(ErrorKind::TimedOut | ErrorKind::WouldBlock) => "no answer: is Redis running there?",
        Some(_) if tls => "the TLS connection failed: is it a TLS port, and Redis running there?",
        Some(_) => "the connection failed: is Redis running there?",
        None if source.is_timeout() => "no answer: is Redis running there?",
        None if source.is_io_error() || source.is_connection_refusal() => {
            "the connection failed: is Redis running there?"
        }
        None => "the server refused the connection",
    }
}

/// The I/O error `source` is or wraps.
fn io_error(source: &RedisError) -> Option<&std::io::Error> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(source);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        if let Some(shared) = err.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>() {
            next = Some(shared.as_ref());
            continue;
        }
        next = err.source();
    }
    None
}

fn config_error(target: &str, source: RedisError) -> Error {
    Error::InvalidConfig {
        reason: format!("cannot configure a client for {target}: {source}"),
    }
}

/// A node answered and said no (bad password, failed TLS handshake), as opposed to not
/// answering.
fn is_refusal(err: &Error) -> bool {
    matches!(err, Error::Connect { source: Some(s), .. }
        if is_auth_failure(s)
            || tls::failure(s).is_some()
            || !(s.is_connection_refusal() || s.is_io_error() || s.is_timeout()))
}

/// Runs `script` by SHA, falling back to the full source once on `NOSCRIPT`.
async fn eval(conn: &mut Connection, call: &ScriptCall) -> RedisResult<Value> {
    match call.evalsha().query_async(conn).await {
        Err(err) if is_noscript(&err) => call.eval().query_async(conn).await,
        other => other,
    }
}

/// Runs `script` and then `WAIT replicas timeout` in one pipeline on one node connection, so
/// WAIT counts acknowledgements of exactly the script's writes. Returns the script's reply and
/// the number of replicas that acknowledged.
async fn eval_then_wait(
    conn: &mut Connection,
    call: &ScriptCall,
    replicas: u32,
    wait: Duration,
) -> RedisResult<(Value, i64)> {
    let wait_ms = wait.as_millis().max(1).to_string();
    let pipe = |invocation: Cmd| {
        let mut pipe = redis::pipe();
        pipe.add_command(invocation)
            .add_command(redis::cmd("WAIT").arg(replicas).arg(&wait_ms).to_owned());
        pipe
    };
    match pipe(call.evalsha().clone()).query_async(conn).await {
        Err(err) if is_noscript(&err) => pipe(call.eval()).query_async(conn).await,
        other => other,
    }
}

fn is_noscript(err: &RedisError) -> bool {
    err.code() == Some("NOSCRIPT")
}

/// After this many consecutive timeouts or connection errors the main connection is rebuilt.
const REBUILD_AFTER: u32 = 2;

/// The connections of one client and their health: every Redis call of the client, its guards
/// and its background tasks goes through here, bounded by the request timeout.
pub(crate) struct Transport {
    /// The main connection; replaced when it keeps timing out (see [`Transport::observe`]).
    conn: RwLock<Connection>,
    /// Consecutive transient failures on the main connection.
    failures: AtomicU32,
    /// A rebuild is under way.
    rebuilding: AtomicBool,
    /// Rebuilds done, for [`crate::Stats::connection_rebuilds`].
    rebuilds: AtomicU64,
    lanes: Lanes,
    request_timeout: Duration,
    /// Background calls ([`Transport::run_detached`]) not yet finished, for
    /// [`Transport::settle`].
    detached: AtomicUsize,
    /// Signalled whenever a background call finishes.
    detached_done: Notify,
    /// Sends concurrent calls of one script for keys of one node as one call.
    batcher: Batcher,
}

/// Counts one background call until it is dropped (finished, failed, or cancelled by a runtime
/// shutting down).
struct DetachedTicket(Arc<Transport>);

impl Drop for DetachedTicket {
    fn drop(&mut self) {
        self.0.detached.fetch_sub(1, Ordering::AcqRel);
        self.0.detached_done.notify_waiters();
    }
}

impl Transport {
    /// The transport over `conn`, the main connection [`Endpoint::discover`] opened.
    pub(crate) fn new(
        endpoint: Endpoint,
        conn: Connection,
        wait_lanes: usize,
        request_timeout: Duration,
        batching: bool,
    ) -> Self {
        Self {
            batcher: Batcher::new(batching, endpoint.topology),
            conn: RwLock::new(conn),
            failures: AtomicU32::new(0),
            rebuilding: AtomicBool::new(false),
            rebuilds: AtomicU64::new(0),
            lanes: Lanes::new(endpoint, wait_lanes),
            request_timeout,
            detached: AtomicUsize::new(0),
            detached_done: Notify::new(),
        }
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        self.lanes.endpoint()
    }

    pub(crate) fn topology(&self) -> Topology {
        self.endpoint().topology
    }

    /// The deadline of one call.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// How release scripts announce a freed lock: `s` SPUBLISH, `p` PUBLISH.
    pub(crate) fn announce(&self) -> &'static str {
        match self.topology() {
            Topology::Cluster => "s",
            Topology::Standalone => "p",
        }
    }

    /// How often the main connection was rebuilt.
    pub(crate) fn rebuilds(&self) -> u64 {
        self.rebuilds.load(Ordering::Relaxed)
    }

    /// `CLUSTER SLOTS` from any node, within the request timeout.
    pub(crate) async fn cluster_slots(&self) -> Result<Value> {
        let mut conn = self.connection();
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
        bounded(
            "*",
            "cluster slots",
            self.request_timeout,
            cmd.query_async(&mut conn),
        )
        .await
    }

    /// Runs `cmd` on the master serving `slot` (a cluster; the client's slot map routes it) or
    /// on the server (standalone), within the request timeout: for commands that belong to
    /// one node, such as `SCAN`.
    pub(crate) async fn run_on_master(
        &self,
        slot: u16,
        cmd: Cmd,
        operation: &'static str,
    ) -> Result<Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let mut conn = self.connection();
        let call = async move {
            match &mut conn {
                Connection::Cluster(c) => {
                    let route = Route::new(slot, SlotAddr::Master);
                    c.route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await
                }
                other => cmd.query_async(other).await,
            }
        };
        bounded("*", operation, self.request_timeout, call).await
    }

    fn connection(&self) -> Connection {
        self.conn
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many batch calls were sent (each carrying two or more calls), and how many calls
    /// they carried.
    pub(crate) fn batches(&self) -> (u64, u64) {
        let batcher = &self.batcher;
        (
            batcher.batches.load(Ordering::Relaxed),
            batcher.batched_calls.load(Ordering::Relaxed),
        )
    }

    /// Runs `call` on the main connection within the request timeout; errors name `name` and
    /// `operation`. Calls of a batchable script are queued for their node and sent together
    /// with the calls of the same script that other tasks make meanwhile (see `batch.rs`).
    ///
    /// # Cancel safety
    ///
    /// A call dropped before it was sent is not sent; one dropped after may still run (the
    /// callers arm an undo).
    ///
    /// A call given by value is queued as it is; one given by reference is copied when queued.
    pub(crate) async fn run<'c>(
        self: &Arc<Self>,
        call: impl Into<Cow<'c, ScriptCall>>,
        name: &str,
        operation: &'static str,
    ) -> Result<Value> {
        match self.queue(call, name, operation) {
            Ok(reply) => self.reply(reply, name, operation).await,
            Err(call) => self.run_alone(&call, name, operation).await,
        }
    }

    /// As [`run`](Self::run) for an undo: queued on a node's driver, it is sent only after the
    /// driver's rounds in flight have been answered (resends after `NOSCRIPT` or a moved key
    /// included), so it does not overtake the call it undoes when that went through the same
    /// driver. Its reply is awaited for one request timeout, as any call's; an undo given up
    /// on stays queued and is still sent.
    pub(crate) async fn run_undo(
        self: &Arc<Self>,
        call: ScriptCall,
        name: &str,
        operation: &'static str,
    ) -> Result<Value> {
        self.undo_within(call, name, operation, Some(self.request_timeout))
            .await
    }

    /// [`run_undo`](Self::run_undo), its reply awaited for `limit`, or (`None`) until the
    /// driver answers: its rounds are bounded, and a driver that ends drops what it holds.
    async fn undo_within(
        self: &Arc<Self>,
        call: ScriptCall,
        name: &str,
        operation: &'static str,
        limit: Option<Duration>,
    ) -> Result<Value> {
        let timeout = || Error::Timeout {
            name: name.to_owned(),
            operation,
            after: limit.unwrap_or(self.request_timeout),
        };
        match self.enqueue(Cow::Owned(call), name, operation, true) {
            Ok(reply) => match limit {
                Some(limit) => match tokio::time::timeout(limit, reply).await {
                    Ok(Ok(outcome)) => outcome,
                    Ok(Err(_)) | Err(_) => Err(timeout()),
                },
                None => reply.await.unwrap_or_else(|_| Err(timeout())),
            },
            Err(call) => self.run_alone(&call, name, operation).await,
        }
    }

    /// Queues `call` on its node's driver, if it goes through one (see [`run`](Self::run)):
    /// then it is sent after every call queued before it for that node, and the reply arrives
    /// on the receiver ([`reply`](Self::reply)). Gives the call back when it must be sent on
    /// its own (with [`run`](Self::run)).
    pub(crate) fn queue<'c>(
        self: &Arc<Self>,
        call: impl Into<Cow<'c, ScriptCall>>,
        name: &str,
        operation: &'static str,
    ) -> std::result::Result<Reply, Cow<'c, ScriptCall>> {
        self.enqueue(call.into(), name, operation, false)
    }

    fn enqueue<'c>(
        self: &Arc<Self>,
        call: Cow<'c, ScriptCall>,
        name: &str,
        operation: &'static str,
        after_in_flight: bool,
    ) -> std::result::Result<Reply, Cow<'c, ScriptCall>> {
        let Some(node) = self.batcher.node(self, &call) else {
            return Err(call);
        };
        let (entry, reply) = Entry::new(call.into_owned(), name, operation, after_in_flight);
        match self.batcher.queue(self, node, entry) {
            Ok(()) => Ok(reply),
            Err(entry) => Err(Cow::Owned(entry.into_call())),
        }
    }

    /// The reply of a queued call, within the request timeout.
    pub(crate) async fn reply(
        &self,
        reply: Reply,
        name: &str,
        operation: &'static str,
    ) -> Result<Value> {
        match tokio::time::timeout(self.request_timeout, reply).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) | Err(_) => Err(Error::Timeout {
                name: name.to_owned(),
                operation,
                after: self.request_timeout,
            }),
        }
    }

    /// Runs `call` on its own on the main connection within the request timeout, past the
    /// node's driver: for a call that no call queued before it can conflict with (a handoff:
    /// its releasing owner has nothing else in flight, its new owner's token is fresh), which
    /// saves the driver's task hop on a path where every grant waits for the one before.
    pub(crate) async fn run_direct(
        self: &Arc<Self>,
        call: &ScriptCall,
        name: &str,
        operation: &'static str,
    ) -> Result<Value> {
        self.run_alone(call, name, operation).await
    }

    /// Runs `call` on its own on the main connection within the request timeout.
    async fn run_alone(
        self: &Arc<Self>,
        call: &ScriptCall,
        name: &str,
        operation: &'static str,
    ) -> Result<Value> {
        let mut conn = self.connection();
        let call = eval(&mut conn, call);
        let outcome = bounded(name, operation, self.request_timeout, call).await;
        self.observe(&outcome);
        outcome
    }

    /// Hands `call` to the current runtime, if there is one, to run in the background (a
    /// release nobody awaits); never blocks or panics. A failure is only logged.
    pub(crate) fn run_detached(self: &Arc<Self>, call: ScriptCall, operation: &'static str) {
        let transport = Arc::clone(self);
        self.spawn_detached(async move {
            let key = call.first_key();
            if let Err(err) = transport.run(&call, key, operation).await {
                tracing::debug!(lock = key, error = %err, "background {operation} failed");
            }
        });
    }

    /// As [`run_detached`](Self::run_detached) for the undo of a call cut while in flight (see
    /// [`run_undo`](Self::run_undo)): counted for [`settle`](Self::settle) until the driver
    /// has answered it, however long the rounds before it take.
    pub(crate) fn undo_detached(self: &Arc<Self>, call: ScriptCall, operation: &'static str) {
        let transport = Arc::clone(self);
        self.spawn_detached(async move {
            let key = call.first_key().to_owned();
            if let Err(err) = transport.undo_within(call, &key, operation, None).await {
                tracing::debug!(lock = key, error = %err, "background {operation} failed");
            }
        });
    }

    /// Hands `task` (background calls nobody awaits) to the current runtime, if there is one,
    /// counted in [`detached`](Self::detached) until it ends.
    pub(crate) fn spawn_detached(
        self: &Arc<Self>,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.detached.fetch_add(1, Ordering::AcqRel);
            let ticket = DetachedTicket(Arc::clone(self));
            runtime.spawn(async move {
                let _ticket = ticket;
                task.await;
            });
        }
    }

    /// Background calls started by [`run_detached`](Self::run_detached) and not finished yet.
    pub(crate) fn detached(&self) -> usize {
        self.detached.load(Ordering::Acquire)
    }

    /// Waits until every background call has finished, or `limit` has passed. Returns how many
    /// are still running (0 when all finished).
    ///
    /// Each background call is itself bounded by the request timeout, so a `limit` of one
    /// request timeout covers every call started before this one, but for an undo that waits
    /// behind its driver's slow rounds (then more are reported pending).
    pub(crate) async fn settle(&self, limit: Duration) -> usize {
        let all_done = async {
            loop {
                let notified = self.detached_done.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.detached() == 0 {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(limit, all_done).await;
        self.detached()
    }

    /// Runs `call` and then `WAIT replicas wait` in one pipeline on a WAIT lane, within the
    /// request timeout plus `wait`. Returns the script's reply and how many replicas
    /// acknowledged.
    pub(crate) async fn run_then_wait(
        self: &Arc<Self>,
        call: &ScriptCall,
        name: &str,
        operation: &'static str,
        replicas: u32,
        wait: Duration,
    ) -> Result<(Value, i64)> {
        let limit = self.request_timeout + wait;
        let call = async {
            let mut lane = self.lanes.checkout().await?;
            let reply = eval_then_wait(&mut lane.conn, call, replicas, wait).await?;
            lane.finish();
            Ok::<_, RedisError>(reply)
        };
        let outcome = bounded(name, operation, limit, call).await;
        self.observe(&outcome);
        outcome
    }

    /// Counts consecutive transient failures and rebuilds the main connection after
    /// [`REBUILD_AFTER`] of them. redis-rs keeps routing a slot to a master that stopped
    /// answering with its socket open (SIGSTOP) even after a replica was promoted; a new
    /// connection reads a fresh slot map and routes to the new master.
    fn observe<T>(self: &Arc<Self>, outcome: &Result<T>) {
        match outcome {
            Err(err) if err.is_transient() => {
                if self.failures.fetch_add(1, Ordering::AcqRel) + 1 >= REBUILD_AFTER {
                    self.rebuild();
                }
            }
            _ => self.failures.store(0, Ordering::Release),
        }
    }

    fn rebuild(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        let transport = Arc::clone(self);
        runtime.spawn(async move {
            match transport.endpoint().main_connection().await {
                Ok(conn) => {
                    *transport.conn.write().unwrap_or_else(PoisonError::into_inner) = conn;
                    transport.failures.store(0, Ordering::Release);
                    transport.rebuilds.fetch_add(1, Ordering::Relaxed);
                    #[cfg(feature = "metrics")]
                    metrics::counter!(
                        crate::stats::names::CONNECTION_REBUILDS,
                        "kind" => crate::stats::CLIENT_KIND
                    )
                    .increment(1);
                    tracing::info!(nodes = %transport.endpoint().nodes, "rebuilt the connection after repeated timeouts");
                }
                Err(err) => tracing::warn!(error = %err, "could not rebuild the connection"),
            }
            transport.rebuilding.store(false, Ordering::Release);
        });
    }
}

/// A Redis call's outcome as this crate's result, naming the lock in the error.
fn classify<T>(name: &str, operation: &'static str, outcome: RedisResult<T>) -> Result<T> {
    match outcome {
        Ok(value) => Ok(value),
        Err(source) if source.code() == Some("OOM") => Err(Error::OutOfMemory {
            name: name.to_owned(),
            operation,
            source,
        }),
        Err(source) => Err(Error::Redis {
            name: name.to_owned(),
            operation,
            source,
        }),
    }
}

/// Bounds a Redis call by `limit`, naming the lock in the error.
async fn bounded<T>(
    name: &str,
    operation: &'static str,
    limit: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(outcome) => classify(name, operation, outcome),
        Err(_) => Err(Error::Timeout {
            name: name.to_owned(),
            operation,
            after: limit,
        }),
    }
}

/// Dedicated connections for WAIT, which blocks its connection while it waits: each lane serves
/// one acquisition at a time, so WAIT never delays unrelated lock traffic on the main connection.
struct Lanes {
    endpoint: Endpoint,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

/// A lane checked out of [`Lanes`]; it goes back when [`Lane::finish`] is called after a clean
/// reply, and is closed when dropped otherwise (its state after an error or timeout is unknown).
struct Lane<'a> {
    conn: Connection,
    lanes: &'a Lanes,
    _permit: OwnedSemaphorePermit,
}

impl Lanes {
    fn new(endpoint: Endpoint, count: usize) -> Self {
        Self {
            endpoint,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(count.max(1))),
        }
    }

    fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Waits for a free lane, opening a new connection when no idle one is left.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds no permit and opens nothing that outlives it.
    async fn checkout(&self) -> RedisResult<Lane<'_>> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| RedisError::from((redis::ErrorKind::Client, "client closed")))?;
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.endpoint.open_lane().await?,
        };
        Ok(Lane {
            conn,
            lanes: self,
            _permit: permit,
        })
    }
}

impl Lane<'_> {
    /// Returns the lane to the pool for the next caller.
    fn finish(self) {
        self.lanes
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.conn);
    }
}

#[cfg(test)]
mod tests {
    use super::{myself_serves, redact};

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redact("redis://u:secret@h:1"), "redis://***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

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
