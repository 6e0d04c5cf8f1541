//! The guard of permits held: a thin wrapper around [`Held`].

use crate::fence::FenceToken;
use crate::held::{Held, Scripts};
use crate::script::{SEMAPHORE_EXTEND, SEMAPHORE_RELEASE, SEMAPHORE_RENEW};

/// The semaphore's release, extend and renew scripts. The hold id of its holds is the list of
/// permit numbers (space separated), which the release script checks one by one, and which
/// extend and renew get after the owner token, so they read only those permits' entries.
pub(crate) static SEMAPHORE: Scripts = Scripts {
    kind: crate::kind::Kind::Semaphore,
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

    /// The permits held, each with its number and fence, in the order they were granted (not
    /// by number: a grant takes the numbers released first).
    pub fn permits(&self) -> &[Permit] {
        &self.permits
    }

    /// The fence of the first (or only) permit of [`permits`](Self::permits).
    pub fn fence(&self) -> FenceToken {
        self.held.fence()
    }

    crate::guard::guard_surface! {
        what: "permits",
        take: "client.semaphore(\"exports\", 3)?.acquire(&LockOptions::new().watchdog(true))",
        extend: "All permits of the guard share the lease.",
        release: "Releases every permit of this guard and wakes waiters.",
    }
}
