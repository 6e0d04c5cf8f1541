//! Lock names, hash tags, slots and the Redis keys a lock uses.
//!
//! A lock's keys share one hash tag so that one script may touch all of them on one node.
//! Slots are computed here exactly as Redis does (CRC16/XMODEM of the hash tag, mod 16384).

use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{Arc, OnceLock};

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
#[derive(Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// The lock key followed by the name, in one shared allocation: cloning is a reference
    /// count (a grant, a guard and its re-entry handle share it).
    text: Arc<str>,
    /// Where the key ends and the name starts in `text`.
    key_len: usize,
    slot: u16,
    /// [`fingerprint`] of the lock key, computed once: the client's per-key tables hash it.
    fingerprint: u64,
}

impl fmt::Debug for LockKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockKeys")
            .field("name", &self.name())
            .field("lock", &self.lock_key())
            .field("slot", &self.slot)
            .finish()
    }
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
    /// [`Error::InvalidOptions`] for a prefix containing `{` or `}`, an empty tag, a tag longer
    /// than [`MAX_NAME_LEN`] bytes or a slot beyond 16383.
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
        // `{tag}` and, unless the name is the tag, `:name`, both escaped.
        let (tag, tag_escaped, named) = match placement {
            Placement::ByName => (name, true, false),
            Placement::Slot(slot) => {
                let tag = tag_for_slot(*slot).ok_or_else(|| Error::InvalidOptions {
                    name: name.to_owned(),
                    reason: format!(
                        "slot {slot} does not exist: slots run from 0 to {}",
                        SLOT_COUNT - 1
                    ),
                })?;
                (tag, false, true)
            }
            Placement::Tag(tag) => {
                if tag.is_empty() {
                    return Err(Error::InvalidOptions {
                        name: name.to_owned(),
                        reason: "the hash tag is empty: give a non-empty tag or use the name"
                            .into(),
                    });
                }
                if tag.len() > MAX_NAME_LEN {
                    return Err(Error::InvalidOptions {
                        name: name.to_owned(),
                        reason: format!(
                            "the hash tag is longer than {MAX_NAME_LEN} bytes (as a name may \
                             be): use a shorter tag"
                        ),
                    });
                }
                (tag.as_str(), true, true)
            }
        };
        let tag_len = if tag_escaped {
            escaped_len(tag)
        } else {
            tag.len()
        };
        let key_len = if prefix.is_empty() {
            0
        } else {
            prefix.len() + 1
        } + tag_len
            + 2
            + if named { 1 + escaped_len(name) } else { 0 }
            + 1
            + kind.len();
        let mut text = String::with_capacity(key_len + name.len());
        if !prefix.is_empty() {
            text.push_str(prefix);
            text.push(':');
        }
        text.push('{');
        if tag_escaped {
            push_escaped(&mut text, tag);
        } else {
            text.push_str(tag);
        }
        text.push('}');
        if named {
            text.push(':');
            push_escaped(&mut text, name);
        }
        text.push(':');
        text.push_str(kind);
        debug_assert_eq!(text.len(), key_len);
        let slot = slot_of(text.as_bytes());
        let fingerprint = fingerprint(&text);
        text.push_str(name);
        Ok(Self {
            text: text.into(),
            key_len,
            slot,
            fingerprint,
        })
    }

    /// The lock's name as the caller gave it.
    pub fn name(&self) -> &str {
        &self.text[self.key_len..]
    }

    /// The lock's key: a hash with the last fence granted and the current owner and lease end
    /// (removed on release). In clock mode the key expires once its lease and fence are past by
    /// the client's expiry grace (or is deleted at its release, by a standalone server whose
    /// module was loaded with `release-deletes yes`); in counter and epoch modes it has no TTL.
    pub fn lock_key(&self) -> &str {
        &self.text[..self.key_len]
    }

    /// The hash slot the key lives in.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// [`fingerprint`] of the lock key.
    pub(crate) fn fingerprint(&self) -> u64 {
        self.fingerprint
    }
}

/// A key's 64-bit fingerprint: SipHash under a key drawn once per process, so lock names
/// cannot be chosen to collide. The client's per-key tables ([`FingerprintHasher`]) hash a key
/// by it, so a lock's several lookups hash its name once.
pub(crate) fn fingerprint(key: &str) -> u64 {
    static STATE: OnceLock<RandomState> = OnceLock::new();
    STATE.get_or_init(RandomState::new).hash_one(key)
}

/// The hasher of tables keyed by a [`fingerprint`] (already a keyed hash): it takes the
/// fingerprint as the hash.
#[derive(Default)]
pub(crate) struct FingerprintHasher(u64);

impl Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, fingerprint: u64) {
        self.0 = fingerprint;
    }
}

/// Builds [`FingerprintHasher`]s.
pub(crate) type ByFingerprint = BuildHasherDefault<FingerprintHasher>;

impl fmt::Display for LockKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot {} key {}", self.slot, self.lock_key())
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

/// Whether `byte` is escaped by [`push_escaped`].
fn is_escaped(byte: u8) -> bool {
    matches!(byte, b'%' | b'{' | b'}')
}

/// The length of `text` once escaped: each escaped byte becomes three.
fn escaped_len(text: &str) -> usize {
    text.len() + 2 * text.bytes().filter(|&b| is_escaped(b)).count()
}

/// Appends `text` to `out` with `%`, `{` and `}` percent-escaped, so escaped text never forms
/// or breaks a hash tag.
fn push_escaped(out: &mut String, text: &str) {
    let mut rest = text;
    while let Some(at) = rest.bytes().position(is_escaped) {
        out.push_str(&rest[..at]);
        out.push_str(match rest.as_bytes()[at] {
            b'%' => "%25",
            b'{' => "%7B",
            _ => "%7D",
        });
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
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

    /// The escaping as first written (one `char` at a time), for comparison.
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

    /// The key as first built (three `format!`s), for comparison.
    fn old_key(prefix: &str, name: &str, placement: &Placement, kind: &str) -> String {
        let escaped = escape(name);
        let base = match placement {
            Placement::ByName => format!("{{{escaped}}}"),
            Placement::Slot(slot) => format!("{{{}}}:{escaped}", tag_for_slot(*slot).unwrap()),
            Placement::Tag(tag) => format!("{{{}}}:{escaped}", escape(tag)),
        };
        let base = if prefix.is_empty() {
            base
        } else {
            format!("{prefix}:{base}")
        };
        format!("{base}:{kind}")
    }

    #[test]
    fn keys_are_built_as_before_for_tricky_names() {
        let names = [
            "orders:42",
            "a}b",
            "{x}",
            "}{",
            "a{b}c",
            "%7B",
            "{",
            "}",
            "%",
            "%%{{}}",
            "ü{é}ß%",
            "日本{語}",
            "a b\tc",
            "x",
            ":",
            "{}",
        ];
        let placements = [
            Placement::ByName,
            Placement::Slot(0),
            Placement::Slot(16383),
            Placement::Tag("orders".into()),
            Placement::Tag("{a%b}".into()),
            Placement::Tag("é}".into()),
        ];
        for prefix in ["", "fencelock", "app:v2"] {
            for placement in &placements {
                for kind in ["lock", "rw", "sem"] {
                    for name in names {
                        let keys = LockKeys::of_kind(prefix, name, placement, kind).unwrap();
                        let old = old_key(prefix, name, placement, kind);
                        assert_eq!(keys.lock_key(), old, "{prefix:?} {name:?} {placement:?}");
                        assert_eq!(keys.name(), name);
                        assert_eq!(keys.slot(), slot_of(old.as_bytes()));
                        assert_eq!(keys.clone(), keys);
                    }
                }
            }
        }
    }

    #[test]
    fn debug_shows_name_key_and_slot() {
        let keys = LockKeys::new("p", "n", &Placement::ByName).unwrap();
        assert_eq!(
            format!("{keys:?}"),
            format!(
                "LockKeys {{ name: \"n\", lock: \"p:{{n}}:lock\", slot: {} }}",
                keys.slot()
            )
        );
    }

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
        assert!(matches!(
            LockKeys::new("p", "n", &Placement::Tag(long)),
            Err(Error::InvalidOptions { .. })
        ));
        let longest = "t".repeat(MAX_NAME_LEN);
        assert!(LockKeys::new("p", "n", &Placement::Tag(longest)).is_ok());
    }
}
