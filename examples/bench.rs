//! Benchmarks against a running cluster (started by `scripts/bench.sh`):
//!
//! - `handoff`: from the moment a holder releases to the moment the next waiter holds the lock,
//!   with wake-ups on release and with polling only;
//! - `fair-handoff`: the same for the fair lock (wake-ups only: a release wakes the head);
//! - `throughput`: uncontended acquire + release pairs per second from 64 tasks;
//! - `renewal`: the watchdog's calls per node per renewal period and the client memory per held
//!   lock, for 10,000 held locks;
//! - `semaphore`: acquire + release pairs per second of one semaphore (limit 64) from 64 tasks,
//!   after the mutex's uncontended pairs in the same run;
//! - `rwlock`: 64 tasks over 4 clients on ONE read-write lock, 90% reads / 10% writes chosen by
//!   a seeded PRNG, for a fixed time; then the same workload with every hold taking the mutex of
//!   one name (all exclusive); grants/s and acquire latency per role, and overlaps of a write
//!   with any other hold counted in process (must be 0).
//!
//! ```text
//! cargo run --release --example bench -- --url redis://127.0.0.1:7400 handoff
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use fencelock::{Client, LockOptions};

/// Counts live heap bytes, for the memory per held lock.
struct Counting;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Parser)]
struct Args {
    /// Cluster node URLs.
    #[arg(
        long = "url",
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7400"
    )]
    urls: Vec<String>,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Release-to-next-holder latency with 4 contending clients.
    Handoff {
        /// Handoffs to measure per mode.
        #[arg(long, default_value_t = 2000)]
        handoffs: usize,
        /// How long each holder keeps the lock, in ms.
        #[arg(long, default_value_t = 1)]
        hold_ms: u64,
    },
    /// Release-to-next-holder latency of the fair lock with 4 contending clients.
    FairHandoff {
        /// Handoffs to measure.
        #[arg(long, default_value_t = 2000)]
        handoffs: usize,
        /// How long each holder keeps the lock, in ms.
        #[arg(long, default_value_t = 1)]
        hold_ms: u64,
    },
    /// Uncontended acquire + release pairs per second.
    Throughput {
        #[arg(long, default_value_t = 64)]
        tasks: usize,
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// Watchdog cost for many held locks.
    Renewal {
        #[arg(long, default_value_t = 10_000)]
        locks: usize,
        /// Lock TTL in ms (renewal period TTL/3).
        #[arg(long, default_value_t = 3000)]
        ttl_ms: u64,
        /// Renewal periods to observe.
        #[arg(long, default_value_t = 5)]
        periods: u32,
    },
    /// Semaphore acquire + release pairs per second, against the mutex's in the same run.
    Semaphore {
        #[arg(long, default_value_t = 64)]
        tasks: usize,
        /// The semaphore's permits.
        #[arg(long, default_value_t = 64)]
        limit: u32,
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
    /// Read-write lock with mostly readers, against the mutex (all exclusive) in the same run.
    Rwlock {
        #[arg(long, default_value_t = 64)]
        tasks: usize,
        /// Clients the tasks are spread over (round robin), as processes would be.
        #[arg(long, default_value_t = 4)]
        clients: usize,
        /// Percent of iterations that read (the rest write).
        #[arg(long, default_value_t = 90)]
        read_percent: u32,
        /// Hold times in ms, one measurement pair (rwlock, mutex) per value.
        #[arg(long, value_delimiter = ',', default_value = "0,1")]
        hold_ms: Vec<u64>,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
    },
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match args.bench {
        Bench::Handoff { handoffs, hold_ms } => {
            for wake in [true, false] {
                handoff(
                    &args.urls,
                    wake,
                    false,
                    handoffs,
                    Duration::from_millis(hold_ms),
                )
                .await;
            }
        }
        Bench::FairHandoff { handoffs, hold_ms } => {
            handoff(
                &args.urls,
                true,
                true,
                handoffs,
                Duration::from_millis(hold_ms),
            )
            .await;
        }
        Bench::Throughput { tasks, seconds } => throughput(&args.urls, tasks, seconds).await,
        Bench::Renewal {
            locks,
            ttl_ms,
            periods,
        } => renewal(&args.urls, locks, Duration::from_millis(ttl_ms), periods).await,
        Bench::Semaphore {
            tasks,
            limit,
            seconds,
        } => {
            throughput(&args.urls, tasks, seconds).await;
            semaphore(&args.urls, tasks, limit, seconds).await;
        }
        Bench::Rwlock {
            tasks,
            clients,
            read_percent,
            hold_ms,
            seconds,
        } => {
            let mut clients_made = Vec::new();
            for _ in 0..clients.max(1) {
                clients_made.push(Client::connect(args.urls.clone()).await.expect("connect"));
            }
            let workload = RwWorkload {
                tasks,
                read_percent: read_percent.min(100),
                seconds,
            };
            for hold in hold_ms {
                for shared in [true, false] {
                    rwlock(
                        &clients_made,
                        &workload,
                        shared,
                        Duration::from_millis(hold),
                    )
                    .await;
                }
            }
        }
    }
}

/// A mutex or fair-lock guard, for the handoff benchmark.
enum Guard {
    Mutex(fencelock::LockGuard),
    Fair(fencelock::FairLockGuard),
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Four clients (as four processes would be) take turns on one lock; each holds it for `hold`.
/// A holder notes the time just before it sends the release; the next holder measures from it.
/// With `fair`, the contenders take the fair lock of that name instead.
async fn handoff(urls: &[String], wake: bool, fair: bool, handoffs: usize, hold: Duration) {
    const CONTENDERS: usize = 4;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(30));
    let released_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let samples = Arc::new(Mutex::new(Vec::with_capacity(handoffs)));
    let name = format!("bench:handoff:{wake}");
    let mode = match (fair, wake) {
        (true, _) => "fair",
        (false, true) => "wake-up",
        (false, false) => "polling",
    };
    let (granted_tx, granted_rx) = tokio::sync::watch::channel(0u64);
    let granted_tx = Arc::new(granted_tx);
    let mut tasks = Vec::new();
    for _ in 0..CONTENDERS {
        let client = Client::builder(urls.to_vec())
            .wake_on_release(wake)
            .connect()
            .await
            .expect("connect");
        let (options, released_at, samples, name) = (
            options.clone(),
            Arc::clone(&released_at),
            Arc::clone(&samples),
            name.clone(),
        );
        let (granted_tx, mut granted_rx) = (Arc::clone(&granted_tx), granted_rx.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let guard = if fair {
                    Guard::Fair(client.fair_lock(&name, &options).await.expect("fair lock"))
                } else {
                    Guard::Mutex(client.lock(&name, &options).await.expect("lock"))
                };
                let granted = Instant::now();
                granted_tx.send_modify(|n| *n += 1);
                granted_rx.borrow_and_update();
                let at = released_at.lock().unwrap().take();
                {
                    let mut samples = samples.lock().unwrap();
                    if samples.len() >= handoffs {
                        // Wake the others so they see the count and stop.
                        drop(samples);
                        granted_tx.send_modify(|n| *n += 1);
                        break;
                    }
                    if let Some(at) = at {
                        samples.push(granted - at);
                    }
                }
                tokio::time::sleep(hold).await;
                *released_at.lock().unwrap() = Some(Instant::now());
                match guard {
                    Guard::Mutex(guard) => guard.release().await.expect("release"),
                    Guard::Fair(guard) => guard.release().await.expect("release"),
                }
                // Contend again only once another waiter holds it: every sample is a handoff
                // to a waiter that was already waiting.
                if granted_rx.changed().await.is_err() || samples.lock().unwrap().len() >= handoffs
                {
                    break;
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("contender");
    }
    let mut samples = samples.lock().unwrap().clone();
    samples.sort();
    println!(
        "handoff {:<8} hold={hold:?} n={} p50={:.2?} p90={:.2?} p99={:.2?} max={:.2?}",
        mode,
        samples.len(),
        percentile(&samples, 0.5),
        percentile(&samples, 0.9),
        percentile(&samples, 0.99),
        samples.last().copied().unwrap_or_default(),
    );
}

/// `tasks` tasks, each acquiring and releasing locks of its own in a loop, on one client.
async fn throughput(urls: &[String], tasks: usize, seconds: u64) {
    // `FENCELOCK_BATCHING=0` sends every call on its own (to compare).
    let batching = std::env::var("FENCELOCK_BATCHING").map_or(true, |v| v != "0");
    let client = Client::builder(urls.to_vec())
        .batching(batching)
        .connect()
        .await
        .expect("connect");
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    // Warm up: scripts cached on every master, connections open.
    for i in 0..1000 {
        let guard = client.try_lock(&format!("bench:warm:{i}"), &options).await;
        guard
            .expect("warm-up lock")
            .release()
            .await
            .expect("release");
    }
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (client, options) = (client.clone(), options.clone());
        handles.push(tokio::spawn(async move {
            let mut pairs = 0u64;
            while Instant::now() < until {
                let name = format!("bench:tp:{task}:{}", pairs % 1000);
                let guard = client.try_lock(&name, &options).await.expect("lock");
                guard.release().await.expect("release");
                pairs += 1;
            }
            pairs
        }));
    }
    let mut pairs = 0;
    for handle in handles {
        pairs += handle.await.expect("task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stats = client.stats();
    println!(
        "throughput tasks={tasks} pairs={pairs} seconds={elapsed:.2} pairs/s={:.0} calls/s={:.0} \
         batching={batching} batches={} mean_batch={:.1}",
        pairs as f64 / elapsed,
        2.0 * pairs as f64 / elapsed,
        stats.batches,
        stats.batched_calls as f64 / stats.batches.max(1) as f64,
    );
}

/// `tasks` tasks take one permit of one semaphore with `limit` permits and release it, as fast
/// as they can (waiting when all permits are held).
async fn semaphore(urls: &[String], tasks: usize, limit: u32, seconds: u64) {
    let client = Client::connect(urls.to_vec()).await.expect("connect");
    let semaphore = client.semaphore("bench:sem", limit).expect("semaphore");
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(30));
    for _ in 0..1000 {
        let permit = semaphore.acquire(&options).await.expect("warm-up permit");
        permit.release().await.expect("release");
    }
    let busy_before = client.stats().busy;
    let until = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (semaphore, options) = (semaphore.clone(), options.clone());
        handles.push(tokio::spawn(async move {
            let mut pairs = 0u64;
            while Instant::now() < until {
                let permit = semaphore.acquire(&options).await.expect("permit");
                permit.release().await.expect("release");
                pairs += 1;
            }
            pairs
        }));
    }
    let mut pairs = 0;
    for handle in handles {
        pairs += handle.await.expect("task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "semaphore limit={limit} tasks={tasks} pairs={pairs} seconds={elapsed:.2} pairs/s={:.0} \
         busy={}",
        pairs as f64 / elapsed,
        client.stats().busy - busy_before
    );
}

/// Holds `locks` watched locks for `periods` renewal periods; reports the watchdog's calls and
/// the live heap bytes per held lock (guards included).
async fn renewal(urls: &[String], locks: usize, ttl: Duration, periods: u32) {
    let client = Client::connect(urls.to_vec()).await.expect("connect");
    let options = LockOptions::new().ttl(ttl).watchdog(true);
    // One held lock first, so the watchdog task and connections exist before measuring.
    let first = client
        .lock("bench:renew:first", &options)
        .await
        .expect("lock");
    let before = LIVE_BYTES.load(Ordering::Relaxed);
    let mut guards = Vec::with_capacity(locks);
    for i in 0..locks {
        let name = format!("bench:renew:{i}");
        guards.push(client.lock(&name, &options).await.expect("lock"));
    }
    let per_lock = (LIVE_BYTES.load(Ordering::Relaxed) - before) as f64 / locks as f64;
    // Let the renewals fall into step, then observe.
    let period = ttl / 3;
    tokio::time::sleep(period * 2).await;
    let start = client.stats();
    let started = Instant::now();
    tokio::time::sleep(period * periods).await;
    let end = client.stats();
    let observed = started.elapsed().as_secs_f64() / period.as_secs_f64();
    let all_valid = guards.iter().all(|g| g.is_valid());
    let calls = end.renewal_calls - start.renewal_calls;
    let renewals = end.renewals - start.renewals;
    println!(
        "renewal locks={} period={period:?} periods={observed:.2} calls={calls} \
         calls/period={:.2} renewals/period={:.0} lost={} all_valid={all_valid} \
         heap_bytes_per_lock={per_lock:.0}",
        locks + 1,
        calls as f64 / observed,
        renewals as f64 / observed,
        end.lost,
    );
    for guard in guards {
        guard.release().await.expect("release");
    }
    first.release().await.expect("release");
}

/// The mixed read/write workload of the `rwlock` benchmark.
struct RwWorkload {
    tasks: usize,
    read_percent: u32,
    seconds: u64,
}

/// A read or write hold of the read-write lock, or the mutex hold standing in for either.
enum RwHold {
    Read(fencelock::ReadGuard),
    Write(fencelock::WriteGuard),
    Mutex(fencelock::LockGuard),
}

impl RwHold {
    async fn release(self) -> fencelock::Result<()> {
        match self {
            RwHold::Read(guard) => guard.release().await,
            RwHold::Write(guard) => guard.release().await,
            RwHold::Mutex(guard) => guard.release().await,
        }
    }
}

/// splitmix64: a small deterministic PRNG, seeded per task, so both runs of a measurement and
/// both lock kinds see the same sequence of roles per task.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Per task: grant latencies per role and errors.
#[derive(Default)]
struct RwTally {
    reads: Vec<Duration>,
    writes: Vec<Duration>,
    errors: u64,
    first_error: Option<String>,
}

/// `workload.tasks` tasks spread over `clients` take turns on ONE name for `workload.seconds`:
/// each iteration reads with probability `read_percent` (else writes), holds for `hold`, and
/// releases. `shared`: the read-write lock (`read_lock` / `write_lock`); else the mutex of one
/// name for both roles. In-process counters of active readers and writers catch any write that
/// overlaps another hold (checked on every grant; a holder leaves the counters before it sends
/// its release, so a grant the server made after that release can never count as an overlap).
async fn rwlock(clients: &[Client], workload: &RwWorkload, shared: bool, hold: Duration) {
    use std::sync::atomic::AtomicU64;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(30));
    let kind = if shared { "rwlock" } else { "mutex" };
    let name = format!("bench:rw:{kind}:{}", hold.as_millis());
    // Warm up: scripts cached on the node, connections open.
    for client in clients {
        for _ in 0..50 {
            if shared {
                let read = client.read_lock(&name, &options).await;
                read.expect("warm-up read")
                    .release()
                    .await
                    .expect("release");
                let write = client.write_lock(&name, &options).await;
                write
                    .expect("warm-up write")
                    .release()
                    .await
                    .expect("release");
            } else {
                let lock = client.lock(&name, &options).await;
                lock.expect("warm-up lock")
                    .release()
                    .await
                    .expect("release");
            }
        }
    }
    let readers = Arc::new(AtomicI64::new(0));
    let writers = Arc::new(AtomicI64::new(0));
    let violations = Arc::new(AtomicU64::new(0));
    let max_readers = Arc::new(AtomicI64::new(0));
    let busy_before: u64 = clients.iter().map(|c| c.stats().busy).sum();
    let wakeups_before: u64 = clients.iter().map(|c| c.stats().wakeups).sum();
    let until = Instant::now() + Duration::from_secs(workload.seconds);
    let started = Instant::now();
    let mut handles = Vec::new();
    for task in 0..workload.tasks {
        let client = clients[task % clients.len()].clone();
        let (options, name) = (options.clone(), name.clone());
        let (readers, writers, violations, max_readers) = (
            Arc::clone(&readers),
            Arc::clone(&writers),
            Arc::clone(&violations),
            Arc::clone(&max_readers),
        );
        let read_percent = u64::from(workload.read_percent);
        handles.push(tokio::spawn(async move {
            let mut rng = SplitMix(0x5EED_0000 + task as u64);
            let mut tally = RwTally::default();
            while Instant::now() < until {
                let read = rng.next() % 100 < read_percent;
                let asked = Instant::now();
                let granted = match (shared, read) {
                    (true, true) => client.read_lock(&name, &options).await.map(RwHold::Read),
                    (true, false) => client.write_lock(&name, &options).await.map(RwHold::Write),
                    (false, _) => client.lock(&name, &options).await.map(RwHold::Mutex),
                };
                let guard = match granted {
                    Ok(guard) => guard,
                    Err(e) => {
                        tally.errors += 1;
                        tally.first_error.get_or_insert_with(|| e.to_string());
                        continue;
                    }
                };
                let waited = asked.elapsed();
                if read {
                    let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                    max_readers.fetch_max(now, Ordering::SeqCst);
                    if writers.load(Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    tally.reads.push(waited);
                } else {
                    let others = writers.fetch_add(1, Ordering::SeqCst);
                    if others != 0 || readers.load(Ordering::SeqCst) != 0 {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    tally.writes.push(waited);
                }
                if hold.is_zero() {
                    // Let the other tasks run while this one is counted as a holder.
                    tokio::task::yield_now().await;
                } else {
                    tokio::time::sleep(hold).await;
                }
                if read {
                    readers.fetch_sub(1, Ordering::SeqCst);
                } else {
                    writers.fetch_sub(1, Ordering::SeqCst);
                }
                if let Err(e) = guard.release().await {
                    tally.errors += 1;
                    tally.first_error.get_or_insert_with(|| e.to_string());
                }
            }
            tally
        }));
    }
    let mut all = RwTally::default();
    for handle in handles {
        let tally = handle.await.expect("task");
        all.reads.extend(tally.reads);
        all.writes.extend(tally.writes);
        all.errors += tally.errors;
        if all.first_error.is_none() {
            all.first_error = tally.first_error;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let busy = clients.iter().map(|c| c.stats().busy).sum::<u64>() - busy_before;
    let wakeups = clients.iter().map(|c| c.stats().wakeups).sum::<u64>() - wakeups_before;
    all.reads.sort();
    all.writes.sort();
    let summary = |samples: &[Duration]| {
        if samples.is_empty() {
            "n=0".to_string()
        } else {
            format!(
                "n={} /s={:.0} p50={:.2?} p99={:.2?} max={:.2?}",
                samples.len(),
                samples.len() as f64 / elapsed,
                percentile(samples, 0.5),
                percentile(samples, 0.99),
                samples.last().copied().unwrap_or_default(),
            )
        }
    };
    println!(
        "rwlock {kind:<6} hold={hold:?} tasks={} clients={} read%={} seconds={elapsed:.2} \
         grants/s={:.0} violations={} max_readers={} busy={busy} wakeups={wakeups} errors={}{}",
        workload.tasks,
        clients.len(),
        workload.read_percent,
        (all.reads.len() + all.writes.len()) as f64 / elapsed,
        violations.load(Ordering::SeqCst),
        max_readers.load(Ordering::SeqCst),
        all.errors,
        all.first_error
            .map(|e| format!(" first_error={e:?}"))
            .unwrap_or_default(),
    );
    println!("  read  {}", summary(&all.reads));
    println!("  write {}", summary(&all.writes));
}
