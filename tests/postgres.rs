//! Fencing in a real PostgreSQL (started by the harness): the conditional UPDATE and the fenced
//! upsert from `examples/postgres.rs` (both shown in `docs/storage.md`) reject stale holders and
//! report the current maximum, which repairs a regressed token as the next acquire's floor.

mod common;

#[path = "../examples/postgres.rs"]
#[allow(dead_code)]
mod example;

use std::time::Duration;

use common::{Postgres, Standalone};
use fencelock::{Client, FenceMode, FenceToken, LockOptions};

#[tokio::test(flavor = "multi_thread")]
async fn conditional_update_rejects_a_stalled_holder_and_the_floor_repairs_a_regression() {
    let redis = Standalone::start();
    let postgres = Postgres::start();
    let pg = example::connect(&postgres.config()).await.unwrap();
    pg.execute("INSERT INTO stock (sku, qty) VALUES ('sku-1', 10)", &[])
        .await
        .unwrap();
    let locks = Client::builder([redis.url()])
        .fence_mode(FenceMode::Counter)
        .connect()
        .await
        .unwrap();

    // A holder stalls past its lease; its successor writes first; the late write is rejected.
    let stalled = locks
        .lock("sku-1", &LockOptions::new().ttl(Duration::from_millis(50)))
        .await
        .unwrap();
    let successor = locks
        .lock("sku-1", &LockOptions::new().timeout(Duration::from_secs(5)))
        .await
        .expect("granted once the stalled lease ran out");
    assert!(successor.fence() > stalled.fence());
    example::fenced_update(&pg, "sku-1", 9, successor.fence())
        .await
        .unwrap()
        .expect("the current holder writes");
    example::fenced_update(&pg, "sku-1", 8, successor.fence())
        .await
        .unwrap()
        .expect("and may write again under the same token");
    let stale = example::fenced_update(&pg, "sku-1", 5, stalled.fence())
        .await
        .unwrap()
        .expect_err("the stalled holder is rejected");
    assert_eq!(
        (stale.presented, stale.highest),
        (stalled.fence(), successor.fence())
    );
    assert_eq!(example::quantity(&pg, "sku-1").await.unwrap(), 8);
    let highest = successor.fence();
    successor.release().await.unwrap();
    let _ = stalled.release().await;

    // A lost counter (as after a failover onto a lagging replica) hands out a low token that
    // PostgreSQL rejects; the rejection's maximum, passed as the floor, repairs it.
    redis
        .node
        .cmd::<i64>(redis::cmd("DEL").arg("fencelock:{sku-1}:lock"));
    let regressed = locks.lock("sku-1", &LockOptions::new()).await.unwrap();
    let rejected = example::fenced_update(&pg, "sku-1", 7, regressed.fence())
        .await
        .unwrap()
        .expect_err("a regressed token is rejected");
    assert_eq!(rejected.highest, highest);
    regressed.release().await.unwrap();
    let repaired = locks
        .lock("sku-1", &LockOptions::new().floor(rejected.highest))
        .await
        .unwrap();
    assert!(repaired.fence() > highest);
    example::fenced_update(&pg, "sku-1", 7, repaired.fence())
        .await
        .unwrap()
        .expect("the repaired token writes");
    assert_eq!(example::quantity(&pg, "sku-1").await.unwrap(), 7);
    repaired.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn fenced_upsert_inserts_then_rejects_a_stalled_holder_and_returns_the_maximum() {
    let redis = Standalone::start();
    let postgres = Postgres::start();
    let pg = example::connect(&postgres.config()).await.unwrap();
    let locks = Client::connect([redis.url()]).await.unwrap();

    let stalled = locks
        .lock("acct-1", &LockOptions::new().ttl(Duration::from_millis(50)))
        .await
        .unwrap();
    // The row does not exist yet: the first fenced write inserts it, whatever its fence.
    example::fenced_upsert(&pg, "acct-1", 100, stalled.fence())
        .await
        .unwrap()
        .expect("the first write inserts the row");
    assert_eq!(
        example::balance(&pg, "acct-1").await.unwrap(),
        Some((100, i64::from(stalled.fence())))
    );

    let successor = locks
        .lock(
            "acct-1",
            &LockOptions::new().timeout(Duration::from_secs(5)),
        )
        .await
        .expect("granted once the stalled lease ran out");
    assert!(successor.fence() > stalled.fence());
    example::fenced_upsert(&pg, "acct-1", 90, successor.fence())
        .await
        .unwrap()
        .expect("a higher fence updates the row");
    example::fenced_upsert(&pg, "acct-1", 80, successor.fence())
        .await
        .unwrap()
        .expect("the same fence writes again (`<=`, not `<`)");
    let stale = example::fenced_upsert(&pg, "acct-1", 0, stalled.fence())
        .await
        .unwrap()
        .expect_err("the stalled holder is rejected");
    assert_eq!(
        (stale.presented, stale.highest),
        (stalled.fence(), successor.fence())
    );
    assert_eq!(
        example::balance(&pg, "acct-1").await.unwrap(),
        Some((80, i64::from(successor.fence()))),
        "the rejected write changed nothing"
    );
    successor.release().await.unwrap();
    let _ = stalled.release().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fenced_upserts_racing_on_a_missing_row_leave_the_highest_fence() {
    let postgres = Postgres::start();
    const WRITERS: i64 = 8;
    let mut connections = Vec::new();
    for _ in 0..WRITERS {
        // One after another: concurrent `CREATE TABLE IF NOT EXISTS` may collide in the catalog.
        let pg = example::connect(&postgres.config()).await.unwrap();
        connections.push(std::sync::Arc::new(pg));
    }
    for round in 0..20 {
        let id = format!("race-{round}");
        let writers = connections.iter().zip(1..=WRITERS).map(|(pg, n)| {
            let (pg, id) = (pg.clone(), id.clone());
            async move {
                let fence = FenceToken::try_from(n).unwrap();
                let outcome = example::fenced_upsert(&pg, &id, n * 10, fence).await;
                (n, outcome.unwrap())
            }
        });
        let outcomes = futures_join_all(writers).await;
        for (n, outcome) in &outcomes {
            if let Err(stale) = outcome {
                assert!(
                    i64::from(stale.highest) > *n,
                    "round {round}: fence {n} rejected, reported maximum {} is not above it",
                    stale.highest
                );
            }
        }
        assert!(
            outcomes
                .iter()
                .any(|(n, outcome)| *n == WRITERS && outcome.is_ok()),
            "round {round}: the highest fence is never rejected"
        );
        assert_eq!(
            example::balance(&connections[0], &id).await.unwrap(),
            Some((WRITERS * 10, WRITERS)),
            "round {round}: the row holds the highest fence's write"
        );
    }
}

/// Runs the futures concurrently on the runtime and collects their outputs in order.
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(handles.len());
    for handle in handles {
        outputs.push(handle.await.expect("writer task"));
    }
    outputs
}
