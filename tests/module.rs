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
    // Re-entry is the module's too: the grant, the re-entry and both releases.
    let outer = client.lock("again", &options).await.unwrap();
    let inner = outer.reentry().lock().await.unwrap();
    let outer_fence = outer.fence();
    assert_eq!(inner.fence(), outer_fence);
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    let next = client.try_lock("again", &options).await.unwrap();
    assert!(next.fence() > outer_fence);
    next.release().await.unwrap();
    let stats = client.stats();
    assert_eq!(stats.module_calls, 6, "{stats:?}");
    assert_eq!(stats.module_fallbacks, 0, "{stats:?}");

    // A key of layout 1 (a lock of fencelock before key layout 2): the module declines it, the
    // script converts it and grants above its fence, and the calls for that key's slot go as
    // the script for a second after (no round trip lost on a key the module would decline
    // again).
    let _: () = server.node.cmd(
        redis::cmd("HSET")
            .arg("fencelock:{old}:lock")
            .arg("fence")
            .arg(5),
    );
    let old = client.try_lock("old", &options).await.unwrap();
    assert!(old.fence().get() > 5, "{:?}", old.fence());
    old.release().await.unwrap();
    let stats = client.stats();
    assert_eq!(stats.module_calls, 6, "{stats:?}");
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
        stats.module_fallbacks, 2,
        "one call of each command (acquire, release) finds it missing: {stats:?}"
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

/// A batched command that a server without the module refuses as a whole counts one module
/// fallback per call it carried, as each call sent alone counts one. The server is paused
/// while the calls are made, so that they are sent to the module (alone, or in a batched
/// command) before the first answer says the module is missing.

#[tokio::test(flavor = "multi_thread")]
async fn every_call_of_a_refused_batch_counts_a_module_fallback() {
    const TASKS: usize = 16;
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    server.node.pause();
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (client, options) = (client.clone(), options.clone());
            tokio::spawn(async move { client.try_lock(&format!("refused{i}"), &options).await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.node.resume();
    let mut guards = Vec::new();
    for task in tasks {
        guards.push(task.await.unwrap().expect("granted through the script"));
    }
    let stats = client.stats();
    assert_eq!(stats.module_calls, 0, "{stats:?}");
    // The server refused each module command it got (a lone call, or a batched command of
    // several); each call in them counts one fallback, so more fallbacks than refused commands
    // once one batched command was refused (a call made after the first refusal reached the
    // client goes to the script at once, uncounted: under load not every task's call was sent
    // before that).
    let errors = server.node.info("errorstats");
    let refused: u64 = errors
        .lines()
        .find_map(|line| line.strip_prefix("errorstat_ERR:count="))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or_else(|| panic!("{errors}"));
    assert!(
        stats.module_fallbacks > refused && stats.module_fallbacks <= TASKS as u64,
        "{refused} module commands refused, {} fallbacks counted: {stats:?}",
        stats.module_fallbacks
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
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
    // One acquire and one release found the command missing (each command is asked anew).
    assert_eq!(stats.module_fallbacks, 2, "{stats:?}");
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
    let batched = server.node.calls("fencelock.acquire_packed")
        + server.node.calls("fencelock.release_packed");
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
            .arg("-fencelock.acquire_packed")
            .arg("-fencelock.release_packed"),
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
async fn a_command_the_node_lacks_goes_as_the_script_and_the_others_stay_with_the_module() {
    // As an older module without `fencelock.extend` would: the user may not run it.
    let server = Standalone::start_with_module();
    let _: () = server.node.cmd(
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("noextend")
            .arg("on")
            .arg(">pw")
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .arg("-fencelock.extend"),
    );
    let url = format!("redis://noextend:pw@{}", server.node.addr());
    let client = Client::connect([url]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    for _ in 0..3 {
        let mut guard = client.lock("partial", &options).await.unwrap();
        guard.extend(Duration::from_secs(10)).await.unwrap();
        guard.release().await.unwrap();
    }
    let stats = client.stats();
    assert_eq!(stats.module_calls, 6, "acquires and releases: {stats:?}");
    assert_eq!(
        stats.module_fallbacks, 1,
        "the first extend only: {stats:?}"
    );
    assert_eq!(server.node.calls("fencelock.acquire"), 3);
}

/// `ModuleUse::Required` asks each master itself whether it loads the module, never another
/// node for it: a master without the module, paused while the client connects (redis-rs then
/// has no connection to it), is not vouched for by its replica, which loads the module; once
/// it answers again, connect names it as lacking the module.
#[tokio::test(flavor = "multi_thread")]
async fn required_asks_each_master_itself_not_another_node_of_its_shard() {
    let cluster = Cluster::start_with_module();
    let master = cluster.master_of_slot(0);
    let _: () = master.cmd(redis::cmd("MODULE").arg("UNLOAD").arg("fencelock"));
    let replica = cluster.replica_of(master.port);
    let loaded: redis::Value =
        replica.cmd(redis::cmd("COMMAND").arg("INFO").arg("fencelock.acquire"));
    assert!(
        matches!(&loaded, redis::Value::Array(items) if !matches!(items[0], redis::Value::Nil)),
        "the replica still loads the module: {loaded:?}"
    );
    let seeds: Vec<String> = cluster
        .nodes
        .iter()
        .filter(|node| node.port != master.port)
        .map(common::Node::url)
        .collect();
    let required = |seeds: Vec<String>| {
        Client::builder(seeds)
            .module(ModuleUse::Required)
            .connect_timeout(Duration::from_millis(300))
            .request_timeout(Duration::from_millis(500))
            .connect()
    };

    master.pause();
    let paused = std::time::Instant::now();
    let outcome = required(seeds.clone()).await;
    master.resume();
    // Resumed well before the node timeout: no failover, the master is still the master.
    assert!(
        paused.elapsed() < common::NODE_TIMEOUT,
        "{:?}",
        paused.elapsed()
    );
    let err = outcome
        .map(drop)
        .expect_err("the paused master was not asked");
    assert!(
        matches!(&err, Error::Connect { target, .. } if *target == master.addr()),
        "{err:?}"
    );
    assert!(err.to_string().contains("could not be asked"), "{err}");

    cluster.wait_healthy();
    let err = required(seeds).await.map(drop).unwrap_err();
    assert!(
        matches!(&err, Error::Connect { target, .. } if *target == master.addr())
            && err.to_string().contains("does not load it"),
        "{err:?}"
    );
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
    // Re-entry on a cluster goes through the module; what it declines (a key of layout 1) goes
    // as the script.
    let client = Client::connect(cluster.urls()).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let outer = client.lock("slot0", &options).await.unwrap();
    let inner = outer.reentry().lock().await.unwrap();
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    let stats = client.stats();
    assert_eq!(
        (stats.module_calls, stats.module_fallbacks),
        (4, 0),
        "{stats:?}"
    );
    let key = "fencelock:{old}:lock";
    let _: () = cluster
        .master_of_slot(fencelock::slot_of(key.as_bytes()))
        .cmd(redis::cmd("HSET").arg(key).arg("fence").arg(5));
    let fences = cycle(&client, "old", 2).await;
    assert!(fences[0].get() > 5, "{fences:?}");
    assert!(client.stats().module_fallbacks >= 1, "{:?}", client.stats());
}

/// The key's fields (sorted) and its absolute expiry (ms, -1 none, -2 no key).
fn key_state(server: &Standalone, key: &str) -> (Vec<(String, String)>, i64) {
    let mut fields: Vec<(String, String)> = server.node.cmd(redis::cmd("HGETALL").arg(key));
    fields.sort();
    let expiry: i64 = server.node.cmd(redis::cmd("PEXPIRETIME").arg(key));
    (fields, expiry)
}

/// Numbers that are times (a lease left in ms, or a time in ms since 1970) may differ in `a`
/// and `b` (replies, states) by the milliseconds between the two calls; everything else, fences
/// and codes included, must be equal.
fn alike(a: &str, b: &str) -> bool {
    let timelike =
        |v: i64| (0..=100_000).contains(&v) || (10i64.pow(12)..10i64.pow(13)).contains(&v);
    let (a, b): (Vec<&str>, Vec<&str>) = (a.split(' ').collect(), b.split(' ').collect());
    a.len() == b.len()
        && a.iter()
            .zip(&b)
            .all(|(x, y)| match (x.parse::<i64>(), y.parse::<i64>()) {
                (Ok(x), Ok(y)) => x == y || (timelike(x) && timelike(y) && (x - y).abs() <= 200),
                _ => x == y,
            })
}

/// One case of a differential check: a key's fields and expiry (-1 none) before the call, and
/// the call's arguments after the key; `declined` when the module must answer `-FALLBACK`.
struct Case {
    name: &'static str,
    fields: Vec<(&'static str, String)>,
    expiry: i64,
    args: Vec<&'static str>,
    declined: bool,
}

impl Case {
    fn new(name: &'static str, until: String, expiry: i64, args: &[&'static str]) -> Case {
        Case {
            name,
            fields: if until.is_empty() {
                Vec::new()
            } else {
                vec![("until", until)]
            },
            expiry,
            args: args.to_vec(),
            declined: false,
        }
    }

    fn with(mut self, field: &'static str, value: &str) -> Case {
        self.fields.push((field, value.to_owned()));
        self
    }

    /// A state the module leaves to the script: it answers `-FALLBACK` and writes nothing, and
    /// the script then runs on its key, as the client sends it.
    fn declined(mut self) -> Case {
        self.declined = true;
        self
    }
}

/// The server's clock in ms.
fn server_ms(server: &Standalone) -> i64 {
    let t: (i64, i64) = server.node.cmd(&mut redis::cmd("TIME"));
    t.0 * 1000 + t.1 / 1000
}

/// A reply of integers (one, or an array of them) as a list.
fn ints(reply: redis::Value) -> Vec<i64> {
    match reply {
        redis::Value::Int(n) => vec![n],
        redis::Value::Array(items) => items.into_iter().flat_map(ints).collect(),
        other => panic!("not integers: {other:?}"),
    }
}

/// A script's reply as integers, or its error reply's text.
fn script_reply(
    server: &Standalone,
    script: &str,
    key: &str,
    args: &[&str],
) -> Result<Vec<i64>, String> {
    server
        .node
        .try_cmd(redis::cmd("EVAL").arg(script).arg(1).arg(key).arg(args))
        .map(ints)
        .map_err(|e| e.to_string())
}

/// Runs every case twice on fresh keys of the same state, once through the module's `command`
/// and once through the script `script`, and checks that the replies, the keys' fields and
/// their expiry are alike (numbers within the milliseconds between the calls). No case may be
/// declined but those marked so: there the module must answer `-FALLBACK` with the key as it
/// was, and the script then runs on the module's key (as the client sends it), its replies and
/// keys compared as above (an error reply by its text).
fn differential(server: &Standalone, command: &str, script: &str, cases: Vec<Case>) {
    let script = fencelock::lua_scripts()
        .find(|s| s.name == script)
        .expect("the script");
    let count = cases.len();
    for case in cases {
        let name = case.name;
        let (m, s) = (format!("{{m-{name}}}:lock"), format!("{{s-{name}}}:lock"));
        for key in [&m, &s] {
            for (field, value) in &case.fields {
                let _: () = server
                    .node
                    .cmd(redis::cmd("HSET").arg(key).arg(*field).arg(value));
            }
            if case.expiry > 0 {
                let _: () = server
                    .node
                    .cmd(redis::cmd("PEXPIREAT").arg(key).arg(case.expiry));
            }
        }
        let (by_module, by_script) = if case.declined {
            let before = key_state(server, &s);
            let declined = server
                .node
                .try_cmd::<redis::Value>(redis::cmd(command).arg(&m).arg(&case.args));
            assert!(
                matches!(&declined, Err(e) if e.code() == Some("FALLBACK")),
                "{name}: the module answered {declined:?}, not -FALLBACK"
            );
            assert_eq!(key_state(server, &m), before, "{name}: the module wrote");
            (
                script_reply(server, script.source, &m, &case.args),
                script_reply(server, script.source, &s, &case.args),
            )
        } else {
            let by_module = ints(server.node.cmd(redis::cmd(command).arg(&m).arg(&case.args)));
            (
                Ok(by_module),
                script_reply(server, script.source, &s, &case.args),
            )
        };
        match (&by_module, &by_script) {
            (Ok(by_module), Ok(by_script)) => {
                let words = |v: &[i64]| v.iter().map(i64::to_string).collect::<Vec<_>>().join(" ");
                let (rm, rs) = (words(by_module), words(by_script));
                assert!(
                    by_module.first() == by_script.first() && alike(&rm, &rs),
                    "{name}: module {rm:?}, script {rs:?}"
                );
            }
            _ => assert_eq!(by_module, by_script, "{name}: the replies"),
        }
        let (fm, em) = key_state(server, &m);
        let (fs, es) = key_state(server, &s);
        assert_eq!(
            fm.len(),
            fs.len(),
            "{name}: fields {fm:?} by the module, {fs:?} by the script"
        );
        for ((km, vm), (ks, vs)) in fm.iter().zip(&fs) {
            assert!(
                km == ks && alike(vm, vs),
                "{name}: {km} = {vm:?} by the module, {ks} = {vs:?} by the script"
            );
        }
        assert!(
            (em < 0 && em == es) || (em > 0 && (em - es).abs() <= 200),
            "{name}: expiry {em} by the module, {es} by the script"
        );
    }
    assert_eq!(
        server.node.calls(command),
        count as u64,
        "a case was declined"
    );
}

/// The cases extend and re-entry share: a lock this owner holds, another owner's, an expired
/// one, one a forced unlock freed from this owner, an epoch-clock fence ahead of the clock with
/// the key's expiry later or sooner than the new lease's, one without a grace (`no_grace`, the
/// arguments with an empty last one), no key, and a fence past 2^53 (declined).
fn shared_cases(now: i64, args: &[&'static str], no_grace: &[&'static str]) -> Vec<Case> {
    let epoch_fence = 5_000_000_000_000_005_i64; // below 2^53, far ahead of the clock in µs
    vec![
        Case::new(
            "held",
            format!("{} 123456789 me", now + 1000),
            now + 9000,
            args,
        ),
        Case::new(
            "other",
            format!("{} 123456789 you", now + 1000),
            now + 9000,
            args,
        ),
        Case::new(
            "expired",
            format!("{} 123456789 me", now - 10),
            now + 9000,
            args,
        ),
        Case::new("forced", "0 123456789 ".to_owned(), now + 9000, args).with("forced", "me"),
        Case::new(
            "epoch-later",
            format!("{} {epoch_fence} me", now + 1000),
            now + 900_000,
            args,
        ),
        Case::new(
            "epoch-sooner",
            format!("{} {epoch_fence} me", now + 1000),
            now + 2000,
            args,
        ),
        Case::new(
            "no-grace",
            format!("{} 123456789 me wq", now + 1000),
            now + 9000,
            no_grace,
        ),
        Case::new("no-key", String::new(), -1, args),
        // A clock fence and a key that expires later than the new lease + grace: keep.lua sets
        // the expiry (lowering it), where an epoch-clock fence only raises it.
        Case::new(
            "expiry-later",
            format!("{} 123456789 me", now + 1000),
            now + 900_000,
            args,
        ),
        // A re-entered lock whose lease (the call's lease end: it ends after now + TTL) and
        // fence lie in one millisecond, the fence past its start, and a key that expires later:
        // keep.lua reads the fence as the next millisecond and sets the expiry (lowering it);
        // the module raised it as for an epoch-clock fence, and kept the key 790 s longer.
        Case::new(
            "fence-in-the-lease-end-ms",
            format!("{} {} me h2", now + 50_000, (now + 50_000) * 1000 + 500),
            now + 900_000,
            args,
        )
        .with("h:", "1"),
        // A fence of 19 digits: the script rewrites it with `%d` (which cannot hold it past
        // 2^63), the module wrote it as it was; it declines it now.
        Case::new(
            "fence-past-2^53",
            format!("{} 9999999999999999999 me", now + 50_000),
            now + 9000,
            args,
        )
        .declined(),
    ]
}

#[test]
fn the_module_extends_as_the_script_does() {
    let server = Standalone::start_with_module();
    let now = server_ms(&server);
    let args = ["me", "5000", "60000"];
    let mut cases = shared_cases(now, &args, &["me", "5000", ""]);
    cases.extend([
        Case::new(
            "reentered",
            format!("{} 123456789 me h3 w*", now + 50_000),
            -1,
            &args,
        ),
        Case::new(
            "reentered-short",
            format!("{} 123456789 me h2", now + 100),
            -1,
            &args,
        ),
        Case::new(
            "one-hold",
            format!("{} 123456789 me h1", now + 50_000),
            -1,
            &args,
        ),
        // A re-entered lock whose lease ends past 2^63 ms: the module kept that lease and set
        // the key's expiry to it + grace cast to i64, negative, which the server refused while
        // the module replicated it (`PEXPIREAT` of a negative time: the master kept no expiry,
        // the replica a past one), and replied a negative lease left. Lua reads such a lease
        // inexactly: the module leaves it to the script.
        Case::new(
            "lease-past-2^63-reentered",
            "9300000000000000000 123456789 me h3".to_owned(),
            now + 9000,
            &args,
        )
        .with("h:", "1")
        .declined(),
    ]);
    differential(&server, "fencelock.extend", "extend", cases);
}

#[test]
fn the_module_reenters_as_the_script_does() {
    let server = Standalone::start_with_module();
    let now = server_ms(&server);
    let args = ["me", "a1", "5000", "60000"];
    let mut cases = shared_cases(now, &args, &["me", "a1", "5000", ""]);
    cases.extend([
        Case::new(
            "second",
            format!("{} 123456789 me h2 w*", now + 1000),
            now + 9000,
            &args,
        )
        .with("h:", "1")
        .with("h:b2", "1"),
        Case::new(
            "resent",
            format!("{} 123456789 me h2", now + 1000),
            now + 9000,
            &args,
        )
        .with("h:", "1")
        .with("h:a1", "1"),
        Case::new(
            "resent-later",
            format!("{} 123456789 me h2", now + 50_000),
            now + 90_000,
            &args,
        )
        .with("h:", "1")
        .with("h:a1", "1"),
        Case::new(
            "lease-later",
            format!("{} 123456789 me", now + 50_000),
            now + 90_000,
            &args,
        ),
        // The review's state: a lease that ends past 2^63 ms, which the module kept (it ends
        // later than now + TTL) and turned into a negative expiry (refused by the server but
        // replicated) and a negative reply. Lua reads it inexactly: left to the script.
        Case::new(
            "lease-past-2^63",
            "9300000000000000000 123456789 me".to_owned(),
            now + 9000,
            &args,
        )
        .declined(),
    ]);
    differential(&server, "fencelock.reenter", "reenter", cases);
}

/// A lock state with a lease end or fence past 2^53 - 1, which the scripts' Lua reads
/// inexactly, is the scripts' alone: the module declines it before any write (found by a
/// review: the acquire answered a holder's resend of a lock with a 19-digit fence with
/// `{2, -8446744073709551617, 0}`, the fence cast to i64, where the script answers otherwise).
#[test]
fn the_module_leaves_a_lease_end_or_fence_past_2_53_to_the_script() {
    let server = Standalone::start_with_module();
    let now = server_ms(&server);
    let args = ["me", "30000", "0", "counter", "60000"];
    let cases = vec![
        Case::new(
            "resend",
            "9999999999999 9999999999999999999 me".to_owned(),
            now + 9000,
            &args,
        )
        .declined(),
        // The next fence passes 2^53 - 1: the script's error names the stored fence as Lua
        // read it (rounded), the module's named its digits.
        Case::new("free", "0 9007199254740993 ".to_owned(), now + 9000, &args).declined(),
        // Held by another owner until past 2^63 ms: the module's wait was the lease left cast
        // to i64.
        Case::new(
            "busy",
            "9300000000000000000 5 you".to_owned(),
            now + 9000,
            &args,
        )
        .declined(),
    ];
    differential(&server, "fencelock.acquire", "acquire", cases);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guard_extends_through_the_module_alone_and_in_batches() {
    let server = Standalone::start_with_module();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let mut guard = client.lock("extended", &options).await.unwrap();
    guard.extend(Duration::from_secs(30)).await.unwrap();
    let until: String = server.node.cmd(
        redis::cmd("HGET")
            .arg("fencelock:{extended}:lock")
            .arg("until"),
    );
    let lease_ends: i64 = until.split(' ').next().unwrap().parse().unwrap();
    let time: (i64, i64) = server.node.cmd(&mut redis::cmd("TIME"));
    let ttl = lease_ends - (time.0 * 1000 + time.1 / 1000);
    assert!(ttl > 20_000, "the lease ends in {ttl} ms, not about 30 s");
    guard.release().await.unwrap();
    assert_eq!(server.node.calls("fencelock.extend"), 1);

    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let client = client.clone();
            let options = options.clone();
            tokio::spawn(async move {
                let mut guard = client.lock(&format!("many-{i}"), &options).await.unwrap();
                for _ in 0..5 {
                    guard.extend(Duration::from_secs(10)).await.unwrap();
                }
                guard.release().await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let stats = client.stats();
    assert_eq!(stats.module_fallbacks, 0, "{stats:?}");
    assert_eq!(stats.module_calls, 3 + 32 * 7, "{stats:?}");
    let packed = server.node.calls("fencelock.extend_packed");
    let single = server.node.calls("fencelock.extend");
    assert!(packed > 0, "no batch of extends: {single} single calls");
}

/// A lock of a renewal call: (name, `until`, other fields, expiry or -1, owner, TTL).
type RenewedLock<'a> = (
    &'a str,
    String,
    Vec<(&'a str, &'a str)>,
    i64,
    &'a str,
    &'a str,
);

#[test]
fn the_module_renews_as_the_script_does() {
    let server = Standalone::start_with_module();
    let now = server_ms(&server);
    let epoch_fence = 5_000_000_000_000_005_i64;
    // One renewal call for them all.
    let locks: Vec<RenewedLock> = vec![
        (
            "held",
            format!("{} 123456789 me", now + 1000),
            vec![],
            now + 9000,
            "me",
            "5000",
        ),
        (
            "held-no-expiry",
            format!("{} 123456789 me", now + 1000),
            vec![],
            -1,
            "me",
            "5000",
        ),
        (
            "expiry-later",
            format!("{} 123456789 me w*", now + 1000),
            vec![],
            now + 900_000,
            "me",
            "5000",
        ),
        (
            "other",
            format!("{} 123456789 you", now + 1000),
            vec![],
            now + 9000,
            "me",
            "5000",
        ),
        (
            "expired",
            format!("{} 123456789 me", now - 10),
            vec![],
            now + 9000,
            "me",
            "5000",
        ),
        (
            "forced",
            "0 123456789 ".to_owned(),
            vec![("forced", "me")],
            now + 9000,
            "me",
            "5000",
        ),
        (
            "reentered",
            format!("{} 123456789 me h3 wq", now + 50_000),
            vec![("h:", "1")],
            now + 90_000,
            "me",
            "5000",
        ),
        (
            "epoch",
            format!("{} {epoch_fence} me", now + 1000),
            vec![],
            now + 2000,
            "me",
            "5000",
        ),
        (
            "layout-1",
            String::new(),
            vec![("fence", "7"), ("owner", "me")],
            now + 9000,
            "me",
            "5000",
        ),
        ("no-key", String::new(), vec![], -1, "me", "5000"),
    ];
    let script = fencelock::lua_scripts()
        .find(|s| s.name == "renew")
        .expect("the renew script");
    for grace in ["60000", ""] {
        let key = |side: &str, name: &str| format!("{{r}}:{side}-{name}-{}:lock", grace.len());
        for side in ["m", "s"] {
            for (name, until, fields, expiry, _, _) in &locks {
                let k = key(side, name);
                if !until.is_empty() {
                    let _: () = server
                        .node
                        .cmd(redis::cmd("HSET").arg(&k).arg("until").arg(until));
                }
                for (field, value) in fields {
                    let _: () = server
                        .node
                        .cmd(redis::cmd("HSET").arg(&k).arg(*field).arg(*value));
                }
                if *expiry > 0 {
                    let _: () = server
                        .node
                        .cmd(redis::cmd("PEXPIREAT").arg(&k).arg(*expiry));
                }
            }
        }
        let triples = |side: &str| -> Vec<String> {
            locks
                .iter()
                .flat_map(|(name, _, _, _, owner, ttl)| {
                    [key(side, name), (*owner).to_owned(), (*ttl).to_owned()]
                })
                .collect()
        };
        let by_module = ints(
            server.node.cmd(
                redis::cmd("fencelock.renew")
                    .arg(key("m", locks[0].0))
                    .arg(triples("m"))
                    .arg(grace),
            ),
        );
        let by_script = ints(
            server.node.cmd(
                redis::cmd("EVAL")
                    .arg(script.source)
                    .arg(1)
                    .arg(key("s", locks[0].0))
                    .arg(triples("s"))
                    .arg(grace),
            ),
        );
        assert_eq!(by_module, by_script, "grace {grace:?}: the codes");
        for (name, ..) in &locks {
            let (fm, em) = key_state(&server, &key("m", name));
            let (fs, es) = key_state(&server, &key("s", name));
            assert_eq!(
                fm.len(),
                fs.len(),
                "{name}: {fm:?} by the module, {fs:?} by the script"
            );
            for ((km, vm), (ks, vs)) in fm.iter().zip(&fs) {
                assert!(
                    km == ks && alike(vm, vs),
                    "{name}: {km} = {vm:?}, {ks} = {vs:?}"
                );
            }
            assert!(
                (em < 0 && em == es) || (em > 0 && (em - es).abs() <= 200),
                "{name}, grace {grace:?}: expiry {em} by the module, {es} by the script"
            );
        }
    }
    assert_eq!(server.node.calls("fencelock.renew"), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_watchdog_renews_and_reentries_go_through_the_module() {
    let server = Standalone::start_with_module();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_millis(600))
        .watchdog(true);
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let client = client.clone();
            let options = options.clone();
            tokio::spawn(async move {
                let guard = client
                    .lock(&format!("watched-{i}"), &options)
                    .await
                    .unwrap();
                let inner = guard.reentry().lock().await.unwrap();
                // Three renewal periods (TTL / 3) pass while both holds live.
                tokio::time::sleep(Duration::from_millis(700)).await;
                // Each release checks that its hold was intact all along.
                inner.release().await.unwrap();
                guard.release().await.unwrap();
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let stats = client.stats();
    assert!(stats.renewals >= 16, "{stats:?}");
    assert_eq!(stats.module_fallbacks, 0, "{stats:?}");
    assert!(
        server.node.calls("fencelock.renew") >= 1,
        "renewals went as scripts"
    );
    let reentries =
        server.node.calls("fencelock.reenter") + server.node.calls("fencelock.reenter_packed");
    assert!(reentries >= 1, "re-entries went as scripts");
}

#[test]
fn the_module_releases_as_the_script_does() {
    let server = Standalone::start_with_module_args(&[]);
    let now = server_ms(&server);
    let lease = format!("{}", now + 5000);
    let plain = ["me", "", "p", "60000"];
    let case =
        |name, until: String, args: &[&'static str]| Case::new(name, until, now + 9000, args);
    let ahead = "5000000000000005";
    let cases = vec![
        case("plain", format!("{lease} 123456789 me"), &plain),
        case("plain-ahead", format!("{lease} {ahead} me"), &plain),
        case("announced", format!("{lease} 123456789 me w*"), &plain),
        case("other", format!("{lease} 123456789 you"), &plain),
        case("expired", format!("{} 123456789 me", now - 10), &plain),
        case("forced", "0 123456789 ".to_owned(), &plain).with("forced", "me"),
        case("no-key", String::new(), &plain),
        case(
            "one-of-two",
            format!("{lease} 123456789 me h2"),
            &["me", "a1", "p", "60000"],
        )
        .with("h:", "1")
        .with("h:a1", "1"),
        case(
            "first-of-two",
            format!("{lease} 123456789 me h2 w*"),
            &plain,
        )
        .with("h:", "1")
        .with("h:a1", "1"),
        case(
            "last",
            format!("{lease} 123456789 me h1 w*"),
            &["me", "a1", "p", "60000"],
        )
        .with("h:a1", "1")
        .with("h:b2", "1"),
        case(
            "twice",
            format!("{lease} 123456789 me h2"),
            &["me", "zz", "p", "60000"],
        )
        .with("h:", "1")
        .with("h:a1", "1"),
        case(
            "id-without-holds",
            format!("{lease} 123456789 me"),
            &["me", "a1", "p", "60000"],
        ),
        case(
            "expired-reentered",
            format!("{} 123456789 me h3", now - 10),
            &plain,
        )
        .with("h:", "1")
        .with("h:a1", "1")
        .with("h:b2", "1")
        .with("forced", "other"),
        case(
            "queue-left",
            format!("{lease} 123456789 me h2 wq"),
            &["me", "a1", "p", "60000"],
        )
        .with("h:", "1")
        .with("h:a1", "1")
        .with("q:x", "1 1"),
    ];
    differential(&server, "fencelock.release", "release", cases);
}

/// The floor key of the locks under the prefix `fencelock`.
const FLOOR_KEY: &str = "fencelock:{floor}:floor";

/// `fencelock.acquire key owner 5000 0 clock grace` on `node`: the reply as integers.
fn clock_acquire(node: &common::Node, key: &str, owner: &str, grace: &str) -> Vec<i64> {
    ints(
        node.cmd(
            redis::cmd("fencelock.acquire")
                .arg(key)
                .arg(owner)
                .arg(5000)
                .arg(0)
                .arg("clock")
                .arg(grace),
        ),
    )
}

/// `fencelock.release key owner "" p grace` on `node` (the hold the acquire granted).
fn plain_release(node: &common::Node, key: &str, owner: &str, grace: &str) -> i64 {
    node.cmd(
        redis::cmd("fencelock.release")
            .arg(key)
            .arg(owner)
            .arg("")
            .arg("p")
            .arg(grace),
    )
}

/// With `release-deletes yes` (a standalone server), a release the module serves that frees a lock
/// with nothing else in its key, with a grace (a clock mode) and a fence not ahead of the clock,
/// deletes the key and makes the prefix's floor key cover it (a value at least the fence, an expiry
/// at least the lock key's; written only when it does not yet, then as the server's clock); a grant
/// of a lock without a key, through the module, starts above that floor. A fence ahead of the
/// clock, no grace, waiters, or a floor key that is not a number keep the key. Without the argument
/// the key is kept (the differential test above); a server in cluster mode refuses the argument.
#[test]
fn the_module_deletes_a_freed_locks_key_and_keeps_its_fence_in_the_floor() {
    let server = Standalone::start_with_module_args(&["release-deletes", "yes"]);
    let node = &server.node;
    let (key, floor) = ("fencelock:{fl}:lock", FLOOR_KEY.to_owned());
    let acquire = |key: &str, owner: &str, grace: &str| clock_acquire(node, key, owner, grace);
    let release = |key: &str, owner: &str, grace: &str| plain_release(node, key, owner, grace);
    let exists = |key: &str| -> i64 { node.cmd(redis::cmd("EXISTS").arg(key)) };
    let get = |key: &str| -> Option<String> { node.cmd(redis::cmd("GET").arg(key)) };
    let expiry = |key: &str| -> i64 { node.cmd(redis::cmd("PEXPIRETIME").arg(key)) };

    // Granted, released: the key is gone; the floor is the server's clock at the release (not
    // below the fence), its expiry the key's moved on by the time since the grant (at most 1 s).
    let fence = acquire(key, "me", "60000")[0];
    let key_expiry = expiry(key);
    assert!(key_expiry > 0);
    assert_eq!(release(key, "me", "60000"), 1);
    let after_ms = server_ms(&server);
    assert_eq!(exists(key), 0, "a freed lock's key is deleted");
    let raised: i64 = get(&floor).expect("a floor").parse().expect("a number");
    assert!(
        raised >= fence && raised / 1000 <= after_ms,
        "{raised} {fence} {after_ms}"
    );
    let floor_expiry = expiry(&floor);
    assert_eq!(
        floor_expiry,
        key_expiry + (raised / 1000 - fence / 1000).min(1000)
    );
    // A resent release finds no key: no live lease, as for a key kept free.
    assert_eq!(release(key, "me", "60000"), 0);
    // A lock that floor covers (a fence not above it, an expiry not after its own, as for a
    // lock granted before that release): deleted, the floor left as it is.
    let covered = "fencelock:{fl}:covered:lock";
    let _: () = node.cmd(redis::cmd("HSET").arg(covered).arg("until").arg(format!(
        "{} {} me",
        after_ms + 5000,
        raised
    )));
    let _: () = node.cmd(redis::cmd("PEXPIREAT").arg(covered).arg(floor_expiry));
    assert_eq!(release(covered, "me", "60000"), 1);
    assert_eq!(exists(covered), 0);
    assert_eq!(get(&floor), Some(raised.to_string()));
    assert_eq!(expiry(&floor), floor_expiry);

    // A floor ahead of the clock: the next grant of a lock without a key under that prefix is
    // above it (reported as ahead of the clock), and its release keeps the key.
    let high = 5_000_000_000_000_000_i64;
    let _: () = node.cmd(
        redis::cmd("SET")
            .arg(&floor)
            .arg(high)
            .arg("PX")
            .arg(60_000),
    );
    let other = "fencelock:{fl}:second:lock";
    let granted = acquire(other, "me", "60000");
    assert_eq!(&granted[..2], &[1, high + 1], "{granted:?}");
    assert_eq!(release(other, "me", "60000"), 1);
    let state: Option<String> = node.cmd(redis::cmd("HGET").arg(other).arg("until"));
    assert_eq!(state.as_deref(), Some(format!("0 {} ", high + 1).as_str()));

    // A floor above a released fence but expiring before its key: set to the clock, its expiry
    // the key's and (for a fence long past) 1 s more.
    let now = server_ms(&server);
    let lower = "fencelock:{fl}:third:lock";
    let _: () = node.cmd(
        redis::cmd("SET")
            .arg(&floor)
            .arg(200_000_000)
            .arg("PX")
            .arg(100_000),
    );
    let _: () = node.cmd(
        redis::cmd("HSET")
            .arg(lower)
            .arg("until")
            .arg(format!("{} 123456789 me", now + 5000)),
    );
    let _: () = node.cmd(redis::cmd("PEXPIREAT").arg(lower).arg(now + 900_000));
    assert_eq!(release(lower, "me", "60000"), 1);
    assert_eq!(exists(lower), 0);
    let raised: i64 = get(&floor).expect("a floor").parse().expect("a number");
    assert!(raised / 1000 >= now, "{raised} {now}");
    assert_eq!(expiry(&floor), now + 900_000 + 1000);

    // No grace (counter and epoch modes keep their keys for good): kept.
    let kept = "fencelock:{fl}:fourth:lock";
    acquire(kept, "me", "");
    assert_eq!(release(kept, "me", ""), 1);
    assert_eq!(exists(kept), 1);
    // And a grant without a grace does not read the floor: a counter starts at 1, as the
    // script's does.
    let counter: i64 = node.cmd(
        redis::cmd("fencelock.acquire")
            .arg("fencelock:{fl}:counter:lock")
            .arg("me")
            .arg(5000)
            .arg(0)
            .arg("counter")
            .arg(""),
    );
    assert_eq!(counter, 1);

    // Another field in the key (here a forced unlock's mark of another owner): kept.
    let marked = "fencelock:{fl}:marked:lock";
    acquire(marked, "me", "60000");
    let _: () = node.cmd(redis::cmd("HSET").arg(marked).arg("forced").arg("other"));
    assert_eq!(release(marked, "me", "60000"), 1);
    assert_eq!(exists(marked), 1);

    // Waiters: kept (with their mark gone, as the script leaves it).
    let busy = "fencelock:{fl}:fifth:lock";
    acquire(busy, "me", "60000");
    assert_eq!(acquire(busy, "you", "60000")[0], 0);
    assert_eq!(release(busy, "me", "60000"), 1);
    assert_eq!(exists(busy), 1);

    // A floor key that is not a number: ignored by a grant, and a release keeps the key.
    let _: () = node.cmd(redis::cmd("SET").arg(&floor).arg("not a number"));
    let odd = "fencelock:{fl}:sixth:lock";
    assert!(acquire(odd, "me", "60000")[0] > 1_000_000_000_000_000);
    assert_eq!(release(odd, "me", "60000"), 1);
    assert_eq!(exists(odd), 1);
    assert_eq!(get(&floor).as_deref(), Some("not a number"));

    // A server without the argument still reads a floor (one written while it was on, or by a
    // master that has it on): a grant of a lock without a key starts above it.
    let off = Standalone::start_with_module_args(&[]);
    let _: () = off.node.cmd(redis::cmd("SET").arg(&floor).arg(high));
    let reply = clock_acquire(&off.node, key, "me", "60000");
    assert_eq!(&reply[..2], &[1, high + 1], "{reply:?}");

    // A bad load argument, or the argument in cluster mode: the module does not load, and the
    // log says why.
    let bad = fencelock_module_refuses(&["release-deletes", "maybe"], &[]);
    assert!(bad.contains("release-deletes takes yes or no"), "{bad}");
    let cluster =
        fencelock_module_refuses(&["release-deletes", "yes"], &["--cluster-enabled", "yes"]);
    assert!(cluster.contains("for standalone servers"), "{cluster}");
}

/// Standalone, `release-deletes yes`: the floor reaches a replica with the key's deletion, and
/// a replica promoted with its clock 5 s behind grants a lock whose key the old master deleted
/// above the deleted fence through the module (it reads the replicated floor) and through
/// `acquire_floor` (the script a client sends such a server). Through `acquire`, which clients
/// with the module off and older clients send, the same grant comes from the replica's clock
/// and is below it: the limit `docs/safety.md` states ("Deleted keys and the floor").
#[test]
fn a_promoted_replica_whose_clock_is_behind_grants_above_a_deleted_locks_fence() {
    let shim = common::netns::ClockShim::build();
    let master = Standalone::start_with_module_args(&["release-deletes", "yes"]);
    let mut args = common::module::load_args(false);
    args.splice(2..2, ["release-deletes".to_owned(), "yes".to_owned()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let replica = common::Node::spawn_launched(&args, shim.launch(common::Launch::default()));
    common::netns::set_clock_offset(&replica, -5000);
    let _: () = replica.cmd(
        redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master.node.port),
    );
    common::wait_until("the replica in sync", Duration::from_secs(10), || {
        replica
            .info("replication")
            .contains("master_link_status:up")
    });

    let (a, b, c) = (
        "fencelock:{promoted-a}:lock",
        "fencelock:{promoted-b}:lock",
        "fencelock:{promoted-c}:lock",
    );
    let mut fences = Vec::new();
    for key in [a, b, c] {
        fences.push(clock_acquire(&master.node, key, "me", "60000")[0]);
        assert_eq!(plain_release(&master.node, key, "me", "60000"), 1);
    }
    let acked: i64 = master.node.cmd(redis::cmd("WAIT").arg(1).arg(5000));
    assert_eq!(acked, 1);
    let exists: i64 = replica.cmd(redis::cmd("EXISTS").arg(a).arg(b).arg(c));
    let floor: Option<String> = replica.cmd(redis::cmd("GET").arg(FLOOR_KEY));
    let floor: i64 = floor.expect("a floor").parse().expect("a number");
    assert_eq!(exists, 0);
    assert!(floor >= fences[2], "{floor} {fences:?}");

    let _: () = replica.cmd(redis::cmd("REPLICAOF").arg("NO").arg("ONE"));
    let by_module = clock_acquire(&replica, a, "you", "60000");
    assert_eq!(by_module[..2], [1, floor + 1], "{by_module:?}");
    // The script today's clients send a standalone server that may load the module reads the
    // floor too; the one clients with the module off and older clients send does not.
    let args = ["you", "5000", "0", "clock", "60000"];
    let by_script = common::grant_values(eval_script(&replica, "acquire_floor", &[b], &args));
    assert_eq!(by_script[..2], [1, floor + 1], "{by_script:?}");
    let by_older = common::grant_values(eval_script(&replica, "acquire", &[c], &args));
    assert!(
        by_older[1] < fences[2],
        "the replica's clock is 5 s behind: {by_older:?} vs {}",
        fences[2]
    );
}

/// `EVAL` of fencelock's script `name` (as `lua_scripts` lists it) on `node`.
fn eval_script(node: &common::Node, name: &str, keys: &[&str], args: &[&str]) -> redis::Value {
    let script = fencelock::lua_scripts()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no script {name}"));
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script.source).arg(keys.len());
    for key in keys {
        cmd.arg(*key);
    }
    for arg in args {
        cmd.arg(*arg);
    }
    node.cmd(&mut cmd)
}

/// The scripts a client sends a standalone server that may load the module (`acquire_floor`,
/// its batch twin, `handoff_floor` and `lock_all_floor`) read the module's floor key as the module's grants do:
/// a lock without a key, in a clock mode (a grace given), is granted above the floor; a floor
/// that is not a number, or not a string, counts as 0; a counter (no grace) starts at 1.
/// `acquire` and `lock_all`, which clients with the module off and older clients send, do not
/// read it. A client's multi-lock of one slot, which the module does not serve, is granted
/// above the floor; `list_locks` and `fencelock list` report the floor.
#[tokio::test(flavor = "multi_thread")]
async fn the_scripts_sent_to_a_standalone_server_with_the_module_read_its_floor() {
    let server = Standalone::start_with_module_args(&["release-deletes", "yes"]);
    let node = &server.node;
    let high: i64 = 5_000_000_000_000_000;
    let set_floor = |value: &str| {
        let _: () = node.cmd(
            redis::cmd("SET")
                .arg(FLOOR_KEY)
                .arg(value)
                .arg("PX")
                .arg(60_000),
        );
    };
    set_floor(&high.to_string());
    let grant = |name: &str, key: &str, mode: &str, grace: &str| -> Vec<i64> {
        let reply = eval_script(node, name, &[key], &["me", "5000", "0", mode, grace]);
        common::grant_values(reply)
    };

    // Above the floor (reported as ahead of the clock), through acquire_floor; from the clock,
    // below it, through acquire.
    let granted = grant("acquire_floor", "fencelock:{sf}:a:lock", "clock", "60000");
    assert_eq!(&granted[..2], &[1, high + 1], "{granted:?}");
    assert!(granted[2] > 0, "ahead of the clock: {granted:?}");
    let plain = grant("acquire", "fencelock:{sf}:b:lock", "clock", "60000");
    assert!(plain[0] == 1 && plain[1] < high, "{plain:?}");
    // A free lock with a key takes its own fence, not the floor: from the clock here.
    let free = "fencelock:{sf}:free:lock";
    let _: () = node.cmd(redis::cmd("HSET").arg(free).arg("until").arg("0 123 "));
    let _: () = node.cmd(redis::cmd("PEXPIRE").arg(free).arg(60_000));
    let own = grant("acquire_floor", free, "clock", "60000");
    assert!(own[0] == 1 && own[1] > 123 && own[1] < high, "{own:?}");
    // A counter (no grace) does not read the floor.
    let counter = grant("acquire_floor", "fencelock:{sf}:c:lock", "counter", "");
    assert_eq!(&counter[..2], &[1, 1], "{counter:?}");

    // The batch twin: every key without a state above the floor.
    let mut batch: Vec<&str> = Vec::new();
    for key in ["fencelock:{sf}:d:lock", "fencelock:{sf}:e:lock"] {
        batch.extend([key, "5", "me", "5000", "0", "clock", "60000"]);
    }
    let replies: Vec<redis::Value> = match eval_script(
        node,
        "acquire_floor_batch",
        &["fencelock:{sf}:d:lock"],
        &batch,
    ) {
        redis::Value::Array(items) => items,
        other => panic!("not an array: {other:?}"),
    };
    let fences: Vec<i64> = replies
        .into_iter()
        .map(|reply| common::grant_values(reply)[1])
        .collect();
    assert_eq!(fences, [high + 1, high + 1]);

    // lock_all_floor and lock_all: {1, behind, fence_1, fence_2}.
    let all = |name: &str, keys: &[&str]| -> Vec<i64> {
        ints(eval_script(
            node,
            name,
            keys,
            &["me", "5000", "0", "clock", "60000"],
        ))
    };
    let floor_keys = ["fencelock:{sf}:f:lock", "fencelock:{sf}:g:lock"];
    assert_eq!(
        all("lock_all_floor", &floor_keys)[2..],
        [high + 1, high + 1]
    );
    let plain_keys = ["fencelock:{sf}:h:lock", "fencelock:{sf}:i:lock"];
    let plain_all = all("lock_all", &plain_keys);
    assert!(plain_all[2..].iter().all(|&f| f < high), "{plain_all:?}");

    // handoff_floor: a releasing holder whose lease ended and whose key the module deleted
    // hands the lock to its client's waiter above the floor ({code 0, handed 1, fence, behind}).
    let handed = ints(eval_script(
        node,
        "handoff_floor",
        &["fencelock:{sf}:hand:lock"],
        &[
            "aaaaaaaa-1",
            "",
            "",
            "aaaaaaaa-2",
            "5000",
            "0",
            "clock",
            "100",
            "1",
            "60000",
        ],
    ));
    assert_eq!(handed[..3], [0, 1, high + 1], "{handed:?}");

    // A floor that is not a number, or a key of another type: 0.
    set_floor("not a number");
    let odd = grant("acquire_floor", "fencelock:{sf}:j:lock", "clock", "60000");
    assert!(odd[0] == 1 && odd[1] < high, "{odd:?}");
    let _: () = node.cmd(redis::cmd("DEL").arg(FLOOR_KEY));
    let _: () = node.cmd(redis::cmd("HSET").arg(FLOOR_KEY).arg("x").arg(high));
    let hashed = grant("acquire_floor", "fencelock:{sf}:k:lock", "clock", "60000");
    assert!(hashed[0] == 1 && hashed[1] < high, "{hashed:?}");

    // A client's multi-lock of one slot (lock_all_floor: the module has no multi-lock).
    let _: () = node.cmd(redis::cmd("DEL").arg(FLOOR_KEY));
    set_floor(&high.to_string());
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(10)).tag("mt");
    let guard = client.lock_all(&["x", "y"], &options).await.unwrap();
    let fences: Vec<u64> = guard.fences().into_iter().map(|(_, f)| f.get()).collect();
    assert_eq!(fences, [high as u64 + 1, high as u64 + 1], "{fences:?}");
    guard.release().await.unwrap();

    // `list_locks` reports the floor key's value (none without one), and `fencelock list`
    // notes it on stderr.
    assert_eq!(
        client.list_locks(10_000).await.unwrap().floor,
        Some(high as u64)
    );
    let listed = std::process::Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env_remove("FENCELOCK_URL")
        .args(["--url", &server.url(), "list"])
        .output()
        .expect("run fencelock");
    assert!(listed.status.success(), "{listed:?}");
    let stderr = String::from_utf8_lossy(&listed.stderr);
    assert!(
        stderr.contains(&format!("the floor key holds {high}")),
        "{stderr}"
    );
    let _: () = node.cmd(redis::cmd("DEL").arg(FLOOR_KEY));
    assert_eq!(client.list_locks(10_000).await.unwrap().floor, None);
}

/// Starts `redis-server server_args… --loadmodule PATH module_args…` (on a free port of
/// 127.0.0.1, its cluster bus port free too) and returns its log once it has exited: the module refused to load. A server still
/// running after 20 s is stopped by its pid and the test fails.
fn fencelock_module_refuses(module_args: &[&str], server_args: &[&str]) -> String {
    let dir = std::env::temp_dir().join(format!("fencelock-module-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let log = dir.join("redis.log");
    let port = common::free_port();
    let mut child = std::process::Command::new("redis-server")
        .arg("--port")
        .arg(port.to_string())
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--save")
        .arg("")
        .arg("--unixsocket")
        .arg(dir.join("redis.sock"))
        .arg("--dir")
        .arg(&dir)
        .arg("--logfile")
        .arg(&log)
        .arg("--cluster-config-file")
        .arg(dir.join("nodes.conf"))
        .args(server_args)
        .arg("--loadmodule")
        .arg(common::module::module_path())
        .args(module_args)
        .spawn()
        .expect("redis-server runs");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("the server's status") {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        status.is_some_and(|s| !s.success()),
        "the server ran with a bad module argument: {text}"
    );
    text
}

/// A field name made at run time, for a case's fields.
fn named(name: String) -> &'static str {
    Box::leak(name.into_boxed_str())
}

#[test]
fn the_module_keeps_a_busy_callers_queue_place_as_the_script_does() {
    let server = Standalone::start_with_module();
    let now = server_ms(&server);
    let held = format!("{} 123456789 you", now + 5000);
    let args = ["me", "30000", "0", "clock", "600000", "60000"];
    let case =
        |name, until: String, args: &[&'static str]| Case::new(name, until, now + 9000, args);
    let mut full = case("full", held.clone(), &args);
    for i in 0..399 {
        full = full.with(named(format!("x:{i}")), "1");
    }
    let cases = vec![
        case("new-place", held.clone(), &args),
        case("behind-others", format!("{held} wq"), &args)
            .with("qseq", "7")
            .with("qh", "7")
            .with("q:x", &format!("7 {}", now + 500_000))
            .with("g:x", "30000 600000 0 clock")
            .with("s:7", "x"),
        case("kept-place", format!("{held} wq"), &args)
            .with("qseq", "3")
            .with("q:me", &format!("3 {}", now + 100))
            .with("g:me", "1 2 3 clock")
            .with("s:3", "me"),
        case("reentered-holder", format!("{held} h2"), &args)
            .with("h:", "1")
            .with("h:a1", "1"),
        case(
            "no-grace",
            held.clone(),
            &["me", "30000", "0", "clock", "600000", ""],
        ),
        Case::new("expiry-later", held.clone(), now + 900_000, &args),
        full,
    ];
    differential(&server, "fencelock.acquire", "acquire", cases);
}

#[test]
fn the_module_hands_a_released_lock_to_the_queue_as_the_script_does() {
    let server = Standalone::start_with_module();
    let now = server_ms(&server);
    let lease = now + 5000;
    let mine = format!("{lease} 123456789 me wq");
    let plain = ["me", "", "p", "60000"];
    let fresh = |seq: u64| format!("{seq} {}", now + 590_000);
    let case =
        |name, until: String, args: &[&'static str]| Case::new(name, until, now + 9000, args);
    // One place queued at seq 1 (owner `a`, counter fences: deterministic), and a second one.
    let one = |name, until: String, grant: &str, args: &[&'static str]| {
        case(name, until, args)
            .with("qseq", "1")
            .with("s:1", "a")
            .with("q:a", &fresh(1))
            .with("g:a", grant)
    };
    let two = |name, until: String, args: &[&'static str]| {
        one(name, until, "30000 600000 0 counter", args)
            .with("qseq", "2")
            .with("s:2", "b")
            .with("q:b", &fresh(2))
            .with("g:b", "30000 600000 0 counter")
    };
    let mut long_walk = case("long-walk", mine.clone(), &plain).with("qseq", "70");
    for i in 1..=70 {
        long_walk = long_walk.with(named(format!("s:{i}")), "gone");
    }
    let cases = vec![
        two("head-of-two", mine.clone(), &plain),
        one("last-one", mine.clone(), "30000 600000 0 counter", &plain),
        one(
            "clock-fence-ahead",
            format!("{lease} 5000000000000005 me wq"),
            "30000 600000 0 clock",
            &plain,
        ),
        one(
            "floor",
            mine.clone(),
            "30000 600000 999999999 counter",
            &plain,
        ),
        one("unknown-mode", mine.clone(), "30000 600000 0 weird", &plain),
        one(
            "epoch-on-standalone",
            mine.clone(),
            "30000 600000 0 hybrid",
            &plain,
        ),
        one(
            "no-announcement",
            mine.clone(),
            "30000 600000 0 counter",
            &["me", "", "", "60000"],
        ),
        one(
            "no-grace",
            mine.clone(),
            "30000 600000 0 counter",
            &["me", "", "p", ""],
        ),
        one(
            "bad-arguments",
            mine.clone(),
            "30000 600000 x counter",
            &plain,
        ),
        case("stale-head", mine.clone(), &plain)
            .with("qseq", "1")
            .with("s:1", "a")
            .with("q:a", &format!("1 {}", now + 1000))
            .with("g:a", "30000 600000 0 counter"),
        case("no-arguments", mine.clone(), &plain)
            .with("qseq", "1")
            .with("s:1", "a")
            .with("q:a", &fresh(1)),
        case("dead-then-live", mine.clone(), &plain)
            .with("qseq", "3")
            .with("qh", "1")
            .with("s:1", "a")
            .with("q:a", &format!("1 {}", now - 10))
            .with("g:a", "30000 600000 0 counter")
            .with("s:3", "c")
            .with("q:c", &fresh(3))
            .with("g:c", "30000 600000 0 counter"),
        case("moved-entry", mine.clone(), &plain)
            .with("qseq", "2")
            .with("s:1", "a")
            .with("q:a", &fresh(5))
            .with("g:a", "30000 600000 0 counter"),
        case("no-head", mine.clone(), &plain)
            .with("qseq", "1")
            .with("s:1", "a")
            .with("q:a", &format!("1 {}", now - 10)),
        // A clock fence as the head's floor (16 digits, below 2^53), and SPUBLISH.
        one(
            "clock-floor",
            mine.clone(),
            "30000 600000 5000000000000000 clock",
            &["me", "", "s", "60000"],
        ),
        case("no-index", mine.clone(), &plain)
            .with("qseq", "4")
            .with("qh", "5")
            .with("q:old", &fresh(2)),
        long_walk,
        two(
            "reentered-last",
            format!("{lease} 123456789 me h1 wq"),
            &["me", "a1", "p", "60000"],
        )
        .with("h:a1", "1"),
        // A release after the lease ended (0) hands the lock on all the same.
        two(
            "expired-holder",
            format!("{} 123456789 me wq", now - 10),
            &plain,
        ),
        case(
            "expired-no-head",
            format!("{} 123456789 me wq", now - 10),
            &plain,
        )
        .with("qseq", "1")
        .with("s:1", "a")
        .with("q:a", &format!("1 {}", now - 10)),
    ];
    differential(&server, "fencelock.release", "release", cases);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_module_hands_a_queued_lock_from_client_to_client_in_arrival_order() {
    let server = Standalone::start_with_module();
    let key = "fencelock:{hot}:lock";
    let places = |node: &common::Node| {
        let fields: Vec<String> = node.cmd(redis::cmd("HKEYS").arg(key));
        fields.iter().filter(|f| f.starts_with("q:")).count()
    };
    let holder = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = holder.lock("hot", &options).await.unwrap();
    let mut waiters = Vec::new();
    for queued in 1..=4 {
        let client = Client::connect([server.url()]).await.unwrap();
        let task = {
            let (client, options) = (
                client.clone(),
                options.clone().timeout(Duration::from_secs(20)),
            );
            tokio::spawn(async move {
                let guard = client.lock("hot", &options).await?;
                let fence = guard.fence();
                guard.release().await?;
                Ok::<_, Error>(fence)
            })
        };
        common::eventually("the waiter to queue", Duration::from_secs(5), || {
            places(&server.node) == queued
        })
        .await;
        waiters.push((client, task));
    }
    let scripts = server.node.script_calls();
    let mut fences = vec![guard.fence()];
    guard.release().await.unwrap();
    let mut renewals = holder.stats().renewal_calls;
    for (client, task) in waiters {
        fences.push(task.await.unwrap().expect("handed in turn"));
        let stats = client.stats();
        assert_eq!(stats.module_fallbacks, 0, "{stats:?}");
        renewals += stats.renewal_calls;
    }
    assert!(strictly_increasing(&fences), "arrival order: {fences:?}");
    assert_eq!(places(&server.node), 0);
    assert_eq!(holder.stats().module_fallbacks, 0);
    // The handoffs ran in the module: scripts only renewed places, if anything.
    assert!(
        server.node.script_calls() - scripts <= renewals,
        "{} script calls",
        server.node.script_calls() - scripts
    );
    let free = holder.try_lock("hot", &options).await.unwrap();
    assert!(free.fence() > *fences.last().unwrap());
    free.release().await.unwrap();
}

#[test]
fn the_module_serves_the_fair_lock_as_the_script_does() {
    let server = Standalone::start_with_module();
    let now = server_ms(&server);
    let lease = now + 5000;
    let fresh = |seq: u64| format!("{seq} {}", now + 590_000);
    let grant = "30000 600000 0 counter";
    let wait = ["me", "30000", "0", "counter", "600000", "128", "60000"];
    let once = ["me", "30000", "0", "counter", "0", "128", "60000"];
    let case =
        |name, until: String, args: &[&'static str]| Case::new(name, until, now + 9000, args);
    let held = format!("{lease} 123456789 you");
    let queued_free = "0 123456789  wq".to_owned();
    // `a` queued at seq 1 and `b` at 2.
    let two = |name, until: String, args: &[&'static str]| {
        case(name, until, args)
            .with("qseq", "2")
            .with("s:1", "a")
            .with("q:a", &fresh(1))
            .with("g:a", grant)
            .with("s:2", "b")
            .with("q:b", &fresh(2))
            .with("g:b", grant)
    };
    let mut long_walk = case("long-walk", queued_free.clone(), &wait).with("qseq", "70");
    // A held lock whose index spans more than a release's walk: walked by the busy call too.
    let mut busy_long_walk = case("busy-long-walk", format!("{held} wq"), &wait).with("qseq", "70");
    for i in 1..=70 {
        long_walk = long_walk.with(named(format!("s:{i}")), "gone");
        busy_long_walk = busy_long_walk.with(named(format!("s:{i}")), "gone");
    }
    let acquires = vec![
        case("no-key", String::new(), &wait),
        case("free", "0 123456789 ".to_owned(), &wait),
        case(
            "expired-other",
            format!("{} 123456789 you", now - 10),
            &wait,
        ),
        case(
            "floor",
            "0 123456789 ".to_owned(),
            &[
                "me",
                "30000",
                "999999999",
                "counter",
                "600000",
                "128",
                "60000",
            ],
        ),
        case("resend", format!("{lease} 123456789 me wq"), &wait),
        case("busy-new", held.clone(), &wait),
        two("busy-behind", format!("{held} wq"), &wait),
        two("busy-kept", format!("{held} wq"), &wait)
            .with("qseq", "3")
            .with("s:3", "me")
            .with("q:me", &fresh(3))
            .with("g:me", grant),
        // A held lock's queue is not walked: the gone head at seq 1 stays for the release.
        case("busy-gone-head", format!("{held} wq"), &wait)
            .with("qseq", "2")
            .with("s:1", "a")
            .with("q:a", &format!("1 {}", now - 10))
            .with("g:a", grant)
            .with("s:2", "b")
            .with("q:b", &fresh(2))
            .with("g:b", grant),
        busy_long_walk,
        two("one-shot-busy", format!("{held} wq"), &once),
        two("one-shot-placed", format!("{held} wq"), &once)
            .with("qseq", "3")
            .with("s:3", "me")
            .with("q:me", &fresh(3)),
        two(
            "full",
            format!("{held} wq"),
            &["me", "30000", "0", "counter", "600000", "2", "60000"],
        ),
        case("head-grant", queued_free.clone(), &wait)
            .with("qseq", "2")
            .with("s:1", "me")
            .with("q:me", &fresh(1))
            .with("g:me", grant)
            .with("s:2", "b")
            .with("q:b", &fresh(2))
            .with("g:b", grant),
        case("head-grant-last", queued_free.clone(), &wait)
            .with("qseq", "1")
            .with("s:1", "me")
            .with("q:me", &fresh(1))
            .with("g:me", grant),
        // Waits within 100 s, so that `alike` allows for the milliseconds between the calls.
        case("not-head", queued_free.clone(), &wait)
            .with("qseq", "2")
            .with("s:1", "a")
            .with("q:a", &format!("1 {}", now + 90_000))
            .with("g:a", grant)
            .with("s:2", "b")
            .with("q:b", &format!("2 {}", now + 95_000))
            .with("g:b", grant),
        case("all-gone", queued_free.clone(), &wait)
            .with("qseq", "1")
            .with("s:1", "a")
            .with("q:a", &format!("1 {}", now - 10))
            .with("g:a", grant),
        case("own-place-gone", queued_free.clone(), &wait)
            .with("qseq", "2")
            .with("s:1", "me")
            .with("q:me", &format!("1 {}", now - 10))
            .with("s:2", "b")
            .with("q:b", &format!("2 {}", now + 95_000))
            .with("g:b", grant),
        long_walk,
        case(
            "no-grace",
            held.clone(),
            &["me", "30000", "0", "counter", "600000", "128", ""],
        ),
        two("unreadable-own-place", format!("{held} wq"), &wait).with("q:me", "x y"),
        two(
            "full-free",
            queued_free.clone(),
            &["me", "30000", "0", "counter", "600000", "2", "60000"],
        )
        .with("q:a", &format!("1 {}", now + 90_000))
        .with("q:b", &format!("2 {}", now + 95_000)),
        // The caller heads the queue while another owner holds the lock: busy, its place kept.
        case("head-while-held", format!("{held} wq"), &wait)
            .with("qseq", "1")
            .with("s:1", "me")
            .with("q:me", &fresh(1))
            .with("g:me", grant),
    ];
    differential(&server, "fencelock.fair_acquire", "fair_acquire", acquires);

    let plain = ["me", "", "p", "60000"];
    let mine = format!("{lease} 123456789 me wq");
    let releases = vec![
        case("plain", format!("{lease} 123456789 me"), &plain),
        case("expired", format!("{} 123456789 me", now - 10), &plain),
        case("other", held.clone(), &plain),
        case("forced", "0 123456789 ".to_owned(), &plain).with("forced", "me"),
        case("no-key", String::new(), &plain),
        two("hand", mine.clone(), &plain),
        two(
            "expired-hand",
            format!("{} 123456789 me wq", now - 10),
            &plain,
        ),
        two("no-announcement", mine.clone(), &["me", "", "", "60000"]),
        case("stale-head", mine.clone(), &plain)
            .with("qseq", "1")
            .with("s:1", "a")
            .with("q:a", &format!("1 {}", now + 1000))
            .with("g:a", grant),
        case("no-head", mine.clone(), &plain)
            .with("qseq", "1")
            .with("s:1", "a")
            .with("q:a", &format!("1 {}", now - 10)),
    ];
    differential(&server, "fencelock.fair_release", "fair_release", releases);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_module_serves_the_fair_lock_from_client_to_client_in_arrival_order() {
    let server = Standalone::start_with_module();
    let key = "fencelock:{fair-hot}:fair";
    let places = |node: &common::Node| {
        let fields: Vec<String> = node.cmd(redis::cmd("HKEYS").arg(key));
        fields.iter().filter(|f| f.starts_with("q:")).count()
    };
    let holder = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let guard = holder.fair_lock("fair-hot", &options).await.unwrap();
    let mut waiters = Vec::new();
    for queued in 1..=3 {
        let client = Client::connect([server.url()]).await.unwrap();
        let task = {
            let client = client.clone();
            let options = options.clone().timeout(Duration::from_secs(20));
            tokio::spawn(async move {
                let guard = client.fair_lock("fair-hot", &options).await?;
                let fence = guard.fence();
                guard.release().await?;
                Ok::<_, Error>(fence)
            })
        };
        common::eventually("the waiter to queue", Duration::from_secs(5), || {
            places(&server.node) == queued
        })
        .await;
        waiters.push((client, task));
    }
    let mut fences = vec![guard.fence()];
    guard.release().await.unwrap();
    for (client, task) in waiters {
        fences.push(task.await.unwrap().expect("handed in turn"));
        let stats = client.stats();
        assert!(stats.module_calls >= 2, "{stats:?}");
        assert_eq!(stats.module_fallbacks, 0, "{stats:?}");
    }
    assert!(strictly_increasing(&fences), "arrival order: {fences:?}");
    assert_eq!(places(&server.node), 0);
    assert!(server.node.calls("fencelock.fair_release") >= 4);
}

#[test]
fn the_module_grants_a_free_queued_mutex_as_the_script_does() {
    let server = Standalone::start_with_module();
    let now = server_ms(&server);
    let queued_free = "0 123456789  wq".to_owned();
    let grant = "30000 600000 0 counter";
    let wait = ["me", "30000", "0", "counter", "600000", "60000"];
    let once = ["me", "30000", "0", "counter", "60000"];
    let case = |name, args: &[&'static str]| Case::new(name, queued_free.clone(), now + 9000, args);
    // Places whose leases end within 100 s, so that `alike` allows for the ms between the calls.
    let near = |seq: i64| format!("{seq} {}", now + 90_000 + seq);
    let mut long_walk = case("long-walk", &wait).with("qseq", "70");
    for i in 1..=70 {
        long_walk = long_walk.with(named(format!("s:{i}")), "gone");
    }
    // Another head, and the hash at 400 fields: no place for the caller.
    let mut full_free = case("full", &wait)
        .with("qseq", "1")
        .with("s:1", "a")
        .with("q:a", &near(1))
        .with("g:a", grant);
    for i in 0..395 {
        full_free = full_free.with(named(format!("x:{i}")), "1");
    }
    let cases = vec![
        case("head-is-me", &wait)
            .with("qseq", "2")
            .with("s:1", "me")
            .with("q:me", &near(1))
            .with("g:me", grant)
            .with("s:2", "b")
            .with("q:b", &near(2))
            .with("g:b", grant),
        case("last-is-me", &wait)
            .with("qseq", "1")
            .with("s:1", "me")
            .with("q:me", &near(1))
            .with("g:me", grant),
        case("all-gone", &wait)
            .with("qseq", "1")
            .with("s:1", "a")
            .with("q:a", &format!("1 {}", now - 10)),
        case("not-head", &wait)
            .with("qseq", "1")
            .with("s:1", "a")
            .with("q:a", &near(1))
            .with("g:a", grant),
        case("not-head-kept", &wait)
            .with("qseq", "2")
            .with("s:1", "a")
            .with("q:a", &near(1))
            .with("g:a", grant)
            .with("s:2", "me")
            .with("q:me", &near(2))
            .with("g:me", grant),
        case("not-head-once", &once)
            .with("qseq", "1")
            .with("s:1", "a")
            .with("q:a", &near(1))
            .with("g:a", grant),
        long_walk,
        Case::new(
            "expired-owner-kept",
            format!("{} 123456789 you wq", now - 10),
            now + 9000,
            &wait,
        )
        .with("qseq", "1")
        .with("s:1", "a")
        .with("q:a", &near(1))
        .with("g:a", grant),
        case("own-place-gone", &wait)
            .with("qseq", "2")
            .with("s:1", "me")
            .with("q:me", &format!("1 {}", now - 10))
            .with("g:me", grant)
            .with("s:2", "a")
            .with("q:a", &near(2))
            .with("g:a", grant),
        full_free,
        case("no-grace", &["me", "30000", "0", "counter", "600000", ""])
            .with("qseq", "1")
            .with("s:1", "me")
            .with("q:me", &near(1))
            .with("g:me", grant),
        // An older client's mark over the queue's: the caller's own place goes with its grant.
        Case::new(
            "overwritten-mark",
            "0 123456789  wold12345".into(),
            now + 9000,
            &wait,
        )
        .with("qseq", "2")
        .with("s:1", "me")
        .with("q:me", &near(1))
        .with("g:me", grant)
        .with("s:2", "a")
        .with("q:a", &near(2))
        .with("g:a", grant),
        Case::new(
            "overwritten-mark-once",
            "0 123456789  w*".into(),
            now + 9000,
            &once,
        )
        .with("qseq", "1")
        .with("s:1", "me")
        .with("q:me", &near(1))
        .with("g:me", grant),
    ];
    differential(&server, "fencelock.acquire", "acquire", cases);
}

#[test]
fn the_module_announces_a_handoff_as_the_script_does() {
    let server = Standalone::start_with_module();
    let now = server_ms(&server);
    let release = fencelock::lua_scripts()
        .find(|s| s.name == "release")
        .expect("the script");
    let client = redis::Client::open(server.url()).unwrap();
    let mut subscriber = client.get_connection().unwrap();
    let mut pubsub = subscriber.as_pubsub();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    // A fresh head (granted, its grant announced) and a stale one (only woken).
    for (name, place_end) in [("fresh", now + 590_000), ("stale", now + 1000)] {
        let mut heard = Vec::new();
        for path in ["m", "s"] {
            let key = format!("{{{path}-{name}}}:lock");
            let _: () = server.node.cmd(
                redis::cmd("HSET")
                    .arg(&key)
                    .arg("until")
                    .arg(format!("{} 123456789 me wq", now + 5000))
                    .arg("qseq")
                    .arg(1)
                    .arg("s:1")
                    .arg("a0000000x")
                    .arg("q:a0000000x")
                    .arg(format!("1 {place_end}"))
                    .arg("g:a0000000x")
                    .arg("30000 600000 0 counter"),
            );
            let channel = format!("{key}:w:a0000000");
            pubsub.subscribe(&channel).unwrap();
            let args = ["me", "", "p", "60000"];
            let reply: i64 = if path == "m" {
                server
                    .node
                    .cmd(redis::cmd("fencelock.release").arg(&key).arg(&args))
            } else {
                server.node.cmd(
                    redis::cmd("EVAL")
                        .arg(release.source)
                        .arg(1)
                        .arg(&key)
                        .arg(&args),
                )
            };
            assert_eq!(reply, 1, "{name} {path}");
            let message = pubsub.get_message().expect("the announcement");
            assert_eq!(message.get_channel_name(), channel);
            heard.push(message.get_payload::<String>().unwrap());
            pubsub.unsubscribe(&channel).unwrap();
        }
        assert_eq!(heard[0], heard[1], "{name}: module, script");
        let expected = if name == "fresh" {
            "a0000000x 123456790 0 30000"
        } else {
            ""
        };
        assert_eq!(heard[0], expected, "{name}");
    }
}
