//! The client's local queues: per lock key that a task of this client holds or asks Redis for
//! (its *turn*), the client's other tasks that want it, in arrival order. Only the task with the
//! turn asks Redis; the holder's release hands the lock to the first waiter or passes the turn.
//! A release may also leave its hold *lingering* here for a moment (see `Held`'s release): the
//! client's next task to enter takes it and is handed the lock by it.
//!
//! The queues know nothing of a primitive: what a release hands over travels type-erased, so
//! the queues sit below [`crate::core::Core`], which keeps them, and the primitive that uses
//! them (the mutex, `lock/handoff.rs`) builds and unpacks what is handed.

use std::any::Any;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use crate::keys::{ByFingerprint, LockKeys};
use crate::options::LockOptions;

/// The client's local queues, one per lock key that a task of this client holds or has the
/// turn for.
#[derive(Default)]
pub(crate) struct LocalQueues {
    locks: Mutex<HashMap<Key, Line, ByFingerprint>>,
    /// The last ticket given to a lingering hold.
    tickets: AtomicU64,
}

/// One lock's line in this client: the tasks waiting, and a hold whose release lingers.
#[derive(Default)]
struct Line {
    waiters: VecDeque<Waiter>,
    /// A released hold kept for the next task that enters, type-erased, with its ticket.
    lingering: Option<(u64, Box<dyn Any + Send>)>,
}

/// A lock's keys, compared by the lock key and hashed by its fingerprint, computed once with
/// the keys (a clone is a reference count, so registering a holder allocates nothing and a
/// lookup hashes nothing).
struct Key(LockKeys);

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.0.lock_key() == other.0.lock_key()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.fingerprint());
    }
}

/// A task of this client waiting for a lock another of its tasks holds or asks Redis for.
pub(crate) struct Waiter {
    pub(crate) keys: LockKeys,
    /// The owner token the lock is granted under when handed to this waiter.
    pub(crate) owner: String,
    pub(crate) options: LockOptions,
    pub(crate) to: oneshot::Sender<Handed>,
}

/// What a waiter is told.
pub(crate) enum Handed {
    /// The lock, granted by the holder's release: the primitive's guard, type-erased (dropped
    /// unread, the guard releases it).
    Granted(Box<dyn Any + Send>),
    /// The turn to ask Redis: the task before it let go without handing the lock over. Dropped
    /// unread (the waiter was cancelled after it was sent), it passes on.
    Turn(Turn),
}

impl Handed {
    /// A message its waiter was gone for, back from `send`: a turn in it is dropped without
    /// passing on (the sender passes it; the table may be locked).
    fn unsent(self) {
        if let Self::Turn(mut turn) = self {
            turn.armed = false;
        }
    }
}

/// How a task entered the local queue.
pub(crate) enum Entered {
    /// No task of this client held or asked for the lock: this one has the turn.
    Turn(Turn),
    /// Queued behind the task that holds or asks for it.
    Queued(oneshot::Receiver<Handed>),
    /// A hold of this client whose release lingered (type-erased): the entering task has it
    /// hand the lock over to it.
    Lingering(Box<dyn Any + Send>),
}

/// The turn of one task of this client to ask Redis for a lock; the others queue behind it.
/// Dropped without [`granted`](Self::granted) (the task gave up, or was cancelled), it passes
/// to the next waiter.
pub(crate) struct Turn {
    queues: Arc<LocalQueues>,
    keys: LockKeys,
    armed: bool,
}

impl Turn {
    /// The turn for `keys`' lock, passed on when dropped unless granted.
    pub(crate) fn new(queues: &Arc<LocalQueues>, keys: &LockKeys) -> Self {
        Self {
            queues: Arc::clone(queues),
            keys: keys.clone(),
            armed: true,
        }
    }

    /// The turn ended in a grant: the guard now stands for this client's hold.
    pub(crate) fn granted(mut self) {
        self.armed = false;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.armed {
            self.queues.pass(&self.keys);
        }
    }
}

impl LocalQueues {
    fn locks(&self) -> MutexGuard<'_, HashMap<Key, Line, ByFingerprint>> {
        self.locks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that a task of this client holds `keys`' lock (granted by Redis).
    pub(crate) fn hold(&self, keys: &LockKeys) {
        self.locks().entry(Key(keys.clone())).or_default();
    }

    /// Takes the turn for `keys`' lock, or queues behind the task that has it under the owner
    /// token `owner` makes.
    pub(crate) fn enter(
        self: &Arc<Self>,
        keys: &LockKeys,
        options: &LockOptions,
        owner: impl FnOnce() -> String,
    ) -> Entered {
        let mut locks = self.locks();
        let line = match locks.entry(Key(keys.clone())) {
            Entry::Occupied(line) => line.into_mut(),
            Entry::Vacant(vacant) => {
                vacant.insert(Line::default());
                return Entered::Turn(Turn::new(self, keys));
            }
        };
        if let Some((_, hold)) = line.lingering.take() {
            return Entered::Lingering(hold);
        }
        let (to, from) = oneshot::channel();
        line.waiters.push_back(Waiter {
            keys: keys.clone(),
            owner: owner(),
            options: options.clone(),
            to,
        });
        Entered::Queued(from)
    }

    /// The first waiter still waiting for `keys`' lock.
    pub(crate) fn next(&self, keys: &LockKeys) -> Option<Waiter> {
        let mut locks = self.locks();
        let line = locks.get_mut(&Key(keys.clone()))?;
        while let Some(waiter) = line.waiters.pop_front() {
            if !waiter.to.is_closed() {
                return Some(waiter);
            }
        }
        None
    }

    /// How many tasks wait in line for `keys`' lock (some may have been cancelled meanwhile).
    pub(crate) fn waiting(&self, keys: &LockKeys) -> usize {
        self.locks()
            .get(&Key(keys.clone()))
            .map_or(0, |line| line.waiters.len())
    }

    /// Keeps `hold`, a hold of this client on `keys`' lock whose release lingers, for the next
    /// task that enters; returns its ticket for [`unlinger`](Self::unlinger).
    pub(crate) fn linger(&self, keys: &LockKeys, hold: Box<dyn Any + Send>) -> u64 {
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed) + 1;
        let mut locks = self.locks();
        let line = locks.entry(Key(keys.clone())).or_default();
        // Another hold lingering here (one Redis lost behind the client's back, while a later
        // grant's lingers too) is dropped, and so released, once the table is unlocked: its
        // drop enters the table.
        let older = line.lingering.replace((ticket, hold));
        drop(locks);
        drop(older);
        ticket
    }

    /// The hold lingering on `keys`' lock, if one does (for a task's one attempt, which never
    /// queues).
    pub(crate) fn take_lingering(&self, keys: &LockKeys) -> Option<Box<dyn Any + Send>> {
        let mut locks = self.locks();
        let line = locks.get_mut(&Key(keys.clone()))?;
        line.lingering.take().map(|(_, hold)| hold)
    }

    /// The hold lingering under `ticket` on `keys`' lock, if no task took it meanwhile.
    pub(crate) fn unlinger(&self, keys: &LockKeys, ticket: u64) -> Option<Box<dyn Any + Send>> {
        let mut locks = self.locks();
        let line = locks.get_mut(&Key(keys.clone()))?;
        match &line.lingering {
            Some((at, _)) if *at == ticket => line.lingering.take().map(|(_, hold)| hold),
            _ => None,
        }
    }

    /// The task holding or asking for `keys`' lock let go without handing it over: the next
    /// waiter takes the turn to ask Redis; with none, no task of this client has the lock.
    pub(crate) fn pass(self: &Arc<Self>, keys: &LockKeys) {
        let key = Key(keys.clone());
        let mut locks = self.locks();
        let Some(line) = locks.get_mut(&key) else {
            return;
        };
        while let Some(waiter) = line.waiters.pop_front() {
            match waiter.to.send(Handed::Turn(Turn::new(self, keys))) {
                Ok(()) => return,
                Err(handed) => handed.unsent(),
            }
        }
        // Only the hold that has the lock passes it, so none lingers here; one that did is
        // dropped (and so released) once the table is unlocked: its drop enters the table.
        let lingering = line.lingering.take();
        if locks.len() == 1 {
            // The usual case, one lock at a time: emptying the table leaves no tombstone, which
            // would make a later insert of another key rehash the table in place.
            locks.clear();
        } else {
            locks.remove(&key);
        }
        drop(locks);
        drop(lingering);
    }
}

impl Waiter {
    /// Gives this waiter the turn to ask Redis (the lock was not handed to it); with the
    /// waiter gone, the turn passes on.
    pub(crate) fn turn(self, queues: &Arc<LocalQueues>) {
        // With the waiter gone the turn comes back and its drop passes it on.
        let _ = self.to.send(Handed::Turn(Turn::new(queues, &self.keys)));
    }
}
