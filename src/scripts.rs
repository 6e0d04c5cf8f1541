//! Every Lua script fencelock runs, with its KEYS/ARGV contract and replies.
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

/// One Lua script and its SHA1.
#[derive(Debug)]
pub(crate) struct LuaScript {
    name: &'static str,
    source: &'static str,
    sha: String,
}

impl LuaScript {
    /// Trailing newlines are dropped before hashing, so the text `$(fencelock script NAME)`
    /// yields in a shell (which strips them) has the SHA1 the client sends.
    fn new(name: &'static str, source: &'static str) -> Self {
        let source = source.trim_end_matches('\n');
        let sha = redis::Script::new(source).get_hash().to_owned();
        Self { name, source, sha }
    }

    /// `EVALSHA sha numkeys keys.. args..`.
    pub(crate) fn evalsha(&self, keys: &[&str], args: &[&str]) -> Cmd {
        Self::invocation("EVALSHA", &self.sha, keys, args)
    }

    /// `EVAL source numkeys keys.. args..`, the fallback after `NOSCRIPT`.
    pub(crate) fn eval(&self, keys: &[&str], args: &[&str]) -> Cmd {
        Self::invocation("EVAL", self.source, keys, args)
    }

    fn invocation(verb: &str, body: &str, keys: &[&str], args: &[&str]) -> Cmd {
        let mut cmd = redis::cmd(verb);
        cmd.arg(body).arg(keys.len()).arg(keys).arg(args);
        cmd
    }
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
///     ["acquire", "release", "extend", "reenter", "renew", "fenced_set"]
/// );
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ScriptSource {
    /// What the script does: `acquire`, `release`, `extend`, `reenter`, `renew` or `fenced_set`.
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
    ]
    .into_iter()
    .map(|script| ScriptSource {
        name: script.name,
        sha1: &script.sha,
        source: script.source,
    })
}

/// The prologue every lock script shares: the server's time, the lock's state and its key's
/// lifetime.
///
/// `now_us` is `TIME` in microseconds, `now_ms` in milliseconds; `live` is true when `owner`
/// holds an unexpired lease; `lock[4]` is the hold count of a re-entered lock (absent for one
/// hold). `clear()` removes every field but `fence`.
///
/// The last `ARGV` of every lock script is the key's expiry grace in ms, or empty to keep the key
/// for good. `keep(key, fence, ends)` is called after every write: with a grace it sets the key
/// to expire at `max(ends, fence as ms) + grace`, where `ends` is the lease end (or now, for a
/// freed lock); without one it removes any expiry. In clock mode the next grant after the key
/// expired is `TIME µs + 1`, above `fence` because the clock has passed it by `grace`.
macro_rules! lock_script {
    ($flags:literal, $body:literal) => {
        concat!(
            "#!lua",
            $flags,
            "\n",
            "local now = redis.call('TIME')\n",
            "local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])\n",
            "local now_ms = math.floor(now_us / 1000)\n",
            "local grace = tonumber(ARGV[#ARGV])\n",
            "local function keep(key, fence, ends)\n",
            "  if not grace then return redis.call('PERSIST', key) end\n",
            "  local fence_ms = math.ceil((tonumber(fence) or 0) / 1000)\n",
            "  if fence_ms > ends then ends = fence_ms end\n",
            "  redis.call('PEXPIREAT', key, string.format('%.0f', ends + grace))\n",
            "end\n",
            "local lock = redis.call('HMGET', KEYS[1], 'owner', 'until', 'fence', 'holds')\n",
            "local owner, expires = lock[1], tonumber(lock[2])\n",
            "local live = owner and expires and expires > now_ms\n",
            "local function clear()\n",
            "  if not lock[4] then return redis.call('HDEL', KEYS[1], 'owner', 'until') end\n",
            "  for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do\n",
            "    if field ~= 'fence' then redis.call('HDEL', KEYS[1], field) end\n",
            "  end\n",
            "end\n",
            $body
        )
    };
}

/// Acquire: grant the lock to an owner and advance its fence.
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
pub(crate) static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "acquire",
        lock_script!(
            "",
            r#"if live then
  if owner == ARGV[1] then return {2, tonumber(lock[3]), 0} end
  return {0, expires - now_ms, 0}
end
local stored = tonumber(lock[3]) or 0
local fence = stored + 1
local floor = tonumber(ARGV[3])
local behind = 0
if ARGV[4] == 'clock' then
  if now_us > floor then floor = now_us end
  if stored > now_us then behind = stored - now_us end
elseif ARGV[4] == 'epoch' then
  local ok, info = pcall(redis.call, 'CLUSTER', 'INFO')
  local epoch = ok and tonumber(string.match(info, 'cluster_my_epoch:(%d+)'))
  if not epoch then
    return redis.error_reply('ERR fencelock: epoch fence mode cannot read cluster_my_epoch from CLUSTER INFO')
  end
  if epoch >= 2097152 then
    return redis.error_reply('ERR fencelock: config epoch ' .. epoch .. ' leaves no room below 2^53 for epoch fences')
  end
  if epoch * 4294967296 > floor then floor = epoch * 4294967296 end
end
if fence <= floor then fence = floor + 1 end
if fence > 9007199254740991 then
  return redis.error_reply('ERR fencelock: the next fence would pass 2^53 - 1 (stored ' .. string.format('%.0f', stored) .. '): lower the floor')
end
if lock[4] then clear() end
local ends = now_ms + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'owner', ARGV[1],
  'until', string.format('%.0f', ends),
  'fence', string.format('%.0f', fence))
keep(KEYS[1], fence, ends)
return {1, fence, behind}
"#
        ),
    )
});
/// Release: end one hold of this owner; the last hold frees the lock (keeping the fence) and
/// announces it on the lock's channel, so waiters try again at once.
///
/// - `KEYS[1]` lock key. `ARGV[1]` owner token, `ARGV[2]` hold id (empty for the hold the
///   acquire granted, else the id given to `reenter`), `ARGV[3]` how to announce the release:
///   `s` `SPUBLISH` (cluster), `p` `PUBLISH` (standalone), empty for not at all. The channel is
///   the lock key itself, so it lives in the lock's slot. `ARGV[4]` expiry grace.
///
/// Replies: `1` released (or one hold of several released); `0` no live lease (expired); `-1`
/// held by another owner (left alone). Releasing the same hold twice answers `1` both times and
/// counts once; releasing a hold that was never added (a re-entry cancelled before it reached
/// Redis) answers `1` and changes nothing.
///
/// Flagged `allow-oom`: it only removes fields and shortens the key's life, so it runs at
/// `maxmemory` too.
pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "release",
        lock_script!(
            " flags=allow-oom",
            r#"if owner ~= ARGV[1] then
  if live then return -1 end
  return 0
end
if not live then
  clear()
  keep(KEYS[1], lock[3], now_ms)
  return 0
end
if lock[4] or ARGV[2] ~= '' then
  if redis.call('HDEL', KEYS[1], 'h:' .. ARGV[2]) == 0 then return 1 end
  local holds = tonumber(lock[4] or 1) - 1
  if holds > 0 then
    redis.call('HSET', KEYS[1], 'holds', holds)
    return 1
  end
end
clear()
keep(KEYS[1], lock[3], now_ms)
if ARGV[3] == 's' then redis.call('SPUBLISH', KEYS[1], '')
elseif ARGV[3] == 'p' then redis.call('PUBLISH', KEYS[1], '') end
return 1
"#
        ),
    )
});

/// Re-enter: add a hold to a lock this owner holds, returning the same fence.
///
/// - `KEYS[1]` lock key. `ARGV[1]` owner token, `ARGV[2]` a fresh hold id (hex), `ARGV[3]` TTL
///   in ms: the lease is moved to now + TTL unless it already ends later; `ARGV[4]` expiry grace.
///
/// The hold count lives in the hash (`holds`) next to one field per hold (`h:<id>`, `h:` for
/// the first), so a resent script adds no second hold and a released hold is not released twice.
///
/// Replies: `{1, fence, remaining lease ms}` entered; `{0, 0, 0}` no live lease; `{-1, 0, 0}`
/// held by another owner.
pub(crate) static REENTER: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "reenter",
        lock_script!(
            "",
            r#"if not live then return {0, 0, 0} end
if owner ~= ARGV[1] then return {-1, 0, 0} end
if not lock[4] then
  redis.call('HSET', KEYS[1], 'h:', 1, 'h:' .. ARGV[2], 1, 'holds', 2)
elseif redis.call('HSETNX', KEYS[1], 'h:' .. ARGV[2], 1) == 1 then
  redis.call('HSET', KEYS[1], 'holds', tonumber(lock[4]) + 1)
end
local ends = now_ms + tonumber(ARGV[3])
if ends > expires then
  redis.call('HSET', KEYS[1], 'until', string.format('%.0f', ends))
else
  ends = expires
end
keep(KEYS[1], lock[3], ends)
return {1, tonumber(lock[3]), ends - now_ms}
"#
        ),
    )
});

/// Extend: move this owner's lease end to now + TTL. While the lock has several holds
/// (re-entry) the lease ends at the latest end any hold asked for: an extension never shortens
/// it then, so no hold's guard overstates its validity.
///
/// - `KEYS[1]` lock key. `ARGV[1]` owner token, `ARGV[2]` new TTL in ms, `ARGV[3]` expiry grace.
///
/// Replies: `{1, remaining lease ms}` extended; `{0, 0}` no live lease (expired); `{-1, 0}` held
/// by another owner (left alone).
///
/// Flagged `allow-oom`: it rewrites one existing field, so a held lock can be kept (and then
/// released) at `maxmemory`.
pub(crate) static EXTEND: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "extend",
        lock_script!(
            " flags=allow-oom",
            r#"if not live then return {0, 0} end
if owner ~= ARGV[1] then return {-1, 0} end
local ends = now_ms + tonumber(ARGV[2])
if (tonumber(lock[4]) or 1) > 1 and expires > ends then ends = expires end
redis.call('HSET', KEYS[1], 'until', string.format('%.0f', ends))
keep(KEYS[1], lock[3], ends)
return {1, ends - now_ms}
"#
        ),
    )
});

/// Renew: extend many leases on one node in one call (the watchdog's batch).
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
/// Replies: one code per triple: `1` extended, `0` expired, `-1` other owner.
///
/// Flagged `allow-oom`, as [`EXTEND`].
pub(crate) static RENEW: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "renew",
        r#"#!lua flags=allow-oom,allow-cross-slot-keys
local now = redis.call('TIME')
local now_ms = math.floor((tonumber(now[1]) * 1000000 + tonumber(now[2])) / 1000)
local grace = tonumber(ARGV[#ARGV])
local codes = {}
for i = 1, #ARGV - 1, 3 do
  local key = ARGV[i]
  local lock = redis.call('HMGET', key, 'owner', 'until', 'fence', 'holds')
  local expires = tonumber(lock[2])
  if not (lock[1] and expires and expires > now_ms) then
    codes[#codes + 1] = 0
  elseif lock[1] ~= ARGV[i + 1] then
    codes[#codes + 1] = -1
  else
    local ends = now_ms + tonumber(ARGV[i + 2])
    if (tonumber(lock[4]) or 1) > 1 and expires > ends then ends = expires end
    redis.call('HSET', key, 'until', string.format('%.0f', ends))
    if grace then
      local fence_ms = math.ceil((tonumber(lock[3]) or 0) / 1000)
      if fence_ms > ends then ends = fence_ms end
      redis.call('PEXPIREAT', key, string.format('%.0f', ends + grace))
    else
      redis.call('PERSIST', key)
    end
    codes[#codes + 1] = 1
  end
end
return codes
"#,
    )
});

/// Fenced write, for storage kept in Redis: store a value only under a fence token no lower than
/// any accepted before for that resource.
///
/// - `KEYS[1]` the resource: a hash with fields `value` and `fence`.
/// - `ARGV[1]` the writer's fence token (decimal), `ARGV[2]` the value.
///
/// Replies: `{1, fence}` written; `{0, highest}` rejected, with the highest fence accepted so far.
pub(crate) static FENCED_SET: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "fenced_set",
        r#"#!lua
local highest = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local fence = tonumber(ARGV[1])
if fence < highest then
  return {0, highest}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
return {1, fence}
"#,
    )
});
