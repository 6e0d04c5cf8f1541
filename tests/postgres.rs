//! Fencing in a real PostgreSQL (started by the harness): the conditional UPDATE from
//! `examples/postgres.rs` rejects stale holders and reports the current maximum, which repairs
//! a regressed token as the next acquire's floor.

mod common;

#[path = "../examples/postgres.rs"]
#[allow(dead_code)]
mod example;

use std::time::Duration;

use common::{Postgres, Standalone};
use fencelock::{Client, FenceMode, LockOptions};

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
