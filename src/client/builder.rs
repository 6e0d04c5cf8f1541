//! The client's builder: [`ClientBuilder`] with every setting and its documented default, the
//! checks [`ClientBuilder::connect`] makes before it connects, and the constructors that start
//! one ([`Client::builder`], [`Client::from_redis_client`], [`Client::from_cluster_client`],
//! and [`Client::connect`] with default settings).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use super::Client;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::fence::{FenceMode, FenceToken};
use crate::human::HumanDuration;
use crate::options::MAX_FLOOR;
use crate::transport::{Endpoint, ModuleUse, Seeds, Timeouts, TlsFiles, Transport};

/// The default [`ClientBuilder::expiry_grace`].
pub const DEFAULT_EXPIRY_GRACE: Duration = Duration::from_secs(10);

/// The longest [`ClientBuilder::expiry_grace`] accepted.
pub const MAX_EXPIRY_GRACE: Duration = Duration::from_secs(24 * 3600);

/// Builds a [`Client`]; every setting has a documented default.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> fencelock::Result<()> {
/// use std::time::Duration;
///
/// let client = fencelock::Client::builder(["redis://127.0.0.1:7000"])
///     .prefix("myapp")
///     .request_timeout(Duration::from_secs(1))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    seeds: Seeds,
    prefix: String,
    connect_timeout: Duration,
    request_timeout: Duration,
    retries: u32,
    fence_mode: FenceMode,
    wait_lanes: usize,
    wake_on_release: bool,
    batching: bool,
    module: ModuleUse,
    expiry_grace: Duration,
    fence_floor: Option<FenceToken>,
    tls: TlsFiles,
    /// Boxed: most clients take them from the URLs.
    credentials: Option<Box<Credentials>>,
}

/// The user and password of [`ClientBuilder::username`] and [`ClientBuilder::password`].
#[derive(Clone, Default)]
struct Credentials {
    username: Option<String>,
    password: Option<String>,
}

impl std::fmt::Debug for Credentials {
    /// The user, never the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// The most WAIT lanes a client may open.
const MAX_WAIT_LANES: usize = 1024;

/// The most retries a request may make.
const MAX_RETRIES: u32 = 100;

impl ClientBuilder {
    /// Key prefix (default `fencelock`); must not contain `{` or `}`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Time allowed to open a TCP connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Deadline for one call to Redis, including the client's own retries (default 2 s).
    /// Every public call returns within it, plus the WAIT timeout where one is set.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How often a request is retried after a redirect or connection error (default 3, at most
    /// 100).
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// How fence tokens are computed (default [`FenceMode::EpochClock`]).
    pub fn fence_mode(mut self, mode: FenceMode) -> Self {
        self.fence_mode = mode;
        self
    }

    /// How many acquisitions with `wait_replicas` may wait at once, each on a connection of its
    /// own (default 4, 1 to 1024).
    pub fn wait_lanes(mut self, lanes: usize) -> Self {
        self.wait_lanes = lanes;
        self
    }

    /// Whether waiting `lock` calls subscribe to the lock's channel and try again as soon as
    /// the holder releases (default true). Off, they poll with jittered backoff (5 to 50 ms).
    pub fn wake_on_release(mut self, on: bool) -> Self {
        self.wake_on_release = on;
        self
    }

    /// Whether concurrent calls for keys of the same node are sent as one call (default true).
    ///
    /// Acquires, releases and extensions that tasks of this client make while an earlier call
    /// to the same node is in flight are queued and sent together as one script call, each
    /// caller getting its own reply; a lone call goes out at once. This lifts throughput under
    /// concurrency (fewer round trips, less work per call in Redis) and changes nothing a caller
    /// sees. Calls that wait for replicas (`LockOptions::wait_replicas`) are never batched. Off,
    /// every call is sent on its own.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// let client = fencelock::Client::builder(["redis://127.0.0.1:7000"])
    ///     .batching(false)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn batching(mut self, on: bool) -> Self {
        self.batching = on;
        self
    }

    /// Whether calls go through fencelock's Redis module where a node loads it (default
    /// [`ModuleUse::Auto`]).
    ///
    /// The module (`module/` in the repository; `docs/design.md`, "Redis module") serves the
    /// mutex's calls (its queue's handoff included) and the fair lock's acquire and release
    /// natively with the scripts' keys, fences and replies, at a fraction of their cost to the
    /// server; what it does not serve (a key of an older layout, a re-entered lock that expired
    /// with its holds, …) it leaves to the script, which the client then sends. With `Auto` a node without it costs
    /// one round trip to find out, and is asked again after a minute or a change of the slot
    /// map; [`Stats::module_calls`](crate::Stats::module_calls) counts what the module served.
    /// Managed services do not load custom modules: there `Auto` runs the scripts.
    ///
    /// With [`ModuleUse::Required`], `connect` asks every master of the slot map it reads then,
    /// each by its own address (never another node of its shard in its place), whether it
    /// loads the module, and fails with [`Error::Connect`](crate::Error::Connect) naming one
    /// that does not or could not be asked. That is checked only at connect: a master added or
    /// promoted later is not checked, and a call it lacks the module for fails with
    /// [`Error::ModuleMissing`](crate::Error::ModuleMissing).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// let client = fencelock::Client::builder(["redis://127.0.0.1:7000"])
    ///     .module(fencelock::ModuleUse::Required)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn module(mut self, module: ModuleUse) -> Self {
        self.module = module;
        self
    }

    /// In clock mode, how long a lock's key outlives both its lease and its fence (default
    /// [`DEFAULT_EXPIRY_GRACE`], at most [`MAX_EXPIRY_GRACE`]).
    ///
    /// Every write of a lock key sets it to expire at `max(lease end, fence read as server
    /// milliseconds) + grace`, so the key of a released or abandoned lock is gone by then and
    /// takes no memory. The next grant then starts at the server clock in µs, which has passed
    /// the old fence by the grace: tokens still never go backwards, as long as the server clock
    /// does not step back by more than the grace (NTP slews, it does not step, by default). In
    /// counter and epoch modes a lock's key is kept for good, since it holds the only record of
    /// the fence.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = fencelock::Client::builder(["redis://127.0.0.1:7000"])
    ///     .expiry_grace(Duration::from_secs(60)) // tolerate a clock step back of up to a minute
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn expiry_grace(mut self, grace: Duration) -> Self {
        self.expiry_grace = grace;
        self
    }

    /// A fence floor for the whole client (default none): every grant of every primitive it
    /// makes (mutex, handoff's reserved fences, read-write lock, fair lock, semaphore permits,
    /// latch generations, multi-lock and quorum lock members) is above `floor`. A lock's own
    /// [`LockOptions::floor`](crate::LockOptions::floor) still applies: the effective floor is
    /// the higher of the two.
    ///
    /// Fences rely on the deployment's config epochs never decreasing (epoch and epoch-clock
    /// modes) and on the lock keys surviving (all modes; see `docs/safety.md`). After a cluster
    /// was re-created (`CLUSTER RESET HARD`, nodes rebuilt without `nodes.conf`) or the locks
    /// were moved to another server, fences start lower than the ones storage has accepted,
    /// and storage then rejects every new holder. Set this to the highest token storage has
    /// accepted ([`StaleFence::highest`](crate::StaleFence::highest),
    /// [`FenceGate::highest`](crate::FenceGate::highest), the highest fence
    /// `fencelock list --json` shows before the move, and on a standalone server whose module
    /// deletes released locks' keys the value of its floor key, `<prefix>:{floor}:floor`, which
    /// `list` does not show) on every client of the deployment until
    /// the new fences have passed it. Clients detect such a regression when they saw the old
    /// fences ([`Stats::fence_regressions`](crate::Stats::fence_regressions)).
    ///
    /// At most [`MAX_FLOOR`](crate::MAX_FLOOR): `connect` fails with [`Error::InvalidConfig`]
    /// above it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// use fencelock::FenceToken;
    ///
    /// // The highest token the orders table accepted before the cluster was re-created.
    /// let floor = FenceToken::new(1_796_020_144_707_460).unwrap();
    /// let client = fencelock::Client::builder(["redis://127.0.0.1:7000"])
    ///     .fence_floor(floor)
    ///     .connect()
    ///     .await?;
    /// let guard = client.lock("orders:42", &fencelock::LockOptions::new()).await?;
    /// assert!(guard.fence() > floor);
    /// # Ok(()) }
    /// ```
    pub fn fence_floor(mut self, floor: FenceToken) -> Self {
        self.fence_floor = Some(floor);
        self
    }

    /// The floor [`fence_floor`](Self::fence_floor) set, if any.
    pub(crate) fn configured_fence_floor(&self) -> Option<FenceToken> {
        self.fence_floor
    }

    /// Trusts the CA certificates in the PEM file at `path` for `rediss://` servers, instead of
    /// the platform's root certificates (as `redis-cli --cacert` does): for servers whose
    /// certificates a private CA signed. The file may hold several certificates. It is read
    /// by [`connect`](Self::connect), and applies to every connection the client opens.
    ///
    /// Without this setting `rediss://` servers must present a certificate the platform's
    /// roots trust. Needs the `tls` feature (on by default) and `rediss://` URLs only:
    /// `connect` fails with [`Error::InvalidConfig`] otherwise.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// let client = fencelock::Client::builder(["rediss://redis.internal:6380"])
    ///     .tls_ca_file("/etc/redis/tls/ca.pem")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls_ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls.ca = Some(path.into());
        self
    }

    /// Presents the client certificate in the PEM file `cert` (the certificate, optionally
    /// followed by its intermediates) with the private key in the PEM file `key`, for servers
    /// that require mutual TLS (`tls-auth-clients yes`). Read by [`connect`](Self::connect),
    /// which checks that key and certificate belong together; applies to every connection.
    ///
    /// Needs the `tls` feature (on by default) and `rediss://` URLs only: `connect` fails with
    /// [`Error::InvalidConfig`] otherwise.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// let client = fencelock::Client::builder(["rediss://redis.internal:6380"])
    ///     .tls_ca_file("/etc/redis/tls/ca.pem")
    ///     .tls_client_cert_files("/etc/redis/tls/app.pem", "/etc/redis/tls/app.key")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls_client_cert_files(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> Self {
        self.tls.client = Some((cert.into(), key.into()));
        self
    }

    /// Authenticates as `username` (a Redis ACL user) on every connection, instead of the user
    /// in the URLs (or `default`). Pair it with [`password`](Self::password); without any
    /// password (here or in the URLs) it authenticates with an empty one, which only a
    /// `nopass` user accepts, rather than connecting as `default`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// let client = fencelock::Client::builder(["redis://127.0.0.1:6379"])
    ///     .username("locks")
    ///     .password(std::env::var("REDIS_PASSWORD").unwrap_or_default())
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.credentials.get_or_insert_default().username = Some(username.into());
        self
    }

    /// Authenticates with `password` on every connection, instead of the password in the URLs,
    /// so that it need not be written into a URL (nor show in logs, `ps` or shell history).
    /// Never shown by `Debug` or in error messages.
    ///
    /// Not for a client built with [`Client::from_cluster_client`]: set the credentials on the
    /// cluster client's builder (`connect` fails with [`Error::InvalidConfig`] otherwise).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// let client = fencelock::Client::builder(["redis://127.0.0.1:6379"])
    ///     .password(std::env::var("REDIS_PASSWORD").unwrap_or_default())
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.credentials.get_or_insert_default().password = Some(password.into());
        self
    }

    /// Connects: probes every URL at once, detects cluster mode from the first node that
    /// answers and opens the connection through the nodes that answered. Should that fail
    /// after nodes answered (a lossy link losing their handshakes), it probes and tries again
    /// until the connect and request timeouts have passed since the probe began.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = fencelock::Client::builder(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"])
    ///     .prefix("billing")
    ///     .request_timeout(Duration::from_secs(1))
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a bad URL or setting, or a TLS file that cannot be read or
    /// used; [`Error::Connect`] when no node answers within the connect and request timeouts,
    /// a node refuses the credentials, or the TLS handshake fails (its `source` tells why).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing outlives a dropped call.
    pub async fn connect(self) -> Result<Client> {
        let span = tracing::debug_span!("fencelock.connect", seeds = ?self.seeds);
        self.connect_unspanned().instrument(span).await
    }

    async fn connect_unspanned(self) -> Result<Client> {
        if self.prefix.contains(['{', '}']) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the key prefix {:?} contains a brace: remove it, braces choose hash slots",
                    self.prefix
                ),
            });
        }
        for (what, value) in [
            ("connect timeout", self.connect_timeout),
            ("request timeout", self.request_timeout),
        ] {
            if value < Duration::from_millis(1) || value > Duration::from_secs(3600) {
                return Err(Error::InvalidConfig {
                    reason: format!(
                        "the {what} {} is out of range: use 1ms to 1h",
                        HumanDuration(value)
                    ),
                });
            }
        }
        if self.expiry_grace > MAX_EXPIRY_GRACE {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the expiry grace {} is out of range: use 0 to {}",
                    HumanDuration(self.expiry_grace),
                    HumanDuration(MAX_EXPIRY_GRACE)
                ),
            });
        }
        if let Some(floor) = self.fence_floor.filter(|floor| *floor > MAX_FLOOR) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the fence floor {floor} is above {MAX_FLOOR}, too close to the largest token \
                     (2^53 - 1) to leave room for later grants: pass the highest token your \
                     storage has accepted"
                ),
            });
        }
        if self.retries > MAX_RETRIES {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "{} retries is too many: use at most {MAX_RETRIES} (each waits up to the \
                     request timeout)",
                    self.retries
                ),
            });
        }
        if !(1..=MAX_WAIT_LANES).contains(&self.wait_lanes) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "{} WAIT lanes is out of range: use 1 to {MAX_WAIT_LANES}",
                    self.wait_lanes
                ),
            });
        }
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            response: self.request_timeout,
        };
        let seeds = match &self.credentials {
            Some(credentials) => self.seeds.with_credentials(
                credentials.username.as_deref(),
                credentials.password.as_deref(),
            )?,
            None => self.seeds,
        };
        let (endpoint, conn) =
            Endpoint::discover(&seeds, timeouts, self.retries, &self.tls).await?;
        tracing::debug!(nodes = %endpoint.nodes, topology = ?endpoint.topology, "connected");
        let transport = Transport::new(
            endpoint,
            conn,
            self.wait_lanes,
            self.request_timeout,
            self.batching,
            self.module,
        );
        transport.check_module().await?;
        Ok(Client {
            core: Arc::new(Core::new(
                transport,
                self.wake_on_release,
                self.prefix,
                self.fence_mode,
                self.expiry_grace,
                self.fence_floor,
            )),
        })
    }
}

impl Client {
    /// A builder with default settings for the given node URLs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// let client = fencelock::Client::builder(["redis://127.0.0.1:6379"])
    ///     .prefix("billing")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn builder<I, S>(urls: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder_with(Seeds::Urls(urls.into_iter().map(Into::into).collect()))
    }

    /// A builder with default settings that connects with the connection info of an existing
    /// `redis::Client`: its address, user, password, database, protocol and TLS settings (the
    /// certificates of [`redis::Client::build_with_tls`] included) are reused; fencelock's
    /// timeouts, retries and other [`ClientBuilder`] settings apply on top. The address may be
    /// a standalone server or any node of a cluster: cluster mode is detected as with URLs.
    ///
    /// What is not carried over: a cluster's other nodes are reached with the same user and
    /// password, but the certificates of `build_with_tls` only apply to the given node, so for
    /// a TLS cluster under a private CA also set [`ClientBuilder::tls_ca_file`] (and the client
    /// certificate), or use [`from_cluster_client`](Self::from_cluster_client). A credentials
    /// provider set on the `redis::Client` is not used (redis-rs keeps it out of the connection
    /// info).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = redis::Client::open("redis://:secret@127.0.0.1:6379/")?;
    /// let locks = fencelock::Client::from_redis_client(&redis).connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn from_redis_client(client: &redis::Client) -> ClientBuilder {
        Self::builder_with(Seeds::Infos(vec![client.get_connection_info().clone()]))
    }

    /// A builder with default settings that opens every connection through an existing
    /// `redis::cluster::ClusterClient`, so its initial nodes, user, password, TLS certificates,
    /// read routing and retry settings are used as they are. fencelock's connect and request
    /// timeouts are applied to the connections it opens, and bound every call as usual; the
    /// cluster client's own retry settings replace [`ClientBuilder::retries`].
    ///
    /// What differs from a client built from URLs: redis-rs does not expose a cluster client's
    /// initial nodes, so fencelock cannot probe them one by one and leave out a paused one when
    /// it (re)connects; and release wake-ups need a RESP3 connection, so build the cluster
    /// client with `.use_protocol(redis::ProtocolVersion::RESP3)`, otherwise waiting calls poll
    /// with backoff (they still work). TLS files set on the fencelock builder are refused: set
    /// the certificates on the cluster client's builder.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let cluster = redis::cluster::ClusterClient::builder(["redis://127.0.0.1:7000"])
    ///     .password("secret")
    ///     .use_protocol(redis::ProtocolVersion::RESP3)
    ///     .build()?;
    /// let locks = fencelock::Client::from_cluster_client(&cluster).connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn from_cluster_client(client: &redis::cluster::ClusterClient) -> ClientBuilder {
        Self::builder_with(Seeds::Cluster(Box::new(client.clone())))
    }

    fn builder_with(seeds: Seeds) -> ClientBuilder {
        ClientBuilder {
            seeds,
            prefix: "fencelock".into(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
            retries: 3,
            fence_mode: FenceMode::default(),
            wait_lanes: 4,
            wake_on_release: true,
            batching: true,
            module: ModuleUse::Auto,
            expiry_grace: DEFAULT_EXPIRY_GRACE,
            fence_floor: None,
            tls: TlsFiles::default(),
            credentials: None,
        }
    }

    /// Connects with default settings; see [`ClientBuilder::connect`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// // A standalone server, or any nodes of a cluster (cluster mode is detected).
    /// let client = fencelock::Client::connect(["redis://127.0.0.1:6379"]).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`ClientBuilder::connect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn connect<I, S>(urls: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::builder(urls).connect().await
    }
}
