//! `fencelock.release <key> <owner> <hold id> <announce> <grace>`: release.lua's KEYS, ARGV and
//! replies (see its header), served natively on key layout 2 for a lock without re-entry or a
//! queue: the last hold freed (the fence kept) and, when an acquire found the lock busy
//! meanwhile, the announcement (PUBLISH or SPUBLISH on the key's channel); another owner's or an
//! expired lock answered as the script does. A re-entered lock (a hold id, or holds), a queue to
//! hand the lock to (`waiters` `q`) and a key of layout 1 answer `-FALLBACK <reason>` before any
//! write. Allowed at maxmemory: it writes no more than it frees.

use crate::rules;
use crate::server::{Key, Reply};
use crate::state::{self, Buf};

/// Serves one call; `args` are the command's arguments after its name (key first).
pub fn run(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    key_name: *mut redis_module::raw::RedisModuleString,
    args: &[&[u8]],
    now_us: u64,
) -> Reply {
    if args.len() != 5 {
        return Reply::WrongArity;
    }
    let (owner, hold, announce) = (args[1], args[2], args[3]);
    if let Err(e) = rules::check_owner(owner).and_then(|()| rules::parse_grace(args[4])) {
        return Reply::Error(e);
    }
    if !matches!(announce, b"" | b"s" | b"p") {
        return Reply::Error("ERR fencelock: announce must be s, p or empty".into());
    }
    let now_ms = now_us / 1000;
    let key = Key::open(ctx, key_name);
    let value = match key.read_until() {
        Ok(value) => value,
        Err(reply) => return reply,
    };
    let lock = match Key::parsed(&value) {
        Ok(lock) => lock,
        Err(reply) => return reply,
    };
    let live = lock.as_ref().is_some_and(|l| l.live(now_ms));
    let Some(lock) = lock.filter(|l| l.owner == owner) else {
        return Reply::Int(key.not_held(owner, live));
    };
    if live && (lock.holds.is_some() || !hold.is_empty()) {
        return Reply::Error("FALLBACK re-entered lock".into());
    }
    if lock.holds.is_some() {
        return Reply::Error("FALLBACK leftover holds of a re-entered lock".into());
    }
    let code = if live { 1 } else { 0 };
    let waiters = lock.waiters;
    if code == 1 && waiters == Some(b"q") {
        return Reply::Error("FALLBACK queue".into());
    }
    if code == 1 && waiters.is_some() && announce == b"s" && !Key::can_spublish() {
        return Reply::Error("FALLBACK SPUBLISH not available".into());
    }
    key.set_until(state::format(
        &mut Buf::new(),
        b"0",
        lock.fence_raw,
        b"",
        None,
        None,
    ));
    if code == 1 && waiters.is_some() && !announce.is_empty() {
        key.announce(announce == b"s");
    }
    Reply::Int(code)
}
