//! Several workers contend for one lock and write through a store that rejects stale fence
//! tokens. One worker stalls past its TTL (as in a long GC pause) and its late write is rejected.
//!
//! Run: `scripts/demo.sh` (starts a local cluster), or
//! `cargo run --example demo -- redis://127.0.0.1:7000`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock::{Client, FenceGate, FenceToken, LockOptions, StaleFence};

/// The protected resource: a stock count that only accepts writes with a current fence.
#[derive(Default)]
struct Store {
    gate: FenceGate,
    stock: Mutex<i64>,
}

impl Store {
    fn decrement(&self, fence: FenceToken) -> Result<i64, StaleFence> {
        let mut stock = self.stock.lock().unwrap_or_else(|e| e.into_inner());
        self.gate.admit(fence)?;
        *stock -= 1;
        Ok(*stock)
    }
}

const WORKERS: usize = 4;
const ROUNDS: usize = 5;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:7000".into());
    let store = Arc::new(Store {
        stock: Mutex::new((WORKERS * ROUNDS) as i64),
        ..Store::default()
    });
    println!("{WORKERS} workers contend for lock \"demo:stock\" on {url}");
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let client = Client::connect([url.as_str()]).await?;
        if worker == 0 {
            println!("topology: {:?}", client.topology());
        }
        let store = Arc::clone(&store);
        tasks.push(tokio::spawn(
            async move { work(worker, client, store).await },
        ));
    }
    let (mut accepted, mut rejected) = (0, 0);
    for task in tasks {
        let (a, r) = task.await??;
        accepted += a;
        rejected += r;
    }
    let stock = *store.stock.lock().unwrap_or_else(|e| e.into_inner());
    println!("summary: {accepted} writes accepted, {rejected} stale write(s) rejected, stock left {stock}, highest fence {:?}",
        store.gate.highest().map(u64::from));
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
            let guard = client.lock("demo:stock", &short).await?;
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
        let guard = client.lock("demo:stock", &options).await?;
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
        guard.release().await?;
    }
    Ok((accepted, rejected))
}
