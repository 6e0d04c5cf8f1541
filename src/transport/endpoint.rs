//! Where connections come from: the seeds a client was given ([`Seeds`]: URLs, connection
//! infos or a cluster client), and the deployment found there ([`Endpoint`]), which opens the
//! main connection, the WAIT lanes and the waiters' subscriber; URL parsing and the redaction
//! of passwords in messages.

use std::sync::PoisonError;
use std::time::Duration;

use redis::aio::{AsyncPushSender, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, ConnectionInfo, IntoConnectionInfo, RedisError};
use redis::{ProtocolVersion, RedisResult};

use crate::error::{Error, Result};
use crate::human::HumanDuration;

use super::connection::{Connection, Timeouts, Topology};
use super::probe::{connect_error, is_tls, probe_all};
use super::subscriber::Subscriber;
use super::tls::{self, TlsFiles};

/// The pause before probing again when connecting through nodes that answered failed.
const RECONNECT_PAUSE: Duration = Duration::from_millis(50);

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
                    }
                    info.set_redis_settings(settings)
                })
                .collect(),
        ))
    }
}

/// `info` as it must reach redis-rs: with a user and no password, an empty password, as
/// redis-rs authenticates only with a password (without one the connection would silently be
/// the `default` user's, whether the user came from a URL such as `redis://locks@host` or from
/// the builder).
fn authenticating(info: ConnectionInfo) -> ConnectionInfo {
    let settings = info.redis_settings();
    if settings.username().is_none() || settings.password().is_some() {
        return info;
    }
    let settings = settings.clone().set_password("");
    info.set_redis_settings(settings)
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
    /// The cluster's other nodes, from the last `CLUSTER SLOTS` read ([`learn`](Self::learn)):
    /// probed when a connection is opened again and no seed answers, so a client whose seeds
    /// all stopped answering (its one seed, a master that failed over) reaches the nodes that
    /// serve now.
    known: std::sync::Mutex<Vec<ConnectionInfo>>,
    retries: u32,
    /// Applied to every connection: the seeds carry them, and every cluster builder.
    certs: Option<tls::Certs>,
}

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
        let seeds: Vec<ConnectionInfo> = seeds.into_iter().map(authenticating).collect();
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
        let probed = tokio::time::Instant::now();
        let (topology, live) = probe_all(&seeds, timeouts, &nodes).await?;
        if topology == Topology::Standalone && seeds.len() > 1 {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "{} URLs were given ({nodes}), and {} runs standalone: a standalone \
                     deployment is one server, and a lock kept on whichever of several servers \
                     answers first is not one lock; give that server's one URL, or use a cluster",
                    seeds.len(),
                    live[0].addr()
                ),
            });
        }
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
            known: std::sync::Mutex::default(),
            retries,
            certs,
        };
        let conn = endpoint.connect_live(live, probed).await?;
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
            known: std::sync::Mutex::default(),
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
        let probed = tokio::time::Instant::now();
        let live = self.probe_again().await?;
        self.connect_live(live, probed).await
    }

    /// Opens the main connection through `live`, seeds that answered a probe begun at
    /// `probed`. Once nodes have answered, a failure to connect through them is taken for a
    /// bad moment, not a wrong address: over a lossy link the few seeds that answered within
    /// the probe's grace can all lose a handshake or the first reply past the response timeout.
    /// So it probes again and retries until the connect and response timeouts have passed
    /// since `probed`, and then returns the first failure.
    async fn connect_live(
        &self,
        live: Vec<ConnectionInfo>,
        probed: tokio::time::Instant,
    ) -> Result<Connection> {
        let deadline = probed + self.timeouts.connect + self.timeouts.response;
        let first = match self.connect_through(&live).await {
            Err(err @ Error::Connect { .. }) => err,
            done => return done,
        };
        tracing::debug!(
            nodes = %self.nodes,
            error = %first,
            "connecting again through the nodes that answer"
        );
        loop {
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + RECONNECT_PAUSE))
                .await;
            let again = async {
                let live = self.probe_again().await?;
                self.connect_through(&live).await
            };
            match tokio::time::timeout_at(deadline, again).await {
                Ok(Ok(conn)) => return Ok(conn),
                Ok(Err(Error::Connect { .. })) if tokio::time::Instant::now() < deadline => {}
                Ok(Err(Error::Connect { .. })) | Err(_) => return Err(first),
                Ok(Err(err)) => return Err(err),
            }
        }
    }

    /// Opens the connection all lock traffic but WAIT uses, seeded only with nodes that just
    /// answered: redis-rs waits for every seed, and a paused one would stall it.
    async fn connect_through(&self, live: &[ConnectionInfo]) -> Result<Connection> {
        match self.topology {
            Topology::Cluster => self
                .open_cluster(cluster_builder(
                    live,
                    self.timeouts,
                    self.retries,
                    self.certs.as_ref(),
                ))
                .await
                .map(Connection::Cluster),
            Topology::Standalone => {
                let client = redis::Client::open(live[0].clone())
                    .map_err(|e| config_error(&self.nodes, e))?;
                // No response timeout of redis-rs's own: every request on this connection
                // is bounded by the caller (`transport/mod.rs`, `batch.rs`), and a second
                // timer per request only cost the client time (a timeout does not make the
                // manager reconnect; repeated ones rebuild it, `Transport::observe`).
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeouts.connect))
                    .set_response_timeout(None)
                    .set_number_of_retries(self.retries as usize)
                    .set_max_delay(Duration::from_millis(500));
                self.within(client.get_connection_manager_with_config(config))
                    .await
                    .map(Connection::Managed)
            }
        }
    }

    /// Builds the cluster client `builder` describes and opens a connection through it, as
    /// [`within`](Self::within) bounds it.
    async fn open_cluster(&self, builder: ClusterClientBuilder) -> Result<ClusterConnection> {
        let client = builder.build().map_err(|e| config_error(&self.nodes, e))?;
        self.within(client.get_async_connection()).await
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

    /// Remembers the nodes of a `CLUSTER SLOTS` reply (masters and replicas) that are not
    /// seeds, reached as the first seed is (its credentials, database, TLS settings), for the
    /// next time a connection is opened. Nothing for a standalone server or a client built
    /// from a cluster client (no seeds).
    pub(crate) fn learn(&self, reply: &redis::Value) {
        let Some(first) = self.seeds.first() else {
            return;
        };
        if self.topology != Topology::Cluster {
            return;
        }
        let mut known: Vec<ConnectionInfo> = Vec::new();
        for (host, port) in node_addresses(reply) {
            let addr = match first.addr() {
                redis::ConnectionAddr::Tcp(..) => redis::ConnectionAddr::Tcp(host, port),
                redis::ConnectionAddr::TcpTls {
                    insecure,
                    tls_params,
                    ..
                } => redis::ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure: *insecure,
                    tls_params: tls_params.clone(),
                },
                _ => continue,
            };
            let seen = |info: &ConnectionInfo| *info.addr() == addr;
            if !self.seeds.iter().any(seen) && !known.iter().any(seen) {
                known.push(first.clone().set_addr(addr));
            }
        }
        *self.known.lock().unwrap_or_else(PoisonError::into_inner) = known;
    }

    /// The nodes that answer a probe now, for a connection opened again: the seeds, or, when
    /// none of them does, the nodes [`learn`](Self::learn) found (asked only then, so that
    /// what they answer, a refused TLS name for an address the certificate does not name,
    /// cannot fail a connection the seeds would open). The seeds' failure when neither works.
    async fn probe_again(&self) -> Result<Vec<ConnectionInfo>> {
        let err = match probe_all(&self.seeds, self.timeouts, &self.nodes).await {
            Ok((_, live)) => return Ok(live),
            Err(err) => err,
        };
        let known = self
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if known.is_empty() {
            return Err(err);
        }
        match probe_all(&known, self.timeouts, &self.nodes).await {
            Ok((_, live)) => Ok(live),
            Err(_) => Err(err),
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
        let live = self.probe_again().await?;
        match self.topology {
            Topology::Cluster => {
                let builder =
                    cluster_builder(&live, self.timeouts, self.retries, self.certs.as_ref())
                        .use_protocol(ProtocolVersion::RESP3)
                        .push_sender(push);
                self.open_cluster(builder).await.map(Subscriber::Cluster)
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
    pub(super) async fn open_lane(&self) -> RedisResult<Connection> {
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

/// A cluster client builder over `infos` with these timeouts and retries (and certificates).
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
    let tls = if cfg!(feature = "tls") {
        ""
    } else {
        " (this build has no TLS: it needs the `tls` feature)"
    };
    url.into_connection_info()
        .map_err(|e| Error::InvalidConfig {
            reason: format!(
                "{:?} is not a usable Redis URL ({e}): expected redis://[user:password@]host:port \
                 or rediss://…{tls}",
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

/// The [`Error::InvalidConfig`] for a client that could not be built for `target`.
fn config_error(target: &str, source: RedisError) -> Error {
    Error::InvalidConfig {
        reason: format!("cannot configure a client for {target}: {source}"),
    }
}

/// The address of every node (master or replica) in a `CLUSTER SLOTS` reply, each once; nodes
/// whose address is unknown (no host, or no port) left out.
fn node_addresses(reply: &redis::Value) -> Vec<(String, u16)> {
    let mut found: Vec<(String, u16)> = Vec::new();
    for range in super::slots::ranges(reply).into_iter().flatten() {
        for node in range.nodes() {
            if let (Some(host), Some(port)) = (node.host(), node.port()) {
                let address = (host.into_owned(), port);
                if !found.contains(&address) {
                    found.push(address);
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(redact("redis://u:secret@h:1"), "redis://***@h:1");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
