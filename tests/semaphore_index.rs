//! The semaphore's number index on a real server: a grant and a release read only what they
//! take, however many permits are held; expired permits are reclaimed by one scan when their
//! numbers are needed; each key of a batched acquire gets its own grant and expiry.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::semaphore::{available_is, script, standalone_semaphore, until};
use common::Standalone;
use fencelock::{Error, LockOptions};

/// How many `HGETALL`s the server ran: a semaphore script reads every entry with one.
fn scans(server: &Standalone) -> u64 {
    let info: String = server.node.cmd(redis::cmd("INFO").arg("commandstats"));
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_hgetall:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_reads_only_what_it_takes_and_expired_permits_are_reclaimed_by_a_scan() {
    let (server, client, wide) = standalone_semaphore("wide", 256).await;
    let options = LockOptions::new().ttl(Duration::from_secs(60));
    let before = scans(&server);
    let mut held = Vec::new();
    for _ in 0..200 {
        held.push(wide.try_acquire(&options).await.unwrap());
    }
    for _ in 0..20 {
        let permit = wide.try_acquire(&options).await.unwrap();
        assert_eq!(
            permit.permits()[0].number,
            200,
            "the number released last is taken first"
        );
        permit.release().await.unwrap();
    }
    assert_eq!(
        scans(&server),
        before,
        "no grant or release read every entry"
    );
    let numbers: HashSet<u32> = held.iter().map(|p| p.permits()[0].number).collect();
    assert_eq!(numbers.len(), 200, "distinct numbers");
    for permit in held {
        permit.release().await.unwrap();
    }

    // Permits of crashed holders are not counted free until their numbers are needed: then one
    // scan reclaims them.
    let small = client.semaphore("small", 3).unwrap();
    let short = LockOptions::new().ttl(Duration::from_millis(300));
    for _ in 0..3 {
        std::mem::forget(small.try_acquire(&short).await.unwrap());
    }
    let err = small.try_acquire(&options).await.unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err:?}");
    until("the leases to end", Duration::from_secs(5), || {
        available_is(&small, 3)
    })
    .await;
    let before = scans(&server);
    let all = small
        .try_acquire_many(3, &options)
        .await
        .expect("the expired permits are reclaimed");
    let numbers: Vec<u32> = all.permits().iter().map(|p| p.number).collect();
    assert_eq!(numbers, [0, 1, 2]);
    assert_eq!(scans(&server), before + 1, "one scan reclaimed them");
    all.release().await.unwrap();
}

/// The keys of one batch call of `semaphore_acquire` each get their own grant and expiry
/// (the script's once-per-call helpers take the key as an argument): here three semaphores
/// with different expiry graces (none keeps the key for good), in one call.
#[test]
fn each_key_of_a_batched_acquire_gets_its_own_grant_and_expiry() {
    let server = Standalone::start();
    let batch = script("semaphore_acquire_batch");
    let keys = [
        ("fencelock:{a}:sem", "60000"),
        ("fencelock:{b}:sem", ""),
        ("fencelock:{c}:sem", "1000"),
    ];
    let mut call = redis::cmd("EVAL");
    call.arg(batch).arg(1).arg(keys[0].0);
    for (key, grace) in keys {
        // key, argument count, then semaphore_acquire's: owner, count, limit, TTL ms, floor,
        // mode, waiter id, grace.
        call.arg(key)
            .arg(8)
            .arg("0123456789abcdef")
            .arg(1)
            .arg(64)
            .arg(10_000)
            .arg(0)
            .arg("clock")
            .arg("")
            .arg(grace);
    }
    let replies: Vec<Vec<i64>> = server.node.cmd(&mut call);
    assert_eq!(replies.len(), 3);
    assert!(
        replies.iter().all(|reply| reply[0] == 1 && reply[3] == 0),
        "permit 0 of each: {replies:?}"
    );
    let pttl = |key: &str| -> i64 { server.node.cmd(redis::cmd("PTTL").arg(key)) };
    let a = pttl(keys[0].0);
    assert!(a > 60_000 && a <= 70_000, "lease + 60 s grace, got {a} ms");
    assert_eq!(pttl(keys[1].0), -1, "no grace: kept for good");
    let c = pttl(keys[2].0);
    assert!(c > 1_000 && c <= 11_000, "lease + 1 s grace, got {c} ms");
    // The same batch again: each key answers for itself as a resent acquire.
    let again: Vec<Vec<i64>> = server.node.cmd(&mut call);
    assert!(
        again.iter().all(|reply| reply[0] == 2),
        "the same owner: a resent acquire, {again:?}"
    );
}
