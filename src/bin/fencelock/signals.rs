//! The signals that stop `exec`, `hold` and `latch wait`: SIGINT, SIGTERM, SIGHUP and SIGQUIT.
//!
//! They are caught from the start of the command, before it connects or waits, so that a
//! signal while waiting ends the wait through its cancel-safe drop (a waiting writer's intent,
//! a fair waiter's place and multi-lock members already taken are withdrawn in the
//! background) and [`Client::shutdown`](fencelock::Client::shutdown) sees those
//! undos reach Redis before fencelock exits with 128 + the signal's number, as a shell reports a
//! process a signal ended. While `exec`'s command runs they are forwarded to its process group
//! instead.

use std::future::Future;
use std::process::ExitCode;
use std::task::Poll;

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

/// The signals caught, with their numbers and names.
const CAUGHT: [(SignalKind, Signal); 4] = [
    (SignalKind::interrupt(), Signal::SIGINT),
    (SignalKind::terminate(), Signal::SIGTERM),
    (SignalKind::hangup(), Signal::SIGHUP),
    (SignalKind::quit(), Signal::SIGQUIT),
];

/// A signal fencelock received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The signal.
    pub signal: Signal,
    /// Its name, e.g. `SIGTERM`.
    pub name: &'static str,
}

impl Received {
    /// The exit status a shell reports for a process this signal ended: 128 + its number
    /// (130 SIGINT, 131 SIGQUIT, 129 SIGHUP, 143 SIGTERM).
    pub fn exit_code(self) -> ExitCode {
        ExitCode::from(u8::try_from(128 + self.signal as i32).unwrap_or(1))
    }
}

/// The caught signals' streams; installed once, before anything waits.
pub struct Signals {
    streams: Vec<(tokio::signal::unix::Signal, Received)>,
}

impl Signals {
    /// Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT from now on (needs a Tokio runtime). A
    /// signal that cannot be caught keeps its default action.
    pub fn install() -> Signals {
        let streams = CAUGHT
            .iter()
            .filter_map(|&(kind, caught)| {
                let received = Received {
                    signal: caught,
                    name: caught.as_str(),
                };
                Some((signal(kind).ok()?, received))
            })
            .collect();
        Signals { streams }
    }

    /// The next signal received.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a signal not yet returned stays queued for the next call.
    pub async fn next(&mut self) -> Received {
        if self.streams.is_empty() {
            return std::future::pending().await;
        }
        std::future::poll_fn(|cx| {
            for (stream, received) in &mut self.streams {
                if stream.poll_recv(cx).is_ready() {
                    return Poll::Ready(*received);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Runs `work` until it finishes or a signal arrives; on a signal `work` is dropped (a
    /// cancel-safe call undoes itself in the background) and the signal is returned.
    pub async fn interruptible<F: Future>(&mut self, work: F) -> Result<F::Output, Received> {
        tokio::select! {
            outcome = work => Ok(outcome),
            received = self.next() => Err(received),
        }
    }
}
