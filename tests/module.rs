//! The client with fencelock's Redis module (issue 24): it finds the module by itself and sends
//! the mutex's acquire and release as the module's commands, falls back to the scripts where
//! the module declines or a node lacks it, fails clearly when the module is required and
//! missing, and shares one lock with clients and servers that use the scripts.

mod common;

use std::time::Duration;

use common::{Cluster, Standalone};
use fencelock::{Client, Error, FenceMode, FenceToken, LockOptions, ModuleUse};

/// Takes and releases `rounds` holds of `name`; returns the fences in order.
async fn cycle(client: &Client, name: &str, rounds: usize) -> Vec<FenceToken> {
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let mut fences = Vec::new();
    for _ in 0..rounds {
        let guard = client.lock(name, &options).await.expect("grant");
        fences.push(guard.fence());
        guard.release().await.expect("release");
    }
    fences
}

fn strictly_increasing(fences: &[FenceToken]) -> bool {
    fences.windows(2).all(|w| w[0] < w[1])
}

#[tokio::test(flavor = "multi_thread")]
async fn the_module_serves_the_mutex_and_shares_the_lock_with_script_clients() {
    let server = Standalone::start_with_module();
    let module = Client::connect([server.url()]).await.unwrap();
    let scripts = Client::builder([server.url()])
        .module(ModuleUse::Off)
        .connect()
        .await
        .unwrap();
    let mut fences = Vec::new();
    for _ in 0..5 {
        fences.extend(cycle(&module, "shared", 2).await);
        fences.extend(cycle(&scripts, "shared", 2).await);
    }
    assert!(strictly_increasing(&fences), "fences {fences:?}");
    let stats = module.stats();
    assert_eq!(
        stats.module_calls, 20,
        "10 grants and 10 releases: {stats:?}"
    );
    assert_eq!(stats.module_fallbacks, 0, "{stats:?}");
    assert_eq!(scripts.stats().module_calls, 0);
    assert_eq!(server.node.calls("fencelock.acquire"), 10);
    assert_eq!(server.node.calls("fencelock.release"), 10);

    // Held through the module, refused to the script client, and the reverse.
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let held = module.try_lock("swap", &options).await.unwrap();
    let refused = scripts.try_lock("swap", &options).await.unwrap_err();
    assert!(refused.is_busy(), "{refused:?}");
    held.release().await.unwrap();
    let held = scripts.try_lock("swap", &options).await.unwrap();
    let refused = module.try_lock("swap", &options).await.unwrap_err();
    assert!(refused.is_busy(), "{refused:?}");
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn what_the_module_declines_runs_as_the_script() {
    let server = Standalone::start_with_module();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    // Re-entry: the module leaves a re-entered lock's release to the script.
    let outer = client.lock("again", &options).await.unwrap();
    let inner = outer.reentry().lock().await.unwrap();
    let outer_fence = outer.fence();
    assert_eq!(inner.fence(), outer_fence);
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    let next = client.try_lock("again", &options).await.unwrap();
    assert!(next.fence() > outer_fence);
    next.release().await.unwrap();
    // The grant went through the module; the first release it declined went as the script,
    // and so did every later call for that key's slot for a second (no round trip lost on a
    // key the module would decline again).
    let stats = client.stats();
    assert_eq!(stats.module_calls, 1, "{stats:?}");
    assert_eq!(stats.module_fallbacks, 1, "{stats:?}");

    // A waiter across clients: busy answers, then a grant once the holder releases.
    let other = Client::connect([server.url()]).await.unwrap();
    let held = client.lock("queue", &options).await.unwrap();
    let waiting = {
        let other = other.clone();
        let options = options.clone().timeout(Duration::from_secs(10));
        tokio::spawn(async move { other.lock("queue", &options).await })
    };
    common::eventually(
        "the waiter was refused at least once",
        Duration::from_secs(10),
        || other.stats().busy >= 1,
    )
    .await;
    let held_fence = held.fence();
    held.release().await.unwrap();
    let taken = waiting.await.unwrap().expect("the waiter gets the lock");
    assert!(taken.fence() > held_fence);
    taken.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_without_the_module_runs_the_scripts_or_fails_when_it_is_required() {
    let server = Standalone::start();
    let auto = Client::connect([server.url()]).await.unwrap();
    let fences = cycle(&auto, "plain", 3).await;
    assert!(strictly_increasing(&fences));
    let stats = auto.stats();
    assert_eq!(stats.module_calls, 0, "{stats:?}");
    assert_eq!(
        stats.module_fallbacks, 1,
        "one call finds the module missing: {stats:?}"
    );

    let refused = Client::builder([server.url()])
        .module(ModuleUse::Required)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::Connect { .. }), "{refused:?}");
    assert!(
        refused.to_string().contains("ModuleUse::Required"),
        "{refused}"
    );
    assert!(
        !server.node.held("fencelock:{plain}:lock"),
        "nothing written"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_that_unloads_the_module_makes_calls_fall_back_not_fail() {
    let server = Standalone::start_with_module();
    let client = Client::connect([server.url()]).await.unwrap();
    let mut fences = cycle(&client, "unload", 3).await;
    assert_eq!(client.stats().module_calls, 6);
    let held = client
        .lock("unload", &LockOptions::new().ttl(Duration::from_secs(10)))
        .await
        .unwrap();
    fences.push(held.fence());
    let required = Client::builder([server.url()])
        .module(ModuleUse::Required)
        .connect()
        .await
        .expect("the module is loaded");
    let _: () = server
        .node
        .cmd(redis::cmd("MODULE").arg("UNLOAD").arg("fencelock"));
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let err = required.try_lock("unload2", &options).await.unwrap_err();
    assert!(matches!(err, Error::ModuleMissing { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("\"unload2\"") && text.contains("MODULE LOAD") && text.contains("Auto"),
        "{text}"
    );
    assert!(
        !server.node.held("fencelock:{unload2}:lock"),
        "nothing written"
    );
    held.release().await.expect("released through the script");
    fences.extend(cycle(&client, "unload", 3).await);
    assert!(strictly_increasing(&fences), "{fences:?}");
    let stats = client.stats();
    assert_eq!(stats.module_calls, 7, "{stats:?}");
    assert_eq!(stats.module_fallbacks, 1, "{stats:?}");
}

/// 32 tasks, a lock each: `count` grants and releases through the module.
async fn many_tasks(client: &Client, count: usize) {
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { cycle(&client, &format!("many{i}"), count).await })
        })
        .collect();
    for task in tasks {
        let fences = task.await.unwrap();
        assert!(strictly_increasing(&fences), "{fences:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_tasks_go_through_the_module_in_batches() {
    let server = Standalone::start_with_module();
    let client = Client::connect([server.url()]).await.unwrap();
    many_tasks(&client, 10).await;
    let stats = client.stats();
    assert_eq!(stats.grants, 320, "{stats:?}");
    assert_eq!(stats.module_calls, 640, "{stats:?}");
    assert_eq!(stats.module_fallbacks, 0, "{stats:?}");
    assert!(stats.batches >= 1, "{stats:?}");
    let batched =
        server.node.calls("fencelock.acquire_batch") + server.node.calls("fencelock.release_batch");
    assert_eq!(
        batched, stats.batches,
        "every batch went as a batched command"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_without_the_batched_commands_gets_one_command_each() {
    let server = Standalone::start_with_module();
    let _: () = server.node.cmd(
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("single")
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-fencelock.acquire_batch")
            .arg("-fencelock.release_batch"),
    );
    let url = format!("redis://single:pw@{}", server.node.addr());
    let client = Client::connect([url]).await.unwrap();
    many_tasks(&client, 10).await;
    let stats = client.stats();
    assert_eq!(stats.grants, 320, "{stats:?}");
    assert_eq!(stats.module_calls, 640, "{stats:?}");
    assert_eq!(stats.batches, 0, "{stats:?}");
    assert_eq!(server.node.calls("fencelock.acquire"), 320);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_module_serves_a_cluster_in_every_fence_mode() {
    let cluster = Cluster::start_with_module();
    for mode in [
        FenceMode::EpochClock,
        FenceMode::Epoch,
        FenceMode::Clock,
        FenceMode::Counter,
    ] {
        // Required: the client checks every master at connect.
        let client = Client::builder(cluster.urls())
            .fence_mode(mode)
            .module(ModuleUse::Required)
            .connect()
            .await
            .unwrap();
        // The same names in every mode: a lock's fences go on rising across modes that rise
        // faster (counter is last).
        for i in 0..6 {
            let fences = cycle(&client, &format!("slot{i}"), 3).await;
            assert!(strictly_increasing(&fences), "{mode:?}: {fences:?}");
        }
        let stats = client.stats();
        assert_eq!(stats.module_calls, 36, "{mode:?}: {stats:?}");
        assert_eq!(stats.module_fallbacks, 0, "{mode:?}: {stats:?}");
    }
    // What the module declines on a cluster (a re-entered lock's release) goes as the script.
    let client = Client::connect(cluster.urls()).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let outer = client.lock("slot0", &options).await.unwrap();
    let inner = outer.reentry().lock().await.unwrap();
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    assert!(client.stats().module_fallbacks >= 1, "{:?}", client.stats());
    assert!(cycle(&client, "slot0", 2).await.len() == 2);
}
