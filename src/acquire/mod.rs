//! Acquiring, for every primitive: the one wait loop over a [`Request`] (deadline, wake-ups on
//! the request's channel, backoff, retries of transient errors, the `Busy` error and the stats
//! common to all primitives), the in-flight undo, and grants confirmed by replicas.

mod backoff;
mod grant;
mod place;
pub(crate) mod replicas;
mod step;
#[cfg(test)]
mod tests;
mod undo;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::local_queue::Turn;
use crate::options::{instant_after, WaitObserver, Waiting};
use crate::runtime::wakeups::{Readiness, Subscription};
use crate::stats::{kind_of, Counters};

pub(crate) use backoff::Backoff;
pub(crate) use grant::{GrantReply, Granting};
pub(crate) use place::Place;
use step::RECHECK;
use step::{Heard, Outcome, Step};
pub(crate) use undo::InFlight;

/// One kind of acquisition: a primitive says how to make one attempt; the loop does the rest.
pub(crate) trait Request {
    /// What a granted attempt hands out (a guard).
    type Granted;

    /// The name errors and logs carry.
    fn name(&self) -> &str;

    /// The channel the releasing script publishes on when the resource frees up.
    fn channel(&self) -> &str;

    /// Whether a grant a release made to this request on the server has been announced to
    /// this client and not taken yet (the next attempt takes it without a call). Requests
    /// without a place in a queue have none.
    fn handed_pending(&self, _core: &Arc<Core>) -> bool {
        false
    }

    /// The `kind` label of this request's metrics; the default reads it from the channel's
    /// last part (the primitive's key, see [`kind_of`]).
    fn kind(&self) -> &'static str {
        kind_of(self.channel())
    }

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
    fn attempt(
        &self,
        core: &Arc<Core>,
    ) -> impl std::future::Future<Output = Result<Attempt<Self::Granted>>> + Send;

    /// Waits behind a task of this client that holds the resource, if one does, until handed
    /// the resource, told to ask Redis, or `until`; without asking Redis. The default: no
    /// local queue (the mutex has one: `local_queue.rs`, `lock/handoff.rs`).
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: a dropped wait holds nothing.
    async fn wait_local(
        &self,
        _core: &Arc<Core>,
        _until: std::time::Instant,
    ) -> Local<Self::Granted> {
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

/// Runs `undo` — what gives back the state a failed wait left in Redis (a queue place, a
/// writer's intent) — within the bound of a call that waited until `deadline`: one request
/// timeout past it (measured: over a lossy 50 ms link an awaited withdrawal after a timed-out
/// wait ended 4.0 s into a 3.5 s bound). An undo cut at the bound is left to the drop of what
/// it undoes, which sends it in the background.
///
/// # Cancel safety
///
/// As the undo's own drop: a dropped call leaves the undo to it.
pub(crate) async fn undo_within_bound(
    core: &Core,
    deadline: std::time::Instant,
    undo: impl std::future::Future<Output = ()>,
) {
    let bound = instant_after(deadline, core.transport.request_timeout());
    let _ = tokio::time::timeout_at(bound.into(), undo).await;
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
                .record(request.kind(), started.elapsed());
            Ok(granted)
        }
        Attempt::Busy { retry_after } => Err(request.busy(Duration::ZERO, retry_after)),
    }
}

/// How a waiter learns that the resource may have freed up.
enum Listening<L> {
    /// Not subscribed yet: the first busy answer subscribes.
    NotYet,
    /// Subscribed to the request's channel: woken by releases, else at the lease end or after
    /// [`RECHECK`], whichever comes first.
    Subscribed(L),
    /// Registered, but the subscription was not confirmed in time (measured: over a 50 ms ± 20
    /// ms link with 5% loss the subscriber connection took 1.5 s to open, longer than the
    /// 1 s request timeout the waiter gave it): polling with backoff, woken by a release once
    /// the subscription is made, which each attempt looks for.
    Pending(L),
    /// No subscription (wake-ups off or unsupported): polling with backoff.
    Polling,
}

impl<L> Listening<L> {
    fn heard(&self) -> Heard {
        match self {
            Self::NotYet => Heard::NotYet,
            Self::Subscribed(_) => Heard::Subscribed,
            Self::Pending(_) => Heard::Pending,
            Self::Polling => Heard::Polling,
        }
    }
}

/// A waiter's registration on the request's channel, as the loop uses it.
pub(crate) trait Listen {
    /// Waits until the subscription is in place, for at most `limit` (`Duration::ZERO`: only
    /// looks).
    async fn ready(&mut self, limit: Duration) -> Readiness;

    /// Sleeps for `pause` or until woken by a release, whichever comes first; true when woken.
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe.
    async fn wait(&mut self, pause: Duration) -> bool;

    /// Whether the registration has heard its channel without a break since `before` (it was
    /// kept from an earlier wait): then nothing published after an attempt sent at `before`
    /// can have been missed, and the wait loop need not look again after subscribing.
    fn heard_since(&self, _before: Instant) -> bool {
        false
    }
}

impl Listen for Subscription {
    fn heard_since(&self, before: Instant) -> bool {
        Subscription::heard_since(self, before.into_std())
    }

    async fn ready(&mut self, limit: Duration) -> Readiness {
        Subscription::ready(self, limit).await
    }

    async fn wait(&mut self, pause: Duration) -> bool {
        Subscription::wait(self, pause).await
    }
}

/// What the wait loop drives: a [`Request`] on a client's [`Core`] ([`OnCore`]), or in the
/// unit tests a fake one.
pub(crate) trait Waiter {
    /// What a granted attempt hands out.
    type Granted;
    /// The registration on the request's channel.
    type Listener: Listen;

    /// As [`Request::name`].
    fn name(&self) -> &str;

    /// As [`Request::busy`].
    fn busy(&self, waited: Duration, retry_after: Duration) -> Error;

    /// The longest one request to Redis may take.
    fn request_timeout(&self) -> Duration;

    /// As [`Request::wait_local`].
    async fn wait_local(&self, until: Instant) -> Local<Self::Granted>;

    /// One attempt, counted in the stats.
    ///
    /// # Cancel safety
    ///
    /// As [`Request::attempt`].
    async fn attempt(&self) -> Result<Attempt<Self::Granted>>;

    /// Registers on the request's channel; `None`: wake-ups are off or unsupported.
    fn subscribe(&self) -> Option<Self::Listener>;

    /// A grant after waiting `waited`, for the stats.
    fn granted_after(&self, waited: Duration);

    /// Woken by a release, for the stats.
    fn woken(&self);

    /// See [`Request::handed_pending`].
    fn handed_pending(&self) -> bool {
        false
    }
}

/// A [`Request`] on a client's [`Core`].
struct OnCore<'a, R> {
    core: &'a Arc<Core>,
    request: &'a R,
}

impl<R: Request> Waiter for OnCore<'_, R> {
    type Granted = R::Granted;
    type Listener = Subscription;

    fn name(&self) -> &str {
        self.request.name()
    }

    fn busy(&self, waited: Duration, retry_after: Duration) -> Error {
        self.request.busy(waited, retry_after)
    }

    fn request_timeout(&self) -> Duration {
        self.core.transport.request_timeout()
    }

    async fn wait_local(&self, until: Instant) -> Local<R::Granted> {
        self.request.wait_local(self.core, until.into_std()).await
    }

    async fn attempt(&self) -> Result<Attempt<R::Granted>> {
        attempt(self.core, self.request).await
    }

    fn subscribe(&self) -> Option<Subscription> {
        self.core.wakeups.subscribe(self.request.channel())
    }

    fn granted_after(&self, waited: Duration) {
        self.core.counters.waits.record(self.request.kind(), waited);
    }

    fn handed_pending(&self) -> bool {
        self.request.handed_pending(self.core)
    }

    fn woken(&self) {
        Counters::add(&self.core.counters.wakeups, self.request.kind(), 1);
    }
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
    drive(&OnCore { core, request }, timeout, observer).await
}

/// The wait loop over `waiter`, held to `timeout` plus one request timeout.
///
/// # Cancel safety
///
/// As [`wait`], given a cancel-safe [`Waiter`].
pub(crate) async fn drive<W: Waiter>(
    waiter: &W,
    timeout: Duration,
    observer: Option<&WaitObserver>,
) -> Result<W::Granted> {
    // The loop stops attempting at the timeout, but an attempt begun just before may take its
    // own request timeout, and a primitive's attempt may make more than one call (measured: a
    // fair-lock acquire over a lossy 50 ms link ended 0.5 s past both). The whole call is held
    // to the timeout plus one request timeout; a cut attempt is undone in the background.
    let limit = timeout.saturating_add(waiter.request_timeout());
    match tokio::time::timeout(limit, drive_unbounded(waiter, timeout, observer)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(Error::Timeout {
            name: waiter.name().to_owned(),
            operation: Operation::Acquire,
            after: limit,
        }),
    }
}

/// [`drive`] without its outer bound: carries out the steps [`step::next`] decides.
async fn drive_unbounded<W: Waiter>(
    waiter: &W,
    timeout: Duration,
    observer: Option<&WaitObserver>,
) -> Result<W::Granted> {
    let name = waiter.name();
    let started = Instant::now();
    let deadline = Instant::from_std(instant_after(started.into_std(), timeout));
    let mut backoff = Backoff::new();
    let mut listening = Listening::NotYet;
    // The client's turn to ask for the resource. `alone` once the request has no local queue
    // or asked Redis without the turn (after a re-check period behind a task of this client):
    // from then on it waits on Redis as a waiter of another client would, listening for a
    // grant to its place there, and never queues in the client again (a place granted on the
    // server while its task sat in the local queue went unheard until the next re-check).
    let mut turn = None;
    let mut alone = false;
    loop {
        if turn.is_none() && !alone {
            // Behind a task of this client: wait for its release to hand over or for the turn
            // to ask, at most until the re-check period (a holder that never releases must not
            // keep the waiter from Redis).
            let until = deadline.min(Instant::now() + RECHECK);
            match waiter.wait_local(until).await {
                Local::Granted(granted) => {
                    waiter.granted_after(started.elapsed());
                    return Ok(granted);
                }
                Local::Ask(next) => {
                    alone = next.is_none();
                    turn = next;
                }
                Local::NotHeld => alone = true,
            }
        }
        let sent = Instant::now();
        let reply = waiter.attempt().await;
        let outcome = match &reply {
            Ok(Attempt::Granted(_)) => Outcome::Granted,
            Ok(Attempt::Busy { retry_after }) => Outcome::Busy {
                retry_after: *retry_after,
            },
            Err(err) if err.is_transient() => Outcome::Transient,
            Err(_) => Outcome::Fatal,
        };
        let mut state = step::State {
            now: Instant::now(),
            deadline,
            request_timeout: waiter.request_timeout(),
            heard: listening.heard(),
            heard_before: listening.heard(),
            listened: false,
        };
        let mut step = step::next(&state, outcome, &mut backoff);
        if let (Outcome::Busy { retry_after }, Some(observer)) = (outcome, observer) {
            if step != Step::GiveUp {
                observer.notify(&Waiting {
                    name,
                    lease_left: retry_after,
                    waited: started.elapsed(),
                });
            }
        }
        if let Step::Listen { limit } = step {
            listening = match listening {
                Listening::NotYet => listen(waiter.subscribe(), limit).await,
                Listening::Pending(subscription) => listen(Some(subscription), limit).await,
                other => other,
            };
            state.now = Instant::now();
            state.heard = listening.heard();
            if let Listening::Subscribed(subscription) = &listening {
                if subscription.heard_since(sent) {
                    state.heard_before = Heard::Subscribed;
                }
            }
            state.listened = true;
            step = step::next(&state, outcome, &mut backoff);
        }
        let pause = match (step, reply) {
            (Step::Grant, Ok(Attempt::Granted(granted))) => {
                if let Some(turn) = turn.take() {
                    turn.granted();
                }
                waiter.granted_after(started.elapsed());
                return Ok(granted);
            }
            (Step::GiveUp, Ok(Attempt::Busy { retry_after })) => {
                return Err(waiter.busy(started.elapsed(), retry_after));
            }
            (Step::Fail, Err(err)) => return Err(err),
            (Step::Again, _) => continue,
            (Step::Pause(pause), Err(err)) => {
                tracing::debug!(lock = name, error = %err, "acquire failed, retrying");
                pause
            }
            (Step::Pause(pause), _) => pause,
            (step, _) => unreachable!("step {step:?} after {outcome:?}"),
        };
        if waiter.handed_pending() {
            // A grant made on the server reached this client before the wait began.
            waiter.woken();
            continue;
        }
        match &mut listening {
            Listening::Subscribed(subscription) | Listening::Pending(subscription) => {
                if subscription.wait(pause).await {
                    waiter.woken();
                    tracing::trace!(lock = name, "woken by a release");
                }
            }
            Listening::NotYet | Listening::Polling => tokio::time::sleep(pause).await,
        }
    }
}

/// How a waiter registered on its channel (`None`: wake-ups are off or unsupported) listens
/// once its subscription has had up to `limit` to be made.
async fn listen<L: Listen>(subscription: Option<L>, limit: Duration) -> Listening<L> {
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
    // Boxed: every public future that waits for a grant nests this one, and without the box
    // the nesting overflows rustc's query depth limit in a caller's crate (a binary awaiting
    // several kinds of lock in one `async fn main`).
    let attempt: Pin<Box<dyn Future<Output = _> + Send + '_>> = Box::pin(request.attempt(core));
    let outcome = attempt.await;
    let counters = &core.counters;
    let kind = request.kind();
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
