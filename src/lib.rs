//! Distributed locks on Redis Cluster (and standalone Redis) that hand out **fencing tokens**.
//!
//! A lock keeps others out only while its holder is alive and timely. When a holder pauses
//! past its TTL, or a failover loses the lock key, two holders can act at once. The fence token
//! granted with each hold grows with every grant, so storage that remembers the highest token it
//! accepted can reject the stale holder's writes ([`FenceGate`] does it for in-process state,
//! [`Client::fenced_set`] for values kept in Redis).
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock::{Client, FenceGate, LockOptions};
//!
//! #[tokio::main]
//! async fn main() -> fencelock::Result<()> {
//!     let client = Client::connect(["redis://127.0.0.1:6379"]).await?;
//!     let gate = FenceGate::new(); // lives with the protected state
//!     let guard = client
//!         .lock("orders:42", &LockOptions::new().ttl(Duration::from_secs(10)))
//!         .await?;
//!     // The check and the write in one step: a paused older holder cannot write after.
//!     let _written = gate.admit_with(guard.fence(), || { /* write the order */ });
//!     guard.release().await
//! }
//! ```
//!
//! # What is in it
//!
//! - **Mutex**: [`Client::lock`], [`Client::try_lock`], [`Client::with_lock`] /
//!   [`Client::with_lock_guard`]; a [`LockGuard`] to [`release`](LockGuard::release),
//!   [`extend`](LockGuard::extend), watch with [`lost`](LockGuard::lost) and re-enter
//!   ([`Reentry`]). Options, with their defaults, in [`LockOptions`] (TTL 30 s, wait up to 10 s,
//!   no watchdog).
//! - **Watchdog**: [`LockOptions::watchdog`] renews held locks in one batched call per node.
//! - **Read-write lock** ([`Client::read_lock`], [`Client::write_lock`]), **fair lock**
//!   ([`Client::fair_lock`]), **semaphore** with numbered expiring permits
//!   ([`Client::semaphore`]), **countdown latch** ([`Client::latch`]) and **multi-lock**
//!   ([`Client::lock_all`], [`Client::fair_lock_all`]): every hold fenced.
//! - **Quorum lock** over independent deployments: [`QuorumClient`].
//! - **Fence modes** ([`FenceMode`]): tokens that never go backwards across failovers, by
//!   default the server clock plus the master's config epoch.
//! - **Operations**: [`Client::inspect`], [`Client::force_unlock`], [`Client::list_locks`];
//!   [`Client::stats`] and `tracing` spans for every call; [`Client::shutdown`].
//! - **Errors**: one [`Error`] enum whose messages name the lock and say what to do.
//!
//! # Cargo features
//!
//! - `cli` (default): the `fencelock` binary (`exec`, `hold`, `status`, `unlock`, `list`,
//!   `top`, ...); library users can turn it off with `default-features = false`.
//! - `tls` (default): `rediss://` URLs through rustls with the ring provider
//!   ([`ClientBuilder::tls_ca_file`], [`ClientBuilder::tls_client_cert_files`]).
//! - `metrics`: every counter and histogram of [`Stats`] is also reported through the
//!   [`metrics`](https://docs.rs/metrics) facade, labelled with the primitive's `kind`; plug in
//!   any exporter (the crate's `examples/prometheus.rs` uses
//!   [`metrics-exporter-prometheus`](https://docs.rs/metrics-exporter-prometheus)).
//! - `serde`: `Serialize`/`Deserialize` for [`LockOptions`] (durations as humantime strings).
//!
//! # Further reading
//!
//! The crate ships its design notes next to the source (read them in the downloaded crate or
//! the repository): `docs/design.md` (key layout, scripts, what is guaranteed),
//! `docs/safety.md` (the fault-injection results), `docs/primitives.md` (the lock family),
//! `docs/storage.md` (how storage checks fences) and `docs/benchmarks.md`; the examples
//! `examples/demo.rs`, `examples/postgres.rs`, `examples/prometheus.rs` and
//! `examples/tracing.rs`. Requires Redis 7.0 or later; runs on tokio.
#![warn(missing_docs)]

mod acquire;
mod client;
mod core;
mod error;
mod fair;
mod fence;
mod guard;
mod held;
mod human;
mod inspect;
mod keys;
mod kind;
mod latch;
mod local_queue;
mod lock;
mod multi;
mod options;
#[cfg(feature = "serde")]
mod options_serde;
mod owner;
mod quorum;
mod reentry;
mod runtime;
mod rwlock;
mod script;
mod semaphore;
mod stats;
mod transport;

pub use client::{Client, ClientBuilder, DEFAULT_EXPIRY_GRACE, MAX_EXPIRY_GRACE};
pub use error::{Error, Operation, Result};
pub use fair::{FairLockGuard, MAX_FAIR_WAITERS};
pub use fence::{FenceGate, FenceMode, FenceToken, InvalidFence, StaleFence};
pub use human::{HumanDuration, Printable};
pub use inspect::{Inspection, LockList};
pub use keys::{slot_of, tag_for_slot, LockKeys, Placement, MAX_NAME_LEN, SLOT_COUNT};
pub use kind::Kind;
pub use latch::{Latch, DEFAULT_OPEN_TTL, MAX_LATCH_COUNT, MAX_OPEN_TTL};
pub use lock::{LockGuard, Reentry};
pub use multi::{MultiGuard, MultiMember, MAX_MULTI_LOCKS};
pub use options::{LockOptions, Waiting, MAX_FLOOR, MAX_TTL, MAX_WAIT_TIMEOUT, MIN_TTL};
pub use quorum::{QuorumClient, QuorumClientBuilder, QuorumGuard};
pub use rwlock::{ReadGuard, RwReentry, WriteGuard, MAX_READERS};
pub use script::{lua_scripts, ScriptSource};
pub use semaphore::{Permit, PermitGuard, Semaphore, MAX_PERMITS, MAX_PERMITS_PER_CALL};
pub use stats::{Histogram, Stats};
pub use transport::{ModuleUse, Topology};

/// The `redis` crate fencelock is built on, re-exported so that the redis-rs types in
/// fencelock's API (the `source` of [`Error::Connect`], [`Error::Redis`] and
/// [`Error::OutOfMemory`], and the clients [`Client::from_redis_client`] and
/// [`Client::from_cluster_client`] take) are always those of the version fencelock uses: name
/// them as `fencelock::redis::...` and a redis-rs upgrade in your own dependencies cannot break
/// the match. A fencelock release that moves to another major version of `redis` is a breaking
/// release.
pub use redis;
