//! The fair lock: grants in arrival order. This file is its acquire [`Request`] (one place in
//! the queue per waiting call, kept alive by the watchdog, withdrawn when the call ends without
//! the lock, and granted the lock by a release on the server: see [`Acquire::handed`]);
//! `guard.rs` its guard, a thin wrapper around [`Held`].
//!
//! Re-entry is not supported: a second `fair_lock` call of the same task queues behind the
//! first like any other caller.

mod guard;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::acquire::{self, Attempt, GrantReply, Granting, Request};
use crate::client::Client;
use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::held::{Grant, Held};
use crate::keys::LockKeys;
use crate::options::{instant_after, LockOptions};
use crate::runtime::lease::lease_end;
use crate::runtime::watchdog::Watch;
use crate::script::{
    parse_fence, ttl_millis, EntriesSeen, ScriptCall, FAIR_ACQUIRE, FAIR_RENEW_PLACE,
    FAIR_WITHDRAW, SCAN_WEIGHT,
};

pub use guard::FairLockGuard;
use guard::FAIR;

/// The longest lease of a waiting place: a waiter that crashed stalls the queue at most this
/// long once it is at the head. Shorter when the lock's TTL is shorter.
pub(crate) const PLACE_LEASE: Duration = Duration::from_secs(3);

/// The most waiting places one fair lock's queue holds, across all clients. Every release,
/// forced unlock, withdrawal, inspection and acquire of a fair lock reads the whole queue, so
/// its length bounds how long such a call blocks Redis (`docs/design.md`, "Bounded script
/// work": a batch of two fair acquires on a queue of 256 took about 2.2 ms on the loaded test
/// machine, twice the same work in single calls; hence half the semaphore's 256). A caller
/// that finds the queue full gets no place: it keeps trying (within a third of its place lease,
/// about a second) and takes a place once there is room, behind those that have one; until
/// then later callers may pass it.
///
/// ```
/// assert_eq!(fencelock::MAX_FAIR_WAITERS, 128);
/// ```
pub const MAX_FAIR_WAITERS: u32 = 128;

/// One acquisition of a fair lock: its keys, options and the owner token that names its place
/// in the queue for the whole wait.
pub(crate) struct Acquire<'a> {
    core: Arc<Core>,
    keys: &'a LockKeys,
    options: &'a LockOptions,
    owner: String,
    /// `<key>:w:<owner>`: the channel a release announces on when this call's place is the head.
    channel: String,
    /// Place lease in ms; `"0"` for a one-shot try, which never queues.
    place: String,
    place_lease: Duration,
    /// The watchdog's id of this call's place, while it watches it.
    watch: Mutex<Option<u64>>,
    /// Redis may hold something of this owner (a place, or a grant whose reply was not read).
    dirty: AtomicBool,
    /// Granted: the guard owns what this owner holds.
    granted: AtomicBool,
    /// The queue's length as the replies reported it: the weight of this call's scripts.
    seen: EntriesSeen,
    /// When the last attempt answered busy was sent: a grant a release made on the server
    /// came after that attempt ran, so its lease is measured from here.
    busy_sent: Mutex<Option<Instant>>,
}

impl<'a> Acquire<'a> {
    /// A request for the fair lock `keys`; `queue` false makes it a one-shot try that never
    /// takes a place.
    pub(crate) fn new(
        core: &Arc<Core>,
        keys: &'a LockKeys,
        options: &'a LockOptions,
        queue: bool,
    ) -> Self {
        let owner = crate::owner::token(core.tag());
        let place_lease = options.get_ttl().min(PLACE_LEASE);
        Self {
            core: Arc::clone(core),
            channel: format!("{}:w:{owner}", keys.lock_key()),
            keys,
            options,
            owner,
            place: if queue {
                ttl_millis(place_lease)
            } else {
                "0".into()
            },
            place_lease,
            watch: Mutex::new(None),
            dirty: AtomicBool::new(false),
            granted: AtomicBool::new(false),
            seen: EntriesSeen::new(keys.slot(), SCAN_WEIGHT),
            busy_sent: Mutex::new(None),
        }
    }

    /// The grant a release made to this call's place on the server, announced on its channel
    /// as "<fence> <behind µs> <lease ms>" (`hand` in `script/lua/fair.lua`): the lock is held
    /// without another call. `None` when no such message came, or when it cannot be used and
    /// the next `fair_acquire` is to confirm the grant instead (it answers `{2, fence}` for it,
    /// moving the lease end to now + TTL): the options ask for replicas' acknowledgements, or
    /// too little of the lease would be left.
    ///
    /// The lease: the release set it to end at its own time + TTL. The waiter cannot know that
    /// time, but it knows a time before it: when its last attempt answered busy was sent. That
    /// attempt ran on the server before the release (once granted, an attempt answers
    /// `{2, ...}`, never busy), so the lease measured from its sending ends no later than the
    /// server's, as every lease measured from the request that set it (`docs/design.md`,
    /// "Leases"). The waiter's re-checks (at most the wait loop's re-check period apart while
    /// subscribed) keep that time recent; a grant left with less than half its lease falls back
    /// to the call.
    fn handed(&self, core: &Arc<Core>) -> Result<Option<FairLockGuard>> {
        let Some(message) = core.wakeups.take_message(&self.channel) else {
            return Ok(None);
        };
        let parsed = std::str::from_utf8(&message).ok().and_then(|text| {
            let mut fields = text.split(' ').map(str::parse::<i64>);
            match (fields.next(), fields.next(), fields.next(), fields.next()) {
                (Some(Ok(fence)), Some(Ok(behind)), Some(Ok(lease)), None) => {
                    Some((fence, behind, lease))
                }
                _ => None,
            }
        });
        let sent = *self
            .busy_sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let (Some((fence, behind, lease)), Some(sent)) = (parsed, sent) else {
            return Ok(None);
        };
        let ttl = Duration::from_millis(u64::try_from(lease).unwrap_or(0));
        if self.options.wait.is_some() || lease_end(sent, ttl) < Instant::now() + ttl / 2 {
            return Ok(None);
        }
        let name = self.keys.name();
        if behind > 0 {
            core.clock_behind(crate::kind::Kind::Fair.as_str(), name, behind);
        }
        let fence = parse_fence(name, Operation::FairAcquire, "fence", fence)?;
        self.unwatch_place();
        self.granted.store(true, Ordering::Relaxed);
        tracing::debug!(
            lock = name,
            kind = crate::kind::Kind::Fair.as_str(),
            %fence,
            "granted by the release"
        );
        let grant = Grant {
            keys: self.keys.clone(),
            owner: self.owner.clone(),
            hold: String::new(),
            fence,
            sent,
            ttl,
            replicas_acked: None,
            weight: self.seen.weight(),
        };
        let held = Held::new(core, &FAIR, grant, self.options);
        Ok(Some(FairLockGuard::new(held)))
    }

    /// The call that gives up this owner's place (and a grant it may not have seen).
    fn withdraw_call(&self) -> ScriptCall {
        ScriptCall::new(
            &FAIR_WITHDRAW,
            &[self.keys.lock_key()],
            &[
                &self.owner,
                self.core.transport.announce(),
                self.core.expiry(),
            ],
        )
        .weighted(self.seen.weight())
    }

    /// Gives up this call's place (and a grant it did not see) now, when the call ends with an
    /// error: so a caller that exits right after (the CLI) leaves no place behind. When this
    /// fails too, the drop tries again in the background.
    pub(crate) async fn withdraw(&self) {
        self.unwatch_place();
        if !self.dirty.load(Ordering::Relaxed) || self.granted.load(Ordering::Relaxed) {
            return;
        }
        let call = self.withdraw_call();
        if self
            .core
            .transport
            .run_undo(call, self.keys.name(), Operation::Withdraw)
            .await
            .is_ok()
        {
            self.dirty.store(false, Ordering::Relaxed);
        }
    }

    /// Hands the (new) place to the watchdog, which renews its lease in its per-node batch.
    fn watch_place(&self, sent: Instant) {
        let watch = Watch {
            lock_key: self.keys.lock_key(),
            owner: &self.owner,
            slot: self.keys.slot(),
            renew: LazyLock::force(&FAIR_RENEW_PLACE),
            weight: 1,
            ttl: self.place_lease,
            every: self.place_lease / 3,
            hold_until: None,
            valid_until: lease_end(sent, self.place_lease).into(),
        };
        let id = self.core.watchdog.watch(watch).map(|(id, _)| id);
        let old = std::mem::replace(&mut *self.lock_watch(), id);
        if let Some(old) = old {
            self.core.watchdog.unwatch(old);
        }
    }

    fn unwatch_place(&self) {
        if let Some(id) = self.lock_watch().take() {
            self.core.watchdog.unwatch(id);
        }
    }

    fn lock_watch(&self) -> std::sync::MutexGuard<'_, Option<u64>> {
        self.watch.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Acquire<'_> {
    /// A call that ends without the lock (timed out, failed, dropped) gives up its place at
    /// once, in the background.
    fn drop(&mut self) {
        self.unwatch_place();
        if self.dirty.load(Ordering::Relaxed) && !self.granted.load(Ordering::Relaxed) {
            self.core
                .transport
                .undo_detached(self.withdraw_call(), Operation::Withdraw);
        }
    }
}

impl Request for Acquire<'_> {
    type Granted = FairLockGuard;

    fn name(&self) -> &str {
        self.keys.name()
    }

    fn channel(&self) -> &str {
        &self.channel
    }

    /// One `fair_acquire` under this call's owner token. The token stays the same for the
    /// whole wait (it names the place); what a failed attempt may have taken is given back by
    /// the withdrawal when the call ends, and a resent or repeated attempt of the same owner is
    /// answered with the same grant or the same place.
    async fn attempt(&self, core: &Arc<Core>) -> Result<Attempt<FairLockGuard>> {
        if let Some(guard) = self.handed(core)? {
            return Ok(Attempt::Granted(guard));
        }
        let (keys, options) = (self.keys, self.options);
        // The place's withdrawal gives back a grant whose reply was not read.
        let granting = Granting::new(
            core,
            &FAIR,
            keys,
            Operation::FairAcquire,
            &self.owner,
            options,
        )
        .without_undo();
        let ttl_ms = ttl_millis(granting.lease());
        let floor = core.floor(options).to_string();
        let cap = MAX_FAIR_WAITERS.to_string();
        let call = ScriptCall::new(
            &FAIR_ACQUIRE,
            &[keys.lock_key()],
            &[
                &self.owner,
                &ttl_ms,
                &floor,
                core.fence_arg(),
                &self.place,
                &cap,
                core.expiry(),
            ],
        )
        .weighted(self.seen.weight());
        self.dirty.store(true, Ordering::Relaxed);
        match granting.send(&call).await? {
            (GrantReply::Granted { fence, behind, .. }, acks) => {
                self.unwatch_place();
                // Its release reads the queue (its extensions and renewals weigh the same).
                let weight = self.seen.weight();
                let withdraw = Some(self.withdraw_call());
                let grant = granting
                    .finish(fence, behind, acks, String::new(), weight, withdraw)
                    .await?;
                self.granted.store(true, Ordering::Relaxed);
                let held = Held::new(core, &FAIR, grant, options);
                Ok(Attempt::Granted(FairLockGuard::new(held)))
            }
            (GrantReply::Busy { retry_after, rest }, _) => {
                let (ahead, queued) = match rest[..] {
                    [ahead, queued] => (ahead, queued),
                    _ => return Err(unexpected(keys, &rest)),
                };
                self.seen.note(ahead);
                *self
                    .busy_sent
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(granting.started());
                if self.place == "0" {
                    self.dirty.store(false, Ordering::Relaxed);
                } else if queued == 1 {
                    tracing::debug!(
                        lock = keys.name(),
                        kind = crate::kind::Kind::Fair.as_str(),
                        ahead,
                        "queued"
                    );
                    self.watch_place(granting.started());
                } else if queued == -1 {
                    tracing::debug!(
                        lock = keys.name(),
                        kind = crate::kind::Kind::Fair.as_str(),
                        places = ahead,
                        "queue full ({MAX_FAIR_WAITERS} places): trying again without a place"
                    );
                }
                Ok(granting.busy(retry_after))
            }
            (GrantReply::Own { status, rest }, _) => {
                Err(unexpected(keys, &[&[status], &rest[..]].concat()))
            }
        }
    }
}

/// The error for a reply of another shape.
fn unexpected(keys: &LockKeys, reply: &[i64]) -> Error {
    Error::UnexpectedReply {
        name: keys.name().to_owned(),
        operation: Operation::FairAcquire,
        detail: format!("{reply:?}"),
    }
}

impl Client {
    /// The Redis key and slot of the fair lock `name` with `options`' placement:
    /// `<prefix>:{<name>}:fair`, a different key from the mutex `name` (same slot).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidOptions`] as [`LockKeys::new`].
    pub fn fair_keys(&self, name: &str, options: &LockOptions) -> Result<LockKeys> {
        LockKeys::of_kind(
            &self.core().prefix,
            name,
            &options.placement,
            crate::kind::Kind::Fair.key_suffix(),
        )
    }

    /// Makes one attempt to acquire the fair lock `name`: granted only when it is free and no
    /// live caller waits in its queue. Never takes a place in the queue.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// match client.try_fair_lock("printer", &fencelock::LockOptions::new()).await {
    ///     Ok(guard) => guard.release().await?,
    ///     Err(fencelock::Error::Busy { .. }) => println!("held, or others are queued"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when another owner holds it or others wait for it; otherwise as
    /// [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped after the request was sent, a background task
    /// releases whatever the request may have acquired.
    pub async fn try_fair_lock(&self, name: &str, options: &LockOptions) -> Result<FairLockGuard> {
        let keys = self.fair_keys(name, options)?;
        options.validate(name)?;
        let span = tracing::debug_span!(
            "fencelock.try_fair_lock",
            lock = name,
            kind = crate::kind::Kind::Fair.as_str(),
            slot = keys.slot()
        );
        let request = Acquire::new(self.core(), &keys, options, false);
        let outcome = acquire::once(self.core(), &request)
            .instrument(span.clone())
            .await;
        if outcome.is_err() {
            request.withdraw().instrument(span).await;
        }
        outcome
    }

    /// Acquires the fair lock `name` in arrival order, waiting for up to `options.timeout`.
    ///
    /// The first request that finds the lock held (or others queued) takes a place in the
    /// lock's queue: its arrival is the moment that request reached Redis, and the lock is
    /// granted to the live place that arrived first. While the call waits, the client's
    /// watchdog renews its place (in the same per-node batch as held locks; a place's lease is
    /// the lock's TTL, at most 3 s), so a crashed waiter drops out of the queue when its place's
    /// lease ends and a live one is never evicted. A release grants the lock to the head of the
    /// queue inside its script and tells it so on the head's own channel, so the head holds it
    /// without another request (a head whose place was not renewed lately is only woken and
    /// asks); the others sleep on. A fair lock is a different key from the
    /// mutex of the same name (`<prefix>:{<name>}:fair`). There is no re-entry: a second call of
    /// the same task queues behind the first.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let options = LockOptions::new().timeout(Duration::from_secs(60));
    /// let guard = client.fair_lock("printer", &options).await?; // first come, first served
    /// println!("printing under fence {}", guard.fence());
    /// guard.release().await?; // wakes the next in line
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when the lock was not granted before the timeout; otherwise as
    /// [`lock`](Self::lock). Before an error is returned the place is given up (one more
    /// request, bounded by the request timeout; if that fails too, in the background).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds no lock and leaves no place: its place (and a grant
    /// whose reply it did not read) is withdrawn at once in the background, waking the next
    /// waiter if it was the head; its watch and its subscription end with it. No task is left
    /// behind for it.
    pub async fn fair_lock(&self, name: &str, options: &LockOptions) -> Result<FairLockGuard> {
        let keys = self.fair_keys(name, options)?;
        options.validate(name)?;
        let span = tracing::debug_span!(
            "fencelock.fair_lock",
            lock = name,
            kind = crate::kind::Kind::Fair.as_str(),
            slot = keys.slot()
        );
        let request = Acquire::new(self.core(), &keys, options, true);
        let deadline = instant_after(Instant::now(), options.timeout);
        let outcome = acquire::wait_observed(
            self.core(),
            &request,
            options.timeout,
            options.on_wait.as_ref(),
        )
        .instrument(span.clone())
        .await;
        if outcome.is_err() {
            let withdraw = request.withdraw().instrument(span);
            acquire::undo_within_bound(self.core(), deadline, withdraw).await;
        }
        outcome
    }
}
