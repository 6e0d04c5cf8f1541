//! `fencelock top`: a live table of the locks under the prefix, redrawn every `--interval` until
//! `q`, Esc or Ctrl-C; with `--once`, `--json` or a stdout that is not a terminal one plain
//! frame (or one JSON document: `docs/cli-json.md`). Exit 0, 64 for bad input, 69 when Redis
//! cannot be reached.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use fencelock::{Client, ClientBuilder, HumanDuration, Inspection, Kind, LockList, Printable};
use serde::Serialize;
use unicode_width::UnicodeWidthChar;

use crate::prelude::{connect, OutputArgs, ScanArgs};
use crate::{code, duration_arg, fail, print_json, secrets};

/// Arguments of `fencelock top`. (`mut_arg` moves the argument it changes to the end: `once` is
/// moved too, so the completion scripts keep the order of the fields.)
#[derive(Args, Debug)]
#[command(mut_arg("max_keys", |arg| arg.help("Stop each scan after about this many keys")))]
#[command(mut_arg("once", |arg| arg))]
#[command(mut_arg("json", |arg| arg.help(
    "With --once (implied): print the frame as one JSON document (prefix, scanned, truncated, \
     locks: the fields of `status --json` plus state and grants_per_second)"
)))]
pub struct TopArgs {
    /// How often to refresh (a shorter one than 100ms refreshes every 100ms: each frame scans
    /// the prefix and reads every lock).
    #[arg(long, env = "FENCELOCK_INTERVAL", default_value = "1s", value_parser = interval_arg)]
    interval: Duration,
    #[command(flatten)]
    scan: ScanArgs,
    /// Print one frame as plain text (no terminal codes) and exit 0; what top does when stdout
    /// is not a terminal.
    #[arg(long)]
    once: bool,
    #[command(flatten)]
    output: OutputArgs,
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

/// `text` cut or padded with spaces to `width` terminal columns (wide characters count two).
fn cell(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = c.width().unwrap_or(0);
        if used + w > width {
            break;
        }
        out.push(c);
        used += w;
    }
    out.extend(std::iter::repeat_n(' ', width - used));
    out
}

/// Width of top's LEASE column: any lease a Redis millisecond expiry can hold, in its largest
/// unit (`292271023y`), fits.
const LEASE_WIDTH: usize = 10;

/// A lease as top shows it: rounded for people (`8.2s`, `2m 5s`), only its largest unit when
/// both do not fit the column (`146135511y 191d` is `146135511y`).
fn lease_cell(lease: Duration) -> String {
    let text = HumanDuration(lease).to_string();
    if text.chars().count() <= LEASE_WIDTH {
        return text;
    }
    text.split(' ').next().unwrap_or_default().to_owned()
}

/// How wide `text` is on a terminal.
/// The shortest `--interval`: a frame costs Redis a scan of the prefix and a read of every
/// lock, so a shorter one is a busy loop against the server.
const MIN_INTERVAL: Duration = Duration::from_millis(100);

fn interval_arg(text: &str) -> Result<Duration, String> {
    Ok(duration_arg(text)?.max(MIN_INTERVAL))
}

fn columns(text: &str) -> usize {
    text.chars().map(|c| c.width().unwrap_or(0)).sum()
}

/// A lock's state word: held/free, or armed/open for a latch.
fn state(found: &Inspection) -> &'static str {
    match (found.kind, found.held) {
        (Kind::Latch, true) => "armed",
        (Kind::Latch, false) => "open",
        (_, true) => "held",
        (_, false) => "free",
    }
}

/// The columns after NAME, with their widths (the last is not padded).
const COLUMNS: [(&str, usize); 6] = [
    ("KIND", 9),
    ("STATE", 6),
    ("LEASE", LEASE_WIDTH),
    ("FENCE", 17),
    ("WAITERS", 7),
    ("GRANTS/S", 8),
];

/// How a frame is drawn: live on a terminal of some width, or once as plain text.
#[derive(Clone, Copy)]
enum Screen {
    /// The live view: lines end in `\r\n` (raw mode), NAME fills the width left.
    Live { width: u16 },
    /// `--once`: lines end in `\n`, NAME as wide as the widest name.
    Once,
}

/// One frame of `top`: the table of `list`, with grants per second from `last` (updated).
fn frame(
    prefix: &str,
    list: &LockList,
    last: &mut HashMap<String, (u64, Instant)>,
    interval: Duration,
    screen: Screen,
) -> String {
    let now = Instant::now();
    let (newline, name_width) = match screen {
        Screen::Live { width } => {
            let rest: usize = COLUMNS.iter().map(|(_, w)| w + 1).sum();
            (
                "\r\n",
                usize::from(width).saturating_sub(rest).clamp(16, 64),
            )
        }
        Screen::Once => (
            "\n",
            list.locks
                .iter()
                .map(|found| columns(&Printable(&found.name).to_string()))
                .max()
                .unwrap_or(0)
                .max(4),
        ),
    };
    let mut out = format!(
        "fencelock top   prefix {prefix}   {} locks",
        list.locks.len()
    );
    if matches!(screen, Screen::Live { .. }) {
        out.push_str(&format!(
            "   every {}   q or Ctrl-C quits",
            humantime::format_duration(interval)
        ));
    }
    out.push_str(newline);
    if list.truncated {
        out.push_str(&format!(
            "(stopped after scanning about {} keys: --max-keys){newline}",
            list.scanned
        ));
    }
    if !list.skipped.is_empty() {
        out.push_str(&format!(
            "(skipped {} key(s) with a lock's name under the prefix that are not locks: another \
             program's? fencelock list names them){newline}",
            list.skipped.len()
        ));
    }
    out.push_str(newline);
    let mut header = cell("NAME", name_width);
    for (title, width) in COLUMNS {
        header.push(' ');
        header.push_str(&cell(title, width));
    }
    out.push_str(header.trim_end());
    out.push_str(newline);
    let mut seen = HashMap::new();
    for found in &list.locks {
        let fence = found.fence.map(u64::from);
        let rate = grants_per_second(last.get(&found.key).copied(), fence, now);
        if let Some(fence) = fence {
            seen.insert(found.key.clone(), (fence, now));
        }
        let lease = found.lease_left.map_or("-".into(), lease_cell);
        let waiters = found.waiters.map_or("-".into(), |n| n.to_string());
        let fence = fence.map_or("-".into(), |f| f.to_string());
        let values = [
            found.kind.as_str(),
            state(found),
            &lease,
            &fence,
            &waiters,
            &rate,
        ];
        let mut line = cell(&Printable(&found.name).to_string(), name_width);
        for ((_, width), value) in COLUMNS.iter().zip(values) {
            line.push(' ');
            line.push_str(&cell(value, *width));
        }
        out.push_str(line.trim_end());
        out.push_str(newline);
    }
    *last = seen;
    out
}

/// One row of `top --once --json`: the fields of `status --json`, the state word and the rate
/// (`null`: one frame has no earlier one to compare with).
#[derive(Serialize)]
struct TopRow<'a> {
    #[serde(flatten)]
    lock: &'a Inspection,
    state: &'static str,
    grants_per_second: Option<f64>,
}

/// `top --once --json`.
#[derive(Serialize)]
struct TopDocument<'a> {
    prefix: &'a str,
    scanned: u64,
    truncated: bool,
    locks: Vec<TopRow<'a>>,
}

/// The terminal while the live `top` runs: raw mode (keys arrive at once, unechoed), the
/// alternate screen, no cursor; restored on drop.
struct LiveTerminal {
    raw: bool,
}

impl LiveTerminal {
    fn enter() -> Self {
        let raw = crossterm::terminal::enable_raw_mode().is_ok();
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        );
        Self { raw }
    }

    fn draw(&self, text: &str) {
        use crossterm::{cursor::MoveTo, queue, style::Print, terminal};
        let mut stdout = std::io::stdout();
        let _ = queue!(
            stdout,
            MoveTo(0, 0),
            terminal::Clear(terminal::ClearType::All),
            Print(text)
        );
        let _ = stdout.flush();
    }
}

impl Drop for LiveTerminal {
    fn drop(&mut self) {
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::cursor::Show,
            crossterm::terminal::LeaveAlternateScreen
        );
        if self.raw {
            let _ = crossterm::terminal::disable_raw_mode();
        }
    }
}

/// Whether `event` asks `top` to quit: q, Q, Esc or Ctrl-C (raw mode delivers it as a key).
fn is_quit(event: &crossterm::event::Event) -> bool {
    use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
    let Event::Key(key) = event else {
        return false;
    };
    key.kind != KeyEventKind::Release
        && match key.code {
            KeyCode::Char('q' | 'Q') | KeyCode::Esc => true,
            KeyCode::Char('c' | 'C') => key.modifiers.contains(KeyModifiers::CONTROL),
            _ => false,
        }
}

/// `top --once`: one frame on stdout, plain or JSON.
async fn top_once(client: &Client, prefix: &str, args: &TopArgs) -> ExitCode {
    let list = match client.list_locks(args.scan.max_keys).await {
        Ok(list) => list,
        Err(err) => return fail(&err),
    };
    if args.output.json {
        return print_json(&TopDocument {
            prefix,
            scanned: list.scanned,
            truncated: list.truncated,
            locks: list
                .locks
                .iter()
                .map(|lock| TopRow {
                    lock,
                    state: state(lock),
                    grants_per_second: None,
                })
                .collect(),
        });
    }
    let text = frame(
        prefix,
        &list,
        &mut HashMap::new(),
        args.interval,
        Screen::Once,
    );
    print!("{text}");
    ExitCode::SUCCESS
}

/// Runs `fencelock top` until `q`, Esc, Ctrl-C, SIGINT or SIGTERM, and exits 0; with `--once`,
/// `--json` or a stdout that is not a terminal, prints one frame and exits 0.
pub async fn run(builder: ClientBuilder, prefix: String, args: TopArgs) -> ExitCode {
    let client = match connect(builder).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    if args.once || args.output.json || !std::io::stdout().is_terminal() {
        return top_once(&client, &prefix, &args).await;
    }
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        say!("fencelock: cannot listen for signals");
        return ExitCode::from(code::UNAVAILABLE);
    };
    let terminal = LiveTerminal::enter();
    let (quit_tx, mut quit) = tokio::sync::mpsc::unbounded_channel::<()>();
    if terminal.raw {
        // A thread, not a task: a blocking read of the terminal, ended with the process.
        std::thread::spawn(move || loop {
            match crossterm::event::read() {
                Ok(event) if is_quit(&event) => {
                    let _ = quit_tx.send(());
                    return;
                }
                Ok(_) => {}
                Err(_) => {
                    let _ = quit_tx.send(());
                    return;
                }
            }
        });
    }
    let mut last = HashMap::new();
    loop {
        let width = crossterm::terminal::size().map_or(120, |(width, _)| width);
        let text = match client.list_locks(args.scan.max_keys).await {
            Ok(list) => frame(
                &prefix,
                &list,
                &mut last,
                args.interval,
                Screen::Live { width },
            ),
            Err(err) => secrets::redact(&format!("fencelock top: {err}\r\n(retrying)\r\n")),
        };
        terminal.draw(&text);
        tokio::select! {
            () = tokio::time::sleep(args.interval) => {}
            _ = quit.recv() => break,
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
        }
    }
    drop(terminal);
    ExitCode::SUCCESS
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
        // Wide characters take two columns: padded and cut by columns, not chars.
        assert_eq!(cell("日本", 5), "日本 ");
        assert_eq!(cell("日本語", 5), "日本 ");
    }

    #[test]
    fn leases_fit_their_column_rounded_for_people() {
        assert_eq!(lease_cell(Duration::from_nanos(1_004_063_300)), "1s");
        assert_eq!(lease_cell(Duration::from_millis(8_240)), "8.2s");
        assert_eq!(lease_cell(Duration::from_secs(125)), "2m 5s");
        assert_eq!(lease_cell(fencelock::MAX_TTL), "146135511y");
        let largest = Duration::from_millis(i64::MAX as u64);
        assert_eq!(lease_cell(largest), "292271023y");
        assert!(lease_cell(largest).len() <= LEASE_WIDTH);
    }
}
