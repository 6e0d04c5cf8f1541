//! The watchdog: keeps watched locks alive while their guards live.
//!
//! One task per client renews every watched lock: it wakes when the earliest renewal is due,
//! takes every lock due within half a renewal period, groups them by the node serving their
//! slot and renews each group with one script call ([`RENEW`], up to [`BATCH`] locks per call).
//! A lock is thus renewed between half a period and a period after its last renewal, and a node
//! sees at most two or three calls per period however many locks it holds. When a group call
//! fails (a slot moved, a failover), the slot map is read again and that group's locks are
//! renewed one by one through the routed connection, which follows `MOVED` and `ASK`.
//!
//! The task starts with the first watched guard and ends when the last one is released or
//! dropped, so no task outlives its guards.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::Value;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::client::{parse_reply, Shared};
use crate::conn::Topology;
use crate::error::Error;
use crate::scripts::RENEW;
use crate::stats::Counters;

/// Most locks renewed by one call.
pub(crate) const BATCH: usize = 5000;

/// How soon a failed renewal is tried again.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// What the watchdog knows about one hold, shared with its guard.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    /// Until when the hold is surely valid (the last confirmed renewal's lease, less margin).
    pub(crate) valid_until: Instant,
    /// Set when the hold ended: Redis said so, or renewal stopped.
    pub(crate) ended: Option<Ended>,
}

/// A hold's [`Lease`], shared by the watchdog and the guard: a few dozen bytes, where a
/// `tokio::sync::watch` channel would take several hundred per held lock. Guards waiting in
/// `lost()` are woken through [`Watchdog::ended`] when a hold ends, and otherwise look again
/// when the lease they saw runs out.
#[derive(Debug, Clone)]
pub(crate) struct SharedLease(Arc<Mutex<Lease>>);

impl SharedLease {
    fn new(lease: Lease) -> Self {
        Self(Arc::new(Mutex::new(lease)))
    }

    pub(crate) fn get(&self) -> Lease {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn update(&self, change: impl FnOnce(&mut Lease)) {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// Why the watchdog stopped renewing a hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Redis found no live lease.
    Expired,
    /// Redis found another owner.
    NotOwner,
    /// Redis did not confirm a renewal before the lease ran out.
    Unconfirmed,
    /// The maximum hold time was reached; the lease ends at `valid_until`.
    MaxHold,
}

impl Ended {
    pub(crate) fn into_error(self, name: &str, max_hold: Option<Duration>) -> Error {
        let name = name.to_owned();
        match self {
            Ended::Expired => Error::Expired { name },
            Ended::NotOwner => Error::NotOwner { name },
            Ended::Unconfirmed => Error::LeaseUnconfirmed { name },
            Ended::MaxHold => Error::MaxHoldReached {
                name,
                max_hold: max_hold.unwrap_or_default(),
            },
        }
    }
}

/// The watched holds of one client.
#[derive(Default)]
pub(crate) struct Watchdog {
    state: Mutex<State>,
    wake: Notify,
    /// Notified (all waiters) whenever a hold ends.
    pub(crate) ended: Notify,
}

#[derive(Default)]
struct State {
    holds: HashMap<u64, Hold>,
    next_id: u64,
    /// The task, while it runs (a finished handle means it ended, e.g. with its runtime).
    task: Option<tokio::task::JoinHandle<()>>,
    /// When the task sleeps until; a hold due earlier wakes it.
    next_wake: Option<Instant>,
}

/// One watched hold: what renewing it takes (about 250 bytes with its strings).
struct Hold {
    lock_key: Box<str>,
    owner: Box<str>,
    slot: u16,
    ttl: Duration,
    every: Duration,
    hold_until: Option<Instant>,
    renew_at: Instant,
    /// False after a failed renewal: the retry waits for `renew_at` instead of coming early.
    early: bool,
    /// A renewal call for it is under way.
    in_flight: bool,
    lease: SharedLease,
}

/// What a guard needs to register its hold.
pub(crate) struct Watch<'a> {
    pub(crate) lock_key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) slot: u16,
    pub(crate) ttl: Duration,
    pub(crate) every: Duration,
    pub(crate) hold_until: Option<Instant>,
    pub(crate) valid_until: Instant,
}

/// One lock in a renewal call.
struct Due {
    id: u64,
    lock_key: Box<str>,
    owner: Box<str>,
    slot: u16,
    ttl_ms: String,
    ttl: Duration,
}

impl Watchdog {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts renewing a hold; returns its id and the lease the guard follows. `None` without
    /// a Tokio runtime.
    pub(crate) fn watch(shared: &Arc<Shared>, hold: Watch<'_>) -> Option<(u64, SharedLease)> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let lease = SharedLease::new(Lease {
            valid_until: hold.valid_until,
            ended: None,
        });
        let receiver = lease.clone();
        let renew_at = Instant::now() + hold.every;
        let watchdog = &shared.watchdog;
        let mut state = watchdog.state();
        let id = state.next_id;
        state.next_id += 1;
        state.holds.insert(
            id,
            Hold {
                lock_key: hold.lock_key.into(),
                owner: hold.owner.into(),
                slot: hold.slot,
                ttl: hold.ttl,
                every: hold.every,
                hold_until: hold.hold_until,
                renew_at,
                early: true,
                in_flight: false,
                lease,
            },
        );
        if state.task.as_ref().is_none_or(|task| task.is_finished()) {
            state.task = Some(runtime.spawn(run(Arc::clone(shared))));
        } else if state.next_wake.is_none_or(|wake| renew_at < wake) {
            watchdog.wake.notify_one();
        }
        Some((id, receiver))
    }

    /// Stops renewing a hold; the task ends with the last one.
    pub(crate) fn unwatch(&self, id: u64) {
        let mut state = self.state();
        state.holds.remove(&id);
        if state.holds.is_empty() {
            self.wake.notify_one();
        }
    }

    /// Records an extension made by the guard: renew with `ttl` from now on.
    pub(crate) fn extended(&self, id: u64, ttl: Duration, every: Duration, valid_until: Instant) {
        let mut state = self.state();
        if let Some(hold) = state.holds.get_mut(&id) {
            hold.ttl = ttl;
            hold.every = every;
            hold.renew_at = Instant::now() + every;
            hold.lease.update(|lease| lease.valid_until = valid_until);
        }
    }

    /// When a hold is due (its renewal time has come), the holds due within half their
    /// period, with the TTL to renew them with; holds past their maximum hold time are ended
    /// instead. Returns the batch and when the next renewal is due.
    ///
    /// Renewing early only together with a hold that is due makes the holds fall into step:
    /// after a period or two, all holds of a client are renewed by one batch per period.
    fn take_due(&self, now: Instant) -> (Vec<Due>, Option<Instant>) {
        let mut state = self.state();
        let earliest = state
            .holds
            .values()
            .filter(|hold| !hold.in_flight)
            .map(|hold| hold.renew_at)
            .min();
        match earliest {
            Some(at) if at <= now => {}
            other => {
                state.next_wake = other;
                return (Vec::new(), other);
            }
        }
        let mut due = Vec::new();
        let mut ended = Vec::new();
        let mut next: Option<Instant> = None;
        for (&id, hold) in &mut state.holds {
            if hold.in_flight {
                continue;
            }
            let window = if hold.early {
                hold.every / 2
            } else {
                Duration::ZERO
            };
            if hold.renew_at > now + window {
                next = Some(next.map_or(hold.renew_at, |n| n.min(hold.renew_at)));
                continue;
            }
            let ttl = match hold.hold_until {
                Some(until) if until <= now + Duration::from_millis(1) => {
                    ended.push((id, Ended::MaxHold));
                    continue;
                }
                Some(until) => hold.ttl.min(until - now),
                None => hold.ttl,
            };
            if hold.lease.get().valid_until <= now {
                ended.push((id, Ended::Unconfirmed));
                continue;
            }
            hold.in_flight = true;
            due.push(Due {
                id,
                lock_key: hold.lock_key.clone(),
                owner: hold.owner.clone(),
                slot: hold.slot,
                ttl_ms: crate::client::ttl_millis(ttl),
                ttl,
            });
        }
        for (id, why) in ended {
            if let Some(hold) = state.holds.remove(&id) {
                self.end(&hold, why);
            }
        }
        state.next_wake = next;
        (due, next)
    }

    /// Applies the codes of one renewal call, sent at `sent`.
    fn apply(&self, counters: &Counters, due: &[Due], codes: &[i64], sent: Instant) {
        let mut state = self.state();
        for (lock, code) in due.iter().zip(codes) {
            let Some(hold) = state.holds.get_mut(&lock.id) else {
                continue;
            };
            let why = match code {
                1 if lock.ttl < hold.ttl => {
                    // Cut short by the maximum hold time: the last renewal.
                    let valid_until = crate::guard::lease_end(sent.into_std(), lock.ttl).into();
                    hold.lease.update(|lease| lease.valid_until = valid_until);
                    Counters::add(&counters.renewals, 1);
                    Ended::MaxHold
                }
                1 => {
                    hold.renew_at = sent + hold.every;
                    hold.early = true;
                    hold.in_flight = false;
                    let valid_until = crate::guard::lease_end(sent.into_std(), lock.ttl).into();
                    hold.lease.update(|lease| lease.valid_until = valid_until);
                    Counters::add(&counters.renewals, 1);
                    continue;
                }
                0 => Ended::Expired,
                _ => Ended::NotOwner,
            };
            if let Some(hold) = state.holds.remove(&lock.id) {
                if why != Ended::MaxHold {
                    Counters::add(&counters.lost, 1);
                }
                self.end(&hold, why);
            }
        }
    }

    /// Schedules failed renewals to be tried again soon.
    fn retry(&self, due: &[Due]) {
        let mut state = self.state();
        let at = Instant::now() + RETRY_AFTER;
        for lock in due {
            if let Some(hold) = state.holds.get_mut(&lock.id) {
                hold.renew_at = hold.renew_at.min(at);
                hold.early = false;
                hold.in_flight = false;
            }
        }
    }

    /// Ends the task when no hold is left; decided under the lock `watch` takes.
    fn retire_if_idle(&self) -> bool {
        let mut state = self.state();
        if state.holds.is_empty() {
            state.task = None;
            state.next_wake = None;
            return true;
        }
        false
    }

    fn end(&self, hold: &Hold, why: Ended) {
        if why == Ended::MaxHold {
            tracing::info!(lock = %hold.lock_key, "maximum hold time reached: renewal stops");
        } else {
            tracing::warn!(lock = %hold.lock_key, reason = ?why, "watchdog stopped renewing: lock lost");
        }
        hold.lease.update(|lease| lease.ended = Some(why));
        self.ended.notify_waiters();
    }
}

/// The watchdog task of one client. Renewal calls run as child tasks so that a node that
/// stops answering delays only its own locks; they end with this task.
async fn run(shared: Arc<Shared>) {
    let nodes = Arc::new(tokio::sync::RwLock::new(SlotMap::default()));
    let mut calls = tokio::task::JoinSet::new();
    loop {
        if calls.is_empty() && shared.watchdog.retire_if_idle() {
            return;
        }
        let (due, next) = shared.watchdog.take_due(Instant::now());
        if !due.is_empty() {
            if shared.topology() == Topology::Cluster && nodes.read().await.is_empty() {
                nodes.write().await.refresh(&shared).await;
            }
            let mut groups: HashMap<usize, Vec<Due>> = HashMap::new();
            {
                let map = nodes.read().await;
                for lock in due {
                    groups.entry(map.node_of(lock.slot)).or_default().push(lock);
                }
            }
            for (_, mut group) in groups {
                while !group.is_empty() {
                    let chunk: Vec<Due> = group.drain(..group.len().min(BATCH)).collect();
                    calls.spawn(renew(Arc::clone(&shared), Arc::clone(&nodes), chunk));
                }
            }
            continue;
        }
        let sleep_until = next.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            () = tokio::time::sleep_until(sleep_until) => {}
            () = shared.watchdog.wake.notified() => {}
            Some(_) = calls.join_next(), if !calls.is_empty() => {}
        }
    }
}

/// Renews the locks of one node with one call; when it fails, reads the slot map again and
/// renews them one by one, scheduling a retry for those that fail again.
async fn renew(shared: Arc<Shared>, nodes: Arc<tokio::sync::RwLock<SlotMap>>, chunk: Vec<Due>) {
    if renew_group(&shared, &chunk).await {
        return;
    }
    nodes.write().await.refresh(&shared).await;
    let mut rest = chunk.into_iter();
    while let Some(lock) = rest.next() {
        let one = [lock];
        if !renew_group(&shared, &one).await {
            // Most likely the node is down: try all of them again soon rather than waiting
            // out one timeout per lock.
            shared.watchdog.retry(&one);
            shared.watchdog.retry(&rest.collect::<Vec<_>>());
            return;
        }
    }
}

/// One renewal call for locks on one node; false when it failed as a whole.
async fn renew_group(shared: &Arc<Shared>, due: &[Due]) -> bool {
    let Some(first) = due.first() else {
        return true;
    };
    let mut args: Vec<&str> = Vec::with_capacity(due.len() * 3);
    for lock in due {
        args.extend([&*lock.lock_key, &*lock.owner, lock.ttl_ms.as_str()]);
    }
    args.push(shared.expiry());
    let sent = Instant::now();
    Counters::add(&shared.counters.renewal_calls, 1);
    let reply = shared
        .run_script(&first.lock_key, "renew", &RENEW, &[&first.lock_key], &args)
        .await
        .and_then(|reply| parse_reply::<Vec<i64>>(&first.lock_key, "renew", reply));
    match reply {
        Ok(codes) if codes.len() == due.len() => {
            tracing::debug!(locks = due.len(), "renewed");
            shared.watchdog.apply(&shared.counters, due, &codes, sent);
            true
        }
        Ok(codes) => {
            tracing::warn!(
                sent = due.len(),
                answered = codes.len(),
                "renewal reply of the wrong length"
            );
            false
        }
        Err(err) => {
            tracing::debug!(locks = due.len(), error = %err, "renewal call failed");
            false
        }
    }
}

/// Which node serves each slot, as an index per node, from `CLUSTER SLOTS`; empty (one group)
/// for a standalone server or when the map cannot be read.
#[derive(Default)]
struct SlotMap {
    node_of_slot: Vec<u16>,
}

impl SlotMap {
    fn is_empty(&self) -> bool {
        self.node_of_slot.is_empty()
    }

    fn node_of(&self, slot: u16) -> usize {
        self.node_of_slot
            .get(usize::from(slot))
            .map_or(0, |&n| usize::from(n))
    }

    async fn refresh(&mut self, shared: &Arc<Shared>) {
        if shared.topology() != Topology::Cluster {
            return;
        }
        match shared.cluster_slots().await {
            Ok(reply) => self.node_of_slot = parse_slots(&reply),
            Err(err) => {
                tracing::debug!(error = %err, "cannot read the slot map: renewing lock by lock");
                self.node_of_slot.clear();
            }
        }
    }
}

/// Maps each slot to an index of the master serving it, from a `CLUSTER SLOTS` reply.
fn parse_slots(reply: &Value) -> Vec<u16> {
    let mut map = vec![0u16; usize::from(crate::keys::SLOT_COUNT)];
    let mut masters: Vec<Vec<u8>> = Vec::new();
    let Value::Array(ranges) = reply else {
        return Vec::new();
    };
    for range in ranges {
        let Value::Array(fields) = range else {
            continue;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (fields.first(), fields.get(1), fields.get(2))
        else {
            continue;
        };
        let id = format!("{master:?}").into_bytes();
        let index = masters.iter().position(|m| *m == id).unwrap_or_else(|| {
            masters.push(id);
            masters.len() - 1
        });
        for slot in *start..=*end {
            if let Some(entry) = usize::try_from(slot).ok().and_then(|s| map.get_mut(s)) {
                *entry = u16::try_from(index + 1).unwrap_or(u16::MAX);
            }
        }
    }
    map
}
