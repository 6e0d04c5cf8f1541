//! Counters of what a client did, for monitoring lock contention and loss.

use std::sync::atomic::{AtomicU64, Ordering};

/// A snapshot of a [`Client`](crate::Client)'s counters since it was built; clones of a client
/// share them.
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// let guard = client.lock("jobs:nightly", &fencelock::LockOptions::new()).await?;
/// guard.release().await?;
/// let stats = client.stats();
/// println!("{} grants, {} busy answers, {} lost", stats.grants, stats.busy, stats.lost);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Acquire requests sent (each retry of `lock` counts).
    pub acquire_attempts: u64,
    /// Locks granted.
    pub grants: u64,
    /// Acquire requests answered "held by another owner": the contention.
    pub busy: u64,
    /// Acquire requests that failed (timeouts, Redis errors, replicas not confirmed).
    pub acquire_errors: u64,
    /// Grants released again because fewer replicas than required confirmed them.
    pub replicas_not_confirmed: u64,
    /// Replica acknowledgements counted by `WAIT`, summed over grants.
    pub replica_acks: u64,
    /// Successful extensions.
    pub extends: u64,
    /// Successful releases.
    pub releases: u64,
    /// Extensions or releases that found the lock expired or held by another owner.
    pub lost: u64,
    /// Times the main connection was rebuilt after repeated timeouts.
    pub connection_rebuilds: u64,
}

/// The live counters behind [`Stats`].
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) acquire_attempts: AtomicU64,
    pub(crate) grants: AtomicU64,
    pub(crate) busy: AtomicU64,
    pub(crate) acquire_errors: AtomicU64,
    pub(crate) replicas_not_confirmed: AtomicU64,
    pub(crate) replica_acks: AtomicU64,
    pub(crate) extends: AtomicU64,
    pub(crate) releases: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) connection_rebuilds: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            acquire_attempts: get(&self.acquire_attempts),
            grants: get(&self.grants),
            busy: get(&self.busy),
            acquire_errors: get(&self.acquire_errors),
            replicas_not_confirmed: get(&self.replicas_not_confirmed),
            replica_acks: get(&self.replica_acks),
            extends: get(&self.extends),
            releases: get(&self.releases),
            lost: get(&self.lost),
            connection_rebuilds: get(&self.connection_rebuilds),
        }
    }
}
