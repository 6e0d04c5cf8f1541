//! Running one request per node at once and reading the answers as they come, with no task
//! spawned: the requests stay in this future, so a request not yet sent is never sent once the
//! caller stops reading, and one already sent is followed on its node's connection by whatever
//! the caller sends there next (a release).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Futures of one type, polled together; each yields its index and output once.
pub(super) struct Race<F: Future> {
    futures: Vec<Option<Pin<Box<F>>>>,
}

impl<F: Future> Race<F> {
    pub(super) fn new(futures: impl IntoIterator<Item = F>) -> Self {
        Self {
            futures: futures.into_iter().map(|f| Some(Box::pin(f))).collect(),
        }
    }

    /// How many have not finished yet.
    pub(super) fn pending(&self) -> usize {
        self.futures.iter().filter(|f| f.is_some()).count()
    }

    /// The next one to finish, with its index; `None` when all have.
    pub(super) async fn next(&mut self) -> Option<(usize, F::Output)> {
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
pub(super) async fn gather<F: Future>(
    mut race: Race<F>,
    started: Instant,
    deadline: Instant,
    mut on_answer: impl FnMut(usize, F::Output, usize) -> Progress,
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
