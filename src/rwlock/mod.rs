//! The read-write lock: many readers or one writer, every hold fenced from one counter. This file
//! is its two acquire [`Request`]s, the waiting writer's intent and the constructors on
//! [`Client`]; `guard.rs` its guards over [`Held`] and its [`Kind`](crate::held::Scripts);
//! `reentry.rs` the re-entry handle.
//!
//! One hash per lock, `<prefix>:{NAME}:rw` (see `script/lua/rw_prologue.lua` for its fields).

mod guard;
mod reentry;

use std::sync::Arc;
use std::time::Instant;

use tracing::field::Empty;
use tracing::Instrument;

use crate::acquire::{self, Attempt, GrantReply, Granting, InFlight, Request};
use crate::client::Client;
use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::held::Held;
use crate::keys::LockKeys;
use crate::kind::Kind;
use crate::options::{instant_after, LockOptions};
use crate::script::{
    ttl_millis, EntriesSeen, ScriptCall, RW_READ, RW_WITHDRAW, RW_WRITE, SCAN_WEIGHT,
};

use guard::RW;
pub use guard::{ReadGuard, WriteGuard};
pub use reentry::RwReentry;

/// The most live read holds (reader entries, one per read guard that is not a re-entry) one
/// read-write lock has, across all clients. A writer's acquire, a forced unlock and an
/// inspection read every reader entry, so this bounds how long such a call blocks Redis (about
/// a millisecond at this count on a loaded test machine, `docs/design.md`, "Bounded script
/// work"). A reader that finds this many waits as behind a writer, until one of them ends.
///
/// ```
/// assert_eq!(fencelock::MAX_READERS, 256);
/// ```
pub const MAX_READERS: u32 = 256;

/// Which hold an acquisition asks for.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Read,
    Write,
}

impl Mode {
    fn operation(self) -> Operation {
        match self {
            Mode::Read => Operation::ReadLock,
            Mode::Write => Operation::WriteLock,
        }
    }
}

/// One acquisition of a read or write hold.
struct Acquire<'a> {
    keys: &'a LockKeys,
    options: &'a LockOptions,
    mode: Mode,
    /// The waiting writer's intent id (empty for a reader or a single attempt).
    intent: &'a str,
    /// The hash's entries as the replies reported them: the weight of this call's scripts.
    seen: EntriesSeen,
}

impl Request for Acquire<'_> {
    type Granted = Held;

    fn name(&self) -> &str {
        self.keys.name()
    }

    fn channel(&self) -> &str {
        self.keys.lock_key()
    }

    /// One request under a fresh owner token (never reused after a failed request, whose
    /// background release could otherwise hit a later grant).
    async fn attempt(&self, core: &Arc<Core>) -> Result<Attempt<Held>> {
        let (keys, options) = (self.keys, self.options);
        let operation = self.mode.operation();
        let owner = crate::owner::token(core.tag());
        let granting = Granting::new(core, &RW, keys, operation, &owner, options);
        let ttl_ms = ttl_millis(granting.lease());
        let floor = core.floor(options).to_string();
        let cap = MAX_READERS.to_string();
        let fifth = match self.mode {
            Mode::Read => cap.as_str(),
            Mode::Write => self.intent,
        };
        let script = match self.mode {
            Mode::Read => &RW_READ,
            Mode::Write => &RW_WRITE,
        };
        let call = ScriptCall::new(
            script,
            &[keys.lock_key()],
            &[
                &owner,
                &ttl_ms,
                &floor,
                core.fence_arg(),
                fifth,
                core.expiry(),
            ],
        )
        .weighted(self.seen.weight());
        match granting.send(&call).await? {
            (GrantReply::Granted { fence, behind, .. }, acks) => {
                if self.mode == Mode::Read {
                    // Granted: the lock had room for one more reader.
                    self.seen.note(0);
                }
                let grant = granting
                    .finish(fence, behind, acks, String::new(), 1, None)
                    .await?;
                Ok(Attempt::Granted(Held::new(core, &RW, grant, options)))
            }
            (GrantReply::Busy { retry_after, rest }, _) => {
                // The entries the refusal read.
                self.seen.note(rest.first().copied().unwrap_or(0));
                Ok(granting.busy(retry_after))
            }
            (GrantReply::Own { status, .. }, _) => Err(Error::UnexpectedReply {
                name: keys.name().to_owned(),
                operation,
                detail: format!("status {status}"),
            }),
        }
    }
}

/// One read hold of `keys`' lock for a multi-lock (`deadline` `None`: one attempt), as
/// [`Client::read_lock`] / [`Client::try_read_lock`] take it.
pub(crate) async fn take_read(
    core: &Arc<Core>,
    keys: &LockKeys,
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<ReadGuard> {
    let request = Acquire {
        keys,
        options,
        mode: Mode::Read,
        intent: "",
        seen: EntriesSeen::new(keys.slot(), 1),
    };
    let held = match deadline {
        None => acquire::once(core, &request).await?,
        Some(deadline) => {
            acquire::wait_observed(
                core,
                &request,
                deadline.saturating_duration_since(Instant::now()),
                options.on_wait.as_ref(),
            )
            .await?
        }
    };
    Ok(ReadGuard::new(held))
}

/// The write hold of `keys`' lock for a multi-lock, as [`Client::write_lock`] takes it: waiting
/// until `deadline` under an intent that keeps new readers out, withdrawn when the wait fails
/// (within the request timeout after `deadline`; past it, or when the call is dropped, in the
/// background); with `deadline` `None` one attempt that leaves no intent.
pub(crate) async fn take_write(
    core: &Arc<Core>,
    keys: &LockKeys,
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<WriteGuard> {
    let Some(deadline) = deadline else {
        let request = Acquire {
            keys,
            options,
            mode: Mode::Write,
            intent: "",
            seen: EntriesSeen::new(keys.slot(), SCAN_WEIGHT),
        };
        return acquire::once(core, &request).await.map(WriteGuard::new);
    };
    let id = crate::owner::id();
    // While it lives, new readers are refused. Withdrawn when the wait fails, or in the
    // background when the call is dropped, and announced, so readers queued behind it enter at
    // once.
    let withdraw = ScriptCall::new(
        &RW_WITHDRAW,
        &[keys.lock_key()],
        &[&id, core.transport.announce(), core.expiry()],
    );
    let intent = InFlight::arm(&core.transport, withdraw).named(Operation::WithdrawIntent);
    let request = Acquire {
        keys,
        options,
        mode: Mode::Write,
        intent: &id,
        seen: EntriesSeen::new(keys.slot(), SCAN_WEIGHT),
    };
    match acquire::wait_observed(
        core,
        &request,
        deadline.saturating_duration_since(Instant::now()),
        options.on_wait.as_ref(),
    )
    .await
    {
        Ok(held) => {
            intent.disarm();
            Ok(WriteGuard::new(held))
        }
        Err(err) => {
            acquire::undo_within_bound(core, deadline, intent.now(keys.name())).await;
            Err(err)
        }
    }
}

impl Client {
    /// The keys of read-write lock `name`: one hash, `<prefix>:{NAME}:rw` (in the slot of the
    /// name, or where `options` pin it).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] or [`Error::InvalidOptions`] as for [`LockKeys::new`].
    pub fn rwlock_keys(&self, name: &str, options: &LockOptions) -> Result<LockKeys> {
        LockKeys::of_kind(
            &self.core().prefix,
            name,
            &options.placement,
            Kind::ReadWrite.key_suffix(),
        )
    }

    /// One of the four calls: its keys, the options checked, then `take` (one attempt, or a
    /// wait until the timeout) inside `span`, which gets the lock's slot.
    async fn rw_hold<G>(
        &self,
        span: tracing::Span,
        name: &str,
        options: &LockOptions,
        wait: bool,
        take: impl AsyncFnOnce(&Arc<Core>, &LockKeys, &LockOptions, Option<Instant>) -> Result<G>,
    ) -> Result<G> {
        async {
            let keys = self.rwlock_keys(name, options)?;
            tracing::Span::current().record("slot", keys.slot());
            options.validate(name)?;
            let deadline = wait.then(|| instant_after(Instant::now(), options.timeout));
            take(self.core(), &keys, options, deadline).await
        }
        .instrument(span)
        .await
    }

    /// Takes a read hold of read-write lock `name` if no writer holds it and none waits; does
    /// not wait. Readers share the lock; each read hold has its own lease, its own fence (above
    /// every fence granted before it, writers' included) and, with `options.watchdog(true)`,
    /// its own renewal, which moves no other reader's lease.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let read = client.try_read_lock("catalog", &LockOptions::new()).await?;
    /// println!("reading under fence {}", read.fence());
    /// read.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when a writer holds the lock or waits for it (`retry_after`: the end of
    /// its lease or intent); [`Error::InvalidName`] / [`Error::InvalidOptions`] for bad input;
    /// [`Error::OutOfMemory`], [`Error::Timeout`], [`Error::Redis`] from Redis;
    /// [`Error::ReplicasNotConfirmed`] with `wait_replicas`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing (a hold it may have taken is released in the
    /// background).
    pub async fn try_read_lock(&self, name: &str, options: &LockOptions) -> Result<ReadGuard> {
        let span = tracing::debug_span!(
            "fencelock.try_read_lock",
            lock = name,
            kind = crate::kind::Kind::ReadWrite.as_str(),
            slot = Empty
        );
        self.rw_hold(span, name, options, false, take_read).await
    }

    /// Takes a read hold of read-write lock `name`, waiting up to `options`' timeout while a
    /// writer holds it or waits for it (writers are not starved: once a writer waits, new
    /// readers wait behind it). Woken by releases. See [`try_read_lock`](Self::try_read_lock).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let options = LockOptions::new().timeout(Duration::from_secs(5)).watchdog(true);
    /// let read = client.read_lock("catalog", &options).await?;
    /// // ... read, presenting read.fence() where storage checks it ...
    /// read.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when the timeout passed; otherwise as
    /// [`try_read_lock`](Self::try_read_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing and leaves no subscription behind.
    pub async fn read_lock(&self, name: &str, options: &LockOptions) -> Result<ReadGuard> {
        let span = tracing::debug_span!(
            "fencelock.read_lock",
            lock = name,
            kind = crate::kind::Kind::ReadWrite.as_str(),
            slot = Empty
        );
        self.rw_hold(span, name, options, true, take_read).await
    }

    /// Takes the write hold of read-write lock `name` if no reader or writer holds it and no
    /// other writer waits; does not wait (and leaves no intent). The fence is above every fence
    /// granted before it, readers' included.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// match client.try_write_lock("catalog", &LockOptions::new()).await {
    ///     Ok(write) => write.release().await?,
    ///     Err(err) if err.is_busy() => println!("in use: {err}"),
    ///     Err(err) => return Err(err),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_read_lock`](Self::try_read_lock); [`Error::Busy`] when any live hold or another
    /// waiting writer is in the way.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing.
    pub async fn try_write_lock(&self, name: &str, options: &LockOptions) -> Result<WriteGuard> {
        let span = tracing::debug_span!(
            "fencelock.try_write_lock",
            lock = name,
            kind = crate::kind::Kind::ReadWrite.as_str(),
            slot = Empty
        );
        self.rw_hold(span, name, options, false, take_write).await
    }

    /// Takes the write hold of read-write lock `name`, waiting up to `options`' timeout. The
    /// first refused attempt records this call's intent in the lock (refreshed by every
    /// attempt, lasting one TTL): while it lives, new readers are refused, so a stream of readers
    /// cannot starve the writer. The intent is removed by the grant, and withdrawn (with a
    /// wake-up for the readers behind it) when the call times out or is dropped.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use std::time::Duration;
    /// use fencelock::LockOptions;
    ///
    /// let write = client
    ///     .write_lock("catalog", &LockOptions::new().timeout(Duration::from_secs(10)))
    ///     .await?;
    /// let fence: i64 = write.fence().into();
    /// // ... write under `fence` ...
    /// let read = write.downgrade().await?; // keep reading, let other readers in
    /// read.release().await?;
    /// # let _ = fence; Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] when the timeout passed; otherwise as
    /// [`try_write_lock`](Self::try_write_lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing, and its intent is withdrawn in the background
    /// at once (readers get in without waiting for the intent's lease to end).
    pub async fn write_lock(&self, name: &str, options: &LockOptions) -> Result<WriteGuard> {
        let span = tracing::debug_span!(
            "fencelock.write_lock",
            lock = name,
            kind = crate::kind::Kind::ReadWrite.as_str(),
            slot = Empty
        );
        self.rw_hold(span, name, options, true, take_write).await
    }
}
