//! The mutex: a fenced lock with re-entry. This file is its acquire [`Request`]; `guard.rs` its
//! guard, a thin wrapper around [`Held`]; `reentry.rs` the handle that takes it again.

mod guard;
mod reentry;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::acquire::{replicas, Attempt, InFlight, Request};
use crate::core::Core;
use crate::error::{Error, Result};
use crate::fence::FenceToken;
use crate::held::{Grant, Held};
use crate::keys::LockKeys;
use crate::options::LockOptions;
use crate::script::{parse_fence, parse_reply, ttl_ms, ScriptCall, ACQUIRE};

pub use guard::LockGuard;
pub(crate) use guard::MUTEX;
pub use reentry::Reentry;

/// One acquisition of a mutex: its keys and options.
pub(crate) struct Acquire<'a> {
    pub(crate) keys: &'a LockKeys,
    pub(crate) options: &'a LockOptions,
}

impl Request for Acquire<'_> {
    type Granted = LockGuard;

    fn name(&self) -> &str {
        self.keys.name()
    }

    fn channel(&self) -> &str {
        self.keys.lock_key()
    }

    /// One acquire request under a fresh owner token (a token is never reused after a failed
    /// request, whose background release could otherwise hit a later grant).
    async fn attempt(&self, core: &Arc<Core>) -> Result<Attempt<LockGuard>> {
        let (keys, options) = (self.keys, self.options);
        let owner = new_owner_token();
        let started = Instant::now();
        let lease = options.first_lease();
        let key = keys.lock_key();
        let (mode, expiry) = (core.fence_arg(), core.expiry());
        // Owner, TTL, floor, fence mode, expiry grace; the numbers take at most 40 bytes.
        let bytes = key.len() + owner.len() + 40 + mode.len() + expiry.len();
        let call = ScriptCall::start(&ACQUIRE, &[key], 5, bytes)
            .arg(owner.as_str())
            .arg(ttl_ms(lease))
            .arg(options.floor.map_or(0, FenceToken::get))
            .arg(mode)
            .arg(expiry);
        let in_flight = InFlight::release(core, &MUTEX, key, &owner, "");
        let (reply, acks) =
            replicas::run_granting(core, call, keys.name(), "acquire", options.wait).await?;
        let (status, value, behind) =
            parse_reply::<(i64, i64, i64)>(keys.name(), "acquire", reply)?;
        match status {
            1 | 2 => {
                if behind > 0 {
                    core.clock_behind(keys.name(), behind);
                }
                let fence = parse_fence(keys.name(), "acquire", "fence", value)?;
                in_flight.disarm();
                let undo = || MUTEX.release_call(core, key, &owner, "");
                let replicas_acked = replicas::confirm(core, keys.name(), acks, undo).await?;
                tracing::debug!(lock = keys.name(), %fence, "acquired");
                let grant = Grant {
                    keys: keys.clone(),
                    owner,
                    hold: String::new(),
                    fence,
                    sent: started,
                    ttl: lease,
                    replicas_acked,
                };
                let held = Held::new(core, &MUTEX, grant, options);
                Ok(Attempt::Granted(LockGuard::new(held)))
            }
            0 => {
                in_flight.disarm();
                Ok(Attempt::Busy {
                    retry_after: Duration::from_millis(u64::try_from(value).unwrap_or(0)),
                })
            }
            other => Err(Error::UnexpectedReply {
                name: keys.name().to_owned(),
                operation: "acquire",
                detail: format!("status {other}"),
            }),
        }
    }
}

/// A fresh 128-bit random owner token, hex encoded (32 lowercase digits).
///
/// The bits come from rand's thread-local CSPRNG (ChaCha12, seeded from the OS and reseeded
/// by rand), not from a `getrandom` call per token; encoded on the stack, one allocation.
pub(crate) fn new_owner_token() -> String {
    let mut buffer = uuid::Uuid::encode_buffer();
    let bits: u128 = rand::random();
    let token: &str = uuid::Uuid::from_u128(bits)
        .simple()
        .encode_lower(&mut buffer);
    token.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_are_128_bit_hex() {
        let token = new_owner_token();
        assert_eq!(token.len(), 32);
        assert_eq!(token.capacity(), 32);
        assert!(token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_ne!(token, new_owner_token());
        // Every bit varies (no fixed version or variant bits as in a v4 UUID): over 64 tokens
        // each of the 128 bits was seen both set and clear (chance of a false failure ≈ 2^-57).
        let (mut ones, mut zeros) = (0u128, 0u128);
        for _ in 0..64 {
            let bits = u128::from_str_radix(&new_owner_token(), 16).unwrap();
            ones |= bits;
            zeros |= !bits;
        }
        assert_eq!((ones, zeros), (u128::MAX, u128::MAX));
    }
}
