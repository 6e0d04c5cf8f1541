//! `fencelock.extend <key> <owner> <ttl> <grace>`: extend.lua's KEYS, ARGV and replies (see its
//! header), served natively on key layout 2: the owner's lease moved to now + TTL (for a
//! re-entered lock never earlier than it ends already), the key-expiry rule of a call that did
//! not grant (keep.lua's `keep`), and the other owner's, the expired and the forcibly freed
//! lock answered as the script does. A key of layout 1 answers `-FALLBACK` before any write
//! (the script converts it), and so does a state with a lease end or fence past 2^53 - 1
//! (`State::exact`: a re-entered lock's lease kept past 2^63 made the key's expiry negative).
//! Allowed at maxmemory, as the script: it rewrites one existing field.

use crate::rules;
use crate::server::{Key, Reply};
use crate::state;

/// Serves one call; `args` are the command's arguments after its name (key first).
pub fn run(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    key_name: *mut redis_module::raw::RedisModuleString,
    args: &[&[u8]],
    now_us: u64,
) -> Reply {
    if args.len() != 4 {
        return Reply::WrongArity;
    }
    let owner = args[1];
    let parsed = (|| -> Result<_, String> {
        rules::check_owner(owner)?;
        let ttl = rules::parse_num(args[2], "the TTL (ms)", 1 << 40)?;
        let grace = rules::parse_grace(args[3])?;
        Ok((ttl, grace))
    })();
    let (ttl, grace) = match parsed {
        Ok(p) => p,
        Err(e) => return Reply::Error(e),
    };
    let now_ms = now_us / 1000;
    let key = Key::open(ctx, key_name);
    let mut value = None;
    let lock = match key.read_state(&mut value) {
        Ok(lock) => lock,
        Err(reply) => return reply,
    };
    let live = lock.as_ref().is_some_and(|l| l.live(now_ms));
    let Some(lock) = lock.filter(|l| live && l.owner == owner) else {
        return Reply::Ints(vec![key.not_held(owner, live), 0]);
    };
    let mut ends = now_ms + ttl;
    // `(lock[4] or 1) + 0 > 1`: digits past u64 are a number above 1 too.
    let reentered = lock
        .holds
        .is_some_and(|holds| state::parse_u64(holds).is_none_or(|n| n > 1));
    if reentered && lock.lease > ends {
        ends = lock.lease;
    }
    key.set_until(lock.with_lease(ends).bytes());
    key.apply(rules::keep_expiry(None, lock.fence, ends, grace));
    Reply::Ints(vec![1, (ends - now_ms) as i64])
}
