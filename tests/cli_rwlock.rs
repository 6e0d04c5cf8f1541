//! `fencelock exec --read NAME` / `--write NAME`, and their multi-locks `exec --read a b -- CMD`
//! / `hold --write a b`, against a real server.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::cli::{assert_died_by, finish, kill};
use common::{wait_until, Standalone};
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

fn token(output: &Output) -> u64 {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let (token, name) = stdout.trim().split_once(' ').expect("token and name");
    assert_eq!(name, "cat");
    token.parse().expect("a token")
}

const PRINT: &str = "echo $FENCELOCK_TOKEN $FENCELOCK_NAME; exit 3";

#[tokio::test(flavor = "multi_thread")]
async fn exec_read_shares_with_readers_and_write_excludes_them() {
    let server = Standalone::start();
    let url = server.url();
    let client = Client::connect([url.clone()]).await.unwrap();
    let reader = client
        .try_read_lock("cat", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();

    let read = fencelock(
        &url,
        &[
            "exec",
            "--read",
            "cat",
            "--timeout",
            "0",
            "--",
            "sh",
            "-c",
            PRINT,
        ],
    );
    assert_eq!(read.status.code(), Some(3), "{}", stderr(&read));
    assert!(token(&read) > reader.fence().get(), "its own, later fence");

    let write = fencelock(
        &url,
        &["exec", "--write", "cat", "--timeout", "200ms", "--", "true"],
    );
    assert_eq!(
        write.status.code(),
        Some(75),
        "not acquired: {}",
        stderr(&write)
    );
    reader.release().await.unwrap();

    let write = fencelock(
        &url,
        &[
            "exec",
            "--write",
            "cat",
            "--timeout",
            "0",
            "--",
            "sh",
            "-c",
            PRINT,
        ],
    );
    assert_eq!(write.status.code(), Some(3), "{}", stderr(&write));
    assert!(token(&write) > token(&read));
    let fields: Vec<String> = server
        .node
        .cmd(redis::cmd("HKEYS").arg("fencelock:{cat}:rw"));
    assert_eq!(fields, ["fence"], "released after the command");
}

#[test]
fn exec_read_and_write_conflict() {
    let output = fencelock(
        "redis://127.0.0.1:1",
        &["exec", "--read", "--write", "cat", "--", "true"],
    );
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("cannot be used with"),
        "{}",
        stderr(&output)
    );
}

fn spawn(url: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env_remove("FENCELOCK_URL")
        .arg("--url")
        .arg(url)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fencelock")
}

fn options() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

fn rw_key(name: &str) -> String {
    format!("fencelock:{{{name}}}:rw")
}

/// The fences of the readers of `name`, from their `r:<owner>` fields (`<lease end>:<fence>`).
fn reader_fences(server: &Standalone, name: &str) -> Vec<u64> {
    let fields: Vec<(String, String)> = server.node.cmd(redis::cmd("HGETALL").arg(rw_key(name)));
    fields
        .into_iter()
        .filter(|(field, _)| field.starts_with("r:"))
        .map(|(_, value)| value.rsplit_once(':').unwrap().1.parse().unwrap())
        .collect()
}

fn has_field(server: &Standalone, name: &str, field: &str) -> bool {
    server
        .node
        .cmd(redis::cmd("HEXISTS").arg(rw_key(name)).arg(field))
}

/// `FENCELOCK_TOKEN` and `FENCELOCK_NAME` as `echo $FENCELOCK_TOKEN / $FENCELOCK_NAME` printed
/// them: the tokens in order, and the names line.
fn tokens_and_names(output: &Output) -> (Vec<u64>, String) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let (tokens, names) = stdout.trim().split_once(" / ").expect("tokens / names");
    let tokens = tokens
        .split(' ')
        .map(|t| t.parse().expect("a token"))
        .collect();
    (tokens, names.to_owned())
}

/// Prints the tokens and the names.
const PRINT_MULTI: &str = "echo $FENCELOCK_TOKEN / $FENCELOCK_NAME; exit 3";

#[tokio::test(flavor = "multi_thread")]
async fn exec_read_multi_lock_shares_with_another_reader_and_exports_its_fences() {
    let server = Standalone::start();
    let url = server.url();
    let client = Client::connect([url.clone()]).await.unwrap();
    let reader = client.try_read_lock("prices", &options()).await.unwrap();

    // Held while the command runs: the stored reader fences of each member are read from hold,
    // which prints its fences space-separated as soon as it holds.
    let mut hold = spawn(
        &url,
        &["hold", "--read", "--timeout", "0", "catalog", "prices"],
    );
    let mut line = String::new();
    BufReader::new(hold.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let fences: Vec<u64> = line
        .split_whitespace()
        .map(|t| t.parse().expect("a token"))
        .collect();
    assert_eq!(fences.len(), 2, "{line:?}");
    assert_eq!(reader_fences(&server, "catalog"), [fences[0]]);
    let mut prices = reader_fences(&server, "prices");
    prices.sort_unstable();
    assert_eq!(
        prices,
        [reader.fence().get(), fences[1]],
        "shared with the reader"
    );
    kill(&hold, libc::SIGTERM);
    let output = finish(hold);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(reader_fences(&server, "catalog").is_empty(), "released");
    assert_eq!(reader_fences(&server, "prices"), [reader.fence().get()]);

    let exec = fencelock(
        &url,
        &[
            "exec",
            "--read",
            "--timeout",
            "0",
            "catalog",
            "prices",
            "--",
            "sh",
            "-c",
            PRINT_MULTI,
        ],
    );
    assert_eq!(exec.status.code(), Some(3), "{}", stderr(&exec));
    let (tokens, names) = tokens_and_names(&exec);
    assert_eq!(names, "catalog prices", "in the order given");
    assert_eq!(tokens.len(), 2);
    assert!(tokens[1] > reader.fence().get(), "its own, later fence");
    assert!(reader_fences(&server, "catalog").is_empty(), "released");
    reader.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_write_multi_lock_excludes_a_reader_of_one_member_and_exports_the_stored_fences() {
    let server = Standalone::start();
    let url = server.url();
    let client = Client::connect([url.clone()]).await.unwrap();
    let reader = client.try_read_lock("ledger", &options()).await.unwrap();
    let reader_fence = reader.fence().get();

    let refused = fencelock(
        &url,
        &[
            "exec",
            "--write",
            "--timeout",
            "300ms",
            "accounts",
            "ledger",
            "--",
            "true",
        ],
    );
    assert_eq!(refused.status.code(), Some(75), "{}", stderr(&refused));
    assert!(stderr(&refused).contains("ledger"), "{}", stderr(&refused));
    assert!(!has_field(&server, "accounts", "w"), "nothing left held");
    assert!(!has_field(&server, "ledger", "i"), "no intent left");
    reader.release().await.unwrap();

    // The command sees the stored fences: each member's `fence` counter is its writer's fence.
    let script = "echo $FENCELOCK_TOKEN / $FENCELOCK_NAME \
                  $(redis-cli -h $HOST -p $PORT HGET 'fencelock:{ledger}:rw' fence) \
                  $(redis-cli -h $HOST -p $PORT HGET 'fencelock:{accounts}:rw' fence); exit 3";
    let exec = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env_remove("FENCELOCK_URL")
        .env("HOST", &server.node.host)
        .env("PORT", server.node.port.to_string())
        .args(["--url", &url, "exec", "--write", "--timeout", "0"])
        .args(["ledger", "accounts", "--", "sh", "-c", script])
        .output()
        .unwrap();
    assert_eq!(exec.status.code(), Some(3), "{}", stderr(&exec));
    let (tokens, rest) = tokens_and_names(&exec);
    let rest: Vec<&str> = rest.split(' ').collect();
    assert_eq!(rest[..2], ["ledger", "accounts"], "in the order given");
    let stored: Vec<u64> = rest[2..].iter().map(|t| t.parse().unwrap()).collect();
    assert_eq!(
        tokens, stored,
        "FENCELOCK_TOKEN is the stored fences, in order"
    );
    assert!(tokens[0] > reader_fence);
    assert!(!has_field(&server, "ledger", "w") && !has_field(&server, "accounts", "w"));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_to_a_waiting_write_multi_lock_frees_the_member_taken_at_once() {
    let server = Standalone::start();
    let url = server.url();
    // Members are taken in slot order: the first in that order is free, the second read-held.
    let slot = |name: &str| -> u16 {
        let output = fencelock(&url, &["slot", name]);
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.lines().next().unwrap()["slot ".len()..]
            .parse()
            .unwrap()
    };
    let (free, busy) = if slot("a") < slot("b") {
        ("a", "b")
    } else {
        ("b", "a")
    };
    let client = Client::connect([url.clone()]).await.unwrap();
    let reader = client.try_read_lock(busy, &options()).await.unwrap();

    let waiter = spawn(
        &url,
        &["exec", "--write", "--ttl", "30s", "a", "b", "--", "true"],
    );
    wait_until("the free member taken", Duration::from_secs(10), || {
        has_field(&server, free, "w")
    });
    kill(&waiter, libc::SIGTERM);
    let output = finish(waiter);
    assert_died_by(&output, libc::SIGTERM);
    assert!(
        stderr(&output).contains("stopped by SIGTERM while waiting for lock \"a b\""),
        "{}",
        stderr(&output)
    );
    assert!(!has_field(&server, free, "w"), "member freed at once");
    assert!(!has_field(&server, busy, "i"), "intent withdrawn");
    let other = Client::connect([url.clone()]).await.unwrap();
    let taken = other.try_write_lock(free, &options()).await.unwrap();
    taken.release().await.unwrap();
    let second = other.try_read_lock(busy, &options()).await.unwrap();
    second.release().await.unwrap();
    reader.release().await.unwrap();
}

#[test]
fn permits_with_several_names_is_refused() {
    let output = fencelock(
        "redis://127.0.0.1:1",
        &["exec", "--permits", "2", "a", "b", "--", "true"],
    );
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("--permits takes one NAME"),
        "{}",
        stderr(&output)
    );
}
