//! A hot lock across processes (issue 25): ONE lock, N separate client processes with one task
//! each, each acquiring (waiting), holding `--hold-ms` (0 by default) and releasing in a loop,
//! for the fencelock mutex (`fencelock`), the mutex with `LockOptions::linger` (`linger`: a
//! released hot lock stays with its process for a run of grants), the fencelock fair lock
//! (`fair`) and rslock, in one run. A fencelock child calls `Client::shutdown` before it exits.
//!
//! The parent spawns N copies of itself (its own executable, `child` subcommand), waits until
//! every child has connected and warmed up, starts them at once, and sums the grants they print.
//! One line per library:
//!
//! `hot target=.. lib=.. procs=N hold_ms=H seconds=S grants=G grants/s=.. slowest/s=.. mean/s=..
//! slowest/mean=.. sent/grant=.. server_us/grant=.. client_us/grant=.. mix=..`
//!
//! - `grants/s` summed over the processes; `slowest/s` and `mean/s` per process (a starved
//!   process shows as a low `slowest/mean`);
//! - `sent/grant`: the calls clients sent (`INFO commandstats` of every master: `evalsha`,
//!   `eval`, `fcall`, `set`, the module's `fencelock.*`, ... deltas over the measured interval)
//!   divided by the grants; `mix` every command's calls per grant, those run inside scripts
//!   included;
//! - `client_us/grant`: the CPU time the client processes ran over the measured interval (each
//!   child sums its threads' `/proc/self/task/*/schedstat`; 0 where that is not readable),
//!   divided by the grants.
//!
//! `--spawned` runs each child's loop as a spawned task (everything on the runtime's one worker
//! thread) instead of on the main thread.
//!
//! rslock 0.10 runs with its defaults (`acquire`: loops over `lock`, 3 tries up to 200 ms apart,
//! until granted). Servers: `scripts/bench-hot-lock.sh` starts its own.
//!
//! ```text
//! cargo run --release --example hot_lock -- --url redis://127.0.0.1:7400 --procs 8 --libs fencelock,linger,fair,rslock
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use fencelock::{Client, LockOptions};

#[derive(Parser)]
struct Args {
    /// Node URLs: the standalone server, or seeds of one cluster.
    #[arg(
        long = "url",
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7400"
    )]
    urls: Vec<String>,
    /// What the URLs are (`cluster` makes rslock use `LockManager::new_cluster`).
    #[arg(long, default_value = "standalone")]
    target: Target,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Client processes, one task each.
    #[arg(long, default_value_t = 8)]
    procs: usize,
    /// How long each grant is held before its release, in ms (0: released at once).
    #[arg(long, default_value_t = 0)]
    hold_ms: u64,
    /// Run each child's loop as a spawned task on the runtime's one worker thread, as a
    /// service's handlers run, rather than on the main thread (`block_on`, the default): every
    /// wake-up then stays on one thread, for both libraries.
    #[arg(long)]
    spawned: bool,
    /// Which libraries to measure, in this order.
    #[arg(long, value_delimiter = ',', default_value = "fencelock,fair,rslock")]
    libs: Vec<Lib>,
    #[command(subcommand)]
    child: Option<Child>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Target {
    Standalone,
    Cluster,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Lib {
    /// The fencelock mutex (`Client::lock`).
    Fencelock,
    /// The fencelock mutex with `LockOptions::linger(true)`.
    Linger,
    /// The fencelock fair lock (`Client::fair_lock`).
    Fair,
    Rslock,
}

impl Lib {
    fn label(self) -> &'static str {
        match self {
            Lib::Fencelock => "fencelock",
            Lib::Linger => "linger",
            Lib::Fair => "fair",
            Lib::Rslock => "rslock",
        }
    }
}

#[derive(Subcommand)]
enum Child {
    /// One measured process (spawned by the parent): prints `ready`, waits for a line on stdin,
    /// runs for `--seconds`, prints `grants N`.
    Child {
        /// The one lock's name.
        #[arg(long)]
        name: String,
    },
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        // One worker per process: N processes share the machine's cores with the server.
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("cannot start the Tokio runtime");
    match &args.child {
        Some(Child::Child { name }) if args.spawned => {
            let name = name.clone();
            runtime.block_on(async move {
                tokio::spawn(async move { child(&args, &name).await })
                    .await
                    .expect("child task")
            });
        }
        Some(Child::Child { name }) => runtime.block_on(child(&args, name)),
        None => runtime.block_on(parent(&args)),
    }
}

/// The lock manager of one process.
enum Locker {
    Fencelock(Client),
    Rslock(rslock::LockManager),
}

/// A hold of either library.
enum Hold {
    Mutex(fencelock::LockGuard),
    Fair(fencelock::FairLockGuard),
    Rslock(rslock::Lock),
}

struct Job {
    lib: Lib,
    locker: Locker,
    options: LockOptions,
    ttl: Duration,
}

impl Job {
    async fn new(args: &Args, lib: Lib) -> Self {
        let ttl = Duration::from_secs(10);
        let locker = match lib {
            Lib::Fencelock | Lib::Linger | Lib::Fair => Locker::Fencelock(
                Client::builder(args.urls.clone())
                    .connect()
                    .await
                    .expect("connect"),
            ),
            Lib::Rslock => Locker::Rslock(match args.target {
                Target::Standalone => rslock::LockManager::new(vec![args.urls[0].clone()]),
                Target::Cluster => {
                    rslock::LockManager::new_cluster(args.urls.clone()).expect("rslock cluster")
                }
            }),
        };
        Job {
            lib,
            locker,
            options: LockOptions::new()
                .ttl(ttl)
                .timeout(Duration::from_secs(60))
                .linger(lib == Lib::Linger),
            ttl,
        }
    }

    async fn acquire(&self, name: &str) -> Hold {
        match (&self.locker, self.lib) {
            (Locker::Fencelock(client), Lib::Fair) => Hold::Fair(
                client
                    .fair_lock(name, &self.options)
                    .await
                    .expect("fair_lock"),
            ),
            (Locker::Fencelock(client), _) => {
                Hold::Mutex(client.lock(name, &self.options).await.expect("lock"))
            }
            (Locker::Rslock(manager), _) => {
                Hold::Rslock(manager.acquire(name, self.ttl).await.expect("acquire").lock)
            }
        }
    }

    async fn release(&self, hold: Hold) {
        match hold {
            Hold::Mutex(guard) => guard.release().await.expect("release"),
            Hold::Fair(guard) => guard.release().await.expect("release"),
            Hold::Rslock(lock) => lock.release().await,
        }
    }
}

/// A child: warm up on a name of its own, report ready, wait for the start, loop on the lock.
async fn child(args: &Args, name: &str) {
    let lib = args.libs[0];
    let job = Job::new(args, lib).await;
    let warm = format!("{name}:warm:{}", std::process::id());
    for _ in 0..50 {
        let hold = job.acquire(&warm).await;
        job.release(hold).await;
    }
    println!("ready");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("start line");
    let hold_for = Duration::from_millis(args.hold_ms);
    let cpu_start = cpu_ns();
    let until = Instant::now() + Duration::from_secs(args.seconds);
    let mut grants = 0u64;
    while Instant::now() < until {
        let hold = job.acquire(name).await;
        if !hold_for.is_zero() {
            tokio::time::sleep(hold_for).await;
        }
        job.release(hold).await;
        grants += 1;
    }
    if let Locker::Fencelock(client) = &job.locker {
        // Lingering releases (and any other background release) reach Redis before the exit.
        client.shutdown().await.expect("shutdown");
    }
    println!(
        "grants {grants} cpu_ns {}",
        cpu_ns().saturating_sub(cpu_start)
    );
}

/// The CPU time this process's threads have run, in ns (the first field of each thread's
/// `/proc/self/task/<tid>/schedstat`); 0 where that is not readable.
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// The parent: per library, N children on one fresh lock, summed.
async fn parent(args: &Args) {
    let exe = std::env::current_exe().expect("own executable");
    let mut probe = Probe::connect(&args.urls).await;
    let target = match args.target {
        Target::Standalone => "standalone",
        Target::Cluster => "cluster",
    };
    for &lib in &args.libs {
        let name = format!(
            "hot:{}:{}:{}",
            lib.label(),
            args.procs,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis()
        );
        let mut children = Vec::new();
        for _ in 0..args.procs {
            let mut command = Command::new(&exe);
            command
                .arg("--url")
                .arg(args.urls.join(","))
                .arg("--target")
                .arg(target)
                .arg("--seconds")
                .arg(args.seconds.to_string())
                .arg("--hold-ms")
                .arg(args.hold_ms.to_string())
                .arg("--libs")
                .arg(lib.label())
                .args(args.spawned.then_some("--spawned"))
                .arg("child")
                .arg("--name")
                .arg(&name)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped());
            children.push(command.spawn().expect("spawn a child"));
        }
        let mut outputs = Vec::new();
        for child in &mut children {
            let mut out = BufReader::new(child.stdout.take().expect("child stdout"));
            let mut line = String::new();
            out.read_line(&mut line).expect("child ready");
            assert_eq!(line.trim(), "ready", "child said {line:?}");
            outputs.push(out);
        }
        let before = probe.sample().await;
        let started = Instant::now();
        for child in &mut children {
            let stdin = child.stdin.as_mut().expect("child stdin");
            stdin.write_all(b"go\n").expect("start a child");
            stdin.flush().expect("start a child");
        }
        let (mut per, mut cpu_ns) = (Vec::new(), 0u64);
        for out in &mut outputs {
            let mut line = String::new();
            out.read_line(&mut line).expect("child grants");
            let words: Vec<&str> = line.split_whitespace().collect();
            let (grants, cpu): (u64, u64) = match words[..] {
                ["grants", grants, "cpu_ns", cpu] => (
                    grants
                        .parse()
                        .unwrap_or_else(|_| panic!("child said {line:?}")),
                    cpu.parse().unwrap_or(0),
                ),
                _ => panic!("child said {line:?}"),
            };
            per.push(grants);
            cpu_ns += cpu;
        }
        let seconds = started.elapsed().as_secs_f64();
        for child in &mut children {
            let status = child.wait().expect("child exit");
            assert!(status.success(), "a child failed: {status}");
        }
        let after = probe.sample().await;
        let run = Run {
            per,
            cpu_ns,
            seconds,
        };
        report(args, target, lib, &run, &before, &after);
    }
}

/// What the children of one library reported: grants per process, their CPU time summed, and
/// the measured interval's length.
struct Run {
    per: Vec<u64>,
    cpu_ns: u64,
    seconds: f64,
}

fn report(args: &Args, target: &str, lib: Lib, run: &Run, before: &Sample, after: &Sample) {
    let Run {
        per,
        cpu_ns,
        seconds,
    } = run;
    let grants: u64 = per.iter().sum();
    let each = args.seconds as f64;
    let slowest = per.iter().copied().min().unwrap_or(0) as f64 / each;
    let mean = grants as f64 / per.len().max(1) as f64 / each;
    let g = grants.max(1) as f64;
    let (mut sent, mut mix) = (0u64, String::new());
    for (cmd, &calls) in &after.calls {
        let delta = calls - before.calls.get(cmd).copied().unwrap_or(0);
        if delta == 0 || cmd == "info" {
            continue;
        }
        if sent_by_clients(cmd) {
            sent += delta;
        }
        let sep = if mix.is_empty() { "" } else { "," };
        let _ = write!(mix, "{sep}{cmd}:{:.2}", delta as f64 / g);
    }
    println!(
        "hot target={target} lib={} procs={} hold_ms={} seconds={seconds:.2} grants={grants} \
         grants/s={:.0} slowest/s={slowest:.0} mean/s={mean:.0} slowest/mean={:.2} \
         sent/grant={:.2} server_us/grant={:.1} client_us/grant={:.1} mix={mix}",
        lib.label(),
        per.len(),
        args.hold_ms,
        grants as f64 / each,
        if mean > 0.0 { slowest / mean } else { 0.0 },
        sent as f64 / g,
        (after.cpu_s - before.cpu_s) * 1e6 / g,
        *cpu_ns as f64 / 1e3 / g,
    );
}

/// Commands clients send (not those scripts run inside): neither library's scripts call these.
fn sent_by_clients(cmd: &str) -> bool {
    matches!(
        cmd,
        "evalsha" | "eval" | "evalsha_ro" | "eval_ro" | "fcall" | "set" | "wait" | "ping"
    ) || cmd.starts_with("script|")
        || cmd.starts_with("fencelock.")
}

/// The masters' `INFO cpu commandstats` at one moment.
#[derive(Default)]
struct Sample {
    cpu_s: f64,
    calls: BTreeMap<String, u64>,
}

/// Reads `INFO` of every master (the URLs given: each seed of a cluster should be a master).
struct Probe {
    masters: Vec<redis::aio::MultiplexedConnection>,
}

impl Probe {
    async fn connect(urls: &[String]) -> Self {
        let mut masters = Vec::new();
        for url in urls {
            let conn = redis::Client::open(url.as_str())
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("connect for INFO");
            masters.push(conn);
        }
        Self { masters }
    }

    async fn sample(&mut self) -> Sample {
        let mut sample = Sample::default();
        for conn in &mut self.masters {
            let info: String = redis::cmd("INFO")
                .arg("cpu")
                .arg("commandstats")
                .query_async(conn)
                .await
                .expect("INFO");
            for line in info.lines() {
                let Some((key, value)) = line.trim_end().split_once(':') else {
                    continue;
                };
                if key == "used_cpu_sys" || key == "used_cpu_user" {
                    sample.cpu_s += value.parse::<f64>().unwrap_or(0.0);
                } else if let Some(cmd) = key.strip_prefix("cmdstat_") {
                    let calls = value
                        .split(',')
                        .find_map(|kv| kv.strip_prefix("calls="))
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    *sample.calls.entry(cmd.to_owned()).or_default() += calls;
                }
            }
        }
        sample
    }
}
