//! `fencelock`: run a command while holding a fenced lock, or show where a lock's keys live.
//!
//! Exit status of `exec`: the command's own; 75 when the lock was not acquired within
//! `--timeout` (with `--quorum` also when fewer than a majority of the deployments answer); 76
//! when fewer replicas than `--wait-replicas` confirmed; 70 when the lock was lost while the
//! command ran (the command is terminated); 64 for bad input; 69 when Redis cannot be reached;
//! 127 when the command cannot be started.
//!
//! `exec` runs the command in its own process group with a guardian process that kills the whole
//! group if fencelock dies, forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to the group, and exits
//! 70 also when the release finds that the lock was lost before the command finished.

mod duration;
mod exec;
mod group;
mod latch;
mod ops;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use fencelock::{Client, ClientBuilder, Error, LockKeys, Placement};

/// Distributed locks with fencing tokens on Redis Cluster or standalone Redis.
#[derive(Parser, Debug)]
#[command(name = "fencelock", version, after_help = EXIT_CODES)]
struct Cli {
    /// Redis node URL; repeat for several nodes (any reachable cluster node is enough).
    #[arg(
        long = "url",
        global = true,
        env = "FENCELOCK_URL",
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:7000"
    )]
    urls: Vec<String>,

    /// Key prefix.
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_PREFIX",
        default_value = "fencelock"
    )]
    prefix: String,

    #[command(flatten)]
    tls: TlsArgs,

    /// exec only: each --url is a separate deployment (a standalone server, or one seed node of
    /// a cluster), and NAME is a quorum lock over them, granted by a majority (an odd number of
    /// at least 3 deployments).
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_QUORUM",
        value_parser = clap::builder::FalseyValueParser::new()
    )]
    quorum: bool,

    #[command(subcommand)]
    command: Command,
}

const EXIT_CODES: &str = "Exit status of exec: the command's own; 75 not acquired within \
--timeout (with --quorum also when fewer than a majority of the deployments answer); 76 too few \
replicas confirmed; 70 lock lost while the command ran (the command is terminated) or found \
lost at the release; 64 bad input; 69 Redis unreachable; 127 the command cannot be started.

exec runs the command in its own process group: a lost lock terminates the whole group, a \
guardian process kills it if fencelock dies, and SIGINT, SIGTERM, SIGHUP and SIGQUIT are \
forwarded to it. Durations: 300ms, 2s, 1.5s, 1m30s, 2h 15m, 0.

latch wait exits 0 once the latch is open, 75 if it is not open within --timeout.

status, unlock --force, list and top exit 0 (held or not; unlock prints what it freed), 64 for \
bad input (unlock without --force), 69 when Redis cannot be reached.";

#[derive(Subcommand, Debug)]
enum Command {
    /// Run CMD while holding lock NAME (with --permits N: one permit of semaphore NAME; with
    /// several NAMEs: all those mutexes as one multi-lock); CMD gets FENCELOCK_TOKEN and
    /// FENCELOCK_NAME (space-separated for several names, in the order given; and
    /// FENCELOCK_PERMIT) and runs in its own process group, which dies with fencelock.
    Exec(exec::ExecArgs),
    /// Print the Lua source of one of fencelock's scripts (acquire, release, extend, reenter,
    /// renew, fenced_set, semaphore_acquire, ...), e.g. to `SCRIPT LOAD "$(fencelock script acquire)"` it or benchmark
    /// it; the text without its final newline has the SHA1 fencelock sends with EVALSHA.
    Script {
        /// Print the script's SHA1 (as `SCRIPT LOAD` returns it) instead of its source.
        #[arg(long)]
        sha: bool,
        /// Script name.
        name: String,
    },
    /// Print the slot and the Redis key lock NAME uses.
    Slot {
        /// Lock name.
        name: String,
        #[command(flatten)]
        placement: PlacementArgs,
    },
    /// Countdown latches: `latch set NAME COUNT`, `latch count-down NAME [--id ID]`, `latch
    /// wait NAME [--timeout D]` (exit 75 if not open in time).
    Latch(latch::LatchArgs),
    /// Print a completion script for SHELL, e.g. `fencelock completions bash >
    /// /etc/bash_completion.d/fencelock`, or `source <(fencelock completions zsh)`.
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Show lock NAME (with --read/--write, --fair, --permits N, --latch: that primitive):
    /// held or free, fence, lease left, holds, waiters; one line, or --json one object. Exit 0
    /// whether held or not.
    Status(ops::StatusArgs),
    /// Free lock NAME whoever holds it (needs --force): the fence is kept, so the next grant
    /// is higher, waiters are woken, the old holder finds the lock lost. A latch is opened.
    Unlock(ops::UnlockArgs),
    /// List every lock under the prefix on every master (SCAN, bounded by --max-keys), with
    /// the fields of status.
    List(ops::ListArgs),
    /// A live view of the locks under the prefix (--prefix), refreshed every second: name,
    /// kind, state, lease left, fence, waiters, grants per second. q or Ctrl-C quits.
    Top(ops::TopArgs),
}

/// TLS files for rediss:// URLs.
#[derive(Args, Debug, Clone)]
struct TlsArgs {
    /// PEM file of CA certificates to trust for rediss:// servers, instead of the system's.
    #[arg(
        long = "tls-ca",
        global = true,
        env = "FENCELOCK_TLS_CA",
        value_name = "FILE"
    )]
    ca: Option<PathBuf>,
    /// PEM client certificate for servers that require mutual TLS (with --tls-key).
    #[arg(
        long = "tls-cert",
        id = "tls_cert",
        global = true,
        env = "FENCELOCK_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    cert: Option<PathBuf>,
    /// PEM private key of the --tls-cert certificate.
    #[arg(
        long = "tls-key",
        id = "tls_key",
        global = true,
        env = "FENCELOCK_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    key: Option<PathBuf>,
}

/// A client builder for the global options.
fn client_builder(urls: Vec<String>, prefix: String, tls: TlsArgs) -> ClientBuilder {
    let mut builder = Client::builder(urls).prefix(prefix);
    if let Some(ca) = tls.ca {
        builder = builder.tls_ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (tls.cert, tls.key) {
        builder = builder.tls_client_cert_files(cert, key);
    }
    builder
}

/// Where a lock's keys live.
#[derive(Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Pin the lock to this hash slot (0..16383).
    #[arg(long, env = "FENCELOCK_SLOT", conflicts_with = "tag")]
    slot: Option<u16>,
    /// Use this hash tag instead of the name.
    #[arg(long, env = "FENCELOCK_TAG")]
    tag: Option<String>,
}

impl PlacementArgs {
    /// The placement these flags ask for.
    pub fn placement(&self) -> Placement {
        match (self.slot, &self.tag) {
            (Some(slot), _) => Placement::Slot(slot),
            (None, Some(tag)) => Placement::Tag(tag.clone()),
            (None, None) => Placement::ByName,
        }
    }
}

/// Exit codes (sysexits.h where one fits).
pub mod code {
    /// Bad input.
    pub const USAGE: u8 = 64;
    /// Redis unreachable or failing.
    pub const UNAVAILABLE: u8 = 69;
    /// The lock was lost while the command ran.
    pub const LOCK_LOST: u8 = 70;
    /// Not acquired within --timeout.
    pub const NOT_ACQUIRED: u8 = 75;
    /// Too few replicas confirmed.
    pub const REPLICAS: u8 = 76;
}

/// Prints a one-line error with its causes and returns the exit code for it.
pub fn fail(error: &Error) -> ExitCode {
    let mut line = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(err) = cause {
        // Wrappers often repeat the message of what they wrap.
        let text = err.to_string();
        if !line.contains(&text) {
            line.push_str(": caused by: ");
            line.push_str(&text);
        }
        cause = err.source();
    }
    eprintln!("fencelock: {line}");
    ExitCode::from(match error {
        Error::Busy { .. } | Error::Timeout { .. } => code::NOT_ACQUIRED,
        Error::ReplicasNotConfirmed { .. } => code::REPLICAS,
        Error::InvalidName { .. }
        | Error::InvalidOptions { .. }
        | Error::InvalidConfig { .. }
        | Error::LimitMismatch { .. } => code::USAGE,
        Error::Expired { .. } | Error::ForceUnlocked { .. } | Error::NotOwner { .. } => {
            code::LOCK_LOST
        }
        Error::LatchNotOpen { .. } => code::NOT_ACQUIRED,
        Error::CountDownRefused { .. } => code::USAGE,
        _ => code::UNAVAILABLE,
    })
}

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == group::GUARDIAN_ARG)
    {
        return group::guardian_main();
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            let _ = err.print();
            return ExitCode::SUCCESS;
        }
        Err(err) if err.kind() == clap::error::ErrorKind::ValueValidation => {
            // One line: "invalid value '5ms' for '--ttl <TTL>': <why>".
            let text = err.render().to_string();
            let line = text.lines().next().unwrap_or_default();
            eprintln!("fencelock: {}", line.trim_start_matches("error: "));
            return ExitCode::from(code::USAGE);
        }
        Err(err) => {
            let _ = err.print();
            return ExitCode::from(code::USAGE);
        }
    };
    if cli.quorum && !matches!(cli.command, Command::Exec(_)) {
        eprintln!("fencelock: --quorum applies to exec only: run other commands per deployment");
        return ExitCode::from(code::USAGE);
    }
    if !matches!(cli.command, Command::Exec(_)) {
        // The printing subcommands end quietly, as Unix tools do, when their reader goes away
        // (`fencelock script acquire | head -1`): Rust ignores SIGPIPE, and println! would
        // panic on the broken pipe. exec keeps ignoring it: a closed stderr must not kill the
        // supervisor of a running command.
        // SAFETY: signal(2) with SIG_DFL installs no handler; no other thread runs yet.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match cli.command {
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "fencelock",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
        Command::Script { sha, name } => match fencelock::lua_scripts().find(|s| s.name == name) {
            Some(script) => {
                println!("{}", if sha { script.sha1 } else { script.source });
                ExitCode::SUCCESS
            }
            None => {
                let names: Vec<_> = fencelock::lua_scripts().map(|s| s.name).collect();
                eprintln!(
                    "fencelock: no script named {name:?}; choose one of {}",
                    names.join(", ")
                );
                ExitCode::from(code::USAGE)
            }
        },
        Command::Slot { name, placement } => {
            match LockKeys::new(&cli.prefix, &name, &placement.placement()) {
                Ok(keys) => {
                    println!("slot {}", keys.slot());
                    println!("lock {}", keys.lock_key());
                    ExitCode::SUCCESS
                }
                Err(err) => fail(&err),
            }
        }
        Command::Exec(args) => {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    eprintln!("fencelock: cannot start the async runtime: {err}");
                    return ExitCode::from(code::UNAVAILABLE);
                }
            };
            let target = if cli.quorum {
                exec::Target::Quorum(
                    cli.urls
                        .into_iter()
                        .map(|url| client_builder(vec![url], cli.prefix.clone(), cli.tls.clone()))
                        .collect(),
                )
            } else {
                exec::Target::Single(client_builder(cli.urls, cli.prefix, cli.tls))
            };
            runtime.block_on(exec::run(target, args))
        }
        Command::Latch(args) => {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    eprintln!("fencelock: cannot start the async runtime: {err}");
                    return ExitCode::from(code::UNAVAILABLE);
                }
            };
            let client = client_builder(cli.urls, cli.prefix, cli.tls);
            runtime.block_on(latch::run(client, args))
        }
        Command::Status(_) | Command::Unlock(_) | Command::List(_) | Command::Top(_) => {
            run_ops(cli)
        }
    }
}

/// Runs `status`, `unlock`, `list` or `top` on a current-thread runtime.
fn run_ops(cli: Cli) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("fencelock: cannot start the async runtime: {err}");
            return ExitCode::from(code::UNAVAILABLE);
        }
    };
    let prefix = cli.prefix.clone();
    let client = client_builder(cli.urls, cli.prefix, cli.tls);
    runtime.block_on(async move {
        match cli.command {
            Command::Status(args) => ops::status(client, args).await,
            Command::Unlock(args) => ops::unlock(client, args).await,
            Command::List(args) => ops::list(client, args).await,
            Command::Top(args) => ops::top(client, prefix, args).await,
            _ => ExitCode::from(code::USAGE),
        }
    })
}

/// clap value parser for durations.
pub fn duration_arg(text: &str) -> Result<Duration, String> {
    duration::parse(text)
}
