//! The core a client shares with its guards and requests: the transport, the background
//! runtime (wake-ups, watchdog), the counters and the client's settings.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::fence::FenceMode;
use crate::local_queue::LocalQueues;
use crate::runtime::wakeups::Wakeups;
use crate::runtime::watchdog::Watchdog;
use crate::stats::{Counters, Stats};
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

    /// A snapshot of the counters, with the transport's rebuilds and batches.
    pub(crate) fn stats(&self) -> Stats {
        let mut stats = self.counters.snapshot();
        stats.connection_rebuilds = self.transport.rebuilds();
        (stats.batches, stats.batched_calls) = self.transport.batches();
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
