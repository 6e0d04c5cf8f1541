//! The countdown latch on real servers: set / count-down / wait, one count per id (also for a
//! resent script), wake-up delay of many waiters, generations that keep rounds apart, a
//! never-set latch, the open state's lifetime, cancel safety and bad input.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, Cluster, Node, Standalone};
use fencelock::{Client, Error, FenceMode, FenceToken, MAX_LATCH_COUNT};

/// The source of fencelock's script `name`.
fn script(name: &str) -> &'static str {
    fencelock::lua_scripts()
        .find(|s| s.name == name)
        .expect("script exists")
        .source
}

/// Exactly the call the library sends for a count-down, run by hand (as redis-rs resends it).
fn raw_count_down(node: &Node, key: &str, id: &str) -> Vec<i64> {
    node.cmd(
        redis::cmd("EVAL")
            .arg(script("latch_count_down"))
            .arg(1)
            .arg(key)
            .arg(id)
            .arg("")
            .arg("p")
            .arg(3_600_000)
            .arg(10_000),
    )
}

fn raw_set(node: &Node, key: &str, count: u64, set_id: &str) -> Vec<i64> {
    node.cmd(
        redis::cmd("EVAL")
            .arg(script("latch_set"))
            .arg(1)
            .arg(key)
            .arg(count)
            .arg(set_id)
            .arg(0)
            .arg("clock")
            .arg("p")
            .arg(3_600_000)
            .arg(10_000),
    )
}

fn pubsub_subscribers(node: &Node, channel: &str) -> i64 {
    let reply: Vec<redis::Value> = node.cmd(redis::cmd("PUBSUB").arg("NUMSUB").arg(channel));
    reply
        .get(1)
        .map(|v| redis::from_redis_value(v.clone()).unwrap())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_count_down_and_wait() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let latch = client.latch("basic").unwrap();
    assert_eq!(latch.key(), "fencelock:{basic}:latch");

    let generation = latch.set(3).await.unwrap();
    assert_eq!(latch.count().await.unwrap(), Some((generation, 3)));
    let waiter = {
        let latch = latch.clone();
        tokio::spawn(async move { latch.wait(Duration::from_secs(10)).await })
    };
    assert_eq!(latch.count_down("a").await.unwrap(), 2);
    assert_eq!(latch.count_down("b").await.unwrap(), 1);
    // Waiting while the count is above zero: the waiter is still there.
    eventually("the waiter to look twice", Duration::from_secs(5), || {
        client.stats().busy >= 2
    })
    .await;
    assert!(!waiter.is_finished());
    assert_eq!(latch.count_down("c").await.unwrap(), 0);
    assert_eq!(waiter.await.unwrap().unwrap(), generation);
    assert_eq!(latch.count().await.unwrap(), Some((generation, 0)));
    // Open stays open: a later wait returns at once, a later count-down changes nothing.
    assert_eq!(latch.wait(Duration::ZERO).await.unwrap(), generation);
    assert_eq!(latch.count_down("d").await.unwrap(), 0);
    // The open latch kept no ids.
    let fields: Vec<String> = server.node.cmd(redis::cmd("HKEYS").arg(latch.key()));
    assert!(fields.iter().all(|f| !f.starts_with("d:")), "{fields:?}");

    // set(0) opens a new generation at once.
    let zero = latch.set(0).await.unwrap();
    assert!(zero > generation);
    assert_eq!(latch.wait(Duration::ZERO).await.unwrap(), zero);
}

#[tokio::test]
async fn an_id_counts_once_also_when_the_script_is_resent() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let latch = client.latch("once").unwrap();
    let generation = latch.set(3).await.unwrap();

    assert_eq!(latch.count_down("worker-1").await.unwrap(), 2);
    assert_eq!(latch.count_down("worker-1").await.unwrap(), 2, "same id");
    // The same invocation twice, as redis-rs resends it after a lost reply.
    let first = raw_count_down(&server.node, latch.key(), "worker-2");
    let resent = raw_count_down(&server.node, latch.key(), "worker-2");
    assert_eq!(first, vec![1, generation.get() as i64, 1]);
    assert_eq!(resent, first, "a resent count-down answers the same");
    assert_eq!(latch.count().await.unwrap(), Some((generation, 1)));

    // A resent set starts no second generation.
    let set_id = "0123456789abcdef0123456789abcdef";
    let started = raw_set(&server.node, latch.key(), 2, set_id);
    let again = raw_set(&server.node, latch.key(), 2, set_id);
    assert_eq!(started[0], 1);
    assert!(started[1] > generation.get() as i64);
    assert_eq!(
        again,
        vec![2, started[1], 0],
        "a resent set changes nothing"
    );
    assert_eq!(latch.count_down("worker-1").await.unwrap(), 1);
    assert_eq!(
        latch.count().await.unwrap(),
        Some((FenceToken::new(started[1] as u64).unwrap(), 1)),
        "the resent set did not reset the count"
    );
}

/// 20 waiters over 4 clients on a cluster (sharded pub/sub): all return within milliseconds of
/// the last count-down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_waiters_wake_within_milliseconds_of_the_last_count_down() {
    let cluster = Cluster::start();
    let counter = Client::connect(cluster.urls()).await.unwrap();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(Client::connect(cluster.urls()).await.unwrap());
    }
    let latch = counter.latch("wake:many").unwrap();
    let mut delays = Vec::new();
    for round in 0..3 {
        let generation = latch.set(2).await.unwrap();
        latch.count_down("first").await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..20 {
            let latch = clients[i % clients.len()].latch("wake:many").unwrap();
            tasks.push(tokio::spawn(async move {
                let opened = latch.wait(Duration::from_secs(20)).await;
                (opened, Instant::now())
            }));
        }
        // Each waiter looks once, subscribes, and looks again before it sleeps: 2 busy answers.
        eventually("all 20 waiters subscribed", Duration::from_secs(10), || {
            clients.iter().map(|c| c.stats().busy).sum::<u64>() >= 40 * (round + 1)
        })
        .await;
        let sent = Instant::now();
        assert_eq!(latch.count_down("last").await.unwrap(), 0);
        let mut max = Duration::ZERO;
        for task in tasks {
            let (opened, at) = task.await.unwrap();
            assert_eq!(opened.unwrap(), generation);
            max = max.max(at.saturating_duration_since(sent));
        }
        delays.push(max);
    }
    println!("latch wake-up: max delay of 20 waiters (4 clients) after the last count-down was sent, per round: {delays:?}");
    for delay in &delays {
        assert!(*delay < Duration::from_millis(500), "{delays:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rearmed_latch_is_never_mistaken_for_the_previous_round() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let latch = client.latch("rounds").unwrap();
    let g1 = latch.set(1).await.unwrap();
    let mut waiters = Vec::new();
    for _ in 0..5 {
        let latch = latch.clone();
        waiters.push(tokio::spawn(async move {
            latch.wait(Duration::from_secs(10)).await
        }));
    }
    eventually("the waiters subscribed", Duration::from_secs(5), || {
        client.stats().busy >= 10
    })
    .await;

    // The last count-down of round 1 and the re-arm in one transaction: no waiter can see
    // round 1 open before round 2 is armed.
    let mut conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let (down, set): (Vec<i64>, Vec<i64>) = redis::pipe()
        .atomic()
        .cmd("EVAL")
        .arg(script("latch_count_down"))
        .arg(1)
        .arg(latch.key())
        .arg("only")
        .arg("")
        .arg("p")
        .arg(3_600_000)
        .arg(10_000)
        .cmd("EVAL")
        .arg(script("latch_set"))
        .arg(1)
        .arg(latch.key())
        .arg(1)
        .arg("set-of-round-2")
        .arg(0)
        .arg("clock")
        .arg("p")
        .arg(3_600_000)
        .arg(10_000)
        .query(&mut conn)
        .unwrap();
    assert_eq!(down, vec![1, g1.get() as i64, 0]);
    let g2 = FenceToken::new(set[1] as u64).unwrap();
    assert!(g2 > g1);
    for waiter in waiters {
        assert_eq!(
            waiter.await.unwrap().unwrap(),
            g1,
            "round 1 opened, though round 2 was armed at once"
        );
    }

    // Round 2 is armed: a new waiter does not take round 1's opening for it.
    match latch.wait(Duration::from_millis(300)).await {
        Err(Error::LatchNotOpen {
            remaining: Some(1), ..
        }) => {}
        other => panic!("expected LatchNotOpen with 1 outstanding, got {other:?}"),
    }
    // A count-down for round 1 does not count in round 2.
    match latch.count_down_in(g1, "late").await {
        Err(Error::CountDownRefused {
            generation: Some(g),
            current: Some(c),
            ..
        }) => assert_eq!((g, c), (g1, g2)),
        other => panic!("expected CountDownRefused, got {other:?}"),
    }
    assert_eq!(latch.count().await.unwrap(), Some((g2, 1)));
    assert_eq!(latch.count_down_in(g2, "only").await.unwrap(), 0);
    assert_eq!(latch.wait(Duration::ZERO).await.unwrap(), g2);

    // A round re-armed before it opened: its waiters follow the new round.
    let g3 = latch.set(1).await.unwrap();
    let other = Client::connect([server.url()]).await.unwrap();
    let follower = {
        let latch = other.latch("rounds").unwrap();
        tokio::spawn(async move { latch.wait(Duration::from_secs(10)).await })
    };
    eventually("the follower subscribed", Duration::from_secs(5), || {
        other.stats().busy >= 2
    })
    .await;
    let g4 = latch.set(1).await.unwrap();
    assert!(g4 > g3);
    latch.count_down("x").await.unwrap();
    assert_eq!(follower.await.unwrap().unwrap(), g4);
}

#[tokio::test]
async fn a_never_set_latch_is_not_open() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let latch = client.latch("never").unwrap();
    assert_eq!(latch.count().await.unwrap(), None);
    let started = Instant::now();
    let err = latch.wait(Duration::from_millis(300)).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        matches!(
            err,
            Error::LatchNotOpen {
                remaining: None,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("not set"), "{err}");
    let err = latch.count_down("x").await.unwrap_err();
    assert!(
        matches!(err, Error::CountDownRefused { current: None, .. }),
        "{err:?}"
    );
    assert_eq!(
        server
            .node
            .cmd::<i64>(redis::cmd("EXISTS").arg(latch.key())),
        0
    );
}

#[tokio::test]
async fn the_open_state_stays_visible_then_expires() {
    let server = Standalone::start();
    let client = Client::builder([server.url()])
        .expiry_grace(Duration::ZERO)
        .connect()
        .await
        .unwrap();
    let latch = client
        .latch("ttl")
        .unwrap()
        .with_open_ttl(Duration::from_millis(400))
        .unwrap();
    let g1 = latch.set(1).await.unwrap();
    let pttl = |node: &Node| node.cmd::<i64>(redis::cmd("PTTL").arg(latch.key()));
    assert_eq!(pttl(&server.node), -1, "an armed latch does not expire");
    latch.count_down("a").await.unwrap();
    let left = pttl(&server.node);
    assert!(left > 0 && left <= 400, "open for the open TTL: {left}");
    assert_eq!(latch.wait(Duration::ZERO).await.unwrap(), g1);
    eventually("the open latch to expire", Duration::from_secs(5), || {
        server
            .node
            .cmd::<i64>(redis::cmd("EXISTS").arg(latch.key()))
            == 0
    })
    .await;
    assert_eq!(
        latch.count().await.unwrap(),
        None,
        "expired reads as not set"
    );
    assert!(matches!(
        latch.wait(Duration::ZERO).await,
        Err(Error::LatchNotOpen {
            remaining: None,
            ..
        })
    ));
    let g2 = latch.set(1).await.unwrap();
    assert!(g2 > g1, "the next generation is above the expired one");

    // Counter mode keeps the key (it holds the only record of the generations).
    let counting = Client::builder([server.url()])
        .fence_mode(FenceMode::Counter)
        .connect()
        .await
        .unwrap();
    let kept = counting.latch("kept").unwrap();
    kept.set(0).await.unwrap();
    assert_eq!(
        server.node.cmd::<i64>(redis::cmd("PTTL").arg(kept.key())),
        -1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_leaves_no_subscription() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let latch = client.latch("dropped").unwrap();
    latch.set(1).await.unwrap();
    let waiter = {
        let latch = latch.clone();
        tokio::spawn(async move { latch.wait(Duration::from_secs(30)).await })
    };
    eventually("the subscription", Duration::from_secs(5), || {
        pubsub_subscribers(&server.node, latch.key()) == 1
    })
    .await;
    waiter.abort();
    let _ = waiter.await;
    eventually("the unsubscription", Duration::from_secs(5), || {
        pubsub_subscribers(&server.node, latch.key()) == 0
    })
    .await;
    assert_eq!(latch.count().await.unwrap().map(|(_, n)| n), Some(1));
}

#[tokio::test]
async fn bad_input_is_an_error() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    assert!(matches!(client.latch(""), Err(Error::InvalidName { .. })));
    let latch = client.latch("bad").unwrap();
    assert!(matches!(
        latch.set(MAX_LATCH_COUNT + 1).await,
        Err(Error::InvalidOptions { .. })
    ));
    latch.set(MAX_LATCH_COUNT).await.unwrap();
    assert_eq!(latch.count_down("a").await.unwrap(), MAX_LATCH_COUNT - 1);
    assert!(matches!(
        latch.count_down("").await,
        Err(Error::InvalidOptions { .. })
    ));
    assert!(matches!(
        latch.clone().with_open_ttl(Duration::ZERO),
        Err(Error::InvalidOptions { .. })
    ));
    // Another type under the latch's key: an error naming the latch, no panic.
    server
        .node
        .cmd::<()>(redis::cmd("SET").arg("fencelock:{typed}:latch").arg("x"));
    let typed = client.latch("typed").unwrap();
    let err = typed.set(1).await.unwrap_err();
    assert!(err.to_string().contains("typed"), "{err}");
}

#[test]
fn an_opened_latch_keeps_its_key_until_its_generation_has_passed() {
    let server = Standalone::start();
    let key = "fencelock:{ahead}:latch";
    // A generation far ahead of the clock (a floor carried over, or a clock that was ahead):
    // open TTL 1 s, grace 5 s.
    let set = |set_id: &str, floor: u64| -> Vec<i64> {
        server.node.cmd(
            redis::cmd("EVAL")
                .arg(script("latch_set"))
                .arg(1)
                .arg(key)
                .arg(1)
                .arg(set_id)
                .arg(floor)
                .arg("clock")
                .arg("p")
                .arg(1_000)
                .arg(5_000),
        )
    };
    let expires_at = || -> i64 { server.node.cmd(redis::cmd("PEXPIRETIME").arg(key)) };
    // Opened by its count-down.
    let generation = set("set-1", 8_000_000_000_000_000)[1];
    let counted: Vec<i64> = server.node.cmd(
        redis::cmd("EVAL")
            .arg(script("latch_count_down"))
            .arg(1)
            .arg(key)
            .arg("id-1")
            .arg("")
            .arg("p")
            .arg(1_000)
            .arg(5_000),
    );
    assert_eq!(counted, [1, generation, 0]);
    assert!(
        expires_at() >= generation / 1000 + 5_000,
        "the key would expire before generation {generation} is the server's time: {}",
        expires_at()
    );
    // Opened by an operator.
    let generation = set("set-2", 9_000_000_000_000_000)[1];
    let _: redis::Value = server.node.cmd(
        redis::cmd("EVAL")
            .arg(script("latch_force_unlock"))
            .arg(1)
            .arg(key)
            .arg("p")
            .arg(1_000)
            .arg(5_000),
    );
    let count: Option<String> = server.node.cmd(redis::cmd("HGET").arg(key).arg("count"));
    assert_eq!(count.as_deref(), Some("0"), "opened");
    assert!(
        expires_at() >= generation / 1000 + 5_000,
        "forced: {} for generation {generation}",
        expires_at()
    );
}
