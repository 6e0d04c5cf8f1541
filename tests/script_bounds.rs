//! Every script call's work is bounded: calls at the documented maxima (the semaphore's limit
//! and count per call, a multi-lock's members, the watchdog's renewal batch, the transport's
//! batches, a fair lock's queue, a read-write lock's readers) each run within a few milliseconds on a real server, measured through `SLOWLOG`;
//! larger input is refused with a clear error before anything is sent
//! (`docs/design.md`, "Bounded script work").
//!
//! `cargo test --all-features --test script_bounds -- --nocapture` prints the slowest call of
//! each script.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use common::{Node, Standalone};
use fencelock::{
    Client, Error, Kind, LockOptions, MAX_FAIR_WAITERS, MAX_MULTI_LOCKS, MAX_PERMITS,
    MAX_PERMITS_PER_CALL, MAX_READERS,
};

/// The longest one script call may run: "a few milliseconds" (`docs/design.md`).
const BOUND_US: u64 = 5_000;

/// Calls shorter than this are not logged: logging every command (scripts log the commands
/// they run too) would slow the scripts measured.
const LOG_FROM_US: u64 = 200;

/// Logs every command from now on that runs [`LOG_FROM_US`] or longer, with room for all.
fn log_slow_calls(node: &Node) {
    let _: () = node.cmd(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-max-len")
            .arg(100_000),
    );
    let _: () = node.cmd(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(LOG_FROM_US),
    );
    let _: () = node.cmd(redis::cmd("SLOWLOG").arg("RESET"));
}

/// The slowest logged run of each script since [`log_slow_calls`], by script name, in µs, with
/// the number of logged runs.
fn slowest_scripts(node: &Node) -> HashMap<String, (u64, usize)> {
    let names: HashMap<&str, &str> = fencelock::lua_scripts()
        .map(|script| (script.sha1, script.name))
        .collect();
    let entries: Vec<redis::Value> = node.cmd(redis::cmd("SLOWLOG").arg("GET").arg(-1));
    let mut slowest: HashMap<String, (u64, usize)> = HashMap::new();
    for entry in entries {
        let redis::Value::Array(fields) = entry else {
            continue;
        };
        let micros: u64 = redis::from_redis_value(fields[2].clone()).unwrap();
        let args: Vec<String> = redis::from_redis_value(fields[3].clone()).unwrap_or_default();
        let name = match args
            .first()
            .map(|verb| verb.to_ascii_lowercase())
            .as_deref()
        {
            Some("evalsha") => names
                .get(args[1].as_str())
                .map_or_else(|| format!("evalsha {}", args[1]), |name| (*name).to_owned()),
            Some("eval") => "eval (first run of a script on the node)".to_owned(),
            _ => continue,
        };
        let slot = slowest.entry(name).or_default();
        slot.0 = slot.0.max(micros);
        slot.1 += 1;
    }
    slowest
}

/// Prints the slowest run of each script that ran [`LOG_FROM_US`] or longer (the others did
/// not); returns the calls that ran longer than [`BOUND_US`].
fn over_bound(node: &Node, what: &str) -> Vec<String> {
    let slowest = slowest_scripts(node);
    let mut rows: Vec<_> = slowest.iter().collect();
    rows.sort();
    for (name, (micros, runs)) in &rows {
        eprintln!("{what}: {name}: slowest {micros} µs ({runs} runs of {LOG_FROM_US} µs or more)");
    }
    rows.iter()
        .filter(|(_, (micros, _))| *micros > BOUND_US)
        .map(|(name, (micros, _))| format!("{what}: a {name} call ran {micros} µs"))
        .collect()
}

/// How many times a scenario runs (on a fresh server) before a call over the bound fails the
/// test: one slow run alone can be the machine (a descheduled server on a loaded test host took
/// 13.8 ms for a call that took 0.6 ms in the runs before and after), a call whose work is
/// too large is slow every time. So a call fails the test only when it ran over the bound in
/// every run; on a loaded host the slow calls of one run were other calls than the next run's.
const RUNS: usize = 3;

/// One test, so its scenarios do not compete for the machine with each other.
#[tokio::test(flavor = "multi_thread")]
async fn calls_at_the_documented_maxima_stay_within_a_few_milliseconds() {
    // For each call ("scenario: script"), what it ran in each run that it was over the bound.
    let mut over: HashMap<String, Vec<String>> = HashMap::new();
    for run in 1..=RUNS {
        let mut this_run = semaphore_at_its_maxima().await;
        this_run.extend(multi_lock_renewal_and_batches_at_their_maxima().await);
        this_run.extend(fair_queue_and_readers_at_their_caps().await);
        if !this_run.is_empty() {
            eprintln!("run {run}: over {BOUND_US} µs: {this_run:?}");
        }
        for line in this_run {
            let call = line.split(" ran ").next().unwrap_or_default().to_owned();
            over.entry(call).or_default().push(line);
        }
        over.retain(|_, runs| runs.len() == run);
        if over.is_empty() {
            return;
        }
    }
    panic!("over {BOUND_US} µs in each of {RUNS} runs: {over:?}");
}

async fn semaphore_at_its_maxima() -> Vec<String> {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    // Load every script once: the first run of a script on a node also compiles it.
    let warm = client.semaphore("warm-up", 2).unwrap();
    let guard = warm.try_acquire(&options).await.unwrap();
    let mut guard2 = warm.try_acquire(&options).await.unwrap();
    guard2.extend(Duration::from_secs(30)).await.unwrap();
    warm.available().await.unwrap();
    warm.set_limit(2).await.unwrap();
    client.inspect(Kind::Semaphore, "warm-up").await.unwrap();
    guard.release().await.unwrap();
    guard2.release().await.unwrap();
    client
        .force_unlock(Kind::Semaphore, "warm-up")
        .await
        .unwrap();

    log_slow_calls(&server.node);
    // One owner takes the most one call may take: MAX_PERMITS_PER_CALL entries written.
    let full = client.semaphore("full", MAX_PERMITS).unwrap();
    let mut all = full
        .try_acquire_many(MAX_PERMITS_PER_CALL, &options)
        .await
        .unwrap();
    assert_eq!(all.permits().len(), MAX_PERMITS_PER_CALL as usize);
    assert_eq!(full.available().await.unwrap(), 0);
    all.extend(Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        full.set_limit(MAX_PERMITS).await.unwrap(),
        Some(MAX_PERMITS)
    );
    client.inspect(Kind::Semaphore, "full").await.unwrap();
    // Releasing them leaves MAX_PERMITS dead entries: the next grant deletes all but one.
    all.release().await.unwrap();
    let one = full.try_acquire(&options).await.unwrap();
    assert_eq!(one.permits()[0].number, 0);
    one.release().await.unwrap();

    // Every permit held by its own owner, under the watchdog: each grant reads every live
    // entry, and so does each renewal and the refused attempt.
    let crowded = client.semaphore("crowded", MAX_PERMITS).unwrap();
    let watched = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .watchdog(true);
    let mut holders = Vec::new();
    let mut left = MAX_PERMITS;
    while left > 0 {
        let wave = left.min(32);
        left -= wave;
        let mut tasks = Vec::new();
        for _ in 0..wave {
            let (crowded, watched) = (crowded.clone(), watched.clone());
            tasks.push(tokio::spawn(
                async move { crowded.try_acquire(&watched).await },
            ));
        }
        for task in tasks {
            holders.push(task.await.unwrap().unwrap());
        }
    }
    let lost: Vec<_> = holders.iter().filter(|h| !h.is_valid()).collect();
    if let Some(first) = lost.first() {
        let why = first.lost().await;
        panic!("{} lost, the first: {why:?} {first:?}", lost.len());
    }
    assert!(crowded.try_acquire(&options).await.unwrap_err().is_busy());
    let before = client.stats().renewals;
    common::eventually("every permit renewed once", Duration::from_secs(10), || {
        client.stats().renewals >= before + u64::from(MAX_PERMITS)
    })
    .await;
    assert!(holders.iter().all(|h| h.is_valid()));
    holders[0].extend(Duration::from_secs(2)).await.unwrap();
    client
        .force_unlock(Kind::Semaphore, "crowded")
        .await
        .unwrap();
    drop(holders);
    client.shutdown().await.unwrap();

    over_bound(&server.node, "semaphore")
}

async fn multi_lock_renewal_and_batches_at_their_maxima() -> Vec<String> {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .tag("bounds");
    let warm = client.try_lock_all(&["w1", "w2"], &options).await.unwrap();
    warm.release().await.unwrap();

    log_slow_calls(&server.node);
    // The largest multi-lock, every member in one slot: one lock_all call.
    let names: Vec<String> = (0..MAX_MULTI_LOCKS).map(|i| format!("m{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let all = client.try_lock_all(&names, &options).await.unwrap();
    all.release().await.unwrap();

    // A full renewal batch of mutex locks, and full transport batches of acquires and
    // releases (many tasks at once).
    let watched = LockOptions::new()
        .ttl(Duration::from_millis(1500))
        .watchdog(true);
    let mut guards = Vec::new();
    for wave in 0..fencelock_watchdog_batch() / 250 {
        let mut tasks = Vec::new();
        for i in 0..250 {
            let (client, watched) = (client.clone(), watched.clone());
            tasks.push(tokio::spawn(async move {
                client.lock(&format!("renewed:{wave}:{i}"), &watched).await
            }));
        }
        for task in tasks {
            guards.push(task.await.unwrap().unwrap());
        }
    }
    let before = client.stats().renewals;
    common::eventually("every lock renewed once", Duration::from_secs(10), || {
        client.stats().renewals >= before + guards.len() as u64
    })
    .await;
    assert!(client.stats().batches > 0, "acquires were batched");
    drop(guards);
    client.shutdown().await.unwrap();

    over_bound(&server.node, "multi-lock, renewal, batches")
}

/// Live `q:` places of the fair lock `name`.
fn places(node: &Node, name: &str) -> usize {
    let fields: Vec<String> =
        node.cmd(redis::cmd("HKEYS").arg(format!("fencelock:{{{name}}}:fair")));
    fields.iter().filter(|f| f.starts_with("q:")).count()
}

/// Reader entries (`r:`) of the read-write lock `name`.
fn readers(node: &Node, name: &str) -> usize {
    let fields: Vec<String> = node.cmd(redis::cmd("HKEYS").arg(format!("fencelock:{{{name}}}:rw")));
    fields.iter().filter(|f| f.starts_with("r:")).count()
}

/// Runs the single script `name` (loaded first, so the run is not its compilation) by hand.
fn run_loaded(node: &Node, name: &str, key: &str, args: &[&str]) -> Vec<i64> {
    let script = fencelock::lua_scripts().find(|s| s.name == name).unwrap();
    let _: String = node.cmd(redis::cmd("SCRIPT").arg("LOAD").arg(script.source));
    node.cmd(
        redis::cmd("EVALSHA")
            .arg(script.sha1)
            .arg(1)
            .arg(key)
            .arg(args),
    )
}

/// A fair lock with [`MAX_FAIR_WAITERS`] waiting places (one more caller finds the queue full,
/// gets no place and is still granted in the end) and a read-write lock with [`MAX_READERS`]
/// readers (one more waits until one leaves; a writer, an inspection and a forced unlock read
/// them all).
async fn fair_queue_and_readers_at_their_caps() -> Vec<String> {
    let server = Standalone::start();
    let node = &server.node;
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let waiting = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .timeout(Duration::from_secs(60));
    // Load every script once: the first run of a script on a node also compiles it.
    let held = client.try_fair_lock("warm", &options).await.unwrap();
    let timed_out = LockOptions::new().timeout(Duration::from_millis(50));
    assert!(client.fair_lock("warm", &timed_out).await.is_err());
    client.inspect(Kind::Fair, "warm").await.unwrap();
    held.release().await.unwrap();
    let _held = client.try_fair_lock("warm", &options).await.unwrap();
    client.force_unlock(Kind::Fair, "warm").await.unwrap();
    let read = client.try_read_lock("warm", &options).await.unwrap();
    assert!(client.write_lock("warm", &timed_out).await.is_err());
    client.inspect(Kind::ReadWrite, "warm").await.unwrap();
    read.release().await.unwrap();
    let _read = client.try_read_lock("warm", &options).await.unwrap();
    client.force_unlock(Kind::ReadWrite, "warm").await.unwrap();
    // And their batched forms: several calls at once.
    let held = client.try_fair_lock("warm", &options).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (client, waiting) = (client.clone(), waiting.clone());
        tasks.push(tokio::spawn(async move {
            client.fair_lock("warm", &waiting).await?.release().await?;
            let read = client.read_lock("warm", &waiting).await?;
            read.release().await
        }));
    }
    held.release().await.unwrap();
    for task in tasks {
        task.await.unwrap().unwrap();
    }

    log_slow_calls(node);
    let cap = MAX_FAIR_WAITERS as usize;
    let holder = client.try_fair_lock("queue", &options).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..cap {
        let (client, waiting) = (client.clone(), waiting.clone());
        tasks.push(tokio::spawn(async move {
            let guard = client.fair_lock("queue", &waiting).await?;
            guard.release().await
        }));
    }
    common::eventually(
        "every waiter has its place",
        Duration::from_secs(30),
        || places(node, "queue") == cap,
    )
    .await;
    let full = run_loaded(
        node,
        "fair_acquire",
        "fencelock:{queue}:fair",
        &[
            "by-hand",
            "30000",
            "0",
            "clock",
            "3000",
            &MAX_FAIR_WAITERS.to_string(),
            "10000",
        ],
    );
    assert_eq!(
        (full[0], full[2], full[3]),
        (0, i64::from(MAX_FAIR_WAITERS), -1),
        "a full queue gives no place: {full:?}"
    );
    assert!(
        full[1] > 0 && full[1] <= 1000,
        "polls within a third of its place lease: {full:?}"
    );
    assert_eq!(places(node, "queue"), cap, "no place past the cap");
    let (extra_client, extra_options) = (client.clone(), waiting.clone());
    let extra = tokio::spawn(async move {
        let guard = extra_client.fair_lock("queue", &extra_options).await?;
        guard.release().await
    });
    client.inspect(Kind::Fair, "queue").await.unwrap();
    // The forced unlock reads the full queue and wakes its head; every waiter is then granted
    // in turn, the one without a place too.
    client.force_unlock(Kind::Fair, "queue").await.unwrap();
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    extra.await.unwrap().unwrap();
    assert!(places(node, "queue") == 0);
    drop(holder);

    let cap = MAX_READERS as usize;
    let mut holders = Vec::new();
    while holders.len() < cap {
        let wave = (cap - holders.len()).min(32);
        let mut tasks = Vec::new();
        for _ in 0..wave {
            let (client, options) = (client.clone(), options.clone());
            tasks.push(tokio::spawn(async move {
                client.try_read_lock("readers", &options).await
            }));
        }
        for task in tasks {
            holders.push(task.await.unwrap().unwrap());
        }
    }
    assert_eq!(readers(node, "readers"), cap);
    let refused = run_loaded(
        node,
        "rw_read",
        "fencelock:{readers}:rw",
        &[
            "by-hand",
            "3000",
            "0",
            "clock",
            &MAX_READERS.to_string(),
            "10000",
        ],
    );
    assert_eq!(
        (refused[0], refused[2]),
        (0, i64::from(MAX_READERS)),
        "no reader past the cap: {refused:?}"
    );
    assert!(refused[1] > 0 && refused[1] <= 1000, "{refused:?}");
    let err = client.try_read_lock("readers", &options).await.unwrap_err();
    assert!(err.is_busy(), "{err:?}");
    assert_eq!(readers(node, "readers"), cap, "no reader past the cap");
    let (extra_client, extra_options) = (client.clone(), waiting.clone());
    let extra =
        tokio::spawn(async move { extra_client.read_lock("readers", &extra_options).await });
    assert!(client
        .try_write_lock("readers", &options)
        .await
        .unwrap_err()
        .is_busy());
    client.inspect(Kind::ReadWrite, "readers").await.unwrap();
    holders.pop().unwrap().release().await.unwrap();
    let entered = extra.await.unwrap().unwrap();
    assert_eq!(readers(node, "readers"), cap);
    client
        .force_unlock(Kind::ReadWrite, "readers")
        .await
        .unwrap();
    drop(entered);
    drop(holders);
    client.shutdown().await.unwrap();

    over_bound(node, "fair queue, readers")
}

/// Watched mutex locks: five full renewal calls (`BATCH` = 200 in `src/runtime/watchdog.rs`).
fn fencelock_watchdog_batch() -> usize {
    1000
}

#[tokio::test(flavor = "multi_thread")]
async fn oversize_semaphore_input_is_refused_before_any_script_runs() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new();
    let before = server.node.script_calls();

    for limit in [MAX_PERMITS + 1, 3_000_000, u32::MAX] {
        let err = client.semaphore("huge", limit).unwrap_err();
        assert!(matches!(err, Error::InvalidOptions { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("\"huge\""), "names the semaphore: {text}");
        assert!(
            text.contains(&limit.to_string()),
            "says what was wrong: {text}"
        );
        assert!(
            text.contains(&format!("1 to {MAX_PERMITS}")),
            "says what to do: {text}"
        );
    }
    let pool = client.semaphore("pool", MAX_PERMITS).unwrap();
    let err = pool.set_limit(MAX_PERMITS + 1).await.unwrap_err();
    assert!(matches!(err, Error::InvalidOptions { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!("1 to {MAX_PERMITS}")),
        "{err}"
    );
    assert_eq!(pool.limit(), MAX_PERMITS, "the handle keeps its limit");
    for count in [MAX_PERMITS_PER_CALL + 1, 3_000_000] {
        let err = pool.try_acquire_many(count, &options).await.unwrap_err();
        assert!(matches!(err, Error::InvalidOptions { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("\"pool\"") && text.contains(&count.to_string()),
            "{text}"
        );
        let err = pool.acquire_many(count, &options).await.unwrap_err();
        assert!(matches!(err, Error::InvalidOptions { .. }), "{err:?}");
    }

    // The CLI refuses the same before connecting anywhere useful: exit 64, the reason said.
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args(["--url", &server.url(), "exec", "--permits"])
        .arg((MAX_PERMITS + 1).to_string())
        .args(["cli-pool", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(64), "{stderr}");
    assert!(stderr.contains(&format!("1 to {MAX_PERMITS}")), "{stderr}");

    assert_eq!(
        server.node.script_calls(),
        before,
        "no script ran for refused input"
    );
    assert_eq!(
        server.node.cmd::<i64>(&mut redis::cmd("DBSIZE")),
        0,
        "nothing written"
    );
}
