//! The Redis module (issue 24) under a storm of random and malformed calls: thousands of
//! `fencelock.acquire` / `fencelock.release` / `fencelock.extend` / `fencelock.reenter` calls
//! (and their packed batches), and the fair lock's `fencelock.fair_acquire` /
//! `fencelock.fair_release` from a seeded generator (wrong arity, empty, huge and binary arguments,
//! non-numbers, negative and 2^64 numbers, owners with whitespace, keys of other types, layout-1
//! hashes and corrupt packed states), interleaved with valid ones.
//! Afterwards the server is the same live process, every key set aside beforehand is byte for
//! byte intact (a held lock's holder is: busy callers with a place lease may queue behind it,
//! as the scripts queue them), every reply was an integer, an array of integers or a clean error reply, and a
//! lock the module grants is still released by the script path (the state stays shared).
//!
//! The calls go over a raw RESP connection, so the test sees each reply exactly as the server
//! sent it (no client library maps or retries anything).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{Cluster, Node, Standalone};
use fencelock::{lua_scripts, slot_of, Client, LockOptions};

/// Calls in the standalone storm.
const STORM_CALLS: usize = 5_000;
/// Calls in the cluster storm.
const CLUSTER_CALLS: usize = 1_500;

/// The error codes a reply may start with: the module's own (`ERR`, `WRONGTYPE`, `FALLBACK`)
/// and the server's standard ones.
const ERROR_CODES: &str = "ERR WRONGTYPE FALLBACK OOM MOVED ASK TRYAGAIN CLUSTERDOWN CROSSSLOT \
    LOADING BUSY READONLY MASTERDOWN NOPERM NOAUTH";

/// xorshift64*: small, seeded, deterministic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// One reply as the server sent it.
#[derive(Clone, PartialEq, Eq)]
enum Reply {
    Int(i64),
    Ints(Vec<i64>),
    Error(String),
    /// A bulk string: never expected from the module.
    Bulk(Vec<u8>),
    /// An array that is not all integers: never expected from the module.
    Array(Vec<Reply>),
    /// Anything else (a simple string, nil): never expected from the module.
    Other(String),
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reply::Int(n) => write!(f, ":{n}"),
            Reply::Ints(v) => write!(f, "ints{v:?}"),
            Reply::Error(e) => write!(f, "-{e:?}"),
            Reply::Bulk(b) => write!(f, "b\"{}\"", b.escape_ascii()),
            Reply::Array(items) => f.debug_list().entries(items).finish(),
            Reply::Other(o) => write!(f, "{o:?}"),
        }
    }
}

/// A bare RESP2 connection.
struct Resp {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Resp {
    fn connect(node: &Node) -> Resp {
        let stream = TcpStream::connect(node.addr()).expect("connect to the node");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Resp {
            writer: stream.try_clone().unwrap(),
            reader: BufReader::new(stream),
        }
    }

    fn call(&mut self, args: &[Vec<u8>]) -> Reply {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            out.extend_from_slice(arg);
            out.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&out).expect("send a call");
        self.read()
    }

    fn line(&mut self) -> Vec<u8> {
        let mut line = Vec::new();
        self.reader
            .read_until(b'\n', &mut line)
            .expect("read a reply line");
        assert!(
            line.ends_with(b"\r\n"),
            "a reply line must end with CRLF: {:?}",
            String::from_utf8_lossy(&line)
        );
        line.truncate(line.len() - 2);
        line
    }

    fn read(&mut self) -> Reply {
        let line = self.line();
        let (kind, rest) = line.split_first().expect("an empty reply line");
        let text = String::from_utf8_lossy(rest).into_owned();
        match kind {
            b':' => Reply::Int(text.parse().expect("an integer reply")),
            b'-' => Reply::Error(text),
            b'*' => {
                let n: i64 = text.parse().expect("an array length");
                if n < 0 {
                    return Reply::Other("nil array".into());
                }
                let items: Vec<Reply> = (0..n).map(|_| self.read()).collect();
                let ints: Option<Vec<i64>> = items
                    .iter()
                    .map(|item| match item {
                        Reply::Int(i) => Some(*i),
                        _ => None,
                    })
                    .collect();
                ints.map_or(Reply::Array(items), Reply::Ints)
            }
            b'$' => {
                let n: i64 = text.parse().expect("a bulk length");
                if n < 0 {
                    return Reply::Other("nil".into());
                }
                let mut body = vec![0; n as usize + 2];
                self.reader.read_exact(&mut body).expect("a bulk body");
                body.truncate(n as usize);
                Reply::Bulk(body)
            }
            _ => Reply::Other(format!("{}{text}", *kind as char)),
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A call shortened for a failure message.
fn render(args: &[Vec<u8>]) -> String {
    let parts: Vec<String> = args
        .iter()
        .map(|a| {
            let s = String::from_utf8_lossy(&a[..a.len().min(40)]).into_owned();
            if a.len() > 40 {
                format!("{s:?}...({} bytes)", a.len())
            } else {
                format!("{s:?}")
            }
        })
        .collect();
    parts.join(" ")
}

/// Asserts the reply's shape; returns its error code (None for a success).
fn check_reply(args: &[Vec<u8>], reply: &Reply) -> Option<String> {
    match reply {
        Reply::Int(_) | Reply::Ints(_) => None,
        // A batched command: one element per item, each a reply of the single command.
        Reply::Array(items) if args[0].ends_with(b"_packed") => {
            for item in items {
                assert!(
                    !matches!(item, Reply::Array(_)),
                    "nested array {item:?} in the reply to {}",
                    render(args)
                );
                check_reply(args, item);
            }
            None
        }
        Reply::Error(text) => {
            let code = text.split(' ').next().unwrap_or("").to_owned();
            assert!(
                ERROR_CODES.split(' ').any(|c| c == code),
                "error reply with an unknown code {text:?} to {}",
                render(args)
            );
            Some(code)
        }
        other => panic!("reply {other:?} to {}", render(args)),
    }
}

/// The junk an argument may be replaced with.
fn junk(rng: &mut Rng) -> Vec<u8> {
    // Split at `|`; the first is empty.
    const FIXED: &[u8] = b"|-1|-0|0|18446744073709551615|18446744073709551616|\
        99999999999999999999999|9007199254740991|9007199254740992|\
        1099511627776|1099511627777|1e3|0x10|+1| 1|1 |01|1.5|nan|inf|abc|\
        owner with space|tab\there|new\nline|cr\r\nlf|\r\n|\0|\0\xff\xfe\x80|\
        \xd9\xa3|clock |CLOCK|epoch|hybrid|counter|s|p|q|*|%d+|w| w| h";

    match rng.below(10) {
        0 => vec![b'a'; 65_536],
        1 => vec![b'9'; 1 + rng.below(300)],
        2 => {
            let len = rng.below(300);
            rng.bytes(len)
        }
        3 if rng.chance(5) => vec![b'x'; 1 << 20],
        _ => {
            let fixed: Vec<&[u8]> = FIXED.split(|&b| b == b'|').collect();
            rng.pick(&fixed).to_vec()
        }
    }
}

/// The owners valid calls use: some share their first 8 characters (the client tag).
const OWNERS: &[&str] = &[
    "c1aaaaaa0001",
    "c1aaaaaa0002",
    "c2bbbbbb0001",
    "c3cccccc0001",
    "c4dddddd",
    "x",
];

/// The module's commands the storm sends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Command {
    Acquire,
    Release,
    Extend,
    Reenter,
    FairAcquire,
    FairRelease,
}

impl Command {
    /// Acquire about 40% of the time, release 20%, extend, re-enter, the fair lock's acquire
    /// and release 10% each.
    fn pick(rng: &mut Rng) -> Command {
        match rng.below(10) {
            8 => Command::FairAcquire,
            9 => Command::FairRelease,
            _ => Command::pick_batched(rng),
        }
    }

    /// A command with a batched form: acquire about half the time, release a quarter, extend
    /// and re-enter an eighth each.
    fn pick_batched(rng: &mut Rng) -> Command {
        match rng.below(8) {
            0..=3 => Command::Acquire,
            4 | 5 => Command::Release,
            6 => Command::Extend,
            _ => Command::Reenter,
        }
    }

    fn name(self) -> &'static [u8] {
        match self {
            Command::Acquire => b"fencelock.acquire",
            Command::Release => b"fencelock.release",
            Command::Extend => b"fencelock.extend",
            Command::Reenter => b"fencelock.reenter",
            Command::FairAcquire => b"fencelock.fair_acquire",
            Command::FairRelease => b"fencelock.fair_release",
        }
    }

    /// The batched form (the fair lock's commands have none: sent as themselves).
    fn packed(self) -> &'static [u8] {
        match self {
            Command::Acquire => b"fencelock.acquire_packed",
            Command::Release => b"fencelock.release_packed",
            Command::Extend => b"fencelock.extend_packed",
            Command::Reenter => b"fencelock.reenter_packed",
            other => other.name(),
        }
    }
}

/// A well-formed call of `command` on `key` (args after the command name).
fn valid_args(rng: &mut Rng, key: &[u8], command: Command) -> Vec<Vec<u8>> {
    let owner = rng.pick(OWNERS).as_bytes().to_vec();
    let grace = if rng.chance(30) {
        Vec::new()
    } else {
        rng.below(5_000).to_string().into_bytes()
    };
    let mut args = vec![key.to_vec(), owner];
    match command {
        Command::FairAcquire => {
            args.push((1 + rng.below(3_000)).to_string().into_bytes());
            let floor = if rng.chance(4) { rng.below(1_000) } else { 0 };
            args.push(floor.to_string().into_bytes());
            let modes: [&[u8]; 4] = [b"clock", b"clock", b"counter", b"hybrid"];
            args.push(rng.pick(&modes).to_vec());
            args.push(rng.below(3_000).to_string().into_bytes());
            args.push((1 + rng.below(4)).to_string().into_bytes());
            args.push(grace);
            return args;
        }
        Command::FairRelease => {
            let announces: [&[u8]; 3] = [b"", b"s", b"p"];
            args.push(Vec::new());
            args.push(rng.pick(&announces).to_vec());
            args.push(grace);
            return args;
        }
        _ => {}
    }
    if command == Command::Reenter {
        let ids: [&[u8]; 3] = [b"a1", b"b2", b"c3"];
        args.push(rng.pick(&ids).to_vec());
    }
    if command != Command::Release {
        args.push((1 + rng.below(3_000)).to_string().into_bytes());
    }
    if command == Command::Acquire {
        let floor = match rng.below(4) {
            0 => rng.next() % (1 << 53),
            1 => rng.below(1_000) as u64,
            _ => 0,
        };
        args.push(floor.to_string().into_bytes());
        let modes: [&[u8]; 5] = [b"clock", b"clock", b"counter", b"epoch", b"hybrid"];
        args.push(rng.pick(&modes).to_vec());
        if rng.chance(20) {
            args.push(rng.below(3_000).to_string().into_bytes());
        }
    } else if command == Command::Release {
        // The hold ids the storm's re-entries add (a1, b2, c3), and one never added.
        let holds: [&[u8]; 4] = [b"a1", b"b2", b"c3", b"h1"];
        let hold: &[u8] = if rng.chance(25) {
            holds[rng.below(holds.len())]
        } else {
            b""
        };
        args.push(hold.to_vec());
        let announces: [&[u8]; 3] = [b"", b"s", b"p"];
        args.push(rng.pick(&announces).to_vec());
    }
    args.push(grace);
    args
}

/// One storm call of a batched command on `key`: one to three items (each the key and the
/// other arguments joined by spaces, the acquire's padded with place `0`), valid (about a
/// third) or with one argument mutated, removed, or a field of a packed one dropped.
fn batch_call(rng: &mut Rng, key: &[u8]) -> Vec<Vec<u8>> {
    let command = Command::pick_batched(rng);
    let name = command.packed();
    let mut args = Vec::new();
    for _ in 0..1 + rng.below(3) {
        let mut item = valid_args(rng, key, command);
        if command == Command::Acquire && item.len() == 6 {
            item.insert(5, b"0".to_vec());
        }
        args.push(item[0].clone());
        args.push(item[1..].join(&b' '));
    }
    if !rng.chance(35) {
        let at = rng.below(args.len());
        match rng.below(3) {
            0 => args[at] = junk(rng),
            1 => {
                args.remove(at);
            }
            _ => {
                let packed = &mut args[at | 1];
                if let Some(space) = packed.iter().position(|&b| b == b' ') {
                    packed.remove(space);
                }
            }
        }
    }
    let mut call = vec![name.to_vec()];
    call.extend(args);
    call
}

/// One storm call on `key`: valid (about a third) or mutated; one in seven a batched command.
fn storm_call(rng: &mut Rng, key: &[u8]) -> Vec<Vec<u8>> {
    if rng.chance(15) {
        return batch_call(rng, key);
    }
    let command = Command::pick(rng);
    let name = command.name();
    let mut args = valid_args(rng, key, command);
    if !rng.chance(35) {
        for _ in 0..1 + rng.below(2) {
            match rng.below(6) {
                0 if !args.is_empty() => {
                    let at = rng.below(args.len());
                    args.remove(at);
                }
                1 => {
                    let at = rng.below(args.len() + 1);
                    args.insert(at, junk(rng));
                }
                2 if args.len() > 1 => {
                    args.truncate(rng.below(2));
                }
                _ if args.len() > 1 => {
                    let at = 1 + rng.below(args.len() - 1);
                    args[at] = junk(rng);
                }
                _ => {}
            }
        }
    }
    let mut call = vec![name.to_vec()];
    call.extend(args);
    call
}

/// Keys set aside before the storm; every call the storm may send leaves them as they are (a
/// live lock of an owner the storm never uses whose waiters mark is already `*` or `q`, a
/// layout-1 hash, corrupt states the module refuses, other types). A held lock's holder stays
/// as it is, but a call with a place lease queues behind it, as the scripts queue it (see
/// [`guarded_view`]).
fn guarded_keys(tag: &str) -> Vec<(String, Vec<Vec<u8>>)> {
    let far = now_ms() + 3_600_000;
    let guard_owner = "G0000000guarded0000000000000000";
    let hash = |key: String, fields: &[(&str, String)]| {
        let mut cmd = vec![b"HSET".to_vec(), key.clone().into_bytes()];
        for (f, v) in fields {
            cmd.push(f.as_bytes().to_vec());
            cmd.push(v.clone().into_bytes());
        }
        (key, cmd)
    };
    vec![
        hash(
            format!("{{{tag}}}:held-star"),
            &[("until", format!("{far} 77 {guard_owner} w*"))],
        ),
        hash(
            format!("{{{tag}}}:held-queue"),
            &[
                ("until", format!("{far} 78 {guard_owner} wq")),
                ("q:other", format!("1 {far}")),
            ],
        ),
        hash(
            format!("{{{tag}}}:held-reentered"),
            &[("until", format!("{far} 79 {guard_owner} h2 w*"))],
        ),
        hash(
            format!("{{{tag}}}:layout1-held"),
            &[
                ("owner", guard_owner.to_owned()),
                ("until", far.to_string()),
                ("fence", "41".into()),
            ],
        ),
        hash(
            format!("{{{tag}}}:layout1-free"),
            &[("fence", "42".into()), ("forced", "someone".into())],
        ),
        hash(
            format!("{{{tag}}}:corrupt-xyz"),
            &[("until", "x y z".into())],
        ),
        hash(format!("{{{tag}}}:corrupt-two"), &[("until", "1 2".into())]),
        hash(
            format!("{{{tag}}}:corrupt-big"),
            &[("until", "99999999999999999999 1 a".into())],
        ),
        hash(
            format!("{{{tag}}}:corrupt-long-fence"),
            &[("until", format!("1 {} a", "7".repeat(5_000)))],
        ),
        hash(
            format!("{{{tag}}}:corrupt-empty"),
            &[("until", String::new())],
        ),
        (
            format!("{{{tag}}}:string"),
            vec![
                b"SET".to_vec(),
                format!("{{{tag}}}:string").into_bytes(),
                b"0 5 abc".to_vec(),
            ],
        ),
        (
            format!("{{{tag}}}:list"),
            vec![
                b"RPUSH".to_vec(),
                format!("{{{tag}}}:list").into_bytes(),
                b"until".to_vec(),
                b"0 5 ".to_vec(),
            ],
        ),
        (
            format!("{{{tag}}}:set"),
            vec![
                b"SADD".to_vec(),
                format!("{{{tag}}}:set").into_bytes(),
                b"a".to_vec(),
            ],
        ),
    ]
}

/// Keys the storm may change: fresh, odd names, and states the module parses but that are
/// unusual (marks without values, long owners, expired leases).
fn storm_keys(tag: &str) -> Vec<(Vec<u8>, Option<String>)> {
    let mut keys: Vec<(Vec<u8>, Option<String>)> = (0..8)
        .map(|i| (format!("{{{tag}}}:fresh{i}").into_bytes(), None))
        .collect();
    for value in [
        "0 5 abc w".to_owned(),
        "0 5 abc h".to_owned(),
        "1 2 owner h w".to_owned(),
        "0 0 ".to_owned(),
        format!("1 2 {}", "o".repeat(70_000)),
        "1 9007199254740991 old".to_owned(),
        "1 2 old hx wy".to_owned(),
        format!("{} 3 c1aaaaaa0001 h1", now_ms() + 600_000),
    ] {
        let n = keys.len();
        keys.push((format!("{{{tag}}}:odd{n}").into_bytes(), Some(value)));
    }
    keys
}

/// What a key is: type, value (a hash's fields sorted), PEXPIRETIME and, when `exact`, its
/// DUMP (byte for byte, encoding and order included: for the same server only).
/// What the storm must leave intact of a guarded key: every byte of it (`snapshot`), or for a
/// live lock (`held-` keys) its holder (the `until` value up to its marks, the hold count
/// included): busy callers with a place lease may queue behind it, and the key's expiry
/// follows their places.
fn guarded_view(conn: &mut Resp, key: &str) -> String {
    if !key.contains(":held-") {
        return snapshot(conn, key, true);
    }
    match conn.call(&[b"HGET".to_vec(), key.as_bytes().to_vec(), b"until".to_vec()]) {
        Reply::Bulk(until) => String::from_utf8_lossy(&until)
            .split(' ')
            .filter(|word| !word.starts_with('w'))
            .collect::<Vec<_>>()
            .join(" "),
        other => format!("{other:?}"),
    }
}

fn snapshot(conn: &mut Resp, key: &str, exact: bool) -> String {
    let key = key.as_bytes().to_vec();
    let mut read = |cmd: &[&[u8]]| {
        let mut args = vec![cmd[0].to_vec(), key.clone()];
        args.extend(cmd[1..].iter().map(|a| a.to_vec()));
        conn.call(&args)
    };
    let kind = read(&[b"TYPE"]);
    let value = match &kind {
        Reply::Other(k) if k == "+hash" => match read(&[b"HGETALL"]) {
            Reply::Array(items) => {
                let mut pairs: Vec<String> =
                    items.chunks(2).map(|pair| format!("{pair:?}")).collect();
                pairs.sort();
                pairs.join(" ")
            }
            other => format!("{other:?}"),
        },
        Reply::Other(k) if k == "+string" => format!("{:?}", read(&[b"GET"])),
        Reply::Other(k) if k == "+list" => format!("{:?}", read(&[b"LRANGE", b"0", b"-1"])),
        Reply::Other(k) if k == "+set" => format!("{:?}", read(&[b"SMEMBERS"])),
        _ => String::new(),
    };
    let dump = if exact {
        format!("{:?}", read(&[b"DUMP"]))
    } else {
        String::new()
    };
    format!(
        "{kind:?} {value} pexpiretime={:?} {dump}",
        read(&[b"PEXPIRETIME"])
    )
}

/// The server answers PING and is still the process the test started.
fn assert_alive(node: &Node) {
    let mut conn = Resp::connect(node);
    assert_eq!(
        conn.call(&[b"PING".to_vec()]),
        Reply::Other("+PONG".into()),
        "PING"
    );
    let info = node.info("server");
    assert!(
        info.contains(&format!("process_id:{}\r", node.pid())),
        "the same server process answers (pid {}): {info}",
        node.pid()
    );
    let modules: redis::Value = node.cmd(redis::cmd("MODULE").arg("LIST"));
    assert!(
        format!("{modules:?}").contains("fencelock"),
        "the module is still loaded: {modules:?}"
    );
}

/// Sets the keys up on `conn`; returns the guarded keys' names.
fn set_up(conn: &mut Resp, tag: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (i, (key, cmd)) in guarded_keys(tag).into_iter().enumerate() {
        let reply = conn.call(&cmd);
        assert!(!matches!(reply, Reply::Error(_)), "set up {key}: {reply:?}");
        if i % 2 == 0 {
            let at = (now_ms() + 7_200_000).to_string().into_bytes();
            let cmd = vec![b"PEXPIREAT".to_vec(), key.clone().into_bytes(), at];
            assert_eq!(conn.call(&cmd), Reply::Int(1), "expiry of {key}");
        }
        names.push(key);
    }
    for (key, value) in storm_keys(tag) {
        if let Some(value) = value {
            let cmd = vec![b"HSET".to_vec(), key, b"until".to_vec(), value.into_bytes()];
            assert_eq!(conn.call(&cmd), Reply::Int(1));
        }
    }
    names
}

/// What the storm saw, by reply kind.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    errors: std::collections::BTreeMap<String, usize>,
}

impl Tally {
    fn add(&mut self, args: &[Vec<u8>], reply: &Reply) {
        match check_reply(args, reply) {
            None => self.ok += 1,
            Some(code) => *self.errors.entry(code).or_default() += 1,
        }
    }

    fn assert_varied(&self) {
        assert!(self.ok >= 100, "too few calls succeeded: {self:?}");
        for code in ["ERR", "WRONGTYPE", "FALLBACK"] {
            assert!(
                self.errors.get(code).copied().unwrap_or(0) >= 10,
                "too few {code} replies: {self:?}"
            );
        }
    }
}

#[test]
fn the_module_survives_a_storm_of_random_and_malformed_calls() {
    let server = Standalone::start_with_module();
    let mut conn = Resp::connect(&server.node);
    let guarded = set_up(&mut conn, "g");
    let before: Vec<String> = guarded.iter().map(|k| guarded_view(&mut conn, k)).collect();
    let mut pool: Vec<Vec<u8>> = storm_keys("g").into_iter().map(|(k, _)| k).collect();
    pool.extend(guarded.iter().map(|k| k.clone().into_bytes()));
    pool.extend([b"".to_vec(), b"\0\xff{}\r\n".to_vec(), vec![b'k'; 70_000]]);

    let mut rng = Rng(0x5eed_f0e1_c0c4_2024);
    let mut tally = Tally::default();
    for i in 0..STORM_CALLS {
        let key = rng.pick(&pool).clone();
        let args = storm_call(&mut rng, &key);
        let reply = conn.call(&args);
        tally.add(&args, &reply);
        if i % 1_000 == 999 {
            assert_alive(&server.node);
        }
    }
    eprintln!("storm of {STORM_CALLS} calls: {tally:?}");
    tally.assert_varied();

    assert_alive(&server.node);
    for (key, before) in guarded.iter().zip(&before) {
        assert_eq!(&guarded_view(&mut conn, key), before, "{key} changed");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_module_grant_after_the_storm_is_released_by_the_script_and_shared_with_the_client() {
    let server = Standalone::start_with_module();
    let mut conn = Resp::connect(&server.node);
    set_up(&mut conn, "i");
    let pool: Vec<Vec<u8>> = storm_keys("i").into_iter().map(|(k, _)| k).collect();
    let mut rng = Rng(42);
    for _ in 0..500 {
        let key = rng.pick(&pool).clone();
        let args = storm_call(&mut rng, &key);
        check_reply(&args, &conn.call(&args));
    }
    let key = b"fencelock:{interop}:lock".to_vec();
    let fence_of = |reply: Reply| match reply {
        Reply::Int(fence) => fence,
        Reply::Ints(v) if v[0] == 1 => v[1],
        other => panic!("not a grant: {other:?}"),
    };
    let owner = b"modowner00000000000000000000000".to_vec();
    let acquire = |owner: &[u8]| {
        [
            &b"fencelock.acquire"[..],
            &key,
            owner,
            b"10000",
            b"0",
            b"clock",
            b"60000",
        ]
        .map(<[u8]>::to_vec)
    };
    let first = fence_of(conn.call(&acquire(&owner)));

    // The script path (the release script the client sends, by EVAL) releases it.
    let release = lua_scripts()
        .find(|s| s.name == "release")
        .expect("the release script");
    let eval = vec![
        b"EVAL".to_vec(),
        release.source.as_bytes().to_vec(),
        b"1".to_vec(),
        key.clone(),
        owner.clone(),
        Vec::new(),
        Vec::new(),
        b"60000".to_vec(),
    ];
    assert_eq!(conn.call(&eval), Reply::Int(1), "the script released it");
    let until = conn.call(&[b"HGET".to_vec(), key.clone(), b"until".to_vec()]);
    assert_eq!(
        until,
        Reply::Bulk(format!("0 {first} ").into_bytes()),
        "free, the fence kept"
    );

    // The client (scripts or module, as it chooses) goes on above that fence.
    let client = Client::builder([server.url()]).connect().await.unwrap();
    let guard = client
        .try_lock("interop", &LockOptions::new())
        .await
        .unwrap();
    let second = guard.fence().get();
    assert!(second > first as u64, "client fence {second} above {first}");
    guard.release().await.unwrap();

    // And the module again above the client's.
    let third = fence_of(conn.call(&acquire(&owner)));
    assert!(third as u64 > second, "module fence {third} above {second}");
    let release = [&b"fencelock.release"[..], &key, &owner, b"", b"", b"60000"];
    assert_eq!(conn.call(&release.map(<[u8]>::to_vec)), Reply::Int(1));
}

#[test]
fn the_commands_declare_their_key_and_flags() {
    let server = Standalone::start_with_module();
    let keys: Vec<String> = server.node.cmd(
        redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg("fencelock.acquire")
            .arg("k")
            .arg("a")
            .arg(1)
            .arg(0)
            .arg("clock")
            .arg(""),
    );
    assert_eq!(keys, ["k"]);
    let keys: Vec<String> = server.node.cmd(
        redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg("fencelock.release")
            .arg("k2")
            .arg("a")
            .arg("")
            .arg("s")
            .arg(""),
    );
    assert_eq!(keys, ["k2"]);
    let keys: Vec<String> = server.node.cmd(
        redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg("fencelock.fair_acquire")
            .arg("k3")
            .arg(&["a", "1", "0", "clock", "0", "128", ""]),
    );
    assert_eq!(keys, ["k3"]);
    let flags = |name: &str| -> Vec<String> {
        let info: redis::Value = server.node.cmd(redis::cmd("COMMAND").arg("INFO").arg(name));
        let redis::Value::Array(outer) = info else {
            panic!("COMMAND INFO {name}: {info:?}")
        };
        let Some(redis::Value::Array(entry)) = outer.first() else {
            panic!("COMMAND INFO {name}: {outer:?}")
        };
        redis::from_redis_value_ref(&entry[2]).unwrap()
    };
    let acquire = flags("fencelock.acquire");
    assert!(
        acquire.iter().any(|f| f == "write") && acquire.iter().any(|f| f == "denyoom"),
        "acquire: {acquire:?}"
    );
    for name in [
        "fencelock.release",
        "fencelock.extend",
        "fencelock.release_packed",
        "fencelock.extend_packed",
        "fencelock.fair_release",
    ] {
        let got = flags(name);
        assert!(
            got.iter().any(|f| f == "write") && !got.iter().any(|f| f == "denyoom"),
            "{name}: {got:?}"
        );
    }
    for name in [
        "fencelock.acquire_packed",
        "fencelock.reenter",
        "fencelock.reenter_packed",
        "fencelock.fair_acquire",
    ] {
        let got = flags(name);
        assert!(
            got.iter().any(|f| f == "write") && got.iter().any(|f| f == "denyoom"),
            "{name}: {got:?}"
        );
    }
    let renew = flags("fencelock.renew");
    assert!(
        renew.iter().any(|f| f == "write") && !renew.iter().any(|f| f == "denyoom"),
        "{renew:?}"
    );
    // The renewal names every lock key (the routing key is the first of them).
    let keys: Vec<String> = server.node.cmd(
        redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg("fencelock.renew")
            .arg("k1")
            .arg("k1")
            .arg("a")
            .arg("10")
            .arg("k2")
            .arg("b")
            .arg("10")
            .arg("5000"),
    );
    assert_eq!(keys, ["k1", "k2"]);
    // A packed batch names every item's key, and only those.
    let keys: Vec<String> = server.node.cmd(
        redis::cmd("COMMAND")
            .arg("GETKEYS")
            .arg("fencelock.extend_packed")
            .arg("k1")
            .arg("a 10 5")
            .arg("k2")
            .arg("b 10 5"),
    );
    assert_eq!(keys, ["k1", "k2"]);
}

#[test]
fn a_cluster_that_loads_the_module_survives_the_storm_and_replicates_it_alike() {
    let cluster = Cluster::start_with_module();
    let masters: Vec<&Node> = (0..3)
        .map(|i| cluster.master_of_slot(i * 5_461 + 100))
        .collect();
    // One tag per master, found by slot.
    let tags: Vec<String> = masters
        .iter()
        .map(|m| {
            (0..)
                .map(|i| format!("t{i}"))
                .find(|t| std::ptr::eq(cluster.master_of_slot(slot_of(t.as_bytes())), *m))
                .unwrap()
        })
        .collect();
    let mut conns: Vec<Resp> = masters.iter().map(|m| Resp::connect(m)).collect();
    let guarded: Vec<Vec<String>> = conns
        .iter_mut()
        .zip(&tags)
        .map(|(c, t)| set_up(c, t))
        .collect();
    let before: Vec<Vec<String>> = conns
        .iter_mut()
        .zip(&guarded)
        .map(|(c, keys)| keys.iter().map(|k| guarded_view(c, k)).collect())
        .collect();
    let pools: Vec<Vec<Vec<u8>>> = tags
        .iter()
        .zip(&guarded)
        .map(|(t, g)| {
            let mut pool: Vec<Vec<u8>> = storm_keys(t).into_iter().map(|(k, _)| k).collect();
            pool.extend(g.iter().map(|k| k.clone().into_bytes()));
            pool
        })
        .collect();

    let mut rng = Rng(0x0c10_57e2_5eed);
    let mut tally = Tally::default();
    for _ in 0..CLUSTER_CALLS {
        let m = rng.below(3);
        let key = rng.pick(&pools[m]).clone();
        let args = storm_call(&mut rng, &key);
        // Now and then to a master that does not serve the key: a clean MOVED.
        let to = if rng.chance(5) { (m + 1) % 3 } else { m };
        let reply = conns[to].call(&args);
        tally.add(&args, &reply);
    }
    eprintln!("cluster storm of {CLUSTER_CALLS} calls: {tally:?}");
    assert!(tally.errors.contains_key("MOVED"), "{tally:?}");

    for node in &cluster.nodes {
        assert_alive(node);
    }
    for (c, (keys, before)) in conns.iter_mut().zip(guarded.iter().zip(&before)) {
        for (key, before) in keys.iter().zip(before) {
            assert_eq!(&guarded_view(c, key), before, "{key} changed");
        }
    }
    // Replicas got the same effects (the module replicates what it did, not the command).
    for ((master, conn), pool) in masters.iter().zip(conns.iter_mut()).zip(&pools) {
        let acked = conn.call(&[b"WAIT".to_vec(), b"1".to_vec(), b"5000".to_vec()]);
        assert_eq!(acked, Reply::Int(1), "the replica acknowledged");
        let replica = cluster.replica_of(port_of(master));
        let mut rconn = Resp::connect(replica);
        assert_eq!(
            rconn.call(&[b"READONLY".to_vec()]),
            Reply::Other("+OK".into())
        );
        let horizon = now_ms() + 30_000;
        let mut compared = 0;
        for key in pool {
            let key = String::from_utf8(key.clone()).unwrap();
            let expires = match conn.call(&[b"PEXPIRETIME".to_vec(), key.clone().into_bytes()]) {
                Reply::Int(t) => t,
                other => panic!("PEXPIRETIME {key}: {other:?}"),
            };
            if expires >= 0 && (expires as u64) < horizon {
                continue; // may expire while we compare
            }
            assert_eq!(
                snapshot(&mut rconn, &key, false),
                snapshot(conn, &key, false),
                "{key} differs on the replica"
            );
            compared += 1;
        }
        assert!(compared >= pool.len() / 2, "only {compared} keys compared");
    }
}

fn port_of(node: &Node) -> u16 {
    node.addr()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap()
}
