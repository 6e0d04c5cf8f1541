//! Setup the semaphore tests share (`tests/semaphore.rs`, `tests/semaphore_index.rs`): a
//! server with a client and one semaphore on it, an async poll, and a script's source by name.

use std::future::Future;
use std::time::{Duration, Instant};

use fencelock::{Client, Semaphore};

use super::Standalone;

/// A fresh standalone server, a client connected to it and that client's semaphore `name` with
/// `limit` permits. Keep the server for the whole test: it stops when dropped.
pub async fn standalone_semaphore(name: &str, limit: u32) -> (Standalone, Client, Semaphore) {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let semaphore = client.semaphore(name, limit).unwrap();
    (server, client, semaphore)
}

/// Polls the async `condition` every 10 ms until it holds, panicking after `limit`.
pub async fn until<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !condition().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `semaphore` counts exactly `n` free permits (a condition for [`until`]).
pub async fn available_is(semaphore: &Semaphore, n: u32) -> bool {
    semaphore.available().await.unwrap() == n
}

/// The source of the script `name` (see `fencelock::lua_scripts`), for calls sent by hand.
pub fn script(name: &str) -> &'static str {
    fencelock::lua_scripts()
        .find(|s| s.name == name)
        .expect("known script")
        .source
}
