//! Holding on a real cluster: the watchdog, loss detection, batched renewal and re-entry; and
//! on a standalone server: how the watchdog behaves when renewals fail.

mod common;

use std::time::{Duration, Instant};

use common::{alive_tasks, eventually, Cluster, Standalone};
use fencelock::{Client, Error, LockGuard, LockOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_watchdog_keeps_a_lock_past_its_ttl_and_reports_losses() {
    let cluster = Cluster::start();
    let holder = Client::connect(cluster.urls()).await.unwrap();
    let other = Client::connect(cluster.urls()).await.unwrap();
    let ttl = Duration::from_millis(600);
    let watched = LockOptions::new().ttl(ttl).watchdog(true);

    // Kept for five TTLs; nobody else gets it meanwhile.
    let guard = holder.lock("hold:kept", &watched).await.unwrap();
    let until = Instant::now() + ttl * 5;
    tokio::select! {
        lost = guard.lost() => panic!("lost while renewed: {lost}"),
        () = async {
            while Instant::now() < until {
                assert!(other.try_lock("hold:kept", &watched).await.unwrap_err().is_busy());
                tokio::time::sleep(ttl / 4).await;
            }
        } => {}
    }
    assert!(guard.is_valid());
    assert!(guard.valid_until() > Instant::now() + ttl / 3);
    guard.release().await.unwrap();
    let stats = holder.stats();
    assert!(
        stats.renewals >= 8,
        "renewed at ttl/3 for 5 TTLs: {stats:?}"
    );
    assert_eq!(stats.holds.count(), 1);

    // Taken away behind its back: lost() says so within a renewal period, release() fails.
    let guard = holder.lock("hold:stolen", &watched).await.unwrap();
    let keys = guard.keys().clone();
    let master = cluster.master_of_slot(keys.slot());
    master.set_lock_field(keys.lock_key(), "owner", "someone-else");
    let noticed = Instant::now();
    let lost = tokio::time::timeout(ttl, guard.lost())
        .await
        .expect("loss noticed");
    assert!(matches!(lost, Error::NotOwner { .. }), "{lost}");
    assert!(noticed.elapsed() <= ttl / 3 + Duration::from_millis(100));
    assert!(!guard.is_valid());
    assert!(matches!(guard.release().await, Err(Error::NotOwner { .. })));
    master.set_lock_field(keys.lock_key(), "owner", "");
    master.set_lock_field(keys.lock_key(), "until", "0");

    // A maximum hold time ends the renewals and frees the lock for others.
    let capped = watched.clone().max_hold(ttl * 2);
    let started = Instant::now();
    let guard = holder.lock("hold:capped", &capped).await.unwrap();
    let lost = guard.lost().await;
    assert!(matches!(lost, Error::MaxHoldReached { .. }), "{lost}");
    let held_for = started.elapsed();
    assert!(
        held_for >= ttl * 2 - Duration::from_millis(50) && held_for <= ttl * 3,
        "{held_for:?}"
    );
    let next = other
        .lock("hold:capped", &LockOptions::new().timeout(ttl))
        .await
        .expect("free after the maximum hold");
    next.release().await.unwrap();
    assert!(guard.release().await.unwrap_err().is_lock_lost());
    // Redis stops answering: lost() resolves when the lease runs out unconfirmed.
    let guard = holder.lock("hold:paused", &watched).await.unwrap();
    let master = cluster.master_of_slot(guard.keys().slot());
    master.pause();
    let lost = tokio::time::timeout(ttl * 2, guard.lost()).await;
    master.resume();
    let lost = lost.expect("an unreachable master ends the hold within the lease");
    assert!(matches!(lost, Error::LeaseUnconfirmed { .. }), "{lost}");
    assert!(lost.is_lock_lost());
    drop(guard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_watchdog_task_outlives_its_guards() {
    let cluster = Cluster::start();
    let client = Client::connect(cluster.urls()).await.unwrap();
    let watched = LockOptions::new()
        .ttl(Duration::from_millis(300))
        .watchdog(true);
    // The connection's own tasks stay; everything a watched guard starts must end with it.
    let baseline = alive_tasks();
    let warm_up = client.lock("tasks:warm-up", &watched).await.unwrap();
    warm_up.release().await.unwrap();
    eventually("the warm-up's tasks to end", Duration::from_secs(5), || {
        alive_tasks() <= baseline
    })
    .await;
    // Counted again: the first count may have included a connection task that ended since.
    let baseline = alive_tasks();

    let guards = [
        client.lock("tasks:a", &watched).await.unwrap(),
        client.lock("tasks:b", &watched).await.unwrap(),
    ];
    assert!(alive_tasks() > baseline, "the watchdog runs");
    let until = Instant::now() + Duration::from_millis(700);
    while Instant::now() < until {
        assert!(guards.iter().all(|g| g.is_valid()));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let [a, b] = guards;
    a.release().await.unwrap();
    assert!(alive_tasks() > baseline, "still renewing b");
    drop(b);
    eventually("the watchdog to stop", Duration::from_secs(2), || {
        alive_tasks() <= baseline
    })
    .await;
    let renewed = client.stats().renewals;
    assert!(renewed >= 4, "{renewed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn renewals_are_batched_per_node() {
    let cluster = Cluster::start();
    let client = Client::connect(cluster.urls()).await.unwrap();
    let ttl = Duration::from_millis(900);
    let watched = LockOptions::new().ttl(ttl).watchdog(true);
    let mut guards = Vec::new();
    for i in 0..600 {
        guards.push(client.lock(&format!("batch:{i}"), &watched).await.unwrap());
    }
    let before = client.stats();
    let periods = 6u32;
    tokio::time::sleep(ttl / 3 * periods).await;
    let after = client.stats();
    let calls = after.renewal_calls - before.renewal_calls;
    let renewals = after.renewals - before.renewals;
    assert!(guards.iter().all(|g| g.is_valid()));
    assert!(
        renewals >= 600 * u64::from(periods) / 2,
        "every lock renewed at least every other period: {renewals}"
    );
    // The watchdog groups by node and batching lane (one lane per worker thread: 4 here), so
    // that a renewal keeps its order with each lock's other calls.
    let lanes = 4;
    assert!(
        calls <= 3 * 3 * lanes * u64::from(periods),
        "at most 3 calls per node (3 masters) and lane per period: {calls} calls for {renewals} \
         renewals"
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reentry_shares_the_fence_and_frees_on_the_last_release() {
    let cluster = Cluster::start();
    let owner = Client::connect(cluster.urls()).await.unwrap();
    let other = Client::connect(cluster.urls()).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let name = "reentry:stock";
    let holds = |guard: &fencelock::LockGuard| -> Option<i64> {
        let node = cluster.master_of_slot(guard.keys().slot());
        node.lock_field(guard.keys().lock_key(), "holds")
            .map(|h| h.parse().unwrap())
    };

    // Inner released first.
    let outer = owner.lock(name, &options).await.unwrap();
    let handle = outer.reentry();
    let inner = handle.lock().await.unwrap();
    let innermost = handle.lock().await.unwrap();
    assert_eq!(inner.fence(), outer.fence());
    assert_eq!(innermost.fence(), outer.fence());
    assert_eq!(holds(&outer), Some(3));
    assert!(other.try_lock(name, &options).await.unwrap_err().is_busy());
    innermost.release().await.unwrap();
    inner.release().await.unwrap();
    assert!(other.try_lock(name, &options).await.unwrap_err().is_busy());
    let fence = outer.fence();
    outer.release().await.unwrap();
    let next = other
        .try_lock(name, &options)
        .await
        .expect("free after the last hold");
    assert!(next.fence() > fence);
    next.release().await.unwrap();

    // Outer released first: the inner hold keeps the lock until it is released.
    let outer = owner.lock(name, &options).await.unwrap();
    let inner = outer.reentry().lock().await.unwrap();
    outer.release().await.unwrap();
    assert!(other.try_lock(name, &options).await.unwrap_err().is_busy());
    assert_eq!(holds(&inner), Some(1));
    inner.release().await.unwrap();
    let next = other
        .try_lock(name, &options)
        .await
        .expect("free after the last hold");
    let handle_of_next = next.reentry();
    next.release().await.unwrap();

    // A handle whose owner no longer holds the lock is refused, with the reason.
    let taken = other.try_lock(name, &options).await.unwrap();
    assert!(matches!(
        handle_of_next.lock().await,
        Err(Error::NotOwner { .. })
    ));
    taken.release().await.unwrap();
    assert!(matches!(
        handle_of_next.lock().await,
        Err(Error::Expired { .. })
    ));

    // The release of a re-entry that never reached Redis (cancelled) leaves the lock alone.
    let outer = owner.lock(name, &options).await.unwrap();
    let node = cluster.master_of_slot(outer.keys().slot());
    let token = node.lock_field(outer.keys().lock_key(), "owner").unwrap();
    let release = fencelock::lua_scripts()
        .find(|s| s.name == "release")
        .unwrap();
    let code: i64 = node.cmd(
        redis::cmd("EVAL")
            .arg(release.source)
            .arg(1)
            .arg(outer.keys().lock_key())
            .arg(&token)
            .arg("a-hold-never-added")
            .arg("")
            .arg(""),
    );
    assert_eq!(code, 1);
    assert!(other.try_lock(name, &options).await.unwrap_err().is_busy());
    outer.release().await.unwrap();

    // A dropped inner guard gives its hold back in the background.
    let outer = owner.lock(name, &options).await.unwrap();
    drop(outer.reentry().lock().await.unwrap());
    eventually(
        "the inner hold to be given back",
        Duration::from_secs(5),
        || holds(&outer) == Some(1),
    )
    .await;
    outer.release().await.unwrap();
    other
        .try_lock(name, &options)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Watched guards `prefix:0` .. `prefix:{count - 1}`.
async fn watched_guards(
    client: &Client,
    prefix: &str,
    count: usize,
    options: &LockOptions,
) -> Vec<LockGuard> {
    let mut guards = Vec::new();
    for i in 0..count {
        guards.push(
            client
                .lock(&format!("{prefix}:{i}"), options)
                .await
                .unwrap(),
        );
    }
    guards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_renewals_back_off_until_the_leases_end() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let ttl = Duration::from_secs(1);
    let watched = LockOptions::new().ttl(ttl).watchdog(true);
    let guards = watched_guards(&client, "storm", 10, &watched).await;
    eventually("a first renewal", ttl, || client.stats().renewals >= 10).await;

    // The server turns into a replica of a master that does not exist: it keeps its data but
    // refuses every renewal at once (`READONLY`, a transient error). Each hold must end as
    // unconfirmed when its lease runs out, after a few retries, not thousands.
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nowhere_port = nowhere.local_addr().unwrap().port();
    drop(nowhere);
    let before = client.stats();
    let refused = Instant::now();
    server
        .node
        .cmd::<()>(redis::cmd("REPLICAOF").arg("127.0.0.1").arg(nowhere_port));
    for guard in &guards {
        let lost = tokio::time::timeout(ttl * 2, guard.lost())
            .await
            .expect("each lease ends within its TTL");
        assert!(matches!(lost, Error::LeaseUnconfirmed { .. }), "{lost}");
    }
    let ended = refused.elapsed();
    let calls = client.stats().renewal_calls - before.renewal_calls;
    println!("{calls} renewal calls for 10 locks in the {ended:?} until every lease ended");
    assert!(ended <= ttl + ttl / 4, "{ended:?}");
    assert!(
        (4..=10 * 4).contains(&calls),
        "retries back off, but several fit in the lease: {calls} renewal calls for 10 locks \
         in {ended:?}"
    );
    // Ended holds are no longer renewed: the count settles.
    let deadline = Instant::now() + ttl;
    loop {
        let calls = client.stats().renewal_calls;
        tokio::time::sleep(ttl / 5).await;
        if client.stats().renewal_calls == calls {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "renewals go on after every hold ended"
        );
    }
    server
        .node
        .cmd::<()>(redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lock_key_overwritten_ends_only_its_own_hold() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let other = Client::connect([server.url()]).await.unwrap();
    let ttl = Duration::from_millis(600);
    let watched = LockOptions::new().ttl(ttl).watchdog(true);
    let mut guards = watched_guards(&client, "wrongtype", 8, &watched).await;
    eventually("a first renewal", ttl, || client.stats().renewals >= 8).await;

    // Another program overwrites one lock's key with a string: renewing it fails for good.
    let broken = guards.remove(3);
    server
        .node
        .cmd::<()>(redis::cmd("SET").arg(broken.keys().lock_key()).arg("x"));
    let before = client.stats();
    let overwritten = Instant::now();
    let lost = tokio::time::timeout(ttl, broken.lost())
        .await
        .expect("the failed renewal ends the hold within a renewal period");
    println!("lost after {:?}: {lost}", overwritten.elapsed());
    match &lost {
        Error::RenewalFailed { name, reason } => {
            assert_eq!(name, "wrongtype:3");
            assert!(reason.contains("WRONGTYPE"), "{reason}");
        }
        other => panic!("expected RenewalFailed, got {other:?}"),
    }
    assert!(lost.is_lock_lost());
    assert!(!broken.is_valid());
    assert_eq!(client.stats().lost - before.lost, 1);

    // The other holds on the same server keep being renewed for several TTLs.
    let until = overwritten + ttl * 4;
    while Instant::now() < until {
        for guard in &guards {
            assert!(guard.is_valid(), "{} still valid", guard.name());
            let lease = server.node.lease_ms(guard.keys().lock_key());
            assert!(lease.is_some(), "{} still held in Redis", guard.name());
            let taken = other.try_lock(guard.name(), &watched).await;
            assert!(
                taken.unwrap_err().is_busy(),
                "{} refused to others",
                guard.name()
            );
        }
        tokio::time::sleep(ttl / 6).await;
    }
    let after = client.stats();
    let calls = after.renewal_calls - before.renewal_calls;
    let renewals = after.renewals - before.renewals;
    println!("{calls} renewal calls, {renewals} renewals in 4 TTLs");
    // About 3 periods per TTL with one call per batching lane each (one lane per worker
    // thread: 4 here), plus one round one by one (9 calls).
    let lanes = 4;
    assert!(
        calls <= 4 * 3 * 2 * lanes + 9,
        "{calls} renewal calls, {renewals} renewals"
    );
    assert!(renewals >= 7 * 4 * 2, "{renewals}");
    for guard in guards {
        guard.release().await.unwrap();
    }
    drop(broken);
}

/// `with_lock_guard` lends the work the guard: it extends the lease from inside the work, and
/// the lock is released after it; with the watchdog on, a loss (here a forced unlock) stops
/// the work and is returned.
#[tokio::test(flavor = "multi_thread")]
async fn with_lock_guard_lends_the_guard_to_the_work() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let admin = Client::connect([server.url()]).await.unwrap();
    let key = "fencelock:{guarded}:lock";

    let options = LockOptions::new().ttl(Duration::from_secs(2));
    let lease = client
        .with_lock_guard("guarded", &options, async |guard| {
            guard.extend(Duration::from_secs(60)).await?;
            Ok::<_, Error>(server.node.lease_ms(key))
        })
        .await
        .unwrap()
        .expect("held during the work");
    assert!(
        lease > 50_000,
        "the work extended the lease to 60 s: {lease} ms"
    );
    assert!(!server.node.held(key), "released after the work");

    let watched = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .watchdog(true);
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let work = client.with_lock_guard("guarded", &watched, async |guard| {
        started_tx.send(guard.fence()).unwrap();
        std::future::pending::<()>().await;
        Ok::<_, Error>(())
    });
    let force = async {
        let fence = started_rx.await.unwrap();
        let freed = admin
            .force_unlock(fencelock::Kind::Mutex, "guarded")
            .await
            .unwrap();
        assert_eq!(freed.fence, Some(fence));
    };
    let (outcome, ()) =
        tokio::time::timeout(Duration::from_secs(10), async { tokio::join!(work, force) })
            .await
            .expect("the watchdog reports the loss within a renewal period");
    assert!(
        matches!(outcome, Err(Error::ForceUnlocked { .. })),
        "{outcome:?}"
    );
}
