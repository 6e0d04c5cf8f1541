//! Acquiring, for every primitive: the one wait loop over a [`Request`] (deadline, wake-ups on
//! the request's channel, backoff, retries of transient errors, the `Busy` error and the stats
//! common to all primitives), the in-flight undo, and grants confirmed by replicas.

mod backoff;
pub(crate) mod replicas;
mod undo;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::Core;
use crate::error::{Error, Result};
use crate::local_queue::Turn;
use crate::options::{instant_after, WaitObserver, Waiting};
use crate::runtime::wakeups::{Readiness, Subscription};
use crate::stats::{kind_of, Counters};

pub(crate) use backoff::Backoff;
pub(crate) use undo::InFlight;

/// One kind of acquisition: a primitive says how to make one attempt; the loop does the rest.
pub(crate) trait Request {
    /// What a granted attempt hands out (a guard).
    type Granted;

    /// The name errors and logs carry.
    fn name(&self) -> &str;

    /// The channel the releasing script publishes on when the resource frees up.
    fn channel(&self) -> &str;

    /// The error a call returns when the resource stayed busy: after one attempt (`waited`
    /// zero) or at the timeout; `retry_after` is what the last busy answer reported. The
    /// default is [`Error::Busy`]; a primitive whose "busy" is no holder's (a closed latch)
    /// names its own case.
    fn busy(&self, waited: Duration, retry_after: Duration) -> Error {
        Error::Busy {
            name: self.name().to_owned(),
            waited,
            retry_after,
        }
    }

    /// One request to Redis, under a fresh owner token.
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: a dropped attempt releases what it may have taken ([`InFlight`]).
    async fn attempt(&self, core: &Arc<Core>) -> Result<Attempt<Self::Granted>>;

    /// Waits behind a task of this client that holds the resource, if one does, until handed
    /// the resource, told to ask Redis, or `until`; without asking Redis. The default: no
    /// local queue (the mutex has one: `local_queue.rs`, `lock/handoff.rs`).
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: a dropped wait holds nothing.
    async fn wait_local(&self, _core: &Arc<Core>, _until: Instant) -> Local<Self::Granted> {
        Local::NotHeld
    }
}

/// What waiting in a client's local queue came to.
pub(crate) enum Local<G> {
    /// No task of this client holds the resource: ask Redis.
    NotHeld,
    /// Handed the resource by the holder's release.
    Granted(G),
    /// Ask Redis: with the client's turn for the resource (the others of the client queue
    /// behind it; kept while the call waits), or without, when the wait reached its limit.
    Ask(Option<Turn>),
}

/// The answer to one attempt.
pub(crate) enum Attempt<G> {
    /// Granted now.
    Granted(G),
    /// Held by others; the holder's lease ends in `retry_after`.
    Busy { retry_after: Duration },
}

/// One attempt: the granted value, or [`Error::Busy`].
///
/// # Cancel safety
///
/// As [`Request::attempt`].
pub(crate) async fn once<R: Request>(core: &Arc<Core>, request: &R) -> Result<R::Granted> {
    let started = Instant::now();
    match attempt(core, request).await? {
        Attempt::Granted(granted) => {
            core.counters
                .waits
                .record(kind_of(request.channel()), started.elapsed());
            Ok(granted)
        }
        Attempt::Busy { retry_after } => Err(request.busy(Duration::ZERO, retry_after)),
    }
}

/// The longest a subscribed waiter sleeps without a message before it looks again.
///
/// A release's announcement can miss a subscribed waiter: while a slot migrates, the release
/// script runs on the importing node (`ASK`) and publishes there, but the waiter's sharded
/// subscription stays on the old master until `SETSLOT NODE` (measured: a waiter behind a 5 s
/// lease slept 5 s). Looking again this often bounds what any lost message costs, at one
/// attempt per waiter per period, a fifth of what the slowest polling makes.
const RECHECK: Duration = Duration::from_millis(250);

/// How a waiter learns that the resource may have freed up.
enum Listening {
    /// Not subscribed yet: the first busy answer subscribes.
    NotYet,
    /// Subscribed to the request's channel: woken by releases, else at the lease end or after
    /// [`RECHECK`], whichever comes first.
    Subscribed(Subscription),
    /// Registered, but the subscription was not confirmed in time (measured: over a 50 ms ± 20
    /// ms link with 5% loss the subscriber connection took 1.5 s to open, longer than the
    /// 1 s request timeout the waiter gave it): polling with backoff, woken by a release once
    /// the subscription is made, which each attempt looks for.
    Pending(Subscription),
    /// No subscription (wake-ups off or unsupported): polling with backoff.
    Polling,
}

/// Attempts until granted, waiting while the resource is held or Redis is briefly unavailable,
/// for up to `timeout`: woken by releases on the request's channel (and every [`RECHECK`] in case
/// one was missed), at the holder's lease end, or by backoff when polling.
///
/// # Cancel safety
///
/// Cancel safe: a dropped call holds nothing (the attempt in flight is undone in the
/// background) and its registration on the channel is dropped with it.
pub(crate) async fn wait<R: Request>(
    core: &Arc<Core>,
    request: &R,
    timeout: Duration,
) -> Result<R::Granted> {
    wait_observed(core, request, timeout, None).await
}

/// [`wait`], telling `observer` each time the resource is found held and the call waits.
///
/// # Cancel safety
///
/// As [`wait`].
pub(crate) async fn wait_observed<R: Request>(
    core: &Arc<Core>,
    request: &R,
    timeout: Duration,
    observer: Option<&WaitObserver>,
) -> Result<R::Granted> {
    // The loop stops attempting at the timeout, but an attempt begun just before may take its
    // own request timeout, and a primitive's attempt may make more than one call (measured: a
    // fair-lock acquire over a lossy 50 ms link ended 0.5 s past both). The whole call is held
    // to the timeout plus one request timeout; a cut attempt is undone in the background.
    let limit = timeout.saturating_add(core.transport.request_timeout());
    match tokio::time::timeout(limit, wait_unbounded(core, request, timeout, observer)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Error::Timeout {
            name: request.name().to_owned(),
            operation: "acquire",
            after: limit,
        }),
    }
}

/// [`wait_observed`] without its outer bound.
async fn wait_unbounded<R: Request>(
    core: &Arc<Core>,
    request: &R,
    timeout: Duration,
    observer: Option<&WaitObserver>,
) -> Result<R::Granted> {
    let name = request.name();
    let started = Instant::now();
    let deadline = instant_after(started, timeout);
    let mut backoff = Backoff::new();
    let mut listening = Listening::NotYet;
    // The client's turn to ask for the resource, and whether the request has a local queue.
    let mut turn = None;
    let mut queued = false;
    loop {
        if turn.is_none() {
            // Behind a task of this client: wait for its release to hand over or for the turn
            // to ask, at most until the re-check period (a holder that never releases must not
            // keep the waiter from Redis).
            let until = deadline.min(Instant::now() + RECHECK);
            match request.wait_local(core, until).await {
                Local::Granted(granted) => {
                    core.counters
                        .waits
                        .record(kind_of(request.channel()), started.elapsed());
                    return Ok(granted);
                }
                Local::Ask(next) => {
                    queued = true;
                    turn = next;
                }
                Local::NotHeld => queued = false,
            }
        }
        let pause = match attempt(core, request).await {
            Ok(Attempt::Granted(granted)) => {
                if let Some(turn) = turn.take() {
                    turn.granted();
                }
                core.counters
                    .waits
                    .record(kind_of(request.channel()), started.elapsed());
                return Ok(granted);
            }
            Ok(Attempt::Busy { retry_after }) => {
                if Instant::now() >= deadline {
                    return Err(request.busy(started.elapsed(), retry_after));
                }
                if let Some(observer) = observer {
                    observer.notify(&Waiting {
                        name,
                        lease_left: retry_after,
                        waited: started.elapsed(),
                    });
                }
                if queued && turn.is_none() {
                    // Asked without the turn (after waiting in the queue for the re-check
                    // period): queue again.
                    continue;
                }
                let was_subscribed = matches!(listening, Listening::Subscribed(_));
                listening = match listening {
                    Listening::NotYet => {
                        let limit = deadline
                            .saturating_duration_since(Instant::now())
                            .min(core.transport.request_timeout());
                        listen(core.wakeups.subscribe(request.channel()), limit).await
                    }
                    Listening::Pending(subscription) => {
                        listen(Some(subscription), Duration::ZERO).await
                    }
                    other => other,
                };
                if !was_subscribed && matches!(listening, Listening::Subscribed(_)) {
                    // A release may have come before the subscription: look again.
                    continue;
                }
                let lease_end = retry_after + backoff.jitter();
                match listening {
                    Listening::Subscribed(_) => lease_end.min(RECHECK + backoff.jitter()),
                    Listening::NotYet | Listening::Pending(_) | Listening::Polling => {
                        backoff.next().min(lease_end)
                    }
                }
            }
            Err(err) if err.is_transient() && Instant::now() < deadline => {
                tracing::debug!(lock = name, error = %err, "acquire failed, retrying");
                backoff.next()
            }
            Err(err) => return Err(err),
        };
        let pause = pause.min(deadline.saturating_duration_since(Instant::now()));
        match &mut listening {
            Listening::Subscribed(subscription) | Listening::Pending(subscription) => {
                if subscription.wait(pause).await {
                    Counters::add(&core.counters.wakeups, kind_of(request.channel()), 1);
                    tracing::trace!(lock = name, "woken by a release");
                }
            }
            Listening::NotYet | Listening::Polling => tokio::time::sleep(pause).await,
        }
    }
}

/// How a waiter registered on its channel (`None`: wake-ups are off or unsupported) listens
/// once its subscription has had up to `limit` to be made.
async fn listen(subscription: Option<Subscription>, limit: Duration) -> Listening {
    let Some(mut subscription) = subscription else {
        return Listening::Polling;
    };
    match subscription.ready(limit).await {
        Readiness::Ready => Listening::Subscribed(subscription),
        Readiness::Pending => Listening::Pending(subscription),
        Readiness::Failed => Listening::Polling,
    }
}

/// One attempt, counted in the stats.
async fn attempt<R: Request>(core: &Arc<Core>, request: &R) -> Result<Attempt<R::Granted>> {
    let outcome = request.attempt(core).await;
    let counters = &core.counters;
    let kind = kind_of(request.channel());
    Counters::add(&counters.acquire_attempts, kind, 1);
    match &outcome {
        Ok(Attempt::Granted(_)) => Counters::add(&counters.grants, kind, 1),
        Ok(Attempt::Busy { .. }) => Counters::add(&counters.busy, kind, 1),
        Err(err) => {
            Counters::add(&counters.acquire_errors, kind, 1);
            if matches!(err, Error::ReplicasNotConfirmed { .. }) {
                Counters::add(&counters.replicas_not_confirmed, kind, 1);
            }
        }
    }
    outcome
}
