//! Per-node auto-batching: concurrent calls of a batchable script (acquire, release, extend …)
//! whose keys live on the same node are sent as one call of the script's batch twin
//! (`script/lua/batch.lua`), each caller getting its own reply.
//!
//! Driver tasks take what callers queued and send it as one round; while a round is in flight
//! the next callers queue up: there is no timer, so a lone call goes out at once, and batches
//! grow only with the load. Each node has one driver per lane, as many lanes as the runtime has
//! worker threads (at most [`MAX_LANES`]): a lone driver was the client's bottleneck, doing every
//! call's work on one thread while the other waited. A key's lane is its slot modulo the lanes,
//! so the calls of one lock (its keys share a hash tag) all go through one driver, and what
//! follows says of a node's driver holds per lane. A driver keeps up to eight rounds in flight
//! and hands each round's calls to the connection before the next round's; within a round a
//! script's calls go as one batch, but none is pulled ahead of an earlier call of its slot
//! ([`split_group`]). So Redis runs the calls of one slot (all of one lock's) in the order they
//! were queued (an attempt woken by a release of this client runs after the release); calls of
//! different slots in one round may run in another order. A caller dropped before its call was
//! sent is left out of its round. A call that finds its lane quiet (nothing queued, in flight or sent directly; for a
//! call the module serves on a cluster node, its slot's bucket of the lane) skips the driver
//! and goes out from its caller (`direct.rs`), keeping that order.
//!
//! Undos are the exception. A call that this module resends alone after `NOSCRIPT` or a moved
//! key may run after later rounds (a server that lost its scripts answers `NOSCRIPT` to one
//! script while it already runs another that a later round carries), so a cancelled call's
//! undo waits for the rounds in flight when it was taken from the queue and for the direct
//! calls of its slot's bucket (of its lane, on a standalone server), resends included, and goes
//! out after them, while the driver goes on sending what queues meanwhile: it does not overtake
//! the call it undoes when both went through this lane. (An undo can still overtake a call sent
//! another way: on a WAIT lane, with no slot map, before a slot-map change sent the undo to
//! another driver, by the last round of a driver that ended idle just then, or on a connection
//! since rebuilt; the hold then lasts until its lease ends.)
//!
//! A key of a slot its node no longer serves fails alone inside the batch, before any write
//! (`batch.lua` runs each key under `pcall`): that call is sent on its own, following
//! `MOVED`/`ASK` like any other, and the slot map is read again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::task::Poll;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisError, Value};
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Operation, Result};
use crate::script::{LuaScript, ScriptCall};

use super::direct::{BusyTicket, LaneState};
use super::eval::eval_raw;
use super::module::Verdict;
use super::{classify, Topology, Transport};

/// The most calls one batch carries, by weight (a batch runs as one script: this bounds how
/// long it blocks the server, ≈ 10 µs per mutex call; a semaphore call weighs more, see
/// [`ScriptCall::weighted`]). A call that weighs more than this alone goes alone.
const MAX_BATCH: u32 = 64;

/// A driver with nothing to send for this long ends (the next call starts another).
const IDLE: Duration = Duration::from_millis(500);

/// Rounds a driver has in flight at most. Enough that Redis has the next rounds queued while the
/// client hands out one round's replies (with two, a client on one worker thread and its server
/// each sat idle about a third of the time, 64 tasks); a round still carries every call that
/// was ready when it was made, as the driver lets the runtime run what is ready first
/// ([`drive`]).
const IN_FLIGHT: usize = 8;

/// The most lanes (drivers) per node.
const MAX_LANES: usize = 8;

/// One queued call and where its reply goes.
pub(super) struct Entry {
    call: ScriptCall,
    name: String,
    operation: Operation,
    reply: oneshot::Sender<Result<Value>>,
    /// Sent only after every round in flight is answered (an undo, see the module docs).
    after_in_flight: bool,
    /// Keeps the lane busy (no direct call, `direct.rs`) until the call is answered.
    busy: BusyTicket,
}

/// One lane of a node: its driver while one runs, and what the lane has unanswered (queued on
/// the driver, in flight, or sent directly: `direct.rs`), which outlives the driver.
struct Lane {
    driver: Option<mpsc::UnboundedSender<Entry>>,
    state: Arc<LaneState>,
}

/// The drivers of one client, [`Batcher::lanes`] per node, and the slot map that says which
/// node a key is on.
pub(super) struct Batcher {
    enabled: bool,
    topology: Topology,
    /// Node index (1-based, as [`SlotMap`] numbers them; 0 on a standalone server) × lanes +
    /// lane → that lane's driver and what it has unanswered.
    drivers: RwLock<Vec<Lane>>,
    /// Drivers per node: the runtime's worker threads when the client was built, 1 to
    /// [`MAX_LANES`].
    lanes: usize,
    slots: RwLock<SlotMap>,
    refreshing: AtomicBool,
    /// Batch calls sent (two or more callers each) and the callers they carried.
    pub(super) batches: AtomicU64,
    pub(super) batched_calls: AtomicU64,
}

impl Batcher {
    pub(super) fn new(enabled: bool, topology: Topology) -> Self {
        Self {
            enabled,
            topology,
            drivers: RwLock::new(Vec::new()),
            lanes: tokio::runtime::Handle::try_current()
                .map_or(1, |runtime| runtime.metrics().num_workers())
                .clamp(1, MAX_LANES),
            slots: RwLock::new(SlotMap::default()),
            refreshing: AtomicBool::new(false),
            batches: AtomicU64::new(0),
            batched_calls: AtomicU64::new(0),
        }
    }

    /// The node whose driver sends `call`, or `None` to send it directly (batching off, a call
    /// of several keys, no slot map yet: one is then read in the background).
    ///
    /// Every one-key call goes through its node's driver, also the calls of scripts without
    /// a batch twin (sent alone), so a call queued after another for the same key is sent
    /// after it whatever their scripts (and a cancelled call's undo after its resends, see the
    /// module docs).
    pub(super) fn node(&self, transport: &Arc<Transport>, call: &ScriptCall) -> Option<usize> {
        if !self.enabled || !call.has_one_key() {
            return None;
        }
        self.node_index(transport, call)
    }

    /// The index of the node serving `call`'s key (0 on a standalone server), whether or not
    /// batching is on, or `None` when unknown (no slot map yet: one is then read).
    pub(super) fn node_index(
        &self,
        transport: &Arc<Transport>,
        call: &ScriptCall,
    ) -> Option<usize> {
        match self.topology {
            Topology::Standalone => Some(0),
            Topology::Cluster => {
                let node = self
                    .slots
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .node_of(call.slot());
                if node.is_none() {
                    self.refresh(transport);
                }
                node
            }
        }
    }

    /// Queues `entry` on the driver of `node` and of its key's lane (whose state is `lane`),
    /// starting it if needed; gives the entry back when the call must be sent alone.
    // The entry (its command inline) is given back by value on the rare path: boxing it would
    // cost an allocation on every call.
    #[allow(clippy::result_large_err)]
    pub(super) fn queue(
        &self,
        transport: &Arc<Transport>,
        node: usize,
        lane: &Arc<LaneState>,
        entry: Entry,
    ) -> std::result::Result<(), Entry> {
        let node = node * self.lanes + self.lane(entry.call.slot());
        let queued = {
            let drivers = self.drivers.read().unwrap_or_else(PoisonError::into_inner);
            match drivers.get(node).and_then(|at| at.driver.as_ref()) {
                Some(driver) => driver.send(entry).map_err(|e| e.0),
                None => Err(entry),
            }
        };
        let Err(entry) = queued else { return Ok(()) };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(entry);
        };
        let mut drivers = self.drivers.write().unwrap_or_else(PoisonError::into_inner);
        if drivers.len() <= node {
            drivers.resize_with(node + 1, || self.new_lane());
        }
        let driver = match &drivers[node].driver {
            Some(driver) if !driver.is_closed() => driver.clone(),
            _ => {
                let (driver, queue) = mpsc::unbounded_channel();
                runtime.spawn(drive(Arc::downgrade(transport), queue, Arc::clone(lane)));
                drivers[node].driver = Some(driver.clone());
                driver
            }
        };
        driver.send(entry).map_err(|e| e.0)
    }

    /// What the lane of `node` for keys of slot `slot` has unanswered.
    pub(super) fn lane_state(&self, node: usize, slot: u16) -> Arc<LaneState> {
        let index = node * self.lanes + self.lane(slot);
        if let Some(lane) = self
            .drivers
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(index)
        {
            return Arc::clone(&lane.state);
        }
        let mut drivers = self.drivers.write().unwrap_or_else(PoisonError::into_inner);
        if drivers.len() <= index {
            drivers.resize_with(index + 1, || self.new_lane());
        }
        Arc::clone(&drivers[index].state)
    }

    /// The lane of a key of slot `slot`: which of its node's drivers sends its calls.
    pub(super) fn lane(&self, slot: u16) -> usize {
        usize::from(slot) % self.lanes
    }

    /// The bucket of slot `slot` within its lane (see `direct.rs`).
    pub(super) fn bucket(&self, slot: u16) -> usize {
        usize::from(slot) / self.lanes
    }

    /// Whether a call of a quiet bucket goes past a busy lane's driver: a call the module
    /// serves on a cluster node (`direct.rs`).
    pub(super) fn per_bucket(&self) -> bool {
        self.topology == Topology::Cluster
    }

    fn new_lane(&self) -> Lane {
        Lane {
            driver: None,
            state: Arc::new(LaneState::new(self.per_bucket())),
        }
    }

    /// Counts a batch call that carried `calls` calls.
    fn count(&self, calls: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.batched_calls
            .fetch_add(calls as u64, Ordering::Relaxed);
    }

    /// Reads the slot map again in the background (one read at a time); a map that cannot
    /// be read leaves the one read before.
    pub(super) fn refresh(&self, transport: &Arc<Transport>) {
        if self.topology != Topology::Cluster || self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.refreshing.store(false, Ordering::Release);
            return;
        };
        let transport = Arc::clone(transport);
        runtime.spawn(async move {
            let batcher = &transport.batcher;
            match transport.cluster_slots().await {
                Ok(reply) => {
                    let map = SlotMap::parse(&reply);
                    *batcher
                        .slots
                        .write()
                        .unwrap_or_else(PoisonError::into_inner) = map;
                    transport.modules.forget();
                }
                Err(err) => {
                    tracing::debug!(error = %err, "cannot read the slot map: the last one stays");
                }
            }
            batcher.refreshing.store(false, Ordering::Release);
        });
    }
}

impl Entry {
    pub(super) fn new(
        call: ScriptCall,
        name: &str,
        operation: Operation,
        after_in_flight: bool,
        busy: BusyTicket,
    ) -> (Self, oneshot::Receiver<Result<Value>>) {
        let (reply, receiver) = oneshot::channel();
        let entry = Self {
            call,
            name: name.to_owned(),
            operation,
            reply,
            after_in_flight,
            busy,
        };
        (entry, receiver)
    }

    /// The call, for sending it on its own after all.
    pub(super) fn into_call(self) -> ScriptCall {
        self.call
    }

    fn answer(self, outcome: Result<Value>) {
        // Not busy before the caller hears back: its next call may go direct.
        drop(self.busy);
        let _ = self.reply.send(outcome);
    }
}

/// A round of calls in flight: the batch calls and lone calls of one take from the queue.
type Round = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A node's driver: takes every queued call and sends it as one round (one batch call per
/// script, lone calls alone), up to [`IN_FLIGHT`] rounds at a time; what queues meanwhile goes
/// in the next round. Before it takes the queue's calls for a round, the driver yields once, so
/// the tasks the runtime has ready (those the last round's replies woke, which queue their next
/// calls at once) queue theirs first: without it, the driver, woken by the first of them, ran
/// before the others and sent rounds of one call whenever it had room for another round in
/// flight. Each round is polled once as soon as it is made, which hands its calls
/// to the connection before any later round's: Redis runs a slot's calls in queue order, undos
/// aside (they follow the rounds in flight when they were taken, see the module docs). Ends
/// with its queue (the client dropped), its transport, or after [`IDLE`] with no call taken and
/// no round in flight.
async fn drive(
    transport: Weak<Transport>,
    mut queue: mpsc::UnboundedReceiver<Entry>,
    lane: Arc<LaneState>,
) {
    let mut in_flight: Vec<Round> = Vec::new();
    // One timer for the driver's life, moved on only when it fires before the driver has been
    // idle for [`IDLE`]: a timer per wait would cost a registration with the runtime per call
    // wherever calls come one at a time (a lone task, a hot lock's waiter).
    let mut idle = std::pin::pin!(tokio::time::sleep(IDLE));
    // When a call was last taken or a round last ended.
    let mut last_call = tokio::time::Instant::now();
    loop {
        let mut pending = Vec::new();
        if in_flight.is_empty() {
            let waited = tokio::select! {
                biased;
                entry = queue.recv() => Ok(entry),
                () = idle.as_mut() => Err(()),
            };
            if waited.is_err() && last_call.elapsed() < IDLE {
                idle.as_mut().reset(last_call + IDLE);
                continue;
            }
            match waited {
                Ok(Some(first)) => pending.push(first),
                Ok(None) => return,
                Err(()) => {
                    // Idle: no new call can queue after `close`; what did is still sent.
                    queue.close();
                    while let Ok(entry) = queue.try_recv() {
                        pending.push(entry);
                    }
                    if pending.is_empty() {
                        return;
                    }
                }
            }
        } else if in_flight.len() < IN_FLIGHT {
            tokio::select! {
                biased;
                () = any_done(&mut in_flight) => {
                    last_call = tokio::time::Instant::now();
                    continue;
                }
                entry = queue.recv() => match entry {
                    Some(entry) => pending.push(entry),
                    None => {
                        join_all(std::mem::take(&mut in_flight)).await;
                        return;
                    }
                },
            }
        } else {
            any_done(&mut in_flight).await;
            last_call = tokio::time::Instant::now();
            continue;
        }
        tokio::task::yield_now().await;
        while let Ok(entry) = queue.try_recv() {
            pending.push(entry);
        }
        last_call = tokio::time::Instant::now();
        let Some(transport) = transport.upgrade() else {
            return;
        };
        pending.retain(|entry| entry.after_in_flight || !entry.reply.is_closed());
        let (undos, calls): (Vec<Entry>, Vec<Entry>) =
            if pending.iter().any(|entry| entry.after_in_flight) {
                pending.into_iter().partition(|entry| entry.after_in_flight)
            } else {
                (Vec::new(), pending)
            };
        if !undos.is_empty() {
            // One round in flight that finishes the earlier rounds and the direct calls of
            // the undos' buckets, then sends the undos.
            let before = join_all(std::mem::take(&mut in_flight));
            let buckets = undos.iter().map(|undo| undo.busy.bucket()).collect();
            let directs = Arc::clone(&lane).directs_answered(buckets);
            let undos = join_all(sends(&transport, undos));
            in_flight.push(Box::pin(async move {
                before.await;
                directs.await;
                undos.await;
            }));
        }
        start(&transport, calls, &mut in_flight).await;
    }
}

/// Starts a round of `entries`: polls it once, which hands its calls to the connection, and
/// keeps it in `in_flight` while it waits for replies.
async fn start(transport: &Arc<Transport>, entries: Vec<Entry>, in_flight: &mut Vec<Round>) {
    if entries.is_empty() {
        return;
    }
    let mut sends = sends(transport, entries);
    let mut round: Round = match sends.pop() {
        Some(alone) if sends.is_empty() => alone,
        Some(last) => {
            sends.push(last);
            Box::pin(join_all(sends))
        }
        None => return,
    };
    if std::future::poll_fn(|cx| Poll::Ready(round.as_mut().poll(cx)))
        .await
        .is_pending()
    {
        in_flight.push(round);
    }
}

/// The sends of one round: one batch per script (chunks of at most [`MAX_BATCH`] weight), lone
/// calls alone; calls the module serves on this node each alone, as its command (the
/// connection pipelines them). A call is never grouped ahead of an earlier call of its slot
/// ([`split_group`]), so the sends, handed to the connection in order, keep each slot's order.
fn sends(transport: &Arc<Transport>, mut pending: Vec<Entry>) -> Vec<Round> {
    let mut sends: Vec<Round> = Vec::new();
    while !pending.is_empty() {
        let first = &pending[0].call;
        let module = transport
            .modules
            .serves(first, transport.batcher.node_index(transport, first));
        if pending.len() == 1 {
            // The common lone call: the round's vector goes on as it is.
            let transport = Arc::clone(transport);
            let alone: Round = if module {
                Box::pin(send_module(transport, pending))
            } else {
                Box::pin(send(transport, pending))
            };
            sends.push(alone);
            break;
        }
        if module {
            let (group, rest) =
                split_group(std::mem::take(&mut pending), entry_slot, |head, entry| {
                    head.call.same_module(&entry.call)
                });
            pending = rest;
            for chunk in module_chunks(transport.topology(), group) {
                sends.push(Box::pin(send_module(Arc::clone(transport), chunk)));
            }
            continue;
        }
        let Some(script) = pending[0].call.batch_script() else {
            let alone = pending.remove(0);
            sends.push(Box::pin(send(Arc::clone(transport), vec![alone])));
            continue;
        };
        let (same, rest) = split_group(std::mem::take(&mut pending), entry_slot, |_, entry| {
            same_script(entry.call.batch_script(), script)
        });
        pending = rest;
        let mut same = same.into_iter().peekable();
        while let Some(first) = same.next() {
            let mut weight = first.call.weight();
            let mut chunk = vec![first];
            while let Some(next) =
                same.next_if(|entry| weight.saturating_add(entry.call.weight()) <= MAX_BATCH)
            {
                weight = weight.saturating_add(next.call.weight());
                chunk.push(next);
            }
            sends.push(Box::pin(send(Arc::clone(transport), chunk)));
        }
    }
    sends
}

/// Splits a round's `pending` calls (at least one) into the group sent with the first (the
/// first, and each later call `joins` picks given the first) and the rest, each in order,
/// without pulling a call into the group past an earlier call of its slot that stays in the
/// rest: the calls of one slot keep their order within a round (an acquire woken by a release
/// queued before it is sent after that release, though another lock's acquire came first and
/// the acquires go as one batch). A call whose `slot` is `None` may reach keys of other slots
/// (a watchdog's renewal names its locks in its arguments): no later call is pulled past it.
///
/// No allocation beyond the two vectors: the slots left in the rest are summed up in a 64-bit
/// filter, and the rest is searched only for a call whose slot's bit is set.
fn split_group<T>(
    pending: Vec<T>,
    slot: impl Fn(&T) -> Option<u16>,
    joins: impl Fn(&T, &T) -> bool,
) -> (Vec<T>, Vec<T>) {
    let mut entries = pending.into_iter();
    let Some(head) = entries.next() else {
        return (Vec::new(), Vec::new());
    };
    let mut group = Vec::with_capacity(entries.len() + 1);
    group.push(head);
    let mut rest = Vec::new();
    // Bit `slot % 64` is set when a call of such a slot was left in `rest`; all of them when a
    // call that may reach any slot was.
    let mut left: u64 = 0;
    for entry in entries {
        let (at, bit) = match slot(&entry) {
            Some(at) => (Some(at), 1u64 << (at % 64)),
            None => (None, u64::MAX),
        };
        let blocked =
            left == u64::MAX || (left & bit != 0 && rest.iter().any(|earlier| slot(earlier) == at));
        if !blocked && joins(&group[0], &entry) {
            group.push(entry);
        } else {
            left |= bit;
            rest.push(entry);
        }
    }
    (group, rest)
}

/// The slot of an entry's call for [`split_group`], `None` for a call without a batch script,
/// which may reach keys of other slots through its arguments (a watchdog's renewal).
fn entry_slot(entry: &Entry) -> Option<u16> {
    entry.call.batch_script().map(|_| entry.call.slot())
}

/// The most calls one batched module command carries (the module refuses more).
const MODULE_BATCH: usize = 64;

/// `entries` (calls of one module command) in chunks of one slot each on a cluster (a batched
/// module command declares every key: Redis refuses keys of several slots), at most
/// [`MODULE_BATCH`] each, in order within each slot.
fn module_chunks(topology: Topology, entries: Vec<Entry>) -> Vec<Vec<Entry>> {
    let mut chunks: Vec<(u16, Vec<Entry>)> = Vec::new();
    for entry in entries {
        let slot = match topology {
            Topology::Cluster => entry.call.slot(),
            Topology::Standalone => 0,
        };
        match chunks
            .iter_mut()
            .rev()
            .find(|(s, chunk)| *s == slot && chunk.len() < MODULE_BATCH)
        {
            Some((_, chunk)) => chunk.push(entry),
            None => chunks.push((slot, vec![entry])),
        }
    }
    chunks.into_iter().map(|(_, chunk)| chunk).collect()
}

/// Sends `entries` (calls of one module command, keys of one slot on a cluster) as one call of
/// the module's batched command, or alone when there is one, and answers each; a call the
/// module declines (`-FALLBACK`) goes again as its script, alone. A node that does not know
/// the command (no module, or an older one) sends them all as scripts.
async fn send_module(transport: Arc<Transport>, entries: Vec<Entry>) {
    let node = transport.batcher.node_index(&transport, &entries[0].call);
    let batch_name = entries[0].call.module_batch_name();
    let batch = if entries.len() > 1
        && batch_name.is_some_and(|name| transport.modules.batches(node, name))
    {
        ScriptCall::module_batch_of(entries.iter().map(|entry| &entry.call))
    } else {
        None
    };
    let Some(cmd) = batch else {
        if let [_] = entries.as_slice() {
            if let Some(entry) = entries.into_iter().next() {
                let outcome = transport
                    .run_alone(&entry.call, &entry.name, entry.operation)
                    .await;
                entry.answer(outcome);
            }
            return;
        }
        // One command each, all handed to the connection at once (in order), which pipelines
        // them.
        let alone = entries.into_iter().map(|entry| {
            let transport = Arc::clone(&transport);
            Box::pin(async move {
                let outcome = transport
                    .run_alone(&entry.call, &entry.name, entry.operation)
                    .await;
                entry.answer(outcome);
            }) as Round
        });
        join_all(alone.collect()).await;
        return;
    };
    let mut conn = transport.connection();
    let outcome =
        tokio::time::timeout(transport.request_timeout, conn.req_packed_command(&cmd)).await;
    let replies = match outcome {
        Ok(Ok(Value::Array(replies))) if replies.len() == entries.len() => replies,
        Ok(Ok(Value::ServerError(error))) => {
            return whole_refused(&transport, entries, RedisError::from(error), node).await;
        }
        Ok(Err(error)) => return whole_refused(&transport, entries, error, node).await,
        Ok(Ok(other)) => return unexpected(entries, "module batch", &other),
        Err(_) => return timed_out(&transport, entries),
    };
    transport.observe::<()>(&Ok(()));
    transport.batcher.count(replies.len());
    let mut declined = Vec::new();
    for (entry, reply) in entries.into_iter().zip(replies) {
        let reply = match reply {
            Value::ServerError(error) => Err(RedisError::from(error)),
            reply => Ok(reply),
        };
        match transport.modules.judge(reply, &entry.call, node) {
            Verdict::Served(outcome) => {
                let outcome = classify(&entry.name, entry.operation, outcome);
                entry.answer(outcome);
            }
            Verdict::Script => declined.push(entry),
            Verdict::Missing => {
                let error = missing(&entry);
                entry.answer(Err(error));
            }
        }
    }
    for entry in declined {
        let outcome = transport
            .run_script(&entry.call, &entry.name, entry.operation)
            .await;
        entry.answer(outcome);
    }
}

/// The module's batched command was refused as a whole: by a node without it (each call
/// then goes alone, as the script), or for another reason (each call gets the error). Each
/// call that then runs as the script counts one module fallback, as a lone call does.
async fn whole_refused(
    transport: &Arc<Transport>,
    entries: Vec<Entry>,
    error: RedisError,
    node: Option<usize>,
) {
    let batch = entries[0].call.module_batch_name().unwrap_or_default();
    if transport.modules.batch_unknown(&error, node, batch) {
        // A module without the batched commands: one command each (no module at all: the
        // first of them finds that out, and counts its fallback; the rest, also sent to the
        // module in the batch, go as scripts and count theirs here).
        for entry in entries {
            let outcome = if transport.modules.serves(&entry.call, node) {
                transport
                    .run_alone(&entry.call, &entry.name, entry.operation)
                    .await
            } else {
                transport.modules.fell_back(1);
                transport
                    .run_script(&entry.call, &entry.name, entry.operation)
                    .await
            };
            entry.answer(outcome);
        }
        return;
    }
    let verdict = transport.modules.judge(Err(error), &entries[0].call, node);
    if !matches!(verdict, Verdict::Served(_)) {
        // `judge` counted the first call's fallback; the batch carried the others too.
        transport.modules.fell_back(entries.len() - 1);
    }
    match verdict {
        Verdict::Served(outcome) => {
            let (name, operation) = (&entries[0].name, entries[0].operation);
            transport.observe::<()>(&classify(name, operation, outcome.clone().map(drop)));
            for entry in entries {
                let outcome = classify(&entry.name, entry.operation, outcome.clone());
                entry.answer(outcome);
            }
        }
        Verdict::Script => {
            for entry in entries {
                let outcome = transport
                    .run_script(&entry.call, &entry.name, entry.operation)
                    .await;
                entry.answer(outcome);
            }
        }
        Verdict::Missing => {
            for entry in entries {
                let error = missing(&entry);
                entry.answer(Err(error));
            }
        }
    }
}

fn missing(entry: &Entry) -> Error {
    Error::ModuleMissing {
        name: entry.name.clone(),
        operation: entry.operation,
    }
}

/// A batch call of `entries` (at least one) was not answered within the request timeout: each
/// call gets the timeout.
fn timed_out(transport: &Arc<Transport>, entries: Vec<Entry>) {
    let after = transport.request_timeout;
    if let Some(first) = entries.first() {
        transport.observe::<()>(&Err(Error::Timeout {
            name: first.name.clone(),
            operation: first.operation,
            after,
        }));
    }
    for entry in entries {
        let error = Error::Timeout {
            name: entry.name.clone(),
            operation: entry.operation,
            after,
        };
        entry.answer(Err(error));
    }
}

/// A batch call (`what`) of `entries` answered `other`, not one reply per call.
fn unexpected(entries: Vec<Entry>, what: &str, other: &Value) {
    let detail = format!("{what} of {} calls answered {other:?}", entries.len());
    for entry in entries {
        let error = Error::UnexpectedReply {
            name: entry.name.clone(),
            operation: entry.operation,
            detail: detail.clone(),
        };
        entry.answer(Err(error));
    }
}

/// Whether two calls have the same batch script.
fn same_script(a: Option<&'static LuaScript>, b: &'static LuaScript) -> bool {
    a.is_some_and(|a| std::ptr::eq(a, b))
}

/// Polls every future until all are done.
async fn join_all(mut futures: Vec<Round>) {
    std::future::poll_fn(|cx| {
        futures.retain_mut(|future| future.as_mut().poll(cx).is_pending());
        if futures.is_empty() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// Polls every future of `rounds` until at least one is done (removed).
async fn any_done(rounds: &mut Vec<Round>) {
    std::future::poll_fn(|cx| {
        let before = rounds.len();
        rounds.retain_mut(|round| round.as_mut().poll(cx).is_pending());
        if rounds.len() < before {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// Sends `entries` (calls of one script, keys on one node): alone when there is one, else as
/// one batch call, and answers each.
async fn send(transport: Arc<Transport>, mut entries: Vec<Entry>) {
    if entries.len() == 1 {
        let entry = entries.remove(0);
        let outcome = transport
            .run_alone(&entry.call, &entry.name, entry.operation)
            .await;
        entry.answer(outcome);
        return;
    }
    let script: &'static LuaScript = entries[0]
        .call
        .batch_script()
        .expect("only batchable calls are queued");
    let batch = ScriptCall::batch_of(script, entries.iter().map(|entry| &entry.call));
    let (name, operation) = (entries[0].name.clone(), entries[0].operation);
    let mut conn = transport.connection();
    let outcome =
        tokio::time::timeout(transport.request_timeout, eval_raw(&mut conn, &batch)).await;
    transport.batcher.count(entries.len());
    let replies = match outcome {
        Ok(Ok(Value::Array(replies))) if replies.len() == entries.len() => replies,
        Ok(Ok(other)) => return unexpected(entries, "batch", &other),
        Ok(Err(source)) => {
            transport.observe::<()>(&classify(&name, operation, Err(source.clone())));
            for entry in entries {
                let outcome = classify(&entry.name, entry.operation, Err(source.clone()));
                entry.answer(outcome);
            }
            return;
        }
        Err(_) => return timed_out(&transport, entries),
    };
    transport.observe::<()>(&Ok(()));
    let mut misrouted = Vec::new();
    for (entry, reply) in entries.into_iter().zip(replies) {
        match reply {
            Value::ServerError(error) => {
                let error = RedisError::from(error);
                if is_misrouted(&error) {
                    misrouted.push(entry);
                } else {
                    let outcome = classify(&entry.name, entry.operation, Err(error));
                    entry.answer(outcome);
                }
            }
            reply => entry.answer(Ok(reply)),
        }
    }
    if !misrouted.is_empty() {
        transport.batcher.refresh(&transport);
        for entry in misrouted {
            let outcome = transport
                .run_alone(&entry.call, &entry.name, entry.operation)
                .await;
            entry.answer(outcome);
        }
    }
}

/// The key of this entry is not served by the node the batch went to (moved, migrating).
fn is_misrouted(error: &RedisError) -> bool {
    matches!(error.code(), Some("MOVED" | "ASK" | "TRYAGAIN"))
        || error.to_string().contains("non local key")
}

/// Which node serves each slot, as an index per node (from 1), from `CLUSTER SLOTS`; empty
/// when unknown.
#[derive(Default)]
pub(crate) struct SlotMap {
    node_of_slot: Vec<u16>,
}

impl SlotMap {
    /// Whether no map was read (a standalone server, or the map cannot be read).
    pub(crate) fn is_empty(&self) -> bool {
        self.node_of_slot.is_empty()
    }

    /// The index of the node serving `slot`, `None` when unknown.
    pub(crate) fn node_of(&self, slot: u16) -> Option<usize> {
        self.node_of_slot
            .get(usize::from(slot))
            .map(|&n| usize::from(n))
            .filter(|&n| n > 0)
    }

    /// Maps each slot to an index of the master serving it, from a `CLUSTER SLOTS` reply.
    pub(crate) fn parse(reply: &Value) -> Self {
        let Some(ranges) = super::slots::ranges(reply) else {
            return Self::default();
        };
        let mut map = vec![0u16; usize::from(crate::keys::SLOT_COUNT)];
        let mut masters = Vec::new();
        for range in ranges {
            let index = masters
                .iter()
                .position(|&m| m == range.master)
                .unwrap_or_else(|| {
                    masters.push(range.master);
                    masters.len() - 1
                });
            // Clamped to the slots there are: a malformed range must not make a long loop.
            let last = i64::from(crate::keys::SLOT_COUNT) - 1;
            for slot in range.start.max(0)..=range.end.min(last) {
                if let Some(entry) = usize::try_from(slot).ok().and_then(|s| map.get_mut(s)) {
                    *entry = u16::try_from(index + 1).unwrap_or(u16::MAX);
                }
            }
        }
        Self { node_of_slot: map }
    }
}

#[cfg(test)]
mod tests {
    use super::split_group;

    /// A call of a round: its script and its slot.
    type Call = (&'static str, u16);

    fn split(pending: &[Call]) -> (Vec<Call>, Vec<Call>) {
        // A "renew" may reach any slot, as a watchdog's renewal.
        split_group(
            pending.to_vec(),
            |call| (call.0 != "renew").then_some(call.1),
            |head, call| head.0 == call.0,
        )
    }

    #[test]
    fn a_call_is_not_grouped_past_an_earlier_call_of_its_slot() {
        // Lock 1's acquire first, then lock 7's release and the acquire it woke: the acquires
        // go as one batch, but lock 7's acquire must not go before lock 7's release.
        let (group, rest) = split(&[("acquire", 1), ("release", 7), ("acquire", 7)]);
        assert_eq!(group, [("acquire", 1)]);
        assert_eq!(rest, [("release", 7), ("acquire", 7)]);
        // The rest splits the same way: the release, then the acquire.
        let (group, rest) = split(&rest);
        assert_eq!(
            (group, rest.clone()),
            (vec![("release", 7)], vec![("acquire", 7)])
        );
    }

    #[test]
    fn calls_of_other_slots_still_join_the_group() {
        // Slot 71 shares slot 7's filter bit (71 % 64 == 7): only a call of slot 7 is held back.
        let (group, rest) = split(&[
            ("acquire", 1),
            ("release", 7),
            ("acquire", 71),
            ("acquire", 7),
            ("acquire", 2),
            ("release", 2),
        ]);
        assert_eq!(group, [("acquire", 1), ("acquire", 71), ("acquire", 2)]);
        assert_eq!(rest, [("release", 7), ("acquire", 7), ("release", 2)]);
    }

    #[test]
    fn no_call_is_grouped_past_a_call_that_may_reach_any_slot() {
        let (group, rest) = split(&[("acquire", 1), ("renew", 5), ("acquire", 9)]);
        assert_eq!(group, [("acquire", 1)]);
        assert_eq!(rest, [("renew", 5), ("acquire", 9)]);
    }

    #[test]
    fn a_lone_call_is_its_own_group() {
        let (group, rest) = split(&[("release", 3)]);
        assert_eq!((group, rest), (vec![("release", 3)], Vec::new()));
    }
}
