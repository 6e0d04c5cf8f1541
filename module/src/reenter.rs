//! `fencelock.reenter <key> <owner> <hold id> <ttl> <grace>`: reenter.lua's KEYS, ARGV and
//! replies (see its header), served natively on key layout 2: a hold added to a lock this owner
//! holds (the first re-entry writes `h:` and `h:<id>`, a later one `h:<id>` unless a resend
//! already did, the count in the state's ` h<holds>`), the lease moved to now + TTL unless it
//! ends later, keep.lua's key-expiry rule, and `{1, fence, lease left}`; the other owner's, the
//! expired and the forcibly freed lock answered as the script does. A key of layout 1 answers
//! `-FALLBACK` before any write (the script converts it), and so does a state with a lease end
//! or fence past 2^53 - 1 (`State::exact`: a lease kept past 2^63 made the key's expiry and
//! the reply negative). Refused at maxmemory, as the script (it adds fields).

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
    let (owner, hold) = (args[1], args[2]);
    let parsed = (|| -> Result<_, String> {
        rules::check_owner(owner)?;
        if hold.is_empty() || !hold.iter().all(u8::is_ascii_hexdigit) {
            return Err("ERR fencelock: the hold id must be hexadecimal digits".into());
        }
        let ttl = rules::parse_num(args[3], "the TTL (ms)", 1 << 40)?;
        let grace = rules::parse_grace(args[4])?;
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
        return Reply::Ints(vec![key.not_held(owner, live), 0, 0]);
    };
    let mut field = Buf::new();
    field.push(b"h:").push(hold);
    let mut holds_buf = Buf::new();
    let mut changed = false;
    let holds: Option<&[u8]> = match lock.holds {
        None => {
            key.hset(b"h:", b"1");
            key.hset(field.bytes(), b"1");
            changed = true;
            Some(b"2")
        }
        Some(h) if !key.hexists_bytes(field.bytes()) => {
            // `lock[4] + 1`, written by Lua as its digits below 10^14.
            let Some(n) = state::parse_count(h)
                .map(|n| n + 1)
                .filter(|&n| n < state::MAX_COUNT)
            else {
                return Reply::Error("FALLBACK a hold count past 10^14".into());
            };
            key.hset(field.bytes(), b"1");
            changed = true;
            holds_buf.push_u64(n);
            Some(holds_buf.bytes())
        }
        Some(h) => Some(h),
    };
    let mut ends = now_ms + ttl;
    let mut lease = Buf::new();
    if ends > lock.lease {
        lease.push_u64(ends);
        changed = true;
    } else {
        ends = lock.lease;
        lease.push(lock.lease_raw);
    }
    if changed {
        key.set_until(state::format(
            &mut Buf::new(),
            lease.bytes(),
            lock.fence_raw,
            lock.owner,
            holds,
            lock.waiters,
        ));
    }
    key.apply(rules::keep_expiry(None, lock.fence, ends, grace));
    Reply::Ints(vec![1, lock.fence as i64, (ends - now_ms) as i64])
}
