//! Jittered exponential backoff for polling waiters and transient-error retries.

use std::time::Duration;

/// Jittered exponential backoff from 5 ms up to 50 ms. The jitter comes from `rand`'s
/// thread-local generator.
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_millis(50);
    /// The widest jitter [`Backoff::jitter`] adds.
    const JITTER: Duration = Duration::from_millis(2);

    pub(crate) fn new() -> Self {
        Self { next: Self::FIRST }
    }

    /// A pause drawn uniformly from [d/2, d], then d doubles up to the cap.
    pub(crate) fn next(&mut self) -> Duration {
        let ceiling = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        rand::random_range(ceiling / 2..=ceiling)
    }

    /// 0 to 2 ms, so waiters woken by the same lease end do not all try at once.
    pub(crate) fn jitter(&mut self) -> Duration {
        rand::random_range(Duration::ZERO..=Self::JITTER)
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

    #[test]
    fn pauses_and_jitter_are_spread() {
        let mut backoff = Backoff::new();
        let jitters: std::collections::HashSet<_> = (0..50).map(|_| backoff.jitter()).collect();
        assert!(jitters.iter().all(|j| *j <= Backoff::JITTER));
        assert!(jitters.len() > 10, "jitter drew only {jitters:?}");
        let capped: std::collections::HashSet<_> = (0..50)
            .map(|_| {
                let mut b = Backoff { next: Backoff::MAX };
                b.next()
            })
            .collect();
        assert!(capped.len() > 10, "pauses at the cap drew only {capped:?}");
    }
}
