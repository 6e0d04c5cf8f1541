//! The process group `exec` runs the command in, and the guardian that kills that group when
//! fencelock dies.
//!
//! fencelock first starts a guardian: itself, re-executed with a hidden argument, as the leader
//! of a new process group, its stdin the read end of a pipe whose write end only fencelock holds
//! (close-on-exec, so neither the guardian nor the command inherits it). The command is then
//! started in the guardian's group. When fencelock exits or dies, however (SIGKILL, the OOM
//! killer), the kernel closes the write end; the guardian's `read` returns end-of-file and it
//! sends SIGKILL to its whole group: the command, everything the command started that stayed in
//! the group, and the guardian itself. The guardian ignores the signals fencelock forwards (and
//! the terminal's stop signals), so it is alive whenever the group is. The command itself also
//! gets `PR_SET_PDEATHSIG` = SIGKILL, which covers the moment between its fork and its joining
//! the group. A process that leaves the group (`setsid`, `setpgid`) escapes the guardian; only
//! the command's direct process keeps its death signal.

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::fcntl::{open, OFlag};
use nix::sys::signal::{killpg, pthread_sigmask, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::stat::Mode;
use nix::unistd::{getpgrp, getpid, getppid, pipe2, tcgetpgrp, tcsetpgrp, Pid};
use tokio::process::{Child, Command};

/// The hidden first argument that turns fencelock into a guardian.
pub const GUARDIAN_ARG: &str = "__fencelock-guardian";

/// Signals the guardian ignores: those fencelock forwards to the group and job-control stops.
const GUARDIAN_IGNORES: [Signal; 7] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGTSTP,
    Signal::SIGTTIN,
    Signal::SIGTTOU,
];

/// The body of the guardian process: waits for end-of-file on stdin, then kills its group.
pub fn guardian_main() -> std::process::ExitCode {
    if getpgrp() != getpid() {
        // Not started by fencelock: never kill a group this process does not lead.
        say!("fencelock: {GUARDIAN_ARG} is internal to fencelock exec");
        return std::process::ExitCode::from(crate::code::USAGE);
    }
    let mut stdin = io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    // Pid 0: this process's own group.
    let _ = killpg(Pid::from_raw(0), Signal::SIGKILL);
    std::process::ExitCode::FAILURE
}

/// A started guardian and its process group, in which the command is to run.
pub struct Group {
    pgid: Pid,
    guardian: Child,
    /// The pipe's write end; closing it makes the guardian kill the group.
    lifeline: Option<OwnedFd>,
    /// fencelock's controlling terminal, if it has one.
    terminal: Option<Terminal>,
    /// Whether the group is the terminal's foreground group by fencelock's doing.
    handed: AtomicBool,
}

impl Group {
    /// Starts the guardian as the leader of a new process group and, when fencelock runs in the
    /// foreground of a terminal, makes that group the terminal's foreground group (so the
    /// command may read from the terminal and gets the terminal's Ctrl-C).
    pub fn start() -> io::Result<Group> {
        let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
        let mut command = Command::new("/proc/self/exe");
        command
            .arg0(OsString::from("fencelock-guardian"))
            .arg(GUARDIAN_ARG)
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .process_group(0);
        // SAFETY: only async-signal-safe calls (signal) between fork and exec. Ignored
        // dispositions survive exec, so the guardian ignores them from its first instruction.
        unsafe {
            command.pre_exec(|| {
                for signal in GUARDIAN_IGNORES {
                    nix::sys::signal::signal(signal, SigHandler::SigIgn)?;
                }
                Ok(())
            });
        }
        let guardian = command.spawn()?;
        drop(command);
        let pgid = guardian
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| io::Error::other("the guardian exited at once"))?;
        let terminal = Terminal::open();
        let handed = terminal.as_ref().is_some_and(|t| t.hand_to(pgid));
        Ok(Group {
            pgid,
            guardian,
            lifeline: Some(write),
            terminal,
            handed: AtomicBool::new(handed),
        })
    }

    /// Makes `command` run in this group, dying with fencelock even before it joins.
    pub fn enter(&self, command: &mut Command) {
        command.process_group(self.pgid.as_raw());
        let parent = getpid();
        // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
                // fencelock died before the death signal was armed.
                if getppid() != parent {
                    return Err(io::Error::other("fencelock exited"));
                }
                Ok(())
            });
        }
    }

    /// Sends `signal` to every process of the group but the guardian (which ignores it), then
    /// SIGCONT, so that a stopped process acts on it too (as shells do for stopped jobs).
    pub fn signal(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
        let _ = killpg(self.pgid, Signal::SIGCONT);
    }

    /// Job control: the command stopped by `signal` (SIGTSTP from the terminal's Ctrl-Z, or
    /// SIGTTIN/SIGTTOU: it used the terminal from the background), so fencelock stops its own
    /// process group, the job a shell knows, by the same signal, as the terminal would have had
    /// that group been in the foreground: the shell then sees the job stopped and gets the
    /// terminal back. Returns once fencelock is continued (`fg`, `bg`, `kill -CONT`), at once if
    /// it cannot be stopped (the signal ignored; an orphaned group, which the kernel does not
    /// stop). The command stays stopped: [`resume`](Self::resume) continues it. Without a
    /// controlling terminal there is no job control: nothing is done and false returned.
    pub fn suspend(&self, signal: Signal) -> bool {
        let Some(terminal) = &self.terminal else {
            return false;
        };
        if self.handed.swap(false, Ordering::Relaxed) {
            terminal.take_back();
        }
        if !crate::signals::ignored(signal) {
            // Pid 0: fencelock's own group. The stop takes effect before the call returns.
            let _ = killpg(Pid::from_raw(0), signal);
        }
        true
    }

    /// Continues the command after [`suspend`](Self::suspend): its group gets the terminal
    /// again if fencelock's group is in the foreground now (`fg`; after `bg` it stays in the
    /// background, where a read of the terminal stops it again), then SIGCONT.
    pub fn resume(&self) {
        if let Some(terminal) = &self.terminal {
            if terminal.hand_to(self.pgid) {
                self.handed.store(true, Ordering::Relaxed);
            }
        }
        let _ = killpg(self.pgid, Signal::SIGCONT);
    }

    /// Processes of the group other than the guardian that have not exited.
    pub fn others_alive(&self) -> bool {
        members(self.pgid.as_raw())
            .into_iter()
            .any(|pid| pid != self.pgid.as_raw())
    }

    /// Waits up to `limit` for every process but the guardian to exit.
    pub async fn wait_empty(&self, limit: Duration) {
        let until = tokio::time::Instant::now() + limit;
        while self.others_alive() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Kills whatever is left of the group (SIGKILL, through the guardian), waits for the
    /// guardian to go and gives the terminal back.
    pub async fn kill(mut self) {
        drop(self.lifeline.take());
        if tokio::time::timeout(Duration::from_secs(5), self.guardian.wait())
            .await
            .is_err()
        {
            // The guardian did not act (stopped with SIGSTOP?): do its work.
            self.signal(Signal::SIGKILL);
            let _ = self.guardian.wait().await;
        }
        if self.handed.swap(false, Ordering::Relaxed) {
            if let Some(terminal) = &self.terminal {
                terminal.take_back();
            }
        }
    }
}

/// fencelock's controlling terminal.
struct Terminal {
    fd: OwnedFd,
}

impl Terminal {
    /// The controlling terminal; `None` without one.
    fn open() -> Option<Terminal> {
        let fd = open(
            "/dev/tty",
            OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        Some(Terminal { fd })
    }

    /// Makes `pgid` the terminal's foreground group if fencelock's own group is in the
    /// foreground now; false otherwise (running in the background).
    fn hand_to(&self, pgid: Pid) -> bool {
        let ours = tcgetpgrp(&self.fd).is_ok_and(|foreground| foreground == getpgrp());
        ours && tcsetpgrp(&self.fd, pgid).is_ok()
    }

    /// Makes fencelock's group the foreground group again (SIGTTOU blocked meanwhile, as
    /// fencelock is now in the background).
    fn take_back(&self) {
        let mut block = SigSet::empty();
        block.add(Signal::SIGTTOU);
        let mut old = SigSet::empty();
        let blocked = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&block), Some(&mut old));
        let _ = tcsetpgrp(&self.fd, getpgrp());
        if blocked.is_ok() {
            let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
        }
    }
}

/// Pids of the live (not zombie) processes in process group `pgid`, from `/proc`.
pub fn members(pgid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
            let state = fields.next()?;
            let group: i32 = fields.nth(1)?.parse().ok()?;
            (group == pgid && state != "Z" && state != "X").then_some(pid)
        })
        .collect()
}
