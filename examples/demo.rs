//! Several workers contend for one lock and write through a store that rejects stale fence
//! tokens. Halfway through, the lock's master is failed over (`CLUSTER FAILOVER TAKEOVER` on its
//! replica): the fence tokens keep rising across it. One worker stalls past its TTL (as in a
//! long GC pause) and its late write is rejected.
//!
//! Run: `scripts/demo.sh` (starts a local cluster), or
//! `cargo run --example demo -- redis://127.0.0.1:7000`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::{Client, FenceGate, FenceToken, LockOptions, StaleFence, Topology};
use tokio::sync::watch;

const LOCK: &str = "demo:stock";
const WORKERS: usize = 4;
const ROUNDS: usize = 6;

/// The protected resource: a stock count that only accepts writes with a current fence.
struct Store {
    gate: FenceGate,
    stock: Mutex<i64>,
    /// Fences of accepted writes, in the order they were applied.
    accepted: Mutex<Vec<FenceToken>>,
    writes: watch::Sender<usize>,
}

impl Store {
    fn decrement(&self, fence: FenceToken) -> Result<i64, StaleFence> {
        let mut stock = self.stock.lock().unwrap_or_else(|e| e.into_inner());
        self.gate.admit(fence)?;
        *stock -= 1;
        self.accepted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(fence);
        self.writes.send_modify(|n| *n += 1);
        Ok(*stock)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:7000".into());
    let store = Arc::new(Store {
        gate: FenceGate::new(),
        stock: Mutex::new((WORKERS * ROUNDS) as i64),
        accepted: Mutex::new(Vec::new()),
        writes: watch::Sender::new(0),
    });
    println!("{WORKERS} workers contend for lock {LOCK:?} on {url}");
    let mut tasks = Vec::new();
    let mut topology = Topology::Standalone;
    for worker in 0..WORKERS {
        let client = Client::connect([url.as_str()]).await?;
        topology = client.topology();
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(
            async move { work(worker, client, store).await },
        ));
    }
    println!("topology: {topology:?}");
    let failover = (topology == Topology::Cluster).then(|| {
        let (url, store) = (url.clone(), Arc::clone(&store));
        tokio::spawn(async move {
            let mut writes = store.writes.subscribe();
            let half = WORKERS * ROUNDS / 2;
            writes.wait_for(|n| *n >= half).await?;
            let slot = Client::connect([url.as_str()])
                .await?
                .keys(LOCK, &LockOptions::new())?
                .slot();
            let promoted = fail_over(&url, slot).await?;
            let after = *writes.borrow();
            println!("*** failed over slot {slot}: replica {promoted} is master now (after write #{after}) ***");
            Ok::<usize, Box<dyn std::error::Error + Send + Sync>>(after)
        })
    });

    let (mut accepted, mut rejected) = (0, 0);
    for task in tasks {
        let (a, r) = task.await??;
        accepted += a;
        rejected += r;
    }
    let failed_over_at = match failover {
        Some(task) => Some(task.await?.map_err(|e| e.to_string())?),
        None => None,
    };
    let fences = store
        .accepted
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let rising = fences.windows(2).all(|w| w[0] < w[1]);
    println!("fences of accepted writes, in order:");
    for (i, fence) in fences.iter().enumerate() {
        let mark = if Some(i) == failed_over_at {
            "   <- first write after the failover"
        } else {
            ""
        };
        println!("  #{:<2} {fence}{mark}", i + 1);
    }
    let stock = *store.stock.lock().unwrap_or_else(|e| e.into_inner());
    println!(
        "summary: {accepted} writes accepted with strictly rising fences: {}, {rejected} stale \
         write(s) rejected, stock left {stock}, failover: {}",
        if rising { "yes" } else { "NO" },
        if failed_over_at.is_some() {
            "yes"
        } else {
            "no (standalone)"
        }
    );
    if !rising || rejected == 0 {
        return Err("the demo did not show what it should".into());
    }
    Ok(())
}

async fn work(
    worker: usize,
    client: Client,
    store: Arc<Store>,
) -> fencelock::Result<(usize, usize)> {
    let options = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .timeout(Duration::from_secs(30));
    let (mut accepted, mut rejected) = (0, 0);
    for round in 0..ROUNDS {
        if worker == 0 && round == 2 {
            // The stalled holder: a short TTL, then a pause longer than it.
            let short = options.clone().ttl(Duration::from_millis(200));
            let guard = client.lock(LOCK, &short).await?;
            let fence = guard.fence();
            println!("worker {worker} holds fence {fence} and stalls for 600 ms (TTL 200 ms)");
            tokio::time::sleep(Duration::from_millis(600)).await;
            match store.decrement(fence) {
                Ok(_) => accepted += 1,
                Err(stale) => {
                    rejected += 1;
                    println!("worker {worker}: write with fence {fence} REJECTED: {stale}");
                }
            }
            if let Err(err) = guard.release().await {
                println!("worker {worker}: release says: {err}");
            }
            continue;
        }
        let guard = client.lock(LOCK, &options).await?;
        let fence = guard.fence();
        match store.decrement(fence) {
            Ok(left) => {
                accepted += 1;
                println!("worker {worker} fence {fence}: stock -> {left}");
            }
            Err(stale) => {
                rejected += 1;
                println!("worker {worker} fence {fence}: rejected ({stale})");
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Err(err) = guard.release().await {
            println!("worker {worker}: release says: {err}");
        }
    }
    Ok((accepted, rejected))
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Promotes the replica of `slot`'s master with `CLUSTER FAILOVER TAKEOVER` and waits until it
/// reports itself master. Returns its address.
async fn fail_over(url: &str, slot: u16) -> Result<String, BoxError> {
    let mut seed = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut seed)
        .await?;
    let range = ranges
        .into_iter()
        .find(|r| {
            let bound = |i: usize| {
                r.get(i)
                    .and_then(|v| redis::from_redis_value::<u16>(v.clone()).ok())
            };
            matches!((bound(0), bound(1)), (Some(lo), Some(hi)) if lo <= slot && slot <= hi)
        })
        .ok_or("no node serves the slot")?;
    let replica: (String, u16) = redis::from_redis_value::<Vec<redis::Value>>(
        range.get(3).cloned().ok_or("the master has no replica")?,
    )
    .and_then(|node| {
        Ok((
            redis::from_redis_value(node[0].clone())?,
            redis::from_redis_value(node[1].clone())?,
        ))
    })?;
    let address = format!("{}:{}", replica.0, replica.1);
    let mut conn = redis::Client::open(format!("redis://{address}"))?
        .get_multiplexed_async_connection()
        .await?;
    let _: () = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("TAKEOVER")
        .query_async(&mut conn)
        .await?;
    let promoted = async {
        loop {
            let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
            if role
                .first()
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                == Some("master".into())
            {
                return Ok::<(), BoxError>(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), promoted).await??;
    Ok(address)
}
