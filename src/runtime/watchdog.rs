//! The watchdog: keeps watched locks alive while their guards live.
//!
//! One task per client renews every watched lock: it wakes when the earliest renewal is due,
//! takes every lock due within half a renewal period, groups them by the node serving their
//! slot, by their batching lane on that node (so a renewal keeps its order with each lock's
//! other calls, `transport/batch.rs`) and by the renew script of their primitive (the mutex's
//! is [`RENEW`](crate::script::RENEW)), and renews each group with one script call (up to
//! [`BATCH`] locks per call, by weight: a semaphore hold weighs more). Where a standalone server
//! loads fencelock's module the mutex's renewals are its `fencelock.renew`; on a cluster they
//! stay the script, which reaches keys of several slots through its arguments.
//! A lock is thus renewed between half a period and a period after its last renewal, and a node
//! sees at most two or three calls per period and lane for every [`BATCH`] locks it holds. When a group call
//! fails (a slot moved, a failover, one lock's key overwritten), the slot map is read again and
//! that group's locks are renewed one by one through the routed connection, which follows
//! `MOVED` and `ASK`.
//!
//! # When renewals fail
//!
//! - **Back-off per lock.** After `n` consecutive failed renewals a lock is tried again
//!   `100 ms × 2^(n-1)` later, at most a quarter of its renewal period later, and never later
//!   than the end of its last confirmed lease ([`retry_at`]); a success resets `n`. A failure
//!   comes at most a period after the last renewal, when at least `TTL − period` of the lease
//!   is left, so at least `4 × (TTL − period) / period` tries fit before the lease ends: four
//!   for a period of half the TTL, eight for the default TTL/3. A lock costs at most one call
//!   per quarter period however fast Redis refuses. The locks of a failed call share their count and
//!   so stay in one batch; no jitter is added, since the renewal times of different clients are
//!   already spread by when they took their locks. A lease that runs out unconfirmed ends the
//!   hold at its end as before ([`Ended::Unconfirmed`]).
//! - **One by one, skipping failures.** In the one-by-one fallback a lock whose own call fails
//!   is rescheduled with its back-off and the next lock is tried. Only when
//!   [`NODE_DOWN_AFTER`] locks in a row fail with a transient error (timeout, refused
//!   connection, `READONLY`…) is the node taken to be down and the rest rescheduled at once,
//!   rather than waiting out one timeout per lock. A standalone server's locks are not tried one
//!   by one after a transient failure at all: it is the same node either way.
//! - **Failures that retrying does not cure end the hold.** A call for one lock that Redis
//!   answers with an error that is not transient (`WRONGTYPE` because the key was overwritten,
//!   a script error, an unexpected reply) ends that hold: [`Ended::Failed`], reported by
//!   `lost()` as [`Error::RenewalFailed`] and counted as lost. Other holds are not affected.
//!
//! The task starts with the first watched guard and ends [`LINGER`] after the last one is
//! released or dropped, so no task outlives its guards by more than that. It lingers so that a
//! client taking and releasing locks in a loop keeps one sleeping task instead of starting one,
//! and waking it twice, per grant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::{Error, Operation};
use crate::script::{parse_reply, ttl_millis, LuaScript, Outcome, ScriptCall};
use crate::stats::{kind_of, Counters};
use crate::transport::{Topology, Transport};

use super::lease::{lease_end, Ended, Lease, SharedLease};

/// Most locks renewed by one call, by weight ([`Watch::weight`]: a mutex lock weighs 1).
pub(crate) const BATCH: u32 = 200;

/// How soon a failed renewal is first tried again; it doubles with each further failure.
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// Transient failures in a row after which the one-by-one fallback takes the node to be down.
const NODE_DOWN_AFTER: usize = 2;

/// How long the task stays after its last hold ends, for the next one.
const LINGER: Duration = Duration::from_millis(500);

/// When to try again a renewal that failed for the `failures`-th time in a row at `now`:
/// [`FIRST_RETRY`] doubled per earlier failure, at most a quarter of the renewal period `every`
/// (at least 1 ms), and no later than `valid_until`, when the lease ends unconfirmed.
fn retry_at(now: Instant, failures: u32, every: Duration, valid_until: Instant) -> Instant {
    let cap = (every / 4).max(Duration::from_millis(1));
    let doublings = failures.saturating_sub(1).min(20);
    let backoff = FIRST_RETRY.saturating_mul(1 << doublings).min(cap);
    (now + backoff).min(valid_until)
}

/// When to renew a lease renewed every `every` from `from` that ends, as this client counts
/// it, at `valid_until`: after the period, but no later than three quarters of the way to the
/// lease end, so that a period close to the TTL still leaves the renewal time to arrive.
fn renew_time(from: Instant, every: Duration, valid_until: Instant) -> Instant {
    let latest = from + valid_until.saturating_duration_since(from) * 3 / 4;
    (from + every).min(latest)
}

/// The watchdog of one client: its watched holds, and what its task needs to renew them.
pub(crate) struct Watchdog {
    schedule: Schedule,
    transport: Arc<Transport>,
    counters: Arc<Counters>,
    /// The scripts' expiry argument (see [`crate::core::Core::expiry`]).
    expiry: Arc<str>,
}

/// The watched holds and when each is due: the watchdog's bookkeeping, without I/O.
#[derive(Default)]
struct Schedule {
    state: Mutex<State>,
    wake: Notify,
    /// Notified (all waiters) whenever a hold ends.
    ended: Notify,
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
    /// The script that renews it (the hold's primitive's).
    renew: &'static LuaScript,
    /// Its weight in a renewal call, in mutex locks (see [`Watch::weight`]).
    weight: u32,
    ttl: Duration,
    every: Duration,
    hold_until: Option<Instant>,
    renew_at: Instant,
    /// False after a failed renewal: the retry waits for `renew_at` instead of coming early.
    early: bool,
    /// Renewals that failed in a row, for the back-off.
    failures: u32,
    /// A renewal call for it is under way.
    in_flight: bool,
    /// The lease that renewal would give, counted from when it was taken due (no later than
    /// it was sent): an `extend` meanwhile may land before or after it in Redis.
    in_flight_until: Instant,
    /// Bumped by every [`Watchdog::extended`]: a renewal taken due before may only lower the
    /// lease end the extension set.
    generation: u64,
    lease: SharedLease,
}

impl Hold {
    /// A waiting call's place in a queue (renewed by `fair_renew_place`), not a held lock.
    fn is_place(&self) -> bool {
        self.renew.name() == "fair_renew_place"
    }
}

/// What a guard needs to register its hold.
pub(crate) struct Watch<'a> {
    pub(crate) lock_key: &'a str,
    pub(crate) owner: &'a str,
    pub(crate) slot: u16,
    /// The primitive's renew script: `ARGV` triples key, owner, TTL in ms, then the expiry
    /// grace; one `1`/`0`/`-1` per triple.
    pub(crate) renew: &'static LuaScript,
    /// What renewing it costs the server, in mutex locks (1 for every primitive but the
    /// semaphore, whose renewal reads every permit entry): a renewal call carries holds up to
    /// [`BATCH`] in weight.
    pub(crate) weight: u32,
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
    renew: &'static LuaScript,
    weight: u32,
    ttl_ms: String,
    ttl: Duration,
    /// The TTL was cut to end at the maximum hold time: the last renewal.
    capped: bool,
    /// The hold's [`Hold::generation`] when it was taken due.
    generation: u64,
}

impl Watchdog {
    /// A watchdog renewing through `transport`; its task starts with the first watched hold.
    pub(crate) fn new(
        transport: Arc<Transport>,
        counters: Arc<Counters>,
        expiry: Arc<str>,
    ) -> Self {
        Self {
            schedule: Schedule::default(),
            transport,
            counters,
            expiry,
        }
    }

    /// Notified (all waiters) whenever a hold ends.
    pub(crate) fn ended(&self) -> &Notify {
        &self.schedule.ended
    }

    /// Starts renewing a hold; returns its id and the lease the guard follows. `None` without
    /// a Tokio runtime.
    pub(crate) fn watch(self: &Arc<Self>, hold: Watch<'_>) -> Option<(u64, SharedLease)> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let lease = SharedLease::new(Lease {
            valid_until: hold.valid_until,
            ended: None,
        });
        let receiver = lease.clone();
        let renew_at = renew_time(Instant::now(), hold.every, hold.valid_until);
        let schedule = &self.schedule;
        let mut state = schedule.state();
        let id = state.next_id;
        state.next_id += 1;
        state.holds.insert(
            id,
            Hold {
                lock_key: hold.lock_key.into(),
                owner: hold.owner.into(),
                slot: hold.slot,
                renew: hold.renew,
                weight: hold.weight.max(1),
                ttl: hold.ttl,
                every: hold.every,
                hold_until: hold.hold_until,
                renew_at,
                early: true,
                failures: 0,
                in_flight: false,
                in_flight_until: renew_at,
                generation: 0,
                lease,
            },
        );
        if state.task.as_ref().is_none_or(|task| task.is_finished()) {
            state.task = Some(runtime.spawn(run(Arc::clone(self))));
        } else if state.next_wake.is_none_or(|wake| renew_at < wake) {
            schedule.wake.notify_one();
        }
        Some((id, receiver))
    }

    /// Stops renewing a hold; the task ends [`LINGER`] after the last one.
    pub(crate) fn unwatch(&self, id: u64) {
        let mut state = self.schedule.state();
        state.holds.remove(&id);
        if state.holds.is_empty() {
            // The task wakes within LINGER to end: woken now only when it sleeps longer.
            let soon = Instant::now() + LINGER;
            if state.next_wake.is_none_or(|wake| wake > soon) {
                state.next_wake = Some(soon);
                self.schedule.wake.notify_one();
            }
        }
    }

    /// Records an extension made by the guard: renew with `ttl` from now on. With a renewal in
    /// flight, Redis may run the two in either order: the lease end is the earlier of both.
    pub(crate) fn extended(&self, id: u64, ttl: Duration, every: Duration, valid_until: Instant) {
        self.schedule.extended(id, ttl, every, valid_until);
    }

    /// Ends a watched hold that a call of its guard found lost (`why`).
    pub(crate) fn lost(&self, id: u64, why: Ended) {
        let removed = self.schedule.state().holds.remove(&id);
        if let Some(hold) = removed {
            self.schedule.end(&hold, why);
        }
    }
}

impl Schedule {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Watchdog::extended`].
    fn extended(&self, id: u64, ttl: Duration, every: Duration, valid_until: Instant) {
        let mut state = self.state();
        if let Some(hold) = state.holds.get_mut(&id) {
            hold.ttl = ttl;
            hold.every = every;
            hold.failures = 0;
            hold.generation = hold.generation.wrapping_add(1);
            let valid_until = if hold.in_flight {
                valid_until.min(hold.in_flight_until)
            } else {
                valid_until
            };
            hold.renew_at = renew_time(Instant::now(), every, valid_until);
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
                state.next_wake = Some(other.unwrap_or(now + LINGER));
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
            let (ttl, capped) = match hold.hold_until {
                Some(until) if until <= now + Duration::from_millis(1) => {
                    ended.push((id, Ended::MaxHold));
                    continue;
                }
                Some(until) if until - now < hold.ttl => (until - now, true),
                Some(_) | None => (hold.ttl, false),
            };
            if hold.lease.get().valid_until <= now {
                ended.push((id, Ended::Unconfirmed));
                continue;
            }
            hold.in_flight = true;
            hold.in_flight_until = lease_end(now.into_std(), ttl).into();
            due.push(Due {
                id,
                lock_key: hold.lock_key.clone(),
                owner: hold.owner.clone(),
                slot: hold.slot,
                renew: hold.renew,
                weight: hold.weight,
                ttl_ms: ttl_millis(ttl),
                ttl,
                capped,
                generation: hold.generation,
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
            let why = match Outcome::from_code(*code) {
                Some(Outcome::Done) if lock.generation != hold.generation => {
                    // The guard extended the lease while this renewal was in flight: either may
                    // have run last in Redis, so the earlier lease end stands.
                    hold.in_flight = false;
                    hold.failures = 0;
                    let renewed = lease_end(sent.into_std(), lock.ttl).into();
                    hold.lease.update(|lease| {
                        lease.valid_until = lease.valid_until.min(renewed);
                    });
                    Counters::add(&counters.renewals, kind_of(&lock.lock_key), 1);
                    continue;
                }
                Some(Outcome::Done) if lock.capped => {
                    // Cut short by the maximum hold time: the last renewal.
                    let valid_until = lease_end(sent.into_std(), lock.ttl).into();
                    hold.lease.update(|lease| lease.valid_until = valid_until);
                    Counters::add(&counters.renewals, kind_of(&lock.lock_key), 1);
                    Ended::MaxHold
                }
                Some(Outcome::Done) => {
                    let valid_until = lease_end(sent.into_std(), lock.ttl).into();
                    hold.renew_at = renew_time(sent, hold.every, valid_until);
                    hold.early = true;
                    hold.failures = 0;
                    hold.in_flight = false;
                    hold.lease.update(|lease| lease.valid_until = valid_until);
                    Counters::add(&counters.renewals, kind_of(&lock.lock_key), 1);
                    continue;
                }
                Some(Outcome::Expired) => Ended::Expired,
                Some(Outcome::ForceUnlocked) => Ended::ForceUnlocked,
                Some(Outcome::NotOwner) | None => Ended::NotOwner,
            };
            if let Some(hold) = state.holds.remove(&lock.id) {
                if why != Ended::MaxHold && !hold.is_place() {
                    Counters::add(&counters.lost, kind_of(&lock.lock_key), 1);
                }
                self.end(&hold, why);
            }
        }
    }

    /// Schedules renewals that failed at `now` to be tried again after their back-off
    /// ([`retry_at`]).
    fn retry(&self, due: &[Due], now: Instant) {
        let mut state = self.state();
        for lock in due {
            if let Some(hold) = state.holds.get_mut(&lock.id) {
                hold.failures = hold.failures.saturating_add(1);
                let valid_until = hold.lease.get().valid_until;
                hold.renew_at = retry_at(now, hold.failures, hold.every, valid_until);
                hold.early = false;
                hold.in_flight = false;
            }
        }
    }

    /// Ends a hold whose renewal Redis refused with an error that retrying does not cure.
    fn failed(&self, counters: &Counters, lock: &Due, error: &Error) {
        let reason: Arc<str> = match error {
            Error::Redis { source, .. } => source.to_string(),
            other => other.to_string(),
        }
        .into();
        let removed = self.state().holds.remove(&lock.id);
        if let Some(hold) = removed {
            if !hold.is_place() {
                Counters::add(&counters.lost, kind_of(&lock.lock_key), 1);
            }
            self.end(&hold, Ended::Failed(reason));
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
        match &why {
            // A waiting call's queue place, not a lock: its call learns it at its next attempt.
            _ if hold.is_place() => {
                tracing::debug!(lock = %hold.lock_key, reason = ?why, "queue place lapsed");
            }
            Ended::MaxHold => {
                tracing::info!(lock = %hold.lock_key, "maximum hold time reached: renewal stops");
            }
            Ended::Failed(error) => {
                tracing::warn!(lock = %hold.lock_key, %error, "renewal failed: watchdog stopped renewing, lock lost");
            }
            _ => {
                tracing::warn!(lock = %hold.lock_key, reason = ?why, "watchdog stopped renewing: lock lost");
            }
        }
        hold.lease.update(|lease| lease.ended = Some(why));
        self.ended.notify_waiters();
    }
}

/// The watchdog task of one client. Renewal calls run as child tasks so that a node that
/// stops answering delays only its own locks; they end with this task.
async fn run(watchdog: Arc<Watchdog>) {
    let nodes = Arc::new(tokio::sync::RwLock::new(SlotMap::default()));
    let mut calls = tokio::task::JoinSet::new();
    // Slept (or is about to) with nothing to renew: ends at the next wake if still so.
    let mut idle = false;
    loop {
        if idle && calls.is_empty() && watchdog.schedule.retire_if_idle() {
            return;
        }
        let now = Instant::now();
        let (due, next) = watchdog.schedule.take_due(now);
        idle = next.is_none() && due.is_empty();
        if !due.is_empty() {
            if watchdog.transport.topology() == Topology::Cluster && nodes.read().await.is_empty() {
                SlotMap::refresh(&nodes, &watchdog.transport).await;
            }
            // By node and lane: a renewal is queued on its first lock's lane, and must keep its
            // order with every call of each lock it renews (an extend queued after it).
            let mut groups: HashMap<(usize, usize, &str), Vec<Due>> = HashMap::new();
            {
                let map = nodes.read().await;
                for lock in due {
                    let lane = watchdog.transport.lane(lock.slot);
                    let group = (map.node_of(lock.slot), lane, lock.renew.name());
                    groups.entry(group).or_default().push(lock);
                }
            }
            for (_, group) in groups {
                let mut group = group.into_iter().peekable();
                while let Some(first) = group.next() {
                    let mut weight = first.weight;
                    let mut chunk = vec![first];
                    while let Some(next) =
                        group.next_if(|due| weight.saturating_add(due.weight) <= BATCH)
                    {
                        weight = weight.saturating_add(next.weight);
                        chunk.push(next);
                    }
                    calls.spawn(renew(Arc::clone(&watchdog), Arc::clone(&nodes), chunk));
                }
            }
            continue;
        }
        let sleep_until = next.unwrap_or(now + LINGER);
        tokio::select! {
            () = tokio::time::sleep_until(sleep_until) => {}
            () = watchdog.schedule.wake.notified() => {}
            Some(_) = calls.join_next(), if !calls.is_empty() => {}
        }
    }
}

/// Renews the locks of one node with one call; when it fails, reads the slot map again and
/// renews them one by one (see the module documentation for what a failure leads to).
async fn renew(watchdog: Arc<Watchdog>, nodes: Arc<tokio::sync::RwLock<SlotMap>>, chunk: Vec<Due>) {
    let error = match renew_group(&watchdog, &chunk).await {
        Ok(()) => return,
        Err(error) => error,
    };
    if chunk.len() == 1 {
        // The call was that lock's own.
        settle_failure(&watchdog, &chunk, &error);
        return;
    }
    if error.is_transient() && watchdog.transport.topology() != Topology::Cluster {
        // The only node is down or refusing writes: each lock alone would fail the same way.
        watchdog.schedule.retry(&chunk, Instant::now());
        return;
    }
    SlotMap::refresh(&nodes, &watchdog.transport).await;
    let mut transient_in_row = 0;
    let mut rest = chunk.into_iter();
    while let Some(lock) = rest.next() {
        let one = [lock];
        let Err(error) = renew_group(&watchdog, &one).await else {
            transient_in_row = 0;
            continue;
        };
        settle_failure(&watchdog, &one, &error);
        if !error.is_transient() {
            transient_in_row = 0;
            continue;
        }
        transient_in_row += 1;
        if transient_in_row >= NODE_DOWN_AFTER {
            // Most likely the node is down: try the rest again after their back-off rather
            // than waiting out one timeout per lock.
            watchdog
                .schedule
                .retry(&rest.collect::<Vec<_>>(), Instant::now());
            return;
        }
    }
}

/// Deals with the failed renewal call of one lock (`due` holds one): a transient error is
/// retried after the back-off; any other ends the hold.
fn settle_failure(watchdog: &Watchdog, due: &[Due], error: &Error) {
    match due {
        [lock] if !error.is_transient() => {
            watchdog.schedule.failed(&watchdog.counters, lock, error);
        }
        _ => watchdog.schedule.retry(due, Instant::now()),
    }
}

/// One renewal call for locks on one node, applied to their holds; the error when it failed
/// as a whole.
async fn renew_group(watchdog: &Watchdog, due: &[Due]) -> Result<(), Error> {
    let Some(first) = due.first() else {
        return Ok(());
    };
    let mut args: Vec<&str> = Vec::with_capacity(due.len() * 3);
    for lock in due {
        args.extend([&*lock.lock_key, &*lock.owner, lock.ttl_ms.as_str()]);
    }
    args.push(&watchdog.expiry);
    let sent = Instant::now();
    Counters::add(
        &watchdog.counters.renewal_calls,
        kind_of(&first.lock_key),
        1,
    );
    let mut call = ScriptCall::new(first.renew, &[&first.lock_key], &args);
    if watchdog.transport.topology() == Topology::Cluster {
        // The module's renewal declares every lock key: a group of one node's slots would be
        // refused (CROSSSLOT). The script reaches them through ARGV.
        call = call.script_only();
    }
    let reply = watchdog
        .transport
        .run(&call, &first.lock_key, Operation::Renew)
        .await
        .and_then(|reply| parse_reply::<Vec<i64>>(&first.lock_key, Operation::Renew, reply));
    match reply {
        Ok(codes) if codes.len() == due.len() => {
            tracing::debug!(locks = due.len(), "renewed");
            watchdog
                .schedule
                .apply(&watchdog.counters, due, &codes, sent);
            Ok(())
        }
        Ok(codes) => {
            tracing::warn!(
                sent = due.len(),
                answered = codes.len(),
                "renewal reply of the wrong length"
            );
            Err(Error::UnexpectedReply {
                name: first.lock_key.to_string(),
                operation: Operation::Renew,
                detail: format!("{} codes for {} locks", codes.len(), due.len()),
            })
        }
        Err(err) => {
            tracing::debug!(locks = due.len(), error = %err, "renewal call failed");
            Err(err)
        }
    }
}

/// Which node serves each slot (the transport's map), read through the transport; empty (one
/// group) for a standalone server or when the map cannot be read.
#[derive(Default)]
struct SlotMap(crate::transport::SlotMap);

impl SlotMap {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn node_of(&self, slot: u16) -> usize {
        self.0.node_of(slot).unwrap_or(0)
    }

    /// Reads the map again into `nodes`, taking its write lock only to store what was read: a
    /// read that waits on a node that stops answering must not hold up the renewals of other
    /// nodes' locks, which read the map.
    async fn refresh(nodes: &tokio::sync::RwLock<SlotMap>, transport: &Transport) {
        if transport.topology() != Topology::Cluster {
            return;
        }
        let fresh = match transport.cluster_slots().await {
            Ok(reply) => crate::transport::SlotMap::parse(&reply),
            Err(err) => {
                tracing::debug!(error = %err, "cannot read the slot map: renewing lock by lock");
                crate::transport::SlotMap::default()
            }
        };
        nodes.write().await.0 = fresh;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_back_off_doubles_up_to_a_quarter_period_and_stops_at_the_lease_end() {
        let now = Instant::now();
        let every = Duration::from_secs(10);
        let far = now + Duration::from_secs(60);
        let delays: Vec<Duration> = (1..=8)
            .map(|n| retry_at(now, n, every, far) - now)
            .collect();
        let expected = [100, 200, 400, 800, 1600, 2500, 2500, 2500];
        assert_eq!(delays, expected.map(|ms| ms * MS));
        assert_eq!(retry_at(now, u32::MAX, every, far) - now, 2500 * MS);
        // A short period caps the first retry too; the lease end caps everything.
        assert_eq!(retry_at(now, 1, 300 * MS, far) - now, 75 * MS);
        assert_eq!(retry_at(now, 1, Duration::from_micros(1), far) - now, MS);
        assert_eq!(retry_at(now, 5, every, now + 30 * MS), now + 30 * MS);
    }

    /// A watchdog with one hold (TTL 3 s, period 1 s) taken at `start`; returns its id.
    fn one_hold(start: Instant) -> (Schedule, u64, SharedLease) {
        let watchdog = Schedule::default();
        let lease = SharedLease::new(Lease {
            valid_until: start + Duration::from_secs(3),
            ended: None,
        });
        let hold = Hold {
            lock_key: "fencelock:{a}:lock".into(),
            owner: "me".into(),
            slot: 0,
            weight: 1,
            renew: &crate::script::RENEW,
            ttl: Duration::from_secs(3),
            every: Duration::from_secs(1),
            hold_until: None,
            renew_at: start + Duration::from_secs(1),
            early: true,
            failures: 0,
            in_flight: false,
            in_flight_until: start,
            generation: 0,
            lease: lease.clone(),
        };
        watchdog.state().holds.insert(7, hold);
        (watchdog, 7, lease)
    }

    #[test]
    fn failing_renewals_are_retried_a_few_times_until_the_lease_ends_unconfirmed() {
        let start = Instant::now();
        let (watchdog, _, lease) = one_hold(start);
        let mut now = start + Duration::from_secs(1);
        let mut tries = Vec::new();
        loop {
            let (due, next) = watchdog.take_due(now);
            if due.is_empty() {
                match next {
                    Some(next) => {
                        assert!(next > now, "a retry is never due in the past");
                        now = next;
                        continue;
                    }
                    None => break,
                }
            }
            tries.push(now - start);
            watchdog.retry(&due, now);
        }
        let tries: Vec<u128> = tries.iter().map(Duration::as_millis).collect();
        assert_eq!(
            tries,
            [1000, 1100, 1300, 1550, 1800, 2050, 2300, 2550, 2800]
        );
        assert_eq!(
            now,
            start + Duration::from_secs(3),
            "ended at the lease end"
        );
        assert_eq!(lease.get().ended, Some(Ended::Unconfirmed));
        assert!(watchdog.state().holds.is_empty());
    }

    #[test]
    fn a_success_resets_the_back_off() {
        let start = Instant::now();
        let (watchdog, id, lease) = one_hold(start);
        let counters = Counters::default();
        let mut now = start + Duration::from_secs(1);
        for _ in 0..3 {
            let (due, _) = watchdog.take_due(now);
            watchdog.retry(&due, now);
            now = watchdog.state().holds[&id].renew_at;
        }
        let (due, _) = watchdog.take_due(now);
        assert_eq!(due.len(), 1);
        watchdog.apply(&counters, &due, &[1], now);
        assert_eq!(lease.get().valid_until, now + 3000 * MS - 32 * MS);
        let (due, next) = watchdog.take_due(now);
        assert!(due.is_empty());
        assert_eq!(next, Some(now + Duration::from_secs(1)));
        let (due, _) = watchdog.take_due(now + Duration::from_secs(1));
        watchdog.retry(&due, now + Duration::from_secs(1));
        let renew_at = watchdog.state().holds[&id].renew_at;
        assert_eq!(renew_at, now + Duration::from_secs(1) + FIRST_RETRY);
    }

    #[test]
    fn a_renewal_comes_after_its_period_but_well_before_the_lease_ends() {
        let from = Instant::now();
        let lease = from + 2970 * MS;
        // The default period (a third of the TTL) is unchanged.
        assert_eq!(renew_time(from, 1000 * MS, lease), from + 1000 * MS);
        // A period close to the TTL (accepted: it is below it) renews at three quarters.
        let late = renew_time(from, 2990 * MS, lease);
        assert!(
            late < lease && late - from <= 2228 * MS,
            "{:?}",
            late - from
        );
        assert_eq!(renew_time(from, 1000 * MS, from), from);
    }

    #[test]
    fn a_renewal_in_flight_across_an_extension_leaves_the_earlier_lease_end() {
        let start = Instant::now();
        let (watchdog, id, lease) = one_hold(start);
        let counters = Counters::default();
        let sent = start + Duration::from_secs(1);
        // A renewal for 3 s goes out; the guard then extends to 500 ms. Redis may run the
        // extension first: its lease is then the renewal's.
        let (due, _) = watchdog.take_due(sent);
        assert_eq!(due.len(), 1);
        let extended = sent + 480 * MS;
        watchdog.extended(id, 500 * MS, 160 * MS, extended);
        assert_eq!(lease.get().valid_until, extended);
        // The renewal's reply must not move the lease end past the extension's.
        watchdog.apply(&counters, &due, &[1], sent);
        assert_eq!(lease.get().valid_until, extended);
        assert!(lease.get().ended.is_none());
        // An extension to longer while a renewal is in flight counts on the renewal's end.
        let renew_at = watchdog.state().holds[&id].renew_at;
        let (due, _) = watchdog.take_due(renew_at);
        let taken = watchdog.state().holds[&id].in_flight_until;
        watchdog.extended(
            id,
            Duration::from_secs(60),
            Duration::from_secs(20),
            sent + Duration::from_secs(59),
        );
        assert_eq!(lease.get().valid_until, taken);
        // Its reply, a TTL shorter than the hold's (60 s) now, is not the maximum hold time.
        watchdog.apply(&counters, &due, &[1], sent);
        assert!(lease.get().ended.is_none(), "{:?}", lease.get().ended);
        assert!(watchdog.state().holds.contains_key(&id));
    }

    #[test]
    fn only_a_renewal_cut_at_the_maximum_hold_time_is_the_last() {
        let start = Instant::now();
        let (watchdog, id, lease) = one_hold(start);
        let counters = Counters::default();
        watchdog.state().holds.get_mut(&id).unwrap().hold_until = Some(start + 2500 * MS);
        let now = start + Duration::from_secs(1);
        let (due, _) = watchdog.take_due(now);
        assert!(due[0].capped);
        watchdog.apply(&counters, &due, &[1], now);
        assert_eq!(lease.get().ended, Some(Ended::MaxHold));
        assert!(watchdog.state().holds.is_empty());
    }

    #[test]
    fn a_lapsed_queue_place_is_not_a_lost_lock() {
        let start = Instant::now();
        let (watchdog, id, lease) = one_hold(start);
        watchdog.state().holds.get_mut(&id).unwrap().renew =
            std::sync::LazyLock::force(&crate::script::FAIR_RENEW_PLACE);
        let counters = Counters::default();
        let now = start + Duration::from_secs(1);
        let (due, _) = watchdog.take_due(now);
        watchdog.apply(&counters, &due, &[0], now);
        assert_eq!(lease.get().ended, Some(Ended::Expired));
        assert_eq!(counters.lost.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    #[test]
    fn a_failure_that_retrying_does_not_cure_ends_the_hold() {
        let start = Instant::now();
        let (watchdog, _, lease) = one_hold(start);
        let counters = Counters::default();
        let (due, _) = watchdog.take_due(start + Duration::from_secs(1));
        let error = Error::UnexpectedReply {
            name: "fencelock:{a}:lock".into(),
            operation: Operation::Renew,
            detail: "status 7".into(),
        };
        watchdog.failed(&counters, &due[0], &error);
        assert!(watchdog.state().holds.is_empty());
        assert_eq!(counters.lost.load(std::sync::atomic::Ordering::Relaxed), 1);
        let ended = lease.get().ended.expect("ended");
        let lost = ended.into_error("a", None);
        assert!(lost.is_lock_lost());
        assert!(
            matches!(&lost, Error::RenewalFailed { name, reason } if name == "a" && reason.contains("status 7")),
            "{lost}"
        );
    }
}
