//! The semaphore with expiring permits: `limit` numbered permits, each granted with its own
//! fence and lease. This file is the [`Semaphore`] handle and its acquire [`Request`];
//! `guard.rs` the [`PermitGuard`], a thin wrapper around [`Held`].
//!
//! The state is one hash, `<prefix>:{NAME}:sem` (see `docs/primitives.md`): the limit, the
//! fence counter, one entry per permit number (`p:<n>` = owner, lease end, fence), the
//! reservation of the first waiting many-permit requester (`r`) and an index of free numbers
//! and holders, so a grant reads only what it takes (`script/lua/semaphore.lua`). Available
//! permits are derived from the live entries, never from the index.

mod guard;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::acquire::{self, Attempt, GrantReply, Granting, InFlight, Request};
use crate::client::Client;
use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::held::Held;
use crate::keys::{LockKeys, Placement};
use crate::kind::Kind;
use crate::options::LockOptions;
use crate::script::{
    parse_fence, parse_reply, ttl_millis, ScriptCall, SEMAPHORE_ACQUIRE, SEMAPHORE_AVAILABLE,
    SEMAPHORE_SET_LIMIT,
};

use guard::SEMAPHORE;
pub use guard::{Permit, PermitGuard};

/// The most permits a semaphore can have: the highest limit [`Client::semaphore`] and
/// [`Semaphore::set_limit`] accept.
///
/// An acquire that finds no trusted index, or too few free numbers in it, and `available`,
/// `set_limit`, inspection and forced unlocks read all of a semaphore's permit entries (one per
/// live permit, plus those that died since the last scan), so the limit bounds how long one
/// call blocks the server: at this limit, with every permit held by another owner, no call ran longer than a
/// few milliseconds on a loaded test machine (`docs/design.md`, "Bounded script work"; test
/// `script_bounds::calls_at_the_documented_maxima_stay_within_a_few_milliseconds`). A larger
/// limit is refused with [`Error::InvalidOptions`] before anything is sent.
///
/// [`Client::semaphore`]: crate::Client::semaphore
///
/// # Examples
///
/// ```
/// assert_eq!(fencelock::MAX_PERMITS, 256);
/// ```
pub const MAX_PERMITS: u32 = 256;

/// The most permits one call can take at once ([`Semaphore::acquire_many`],
/// [`Semaphore::try_acquire_many`]); also at most the semaphore's limit. A larger count is
/// refused with [`Error::InvalidOptions`] before anything is sent.
///
/// # Examples
///
/// ```
/// assert!(fencelock::MAX_PERMITS_PER_CALL <= fencelock::MAX_PERMITS);
/// ```
pub const MAX_PERMITS_PER_CALL: u32 = MAX_PERMITS;

/// What a call that reads `entries` permit entries weighs in a batch, in mutex calls: an
/// acquire may scan every entry (up to the limit), a release, extend or renewal reads only its
/// own permits; a semaphore call costs about two mutex calls, and each entry about a quarter more.
fn weight(entries: u32) -> u32 {
    2 + entries / 4
}

/// A handle on the semaphore `NAME` with `limit` permits (from
/// [`Client::semaphore`](crate::Client::semaphore)). Cheap to clone; holds no permit itself.
///
/// Each grant is one or more numbered permits (`0..limit`), each with its own fence token and
/// lease: a crashed holder's permits come back when their lease ends. Every user of a semaphore
/// gives the same limit; the first use stores it, and [`set_limit`](Self::set_limit) changes it.
/// The limit is at most [`MAX_PERMITS`], which bounds how long one call blocks Redis.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// use fencelock::LockOptions;
///
/// let pool = client.semaphore("gpu-pool", 4)?;
/// let permit = pool.acquire(&LockOptions::new()).await?;
/// println!("permit {} fence {}", permit.permits()[0].number, permit.fence());
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    core: Arc<Core>,
    keys: LockKeys,
    limit: Arc<AtomicU32>,
    /// The limit a `set_limit` of this handle (or a clone) is storing, 0 when none is: an
    /// attempt that finds it stored already retries with it.
    setting: Arc<AtomicU32>,
}

impl std::fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.keys.name())
            .field("key", &self.keys.lock_key())
            .field("limit", &self.limit())
            .finish_non_exhaustive()
    }
}

impl Semaphore {
    /// The handle for `name` with `limit` permits, its key placed by the name.
    pub(crate) fn new(core: &Arc<Core>, name: &str, limit: u32) -> Result<Self> {
        let keys = LockKeys::of_kind(
            &core.prefix,
            name,
            &Placement::ByName,
            Kind::Semaphore.key_suffix(),
        )?;
        validate_limit(name, limit)?;
        Ok(Self {
            core: Arc::clone(core),
            keys,
            limit: Arc::new(AtomicU32::new(limit)),
            setting: Arc::new(AtomicU32::new(0)),
        })
    }

    /// The same semaphore with its key placed by `placement` (a slot or a hash tag) instead of
    /// by its name. The handle's placement is the one used: [`LockOptions::slot`] and
    /// [`LockOptions::tag`] given to its calls are not.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a slot beyond 16383 or an empty tag.
    pub fn with_placement(self, placement: &Placement) -> Result<Self> {
        let keys = LockKeys::of_kind(
            &self.core.prefix,
            self.keys.name(),
            placement,
            Kind::Semaphore.key_suffix(),
        )?;
        Ok(Self { keys, ..self })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The Redis key and slot of the semaphore.
    pub fn keys(&self) -> &LockKeys {
        &self.keys
    }

    /// The number of permits this handle (and its clones) asks for, as given or last set.
    pub fn limit(&self) -> u32 {
        self.limit.load(Ordering::Relaxed)
    }

    /// One attempt to take one permit.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when every permit is held (or the free ones are reserved for a waiting
    /// many-permit requester); [`Error::LimitMismatch`] when the semaphore has another limit;
    /// otherwise as [`Client::try_lock`](crate::Client::try_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped after the request was sent, a background task
    /// releases whatever the request may have taken.
    pub async fn try_acquire(&self, options: &LockOptions) -> Result<PermitGuard> {
        self.try_acquire_many(1, options).await
    }

    /// One attempt to take `count` permits at once: all of them or none.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when `count` is 0, above the limit or above
    /// [`MAX_PERMITS_PER_CALL`] (before anything is sent); [`Error::LimitBelowCount`] when
    /// [`set_limit`](Self::set_limit) of this handle lowered the limit below `count`; otherwise
    /// as [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn try_acquire_many(&self, count: u32, options: &LockOptions) -> Result<PermitGuard> {
        let request = self.request(count, options, String::new())?;
        let span = self.span("try_acquire", count);
        acquire::once(&self.core, &request).instrument(span).await
    }

    /// Takes one permit, waiting for up to `options.timeout` while all are held.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let renderers = client.semaphore("renderers", 8)?;
    /// let permit = renderers.acquire(&LockOptions::new()).await?;
    /// // permit.permits() carries the permit's number and fence
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire_many`](Self::acquire_many).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_many`](Self::acquire_many).
    pub async fn acquire(&self, options: &LockOptions) -> Result<PermitGuard> {
        self.acquire_many(1, options).await
    }

    /// Takes `count` permits at once (all or none), waiting for up to `options.timeout`: woken
    /// when permits are released, else when the first held permit's lease ends.
    ///
    /// A waiter for more than one permit that finds too few free reserves them: while its
    /// reservation lives, others are granted only permits that leave enough for it, so a
    /// stream of single-permit takers cannot starve it. The reservation is refreshed by the
    /// waiter's attempts, removed when it is granted, withdrawn when the call ends without a
    /// grant (timeout, error, dropped), and expires one TTL after the last attempt if the
    /// waiter dies.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let pool = client.semaphore("db-connections", 16)?;
    /// let options = LockOptions::new().timeout(Duration::from_secs(5));
    /// let batch = pool.acquire_many(4, &options).await?;
    /// for permit in batch.permits() {
    ///     println!("permit {} fence {}", permit.number, permit.fence);
    /// }
    /// batch.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when not enough permits freed up in time; [`Error::LimitMismatch`] when
    /// the semaphore has another limit; [`Error::InvalidOptions`] when `count` is 0, above the
    /// limit or above [`MAX_PERMITS_PER_CALL`] (before anything is sent);
    /// [`Error::LimitBelowCount`] at once when [`set_limit`](Self::set_limit) of this handle (or
    /// a clone) lowers the limit below `count` while the call waits (its reservation is
    /// withdrawn); [`Error::Timeout`] or [`Error::Redis`] when Redis kept failing;
    /// [`Error::ReplicasNotConfirmed`] as for [`Client::lock`](crate::Client::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds no permit (an attempt in flight is released in the
    /// background), its reservation is withdrawn in the background, and its registration on
    /// the semaphore's channel is dropped with it. The only tasks it leaves are these background
    /// calls, which end once Redis answers or the request times out (`Client::shutdown` waits
    /// for them).
    pub async fn acquire_many(&self, count: u32, options: &LockOptions) -> Result<PermitGuard> {
        let waiter = if count > 1 {
            crate::owner::id()
        } else {
            String::new()
        };
        let request = self.request(count, options, waiter)?;
        // A many-permit waiter may leave a reservation: withdrawn unless the grant consumed it.
        let withdraw = (!request.waiter.is_empty()).then(|| {
            // Without permit numbers the release reads the waiter's index entry (none: a waiter
            // holds no permit), weighed as before the index.
            let call = SEMAPHORE
                .release_call(&self.core, self.keys.lock_key(), &request.waiter, "")
                .weighted(weight(self.limit()));
            InFlight::arm(&self.core.transport, call)
        });
        let span = self.span("acquire", count);
        let result = acquire::wait_observed(
            &self.core,
            &request,
            options.timeout,
            options.on_wait.as_ref(),
        )
        .instrument(span)
        .await;
        if let (Ok(_), Some(withdraw)) = (&result, withdraw) {
            withdraw.disarm();
        }
        result
    }

    /// How many permits are free now: the limit minus the live permits (never below 0).
    ///
    /// # Errors
    ///
    /// [`Error::LimitMismatch`] when the semaphore has another limit; [`Error::Timeout`] or
    /// [`Error::Redis`] when Redis does not answer in time or fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn available(&self) -> Result<u32> {
        let name = self.name();
        let call = ScriptCall::new(
            &SEMAPHORE_AVAILABLE,
            &[self.keys.lock_key()],
            &[self.core.expiry()],
        );
        let span = self.span("available", 0);
        let reply = self
            .core
            .transport
            .run(&call, name, Operation::Available)
            .instrument(span)
            .await?;
        let (stored, live) = parse_reply::<(u32, u32)>(name, Operation::Available, reply)?;
        let limit = self.limit();
        if stored != 0 && stored != limit {
            return Err(Error::LimitMismatch {
                name: name.to_owned(),
                stored,
                requested: limit,
            });
        }
        Ok(limit.saturating_sub(live))
    }

    /// Changes the semaphore's limit to `limit` in one call, for every user; this handle and
    /// its clones ask for the new limit from now on, including their calls already waiting
    /// (other handles get [`Error::LimitMismatch`] until they use the new one). Raising it
    /// wakes waiters, so they are let in at once. Permits held above a lowered limit stay
    /// valid until released or expired and count against the new limit meanwhile. A waiting
    /// [`acquire_many`](Self::acquire_many) of this handle for more permits than the new limit
    /// ends with [`Error::LimitBelowCount`], and a reservation for more than the new limit (of
    /// any waiter) is removed, so it blocks no one. Returns the limit stored before (`None`
    /// when none was).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for a limit of 0 or above [`MAX_PERMITS`] (before anything is
    /// sent); [`Error::OutOfMemory`], [`Error::Timeout`] or [`Error::Redis`] when Redis
    /// refuses, does not answer or fails.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have changed the limit; this handle keeps its old one
    /// (until one of its waiting calls finds the new one stored, and takes it).
    pub async fn set_limit(&self, limit: u32) -> Result<Option<u32>> {
        let name = self.name();
        validate_limit(name, limit)?;
        let limit_arg = limit.to_string();
        let call = ScriptCall::new(
            &SEMAPHORE_SET_LIMIT,
            &[self.keys.lock_key()],
            &[
                &limit_arg,
                self.core.transport.announce(),
                self.core.expiry(),
            ],
        );
        let span = self.span("set_limit", limit);
        self.setting.store(limit, Ordering::Relaxed);
        let reply = self
            .core
            .transport
            .run(&call, name, Operation::SetLimit)
            .instrument(span)
            .await;
        let before = reply.and_then(|reply| parse_reply::<u32>(name, Operation::SetLimit, reply));
        if before.is_ok() {
            self.limit.store(limit, Ordering::Relaxed);
        }
        let _ = self
            .setting
            .compare_exchange(limit, 0, Ordering::Relaxed, Ordering::Relaxed);
        let before = before?;
        Ok((before != 0).then_some(before))
    }

    fn request<'a>(
        &'a self,
        count: u32,
        options: &'a LockOptions,
        waiter: String,
    ) -> Result<Acquire<'a>> {
        let name = self.name();
        options.validate(name)?;
        let limit = self.limit();
        if count > MAX_PERMITS_PER_CALL {
            return Err(Error::InvalidOptions {
                name: name.to_owned(),
                reason: format!(
                    "cannot take {count} permits of semaphore {name:?} in one call: ask for 1 \
                     to {MAX_PERMITS_PER_CALL} (one call's work on the server grows with the \
                     count)"
                ),
            });
        }
        if count == 0 || count > limit {
            return Err(Error::InvalidOptions {
                name: name.to_owned(),
                reason: format!(
                    "cannot take {count} permits of semaphore {name:?}, which has {limit}: ask \
                     for 1 to {limit}"
                ),
            });
        }
        Ok(Acquire {
            keys: &self.keys,
            options,
            count,
            limit: &self.limit,
            setting: &self.setting,
            waiter,
        })
    }

    fn span(&self, call: &'static str, count: u32) -> tracing::Span {
        tracing::debug_span!(
            "fencelock.semaphore",
            call,
            name = self.name(),
            kind = crate::kind::Kind::Semaphore.as_str(),
            slot = self.keys.slot(),
            count
        )
    }
}

fn validate_limit(name: &str, limit: u32) -> Result<()> {
    if limit == 0 {
        return Err(Error::InvalidOptions {
            name: name.to_owned(),
            reason: "a semaphore needs at least 1 permit: give a limit of 1 or more".into(),
        });
    }
    if limit > MAX_PERMITS {
        return Err(Error::InvalidOptions {
            name: name.to_owned(),
            reason: format!(
                "semaphore {name:?} cannot have {limit} permits: give a limit of 1 to \
                 {MAX_PERMITS} (every call reads each permit's entry, so the limit bounds how \
                 long one call blocks Redis); split a larger pool into several semaphores"
            ),
        });
    }
    Ok(())
}

/// One acquisition of `count` permits.
struct Acquire<'a> {
    keys: &'a LockKeys,
    options: &'a LockOptions,
    count: u32,
    /// The handle's limit, read at every attempt: a waiting call follows `set_limit` of its
    /// handle (and the handle's clones).
    limit: &'a AtomicU32,
    /// The limit a `set_limit` of the handle is storing (0: none).
    setting: &'a AtomicU32,
    /// The waiting call's id, which may hold a reservation; empty for none.
    waiter: String,
}

impl Request for Acquire<'_> {
    type Granted = PermitGuard;

    fn name(&self) -> &str {
        self.keys.name()
    }

    fn channel(&self) -> &str {
        self.keys.lock_key()
    }

    /// One acquire request under a fresh owner token, as the mutex's.
    async fn attempt(&self, core: &Arc<Core>) -> Result<Attempt<PermitGuard>> {
        let (keys, options, name) = (self.keys, self.options, self.keys.name());
        let owner = crate::owner::token(core.tag());
        let requested = self.limit.load(Ordering::Relaxed);
        if self.count > requested {
            // `set_limit` of this handle (or a clone) lowered the limit below the count while
            // the call waited: it can never be granted. The caller's withdrawal removes its
            // reservation (the script already ignores one above the limit).
            return Err(Error::LimitBelowCount {
                name: name.to_owned(),
                count: self.count,
                limit: requested,
            });
        }
        // The undo's release has no permit numbers: it reads them from the owner's index entry,
        // weighed as an acquire for the batch (as before the index).
        let granting = Granting::new(core, &SEMAPHORE, keys, Operation::Acquire, &owner, options)
            .undo_weighted(weight(requested));
        let ttl_ms = ttl_millis(granting.lease());
        let floor = core.floor(options).to_string();
        let (count, limit) = (self.count.to_string(), requested.to_string());
        let call = ScriptCall::new(
            &SEMAPHORE_ACQUIRE,
            &[keys.lock_key()],
            &[
                &owner,
                &count,
                &limit,
                &ttl_ms,
                &floor,
                core.fence_arg(),
                &self.waiter,
                core.expiry(),
            ],
        )
        .weighted(weight(requested));
        let unexpected = |reply: &[i64]| Error::UnexpectedReply {
            name: name.to_owned(),
            operation: Operation::Acquire,
            detail: format!("{reply:?}"),
        };
        match granting.send(&call).await? {
            (
                GrantReply::Granted {
                    fence,
                    behind,
                    rest: numbered,
                    ..
                },
                acks,
            ) if numbered.len() == 2 * self.count as usize => {
                let mut permits = Vec::with_capacity(numbered.len() / 2);
                for pair in numbered.chunks_exact(2) {
                    permits.push(Permit {
                        number: u32::try_from(pair[0]).map_err(|_| unexpected(&numbered))?,
                        fence: parse_fence(name, Operation::Acquire, "fence", pair[1])?,
                    });
                }
                let numbers: Vec<String> = permits.iter().map(|p| p.number.to_string()).collect();
                let grant = granting
                    .finish(
                        fence,
                        behind,
                        acks,
                        numbers.join(" "),
                        weight(self.count),
                        None,
                    )
                    .await?;
                tracing::debug!(semaphore = name, ?permits, "acquired");
                let held = Held::new(core, &SEMAPHORE, grant, options);
                Ok(Attempt::Granted(PermitGuard::new(held, permits)))
            }
            (GrantReply::Busy { retry_after, .. }, _) => Ok(granting.busy(retry_after)),
            (GrantReply::Own { status: -1, rest }, _) if rest.len() == 1 => {
                granting.disarm();
                let stored = u32::try_from(rest[0]).map_err(|_| unexpected(&rest))?;
                let current = self.limit.load(Ordering::Relaxed);
                let setting = self.setting.load(Ordering::Relaxed);
                if stored != requested && (stored == current || stored == setting) {
                    // `set_limit` on this handle stored the new limit while this attempt, made
                    // with the old one, was on its way (its reply may not be read yet): try
                    // again at once with the new one.
                    self.limit.store(stored, Ordering::Relaxed);
                    return Ok(Attempt::Busy {
                        retry_after: Duration::ZERO,
                    });
                }
                Err(Error::LimitMismatch {
                    name: name.to_owned(),
                    stored,
                    requested,
                })
            }
            (other, _) => Err(Error::UnexpectedReply {
                name: name.to_owned(),
                operation: Operation::Acquire,
                detail: format!("{other:?}"),
            }),
        }
    }
}

impl Client {
    /// A handle on semaphore `name` with `limit` numbered permits, each granted with its own
    /// fence and lease (see [`Semaphore`]). Makes no request: the first acquisition stores the
    /// limit, and every user must give the same one.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// let pool = client.semaphore("renderers", 8)?;
    /// println!("{} of {} permits free", pool.available().await?, pool.limit());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name; [`Error::InvalidOptions`] for a limit of 0 or
    /// above [`MAX_PERMITS`](crate::MAX_PERMITS).
    pub fn semaphore(&self, name: &str, limit: u32) -> Result<Semaphore> {
        Semaphore::new(self.core(), name, limit)
    }
}
