//! The guard of a held fair lock: a thin wrapper around [`Held`].

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::fence::FenceToken;
use crate::held::{Held, Kind};
use crate::script::{FAIR_EXTEND, FAIR_RELEASE, FAIR_RENEW};

/// The fair lock's release, extend and renew scripts.
pub(crate) static FAIR: Kind = Kind {
    release: &FAIR_RELEASE,
    extend: &FAIR_EXTEND,
    renew: &FAIR_RENEW,
    holder_names_hold: false,
};

/// Proof of holding a fair lock (granted in arrival order, see
/// [`Client::fair_lock`](crate::Client::fair_lock)), with the fence token to present to storage.
///
/// Release it with [`release`](Self::release) to learn whether the hold was intact; the release
/// wakes only the next waiter in the queue. Dropping an unreleased guard releases the lock in the
/// background on the current Tokio runtime (when there is one); it never blocks or panics.
/// Without a runtime the lock simply expires after its TTL. A fair lock has no re-entry.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// use std::time::Duration;
///
/// let mut guard = client.fair_lock("jobs:nightly", &fencelock::LockOptions::new()).await?;
/// let fence: i64 = guard.fence().into(); // store it in a BIGINT column
/// guard.extend(Duration::from_secs(30)).await?;
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
#[clippy::has_significant_drop]
pub struct FairLockGuard {
    held: Held,
}

impl std::fmt::Debug for FairLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairLockGuard")
            .field("name", &self.held.name())
            .field("fence", &self.held.fence())
            .field("valid_until", &self.held.valid_until())
            .field("watchdog", &self.held.is_watched())
            .field("replicas_acked", &self.held.replicas_acked())
            .finish_non_exhaustive()
    }
}

impl FairLockGuard {
    crate::held::held_wrapper!();

    /// The fence token granted with this hold; present it with every write to protected storage.
    pub fn fence(&self) -> FenceToken {
        self.held.fence()
    }

    crate::held::held_accessors!("lock");

    /// Resolves when this hold can no longer be relied on, with the reason: the watchdog found
    /// the lock expired ([`Error::Expired`]) or held by another owner ([`Error::NotOwner`]), it
    /// could not renew it before the lease ran out ([`Error::LeaseUnconfirmed`]), Redis refused
    /// a renewal with an error that retrying does not cure, such as the lock's key overwritten
    /// with another type ([`Error::RenewalFailed`]), or the maximum hold time passed
    /// ([`Error::MaxHoldReached`]). Without the watchdog it resolves with [`Error::Expired`] at
    /// [`valid_until`](Self::valid_until).
    ///
    /// Race it against the work the lock protects, and stop the work when it resolves.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// # async fn long_job(_fence: fencelock::FenceToken) {}
    /// use fencelock::LockOptions;
    ///
    /// let guard = client.fair_lock("jobs:nightly", &LockOptions::new().watchdog(true)).await?;
    /// tokio::select! {
    ///     () = long_job(guard.fence()) => guard.release().await?,
    ///     lost = guard.lost() => eprintln!("stopped: {lost}"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> Error {
        self.held.lost().await
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
        self.held.extend(ttl).await
    }

    /// Releases the lock and wakes the head of the queue (only it). Stops the watchdog for it.
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
    pub async fn release(self) -> Result<()> {
        self.held.release().await
    }
}
