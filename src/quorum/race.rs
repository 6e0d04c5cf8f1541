//! Running one request per node at once and reading the answers as they come, with no task
//! spawned: the requests stay in this future, so a request not yet sent is never sent once the
//! caller stops reading, and one already sent is followed on its node's connection by whatever
//! the caller sends there next (a release).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Futures of one output type, polled together; each yields its index and output once.
///
/// Boxed as `dyn Future`: a quorum call's future would otherwise nest each node's whole request
/// type, deep enough to overflow rustc's query depth limit in a caller's crate.
pub(super) struct Race<'a, T> {
    futures: Vec<Option<Pin<Box<dyn Future<Output = T> + Send + 'a>>>>,
}

impl<'a, T> Race<'a, T> {
    pub(super) fn new<F>(futures: impl IntoIterator<Item = F>) -> Self
    where
        F: Future<Output = T> + Send + 'a,
    {
        Self {
            futures: futures
                .into_iter()
                .map(|f| Some(Box::pin(f) as Pin<Box<dyn Future<Output = T> + Send + 'a>>))
                .collect(),
        }
    }

    /// How many have not finished yet.
    pub(super) fn pending(&self) -> usize {
        self.futures.iter().filter(|f| f.is_some()).count()
    }

    /// The next one to finish, with its index; `None` when all have.
    pub(super) async fn next(&mut self) -> Option<(usize, T)> {
        if self.pending() == 0 {
            return None;
        }
        std::future::poll_fn(|cx| {
            for (index, slot) in self.futures.iter_mut().enumerate() {
                if let Some(future) = slot {
                    if let Poll::Ready(output) = future.as_mut().poll(cx) {
                        *slot = None;
                        return Poll::Ready(Some((index, output)));
                    }
                }
            }
            Poll::Pending
        })
        .await
    }
}

/// What the reader of a [`gather`] decided after an answer.
pub(super) enum Progress {
    /// Keep reading.
    Open,
    /// The outcome is known; read what comes within the straggler grace (so that nodes that
    /// answer about as fast as the others are not left out), then stop.
    Decided,
    /// Stop now.
    Done,
}

impl Progress {
    /// Where a round that needs `majority` answers in favour stands with `ok` of them and
    /// `pending` still to come: decided once `ok` reaches it, done once it no longer can, open
    /// otherwise.
    pub(super) fn toward(majority: usize, ok: usize, pending: usize) -> Self {
        if ok >= majority {
            Progress::Decided
        } else if ok + pending < majority {
            Progress::Done
        } else {
            Progress::Open
        }
    }
}

/// How long, once the outcome is decided at `elapsed` after the start, the others still get:
/// as long again as the decision took, plus 5 ms.
fn straggler_grace(elapsed: Duration) -> Duration {
    elapsed + Duration::from_millis(5)
}

/// Reads the answers of `race` in the order they come, handing each to `on_answer` (index,
/// output, how many are still pending), until all have answered, `on_answer` says
/// [`Progress::Done`], the straggler grace after [`Progress::Decided`] has passed, or `deadline`
/// has. Answers not read are dropped with their futures.
pub(super) async fn gather<T>(
    mut race: Race<'_, T>,
    started: Instant,
    deadline: Instant,
    mut on_answer: impl FnMut(usize, T, usize) -> Progress,
) {
    let mut limit = deadline;
    loop {
        let next = tokio::time::timeout_at(limit.into(), race.next()).await;
        let Ok(Some((index, output))) = next else {
            return;
        };
        match on_answer(index, output, race.pending()) {
            Progress::Open => {}
            Progress::Decided => {
                let grace = straggler_grace(started.elapsed());
                limit = limit.min(Instant::now() + grace);
            }
            Progress::Done => return,
        }
    }
}
