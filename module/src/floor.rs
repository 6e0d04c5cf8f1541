//! The floor (issue 24, load argument `release-deletes yes`, standalone servers only): where the
//! fence of a released lock goes when its key is deleted.
//!
//! A release that frees a lock with nothing else in its key (no waiters, holds, queue or forced
//! mark), in a clock mode (an expiry grace given), whose fence is not ahead of the server's
//! clock, deletes the lock key instead of keeping "`0 <fence> `" until the key expires, and
//! makes one string key per key prefix, `<prefix>:{floor}:floor` (the lock key's text before
//! its first `{`, then `{floor}:floor`), cover it: a value at least the fence, an expiry at
//! least the lock key's (`raise`). A grant of a lock without a key on a standalone server takes
//! that floor as the lock's last fence. So a released name takes no memory.
//!
//! The scripts a client sends a standalone server that may load the module (`acquire_floor`,
//! `handoff_floor`, `lock_all_floor`: `src/script/lua/floor_read.lua`) read the floor as a grant
//! here does.
//! Why a script-made grant that does not read the floor (a client with the module off, or an
//! older one) still gets a higher fence: the key is only deleted when the fence is not above
//! the server's clock at the release, and every clock-mode grant is above its own clock, which
//! does not fall unless the clock steps back; the floor key, kept as long as the lock key would
//! have been, covers a step back for the grants the module and those scripts make, as the key
//! did before.
//!
//! Not in cluster mode: the floor key is not among a command's declared keys, so during a slot
//! migration a lock the source no longer has is served by the target (`ASK`), which would write
//! and read a floor of its own, and `MIGRATE` would then meet the key on both nodes (`BUSYKEY`).
//! A node in cluster mode refuses the load argument and never deletes.

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use redis_module::raw::{RedisModuleCtx, RedisModuleString};

use crate::server::{self, Key, Kind, Owned};
use crate::state::Buf;

/// Whether releases delete freed locks' keys (the module's load argument `release-deletes`).
static RELEASE_DELETES: AtomicBool = AtomicBool::new(false);

/// Sets whether releases delete freed locks' keys (at load).
pub fn set_release_deletes(on: bool) {
    RELEASE_DELETES.store(on, Ordering::Relaxed);
}

/// True when releases delete freed locks' keys (never in cluster mode: the load refuses the
/// argument there, and cluster mode cannot change at run time); a grant on a standalone server
/// reads the floor either way (a floor written while it was on, or by the master this server
/// replicated, still counts).
pub fn release_deletes() -> bool {
    RELEASE_DELETES.load(Ordering::Relaxed)
}

/// What follows the prefix in a floor key's name.
const SUFFIX: &[u8] = b"{floor}:floor";

/// The floor key of `lock_key`: its text before the first `{`, then `{floor}:floor`; `None` for
/// a key without a `{` (the client's keys all have one).
pub fn key_for(lock_key: &[u8]) -> Option<Vec<u8>> {
    let open = lock_key.iter().position(|&b| b == b'{')?;
    let mut name = Vec::with_capacity(open + SUFFIX.len());
    name.extend_from_slice(&lock_key[..open]);
    name.extend_from_slice(SUFFIX);
    Some(name)
}

/// The server string of the last floor key named (kept for the module's life, replaced when a
/// key of another prefix comes): a release or a grant neither formats nor allocates the name
/// again while the prefix stays the same.
static NAME: AtomicPtr<RedisModuleString> = AtomicPtr::new(ptr::null_mut());

/// The floor key's name for `lock_key` as a server string (see `NAME`).
fn name_for(lock_key: &[u8]) -> Option<*mut RedisModuleString> {
    let open = lock_key.iter().position(|&b| b == b'{')?;
    let cached = NAME.load(Ordering::Relaxed);
    if !cached.is_null() {
        let name = server::bytes(cached);
        if name.len() == open + SUFFIX.len() && name[..open] == lock_key[..open] {
            return Some(cached);
        }
    }
    let made = Owned::retained(&key_for(lock_key)?);
    if made.is_null() {
        return None;
    }
    let old = NAME.swap(made, Ordering::Relaxed);
    if !old.is_null() {
        Owned::free_retained(old);
    }
    Some(made)
}

/// The floor for `lock_key` on a standalone server: the highest fence of a lock whose key a
/// release deleted (0 for none, in cluster mode, and for a floor key that does not hold a
/// number).
pub fn read(ctx: *mut RedisModuleCtx, lock_key: &[u8]) -> u64 {
    if Key::in_cluster(ctx) {
        return 0;
    }
    let Some(name) = name_for(lock_key) else {
        return 0;
    };
    let key = Key::open_read(ctx, name);
    match key.kind() {
        Kind::String => key.string_u64().unwrap_or(0),
        _ => 0,
    }
}

/// The most a raise moves the floor's expiry past the deleted key's (see `raise`), in ms.
const MAX_LEAD_MS: u64 = 1000;

/// Makes the floor of `lock_key` cover a deleted lock: its value at least `fence`, its expiry
/// at least `expires_ms` (the lock key's). Nothing is written when it already does: so, under a
/// stream of releases, most of them delete their key and leave the floor as it is. When it does
/// not, the floor is set to the server's clock (`now_us`, not below `fence`: the caller deletes
/// no fence ahead of the clock) and its expiry to the key's moved on by the time since the
/// grant (`now_us` less `fence`, at most `MAX_LEAD_MS`), so it also covers the locks granted
/// until now with leases no longer than this one's; replicated as `SET floor value PXAT ms`.
/// A grant of a lock without a key takes `max(floor + 1, clock)`, which the clock term decides
/// while the clock does not step back. False, with nothing written, when the floor key holds
/// something other than a number: the lock key must then be kept.
pub fn raise(
    ctx: *mut RedisModuleCtx,
    lock_key: &[u8],
    fence: u64,
    expires_ms: i64,
    now_us: u64,
) -> bool {
    let Some(name) = name_for(lock_key) else {
        return false;
    };
    let key = Key::open(ctx, name);
    let (stored, expiry) = match key.kind() {
        Kind::Empty => (None, -1),
        Kind::String => match key.string_u64() {
            Some(n) => (Some(n), key.expire_time()),
            None => return false,
        },
        _ => return false,
    };
    // A floor without an expiry (written by hand) keeps none.
    let lasting = stored.is_some() && expiry == -1;
    if stored.is_some_and(|n| n >= fence) && (lasting || expiry >= expires_ms) {
        return true;
    }
    let lead = (now_us / 1000)
        .saturating_sub(fence / 1000)
        .min(MAX_LEAD_MS) as i64;
    let at = if lasting {
        -1
    } else {
        expires_ms.saturating_add(lead).max(expiry)
    };
    let mut digits = Buf::new();
    digits.push_u64(stored.unwrap_or(0).max(now_us).max(fence));
    key.set_string(digits.bytes(), at);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_keys_keep_their_locks_prefix() {
        assert_eq!(
            key_for(b"fencelock:{orders:42}:lock").unwrap(),
            b"fencelock:{floor}:floor"
        );
        assert_eq!(key_for(b"app:{t}:name:lock").unwrap(), b"app:{floor}:floor");
        assert_eq!(key_for(b"{x}:lock").unwrap(), b"{floor}:floor");
        assert_eq!(key_for(b"no-tag"), None);
    }
}
