//! The guard of a held fair lock: a thin wrapper around [`Held`].

use crate::fence::FenceToken;
use crate::held::{Held, Scripts};
use crate::script::{FAIR_EXTEND, FAIR_RELEASE, FAIR_RENEW};

/// The fair lock's release, extend and renew scripts.
pub(crate) static FAIR: Scripts = Scripts {
    kind: crate::kind::Kind::Fair,
    release: &FAIR_RELEASE,
    extend: &FAIR_EXTEND,
    renew: &FAIR_RENEW,
    holder_names_hold: false,
};

/// Proof of holding a fair lock (granted in arrival order, see
/// [`Client::fair_lock`](crate::Client::fair_lock)), with the fence token to present to storage.
///
/// Release it with [`release`](Self::release) to learn whether the hold was intact; the release
/// hands the lock to the next waiter in the queue, and only it hears of it. Dropping an unreleased guard releases the lock in the
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

    crate::guard::guard_surface! {
        what: "lock",
        take: "client.fair_lock(\"jobs:nightly\", &LockOptions::new().watchdog(true))",
        extend: "",
        release: "Releases the lock and hands it to the head of the queue (only it hears of it).",
    }
}
