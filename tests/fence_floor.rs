//! The client-wide fence floor (`ClientBuilder::fence_floor`, `--fence-floor`) and the
//! detection of fences that went backwards (`Stats::fence_regressions`): a re-created cluster
//! resets its config epochs, and the epoch-clock fences start lower than before.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::process::{Command, Output, Stdio};
use std::task::Poll;
use std::time::Duration;

use common::{Cluster, Standalone};
use fencelock::{Client, FenceToken, LockGuard, LockOptions, QuorumClient, MAX_FLOOR};

/// The highest `cluster_current_epoch` the nodes of `cluster` report.
fn current_epoch(cluster: &Cluster) -> u64 {
    cluster
        .nodes
        .iter()
        .map(|node| {
            let info: String = node.cmd(redis::cmd("CLUSTER").arg("INFO"));
            info.lines()
                .find_map(|line| line.strip_prefix("cluster_current_epoch:"))
                .and_then(|epoch| epoch.trim().parse().ok())
                .expect("CLUSTER INFO has cluster_current_epoch")
        })
        .max()
        .expect("the cluster has nodes")
}

/// Raises the config epochs with `rounds` `CLUSTER FAILOVER TAKEOVER`s between the master of
/// `slot` and its replica, back and forth.
fn raise_epochs(cluster: &Cluster, slot: u16, rounds: usize) {
    // The pair is read once and swapped after each round: a node's slot map read right after a
    // takeover may still name the old master, which has no replica of its own then.
    let mut master = cluster.master_of_slot(slot).port;
    let mut replica = cluster.replica_of(master).port;
    for _ in 0..rounds {
        cluster.promote(replica, "TAKEOVER", slot, &[]);
        cluster.wait_replica(master);
        std::mem::swap(&mut master, &mut replica);
    }
    cluster.wait_healthy();
}

/// Re-creates `cluster` from scratch on the same nodes, as an operator rebuilding it would:
/// `FLUSHALL` on the masters, `CLUSTER RESET HARD` on every node (new node ids, epochs back to
/// 0), then `redis-cli --cluster create` again (which hands out config epochs from 1).
fn recreate(cluster: &Cluster) {
    for node in &cluster.nodes {
        if node.info("replication").contains("role:master") {
            node.cmd::<()>(&mut redis::cmd("FLUSHALL"));
        }
    }
    for node in &cluster.nodes {
        node.cmd::<()>(redis::cmd("CLUSTER").arg("RESET").arg("HARD"));
    }
    let status = Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(cluster.nodes.iter().map(|node| node.addr()))
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .stdout(Stdio::null())
        .status()
        .expect("redis-cli must be installed");
    assert!(status.success(), "redis-cli --cluster create failed");
    cluster.wait_healthy();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_re_created_cluster_lowers_fences_which_is_detected_and_the_client_floor_lifts() {
    let cluster = Cluster::start();
    let client = Client::connect(cluster.urls()).await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .timeout(Duration::from_secs(30));
    let slot = client.keys("orders:42", &options).unwrap().slot();
    raise_epochs(&cluster, slot, 4);
    let raised = current_epoch(&cluster);
    assert!(
        raised > 6,
        "takeovers after a create of 6 nodes (epochs 1 to 6): epoch {raised}"
    );

    let guard = client.lock("orders:42", &options).await.unwrap();
    let before = guard.fence();
    guard.release().await.unwrap();
    let latch = client.latch("orders:42").unwrap();
    let generation_before = latch.set(1).await.unwrap();
    assert_eq!(client.stats().fence_regressions, 0);

    recreate(&cluster);
    let reset = current_epoch(&cluster);
    assert!(reset < raised, "re-created: epoch {reset}, was {raised}");

    // The same client, default fence mode (epoch-clock): the epoch term fell, the key is gone.
    let guard = client.lock("orders:42", &options).await.unwrap();
    let after = guard.fence();
    guard.release().await.unwrap();
    eprintln!("epochs {raised} -> {reset}: fence {before} -> {after}");
    assert!(
        after < before,
        "the fence went backwards: {before} -> {after}"
    );
    assert_eq!(
        client.stats().fence_regressions,
        1,
        "the regression is counted"
    );
    let generation_after = latch.set(1).await.unwrap();
    assert!(generation_after < generation_before);
    assert_eq!(
        client.stats().fence_regressions,
        2,
        "the latch's regression too"
    );
    // The regressed fence is the lock's new mark: later grants above it raise no alarm.
    let guard = client.lock("orders:42", &options).await.unwrap();
    assert!(guard.fence() > after);
    guard.release().await.unwrap();
    assert_eq!(client.stats().fence_regressions, 2);

    // A client with the floor set to the highest token issued before: every primitive grants
    // above it, on the re-created cluster.
    let floor = before.max(generation_before);
    let floored = Client::builder(cluster.urls())
        .fence_floor(floor)
        .connect()
        .await
        .unwrap();
    let mut fences: Vec<(&str, FenceToken)> = Vec::new();
    let guard = floored.lock("orders:42", &options).await.unwrap();
    fences.push(("mutex", guard.fence()));
    guard.release().await.unwrap();
    let guard = floored.read_lock("orders:42", &options).await.unwrap();
    fences.push(("read", guard.fence()));
    guard.release().await.unwrap();
    let guard = floored.write_lock("orders:42", &options).await.unwrap();
    fences.push(("write", guard.fence()));
    guard.release().await.unwrap();
    let guard = floored.fair_lock("orders:42", &options).await.unwrap();
    fences.push(("fair", guard.fence()));
    guard.release().await.unwrap();
    let permits = floored
        .semaphore("orders:42", 4)
        .unwrap()
        .acquire_many(2, &options)
        .await
        .unwrap();
    for permit in permits.permits() {
        fences.push(("permit", permit.fence));
    }
    permits.release().await.unwrap();
    fences.push((
        "latch",
        floored.latch("orders:42").unwrap().set(1).await.unwrap(),
    ));
    let all = floored
        .lock_all(&["orders:42", "orders:43"], &options)
        .await
        .unwrap();
    for (_, fence) in all.fences() {
        fences.push(("lock_all", fence));
    }
    all.release().await.unwrap();
    let all = floored
        .fair_lock_all(&["orders:42", "orders:43"], &options)
        .await
        .unwrap();
    for (_, fence) in all.fences() {
        fences.push(("fair_lock_all", fence));
    }
    all.release().await.unwrap();
    for (what, fence) in &fences {
        assert!(
            *fence > floor,
            "{what}: fence {fence} not above the floor {floor}"
        );
    }
    assert_eq!(floored.stats().fence_regressions, 0);

    // The floored grant raised the mutex's stored fence: the first client's next grant is
    // above the old token again, with no floor of its own.
    let guard = client.lock("orders:42", &options).await.unwrap();
    assert!(guard.fence() > before);
    guard.release().await.unwrap();
    assert_eq!(client.stats().fence_regressions, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_effective_floor_is_the_higher_of_the_client_and_the_lock_floor() {
    let server = Standalone::start();
    // Far above the server clock in µs (≈ 1.8e15 in 2026), so the floor decides the fence.
    let client_floor = FenceToken::new(4_000_000_000_000_000).unwrap();
    let client = Client::builder([server.url()])
        .fence_floor(client_floor)
        .connect()
        .await
        .unwrap();
    let lower = LockOptions::new().floor(FenceToken::new(3_000_000_000_000_000).unwrap());
    let guard = client.try_lock("a", &lower).await.unwrap();
    assert_eq!(guard.fence().get(), client_floor.get() + 1);
    guard.release().await.unwrap();
    let higher = FenceToken::new(5_000_000_000_000_000).unwrap();
    let guard = client
        .try_lock("b", &LockOptions::new().floor(higher))
        .await
        .unwrap();
    assert_eq!(guard.fence().get(), higher.get() + 1);
    guard.release().await.unwrap();
    let generation = client.latch("c").unwrap().set(0).await.unwrap();
    assert_eq!(generation.get(), client_floor.get() + 1);

    // Handed on to queued tasks of the client, by the release's call and then from the
    // fences that call reserved, with no call: still above the floor, still rising.
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = client.lock("d", &options).await.unwrap();
    let mut fences = vec![guard.fence()];
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(queued(&client, "d", options.clone()).await);
    }
    guard.release().await.unwrap();
    for waiter in waiters {
        let guard = waiter.await.unwrap();
        fences.push(guard.fence());
        guard.release().await.unwrap();
    }
    assert!(fences[0] > client_floor, "{fences:?}");
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert!(client.stats().handoffs >= 3, "{:?}", client.stats());
    assert_eq!(client.stats().fence_regressions, 0);
}

/// A lock call of `client`, polled once: a task of a client whose other task holds the lock is
/// then queued behind it.
async fn queued(
    client: &Client,
    name: &'static str,
    options: LockOptions,
) -> Pin<Box<impl Future<Output = fencelock::Result<LockGuard>>>> {
    let client = client.clone();
    let mut call = Box::pin(async move { client.lock(name, &options).await });
    std::future::poll_fn(|cx| {
        assert!(call.as_mut().poll(cx).is_pending(), "queued, not granted");
        Poll::Ready(())
    })
    .await;
    call
}

#[tokio::test(flavor = "multi_thread")]
async fn a_floor_above_the_maximum_is_refused_at_connect() {
    let server = Standalone::start();
    let above = FenceToken::new(MAX_FLOOR.get() + 1).unwrap();
    let err = Client::builder([server.url()])
        .fence_floor(above)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, fencelock::Error::InvalidConfig { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("fence floor"), "{err}");
    let ok = Client::builder([server.url()])
        .fence_floor(MAX_FLOOR)
        .connect()
        .await;
    assert!(ok.is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quorum_lock_grants_above_the_floor_of_any_deployment() {
    let servers = [
        Standalone::start(),
        Standalone::start(),
        Standalone::start(),
    ];
    let floor = FenceToken::new(4_000_000_000_000_000).unwrap();
    let builders = servers
        .iter()
        .enumerate()
        .map(|(index, server)| {
            let url = server.url();
            let builder = Client::builder([url]);
            // On one deployment only: the quorum's one fence sequence still starts above it.
            if index == 2 {
                builder.fence_floor(floor)
            } else {
                builder
            }
        })
        .collect();
    let quorum = QuorumClient::builder(builders).connect().await.unwrap();
    let guard = quorum.lock("q", &LockOptions::new()).await.unwrap();
    assert!(guard.fence() > floor, "{} <= {floor}", guard.fence());
    guard.release().await.unwrap();
}

fn fencelock(url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env_remove("FENCELOCK_URL")
        .env_remove("FENCELOCK_FENCE_FLOOR")
        .envs(env.iter().copied())
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .expect("run fencelock")
}

#[test]
fn the_cli_grants_above_fence_floor_and_refuses_a_bad_one_with_64() {
    let server = Standalone::start();
    let url = server.url();
    let floor = 4_000_000_000_000_000u64;
    let exec = ["exec", "job", "--", "sh", "-c", "echo $FENCELOCK_TOKEN"];
    let output = fencelock(
        &url,
        &[&["--fence-floor", &floor.to_string()][..], &exec[..]].concat(),
        &[],
    );
    assert!(output.status.success(), "{output:?}");
    let token: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    assert_eq!(token, floor + 1);

    let env_floor = (floor * 2).to_string();
    let output = fencelock(
        &url,
        &["latch", "set", "gate", "1"],
        &[("FENCELOCK_FENCE_FLOOR", &env_floor)],
    );
    assert!(output.status.success(), "{output:?}");
    let generation: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .unwrap();
    assert_eq!(generation, floor * 2 + 1);

    for bad in ["0", "-1", "soon", &(MAX_FLOOR.get() + 1).to_string()] {
        let output = fencelock(
            &url,
            &[&[format!("--fence-floor={bad}").as_str()][..], &exec[..]].concat(),
            &[],
        );
        assert_eq!(output.status.code(), Some(64), "{bad}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("--fence-floor"), "{bad}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{bad}: {stderr}");
    }
    let output = fencelock(&url, &exec, &[("FENCELOCK_FENCE_FLOOR", "soon")]);
    assert_eq!(output.status.code(), Some(64), "{output:?}");

    for command in [&["exec", "--help"][..], &["latch", "set", "--help"][..]] {
        let output = fencelock(&url, command, &[]);
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{output:?}");
        assert!(
            help.contains("--fence-floor <TOKEN>") && help.contains("[env: FENCELOCK_FENCE_FLOOR"),
            "{command:?}: {help}"
        );
    }
}
