//! Measurements of issue 12, against servers `scripts/bench-quorum.sh` starts:
//!
//! - `quorum`: the fenced quorum lock ([`QuorumClient`], two rounds: grant, then commit of the
//!   fence) over the first 3 and then all 5 given standalone servers, side by side with rslock's
//!   Redlock (`LockManager::new(urls)` over the same servers, one round, no fence): one task's
//!   acquire and release latency p50/p99, then pairs per second with `--tasks` tasks (16 and
//!   64), each on fresh random names of its own;
//! - `multi`: [`Client::try_lock_all`] of 2, 5 and 10 names spread over the masters of one
//!   cluster (member `i` on master `i mod masters`, names drawn until their slot lands there):
//!   one task's latency, then pairs per second with `--tasks` tasks (16); a plain `try_lock` of
//!   one name is measured the same way as the baseline (`members=1`).
//!
//! Every measurement prints one line, `qbench KIND key=value ...`. Uncontended: a busy or
//! timed-out attempt is counted in `failed=` (none expected) and not in the rate.
//!
//! rslock 0.10 runs with its defaults (`lock`: up to 3 tries, up to 200 ms apart; quorum
//! N/2 + 1; drift 1% + 2 ms), fencelock's quorum lock with its defaults (drift 1% + 2 ms,
//! request timeout 2 s). Both use a TTL of 10 s and no watchdog.
//!
//! ```text
//! cargo run --release --example quorum_bench -- \
//!     --url redis://127.0.0.1:7900,redis://127.0.0.1:7901,redis://127.0.0.1:7902,redis://127.0.0.1:7903,redis://127.0.0.1:7904 \
//!     quorum
//! cargo run --release --example quorum_bench -- --url redis://127.0.0.1:7910 multi
//! ```

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use fencelock::{Client, LockKeys, LockOptions, Placement, QuorumClient};

#[derive(Parser)]
struct Args {
    /// Node URLs: the standalone servers (`quorum`), or seeds of one cluster (`multi`).
    #[arg(long = "url", value_delimiter = ',', required = true)]
    urls: Vec<String>,
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Measured pairs per latency measurement (after 200 warm-up pairs).
    #[arg(long, default_value_t = 3000)]
    pairs: usize,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Lib {
    Fencelock,
    Rslock,
}

#[derive(Subcommand)]
enum Bench {
    /// Quorum lock vs rslock's Redlock over the first N of the given standalone servers.
    Quorum {
        /// Server counts (each a prefix of `--url`).
        #[arg(long, value_delimiter = ',', default_value = "3,5")]
        nodes: Vec<usize>,
        /// Task counts of the throughput measurements.
        #[arg(long, value_delimiter = ',', default_value = "16,64")]
        tasks: Vec<usize>,
        /// Which libraries to measure.
        #[arg(long, value_delimiter = ',', default_value = "fencelock,rslock")]
        libs: Vec<Lib>,
    },
    /// Multi-lock of several names spread over a cluster's masters.
    Multi {
        /// Member counts (1 = a plain `try_lock`, the baseline).
        #[arg(long, value_delimiter = ',', default_value = "1,2,5,10")]
        members: Vec<usize>,
        /// Task counts of the throughput measurements.
        #[arg(long, value_delimiter = ',', default_value = "16")]
        tasks: Vec<usize>,
    },
}

const TTL: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let seconds = Duration::from_secs(args.seconds);
    match &args.bench {
        Bench::Quorum { nodes, tasks, libs } => {
            for &n in nodes {
                assert!(
                    n <= args.urls.len(),
                    "--nodes {n}: only {} URLs",
                    args.urls.len()
                );
                let urls = &args.urls[..n];
                for &lib in libs {
                    let locker = Arc::new(Locker::quorum(lib, urls).await);
                    let label = format!("nodes={n} lib={}", locker.lib());
                    latency(&locker, "quorum", &label, args.pairs).await;
                    for &t in tasks {
                        throughput(&locker, "quorum", &label, t, seconds).await;
                    }
                }
            }
        }
        Bench::Multi { members, tasks } => {
            let masters = master_slots(&args.urls[0]).await;
            let client = Client::connect(args.urls.clone()).await.expect("connect");
            for &k in members {
                let locker = Arc::new(Locker::Multi {
                    client: client.clone(),
                    members: k,
                    masters: masters.clone(),
                });
                let label = format!(
                    "masters={} members={k} lib=fencelock call={}",
                    masters.len(),
                    if k == 1 { "try_lock" } else { "try_lock_all" }
                );
                locker.warm_up().await;
                latency(&locker, "multi", &label, args.pairs).await;
                for &t in tasks {
                    throughput(&locker, "multi", &label, t, seconds).await;
                }
            }
        }
    }
}

/// The slot ranges of each master of the cluster `url` belongs to (from `CLUSTER NODES`).
async fn master_slots(url: &str) -> Vec<Vec<(u16, u16)>> {
    let mut conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect for CLUSTER NODES");
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut conn)
        .await
        .expect("CLUSTER NODES (is --url a cluster node?)");
    let mut masters = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
            continue;
        }
        let ranges: Vec<(u16, u16)> = fields[8..]
            .iter()
            .filter(|r| !r.starts_with('['))
            .filter_map(|r| match r.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => r.parse().ok().map(|s| (s, s)),
            })
            .collect();
        if !ranges.is_empty() {
            masters.push(ranges);
        }
    }
    masters.sort();
    assert!(!masters.is_empty(), "no master with slots in CLUSTER NODES");
    masters
}

/// What is measured.
enum Locker {
    Quorum(QuorumClient),
    Rslock(rslock::LockManager),
    /// `members` names, member `i` on master `i mod masters.len()`.
    Multi {
        client: Client,
        members: usize,
        masters: Vec<Vec<(u16, u16)>>,
    },
}

/// A hold, released by [`Locker::release`].
enum Hold {
    Quorum(fencelock::QuorumGuard),
    Rslock(rslock::Lock),
    Single(fencelock::LockGuard),
    Multi(fencelock::MultiGuard),
}

/// Reused per task: name buffers, so the loop allocates only what the libraries do.
struct Names {
    rng: SplitMix,
    names: Vec<String>,
}

impl Names {
    fn new(task: u64) -> Self {
        Self {
            rng: SplitMix::seeded(task),
            names: Vec::new(),
        }
    }

    /// One fresh random name.
    fn one(&mut self, prefix: &str) -> &str {
        self.names.resize_with(1, String::new);
        let name = &mut self.names[0];
        name.clear();
        let _ = write!(name, "qbench:{prefix}:{:016x}", self.rng.next());
        name
    }

    /// `k` fresh random names, name `i` in a slot of `masters[i % masters.len()]`.
    fn spread(&mut self, k: usize, masters: &[Vec<(u16, u16)>]) -> Vec<&str> {
        self.names.resize_with(k, String::new);
        for (i, name) in self.names.iter_mut().enumerate() {
            let want = &masters[i % masters.len()];
            loop {
                name.clear();
                let _ = write!(name, "qbench:multi:{:016x}", self.rng.next());
                let slot = LockKeys::new("fencelock", name, &Placement::ByName)
                    .expect("name")
                    .slot();
                if want.iter().any(|&(a, b)| (a..=b).contains(&slot)) {
                    break;
                }
            }
        }
        self.names.iter().map(String::as_str).collect()
    }
}

impl Locker {
    async fn quorum(lib: Lib, urls: &[String]) -> Self {
        let locker = match lib {
            Lib::Fencelock => Locker::Quorum(
                QuorumClient::connect(urls.iter().cloned())
                    .await
                    .expect("quorum connect"),
            ),
            Lib::Rslock => Locker::Rslock(rslock::LockManager::new(urls.to_vec())),
        };
        locker.warm_up().await;
        locker
    }

    fn lib(&self) -> &'static str {
        match self {
            Locker::Rslock(_) => "rslock",
            _ => "fencelock",
        }
    }

    /// Connections open, scripts cached on every node.
    async fn warm_up(&self) {
        let mut names = Names::new(u64::MAX);
        for _ in 0..500 {
            let hold = self.try_acquire(&mut names).await.expect("warm-up lock");
            self.release(hold).await;
        }
    }

    /// One attempt on fresh names; `None` when refused (busy, too few nodes, timeout).
    async fn try_acquire(&self, names: &mut Names) -> Option<Hold> {
        let options = LockOptions::new().ttl(TTL);
        match self {
            Locker::Quorum(client) => match client.try_lock(names.one("quorum"), &options).await {
                Ok(guard) => Some(Hold::Quorum(guard)),
                Err(e) if e.is_busy() || matches!(e, fencelock::Error::Timeout { .. }) => None,
                Err(e) => panic!("quorum try_lock: {e}"),
            },
            Locker::Rslock(manager) => manager
                .lock(names.one("rslock"), TTL)
                .await
                .ok()
                .map(Hold::Rslock),
            Locker::Multi {
                client, members: 1, ..
            } => match client.try_lock(names.one("single"), &options).await {
                Ok(guard) => Some(Hold::Single(guard)),
                Err(e) if e.is_busy() || matches!(e, fencelock::Error::Timeout { .. }) => None,
                Err(e) => panic!("try_lock: {e}"),
            },
            Locker::Multi {
                client,
                members,
                masters,
            } => {
                let spread = names.spread(*members, masters);
                match client.try_lock_all(&spread, &options).await {
                    Ok(guard) => Some(Hold::Multi(guard)),
                    Err(e) if e.is_busy() || matches!(e, fencelock::Error::Timeout { .. }) => None,
                    Err(e) => panic!("try_lock_all: {e}"),
                }
            }
        }
    }

    async fn release(&self, hold: Hold) {
        match hold {
            Hold::Quorum(guard) => guard.release().await.expect("quorum release"),
            Hold::Rslock(lock) => lock.release().await,
            Hold::Single(guard) => guard.release().await.expect("release"),
            Hold::Multi(guard) => guard.release().await.expect("release all"),
        }
    }
}

/// One task: `pairs` sequential acquire + release pairs on fresh names; latency of each call.
async fn latency(locker: &Locker, kind: &str, label: &str, pairs: usize) {
    let mut names = Names::new(7);
    for _ in 0..200 {
        let hold = locker.try_acquire(&mut names).await.expect("warm-up lock");
        locker.release(hold).await;
    }
    let mut acquires = Vec::with_capacity(pairs);
    let mut releases = Vec::with_capacity(pairs);
    let mut both = Vec::with_capacity(pairs);
    let mut failed = 0u64;
    let started = Instant::now();
    for _ in 0..pairs {
        let asked = Instant::now();
        let Some(hold) = locker.try_acquire(&mut names).await else {
            failed += 1;
            continue;
        };
        let granted = Instant::now();
        locker.release(hold).await;
        let released = Instant::now();
        acquires.push(granted - asked);
        releases.push(released - granted);
        both.push(released - asked);
    }
    let elapsed = started.elapsed().as_secs_f64();
    for v in [&mut acquires, &mut releases, &mut both] {
        v.sort();
    }
    let us = |v: &[Duration], q: f64| percentile(v, q).as_secs_f64() * 1e6;
    println!(
        "qbench {kind} latency {label} pairs={} failed={failed} pairs/s={:.0} \
         pair_p50_us={:.0} pair_p99_us={:.0} acquire_p50_us={:.0} acquire_p99_us={:.0} \
         release_p50_us={:.0} release_p99_us={:.0}",
        both.len(),
        both.len() as f64 / elapsed,
        us(&both, 0.5),
        us(&both, 0.99),
        us(&acquires, 0.5),
        us(&acquires, 0.99),
        us(&releases, 0.5),
        us(&releases, 0.99),
    );
}

/// `tasks` tasks, each acquire + release on fresh names of its own, for `seconds`.
async fn throughput(
    locker: &Arc<Locker>,
    kind: &str,
    label: &str,
    tasks: usize,
    seconds: Duration,
) {
    let started = Instant::now();
    let until = started + seconds;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let locker = Arc::clone(locker);
        handles.push(tokio::spawn(async move {
            let mut names = Names::new(task as u64);
            let (mut done, mut failed) = (0u64, 0u64);
            let mut pair_times = Vec::new();
            while Instant::now() < until {
                let asked = Instant::now();
                match locker.try_acquire(&mut names).await {
                    Some(hold) => {
                        locker.release(hold).await;
                        pair_times.push(asked.elapsed());
                        done += 1;
                    }
                    None => failed += 1,
                }
            }
            (done, failed, pair_times)
        }));
    }
    let (mut done, mut failed, mut pair_times) = (0, 0, Vec::new());
    for handle in handles {
        let (d, f, t) = handle.await.expect("task");
        done += d;
        failed += f;
        pair_times.extend(t);
    }
    let elapsed = started.elapsed().as_secs_f64();
    pair_times.sort();
    let us = |q: f64| percentile(&pair_times, q).as_secs_f64() * 1e6;
    println!(
        "qbench {kind} throughput {label} tasks={tasks} seconds={elapsed:.2} pairs={done} \
         failed={failed} pairs/s={:.0} pair_p50_us={:.0} pair_p99_us={:.0}",
        done as f64 / elapsed,
        us(0.5),
        us(0.99),
    );
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// splitmix64, seeded per task.
struct SplitMix(u64);

impl SplitMix {
    fn seeded(task: u64) -> Self {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        Self(now ^ task.wrapping_mul(0x9E37_79B9_7F4A_7C15))
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
