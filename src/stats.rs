//! Counters and histograms of what a client did, for monitoring contention, holds and loss.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// A snapshot of a [`Client`](crate::Client)'s counters and histograms since it was built;
/// clones of a client share them.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// let guard = client.lock("jobs:nightly", &fencelock::LockOptions::new()).await?;
/// guard.release().await?;
/// let stats = client.stats();
/// println!("{} grants, {} busy answers, {} lost", stats.grants, stats.busy, stats.lost);
/// println!("p99 wait {:?}", stats.waits.quantile(0.99));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Acquire requests sent (each retry of `lock` counts).
    pub acquire_attempts: u64,
    /// Locks granted.
    pub grants: u64,
    /// Acquire requests answered "held by another owner": the contention.
    pub busy: u64,
    /// Locks handed by a release of this client to another of its tasks in the same call
    /// (counted in `grants` too; no acquire request of the waiter).
    pub handoffs: u64,
    /// Acquire requests that failed (timeouts, Redis errors, replicas not confirmed).
    pub acquire_errors: u64,
    /// Grants released again because fewer replicas than required confirmed them.
    pub replicas_not_confirmed: u64,
    /// Replica acknowledgements counted by `WAIT`, summed over grants.
    pub replica_acks: u64,
    /// Wake-ups of waiting `lock` calls by a release announced on the lock's channel.
    pub wakeups: u64,
    /// Successful extensions by [`LockGuard::extend`](crate::LockGuard::extend).
    pub extends: u64,
    /// Locks renewed by the watchdog.
    pub renewals: u64,
    /// Script calls the watchdog made to renew them (one per node per batch).
    pub renewal_calls: u64,
    /// Successful releases.
    pub releases: u64,
    /// Holds found lost: an extension, release or renewal found the lock expired or held by
    /// another owner, or the watchdog gave up a hold whose renewal Redis refused for good
    /// ([`Error::RenewalFailed`](crate::Error::RenewalFailed)).
    pub lost: u64,
    /// Times the main connection was rebuilt after repeated timeouts.
    pub connection_rebuilds: u64,
    /// Batch calls sent: calls of one script for keys of one node, made by concurrent tasks,
    /// sent as one script call (see [`ClientBuilder::batching`](crate::ClientBuilder::batching)).
    pub batches: u64,
    /// The calls those batches carried (`batched_calls / batches` is the mean batch size).
    pub batched_calls: u64,
    /// Calls that fencelock's Redis module answered in place of a script (see
    /// [`ClientBuilder::module`](crate::ClientBuilder::module)); every other call ran a script.
    pub module_calls: u64,
    /// Calls sent to the module that it left to the script (`-FALLBACK`: a queue, a
    /// re-entered lock, …) or whose node did not load it: each was then sent as the script.
    /// One per call, also for the calls of a batched module command refused as a whole.
    pub module_fallbacks: u64,
    /// Grants (clock mode) where the lock's stored fence was ahead of the node's clock: the
    /// node's clock is behind the clock of an earlier grant (a failover to a node whose clock
    /// lags, or a clock stepped back), or a floor above the clock was used. Fences stay
    /// monotonic while the stored fence survives; see `docs/safety.md` for when it may not.
    pub clock_behind: u64,
    /// The largest such lead seen, in microseconds.
    pub clock_behind_max_us: u64,
    /// Grants whose fence was below one this client had been granted before on the same lock
    /// (the earlier reply read before the later request was sent): tokens went backwards, as
    /// after a re-created cluster or a move to another server. Each is also logged as a `warn`
    /// event; see `docs/safety.md` for the repair
    /// ([`ClientBuilder::fence_floor`](crate::ClientBuilder::fence_floor)).
    pub fence_regressions: u64,
    /// How long granted `lock`/`try_lock` calls took, from the call to the grant.
    pub waits: Histogram,
    /// How long locks were held, from the grant to the release.
    pub holds: Histogram,
}

/// Number of buckets in a [`Histogram`].
const BUCKETS: usize = 40;

/// A histogram of durations in power-of-two buckets of microseconds: bucket `i` counts values
/// below 2^i µs (and at least 2^(i-1) µs); the last bucket counts everything longer.
///
/// # Examples
///
/// ```no_run
/// # fn show(stats: fencelock::Stats) {
/// println!("{} holds, median {:?}", stats.holds.count(), stats.holds.quantile(0.5));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Histogram {
    buckets: [u64; BUCKETS],
    sum_micros: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            buckets: [0; BUCKETS],
            sum_micros: 0,
        }
    }
}

impl Histogram {
    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The mean, or zero when empty.
    pub fn mean(&self) -> Duration {
        let count = self.count();
        if count == 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(self.sum_micros / count)
    }

    /// An upper bound for the `q` quantile (0.0..=1.0): the top of the bucket it falls in, so
    /// at most twice the true value; `Duration::MAX` past 2^39 µs (about 6.4 days), the last
    /// bucket's bottom. Zero when empty.
    pub fn quantile(&self, q: f64) -> Duration {
        let count = self.count();
        if count == 0 {
            return Duration::ZERO;
        }
        let rank = ((q.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return upper_bound(i);
            }
        }
        upper_bound(BUCKETS - 1)
    }

    /// `(upper bound, count)` per non-empty bucket, shortest first.
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, u64)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (upper_bound(i), *n))
    }
}

/// The top of bucket `i`: 2^i µs, and for the last, which takes every longer value too,
/// `Duration::MAX`.
fn upper_bound(i: usize) -> Duration {
    if i + 1 >= BUCKETS {
        return Duration::MAX;
    }
    Duration::from_micros(1u64 << i)
}

/// The live histogram behind [`Histogram`].
#[derive(Debug)]
pub(crate) struct LiveHistogram {
    buckets: [AtomicU64; BUCKETS],
    sum_micros: AtomicU64,
    /// Its name in the `metrics` facade (values in seconds).
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    name: &'static str,
}

impl Default for LiveHistogram {
    fn default() -> Self {
        Self::named("")
    }
}

impl LiveHistogram {
    fn named(name: &'static str) -> Self {
        Self {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_micros: AtomicU64::new(0),
            name,
        }
    }

    /// Records `value` for a primitive of `kind` (the metric's `kind` label, see [`kind_of`]).
    pub(crate) fn record(&self, kind: &'static str, value: Duration) {
        let micros = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        let bucket = (64 - micros.leading_zeros() as usize).min(BUCKETS - 1);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        // Each value counts at most 2^44 µs (203 days) in the sum: a huge one (a hold of
        // `Duration::MAX`) must not wrap it round to a tiny mean.
        self.sum_micros
            .fetch_add(micros.min(1 << 44), Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::histogram!(self.name, "kind" => kind).record(value.as_secs_f64());
        #[cfg(not(feature = "metrics"))]
        let _ = kind;
    }

    fn snapshot(&self) -> Histogram {
        Histogram {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
        }
    }
}

/// One live counter of [`Counters`], with its name in the `metrics` facade.
#[derive(Debug)]
pub(crate) struct Counter {
    value: AtomicU64,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    name: &'static str,
}

impl Counter {
    fn named(name: &'static str) -> Self {
        Self {
            value: AtomicU64::new(0),
            name,
        }
    }

    pub(crate) fn load(&self, order: Ordering) -> u64 {
        self.value.load(order)
    }
}

/// The `kind` label of the metrics about the primitive whose key is `key`: the name
/// [`Kind::as_str`](crate::kind::Kind::as_str) gives its kind (`mutex`, `rwlock`, `fair`, `semaphore`,
/// `latch`), read from the key's last part.
pub(crate) fn kind_of(key: &str) -> &'static str {
    let suffix = key.rsplit(':').next().unwrap_or_default();
    crate::kind::Kind::from_suffix(suffix).map_or("other", crate::kind::Kind::as_str)
}

/// The `kind` label of the metrics that belong to a client rather than to one primitive
/// (connection rebuilds).
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) const CLIENT_KIND: &str = "client";

/// The names the counters and histograms are reported under with the `metrics` feature.
pub(crate) mod names {
    pub(crate) const ACQUIRE_ATTEMPTS: &str = "fencelock_acquire_attempts_total";
    pub(crate) const GRANTS: &str = "fencelock_grants_total";
    pub(crate) const BUSY: &str = "fencelock_busy_total";
    pub(crate) const HANDOFFS: &str = "fencelock_handoffs_total";
    pub(crate) const ACQUIRE_ERRORS: &str = "fencelock_acquire_errors_total";
    pub(crate) const REPLICAS_NOT_CONFIRMED: &str = "fencelock_replicas_not_confirmed_total";
    pub(crate) const REPLICA_ACKS: &str = "fencelock_replica_acks_total";
    pub(crate) const WAKEUPS: &str = "fencelock_wakeups_total";
    pub(crate) const EXTENDS: &str = "fencelock_extends_total";
    pub(crate) const RENEWALS: &str = "fencelock_renewals_total";
    pub(crate) const RENEWAL_CALLS: &str = "fencelock_renewal_calls_total";
    pub(crate) const RELEASES: &str = "fencelock_releases_total";
    pub(crate) const LOST: &str = "fencelock_lost_total";
    pub(crate) const CLOCK_BEHIND: &str = "fencelock_clock_behind_total";
    pub(crate) const FENCE_REGRESSIONS: &str = "fencelock_fence_regressions_total";
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    pub(crate) const CONNECTION_REBUILDS: &str = "fencelock_connection_rebuilds_total";
    pub(crate) const WAIT_SECONDS: &str = "fencelock_wait_seconds";
    pub(crate) const HOLD_SECONDS: &str = "fencelock_hold_seconds";
}

/// The live counters behind [`Stats`].
#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) acquire_attempts: Counter,
    pub(crate) grants: Counter,
    pub(crate) busy: Counter,
    pub(crate) handoffs: Counter,
    pub(crate) acquire_errors: Counter,
    pub(crate) replicas_not_confirmed: Counter,
    pub(crate) replica_acks: Counter,
    pub(crate) wakeups: Counter,
    pub(crate) extends: Counter,
    pub(crate) renewals: Counter,
    pub(crate) renewal_calls: Counter,
    pub(crate) releases: Counter,
    pub(crate) lost: Counter,
    pub(crate) clock_behind: Counter,
    pub(crate) clock_behind_max_us: AtomicU64,
    pub(crate) fence_regressions: Counter,
    pub(crate) waits: LiveHistogram,
    pub(crate) holds: LiveHistogram,
}

impl Default for Counters {
    fn default() -> Self {
        use names::*;
        Self {
            acquire_attempts: Counter::named(ACQUIRE_ATTEMPTS),
            grants: Counter::named(GRANTS),
            busy: Counter::named(BUSY),
            handoffs: Counter::named(HANDOFFS),
            acquire_errors: Counter::named(ACQUIRE_ERRORS),
            replicas_not_confirmed: Counter::named(REPLICAS_NOT_CONFIRMED),
            replica_acks: Counter::named(REPLICA_ACKS),
            wakeups: Counter::named(WAKEUPS),
            extends: Counter::named(EXTENDS),
            renewals: Counter::named(RENEWALS),
            renewal_calls: Counter::named(RENEWAL_CALLS),
            releases: Counter::named(RELEASES),
            lost: Counter::named(LOST),
            clock_behind: Counter::named(CLOCK_BEHIND),
            clock_behind_max_us: AtomicU64::new(0),
            fence_regressions: Counter::named(FENCE_REGRESSIONS),
            waits: LiveHistogram::named(WAIT_SECONDS),
            holds: LiveHistogram::named(HOLD_SECONDS),
        }
    }
}

impl Counters {
    /// Adds `n` to `counter`, and reports it through the `metrics` facade with that feature,
    /// labelled with the primitive's `kind` ([`kind_of`]).
    pub(crate) fn add(counter: &Counter, kind: &'static str, n: u64) {
        counter.value.fetch_add(n, Ordering::Relaxed);
        #[cfg(feature = "metrics")]
        metrics::counter!(counter.name, "kind" => kind).increment(n);
        #[cfg(not(feature = "metrics"))]
        let _ = kind;
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let get = |c: &Counter| c.load(Ordering::Relaxed);
        Stats {
            acquire_attempts: get(&self.acquire_attempts),
            grants: get(&self.grants),
            busy: get(&self.busy),
            handoffs: get(&self.handoffs),
            acquire_errors: get(&self.acquire_errors),
            replicas_not_confirmed: get(&self.replicas_not_confirmed),
            replica_acks: get(&self.replica_acks),
            wakeups: get(&self.wakeups),
            extends: get(&self.extends),
            renewals: get(&self.renewals),
            renewal_calls: get(&self.renewal_calls),
            releases: get(&self.releases),
            lost: get(&self.lost),
            // The transport counts its rebuilds; `Core::stats` fills them in.
            connection_rebuilds: 0,
            batches: 0,
            batched_calls: 0,
            module_calls: 0,
            module_fallbacks: 0,
            clock_behind: get(&self.clock_behind),
            clock_behind_max_us: self.clock_behind_max_us.load(Ordering::Relaxed),
            fence_regressions: get(&self.fence_regressions),
            waits: self.waits.snapshot(),
            holds: self.holds.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_bound_the_values_within_a_factor_of_two() {
        let live = LiveHistogram::default();
        for ms in 1..=100 {
            live.record("mutex", Duration::from_millis(ms));
        }
        let h = live.snapshot();
        assert_eq!(h.count(), 100);
        let p50 = h.quantile(0.5);
        assert!(
            p50 >= Duration::from_millis(50) && p50 <= Duration::from_millis(100),
            "{p50:?}"
        );
        assert!(h.quantile(1.0) >= Duration::from_millis(100));
        assert_eq!(h.mean(), Duration::from_micros(50_500));
        assert_eq!(Histogram::default().quantile(0.9), Duration::ZERO);
    }

    #[test]
    fn values_past_the_last_bucket_are_bounded_by_duration_max_and_do_not_wrap_the_sum() {
        let live = LiveHistogram::default();
        live.record("mutex", Duration::from_secs(86_400));
        live.record("mutex", Duration::MAX);
        live.record("mutex", Duration::MAX);
        let h = live.snapshot();
        assert_eq!(
            h.quantile(1.0),
            Duration::MAX,
            "the last bucket has no finite top"
        );
        assert_eq!(h.buckets().last(), Some((Duration::MAX, 2)));
        assert!(h.mean() > Duration::from_secs(86_400), "{:?}", h.mean());
    }
}
