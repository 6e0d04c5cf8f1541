//! The `fencelock` command-line contract, against real servers.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{wait_until, Cluster, Standalone};
use fencelock::{Client, LockOptions};

fn fencelock(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env_remove("FENCELOCK_URL")
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .expect("run fencelock")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn slot_prints_the_slot_and_keys_without_a_server() {
    let output = fencelock("redis://127.0.0.1:1", &["slot", "orders:42"]);
    assert!(output.status.success());
    let keys =
        fencelock::LockKeys::new("fencelock", "orders:42", &fencelock::Placement::ByName).unwrap();
    assert_eq!(
        String::from_utf8(output.stdout).unwrap(),
        format!("slot {}\nlock {}\n", keys.slot(), keys.lock_key())
    );
    let pinned = fencelock("redis://127.0.0.1:1", &["slot", "--slot", "12739", "x"]);
    assert!(String::from_utf8_lossy(&pinned.stdout).starts_with("slot 12739\n"));
}

#[test]
fn exec_exports_the_token_and_passes_the_exit_status_through() {
    let server = Standalone::start();
    let output = fencelock(
        &server.url(),
        &[
            "exec",
            "job",
            "--",
            "sh",
            "-c",
            "echo $FENCELOCK_TOKEN $FENCELOCK_NAME; exit 7",
        ],
    );
    assert_eq!(output.status.code(), Some(7), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let (token, name) = stdout.trim().split_once(' ').unwrap();
    assert!(token.parse::<u64>().unwrap() > 0);
    assert_eq!(name, "job");
    assert!(
        !server.node.held("fencelock:{job}:lock"),
        "released after exit"
    );

    let again = fencelock(
        &server.url(),
        &["exec", "job", "--", "sh", "-c", "echo $FENCELOCK_TOKEN"],
    );
    assert!(again.status.success());
    let next: u64 = String::from_utf8(again.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        next > token.parse::<u64>().unwrap(),
        "tokens grow across runs"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_exits_75_when_held_and_76_without_replicas() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let holder = client.try_lock("busy", &LockOptions::new()).await.unwrap();
    for timeout in ["0", "200ms"] {
        let output = fencelock(
            &server.url(),
            &["exec", "--timeout", timeout, "busy", "--", "true"],
        );
        assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
        assert_eq!(stderr(&output).lines().count(), 1, "one-line error");
    }
    holder.release().await.unwrap();

    let output = fencelock(
        &server.url(),
        &[
            "exec",
            "--wait-replicas",
            "1",
            "--wait-timeout",
            "50ms",
            "free",
            "--",
            "true",
        ],
    );
    assert_eq!(output.status.code(), Some(76), "{}", stderr(&output));
}

#[test]
fn exec_rejects_bad_input_and_unreachable_servers_with_one_line() {
    let server = Standalone::start();
    for args in [
        &["exec", "--ttl", "0", "x", "--", "true"][..],
        &["exec", "--ttl", "5x", "x", "--", "true"],
        &["exec", "", "--", "true"],
        &["exec", "x"],
        &["exec", "--slot", "99999", "x", "--", "true"],
        &["exec", "--slot", "16384", "x", "--", "true"],
    ] {
        let output = fencelock(&server.url(), args);
        assert_eq!(
            output.status.code(),
            Some(64),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    // A slot out of range, from the flag or its variable, names the range of slots.
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env("FENCELOCK_SLOT", "70000")
        .args(["--url", &server.url(), "status", "x"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("FENCELOCK_SLOT"),
        "{}",
        stderr(&output)
    );
    assert!(stderr(&output).contains("0..=16383"), "{}", stderr(&output));
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let output = fencelock(
        &format!("redis://127.0.0.1:{closed}"),
        &["exec", "x", "--", "true"],
    );
    assert_eq!(output.status.code(), Some(69), "{}", stderr(&output));
    assert_eq!(stderr(&output).lines().count(), 1);
}

#[test]
fn exec_keeps_the_lock_alive_and_stops_the_command_when_it_is_lost() {
    let server = Standalone::start();
    // Renewal: a 300 ms TTL survives a command running well past it.
    let output = fencelock(
        &server.url(),
        &[
            "exec", "--ttl", "300ms", "renewed", "--", "sh", "-c", "sleep 1",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    let child = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args([
            "--url",
            &server.url(),
            "exec",
            "--ttl",
            "600ms",
            "lost",
            "--",
            "sleep",
            "60",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let key = "fencelock:{lost}:lock";
    wait_until("the CLI to acquire", Duration::from_secs(10), || {
        server.node.held(key)
    });
    // Another owner takes over, as after an expiry.
    server.node.set_lock_field(key, "owner", "someone-else");
    server.node.set_lock_field(key, "fence", "1");
    let started = Instant::now();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(70), "{}", stderr(&output));
    assert!(stderr(&output).contains("lost lock"), "{}", stderr(&output));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped promptly: {:?}",
        started.elapsed()
    );
}

#[test]
fn exec_works_on_a_cluster_with_replica_confirmation() {
    let cluster = Cluster::start();
    let url = cluster.nodes[1].url();
    let output = fencelock(
        &url,
        &[
            "exec",
            "--wait-replicas",
            "1",
            "--wait-timeout",
            "2s",
            "orders:42",
            "--",
            "sh",
            "-c",
            "echo $FENCELOCK_TOKEN",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let token: u64 = String::from_utf8(output.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(token > 0);
}

#[test]
fn exec_contenders_wake_on_release_and_max_hold_stops_the_command() {
    let server = Standalone::start();
    // Three contenders with a 30 s TTL: each waits for the previous release, not for its lease.
    let started = Instant::now();
    let contenders: Vec<_> = (0..3)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_fencelock"))
                .args(["--url", &server.url(), "exec", "--ttl", "30s", "contended"])
                .args(["--", "sh", "-c", "sleep 0.2; echo $FENCELOCK_TOKEN"])
                .output_async()
        })
        .collect();
    let mut tokens: Vec<u64> = contenders
        .into_iter()
        .map(|c| {
            let output = c.wait_with_output().unwrap();
            assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
            String::from_utf8(output.stdout)
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        })
        .collect();
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "three 0.2 s holds took {took:?}: waiters slept out the 30 s lease"
    );
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 3);

    let output = fencelock(
        &server.url(),
        &[
            "exec",
            "--ttl",
            "300ms",
            "--max-hold",
            "700ms",
            "capped",
            "--",
            "sleep",
            "60",
        ],
    );
    assert_eq!(output.status.code(), Some(70), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("maximum hold time"),
        "{}",
        stderr(&output)
    );
}

/// Spawning a command with captured output without waiting for it.
trait OutputAsync {
    fn output_async(&mut self) -> std::process::Child;
}

impl OutputAsync for Command {
    fn output_async(&mut self) -> std::process::Child {
        self.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

#[test]
fn exec_rejects_a_ttl_below_the_minimum_before_starting_anything() {
    // Nothing listens on the URL: reaching Redis would exit 69, running the command would
    // create the marker.
    let marker = std::env::temp_dir().join(format!("fencelock-min-ttl-{}", std::process::id()));
    let output = fencelock(
        "redis://127.0.0.1:1",
        &[
            "exec",
            "--ttl",
            "5ms",
            "x",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    );
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
    assert!(stderr(&output).contains("minimum"), "{}", stderr(&output));
    assert!(!marker.exists(), "the command ran");
}

#[test]
fn exec_takes_compound_and_fractional_durations() {
    let server = Standalone::start();
    let output = fencelock(
        &server.url(),
        &[
            "exec",
            "--ttl",
            "1m30s",
            "--timeout",
            "1.5s",
            "--wait-timeout",
            "2s 500ms",
            "durations",
            "--",
            "true",
        ],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let output = fencelock(&server.url(), &["exec", "--ttl", "1x", "d", "--", "true"]);
    assert_eq!(output.status.code(), Some(64));
    assert_eq!(stderr(&output).lines().count(), 1, "{}", stderr(&output));
    assert!(stderr(&output).contains("1m30s"), "names the forms");
}

#[test]
fn script_text_from_a_shell_loads_under_the_sha_the_client_uses() {
    let server = Standalone::start();
    for script in fencelock::lua_scripts() {
        let output = fencelock("redis://127.0.0.1:1", &["script", script.name]);
        assert!(output.status.success());
        let printed = String::from_utf8(output.stdout).unwrap();
        assert!(printed.ends_with('\n') && !printed.ends_with("\n\n"));
        // What `redis-cli script load "$(fencelock script NAME)"` sends: trailing newlines cut.
        let text = printed.trim_end_matches('\n');
        let loaded: String = server.node.cmd(redis::cmd("SCRIPT").arg("LOAD").arg(text));
        assert_eq!(loaded, script.sha1, "{}", script.name);
        let sha = fencelock("redis://127.0.0.1:1", &["script", "--sha", script.name]);
        assert!(sha.status.success());
        assert_eq!(
            String::from_utf8(sha.stdout).unwrap(),
            format!("{loaded}\n")
        );
    }
}

#[test]
fn printing_to_a_closed_pipe_ends_quietly_instead_of_panicking() {
    use std::io::Read;
    for args in [&["script", "acquire"][..], &["completions", "bash"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fencelock"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run fencelock");
        drop(child.stdout.take()); // the reader goes away before fencelock writes
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert_ne!(status.code(), Some(101), "{args:?}: exit 101 is a panic");
    }
}

/// `exec` with its stderr closed before it writes (a journal stream that went away): its
/// messages are dropped, and it exits with its contract's code, never 101 (a panic), leaving
/// no lock held.
#[tokio::test(flavor = "multi_thread")]
async fn exec_with_a_closed_stderr_keeps_its_exit_codes_and_releases() {
    let server = Standalone::start();
    let url = server.url();
    let run = |args: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_fencelock"))
            .arg("--url")
            .arg(&url)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run fencelock");
        drop(child.stderr.take()); // the reader goes away before fencelock writes
        child.wait().unwrap().code()
    };
    let client = Client::connect([url.clone()]).await.unwrap();
    let held = client
        .lock("taken", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(run(&["exec", "-n", "taken", "true"]), Some(75));
    held.release().await.unwrap();
    assert_eq!(
        run(&[
            "exec",
            "--ttl",
            "30s",
            "missing",
            "--",
            "/nonexistent/command"
        ]),
        Some(127)
    );
    let free = fencelock(&url, &["status", "missing", "--json"]);
    assert!(
        String::from_utf8_lossy(&free.stdout).contains("\"held\":false"),
        "{}",
        String::from_utf8_lossy(&free.stdout)
    );
    // With debug events on (`-vv`, as `RUST_LOG` would): the events go nowhere, the command
    // runs and its status is exec's, and the lock is released (it exited 101 before running
    // the command, its lock held for its TTL).
    assert_eq!(
        run(&["-vv", "exec", "--ttl", "30s", "logged", "--", "sh", "-c", "exit 3"]),
        Some(3)
    );
    let free = fencelock(&url, &["status", "logged", "--json"]);
    assert!(
        String::from_utf8_lossy(&free.stdout).contains("\"held\":false"),
        "{}",
        String::from_utf8_lossy(&free.stdout)
    );
}

/// A mutex's command does not inherit an outer `exec --permits`'s FENCELOCK_PERMIT: the number
/// is not its hold's.
#[test]
fn exec_of_a_mutex_clears_an_inherited_permit_number() {
    let server = Standalone::start();
    let output = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env("FENCELOCK_PERMIT", "5")
        .args(["--url", &server.url(), "exec", "inner", "--", "sh", "-c"])
        .arg("echo ${FENCELOCK_PERMIT-unset} $FENCELOCK_NAME")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "unset inner\n");
}
