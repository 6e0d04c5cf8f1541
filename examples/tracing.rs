//! fencelock's `tracing` spans and events on stderr through `tracing-subscriber`: every public
//! call runs in a span (`fencelock.lock`, `fencelock.hold` for a guard's `release`/`extend`,
//! `fencelock.semaphore`, ...) carrying the lock's name and kind; grants, releases, retries and
//! lost locks are events inside them (`debug` and `trace` level; warnings at `warn`).
//!
//! Run against any Redis (a standalone `redis-server` on its default port will do):
//! `RUST_LOG=fencelock=debug cargo run --example tracing -- redis://127.0.0.1:6379`
//! (`RUST_LOG=fencelock=trace` shows every wake-up and retry too).
//!
//! OpenTelemetry: the spans are plain `tracing` spans, so an OpenTelemetry layer exports them
//! like the application's own. With the crates `opentelemetry`, `opentelemetry_sdk`,
//! `opentelemetry-otlp` and `tracing-opentelemetry` (their versions must match each other; see
//! tracing-opentelemetry's README), the subscriber below becomes:
//!
//! ```text
//! use opentelemetry::trace::TracerProvider as _;
//! use tracing_subscriber::prelude::*;
//!
//! let exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic().build()?;
//! let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
//!     .with_batch_exporter(exporter)
//!     .build();
//! tracing_subscriber::registry()
//!     .with(tracing_subscriber::EnvFilter::from_default_env())
//!     .with(tracing_subscriber::fmt::layer())
//!     .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("my-service")))
//!     .init();
//! // ... and `provider.shutdown()` before the process exits, to flush the last spans.
//! ```
//!
//! That variant is not built here (it would add a gRPC stack to fencelock's dev-dependencies).

use std::time::Duration;

use fencelock::{Client, LockOptions};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("fencelock=debug")),
        )
        .with_writer(std::io::stderr)
        .init();
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());

    let client = Client::connect([url]).await?;
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let mut guard = client.lock("example:tracing", &options).await?;
    // A second attempt while held: an event for the busy answer, then Error::Busy.
    let busy = client.try_lock("example:tracing", &options).await;
    println!(
        "try_lock while held: {}",
        busy.map(|_| "granted").unwrap_or("busy")
    );
    guard.extend(Duration::from_secs(10)).await?;
    println!("holding fence {}", guard.fence());
    guard.release().await?;
    client.shutdown().await?;
    Ok(())
}
