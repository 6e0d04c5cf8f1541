//! Connecting a [`QuorumClient`]: [`QuorumClientBuilder`] with the quorum's settings,
//! [`QuorumClient::builder`] and [`QuorumClient::connect`], and at connect the refusal of two
//! deployments that reach one server.

use std::time::Duration;

use crate::client::{Client, ClientBuilder};
use crate::error::{Error, Operation, Result};
use crate::fence::FenceMode;
use crate::human::HumanDuration;
use crate::script::parse_reply;
use crate::transport::Topology;

use super::client::QuorumClient;
use super::race::Race;
use super::shared::{Deployment, Shared};

/// The default constant part of the clock-drift allowance ([`QuorumClientBuilder::drift`]).
const DEFAULT_DRIFT: Duration = Duration::from_millis(2);

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
            clients.push(Deployment::new(builder, client));
        }
        Ok(QuorumClient::new(Shared {
            deployments: clients,
            majority: count / 2 + 1,
            drift: self.drift,
            request_timeout,
            prefix: self.prefix.unwrap_or_else(|| "fencelock".into()),
            skip_commit: self.skip_commit,
            fence_floor,
        }))
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
        let Some(ranges) = crate::transport::slots::ranges(&reply) else {
            return Err(Error::UnexpectedReply {
                name: "*".into(),
                operation: Operation::ClusterSlots,
                detail: format!("not an array: {reply:?}"),
            });
        };
        return Ok(ranges
            .flat_map(|range| {
                range
                    .nodes()
                    .filter_map(|node| node.id())
                    .collect::<Vec<_>>()
            })
            .map(|id| format!("node id {id}"))
            .collect());
    }
    let mut info = redis::cmd("INFO");
    info.arg("server");
    let reply = transport.run_on_master(0, info, Operation::Info).await?;
    let text: String = parse_reply("*", Operation::Info, reply)?;
    Ok(text
        .lines()
        .filter_map(|line| line.strip_prefix("run_id:"))
        .map(|id| format!("run_id {}", id.trim()))
        .collect())
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
}
