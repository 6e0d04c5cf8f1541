//! `fencelock.renew <key> <key> <owner> <ttl> [<key> <owner> <ttl> …] <grace>`: renew.lua, the
//! watchdog's batch, natively: its KEYS[1] (the routing key, the first triple's key) then its
//! ARGV (lock key, owner token and TTL in ms per lock, then the expiry grace), and its reply,
//! one code per triple: 1 extended, 0 expired (or not a lock of layout 2), -1 another owner's,
//! -2 (before -1 and 0) this owner's hold freed by a forced unlock. Each lease is set as
//! extend.lua sets it (never shortened while the lock has several holds), and the key's expiry
//! raised, never lowered and never added to a key without one (`PEXPIREAT … GT`), to the lease
//! end + grace; without a grace the expiry goes (`PERSIST`).
//!
//! Every lock key is in the key spec (first key 2, last key -2, step 3), so a cluster refuses a
//! call whose locks span slots (`CROSSSLOT`): the client sends it on a standalone server only
//! (the script reaches keys of several slots of one node through ARGV, which a key spec cannot
//! declare). As in the script, a key of another type fails the call with `WRONGTYPE` after the
//! locks before it were renewed. A state the module cannot read exactly as Lua does (a lease
//! end or fence of 2^53 or more) answers `-FALLBACK` before any write. Allowed at maxmemory.

use crate::rules;
use crate::server::{Key, Reply};
use crate::state::{self, Buf, State};

/// The most locks one call renews (the client's watchdog sends at most 200).
pub const MAX_LOCKS: usize = 256;

/// One parsed triple.
struct Triple<'a> {
    key: *mut redis_module::raw::RedisModuleString,
    owner: &'a [u8],
    ttl: u64,
}

/// Serves one call: `argv` are the command's argument strings after its name, `args` their
/// bytes.
pub fn run(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    argv: &[*mut redis_module::raw::RedisModuleString],
    args: &[&[u8]],
    now_us: u64,
) -> Reply {
    // The routing key, at least one triple, the grace.
    if args.len() < 5 || !(args.len() - 2).is_multiple_of(3) {
        return Reply::WrongArity;
    }
    if args[0] != args[1] {
        return Reply::Error(
            "ERR fencelock: the first argument (the routing key) must be the first lock key".into(),
        );
    }
    let grace = match rules::parse_grace(args[args.len() - 1]) {
        Ok(g) => g,
        Err(e) => return Reply::Error(e),
    };
    let mut triples = Vec::with_capacity((args.len() - 2) / 3);
    for (i, t) in args[1..args.len() - 1].chunks_exact(3).enumerate() {
        if let Err(e) = rules::check_owner(t[1]) {
            return Reply::Error(e);
        }
        let ttl = match rules::parse_num(t[2], "the TTL (ms)", 1 << 40) {
            Ok(ttl) => ttl,
            Err(e) => return Reply::Error(e),
        };
        triples.push(Triple {
            key: argv[1 + 3 * i],
            owner: t[1],
            ttl,
        });
    }
    let now_ms = now_us / 1000;
    // Everything the module would leave to the script is found before the first write.
    for t in &triples {
        let key = Key::open(ctx, t.key);
        if let Ok(Some(value)) = key.read_until_any() {
            let exact = State::parse(value.bytes()).is_some_and(|s| s.exact());
            if !exact && State::lua_matches(value.bytes()) {
                return Reply::Error(rules::PAST_2_53.into());
            }
        }
    }
    let mut codes = Vec::with_capacity(triples.len());
    for t in &triples {
        let key = Key::open(ctx, t.key);
        let value = match key.read_until_any() {
            Ok(value) => value,
            Err(reply) => return reply,
        };
        let lock = value.as_ref().and_then(|v| State::parse(v.bytes()));
        let live = lock.as_ref().is_some_and(|l| l.live(now_ms));
        let Some(lock) = lock.filter(|l| live && l.owner == t.owner) else {
            codes.push(key.not_held(t.owner, live));
            continue;
        };
        let mut ends = now_ms + t.ttl;
        let reentered = lock
            .holds
            .is_some_and(|holds| state::parse_u64(holds).is_none_or(|n| n > 1));
        if reentered && lock.lease > ends {
            ends = lock.lease;
        }
        let mut value = Buf::new();
        value
            .push_u64(ends)
            .push(b" ")
            .push(lock.fence_raw)
            .push(b" ")
            .push(lock.owner)
            .push(lock.marks);
        key.set_until(value.bytes());
        match grace {
            Some(g) => key.raise_expiry(ends + g, true),
            None => key.persist(),
        }
        codes.push(1);
    }
    Reply::Ints(codes)
}
