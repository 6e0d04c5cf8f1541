//! TLS (`rediss://`) against real TLS-only servers with certificates made by `openssl`: the
//! CA and client certificate files on every connection (main, subscriber, WAIT lane, cluster
//! nodes), clean errors for certificate failures and bad files, and the CLI's `--tls-*` flags.
#![cfg(feature = "tls")]

mod common;

use std::error::Error as _;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::{eventually, Cluster, Standalone, TlsCerts};
use fencelock::{Client, Error, LockKeys, LockOptions, Placement, Topology};

/// The error's message and every cause below it, one line.
fn chain(err: &Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        text.push_str(" / ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[tokio::test]
async fn standalone_lock_and_release_over_tls_with_the_ca() {
    let certs = TlsCerts::generate();
    let server = Standalone::start_tls(&certs, "no");
    assert!(server.url().starts_with("rediss://"));
    let client = Client::builder([server.url()])
        .tls_ca_file(certs.ca())
        .connect()
        .await
        .unwrap();
    assert_eq!(client.topology(), Topology::Standalone);
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let key = client
        .keys("tls:one", &options)
        .unwrap()
        .lock_key()
        .to_owned();
    let guard = client.lock("tls:one", &options).await.unwrap();
    assert!(server.node.held(&key));
    guard.release().await.unwrap();
    assert!(!server.node.held(&key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_over_tls_locks_wakes_waiters_and_waits_for_replicas() {
    let certs = TlsCerts::generate();
    let cluster = tokio::task::spawn_blocking({
        let certs = certs.clone();
        move || Cluster::start_tls(&certs)
    })
    .await
    .unwrap();
    let name = "tls:wake";
    let keys = LockKeys::new("fencelock", name, &Placement::ByName).unwrap();
    let master = cluster.master_of_slot(keys.slot());
    // Seeded with one other node only: the lock's master is found through the slot map, so
    // the connections to nodes that were not seeds must carry the CA too.
    let seed = cluster
        .nodes
        .iter()
        .find(|n| n.port != master.port)
        .unwrap();
    let connect = || {
        Client::builder([seed.url()])
            .tls_ca_file(certs.ca())
            .connect()
    };
    let (holder, waiters) = (connect().await.unwrap(), connect().await.unwrap());
    assert_eq!(holder.topology(), Topology::Cluster);

    let long = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .timeout(Duration::from_secs(20));
    let first = holder.lock(name, &long).await.unwrap();
    assert!(master.held(keys.lock_key()));

    // A waiter subscribes over TLS and is woken by the release, long before the 30 s lease.
    let waiter = tokio::spawn({
        let (client, options) = (waiters.clone(), long.clone());
        async move { client.lock(name, &options).await }
    });
    eventually("the waiter's subscription", Duration::from_secs(5), || {
        master.lock_waiters_subscribed(keys.lock_key()) == 1
    })
    .await;
    let (released, first_fence) = (Instant::now(), first.fence());
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "the hand-off took {:?}",
        released.elapsed()
    );
    assert!(second.fence() > first_fence);
    assert!(waiters.stats().wakeups >= 1, "{:?}", waiters.stats());
    second.release().await.unwrap();

    // WAIT runs on a lane of its own, also over TLS.
    let confirmed = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait_replicas(1, Duration::from_secs(2));
    let guard = holder.lock("tls:wait", &confirmed).await.unwrap();
    assert!(holder.stats().replica_acks >= 1, "{:?}", holder.stats());
    guard.release().await.unwrap();

    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = TlsCerts::generate();
    let server = Standalone::start_tls(&certs, "yes");

    let started = Instant::now();
    let err = Client::builder([server.url()])
        .tls_ca_file(certs.ca())
        .connect_timeout(Duration::from_secs(1))
        .request_timeout(Duration::from_secs(1))
        .connect()
        .await
        .expect_err("the server requires a client certificate");
    let Error::Connect { reason, .. } = &err else {
        panic!("not a connect error: {}", chain(&err));
    };
    assert!(reason.contains("client certificate"), "{reason}");
    assert!(
        chain(&err).contains("CertificateRequired"),
        "{}",
        chain(&err)
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    let client = Client::builder([server.url()])
        .tls_ca_file(certs.ca())
        .tls_client_cert_files(certs.client_cert(), certs.client_key())
        .connect()
        .await
        .unwrap();
    let guard = client
        .lock("tls:mutual", &LockOptions::new())
        .await
        .unwrap();
    assert!(server.node.held("fencelock:{tls:mutual}:lock"));
    guard.release().await.unwrap();
}

#[tokio::test]
async fn an_untrusted_server_certificate_is_a_tls_connect_error_with_its_cause() {
    let certs = TlsCerts::generate();
    let server = Standalone::start_tls(&certs, "no");
    let err = Client::builder([server.url()])
        .tls_ca_file(certs.other_ca())
        .connect()
        .await
        .expect_err("the server's certificate is not signed by other-ca");
    let Error::Connect { reason, .. } = &err else {
        panic!("not a connect error: {}", chain(&err));
    };
    assert!(reason.contains("TLS handshake failed"), "{reason}");
    let causes = chain(&err);
    assert!(causes.contains("invalid peer certificate"), "{causes}");
    assert!(causes.contains("UnknownIssuer"), "{causes}");

    // Without a CA file the platform's roots do not know the test CA either.
    let err = Client::connect([server.url()]).await.unwrap_err();
    assert!(chain(&err).contains("UnknownIssuer"), "{}", chain(&err));
}

#[tokio::test]
async fn unusable_tls_files_are_invalid_config_naming_the_file() {
    let certs = TlsCerts::generate();
    // Checked before any connection is made: nothing listens here.
    let url = "rediss://127.0.0.1:1";
    let garbage = certs.path("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
    let missing = certs.path("missing.pem");
    let cases = [
        (
            Client::builder([url]).tls_ca_file(&missing),
            missing.clone(),
            "cannot be read",
        ),
        (
            Client::builder([url]).tls_ca_file(&garbage),
            garbage.clone(),
            "not valid PEM",
        ),
        (
            Client::builder([url]).tls_ca_file(certs.client_key()),
            certs.client_key(),
            "no PEM certificate",
        ),
        (
            Client::builder([url]).tls_client_cert_files(certs.client_cert(), certs.ca()),
            certs.ca(),
            "no usable PEM private key",
        ),
        (
            Client::builder([url])
                .tls_client_cert_files(certs.client_cert(), certs.path("server.key")),
            certs.client_cert(),
            "belong together",
        ),
    ];
    for (builder, file, problem) in cases {
        let err = builder.connect().await.unwrap_err();
        let Error::InvalidConfig { reason } = &err else {
            panic!("not invalid config: {}", chain(&err));
        };
        assert!(reason.contains(&file.display().to_string()), "{reason}");
        assert!(reason.contains(problem), "{reason}");
    }

    let err = Client::builder(["redis://127.0.0.1:1"])
        .tls_ca_file(certs.ca())
        .connect()
        .await
        .unwrap_err();
    let Error::InvalidConfig { reason } = &err else {
        panic!("not invalid config: {}", chain(&err));
    };
    assert!(reason.contains("rediss://"), "{reason}");
}

fn fencelock(url: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fencelock"));
    for var in [
        "FENCELOCK_URL",
        "FENCELOCK_TLS_CA",
        "FENCELOCK_TLS_CERT",
        "FENCELOCK_TLS_KEY",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied())
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .expect("run fencelock")
}

#[test]
fn cli_speaks_tls_with_its_flags() {
    let certs = TlsCerts::generate();
    let server = Standalone::start_tls(&certs, "yes");
    let (ca, cert, key) = (
        certs.ca().display().to_string(),
        certs.client_cert().display().to_string(),
        certs.client_key().display().to_string(),
    );
    let exec = ["exec", "job", "--", "sh", "-c", "echo $FENCELOCK_TOKEN"];

    let flags = [
        &["--tls-ca", &ca, "--tls-cert", &cert, "--tls-key", &key][..],
        &exec,
    ]
    .concat();
    let output = fencelock(&server.url(), &flags, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let token = String::from_utf8(output.stdout).unwrap();
    assert!(token.trim().parse::<u64>().unwrap() > 0, "{token:?}");

    // The same from the environment.
    let env = [
        ("FENCELOCK_TLS_CA", ca.as_str()),
        ("FENCELOCK_TLS_CERT", cert.as_str()),
        ("FENCELOCK_TLS_KEY", key.as_str()),
    ];
    let output = fencelock(&server.url(), &exec, &env);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");

    // A certificate without its key is bad input.
    let flags = [&["--tls-ca", &ca, "--tls-cert", &cert][..], &exec].concat();
    let output = fencelock(&server.url(), &flags, &[]);
    assert_eq!(output.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--tls-key"));
    let output = fencelock(&server.url(), &exec, &env[..2]);
    assert_eq!(output.status.code(), Some(64));

    // A CA that did not sign the server's certificate: unavailable, with the cause.
    let other = certs.other_ca().display().to_string();
    let flags = [
        &["--tls-ca", &other, "--tls-cert", &cert, "--tls-key", &key][..],
        &exec,
    ]
    .concat();
    let output = fencelock(&server.url(), &flags, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("TLS handshake failed"), "{stderr}");
    assert!(
        stderr.contains("caused by: invalid peer certificate: UnknownIssuer"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

/// A DNS failure, a refused connection and the two TLS mismatches (a plain URL for a TLS port,
/// `rediss://` for a plain one) each get their own reason, which does not repeat the cause
/// (`source()` carries it) and names no CLI flag.
#[tokio::test]
async fn connect_errors_tell_dns_refusal_and_tls_mismatch_apart() {
    let certs = TlsCerts::generate();
    let tls = Standalone::start_tls(&certs, "no");
    let plain = Standalone::start();
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cases = [
        (
            tls.url().replace("rediss://", "redis://"),
            "use a rediss:// URL",
        ),
        (
            plain.url().replace("redis://", "rediss://"),
            "no answer to the TLS handshake: if that port speaks plain Redis (no TLS), use a \
             redis:// URL",
        ),
        (format!("redis://127.0.0.1:{free}"), "connection refused"),
        (
            "redis://no-such-host.invalid:6379".to_owned(),
            "could not be resolved (DNS)",
        ),
    ];
    for (url, expected) in cases {
        let mut builder = Client::builder([url.clone()])
            .connect_timeout(Duration::from_secs(1))
            .request_timeout(Duration::from_secs(1));
        if url.starts_with("rediss://") {
            builder = builder.tls_ca_file(certs.ca());
        }
        let err = builder.connect().await.expect_err(&url);
        let Error::Connect {
            reason,
            source: Some(source),
            ..
        } = &err
        else {
            panic!("{url}: not a connect error with a cause: {}", chain(&err));
        };
        assert!(reason.contains(expected), "{url}: {reason}");
        let message = err.to_string();
        assert!(
            !message.contains(&source.to_string()),
            "{url}: the message repeats its cause: {message}"
        );
        assert!(!message.contains("--"), "{url}: {message}");
    }
}
