//! Per-node auto-batching on real servers: concurrent calls for keys of one node go out as one
//! script call, each caller gets its own reply (grants, busy answers, errors), a key whose slot
//! moved away falls back to a call of its own, a caller cancelled before its call was answered
//! leaves nothing held (also past the driver on a cluster whose nodes load the module), epoch
//! mode reads the node's epoch once per batch, each key of a batch call runs with its own
//! arguments, and an idle driver ends (the next call starts another).

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, Cluster, Node, Standalone};
use fencelock::{Client, Error, FenceMode, LockOptions, ModuleUse};
use tokio::sync::Barrier;

/// `count` tasks call `try_lock` on `names` at once (after a barrier); returns their results.
/// The mutex keys on `node` that have an owner.
fn held_locks(node: &Node) -> HashSet<String> {
    let keys: Vec<String> = node.cmd(redis::cmd("KEYS").arg("fencelock:*"));
    keys.into_iter()
        .filter(|key| node.lock_field(key, "owner").is_some())
        .collect()
}

async fn lock_at_once(
    client: &Client,
    names: &[String],
    options: &LockOptions,
) -> Vec<fencelock::Result<fencelock::LockGuard>> {
    let barrier = Arc::new(Barrier::new(names.len()));
    let mut tasks = Vec::new();
    for name in names {
        let (client, options, barrier, name) = (
            client.clone(),
            options.clone(),
            Arc::clone(&barrier),
            name.clone(),
        );
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            client.try_lock(&name, &options).await
        }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap());
    }
    results
}

/// 300 tasks at once each call `try_lock` on a name of its own (`<prefix>:<i>`), cut after
/// 0 to 3 ms (a different time each, the first at its first poll); returns the guards of the
/// calls granted before their cut.
async fn acquires_cut_short(
    client: &Client,
    prefix: &str,
    options: &LockOptions,
) -> Vec<fencelock::LockGuard> {
    let mut tasks = Vec::new();
    for i in 0..300u64 {
        let (client, options) = (client.clone(), options.clone());
        let name = format!("{prefix}:{i}");
        tasks.push(tokio::spawn(async move {
            let cut = Duration::from_micros((i * 7919) % 3000);
            tokio::time::timeout(cut, client.try_lock(&name, &options))
                .await
                .ok()
        }));
    }
    let mut kept = Vec::new();
    for task in tasks {
        if let Some(Ok(guard)) = task.await.unwrap() {
            kept.push(guard);
        }
    }
    kept
}

/// A cluster client reads its slot map in the background after its first call and batches
/// from then on: takes locks concurrently until it has sent a batch.
async fn warm_up(client: &Client, options: &LockOptions) {
    let warm: Vec<String> = (0..20).map(|i| format!("warm:{i}")).collect();
    for _ in 0..100 {
        for result in lock_at_once(client, &warm, options).await {
            result.unwrap().release().await.unwrap();
        }
        if client.stats().batches > 0 {
            return;
        }
    }
    panic!("the client never batched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_calls_go_as_batches_and_each_caller_gets_its_own_reply() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    // One name is a string key: its caller alone gets Redis's WRONGTYPE error.
    server
        .node
        .cmd::<()>(redis::cmd("SET").arg("fencelock:{wrong}:lock").arg("x"));
    let held = client.try_lock("held", &options).await.unwrap();
    let mut names: Vec<String> = (0..200).map(|i| format!("batch:{i}")).collect();
    names.push("held".into());
    names.push("wrong".into());

    let calls_before = server.node.calls("evalsha");
    let results = lock_at_once(&client, &names, &options).await;
    let calls = server.node.calls("evalsha") - calls_before;

    let mut guards = Vec::new();
    for (name, result) in names.iter().zip(results) {
        match name.as_str() {
            "held" => assert!(matches!(result, Err(Error::Busy { .. })), "{result:?}"),
            "wrong" => {
                let err = result.unwrap_err();
                assert!(err.to_string().contains("WRONGTYPE"), "{err}");
                assert!(err.to_string().contains("another key prefix"), "{err}");
                assert!(err.to_string().contains("wrong"), "names the lock: {err}");
            }
            _ => {
                let guard = result.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(guard.name(), name);
                let owner = server
                    .node
                    .lock_field(&format!("fencelock:{{{name}}}:lock"), "owner")
                    .unwrap_or_default();
                assert_eq!(owner.len(), 32, "{name} is held in Redis");
                guards.push(guard);
            }
        }
    }
    let stats = client.stats();
    assert!(stats.batches > 0, "{stats:?}");
    assert!(
        calls < names.len() as u64,
        "{calls} script calls for {} acquires",
        names.len()
    );

    let releases: Vec<_> = guards
        .into_iter()
        .map(|guard| tokio::spawn(guard.release()))
        .collect();
    for release in releases {
        release.await.unwrap().expect("release");
    }
    held.release().await.unwrap();
    let keys: Vec<String> = server.node.cmd(redis::cmd("KEYS").arg("fencelock:*"));
    for key in keys.iter().filter(|k| !k.contains("wrong")) {
        let owner = server.node.lock_field(key, "owner");
        assert_eq!(owner, None, "{key} released");
    }
    assert!(
        client.stats().batches > stats.batches,
        "releases batched too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_batching_off_every_call_goes_alone() {
    let server = Standalone::start();
    let client = Client::builder([server.url()])
        .batching(false)
        .connect()
        .await
        .unwrap();
    let names: Vec<String> = (0..50).map(|i| format!("alone:{i}")).collect();
    let calls_before = server.node.calls("evalsha");
    let results = lock_at_once(&client, &names, &LockOptions::new()).await;
    assert_eq!(server.node.calls("evalsha") - calls_before, 50);
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(client.stats().batches, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_callers_leave_nothing_held() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(60));
    // 300 acquires; each is cancelled after a random short time, some before their call was
    // sent, some while their batch is in flight, some after the grant reached them.
    let kept = acquires_cut_short(&client, "cancel", &options).await;
    let kept_names: HashSet<String> = kept.iter().map(|g| g.name().to_owned()).collect();
    let held_now = || held_locks(&server.node).len();
    // Every cancelled call's undo, and the release of every guard its caller dropped, has been
    // answered: no call of this client is still on its way to change what is held.
    client.shutdown().await.unwrap();
    assert_eq!(
        held_now(),
        kept_names.len(),
        "only the locks whose callers got their guard stay held"
    );
    for guard in kept {
        guard.release().await.unwrap();
    }
    assert_eq!(held_now(), 0);
}

/// A lone task's calls go out past the driver (`direct.rs`); cut at every stage (before the
/// call left, while it was in flight, after the grant reached the caller), none leaves a lock
/// held: a cut call runs on in the background and its undo follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_tasks_cancelled_calls_leave_nothing_held() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(60));
    let mut kept = Vec::new();
    for i in 0..200u64 {
        let name = format!("lone-cancel:{i}");
        // Every 50th call is left to finish; the first is cut at its first poll.
        let cut = match i % 50 {
            49 => Duration::from_secs(10),
            _ => Duration::from_micros((i * 7919) % 2000),
        };
        if let Ok(Ok(guard)) = tokio::time::timeout(cut, client.try_lock(&name, &options)).await {
            kept.push(guard);
        }
    }
    client.shutdown().await.unwrap();
    let held = held_locks(&server.node);
    let kept_keys: HashSet<String> = kept
        .iter()
        .map(|guard| format!("fencelock:{{{}}}:lock", guard.name()))
        .collect();
    assert_eq!(
        held, kept_keys,
        "only the locks whose caller got its guard stay held"
    );
    assert!(
        kept.len() >= 4 && kept.len() < 200,
        "the calls left to finish hold their locks, the first call was cut: {} kept",
        kept.len()
    );
}

/// On a cluster whose nodes load the module, a call goes past its driver when its slot's
/// bucket of the lane is quiet (`direct.rs`), the others through the driver; cut at every stage
/// (before the call left, while in flight, after the grant), none leaves a lock held: a cut
/// direct call runs on in the background, and an undo waits for its bucket's direct calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_with_the_module_cancelled_callers_leave_nothing_held() {
    let cluster = Cluster::start_with_module();
    let client = Client::builder(cluster.urls())
        .module(ModuleUse::Required)
        .connect()
        .await
        .unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(60));
    // Until the client has read its slot map (after its first call), its calls go on their own:
    // calls of one slot at once go as one batched module command once it has.
    let pinned = options.clone().slot(42);
    for attempt in 0.. {
        assert!(attempt < 100, "the client never batched");
        let names: Vec<String> = (0..20).map(|i| format!("warm:{attempt}:{i}")).collect();
        for result in lock_at_once(&client, &names, &pinned).await {
            result.unwrap().release().await.unwrap();
        }
        if client.stats().batches > 0 {
            break;
        }
    }
    // 300 acquires at once, on names of their own (so mostly quiet buckets, some shared), each
    // cut after a different short time.
    let kept = acquires_cut_short(&client, "bucket-cancel", &options).await;
    client.shutdown().await.unwrap();
    let mut held = HashSet::new();
    for node in &cluster.nodes {
        let keys: Vec<String> = node.cmd(redis::cmd("KEYS").arg("fencelock:*bucket-cancel*"));
        for key in keys {
            let master = cluster.master_of_slot(fencelock::slot_of(key.as_bytes()));
            if master.lock_field(&key, "owner").is_some() {
                held.insert(key);
            }
        }
    }
    let kept_keys: HashSet<String> = kept
        .iter()
        .map(|guard| format!("fencelock:{{{}}}:lock", guard.name()))
        .collect();
    assert_eq!(
        held, kept_keys,
        "only the locks whose callers got their guard stay held"
    );
    assert!(
        kept.len() < 300,
        "some calls were cut before their grant: {} kept",
        kept.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_whose_slot_moved_after_the_map_was_read_falls_back_to_a_call_of_its_own() {
    let cluster = Cluster::start();
    let client = Client::connect(cluster.urls()).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let source = cluster.master_of_slot(100).port;
    let target = cluster.master_of_slot(10_000).port;
    assert_ne!(source, target);
    // Slots 100..110 and 200..210 are on the same master; read the client's slot map by
    // batching once.
    let on = |slot: u16, i: usize| (format!("n{i}"), options.clone().slot(slot));
    warm_up(&client, &options).await;
    cluster.migrate_slot(100, source, target, || {});

    let barrier = Arc::new(Barrier::new(40));
    let mut tasks = Vec::new();
    for i in 0..40 {
        let (name, opts) = if i % 2 == 0 { on(100, i) } else { on(200, i) };
        let (client, barrier) = (client.clone(), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            client.try_lock(&name, &opts).await
        }));
    }
    let mut granted = 0;
    for task in tasks {
        let guard = task.await.unwrap().expect("granted through the fallback");
        guard.release().await.unwrap();
        granted += 1;
    }
    assert_eq!(granted, 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn epoch_mode_reads_the_epoch_once_per_batch() {
    let cluster = Cluster::start();
    let client = Client::builder(cluster.urls())
        .fence_mode(FenceMode::Epoch)
        .connect()
        .await
        .unwrap();
    let master = cluster.master_of_slot(0);
    let options = LockOptions::new().ttl(Duration::from_secs(30)).slot(0);
    let info_calls = || master.calls("cluster|info");
    warm_up(&client, &options).await;
    let names: Vec<String> = (0..200).map(|i| format!("epoch:{i}")).collect();
    let before = info_calls();
    let results = lock_at_once(&client, &names, &options).await;
    let reads = info_calls() - before;
    for result in results {
        let guard = result.unwrap();
        assert!(guard.fence().get() > 1 << 32, "an epoch fence");
    }
    assert!(reads < 200, "{reads} CLUSTER INFO reads for 200 grants");
}

/// The keys of one batch call share the script's once-per-call code (the server's time, the
/// helper functions) but each runs with its own arguments: here each key's expiry grace (none
/// keeps the key for good), set for one key after another in one call.
#[test]
fn each_key_of_a_batch_call_keeps_its_own_expiry_grace() {
    let server = Standalone::start();
    let batch = fencelock::lua_scripts()
        .find(|script| script.name == "acquire_batch")
        .expect("the acquire batch script");
    let keys = [
        ("fencelock:{a}:lock", "60000"),
        ("fencelock:{b}:lock", ""),
        ("fencelock:{c}:lock", "1000"),
    ];
    let mut call = redis::cmd("EVAL");
    call.arg(batch.source).arg(1).arg(keys[0].0);
    for (key, grace) in keys {
        // key, argument count, then acquire's arguments: owner, TTL ms, floor, mode, grace.
        call.arg(key)
            .arg(5)
            .arg("0123456789abcdef")
            .arg(10_000)
            .arg(0)
            .arg("clock")
            .arg(grace);
    }
    let replies: Vec<redis::Value> = server.node.cmd(&mut call);
    let replies: Vec<Vec<i64>> = replies.into_iter().map(common::grant_values).collect();
    assert_eq!(replies.len(), 3);
    assert!(replies.iter().all(|reply| reply[0] == 1), "{replies:?}");
    let pttl = |key: &str| -> i64 { server.node.cmd(redis::cmd("PTTL").arg(key)) };
    let a = pttl(keys[0].0);
    assert!(a > 60_000 && a <= 70_000, "lease + 60 s grace, got {a} ms");
    assert_eq!(pttl(keys[1].0), -1, "no grace: kept for good");
    let c = pttl(keys[2].0);
    assert!(c > 1_000 && c <= 11_000, "lease + 1 s grace, got {c} ms");
}

#[test]
fn a_batch_entry_does_not_take_an_earlier_entrys_clock_grant_for_its_own() {
    let server = Standalone::start();
    let batch = fencelock::lua_scripts()
        .find(|script| script.name == "acquire_batch")
        .expect("the acquire batch script");
    let owner = "0123456789abcdef";
    let (fresh, held) = ("fencelock:{fresh}:lock", "fencelock:{held}:lock");
    // `held` is already this owner's, its stored fence 100 s ahead of the clock (a later
    // epoch's, or a clock that was ahead); its key expires with its lease.
    let time: (i64, i64) = server.node.cmd(&mut redis::cmd("TIME"));
    let now = time.0 * 1000 + time.1 / 1000;
    let state = format!("{} {} {owner}", now + 10_000, (now + 100_000) * 1000);
    server
        .node
        .cmd::<()>(redis::cmd("HSET").arg(held).arg("until").arg(state));
    server
        .node
        .cmd::<()>(redis::cmd("PEXPIREAT").arg(held).arg(now + 12_000));
    // One call: a clock grant of `fresh`, then the resend on `held`.
    let mut call = redis::cmd("EVAL");
    call.arg(batch.source).arg(1).arg(fresh);
    for key in [fresh, held] {
        call.arg(key)
            .arg(5)
            .arg(owner)
            .arg(10_000)
            .arg(0)
            .arg("clock")
            .arg(2_000);
    }
    let replies: Vec<redis::Value> = server.node.cmd(&mut call);
    assert_eq!(replies.len(), 2);
    // The resend moves the lease and keeps the key for the lease and the grace, as alone; the
    // first entry's grant must not make it keep the key until the fence's time (about 102 s).
    let pttl: i64 = server.node.cmd(redis::cmd("PTTL").arg(held));
    assert!(pttl > 10_000 && pttl <= 12_100, "{pttl} ms");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_drivers_end_and_later_calls_still_go_through() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();
    // The connection's own tasks stay (connect's probe may leave one that ends a little later,
    // so this count is an upper bound of what stays).
    let baseline = metrics.num_alive_tasks();
    for round in 0..3 {
        // A burst of calls starts the lane's driver (a lone call goes past it: `direct.rs`);
        // the driver ends 0.5 s after its last call, and the next burst starts another. A
        // driver that never ended would keep the count above the baseline.
        let names: Vec<String> = (0..16).map(|i| format!("idle:{round}:{i}")).collect();
        for result in lock_at_once(&client, &names, &LockOptions::new()).await {
            result.unwrap().release().await.unwrap();
        }
        eventually(
            &format!("round {round}'s driver to end"),
            Duration::from_secs(5),
            || metrics.num_alive_tasks() <= baseline,
        )
        .await;
    }
}
