//! Wake-ups across a slot migration (SETSLOT IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE) on a
//! real cluster: a waiter subscribed on the slot's old master must not sleep until the holder's
//! lease ends when the holder releases.
//!
//! Found here (Redis 7.0.15): `SETSLOT <slot> NODE <other>` on the old master drops the slot's
//! sharded subscribers (it pushes `sunsubscribe`), and the client subscribes again on the new
//! master. Between `MIGRATE` of the lock key and `SETSLOT NODE`, though, the release script runs
//! on the importing node (`ASK`), so its `SPUBLISH` reaches nobody: the subscription is still on
//! the old master, which keeps serving the slot's sharded channels until `SETSLOT NODE`.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{eventually, wait_until, Cluster};
use fencelock::{Client, LockOptions};

/// Another master than the one on `port`.
fn other_master(cluster: &Cluster, port: u16) -> u16 {
    cluster
        .nodes
        .iter()
        .find(|n| n.port != port && n.info("replication").contains("role:master"))
        .expect("another master")
        .port
}

/// When the release runs, relative to the migration.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ReleaseAt {
    /// After `SETSLOT NODE` on every master: the slot has moved.
    AfterMigration,
    /// Right after `MIGRATE` of the lock key, before `SETSLOT NODE`: the key lives on the
    /// importing node, the old master still owns the slot (and the waiter's subscription). The
    /// migration goes on only once the waiter holds the lock (or after 8 s), as the chaos run's
    /// migration waits for grants between keys.
    DuringMigration,
}

/// A waiter subscribed while the holder holds a 5 s lease; the slot moves to another master;
/// the holder releases. Returns how long after the release the waiter held the lock.
async fn handoff_across_migration(at: ReleaseAt) -> Duration {
    let cluster = Cluster::start();
    let holder = Client::connect(cluster.urls()).await.unwrap();
    let waiter = Client::connect(cluster.urls()).await.unwrap();
    let name = "wake:migrate";
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .timeout(Duration::from_secs(20));
    let keys = holder.keys(name, &options).unwrap();
    let slot = keys.slot();
    let source = cluster.master_of_slot(slot).port;
    let target = other_master(&cluster, source);
    let first = holder.lock(name, &options).await.unwrap();
    let first_fence = first.fence();

    let granted: Arc<Mutex<Option<Instant>>> = Arc::default();
    let waiting = {
        let (client, options, granted) = (waiter.clone(), options.clone(), Arc::clone(&granted));
        tokio::spawn(async move {
            let guard = client.lock(name, &options).await.unwrap();
            *granted.lock().unwrap() = Some(Instant::now());
            let fence = guard.fence();
            guard.release().await.unwrap();
            fence
        })
    };
    eventually("the waiter to subscribe", Duration::from_secs(5), || {
        cluster
            .node(source)
            .lock_waiters_subscribed(keys.lock_key())
            == 1
    })
    .await;
    eventually("the waiter to wait", Duration::from_secs(5), || {
        waiter.stats().busy >= 2
    })
    .await;

    let mut first = Some(first);
    let mut released = None;
    let runtime = tokio::runtime::Handle::current();
    let mut release = || {
        let Some(guard) = first.take() else {
            return false;
        };
        released = Some(Instant::now());
        tokio::task::block_in_place(|| runtime.block_on(guard.release())).unwrap();
        true
    };
    match at {
        ReleaseAt::DuringMigration => cluster.migrate_slot(slot, source, target, || {
            assert_eq!(
                cluster
                    .node(source)
                    .lock_waiters_subscribed(keys.lock_key()),
                1,
                "the subscription stays on the migrating master until SETSLOT NODE"
            );
            if release() {
                let deadline = Instant::now() + Duration::from_secs(8);
                while granted.lock().unwrap().is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }),
        ReleaseAt::AfterMigration => {
            cluster.migrate_slot(slot, source, target, || {});
            // SETSLOT NODE made the old master drop the subscription (`sunsubscribe`); the
            // client subscribed again on the new one.
            wait_until("the re-subscription", Duration::from_secs(5), || {
                cluster
                    .node(target)
                    .lock_waiters_subscribed(keys.lock_key())
                    == 1
            });
            assert_eq!(
                cluster
                    .node(source)
                    .lock_waiters_subscribed(keys.lock_key()),
                0
            );
            release();
        }
    }
    let released = released.expect("released");
    let fence = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .expect("the waiter was granted within 15 s")
        .unwrap();
    assert!(fence > first_fence);
    assert_eq!(cluster.master_of_slot(slot).port, target, "the slot moved");
    let granted = granted.lock().unwrap().expect("granted");
    granted.saturating_duration_since(released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_wakes_on_a_release_after_its_slot_migrated() {
    let handoff = handoff_across_migration(ReleaseAt::AfterMigration).await;
    eprintln!("handoff after the migration: {handoff:?}");
    assert!(
        handoff < Duration::from_secs(1),
        "the handoff took {handoff:?}: the waiter slept until the 5 s lease end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_wakes_on_a_release_while_its_slot_migrates() {
    let handoff = handoff_across_migration(ReleaseAt::DuringMigration).await;
    eprintln!("handoff during the migration: {handoff:?}");
    assert!(
        handoff < Duration::from_secs(1),
        "the handoff took {handoff:?}: the waiter slept until the 5 s lease end"
    );
}

/// The masters' ports, with the highest config epoch first.
fn masters_by_epoch(cluster: &Cluster) -> Vec<(u16, u64)> {
    let mut masters: Vec<(u16, u64)> = cluster
        .nodes
        .iter()
        .filter(|n| n.info("replication").contains("role:master"))
        .map(|n| (n.port, n.config_epoch()))
        .collect();
    masters.sort_by_key(|&(_, epoch)| std::cmp::Reverse(epoch));
    masters
}

/// How many `TRYAGAIN` error replies the node on `port` has sent (`INFO errorstats`).
fn tryagains(cluster: &Cluster, port: u16) -> u64 {
    cluster
        .node(port)
        .info("errorstats")
        .lines()
        .find_map(|line| line.strip_prefix("errorstat_TRYAGAIN:count="))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

/// The default fence mode's epoch term in a migration's `ASK` window (docs/safety.md,
/// "Assumptions, per fence mode"): the importing node would grant a lock the source no longer
/// has (released, its key expired a few seconds later; deleted here) with its own config
/// epoch, which `SETSLOT NODE` raises only at the end; from a master whose epoch is below the
/// source's, that grant would fall hours below the source's earlier one (found by a review: it
/// did, by 2^34 µs and more). The importer refuses such a grant (`TRYAGAIN`) until the
/// migration ends; the lock is then granted above.
async fn ask_window_grant(cluster: Cluster) {
    let client = Client::connect(cluster.urls()).await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .timeout(Duration::from_secs(30));
    let masters = masters_by_epoch(&cluster);
    let ((source, source_epoch), (target, target_epoch)) = (masters[0], masters[2]);
    assert!(source_epoch > target_epoch, "{masters:?}");
    let name = (0..)
        .map(|i| format!("ask:{i}"))
        .find(|name| {
            let slot = client.keys(name, &options).unwrap().slot();
            cluster.master_of_slot(slot).port == source
        })
        .unwrap();
    let keys = client.keys(&name, &options).unwrap();
    let first = client.lock(&name, &options).await.unwrap();
    let before = first.fence().get();
    first.release().await.unwrap();
    let _: i64 = cluster
        .node(source)
        .cmd(redis::cmd("DEL").arg(keys.lock_key()));

    cluster.begin_migration(keys.slot(), source, target);
    let refused = tryagains(&cluster, target);
    let waiting = {
        let (client, name, options) = (client.clone(), name.clone(), options.clone());
        tokio::spawn(async move { client.lock(&name, &options).await })
    };
    wait_until(
        "the importer to refuse the grant",
        Duration::from_secs(20),
        || tryagains(&cluster, target) > refused,
    );
    // Several refused attempts: the client tries again (on the same connection) while they last.
    wait_until("refused attempts", Duration::from_secs(20), || {
        client.stats().acquire_errors >= 4
    });
    assert!(!waiting.is_finished(), "granted in the ASK window");
    cluster.finish_migration(keys.slot(), source, target);
    let granted = waiting.await.unwrap().unwrap();
    let after = granted.fence().get();
    granted.release().await.unwrap();
    assert!(after > before, "{after} <= {before}");
    // TRYAGAIN is an answer, not a stale connection: no rebuilds while it lasted.
    assert_eq!(
        client.stats().connection_rebuilds,
        0,
        "{:?}",
        client.stats()
    );
}

/// The migrating-slot check's call (`EXISTS key key:~`) refused for another reason, such as
/// an ACL user without `exists`, is that error, not a migration that never ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_user_without_exists_gets_its_refusal_not_a_migration() {
    let cluster = Cluster::start();
    for node in &cluster.nodes {
        let _: () = node.cmd(
            redis::cmd("ACL")
                .arg("SETUSER")
                .arg("noexists")
                .arg("on")
                .arg(">secret")
                .arg("~*")
                .arg("&*")
                .arg("+@all")
                .arg("-exists"),
        );
    }
    let urls: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://noexists:secret@127.0.0.1:{}", n.port))
        .collect();
    let client = Client::connect(urls).await.unwrap();
    let err = client
        .try_lock("acl:fresh", &LockOptions::new())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("can't run this command") && !text.contains("migrating"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_whose_key_expired_is_not_granted_in_a_migrations_ask_window() {
    ask_window_grant(Cluster::start()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lock_whose_key_expired_is_not_granted_in_a_migrations_ask_window_by_the_module() {
    let args = common::module::load_args(false);
    ask_window_grant(Cluster::start_with_args(&args, |_| Default::default())).await;
}
