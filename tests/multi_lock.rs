//! The multi-lock (`Client::lock_all`/`try_lock_all`, `exec NAME1 NAME2 -- CMD`) on real
//! servers: all or nothing, no deadlock whatever the callers' orders, one script for one slot,
//! fences per name, loss of one member, cancel safety.

mod common;

use std::collections::HashMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Cluster, Standalone};
use fencelock::{Client, Error, Kind, LockOptions, Placement};

/// Whether mutex `name` is held, as `inspect` reads it.
async fn held(client: &Client, name: &str, placement: &Placement) -> bool {
    client
        .inspect_at(Kind::Mutex, name, placement)
        .await
        .unwrap()
        .held
}

/// The options with `tag` (or none) and the matching placement.
fn tagged(options: &LockOptions, tag: Option<&str>) -> (LockOptions, Placement) {
    match tag {
        Some(tag) => (options.clone().tag(tag), Placement::Tag(tag.to_owned())),
        None => (options.clone(), Placement::ByName),
    }
}

/// Polls until none of `names` is held, panicking after `limit`.
async fn none_held_within(client: &Client, names: &[&str], placement: &Placement, limit: Duration) {
    let until = Instant::now() + limit;
    loop {
        let mut still = Vec::new();
        for name in names {
            if held(client, name, placement).await {
                still.push(*name);
            }
        }
        if still.is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "still held after {limit:?}: {still:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A small deterministic generator (xorshift), for random orders and moments.
struct Rng(u64);

impl Rng {
    fn next(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % below
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn all_or_nothing_with_fences_per_name_across_nodes_and_in_one_slot() {
    let cluster = Cluster::start();
    let holder = Client::connect(cluster.urls()).await.unwrap();
    let other = Client::connect(cluster.urls()).await.unwrap();
    let short = LockOptions::new().timeout(Duration::from_millis(300));
    let names = ["acct:a", "acct:b", "acct:c", "acct:d"];
    let slots: std::collections::HashSet<u16> = names
        .iter()
        .map(|n| holder.keys(n, &short).unwrap().slot())
        .collect();
    assert!(slots.len() > 1, "the names span slots: {slots:?}");

    for tag in [None, Some("accounts")] {
        let (options, placement) = tagged(&short, tag);
        // One member held by another: nothing else is taken, by try_lock_all or lock_all.
        let blocker = other.lock("acct:c", &options).await.unwrap();
        let err = holder.try_lock_all(&names, &options).await.unwrap_err();
        assert!(
            matches!(&err, Error::Busy { name, .. } if name == "acct:c"),
            "{err:?}"
        );
        let started = Instant::now();
        let err = holder.lock_all(&names, &options).await.unwrap_err();
        assert!(err.is_busy(), "{err:?}");
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(started.elapsed() < Duration::from_secs(3), "one deadline");
        none_held_within(
            &holder,
            &["acct:a", "acct:b", "acct:d"],
            &placement,
            Duration::from_secs(1),
        )
        .await;
        blocker.release().await.unwrap();

        // Free: all granted, fences by name in the caller's order, matching the keys'.
        let order = ["acct:d", "acct:b", "acct:a", "acct:c"];
        let guard = holder.lock_all(&order, &options).await.unwrap();
        let fences = guard.fences();
        assert_eq!(
            fences.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            order.to_vec()
        );
        let mut first = HashMap::new();
        for (name, fence) in &fences {
            let seen = holder
                .inspect_at(Kind::Mutex, name, &placement)
                .await
                .unwrap();
            assert!(seen.held);
            assert_eq!(seen.fence, Some(*fence), "{name}");
            assert_eq!(guard.fence(name), Some(*fence));
            first.insert(name.to_string(), *fence);
        }
        assert_eq!(guard.fence("acct:zz"), None);
        // The full lease, not the provisional one.
        assert!(guard.valid_until() > Instant::now() + Duration::from_secs(20));
        assert!(other
            .try_lock("acct:a", &options)
            .await
            .unwrap_err()
            .is_busy());
        guard.release().await.unwrap();
        none_held_within(&holder, &names, &placement, Duration::from_secs(1)).await;

        // Taken again: every fence is above its last one.
        let again = holder.try_lock_all(&names, &options).await.unwrap();
        for (name, fence) in again.fences() {
            assert!(fence > first[name], "{name}: {fence} after {}", first[name]);
        }
        again.release().await.unwrap();
    }

    // Bad input: clear errors, no panic.
    for bad in [&[][..], &["x", "x"][..], &["ok", ""][..]] {
        let err = holder.lock_all(bad, &short).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidOptions { .. } | Error::InvalidName { .. }
            ),
            "{bad:?}: {err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_of_one_slot_are_taken_by_one_script_call() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let tagged = LockOptions::new().tag("orders");
    let before = client.stats();
    let guard = client
        .lock_all(&["o:1", "o:2", "o:3", "o:4", "o:5"], &tagged)
        .await
        .unwrap();
    let after = client.stats();
    assert_eq!(after.acquire_attempts - before.acquire_attempts, 1);
    assert_eq!(after.grants - before.grants, 1);
    let calls = |info: &str| -> u64 {
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    };
    let info = server.node.info("commandstats");
    let fences: Vec<i64> = guard.fences().iter().map(|(_, f)| i64::from(*f)).collect();
    assert_eq!(fences.len(), 5);
    guard.release().await.unwrap();

    // A fresh client: one script call on the server for the whole set.
    let fresh = Client::connect([server.url()]).await.unwrap();
    let before = calls(&server.node.info("commandstats"));
    let guard = fresh
        .try_lock_all(&["o:1", "o:2", "o:3"], &tagged)
        .await
        .unwrap();
    let after = calls(&server.node.info("commandstats"));
    assert_eq!(after - before, 1, "one EVALSHA/EVAL for three keys\n{info}");
    // The cross-slot path takes one call per member and one extend each.
    let untagged = LockOptions::new();
    let before_stats = fresh.stats();
    let spread = fresh
        .try_lock_all(&["p:1", "p:2", "p:3"], &untagged)
        .await
        .unwrap();
    assert_eq!(
        fresh.stats().acquire_attempts - before_stats.acquire_attempts,
        3
    );
    spread.release().await.unwrap();
    guard.release().await.unwrap();

    // The script by hand: a resend of the same owner's call is answered with the same fences
    // and writes nothing; another owner is refused naming the first key held, writing nothing.
    let source = fencelock::lua_scripts()
        .find(|s| s.name == "lock_all")
        .unwrap()
        .source;
    let keys: Vec<String> = ["h:1", "h:2", "h:3"]
        .iter()
        .map(|n| client.keys(n, &tagged).unwrap().lock_key().to_owned())
        .collect();
    let eval = |owner: &str| {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(source).arg(keys.len()).arg(&keys);
        cmd.arg(owner).arg("10000").arg("0").arg("counter").arg("");
        cmd
    };
    let first: Vec<i64> = server.node.cmd(&mut eval("owner-1"));
    assert_eq!(first[0], 1, "{first:?}");
    assert_eq!(first.len(), 5);
    let resent: Vec<i64> = server.node.cmd(&mut eval("owner-1"));
    assert_eq!(resent[0], 2, "{resent:?}");
    assert_eq!(resent[2..], first[2..], "same fences");
    let refused: Vec<i64> = server.node.cmd(&mut eval("owner-2"));
    assert_eq!((refused[0], refused[2]), (0, 1), "{refused:?}");
    assert!(refused[1] > 0 && refused[1] <= 10_000);
    let owners: Vec<Option<String>> = keys
        .iter()
        .map(|k| server.node.cmd(redis::cmd("HGET").arg(k).arg("owner")))
        .collect();
    assert!(
        owners.iter().all(|o| o.as_deref() == Some("owner-1")),
        "{owners:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn callers_in_opposite_orders_never_deadlock() {
    let cluster = Cluster::start();
    let urls = cluster.urls();
    let names = ["dl:a", "dl:b", "dl:c", "dl:d"];
    let inside: Arc<HashMap<&str, AtomicBool>> =
        Arc::new(names.iter().map(|n| (*n, AtomicBool::new(false))).collect());
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .timeout(Duration::from_secs(20));
    let mut tasks = Vec::new();
    for task in 0..8u64 {
        let client = Client::connect(urls.clone()).await.unwrap();
        let (inside, options) = (Arc::clone(&inside), options.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ ((task + 1) * 0x1234_5678));
            let until = Instant::now() + Duration::from_secs(3);
            let mut rounds = 0;
            while Instant::now() < until {
                let mut set = names.to_vec();
                for i in (1..set.len()).rev() {
                    set.swap(i, usize::try_from(rng.next(i as u64 + 1)).unwrap());
                }
                set.truncate(2 + usize::try_from(rng.next(3)).unwrap());
                let guard = client.lock_all(&set, &options).await.unwrap();
                for name in &set {
                    assert!(
                        !inside[name].swap(true, Ordering::SeqCst),
                        "{name} held twice"
                    );
                }
                tokio::time::sleep(Duration::from_millis(rng.next(5))).await;
                for name in &set {
                    inside[name].store(false, Ordering::SeqCst);
                }
                guard.release().await.unwrap();
                rounds += 1;
            }
            rounds
        }));
    }
    let finished = tokio::time::timeout(Duration::from_secs(30), async {
        let mut rounds = 0;
        for task in tasks {
            rounds += task.await.unwrap();
        }
        rounds
    })
    .await
    .expect("every caller finishes: no deadlock");
    assert!(finished >= 8, "{finished} rounds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lost_reports_the_loss_of_any_member() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    for tag in [None, Some("lost")] {
        let (options, placement) = tagged(&LockOptions::new(), tag);
        let options = options.ttl(Duration::from_millis(600)).watchdog(true);
        let guard = client
            .lock_all(&["l:a", "l:b", "l:c"], &options)
            .await
            .unwrap();
        // Renewed past the TTL.
        tokio::select! {
            lost = guard.lost() => panic!("lost while renewed: {lost}"),
            () = tokio::time::sleep(Duration::from_millis(1500)) => {}
        }
        assert!(guard.is_valid());
        let key = client.keys("l:b", &options).unwrap().lock_key().to_owned();
        let _: i64 = server.node.cmd(redis::cmd("DEL").arg(&key));
        let lost = tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .expect("the loss of one member is reported");
        assert!(lost.to_string().contains("l:b"), "{lost}");
        assert!(lost.is_lock_lost(), "{lost:?}");
        assert!(!guard.is_valid());
        let released = guard.release().await;
        assert!(released.is_err(), "the release reports the loss");
        none_held_within(
            &client,
            &["l:a", "l:b", "l:c"],
            &placement,
            Duration::from_secs(1),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_dropped_at_any_moment_leaves_nothing_held() {
    let cluster = Cluster::start();
    let client = Client::connect(cluster.urls()).await.unwrap();
    let other = Client::connect(cluster.urls()).await.unwrap();
    let names = ["cs:a", "cs:b", "cs:c", "cs:d", "cs:e"];
    let mut rng = Rng(0xdead_beef_cafe);
    for tag in [None, Some("cancel")] {
        let (options, placement) = tagged(&LockOptions::new(), tag);
        let options = options.timeout(Duration::from_secs(5));
        for round in 0..25 {
            // Sometimes a member is busy for a moment, so the call waits in the middle.
            let blocker = if round % 2 == 0 {
                Some(
                    other
                        .lock(names[usize::try_from(rng.next(5)).unwrap()], &options)
                        .await
                        .unwrap(),
                )
            } else {
                None
            };
            let cut = Duration::from_micros(rng.next(15_000));
            let call = client.lock_all(&names, &options);
            let releaser = async {
                tokio::time::sleep(Duration::from_micros(rng.next(10_000))).await;
                if let Some(blocker) = blocker {
                    blocker.release().await.unwrap();
                }
            };
            let (outcome, ()) = tokio::join!(tokio::time::timeout(cut, call), releaser);
            if let Ok(granted) = outcome {
                drop(granted.unwrap());
            }
            none_held_within(&client, &names, &placement, Duration::from_secs(1)).await;
        }
    }
}

fn fencelock(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env_remove("FENCELOCK_URL")
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .expect("run fencelock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_with_several_names_exports_them_and_their_tokens_in_order() {
    let server = Standalone::start();
    let url = server.url();
    let output = fencelock(
        &url,
        &[
            "exec",
            "zeta",
            "alpha",
            "--",
            "sh",
            "-c",
            "echo $FENCELOCK_NAME; echo $FENCELOCK_TOKEN",
        ],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("zeta alpha"));
    let tokens: Vec<u64> = lines
        .next()
        .unwrap()
        .split(' ')
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(tokens.len(), 2);
    for (name, token) in ["zeta", "alpha"].iter().zip(&tokens) {
        let status = fencelock(&url, &["status", name, "--json"]);
        let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
        assert_eq!(status["held"], false, "{name} released after exit");
        assert_eq!(status["fence"].as_u64(), Some(*token), "{name}");
    }

    // One name: exactly as before (one token, one name).
    let one = fencelock(
        &url,
        &[
            "exec",
            "zeta",
            "--",
            "sh",
            "-c",
            "echo $FENCELOCK_NAME $FENCELOCK_TOKEN",
        ],
    );
    assert_eq!(one.status.code(), Some(0));
    let line = String::from_utf8(one.stdout).unwrap();
    let (name, token) = line.trim().split_once(' ').unwrap();
    assert_eq!(name, "zeta");
    assert!(token.parse::<u64>().unwrap() > tokens[0]);

    // Busy member: exit 75, nothing of the others held.
    let client = Client::connect([url.clone()]).await.unwrap();
    let blocker = client.lock("alpha", &LockOptions::new()).await.unwrap();
    let busy = fencelock(
        &url,
        &["exec", "--timeout", "200ms", "zeta", "alpha", "--", "true"],
    );
    assert_eq!(
        busy.status.code(),
        Some(75),
        "{}",
        String::from_utf8_lossy(&busy.stderr)
    );
    assert!(!held(&client, "zeta", &Placement::ByName).await);
    blocker.release().await.unwrap();

    // The other primitives' flags take one name.
    for flag in [
        &["--read"][..],
        &["--write"],
        &["--fair"],
        &["--permits", "2"],
    ] {
        let mut args = vec!["exec"];
        args.extend_from_slice(flag);
        args.extend_from_slice(&["a", "b", "--", "true"]);
        let refused = fencelock(&url, &args);
        assert_eq!(refused.status.code(), Some(64), "{flag:?}");
    }
}
