//! Operator commands: `status`, `unlock --force`, `list` and `top`.
//!
//! `status` and `unlock --force` print one line (or with `--json` one JSON object) and exit 0
//! whether the primitive was held or not; `list` prints one line (or one JSON array) for every
//! primitive key under the prefix, scanning every master with a bound; `top` redraws a table
//! of them every second until `q` or Ctrl-C. Exit 64 for bad input, 69 when Redis cannot be
//! reached.

use std::collections::HashMap;
use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use fencelock::{Client, ClientBuilder, Inspection, Kind, LockList};
use serde_json::{json, Value};

use crate::{code, duration_arg, fail, PlacementArgs};

/// Which primitive of a name: the mutex unless one of these is given.
#[derive(Args, Debug)]
#[group(multiple = false)]
pub struct KindArgs {
    /// The read-write lock NAME (`:rw`).
    #[arg(long, env = "FENCELOCK_READ", value_parser = crate::switch_arg)]
    read: bool,
    /// The read-write lock NAME (`:rw`), as --read.
    #[arg(long, env = "FENCELOCK_WRITE", value_parser = crate::switch_arg)]
    write: bool,
    /// The fair lock NAME (`:fair`).
    #[arg(long, env = "FENCELOCK_FAIR", value_parser = crate::switch_arg)]
    fair: bool,
    /// The semaphore NAME (`:sem`); N is not checked against the stored limit.
    #[arg(long, env = "FENCELOCK_PERMITS", value_name = "N")]
    permits: Option<u32>,
    /// The countdown latch NAME (`:latch`); unlock --force opens it.
    #[arg(long, env = "FENCELOCK_LATCH", value_parser = crate::switch_arg)]
    latch: bool,
}

impl KindArgs {
    fn kind(&self) -> Kind {
        if self.read || self.write {
            Kind::ReadWrite
        } else if self.fair {
            Kind::Fair
        } else if self.permits.is_some() {
            Kind::Semaphore
        } else if self.latch {
            Kind::Latch
        } else {
            Kind::Mutex
        }
    }
}

/// Arguments of `fencelock status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    kind: KindArgs,
    #[command(flatten)]
    placement: PlacementArgs,
    /// Print one JSON object: name, kind, key, slot, held, fence, lease_ms, holds, waiters, ...
    #[arg(long, env = "FENCELOCK_JSON", value_parser = crate::switch_arg)]
    json: bool,
    /// Lock name.
    name: String,
}

/// Arguments of `fencelock unlock`.
#[derive(Args, Debug)]
pub struct UnlockArgs {
    /// Required: free NAME whoever holds it (the fence is kept, so the next grant is higher;
    /// the old holder finds its lock lost).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    kind: KindArgs,
    #[command(flatten)]
    placement: PlacementArgs,
    /// Print what was freed as one JSON object (the fields of `status --json`).
    #[arg(long, env = "FENCELOCK_JSON", value_parser = crate::switch_arg)]
    json: bool,
    /// Lock name.
    name: String,
}

/// Arguments of `fencelock list`.
#[derive(Args, Debug)]
pub struct ListArgs {
    /// Print one JSON array of objects with the fields of `status --json`.
    #[arg(long, env = "FENCELOCK_JSON", value_parser = crate::switch_arg)]
    json: bool,
    /// Stop after SCAN examined about this many keys in all (a message on stderr says the
    /// list is incomplete).
    #[arg(
        long,
        env = "FENCELOCK_MAX_KEYS",
        default_value_t = 100_000,
        value_name = "N"
    )]
    max_keys: u64,
}

/// Arguments of `fencelock top`.
#[derive(Args, Debug)]
pub struct TopArgs {
    /// How often to refresh.
    #[arg(long, env = "FENCELOCK_INTERVAL", default_value = "1s", value_parser = duration_arg)]
    interval: Duration,
    /// Stop each scan after about this many keys.
    #[arg(
        long,
        env = "FENCELOCK_MAX_KEYS",
        default_value_t = 100_000,
        value_name = "N"
    )]
    max_keys: u64,
}

/// An inspection as the JSON object of `status --json`.
pub fn to_json(found: &Inspection) -> Value {
    json!({
        "name": found.name,
        "kind": found.kind.as_str(),
        "key": found.key,
        "slot": found.slot,
        "held": found.held,
        "fence": found.fence.map(u64::from),
        "lease_ms": found.lease_left.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "holds": found.holds,
        "waiters": found.waiters,
        "readers": found.readers,
        "permits_in_use": found.permits_in_use,
        "permit_limit": found.permit_limit,
        "latch_count": found.latch_count,
        "latch_generation": found.latch_generation.map(u64::from),
        "latch_opened": found.latch_opened.map(u64::from),
    })
}

async fn connect(builder: ClientBuilder) -> Result<Client, ExitCode> {
    builder.connect().await.map_err(|err| fail(&err))
}

/// Runs `fencelock status`.
pub async fn status(builder: ClientBuilder, args: StatusArgs) -> ExitCode {
    let client = match connect(builder).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let placement = args.placement.placement();
    match client
        .inspect_at(args.kind.kind(), &args.name, &placement)
        .await
    {
        Ok(found) if args.json => {
            println!("{}", to_json(&found));
            ExitCode::SUCCESS
        }
        Ok(found) => {
            println!("{found}");
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    }
}

/// Runs `fencelock unlock --force`.
pub async fn unlock(builder: ClientBuilder, args: UnlockArgs) -> ExitCode {
    if !args.force {
        eprintln!(
            "fencelock: unlock needs --force: it frees {} whoever holds it (see `fencelock status`)",
            args.name
        );
        return ExitCode::from(code::USAGE);
    }
    let client = match connect(builder).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let placement = args.placement.placement();
    match client
        .force_unlock_at(args.kind.kind(), &args.name, &placement)
        .await
    {
        Ok(found) if args.json => {
            println!("{}", to_json(&found));
            ExitCode::SUCCESS
        }
        Ok(found) if found.held => {
            let verb = if found.kind == Kind::Latch {
                "opened"
            } else {
                "freed"
            };
            println!("{verb}: {found}");
            ExitCode::SUCCESS
        }
        Ok(found) => {
            println!("nothing to free: {found}");
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    }
}

fn truncation_note(list: &LockList) {
    if list.truncated {
        eprintln!(
            "fencelock: stopped after scanning about {} keys (--max-keys): the list is incomplete",
            list.scanned
        );
    }
}

/// Runs `fencelock list`.
pub async fn list(builder: ClientBuilder, args: ListArgs) -> ExitCode {
    let client = match connect(builder).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    match client.list_locks(args.max_keys).await {
        Ok(list) => {
            if args.json {
                let all: Vec<Value> = list.locks.iter().map(to_json).collect();
                println!("{}", Value::Array(all));
            } else {
                for found in &list.locks {
                    println!("{found}");
                }
            }
            truncation_note(&list);
            for key in &list.skipped {
                eprintln!(
                    "fencelock: warning: skipped key {key:?}: it has a lock's name under the \
                     prefix but is not a lock (another program's key?)"
                );
            }
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    }
}

/// A fence of a clock rule: a µs timestamp (clock mode), plus a multiple of 2^34 (epoch-clock
/// mode), whose clock part is within an hour of now. Fence deltas then measure time, not
/// grants. (The epoch term's 2^34 µs is 4.8 hours, so an hour either side is unambiguous;
/// counter and epoch fences are far below today's µs.)
fn is_clock_fence(fence: u64) -> bool {
    const HOUR: u64 = 3_600_000_000;
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let earliest = now_us.saturating_sub(HOUR);
    fence >= earliest && (fence - earliest) % (1 << 34) < 2 * HOUR
}

/// Grants per second between two refreshes: the fence delta over the time between them for
/// counter and epoch fences; for clock-rule fences (µs timestamps, whose deltas measure time)
/// only "at least one grant" can be seen: `≥` one per interval when the fence changed.
fn grants_per_second(before: Option<(u64, Instant)>, fence: Option<u64>, now: Instant) -> String {
    let (Some((old, at)), Some(new)) = (before, fence) else {
        return "-".into();
    };
    let seconds = now.duration_since(at).as_secs_f64().max(0.001);
    if new == old {
        "0".into()
    } else if new < old {
        "-".into()
    } else if is_clock_fence(new) {
        format!("≥{:.1}", 1.0 / seconds)
    } else {
        format!("{:.1}", (new - old) as f64 / seconds)
    }
}

fn cell(text: &str, width: usize) -> String {
    let mut out: String = text.chars().take(width).collect();
    let len = out.chars().count();
    out.extend(std::iter::repeat_n(' ', width - len));
    out
}

/// One frame of `top`: the table of `list`, with grants per second from `last` (updated).
fn frame(
    prefix: &str,
    list: &LockList,
    last: &mut HashMap<String, (u64, Instant)>,
    interval: Duration,
) -> String {
    let now = Instant::now();
    let mut out = String::from("\x1b[H\x1b[2J");
    out.push_str(&format!(
        "fencelock top   prefix {prefix}   {} locks   every {:?}   q or Ctrl-C quits\r\n",
        list.locks.len(),
        interval
    ));
    if list.truncated {
        out.push_str(&format!(
            "(stopped after scanning about {} keys: --max-keys)\r\n",
            list.scanned
        ));
    }
    out.push_str(&format!(
        "\r\n{} {} {} {} {} {} {}\r\n",
        cell("NAME", 32),
        cell("KIND", 9),
        cell("STATE", 6),
        cell("LEASE", 8),
        cell("FENCE", 17),
        cell("WAITERS", 7),
        "GRANTS/S"
    ));
    let mut seen = HashMap::new();
    for found in &list.locks {
        let fence = found.fence.map(u64::from);
        let rate = grants_per_second(last.get(&found.key).copied(), fence, now);
        if let Some(fence) = fence {
            seen.insert(found.key.clone(), (fence, now));
        }
        let state = match (found.kind, found.held) {
            (Kind::Latch, true) => "armed",
            (Kind::Latch, false) => "open",
            (_, true) => "held",
            (_, false) => "free",
        };
        let lease = found
            .lease_left
            .map_or("-".into(), |d| format!("{:.1}s", d.as_secs_f64()));
        let waiters = found.waiters.map_or("-".into(), |n| n.to_string());
        out.push_str(&format!(
            "{} {} {} {} {} {} {}\r\n",
            cell(&found.name, 32),
            cell(found.kind.as_str(), 9),
            cell(state, 6),
            cell(&lease, 8),
            cell(&fence.map_or("-".into(), |f| f.to_string()), 17),
            cell(&waiters, 7),
            rate
        ));
    }
    *last = seen;
    out
}

/// The terminal's settings while `top` runs: no line buffering or echo, so `q` arrives at
/// once; restored on drop. Signals (Ctrl-C) stay on.
struct RawInput {
    saved: Option<libc::termios>,
}

impl RawInput {
    fn enable() -> Self {
        // SAFETY: tcgetattr/tcsetattr on fd 0 with a termios the kernel filled in.
        unsafe {
            if libc::isatty(0) != 1 {
                return Self { saved: None };
            }
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut saved) != 0 {
                return Self { saved: None };
            }
            let mut raw = saved;
            raw.c_lflag &= !(libc::ICANON | libc::ECHO);
            raw.c_cc[libc::VMIN] = 1;
            raw.c_cc[libc::VTIME] = 0;
            libc::tcsetattr(0, libc::TCSANOW, &raw);
            Self { saved: Some(saved) }
        }
    }
}

impl Drop for RawInput {
    fn drop(&mut self) {
        if let Some(saved) = self.saved {
            // SAFETY: restores the settings read in `enable`.
            unsafe {
                libc::tcsetattr(0, libc::TCSANOW, &saved);
            }
        }
    }
}

/// Runs `fencelock top` until `q`, end of input on a terminal, Ctrl-C (SIGINT) or SIGTERM;
/// exits 0.
pub async fn top(builder: ClientBuilder, prefix: String, args: TopArgs) -> ExitCode {
    let client = match connect(builder).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let raw = RawInput::enable();
    let (quit_tx, mut quit) = tokio::sync::mpsc::unbounded_channel::<()>();
    if raw.saved.is_some() {
        // A thread, not a task: a blocking read of the terminal, ended with the process.
        std::thread::spawn(move || {
            let mut byte = [0u8; 1];
            loop {
                // SAFETY: reads one byte into a buffer of one byte.
                let n = unsafe { libc::read(0, byte.as_mut_ptr().cast(), 1) };
                if n <= 0 || byte[0] == b'q' || byte[0] == b'Q' {
                    let _ = quit_tx.send(());
                    return;
                }
            }
        });
    }
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        eprintln!("fencelock: cannot listen for signals");
        return ExitCode::from(code::UNAVAILABLE);
    };
    let mut last = HashMap::new();
    let mut stdout = std::io::stdout();
    let outcome = loop {
        let text = match client.list_locks(args.max_keys).await {
            Ok(list) => frame(&prefix, &list, &mut last, args.interval),
            Err(err) => format!("\x1b[H\x1b[2Jfencelock top: {err}\r\n(retrying)\r\n"),
        };
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
        tokio::select! {
            () = tokio::time::sleep(args.interval) => {}
            _ = quit.recv() => break ExitCode::SUCCESS,
            _ = interrupt.recv() => break ExitCode::SUCCESS,
            _ = terminate.recv() => break ExitCode::SUCCESS,
        }
    };
    drop(raw);
    let _ = stdout.write_all(b"\r\n");
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_fences_give_a_rate_and_clock_fences_a_lower_bound() {
        let then = Instant::now();
        let now = then + Duration::from_secs(2);
        assert_eq!(grants_per_second(Some((100, then)), Some(120), now), "10.0");
        assert_eq!(grants_per_second(Some((100, then)), Some(100), now), "0");
        assert_eq!(grants_per_second(None, Some(100), now), "-");
        let clock = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        assert_eq!(
            grants_per_second(Some((clock - 5, then)), Some(clock), now),
            "≥0.5"
        );
        let epoch_clock = clock + 7 * (1 << 34);
        assert_eq!(
            grants_per_second(Some((epoch_clock - 5, then)), Some(epoch_clock), now),
            "≥0.5"
        );
        let epoch = 7 * (1 << 32) + 120;
        assert_eq!(
            grants_per_second(Some((epoch - 20, then)), Some(epoch), now),
            "10.0"
        );
        assert_eq!(cell("abcdef", 3), "abc");
        assert_eq!(cell("ab", 3), "ab ");
    }
}
