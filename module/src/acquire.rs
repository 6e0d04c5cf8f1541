//! `fencelock.acquire <key> <owner> <ttl> <floor> <mode> [<place>] <grace>`: acquire.lua's
//! KEYS, ARGV and replies (see its header), served natively on key layout 2 for the paths a lock
//! without a queue takes: a grant of a free or expired lock (the fence rule in every mode, the
//! config epoch of modes `epoch` and `hybrid` from the cache in epoch.rs; the key-expiry rule),
//! the resend of a live holder (lease moved forward), busy (setting the waiters mark as the
//! script does), busy for a caller with a place lease, which keeps its place in the lock's
//! queue (queue.rs, `hold_place`), and a free lock with a queue (`waiters` `q`), granted to its
//! head or, with no live place, to the caller (queue.rs, `acquire_free`). The rest answers
//! `-FALLBACK <reason>` before any write, for the client to send through the script: a
//! re-entered lock's leftover holds, a queue whose fields the scripts would read otherwise and
//! a key of layout 1. One difference from `acquire.lua`: on a standalone server a grant in a
//! clock mode of a lock without a state takes the floor (floor.rs) as its last fence, where that
//! script takes 0 (`acquire_floor`, the same script with `floor_read.lua`, reads it as here).

use crate::epoch;
use crate::floor;
use crate::queue;
use crate::rules::{self, Expiry};
use crate::server::{Key, Reply};
use crate::state::{self, Buf, State};

/// Serves one call; `args` are the command's arguments after its name (key first).
pub fn run(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    key_name: *mut redis_module::raw::RedisModuleString,
    args: &[&[u8]],
    now_us: u64,
) -> Reply {
    if args.len() != 6 && args.len() != 7 {
        return Reply::WrongArity;
    }
    let owner = args[1];
    let grace_arg = args[args.len() - 1];
    let parsed = (|| -> Result<_, String> {
        rules::check_owner(owner)?;
        let ttl = rules::parse_num(args[2], "the TTL (ms)", 1 << 40)?;
        if ttl == 0 {
            return Err("ERR fencelock: the TTL (ms) must be at least 1".into());
        }
        let floor = rules::parse_num(args[3], "the floor", state::MAX_FENCE)?;
        let mode = rules::parse_mode(args[4])?;
        let place = if args.len() == 7 {
            rules::parse_num(args[5], "the place lease (ms)", 1 << 40)?
        } else {
            0
        };
        let grace = rules::parse_grace(grace_arg)?;
        Ok((ttl, floor, mode, place, grace))
    })();
    let (ttl, floor, mode, place, grace) = match parsed {
        Ok(p) => p,
        Err(e) => return Reply::Error(e),
    };
    let now_ms = now_us / 1000;
    let key = Key::open(ctx, key_name);
    let mut value = None;
    let (lock, missing) = match key.read_state(&mut value) {
        Ok(Some(lock)) => (lock, false),
        Ok(None) => (State::free(), true),
        Err(reply) => return reply,
    };
    let live = lock.live(now_ms);
    let queued = lock.waiters == Some(b"q");
    if live && lock.owner == owner {
        move_lease(&key, &lock, now_ms + ttl, grace);
        return Reply::Ints(vec![2, lock.fence as i64, 0]);
    }
    if live && place > 0 {
        return queue::hold_place(&key, &lock, args, now_ms, place, grace);
    }
    if !live && queued {
        let fence_of = |stored| fence_for(ctx, key.name_bytes(), stored, floor, mode, now_us);
        return queue::acquire_free(&key, &lock, args, now_ms, place, ttl, grace, fence_of);
    }
    let tag = &owner[..owner.len().min(8)];
    if live {
        let mark: Option<&[u8]> = match lock.waiters {
            None => Some(tag),
            Some(w)
                if w != b"*"
                    && w != b"q"
                    && w != tag
                    && !(w.first() == Some(&b'y') && &w[1..] == tag) =>
            {
                Some(b"*")
            }
            Some(_) => None,
        };
        if let Some(mark) = mark {
            key.set_until(lock.with_waiters(Some(mark)).bytes());
        }
        return Reply::Ints(vec![0, (lock.lease - now_ms) as i64, 0]);
    }
    let mut waiters = lock.waiters;
    if let Some(w) = waiters {
        if w.first() == Some(&b'y') && &w[1..] == tag {
            if lock.lease > now_ms {
                return Reply::Ints(vec![0, (lock.lease - now_ms) as i64, 0]);
            }
            waiters = None;
        }
    }
    // A lock without a state in a clock mode (a grace given): its last fence, if a release
    // deleted the key, is in the floor.
    let stored = if missing && grace.is_some() {
        floor::read(ctx, key.name_bytes())
    } else {
        lock.fence
    };
    let rules::Fence {
        fence,
        behind,
        shift,
    } = match fence_for(ctx, key.name_bytes(), stored, floor, mode, now_us) {
        Ok(f) => f,
        Err(reply) => return reply,
    };
    if lock.holds.is_some() {
        return Reply::Error("FALLBACK leftover holds of a re-entered lock".into());
    }
    if place > 0 && lock.waiters.is_some() {
        // acquire.lua: a place kept from an earlier attempt goes with the grant.
        key.hdel_fields(&[queue::field(b"q:", owner), queue::field(b"g:", owner)]);
    }
    let ends = now_ms + ttl;
    let mut value = Buf::new();
    value
        .push_u64(ends)
        .push(b" ")
        .push_u64(fence)
        .push(b" ")
        .push(owner);
    if let Some(w) = waiters {
        value.push(b" w").push(w);
    }
    key.set_until(value.bytes());
    key.apply(rules::grant_expiry(shift, fence, ends, grace));
    if behind == 0 {
        Reply::Int(fence as i64)
    } else {
        Reply::Ints(vec![1, fence as i64, behind as i64])
    }
}

/// The fence rule for a grant above `stored`, with the config epoch read where the scripts read
/// it (in the fence rule, on a grant only: modes `epoch` and `hybrid`); the scripts' error reply
/// when the epoch cannot be read or the fence would pass 2^53 - 1.
pub fn fence_for(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    key: &[u8],
    stored: u64,
    floor: u64,
    mode: rules::Mode,
    now_us: u64,
) -> Result<rules::Fence, Reply> {
    let epoch = if mode.reads_epoch() {
        let epoch =
            epoch::my_epoch(ctx).ok_or_else(|| Reply::Error(rules::EPOCH_UNREADABLE.into()))?;
        if stored == 0 {
            match epoch::check_slot(ctx, key) {
                epoch::SlotCheck::Stable => {}
                epoch::SlotCheck::Migrating => return Err(Reply::Error(rules::migrating(key))),
                epoch::SlotCheck::Refused(error) => return Err(Reply::Error(error.into())),
            }
        }
        epoch
    } else {
        0
    };
    rules::next_fence(stored, floor, mode, now_us, epoch).map_err(Reply::Error)
}

/// The holder's resend: its lease moves to `ends` when that is later, and the key's expiry is
/// raised to cover it (raise.lua, without a fence term: the call ran no fence rule).
pub fn move_lease(key: &Key, lock: &State, ends: u64, grace: Option<u64>) {
    if ends <= lock.lease {
        return;
    }
    key.set_until(lock.with_lease(ends).bytes());
    key.apply(match grace {
        None => Expiry::Persist,
        Some(g) => Expiry::RaiseTo(ends + g),
    });
}
