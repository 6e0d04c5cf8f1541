//! `fencelock exec`: hold a lock while a command runs, renewing it, and stop the command if the
//! lock is lost.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use fencelock::{ClientBuilder, FenceMode, LockGuard, LockOptions};
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};

use crate::{code, duration_arg, fail, PlacementArgs};

/// Arguments of `fencelock exec`.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Lock TTL; the watchdog renews the lock every TTL/3 while CMD runs, so the TTL only
    /// bounds how long a crashed holder blocks others.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    ttl: Duration,
    /// Stop renewing after this long: the lock is then lost and CMD terminated (exit 70).
    #[arg(long, value_parser = duration_arg)]
    max_hold: Option<Duration>,
    /// How long to wait for the lock (woken at once when the holder releases); 0 makes one
    /// attempt.
    #[arg(long, default_value = "30s", value_parser = duration_arg)]
    timeout: Duration,
    /// Replicas that must confirm the acquisition (Redis WAIT).
    #[arg(long)]
    wait_replicas: Option<u32>,
    /// How long WAIT may take.
    #[arg(long, default_value = "1s", value_parser = duration_arg)]
    wait_timeout: Duration,
    /// How fence tokens are computed (see `docs/safety.md`).
    #[arg(long, value_enum, default_value = "clock")]
    fence_mode: FenceModeArg,
    #[command(flatten)]
    placement: PlacementArgs,
    /// Lock name.
    name: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `fencelock::FenceMode` on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum FenceModeArg {
    /// Counter raised to the server clock in µs (the default).
    Clock,
    /// Counter raised to the master's config epoch × 2^32.
    Epoch,
    /// A plain counter.
    Counter,
}

impl From<FenceModeArg> for FenceMode {
    fn from(mode: FenceModeArg) -> Self {
        match mode {
            FenceModeArg::Clock => FenceMode::Clock,
            FenceModeArg::Epoch => FenceMode::Epoch,
            FenceModeArg::Counter => FenceMode::Counter,
        }
    }
}

/// How long a command gets to exit after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

pub async fn run(client: ClientBuilder, args: ExecArgs) -> ExitCode {
    let mut options = LockOptions::new()
        .ttl(args.ttl)
        .timeout(args.timeout)
        .placement(args.placement.placement())
        .watchdog(true);
    if let Some(max_hold) = args.max_hold {
        options = options.max_hold(max_hold);
    }
    if let Some(replicas) = args.wait_replicas {
        options = options.wait_replicas(replicas, args.wait_timeout);
    }
    let client = client.fence_mode(args.fence_mode.into());
    let client = match client.connect().await {
        Ok(client) => client,
        Err(err) => return fail(&err),
    };
    let guard = match client.lock(&args.name, &options).await {
        Ok(guard) => guard,
        Err(err) => return fail(&err),
    };
    let Some((program, rest)) = args.command.split_first() else {
        eprintln!("fencelock: no command given: write it after --");
        return ExitCode::from(code::USAGE);
    };
    let mut child = match Command::new(program)
        .args(rest)
        .env("FENCELOCK_TOKEN", guard.fence().to_string())
        .env("FENCELOCK_NAME", &args.name)
        .spawn()
    {
        Ok(child) => child,
        Err(err) => {
            eprintln!("fencelock: cannot run {program:?}: {err}");
            let _ = guard.release().await;
            return ExitCode::from(127);
        }
    };
    let outcome = supervise(&mut child, &guard).await;
    match outcome {
        Supervised::Exited(status) => {
            if let Err(err) = guard.release().await {
                eprintln!("fencelock: {err}");
            }
            ExitCode::from(status)
        }
        Supervised::Lost(reason) => {
            eprintln!(
                "fencelock: lost lock {:?} (fence {}) while the command ran: {reason}; the \
                 command was terminated",
                args.name,
                guard.fence()
            );
            terminate(&mut child).await;
            drop(guard);
            ExitCode::from(code::LOCK_LOST)
        }
    }
}

enum Supervised {
    Exited(u8),
    Lost(String),
}

/// Waits for the child while the watchdog renews the lock; forwards SIGINT and SIGTERM.
async fn supervise(child: &mut Child, guard: &LockGuard) -> Supervised {
    let (mut interrupt, mut terminate) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(i), Ok(t)) => (Some(i), Some(t)),
        _ => (None, None),
    };
    let lost = guard.lost();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => {
                return Supervised::Exited(match status {
                    Ok(status) => exit_byte(status),
                    Err(_) => 1,
                });
            }
            Some(()) = recv(&mut interrupt) => forward(child, libc::SIGINT),
            Some(()) = recv(&mut terminate) => forward(child, libc::SIGTERM),
            err = &mut lost => return Supervised::Lost(err.to_string()),
        }
    }
}

async fn recv(stream: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match stream {
        Some(stream) => stream.recv().await,
        None => std::future::pending().await,
    }
}

fn forward(child: &Child, signal: libc::c_int) {
    if let Some(pid) = child.id() {
        // SAFETY: kill(2) has no memory effects; the pid is our own child's.
        unsafe {
            libc::kill(pid as libc::pid_t, signal);
        }
    }
}

/// SIGTERM, then SIGKILL after the grace period.
async fn terminate(child: &mut Child) {
    forward(child, libc::SIGTERM);
    if tokio::time::timeout(GRACE, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
}

fn exit_byte(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(1),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(1),
        _ => 1,
    }
}
