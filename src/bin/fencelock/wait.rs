//! What `exec` and `hold` say while they wait for a lock.
//!
//! On a terminal: one status line on stderr, redrawn in place (`\r` and clear to the end of
//! the line) a few times a second with the time waited of the timeout and the holder's lease
//! left, and erased once the wait ends. With `--verbose` on anything else: one line a second,
//! `fencelock: waiting for NAME: held by another owner, lease ends in 8.2s`.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use fencelock::{HumanDuration, Waiting};

/// How often the terminal's status line is redrawn.
pub const REDRAW: Duration = Duration::from_millis(250);

/// The waiting display of one acquisition.
#[derive(Clone)]
pub struct Progress {
    state: Arc<Mutex<State>>,
    /// Redraw one line in place (stderr is a terminal) rather than print one line a second.
    in_place: bool,
}

struct State {
    started: Instant,
    timeout: Duration,
    /// Who holds what is waited for, e.g. "held by another owner".
    holder: String,
    /// The last report: the lock's name, when it came and the holder's lease left then.
    seen: Option<(String, Instant, Duration)>,
    /// When the last line was printed (one line a second off a terminal).
    printed: Option<Instant>,
    /// Whether the terminal shows the status line now.
    drawn: bool,
}

impl Progress {
    /// A display for a wait of up to `timeout` for a lock `holder` describes; `None` when
    /// nothing is to be shown (`quiet`, or stderr is no terminal and not `verbose`).
    pub fn new(holder: String, timeout: Duration, verbose: bool, quiet: bool) -> Option<Self> {
        use std::io::IsTerminal;
        let in_place = std::io::stderr().is_terminal();
        if quiet || !(verbose || in_place) {
            return None;
        }
        Some(Progress {
            state: Arc::new(Mutex::new(State {
                started: Instant::now(),
                timeout,
                holder,
                seen: None,
                printed: None,
                drawn: false,
            })),
            in_place,
        })
    }

    /// Whether the caller should [`redraw`](Self::redraw) every [`REDRAW`].
    pub fn in_place(&self) -> bool {
        self.in_place
    }

    /// The observer for [`fencelock::LockOptions::on_wait`].
    pub fn observer(&self) -> impl Fn(&Waiting<'_>) + Send + Sync + 'static {
        let progress = self.clone();
        move |waiting| {
            let mut state = progress.lock();
            state.seen = Some((waiting.name.to_owned(), Instant::now(), waiting.lease_left));
            if progress.in_place {
                draw(&mut state);
            } else if state
                .printed
                .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
            {
                state.printed = Some(Instant::now());
                say!(
                    "fencelock: waiting for {}: {}, lease ends in {}",
                    waiting.name,
                    state.holder,
                    HumanDuration(waiting.lease_left)
                );
            }
        }
    }

    /// Redraws the terminal's status line with the time waited now (once the lock was found
    /// held).
    pub fn redraw(&self) {
        if self.in_place {
            draw(&mut self.lock());
        }
    }

    /// Erases the terminal's status line, if shown.
    pub fn clear(&self) {
        let mut state = self.lock();
        if state.drawn {
            state.drawn = false;
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[K");
            let _ = stderr.flush();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Draws the status line over the previous one.
fn draw(state: &mut State) {
    let Some((name, at, lease)) = &state.seen else {
        return;
    };
    let lease_left = lease.saturating_sub(at.elapsed());
    let line = format!(
        "fencelock: waiting for {name}: {}, lease ends in {} ({} of {})",
        state.holder,
        HumanDuration(lease_left),
        HumanDuration(Duration::from_secs(state.started.elapsed().as_secs())),
        HumanDuration(state.timeout),
    );
    let mut stderr = std::io::stderr().lock();
    let _ = write!(stderr, "\r\x1b[K{line}");
    let _ = stderr.flush();
    state.drawn = true;
}
