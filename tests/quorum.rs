//! The fenced quorum lock (`QuorumClient`) over independent standalone servers: grants, the
//! commit round's reason to exist (A ahead, B and C behind), kills, pauses, restarts with and
//! without persistence, and `lost()`.
//!
//! The servers here are started by this file's own small harness, because the tests restart a
//! server on the same port and directory (with or without an append-only file), which the
//! shared harness does not do. Every process is stopped by pid on drop.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{eventually, wait_until};
use fencelock::{Error, LockOptions, QuorumClient};

/// A redis-server that can be killed and restarted on the same port and directory.
struct Server {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    child: Option<Child>,
}

impl Server {
    /// A server without persistence.
    fn start() -> Server {
        Self::start_with(&[])
    }

    /// A server with an append-only file, fsynced before every write is acknowledged.
    fn start_aof() -> Server {
        Self::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
    }

    fn start_with(extra: &[&str]) -> Server {
        // An ephemeral port (32768 and up), away from the shared harness's 20000-30000 range.
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("fencelock-quorum-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        let mut server = Server {
            port,
            dir,
            extra: extra.iter().map(|s| (*s).to_owned()).collect(),
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
            .args(&self.extra)
            .stdout(Stdio::from(log))
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        self.child = Some(child);
        wait_until(
            &format!("redis on {}", self.port),
            Duration::from_secs(10),
            || self.answers(),
        );
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn answers(&self) -> bool {
        self.try_cmd::<String>(&mut redis::cmd("PING")).is_ok()
    }

    fn try_cmd<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> redis::RedisResult<T> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_connection_with_timeout(Duration::from_secs(1))?;
        conn.set_read_timeout(Some(Duration::from_secs(2)))?;
        cmd.query(&mut conn)
    }

    fn cmd<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> T {
        self.try_cmd(cmd)
            .unwrap_or_else(|e| panic!("command on {}: {e}", self.port))
    }

    /// The stored fence of lock `name` (default prefix), 0 when the key is absent.
    fn fence(&self, name: &str) -> u64 {
        let state: Option<String> = self.cmd(
            redis::cmd("HGET")
                .arg(format!("fencelock:{{{name}}}:lock"))
                .arg("until"),
        );
        common::LockState::parse(&state.unwrap_or_default())
            .fence
            .parse()
            .unwrap_or(0)
    }

    /// Whether lock `name` has a live owner on this server.
    fn held(&self, name: &str) -> bool {
        let remaining: i64 = self.cmd(
            redis::cmd("EVAL")
                .arg(
                    "local t = redis.call('TIME') \
                     local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
                     local u, o = string.match(redis.call('HGET', KEYS[1], 'until') or '', \
                     '^(%d+) %d+ (%S*)') \
                     if o and o ~= '' and tonumber(u) > now then return tonumber(u) - now end \
                     return -1",
                )
                .arg(1)
                .arg(format!("fencelock:{{{name}}}:lock")),
        );
        remaining > 0
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status()
                .expect("kill");
            assert!(status.success(), "kill {signal}");
        }
    }

    /// SIGSTOP: sockets stay open, nothing is answered.
    fn pause(&self) {
        self.signal("-STOP");
    }

    fn resume(&self) {
        self.signal("-CONT");
    }

    /// SIGKILL, reaped.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and directory (its append-only file, if any,
    /// is loaded before it answers).
    fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Kills the server and starts it with nothing: no data file survives.
    fn restart_empty(&mut self) {
        self.kill();
        for entry in std::fs::read_dir(&self.dir).expect("scratch dir").flatten() {
            if entry.file_name() != "redis.log" {
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

fn urls(servers: &[Server]) -> Vec<String> {
    servers.iter().map(Server::url).collect()
}

async fn quorum(servers: &[Server]) -> QuorumClient {
    QuorumClient::builder(
        urls(servers)
            .into_iter()
            .map(|url| fencelock::Client::builder([url]))
            .collect(),
    )
    .request_timeout(Duration::from_millis(500))
    .connect()
    .await
    .expect("quorum client")
}

async fn quorum_without_commit(servers: &[Server]) -> QuorumClient {
    QuorumClient::builder(
        urls(servers)
            .into_iter()
            .map(|url| fencelock::Client::builder([url]))
            .collect(),
    )
    .request_timeout(Duration::from_millis(500))
    .skip_commit_round_for_comparison(true)
    .connect()
    .await
    .expect("quorum client")
}

fn options(ttl_ms: u64, timeout_ms: u64) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .timeout(Duration::from_millis(timeout_ms))
}

#[tokio::test(flavor = "multi_thread")]
async fn grants_refuses_releases_and_grants_again_with_the_fence_committed_everywhere() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let quorum = quorum(&servers).await;
    assert_eq!((quorum.deployments(), quorum.majority()), (3, 2));

    let guard = quorum.try_lock("job", &options(5000, 0)).await.unwrap();
    let first = guard.fence().get();
    assert_eq!(guard.name(), "job");
    assert!(guard.is_valid());
    assert!(guard.valid_until() > Instant::now() + Duration::from_millis(4000));
    for server in &servers {
        assert!(server.held("job"));
        assert_eq!(
            server.fence("job"),
            first,
            "the commit round set T on every node"
        );
    }

    let other = QuorumClient::connect(urls(&servers)).await.unwrap();
    match other.try_lock("job", &options(5000, 0)).await {
        Err(Error::Busy { retry_after, .. }) => assert!(retry_after > Duration::from_secs(3)),
        other => panic!("expected Busy, got {other:?}"),
    }
    let started = Instant::now();
    match other.lock("job", &options(5000, 300)).await {
        Err(Error::Busy { waited, .. }) => assert!(waited >= Duration::from_millis(300)),
        other => panic!("expected Busy after waiting, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_millis(300 + 2 * 500 + 300));

    guard.release().await.unwrap();
    for server in &servers {
        assert!(!server.held("job"));
    }
    let again = other.try_lock("job", &options(5000, 0)).await.unwrap();
    assert!(again.fence().get() > first);
    again.release().await.unwrap();

    // A waiting lock() is granted once the holder releases.
    let held = quorum.try_lock("job", &options(5000, 0)).await.unwrap();
    let waiting = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let waiter = {
        let other = other.clone();
        let waiting = std::sync::Arc::clone(&waiting);
        let options = options(5000, 5000).on_wait(move |_| {
            waiting.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        tokio::spawn(async move { other.lock("job", &options).await })
    };
    eventually(
        "the waiter found the lock held",
        Duration::from_secs(2),
        || waiting.load(std::sync::atomic::Ordering::SeqCst),
    )
    .await;
    let fence = held.fence();
    held.release().await.unwrap();
    let granted = waiter.await.unwrap().unwrap();
    assert!(granted.fence() > fence);
    granted.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_counts_and_options_are_refused_with_clear_errors() {
    let servers: Vec<Server> = (0..2).map(|_| Server::start()).collect();
    for count in [1, 2] {
        let err = QuorumClient::connect(urls(&servers[..count]))
            .await
            .unwrap_err();
        let expected = format!("got {count}");
        assert!(
            matches!(&err, Error::InvalidConfig { reason } if reason.contains(&expected)),
            "{err}"
        );
    }
    let four: Vec<String> = (0..4).map(|_| servers[0].url()).collect();
    let err = QuorumClient::connect(four).await.unwrap_err();
    assert!(err.to_string().contains("got 4"), "{err}");

    let three: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let quorum = quorum(&three).await;
    let err = quorum
        .try_lock(
            "job",
            &LockOptions::new().wait_replicas(1, Duration::from_millis(100)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidOptions { .. }), "{err}");
    let err = quorum.try_lock("", &LockOptions::new()).await.unwrap_err();
    assert!(matches!(err, Error::InvalidName { .. }), "{err}");
}

/// The case of issue 12: A's fence is far ahead of B's and C's. A grant on {A, B} takes A's
/// fence; a later grant on {B, C} is larger only because the commit round raised B.
#[tokio::test(flavor = "multi_thread")]
async fn commit_round_keeps_tokens_rising_across_majorities_and_redlock_without_it_does_not() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let (a, b, c) = (&servers[0], &servers[1], &servers[2]);
    // A is "ahead": its stored fence 1000 s past the clock (as after a floor, or a grant on a
    // node whose clock ran ahead). B and C start empty ("0").
    let now_us: Vec<u64> = a.cmd(&mut redis::cmd("TIME"));
    let ahead = now_us[0] * 1_000_000 + now_us[1] + 1_000_000_000;
    for name in ["with-commit", "without-commit"] {
        let _: i64 = a.cmd(
            redis::cmd("HSET")
                .arg(format!("fencelock:{{{name}}}:lock"))
                .arg("until")
                .arg(format!("0 {ahead} ")),
        );
    }
    let safe = quorum(&servers).await;
    let redlock = quorum_without_commit(&servers).await;

    let mut tokens = Vec::new();
    for (client, name) in [(&safe, "with-commit"), (&redlock, "without-commit")] {
        c.pause();
        let first = client.lock(name, &options(1000, 5000)).await.unwrap();
        let t1 = first.fence().get();
        assert!(t1 > ahead, "{{A, B}} takes A's fence");
        first.release().await.unwrap();
        if name == "with-commit" {
            assert_eq!(b.fence(name), t1, "the commit raised B to T");
        } else {
            assert!(
                b.fence(name) < t1,
                "without the commit B keeps its own fence"
            );
        }
        c.resume();
        a.pause();
        let second = client.lock(name, &options(1000, 5000)).await.unwrap();
        let t2 = second.fence().get();
        second.release().await.unwrap();
        a.resume();
        tokens.push((t1, t2));
    }
    let (with_commit, without_commit) = (tokens[0], tokens[1]);
    assert!(
        with_commit.1 > with_commit.0,
        "with the commit round the grant on {{B, C}} is larger: {with_commit:?}"
    );
    assert!(
        without_commit.1 < without_commit.0,
        "without it the grant on {{B, C}} goes backwards: {without_commit:?}"
    );
    println!("A=ahead, B=C=0: with commit {with_commit:?}, without commit {without_commit:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_strictly_increase_over_200_grants_while_nodes_are_killed_and_restarted() {
    // Persistence (AOF, fsync always) so a restarted node keeps its acknowledged fences.
    let mut servers: Vec<Server> = (0..5).map(|_| Server::start_aof()).collect();
    // One node ahead, so the majorities without it depend on the commit round.
    let now_us: Vec<u64> = servers[0].cmd(&mut redis::cmd("TIME"));
    let ahead = now_us[0] * 1_000_000 + now_us[1] + 500_000_000;
    let _: i64 = servers[0].cmd(
        redis::cmd("HSET")
            .arg("fencelock:{rotating}:lock")
            .arg("until")
            .arg(format!("0 {ahead} ")),
    );
    let quorum = quorum(&servers).await;
    let mut last = 0;
    let mut down: Vec<usize> = Vec::new();
    for grant in 0..200 {
        if grant % 20 == 0 {
            // Bring back the nodes that were down and take two others down: each block of 20
            // grants runs on another majority.
            for index in down.drain(..) {
                servers[index].restart();
            }
            let block = grant / 20;
            down = vec![(block + 1) % 5, (block + 3) % 5];
            for &index in &down {
                servers[index].kill();
            }
        }
        let guard = quorum
            .lock("rotating", &options(2000, 10_000))
            .await
            .unwrap_or_else(|e| panic!("grant {grant} with {down:?} down: {e}"));
        let fence = guard.fence().get();
        assert!(fence > last, "grant {grant}: {fence} after {last}");
        if grant == 0 {
            assert!(fence > ahead);
        }
        last = fence;
        guard.release().await.unwrap();
    }
    println!("200 grants over rotating majorities: strictly increasing, last {last}");
    for index in down {
        servers[index].restart();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn five_nodes_two_killed_grants_go_on_three_killed_time_out_cleanly() {
    let mut servers: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let quorum = quorum(&servers).await;
    let mut last = 0;
    for killed in 0..=2 {
        if killed > 0 {
            servers[killed - 1].kill();
        }
        for _ in 0..5 {
            let guard = quorum.lock("five", &options(2000, 3000)).await.unwrap();
            assert!(guard.fence().get() > last);
            assert!(guard.nodes() >= 3);
            last = guard.fence().get();
            guard.release().await.unwrap();
        }
    }
    servers[2].kill();
    let started = Instant::now();
    let err = quorum.lock("five", &options(2000, 1000)).await.unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(&err, Error::Timeout { .. }),
        "three of five down: {err}"
    );
    println!("three of five killed: {err} after {took:?}");
    assert!(took >= Duration::from_millis(1000));
    assert!(
        took < Duration::from_millis(1000 + 2 * 500 + 300),
        "{took:?}"
    );
    let err = quorum
        .try_lock("five", &options(2000, 0))
        .await
        .unwrap_err();
    assert!(matches!(&err, Error::Timeout { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_paused_past_the_ttl_does_not_stop_or_slow_grants() {
    let servers: Vec<Server> = (0..5).map(|_| Server::start()).collect();
    let quorum = quorum(&servers).await;
    servers[1].pause();
    let started = Instant::now();
    let mut last = 0;
    let mut slowest = Duration::ZERO;
    let mut grants = 0;
    // 300 ms TTL: the pause outlasts many leases.
    while started.elapsed() < Duration::from_millis(1500) {
        let attempt = Instant::now();
        let guard = quorum.lock("paused", &options(300, 2000)).await.unwrap();
        assert!(guard.fence().get() > last);
        last = guard.fence().get();
        guard.release().await.unwrap();
        slowest = slowest.max(attempt.elapsed());
        grants += 1;
    }
    servers[1].resume();
    println!(
        "one of five paused for 1.5 s, 300 ms TTL: {grants} grants, \
         slowest grant+release {slowest:?}"
    );
    assert!(
        slowest < Duration::from_millis(400),
        "a grant and release took {slowest:?} with one node paused"
    );
    // Resumed, it serves again: its queued grants were released behind them.
    eventually("the resumed node answers", Duration::from_secs(5), || {
        servers[1].answers()
    })
    .await;
    for _ in 0..5 {
        let guard = quorum.lock("paused", &options(300, 2000)).await.unwrap();
        assert!(guard.fence().get() > last);
        last = guard.fence().get();
        guard.release().await.unwrap();
    }
}

/// How a node comes back in `a_node_restarted_during_a_hold_…`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Restart {
    /// At once, with no data.
    Empty,
    /// At once, from its append-only file (`appendfsync always`).
    Aof,
    /// With no data, but only once its keys would have expired anyway: the lease is over and
    /// the clock has passed every fence it stored.
    EmptyDelayed,
}

/// A node restarted during a hold: without persistence it comes back empty, and a later
/// majority that pairs it with a node the commit never reached hands out a smaller token; with
/// an append-only file fsynced on every write it comes back with the committed fence, and an
/// empty node kept out until its keys would have expired answers above it too.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_restarted_during_a_hold_regresses_without_persistence_and_not_with_aof() {
    let mut outcomes = Vec::new();
    for restart in [Restart::Empty, Restart::Aof, Restart::EmptyDelayed] {
        let mut servers: Vec<Server> = (0..3)
            .map(|_| {
                if restart == Restart::Aof {
                    Server::start_aof()
                } else {
                    Server::start()
                }
            })
            .collect();
        // B ahead of the clock (1000 s; 2 s for the delayed restart, which waits it out); the
        // hold is taken on {A, B} (C paused), so C never sees T.
        let lead = if restart == Restart::EmptyDelayed {
            2_000_000
        } else {
            1_000_000_000
        };
        let now_us: Vec<u64> = servers[1].cmd(&mut redis::cmd("TIME"));
        let ahead = now_us[0] * 1_000_000 + now_us[1] + lead;
        let _: i64 = servers[1].cmd(
            redis::cmd("HSET")
                .arg("fencelock:{restarted}:lock")
                .arg("until")
                .arg(format!("0 {ahead} ")),
        );
        let quorum = quorum(&servers).await;
        servers[2].pause();
        let guard = quorum
            .lock("restarted", &options(1000, 5000))
            .await
            .unwrap();
        let t1 = guard.fence().get();
        assert_eq!(servers[0].fence("restarted"), t1, "A has the commit");
        // A restarts during the hold.
        match restart {
            Restart::Empty => servers[0].restart_empty(),
            Restart::Aof => servers[0].restart(),
            Restart::EmptyDelayed => servers[0].kill(),
        }
        let released = guard.release().await;
        if restart == Restart::EmptyDelayed {
            // Kept down until the 1 s lease is over and the clock has passed T: the moment
            // A's key would have expired (grace aside) had it survived.
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            let until = Duration::from_micros(t1) + Duration::from_millis(1000);
            tokio::time::sleep(until.saturating_sub(now)).await;
            servers[0].restart_empty();
        }
        servers[2].resume();
        // The next majority is {A, C}: B is paused.
        servers[1].pause();
        let next = quorum
            .lock("restarted", &options(1000, 5000))
            .await
            .unwrap();
        let t2 = next.fence().get();
        next.release().await.unwrap();
        servers[1].resume();
        println!("{restart:?}: t1 {t1}, t2 {t2}, release after the restart: {released:?}");
        outcomes.push((restart, t1, t2));
    }
    for (restart, t1, t2) in outcomes {
        match restart {
            Restart::Empty => assert!(
                t2 < t1,
                "no persistence: the empty node lets the token go back ({t1} then {t2})"
            ),
            Restart::Aof | Restart::EmptyDelayed => assert!(
                t2 > t1,
                "{restart:?}: the token keeps rising ({t1} then {t2})"
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lost_fires_within_the_ttl_when_a_majority_is_killed_while_holding() {
    let mut servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let quorum = quorum(&servers).await;
    let guard = quorum
        .lock("watched", &options(1000, 2000).watchdog(true))
        .await
        .unwrap();
    // Renewed past its TTL while the nodes live.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(guard.is_valid(), "the watchdog renews every node");
    let killed_at = Instant::now();
    servers[0].kill();
    servers[1].kill();
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost() fires");
    let after = killed_at.elapsed();
    assert!(lost.is_lock_lost(), "{lost}");
    assert!(after <= Duration::from_millis(1100), "lost after {after:?}");
    assert!(!guard.is_valid());
    println!("lost after {after:?}: {lost}");
    assert!(guard.release().await.is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn one_node_killed_while_holding_keeps_the_hold_valid() {
    let mut servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let quorum = quorum(&servers).await;
    let mut guard = quorum
        .lock("survivor", &options(600, 2000).watchdog(true))
        .await
        .unwrap();
    servers[2].kill();
    tokio::select! {
        lost = guard.lost() => panic!("lost with a majority alive: {lost}"),
        () = tokio::time::sleep(Duration::from_millis(1500)) => {}
    }
    assert!(guard.is_valid());
    let until = guard.extend(Duration::from_secs(5)).await.unwrap();
    assert!(until > Instant::now() + Duration::from_secs(4));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn dropped_calls_and_guards_leave_nothing_held() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let quorum = quorum(&servers).await;
    // A guard dropped without release: released on every node in the background, done once
    // shutdown returns.
    let guard = quorum
        .lock("dropped", &options(10_000, 2000))
        .await
        .unwrap();
    drop(guard);
    quorum.shutdown().await.unwrap();
    assert!(servers.iter().all(|s| !s.held("dropped")));
    // Lock calls cancelled at different points: none leaves a lease behind.
    for micros in [0, 50, 200, 500, 1000, 3000] {
        let _ = tokio::time::timeout(
            Duration::from_micros(micros),
            quorum.lock("dropped", &options(10_000, 2000)),
        )
        .await;
        eventually(
            &format!("nothing held after a call cancelled at {micros} µs"),
            Duration::from_secs(2),
            || servers.iter().all(|s| !s.held("dropped")),
        )
        .await;
    }
    // And the lock is free for a grant at once.
    let guard = quorum
        .try_lock("dropped", &options(10_000, 0))
        .await
        .unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deployment_down_at_connect_joins_when_it_comes_up() {
    let mut servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    servers[2].kill();
    let quorum = quorum(&servers).await;
    let guard = quorum.lock("late", &options(2000, 2000)).await.unwrap();
    assert_eq!(guard.nodes(), 2);
    guard.release().await.unwrap();
    servers[2].restart();
    let started = Instant::now();
    loop {
        let guard = quorum.lock("late", &options(2000, 2000)).await.unwrap();
        let nodes = guard.nodes();
        guard.release().await.unwrap();
        if nodes == 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the restarted deployment never joined"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_extend_failing_on_a_majority_is_an_error_and_lost_fires_at_the_old_validity() {
    let mut servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let quorum = quorum(&servers).await;
    let mut guard = quorum.lock("manual", &options(1000, 2000)).await.unwrap();
    let until = guard.extend(Duration::from_millis(1500)).await.unwrap();
    assert!(until > Instant::now() + Duration::from_millis(1300));
    servers[0].kill();
    servers[1].kill();
    let err = guard.extend(Duration::from_secs(5)).await.unwrap_err();
    println!("extend with two of three down: {err}");
    assert!(
        matches!(err, Error::Redis { .. } | Error::Timeout { .. }),
        "{err}"
    );
    // Still valid on the live node and on a killed node's last lease: the majority-th
    // latest lease end, about where the last good extend left it.
    let until = guard.valid_until();
    assert!(until > Instant::now() && until < Instant::now() + Duration::from_millis(1600));
    let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost() fires");
    assert!(matches!(lost, Error::Expired { .. }), "{lost}");
    assert!(Instant::now() >= until);
    assert!(Instant::now() < until + Duration::from_millis(200));
}

/// Two clients with four tasks each contend for one quorum lock: holders never overlap, no
/// read-modify-write update is lost, and fences rise in grant order.
#[tokio::test(flavor = "multi_thread")]
async fn contending_clients_never_overlap_and_fences_rise_in_grant_order() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    let servers: Vec<Server> = (0..3).map(|_| Server::start()).collect();
    let clients = [quorum(&servers).await, quorum(&servers).await];
    let inside = Arc::new(AtomicBool::new(false));
    let state = Arc::new(Mutex::new((0u64, 0u64))); // (counter, last fence admitted)
    let mut tasks = Vec::new();
    for task in 0..8 {
        let client = clients[task % 2].clone();
        let (inside, state) = (Arc::clone(&inside), Arc::clone(&state));
        tasks.push(tokio::spawn(async move {
            for _ in 0..15 {
                let guard = client
                    .lock("contended", &options(2000, 20_000))
                    .await
                    .unwrap();
                assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                let read = {
                    let mut state = state.lock().unwrap();
                    assert!(guard.fence().get() > state.1, "fences rise in grant order");
                    state.1 = guard.fence().get();
                    state.0
                };
                tokio::task::yield_now().await;
                state.lock().unwrap().0 = read + 1;
                inside.store(false, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(state.lock().unwrap().0, 8 * 15, "no update lost");
}

/// A deployment may be a whole cluster: the quorum's requests are routed by the lock's key.
#[tokio::test(flavor = "multi_thread")]
async fn a_deployment_can_be_a_cluster() {
    let cluster = common::Cluster::start();
    let servers: Vec<Server> = (0..2).map(|_| Server::start()).collect();
    let quorum = QuorumClient::connect([
        cluster.urls()[0].clone(),
        servers[0].url(),
        servers[1].url(),
    ])
    .await
    .unwrap();
    let keys =
        fencelock::LockKeys::new("fencelock", "spread", &fencelock::Placement::ByName).unwrap();
    let master = cluster.master_of_slot(keys.slot());
    let mut last = 0;
    for _ in 0..5 {
        let guard = quorum.lock("spread", &options(2000, 2000)).await.unwrap();
        assert_eq!(guard.nodes(), 3);
        assert!(master.held(keys.lock_key()), "held on the cluster's master");
        let fence: u64 = master
            .lock_field(keys.lock_key(), "fence")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(fence, guard.fence().get(), "committed on the cluster too");
        assert!(fence > last);
        last = fence;
        guard.release().await.unwrap();
    }
}
