//! Failover on a real cluster: killed and paused masters, promoted replicas, lost writes.

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, NODE_TIMEOUT};
use fencelock::{Client, FenceMode, FenceToken, LockOptions};

/// Grants `rounds` holds of `name` and returns the highest fence.
async fn grant(client: &Client, name: &str, options: &LockOptions, rounds: usize) -> FenceToken {
    let mut highest = None;
    for _ in 0..rounds {
        let guard = client.lock(name, options).await.expect("grant");
        highest = highest.max(Some(guard.fence()));
        guard.release().await.expect("release");
    }
    highest.expect("at least one round")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_master_does_not_hang_calls_and_promotion_restores_acquisition() {
    let cluster = Cluster::start();
    let client = Client::builder(cluster.urls())
        .request_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let guard = client.try_lock("acct:1", &options).await.unwrap();
    let (slot, before) = (guard.keys().slot(), guard.fence());
    guard.release().await.unwrap();
    let master = cluster.master_of_slot(slot);
    let (master_port, replica_port) = (master.port, cluster.replica_of(master.port).port);

    master.pause();
    for _ in 0..3 {
        let started = Instant::now();
        let err = client.try_lock("acct:1", &options).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "bounded: {:?}",
            started.elapsed()
        );
    }

    cluster.promote(replica_port, "TAKEOVER", slot, &[master_port]);
    let promoted = Instant::now();
    let guard = client
        .lock("acct:1", &options.clone().timeout(Duration::from_secs(20)))
        .await
        .expect("acquisition succeeds again after promotion");
    let recovered = promoted.elapsed();
    eprintln!("paused master: acquisition recovered {recovered:?} after the promotion");
    assert!(
        recovered < NODE_TIMEOUT + Duration::from_secs(3),
        "recovered after {recovered:?}"
    );
    assert!(guard.fence() > before);
    guard.release().await.unwrap();

    master.resume();
    cluster.wait_healthy();
    let guard = client
        .try_lock("acct:1", &options)
        .await
        .expect("after the old master rejoined");
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn forced_loss_keeps_clock_and_epoch_fences_monotonic_while_a_plain_counter_regresses() {
    forced_loss(Cluster::start()).await;
}

/// The same on nodes that load fencelock's Redis module: the clients' acquires and releases go
/// through it (its cached config epoch, `docs/safety.md`, "The module's epoch read").
#[tokio::test(flavor = "multi_thread")]
async fn forced_loss_keeps_fences_monotonic_through_the_module() {
    let served = forced_loss(Cluster::start_with_module()).await;
    assert!(served > 0, "the module served the calls");
}

/// Runs the forced-loss check on `cluster`; returns how many calls the module served.
async fn forced_loss(mut cluster: Cluster) -> u64 {
    let fenced = Client::connect(cluster.urls()).await.unwrap();
    let epoch = Client::builder(cluster.urls())
        .fence_mode(FenceMode::Epoch)
        .connect()
        .await
        .unwrap();
    let plain = Client::builder(cluster.urls())
        .fence_mode(FenceMode::Counter)
        .connect()
        .await
        .unwrap();
    // Both locks in one slot, so one failover hits both.
    let options = LockOptions::new()
        .tag("acct")
        .timeout(Duration::from_secs(20));
    let confirmed = options.clone().wait_replicas(1, Duration::from_secs(2));
    grant(&fenced, "clock", &confirmed, 1).await;
    grant(&plain, "counter", &confirmed, 1).await;
    grant(&epoch, "epoch", &confirmed, 1).await;

    let slot = fenced.keys("clock", &options).unwrap().slot();
    let master_port = cluster.master_of_slot(slot).port;
    let replica_port = cluster.replica_of(master_port).port;

    cluster.cut_off_replica(master_port, replica_port);
    let clock_before = grant(&fenced, "clock", &options, 8).await;
    let counter_before = grant(&plain, "counter", &options, 8).await;
    let epoch_before = grant(&epoch, "epoch", &options, 8).await;

    cluster.take_over_with_lagging_replica(master_port, replica_port, slot);

    let after = fenced
        .lock("clock", &options)
        .await
        .expect("clock lock after failover");
    assert!(
        after.fence() > clock_before,
        "clock mode: {} after failover must exceed {} granted before",
        after.fence(),
        clock_before
    );
    let after_fence = after.fence();
    after.release().await.unwrap();

    let epoch_after = epoch
        .lock("epoch", &options)
        .await
        .expect("epoch lock after failover");
    assert!(
        epoch_after.fence() > epoch_before,
        "epoch mode: {} after failover must exceed {}",
        epoch_after.fence(),
        epoch_before
    );
    eprintln!(
        "forced loss: epoch mode {epoch_before} -> {}",
        epoch_after.fence()
    );
    epoch_after.release().await.unwrap();

    let regressed = plain
        .lock("counter", &options)
        .await
        .expect("counter lock after failover");
    assert!(
        regressed.fence() <= counter_before,
        "the baseline shows the loss: {} after failover, {} before",
        regressed.fence(),
        counter_before
    );
    eprintln!(
        "forced loss: clock {clock_before} -> {}; plain counter {counter_before} -> {}",
        after_fence,
        regressed.fence()
    );
    regressed.release().await.unwrap();
    fenced.stats().module_calls + epoch.stats().module_calls
}

/// `cluster_my_epoch` and `master_replid` of a node, as a granting script would read them.
fn epoch_and_replid(node: &common::Node) -> (u64, String) {
    let info: String = node.cmd(redis::cmd("CLUSTER").arg("INFO"));
    let field = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .expect("field present")
    };
    let epoch = field(&info, "cluster_my_epoch:").parse().unwrap();
    (epoch, field(&node.info("replication"), "master_replid:"))
}

/// Why the default fence mode reads the epoch afresh in every granting call (docs/safety.md,
/// "A cheaper epoch read"): a slot leaves master A, its lock is granted on B, B loses those
/// grants in a forced failover, and the slot comes back to A before the promoted replica
/// grants. The key is back on the same incarnation of A (same replication id) with nothing
/// of B's grants in it, yet they were handed out with B's higher epoch; only A's fresh epoch,
/// bumped by the import, lifts its next fence above them. An epoch cached in the key with A's
/// replication id would have granted below them.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_round_trip_with_forced_loss_keeps_epoch_clock_fences_monotonic() {
    slot_round_trip(Cluster::start()).await;
}

/// The same on nodes that load the module: the importer's config epoch is bumped by
/// `CLUSTER SETSLOT … NODE` with no server event, so the module's cached epoch must not be
/// used across it.
#[tokio::test(flavor = "multi_thread")]
async fn a_slot_round_trip_with_forced_loss_keeps_fences_monotonic_through_the_module() {
    let served = slot_round_trip(Cluster::start_with_module()).await;
    assert!(served > 0, "the module served the calls");
}

/// Runs the slot round trip on `cluster`; returns how many calls the module served.
async fn slot_round_trip(mut cluster: Cluster) -> u64 {
    let client = Client::connect(cluster.urls()).await.unwrap();
    let options = LockOptions::new()
        .tag("trip")
        .timeout(Duration::from_secs(20));
    let name = "round";
    let slot = client.keys(name, &options).unwrap().slot();
    grant(&client, name, &options, 3).await;
    let a = cluster.master_of_slot(slot).port;
    let b = cluster
        .nodes
        .iter()
        .find(|n| n.port != a && n.info("replication").contains("role:master"))
        .unwrap()
        .port;
    let b_replica = cluster.replica_of(b).port;
    let (a_epoch, a_replid) = epoch_and_replid(cluster.node(a));

    cluster.migrate_slot(slot, a, b, || {});
    let synced: i64 = cluster.node(b).cmd(redis::cmd("WAIT").arg(1).arg(5000));
    assert_eq!(synced, 1, "B's replica holds the migrated key");
    cluster.cut_off_replica(b, b_replica);
    let lost = grant(&client, name, &options, 8).await;
    let (b_epoch, _) = epoch_and_replid(cluster.node(b));
    cluster.take_over_with_lagging_replica(b, b_replica, slot);
    cluster.migrate_slot(slot, b_replica, a, || {});

    let (a_epoch_after, a_replid_after) = epoch_and_replid(cluster.node(a));
    assert_eq!(a_replid_after, a_replid, "A is the same incarnation");
    assert!(
        a_epoch_after > b_epoch && b_epoch > a_epoch,
        "epochs: A {a_epoch} -> {a_epoch_after}, B {b_epoch}"
    );
    let time: Vec<u64> = cluster.node(a).cmd(&mut redis::cmd("TIME"));
    let cached = time[0] * 1_000_000 + time[1] + (a_epoch << 34) + 1;
    assert!(
        cached <= lost.get(),
        "a grant with A's cached epoch ({cached}) would have gone below B's lost {lost}"
    );
    let after = client.lock(name, &options).await.expect("grant back on A");
    eprintln!(
        "slot round trip: lost on B {lost}, after on A {} (with A's old epoch: {cached})",
        after.fence()
    );
    assert!(
        after.fence() > lost,
        "token {} after the round trip must exceed {lost}",
        after.fence()
    );
    after.release().await.unwrap();
    client.stats().module_calls
}

/// Runs `fencelock exec` against every node of `cluster` and returns its exit code, the token
/// the command saw, and how long it took.
fn cli_exec(cluster: &Cluster, args: &[&str]) -> (Option<i32>, Option<u64>, Duration) {
    let started = Instant::now();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env("FENCELOCK_URL", cluster.urls().join(","))
        .arg("exec")
        .args(args)
        .args(["--", "sh", "-c", "echo $FENCELOCK_TOKEN"])
        .output()
        .expect("run fencelock");
    let token = String::from_utf8_lossy(&output.stdout).trim().parse().ok();
    if !output.status.success() {
        eprintln!("fencelock: {}", String::from_utf8_lossy(&output.stderr));
    }
    (output.status.code(), token, started.elapsed())
}

fn slot_of_lock(name: &str) -> u16 {
    fencelock::LockKeys::new("fencelock", name, &fencelock::Placement::ByName)
        .unwrap()
        .slot()
}

#[test]
fn forced_loss_through_the_cli_yields_a_token_above_every_earlier_one() {
    let mut cluster = Cluster::start();
    let name = "cli:loss";
    let slot = slot_of_lock(name);
    let (code, _, _) = cli_exec(
        &cluster,
        &["--wait-replicas", "1", "--wait-timeout", "2s", name],
    );
    assert_eq!(code, Some(0), "confirmed first grant");
    let master_port = cluster.master_of_slot(slot).port;
    let replica_port = cluster.replica_of(master_port).port;

    cluster.cut_off_replica(master_port, replica_port);
    let before: Vec<u64> = (0..8)
        .map(|_| {
            let (code, token, _) = cli_exec(&cluster, &[name]);
            assert_eq!(code, Some(0));
            token.expect("the command printed its token")
        })
        .collect();

    cluster.take_over_with_lagging_replica(master_port, replica_port, slot);

    let (code, after, _) = cli_exec(&cluster, &["--timeout", "20s", name]);
    assert_eq!(code, Some(0));
    let after = after.expect("token after failover");
    let highest = *before.iter().max().unwrap();
    eprintln!("CLI forced loss: tokens before {before:?}, after failover {after}");
    assert!(
        after > highest,
        "token {after} after failover must exceed {highest}"
    );
}

#[test]
fn a_paused_master_does_not_hang_the_cli() {
    let cluster = Cluster::start();
    let name = "cli:paused";
    let slot = slot_of_lock(name);
    let master = cluster.master_of_slot(slot);
    let replica = cluster.replica_of(master.port);

    // With the replica able to take over, the command gets the lock once it has.
    master.pause();
    let (code, token, took) = cli_exec(&cluster, &["--timeout", "20s", name]);
    eprintln!("paused master, replica promoted by the cluster: exit {code:?} after {took:?}");
    assert_eq!(code, Some(0), "acquired through the promoted replica");
    assert!(token.is_some());
    assert!(took < Duration::from_secs(20), "took {took:?}");

    // With no replica left to promote, the command gives up by its deadline, reporting the
    // cluster down.
    let new_master = cluster.master_of_slot(slot);
    assert_eq!(new_master.port, replica.port);
    replica.pause();
    let (code, _, took) = cli_exec(&cluster, &["--timeout", "3s", name]);
    eprintln!("slot without a live master: exit {code:?} after {took:?}");
    assert_eq!(code, Some(69), "unavailable: the slot has no master");
    assert!(
        took < Duration::from_secs(3) + Duration::from_secs(2) + Duration::from_secs(2),
        "bounded by --timeout plus one request timeout: {took:?}"
    );
    replica.resume();
    master.resume();
}

/// A client given one seed, the master that then stops answering: after the promotion it
/// reaches the cluster through the nodes the slot map named, not only through its seed.
#[tokio::test(flavor = "multi_thread")]
async fn a_client_whose_one_seed_stopped_answering_reaches_the_promoted_replica() {
    let cluster = Cluster::start();
    let probe = Client::connect(cluster.urls()).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let slot = probe
        .try_lock("acct:2", &options)
        .await
        .unwrap()
        .keys()
        .slot();
    let master = cluster.master_of_slot(slot);
    let (master_port, replica_port) = (master.port, cluster.replica_of(master.port).port);
    let client = Client::builder([format!("redis://127.0.0.1:{master_port}")])
        .request_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    client
        .lock("acct:2", &options.clone().timeout(Duration::from_secs(10)))
        .await
        .expect("before the pause")
        .release()
        .await
        .unwrap();

    master.pause();
    cluster.promote(replica_port, "TAKEOVER", slot, &[master_port]);
    let guard = client
        .lock("acct:2", &options.clone().timeout(Duration::from_secs(20)))
        .await
        .expect("acquisition through the promoted replica, with the one seed paused");
    guard.release().await.unwrap();
    master.resume();
}
