//! `fencelock --quorum --url U1 --url U2 --url U3 exec NAME -- CMD` against real servers.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::Standalone;

fn fencelock(urls: &[String], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    command
        .env_remove("FENCELOCK_URL")
        .env_remove("FENCELOCK_QUORUM");
    command.arg("--quorum");
    for url in urls {
        command.arg("--url").arg(url);
    }
    command.args(args).output().expect("run fencelock")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// URLs of ports nothing listens on.
fn closed_urls(count: usize) -> Vec<String> {
    let listeners: Vec<_> = (0..count)
        .map(|_| std::net::TcpListener::bind(("127.0.0.1", 0)).expect("a port"))
        .collect();
    listeners
        .iter()
        .map(|l| format!("redis://127.0.0.1:{}", l.local_addr().unwrap().port()))
        .collect()
}

#[test]
fn exec_with_quorum_exports_the_committed_token_and_passes_the_exit_status() {
    let servers: Vec<Standalone> = (0..3).map(|_| Standalone::start()).collect();
    let urls: Vec<String> = servers.iter().map(Standalone::url).collect();
    let key = "fencelock:{job}:lock";
    let output = fencelock(
        &urls,
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
    let token: u64 = token.parse().unwrap();
    assert_eq!(name, "job");
    for server in &servers {
        let fence: u64 = server
            .node
            .lock_field(key, "fence")
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(fence, token, "the token was committed on every node");
        assert!(!server.node.held(key), "released after exit");
    }

    // Held on one node by someone else: a majority still grants.
    servers[0].node.set_lock_field(key, "owner", "someone-else");
    servers[0]
        .node
        .set_lock_field(key, "until", "9999999999999");
    let again = fencelock(
        &urls,
        &["exec", "job", "--", "sh", "-c", "echo $FENCELOCK_TOKEN"],
    );
    assert!(again.status.success(), "{}", stderr(&again));
    let next: u64 = String::from_utf8(again.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(next > token, "tokens grow across runs");

    // Held on two of three: not acquired within --timeout, exit 75.
    servers[1].node.set_lock_field(key, "owner", "someone-else");
    servers[1]
        .node
        .set_lock_field(key, "until", "9999999999999");
    let busy = fencelock(&urls, &["exec", "--timeout", "300ms", "job", "--", "true"]);
    assert_eq!(busy.status.code(), Some(75), "{}", stderr(&busy));
    assert!(
        stderr(&busy).contains("held by another owner"),
        "{}",
        stderr(&busy)
    );
}

#[test]
fn bad_quorum_usage_exits_64() {
    let servers: Vec<Standalone> = (0..3).map(|_| Standalone::start()).collect();
    let urls: Vec<String> = servers.iter().map(Standalone::url).collect();
    let two = fencelock(&urls[..2], &["exec", "job", "--", "true"]);
    assert_eq!(two.status.code(), Some(64), "{}", stderr(&two));
    assert!(stderr(&two).contains("got 2"), "{}", stderr(&two));
    for flags in [
        &["--read"][..],
        &["--write"],
        &["--fair"],
        &["--permits", "2"],
        &["--wait-replicas", "1"],
        &["--fence-mode", "counter"],
    ] {
        let mut args = vec!["exec"];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["job", "--", "true"]);
        let output = fencelock(&urls, &args);
        assert_eq!(
            output.status.code(),
            Some(64),
            "{flags:?}: {}",
            stderr(&output)
        );
    }
    let several = fencelock(&urls, &["exec", "a", "b", "--", "true"]);
    assert_eq!(several.status.code(), Some(64), "{}", stderr(&several));
    let status = fencelock(&urls, &["status", "job"]);
    assert_eq!(status.status.code(), Some(64), "{}", stderr(&status));
}

#[test]
fn exec_with_quorum_exits_75_when_fewer_than_a_majority_answer() {
    let started = Instant::now();
    let down = fencelock(
        &closed_urls(3),
        &["exec", "--timeout", "1s", "job", "--", "true"],
    );
    assert_eq!(down.status.code(), Some(75), "{}", stderr(&down));
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );

    let server = Standalone::start();
    let mut urls = closed_urls(2);
    urls.push(server.url());
    let started = Instant::now();
    let minority = fencelock(&urls, &["exec", "--timeout", "1s", "job", "--", "true"]);
    assert_eq!(minority.status.code(), Some(75), "{}", stderr(&minority));
    assert!(
        stderr(&minority).contains("fewer than a majority"),
        "{}",
        stderr(&minority)
    );
    assert!(started.elapsed() < Duration::from_secs(8));
    assert!(
        !server.node.held("fencelock:{job}:lock"),
        "nothing left held"
    );
}

#[test]
fn quorum_is_named_in_help_and_taken_from_the_environment() {
    let help = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .args(["exec", "--help"])
        .output()
        .expect("run fencelock");
    assert!(String::from_utf8_lossy(&help.stdout).contains("[env: FENCELOCK_QUORUM"));

    let servers: Vec<Standalone> = (0..3).map(|_| Standalone::start()).collect();
    let urls: Vec<String> = servers.iter().map(Standalone::url).collect();
    let run = |urls: &[String]| {
        Command::new(env!("CARGO_BIN_EXE_fencelock"))
            .env("FENCELOCK_QUORUM", "1")
            .env("FENCELOCK_URL", urls.join(","))
            .args(["exec", "job", "--", "sh", "-c", "echo $FENCELOCK_TOKEN"])
            .output()
            .expect("run fencelock")
    };
    let two = run(&urls[..2]);
    assert_eq!(two.status.code(), Some(64), "{}", stderr(&two));
    let three = run(&urls);
    assert!(three.status.success(), "{}", stderr(&three));
    let token: u64 = String::from_utf8(three.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let fence: u64 = servers[2]
        .node
        .lock_field("fencelock:{job}:lock", "fence")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(token, fence);
}
