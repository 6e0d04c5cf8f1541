//! What a multi-lock's member is: the public, sealed [`MultiMember`] and the crate's
//! `sealed::Member` behind it (a member's held state and how one member is taken), implemented
//! by the mutex's, the fair lock's and the read-write lock's guards.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use crate::acquire::{self, Request};
use crate::core::Core;
use crate::error::Result;
use crate::fair::{self, FairLockGuard};
use crate::held::Held;
use crate::keys::LockKeys;
use crate::lock::{Acquire, LockGuard};
use crate::options::LockOptions;
use crate::rwlock::{self, ReadGuard, WriteGuard};

/// A lock a multi-lock holds as a member: [`LockGuard`] (a mutex,
/// [`Client::lock_all`](crate::Client::lock_all)), [`FairLockGuard`] (a fair lock,
/// [`Client::fair_lock_all`](crate::Client::fair_lock_all)), [`ReadGuard`] or [`WriteGuard`]
/// (read or write holds of read-write locks,
/// [`Client::read_lock_all`](crate::Client::read_lock_all),
/// [`Client::write_lock_all`](crate::Client::write_lock_all)). Sealed: implemented by those
/// four guards only.
pub trait MultiMember: sealed::Member {}

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

/// `$guard` as a member: its held state through its own accessors (`held::held_wrapper`), one
/// member taken by `$take`.
macro_rules! member {
    ($guard:ident, $take:path) => {
        impl MultiMember for $guard {}

        // The sealed trait's methods name crate-private types on purpose: nothing outside the
        // crate can name or call them.
        #[allow(private_interfaces)]
        impl sealed::Member for $guard {
            fn held(&self) -> &Held {
                $guard::held(self)
            }

            fn held_mut(&mut self) -> &mut Held {
                $guard::held_mut(self)
            }

            fn into_held(self) -> Held {
                $guard::into_held(self)
            }

            fn take<'a>(
                core: &'a Arc<Core>,
                keys: &'a LockKeys,
                options: &'a LockOptions,
                deadline: Option<Instant>,
            ) -> impl Future<Output = Result<Self>> + Send + 'a {
                $take(core, keys, options, deadline)
            }
        }
    };
}

member!(LockGuard, take_mutex);
member!(FairLockGuard, take_fair);
member!(ReadGuard, rwlock::take_read);
member!(WriteGuard, rwlock::take_write);

/// Takes one mutex member.
async fn take_mutex(
    core: &Arc<Core>,
    keys: &LockKeys,
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<LockGuard> {
    take_one(core, &Acquire::new(keys, options), options, deadline).await
}

/// Takes one fair-lock member; on failure its place in the queue is withdrawn.
async fn take_fair(
    core: &Arc<Core>,
    keys: &LockKeys,
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<FairLockGuard> {
    let request = fair::Acquire::new(core, keys, options, deadline.is_some());
    let until = deadline.unwrap_or_else(Instant::now);
    let outcome = take_one(core, &request, options, deadline).await;
    if outcome.is_err() {
        acquire::undo_within_bound(core, until, request.withdraw()).await;
    }
    outcome
}
