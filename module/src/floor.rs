//! The slot's floor (issue 24): where the fence of a released lock goes when its key is deleted.
//!
//! A release that frees a lock with nothing else in its key (no waiters, holds, queue or forced
//! mark), in a clock mode (an expiry grace given) and with its fence not ahead of the server's
//! clock term, deletes the lock key instead of keeping "`0 <fence> `" until the key expires,
//! and raises one string key per hash slot, `<prefix>{<tag>}:floor` (`<tag>` the smallest
//! decimal number whose CRC16 lands in the slot, as the client's `tag_for_slot`), to the fence
//! when that is higher, its expiry to the lock key's when that is later. A grant of a lock
//! without a key takes that floor as the lock's last fence. So a released name takes no memory,
//! and a master keeps one small key per slot it served releases in, where it kept one per name
//! released in the last lease + grace (docs/design.md, "Key lifetime and memory").
//!
//! Why a script-made grant that does not read the floor (a client with the module off, or an
//! older one) still gets a higher fence: the key is only deleted when the fence is not above
//! the clock term of the release (server µs, plus the config epoch × 2^34 on a cluster), and
//! every clock-mode grant is above its own clock term, which does not fall on one node unless
//! the clock steps back; the floor key, kept as long as the lock key would have been, covers
//! a step back for the grants the module makes, as the key did before.

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::OnceLock;

use redis_module::raw::RedisModuleString;

use crate::server::{self, Key, Kind, Owned};

/// Whether releases delete freed locks' keys (the module's load argument `release-deletes`).
static RELEASE_DELETES: AtomicBool = AtomicBool::new(false);

/// Sets whether releases delete freed locks' keys (at load).
pub fn set_release_deletes(on: bool) {
    RELEASE_DELETES.store(on, Ordering::Relaxed);
}

/// True when releases delete freed locks' keys; grants read the floor either way (a floor
/// written while it was on, or by a master that has it on, still counts).
pub fn release_deletes() -> bool {
    RELEASE_DELETES.load(Ordering::Relaxed)
}

/// Hash slots in a cluster.
const SLOTS: usize = 16384;

/// CRC16-XMODEM's table (polynomial 0x1021), built at compile time.
const CRC_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// CRC16-XMODEM (polynomial 0x1021, initial 0), the one Redis Cluster hashes keys with.
pub fn crc16(data: &[u8]) -> u16 {
    data.iter().fold(0u16, |crc, &byte| {
        (crc << 8) ^ CRC_TABLE[usize::from((crc >> 8) as u8 ^ byte)]
    })
}

/// The hash slot of `key`: of its hash tag (the bytes between the first `{` and the next `}`,
/// when not empty), else of the whole key.
pub fn slot_of(key: &[u8]) -> u16 {
    let hashed = tag_of(key).unwrap_or(key);
    crc16(hashed) % SLOTS as u16
}

/// The hash tag of `key`, if it has one.
fn tag_of(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// Per slot, the smallest decimal number whose CRC16 lands there.
fn tags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); SLOTS];
        let mut missing = SLOTS;
        let mut n: u64 = 0;
        while missing > 0 {
            let candidate = n.to_string();
            let slot = usize::from(slot_of(candidate.as_bytes()));
            if tags[slot].is_empty() {
                tags[slot] = candidate;
                missing -= 1;
            }
            n += 1;
        }
        tags
    })
}

/// Computes the slots' tags (at load: the first release must not pay for it).
pub fn init() {
    tags();
}

/// The floor key of `lock_key`'s slot: `<what precedes the key's first {>{<tag>}:floor`; `None`
/// for a key without a hash tag (the client always gives one).
pub fn key_for(lock_key: &[u8]) -> Option<Vec<u8>> {
    tag_of(lock_key)?;
    let open = lock_key.iter().position(|&b| b == b'{')?;
    let tag = tags().get(usize::from(slot_of(lock_key)))?;
    let mut name = Vec::with_capacity(open + tag.len() + 8);
    name.extend_from_slice(&lock_key[..open]);
    name.push(b'{');
    name.extend_from_slice(tag.as_bytes());
    name.extend_from_slice(b"}:floor");
    Some(name)
}

/// Per slot, the server string of the last floor key named there (kept for the module's life,
/// never freed: one per slot at most): a release or a grant of a lock without a key neither
/// formats nor allocates the name again while its prefix stays the same.
static NAMES: [AtomicPtr<RedisModuleString>; SLOTS] =
    [const { AtomicPtr::new(ptr::null_mut()) }; SLOTS];

/// The floor key's name for `lock_key` as a server string: the cached one when it has the
/// same prefix, else made (and cached); `None` for a key without a hash tag.
fn name_for(lock_key: &[u8]) -> Option<*mut RedisModuleString> {
    let open = lock_key.iter().position(|&b| b == b'{')?;
    tag_of(lock_key)?;
    let slot = usize::from(slot_of(lock_key));
    let tag = tags().get(slot)?;
    let cached = NAMES[slot].load(Ordering::Relaxed);
    if !cached.is_null() {
        let name = server::bytes(cached);
        if name.len() == open + tag.len() + 8 && name[..open] == lock_key[..open] {
            return Some(cached);
        }
    }
    let made = Owned::retained(&key_for(lock_key)?);
    if made.is_null() {
        return None;
    }
    let old = NAMES[slot].swap(made, Ordering::Relaxed);
    if !old.is_null() {
        Owned::free_retained(old);
    }
    Some(made)
}

/// The floor of `lock_key`'s slot: the highest fence of a lock whose key a release deleted
/// (0 for none, and for a floor key that does not hold a number).
pub fn read(ctx: *mut redis_module::raw::RedisModuleCtx, lock_key: &[u8]) -> u64 {
    let Some(name) = name_for(lock_key) else {
        return 0;
    };
    let key = Key::open_read(ctx, name);
    match key.kind() {
        Kind::String => key
            .string_value()
            .and_then(crate::state::parse_u64)
            .unwrap_or(0),
        _ => 0,
    }
}

/// Raises the floor of `lock_key`'s slot to `fence` and its expiry to `expires_ms` (each only
/// when higher), replicated as `SET floor fence PXAT ms` or `PEXPIREAT floor ms`. False, with
/// nothing written, when the floor key holds something other than a number: the lock key must
/// then be kept.
pub fn raise(
    ctx: *mut redis_module::raw::RedisModuleCtx,
    lock_key: &[u8],
    fence: u64,
    expires_ms: i64,
) -> bool {
    let Some(name) = name_for(lock_key) else {
        return false;
    };
    let key = Key::open(ctx, name);
    let (stored, expiry) = match key.kind() {
        Kind::Empty => (None, -1),
        Kind::String => match key.string_value().and_then(crate::state::parse_u64) {
            Some(n) => (Some(n), key.expire_time()),
            None => return false,
        },
        _ => return false,
    };
    let at = expires_ms.max(expiry);
    match stored {
        Some(n) if n >= fence => {
            if expiry != -1 && expiry < at {
                key.expire_at(at);
            }
        }
        // A floor without an expiry (written by hand) keeps none.
        _ => {
            let mut digits = crate::state::Buf::new();
            digits.push_u64(fence.max(stored.unwrap_or(0)));
            key.set_string(
                digits.bytes(),
                if expiry == -1 && stored.is_some() {
                    -1
                } else {
                    at
                },
            );
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Redis' own examples (CLUSTER KEYSLOT).
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"bar"), 5061);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
    }

    #[test]
    fn floor_keys_share_their_locks_slot() {
        for key in [
            &b"fencelock:{orders:42}:lock"[..],
            b"fencelock:{t}:name:lock",
            b"{x}:lock",
            b"p:{0}:lock",
        ] {
            let floor = key_for(key).unwrap();
            assert_eq!(slot_of(&floor), slot_of(key));
            assert!(floor.ends_with(b"}:floor"));
            let open = key.iter().position(|&b| b == b'{').unwrap();
            assert_eq!(&floor[..open], &key[..open]);
        }
        assert_eq!(
            key_for(b"fencelock:{0}:lock").unwrap(),
            b"fencelock:{0}:floor"
        );
        assert_eq!(key_for(b"no-tag"), None);
        assert_eq!(key_for(b"empty{}tag"), None);
    }
}
