//! `fencelock latch set|count-down|wait` against a real server: output, one count per --id,
//! exit 0 once open, 75 on timeout, 64 bad input, 69 unreachable.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{wait_until, Standalone};

fn fencelock(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env_remove("FENCELOCK_URL")
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .expect("run fencelock")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn set_count_down_and_wait() {
    let server = Standalone::start();
    let url = server.url();
    let set = fencelock(&url, &["latch", "set", "job", "2"]);
    assert!(set.status.success(), "{}", stderr(&set));
    let generation: u64 = stdout(&set).parse().unwrap();
    assert!(generation > 0);

    // A waiter started before the count reaches zero exits 0 with the generation once it does.
    let waiter = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env_remove("FENCELOCK_URL")
        .args(["--url", &url, "latch", "wait", "job", "--timeout", "20s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the waiter's subscription", Duration::from_secs(10), || {
        let reply: Vec<redis::Value> = server.node.cmd(
            redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("fencelock:{job}:latch"),
        );
        reply.get(1) == Some(&redis::Value::Int(1))
    });

    let first = fencelock(&url, &["latch", "count-down", "job", "--id", "a"]);
    assert_eq!(stdout(&first), "1", "{}", stderr(&first));
    let again = fencelock(&url, &["latch", "count-down", "job", "--id", "a"]);
    assert_eq!(stdout(&again), "1", "the same id counts once");
    let random = fencelock(&url, &["latch", "count-down", "job"]);
    assert_eq!(stdout(&random), "0", "{}", stderr(&random));
    assert!(stderr(&random).contains("as id "), "{}", stderr(&random));

    let waited = waiter.wait_with_output().unwrap();
    assert!(waited.status.success(), "{}", stderr(&waited));
    assert_eq!(stdout(&waited), generation.to_string());
    let open = fencelock(&url, &["latch", "wait", "job", "--timeout", "0"]);
    assert_eq!(stdout(&open), generation.to_string());
}

#[test]
fn wait_exits_75_when_not_open_in_time() {
    let server = Standalone::start();
    let url = server.url();
    let never = fencelock(&url, &["latch", "wait", "never", "--timeout", "200ms"]);
    assert_eq!(never.status.code(), Some(75), "{}", stderr(&never));
    assert!(stderr(&never).contains("not set"), "{}", stderr(&never));

    assert!(fencelock(&url, &["latch", "set", "closed", "3"])
        .status
        .success());
    let closed = fencelock(&url, &["latch", "wait", "closed", "--timeout", "200ms"]);
    assert_eq!(closed.status.code(), Some(75), "{}", stderr(&closed));
    assert!(
        stderr(&closed).contains("3 count-downs outstanding"),
        "{}",
        stderr(&closed)
    );
}

#[test]
fn bad_input_exits_64_and_unreachable_69() {
    let server = Standalone::start();
    let url = server.url();
    for args in [
        &["latch", "set", "x", "many"][..],
        &["latch", "set", "x", "-1"],
        &["latch", "set", "", "1"],
        &["latch", "set", "x", "9007199254740992"],
        &["latch", "count-down", "x", "--id", ""],
        &["latch", "wait", "x", "--timeout", "soon"],
        &["latch", "count-down", "not-set", "--id", "a"],
    ] {
        let output = fencelock(&url, args);
        assert_eq!(
            output.status.code(),
            Some(64),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(stderr(&output).starts_with("fencelock: ") || stderr(&output).contains("error"));
    }
    let down = fencelock("redis://127.0.0.1:1", &["latch", "set", "x", "1"]);
    assert_eq!(down.status.code(), Some(69), "{}", stderr(&down));
}
