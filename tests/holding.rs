//! Holding on a real cluster: the watchdog, loss detection, batched renewal and re-entry.

mod common;

use std::time::{Duration, Instant};

use common::{alive_tasks, eventually, Cluster};
use fencelock::{Client, Error, LockOptions};

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
    master.cmd::<()>(
        redis::cmd("HSET")
            .arg(keys.lock_key())
            .arg("owner")
            .arg("someone-else"),
    );
    let noticed = Instant::now();
    let lost = tokio::time::timeout(ttl, guard.lost())
        .await
        .expect("loss noticed");
    assert!(matches!(lost, Error::NotOwner { .. }), "{lost}");
    assert!(noticed.elapsed() <= ttl / 3 + Duration::from_millis(100));
    assert!(!guard.is_valid());
    assert!(matches!(guard.release().await, Err(Error::NotOwner { .. })));
    master.cmd::<()>(
        redis::cmd("HDEL")
            .arg(keys.lock_key())
            .arg("owner")
            .arg("until"),
    );

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
    assert!(
        calls <= 3 * 3 * u64::from(periods),
        "at most 3 calls per node (3 masters) per period: {calls} calls for {renewals} renewals"
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
        node.cmd(redis::cmd("HGET").arg(guard.keys().lock_key()).arg("holds"))
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
    let token: String = node.cmd(redis::cmd("HGET").arg(outer.keys().lock_key()).arg("owner"));
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
