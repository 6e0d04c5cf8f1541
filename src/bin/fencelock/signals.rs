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

use tokio::signal::unix::{signal, Signal, SignalKind};

/// The signals caught, with their numbers and names.
const CAUGHT: [(SignalKind, libc::c_int, &str); 4] = [
    (SignalKind::interrupt(), libc::SIGINT, "SIGINT"),
    (SignalKind::terminate(), libc::SIGTERM, "SIGTERM"),
    (SignalKind::hangup(), libc::SIGHUP, "SIGHUP"),
    (SignalKind::quit(), libc::SIGQUIT, "SIGQUIT"),
];

/// A signal fencelock received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// Its number, e.g. 15 for SIGTERM.
    pub number: libc::c_int,
    /// Its name, e.g. `SIGTERM`.
    pub name: &'static str,
}

impl Received {
    /// The exit status a shell reports for a process this signal ended: 128 + its number
    /// (130 SIGINT, 131 SIGQUIT, 129 SIGHUP, 143 SIGTERM).
    pub fn exit_code(self) -> ExitCode {
        ExitCode::from(u8::try_from(128 + self.number).unwrap_or(1))
    }
}

/// The caught signals' streams; installed once, before anything waits.
pub struct Signals {
    streams: Vec<(Signal, Received)>,
}

impl Signals {
    /// Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT from now on (needs a Tokio runtime). A
    /// signal that cannot be caught keeps its default action.
    pub fn install() -> Signals {
        let streams = CAUGHT
            .iter()
            .filter_map(|&(kind, number, name)| {
                Some((signal(kind).ok()?, Received { number, name }))
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
