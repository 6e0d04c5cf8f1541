//! `fencelock exec --fair NAME`: the fair lock NAME through the CLI.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{wait_until, Standalone};
use fencelock::{Client, LockOptions};

fn fencelock_cmd(url: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    command
        .env_remove("FENCELOCK_URL")
        .arg("--url")
        .arg(url)
        .args(args);
    command
}

fn fencelock(url: &str, args: &[&str]) -> Output {
    fencelock_cmd(url, args).output().expect("run fencelock")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn places(node: &common::Node, key: &str) -> usize {
    let fields: Vec<String> = node.cmd(redis::cmd("HKEYS").arg(key));
    fields.iter().filter(|f| f.starts_with("q:")).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn exec_fair_takes_the_fair_lock_in_arrival_order_with_the_mutex_exit_codes() {
    let server = Standalone::start();
    let url = server.url();
    let key = "fencelock:{job}:fair";

    // The token and name are exported; the fair key is used, the mutex key is not.
    let output = fencelock(
        &url,
        &[
            "exec",
            "--fair",
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
    let fence: i64 = server
        .node
        .lock_field(key, "fence")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(token.parse::<i64>().unwrap(), fence);
    assert_eq!(name, "job");
    assert!(!server.node.held(key), "released after exit");
    let mutex: bool = server
        .node
        .cmd(redis::cmd("EXISTS").arg("fencelock:{job}:lock"));
    assert!(!mutex, "the mutex key is not touched");

    // Held by a library client: 75 after the timeout, and the place is given up.
    let client = Client::connect([url.clone()]).await.unwrap();
    let holder = client
        .try_fair_lock("job", &LockOptions::new())
        .await
        .unwrap();
    let output = fencelock(
        &url,
        &["exec", "--fair", "--timeout", "200ms", "job", "--", "true"],
    );
    assert_eq!(output.status.code(), Some(75), "{}", stderr(&output));
    assert_eq!(places(&server.node, key), 0);
    // The mutex of the same name is free meanwhile.
    let output = fencelock(&url, &["exec", "--timeout", "0", "job", "--", "true"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));

    // Two queued execs run in the order they arrived.
    let dir = tempdir();
    let log = dir.join("order");
    let spawn = |tag: &str| {
        fencelock_cmd(
            &url,
            &[
                "exec",
                "--fair",
                "job",
                "--",
                "sh",
                "-c",
                &format!("echo {tag} >> {}", log.display()),
            ],
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
    };
    let mut first = spawn("first");
    wait_until("first queued", Duration::from_secs(10), || {
        places(&server.node, key) == 1
    });
    let mut second = spawn("second");
    wait_until("second queued", Duration::from_secs(10), || {
        places(&server.node, key) == 2
    });
    holder.release().await.unwrap();
    assert!(first.wait().unwrap().success());
    assert!(second.wait().unwrap().success());
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "first\nsecond\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fencelock-cli-fair-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
