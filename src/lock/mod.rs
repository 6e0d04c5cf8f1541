//! The mutex: a fenced lock with re-entry. This file is its acquire [`Request`]; `guard.rs` its
//! guard, a thin wrapper around [`Held`]; `reentry.rs` the handle that takes it again.

mod guard;
pub(crate) mod handoff;
mod reentry;

use std::sync::Arc;
use std::time::Instant;

use crate::acquire::{Attempt, GrantReply, Granting, Local, Request};
use crate::core::Core;
use crate::error::{Error, Result};
use crate::held::Held;
use crate::keys::LockKeys;
use crate::options::LockOptions;
use crate::script::{ttl_ms, ScriptCall, ACQUIRE};

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

    /// Waits behind this client's task that holds the lock, if one does: handed the lock by
    /// its release (see `handoff.rs`).
    async fn wait_local(&self, core: &Arc<Core>, until: Instant) -> Local<LockGuard> {
        handoff::wait(core, self.keys, self.options, until).await
    }

    /// One acquire request under a fresh owner token (a token is never reused after a failed
    /// request, whose background release could otherwise hit a later grant). A caller that
    /// waits for replicas is not queued behind this client's holder nor handed the lock, and
    /// its token does not carry the client's tag: the handoff treats it as another client.
    async fn attempt(&self, core: &Arc<Core>) -> Result<Attempt<LockGuard>> {
        let (keys, options) = (self.keys, self.options);
        let owner = match options.wait {
            None => new_owner_token(core.tag()),
            Some(_) => new_owner_token(&format!("{:08x}", rand::random::<u32>())),
        };
        let key = keys.lock_key();
        let (mode, expiry) = (core.fence_arg(), core.expiry());
        // Owner, TTL, floor, fence mode, expiry grace; the numbers take at most 40 bytes.
        let bytes = key.len() + owner.len() + 40 + mode.len() + expiry.len();
        let granting = Granting::new(core, &MUTEX, keys, "acquire", &owner, options);
        let call = ScriptCall::start(&ACQUIRE, &[key], 5, bytes)
            .arg(owner.as_str())
            .arg(ttl_ms(granting.lease()))
            .arg(core.floor(options))
            .arg(mode)
            .arg(expiry);
        match granting.send(&call).await? {
            (GrantReply::Granted { fence, behind, .. }, acks) => {
                let grant = granting
                    .finish(fence, behind, acks, String::new(), 1, None)
                    .await?;
                let mut held = Held::new(core, &MUTEX, grant, options);
                if options.wait.is_none() {
                    held = held.handing(&handoff::HANDING);
                    core.handoffs.hold(keys);
                }
                Ok(Attempt::Granted(LockGuard::new(held)))
            }
            (GrantReply::Busy { retry_after, .. }, _) => Ok(granting.busy(retry_after)),
            (GrantReply::Own { status, .. }, _) => Err(Error::UnexpectedReply {
                name: keys.name().to_owned(),
                operation: "acquire",
                detail: format!("status {status}"),
            }),
        }
    }
}

/// A fresh owner token, hex encoded (32 lowercase digits): `tag` (the client's 8 hex digits,
/// which the acquire script records for a waiter) then 96 random bits.
///
/// The bits come from rand's thread-local CSPRNG (ChaCha12, seeded from the OS and reseeded
/// by rand), not from a `getrandom` call per token; encoded on the stack, one allocation.
pub(crate) fn new_owner_token(tag: &str) -> String {
    let mut buffer = uuid::Uuid::encode_buffer();
    let bits: u128 = rand::random();
    let token: &str = uuid::Uuid::from_u128(bits)
        .simple()
        .encode_lower(&mut buffer);
    let mut owner = String::with_capacity(32);
    owner.push_str(&tag[..tag.len().min(8)]);
    owner.push_str(&token[owner.len()..]);
    owner
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_tokens_are_a_tag_and_96_random_bits_in_hex() {
        let tag = "0a1b2c3d";
        let token = new_owner_token(tag);
        assert_eq!(token.len(), 32);
        assert_eq!(token.capacity(), 32);
        assert!(token.starts_with(tag));
        assert!(token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_ne!(token, new_owner_token(tag));
        // Every bit after the tag varies: over 64 tokens each of the 96 bits was seen both set
        // and clear (chance of a false failure ≈ 2^-57).
        let (mut ones, mut zeros) = (0u128, 0u128);
        for _ in 0..64 {
            let bits = u128::from_str_radix(&new_owner_token(tag), 16).unwrap();
            ones |= bits;
            zeros |= !bits;
        }
        let random = (1u128 << 96) - 1;
        assert_eq!((ones & random, zeros & random), (random, random));
    }
}
