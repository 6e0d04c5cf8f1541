//! The read-write lock against real Redis servers: sharing, exclusion, fences, writer priority,
//! crashed and renewed readers, re-entry, downgrade, upgrade refusal, intent withdrawal, resent
//! scripts, maxmemory and a forced-loss failover.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, Cluster, Node, Standalone};
use fencelock::{Client, Error, FenceMode, FenceToken, LockOptions, WriteGuard};

async fn client(server: &Standalone) -> Client {
    Client::connect([server.url()]).await.expect("connect")
}

fn key(name: &str) -> String {
    format!("fencelock:{{{name}}}:rw")
}

fn fields(node: &Node, name: &str) -> Vec<(String, String)> {
    node.cmd(redis::cmd("HGETALL").arg(key(name)))
}

fn server_ms(node: &Node) -> u64 {
    let (s, us): (u64, u64) = node.cmd(&mut redis::cmd("TIME"));
    s * 1000 + us / 1000
}

/// Reader entries whose lease has not ended by the server's clock.
fn live_readers(node: &Node, name: &str) -> usize {
    let now = server_ms(node);
    fields(node, name)
        .iter()
        .filter(|(field, value)| {
            field.starts_with("r:")
                && value
                    .split(':')
                    .next()
                    .and_then(|ends| ends.parse::<u64>().ok())
                    .is_some_and(|ends| ends > now)
        })
        .count()
}

fn has_intent(node: &Node, name: &str) -> bool {
    node.cmd::<bool>(redis::cmd("HEXISTS").arg(key(name)).arg("i"))
}

fn busy<T: std::fmt::Debug>(result: fencelock::Result<T>, what: &str) -> Duration {
    match result {
        Err(Error::Busy { retry_after, .. }) => retry_after,
        other => panic!("{what}: expected Busy, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn readers_overlap_with_distinct_rising_fences() {
    let server = Standalone::start();
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let mut readers = Vec::new();
    for _ in 0..3 {
        let client = client(&server).await;
        let guard = client.try_read_lock("cat", &options).await.expect("read");
        readers.push((client, guard));
    }
    assert!(readers.iter().all(|(_, guard)| guard.is_valid()));
    assert_eq!(live_readers(&server.node, "cat"), 3, "three reads at once");
    let fences: Vec<FenceToken> = readers.iter().map(|(_, guard)| guard.fence()).collect();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    for (_, guard) in readers {
        guard.release().await.expect("release");
    }
    assert_eq!(live_readers(&server.node, "cat"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writer_excludes_readers_and_writers_and_fences_order_them() {
    let server = Standalone::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let read = a.try_read_lock("cat", &options).await.unwrap();
    let retry = busy(
        b.try_write_lock("cat", &options).await,
        "write over a reader",
    );
    assert!(retry <= Duration::from_secs(10));
    assert!(
        !has_intent(&server.node, "cat"),
        "a single attempt leaves no intent"
    );
    let read_fence = read.fence();
    read.release().await.unwrap();

    let write = b.try_write_lock("cat", &options).await.expect("write");
    assert!(
        write.fence() > read_fence,
        "the writer's fence exceeds earlier readers'"
    );
    busy(a.try_read_lock("cat", &options).await, "read over a writer");
    busy(
        a.try_write_lock("cat", &options).await,
        "write over a writer",
    );
    let write_fence = write.fence();
    write.release().await.unwrap();

    let read = a.try_read_lock("cat", &options).await.expect("read after");
    assert!(
        read.fence() > write_fence,
        "a later reader's fence exceeds the writer's"
    );
    read.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writer_is_not_starved_by_a_stream_of_readers() {
    let server = Standalone::start();
    let client = client(&server).await;
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .timeout(Duration::from_secs(20));
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let (client, stop, reads, options) = (
            client.clone(),
            Arc::clone(&stop),
            Arc::clone(&reads),
            options.clone(),
        );
        tasks.push(tokio::spawn(async move {
            // Staggered starts and unequal holds keep the readers out of step, so some reader
            // holds the lock at every moment: without writer priority no writer gets in.
            tokio::time::sleep(Duration::from_millis(4 * i)).await;
            while !stop.load(Ordering::Relaxed) {
                let guard = client.read_lock("feed", &options).await.expect("read");
                reads.fetch_add(1, Ordering::Relaxed);
                // The work done under the read hold.
                tokio::time::sleep(Duration::from_millis(25 + 3 * i)).await;
                guard.release().await.expect("release");
            }
        }));
    }
    let started_reads = reads.load(Ordering::Relaxed);
    eventually("readers stream", Duration::from_secs(5), || {
        reads.load(Ordering::Relaxed) > started_reads + 50
    })
    .await;
    let started = Instant::now();
    let write = client
        .write_lock("feed", &options.clone().timeout(Duration::from_secs(3)))
        .await
        .expect("the writer gets in");
    let waited = started.elapsed();
    assert_eq!(
        live_readers(&server.node, "feed"),
        0,
        "no reader while writing"
    );
    eprintln!("writer among 8 continuous readers waited {waited:?}");
    assert!(waited < Duration::from_secs(2), "waited {waited:?}");
    write.release().await.unwrap();
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_readers_with_re_entered_holds_are_removed_in_one_pass_and_live_ones_kept() {
    let server = Standalone::start();
    let (dead, live, writer) = (
        client(&server).await,
        client(&server).await,
        client(&server).await,
    );
    let short = LockOptions::new().ttl(Duration::from_millis(1000));
    let mut lease_ends = 0;
    for _ in 0..3 {
        // A reader that crashed with a re-entered hold: an entry, a count and two hold fields.
        let read = dead.try_read_lock("doc", &short).await.unwrap();
        let inner = read
            .reentry()
            .ttl(Duration::from_millis(1000))
            .read()
            .await
            .unwrap();
        lease_ends = server_ms(&server.node) + 1000;
        std::mem::forget(inner);
        std::mem::forget(read);
    }
    let kept = live
        .try_read_lock("doc", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let kept_re = kept.reentry().read().await.unwrap();
    while server_ms(&server.node) <= lease_ends + 1 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The writer's attempt is refused (a live reader) and clears the dead ones as it goes.
    busy(
        writer.try_write_lock("doc", &LockOptions::new()).await,
        "a live reader",
    );
    let left: Vec<String> = fields(&server.node, "doc")
        .into_iter()
        .map(|(f, _)| f)
        .filter(|f| f.starts_with("r:") || f.starts_with("c:") || f.starts_with("h:"))
        .collect();
    // Only the live reader's entry, count and two holds are left.
    assert_eq!(left.len(), 4, "{left:?}");
    let owner = left
        .iter()
        .find_map(|f| f.strip_prefix("r:"))
        .expect("the live entry");
    assert!(left.iter().all(|f| f.contains(owner)), "{left:?}");
    kept_re.release().await.unwrap();
    kept.release().await.unwrap();
    writer
        .try_write_lock("doc", &LockOptions::new())
        .await
        .expect("free")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_reader_stops_blocking_a_writer_after_its_lease() {
    let server = Standalone::start();
    let (reader, writer) = (client(&server).await, client(&server).await);
    let lease = Duration::from_millis(500);
    let crashed = reader
        .try_read_lock("doc", &LockOptions::new().ttl(lease))
        .await
        .unwrap();
    let read_at = Instant::now();
    std::mem::forget(crashed); // never released, never renewed
    let write = writer
        .write_lock("doc", &LockOptions::new().timeout(Duration::from_secs(5)))
        .await
        .expect("granted once the reader's lease ended");
    let waited = read_at.elapsed();
    eprintln!("crashed reader (lease {lease:?}) blocked the writer for {waited:?}");
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    assert!(
        !fields(&server.node, "doc")
            .iter()
            .any(|(f, _)| f.starts_with("r:")),
        "the dead reader's entry was removed when seen"
    );
    write.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn renewing_one_reader_does_not_extend_another() {
    let server = Standalone::start();
    let client = client(&server).await;
    let lease = Duration::from_millis(500);
    let forgotten = client
        .try_read_lock("doc", &LockOptions::new().ttl(lease))
        .await
        .unwrap();
    std::mem::forget(forgotten);
    let watched = client
        .try_read_lock(
            "doc",
            &LockOptions::new()
                .ttl(lease)
                .watchdog(true)
                .renew_every(Duration::from_millis(100)),
        )
        .await
        .unwrap();
    assert_eq!(live_readers(&server.node, "doc"), 2);
    eventually(
        "the forgotten reader's lease ends",
        Duration::from_secs(3),
        || live_readers(&server.node, "doc") == 1,
    )
    .await;
    // Several renewal periods and a full lease later the watched reader is still the one live.
    let later = Instant::now() + lease * 2;
    while Instant::now() < later {
        assert!(watched.is_valid());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        live_readers(&server.node, "doc"),
        1,
        "only the watched reader lives"
    );
    assert!(client.stats().renewals > 3);
    let retry = busy(
        client.try_write_lock("doc", &LockOptions::new()).await,
        "the watched reader still blocks writers",
    );
    assert!(retry <= lease, "{retry:?}");
    watched.release().await.unwrap();
    client
        .try_write_lock("doc", &LockOptions::new())
        .await
        .expect("free")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn write_downgrades_to_read_and_other_readers_enter() {
    let server = Standalone::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let write = a.try_write_lock("doc", &options).await.unwrap();
    busy(
        b.try_read_lock("doc", &options).await,
        "reader over the writer",
    );
    downgrades_and_readers_enter(write, &b, &options).await;
}

/// Downgrades `write` (on "doc"), lets `other` read beside it, and checks that the lock is free
/// for a writer once both reads are released.
async fn downgrades_and_readers_enter(write: WriteGuard, other: &Client, options: &LockOptions) {
    let fence = write.fence();
    let read = write.downgrade().await.expect("downgrade");
    assert_eq!(read.fence(), fence, "the downgraded hold keeps its fence");
    let beside = other
        .try_read_lock("doc", options)
        .await
        .expect("readers enter");
    assert!(beside.fence() > fence);
    busy(
        other.try_write_lock("doc", options).await,
        "the downgraded hold is a read hold",
    );
    read.release().await.unwrap();
    beside.release().await.unwrap();
    other
        .try_write_lock("doc", options)
        .await
        .expect("free after both reads")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn upgrade_is_refused_and_reentry_adds_holds_with_the_same_fence() {
    let server = Standalone::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let options = LockOptions::new().ttl(Duration::from_secs(10));

    let read = a.try_read_lock("doc", &options).await.unwrap();
    let err = read.reentry().write().await.unwrap_err();
    assert!(matches!(err, Error::RoleRefused { .. }), "{err:?}");
    assert!(err.to_string().contains("cannot be upgraded"), "{err}");
    let again = read.reentry().read().await.expect("read re-entry");
    assert_eq!(again.fence(), read.fence());
    read.release().await.unwrap();
    busy(
        b.try_write_lock("doc", &options).await,
        "the re-entered read still holds",
    );
    again.release().await.unwrap();

    let write = a.try_write_lock("doc", &options).await.unwrap();
    let inner = write.reentry().write().await.expect("write re-entry");
    let inner_read = write.reentry().read().await.expect("a writer may read");
    assert_eq!(inner.fence(), write.fence());
    assert_eq!(inner_read.fence(), write.fence());
    inner_read.release().await.unwrap();
    let err = write.downgrade().await.unwrap_err();
    assert!(matches!(err, Error::RoleRefused { .. }), "{err:?}");
    busy(
        b.try_read_lock("doc", &options).await,
        "the inner write hold keeps it",
    );
    inner.release().await.unwrap();
    b.try_read_lock("doc", &options)
        .await
        .expect("free after the last hold")
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writer_whose_re_entered_holds_were_all_released_downgrades() {
    let server = Standalone::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let write = a.try_write_lock("doc", &options).await.unwrap();
    write
        .reentry()
        .read()
        .await
        .expect("a writer may read")
        .release()
        .await
        .unwrap();
    // Only the write hold is left: it downgrades, and other readers enter beside it.
    downgrades_and_readers_enter(write, &b, &options).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_waiting_writer_withdraws_its_intent_at_once_when_cancelled_or_timed_out() {
    let server = Standalone::start();
    let (a, b) = (client(&server).await, client(&server).await);
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let read = a.try_read_lock("doc", &long).await.unwrap();

    let writer = b.clone();
    let waiting = tokio::spawn(async move {
        writer
            .write_lock("doc", &LockOptions::new().timeout(Duration::from_secs(60)))
            .await
    });
    eventually("the writer's intent", Duration::from_secs(5), || {
        has_intent(&server.node, "doc")
    })
    .await;
    let retry = busy(
        a.try_read_lock("doc", &long).await,
        "a new reader behind the intent",
    );
    assert!(
        retry > Duration::from_secs(5),
        "the intent's lease: {retry:?}"
    );

    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());
    let cancelled = Instant::now();
    eventually("the intent withdrawn", Duration::from_secs(2), || {
        !has_intent(&server.node, "doc")
    })
    .await;
    eprintln!(
        "intent withdrawn {:?} after the cancel",
        cancelled.elapsed()
    );
    a.try_read_lock("doc", &long)
        .await
        .expect("readers enter at once")
        .release()
        .await
        .unwrap();

    let err = b
        .write_lock(
            "doc",
            &LockOptions::new().timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err:?}");
    assert!(
        !has_intent(&server.node, "doc"),
        "withdrawn before the timeout returned"
    );
    a.try_read_lock("doc", &long)
        .await
        .expect("readers enter")
        .release()
        .await
        .unwrap();
    read.release().await.unwrap();
    assert!(common::alive_tasks() < 50);
}

fn script(name: &str) -> &'static str {
    fencelock::lua_scripts()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("script {name}"))
        .source
}

#[tokio::test(flavor = "multi_thread")]
async fn resent_acquire_reenter_and_release_scripts_change_nothing_twice() {
    let server = Standalone::start();
    let node = &server.node;
    let key = "k{t}:rw";
    let acquire = |name: &str, owner: &str| -> (i64, i64) {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script(name))
            .arg(1)
            .arg(key)
            .arg(owner)
            .arg(10_000)
            .arg(0)
            .arg("counter");
        if name == "rw_write" {
            cmd.arg("");
        } else {
            cmd.arg(fencelock::MAX_READERS);
        }
        let (status, value, _): (i64, i64, i64) = node.cmd(cmd.arg(""));
        (status, value)
    };
    let call = |name: &str, args: &[&str]| -> i64 {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script(name)).arg(1).arg(key).arg(args);
        match node.cmd::<redis::Value>(&mut cmd) {
            redis::Value::Int(code) => code,
            redis::Value::Array(items) => match items.first() {
                Some(redis::Value::Int(code)) => *code,
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    };
    let counter = || node.cmd::<i64>(redis::cmd("HGET").arg(key).arg("fence"));

    assert_eq!(acquire("rw_read", "ra"), (1, 1));
    assert_eq!(acquire("rw_read", "ra"), (2, 1), "resent read: same fence");
    assert_eq!(acquire("rw_read", "rb"), (1, 2));
    assert_eq!(acquire("rw_read", "ra"), (2, 1), "still its own fence");
    assert_eq!(counter(), 2, "the resend did not advance the counter");

    assert_eq!(call("rw_reenter", &["ra", "x", "10000", "r", ""]), 1);
    assert_eq!(call("rw_reenter", &["ra", "x", "10000", "r", ""]), 1);
    let count = || node.cmd::<i64>(redis::cmd("HGET").arg(key).arg("c:ra"));
    assert_eq!(count(), 2, "a resent re-entry adds no hold");
    assert_eq!(call("rw_release", &["ra", "x", "", ""]), 1);
    assert_eq!(call("rw_release", &["ra", "x", "", ""]), 1);
    assert_eq!(count(), 1, "a resent release counts once");
    assert_eq!(call("rw_release", &["ra", "", "", ""]), 1);
    assert_eq!(call("rw_release", &["rb", "", "", ""]), 1);
    assert_eq!(
        call("rw_release", &["rb", "", "", ""]),
        0,
        "gone: no second effect"
    );

    assert_eq!(acquire("rw_write", "w"), (1, 3));
    assert_eq!(acquire("rw_write", "w"), (2, 3), "resent write: same fence");
    assert_eq!(counter(), 3);
    let (status, _) = acquire("rw_read", "rc");
    assert_eq!(status, 0, "readers wait for the writer");
    assert_eq!(call("rw_release", &["w", "", "", ""]), 1);
    assert_eq!(call("rw_release", &["w", "", "", ""]), 0);
    let left: Vec<String> = node.cmd(redis::cmd("HKEYS").arg(key));
    assert_eq!(left, ["fence"], "only the counter is left");
}

#[tokio::test(flavor = "multi_thread")]
async fn at_maxmemory_holds_are_kept_and_released_and_acquire_says_memory_is_full() {
    let server = Standalone::start();
    let client = client(&server).await;
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let read = client.try_read_lock("r", &options).await.unwrap();
    let mut write = client.try_write_lock("w", &options).await.unwrap();
    let to_downgrade = client.try_write_lock("d", &options).await.unwrap();
    for (k, v) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        server
            .node
            .cmd::<()>(redis::cmd("CONFIG").arg("SET").arg(k).arg(v));
    }
    let err = client.try_read_lock("new", &options).await.unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    let err = client.try_write_lock("new", &options).await.unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    write
        .extend(Duration::from_secs(20))
        .await
        .expect("extend at maxmemory");
    let downgraded = to_downgrade
        .downgrade()
        .await
        .expect("downgrade at maxmemory");
    read.release().await.expect("release a read at maxmemory");
    write.release().await.expect("release a write at maxmemory");
    downgraded.release().await.expect("release at maxmemory");
    server
        .node
        .cmd::<()>(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_key_expiry_covers_every_live_reader_and_follows_the_last_release() {
    let server = Standalone::start();
    let client = Client::builder([server.url()])
        .expiry_grace(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    let node = &server.node;
    let long = client
        .try_read_lock("doc", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let short = client
        .try_read_lock("doc", &LockOptions::new().ttl(Duration::from_secs(2)))
        .await
        .unwrap();
    short.release().await.unwrap();
    let expiry = |node: &Node| node.cmd::<i64>(redis::cmd("PEXPIRETIME").arg(key("doc")));
    let now = i64::try_from(server_ms(node)).unwrap();
    assert!(
        expiry(node) >= now + 29_000,
        "a shorter reader's grant and release keep the longer reader's key: {} vs now {now}",
        expiry(node)
    );
    long.release().await.unwrap();
    let now = i64::try_from(server_ms(node)).unwrap();
    assert!(
        expiry(node) <= now + 1_100,
        "the last release lets the key go a grace after now: {} vs now {now}",
        expiry(node)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fences_stay_monotonic_across_a_forced_loss_failover() {
    let mut cluster = Cluster::start();
    let clock = Client::connect(cluster.urls()).await.unwrap();
    let epoch = Client::builder(cluster.urls())
        .fence_mode(FenceMode::Epoch)
        .connect()
        .await
        .unwrap();
    let options = LockOptions::new()
        .tag("acct")
        .timeout(Duration::from_secs(20));
    let confirmed = options.clone().wait_replicas(1, Duration::from_secs(2));
    for (client, name) in [(&clock, "clock"), (&epoch, "epoch")] {
        client
            .write_lock(name, &confirmed)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    let slot = clock.rwlock_keys("clock", &options).unwrap().slot();
    let master_port = cluster.master_of_slot(slot).port;
    let replica_port = cluster.replica_of(master_port).port;

    cluster.cut_off_replica(master_port, replica_port);
    let mut before = Vec::new();
    for (client, name) in [(&clock, "clock"), (&epoch, "epoch")] {
        let mut highest = FenceToken::new(1).unwrap();
        for _ in 0..4 {
            let read = client.read_lock(name, &options).await.unwrap();
            highest = highest.max(read.fence());
            read.release().await.unwrap();
            let write = client.write_lock(name, &options).await.unwrap();
            highest = highest.max(write.fence());
            write.release().await.unwrap();
        }
        before.push(highest);
    }

    cluster.take_over_with_lagging_replica(master_port, replica_port, slot);

    for ((client, name), highest) in [(&clock, "clock"), (&epoch, "epoch")]
        .into_iter()
        .zip(before)
    {
        let write = client
            .write_lock(name, &options)
            .await
            .expect("write after the failover");
        assert!(
            write.fence() > highest,
            "{name} mode: write {} after the failover must exceed {highest}",
            write.fence()
        );
        let fence = write.fence();
        write.release().await.unwrap();
        let read = client.read_lock(name, &options).await.expect("read after");
        assert!(read.fence() > fence);
        eprintln!("forced loss, {name} mode: {highest} before -> {fence} after");
        read.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_lock_refuses_new_readers_counting_them_once_until_one_goes() {
    let server = Standalone::start();
    let node = &server.node;
    let key = "full{t}:rw";
    // The cap is an argument of the script: 3 fields here (`MAX_READERS` for the client); the
    // hash's `fence` counts towards the fields, not towards the readers.
    let read = |owner: &str| -> (i64, i64, i64) {
        node.cmd(
            redis::cmd("EVAL")
                .arg(script("rw_read"))
                .arg(1)
                .arg(key)
                .arg(&[owner, "30000", "0", "clock", "3", "10000"]),
        )
    };
    let release = |owner: &str| -> i64 {
        node.cmd(
            redis::cmd("EVAL")
                .arg(script("rw_release"))
                .arg(1)
                .arg(key)
                .arg(&[owner, "", "", "10000"]),
        )
    };
    let marked = || node.cmd::<bool>(redis::cmd("HEXISTS").arg(key).arg("rs"));
    assert_eq!(read("ra").0, 1);
    assert_eq!(read("rb").0, 1);
    assert_eq!(read("rc").0, 1, "3 fields but 2 readers: granted");
    let refused = read("rd");
    assert_eq!(
        (refused.0, refused.2),
        (0, 3),
        "3 live readers: {refused:?}"
    );
    assert!(
        refused.1 > 0 && refused.1 <= 10_000,
        "at most a third of the TTL"
    );
    assert!(marked(), "the refusal marks the lock full");
    let again = read("re");
    assert_eq!(
        (again.0, again.2),
        (0, 3),
        "refused again while marked: {again:?}"
    );
    assert!(again.1 <= refused.1, "until the same first end");
    assert_eq!(release("rb"), 1);
    assert!(!marked(), "a reader that goes clears the mark");
    assert_eq!(read("rd").0, 1, "room again");
    for owner in ["ra", "rc", "rd"] {
        assert_eq!(release(owner), 1);
    }
    let left: Vec<String> = node.cmd(redis::cmd("HKEYS").arg(key));
    assert_eq!(left, ["fence"], "only the counter is left");
    let ttl: i64 = node.cmd(redis::cmd("PTTL").arg(key));
    assert!(ttl > 0, "the key expires as without the cap: {ttl}");
}
