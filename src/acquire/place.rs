//! A waiting call's place in a lock's queue (issue 25): the fair lock's every wait and the
//! mutex's waits across processes. One owner token names the place for the whole wait; the
//! watchdog renews its lease while the call waits; a release grants the lock to the head place
//! on the server and announces the grant on the head's client's channel, which [`Place::handed`]
//! reads; a call that ends without the lock withdraws its place (and a grant it did not see),
//! at once or, when dropped, in the background.
//!
//! The layout in the lock's hash (`script/lua/fair.lua`): `q:<owner>` =
//! `"<seq> <place lease end ms>"`, `g:<owner>` = `"<TTL ms> <place lease ms> <floor> <fence
//! mode>"`, `qseq`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::acquire::grant::granted_fence;
use crate::core::Core;
use crate::error::{Operation, Result};
use crate::held::Grant;
use crate::keys::LockKeys;
use crate::kind::Kind;
use crate::runtime::lease::lease_end;
use crate::runtime::watchdog::Watch;
use crate::script::{
    ttl_millis, EntriesSeen, ScriptCall, FAIR_RENEW_PLACE, FAIR_WITHDRAW, SCAN_WEIGHT,
};

/// The longest lease of a waiting place: a waiter that crashed stalls the queue at most this
/// long once it is at the head. Shorter when the lock's TTL is shorter.
pub(crate) const PLACE_LEASE: Duration = Duration::from_secs(3);

/// One waiting call's place (see the module docs).
pub(crate) struct Place {
    core: Arc<Core>,
    keys: LockKeys,
    kind: Kind,
    owner: String,
    /// `<key>:w:<client>` (`<client>`: the owner token's first 8 characters): the channel a
    /// release announces on when this call's place is the head. One per client, so a process
    /// that waits on the lock again keeps its subscription (`runtime/wakeups.rs`); the message
    /// names the owner it is for.
    channel: String,
    /// Place lease in ms; `"0"` for a call that never queues.
    lease_ms: String,
    lease: Duration,
    /// The watchdog's id of this call's place, while it watches it.
    watch: Mutex<Option<u64>>,
    /// Redis may hold something of this owner (a place, or a grant whose reply was not read).
    dirty: AtomicBool,
    /// Granted: the guard owns what this owner holds.
    granted: AtomicBool,
    /// The queue's length as the replies reported it: the weight of the calls that read it.
    seen: EntriesSeen,
    /// When the last attempt answered busy was sent: a grant a release made on the server
    /// came after that attempt ran, so its lease is measured from here.
    busy_sent: Mutex<Option<Instant>>,
}

impl Place {
    /// The place of a call on the lock `keys` of `kind` whose grants last `ttl`; `queue` false
    /// makes it a call that never takes a place (a one-shot try).
    pub(crate) fn new(
        core: &Arc<Core>,
        keys: &LockKeys,
        kind: Kind,
        ttl: Duration,
        queue: bool,
    ) -> Self {
        let owner = crate::owner::token(core.tag());
        let lease = ttl.min(PLACE_LEASE);
        Self {
            core: Arc::clone(core),
            channel: format!("{}:w:{}", keys.lock_key(), &owner[..8]),
            keys: keys.clone(),
            kind,
            owner,
            lease_ms: if queue { ttl_millis(lease) } else { "0".into() },
            lease,
            watch: Mutex::new(None),
            dirty: AtomicBool::new(false),
            granted: AtomicBool::new(false),
            seen: EntriesSeen::new(keys.slot(), SCAN_WEIGHT),
            busy_sent: Mutex::new(None),
        }
    }

    /// The owner token that names the place and the grant.
    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// The channel a release announces this call's grant on.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// The place lease argument, in ms (`"0"`: never queue).
    pub(crate) fn lease_arg(&self) -> &str {
        &self.lease_ms
    }

    /// The weight of a call that reads the queue.
    pub(crate) fn weight(&self) -> u32 {
        self.seen.weight()
    }

    /// Notes the queue's length a reply reported.
    pub(crate) fn note(&self, entries: i64) {
        self.seen.note(entries);
    }

    /// An attempt under this owner is about to be sent: Redis may hold something of it.
    pub(crate) fn sending(&self) {
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// The attempt sent at `sent` was granted: the guard owns the grant from now on.
    pub(crate) fn granted(&self) {
        self.unwatch();
        self.granted.store(true, Ordering::Relaxed);
    }

    /// The attempt sent at `sent` answered busy; `queued` is what it said of the place: 1 it
    /// created it (the watchdog renews it from now on), 0 it kept it, -1 the queue was full.
    pub(crate) fn busy(&self, sent: Instant, queued: i64) {
        *self.lock_busy_sent() = Some(sent);
        if self.lease_ms == "0" {
            self.dirty.store(false, Ordering::Relaxed);
        } else if queued == 1 {
            tracing::debug!(lock = self.keys.name(), kind = self.kind.as_str(), "queued");
            self.watch(sent);
        } else if queued == -1 {
            tracing::debug!(
                lock = self.keys.name(),
                kind = self.kind.as_str(),
                "queue full: trying again without a place"
            );
        }
    }

    /// Whether an attempt of this call answered busy: it waited behind another holder (and,
    /// with a place, behind other clients' places).
    pub(crate) fn was_busy(&self) -> bool {
        self.lock_busy_sent().is_some()
    }

    /// Whether a grant to this call's place has been announced and not yet taken.
    pub(crate) fn handed_pending(&self) -> bool {
        self.core.wakeups.has_message(&self.channel, &self.owner)
    }

    /// The grant a release made to this call's place on the server, announced on its channel
    /// as "<owner> <fence> <behind µs> <lease ms>" (`hand` in `script/lua/fair.lua`): the lock
    /// is held without another call. `None` when no such message came, or when it cannot be
    /// used and the next attempt is to confirm the grant instead (it answers `{2, fence}` for
    /// it, moving the lease end to now + TTL): `wait_replicas` (the options ask for replicas'
    /// acknowledgements), or too little of the lease would be left.
    ///
    /// The lease: the release set it to end at its own time + TTL. The waiter cannot know that
    /// time, but it knows a time before it: when its last attempt answered busy was sent. That
    /// attempt ran on the server before the release (once granted, an attempt answers
    /// `{2, ...}`, never busy), so the lease measured from its sending ends no later than the
    /// server's, as every lease measured from the request that set it (`docs/design.md`,
    /// "Leases"). The waiter's re-checks (at most the wait loop's re-check period apart while
    /// subscribed) keep that time recent; a grant left with less than half its lease falls back
    /// to the call.
    ///
    /// # Errors
    ///
    /// [`Error::UnexpectedReply`](crate::Error::UnexpectedReply) for a fence out of range.
    pub(crate) fn handed(
        &self,
        operation: Operation,
        wait_replicas: bool,
    ) -> Result<Option<Grant>> {
        let core = &self.core;
        let Some(message) = core.wakeups.take_message(&self.channel, &self.owner) else {
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
        let sent = *self.lock_busy_sent();
        let (Some((fence, behind, lease)), Some(sent)) = (parsed, sent) else {
            return Ok(None);
        };
        let ttl = Duration::from_millis(u64::try_from(lease).unwrap_or(0));
        if wait_replicas || lease_end(sent, ttl) < Instant::now() + ttl / 2 {
            return Ok(None);
        }
        let name = self.keys.name();
        let fence = granted_fence(core, self.kind.as_str(), name, operation, fence, behind)?;
        self.granted();
        tracing::debug!(lock = name, kind = self.kind.as_str(), %fence, "granted by the release");
        Ok(Some(Grant {
            keys: self.keys.clone(),
            owner: self.owner.clone(),
            hold: String::new(),
            fence,
            sent,
            ttl,
            replicas_acked: None,
            weight: self.seen.weight(),
        }))
    }

    /// The call that gives up this owner's place (and a grant it may not have seen).
    pub(crate) fn withdraw_call(&self) -> ScriptCall {
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
        self.unwatch();
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
    fn watch(&self, sent: Instant) {
        let watch = Watch {
            lock_key: self.keys.lock_key(),
            owner: &self.owner,
            slot: self.keys.slot(),
            renew: LazyLock::force(&FAIR_RENEW_PLACE),
            weight: 1,
            ttl: self.lease,
            every: self.lease / 3,
            hold_until: None,
            valid_until: lease_end(sent, self.lease).into(),
        };
        let id = self.core.watchdog.watch(watch).map(|(id, _)| id);
        let old = std::mem::replace(&mut *self.lock_watch(), id);
        if let Some(old) = old {
            self.core.watchdog.unwatch(old);
        }
    }

    fn unwatch(&self) {
        if let Some(id) = self.lock_watch().take() {
            self.core.watchdog.unwatch(id);
        }
    }

    fn lock_watch(&self) -> MutexGuard<'_, Option<u64>> {
        self.watch.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_busy_sent(&self) -> MutexGuard<'_, Option<Instant>> {
        self.busy_sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Place {
    /// A call that ends without the lock (timed out, failed, dropped) gives up its place at
    /// once, in the background.
    fn drop(&mut self) {
        self.unwatch();
        if self.dirty.load(Ordering::Relaxed) && !self.granted.load(Ordering::Relaxed) {
            self.core
                .transport
                .undo_detached(self.withdraw_call(), Operation::Withdraw);
        }
    }
}
