//! The in-flight undo: what a granting request may have taken is released in the background when
//! the request is dropped (a timeout, a cancelled call) before its reply was read.

use std::sync::Arc;

use crate::core::Core;
use crate::error::Operation;
use crate::held::Scripts;
use crate::script::ScriptCall;
use crate::transport::Transport;

/// While armed, dropping it runs its undo call (a release) in the background.
pub(crate) struct InFlight<'a> {
    transport: &'a Arc<Transport>,
    undo: Undo<'a>,
    /// The weight of the release built when it fires (1 unless [`weighted`](Self::weighted)).
    weight: u32,
    /// What the undo is, as errors and logs name it.
    operation: Operation,
}

/// What an armed [`InFlight`] releases when it fires.
enum Undo<'a> {
    /// Nothing: disarmed.
    None,
    /// A ready call.
    Call(ScriptCall),
    /// `owner`'s hold `hold` (empty for the first) on `key`, released with `kind`'s script; the
    /// call is built only if the undo fires.
    Release {
        core: &'a Core,
        kind: &'static Scripts,
        key: &'a str,
        owner: &'a str,
        hold: &'a str,
    },
}

impl<'a> InFlight<'a> {
    /// Arms `undo` (the release of what the request may grant) until [`disarm`](Self::disarm).
    pub(crate) fn arm(transport: &'a Arc<Transport>, undo: ScriptCall) -> Self {
        Self {
            transport,
            undo: Undo::Call(undo),
            weight: 1,
            operation: Operation::Release,
        }
    }

    /// Arms the release of `owner`'s hold `hold` (empty for the first) on `key` with `kind`'s
    /// release script until [`disarm`](Self::disarm); the call is built only if it fires.
    pub(crate) fn release(
        core: &'a Arc<Core>,
        kind: &'static Scripts,
        key: &'a str,
        owner: &'a str,
        hold: &'a str,
    ) -> Self {
        Self {
            transport: &core.transport,
            undo: Undo::Release {
                core,
                kind,
                key,
                owner,
                hold,
            },
            weight: 1,
            operation: Operation::Release,
        }
    }

    /// Weighs the release an [`InFlight::release`] builds when it fires ([`ScriptCall::weighted`]:
    /// a release that reads many entries); a ready call keeps its own weight.
    pub(crate) fn weighted(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Names the undo in errors and logs (default `release`).
    pub(crate) fn named(mut self, operation: Operation) -> Self {
        self.operation = operation;
        self
    }

    /// Undoes now, for the call on `name`, and waits for Redis to confirm it (best effort: on
    /// failure what it undoes lapses with its lease).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an undo cut after it was sent is still sent (see `Transport::run_undo`).
    pub(crate) async fn now(mut self, name: &str) {
        let Some(call) = self.take() else { return };
        if let Err(err) = self.transport.run_undo(call, name, self.operation).await {
            tracing::debug!(lock = name, error = %err, operation = self.operation.as_str(), "undo failed");
        }
    }

    /// The undo call, leaving it disarmed.
    fn take(&mut self) -> Option<ScriptCall> {
        match std::mem::replace(&mut self.undo, Undo::None) {
            Undo::None => None,
            Undo::Call(call) => Some(call),
            Undo::Release {
                core,
                kind,
                key,
                owner,
                hold,
            } => Some(
                kind.release_call(core, key, owner, hold)
                    .weighted(self.weight),
            ),
        }
    }

    /// The request's reply was read: nothing to undo.
    pub(crate) fn disarm(mut self) {
        self.undo = Undo::None;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(undo) = self.take() {
            self.transport.undo_detached(undo, self.operation);
        }
    }
}
