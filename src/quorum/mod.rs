//! The fenced quorum lock over N independent deployments ("Redlock done right"): this file the
//! client and one acquisition's two rounds; `guard.rs` the guard over the nodes' holds;
//! `race.rs` the requests to all nodes at once.
//!
//! Each deployment (a standalone server or a whole cluster) is reached through an ordinary
//! [`Client`] in clock fence mode, and holds the quorum lock in the mutex's key with the
//! mutex's scripts; only the commit round has a script of its own (`quorum_commit`).
//!
//! 1. **acquire**: the mutex's acquire script on every node at once, owner token `O`: a node
//!    that grants answers `t_i = max(counter + 1, TIME µs + 1, floor + 1)`.
//! 2. Fewer than a majority granted within the validity (`TTL − elapsed − drift`, drift =
//!    TTL/100 + [`QuorumClientBuilder::drift`]): release everywhere, fail or retry.
//! 3. **commit**: `T = max t_i` over the granting nodes; `quorum_commit` on each of them sets
//!    its stored fence to `max(stored, T)` while `O` still owns the lock there.
//! 4. `T` is handed out only once a majority confirmed the commit within the validity;
//!    otherwise release everywhere, fail or retry.
//!
//! Any later majority shares a node with the commit majority, whose stored fence is at least
//! `T`, so the next token is above `T` whatever the clocks do (as long as acknowledged writes
//! survive a restart: see `docs/safety.md`).

mod guard;
mod race;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::acquire::Backoff;
use crate::client::{Client, ClientBuilder};
use crate::core::Core;
use crate::error::{Error, Result};
use crate::fence::{FenceMode, FenceToken};
use crate::held::{Grant, Held};
use crate::human::HumanDuration;
use crate::keys::LockKeys;
use crate::options::{instant_after, LockOptions, Waiting};
use crate::script::{parse_fence, parse_reply, ttl_millis, ScriptCall, ACQUIRE, QUORUM_COMMIT};
use crate::transport::Topology;

pub use guard::QuorumGuard;
use guard::{NodeRelease, QUORUM};
use race::{gather, Progress, Race};

/// The default constant part of the clock-drift allowance ([`QuorumClientBuilder::drift`]).
const DEFAULT_DRIFT: Duration = Duration::from_millis(2);

/// How often a deployment that could not be reached at connect is tried again, at most.
const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// Builds a [`QuorumClient`]: one [`ClientBuilder`] per deployment, and the quorum's settings.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> fencelock::Result<()> {
/// use std::time::Duration;
/// use fencelock::{Client, QuorumClient};
///
/// let deployments = ["redis://10.0.0.1:6379", "redis://10.0.1.1:6379", "redis://10.0.2.1:6379"]
///     .into_iter()
///     .map(|url| Client::builder([url]))
///     .collect();
/// let quorum = QuorumClient::builder(deployments)
///     .request_timeout(Duration::from_millis(500))
///     .prefix("myapp")
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `connect` is called"]
pub struct QuorumClientBuilder {
    deployments: Vec<ClientBuilder>,
    drift: Duration,
    request_timeout: Option<Duration>,
    prefix: Option<String>,
    skip_commit: bool,
}

impl QuorumClientBuilder {
    /// The constant part of the clock-drift allowance (default 2 ms): a grant, extension or
    /// renewal is taken to be valid for its TTL less `TTL/100 + drift`, measured from before
    /// its first request was sent, as in Redlock. Raise it when the hosts' clocks may run at
    /// rates further apart.
    pub fn drift(mut self, drift: Duration) -> Self {
        self.drift = drift;
        self
    }

    /// The deadline of one request to one deployment (default 2 s), set on every deployment's
    /// client. One round of the quorum lock waits for the nodes at most this long.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// The key prefix of every deployment's client (default: each builder's own, `fencelock`
    /// unless set there).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// **Unsafe on purpose; for the fault-comparison harness only.** Skips the commit round:
    /// the token handed out is the highest of the first round's answers, used at once, as a
    /// Redlock with per-node counters would do. Such tokens can go backwards (A = 5, B = 0,
    /// C = 0: a grant on {A, B} gets 6, a later one on {B, C} gets 2 with counters; with clock
    /// fences the same happens whenever one node's clock or counter ran ahead). Never turn it
    /// on in production.
    #[doc(hidden)]
    pub fn skip_commit_round_for_comparison(mut self, skip: bool) -> Self {
        self.skip_commit = skip;
        self
    }

    /// Connects to every deployment at once, each with the clock fence rule whatever its
    /// builder says. A deployment that cannot be reached now is tried again in the background
    /// (at most every 500 ms) while locks are requested; it counts as not answering meanwhile.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// use fencelock::{Client, QuorumClient};
    ///
    /// let quorum = QuorumClient::builder(vec![
    ///     Client::builder(["redis://10.0.0.1:6379"]),
    ///     Client::builder(["redis://10.0.1.1:6379"]),
    ///     Client::builder(["redis://10.0.2.1:6379"]),
    /// ])
    /// .connect()
    /// .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for an even number of deployments or fewer than 3, a bad
    /// setting, a deployment whose URL or settings cannot be used (a deployment that is
    /// merely down is no error), or two deployments that reach the same server (the same URL
    /// twice, or one server under two addresses: the same `run_id` in `INFO server`, or for a
    /// cluster a node id in common), which would count one server twice towards a majority.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing outlives a dropped call.
    pub async fn connect(self) -> Result<QuorumClient> {
        let count = self.deployments.len();
        if count < 3 || count.is_multiple_of(2) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "a quorum lock needs an odd number of at least 3 deployments, got {count}: \
                     give one URL per independent deployment (3, 5, 7, ...)"
                ),
            });
        }
        if self.drift > Duration::from_secs(60) {
            return Err(Error::InvalidConfig {
                reason: format!(
                    "the drift allowance {} is out of range: use 0 to 1m",
                    HumanDuration(self.drift)
                ),
            });
        }
        let request_timeout = self.request_timeout.unwrap_or(Duration::from_secs(2));
        let builders: Vec<ClientBuilder> = self
            .deployments
            .into_iter()
            .map(|builder| {
                let mut builder = builder
                    .fence_mode(FenceMode::Clock)
                    .request_timeout(request_timeout);
                if let Some(prefix) = &self.prefix {
                    builder = builder.prefix(prefix.clone());
                }
                builder
            })
            .collect();
        // One fence sequence spans the deployments: a floor set on any of them holds for all.
        let fence_floor = builders
            .iter()
            .filter_map(ClientBuilder::configured_fence_floor)
            .max();
        let mut clients = Vec::with_capacity(count);
        let mut race = Race::new(builders.iter().cloned().map(ClientBuilder::connect));
        let mut connected: Vec<Option<Client>> = (0..count).map(|_| None).collect();
        while let Some((index, outcome)) = race.next().await {
            match outcome {
                Ok(client) => connected[index] = Some(client),
                Err(err @ Error::InvalidConfig { .. }) => return Err(err),
                Err(err) => {
                    tracing::warn!(
                        deployment = index,
                        error = %err,
                        "deployment not reachable, tried again later"
                    );
                }
            }
        }
        refuse_shared_servers(&connected).await?;
        for (builder, client) in builders.into_iter().zip(connected) {
            clients.push(Deployment {
                builder,
                client: Mutex::new(client),
                reconnecting: AtomicBool::new(false),
                last_try: Mutex::new(Instant::now()),
            });
        }
        Ok(QuorumClient {
            shared: Arc::new(Shared {
                deployments: clients,
                majority: count / 2 + 1,
                drift: self.drift,
                request_timeout,
                prefix: self.prefix.unwrap_or_else(|| "fencelock".into()),
                skip_commit: self.skip_commit,
                fence_floor,
            }),
        })
    }
}

/// Refuses two connected deployments that reach the same server: one server would count twice
/// towards a majority. A deployment whose servers cannot be identified (down, or `INFO` /
/// `CLUSTER SLOTS` refused) is not checked.
async fn refuse_shared_servers(connected: &[Option<Client>]) -> Result<()> {
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (index, client) in connected.iter().enumerate() {
        let Some(client) = client else {
            continue;
        };
        let ids = match server_ids(client).await {
            Ok(ids) => ids,
            Err(err) => {
                tracing::debug!(deployment = index, error = %err, "servers not identified");
                continue;
            }
        };
        for id in ids {
            if let Some(&first) = seen.get(&id) {
                if first != index {
                    return Err(Error::InvalidConfig {
                        reason: format!(
                            "deployments {} and {} (counting from 1) reach the same server \
                             ({id}): a quorum must count each server once, so give one URL \
                             per independent deployment",
                            first + 1,
                            index + 1
                        ),
                    });
                }
            } else {
                seen.insert(id, index);
            }
        }
    }
    Ok(())
}

/// The identities of the servers `client` reaches: every node id `CLUSTER SLOTS` lists for a
/// cluster, the `run_id` of `INFO server` for a standalone server.
async fn server_ids(client: &Client) -> Result<Vec<String>> {
    let transport = &client.core().transport;
    if transport.topology() == Topology::Cluster {
        let reply = transport.cluster_slots().await?;
        let ranges: Vec<Vec<redis::Value>> = parse_reply("*", "cluster slots", reply)?;
        let mut ids = Vec::new();
        for range in ranges {
            for node in range.into_iter().skip(2) {
                let node: Vec<redis::Value> = parse_reply("*", "cluster slots", node)?;
                if let Some(id) = node.get(2) {
                    let id: String = parse_reply("*", "cluster slots", id.clone())?;
                    ids.push(format!("node id {id}"));
                }
            }
        }
        return Ok(ids);
    }
    let mut info = redis::cmd("INFO");
    info.arg("server");
    let reply = transport.run_on_master(0, info, "info").await?;
    let text: String = parse_reply("*", "info", reply)?;
    Ok(text
        .lines()
        .filter_map(|line| line.strip_prefix("run_id:"))
        .map(|id| format!("run_id {}", id.trim()))
        .collect())
}

/// One deployment: its client once connected, and how to connect again.
struct Deployment {
    builder: ClientBuilder,
    client: Mutex<Option<Client>>,
    reconnecting: AtomicBool,
    last_try: Mutex<Instant>,
}

/// What a quorum client and its guards share.
struct Shared {
    deployments: Vec<Deployment>,
    majority: usize,
    drift: Duration,
    request_timeout: Duration,
    prefix: String,
    skip_commit: bool,
    /// The highest [`ClientBuilder::fence_floor`] of the deployments: every grant is above it.
    fence_floor: Option<FenceToken>,
}

impl Shared {
    /// Deployment `index`'s client if connected; otherwise a background connect is started (at
    /// most every [`RECONNECT_EVERY`]) and `None` answered.
    fn client(self: &Arc<Self>, index: usize) -> Option<Client> {
        let deployment = &self.deployments[index];
        if let Some(client) = lock(&deployment.client).as_ref() {
            return Some(client.clone());
        }
        let due = lock(&deployment.last_try).elapsed() >= RECONNECT_EVERY;
        if due && !deployment.reconnecting.swap(true, Ordering::AcqRel) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let shared = Arc::clone(self);
                runtime.spawn(async move {
                    let deployment = &shared.deployments[index];
                    let outcome = deployment.builder.clone().connect().await;
                    *lock(&deployment.last_try) = Instant::now();
                    match outcome {
                        Ok(client) => *lock(&deployment.client) = Some(client),
                        Err(err) => {
                            tracing::debug!(
                                deployment = index,
                                error = %err,
                                "deployment still not reachable"
                            );
                        }
                    }
                    deployment.reconnecting.store(false, Ordering::Release);
                });
            } else {
                deployment.reconnecting.store(false, Ordering::Release);
            }
        }
        None
    }

    /// The allowance for clock drift over a lease of `ttl`: TTL/100 + the constant part.
    fn allowance(&self, ttl: Duration) -> Duration {
        ttl / 100 + self.drift
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A fenced lock over N independent Redis deployments (N odd, at least 3): granted when a
/// majority grants it, with a fence token that a later grant on any majority exceeds. See the
/// module's protocol in `docs/design.md` ("Quorum lock") and the argument in `docs/safety.md`.
///
/// Cheap to clone: clones share the deployments' connections.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> fencelock::Result<()> {
/// use std::time::Duration;
/// use fencelock::{LockOptions, QuorumClient};
///
/// let quorum = QuorumClient::connect([
///     "redis://10.0.0.1:6379",
///     "redis://10.0.1.1:6379",
///     "redis://10.0.2.1:6379",
/// ])
/// .await?;
/// let guard = quorum.lock("orders:42", &LockOptions::new().ttl(Duration::from_secs(10))).await?;
/// println!("fence {}", guard.fence()); // pass it to storage with every write
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct QuorumClient {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for QuorumClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let connected: Vec<bool> = self
            .shared
            .deployments
            .iter()
            .map(|d| lock(&d.client).is_some())
            .collect();
        f.debug_struct("QuorumClient")
            .field("deployments", &self.shared.deployments.len())
            .field("connected", &connected)
            .field("majority", &self.shared.majority)
            .field("skip_commit", &self.shared.skip_commit)
            .finish_non_exhaustive()
    }
}

/// Why one attempt was not granted.
enum Refused {
    /// Enough nodes answered, but too few granted: others hold the lock on some of them; the
    /// longest remaining lease they reported.
    Busy { retry_after: Duration },
    /// Fewer than a majority answered in time (down, paused, slow), or the validity ran out.
    Unanswered,
}

impl QuorumClient {
    /// A builder over `deployments`, one [`ClientBuilder`] per independent deployment (a
    /// standalone server, or a cluster given by one or more of its nodes). Each builder's TLS
    /// and connection settings are kept; the fence mode is always the clock rule.
    pub fn builder(deployments: Vec<ClientBuilder>) -> QuorumClientBuilder {
        QuorumClientBuilder {
            deployments,
            drift: DEFAULT_DRIFT,
            request_timeout: None,
            prefix: None,
            skip_commit: false,
        }
    }

    /// Connects with default settings to one deployment per URL (a standalone server, or one
    /// seed node of a cluster); see [`QuorumClientBuilder::connect`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> fencelock::Result<()> {
    /// use fencelock::{LockOptions, QuorumClient};
    ///
    /// let quorum = QuorumClient::connect([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.1.1:6379",
    ///     "redis://10.0.2.1:6379",
    /// ])
    /// .await?;
    /// let guard = quorum.lock("orders:42", &LockOptions::new()).await?;
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`QuorumClientBuilder::connect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn connect<I, S>(urls: I) -> Result<QuorumClient>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let deployments = urls
            .into_iter()
            .map(|url| Client::builder([url.into()]))
            .collect();
        Self::builder(deployments).connect().await
    }

    /// How many deployments the lock spans.
    pub fn deployments(&self) -> usize {
        self.shared.deployments.len()
    }

    /// How many of them make a majority.
    pub fn majority(&self) -> usize {
        self.shared.majority
    }

    /// Waits for the background work of every connected deployment's client to finish (the
    /// releases of dropped guards, of nodes slower than a majority, of cancelled attempts), at
    /// most one request timeout, all deployments at once; see [`Client::shutdown`]. Call it
    /// before the process exits. The client stays usable.
    ///
    /// # Errors
    ///
    /// [`Error::ShutdownIncomplete`] (the first one) when some deployment's releases were still
    /// running at the bound.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn shutdown(&self) -> Result<()> {
        let clients: Vec<Client> = self
            .shared
            .deployments
            .iter()
            .filter_map(|d| lock(&d.client).clone())
            .collect();
        let mut first = None;
        let mut race = Race::new(clients.iter().map(Client::shutdown));
        while let Some((_, outcome)) = race.next().await {
            if let Err(err) = outcome {
                first = first.or(Some(err));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Makes one attempt to acquire quorum lock `name` (both rounds).
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when a majority answered but too few granted (another owner holds the
    /// lock on some nodes); [`Error::Timeout`] when fewer than a majority answered within the
    /// request timeout and the validity; [`Error::InvalidName`] / [`Error::InvalidOptions`] for
    /// bad input (`wait_replicas` is refused: each deployment's grant is one node's).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped after requests were sent, whatever they may have
    /// acquired is released on every node in the background.
    pub async fn try_lock(&self, name: &str, options: &LockOptions) -> Result<QuorumGuard> {
        self.validate(name, options)?;
        let span = tracing::debug_span!("fencelock.quorum_try_lock", lock = name);
        let started = Instant::now();
        match self.attempt(name, options).instrument(span).await? {
            Ok(guard) => Ok(guard),
            Err(refused) => Err(refused.into_error(name, started.elapsed(), started.elapsed())),
        }
    }

    /// Acquires quorum lock `name`, trying again with jittered backoff (5 to 50 ms, or until
    /// the holder's lease ends if sooner) while it is held or too few nodes answer, for up to
    /// `options.timeout`. Returns within the timeout plus three request timeouts (the last
    /// attempt's two rounds and the release of what it took when it failed).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(quorum: fencelock::QuorumClient) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let guard = quorum.lock("orders:42", &LockOptions::new().watchdog(true)).await?;
    /// // storage checks guard.fence() as with any guard
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when the lock stayed held until the timeout; [`Error::Timeout`] when
    /// fewer than a majority of nodes kept answering until then; otherwise as
    /// [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing (an attempt in flight is released on every
    /// node in the background).
    pub async fn lock(&self, name: &str, options: &LockOptions) -> Result<QuorumGuard> {
        self.validate(name, options)?;
        let span = tracing::debug_span!("fencelock.quorum_lock", lock = name);
        self.lock_unspanned(name, options).instrument(span).await
    }

    async fn lock_unspanned(&self, name: &str, options: &LockOptions) -> Result<QuorumGuard> {
        let started = Instant::now();
        let deadline = instant_after(started, options.timeout);
        let mut backoff = Backoff::new();
        loop {
            let refused = match self.attempt(name, options).await? {
                Ok(guard) => return Ok(guard),
                Err(refused) => refused,
            };
            if Instant::now() >= deadline {
                return Err(refused.into_error(name, started.elapsed(), options.timeout));
            }
            let pause = match refused {
                Refused::Busy { retry_after } => {
                    if let Some(observer) = &options.on_wait {
                        observer.notify(&Waiting {
                            name,
                            lease_left: retry_after,
                            waited: started.elapsed(),
                        });
                    }
                    backoff.next().min(retry_after + backoff.jitter())
                }
                Refused::Unanswered => backoff.next(),
            };
            let pause = pause.min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
        }
    }

    fn validate(&self, name: &str, options: &LockOptions) -> Result<()> {
        LockKeys::new(&self.shared.prefix, name, &options.placement)?;
        options.validate(name)?;
        if options.wait.is_some() {
            return Err(Error::InvalidOptions {
                name: name.to_owned(),
                reason: "wait_replicas is not supported by the quorum lock: the majority of \
                         independent deployments is what makes a grant durable"
                    .into(),
            });
        }
        Ok(())
    }

    /// One attempt: both rounds under a fresh owner token.
    async fn attempt(
        &self,
        name: &str,
        options: &LockOptions,
    ) -> Result<std::result::Result<QuorumGuard, Refused>> {
        let shared = &self.shared;
        let count = shared.deployments.len();
        let majority = shared.majority;
        let mut nodes: Vec<Option<(Arc<Core>, LockKeys)>> = Vec::with_capacity(count);
        for index in 0..count {
            nodes.push(match shared.client(index) {
                Some(client) => Some((Arc::clone(client.core()), client.keys(name, options)?)),
                None => None,
            });
        }
        let owner = uuid::Uuid::new_v4().simple().to_string();
        let lease = options.first_lease();
        let ttl_ms = ttl_millis(lease);
        let floor = options
            .floor
            .max(shared.fence_floor)
            .map_or(0, FenceToken::get)
            .to_string();
        let started = Instant::now();
        let valid_until = instant_after(started, lease.saturating_sub(shared.allowance(lease)));
        let releases: Vec<Option<NodeRelease>> = nodes
            .iter()
            .map(|node| {
                node.as_ref()
                    .map(|(core, keys)| NodeRelease::new(core, keys, &owner))
            })
            .collect();
        let undo = Undo {
            releases: Some(releases),
        };

        // Round 1: the mutex's acquire script on every node, clock rule.
        let round = Race::new(nodes.iter().map(|node| {
            let owner = &owner;
            let (ttl_ms, floor) = (&ttl_ms, &floor);
            async move {
                let (core, keys) = node.as_ref()?;
                let call = ScriptCall::new(
                    &ACQUIRE,
                    &[keys.lock_key()],
                    &[owner, ttl_ms, floor, "clock", core.expiry()],
                );
                Some(core.transport.run(&call, name, "quorum acquire").await)
            }
        }));
        let mut granted: Vec<(usize, FenceToken)> = Vec::new();
        let mut busy = 0;
        let mut retry_after = Duration::ZERO;
        let round_ends = valid_until.min(instant_after(started, shared.request_timeout));
        gather(round, started, round_ends, |index, outcome, pending| {
            match outcome.map(|reply| {
                reply.and_then(|v| parse_reply::<(i64, i64, i64)>(name, "quorum acquire", v))
            }) {
                Some(Ok((1 | 2, value, behind))) => {
                    // Expected after a commit raised this node's fence to another node's
                    // clock: not the failover symptom `Core::clock_behind` warns about.
                    if behind > 0 {
                        tracing::trace!(
                            lock = name,
                            deployment = index,
                            behind,
                            "stored fence ahead of the node's clock"
                        );
                    }
                    match parse_fence(name, "quorum acquire", "fence", value) {
                        Ok(fence) => granted.push((index, fence)),
                        Err(err) => {
                            tracing::warn!(lock = name, deployment = index, error = %err);
                        }
                    }
                }
                Some(Ok((0, pttl, _))) => {
                    busy += 1;
                    retry_after = retry_after.max(Duration::from_millis(pttl.max(0) as u64));
                }
                Some(Ok((status, _, _))) => {
                    tracing::warn!(
                        lock = name,
                        deployment = index,
                        status,
                        "unexpected acquire reply"
                    );
                }
                Some(Err(err)) => {
                    tracing::debug!(
                        lock = name,
                        deployment = index,
                        error = %err,
                        "quorum acquire failed on a node"
                    );
                }
                None => {}
            }
            if granted.len() >= majority || granted.len() + pending < majority {
                Progress::Decided
            } else {
                Progress::Open
            }
        })
        .await;
        if granted.len() < majority || Instant::now() >= valid_until {
            let holding: Vec<usize> = granted.iter().map(|&(index, _)| index).collect();
            undo.now(&holding, name, shared.request_timeout).await;
            return Ok(Err(if granted.len() + busy >= majority && busy > 0 {
                Refused::Busy { retry_after }
            } else {
                Refused::Unanswered
            }));
        }
        let fence = granted
            .iter()
            .map(|&(_, fence)| fence)
            .max()
            .expect("a majority granted");

        // Round 2: commit T on the granting nodes.
        let mut holding: Vec<usize> = granted.iter().map(|&(index, _)| index).collect();
        if !shared.skip_commit {
            let t = fence.get().to_string();
            let round = Race::new(holding.iter().map(|&index| {
                let (owner, t) = (&owner, &t);
                let node = &nodes[index];
                async move {
                    let (core, keys) = node.as_ref().expect("a granting node is connected");
                    let call = ScriptCall::new(
                        &QUORUM_COMMIT,
                        &[keys.lock_key()],
                        &[owner, t, core.expiry()],
                    );
                    let reply = core.transport.run(&call, name, "quorum commit").await;
                    reply.and_then(|v| parse_reply::<i64>(name, "quorum commit", v))
                }
            }));
            let commit_started = Instant::now();
            let round_ends = valid_until.min(instant_after(commit_started, shared.request_timeout));
            let mut committed = 0;
            let mut not_owner = Vec::new();
            gather(
                round,
                commit_started,
                round_ends,
                |slot, outcome, pending| {
                    match outcome {
                        Ok(1) => committed += 1,
                        Ok(_) => not_owner.push(holding[slot]),
                        Err(err) => {
                            tracing::debug!(
                                lock = name,
                                deployment = holding[slot],
                                error = %err,
                                "quorum commit failed on a node"
                            );
                        }
                    }
                    if committed + pending < majority {
                        Progress::Done
                    } else if committed >= majority {
                        Progress::Decided
                    } else {
                        Progress::Open
                    }
                },
            )
            .await;
            if committed < majority || Instant::now() >= valid_until {
                undo.now(&holding, name, shared.request_timeout).await;
                return Ok(Err(if not_owner.is_empty() {
                    Refused::Unanswered
                } else {
                    Refused::Busy {
                        retry_after: Duration::ZERO,
                    }
                }));
            }
            holding.retain(|index| !not_owner.contains(index));
        }

        // Granted: one hold per node that granted (and did not refuse the commit).
        let mut releases = undo.disarm();
        let mut holds = Vec::with_capacity(holding.len());
        for index in holding {
            let (core, keys) = nodes[index].clone().expect("a granting node is connected");
            releases[index] = None;
            let grant = Grant {
                weight: 1,
                keys,
                owner: owner.clone(),
                hold: String::new(),
                fence,
                sent: started,
                ttl: lease,
                replicas_acked: None,
            };
            holds.push(Held::new(&core, &QUORUM, grant, options));
        }
        tracing::debug!(lock = name, %fence, nodes = holds.len(), "quorum lock acquired");
        Ok(Ok(QuorumGuard::new(
            name,
            fence,
            Arc::clone(shared),
            holds,
            releases.into_iter().flatten().collect(),
            valid_until,
        )))
    }
}

impl Refused {
    /// The error a call that ends with this refusal returns: `waited` so far, `after` the
    /// deadline that passed.
    fn into_error(self, name: &str, waited: Duration, after: Duration) -> Error {
        match self {
            Refused::Busy { retry_after } => Error::Busy {
                name: name.to_owned(),
                waited,
                retry_after,
            },
            Refused::Unanswered => Error::Timeout {
                name: name.to_owned(),
                operation: "quorum lock (fewer than a majority of deployments answered)",
                after,
            },
        }
    }
}

/// While armed, dropping it releases the attempt's owner token on every node in the background
/// (an attempt dropped or failed after its requests were sent).
struct Undo {
    releases: Option<Vec<Option<NodeRelease>>>,
}

impl Undo {
    /// Releases everywhere now: on the nodes in `granted` (which answered, so answer again
    /// soon) awaited, at most `limit`, so that a process that gives up and exits leaves no
    /// lease there; on the others in the background. A call dropped meanwhile leaves the
    /// releases not yet answered to the background.
    async fn now(mut self, granted: &[usize], name: &str, limit: Duration) {
        let mut awaited = Vec::new();
        for (index, release) in self
            .releases
            .take()
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            match release {
                Some(release) if granted.contains(&index) => awaited.push(release),
                Some(release) => release.detach(),
                None => {}
            }
        }
        // Dropped while waiting: the releases not answered yet go on in the background.
        let mut unanswered = Undo {
            releases: Some(awaited.iter().cloned().map(Some).collect()),
        };
        let started = Instant::now();
        {
            let race = Race::new(awaited.iter().map(|release| release.run(name)));
            gather(
                race,
                started,
                instant_after(started, limit),
                |index, (), _| {
                    if let Some(releases) = unanswered.releases.as_mut() {
                        releases[index] = None;
                    }
                    Progress::Open
                },
            )
            .await;
        }
        // Those that did not answer within the limit were sent: nothing to add.
        unanswered.disarm();
    }

    /// The attempt succeeded: hands back the release calls, nothing is released.
    fn disarm(mut self) -> Vec<Option<NodeRelease>> {
        self.releases.take().unwrap_or_default()
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        for release in self.releases.take().into_iter().flatten().flatten() {
            release.detach();
        }
    }
}
