//! Fault injection on a real cluster. Workers take one lock and do a read-modify-write through a
//! store; midway a fault hits the lock's master (or a holder); a checker reads the history and
//! reports safety and availability numbers. Two locks run side by side in the same slot, so one
//! fault hits both: fencelock with a fence-checking store, and the plain recipe (`SET NX PX`,
//! an `INCR` counter as token, a store that trusts the lock).
//!
//! Shared by `tests/chaos.rs` (short runs in CI) and `examples/chaos.rs` (the long run).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock::{Client, LockGuard, LockOptions};
use redis::cluster_async::ClusterConnection;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Cluster;

/// Every lock of a run lives in this tag's slot.
const TAG: &str = "chaos";
const PLAIN_LOCK: &str = "plain:{chaos}:lock";
const PLAIN_COUNTER: &str = "plain:{chaos}:counter";
const REQUEST_TIMEOUT: Duration = Duration::from_millis(500);
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a worker "works" while holding the lock, between its read and its write.
const WORK: Duration = Duration::from_millis(1);
/// Client pauses per run of [`Fault::ClientPause`].
const CLIENT_PAUSES: usize = 3;

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
}

impl Fault {
    pub const ALL: [Fault; 8] = [
        Fault::MasterKill,
        Fault::MasterPause,
        Fault::Failover,
        Fault::FailoverForce,
        Fault::FailoverTakeover,
        Fault::ForcedLoss,
        Fault::SlotMigration,
        Fault::ClientPause,
    ];

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
        }
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
        }
    }
}

/// One run: a fault and how much traffic to drive around it.
#[derive(Clone, Debug)]
pub struct Plan {
    pub fault: Fault,
    /// Grants per lock over the run (half before the fault).
    pub grants: usize,
    pub workers: usize,
    pub ttl: Duration,
}

impl Plan {
    pub fn new(fault: Fault, grants: usize) -> Self {
        Self {
            fault,
            grants,
            workers: 4,
            ttl: Duration::from_millis(500),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// fencelock (clock fences) and a store that rejects stale fences on read and write.
    Fenced,
    /// `SET NX PX` + `INCR` token, and a store that trusts whoever holds the lock.
    Plain,
}

/// What the checker found for one lock in one run.
#[derive(Clone, Debug)]
pub struct Report {
    pub fault: Fault,
    pub variant: Variant,
    pub grants: usize,
    pub failed_acquires: usize,
    pub duplicate_tokens: usize,
    pub regressions: usize,
    pub stale_writes_accepted: usize,
    pub lost_updates: usize,
    pub overlaps: usize,
    pub writes_rejected: usize,
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
    pub const HEADER: &'static str = "| fault | lock | grants | duplicate tokens | regressions | \
        stale writes accepted | lost updates | overlapping holders | writes rejected | \
        unavailable | acquire p50 / p99 steady | acquire p50 / p99 during fault |\n\
        |---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|";

    /// One markdown table row.
    pub fn row(&self) -> String {
        let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} |",
            self.fault.describe(),
            match self.variant {
                Variant::Fenced => "fencelock",
                Variant::Plain => "plain SET NX PX",
            },
            self.grants,
            self.duplicate_tokens,
            self.regressions,
            self.stale_writes_accepted,
            self.lost_updates,
            self.overlaps,
            self.writes_rejected,
            ms(self.unavailable),
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
}

/// Runs `plan` on a fresh cluster and reports both locks.
pub async fn run(plan: &Plan) -> Vec<Report> {
    let cluster = tokio::task::spawn_blocking(Cluster::start)
        .await
        .expect("cluster start");
    let urls = cluster.urls();
    let slot = fencelock::slot_of(TAG.as_bytes());
    let cluster = Arc::new(Mutex::new(cluster));

    let lanes = [
        Lane::start(Variant::Fenced, &urls, plan).await,
        Lane::start(Variant::Plain, &urls, plan).await,
    ];
    for lane in &lanes {
        lane.await_grants(plan.grants / 2, Duration::from_secs(120))
            .await;
    }

    let fault_start = Instant::now();
    match plan.fault {
        Fault::ClientPause => {
            for lane in &lanes {
                lane.shared
                    .pauses_wanted
                    .store(CLIENT_PAUSES, Ordering::SeqCst);
            }
            for lane in &lanes {
                let mut done = lane.shared.pauses_done.subscribe();
                let _ = tokio::time::timeout(
                    Duration::from_secs(60),
                    done.wait_for(|n| *n >= CLIENT_PAUSES),
                )
                .await;
            }
        }
        fault => {
            let grants: Vec<_> = lanes.iter().map(|l| l.shared.grants.subscribe()).collect();
            let handle = tokio::runtime::Handle::current();
            let cluster = Arc::clone(&cluster);
            tokio::task::spawn_blocking(move || {
                let await_grants = |n: usize| {
                    handle.block_on(async {
                        for rx in &grants {
                            let target = *rx.borrow() + n;
                            let mut rx = rx.clone();
                            let _ = tokio::time::timeout(
                                Duration::from_secs(30),
                                rx.wait_for(|g| *g >= target),
                            )
                            .await;
                        }
                    })
                };
                let mut cluster = cluster.lock().unwrap_or_else(|e| e.into_inner());
                inject(&mut cluster, fault, slot, await_grants);
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
        let (history, store) = lane.stop().await;
        reports.push(check(plan.fault, &history, &store, fault_start, fault_end));
    }
    let cluster = Arc::try_unwrap(cluster)
        .ok()
        .expect("fault thread is done")
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .expect("cluster stop");
    reports
}

/// Applies a cluster fault to the master of `slot` and returns once the cluster has settled.
fn inject(cluster: &mut Cluster, fault: Fault, slot: u16, await_grants: impl Fn(usize)) {
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
            await_grants(50);
            cluster.take_over_with_lagging_replica(master, replica, slot);
        }
        Fault::SlotMigration => {
            let target = cluster
                .nodes
                .iter()
                .find(|n| n.port != master && n.info("replication").contains("role:master"))
                .expect("another master")
                .port;
            cluster.migrate_slot(slot, master, target, || await_grants(20));
        }
        Fault::ClientPause => unreachable!("handled by the workers"),
    }
}

/// One grant as a worker saw it.
#[derive(Clone, Copy, Debug)]
struct Grant {
    token: u64,
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
}

/// State shared by one lock's workers and the run.
struct LaneShared {
    stop: AtomicBool,
    grants: watch::Sender<usize>,
    pauses_wanted: AtomicUsize,
    pauses_done: watch::Sender<usize>,
    store: Store,
}

struct Lane {
    shared: Arc<LaneShared>,
    workers: Vec<JoinHandle<History>>,
}

impl Lane {
    async fn start(variant: Variant, urls: &[String], plan: &Plan) -> Lane {
        let shared = Arc::new(LaneShared {
            stop: AtomicBool::new(false),
            grants: watch::Sender::new(0),
            pauses_wanted: AtomicUsize::new(0),
            pauses_done: watch::Sender::new(0),
            store: Store::new(variant),
        });
        let mut workers = Vec::new();
        for _ in 0..plan.workers {
            let locker = Locker::connect(variant, urls, plan.ttl).await;
            let shared = Arc::clone(&shared);
            let ttl = plan.ttl;
            workers.push(tokio::spawn(work(locker, shared, ttl)));
        }
        Lane { shared, workers }
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
            let history = worker.await.expect("worker");
            all.grants.extend(history.grants);
            all.failed_acquires += history.failed_acquires;
        }
        (all, self.shared)
    }
}

async fn work(mut locker: Locker, shared: Arc<LaneShared>, ttl: Duration) -> History {
    let mut history = History::default();
    while !shared.stop.load(Ordering::SeqCst) {
        let requested = Instant::now();
        let Some(hold) = locker.acquire().await else {
            history.failed_acquires += 1;
            continue;
        };
        let granted = Instant::now();
        shared.grants.send_modify(|n| *n += 1);
        let pause = shared
            .pauses_wanted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let holder = Holder {
            token: hold.token,
            granted,
            requested,
        };
        let read = shared.store.read(&holder);
        tokio::time::sleep(if pause { ttl * 5 / 2 } else { WORK }).await;
        if let Some(version) = read {
            shared.store.write(&holder, version);
        }
        let end = Instant::now().min(hold.valid_until);
        locker.release(hold).await;
        if pause {
            shared.pauses_done.send_modify(|n| *n += 1);
        }
        history.grants.push(Grant {
            token: holder.token,
            requested,
            granted,
            end,
        });
    }
    history
}

/// A held lock of either kind.
struct Hold {
    token: u64,
    valid_until: Instant,
    release: Release,
}

enum Release {
    Guard(LockGuard),
    Plain(String),
}

enum Locker {
    Fenced(Client, LockOptions),
    Plain(ClusterConnection, Duration),
}

impl Locker {
    async fn connect(variant: Variant, urls: &[String], ttl: Duration) -> Locker {
        match variant {
            Variant::Fenced => {
                let client = Client::builder(urls.iter().map(String::as_str))
                    .request_timeout(REQUEST_TIMEOUT)
                    .connect()
                    .await
                    .expect("fencelock client");
                let options = LockOptions::new()
                    .tag(TAG)
                    .ttl(ttl)
                    .timeout(ACQUIRE_TIMEOUT);
                Locker::Fenced(client, options)
            }
            Variant::Plain => {
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
                Locker::Plain(conn, ttl)
            }
        }
    }

    /// Acquires within [`ACQUIRE_TIMEOUT`], or gives up.
    async fn acquire(&mut self) -> Option<Hold> {
        match self {
            Locker::Fenced(client, options) => {
                let guard = client.lock("work", options).await.ok()?;
                Some(Hold {
                    token: guard.fence().get(),
                    valid_until: guard.valid_until(),
                    release: Release::Guard(guard),
                })
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
        match (self, hold.release) {
            (_, Release::Guard(guard)) => {
                let _ = guard.release().await;
            }
            (Locker::Plain(conn, _), Release::Plain(owner)) => {
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
            (Locker::Fenced(..), Release::Plain(_)) => unreachable!("kinds match"),
        }
    }
}

/// The usual recipe: `SET lock owner NX PX ttl`, then `INCR counter` as the token.
async fn plain_acquire(
    conn: &mut ClusterConnection,
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
    requested: Instant,
    granted: Instant,
}

/// The protected resource: a versioned value. With checks on, it admits a holder only if its
/// token is at least the highest it has seen, on reads as well as writes. It also records, from
/// outside knowledge of real time, the writes that should never have been accepted.
struct Store {
    checks: bool,
    state: Mutex<StoreState>,
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

impl Store {
    fn new(variant: Variant) -> Self {
        Self {
            checks: variant == Variant::Fenced,
            state: Mutex::default(),
        }
    }

    fn admit(&self, state: &mut StoreState, holder: &Holder) -> bool {
        if self.checks && holder.token < state.highest {
            state.rejected += 1;
            return false;
        }
        state.highest = state.highest.max(holder.token);
        true
    }

    /// The current version, or `None` when the holder's token is stale.
    fn read(&self, holder: &Holder) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        self.admit(&mut state, holder).then_some(state.version)
    }

    fn write(&self, holder: &Holder, read_version: u64) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !self.admit(&mut state, holder) {
            return;
        }
        if state.version != read_version {
            state.lost_updates += 1;
        }
        // Stale: a holder that asked for the lock after this one already held it has written.
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

fn check(
    fault: Fault,
    history: &History,
    lane: &LaneShared,
    fault_start: Instant,
    fault_end: Instant,
) -> Report {
    let store = lane.store.state.lock().unwrap_or_else(|e| e.into_inner());
    let grants = &history.grants;

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

    // Overlap: a grant arrived while an earlier holder still believed it held the lock.
    let (mut believed_until, mut overlaps) = (None::<Instant>, 0);
    for grant in &by_granted {
        if believed_until.is_some_and(|until| grant.granted < until) {
            overlaps += 1;
        }
        believed_until = believed_until.max(Some(grant.end));
    }

    // The longest stretch without a grant from the fault's start to the first grant after it.
    let mut unavailable = Duration::ZERO;
    let mut previous = fault_start;
    for grant in by_granted.iter().filter(|g| g.granted > fault_start) {
        unavailable = unavailable.max(grant.granted - previous);
        previous = grant.granted;
        if grant.granted > fault_end {
            break;
        }
    }

    // A wait that overlaps the fault counts as "during"; all others as steady.
    let latencies = |during: bool| {
        let mut waits: Vec<Duration> = grants
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

    Report {
        fault,
        variant: if lane.store.checks {
            Variant::Fenced
        } else {
            Variant::Plain
        },
        grants: grants.len(),
        failed_acquires: history.failed_acquires,
        duplicate_tokens,
        regressions,
        stale_writes_accepted: store.stale_accepted,
        lost_updates: store.lost_updates,
        overlaps,
        writes_rejected: store.rejected,
        unavailable,
        steady: latencies(false),
        during: latencies(true),
    }
}
