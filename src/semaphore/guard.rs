//! The guard of permits held: a thin wrapper around [`Held`].

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::fence::FenceToken;
use crate::held::{Held, Kind};
use crate::script::{SEMAPHORE_EXTEND, SEMAPHORE_RELEASE, SEMAPHORE_RENEW};

/// The semaphore's release, extend and renew scripts. The hold id of its holds is the list of
/// permit numbers (space separated), which the release script checks one by one, and which
/// extend and renew get after the owner token, so they read only those permits' entries.
pub(crate) static SEMAPHORE: Kind = Kind {
    release: &SEMAPHORE_RELEASE,
    extend: &SEMAPHORE_EXTEND,
    renew: &SEMAPHORE_RENEW,
    holder_names_hold: true,
};

/// One numbered permit of a semaphore and the fence it was granted with.
///
/// Storage that a semaphore protects checks a write by keeping the highest fence accepted per
/// permit number (`(semaphore, number) → highest fence`) and rejecting lower ones: the holders
/// of one number follow each other like the holders of a mutex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Permit {
    /// The permit's number, `0..limit`.
    pub number: u32,
    /// The fence granted with it.
    pub fence: FenceToken,
}

/// Proof of holding one or more permits of a semaphore, each with its number and fence token.
///
/// All permits of one guard share one lease (renewed together by the watchdog when it is on)
/// and are released together. Dropping an unreleased guard releases them in the background on
/// the current Tokio runtime; without a runtime they come back when their lease ends.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// let pool = client.semaphore("exports", 3)?;
/// let guard = pool.try_acquire(&fencelock::LockOptions::new()).await?;
/// let fence: i64 = guard.fence().into();
/// println!("permit {} of {}", guard.permits()[0].number, guard.name());
/// guard.release().await?;
/// # let _ = fence; Ok(()) }
/// ```
#[must_use = "dropping the guard releases the permits at once"]
#[clippy::has_significant_drop]
pub struct PermitGuard {
    held: Held,
    permits: Vec<Permit>,
}

impl std::fmt::Debug for PermitGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PermitGuard")
            .field("name", &self.held.name())
            .field("permits", &self.permits)
            .field("valid_until", &self.held.valid_until())
            .field("watchdog", &self.held.is_watched())
            .field("replicas_acked", &self.held.replicas_acked())
            .finish_non_exhaustive()
    }
}

impl PermitGuard {
    pub(super) fn new(held: Held, permits: Vec<Permit>) -> Self {
        Self { held, permits }
    }

    /// The permits held, by number (ascending), each with its fence.
    pub fn permits(&self) -> &[Permit] {
        &self.permits
    }

    /// The fence of the first (or only) permit.
    pub fn fence(&self) -> FenceToken {
        self.held.fence()
    }

    crate::held::held_accessors!("permits");

    /// Resolves when the permits can no longer be relied on, with the reason, as
    /// [`LockGuard::lost`](crate::LockGuard::lost).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> Error {
        self.held.lost().await
    }

    /// Resets the lease of every permit of this guard to `ttl` if they are still held, and
    /// returns the new [`valid_until`](Self::valid_until).
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] when the permits had expired; [`Error::ForceUnlocked`] when a
    /// [`force_unlock`](crate::Client::force_unlock) freed them; [`Error::InvalidOptions`] for a
    /// bad TTL; [`Error::Timeout`] or [`Error::Redis`] when Redis does not answer.
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::extend`](crate::LockGuard::extend).
    pub async fn extend(&mut self, ttl: Duration) -> Result<Instant> {
        self.held.extend(ttl).await
    }

    /// Releases every permit of this guard and wakes waiters; stops the watchdog for them.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] when the permits had expired (nothing changed),
    /// [`Error::ForceUnlocked`] when a [`force_unlock`](crate::Client::force_unlock) freed them,
    /// [`Error::NotOwner`] when another owner holds one of their numbers now (left alone);
    /// [`Error::Timeout`] or [`Error::Redis`] when Redis does not answer (the permits then come
    /// back when their lease ends).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped before Redis answers, the guard's drop releases the
    /// permits in the background.
    pub async fn release(self) -> Result<()> {
        self.held.release().await
    }
}
