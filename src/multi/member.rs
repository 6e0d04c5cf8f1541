//! What a multi-lock's member is: the public, sealed [`MultiMember`] and the crate's
//! `sealed::Member` behind it (a member's held state and how one member is taken), implemented
//! by the mutex's, the fair lock's and the read-write lock's guards.

use std::sync::Arc;
use std::time::Instant;

use crate::acquire::{self, Request};
use crate::core::Core;
use crate::error::Result;
use crate::fair::{self, FairLockGuard};
use crate::held::Held;
use crate::keys::LockKeys;
use crate::lock::{Acquire, LockGuard};
use crate::options::{instant_after, LockOptions};
use crate::rwlock::{self, ReadGuard, WriteGuard};

/// A lock a multi-lock holds as a member: [`LockGuard`] (a mutex,
/// [`Client::lock_all`](crate::Client::lock_all)), [`FairLockGuard`] (a fair lock,
/// [`Client::fair_lock_all`](crate::Client::fair_lock_all)), [`ReadGuard`] or [`WriteGuard`]
/// (read or write holds of read-write locks,
/// [`Client::read_lock_all`](crate::Client::read_lock_all),
/// [`Client::write_lock_all`](crate::Client::write_lock_all)). Sealed: implemented by those
/// four guards only.
pub trait MultiMember: sealed::Member {}

impl MultiMember for LockGuard {}
impl MultiMember for FairLockGuard {}
impl MultiMember for ReadGuard {}
impl MultiMember for WriteGuard {}

pub(crate) mod sealed {
    use std::future::Future;
    use std::sync::Arc;
    use std::time::Instant;

    use crate::core::Core;
    use crate::error::Result;
    use crate::held::Held;
    use crate::keys::LockKeys;
    use crate::options::LockOptions;

    /// What the multi-lock needs of a member guard: its held state, and how one member is
    /// taken (`deadline` `None`: one attempt).
    #[allow(private_interfaces)]
    pub trait Member: Sized + Send + Sync {
        fn held(&self) -> &Held;
        fn held_mut(&mut self) -> &mut Held;
        fn into_held(self) -> Held;
        fn take<'a>(
            core: &'a Arc<Core>,
            keys: &'a LockKeys,
            options: &'a LockOptions,
            deadline: Option<Instant>,
        ) -> impl Future<Output = Result<Self>> + Send + 'a;
    }
}

/// Waits under `deadline` (`None`: one attempt) for `request`.
pub(super) async fn take_one<R: Request>(
    core: &Arc<Core>,
    request: &R,
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<R::Granted> {
    match deadline {
        None => acquire::once(core, request).await,
        Some(deadline) => {
            acquire::wait_observed(
                core,
                request,
                deadline.saturating_duration_since(Instant::now()),
                options.on_wait.as_ref(),
            )
            .await
        }
    }
}

/// A member's held state, through its guard's own accessors (`held::held_wrapper`).
macro_rules! member_held {
    ($guard:ident) => {
        fn held(&self) -> &Held {
            $guard::held(self)
        }

        fn held_mut(&mut self) -> &mut Held {
            $guard::held_mut(self)
        }

        fn into_held(self) -> Held {
            $guard::into_held(self)
        }
    };
}

// The sealed trait's methods name crate-private types on purpose: nothing outside the crate
// can name or call them.
#[allow(private_interfaces)]
impl sealed::Member for LockGuard {
    member_held!(LockGuard);

    async fn take<'a>(
        core: &'a Arc<Core>,
        keys: &'a LockKeys,
        options: &'a LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Self> {
        take_one(core, &Acquire { keys, options }, options, deadline).await
    }
}

#[allow(private_interfaces)]
impl sealed::Member for FairLockGuard {
    member_held!(FairLockGuard);

    async fn take<'a>(
        core: &'a Arc<Core>,
        keys: &'a LockKeys,
        options: &'a LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Self> {
        let request = fair::Acquire::new(core, keys, options, deadline.is_some());
        let bound = instant_after(
            deadline.unwrap_or_else(Instant::now),
            core.transport.request_timeout(),
        );
        let outcome = take_one(core, &request, options, deadline).await;
        if outcome.is_err() {
            // Within the call's bound; past it the request's drop withdraws in the background.
            let _ = tokio::time::timeout_at(bound.into(), request.withdraw()).await;
        }
        outcome
    }
}

#[allow(private_interfaces)]
impl sealed::Member for ReadGuard {
    member_held!(ReadGuard);

    async fn take<'a>(
        core: &'a Arc<Core>,
        keys: &'a LockKeys,
        options: &'a LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Self> {
        rwlock::take_read(core, keys, options, deadline).await
    }
}

#[allow(private_interfaces)]
impl sealed::Member for WriteGuard {
    member_held!(WriteGuard);

    async fn take<'a>(
        core: &'a Arc<Core>,
        keys: &'a LockKeys,
        options: &'a LockOptions,
        deadline: Option<Instant>,
    ) -> Result<Self> {
        rwlock::take_write(core, keys, options, deadline).await
    }
}
