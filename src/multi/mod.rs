//! The multi-lock: several mutexes, or several fair locks, taken as one guard, all or nothing,
//! under one deadline.
//!
//! Mutex keys of one slot are granted by one script (`lock_all.lua`). Otherwise (keys across
//! slots, and fair locks always) the members are taken one by one in one canonical order (by
//! slot, then key), whatever order the caller gave, so two callers never wait on each other in
//! a cycle; each member is first taken with a short provisional lease (kept alive while later
//! members are awaited), and extended to the full lease once all are held. On failure or
//! cancellation what was taken is released (and a fair member's place in its queue withdrawn).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::acquire::{self, replicas, Attempt, InFlight, Request};
use crate::client::Client;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::fair::{self, FairLockGuard};
use crate::fence::FenceToken;
use crate::held::{Grant, Held};
use crate::keys::LockKeys;
use crate::lock::{new_owner_token, Acquire, LockGuard, MUTEX};
use crate::options::{instant_after, LockOptions};
use crate::rwlock::{self, ReadGuard, WriteGuard};
use crate::script::{parse_fence, parse_reply, ttl_millis, ScriptCall, LOCK_ALL};

/// The most locks one multi-lock takes. When every member shares a slot they are taken by one
/// `lock_all` call, which reads and writes each: this bounds how long that call blocks the
/// server (about a millisecond at this count on a loaded test machine, `docs/design.md`,
/// "Bounded script work").
pub const MAX_MULTI_LOCKS: usize = 256;

/// A lock a multi-lock holds as a member: [`LockGuard`] (a mutex, [`Client::lock_all`]),
/// [`FairLockGuard`] (a fair lock, [`Client::fair_lock_all`]), [`ReadGuard`] or [`WriteGuard`]
/// (read or write holds of read-write locks, [`Client::read_lock_all`],
/// [`Client::write_lock_all`]). Sealed: implemented by those four guards only.
pub trait MultiMember: sealed::Member {}

impl MultiMember for LockGuard {}
impl MultiMember for FairLockGuard {}
impl MultiMember for ReadGuard {}
impl MultiMember for WriteGuard {}

pub(crate) mod sealed {
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Instant;

    use crate::core::Core;
    use crate::error::Result;
    use crate::held::Held;
    use crate::keys::LockKeys;
    use crate::options::LockOptions;

    /// What the multi-lock needs of a member guard: its held state, and how one member is
    /// taken (`deadline` `None`: one attempt).
    #[allow(private_interfaces)]
    pub trait Member: Sized + Send + Sync {
        fn held(&self) -> &Held;
        fn held_mut(&mut self) -> &mut Held;
        fn into_held(self) -> Held;
        fn take<'a>(
            core: &'a Arc<Core>,
            keys: &'a LockKeys,
            options: &'a LockOptions,
            deadline: Option<Instant>,
        ) -> impl Future<Output = Result<Self>> + Send + 'a;
    }
}

/// Waits under `deadline` (`None`: one attempt) for `request`.
async fn take_one<R: Request>(
    core: &Arc<Core>,
    request: &R,
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<R::Granted> {
    match deadline {
        None => acquire::once(core, request).await,
        Some(deadline) => {
            acquire::wait_observed(
                core,
                request,
                deadline.saturating_duration_since(Instant::now()),
                options.on_wait.as_ref(),
            )
            .await
        }
    }
}

/// A member's held state, through its guard's own accessors (`held::held_wrapper`).
macro_rules! member_held {
    ($guard:ident) => {
        fn held(&self) -> &Held {
            $guard::held(self)
        }

        fn held_mut(&mut self) -> &mut Held {
            $guard::held_mut(self)
        }

        fn into_held(self) -> Held {
            $guard::into_held(self)
        }
    };
}

// The sealed trait's methods name crate-private types on purpose: nothing outside the crate
// can name or call them.
#[allow(private_interfaces)]
impl sealed::Member for LockGuard {
    member_held!(LockGuard);

    async fn take<'a>(
        core: &'a Arc<Core>,
        keys: &'a LockKeys,
        options: &'a LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Self> {
        take_one(core, &Acquire { keys, options }, options, deadline).await
    }
}

#[allow(private_interfaces)]
impl sealed::Member for FairLockGuard {
    member_held!(FairLockGuard);

    async fn take<'a>(
        core: &'a Arc<Core>,
        keys: &'a LockKeys,
        options: &'a LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Self> {
        let request = fair::Acquire::new(core, keys, options, deadline.is_some());
        let bound = instant_after(
            deadline.unwrap_or_else(Instant::now),
            core.transport.request_timeout(),
        );
        let outcome = take_one(core, &request, options, deadline).await;
        if outcome.is_err() {
            // Within the call's bound; past it the request's drop withdraws in the background.
            let _ = tokio::time::timeout_at(bound.into(), request.withdraw()).await;
        }
        outcome
    }
}

#[allow(private_interfaces)]
impl sealed::Member for ReadGuard {
    member_held!(ReadGuard);

    async fn take<'a>(
        core: &'a Arc<Core>,
        keys: &'a LockKeys,
        options: &'a LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Self> {
        rwlock::take_read(core, keys, options, deadline).await
    }
}

#[allow(private_interfaces)]
impl sealed::Member for WriteGuard {
    member_held!(WriteGuard);

    async fn take<'a>(
        core: &'a Arc<Core>,
        keys: &'a LockKeys,
        options: &'a LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Self> {
        rwlock::take_write(core, keys, options, deadline).await
    }
}

/// Proof of holding several locks at once (a multi-lock), each with its own fence token.
///
/// Made by [`Client::lock_all`] or [`Client::try_lock_all`] (members are mutexes, the default
/// `G`), or by [`Client::fair_lock_all`] or [`Client::try_fair_lock_all`] (members are fair
/// locks: `MultiGuard<FairLockGuard>`). [`release`](Self::release) frees them all. Dropping an
/// unreleased guard releases every member in the background on the current Tokio runtime
/// (when there is one).
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// use fencelock::LockOptions;
///
/// let guard = client.lock_all(&["acct:1", "acct:2"], &LockOptions::new()).await?;
/// for (name, fence) in guard.fences() {
///     println!("{name}: {fence}"); // present each fence to the storage of its resource
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the locks at once"]
#[clippy::has_significant_drop]
pub struct MultiGuard<G: MultiMember = LockGuard> {
    /// The members, in the caller's order.
    members: Vec<G>,
}

impl<G: MultiMember> std::fmt::Debug for MultiGuard<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("fences", &self.fences())
            .field("valid_until", &self.valid_until())
            .finish_non_exhaustive()
    }
}

impl<G: MultiMember> MultiGuard<G> {
    /// The names held, in the order the caller gave.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|m| m.held().name())
    }

    /// Each name with its fence token, in the order the caller gave. Each lock keeps its own
    /// fence: present a member's fence to the storage that lock protects.
    pub fn fences(&self) -> Vec<(&str, FenceToken)> {
        self.members
            .iter()
            .map(|m| (m.held().name(), m.held().fence()))
            .collect()
    }

    /// The fence token of member `name`, or `None` when it is not a member.
    pub fn fence(&self, name: &str) -> Option<FenceToken> {
        self.member(name).map(|m| m.held().fence())
    }

    /// The guard of member `name`, or `None` when it is not a member.
    pub fn member(&self, name: &str) -> Option<&G> {
        self.members.iter().find(|m| m.held().name() == name)
    }

    /// Until when every member is surely valid: the earliest of the members'
    /// [`LockGuard::valid_until`].
    pub fn valid_until(&self) -> Instant {
        self.members
            .iter()
            .map(|m| m.held().valid_until())
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// True while every member is valid ([`LockGuard::is_valid`]).
    pub fn is_valid(&self) -> bool {
        self.members.iter().all(|m| m.held().is_valid())
    }

    /// Resolves when any member can no longer be relied on, with the first member's reason
    /// (see [`LockGuard::lost`]; the error names the member).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> Error {
        let mut watching: Vec<Pin<Box<dyn Future<Output = Error> + Send + '_>>> = self
            .members
            .iter()
            .map(|m| Box::pin(m.held().lost()) as Pin<Box<dyn Future<Output = Error> + Send + '_>>)
            .collect();
        std::future::poll_fn(|cx| {
            for lost in &mut watching {
                if let Poll::Ready(err) = lost.as_mut().poll(cx) {
                    return Poll::Ready(err);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Resets every member's TTL to `ttl` (see [`LockGuard::extend`]) and returns the new
    /// [`valid_until`](Self::valid_until).
    ///
    /// # Errors
    ///
    /// The first member's error ([`Error::Expired`], [`Error::NotOwner`], ...); the members
    /// after it are not extended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockGuard::extend`].
    pub async fn extend(&mut self, ttl: Duration) -> Result<Instant> {
        for member in &mut self.members {
            member.held_mut().extend(ttl).await?;
        }
        Ok(self.valid_until())
    }

    /// Releases every member (see [`LockGuard::release`]).
    ///
    /// # Errors
    ///
    /// The first member's error, in the caller's order ([`Error::Expired`] or
    /// [`Error::NotOwner`] when that lock was lost); every member is released all the same.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: members not yet released when the call is dropped are released in the
    /// background.
    pub async fn release(self) -> Result<()> {
        let mut first = Ok(());
        for member in self.members {
            let outcome = member.into_held().release().await;
            if first.is_ok() {
                first = outcome;
            }
        }
        first
    }
}

/// The one-slot request: every key granted by one script call, or none.
struct AcquireAll<'a> {
    /// The members, in the caller's order.
    keys: &'a [LockKeys],
    options: &'a LockOptions,
    /// The member last found busy: its name in errors, its channel for the wake-up.
    busy: AtomicUsize,
}

impl AcquireAll<'_> {
    fn busy_keys(&self) -> &LockKeys {
        &self.keys[self.busy.load(Ordering::Relaxed).min(self.keys.len() - 1)]
    }
}

impl Request for AcquireAll<'_> {
    type Granted = Vec<LockGuard>;

    fn name(&self) -> &str {
        self.busy_keys().name()
    }

    fn channel(&self) -> &str {
        self.busy_keys().lock_key()
    }

    async fn attempt(&self, core: &Arc<Core>) -> Result<Attempt<Vec<LockGuard>>> {
        let (keys, options) = (self.keys, self.options);
        let name = keys[0].name();
        let owner = new_owner_token(core.tag());
        let started = Instant::now();
        let lease = options.first_lease();
        let ttl_ms = ttl_millis(lease);
        let floor = core.floor(options).to_string();
        let lock_keys: Vec<&str> = keys.iter().map(LockKeys::lock_key).collect();
        let call = ScriptCall::new(
            &LOCK_ALL,
            &lock_keys,
            &[&owner, &ttl_ms, &floor, core.fence_arg(), core.expiry()],
        );
        let undos: Vec<ScriptCall> = lock_keys
            .iter()
            .map(|key| MUTEX.release_call(core, key, &owner, ""))
            .collect();
        let in_flight: Vec<InFlight> = undos
            .iter()
            .map(|undo| InFlight::arm(&core.transport, undo.clone()))
            .collect();
        let (reply, acks) =
            replicas::run_granting(core, &call, name, "acquire", options.wait).await?;
        let reply = parse_reply::<Vec<i64>>(name, "acquire", reply)?;
        let unexpected = |detail: String| Error::UnexpectedReply {
            name: name.to_owned(),
            operation: "acquire",
            detail,
        };
        match reply.as_slice() {
            [1 | 2, behind, fences @ ..] if fences.len() == keys.len() => {
                if *behind > 0 {
                    core.clock_behind("mutex", name, *behind);
                }
                let fences = fences
                    .iter()
                    .zip(keys)
                    .map(|(fence, k)| parse_fence(k.name(), "acquire", "fence", *fence))
                    .collect::<Result<Vec<_>>>()?;
                in_flight.into_iter().for_each(InFlight::disarm);
                let replicas_acked =
                    match replicas::confirm(core, "mutex", name, acks, || undos[0].clone()).await {
                        Ok(acked) => acked,
                        Err(err) => {
                            for undo in &undos[1..] {
                                let _ = core.transport.run(undo, name, "release").await;
                            }
                            return Err(err);
                        }
                    };
                tracing::debug!(lock = name, members = keys.len(), "acquired all");
                let guards = keys
                    .iter()
                    .zip(fences)
                    .map(|(k, fence)| {
                        let grant = Grant {
                            weight: 1,
                            keys: k.clone(),
                            owner: owner.clone(),
                            hold: String::new(),
                            fence,
                            sent: started,
                            ttl: lease,
                            replicas_acked,
                        };
                        LockGuard::new(Held::new(core, &MUTEX, grant, options))
                    })
                    .collect();
                Ok(Attempt::Granted(guards))
            }
            [0, pttl, index] => {
                in_flight.into_iter().for_each(InFlight::disarm);
                let index = usize::try_from(*index).unwrap_or(1).max(1) - 1;
                self.busy
                    .store(index.min(keys.len() - 1), Ordering::Relaxed);
                Ok(Attempt::Busy {
                    retry_after: Duration::from_millis(u64::try_from(*pttl).unwrap_or(0)),
                })
            }
            other => Err(unexpected(format!("{other:?}"))),
        }
    }
}

/// The provisional lease of a member taken across slots: short, so that a caller that dies
/// while collecting leaves little behind, but a few request timeouts long, so that extending it
/// to the full lease has time to arrive. Above the chosen renewal period, so that the watchdog
/// renews it in time.
fn provisional_lease(core: &Core, options: &LockOptions) -> Duration {
    let short = (core.transport.request_timeout() * 4).max(Duration::from_secs(1));
    let short = short.max(options.renew_every.map_or(Duration::ZERO, |e| e * 2));
    options.first_lease().min(short)
}

/// Takes the members across slots, in canonical order, one after the other; `deadline` bounds
/// the waiting (`None`: one attempt each). Earlier members are kept alive while a later one is
/// awaited. Returns the guards in canonical order, with their index in the caller's order.
async fn collect<G: MultiMember>(
    core: &Arc<Core>,
    keys: &[LockKeys],
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<Vec<G>> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| {
        (keys[a].slot(), keys[a].lock_key()).cmp(&(keys[b].slot(), keys[b].lock_key()))
    });
    let lease = provisional_lease(core, options);
    let mut provisional = options.clone();
    provisional.ttl = lease;
    let keep_alive = (lease / 3).max(Duration::from_millis(1));
    let mut taken: Vec<(usize, G)> = Vec::with_capacity(keys.len());
    for &index in &order {
        // Boxed and erased: the nested wait futures of both member kinds otherwise make the
        // compiler's layout queries overflow their depth limit in a clean build.
        let mut waiting: Pin<Box<dyn Future<Output = Result<G>> + Send + '_>> =
            Box::pin(G::take(core, &keys[index], &provisional, deadline));
        let outcome = loop {
            tokio::select! {
                outcome = &mut waiting => break outcome,
                () = tokio::time::sleep(keep_alive), if !taken.is_empty() => {
                    let mut kept = Ok(());
                    for (_, guard) in &mut taken {
                        if let Err(err) = guard.held_mut().extend(lease).await {
                            kept = Err(err);
                            break;
                        }
                    }
                    if let Err(err) = kept {
                        break Err(err);
                    }
                }
            }
        };
        match outcome {
            Ok(guard) => taken.push((index, guard)),
            Err(err) => {
                release_all(taken).await;
                return Err(err);
            }
        }
    }
    let full = options.first_lease();
    if full > lease {
        for i in 0..taken.len() {
            if let Err(err) = taken[i].1.held_mut().extend(full).await {
                release_all(taken).await;
                return Err(err);
            }
        }
    }
    taken.sort_by_key(|(index, _)| *index);
    Ok(taken.into_iter().map(|(_, guard)| guard).collect())
}

/// Releases the members taken before a failure (errors ignored: what cannot be released
/// expires with its short lease).
async fn release_all<G: MultiMember>(taken: Vec<(usize, G)>) {
    for (_, guard) in taken {
        let _ = guard.into_held().release().await;
    }
}

impl Client {
    /// Acquires every lock in `names` as one guard, all or nothing, waiting while any is held
    /// by another owner, for up to `options.timeout` in all.
    ///
    /// `options` apply to every member (TTL, watchdog, floor, placement). When all keys share
    /// one slot (a [`LockOptions::tag`] or [`LockOptions::slot`], or a standalone server with
    /// such a placement) one script call grants them all atomically. Otherwise the members are
    /// taken in one canonical order (by slot, then key) whatever order `names` has, so callers
    /// asking for overlapping sets in different orders never deadlock; each is first taken with
    /// a short provisional lease and extended to the full lease once all are held. On failure
    /// the members taken are released.
    ///
    /// With the watchdog on, each member is renewed (one call per node per batch).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let guard = client
    ///     .lock_all(&["acct:1", "acct:2"], &LockOptions::new().tag("accounts"))
    ///     .await?; // one script call: the two keys share a slot
    /// let fence = guard.fence("acct:1");
    /// # drop(fence);
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for no names, more than [`MAX_MULTI_LOCKS`], a name given
    /// twice or bad options; [`Error::InvalidName`] for a bad name; [`Error::Busy`] naming the member still held at the
    /// timeout; the errors of [`lock`](Self::lock) otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing (members taken are released in the
    /// background).
    pub async fn lock_all(&self, names: &[&str], options: &LockOptions) -> Result<MultiGuard> {
        let deadline = instant_after(Instant::now(), options.timeout);
        self.lock_all_until(names, options, Some(deadline)).await
    }

    /// Acquires every lock in `names` as one guard if each is free now: one attempt per member
    /// (one script call when all keys share a slot), no waiting; as
    /// [`lock_all`](Self::lock_all) otherwise.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let both = client.try_lock_all(&["account:1", "account:2"], &LockOptions::new()).await?;
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] naming a member held by another owner (nothing is left held); as
    /// [`lock_all`](Self::lock_all) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`lock_all`](Self::lock_all).
    pub async fn try_lock_all(&self, names: &[&str], options: &LockOptions) -> Result<MultiGuard> {
        self.lock_all_until(names, options, None).await
    }

    async fn lock_all_until(
        &self,
        names: &[&str],
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<MultiGuard> {
        let keys = self.multi_keys(names, options, Client::keys)?;
        let core = self.core();
        let one_slot = keys.iter().all(|k| k.slot() == keys[0].slot());
        let span = tracing::debug_span!(
            "fencelock.lock_all",
            lock = names.join(" "),
            kind = "lock",
            one_slot
        );
        async {
            let members = if one_slot {
                let request = AcquireAll {
                    keys: &keys,
                    options,
                    busy: AtomicUsize::new(0),
                };
                match deadline {
                    None => acquire::once(core, &request).await?,
                    Some(deadline) => {
                        acquire::wait_observed(
                            core,
                            &request,
                            deadline.saturating_duration_since(Instant::now()),
                            options.on_wait.as_ref(),
                        )
                        .await?
                    }
                }
            } else {
                collect(core, &keys, options, deadline).await?
            };
            Ok(MultiGuard { members })
        }
        .instrument(span)
        .await
    }

    /// The members' keys (`keys_of` a name: the mutex's or the fair lock's), checked: at least
    /// one, at most [`MAX_MULTI_LOCKS`], no duplicates.
    fn multi_keys(
        &self,
        names: &[&str],
        options: &LockOptions,
        keys_of: fn(&Client, &str, &LockOptions) -> Result<LockKeys>,
    ) -> Result<Vec<LockKeys>> {
        let invalid = |name: &str, reason: String| Error::InvalidOptions {
            name: name.to_owned(),
            reason,
        };
        let Some(first) = names.first() else {
            return Err(invalid("", "lock_all needs at least one name".into()));
        };
        if names.len() > MAX_MULTI_LOCKS {
            return Err(invalid(
                first,
                format!(
                    "{} names are more than one multi-lock takes ({MAX_MULTI_LOCKS})",
                    names.len()
                ),
            ));
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(invalid(
                    name,
                    "the name is given twice: a multi-lock takes each lock once".into(),
                ));
            }
        }
        options.validate(first)?;
        names
            .iter()
            .map(|name| keys_of(self, name, options))
            .collect()
    }

    /// Acquires every fair lock in `names` as one guard, all or nothing, each in its own
    /// queue, waiting for up to `options.timeout` in all.
    ///
    /// The members are taken one by one in one canonical order (by slot, then key) whatever
    /// order `names` has, so callers asking for overlapping sets never deadlock; each waits its
    /// turn in its lock's queue (arrival order) with a short provisional lease once granted,
    /// extended to the full lease once all are held. There is no one-script path for fair locks:
    /// a queue's order is per lock, so even keys of one slot are taken one by one. On failure
    /// the members taken are released and the place in the queue being waited in is withdrawn.
    /// `options` apply to every member; a member is the same key as
    /// [`fair_lock`](Self::fair_lock) of its name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let guard = client
    ///     .fair_lock_all(&["dock:1", "crane:7"], &LockOptions::new())
    ///     .await?;
    /// for (name, fence) in guard.fences() {
    ///     println!("{name}: {fence}");
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock_all`](Self::lock_all): [`Error::InvalidOptions`] for no names, too many, a
    /// name given twice or bad options; [`Error::Busy`] naming the member still held at the
    /// timeout; the errors of [`fair_lock`](Self::fair_lock) otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing and leaves no place in any queue (members
    /// taken are released, the waiting place withdrawn, in the background).
    pub async fn fair_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<FairLockGuard>> {
        let deadline = instant_after(Instant::now(), options.timeout);
        self.fair_lock_all_until(names, options, Some(deadline))
            .await
    }

    /// Acquires every fair lock in `names` as one guard if each is free now and no one queues
    /// for it: one attempt per member, in canonical order, no waiting; as
    /// [`fair_lock_all`](Self::fair_lock_all) otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] naming a member held or queued for by another owner (nothing is left
    /// held or queued); as [`fair_lock_all`](Self::fair_lock_all) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`fair_lock_all`](Self::fair_lock_all).
    pub async fn try_fair_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<FairLockGuard>> {
        self.fair_lock_all_until(names, options, None).await
    }

    /// Takes a read hold of every read-write lock in `names` as one guard, all or nothing,
    /// waiting while a writer holds or waits for any of them, for up to `options.timeout` in
    /// all.
    ///
    /// The members are taken one by one in one canonical order (by slot, then key) whatever
    /// order `names` has, as [`fair_lock_all`](Self::fair_lock_all) takes its members: each
    /// read hold first with a short provisional lease, extended to the full lease once all are
    /// held; on failure the holds taken are released. Each member is the read hold
    /// [`read_lock`](Self::read_lock) of its name takes (its own fence and lease, shared with
    /// other readers). `options` apply to every member.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let reads = client
    ///     .read_lock_all(&["catalog", "prices"], &LockOptions::new())
    ///     .await?;
    /// for (name, fence) in reads.fences() {
    ///     println!("reading {name} under fence {fence}");
    /// }
    /// reads.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock_all`](Self::lock_all): [`Error::InvalidOptions`] for no names, too many, a
    /// name given twice or bad options; [`Error::Busy`] naming the member a writer still held
    /// or waited for at the timeout; the errors of [`read_lock`](Self::read_lock) otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing (holds taken are released in the background).
    pub async fn read_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<ReadGuard>> {
        let deadline = instant_after(Instant::now(), options.timeout);
        self.rw_lock_all_until(names, options, Some(deadline), "fencelock.read_lock_all")
            .await
    }

    /// Takes a read hold of every read-write lock in `names` as one guard if no writer holds
    /// or waits for any of them now: one attempt per member, in canonical order, no waiting; as
    /// [`read_lock_all`](Self::read_lock_all) otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] naming a member a writer holds or waits for (nothing is left held); as
    /// [`read_lock_all`](Self::read_lock_all) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`read_lock_all`](Self::read_lock_all).
    pub async fn try_read_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<ReadGuard>> {
        self.rw_lock_all_until(names, options, None, "fencelock.try_read_lock_all")
            .await
    }

    /// Takes the write hold of every read-write lock in `names` as one guard, all or nothing,
    /// waiting for up to `options.timeout` in all.
    ///
    /// The members are taken one by one in canonical order (by slot, then key), as
    /// [`read_lock_all`](Self::read_lock_all) does; while a member is awaited it carries this
    /// call's writer intent, as [`write_lock`](Self::write_lock), so new readers of that lock
    /// wait behind it. On failure the holds taken are released and the intent withdrawn.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let writes = client
    ///     .write_lock_all(&["catalog", "prices"], &LockOptions::new())
    ///     .await?;
    /// let fence = writes.fence("prices"); // present it to the prices' storage
    /// # drop(fence);
    /// writes.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`read_lock_all`](Self::read_lock_all); [`Error::Busy`] naming the member still held
    /// (by readers or a writer) at the timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing and leaves no intent (both undone in the
    /// background).
    pub async fn write_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<WriteGuard>> {
        let deadline = instant_after(Instant::now(), options.timeout);
        self.rw_lock_all_until(names, options, Some(deadline), "fencelock.write_lock_all")
            .await
    }

    /// Takes the write hold of every read-write lock in `names` as one guard if each is free
    /// now: one attempt per member, in canonical order, no waiting and no intent left; as
    /// [`write_lock_all`](Self::write_lock_all) otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] naming a member held or waited for by another owner (nothing is left
    /// held); as [`write_lock_all`](Self::write_lock_all) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`write_lock_all`](Self::write_lock_all).
    pub async fn try_write_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<WriteGuard>> {
        self.rw_lock_all_until(names, options, None, "fencelock.try_write_lock_all")
            .await
    }

    async fn rw_lock_all_until<G: MultiMember>(
        &self,
        names: &[&str],
        options: &LockOptions,
        deadline: Option<Instant>,
        call: &'static str,
    ) -> Result<MultiGuard<G>> {
        let keys = self.multi_keys(names, options, Client::rwlock_keys)?;
        let span = tracing::debug_span!(
            "fencelock.rw_lock_all",
            call,
            lock = names.join(" "),
            kind = "rw"
        );
        let members = collect(self.core(), &keys, options, deadline)
            .instrument(span)
            .await?;
        Ok(MultiGuard { members })
    }

    async fn fair_lock_all_until(
        &self,
        names: &[&str],
        options: &LockOptions,
        deadline: Option<Instant>,
    ) -> Result<MultiGuard<FairLockGuard>> {
        let keys = self.multi_keys(names, options, Client::fair_keys)?;
        let span = tracing::debug_span!(
            "fencelock.fair_lock_all",
            lock = names.join(" "),
            kind = fair::KIND
        );
        let members = collect(self.core(), &keys, options, deadline)
            .instrument(span)
            .await?;
        Ok(MultiGuard { members })
    }
}
