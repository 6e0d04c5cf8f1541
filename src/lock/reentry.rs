//! Re-entry of the mutex: the owner of a lock takes it again through a handle derived from its
//! guard (the shared core: `crate::reentry`).

use crate::error::Result;
use crate::reentry::{Entry, Reentrant};
use crate::script::REENTER;

use super::guard::{LockGuard, MUTEX};

/// The mutex's re-entry: the stored fence may be above the owner's by the fences its grant
/// reserved for handing the lock on within the client under the same token.
static ENTRY: Entry = Entry {
    scripts: &MUTEX,
    script: &REENTER,
    fence_is_own: |stored, own| stored >= own,
    refusal: |_, _| None,
};

/// A handle to take a held lock again under the same owner, made by
/// [`LockGuard::reentry`]. Pass it (or a clone) down to code that needs the lock while the caller
/// already holds it: it gets a guard of its own with the same fence token instead of waiting on
/// itself.
///
/// Redis keeps the number of holds in the lock's hash, changed atomically by the scripts; the lock
/// is freed when the last hold is released, whichever order the guards are released in. Each
/// re-entry has an id of its own, so a request resent after a network error adds no second hold
/// and a hold is never released twice.
///
/// Ownership is proven by the handle (which carries the owner token), not by the calling thread
/// or task. A guard a handle was made of never hands the lock on to another task of the client
/// under its owner token (see [`Client::lock`](crate::Client::lock) on handoffs within a
/// client): its release goes through Redis, so the handle cannot take the next holder's lock.
/// A re-entry guard follows the first guard's watchdog when it has one; once the first guard
/// is released, renewal stops and the remaining holds last until the lease ends.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// use fencelock::{LockOptions, Reentry};
///
/// async fn restock(lock: &Reentry) -> fencelock::Result<()> {
///     let inner = lock.lock().await?; // same owner: granted at once, same fence
///     // ... write under inner.fence() ...
///     inner.release().await // the outer hold keeps the lock
/// }
///
/// let outer = client.lock("stock:sku-1", &LockOptions::new()).await?;
/// restock(&outer.reentry()).await?;
/// outer.release().await?; // the last hold: the lock is free
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Reentry(Reentrant);

impl std::fmt::Debug for Reentry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.debug(f, "Reentry")
    }
}

impl LockGuard {
    /// A handle that acquires this lock again under the same owner (re-entry): pass it down to
    /// code that takes the lock itself. See [`Reentry`].
    pub fn reentry(&self) -> Reentry {
        let held = self.held();
        held.share_token();
        Reentry(Reentrant::of(held))
    }
}

impl Reentry {
    crate::reentry::reentry_accessors!();

    /// Takes the lock again: adds a hold and returns a guard with the same fence token. Does not
    /// wait: the owner either holds the lock or has lost it.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`](crate::Error::Expired) or [`Error::NotOwner`](crate::Error::NotOwner)
    /// when the owner no longer holds the lock; [`Error::InvalidOptions`](crate::Error::InvalidOptions)
    /// for a bad TTL; [`Error::Timeout`](crate::Error::Timeout) or [`Error::Redis`](crate::Error::Redis)
    /// when Redis does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped after the request was sent, the hold it may have
    /// added is released in the background.
    pub async fn lock(&self) -> Result<LockGuard> {
        self.0.enter(&ENTRY, None).await.map(LockGuard::new)
    }
}
