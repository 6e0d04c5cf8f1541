//! The multi-lock (`Client::lock_all`/`try_lock_all`, `fair_lock_all`/`try_fair_lock_all`,
//! `exec [--fair] NAME1 NAME2 -- CMD`) on real servers: all or nothing, no deadlock whatever
//! the callers' orders, one script for one slot, fences per name, loss of one member, cancel
//! safety, and fair members keeping their queues' arrival order.

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
    let info = server.node.info("commandstats");
    let fences: Vec<i64> = guard.fences().iter().map(|(_, f)| i64::from(*f)).collect();
    assert_eq!(fences.len(), 5);
    guard.release().await.unwrap();

    // A fresh client: one script call on the server for the whole set.
    let fresh = Client::connect([server.url()]).await.unwrap();
    let before = server.node.script_calls();
    let guard = fresh
        .try_lock_all(&["o:1", "o:2", "o:3"], &tagged)
        .await
        .unwrap();
    let after = server.node.script_calls();
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
        .map(|k| server.node.lock_field(k, "owner"))
        .collect();
    assert!(
        owners.iter().all(|o| o.as_deref() == Some("owner-1")),
        "{owners:?}"
    );
}

/// The mutex's acquire script run by hand on `key` for `owner`: TTL 30 s, clock mode, with a
/// place lease of `place` ms when given.
fn acquire_by_hand(
    node: &common::Node,
    key: &str,
    owner: &str,
    place: Option<&str>,
) -> redis::Value {
    let source = fencelock::lua_scripts()
        .find(|s| s.name == "acquire")
        .unwrap()
        .source;
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(source)
        .arg(1)
        .arg(key)
        .arg(owner)
        .arg("30000")
        .arg("0")
        .arg("clock");
    if let Some(place) = place {
        cmd.arg(place);
    }
    node.cmd(cmd.arg("10000"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_one_slot_multi_lock_does_not_take_a_lock_kept_for_its_queues_head() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let tagged = LockOptions::new().tag("queued");
    let key = |name: &str| client.keys(name, &tagged).unwrap().lock_key().to_owned();
    let (a, b) = (key("qa"), key("qb"));
    // b: a holder, and a caller of another client queued behind it with a 30 s place; then the
    // holder's lease ends without a release, so b is free with the queue's mark `q` and a live
    // head place (the state the queue's order is for: only the head may take it).
    acquire_by_hand(&server.node, &b, "clientaa-holder", None);
    let queued = acquire_by_hand(&server.node, &b, "clientbb-place", Some("30000"));
    assert_eq!(
        common::grant_values(queued)[0],
        0,
        "the second caller is busy and queues"
    );
    server.node.set_lock_field(&b, "until", "0");
    server.node.set_lock_field(&b, "owner", "");
    assert_eq!(server.node.lock_field(&b, "waiters").as_deref(), Some("q"));
    // A plain acquire without a place is refused there ...
    let plain = acquire_by_hand(&server.node, &b, "clientcc-plain", None);
    assert_eq!(
        common::grant_values(plain)[0],
        0,
        "acquire without a place: busy"
    );
    // ... and so is the multi-lock, which names b and takes neither key.
    match client.try_lock_all(&["qa", "qb"], &tagged).await {
        Err(Error::Busy {
            name, retry_after, ..
        }) => {
            assert_eq!(name, "qb");
            assert!(
                retry_after > Duration::from_secs(1),
                "the head place's lease left: {retry_after:?}"
            );
        }
        other => panic!("lock_all took a lock kept for the queue's head: {other:?}"),
    }
    assert_eq!(server.node.lock_field(&a, "owner"), None, "a not taken");
    assert_eq!(server.node.lock_field(&b, "owner"), None, "b not taken");
    let place: Option<String> = server
        .node
        .cmd(redis::cmd("HGET").arg(&b).arg("q:clientbb-place"));
    assert!(place.is_some(), "the head keeps its place");

    // Once the head's place is gone (withdrawn), the multi-lock is granted both, and the
    // queue's bookkeeping goes as an acquire's grant takes it: the index entry, the mark.
    server.node.cmd::<()>(
        redis::cmd("HDEL")
            .arg(&b)
            .arg("q:clientbb-place")
            .arg("g:clientbb-place"),
    );
    let guard = client.try_lock_all(&["qa", "qb"], &tagged).await.unwrap();
    assert_eq!(guard.fences().len(), 2);
    assert!(server.node.lock_field(&b, "owner").is_some());
    assert_eq!(
        server.node.lock_field(&b, "waiters"),
        None,
        "no entry left: no mark"
    );
    let index: (Option<String>, Option<String>) = server
        .node
        .cmd(redis::cmd("HMGET").arg(&b).arg("s:1").arg("qh"));
    assert_eq!(index, (None, Some("2".to_owned())));
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn members_taken_first_stay_held_while_each_later_one_comes_sooner_than_a_keep_alive() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let blocker = Client::connect([server.url()]).await.unwrap();
    let other = Client::connect([server.url()]).await.unwrap();
    // A TTL of 3 s: the provisional lease is the whole TTL (the default request timeout makes
    // its cap 8 s), so there is no extension once all are held, and the members taken so far
    // are kept alive every 1 s. No watchdog (the default).
    let options = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .timeout(Duration::from_secs(20));
    let mut names = ["ka:1", "ka:2", "ka:3", "ka:4", "ka:5", "ka:6"];
    let canonical = |name: &&str| {
        let keys = client.keys(name, &options).unwrap();
        (keys.slot(), keys.lock_key().to_owned())
    };
    names.sort_by_key(canonical);
    assert!(
        names
            .windows(2)
            .any(|w| canonical(&w[0]).0 != canonical(&w[1]).0),
        "the members span slots: the collection, not the one-slot script"
    );
    // The members after the first are held by another client with leases ending 0.8 s apart
    // (0.8, 1.6, ... 4 s): each wait of the collection ends sooner than a keep-alive period
    // (1 s), and the whole collection takes longer than the first member's lease (3 s). The
    // leases end on their own: no release, no sleep in the test.
    let mut blocking = Vec::new();
    for (k, name) in names[1..].iter().enumerate() {
        let lease = Duration::from_millis(800 * (k as u64 + 1));
        blocking.push(
            blocker
                .try_lock(name, &LockOptions::new().ttl(lease))
                .await
                .unwrap(),
        );
    }
    let started = Instant::now();
    let guard = client.lock_all(&names, &options).await.unwrap();
    let took = started.elapsed();
    assert!(
        took > Duration::from_secs(3),
        "the collection outlasted the first member's lease: {took:?}"
    );
    // Every member is still this caller's when lock_all returns: another client is refused
    // each. A keep-alive timer restarted for each wait never fired, and the first member's
    // lease had ended (another client took it while the guard claimed it).
    for name in names {
        let taken = other
            .try_lock(name, &LockOptions::new().ttl(Duration::from_secs(1)))
            .await;
        assert!(
            matches!(&taken, Err(Error::Busy { .. })),
            "{name} was free when lock_all returned Ok after {took:?}: {taken:?}"
        );
    }
    assert!(guard.is_valid(), "valid until {:?}", guard.valid_until());
    guard.release().await.unwrap();
    drop(blocking);
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

/// Runs `exec FLAGS zeta alpha -- ...` and checks that it exported both names, in that order,
/// with the fences that `STATUS zeta|alpha --json` then shows for the released locks; returns
/// the fences.
fn exec_zeta_alpha(url: &str, flags: &[&str], status: &[&str]) -> Vec<u64> {
    let mut args = vec!["exec"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&[
        "zeta",
        "alpha",
        "--",
        "sh",
        "-c",
        "echo $FENCELOCK_NAME; echo $FENCELOCK_TOKEN",
    ]);
    let output = fencelock(url, &args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{flags:?}: {stderr}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("zeta alpha"), "{flags:?}");
    let tokens: Vec<u64> = lines
        .next()
        .unwrap()
        .split(' ')
        .map(|t| t.parse().unwrap())
        .collect();
    for (name, token) in ["zeta", "alpha"].iter().zip(&tokens) {
        let mut args = status.to_vec();
        args.extend_from_slice(&[name, "--json"]);
        let shown = fencelock(url, &args);
        let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
        assert_eq!(shown["held"], false, "{flags:?} {name} released after exit");
        assert_eq!(shown["fence"].as_u64(), Some(*token), "{flags:?} {name}");
    }
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_with_several_names_exports_them_and_their_tokens_in_order() {
    let server = Standalone::start();
    let url = server.url();
    let tokens = exec_zeta_alpha(&url, &[], &["status"]);
    assert_eq!(tokens.len(), 2);

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

    // With --fair the names are fair locks, exported the same way.
    exec_zeta_alpha(&url, &["--fair"], &["status", "--fair"]);

    // With --read / --write, read or write holds of read-write locks, exported the same way.
    exec_zeta_alpha(&url, &["--read"], &["status", "--read"]);
    exec_zeta_alpha(&url, &["--write"], &["status", "--write"]);

    // A semaphore's permits take one name.
    let refused = fencelock(&url, &["exec", "--permits", "2", "a", "b", "--", "true"]);
    assert_eq!(refused.status.code(), Some(64));
}

// ---- Fair locks as members (`Client::fair_lock_all` / `try_fair_lock_all`).

/// Fair lock `name` as `inspect` reads it: (held, waiters in its queue, fence).
async fn fair_state(client: &Client, name: &str) -> (bool, u64, Option<u64>) {
    let seen = client.inspect(Kind::Fair, name).await.unwrap();
    (
        seen.held,
        seen.waiters.unwrap_or(0),
        seen.fence.map(|f| f.get()),
    )
}

/// Polls until no fair lock of `names` is held or has a waiter, panicking after `limit`.
async fn fair_idle_within(client: &Client, names: &[&str], limit: Duration) {
    let until = Instant::now() + limit;
    loop {
        let mut busy = Vec::new();
        for name in names {
            let (held, waiters, _) = fair_state(client, name).await;
            if held || waiters > 0 {
                busy.push((*name, held, waiters));
            }
        }
        if busy.is_empty() {
            return;
        }
        assert!(
            Instant::now() < until,
            "still held or queued after {limit:?}: {busy:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_members_all_or_nothing_in_arrival_order_with_fences_per_name() {
    let cluster = Cluster::start();
    let a = Client::connect(cluster.urls()).await.unwrap();
    let b = Client::connect(cluster.urls()).await.unwrap();
    let names = ["fm:a", "fm:b", "fm:c"];
    let ttl = LockOptions::new().ttl(Duration::from_secs(10));

    // One member held by another owner: refused, nothing held or queued.
    let blocker = a.fair_lock("fm:b", &ttl).await.unwrap();
    match b.try_fair_lock_all(&names, &ttl).await {
        Err(Error::Busy { name, .. }) => assert_eq!(name, "fm:b"),
        other => panic!("expected Busy naming fm:b, got {other:?}"),
    }
    let waited = b
        .fair_lock_all(&names, &ttl.clone().timeout(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(&waited, Err(Error::Busy { name, .. }) if name == "fm:b"),
        "{waited:?}"
    );
    for name in ["fm:a", "fm:c"] {
        assert!(!fair_state(&b, name).await.0, "{name} left held");
    }
    let (_, waiters, _) = fair_state(&b, "fm:b").await;
    assert_eq!(
        waiters, 0,
        "the waiting place in fm:b's queue was withdrawn"
    );

    // A multi-lock waiting for fm:b keeps its place: a later single waiter comes after it.
    let multi = tokio::spawn({
        let (b, ttl) = (b.clone(), ttl.clone());
        async move {
            let guard = b
                .fair_lock_all(&["fm:c", "fm:b"], &ttl.timeout(Duration::from_secs(10)))
                .await
                .unwrap();
            let at = Instant::now();
            let fences: Vec<(String, u64)> = guard
                .fences()
                .iter()
                .map(|(n, f)| (n.to_string(), f.get()))
                .collect();
            guard.release().await.unwrap();
            (at, fences)
        }
    });
    common::eventually(
        "the multi-lock queued on fm:b",
        Duration::from_secs(5),
        || block_on(fair_state(&a, "fm:b")).1 == 1,
    )
    .await;
    let single = tokio::spawn({
        let (a, ttl) = (a.clone(), ttl.clone());
        async move {
            let guard = a
                .fair_lock("fm:b", &ttl.timeout(Duration::from_secs(10)))
                .await
                .unwrap();
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        }
    });
    common::eventually(
        "the single waiter queued too",
        Duration::from_secs(5),
        || block_on(fair_state(&a, "fm:b")).1 == 2,
    )
    .await;
    let before = blocker.fence().get();
    blocker.release().await.unwrap();
    let (multi_at, fences) = multi.await.unwrap();
    let single_at = single.await.unwrap();
    assert!(
        multi_at <= single_at,
        "arrival order kept across the multi-lock"
    );
    assert_eq!(
        fences.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["fm:c", "fm:b"],
        "fences in the caller's order"
    );
    assert!(fences[1].1 > before, "fm:b's fence rose");
    for (name, fence) in &fences {
        let (_, _, stored) = fair_state(&a, name).await;
        assert!(stored.unwrap() >= *fence, "{name}: stored fence");
    }
    fair_idle_within(&a, &names, Duration::from_secs(2)).await;
}

/// Runs a short future to completion from a synchronous condition (the `eventually` helper
/// polls closures).
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_multi_locks_in_opposite_orders_never_deadlock_and_lost_names_the_member() {
    let cluster = Cluster::start();
    let clients = [
        Client::connect(cluster.urls()).await.unwrap(),
        Client::connect(cluster.urls()).await.unwrap(),
    ];
    let names = ["fo:x", "fo:y", "fo:z"];
    let inside: Arc<HashMap<&str, AtomicBool>> =
        Arc::new(names.iter().map(|n| (*n, AtomicBool::new(false))).collect());
    let until = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::new();
    for t in 0..6u64 {
        let (client, inside) = (clients[(t % 2) as usize].clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(t * 7919 + 17);
            let mut sets = 0;
            while Instant::now() < until {
                let mut order = names.to_vec();
                for i in (1..order.len()).rev() {
                    order.swap(i, rng.next(i as u64 + 1) as usize);
                }
                order.truncate(2 + rng.next(2) as usize);
                let options = LockOptions::new()
                    .ttl(Duration::from_secs(5))
                    .timeout(Duration::from_secs(20));
                let guard = client.fair_lock_all(&order, &options).await.unwrap();
                for name in &order {
                    assert!(!inside[name].swap(true, Ordering::SeqCst), "{name} shared");
                }
                tokio::task::yield_now().await;
                for name in &order {
                    inside[name].store(false, Ordering::SeqCst);
                }
                guard.release().await.unwrap();
                sets += 1;
            }
            sets
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    assert!(total >= 6, "every task got its sets through: {total}");

    // lost(): a member freed by force is reported by name.
    let options = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .watchdog(true);
    let guard = clients[0]
        .fair_lock_all(&["fo:x", "fo:z"], &options)
        .await
        .unwrap();
    clients[1].force_unlock(Kind::Fair, "fo:z").await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the loss is reported within a renewal period");
    assert!(lost.to_string().contains("fo:z"), "{lost}");
    assert!(guard.release().await.is_err(), "release reports the loss");
    fair_idle_within(&clients[0], &names, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fair_multi_lock_cut_while_waiting_leaves_nothing_held_or_queued() {
    let cluster = Cluster::start();
    let a = Client::connect(cluster.urls()).await.unwrap();
    let b = Client::connect(cluster.urls()).await.unwrap();
    let names = ["fc:1", "fc:2", "fc:3"];
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let blocker = a.fair_lock("fc:3", &options).await.unwrap();
    let mut rng = Rng(99);
    for _ in 0..5 {
        let cut = Duration::from_millis(5 + rng.next(200));
        let _ = tokio::time::timeout(cut, b.fair_lock_all(&names, &options)).await;
        // Members taken before the cut are released and the waiting place withdrawn, in the
        // background: well before the 8 s provisional lease or the 3 s place lease would end.
        for name in ["fc:1", "fc:2"] {
            common::eventually(name, Duration::from_secs(2), || {
                !block_on(fair_state(&a, name)).0
            })
            .await;
        }
        common::eventually("fc:3's queue empty", Duration::from_secs(2), || {
            block_on(fair_state(&a, "fc:3")).1 == 0
        })
        .await;
    }
    blocker.release().await.unwrap();
    fair_idle_within(&a, &names, Duration::from_secs(2)).await;
}

/// Whether read-write lock `name` has a live hold (read or write), as `inspect` reads it.
async fn rw_held(client: &Client, name: &str) -> bool {
    client.inspect(Kind::ReadWrite, name).await.unwrap().held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_and_write_holds_as_members_all_or_nothing_with_fences_per_name() {
    let cluster = Cluster::start();
    let urls = cluster.urls();
    let (a, b, c) = (
        Client::connect(urls.clone()).await.unwrap(),
        Client::connect(urls.clone()).await.unwrap(),
        Client::connect(urls).await.unwrap(),
    );
    let names = ["rwm:a", "rwm:b", "rwm:c"];
    let slots: Vec<u16> = names
        .iter()
        .map(|n| a.rwlock_keys(n, &LockOptions::new()).unwrap().slot())
        .collect();
    assert!(
        slots.iter().any(|s| *s != slots[0]),
        "across slots: {slots:?}"
    );
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(10));

    // Readers share: another client's read hold on b does not keep the multi-lock out.
    let other = b.read_lock("rwm:b", &options).await.unwrap();
    let reads = a.read_lock_all(&names, &options).await.unwrap();
    let fences: Vec<(String, u64)> = reads
        .fences()
        .into_iter()
        .map(|(n, f)| (n.to_owned(), f.get()))
        .collect();
    assert_eq!(
        fences.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        names,
        "fences in the caller's order"
    );
    assert!(reads.fence("rwm:b").unwrap() > other.fence());
    let found = a.inspect(Kind::ReadWrite, "rwm:b").await.unwrap();
    assert_eq!(found.readers, Some(2));
    assert!(
        reads.valid_until() > Instant::now() + Duration::from_secs(5),
        "full lease"
    );

    // Writers are kept out by any reader: one attempt, Busy naming a member, nothing left.
    let err = c.try_write_lock_all(&names, &options).await.unwrap_err();
    assert!(
        matches!(&err, Error::Busy { name, .. } if names.contains(&name.as_str())),
        "{err}"
    );
    reads.release().await.unwrap();
    for name in ["rwm:a", "rwm:c"] {
        assert!(!rw_held(&a, name).await, "{name} left held");
    }

    // Waiting: b stays read by another owner, so the write multi-lock times out naming b; the
    // members taken are released and b's writer intent withdrawn (readers get in at once).
    let started = Instant::now();
    let short = options.clone().timeout(Duration::from_millis(300));
    let err = c.write_lock_all(&names, &short).await.unwrap_err();
    assert!(
        matches!(&err, Error::Busy { name, .. } if name == "rwm:b"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    for name in ["rwm:a", "rwm:c"] {
        assert!(!rw_held(&a, name).await, "{name} left held");
    }
    let reader = a
        .try_read_lock("rwm:b", &options)
        .await
        .expect("no intent left");
    reader.release().await.unwrap();

    // Free: the write multi-lock gets every member, above every earlier fence, exclusively.
    other.release().await.unwrap();
    let writes = c.write_lock_all(&names, &options).await.unwrap();
    for (name, before) in &fences {
        let fence = writes.fence(name).unwrap().get();
        assert!(fence > *before, "{name}: {fence} <= {before}");
        let err = a.try_read_lock(name, &options).await.unwrap_err();
        assert!(err.is_busy(), "{name}: {err}");
    }
    writes.release().await.unwrap();
    let reads = a.try_read_lock_all(&names, &options).await.unwrap();
    reads.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn read_and_write_multi_locks_in_any_order_never_deadlock_and_writers_exclude() {
    let cluster = Cluster::start();
    let urls = cluster.urls();
    let names = ["rwd:a", "rwd:b", "rwd:c", "rwd:d"];
    // Per name: the number of readers inside, or -1 while a writer is.
    let inside: Arc<HashMap<&str, std::sync::Mutex<i64>>> = Arc::new(
        names
            .iter()
            .map(|n| (*n, std::sync::Mutex::new(0)))
            .collect(),
    );
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .timeout(Duration::from_secs(20));
    let mut tasks = Vec::new();
    for task in 0..6u64 {
        let client = Client::connect(urls.clone()).await.unwrap();
        let (inside, options) = (Arc::clone(&inside), options.clone());
        let writer = task % 2 == 0;
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
                let enter = |name: &str| {
                    let mut state = inside[name].lock().unwrap();
                    if writer {
                        assert_eq!(*state, 0, "{name}: a writer entered beside others");
                        *state = -1;
                    } else {
                        assert!(*state >= 0, "{name}: a reader entered beside a writer");
                        *state += 1;
                    }
                };
                let leave = |name: &str| {
                    let mut state = inside[name].lock().unwrap();
                    *state = if writer { 0 } else { *state - 1 };
                };
                if writer {
                    let guard = client.write_lock_all(&set, &options).await.unwrap();
                    set.iter().for_each(|name| enter(name));
                    tokio::time::sleep(Duration::from_millis(rng.next(5))).await;
                    set.iter().for_each(|name| leave(name));
                    guard.release().await.unwrap();
                } else {
                    let guard = client.read_lock_all(&set, &options).await.unwrap();
                    set.iter().for_each(|name| enter(name));
                    tokio::time::sleep(Duration::from_millis(rng.next(5))).await;
                    set.iter().for_each(|name| leave(name));
                    guard.release().await.unwrap();
                }
                rounds += 1;
            }
            rounds
        }));
    }
    let finished = tokio::time::timeout(Duration::from_secs(40), async {
        let mut rounds = 0;
        for task in tasks {
            rounds += task.await.unwrap();
        }
        rounds
    })
    .await
    .expect("every caller finishes: no deadlock");
    assert!(finished >= 6, "{finished} rounds");
}
