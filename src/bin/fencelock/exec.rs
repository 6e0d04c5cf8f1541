//! `fencelock exec`: hold a lock while a command runs, renewing it, and stop the command if the
//! lock is lost.
//!
//! The command runs in its own process group, watched by a guardian (see [`crate::group`]):
//! the whole group is terminated when the lock is lost, killed when fencelock dies, and gets
//! the SIGINT, SIGTERM, SIGHUP and SIGQUIT fencelock receives. Processes the command leaves
//! behind in its group when it exits get SIGTERM, then SIGKILL after the grace period, before
//! the lock is released: nothing of the command runs without the lock. Before the lock is
//! held, those signals end the wait instead (see [`crate::signals`] and [`take`]), which `hold`
//! shares.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use fencelock::{
    Client, ClientBuilder, Error, FairLockGuard, FenceMode, FenceToken, HumanDuration, LockGuard,
    LockOptions, MultiGuard, PermitGuard, QuorumClient, QuorumGuard, ReadGuard, WriteGuard,
    MIN_TTL,
};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::SignalKind;

use crate::group::Group;
use crate::prelude::PlacementArgs;
use crate::signals::Signals;
use crate::wait::{Progress, REDRAW};
use crate::{code, duration_arg, fail, switch_arg, timeout_arg};

/// Arguments of `fencelock exec`.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// What to lock and how.
    #[command(flatten)]
    pub lock: LockArgs,
    /// The command and its arguments: after NAME (one name), or after `--` (every argument
    /// before `--` that is not an option or an option's value is then a name).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// What to lock and how: the arguments `exec` and `hold` share.
#[derive(Args, Debug)]
pub struct LockArgs {
    /// Lock TTL (at least 10ms); the watchdog renews the lock every TTL/3 while it is held, so
    /// the TTL only bounds how long a crashed holder blocks others.
    #[arg(long, env = "FENCELOCK_TTL", default_value = "10s", value_parser = ttl_arg)]
    ttl: Duration,
    /// Stop renewing after this long: the lock is then lost (exit 70; exec terminates CMD).
    #[arg(long, env = "FENCELOCK_MAX_HOLD", value_parser = duration_arg)]
    max_hold: Option<Duration>,
    /// How long to wait for the lock (woken at once when the holder releases); 0 makes one
    /// attempt. `-w D` as in flock(1): a bare number is seconds.
    #[arg(short = 'w', long, env = "FENCELOCK_TIMEOUT", default_value = "30s", value_parser = timeout_arg)]
    timeout: Duration,
    /// One attempt, no waiting: --timeout 0 (as in flock(1); wins over --timeout).
    #[arg(short = 'n', long)]
    nonblock: bool,
    /// Replicas that must confirm the acquisition (Redis WAIT).
    #[arg(long, env = "FENCELOCK_WAIT_REPLICAS")]
    wait_replicas: Option<u32>,
    /// How long WAIT may take.
    #[arg(long, env = "FENCELOCK_WAIT_TIMEOUT", default_value = "1s", value_parser = duration_arg)]
    wait_timeout: Duration,
    /// How fence tokens are computed (see `docs/safety.md`) [default: epoch-clock; with
    /// --quorum only clock is accepted, and is what a quorum lock uses].
    #[arg(long, env = "FENCELOCK_FENCE_MODE", value_enum)]
    fence_mode: Option<FenceModeArg>,
    #[command(flatten)]
    placement: PlacementArgs,
    /// Take a read hold of the read-write lock NAME (shared with other readers) instead of the
    /// mutex NAME; with several names, a read hold of each, held as one multi-lock.
    #[arg(long, env = "FENCELOCK_READ", value_parser = switch_arg, conflicts_with_all = ["write", "fair", "permits"])]
    read: bool,
    /// Take the write hold of the read-write lock NAME (exclusive of readers and writers)
    /// instead of the mutex NAME; with several names, the write hold of each, held as one
    /// multi-lock.
    #[arg(long, env = "FENCELOCK_WRITE", value_parser = switch_arg, conflicts_with_all = ["fair", "permits"])]
    write: bool,
    /// Take the fair lock NAME (granted in arrival order; a different key from the lock NAME).
    #[arg(long, env = "FENCELOCK_FAIR", value_parser = switch_arg, conflicts_with = "permits")]
    fair: bool,
    /// Hold one permit of semaphore NAME with N permits instead of the lock NAME (the first use
    /// sets the size; another N than the stored one fails with exit 64). Exports
    /// FENCELOCK_PERMIT, the permit's number.
    #[arg(long, env = "FENCELOCK_PERMITS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,
    /// Say on stderr what it waits for (`waiting for NAME: held by another owner, lease ends
    /// in 8.2s`), one line a second, even when stderr is not a terminal (on a terminal one
    /// status line is updated in place): the global -v.
    #[arg(skip)]
    pub verbose: bool,
    /// Never say what it waits for (by default it does when stderr is a terminal): the global
    /// -q.
    #[arg(skip)]
    pub quiet: bool,
    /// Lock name; several names take a multi-lock of them all (mutexes; fair locks with
    /// --fair; read or write holds of read-write locks with --read or --write; not with
    /// --permits), held as one: all or none, acquired in one canonical order, FENCELOCK_NAME and
    /// FENCELOCK_TOKEN (hold: its token line) then list the names and their fences,
    /// space-separated, in the order given.
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,
}

impl LockArgs {
    /// How long to wait: 0 with `-n`, else `--timeout`.
    pub fn timeout(&self) -> Duration {
        if self.nonblock {
            Duration::ZERO
        } else {
            self.timeout
        }
    }
}

/// `fencelock::FenceMode` on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum FenceModeArg {
    /// Counter raised to the server clock in µs.
    Clock,
    /// Counter raised to the master's config epoch × 2^32.
    Epoch,
    /// A plain counter.
    Counter,
    /// Counter raised to the server clock in µs plus the master's config epoch × 2^34 (the
    /// default).
    EpochClock,
}

impl From<FenceModeArg> for FenceMode {
    fn from(mode: FenceModeArg) -> Self {
        match mode {
            FenceModeArg::Clock => FenceMode::Clock,
            FenceModeArg::EpochClock => FenceMode::EpochClock,
            FenceModeArg::Epoch => FenceMode::Epoch,
            FenceModeArg::Counter => FenceMode::Counter,
        }
    }
}

/// clap value parser for `--ttl`: a duration of at least [`MIN_TTL`], checked here so that a
/// too-short TTL is refused before anything starts.
fn ttl_arg(text: &str) -> Result<Duration, String> {
    let ttl = duration_arg(text)?;
    if ttl < MIN_TTL {
        return Err(format!(
            "{text:?} is below the minimum TTL of {}",
            HumanDuration(MIN_TTL)
        ));
    }
    Ok(ttl)
}

/// Who holds what `args` waits for, as the waiting display says it.
fn holder(args: &LockArgs) -> String {
    if args.read {
        "held by a writer (or a writer waits first)".to_owned()
    } else if args.write {
        "held by readers or another writer".to_owned()
    } else if args.fair {
        "held by another owner, or others are ahead in its queue".to_owned()
    } else if let Some(permits) = args.permits {
        format!("all {permits} permits are held")
    } else {
        "held by another owner".to_owned()
    }
}

/// How long a command gets to exit after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(5);

/// Exit status when the command (or its guardian) cannot be started, as in shells.
const NOT_STARTED: u8 = 127;

/// What exec locks on: one deployment (the URLs are its seeds), or with `--quorum` one
/// deployment per URL.
pub enum Target {
    /// One client over all URLs.
    Single(ClientBuilder),
    /// A quorum lock over one deployment per URL.
    Quorum(Vec<ClientBuilder>),
}

/// A connected [`Target`].
pub enum Connected {
    Single(Client),
    Quorum(QuorumClient),
}

/// A connected [`Target`] and the hold taken on it.
pub struct Taken {
    /// The client, kept while the hold is (its background releases need it).
    pub client: Connected,
    /// The hold taken.
    pub hold: Hold,
}

impl Connected {
    /// Waits for the client's background work (releases, undos), at most one request timeout.
    ///
    /// # Errors
    ///
    /// As [`Client::shutdown`]: some of that work was still running at the bound.
    pub async fn shutdown(&self) -> Result<(), Error> {
        match self {
            Connected::Single(client) => client.shutdown().await,
            Connected::Quorum(client) => client.shutdown().await,
        }
    }
}

/// Connects to `target` and takes the hold `args` ask for, showing the wait; a signal on the
/// way ends it: what the wait holds is withdrawn (the acquisition's cancel-safe drop, then
/// [`Client::shutdown`] so the undos reach Redis) and `main` dies by the signal
/// ([`Received::end`](crate::signals::Received::end)).
///
/// `what` names the command in messages (`exec`, `hold`).
pub async fn take(
    target: Target,
    args: &LockArgs,
    signals: &mut Signals,
    what: &str,
) -> Result<Taken, ExitCode> {
    let mut options = LockOptions::new()
        .ttl(args.ttl)
        .timeout(args.timeout())
        .placement(args.placement.placement())
        .watchdog(true);
    let progress = Progress::new(holder(args), args.timeout(), args.verbose, args.quiet);
    if let Some(progress) = &progress {
        options = options.on_wait(progress.observer());
    }
    if let Some(max_hold) = args.max_hold {
        options = options.max_hold(max_hold);
    }
    if let Some(replicas) = args.wait_replicas {
        options = options.wait_replicas(replicas, args.wait_timeout);
    }
    let quorum = matches!(target, Target::Quorum(_));
    if let Err(usage) = check_names(args).and_then(|()| check_quorum(args, quorum)) {
        say!("fencelock: {usage}");
        return Err(ExitCode::from(code::USAGE));
    }
    let connect = async {
        match target {
            Target::Single(client) => client
                .fence_mode(
                    args.fence_mode
                        .map_or_else(FenceMode::default, FenceMode::from),
                )
                .connect()
                .await
                .map(Connected::Single),
            Target::Quorum(deployments) => QuorumClient::builder(deployments)
                .connect()
                .await
                .map(Connected::Quorum),
        }
    };
    let client = match signals.interruptible(connect).await {
        Ok(Ok(client)) => client,
        Ok(Err(err)) => return Err(fail(&err)),
        Err(received) => {
            say!(
                "fencelock: {what} stopped by {} while connecting",
                received.name
            );
            return Err(received.end());
        }
    };
    let name = args.names.join(" ");
    let acquired = {
        let acquire = Hold::acquire(&client, args, &options);
        tokio::pin!(acquire);
        let mut redraw = tokio::time::interval(REDRAW);
        let in_place = progress.as_ref().is_some_and(Progress::in_place);
        let acquired = loop {
            tokio::select! {
                acquired = &mut acquire => break Ok(acquired),
                received = signals.next() => break Err(received),
                _ = redraw.tick(), if in_place => {
                    if let Some(progress) = &progress {
                        progress.redraw();
                    }
                }
            }
        };
        if let Some(progress) = &progress {
            progress.clear();
        }
        acquired
    };
    match acquired {
        Ok(Ok(hold)) => Ok(Taken { client, hold }),
        Ok(Err(err)) => Err(fail(&err)),
        Err(received) => {
            // The acquisition was dropped above: its undo runs in the background; wait for it.
            let left = match client.shutdown().await {
                Ok(()) => "nothing of it is held".to_owned(),
                Err(err) => format!(
                    "what it held could not be withdrawn in time ({err}) and frees itself when \
                     its lease ends"
                ),
            };
            say!(
                "fencelock: {what} stopped by {} while waiting for lock {name:?}; {left}",
                received.name
            );
            Err(received.end())
        }
    }
}

/// Runs `fencelock exec`: takes the hold, runs the command under it, releases it.
pub async fn run(target: Target, args: ExecArgs) -> ExitCode {
    let mut signals = Signals::install();
    let Some((program, rest)) = args.command.split_first() else {
        say!("fencelock: no command given: write it after NAME (or after --)");
        return ExitCode::from(code::USAGE);
    };
    let args_lock = &args.lock;
    let Taken {
        client: _client,
        hold: guard,
    } = match take(target, args_lock, &mut signals, "exec").await {
        Ok(taken) => taken,
        Err(code) => return code,
    };
    let name = args_lock.names.join(" ");
    let group = match Group::start() {
        Ok(group) => group,
        Err(err) => {
            say!("fencelock: cannot start the guardian of the command: {err}");
            let _ = guard.release().await;
            return ExitCode::from(NOT_STARTED);
        }
    };
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("FENCELOCK_TOKEN", guard.tokens())
        .env("FENCELOCK_NAME", &name);
    if let Hold::Permit(permit) = &guard {
        command.env("FENCELOCK_PERMIT", permit.permits()[0].number.to_string());
    } else {
        // An outer `exec --permits`'s number is not this hold's.
        command.env_remove("FENCELOCK_PERMIT");
    }
    group.enter(&mut command);
    let spawned = command.spawn();
    drop(command);
    let mut child = match spawned {
        Ok(child) => child,
        Err(err) => {
            group.kill().await;
            say!("fencelock: cannot run {program:?}: {err}");
            let _ = guard.release().await;
            return ExitCode::from(NOT_STARTED);
        }
    };
    match supervise(&mut child, &group, &guard, &mut signals).await {
        Supervised::Exited { status, signalled } => {
            // Whatever the command left in its group stops before the lock is released; after
            // a forwarded signal the rest of the group first gets a moment to act on it.
            if signalled {
                group.wait_empty(SIGNALLED_GRACE).await;
            }
            if group.others_alive() {
                group.signal(Signal::SIGTERM);
                group.wait_empty(GRACE).await;
            }
            group.kill().await;
            let fence = guard.tokens();
            match guard.release().await {
                Ok(()) => ExitCode::from(status),
                Err(err) if err.is_lock_lost() => {
                    say!(
                        "fencelock: lock {:?} (fence {fence}) was lost before the command \
                         finished (it exited with {status}): {err}",
                        name,
                    );
                    ExitCode::from(code::LOCK_LOST)
                }
                Err(err) => {
                    say!(
                        "fencelock: warning: the command finished but lock {:?} was not \
                         released ({err}); it frees itself when its TTL runs out",
                        name
                    );
                    ExitCode::from(status)
                }
            }
        }
        Supervised::Lost(reason) => {
            let fence = guard.tokens();
            group.signal(Signal::SIGTERM);
            if tokio::time::timeout(GRACE, child.wait()).await.is_ok() {
                group.wait_empty(GRACE).await;
            }
            group.kill().await;
            let _ = child.wait().await;
            // Released only now (a lease that merely went unconfirmed may still be ours and must
            // not go to someone else while the command is being stopped), and awaited: a
            // background release would not run once fencelock returns.
            let _ = guard.release().await;
            say!(
                "fencelock: lost lock {:?} (fence {fence}) while the command ran: {reason}; the \
                 command was terminated",
                name,
            );
            ExitCode::from(code::LOCK_LOST)
        }
    }
}

/// The hold the command runs under: the mutex, a read or write hold of a read-write lock, the
/// fair lock, a permit, a multi-lock of mutexes, of fair locks, of read holds or of write
/// holds, or a quorum lock.
pub enum Hold {
    Mutex(LockGuard),
    Read(ReadGuard),
    Write(WriteGuard),
    Fair(FairLockGuard),
    Permit(PermitGuard),
    Multi(MultiGuard),
    FairMulti(MultiGuard<FairLockGuard>),
    ReadMulti(MultiGuard<ReadGuard>),
    WriteMulti(MultiGuard<WriteGuard>),
    Quorum(QuorumGuard),
}

/// `--quorum` takes one NAME of a plain lock, always with the clock fence rule and no WAIT.
fn check_quorum(args: &LockArgs, quorum: bool) -> Result<(), String> {
    if !quorum {
        return Ok(());
    }
    let flag = if args.read {
        Some("--read")
    } else if args.write {
        Some("--write")
    } else if args.fair {
        Some("--fair")
    } else if args.permits.is_some() {
        Some("--permits")
    } else if args.wait_replicas.is_some() {
        Some("--wait-replicas")
    } else if !matches!(args.fence_mode, None | Some(FenceModeArg::Clock)) {
        Some("--fence-mode other than clock")
    } else {
        None
    };
    if let Some(flag) = flag {
        return Err(format!(
            "--quorum takes a plain lock: {flag} cannot be combined with it"
        ));
    }
    if args.names.len() != 1 {
        return Err(format!(
            "--quorum takes one NAME, got {}: a quorum multi-lock does not exist",
            args.names.len()
        ));
    }
    Ok(())
}

/// Several names take a multi-lock of mutexes, fair locks, read holds or write holds (not of
/// permits), and then without spaces (the environment lists them space-separated).
fn check_names(args: &LockArgs) -> Result<(), String> {
    if args.names.len() < 2 {
        return Ok(());
    }
    if args.permits.is_some() {
        return Err(
            "--permits takes one NAME; several names take a multi-lock of mutexes (or, \
             with --fair, of fair locks; with --read or --write, of read or write holds)"
                .to_owned(),
        );
    }
    if let Some(name) = args
        .names
        .iter()
        .find(|n| n.chars().any(char::is_whitespace))
    {
        return Err(format!(
            "lock name {name:?} has whitespace: a multi-lock lists its names space-separated \
             in FENCELOCK_NAME"
        ));
    }
    Ok(())
}

impl Hold {
    async fn acquire(
        client: &Connected,
        args: &LockArgs,
        options: &LockOptions,
    ) -> Result<Self, Error> {
        let client = match client {
            Connected::Quorum(quorum) => {
                return Ok(Hold::Quorum(quorum.lock(&args.names[0], options).await?))
            }
            Connected::Single(client) => client,
        };
        if args.names.len() > 1 {
            let names: Vec<&str> = args.names.iter().map(String::as_str).collect();
            return Ok(if args.read {
                Hold::ReadMulti(client.read_lock_all(&names, options).await?)
            } else if args.write {
                Hold::WriteMulti(client.write_lock_all(&names, options).await?)
            } else if args.fair {
                Hold::FairMulti(client.fair_lock_all(&names, options).await?)
            } else {
                Hold::Multi(client.lock_all(&names, options).await?)
            });
        }
        let name = &args.names[0];
        Ok(if args.read {
            Hold::Read(client.read_lock(name, options).await?)
        } else if args.write {
            Hold::Write(client.write_lock(name, options).await?)
        } else if args.fair {
            Hold::Fair(client.fair_lock(name, options).await?)
        } else if let Some(permits) = args.permits {
            let semaphore = client
                .semaphore(name, permits)?
                .with_placement(&args.placement.placement())?;
            Hold::Permit(semaphore.acquire(options).await?)
        } else {
            Hold::Mutex(client.lock(name, options).await?)
        })
    }

    fn fence(&self) -> FenceToken {
        match self {
            Hold::Mutex(guard) => guard.fence(),
            Hold::Read(guard) => guard.fence(),
            Hold::Write(guard) => guard.fence(),
            Hold::Fair(guard) => guard.fence(),
            Hold::Permit(guard) => guard.fence(),
            Hold::Multi(guard) => guard.fences()[0].1,
            Hold::FairMulti(guard) => guard.fences()[0].1,
            Hold::ReadMulti(guard) => guard.fences()[0].1,
            Hold::WriteMulti(guard) => guard.fences()[0].1,
            Hold::Quorum(guard) => guard.fence(),
        }
    }

    /// FENCELOCK_TOKEN: the fence, or a multi-lock's fences space-separated in the names' order.
    pub fn tokens(&self) -> String {
        let fences = match self {
            Hold::Multi(guard) => guard.fences(),
            Hold::FairMulti(guard) => guard.fences(),
            Hold::ReadMulti(guard) => guard.fences(),
            Hold::WriteMulti(guard) => guard.fences(),
            other => return other.fence().to_string(),
        };
        fences
            .iter()
            .map(|(_, fence)| fence.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub async fn lost(&self) -> Error {
        match self {
            Hold::Mutex(guard) => guard.lost().await,
            Hold::Read(guard) => guard.lost().await,
            Hold::Write(guard) => guard.lost().await,
            Hold::Fair(guard) => guard.lost().await,
            Hold::Permit(guard) => guard.lost().await,
            Hold::Multi(guard) => guard.lost().await,
            Hold::FairMulti(guard) => guard.lost().await,
            Hold::ReadMulti(guard) => guard.lost().await,
            Hold::WriteMulti(guard) => guard.lost().await,
            Hold::Quorum(guard) => guard.lost().await,
        }
    }

    /// Whether the hold is surely still valid (its lease has not run out, the watchdog has not
    /// found it lost).
    pub fn is_valid(&self) -> bool {
        match self {
            Hold::Mutex(guard) => guard.is_valid(),
            Hold::Read(guard) => guard.is_valid(),
            Hold::Write(guard) => guard.is_valid(),
            Hold::Fair(guard) => guard.is_valid(),
            Hold::Permit(guard) => guard.is_valid(),
            Hold::Multi(guard) => guard.is_valid(),
            Hold::FairMulti(guard) => guard.is_valid(),
            Hold::ReadMulti(guard) => guard.is_valid(),
            Hold::WriteMulti(guard) => guard.is_valid(),
            Hold::Quorum(guard) => guard.is_valid(),
        }
    }

    pub async fn release(self) -> Result<(), Error> {
        match self {
            Hold::Mutex(guard) => guard.release().await,
            Hold::Read(guard) => guard.release().await,
            Hold::Write(guard) => guard.release().await,
            Hold::Fair(guard) => guard.release().await,
            Hold::Permit(guard) => guard.release().await,
            Hold::Multi(guard) => guard.release().await,
            Hold::FairMulti(guard) => guard.release().await,
            Hold::ReadMulti(guard) => guard.release().await,
            Hold::WriteMulti(guard) => guard.release().await,
            Hold::Quorum(guard) => guard.release().await,
        }
    }
}

enum Supervised {
    /// The command exited with this status; `signalled` when fencelock had forwarded a signal
    /// to its group.
    Exited {
        status: u8,
        signalled: bool,
    },
    Lost(String),
}

/// After a forwarded signal ended the command, how long the rest of its group gets to act on
/// that signal (run its traps, exit) before fencelock terminates what is left.
const SIGNALLED_GRACE: Duration = Duration::from_secs(1);

/// Waits for the child while the watchdog renews the lock; forwards signals to its group; on
/// a terminal, passes the command's job-control stops on to the shell ([`Group::suspend`]).
async fn supervise(
    child: &mut Child,
    group: &Group,
    guard: &Hold,
    signals: &mut Signals,
) -> Supervised {
    let lost = guard.lost();
    tokio::pin!(lost);
    let mut children = tokio::signal::unix::signal(SignalKind::child()).ok();
    let mut continued = tokio::signal::unix::signal(SignalKind::from_raw(libc::SIGCONT)).ok();
    let mut signalled = false;
    loop {
        tokio::select! {
            status = child.wait() => {
                let status = match status {
                    Ok(status) => exit_byte(status),
                    Err(_) => 1,
                };
                return Supervised::Exited { status, signalled };
            }
            received = signals.next() => {
                signalled = true;
                group.signal(received.signal);
            }
            err = &mut lost => return Supervised::Lost(err.to_string()),
            Some(()) = next_event(&mut children) => {
                let Some(stop) = job_stop(child) else { continue };
                if !group.suspend(stop) {
                    continue;
                }
                // Stopped, fencelock was continued before going on (SIGCONT already heard);
                // not stopped (an orphaned group, the signal ignored), it hears none.
                let stopped = match &mut continued {
                    Some(stream) => tokio::time::timeout(NOT_STOPPED, stream.recv()).await.is_ok(),
                    None => true,
                };
                if !stopped && stop != Signal::SIGTSTP {
                    // A read of the terminal from the background: continued, the command would
                    // stop again at once, over and over. It stays stopped, as it would alone.
                    continue;
                }
                // Continued. The command goes on only under a lease that is surely still ours.
                if !guard.is_valid() {
                    return Supervised::Lost(format!(
                        "the command was stopped ({}) until the lock's lease ran out",
                        stop.as_str()
                    ));
                }
                group.resume();
            }
        }
    }
}

/// The next signal of a stream (SIGCHLD: a child exited, stopped or continued); never without
/// the stream.
async fn next_event(stream: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match stream {
        Some(stream) => stream.recv().await,
        None => std::future::pending().await,
    }
}

/// How long fencelock waits to hear the SIGCONT that continued it after it stopped itself; none
/// within this, it was not stopped.
const NOT_STOPPED: Duration = Duration::from_millis(50);

/// The job-control signal that stopped the command's own process, if it is stopped by one
/// (SIGTSTP, SIGTTIN, SIGTTOU; not SIGSTOP, which no terminal sends). Reads the stop, not the
/// exit, which the runtime reaps.
fn job_stop(child: &Child) -> Option<Signal> {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let pid = Pid::from_raw(i32::try_from(child.id()?).ok()?);
    match waitid(Id::Pid(pid), WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG) {
        Ok(WaitStatus::Stopped(_, signal))
            if matches!(signal, Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU) =>
        {
            Some(signal)
        }
        _ => None,
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
