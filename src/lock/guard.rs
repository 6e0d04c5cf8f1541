//! The guard of a held lock: a thin wrapper around [`Held`].

use crate::fence::FenceToken;
use crate::held::{Held, Scripts};
use crate::script::{EXTEND, RELEASE, RENEW};

/// The mutex's release, extend and renew scripts.
pub(crate) static MUTEX: Scripts = Scripts {
    kind: crate::kind::Kind::Mutex,
    release: &RELEASE,
    extend: &EXTEND,
    renew: &RENEW,
    holder_names_hold: false,
};

/// Proof of holding a lock, with the fence token to present to storage.
///
/// Release it with [`release`](Self::release) to learn whether the hold was intact. Dropping an
/// unreleased guard releases the lock in the background on the current Tokio runtime (when there
/// is one); it never blocks or panics. Without a runtime the lock simply expires after its TTL.
/// With [`LockOptions::linger`](crate::LockOptions::linger) a release of a hot lock may answer
/// before Redis is told, keeping the lock for this client's next task for a moment.
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
    held: Held,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.held.name())
            .field("fence", &self.held.fence())
            .field("valid_until", &self.held.valid_until())
            .field("watchdog", &self.held.is_watched())
            .field("reentry", &self.held.is_added())
            .field("replicas_acked", &self.held.replicas_acked())
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    crate::held::held_wrapper!();

    /// The fence token granted with this hold; present it with every write to protected storage.
    pub fn fence(&self) -> FenceToken {
        self.held.fence()
    }

    crate::guard::guard_surface! {
        what: "lock",
        take: "client.lock(\"jobs:nightly\", &LockOptions::new().watchdog(true))",
        extend: "While other holds of the same owner (re-entries) are held, the lease is never \
                 shortened: it ends at the latest end any hold asked for.",
        release: "Releases this hold: the lock is freed (and waiters woken) unless re-entries \
                  of it are still held.",
    }
}
