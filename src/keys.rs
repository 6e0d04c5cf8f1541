//! Lock names, hash tags, slots and the Redis keys a lock uses.
//!
//! A lock's keys share one hash tag so that one script may touch all of them on one node.
//! Slots are computed here exactly as Redis does (CRC16/XMODEM of the hash tag, mod 16384).

use std::fmt;
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Number of hash slots in a Redis Cluster.
pub const SLOT_COUNT: u16 = 16384;

/// Longest lock name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 4096;

/// Returns the Redis Cluster hash slot of `key`, computed as Redis does.
///
/// When the key contains a `{` followed later by a `}` with at least one byte between them, only
/// those bytes are hashed (the hash tag); otherwise the whole key is.
///
/// # Examples
///
/// ```
/// assert_eq!(fencelock::slot_of(b"123456789"), 12739);
/// assert_eq!(fencelock::slot_of(b"lock:{order42}"), 11082);
/// assert_eq!(fencelock::slot_of(b"foo{}{bar}"), 8363);
/// ```
pub fn slot_of(key: &[u8]) -> u16 {
    let hashed = hash_tag(key).unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % SLOT_COUNT
}

/// The bytes between the first `{` and the next `}`, if that span is non-empty.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let rest = &key[open + 1..];
    let close = rest.iter().position(|&b| b == b'}')?;
    (close > 0).then(|| &rest[..close])
}

/// A hash tag that places keys in `slot`: the smallest decimal number whose CRC16 lands there.
///
/// Returns `None` when `slot` is not below [`SLOT_COUNT`].
///
/// # Examples
///
/// ```
/// let tag = fencelock::tag_for_slot(12739).unwrap();
/// assert_eq!(fencelock::slot_of(format!("x{{{tag}}}y").as_bytes()), 12739);
/// ```
pub fn tag_for_slot(slot: u16) -> Option<&'static str> {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); usize::from(SLOT_COUNT)];
        let mut missing = tags.len();
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
    });
    tags.get(usize::from(slot)).map(String::as_str)
}

/// Where a lock's keys live in the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// The lock name itself is the hash tag (the default).
    #[default]
    ByName,
    /// Pinned to a slot (0..16383): the tag is one that hashes there.
    Slot(u16),
    /// A caller-chosen hash tag; locks sharing a tag share a slot.
    Tag(String),
}

/// The Redis key of one lock and the slot it lives in.
///
/// # Examples
///
/// ```
/// use fencelock::{LockKeys, Placement};
///
/// let keys = LockKeys::new("fencelock", "orders:42", &Placement::ByName).unwrap();
/// assert_eq!(keys.lock_key(), "fencelock:{orders:42}:lock");
/// assert_eq!(keys.slot(), fencelock::slot_of(b"orders:42"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    name: String,
    lock: String,
    slot: u16,
}

impl LockKeys {
    /// Builds the keys for lock `name` under `prefix`.
    ///
    /// Braces and `%` in names and tags are percent-escaped (`{` → `%7B`, `}` → `%7D`,
    /// `%` → `%25`) so no name can move its keys out of the slot reported by [`slot`](Self::slot).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] for an empty name or one longer than [`MAX_NAME_LEN`] bytes;
    /// [`Error::InvalidOptions`] for a prefix containing `{` or `}`, an empty tag or a slot
    /// beyond 16383.
    pub fn new(prefix: &str, name: &str, placement: &Placement) -> Result<Self> {
        Self::of_kind(prefix, name, placement, "lock")
    }

    /// The key of primitive kind `kind` (`lock` for the mutex, e.g. `rw` for a read-write
    /// lock) named `name`: `<prefix>:{<tag>}:<kind>`. Every kind of one name shares the slot.
    pub(crate) fn of_kind(
        prefix: &str,
        name: &str,
        placement: &Placement,
        kind: &str,
    ) -> Result<Self> {
        validate_name(name)?;
        validate_prefix(prefix, name)?;
        let escaped = escape(name);
        let base = match placement {
            Placement::ByName => format!("{{{escaped}}}"),
            Placement::Slot(slot) => {
                let tag = tag_for_slot(*slot).ok_or_else(|| Error::InvalidOptions {
                    name: name.to_owned(),
                    reason: format!(
                        "slot {slot} does not exist: slots run from 0 to {}",
                        SLOT_COUNT - 1
                    ),
                })?;
                format!("{{{tag}}}:{escaped}")
            }
            Placement::Tag(tag) => {
                if tag.is_empty() {
                    return Err(Error::InvalidOptions {
                        name: name.to_owned(),
                        reason: "the hash tag is empty: give a non-empty tag or use the name"
                            .into(),
                    });
                }
                format!("{{{}}}:{escaped}", escape(tag))
            }
        };
        let base = if prefix.is_empty() {
            base
        } else {
            format!("{prefix}:{base}")
        };
        let lock = format!("{base}:{kind}");
        let slot = slot_of(lock.as_bytes());
        Ok(Self {
            name: name.to_owned(),
            lock,
            slot,
        })
    }

    /// The lock's name as the caller gave it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The lock's key: a hash with the last fence granted and the current owner and lease end
    /// (removed on release). In clock mode the key expires once its lease and fence are past by
    /// the client's expiry grace; in counter and epoch modes it has no TTL.
    pub fn lock_key(&self) -> &str {
        &self.lock
    }

    /// The hash slot the key lives in.
    pub fn slot(&self) -> u16 {
        self.slot
    }
}

impl fmt::Display for LockKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot {} key {}", self.slot, self.lock)
    }
}

fn validate_name(name: &str) -> Result<()> {
    let reason = if name.is_empty() {
        "the lock name is empty: give every lock a non-empty name such as \"orders:42\""
    } else if name.len() > MAX_NAME_LEN {
        "the lock name is longer than 4096 bytes: use a shorter name or a digest of it"
    } else {
        return Ok(());
    };
    Err(Error::InvalidName {
        name: truncate(name),
        reason: reason.into(),
    })
}

fn validate_prefix(prefix: &str, name: &str) -> Result<()> {
    if prefix.contains(['{', '}']) {
        return Err(Error::InvalidOptions {
            name: name.to_owned(),
            reason: format!(
                "the key prefix {prefix:?} contains a brace, which would change the hash tag: \
                 remove braces from the prefix"
            ),
        });
    }
    Ok(())
}

/// Percent-escapes `%`, `{` and `}`, so escaped text never forms or breaks a hash tag.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

/// Shortens a name for an error message.
pub(crate) fn truncate(name: &str) -> String {
    const SHOWN: usize = 64;
    match name.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &name[..cut]),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_vectors_match_redis() {
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"a{b}c{d}"), 3300);
        assert_eq!(slot_of(b"foo{}{bar}"), 8363);
        assert_eq!(slot_of(b"foo{{bar}}zap"), 4015);
        assert_eq!(slot_of(b"lock:{order42}"), 11082);
    }

    #[test]
    fn every_slot_has_a_tag_that_hashes_to_it() {
        for slot in 0..SLOT_COUNT {
            let tag = tag_for_slot(slot).expect("slot in range");
            assert_eq!(slot_of(tag.as_bytes()), slot, "tag {tag}");
        }
        assert_eq!(tag_for_slot(SLOT_COUNT), None);
    }

    #[test]
    fn braces_in_names_cannot_move_the_slot() {
        for name in ["a}b", "{x}", "}{", "a{b}c", "%7B", "{"] {
            let keys = LockKeys::new("p", name, &Placement::ByName).unwrap();
            assert_eq!(keys.slot(), slot_of(escape(name).as_bytes()), "{name}");
            assert_eq!(slot_of(keys.lock_key().as_bytes()), keys.slot());
        }
        let a = LockKeys::new("p", "%7B", &Placement::ByName).unwrap();
        let b = LockKeys::new("p", "{", &Placement::ByName).unwrap();
        assert_ne!(a.lock_key(), b.lock_key());
    }

    #[test]
    fn pinned_locks_land_in_their_slot() {
        for slot in [0, 1, 5000, 16383] {
            let keys = LockKeys::new("fencelock", "a{b}", &Placement::Slot(slot)).unwrap();
            assert_eq!(keys.slot(), slot);
            assert_eq!(slot_of(keys.lock_key().as_bytes()), slot);
        }
        let tagged = LockKeys::new("", "x", &Placement::Tag("orders".into())).unwrap();
        assert_eq!(tagged.slot(), slot_of(b"orders"));
        assert_eq!(tagged.lock_key(), "{orders}:x:lock");
    }

    #[test]
    fn bad_names_and_placements_are_errors() {
        assert!(matches!(
            LockKeys::new("p", "", &Placement::ByName),
            Err(Error::InvalidName { .. })
        ));
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(
            LockKeys::new("p", &long, &Placement::ByName),
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            LockKeys::new("p{", "n", &Placement::ByName),
            Err(Error::InvalidOptions { .. })
        ));
        assert!(matches!(
            LockKeys::new("p", "n", &Placement::Slot(SLOT_COUNT)),
            Err(Error::InvalidOptions { .. })
        ));
        assert!(matches!(
            LockKeys::new("p", "n", &Placement::Tag(String::new())),
            Err(Error::InvalidOptions { .. })
        ));
    }
}
