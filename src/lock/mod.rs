//! The mutex: a fenced lock with re-entry. This file is its acquire [`Request`]; `guard.rs` its
//! guard, a thin wrapper around [`Held`]; `reentry.rs` the handle that takes it again.

mod guard;
pub(crate) mod handoff;
mod reentry;

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::acquire::{self, Attempt, GrantReply, Granting, Local, Place, Request};
use crate::client::Client;
use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::fence::FenceToken;
use crate::held::{Grant, Held};
use crate::keys::LockKeys;
use crate::kind::Kind;
use crate::options::{instant_after, LockOptions};
use crate::owner;
use crate::script::{ttl_ms, ScriptCall, ACQUIRE, ACQUIRE_FLOOR};

pub use guard::LockGuard;
pub(crate) use guard::MUTEX;
pub use reentry::Reentry;

/// One acquisition of a mutex: its keys and options, and for a call that waits across
/// processes its place in the lock's queue (issue 25: a release grants the lock to the head
/// place on the server and announces the grant on that waiter's client's channel only).
pub(crate) struct Acquire<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) options: &'a LockOptions,
    /// `Some` for [`Client::lock`] without `wait_replicas`: one owner token for the whole wait.
    pub(crate) place: Option<Place>,
}

impl<'a> Acquire<'a> {
    /// A one-shot attempt, or a wait without a place (a multi-lock's member).
    pub(crate) fn new(keys: &'a LockKeys, options: &'a LockOptions) -> Self {
        Self {
            keys,
            options,
            place: None,
        }
    }

    /// A wait that takes a place in the lock's queue (unless grants wait for replicas: a
    /// grant made on the server could not be confirmed by the waiter).
    fn queued(core: &Arc<Core>, keys: &'a LockKeys, options: &'a LockOptions) -> Self {
        let place = options
            .wait
            .is_none()
            .then(|| Place::new(core, keys, Kind::Mutex, options.get_ttl(), true));
        Self {
            keys,
            options,
            place,
        }
    }

    /// The guard of a grant: handed on within this client by its release when the grant is
    /// the client's own (no replicas to wait for), as a cohort's first (see `Held::cohort`)
    /// when the call waited behind other clients' places.
    fn guard(&self, core: &Arc<Core>, grant: Grant) -> LockGuard {
        let mut held = Held::new(core, &MUTEX, grant, self.options);
        if self.options.wait.is_none() {
            held = held.handing(&handoff::HANDING);
            if self.place.as_ref().is_some_and(Place::was_busy) {
                held = held.cohort();
            }
            core.handoffs.hold(self.keys);
        }
        LockGuard::new(held)
    }
}

impl Request for Acquire<'_> {
    type Granted = LockGuard;

    fn name(&self) -> &str {
        self.keys.name()
    }

    fn channel(&self) -> &str {
        match &self.place {
            Some(place) => place.channel(),
            None => self.keys.lock_key(),
        }
    }

    fn handed_pending(&self, _core: &Arc<Core>) -> bool {
        self.place.as_ref().is_some_and(Place::handed_pending)
    }

    fn kind(&self) -> &'static str {
        Kind::Mutex.as_str()
    }

    /// Waits behind this client's task that holds the lock, if one does: handed the lock by
    /// its release (see `handoff.rs`).
    async fn wait_local(&self, core: &Arc<Core>, until: Instant) -> Local<LockGuard> {
        handoff::wait(core, self.keys, self.options, until).await
    }

    /// One acquire request under a fresh owner token (a token is never reused after a failed
    /// request, whose background release could otherwise hit a later grant). A caller that
    /// waits for replicas is not queued behind this client's holder nor handed the lock, and
    /// its token does not carry the client's tag: the handoff treats it as another client.
    async fn attempt(&self, core: &Arc<Core>) -> Result<Attempt<LockGuard>> {
        let (keys, options) = (self.keys, self.options);
        if let Some(place) = &self.place {
            if let Some(grant) = place.handed(Operation::Acquire, false)? {
                return Ok(Attempt::Granted(self.guard(core, grant)));
            }
        }
        let fresh;
        let owner = match (&self.place, options.wait) {
            (Some(place), _) => place.owner(),
            (None, None) => {
                fresh = owner::token(core.tag());
                fresh.as_str()
            }
            (None, Some(_)) => {
                fresh = owner::id();
                fresh.as_str()
            }
        };
        let key = keys.lock_key();
        let (mode, expiry) = (core.fence_arg(), core.expiry());
        // Owner, TTL, floor, fence mode, place lease, expiry grace; the numbers take at most
        // 60 bytes.
        let bytes = key.len() + owner.len() + 60 + mode.len() + expiry.len();
        let granting = Granting::new(core, &MUTEX, keys, Operation::Acquire, owner, options);
        // A place's withdrawal gives back a grant whose reply was not read.
        let granting = match &self.place {
            Some(_) => granting.without_undo(),
            None => granting,
        };
        let args = if self.place.is_some() { 6 } else { 5 };
        let script = if core.reads_floor() {
            &ACQUIRE_FLOOR
        } else {
            &ACQUIRE
        };
        let mut call = ScriptCall::start(script, &[key], args, bytes)
            .arg(owner)
            .arg(ttl_ms(granting.lease()))
            .arg(core.floor(options))
            .arg(mode);
        if let Some(place) = &self.place {
            call = call.arg(place.lease_arg()).weighted(place.weight());
            place.sending();
        }
        let call = call.arg(expiry);
        match granting.send(&call).await? {
            (GrantReply::Granted { fence, behind, .. }, acks) => {
                let undo = self.place.as_ref().map(Place::withdraw_call);
                let grant = granting
                    .finish(fence, behind, acks, String::new(), 1, undo)
                    .await?;
                if let Some(place) = &self.place {
                    place.granted();
                }
                Ok(Attempt::Granted(self.guard(core, grant)))
            }
            (GrantReply::Busy { retry_after, rest }, _) => {
                if let Some(place) = &self.place {
                    place.busy(granting.started(), rest.get(1).copied().unwrap_or(0));
                }
                Ok(granting.busy(retry_after))
            }
            (GrantReply::Own { status, .. }, _) => Err(Error::UnexpectedReply {
                name: keys.name().to_owned(),
                operation: Operation::Acquire,
                detail: format!("status {status}"),
            }),
        }
    }
}

impl Client {
    /// The Redis keys and slot lock `name` uses with `options`' placement.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidOptions`] as [`LockKeys::new`].
    pub fn keys(&self, name: &str, options: &LockOptions) -> Result<LockKeys> {
        LockKeys::new(&self.core().prefix, name, &options.placement)
    }

    /// Makes one attempt to acquire lock `name`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::{Error, LockOptions};
    ///
    /// match client.try_lock("reports:daily", &LockOptions::new()).await {
    ///     Ok(guard) => {
    ///         // the work, presenting guard.fence() to storage
    ///         guard.release().await?;
    ///     }
    ///     Err(Error::Busy { retry_after, .. }) => println!("busy, frees within {retry_after:?}"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when another owner holds it; [`Error::ReplicasNotConfirmed`] when
    /// `wait_replicas` was not met (the lock was released again); [`Error::InvalidName`] /
    /// [`Error::InvalidOptions`] for bad input; [`Error::Timeout`] or [`Error::Redis`] when Redis
    /// does not answer in time or fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped after the request was sent, a background task
    /// releases whatever the request may have acquired.
    pub async fn try_lock(&self, name: &str, options: &LockOptions) -> Result<LockGuard> {
        let keys = self.keys(name, options)?;
        options.validate(name)?;
        let span = tracing::debug_span!(
            "fencelock.try_lock",
            lock = name,
            kind = crate::kind::Kind::Mutex.as_str(),
            slot = keys.slot()
        );
        let request = Acquire::new(&keys, options);
        // A release of this client's that lingers hands the lock over, or the turn to ask.
        let turn = match handoff::lingering(self.core(), &keys, options)
            .instrument(span.clone())
            .await
        {
            Some(Local::Granted(guard)) => return Ok(guard),
            Some(Local::Ask(turn)) => turn,
            Some(Local::NotHeld) | None => None,
        };
        let outcome = acquire::once(self.core(), &request).instrument(span).await;
        if let (Some(turn), Ok(_)) = (turn, &outcome) {
            turn.granted();
        }
        outcome
    }

    /// Acquires lock `name`, waiting while another owner holds it or Redis is briefly
    /// unavailable, for up to `options.timeout`.
    ///
    /// While the lock is held by another owner the call subscribes to the lock's channel
    /// (sharded pub/sub on a cluster, in the lock's slot) and tries again as soon as the holder
    /// releases; all waiting calls of one client share one subscription per lock. It also tries
    /// again when the holder's lease ends and at least every 250 ms (a release can be announced
    /// where the subscription does not hear it, as while the lock's slot migrates), and polls
    /// with jittered backoff when the server cannot publish or the subscription cannot be made.
    ///
    /// While another task of this client holds the lock the call queues behind it, in arrival
    /// order, and is handed the lock by that task's release: in the release's own script call,
    /// or, when that call reserved fences for the tasks queued behind (up to 16), with no call:
    /// the task then holds the lock under the same Redis hold (owner token, lease, watchdog) with
    /// the next fence, while the lease has at least 90% of its TTL left (half under the
    /// watchdog), no call releasing or extending that hold failed, and the call asked for the
    /// same TTL and renewal, without `max_hold`, a floor at
    /// or above that fence, or `wait_replicas` (those always ask Redis). Fences still rise with
    /// every grant, and every later grant by Redis is above the reserved ones. Another client
    /// waiting gets in at the next handoff that goes through Redis.
    ///
    /// Returns within the timeout plus one request timeout (plus the WAIT timeout if set).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let options = LockOptions::new()
    ///     .ttl(Duration::from_secs(10))
    ///     .timeout(Duration::from_secs(30));
    /// let guard = client.lock("orders:42", &options).await?;
    /// let fence = guard.fence(); // present it with every write to the protected storage
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when the lock stayed held until the timeout; [`Error::Timeout`] or
    /// [`Error::Redis`] when Redis kept failing; otherwise as [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds no lock (an acquire request in flight is released in
    /// the background, as in [`try_lock`](Self::try_lock)). Its place in the lock's queue (taken
    /// once an attempt found the lock held, unless `wait_replicas` is set), with a grant made to
    /// it whose reply it did not read, is withdrawn in the background, waking the next waiter if
    /// it was the head; if that fails, the place lapses with its lease (the lock's TTL, at most
    /// 3 s) and such a grant with its TTL. Its registration on the lock's channel is dropped with
    /// it; the subscription ends when no other call of this client waits on that lock. The only
    /// tasks it leaves are these background calls, which end once Redis answers or the request
    /// times out (`Client::shutdown` waits for them).
    pub async fn lock(&self, name: &str, options: &LockOptions) -> Result<LockGuard> {
        let keys = self.keys(name, options)?;
        options.validate(name)?;
        let span = tracing::debug_span!(
            "fencelock.lock",
            lock = name,
            kind = crate::kind::Kind::Mutex.as_str(),
            slot = keys.slot()
        );
        let request = Acquire::queued(self.core(), &keys, options);
        let deadline = instant_after(Instant::now(), options.timeout);
        let outcome = acquire::wait_observed(
            self.core(),
            &request,
            options.timeout,
            options.on_wait.as_ref(),
        )
        .instrument(span.clone())
        .await;
        if let (Err(_), Some(place)) = (&outcome, &request.place) {
            let withdraw = place.withdraw().instrument(span);
            acquire::undo_within_bound(self.core(), deadline, withdraw).await;
        }
        outcome
    }

    /// Runs `work` while holding lock `name`, and releases the lock on every path: acquires it
    /// as [`lock`](Self::lock) does, calls `work` with the hold's fence token, and releases the
    /// lock when `work` returns `Ok` or `Err`. To give `work` the guard itself (to extend the
    /// lease), use [`with_lock_guard`](Self::with_lock_guard). If `work` panics or the returned future is
    /// dropped, the guard's drop releases the lock in the background (see
    /// [`shutdown`](Self::shutdown) to wait for it).
    ///
    /// With the watchdog on ([`LockOptions::watchdog`]) `work` is raced against
    /// [`LockGuard::lost`]: when the hold is lost, `work`'s future is dropped at once (at its
    /// next `.await`) and the loss is returned. Without the watchdog `work` runs to its end; if
    /// the lease ran out meanwhile, the release finds the lock lost and that loss is returned
    /// instead of `work`'s value (its writes may have been rejected by fence). A release that
    /// fails for another reason (Redis did not answer) is logged, and `work`'s outcome is
    /// returned: the lock then expires after its TTL.
    ///
    /// `work`'s error type only needs `From<fencelock::Error>` (as `anyhow::Error` and
    /// `fencelock::Error` have), so acquisition errors and losses come back through it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let options = LockOptions::new().watchdog(true);
    /// let written = client
    ///     .with_lock("orders:42", &options, |fence| async move {
    ///         // write the order, passing `fence` to the storage
    ///         Ok::<_, fencelock::Error>(fence.get())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock) when the lock is not acquired (`work` is then not called);
    /// `work`'s own error; with the watchdog, the loss [`LockGuard::lost`] reports
    /// ([`Error::is_lock_lost`]); [`Error::Expired`], [`Error::ForceUnlocked`] or
    /// [`Error::NotOwner`] when the release found the lock lost after `work` succeeded.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call drops `work` and releases the lock (or the acquisition in
    /// flight) in the background.
    pub async fn with_lock<T, E, F, Fut>(
        &self,
        name: &str,
        options: &LockOptions,
        work: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce(FenceToken) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let guard = self.lock(name, options).await?;
        let span = tracing::debug_span!(
            "fencelock.with_lock",
            lock = name,
            kind = crate::kind::Kind::Mutex.as_str(),
            fence = guard.fence().get()
        );
        let outcome = async {
            let work = work(guard.fence());
            if options.watchdog {
                tokio::select! {
                    biased;
                    lost = guard.lost() => return Err(lost),
                    outcome = work => return Ok(outcome),
                }
            }
            Ok(work.await)
        }
        .instrument(span.clone())
        .await;
        finish_with_lock(guard, outcome, span, name).await
    }

    /// Runs `work` while holding lock `name`, as [`with_lock`](Self::with_lock) does, but lends
    /// `work` the guard itself (`&mut LockGuard`) instead of its fence, so the work can
    /// [`extend`](LockGuard::extend) the lease, read [`valid_until`](LockGuard::valid_until) or
    /// take a [`reentry`](LockGuard::reentry) handle; the release stays with this call. A
    /// sibling rather than a change of `with_lock`'s signature, which would break its callers.
    ///
    /// `work` is an async closure (`async |guard| { ... }`). With the watchdog on it is raced
    /// against the loss of the hold as in `with_lock`; without it, it runs to its end and the
    /// release reports a loss.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let options = LockOptions::new().ttl(Duration::from_secs(10));
    /// let fence = client
    ///     .with_lock_guard("orders:42", &options, async |guard| {
    ///         // first half of the work, then more time for the second half
    ///         guard.extend(Duration::from_secs(10)).await?;
    ///         Ok::<_, fencelock::Error>(guard.fence())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`with_lock`](Self::with_lock).
    ///
    /// # Cancel safety
    ///
    /// As [`with_lock`](Self::with_lock).
    pub async fn with_lock_guard<T, E, F>(
        &self,
        name: &str,
        options: &LockOptions,
        work: F,
    ) -> std::result::Result<T, E>
    where
        F: AsyncFnOnce(&mut LockGuard) -> std::result::Result<T, E>,
        E: From<Error>,
    {
        let mut guard = self.lock(name, options).await?;
        let span = tracing::debug_span!(
            "fencelock.with_lock",
            lock = name,
            kind = crate::kind::Kind::Mutex.as_str(),
            fence = guard.fence().get()
        );
        let lost = guard.held().lost_watcher();
        let outcome = async {
            let work = work(&mut guard);
            match lost {
                Some(lost) => tokio::select! {
                    biased;
                    lost = lost => Err(lost),
                    outcome = work => Ok(outcome),
                },
                None => Ok(work.await),
            }
        }
        .instrument(span.clone())
        .await;
        finish_with_lock(guard, outcome, span, name).await
    }
}

/// The end of [`Client::with_lock`] and [`Client::with_lock_guard`]: `outcome` is `Err(loss)`
/// when the work was stopped by the loss of the hold, else the work's result; releases the
/// guard and returns what the caller gets.
async fn finish_with_lock<T, E: From<Error>>(
    guard: LockGuard,
    outcome: std::result::Result<std::result::Result<T, E>, Error>,
    span: tracing::Span,
    name: &str,
) -> std::result::Result<T, E> {
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(lost) => {
            tracing::warn!(parent: &span, lock = name, error = %lost, "with_lock: the hold was lost; the work was stopped");
            // The release of a lost hold only tidies up; its answer adds nothing.
            let _ = guard.release().instrument(span).await;
            return Err(E::from(lost));
        }
    };
    match guard.release().instrument(span.clone()).await {
        Ok(()) => outcome,
        Err(lost) if lost.is_lock_lost() && outcome.is_ok() => Err(E::from(lost)),
        Err(err) => {
            tracing::warn!(parent: &span, lock = name, error = %err, "with_lock: the release failed; the lock expires after its TTL");
            outcome
        }
    }
}
