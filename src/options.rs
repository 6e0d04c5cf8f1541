//! Per-lock options and their validation.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::fence::FenceToken;
use crate::human::HumanDuration;
use crate::keys::Placement;

/// The longest TTL accepted: half of what fits Redis's millisecond expiry clock.
pub const MAX_TTL: Duration = Duration::from_millis(i64::MAX as u64 / 2);

/// The shortest TTL accepted. A lease must outlast a round trip to Redis and the drift margin
/// a guard subtracts from it (1% + 2 ms), or the holder could never rely on it.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// The highest floor accepted: 2^32 grants below [`FenceToken::MAX`], so a lock given a floor
/// still has room for that many grants before its fences would pass 2^53 − 1 (where the acquire
/// script refuses to grant rather than store a fence Lua cannot count past).
pub const MAX_FLOOR: FenceToken = match FenceToken::new(FenceToken::MAX.get() - (1 << 32)) {
    Some(floor) => floor,
    None => panic!("the floor margin fits below FenceToken::MAX"),
};

/// `from + duration`, or a point about a century later when that does not fit an `Instant`:
/// durations such as `Duration::MAX` mean "never" rather than a panic.
pub(crate) fn instant_after(from: Instant, duration: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    from.checked_add(duration.min(CENTURY))
        .or_else(|| from.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(from)
}

/// The longest `WAIT` timeout accepted.
pub const MAX_WAIT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Options for acquiring one lock. Cheap to clone; build once and reuse.
///
/// Defaults: TTL 30 s, `lock` waits up to 10 s, no replica confirmation, keys placed by name,
/// no fence floor, no watchdog.
///
/// The `fencelock` command line uses other defaults on purpose (`--ttl 10s --timeout 30s`):
/// `exec` and `hold` always run the watchdog, so their TTL only bounds how long a crashed
/// `fencelock` process keeps the lock, and a shell command usually means to wait its turn
/// (as `flock` does). A library hold without the watchdog must instead cover the work with its
/// TTL, and a program that gets [`Error::Busy`](crate::Error::Busy) after 10 s can decide
/// itself whether to try again. Set both explicitly where a program and a script share a lock.
///
/// With the `serde` feature it implements `Serialize` and `Deserialize`: a flat map whose
/// durations are humantime strings (`{"ttl": "30s", "timeout": "1m 30s", "watchdog": true}`,
/// `"forever"` for `Duration::MAX`); missing fields take their defaults, unknown ones are
/// refused. The [`on_wait`](Self::on_wait) observer is not part of it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use fencelock::LockOptions;
///
/// let options = LockOptions::new()
///     .ttl(Duration::from_secs(5))
///     .timeout(Duration::from_secs(2))
///     .wait_replicas(1, Duration::from_millis(100));
/// assert_eq!(options.get_ttl(), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone)]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) timeout: Duration,
    pub(crate) wait: Option<(u32, Duration)>,
    pub(crate) placement: Placement,
    pub(crate) floor: Option<FenceToken>,
    pub(crate) watchdog: bool,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) linger: bool,
    pub(crate) on_wait: Option<WaitObserver>,
}

/// What a waiting acquisition tells an [`LockOptions::on_wait`] observer each time it finds the
/// lock held and is about to wait.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Waiting<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// When the holder's lease ends at the latest unless renewed (for a semaphore: the first
    /// permit's; for a fair lock's queue: the lease of the holder or of the head of the queue).
    pub lease_left: Duration,
    /// How long the call has waited so far.
    pub waited: Duration,
}

/// The observer [`LockOptions::on_wait`] sets.
#[derive(Clone)]
pub(crate) struct WaitObserver(Arc<dyn Fn(&Waiting<'_>) + Send + Sync>);

impl WaitObserver {
    pub(crate) fn notify(&self, waiting: &Waiting<'_>) {
        (self.0)(waiting);
    }
}

impl std::fmt::Debug for WaitObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WaitObserver")
    }
}

impl Default for LockOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            wait: None,
            placement: Placement::ByName,
            floor: None,
            watchdog: false,
            renew_every: None,
            max_hold: None,
            linger: false,
            on_wait: None,
        }
    }
}

impl LockOptions {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long the lock lives unless extended (at least [`MIN_TTL`], at most [`MAX_TTL`]).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long [`Client::lock`](crate::Client::lock) keeps trying while another owner holds the
    /// lock; `Duration::ZERO` makes one attempt, `Duration::MAX` waits as long as it takes.
    /// [`Client::try_lock`](crate::Client::try_lock) ignores it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Requires `replicas` replicas to acknowledge the acquisition within `timeout` (Redis
    /// `WAIT`). When fewer do, the lock is released and the call fails with
    /// [`Error::ReplicasNotConfirmed`].
    pub fn wait_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait = Some((replicas, timeout));
        self
    }

    /// Pins the lock's keys to a hash slot (0..=16383).
    pub fn slot(mut self, slot: u16) -> Self {
        self.placement = Placement::Slot(slot);
        self
    }

    /// Uses `tag` as the hash tag, so locks sharing a tag share a slot.
    pub fn tag(mut self, tag: impl Into<String>) -> Self {
        self.placement = Placement::Tag(tag.into());
        self
    }

    /// Sets where the keys live (see [`Placement`]).
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = placement;
        self
    }

    /// Grants a token above `floor`: pass the highest token your storage has seen
    /// ([`StaleFence::highest`](crate::StaleFence::highest)) to repair a regression.
    pub fn floor(mut self, floor: FenceToken) -> Self {
        self.floor = Some(floor);
        self
    }

    /// Keeps the lock alive while its guard lives: the client's watchdog renews it every
    /// [`renew_every`](Self::renew_every) (default a third of the TTL), batching all locks of
    /// one node into one call. The TTL then only bounds how long a crashed holder blocks
    /// others. When renewal finds the lock lost, or cannot reach Redis before the lease runs
    /// out, [`LockGuard::lost`](crate::LockGuard::lost) resolves and `release` fails.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// How often the watchdog renews the lock (default TTL / 3; shorter than the TTL). Renewals
    /// come up to half of this early, to share a call with other locks.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew_every = Some(every);
        self
    }

    /// The longest the watchdog keeps the lock: after this it stops renewing, the lease ends at
    /// most then, and [`LockGuard::lost`](crate::LockGuard::lost) reports
    /// [`Error::MaxHoldReached`]. A maximum below the TTL also shortens the first lease to it.
    /// At least [`MIN_TTL`]; `Duration::MAX` means no maximum.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Lets a release of a *hot* mutex linger in this client (default off): for a process that
    /// takes the same contended lock again and again, one task at a time.
    ///
    /// A mutex hold granted after the call waited behind other clients (or handed on within
    /// this client with fences reserved for it) hands the lock to this client's next task that
    /// asks for it ahead of the other clients' queued places, for a run of at most 16 grants
    /// (the fences one handoff reserves) before the next client's turn; those handed out within
    /// 2 ms of that handoff need no call to Redis. That needs a task that asks while the lock is
    /// released. With
    /// `linger` on, a release with no such task yet does not go to Redis at once: the hold
    /// stays in the client while the runtime runs its other ready tasks a few times, so the
    /// releasing task's own next [`Client::lock`](crate::Client::lock) or
    /// [`Client::try_lock`](crate::Client::try_lock) is handed the lock, and otherwise a
    /// background task releases it a few microseconds later. A lock contended by several
    /// processes with one task each then moves in runs of grants instead of one round trip
    /// across processes per grant (`docs/benchmarks.md`, "Cohorts").
    ///
    /// What it changes: a lingering [`release`](crate::LockGuard::release) answers `Ok` before
    /// Redis is told (only while the lease has most of its TTL left, so the lock was surely
    /// held until then; a loss the background call finds is logged and counted as lost, not
    /// returned), so the lock stays held a moment longer, and **a program must call
    /// [`Client::shutdown`](crate::Client::shutdown) before it exits** (it waits for lingering
    /// and other background releases): a runtime that stops first drops them, and the lock
    /// stays held until its lease ends. Likewise a runtime that is not running (a
    /// current-thread runtime between two `block_on` calls) releases it only when it runs
    /// again. Fences are unchanged: every grant in the run has its
    /// own fence, reserved by Redis, and every later grant is above them. Only the mutex's
    /// guards linger (not with [`wait_replicas`](Self::wait_replicas)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let options = LockOptions::new().linger(true);
    /// for _ in 0..1000 {
    ///     let guard = client.lock("stock:sku-42", &options).await?;
    ///     // deduct one item, presenting guard.fence() to storage
    ///     guard.release().await?;
    /// }
    /// client.shutdown().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn linger(mut self, on: bool) -> Self {
        self.linger = on;
        self
    }

    /// Calls `observer` each time a waiting acquisition ([`Client::lock`](crate::Client::lock),
    /// `read_lock`, `write_lock`, `fair_lock`, a semaphore's `acquire`) finds the lock held and
    /// is about to wait, with the lock's name and when the holder's lease ends: for progress
    /// messages such as the CLI's `waiting for orders:42: held by another owner, lease ends in
    /// 8.2s`. It runs on the waiting task, so it must return quickly; `try_*` calls never call
    /// it. Not part of the options' serialized form.
    ///
    /// # Examples
    ///
    /// ```
    /// use fencelock::{HumanDuration, LockOptions};
    ///
    /// let options = LockOptions::new().on_wait(|waiting| {
    ///     let left = HumanDuration(waiting.lease_left);
    ///     eprintln!("waiting for {}: lease ends in {left}", waiting.name);
    /// });
    /// ```
    pub fn on_wait(mut self, observer: impl Fn(&Waiting<'_>) + Send + Sync + 'static) -> Self {
        self.on_wait = Some(WaitObserver(Arc::new(observer)));
        self
    }

    /// The watchdog's renewal period: [`renew_every`](Self::renew_every) or a third of the TTL.
    pub(crate) fn renewal_period(&self) -> Duration {
        self.renew_every
            .unwrap_or(self.ttl / 3)
            .max(Duration::from_millis(1))
    }

    /// The lease the acquire asks for: the TTL, or the maximum hold time when the watchdog has
    /// one below the TTL.
    pub(crate) fn first_lease(&self) -> Duration {
        match self.max_hold {
            Some(max) if self.watchdog => self.ttl.min(max),
            _ => self.ttl,
        }
    }

    /// The TTL set.
    pub fn get_ttl(&self) -> Duration {
        self.ttl
    }

    /// The waiting timeout set.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn validate(&self, name: &str) -> Result<()> {
        let invalid = |reason: String| {
            Err(Error::InvalidOptions {
                name: name.to_owned(),
                reason,
            })
        };
        validate_ttl(name, self.ttl)?;
        if let Some((replicas, timeout)) = self.wait {
            if replicas == 0 {
                return invalid(
                    "wait_replicas needs at least 1 replica: leave it unset to skip WAIT".into(),
                );
            }
            if timeout.is_zero() || timeout > MAX_WAIT_TIMEOUT {
                return invalid(format!(
                    "the WAIT timeout {} is out of range: use 1ms to 1h \
                     (Redis treats 0 as wait forever)",
                    HumanDuration(timeout)
                ));
            }
        }
        if !self.watchdog && (self.renew_every.is_some() || self.max_hold.is_some()) {
            return invalid(
                "renew_every and max_hold set how the watchdog renews: turn it on with \
                 .watchdog(true)"
                    .into(),
            );
        }
        if let Some(every) = self.renew_every {
            if every.is_zero() || every >= self.ttl {
                return invalid(format!(
                    "renew_every {} must be above zero and below the TTL {}, or the lease \
                     runs out between renewals",
                    HumanDuration(every),
                    HumanDuration(self.ttl)
                ));
            }
        }
        if self.max_hold.is_some_and(|max| max < MIN_TTL) {
            return invalid(format!(
                "max_hold {} is below the minimum lease of {}: leave it unset to renew for \
                 as long as the guard lives",
                HumanDuration(self.max_hold.unwrap_or_default()),
                HumanDuration(MIN_TTL)
            ));
        }
        if let Some(floor) = self.floor.filter(|floor| *floor > MAX_FLOOR) {
            return invalid(format!(
                "the floor {floor} is above {MAX_FLOOR}, too close to the largest token \
                 (2^53 - 1) to leave room for later grants: pass the highest token your \
                 storage has seen, which fencelock never lets grow that far"
            ));
        }
        Ok(())
    }
}

/// Checks a TTL for a lock or an extension.
pub(crate) fn validate_ttl(name: &str, ttl: Duration) -> Result<()> {
    if ttl < MIN_TTL || ttl > MAX_TTL {
        return Err(Error::InvalidOptions {
            name: name.to_owned(),
            reason: format!(
                "the TTL {} is out of range: use at least {} (a shorter lease would end \
                 before the holder could rely on it) and at most {}",
                HumanDuration(ttl),
                HumanDuration(MIN_TTL),
                // Less a day, which the rounding to days cannot make up: the value printed
                // parses back as a TTL that is accepted.
                HumanDuration(MAX_TTL - Duration::from_secs(86_400))
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_ttl_is_printed_as_a_value_that_is_accepted() {
        let Err(Error::InvalidOptions { reason, .. }) = validate_ttl("x", Duration::MAX) else {
            panic!("Duration::MAX accepted as a TTL");
        };
        assert!(reason.ends_with("at most 146135511y 190d"), "{reason}");
        // humantime's year: 365.25 days.
        let printed = Duration::from_secs(146_135_511 * 31_557_600 + 190 * 86_400);
        assert!(validate_ttl("x", printed).is_ok());
        assert!(MAX_TTL - printed < Duration::from_secs(2 * 86_400));
    }

    #[test]
    fn out_of_range_options_are_rejected() {
        let bad = [
            LockOptions::new().ttl(Duration::ZERO),
            LockOptions::new().ttl(Duration::from_micros(999)),
            LockOptions::new().ttl(Duration::MAX),
            LockOptions::new().wait_replicas(0, Duration::from_secs(1)),
            LockOptions::new().wait_replicas(1, Duration::ZERO),
            LockOptions::new().floor(FenceToken::MAX),
            LockOptions::new().floor(FenceToken::new(MAX_FLOOR.get() + 1).unwrap()),
            LockOptions::new().ttl(Duration::from_millis(9)),
            LockOptions::new()
                .watchdog(true)
                .max_hold(Duration::from_millis(5)),
            LockOptions::new().max_hold(Duration::from_secs(1)),
            LockOptions::new()
                .watchdog(true)
                .ttl(Duration::from_secs(1))
                .renew_every(Duration::from_secs(1)),
            LockOptions::new().watchdog(true).max_hold(Duration::ZERO),
        ];
        for options in bad {
            assert!(
                matches!(options.validate("x"), Err(Error::InvalidOptions { .. })),
                "{options:?}"
            );
        }
        assert!(LockOptions::new().validate("x").is_ok());
        assert!(LockOptions::new().floor(MAX_FLOOR).validate("x").is_ok());
    }

    #[test]
    fn the_first_lease_is_cut_to_the_maximum_hold() {
        let options = LockOptions::new()
            .ttl(Duration::from_secs(10))
            .watchdog(true)
            .max_hold(Duration::from_secs(2));
        assert_eq!(options.first_lease(), Duration::from_secs(2));
        let longer = options.clone().max_hold(Duration::MAX);
        assert_eq!(longer.first_lease(), Duration::from_secs(10));
    }

    #[test]
    fn instants_saturate_instead_of_overflowing() {
        let now = Instant::now();
        assert!(instant_after(now, Duration::MAX) > now + Duration::from_secs(3600 * 24 * 365));
        assert_eq!(
            instant_after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
    }
}
