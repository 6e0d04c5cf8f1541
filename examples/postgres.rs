//! Fencing in PostgreSQL: every protected row carries the highest fence token that wrote it, and
//! a write is a conditional `UPDATE ... WHERE fence <= $token`, or, for rows that may not exist
//! yet, an upsert whose `DO UPDATE` has the same condition ([`fenced_upsert`]). A rejected writer
//! learns the current maximum, which it can pass as [`LockOptions::floor`] so its next grant is
//! above it. `docs/storage.md` explains both.
//!
//! Run against a local cluster and any PostgreSQL you can reach:
//! `cargo run --example postgres -- redis://127.0.0.1:7000 "host=127.0.0.1 user=postgres"`.
//! `tests/postgres.rs` runs the same code against a PostgreSQL it starts itself.

use std::time::Duration;

use fencelock::{Client, FenceToken, LockOptions, StaleFence};
use tokio_postgres::{Client as Pg, NoTls};

/// The protected table: one row per SKU, with the fence of its last accepted write.
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS stock (
    sku   text   PRIMARY KEY,
    qty   bigint NOT NULL,
    fence bigint NOT NULL DEFAULT 0
)";

/// A table whose rows may not exist before their first fenced write (see [`fenced_upsert`]).
pub const UPSERT_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS balance (
    id    text   PRIMARY KEY,
    cents bigint NOT NULL,
    fence bigint NOT NULL
)";

/// Sets `qty` for `sku` unless a higher fence already wrote the row.
///
/// The same holder may write several times under one token, so equal fences are admitted.
/// A token fits in `bigint`: fencelock keeps them below 2^53.
///
/// Returns `Ok(Err(StaleFence))` with the row's current fence when the write was rejected. A
/// row that does not exist is an error (`query_one` finds no row): this writes existing rows
/// only; [`fenced_upsert`] creates them.
pub async fn fenced_update(
    pg: &Pg,
    sku: &str,
    qty: i64,
    fence: FenceToken,
) -> Result<Result<(), StaleFence>, tokio_postgres::Error> {
    let token = i64::from(fence);
    let updated = pg
        .execute(
            "UPDATE stock SET qty = $2, fence = $3 WHERE sku = $1 AND fence <= $3",
            &[&sku, &qty, &token],
        )
        .await?;
    if updated == 1 {
        return Ok(Ok(()));
    }
    let row = pg
        .query_one("SELECT fence FROM stock WHERE sku = $1", &[&sku])
        .await?;
    let highest = FenceToken::try_from(row.get::<_, i64>(0)).unwrap_or(FenceToken::MAX);
    Ok(Err(StaleFence {
        presented: fence,
        highest,
    }))
}

/// Inserts or updates the balance `id` unless a higher fence already wrote it.
///
/// One statement: a missing row is inserted with `fence`; an existing one is updated only when
/// its fence is not above `fence` (`WHERE b.fence <= EXCLUDED.fence`). A failed `DO UPDATE`
/// condition is not an error in PostgreSQL: the statement reports 0 rows. `<=` rather than `<`
/// because fencelock never grants one fence twice for a lock, so an equal fence is the same hold
/// writing again (a second write, or a retry after a lost reply), which must not be refused.
///
/// Returns `Ok(Err(StaleFence))` with the row's current fence when the write was rejected.
/// Rows are never deleted here and their fence only rises, so the fence read after a rejection
/// is at least the one that rejected the write.
pub async fn fenced_upsert(
    pg: &Pg,
    id: &str,
    cents: i64,
    fence: FenceToken,
) -> Result<Result<(), StaleFence>, tokio_postgres::Error> {
    let token = i64::from(fence);
    let written = pg
        .execute(
            "INSERT INTO balance AS b (id, cents, fence) VALUES ($1, $2, $3)
             ON CONFLICT (id) DO UPDATE SET cents = EXCLUDED.cents, fence = EXCLUDED.fence
             WHERE b.fence <= EXCLUDED.fence",
            &[&id, &cents, &token],
        )
        .await?;
    if written == 1 {
        return Ok(Ok(()));
    }
    let row = pg
        .query_one("SELECT fence FROM balance WHERE id = $1", &[&id])
        .await?;
    let highest = FenceToken::try_from(row.get::<_, i64>(0)).unwrap_or(FenceToken::MAX);
    Ok(Err(StaleFence {
        presented: fence,
        highest,
    }))
}

/// Reads the balance `id` and the fence of its last accepted write, if the row exists.
pub async fn balance(pg: &Pg, id: &str) -> Result<Option<(i64, i64)>, tokio_postgres::Error> {
    let row = pg
        .query_opt("SELECT cents, fence FROM balance WHERE id = $1", &[&id])
        .await?;
    Ok(row.map(|row| (row.get(0), row.get(1))))
}

/// Reads `qty` for `sku`.
pub async fn quantity(pg: &Pg, sku: &str) -> Result<i64, tokio_postgres::Error> {
    let row = pg
        .query_one("SELECT qty FROM stock WHERE sku = $1", &[&sku])
        .await?;
    Ok(row.get(0))
}

/// Connects to PostgreSQL, driving the connection on a background task.
pub async fn connect(config: &str) -> Result<Pg, tokio_postgres::Error> {
    let (pg, connection) = tokio_postgres::connect(config, NoTls).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            eprintln!("postgres connection ended: {err}");
        }
    });
    pg.batch_execute(SCHEMA).await?;
    pg.batch_execute(UPSERT_SCHEMA).await?;
    Ok(pg)
}

/// A stalled holder's late write is rejected; its successor's write goes through.
#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let redis_url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:7000".into());
    let pg_config = args
        .next()
        .unwrap_or_else(|| "host=127.0.0.1 user=postgres".into());
    let locks = Client::connect([redis_url.as_str()]).await?;
    let pg = connect(&pg_config).await?;
    pg.execute(
        "INSERT INTO stock (sku, qty) VALUES ('sku-1', 10) ON CONFLICT (sku) DO NOTHING",
        &[],
    )
    .await?;

    let short = LockOptions::new().ttl(Duration::from_millis(100));
    let stalled = locks.lock("stock:sku-1", &short).await?;
    let stalled_fence = stalled.fence();
    tokio::time::sleep(Duration::from_millis(200)).await; // the "GC pause": the lease runs out
    let next = locks.lock("stock:sku-1", &LockOptions::new()).await?;
    fenced_update(&pg, "sku-1", 9, next.fence()).await??;
    println!("fence {} wrote qty 9", next.fence());
    match fenced_update(&pg, "sku-1", 5, stalled_fence).await? {
        Ok(()) => println!("fence {stalled_fence} wrote qty 5 (unexpected)"),
        Err(stale) => println!("fence {stalled_fence} rejected: {stale}"),
    }
    // The same rule for a row that need not exist yet: the upsert.
    fenced_upsert(&pg, "acct-1", 1_000, next.fence()).await??;
    match fenced_upsert(&pg, "acct-1", 0, stalled_fence).await? {
        Ok(()) => println!("fence {stalled_fence} upserted acct-1 (unexpected)"),
        Err(stale) => println!("fence {stalled_fence} upsert rejected: {stale}"),
    }
    next.release().await?;
    let _ = stalled.release().await;
    println!("qty is {}", quantity(&pg, "sku-1").await?);
    println!(
        "acct-1 is {:?} (cents, fence)",
        balance(&pg, "acct-1").await?
    );
    Ok(())
}
