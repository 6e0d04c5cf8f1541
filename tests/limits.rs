//! The library at its limits: a server at maxmemory, fences near 2^53, extreme option values,
//! leases shared by re-entered holds, a maximum hold below the TTL.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, Standalone};
use fencelock::{Client, Error, FenceToken, LockOptions, MAX_FLOOR, MAX_TTL, MIN_TTL};

#[tokio::test(flavor = "multi_thread")]
async fn at_maxmemory_held_locks_are_kept_and_released_and_acquire_says_memory_is_full() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let ttl = Duration::from_millis(600);
    let watched = client
        .try_lock(
            "watched",
            &LockOptions::new()
                .ttl(ttl)
                .watchdog(true)
                .renew_every(Duration::from_millis(150)),
        )
        .await
        .unwrap();
    let mut plain = client
        .try_lock("plain", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let outer = client
        .try_lock("outer", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let inner = outer.reentry().lock().await.unwrap();

    let config = |key: &str, value: &str| {
        server
            .node
            .cmd::<()>(redis::cmd("CONFIG").arg("SET").arg(key).arg(value));
    };
    config("maxmemory-policy", "noeviction");
    config("maxmemory", "1");

    let err = client
        .try_lock("new", &LockOptions::new())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    assert!(err.to_string().contains("out of memory"), "{err}");
    let err = outer.reentry().lock().await.unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");

    plain
        .extend(Duration::from_secs(20))
        .await
        .expect("extend at maxmemory");
    let renewed = client.stats().renewals;
    eventually(
        "the watchdog to renew at maxmemory for more than two leases",
        Duration::from_secs(5),
        || client.stats().renewals >= renewed + 6,
    )
    .await;
    assert!(watched.is_valid(), "renewals at maxmemory keep the lease");

    inner
        .release()
        .await
        .expect("release a re-entry at maxmemory");
    outer.release().await.expect("release at maxmemory");
    plain.release().await.expect("release at maxmemory");
    watched
        .release()
        .await
        .expect("release a watched lock at maxmemory");
    for name in ["plain", "outer", "watched"] {
        assert!(
            !server.node.held(&format!("fencelock:{{{name}}}:lock")),
            "{name} freed"
        );
    }

    config("maxmemory", "0");
    let guard = client.try_lock("new", &LockOptions::new()).await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fence_that_would_pass_2_pow_53_is_refused_without_a_write() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let name = "near-max";
    let key = "fencelock:{near-max}:lock";

    let too_high = FenceToken::new(MAX_FLOOR.get() + 1).unwrap();
    let err = client
        .try_lock(name, &LockOptions::new().floor(too_high))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidOptions { .. }), "{err:?}");
    assert!(err.to_string().contains("floor"), "{err}");

    let guard = client
        .try_lock(name, &LockOptions::new().floor(MAX_FLOOR))
        .await
        .unwrap();
    assert_eq!(guard.fence().get(), MAX_FLOOR.get() + 1);
    guard.release().await.unwrap();

    // A stored fence at the very top (written by hand, or by an older version) must not make
    // the script store 2^53, which Lua doubles could never count past.
    let top = FenceToken::MAX.get();
    server.node.set_lock_field(key, "fence", &top.to_string());
    let err = client
        .try_lock(name, &LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("2^53"), "{err}");
    let stored: u64 = server
        .node
        .lock_field(key, "fence")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(stored, top, "nothing written");
    let owner = server.node.lock_field(key, "owner");
    assert_eq!(owner, None, "no holder");
}

/// Durations at and beyond every edge an option can have.
fn durations() -> Vec<Duration> {
    vec![
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_millis(1),
        MIN_TTL - Duration::from_millis(1),
        MIN_TTL,
        Duration::from_millis(200),
        Duration::from_secs(3600),
        MAX_TTL,
        MAX_TTL + Duration::from_millis(1),
        Duration::from_secs(u64::MAX),
        Duration::MAX,
    ]
}

/// A small deterministic generator, so a failing case can be replayed.
struct Lcg(u64);

impl Lcg {
    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        items[(self.0 >> 33) as usize % items.len()].clone()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn extreme_option_values_give_results_not_panics() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let durations = durations();
    let counts = [0u32, 1, 3, u32::MAX];
    let mut random = Lcg(0x5eed);
    let (mut granted, mut refused) = (0, 0);
    for case in 0..300 {
        let mut options = LockOptions::new()
            .ttl(random.pick(&durations))
            .timeout(random.pick(&durations))
            .watchdog(random.pick(&[true, false]));
        if random.pick(&[true, false]) {
            options = options.renew_every(random.pick(&durations));
        }
        if random.pick(&[true, false]) {
            options = options.max_hold(random.pick(&durations));
        }
        if random.pick(&[false, false, true]) {
            // WAIT timeouts up to 200 ms: a valid one of an hour would block the call that long.
            let wait = random.pick(&durations[..6]);
            options = options.wait_replicas(random.pick(&counts), wait);
        }
        let name = format!("extreme-{case}");
        let outcome = tokio::time::timeout(Duration::from_secs(10), client.lock(&name, &options))
            .await
            .unwrap_or_else(|_| panic!("case {case} did not return: {options:?}"));
        match outcome {
            Ok(guard) => {
                granted += 1;
                assert!(guard.fence().get() > 0);
                let _ = guard.release().await;
            }
            Err(err) => {
                refused += 1;
                assert!(!err.to_string().is_empty());
            }
        }
    }
    assert!(
        granted > 10 && refused > 10,
        "{granted} granted, {refused} refused"
    );

    // Each option alone at its extremes.
    let held = client.try_lock("held", &LockOptions::new()).await.unwrap();
    let forever = LockOptions::new().timeout(Duration::MAX);
    let waiting = tokio::time::timeout(Duration::from_millis(300), client.lock("held", &forever));
    assert!(
        waiting.await.is_err(),
        "waits (without panicking) while held"
    );
    held.release().await.unwrap();
    let guard = client.lock("held", &forever).await.unwrap();
    guard.release().await.unwrap();

    let too_short = client
        .try_lock("short", &LockOptions::new().ttl(Duration::from_millis(5)))
        .await
        .unwrap_err();
    assert!(
        too_short.to_string().contains("at least 10ms"),
        "{too_short}"
    );

    let unbounded = LockOptions::new().watchdog(true).max_hold(Duration::MAX);
    let guard = client.try_lock("max-hold", &unbounded).await.unwrap();
    assert!(guard.is_valid());
    guard.release().await.unwrap();

    let mut guard = client
        .try_lock("extend", &LockOptions::new())
        .await
        .unwrap();
    for ttl in durations {
        let _ = guard.extend(ttl).await;
    }
    let _ = guard.release().await;

    for (retries, lanes) in [(u32::MAX, 4), (3, 0), (3, usize::MAX), (101, 4)] {
        let err = Client::builder([server.url()])
            .retries(retries)
            .wait_lanes(lanes)
            .connect()
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{err:?}");
    }
    for timeout in [Duration::ZERO, Duration::from_nanos(1), Duration::MAX] {
        for builder in [
            Client::builder([server.url()]).request_timeout(timeout),
            Client::builder([server.url()]).connect_timeout(timeout),
            Client::builder([server.url()]).expiry_grace(timeout),
        ] {
            match builder.connect().await {
                Ok(_) | Err(Error::InvalidConfig { .. }) => {}
                Err(other) => panic!("{other:?}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_extension_never_shortens_a_lease_other_holds_rely_on() {
    let server = Standalone::start();
    let owner = Client::connect([server.url()]).await.unwrap();
    let other = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(60));
    let mut outer = owner.try_lock("shared", &options).await.unwrap();
    let inner = outer
        .reentry()
        .ttl(Duration::from_secs(60))
        .lock()
        .await
        .unwrap();
    let key = outer.keys().lock_key().to_owned();

    let valid = outer.extend(Duration::from_millis(500)).await.unwrap();
    let lease = server.node.lease_ms(&key).unwrap();
    assert!(lease > 55_000, "the inner hold's lease is kept: {lease} ms");
    assert!(
        valid > Instant::now() + Duration::from_secs(55),
        "the outer guard reports the lease it shares"
    );
    assert!(inner.valid_until() <= valid + Duration::from_millis(100));
    assert!(other
        .try_lock("shared", &options)
        .await
        .unwrap_err()
        .is_busy());

    inner.release().await.unwrap();
    let valid = outer.extend(Duration::from_millis(500)).await.unwrap();
    assert!(valid < Instant::now() + Duration::from_millis(500));
    assert!(
        server.node.lease_ms(&key).unwrap() <= 500,
        "one hold: shortened"
    );
    outer.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_maximum_hold_below_the_ttl_cuts_the_first_lease() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let other = Client::connect([server.url()]).await.unwrap();
    let max_hold = Duration::from_millis(300);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .watchdog(true)
        .max_hold(max_hold);
    let started = Instant::now();
    let guard = client.try_lock("capped", &options).await.unwrap();
    let lease = server.node.lease_ms(guard.keys().lock_key()).unwrap();
    assert!(lease <= 300, "first lease {lease} ms");
    let lost = tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() resolves at the maximum hold");
    assert!(matches!(lost, Error::MaxHoldReached { .. }), "{lost:?}");
    let next = other
        .lock(
            "capped",
            &LockOptions::new().timeout(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "free after the maximum hold, not the 30 s TTL: {:?}",
        started.elapsed()
    );
    assert!(next.fence() > guard.fence());
    next.release().await.unwrap();
    drop(guard);
}
