//! `fencelock exec` and the command's processes: nothing of the command runs without the lock,
//! whether the lock is lost, fencelock is killed, or fencelock is asked to stop; a loss found by
//! the release is reported. Real redis-server, real processes, `/proc` as the witness.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{wait_until, Standalone};

/// Prints its process group id first, then runs `sleep 30` in the background and in the
/// foreground: a command whose grandchildren outlive a signal to `sh` alone.
const TWO_SLEEPS: &str = "cut -d' ' -f5 /proc/$$/stat; sleep 30 & sleep 30; wait";

fn spawn_exec(url: &str, args: &[&str]) -> Child {
    common::cli::default_signals(&mut Command::new(env!("CARGO_BIN_EXE_fencelock")))
        .env_remove("FENCELOCK_URL")
        .args(["--url", url, "exec"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fencelock")
}

/// Reads the process group id the command prints as its first line.
fn read_pgid(child: &mut Child) -> i32 {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim()
        .parse()
        .unwrap_or_else(|_| panic!("no process group id printed: {line:?}"))
}

/// Live (not zombie) processes in process group `pgid`, from `/proc/*/stat`.
fn group_members(pgid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| {
            let pid: i32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
            let state = fields.next()?;
            let group: i32 = fields.nth(1)?.parse().ok()?;
            (group == pgid && state != "Z" && state != "X").then_some(pid)
        })
        .collect()
}

/// How many processes of group `pgid` run `sleep` (not a shell that is about to exec it).
fn sleeps(pgid: i32) -> usize {
    group_members(pgid)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.starts_with("sleep\0"))
        })
        .count()
}

fn kill(pid: u32, signal: i32) {
    // SAFETY: kill(2) on a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "kill {pid}");
}

/// Waits for fencelock to exit and returns its exit code and stderr. Panics if some process
/// still holds its stderr 2 s later (something of the command outlived fencelock).
fn stderr_of(mut child: Child) -> (Option<i32>, String) {
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("fencelock did not exit");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        let _ = tx.send(text);
    });
    let text = rx
        .recv_timeout(Duration::from_secs(2))
        .expect("a process outlived fencelock holding its stderr");
    (status.code(), text)
}

#[test]
fn a_lost_lock_terminates_the_whole_process_group() {
    let server = Standalone::start();
    let key = "fencelock:{lost}:lock";
    let mut child = spawn_exec(
        &server.url(),
        &["--ttl", "600ms", "lost", "--", "sh", "-c", TWO_SLEEPS],
    );
    let pgid = read_pgid(&mut child);
    wait_until("both sleeps to run", Duration::from_secs(10), || {
        sleeps(pgid) == 2
    });
    server.node.set_lock_field(key, "owner", "someone-else");
    let (code, stderr) = stderr_of(child);
    assert_eq!(code, Some(70), "{stderr}");
    assert!(stderr.contains("lost lock"), "{stderr}");
    // fencelock waits for the group before exiting: nothing may be left at once.
    assert_eq!(
        group_members(pgid),
        Vec::<i32>::new(),
        "survivors in the group"
    );
}

#[test]
fn the_command_group_dies_when_fencelock_is_killed() {
    let server = Standalone::start();
    let mut child = spawn_exec(
        &server.url(),
        &["--ttl", "1s", "killed", "--", "sh", "-c", TWO_SLEEPS],
    );
    let pgid = read_pgid(&mut child);
    wait_until("both sleeps to run", Duration::from_secs(10), || {
        sleeps(pgid) == 2
    });
    kill(child.id(), libc::SIGKILL);
    let killed = Instant::now();
    let _ = child.wait();
    wait_until(
        "the command's group to die with fencelock",
        Duration::from_secs(2),
        || group_members(pgid).is_empty(),
    );
    eprintln!(
        "group gone {:?} after SIGKILL of fencelock",
        killed.elapsed()
    );

    // Once the TTL has run out the lock is free again, and nothing of the first command runs.
    wait_until("the lease to run out", Duration::from_secs(5), || {
        !server.node.held("fencelock:{killed}:lock")
    });
    let again = spawn_exec(&server.url(), &["killed", "--", "true"]);
    assert_eq!(stderr_of(again).0, Some(0));
}

#[test]
fn signals_to_fencelock_reach_the_whole_group_and_the_lock_is_released() {
    let server = Standalone::start();
    let dir = std::env::temp_dir().join(format!("fencelock-signals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (signal, name) in [(libc::SIGTERM, "TERM"), (libc::SIGHUP, "HUP")] {
        let mark = dir.join(name);
        let _ = std::fs::remove_file(&mark);
        // A grandchild that records the signal it gets, then the two sleeps.
        let script = format!(
            "sh -c 'trap \"echo got >> {mark}; exit 0\" {name}; echo ready >> {mark}; \
             sleep 30 & wait' & {TWO_SLEEPS}",
            mark = mark.display()
        );
        let mut child = spawn_exec(&server.url(), &["signals", "--", "sh", "-c", &script]);
        let pgid = read_pgid(&mut child);
        wait_until("the grandchild's trap", Duration::from_secs(10), || {
            std::fs::read_to_string(&mark).is_ok_and(|text| text.contains("ready"))
                && sleeps(pgid) == 3
        });
        kill(child.id(), signal);
        let (code, stderr) = stderr_of(child);
        assert_eq!(code, Some(128 + signal), "{name}: {stderr}");
        assert!(
            std::fs::read_to_string(&mark).unwrap().contains("got"),
            "{name} did not reach the grandchild"
        );
        assert_eq!(group_members(pgid), Vec::<i32>::new(), "{name}: survivors");
        assert!(
            !server.node.held("fencelock:{signals}:lock"),
            "{name}: released"
        );
    }
    // SIGINT: background jobs of a script ignore it, the foreground sh dies of it (130); what
    // the command leaves behind is terminated before the release.
    let mut child = spawn_exec(&server.url(), &["signals", "--", "sh", "-c", TWO_SLEEPS]);
    let pgid = read_pgid(&mut child);
    wait_until("both sleeps to run", Duration::from_secs(10), || {
        sleeps(pgid) == 2
    });
    kill(child.id(), libc::SIGINT);
    let (code, stderr) = stderr_of(child);
    assert_eq!(code, Some(130), "{stderr}");
    assert_eq!(group_members(pgid), Vec::<i32>::new(), "INT: survivors");
    assert!(!server.node.held("fencelock:{signals}:lock"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn leftovers_of_a_finished_command_are_stopped_before_the_release() {
    let server = Standalone::start();
    // The command exits at once, leaving a background sleep in its group.
    let mut child = spawn_exec(
        &server.url(),
        &[
            "left",
            "--",
            "sh",
            "-c",
            "cut -d' ' -f5 /proc/$$/stat; sleep 30 >/dev/null & exit 3",
        ],
    );
    let pgid = read_pgid(&mut child);
    let (code, stderr) = stderr_of(child);
    assert_eq!(code, Some(3), "{stderr}");
    assert_eq!(group_members(pgid), Vec::<i32>::new(), "the sleep survived");
}

#[test]
fn exec_exits_70_when_the_release_finds_the_lock_taken() {
    let server = Standalone::start();
    let port = server.node.port.to_string();
    // The command hands the lock to someone else as its last act and exits 0: the watchdog
    // (renewing every TTL/3 = 3.3 s) cannot see it first, the release does.
    let child = spawn_exec(
        &server.url(),
        &[
            "taken",
            "--",
            "redis-cli",
            "-p",
            &port,
            "HSET",
            "fencelock:{taken}:lock",
            "until",
            "9999999999999 1 someone-else",
        ],
    );
    let (code, stderr) = stderr_of(child);
    assert_eq!(code, Some(70), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("was lost"), "{stderr}");
}

#[test]
fn exec_keeps_the_status_and_warns_when_the_release_cannot_reach_redis() {
    let server = Standalone::start();
    let port = server.node.port.to_string();
    let script = format!("redis-cli -p {port} SHUTDOWN NOSAVE; exit 5");
    let child = spawn_exec(&server.url(), &["gone", "--", "sh", "-c", &script]);
    let (code, stderr) = stderr_of(child);
    assert_eq!(code, Some(5), "{stderr}");
    assert!(stderr.contains("warning"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn an_interactive_command_gets_the_terminal() {
    // Run under a pseudo-terminal (util-linux `script`): the command's own process group must
    // become the terminal's foreground group, or its read would stop it with SIGTTIN.
    let server = Standalone::start();
    let exec = format!(
        "{} --url {} exec tty -- sh -c 'read line; echo got $line; \
         ps -o pgid=,tpgid= -p $$'",
        env!("CARGO_BIN_EXE_fencelock"),
        server.url()
    );
    let mut child = Command::new("script")
        .args(["-qec", &exec, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux script");
    use std::io::Write;
    child.stdin.as_mut().unwrap().write_all(b"hello\n").unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > until {
            let _ = child.kill();
            panic!("the command stopped reading the terminal");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("got hello"), "{stdout}");
    let groups: Vec<&str> = stdout.lines().last().unwrap().split_whitespace().collect();
    assert_eq!(groups.len(), 2, "{stdout}");
    assert_eq!(
        groups[0], groups[1],
        "the command's group is in the foreground"
    );
}

#[test]
fn a_stopped_command_still_acts_on_a_forwarded_signal() {
    let server = Standalone::start();
    let mut child = spawn_exec(
        &server.url(),
        &[
            "stopped",
            "--",
            "sh",
            "-c",
            "cut -d' ' -f5 /proc/$$/stat; kill -STOP $$; exit 0",
        ],
    );
    let pgid = read_pgid(&mut child);
    let stopped = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat[stat.rfind(')').unwrap() + 1..]
                .trim_start()
                .starts_with('T')
        })
    };
    wait_until(
        "the command to stop itself",
        Duration::from_secs(10),
        || {
            group_members(pgid)
                .into_iter()
                .any(|pid| pid != pgid && stopped(pid))
        },
    );
    kill(child.id(), libc::SIGTERM);
    let started = Instant::now();
    let (code, stderr) = stderr_of(child);
    assert_eq!(code, Some(128 + libc::SIGTERM), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(!server.node.held("fencelock:{stopped}:lock"));
}

/// An interactive shell on a pseudo-terminal (util-linux `script`), typed into through its
/// stdin; killed (the terminal hung up) when dropped.
struct Terminal {
    child: Child,
    screen: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Terminal {
    fn start() -> Terminal {
        let mut child = Command::new("script")
            .args(["-qec", "bash --norc --noprofile -i", "/dev/null"])
            .env("PS1", "$ ")
            .env_remove("FENCELOCK_URL")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("util-linux script");
        let screen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut stdout = child.stdout.take().unwrap();
        let shown = screen.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                shown
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Terminal { child, screen }
    }

    fn type_in(&mut self, keys: &str) {
        use std::io::Write;
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(keys.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    fn screen(&self) -> String {
        self.screen.lock().unwrap().clone()
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many times process `pid` was switched out (it ran), from `/proc/PID/status`.
fn switches(pid: i32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains("ctxt_switches:"))
        .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// State, process group and the terminal's foreground group of process `pid`, from `/proc`.
fn job_state(pid: i32) -> Option<(String, i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    // state ppid pgrp session tty_nr tpgid
    Some((
        fields.first()?.to_string(),
        fields.get(2)?.parse().ok()?,
        fields.get(5)?.parse().ok()?,
    ))
}

impl Terminal {
    /// Types `fencelock exec --ttl TTL NAME -- sh -c '…; read line; …'` (the command prints
    /// `ready:PID:` first, then reads a line and prints `got LINE`), and returns the command's
    /// pid once it runs in the terminal's foreground.
    fn exec_reading_a_line(&mut self, url: &str, ttl: &str, name: &str) -> i32 {
        self.type_in(&format!(
            "{} --url {url} exec --ttl {ttl} {name} -- sh -c 'echo ready:$$:; read line; echo got \
             $line'\n",
            env!("CARGO_BIN_EXE_fencelock"),
        ));
        let mut pid = 0;
        wait_until("the command to start", Duration::from_secs(20), || {
            pid = self
                .screen()
                .split("ready:")
                .skip(1)
                .find_map(|rest| rest.split(':').next()?.parse().ok())
                .unwrap_or(0);
            pid != 0
        });
        wait_until(
            "the command in the foreground",
            Duration::from_secs(10),
            || in_foreground(pid),
        );
        pid
    }

    /// Types Ctrl-Z and waits for the shell to report the job stopped.
    fn ctrl_z(&mut self) {
        self.type_in("\x1a");
        wait_until(
            "the shell to report the job stopped",
            Duration::from_secs(10),
            || self.screen().contains("Stopped"),
        );
    }

    /// Types `fg`, waits for the command `pid` to run in the foreground, types a line and waits
    /// for the command to print it.
    fn fg_and_read_a_line(&mut self, pid: i32) {
        self.type_in("fg\n");
        wait_until(
            "the command continued in the foreground",
            Duration::from_secs(10),
            || in_foreground(pid),
        );
        self.type_in("hello\n");
        wait_until(
            "the command to read the line",
            Duration::from_secs(10),
            || self.screen().contains("got hello"),
        );
    }
}

/// Whether process `pid` runs (not stopped) in its terminal's foreground group.
fn in_foreground(pid: i32) -> bool {
    job_state(pid).is_some_and(|(state, pgrp, tpgid)| state != "T" && pgrp == tpgid)
}

#[test]
fn ctrl_z_stops_the_job_and_fg_continues_the_command_under_the_lock() {
    // Ctrl-Z stops the terminal's foreground group, the command's; fencelock passes the stop
    // on to its own group, the job the shell knows, or the shell would wait for it with the
    // terminal held by a stopped command. `fg` continues fencelock, which gives the command
    // the terminal again and continues it.
    let server = Standalone::start();
    let mut terminal = Terminal::start();
    let pid = terminal.exec_reading_a_line(&server.url(), "30s", "jobs");
    terminal.ctrl_z();
    assert_eq!(job_state(pid).unwrap().0, "T", "the command is stopped");
    assert!(
        server.node.held("fencelock:{jobs}:lock"),
        "held while stopped"
    );
    terminal.fg_and_read_a_line(pid);
    wait_until("the release", Duration::from_secs(10), || {
        !server.node.held("fencelock:{jobs}:lock")
    });
}

#[test]
fn a_job_stopped_past_its_lease_loses_the_lock_and_its_command_is_not_continued() {
    let server = Standalone::start();
    let key = "fencelock:{lapsed}:lock";
    let mut terminal = Terminal::start();
    let pid = terminal.exec_reading_a_line(&server.url(), "1s", "lapsed");
    terminal.ctrl_z();
    // The lease ends (by the server's clock) while fencelock is stopped: no renewal.
    let lease_end = || -> i64 {
        let until: Option<String> = server.node.cmd(redis::cmd("HGET").arg(key).arg("until"));
        until
            .and_then(|value| value.split(' ').next()?.parse().ok())
            .unwrap_or(0)
    };
    let end = lease_end();
    assert!(end > 0, "held while stopped");
    wait_until("the lease to end", Duration::from_secs(10), || {
        let (secs, micros): (i64, i64) = server.node.cmd(&mut redis::cmd("TIME"));
        secs * 1000 + micros / 1000 > end
    });
    terminal.type_in("fg\n");
    wait_until(
        "fencelock to report the loss",
        Duration::from_secs(20),
        || terminal.screen().contains("lost lock"),
    );
    terminal.type_in("echo status:$?:\n");
    wait_until("fencelock's exit status", Duration::from_secs(20), || {
        terminal.screen().contains("status:7")
    });
    let screen = terminal.screen();
    assert!(screen.contains("status:70:"), "{screen}");
    assert!(
        screen.contains("until the lock's lease ran out"),
        "{screen}"
    );
    assert!(
        job_state(pid).is_none_or(|(state, ..)| state == "Z"),
        "the command is gone"
    );
}

#[test]
fn after_bg_a_command_that_reads_the_terminal_gets_it_back_on_fg() {
    // `bg` continues the job in the background: the command's read of the terminal stops it
    // (SIGTTIN), and fencelock stops its group by the same signal (a shell does not continue a
    // job it thinks is running on `fg`, it only hands it the terminal). `fg` then continues
    // fencelock, which gives the command the terminal and continues it.
    let server = Standalone::start();
    let mut terminal = Terminal::start();
    let pid = terminal.exec_reading_a_line(&server.url(), "30s", "bgfg");
    terminal.ctrl_z();
    let ran = switches(pid);
    terminal.type_in("bg\n");
    // Continued by fencelock, it ran (its context switches rose) and stopped again.
    wait_until(
        "the command stopped by its read in the background",
        Duration::from_secs(10),
        || switches(pid) > ran && job_state(pid).is_some_and(|(state, ..)| state == "T"),
    );
    terminal.fg_and_read_a_line(pid);
    wait_until("the release", Duration::from_secs(10), || {
        !server.node.held("fencelock:{bgfg}:lock")
    });
}
