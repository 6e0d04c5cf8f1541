//! The one grant path: a granting script's reply decoded once ([`GrantReply`]) and the work
//! every primitive's attempt shares once the script has answered ([`Granting`]): the undo of a
//! cut call, the clock-behind warning, the fence, the replicas' confirmation and the [`Grant`].
//!
//! Every granting script (the mutex's `acquire`, `fair_acquire`, `rw_read`, `rw_write`,
//! `semaphore_acquire`) answers in one layout: `{1, fence, clock lag in µs, ...}` granted now,
//! `{2, fence, 0, ...}` granted before to the same owner (a resent script), `{0, retry after
//! ms, ...}` busy, and any other status is the primitive's own (the semaphore's `{-1, stored
//! limit}`). A primitive's attempt builds its call, sends it through [`Granting::send`] and
//! handles only what is its own.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::acquire::replicas::{self, Acks};
use crate::acquire::{Attempt, InFlight};
use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::held::{Grant, Scripts};
use crate::keys::LockKeys;
use crate::options::LockOptions;
use crate::script::{parse_fence, parse_reply, ScriptCall};

/// A granting script's reply in the shared layout (see the module docs).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum GrantReply {
    /// Granted (or, `resent`, granted before to the same owner): the fence's raw value and how
    /// far the node's clock was behind the last fence, in µs (0 when it was not).
    Granted {
        resent: bool,
        fence: i64,
        behind: i64,
        rest: Vec<i64>,
    },
    /// Held by others: try again after `retry_after`.
    Busy {
        retry_after: Duration,
        rest: Vec<i64>,
    },
    /// A status the primitive gives its own meaning.
    Own { status: i64, rest: Vec<i64> },
}

impl GrantReply {
    /// Decodes `reply`, naming lock `name` and `operation` when it has another shape.
    ///
    /// # Errors
    ///
    /// [`Error::UnexpectedReply`] for anything but an array of integers in the shared layout
    /// or, for a plain grant (`{1, fence, 0}`) of [`Operation::Acquire`] or
    /// [`Operation::FairAcquire`], the fence alone as an integer (the mutex's and the fair
    /// lock's acquire answer so: an integer costs the server less to send than an array).
    pub(crate) fn decode(name: &str, operation: Operation, reply: redis::Value) -> Result<Self> {
        if let (redis::Value::Int(fence), Operation::Acquire | Operation::FairAcquire) =
            (&reply, operation)
        {
            let fence = *fence;
            return Ok(Self::Granted {
                resent: false,
                fence,
                behind: 0,
                rest: Vec::new(),
            });
        }
        let values = parse_reply::<Vec<i64>>(name, operation, reply)?;
        let unexpected = |values: &[i64]| Error::UnexpectedReply {
            name: name.to_owned(),
            operation,
            detail: format!("{values:?}"),
        };
        match values.as_slice() {
            [status @ (1 | 2), fence, behind, rest @ ..] => Ok(Self::Granted {
                resent: *status == 2,
                fence: *fence,
                behind: *behind,
                rest: rest.to_vec(),
            }),
            [0, retry_after, rest @ ..] => Ok(Self::Busy {
                retry_after: Duration::from_millis(u64::try_from(*retry_after).unwrap_or(0)),
                rest: rest.to_vec(),
            }),
            [0..=2, ..] | [] => Err(unexpected(&values)),
            [status, rest @ ..] => Ok(Self::Own {
                status: *status,
                rest: rest.to_vec(),
            }),
        }
    }
}

/// The fence of a grant (from a script's reply or a grant announced on the server), counting a
/// node clock found `behind` the stored fence (µs, 0 when it was not; see
/// [`Core::clock_behind`]).
///
/// # Errors
///
/// [`Error::UnexpectedReply`] when `fence` is no valid token.
pub(crate) fn granted_fence(
    core: &Core,
    kind: &'static str,
    name: &str,
    operation: Operation,
    fence: i64,
    behind: i64,
) -> Result<crate::FenceToken> {
    if behind > 0 {
        core.clock_behind(kind, name, behind);
    }
    parse_fence(name, operation, "fence", fence)
}

/// One attempt of a granting request under `owner`, from sending its call to the [`Grant`]:
/// while armed, a drop (the call cut by a timeout or a cancel before its reply was read)
/// releases what the request may have been granted, in the background.
pub(crate) struct Granting<'a> {
    core: &'a Arc<Core>,
    scripts: &'static Scripts,
    keys: &'a LockKeys,
    operation: Operation,
    owner: &'a str,
    started: Instant,
    lease: Duration,
    wait: Option<(u32, Duration)>,
    /// The weight of the release call that undoes a grant ([`ScriptCall::weighted`]).
    undo_weight: u32,
    in_flight: Option<InFlight<'a>>,
}

impl<'a> Granting<'a> {
    /// An attempt of `owner` on `keys` with `options`, whose holds `scripts` release; its undo
    /// is armed (see [`without_undo`](Self::without_undo)).
    pub(crate) fn new(
        core: &'a Arc<Core>,
        scripts: &'static Scripts,
        keys: &'a LockKeys,
        operation: Operation,
        owner: &'a str,
        options: &LockOptions,
    ) -> Self {
        Self {
            core,
            scripts,
            keys,
            operation,
            owner,
            started: Instant::now(),
            lease: options.first_lease(),
            wait: options.wait,
            undo_weight: 1,
            in_flight: Some(InFlight::release(core, scripts, keys.lock_key(), owner, "")),
        }
    }

    /// Weighs the undo's release call (a release that reads many entries).
    pub(crate) fn undo_weighted(mut self, weight: u32) -> Self {
        self.undo_weight = weight;
        if let Some(in_flight) = self.in_flight.take() {
            self.in_flight = Some(in_flight.weighted(weight));
        }
        self
    }

    /// No undo when cut: the primitive gives back what the owner may hold itself (the fair
    /// lock's withdrawal of its place, which also returns a grant whose reply was not read).
    pub(crate) fn without_undo(mut self) -> Self {
        if let Some(in_flight) = self.in_flight.take() {
            in_flight.disarm();
        }
        self
    }

    /// The lease asked for.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// When the call was sent (the lease is measured from here).
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// Sends `call` (with `WAIT` after it when the options ask for replicas) and decodes the
    /// reply. The undo stays armed until [`finish`](Self::finish), [`busy`](Self::busy) or
    /// [`disarm`](Self::disarm).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe through the undo.
    pub(crate) async fn send(&self, call: &ScriptCall) -> Result<(GrantReply, Option<Acks>)> {
        let name = self.keys.name();
        let (reply, acks) =
            replicas::run_granting(self.core, call, name, self.operation, self.wait).await?;
        Ok((GrantReply::decode(name, self.operation, reply)?, acks))
    }

    /// The reply needs no undo (a refusal that wrote nothing).
    pub(crate) fn disarm(mut self) {
        if let Some(in_flight) = self.in_flight.take() {
            in_flight.disarm();
        }
    }

    /// A busy answer: nothing to undo.
    pub(crate) fn busy<G>(self, retry_after: Duration) -> Attempt<G> {
        self.disarm();
        Attempt::Busy { retry_after }
    }

    /// The shared work after a grant of `fence` (raw, from the reply) with the clock `behind`
    /// by that many µs: the warning when it was, the fence checked, the undo disarmed, the
    /// replicas' acknowledgements confirmed (short of them, `undo` — by default the release of
    /// the grant — runs and the call fails) and the [`Grant`] of hold `hold` weighing `weight`.
    ///
    /// # Errors
    ///
    /// [`Error::UnexpectedReply`] for a fence out of range (the grant is undone);
    /// [`Error::ReplicasNotConfirmed`] when too few replicas acknowledged.
    pub(crate) async fn finish(
        mut self,
        fence: i64,
        behind: i64,
        acks: Option<Acks>,
        hold: String,
        weight: u32,
        undo: Option<ScriptCall>,
    ) -> Result<Grant> {
        let name = self.keys.name();
        let kind = self.scripts.kind.as_str();
        let fence = granted_fence(self.core, kind, name, self.operation, fence, behind)?;
        if let Some(in_flight) = self.in_flight.take() {
            in_flight.disarm();
        }
        let undo = || {
            undo.unwrap_or_else(|| {
                self.scripts
                    .release_call(self.core, self.keys.lock_key(), self.owner, &hold)
                    .weighted(self.undo_weight)
            })
        };
        let replicas_acked = replicas::confirm(self.core, kind, name, acks, undo).await?;
        tracing::debug!(lock = name, kind, %fence, operation = self.operation.as_str(), "acquired");
        Ok(Grant {
            keys: self.keys.clone(),
            owner: self.owner.to_owned(),
            hold,
            fence,
            sent: self.started,
            ttl: self.lease,
            replicas_acked,
            weight,
        })
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;

    fn reply(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|v| Value::Int(*v)).collect())
    }

    fn decode(values: &[i64]) -> Result<GrantReply> {
        GrantReply::decode("orders", Operation::Acquire, reply(values))
    }

    #[test]
    fn grants_resends_and_refusals_share_one_layout() {
        assert_eq!(
            decode(&[1, 42, 0]).unwrap(),
            GrantReply::Granted {
                resent: false,
                fence: 42,
                behind: 0,
                rest: vec![],
            }
        );
        assert_eq!(
            GrantReply::decode("orders", Operation::Acquire, Value::Int(42)).unwrap(),
            decode(&[1, 42, 0]).unwrap(),
            "a plain grant may answer its fence alone"
        );
        assert_eq!(
            decode(&[2, 42, 0, 7, 8]).unwrap(),
            GrantReply::Granted {
                resent: true,
                fence: 42,
                behind: 0,
                rest: vec![7, 8],
            }
        );
        assert_eq!(
            decode(&[0, 250, 3]).unwrap(),
            GrantReply::Busy {
                retry_after: Duration::from_millis(250),
                rest: vec![3],
            }
        );
        assert_eq!(
            decode(&[0, -5]).unwrap(),
            GrantReply::Busy {
                retry_after: Duration::ZERO,
                rest: vec![],
            }
        );
        assert_eq!(
            decode(&[-1, 8]).unwrap(),
            GrantReply::Own {
                status: -1,
                rest: vec![8],
            }
        );
    }

    #[test]
    fn short_or_foreign_replies_name_the_lock_and_the_reply() {
        for bad in [&[1, 42][..], &[0], &[]] {
            let err = decode(bad).unwrap_err();
            assert!(
                matches!(&err, Error::UnexpectedReply { name, operation: Operation::Acquire, .. } if name == "orders"),
                "{err:?}"
            );
        }
        let err = GrantReply::decode("orders", Operation::Acquire, Value::Okay).unwrap_err();
        assert!(err.to_string().contains("orders"), "{err}");
    }
}
