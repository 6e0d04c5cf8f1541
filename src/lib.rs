//! Distributed locks on Redis Cluster (and standalone Redis) that hand out **fencing tokens**.
//!
//! A lock keeps others out only while its holder is alive and timely. When a holder pauses
//! past its TTL, or a failover loses the lock key, two holders can act at once. The fence token
//! granted with each hold grows with every grant, so storage that remembers the highest token it
//! accepted can reject the stale holder's writes ([`FenceGate`] does it for in-process state).
//!
//! ```no_run
//! # async fn run() -> fencelock::Result<()> {
//! use std::time::Duration;
//! use fencelock::{Client, FenceGate, LockOptions};
//!
//! let client = Client::connect(["redis://127.0.0.1:7000"]).await?;
//! let gate = FenceGate::new(); // lives with the protected state
//! let guard = client
//!     .lock("orders:42", &LockOptions::new().ttl(Duration::from_secs(10)))
//!     .await?;
//! if gate.admit(guard.fence()).is_ok() {
//!     // write the order
//! }
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! See `docs/design.md` for the key layout, scripts and what is guaranteed.
#![warn(missing_docs)]

mod acquire;
mod client;
mod core;
mod error;
mod fair;
mod fence;
mod held;
mod human;
mod inspect;
mod keys;
mod latch;
mod local_queue;
mod lock;
mod multi;
mod options;
#[cfg(feature = "serde")]
mod options_serde;
mod quorum;
mod runtime;
mod rwlock;
mod script;
mod semaphore;
mod stats;
mod transport;

pub use client::{Client, ClientBuilder, DEFAULT_EXPIRY_GRACE, MAX_EXPIRY_GRACE};
pub use error::{Error, Result};
pub use fair::FairLockGuard;
pub use fence::{FenceGate, FenceMode, FenceToken, InvalidFence, StaleFence};
pub use human::HumanDuration;
pub use inspect::{Inspection, Kind, LockList};
pub use keys::{slot_of, tag_for_slot, LockKeys, Placement, MAX_NAME_LEN, SLOT_COUNT};
pub use latch::{Latch, DEFAULT_OPEN_TTL, MAX_LATCH_COUNT, MAX_OPEN_TTL};
pub use lock::{LockGuard, Reentry};
pub use multi::{MultiGuard, MultiMember, MAX_MULTI_LOCKS};
pub use options::{LockOptions, Waiting, MAX_FLOOR, MAX_TTL, MAX_WAIT_TIMEOUT, MIN_TTL};
pub use quorum::{QuorumClient, QuorumClientBuilder, QuorumGuard};
pub use rwlock::{ReadGuard, RwReentry, WriteGuard};
pub use script::{lua_scripts, ScriptSource};
pub use semaphore::{Permit, PermitGuard, Semaphore};
pub use stats::{Histogram, Stats};
pub use transport::Topology;

/// The `redis` crate fencelock is built on, re-exported so that the redis-rs types in
/// fencelock's API (the `source` of [`Error::Connect`], [`Error::Redis`] and
/// [`Error::OutOfMemory`], and the clients [`Client::from_redis_client`] and
/// [`Client::from_cluster_client`] take) are always those of the version fencelock uses: name
/// them as `fencelock::redis::...` and a redis-rs upgrade in your own dependencies cannot break
/// the match. A fencelock release that moves to another major version of `redis` is a breaking
/// release.
pub use redis;
