//! `fencelock`: run a command while holding a fenced lock, hold one until signalled, or show
//! where a lock's keys live.
//!
//! Exit status of `exec`: the command's own; 75 when the lock was not acquired within
//! `--timeout` (with `--quorum` also when fewer than a majority of the deployments answer); 76
//! when fewer replicas than `--wait-replicas` confirmed; 70 when the lock was lost while the
//! command ran (the command is terminated); 64 for bad input; 69 when Redis cannot be reached;
//! 127 when the command cannot be started; when signal N (SIGINT, SIGTERM, SIGHUP) arrived
//! before the lock was held, what the wait held is withdrawn and fencelock then dies by that
//! signal (a shell reports 128 + N, and a calling script stops at Ctrl-C); SIGQUIT exits 131. `hold`
//! exits 0 once released on a signal, otherwise as `exec`.
//!
//! `exec` runs the command in its own process group with a guardian process that kills the whole
//! group if fencelock dies, forwards SIGINT, SIGTERM, SIGHUP and SIGQUIT to the group, and exits
//! 70 also when the release finds that the lock was lost before the command finished.

/// `eprintln!` that never panics: a message for people on stderr, dropped when stderr is closed
/// (a broken pipe, a journal stream that went away). `eprintln!` panics there, and `exec` and
/// `hold` keep running with SIGPIPE ignored so that a closed stderr cannot end the supervisor
/// of a running command or the holder of a lock.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod argv;
mod completions;
mod duration;
mod exec;
mod group;
mod hold;
mod latch;
mod list;
mod man;
mod prelude;
mod script;
mod secrets;
mod signals;
mod slot;
mod status;
mod top;
mod unlock;
mod wait;

use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use fencelock::{Client, ClientBuilder, Error, FenceToken, MAX_FLOOR};
use serde::Serialize;

/// Where the CLI looks for Redis without `--url` or `FENCELOCK_URL`.
const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// Distributed locks with fencing tokens on Redis Cluster or standalone Redis.
#[derive(Parser, Debug)]
#[command(
    name = "fencelock",
    version,
    after_help = EXIT_CODES,
    next_help_heading = "Global options"
)]
struct Cli {
    /// Redis node URL; repeat for several nodes (any reachable cluster node is enough). A
    /// password in it works, but --password-file or FENCELOCK_PASSWORD keep it out of `ps`.
    #[arg(
        long = "url",
        global = true,
        env = "FENCELOCK_URL",
        default_value = DEFAULT_URL
    )]
    urls: Vec<String>,

    /// Redis ACL user to authenticate as (instead of the URL's, or `default`).
    #[arg(long, global = true, env = "FENCELOCK_USER", value_name = "USER")]
    user: Option<String>,

    /// Read the password from FILE (its first line); wins over the FENCELOCK_PASSWORD
    /// environment variable, which wins over a password in the URL.
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_PASSWORD_FILE",
        value_name = "FILE"
    )]
    password_file: Option<PathBuf>,

    /// Say more on stderr: -v what exec waits for even when stderr is not a terminal; -vv
    /// also the library's debug events (-vvv trace events; RUST_LOG chooses them instead).
    #[arg(
        short,
        long,
        global = true,
        action = ArgAction::Count,
        env = "FENCELOCK_VERBOSE",
        value_parser = verbosity_arg,
        conflicts_with = "quiet"
    )]
    verbose: u8,

    /// No notes on stderr, only errors and warnings: exec does not say what it waits for (even
    /// on a terminal), latch count-down not which random id it chose.
    #[arg(
        short,
        long,
        global = true,
        env = "FENCELOCK_QUIET",
        value_parser = switch_arg
    )]
    quiet: bool,

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

    /// Grant only fences above TOKEN (exec, hold, latch set; other commands grant nothing):
    /// after a cluster was re-created or the
    /// locks moved to another server, the highest token storage accepted before (see
    /// docs/safety.md). A lock's own floor still applies; the higher one wins.
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_FENCE_FLOOR",
        value_name = "TOKEN",
        value_parser = fence_floor_arg
    )]
    fence_floor: Option<FenceToken>,

    /// exec and hold only: each --url is a separate deployment (a standalone server, or one seed node of
    /// a cluster), and NAME is a quorum lock over them, granted by a majority (an odd number of
    /// at least 3 deployments).
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_QUORUM",
        value_parser = switch_arg
    )]
    quorum: bool,

    #[command(subcommand)]
    command: Command,
}

const EXIT_CODES: &str = "Exit status of exec: the command's own; 75 not acquired within \
--timeout (with --quorum also when fewer than a majority of the deployments answer); 76 too few \
replicas confirmed; 70 lock lost while the command ran (the command is terminated) or found \
lost at the release; 64 bad input; 69 Redis unreachable (or not answering a call other than \
the acquire); 127 the command cannot be started; \
130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP), 131 (SIGQUIT) when the signal arrived while \
connecting or waiting for the lock (nothing of the wait stays held; fencelock then dies by the \
signal, as a shell reports it, so a calling script stops at Ctrl-C; SIGQUIT exits 131).

hold prints the token once held and exits 0 after releasing on SIGINT, SIGTERM or SIGHUP; 70 \
the lock was lost while held (expired or force-unlocked); 75, 64, 69 and 128+N as for exec.

exec runs the command in its own process group: a lost lock terminates the whole group, a \
guardian process kills it if fencelock dies, and SIGINT, SIGTERM, SIGHUP and SIGQUIT are \
forwarded to it. Durations: 300ms, 2s, 1.5s, 1m30s, 2h 15m, 0.

latch wait exits 0 once the latch is open, 75 if it is not open within --timeout, 128+N on \
signal N while waiting.

status, unlock --force, list and top exit 0 (held or not; unlock prints what it freed), 64 for \
bad input (unlock without --force), 69 when Redis cannot be reached, does not answer or refuses \
(a missing ACL permission is named; list skips a foreign key under the prefix with a warning).

Credentials: --user or FENCELOCK_USER; the password from --password-file, FENCELOCK_PASSWORD \
or the URL (redis://user:password@host:port). They are never printed.

Switches in the environment (FENCELOCK_FAIR, ...) take 1/true (on) or 0/false/empty (off); \
anything else exits 64 naming the variable.

--json output of every command: docs/cli-json.md.";

#[derive(Subcommand, Debug)]
enum Command {
    /// Run CMD while holding lock NAME (with --permits N: one permit of semaphore NAME; with
    /// several NAMEs: all those mutexes, or fair locks with --fair, or read or write holds with
    /// --read or --write, as one multi-lock); CMD gets FENCELOCK_TOKEN and
    /// FENCELOCK_NAME (space-separated for several names, in the order given; and
    /// FENCELOCK_PERMIT) and runs in its own process group, which dies with fencelock.
    #[command(
        override_usage = "fencelock exec [OPTIONS] NAME CMD [ARGS]...\n       fencelock exec \
                          [OPTIONS] NAME... -- CMD [ARGS]..."
    )]
    Exec(exec::ExecArgs),
    /// Take lock NAME (kinds and options as for exec), print its token on stdout as soon as it
    /// is held, keep it (watchdog on) until SIGINT, SIGTERM or SIGHUP, release it, exit 0; 70
    /// if it was lost while held, 75 if not acquired within --timeout.
    Hold(hold::HoldArgs),
    /// Print the Lua source of one of fencelock's scripts (acquire, release, extend, reenter,
    /// renew, fenced_set, semaphore_acquire, ...), e.g. to `SCRIPT LOAD "$(fencelock script acquire)"` it or benchmark
    /// it; the text without its final newline has the SHA1 fencelock sends with EVALSHA.
    Script(script::ScriptArgs),
    /// Print the slot and the Redis key lock NAME uses.
    Slot(slot::SlotArgs),
    /// Countdown latches: `latch set NAME COUNT`, `latch count-down NAME [--id ID]`, `latch
    /// wait NAME [--timeout D]` (exit 75 if not open in time).
    Latch(latch::LatchArgs),
    /// Print a completion script for SHELL, e.g. `fencelock completions bash >
    /// /etc/bash_completion.d/fencelock`, or `source <(fencelock completions zsh)`.
    Completions(completions::CompletionsArgs),
    /// Show lock NAME (with --read/--write, --fair, --permits N, --latch: that primitive):
    /// held or free, fence, lease left, holds, waiters; one line, or --json one object. Exit 0
    /// whether held or not.
    Status(status::StatusArgs),
    /// Free lock NAME whoever holds it (needs --force): the fence is kept, so the next grant
    /// is higher, waiters are woken, the old holder finds the lock lost. A latch is opened.
    Unlock(unlock::UnlockArgs),
    /// List every lock under the prefix on every master (SCAN, bounded by --max-keys), with
    /// the fields of status.
    List(list::ListArgs),
    /// A live view of the locks under the prefix (--prefix), refreshed every second: name,
    /// kind, state, lease left, fence, waiters, grants per second. q or Ctrl-C quits. With
    /// --once, or when stdout is not a terminal, one plain frame (or --json one document).
    Top(top::TopArgs),
    /// Print the man page (roff) on stdout, or with --dir write fencelock.1 and one page per
    /// subcommand into DIR (`scripts/install.sh` does).
    #[command(hide = true)]
    Man(man::ManArgs),
}

/// clap value parser for `-v` (the count clap keeps) and `FENCELOCK_VERBOSE` (a count, or a
/// boolean word: true/yes/on is 1, false/no/off/empty is 0).
fn verbosity_arg(text: &str) -> Result<u8, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "false" | "no" | "off" => Ok(0),
        "true" | "yes" | "on" => Ok(1),
        number => number.parse().map_err(|_| {
            format!("{text:?} is not a verbosity: use a count (0, 1, 2, 3) or true/false")
        }),
    }
}

/// The CLI definition: every environment variable's value is kept out of `--help` (URLs and
/// paths may carry secrets), for every argument of every subcommand.
fn cli_command() -> clap::Command {
    fn hide_env_values(command: clap::Command) -> clap::Command {
        command
            .mut_args(|arg| arg.hide_env_values(true))
            .mut_subcommands(hide_env_values)
    }
    hide_env_values(Cli::command())
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

/// The user and password to authenticate with, beside any in the URLs.
#[derive(Clone, Default)]
struct Credentials {
    user: Option<String>,
    password: Option<String>,
}

impl Credentials {
    /// The credentials of the global options: the password from `--password-file`, else from
    /// `FENCELOCK_PASSWORD`. Every password known (the URLs' too) is registered for redaction.
    /// A command that does not `connect` reads no file.
    fn read(cli: &Cli, connect: bool) -> Result<Self, String> {
        for url in &cli.urls {
            secrets::remember_url(url);
        }
        if let Ok(password) = std::env::var("FENCELOCK_PASSWORD") {
            secrets::remember(&password);
        }
        if !connect {
            return Ok(Self::default());
        }
        let password = match &cli.password_file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|err| {
                    format!(
                        "cannot read the password file {} (--password-file / \
                         FENCELOCK_PASSWORD_FILE): {err}",
                        path.display()
                    )
                })?;
                let line = text.lines().next().unwrap_or_default().to_owned();
                if line.is_empty() {
                    let what = if text.trim().is_empty() {
                        "is empty"
                    } else {
                        "has an empty first line (only the first line is read)"
                    };
                    return Err(format!(
                        "the password file {} {what}: write the password on its first line",
                        path.display()
                    ));
                }
                Some(line)
            }
            None => std::env::var("FENCELOCK_PASSWORD")
                .ok()
                .filter(|p| !p.is_empty()),
        };
        if let Some(password) = &password {
            secrets::remember(password);
        }
        Ok(Self {
            user: cli.user.clone(),
            password,
        })
    }
}

/// Where and how every command connects: the global options that reach the client.
struct Connection {
    urls: Vec<String>,
    prefix: String,
    tls: TlsArgs,
    credentials: Credentials,
    fence_floor: Option<FenceToken>,
}

impl Connection {
    /// A client builder for these options.
    fn builder(self) -> ClientBuilder {
        self.builder_for(self.urls.clone())
    }

    /// A client builder for these options on `urls` alone.
    fn builder_for(&self, urls: Vec<String>) -> ClientBuilder {
        let mut builder = Client::builder(urls).prefix(self.prefix.clone());
        if let Some(floor) = self.fence_floor {
            builder = builder.fence_floor(floor);
        }
        if let Some(user) = &self.credentials.user {
            builder = builder.username(user);
        }
        if let Some(password) = &self.credentials.password {
            builder = builder.password(password);
        }
        if let Some(ca) = &self.tls.ca {
            builder = builder.tls_ca_file(ca);
        }
        if let (Some(cert), Some(key)) = (&self.tls.cert, &self.tls.key) {
            builder = builder.tls_client_cert_files(cert, key);
        }
        builder
    }

    /// What exec and hold lock on: one deployment, or with `--quorum` one per URL.
    fn target(self, quorum: bool) -> exec::Target {
        if quorum {
            exec::Target::Quorum(
                self.urls
                    .iter()
                    .map(|url| self.builder_for(vec![url.clone()]))
                    .collect(),
            )
        } else {
            exec::Target::Single(self.builder())
        }
    }
}

/// Parses `--fence-floor`: a fence token from 1 to [`MAX_FLOOR`].
fn fence_floor_arg(text: &str) -> Result<FenceToken, String> {
    let floor: FenceToken = text.parse().map_err(|err| format!("{err}"))?;
    if floor > MAX_FLOOR {
        return Err(format!(
            "{floor} is above {MAX_FLOOR}, too close to the largest token to leave room for \
             later grants: pass the highest token your storage has accepted"
        ));
    }
    Ok(floor)
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

/// Redis's ACL refusal in an error's chain (`NOPERM` for a command fencelock sent, or a
/// script's "can't run this command"), as a message naming what is missing.
fn missing_permission(error: &Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(err) = cause {
        if let Some(redis) = err.downcast_ref::<redis::RedisError>() {
            if let Some(what) = acl_refusal(redis) {
                return Some(format!(
                    "permission denied by the Redis ACL: the user may not {what}; grant it (the \
                     rules each command needs are in the README's \"ACL\" section)"
                ));
            }
        }
        cause = err.source();
    }
    None
}

/// What an ACL refusal says the user may not do, or `None` for another error.
fn acl_refusal(error: &redis::RedisError) -> Option<String> {
    let text = error.to_string();
    let quoted = |text: &str| text.split('\'').nth(1).map(str::to_owned);
    if error.code() == Some("NOPERM") {
        let detail = error.detail().unwrap_or(&text);
        return Some(if detail.contains("command") {
            let command = quoted(detail).unwrap_or_else(|| detail.to_owned());
            format!("run the command {} (+{command})", command.to_uppercase())
        } else if detail.contains("channel") {
            "use a channel under the prefix (&PREFIX:*)".to_owned()
        } else if detail.contains("key") {
            "access a key under the prefix (~PREFIX:*)".to_owned()
        } else {
            format!("do this (Redis said: NOPERM {detail})")
        });
    }
    if text.contains("cannot read cluster_my_epoch from CLUSTER INFO") {
        // The fence rule calls CLUSTER INFO under pcall and reports this instead of NOPERM.
        return Some(
            "run CLUSTER INFO from a script (+cluster|info: the epoch and epoch-clock fence \
             modes read the master's config epoch)"
                .to_owned(),
        );
    }
    if !text.contains("The user executing the script can't") {
        return None;
    }
    if text.contains("access at least one of the keys") {
        return Some("access a key under the prefix (~PREFIX:*) from a script".to_owned());
    }
    if text.contains("channel") {
        return Some("publish to a channel under the prefix (&PREFIX:*) from a script".to_owned());
    }
    // Redis does not say which command a script was refused: name the script's commands.
    let script = text
        .split("script: ")
        .nth(1)
        .map(|rest| rest.chars().take(40).collect::<String>())
        .and_then(|sha| fencelock::lua_scripts().find(|s| s.sha1 == sha));
    Some(match script {
        Some(script) => format!(
            "run one of the commands fencelock's script {} calls: {} (Redis does not say \
             which; its ACL LOG does)",
            script.name,
            script_commands(script.source).join(" ")
        ),
        None => "run a command one of fencelock's scripts calls (Redis does not say which; \
                 its ACL LOG does)"
            .to_owned(),
    })
}

/// The commands a Lua script calls (`redis.call('HSET', ...)`), as `+hset` ACL rules.
fn script_commands(source: &str) -> Vec<String> {
    let mut commands: Vec<String> = source
        .split("call(")
        .skip(1)
        .filter_map(|rest| {
            let rest = rest.trim_start().strip_prefix(['\'', '"'])?;
            let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
            (!name.is_empty()).then(|| format!("+{}", name.to_lowercase()))
        })
        .collect();
    commands.sort();
    commands.dedup();
    commands
}

/// Prints a one-line error with its causes and returns the exit code for it.
pub fn fail(error: &Error) -> ExitCode {
    if let Some(line) = missing_permission(error) {
        say!("fencelock: {}", secrets::redact(&line));
        return ExitCode::from(code::UNAVAILABLE);
    }
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
    // Redacted first (a password may hold runs of spaces), then on one line: a cause may carry
    // newlines (a parse error quoting what the server sent).
    let line = secrets::redact(&line);
    let line = line.split_whitespace().collect::<Vec<_>>().join(" ");
    say!("fencelock: {line}");
    ExitCode::from(match error {
        Error::Busy { .. } => code::NOT_ACQUIRED,
        // A call that did not take the lock in time: not acquired within --timeout (with
        // --quorum, fewer than a majority answered). Any other call Redis did not answer: the
        // node is unreachable.
        Error::Timeout { operation, .. } if operation.acquires() => code::NOT_ACQUIRED,
        // Refused until its slot's migration ends, and the timeout came first.
        Error::Redis {
            operation, source, ..
        } if operation.acquires() && source.code() == Some("TRYAGAIN") => code::NOT_ACQUIRED,
        Error::ReplicasNotConfirmed { .. } => code::REPLICAS,
        Error::InvalidName { .. }
        | Error::InvalidOptions { .. }
        | Error::InvalidConfig { .. }
        | Error::LimitMismatch { .. }
        | Error::LimitBelowCount { .. } => code::USAGE,
        Error::Expired { .. } | Error::ForceUnlocked { .. } | Error::NotOwner { .. } => {
            code::LOCK_LOST
        }
        Error::LatchNotOpen { .. } => code::NOT_ACQUIRED,
        Error::CountDownRefused { .. } => code::USAGE,
        _ => code::UNAVAILABLE,
    })
}

/// Runs `work` on a current-thread runtime (69 when none can be built).
fn block_on(work: impl Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(work),
        Err(err) => {
            say!("fencelock: cannot start the async runtime: {err}");
            ExitCode::from(code::UNAVAILABLE)
        }
    }
}

/// Prints `value` as one line of JSON.
pub fn print_json(value: &impl Serialize) -> ExitCode {
    match serde_json::to_string(value) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            say!("fencelock: cannot write JSON: {err}");
            ExitCode::from(code::UNAVAILABLE)
        }
    }
}

/// The node URLs of the `--url` values (or of `FENCELOCK_URL`): a value may list several,
/// separated by commas. A comma that no URL scheme follows belongs to the URL before it, so a
/// password holding one stays whole (and is redacted whole). Empty values are left out, and
/// none at all (`FENCELOCK_URL=`) is the default URL.
fn split_urls(values: &[String]) -> Vec<String> {
    let values: Vec<&String> = values.iter().filter(|v| !v.trim().is_empty()).collect();
    if values.is_empty() {
        return vec![DEFAULT_URL.to_owned()];
    }
    let starts_url = |piece: &str| {
        piece.split_once("://").is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
        })
    };
    let mut urls: Vec<String> = Vec::new();
    for value in values {
        let first = urls.len();
        for piece in value.split(',') {
            let joins = urls.len() > first && !starts_url(piece);
            match urls.last_mut() {
                Some(url) if joins => {
                    url.push(',');
                    url.push_str(piece);
                }
                _ => urls.push(piece.to_owned()),
            }
        }
    }
    urls
}

/// Parses the command line; `Err` carries the exit code after printing help, the version or a
/// usage error.
fn parse() -> Result<Cli, ExitCode> {
    let argv = argv::command_after_name(std::env::args_os().collect(), &Cli::command());
    let parse = |command: clap::Command| {
        command
            .try_get_matches_from(&argv)
            .and_then(|mut matches| Cli::from_arg_matches_mut(&mut matches))
    };
    let mut command = cli_command();
    let mut parsed = parse(command.clone());
    // A flag on the command line overrides an environment variable it conflicts with
    // (`FENCELOCK_QUIET=1 fencelock -v …` is verbose): the line is parsed again with that
    // variable not read (each round drops one; a handful at most conflict).
    for _ in 0..8 {
        let Err(err) = &parsed else { break };
        let Some(flag) = argv::overridden_flag(err, &command, &argv) else {
            break;
        };
        command = argv::without_env(command, &flag);
        parsed = parse(command.clone());
    }
    match parsed {
        Ok(mut cli) => {
            cli.urls = split_urls(&cli.urls);
            Ok(cli)
        }
        Err(err) if !err.use_stderr() => {
            let _ = err.print();
            Err(ExitCode::SUCCESS)
        }
        Err(err) if argv::env_error(&err, &Cli::command(), &argv).is_some() => {
            let line = argv::env_error(&err, &Cli::command(), &argv).unwrap_or_default();
            say!("fencelock: {}", secrets::redact(&line));
            Err(ExitCode::from(code::USAGE))
        }
        Err(err) if err.kind() == clap::error::ErrorKind::ValueValidation => {
            // One line: "invalid value '5ms' for '--ttl <TTL>': <why>".
            let text = err.render().to_string();
            let line = text.lines().next().unwrap_or_default();
            say!(
                "fencelock: {}",
                secrets::redact(line.trim_start_matches("error: "))
            );
            Err(ExitCode::from(code::USAGE))
        }
        Err(err) => {
            let _ = err.print();
            Err(ExitCode::from(code::USAGE))
        }
    }
}

/// With -vv (debug), -vvv (trace) or `RUST_LOG` (its filter), prints the library's `tracing`
/// events on stderr, passwords redacted.
fn init_tracing(verbose: u8) {
    use tracing_subscriber::EnvFilter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(spec),
        _ => match verbose {
            0 | 1 => return,
            2 => EnvFilter::try_new("fencelock=debug"),
            _ => EnvFilter::try_new("fencelock=trace"),
        },
    };
    let filter = match filter {
        Ok(filter) => filter,
        Err(err) => {
            say!("fencelock: RUST_LOG is not a usable filter ({err}): no events shown");
            return;
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| secrets::RedactingStderr)
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn main() -> ExitCode {
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == group::GUARDIAN_ARG)
    {
        return group::guardian_main();
    }
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let locking = matches!(cli.command, Command::Exec(_) | Command::Hold(_));
    if cli.quorum && !locking {
        say!(
            "fencelock: --quorum applies to exec and hold only: run other commands per deployment"
        );
        return ExitCode::from(code::USAGE);
    }
    if !locking {
        // The printing subcommands end quietly, as Unix tools do, when their reader goes away
        // (`fencelock script acquire | head -1`): Rust ignores SIGPIPE, and println! would
        // panic on the broken pipe. exec and hold keep ignoring it: a closed stderr must not
        // kill the supervisor of a running command or the holder of a lock.
        use nix::sys::signal::{signal, SigHandler, Signal};
        // SAFETY: SIG_DFL installs no handler; no other thread runs yet.
        let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
    }
    let connects = !matches!(
        cli.command,
        Command::Completions(_) | Command::Man(_) | Command::Script(_) | Command::Slot(_)
    );
    let credentials = match Credentials::read(&cli, connects) {
        Ok(credentials) => credentials,
        Err(message) => {
            say!("fencelock: {message}");
            return ExitCode::from(code::USAGE);
        }
    };
    init_tracing(cli.verbose);
    let connection = Connection {
        urls: cli.urls,
        prefix: cli.prefix,
        tls: cli.tls,
        credentials,
        fence_floor: cli.fence_floor,
    };
    let code = match cli.command {
        Command::Completions(args) => completions::run(args),
        Command::Man(args) => man::run(args),
        Command::Script(args) => script::run(args),
        Command::Slot(args) => slot::run(&connection.prefix, args),
        Command::Exec(mut args) => {
            args.lock.verbose = cli.verbose > 0;
            args.lock.quiet = cli.quiet;
            block_on(exec::run(connection.target(cli.quorum), args))
        }
        Command::Hold(mut args) => {
            args.lock.verbose = cli.verbose > 0;
            args.lock.quiet = cli.quiet;
            block_on(hold::run(connection.target(cli.quorum), args))
        }
        Command::Latch(mut args) => {
            args.quiet = cli.quiet;
            block_on(latch::run(connection.builder(), args))
        }
        Command::Status(args) => block_on(status::run(connection.builder(), args)),
        Command::Unlock(args) => block_on(unlock::run(connection.builder(), args)),
        Command::List(args) => block_on(list::run(connection.builder(), args)),
        Command::Top(args) => {
            let prefix = connection.prefix.clone();
            block_on(top::run(connection.builder(), prefix, args))
        }
    };
    signals::die_if_ended();
    code
}

pub use argv::switch_arg;

/// clap value parser for durations.
pub fn duration_arg(text: &str) -> Result<Duration, String> {
    duration::parse(text)
}

/// clap value parser for `--timeout`/`-w`: a duration, or a bare number of seconds as
/// flock(1)'s `-w` takes (`-w 5`, `-w 0.5`).
pub fn timeout_arg(text: &str) -> Result<Duration, String> {
    let bare = text.trim();
    if !bare.is_empty() && bare.chars().all(|c| c.is_ascii_digit() || c == '.') {
        if let Ok(seconds) = bare.parse::<f64>() {
            return Duration::try_from_secs_f64(seconds)
                .map_err(|_| format!("{bare} seconds is out of range"));
        }
    }
    duration::parse(text)
}
