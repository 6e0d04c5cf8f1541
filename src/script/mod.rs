//! Every Lua script fencelock runs, and how the client calls them and reads their replies.
//!
//! - `lua/`: one file per script or shared snippet; its comment header is the script's
//!   KEYS/ARGV/replies contract (the one copy: the Rust side only names the file).
//! - `assemble`: [`LuaScript`], a script's text built from the shared prologue, snippets and
//!   its body (and its batch twin), with its SHA1.
//! - `call`: [`ScriptCall`], one owned invocation, and its weight in a per-node batch.
//! - `reply`: the decoders of the replies ([`parse_reply`], [`Outcome`], [`parse_fence`]).
//! - `catalog`: one static per script (`ACQUIRE`, `RW_READ`, ...) grouped by primitive, and
//!   [`lua_scripts`].
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

mod assemble;
mod call;
mod catalog;
mod reply;

pub(crate) use assemble::LuaScript;
pub(crate) use call::{ttl_millis, ttl_ms, EntriesSeen, ScriptCall, SCAN_WEIGHT};
pub use catalog::{lua_scripts, ScriptSource};
pub(crate) use catalog::{
    ACQUIRE, ACQUIRE_FLOOR, EXTEND, FAIR_ACQUIRE, FAIR_EXTEND, FAIR_FORCE_UNLOCK, FAIR_RELEASE,
    FAIR_RENEW, FAIR_RENEW_PLACE, FAIR_WITHDRAW, FENCED_SET, FORCE_UNLOCK, HANDOFF, HANDOFF_FLOOR,
    INSPECT, LATCH_COUNT_DOWN, LATCH_FORCE_UNLOCK, LATCH_SET, LATCH_STATE, LOCK_ALL,
    LOCK_ALL_FLOOR, QUORUM_COMMIT, REENTER, RELEASE, RENEW, RW_DOWNGRADE, RW_EXTEND,
    RW_FORCE_UNLOCK, RW_READ, RW_REENTER, RW_RELEASE, RW_RENEW, RW_WITHDRAW, RW_WRITE,
    SEMAPHORE_ACQUIRE, SEMAPHORE_AVAILABLE, SEMAPHORE_EXTEND, SEMAPHORE_FORCE_UNLOCK,
    SEMAPHORE_RELEASE, SEMAPHORE_RENEW, SEMAPHORE_SET_LIMIT,
};
pub(crate) use reply::{parse_fence, parse_reply, Outcome};
