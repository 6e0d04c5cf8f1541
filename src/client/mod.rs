//! The client: configures and connects, then hands out the primitives' guards (today the
//! mutex's, [`LockGuard`]) and runs fenced writes. `builder.rs` holds [`ClientBuilder`], its
//! settings and `connect`, and the constructors that start one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::acquire;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::fair::{self, FairLockGuard};
use crate::fence::{FenceToken, StaleFence};
use crate::keys::LockKeys;
use crate::keys::Placement;
use crate::latch::Latch;
use crate::lock::{self, LockGuard};
use crate::options::{instant_after, LockOptions};
use crate::script::{parse_fence, parse_reply, ScriptCall, FENCED_SET};
use crate::semaphore::Semaphore;
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

    /// The Redis keys and slot lock `name` uses with `options`' placement.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidOptions`] as [`LockKeys::new`].
    pub fn keys(&self, name: &str, options: &LockOptions) -> Result<LockKeys> {
        LockKeys::new(&self.core.prefix, name, &options.placement)
    }

    /// Stores `value` in the Redis hash `key` (fields `value` and `fence`) only if `fence` is not
    /// lower than any fence accepted for `key` before: the storage-side check for state kept in
    /// Redis. Works on any Redis; `key` is used as given (no prefix).
    ///
    /// Returns `Ok(Err(StaleFence))` when rejected, with the highest fence accepted so far, which
    /// a new holder may pass as its [`LockOptions::floor`].
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
                "fenced write",
            )
            .instrument(span)
            .await?;
        let (status, highest) = parse_reply::<(i64, i64)>(key, "fenced write", reply)?;
        if status == 1 {
            return Ok(Ok(()));
        }
        let highest = parse_fence(key, "fenced write", "highest fence", highest)?;
        Ok(Err(StaleFence {
            presented: fence,
            highest,
        }))
    }

    /// Makes one attempt to acquire lock `name`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::{Error, LockOptions};
    ///
    /// match client.try_lock("reports:daily", &LockOptions::new()).await {
    ///     Ok(guard) => {
    ///         // the work, presenting guard.fence() to storage
    ///         guard.release().await?;
    ///     }
    ///     Err(Error::Busy { retry_after, .. }) => println!("busy, frees within {retry_after:?}"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when another owner holds it; [`Error::ReplicasNotConfirmed`] when
    /// `wait_replicas` was not met (the lock was released again); [`Error::InvalidName`] /
    /// [`Error::InvalidOptions`] for bad input; [`Error::Timeout`] or [`Error::Redis`] when Redis
    /// does not answer in time or fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped after the request was sent, a background task
    /// releases whatever the request may have acquired.
    pub async fn try_lock(&self, name: &str, options: &LockOptions) -> Result<LockGuard> {
        let keys = self.keys(name, options)?;
        options.validate(name)?;
        let span = tracing::debug_span!(
            "fencelock.try_lock",
            lock = name,
            kind = "lock",
            slot = keys.slot()
        );
        acquire::once(
            &self.core,
            &lock::Acquire {
                keys: &keys,
                options,
            },
        )
        .instrument(span)
        .await
    }

    /// Acquires lock `name`, waiting while another owner holds it or Redis is briefly
    /// unavailable, for up to `options.timeout`.
    ///
    /// While the lock is held by another owner the call subscribes to the lock's channel
    /// (sharded pub/sub on a cluster, in the lock's slot) and tries again as soon as the holder
    /// releases; all waiting calls of one client share one subscription per lock. It also tries
    /// again when the holder's lease ends and at least every 250 ms (a release can be announced
    /// where the subscription does not hear it, as while the lock's slot migrates), and polls
    /// with jittered backoff when the server cannot publish or the subscription cannot be made.
    ///
    /// While another task of this client holds the lock the call queues behind it, in arrival
    /// order, and is handed the lock by that task's release: in the release's own script call,
    /// or, when that call reserved fences for the tasks queued behind (up to 16), with no call:
    /// the task then holds the lock under the same Redis hold (owner token, lease, watchdog) with
    /// the next fence, while the lease has at least 90% of its TTL left (half under the
    /// watchdog), no call releasing or extending that hold failed, and the call asked for the
    /// same TTL and renewal, without `max_hold`, a floor at
    /// or above that fence, or `wait_replicas` (those always ask Redis). Fences still rise with
    /// every grant, and every later grant by Redis is above the reserved ones. Another client
    /// waiting gets in at the next handoff that goes through Redis.
    ///
    /// Returns within the timeout plus one request timeout (plus the WAIT timeout if set).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let options = LockOptions::new()
    ///     .ttl(Duration::from_secs(10))
    ///     .timeout(Duration::from_secs(30));
    /// let guard = client.lock("orders:42", &options).await?;
    /// let fence = guard.fence(); // present it with every write to the protected storage
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when the lock stayed held until the timeout; [`Error::Timeout`] or
    /// [`Error::Redis`] when Redis kept failing; otherwise as [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds no lock (an acquire request in flight is released in
    /// the background, as in [`try_lock`](Self::try_lock)), and its registration on the lock's
    /// channel is dropped with it; the subscription ends when no other call of this client waits
    /// on that lock. No task is left behind for it.
    pub async fn lock(&self, name: &str, options: &LockOptions) -> Result<LockGuard> {
        let keys = self.keys(name, options)?;
        options.validate(name)?;
        let span = tracing::debug_span!(
            "fencelock.lock",
            lock = name,
            kind = "lock",
            slot = keys.slot()
        );
        let request = lock::Acquire {
            keys: &keys,
            options,
        };
        acquire::wait_observed(
            &self.core,
            &request,
            options.timeout,
            options.on_wait.as_ref(),
        )
        .instrument(span)
        .await
    }

    /// Runs `work` while holding lock `name`, and releases the lock on every path: acquires it
    /// as [`lock`](Self::lock) does, calls `work` with the hold's fence token, and releases the
    /// lock when `work` returns `Ok` or `Err`. To give `work` the guard itself (to extend the
    /// lease), use [`with_lock_guard`](Self::with_lock_guard). If `work` panics or the returned future is
    /// dropped, the guard's drop releases the lock in the background (see
    /// [`shutdown`](Self::shutdown) to wait for it).
    ///
    /// With the watchdog on ([`LockOptions::watchdog`]) `work` is raced against
    /// [`LockGuard::lost`]: when the hold is lost, `work`'s future is dropped at once (at its
    /// next `.await`) and the loss is returned. Without the watchdog `work` runs to its end; if
    /// the lease ran out meanwhile, the release finds the lock lost and that loss is returned
    /// instead of `work`'s value (its writes may have been rejected by fence). A release that
    /// fails for another reason (Redis did not answer) is logged, and `work`'s outcome is
    /// returned: the lock then expires after its TTL.
    ///
    /// `work`'s error type only needs `From<fencelock::Error>` (as `anyhow::Error` and
    /// `fencelock::Error` have), so acquisition errors and losses come back through it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let options = LockOptions::new().watchdog(true);
    /// let written = client
    ///     .with_lock("orders:42", &options, |fence| async move {
    ///         // write the order, passing `fence` to the storage
    ///         Ok::<_, fencelock::Error>(fence.get())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock) when the lock is not acquired (`work` is then not called);
    /// `work`'s own error; with the watchdog, the loss [`LockGuard::lost`] reports
    /// ([`Error::is_lock_lost`]); [`Error::Expired`], [`Error::ForceUnlocked`] or
    /// [`Error::NotOwner`] when the release found the lock lost after `work` succeeded.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call drops `work` and releases the lock (or the acquisition in
    /// flight) in the background.
    pub async fn with_lock<T, E, F, Fut>(
        &self,
        name: &str,
        options: &LockOptions,
        work: F,
    ) -> std::result::Result<T, E>
    where
        F: FnOnce(FenceToken) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, E>>,
        E: From<Error>,
    {
        let guard = self.lock(name, options).await?;
        let span = tracing::debug_span!(
            "fencelock.with_lock",
            lock = name,
            kind = "lock",
            fence = guard.fence().get()
        );
        let outcome = async {
            let work = work(guard.fence());
            if options.watchdog {
                tokio::select! {
                    biased;
                    lost = guard.lost() => return Err(lost),
                    outcome = work => return Ok(outcome),
                }
            }
            Ok(work.await)
        }
        .instrument(span.clone())
        .await;
        finish_with_lock(guard, outcome, span, name).await
    }

    /// Runs `work` while holding lock `name`, as [`with_lock`](Self::with_lock) does, but lends
    /// `work` the guard itself (`&mut LockGuard`) instead of its fence, so the work can
    /// [`extend`](LockGuard::extend) the lease, read [`valid_until`](LockGuard::valid_until) or
    /// take a [`reentry`](LockGuard::reentry) handle; the release stays with this call. A
    /// sibling rather than a change of `with_lock`'s signature, which would break its callers.
    ///
    /// `work` is an async closure (`async |guard| { ... }`). With the watchdog on it is raced
    /// against the loss of the hold as in `with_lock`; without it, it runs to its end and the
    /// release reports a loss.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let options = LockOptions::new().ttl(Duration::from_secs(10));
    /// let fence = client
    ///     .with_lock_guard("orders:42", &options, async |guard| {
    ///         // first half of the work, then more time for the second half
    ///         guard.extend(Duration::from_secs(10)).await?;
    ///         Ok::<_, fencelock::Error>(guard.fence())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`with_lock`](Self::with_lock).
    ///
    /// # Cancel safety
    ///
    /// As [`with_lock`](Self::with_lock).
    pub async fn with_lock_guard<T, E, F>(
        &self,
        name: &str,
        options: &LockOptions,
        work: F,
    ) -> std::result::Result<T, E>
    where
        F: AsyncFnOnce(&mut LockGuard) -> std::result::Result<T, E>,
        E: From<Error>,
    {
        let mut guard = self.lock(name, options).await?;
        let span = tracing::debug_span!(
            "fencelock.with_lock",
            lock = name,
            kind = "lock",
            fence = guard.fence().get()
        );
        let lost = guard.held().lost_watcher();
        let outcome = async {
            let work = work(&mut guard);
            match lost {
                Some(lost) => tokio::select! {
                    biased;
                    lost = lost => Err(lost),
                    outcome = work => Ok(outcome),
                },
                None => Ok(work.await),
            }
        }
        .instrument(span.clone())
        .await;
        finish_with_lock(guard, outcome, span, name).await
    }

    /// The countdown latch `name` (key `<prefix>:{name}:latch`): a handle, no call to Redis.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty name or one longer than 4096 bytes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    ///
    /// let latch = client.latch("batch:7")?;
    /// latch.set(1).await?;
    /// latch.count_down("only-worker").await?;
    /// latch.wait(Duration::from_secs(5)).await?;
    /// # Ok(()) }
    /// ```
    pub fn latch(&self, name: &str) -> Result<Latch> {
        let keys = LockKeys::of_kind(&self.core.prefix, name, &Placement::ByName, "latch")?;
        Ok(Latch::new(&self.core, keys))
    }

    /// The Redis key and slot of the fair lock `name` with `options`' placement:
    /// `<prefix>:{<name>}:fair`, a different key from the mutex `name` (same slot).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidOptions`] as [`LockKeys::new`].
    pub fn fair_keys(&self, name: &str, options: &LockOptions) -> Result<LockKeys> {
        LockKeys::of_kind(&self.core.prefix, name, &options.placement, fair::KIND)
    }

    /// Makes one attempt to acquire the fair lock `name`: granted only when it is free and no
    /// live caller waits in its queue. Never takes a place in the queue.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// match client.try_fair_lock("printer", &fencelock::LockOptions::new()).await {
    ///     Ok(guard) => guard.release().await?,
    ///     Err(fencelock::Error::Busy { .. }) => println!("held, or others are queued"),
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when another owner holds it or others wait for it; otherwise as
    /// [`try_lock`](Self::try_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped after the request was sent, a background task
    /// releases whatever the request may have acquired.
    pub async fn try_fair_lock(&self, name: &str, options: &LockOptions) -> Result<FairLockGuard> {
        let keys = self.fair_keys(name, options)?;
        options.validate(name)?;
        let span = tracing::debug_span!(
            "fencelock.try_fair_lock",
            lock = name,
            kind = fair::KIND,
            slot = keys.slot()
        );
        let request = fair::Acquire::new(&self.core, &keys, options, false);
        let outcome = acquire::once(&self.core, &request)
            .instrument(span.clone())
            .await;
        if outcome.is_err() {
            request.withdraw().instrument(span).await;
        }
        outcome
    }

    /// Acquires the fair lock `name` in arrival order, waiting for up to `options.timeout`.
    ///
    /// The first request that finds the lock held (or others queued) takes a place in the
    /// lock's queue: its arrival is the moment that request reached Redis, and the lock is
    /// granted to the live place that arrived first. While the call waits, the client's
    /// watchdog renews its place (in the same per-node batch as held locks; a place's lease is
    /// the lock's TTL, at most 3 s), so a crashed waiter drops out of the queue when its place's
    /// lease ends and a live one is never evicted. A release wakes only the head of the queue,
    /// on the head's own channel; the others sleep on. A fair lock is a different key from the
    /// mutex of the same name (`<prefix>:{<name>}:fair`). There is no re-entry: a second call of
    /// the same task queues behind the first.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let options = LockOptions::new().timeout(Duration::from_secs(60));
    /// let guard = client.fair_lock("printer", &options).await?; // first come, first served
    /// println!("printing under fence {}", guard.fence());
    /// guard.release().await?; // wakes the next in line
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when the lock was not granted before the timeout; otherwise as
    /// [`lock`](Self::lock). Before an error is returned the place is given up (one more
    /// request, bounded by the request timeout; if that fails too, in the background).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds no lock and leaves no place: its place (and a grant
    /// whose reply it did not read) is withdrawn at once in the background, waking the next
    /// waiter if it was the head; its watch and its subscription end with it. No task is left
    /// behind for it.
    pub async fn fair_lock(&self, name: &str, options: &LockOptions) -> Result<FairLockGuard> {
        let keys = self.fair_keys(name, options)?;
        options.validate(name)?;
        let span = tracing::debug_span!(
            "fencelock.fair_lock",
            lock = name,
            kind = fair::KIND,
            slot = keys.slot()
        );
        let request = fair::Acquire::new(&self.core, &keys, options, true);
        // The whole call, withdrawal included, keeps the waiting calls' bound: the timeout plus
        // one request timeout (measured: over a lossy 50 ms link an awaited withdrawal after a
        // timed-out wait ended 4.0 s into a 3.5 s bound). A withdrawal that would pass it is
        // left to the request's drop, which sends it in the background.
        let bound = instant_after(
            Instant::now(),
            options
                .timeout
                .saturating_add(self.core.transport.request_timeout()),
        );
        let outcome = acquire::wait_observed(
            &self.core,
            &request,
            options.timeout,
            options.on_wait.as_ref(),
        )
        .instrument(span.clone())
        .await;
        if outcome.is_err() {
            let withdraw = request.withdraw().instrument(span);
            let _ = tokio::time::timeout_at(bound.into(), withdraw).await;
        }
        outcome
    }

    /// A handle on semaphore `name` with `limit` numbered permits, each granted with its own
    /// fence and lease (see [`Semaphore`]). Makes no request: the first acquisition stores the
    /// limit, and every user must give the same one.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// let pool = client.semaphore("renderers", 8)?;
    /// println!("{} of {} permits free", pool.available().await?, pool.limit());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for a bad name; [`Error::InvalidOptions`] for a limit of 0 or
    /// above [`MAX_PERMITS`](crate::MAX_PERMITS).
    pub fn semaphore(&self, name: &str, limit: u32) -> Result<Semaphore> {
        Semaphore::new(&self.core, name, limit)
    }

    /// Waits for this client's background work to finish: the releases of guards dropped
    /// without [`release`](LockGuard::release) and the undos of cancelled acquisitions, which
    /// run as background tasks. Call it before the process exits, so that a lock whose guard
    /// was just dropped is free at once instead of staying held until its TTL ends.
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

/// The end of [`Client::with_lock`] and [`Client::with_lock_guard`]: `outcome` is `Err(loss)`
/// when the work was stopped by the loss of the hold, else the work's result; releases the
/// guard and returns what the caller gets.
async fn finish_with_lock<T, E: From<Error>>(
    guard: LockGuard,
    outcome: std::result::Result<std::result::Result<T, E>, Error>,
    span: tracing::Span,
    name: &str,
) -> std::result::Result<T, E> {
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(lost) => {
            tracing::warn!(parent: &span, lock = name, error = %lost, "with_lock: the hold was lost; the work was stopped");
            // The release of a lost hold only tidies up; its answer adds nothing.
            let _ = guard.release().instrument(span).await;
            return Err(E::from(lost));
        }
    };
    match guard.release().instrument(span.clone()).await {
        Ok(()) => outcome,
        Err(lost) if lost.is_lock_lost() && outcome.is_ok() => Err(E::from(lost)),
        Err(err) => {
            tracing::warn!(parent: &span, lock = name, error = %err, "with_lock: the release failed; the lock expires after its TTL");
            outcome
        }
    }
}
