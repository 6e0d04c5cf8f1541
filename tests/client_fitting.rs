//! Fitting a client into an application: building it from redis-rs clients, `with_lock`, and
//! `shutdown` waiting for background releases.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, Cluster, Standalone};
use fencelock::{Client, Error, LockOptions, Topology};

const KEY: &str = "fencelock:{orders:42}:lock";

#[tokio::test(flavor = "multi_thread")]
async fn a_client_is_built_from_a_redis_client_with_its_password() {
    let server = Standalone::start_with_password("s3cret");
    let redis = redis::Client::open(server.url()).expect("redis client");
    assert!(server.url().contains("s3cret"), "{}", server.url());
    let client = Client::from_redis_client(&redis)
        .prefix("fitted")
        .connect()
        .await
        .expect("connect through the redis client's connection info");
    assert_eq!(client.topology(), Topology::Standalone);
    let guard = client
        .lock("orders:42", &LockOptions::new())
        .await
        .expect("lock");
    assert!(server.node.held("fitted:{orders:42}:lock"));
    guard.release().await.expect("release");
    assert!(!server.node.held("fitted:{orders:42}:lock"));

    // The password is what authenticates: the same address without it is refused.
    let bare = redis::Client::open(format!("redis://{}", server.node.addr())).unwrap();
    match Client::from_redis_client(&bare).connect().await {
        Err(Error::Connect { reason, .. }) => {
            assert!(reason.contains("authentication"), "{reason}")
        }
        other => panic!("expected an authentication failure, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_is_built_from_a_cluster_client_and_waiters_wake_on_release() {
    let cluster = Cluster::start();
    let redis = redis::cluster::ClusterClient::builder(cluster.urls())
        .use_protocol(redis::ProtocolVersion::RESP3)
        .build()
        .expect("cluster client");
    let client = Client::from_cluster_client(&redis)
        .connect()
        .await
        .expect("connect through the cluster client");
    assert_eq!(client.topology(), Topology::Cluster);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(10));
    let first = client.lock("orders:42", &options).await.expect("lock");
    let slot = first.keys().slot();
    assert!(cluster.master_of_slot(slot).held(KEY));

    // A second client from the same cluster client: a waiter of the holder's own client would
    // queue behind it locally and never subscribe.
    let other = Client::from_cluster_client(&redis)
        .connect()
        .await
        .expect("connect through the cluster client");
    let waiter = {
        let client = other.clone();
        let options = options.clone();
        tokio::spawn(async move { client.lock("orders:42", &options).await })
    };
    // The waiter is subscribed once the server counts a subscriber on the lock's channel.
    eventually("the waiter subscribes", Duration::from_secs(5), || {
        cluster.master_of_slot(slot).lock_waiters_subscribed(KEY) > 0
    })
    .await;
    let fence = first.fence();
    let released = Instant::now();
    first.release().await.expect("release");
    let second = waiter.await.unwrap().expect("the waiter gets the lock");
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "woken by the release, not by the 30 s lease: {:?}",
        released.elapsed()
    );
    assert!(second.fence() > fence);
    assert!(other.stats().wakeups >= 1, "{:?}", other.stats());
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn with_lock_returns_the_value_and_releases() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let node = &server.node;
    let fence = client
        .with_lock("orders:42", &options, |fence| async move {
            assert!(node.held(KEY), "held while the work runs");
            Ok::<_, Error>(fence)
        })
        .await
        .expect("the work's value");
    assert!(!server.node.held(KEY), "released after Ok");
    let next = client.try_lock("orders:42", &options).await.unwrap();
    assert!(next.fence() > fence);
    next.release().await.unwrap();
}

#[derive(Debug)]
enum AppError {
    Lock(Error),
    Refused(&'static str),
}

impl From<Error> for AppError {
    fn from(err: Error) -> Self {
        AppError::Lock(err)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_lock_returns_the_work_error_and_releases() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let outcome: Result<(), AppError> = client
        .with_lock("orders:42", &options, |_fence| async {
            Err(AppError::Refused("out of stock"))
        })
        .await;
    assert!(
        matches!(outcome, Err(AppError::Refused("out of stock"))),
        "{outcome:?}"
    );
    assert!(!server.node.held(KEY), "released after Err");

    // An acquisition error comes back through the work's error type.
    let holder = client.try_lock("orders:42", &options).await.unwrap();
    let busy: Result<(), AppError> = client
        .with_lock(
            "orders:42",
            &options.clone().timeout(Duration::from_millis(50)),
            |_| async { panic!("the work must not run without the lock") },
        )
        .await;
    assert!(
        matches!(busy, Err(AppError::Lock(Error::Busy { .. }))),
        "{busy:?}"
    );
    holder.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn with_lock_releases_after_a_panic_and_when_dropped() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(60));
    let panicking = {
        let client = client.clone();
        let options = options.clone();
        tokio::spawn(async move {
            client
                .with_lock("orders:42", &options, |_| async {
                    panic!("the work panics");
                    #[allow(unreachable_code)]
                    Ok::<(), Error>(())
                })
                .await
        })
    };
    assert!(panicking.await.unwrap_err().is_panic());
    client
        .shutdown()
        .await
        .expect("the drop's release finished");
    assert!(!server.node.held(KEY), "released after the panic");

    // A with_lock call dropped while its work runs releases too.
    let started = Arc::new(tokio::sync::Notify::new());
    let call = {
        let client = client.clone();
        let started = Arc::clone(&started);
        tokio::spawn(async move {
            client
                .with_lock("orders:42", &options, |_| async move {
                    started.notify_one();
                    std::future::pending::<Result<(), Error>>().await
                })
                .await
        })
    };
    started.notified().await;
    assert!(server.node.held(KEY));
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    client
        .shutdown()
        .await
        .expect("the drop's release finished");
    assert!(
        !server.node.held(KEY),
        "released after the call was dropped"
    );
}

/// Sets its flag when dropped: shows that the work's future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_lock_stops_the_work_when_the_watchdog_finds_the_lock_lost() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_millis(600))
        .watchdog(true);
    let dropped = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Notify::new());
    let work = {
        let dropped = Arc::clone(&dropped);
        let started = Arc::clone(&started);
        move |_fence| async move {
            let _flag = DropFlag(dropped);
            started.notify_one();
            std::future::pending::<()>().await;
            Ok::<_, Error>(())
        }
    };
    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.with_lock("orders:42", &options, work).await })
    };
    started.notified().await;
    assert!(server.node.held(KEY));
    server.node.cmd::<i64>(redis::cmd("DEL").arg(KEY));
    let deleted = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(3), call)
        .await
        .expect("with_lock returns promptly after the loss")
        .unwrap();
    match outcome {
        Err(err) if err.is_lock_lost() => {}
        other => panic!("expected the loss, got {other:?}"),
    }
    assert!(
        deleted.elapsed() < Duration::from_millis(1500),
        "{:?}",
        deleted.elapsed()
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the work's future was dropped"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_waits_for_the_release_of_a_dropped_guard() {
    let server = Standalone::start();
    let client = Client::connect([server.url()]).await.unwrap();
    let options = LockOptions::new().ttl(Duration::from_secs(60));
    for round in 0..20 {
        let guard = client.lock("orders:42", &options).await.unwrap();
        drop(guard);
        client
            .shutdown()
            .await
            .expect("background release finished");
        assert!(
            !server.node.held(KEY),
            "round {round}: the lock is free right after shutdown"
        );
    }
    // Shutdown with nothing pending returns at once.
    let start = Instant::now();
    client.shutdown().await.unwrap();
    assert!(start.elapsed() < Duration::from_millis(100));
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_returns_within_its_bound_when_the_node_is_paused() {
    let server = Standalone::start();
    let client = Client::builder([server.url()])
        .request_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let guard = client
        .lock(
            "orders:42",
            &LockOptions::new().ttl(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    server.node.pause();
    drop(guard);
    let start = Instant::now();
    let outcome = client.shutdown_within(Duration::from_millis(200)).await;
    let took = start.elapsed();
    assert!(
        matches!(outcome, Err(Error::ShutdownIncomplete { pending: 1, .. })),
        "{outcome:?}"
    );
    assert!(took < Duration::from_millis(400), "{took:?}");
    // The release gives up within one request timeout, and `shutdown` with it.
    let start = Instant::now();
    let outcome = client.shutdown().await;
    let took = start.elapsed();
    assert!(took < Duration::from_millis(800), "{took:?} {outcome:?}");
    server.node.resume();
    assert!(
        server.node.held(KEY),
        "the paused node never got the release"
    );
}

#[cfg(feature = "tls")]
#[tokio::test(flavor = "multi_thread")]
async fn a_redis_client_built_with_tls_certificates_lends_them() {
    let certs = common::TlsCerts::generate();
    let server = Standalone::start_tls(&certs, "yes");
    let read = |path: std::path::PathBuf| std::fs::read(path).expect("certificate file");
    let redis = redis::Client::build_with_tls(
        server.url(),
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read(certs.client_cert()),
                client_key: read(certs.client_key()),
            }),
            root_cert: Some(read(certs.ca())),
        },
    )
    .expect("redis client with TLS");
    let client = Client::from_redis_client(&redis)
        .connect()
        .await
        .expect("the CA and client certificate come from the redis client");
    let guard = client
        .lock("orders:42", &LockOptions::new())
        .await
        .expect("lock over TLS");
    assert!(server.node.held(KEY));
    guard.release().await.unwrap();

    // Without them the same URL fails the handshake: the certificates were what made it work.
    match Client::connect([server.url()]).await {
        Err(Error::Connect { .. }) => {}
        other => panic!("expected a TLS failure, got {other:?}"),
    }
}
