//! The fair lock on real servers: arrival order, places that are kept alive while their call
//! waits and dropped when it ends or its client crashes, wake-ups of the head only, idempotent
//! scripts, maxmemory, and fences across a forced-loss failover.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{eventually, Cluster, Standalone};
use fencelock::{Client, Error, FenceToken, LockOptions};

/// The waiting places (`q:<owner>` fields) of the fair lock `name`, as owner tokens.
/// The owners of the places queued on fair lock `name`, sorted (a hash's field order is not
/// kept: a packed state longer than `hash-max-listpack-value`, 64 bytes, turns the hash into a
/// hashtable, whose order is arbitrary).
fn places(node: &common::Node, name: &str) -> Vec<String> {
    let fields: Vec<String> = node.cmd(redis::cmd("HKEYS").arg(fair_key(name)));
    let mut places: Vec<String> = fields
        .into_iter()
        .filter_map(|f| f.strip_prefix("q:").map(str::to_owned))
        .collect();
    places.sort();
    places
}

fn fair_key(name: &str) -> String {
    format!("fencelock:{{{name}}}:fair")
}

fn script(name: &str) -> fencelock::ScriptSource {
    fencelock::lua_scripts().find(|s| s.name == name).unwrap()
}

/// Runs the fair script `name` on `node` with `args` (the fair lock's key first).
fn run_script<T: redis::FromRedisValue>(
    node: &common::Node,
    name: &str,
    key: &str,
    args: &[&str],
) -> T {
    node.cmd(
        redis::cmd("EVAL")
            .arg(script(name).source)
            .arg(1)
            .arg(key)
            .arg(args),
    )
}

async fn connect(url: &str) -> Client {
    Client::connect([url.to_owned()]).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn grants_follow_arrival_order_across_five_clients_and_a_release_wakes_only_the_head() {
    let server = Standalone::start();
    let name = "order";
    let holder = connect(&server.url()).await;
    let guard = holder
        .try_fair_lock(name, &LockOptions::new())
        .await
        .unwrap();
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let client = connect(&server.url()).await;
        clients.push(client.clone());
        let granted = Arc::clone(&granted);
        tasks.push(tokio::spawn(async move {
            let options = LockOptions::new().timeout(Duration::from_secs(30));
            let guard = client.fair_lock(name, &options).await.unwrap();
            granted.lock().unwrap().push((i, guard.fence()));
            guard
        }));
        // Arrival order made certain: the next client starts once this one's place is in Redis.
        eventually("the place to be queued", Duration::from_secs(5), || {
            places(&server.node, name).len() == i + 1
        })
        .await;
    }
    for owner in places(&server.node, name) {
        let channel = format!("{}:w:{}", fair_key(name), &owner[..8]);
        eventually(
            "every waiter to subscribe to its client's channel",
            Duration::from_secs(5),
            || {
                let reply: Vec<redis::Value> = server
                    .node
                    .cmd(redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel));
                reply.get(1) == Some(&redis::Value::Int(1))
            },
        )
        .await;
    }
    let try_busy = holder.try_fair_lock(name, &LockOptions::new()).await;
    assert!(matches!(try_busy, Err(Error::Busy { .. })), "{try_busy:?}");
    guard.release().await.unwrap();
    let mut previous: Option<FenceToken> = None;
    for (i, task) in tasks.into_iter().enumerate() {
        let guard = task.await.unwrap();
        // Only this waiter has been woken; the ones behind it have not.
        for (j, client) in clients.iter().enumerate().skip(i + 1) {
            assert_eq!(
                client.stats().wakeups,
                0,
                "waiter {j} was woken by release {i}"
            );
        }
        assert_eq!(clients[i].stats().wakeups, 1, "waiter {i} woken once");
        assert!(previous.is_none_or(|p| guard.fence() > p));
        previous = Some(guard.fence());
        guard.release().await.unwrap();
    }
    let order: Vec<usize> = granted.lock().unwrap().iter().map(|(i, _)| *i).collect();
    assert_eq!(order, [0, 1, 2, 3, 4]);
    assert!(places(&server.node, name).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_waiter_drops_out_after_its_place_lease_and_does_not_stall_the_queue() {
    let server = Standalone::start();
    let name = "crash";
    let client = connect(&server.url()).await;
    let holder = client
        .try_fair_lock(name, &LockOptions::new())
        .await
        .unwrap();
    // A waiter that crashed: a place nobody renews, first in the queue (with its arrival index
    // entry, as a client writes it), lease 800 ms.
    let now_ms = {
        let time: (u64, u64) = server.node.cmd(&mut redis::cmd("TIME"));
        time.0 * 1000 + time.1 / 1000
    };
    let seq: i64 = server
        .node
        .cmd(redis::cmd("HINCRBY").arg(fair_key(name)).arg("qseq").arg(1));
    let dead_until = now_ms + 800;
    server.node.cmd::<()>(
        redis::cmd("HSET")
            .arg(fair_key(name))
            .arg("q:crashed")
            .arg(format!("{seq} {dead_until}"))
            .arg(format!("s:{seq}"))
            .arg("crashed"),
    );
    let waiter = connect(&server.url()).await;
    let task = tokio::spawn(async move {
        let options = LockOptions::new().timeout(Duration::from_secs(10));
        let guard = waiter.fair_lock(name, &options).await.unwrap();
        (Instant::now(), guard)
    });
    eventually(
        "the live waiter to be queued",
        Duration::from_secs(5),
        || places(&server.node, name).len() == 2,
    )
    .await;
    let released = Instant::now();
    holder.release().await.unwrap();
    // The release woke the dead head; the live waiter is granted when the dead place's lease ends.
    let (granted_at, guard) = task.await.unwrap();
    let waited = granted_at - released;
    assert!(waited < Duration::from_millis(2000), "stalled {waited:?}");
    let time: (u64, u64) = server.node.cmd(&mut redis::cmd("TIME"));
    assert!(
        time.0 * 1000 + time.1 / 1000 >= dead_until,
        "granted before the dead place's lease ended"
    );
    assert!(
        places(&server.node, name).is_empty(),
        "the dead place was deleted"
    );
    guard.release().await.unwrap();
    // A free lock with no live place is granted to a one-shot try at once.
    client
        .try_fair_lock(name, &LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_waiter_is_never_evicted_while_it_waits_longer_than_its_place_lease() {
    let server = Standalone::start();
    let name = "patient";
    let holder = connect(&server.url()).await;
    let watched = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .watchdog(true);
    let guard = holder.try_fair_lock(name, &watched).await.unwrap();
    let first = connect(&server.url()).await;
    let second = connect(&server.url()).await;
    // TTL 300 ms: places have a 300 ms lease, renewed by each client's watchdog.
    let options = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .timeout(Duration::from_secs(20));
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |client: Client, tag: &'static str| {
        let (options, order) = (options.clone(), Arc::clone(&order));
        tokio::spawn(async move {
            let guard = client.fair_lock(name, &options).await.unwrap();
            order.lock().unwrap().push(tag);
            guard.release().await.unwrap();
        })
    };
    let a = spawn(first.clone(), "first");
    eventually("first queued", Duration::from_secs(5), || {
        places(&server.node, name).len() == 1
    })
    .await;
    let b = spawn(second.clone(), "second");
    eventually("second queued", Duration::from_secs(5), || {
        places(&server.node, name).len() == 2
    })
    .await;
    let queued = places(&server.node, name);
    // Six place renewals each: two full place leases and more have passed.
    eventually("places renewed six times", Duration::from_secs(10), || {
        first.stats().renewals >= 6 && second.stats().renewals >= 6
    })
    .await;
    assert_eq!(
        places(&server.node, name),
        queued,
        "no live place was evicted"
    );
    assert_eq!(first.stats().lost + second.stats().lost, 0);
    guard.release().await.unwrap();
    a.await.unwrap();
    b.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["first", "second"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn cancelling_or_timing_out_a_wait_removes_its_place_at_once_and_wakes_the_next() {
    let server = Standalone::start();
    let name = "cancel";
    let holder = connect(&server.url()).await;
    let guard = holder
        .try_fair_lock(name, &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let waiter = connect(&server.url()).await;
    let task = {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.fair_lock(name, &LockOptions::new()).await })
    };
    eventually("the waiter to be queued", Duration::from_secs(5), || {
        places(&server.node, name).len() == 1
    })
    .await;
    let owner = places(&server.node, name).remove(0);
    let channel = format!("{}:w:{}", fair_key(name), &owner[..8]);
    eventually(
        "the waiter to subscribe to its client's channel",
        Duration::from_secs(5),
        || {
            let reply: Vec<redis::Value> = server
                .node
                .cmd(redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel));
            reply.get(1) == Some(&redis::Value::Int(1))
        },
    )
    .await;
    task.abort();
    let aborted = Instant::now();
    // The place lease is 3 s: "at once" means well before it.
    eventually(
        "the place to be withdrawn",
        Duration::from_millis(500),
        || {
            let exists: bool = server.node.cmd(
                redis::cmd("HEXISTS")
                    .arg(fair_key(name))
                    .arg(format!("q:{owner}")),
            );
            !exists
        },
    )
    .await;
    eprintln!("place withdrawn {:?} after the abort", aborted.elapsed());
    // The client keeps a channel subscribed 2 s after its last waiter left (a process that
    // waits again soon keeps it), then ends it.
    eventually("the subscription to end", Duration::from_secs(5), || {
        let reply: Vec<redis::Value> = server
            .node
            .cmd(redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel));
        reply.get(1) == Some(&redis::Value::Int(0))
    })
    .await;

    // A wait that times out gives its place up too.
    let err = waiter
        .fair_lock(
            name,
            &LockOptions::new().timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    eventually(
        "the timed-out place to be withdrawn",
        Duration::from_millis(500),
        || places(&server.node, name).is_empty(),
    )
    .await;

    // The head that withdraws hands the lock to the next: a hand-made head (never renewed, 30 s
    // lease) is granted the lock on the server when the blocker's withdrawal frees it (issue 25:
    // a fresh place is handed the lock); its own withdrawal, as a cancel that raced the grant,
    // gives the grant back and the waiter behind is granted.
    guard.release().await.unwrap();
    let blocker = common::grant_values(run_script(
        &server.node,
        "fair_acquire",
        &fair_key(name),
        &["blocker", "1000", "0", "clock", "30000", "256", "10000"],
    ));
    assert_eq!(blocker[0], 1, "free: granted to the hand-made owner");
    let queued: Vec<i64> = run_script(
        &server.node,
        "fair_acquire",
        &fair_key(name),
        &["head", "1000", "0", "clock", "30000", "256", "10000"],
    );
    assert_eq!((queued[0], queued[3]), (0, 1));
    let withdrawn: i64 = run_script(
        &server.node,
        "fair_withdraw",
        &fair_key(name),
        &["blocker", "p", "10000"],
    );
    assert_eq!(
        withdrawn, 1,
        "the grant of the withdrawn owner is given back"
    );
    let owner = server
        .node
        .lock_field(&fair_key(name), "owner")
        .unwrap_or_default();
    assert_eq!(
        owner, "head",
        "the freed lock was handed to the head's place"
    );
    let task = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .fair_lock(name, &LockOptions::new().timeout(Duration::from_secs(10)))
                .await
        })
    };
    eventually("the waiter behind the head", Duration::from_secs(5), || {
        places(&server.node, name).len() == 1
    })
    .await;
    let started = Instant::now();
    let withdrawn: i64 = run_script(
        &server.node,
        "fair_withdraw",
        &fair_key(name),
        &["head", "p", "10000"],
    );
    assert_eq!(withdrawn, 1);
    let guard = task.await.unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "woken, not timed out: {:?}",
        started.elapsed()
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn acquire_and_withdraw_scripts_are_idempotent_for_the_same_owner() {
    let server = Standalone::start();
    let name = "resend";
    let key = fair_key(name);
    let client = connect(&server.url()).await;
    let guard = client
        .try_fair_lock(name, &LockOptions::new())
        .await
        .unwrap();
    let args = ["me", "5000", "0", "clock", "30000", "256", "10000"];
    let first: Vec<i64> = run_script(&server.node, "fair_acquire", &key, &args);
    let place: String = server.node.cmd(redis::cmd("HGET").arg(&key).arg("q:me"));
    let again: Vec<i64> = run_script(&server.node, "fair_acquire", &key, &args);
    let place_again: String = server.node.cmd(redis::cmd("HGET").arg(&key).arg("q:me"));
    assert_eq!(
        (first[0], first[2], first[3]),
        (0, 0, 1),
        "queued first, nobody ahead"
    );
    assert_eq!(
        (again[0], again[2], again[3]),
        (0, 0, 0),
        "the same place, not a second one"
    );
    assert_eq!(
        place.split(' ').next(),
        place_again.split(' ').next(),
        "the arrival (seq) is kept"
    );
    let qseq: i64 = server.node.cmd(redis::cmd("HGET").arg(&key).arg("qseq"));
    assert_eq!(qseq, 1);
    // The release grants the head's (fresh) place on the server (issue 25); the head's next
    // acquire, and a resent one, answer that grant.
    guard.release().await.unwrap();
    let granted: Vec<i64> = run_script(&server.node, "fair_acquire", &key, &args);
    let resent: Vec<i64> = run_script(&server.node, "fair_acquire", &key, &args);
    assert_eq!(granted[0], 2, "granted by the release");
    assert_eq!(
        (resent[0], resent[1]),
        (2, granted[1]),
        "the same fence, not a new one"
    );
    let stored: i64 = server
        .node
        .lock_field(&key, "fence")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(stored, granted[1]);
    assert!(
        places(&server.node, name).is_empty(),
        "the place went with the grant"
    );
    let w1: i64 = run_script(&server.node, "fair_withdraw", &key, &["me", "", "10000"]);
    let w2: i64 = run_script(&server.node, "fair_withdraw", &key, &["me", "", "10000"]);
    assert_eq!((w1, w2), (1, 0));
    let owner = server.node.lock_field(&key, "owner");
    assert_eq!(owner, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn at_maxmemory_a_fair_lock_is_released_to_the_head_or_the_head_gives_up_its_place() {
    let server = Standalone::start();
    let name = "full";
    let client = connect(&server.url()).await;
    let mut guard = client
        .try_fair_lock(name, &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let waiter = connect(&server.url()).await;
    let task = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            waiter
                .fair_lock(name, &LockOptions::new().timeout(Duration::from_secs(10)))
                .await
        })
    };
    eventually("the waiter to be queued", Duration::from_secs(5), || {
        places(&server.node, name).len() == 1
    })
    .await;
    for (key, value) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        server
            .node
            .cmd::<()>(redis::cmd("CONFIG").arg("SET").arg(key).arg(value));
    }
    let err = client
        .try_fair_lock("other", &LockOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    guard
        .extend(Duration::from_secs(20))
        .await
        .expect("extend at maxmemory");
    let first = guard.fence();
    guard.release().await.expect("release at maxmemory");
    // The release (allowed at maxmemory: it adds no key) hands the lock to the head when its
    // place is fresh; when the place was not renewed in its last third, the head is only woken
    // and its own acquire is refused (OOM). Either way its place is gone.
    match task.await.unwrap() {
        Ok(handed) => {
            assert!(handed.fence() > first, "{handed:?}");
            handed
                .release()
                .await
                .expect("release of the handed lock at maxmemory");
        }
        Err(err) => assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}"),
    }
    eventually(
        "the place to be withdrawn at maxmemory",
        Duration::from_secs(2),
        || places(&server.node, name).is_empty(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_cluster_the_head_is_woken_and_fences_stay_monotonic_across_a_forced_loss() {
    let mut cluster = Cluster::start();
    let client = Client::connect(cluster.urls()).await.unwrap();
    let waiter = Client::connect(cluster.urls()).await.unwrap();
    let name = "acct";
    let options = LockOptions::new().timeout(Duration::from_secs(20));
    // The mutex of the same name is another key: both are held at once.
    let mutex = client.try_lock(name, &options).await.unwrap();
    let guard = client
        .try_fair_lock(
            name,
            &options.clone().wait_replicas(1, Duration::from_secs(2)),
        )
        .await
        .unwrap();
    assert_ne!(guard.keys().lock_key(), mutex.keys().lock_key());
    assert_eq!(guard.keys().slot(), mutex.keys().slot());
    mutex.release().await.unwrap();
    let slot = guard.keys().slot();
    let master_port = cluster.master_of_slot(slot).port;
    let task = {
        let (waiter, options) = (waiter.clone(), options.clone());
        tokio::spawn(async move { waiter.fair_lock(name, &options).await })
    };
    let master = cluster.master_of_slot(slot);
    eventually("the waiter to be queued", Duration::from_secs(5), || {
        places(master, name).len() == 1
    })
    .await;
    let channel = format!("{}:w:{}", fair_key(name), &places(master, name)[0][..8]);
    eventually(
        "the waiter to subscribe to its client's channel",
        Duration::from_secs(5),
        || {
            let reply: Vec<redis::Value> =
                master.cmd(redis::cmd("PUBSUB").arg("SHARDNUMSUB").arg(&channel));
            reply.get(1) == Some(&redis::Value::Int(1))
        },
    )
    .await;
    let spublished = || master.calls("spublish");
    let before_release = spublished();
    let released = Instant::now();
    guard.release().await.unwrap();
    let handed = task.await.unwrap().unwrap();
    eprintln!("cluster handoff {:?}", released.elapsed());
    assert_eq!(
        spublished() - before_release,
        1,
        "the release announced on the head's own channel, once"
    );
    // Woken by that message, unless the waiter's re-check attempt (every 250 ms) was already
    // on its way when the release landed and took the grant first (seen once in a CI run).
    assert!(waiter.stats().wakeups <= 1, "{:?}", waiter.stats());
    let mut before = handed.fence();
    handed.release().await.unwrap();

    let replica_port = cluster.replica_of(master_port).port;
    cluster.cut_off_replica(master_port, replica_port);
    for _ in 0..8 {
        let guard = client.fair_lock(name, &options).await.unwrap();
        assert!(guard.fence() > before);
        before = guard.fence();
        guard.release().await.unwrap();
    }
    cluster.take_over_with_lagging_replica(master_port, replica_port, slot);
    let after = client
        .fair_lock(name, &options)
        .await
        .expect("fair lock after failover");
    assert!(
        after.fence() > before,
        "{} after failover must exceed {before} granted before",
        after.fence()
    );
    after.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_caller_that_finds_the_queue_full_gets_no_place_and_those_queued_keep_theirs() {
    let server = Standalone::start();
    let name = "capped";
    let key = fair_key(name);
    // The cap is an argument of the script: 2 places here (`MAX_FAIR_WAITERS` for the client).
    let acquire = |owner: &str| -> Vec<i64> {
        common::grant_values(run_script(
            &server.node,
            "fair_acquire",
            &key,
            &[owner, "5000", "0", "clock", "3000", "2", "10000"],
        ))
    };
    assert_eq!(acquire("holder")[0], 1, "free: granted");
    let a = acquire("a");
    let b = acquire("b");
    assert_eq!(
        (a[0], a[3], b[0], b[2], b[3]),
        (0, 1, 0, 1, 1),
        "{a:?} {b:?}"
    );
    let full = acquire("c");
    assert_eq!(
        (full[0], full[2], full[3]),
        (0, 2, -1),
        "no place: {full:?}"
    );
    assert!(
        full[1] > 0 && full[1] <= 1000,
        "tries again within a third of its place lease"
    );
    let sorted = || {
        let mut places = places(&server.node, name);
        places.sort();
        places
    };
    assert_eq!(sorted(), ["a", "b"], "no third place");
    let again = acquire("a");
    assert_eq!(
        (again[0], again[2], again[3]),
        (0, 0, 0),
        "a queued caller keeps its place"
    );
    let withdrawn: i64 = run_script(&server.node, "fair_withdraw", &key, &["a", "", "10000"]);
    assert_eq!(withdrawn, 1);
    let queued = acquire("c");
    // Places ahead from the index's first entry: a busy call on a held lock does not walk the
    // queue, so a's withdrawn entry counts until a release walks past it.
    assert_eq!(
        (queued[0], queued[2], queued[3]),
        (0, 2, 1),
        "room again: queued behind b"
    );
    assert_eq!(sorted(), ["b", "c"]);
    // A place withdrawn behind the head stops counting at once (the head, b, still waits).
    let withdrawn: i64 = run_script(&server.node, "fair_withdraw", &key, &["c", "", "10000"]);
    assert_eq!(withdrawn, 1);
    let queued = acquire("d");
    assert_eq!(
        (queued[0], queued[3]),
        (0, 1),
        "room again behind the head: {queued:?}"
    );
    assert_eq!(sorted(), ["b", "d"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_keeps_the_lock_marked_queued_for_a_place_without_an_index_entry() {
    let server = Standalone::start();
    let key = fair_key("unindexed");
    let acquire = |owner: &str, place: &str| -> Vec<i64> {
        common::grant_values(run_script(
            &server.node,
            "fair_acquire",
            &key,
            &[owner, "30000", "0", "clock", place, "128", "10000"],
        ))
    };
    assert_eq!(acquire("holder", "0")[0], 1, "free: granted");
    assert_eq!(acquire("w", "30000")[3], 1, "queued, the lock marked");
    let withdrawn: i64 = run_script(&server.node, "fair_withdraw", &key, &["w", "", "10000"]);
    assert_eq!(withdrawn, 1);
    // A place as a client before the arrival index wrote it: no `s:` entry.
    let now_ms = {
        let time: (u64, u64) = server.node.cmd(&mut redis::cmd("TIME"));
        time.0 * 1000 + time.1 / 1000
    };
    let seq: i64 = server
        .node
        .cmd(redis::cmd("HINCRBY").arg(&key).arg("qseq").arg(1));
    server.node.cmd::<()>(
        redis::cmd("HSET")
            .arg(&key)
            .arg("q:old")
            .arg(format!("{seq} {}", now_ms + 30_000))
            .arg("g:old")
            .arg("30000 30000 0 clock"),
    );
    let released: i64 = run_script(
        &server.node,
        "fair_release",
        &key,
        &["holder", "", "", "10000"],
    );
    assert_eq!(released, 1);
    let state: String = server.node.cmd(redis::cmd("HGET").arg(&key).arg("until"));
    assert!(
        state.starts_with("0 ") && state.ends_with(" wq"),
        "free and still marked queued for the unindexed place: {state:?}"
    );
}

/// A busy call on a held lock walks the queue's index only when it spans more than the 64
/// entries the holder's release walks: a short index is left to the release (which reaches its
/// head), a long one is walked, so that places withdrawn during a hold cannot pile up past the
/// release's reach.
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_call_walks_a_held_locks_index_only_beyond_a_releases_reach() {
    let server = Standalone::start();
    let acquire = |key: &str, owner: &str| -> Vec<i64> {
        common::grant_values(run_script(
            &server.node,
            "fair_acquire",
            key,
            &[owner, "5000", "0", "clock", "3000", "128", "10000"],
        ))
    };
    let qh = |key: &str| -> Option<i64> { server.node.cmd(redis::cmd("HGET").arg(key).arg("qh")) };
    for (name, gone, walked) in [("short", 10, false), ("long", 70, true)] {
        let key = fair_key(name);
        assert_eq!(acquire(&key, "holder")[0], 1, "{name}: free, granted");
        // `gone` places queued, then withdrawn (their index entries stay until a walk).
        for i in 0..gone {
            let owner = format!("gone{i}");
            assert_eq!(acquire(&key, &owner)[3], 1, "{name}: {owner} queued");
            let withdrawn: i64 =
                run_script(&server.node, "fair_withdraw", &key, &[&owner, "", "10000"]);
            assert_eq!(withdrawn, 1);
        }
        let busy = acquire(&key, "late");
        assert_eq!(
            (busy[0], busy[3]),
            (0, 1),
            "{name}: queued behind the holder"
        );
        if walked {
            assert_eq!(qh(&key), Some(65), "{name}: one walk of 64 entries");
        } else {
            assert_eq!(qh(&key), None, "{name}: not walked");
        }
        // Either way the holder's release reaches the late place and grants it.
        let released: i64 = run_script(
            &server.node,
            "fair_release",
            &key,
            &["holder", "", "p", "10000"],
        );
        assert_eq!(released, 1);
        let owner: String = server.node.cmd(redis::cmd("HGET").arg(&key).arg("until"));
        assert!(owner.ends_with(" late"), "{name}: handed to late: {owner}");
    }
}
