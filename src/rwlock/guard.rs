//! The read-write lock's guards, thin wrappers around [`Held`], and its [`Kind`].

use std::sync::LazyLock;

use crate::error::{Error, Operation, Result};
use crate::fence::FenceToken;
use crate::held::{Held, Scripts};
use crate::script::{
    parse_reply, Outcome, ScriptCall, RW_DOWNGRADE, RW_EXTEND, RW_RELEASE, RW_RENEW,
};

/// The read-write lock's release, extend and renew scripts: each finds the caller's own entry
/// (`w` when it writes, else `r:<owner>`) and touches nothing else.
pub(crate) static RW: Scripts = Scripts {
    kind: crate::kind::Kind::ReadWrite,
    release: &RW_RELEASE,
    extend: &RW_EXTEND,
    renew: &RW_RENEW,
    holder_names_hold: false,
};

/// The methods both guards share, with the same documentation.
macro_rules! hold_methods {
    () => {
        /// The fence token granted with this hold: above every fence the lock granted before
        /// it, reads and writes alike. Present it with every access to fenced storage.
        pub fn fence(&self) -> FenceToken {
            self.held.fence()
        }

        crate::guard::guard_surface! {
            what: "hold",
            take: "client.read_lock(\"catalog\", &LockOptions::new().watchdog(true))",
            extend: "Only this owner's entry is touched; the lease is never shortened while \
it has re-entered holds.",
            release: "Releases this hold (the owner's entry goes with its last hold) and \
announces it, so waiters try again at once.",
        }
    };
}

/// A read hold of a read-write lock ([`Client::read_lock`](crate::Client::read_lock)): shared
/// with other readers, exclusive of writers. Dropping it releases it in the background.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// let read = client.read_lock("catalog", &fencelock::LockOptions::new()).await?;
/// let fence: i64 = read.fence().into();
/// read.release().await?;
/// # let _ = fence; Ok(()) }
/// ```
#[must_use = "dropping the guard releases the read hold at once"]
#[clippy::has_significant_drop]
pub struct ReadGuard {
    pub(super) held: Held,
}

/// The write hold of a read-write lock ([`Client::write_lock`](crate::Client::write_lock)):
/// exclusive of readers and other writers. Dropping it releases it in the background.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// let write = client.write_lock("catalog", &fencelock::LockOptions::new()).await?;
/// let fence: i64 = write.fence().into();
/// write.release().await?;
/// # let _ = fence; Ok(()) }
/// ```
#[must_use = "dropping the guard releases the write hold at once"]
#[clippy::has_significant_drop]
pub struct WriteGuard {
    pub(super) held: Held,
}

impl std::fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug(f, "ReadGuard", &self.held)
    }
}

impl std::fmt::Debug for WriteGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        debug(f, "WriteGuard", &self.held)
    }
}

fn debug(f: &mut std::fmt::Formatter<'_>, what: &str, held: &Held) -> std::fmt::Result {
    f.debug_struct(what)
        .field("name", &held.name())
        .field("fence", &held.fence())
        .field("valid_until", &held.valid_until())
        .field("watchdog", &held.is_watched())
        .field("reentry", &held.is_added())
        .finish_non_exhaustive()
}

impl ReadGuard {
    crate::held::held_wrapper!();

    hold_methods!();
}

impl WriteGuard {
    crate::held::held_wrapper!();

    hold_methods!();

    /// Turns this write hold into a read hold, atomically: same fence, same lease, same watch;
    /// no writer can come between. Waiting readers are woken and may enter at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// let write = client.write_lock("catalog", &fencelock::LockOptions::new()).await?;
    /// // ... rebuild the catalog under write.fence() ...
    /// let read = write.downgrade().await?;
    /// // ... keep reading it while other readers read too ...
    /// read.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::RoleRefused`] while re-entered holds of this writer are held (release them
    /// first); [`Error::Expired`] / [`Error::ForceUnlocked`] / [`Error::NotOwner`] when the hold
    /// was lost;
    /// [`Error::Timeout`] or [`Error::Redis`] when Redis does not answer. On every error the
    /// guard is consumed and its hold released in the background (with `RoleRefused`, the
    /// re-entered holds keep the write hold).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in that nothing leaks: if dropped before Redis answers, the hold (write or,
    /// if the downgrade ran, read) is released in the background.
    pub async fn downgrade(self) -> Result<ReadGuard> {
        let held = &self.held;
        let name = held.name().to_owned();
        let core = held.core();
        let call = ScriptCall::new(
            LazyLock::force(&RW_DOWNGRADE),
            &[held.keys().lock_key()],
            &[held.owner(), core.transport.announce(), core.expiry()],
        );
        let span = tracing::debug_span!("fencelock.downgrade", lock = %name, kind = crate::kind::Kind::ReadWrite.as_str());
        let reply = tracing::Instrument::instrument(
            core.transport.run(&call, &name, Operation::Downgrade),
            span,
        )
        .await?;
        let (code, _remaining) = parse_reply::<(i64, u64)>(&name, Operation::Downgrade, reply)?;
        match code {
            1 => Ok(ReadGuard { held: self.held }),
            -3 => Err(Error::ForceUnlocked { name }),
            -2 => Err(Error::RoleRefused {
                name,
                reason: "cannot downgrade while re-entered write holds are held: release them \
                         first"
                    .into(),
            }),
            code => Err(Outcome::decode(&name, Operation::Downgrade, code)?
                .lost(&name)
                .unwrap_or(Error::UnexpectedReply {
                    name,
                    operation: Operation::Downgrade,
                    detail: "status 1 not handled".into(),
                })),
        }
    }
}
