//! `Client::inspect`, `Client::force_unlock` and `Client::list_locks` on real servers, for
//! every primitive kind: inspection shows holder, lease, holds and waiters; a forced unlock
//! frees the primitive, wakes a waiting call at once (not at the lease end), the next fence is
//! above the freed one, and the old holder's release reports the loss.

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{eventually, Cluster, Standalone};
use fencelock::{Client, Error, FenceToken, Kind, LockOptions};

const LONG: Duration = Duration::from_secs(30);

async fn connect(urls: Vec<String>) -> Client {
    Client::connect(urls).await.unwrap()
}

fn options() -> LockOptions {
    LockOptions::new()
        .ttl(LONG)
        .timeout(Duration::from_secs(20))
}

fn is_loss<T: std::fmt::Debug>(outcome: &fencelock::Result<T>) -> bool {
    matches!(
        outcome,
        Err(Error::Expired { .. } | Error::NotOwner { .. } | Error::ForceUnlocked { .. })
    )
}

/// What a waiting call got: its fence, and its guard (kept, so it is not released on drop).
type Got = (FenceToken, Box<dyn std::any::Any + Send>);

/// Starts `wait` (a waiting call) and returns its handle, which yields what it got and when.
fn waiting<F>(wait: F) -> tokio::task::JoinHandle<(Got, Instant)>
where
    F: Future<Output = Got> + Send + 'static,
{
    tokio::spawn(async move {
        let got = wait.await;
        (got, Instant::now())
    })
}

/// Force-unlocks `kind`/`name` and checks the waiting call got it within a second (the lease
/// was 30 s), with a higher fence; returns the freed fence.
async fn force_and_check_handoff(
    admin: &Client,
    kind: Kind,
    name: &str,
    waiter: tokio::task::JoinHandle<(Got, Instant)>,
) -> (FenceToken, Box<dyn std::any::Any + Send>) {
    let started = Instant::now();
    let freed = admin.force_unlock(kind, name).await.unwrap();
    assert!(freed.held, "{freed:?}");
    let freed_fence = freed.fence.unwrap();
    let ((fence, guard), granted) = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not woken")
        .unwrap();
    let handoff = granted.duration_since(started);
    println!("{kind}: waiter got it {handoff:?} after force_unlock was called");
    assert!(handoff < Duration::from_secs(1), "{kind}: {handoff:?}");
    assert!(fence > freed_fence, "{kind}: {fence} <= {freed_fence}");
    (freed_fence, guard)
}

#[tokio::test(flavor = "multi_thread")]
async fn mutex_inspection_and_forced_unlock() {
    let server = Standalone::start();
    let holder = connect(vec![server.url()]).await;
    let other = connect(vec![server.url()]).await;
    let admin = connect(vec![server.url()]).await;
    let name = "orders:42";

    let none = admin.inspect(Kind::Mutex, name).await.unwrap();
    assert!(!none.exists && !none.held, "{none:?}");
    assert_eq!(
        (none.fence, none.lease_left, none.waiters),
        (None, None, None)
    );
    assert_eq!(none.key, "fencelock:{orders:42}:lock");

    let guard = holder.lock(name, &options()).await.unwrap();
    let inner = guard.reentry().lock().await.unwrap();
    let seen = admin.inspect(Kind::Mutex, name).await.unwrap();
    assert!(seen.held && seen.exists, "{seen:?}");
    assert_eq!(seen.fence, Some(guard.fence()));
    assert_eq!(seen.holds, 2);
    assert_eq!(seen.waiters, None, "the mutex records no waiters");
    let lease = seen.lease_left.unwrap();
    assert!(
        lease > Duration::from_secs(25) && lease <= LONG,
        "{lease:?}"
    );
    assert!(
        seen.to_string().starts_with("orders:42 mutex held fence "),
        "{seen}"
    );

    let waiter = waiting(async move {
        let guard = other.lock(name, &options()).await.unwrap();
        (guard.fence(), Box::new(guard) as _)
    });
    eventually("the waiter's subscription", Duration::from_secs(10), || {
        server
            .node
            .lock_waiters_subscribed_plain("fencelock:{orders:42}:lock")
            == 1
    })
    .await;
    // The other client's waiter holds a place in the lock's queue, which inspection counts.
    let admin_ref = &admin;
    eventually_async("the waiter's place", || async move {
        admin_ref.inspect(Kind::Mutex, name).await.unwrap().waiters == Some(1)
    })
    .await;
    let (freed, _new_holder) = force_and_check_handoff(&admin, Kind::Mutex, name, waiter).await;
    assert_eq!(freed, guard.fence());
    let after = admin.inspect(Kind::Mutex, name).await.unwrap();
    assert!(after.held && after.fence > Some(freed), "{after:?}");

    // The old holder's releases report the loss: a forced unlock, although another owner
    // holds the lock now.
    assert!(matches!(
        inner.release().await,
        Err(Error::ForceUnlocked { .. })
    ));
    assert!(matches!(
        guard.release().await,
        Err(Error::ForceUnlocked { .. })
    ));

    // Freed with nobody waiting: free, fence kept, and the holder's release says so.
    admin.force_unlock(Kind::Mutex, name).await.unwrap();
    let again = holder.lock(name, &options()).await.unwrap();
    let found = admin.force_unlock(Kind::Mutex, name).await.unwrap();
    assert_eq!(found.fence, Some(again.fence()));
    let free = admin.inspect(Kind::Mutex, name).await.unwrap();
    assert!(!free.held && free.fence == Some(again.fence()), "{free:?}");
    let err = again.release().await.unwrap_err();
    assert!(matches!(err, Error::ForceUnlocked { .. }), "{err:?}");
    assert!(err.is_lock_lost());
    assert!(
        err.to_string().contains("freed by a force unlock") && !err.to_string().contains("TTL"),
        "{err}"
    );
    // A forced unlock of a free lock changes nothing.
    let nothing = admin.force_unlock(Kind::Mutex, name).await.unwrap();
    assert!(!nothing.held);
}

/// A forced unlock is told from an expiry on every path the holder learns it: `extend`,
/// `reenter`, the watchdog's renewal (`lost()`) and `release`, for the mutex and the fair lock;
/// a hold that merely expired still reports the expiry, also after a forced unlock of an
/// earlier hold.
#[tokio::test(flavor = "multi_thread")]
async fn the_holder_of_a_forced_unlock_is_told_so_not_that_it_expired() {
    let server = Standalone::start();
    let holder = connect(vec![server.url()]).await;
    let admin = connect(vec![server.url()]).await;
    let name = "forced:paths";
    let forced = |outcome: &fencelock::Result<()>| matches!(outcome, Err(Error::ForceUnlocked { name: n }) if n == name);

    let mut guard = holder.lock(name, &options()).await.unwrap();
    admin.force_unlock(Kind::Mutex, name).await.unwrap();
    let extended = guard.extend(LONG).await.map(drop);
    assert!(forced(&extended), "{extended:?}");
    let reentered = guard.reentry().lock().await.map(drop);
    assert!(forced(&reentered), "{reentered:?}");
    let released = guard.release().await;
    assert!(forced(&released), "{released:?}");

    let watched = holder
        .lock(name, &options().ttl(Duration::from_secs(3)).watchdog(true))
        .await
        .unwrap();
    admin.force_unlock(Kind::Mutex, name).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), watched.lost())
        .await
        .expect("the watchdog's next renewal (every TTL/3) reports the loss");
    assert!(
        matches!(&lost, Error::ForceUnlocked { .. }),
        "{lost:?}: {lost}"
    );
    drop(watched);

    // Expiry after a forced unlock of an earlier hold: still an expiry.
    let short = holder
        .lock(name, &options().ttl(Duration::from_millis(50)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await; // the lease's own end, no event
    let expired = short.release().await;
    assert!(matches!(expired, Err(Error::Expired { .. })), "{expired:?}");

    // The fair lock: extend, watchdog and release.
    let mut fair = holder.fair_lock(name, &options()).await.unwrap();
    admin.force_unlock(Kind::Fair, name).await.unwrap();
    let extended = fair.extend(LONG).await.map(drop);
    assert!(forced(&extended), "fair: {extended:?}");
    let released = fair.release().await;
    assert!(forced(&released), "fair: {released:?}");
    let watched = holder
        .fair_lock(name, &options().ttl(Duration::from_secs(3)).watchdog(true))
        .await
        .unwrap();
    admin.force_unlock(Kind::Fair, name).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), watched.lost())
        .await
        .expect("the watchdog's next renewal reports the loss");
    assert!(
        matches!(&lost, Error::ForceUnlocked { .. }),
        "fair: {lost:?}"
    );
}

/// The read-write lock's readers and writer and the semaphore's permit holders freed by a
/// forced unlock are told so on `release`, `extend`, re-entry, `downgrade` and the watchdog's
/// renewal (`lost()`); the marker is no holder (inspection shows none, the key expires as a
/// free key does), and a hold that merely expired still reports the expiry.
#[tokio::test(flavor = "multi_thread")]
async fn read_write_and_semaphore_holders_of_a_forced_unlock_are_told_so() {
    let server = Standalone::start();
    let holder = connect(vec![server.url()]).await;
    let admin = connect(vec![server.url()]).await;
    let name = "forced:rw-sem";
    let forced = |outcome: &fencelock::Result<()>| matches!(outcome, Err(Error::ForceUnlocked { name: n }) if n == name);
    let grace_ms = i64::try_from(fencelock::DEFAULT_EXPIRY_GRACE.as_millis()).unwrap();
    let pttl = |key: &str| -> i64 { server.node.cmd(redis::cmd("PTTL").arg(key)) };

    // Two readers: each hears of the forced unlock on every path.
    let mut first = holder.read_lock(name, &options()).await.unwrap();
    let second = holder.read_lock(name, &options()).await.unwrap();
    let key = first.keys().lock_key().to_owned();
    admin.force_unlock(Kind::ReadWrite, name).await.unwrap();
    let seen = admin.inspect(Kind::ReadWrite, name).await.unwrap();
    assert_eq!(
        (seen.held, seen.readers, seen.holds),
        (false, Some(0), 0),
        "the marker is no reader: {seen:?}"
    );
    let left = pttl(&key);
    // A grace after now, or after the last fence's millisecond, rounded up (one more when the
    // unlock ran in the millisecond of the last grant).
    assert!(
        (0..=grace_ms + 1).contains(&left),
        "freed: the key expires a grace after now, not after the freed leases ({left} ms)"
    );
    let extended = first.extend(LONG).await.map(drop);
    assert!(forced(&extended), "read extend: {extended:?}");
    let reentered = first.reentry().read().await.map(drop);
    assert!(forced(&reentered), "read re-entry: {reentered:?}");
    let released = first.release().await;
    assert!(forced(&released), "read release: {released:?}");
    let released = second.release().await;
    assert!(forced(&released), "second reader's release: {released:?}");

    // The writer: extend, re-entry, downgrade and release.
    let mut writer = holder.write_lock(name, &options()).await.unwrap();
    admin.force_unlock(Kind::ReadWrite, name).await.unwrap();
    let extended = writer.extend(LONG).await.map(drop);
    assert!(forced(&extended), "write extend: {extended:?}");
    let reentered = writer.reentry().write().await.map(drop);
    assert!(forced(&reentered), "write re-entry: {reentered:?}");
    let downgraded = writer.downgrade().await.map(drop);
    assert!(forced(&downgraded), "downgrade: {downgraded:?}");
    let writer = holder.write_lock(name, &options()).await.unwrap();
    admin.force_unlock(Kind::ReadWrite, name).await.unwrap();
    let released = writer.release().await;
    assert!(forced(&released), "write release: {released:?}");

    // The watchdog of a reader and of a writer.
    let watched = options().ttl(Duration::from_secs(3)).watchdog(true);
    let reader = holder.read_lock(name, &watched).await.unwrap();
    admin.force_unlock(Kind::ReadWrite, name).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), reader.lost())
        .await
        .expect("the watchdog's next renewal reports the loss");
    assert!(
        matches!(&lost, Error::ForceUnlocked { .. }),
        "reader: {lost:?}"
    );
    drop(reader);
    let writer = holder.write_lock(name, &watched).await.unwrap();
    admin.force_unlock(Kind::ReadWrite, name).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), writer.lost())
        .await
        .expect("the watchdog's next renewal reports the loss");
    assert!(
        matches!(&lost, Error::ForceUnlocked { .. }),
        "writer: {lost:?}"
    );
    drop(writer);

    // A reader whose lease merely ended, after the forced unlocks above: an expiry.
    let short = holder
        .read_lock(name, &options().ttl(Duration::from_millis(50)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await; // the lease's own end, no event
    let expired = short.release().await;
    assert!(matches!(expired, Err(Error::Expired { .. })), "{expired:?}");

    // The semaphore: holders of one and of two permits.
    let pool = holder.semaphore(name, 3).unwrap();
    let mut one = pool.acquire(&options()).await.unwrap();
    let two = pool.acquire_many(2, &options()).await.unwrap();
    admin.force_unlock(Kind::Semaphore, name).await.unwrap();
    let seen = admin.inspect(Kind::Semaphore, name).await.unwrap();
    assert_eq!(
        (seen.held, seen.permits_in_use, seen.holds),
        (false, Some(0), 0),
        "the marker is no permit: {seen:?}"
    );
    let extended = one.extend(LONG).await.map(drop);
    assert!(forced(&extended), "permit extend: {extended:?}");
    let released = one.release().await;
    assert!(forced(&released), "permit release: {released:?}");
    let released = two.release().await;
    assert!(forced(&released), "two permits' release: {released:?}");
    // A permit granted after the forced unlock is a permit as before.
    let again = pool.acquire_many(3, &options()).await.unwrap();
    again.release().await.unwrap();

    let permit = pool.acquire(&watched).await.unwrap();
    admin.force_unlock(Kind::Semaphore, name).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), permit.lost())
        .await
        .expect("the watchdog's next renewal reports the loss");
    assert!(
        matches!(&lost, Error::ForceUnlocked { .. }),
        "permit: {lost:?}"
    );
    drop(permit);

    let short = pool
        .acquire(&options().ttl(Duration::from_millis(50)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await; // the lease's own end, no event
    let expired = short.release().await;
    assert!(
        matches!(expired, Err(Error::Expired { .. })),
        "permit: {expired:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rwlock_inspection_and_forced_unlock() {
    let server = Standalone::start();
    let readers = connect(vec![server.url()]).await;
    let writer = connect(vec![server.url()]).await;
    let admin = connect(vec![server.url()]).await;
    let name = "catalog";
    let first = readers.read_lock(name, &options()).await.unwrap();
    let second = readers.read_lock(name, &options()).await.unwrap();
    let seen = admin.inspect(Kind::ReadWrite, name).await.unwrap();
    assert!(seen.held, "{seen:?}");
    assert_eq!(
        (seen.readers, seen.holds, seen.waiters),
        (Some(2), 2, Some(0))
    );
    assert_eq!(seen.fence, Some(second.fence()));
    assert!(seen.lease_left.unwrap() > Duration::from_secs(25));

    let waiter = waiting(async move {
        let guard = writer.write_lock(name, &options()).await.unwrap();
        (guard.fence(), Box::new(guard) as _)
    });
    let admin_ref = &admin;
    eventually_async("the writer's intent", || async move {
        admin_ref
            .inspect(Kind::ReadWrite, name)
            .await
            .unwrap()
            .waiters
            == Some(1)
    })
    .await;
    let _new_holder = force_and_check_handoff(&admin, Kind::ReadWrite, name, waiter).await;
    let after = admin.inspect(Kind::ReadWrite, name).await.unwrap();
    assert_eq!(
        (after.readers, after.holds, after.waiters),
        (Some(0), 1, Some(0))
    );
    assert!(is_loss(&first.release().await));
    assert!(is_loss(&second.release().await));
}

#[tokio::test(flavor = "multi_thread")]
async fn fair_lock_inspection_and_forced_unlock() {
    let server = Standalone::start();
    let holder = connect(vec![server.url()]).await;
    let other = connect(vec![server.url()]).await;
    let admin = connect(vec![server.url()]).await;
    let name = "queue";
    let guard = holder.fair_lock(name, &options()).await.unwrap();
    let waiter = waiting(async move {
        let guard = other.fair_lock(name, &options()).await.unwrap();
        (guard.fence(), Box::new(guard) as _)
    });
    let admin_ref = &admin;
    eventually_async("the waiter's place", || async move {
        admin_ref.inspect(Kind::Fair, name).await.unwrap().waiters == Some(1)
    })
    .await;
    let seen = admin.inspect(Kind::Fair, name).await.unwrap();
    assert!(
        seen.held && seen.holds == 1 && seen.fence == Some(guard.fence()),
        "{seen:?}"
    );
    let _new_holder = force_and_check_handoff(&admin, Kind::Fair, name, waiter).await;
    let after = admin.inspect(Kind::Fair, name).await.unwrap();
    assert_eq!((after.held, after.waiters), (true, Some(0)), "{after:?}");
    assert!(is_loss(&guard.release().await));
}

#[tokio::test(flavor = "multi_thread")]
async fn semaphore_inspection_and_forced_unlock() {
    let server = Standalone::start();
    let holder = connect(vec![server.url()]).await;
    let other = connect(vec![server.url()]).await;
    let admin = connect(vec![server.url()]).await;
    let name = "renderers";
    let pool = holder.semaphore(name, 3).unwrap();
    let batch = pool.acquire_many(2, &options()).await.unwrap();
    let seen = admin.inspect(Kind::Semaphore, name).await.unwrap();
    assert!(seen.held, "{seen:?}");
    assert_eq!(
        (seen.permits_in_use, seen.permit_limit, seen.holds),
        (Some(2), Some(3), 2)
    );
    assert_eq!(seen.waiters, Some(0));
    let highest = batch.permits().iter().map(|p| p.fence).max().unwrap();
    assert_eq!(seen.fence, Some(highest));

    // A waiter for 2 permits (one is free) records its reservation.
    let waiter = waiting(async move {
        let pool = other.semaphore(name, 3).unwrap();
        let got = pool.acquire_many(2, &options()).await.unwrap();
        (
            got.permits().iter().map(|p| p.fence).min().unwrap(),
            Box::new(got) as _,
        )
    });
    let admin_ref = &admin;
    eventually_async("the reservation", || async move {
        admin_ref
            .inspect(Kind::Semaphore, name)
            .await
            .unwrap()
            .waiters
            == Some(1)
    })
    .await;
    let _new_holder = force_and_check_handoff(&admin, Kind::Semaphore, name, waiter).await;
    let after = admin.inspect(Kind::Semaphore, name).await.unwrap();
    assert_eq!(after.permits_in_use, Some(2), "{after:?}");
    assert!(is_loss(&batch.release().await));
}

#[tokio::test(flavor = "multi_thread")]
async fn latch_inspection_and_forced_opening() {
    let server = Standalone::start();
    let client = connect(vec![server.url()]).await;
    let admin = connect(vec![server.url()]).await;
    let name = "batch:7";
    let latch = client.latch(name).unwrap();
    let generation = latch.set(3).await.unwrap();
    latch.count_down("a").await.unwrap();
    let seen = admin.inspect(Kind::Latch, name).await.unwrap();
    assert!(seen.held, "armed: {seen:?}");
    assert_eq!(seen.latch_count, Some(2));
    assert_eq!(seen.latch_generation, Some(generation));
    assert_eq!((seen.latch_opened, seen.waiters), (None, None));

    let waiting_latch = latch.clone();
    let waiter =
        waiting(async move { (waiting_latch.wait(LONG).await.unwrap(), Box::new(()) as _) });
    eventually("the waiter's subscription", Duration::from_secs(10), || {
        let reply: Vec<redis::Value> = server.node.cmd(
            redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("fencelock:{batch:7}:latch"),
        );
        reply.get(1) == Some(&redis::Value::Int(1))
    })
    .await;
    let started = Instant::now();
    let found = admin.force_unlock(Kind::Latch, name).await.unwrap();
    assert_eq!(found.latch_count, Some(2));
    let ((opened, _), at) = waiter.await.unwrap();
    println!(
        "latch: waiter returned {:?} after the forced opening",
        at - started
    );
    assert!(at - started < Duration::from_secs(1));
    assert_eq!(opened, generation);
    let after = admin.inspect(Kind::Latch, name).await.unwrap();
    assert!(!after.held);
    assert_eq!(
        (after.latch_count, after.latch_opened),
        (Some(0), Some(generation))
    );
    // The next generation is above the opened one.
    assert!(latch.set(1).await.unwrap() > generation);
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_cluster_list_finds_every_kind_on_every_master_and_force_unlock_wakes_waiters() {
    let cluster = Cluster::start();
    let client = connect(cluster.urls()).await;
    let other = connect(cluster.urls()).await;
    let admin = connect(cluster.urls()).await;

    // Names on different masters (slots spread over the keyspace), one of every kind, and a
    // lock pinned by tag.
    let mutexes = ["a", "b", "c", "d", "e", "f"];
    let mut guards = Vec::new();
    for name in mutexes {
        guards.push(client.lock(name, &options()).await.unwrap());
    }
    let pinned = client
        .lock("pinned:1", &options().tag("group{7}"))
        .await
        .unwrap();
    let _read = client.read_lock("rw", &options()).await.unwrap();
    let _fair = client.fair_lock("fair", &options()).await.unwrap();
    let _permit = client
        .semaphore("sem", 2)
        .unwrap()
        .acquire(&options())
        .await
        .unwrap();
    client.latch("latch").unwrap().set(2).await.unwrap();
    let masters: std::collections::BTreeSet<u16> = guards
        .iter()
        .map(|g| cluster.master_of_slot(g.keys().slot()).port)
        .collect();
    assert!(masters.len() >= 2, "names on one master only: {masters:?}");

    let list = admin.list_locks(100_000).await.unwrap();
    assert!(!list.truncated);
    let found: Vec<(String, Kind, bool)> = list
        .locks
        .iter()
        .map(|l| (l.name.clone(), l.kind, l.held))
        .collect();
    for name in mutexes {
        assert!(
            found.contains(&(name.into(), Kind::Mutex, true)),
            "{name}: {found:?}"
        );
    }
    for expected in [
        ("pinned:1", Kind::Mutex),
        ("rw", Kind::ReadWrite),
        ("fair", Kind::Fair),
        ("sem", Kind::Semaphore),
        ("latch", Kind::Latch),
    ] {
        assert!(
            found.contains(&(expected.0.into(), expected.1, true)),
            "{expected:?}: {found:?}"
        );
    }
    let pinned_entry = list.locks.iter().find(|l| l.name == "pinned:1").unwrap();
    assert_eq!(pinned_entry.key, pinned.keys().lock_key());
    assert_eq!(pinned_entry.fence, Some(pinned.fence()));

    let capped = admin.list_locks(1).await.unwrap();
    assert!(capped.truncated, "{capped:?}");

    // Sharded channels: a forced unlock wakes a mutex waiter and a fair lock's head.
    let mutex_waiter = {
        let other = other.clone();
        waiting(async move {
            let guard = other.lock("a", &options()).await.unwrap();
            (guard.fence(), Box::new(guard) as _)
        })
    };
    let admin_ref = &admin;
    let slot = guards[0].keys().slot();
    let master = cluster.master_of_slot(slot);
    eventually("the waiter's subscription", Duration::from_secs(10), || {
        master.lock_waiters_subscribed("fencelock:{a}:lock") == 1
    })
    .await;
    let _a = force_and_check_handoff(&admin, Kind::Mutex, "a", mutex_waiter).await;
    let fair_waiter = waiting(async move {
        let guard = other.fair_lock("fair", &options()).await.unwrap();
        (guard.fence(), Box::new(guard) as _)
    });
    eventually_async("the fair waiter's place", || async move {
        admin_ref.inspect(Kind::Fair, "fair").await.unwrap().waiters == Some(1)
    })
    .await;
    let _fair = force_and_check_handoff(&admin, Kind::Fair, "fair", fair_waiter).await;
}

/// Polls the async `condition` every 10 ms for up to 10 s.
async fn eventually_async<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn at_maxmemory_inspect_and_force_unlock_still_run() {
    let server = Standalone::start();
    let client = connect(vec![server.url()]).await;
    let guard = client.lock("full", &options()).await.unwrap();
    let _permit = client
        .semaphore("full", 1)
        .unwrap()
        .acquire(&options())
        .await
        .unwrap();
    server
        .node
        .cmd::<()>(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("1"));
    assert!(matches!(
        client.try_lock("other", &options()).await,
        Err(Error::OutOfMemory { .. })
    ));
    assert!(client.inspect(Kind::Mutex, "full").await.unwrap().held);
    let freed = client.force_unlock(Kind::Mutex, "full").await.unwrap();
    assert_eq!(freed.fence, Some(guard.fence()));
    assert!(
        client
            .force_unlock(Kind::Semaphore, "full")
            .await
            .unwrap()
            .held
    );
    assert!(!client.inspect(Kind::Semaphore, "full").await.unwrap().held);
    server
        .node
        .cmd::<()>(redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0"));
}

/// A lease end another program wrote (`inf`, a fraction) is no live lease: inspection never
/// reports a hold without one.
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_end_that_is_not_whole_milliseconds_is_no_live_hold() {
    let server = Standalone::start();
    let admin = connect(vec![server.url()]).await;
    for until in ["inf", "1e300", "99999999999999999999", "4102444800000.5"] {
        // Key layout 1 (fields owner, until, fence), as an older client wrote it.
        let _: i64 = server.node.cmd(
            redis::cmd("HSET")
                .arg("fencelock:{odd}:lock")
                .arg("owner")
                .arg("someone")
                .arg("until")
                .arg(until)
                .arg("fence")
                .arg(3),
        );
        let seen = admin.inspect(Kind::Mutex, "odd").await.unwrap();
        assert_eq!(
            (seen.held, seen.lease_left, seen.fence),
            (false, None, FenceToken::new(3)),
            "until {until}: {seen:?}"
        );
    }
}

/// `list_locks` asks each master by its address: with a master stopped (SIGSTOP, before the
/// cluster fails it over), a client that could not open a connection to it fails the listing
/// with a transient error. Routed by slot, the `SCAN` went to another node, which was scanned
/// twice, and the listing came back without the stopped master's locks and no error.
#[tokio::test(flavor = "multi_thread")]
async fn a_listing_with_a_master_stopped_fails_instead_of_leaving_its_locks_out() {
    let cluster = Cluster::start();
    let client = connect(cluster.urls()).await;
    let mut guards = Vec::new();
    for name in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        guards.push(client.lock(name, &options()).await.unwrap());
    }
    let stopped = cluster.master_of_slot(guards[0].keys().slot());
    let others: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|node| node.port != stopped.port)
        .map(|node| node.url())
        .collect();
    stopped.pause();
    let admin = Client::builder(others)
        .connect_timeout(Duration::from_millis(300))
        .request_timeout(Duration::from_millis(300))
        .connect()
        .await;
    let listed = match admin {
        Ok(admin) => Some(admin.list_locks(100_000).await),
        Err(_) => None,
    };
    stopped.resume();
    let still_master = cluster.master_of_slot(guards[0].keys().slot()).port == stopped.port;
    let Some(listed) = listed else {
        panic!("connect without the stopped master failed");
    };
    match listed {
        Err(err) => assert!(err.is_transient(), "{err:?}"),
        Ok(list) => {
            let names: Vec<&str> = list.locks.iter().map(|l| l.name.as_str()).collect();
            assert!(
                !still_master && names.len() == guards.len(),
                "listed {names:?} while a master was stopped"
            );
        }
    }
}
