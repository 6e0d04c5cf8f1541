//! Test harness: real `redis-server` processes on free 127.0.0.1 ports, stopped by pid on drop
//! (also when a test fails). Waits poll for the awaited condition; no fixed sleeps.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod chaos;
pub mod cli;
pub mod lock_state;
pub mod module;
pub mod netns;
pub mod semaphore;

#[allow(unused_imports)]
pub use lock_state::{grant_values, LockState};

/// Polls `condition` every 20 ms until it holds, panicking after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !condition() {
        assert!(
            Instant::now() < until,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `condition` every 5 ms from async code until it holds, panicking after `limit`.
pub async fn eventually(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < until, "timed out after {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Polls `call` until it has answered `Pending` `polls` times, then drops it there, in the
/// same poll (on a current-thread runtime nothing else runs in between): `None` when it was
/// cut, else what it returned. Cutting at 1, 2, 3, ... polls cuts a call at each of its stages.
pub async fn cut_after<F: std::future::Future>(call: F, polls: usize) -> Option<F::Output> {
    let mut call = std::pin::pin!(call);
    let mut left = polls;
    std::future::poll_fn(move |cx| match call.as_mut().poll(cx) {
        std::task::Poll::Ready(out) => std::task::Poll::Ready(Some(out)),
        std::task::Poll::Pending if left <= 1 => std::task::Poll::Ready(None),
        std::task::Poll::Pending => {
            left -= 1;
            std::task::Poll::Pending
        }
    })
    .await
}

/// Tasks alive on the current Tokio runtime, to show that nothing is left running.
pub fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// A port whose cluster bus port (+10000) is free too.
pub fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let _ = NEXT.compare_exchange(
        0,
        20000 + (std::process::id() % 400) as u16 * 20,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    loop {
        let port = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(port < 30000, "no free ports left");
        if port_free(port) && port_free(port + 10000) {
            return port;
        }
    }
}

fn scratch_dir(port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fencelock-test-{}-{port}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Certificates made with `openssl` for TLS servers: a CA, a certificate for 127.0.0.1 and
/// localhost signed by it (server and client use, as nodes present it to each other), a client
/// certificate signed by it, and an unrelated CA. The directory is removed on drop.
pub struct TlsCerts {
    dir: PathBuf,
}

impl TlsCerts {
    pub fn generate() -> Arc<TlsCerts> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "fencelock-tls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create certificate dir");
        let certs = TlsCerts { dir };
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&certs.dir)
                .output()
                .expect("openssl must be installed");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let new_key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            let (key, pem) = (format!("{ca}.key"), format!("{ca}.pem"));
            let subject = format!("/CN=fencelock test {ca}");
            openssl(
                &[
                    &["req", "-x509"][..],
                    &new_key,
                    &["-keyout", &key, "-out", &pem],
                ]
                .concat()
                .into_iter()
                .chain(["-days", "2", "-subj", &subject])
                .collect::<Vec<_>>(),
            );
        }
        for (name, usage) in [
            (
                "server",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth",
            ),
            ("client", "extendedKeyUsage=clientAuth"),
        ] {
            let (key, csr, pem, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.pem"),
                format!("{name}.ext"),
            );
            std::fs::write(
                certs.dir.join(&ext),
                format!("basicConstraints=CA:FALSE\n{usage}\n"),
            )
            .expect("write extensions");
            let subject = format!("/CN=fencelock test {name}");
            openssl(
                &[
                    &["req"][..],
                    &new_key,
                    &["-keyout", &key, "-out", &csr, "-subj", &subject],
                ]
                .concat(),
            );
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &pem,
                "-extfile",
                &ext,
            ]);
        }
        Arc::new(certs)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// The CA that signed the server and client certificates.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// A CA that signed nothing here.
    pub fn other_ca(&self) -> PathBuf {
        self.path("other-ca.pem")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.path("client.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }

    /// `redis-server` arguments for a TLS-only server on `port` (`--tls-auth-clients mode`).
    fn server_args(&self, port: u16, auth_clients: &str) -> Vec<String> {
        let file = |name: &str| self.path(name).display().to_string();
        [
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            &file("server.pem"),
            "--tls-key-file",
            &file("server.key"),
            "--tls-ca-cert-file",
            &file("ca.pem"),
            "--tls-auth-clients",
            auth_clients,
        ]
        .map(str::to_owned)
        .to_vec()
    }

    /// `redis-cli` arguments for TLS with the CA and the client certificate.
    fn cli_args(&self) -> Vec<String> {
        let file = |name: &str| self.path(name).display().to_string();
        vec![
            "--tls".into(),
            "--cacert".into(),
            file("ca.pem"),
            "--cert".into(),
            file("client.pem"),
            "--key".into(),
            file("client.key"),
        ]
    }

    /// A redis-rs client for `url` that trusts the CA and presents the client certificate.
    #[cfg(feature = "tls")]
    fn client(&self, url: &str) -> redis::RedisResult<redis::Client> {
        let read = |name: &str| std::fs::read(self.path(name)).expect("certificate file");
        redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: Some(redis::ClientTlsConfig {
                    client_cert: read("client.pem"),
                    client_key: read("client.key"),
                }),
                root_cert: Some(read("ca.pem")),
            },
        )
    }

    #[cfg(not(feature = "tls"))]
    fn client(&self, _url: &str) -> redis::RedisResult<redis::Client> {
        panic!("TLS servers need fencelock's `tls` feature")
    }
}

impl Drop for TlsCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Where and how a redis-server runs beyond its port: in a network namespace (`ip netns exec`),
/// bound to and announcing an address of its own, with extra environment (the clock shim).
#[derive(Clone, Debug, Default)]
pub struct Launch {
    /// The network namespace to start it in (`ip netns exec NAME redis-server ...`).
    pub netns: Option<String>,
    /// The address it binds and announces (`--cluster-announce-ip`); 127.0.0.1 when `None`.
    pub host: Option<String>,
    /// Extra environment, e.g. `LD_PRELOAD` of the clock shim.
    pub env: Vec<(String, String)>,
}

/// One redis-server process.
pub struct Node {
    pub port: u16,
    /// The address clients reach it on (127.0.0.1 unless started in a namespace).
    pub host: String,
    child: Child,
    dir: PathBuf,
    password: Option<String>,
    /// Set for a TLS-only server: its URL is `rediss://`.
    tls: Option<Arc<TlsCerts>>,
    killed: bool,
    /// The command line (listening and extra arguments) and the launch, to start it again.
    listen: Vec<String>,
    extra: Vec<String>,
    launch: Launch,
}

impl Node {
    fn spawn(extra: &[&str]) -> Node {
        Self::spawn_with(extra, None)
    }

    fn spawn_with(extra: &[&str], password: Option<&str>) -> Node {
        Self::spawn_inner(extra, password, None)
    }

    /// A TLS-only server (`--tls-auth-clients auth_clients`).
    fn spawn_tls(extra: &[&str], certs: &Arc<TlsCerts>, auth_clients: &str) -> Node {
        Self::spawn_inner(extra, None, Some((certs, auth_clients)))
    }

    fn spawn_inner(
        extra: &[&str],
        password: Option<&str>,
        tls: Option<(&Arc<TlsCerts>, &str)>,
    ) -> Node {
        Self::spawn_launch(extra, password, tls, Launch::default())
    }

    /// A plain server started as `launch` says (namespace, address, environment).
    pub fn spawn_launched(extra: &[&str], launch: Launch) -> Node {
        Self::spawn_launch(extra, None, None, launch)
    }

    fn spawn_launch(
        extra: &[&str],
        password: Option<&str>,
        tls: Option<(&Arc<TlsCerts>, &str)>,
        launch: Launch,
    ) -> Node {
        let port = free_port();
        let dir = scratch_dir(port);
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let listen = match tls {
            Some((certs, auth_clients)) => certs.server_args(port, auth_clients),
            None => vec!["--port".into(), port.to_string()],
        };
        let mut node = Node {
            port,
            host: launch
                .host
                .clone()
                .unwrap_or_else(|| "127.0.0.1".to_owned()),
            child: Self::launch(&launch, &listen, &extra, &dir),
            dir,
            password: password.map(str::to_owned),
            tls: tls.map(|(certs, _)| Arc::clone(certs)),
            killed: false,
            listen,
            extra,
            launch,
        };
        node.await_answer();
        node
    }

    fn launch(launch: &Launch, listen: &[String], extra: &[String], dir: &Path) -> Child {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("redis.log"))
            .expect("log file");
        let mut command = match &launch.netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns, "redis-server"]);
                command
            }
            None => Command::new("redis-server"),
        };
        let host = launch.host.as_deref().unwrap_or("127.0.0.1");
        command
            .args(listen)
            .args(["--bind", host, "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .args(extra)
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::from(log))
            .stderr(Stdio::null());
        if launch.host.is_some() {
            command.args(["--protected-mode", "no", "--cluster-announce-ip", host]);
        }
        command
            .spawn()
            .expect("redis-server must be installed (scripts/test.sh installs it)")
    }

    /// Waits until the server answers, and checks that it is this node's process (another
    /// server that took the port between its choice and the start would answer too).
    fn await_answer(&mut self) {
        let port = self.port;
        let pid = self.child.id();
        let log = self.dir.join("redis.log");
        let mut exited = None;
        wait_until(&format!("redis on {port}"), Duration::from_secs(10), || {
            exited = self.child.try_wait().ok().flatten();
            exited.is_some() || self.answers()
        });
        if let Some(status) = exited {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(5).collect();
            panic!("redis-server on port {port} exited ({status}); its log ends: {tail:?}");
        }
        let info = self.info("server");
        assert!(
            info.lines()
                .any(|line| line.trim() == format!("process_id:{pid}")),
            "port {port} is answered by another server than ours (pid {pid})"
        );
    }

    /// SIGKILLs the server (if running) and starts it again on the same port, directory and
    /// arguments, without its data: no persistence is configured, so it comes back EMPTY. A
    /// cluster node keeps its `nodes.conf` (its identity, role, slots and config epoch), as a
    /// production node with persistence off does; restarted before the cluster notices, it is
    /// still the slot's master, and its replica resynchronises from it (losing the data too).
    pub fn restart_empty(&mut self) {
        self.kill();
        // A node that was ever a replica keeps the RDB file of its last full sync.
        let _ = std::fs::remove_file(self.dir.join("dump.rdb"));
        self.child = Self::launch(&self.launch, &self.listen, &self.extra, &self.dir);
        self.killed = false;
        self.await_answer();
    }

    /// The file the clock shim reads this node's clock offset from (see `netns::ClockShim`).
    pub fn clock_offset_file(&self) -> PathBuf {
        self.dir.join("clock_offset_ms")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        match &self.password {
            Some(password) => format!("{scheme}://:{password}@{}:{}", self.host, self.port),
            None => format!("{scheme}://{}:{}", self.host, self.port),
        }
    }

    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    pub fn answers(&self) -> bool {
        let addr = (self.host.as_str(), self.port);
        std::net::ToSocketAddrs::to_socket_addrs(&addr)
            .ok()
            .and_then(|mut a| a.next())
            .is_some_and(|a| {
                std::net::TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok()
            })
            && self.try_cmd::<String>(&mut redis::cmd("PING")).is_ok()
    }

    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = match &self.tls {
            Some(certs) => certs.client(&self.url())?,
            None => redis::Client::open(self.url())?,
        };
        let conn = client.get_connection_with_timeout(Duration::from_secs(2))?;
        conn.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(conn)
    }

    /// Runs one command on this node, whatever its slots.
    pub fn try_cmd<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> redis::RedisResult<T> {
        let mut conn = self.connection()?;
        cmd.query(&mut conn)
    }

    /// The node's cluster id (`CLUSTER MYID`).
    pub fn id(&self) -> String {
        self.cmd(redis::cmd("CLUSTER").arg("MYID"))
    }

    /// The node's config epoch (`cluster_my_epoch` of `CLUSTER INFO`).
    pub fn config_epoch(&self) -> u64 {
        let info: String = self.cmd(redis::cmd("CLUSTER").arg("INFO"));
        info.lines()
            .find_map(|line| line.strip_prefix("cluster_my_epoch:"))
            .and_then(|epoch| epoch.trim().parse().ok())
            .expect("cluster_my_epoch")
    }

    pub fn cmd<T: redis::FromRedisValue>(&self, cmd: &mut redis::Cmd) -> T {
        self.try_cmd(cmd)
            .unwrap_or_else(|e| panic!("{:?} on {}: {e}", cmd.args_iter().next(), self.port))
    }

    /// Subscribers of the sharded channel `channel` on this node (`PUBSUB SHARDNUMSUB`).
    pub fn sharded_subscribers(&self, channel: &str) -> i64 {
        let reply: Vec<redis::Value> =
            self.cmd(redis::cmd("PUBSUB").arg("SHARDNUMSUB").arg(channel));
        reply
            .get(1)
            .map(|v| redis::from_redis_value(v.clone()).unwrap())
            .unwrap_or(0)
    }

    /// Subscribers this node counts for waiters of the lock `key` (sharded channels): the
    /// lock's own channel (waiters without a place in its queue) and its clients' channels
    /// `<key>:w:<client>` (waiters with a place, issue 25).
    pub fn lock_waiters_subscribed(&self, key: &str) -> i64 {
        let channels: Vec<String> = self.cmd(
            redis::cmd("PUBSUB")
                .arg("SHARDCHANNELS")
                .arg(format!("{key}:w:*")),
        );
        self.sharded_subscribers(key)
            + channels
                .iter()
                .map(|channel| self.sharded_subscribers(channel))
                .sum::<i64>()
    }

    /// [`Node::lock_waiters_subscribed`] on a standalone server (plain channels).
    pub fn lock_waiters_subscribed_plain(&self, key: &str) -> i64 {
        let mut channels: Vec<String> = self.cmd(
            redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg(format!("{key}:w:*")),
        );
        channels.push(key.to_owned());
        let reply: Vec<redis::Value> = self.cmd(redis::cmd("PUBSUB").arg("NUMSUB").arg(&channels));
        reply
            .chunks(2)
            .filter_map(|pair| pair.get(1))
            .map(|n| redis::from_redis_value::<i64>(n.clone()).unwrap_or(0))
            .sum()
    }

    /// The remaining lease of fencelock lock `key` on this node in ms, or `None` when nobody
    /// holds it (the key itself stays: it keeps the fence).
    pub fn lease_ms(&self, key: &str) -> Option<i64> {
        let remaining: i64 = self.cmd(
            redis::cmd("EVAL")
                .arg(
                    "local t = redis.call('TIME') \
                     local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
                     local u, o = string.match(redis.call('HGET', KEYS[1], 'until') or '', \
                     '^(%d+) %d+ (%S*)') \
                     if o and o ~= '' and tonumber(u) > now then \
                     return tonumber(u) - now end return -1",
                )
                .arg(1)
                .arg(key),
        );
        (remaining > 0).then_some(remaining)
    }

    /// Whether fencelock lock `key` is held.
    pub fn held(&self, key: &str) -> bool {
        self.lease_ms(key).is_some()
    }

    pub fn info(&self, section: &str) -> String {
        self.try_cmd(redis::cmd("INFO").arg(section))
            .unwrap_or_default()
    }

    /// How many times the server ran `command` so far, as `INFO commandstats` names it
    /// (`evalsha`, `spublish`, `cluster|info`); 0 for none.
    pub fn calls(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        self.info("commandstats")
            .lines()
            .find_map(|line| line.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// Script calls (`EVALSHA` and `EVAL`) the server ran so far.
    pub fn script_calls(&self) -> u64 {
        self.calls("evalsha") + self.calls("eval")
    }

    /// Calls of the module's commands (`fencelock.*`) the server ran so far.
    pub fn module_calls(&self) -> u64 {
        self.info("commandstats")
            .lines()
            .filter_map(|line| line.strip_prefix("cmdstat_fencelock."))
            .filter_map(|rest| rest.split_once(":calls="))
            .filter_map(|(_, rest)| rest.split(',').next()?.parse::<u64>().ok())
            .sum()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status();
        assert!(
            status.map(|s| s.success()).unwrap_or(false),
            "kill {signal} {}",
            self.pid()
        );
    }

    /// SIGSTOP: the process keeps its sockets open but stops answering.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// SIGKILL, and reaps the process.
    pub fn kill(&mut self) {
        if !self.killed {
            let _ = self.child.kill();
            let _ = self.child.wait();
            self.killed = true;
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if !self.killed {
            let _ = Command::new("kill")
                .args(["-CONT", &self.pid().to_string()])
                .status();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A standalone server.
pub struct Standalone {
    pub node: Node,
}

impl Standalone {
    pub fn start() -> Self {
        Self {
            node: Node::spawn(&[]),
        }
    }

    /// A server that requires `password` (`requirepass`); `node.url()` carries it.
    pub fn start_with_password(password: &str) -> Self {
        Self {
            node: Node::spawn_with(&["--requirepass", password], Some(password)),
        }
    }

    /// A TLS-only server with `certs` (`--tls-auth-clients auth_clients`: `yes` requires a
    /// client certificate); `node.url()` is `rediss://`.
    pub fn start_tls(certs: &Arc<TlsCerts>, auth_clients: &str) -> Self {
        Self {
            node: Node::spawn_tls(&[], certs, auth_clients),
        }
    }

    /// A plain server started as `launch` says (namespace, address, clock shim).
    pub fn start_launched(launch: Launch) -> Self {
        Self {
            node: Node::spawn_launched(&[], launch),
        }
    }

    pub fn url(&self) -> String {
        self.node.url()
    }
}

/// `CLUSTER SETSLOT slot state node_id` on `node`.
fn setslot(node: &Node, slot: u16, state: &str, node_id: &str) {
    node.cmd::<()>(
        redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(state)
            .arg(node_id),
    )
}

/// A 3-master/3-replica cluster (node timeout 2 s, replica validity factor 0).
pub struct Cluster {
    pub nodes: Vec<Node>,
}

pub const NODE_TIMEOUT: Duration = Duration::from_millis(2000);

impl Cluster {
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// The same over TLS only: clients, the cluster bus and replication (`--tls-cluster yes
    /// --tls-replication yes`); clients need no certificate of their own.
    pub fn start_tls(certs: &Arc<TlsCerts>) -> Self {
        Self::start_with(Some(certs))
    }

    fn start_with(tls: Option<&Arc<TlsCerts>>) -> Self {
        Self::start_inner(tls, &[], |_| Launch::default())
    }

    /// A plain cluster whose node `i` (0..6) starts as `launch(i)` says: in a network namespace
    /// of its own with an address it announces, or with the clock shim preloaded.
    pub fn start_launched(launch: impl Fn(usize) -> Launch) -> Self {
        Self::start_inner(None, &[], launch)
    }

    /// A plain cluster whose nodes get `extra` arguments besides the cluster's own (e.g.
    /// `--loadmodule`), each started as `launch(i)` says.
    pub fn start_with_args(extra: &[String], launch: impl Fn(usize) -> Launch) -> Self {
        Self::start_inner(None, extra, launch)
    }

    fn start_inner(
        tls: Option<&Arc<TlsCerts>>,
        extra: &[String],
        launch: impl Fn(usize) -> Launch,
    ) -> Self {
        let timeout = NODE_TIMEOUT.as_millis().to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
            "--cluster-replica-validity-factor",
            "0",
        ];
        args.extend(extra.iter().map(String::as_str));
        let tls_args = [
            &args[..],
            &["--tls-cluster", "yes", "--tls-replication", "yes"],
        ]
        .concat();
        let nodes: Vec<Node> = (0..6)
            .map(|i| match tls {
                Some(certs) => Node::spawn_tls(&tls_args, certs, "no"),
                None => Node::spawn_launched(&args, launch(i)),
            })
            .collect();
        let status = Command::new("redis-cli")
            .args(tls.map(|certs| certs.cli_args()).unwrap_or_default())
            .args(["--cluster", "create"])
            .args(nodes.iter().map(Node::addr))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli must be installed");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = Cluster { nodes };
        cluster.wait_healthy();
        cluster
    }

    /// Waits until every live node sees the cluster ok and every replica is linked and synced.
    pub fn wait_healthy(&self) {
        wait_until(
            "cluster ok and replicas in sync",
            Duration::from_secs(60),
            || {
                let mut replicas = 0;
                for node in self.nodes.iter() {
                    let state = node.try_cmd::<String>(redis::cmd("CLUSTER").arg("INFO"));
                    if !state.unwrap_or_default().contains("cluster_state:ok") {
                        return false;
                    }
                    let replication = node.info("replication");
                    if replication.contains("role:slave") {
                        if !replication.contains("master_link_status:up")
                            || !replication.contains("master_sync_in_progress:0")
                        {
                            return false;
                        }
                        replicas += 1;
                    }
                }
                replicas == 3
            },
        );
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(Node::url).collect()
    }

    /// The node currently serving `slot` as master (as seen by a live master).
    pub fn master_of_slot(&self, slot: u16) -> &Node {
        let port = self.slot_owner_port(slot);
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("owner is one of ours")
    }

    fn slot_owner_port(&self, slot: u16) -> u16 {
        for node in &self.nodes {
            let Ok(slots) = node.try_cmd::<redis::Value>(redis::cmd("CLUSTER").arg("SLOTS")) else {
                continue;
            };
            let ranges: Vec<(i64, i64, (String, i64))> = match redis::from_redis_value::<
                Vec<redis::Value>,
            >(slots)
            {
                Ok(items) => items
                    .into_iter()
                    .filter_map(|item| {
                        let parts: Vec<redis::Value> = redis::from_redis_value(item).ok()?;
                        let start: i64 = redis::from_redis_value(parts.first()?.clone()).ok()?;
                        let end: i64 = redis::from_redis_value(parts.get(1)?.clone()).ok()?;
                        let master: Vec<redis::Value> =
                            redis::from_redis_value(parts.get(2)?.clone()).ok()?;
                        let host: String = redis::from_redis_value(master.first()?.clone()).ok()?;
                        let port: i64 = redis::from_redis_value(master.get(1)?.clone()).ok()?;
                        Some((start, end, (host, port)))
                    })
                    .collect(),
                Err(_) => continue,
            };
            if let Some((_, _, (_, port))) = ranges
                .iter()
                .find(|(s, e, _)| *s <= slot as i64 && slot as i64 <= *e)
            {
                return *port as u16;
            }
        }
        panic!("no node reports an owner for slot {slot}");
    }

    /// The replica of the master on `master_port`.
    pub fn replica_of(&self, master_port: u16) -> &Node {
        self.nodes
            .iter()
            .find(|n| {
                let info = n.info("replication");
                info.contains("role:slave")
                    && info.contains(&format!("master_port:{master_port}\r"))
            })
            .expect("every master has a replica")
    }

    /// Promotes the replica on `port` with `CLUSTER FAILOVER <mode>` ("" for a plain one) and
    /// waits until it is master and every other live master routes `slot` to it.
    pub fn promote(&self, port: u16, mode: &str, slot: u16, skip: &[u16]) {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("FAILOVER");
        if !mode.is_empty() {
            cmd.arg(mode);
        }
        self.node(port).cmd::<()>(&mut cmd);
        self.wait_promoted(port, slot, skip);
    }

    /// Waits until the node on `port` is master and every other live master (but `skip`) sees
    /// it as one, so `slot` routes to it.
    pub fn wait_promoted(&self, port: u16, slot: u16, skip: &[u16]) {
        let replica = self.node(port);
        wait_until("the promotion", Duration::from_secs(30), || {
            replica.info("replication").contains("role:master")
                && self
                    .nodes
                    .iter()
                    .filter(|n| n.port != port && !skip.contains(&n.port) && !n.killed)
                    .filter(|n| n.info("replication").contains("role:master"))
                    .all(|n| {
                        n.try_cmd::<u16>(redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(slot))
                            .is_err()
                            || n.try_cmd::<String>(redis::cmd("CLUSTER").arg("NODES"))
                                .map(|nodes| {
                                    nodes.lines().any(|l| {
                                        l.contains(&format!(":{port}@")) && l.contains("master")
                                    })
                                })
                                .unwrap_or(false)
                    })
        });
    }

    /// Waits until the replica on `replica` has applied every write its master on `master`
    /// had taken when this was called (its replication offset caught up): a `TAKEOVER` after
    /// this loses nothing, however far a loaded machine let replication lag.
    pub fn wait_caught_up(&self, master: u16, replica: u16) {
        let offset = |port: u16, field: &str| -> Option<u64> {
            let info = self.node(port).info("replication");
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.trim().parse().ok())
        };
        let target = offset(master, "master_repl_offset:").expect("the master reports its offset");
        wait_until(
            "the replica to catch up with its master",
            Duration::from_secs(10),
            || offset(replica, "slave_repl_offset:").is_some_and(|o| o >= target),
        );
    }

    /// Waits until the node on `port` has rejoined as a replica with its link up.
    pub fn wait_replica(&self, port: u16) {
        let node = self.node(port);
        wait_until(
            "the old master to rejoin as replica",
            Duration::from_secs(30),
            || {
                let info = node.info("replication");
                info.contains("role:slave") && info.contains("master_link_status:up")
            },
        );
    }

    /// Moves `slot` from the master on `from` to the master on `to` the way `redis-cli
    /// --cluster reshard` does (SETSLOT IMPORTING/MIGRATING, MIGRATE key by key, SETSLOT NODE),
    /// calling `between` after each key so traffic runs against the half-moved slot.
    pub fn migrate_slot(&self, slot: u16, from: u16, to: u16, mut between: impl FnMut()) {
        let (source, target) = (self.node(from), self.node(to));
        self.begin_migration(slot, from, to);
        loop {
            let keys: Vec<String> = source.cmd(
                redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(100),
            );
            let Some(key) = keys.first() else { break };
            source.cmd::<String>(
                redis::cmd("MIGRATE")
                    .arg(&target.host)
                    .arg(to)
                    .arg("")
                    .arg(0)
                    .arg(5000)
                    .arg("KEYS")
                    .arg(key),
            );
            between();
        }
        self.finish_migration(slot, from, to);
    }

    /// The start of a migration of `slot` from the master on `from` to the one on `to`:
    /// `SETSLOT IMPORTING` on the target, `MIGRATING` on the source (the `ASK` window opens).
    pub fn begin_migration(&self, slot: u16, from: u16, to: u16) {
        let (source, target) = (self.node(from), self.node(to));
        setslot(target, slot, "IMPORTING", &source.id());
        setslot(source, slot, "MIGRATING", &target.id());
    }

    /// The end of a migration: `SETSLOT NODE` on the target, the source and the other masters.
    pub fn finish_migration(&self, slot: u16, from: u16, to: u16) {
        let target_id = self.node(to).id();
        setslot(self.node(to), slot, "NODE", &target_id);
        setslot(self.node(from), slot, "NODE", &target_id);
        for node in self
            .nodes
            .iter()
            .filter(|n| !n.killed && n.port != from && n.port != to)
        {
            if node.info("replication").contains("role:master") {
                setslot(node, slot, "NODE", &target_id);
            }
        }
    }

    /// Starts a forced loss: pauses the replica on `replica` and drops its link from the master
    /// on `master`, so what the master acknowledges from now on never reaches it.
    pub fn cut_off_replica(&self, master: u16, replica: u16) {
        self.node(replica).pause();
        let cut: i64 = self
            .node(master)
            .cmd(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("replica"));
        assert_eq!(cut, 1, "the replica link was cut");
    }

    /// Ends a forced loss: kills the master on `master`, resumes the lagging replica on
    /// `replica` and promotes it (`TAKEOVER`) for `slot`. Writes since the cut are gone.
    pub fn take_over_with_lagging_replica(&mut self, master: u16, replica: u16, slot: u16) {
        self.node_mut(master).kill();
        self.node(replica).resume();
        self.promote(replica, "TAKEOVER", slot, &[master]);
    }

    pub fn node(&self, port: u16) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("known port")
    }

    pub fn node_mut(&mut self, port: u16) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .expect("known port")
    }
}

/// A PostgreSQL server on a free port, run as the `postgres` system user when the tests run as
/// root (PostgreSQL refuses root), with trust authentication on 127.0.0.1. Stopped on drop.
pub struct Postgres {
    pub port: u16,
    child: Child,
    dir: PathBuf,
}

impl Postgres {
    fn bindir() -> PathBuf {
        let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL must be installed (scripts/test.sh installs it)")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|bin| bin.join("postgres").exists())
            .collect();
        versions.sort();
        versions.pop().expect("a PostgreSQL server binary")
    }

    /// The uid/gid to run as: `postgres` when we are root, else ourselves.
    fn account() -> Option<(u32, u32)> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return None;
        }
        let id = |flag: &str| -> u32 {
            let out = Command::new("id")
                .args([flag, "postgres"])
                .output()
                .expect("id");
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .expect("a postgres system user (the Debian package creates it)")
        };
        Some((id("-u"), id("-g")))
    }

    fn command(program: PathBuf, account: Option<(u32, u32)>) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(program);
        if let Some((uid, gid)) = account {
            cmd.uid(uid).gid(gid);
        }
        cmd.env("LC_ALL", "C");
        cmd
    }

    pub fn start() -> Self {
        let bin = Self::bindir();
        let account = Self::account();
        let port = free_port();
        let dir = scratch_dir(port);
        let data = dir.join("data");
        if let Some((uid, gid)) = account {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown scratch dir");
        }
        let status = Self::command(bin.join("initdb"), account)
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run initdb");
        assert!(status.success(), "initdb failed");
        let log = std::fs::File::create(dir.join("postgres.log")).expect("log file");
        if let Some((uid, gid)) = account {
            std::os::unix::fs::chown(dir.join("postgres.log"), Some(uid), Some(gid)).ok();
        }
        let child = Self::command(bin.join("postgres"), account)
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
            .arg("-k")
            .arg(&dir)
            .args(["-c", "fsync=off"])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start postgres");
        let server = Postgres { port, child, dir };
        wait_until(
            &format!("PostgreSQL on {port}"),
            Duration::from_secs(30),
            || {
                Command::new(bin.join("pg_isready"))
                    .args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()])
                    .status()
                    .is_ok_and(|s| s.success())
            },
        );
        server
    }

    /// A connection string for `tokio_postgres`.
    pub fn config(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGINT: fast shutdown, which also ends the server's own child processes.
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
