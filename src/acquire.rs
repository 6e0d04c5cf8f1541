//! Acquiring: what a request in flight leaves behind when it is dropped, and releases handed to
//! the background.

use std::sync::Arc;

use crate::core::Core;
use crate::error::Result;
use crate::script::{parse_reply, ScriptCall, RELEASE};

/// Releases `owner`'s hold `hold` (empty for the first) on `lock_key`: `1` released, `0`
/// expired, `-1` held by another.
pub(crate) async fn release_owner(
    core: &Arc<Core>,
    lock_key: &str,
    owner: &str,
    hold: &str,
) -> Result<i64> {
    let reply = core
        .transport
        .run(
            &ScriptCall::new(
                &RELEASE,
                &[lock_key],
                &[owner, hold, core.transport.announce(), core.expiry()],
            ),
            lock_key,
            "release",
        )
        .await?;
    parse_reply(lock_key, "release", reply)
}

/// While armed, dropping it (a timeout or a cancelled call) releases what an acquire or
/// re-enter request in flight may have taken, in the background.
pub(crate) struct InFlight<'a> {
    core: &'a Arc<Core>,
    lock_key: &'a str,
    owner: &'a str,
    hold: &'a str,
    armed: bool,
}

impl<'a> InFlight<'a> {
    pub(crate) fn arm(core: &'a Arc<Core>, lock_key: &'a str, owner: &'a str) -> Self {
        Self {
            core,
            lock_key,
            owner,
            hold: "",
            armed: true,
        }
    }

    /// For a re-entry: release only the hold `hold`.
    pub(crate) fn with_hold(mut self, hold: &'a str) -> Self {
        self.hold = hold;
        self
    }

    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.armed {
            release_in_background(
                Arc::clone(self.core),
                self.lock_key.to_owned(),
                self.owner.to_owned(),
                self.hold.to_owned(),
            );
        }
    }
}

/// Hands a release to the current runtime, if there is one; never blocks or panics.
pub(crate) fn release_in_background(
    core: Arc<Core>,
    lock_key: String,
    owner: String,
    hold: String,
) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            if let Err(err) = release_owner(&core, &lock_key, &owner, &hold).await {
                tracing::debug!(lock = lock_key, error = %err, "background release failed");
            }
        });
    }
}
