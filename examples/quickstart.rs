//! The README's library quick start, kept here so that it is built with every change:
//! `cargo run --example quickstart` against a Redis on 127.0.0.1:6379 (a fresh `redis-server`).

use fencelock::{Client, LockOptions};

#[tokio::main]
async fn main() -> fencelock::Result<()> {
    let client = Client::connect(["redis://127.0.0.1:6379"]).await?;
    let guard = client.lock("orders:42", &LockOptions::new()).await?; // waits up to 10 s
    let token = guard.fence(); // send it with every write: storage rejects lower tokens
    println!("holding orders:42 with token {token}");
    guard.release().await // Err(Expired | ForceUnlocked | NotOwner) if the hold was lost
}
