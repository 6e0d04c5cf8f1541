//! The in-flight undo: what a granting request may have taken is released in the background when
//! the request is dropped (a timeout, a cancelled call) before its reply was read.

use std::sync::Arc;

use crate::script::ScriptCall;
use crate::transport::Transport;

/// While armed, dropping it runs its undo call (a release) in the background.
pub(crate) struct InFlight {
    transport: Arc<Transport>,
    undo: Option<ScriptCall>,
}

impl InFlight {
    /// Arms `undo` (the release of what the request may grant) until [`disarm`](Self::disarm).
    pub(crate) fn arm(transport: &Arc<Transport>, undo: ScriptCall) -> Self {
        Self {
            transport: Arc::clone(transport),
            undo: Some(undo),
        }
    }

    /// The request's reply was read: nothing to undo.
    pub(crate) fn disarm(mut self) {
        self.undo = None;
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(undo) = self.undo.take() {
            self.transport.run_detached(undo, "release");
        }
    }
}
