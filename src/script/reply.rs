//! Decoding a script's reply: [`Outcome`] (the `1`/`0`/`-1`/`-2` of a hold's release, extend,
//! re-entry and renewal), [`parse_fence`] and [`parse_reply`], each naming the lock and showing
//! a reply of another shape as [`Error::UnexpectedReply`].

use redis::Value;

use crate::error::{Error, Operation, Result};
use crate::fence::FenceToken;

/// What a lock script answered about a hold: the `1`/`0`/`-1` of `release`, `extend`,
/// `reenter` and each triple of `renew`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// `1`: done; the hold is intact.
    Done,
    /// `0`: no live lease.
    Expired,
    /// `-1`: another owner holds the lock.
    NotOwner,
    /// `-2`: a forced unlock freed this owner's hold.
    ForceUnlocked,
}

impl Outcome {
    /// The outcome a script's code stands for; `None` for a code no script answers.
    pub(crate) fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(Outcome::Done),
            0 => Some(Outcome::Expired),
            -1 => Some(Outcome::NotOwner),
            -2 => Some(Outcome::ForceUnlocked),
            _ => None,
        }
    }

    /// `code` decoded, or [`Error::UnexpectedReply`] naming `name` and `operation`.
    pub(crate) fn decode(name: &str, operation: Operation, code: i64) -> Result<Self> {
        Self::from_code(code).ok_or_else(|| Error::UnexpectedReply {
            name: name.to_owned(),
            operation,
            detail: format!("status {code}"),
        })
    }

    /// The error a lost hold of lock `name` reports; `None` for [`Outcome::Done`].
    pub(crate) fn lost(self, name: &str) -> Option<Error> {
        let name = name.to_owned();
        match self {
            Outcome::Done => None,
            Outcome::Expired => Some(Error::Expired { name }),
            Outcome::NotOwner => Some(Error::NotOwner { name }),
            Outcome::ForceUnlocked => Some(Error::ForceUnlocked { name }),
        }
    }
}

/// A fence token from a script's reply, or [`Error::UnexpectedReply`] when `value` is not one
/// (`what` names it in the detail: `fence`, `highest fence`).
pub(crate) fn parse_fence(
    name: &str,
    operation: Operation,
    what: &str,
    value: i64,
) -> Result<FenceToken> {
    u64::try_from(value)
        .ok()
        .and_then(FenceToken::new)
        .ok_or_else(|| Error::UnexpectedReply {
            name: name.to_owned(),
            operation,
            detail: format!("{what} {value} out of range"),
        })
}

/// Decodes a script's reply, naming the lock and showing the reply when it has another shape.
pub(crate) fn parse_reply<T: redis::FromRedisValue>(
    name: &str,
    operation: Operation,
    reply: Value,
) -> Result<T> {
    redis::from_redis_value_ref(&reply).map_err(|_| Error::UnexpectedReply {
        name: name.to_owned(),
        operation,
        detail: format!("{reply:?}"),
    })
}
