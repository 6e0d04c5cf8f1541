//! Handoffs between the tasks of one client: while a task of this client holds a mutex, the
//! client's other tasks that want it wait here, in arrival order, without asking Redis. The
//! holder's release hands the lock to the first of them in the same script call
//! (`script/lua/handoff.lua`: release A, grant B with the fence rule), so a grant costs at most
//! one call and no refused attempts.
//!
//! That call also takes a fence for each task still queued behind B (up to [`RESERVE`] in all):
//! Redis stores the last of them, so every later grant is above them all. B's release then
//! hands the lock to the next task with no call at all while such fences remain (the `Held`'s
//! `hand_within`): the next task gets a hold of the same owner token, lease and watch with the
//! next fence, as long as the lease has most of its TTL left (half under a watchdog, which goes
//! on renewing it, 90% without), the task asked for the same lease and renewal (no maximum
//! hold, no floor at or above the fence), and no [`Reentry`](crate::Reentry) handle shares the
//! token. Otherwise the release is a handoff call again.
//!
//! Another client is never starved: the acquire script records in `waiters` which client found
//! the lock busy (the first 8 characters of its owner tokens name the client), and the handoff
//! script hands over only while no other client waits (handoffs without a call do not look:
//! another client waits at most [`RESERVE`] grants more). Otherwise it frees the lock, announces
//! it, and yields it to the others for [`YIELD`]: this client's acquires find it busy meanwhile.
//! A waiter that waits for replicas (`wait_replicas`) never queues here and is treated as
//! another client (its owner token is fully random).
//!
//! Cancellation: a queued waiter that is dropped leaves a closed channel that the next handoff
//! skips; a guard handed to a waiter dropped after the handoff was sent is dropped with the
//! channel, which releases it (and hands the lock on) in the background, as any dropped guard.
//! A queued waiter also looks at Redis itself after the wait loop's re-check period, so a
//! holder that never releases (a leaked guard) costs time, never liveness.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::acquire::{InFlight, Local};
use crate::core::Core;
use crate::error::{Operation, Result};
use crate::fence::FenceToken;
use crate::held::{Grant, Handing, Held};
use crate::keys::LockKeys;
use crate::local_queue::{Entered, Handed, Turn, Waiter};
use crate::options::LockOptions;
use crate::script::{parse_fence, parse_reply, ttl_ms, ScriptCall, HANDOFF, HANDOFF_FLOOR};
use crate::stats::Counters;

use super::guard::{LockGuard, MUTEX};

/// How long a handoff refused because another client waits keeps this client's acquires out:
/// the other client's waiter is woken by the release's announcement and gets in first, unless
/// it takes longer than this to try (then the lock goes to whoever asks first).
pub(crate) const YIELD: Duration = Duration::from_millis(20);

/// The most fences a handoff takes at once: the one it grants and the ones reserved for the
/// holder to hand the lock on within the client without a call (one for each task queued
/// behind it, up to this). Another client waiting gets in after at most this many grants more
/// than with a call per grant.
pub(crate) const RESERVE: u64 = 16;

/// How a mutex hold hands the lock to this client's next waiting task.
pub(crate) static HANDING: Handing = Handing {
    over: hand_over,
    wrap: |held| Box::new(LockGuard::new(held)),
};

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
    let owner = || crate::owner::token(core.tag());
    match core.handoffs.enter(keys, options, owner) {
        Entered::Turn(turn) => Local::Ask(Some(turn)),
        Entered::Queued(from) => match tokio::time::timeout_at(until.into(), from).await {
            Ok(handed) => told(handed.ok()),
            Err(_) => Local::Ask(None),
        },
        Entered::Lingering(hold) => taken(core, keys, options, hold).await,
    }
}

/// What a waiter of this client makes of what it was told (`None`: nothing, its sender gone).
fn told(handed: Option<Handed>) -> Local<LockGuard> {
    match handed {
        Some(Handed::Granted(guard)) => match guard.downcast::<LockGuard>() {
            Ok(guard) => Local::Granted(*guard),
            // Only the mutex hands over here; anything else is dropped (and so released).
            Err(_) => Local::Ask(None),
        },
        Some(Handed::Turn(turn)) => Local::Ask(Some(turn)),
        None => Local::Ask(None),
    }
}

/// The lock a hold of this client whose release lingers on `keys`' lock hands to a task that
/// makes one attempt ([`Client::try_lock`](crate::Client::try_lock)), if one lingers: granted,
/// or the turn to ask Redis. `None` when none lingers.
///
/// # Cancel safety
///
/// As [`wait`].
pub(crate) async fn lingering(
    core: &Arc<Core>,
    keys: &LockKeys,
    options: &LockOptions,
) -> Option<Local<LockGuard>> {
    if options.wait.is_some() {
        return None;
    }
    let hold = core.handoffs.take_lingering(keys)?;
    Some(taken(core, keys, options, hold).await)
}

/// Has `hold`, a lingering hold of this client taken from the local queue, hand the lock to
/// the calling task (see `Held::hand_to`).
async fn taken(
    core: &Arc<Core>,
    keys: &LockKeys,
    options: &LockOptions,
    hold: Box<dyn Any + Send>,
) -> Local<LockGuard> {
    let Ok(held) = hold.downcast::<Held>() else {
        // Only a mutex hold lingers; anything else was dropped (and so released).
        return Local::Ask(None);
    };
    let (to, from) = oneshot::channel();
    let waiter = Waiter {
        keys: keys.clone(),
        owner: crate::owner::token(core.tag()),
        options: options.clone(),
        to,
    };
    if let Err(err) = held.hand_to(waiter).await {
        tracing::debug!(lock = keys.name(), error = %err, "lingering release failed");
    }
    // Answered by now (granted, or told to ask): no bound needed, even for a try.
    told(from.await.ok())
}

/// Releases `owner`'s hold `hold` on `keys`' lock and hands the lock to `waiter` in the same
/// call; tells the waiter to ask Redis when the lock was not handed. Returns the release's code
/// (as the release script's). A `cohort` hold (granted by Redis after it waited behind other
/// clients' places) hands the lock to the waiter ahead of those places and takes [`RESERVE`]
/// fences, so this client goes on handing it within itself for that many grants at most.
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
    cohort: bool,
) -> Result<i64> {
    let (name, key) = (keys.name(), keys.lock_key());
    let lease = waiter.options.first_lease();
    let floor = core.floor(&waiter.options);
    let (announce, mode, expiry) = (core.transport.announce(), core.fence_arg(), core.expiry());
    let queued = u64::try_from(core.handoffs.waiting(keys)).unwrap_or(u64::MAX);
    let take = if cohort {
        RESERVE
    } else {
        queued.saturating_add(1).min(RESERVE)
    };
    // Two owners, hold id, announce, TTL, floor, mode, yield, fences, cohort, grace; numbers
    // ≤ 70 bytes.
    let bytes = key.len() + owner.len() + hold.len() + waiter.owner.len() + mode.len() + 74;
    let script = if core.reads_floor() {
        &HANDOFF_FLOOR
    } else {
        &HANDOFF
    };
    let call = ScriptCall::start(script, &[key], 11, bytes + expiry.len())
        .arg(owner)
        .arg(hold)
        .arg(announce)
        .arg(waiter.owner.as_str())
        .arg(ttl_ms(lease))
        .arg(floor)
        .arg(mode)
        .arg(ttl_ms(YIELD))
        .arg(take)
        .arg(if cohort { "c" } else { "" })
        .arg(expiry);
    let in_flight = InFlight::release(core, &MUTEX, key, &waiter.owner, "");
    let sent = Instant::now();
    let reply = core
        .transport
        .run_direct(&call, name, Operation::Release)
        .await;
    let decoded = reply
        .and_then(|reply| parse_reply::<(i64, i64, i64, i64)>(name, Operation::Release, reply));
    let (code, handed, fence, behind) = match decoded {
        Ok(decoded) => decoded,
        Err(err) => {
            // The grant may have been made: the armed undo releases it, and the waiter asks.
            drop(in_flight);
            waiter.turn(&core.handoffs);
            return Err(err);
        }
    };
    in_flight.disarm();
    if handed != 1 {
        waiter.turn(&core.handoffs);
        return Ok(code);
    }
    let Waiter {
        owner: to_owner,
        options,
        to,
        ..
    } = waiter;
    let fence = match parse_fence(name, Operation::Release, "fence", fence) {
        Ok(fence) => fence,
        Err(err) => {
            core.transport.run_detached(
                MUTEX.release_call(core, key, &to_owner, ""),
                Operation::Release,
            );
            // The turn is this waiter's alone: it asks Redis, under its call's own token (with
            // the waiter gone, the turn's drop passes it on).
            let _ = to.send(Handed::Turn(Turn::new(&core.handoffs, keys)));
            return Err(err);
        }
    };
    if behind > 0 {
        core.clock_behind("mutex", name, behind);
    }
    Counters::add(&core.counters.grants, "mutex", 1);
    Counters::add(&core.counters.handoffs, "mutex", 1);
    tracing::debug!(lock = name, %fence, "handed over");
    let grant = Grant {
        weight: 1,
        keys: waiter.keys,
        owner: to_owner,
        hold: String::new(),
        fence,
        sent,
        ttl: lease,
        replicas_acked: None,
    };
    let last = FenceToken::new(fence.get() + take - 1).unwrap_or(fence);
    let held = Held::new(core, &MUTEX, grant, &options).reserved(last, sent);
    let guard = LockGuard::new(held.handing(&HANDING));
    // A waiter gone meanwhile drops the guard, which releases it and hands the lock on.
    let _ = to.send(Handed::Granted(Box::new(guard)));
    Ok(code)
}

/// [`release_to`] as a [`HandOver`](crate::held::HandOver), the hook a mutex hold registered in the local queue is
/// released with.
pub(crate) fn hand_over<'a>(
    core: &'a Arc<Core>,
    keys: &'a LockKeys,
    owner: &'a str,
    hold: &'a str,
    waiter: Waiter,
    cohort: bool,
) -> Pin<Box<dyn Future<Output = Result<i64>> + Send + 'a>> {
    Box::pin(release_to(core, keys, owner, hold, waiter, cohort))
}
