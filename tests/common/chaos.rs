//! Fault injection on a real cluster. Workers take a lock and do a read-modify-write through a
//! store; midway a fault hits the lock's master (or a holder); a checker reads the history and
//! reports safety and availability numbers. Every primitive runs as one lane, all side by side
//! in the same slot, so one fault hits them all: fencelock's mutex, read-write lock (write holds
//! through the store, read holds beside them), fair lock and semaphore, each with a
//! fence-checking store; the latch's `set` (generations are fences); and the plain recipe
//! (`SET NX PX`, an `INCR` counter as token, a store that trusts the lock).
//!
//! Shared by `tests/chaos.rs` (short runs in CI) and `examples/chaos.rs` (the long run).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock::{
    Client, FairLockGuard, FenceMode, Latch, LockGuard, LockOptions, PermitGuard, Placement,
    ReadGuard, Semaphore, WriteGuard,
};
use redis::cluster_async::ClusterConnection;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::netns::{self, ClockShim, Net, Shape};
use super::{Cluster, Launch, Node, Standalone};

/// Every lock of a run lives in this tag's slot.
const TAG: &str = "chaos";
/// The name of every fencelock lock (placed by [`TAG`]); each kind has its own key.
const NAME: &str = "work";
/// The latch is placed by its name only: named as the tag, its key is `fencelock:{chaos}:latch`.
const LATCH: &str = TAG;
/// Permits of the semaphore lane: two exclusive resources, one per permit number.
const PERMITS: u32 = 2;
/// Writer and reader workers of the read-write lock lane.
const WRITERS: usize = 2;
const READERS: usize = 2;
/// A read-write lock writer's rest after its release: a waiting writer keeps new readers out,
/// so with writers always waiting the readers would hardly ever get in (writer priority).
const WRITER_REST: Duration = Duration::from_millis(5);
/// Workers of the latch lane, each calling `set` in a loop.
const SETTERS: usize = 2;
/// A setter's pause between two `set` calls, so the latch lane does not outrun the others.
const SET_EVERY: Duration = Duration::from_millis(5);
const PLAIN_LOCK: &str = "plain:{chaos}:lock";
const PLAIN_COUNTER: &str = "plain:{chaos}:counter";
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// What bounds a worker's acquire call: the lock timeout plus one request timeout (there is
/// no WAIT in these runs).
pub const CALL_DEADLINE: Duration = ACQUIRE_TIMEOUT.saturating_add(REQUEST_TIMEOUT);
/// How long a worker "works" while holding the lock, between its read and its write.
const WORK: Duration = Duration::from_millis(1);
/// Client pauses per run of [`Fault::ClientPause`].
const CLIENT_PAUSES: usize = 3;
/// Client namespaces of the network faults: worker `i` of every lane runs in namespace
/// `i % SIDES`; side 0 is the one cut off.
const SIDES: usize = 2;

/// What goes wrong midway through a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The slot's master is SIGKILLed; the cluster elects its replica.
    MasterKill,
    /// The master is SIGSTOPped until its replica is elected, then SIGCONTed (it comes back).
    MasterPause,
    /// `CLUSTER FAILOVER` on the replica.
    Failover,
    /// `CLUSTER FAILOVER FORCE`.
    FailoverForce,
    /// `CLUSTER FAILOVER TAKEOVER`.
    FailoverTakeover,
    /// The replica is paused and cut off, grants go on at the master, the master is killed and
    /// the lagging replica promoted: acknowledged writes are lost.
    ForcedLoss,
    /// The slot moves to another master (SETSLOT/MIGRATE) while locks are taken.
    SlotMigration,
    /// A holder stalls for 2.5 × TTL between its read and its write (a GC pause).
    ClientPause,
    /// Network namespaces: the slot's master and client namespace 0 are cut off from the other
    /// nodes and client namespace 1; the majority promotes the replica; then the partition heals
    /// and the old master rejoins as a replica. The store is reachable from both sides.
    MinorityPartition,
    /// Network namespaces: 50 ms ± 20 ms of delay and 5% frame loss on every client link, for
    /// a tenth of the run's grants per lane (at most 30 s).
    ClientLatency,
    /// Network namespaces: a holder in client namespace 0 (one per lane with a store) is cut
    /// off from everything for 2.5 × TTL between its read and its write, then writes.
    ClientPartition,
    /// Forced loss ([`Fault::ForcedLoss`]) onto a replica whose wall clock runs this many ms
    /// behind (LD_PRELOAD clock shim, set before the cut); the cut lasts 50 grants per lane
    /// and at least 2 × TTL.
    SkewedLoss(i64),
    /// The slot's master is SIGKILLed and restarted empty (no persistence, `nodes.conf` kept)
    /// before the cluster notices; its replica resynchronises from it and is emptied too.
    MasterRestartEmpty,
    /// A standalone server (the only one) is SIGKILLed and restarted empty.
    StandaloneRestartEmpty,
}

impl Fault {
    pub const ALL: [Fault; 17] = [
        Fault::MasterKill,
        Fault::MasterPause,
        Fault::Failover,
        Fault::FailoverForce,
        Fault::FailoverTakeover,
        Fault::ForcedLoss,
        Fault::SlotMigration,
        Fault::ClientPause,
        Fault::MinorityPartition,
        Fault::ClientLatency,
        Fault::ClientPartition,
        Fault::SkewedLoss(1_000),
        Fault::SkewedLoss(5_000),
        Fault::SkewedLoss(60_000),
        Fault::MasterRestartEmpty,
        Fault::StandaloneRestartEmpty,
        Fault::SkewedLoss(0),
    ];

    /// Whether the run puts servers and clients in network namespaces.
    pub fn needs_netns(self) -> bool {
        matches!(
            self,
            Fault::MinorityPartition | Fault::ClientLatency | Fault::ClientPartition
        )
    }

    /// The short name used on the command line.
    pub fn id(self) -> &'static str {
        match self {
            Fault::MasterKill => "kill",
            Fault::MasterPause => "pause",
            Fault::Failover => "failover",
            Fault::FailoverForce => "force",
            Fault::FailoverTakeover => "takeover",
            Fault::ForcedLoss => "forced-loss",
            Fault::SlotMigration => "migrate",
            Fault::ClientPause => "client-pause",
            Fault::MinorityPartition => "minority",
            Fault::ClientLatency => "latency",
            Fault::ClientPartition => "client-partition",
            Fault::SkewedLoss(1_000) => "skew-1s",
            Fault::SkewedLoss(5_000) => "skew-5s",
            Fault::SkewedLoss(60_000) => "skew-60s",
            Fault::SkewedLoss(0) => "skew-0s",
            Fault::SkewedLoss(_) => "skew",
            Fault::MasterRestartEmpty => "restart-empty",
            Fault::StandaloneRestartEmpty => "standalone-restart-empty",
        }
    }

    /// Whether the fault leaves Redis with every write it acknowledged (nothing lost, no
    /// server down): a lease then holds, and no two holders may overlap (guarantee 1 of
    /// docs/safety.md; a paused or cut-off holder stops believing at its lease's end).
    pub fn keeps_every_write(self) -> bool {
        matches!(
            self,
            Fault::Failover
                | Fault::SlotMigration
                | Fault::ClientPause
                | Fault::ClientLatency
                | Fault::ClientPartition
        )
    }

    pub fn parse(id: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.id() == id)
    }

    fn describe(self) -> &'static str {
        match self {
            Fault::MasterKill => "master SIGKILL",
            Fault::MasterPause => "master SIGSTOP > node-timeout, SIGCONT",
            Fault::Failover => "CLUSTER FAILOVER",
            Fault::FailoverForce => "CLUSTER FAILOVER FORCE",
            Fault::FailoverTakeover => "CLUSTER FAILOVER TAKEOVER",
            Fault::ForcedLoss => "forced loss (cut replica, kill master, TAKEOVER)",
            Fault::SlotMigration => "slot migration (SETSLOT/MIGRATE)",
            Fault::ClientPause => "client paused 2.5 x TTL",
            Fault::MinorityPartition => "minority master + 1 client partitioned",
            Fault::ClientLatency => "client links 50±20 ms, 5% loss",
            Fault::ClientPartition => "client partitioned 2.5 x TTL",
            Fault::SkewedLoss(1_000) => "forced loss, new master's clock 1 s behind",
            Fault::SkewedLoss(5_000) => "forced loss, new master's clock 5 s behind",
            Fault::SkewedLoss(60_000) => "forced loss, new master's clock 60 s behind",
            Fault::SkewedLoss(0) => "forced loss, clock shim, no skew",
            Fault::SkewedLoss(_) => "forced loss, new master's clock behind",
            Fault::MasterRestartEmpty => "master restarted empty",
            Fault::StandaloneRestartEmpty => "standalone restarted empty",
        }
    }
}

/// One run: a fault and how much traffic to drive around it.
#[derive(Clone, Debug)]
pub struct Plan {
    pub fault: Fault,
    /// Grants per lane over the run (half before the fault): write holds for the read-write
    /// lock, `set` calls for the latch.
    pub grants: usize,
    /// Workers per lock lane (the latch lane has [`SETTERS`], the read-write lock lane
    /// [`READERS`] more).
    pub workers: usize,
    pub ttl: Duration,
    /// The lanes driven side by side.
    pub kinds: Vec<Kind>,
    /// How the fencelock lanes' client computes tokens.
    pub fence: FenceMode,
    /// How long a writer holds between its read and its write (default 1 ms); longer holds
    /// let holders on both sides of a partition overlap.
    pub work: Duration,
    /// Every server loads fencelock's Redis module (the clients use it where it serves).
    pub module: bool,
}

impl Plan {
    pub fn new(fault: Fault, grants: usize) -> Self {
        Self {
            fault,
            grants,
            workers: 4,
            ttl: Duration::from_millis(500),
            kinds: Kind::ALL.to_vec(),
            fence: FenceMode::default(),
            work: WORK,
            module: false,
        }
    }
}

/// The short name of a fence mode (command line and table).
pub fn fence_id(mode: FenceMode) -> &'static str {
    match mode {
        FenceMode::Clock => "clock",
        FenceMode::Epoch => "epoch",
        FenceMode::Counter => "counter",
        FenceMode::EpochClock => "epoch-clock",
        _ => "other",
    }
}

/// The fence mode named `id` (`clock`, `epoch`, `counter`, `epoch-clock`).
pub fn parse_fence(id: &str) -> Option<FenceMode> {
    [
        FenceMode::Clock,
        FenceMode::Epoch,
        FenceMode::Counter,
        FenceMode::EpochClock,
    ]
    .into_iter()
    .find(|m| fence_id(*m) == id)
}

/// One lane of a run: a primitive, its workers and its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `Client::lock`, and a store that rejects stale fences on read and write.
    Mutex,
    /// `Client::write_lock` through the same kind of store, with [`READERS`] workers taking
    /// `read_lock` beside the writers (no store for them: their fences and their exclusion
    /// from writers are checked).
    RwLock,
    /// `Client::fair_lock`, and a fenced store.
    Fair,
    /// One permit of a semaphore with [`PERMITS`] permits; the store keeps the highest fence
    /// per permit number (each number is its own exclusive resource).
    Semaphore,
    /// `Latch::set` in a loop: each call starts a generation (a fence); no hold, no store.
    Latch,
    /// `SET NX PX` + `INCR` token, and a store that trusts whoever holds the lock.
    Plain,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::Mutex,
        Kind::RwLock,
        Kind::Fair,
        Kind::Semaphore,
        Kind::Latch,
        Kind::Plain,
    ];

    /// The short name used on the command line.
    pub fn id(self) -> &'static str {
        match self {
            Kind::Mutex => "mutex",
            Kind::RwLock => "rwlock",
            Kind::Fair => "fair",
            Kind::Semaphore => "semaphore",
            Kind::Latch => "latch",
            Kind::Plain => "plain",
        }
    }

    pub fn parse(id: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.id() == id)
    }

    /// Whether the lane is one of fencelock's primitives (its fences must hold).
    pub fn is_fencelock(self) -> bool {
        self != Kind::Plain
    }

    /// Whether the lane's workers write through a store (every lane but the latch).
    pub fn has_store(self) -> bool {
        self != Kind::Latch
    }

    fn describe(self) -> &'static str {
        match self {
            Kind::Mutex => "fencelock mutex (odd workers linger)",
            Kind::RwLock => "fencelock rwlock (writes + reads)",
            Kind::Fair => "fencelock fair lock",
            Kind::Semaphore => "fencelock semaphore, 2 permits",
            Kind::Latch => "fencelock latch `set`",
            Kind::Plain => "plain SET NX PX",
        }
    }
}

/// What the checker found for one lane in one run.
#[derive(Clone, Debug)]
pub struct Report {
    pub fault: Fault,
    pub kind: Kind,
    pub fence: FenceMode,
    /// Exclusive holds (writes for the read-write lock), or `set` calls for the latch.
    pub grants: usize,
    /// Read holds (read-write lock only).
    pub reads: usize,
    pub failed_acquires: usize,
    pub duplicate_tokens: usize,
    pub regressions: usize,
    pub stale_writes_accepted: usize,
    pub lost_updates: usize,
    pub overlaps: usize,
    /// Overlaps whose later holder was granted before the fault started (Redis healthy).
    pub overlaps_before_fault: usize,
    /// The longest time two holders both believed they held the same resource.
    pub longest_overlap: Duration,
    pub writes_rejected: usize,
    /// The longest acquire call, failed ones included (each is bounded by its deadline).
    pub longest_call: Duration,
    pub unavailable: Duration,
    pub steady: Percentiles,
    pub during: Percentiles,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Percentiles {
    pub p50: Duration,
    pub p99: Duration,
}

impl Report {
    pub const HEADER: &'static str = "| fault | lock | fence mode | grants | duplicate tokens | \
        regressions | stale writes accepted | lost updates | overlapping holders | \
        longest overlap | writes rejected | unavailable | longest acquire call | \
        acquire p50 / p99 steady | acquire p50 / p99 during fault |\n\
        |---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|";

    /// One markdown table row. The latch lane has no store and no holders: "–" there.
    pub fn row(&self) -> String {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        let grants = match self.kind {
            Kind::RwLock => format!("{} + {} reads", self.grants, self.reads),
            _ => self.grants.to_string(),
        };
        let held = |n: usize| {
            if self.kind.has_store() {
                n.to_string()
            } else {
                "–".to_owned()
            }
        };
        let fence = if self.kind.is_fencelock() {
            fence_id(self.fence)
        } else {
            "–"
        };
        let overlap = if self.kind.has_store() {
            ms(self.longest_overlap)
        } else {
            "–".to_owned()
        };
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} |",
            self.fault.describe(),
            self.kind.describe(),
            fence,
            grants,
            self.duplicate_tokens,
            self.regressions,
            held(self.stale_writes_accepted),
            held(self.lost_updates),
            held(self.overlaps),
            overlap,
            held(self.writes_rejected),
            ms(self.unavailable),
            ms(self.longest_call),
            ms(self.steady.p50),
            ms(self.steady.p99),
            ms(self.during.p50),
            ms(self.during.p99),
        )
    }

    /// The three numbers fencing promises to keep at zero.
    pub fn fencing_violations(&self) -> usize {
        self.duplicate_tokens + self.regressions + self.stale_writes_accepted
    }

    /// Overlapping holders where the leases promise none: before the fault, and throughout a
    /// fault that keeps every write ([`Fault::keeps_every_write`]). 0 for lanes without holders.
    pub fn exclusion_violations(&self) -> usize {
        if !self.kind.has_store() {
            return 0;
        }
        if self.fault.keeps_every_write() {
            self.overlaps
        } else {
            self.overlaps_before_fault
        }
    }
}

/// The servers of a run and what the fault needs beside them.
struct Env {
    servers: Servers,
    /// Set for the network faults; client namespace `i` runs on `runtimes[i]`.
    net: Option<Net>,
    runtimes: Vec<tokio::runtime::Runtime>,
    /// Set for the clock faults: every node runs with the shim preloaded.
    shim: Option<ClockShim>,
}

enum Servers {
    Cluster(Cluster),
    Standalone(Box<Standalone>),
}

impl Env {
    fn start(fault: Fault, module: bool) -> Env {
        let (mut net, mut runtimes, mut shim) = (None, Vec::new(), None);
        let extra = if module {
            super::module::load_args(fault == Fault::StandaloneRestartEmpty)
        } else {
            Vec::new()
        };
        let servers = match fault {
            Fault::StandaloneRestartEmpty => {
                let args: Vec<&str> = extra.iter().map(String::as_str).collect();
                Servers::Standalone(Box::new(Standalone {
                    node: Node::spawn_launched(&args, Launch::default()),
                }))
            }
            Fault::SkewedLoss(_) => {
                let built = ClockShim::build();
                let cluster = Cluster::start_with_args(&extra, |_| built.launch(Launch::default()));
                shim = Some(built);
                Servers::Cluster(cluster)
            }
            f if f.needs_netns() => {
                let mut built = Net::new();
                let launches: Vec<Launch> = (0..6).map(|_| built.node_launch()).collect();
                let cluster = Cluster::start_with_args(&extra, |i| launches[i].clone());
                for i in 0..SIDES {
                    built.add_client();
                    runtimes.push(built.runtime(i, 2));
                }
                net = Some(built);
                Servers::Cluster(cluster)
            }
            _ => Servers::Cluster(Cluster::start_with_args(&extra, |_| Launch::default())),
        };
        Env {
            servers,
            net,
            runtimes,
            shim,
        }
    }

    fn urls(&self) -> Vec<String> {
        match &self.servers {
            Servers::Cluster(cluster) => cluster.urls(),
            Servers::Standalone(server) => vec![server.url()],
        }
    }

    fn cluster(&mut self) -> &mut Cluster {
        match &mut self.servers {
            Servers::Cluster(cluster) => cluster,
            Servers::Standalone(_) => panic!("a cluster fault on a standalone server"),
        }
    }

    /// Where worker `i` of a lane runs: its client namespace's runtime, or this one.
    fn handles(&self) -> Vec<Handle> {
        if self.runtimes.is_empty() {
            vec![Handle::current()]
        } else {
            self.runtimes.iter().map(|r| r.handle().clone()).collect()
        }
    }

    /// Stops everything; call outside async code (stopping servers blocks).
    fn stop(self) {
        drop(self);
    }
}

impl Drop for Env {
    /// Also on a panic: the client runtimes stop without blocking; then the servers, the
    /// namespaces and the shim go (fields drop in declaration order).
    fn drop(&mut self) {
        for runtime in self.runtimes.drain(..) {
            runtime.shutdown_background();
        }
    }
}

/// Runs `plan` on fresh servers and reports every lane.
pub async fn run(plan: &Plan) -> Vec<Report> {
    let (fault, module) = (plan.fault, plan.module);
    let env = tokio::task::spawn_blocking(move || Env::start(fault, module))
        .await
        .expect("servers start");
    let urls = env.urls();
    let standalone = matches!(env.servers, Servers::Standalone(_));
    let slot = fencelock::slot_of(TAG.as_bytes());
    let handles = env.handles();
    let env = Arc::new(Mutex::new(env));

    // Worker i of every fencelock lane shares client i, made on (and driven by) the runtime
    // of its side.
    let mut clients = Vec::new();
    if plan.kinds.iter().any(|k| k.is_fencelock()) {
        for i in 0..plan.workers.max(READERS).max(SETTERS) {
            let builder = Client::builder(urls.iter().map(String::as_str))
                .request_timeout(REQUEST_TIMEOUT)
                .fence_mode(plan.fence);
            let client = handles[i % handles.len()]
                .spawn(async move { builder.connect().await })
                .await
                .expect("connect task")
                .expect("fencelock client");
            clients.push(client);
        }
    }
    let mut lanes = Vec::new();
    for &kind in &plan.kinds {
        lanes.push(Lane::start(kind, &clients, &urls, plan, slot, &handles, standalone).await);
    }
    for lane in &lanes {
        lane.await_grants(plan.grants / 2, Duration::from_secs(120))
            .await;
    }

    let fault_start = Instant::now();
    match plan.fault {
        Fault::ClientPause | Fault::ClientPartition => {
            let partition = plan.fault == Fault::ClientPartition;
            let pauses = if partition { 1 } else { CLIENT_PAUSES };
            let writing: Vec<&Lane> = lanes.iter().filter(|l| l.kind.has_store()).collect();
            for lane in &writing {
                lane.shared.pauses_wanted.store(pauses, Ordering::SeqCst);
            }
            if partition {
                // Every lane's side-0 holder is between its read and its write: cut side 0
                // off from everything for 2.5 × TTL, then let them write.
                for lane in &writing {
                    let mut holding = lane.shared.pauses_holding.subscribe();
                    let _ = tokio::time::timeout(
                        Duration::from_secs(60),
                        holding.wait_for(|n| *n >= 1),
                    )
                    .await;
                }
                let env = Arc::clone(&env);
                let ttl = plan.ttl;
                tokio::task::spawn_blocking(move || {
                    let env = env.lock().unwrap_or_else(|e| e.into_inner());
                    let net = env.net.as_ref().expect("network faults have a net");
                    let side = net.client(0).ip.clone();
                    let server = &env.urls()[0];
                    assert!(
                        ping_from(net, 0, server, Duration::from_secs(5)).is_some(),
                        "client 0 reaches {server} before the cut"
                    );
                    let cut = Instant::now();
                    net.isolate(&side);
                    assert_eq!(
                        ping_from(net, 0, server, Duration::from_secs(1)),
                        None,
                        "client 0 still reaches {server} across the cut"
                    );
                    // The fault is this long: a wait for time itself, not for an event.
                    std::thread::sleep(
                        (cut + ttl * 5 / 2).saturating_duration_since(Instant::now()),
                    );
                    net.heal();
                })
                .await
                .expect("partition");
                for lane in &writing {
                    lane.shared.healed.send_replace(true);
                }
            }
            for lane in &writing {
                let mut done = lane.shared.pauses_done.subscribe();
                let _ =
                    tokio::time::timeout(Duration::from_secs(60), done.wait_for(|n| *n >= pauses))
                        .await;
            }
        }
        fault => {
            let grants: Vec<_> = lanes.iter().map(|l| l.shared.grants.subscribe()).collect();
            let handle = tokio::runtime::Handle::current();
            let env = Arc::clone(&env);
            let degraded_grants = (plan.grants / 10).max(10);
            let ttl = plan.ttl;
            tokio::task::spawn_blocking(move || {
                // Waits until every lane made `n` more grants, or `cap` has passed.
                let await_grants = |n: usize, cap: Duration| {
                    handle.block_on(async {
                        let until = tokio::time::Instant::now() + cap;
                        for rx in &grants {
                            let target = *rx.borrow() + n;
                            let mut rx = rx.clone();
                            let _ =
                                tokio::time::timeout_at(until, rx.wait_for(|g| *g >= target)).await;
                        }
                    })
                };
                let mut env = env.lock().unwrap_or_else(|e| e.into_inner());
                inject(&mut env, fault, slot, ttl, degraded_grants, await_grants);
            })
            .await
            .expect("fault injection");
        }
    }
    let fault_end = Instant::now();

    for lane in &lanes {
        let wanted = plan.grants.max(lane.grants() + plan.grants / 10);
        lane.await_grants(wanted, Duration::from_secs(120)).await;
    }
    let mut reports = Vec::new();
    for lane in lanes {
        let kind = lane.kind;
        let (history, shared) = lane.stop().await;
        reports.push(check(
            kind,
            plan.fault,
            plan.fence,
            &history,
            &shared,
            fault_start,
            fault_end,
        ));
    }
    if plan.module {
        let stats = clients.iter().map(Client::stats);
        let (served, fell_back) = stats.fold((0, 0), |(s, f), st| {
            (s + st.module_calls, f + st.module_fallbacks)
        });
        eprintln!(
            "{}: the module answered {served} calls ({fell_back} went to the scripts)",
            plan.fault.id()
        );
    }
    drop(clients);
    let env = Arc::try_unwrap(env)
        .ok()
        .expect("fault thread is done")
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    tokio::task::spawn_blocking(move || env.stop())
        .await
        .expect("servers stop");
    reports
}

/// How long `redis-cli PING` from client `i`'s namespace to `url` took (its connect
/// included), or `None` when it got no answer within `limit` (`timeout(1)` ends it).
fn ping_from(net: &Net, i: usize, url: &str, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    let output = net
        .command(i, "timeout")
        .args([
            &format!("{:.3}", limit.as_secs_f64()),
            "redis-cli",
            "-u",
            url,
        ])
        .args(["--no-raw", "PING"])
        .output()
        .expect("timeout and redis-cli run");
    String::from_utf8_lossy(&output.stdout)
        .contains("PONG")
        .then(|| started.elapsed())
}

/// Applies a fault to the master of `slot` (or to the standalone server) and returns once the
/// servers have settled.
///
/// `degraded_grants`: how many grants per lane the client links stay degraded for
/// ([`Fault::ClientLatency`], at most 30 s).
fn inject(
    env: &mut Env,
    fault: Fault,
    slot: u16,
    ttl: Duration,
    degraded_grants: usize,
    await_grants: impl Fn(usize, Duration),
) {
    if fault == Fault::StandaloneRestartEmpty {
        let Servers::Standalone(server) = &mut env.servers else {
            unreachable!("standalone fault")
        };
        server.node.restart_empty();
        return;
    }
    let net = env.net.take();
    let cluster = env.cluster();
    let master = cluster.master_of_slot(slot).port;
    let replica = cluster.replica_of(master).port;
    match fault {
        Fault::MasterKill => {
            cluster.node_mut(master).kill();
            cluster.wait_promoted(replica, slot, &[master]);
        }
        Fault::MasterPause => {
            cluster.node(master).pause();
            cluster.wait_promoted(replica, slot, &[master]);
            cluster.node(master).resume();
            cluster.wait_replica(master);
        }
        Fault::Failover | Fault::FailoverForce | Fault::FailoverTakeover => {
            let mode = match fault {
                Fault::FailoverForce => "FORCE",
                Fault::FailoverTakeover => "TAKEOVER",
                _ => "",
            };
            cluster.promote(replica, mode, slot, &[]);
            cluster.wait_replica(master);
        }
        Fault::ForcedLoss => {
            cluster.cut_off_replica(master, replica);
            await_grants(50, Duration::from_secs(30));
            cluster.take_over_with_lagging_replica(master, replica, slot);
        }
        Fault::SkewedLoss(behind) => {
            netns::set_clock_offset(cluster.node(replica), -behind);
            let cut = Instant::now();
            cluster.cut_off_replica(master, replica);
            await_grants(50, Duration::from_secs(30));
            // The lost window outlasts a lease: a promoted master whose clock is behind sees
            // the last replicated lease as running longer and waits it out, which hides the
            // skew when fewer than a lease's worth of grants were lost. The fault is this long:
            // a wait for time itself.
            std::thread::sleep((cut + ttl * 2).saturating_duration_since(Instant::now()));
            cluster.take_over_with_lagging_replica(master, replica, slot);
        }
        Fault::SlotMigration => {
            let target = cluster
                .nodes
                .iter()
                .find(|n| n.port != master && n.info("replication").contains("role:master"))
                .expect("another master")
                .port;
            cluster.migrate_slot(slot, master, target, || {
                await_grants(20, Duration::from_secs(30))
            });
        }
        Fault::MasterRestartEmpty => {
            cluster.node_mut(master).restart_empty();
            let info = cluster.node(master).info("replication");
            assert!(
                info.contains("role:master"),
                "restarted before the cluster noticed, it is still master: {info}"
            );
            cluster.wait_healthy();
        }
        Fault::MinorityPartition => {
            let net = net.as_ref().expect("network faults have a net");
            let old = cluster.node(master).host.clone();
            let minority = [old.as_str(), net.client(0).ip.as_str()];
            let majority: Vec<String> = net
                .all_ips()
                .into_iter()
                .filter(|ip| !minority.contains(&ip.as_str()))
                .collect();
            let majority: Vec<&str> = majority.iter().map(String::as_str).collect();
            net.partition(&minority, &majority);
            cluster.wait_promoted(replica, slot, &[master]);
            // The majority side grants on the new master for a while before the heal (lanes
            // whose clients stay stuck on the old master, like redis-rs's for the plain
            // recipe, get no more than 5 s).
            await_grants(20, Duration::from_secs(5));
            net.heal();
            cluster.wait_replica(master);
        }
        Fault::ClientLatency => {
            let net = net.as_ref().expect("network faults have a net");
            for i in 0..net.clients() {
                net.shape(i, Shape::degraded());
            }
            // A connect and a PING: two round trips of at least 2 × 30 ms each.
            let server = cluster.node(master).url();
            let took = ping_from(net, 0, &server, Duration::from_secs(5));
            assert!(
                took.is_some_and(|took| took >= Duration::from_millis(100)),
                "client 0's link to {server} is not degraded: PING took {took:?}"
            );
            await_grants(degraded_grants, Duration::from_secs(30));
            for i in 0..net.clients() {
                net.shape(i, Shape::default());
            }
        }
        Fault::ClientPause | Fault::ClientPartition | Fault::StandaloneRestartEmpty => {
            unreachable!("handled by the workers")
        }
    }
    env.net = net;
}

/// What a worker does with a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Holds exclusively (one permit number of the semaphore): read → work → write via the
    /// store, then release.
    Writer,
    /// Holds a read lock, shared with other readers, for the work's time; no store.
    Reader,
    /// Calls `Latch::set`: a new generation, no hold.
    Setter,
}

/// One grant as a worker saw it.
#[derive(Clone, Copy, Debug)]
struct Grant {
    token: u64,
    /// The resource the grant is exclusive to: the permit number (semaphore), else 0.
    resource: u32,
    role: Role,
    /// When the acquire call started.
    requested: Instant,
    /// When the grant reply arrived.
    granted: Instant,
    /// When the holder stopped believing it held the lock: its release started or its lease
    /// ran out, whichever came first.
    end: Instant,
}

#[derive(Default)]
struct History {
    grants: Vec<Grant>,
    failed_acquires: usize,
    /// The longest acquire call, failed ones included.
    longest_call: Duration,
}

/// State shared by one lane's workers and the run.
struct LaneShared {
    stop: AtomicBool,
    /// Grants of writers and setters (readers are not counted towards the plan's grants).
    grants: watch::Sender<usize>,
    pauses_wanted: AtomicUsize,
    /// Paused holders between their read and their write ([`Fault::ClientPartition`]).
    pauses_holding: watch::Sender<usize>,
    pauses_done: watch::Sender<usize>,
    /// [`Fault::ClientPartition`]: a pause lasts until the partition healed (`true`), and only
    /// side-0 writers take one.
    partition: bool,
    healed: watch::Sender<bool>,
    store: Store,
}

struct Lane {
    kind: Kind,
    shared: Arc<LaneShared>,
    workers: Vec<JoinHandle<History>>,
}

impl Lane {
    /// Starts `kind`'s workers; worker `i` uses client `i` and runs on `handles[i % n]`
    /// (client `i` was made there: in the client namespace of side `i % n`).
    async fn start(
        kind: Kind,
        clients: &[Client],
        urls: &[String],
        plan: &Plan,
        slot: u16,
        handles: &[Handle],
        standalone: bool,
    ) -> Lane {
        let shared = Arc::new(LaneShared {
            stop: AtomicBool::new(false),
            grants: watch::Sender::new(0),
            pauses_wanted: AtomicUsize::new(0),
            pauses_holding: watch::Sender::new(0),
            pauses_done: watch::Sender::new(0),
            partition: plan.fault == Fault::ClientPartition,
            healed: watch::Sender::new(false),
            store: Store::new(kind.is_fencelock()),
        });
        let options = LockOptions::new()
            .tag(TAG)
            .ttl(plan.ttl)
            .timeout(ACQUIRE_TIMEOUT);
        let client = |i: usize| clients[i % clients.len()].clone();
        // (worker's client index, locker): the index picks the side.
        let mut lockers: Vec<(usize, Locker)> = Vec::new();
        match kind {
            Kind::Mutex => {
                // Odd workers' releases linger (LockOptions::linger): a hot lock's cohorts.
                for i in 0..plan.workers {
                    let options = options.clone().linger(i % 2 == 1);
                    lockers.push((i, Locker::Mutex(client(i), options)));
                }
            }
            Kind::RwLock => {
                for i in 0..WRITERS {
                    lockers.push((i, Locker::Write(client(i), options.clone())));
                }
                for i in 0..READERS {
                    lockers.push((i, Locker::Read(client(i), options.clone())));
                }
            }
            Kind::Fair => {
                for i in 0..plan.workers {
                    lockers.push((i, Locker::Fair(client(i), options.clone())));
                }
            }
            Kind::Semaphore => {
                for i in 0..plan.workers {
                    let semaphore = client(i)
                        .semaphore(NAME, PERMITS)
                        .and_then(|s| s.with_placement(&Placement::Tag(TAG.into())))
                        .expect("semaphore handle");
                    assert_eq!(semaphore.keys().slot(), slot, "the semaphore's slot");
                    lockers.push((i, Locker::Semaphore(semaphore, options.clone())));
                }
            }
            Kind::Latch => {
                for i in 0..SETTERS {
                    let latch = client(i).latch(LATCH).expect("latch handle");
                    assert_eq!(latch.slot(), slot, "the latch's slot");
                    lockers.push((i, Locker::Latch(latch)));
                }
            }
            Kind::Plain => {
                for i in 0..plan.workers {
                    let (urls, ttl) = (urls.to_vec(), plan.ttl);
                    let locker = handles[i % handles.len()]
                        .spawn(async move { Locker::plain(&urls, ttl, standalone).await })
                        .await
                        .expect("plain connect task");
                    lockers.push((i, locker));
                }
            }
        }
        let workers = lockers
            .into_iter()
            .map(|(i, locker)| {
                let side = i % handles.len();
                let task = work(locker, Arc::clone(&shared), plan.ttl, plan.work, side);
                handles[side].spawn(task)
            })
            .collect();
        Lane {
            kind,
            shared,
            workers,
        }
    }

    fn grants(&self) -> usize {
        *self.shared.grants.borrow()
    }

    async fn await_grants(&self, target: usize, limit: Duration) {
        let mut rx = self.shared.grants.subscribe();
        let _ = tokio::time::timeout(limit, rx.wait_for(|g| *g >= target)).await;
    }

    async fn stop(self) -> (History, Arc<LaneShared>) {
        self.shared.stop.store(true, Ordering::SeqCst);
        let mut all = History::default();
        for worker in self.workers {
            // Each call is bounded by its deadline and a hold by the longest pause (a
            // partition's, at most 60 s): a worker still running after that hangs.
            let history = tokio::time::timeout(Duration::from_secs(120), worker)
                .await
                .unwrap_or_else(|_| {
                    panic!("a {} worker did not stop: a call hangs", self.kind.id())
                })
                .expect("worker");
            all.grants.extend(history.grants);
            all.failed_acquires += history.failed_acquires;
            all.longest_call = all.longest_call.max(history.longest_call);
        }
        (all, self.shared)
    }
}

async fn work(
    mut locker: Locker,
    shared: Arc<LaneShared>,
    ttl: Duration,
    work_for: Duration,
    side: usize,
) -> History {
    let role = locker.role();
    let mut history = History::default();
    while !shared.stop.load(Ordering::SeqCst) {
        let requested = Instant::now();
        let acquired = locker.acquire().await;
        history.longest_call = history.longest_call.max(requested.elapsed());
        let Some(hold) = acquired else {
            history.failed_acquires += 1;
            if role == Role::Setter {
                tokio::time::sleep(SET_EVERY).await;
            }
            continue;
        };
        let granted = Instant::now();
        if role != Role::Reader {
            shared.grants.send_modify(|n| *n += 1);
        }
        let holder = Holder {
            token: hold.token,
            resource: hold.resource,
            granted,
            requested,
        };
        let mut pause = false;
        match role {
            Role::Writer => {
                pause = (!shared.partition || side == 0)
                    && shared
                        .pauses_wanted
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                        .is_ok();
                let read = shared.store.read(&holder);
                if pause && shared.partition {
                    // Cut off while holding: the work needs the network until it heals.
                    shared.pauses_holding.send_modify(|n| *n += 1);
                    let mut healed = shared.healed.subscribe();
                    let _ = tokio::time::timeout(Duration::from_secs(60), healed.wait_for(|h| *h))
                        .await;
                } else {
                    tokio::time::sleep(if pause { ttl * 5 / 2 } else { work_for }).await;
                }
                if let Some(version) = read {
                    shared.store.write(&holder, version);
                }
            }
            Role::Reader => tokio::time::sleep(WORK).await,
            Role::Setter => {}
        }
        let end = Instant::now().min(hold.valid_until);
        locker.release(hold).await;
        if pause {
            shared.pauses_done.send_modify(|n| *n += 1);
        }
        history.grants.push(Grant {
            token: holder.token,
            resource: holder.resource,
            role,
            requested,
            granted,
            end,
        });
        if let Some(rest) = locker.rest() {
            tokio::time::sleep(rest).await;
        }
    }
    history
}

/// A grant of any kind, held until [`Locker::release`].
struct Hold {
    token: u64,
    resource: u32,
    valid_until: Instant,
    release: Release,
}

enum Release {
    Mutex(LockGuard),
    Write(WriteGuard),
    Read(ReadGuard),
    Fair(FairLockGuard),
    Permit(PermitGuard),
    Plain(String),
    /// A latch generation: nothing held.
    Nothing,
}

/// One worker's handle on its lane's primitive.
enum Locker {
    Mutex(Client, LockOptions),
    Write(Client, LockOptions),
    Read(Client, LockOptions),
    Fair(Client, LockOptions),
    Semaphore(Semaphore, LockOptions),
    Latch(Latch),
    Plain(PlainConnection, Duration),
}

/// The plain recipe's connection: to the cluster, or to a standalone server.
#[derive(Clone)]
enum PlainConnection {
    Cluster(ClusterConnection),
    Standalone(redis::aio::ConnectionManager),
}

impl redis::aio::ConnectionLike for PlainConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            PlainConnection::Cluster(c) => c.req_packed_command(cmd),
            PlainConnection::Standalone(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            PlainConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            PlainConnection::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl Locker {
    async fn plain(urls: &[String], ttl: Duration, standalone: bool) -> Locker {
        if standalone {
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(REQUEST_TIMEOUT))
                .set_response_timeout(Some(REQUEST_TIMEOUT));
            let conn = redis::Client::open(urls[0].as_str())
                .expect("standalone client")
                .get_connection_manager_with_config(config)
                .await
                .expect("standalone connection");
            return Locker::Plain(PlainConnection::Standalone(conn), ttl);
        }
        let conn = redis::cluster::ClusterClientBuilder::new(urls.to_vec())
            .connection_timeout(REQUEST_TIMEOUT)
            .response_timeout(REQUEST_TIMEOUT)
            .retries(3)
            .min_retry_wait(10)
            .max_retry_wait(300)
            .build()
            .expect("cluster client")
            .get_async_connection()
            .await
            .expect("cluster connection");
        Locker::Plain(PlainConnection::Cluster(conn), ttl)
    }

    fn role(&self) -> Role {
        match self {
            Locker::Read(..) => Role::Reader,
            Locker::Latch(_) => Role::Setter,
            _ => Role::Writer,
        }
    }

    /// How long the worker waits after a grant before it asks again.
    fn rest(&self) -> Option<Duration> {
        match self {
            Locker::Write(..) => Some(WRITER_REST),
            Locker::Latch(_) => Some(SET_EVERY),
            _ => None,
        }
    }

    /// Acquires within [`ACQUIRE_TIMEOUT`], or gives up.
    async fn acquire(&mut self) -> Option<Hold> {
        let hold = |token: u64, resource: u32, valid_until: Instant, release: Release| Hold {
            token,
            resource,
            valid_until,
            release,
        };
        match self {
            Locker::Mutex(client, options) => {
                let guard = client.lock(NAME, options).await.ok()?;
                let (token, until) = (guard.fence().get(), guard.valid_until());
                Some(hold(token, 0, until, Release::Mutex(guard)))
            }
            Locker::Write(client, options) => {
                let guard = client.write_lock(NAME, options).await.ok()?;
                let (token, until) = (guard.fence().get(), guard.valid_until());
                Some(hold(token, 0, until, Release::Write(guard)))
            }
            Locker::Read(client, options) => {
                let guard = client.read_lock(NAME, options).await.ok()?;
                let (token, until) = (guard.fence().get(), guard.valid_until());
                Some(hold(token, 0, until, Release::Read(guard)))
            }
            Locker::Fair(client, options) => {
                let guard = client.fair_lock(NAME, options).await.ok()?;
                let (token, until) = (guard.fence().get(), guard.valid_until());
                Some(hold(token, 0, until, Release::Fair(guard)))
            }
            Locker::Semaphore(semaphore, options) => {
                let guard = semaphore.acquire(options).await.ok()?;
                let permit = *guard.permits().first()?;
                let until = guard.valid_until();
                Some(hold(
                    permit.fence.get(),
                    permit.number,
                    until,
                    Release::Permit(guard),
                ))
            }
            Locker::Latch(latch) => {
                let generation = latch.set(1).await.ok()?;
                Some(hold(generation.get(), 0, Instant::now(), Release::Nothing))
            }
            Locker::Plain(conn, ttl) => {
                let deadline = Instant::now() + ACQUIRE_TIMEOUT;
                tokio::time::timeout(
                    ACQUIRE_TIMEOUT + REQUEST_TIMEOUT,
                    plain_acquire(conn, *ttl, deadline),
                )
                .await
                .ok()
                .flatten()
            }
        }
    }

    async fn release(&mut self, hold: Hold) {
        // Errors are part of the run (a lease lost in a failover): the checker judges the
        // history, not the release's outcome.
        match hold.release {
            Release::Mutex(guard) => drop(guard.release().await),
            Release::Write(guard) => drop(guard.release().await),
            Release::Read(guard) => drop(guard.release().await),
            Release::Fair(guard) => drop(guard.release().await),
            Release::Permit(guard) => drop(guard.release().await),
            Release::Plain(owner) => {
                let Locker::Plain(conn, _) = self else {
                    unreachable!("kinds match")
                };
                let script = redis::Script::new(
                    "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                     return redis.call('DEL', KEYS[1]) else return 0 end",
                );
                let mut invocation = script.key(PLAIN_LOCK);
                invocation.arg(owner);
                let _ =
                    tokio::time::timeout(REQUEST_TIMEOUT * 2, invocation.invoke_async::<i64>(conn))
                        .await;
            }
            Release::Nothing => {}
        }
    }
}

/// The usual recipe: `SET lock owner NX PX ttl`, then `INCR counter` as the token.
async fn plain_acquire(
    conn: &mut PlainConnection,
    ttl: Duration,
    deadline: Instant,
) -> Option<Hold> {
    let owner = uuid::Uuid::new_v4().to_string();
    loop {
        let sent = Instant::now();
        let set: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(PLAIN_LOCK)
            .arg(&owner)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(conn)
            .await;
        if let Ok(Some(_)) = set {
            let token: u64 = redis::cmd("INCR")
                .arg(PLAIN_COUNTER)
                .query_async(conn)
                .await
                .ok()?;
            return Some(Hold {
                token,
                resource: 0,
                valid_until: sent + ttl - (ttl / 100 + Duration::from_millis(2)),
                release: Release::Plain(owner),
            });
        }
        if Instant::now() >= deadline {
            return None;
        }
        let jitter = 2 + (uuid::Uuid::new_v4().as_u128() % 8) as u64;
        tokio::time::sleep(Duration::from_millis(jitter)).await;
    }
}

/// The holder as the store sees it.
#[derive(Clone, Copy)]
struct Holder {
    token: u64,
    resource: u32,
    requested: Instant,
    granted: Instant,
}

/// The protected resources: one versioned value per resource number (the semaphore's permit
/// numbers; 0 for the locks). With checks on, it admits a holder only if its token is at least
/// the highest it has seen for that resource, on reads as well as writes. It also records, from
/// outside knowledge of real time, the writes that should never have been accepted.
struct Store {
    checks: bool,
    state: Mutex<BTreeMap<u32, StoreState>>,
}

#[derive(Default)]
struct StoreState {
    highest: u64,
    version: u64,
    /// The latest `requested` instant among holders whose writes were accepted.
    newest_writer: Option<Instant>,
    rejected: usize,
    stale_accepted: usize,
    lost_updates: usize,
}

impl StoreState {
    fn admit(&mut self, checks: bool, holder: &Holder) -> bool {
        if checks && holder.token < self.highest {
            self.rejected += 1;
            return false;
        }
        self.highest = self.highest.max(holder.token);
        true
    }
}

impl Store {
    fn new(checks: bool) -> Self {
        Self {
            checks,
            state: Mutex::default(),
        }
    }

    /// The current version, or `None` when the holder's token is stale.
    fn read(&self, holder: &Holder) -> Option<u64> {
        let mut states = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = states.entry(holder.resource).or_default();
        state.admit(self.checks, holder).then_some(state.version)
    }

    fn write(&self, holder: &Holder, read_version: u64) {
        let mut states = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let state = states.entry(holder.resource).or_default();
        if !state.admit(self.checks, holder) {
            return;
        }
        if state.version != read_version {
            state.lost_updates += 1;
        }
        // Stale: a holder that asked for the resource after this one already held it has
        // written.
        if state
            .newest_writer
            .is_some_and(|newest| newest > holder.granted)
        {
            state.stale_accepted += 1;
        }
        state.version += 1;
        state.newest_writer = state.newest_writer.max(Some(holder.requested));
    }
}

/// What [`overlaps`] found.
#[derive(Debug, PartialEq)]
struct Overlaps {
    count: usize,
    /// Those whose later holder was granted before `fault_start`.
    before: usize,
    longest: Duration,
}

/// Overlap, per resource, in `by_granted` (sorted by grant time): a writer granted while an
/// earlier holder (writer or reader) still believed it held it, or a reader granted while an
/// earlier writer did.
fn overlaps(by_granted: &[&Grant], fault_start: Instant) -> Overlaps {
    #[derive(Default)]
    struct Believed {
        writer: Option<Instant>,
        any: Option<Instant>,
    }
    let mut believed: BTreeMap<u32, Believed> = BTreeMap::new();
    let mut found = Overlaps {
        count: 0,
        before: 0,
        longest: Duration::ZERO,
    };
    // A grant whose reply came after its own lease end was never believed: no overlap.
    for grant in by_granted
        .iter()
        .filter(|g| g.role != Role::Setter && g.end > g.granted)
    {
        let until = believed.entry(grant.resource).or_default();
        let conflict = match grant.role {
            Role::Writer => until.any,
            _ => until.writer,
        };
        if let Some(until) = conflict.filter(|until| grant.granted < *until) {
            found.count += 1;
            if grant.granted < fault_start {
                found.before += 1;
            }
            found.longest = found.longest.max(
                until
                    .min(grant.end)
                    .saturating_duration_since(grant.granted),
            );
        }
        until.any = until.any.max(Some(grant.end));
        if grant.role == Role::Writer {
            until.writer = until.writer.max(Some(grant.end));
        }
    }
    found
}

/// The overlap check on made-up histories: it finds a second writer granted inside the
/// first's hold (and one before the fault as such), a reader inside a writer's, the same on
/// another permit number not, and neither holders that follow each other nor two readers.
pub fn overlap_check_finds_double_grants() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let grant = |resource, role, from: u64, to: u64| Grant {
        token: from,
        resource,
        role,
        requested: at(from),
        granted: at(from),
        end: at(to),
    };
    let check = |grants: &[Grant], fault_start: u64| {
        let mut by_granted: Vec<&Grant> = grants.iter().collect();
        by_granted.sort_by_key(|g| g.granted);
        overlaps(&by_granted, at(fault_start))
    };
    let apart = [
        grant(0, Role::Writer, 0, 10),
        grant(0, Role::Writer, 10, 20),
        grant(0, Role::Reader, 20, 30),
        grant(0, Role::Reader, 25, 35),
        grant(1, Role::Writer, 25, 30),
        grant(0, Role::Setter, 26, 26),
    ];
    assert_eq!(
        check(&apart, 100),
        Overlaps {
            count: 0,
            before: 0,
            longest: Duration::ZERO
        }
    );
    let double = [
        grant(0, Role::Writer, 0, 10),
        grant(0, Role::Writer, 4, 20),
        grant(0, Role::Reader, 30, 40),
        grant(0, Role::Writer, 35, 50),
    ];
    assert_eq!(
        check(&double, 20),
        Overlaps {
            count: 2,
            before: 1,
            longest: Duration::from_millis(6)
        }
    );
    let reader_in_writer = [grant(0, Role::Writer, 0, 10), grant(0, Role::Reader, 9, 12)];
    assert_eq!(check(&reader_in_writer, 0).count, 1);
    // A reply that arrived past its lease's end (a delayed link): never believed, no overlap.
    let late = Grant {
        end: at(5),
        ..grant(0, Role::Writer, 6, 6)
    };
    assert_eq!(check(&[grant(0, Role::Writer, 0, 10), late], 0).count, 0);
}

fn check(
    kind: Kind,
    fault: Fault,
    fence: FenceMode,
    history: &History,
    lane: &LaneShared,
    fault_start: Instant,
    fault_end: Instant,
) -> Report {
    let grants = &history.grants;

    // Every grant of a lane takes its token from one counter (the semaphore's permits and the
    // read-write lock's reads and writes alike), so the two token checks span the whole lane.
    let mut seen = HashSet::new();
    let duplicate_tokens = grants.iter().filter(|g| !seen.insert(g.token)).count();

    // A regression: a grant requested after another was granted, with a token not above it.
    let mut by_granted: Vec<&Grant> = grants.iter().collect();
    by_granted.sort_by_key(|g| g.granted);
    let mut by_requested: Vec<&Grant> = grants.iter().collect();
    by_requested.sort_by_key(|g| g.requested);
    let (mut earlier, mut highest, mut regressions) = (0, None, 0);
    for grant in &by_requested {
        while earlier < by_granted.len() && by_granted[earlier].granted < grant.requested {
            highest = highest.max(Some(by_granted[earlier].token));
            earlier += 1;
        }
        if highest.is_some_and(|h| grant.token <= h) {
            regressions += 1;
        }
    }

    let Overlaps {
        count: overlaps,
        before: overlaps_before_fault,
        longest: longest_overlap,
    } = overlaps(&by_granted, fault_start);

    // Availability and latency are measured on the lane's counted grants (not on reads).
    let counted: Vec<&Grant> = by_granted
        .iter()
        .copied()
        .filter(|g| g.role != Role::Reader)
        .collect();

    // The longest stretch without a grant from the fault's start to the first grant after it.
    let mut unavailable = Duration::ZERO;
    let mut previous = fault_start;
    for grant in counted.iter().filter(|g| g.granted > fault_start) {
        unavailable = unavailable.max(grant.granted - previous);
        previous = grant.granted;
        if grant.granted > fault_end {
            break;
        }
    }

    // A wait that overlaps the fault counts as "during"; all others as steady.
    let latencies = |during: bool| {
        let mut waits: Vec<Duration> = counted
            .iter()
            .filter(|g| (g.granted >= fault_start && g.requested <= fault_end) == during)
            .map(|g| g.granted - g.requested)
            .collect();
        waits.sort();
        let at = |q: usize| {
            waits
                .get((waits.len() * q / 100).min(waits.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        Percentiles {
            p50: at(50),
            p99: at(99),
        }
    };

    let states = lane.store.state.lock().unwrap_or_else(|e| e.into_inner());
    let sum = |field: fn(&StoreState) -> usize| states.values().map(field).sum();
    Report {
        fault,
        kind,
        fence,
        grants: counted.len(),
        reads: grants.len() - counted.len(),
        failed_acquires: history.failed_acquires,
        duplicate_tokens,
        regressions,
        stale_writes_accepted: sum(|s| s.stale_accepted),
        lost_updates: sum(|s| s.lost_updates),
        overlaps,
        overlaps_before_fault,
        longest_overlap,
        writes_rejected: sum(|s| s.rejected),
        longest_call: history.longest_call,
        unavailable,
        steady: latencies(false),
        during: latencies(true),
    }
}
