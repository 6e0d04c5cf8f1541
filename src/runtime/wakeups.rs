//! Wake-ups on release: waiters subscribe to their lock's channel, the release script publishes
//! to it, and the next waiter tries again at once instead of sleeping.
//!
//! A client keeps one subscription per channel however many tasks wait on it, on a connection of
//! its own. One dispatcher task per client owns that connection and makes the subscriptions
//! match the waiters, one command at a time, so a subscribe and an unsubscribe of the same
//! channel can never overtake each other. It starts when the first waiter registers and stops,
//! closing the connection, once no waiter is left.
//!
//! A channel is the lock key itself, so on a cluster it is a sharded channel in the lock's slot
//! (`SSUBSCRIBE` / `SPUBLISH`), served by the lock's node. After a failover the server drops
//! sharded subscriptions of the moved slots (it pushes `sunsubscribe`) and redis-rs forgets
//! them; the dispatcher subscribes again and wakes the waiters, as it does when a connection
//! drops. Renewing, it first sends a keyed command to the old node, whose `MOVED` makes redis-rs
//! refresh its slot map, but redis-rs refreshes from one node, which may not have heard of the
//! failover yet: the map then still names the demoted master, which accepts the subscription as
//! a replica and never delivers the shard's messages. So the dispatcher asks the node the
//! subscription went to whether it serves the slot (`CLUSTER NODES`) and, when it does not,
//! takes the subscription back and tries again with a growing pause (about 25 s in all) until
//! the news has spread. A slot migration ends the same way (`SETSLOT NODE` pushes `sunsubscribe`), but until
//! then the subscription stays on the old master while releases of a migrated key run, and
//! publish, on the importing node: those messages are lost. Waiting is always bounded by the
//! lease the busy reply reported and by the wait loop's re-check period (`acquire::RECHECK`), so
//! a lost message costs time, never correctness.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::{PushInfo, PushKind, Value};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender, WeakUnboundedSender};
use tokio::sync::{oneshot, watch, Notify};

use crate::error::{Error, Operation};
use crate::transport::{Subscriber, Transport};

/// The client's subscriptions and the waiters registered on them.
pub(crate) struct Wakeups {
    state: Mutex<State>,
    /// Opens the subscriber connection and bounds its commands.
    transport: Arc<Transport>,
}

#[derive(Default)]
struct State {
    channels: HashMap<String, Channel>,
    /// Commands to the dispatcher; `Some` while it runs.
    dispatcher: Option<UnboundedSender<Command>>,
    /// The server has no (sharded) pub/sub, or wake-ups are off: waiters poll.
    unsupported: bool,
    /// When the dispatcher will next look for idle channels to reap, as its last look
    /// decided; `None`: only when a command comes. A waiter that leaves a channel idle tells
    /// the dispatcher only then: otherwise its scheduled look finds the channel (a hot lock's
    /// waiters leave and come back once per grant).
    reap_due: Option<Instant>,
}

struct Channel {
    waiters: usize,
    /// Bumped when the subscription may have missed a message (dropped by the server, a
    /// connection lost): every waiter looks again.
    rung: watch::Sender<u64>,
    /// Wakes one waiter: on every message on the channel, and when a hold of this client on
    /// the lock is being released (see [`Wakeups::wake_one`]).
    next: Arc<Notify>,
    /// The last non-empty message on the channel, until a waiter takes it: a fair lock's
    /// release that granted the lock on the server names the grant (and its owner) in it
    /// (`fair/mod.rs`).
    message: Option<Vec<u8>>,
    /// Since when the channel has been subscribed without a break, as the dispatcher saw it
    /// confirmed; `None` while it is not (yet, or any more).
    since: Option<Instant>,
    /// When the last waiter left: the subscription is kept for [`CHANNEL_LINGER`] more, so a
    /// process that waits on the same lock again soon neither subscribes anew nor misses a
    /// message meanwhile.
    idle_since: Option<Instant>,
}

enum Command {
    /// Make the subscription to `channel` match whether anyone waits on it; tell `done` whether
    /// it is subscribed now.
    Sync {
        channel: String,
        done: Option<oneshot::Sender<bool>>,
    },
    /// The server ended the subscription (failover, resharding).
    Dropped(String),
    /// A renewed subscription landed on a node that does not serve the channel's slot (the
    /// connection's slot map was stale) and was taken back: try again, `attempt` counts.
    Retry { channel: String, attempt: u32 },
    /// A connection dropped: every subscription may be gone.
    Disconnected,
}

/// A waiter's registration on its lock's channel; dropping it unregisters (and unsubscribes
/// once no other waiter of this client needs the channel).
pub(crate) struct Subscription {
    wakeups: Arc<Wakeups>,
    channel: String,
    rung: watch::Receiver<u64>,
    next: Arc<Notify>,
    confirmed: Option<oneshot::Receiver<bool>>,
}

impl Wakeups {
    /// `enabled` false makes every waiter poll.
    pub(crate) fn new(transport: Arc<Transport>, enabled: bool) -> Self {
        Self {
            state: Mutex::new(State {
                unsupported: !enabled,
                ..State::default()
            }),
            transport,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a waiter on `channel`, starting the dispatcher if none runs. `None` when the
    /// server cannot publish or when no runtime is at hand: the caller polls.
    pub(crate) fn subscribe(self: &Arc<Self>, channel: &str) -> Option<Subscription> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let mut state = self.state();
        if state.unsupported {
            return None;
        }
        let entry = state
            .channels
            .entry(channel.to_owned())
            .or_insert_with(|| Channel {
                waiters: 0,
                rung: watch::Sender::new(0),
                next: Arc::new(Notify::new()),
                message: None,
                since: None,
                idle_since: None,
            });
        entry.waiters += 1;
        entry.idle_since = None;
        let rung = entry.rung.subscribe();
        let next = Arc::clone(&entry.next);
        if entry.since.is_some() && state.dispatcher.is_some() {
            // Subscribed already (another waiter's, or kept from an earlier wait): nothing to
            // ask the dispatcher, which would only confirm it.
            return Some(Subscription {
                wakeups: Arc::clone(self),
                channel: channel.to_owned(),
                rung,
                next,
                confirmed: None,
            });
        }
        let (done, confirmed) = oneshot::channel();
        let command = Command::Sync {
            channel: channel.to_owned(),
            done: Some(done),
        };
        let unsent = match &state.dispatcher {
            Some(commands) => commands.send(command).err().map(|e| e.0),
            None => Some(command),
        };
        if let Some(command) = unsent {
            let (commands, queue) = mpsc::unbounded_channel();
            let _ = commands.send(command);
            let weak = commands.downgrade();
            state.dispatcher = Some(commands);
            runtime.spawn(dispatch(Arc::clone(self), queue, weak));
        }
        drop(state);
        Some(Subscription {
            wakeups: Arc::clone(self),
            channel: channel.to_owned(),
            rung,
            next,
            confirmed: Some(confirmed),
        })
    }

    /// Wakes one of this client's waiters on `channel`, if any waits: a release announced on
    /// the channel, or a hold of this client being released (its release is queued, so the
    /// waiter's attempt, queued after it on the same node's driver, reaches Redis after it and
    /// finds the lock free: a handoff between two tasks of one client costs one round trip).
    /// One waiter, not all: the others would only find the lock taken again. A woken waiter
    /// that finds it busy marks the lock (`waiters`), so the next release announces.
    pub(crate) fn wake_one(&self, channel: &str) {
        if let Some(entry) = self.state().channels.get(channel) {
            entry.next.notify_one();
        }
    }

    /// Keeps `message` (when not empty) for a waiter on `channel` to take, then wakes one.
    fn deliver(&self, channel: &str, message: &[u8]) {
        if let Some(entry) = self.state().channels.get_mut(channel) {
            if message.is_empty() {
                entry.next.notify_one();
            } else {
                // A grant to one waiter of this client: each waiter on the channel looks (a
                // waiter that is not yet waiting checks `has_message` before it sleeps).
                // `notify_one` would leave a permit behind when the waiter woke by the ring,
                // and wake the next wait of this process for nothing.
                entry.message = Some(message.to_vec());
                entry.rung.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Takes the last non-empty message heard on `channel` when it is for `owner`
    /// ("<owner> <rest>"), and returns its rest; a message for another owner stays (a waiter
    /// of this client that gave up leaves its grant's message behind until the next one).
    pub(crate) fn take_message(&self, channel: &str, owner: &str) -> Option<Vec<u8>> {
        let mut state = self.state();
        let slot = &mut state.channels.get_mut(channel)?.message;
        let mine = slot.as_ref().is_some_and(|message| is_for(message, owner));
        if !mine {
            return None;
        }
        let mut message = slot.take()?;
        message.drain(..=owner.len());
        Some(message)
    }

    /// Whether a message for `owner` (see [`Wakeups::take_message`]) waits on `channel`.
    pub(crate) fn has_message(&self, channel: &str, owner: &str) -> bool {
        self.state()
            .channels
            .get(channel)
            .and_then(|entry| entry.message.as_ref())
            .is_some_and(|message| is_for(message, owner))
    }

    /// Whether `channel` has been subscribed without a break since `before`: a message
    /// published after then has reached this client (or is on its way), so a waiter whose
    /// attempt was sent at `before` need not look again after subscribing.
    pub(crate) fn heard_since(&self, channel: &str, before: Instant) -> bool {
        self.state()
            .channels
            .get(channel)
            .and_then(|entry| entry.since)
            .is_some_and(|since| since <= before)
    }

    /// Marks `channel` subscribed (since now, unless it was already) or not.
    fn mark(&self, channel: &str, subscribed: bool) {
        if let Some(entry) = self.state().channels.get_mut(channel) {
            if !subscribed {
                entry.since = None;
            } else if entry.since.is_none() {
                entry.since = Some(Instant::now());
            }
        }
    }

    /// Forgets the channels nobody has waited on for [`CHANNEL_LINGER`]: returns them (the
    /// dispatcher unsubscribes) and when the next lingering one is due.
    fn reap(&self) -> (Vec<String>, Option<Instant>) {
        let now = Instant::now();
        let mut state = self.state();
        let mut due = None;
        let mut gone = Vec::new();
        state.channels.retain(|channel, entry| {
            let Some(idle) = entry.idle_since else {
                return true;
            };
            let end = idle + CHANNEL_LINGER;
            if end <= now {
                gone.push(channel.clone());
                return false;
            }
            due = Some(due.map_or(end, |due: Instant| due.min(end)));
            true
        });
        state.reap_due = due;
        (gone, due)
    }

    /// Wakes every waiter on `channel`.
    fn ring(&self, channel: &str) {
        if let Some(entry) = self.state().channels.get(channel) {
            entry.rung.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn ring_all(&self) {
        for entry in self.state().channels.values() {
            entry.rung.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    fn is_wanted(&self, channel: &str) -> bool {
        self.state().channels.contains_key(channel)
    }

    /// The next queued command, or, when there is none and nobody waits, the dispatcher's
    /// retirement. Both are decided under the lock every registration takes, so a waiter
    /// registering now either finds the dispatcher's queue or starts a new dispatcher.
    fn next_or_retire(&self, queue: &mut UnboundedReceiver<Command>, linger: bool) -> Next {
        let mut state = self.state();
        match queue.try_recv() {
            Ok(command) => Next::Command(command),
            Err(TryRecvError::Empty) if !state.channels.is_empty() => Next::Wait,
            Err(TryRecvError::Empty) if linger => Next::Idle,
            Err(_) => {
                state.dispatcher = None;
                state.reap_due = None;
                Next::Retire
            }
        }
    }
}

/// Whether `message` is "<owner> ..." for `owner`.
fn is_for(message: &[u8], owner: &str) -> bool {
    message.len() > owner.len()
        && message.starts_with(owner.as_bytes())
        && message[owner.len()] == b' '
}

enum Next {
    Command(Command),
    /// Nobody waits, but the connection is kept for [`LINGER`] in case a waiter comes back.
    Idle,
    Wait,
    Retire,
}

/// Whether a waiter's subscription is in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Readiness {
    /// Subscribed: releases wake the waiter.
    Ready,
    /// The dispatcher has not answered yet (its connection may still be opening over a slow
    /// link): keep the registration, it may be subscribed later.
    Pending,
    /// It could not be made: the waiter polls.
    Failed,
}

impl Subscription {
    /// Waits until the subscription is in place, for at most `limit` (`Duration::ZERO`: only
    /// looks). Once it answered `Ready` or `Failed` it keeps answering the same.
    pub(crate) async fn ready(&mut self, limit: Duration) -> Readiness {
        let Some(confirmed) = self.confirmed.as_mut() else {
            return Readiness::Ready;
        };
        let readiness = match tokio::time::timeout(limit, confirmed).await {
            Err(_) => return Readiness::Pending,
            Ok(Ok(true)) => Readiness::Ready,
            Ok(_) => Readiness::Failed,
        };
        self.confirmed = None;
        self.rung.borrow_and_update();
        readiness
    }

    /// Sleeps for `pause` or until this waiter is woken (it is the one a message or a local
    /// release wakes, or the channel rings for all), whichever comes first; true when woken.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a wake-up that reached this waiter as it was dropped goes to another.
    /// See [`Wakeups::heard_since`].
    pub(crate) fn heard_since(&self, before: Instant) -> bool {
        self.wakeups.heard_since(&self.channel, before)
    }

    pub(crate) async fn wait(&mut self, pause: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + pause;
        let rung = async {
            match self.rung.changed().await {
                Ok(()) => true,
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            woken = rung => woken,
            () = self.next.notified() => true,
            () = tokio::time::sleep_until(deadline) => false,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut state = self.wakeups.state();
        let Some(entry) = state.channels.get_mut(&self.channel) else {
            return;
        };
        entry.waiters -= 1;
        if entry.waiters == 0 {
            entry.idle_since = Some(Instant::now());
            if state.reap_due.is_some() {
                return;
            }
            if let Some(commands) = &state.dispatcher {
                let _ = commands.send(Command::Sync {
                    channel: std::mem::take(&mut self.channel),
                    done: None,
                });
            }
        }
    }
}

/// The dispatcher: opens the subscriber connection, then serves commands until no waiter is
/// left.
async fn dispatch(
    wakeups: Arc<Wakeups>,
    mut queue: UnboundedReceiver<Command>,
    commands: WeakUnboundedSender<Command>,
) {
    let weak = Arc::downgrade(&wakeups);
    let retries = commands.clone();
    let push = move |push: PushInfo| {
        on_push(&weak, &commands, push);
        Ok::<(), std::convert::Infallible>(())
    };
    let opened = wakeups.transport.endpoint().open_subscriber(push).await;
    let mut conn = match opened {
        Ok(conn) => conn,
        Err(err) => {
            tracing::debug!(error = %err, "no subscriber connection: waiters poll");
            let mut state = wakeups.state();
            state.dispatcher = None;
            drop(state);
            // Queued confirmations are dropped with the queue: those waiters poll.
            return;
        }
    };
    let mut subscribed = HashSet::new();
    // Channels whose renewal waits for a `Retry`.
    let mut retrying = HashSet::new();
    let mut idle_since: Option<tokio::time::Instant> = None;
    loop {
        let (gone, due) = wakeups.reap();
        for channel in gone {
            sync(&wakeups, &mut conn, &mut subscribed, &channel).await;
        }
        let linger = idle_since.is_none_or(|since| since.elapsed() < LINGER);
        let command = match wakeups.next_or_retire(&mut queue, linger) {
            Next::Command(command) => command,
            Next::Retire => return,
            Next::Wait => {
                idle_since = None;
                let next = match due {
                    Some(due) => tokio::time::timeout_at(due.into(), queue.recv()).await,
                    None => Ok(queue.recv().await),
                };
                match next {
                    Ok(Some(command)) => command,
                    Ok(None) => return,
                    Err(_) => continue,
                }
            }
            Next::Idle => {
                let since = *idle_since.get_or_insert_with(tokio::time::Instant::now);
                match tokio::time::timeout_at(since + LINGER, queue.recv()).await {
                    Ok(Some(command)) => command,
                    Ok(None) => return,
                    Err(_) => continue,
                }
            }
        };
        if !matches!(command, Command::Sync { done: None, .. }) {
            idle_since = None;
        }
        match command {
            Command::Sync { channel, done } => {
                let now = sync(&wakeups, &mut conn, &mut subscribed, &channel).await;
                if let Some(done) = done {
                    let _ = done.send(now);
                }
                // A subscribe that failed or timed out (a lossy link) is tried again as a
                // dropped subscription is, while waiters want it; they poll meanwhile.
                let retry = !now
                    && !retrying.contains(&channel)
                    && wakeups.is_wanted(&channel)
                    && !wakeups.state().unsupported;
                if retry {
                    schedule_retry(&retries, &mut retrying, channel, 1);
                }
            }
            Command::Dropped(channel) => {
                if !subscribed.contains(&channel) && retrying.contains(&channel) {
                    // The confirmation of taking back a misplaced subscription: the pending
                    // `Retry` renews it.
                    continue;
                }
                subscribed.remove(&channel);
                wakeups.mark(&channel, false);
                wakeups.ring(&channel);
                if renew(&wakeups, &mut conn, &mut subscribed, &channel).await {
                    schedule_retry(&retries, &mut retrying, channel, 1);
                }
            }
            Command::Retry { channel, attempt } => {
                retrying.remove(&channel);
                if renew(&wakeups, &mut conn, &mut subscribed, &channel).await {
                    schedule_retry(&retries, &mut retrying, channel, attempt + 1);
                }
            }
            Command::Disconnected => {
                let channels: Vec<String> = subscribed.drain().collect();
                for channel in &channels {
                    wakeups.mark(channel, false);
                }
                wakeups.ring_all();
                for channel in channels {
                    if renew(&wakeups, &mut conn, &mut subscribed, &channel).await {
                        schedule_retry(&retries, &mut retrying, channel, 1);
                    }
                }
            }
        }
    }
}

/// How long the dispatcher keeps its connection once no waiter is left (issue 25, experiment):
/// a process that waits again soon (a hot lock) does not open a new connection per wait.
const LINGER: Duration = Duration::from_secs(2);

/// How long a channel stays subscribed after its last waiter left (see `Channel::idle_since`).
const CHANNEL_LINGER: Duration = Duration::from_secs(2);

/// How often a renewed subscription that landed on a node not serving its slot is tried again,
/// and the pause before each try: 50 ms, doubling up to 1 s, about 25 s in all. A stale slot
/// map lasts until the failover's news has reached the node the connection asks (redis-rs
/// asks one), which gossip bounds by about half the node timeout (15 s by default).
const RENEW_ATTEMPTS: u32 = 30;

fn renew_pause(attempt: u32) -> Duration {
    Duration::from_millis(50u64 << attempt.saturating_sub(1).min(5)).min(Duration::from_secs(1))
}

/// Renews the subscription to `channel` after the server or the connection dropped it (or a
/// first subscribe failed): makes the connection learn who serves the slot (`locate`),
/// subscribes, and checks that the node the subscription went to serves the slot. True when
/// the caller should try again later: the subscribe failed while waiters still want the
/// channel, or the node did not serve the slot (the slot map was stale: the failover's news
/// had not reached the node redis-rs refreshed it from, so the subscription sat on a demoted
/// master that never delivers the shard's messages; it is taken back).
async fn renew(
    wakeups: &Wakeups,
    conn: &mut Subscriber,
    subscribed: &mut HashSet<String>,
    channel: &str,
) -> bool {
    let limit = wakeups.transport.request_timeout();
    if wakeups.is_wanted(channel) {
        let _ = tokio::time::timeout(limit, conn.locate(channel)).await;
    }
    if !sync(wakeups, conn, subscribed, channel).await {
        // Failed or timed out (a lossy link, a node that stopped answering): again later while
        // waiters want it.
        return wakeups.is_wanted(channel) && !wakeups.state().unsupported;
    }
    match tokio::time::timeout(limit, conn.serves(channel)).await {
        Ok(Ok(false)) => {
            tracing::debug!(
                channel,
                "subscription renewed on a node that does not serve the slot"
            );
            if let Ok(Err(err)) = tokio::time::timeout(limit, conn.unsubscribe(channel)).await {
                tracing::debug!(channel, error = %err, "unsubscribe failed");
            }
            subscribed.remove(channel);
            wakeups.mark(channel, false);
            true
        }
        // Serving, or no answer: keep the subscription (waiters re-check in any case).
        _ => false,
    }
}

/// Sends `Retry { channel, attempt }` to the dispatcher after [`renew_pause`], unless the
/// attempts are used up: then the channel's waiters poll.
fn schedule_retry(
    commands: &WeakUnboundedSender<Command>,
    retrying: &mut HashSet<String>,
    channel: String,
    attempt: u32,
) {
    if attempt > RENEW_ATTEMPTS {
        tracing::debug!(
            channel,
            "no node serving the slot took the subscription: waiters poll"
        );
        return;
    }
    retrying.insert(channel.clone());
    let commands = commands.clone();
    tokio::spawn(async move {
        tokio::time::sleep(renew_pause(attempt)).await;
        if let Some(commands) = commands.upgrade() {
            let _ = commands.send(Command::Retry { channel, attempt });
        }
    });
}

/// Subscribes to or unsubscribes from `channel` so that the subscription matches the waiters.
/// Returns whether the channel is subscribed now.
async fn sync(
    wakeups: &Wakeups,
    conn: &mut Subscriber,
    subscribed: &mut HashSet<String>,
    channel: &str,
) -> bool {
    let wanted = wakeups.is_wanted(channel);
    let limit = wakeups.transport.request_timeout();
    if wanted && subscribed.contains(channel) {
        wakeups.mark(channel, true);
    } else if wanted {
        match tokio::time::timeout(limit, conn.subscribe(channel)).await {
            Ok(Ok(())) => {
                subscribed.insert(channel.to_owned());
                wakeups.mark(channel, true);
                tracing::trace!(channel, "subscribed");
            }
            Ok(Err(err)) => {
                // `ERR unknown command`: a server without (sharded) pub/sub.
                if err.code() == Some("ERR") {
                    wakeups.state().unsupported = true;
                }
                let err = Error::Redis {
                    name: channel.to_owned(),
                    operation: Operation::Subscribe,
                    source: err,
                };
                tracing::debug!(error = %err, "cannot subscribe: waiters poll");
            }
            Err(_) => tracing::debug!(channel, "subscribe timed out: waiters poll"),
        }
    } else if !wanted && subscribed.remove(channel) {
        if let Ok(Err(err)) = tokio::time::timeout(limit, conn.unsubscribe(channel)).await {
            tracing::debug!(channel, error = %err, "unsubscribe failed");
        }
    }
    subscribed.contains(channel)
}

/// Runs inside the connection's driver for every push: must not block.
fn on_push(wakeups: &Weak<Wakeups>, commands: &WeakUnboundedSender<Command>, push: PushInfo) {
    let Some(wakeups) = wakeups.upgrade() else {
        return;
    };
    let channel = || match push.data.first() {
        Some(Value::BulkString(bytes)) => String::from_utf8(bytes.clone()).ok(),
        _ => None,
    };
    let command = match push.kind {
        PushKind::SMessage | PushKind::Message => {
            if let Some(channel) = channel() {
                let message = match push.data.get(1) {
                    Some(Value::BulkString(bytes)) => bytes.as_slice(),
                    _ => &[],
                };
                wakeups.deliver(&channel, message);
            }
            return;
        }
        PushKind::SUnsubscribe | PushKind::Unsubscribe => match channel() {
            Some(channel) => Command::Dropped(channel),
            None => return,
        },
        PushKind::Disconnection => Command::Disconnected,
        _ => return,
    };
    if let Some(commands) = commands.upgrade() {
        let _ = commands.send(command);
    }
}
