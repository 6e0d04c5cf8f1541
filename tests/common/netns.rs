//! Network faults and clock skew for the chaos runs.
//!
//! [`Net`] puts redis-servers and clients in network namespaces of their own, all on one private
//! subnet `10.X.0.0/24` (X from the pid) behind a bridge in the root namespace, where the test
//! process keeps `10.X.0.1` and so reaches every node (it is never cut off). Links are cut by
//! blackhole routes inside the namespaces (both directions), so TCP connections stall as in a
//! real partition. This kernel has no `netem`, so a client's link is a pair of TAP devices
//! joined by a thread of this process that forwards Ethernet frames and can delay them (with
//! jitter, in order) and drop a share of them: real packet loss, real TCP retransmissions.
//! Clients run as tasks on a Tokio runtime whose threads live in the client's namespace
//! ([`Net::runtime`]), or as processes started with `ip netns exec` ([`Net::command`]).
//!
//! Every namespace and link is named `flkf<pid><letter>-…` and removed on drop (also when a
//! test panics); [`sweep`] removes leftovers of processes that no longer exist, and only those.
//!
//! [`ClockShim`] builds `clockshim.c` with gcc and preloads it into redis-servers whose wall
//! clock must run off by an offset that can change while they run.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{wait_until, Launch, Node};

/// The prefix of everything this harness names; the pid that follows tells [`sweep`] whose it is.
const PREFIX: &str = "flkf";

/// Runs `ip ARGS`, panicking with its output when it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the ip command (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `ip ARGS`, ignoring failure (cleanup).
fn ip_quiet(args: &[&str]) {
    let _ = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// The pid in a name this harness made (`flkf<pid><letter>-…`), if it is one.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = &rest[digits.len()..];
    let mut chars = after.chars();
    (chars.next()?.is_ascii_lowercase() && chars.next()? == '-').then_some(())?;
    digits.parse().ok()
}

/// Removes namespaces and links named by this harness for processes that no longer exist.
/// Never touches anything of a live process, nor anything named otherwise.
pub fn sweep() {
    let dead = |name: &str| {
        owner_pid(name).is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    };
    let netns = Command::new("ip").args(["netns", "list"]).output();
    for line in netns
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
        .lines()
    {
        let name = line.split_whitespace().next().unwrap_or("");
        if dead(name) {
            // Servers the dead run started in it (it had no chance to stop them): ours.
            let pids = Command::new("ip").args(["netns", "pids", name]).output();
            for pid in pids
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
                .split_whitespace()
            {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
            ip_quiet(&["netns", "del", name]);
        }
    }
    let links = Command::new("ip").args(["-o", "link", "show"]).output();
    for line in links
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
        .lines()
    {
        // "12: name@peer: <...>" or "12: name: <...>"
        let Some(name) = line.split(": ").nth(1) else {
            continue;
        };
        let name = name.split('@').next().unwrap_or(name);
        if dead(name) {
            ip_quiet(&["link", "del", name]);
        }
    }
}

/// Delay, jitter and loss of a client link (both directions).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Shape {
    pub delay: Duration,
    /// Each frame's delay is `delay ± jitter` (uniform); frames stay in order, as TCP needs.
    pub jitter: Duration,
    /// The share of frames dropped, 0.0–1.0.
    pub loss: f64,
}

impl Shape {
    /// 50 ms ± 20 ms and 5% loss: the brief's degraded client link.
    pub fn degraded() -> Self {
        Shape {
            delay: Duration::from_millis(50),
            jitter: Duration::from_millis(20),
            loss: 0.05,
        }
    }
}

/// A shape the forwarding thread reads without locking: delay and jitter in µs, loss in ppm.
#[derive(Default)]
struct LiveShape {
    delay_us: AtomicU64,
    jitter_us: AtomicU64,
    loss_ppm: AtomicU32,
}

/// A member of the subnet: a node or a client, with a namespace of its own.
#[derive(Clone, Debug)]
pub struct Member {
    pub netns: String,
    pub ip: String,
}

/// A client's namespace and its shaped link.
pub struct ClientLink {
    pub member: Member,
    shape: Arc<LiveShape>,
    stop: Arc<AtomicBool>,
    forwarder: Option<JoinHandle<()>>,
}

/// Namespaces on one bridge; see the module doc.
pub struct Net {
    /// `flkf<pid><letter>`: this instance's names start with it.
    pub prefix: String,
    /// The subnet's second octet.
    pub octet: u8,
    bridge: String,
    nodes: Vec<Member>,
    clients: Vec<ClientLink>,
    /// Blackhole routes in place: (namespace, cut-off address).
    cuts: Mutex<Vec<(String, String)>>,
}

impl Net {
    /// A bridge and a 3-master/3-replica cluster whose nodes each run in a namespace of their
    /// own on it (blocking: call it from `spawn_blocking` in async tests).
    pub fn with_cluster() -> (Net, super::Cluster) {
        let mut net = Net::new();
        let launches: Vec<Launch> = (0..6).map(|_| net.node_launch()).collect();
        let cluster = super::Cluster::start_launched(|i| launches[i].clone());
        (net, cluster)
    }

    /// Creates the bridge (after sweeping leftovers of dead processes).
    pub fn new() -> Net {
        static LETTER: AtomicU32 = AtomicU32::new(0);
        sweep();
        let pid = std::process::id();
        let n = LETTER.fetch_add(1, Ordering::SeqCst);
        let letter = (b'a' + (n % 26) as u8) as char;
        let prefix = format!("{PREFIX}{pid}{letter}");
        // 10.X: X in 20..=219 from the pid and the instance, so parallel runs rarely share it;
        // the bridge's address add fails loudly if another bridge holds it.
        let octet = 20 + ((pid + n * 7) % 200) as u8;
        let bridge = format!("{prefix}-br");
        assert!(bridge.len() <= 15, "interface name {bridge} too long");
        let net = Net {
            prefix,
            octet,
            bridge,
            nodes: Vec::new(),
            clients: Vec::new(),
            cuts: Mutex::default(),
        };
        ip(&["link", "add", &net.bridge, "type", "bridge"]);
        ip(&[
            "addr",
            "add",
            &format!("10.{octet}.0.1/24"),
            "dev",
            &net.bridge,
        ]);
        ip(&["link", "set", &net.bridge, "up"]);
        net
    }

    /// The address the test process has on the subnet (never cut off).
    pub fn observer_ip(&self) -> String {
        format!("10.{}.0.1", self.octet)
    }

    fn add_netns(&self, name: &str) {
        ip(&["netns", "add", name]);
        ip(&["-n", name, "link", "set", "lo", "up"]);
    }

    /// A namespace for a server, joined to the bridge by a veth pair; returns its member.
    pub fn add_node(&mut self) -> Member {
        let i = self.nodes.len();
        let netns = format!("{}-n{i}", self.prefix);
        let ipaddr = format!("10.{}.0.{}", self.octet, 10 + i);
        self.add_netns(&netns);
        let outer = format!("{}-n{i}", self.prefix);
        ip(&[
            "link", "add", &outer, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ]);
        ip(&["link", "set", &outer, "master", &self.bridge, "up"]);
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{ipaddr}/24"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &netns, "link", "set", "eth0", "up"]);
        let member = Member { netns, ip: ipaddr };
        self.nodes.push(member.clone());
        member
    }

    /// The launch of a server in a new namespace of its own (see [`Net::add_node`]).
    pub fn node_launch(&mut self) -> Launch {
        let member = self.add_node();
        Launch {
            netns: Some(member.netns),
            host: Some(member.ip),
            env: Vec::new(),
        }
    }

    /// A namespace for a client, linked to the bridge through a forwarding thread that can
    /// delay and drop frames ([`Net::shape`]). Returns the client's index.
    pub fn add_client(&mut self) -> usize {
        let i = self.clients.len();
        let netns = format!("{}-c{i}", self.prefix);
        let ipaddr = format!("10.{}.0.{}", self.octet, 100 + i);
        self.add_netns(&netns);
        let outer = format!("{}-c{i}", self.prefix);
        let outer_tap = open_tap(&outer, None);
        ip(&["link", "set", &outer, "master", &self.bridge, "up"]);
        let inner_tap = open_tap("eth0", Some(&netns));
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{ipaddr}/24"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &netns, "link", "set", "eth0", "up"]);
        let shape = Arc::new(LiveShape::default());
        let stop = Arc::new(AtomicBool::new(false));
        let forwarder = {
            let (shape, stop) = (Arc::clone(&shape), Arc::clone(&stop));
            std::thread::Builder::new()
                .name(format!("{outer}-fwd"))
                .spawn(move || forward(outer_tap, inner_tap, &shape, &stop))
                .expect("forwarding thread")
        };
        self.clients.push(ClientLink {
            member: Member { netns, ip: ipaddr },
            shape,
            stop,
            forwarder: Some(forwarder),
        });
        i
    }

    pub fn client(&self, i: usize) -> &Member {
        &self.clients[i].member
    }

    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Sets the delay, jitter and loss of client `i`'s link (both directions).
    pub fn shape(&self, i: usize, shape: Shape) {
        let live = &self.clients[i].shape;
        live.delay_us
            .store(shape.delay.as_micros() as u64, Ordering::SeqCst);
        live.jitter_us
            .store(shape.jitter.as_micros() as u64, Ordering::SeqCst);
        live.loss_ppm
            .store((shape.loss.clamp(0.0, 1.0) * 1e6) as u32, Ordering::SeqCst);
    }

    /// The member (node or client) with address `ip`.
    fn member(&self, ipaddr: &str) -> &Member {
        self.nodes
            .iter()
            .chain(self.clients.iter().map(|c| &c.member))
            .find(|m| m.ip == ipaddr)
            .unwrap_or_else(|| panic!("{ipaddr} is not on this subnet"))
    }

    /// Cuts the link between the members with addresses `a` and `b`, both directions.
    pub fn cut(&self, a: &str, b: &str) {
        let mut cuts = self.cuts.lock().unwrap_or_else(|e| e.into_inner());
        for (from, to) in [(a, b), (b, a)] {
            let netns = self.member(from).netns.clone();
            let entry = (netns, to.to_owned());
            if !cuts.contains(&entry) {
                ip(&[
                    "-n",
                    &entry.0,
                    "route",
                    "add",
                    "blackhole",
                    &format!("{to}/32"),
                ]);
                cuts.push(entry);
            }
        }
    }

    /// Cuts every link between a member of `side` and a member of `rest` (addresses).
    pub fn partition(&self, side: &[&str], rest: &[&str]) {
        for a in side {
            for b in rest {
                self.cut(a, b);
            }
        }
    }

    /// Every member's address but the observer's.
    pub fn all_ips(&self) -> Vec<String> {
        self.nodes
            .iter()
            .chain(self.clients.iter().map(|c| &c.member))
            .map(|m| m.ip.clone())
            .collect()
    }

    /// Cuts `ip` off from every other member (not from the observer).
    pub fn isolate(&self, ipaddr: &str) {
        let rest: Vec<String> = self.all_ips().into_iter().filter(|i| i != ipaddr).collect();
        let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
        self.partition(&[ipaddr], &rest);
    }

    /// Removes every cut.
    pub fn heal(&self) {
        let mut cuts = self.cuts.lock().unwrap_or_else(|e| e.into_inner());
        for (netns, to) in cuts.drain(..) {
            ip(&[
                "-n",
                &netns,
                "route",
                "del",
                "blackhole",
                &format!("{to}/32"),
            ]);
        }
    }

    /// A command that runs `program` in client `i`'s namespace (`ip netns exec`).
    pub fn command(&self, i: usize, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.clients[i].member.netns, program]);
        command
    }

    /// A Tokio runtime whose threads (workers and blocking pool) live in client `i`'s
    /// namespace: sockets its tasks open go through that client's link. Drop it with
    /// `shutdown_background` (or outside async code).
    pub fn runtime(&self, i: usize, threads: usize) -> tokio::runtime::Runtime {
        let path = format!("/var/run/netns/{}", self.clients[i].member.netns);
        let file = Arc::new(File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}")));
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .thread_name(format!("{}-c{i}", self.prefix))
            .on_thread_start(move || {
                // SAFETY: setns on a namespace file descriptor only changes this thread's
                // network namespace.
                let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            })
            .build()
            .expect("client runtime")
    }
}

impl Default for Net {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for client in &mut self.clients {
            client.stop.store(true, Ordering::SeqCst);
            if let Some(forwarder) = client.forwarder.take() {
                let _ = forwarder.join();
            }
        }
        for member in self
            .nodes
            .iter()
            .chain(self.clients.iter().map(|c| &c.member))
        {
            // Deleting a namespace deletes the veth pairs and TAP devices in it.
            ip_quiet(&["netns", "del", &member.netns]);
        }
        for i in 0..self.clients.len() {
            ip_quiet(&["link", "del", &format!("{}-c{i}", self.prefix)]);
        }
        for i in 0..self.nodes.len() {
            ip_quiet(&["link", "del", &format!("{}-n{i}", self.prefix)]);
        }
        ip_quiet(&["link", "del", &self.bridge]);
    }
}

/// Opens a TAP device `name`, in namespace `netns` when given (created from a thread that
/// entered it), non-blocking. The device lives as long as the descriptor.
fn open_tap(name: &str, netns: Option<&str>) -> OwnedFd {
    let name = name.to_owned();
    let netns = netns.map(str::to_owned);
    std::thread::spawn(move || {
        if let Some(netns) = netns {
            let file = File::open(format!("/var/run/netns/{netns}")).expect("netns file");
            // SAFETY: changes only this short-lived thread's network namespace.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        }
        // SAFETY: plain open(2) of the TUN clone device.
        let fd = unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        };
        assert!(fd >= 0, "/dev/net/tun: {}", std::io::Error::last_os_error());
        // SAFETY: fd was just opened and is owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        #[repr(C)]
        struct IfReq {
            name: [u8; 16],
            flags: libc::c_short,
            pad: [u8; 22],
        }
        let mut req = IfReq {
            name: [0; 16],
            flags: (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short,
            pad: [0; 22],
        };
        assert!(name.len() < 16, "interface name {name} too long");
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: TUNSETIFF reads an ifreq, which IfReq lays out.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &mut req) };
        assert_eq!(
            rc,
            0,
            "TUNSETIFF {name}: {}",
            std::io::Error::last_os_error()
        );
        fd
    })
    .join()
    .expect("tap thread")
}

/// Frames waiting for their release time, in order.
#[derive(Default)]
struct Queue {
    frames: VecDeque<(Instant, Vec<u8>)>,
    last: Option<Instant>,
}

/// Forwards frames between the bridge-side TAP and the client-side TAP, shaped by `shape`,
/// until `stop`.
fn forward(outer: OwnedFd, inner: OwnedFd, shape: &LiveShape, stop: &AtomicBool) {
    let mut rng = Rng::seeded();
    // Index 0: frames read from outer (the bridge) bound for inner; 1: the other way.
    let mut queues = [Queue::default(), Queue::default()];
    let fds = [outer.as_raw_fd(), inner.as_raw_fd()];
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        // Release what is due.
        for (dir, queue) in queues.iter_mut().enumerate() {
            while queue.frames.front().is_some_and(|(at, _)| *at <= now) {
                let (_, frame) = queue.frames.pop_front().expect("front exists");
                // SAFETY: writes a frame from a live buffer to our own descriptor.
                unsafe { libc::write(fds[1 - dir], frame.as_ptr().cast(), frame.len()) };
            }
        }
        let next = queues
            .iter()
            .filter_map(|q| q.frames.front().map(|(at, _)| *at))
            .min();
        let timeout_ms = match next {
            Some(at) => at
                .saturating_duration_since(Instant::now())
                .as_millis()
                .clamp(0, 20) as i32,
            None => 20,
        };
        let mut polls = [
            libc::pollfd {
                fd: fds[0],
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: fds[1],
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: polls points to two initialised pollfd.
        let ready = unsafe { libc::poll(polls.as_mut_ptr(), 2, timeout_ms) };
        if ready <= 0 {
            continue;
        }
        for dir in 0..2 {
            if polls[dir].revents & libc::POLLIN == 0 {
                continue;
            }
            loop {
                // SAFETY: reads into our buffer from our own non-blocking descriptor.
                let n = unsafe { libc::read(fds[dir], buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    break;
                }
                let frame = &buf[..n as usize];
                let loss = shape.loss_ppm.load(Ordering::Relaxed);
                if loss > 0 && rng.below(1_000_000) < u64::from(loss) {
                    continue;
                }
                let delay = shape.delay_us.load(Ordering::Relaxed);
                let jitter = shape.jitter_us.load(Ordering::Relaxed);
                if delay == 0 && jitter == 0 && queues[dir].frames.is_empty() {
                    // SAFETY: as above.
                    unsafe { libc::write(fds[1 - dir], frame.as_ptr().cast(), frame.len()) };
                    continue;
                }
                let spread = if jitter > 0 {
                    rng.below(2 * jitter + 1)
                } else {
                    0
                };
                let us = (delay + spread).saturating_sub(jitter);
                let queue = &mut queues[dir];
                let at =
                    (Instant::now() + Duration::from_micros(us)).max(queue.last.unwrap_or(now));
                queue.last = Some(at);
                queue.frames.push_back((at, frame.to_vec()));
            }
        }
    }
}

/// xorshift64*: enough randomness for loss and jitter.
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        let seed = uuid::Uuid::new_v4().as_u128() as u64;
        Rng(seed | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

/// `clockshim.c` built for this run: preload it into a redis-server ([`ClockShim::launch`])
/// and move that server's wall clock with [`set_clock_offset`].
pub struct ClockShim {
    dir: PathBuf,
    library: PathBuf,
}

impl ClockShim {
    /// Builds the shim with gcc into a temporary directory.
    pub fn build() -> ClockShim {
        let dir = std::env::temp_dir().join(format!(
            "fencelock-clockshim-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).expect("shim dir");
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/clockshim.c");
        let library = dir.join("clockshim.so");
        let out = Command::new("gcc")
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o"])
            .arg(&library)
            .arg(&source)
            .output()
            .expect("gcc must be installed");
        assert!(
            out.status.success(),
            "gcc clockshim.c: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ClockShim { dir, library }
    }

    /// Adds the shim to `launch`: the server reads its offset from `clock_offset_ms` in its
    /// working directory (its `--dir`); no file means no offset.
    pub fn launch(&self, mut launch: Launch) -> Launch {
        launch
            .env
            .push(("LD_PRELOAD".into(), self.library.display().to_string()));
        launch
            .env
            .push(("FLK_CLOCK_OFFSET_FILE".into(), "clock_offset_ms".into()));
        launch
    }
}

impl Drop for ClockShim {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The node's `TIME` minus this host's wall clock, in ms.
pub fn clock_offset_ms(node: &Node) -> i64 {
    let before = std::time::SystemTime::now();
    let time: Vec<String> = node.cmd(&mut redis::cmd("TIME"));
    let after = std::time::SystemTime::now();
    let server_us =
        time[0].parse::<i64>().unwrap_or(0) * 1_000_000 + time[1].parse::<i64>().unwrap_or(0);
    let mid = before + after.duration_since(before).unwrap_or_default() / 2;
    let local_us = mid
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    (server_us - local_us) / 1000
}

/// Sets the wall-clock offset of a node started with the shim to `ms` (negative: behind) and
/// waits until its `TIME` shows it (the shim re-reads the file every 50 ms).
pub fn set_clock_offset(node: &Node, ms: i64) {
    let file = node.clock_offset_file();
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, ms.to_string()).expect("write clock offset");
    std::fs::rename(&tmp, &file).expect("move clock offset");
    wait_until(
        &format!("clock offset {ms} ms on {}", node.port),
        Duration::from_secs(5),
        || (clock_offset_ms(node) - ms).abs() < 40,
    );
}
