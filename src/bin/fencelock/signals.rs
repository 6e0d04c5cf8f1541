//! The signals that stop `exec`, `hold` and `latch wait`: SIGINT, SIGTERM, SIGHUP and SIGQUIT.
//!
//! They are caught from the start of the command, before it connects or waits, so that a
//! signal while waiting ends the wait through its cancel-safe drop (a waiting writer's intent,
//! a fair waiter's place and multi-lock members already taken are withdrawn in the
//! background) and [`Client::shutdown`](fencelock::Client::shutdown) sees those
//! undos reach Redis before fencelock ends. It then dies by that signal (SIGQUIT excepted: it
//! exits 131, without the core dump the signal's default action would leave), so a shell
//! reports 128 + the signal's number and a calling script stops at Ctrl-C as it does for any
//! command Ctrl-C ended (a shell carries on after a child that caught SIGINT and exited). While
//! `exec`'s command runs they are forwarded to its process group instead.

use std::future::Future;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::task::Poll;

use nix::sys::signal::{SigHandler, SigSet, Signal};
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

/// The signal that ended a wait, for [`die_if_ended`] to die by once all is cleaned up; 0: none.
static ENDED_BY: AtomicI32 = AtomicI32::new(0);

impl Received {
    /// Ends the command by this signal: [`die_if_ended`] (called by `main` once the runtime
    /// is gone) dies by it. Returns the exit status a shell reports for a process this signal
    /// ended, 128 + its number (130 SIGINT, 131 SIGQUIT, 129 SIGHUP, 143 SIGTERM), which is
    /// fencelock's status for SIGQUIT and should the signal not end it.
    pub fn end(self) -> ExitCode {
        if self.signal != Signal::SIGQUIT {
            ENDED_BY.store(self.signal as i32, Ordering::Relaxed);
        }
        ExitCode::from(u8::try_from(128 + self.signal as i32).unwrap_or(1))
    }
}

/// Whether `signal` is ignored in fencelock (inherited so, or set).
pub fn ignored(signal: Signal) -> bool {
    // SAFETY: a null new action only reads the current one into `current`.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal as libc::c_int, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    }
}

/// Dies by the signal a wait was ended by ([`Received::end`]), if any: its default action
/// restored, it is unblocked and raised. Returns when no wait was ended by a signal, or if the
/// signal did not end the process.
pub fn die_if_ended() {
    let Ok(signal) = Signal::try_from(ENDED_BY.load(Ordering::Relaxed)) else {
        return;
    };
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: SIG_DFL installs no handler; the runtime that caught the signal has stopped.
    let _ = unsafe { nix::sys::signal::signal(signal, SigHandler::SigDfl) };
    let mut set = SigSet::empty();
    set.add(signal);
    let _ = set.thread_unblock();
    let _ = nix::sys::signal::raise(signal);
}

/// The caught signals' streams; installed once, before anything waits.
pub struct Signals {
    streams: Vec<(tokio::signal::unix::Signal, Received)>,
}

impl Signals {
    /// Catches SIGINT, SIGTERM, SIGHUP and SIGQUIT from now on (needs a Tokio runtime). A
    /// signal that cannot be caught keeps its default action; one that fencelock was started
    /// with ignored stays ignored (`nohup` ignores SIGHUP, a shell script's `&` SIGINT and
    /// SIGQUIT: those must not end fencelock, nor reach the command, which inherits the same).
    pub fn install() -> Signals {
        let streams = CAUGHT
            .iter()
            .filter(|&&(_, caught)| !ignored(caught))
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
