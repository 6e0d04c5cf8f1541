//! The semaphore with expiring permits, on real servers: the limit holds under races, crashed
//! holders' permits come back, many-permit acquisitions are all-or-nothing and not starved,
//! releases of unknown permits change nothing, limits are checked and changed in one call,
//! resent scripts have no second effect, and fences survive a forced-loss failover (the number
//! index: `semaphore_index.rs`).

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::semaphore::{available_is, script, standalone_semaphore, until};
use common::{Cluster, Standalone};
use fencelock::{Client, Error, LockOptions};

#[tokio::test(flavor = "multi_thread")]
async fn never_exceeds_its_limit_under_50_racing_tasks() {
    const LIMIT: u32 = 4;
    let server = Standalone::start();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(Client::connect([server.url()]).await.unwrap());
    }
    let holders = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let numbers = Arc::new(Mutex::new(HashSet::new()));
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(30));
    let mut tasks = Vec::new();
    for task in 0..50 {
        let semaphore = clients[task % 3].semaphore("racing", LIMIT).unwrap();
        let (holders, most, numbers, options) = (
            Arc::clone(&holders),
            Arc::clone(&most),
            Arc::clone(&numbers),
            options.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..3 {
                let permit = semaphore.acquire(&options).await.expect("acquired in time");
                let number = permit.permits()[0].number;
                assert!(number < LIMIT, "permit number {number} within the limit");
                assert!(
                    numbers.lock().unwrap().insert(number),
                    "permit {number} held twice at once"
                );
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                holders.fetch_sub(1, Ordering::SeqCst);
                numbers.lock().unwrap().remove(&number);
                permit.release().await.expect("released intact");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    eprintln!("at most {most} of {LIMIT} permits held at once by 50 tasks");
    assert!(most <= LIMIT as usize, "{most} holders at once");
    assert!(most >= 2, "the tasks did overlap ({most})");
    let semaphore = clients[0].semaphore("racing", LIMIT).unwrap();
    assert_eq!(semaphore.available().await.unwrap(), LIMIT);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forgotten_holders_permit_comes_back_after_its_lease() {
    let (_server, _client, semaphore) = standalone_semaphore("crashy", 2).await;
    let lease = Duration::from_millis(400);
    let permit = semaphore
        .try_acquire(&LockOptions::new().ttl(lease))
        .await
        .unwrap();
    let granted = Instant::now();
    std::mem::forget(permit); // a holder that crashed: nothing releases it
    assert_eq!(semaphore.available().await.unwrap(), 1);
    until("the permit to come back", Duration::from_secs(5), || {
        available_is(&semaphore, 2)
    })
    .await;
    assert!(granted.elapsed() >= lease - Duration::from_millis(50));
    let both = semaphore
        .try_acquire_many(2, &LockOptions::new())
        .await
        .expect("both permits free again");
    let numbers: Vec<u32> = both.permits().iter().map(|p| p.number).collect();
    assert_eq!(numbers, [0, 1]);
    both.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn many_permits_are_taken_all_or_nothing() {
    let (_server, _client, semaphore) = standalone_semaphore("batch", 3).await;
    let options = LockOptions::new();
    let two = semaphore.try_acquire_many(2, &options).await.unwrap();
    assert_eq!(two.permits().len(), 2);
    let fences: Vec<u64> = two.permits().iter().map(|p| p.fence.get()).collect();
    assert_eq!(fences[1], fences[0] + 1, "consecutive fences");
    assert_eq!(two.fence(), two.permits()[0].fence);
    let err = semaphore.try_acquire_many(2, &options).await.unwrap_err();
    assert!(err.is_busy(), "{err:?}");
    assert_eq!(semaphore.available().await.unwrap(), 1, "nothing taken");
    for count in [0, 4] {
        let err = semaphore
            .try_acquire_many(count, &options)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidOptions { .. }), "{err:?}");
        assert!(err.to_string().contains("which has 3"), "{err}");
    }
    two.release().await.unwrap();
    let all = semaphore.try_acquire_many(3, &options).await.unwrap();
    let numbers: Vec<u32> = all.permits().iter().map(|p| p.number).collect();
    assert_eq!(numbers, [0, 1, 2]);
    assert!(all.fence().get() > fences[1], "fences only grow");
    all.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_many_permit_waiter_is_not_starved_by_single_permit_takers() {
    const LIMIT: u32 = 4;
    let (server, _client, semaphore) = standalone_semaphore("starve", LIMIT).await;
    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicUsize::new(0));
    let mut singles = Vec::new();
    // Two relays of single permits: each takes its next permit before it lets go of the one
    // it holds, so without a reservation at least two permits are held at every moment and
    // all four are never free at once. A relay refused its next permit lets go and waits.
    for _ in 0..2 {
        let (semaphore, stop, taken) = (semaphore.clone(), Arc::clone(&stop), Arc::clone(&taken));
        singles.push(tokio::spawn(async move {
            let options = LockOptions::new().timeout(Duration::from_secs(30));
            let mut held = semaphore.acquire(&options).await.unwrap();
            while !stop.load(Ordering::SeqCst) {
                // Work under the permit.
                tokio::time::sleep(Duration::from_millis(5)).await;
                match semaphore.try_acquire(&options).await {
                    Ok(next) => {
                        held.release().await.unwrap();
                        held = next;
                    }
                    Err(err) => {
                        assert!(err.is_busy(), "{err:?}");
                        held.release().await.unwrap();
                        held = semaphore.acquire(&options).await.unwrap();
                    }
                }
                taken.fetch_add(1, Ordering::SeqCst);
            }
            held.release().await.unwrap();
        }));
    }
    common::eventually("the single takers to run", Duration::from_secs(5), || {
        taken.load(Ordering::SeqCst) >= 20
    })
    .await;
    let started = Instant::now();
    let all = semaphore
        .acquire_many(
            LIMIT,
            &LockOptions::new()
                .ttl(Duration::from_secs(2))
                .timeout(Duration::from_secs(5)),
        )
        .await
        .expect("the many-permit waiter is not starved");
    eprintln!(
        "all {LIMIT} permits after {:?} among single takers",
        started.elapsed()
    );
    assert_eq!(all.permits().len(), LIMIT as usize);
    stop.store(true, Ordering::SeqCst);
    all.release().await.unwrap();
    for single in singles {
        single.await.unwrap();
    }
    let key = semaphore.keys().lock_key().to_owned();
    let reservation: Option<String> = server.node.cmd(redis::cmd("HGET").arg(&key).arg("r"));
    assert_eq!(reservation, None, "the grant consumed the reservation");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dropped_many_permit_wait_withdraws_its_reservation() {
    let (server, _client, semaphore) = standalone_semaphore("withdrawn", 2).await;
    let key = semaphore.keys().lock_key().to_owned();
    let held = semaphore.try_acquire(&LockOptions::new()).await.unwrap();
    let waiter = {
        let semaphore = semaphore.clone();
        tokio::spawn(async move {
            semaphore
                .acquire_many(2, &LockOptions::new().timeout(Duration::from_secs(30)))
                .await
        })
    };
    let reserved = || {
        let reservation: Option<String> = server.node.cmd(redis::cmd("HGET").arg(&key).arg("r"));
        reservation.is_some()
    };
    common::eventually("the waiter to reserve", Duration::from_secs(5), reserved).await;
    let err = semaphore
        .try_acquire(&LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.is_busy(), "the last free permit is reserved: {err:?}");
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    common::eventually(
        "the reservation to be withdrawn",
        Duration::from_secs(5),
        || !reserved(),
    )
    .await;
    let second = semaphore
        .try_acquire(&LockOptions::new())
        .await
        .expect("free again without the reservation");
    second.release().await.unwrap();
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn releasing_unknown_or_expired_permits_changes_nothing_and_says_so() {
    let (server, _client, semaphore) = standalone_semaphore("stale", 1).await;
    let short = LockOptions::new().ttl(Duration::from_millis(200));
    let expired = semaphore.try_acquire(&short).await.unwrap();
    until("the lease to end", Duration::from_secs(5), || {
        available_is(&semaphore, 1)
    })
    .await;
    let err = expired.release().await.unwrap_err();
    assert!(matches!(err, Error::Expired { .. }), "{err:?}");

    let lost = semaphore.try_acquire(&short).await.unwrap();
    until("the lease to end", Duration::from_secs(5), || {
        available_is(&semaphore, 1)
    })
    .await;
    let taker = semaphore.try_acquire(&LockOptions::new()).await.unwrap();
    assert_eq!(taker.permits()[0].number, lost.permits()[0].number);
    let err = lost.release().await.unwrap_err();
    assert!(matches!(err, Error::NotOwner { .. }), "{err:?}");
    assert_eq!(
        semaphore.available().await.unwrap(),
        0,
        "the new holder kept it"
    );

    // An owner that never held anything: 0 for a number never granted, -1 for one another owner
    // holds, and nothing written either way.
    let key = semaphore.keys().lock_key().to_owned();
    let before: Vec<String> = server.node.cmd(redis::cmd("HGETALL").arg(&key));
    for (numbers, expected) in [("7", 0), ("", 0), ("0", -1)] {
        let code: i64 = server.node.cmd(
            redis::cmd("EVAL")
                .arg(script("semaphore_release"))
                .arg(1)
                .arg(&key)
                .arg("nobody")
                .arg(numbers)
                .arg("p")
                .arg("10000"),
        );
        assert_eq!(code, expected, "release {numbers:?} of an unknown owner");
    }
    let after: Vec<String> = server.node.cmd(redis::cmd("HGETALL").arg(&key));
    assert_eq!(before, after, "nothing changed");
    taker.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_different_limit_is_refused_with_the_stored_one() {
    let (_server, client, three) = standalone_semaphore("sized", 3).await;
    let permit = three.try_acquire(&LockOptions::new()).await.unwrap();
    let five = client.semaphore("sized", 5).unwrap();
    let err = five.try_acquire(&LockOptions::new()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LimitMismatch {
                stored: 3,
                requested: 5,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("has 3 permits"), "{err}");
    let err = five.available().await.unwrap_err();
    assert!(
        matches!(err, Error::LimitMismatch { stored: 3, .. }),
        "{err:?}"
    );
    assert!(matches!(
        client.semaphore("sized", 0),
        Err(Error::InvalidOptions { .. })
    ));
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn set_limit_changes_the_limit_in_one_call() {
    let (_server, client, semaphore) = standalone_semaphore("resized", 2).await;
    let old = client.semaphore("resized", 2).unwrap();
    let two = semaphore
        .try_acquire_many(2, &LockOptions::new())
        .await
        .unwrap();
    let waiter = {
        let semaphore = semaphore.clone(); // follows set_limit while it waits
        tokio::spawn(async move {
            semaphore
                .acquire(&LockOptions::new().timeout(Duration::from_secs(20)))
                .await
        })
    };
    assert_eq!(semaphore.set_limit(3).await.unwrap(), Some(2));
    let started = Instant::now();
    let third = waiter
        .await
        .unwrap()
        .expect("a raised limit lets the waiter in");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "woken by set_limit"
    );
    assert_eq!(third.permits()[0].number, 2);
    assert_eq!(semaphore.limit(), 3);
    let err = old.try_acquire(&LockOptions::new()).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::LimitMismatch {
                stored: 3,
                requested: 2,
                ..
            }
        ),
        "{err:?}"
    );

    // Lowered below what is held: the held permits stay valid and count against it.
    assert_eq!(semaphore.set_limit(1).await.unwrap(), Some(3));
    assert_eq!(semaphore.available().await.unwrap(), 0);
    let mut third = third;
    third
        .extend(Duration::from_secs(5))
        .await
        .expect("still held");
    third.release().await.unwrap();
    two.release().await.unwrap();
    assert_eq!(semaphore.available().await.unwrap(), 1);
    let only = semaphore.try_acquire(&LockOptions::new()).await.unwrap();
    assert_eq!(only.permits()[0].number, 0);
    assert!(semaphore
        .try_acquire(&LockOptions::new())
        .await
        .unwrap_err()
        .is_busy());
    only.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_resent_acquire_or_release_has_no_second_effect() {
    let (server, _client, semaphore) = standalone_semaphore("resent", 4).await;
    let key = semaphore.keys().lock_key().to_owned();
    let acquire = |owner: &str| -> Vec<i64> {
        server.node.cmd(
            redis::cmd("EVAL")
                .arg(script("semaphore_acquire"))
                .arg(1)
                .arg(&key)
                .arg(owner)
                .arg(2) // count
                .arg(4) // limit
                .arg(10_000) // TTL ms
                .arg(0) // floor
                .arg("clock")
                .arg("")
                .arg("10000"),
        )
    };
    let first = acquire("owner-a");
    let again = acquire("owner-a");
    assert_eq!(first[0], 1, "{first:?}");
    assert_eq!(again[0], 2, "{again:?}");
    assert_eq!(first[3..], again[3..], "the same permits and fences");
    assert_eq!(semaphore.available().await.unwrap(), 2, "taken once");
    let release = |numbers: &str| -> i64 {
        server.node.cmd(
            redis::cmd("EVAL")
                .arg(script("semaphore_release"))
                .arg(1)
                .arg(&key)
                .arg("owner-a")
                .arg(numbers)
                .arg("p")
                .arg("10000"),
        )
    };
    let numbers = format!("{} {}", first[3], first[5]);
    assert_eq!(release(&numbers), 1);
    assert_eq!(release(&numbers), 1, "a resent release answers the same");
    assert_eq!(semaphore.available().await.unwrap(), 4);
    let next = semaphore
        .try_acquire_many(4, &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(release(&numbers), -1, "its numbers are someone else's now");
    assert_eq!(semaphore.available().await.unwrap(), 0, "left alone");
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn at_maxmemory_permits_are_kept_and_released_and_acquire_says_memory_is_full() {
    let (server, client, semaphore) = standalone_semaphore("full", 3).await;
    let watched = semaphore
        .try_acquire(
            &LockOptions::new()
                .ttl(Duration::from_millis(600))
                .watchdog(true)
                .renew_every(Duration::from_millis(150)),
        )
        .await
        .unwrap();
    let mut plain = semaphore.try_acquire(&LockOptions::new()).await.unwrap();
    let config = |key: &str, value: &str| {
        server
            .node
            .cmd::<()>(redis::cmd("CONFIG").arg("SET").arg(key).arg(value));
    };
    config("maxmemory-policy", "noeviction");
    config("maxmemory", "1");
    let err = semaphore
        .try_acquire(&LockOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    plain
        .extend(Duration::from_secs(20))
        .await
        .expect("extend at maxmemory");
    let renewed = client.stats().renewals;
    common::eventually("renewals at maxmemory", Duration::from_secs(5), || {
        client.stats().renewals >= renewed + 4
    })
    .await;
    assert!(watched.is_valid());
    plain.release().await.expect("release at maxmemory");
    watched
        .release()
        .await
        .expect("release watched at maxmemory");
    assert_eq!(semaphore.available().await.unwrap(), 3);
    config("maxmemory", "0");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_watchdog_renews_all_permits_and_lost_reports_their_loss() {
    let (server, client, semaphore) = standalone_semaphore("watched", 3).await;
    let guard = semaphore
        .try_acquire_many(
            2,
            &LockOptions::new()
                .ttl(Duration::from_millis(300))
                .watchdog(true)
                .renew_every(Duration::from_millis(100)),
        )
        .await
        .unwrap();
    let started = Instant::now();
    common::eventually("renewals", Duration::from_secs(5), || {
        client.stats().renewals >= 6
    })
    .await;
    assert!(
        started.elapsed() > Duration::from_millis(300),
        "past the first lease"
    );
    assert_eq!(semaphore.available().await.unwrap(), 1, "both permits kept");
    // Someone deletes the key: the next renewal finds the permits gone.
    server
        .node
        .cmd::<()>(redis::cmd("DEL").arg(semaphore.keys().lock_key()));
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost resolves");
    assert!(matches!(lost, Error::Expired { .. }), "{lost:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn fences_stay_monotonic_across_a_forced_loss_failover() {
    let mut cluster = Cluster::start();
    let client = Client::connect(cluster.urls()).await.unwrap();
    let semaphore = client.semaphore("failover", 2).unwrap();
    let options = LockOptions::new().timeout(Duration::from_secs(20));
    let confirmed = options.clone().wait_replicas(1, Duration::from_secs(2));
    semaphore
        .acquire(&confirmed)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let slot = semaphore.keys().slot();
    let master_port = cluster.master_of_slot(slot).port;
    let replica_port = cluster.replica_of(master_port).port;
    cluster.cut_off_replica(master_port, replica_port);
    let mut highest = 0;
    for _ in 0..8 {
        let guard = semaphore.acquire_many(2, &options).await.unwrap();
        highest = highest.max(guard.permits()[1].fence.get());
        guard.release().await.unwrap();
    }
    cluster.take_over_with_lagging_replica(master_port, replica_port, slot);
    let after = semaphore
        .acquire_many(2, &options)
        .await
        .expect("permits after the failover");
    for permit in after.permits() {
        assert!(
            permit.fence.get() > highest,
            "permit {} fence {} after the failover must exceed {highest}",
            permit.number,
            permit.fence
        );
    }
    after.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn fences_that_would_pass_2_pow_53_are_refused_without_a_write() {
    let (server, _client, semaphore) = standalone_semaphore("near-max", 3).await;
    let key = semaphore.keys().lock_key().to_owned();
    let top = fencelock::FenceToken::MAX.get();
    server
        .node
        .cmd::<()>(redis::cmd("HSET").arg(&key).arg("fence").arg(top - 1));
    let err = semaphore
        .try_acquire_many(2, &LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("2^53"), "{err}");
    let fields: Vec<String> = server.node.cmd(redis::cmd("HKEYS").arg(&key));
    assert_eq!(fields, ["fence"], "nothing written");
    let last = semaphore.try_acquire(&LockOptions::new()).await.unwrap();
    assert_eq!(last.fence().get(), top, "one permit still fits");
    last.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_key_outlives_every_live_permit_and_is_kept_for_good_in_counter_mode() {
    let server = Standalone::start();
    let grace = Duration::from_secs(10);
    let client = Client::builder([server.url()])
        .expiry_grace(grace)
        .connect()
        .await
        .unwrap();
    let semaphore = client.semaphore("lifetime", 3).unwrap();
    let key = semaphore.keys().lock_key().to_owned();
    let long = semaphore
        .try_acquire(&LockOptions::new().ttl(Duration::from_secs(60)))
        .await
        .unwrap();
    let short = semaphore
        .try_acquire(&LockOptions::new().ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    let pttl: i64 = server.node.cmd(redis::cmd("PTTL").arg(&key));
    assert!(
        pttl > 60_000 + 9_000,
        "a later short grant keeps the long permit's expiry: {pttl} ms"
    );
    short.release().await.unwrap();
    let pttl: i64 = server.node.cmd(redis::cmd("PTTL").arg(&key));
    assert!(pttl > 60_000, "a release never shortens it: {pttl} ms");
    long.release().await.unwrap();

    let counter = Client::builder([server.url()])
        .fence_mode(fencelock::FenceMode::Counter)
        .connect()
        .await
        .unwrap();
    let kept = counter.semaphore("kept", 1).unwrap();
    kept.try_acquire(&LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let ttl: i64 = server
        .node
        .cmd(redis::cmd("PTTL").arg(kept.keys().lock_key()));
    assert_eq!(ttl, -1, "counter mode keeps the key");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_lowered_below_a_waiting_many_permit_call_ends_it_and_frees_the_others() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let other = Client::connect([server.url()]).await.unwrap();
    let semaphore = client.semaphore("lowered", 4).unwrap();
    let key = semaphore.keys().lock_key().to_owned();
    let held = semaphore
        .try_acquire_many(2, &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let waiter = {
        let semaphore = semaphore.clone(); // follows set_limit while it waits
        tokio::spawn(async move {
            semaphore
                .acquire_many(3, &LockOptions::new().timeout(Duration::from_secs(30)))
                .await
        })
    };
    let reserved = || {
        let reservation: Option<String> = server.node.cmd(redis::cmd("HGET").arg(&key).arg("r"));
        reservation.is_some()
    };
    common::eventually("the waiter to reserve", Duration::from_secs(5), reserved).await;

    // Lowered to 2: the waiter's 3 can never be met.
    let lowered = Instant::now();
    assert_eq!(semaphore.set_limit(2).await.unwrap(), Some(4));
    held.release().await.unwrap();
    let err = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter ends promptly")
        .unwrap()
        .unwrap_err();
    eprintln!("the waiter ended {:?} after set_limit", lowered.elapsed());
    assert!(
        matches!(
            err,
            Error::LimitBelowCount {
                count: 3,
                limit: 2,
                ..
            }
        ),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("\"lowered\"") && text.contains("2 permits") && text.contains("the 3"),
        "{text}"
    );

    // Single-permit takers on another client get the two free permits at once.
    let pool = other.semaphore("lowered", 2).unwrap();
    let taken = Instant::now();
    let options = LockOptions::new().timeout(Duration::from_secs(10));
    let first = pool.acquire(&options).await.unwrap();
    let second = pool.acquire(&options).await.unwrap();
    eprintln!("two single permits taken in {:?}", taken.elapsed());
    assert!(
        taken.elapsed() < Duration::from_secs(1),
        "not blocked by the dead reservation: {:?}",
        taken.elapsed()
    );
    common::eventually("the reservation to be gone", Duration::from_secs(2), || {
        !reserved()
    })
    .await;
    first.release().await.unwrap();
    second.release().await.unwrap();
}

/// How many times the server ran `PUBLISH` since the last `CONFIG RESETSTAT` (scripts' calls
/// included).
fn publishes(server: &Standalone) -> u64 {
    let info: String = server.node.cmd(redis::cmd("INFO").arg("commandstats"));
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_publish:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_announces_only_after_a_refused_acquire_and_wakes_the_waiter() {
    let (server, _client, semaphore) = standalone_semaphore("quiet", 1).await;
    let key = semaphore.keys().lock_key().to_owned();
    let long = LockOptions::new().ttl(Duration::from_secs(60));

    // Uncontended: nothing published, no flag left.
    let _: () = server.node.cmd(redis::cmd("CONFIG").arg("RESETSTAT"));
    for _ in 0..3 {
        semaphore
            .try_acquire(&long)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    assert_eq!(publishes(&server), 0, "no waiter, no announcement");
    let flag: Option<String> = server.node.cmd(redis::cmd("HGET").arg(&key).arg("waiters"));
    assert_eq!(flag, None);

    // A refused acquire sets `waiters`; the next release announces once and removes it.
    let held = semaphore.try_acquire(&long).await.unwrap();
    let err = semaphore.try_acquire(&long).await.unwrap_err();
    assert!(err.is_busy(), "{err:?}");
    let flag: Option<String> = server.node.cmd(redis::cmd("HGET").arg(&key).arg("waiters"));
    assert_eq!(flag.as_deref(), Some("1"), "the refusal left its flag");
    held.release().await.unwrap();
    assert_eq!(
        publishes(&server),
        1,
        "the release after a refusal announces"
    );
    let flag: Option<String> = server.node.cmd(redis::cmd("HGET").arg(&key).arg("waiters"));
    assert_eq!(flag, None, "the announcing release removed the flag");

    // A waiter behind a 60 s lease is woken by the release, not by its retry timer.
    let held = semaphore.try_acquire(&long).await.unwrap();
    let waiting = {
        let semaphore = semaphore.clone();
        tokio::spawn(async move {
            let options = LockOptions::new()
                .ttl(Duration::from_secs(60))
                .timeout(Duration::from_secs(20));
            let started = Instant::now();
            let guard = semaphore.acquire(&options).await.unwrap();
            (started.elapsed(), guard)
        })
    };
    until(
        "the waiter to be refused once",
        Duration::from_secs(5),
        || {
            let flag: Option<String> = server.node.cmd(redis::cmd("HGET").arg(&key).arg("waiters"));
            async move { flag.is_some() }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (_, guard) = waiting.await.unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woken by the release after {:?}",
        released.elapsed()
    );
    guard.release().await.unwrap();
}
