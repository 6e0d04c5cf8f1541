//! The state every guard wraps: one hold of one key by one owner, its fence, its lease (followed
//! by the watchdog or not), and the scripts that release, extend and renew it.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::fence::FenceToken;
use crate::keys::LockKeys;
use crate::local_queue::{Handed, Waiter};
use crate::options::{validate_ttl, LockOptions};
use crate::runtime::lease::{lease_end, Ended, SharedLease};
use crate::runtime::watchdog::Watch;
use crate::script::{parse_reply, ttl_millis, LuaScript, Outcome, ScriptCall};
use crate::stats::{Counter, Counters};

/// The accessors every guard shares, written once: a guard is a struct with a `held: Held`
/// field, and `$what` names what it holds in the docs ("lock", "read hold", "permits"). Each
/// guard writes its own `fence`, `lost`, `extend` and `release`, whose docs differ.
macro_rules! held_accessors {
    ($what:literal) => {
        #[doc = concat!("The name the ", $what, " was taken under.")]
        pub fn name(&self) -> &str {
            self.held.name()
        }

        #[doc = concat!("The Redis key and slot of the ", $what, ".")]
        pub fn keys(&self) -> &$crate::LockKeys {
            self.held.keys()
        }

        #[doc = concat!("Until when the ", $what, " is surely valid: measured from before the ")]
        /// acquire (or last extend or renewal) request was sent, less a drift margin of 1% of the
        /// TTL and 2 ms. After it, another owner may hold it. With the watchdog on, it moves
        /// forward with every renewal.
        pub fn valid_until(&self) -> std::time::Instant {
            self.held.valid_until()
        }

        /// True while [`valid_until`](Self::valid_until) lies in the future and the watchdog (if
        #[doc = concat!("on) has not found the ", $what, " lost.")]
        pub fn is_valid(&self) -> bool {
            self.held.is_valid()
        }

        /// How many replicas acknowledged the acquisition, when `wait_replicas` was set.
        pub fn replicas_acked(&self) -> Option<u32> {
            self.held.replicas_acked()
        }
    };
}
pub(crate) use held_accessors;

/// The crate's way into a guard that wraps one [`Held`] in a `held` field: made from it, read,
/// changed and unwrapped (the multi-lock works on its members through these).
macro_rules! held_wrapper {
    () => {
        pub(crate) fn new(held: $crate::held::Held) -> Self {
            Self { held }
        }

        pub(crate) fn held(&self) -> &$crate::held::Held {
            &self.held
        }

        pub(crate) fn held_mut(&mut self) -> &mut $crate::held::Held {
            &mut self.held
        }

        pub(crate) fn into_held(self) -> $crate::held::Held {
            self.held
        }
    };
}
pub(crate) use held_wrapper;

/// The scripts a primitive's holds are released, extended and renewed with. They share one
/// contract, so [`Held`] and the watchdog serve every primitive alike:
///
/// - `release`: `KEYS[1]` the key, `ARGV` owner, hold id, announce (`s`/`p`/empty), expiry
///   grace; replies an [`Outcome`] code.
/// - `extend`: `KEYS[1]` the key, `ARGV` owner, TTL in ms, expiry grace; replies
///   `{code, remaining lease ms}`.
/// - `renew`: `KEYS[1]` any key of the node, `ARGV` triples key, owner, TTL in ms, then the
///   expiry grace; replies one code per triple.
///
/// With `holder_names_hold`, the owner argument of `extend` and `renew` is `"<owner> <hold
/// id>"` (the semaphore's: its permit numbers, so those scripts read only the hold's entries).
pub(crate) struct Scripts {
    /// The primitive whose holds these are: its name in spans and metrics.
    pub(crate) kind: crate::kind::Kind,
    pub(crate) release: &'static LazyLock<LuaScript>,
    pub(crate) extend: &'static LazyLock<LuaScript>,
    pub(crate) renew: &'static LazyLock<LuaScript>,
    pub(crate) holder_names_hold: bool,
}

impl Scripts {
    /// The owner argument of the `extend` and `renew` calls of `owner`'s hold `hold`.
    fn holder(&self, owner: &str, hold: &str) -> String {
        if self.holder_names_hold {
            format!("{owner} {hold}")
        } else {
            owner.to_owned()
        }
    }

    /// The call that releases `owner`'s hold `hold` (empty for the first) on `key`.
    pub(crate) fn release_call(
        &self,
        core: &Core,
        key: &str,
        owner: &str,
        hold: &str,
    ) -> ScriptCall {
        ScriptCall::new(
            LazyLock::force(self.release),
            &[key],
            &[owner, hold, core.transport.announce(), core.expiry()],
        )
    }
}

/// What a granting script handed out, for [`Held::new`].
pub(crate) struct Grant {
    pub(crate) keys: LockKeys,
    pub(crate) owner: String,
    /// Empty for the hold an acquire granted; the hold's id for a re-entry.
    pub(crate) hold: String,
    pub(crate) fence: FenceToken,
    /// When the request that granted (or extended) the lease was sent.
    pub(crate) sent: Instant,
    pub(crate) ttl: Duration,
    pub(crate) replicas_acked: Option<u32>,
    /// What the hold's release, extend and renew calls cost the server, in mutex calls: 1, or
    /// more for a semaphore's, which read every permit entry ([`ScriptCall::weighted`]).
    pub(crate) weight: u32,
}

/// How a hold's release hands the lock to the client's next waiting task in the same call (the
/// mutex's: `lock/handoff.rs`): releases `owner`'s hold `hold` (empty for the first) on `keys`'
/// lock and grants it to `waiter`, or tells the waiter to ask Redis; returns the release's code.
/// `cohort` is the hold's [`Held::cohort`] mark: the waiter is then handed the lock ahead of
/// other clients' queued places, with fences reserved for further handoffs within the client.
pub(crate) type HandOver = for<'a> fn(
    &'a Arc<Core>,
    &'a LockKeys,
    &'a str,
    &'a str,
    Waiter,
    bool,
) -> Pin<Box<dyn Future<Output = Result<i64>> + Send + 'a>>;

/// How a mutex hold registered in the local queue hands the lock to the client's next waiting
/// task: in one script call that releases and grants ([`HandOver`]), or, while fences reserved
/// for its owner token remain and the lease has most of its TTL left, within the client with no
/// call at all (`wrap` makes the primitive's guard of the hold handed on, type-erased).
pub(crate) struct Handing {
    pub(crate) over: HandOver,
    pub(crate) wrap: fn(Held) -> Box<dyn Any + Send>,
}

/// A hold the watchdog follows.
pub(crate) struct Watched {
    /// The watchdog's id for the hold; `None` for a re-entry riding on another guard's watch.
    id: Option<u64>,
    lease: SharedLease,
    /// The renewal period the caller chose, if any.
    every: Option<Duration>,
    max_hold: Option<Duration>,
}

impl Clone for Watched {
    /// A view of the same lease that does not own the watch (for a re-entry).
    fn clone(&self) -> Self {
        Self {
            id: None,
            lease: self.lease.clone(),
            every: self.every,
            max_hold: self.max_hold,
        }
    }
}

/// One hold: what every guard wraps. Dropping an unreleased one releases it in the background.
pub(crate) struct Held {
    core: Arc<Core>,
    kind: &'static Scripts,
    keys: LockKeys,
    owner: Box<str>,
    /// Empty for the hold an acquire granted; the hold's id for a re-entry.
    hold: Box<str>,
    fence: FenceToken,
    granted: Instant,
    /// The lease end when no watchdog follows it.
    valid_until: Instant,
    watched: Option<Watched>,
    replicas_acked: Option<u32>,
    released: bool,
    /// A mutex hold registered in the client's local queue: its release hands the lock to the
    /// client's next waiting task with this.
    handing: Option<&'static Handing>,
    /// The lease length the hold was granted with.
    ttl: Duration,
    /// The last fence reserved for the owner token: `fence` itself, or more when the grant took
    /// further fences for the client to hand the lock on within itself (see [`Handing`]).
    last: FenceToken,
    /// Until when those fences may be handed out without a call ([`RESERVED_FOR`] after the
    /// call that reserved them was sent).
    reserved_until: Instant,
    /// A [`Reentry`](crate::Reentry) handle shares the owner token: the hold is never handed on
    /// under it within the client.
    shared: AtomicBool,
    /// The weight of its calls in a batch (see [`Grant::weight`]).
    weight: u32,
    /// Granted by Redis after the call waited behind other clients' places: its release may
    /// start a cohort (see [`cohort`](Self::cohort)).
    cohort: bool,
    /// Its release may linger ([`LockOptions::linger`]).
    linger: bool,
}

/// How long after the call that reserved them a hold's reserved fences may be handed out
/// within the client without a call. A hold Redis lost behind the client's back (a failover
/// or restart that lost the reserving call's write) would hand out fences below a grant the
/// new master made meanwhile; that takes the loss and another client's grant by the new
/// master within this time of the reserving call (docs/safety.md). A run of 16 handoffs
/// takes about 0.1 ms on the benchmark machine; one that takes longer goes on with calls.
pub(crate) const RESERVED_FOR: Duration = Duration::from_millis(2);

/// How many times a lingering release lets the runtime run its other ready tasks before it asks
/// Redis (see `Held::release`): enough for the releasing task to come back for the lock when it
/// does so at once, without a timer (whose 1 ms resolution would hold the lock from others).
const LINGER_YIELDS: usize = 3;

impl Held {
    /// The hold `grant` made, watched when `options` turn the watchdog on. A grant by Redis
    /// (re-entries and holds handed over within the client come through
    /// [`following`](Self::following)): its fence is checked against the lock's earlier grants
    /// ([`Core::granted`]).
    pub(crate) fn new(
        core: &Arc<Core>,
        kind: &'static Scripts,
        grant: Grant,
        options: &LockOptions,
    ) -> Self {
        core.granted(
            grant.keys.lock_key(),
            grant.keys.fingerprint(),
            grant.keys.name(),
            grant.fence,
            grant.sent,
        );
        let watched = options
            .watchdog
            .then(|| Self::watch(core, kind, &grant, options))
            .flatten();
        let mut held = Self::following(core, kind, grant, watched);
        held.linger = options.linger;
        held
    }

    /// The hold `grant` made, following `watched` (another hold's watch) if any.
    pub(crate) fn following(
        core: &Arc<Core>,
        kind: &'static Scripts,
        grant: Grant,
        watched: Option<Watched>,
    ) -> Self {
        Self {
            core: Arc::clone(core),
            kind,
            valid_until: lease_end(grant.sent, grant.ttl),
            keys: grant.keys,
            owner: grant.owner.into(),
            hold: grant.hold.into(),
            fence: grant.fence,
            granted: Instant::now(),
            watched,
            replicas_acked: grant.replicas_acked,
            released: false,
            handing: None,
            ttl: grant.ttl,
            last: grant.fence,
            reserved_until: grant.sent,
            shared: AtomicBool::new(false),
            weight: grant.weight,
            cohort: false,
            linger: false,
        }
    }

    /// This mutex hold, registered as the client's holder of its lock (see `local_queue`): the
    /// client's other tasks wait behind it, and its release hands the lock on with `hand_over`.
    pub(crate) fn handing(mut self, handing: &'static Handing) -> Self {
        self.handing = Some(handing);
        self
    }

    /// The grant, by the call sent at `sent`, also took the fences after this hold's up to
    /// `last`, for the client to hand the lock on within itself under the same owner token
    /// during [`RESERVED_FOR`].
    pub(crate) fn reserved(mut self, last: FenceToken, sent: Instant) -> Self {
        self.last = last.max(self.fence);
        self.reserved_until = sent + RESERVED_FOR;
        self
    }

    /// This mutex hold was granted by Redis after the call waited behind other clients' queued
    /// places (a hot lock): its release hands the lock to this client's next waiting task ahead
    /// of those places and reserves fences for further handoffs within the client, a *cohort*
    /// of at most `lock/handoff.rs`'s `RESERVE` grants before the next client's turn; with
    /// [`LockOptions::linger`] and no task waiting yet it lingers for a moment (see
    /// [`release`](Self::release)).
    pub(crate) fn cohort(mut self) -> Self {
        self.cohort = true;
        self
    }

    /// A [`Reentry`](crate::Reentry) handle was made of this hold: its owner token is never
    /// handed on within the client (the handle would take the next holder's lock).
    pub(crate) fn share_token(&self) {
        self.shared.store(true, Ordering::Relaxed);
    }

    /// Registers `grant` with the watchdog; `None` without a Tokio runtime.
    fn watch(
        core: &Arc<Core>,
        kind: &'static Scripts,
        grant: &Grant,
        options: &LockOptions,
    ) -> Option<Watched> {
        let mut every = options.renewal_period();
        if grant.ttl < options.get_ttl() {
            // The first lease was cut to the maximum hold: look again halfway through, when the
            // watchdog ends the hold as the maximum hold time.
            every = every.min(grant.ttl / 2);
        }
        let holder = kind.holder(&grant.owner, &grant.hold);
        let watch = Watch {
            lock_key: grant.keys.lock_key(),
            owner: &holder,
            slot: grant.keys.slot(),
            renew: LazyLock::force(kind.renew),
            weight: grant.weight,
            ttl: grant.ttl,
            every,
            hold_until: options
                .max_hold
                .and_then(|max| grant.sent.checked_add(max))
                .map(Into::into),
            valid_until: lease_end(grant.sent, grant.ttl).into(),
        };
        core.watchdog.watch(watch).map(|(id, lease)| Watched {
            id: Some(id),
            lease,
            every: options.renew_every,
            max_hold: options.max_hold,
        })
    }

    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    pub(crate) fn owner(&self) -> &str {
        &self.owner
    }

    /// True for a hold added to another (a re-entry).
    pub(crate) fn is_added(&self) -> bool {
        !self.hold.is_empty()
    }

    /// The watch this hold follows, as a view for another hold of the same owner.
    pub(crate) fn watched(&self) -> Option<Watched> {
        self.watched.clone()
    }

    pub(crate) fn is_watched(&self) -> bool {
        self.watched.is_some()
    }

    pub(crate) fn fence(&self) -> FenceToken {
        self.fence
    }

    pub(crate) fn name(&self) -> &str {
        self.keys.name()
    }

    pub(crate) fn keys(&self) -> &LockKeys {
        &self.keys
    }

    pub(crate) fn replicas_acked(&self) -> Option<u32> {
        self.replicas_acked
    }

    /// Until when the hold is surely valid; with a watch, as its last renewal left it.
    pub(crate) fn valid_until(&self) -> Instant {
        match &self.watched {
            Some(watched) => watched.lease.get().valid_until.into_std(),
            None => self.valid_until,
        }
    }

    /// True while the hold is surely valid and no watch found it lost.
    pub(crate) fn is_valid(&self) -> bool {
        let ended = self
            .watched
            .as_ref()
            .is_some_and(|w| w.lease.get().ended.is_some());
        !ended && Instant::now() < self.valid_until()
    }

    /// Resolves when the hold can no longer be relied on, with the reason (see
    /// `LockGuard::lost`).
    pub(crate) async fn lost(&self) -> Error {
        let name = self.keys.name();
        let Some(watched) = &self.watched else {
            tokio::time::sleep_until(self.valid_until.into()).await;
            return Error::Expired {
                name: name.to_owned(),
            };
        };
        watch_lost(&self.core, name, watched).await
    }

    /// What [`lost`](Self::lost) reports for a watched hold, as a future that does not borrow
    /// the hold (so the hold can be lent out meanwhile); `None` without the watchdog, whose
    /// lease end moves with every `extend`.
    pub(crate) fn lost_watcher(
        &self,
    ) -> Option<impl std::future::Future<Output = Error> + 'static> {
        let watched = self.watched.clone()?;
        let (core, name) = (Arc::clone(&self.core), self.keys.name().to_owned());
        Some(async move { watch_lost(&core, &name, &watched).await })
    }

    /// Resets the lease to `ttl` (see `LockGuard::extend`).
    pub(crate) async fn extend(&mut self, ttl: Duration) -> Result<Instant> {
        let span = self.span("fencelock.extend");
        self.extend_unspanned(ttl).instrument(span).await
    }

    async fn extend_unspanned(&mut self, ttl: Duration) -> Result<Instant> {
        let extended = self.extend_call(ttl).await;
        if let Err(err) = &extended {
            // The hold may be lost: only a call to Redis may hand it on, and its release must
            // not linger.
            self.no_hand_within();
            self.cohort = false;
            let why = match err {
                Error::Expired { .. } => Some(Ended::Expired),
                Error::NotOwner { .. } => Some(Ended::NotOwner),
                Error::ForceUnlocked { .. } => Some(Ended::ForceUnlocked),
                _ => None,
            };
            if let Some(why) = why {
                self.ended(why);
            }
        }
        extended
    }

    /// Redis said the hold is gone (`why`): it is no longer valid, and `lost()` answers at
    /// once, for every guard of this owner's hold that follows the same watch.
    fn ended(&mut self, why: Ended) {
        self.valid_until = Instant::now();
        match &self.watched {
            Some(Watched { id: Some(id), .. }) => self.core.watchdog.lost(*id, why),
            Some(Watched { lease, .. }) => {
                lease.update(|lease| {
                    lease.valid_until = self.valid_until.into();
                    lease.ended = Some(why);
                });
                self.core.watchdog.ended().notify_waiters();
            }
            None => {}
        }
    }

    async fn extend_call(&mut self, ttl: Duration) -> Result<Instant> {
        validate_ttl(self.keys.name(), ttl)?;
        let sent = Instant::now();
        let shorter = lease_end(sent, ttl);
        if shorter < self.valid_until() {
            // Redis may shorten the lease even if this call then fails or is dropped: until a
            // reply says otherwise, the hold counts on the shorter one (which also keeps it from
            // being handed on without a call).
            self.valid_until = shorter;
            self.watch_lease(ttl);
        }
        let ttl_ms = ttl_millis(ttl);
        let call = ScriptCall::new(
            LazyLock::force(self.kind.extend),
            &[self.keys.lock_key()],
            &[
                &self.kind.holder(&self.owner, &self.hold),
                &ttl_ms,
                self.core.expiry(),
            ],
        )
        .weighted(self.weight);
        let reply = self
            .core
            .transport
            .run(&call, self.name(), Operation::Extend)
            .await?;
        let (code, remaining) = parse_reply::<(i64, u64)>(self.name(), Operation::Extend, reply)?;
        self.outcome(code, Operation::Extend, &self.core.counters.extends)?;
        self.valid_until = lease_end(sent, Duration::from_millis(remaining));
        // The lease length from now on: a task this hold is handed to within the client must
        // have asked for the same.
        self.ttl = ttl;
        self.watch_lease(ttl);
        Ok(self.valid_until())
    }

    /// Tells the watch this hold follows the lease it now has: `valid_until`, renewed with `ttl`
    /// (the watchdog, when this hold owns the watch; else the lease it shares with its owner's
    /// first hold).
    fn watch_lease(&self, ttl: Duration) {
        match &self.watched {
            Some(Watched {
                id: Some(id),
                every,
                ..
            }) => {
                let every = every.filter(|e| *e < ttl).unwrap_or(ttl / 3);
                self.core
                    .watchdog
                    .extended(*id, ttl, every, self.valid_until.into());
            }
            // A re-entry riding on another guard's watch: Redis keeps one lease per owner, so
            // what this extension set is the lease of both.
            Some(Watched { lease, .. }) => {
                lease.update(|lease| lease.valid_until = self.valid_until.into());
            }
            None => {}
        }
    }

    /// Releases the hold and stops its watch (see `LockGuard::release`).
    ///
    /// A mutex hold with [`LockOptions::linger`] that could hand the lock on within the client
    /// (fences reserved for its owner token left, or a [`cohort`](Self::cohort) hold) with no
    /// task of the client waiting yet *lingers*: it stays in the client's local queue while the runtime runs its other
    /// ready tasks [`LINGER_YIELDS`] times, so a task that asks for the lock at once (the
    /// releasing one, in a loop) is handed it (with no call while reserved fences last), and
    /// otherwise a background task releases it. It lingers only while its lease has most of
    /// its TTL left (as a handoff within the client needs): the lock was surely held until the
    /// release, which answers `Ok` before Redis is told; a loss the background call finds (a
    /// failover that lost the grant) is logged and counted as lost, not returned.
    pub(crate) async fn release(self) -> Result<()> {
        let span = self.span("fencelock.release");
        self.release_unspanned().instrument(span).await
    }

    /// Releases `helds` all at once, so that holds on a node that stopped answering cost one
    /// request timeout in all, not one each. Returns the error of the first hold, in the order
    /// given, whose release failed.
    pub(crate) async fn release_together(helds: impl IntoIterator<Item = Held>) -> Result<()> {
        let mut releases = tokio::task::JoinSet::new();
        for (index, held) in helds.into_iter().enumerate() {
            releases.spawn(async move { (index, held.release().await) });
        }
        let mut first: Option<(usize, Error)> = None;
        while let Some(joined) = releases.join_next().await {
            // A release task cannot panic short of a bug; its hold's drop released it then.
            let Ok((index, Err(err))) = joined else {
                continue;
            };
            if first.as_ref().is_none_or(|(at, _)| index < *at) {
                first = Some((index, err));
            }
        }
        first.map_or(Ok(()), |(_, err)| Err(err))
    }

    /// The span of a call on this hold: the lock's name, kind ([`Kind::as_str`](crate::kind::Kind::as_str),
    /// as the acquiring calls' spans name it) and fence.
    fn span(&self, call: &'static str) -> tracing::Span {
        let kind = self.kind.kind.as_str();
        tracing::debug_span!(
            "fencelock.hold",
            call,
            lock = self.name(),
            kind,
            fence = self.fence.get()
        )
    }

    async fn release_unspanned(self) -> Result<()> {
        if self.handing.is_some()
            && self.core.handoffs.waiting(&self.keys) == 0
            && self.may_linger()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            self.linger();
            return Ok(());
        }
        self.release_now().await
    }

    /// Whether a release of this hold may linger (see [`release`](Self::release)).
    fn may_linger(&self) -> bool {
        self.linger
            && (self.cohort || (self.last > self.fence && Instant::now() < self.reserved_until))
            && self.hold.is_empty()
            && !self.shared.load(Ordering::Relaxed)
            && self.is_valid()
            && self.lease_mostly_left()
    }

    /// Leaves this hold in the client's local queue for the next task that asks for the lock,
    /// and a background task that releases it unless one does (see [`release`](Self::release)).
    fn linger(self) {
        let (core, keys) = (Arc::clone(&self.core), self.keys.clone());
        let ticket = core.handoffs.linger(&keys, Box::new(self));
        let lingering = Lingering { core, keys, ticket };
        let transport = Arc::clone(&lingering.core.transport);
        transport.spawn_detached(async move {
            for _ in 0..LINGER_YIELDS {
                tokio::task::yield_now().await;
            }
            let Some(held) = lingering.take() else {
                return;
            };
            let name = held.keys.name().to_owned();
            if let Err(err) = held.release_now().await {
                tracing::debug!(lock = name, error = %err, "lingering release failed");
            }
        });
    }

    /// Hands the lock to `waiter`, a task of this client that asked for it while this hold's
    /// release lingered (see `lock/handoff.rs`), as a release with `waiter` queued would.
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release)'s call; the waiter is told to ask Redis (or given the
    /// lock) either way.
    pub(crate) async fn hand_to(mut self, waiter: Waiter) -> Result<()> {
        let Some(handing) = self.handing else {
            waiter.turn(&self.core.handoffs);
            return self.release_call_now().await;
        };
        let Some(waiter) = self.hand_within(handing, waiter) else {
            return self.released(1);
        };
        self.no_hand_within();
        self.unwatch();
        let over = handing.over;
        let cohort = self.cohort;
        let handed = over(
            &self.core,
            &self.keys,
            &self.owner,
            &self.hold,
            waiter,
            cohort,
        )
        .await;
        match handed {
            Ok(code) => self.released(code),
            Err(err) => {
                // The waiter was told to ask Redis (it has the turn now): this hold's drop
                // releases it in the background without handing the lock to the next waiter
                // as well or passing the turn a second time.
                self.handing = None;
                Err(err)
            }
        }
    }

    /// The release, handing the lock to this client's next waiting task if there is one.
    async fn release_now(self) -> Result<()> {
        if self.handing.is_some() {
            if let Some(waiter) = self.core.handoffs.next(&self.keys) {
                return self.hand_to(waiter).await;
            }
        }
        self.release_call_now().await
    }

    /// The release call (no task of this client to hand the lock to).
    async fn release_call_now(mut self) -> Result<()> {
        self.no_hand_within();
        self.unwatch();
        let call = self.release_call();
        // A waiter of this client is woken as soon as the release is queued: its attempt is
        // queued after it, so it reaches Redis after the release. Sent on its own, the release
        // must be answered first.
        let freeing = self.hold.is_empty();
        let reply = match self
            .core
            .transport
            .queue(call, self.name(), Operation::Release)
        {
            Ok(reply) => {
                self.freeing(freeing);
                self.core
                    .transport
                    .reply(reply, self.name(), Operation::Release)
                    .await?
            }
            Err(call) => {
                let reply = self
                    .core
                    .transport
                    .run(call, self.name(), Operation::Release)
                    .await?;
                self.freeing(freeing);
                reply
            }
        };
        let code = parse_reply(self.name(), Operation::Release, reply)?;
        self.released(code)
    }

    /// The release of a hold that may free the lock is queued (or answered): the client's tasks
    /// queued behind this hold ask Redis now, and one waiter of the client is woken. The turn
    /// is passed once: should the release then fail or be dropped, the hold's drop only
    /// releases it in the background.
    fn freeing(&mut self, freeing: bool) {
        if self.handing.take().is_some() {
            self.core.handoffs.pass(&self.keys);
        }
        if freeing {
            self.core.wakeups.wake_one(self.keys.lock_key());
        }
    }

    /// The release answered `code`.
    fn released(mut self, code: i64) -> Result<()> {
        self.released = true;
        let held = self.granted.elapsed();
        self.core.counters.holds.record(self.metric_kind(), held);
        tracing::debug!(lock = self.name(), fence = %self.fence, ?held, "released");
        self.outcome(code, Operation::Release, &self.core.counters.releases)
    }

    fn release_call(&self) -> ScriptCall {
        self.kind
            .release_call(&self.core, self.keys.lock_key(), &self.owner, &self.hold)
            .weighted(self.weight)
    }

    /// Hands the lock to `waiter` within the client when it can go without a call: a first hold
    /// (no re-entry, no [`Reentry`](crate::Reentry) handle), a fence left in the range reserved
    /// for its owner token within [`RESERVED_FOR`] of the call that reserved it, a lease with at least half its TTL left under a watchdog (which goes
    /// on renewing it under the same token) or 90% without one, and a waiter asking for the same
    /// lease, renewal and no maximum hold or a floor below the next fence. The waiter is given a
    /// hold of the same owner token, lease and watch with the next fence; this hold is done (its
    /// watch moved). Returns the waiter otherwise.
    fn hand_within(&mut self, handing: &'static Handing, waiter: Waiter) -> Option<Waiter> {
        let next = self.fence.get() + 1;
        let options = &waiter.options;
        let watch_matches = match &self.watched {
            Some(watched) => {
                options.watchdog
                    && watched.id.is_some()
                    && watched.max_hold.is_none()
                    && watched.every == options.renew_every
                    && watched.lease.get().ended.is_none()
            }
            None => !options.watchdog,
        };
        let lease_left = self.lease_mostly_left();
        let possible = self.hold.is_empty()
            && !self.shared.load(Ordering::Relaxed)
            && next <= self.last.get()
            && Instant::now() < self.reserved_until
            && watch_matches
            && lease_left
            && options.wait.is_none()
            && options.max_hold.is_none()
            && options.first_lease() == self.ttl
            && options.floor.is_none_or(|floor| floor.get() < next);
        let fence = FenceToken::new(next).filter(|_| possible);
        let Some(fence) = fence else {
            return Some(waiter);
        };
        let held = Held {
            core: Arc::clone(&self.core),
            kind: self.kind,
            keys: self.keys.clone(),
            owner: self.owner.clone(),
            hold: Box::default(),
            fence,
            granted: Instant::now(),
            valid_until: self.valid_until,
            watched: self.watched.take(),
            replicas_acked: None,
            released: false,
            handing: self.handing,
            ttl: self.ttl,
            last: self.last,
            reserved_until: self.reserved_until,
            shared: AtomicBool::new(false),
            weight: self.weight,
            cohort: false,
            linger: options.linger,
        };
        Counters::add(&self.core.counters.grants, self.metric_kind(), 1);
        Counters::add(&self.core.counters.handoffs, self.metric_kind(), 1);
        tracing::debug!(lock = self.name(), %fence, "handed over within the client");
        // A waiter gone meanwhile drops the guard, which hands the lock on or releases it.
        let _ = waiter.to.send(Handed::Granted((handing.wrap)(held)));
        None
    }

    /// Whether the lease has most of its TTL left, as a handoff within the client needs: half
    /// under a watchdog (which goes on renewing it), 90% without one.
    fn lease_mostly_left(&self) -> bool {
        let left = self.valid_until().saturating_duration_since(Instant::now());
        if self.watched.is_some() {
            left >= self.ttl / 2
        } else {
            left >= self.ttl.mul_f64(0.9)
        }
    }

    /// A call that releases this hold is about to go out: from now on the hold is never handed
    /// on without a call (a release cut or failed after it was sent drops the hold, and that
    /// drop must ask Redis, which knows whether the hold still exists).
    fn no_hand_within(&mut self) {
        self.last = self.fence;
    }

    /// Releases in the background (a guard dropped without `release`), handing the lock on
    /// when a task of this client waits for it.
    fn release_detached(&mut self) {
        let next = self
            .handing
            .and_then(|handing| Some((handing, self.core.handoffs.next(&self.keys)?)));
        let Some((handing, waiter)) = next else {
            self.unwatch();
            self.core
                .transport
                .run_detached(self.release_call(), Operation::Release);
            if self.handing.is_some() {
                self.core.handoffs.pass(&self.keys);
            }
            return;
        };
        let Some(waiter) = self.hand_within(handing, waiter) else {
            return;
        };
        self.unwatch();
        let (core, keys) = (Arc::clone(&self.core), self.keys.clone());
        let (owner, hold, cohort) = (self.owner.clone(), self.hold.clone(), self.cohort);
        self.core.transport.spawn_detached(async move {
            if let Err(err) = (handing.over)(&core, &keys, &owner, &hold, waiter, cohort).await {
                tracing::debug!(lock = keys.name(), error = %err, "background release failed");
            }
        });
    }

    /// The `kind` label of this hold's metrics.
    fn metric_kind(&self) -> &'static str {
        self.kind.kind.as_str()
    }

    /// Stops the watchdog for this hold.
    fn unwatch(&mut self) {
        if let Some(Watched { id: Some(id), .. }) = self.watched.take() {
            self.core.watchdog.unwatch(id);
        }
    }

    /// Maps the code `release` or `extend` answered to the caller's result, counting a success
    /// in `done` and a loss in `lost`.
    fn outcome(&self, code: i64, operation: Operation, done: &Counter) -> Result<()> {
        let name = self.keys.name();
        match Outcome::decode(name, operation, code)?.lost(name) {
            None => {
                Counters::add(done, self.metric_kind(), 1);
                Ok(())
            }
            Some(lost) => {
                Counters::add(&self.core.counters.lost, self.metric_kind(), 1);
                tracing::warn!(lock = %name, fence = %self.fence, operation = operation.as_str(), "lock lost");
                Err(lost)
            }
        }
    }
}

/// A hold whose release lingers in the client's local queue under `ticket`: released by the
/// background task unless a task of the client took it, or when that task is dropped (its
/// runtime shut down) before it ran.
struct Lingering {
    core: Arc<Core>,
    keys: LockKeys,
    ticket: u64,
}

impl Lingering {
    /// The hold, unless a task of the client took it meanwhile.
    fn take(&self) -> Option<Held> {
        let hold = self.core.handoffs.unlinger(&self.keys, self.ticket)?;
        hold.downcast::<Held>().ok().map(|held| *held)
    }
}

impl Drop for Lingering {
    fn drop(&mut self) {
        // Dropped, the hold releases in the background (a runtime still running) like any.
        drop(self.take());
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if !self.released {
            self.release_detached();
        }
        self.unwatch();
    }
}

/// Waits until the watchdog ends `watched`'s lease (or the lease runs out unconfirmed) and
/// returns why, as the error lock `name` reports.
async fn watch_lost(core: &Core, name: &str, watched: &Watched) -> Error {
    loop {
        let ended = core.watchdog.ended().notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        let lease = watched.lease.get();
        let now = tokio::time::Instant::now();
        match lease.ended {
            Some(Ended::MaxHold) if now < lease.valid_until => {}
            Some(why) => return why.into_error(name, watched.max_hold),
            None if now >= lease.valid_until => {
                return Ended::Unconfirmed.into_error(name, watched.max_hold)
            }
            None => {}
        }
        tokio::select! {
            () = ended => {}
            () = tokio::time::sleep_until(lease.valid_until) => {}
        }
    }
}
