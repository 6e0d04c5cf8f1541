//! The wait loop's next step, decided from the request's state and the last attempt's outcome
//! with no I/O, so it is tested with plain values (the loop in `acquire.rs` carries it out).

use std::time::Duration;

use tokio::time::Instant;

use super::Backoff;

/// The longest a subscribed waiter sleeps without a message before it looks again.
///
/// A release's announcement can miss a subscribed waiter: while a slot migrates, the release
/// script runs on the importing node (`ASK`) and publishes there, but the waiter's sharded
/// subscription stays on the old master until `SETSLOT NODE` (measured: a waiter behind a 5 s
/// lease slept 5 s). Looking again this often bounds what any lost message costs, at one
/// attempt per waiter per period, a fifth of what the slowest polling makes.
pub(crate) const RECHECK: Duration = Duration::from_millis(250);

/// What an attempt came to, as the decision sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Granted.
    Granted,
    /// Held by others; the holder's lease ends in `retry_after`.
    Busy { retry_after: Duration },
    /// An error worth retrying (Redis briefly unavailable).
    Transient,
    /// Any other error.
    Fatal,
}

/// How the waiter hears of releases, as the decision sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Not subscribed yet: the first busy answer subscribes.
    NotYet,
    /// Subscribed to the request's channel.
    Subscribed,
    /// Registered, the subscription not confirmed yet: polling meanwhile.
    Pending,
    /// No subscription: polling.
    Polling,
}

/// Where the request stands when its next step is decided.
#[derive(Clone, Copy, Debug)]
pub(crate) struct State {
    /// Now.
    pub(crate) now: Instant,
    /// When the call stops attempting.
    pub(crate) deadline: Instant,
    /// The longest one request to Redis may take.
    pub(crate) request_timeout: Duration,
    /// How the waiter hears of releases.
    pub(crate) heard: Heard,
    /// How it heard before this outcome's listening step (equal to `heard` until it listened).
    pub(crate) heard_before: Heard,
    /// Whether it already listened after this outcome.
    pub(crate) listened: bool,
}

/// The loop's next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// Hand out the grant.
    Grant,
    /// Give up: the resource stayed busy until the deadline (or the timeout was zero).
    GiveUp,
    /// Return the attempt's error.
    Fail,
    /// Attempt again now (back through the local queue, if any).
    Again,
    /// Wait up to `limit` for the subscription to be made, then decide again.
    Listen { limit: Duration },
    /// Wait for a wake-up for at most this long, then attempt again.
    Pause(Duration),
}

/// The next step after an attempt that came to `outcome`; `backoff` is drawn from for polling
/// pauses and jitter.
pub(crate) fn next(state: &State, outcome: Outcome, backoff: &mut Backoff) -> Step {
    let left = state.deadline.saturating_duration_since(state.now);
    let retry_after = match outcome {
        Outcome::Granted => return Step::Grant,
        Outcome::Fatal => return Step::Fail,
        Outcome::Transient if left.is_zero() => return Step::Fail,
        Outcome::Transient => return Step::Pause(backoff.next().min(left)),
        Outcome::Busy { .. } if left.is_zero() => return Step::GiveUp,
        Outcome::Busy { retry_after } => retry_after,
    };
    if !state.listened {
        match state.heard {
            Heard::NotYet => {
                return Step::Listen {
                    limit: left.min(state.request_timeout),
                }
            }
            Heard::Pending => {
                return Step::Listen {
                    limit: Duration::ZERO,
                }
            }
            Heard::Subscribed | Heard::Polling => {}
        }
    }
    if state.heard == Heard::Subscribed && state.heard_before != Heard::Subscribed {
        // A release may have come before the subscription: look again.
        return Step::Again;
    }
    let lease_end = retry_after + backoff.jitter();
    let pause = match state.heard {
        Heard::Subscribed => lease_end.min(RECHECK + backoff.jitter()),
        Heard::NotYet | Heard::Pending | Heard::Polling => backoff.next().min(lease_end),
    };
    Step::Pause(pause.min(left))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// A request decided at a fixed now, `left` before its deadline, heard `heard` (and
    /// already listened).
    fn state(left: Duration, heard: Heard) -> State {
        let now = Instant::now();
        State {
            now,
            deadline: now + left,
            request_timeout: 1000 * MS,
            heard,
            heard_before: heard,
            listened: true,
        }
    }

    fn busy(retry_after: Duration) -> Outcome {
        Outcome::Busy { retry_after }
    }

    fn pause(step: Step) -> Duration {
        match step {
            Step::Pause(pause) => pause,
            other => panic!("expected a pause, got {other:?}"),
        }
    }

    #[test]
    fn a_grant_is_handed_out_even_past_the_deadline() {
        let mut backoff = Backoff::new();
        for left in [Duration::ZERO, 100 * MS] {
            let step = next(
                &state(left, Heard::Subscribed),
                Outcome::Granted,
                &mut backoff,
            );
            assert_eq!(step, Step::Grant);
        }
    }

    #[test]
    fn busy_at_or_past_the_deadline_gives_up() {
        let mut backoff = Backoff::new();
        let mut at = state(Duration::ZERO, Heard::NotYet);
        assert_eq!(next(&at, busy(5 * MS), &mut backoff), Step::GiveUp);
        at.now += 10 * MS;
        assert_eq!(next(&at, busy(5 * MS), &mut backoff), Step::GiveUp);
    }

    #[test]
    fn zero_timeout_makes_one_attempt() {
        // A zero timeout puts the deadline at the start: the first busy answer ends the call,
        // before any listening or pause.
        let mut backoff = Backoff::new();
        let mut first = state(Duration::ZERO, Heard::NotYet);
        first.listened = false;
        assert_eq!(next(&first, busy(30_000 * MS), &mut backoff), Step::GiveUp);
        assert_eq!(next(&first, Outcome::Transient, &mut backoff), Step::Fail);
    }

    #[test]
    fn errors_fail_unless_transient_and_time_is_left() {
        let mut backoff = Backoff::new();
        let open = state(100 * MS, Heard::Polling);
        assert_eq!(next(&open, Outcome::Fatal, &mut backoff), Step::Fail);
        let retry = pause(next(&open, Outcome::Transient, &mut backoff));
        assert!(retry <= 5 * MS && retry >= 5 * MS / 2, "{retry:?}");
        let closing = state(MS, Heard::Polling);
        for _ in 0..10 {
            assert!(pause(next(&closing, Outcome::Transient, &mut backoff)) <= MS);
        }
    }

    #[test]
    fn the_first_busy_answer_subscribes_within_the_deadline_and_request_timeout() {
        let mut backoff = Backoff::new();
        let mut first = state(300 * MS, Heard::NotYet);
        first.listened = false;
        assert_eq!(
            next(&first, busy(5 * MS), &mut backoff),
            Step::Listen { limit: 300 * MS }
        );
        first.deadline = first.now + 60_000 * MS;
        assert_eq!(
            next(&first, busy(5 * MS), &mut backoff),
            Step::Listen { limit: 1000 * MS }
        );
        let mut pending = state(300 * MS, Heard::Pending);
        pending.listened = false;
        assert_eq!(
            next(&pending, busy(5 * MS), &mut backoff),
            Step::Listen {
                limit: Duration::ZERO
            }
        );
    }

    #[test]
    fn a_fresh_subscription_looks_again_at_once() {
        let mut backoff = Backoff::new();
        let mut fresh = state(300 * MS, Heard::Subscribed);
        fresh.heard_before = Heard::NotYet;
        assert_eq!(next(&fresh, busy(200 * MS), &mut backoff), Step::Again);
        fresh.heard_before = Heard::Pending;
        assert_eq!(next(&fresh, busy(200 * MS), &mut backoff), Step::Again);
    }

    #[test]
    fn subscribed_waits_for_the_lease_end_or_the_recheck() {
        let mut backoff = Backoff::new();
        let subscribed = state(60_000 * MS, Heard::Subscribed);
        // Retry-after shorter than the re-check: woken at the lease end (plus up to 2 ms).
        let short = pause(next(&subscribed, busy(40 * MS), &mut backoff));
        assert!(short >= 40 * MS && short <= 42 * MS, "{short:?}");
        // Longer: looks again after the re-check period.
        let long = pause(next(&subscribed, busy(10_000 * MS), &mut backoff));
        assert!(long >= RECHECK && long <= RECHECK + 2 * MS, "{long:?}");
    }

    #[test]
    fn retry_after_past_the_deadline_is_cut_at_the_deadline() {
        let mut backoff = Backoff::new();
        for heard in [Heard::Subscribed, Heard::Polling] {
            let step = next(&state(30 * MS, heard), busy(10_000 * MS), &mut backoff);
            assert!(pause(step) <= 30 * MS, "{heard:?}: {step:?}");
        }
        let subscribed = state(30 * MS, Heard::Subscribed);
        assert_eq!(
            next(&subscribed, busy(10_000 * MS), &mut backoff),
            Step::Pause(30 * MS)
        );
    }

    #[test]
    fn polling_backs_off_within_bounds_and_not_past_the_lease() {
        let mut backoff = Backoff::new();
        let polling = state(60_000 * MS, Heard::Polling);
        let pauses: Vec<_> = (0..12)
            .map(|_| pause(next(&polling, busy(10_000 * MS), &mut backoff)))
            .collect();
        assert!(pauses[0] >= 5 * MS / 2 && pauses[0] <= 5 * MS, "{pauses:?}");
        assert!(pauses.iter().all(|p| *p <= 50 * MS), "{pauses:?}");
        assert!(pauses[11] >= 25 * MS, "{pauses:?}");
        // A lease ending sooner than the backoff: polled at its end.
        let soon = pause(next(&polling, busy(MS), &mut backoff));
        assert!(soon <= 3 * MS, "{soon:?}");
    }
}
