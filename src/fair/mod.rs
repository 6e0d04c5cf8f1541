//! The fair lock: grants in arrival order. This file is its acquire [`Request`] (one place in
//! the queue per waiting call, kept alive by the watchdog, withdrawn when the call ends without
//! the lock, and granted the lock by a release on the server: see [`Place`]);
//! `guard.rs` its guard, a thin wrapper around [`Held`].
//!
//! Re-entry is not supported: a second `fair_lock` call of the same task queues behind the
//! first like any other caller.

mod guard;

use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::acquire::{self, Attempt, GrantReply, Granting, Place, Request};
use crate::client::Client;
use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::held::Held;
use crate::keys::LockKeys;
use crate::kind::Kind;
use crate::options::{instant_after, LockOptions};
use crate::script::{ttl_millis, ScriptCall, FAIR_ACQUIRE};

pub use guard::FairLockGuard;
use guard::FAIR;

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

/// One acquisition of a fair lock: its keys, options and its place in the queue (one owner
/// token for the whole wait).
pub(crate) struct Acquire<'a> {
    keys: &'a LockKeys,
    options: &'a LockOptions,
    place: Place,
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
        Self {
            keys,
            options,
            place: Place::new(core, keys, Kind::Fair, options.get_ttl(), queue),
        }
    }

    /// Gives up this call's place (see [`Place::withdraw`]).
    pub(crate) async fn withdraw(&self) {
        self.place.withdraw().await;
    }
}

impl Request for Acquire<'_> {
    type Granted = FairLockGuard;

    fn name(&self) -> &str {
        self.keys.name()
    }

    fn channel(&self) -> &str {
        self.place.channel()
    }

    /// The channel (`<key>:w:<client>`) does not end in the key's kind.
    fn handed_pending(&self, _core: &Arc<Core>) -> bool {
        Some(&self.place).is_some_and(Place::handed_pending)
    }

    fn kind(&self) -> &'static str {
        Kind::Fair.as_str()
    }

    /// One `fair_acquire` under this call's owner token. The token stays the same for the
    /// whole wait (it names the place); what a failed attempt may have taken is given back by
    /// the withdrawal when the call ends, and a resent or repeated attempt of the same owner is
    /// answered with the same grant or the same place.
    async fn attempt(&self, core: &Arc<Core>) -> Result<Attempt<FairLockGuard>> {
        let (keys, options, place) = (self.keys, self.options, &self.place);
        if let Some(grant) = place.handed(Operation::FairAcquire, options.wait.is_some())? {
            let held = Held::new(core, &FAIR, grant, options);
            return Ok(Attempt::Granted(FairLockGuard::new(held)));
        }
        // The place's withdrawal gives back a grant whose reply was not read.
        let granting = Granting::new(
            core,
            &FAIR,
            keys,
            Operation::FairAcquire,
            place.owner(),
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
                place.owner(),
                &ttl_ms,
                &floor,
                core.fence_arg(),
                place.lease_arg(),
                &cap,
                core.expiry(),
            ],
        )
        .weighted(place.weight());
        place.sending();
        match granting.send(&call).await? {
            (GrantReply::Granted { fence, behind, .. }, acks) => {
                // Its release reads the queue (its extensions and renewals weigh the same).
                let weight = place.weight();
                let withdraw = Some(place.withdraw_call());
                let grant = granting
                    .finish(fence, behind, acks, String::new(), weight, withdraw)
                    .await?;
                place.granted();
                let held = Held::new(core, &FAIR, grant, options);
                Ok(Attempt::Granted(FairLockGuard::new(held)))
            }
            (GrantReply::Busy { retry_after, rest }, _) => {
                let (ahead, queued) = match rest[..] {
                    [ahead, queued] => (ahead, queued),
                    _ => return Err(unexpected(keys, &rest)),
                };
                place.note(ahead);
                place.busy(granting.started(), queued);
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
            Kind::Fair.key_suffix(),
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
            kind = Kind::Fair.as_str(),
            slot = keys.slot()
        );
        let request = Acquire::new(self.core(), &keys, options, false);
        let started = std::time::Instant::now();
        let outcome = acquire::once(self.core(), &request)
            .instrument(span.clone())
            .await;
        if outcome.is_err() {
            // Within the one request timeout of a try: a withdrawal cut there is sent in the
            // background by the request's drop.
            let withdraw = request.withdraw().instrument(span);
            acquire::undo_within_bound(self.core(), started, withdraw).await;
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
    /// Cancel safe: a dropped call holds no lock: its place (and a grant whose reply it did not
    /// read) is withdrawn at once in the background, waking the next waiter if it was the head;
    /// if that fails, the place lapses with its lease (the lock's TTL, at most 3 s) and such a
    /// grant with its TTL. Its watch and its subscription end with it. The only task it leaves
    /// is the background withdrawal, which ends once Redis answers or the request times out
    /// (`Client::shutdown` waits for it).
    pub async fn fair_lock(&self, name: &str, options: &LockOptions) -> Result<FairLockGuard> {
        let keys = self.fair_keys(name, options)?;
        options.validate(name)?;
        let span = tracing::debug_span!(
            "fencelock.fair_lock",
            lock = name,
            kind = Kind::Fair.as_str(),
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
