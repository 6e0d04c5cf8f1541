//! Fence tokens, the in-process gate that checks them, and how the acquire script computes
//! them ([`FenceMode`]).

use std::fmt;
use std::num::ParseIntError;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// A fencing token: a number that grows with every grant of a lock.
///
/// Storage that accepts writes from lock holders keeps the highest token it has seen and rejects
/// writes that carry a lower one. Tokens are positive and below 2<sup>53</sup>, so they fit an
/// `i64` (a SQL `BIGINT`) and an `f64` exactly.
///
/// # Examples
///
/// ```
/// use fencelock::FenceToken;
///
/// let a = FenceToken::new(7).unwrap();
/// let b: FenceToken = "8".parse().unwrap();
/// assert!(a < b);
/// assert_eq!(i64::from(b), 8);
/// assert_eq!(u64::from(b), 8);
/// assert_eq!(b.to_string(), "8");
/// ```
///
/// With the `serde` feature it serializes as its number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(transparent))]
pub struct FenceToken(u64);

impl FenceToken {
    /// The largest token fencelock hands out: 2<sup>53</sup> − 1.
    pub const MAX: FenceToken = FenceToken((1 << 53) - 1);

    /// A token from its number; `None` for 0 or a number above [`FenceToken::MAX`].
    pub const fn new(value: u64) -> Option<Self> {
        if value == 0 || value > Self::MAX.0 {
            None
        } else {
            Some(Self(value))
        }
    }

    /// The token's number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FenceToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<FenceToken> for u64 {
    fn from(token: FenceToken) -> u64 {
        token.0
    }
}

impl From<FenceToken> for i64 {
    fn from(token: FenceToken) -> i64 {
        // Tokens are below 2^53, far inside i64.
        token.0 as i64
    }
}

/// The number is 0, negative or above [`FenceToken::MAX`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not a fence token: tokens run from 1 to 2^53 - 1")]
pub struct InvalidFence(pub String);

impl TryFrom<u64> for FenceToken {
    type Error = InvalidFence;
    fn try_from(value: u64) -> Result<Self, InvalidFence> {
        Self::new(value).ok_or_else(|| InvalidFence(value.to_string()))
    }
}

impl TryFrom<i64> for FenceToken {
    type Error = InvalidFence;
    fn try_from(value: i64) -> Result<Self, InvalidFence> {
        u64::try_from(value)
            .ok()
            .and_then(Self::new)
            .ok_or_else(|| InvalidFence(value.to_string()))
    }
}

impl FromStr for FenceToken {
    type Err = InvalidFence;
    fn from_str(s: &str) -> Result<Self, InvalidFence> {
        let value: u64 = s
            .trim()
            .parse()
            .map_err(|_: ParseIntError| InvalidFence(s.to_owned()))?;
        Self::try_from(value)
    }
}

/// A write carried a token lower than one the gate already admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fence {presented}: a holder with fence {highest} came later; stop and re-acquire")]
pub struct StaleFence {
    /// The token the rejected writer presented.
    pub presented: FenceToken,
    /// The highest token admitted so far; pass it as the next acquire's floor after a regression.
    pub highest: FenceToken,
}

/// The storage side of fencing for in-process state: admits a token unless a higher one was seen.
///
/// A holder may write many times under its token, so the gate admits tokens equal to the highest
/// seen and rejects only lower ones. Use one gate per protected resource, and admit every write
/// with [`admit_with`](Self::admit_with), which runs the write under the gate: a check followed
/// by a separate write lets a holder that paused between the two write after a newer holder.
/// State kept across restarts keeps the highest token with it and restarts the gate with
/// [`starting_at`](Self::starting_at).
///
/// # Examples
///
/// ```
/// use fencelock::{FenceGate, FenceToken};
///
/// let gate = FenceGate::new();
/// let mut stock = 10;
/// let old = FenceToken::new(3).unwrap();
/// let new = FenceToken::new(4).unwrap();
/// assert!(gate.admit_with(old, || stock -= 1).is_ok());
/// assert!(gate.admit_with(new, || stock -= 1).is_ok());
/// let stale = gate.admit_with(old, || stock -= 1).unwrap_err();
/// assert_eq!((stale.highest, stock), (new, 8));
/// ```
#[derive(Debug, Default)]
pub struct FenceGate {
    highest: AtomicU64,
    /// Held while an [`admit_with`](Self::admit_with) write runs.
    writing: Mutex<()>,
}

impl FenceGate {
    /// A gate that has seen no token yet.
    pub const fn new() -> Self {
        Self {
            highest: AtomicU64::new(0),
            writing: Mutex::new(()),
        }
    }

    /// A gate that has seen `highest` already: for state kept across a restart of its process,
    /// with the highest token admitted kept beside it (a new gate would admit a stale holder's
    /// token).
    ///
    /// ```
    /// use fencelock::{FenceGate, FenceToken};
    ///
    /// let gate = FenceGate::starting_at(FenceToken::new(7).unwrap());
    /// assert!(gate.admit(FenceToken::new(6).unwrap()).is_err());
    /// assert_eq!(gate.highest(), FenceToken::new(7));
    /// ```
    pub const fn starting_at(highest: FenceToken) -> Self {
        Self {
            highest: AtomicU64::new(highest.0),
            writing: Mutex::new(()),
        }
    }

    /// Admits `token` if no higher token was admitted before, records it, and runs `write`,
    /// all under the gate: no write admitted later with a higher token runs before `write`
    /// ends, so a stale holder's write cannot land after a newer holder's. Writes that must
    /// wait on I/O (an `await`) hold the state's own lock around [`admit`](Self::admit) and
    /// the write instead.
    ///
    /// # Errors
    ///
    /// [`StaleFence`] with the highest token seen when `token` is lower; `write` did not run.
    pub fn admit_with<T>(
        &self,
        token: FenceToken,
        write: impl FnOnce() -> T,
    ) -> Result<T, StaleFence> {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        self.admit(token)?;
        Ok(write())
    }

    /// Admits `token` if no higher token was admitted before, and records it: the check alone.
    ///
    /// To make the check and the write atomic, use [`admit_with`](Self::admit_with), or hold
    /// your state's own lock around both; mixed with `admit_with` on one gate, a write admitted
    /// here does not wait for one running there.
    ///
    /// # Errors
    ///
    /// [`StaleFence`] with the highest token seen when `token` is lower.
    pub fn admit(&self, token: FenceToken) -> Result<(), StaleFence> {
        let previous = self.highest.fetch_max(token.0, Ordering::AcqRel);
        if previous > token.0 {
            Err(StaleFence {
                presented: token,
                highest: FenceToken(previous),
            })
        } else {
            Ok(())
        }
    }

    /// The highest token admitted so far, if any.
    pub fn highest(&self) -> Option<FenceToken> {
        FenceToken::new(self.highest.load(Ordering::Acquire))
    }
}

/// How the acquire script computes the next fence token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum FenceMode {
    /// `max(counter + 1, server time in µs + 1, floor + 1)`: a counter lost in a failover
    /// resumes above every token granted before, provided the new master's clock is not behind
    /// the old one's by more than the time the failover took (see `docs/safety.md`; a promoted
    /// replica 1 s behind already broke it). Cheapest of the clock modes: no `CLUSTER INFO`.
    /// The default before [`FenceMode::EpochClock`] became it.
    Clock,
    /// `max(counter + 1, floor + 1)`: small numbers, but a failover that loses the counter
    /// makes tokens go backwards until a floor repairs it.
    Counter,
    /// `max(counter + 1, epoch × 2^32 + 1, floor + 1)`, where `epoch` is the master's
    /// `cluster_my_epoch`: a promoted replica always has a higher config epoch than the master
    /// it replaced, so its tokens start above every earlier one without trusting clocks — as
    /// long as one master grants fewer than 2^32 tokens per lock. The epoch (`CLUSTER INFO`)
    /// is read once per script call: alone, that roughly halves an acquire's server
    /// throughput; a batch of concurrent acquires reads it once (0.97–0.99× clock mode's pairs
    /// per second with 64 tasks, `docs/safety.md`). Keys are kept for good in this mode, and a
    /// master restarted empty restarts the counter (see `docs/safety.md`). On a standalone
    /// server the epoch is 0 and this behaves as [`FenceMode::Counter`].
    Epoch,
    /// `max(counter + 1, server time in µs + epoch × 2^34 + 1, floor + 1)`, where `epoch` is
    /// the master's `cluster_my_epoch`: a promoted replica's tokens start ≈ 4.8 hours of µs
    /// above the old master's, so they stay above every earlier token even when its clock lags
    /// by up to that much (clock mode breaks at a lag longer than the failover took), and the
    /// clock term keeps a master restarted without its data above what it granted before
    /// (epoch mode breaks there). Keys expire as in clock mode. Costs one `CLUSTER INFO` per
    /// script call (a batch of concurrent acquires pays it once). On a standalone server it is
    /// [`FenceMode::Clock`]. Measured under faults in `docs/safety.md`.
    ///
    /// The default: the one mode whose tokens kept rising under every fault measured (a
    /// promoted replica 1 s, 5 s or 60 s behind, a master or standalone server restarted
    /// empty, partitions, kills, pauses, every `CLUSTER FAILOVER` mode, slot migration), at
    /// 0.96–1.06× clock mode's uncontended throughput with 64 tasks.
    #[default]
    EpochClock,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_reject_out_of_range_numbers() {
        assert!(FenceToken::new(0).is_none());
        assert!(FenceToken::new(1 << 53).is_none());
        assert!(FenceToken::try_from(-1_i64).is_err());
        assert!("abc".parse::<FenceToken>().is_err());
        assert_eq!(i64::from(FenceToken::MAX), (1_i64 << 53) - 1);
    }

    #[test]
    fn gate_admits_equal_and_rejects_lower() {
        let gate = FenceGate::new();
        let t = |n| FenceToken::new(n).unwrap();
        assert_eq!(gate.highest(), None);
        gate.admit(t(5)).unwrap();
        gate.admit(t(5)).unwrap();
        assert_eq!(
            gate.admit(t(4)),
            Err(StaleFence {
                presented: t(4),
                highest: t(5)
            })
        );
        assert_eq!(gate.highest(), Some(t(5)));
    }
}
