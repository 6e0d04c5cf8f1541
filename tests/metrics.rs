//! The `metrics` feature: counters and histograms reach the `metrics` facade, each labelled
//! with the primitive's `kind`.
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
    // Other kinds: a fair lock, a read hold and a semaphore permit.
    let fair = client.fair_lock("printer", &options).await.unwrap();
    fair.release().await.unwrap();
    let read = client.read_lock("catalog", &options).await.unwrap();
    read.release().await.unwrap();
    let permit = client
        .semaphore("renderers", 2)
        .unwrap()
        .acquire(&options)
        .await
        .unwrap();
    permit.release().await.unwrap();

    // (name, kind label) → value; every metric carries a `kind` label.
    let mut metrics: HashMap<(String, String), DebugValue> = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<_> = key.labels().collect();
        assert!(
            labels.len() == 1 && labels[0].key() == "kind",
            "{} has labels {labels:?}",
            key.name()
        );
        metrics.insert((key.name().to_owned(), labels[0].value().to_owned()), value);
    }
    let counter = |name: &str, kind: &str| match metrics.get(&(name.to_owned(), kind.to_owned())) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{name}{{kind={kind}}}: {other:?} in {metrics:?}"),
    };
    assert_eq!(counter("fencelock_grants_total", "mutex"), 1);
    assert_eq!(counter("fencelock_busy_total", "mutex"), 1);
    assert_eq!(counter("fencelock_acquire_attempts_total", "mutex"), 2);
    assert_eq!(counter("fencelock_releases_total", "mutex"), 1);
    for kind in ["fair", "rwlock", "semaphore"] {
        assert_eq!(counter("fencelock_grants_total", kind), 1, "{kind}");
        assert_eq!(counter("fencelock_releases_total", kind), 1, "{kind}");
    }
    assert_eq!(client.stats().grants, 4, "the facade and Stats agree");
    for kind in ["mutex", "fair", "rwlock", "semaphore"] {
        for histogram in ["fencelock_wait_seconds", "fencelock_hold_seconds"] {
            match metrics.get(&(histogram.to_owned(), kind.to_owned())) {
                Some(DebugValue::Histogram(values)) => {
                    assert_eq!(values.len(), 1, "{histogram}{{kind={kind}}}: {values:?}");
                    assert!(values[0].into_inner() >= 0.0 && values[0].into_inner() < 5.0);
                }
                other => panic!("{histogram}{{kind={kind}}}: {other:?}"),
            }
        }
    }
}
