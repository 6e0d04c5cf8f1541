//! The countdown latch: [`Latch`], a count that parties count down once each, and waiters that
//! return once it reached zero. Each [`set`](Latch::set) starts a new generation whose fence
//! follows the fence rule, so a re-armed latch is never mistaken for the previous round.
//!
//! One hash per latch, `<prefix>:{NAME}:latch` (`script/lua/latch_set.lua` documents its
//! fields). Waiting runs on the shared wait loop ([`acquire::wait`]): an attempt reads the
//! state, "busy" is a closed latch, and the count-down that reaches zero publishes on the
//! latch's channel (the latch key) and wakes the waiters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::acquire::{self, Attempt, Request};
use crate::client::Client;
use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::fence::FenceToken;
use crate::human::HumanDuration;
use crate::keys::{fingerprint, LockKeys, Placement, MAX_NAME_LEN};
use crate::script::{
    parse_fence, parse_reply, ttl_millis, ScriptCall, LATCH_COUNT_DOWN, LATCH_SET, LATCH_STATE,
};

/// How long an open latch stays visible by default ([`Latch::with_open_ttl`]).
pub const DEFAULT_OPEN_TTL: Duration = Duration::from_secs(3600);

/// The longest open TTL accepted ([`Latch::with_open_ttl`]).
pub const MAX_OPEN_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The highest count a latch can be set to: 2^53 − 1, as Lua counts exactly.
pub const MAX_LATCH_COUNT: u64 = (1 << 53) - 1;

/// How often a waiter looks at the latch again without a message: an opening is announced on
/// the latch's channel, so this only bounds what a lost message could cost.
const RECHECK: Duration = Duration::from_secs(2);

/// A countdown latch on Redis: [`set`](Self::set) arms it with a count, each party calls
/// [`count_down`](Self::count_down) once with its own id, and [`wait`](Self::wait)ers return
/// once the count reached zero.
///
/// Every `set` starts a new **generation**: a fence token above every earlier generation of the
/// latch (across failovers and key expiry, as the mutex's fences). `wait` returns the
/// generation that opened; `count_down_in` counts only in the generation it names.
///
/// A latch that was never set is **not open**: `wait` keeps waiting until its timeout. An open
/// latch stays visible for its open TTL (default [`DEFAULT_OPEN_TTL`]) plus the client's expiry
/// grace, then its key expires (clock mode; in counter and epoch modes the key is kept, as it
/// holds the only record of the generations) and it reads as never set again. An armed latch
/// (count above zero) is kept without expiry; `set(0)` opens it, which also lets it expire.
///
/// Cheap to clone; made by [`Client::latch`](crate::Client::latch).
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// use std::time::Duration;
///
/// let latch = client.latch("batch:7")?;
/// let generation = latch.set(3).await?;
/// for worker in ["w1", "w2", "w3"] {
///     latch.count_down(worker).await?; // each worker, usually elsewhere
/// }
/// assert_eq!(latch.wait(Duration::from_secs(10)).await?, generation);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Latch {
    core: Arc<Core>,
    keys: LockKeys,
    open_ttl: Duration,
}

impl std::fmt::Debug for Latch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Latch")
            .field("name", &self.keys.name())
            .field("key", &self.keys.lock_key())
            .field("open_ttl", &self.open_ttl)
            .finish()
    }
}

impl Latch {
    /// The latch `keys` name, on `core`.
    pub(crate) fn new(core: &Arc<Core>, keys: LockKeys) -> Self {
        Self {
            core: Arc::clone(core),
            keys,
            open_ttl: DEFAULT_OPEN_TTL,
        }
    }

    /// The same latch, kept visible for `ttl` after it opens (default [`DEFAULT_OPEN_TTL`]);
    /// applies to the openings this handle's calls make.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] unless `ttl` is from 1 ms to [`MAX_OPEN_TTL`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    ///
    /// let latch = client.latch("deploy:42")?.with_open_ttl(Duration::from_secs(600))?;
    /// # Ok(()) }
    /// ```
    pub fn with_open_ttl(mut self, ttl: Duration) -> Result<Self> {
        if ttl < Duration::from_millis(1) || ttl > MAX_OPEN_TTL {
            return Err(Error::InvalidOptions {
                name: self.keys.name().to_owned(),
                reason: format!(
                    "the latch's open TTL {} is out of range: use 1ms to {}",
                    HumanDuration(ttl),
                    HumanDuration(MAX_OPEN_TTL)
                ),
            });
        }
        self.open_ttl = ttl;
        Ok(self)
    }

    /// The latch's name.
    pub fn name(&self) -> &str {
        self.keys.name()
    }

    /// The latch's Redis key (`<prefix>:{NAME}:latch`), also the channel its openings are
    /// announced on.
    pub fn key(&self) -> &str {
        self.keys.lock_key()
    }

    /// The hash slot of the latch's key.
    pub fn slot(&self) -> u16 {
        self.keys.slot()
    }

    /// Arms the latch with `count`, starting a new generation, and returns the generation: a
    /// fence above every earlier generation of this latch (and above the client's
    /// [`fence_floor`](crate::ClientBuilder::fence_floor)). The ids that counted down in the
    /// previous round are forgotten. `count` 0 opens the new generation at once (and wakes
    /// the waiters).
    ///
    /// Waiters of a round that opened return even when the latch is set again right after;
    /// waiters of a round that is set again before it opened wait for the new round.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] when `count` exceeds [`MAX_LATCH_COUNT`];
    /// [`Error::OutOfMemory`] at `maxmemory`; [`Error::Timeout`] or [`Error::Redis`] when Redis
    /// does not answer in time or fails: the outcome is unknown then, and calling `set` again
    /// starts another generation.
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have started the generation; nothing is left behind.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// let latch = client.latch("batch:7")?;
    /// let first = latch.set(2).await?;
    /// let second = latch.set(2).await?; // re-armed: a new round
    /// assert!(second > first);
    /// # Ok(()) }
    /// ```
    pub async fn set(&self, count: u64) -> Result<FenceToken> {
        let name = self.name();
        if count > MAX_LATCH_COUNT {
            return Err(Error::InvalidOptions {
                name: name.to_owned(),
                reason: format!("the count {count} is too high: use at most {MAX_LATCH_COUNT}"),
            });
        }
        let span = self.span("set");
        async {
            let core = &self.core;
            let set_id = crate::owner::id();
            let sent = Instant::now();
            let call = ScriptCall::new(
                &LATCH_SET,
                &[self.key()],
                &[
                    &count.to_string(),
                    &set_id,
                    &core.fence_floor().to_string(),
                    core.fence_arg(),
                    core.transport.announce(),
                    &ttl_millis(self.open_ttl),
                    core.expiry(),
                ],
            );
            let reply = core.transport.run(&call, name, Operation::LatchSet).await?;
            let (status, generation, behind) =
                parse_reply::<(i64, i64, i64)>(name, Operation::LatchSet, reply)?;
            if !matches!(status, 1 | 2) {
                return Err(unexpected(name, Operation::LatchSet, status));
            }
            if behind > 0 {
                core.clock_behind("latch", name, behind);
            }
            let generation = parse_fence(name, Operation::LatchSet, "generation", generation)?;
            let key = self.key();
            core.granted(key, fingerprint(key), name, generation, sent);
            tracing::debug!(latch = name, %generation, count, "set");
            Ok(generation)
        }
        .instrument(span)
        .await
    }

    /// Counts `id` down once in the latch's current generation and returns the count still
    /// outstanding (0 once the latch is open). The same id again in the same generation, or a
    /// resent call, counts once and answers the same count. The count-down that reaches zero
    /// opens the latch and wakes its waiters.
    ///
    /// The count-down lands in the generation current when it runs: one racing a
    /// [`set`](Self::set) may land in the new round. Use [`count_down_in`](Self::count_down_in)
    /// to count only in the round a party belongs to.
    ///
    /// # Errors
    ///
    /// [`Error::CountDownRefused`] when the latch is not set (never, or its open state
    /// expired); [`Error::InvalidOptions`] for an empty id or one longer than 4096 bytes;
    /// [`Error::OutOfMemory`], [`Error::Timeout`] or [`Error::Redis`] as for [`set`](Self::set)
    /// (calling again with the same id is safe).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have counted; calling again with the same id counts once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// let latch = client.latch("batch:7")?;
    /// latch.set(2).await?;
    /// assert_eq!(latch.count_down("worker-1").await?, 1);
    /// assert_eq!(latch.count_down("worker-1").await?, 1); // the same id counts once
    /// assert_eq!(latch.count_down("worker-2").await?, 0); // open
    /// # Ok(()) }
    /// ```
    pub async fn count_down(&self, id: &str) -> Result<u64> {
        self.count_down_at(None, id).await
    }

    /// Counts `id` down once in generation `generation` only (the fence [`set`](Self::set)
    /// returned), and returns the count still outstanding; as [`count_down`](Self::count_down)
    /// otherwise. A count-down for a round that is over never counts in a later one.
    ///
    /// # Errors
    ///
    /// [`Error::CountDownRefused`] when `generation` is not the current generation (the latch
    /// was set again) or the latch is not set; otherwise as [`count_down`](Self::count_down).
    ///
    /// # Cancel safety
    ///
    /// As [`count_down`](Self::count_down).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// let latch = client.latch("batch:7")?;
    /// let old = latch.set(2).await?;
    /// latch.set(2).await?;
    /// assert!(latch.count_down_in(old, "worker-1").await.is_err()); // its round is over
    /// # Ok(()) }
    /// ```
    pub async fn count_down_in(&self, generation: FenceToken, id: &str) -> Result<u64> {
        self.count_down_at(Some(generation), id).await
    }

    async fn count_down_at(&self, generation: Option<FenceToken>, id: &str) -> Result<u64> {
        let name = self.name();
        if id.is_empty() || id.len() > MAX_NAME_LEN {
            return Err(Error::InvalidOptions {
                name: name.to_owned(),
                reason: "the count-down id is empty or longer than 4096 bytes: give each party \
                         a short id of its own"
                    .into(),
            });
        }
        let span = self.span("count_down");
        async {
            let core = &self.core;
            let generation_arg = generation.map_or_else(String::new, |g| g.get().to_string());
            let call = ScriptCall::new(
                &LATCH_COUNT_DOWN,
                &[self.key()],
                &[
                    id,
                    &generation_arg,
                    core.transport.announce(),
                    &ttl_millis(self.open_ttl),
                    core.expiry(),
                ],
            );
            let operation = Operation::LatchCountDown;
            let reply = core.transport.run(&call, name, operation).await?;
            let (status, current, remaining) =
                parse_reply::<(i64, i64, i64)>(name, operation, reply)?;
            match status {
                1 => {
                    let remaining = u64::try_from(remaining)
                        .map_err(|_| unexpected(name, operation, remaining))?;
                    tracing::debug!(latch = name, id, remaining, "counted down");
                    Ok(remaining)
                }
                0 => Err(Error::CountDownRefused {
                    name: name.to_owned(),
                    generation,
                    current: None,
                }),
                -1 => Err(Error::CountDownRefused {
                    name: name.to_owned(),
                    generation,
                    current: Some(parse_fence(name, operation, "generation", current)?),
                }),
                other => Err(unexpected(name, operation, other)),
            }
        }
        .instrument(span)
        .await
    }

    /// The latch's current generation and its remaining count (0 when open), or `None` when
    /// the latch is not set (never, or its open state expired).
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] or [`Error::Redis`] when Redis does not answer in time or fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// match client.latch("batch:7")?.count().await? {
    ///     Some((generation, 0)) => println!("generation {generation} is open"),
    ///     Some((generation, left)) => println!("generation {generation}: {left} to go"),
    ///     None => println!("not set"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn count(&self) -> Result<Option<(FenceToken, u64)>> {
        let span = self.span("count");
        async {
            let state = self.state().await?;
            Ok(state.generation.map(|g| (g, state.count)))
        }
        .instrument(span)
        .await
    }

    /// Waits until the latch opens, for up to `timeout`, and returns the generation that
    /// opened: the current one when the latch is open already, else the first to open after
    /// the call began (one that is set again before it opened is followed by the new round).
    ///
    /// The call subscribes to the latch's channel, then looks at the state (so an opening
    /// between the two is not missed), and looks again when the count-down reaching zero
    /// announces it, within milliseconds; it also looks every 2 s in case a message was lost.
    /// Waiters of one client share one subscription per latch. A round that opened is
    /// reported even if the latch was set again right after. A latch that is not set (never,
    /// or its open state expired) is not open: the call waits for a set and an opening.
    /// `timeout` zero looks once.
    ///
    /// # Errors
    ///
    /// [`Error::LatchNotOpen`] when the latch did not open within `timeout`;
    /// [`Error::Timeout`] or [`Error::Redis`] when Redis kept failing.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads; a dropped call's registration on the channel is dropped
    /// with it (the subscription ends when no other call of this client waits on the latch).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    ///
    /// let latch = client.latch("batch:7")?;
    /// match latch.wait(Duration::from_secs(30)).await {
    ///     Ok(generation) => println!("round {generation} is complete"),
    ///     Err(fencelock::Error::LatchNotOpen { remaining, .. }) => {
    ///         println!("still waiting for {remaining:?}")
    ///     }
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn wait(&self, timeout: Duration) -> Result<FenceToken> {
        let request = Await {
            latch: self,
            since: AtomicU64::new(UNREAD),
            remaining: AtomicU64::new(UNREAD),
        };
        acquire::wait(&self.core, &request, timeout)
            .instrument(self.span("wait"))
            .await
    }

    /// One read of the latch's state.
    async fn state(&self) -> Result<State> {
        let name = self.name();
        let call = ScriptCall::new(&LATCH_STATE, &[self.key()], &[]);
        let reply = self
            .core
            .transport
            .run(&call, name, Operation::LatchRead)
            .await?;
        let (generation, count, opened) =
            parse_reply::<(i64, i64, i64)>(name, Operation::LatchRead, reply)?;
        let token = |value: i64| match value {
            0 => Ok(None),
            value => parse_fence(name, Operation::LatchRead, "generation", value).map(Some),
        };
        Ok(State {
            generation: token(generation)?,
            count: u64::try_from(count)
                .map_err(|_| unexpected(name, Operation::LatchRead, count))?,
            opened: token(opened)?,
        })
    }

    fn span(&self, operation: &'static str) -> tracing::Span {
        tracing::debug_span!(
            "fencelock.latch",
            kind = crate::kind::Kind::Latch.as_str(),
            latch = self.name(),
            operation,
            slot = self.slot()
        )
    }
}

/// A latch's state as `latch_state` reads it.
struct State {
    /// The current generation; `None` when not set.
    generation: Option<FenceToken>,
    /// Its remaining count.
    count: u64,
    /// The latest generation that opened.
    opened: Option<FenceToken>,
}

/// Not read yet (in [`Await`]'s atomics); also "not set" for `remaining`.
const UNREAD: u64 = u64::MAX;

/// One wait on a latch, for the shared wait loop: an attempt reads the state and is granted
/// once a generation no older than the one current at the first look has opened.
struct Await<'a> {
    latch: &'a Latch,
    /// The generation current at the first look (0 when not set), [`UNREAD`] before it.
    since: AtomicU64,
    /// The count outstanding at the last look, [`UNREAD`] when not set.
    remaining: AtomicU64,
}

impl Request for Await<'_> {
    type Granted = FenceToken;

    fn name(&self) -> &str {
        self.latch.name()
    }

    fn channel(&self) -> &str {
        self.latch.key()
    }

    fn busy(&self, waited: Duration, _retry_after: Duration) -> Error {
        let remaining = self.remaining.load(Ordering::Relaxed);
        Error::LatchNotOpen {
            name: self.name().to_owned(),
            waited,
            remaining: (remaining != UNREAD).then_some(remaining),
        }
    }

    async fn attempt(&self, _core: &Arc<Core>) -> Result<Attempt<FenceToken>> {
        let state = self.latch.state().await?;
        let current = state.generation.map_or(0, FenceToken::get);
        let since =
            match self
                .since
                .compare_exchange(UNREAD, current, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => current,
                Err(first) => first,
            };
        if let Some(opened) = state.opened.filter(|opened| opened.get() >= since) {
            return Ok(Attempt::Granted(opened));
        }
        let remaining = if state.generation.is_some() {
            state.count
        } else {
            UNREAD
        };
        self.remaining.store(remaining, Ordering::Relaxed);
        Ok(Attempt::Busy {
            retry_after: RECHECK,
        })
    }
}

/// A status no latch script answers.
fn unexpected(name: &str, operation: Operation, status: i64) -> Error {
    Error::UnexpectedReply {
        name: name.to_owned(),
        operation,
        detail: format!("status {status}"),
    }
}

impl Client {
    /// The countdown latch `name` (key `<prefix>:{name}:latch`): a handle, no call to Redis.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty name or one longer than 4096 bytes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    ///
    /// let latch = client.latch("batch:7")?;
    /// latch.set(1).await?;
    /// latch.count_down("only-worker").await?;
    /// latch.wait(Duration::from_secs(5)).await?;
    /// # Ok(()) }
    /// ```
    pub fn latch(&self, name: &str) -> Result<Latch> {
        let keys = LockKeys::of_kind(&self.core().prefix, name, &Placement::ByName, "latch")?;
        Ok(Latch::new(self.core(), keys))
    }
}
