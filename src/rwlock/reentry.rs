//! Re-entry of the read-write lock: the owner of a read or write hold takes the lock again
//! through a handle derived from its guard (the shared core: `crate::reentry`).

use crate::error::{Error, Result};
use crate::reentry::{Entry, Reentrant};
use crate::script::RW_REENTER;

use super::guard::{ReadGuard, WriteGuard, RW};

/// The read-write lock's re-entry: its own refusals are a forced unlock (`-3`) and an upgrade
/// of a reader (`-2`).
static ENTRY: Entry = Entry {
    scripts: &RW,
    script: &RW_REENTER,
    fence_is_own: |stored, own| stored == own,
    refusal: |name, code| match code {
        -3 => Some(Error::ForceUnlocked {
            name: name.to_owned(),
        }),
        -2 => Some(Error::RoleRefused {
            name: name.to_owned(),
            reason: "a read hold cannot be upgraded to a write hold: release the read hold, \
                     then call write_lock"
                .into(),
        }),
        _ => None,
    },
};

/// A handle to take a held read-write lock again under the same owner, made by
/// [`ReadGuard::reentry`] or [`WriteGuard::reentry`]: pass it down to code that takes the lock
/// itself. Its holds carry the first hold's fence and ride on its watchdog.
///
/// A writer's handle may take read or write holds (writing implies reading); a reader's handle
/// only read holds: [`write`](Self::write) on it is an upgrade, refused with
/// [`Error::RoleRefused`] (two readers upgrading would wait on each other for ever). A reader's
/// re-entry is granted even while a writer waits (it is no new reader), so nested reads cannot
/// deadlock behind a waiting writer.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// use fencelock::{LockOptions, RwReentry};
///
/// async fn audit(lock: &RwReentry) -> fencelock::Result<()> {
///     let read = lock.read().await?; // same owner: granted at once, same fence
///     read.release().await
/// }
///
/// let write = client.write_lock("catalog", &LockOptions::new()).await?;
/// audit(&write.reentry()).await?;
/// write.release().await?; // the last hold: the lock is free
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RwReentry(Reentrant);

impl std::fmt::Debug for RwReentry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.debug(f, "RwReentry")
    }
}

impl ReadGuard {
    /// A handle that takes this read hold again under the same owner (read holds only). See
    /// [`RwReentry`].
    pub fn reentry(&self) -> RwReentry {
        RwReentry(Reentrant::of(&self.held))
    }
}

impl WriteGuard {
    /// A handle that takes this write hold again under the same owner, as a read or a write
    /// hold. See [`RwReentry`].
    pub fn reentry(&self) -> RwReentry {
        RwReentry(Reentrant::of(&self.held))
    }
}

impl RwReentry {
    crate::reentry::reentry_accessors!();

    /// Adds a read hold under this owner (a reader's or a writer's). Does not wait.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`], [`Error::ForceUnlocked`] or [`Error::NotOwner`] when the owner's hold
    /// is gone; [`Error::InvalidOptions`] for a bad TTL; [`Error::Timeout`] or [`Error::Redis`] when
    /// Redis does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a hold added by a dropped call is released in the background.
    pub async fn read(&self) -> Result<ReadGuard> {
        self.0.enter(&ENTRY, Some("r")).await.map(ReadGuard::new)
    }

    /// Adds a write hold under this owner, which must be the writer. Does not wait.
    ///
    /// # Errors
    ///
    /// [`Error::RoleRefused`] when the owner is a reader (an upgrade: release the read hold and
    /// call [`Client::write_lock`](crate::Client::write_lock)); otherwise as
    /// [`read`](Self::read).
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub async fn write(&self) -> Result<WriteGuard> {
        self.0.enter(&ENTRY, Some("w")).await.map(WriteGuard::new)
    }
}
