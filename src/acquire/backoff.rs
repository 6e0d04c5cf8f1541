//! Jittered exponential backoff for polling waiters and transient-error retries.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Jittered exponential backoff from 5 ms up to 50 ms.
pub(crate) struct Backoff {
    next: Duration,
    random: RandomState,
    draws: u64,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_millis(50);

    pub(crate) fn new() -> Self {
        Self {
            next: Self::FIRST,
            random: RandomState::new(),
            draws: 0,
        }
    }

    /// A pause drawn uniformly from [d/2, d], then d doubles up to the cap.
    pub(crate) fn next(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        ceiling / 2 + ceiling / 2 * self.fraction() / 1000
    }

    /// 0 to 2 ms, so waiters woken by the same lease end do not all try at once.
    pub(crate) fn jitter(&mut self) -> Duration {
        Duration::from_micros(u64::from(self.fraction()) * 2)
    }

    /// A pseudo-random number in 0..1000.
    fn fraction(&mut self) -> u32 {
        self.draws += 1;
        let mut hasher = self.random.build_hasher();
        hasher.write_u64(self.draws);
        (hasher.finish() % 1000) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_stays_bounded() {
        let mut backoff = Backoff::new();
        let pauses: Vec<_> = (0..20).map(|_| backoff.next()).collect();
        assert!(pauses[0] <= Backoff::FIRST && pauses[0] >= Backoff::FIRST / 2);
        assert!(pauses.iter().all(|p| *p <= Backoff::MAX));
        assert!(pauses[19] >= Backoff::MAX / 2);
    }
}
