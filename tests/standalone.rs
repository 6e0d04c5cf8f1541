//! The lock against a real standalone Redis server.

mod common;

use std::future::Future;
use std::time::Duration;

use common::{cut_after, wait_until, Standalone};
use fencelock::{Client, Error, FenceMode, FenceToken, LockOptions, Topology};

async fn client(server: &Standalone) -> Client {
    Client::connect([server.url()]).await.expect("connect")
}

fn held(server: &Standalone, key: &str) -> bool {
    server.node.held(key)
}

#[tokio::test(flavor = "multi_thread")]
async fn standalone_is_detected_and_a_lock_cycle_works() {
    let server = Standalone::start();
    let client = client(&server).await;
    assert_eq!(client.topology(), Topology::Standalone);
    let options = LockOptions::new().ttl(Duration::from_secs(5));

    let first = client
        .try_lock("orders:42", &options)
        .await
        .expect("free lock");
    assert!(first.is_valid());
    match client.try_lock("orders:42", &options).await {
        Err(Error::Busy { retry_after, .. }) => assert!(retry_after <= Duration::from_secs(5)),
        other => panic!("expected Busy, got {other:?}"),
    }
    let fence = first.fence();
    first.release().await.expect("release");
    assert!(!held(&server, "fencelock:{orders:42}:lock"));

    let second = client
        .try_lock("orders:42", &options)
        .await
        .expect("free again");
    assert!(second.fence() > fence);
    let second_fence = second.fence();
    second.release().await.unwrap();
    let kept: Option<u64> = server
        .node
        .lock_field("fencelock:{orders:42}:lock", "fence")
        .map(|f| f.parse().unwrap());
    assert_eq!(
        kept,
        Some(second_fence.get()),
        "the fence outlives the release"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn release_and_extend_report_expired_and_not_owner() {
    let server = Standalone::start();
    let client = client(&server).await;
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let key = "fencelock:{job}:lock";

    let mut lost = client.try_lock("job", &options).await.unwrap();
    server.node.cmd::<i64>(redis::cmd("DEL").arg(key));
    assert!(matches!(
        lost.extend(Duration::from_secs(5)).await,
        Err(Error::Expired { .. })
    ));
    assert!(matches!(lost.release().await, Err(Error::Expired { .. })));

    let mut stale = client.try_lock("job", &options).await.unwrap();
    server.node.cmd::<i64>(redis::cmd("DEL").arg(key));
    let newer = client.try_lock("job", &options).await.unwrap();
    assert!(newer.fence() > stale.fence());
    let err = stale.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(
        matches!(err, Error::NotOwner { .. }) && err.is_lock_lost(),
        "{err}"
    );
    assert!(matches!(stale.release().await, Err(Error::NotOwner { .. })));
    assert!(
        held(&server, key),
        "a non-owner's release leaves the lock alone"
    );
    newer.release().await.unwrap();

    // A real lease expiry, observed by polling.
    let mut short = client
        .try_lock("job", &LockOptions::new().ttl(Duration::from_millis(50)))
        .await
        .unwrap();
    wait_until("the lock to expire", Duration::from_secs(5), || {
        !held(&server, key)
    });
    assert!(!short.is_valid());
    assert!(matches!(
        short.extend(Duration::from_secs(1)).await,
        Err(Error::Expired { .. })
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn extend_moves_valid_until_forward() {
    let server = Standalone::start();
    let client = client(&server).await;
    let mut guard = client
        .try_lock("x", &LockOptions::new().ttl(Duration::from_millis(200)))
        .await
        .unwrap();
    let before = guard.valid_until();
    let after = guard.extend(Duration::from_secs(60)).await.unwrap();
    assert!(after > before + Duration::from_secs(50));
    let lease = server.node.lease_ms("fencelock:{x}:lock");
    assert!(lease > Some(50_000), "lease {lease:?}");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shortening_extend_dropped_after_redis_ran_it_leaves_the_guard_on_the_shorter_lease() {
    let server = Standalone::start();
    let client = client(&server).await;
    for watchdog in [false, true] {
        let name = if watchdog {
            "shorten-watched"
        } else {
            "shorten"
        };
        let key = format!("fencelock:{{{name}}}:lock");
        let options = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .watchdog(watchdog);
        let mut guard = client.try_lock(name, &options).await.unwrap();
        // One extend that completes first loads the script: the cut call is then one EVALSHA.
        guard.extend(Duration::from_secs(30)).await.unwrap();
        // Paused, Redis cannot answer during the first poll however loaded the machine is.
        let _: () = server.node.cmd(redis::cmd("CLIENT").arg("PAUSE").arg(200));
        let mut call = Box::pin(guard.extend(Duration::from_secs(1)));
        let polled = std::future::poll_fn(|cx| {
            std::task::Poll::Ready(std::future::Future::poll(call.as_mut(), cx))
        })
        .await;
        assert!(polled.is_pending(), "watchdog {watchdog}");
        // Redis ran it (the lease is down to about 1 s); the call never sees its reply.
        common::eventually("Redis to run it", Duration::from_secs(5), || {
            server.node.lease_ms(&key).is_some_and(|left| left <= 1_000)
        })
        .await;
        drop(call);
        let asked = std::time::Instant::now() + Duration::from_secs(1);
        assert!(
            guard.valid_until() <= asked,
            "watchdog {watchdog}: the guard counts on {:?} past the lease Redis has",
            guard.valid_until().saturating_duration_since(asked)
        );
        guard.release().await.ok();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_extend_that_finds_the_lock_gone_leaves_the_guard_invalid() {
    let server = Standalone::start();
    let client = client(&server).await;
    for watchdog in [false, true] {
        let name = if watchdog { "gone-watched" } else { "gone" };
        let options = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .watchdog(watchdog);
        let mut guard = client.try_lock(name, &options).await.unwrap();
        let _: i64 = server
            .node
            .cmd(redis::cmd("DEL").arg(format!("fencelock:{{{name}}}:lock")));
        let err = guard.extend(Duration::from_secs(30)).await.unwrap_err();
        assert!(matches!(err, Error::Expired { .. }), "{err:?}");
        assert!(
            !guard.is_valid(),
            "watchdog {watchdog}: still valid after {err}"
        );
        let lost = tokio::time::timeout(Duration::from_secs(1), guard.lost())
            .await
            .expect("lost() answers at once");
        assert!(matches!(lost, Error::Expired { .. }), "{lost:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_re_entry_that_outlives_its_first_hold_follows_its_own_extend() {
    let server = Standalone::start();
    let client = client(&server).await;
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .watchdog(true);
    let outer = client.try_lock("re", &options).await.unwrap();
    let mut inner = outer.reentry().lock().await.unwrap();
    outer.release().await.unwrap();
    // One hold is left: this extend shortens the owner's lease in Redis.
    let until = inner.extend(Duration::from_secs(2)).await.unwrap();
    let asked = std::time::Instant::now() + Duration::from_secs(2);
    assert!(until <= asked, "{until:?}");
    assert!(
        inner.valid_until() <= asked,
        "the guard counts on {:?} past the lease Redis has",
        inner.valid_until().saturating_duration_since(asked)
    );
    let lease = server.node.lease_ms("fencelock:{re}:lock");
    assert!(lease.is_some_and(|ms| ms <= 2_000), "{lease:?}");
    inner.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn acquire_script_is_idempotent_for_the_same_owner() {
    let server = Standalone::start();
    let source = fencelock::lua_scripts()
        .find(|s| s.name == "acquire")
        .unwrap()
        .source;
    let key = "k{t}:lock";
    let eval = |owner: &str| -> (i64, i64) {
        let reply = common::grant_values(
            server.node.cmd(
                redis::cmd("EVAL")
                    .arg(source)
                    .arg(1)
                    .arg(key)
                    .arg(owner)
                    .arg(10_000)
                    .arg(0)
                    .arg("counter")
                    .arg(""),
            ),
        );
        (reply[0], reply[1])
    };
    let (status, fence) = eval("owner-a");
    assert_eq!((status, fence), (1, 1));
    let (status, again) = eval("owner-a");
    assert_eq!(
        (status, again),
        (2, 1),
        "a resent acquire returns the same fence"
    );
    let counter: i64 = server
        .node
        .lock_field(key, "fence")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(counter, 1, "and does not advance the counter");
    let (status, pttl) = eval("owner-b");
    assert_eq!(status, 0);
    assert!(pttl > 0 && pttl <= 10_000);
}

#[tokio::test(flavor = "multi_thread")]
async fn fence_modes_and_floor() {
    let server = Standalone::start();
    let counter = Client::builder([server.url()])
        .fence_mode(FenceMode::Counter)
        .connect()
        .await
        .unwrap();
    let options = LockOptions::new();
    let mut fences = Vec::new();
    for _ in 0..3 {
        let guard = counter.try_lock("c", &options).await.unwrap();
        fences.push(guard.fence().get());
        guard.release().await.unwrap();
    }
    assert_eq!(fences, [1, 2, 3]);

    let floor = FenceToken::new(1_000_000).unwrap();
    let guard = counter
        .try_lock("c", &options.clone().floor(floor))
        .await
        .unwrap();
    assert_eq!(guard.fence().get(), 1_000_001);
    guard.release().await.unwrap();

    let clock = client(&server).await;
    let (secs, micros): (u64, u64) = server.node.cmd(&mut redis::cmd("TIME"));
    let guard = clock.try_lock("c", &options).await.unwrap();
    assert!(
        guard.fence().get() > secs * 1_000_000 + micros,
        "clock mode starts above server time"
    );
    let previous = guard.fence();
    guard.release().await.unwrap();
    let next = counter.try_lock("c", &options).await.unwrap();
    assert!(
        next.fence() > previous,
        "counter mode continues above clock tokens"
    );
    next.release().await.unwrap();

    let epoch = Client::builder([server.url()])
        .fence_mode(FenceMode::Epoch)
        .connect()
        .await
        .unwrap();
    let guard = epoch.try_lock("e", &options).await.unwrap();
    assert_eq!(guard.fence().get(), 1, "no cluster epoch: a plain counter");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn lock_waits_for_release_and_times_out_when_held() {
    let server = Standalone::start();
    let client = client(&server).await;
    let holder = client.try_lock("w", &LockOptions::new()).await.unwrap();

    let once = LockOptions::new().timeout(Duration::ZERO);
    assert!(client.lock("w", &once).await.unwrap_err().is_busy());
    let short = LockOptions::new().timeout(Duration::from_millis(150));
    match client.lock("w", &short).await {
        Err(Error::Busy { waited, .. }) => assert!(waited >= Duration::from_millis(150)),
        other => panic!("expected Busy, got {other:?}"),
    }

    let waiter = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .lock("w", &LockOptions::new().timeout(Duration::from_secs(10)))
                .await
        })
    };
    let holder_fence = holder.fence();
    holder.release().await.unwrap();
    let next = waiter
        .await
        .unwrap()
        .expect("the waiter gets the lock after release");
    assert!(next.fence() > holder_fence);
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn dropped_guard_releases_in_background() {
    let server = Standalone::start();
    let client = client(&server).await;
    let guard = client.try_lock("d", &LockOptions::new()).await.unwrap();
    assert!(held(&server, "fencelock:{d}:lock"));
    drop(guard);
    wait_until("the background release", Duration::from_secs(5), || {
        !held(&server, "fencelock:{d}:lock")
    });
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_replicas_without_replicas_fails_and_releases() {
    let server = Standalone::start();
    let client = client(&server).await;
    let options = LockOptions::new().wait_replicas(1, Duration::from_millis(50));
    match client.try_lock("r", &options).await {
        Err(Error::ReplicasNotConfirmed {
            acked: 0,
            required: 1,
            ..
        }) => {}
        other => panic!("expected ReplicasNotConfirmed, got {other:?}"),
    }
    assert!(
        !held(&server, "fencelock:{r}:lock"),
        "the unconfirmed lock was released"
    );
}

/// The release of a grant too few replicas confirmed is an undo: a lock call cut at any of its
/// polls, the one that sent that release included, leaves nothing held once the client's
/// background calls have ended. With batching off no driver queues the undo; redis-rs leaves
/// out a queued command whose caller is gone, so the undo is sent from a task of its own (the
/// cut right after it went out left the lock held for its 30 s lease before).
#[tokio::test]
async fn an_unconfirmed_grants_release_is_sent_whichever_poll_the_call_is_cut_at() {
    let server = Standalone::start();
    let client = Client::builder([server.url()])
        .batching(false)
        .connect()
        .await
        .expect("connect");
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait_replicas(1, Duration::from_millis(20));
    let mut cuts = 0;
    for polls in 1.. {
        let name = format!("cut-{polls}");
        let outcome = cut_after(client.try_lock(&name, &options), polls).await;
        client.shutdown().await.expect("background calls ended");
        assert!(
            !held(&server, &format!("fencelock:{{{name}}}:lock")),
            "cut after {polls} polls ({outcome:?}): the unconfirmed lock is still held"
        );
        match outcome {
            None => cuts += 1,
            Some(Err(Error::ReplicasNotConfirmed { .. })) => break,
            Some(other) => panic!("expected ReplicasNotConfirmed, got {other:?}"),
        }
        assert!(polls < 100, "the call never ended");
    }
    assert!(cuts >= 2, "cut at {cuts} polls only");
}

/// After `NOSCRIPT` the script is resent with its `WAIT`: the replicas get what is left of the
/// WAIT timeout, not a second one, so an unconfirmed grant fails as `ReplicasNotConfirmed`
/// within the call's bound (request timeout + WAIT timeout), not as `Timeout` after it. With no
/// replica, each `WAIT` here blocks for its whole timeout (the first one too, sent in the
/// pipeline after the refused `EVALSHA`).
#[tokio::test(flavor = "multi_thread")]
async fn wait_replicas_after_noscript_takes_one_wait_timeout_and_reports_the_replicas() {
    let server = Standalone::start();
    let request = Duration::from_millis(500);
    let client = Client::builder([server.url()])
        .request_timeout(request)
        .connect()
        .await
        .expect("connect");
    server.node.cmd::<()>(redis::cmd("SCRIPT").arg("FLUSH"));
    let wait = Duration::from_millis(1500);
    let options = LockOptions::new().wait_replicas(1, wait);
    let started = std::time::Instant::now();
    let outcome = client.try_lock("nw", &options).await;
    let took = started.elapsed();
    match outcome {
        Err(Error::ReplicasNotConfirmed {
            acked: 0,
            required: 1,
            ..
        }) => {}
        other => panic!("expected ReplicasNotConfirmed, got {other:?} after {took:?}"),
    }
    // The grant's call within request + wait, and the compensating release within its own
    // request timeout.
    assert!(took < wait + request * 2, "took {took:?}");
    assert!(
        !held(&server, "fencelock:{nw}:lock"),
        "the unconfirmed lock was released"
    );
}

/// A lone call goes past the driver (`transport/direct.rs`) and is driven by its caller's
/// polls. A caller that stops polling after the call was sent and resumes past the request
/// deadline must not have the call's second step (the script's source after `NOSCRIPT`) sent
/// then: it answers `Timeout`, and the lock was never granted by that call. (Before the fix the
/// late `EVAL` was queued and its future dropped by the timeout in the same poll; redis-rs
/// skips a queued command whose caller is gone if its connection task has not written it yet,
/// so the old code failed this test in some runs only: 3 of 8 here.)
#[tokio::test(flavor = "multi_thread")]
async fn a_direct_calls_second_step_is_not_sent_past_its_deadline() {
    let server = Standalone::start();
    let request = Duration::from_millis(300);
    let client = Client::builder([server.url()])
        .request_timeout(request)
        .fence_mode(FenceMode::Counter)
        .module(fencelock::ModuleUse::Off)
        .connect()
        .await
        .expect("connect");
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let first = client.try_lock("late", &options).await.unwrap();
    assert_eq!(first.fence().get(), 1);
    first.release().await.unwrap();
    server.node.cmd::<()>(redis::cmd("SCRIPT").arg("FLUSH"));
    // NOSCRIPT refusals so far (the first calls on this fresh server had some).
    let noscripts = || {
        server
            .node
            .info("errorstats")
            .lines()
            .find_map(|line| line.strip_prefix("errorstat_NOSCRIPT:count="))
            .map_or(0, |count| count.trim().parse::<u64>().unwrap())
    };
    let before = noscripts();
    let noscript = || noscripts() > before;
    assert!(!noscript());

    // The server holds every command for 150 ms, so the refusal cannot arrive while the first
    // poll is still running (on a loaded machine it did, and the first poll sent the EVAL in
    // time, as it should).
    server
        .node
        .cmd::<()>(redis::cmd("CLIENT").arg("PAUSE").arg(150).arg("ALL"));
    let mut late = std::pin::pin!(client.try_lock("late", &options));
    // One poll sends the EVALSHA (past the quiet driver), then the caller stops polling.
    let polled = std::future::poll_fn(|cx| std::task::Poll::Ready(late.as_mut().poll(cx))).await;
    assert!(
        polled.is_pending(),
        "answered at the first poll: {polled:?}"
    );
    common::eventually(
        "the server refuses the EVALSHA",
        Duration::from_secs(5),
        noscript,
    )
    .await;
    // The caller resumes only after the request deadline (at most 300 ms after the first
    // poll, and the refusal came at least 150 ms after it).
    tokio::time::sleep(request).await;
    match late.await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected Timeout, got {other:?}"),
    }
    client.shutdown().await.expect("background undos done");
    // The next grant, on the same connection after anything the late call sent, is the second:
    // the late call did not run the acquire script.
    let next = client.try_lock("late", &options).await.unwrap();
    assert_eq!(
        next.fence().get(),
        2,
        "the late call's acquire ran after its deadline"
    );
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn noscript_is_recovered_after_script_flush() {
    let server = Standalone::start();
    let client = client(&server).await;
    client
        .try_lock("n", &LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    server.node.cmd::<()>(redis::cmd("SCRIPT").arg("FLUSH"));
    let guard = client
        .try_lock("n", &LockOptions::new())
        .await
        .expect("EVAL fallback after NOSCRIPT");
    guard.release().await.expect("release after flush");
    let sha = fencelock::lua_scripts()
        .find(|s| s.name == "acquire")
        .unwrap()
        .sha1;
    let cached: Vec<i64> = server.node.cmd(redis::cmd("SCRIPT").arg("EXISTS").arg(sha));
    assert_eq!(cached, [1], "the fallback cached the script again");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_gives_errors_not_panics() {
    let server = Standalone::start();
    let client = client(&server).await;
    let ok = LockOptions::new();
    assert!(matches!(
        client.try_lock("", &ok).await,
        Err(Error::InvalidName { .. })
    ));
    assert!(matches!(
        client.lock(&"n".repeat(5000), &ok).await,
        Err(Error::InvalidName { .. })
    ));
    for bad in [
        LockOptions::new().ttl(Duration::ZERO),
        LockOptions::new().ttl(Duration::MAX),
        LockOptions::new().ttl(fencelock::MAX_TTL + Duration::from_millis(1)),
        LockOptions::new().slot(16384),
        LockOptions::new().tag(""),
    ] {
        let err = client.try_lock("n", &bad).await.unwrap_err();
        assert!(matches!(err, Error::InvalidOptions { .. }), "{err}");
        assert!(
            err.to_string().contains("\"n\""),
            "the message names the lock: {err}"
        );
    }
    let mut guard = client.try_lock("n", &ok).await.unwrap();
    assert!(matches!(
        guard.extend(Duration::ZERO).await,
        Err(Error::InvalidOptions { .. })
    ));
    guard.release().await.unwrap();

    // Braces cannot move a lock out of its reported slot.
    let guard = client.try_lock("a}{b", &ok).await.unwrap();
    assert_eq!(
        guard.keys().slot(),
        fencelock::slot_of(guard.keys().lock_key().as_bytes())
    );
    guard.release().await.unwrap();

    assert!(matches!(
        Client::connect(Vec::<String>::new()).await,
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        Client::connect(["http://127.0.0.1:1"]).await,
        Err(Error::InvalidConfig { .. })
    ));
    assert!(matches!(
        Client::builder([server.url()])
            .prefix("a{b")
            .connect()
            .await,
        Err(Error::InvalidConfig { .. })
    ));
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_and_wrong_password_are_connect_errors() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let started = std::time::Instant::now();
    let err = Client::builder([format!("redis://127.0.0.1:{closed}")])
        .connect_timeout(Duration::from_millis(500))
        .request_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Connect { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));

    let secured = Standalone::start_with_password("s3cret");
    let wrong = format!("redis://:wrong@127.0.0.1:{}", secured.node.port);
    let err = Client::connect([wrong]).await.unwrap_err();
    assert!(err.to_string().contains("authentication"), "{err}");
    assert!(
        !err.to_string().contains("wrong"),
        "the password is not shown: {err}"
    );
    let missing = format!("redis://127.0.0.1:{}", secured.node.port);
    assert!(matches!(
        Client::connect([missing]).await,
        Err(Error::Connect { .. })
    ));

    let right = Client::connect([secured.url()])
        .await
        .expect("right password");
    right
        .try_lock("p", &LockOptions::new())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_server_does_not_hang_calls() {
    let server = Standalone::start();
    let client = Client::builder([server.url()])
        .request_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let guard = client.try_lock("h", &LockOptions::new()).await.unwrap();
    server.node.pause();
    let started = std::time::Instant::now();
    let err = client
        .try_lock("h2", &LockOptions::new())
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    let err = client
        .lock(
            "h2",
            &LockOptions::new().timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap_err();
    assert!(err.is_transient(), "{err}");
    let err = guard.release().await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    server.node.resume();
}

#[tokio::test(flavor = "multi_thread")]
async fn fenced_set_rejects_lower_fences_and_reports_the_highest() {
    let server = Standalone::start();
    let client = client(&server).await;
    let old = client.try_lock("stock", &LockOptions::new()).await.unwrap();
    let old_fence = old.fence();
    server
        .node
        .cmd::<i64>(redis::cmd("DEL").arg("fencelock:{stock}:lock"));
    let new = client.try_lock("stock", &LockOptions::new()).await.unwrap();

    assert_eq!(
        client
            .fenced_set("stock:sku-1", new.fence(), "41")
            .await
            .unwrap(),
        Ok(())
    );
    assert_eq!(
        client
            .fenced_set("stock:sku-1", new.fence(), "40")
            .await
            .unwrap(),
        Ok(()),
        "the holder may write again"
    );
    let stale = client
        .fenced_set("stock:sku-1", old_fence, "99")
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!((stale.presented, stale.highest), (old_fence, new.fence()));
    let value: String = server
        .node
        .cmd(redis::cmd("HGET").arg("stock:sku-1").arg("value"));
    assert_eq!(value, "40", "the stale write was not applied");
    assert!(matches!(
        client.fenced_set("", new.fence(), "x").await,
        Err(Error::InvalidName { .. })
    ));
    // A fence field another program wrote is refused, not read as some number (`nan` admitted
    // every write, `0x10` read as 16, `1e20` overflowed the reply).
    for foreign in ["nan", "abc", "0x10", "1e20", "9007199254740992", ""] {
        let _: i64 = server.node.cmd(
            redis::cmd("HSET")
                .arg("stock:foreign")
                .arg("fence")
                .arg(foreign),
        );
        let err = client
            .fenced_set("stock:foreign", new.fence(), "1")
            .await
            .expect_err(foreign);
        assert!(
            matches!(&err, Error::Redis { .. }) && err.to_string().contains("not a fence token"),
            "{foreign:?}: {err}"
        );
    }
    new.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_count_grants_contention_and_losses() {
    let server = Standalone::start();
    let client = client(&server).await;
    let options = LockOptions::new();
    assert_eq!(client.stats(), fencelock::Stats::default());

    let held = client.try_lock("a", &options).await.unwrap();
    assert!(client.try_lock("a", &options).await.unwrap_err().is_busy());
    held.release().await.unwrap();

    let lost = client.try_lock("b", &options).await.unwrap();
    server
        .node
        .cmd::<i64>(redis::cmd("DEL").arg("fencelock:{b}:lock"));
    assert!(lost.release().await.unwrap_err().is_lock_lost());

    let mut kept = client.try_lock("c", &options).await.unwrap();
    kept.extend(Duration::from_secs(5)).await.unwrap();
    kept.release().await.unwrap();

    let unconfirmed = options.clone().wait_replicas(1, Duration::from_millis(10));
    assert!(client.try_lock("d", &unconfirmed).await.is_err());

    let stats = client.stats();
    assert_eq!(
        (
            stats.acquire_attempts,
            stats.grants,
            stats.busy,
            stats.acquire_errors,
            stats.replicas_not_confirmed,
        ),
        (5, 3, 1, 1, 1),
        "{stats:?}"
    );
    assert_eq!(
        (stats.releases, stats.extends, stats.lost),
        (2, 1, 1),
        "{stats:?}"
    );
    assert_eq!(client.clone().stats(), stats, "clones share the counters");
}

/// Two standalone servers are two places a lock could live: a client refuses them, rather than
/// keeping each lock on whichever server answered its probe first.
#[tokio::test(flavor = "multi_thread")]
async fn several_standalone_servers_are_refused_as_one_deployment() {
    let (a, b) = (Standalone::start(), Standalone::start());
    let err = Client::connect([a.url(), b.url()]).await.unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig { .. }) && err.to_string().contains("standalone"),
        "{err}"
    );
    // One of them alone is fine.
    Client::connect([a.url()]).await.unwrap();
}

/// A URL that names a user and no password authenticates as that user (with an empty
/// password), never silently as `default`.
#[tokio::test(flavor = "multi_thread")]
async fn a_url_with_a_user_and_no_password_is_that_user() {
    let server = Standalone::start();
    let _: () = server.node.cmd(
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("locks")
            .arg("on")
            .arg("nopass")
            .arg("-@all"),
    );
    let url = format!("redis://locks@127.0.0.1:{}", server.node.port);
    // The user may run nothing: its first command (the probe's INFO) is refused.
    let err = Client::connect([url]).await.map(|_| ()).unwrap_err();
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        matches!(&err, Error::Connect { .. })
            && cause
                .as_deref()
                .is_some_and(|c| c.contains("NOPERM") || c.contains("permission")),
        "{err}: {cause:?}"
    );
}
