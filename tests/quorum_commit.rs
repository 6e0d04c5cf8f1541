//! The quorum lock's second round on a real server: `quorum_commit` raises the stored fence to
//! T only for the live owner and never when the node already granted above T (a resent
//! round-one acquire; docs/safety.md, "A gap the model found").

mod common;

use common::Standalone;

fn commit_script() -> &'static str {
    fencelock::lua_scripts()
        .find(|s| s.name == "quorum_commit")
        .expect("quorum_commit is listed")
        .source
}

#[test]
fn quorum_commit_refuses_a_t_below_the_stored_fence_and_commits_otherwise() {
    let server = Standalone::start();
    let node = &server.node;
    let key = "fencelock:{q}:lock";
    let until_ms = |node: &common::Node| {
        let (secs, micros): (String, String) = node.cmd(&mut redis::cmd("TIME"));
        secs.parse::<i64>().unwrap() * 1000 + micros.parse::<i64>().unwrap() / 1000 + 60_000
    };
    let until = until_ms(node);
    node.cmd::<()>(
        redis::cmd("HSET")
            .arg(key)
            .arg("until")
            .arg(format!("{until} 100 o1")),
    );
    let commit = |owner: &str, t: i64| -> i64 {
        node.cmd(
            redis::cmd("EVAL")
                .arg(commit_script())
                .arg(1)
                .arg(key)
                .arg(owner)
                .arg(t)
                .arg(10_000),
        )
    };
    let fence = || -> i64 { node.lock_field(key, "fence").unwrap().parse().unwrap() };
    assert_eq!(commit("o1", 50), 0, "T below the stored fence is refused");
    assert_eq!(fence(), 100);
    assert_eq!(commit("o2", 150), 0, "not the owner");
    assert_eq!(fence(), 100);
    assert_eq!(commit("o1", 100), 1, "T equal to the stored fence commits");
    assert_eq!(commit("o1", 150), 1);
    assert_eq!(fence(), 150);
    assert_eq!(commit("o1", 150), 1, "idempotent");
    assert_eq!(fence(), 150);
}

#[test]
fn a_committed_fence_ahead_of_the_clock_outlives_the_key_expiry_rule() {
    let server = Standalone::start();
    let node = &server.node;
    let key = "fencelock:{ahead}:lock";
    let (secs, micros): (String, String) = node.cmd(&mut redis::cmd("TIME"));
    let now_ms = secs.parse::<i64>().unwrap() * 1000 + micros.parse::<i64>().unwrap() / 1000;
    // Held with a 10 s lease (the commit must find it live on a loaded machine too); T from a
    // deployment whose clock is 60 s ahead of this one.
    node.cmd::<()>(redis::cmd("HSET").arg(key).arg("until").arg(format!(
        "{} {} o1",
        now_ms + 10_000,
        now_ms * 1000
    )));
    let t = (now_ms + 60_000) * 1000;
    let committed: i64 = node.cmd(
        redis::cmd("EVAL")
            .arg(commit_script())
            .arg(1)
            .arg(key)
            .arg("o1")
            .arg(t)
            .arg(100),
    );
    assert_eq!(committed, 1);
    // The key outlives T read as this server's time (plus the grace), so the next grant after
    // it expired starts above T; the lease end plus the grace (10.1 s) would forget it.
    let expires_at: i64 = node.cmd(redis::cmd("PEXPIRETIME").arg(key));
    assert!(
        expires_at >= t / 1000 + 100,
        "the key expires at {expires_at}, before T ({}) is the server's time",
        t / 1000
    );
}
