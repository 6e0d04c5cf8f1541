//! `fencelock status`, `unlock --force`, `list` (text and `--json`, exit codes) and `top` under
//! tmux, against real servers.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{wait_until, Standalone};
use fencelock::{Client, LockOptions};
use serde_json::Value;

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

fn json(output: &Output) -> Value {
    assert_eq!(output.status.code(), Some(0), "{}", stderr(output));
    serde_json::from_str(&stdout(output)).unwrap_or_else(|e| panic!("{e}: {}", stdout(output)))
}

fn options() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(30))
}

#[tokio::test(flavor = "multi_thread")]
async fn status_unlock_and_list_print_the_contract_fields_and_exit_codes() {
    let server = Standalone::start();
    let url = server.url();
    let client = Client::connect([url.clone()]).await.unwrap();

    // Free: exit 0, held false, nulls.
    let free = json(&fencelock(&url, &["status", "orders:42", "--json"]));
    assert_eq!(free["name"], "orders:42");
    assert_eq!(free["kind"], "mutex");
    assert_eq!(free["held"], false);
    assert!(free["fence"].is_null() && free["lease_ms"].is_null() && free["waiters"].is_null());
    assert_eq!(free["holds"], 0);

    let guard = client.lock("orders:42", &options()).await.unwrap();
    let held = json(&fencelock(&url, &["status", "orders:42", "--json"]));
    assert_eq!(held["held"], true);
    assert_eq!(held["fence"].as_u64(), Some(u64::from(guard.fence())));
    let lease = held["lease_ms"].as_u64().unwrap();
    assert!(lease > 25_000 && lease <= 30_000, "{lease}");
    assert_eq!(held["holds"], 1);
    assert_eq!(held["key"], "fencelock:{orders:42}:lock");
    let line = fencelock(&url, &["status", "orders:42"]);
    assert_eq!(line.status.code(), Some(0));
    assert!(
        stdout(&line).starts_with("orders:42 mutex held fence "),
        "{}",
        stdout(&line)
    );

    // Other kinds through their flags.
    let _read = client.read_lock("catalog", &options()).await.unwrap();
    let rw = json(&fencelock(&url, &["status", "--read", "catalog", "--json"]));
    assert_eq!(
        (&rw["kind"], &rw["held"], &rw["readers"]),
        (&"rwlock".into(), &true.into(), &1.into())
    );
    let _permit = client
        .semaphore("pool", 4)
        .unwrap()
        .acquire(&options())
        .await
        .unwrap();
    let sem = json(&fencelock(
        &url,
        &["status", "--permits", "4", "pool", "--json"],
    ));
    assert_eq!(
        (&sem["permits_in_use"], &sem["permit_limit"]),
        (&1.into(), &4.into())
    );
    let _fair = client.fair_lock("line", &options()).await.unwrap();
    let fair = json(&fencelock(&url, &["status", "--fair", "line", "--json"]));
    assert_eq!(
        (&fair["kind"], &fair["waiters"]),
        (&"fair".into(), &0.into())
    );

    // list: every primitive, the same fields.
    let list = json(&fencelock(&url, &["list", "--json"]));
    let entries = list.as_array().unwrap();
    let names: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        names,
        [
            ("catalog", "rwlock"),
            ("line", "fair"),
            ("orders:42", "mutex"),
            ("pool", "semaphore")
        ]
    );
    for entry in entries {
        for field in [
            "name", "kind", "held", "fence", "lease_ms", "holds", "waiters",
        ] {
            assert!(entry.get(field).is_some(), "{field} missing: {entry}");
        }
    }
    let text = fencelock(&url, &["list"]);
    assert_eq!(stdout(&text).lines().count(), 4, "{}", stdout(&text));
    let capped = fencelock(&url, &["list", "--max-keys", "1"]);
    assert_eq!(capped.status.code(), Some(0));
    assert!(
        stderr(&capped).contains("the list is incomplete"),
        "{}",
        stderr(&capped)
    );

    // unlock without --force: 64, nothing freed.
    let refused = fencelock(&url, &["unlock", "orders:42"]);
    assert_eq!(refused.status.code(), Some(64), "{}", stderr(&refused));
    assert!(server.node.held("fencelock:{orders:42}:lock"));

    // unlock --force: prints what it freed, exit 0; the next grant is higher; the old
    // holder's release reports the loss.
    let freed = fencelock(&url, &["unlock", "--force", "orders:42"]);
    assert_eq!(freed.status.code(), Some(0), "{}", stderr(&freed));
    let printed = stdout(&freed);
    assert!(
        printed.starts_with("freed: orders:42 mutex held fence ")
            && printed.contains(&guard.fence().to_string()),
        "{printed}"
    );
    let after = json(&fencelock(&url, &["status", "orders:42", "--json"]));
    assert_eq!(after["held"], false);
    assert_eq!(after["fence"].as_u64(), Some(u64::from(guard.fence())));
    let next = client.lock("orders:42", &options()).await.unwrap();
    assert!(next.fence() > guard.fence());
    assert!(guard.release().await.is_err());
    let again = json(&fencelock(
        &url,
        &["unlock", "--force", "orders:42", "--json"],
    ));
    assert_eq!(again["held"], true);
    assert_eq!(again["fence"].as_u64(), Some(u64::from(next.fence())));
    let nothing = fencelock(&url, &["unlock", "--force", "orders:42"]);
    assert_eq!(nothing.status.code(), Some(0));
    assert!(
        stdout(&nothing).starts_with("nothing to free: "),
        "{}",
        stdout(&nothing)
    );

    // Bad input 64, unreachable 69.
    let bad = fencelock(&url, &["status", ""]);
    assert_eq!(bad.status.code(), Some(64), "{}", stderr(&bad));
    let both = fencelock(&url, &["status", "--read", "--fair", "x"]);
    assert_eq!(both.status.code(), Some(64), "{}", stderr(&both));
    let dead = fencelock("redis://127.0.0.1:1", &["status", "x"]);
    assert_eq!(dead.status.code(), Some(69), "{}", stderr(&dead));
    let dead = fencelock("redis://127.0.0.1:1", &["unlock", "--force", "x"]);
    assert_eq!(dead.status.code(), Some(69), "{}", stderr(&dead));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_name_with_control_characters_is_printed_escaped() {
    let server = Standalone::start();
    let url = server.url();
    let name = "evil\u{1b}[2J\u{1b}]0;pwn\u{7}\nsecond line";
    let client = Client::connect([url.clone()]).await.unwrap();
    let guard = client.try_lock(name, &options()).await.unwrap();
    for args in [vec!["status", name], vec!["list"], vec!["top", "--once"]] {
        let output = fencelock(&url, &args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "{args:?}: {}",
            stderr(&output)
        );
        let text = stdout(&output);
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{args:?}: {text:?}"
        );
        assert!(text.contains("evil\\u{1b}[2J"), "{args:?}: {text:?}");
        assert!(
            !text.contains("\nsecond line"),
            "{args:?}: one line per lock: {text:?}"
        );
    }
    guard.release().await.unwrap();
}

#[test]
fn a_server_that_stops_answering_exits_69_not_75() {
    let server = Standalone::start();
    let url = server.url();
    // Writes paused: the connection opens, the call is never answered in time.
    let _: () = server
        .node
        .cmd(redis::cmd("CLIENT").arg("PAUSE").arg(20_000).arg("WRITE"));
    let stalled = fencelock(&url, &["unlock", "--force", "x"]);
    let _: () = server.node.cmd(redis::cmd("CLIENT").arg("UNPAUSE"));
    // 75 would tell a script that another owner holds the lock.
    assert_eq!(stalled.status.code(), Some(69), "{}", stderr(&stalled));
    let text = stderr(&stalled);
    assert!(
        text.contains("may stay held until its lease ends"),
        "{text}"
    );
}

/// `tmux -L SOCKET ARGS`: a tmux server of this test's own.
fn tmux(socket: &str, args: &[&str]) -> Output {
    Command::new("tmux")
        .arg("-L")
        .arg(socket)
        .args(args)
        .output()
        .expect("run tmux")
}

fn pane(socket: &str, session: &str) -> String {
    stdout(&tmux(socket, &["capture-pane", "-p", "-t", session]))
}

/// Runs `fencelock top` in a 120x30 tmux session, waits for the held lock on its screen, quits
/// it with `keys`, and checks it exited 0 and left no process.
fn top_shows_the_lock_and_quits_with(url: &str, dir: &Path, keys: &str) {
    let socket = format!("fencelock-top-{}-{keys}", std::process::id());
    let session = "top";
    let status_file = dir.join(format!("top-status-{keys}"));
    let command = format!(
        "{} --url {url} top; echo $? > {}",
        env!("CARGO_BIN_EXE_fencelock"),
        status_file.display()
    );
    let started = tmux(
        &socket,
        &[
            "new-session",
            "-d",
            "-s",
            session,
            "-x",
            "120",
            "-y",
            "30",
            &command,
        ],
    );
    assert!(started.status.success(), "{}", stderr(&started));
    let pid: u32 = stdout(&tmux(
        &socket,
        &["display", "-p", "-t", session, "#{pane_pid}"],
    ))
    .parse()
    .unwrap();
    wait_until("top's screen", Duration::from_secs(15), || {
        let screen = pane(&socket, session);
        screen.contains("GRANTS/S")
            && screen
                .lines()
                .any(|l| l.starts_with("jobs:nightly") && l.contains("mutex") && l.contains("held"))
    });
    // The second frame has a rate for the lock.
    wait_until("a refreshed frame", Duration::from_secs(5), || {
        pane(&socket, session)
            .lines()
            .any(|l| l.starts_with("jobs:nightly") && l.trim_end().ends_with(" 0"))
    });
    let sent = tmux(&socket, &["send-keys", "-t", session, keys]);
    assert!(sent.status.success(), "{}", stderr(&sent));
    wait_until("top's exit", Duration::from_secs(10), || {
        std::fs::read_to_string(&status_file).is_ok_and(|s| s.ends_with('\n'))
    });
    assert_eq!(std::fs::read_to_string(&status_file).unwrap().trim(), "0");
    // The session ended with its command; make sure, then check nothing is left.
    let _ = tmux(&socket, &["kill-session", "-t", session]);
    wait_until("the pane's shell to end", Duration::from_secs(5), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    // This socket's server has no session left and exits by itself.
    wait_until(
        "this test's tmux server to end",
        Duration::from_secs(5),
        || !tmux(&socket, &["list-sessions"]).status.success(),
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn top_shows_held_locks_under_tmux_and_quits_with_q_or_ctrl_c() {
    let server = Standalone::start();
    let url = server.url();
    let client = Client::connect([url.clone()]).await.unwrap();
    let _guard = client.lock("jobs:nightly", &options()).await.unwrap();
    let dir = server.node.dir().to_owned();
    top_shows_the_lock_and_quits_with(&url, &dir, "q");
    top_shows_the_lock_and_quits_with(&url, &dir, "C-c");
}
