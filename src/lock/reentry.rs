//! Re-entry: the owner of a lock takes it again through a handle derived from its guard.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::acquire::InFlight;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::fence::FenceToken;
use crate::held::{Grant, Held, Watched};
use crate::keys::LockKeys;
use crate::options::validate_ttl;
use crate::script::{parse_reply, ttl_millis, Outcome, ScriptCall, REENTER};

use super::guard::{LockGuard, MUTEX};

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
pub struct Reentry {
    core: Arc<Core>,
    keys: LockKeys,
    owner: String,
    fence: FenceToken,
    ttl: Duration,
    watched: Option<Watched>,
}

impl std::fmt::Debug for Reentry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reentry")
            .field("name", &self.keys.name())
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// A handle that acquires this lock again under the same owner (re-entry): pass it down to
    /// code that takes the lock itself. See [`Reentry`].
    pub fn reentry(&self) -> Reentry {
        let held = self.held();
        held.share_token();
        Reentry {
            core: Arc::clone(held.core()),
            keys: held.keys().clone(),
            owner: held.owner().to_owned(),
            fence: held.fence(),
            ttl: Duration::from_secs(30),
            watched: held.watched(),
        }
    }
}

impl Reentry {
    /// The lease a re-entry asks for (default 30 s): the lock's lease is moved to at least now
    /// plus this, never shortened.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The fence token every hold of this lock by this owner carries.
    pub fn fence(&self) -> FenceToken {
        self.fence
    }

    /// Takes the lock again: adds a hold and returns a guard with the same fence token. Does not
    /// wait: the owner either holds the lock or has lost it.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] or [`Error::NotOwner`] when the owner no longer holds the lock;
    /// [`Error::InvalidOptions`] for a bad TTL; [`Error::Timeout`] or [`Error::Redis`] when
    /// Redis does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped after the request was sent, the hold it may have
    /// added is released in the background.
    pub async fn lock(&self) -> Result<LockGuard> {
        let span =
            tracing::debug_span!("fencelock.reenter", lock = self.keys.name(), kind = "lock");
        tracing::Instrument::instrument(self.lock_unspanned(), span).await
    }

    async fn lock_unspanned(&self) -> Result<LockGuard> {
        validate_ttl(self.keys.name(), self.ttl)?;
        let hold = uuid::Uuid::new_v4().simple().to_string();
        let sent = Instant::now();
        let ttl_ms = ttl_millis(self.ttl);
        let undo = MUTEX.release_call(&self.core, self.keys.lock_key(), &self.owner, &hold);
        let in_flight = InFlight::arm(&self.core.transport, undo);
        let reply = self
            .core
            .transport
            .run(
                &ScriptCall::new(
                    &REENTER,
                    &[self.keys.lock_key()],
                    &[&self.owner, &hold, &ttl_ms, self.core.expiry()],
                ),
                self.keys.name(),
                "reenter",
            )
            .await?;
        in_flight.disarm();
        let (code, fence, remaining) =
            parse_reply::<(i64, i64, u64)>(self.keys.name(), "reenter", reply)?;
        let name = self.keys.name().to_owned();
        match code {
            // The stored fence is this owner's, or above it by the fences its grant reserved
            // for handing the lock on within the client under the same token.
            1 if u64::try_from(fence).is_ok_and(|stored| stored >= self.fence.get()) => {
                tracing::debug!(lock = %name, fence = %self.fence, "re-entered");
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
                let held = Held::following(&self.core, &MUTEX, grant, self.watched.clone());
                Ok(LockGuard::new(held))
            }
            _ => Err(Outcome::from_code(code)
                .and_then(|outcome| outcome.lost(&name))
                .unwrap_or(Error::UnexpectedReply {
                    name,
                    operation: "reenter",
                    detail: format!("status {code}, fence {fence}"),
                })),
        }
    }
}
