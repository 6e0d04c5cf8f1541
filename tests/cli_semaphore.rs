//! `fencelock exec --permits N`: one permit of a semaphore around a command, against a real
//! server.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

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

#[tokio::test(flavor = "multi_thread")]
async fn exec_permits_exports_the_permit_and_releases_it() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let semaphore = client.semaphore("pool", 2).unwrap();
    let first = semaphore.try_acquire(&LockOptions::new()).await.unwrap();
    assert_eq!(first.permits()[0].number, 0);
    let url = server.url();
    let output = tokio::task::spawn_blocking(move || {
        fencelock(
            &url,
            &[
                "exec",
                "--permits",
                "2",
                "pool",
                "--",
                "sh",
                "-c",
                "echo $FENCELOCK_TOKEN $FENCELOCK_NAME $FENCELOCK_PERMIT; exit 7",
            ],
        )
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(7), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let fields: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(fields.len(), 3, "{stdout}");
    let token: u64 = fields[0].parse().unwrap();
    assert!(
        token > first.fence().get(),
        "a later grant has a higher fence"
    );
    assert_eq!(fields[1], "pool");
    assert_eq!(fields[2], "1", "the free permit's number");
    assert_eq!(
        semaphore.available().await.unwrap(),
        1,
        "released after exit"
    );
    first.release().await.unwrap();
}

#[test]
fn exec_permits_with_another_size_exits_64_naming_the_stored_size() {
    let server = Standalone::start();
    let url = server.url();
    // Counter mode keeps the key (and its stored size) for good.
    let ok = fencelock(
        &url,
        &[
            "exec",
            "--fence-mode",
            "counter",
            "--permits",
            "2",
            "sized",
            "--",
            "true",
        ],
    );
    assert_eq!(ok.status.code(), Some(0), "{}", stderr(&ok));
    let other = fencelock(
        &url,
        &[
            "exec",
            "--fence-mode",
            "counter",
            "--permits",
            "3",
            "sized",
            "--",
            "true",
        ],
    );
    assert_eq!(other.status.code(), Some(64), "{}", stderr(&other));
    assert!(
        stderr(&other).contains("semaphore \"sized\" has 2 permits"),
        "{}",
        stderr(&other)
    );
    let zero = fencelock(&url, &["exec", "--permits", "0", "sized", "--", "true"]);
    assert_eq!(zero.status.code(), Some(64), "{}", stderr(&zero));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sigkilled_exec_permit_comes_back_after_its_lease() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let semaphore = client.semaphore("killed", 2).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env_remove("FENCELOCK_URL")
        .args(["--url", &server.url()])
        .args([
            "exec",
            "--permits",
            "2",
            "--ttl",
            "600ms",
            "killed",
            "--",
            "sleep",
            "30",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while semaphore.available().await.unwrap() != 1 {
        assert!(Instant::now() < deadline, "the exec to take a permit");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.kill().unwrap(); // SIGKILL: nothing releases the permit
    let killed = Instant::now();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while semaphore.available().await.unwrap() != 2 {
        assert!(Instant::now() < deadline, "the permit to come back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!("permit back {:?} after SIGKILL", killed.elapsed());
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "within about one lease"
    );
}
