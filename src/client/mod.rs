//! The client handle: [`Client`], through which every primitive is reached. This file holds the
//! handle and what belongs to no one primitive (topology, [`Client::fenced_set`], stats and
//! shutdown); `builder.rs` holds [`ClientBuilder`], its settings and `connect`, and the
//! constructors that start one. Each primitive keeps its own methods (`lock`, `fair_lock`,
//! `read_lock`, `semaphore`, `latch`, `lock_all`, `inspect`, ...) in an `impl Client` block in
//! its module, built on `Client::core`.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::fence::{FenceToken, StaleFence};
use crate::script::{parse_fence, parse_reply, ScriptCall, FENCED_SET};
use crate::stats::Stats;
use crate::transport::Topology;

mod builder;

pub use builder::{ClientBuilder, DEFAULT_EXPIRY_GRACE, MAX_EXPIRY_GRACE};

/// A connection to Redis Cluster or a standalone Redis that grants fenced locks.
///
/// Cheap to clone: clones share one connection.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> fencelock::Result<()> {
/// use std::time::Duration;
/// use fencelock::{Client, LockOptions};
///
/// let client = Client::connect(["redis://127.0.0.1:7000"]).await?;
/// let options = LockOptions::new().ttl(Duration::from_secs(10));
/// let guard = client.lock("orders:42", &options).await?;
/// println!("holding {} with fence {}", guard.name(), guard.fence());
/// // ... write to storage, passing guard.fence() along ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    core: Arc<Core>,
}

impl Client {
    /// What the client shares with its guards, for the primitives' constructors in their own
    /// modules (`impl Client` blocks there).
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("nodes", &self.core.transport.endpoint().nodes)
            .field("topology", &self.topology())
            .field("prefix", &self.core.prefix)
            .finish()
    }
}

impl Client {
    /// Whether the client talks to a cluster or a single server.
    pub fn topology(&self) -> Topology {
        self.core.transport.topology()
    }

    /// Stores `value` in the Redis hash `key` (fields `value` and `fence`) only if `fence` is not
    /// lower than any fence accepted for `key` before: the storage-side check for state kept in
    /// Redis. Works on any Redis; `key` is used as given (no prefix).
    ///
    /// Returns `Ok(Err(StaleFence))` when rejected, with the highest fence accepted so far, which
    /// a new holder may pass as its [`LockOptions::floor`](crate::LockOptions::floor).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client, guard: fencelock::LockGuard) -> fencelock::Result<()> {
    /// match client.fenced_set("stock:sku-1", guard.fence(), "41").await? {
    ///     Ok(()) => println!("written"),
    ///     Err(stale) => println!("rejected: {stale}"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty key; [`Error::Timeout`] or [`Error::Redis`] when Redis
    /// does not answer or fails (for example `WRONGTYPE` when `key` is not a hash).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have written.
    pub async fn fenced_set(
        &self,
        key: &str,
        fence: FenceToken,
        value: &str,
    ) -> Result<std::result::Result<(), StaleFence>> {
        if key.is_empty() {
            return Err(Error::InvalidName {
                name: String::new(),
                reason: "the resource key is empty: name the key that holds the value".into(),
            });
        }
        let fence_arg = fence.get().to_string();
        let span = tracing::debug_span!("fencelock.fenced_set", key, fence = fence.get());
        let reply = self
            .core
            .transport
            .run(
                &ScriptCall::new(&FENCED_SET, &[key], &[&fence_arg, value]),
                key,
                Operation::FencedWrite,
            )
            .instrument(span)
            .await?;
        let (status, highest) = parse_reply::<(i64, i64)>(key, Operation::FencedWrite, reply)?;
        if status == 1 {
            return Ok(Ok(()));
        }
        let highest = parse_fence(key, Operation::FencedWrite, "highest fence", highest)?;
        Ok(Err(StaleFence {
            presented: fence,
            highest,
        }))
    }

    /// Waits for this client's background work to finish: the releases of guards dropped
    /// without [`release`](crate::LockGuard::release), the releases that linger
    /// ([`LockOptions::linger`](crate::LockOptions::linger)) and the undos of cancelled
    /// acquisitions, which run as background tasks. Call it before the process exits, so that a
    /// lock whose guard was just dropped is free at once instead of staying held until its TTL
    /// ends.
    ///
    /// Waits at most one request timeout (each background release is itself bounded by it);
    /// see [`shutdown_within`](Self::shutdown_within) for another bound. The client stays
    /// usable: shutdown only waits.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// let guard = client.lock("jobs:nightly", &fencelock::LockOptions::new()).await?;
    /// drop(guard); // released in the background
    /// client.shutdown().await?; // the release has reached Redis
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::ShutdownIncomplete`] when background releases were still running at the bound
    /// (a node paused or unreachable): their locks expire after their TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits; the background releases go on.
    pub async fn shutdown(&self) -> Result<()> {
        self.shutdown_within(self.core.transport.request_timeout())
            .await
    }

    /// [`shutdown`](Self::shutdown), waiting at most `limit`.
    ///
    /// # Errors
    ///
    /// [`Error::ShutdownIncomplete`] when background releases were still running after `limit`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn shutdown_within(&self, limit: Duration) -> Result<()> {
        let span = tracing::debug_span!("fencelock.shutdown");
        let pending = self.core.transport.settle(limit).instrument(span).await;
        if pending == 0 {
            return Ok(());
        }
        Err(Error::ShutdownIncomplete {
            pending,
            after: limit,
        })
    }

    /// A snapshot of this client's counters (grants, contention, losses, ...).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) {
    /// let stats = client.stats();
    /// println!("{} of {} acquire requests met a held lock", stats.busy, stats.acquire_attempts);
    /// # }
    /// ```
    pub fn stats(&self) -> Stats {
        self.core.stats()
    }
}
