//! The quorum lock's fault table (issue 12): five standalone redis-servers, four worker tasks on
//! two `QuorumClient`s taking one lock name in a loop, each holder writing its token through a
//! fenced store (a `FenceGate` plus a record of who wrote what when), under one fault per run,
//! once with the commit round and once without it (commit-less Redlock: T = the max of the
//! majority's replies, never written back).
//!
//! Run: `cargo run --release --example quorum_chaos -- [--grants 400] [--faults kill1,...]
//! [--ttl-ms 500] [--hold-ms 2] [--port 8000]` (needs `redis-server` on the PATH, and gcc for
//! the clock faults, which preload `tests/common/clockshim.c` into one server).
//! Faults: none, kill1, kill2, kill3, restart-empty, restart-delayed, pause, clock+5s,
//! clock-5s (default: all). Ports are taken from `--port` up to `--port + 99`.
//!
//! Columns: grants; duplicate tokens (grants whose token an earlier grant already had);
//! regressions (grants whose token is below one granted earlier); writes rejected by the gate;
//! stale writes accepted (admitted by the gate although another holder had already written the
//! same or a higher token: the gate admits equal tokens, so a duplicate gets through);
//! overlapping holders (pairs of holds, from grant to release call, that overlap in time);
//! ended without grant (lock calls that returned `Busy` or `Timeout`); grants made while
//! fewer than a majority of servers were up.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fencelock::{Client, FenceGate, LockOptions, QuorumClient};

const NODES: usize = 5;
const NAME: &str = "qchaos";

fn usage() -> ! {
    eprintln!(
        "usage: quorum_chaos [--grants N] [--faults none,kill1,kill2,kill3,restart-empty,\
         restart-delayed,pause,clock+5s,clock-5s] [--ttl-ms 500] [--hold-ms 2] [--port 8000]"
    );
    std::process::exit(64);
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    None,
    Kill1,
    Kill2,
    Kill3,
    RestartEmpty,
    RestartDelayed,
    Pause,
    ClockAhead,
    ClockBehind,
}

impl Fault {
    const ALL: [Fault; 9] = [
        Fault::None,
        Fault::Kill1,
        Fault::Kill2,
        Fault::Kill3,
        Fault::RestartEmpty,
        Fault::RestartDelayed,
        Fault::Pause,
        Fault::ClockAhead,
        Fault::ClockBehind,
    ];

    fn id(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Kill1 => "kill1",
            Fault::Kill2 => "kill2",
            Fault::Kill3 => "kill3",
            Fault::RestartEmpty => "restart-empty",
            Fault::RestartDelayed => "restart-delayed",
            Fault::Pause => "pause",
            Fault::ClockAhead => "clock+5s",
            Fault::ClockBehind => "clock-5s",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Fault::None => "no fault",
            Fault::Kill1 => "1 of 5 killed",
            Fault::Kill2 => "2 of 5 killed",
            Fault::Kill3 => "3 of 5 killed for 3 s, then restarted empty",
            Fault::RestartEmpty => "a node restarted empty at once (x3)",
            Fault::RestartDelayed => "a node restarted empty after 2 x TTL down (x3)",
            Fault::Pause => "a node paused 3 x TTL (x3)",
            Fault::ClockAhead => "node 0's clock +5 s, node 0 killed halfway",
            Fault::ClockBehind => "node 0's clock -5 s, node 0 killed halfway",
        }
    }

    fn parse(id: &str) -> Option<Fault> {
        Fault::ALL.into_iter().find(|f| f.id() == id)
    }

    fn clock_offset_ms(self) -> Option<i64> {
        match self {
            Fault::ClockAhead => Some(5000),
            Fault::ClockBehind => Some(-5000),
            _ => None,
        }
    }
}

/// A redis-server without persistence that can be killed, paused and restarted (empty) on the
/// same port and directory. Stopped by pid on drop.
struct Server {
    port: u16,
    dir: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Server {
    fn start(port: u16, env: Vec<(String, String)>, offset_ms: Option<i64>) -> Server {
        let dir =
            std::env::temp_dir().join(format!("fencelock-qchaos-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        if let Some(ms) = offset_ms {
            std::fs::write(dir.join("clock_offset_ms"), ms.to_string()).expect("offset file");
        }
        let mut server = Server {
            port,
            dir,
            env,
            child: None,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.join("redis.log")).expect("log file");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .current_dir(&self.dir)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::from(log))
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.answers() {
            assert!(
                Instant::now() < deadline,
                "redis on {} never answered",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn answers(&self) -> bool {
        self.time_us().is_some()
    }

    /// The server's `TIME` in µs.
    fn time_us(&self) -> Option<i64> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .ok()?;
        conn.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        let time: Vec<String> = redis::cmd("TIME").query(&mut conn).ok()?;
        Some(time[0].parse::<i64>().ok()? * 1_000_000 + time[1].parse::<i64>().ok()?)
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
        }
    }

    fn pause(&self) {
        self.signal("-STOP");
    }

    fn resume(&self) {
        self.signal("-CONT");
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again with nothing: no data file survives (there is none anyway).
    fn restart_empty(&mut self) {
        self.kill();
        for entry in std::fs::read_dir(&self.dir).expect("scratch dir").flatten() {
            let name = entry.file_name();
            if name != "redis.log" && name != "clock_offset_ms" {
                let path = entry.path();
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.resume();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `clockshim.c` built with gcc into a scratch directory.
fn build_shim() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fencelock-qchaos-shim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("shim dir");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/clockshim.c");
    let library = dir.join("clockshim.so");
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
        .arg(&library)
        .arg(&source)
        .output()
        .expect("gcc must be installed");
    assert!(
        out.status.success(),
        "gcc clockshim.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    library
}

/// Free ports from `base` up to `base + 99`, bound for a moment to check.
fn free_ports(base: u16, count: usize) -> Vec<u16> {
    let ports: Vec<u16> = (base..base.saturating_add(100))
        .filter(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .take(count)
        .collect();
    assert_eq!(ports.len(), count, "{count} free ports from {base}");
    ports
}

/// One hold, as the fenced store saw it.
struct Record {
    token: u64,
    holder: u64,
    start: Instant,
    end: Instant,
}

/// The fenced store: the gate, plus who last wrote which token.
#[derive(Default)]
struct Store {
    gate: FenceGate,
    last: Mutex<(u64, u64)>,
    records: Mutex<Vec<Record>>,
    rejected: AtomicU64,
    stale_accepted: AtomicU64,
}

impl Store {
    fn write(&self, token: fencelock::FenceToken, holder: u64) {
        let mut last = self.last.lock().expect("store lock");
        match self.gate.admit(token) {
            Ok(()) => {
                if last.0 >= token.get() && last.1 != holder && last.1 != 0 {
                    self.stale_accepted.fetch_add(1, Ordering::Relaxed);
                }
                *last = (token.get(), holder);
            }
            Err(_) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[derive(Default)]
struct Shared {
    store: Store,
    grants: AtomicU64,
    timeouts: AtomicU64,
    errors: AtomicU64,
    outage: AtomicBool,
    grants_in_outage: AtomicU64,
    stop: AtomicBool,
    next_holder: AtomicU64,
    worker_failures: AtomicU64,
}

struct Row {
    fault: Fault,
    commit: bool,
    grants: u64,
    duplicates: u64,
    regressions: u64,
    rejected: u64,
    stale_accepted: u64,
    overlaps: u64,
    timeouts: u64,
    errors: u64,
    grants_in_outage: u64,
    seconds: f64,
    /// Worker tasks that panicked (each one a failed run).
    worker_failures: u64,
}

async fn worker(quorum: QuorumClient, shared: Arc<Shared>, ttl: Duration, hold: Duration) {
    let options = LockOptions::new().ttl(ttl).timeout(Duration::from_secs(1));
    while !shared.stop.load(Ordering::Acquire) {
        match quorum.lock(NAME, &options).await {
            Ok(guard) => {
                let start = Instant::now();
                if shared.outage.load(Ordering::Acquire) {
                    shared.grants_in_outage.fetch_add(1, Ordering::Relaxed);
                }
                let holder = shared.next_holder.fetch_add(1, Ordering::Relaxed) + 1;
                let token = guard.fence();
                tokio::time::sleep(hold).await;
                shared.store.write(token, holder);
                tokio::time::sleep(hold).await;
                let end = Instant::now();
                shared.store.records.lock().expect("records").push(Record {
                    token: token.get(),
                    holder,
                    start,
                    end,
                });
                shared.grants.fetch_add(1, Ordering::Release);
                let _ = guard.release().await;
            }
            Err(fencelock::Error::Timeout { .. } | fencelock::Error::Busy { .. }) => {
                shared.timeouts.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                shared.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}

/// Waits until `n` grants were made (or 120 s passed: then the run reports what it got).
async fn grants_reach(shared: &Shared, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while shared.grants.load(Ordering::Acquire) < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn run(
    fault: Fault,
    commit: bool,
    grants: u64,
    ttl: Duration,
    hold: Duration,
    base: u16,
    shim: Option<&Path>,
) -> Row {
    let ports = free_ports(base, NODES);
    let mut servers: Vec<Server> = ports
        .iter()
        .enumerate()
        .map(|(i, &port)| {
            let offset = if i == 0 {
                fault.clock_offset_ms()
            } else {
                None
            };
            let env = match (offset, shim) {
                (Some(_), Some(lib)) => vec![
                    ("LD_PRELOAD".to_owned(), lib.display().to_string()),
                    (
                        "FLK_CLOCK_OFFSET_FILE".to_owned(),
                        "clock_offset_ms".to_owned(),
                    ),
                ],
                _ => Vec::new(),
            };
            Server::start(port, env, offset)
        })
        .collect();
    if let Some(ms) = fault.clock_offset_ms() {
        let local = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        let seen = (servers[0].time_us().unwrap_or(local) - local) / 1000;
        assert!(
            (seen - ms).abs() < 200,
            "node 0's clock is off by {seen} ms, expected {ms}"
        );
    }
    let urls: Vec<String> = servers.iter().map(Server::url).collect();
    let shared = Arc::new(Shared::default());
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let quorum = QuorumClient::builder(
            urls.iter()
                .map(|url| Client::builder([url.clone()]))
                .collect(),
        )
        .request_timeout(Duration::from_millis(200))
        .skip_commit_round_for_comparison(!commit)
        .connect()
        .await
        .expect("quorum client");
        for _ in 0..2 {
            tasks.push(tokio::spawn(worker(
                quorum.clone(),
                Arc::clone(&shared),
                ttl,
                hold,
            )));
        }
    }
    let started = Instant::now();
    match fault {
        Fault::None => {}
        Fault::Kill1 | Fault::Kill2 => {
            grants_reach(&shared, grants / 4).await;
            let n = if fault == Fault::Kill1 { 1 } else { 2 };
            for server in servers.iter_mut().rev().take(n) {
                server.kill();
            }
        }
        Fault::Kill3 => {
            grants_reach(&shared, grants / 4).await;
            for server in servers.iter_mut().rev().take(3) {
                server.kill();
            }
            shared.outage.store(true, Ordering::Release);
            // The observation window of the outage, not a wait for an event.
            tokio::time::sleep(Duration::from_secs(3)).await;
            shared.outage.store(false, Ordering::Release);
            for server in servers.iter_mut().rev().take(3) {
                server.restart_empty();
            }
        }
        Fault::RestartEmpty | Fault::RestartDelayed => {
            for (i, server) in servers.iter_mut().take(3).enumerate() {
                grants_reach(&shared, grants * (i as u64 + 1) / 4).await;
                if fault == Fault::RestartDelayed {
                    server.kill();
                    // Down longer than the TTL: the delayed restart the safety argument needs.
                    tokio::time::sleep(ttl * 2).await;
                }
                server.restart_empty();
            }
        }
        Fault::Pause => {
            for (i, server) in servers.iter().take(3).enumerate() {
                grants_reach(&shared, grants * (i as u64 + 1) / 4).await;
                server.pause();
                // Paused past the TTL: what the pause is, not a wait for an event.
                tokio::time::sleep(ttl * 3).await;
                server.resume();
            }
        }
        Fault::ClockAhead | Fault::ClockBehind => {
            grants_reach(&shared, grants / 2).await;
            servers[0].kill();
        }
    }
    grants_reach(&shared, grants).await;
    shared.stop.store(true, Ordering::Release);
    for task in tasks {
        if let Err(err) = task.await {
            eprintln!("{}: a worker failed: {err}", fault.id());
            shared.errors.fetch_add(1, Ordering::Relaxed);
            shared.worker_failures.fetch_add(1, Ordering::Relaxed);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    drop(servers);

    let mut records = std::mem::take(&mut *shared.store.records.lock().expect("records"));
    records.sort_by_key(|r| r.start);
    let mut seen = std::collections::HashSet::new();
    let (mut duplicates, mut regressions, mut overlaps) = (0, 0, 0);
    let mut highest = 0;
    for (i, record) in records.iter().enumerate() {
        if !seen.insert(record.token) {
            duplicates += 1;
        }
        if record.token < highest {
            regressions += 1;
        }
        highest = highest.max(record.token);
        overlaps += records[i + 1..]
            .iter()
            .take_while(|later| later.start < record.end)
            .filter(|later| later.holder != record.holder)
            .count() as u64;
    }
    Row {
        fault,
        commit,
        grants: records.len() as u64,
        duplicates,
        regressions,
        rejected: shared.store.rejected.load(Ordering::Relaxed),
        stale_accepted: shared.store.stale_accepted.load(Ordering::Relaxed),
        overlaps,
        timeouts: shared.timeouts.load(Ordering::Relaxed),
        errors: shared.errors.load(Ordering::Relaxed),
        grants_in_outage: shared.grants_in_outage.load(Ordering::Relaxed),
        seconds,
        worker_failures: shared.worker_failures.load(Ordering::Relaxed),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let mut grants = 400;
    let mut faults = Fault::ALL.to_vec();
    let mut ttl = Duration::from_millis(500);
    let mut hold = Duration::from_millis(2);
    let mut base = 8000;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--grants", Some(n)) => grants = n.parse().unwrap_or_else(|_| usage()),
            ("--faults", Some(list)) => {
                faults = list
                    .split(',')
                    .map(|id| Fault::parse(id).unwrap_or_else(|| usage()))
                    .collect()
            }
            ("--ttl-ms", Some(ms)) => {
                ttl = Duration::from_millis(ms.parse().unwrap_or_else(|_| usage()))
            }
            ("--hold-ms", Some(ms)) => {
                hold = Duration::from_millis(ms.parse().unwrap_or_else(|_| usage()))
            }
            ("--port", Some(port)) => base = port.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let shim_path = faults
        .iter()
        .any(|f| f.clock_offset_ms().is_some())
        .then(build_shim);
    let mut rows = Vec::new();
    for &fault in &faults {
        for commit in [true, false] {
            let row = run(fault, commit, grants, ttl, hold, base, shim_path.as_deref()).await;
            eprintln!(
                "{} {}: {} grants in {:.1} s",
                fault.id(),
                if commit { "commit" } else { "no-commit" },
                row.grants,
                row.seconds
            );
            rows.push(row);
        }
    }
    if let Some(lib) = &shim_path {
        if let Some(dir) = lib.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    println!(
        "| fault | variant | grants | duplicate tokens | regressions | stale writes accepted \
         | writes rejected | overlapping holders | ended without grant | grants while < majority up \
         | errors | s |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} |",
            row.fault.describe(),
            if row.commit {
                "commit round"
            } else {
                "no commit (Redlock)"
            },
            row.grants,
            row.duplicates,
            row.regressions,
            row.stale_accepted,
            row.rejected,
            row.overlaps,
            row.timeouts,
            if row.fault == Fault::Kill3 {
                row.grants_in_outage.to_string()
            } else {
                "-".to_owned()
            },
            row.errors,
            row.seconds
        );
    }
    // The commit round's promise (the no-commit rows are there to show what it prevents):
    // no duplicate, regressed or stale-accepted token, every planned grant made, no worker lost.
    let mut failed = 0;
    for row in &rows {
        let fencing = row.duplicates + row.regressions + row.stale_accepted;
        if row.commit && (fencing > 0 || row.grants < grants) || row.worker_failures > 0 {
            eprintln!(
                "{} ({}): {fencing} fencing violations, {} of {grants} grants, {} workers failed",
                row.fault.id(),
                if row.commit { "commit" } else { "no-commit" },
                row.grants,
                row.worker_failures
            );
            failed += 1;
        }
    }
    if failed > 0 {
        std::process::exit(1);
    }
}
