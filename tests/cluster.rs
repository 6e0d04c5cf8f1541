//! The lock against a real 3-master/3-replica Redis Cluster.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Cluster;
use fencelock::{Client, Error, LockOptions, Topology};

async fn client(cluster: &Cluster) -> Client {
    Client::connect(cluster.urls())
        .await
        .expect("connect to cluster")
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_tasks_never_overlap_and_fences_strictly_increase() {
    let cluster = Cluster::start();
    let clients: Vec<Client> = {
        let mut clients = Vec::new();
        for i in 0..5 {
            // Any one reachable node is enough to start.
            clients.push(Client::connect([cluster.nodes[i].url()]).await.unwrap());
        }
        clients
    };
    assert!(clients.iter().all(|c| c.topology() == Topology::Cluster));

    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(Mutex::new(Vec::new()));
    let options = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .timeout(Duration::from_secs(60));
    let mut tasks = Vec::new();
    for task in 0..50 {
        let client = clients[task % clients.len()].clone();
        let (inside, overlaps, grants, options) = (
            inside.clone(),
            overlaps.clone(),
            grants.clone(),
            options.clone(),
        );
        let counter_url = cluster.urls();
        tasks.push(tokio::spawn(async move {
            let guard = client
                .lock("stock:sku-1", &options)
                .await
                .expect("lock within 60 s");
            if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            grants.lock().unwrap().push(guard.fence());
            // A read-modify-write through Redis: overlapping holders would lose updates.
            let counter = redis::cluster::ClusterClient::new(counter_url).unwrap();
            let mut conn = counter.get_async_connection().await.unwrap();
            let value: i64 = redis::cmd("GET")
                .arg("{stock:sku-1}:count")
                .query_async::<Option<i64>>(&mut conn)
                .await
                .unwrap()
                .unwrap_or(0);
            tokio::task::yield_now().await;
            redis::cmd("SET")
                .arg("{stock:sku-1}:count")
                .arg(value + 1)
                .query_async::<()>(&mut conn)
                .await
                .unwrap();
            inside.fetch_sub(1, Ordering::SeqCst);
            guard.release().await.expect("release while held");
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two holders were inside at once"
    );
    let count: i64 = cluster
        .master_of_slot(fencelock::slot_of(b"{stock:sku-1}:count"))
        .cmd(redis::cmd("GET").arg("{stock:sku-1}:count"));
    assert_eq!(count, 50, "no lost updates");
    let grants = grants.lock().unwrap().clone();
    assert_eq!(grants.len(), 50);
    assert!(
        grants.windows(2).all(|w| w[0] < w[1]),
        "fences strictly increase in grant order: {grants:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_and_slots_agree_with_redis() {
    let cluster = Cluster::start();
    let node = &cluster.nodes[0];
    for (key, slot) in [
        ("123456789", 12739),
        ("a{b}c{d}", 3300),
        ("foo{}{bar}", 8363),
        ("foo{{bar}}zap", 4015),
    ] {
        assert_eq!(fencelock::slot_of(key.as_bytes()), slot);
        assert_eq!(
            node.cmd::<u16>(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)),
            slot,
            "{key}"
        );
    }
    // Every slot's tag, checked against the server in one pipeline.
    let mut pipe = redis::pipe();
    for slot in 0..fencelock::SLOT_COUNT {
        pipe.cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(format!("x{{{}}}", fencelock::tag_for_slot(slot).unwrap()));
    }
    let mut conn = redis::Client::open(node.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let slots: Vec<u16> = pipe.query(&mut conn).unwrap();
    assert!(slots.iter().enumerate().all(|(i, s)| usize::from(*s) == i));

    // Locks land where the client says, on the master that owns the slot.
    let lock_client = client(&cluster).await;
    for options in [
        LockOptions::new(),
        LockOptions::new().slot(0),
        LockOptions::new().slot(16383),
        LockOptions::new().tag("orders"),
    ] {
        for name in ["orders:42", "we{ird}", "}"] {
            let guard = lock_client.try_lock(name, &options).await.unwrap();
            let keys = guard.keys().clone();
            assert_eq!(
                node.cmd::<u16>(redis::cmd("CLUSTER").arg("KEYSLOT").arg(keys.lock_key())),
                keys.slot()
            );
            let master = cluster.master_of_slot(keys.slot());
            assert!(master.held(keys.lock_key()), "{keys}");
            guard.release().await.unwrap();
        }
    }
    assert_eq!(
        lock_client
            .keys("x", &LockOptions::new().slot(77))
            .unwrap()
            .slot(),
        77
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn wait_confirms_with_replicas_and_fails_when_the_replica_is_paused() {
    let cluster = Cluster::start();
    let client = client(&cluster).await;
    let confirmed = LockOptions::new().wait_replicas(1, Duration::from_millis(1000));
    let guard = client
        .try_lock("pay:7", &confirmed)
        .await
        .expect("replica acks");
    assert_eq!(guard.replicas_acked(), Some(1));
    let keys = guard.keys().clone();
    guard.release().await.unwrap();

    let master = cluster.master_of_slot(keys.slot());
    let replica = cluster.replica_of(master.port);
    replica.pause();
    let slow_wait = LockOptions::new().wait_replicas(1, Duration::from_millis(1500));
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.try_lock("pay:7", &slow_wait).await })
    };
    // Meanwhile a lock on the same master, without WAIT, is not held up by the blocked WAIT.
    let same_slot =
        LockOptions::new().tag(fencelock::tag_for_slot(keys.slot()).unwrap().to_owned());
    let other = client.try_lock("pay:8", &same_slot).await.unwrap();
    assert_eq!(other.keys().slot(), keys.slot());
    assert!(
        !waiting.is_finished(),
        "the plain acquire finished while WAIT was still blocking"
    );
    other.release().await.unwrap();

    match waiting.await.unwrap() {
        Err(Error::ReplicasNotConfirmed {
            acked: 0,
            required: 1,
            ..
        }) => {}
        other => panic!("expected ReplicasNotConfirmed, got {other:?}"),
    }
    assert!(!master.held(keys.lock_key()), "the lock must not stay held");
    replica.resume();
    cluster.wait_healthy();
    let again = client
        .try_lock("pay:7", &confirmed)
        .await
        .expect("replica back");
    assert_eq!(again.replicas_acked(), Some(1));
    again.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn noscript_on_a_master_costs_one_round_trip_and_no_other_node() {
    let cluster = Cluster::start();
    let client = client(&cluster).await;
    let guard = client.try_lock("flush", &LockOptions::new()).await.unwrap();
    let slot = guard.keys().slot();
    guard.release().await.unwrap();
    let master = cluster.master_of_slot(slot);
    master.cmd::<()>(redis::cmd("SCRIPT").arg("FLUSH"));
    // A paused replica must not matter: only the slot's master is involved.
    let replica = cluster.replica_of(master.port);
    replica.pause();
    let started = std::time::Instant::now();
    let guard = client
        .try_lock("flush", &LockOptions::new())
        .await
        .expect("EVAL fallback");
    guard.release().await.expect("release after flush");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    replica.resume();
    let shas: Vec<&str> = fencelock::lua_scripts()
        .filter(|s| s.name == "acquire" || s.name == "release")
        .map(|s| s.sha1)
        .collect();
    let cached: Vec<i64> = master.cmd(redis::cmd("SCRIPT").arg("EXISTS").arg(shas));
    assert_eq!(
        cached,
        [1, 1],
        "the fallback cached acquire and release on that master again"
    );
}

/// A seed whose server answers the probe with an error that concerns it alone (`BUSY` running
/// a long script; a reply that is not the Redis protocol, from another service on that port)
/// does not fail `connect`: the other seeds answer, and locks work. The healthy seed is held
/// back (`CLIENT PAUSE`) so that both errors arrive before its answer.
#[tokio::test(flavor = "multi_thread")]
async fn a_seed_answering_an_error_of_its_own_does_not_fail_connect() {
    let cluster = Cluster::start();

    // A server busy running a script past `busy-reply-threshold`: it answers BUSY to the probe.
    let busy = common::Standalone::start();
    let _: () = busy.node.cmd(
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("busy-reply-threshold")
            .arg(100),
    );
    let script = {
        let mut conn = busy.node.connection().unwrap();
        conn.set_read_timeout(None).unwrap();
        std::thread::spawn(move || {
            let _ = redis::cmd("EVAL")
                .arg("while true do end")
                .arg(0)
                .query::<()>(&mut conn);
        })
    };
    common::wait_until("BUSY", Duration::from_secs(10), || {
        busy.node
            .try_cmd::<String>(&mut redis::cmd("PING"))
            .is_err_and(|e| e.code() == Some("BUSY"))
    });

    // Another service on the port: an HTTP answer to whatever it is sent.
    let foreign = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let foreign_port = foreign.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in foreign.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = [0u8; 1024];
            let _ = std::io::Read::read(&mut stream, &mut request);
            let _ = std::io::Write::write_all(
                &mut stream,
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            );
        }
    });

    let healthy = &cluster.nodes[0];
    let _: () = healthy.cmd(redis::cmd("CLIENT").arg("PAUSE").arg(500).arg("ALL"));
    let seeds = [
        busy.url(),
        format!("redis://127.0.0.1:{foreign_port}"),
        healthy.url(),
    ];
    let client = Client::connect(seeds)
        .await
        .expect("the healthy seed answers");
    assert_eq!(client.topology(), Topology::Cluster);
    let confirmed = LockOptions::new().wait_replicas(1, Duration::from_millis(1000));
    let guard = client.try_lock("busy:1", &confirmed).await.expect("lock");
    assert_eq!(guard.replicas_acked(), Some(1));
    assert!(cluster
        .master_of_slot(guard.keys().slot())
        .held(guard.keys().lock_key()));
    guard.release().await.unwrap();

    let _: () = busy.node.cmd(redis::cmd("SCRIPT").arg("KILL"));
    script.join().unwrap();
}
