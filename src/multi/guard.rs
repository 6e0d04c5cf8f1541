//! The guard of a held multi-lock: [`MultiGuard`], one member guard per name, in the caller's
//! order.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::fence::FenceToken;
use crate::held::Held;
use crate::lock::LockGuard;

use super::member::MultiMember;

/// Proof of holding several locks at once (a multi-lock), each with its own fence token.
///
/// Made by [`Client::lock_all`](crate::Client::lock_all) or
/// [`Client::try_lock_all`](crate::Client::try_lock_all) (members are mutexes, the default
/// `G`), or by [`Client::fair_lock_all`](crate::Client::fair_lock_all) or
/// [`Client::try_fair_lock_all`](crate::Client::try_fair_lock_all) (members are fair locks:
/// `MultiGuard<FairLockGuard>`). [`release`](Self::release) frees them all. Dropping an
/// unreleased guard releases every member in the background on the current Tokio runtime
/// (when there is one).
///
/// # Examples
///
/// ```no_run
/// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
/// use fencelock::LockOptions;
///
/// let guard = client.lock_all(&["acct:1", "acct:2"], &LockOptions::new()).await?;
/// for (name, fence) in guard.fences() {
///     println!("{name}: {fence}"); // present each fence to the storage of its resource
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the locks at once"]
#[clippy::has_significant_drop]
pub struct MultiGuard<G: MultiMember = LockGuard> {
    /// The members, in the caller's order.
    members: Vec<G>,
}

impl<G: MultiMember> std::fmt::Debug for MultiGuard<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiGuard")
            .field("fences", &self.fences())
            .field("valid_until", &self.valid_until())
            .finish_non_exhaustive()
    }
}

impl<G: MultiMember> MultiGuard<G> {
    /// The guard over `members`, in the caller's order.
    pub(super) fn new(members: Vec<G>) -> Self {
        Self { members }
    }

    /// The names held, in the order the caller gave.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|m| m.held().name())
    }

    /// Each name with its fence token, in the order the caller gave. Each lock keeps its own
    /// fence: present a member's fence to the storage that lock protects.
    pub fn fences(&self) -> Vec<(&str, FenceToken)> {
        self.members
            .iter()
            .map(|m| (m.held().name(), m.held().fence()))
            .collect()
    }

    /// The fence token of member `name`, or `None` when it is not a member.
    pub fn fence(&self, name: &str) -> Option<FenceToken> {
        self.member(name).map(|m| m.held().fence())
    }

    /// The guard of member `name`, or `None` when it is not a member.
    pub fn member(&self, name: &str) -> Option<&G> {
        self.members.iter().find(|m| m.held().name() == name)
    }

    /// Until when every member is surely valid: the earliest of the members'
    /// [`LockGuard::valid_until`].
    pub fn valid_until(&self) -> Instant {
        self.members
            .iter()
            .map(|m| m.held().valid_until())
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// True while every member is valid ([`LockGuard::is_valid`]).
    pub fn is_valid(&self) -> bool {
        self.members.iter().all(|m| m.held().is_valid())
    }

    /// Resolves when any member can no longer be relied on, with the first member's reason
    /// (see [`LockGuard::lost`]; the error names the member).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> Error {
        let mut watching: Vec<Pin<Box<dyn Future<Output = Error> + Send + '_>>> = self
            .members
            .iter()
            .map(|m| Box::pin(m.held().lost()) as Pin<Box<dyn Future<Output = Error> + Send + '_>>)
            .collect();
        std::future::poll_fn(|cx| {
            for lost in &mut watching {
                if let Poll::Ready(err) = lost.as_mut().poll(cx) {
                    return Poll::Ready(err);
                }
            }
            Poll::Pending
        })
        .await
    }

    /// Resets every member's TTL to `ttl` (see [`LockGuard::extend`]) and returns the new
    /// [`valid_until`](Self::valid_until).
    ///
    /// # Errors
    ///
    /// The first member's error ([`Error::Expired`], [`Error::NotOwner`], ...); the members
    /// after it are not extended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockGuard::extend`].
    pub async fn extend(&mut self, ttl: Duration) -> Result<Instant> {
        for member in &mut self.members {
            member.held_mut().extend(ttl).await?;
        }
        Ok(self.valid_until())
    }

    /// Releases every member (see [`LockGuard::release`]).
    ///
    /// # Errors
    ///
    /// The first member's error, in the caller's order ([`Error::Expired`] or
    /// [`Error::NotOwner`] when that lock was lost); every member is released all the same.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: members not yet released when the call is dropped are released in the
    /// background.
    pub async fn release(self) -> Result<()> {
        Held::release_together(self.members.into_iter().map(G::into_held)).await
    }
}
