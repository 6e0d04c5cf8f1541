//! The multi-lock: several mutexes, fair locks, or read or write holds of read-write locks,
//! taken as one guard, all or nothing, under one deadline. This file holds the public `Client`
//! methods, each its docs and one call into `take.rs`; `take.rs` how a multi-lock of each
//! member type is taken (names checked, span, members); `member.rs` what a member is (the
//! sealed [`MultiMember`]) and how one is taken; `one_slot.rs` the mutex's one-slot request;
//! `collect.rs` the canonical-order collection across slots; `guard.rs` [`MultiGuard`].
//!
//! Mutex keys of one slot are granted by one script (`lock_all.lua`). Otherwise (keys across
//! slots, and fair locks and read-write locks always) the members are taken one by one in one
//! canonical order (by slot, then key), whatever order the caller gave, so two callers never
//! wait on each other in a cycle; each member is first taken with a short provisional lease
//! (kept alive while later members are awaited), and extended to the full lease once all are
//! held. On failure or cancellation what was taken is released (and a fair member's place in
//! its queue withdrawn).

mod collect;
mod guard;
mod member;
mod one_slot;
mod take;

use crate::client::Client;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::fair::FairLockGuard;
use crate::options::LockOptions;
use crate::rwlock::{ReadGuard, WriteGuard};

pub use guard::MultiGuard;
pub use member::MultiMember;
pub use take::MAX_MULTI_LOCKS;

impl Client {
    /// Acquires every lock in `names` as one guard, all or nothing, waiting while any is held
    /// by another owner, for up to `options.timeout` in all.
    ///
    /// `options` apply to every member (TTL, watchdog, floor, placement). When all keys share
    /// one slot (a [`LockOptions::tag`] or [`LockOptions::slot`], or a standalone server with
    /// such a placement) one script call grants them all atomically. Otherwise the members are
    /// taken in one canonical order (by slot, then key) whatever order `names` has, so callers
    /// asking for overlapping sets in different orders never deadlock; each is first taken with
    /// a short provisional lease and extended to the full lease once all are held. On failure
    /// the members taken are released.
    ///
    /// With the watchdog on, each member is renewed (one call per node per batch).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let guard = client
    ///     .lock_all(&["acct:1", "acct:2"], &LockOptions::new().tag("accounts"))
    ///     .await?; // one script call: the two keys share a slot
    /// let fence = guard.fence("acct:1");
    /// # drop(fence);
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] for no names, more than [`MAX_MULTI_LOCKS`], a name given
    /// twice or bad options; [`Error::InvalidName`] for a bad name; [`Error::Busy`] naming the
    /// member still held at the timeout; the errors of [`lock`](Self::lock) otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing (members taken are released in the
    /// background).
    pub async fn lock_all(&self, names: &[&str], options: &LockOptions) -> Result<MultiGuard> {
        self.take_all(names, options, Some(options.timeout), "fencelock.lock_all")
            .await
    }

    /// Acquires every lock in `names` as one guard if each is free now: one attempt per member
    /// (one script call when all keys share a slot), no waiting; as
    /// [`lock_all`](Self::lock_all) otherwise.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let both = client.try_lock_all(&["account:1", "account:2"], &LockOptions::new()).await?;
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] naming a member held by another owner (nothing is left held); as
    /// [`lock_all`](Self::lock_all) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`lock_all`](Self::lock_all).
    pub async fn try_lock_all(&self, names: &[&str], options: &LockOptions) -> Result<MultiGuard> {
        self.take_all(names, options, None, "fencelock.try_lock_all")
            .await
    }

    /// Acquires every fair lock in `names` as one guard, all or nothing, each in its own
    /// queue, waiting for up to `options.timeout` in all.
    ///
    /// The members are taken one by one in one canonical order (by slot, then key) whatever
    /// order `names` has, so callers asking for overlapping sets never deadlock; each waits its
    /// turn in its lock's queue (arrival order) with a short provisional lease once granted,
    /// extended to the full lease once all are held. There is no one-script path for fair locks:
    /// a queue's order is per lock, so even keys of one slot are taken one by one. On failure
    /// the members taken are released and the place in the queue being waited in is withdrawn.
    /// `options` apply to every member; a member is the same key as
    /// [`fair_lock`](Self::fair_lock) of its name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let guard = client
    ///     .fair_lock_all(&["dock:1", "crane:7"], &LockOptions::new())
    ///     .await?;
    /// for (name, fence) in guard.fences() {
    ///     println!("{name}: {fence}");
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock_all`](Self::lock_all): [`Error::InvalidOptions`] for no names, too many, a
    /// name given twice or bad options; [`Error::Busy`] naming the member still held at the
    /// timeout; the errors of [`fair_lock`](Self::fair_lock) otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing and leaves no place in any queue (members
    /// taken are released, the waiting place withdrawn, in the background).
    pub async fn fair_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<FairLockGuard>> {
        self.take_all(
            names,
            options,
            Some(options.timeout),
            "fencelock.fair_lock_all",
        )
        .await
    }

    /// Acquires every fair lock in `names` as one guard if each is free now and no one queues
    /// for it: one attempt per member, in canonical order, no waiting; as
    /// [`fair_lock_all`](Self::fair_lock_all) otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] naming a member held or queued for by another owner (nothing is left
    /// held or queued); as [`fair_lock_all`](Self::fair_lock_all) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`fair_lock_all`](Self::fair_lock_all).
    pub async fn try_fair_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<FairLockGuard>> {
        self.take_all(names, options, None, "fencelock.try_fair_lock_all")
            .await
    }

    /// Takes a read hold of every read-write lock in `names` as one guard, all or nothing,
    /// waiting while a writer holds or waits for any of them, for up to `options.timeout` in
    /// all.
    ///
    /// The members are taken one by one in one canonical order (by slot, then key) whatever
    /// order `names` has, as [`fair_lock_all`](Self::fair_lock_all) takes its members: each
    /// read hold first with a short provisional lease, extended to the full lease once all are
    /// held; on failure the holds taken are released. Each member is the read hold
    /// [`read_lock`](Self::read_lock) of its name takes (its own fence and lease, shared with
    /// other readers). `options` apply to every member.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let reads = client
    ///     .read_lock_all(&["catalog", "prices"], &LockOptions::new())
    ///     .await?;
    /// for (name, fence) in reads.fences() {
    ///     println!("reading {name} under fence {fence}");
    /// }
    /// reads.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock_all`](Self::lock_all): [`Error::InvalidOptions`] for no names, too many, a
    /// name given twice or bad options; [`Error::Busy`] naming the member a writer still held
    /// or waited for at the timeout; the errors of [`read_lock`](Self::read_lock) otherwise.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing (holds taken are released in the background).
    pub async fn read_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<ReadGuard>> {
        self.take_all(
            names,
            options,
            Some(options.timeout),
            "fencelock.read_lock_all",
        )
        .await
    }

    /// Takes a read hold of every read-write lock in `names` as one guard if no writer holds
    /// or waits for any of them now: one attempt per member, in canonical order, no waiting; as
    /// [`read_lock_all`](Self::read_lock_all) otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] naming a member a writer holds or waits for (nothing is left held); as
    /// [`read_lock_all`](Self::read_lock_all) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`read_lock_all`](Self::read_lock_all).
    pub async fn try_read_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<ReadGuard>> {
        self.take_all(names, options, None, "fencelock.try_read_lock_all")
            .await
    }

    /// Takes the write hold of every read-write lock in `names` as one guard, all or nothing,
    /// waiting for up to `options.timeout` in all.
    ///
    /// The members are taken one by one in canonical order (by slot, then key), as
    /// [`read_lock_all`](Self::read_lock_all) does; while a member is awaited it carries this
    /// call's writer intent, as [`write_lock`](Self::write_lock), so new readers of that lock
    /// wait behind it. On failure the holds taken are released and the intent withdrawn.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::LockOptions;
    ///
    /// let writes = client
    ///     .write_lock_all(&["catalog", "prices"], &LockOptions::new())
    ///     .await?;
    /// let fence = writes.fence("prices"); // present it to the prices' storage
    /// # drop(fence);
    /// writes.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`read_lock_all`](Self::read_lock_all); [`Error::Busy`] naming the member still held
    /// (by readers or a writer) at the timeout.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds nothing and leaves no intent (both undone in the
    /// background).
    pub async fn write_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<WriteGuard>> {
        self.take_all(
            names,
            options,
            Some(options.timeout),
            "fencelock.write_lock_all",
        )
        .await
    }

    /// Takes the write hold of every read-write lock in `names` as one guard if each is free
    /// now: one attempt per member, in canonical order, no waiting and no intent left; as
    /// [`write_lock_all`](Self::write_lock_all) otherwise.
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] naming a member held or waited for by another owner (nothing is left
    /// held); as [`write_lock_all`](Self::write_lock_all) otherwise.
    ///
    /// # Cancel safety
    ///
    /// As [`write_lock_all`](Self::write_lock_all).
    pub async fn try_write_lock_all(
        &self,
        names: &[&str],
        options: &LockOptions,
    ) -> Result<MultiGuard<WriteGuard>> {
        self.take_all(names, options, None, "fencelock.try_write_lock_all")
            .await
    }
}
