//! A hold's lease as this client sees it: until when it is surely valid, and why it ended.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::options::instant_after;

/// When a lease taken at `sent` for `ttl` is surely still ours: the TTL less 1% and 2 ms for
/// clock drift between this host and Redis.
pub(crate) fn lease_end(sent: Instant, ttl: Duration) -> Instant {
    let margin = ttl / 100 + Duration::from_millis(2);
    instant_after(sent, ttl.saturating_sub(margin))
}

/// What the watchdog knows about one hold, shared with its guard.
#[derive(Debug, Clone)]
pub(crate) struct Lease {
    /// Until when the hold is surely valid (the last confirmed renewal's lease, less margin).
    pub(crate) valid_until: tokio::time::Instant,
    /// Set when the hold ended: Redis said so, or renewal stopped.
    pub(crate) ended: Option<Ended>,
}

/// A hold's [`Lease`], shared by the watchdog and the guard: a few dozen bytes, where a
/// `tokio::sync::watch` channel would take several hundred per held lock. Guards waiting in
/// `lost()` are woken through [`Watchdog::ended`](super::watchdog::Watchdog::ended) when a hold ends, and otherwise look again
/// when the lease they saw runs out.
#[derive(Debug, Clone)]
pub(crate) struct SharedLease(Arc<Mutex<Lease>>);

impl SharedLease {
    pub(crate) fn new(lease: Lease) -> Self {
        Self(Arc::new(Mutex::new(lease)))
    }

    pub(crate) fn get(&self) -> Lease {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn update(&self, change: impl FnOnce(&mut Lease)) {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }
}

/// Why the watchdog stopped renewing a hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// Redis found no live lease.
    Expired,
    /// Redis found another owner.
    NotOwner,
    /// A forced unlock freed the hold.
    ForceUnlocked,
    /// Redis did not confirm a renewal before the lease ran out.
    Unconfirmed,
    /// The maximum hold time was reached; the lease ends at `valid_until`.
    MaxHold,
    /// Redis refused a renewal with an error that retrying does not cure (the reason).
    Failed(Arc<str>),
}

impl Ended {
    pub(crate) fn into_error(self, name: &str, max_hold: Option<Duration>) -> Error {
        let name = name.to_owned();
        match self {
            Ended::Expired => Error::Expired { name },
            Ended::NotOwner => Error::NotOwner { name },
            Ended::ForceUnlocked => Error::ForceUnlocked { name },
            Ended::Unconfirmed => Error::LeaseUnconfirmed { name },
            Ended::MaxHold => Error::MaxHoldReached {
                name,
                max_hold: max_hold.unwrap_or_default(),
            },
            Ended::Failed(reason) => Error::RenewalFailed {
                name,
                reason: reason.to_string(),
            },
        }
    }
}
