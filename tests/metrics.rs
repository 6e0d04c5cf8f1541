//! The `metrics` feature: counters and histograms reach the `metrics` facade.
#![cfg(feature = "metrics")]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::Standalone;
use fencelock::{Client, LockOptions};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_and_a_release_are_reported_through_the_facade() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let guard = client.lock("orders:42", &options).await.unwrap();
    assert!(client.try_lock("orders:42", &options).await.is_err());
    guard.release().await.unwrap();

    let metrics: HashMap<String, DebugValue> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| (key.key().name().to_owned(), value))
        .collect();
    let counter = |name: &str| match metrics.get(name) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{name}: {other:?} in {metrics:?}"),
    };
    assert_eq!(counter("fencelock_grants_total"), 1);
    assert_eq!(counter("fencelock_busy_total"), 1);
    assert_eq!(counter("fencelock_acquire_attempts_total"), 2);
    assert_eq!(counter("fencelock_releases_total"), 1);
    assert_eq!(client.stats().grants, 1, "the facade and Stats agree");
    for histogram in ["fencelock_wait_seconds", "fencelock_hold_seconds"] {
        match metrics.get(histogram) {
            Some(DebugValue::Histogram(values)) => {
                assert_eq!(values.len(), 1, "{histogram}: {values:?}");
                assert!(values[0].into_inner() >= 0.0 && values[0].into_inner() < 5.0);
            }
            other => panic!("{histogram}: {other:?}"),
        }
    }
}
