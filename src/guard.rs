//! The guard of a held lock.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::{self, Shared};
use crate::error::{Error, Result};
use crate::fence::FenceToken;
use crate::keys::LockKeys;
use crate::options::validate_ttl;
use crate::scripts::{EXTEND, RELEASE};
use crate::stats::Counters;

/// Proof of holding a lock, with the fence token to present to storage.
///
/// Release it with [`release`](Self::release) to learn whether the hold was intact. Dropping an
/// unreleased guard releases the lock in the background on the current Tokio runtime (when there
/// is one); it never blocks or panics. Without a runtime the lock simply expires after its TTL.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// use std::time::Duration;
///
/// let mut guard = client.lock("jobs:nightly", &fencelock::LockOptions::new()).await?;
/// let fence: i64 = guard.fence().into(); // store it in a BIGINT column
/// guard.extend(Duration::from_secs(30)).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
#[clippy::has_significant_drop]
pub struct LockGuard {
    shared: Arc<Shared>,
    keys: LockKeys,
    owner: String,
    fence: FenceToken,
    valid_until: Instant,
    replicas_acked: Option<u32>,
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.keys.name())
            .field("fence", &self.fence)
            .field("valid_until", &self.valid_until)
            .field("replicas_acked", &self.replicas_acked)
            .finish_non_exhaustive()
    }
}

/// When a lease taken at `sent` for `ttl` is surely still ours: the TTL less 1% and 2 ms for
/// clock drift between this host and Redis.
fn lease_end(sent: Instant, ttl: Duration) -> Instant {
    let margin = ttl / 100 + Duration::from_millis(2);
    sent.checked_add(ttl.saturating_sub(margin)).unwrap_or(sent)
}

impl LockGuard {
    pub(crate) fn new(
        shared: Arc<Shared>,
        keys: LockKeys,
        owner: String,
        fence: FenceToken,
        sent: Instant,
        ttl: Duration,
        replicas_acked: Option<u32>,
    ) -> Self {
        Self {
            shared,
            keys,
            owner,
            fence,
            valid_until: lease_end(sent, ttl),
            replicas_acked,
            released: false,
        }
    }

    /// The fence token granted with this hold; present it with every write to protected storage.
    pub fn fence(&self) -> FenceToken {
        self.fence
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The Redis keys and slot of the lock.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// Until when the hold is surely valid: measured from before the acquire (or last extend)
    /// request was sent, less a drift margin. After it, another owner may hold the lock.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// True while [`valid_until`](Self::valid_until) lies in the future.
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }

    /// How many replicas acknowledged the acquisition, when `wait_replicas` was set.
    pub fn replicas_acked(&self) -> Option<u32> {
        self.replicas_acked
    }

    /// Resets the lock's TTL to `ttl` if this guard still holds it, and returns the new
    /// [`valid_until`](Self::valid_until).
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] or [`Error::NotOwner`] when the hold was lost (the guard stays
    /// unusable for writes); [`Error::InvalidOptions`] for a bad TTL; [`Error::Timeout`] or
    /// [`Error::Redis`] when Redis does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call leaves the guard as it was (the TTL may or may not have been
    /// reset, and `valid_until` keeps the earlier, conservative value).
    pub async fn extend(&mut self, ttl: Duration) -> Result<Instant> {
        validate_ttl(self.keys.name(), ttl)?;
        let sent = Instant::now();
        let ttl_ms = client::ttl_millis(ttl);
        let reply = self
            .shared
            .run_script(
                self.keys.name(),
                "extend",
                &EXTEND,
                &[self.keys.lock_key()],
                &[&self.owner, &ttl_ms],
            )
            .await?;
        self.outcome(reply, "extend", &self.shared.counters.extends)?;
        self.valid_until = lease_end(sent, ttl);
        Ok(self.valid_until)
    }

    /// Releases the lock.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] when the lock had expired, [`Error::NotOwner`] when another owner holds
    /// it now (it is left alone) — both mean writes made late under this fence may have been
    /// rejected; [`Error::Timeout`] or [`Error::Redis`] when Redis does not answer (the lock then
    /// expires after its TTL).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped before Redis answers, the guard's drop releases the
    /// lock in the background.
    pub async fn release(mut self) -> Result<()> {
        let reply = self
            .shared
            .run_script(
                self.keys.name(),
                "release",
                &RELEASE,
                &[self.keys.lock_key()],
                &[&self.owner],
            )
            .await?;
        self.released = true;
        tracing::debug!(lock = self.keys.name(), fence = %self.fence, "released");
        self.outcome(reply, "release", &self.shared.counters.releases)
    }

    /// Maps the reply of `release` or `extend` (`1`, `0`, `-1`) to the caller's result, counting
    /// a success in `done` and a loss in `lost`.
    fn outcome(
        &self,
        reply: redis::Value,
        operation: &'static str,
        done: &AtomicU64,
    ) -> Result<()> {
        let code: i64 = client::parse_reply(self.keys.name(), operation, reply)?;
        let name = self.keys.name().to_owned();
        match code {
            1 => {
                Counters::add(done, 1);
                Ok(())
            }
            0 | -1 => {
                Counters::add(&self.shared.counters.lost, 1);
                tracing::warn!(lock = %name, fence = %self.fence, operation, "lock lost");
                Err(if code == 0 {
                    Error::Expired { name }
                } else {
                    Error::NotOwner { name }
                })
            }
            other => Err(Error::UnexpectedReply {
                name,
                operation,
                detail: format!("status {other}"),
            }),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            client::release_in_background(
                Arc::clone(&self.shared),
                self.keys.lock_key().to_owned(),
                std::mem::take(&mut self.owner),
            );
        }
    }
}
