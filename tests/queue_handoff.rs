//! The handoff on the server (issue 25) on a real server, for the fair lock and for the mutex's
//! waits across processes: a release grants the lock to the head's place and announces the
//! grant on the head's client's channel, so the head holds it without another call; a grant to
//! a head that vanished or cancelled goes back to the queue; a stale place is only woken;
//! arrival order and rising fences are kept.

mod common;

use std::time::{Duration, Instant};

use common::{eventually, Standalone};
use fencelock::{Client, FairLockGuard, LockGuard, LockOptions};

/// The two primitives whose waiters queue: every test runs for both.
#[derive(Clone, Copy, Debug)]
enum Queue {
    Fair,
    Mutex,
}

const BOTH: [Queue; 2] = [Queue::Fair, Queue::Mutex];

/// A guard of either.
enum Guard {
    Fair(FairLockGuard),
    Mutex(LockGuard),
}

impl Guard {
    fn fence(&self) -> fencelock::FenceToken {
        match self {
            Self::Fair(guard) => guard.fence(),
            Self::Mutex(guard) => guard.fence(),
        }
    }

    fn valid_until(&self) -> Instant {
        match self {
            Self::Fair(guard) => guard.valid_until(),
            Self::Mutex(guard) => guard.valid_until(),
        }
    }

    async fn extend(&mut self, ttl: Duration) -> fencelock::Result<Instant> {
        match self {
            Self::Fair(guard) => guard.extend(ttl).await,
            Self::Mutex(guard) => guard.extend(ttl).await,
        }
    }

    async fn release(self) -> fencelock::Result<()> {
        match self {
            Self::Fair(guard) => guard.release().await,
            Self::Mutex(guard) => guard.release().await,
        }
    }
}

impl Queue {
    fn key(self, name: &str) -> String {
        match self {
            Self::Fair => format!("fencelock:{{{name}}}:fair"),
            Self::Mutex => format!("fencelock:{{{name}}}:lock"),
        }
    }

    async fn try_take(self, client: &Client, name: &str, options: &LockOptions) -> Guard {
        match self {
            Self::Fair => Guard::Fair(client.try_fair_lock(name, options).await.unwrap()),
            Self::Mutex => Guard::Mutex(client.try_lock(name, options).await.unwrap()),
        }
    }

    async fn take(self, client: &Client, name: &str, options: &LockOptions) -> Guard {
        match self {
            Self::Fair => Guard::Fair(client.fair_lock(name, options).await.unwrap()),
            Self::Mutex => Guard::Mutex(client.lock(name, options).await.unwrap()),
        }
    }

    /// The acquire script run by hand for `owner` with a place: its name and arguments.
    fn queue_call(
        self,
        key: &str,
        owner: &str,
        ttl: &str,
        place: &str,
    ) -> (&'static str, Vec<String>) {
        let mut args = vec![
            key.to_owned(),
            owner.to_owned(),
            ttl.to_owned(),
            "0".into(),
            "clock".into(),
            place.to_owned(),
        ];
        let name = match self {
            Self::Fair => {
                args.push("128".into());
                "fair_acquire"
            }
            Self::Mutex => "acquire",
        };
        args.push("10000".into());
        (name, args)
    }
}

fn places(node: &common::Node, key: &str) -> Vec<String> {
    let fields: Vec<String> = node.cmd(redis::cmd("HKEYS").arg(key));
    fields
        .into_iter()
        .filter_map(|f| f.strip_prefix("q:").map(str::to_owned))
        .collect()
}

fn run_script<T: redis::FromRedisValue>(node: &common::Node, name: &str, args: &[String]) -> T {
    let source = fencelock::lua_scripts()
        .find(|s| s.name == name)
        .unwrap()
        .source;
    let key = &args[0];
    node.cmd(
        redis::cmd("EVAL")
            .arg(source)
            .arg(1)
            .arg(key)
            .arg(&args[1..]),
    )
}

/// Calls clients sent that ran a script (`cmdstat_evalsha` and `cmdstat_eval`; an `EVALSHA`
/// answered `NOSCRIPT`, a failed call, does not count).
fn script_calls(node: &common::Node) -> u64 {
    let info: String = node.cmd(redis::cmd("INFO").arg("commandstats"));
    info.lines()
        .filter_map(|l| {
            let l = l.trim_end();
            let stats = l
                .strip_prefix("cmdstat_evalsha:")
                .or_else(|| l.strip_prefix("cmdstat_eval:"))?;
            let field = |name: &str| {
                stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(name))
                    .and_then(|n| n.parse::<u64>().ok())
            };
            Some(field("calls=")? - field("failed_calls=").unwrap_or(0))
        })
        .sum()
}

fn server_ms(node: &common::Node) -> u64 {
    let time: (u64, u64) = node.cmd(&mut redis::cmd("TIME"));
    time.0 * 1000 + time.1 / 1000
}

async fn connect(url: &str) -> Client {
    Client::connect([url.to_owned()]).await.unwrap()
}

/// Waits until the channel of `owner`'s client on the lock `key` has a subscriber.
async fn subscribed(node: &common::Node, key: &str, owner: &str) {
    let channel = format!("{key}:w:{}", &owner[..8]);
    eventually("the waiter to subscribe", Duration::from_secs(5), || {
        let reply: Vec<redis::Value> = node.cmd(redis::cmd("PUBSUB").arg("NUMSUB").arg(&channel));
        reply.get(1) == Some(&redis::Value::Int(1))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_release_grants_the_head_which_holds_the_lock_without_another_call() {
    for kind in BOTH {
        let server = Standalone::start();
        let name = "handed";
        let key = kind.key(name);
        let holder = connect(&server.url()).await;
        let options = LockOptions::new().ttl(Duration::from_secs(30));
        let guard = kind.try_take(&holder, name, &options).await;
        let waiter = connect(&server.url()).await;
        let task = {
            let waiter = waiter.clone();
            let options = options.clone().timeout(Duration::from_secs(20));
            tokio::spawn(async move { kind.take(&waiter, name, &options).await })
        };
        eventually("the waiter to queue", Duration::from_secs(5), || {
            places(&server.node, &key).len() == 1
        })
        .await;
        let owner = places(&server.node, &key).remove(0);
        subscribed(&server.node, &key, &owner).await;
        let before = script_calls(&server.node);
        let others = |h: &Client, w: &Client| h.stats().renewal_calls + w.stats().renewal_calls;
        let (renewals, busy) = (others(&holder, &waiter), waiter.stats().busy);
        let stored_before = guard.fence();
        guard.release().await.unwrap();
        let handed = task.await.unwrap();
        let calls = script_calls(&server.node) - before;
        // Besides the release: watchdog renewals, and the waiter's re-checks that answered
        // busy (right after subscribing, then every 250 ms), none of them part of the handoff.
        let renewals = others(&holder, &waiter) - renewals;
        let busy = waiter.stats().busy - busy;
        assert!(
            (1..=1 + renewals + busy).contains(&calls),
            "{kind:?}: the release is the only script call of the handoff: {calls} ({renewals} renewals, {busy} busy)"
        );
        assert!(handed.fence() > stored_before, "{kind:?}: fences rise");
        let stored: i64 = server
            .node
            .lock_field(&key, "fence")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(i64::from(handed.fence()), stored, "{kind:?}");
        let remaining = handed
            .valid_until()
            .saturating_duration_since(Instant::now());
        assert!(
            remaining > Duration::from_secs(25) && remaining <= Duration::from_secs(30),
            "{kind:?}: the lease is the waiter's TTL, measured from before the grant: {remaining:?}"
        );
        assert!(places(&server.node, &key).is_empty(), "{kind:?}");
        // The grant is a real hold: extend and release work, and the lock is free after.
        let mut handed = handed;
        handed.extend(Duration::from_secs(10)).await.unwrap();
        handed.release().await.unwrap();
        kind.try_take(&holder, name, &LockOptions::new())
            .await
            .release()
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn handed_grants_keep_arrival_order_and_rising_fences_across_many_clients() {
    for kind in BOTH {
        let server = Standalone::start();
        let name = "chain";
        let key = kind.key(name);
        let holder = connect(&server.url()).await;
        let guard = kind.try_take(&holder, name, &LockOptions::new()).await;
        let (mut tasks, mut clients) = (Vec::new(), Vec::new());
        for i in 0..6 {
            let client = connect(&server.url()).await;
            clients.push(client.clone());
            tasks.push(tokio::spawn(async move {
                let options = LockOptions::new().timeout(Duration::from_secs(30));
                let guard = kind.take(&client, name, &options).await;
                let fence = guard.fence();
                guard.release().await.unwrap();
                (i, fence)
            }));
            eventually("the place to be queued", Duration::from_secs(5), || {
                places(&server.node, &key).len() == i + 1
            })
            .await;
        }
        // Not part of a handoff: watchdog renewals and the re-checks that answered busy.
        let others = |clients: &[Client]| -> u64 {
            clients
                .iter()
                .map(|c| c.stats().renewal_calls + c.stats().busy)
                .sum()
        };
        let (before, others_before) = (script_calls(&server.node), others(&clients));
        guard.release().await.unwrap();
        let mut done = Vec::new();
        for task in tasks {
            done.push(task.await.unwrap());
        }
        let calls = script_calls(&server.node) - before;
        let others = others(&clients) - others_before;
        // Granted in arrival order: the fences rise in the order the places were queued.
        done.sort_by_key(|(_, fence)| *fence);
        let order: Vec<usize> = done.iter().map(|(i, _)| *i).collect();
        assert_eq!(order, [0, 1, 2, 3, 4, 5], "{kind:?}");
        // Seven releases (the holder's and each waiter's), and no acquire after a wake-up.
        // (A busy answer counted by a client just after the first sample ran on the server
        // before it, so `others` may count one too many, never too few.)
        assert!(
            (7..=7 + others).contains(&calls),
            "{kind:?}: {calls} script calls for 6 handoffs ({others} renewals and busy answers)"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_to_a_head_that_withdraws_goes_to_the_next_in_line() {
    for kind in BOTH {
        let server = Standalone::start();
        let name = "cancelled";
        let key = kind.key(name);
        let holder = connect(&server.url()).await;
        let guard = kind.try_take(&holder, name, &LockOptions::new()).await;
        // A head that queued (its acquire, place 30 s) and will cancel as the grant comes.
        let (script, args) = kind.queue_call(&key, "ghost", "30000", "30000");
        let queued: Vec<i64> = run_script(&server.node, script, &args);
        assert_eq!(queued[0], 0, "{kind:?}");
        let waiter = connect(&server.url()).await;
        let task = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let options = LockOptions::new().timeout(Duration::from_secs(20));
                let guard = kind.take(&waiter, name, &options).await;
                (Instant::now(), guard)
            })
        };
        eventually("the waiter to queue", Duration::from_secs(5), || {
            places(&server.node, &key).len() == 2
        })
        .await;
        guard.release().await.unwrap();
        let owner = server.node.lock_field(&key, "owner").unwrap_or_default();
        assert_eq!(
            owner, "ghost",
            "{kind:?}: the release granted the head on the server"
        );
        // The head's resent acquire (a waiter that missed the message) sees its grant.
        let resent: Vec<i64> = run_script(&server.node, script, &args);
        assert_eq!(resent[0], 2, "{kind:?}: {resent:?}");
        // The cancel: the withdrawal gives the grant back, and it goes to the next in line.
        let withdrawn = Instant::now();
        let withdraw = [&key, "ghost", "p", "10000"].map(str::to_owned);
        let w: i64 = run_script(&server.node, "fair_withdraw", &withdraw);
        assert_eq!(w, 1, "{kind:?}");
        let (granted_at, guard) = task.await.unwrap();
        assert!(
            granted_at - withdrawn < Duration::from_secs(1),
            "{kind:?}: the next waiter was handed the lock at once"
        );
        assert!(i64::from(guard.fence()) > resent[1], "{kind:?}");
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vanished_head_stalls_the_lock_no_longer_than_its_place_lease() {
    for kind in BOTH {
        let server = Standalone::start();
        let name = "vanished";
        let key = kind.key(name);
        let holder = connect(&server.url()).await;
        for fresh in [true, false] {
            let guard = kind.try_take(&holder, name, &LockOptions::new()).await;
            // A head that crashed: queued with a 900 ms place (its TTL 900 ms when fresh,
            // 30 s when stale), never renewed, never listening.
            let ttl = if fresh { "900" } else { "30000" };
            let ghost = if fresh { "fresh-ghost" } else { "stale-ghost" };
            let (script, args) = kind.queue_call(&key, ghost, ttl, "900");
            let _: redis::Value = run_script(&server.node, script, &args);
            let place_end = server_ms(&server.node) + 900;
            let waiter = connect(&server.url()).await;
            let task = tokio::spawn(async move {
                let options = LockOptions::new().timeout(Duration::from_secs(20));
                let guard = kind.take(&waiter, name, &options).await;
                (Instant::now(), guard)
            });
            eventually("the waiter to queue", Duration::from_secs(5), || {
                places(&server.node, &key).len() == 2
            })
            .await;
            if !fresh {
                // Past a third of its place lease unrenewed: no longer handed the lock.
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            let released = Instant::now();
            guard.release().await.unwrap();
            let owner = server.node.lock_field(&key, "owner");
            if fresh {
                assert_eq!(
                    owner.as_deref(),
                    Some(ghost),
                    "{kind:?}: a fresh head is handed the lock"
                );
            } else {
                assert_eq!(owner, None, "{kind:?}: a stale head is only woken");
            }
            let (granted_at, guard) = task.await.unwrap();
            let waited = granted_at - released;
            assert!(
                waited < Duration::from_millis(2000),
                "{kind:?}: stalled {waited:?} (fresh {fresh})"
            );
            assert!(
                server_ms(&server.node) + 5 >= place_end,
                "{kind:?}: granted before the head's place (and grant) ended"
            );
            guard.release().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_or_timed_out_waiter_leaves_no_place_and_no_grant_behind() {
    for kind in BOTH {
        let server = Standalone::start();
        let name = "gave-up";
        let key = kind.key(name);
        let holder = connect(&server.url()).await;
        let guard = kind.try_take(&holder, name, &LockOptions::new()).await;
        let waiter = connect(&server.url()).await;
        // Cancelled: the task is aborted while its place is queued.
        let task = {
            let waiter = waiter.clone();
            tokio::spawn(async move {
                let options = LockOptions::new().timeout(Duration::from_secs(30));
                kind.take(&waiter, name, &options).await
            })
        };
        eventually("the waiter to queue", Duration::from_secs(5), || {
            places(&server.node, &key).len() == 1
        })
        .await;
        task.abort();
        assert!(matches!(task.await, Err(e) if e.is_cancelled()));
        eventually(
            "the cancelled waiter's place to be withdrawn",
            Duration::from_secs(5),
            || places(&server.node, &key).is_empty(),
        )
        .await;
        // Timed out: the call gives its place up before it returns.
        let options = LockOptions::new().timeout(Duration::from_millis(300));
        let err = match kind {
            Queue::Fair => waiter.fair_lock(name, &options).await.map(drop),
            Queue::Mutex => waiter.lock(name, &options).await.map(drop),
        }
        .unwrap_err();
        assert!(
            matches!(err, fencelock::Error::Busy { .. }),
            "{kind:?}: {err:?}"
        );
        assert!(places(&server.node, &key).is_empty(), "{kind:?}");
        // The release hands the lock to nobody: it is free at once.
        guard.release().await.unwrap();
        let owner = server.node.lock_field(&key, "owner");
        assert_eq!(owner, None, "{kind:?}");
        kind.try_take(&waiter, name, &LockOptions::new())
            .await
            .release()
            .await
            .unwrap();
    }
}

/// The mutex's release script run by hand: `owner`'s hold released, announced by `PUBLISH`.
fn release_by_hand(node: &common::Node, key: &str, owner: &str) -> i64 {
    let args = [key, owner, "", "p", "10000"].map(str::to_owned);
    run_script(node, "release", &args)
}

/// "holder-a" takes `key` with a 1 s lease (the places must find it held on a loaded machine
/// too) and each of `owners` queues behind it with a 30 s place; returns the lease's end, in the
/// server's milliseconds.
fn held_for_a_second_with_places(node: &common::Node, key: &str, owners: &[&str]) -> u64 {
    let (script, args) = Queue::Mutex.queue_call(key, "holder-a", "1000", "30000");
    let _: redis::Value = run_script(node, script, &args);
    let lease_end = server_ms(node) + 1000;
    for owner in owners {
        let (script, args) = Queue::Mutex.queue_call(key, owner, "30000", "30000");
        let _: redis::Value = run_script(node, script, &args);
    }
    assert_eq!(places(node, key), owners);
    lease_end
}

/// Waits until the server's clock has passed `ms`.
fn until_server_passes(node: &common::Node, ms: u64) {
    while server_ms(node) <= ms + 1 {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_release_after_its_lease_ended_hands_the_lock_to_the_head_and_keeps_the_queue() {
    let server = Standalone::start();
    let key = Queue::Mutex.key("late");
    // A holds with a 1 s lease; p1 and p2 queue behind it.
    let lease_end = held_for_a_second_with_places(&server.node, &key, &["place-p1", "place-p2"]);
    until_server_passes(&server.node, lease_end);
    // A's late release finds no live lease, and still hands the lock on: dropping the queue's
    // mark here left p1's place behind, and p1's own release later granted the lock to it.
    assert_eq!(release_by_hand(&server.node, &key, "holder-a"), 0);
    let owner = server.node.lock_field(&key, "owner");
    assert_eq!(owner.as_deref(), Some("place-p1"), "the head is handed it");
    assert_eq!(places(&server.node, &key), ["place-p2"]);
    assert_eq!(release_by_hand(&server.node, &key, "place-p1"), 1);
    let owner = server.node.lock_field(&key, "owner");
    assert_eq!(owner.as_deref(), Some("place-p2"), "then the next place");
    assert!(places(&server.node, &key).is_empty());
}

#[test]
fn a_handoff_past_a_walk_of_gone_entries_keeps_the_queue_for_the_next_release() {
    let server = Standalone::start();
    let key = Queue::Mutex.key("long-walk");
    let (script, args) = Queue::Mutex.queue_call(&key, "clientaa-holder", "30000", "0");
    let _: redis::Value = run_script(&server.node, script, &args);
    // 70 index entries of places that are gone, then a live place of another client: beyond
    // the 64 entries one call walks.
    let place = format!("71 {}", server_ms(&server.node) + 30_000);
    let mut fill = redis::cmd("HSET");
    fill.arg(&key).arg("qseq").arg(71);
    for seq in 1..=70 {
        fill.arg(format!("s:{seq}")).arg("gone");
    }
    fill.arg("s:71").arg("clientbb-place");
    fill.arg("q:clientbb-place").arg(&place);
    fill.arg("g:clientbb-place").arg("30000 30000 0 clock");
    server.node.cmd::<()>(&mut fill);
    server.node.set_lock_field(&key, "waiters", "q");
    // The holder hands the lock to a task of its own client (no cohort).
    let args = [
        &key,
        "clientaa-holder",
        "",
        "p",
        "clientaa-next",
        "30000",
        "0",
        "clock",
        "20",
        "1",
        "",
        "10000",
    ]
    .map(str::to_owned);
    let reply: Vec<i64> = run_script(&server.node, "handoff", &args);
    assert_eq!(&reply[..2], [1, 1], "handed to the task: {reply:?}");
    let state = server.node.lock_field(&key, "waiters");
    assert_eq!(state.as_deref(), Some("q"), "the queue keeps its mark");
    // Its release walks on and finds the place.
    assert_eq!(release_by_hand(&server.node, &key, "clientaa-next"), 1);
    let owner = server.node.lock_field(&key, "owner");
    assert_eq!(owner.as_deref(), Some("clientbb-place"));
}

#[test]
fn a_plain_grant_to_a_caller_with_a_place_takes_its_place_away() {
    let server = Standalone::start();
    let key = Queue::Mutex.key("overwritten");
    let lease_end = held_for_a_second_with_places(&server.node, &key, &["place-p1"]);
    // An older client's busy attempt overwrites the queue's mark with its own, and the holder's
    // lease runs out: p1's next attempt is a plain grant.
    server.node.set_lock_field(&key, "waiters", "old12345");
    until_server_passes(&server.node, lease_end);
    let (script, args) = Queue::Mutex.queue_call(&key, "place-p1", "30000", "30000");
    let _: redis::Value = run_script(&server.node, script, &args);
    let owner = server.node.lock_field(&key, "owner");
    assert_eq!(owner.as_deref(), Some("place-p1"));
    // Its place went with the grant: no later release can grant it to a call that returned.
    assert!(places(&server.node, &key).is_empty());
}
