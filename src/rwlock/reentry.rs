//! Re-entry: the owner of a read or write hold takes the lock again through a handle derived
//! from its guard.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use crate::acquire::InFlight;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::fence::FenceToken;
use crate::held::{Grant, Held, Watched};
use crate::keys::LockKeys;
use crate::options::validate_ttl;
use crate::script::{parse_reply, ttl_millis, Outcome, ScriptCall, RW_REENTER};

use super::guard::{ReadGuard, WriteGuard, RW};

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
pub struct RwReentry {
    core: Arc<Core>,
    keys: LockKeys,
    owner: String,
    fence: FenceToken,
    ttl: Duration,
    watched: Option<Watched>,
}

impl std::fmt::Debug for RwReentry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwReentry")
            .field("name", &self.keys.name())
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

fn handle(held: &Held) -> RwReentry {
    RwReentry {
        core: Arc::clone(held.core()),
        keys: held.keys().clone(),
        owner: held.owner().to_owned(),
        fence: held.fence(),
        ttl: Duration::from_secs(30),
        watched: held.watched(),
    }
}

impl ReadGuard {
    /// A handle that takes this read hold again under the same owner (read holds only). See
    /// [`RwReentry`].
    pub fn reentry(&self) -> RwReentry {
        handle(&self.held)
    }
}

impl WriteGuard {
    /// A handle that takes this write hold again under the same owner, as a read or a write
    /// hold. See [`RwReentry`].
    pub fn reentry(&self) -> RwReentry {
        handle(&self.held)
    }
}

impl RwReentry {
    /// The lease a re-entry asks for (default 30 s): the owner's lease is moved to at least now
    /// plus this, never shortened.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The fence token every hold of this owner carries.
    pub fn fence(&self) -> FenceToken {
        self.fence
    }

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
        self.enter("r").await.map(ReadGuard::new)
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
        self.enter("w").await.map(WriteGuard::new)
    }

    async fn enter(&self, mode: &str) -> Result<Held> {
        let span = tracing::debug_span!(
            "fencelock.reenter",
            lock = self.keys.name(),
            kind = "rw",
            mode
        );
        tracing::Instrument::instrument(self.enter_unspanned(mode), span).await
    }

    async fn enter_unspanned(&self, mode: &str) -> Result<Held> {
        let name = self.keys.name();
        validate_ttl(name, self.ttl)?;
        let hold = uuid::Uuid::new_v4().simple().to_string();
        let sent = Instant::now();
        let ttl_ms = ttl_millis(self.ttl);
        let undo = RW.release_call(&self.core, self.keys.lock_key(), &self.owner, &hold);
        let in_flight = InFlight::arm(&self.core.transport, undo);
        let call = ScriptCall::new(
            LazyLock::force(&RW_REENTER),
            &[self.keys.lock_key()],
            &[&self.owner, &hold, &ttl_ms, mode, self.core.expiry()],
        );
        let reply = self.core.transport.run(&call, name, "reenter").await?;
        in_flight.disarm();
        let (code, fence, remaining) = parse_reply::<(i64, i64, u64)>(name, "reenter", reply)?;
        match code {
            1 if u64::try_from(fence).ok() == Some(self.fence.get()) => {
                tracing::debug!(lock = name, kind = "rw", fence = %self.fence, mode, "re-entered");
                let grant = Grant {
                    weight: 1,
                    keys: self.keys.clone(),
                    owner: self.owner.clone(),
                    hold,
                    fence: self.fence,
                    sent,
                    ttl: Duration::from_millis(remaining),
                    replicas_acked: None,
                };
                Ok(Held::following(
                    &self.core,
                    &RW,
                    grant,
                    self.watched.clone(),
                ))
            }
            -3 => Err(Error::ForceUnlocked {
                name: name.to_owned(),
            }),
            -2 => Err(Error::RoleRefused {
                name: name.to_owned(),
                reason: "a read hold cannot be upgraded to a write hold: release the read hold, \
                         then call write_lock"
                    .into(),
            }),
            _ => Err(Outcome::from_code(code)
                .and_then(|outcome| outcome.lost(name))
                .unwrap_or(Error::UnexpectedReply {
                    name: name.to_owned(),
                    operation: "reenter",
                    detail: format!("status {code}, fence {fence}"),
                })),
        }
    }
}
