//! Speed side by side with rslock (issue 11), against servers `scripts/bench-speed.sh` starts:
//!
//! - `pairs`: uncontended acquire + release pairs per second, `--tasks` tasks (64), each on
//!   fresh random names of its own, for fencelock (`--fence-mode`, default the library's
//!   default `epoch-clock`) and rslock in one run;
//! - `contended`: `--tasks` tasks (16) on ONE lock, hold 0: grants per second;
//! - `latency`: one task, no concurrency: acquire and release latency p50/p99;
//! - `modes`: fencelock's pairs per second in each fence mode (clock, epoch, counter,
//!   epoch-clock).
//!
//! `--workers N` runs the client on N Tokio worker threads (default one per core). Where client
//! and server share a machine's cores, `--workers 1` leaves the server a core of its own.
//! `--no-batching` turns fencelock's per-node batching off. `--flush` empties every master
//! (`FLUSHALL`, which blocks each master while it runs) before each measurement: fencelock keeps
//! a released lock's key until its lease and expiry grace have passed (about 20 s here: 10 s
//! leases, the default 10 s grace) and rslock deletes it, so without it a library measured after
//! fencelock runs among the keys fencelock left, and pays for them (a larger keyspace, and the
//! server's expiry of those keys). Only for servers the benchmark owns.
//!
//! Every measurement prints one line, `speed KIND key=value ...`, with, besides the rate, what
//! it cost (over the measured interval only): client CPU (getrusage) and server CPU (`INFO cpu`
//! of every master) per pair, commands the server ran per pair (`INFO commandstats`: the calls
//! clients sent, `sent/pair`, and the full mix, commands run inside scripts included), bytes
//! in and out of the servers per pair, heap allocations per pair (a counting global allocator),
//! and the Tokio workers' parks per pair (a worker parks when it has nothing to run: many
//! parks per pair mean the client waits on the socket); the throughput lines also print the
//! keys on the masters at the end (`keys_after`: for fencelock, with the warm-up's 1,000
//! released locks).
//!
//! rslock 0.10 (`LockManager::new` with the one standalone URL, or `LockManager::new_cluster`
//! with the cluster's seeds: one Redis Cluster counts as one Redlock server) runs with its
//! defaults: `lock` (3 tries, up to 200 ms apart) for the uncontended pairs, `acquire` (loops
//! over `lock` until granted) for the contended one.
//!
//! ```text
//! cargo run --release --example speed -- --url redis://127.0.0.1:7600 --target standalone pairs
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use fencelock::{Client, FenceMode, LockOptions};

/// Counts heap allocations (calls and bytes), for allocations per pair.
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static ALLOC_BYTES: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        ALLOC_BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        ALLOC_BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[derive(Parser)]
struct Args {
    /// Node URLs: the standalone server, or seeds of one cluster.
    #[arg(
        long = "url",
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7600"
    )]
    urls: Vec<String>,
    /// What the URLs are, as printed (`standalone` or `cluster`); `cluster` makes rslock use
    /// `LockManager::new_cluster`.
    #[arg(long, default_value = "standalone")]
    target: Target,
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Which libraries to measure (where both apply).
    #[arg(long, value_delimiter = ',', default_value = "fencelock,rslock")]
    libs: Vec<Lib>,
    /// fencelock's fence mode for `pairs`, `contended` and `latency` (`modes` runs each mode);
    /// the default is the library's default.
    #[arg(long, default_value = "epoch-clock")]
    fence_mode: Mode,
    /// Tokio worker threads of the client (0: one per core, Tokio's default). On a machine
    /// whose cores the client shares with the server, `1` leaves the server a core of its own,
    /// as redis-benchmark (one thread) does for the ceiling.
    #[arg(long, default_value_t = 0)]
    workers: usize,
    /// Turn fencelock's per-node batching off (`ClientBuilder::batching(false)`): every call
    /// goes out on its own, past the node's batch driver.
    #[arg(long)]
    no_batching: bool,
    /// `FLUSHALL` every master before each measurement, so that no library runs among the keys
    /// another left (fencelock keeps a released lock's key until its lease and expiry grace have
    /// passed; rslock deletes it). Only for servers the benchmark owns.
    #[arg(long)]
    flush: bool,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    Standalone,
    Cluster,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Clock,
    Epoch,
    Counter,
    EpochClock,
}

impl Mode {
    fn fence(self) -> FenceMode {
        match self {
            Mode::Clock => FenceMode::Clock,
            Mode::Epoch => FenceMode::Epoch,
            Mode::Counter => FenceMode::Counter,
            Mode::EpochClock => FenceMode::EpochClock,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Mode::Clock => "clock",
            Mode::Epoch => "epoch",
            Mode::Counter => "counter",
            Mode::EpochClock => "epoch-clock",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Lib {
    /// fencelock as configured by default: through the Redis module where the server loads
    /// it (`ModuleUse::Auto`), else the scripts.
    Fencelock,
    /// fencelock with the module off (`ModuleUse::Off`): the scripts, also where the server
    /// loads the module.
    FencelockScripts,
    Rslock,
}

#[derive(Subcommand)]
enum Bench {
    /// Uncontended acquire + release pairs per second, each task on random names of its own.
    Pairs {
        #[arg(long, default_value_t = 64)]
        tasks: usize,
        /// fencelock clients the tasks are spread over (round robin); rslock always has one
        /// lock manager.
        #[arg(long, default_value_t = 1)]
        clients: usize,
    },
    /// Tasks contending for ONE lock, hold 0: grants per second.
    Contended {
        #[arg(long, default_value_t = 16)]
        tasks: usize,
    },
    /// One task, no concurrency: acquire and release latency.
    Latency {
        /// Measured pairs (after 200 warm-up pairs).
        #[arg(long, default_value_t = 5000)]
        pairs: usize,
    },
    /// fencelock's uncontended pairs per second in each fence mode.
    Modes {
        #[arg(long, default_value_t = 64)]
        tasks: usize,
    },
}

fn main() {
    let args = Args::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if args.workers > 0 {
        runtime.worker_threads(args.workers);
    }
    let runtime = runtime
        .enable_all()
        .build()
        .expect("cannot start the Tokio runtime");
    runtime.block_on(run(args));
}

async fn run(args: Args) {
    let probe = ServerProbe::connect(&args.urls[0]).await;
    let seconds = Duration::from_secs(args.seconds);
    match args.bench {
        Bench::Pairs { tasks, clients } => {
            for &lib in &args.libs {
                if args.flush {
                    probe.flush().await;
                }
                let job = Job::new(&args, lib, args.fence_mode.fence(), clients).await;
                let m = pairs(&job, &probe, tasks, seconds).await;
                m.print(
                    "pairs",
                    &args,
                    lib,
                    &format!(
                        "mode={} tasks={tasks} clients={clients} workers={}",
                        mode_label(&args, lib),
                        workers()
                    ),
                );
            }
        }
        Bench::Modes { tasks } => {
            for (mode, label) in [
                (FenceMode::Clock, "clock"),
                (FenceMode::Epoch, "epoch"),
                (FenceMode::Counter, "counter"),
                (FenceMode::EpochClock, "epoch-clock"),
            ] {
                if args.flush {
                    probe.flush().await;
                }
                let job = Job::new(&args, Lib::Fencelock, mode, 1).await;
                let m = pairs(&job, &probe, tasks, seconds).await;
                m.print(
                    "pairs",
                    &args,
                    Lib::Fencelock,
                    &format!("mode={label} tasks={tasks} clients=1 workers={}", workers()),
                );
            }
        }
        Bench::Contended { tasks } => {
            for &lib in &args.libs {
                if args.flush {
                    probe.flush().await;
                }
                let job = Job::new(&args, lib, args.fence_mode.fence(), 1).await;
                let m = contended(&job, &probe, tasks, seconds).await;
                m.print(
                    "contended",
                    &args,
                    lib,
                    &format!("mode={} tasks={tasks} hold=0", mode_label(&args, lib)),
                );
            }
        }
        Bench::Latency { pairs } => {
            for &lib in &args.libs {
                if args.flush {
                    probe.flush().await;
                }
                let job = Job::new(&args, lib, args.fence_mode.fence(), 1).await;
                latency(&job, &args, lib, pairs).await;
            }
        }
    }
}

/// The client's Tokio worker threads.
fn workers() -> usize {
    tokio::runtime::Handle::current().metrics().num_workers()
}

/// The lock manager under test.
#[derive(Clone)]
enum Locker {
    Fencelock(Vec<Client>),
    Rslock(rslock::LockManager),
}

/// What a measurement runs: the locker and the options.
struct Job {
    locker: Locker,
    options: LockOptions,
    ttl: Duration,
}

/// A hold of either library, released by [`Job::release`].
enum Hold {
    Fencelock(fencelock::LockGuard),
    Rslock(rslock::Lock),
}

impl Job {
    async fn new(args: &Args, lib: Lib, mode: FenceMode, clients: usize) -> Self {
        let ttl = Duration::from_secs(10);
        let locker = match lib {
            Lib::Fencelock | Lib::FencelockScripts => {
                let module = match lib {
                    Lib::FencelockScripts => fencelock::ModuleUse::Off,
                    _ => fencelock::ModuleUse::Auto,
                };
                let mut made = Vec::new();
                for _ in 0..clients.max(1) {
                    let client = Client::builder(args.urls.clone())
                        .fence_mode(mode)
                        .batching(!args.no_batching)
                        .module(module)
                        .connect()
                        .await
                        .expect("connect");
                    made.push(client);
                }
                Locker::Fencelock(made)
            }
            Lib::Rslock => Locker::Rslock(match args.target {
                Target::Standalone => rslock::LockManager::new(vec![args.urls[0].clone()]),
                Target::Cluster => {
                    rslock::LockManager::new_cluster(args.urls.clone()).expect("rslock cluster")
                }
            }),
        };
        let job = Job {
            locker,
            options: LockOptions::new().ttl(ttl).timeout(Duration::from_secs(30)),
            ttl,
        };
        // Warm up: connections open, scripts cached on every master.
        let mut name = String::new();
        let mut rng = SplitMix::seeded(u64::MAX);
        for i in 0..1000 {
            random_name(&mut name, "warm", &mut rng);
            let hold = job.try_acquire(i, &name).await.expect("warm-up lock");
            job.release(hold).await;
        }
        job
    }

    /// One attempt (fencelock `try_lock`, rslock `lock`), on the client `task` is given to.
    async fn try_acquire(&self, task: usize, name: &str) -> Option<Hold> {
        match &self.locker {
            Locker::Fencelock(clients) => {
                let client = &clients[task % clients.len()];
                match client.try_lock(name, &self.options).await {
                    Ok(guard) => Some(Hold::Fencelock(guard)),
                    Err(fencelock::Error::Busy { .. }) => None,
                    Err(e) => panic!("fencelock try_lock: {e}"),
                }
            }
            Locker::Rslock(manager) => manager.lock(name, self.ttl).await.ok().map(Hold::Rslock),
        }
    }

    /// Waits until granted (fencelock `lock`, rslock `acquire`).
    async fn acquire(&self, name: &str) -> Hold {
        match &self.locker {
            Locker::Fencelock(clients) => {
                Hold::Fencelock(clients[0].lock(name, &self.options).await.expect("lock"))
            }
            Locker::Rslock(manager) => {
                Hold::Rslock(manager.acquire(name, self.ttl).await.expect("acquire").lock)
            }
        }
    }

    async fn release(&self, hold: Hold) {
        match hold {
            Hold::Fencelock(guard) => guard.release().await.expect("release"),
            Hold::Rslock(lock) => lock.release().await,
        }
    }

    fn busy(&self) -> u64 {
        match &self.locker {
            Locker::Fencelock(clients) => clients.iter().map(|c| c.stats().busy).sum(),
            Locker::Rslock(_) => 0,
        }
    }
}

/// `{prefix}:{16 random hex digits}` into `out` (reused, so the harness allocates nothing).
fn random_name(out: &mut String, prefix: &str, rng: &mut SplitMix) {
    out.clear();
    let _ = write!(out, "speed:{prefix}:{:016x}", rng.next());
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

/// The cost counters of this process at one moment.
#[derive(Clone, Copy)]
struct ClientSample {
    at: Instant,
    cpu: Duration,
    allocs: u64,
    alloc_bytes: u64,
    parks: u64,
    busy_workers: Duration,
}

impl ClientSample {
    fn now() -> Self {
        // SAFETY: getrusage writes into the zeroed struct we pass.
        let cpu = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_SELF, &mut usage);
            let tv = |t: libc::timeval| {
                Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
            };
            tv(usage.ru_utime) + tv(usage.ru_stime)
        };
        let metrics = tokio::runtime::Handle::current().metrics();
        let workers = metrics.num_workers();
        Self {
            at: Instant::now(),
            cpu,
            allocs: ALLOCS.load(Ordering::Relaxed),
            alloc_bytes: ALLOC_BYTES.load(Ordering::Relaxed),
            parks: (0..workers).map(|w| metrics.worker_park_count(w)).sum(),
            busy_workers: (0..workers)
                .map(|w| metrics.worker_total_busy_duration(w))
                .sum(),
        }
    }
}

/// The masters' `INFO` counters at one moment.
#[derive(Clone, Default)]
struct ServerSample {
    cpu_s: f64,
    replica_cpu_s: f64,
    bytes_in: u64,
    bytes_out: u64,
    /// Keys on the masters (`INFO keyspace`, every database).
    keys: u64,
    calls: BTreeMap<String, u64>,
}

/// Reads `INFO cpu stats keyspace commandstats` from every master.
struct ServerProbe {
    masters: Vec<redis::aio::MultiplexedConnection>,
    /// Replicas: only their CPU is read (their command counts are the masters' replicated).
    replicas: Vec<redis::aio::MultiplexedConnection>,
}

impl ServerProbe {
    async fn connect(url: &str) -> Self {
        let open = |url: String| async move {
            redis::Client::open(url)
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("connect for INFO")
        };
        let mut first = open(url.to_owned()).await;
        let nodes: redis::RedisResult<String> = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut first)
            .await;
        let (mut masters, mut replicas) = (Vec::new(), Vec::new());
        match nodes {
            Ok(nodes) => {
                for line in nodes.lines() {
                    let fields: Vec<&str> = line.split(' ').collect();
                    if fields.len() > 2 && !fields[2].contains("fail") {
                        let addr = fields[1].split('@').next().unwrap_or_default();
                        let conn = open(format!("redis://{addr}")).await;
                        if fields[2].contains("master") {
                            masters.push(conn);
                        } else {
                            replicas.push(conn);
                        }
                    }
                }
            }
            Err(_) => masters.push(first),
        }
        Self { masters, replicas }
    }

    async fn sample(&self) -> ServerSample {
        let mut sample = ServerSample::default();
        for conn in &self.masters {
            let mut conn = conn.clone();
            let info: String = redis::cmd("INFO")
                .arg("cpu")
                .arg("stats")
                .arg("keyspace")
                .arg("commandstats")
                .query_async(&mut conn)
                .await
                .expect("INFO");
            for line in info.lines() {
                let Some((key, value)) = line.trim_end().split_once(':') else {
                    continue;
                };
                match key {
                    "used_cpu_sys" | "used_cpu_user" => {
                        sample.cpu_s += value.parse::<f64>().unwrap_or(0.0)
                    }
                    "total_net_input_bytes" => sample.bytes_in += value.parse().unwrap_or(0),
                    "total_net_output_bytes" => sample.bytes_out += value.parse().unwrap_or(0),
                    db if db.starts_with("db") => {
                        sample.keys += value
                            .split(',')
                            .find_map(|kv| kv.strip_prefix("keys="))
                            .and_then(|n| n.parse::<u64>().ok())
                            .unwrap_or(0)
                    }
                    _ => {
                        if let Some(cmd) = key.strip_prefix("cmdstat_") {
                            let calls = value
                                .split(',')
                                .find_map(|kv| kv.strip_prefix("calls="))
                                .and_then(|n| n.parse().ok())
                                .unwrap_or(0);
                            *sample.calls.entry(cmd.to_owned()).or_default() += calls;
                        }
                    }
                }
            }
        }
        for conn in &self.replicas {
            let mut conn = conn.clone();
            let info: String = redis::cmd("INFO")
                .arg("cpu")
                .query_async(&mut conn)
                .await
                .expect("INFO");
            for line in info.lines() {
                if let Some(("used_cpu_sys" | "used_cpu_user", value)) =
                    line.trim_end().split_once(':')
                {
                    sample.replica_cpu_s += value.parse::<f64>().unwrap_or(0.0);
                }
            }
        }
        sample
    }

    /// `FLUSHALL` on every master (`--flush`): each measurement starts on empty servers. Run
    /// in the foreground (not `ASYNC`, whose freeing thread would share the cores with the next
    /// measurement): a million keys take the server seconds, past the connection's usual
    /// response timeout.
    async fn flush(&self) {
        for conn in &self.masters {
            let mut conn = conn.clone();
            conn.set_response_timeout(Duration::from_secs(300));
            let _: () = redis::cmd("FLUSHALL")
                .query_async(&mut conn)
                .await
                .expect("FLUSHALL");
        }
    }
}

/// Commands that clients send (not those scripts run inside), for `sent/op`: neither library's
/// scripts call these (rslock's GET and DEL run inside its unlock script, so they are not here).
fn sent_by_clients(cmd: &str) -> bool {
    matches!(
        cmd,
        "evalsha" | "eval" | "evalsha_ro" | "eval_ro" | "set" | "wait" | "ping" | "hello"
    ) || cmd.starts_with("script|")
        // The epoch fence mode's acquire script runs CLUSTER INFO itself.
        || (cmd.starts_with("cluster|") && cmd != "cluster|info")
}

/// One measured interval: how many operations, and what they cost.
struct Measured {
    ops: u64,
    errors: u64,
    extra: String,
    client: (ClientSample, ClientSample),
    server: (ServerSample, ServerSample),
}

impl Measured {
    fn print(&self, kind: &str, args: &Args, lib: Lib, params: &str) {
        let (c0, c1) = &self.client;
        let (s0, s1) = &self.server;
        let seconds = (c1.at - c0.at).as_secs_f64();
        let ops = self.ops.max(1) as f64;
        let per = |x: f64| x / ops;
        let mut mix = String::new();
        let mut sent = 0;
        for (cmd, &calls) in &s1.calls {
            if cmd == "info" {
                continue;
            }
            let delta = calls - s0.calls.get(cmd).copied().unwrap_or(0);
            if delta == 0 {
                continue;
            }
            if sent_by_clients(cmd) {
                sent += delta;
            }
            let _ = write!(
                mix,
                "{}{cmd}:{:.2}",
                if mix.is_empty() { "" } else { "," },
                per(delta as f64)
            );
        }
        let client_cpu = (c1.cpu - c0.cpu).as_secs_f64();
        let server_cpu = s1.cpu_s - s0.cpu_s;
        let lib = match lib {
            Lib::Fencelock => "fencelock",
            Lib::FencelockScripts => "fencelock-scripts",
            Lib::Rslock => "rslock",
        };
        let target = match args.target {
            Target::Standalone => "standalone",
            Target::Cluster => "cluster",
        };
        let rate = match kind {
            "contended" => "grants/s",
            _ => "pairs/s",
        };
        println!(
            "speed {kind} target={target} lib={lib} {params} seconds={seconds:.2} ops={} \
             {rate}={:.0} errors={}{} client_us/op={:.1} client_cpu={:.2} server_us/op={:.1} \
             server_cpu={:.2} replica_us/op={:.1} sent/op={:.2} bytes_in/op={:.0} bytes_out/op={:.0} allocs/op={:.1} \
             alloc_bytes/op={:.0} parks/op={:.2} worker_busy_us/op={:.1} keys_after={} mix={mix}",
            self.ops,
            self.ops as f64 / seconds,
            self.errors,
            self.extra,
            per(client_cpu * 1e6),
            client_cpu / seconds,
            per(server_cpu * 1e6),
            server_cpu / seconds,
            per((s1.replica_cpu_s - s0.replica_cpu_s) * 1e6),
            per(sent as f64),
            per((s1.bytes_in - s0.bytes_in) as f64),
            per((s1.bytes_out - s0.bytes_out) as f64),
            per((c1.allocs - c0.allocs) as f64),
            per((c1.alloc_bytes - c0.alloc_bytes) as f64),
            per((c1.parks - c0.parks) as f64),
            per((c1.busy_workers - c0.busy_workers).as_secs_f64() * 1e6),
            s1.keys,
        );
    }
}

/// `tasks` tasks, each `try_acquire` + `release` on fresh random names, for `seconds`.
async fn pairs(job: &Job, probe: &ServerProbe, tasks: usize, seconds: Duration) -> Measured {
    let job = Arc::new(Job {
        locker: job.locker.clone(),
        options: job.options.clone(),
        ttl: job.ttl,
    });
    let server0 = probe.sample().await;
    let client0 = ClientSample::now();
    let until = Instant::now() + seconds;
    let mut handles = Vec::new();
    for task in 0..tasks {
        let job = Arc::clone(&job);
        handles.push(tokio::spawn(async move {
            let mut rng = SplitMix::seeded(task as u64);
            let mut name = String::with_capacity(48);
            let (mut done, mut busy) = (0u64, 0u64);
            while Instant::now() < until {
                random_name(&mut name, "pairs", &mut rng);
                match job.try_acquire(task, &name).await {
                    Some(hold) => {
                        job.release(hold).await;
                        done += 1;
                    }
                    None => busy += 1,
                }
            }
            (done, busy)
        }));
    }
    let (mut done, mut busy) = (0, 0);
    for handle in handles {
        let (d, b) = handle.await.expect("task");
        done += d;
        busy += b;
    }
    let client1 = ClientSample::now();
    let server1 = probe.sample().await;
    Measured {
        ops: done,
        errors: busy,
        extra: String::new(),
        client: (client0, client1),
        server: (server0, server1),
    }
}

/// `tasks` tasks on ONE fresh lock name, each acquiring (waiting) and releasing at once.
async fn contended(job: &Job, probe: &ServerProbe, tasks: usize, seconds: Duration) -> Measured {
    let job = Arc::new(Job {
        locker: job.locker.clone(),
        options: job.options.clone(),
        ttl: job.ttl,
    });
    let mut name = String::new();
    random_name(&mut name, "contended", &mut SplitMix::seeded(0));
    let name: Arc<str> = name.into();
    let busy0 = job.busy();
    let server0 = probe.sample().await;
    let client0 = ClientSample::now();
    let until = Instant::now() + seconds;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (job, name) = (Arc::clone(&job), Arc::clone(&name));
        handles.push(tokio::spawn(async move {
            let mut grants = 0u64;
            while Instant::now() < until {
                let hold = job.acquire(&name).await;
                job.release(hold).await;
                grants += 1;
            }
            grants
        }));
    }
    let mut grants = 0;
    for handle in handles {
        grants += handle.await.expect("task");
    }
    let client1 = ClientSample::now();
    let server1 = probe.sample().await;
    let busy = job.busy() - busy0;
    Measured {
        ops: grants,
        errors: 0,
        extra: format!(" busy/grant={:.2}", busy as f64 / grants.max(1) as f64),
        client: (client0, client1),
        server: (server0, server1),
    }
}

/// One task: `pairs` sequential acquire + release pairs; latency of each call.
async fn latency(job: &Job, args: &Args, lib: Lib, pairs: usize) {
    let mut rng = SplitMix::seeded(7);
    let mut name = String::new();
    for _ in 0..200 {
        random_name(&mut name, "latency", &mut rng);
        let hold = job.try_acquire(0, &name).await.expect("warm-up lock");
        job.release(hold).await;
    }
    let mut acquires = Vec::with_capacity(pairs);
    let mut releases = Vec::with_capacity(pairs);
    let started = Instant::now();
    for _ in 0..pairs {
        random_name(&mut name, "latency", &mut rng);
        let asked = Instant::now();
        let hold = job.try_acquire(0, &name).await.expect("lock");
        let granted = Instant::now();
        job.release(hold).await;
        releases.push(granted.elapsed());
        acquires.push(granted - asked);
    }
    let elapsed = started.elapsed().as_secs_f64();
    acquires.sort();
    releases.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let lib_kind = lib;
    let lib = match lib {
        Lib::Fencelock => "fencelock",
        Lib::FencelockScripts => "fencelock-scripts",
        Lib::Rslock => "rslock",
    };
    let target = match args.target {
        Target::Standalone => "standalone",
        Target::Cluster => "cluster",
    };
    println!(
        "speed latency target={target} lib={lib} mode={} pairs={pairs} pairs/s={:.0} \
         acquire_p50_us={:.0} acquire_p99_us={:.0} release_p50_us={:.0} release_p99_us={:.0}",
        mode_label(args, lib_kind),
        pairs as f64 / elapsed,
        us(percentile(&acquires, 0.5)),
        us(percentile(&acquires, 0.99)),
        us(percentile(&releases, 0.5)),
        us(percentile(&releases, 0.99)),
    );
}

/// The fence mode a line of `lib` ran with (`-` for rslock, which has none).
fn mode_label(args: &Args, lib: Lib) -> &'static str {
    match lib {
        Lib::Fencelock | Lib::FencelockScripts => args.fence_mode.label(),
        Lib::Rslock => "-",
    }
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}
