//! Key layout 2 (the mutex's and the fair lock's state packed in the hash field `until`) meeting
//! keys and clients of layout 1 (fields `owner`, `until`, `fence`, `holds`, `waiters`): a fleet
//! rolled over from one to the other never grants twice, never sends a fence backwards and
//! never corrupts a key. The layout-1 scripts are those of fencelock before layout 2
//! (`tests/fixtures/layout1_*.lua`, printed by `fencelock script acquire` / `release` of
//! commit c4c1881).

mod common;

use std::time::Duration;

use common::Standalone;
use fencelock::{Client, FenceMode, LockOptions};

const LAYOUT1_ACQUIRE: &str = include_str!("fixtures/layout1_acquire.lua");
const LAYOUT1_RELEASE: &str = include_str!("fixtures/layout1_release.lua");

async fn client(server: &Standalone, mode: FenceMode) -> Client {
    Client::builder([server.url()])
        .fence_mode(mode)
        .connect()
        .await
        .unwrap()
}

fn server_ms(server: &Standalone) -> u64 {
    let (secs, micros): (u64, u64) = server.node.cmd(&mut redis::cmd("TIME"));
    secs * 1000 + micros / 1000
}

fn fields(server: &Standalone, key: &str) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = server.node.cmd(redis::cmd("HGETALL").arg(key));
    all.sort();
    all
}

/// A layout-1 client's acquire (counter mode, no place) of `key` for `owner`.
fn layout1_acquire(
    server: &Standalone,
    key: &str,
    owner: &str,
) -> redis::RedisResult<redis::Value> {
    server.node.try_cmd(
        redis::cmd("EVAL")
            .arg(LAYOUT1_ACQUIRE)
            .arg(1)
            .arg(key)
            .arg(owner)
            .arg(10_000)
            .arg(0)
            .arg("counter")
            .arg(""),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_free_layout_1_key_is_converted_in_place_keeping_its_fence() {
    let server = Standalone::start();
    let key = "fencelock:{old-free}:lock";
    // What a layout-1 release leaves: the fence (and a forced-unlock marker) only.
    server.node.cmd::<()>(
        redis::cmd("HSET")
            .arg(key)
            .arg("fence")
            .arg(41)
            .arg("forced")
            .arg("someone"),
    );
    let client = client(&server, FenceMode::Counter).await;
    let guard = client
        .try_lock("old-free", &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(
        guard.fence().get(),
        42,
        "the counter goes on from the stored fence"
    );
    let names: Vec<String> = fields(&server, key).into_iter().map(|(f, _)| f).collect();
    assert_eq!(names, ["forced", "until"], "the layout-1 fields are gone");
    assert_eq!(server.node.lock_field(key, "fence").as_deref(), Some("42"));
    guard.release().await.unwrap();

    // An expired layout-1 hold counts as free too.
    let key = "fencelock:{old-expired}:lock";
    server.node.cmd::<()>(
        redis::cmd("HSET")
            .arg(key)
            .arg("owner")
            .arg("gone")
            .arg("until")
            .arg(server_ms(&server) - 1)
            .arg("fence")
            .arg(7),
    );
    let guard = client
        .try_lock("old-expired", &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(guard.fence().get(), 8);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_layout_1_key_held_by_an_older_client_is_refused_naming_the_layout() {
    let server = Standalone::start();
    let key = "fencelock:{old-held}:lock";
    let granted = layout1_acquire(&server, key, "older-client-owner").unwrap();
    assert_eq!(
        common::grant_values(granted),
        [1, 1, 0],
        "the older client holds it"
    );
    let before = fields(&server, key);
    let client = client(&server, FenceMode::Counter).await;
    let err = client
        .try_lock("old-held", &LockOptions::new())
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("old-held"), "names the lock: {text}");
    assert!(text.contains("layout 1"), "names the layout: {text}");
    assert!(
        text.contains("docs/design.md"),
        "says where to read on: {text}"
    );
    assert_eq!(fields(&server, key), before, "nothing written");
    let err = client
        .lock(
            "old-held",
            &LockOptions::new().timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("layout 1"), "{err}");
    assert_eq!(fields(&server, key), before, "nothing written");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_layout_1_client_fails_on_a_layout_2_key_before_any_write() {
    let server = Standalone::start();
    let client = client(&server, FenceMode::Counter).await;
    let guard = client.try_lock("new", &LockOptions::new()).await.unwrap();
    let key = "fencelock:{new}:lock";
    let held = fields(&server, key);

    let err = layout1_acquire(&server, key, "older-client-owner").unwrap_err();
    assert!(
        err.to_string().contains("arithmetic"),
        "the older script fails on the packed state: {err}"
    );
    assert_eq!(fields(&server, key), held, "the holder's state is intact");
    let err = server
        .node
        .try_cmd::<redis::Value>(
            redis::cmd("EVAL")
                .arg(LAYOUT1_RELEASE)
                .arg(1)
                .arg(key)
                .arg("older-client-owner")
                .arg("")
                .arg("")
                .arg(""),
        )
        .unwrap_err();
    assert!(err.to_string().contains("arithmetic"), "{err}");
    assert_eq!(fields(&server, key), held, "the holder's state is intact");

    guard.release().await.unwrap();
    // Free: the older acquire still fails (a free layout-2 state is no number either).
    let free = fields(&server, key);
    assert!(layout1_acquire(&server, key, "older-client-owner").is_err());
    assert_eq!(fields(&server, key), free);
    let next = client.try_lock("new", &LockOptions::new()).await.unwrap();
    assert_eq!(next.fence().get(), 2, "the fence goes on");
    next.release().await.unwrap();
}
