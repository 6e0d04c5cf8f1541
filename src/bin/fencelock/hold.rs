//! `fencelock hold NAME`: take a lock and keep it until told to stop, like `etcdctl lock NAME`
//! without a command.
//!
//! The lock is taken with the watchdog on (exec's arguments: kind, TTL, timeout, placement);
//! its token is printed on stdout (one line, flushed) as soon as it is held; on SIGINT, SIGTERM
//! or SIGHUP (or SIGQUIT) it is released and hold exits 0. Exit 70 when the lock is lost while
//! held (expired, or freed by `unlock --force`), 75 when not acquired within `--timeout`, 64
//! for bad input, 69 when Redis cannot be reached (also when the release cannot reach it: the
//! lock then frees itself at the end of its TTL); a signal while waiting withdraws what the
//! wait holds and dies by the signal (a shell reports 128 + its number), as for exec.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;

use crate::code;
use crate::exec::{take, LockArgs, Taken, Target};
use crate::signals::Signals;

/// Arguments of `fencelock hold`.
#[derive(Args, Debug)]
pub struct HoldArgs {
    /// What to lock and how, as for exec.
    #[command(flatten)]
    pub lock: LockArgs,
}

/// Runs `fencelock hold`.
pub async fn run(target: Target, args: HoldArgs) -> ExitCode {
    let mut signals = Signals::install();
    let Taken {
        client,
        hold: guard,
    } = match take(target, &args.lock, &mut signals, "hold").await {
        Ok(taken) => taken,
        Err(code) => return code,
    };
    let name = args.lock.names.join(" ");
    let fence = guard.tokens();
    {
        // A reader that went away (`fencelock hold x | head -1`) is no reason to let go.
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{fence}");
        let _ = stdout.flush();
    }
    let lost = tokio::select! {
        _ = signals.next() => None,
        err = guard.lost() => Some(err),
    };
    match lost {
        None => match guard.release().await {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) if err.is_lock_lost() => {
                say!("fencelock: lock {name:?} (fence {fence}) was lost before the release: {err}");
                ExitCode::from(code::LOCK_LOST)
            }
            Err(err) => {
                say!(
                    "fencelock: lock {name:?} was not released ({err}); it frees itself when \
                     its TTL runs out"
                );
                ExitCode::from(code::UNAVAILABLE)
            }
        },
        Some(reason) => {
            // Said at once, and exited at once unless Redis still keeps the hold (the maximum
            // hold time reached): a script waiting on `hold` stops relying on the lock now, not
            // after a release and a shutdown waiting on a server that may not answer. That
            // release is bounded by the request timeout (several nodes' alike).
            say!("fencelock: lost lock {name:?} (fence {fence}) while holding it: {reason}");
            if matches!(reason, fencelock::Error::MaxHoldReached { .. }) {
                let _ = guard.release().await;
            }
            drop(client);
            ExitCode::from(code::LOCK_LOST)
        }
    }
}
