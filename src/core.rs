//! The core a client shares with its guards and requests: the transport, the background
//! runtime (wake-ups, watchdog), the counters and the client's settings.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::fence::{FenceMode, FenceToken};
use crate::keys::ByFingerprint;
use crate::local_queue::LocalQueues;
use crate::options::LockOptions;
use crate::runtime::wakeups::Wakeups;
use crate::runtime::watchdog::Watchdog;
use crate::stats::{kind_of, Counters, Stats};
use crate::transport::{Topology, Transport};

/// What a client, its guards and their background releases share.
pub(crate) struct Core {
    pub(crate) transport: Arc<Transport>,
    pub(crate) wakeups: Arc<Wakeups>,
    pub(crate) watchdog: Arc<Watchdog>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) prefix: String,
    /// Tasks of this client waiting for a mutex another of its tasks holds.
    pub(crate) handoffs: Arc<LocalQueues>,
    /// The first 8 hex digits of this client's mutex owner tokens: the acquire script records
    /// which client waits, so a release hands over within the client only while no other waits.
    tag: String,
    fence_mode: FenceMode,
    /// The lock scripts' last argument: the key's expiry grace in ms, empty to keep keys.
    expiry: Arc<str>,
    /// [`ClientBuilder::fence_floor`](crate::ClientBuilder::fence_floor): every grant is above
    /// it (0 for none).
    fence_floor: u64,
    /// The highest fence this client was granted per key, for [`Core::granted`].
    marks: Mutex<FenceMarks>,
}

/// The highest fence a client was granted per key, and when it learnt each: what
/// [`Core::granted`] compares a new grant with.
///
/// Keys are remembered by their [`fingerprint`](crate::keys::fingerprint), not by name: a
/// grant on a new key allocates nothing. Two of the at most [`MAX_MARKS`] keys share a
/// fingerprint with odds of about 2^-37, and would then be compared with each other: a false
/// report or a missed one, nothing else.
#[derive(Default)]
struct FenceMarks {
    marks: HashMap<u64, Mark, ByFingerprint>,
}

/// The highest fence granted on one key, and when the client read it.
#[derive(Clone, Copy)]
struct Mark {
    fence: u64,
    read: Instant,
}

/// The most keys [`FenceMarks`] remembers; past it the memory starts afresh (a regression of a
/// key forgotten then goes unseen until that key is granted twice again).
const MAX_MARKS: usize = 16_384;

impl FenceMarks {
    /// Records `fence`, granted on `key` to a request sent at `sent` and read at `read`; returns
    /// the key's earlier mark when `fence` is below it and that mark was read before `sent` (a
    /// regression; the lower fence becomes the mark). Grants whose replies crossed in flight are
    /// not compared.
    fn record(&mut self, key: u64, fence: u64, sent: Instant, read: Instant) -> Option<u64> {
        match self.marks.get_mut(&key) {
            Some(mark) if fence < mark.fence && mark.read <= sent => {
                let before = mark.fence;
                *mark = Mark { fence, read };
                Some(before)
            }
            Some(mark) => {
                if fence > mark.fence {
                    *mark = Mark { fence, read };
                }
                None
            }
            None => {
                if self.marks.len() >= MAX_MARKS {
                    self.marks.clear();
                }
                self.marks.insert(key, Mark { fence, read });
                None
            }
        }
    }
}

impl Core {
    /// The core over `transport`; in clock mode keys expire `expiry_grace` after their lease and
    /// fence, in the other modes they are kept.
    pub(crate) fn new(
        transport: Transport,
        wake_on_release: bool,
        prefix: String,
        fence_mode: FenceMode,
        expiry_grace: Duration,
        fence_floor: Option<FenceToken>,
    ) -> Self {
        let transport = Arc::new(transport);
        let counters = Arc::new(Counters::default());
        let expiry: Arc<str> = match fence_mode {
            FenceMode::Clock | FenceMode::EpochClock => expiry_grace.as_millis().to_string().into(),
            FenceMode::Counter | FenceMode::Epoch => "".into(),
        };
        Self {
            wakeups: Arc::new(Wakeups::new(Arc::clone(&transport), wake_on_release)),
            watchdog: Arc::new(Watchdog::new(
                Arc::clone(&transport),
                Arc::clone(&counters),
                Arc::clone(&expiry),
            )),
            transport,
            counters,
            prefix,
            handoffs: Arc::default(),
            tag: format!("{:08x}", rand::random::<u32>()),
            fence_mode,
            expiry,
            fence_floor: fence_floor.map_or(0, FenceToken::get),
            marks: Mutex::default(),
        }
    }

    /// The floor a grant under `options` must be above: the higher of the lock's
    /// [`LockOptions::floor`] and the client's [`fence_floor`](crate::ClientBuilder::fence_floor)
    /// (0 for neither).
    pub(crate) fn floor(&self, options: &LockOptions) -> u64 {
        options
            .floor
            .map_or(0, FenceToken::get)
            .max(self.fence_floor)
    }

    /// The client's [`fence_floor`](crate::ClientBuilder::fence_floor), 0 for none.
    pub(crate) fn fence_floor(&self) -> u64 {
        self.fence_floor
    }

    /// Records that Redis granted `fence` on `key` (whose
    /// [`fingerprint`](crate::keys::fingerprint) is `fingerprint`; the lock's name `name`) to a
    /// request sent at `sent`, and reports a regression: a fence below one this client was
    /// granted on the same key by a reply it had read before this request was sent. Redis ran
    /// that earlier grant first, so a lower fence now means the key's stored fence and the
    /// epoch or clock term both went back (a re-created cluster, a move to another server, a
    /// clock stepped back past the expiry grace, or a failover that lost the key in counter
    /// mode); see `docs/safety.md`. Grants whose replies crossed in flight are never compared,
    /// so concurrent holders (readers, permits) raise no false alarm. After a regression the
    /// lower fence becomes the key's mark, so one regression is reported once per key.
    pub(crate) fn granted(
        &self,
        key: &str,
        fingerprint: u64,
        name: &str,
        fence: FenceToken,
        sent: Instant,
    ) {
        let fence = fence.get();
        let regressed = self
            .marks
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .record(fingerprint, fence, sent, Instant::now());
        if let Some(before) = regressed {
            Counters::add(&self.counters.fence_regressions, kind_of(key), 1);
            tracing::warn!(
                lock = name,
                fence,
                before,
                "the fence went backwards: this client was granted {before} on this lock before \
                 and {fence} now. The deployment's config epochs or stored fences went back (a \
                 re-created cluster, a move to another server, a clock stepped back): storage \
                 will reject the new holders. Set the client's fence floor to the highest token \
                 storage has accepted (see docs/safety.md)"
            );
        }
    }

    /// The first 8 hex digits of this client's mutex owner tokens.
    pub(crate) fn tag(&self) -> &str {
        &self.tag
    }

    /// The lock scripts' last argument: the key's expiry grace in ms, or empty to keep keys.
    pub(crate) fn expiry(&self) -> &str {
        &self.expiry
    }

    /// Whether grants of mutex keys (the mutex's and its in-client handoff's, the multi-lock's, the
    /// quorum lock's) read the floor key of a Redis module that deletes released locks' keys
    /// (`acquire_floor`, `handoff_floor`, `lock_all_floor`): in a clock mode (an expiry grace
    /// given) on a standalone server that may load the module.
    pub(crate) fn reads_floor(&self) -> bool {
        !self.expiry.is_empty() && self.transport.reads_floor()
    }

    /// The acquire script's fence mode argument; a standalone server has no epoch, so epoch
    /// mode is a counter there and epoch-clock mode is clock mode.
    pub(crate) fn fence_arg(&self) -> &'static str {
        match (self.fence_mode, self.transport.topology()) {
            (FenceMode::Clock, _) | (FenceMode::EpochClock, Topology::Standalone) => "clock",
            (FenceMode::EpochClock, Topology::Cluster) => "hybrid",
            (FenceMode::Epoch, Topology::Cluster) => "epoch",
            (FenceMode::Epoch, Topology::Standalone) | (FenceMode::Counter, _) => "counter",
        }
    }

    /// A snapshot of the counters, with the transport's rebuilds, batches and module calls.
    pub(crate) fn stats(&self) -> Stats {
        let mut stats = self.counters.snapshot();
        stats.connection_rebuilds = self.transport.rebuilds();
        (stats.batches, stats.batched_calls) = self.transport.batches();
        (stats.module_calls, stats.module_fallbacks) = self.transport.module_calls();
        stats
    }

    /// Records a grant whose stored fence was `behind_us` µs ahead of the node's clock.
    pub(crate) fn clock_behind(&self, kind: &'static str, name: &str, behind_us: i64) {
        let behind_us = u64::try_from(behind_us).unwrap_or(0);
        Counters::add(&self.counters.clock_behind, kind, 1);
        self.counters
            .clock_behind_max_us
            .fetch_max(behind_us, Ordering::Relaxed);
        tracing::warn!(
            lock = name,
            behind_us,
            "the node's clock is behind the lock's last fence (a failover to a node whose clock \
             lags, or a clock stepped back): fences stay monotonic while the lock's key survives"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::fingerprint;

    #[test]
    fn a_lower_fence_is_a_regression_only_after_the_earlier_reply_was_read() {
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        let mut marks = FenceMarks::default();
        assert_eq!(marks.record(fingerprint("a"), 100, at(0), at(1)), None);
        // Sent before the grant of 100 was read: the replies crossed, no comparison.
        assert_eq!(marks.record(fingerprint("a"), 99, at(0), at(2)), None);
        // Sent after it was read: Redis ran 100 first, so 50 went backwards.
        assert_eq!(marks.record(fingerprint("a"), 50, at(3), at(4)), Some(100));
        // 50 is the mark now: the next higher grants are no alarm, one regression is one report.
        assert_eq!(marks.record(fingerprint("a"), 51, at(5), at(6)), None);
        assert_eq!(marks.record(fingerprint("a"), 52, at(7), at(8)), None);
        // Keys are apart.
        assert_eq!(marks.record(fingerprint("b"), 1, at(9), at(10)), None);
        assert_eq!(marks.record(fingerprint("a"), 40, at(11), at(12)), Some(52));
    }

    #[test]
    fn the_marks_stay_bounded() {
        let now = Instant::now();
        let mut marks = FenceMarks::default();
        for key in 0..MAX_MARKS + 10 {
            marks.record(fingerprint(&key.to_string()), 7, now, now);
        }
        assert!(marks.marks.len() <= MAX_MARKS);
    }
}
