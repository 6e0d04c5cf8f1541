//! Every Lua script fencelock runs (one file each under `script/lua/`, its KEYS/ARGV/replies
//! contract in a comment header), the owned call that runs one ([`ScriptCall`]), and the
//! decoders of their replies ([`parse_reply`], [`Outcome`], [`parse_fence`]).
//!
//! Each script starts with `#!lua`, which makes Redis treat it as a write script (a replica
//! answers `MOVED` rather than `READONLY`) and requires all its keys to be declared and to share
//! one slot. Scripts are sent as `EVALSHA`; on `NOSCRIPT` (a freshly promoted master, a
//! `SCRIPT FLUSH`) the caller resends the same invocation as `EVAL`, which also caches it on
//! that node — one extra round trip, and no other node is involved.
//!
//! A lock is one key: a hash with fields `fence` (the last token granted, never removed),
//! `owner` (the holder's 128-bit random token, hex) and `until` (the end of the lease in server
//! milliseconds since the epoch, from `TIME`). The lease is judged inside the scripts, so the
//! fence survives every release and lease expiry. In clock mode the key itself expires once the
//! server clock has passed both the lease end and the fence (plus a grace), when the next grant
//! starts above the fence anyway; in counter and epoch modes it is kept for good. One key per
//! lock also means a lock is never split across nodes while its slot migrates (a multi-key
//! script would answer `TRYAGAIN` until both keys had moved).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, Value};

use crate::error::{Error, Result};
use crate::fence::FenceToken;

/// One Lua script and its SHA1.
#[derive(Debug)]
pub(crate) struct LuaScript {
    name: &'static str,
    source: String,
    sha: String,
    /// The script that runs this one for many keys of one node in one call (`batch.lua`
    /// around it), for the scripts the client batches.
    batch: Option<Box<LuaScript>>,
}

impl LuaScript {
    /// The script in `file` (a `script/lua/*.lua` text): its leading `--` comment header is
    /// not sent, and trailing newlines are dropped before hashing, so the text
    /// `$(fencelock script NAME)` yields in a shell (which strips them) has the SHA1 the client
    /// sends.
    fn new(name: &'static str, file: &'static str) -> Self {
        Self::from_source(name, without_header(file).trim_end_matches('\n').to_owned())
    }

    /// A lock script: the `#!lua` line of `file`, then the shared [`PROLOGUE`], then the rest.
    fn with_prologue(name: &'static str, file: &'static str) -> Self {
        Self::with_snippets(name, &[], file)
    }

    /// A script of a primitive built on the lock prologue: the `#!lua` line of `file`, then the
    /// once-per-call parts of the shared [`PROLOGUE`] and of `snippets` (the primitive's own
    /// prologue, shared rules such as [`FENCE_RULE`]), then their once-per-key parts, headers
    /// dropped (see [`op_source`]), then the rest of `file`.
    fn with_snippets(name: &'static str, snippets: &[&'static str], file: &'static str) -> Self {
        let (shebang, body) = split_shebang(file);
        let (call, key) = op_source(snippets, body);
        let source = format!("{shebang}\nlocal memo = {{}}\n{call}{key}");
        Self::from_source(name, source.trim_end_matches('\n').to_owned())
    }

    /// As [`with_snippets`](Self::with_snippets), with the twin that runs the script for many
    /// keys of one node in one call: `batch.lua` around the same prologue, snippets and body,
    /// flagged as the script plus `allow-cross-slot-keys`, named `<name>_batch`.
    fn batchable(name: &'static str, snippets: &[&'static str], file: &'static str) -> Self {
        let mut script = Self::with_snippets(name, snippets, file);
        let (shebang, body) = split_shebang(file);
        let shebang = match shebang.split_once("flags=") {
            Some((head, flags)) => format!("{head}flags={flags},allow-cross-slot-keys"),
            None => format!("{} flags=allow-cross-slot-keys", shebang.trim_end()),
        };
        let (head, tail) = without_header(BATCH)
            .split_once("--@body\n")
            .expect("batch.lua has a --@body line");
        let (before, after) = head
            .split_once("--@call\n")
            .expect("batch.lua has a --@call line");
        let (call, key) = op_source(snippets, body);
        let source = format!(
            "{shebang}\nlocal memo = {{}}\n{before}{call}{after}{}\n{tail}",
            key.trim_end_matches('\n')
        );
        let batch_name: &'static str = Box::leak(format!("{name}_batch").into_boxed_str());
        script.batch = Some(Box::new(Self::from_source(
            batch_name,
            source.trim_end_matches('\n').to_owned(),
        )));
        script
    }

    /// A granting script: the `#!lua` line of `file`, then the shared [`PROLOGUE`] and
    /// [`FENCE_RULE`], then the rest.
    fn with_fence_rule(name: &'static str, file: &'static str) -> Self {
        Self::with_snippets(name, &[FENCE_RULE], file)
    }

    fn from_source(name: &'static str, source: String) -> Self {
        let sha = redis::Script::new(&source).get_hash().to_owned();
        Self {
            name,
            source,
            sha,
            batch: None,
        }
    }

    /// The twin that runs this script for many keys of one node in one call, if it has one.
    pub(crate) fn batch(&'static self) -> Option<&'static LuaScript> {
        self.batch.as_deref()
    }

    /// The script's name, as [`ScriptSource::name`].
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }
}

/// The `#!lua` line of `file` (header skipped) and the rest.
fn split_shebang(file: &str) -> (&str, &str) {
    let file = without_header(file);
    file.split_once('\n').unwrap_or((file, ""))
}

/// The code of a script built on the shared [`PROLOGUE`] and `snippets` (headers dropped), as
/// what runs once per script call and what runs once per key: the part of the prologue and of
/// each snippet above its `--@key` line (if it has one), then the rest of them and `body`. In a
/// batch the keys share the first part (the time, helper functions that read no key).
fn op_source(snippets: &[&str], body: &str) -> (String, String) {
    let (mut call, mut key) = (String::new(), String::new());
    for part in std::iter::once(&PROLOGUE).chain(snippets) {
        let text = without_header(part);
        let marker = if text.starts_with(KEY_MARKER) {
            Some(0)
        } else {
            text.find(&format!("\n{KEY_MARKER}")).map(|at| at + 1)
        };
        match marker {
            Some(at) => {
                call.push_str(&text[..at]);
                key.push_str(&text[at + KEY_MARKER.len()..]);
            }
            None => key.push_str(text),
        }
    }
    key.push_str(body);
    (call, key)
}

/// The line that ends a snippet's once-per-call part (see [`op_source`]).
const KEY_MARKER: &str = "--@key\n";

/// `file` without its leading `--` comment lines (a `--@` marker line is not one of them).
fn without_header(file: &str) -> &str {
    let mut rest = file;
    while rest.starts_with("--") && !rest.starts_with("--@") {
        rest = rest.split_once('\n').map_or("", |(_, next)| next);
    }
    rest
}

impl From<ScriptCall> for std::borrow::Cow<'_, ScriptCall> {
    fn from(call: ScriptCall) -> Self {
        std::borrow::Cow::Owned(call)
    }
}

impl<'a> From<&'a ScriptCall> for std::borrow::Cow<'a, ScriptCall> {
    fn from(call: &'a ScriptCall) -> Self {
        std::borrow::Cow::Borrowed(call)
    }
}

/// What a call that reads `entries` entries of a hash that grows with its callers (a fair lock's
/// waiting places, a read-write lock's readers) weighs in a batch, in mutex calls: each entry
/// costs about a quarter of one, so a call on a full queue ([`MAX_FAIR_WAITERS`]) goes alone.
///
/// [`MAX_FAIR_WAITERS`]: crate::MAX_FAIR_WAITERS
pub(crate) fn entries_weight(entries: u32) -> u32 {
    1 + entries / 4
}

/// The least weight of a call that may read every entry of such a hash whatever its last
/// reply said (a fair acquire, withdrawal or release, a write acquire): at most `MAX_BATCH /
/// 32` = 2 of them share a batch, so a batch reads at most 2 × 256 entries (two full queues or
/// read-write locks) even when the counts seen are stale (other clients filled the queue since).
pub(crate) const SCAN_WEIGHT: u32 = 32;

/// Buckets of [`SEEN`]: slots share one by `slot % SEEN_BUCKETS`.
const SEEN_BUCKETS: usize = 1024;

/// The entry count the last reply of a fair or read-write call reported, per slot bucket: the
/// first call of an acquisition weighs by what an earlier call on that slot saw.
static SEEN: [AtomicU32; SEEN_BUCKETS] = [const { AtomicU32::new(0) }; SEEN_BUCKETS];

/// How many queue places or reader entries the calls of one acquisition read, as the replies
/// report them: the weight of its next calls ([`entries_weight`]).
#[derive(Debug)]
pub(crate) struct EntriesSeen {
    bucket: usize,
    /// The least weight of this acquisition's calls.
    floor: u32,
    /// The most this acquisition saw.
    most: AtomicU32,
}

impl EntriesSeen {
    /// Nothing seen yet by this acquisition on `slot`; its calls weigh at least `floor`.
    pub(crate) fn new(slot: u16, floor: u32) -> Self {
        Self {
            bucket: usize::from(slot) % SEEN_BUCKETS,
            floor,
            most: AtomicU32::new(0),
        }
    }

    /// A reply reported `entries`.
    pub(crate) fn note(&self, entries: i64) {
        let entries = u32::try_from(entries.max(0)).unwrap_or(u32::MAX);
        self.most.fetch_max(entries, Ordering::Relaxed);
        SEEN[self.bucket].store(entries, Ordering::Relaxed);
    }

    /// The most this acquisition saw, or what the last reply on its slot bucket reported if
    /// that is more.
    pub(crate) fn entries(&self) -> u32 {
        let most = self.most.load(Ordering::Relaxed);
        most.max(SEEN[self.bucket].load(Ordering::Relaxed))
    }

    /// The weight of the next call: [`entries_weight`] of [`entries`](Self::entries), at least
    /// the floor.
    pub(crate) fn weight(&self) -> u32 {
        entries_weight(self.entries()).max(self.floor)
    }
}

/// One script call with everything it needs, owned: it can be kept, cloned and run later (a
/// background release, a compensating release after WAIT).
///
/// It holds the `EVALSHA sha numkeys keys.. args..` command itself, built once into buffers
/// sized up front: sending it copies nothing, and a batch reads its calls' arguments from it.
#[derive(Debug, Clone)]
pub(crate) struct ScriptCall {
    script: &'static LuaScript,
    /// How many of the arguments after `numkeys` are keys.
    keys: usize,
    /// What the call may cost the server, in units of one mutex call (1 unless set with
    /// [`weighted`](Self::weighted)): a batch carries calls up to a total weight.
    weight: u32,
    cmd: Cmd,
}

/// Arguments of `EVALSHA` before the keys: the verb, the SHA and the number of keys.
const HEAD: usize = 3;

impl ScriptCall {
    /// `script` with `KEYS` `keys` and `ARGV` `args`.
    pub(crate) fn new(script: &'static LuaScript, keys: &[&str], args: &[&str]) -> Self {
        let bytes = keys
            .iter()
            .chain(args)
            .map(|part| part.len())
            .sum::<usize>();
        let mut call = Self::start(script, keys, args.len(), bytes);
        for arg in args {
            call.cmd.arg(*arg);
        }
        call
    }

    /// `script` with `KEYS` `keys`, and room for `args` more arguments of about `bytes` bytes
    /// in all (keys included), given with [`arg`](Self::arg).
    pub(crate) fn start(
        script: &'static LuaScript,
        keys: &[&str],
        args: usize,
        bytes: usize,
    ) -> Self {
        let mut cmd = Cmd::with_capacity(HEAD + keys.len() + args, 8 + 40 + 4 + bytes);
        cmd.arg("EVALSHA").arg(&script.sha).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        Self {
            script,
            keys: keys.len(),
            weight: 1,
            cmd,
        }
    }

    /// The same call, weighing `weight` mutex calls (at least 1) in a batch: a semaphore call
    /// reads every permit entry of its semaphore (`docs/design.md`, "Bounded script work").
    pub(crate) fn weighted(mut self, weight: u32) -> Self {
        self.weight = weight.max(1);
        self
    }

    /// The call's weight in a batch, in mutex calls.
    pub(crate) fn weight(&self) -> u32 {
        self.weight
    }

    /// Appends one `ARGV` argument (a string, or a number written in decimal).
    pub(crate) fn arg(mut self, arg: impl redis::ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// The arguments after `numkeys`: the keys, then the `ARGV` arguments.
    fn parts(&self) -> impl Iterator<Item = &[u8]> {
        self.cmd.args_iter().skip(HEAD).filter_map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
    }

    /// `KEYS[1]`: what the call is routed by, and named after in the errors of a detached call.
    pub(crate) fn first_key(&self) -> &str {
        self.parts()
            .next()
            .filter(|_| self.keys > 0)
            .and_then(|key| std::str::from_utf8(key).ok())
            .unwrap_or("")
    }

    /// The script that runs this call together with others of the same script for keys of one
    /// node, if the script has one and the call has one key.
    pub(crate) fn batch_script(&self) -> Option<&'static LuaScript> {
        self.script.batch().filter(|_| self.keys == 1)
    }

    /// Whether the call has exactly one key (`KEYS[1]`).
    pub(crate) fn has_one_key(&self) -> bool {
        self.keys == 1
    }

    /// One call of `batch` (the batch twin of the calls' script) running every call of `calls`
    /// (one key each), in order: `KEYS[1]` the first call's key, `ARGV` each call's key,
    /// number of arguments and arguments.
    pub(crate) fn batch_of<'a>(
        batch: &'static LuaScript,
        calls: impl IntoIterator<Item = &'a ScriptCall> + Clone,
    ) -> ScriptCall {
        let (mut args, mut bytes, mut first) = (0, 0, None);
        for call in calls.clone() {
            let parts = call.cmd.args_iter().len() - HEAD;
            args += parts + 1;
            bytes += call.cmd_bytes() + 4;
            first = first.or(Some(call.first_key()));
        }
        let first = first.unwrap_or("");
        let mut batch_call = ScriptCall::start(batch, &[first], args, bytes + first.len());
        for call in calls {
            let mut parts = call.parts();
            let key = parts.next().unwrap_or_default();
            batch_call
                .cmd
                .arg(key)
                .arg(call.cmd.args_iter().len() - HEAD - 1);
            for arg in parts {
                batch_call.cmd.arg(arg);
            }
        }
        batch_call
    }

    /// The bytes of the call's keys and arguments.
    fn cmd_bytes(&self) -> usize {
        self.parts().map(<[u8]>::len).sum()
    }

    /// `EVALSHA sha numkeys keys.. args..`.
    pub(crate) fn evalsha(&self) -> &Cmd {
        &self.cmd
    }

    /// `EVAL source numkeys keys.. args..`, the fallback after `NOSCRIPT`.
    pub(crate) fn eval(&self) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(&self.script.source).arg(self.keys);
        for part in self.parts() {
            cmd.arg(part);
        }
        cmd
    }
}

/// What a lock script answered about a hold: the `1`/`0`/`-1` of `release`, `extend`,
/// `reenter` and each triple of `renew`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// `1`: done; the hold is intact.
    Done,
    /// `0`: no live lease.
    Expired,
    /// `-1`: another owner holds the lock.
    NotOwner,
    /// `-2`: a forced unlock freed this owner's hold.
    ForceUnlocked,
}

impl Outcome {
    /// The outcome a script's code stands for; `None` for a code no script answers.
    pub(crate) fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(Outcome::Done),
            0 => Some(Outcome::Expired),
            -1 => Some(Outcome::NotOwner),
            -2 => Some(Outcome::ForceUnlocked),
            _ => None,
        }
    }

    /// `code` decoded, or [`Error::UnexpectedReply`] naming `name` and `operation`.
    pub(crate) fn decode(name: &str, operation: &'static str, code: i64) -> Result<Self> {
        Self::from_code(code).ok_or_else(|| Error::UnexpectedReply {
            name: name.to_owned(),
            operation,
            detail: format!("status {code}"),
        })
    }

    /// The error a lost hold of lock `name` reports; `None` for [`Outcome::Done`].
    pub(crate) fn lost(self, name: &str) -> Option<Error> {
        let name = name.to_owned();
        match self {
            Outcome::Done => None,
            Outcome::Expired => Some(Error::Expired { name }),
            Outcome::NotOwner => Some(Error::NotOwner { name }),
            Outcome::ForceUnlocked => Some(Error::ForceUnlocked { name }),
        }
    }
}

/// A fence token from a script's reply, or [`Error::UnexpectedReply`] when `value` is not one
/// (`what` names it in the detail: `fence`, `highest fence`).
pub(crate) fn parse_fence(
    name: &str,
    operation: &'static str,
    what: &str,
    value: i64,
) -> Result<FenceToken> {
    u64::try_from(value)
        .ok()
        .and_then(FenceToken::new)
        .ok_or_else(|| Error::UnexpectedReply {
            name: name.to_owned(),
            operation,
            detail: format!("{what} {value} out of range"),
        })
}

/// Decodes a script's reply, naming the lock and showing the reply when it has another shape.
pub(crate) fn parse_reply<T: redis::FromRedisValue>(
    name: &str,
    operation: &'static str,
    reply: Value,
) -> Result<T> {
    redis::from_redis_value_ref(&reply).map_err(|_| Error::UnexpectedReply {
        name: name.to_owned(),
        operation,
        detail: format!("{reply:?}"),
    })
}

/// A duration as the scripts' milliseconds argument (at least 1).
pub(crate) fn ttl_millis(ttl: Duration) -> String {
    ttl_ms(ttl).to_string()
}

/// A duration as the scripts' milliseconds argument (at least 1), as a number.
pub(crate) fn ttl_ms(ttl: Duration) -> u128 {
    ttl.as_millis().max(1)
}

/// A Lua script fencelock runs, for review or for preloading with `SCRIPT LOAD`.
///
/// # Examples
///
/// ```
/// let names: Vec<_> = fencelock::lua_scripts().map(|s| s.name).collect();
/// assert_eq!(
///     names,
///     [
///         "acquire", "acquire_batch", "lock_all", "release", "release_batch", "handoff",
///         "extend", "extend_batch", "reenter", "reenter_batch", "renew", "fenced_set",
///         "latch_set", "latch_count_down", "latch_state",
///         "rw_read", "rw_read_batch", "rw_write", "rw_write_batch", "rw_release",
///         "rw_release_batch", "rw_extend", "rw_extend_batch", "rw_renew", "rw_reenter",
///         "rw_downgrade", "rw_withdraw",
///         "fair_acquire", "fair_acquire_batch", "fair_release", "fair_release_batch",
///         "fair_withdraw", "fair_extend", "fair_extend_batch", "fair_renew", "fair_renew_place",
///         "semaphore_acquire", "semaphore_acquire_batch", "semaphore_release",
///         "semaphore_release_batch", "semaphore_extend", "semaphore_extend_batch",
///         "semaphore_renew", "semaphore_available", "semaphore_set_limit",
///         "inspect", "force_unlock", "rw_force_unlock", "fair_force_unlock",
///         "semaphore_force_unlock", "latch_force_unlock", "quorum_commit",
///     ]
/// );
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ScriptSource {
    /// What the script does: `acquire`, `release`, `extend`, `reenter`, `renew`, `fenced_set`,
    /// `inspect`, `force_unlock`, `quorum_commit` (the quorum lock's second round), or a
    /// primitive's script named `<primitive>_<operation>`: `rw_*` (read-write lock), `fair_*`,
    /// `semaphore_*`, `latch_*`. `<name>_batch` runs script `<name>` for many keys of one node
    /// in one call (the client's per-node batching).
    pub name: &'static str,
    /// The SHA1 Redis caches it under (`EVALSHA`).
    pub sha1: &'static str,
    /// The Lua source, `#!lua` first line included, without a trailing newline (the SHA1 is
    /// computed over exactly this text).
    pub source: &'static str,
}

/// Every Lua script fencelock runs; their contracts are documented in `docs/design.md`.
pub fn lua_scripts() -> impl Iterator<Item = ScriptSource> {
    [
        &*ACQUIRE,
        &*LOCK_ALL,
        &*RELEASE,
        &*HANDOFF,
        &*EXTEND,
        &*REENTER,
        &*RENEW,
        &*FENCED_SET,
        &*LATCH_SET,
        &*LATCH_COUNT_DOWN,
        &*LATCH_STATE,
        &*RW_READ,
        &*RW_WRITE,
        &*RW_RELEASE,
        &*RW_EXTEND,
        &*RW_RENEW,
        &*RW_REENTER,
        &*RW_DOWNGRADE,
        &*RW_WITHDRAW,
        &*FAIR_ACQUIRE,
        &*FAIR_RELEASE,
        &*FAIR_WITHDRAW,
        &*FAIR_EXTEND,
        &*FAIR_RENEW,
        &*FAIR_RENEW_PLACE,
        &*SEMAPHORE_ACQUIRE,
        &*SEMAPHORE_RELEASE,
        &*SEMAPHORE_EXTEND,
        &*SEMAPHORE_RENEW,
        &*SEMAPHORE_AVAILABLE,
        &*SEMAPHORE_SET_LIMIT,
        &*INSPECT,
        &*FORCE_UNLOCK,
        &*RW_FORCE_UNLOCK,
        &*FAIR_FORCE_UNLOCK,
        &*SEMAPHORE_FORCE_UNLOCK,
        &*LATCH_FORCE_UNLOCK,
        &*QUORUM_COMMIT,
    ]
    .into_iter()
    .flat_map(|script| std::iter::once(script).chain(script.batch()))
    .map(|script| ScriptSource {
        name: script.name,
        sha1: &script.sha,
        source: &script.source,
    })
}

/// The prologue every lock script shares, inserted after its `#!lua` line: the server's time
/// (`now_us`, `now_ms`), the lock's state (`lock`, `owner`, `expires`, `live`), `keep(key,
/// fence, ends)` to set the key's expiry after a write and `clear(KEYS[1], lock)` to remove
/// every field but `fence`. The last `ARGV` of every lock script is the key's expiry grace in
/// ms, or empty to keep the key for good. See the file's header.
const PROLOGUE: &str = include_str!("lua/prologue.lua");

/// The wrapper of a batchable script (`script/lua/batch.lua`): the script's code becomes a
/// function run once per key of one node, each under `pcall`. See the file's header.
const BATCH: &str = include_str!("lua/batch.lua");

/// The fence rule every granting script shares, inserted after the [`PROLOGUE`]:
/// `next_fence(stored, floor, mode, count)` returns the first of `count` (default 1)
/// consecutive fences, the highest of `stored + 1`, `floor + 1`, `TIME µs + 1` in clock mode
/// and `epoch × 2^32 + 1` in epoch mode, and `behind`; or `nil` and an error reply when the
/// last would pass 2^53 − 1. See the file's header.
const FENCE_RULE: &str = include_str!("lua/fence.lua");

/// Acquire (`script/lua/acquire.lua`): grant the lock to an owner and advance its fence.
///
/// - `KEYS[1]` the lock key (hash).
/// - `ARGV[1]` owner token, `ARGV[2]` TTL in ms, `ARGV[3]` floor: the token granted is above it
///   (decimal, `0` for none, below 2^53), `ARGV[4]` `clock` to raise the floor to the server's
///   `TIME` in microseconds, `epoch` to raise it to `cluster_my_epoch` × 2^32 (cluster only),
///   or `counter` for a plain counter; `ARGV[5]` expiry grace (see the prologue).
///
/// Replies:
/// - `{1, fence, behind}` granted now; `behind` is how many µs the stored fence was ahead of
///   the server clock in clock mode (the node's clock is behind an earlier grant), else 0;
/// - `{2, fence, 0}` this owner already holds the lock (a resent script): the fence granted
///   then, nothing changed;
/// - `{0, pttl, 0}` held by another owner, with its remaining lease in ms (the lock's
///   `waiters` flag is set, so its release announces);
/// - an error reply (no write) when the next fence would pass 2^53 − 1, or the epoch cannot be
///   read.
///
/// Not flagged `allow-oom`: at `maxmemory` under `noeviction` Redis refuses it with `OOM`.
pub(crate) static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::batchable(
        "acquire",
        &[FENCE_RULE],
        include_str!("lua/acquire.lua"),
    )
});

/// Acquire several (`script/lua/lock_all.lua`): grant every lock key of one slot to one owner,
/// or none, each with its own fence (the multi-lock's one-slot path; the mutex's data model per
/// key).
///
/// - `KEYS` the lock keys. `ARGV` as [`ACQUIRE`]: owner token, TTL in ms, floor, fence mode,
///   expiry grace.
///
/// Replies `{1, behind, fence...}` granted, one fence per key in `KEYS` order; `{2, 0, fence...}`
/// this owner already holds them all (a resent script, no write); `{0, pttl, i}` key `i`
/// (1-based) is held by another owner (no write); an error reply (no write) as [`ACQUIRE`].
///
/// Not flagged `allow-oom`.
pub(crate) static LOCK_ALL: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_fence_rule("lock_all", include_str!("lua/lock_all.lua"))
});

/// Release (`script/lua/release.lua`): end one hold of this owner; the last hold frees the lock
/// (keeping the fence) and, when an acquire found it busy since it was taken (`waiters`),
/// announces it on the lock's channel, so waiters try again at once. An uncontended release
/// publishes nothing (in a cluster, every `SPUBLISH` is also sent to the shard's replicas).
///
/// - `KEYS[1]` lock key. `ARGV[1]` owner token, `ARGV[2]` hold id (empty for the hold the
///   acquire granted, else the id given to `reenter`), `ARGV[3]` how to announce the release:
///   `s` `SPUBLISH` (cluster), `p` `PUBLISH` (standalone), empty for not at all. The channel is
///   the lock key itself, so it lives in the lock's slot. `ARGV[4]` expiry grace.
///
/// Replies ([`Outcome`]): `1` released (or one hold of several released); `0` no live lease
/// (expired); `-1` held by another owner (left alone); `-2` this owner's hold was freed by a
/// forced unlock (see [`FORCE_UNLOCK`]). Releasing the same hold twice answers `1`
/// both times and counts once; releasing a hold that was never added (a re-entry cancelled
/// before it reached Redis) answers `1` and changes nothing.
///
/// It leaves the key's expiry as the grant or the last extension set it (lease end or fence,
/// plus the grace), which already covers what the key must outlive.
///
/// Flagged `allow-oom`: it only removes fields, so it runs at
/// `maxmemory` too.
pub(crate) static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::batchable("release", &[], include_str!("lua/release.lua")));

/// Handoff (`script/lua/handoff.lua`): release one hold of owner A and, when that frees the
/// lock and no other client waits, grant it in the same call to owner B, a task of the same
/// client waiting behind A, with the fence rule: a grant within one client costs one call.
///
/// - `KEYS[1]` lock key. `ARGV[1]` owner A, `ARGV[2]` A's hold id, `ARGV[3]` announce (as
///   [`RELEASE`]); `ARGV[4]` owner B (the same client: the same first 8 characters), `ARGV[5]`
///   B's TTL in ms, `ARGV[6]` B's floor, `ARGV[7]` fence mode (as [`ACQUIRE`]); `ARGV[8]` how
///   long a refused handoff yields the lock to the other client, in ms; `ARGV[9]` how many
///   fences to take for B: 1, or more to reserve the next ones for B's client, which hands the
///   lock on within itself under B's token with them (the stored `fence` is the last taken);
///   `ARGV[10]` expiry grace.
///
/// Replies `{code, handed, fence, behind}`: `code` as [`RELEASE`] for A; `handed` `1` granted
/// to B (`fence` the first fence taken, `behind` as [`ACQUIRE`]), `0` not freed (A's other
/// holds remain, or another owner holds it), `2` freed and not handed: another client waits
/// (the release announces, and this client's acquires find the lock busy for `ARGV[8]` ms, so
/// the other one gets in first), or the fence rule refused.
///
/// Flagged like [`ACQUIRE`] (refused at `maxmemory`: it may grant).
///
/// Sent on its own, past the node's driver (see `Transport::run_direct`), so it has no batch
/// twin.
pub(crate) static HANDOFF: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::with_fence_rule("handoff", include_str!("lua/handoff.lua")));

/// Re-enter (`script/lua/reenter.lua`): add a hold to a lock this owner holds, returning the
/// same fence.
///
/// - `KEYS[1]` lock key. `ARGV[1]` owner token, `ARGV[2]` a fresh hold id (hex), `ARGV[3]` TTL
///   in ms: the lease is moved to now + TTL unless it already ends later; `ARGV[4]` expiry grace.
///
/// The hold count lives in the hash (`holds`) next to one field per hold (`h:<id>`, `h:` for
/// the first), so a resent script adds no second hold and a released hold is not released twice.
///
/// Replies: `{1, fence, remaining lease ms}` entered; `{0, 0, 0}` no live lease; `{-1, 0, 0}`
/// held by another owner; `{-2, 0, 0}` freed by a forced unlock (see [`FORCE_UNLOCK`]).
pub(crate) static REENTER: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::batchable("reenter", &[], include_str!("lua/reenter.lua")));

/// Extend (`script/lua/extend.lua`): move this owner's lease end to now + TTL. While the lock
/// has several holds (re-entry) the lease ends at the latest end any hold asked for: an
/// extension never shortens it then, so no hold's guard overstates its validity.
///
/// - `KEYS[1]` lock key. `ARGV[1]` owner token, `ARGV[2]` new TTL in ms, `ARGV[3]` expiry grace.
///
/// Replies: `{1, remaining lease ms}` extended; `{0, 0}` no live lease (expired); `{-1, 0}` held
/// by another owner (left alone); `{-2, 0}` freed by a forced unlock (see [`FORCE_UNLOCK`]); the
/// code is an [`Outcome`].
///
/// Flagged `allow-oom`: it rewrites one existing field, so a held lock can be kept (and then
/// released) at `maxmemory`.
pub(crate) static EXTEND: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::batchable("extend", &[], include_str!("lua/extend.lua")));

/// Renew (`script/lua/renew.lua`): extend many leases on one node in one call (the watchdog's
/// batch).
///
/// - `KEYS[1]` one of the lock keys (it routes the call to the node serving its slot).
/// - `ARGV` triples: lock key, owner token, TTL in ms — any number of them, for keys of any
///   slots served by this node (`allow-cross-slot-keys`; undeclared keys are reached through
///   `ARGV`, which Redis 7 permits for keys of local slots) — then the expiry grace as the last
///   `ARGV`. A key of a slot this node does not serve (moved, migrating) fails the whole call
///   with an error after the keys before it were renewed; the caller then renews slot by slot.
///
/// Each lease is set as [`EXTEND`] sets it (never shortened while the lock has several holds).
///
/// Replies: one [`Outcome`] code per triple: `1` extended, `0` expired, `-1` other owner, `-2`
/// freed by a forced unlock (see [`FORCE_UNLOCK`]).
///
/// Flagged `allow-oom`, as [`EXTEND`].
pub(crate) static RENEW: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("renew", include_str!("lua/renew.lua")));

/// Fenced write (`script/lua/fenced_set.lua`), for storage kept in Redis: store a value only
/// under a fence token no lower than any accepted before for that resource.
///
/// - `KEYS[1]` the resource: a hash with fields `value` and `fence`.
/// - `ARGV[1]` the writer's fence token (decimal), `ARGV[2]` the value.
///
/// Replies: `{1, fence}` written; `{0, highest}` rejected, with the highest fence accepted so far.
pub(crate) static FENCED_SET: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("fenced_set", include_str!("lua/fenced_set.lua")));

/// Latch set (`script/lua/latch_set.lua`): start a new generation of a countdown latch, whose
/// fence (the generation) follows the fence rule.
///
/// - `KEYS[1]` the latch key (hash): `fence` the last generation granted, `gen` the current
///   one, `count` its remaining count, `set` the set call that started it, `opened` the latest
///   generation that reached zero, `d:<id>` the ids counted down in `gen`.
/// - `ARGV[1]` count (0 opens at once), `ARGV[2]` the call's random set id, `ARGV[3]` floor
///   (the generation is above it; `0` for none), `ARGV[4]` fence mode (as [`ACQUIRE`]),
///   `ARGV[5]` announce (`s`, `p`, empty), `ARGV[6]` open TTL in ms, `ARGV[7]` expiry grace.
///
/// Replies: `{1, gen, behind}` started; `{2, gen, 0}` this set call already started the current
/// generation (a resent script, no write); an error reply past 2^53 − 1. An armed latch is kept
/// without expiry; an open one expires after the open TTL plus the grace (clock mode only).
///
/// Not flagged `allow-oom`.
pub(crate) static LATCH_SET: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_fence_rule("latch_set", include_str!("lua/latch_set.lua"))
});

/// Latch count-down (`script/lua/latch_count_down.lua`): count an id down once per generation;
/// the count-down reaching zero sets `opened`, drops the ids, sets the open key's expiry and
/// publishes the generation on the latch's channel (the latch key).
///
/// - `KEYS[1]` the latch key. `ARGV[1]` id, `ARGV[2]` generation (empty: the current one),
///   `ARGV[3]` announce (`s`, `p`, empty), `ARGV[4]` open TTL in ms, `ARGV[5]` expiry grace.
///
/// Replies: `{1, gen, remaining}` counted (or counted before, or already open: then no change);
/// `{0, 0, 0}` not set; `{-1, gen, 0}` `ARGV[2]` is not the current generation `gen`.
///
/// Not flagged `allow-oom` (it adds a field).
pub(crate) static LATCH_COUNT_DOWN: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_prologue(
        "latch_count_down",
        include_str!("lua/latch_count_down.lua"),
    )
});

/// Latch state (`script/lua/latch_state.lua`, `no-writes`): `{gen, count, opened}`, 0 for each
/// that is absent.
///
/// - `KEYS[1]` the latch key.
pub(crate) static LATCH_STATE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("latch_state", include_str!("lua/latch_state.lua")));

/// The read-write lock's prologue (`script/lua/rw_prologue.lua`): its fields and helpers.
const RW_PROLOGUE: &str = include_str!("lua/rw_prologue.lua");

/// A read-write lock script: the lock prologue, the fence rule, the rw prologue, then `file`.
fn rw_script(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::with_snippets(name, &[FENCE_RULE, RW_PROLOGUE], file)
}

/// [`rw_script`], with a batch twin (the calls on the hot path).
fn rw_batchable(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::batchable(name, &[FENCE_RULE, RW_PROLOGUE], file)
}

/// Read acquire of the read-write lock (`script/lua/rw_read.lua`).
///
/// - `KEYS[1]` the lock's hash `fencelock:{NAME}:rw`.
/// - `ARGV[1]` owner token, `ARGV[2]` TTL in ms, `ARGV[3]` floor, `ARGV[4]` fence mode,
///   `ARGV[5]` the most live readers ([`MAX_READERS`](crate::MAX_READERS)), `ARGV[6]` expiry
///   grace.
///
/// Replies: `{1, fence, behind}` granted (`r:<owner>` = `<lease end>:<fence>`, a new fence);
/// `{2, fence, 0}` this owner already reads (resent: no write); `{0, ms, 0}` a live writer or a
/// live writer intent, with the ms until it ends; `{0, ms, readers}` `ARGV[5]` live readers
/// (read, with the dead ones deleted, only once the hash has `ARGV[5]` fields), `ms` until the
/// first ends, at most TTL / 3; an error reply per the fence rule. Not `allow-oom`.
pub(crate) static RW_READ: LazyLock<LuaScript> =
    LazyLock::new(|| rw_batchable("rw_read", include_str!("lua/rw_read.lua")));

/// Write acquire of the read-write lock (`script/lua/rw_write.lua`).
///
/// - `KEYS[1]` the lock's hash. `ARGV[1]` owner token, `ARGV[2]` TTL in ms, `ARGV[3]` floor,
///   `ARGV[4]` fence mode, `ARGV[5]` the waiting call's intent id (empty: none), `ARGV[6]` expiry
///   grace.
///
/// Replies: `{1, fence, behind}` granted (no live writer, reader or other call's intent; this
/// call's intent removed); `{2, fence, 0}` resent; `{0, ms, fields}` refused (`fields`: the
/// hash's field count, what the call read), the intent set or refreshed unless another call's
/// is first, `ms` capped at TTL / 3 while this call keeps the intent; an error reply per the fence rule. Not `allow-oom`.
pub(crate) static RW_WRITE: LazyLock<LuaScript> =
    LazyLock::new(|| rw_batchable("rw_write", include_str!("lua/rw_write.lua")));

/// Release of a read or write hold (`script/lua/rw_release.lua`), the [`Kind`](crate::held::Kind)
/// contract: `ARGV` owner, hold id, announce, expiry grace; replies an [`Outcome`] code. Only
/// the owner's fields change. `allow-oom`.
pub(crate) static RW_RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| rw_batchable("rw_release", include_str!("lua/rw_release.lua")));

/// Extend of a read or write hold (`script/lua/rw_extend.lua`): `ARGV` owner, TTL ms, expiry
/// grace; replies `{code, remaining ms}`. `allow-oom`.
pub(crate) static RW_EXTEND: LazyLock<LuaScript> =
    LazyLock::new(|| rw_batchable("rw_extend", include_str!("lua/rw_extend.lua")));

/// The watchdog's batch renewal of read-write holds (`script/lua/rw_renew.lua`): `ARGV` triples
/// key, owner, TTL ms, then the expiry grace; one [`Outcome`] code per triple. Each triple moves
/// only its owner's entry (`w`/`wu` or `r:<owner>`). `allow-oom`, `allow-cross-slot-keys`.
pub(crate) static RW_RENEW: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("rw_renew", include_str!("lua/rw_renew.lua")));

/// Re-entry of a read or write hold (`script/lua/rw_reenter.lua`): `ARGV` owner, hold id, TTL
/// ms, `r`|`w`, expiry grace. Replies `{1, fence, remaining ms}`, `{0, 0, 0}` no live entry,
/// `{-1, 0, 0}` another owner writes, `{-2, 0, 0}` a reader asked to write (upgrade refused),
/// `{-3, 0, 0}` freed by a forced unlock (see [`RW_FORCE_UNLOCK`]).
pub(crate) static RW_REENTER: LazyLock<LuaScript> =
    LazyLock::new(|| rw_script("rw_reenter", include_str!("lua/rw_reenter.lua")));

/// Write → read downgrade (`script/lua/rw_downgrade.lua`): `ARGV` owner, announce, expiry
/// grace. Replies `{1, remaining ms}`, `{0, 0}` expired, `{-1, 0}` another owner writes,
/// `{-2, 0}` the owner has re-entered holds, `{-3, 0}` freed by a forced unlock (see
/// [`RW_FORCE_UNLOCK`]). `allow-oom`.
pub(crate) static RW_DOWNGRADE: LazyLock<LuaScript> =
    LazyLock::new(|| rw_script("rw_downgrade", include_str!("lua/rw_downgrade.lua")));

/// Withdraws a waiting writer's intent (`script/lua/rw_withdraw.lua`): `ARGV` intent id,
/// announce, expiry grace. Replies `1` withdrawn, `0` not this call's. `allow-oom`.
pub(crate) static RW_WITHDRAW: LazyLock<LuaScript> =
    LazyLock::new(|| rw_script("rw_withdraw", include_str!("lua/rw_withdraw.lua")));
/// The fair lock's queue snippet (`script/lua/fair.lua`), inserted after the prologue and the
/// fence snippet: `scan(me)` (the live places, the head, dead places deleted), `raise(fence,
/// ends)` (an expiry that is only ever raised) and `wake(owner, how)` (announce on one waiter's
/// own channel `<key>:w:<owner>`). See the file's header.
const FAIR: &str = include_str!("lua/fair.lua");

/// A fair lock script: prologue, fence snippet and fair snippet, then `file`.
fn fair_script(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::with_snippets(name, &[FENCE_RULE, FAIR], file)
}

/// [`fair_script`], with a batch twin (the calls on the hot path).
fn fair_batchable(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::batchable(name, &[FENCE_RULE, FAIR], file)
}

/// Fair acquire (`script/lua/fair_acquire.lua`): grant the fair lock in arrival order, or keep
/// the caller's place in its queue.
///
/// - `KEYS[1]` the fair lock key (hash: `owner`, `until`, `fence`, `qseq`, `q:<owner>` =
///   `"<seq> <place lease end ms>"` per waiting place).
/// - `ARGV[1]` owner token, `ARGV[2]` TTL in ms, `ARGV[3]` floor, `ARGV[4]` fence mode (as
///   [`ACQUIRE`]), `ARGV[5]` place lease in ms (`0`: do not queue, a one-shot try), `ARGV[6]`
///   the most live places ([`MAX_FAIR_WAITERS`](crate::MAX_FAIR_WAITERS)), `ARGV[7]` expiry
///   grace.
///
/// Granted when the lock is free and no live place is queued, or the caller's place is the
/// head (the live place with the lowest seq). Otherwise the caller is queued if it was not
/// (`seq = ++qseq`, its arrival) and its place's lease moves to now + `ARGV[5]`. Dead places
/// are deleted when seen. A caller without a place that finds `ARGV[6]` live places gets none.
///
/// Replies:
/// - `{1, fence, behind, 0}` granted (fence by the rule of [`ACQUIRE`]);
/// - `{2, fence, 0, 0}` this owner holds it already (a resent script, no write);
/// - `{0, wait ms, places ahead, queued}` busy: `wait ms` is when the answer may change without
///   an announcement (the holder's lease end, or the head place's lease end when the head is
///   another's, whichever comes first); `queued` is 1 when this call created the place, -1
///   when the queue was full (no place; `places ahead` is then the queue's length and `wait
///   ms` at most a third of the place lease);
/// - an error reply (no write) as [`ACQUIRE`]'s.
///
/// Not flagged `allow-oom`.
pub(crate) static FAIR_ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| fair_batchable("fair_acquire", include_str!("lua/fair_acquire.lua")));

/// Fair release (`script/lua/fair_release.lua`): free the fair lock and wake only the head of
/// its queue, on the head's own channel (`<key>:w:<owner>`).
///
/// - `KEYS[1]` fair lock key. `ARGV[1]` owner token, `ARGV[2]` hold id (always empty),
///   `ARGV[3]` announce (`s`, `p` or empty, as [`RELEASE`]), `ARGV[4]` expiry grace.
///
/// Replies ([`Outcome`]): `1` released; `0` no live lease (expired: this owner's leftovers are
/// cleared and the head woken); `-1` held by another owner (left alone); `-2` freed by a forced
/// unlock (see [`FAIR_FORCE_UNLOCK`]). Flagged `allow-oom`.
pub(crate) static FAIR_RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| fair_batchable("fair_release", include_str!("lua/fair_release.lua")));

/// Fair withdraw (`script/lua/fair_withdraw.lua`): a waiting call that ends without the lock
/// gives up its place at once, and frees the lock if its last request was granted unseen.
///
/// - `KEYS[1]` fair lock key. `ARGV[1]` owner token, `ARGV[2]` announce, `ARGV[3]` expiry
///   grace.
///
/// Wakes the new head when the withdrawal freed the lock or removed the head's place of a free
/// lock. Replies: `1` something was removed; `0` nothing of this owner was there (a resent
/// call). Flagged `allow-oom`.
pub(crate) static FAIR_WITHDRAW: LazyLock<LuaScript> = LazyLock::new(|| {
    fair_script(
        "fair_withdraw",
        include_str!("lua/fair_withdraw.lua"),
    )
});

/// Fair extend (`script/lua/fair_extend.lua`): as [`EXTEND`] for the fair lock (no re-entry);
/// the key's expiry is only raised, since it may cover a waiting place. Replies `{code,
/// remaining lease ms}`. Flagged `allow-oom`.
pub(crate) static FAIR_EXTEND: LazyLock<LuaScript> =
    LazyLock::new(|| fair_batchable("fair_extend", include_str!("lua/fair_extend.lua")));

/// Fair renew (`script/lua/fair_renew.lua`): the watchdog's batch for held fair locks, as
/// [`RENEW`] (triples key, owner, TTL ms, then the grace; one [`Outcome`] code per triple), with
/// the key's expiry only raised. Flagged `allow-oom`.
pub(crate) static FAIR_RENEW: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("fair_renew", include_str!("lua/fair_renew.lua")));

/// Fair place renew (`script/lua/fair_renew_place.lua`): the watchdog's batch for waiting
/// places. Touches only `q:<owner>` of each triple (key, owner, place lease ms; then the grace):
/// a live place's lease moves to now + lease, keeping its seq. Replies one code per triple: `1`
/// renewed (or its owner was granted the lock meanwhile), `0` the place is gone. Flagged
/// `allow-oom`.
pub(crate) static FAIR_RENEW_PLACE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "fair_renew_place",
        include_str!("lua/fair_renew_place.lua"),
    )
});

/// The semaphore's state, shared by its scripts after the prologue and fence rule
/// (`script/lua/semaphore.lua`): `sem_read(key)` parses the hash, `sem_end(s)` is the latest
/// end a live entry needs, `sem_mine(key, holder)` reads one hold's permits, `sem_raise` raises
/// the expiry, `sem_permit(owner, ends, fence)` formats a permit entry, `sem_call` sends a
/// command's arguments in chunks of 512.
const SEMAPHORE: &str = include_str!("lua/semaphore.lua");

/// A semaphore script: prologue, fence rule, [`SEMAPHORE`] state, then `file`.
fn semaphore_script(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::with_snippets(name, &[FENCE_RULE, SEMAPHORE], file)
}

/// [`semaphore_script`], with a batch twin (the calls on the hot path).
fn semaphore_batchable(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::batchable(name, &[FENCE_RULE, SEMAPHORE], file)
}

/// Semaphore acquire (`script/lua/semaphore_acquire.lua`): take `count` permits for one owner,
/// all or none, each with its own fence (consecutive from the one `fence` counter, first by the
/// mutex's rule).
///
/// - `KEYS[1]` the semaphore key (hash `<prefix>:{NAME}:sem`).
/// - `ARGV[1]` owner token, `ARGV[2]` count, `ARGV[3]` limit (stored on first use), `ARGV[4]`
///   TTL in ms, `ARGV[5]` floor, `ARGV[6]` fence mode, `ARGV[7]` waiter id (may reserve; empty
///   for none), `ARGV[8]` expiry grace.
///
/// Replies: `{1, behind, lease ms, n1, fence1, ...}` granted; `{2, 0, remaining ms, n1, fence1,
/// ...}` this owner already holds permits (a resent script; no write); `{0, retry after ms,
/// available}` not enough free permits, or they are reserved for another waiter; `{-1, stored
/// limit}` another limit is stored (no write); an error reply as for [`ACQUIRE`]'s fence rule.
/// Dead entries it reads are deleted; a reservation for more than the limit blocks no one.
///
/// Not flagged `allow-oom`.
pub(crate) static SEMAPHORE_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_batchable(
        "semaphore_acquire",
        include_str!("lua/semaphore_acquire.lua"),
    )
});

/// Semaphore release (`script/lua/semaphore_release.lua`): release an owner's permits (the
/// release of the [`Kind`](crate::held::Kind) contract; the hold id is the permit numbers), or
/// withdraw a waiter's reservation.
///
/// - `KEYS[1]` the semaphore key. `ARGV[1]` owner token or waiter id, `ARGV[2]` permit numbers
///   space separated (empty: all live permits of the owner), `ARGV[3]` announce (`s`, `p`,
///   empty), `ARGV[4]` expiry grace.
///
/// Replies ([`Outcome`]): `1` released (also when resent, until an acquire deletes the released
/// entry: it keeps its owner with lease end 0), or a reservation withdrawn; `0` unknown or
/// expired permits, nothing changed; `-1` a permit is now held by another owner; `-2` freed by
/// a forced unlock (see [`SEMAPHORE_FORCE_UNLOCK`]).
///
/// Flagged `allow-oom`.
pub(crate) static SEMAPHORE_RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_batchable(
        "semaphore_release",
        include_str!("lua/semaphore_release.lua"),
    )
});

/// Semaphore extend (`script/lua/semaphore_extend.lua`): move the lease end of an owner's live
/// permits to now + TTL.
///
/// - `KEYS[1]` the semaphore key. `ARGV[1]` the holder, `"<owner token> <n1> <n2> ..."` (the
///   hold's permit numbers, so only their entries are read), `ARGV[2]` TTL in ms, `ARGV[3]`
///   expiry grace.
///
/// Replies: `{1, TTL ms}` extended; `{0, 0}` no live permit of this owner; `{-2, 0}` freed by a
/// forced unlock.
///
/// Flagged `allow-oom`.
pub(crate) static SEMAPHORE_EXTEND: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_batchable(
        "semaphore_extend",
        include_str!("lua/semaphore_extend.lua"),
    )
});

/// Semaphore renew (`script/lua/semaphore_renew.lua`): the watchdog's batch for semaphores, as
/// [`RENEW`] (`ARGV` triples key, holder as for [`SEMAPHORE_EXTEND`], TTL in ms, then the
/// expiry grace); each holder's live permits are set as [`SEMAPHORE_EXTEND`] sets them, reading
/// and touching no other entry.
///
/// Replies: one code per triple, `1` extended, `0` no live permit, `-2` freed by a forced unlock.
///
/// Flagged `allow-oom`.
pub(crate) static SEMAPHORE_RENEW: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_script(
        "semaphore_renew",
        include_str!("lua/semaphore_renew.lua"),
    )
});

/// Semaphore available (`script/lua/semaphore_available.lua`): read-only (`no-writes`).
///
/// - `KEYS[1]` the semaphore key. `ARGV[1]` expiry grace (unused).
///
/// Replies: `{stored limit or 0, live permits}`.
pub(crate) static SEMAPHORE_AVAILABLE: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_script(
        "semaphore_available",
        include_str!("lua/semaphore_available.lua"),
    )
});

/// Semaphore set limit (`script/lua/semaphore_set_limit.lua`): store a new limit and announce
/// it; permits held above a lowered limit stay until released or expired; a reservation for
/// more permits than the new limit is removed.
///
/// - `KEYS[1]` the semaphore key. `ARGV[1]` new limit, `ARGV[2]` announce, `ARGV[3]` expiry
///   grace.
///
/// Replies: the limit stored before, `0` when none was.
///
/// Not flagged `allow-oom`.
pub(crate) static SEMAPHORE_SET_LIMIT: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_script(
        "semaphore_set_limit",
        include_str!("lua/semaphore_set_limit.lua"),
    )
});

/// The inspection snippet (`script/lua/inspect.lua`): `inspect(kind)` reads one key of any
/// primitive kind without writing and returns the inspection array. See the file's header.
const INSPECT_SNIPPET: &str = include_str!("lua/inspect.lua");

/// Inspect (`script/lua/inspect_read.lua`, `no-writes`): the state of one key of any kind.
///
/// - `KEYS[1]` the key. `ARGV[1]` its kind (`lock`, `rw`, `fair`, `sem`, `latch`: the key's
///   last part), `ARGV[2]` expiry grace (unused).
///
/// Replies `{exists, held, fence, lease ms, holds, waiters, a, b, c}` (`-1` for "none" where
/// a number may be absent; `a`, `b`, `c` by kind), as `inspect.lua` documents.
pub(crate) static INSPECT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "inspect",
        &[INSPECT_SNIPPET],
        include_str!("lua/inspect_read.lua"),
    )
});

/// Force-unlock of a mutex (`script/lua/force_unlock.lua`): frees every hold whoever holds it,
/// keeps the fence, applies the expiry rule and announces a freed live lock. A freed live hold
/// leaves its owner token in the field `forced` (replaced by the next forced unlock, gone with
/// the key; [`clear`](PROLOGUE) keeps it), so the freed owner's next call answers `-2`
/// ([`Outcome::ForceUnlocked`]) instead of "expired" or "another owner". The check costs one
/// `HGET` on those failure paths only.
///
/// - `KEYS[1]` the lock key. `ARGV[1]` announce (`s`, `p`, empty), `ARGV[2]` open TTL ms
///   (latch only; unused), `ARGV[3]` expiry grace. The same `ARGV` for every kind's
///   force-unlock script.
///
/// Replies: the [`INSPECT`] array of the state before. Flagged `allow-oom`.
pub(crate) static FORCE_UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "force_unlock",
        &[INSPECT_SNIPPET],
        include_str!("lua/force_unlock.lua"),
    )
});

/// Force-unlock of a read-write lock (`script/lua/rw_force_unlock.lua`): the writer and every
/// reader go (a waiting writer's intent stays); `ARGV` and reply as [`FORCE_UNLOCK`]. The freed
/// live owners' tokens replace the `forced` field (space separated), so [`RW_RELEASE`],
/// [`RW_EXTEND`] and [`RW_RENEW`] answer `-2` and [`RW_REENTER`] and [`RW_DOWNGRADE`] `-3` to
/// them.
pub(crate) static RW_FORCE_UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "rw_force_unlock",
        &[FENCE_RULE, RW_PROLOGUE, INSPECT_SNIPPET],
        include_str!("lua/rw_force_unlock.lua"),
    )
});

/// Force-unlock of a fair lock (`script/lua/fair_force_unlock.lua`): the holder goes, the
/// queue stays and its head is woken; `ARGV` and reply as [`FORCE_UNLOCK`], and a freed live
/// hold leaves the same `forced` marker, so [`FAIR_RELEASE`], [`FAIR_EXTEND`] and
/// [`FAIR_RENEW`] answer `-2` to its owner.
pub(crate) static FAIR_FORCE_UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "fair_force_unlock",
        &[FENCE_RULE, FAIR, INSPECT_SNIPPET],
        include_str!("lua/fair_force_unlock.lua"),
    )
});

/// Force-unlock of a semaphore (`script/lua/semaphore_force_unlock.lua`): every live permit's
/// entry is deleted (a reservation stays); `ARGV` and reply as [`FORCE_UNLOCK`]. The freed
/// permits' owners (each once) replace the `forced` field, so [`SEMAPHORE_RELEASE`],
/// [`SEMAPHORE_EXTEND`] and [`SEMAPHORE_RENEW`] answer `-2` to them.
pub(crate) static SEMAPHORE_FORCE_UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "semaphore_force_unlock",
        &[FENCE_RULE, SEMAPHORE, INSPECT_SNIPPET],
        include_str!("lua/semaphore_force_unlock.lua"),
    )
});

/// Force-open of a latch (`script/lua/latch_force_unlock.lua`): an armed latch's current
/// generation opens and is published; `ARGV` and reply as [`FORCE_UNLOCK`] (`ARGV[2]` the
/// open TTL in ms).
pub(crate) static LATCH_FORCE_UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "latch_force_unlock",
        &[INSPECT_SNIPPET],
        include_str!("lua/latch_force_unlock.lua"),
    )
});

/// Quorum commit (`script/lua/quorum_commit.lua`): the quorum lock's second round. Raises the
/// node's stored fence to the token the client chose, T, only while the owner still holds the
/// lock there and the stored fence is not above T (a resent round-one acquire may have granted
/// this owner again, higher: see docs/safety.md), and applies the clock-mode expiry rule with
/// the new fence.
///
/// - `KEYS[1]` lock key. `ARGV[1]` owner token, `ARGV[2]` T (decimal, below 2^53), `ARGV[3]`
///   expiry grace.
///
/// Replies: `1` committed; `0` this owner holds no live lease on this node, or its stored fence
/// is above T (nothing written);
/// an error reply when T is not a number. Idempotent.
///
/// Not flagged `allow-oom`.
pub(crate) static QUORUM_COMMIT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_prologue(
        "quorum_commit",
        include_str!("lua/quorum_commit.lua"),
    )
});
