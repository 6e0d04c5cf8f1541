//! The `serde` feature: `LockOptions` round-trips, durations as humantime strings.
#![cfg(feature = "serde")]

use std::time::Duration;

use fencelock::{FenceToken, LockOptions};
use serde_json::json;

#[test]
fn lock_options_round_trip_with_humantime_durations() {
    let options = LockOptions::new()
        .ttl(Duration::from_millis(1500))
        .timeout(Duration::MAX)
        .wait_replicas(1, Duration::from_millis(100))
        .slot(12739)
        .floor(FenceToken::new(42).unwrap())
        .watchdog(true)
        .renew_every(Duration::from_secs(5))
        .max_hold(Duration::from_secs(90))
        .linger(true)
        .on_wait(|_| {});
    let value = serde_json::to_value(&options).unwrap();
    assert_eq!(
        value,
        json!({
            "ttl": "1s 500ms",
            "timeout": "forever",
            "wait_replicas": { "replicas": 1, "timeout": "100ms" },
            "slot": 12739,
            "floor": 42,
            "watchdog": true,
            "renew_every": "5s",
            "max_hold": "1m 30s",
            "linger": true,
        })
    );
    let back: LockOptions = serde_json::from_value(value.clone()).unwrap();
    assert_eq!(back.get_ttl(), Duration::from_millis(1500));
    assert_eq!(back.get_timeout(), Duration::MAX);
    assert_eq!(serde_json::to_value(&back).unwrap(), value);

    // The defaults round-trip too, and an empty map is the defaults.
    let defaults = serde_json::to_value(LockOptions::new()).unwrap();
    assert_eq!(
        defaults,
        json!({ "ttl": "30s", "timeout": "10s", "watchdog": false })
    );
    let empty: LockOptions = serde_json::from_str("{}").unwrap();
    assert_eq!(serde_json::to_value(&empty).unwrap(), defaults);
    let tagged: LockOptions = serde_json::from_str(r#"{"tag": "orders", "ttl": "2m"}"#).unwrap();
    assert_eq!(tagged.get_ttl(), Duration::from_secs(120));
    assert_eq!(serde_json::to_value(&tagged).unwrap()["tag"], "orders");
}

#[test]
fn bad_option_maps_are_refused_with_a_reason() {
    for (text, says) in [
        (r#"{"ttl": "ten seconds"}"#, "is not a duration"),
        (r#"{"ttl": 10}"#, "invalid type"),
        (r#"{"slot": 1, "tag": "x"}"#, "both given"),
        (r#"{"floor": 0}"#, "not a valid fence token"),
        (r#"{"tll": "1s"}"#, "unknown field"),
    ] {
        let err = serde_json::from_str::<LockOptions>(text)
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{text}: {err}");
    }
}
