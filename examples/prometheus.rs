//! fencelock's metrics in Prometheus: the `metrics` feature reports every counter and histogram
//! of [`Client::stats`] through the `metrics` facade, and `metrics-exporter-prometheus` serves
//! them on `/metrics`, each with its `kind` label (`mutex`, `rwlock`, `fair`, `semaphore`,
//! `latch`; `client` for connection rebuilds).
//!
//! Run against any Redis (a standalone `redis-server` on its default port will do):
//! `cargo run --example prometheus --features metrics -- redis://127.0.0.1:6379 127.0.0.1:9000`.
//! Three workers contend for one lock for five seconds (`curl http://127.0.0.1:9000/metrics`
//! meanwhile shows the live numbers); then the fencelock lines of one scrape are printed.
//!
//! In an application, install the exporter once at start-up, before the first client connects;
//! fencelock itself needs no other setting. Histograms are rendered as summaries unless
//! `set_buckets` is given, as below (seconds).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use fencelock::{Client, LockOptions};
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let listen: SocketAddr = args
        .next()
        .unwrap_or_else(|| "127.0.0.1:9000".into())
        .parse()?;

    let (recorder, exporter) = PrometheusBuilder::new()
        .with_http_listener(listen)
        .set_buckets(&[0.001, 0.005, 0.025, 0.1, 0.5, 2.5, 10.0])?
        .build()?;
    let scrape = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    tokio::spawn(exporter);
    println!("serving http://{listen}/metrics for 5 s");

    // Three clients (as three processes would be): they contend through Redis, so the busy
    // answers and wake-ups show; tasks of one client hand the lock on within it instead.
    let until = Instant::now() + Duration::from_secs(5);
    let mut workers = Vec::new();
    for _ in 0..3 {
        let client = Client::connect([url.as_str()]).await?;
        workers.push(tokio::spawn(async move {
            let options = LockOptions::new().ttl(Duration::from_secs(2));
            while Instant::now() < until {
                let guard = client.lock("example:prometheus", &options).await?;
                tokio::time::sleep(Duration::from_millis(20)).await; // the work
                guard.release().await?;
            }
            client.shutdown().await
        }));
    }
    for worker in workers {
        worker.await??;
    }

    for line in scrape.render().lines() {
        if line.contains("fencelock_") && !line.starts_with('#') {
            println!("{line}");
        }
    }
    Ok(())
}
