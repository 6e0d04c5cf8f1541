//! The fair lock's hot path (issue 25): `fencelock.fair_acquire <key> <owner> <ttl> <floor>
//! <mode> <place> <max places> <grace>` and `fencelock.fair_release <key> <owner> <hold id>
//! <announce> <grace>`, fair_acquire.lua's and fair_release.lua's KEYS, ARGV and replies (see
//! their headers), on the mutex's queue (queue.rs): a free lock without a queue granted at
//! once, the holder's resend, the head's grant of a free lock, a busy caller's place and the
//! places ahead of it, and the release's handoff to the head. Both paths serve one fair lock
//! together. A key of layout 1, and a queue whose fields the scripts would read otherwise,
//! answer `-FALLBACK <reason>` before any write.

use crate::acquire;
use crate::queue::{self, Walk};
use crate::release;
use crate::rules;
use crate::server::{Key, Reply};
use crate::state::{self, Buf, State};

/// Serves `fencelock.fair_acquire`; `args` are its arguments after its name (key first).
pub fn acquire(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    key_name: *mut redis_module::raw::RedisModuleString,
    args: &[&[u8]],
    now_us: u64,
) -> Reply {
    if args.len() != 8 {
        return Reply::WrongArity;
    }
    let me = args[1];
    let parsed = (|| -> Result<_, String> {
        rules::check_owner(me)?;
        let ttl = rules::parse_num(args[2], "the TTL (ms)", 1 << 40)?;
        if ttl == 0 {
            return Err("ERR fencelock: the TTL (ms) must be at least 1".into());
        }
        let floor = rules::parse_num(args[3], "the floor", state::MAX_FENCE)?;
        let mode = rules::parse_mode(args[4])?;
        let place = rules::parse_num(args[5], "the place lease (ms)", 1 << 40)?;
        let max = rules::parse_num(args[6], "the most places", 1 << 40)?;
        let grace = rules::parse_grace(args[7])?;
        Ok((ttl, floor, mode, place, max, grace))
    })();
    let (ttl, floor, mode, place, max, grace) = match parsed {
        Ok(p) => p,
        Err(e) => return Reply::Error(e),
    };
    let now_ms = now_us / 1000;
    let key = Key::open(ctx, key_name);
    let mut value = None;
    let lock = match key.read_state(&mut value) {
        Ok(lock) => lock.unwrap_or_else(State::free),
        Err(reply) => return reply,
    };
    let live = lock.live(now_ms);
    let fence_of = |stored| acquire::fence_for(ctx, key.name_bytes(), stored, floor, mode, now_us);
    if !live && lock.waiters != Some(b"q") {
        // No place queued: granted at once, the state without marks (fair_acquire.lua).
        let f = match fence_of(lock.fence) {
            Ok(f) => f,
            Err(reply) => return reply,
        };
        let ends = now_ms + ttl;
        let mut v = Buf::new();
        v.push_u64(ends)
            .push(b" ")
            .push_u64(f.fence)
            .push(b" ")
            .push(me);
        key.set_until(v.bytes());
        key.apply(rules::grant_expiry(f.shift, f.fence, ends, grace));
        return if f.behind == 0 {
            Reply::Int(f.fence as i64)
        } else {
            Reply::Ints(vec![1, f.fence as i64, f.behind as i64, 0])
        };
    }
    if live && lock.owner == me {
        acquire::move_lease(&key, &lock, now_ms + ttl, grace);
        return Reply::Ints(vec![2, lock.fence as i64, 0, 0]);
    }
    // Everything the walk and the busy path read, before the walk's writes; a held lock's
    // queue is walked only when its index spans more than the entries the holder's release
    // walks (fair_acquire.lua).
    let walk = match if live {
        Walk::unwalked(&key).and_then(|walk| {
            if walk.spans_past_a_walk() {
                Walk::read(&key, now_ms)
            } else {
                Ok(walk)
            }
        })
    } else {
        Walk::read(&key, now_ms)
    } {
        Ok(walk) => walk,
        Err(reply) => return reply,
    };
    let head_is_me = walk.head.as_ref().is_some_and(|(who, _)| who == me);
    if !live && (head_is_me || (walk.head.is_none() && !walk.pending())) {
        let f = fence_of(lock.fence);
        walk.apply(&key);
        let f = match f {
            Ok(f) => f,
            Err(reply) => return reply,
        };
        queue::take(&key, &walk, me, f.fence, f.shift, now_ms + ttl, grace);
        return Reply::Ints(vec![1, f.fence as i64, f.behind as i64, 0]);
    }
    let place_field = queue::field(b"q:", me);
    let mine = if walk.deletes(&place_field) {
        None
    } else {
        match key.hget_field(&place_field) {
            // tonumber(string.match(mine, '^(%d+) ')): nil when it does not match.
            Some(v) => match queue::leading_seq(v.bytes()).map(queue::number) {
                Some(Ok(seq)) => Some(seq),
                Some(Err(reply)) => return reply,
                None => None,
            },
            None => None,
        }
    };
    let next = if mine.is_none() && place > 0 {
        match queue::next_seq(&key) {
            Ok(next) => Some(next),
            Err(reply) => return reply,
        }
    } else {
        None
    };
    walk.apply(&key);
    let first = walk.stop;
    let (mut wait, latest) = if live {
        ((lock.lease - now_ms) as i64, lock.lease)
    } else {
        (0, 0)
    };
    match &walk.head {
        Some((who, head_end))
            if who != me && (wait == 0 || ((head_end - now_ms) as i64) < wait) =>
        {
            wait = (head_end - now_ms) as i64;
        }
        None if !live => wait = 1,
        _ => {}
    }
    let count = || (key.len().saturating_sub(2) / 3) as i64;
    let ahead = |seq: u64| (seq as i64 - first as i64).max(0);
    if place == 0 {
        return match mine {
            Some(seq) => Reply::Ints(vec![0, wait, ahead(seq), 0]),
            None => Reply::Ints(vec![0, wait, count(), 0]),
        };
    }
    let (seq, new) = match (mine, next) {
        (Some(seq), _) => (seq, false),
        (None, Some(next)) => {
            let count = count();
            if count >= max as i64 {
                let poll = (place / 3).max(1) as i64;
                return Reply::Ints(vec![0, wait.min(poll), count, -1]);
            }
            (next, true)
        }
        (None, None) => return Reply::Error("FALLBACK an unreadable queue counter".into()),
    };
    let mut seq_digits = Buf::new();
    seq_digits.push_u64(seq);
    queue::keep_place(
        &key,
        &lock,
        me,
        seq_digits.bytes(),
        new,
        [args[2], args[5], args[3], args[4]],
        now_ms + place,
        latest,
        grace,
    );
    Reply::Ints(vec![0, wait, ahead(seq), i64::from(new)])
}

/// Serves `fencelock.fair_release`; `args` are its arguments after its name (key first).
pub fn release(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    key_name: *mut redis_module::raw::RedisModuleString,
    args: &[&[u8]],
    now_us: u64,
) -> Reply {
    let release::Arguments {
        owner,
        announce,
        grace,
        ..
    } = match release::arguments(args) {
        Ok(parsed) => parsed,
        Err(reply) => return reply,
    };
    let now_ms = now_us / 1000;
    let key = Key::open(ctx, key_name);
    let mut value = None;
    let lock = match key.read_state(&mut value) {
        Ok(lock) => lock,
        Err(reply) => return reply,
    };
    let live = lock.as_ref().is_some_and(|l| l.live(now_ms));
    let Some(lock) = lock.filter(|l| l.owner == owner) else {
        return Reply::Int(key.not_held(owner, live));
    };
    let code = i64::from(live);
    let freed = || state::format(&mut Buf::new(), b"0", lock.fence_raw, b"", None, None).to_vec();
    if lock.waiters != Some(b"q") {
        key.set_until(&freed());
        return Reply::Int(code);
    }
    if announce == b"s" && !Key::can_spublish() {
        return Reply::Error("FALLBACK SPUBLISH not available".into());
    }
    let handoff = match queue::plan_handoff(&key, ctx, lock.fence, now_ms, now_us) {
        Ok(handoff) => handoff,
        Err(reply) => return reply,
    };
    if lock.holds.is_some() {
        key.clear_holds();
    }
    key.set_until(&freed());
    handoff.apply(&key, lock.fence_raw, announce, grace);
    Reply::Int(code)
}
