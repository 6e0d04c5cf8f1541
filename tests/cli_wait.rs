//! `fencelock exec`, `hold` and `latch wait` while they wait, as a user types them, against a
//! real server: a signal while waiting withdraws what the wait holds (a writer's intent, a fair
//! waiter's place, multi-lock members taken) and dies by the signal; `hold NAME`;
//! `exec NAME CMD` without `--`, `-n`/`-w`; the in-place status line on a terminal; strict
//! boolean environment switches.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::cli::{assert_died_by, default_signals, finish, kill};
use common::{wait_until, Standalone};
use fencelock::{Client, LockOptions};

fn fencelock_cmd(url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    default_signals(&mut command)
        .env_remove("FENCELOCK_URL")
        .env_remove("FENCELOCK_FAIR")
        .arg("--url")
        .arg(url)
        .args(args);
    command
}

fn fencelock(url: &str, args: &[&str]) -> Output {
    fencelock_cmd(url, args).output().expect("run fencelock")
}

fn spawn(url: &str, args: &[&str]) -> Child {
    fencelock_cmd(url, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fencelock")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn options() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

fn has_field(node: &common::Node, key: &str, field: &str) -> bool {
    node.cmd(redis::cmd("HEXISTS").arg(key).arg(field))
}

fn places(node: &common::Node, key: &str) -> usize {
    let fields: Vec<String> = node.cmd(redis::cmd("HKEYS").arg(key));
    fields.iter().filter(|f| f.starts_with("q:")).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_to_a_waiting_writer_withdraws_its_intent_and_dies_by_it() {
    let server = Standalone::start();
    let url = server.url();
    let key = "fencelock:{files}:rw";
    let client = Client::connect([url.clone()]).await.unwrap();
    let reader = client.try_read_lock("files", &options()).await.unwrap();

    let writer = spawn(&url, &["exec", "--write", "--ttl", "30s", "files", "true"]);
    wait_until("the writer's intent", Duration::from_secs(10), || {
        has_field(&server.node, key, "i")
    });
    kill(&writer, libc::SIGTERM);
    let output = finish(writer);
    assert_died_by(&output, libc::SIGTERM);
    assert!(
        stderr(&output).contains("stopped by SIGTERM while waiting for lock \"files\""),
        "{}",
        stderr(&output)
    );
    assert!(!has_field(&server.node, key, "i"), "intent withdrawn");
    // A new reader gets in at once, not after the intent's 30 s lease.
    let other = Client::connect([url.clone()]).await.unwrap();
    let second = other.try_read_lock("files", &options()).await.unwrap();
    second.release().await.unwrap();
    reader.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sigint_to_a_waiting_fair_exec_gives_up_its_place_and_dies_by_it() {
    let server = Standalone::start();
    let url = server.url();
    let key = "fencelock:{queue}:fair";
    let client = Client::connect([url.clone()]).await.unwrap();
    let holder = client.try_fair_lock("queue", &options()).await.unwrap();

    let waiter = spawn(&url, &["exec", "--fair", "--ttl", "30s", "queue", "true"]);
    wait_until("the exec's place", Duration::from_secs(10), || {
        places(&server.node, key) == 1
    });
    kill(&waiter, libc::SIGINT);
    let output = finish(waiter);
    assert_died_by(&output, libc::SIGINT);
    assert_eq!(places(&server.node, key), 0, "place withdrawn");
    // The next fair taker is not queued behind a place nobody holds.
    holder.release().await.unwrap();
    let other = Client::connect([url.clone()]).await.unwrap();
    let next = other.try_fair_lock("queue", &options()).await.unwrap();
    next.release().await.unwrap();
}

/// Ctrl-C in a terminal signals the foreground process group: the shell running a script and
/// the fencelock it waits for. bash carries on after a child that exits (even with 130: it takes
/// that as a child that handled SIGINT), and stops only when the child died by SIGINT.
#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_while_exec_waits_stops_the_calling_script() {
    use std::os::unix::process::CommandExt;
    let server = Standalone::start();
    let url = server.url();
    let key = "fencelock:{queue}:fair";
    let client = Client::connect([url.clone()]).await.unwrap();
    let holder = client.try_fair_lock("queue", &options()).await.unwrap();

    let script = format!(
        "'{}' --url '{url}' exec --fair --ttl 30s queue true; echo carried on",
        env!("CARGO_BIN_EXE_fencelock")
    );
    let shell = default_signals(&mut Command::new("bash"))
        .arg("-c")
        .arg(script)
        .env_remove("FENCELOCK_URL")
        .env_remove("FENCELOCK_FAIR")
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run bash");
    wait_until("the exec's place", Duration::from_secs(10), || {
        places(&server.node, key) == 1
    });
    // SAFETY: kill(2) on the process group this test started.
    assert_eq!(unsafe { libc::kill(-(shell.id() as i32), libc::SIGINT) }, 0);
    let output = finish(shell);
    assert!(
        !stdout(&output).contains("carried on"),
        "the script went on"
    );
    assert_died_by(&output, libc::SIGINT);
    assert_eq!(places(&server.node, key), 0, "place withdrawn");
    holder.release().await.unwrap();
}

/// The mask of signal `signal` in a `/proc/PID/status` line `field` (`SigIgn`, `SigCgt`).
fn signal_in(pid: u32, field: &str, signal: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mask = status
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:\t")))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap();
    mask & (1 << (signal - 1)) != 0
}

/// `nohup fencelock exec …` starts it with SIGHUP ignored: a hangup must not end its wait (nor
/// reach the command, which inherits the same), so fencelock leaves it ignored.
#[tokio::test(flavor = "multi_thread")]
async fn a_signal_ignored_at_start_stays_ignored() {
    use std::os::unix::process::CommandExt;
    let server = Standalone::start();
    let url = server.url();
    let key = "fencelock:{nohup}:fair";
    let client = Client::connect([url.clone()]).await.unwrap();
    let holder = client.try_fair_lock("nohup", &options()).await.unwrap();
    let mut command = fencelock_cmd(&url, &["exec", "--fair", "--ttl", "30s", "nohup", "true"]);
    // SAFETY: only signal(2) between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let waiter = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fencelock");
    wait_until("the exec's place", Duration::from_secs(10), || {
        places(&server.node, key) == 1
    });
    assert!(
        signal_in(waiter.id(), "SigIgn", libc::SIGHUP),
        "SIGHUP still ignored"
    );
    assert!(
        signal_in(waiter.id(), "SigCgt", libc::SIGTERM),
        "SIGTERM caught"
    );
    kill(&waiter, libc::SIGHUP);
    kill(&waiter, libc::SIGTERM);
    let output = finish(waiter);
    assert_died_by(&output, libc::SIGTERM);
    assert_eq!(places(&server.node, key), 0, "place withdrawn");
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_to_a_waiting_multi_lock_frees_the_member_taken_and_dies_by_it() {
    let server = Standalone::start();
    let url = server.url();
    // Members are taken in slot order: the first in that order is free, the second held.
    let slot = |name: &str| -> u16 {
        let output = fencelock(&url, &["slot", name]);
        let text = stdout(&output);
        text.lines().next().unwrap()["slot ".len()..]
            .parse()
            .unwrap()
    };
    let (free, busy) = if slot("first") < slot("second") {
        ("first", "second")
    } else {
        ("second", "first")
    };
    let free_key = format!("fencelock:{{{free}}}:lock");
    let client = Client::connect([url.clone()]).await.unwrap();
    let held = client.try_lock(busy, &options()).await.unwrap();

    let waiter = spawn(
        &url,
        &["exec", "--ttl", "30s", "first", "second", "--", "true"],
    );
    wait_until("the free member taken", Duration::from_secs(10), || {
        server.node.held(&free_key)
    });
    kill(&waiter, libc::SIGHUP);
    let output = finish(waiter);
    assert_died_by(&output, libc::SIGHUP);
    assert!(!server.node.held(&free_key), "member freed");
    let taken = client.try_lock(free, &options()).await.unwrap();
    taken.release().await.unwrap();
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_to_a_waiting_permit_exec_leaves_the_semaphore_as_it_was() {
    let server = Standalone::start();
    let url = server.url();
    let key = "fencelock:{pool}:sem";
    let client = Client::connect([url.clone()]).await.unwrap();
    let semaphore = client.semaphore("pool", 1).unwrap();
    let permit = semaphore.try_acquire(&options()).await.unwrap();
    let before: Vec<String> = server.node.cmd(redis::cmd("HKEYS").arg(key));

    let mut waiter = spawn(&url, &["exec", "-v", "--permits", "1", "pool", "true"]);
    let mut line = String::new();
    BufReader::new(waiter.stderr.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("waiting for pool"), "{line}");
    kill(&waiter, libc::SIGTERM);
    let output = finish(waiter);
    assert_died_by(&output, libc::SIGTERM);
    // The refused acquire's mark (`waiters`: the next release announces) may stay, as the
    // mutex's does; nothing else of the wait (no reservation, no permit).
    let mut after: Vec<String> = server.node.cmd(redis::cmd("HKEYS").arg(key));
    after.retain(|field| field != "waiters");
    assert_eq!(after, before, "nothing of the wait left");
    permit.release().await.unwrap();
    let next = semaphore.try_acquire(&options()).await.unwrap();
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn hold_prints_the_token_holds_until_a_signal_and_maps_losses_to_70() {
    let server = Standalone::start();
    let url = server.url();
    let key = "fencelock:{door}:lock";

    // Held until SIGTERM, then released: exit 0.
    let mut hold = spawn(&url, &["hold", "door"]);
    let mut line = String::new();
    BufReader::new(hold.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let token: u64 = line.trim().parse().expect("a token line");
    let fence: u64 = server
        .node
        .lock_field(key, "fence")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(token, fence);
    assert!(server.node.held(key));
    let busy = fencelock(&url, &["exec", "-n", "door", "true"]);
    assert_eq!(busy.status.code(), Some(75), "{}", stderr(&busy));
    let busy = fencelock(&url, &["hold", "-w", "100ms", "door"]);
    assert_eq!(busy.status.code(), Some(75), "{}", stderr(&busy));
    kill(&hold, libc::SIGTERM);
    let output = finish(hold);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!server.node.held(key), "released");

    // Freed by a force unlock while held: exit 70.
    let mut hold = spawn(&url, &["hold", "--ttl", "1s", "door"]);
    let mut line = String::new();
    BufReader::new(hold.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let unlock = fencelock(&url, &["unlock", "--force", "door"]);
    assert_eq!(unlock.status.code(), Some(0), "{}", stderr(&unlock));
    let output = finish(hold);
    assert_eq!(output.status.code(), Some(70), "{}", stderr(&output));

    // The server stops answering: exit 70 by the lease's end (2 s after the last renewal at
    // most), not after a release and a shutdown that each wait a request timeout (2 s) more.
    let mut hold = spawn(&url, &["hold", "--ttl", "2s", "door"]);
    let mut line = String::new();
    BufReader::new(hold.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    server.node.pause();
    let stopped = std::time::Instant::now();
    let output = finish(hold);
    let took = stopped.elapsed();
    server.node.resume();
    assert_eq!(output.status.code(), Some(70), "{}", stderr(&output));
    assert!(
        took < Duration::from_millis(3500),
        "exited {took:?} after the server stopped: {}",
        stderr(&output)
    );

    // The maximum hold time reached: exit 70, and the hold Redis still kept is released, not
    // left for its 30 s TTL.
    let output = finish(spawn(
        &url,
        &["hold", "--ttl", "30s", "--max-hold", "500ms", "capped"],
    ));
    assert_eq!(output.status.code(), Some(70), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("maximum hold time"),
        "{}",
        stderr(&output)
    );
    assert!(!server.node.held("fencelock:{capped}:lock"), "released");

    // A read hold: shared with an exec --read.
    let mut hold = spawn(&url, &["hold", "--read", "door"]);
    let mut line = String::new();
    BufReader::new(hold.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let read = fencelock(&url, &["exec", "--read", "-n", "door", "true"]);
    assert_eq!(read.status.code(), Some(0), "{}", stderr(&read));
    kill(&hold, libc::SIGINT);
    assert_eq!(finish(hold).status.code(), Some(0));

    // A read, write or permit hold freed by a force unlock: exit 70, told so (not "expired").
    for kind in [&["--read"][..], &["--write"], &["--permits", "2"]] {
        let mut args = vec!["hold", "--ttl", "1s"];
        args.extend_from_slice(kind);
        args.push("door");
        let mut hold = spawn(&url, &args);
        let mut line = String::new();
        BufReader::new(hold.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        let mut unlock = vec!["unlock", "--force"];
        unlock.extend_from_slice(kind);
        unlock.push("door");
        let unlocked = fencelock(&url, &unlock);
        assert_eq!(unlocked.status.code(), Some(0), "{}", stderr(&unlocked));
        let output = finish(hold);
        let said = stderr(&output);
        assert_eq!(output.status.code(), Some(70), "{kind:?}: {said}");
        assert!(
            said.contains("freed by a force unlock") && !said.contains("TTL"),
            "{kind:?}: {said}"
        );
    }
}

#[test]
fn exec_takes_the_command_after_one_name_without_double_dash() {
    let server = Standalone::start();
    let url = server.url();
    let output = fencelock(
        &url,
        &[
            "exec",
            "-w",
            "1s",
            "job",
            "sh",
            "-c",
            "echo $FENCELOCK_NAME; exit 3",
        ],
    );
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "job");
    // With `--`, every argument before it is a name.
    let output = fencelock(
        &url,
        &[
            "exec",
            "a",
            "--timeout",
            "1s",
            "b",
            "--",
            "sh",
            "-c",
            "echo $FENCELOCK_NAME",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "a b");
}

#[test]
fn boolean_switches_from_the_environment_take_documented_values_only() {
    let server = Standalone::start();
    let url = server.url();
    for bad in ["maybe", "yes", "2"] {
        let output = fencelock_cmd(&url, &["exec", "job", "true"])
            .env("FENCELOCK_FAIR", bad)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(64), "{bad}: {}", stderr(&output));
        assert!(
            stderr(&output).contains("FENCELOCK_FAIR"),
            "names the variable: {}",
            stderr(&output)
        );
    }
    // A bad duration from the environment names its variable too.
    let output = fencelock_cmd(&url, &["exec", "job", "true"])
        .env("FENCELOCK_TTL", "5ms")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(
        stderr(&output).contains("FENCELOCK_TTL"),
        "{}",
        stderr(&output)
    );
    // 0 and false leave the switch off (the mutex is taken), 1 and true turn it on.
    for (value, key) in [
        ("0", "fencelock:{job}:lock"),
        ("false", "fencelock:{job}:lock"),
        ("1", "fencelock:{job}:fair"),
        ("true", "fencelock:{job}:fair"),
    ] {
        let output = fencelock_cmd(&url, &["exec", "job", "sh", "-c", "echo $FENCELOCK_TOKEN"])
            .env("FENCELOCK_FAIR", value)
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(0),
            "{value}: {}",
            stderr(&output)
        );
        let fence = server.node.lock_field(key, "fence").unwrap();
        assert_eq!(stdout(&output).trim(), fence, "{value} uses {key}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn waiting_on_a_terminal_redraws_one_status_line() {
    let server = Standalone::start();
    let url = server.url();
    let client = Client::connect([url.clone()]).await.unwrap();
    let held = client.try_lock("busy", &options()).await.unwrap();
    // util-linux `script` gives fencelock a pseudo-terminal as stderr.
    let exec = format!(
        "{} --url {url} exec -w 1500ms busy true",
        env!("CARGO_BIN_EXE_fencelock")
    );
    let output = Command::new("script")
        .args(["-qec", &exec, "/dev/null"])
        .env_remove("FENCELOCK_URL")
        .stdin(Stdio::null())
        .output()
        .expect("util-linux script");
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(75), "{text}");
    let waiting: Vec<&str> = text
        .split('\n')
        .filter(|line| line.contains("waiting for busy"))
        .collect();
    assert_eq!(waiting.len(), 1, "one line, redrawn in place: {text:?}");
    assert!(
        waiting[0]
            .matches("\r\x1b[Kfencelock: waiting for busy")
            .count()
            >= 3,
        "redrawn: {text:?}"
    );
    // Durations rounded for people, as every message writes them (not humantime's `1s 500ms`).
    assert!(waiting[0].contains("s of 1.5s)"), "{text:?}");
    assert!(!has_long_decimal(&text), "{text:?}");
    held.release().await.unwrap();
}

#[test]
fn sigterm_to_latch_wait_ends_it_by_that_signal() {
    let server = Standalone::start();
    let url = server.url();
    let set = fencelock(&url, &["latch", "set", "gate", "1"]);
    assert_eq!(set.status.code(), Some(0), "{}", stderr(&set));
    let waiter = spawn(&url, &["latch", "wait", "gate"]);
    wait_until("the waiter subscribed", Duration::from_secs(10), || {
        server.node.sharded_subscribers("fencelock:{gate}:latch") > 0
            || server.node.calls("ssubscribe") > 0
            || server.node.calls("subscribe") > 0
    });
    kill(&waiter, libc::SIGTERM);
    let output = finish(waiter);
    assert_died_by(&output, libc::SIGTERM);
}

/// Whether `text` has a duration written to more than one decimal (`1.0040633s`,
/// `4611686018427387.903s`): a digit, a dot and two more digits.
fn has_long_decimal(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.windows(4).any(|w| {
        w[0].is_ascii_digit() && w[1] == b'.' && w[2].is_ascii_digit() && w[3].is_ascii_digit()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn durations_in_messages_and_tables_are_rounded_for_people() {
    let server = Standalone::start();
    let url = server.url();
    // A lease of 146 million years (humantime's years of 365.25 days, as fencelock prints them),
    // just under MAX_TTL: written back as `146000000y`, never in seconds.
    let mut hold = spawn(&url, &["hold", "--ttl", "146000000y", "huge"]);
    let mut line = String::new();
    BufReader::new(hold.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.trim().parse::<u64>().is_ok(), "a token line: {line:?}");

    let status = fencelock(&url, &["status", "huge"]);
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    let text = stdout(&status);
    assert!(text.contains(" lease 146000000y "), "{text}");
    assert!(!has_long_decimal(&text), "{text}");

    for args in [&["list"][..], &["top", "--once"]] {
        let output = fencelock(&url, args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        let text = stdout(&output);
        assert!(text.contains("146000000y"), "{args:?}: {text}");
        assert!(!has_long_decimal(&text), "{args:?}: {text}");
    }

    // The waiting line and the timeout's message: an odd timeout, the huge lease, both rounded.
    let busy = fencelock(&url, &["exec", "-v", "--timeout", "1003ms", "huge", "true"]);
    assert_eq!(busy.status.code(), Some(75), "{}", stderr(&busy));
    let text = stderr(&busy);
    assert!(
        text.contains("waiting for huge: held by another owner, lease ends in 146000000y"),
        "{text}"
    );
    assert!(text.contains("it frees in 146000000y"), "{text}");
    assert!(!has_long_decimal(&text), "{text}");

    // A latch that does not open within an odd timeout says so in rounded form.
    let set = fencelock(&url, &["latch", "set", "gate", "1"]);
    assert_eq!(set.status.code(), Some(0), "{}", stderr(&set));
    let wait = fencelock(&url, &["latch", "wait", "gate", "--timeout", "1003ms"]);
    assert_eq!(wait.status.code(), Some(75), "{}", stderr(&wait));
    assert!(
        stderr(&wait).contains("did not open within 1s"),
        "{}",
        stderr(&wait)
    );
    assert!(!has_long_decimal(&stderr(&wait)), "{}", stderr(&wait));

    // A TTL below the minimum names the minimum as people write it.
    let short = fencelock(&url, &["exec", "--ttl", "9ms", "huge", "true"]);
    assert_eq!(short.status.code(), Some(64), "{}", stderr(&short));
    assert!(
        stderr(&short).contains("below the minimum TTL of 10ms"),
        "{}",
        stderr(&short)
    );

    kill(&hold, libc::SIGTERM);
    let output = finish(hold);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}
