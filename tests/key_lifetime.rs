//! How long a lock's key lives, and that fences never go backwards when it is gone.

mod common;

use std::time::{Duration, Instant};

use common::{wait_until, Cluster, Node, Standalone};
use fencelock::{Client, FenceMode, LockOptions};

fn masters(cluster: &Cluster) -> Vec<&Node> {
    cluster
        .nodes
        .iter()
        .filter(|n| n.info("replication").contains("role:master"))
        .collect()
}

fn dbsize(node: &Node) -> i64 {
    node.cmd(&mut redis::cmd("DBSIZE"))
}

/// PTTL of `key`: -2 gone, -1 no expiry, else ms left.
fn pttl(node: &Node, key: &str) -> i64 {
    node.cmd(redis::cmd("PTTL").arg(key))
}

#[tokio::test(flavor = "multi_thread")]
async fn clock_mode_keys_of_released_and_abandoned_locks_are_gone_after_lease_and_grace() {
    let cluster = Cluster::start();
    let grace = Duration::from_millis(300);
    let client = Client::builder(cluster.urls())
        .expiry_grace(grace)
        .connect()
        .await
        .unwrap();
    // Long enough that the releases below find every lease live even on a loaded machine
    // (300 grants taken one by one once took longer than a 400 ms lease in CI).
    let ttl = Duration::from_millis(1500);
    let options = LockOptions::new().ttl(ttl);
    let started = Instant::now();
    let mut guards = Vec::new();
    for i in 0..300 {
        guards.push(
            client
                .try_lock(&format!("order:{i}"), &options)
                .await
                .unwrap(),
        );
    }
    let masters = masters(&cluster);
    let total: i64 = masters.iter().map(|m| dbsize(m)).sum();
    assert_eq!(total, 300, "one key per lock");
    assert!(
        masters.iter().all(|m| dbsize(m) > 0),
        "the names spread over every master"
    );
    let key = guards[0].keys().lock_key().to_owned();
    let left = pttl(cluster.master_of_slot(guards[0].keys().slot()), &key);
    assert!(
        left > 0 && left <= (ttl + grace).as_millis() as i64,
        "a held lock's key expires after lease end + grace: {left} ms"
    );
    // Half are released, half abandoned while held (a crashed holder: no release at all).
    let abandoned = guards.split_off(150);
    for guard in guards {
        guard.release().await.unwrap();
    }
    for guard in abandoned {
        std::mem::forget(guard);
    }
    let bound = ttl + grace + Duration::from_secs(3);
    wait_until("every lock key to expire", bound, || {
        masters.iter().all(|m| dbsize(m) == 0)
    });
    println!(
        "300 lock keys (lease {ttl:?}, grace {grace:?}) gone from every master {:?} after the grants",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fences_keep_rising_across_key_expiry() {
    let server = Standalone::start();
    let client = Client::builder([server.url()])
        .expiry_grace(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let options = LockOptions::new().ttl(Duration::from_millis(100));
    let key = "fencelock:{job}:lock";
    let mut last = None;
    for round in 0..5 {
        let guard = client.try_lock("job", &options).await.unwrap();
        if let Some(last) = last {
            assert!(
                guard.fence() > last,
                "round {round}: {} <= {last}",
                guard.fence()
            );
        }
        last = Some(guard.fence());
        if round % 2 == 0 {
            guard.release().await.unwrap();
        } else {
            std::mem::forget(guard); // abandoned: the lease runs out, then the key expires
        }
        wait_until("the lock key to expire", Duration::from_secs(5), || {
            pttl(&server.node, key) == -2
        });
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn counter_and_epoch_modes_keep_their_keys() {
    let cluster = Cluster::start();
    for mode in [FenceMode::Counter, FenceMode::Epoch] {
        let client = Client::builder(cluster.urls())
            .fence_mode(mode)
            .connect()
            .await
            .unwrap();
        let name = format!("kept-{mode:?}");
        let guard = client.try_lock(&name, &LockOptions::new()).await.unwrap();
        let key = guard.keys().lock_key().to_owned();
        let master = cluster.master_of_slot(guard.keys().slot());
        assert_eq!(pttl(master, &key), -1, "{mode:?}: no expiry while held");
        guard.release().await.unwrap();
        assert_eq!(pttl(master, &key), -1, "{mode:?}: no expiry after release");
    }
    // A key a clock-mode client left with an expiry is kept for good once a counter-mode client
    // writes it (mixing modes on one lock must not let its only fence record expire).
    let clock = Client::connect(cluster.urls()).await.unwrap();
    let counter = Client::builder(cluster.urls())
        .fence_mode(FenceMode::Counter)
        .connect()
        .await
        .unwrap();
    let first = clock.try_lock("mixed", &LockOptions::new()).await.unwrap();
    let master = cluster.master_of_slot(first.keys().slot());
    let key = first.keys().lock_key().to_owned();
    assert!(pttl(master, &key) > 0);
    let fence = first.fence();
    first.release().await.unwrap();
    let second = counter
        .try_lock("mixed", &LockOptions::new())
        .await
        .unwrap();
    assert!(second.fence() > fence);
    assert_eq!(pttl(master, &key), -1);
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_clock_behind_the_stored_fence_is_reported() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let guard = client.try_lock("skew", &options).await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(client.stats().clock_behind, 0);
    // As if an earlier grant came from a node whose clock ran 5 s ahead of this one.
    let now: Vec<u64> = server.node.cmd(&mut redis::cmd("TIME"));
    let ahead = now[0] * 1_000_000 + now[1] + 5_000_000;
    let key = "fencelock:{skew}:lock";
    server.node.set_lock_field(key, "fence", &ahead.to_string());
    let guard = client.try_lock("skew", &options).await.unwrap();
    assert!(guard.fence().get() > ahead, "still above the stored fence");
    let stats = client.stats();
    assert_eq!(stats.clock_behind, 1);
    assert!(
        (4_000_000..=5_000_000).contains(&stats.clock_behind_max_us),
        "behind by {} µs",
        stats.clock_behind_max_us
    );
    // The key lives until the clock has passed the fence by the grace.
    let left = pttl(&server.node, key);
    assert!(
        left > 5_000 + 9_000,
        "the key outlives the fence read as ms plus the 10 s grace: {left} ms"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn epoch_mode_reports_an_unreadable_epoch_instead_of_using_zero() {
    // On a standalone server CLUSTER INFO fails inside the script; the client never sends
    // `epoch` there (it is a counter on standalone), but the script must not read that as 0.
    let server = Standalone::start();
    let acquire = fencelock::lua_scripts()
        .find(|s| s.name == "acquire")
        .unwrap();
    let key = "k{epoch}:lock";
    let err = server
        .node
        .try_cmd::<redis::Value>(
            redis::cmd("EVAL")
                .arg(acquire.source)
                .arg(1)
                .arg(key)
                .arg("owner")
                .arg(1000)
                .arg(0)
                .arg("epoch")
                .arg(""),
        )
        .unwrap_err();
    assert!(err.to_string().contains("cluster_my_epoch"), "{err}");
    assert_eq!(server.node.cmd::<i64>(redis::cmd("EXISTS").arg(key)), 0);

    let client = Client::builder([server.url()])
        .fence_mode(FenceMode::Epoch)
        .connect()
        .await
        .unwrap();
    let guard = client.try_lock("e", &LockOptions::new()).await.unwrap();
    assert_eq!(guard.fence().get(), 1, "a counter on standalone");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn epoch_mode_after_key_loss_restarts_at_the_epoch_floor_as_documented() {
    // docs/safety.md: epoch mode resumes above earlier tokens after a failover (a new epoch);
    // a key lost without one (DEL by hand, a master restarted empty that keeps its role)
    // restarts the lock's fences at epoch x 2^32 + 1. This pins that statement.
    let cluster = Cluster::start();
    let client = Client::builder(cluster.urls())
        .fence_mode(FenceMode::Epoch)
        .connect()
        .await
        .unwrap();
    let options = LockOptions::new();
    let mut fences = Vec::new();
    for _ in 0..3 {
        let guard = client.try_lock("lost", &options).await.unwrap();
        fences.push(guard.fence().get());
        guard.release().await.unwrap();
    }
    let keys = client.keys("lost", &options).unwrap();
    let master = cluster.master_of_slot(keys.slot());
    let _: i64 = master.cmd(redis::cmd("DEL").arg(keys.lock_key()));
    let guard = client.try_lock("lost", &options).await.unwrap();
    assert_eq!(
        guard.fence().get(),
        fences[0],
        "restarts at the epoch floor"
    );
    assert_eq!(fences[0] % (1 << 32), 1);
    guard.release().await.unwrap();
}
