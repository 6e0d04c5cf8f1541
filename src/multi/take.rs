//! Taking a multi-lock, once for every member type: the names checked, the call's span, and
//! the members taken (the mutex's one-slot request when all keys share a slot, the canonical
//! collection otherwise). Each public `*_all` method of `mod.rs` is its docs and one call into
//! [`Client::take_all`].

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{Instrument, Span};

use crate::client::Client;
use crate::core::Core;
use crate::error::{Error, Result};
use crate::fair::FairLockGuard;
use crate::keys::LockKeys;
use crate::lock::LockGuard;
use crate::options::{instant_after, LockOptions};
use crate::rwlock::{ReadGuard, WriteGuard};

use super::collect::collect;
use super::guard::MultiGuard;
use super::member::{take_one, MultiMember};
use super::one_slot::AcquireAll;

/// The most locks one multi-lock takes. When every member shares a slot they are taken by one
/// `lock_all` call, which reads and writes each: this bounds how long that call blocks the
/// server (about a millisecond at this count on a loaded test machine, `docs/design.md`,
/// "Bounded script work").
pub const MAX_MULTI_LOCKS: usize = 256;

/// How a multi-lock of one member type is taken.
pub(super) trait TakeAll: MultiMember + 'static {
    /// The keys of member `name` (the same key as the single lock of that name).
    fn keys(client: &Client, name: &str, options: &LockOptions) -> Result<LockKeys>;

    /// The span of the whole call (`call`: the public method's span name).
    fn span(names: &[&str], keys: &[LockKeys], call: &'static str) -> Span;

    /// Takes the members of `keys` (checked, at least one) under `deadline` (`None`: one
    /// attempt each), in the caller's order: one by one in canonical order unless the type
    /// has a faster way.
    fn take_all<'a>(
        core: &'a Arc<Core>,
        keys: &'a [LockKeys],
        options: &'a LockOptions,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<Vec<Self>>> + Send + 'a {
        collect(core, keys, options, deadline)
    }
}

/// True when every key shares the first one's slot.
fn one_slot(keys: &[LockKeys]) -> bool {
    keys.iter().all(|k| k.slot() == keys[0].slot())
}

impl TakeAll for LockGuard {
    fn keys(client: &Client, name: &str, options: &LockOptions) -> Result<LockKeys> {
        client.keys(name, options)
    }

    fn span(names: &[&str], keys: &[LockKeys], _call: &'static str) -> Span {
        tracing::debug_span!(
            "fencelock.lock_all",
            lock = names.join(" "),
            kind = crate::kind::Kind::Mutex.as_str(),
            one_slot = one_slot(keys)
        )
    }

    async fn take_all<'a>(
        core: &'a Arc<Core>,
        keys: &'a [LockKeys],
        options: &'a LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Vec<Self>> {
        if one_slot(keys) {
            take_one(core, &AcquireAll::new(keys, options), options, deadline).await
        } else {
            collect(core, keys, options, deadline).await
        }
    }
}

impl TakeAll for FairLockGuard {
    fn keys(client: &Client, name: &str, options: &LockOptions) -> Result<LockKeys> {
        client.fair_keys(name, options)
    }

    fn span(names: &[&str], _keys: &[LockKeys], _call: &'static str) -> Span {
        tracing::debug_span!(
            "fencelock.fair_lock_all",
            lock = names.join(" "),
            kind = crate::kind::Kind::Fair.as_str()
        )
    }
}

/// A read-write lock's holds as members, read or write alike: the read-write lock's keys, one
/// span for both (its `call` field says which).
macro_rules! take_rw_all {
    ($guard:ident) => {
        impl TakeAll for $guard {
            fn keys(client: &Client, name: &str, options: &LockOptions) -> Result<LockKeys> {
                client.rwlock_keys(name, options)
            }

            fn span(names: &[&str], _keys: &[LockKeys], call: &'static str) -> Span {
                tracing::debug_span!(
                    "fencelock.rw_lock_all",
                    call,
                    lock = names.join(" "),
                    kind = crate::kind::Kind::ReadWrite.as_str()
                )
            }
        }
    };
}

take_rw_all!(ReadGuard);
take_rw_all!(WriteGuard);

impl Client {
    /// Takes the multi-lock of `names`, waiting up to `wait` in all (`None`: one attempt per
    /// member); `call` names the public method in the span.
    pub(super) async fn take_all<G: TakeAll>(
        &self,
        names: &[&str],
        options: &LockOptions,
        wait: Option<Duration>,
        call: &'static str,
    ) -> Result<MultiGuard<G>> {
        let deadline = wait.map(|wait| instant_after(Instant::now(), wait));
        let keys = self.multi_keys::<G>(names, options)?;
        let span = G::span(names, &keys, call);
        let members = G::take_all(self.core(), &keys, options, deadline)
            .instrument(span)
            .await?;
        Ok(MultiGuard::new(members))
    }

    /// The members' keys ([`TakeAll::keys`] of each name), checked: at least one, at most
    /// [`MAX_MULTI_LOCKS`], no duplicates.
    fn multi_keys<G: TakeAll>(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<Vec<LockKeys>> {
        let invalid = |name: &str, reason: String| Error::InvalidOptions {
            name: name.to_owned(),
            reason,
        };
        let Some(first) = names.first() else {
            return Err(invalid("", "lock_all needs at least one name".into()));
        };
        if names.len() > MAX_MULTI_LOCKS {
            return Err(invalid(
                first,
                format!(
                    "{} names are more than one multi-lock takes ({MAX_MULTI_LOCKS})",
                    names.len()
                ),
            ));
        }
        for (i, name) in names.iter().enumerate() {
            if names[..i].contains(name) {
                return Err(invalid(
                    name,
                    "the name is given twice: a multi-lock takes each lock once".into(),
                ));
            }
        }
        options.validate(first)?;
        names
            .iter()
            .map(|name| G::keys(self, name, options))
            .collect()
    }
}
