//! Every public call runs in a `tracing` span naming the lock and its kind.

mod common;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Standalone;
use fencelock::{Client, LockOptions};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Records every new span as `name{field=value,...}`.
#[derive(Clone, Default)]
struct Spans {
    seen: Arc<Mutex<Vec<String>>>,
    next: Arc<AtomicU64>,
}

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?},", field.name(), value);
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, "{}={},", field.name(), value);
    }
}

impl Subscriber for Spans {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields(String::new());
        span.record(&mut fields);
        self.seen
            .lock()
            .unwrap()
            .push(format!("{}{{{}}}", span.metadata().name(), fields.0));
        Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {}
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

impl Spans {
    fn has(&self, name: &str, fields: &[&str]) -> bool {
        self.seen.lock().unwrap().iter().any(|span| {
            span.starts_with(&format!("{name}{{")) && fields.iter().all(|f| span.contains(f))
        })
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn public_calls_run_in_spans_with_the_lock_name_and_kind() {
    let spans = Spans::default();
    tracing::subscriber::set_global_default(spans.clone()).expect("the only subscriber");
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(5));

    let mut guard = client.try_lock("orders:42", &options).await.unwrap();
    guard.extend(Duration::from_secs(6)).await.unwrap();
    client
        .fenced_set("stock:1", guard.fence(), "41")
        .await
        .unwrap()
        .unwrap();
    guard.release().await.unwrap();
    let read = client.read_lock("catalog", &options).await.unwrap();
    read.release().await.unwrap();
    let permit = client
        .semaphore("pool", 2)
        .unwrap()
        .acquire(&options)
        .await
        .unwrap();
    permit.release().await.unwrap();
    client.latch("batch").unwrap().set(0).await.unwrap();
    client.shutdown().await.unwrap();

    assert!(spans.has("fencelock.connect", &[]), "{:?}", spans.seen);
    for (name, fields) in [
        ("fencelock.try_lock", &["lock=orders:42", "kind=mutex"][..]),
        (
            "fencelock.hold",
            &["call=fencelock.extend", "lock=orders:42", "kind=mutex"],
        ),
        (
            "fencelock.hold",
            &["call=fencelock.release", "lock=orders:42", "kind=mutex"],
        ),
        ("fencelock.fenced_set", &["key=stock:1"]),
        ("fencelock.read_lock", &["lock=catalog", "kind=rwlock"]),
        (
            "fencelock.hold",
            &["call=fencelock.release", "lock=catalog", "kind=rwlock"],
        ),
        ("fencelock.semaphore", &["name=pool", "kind=semaphore"]),
        (
            "fencelock.hold",
            &["call=fencelock.release", "lock=pool", "kind=semaphore"],
        ),
        ("fencelock.latch", &["latch=batch", "kind=latch"]),
        ("fencelock.shutdown", &[]),
    ] {
        assert!(
            spans.has(name, fields),
            "no {name} {fields:?} in {:?}",
            spans.seen
        );
    }
}
