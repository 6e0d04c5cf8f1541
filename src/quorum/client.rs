//! The quorum client: the handle over the deployments, and the locking calls (one attempt, or
//! attempts again with backoff until the timeout).

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::acquire::Backoff;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::keys::LockKeys;
use crate::options::{instant_after, LockOptions, Waiting};

use super::attempt::{attempt, Refused};
use super::guard::QuorumGuard;
use super::race::Race;
use super::shared::Shared;

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
            .connected()
            .iter()
            .map(Option::is_some)
            .collect();
        f.debug_struct("QuorumClient")
            .field("deployments", &self.shared.deployments.len())
            .field("connected", &connected)
            .field("majority", &self.shared.majority)
            .field("skip_commit", &self.shared.skip_commit)
            .finish_non_exhaustive()
    }
}

impl QuorumClient {
    /// The client over `shared` (made by `QuorumClientBuilder::connect`).
    pub(super) fn new(shared: Shared) -> Self {
        Self {
            shared: Arc::new(shared),
        }
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
        let clients: Vec<Client> = self.shared.connected().into_iter().flatten().collect();
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
        match attempt(&self.shared, name, options)
            .instrument(span)
            .await?
        {
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
            let refused = match attempt(&self.shared, name, options).await? {
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
}
