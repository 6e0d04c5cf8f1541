//! Bad deployments and foreign keys through the CLI, on real servers: `exec --quorum` refuses
//! one server given twice (exit 64), `list` skips a foreign key under the prefix with a warning
//! instead of failing.

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::Standalone;
use fencelock::{Client, LockOptions, QuorumClient};

fn fencelock(urls: &[String], args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fencelock"))
        .env_remove("FENCELOCK_URL")
        .arg("--url")
        .arg(urls.join(","))
        .args(args)
        .output()
        .expect("run fencelock")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn quorum_refuses_one_server_counted_twice() {
    let servers: Vec<Standalone> = (0..2).map(|_| Standalone::start()).collect();
    let first = servers[0].url();
    let second = servers[1].url();
    // The same URL twice, and the same server under another spelling (database 0 named).
    for urls in [
        vec![first.clone(), first.clone(), second.clone()],
        vec![first.clone(), second.clone(), format!("{first}/0")],
    ] {
        let output = fencelock(&urls, &["--quorum", "exec", "-n", "job", "true"]);
        assert_eq!(
            output.status.code(),
            Some(64),
            "{urls:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains("reach the same server"),
            "{}",
            stderr(&output)
        );
        assert!(!servers[0].node.held("fencelock:{job}:lock"), "nothing ran");
        let err = QuorumClient::connect(urls.clone()).await.unwrap_err();
        assert!(
            matches!(err, fencelock::Error::InvalidConfig { .. }),
            "{err}"
        );
    }
    // Three distinct servers still make a quorum.
    let third = Standalone::start();
    let urls = vec![first, second, third.url()];
    let output = fencelock(&urls, &["--quorum", "exec", "-n", "job", "true"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[tokio::test(flavor = "multi_thread")]
async fn list_skips_a_foreign_key_with_a_warning() {
    let server = Standalone::start();
    let url = server.url();
    let client = Client::connect([url.clone()]).await.unwrap();
    let guard = client
        .try_lock("mine", &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    // Another program's string where a lock's hash would be.
    let _: () = server
        .node
        .cmd(redis::cmd("SET").arg("fencelock:{theirs}:lock").arg("x"));

    let list = client.list_locks(10_000).await.unwrap();
    assert_eq!(list.locks.len(), 1);
    assert_eq!(list.skipped, ["fencelock:{theirs}:lock"]);

    let output = fencelock(&[url], &["list"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("mine"), "{stdout}");
    assert!(
        stderr(&output).contains("skipped key \"fencelock:{theirs}:lock\""),
        "{}",
        stderr(&output)
    );
    // top says so too (it left the key out silently).
    let output = fencelock(&[server.url()], &["top", "--once"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let frame = String::from_utf8_lossy(&output.stdout);
    assert!(frame.contains("skipped 1 key(s)"), "{frame}");
    guard.release().await.unwrap();
}

#[test]
fn quorum_refuses_two_nodes_of_one_cluster() {
    let cluster = common::Cluster::start();
    let nodes = cluster.urls();
    let other = Standalone::start();
    let third = Standalone::start();
    // Two seeds of the same cluster are one deployment, not two.
    let urls = vec![nodes[0].clone(), nodes[1].clone(), other.url()];
    let output = fencelock(&urls, &["--quorum", "exec", "-n", "job", "true"]);
    assert_eq!(output.status.code(), Some(64), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("reach the same server (node id"),
        "{}",
        stderr(&output)
    );
    // One seed of it next to two standalone servers is fine.
    let urls = vec![nodes[0].clone(), other.url(), third.url()];
    let output = fencelock(&urls, &["--quorum", "exec", "-n", "job", "true"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}
