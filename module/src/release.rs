//! `fencelock.release <key> <owner> <hold id> <announce> <grace>`: release.lua's KEYS, ARGV and
//! replies (see its header), served natively on key layout 2 for a lock without a queue: one
//! hold of a re-entered lock ended (its `h:<id>` field and the count; a hold released twice, or
//! never added, answers 1 and changes nothing), the last hold freed (the fence kept, a
//! re-entered lock's `h:` fields removed) and, when an acquire found the lock busy meanwhile,
//! the announcement (PUBLISH or SPUBLISH on the key's channel), or, for a lock with a queue
//! (`waiters` `q`), the grant to the queue's head announced on its client's channel (queue.rs,
//! the handoff of issue 25); another owner's or an expired lock answered as the script does. A
//! key of layout 1, and a queue whose fields the scripts would read otherwise, answer
//! `-FALLBACK <reason>` before any write. One difference from the script: loaded with
//! `release-deletes yes` on a standalone server, the module deletes a freed lock's key and keeps
//! its fence in the floor (floor.rs, `delete_freed`) where the script keeps the key.
//! Allowed at maxmemory: it writes no more than it frees.

use crate::floor;
use crate::queue;
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
    let Arguments {
        owner,
        hold,
        announce,
        grace,
    } = match arguments(args) {
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
    // One hold of a re-entered lock (or a hold id given): `(lock[4] or 1) - 1` holds are left
    // once its field goes. Everything is decided before the first write.
    let mut hold_field = Buf::new();
    let mut left = 0;
    let one_of_several = live && (lock.holds.is_some() || !hold.is_empty());
    if one_of_several {
        hold_field.push(b"h:").push(hold);
        if !key.hexists_bytes(hold_field.bytes()) {
            return Reply::Int(1);
        }
        left = match lock.holds.map(state::parse_count) {
            None => 0,
            Some(Some(n)) => n.saturating_sub(1),
            Some(None) => return Reply::Error("FALLBACK a hold count past 10^14".into()),
        };
    }
    let code = if live { 1 } else { 0 };
    let waiters = lock.waiters;
    let queued = waiters == Some(b"q");
    if left == 0
        && (code == 1 || queued)
        && waiters.is_some()
        && announce == b"s"
        && !Key::can_spublish()
    {
        return Reply::Error("FALLBACK SPUBLISH not available".into());
    }
    // A queue: its head is found and its grant decided before the first write. A hold whose
    // lease ended (code 0) hands on too: its release must not drop the queue's mark.
    let handoff = if left == 0 && queued {
        match queue::plan_handoff(&key, ctx, lock.fence, now_ms, now_us) {
            Ok(handoff) => Some(handoff),
            Err(reply) => return reply,
        }
    } else {
        None
    };
    if one_of_several {
        key.hdel(hold_field.bytes());
        if left > 0 {
            let mut holds = Buf::new();
            holds.push_u64(left);
            key.set_until(state::format(
                &mut Buf::new(),
                lock.lease_raw,
                lock.fence_raw,
                lock.owner,
                Some(holds.bytes()),
                waiters,
            ));
            return Reply::Int(1);
        }
    }
    if code == 1
        && waiters.is_none()
        && lock.holds.is_none()
        && delete_freed(ctx, &key, lock.fence, grace, now_us)
    {
        return Reply::Int(1);
    }
    if lock.holds.is_some() {
        key.clear_holds();
    }
    key.set_until(state::format(
        &mut Buf::new(),
        b"0",
        lock.fence_raw,
        b"",
        None,
        None,
    ));
    if let Some(handoff) = handoff {
        if handoff.apply(&key, lock.fence_raw, announce, grace) || code == 0 {
            return Reply::Int(code);
        }
    }
    if code == 1 && waiters.is_some() && !announce.is_empty() {
        key.announce(announce == b"s");
    }
    Reply::Int(code)
}

/// Deletes the key of a lock this release frees, its fence kept in the floor (floor.rs), when
/// the module was loaded with `release-deletes yes` on a standalone server, nothing else is in
/// the key (only `until`), a grace was given (taken for a clock mode: fencelock's clients pass
/// none in counter and epoch modes, whose keys are kept for good; a caller that passes one in
/// those modes gets its keys deleted too), the key has an expiry and the fence is not ahead of
/// the server's clock; false, nothing written, otherwise.
fn delete_freed(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    key: &Key,
    fence: u64,
    grace: Option<u64>,
    now_us: u64,
) -> bool {
    if grace.is_none() || fence > now_us || !floor::release_deletes() || key.len() != 1 {
        return false;
    }
    let expires = key.expire_time();
    if expires == -1 || !floor::raise(ctx, key.name_bytes(), fence, expires, now_us) {
        return false;
    }
    key.delete();
    true
}

/// A release's arguments after its key (release.lua's and fair_release.lua's ARGV).
pub struct Arguments<'a> {
    /// The owner token.
    pub owner: &'a [u8],
    /// The hold id (empty for the hold the acquire granted).
    pub hold: &'a [u8],
    /// `s` SPUBLISH, `p` PUBLISH, empty for none.
    pub announce: &'a [u8],
    /// The expiry grace in ms, `None` for none.
    pub grace: Option<u64>,
}

/// Checks a release's arguments: `Err` with the reply for a wrong count or a bad value.
pub fn arguments<'a>(args: &[&'a [u8]]) -> Result<Arguments<'a>, Reply> {
    if args.len() != 5 {
        return Err(Reply::WrongArity);
    }
    let (owner, hold, announce) = (args[1], args[2], args[3]);
    let grace = rules::check_owner(owner)
        .and_then(|()| rules::parse_grace(args[4]))
        .map_err(Reply::Error)?;
    if !matches!(announce, b"" | b"s" | b"p") {
        return Err(Reply::Error(
            "ERR fencelock: announce must be s, p or empty".into(),
        ));
    }
    Ok(Arguments {
        owner,
        hold,
        announce,
        grace,
    })
}
