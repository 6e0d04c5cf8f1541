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
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// The hidden first argument that turns fencelock into a guardian.
pub const GUARDIAN_ARG: &str = "__fencelock-guardian";

/// Signals the guardian ignores: those fencelock forwards to the group and job-control stops.
const GUARDIAN_IGNORES: [libc::c_int; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGTSTP,
    libc::SIGTTIN,
    libc::SIGTTOU,
];

/// The body of the guardian process: waits for end-of-file on stdin, then kills its group.
pub fn guardian_main() -> std::process::ExitCode {
    // SAFETY: plain system calls without memory effects.
    let leader = unsafe { libc::getpgrp() == libc::getpid() };
    if !leader {
        // Not started by fencelock: never kill a group this process does not lead.
        eprintln!("fencelock: {GUARDIAN_ARG} is internal to fencelock exec");
        return std::process::ExitCode::from(crate::code::USAGE);
    }
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: reads into a local buffer of the given length.
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n > 0 || (n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted) {
            continue;
        }
        break;
    }
    // SAFETY: kill(2) has no memory effects; 0 is this process's own group.
    unsafe {
        libc::kill(0, libc::SIGKILL);
    }
    std::process::ExitCode::FAILURE
}

/// A started guardian and its process group, in which the command is to run.
pub struct Group {
    pgid: libc::pid_t,
    guardian: Child,
    /// The pipe's write end; closing it makes the guardian kill the group.
    lifeline: Option<OwnedFd>,
    terminal: Option<Terminal>,
}

impl Group {
    /// Starts the guardian as the leader of a new process group and, when fencelock runs in the
    /// foreground of a terminal, makes that group the terminal's foreground group (so the
    /// command may read from the terminal and gets the terminal's Ctrl-C).
    pub fn start() -> io::Result<Group> {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned by nobody else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
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
                    libc::signal(signal, libc::SIG_IGN);
                }
                Ok(())
            });
        }
        let guardian = command.spawn()?;
        drop(command);
        let pgid = guardian
            .id()
            .and_then(|pid| libc::pid_t::try_from(pid).ok())
            .ok_or_else(|| io::Error::other("the guardian exited at once"))?;
        Ok(Group {
            pgid,
            guardian,
            lifeline: Some(write),
            terminal: Terminal::hand_to(pgid),
        })
    }

    /// Makes `command` run in this group, dying with fencelock even before it joins.
    pub fn enter(&self, command: &mut Command) {
        command.process_group(self.pgid);
        // SAFETY: getpid is async-signal-safe; it is evaluated here, in fencelock.
        let parent = unsafe { libc::getpid() };
        // SAFETY: only async-signal-safe calls (prctl, getppid) between fork and exec.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // fencelock died before the death signal was armed.
                if libc::getppid() != parent {
                    return Err(io::Error::other("fencelock exited"));
                }
                Ok(())
            });
        }
    }

    /// Sends `signal` to every process of the group but the guardian (which ignores it), then
    /// SIGCONT, so that a stopped process acts on it too (as shells do for stopped jobs).
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) has no memory effects; the group is ours.
        unsafe {
            libc::kill(-self.pgid, signal);
            libc::kill(-self.pgid, libc::SIGCONT);
        }
    }

    /// Processes of the group other than the guardian that have not exited.
    pub fn others_alive(&self) -> bool {
        members(self.pgid).into_iter().any(|pid| pid != self.pgid)
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
            self.signal(libc::SIGKILL);
            let _ = self.guardian.wait().await;
        }
        if let Some(terminal) = self.terminal.take() {
            terminal.take_back();
        }
    }
}

/// The controlling terminal while it is handed to the command's group.
struct Terminal {
    fd: OwnedFd,
}

impl Terminal {
    /// Makes `pgid` the foreground group of the controlling terminal if fencelock's own group
    /// is in the foreground now; `None` otherwise (no terminal, running in the background).
    fn hand_to(pgid: libc::pid_t) -> Option<Terminal> {
        // SAFETY: open with a NUL-terminated path; the descriptor is owned below.
        let raw = unsafe {
            libc::open(
                c"/dev/tty".as_ptr(),
                libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
            )
        };
        if raw < 0 {
            return None;
        }
        // SAFETY: a descriptor just opened and owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        use std::os::fd::AsRawFd;
        // SAFETY: terminal ioctls on a valid descriptor.
        let ours = unsafe { libc::tcgetpgrp(fd.as_raw_fd()) == libc::getpgrp() };
        // SAFETY: as above.
        if !ours || unsafe { libc::tcsetpgrp(fd.as_raw_fd(), pgid) } != 0 {
            return None;
        }
        Some(Terminal { fd })
    }

    /// Makes fencelock's group the foreground group again (SIGTTOU blocked meanwhile, as
    /// fencelock is now in the background).
    fn take_back(self) {
        use std::os::fd::AsRawFd;
        // SAFETY: signal-mask and terminal calls on local, initialised values.
        unsafe {
            let mut block: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut block);
            libc::sigaddset(&mut block, libc::SIGTTOU);
            libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
            libc::tcsetpgrp(self.fd.as_raw_fd(), libc::getpgrp());
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        }
    }
}

/// Pids of the live (not zombie) processes in process group `pgid`, from `/proc`.
pub fn members(pgid: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: libc::pid_t = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
            let state = fields.next()?;
            let group: libc::pid_t = fields.nth(1)?.parse().ok()?;
            (group == pgid && state != "Z" && state != "X").then_some(pid)
        })
        .collect()
}
