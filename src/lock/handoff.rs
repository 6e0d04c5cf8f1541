//! Handoffs between the tasks of one client: while a task of this client holds a mutex, the
//! client's other tasks that want it wait here, in arrival order, without asking Redis. The
//! holder's release hands the lock to the first of them in the same script call
//! (`script/lua/handoff.lua`: release A, grant B with the fence rule), so a grant costs one call
//! and no refused attempts.
//!
//! Another client is never starved: the acquire script records in `waiters` which client found
//! the lock busy (the first 8 characters of its owner tokens name the client), and the handoff
//! script hands over only while no other client waits. Otherwise it frees the lock, announces
//! it, and yields it to the others for [`YIELD`]: this client's acquires find it busy meanwhile.
//! A waiter that waits for replicas (`wait_replicas`) never queues here and is treated as
//! another client (its owner token is fully random).
//!
//! Cancellation: a queued waiter that is dropped leaves a closed channel that the next handoff
//! skips; a guard handed to a waiter dropped after the handoff was sent is dropped with the
//! channel, which releases it (and hands the lock on) in the background, as any dropped guard.
//! A queued waiter also looks at Redis itself after the wait loop's re-check period, so a
//! holder that never releases (a leaked guard) costs time, never liveness.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::acquire::{InFlight, Local};
use crate::core::Core;
use crate::error::Result;
use crate::fence::FenceToken;
use crate::held::{Grant, Held};
use crate::keys::LockKeys;
use crate::options::LockOptions;
use crate::script::{parse_fence, parse_reply, ttl_ms, ScriptCall, HANDOFF};
use crate::stats::Counters;

use super::guard::{LockGuard, MUTEX};

/// How long a handoff refused because another client waits keeps this client's acquires out:
/// the other client's waiter is woken by the release's announcement and gets in first, unless
/// it takes longer than this to try (then the lock goes to whoever asks first).
pub(crate) const YIELD: Duration = Duration::from_millis(20);

/// The client's local queues: one per mutex key that a task of this client holds or asks
/// Redis for (its turn). Only that task asks Redis; the others wait here in arrival order.
#[derive(Default)]
pub(crate) struct Handoffs {
    locks: Mutex<HashMap<Key, VecDeque<Waiter>>>,
}

/// A lock's keys, hashed and compared by the lock key (a clone is a reference count, so
/// registering a holder allocates nothing).
struct Key(LockKeys);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.0.lock_key() == other.0.lock_key()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.lock_key().hash(state);
    }
}

impl std::borrow::Borrow<str> for Key {
    fn borrow(&self) -> &str {
        self.0.lock_key()
    }
}

/// A task of this client waiting for a lock another of its tasks holds or asks Redis for.
pub(crate) struct Waiter {
    keys: LockKeys,
    owner: String,
    options: LockOptions,
    to: oneshot::Sender<Handed>,
}

/// What a waiter is told.
enum Handed {
    /// The lock, granted by the holder's release.
    Granted(LockGuard),
    /// The turn to ask Redis: the task before it let go without handing the lock over.
    Turn,
}

/// The turn of one task of this client to ask Redis for a lock; the others queue behind it.
/// Dropped without [`granted`](Self::granted) (the task gave up, or was cancelled), it passes
/// to the next waiter.
pub(crate) struct Turn {
    core: Arc<Core>,
    keys: LockKeys,
    armed: bool,
}

impl Turn {
    /// The turn ended in a grant: the guard now stands for this client's hold.
    pub(crate) fn granted(mut self) {
        self.armed = false;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.armed {
            self.core.handoffs.pass(self.keys.lock_key());
        }
    }
}

/// How a task entered the local queue.
enum Entered {
    /// No task of this client held or asked for the lock: this one asks Redis.
    Turn,
    /// Queued behind the task that holds or asks for it.
    Queued(oneshot::Receiver<Handed>),
}

impl Handoffs {
    fn locks(&self) -> MutexGuard<'_, HashMap<Key, VecDeque<Waiter>>> {
        self.locks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that a task of this client holds `keys`' lock (granted by Redis).
    pub(crate) fn hold(&self, keys: &LockKeys) {
        let mut locks = self.locks();
        if !locks.contains_key(keys.lock_key()) {
            locks.insert(Key(keys.clone()), VecDeque::new());
        }
    }

    /// Takes the turn for `keys`' lock, or queues behind the task that has it under a fresh
    /// owner token of this client (`tag`).
    fn enter(&self, keys: &LockKeys, tag: &str, options: &LockOptions) -> Entered {
        let mut locks = self.locks();
        let Some(queue) = locks.get_mut(keys.lock_key()) else {
            locks.insert(Key(keys.clone()), VecDeque::new());
            return Entered::Turn;
        };
        let (to, from) = oneshot::channel();
        queue.push_back(Waiter {
            keys: keys.clone(),
            owner: super::new_owner_token(tag),
            options: options.clone(),
            to,
        });
        Entered::Queued(from)
    }

    /// The first waiter still waiting for `key`'s lock.
    fn next(&self, key: &str) -> Option<Waiter> {
        let mut locks = self.locks();
        let queue = locks.get_mut(key)?;
        while let Some(waiter) = queue.pop_front() {
            if !waiter.to.is_closed() {
                return Some(waiter);
            }
        }
        None
    }

    /// The task holding or asking for `key`'s lock let go without handing it over: the next
    /// waiter takes the turn to ask Redis; with none, no task of this client has the lock.
    pub(crate) fn pass(&self, key: &str) {
        let mut locks = self.locks();
        let Some(queue) = locks.get_mut(key) else {
            return;
        };
        while let Some(waiter) = queue.pop_front() {
            if waiter.to.send(Handed::Turn).is_ok() {
                return;
            }
        }
        locks.remove(key);
    }
}

impl Waiter {
    /// Gives this waiter the turn to ask Redis (the lock was not handed to it); with the
    /// waiter gone, the turn passes on.
    fn turn(self, core: &Core, key: &str) {
        if self.to.send(Handed::Turn).is_err() {
            core.handoffs.pass(key);
        }
    }
}

/// Waits for the turn to ask Redis for `keys`' lock, queued behind this client's task that
/// holds it or has the turn, until handed the lock, given the turn, or `until` (then it asks
/// Redis without the turn: a holder that never lets go must not keep it waiting for good).
///
/// # Cancel safety
///
/// Cancel safe: dropped while queued, the waiter is skipped; dropped as the lock was handed to
/// it, the guard is dropped, which releases it and hands it on; dropped with the turn, the
/// turn passes on.
pub(crate) async fn wait(
    core: &Arc<Core>,
    keys: &LockKeys,
    options: &LockOptions,
    until: Instant,
) -> Local<LockGuard> {
    if options.wait.is_some() {
        return Local::NotHeld;
    }
    let turn = || Turn {
        core: Arc::clone(core),
        keys: keys.clone(),
        armed: true,
    };
    let from = match core.handoffs.enter(keys, core.tag(), options) {
        Entered::Turn => return Local::Ask(Some(turn())),
        Entered::Queued(from) => from,
    };
    match tokio::time::timeout_at(until.into(), from).await {
        Ok(Ok(Handed::Granted(guard))) => Local::Granted(guard),
        Ok(Ok(Handed::Turn)) => Local::Ask(Some(turn())),
        Ok(Err(_)) | Err(_) => Local::Ask(None),
    }
}

/// Releases `owner`'s hold `hold` on `keys`' lock and hands the lock to `waiter` in the same
/// call; tells the waiter to ask Redis when the lock was not handed. Returns the release's code
/// (as the release script's).
///
/// # Cancel safety
///
/// Dropped while the call is in flight, the grant it may make to the waiter is released in the
/// background, and the waiter asks Redis.
pub(crate) async fn release_to(
    core: &Arc<Core>,
    keys: &LockKeys,
    owner: &str,
    hold: &str,
    waiter: Waiter,
) -> Result<i64> {
    let (name, key) = (keys.name(), keys.lock_key());
    let lease = waiter.options.first_lease();
    let floor = waiter.options.floor.map_or(0, FenceToken::get);
    let (announce, mode, expiry) = (core.transport.announce(), core.fence_arg(), core.expiry());
    // Two owners, hold id, announce, TTL, floor, mode, yield, grace; numbers ≤ 60 bytes.
    let bytes = key.len() + owner.len() + hold.len() + waiter.owner.len() + mode.len() + 62;
    let call = ScriptCall::start(&HANDOFF, &[key], 9, bytes + expiry.len())
        .arg(owner)
        .arg(hold)
        .arg(announce)
        .arg(waiter.owner.as_str())
        .arg(ttl_ms(lease))
        .arg(floor)
        .arg(mode)
        .arg(ttl_ms(YIELD))
        .arg(expiry);
    let in_flight = InFlight::release(core, &MUTEX, key, &waiter.owner, "");
    let sent = Instant::now();
    let reply = core.transport.run_direct(&call, name, "release").await;
    let decoded =
        reply.and_then(|reply| parse_reply::<(i64, i64, i64, i64)>(name, "release", reply));
    let (code, handed, fence, behind) = match decoded {
        Ok(decoded) => decoded,
        Err(err) => {
            // The grant may have been made: the armed undo releases it, and the waiter asks.
            drop(in_flight);
            waiter.turn(core, key);
            return Err(err);
        }
    };
    in_flight.disarm();
    if handed != 1 {
        waiter.turn(core, key);
        return Ok(code);
    }
    let Waiter {
        owner: to_owner,
        options,
        to,
        ..
    } = waiter;
    let fence = match parse_fence(name, "release", "fence", fence) {
        Ok(fence) => fence,
        Err(err) => {
            core.transport
                .run_detached(MUTEX.release_call(core, key, &to_owner, ""), "release");
            core.handoffs.pass(key);
            return Err(err);
        }
    };
    if behind > 0 {
        core.clock_behind(name, behind);
    }
    Counters::add(&core.counters.grants, 1);
    Counters::add(&core.counters.handoffs, 1);
    tracing::debug!(lock = name, %fence, "handed over");
    let grant = Grant {
        keys: waiter.keys,
        owner: to_owner,
        hold: String::new(),
        fence,
        sent,
        ttl: lease,
        replicas_acked: None,
    };
    let guard = LockGuard::new(Held::new(core, &MUTEX, grant, &options).handing());
    // A waiter gone meanwhile drops the guard, which releases it and hands the lock on.
    let _ = to.send(Handed::Granted(guard));
    Ok(code)
}

/// Releases in the background, handing the lock on when a task of this client waits for it
/// (a guard dropped without `release`).
pub(crate) fn release_detached(core: &Arc<Core>, keys: &LockKeys, owner: &str, hold: &str) {
    let key = keys.lock_key();
    match core.handoffs.next(key) {
        Some(waiter) => {
            let (task_core, keys, owner, hold) = (
                Arc::clone(core),
                keys.clone(),
                owner.to_owned(),
                hold.to_owned(),
            );
            core.transport.spawn_detached(async move {
                if let Err(err) = release_to(&task_core, &keys, &owner, &hold, waiter).await {
                    tracing::debug!(lock = keys.name(), error = %err, "background release failed");
                }
            });
        }
        None => {
            let call = MUTEX.release_call(core, key, owner, hold);
            core.transport.run_detached(call, "release");
            core.handoffs.pass(key);
        }
    }
}

/// The first waiter of this client for `key`'s lock, when the hold being released may hand it
/// on.
pub(crate) fn next_waiter(core: &Core, key: &str) -> Option<Waiter> {
    core.handoffs.next(key)
}
