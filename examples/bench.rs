//! Benchmarks against a running cluster (started by `scripts/bench.sh`):
//!
//! - `handoff`: from the moment a holder releases to the moment the next waiter holds the lock,
//!   with wake-ups on release and with polling only;
//! - `fair-handoff`: the same for the fair lock (wake-ups only: a release wakes the head);
//! - `throughput`: uncontended acquire + release pairs per second from 64 tasks;
//! - `renewal`: the watchdog's calls per node per renewal period and the client memory per held
//!   lock, for 10,000 held locks;
//! - `semaphore`: acquire + release pairs per second of one semaphore (limit 64) from 64 tasks,
//!   after the mutex's uncontended pairs in the same run.
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
    let client = Client::connect(urls.to_vec()).await.expect("connect");
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
    println!(
        "throughput tasks={tasks} pairs={pairs} seconds={elapsed:.2} pairs/s={:.0} calls/s={:.0}",
        pairs as f64 / elapsed,
        2.0 * pairs as f64 / elapsed
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
