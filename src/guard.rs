//! The guard of a held lock.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::acquire::release_in_background;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::fence::FenceToken;
use crate::keys::LockKeys;
use crate::options::{validate_ttl, LockOptions};
use crate::reentry::Reentry;
use crate::runtime::lease::{lease_end, Ended, SharedLease};
use crate::runtime::watchdog::Watch;
use crate::script::{parse_reply, ttl_millis, Outcome, ScriptCall, EXTEND, RELEASE};
use crate::stats::Counters;

/// Proof of holding a lock, with the fence token to present to storage.
///
/// Release it with [`release`](Self::release) to learn whether the hold was intact. Dropping an
/// unreleased guard releases the lock in the background on the current Tokio runtime (when there
/// is one); it never blocks or panics. Without a runtime the lock simply expires after its TTL.
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
    core: Arc<Core>,
    keys: LockKeys,
    owner: String,
    /// Empty for the hold the acquire granted; the hold's id for a re-entry.
    hold: String,
    fence: FenceToken,
    granted: Instant,
    /// The lease end when no watchdog follows it.
    valid_until: Instant,
    watched: Option<Watched>,
    replicas_acked: Option<u32>,
    released: bool,
}

/// A hold the watchdog follows.
pub(crate) struct Watched {
    /// The watchdog's id for the hold; `None` for a re-entry riding on another guard's watch.
    id: Option<u64>,
    pub(crate) lease: SharedLease,
    /// The renewal period the caller chose, if any.
    every: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
}

impl Clone for Watched {
    fn clone(&self) -> Self {
        Self {
            id: None,
            lease: self.lease.clone(),
            every: self.every,
            max_hold: self.max_hold,
        }
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.keys.name())
            .field("fence", &self.fence)
            .field("valid_until", &self.valid_until())
            .field("watchdog", &self.watched.is_some())
            .field("reentry", &!self.hold.is_empty())
            .field("replicas_acked", &self.replicas_acked)
            .finish_non_exhaustive()
    }
}

/// What [`LockGuard::new`] needs besides the client.
pub(crate) struct Grant {
    pub(crate) keys: LockKeys,
    pub(crate) owner: String,
    pub(crate) hold: String,
    pub(crate) fence: FenceToken,
    /// When the request that granted (or extended) the lease was sent.
    pub(crate) sent: Instant,
    pub(crate) ttl: Duration,
    pub(crate) replicas_acked: Option<u32>,
}

impl LockGuard {
    /// A guard for `grant`, watched as `options` ask; a re-entry passes the first guard's watch.
    pub(crate) fn new(
        core: Arc<Core>,
        grant: Grant,
        options: Option<&LockOptions>,
        inherited: Option<Watched>,
    ) -> Self {
        let valid_until = lease_end(grant.sent, grant.ttl);
        let watched = match options.filter(|o| o.watchdog) {
            Some(options) => {
                let mut every = options.renewal_period();
                if grant.ttl < options.get_ttl() {
                    // The first lease was cut to the maximum hold: look again halfway through,
                    // when the watchdog ends the hold as the maximum hold time.
                    every = every.min(grant.ttl / 2);
                }
                let watch = Watch {
                    lock_key: grant.keys.lock_key(),
                    owner: &grant.owner,
                    slot: grant.keys.slot(),
                    ttl: grant.ttl,
                    every,
                    hold_until: options
                        .max_hold
                        .and_then(|max| grant.sent.checked_add(max))
                        .map(Into::into),
                    valid_until: valid_until.into(),
                };
                core.watchdog.watch(watch).map(|(id, lease)| Watched {
                    id: Some(id),
                    lease,
                    every: options.renew_every,
                    max_hold: options.max_hold,
                })
            }
            None => inherited,
        };
        Self {
            core,
            keys: grant.keys,
            owner: grant.owner,
            hold: grant.hold,
            fence: grant.fence,
            granted: Instant::now(),
            valid_until,
            watched,
            replicas_acked: grant.replicas_acked,
            released: false,
        }
    }

    /// The fence token granted with this hold; present it with every write to protected storage.
    pub fn fence(&self) -> FenceToken {
        self.fence
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The Redis keys and slot of the lock.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// Until when the hold is surely valid: measured from before the acquire (or last extend
    /// or renewal) request was sent, less a drift margin. After it, another owner may hold the
    /// lock. With the watchdog on, it moves forward with every renewal.
    pub fn valid_until(&self) -> Instant {
        match &self.watched {
            Some(watched) => watched.lease.get().valid_until.into_std(),
            None => self.valid_until,
        }
    }

    /// True while [`valid_until`](Self::valid_until) lies in the future and the watchdog (if
    /// on) has not found the lock lost.
    pub fn is_valid(&self) -> bool {
        let ended = self
            .watched
            .as_ref()
            .is_some_and(|w| w.lease.get().ended.is_some());
        !ended && Instant::now() < self.valid_until()
    }

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
    /// let guard = client.lock("jobs:nightly", &LockOptions::new().watchdog(true)).await?;
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
        let name = self.keys.name();
        let Some(watched) = &self.watched else {
            tokio::time::sleep_until(self.valid_until.into()).await;
            return Error::Expired {
                name: name.to_owned(),
            };
        };
        loop {
            let ended = self.core.watchdog.ended().notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            let lease = watched.lease.get();
            let now = tokio::time::Instant::now();
            match lease.ended {
                Some(Ended::MaxHold) if now < lease.valid_until => {}
                Some(why) => return why.into_error(name, watched.max_hold),
                None if now >= lease.valid_until => {
                    return Ended::Unconfirmed.into_error(name, watched.max_hold)
                }
                None => {}
            }
            tokio::select! {
                () = ended => {}
                () = tokio::time::sleep_until(lease.valid_until) => {}
            }
        }
    }

    /// A handle that acquires this lock again under the same owner (re-entry): pass it down to
    /// code that takes the lock itself. See [`Reentry`].
    pub fn reentry(&self) -> Reentry {
        Reentry::new(
            Arc::clone(&self.core),
            self.keys.clone(),
            self.owner.clone(),
            self.fence,
            self.watched.clone(),
        )
    }

    /// How many replicas acknowledged the acquisition, when `wait_replicas` was set.
    pub fn replicas_acked(&self) -> Option<u32> {
        self.replicas_acked
    }

    /// Resets the lock's TTL to `ttl` if this guard still holds it, and returns the new
    /// [`valid_until`](Self::valid_until). While other holds of the same owner (re-entries)
    /// are held, the lease is never shortened: it ends at the latest end any hold asked for.
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
        validate_ttl(self.keys.name(), ttl)?;
        let sent = Instant::now();
        let ttl_ms = ttl_millis(ttl);
        let reply = self
            .core
            .transport
            .run(
                &ScriptCall::new(
                    &EXTEND,
                    &[self.keys.lock_key()],
                    &[&self.owner, &ttl_ms, self.core.expiry()],
                ),
                self.keys.name(),
                "extend",
            )
            .await?;
        let (code, remaining) = parse_reply::<(i64, u64)>(self.keys.name(), "extend", reply)?;
        self.outcome(code, "extend", &self.core.counters.extends)?;
        self.valid_until = lease_end(sent, Duration::from_millis(remaining));
        if let Some(Watched {
            id: Some(id),
            every,
            ..
        }) = &self.watched
        {
            let every = every.filter(|e| *e < ttl).unwrap_or(ttl / 3);
            self.core
                .watchdog
                .extended(*id, ttl, every, self.valid_until.into());
        }
        Ok(self.valid_until)
    }

    /// Releases this hold: the lock is freed (and waiters woken) unless re-entries of it are
    /// still held. Stops the watchdog for it.
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
    pub async fn release(mut self) -> Result<()> {
        self.unwatch();
        let reply = self
            .core
            .transport
            .run(
                &ScriptCall::new(
                    &RELEASE,
                    &[self.keys.lock_key()],
                    &[
                        &self.owner,
                        &self.hold,
                        self.core.transport.announce(),
                        self.core.expiry(),
                    ],
                ),
                self.keys.name(),
                "release",
            )
            .await?;
        self.released = true;
        let held = self.granted.elapsed();
        self.core.counters.holds.record(held);
        tracing::debug!(lock = self.keys.name(), fence = %self.fence, ?held, "released");
        let code = parse_reply(self.keys.name(), "release", reply)?;
        self.outcome(code, "release", &self.core.counters.releases)
    }

    /// Stops the watchdog for this hold.
    fn unwatch(&mut self) {
        if let Some(Watched { id: Some(id), .. }) = self.watched {
            self.core.watchdog.unwatch(id);
        }
    }

    /// Maps the code `release` or `extend` answered (`1`, `0`, `-1`) to the caller's result,
    /// counting a success in `done` and a loss in `lost`.
    fn outcome(&self, code: i64, operation: &'static str, done: &AtomicU64) -> Result<()> {
        let name = self.keys.name();
        match Outcome::decode(name, operation, code)?.lost(name) {
            None => {
                Counters::add(done, 1);
                Ok(())
            }
            Some(lost) => {
                Counters::add(&self.core.counters.lost, 1);
                tracing::warn!(lock = %name, fence = %self.fence, operation, "lock lost");
                Err(lost)
            }
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.unwatch();
        if !self.released {
            release_in_background(
                Arc::clone(&self.core),
                self.keys.lock_key().to_owned(),
                std::mem::take(&mut self.owner),
                std::mem::take(&mut self.hold),
            );
        }
    }
}
