//! `fencelock exec --read NAME` / `--write NAME` against a real server.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::Standalone;
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
