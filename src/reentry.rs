//! Re-entry, for every primitive that has it: what a handle derived from a guard carries (the
//! owner's token, the fence its holds inherit, the watchdog they follow) and the one request
//! that adds a hold. The mutex's [`Reentry`](crate::Reentry) and the read-write lock's
//! [`RwReentry`](crate::RwReentry) are thin public wrappers around [`Reentrant`].

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use tracing::Instrument;

use crate::acquire::InFlight;
use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::fence::FenceToken;
use crate::held::{Grant, Held, Scripts, Watched};
use crate::keys::LockKeys;
use crate::options::validate_ttl;
use crate::script::{parse_reply, ttl_millis, LuaScript, Outcome, ScriptCall};

/// The accessors of a public re-entry handle over a [`Reentrant`] (its field `0`): `ttl`,
/// `name`, `fence`.
macro_rules! reentry_accessors {
    () => {
        /// The lease a re-entry asks for (default 30 s): the owner's lease is moved to at least
        /// now plus this, never shortened.
        pub fn ttl(mut self, ttl: std::time::Duration) -> Self {
            self.0.set_ttl(ttl);
            self
        }

        /// The lock's name.
        pub fn name(&self) -> &str {
            self.0.name()
        }

        /// The fence token every hold of this owner carries.
        pub fn fence(&self) -> $crate::FenceToken {
            self.0.fence()
        }
    };
}
pub(crate) use reentry_accessors;

/// The lease a re-entry asks for unless set.
const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// How a primitive's re-entry script is called and read.
pub(crate) struct Entry {
    /// The scripts its holds are released, extended and renewed with.
    pub(crate) scripts: &'static Scripts,
    /// `KEYS[1]` the key; `ARGV` owner, hold id, TTL ms, then `mode` when set, then the expiry
    /// grace; replies `{code, stored fence, remaining lease ms}`, code 1 for a hold added.
    pub(crate) script: &'static LazyLock<LuaScript>,
    /// Whether the fence stored now still is this owner's (`stored`, `own`).
    pub(crate) fence_is_own: fn(u64, u64) -> bool,
    /// The primitive's own refusals, by code; other codes are read as an [`Outcome`].
    pub(crate) refusal: fn(&str, i64) -> Option<Error>,
}

/// What a re-entry handle carries, made from a hold of the owner.
#[derive(Clone)]
pub(crate) struct Reentrant {
    core: Arc<Core>,
    keys: LockKeys,
    owner: String,
    fence: FenceToken,
    ttl: Duration,
    watched: Option<Watched>,
}

impl Reentrant {
    /// The handle of `held`'s owner.
    pub(crate) fn of(held: &Held) -> Self {
        Self {
            core: Arc::clone(held.core()),
            keys: held.keys().clone(),
            owner: held.owner().to_owned(),
            fence: held.fence(),
            ttl: DEFAULT_TTL,
            watched: held.watched(),
        }
    }

    /// Asks for `ttl` at every re-entry.
    pub(crate) fn set_ttl(&mut self, ttl: Duration) {
        self.ttl = ttl;
    }

    /// The lock's name.
    pub(crate) fn name(&self) -> &str {
        self.keys.name()
    }

    /// The fence every hold of the owner carries.
    pub(crate) fn fence(&self) -> FenceToken {
        self.fence
    }

    /// The handle's `Debug`, under the public type's name.
    pub(crate) fn debug(
        &self,
        f: &mut std::fmt::Formatter<'_>,
        type_name: &str,
    ) -> std::fmt::Result {
        f.debug_struct(type_name)
            .field("name", &self.keys.name())
            .field("fence", &self.fence)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }

    /// Adds a hold under the owner with `entry`'s script (`mode` its extra argument, when it
    /// takes one): a hold with the owner's fence that follows the first hold's watchdog.
    ///
    /// # Errors
    ///
    /// The primitive's refusals, [`Error::Expired`] or [`Error::NotOwner`] when the owner's
    /// hold is gone, [`Error::InvalidOptions`] for a bad TTL, [`Error::Timeout`] or
    /// [`Error::Redis`] when Redis does not answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a hold added by a dropped call is released in the background.
    pub(crate) async fn enter(&self, entry: &Entry, mode: Option<&str>) -> Result<Held> {
        let span = tracing::debug_span!(
            "fencelock.reenter",
            lock = self.keys.name(),
            kind = entry.scripts.kind.as_str(),
            mode = tracing::field::Empty
        );
        if let Some(mode) = mode {
            span.record("mode", mode);
        }
        self.enter_unspanned(entry, mode).instrument(span).await
    }

    async fn enter_unspanned(&self, entry: &Entry, mode: Option<&str>) -> Result<Held> {
        let (name, key) = (self.keys.name(), self.keys.lock_key());
        validate_ttl(name, self.ttl)?;
        let hold = crate::owner::id();
        let sent = Instant::now();
        let ttl_ms = ttl_millis(self.ttl);
        let in_flight = InFlight::release(&self.core, entry.scripts, key, &self.owner, &hold);
        let mut args = vec![self.owner.as_str(), &hold, &ttl_ms];
        args.extend(mode);
        args.push(self.core.expiry());
        let call = ScriptCall::new(LazyLock::force(entry.script), &[key], &args);
        let reply = self
            .core
            .transport
            .run(&call, name, Operation::Reenter)
            .await?;
        in_flight.disarm();
        let (code, fence, remaining) =
            parse_reply::<(i64, i64, u64)>(name, Operation::Reenter, reply)?;
        let own = self.fence.get();
        match code {
            1 if u64::try_from(fence).is_ok_and(|stored| (entry.fence_is_own)(stored, own)) => {
                tracing::debug!(lock = name, kind = entry.scripts.kind.as_str(), fence = %self.fence, "re-entered");
                let grant = Grant {
                    weight: 1,
                    keys: self.keys.clone(),
                    owner: self.owner.clone(),
                    hold,
                    fence: self.fence,
                    sent,
                    ttl: Duration::from_millis(remaining),
                    replicas_acked: None,
                };
                Ok(Held::following(
                    &self.core,
                    entry.scripts,
                    grant,
                    self.watched.clone(),
                ))
            }
            _ => Err((entry.refusal)(name, code)
                .or_else(|| Outcome::from_code(code).and_then(|outcome| outcome.lost(name)))
                .unwrap_or_else(|| Error::UnexpectedReply {
                    name: name.to_owned(),
                    operation: Operation::Reenter,
                    detail: format!("status {code}, fence {fence}"),
                })),
        }
    }
}
