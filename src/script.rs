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
}

impl LuaScript {
    /// The script in `file` (a `script/lua/*.lua` text): its leading `--` comment header is
    /// not sent, and trailing newlines are dropped before hashing, so the text
    /// `$(fencelock script NAME)` yields in a shell (which strips them) has the SHA1 the client
    /// sends.
    fn new(name: &'static str, file: &'static str) -> Self {
        Self::from_source(name, without_header(file).trim_end_matches('\n').to_owned())
    }

    /// A lock script: the `#!lua` line of `file`, then the shared [`PROLOGUE`] and
    /// [`FENCE_RULE`], then the rest.
    fn with_prologue(name: &'static str, file: &'static str) -> Self {
        Self::with_prologue_and(name, file, "")
    }

    /// A lock script with the [`PROLOGUE`] and [`FENCE_RULE`], then the snippet `extra` (its
    /// header dropped), then the rest of `file`.
    fn with_prologue_and(name: &'static str, file: &'static str, extra: &str) -> Self {
        let (shebang, body) = without_header(file).split_once('\n').unwrap_or((file, ""));
        let source = format!(
            "{shebang}\n{}{}{}{body}",
            without_header(PROLOGUE),
            without_header(FENCE_RULE),
            without_header(extra)
        );
        Self::from_source(name, source.trim_end_matches('\n').to_owned())
    }

    fn from_source(name: &'static str, source: String) -> Self {
        let sha = redis::Script::new(&source).get_hash().to_owned();
        Self { name, source, sha }
    }

    /// The script's name, as [`ScriptSource::name`].
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    fn invocation(&self, verb: &str, body: &str, keys: &[String], args: &[String]) -> Cmd {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
        cmd
    }
}

/// `file` without its leading `--` comment lines.
fn without_header(file: &str) -> &str {
    let mut rest = file;
    while rest.starts_with("--") {
        rest = rest.split_once('\n').map_or("", |(_, next)| next);
    }
    rest
}

/// One script call with everything it needs, owned: it can be kept, cloned and run later (a
/// background release, a compensating release after WAIT).
#[derive(Debug, Clone)]
pub(crate) struct ScriptCall {
    script: &'static LuaScript,
    keys: Vec<String>,
    args: Vec<String>,
}

impl ScriptCall {
    /// `script` with `KEYS` `keys` and `ARGV` `args`.
    pub(crate) fn new(script: &'static LuaScript, keys: &[&str], args: &[&str]) -> Self {
        Self {
            script,
            keys: keys.iter().map(|&key| key.to_owned()).collect(),
            args: args.iter().map(|&arg| arg.to_owned()).collect(),
        }
    }

    /// `KEYS[1]`: what the call is routed by, and named after in the errors of a detached call.
    pub(crate) fn first_key(&self) -> &str {
        self.keys.first().map_or("", String::as_str)
    }

    /// `EVALSHA sha numkeys keys.. args..`.
    pub(crate) fn evalsha(&self) -> Cmd {
        self.script
            .invocation("EVALSHA", &self.script.sha, &self.keys, &self.args)
    }

    /// `EVAL source numkeys keys.. args..`, the fallback after `NOSCRIPT`.
    pub(crate) fn eval(&self) -> Cmd {
        self.script
            .invocation("EVAL", &self.script.source, &self.keys, &self.args)
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
}

impl Outcome {
    /// The outcome a script's code stands for; `None` for a code no script answers.
    pub(crate) fn from_code(code: i64) -> Option<Self> {
        match code {
            1 => Some(Outcome::Done),
            0 => Some(Outcome::Expired),
            -1 => Some(Outcome::NotOwner),
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
    redis::from_redis_value(reply.clone()).map_err(|_| Error::UnexpectedReply {
        name: name.to_owned(),
        operation,
        detail: format!("{reply:?}"),
    })
}

/// A duration as the scripts' milliseconds argument (at least 1).
pub(crate) fn ttl_millis(ttl: Duration) -> String {
    ttl.as_millis().max(1).to_string()
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
///         "acquire", "release", "extend", "reenter", "renew", "fenced_set",
///         "semaphore_acquire", "semaphore_release", "semaphore_extend", "semaphore_renew",
///         "semaphore_available", "semaphore_set_limit",
///     ]
/// );
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ScriptSource {
    /// What the script does: `acquire`, `release`, `extend`, `reenter`, `renew`, `fenced_set`,
    /// or a primitive's script named `<primitive>_<operation>` (e.g. `semaphore_acquire`).
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
        &*RELEASE,
        &*EXTEND,
        &*REENTER,
        &*RENEW,
        &*FENCED_SET,
        &*SEMAPHORE_ACQUIRE,
        &*SEMAPHORE_RELEASE,
        &*SEMAPHORE_EXTEND,
        &*SEMAPHORE_RENEW,
        &*SEMAPHORE_AVAILABLE,
        &*SEMAPHORE_SET_LIMIT,
    ]
    .into_iter()
    .map(|script| ScriptSource {
        name: script.name,
        sha1: &script.sha,
        source: &script.source,
    })
}

/// The prologue every lock script shares, inserted after its `#!lua` line: the server's time
/// (`now_us`, `now_ms`), the lock's state (`lock`, `owner`, `expires`, `live`), `keep(key,
/// fence, ends)` to set the key's expiry after a write and `clear()` to remove every field but
/// `fence`. The last `ARGV` of every lock script is the key's expiry grace in ms, or empty to
/// keep the key for good. See the file's header.
const PROLOGUE: &str = include_str!("script/lua/prologue.lua");

/// The fence rule every granting script shares, inserted after the [`PROLOGUE`]:
/// `next_fence(stored, floor, mode, count)` returns the first of `count` consecutive fences by
/// the mutex's rule (above the stored fence and the floor, raised to the clock or the epoch),
/// or nil and an error message when the last would pass 2^53 − 1. See the file's header.
const FENCE_RULE: &str = include_str!("script/lua/fence.lua");

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
/// - `{0, pttl, 0}` held by another owner, with its remaining lease in ms;
/// - an error reply (no write) when the next fence would pass 2^53 − 1, or the epoch cannot be
///   read.
///
/// Not flagged `allow-oom`: at `maxmemory` under `noeviction` Redis refuses it with `OOM`.
pub(crate) static ACQUIRE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::with_prologue("acquire", include_str!("script/lua/acquire.lua")));

/// Release (`script/lua/release.lua`): end one hold of this owner; the last hold frees the lock
/// (keeping the fence) and announces it on the lock's channel, so waiters try again at once.
///
/// - `KEYS[1]` lock key. `ARGV[1]` owner token, `ARGV[2]` hold id (empty for the hold the
///   acquire granted, else the id given to `reenter`), `ARGV[3]` how to announce the release:
///   `s` `SPUBLISH` (cluster), `p` `PUBLISH` (standalone), empty for not at all. The channel is
///   the lock key itself, so it lives in the lock's slot. `ARGV[4]` expiry grace.
///
/// Replies ([`Outcome`]): `1` released (or one hold of several released); `0` no live lease
/// (expired); `-1` held by another owner (left alone). Releasing the same hold twice answers `1`
/// both times and counts once; releasing a hold that was never added (a re-entry cancelled
/// before it reached Redis) answers `1` and changes nothing.
///
/// Flagged `allow-oom`: it only removes fields and shortens the key's life, so it runs at
/// `maxmemory` too.
pub(crate) static RELEASE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::with_prologue("release", include_str!("script/lua/release.lua")));

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
/// held by another owner.
pub(crate) static REENTER: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::with_prologue("reenter", include_str!("script/lua/reenter.lua")));

/// Extend (`script/lua/extend.lua`): move this owner's lease end to now + TTL. While the lock
/// has several holds (re-entry) the lease ends at the latest end any hold asked for: an
/// extension never shortens it then, so no hold's guard overstates its validity.
///
/// - `KEYS[1]` lock key. `ARGV[1]` owner token, `ARGV[2]` new TTL in ms, `ARGV[3]` expiry grace.
///
/// Replies: `{1, remaining lease ms}` extended; `{0, 0}` no live lease (expired); `{-1, 0}` held
/// by another owner (left alone); the code is an [`Outcome`].
///
/// Flagged `allow-oom`: it rewrites one existing field, so a held lock can be kept (and then
/// released) at `maxmemory`.
pub(crate) static EXTEND: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::with_prologue("extend", include_str!("script/lua/extend.lua")));

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
/// Replies: one [`Outcome`] code per triple: `1` extended, `0` expired, `-1` other owner.
///
/// Flagged `allow-oom`, as [`EXTEND`].
pub(crate) static RENEW: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("renew", include_str!("script/lua/renew.lua")));

/// Fenced write (`script/lua/fenced_set.lua`), for storage kept in Redis: store a value only
/// under a fence token no lower than any accepted before for that resource.
///
/// - `KEYS[1]` the resource: a hash with fields `value` and `fence`.
/// - `ARGV[1]` the writer's fence token (decimal), `ARGV[2]` the value.
///
/// Replies: `{1, fence}` written; `{0, highest}` rejected, with the highest fence accepted so far.
pub(crate) static FENCED_SET: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("fenced_set", include_str!("script/lua/fenced_set.lua")));

/// The semaphore's state, shared by its scripts after the prologue and fence rule
/// (`script/lua/semaphore.lua`): `sem_read(key)` parses the hash, `sem_end(s)` is the latest
/// end a live entry needs, `sem_permit(owner, ends, fence)` formats a permit entry.
const SEMAPHORE: &str = include_str!("script/lua/semaphore.lua");

/// A semaphore script: prologue, fence rule, [`SEMAPHORE`] state, then `file`.
fn semaphore_script(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::with_prologue_and(name, file, SEMAPHORE)
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
///
/// Not flagged `allow-oom`.
pub(crate) static SEMAPHORE_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_script(
        "semaphore_acquire",
        include_str!("script/lua/semaphore_acquire.lua"),
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
/// Replies ([`Outcome`]): `1` released (also when resent: a released entry keeps its owner with
/// lease end 0), or a reservation withdrawn; `0` unknown or expired permits, nothing changed;
/// `-1` a permit is now held by another owner.
///
/// Flagged `allow-oom`.
pub(crate) static SEMAPHORE_RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_script(
        "semaphore_release",
        include_str!("script/lua/semaphore_release.lua"),
    )
});

/// Semaphore extend (`script/lua/semaphore_extend.lua`): move the lease end of an owner's live
/// permits to now + TTL.
///
/// - `KEYS[1]` the semaphore key. `ARGV[1]` owner token, `ARGV[2]` TTL in ms, `ARGV[3]` expiry
///   grace.
///
/// Replies: `{1, TTL ms}` extended; `{0, 0}` no live permit of this owner.
///
/// Flagged `allow-oom`.
pub(crate) static SEMAPHORE_EXTEND: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_script(
        "semaphore_extend",
        include_str!("script/lua/semaphore_extend.lua"),
    )
});

/// Semaphore renew (`script/lua/semaphore_renew.lua`): the watchdog's batch for semaphores, as
/// [`RENEW`] (`ARGV` triples key, owner, TTL in ms, then the expiry grace); each owner's live
/// permits are set as [`SEMAPHORE_EXTEND`] sets them, touching no other entry.
///
/// Replies: one code per triple, `1` extended or `0` no live permit.
///
/// Flagged `allow-oom`.
pub(crate) static SEMAPHORE_RENEW: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_script(
        "semaphore_renew",
        include_str!("script/lua/semaphore_renew.lua"),
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
        include_str!("script/lua/semaphore_available.lua"),
    )
});

/// Semaphore set limit (`script/lua/semaphore_set_limit.lua`): store a new limit and announce
/// it; permits held above a lowered limit stay until released or expired.
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
        include_str!("script/lua/semaphore_set_limit.lua"),
    )
});
