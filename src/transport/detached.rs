//! The calls that finish after their caller: the undo of a call cut while in flight, sent
//! after its node's rounds in flight ([`Transport::run_undo`]), and background calls nobody
//! awaits ([`Transport::run_detached`], [`Transport::undo_detached`]), counted until they end so
//! that [`Transport::settle`] can wait for them.

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::error::{Error, Operation, Result};
use crate::script::ScriptCall;

use super::Transport;

/// Counts one background call until it is dropped (finished, failed, or cancelled by a runtime
/// shutting down).
struct DetachedTicket(Arc<Transport>);

impl Drop for DetachedTicket {
    fn drop(&mut self) {
        self.0.detached.fetch_sub(1, Ordering::AcqRel);
        self.0.detached_done.notify_waiters();
    }
}

impl Transport {
    /// As [`run`](Self::run) for an undo: queued on a node's driver, it is sent only after the
    /// driver's rounds in flight have been answered (resends after `NOSCRIPT` or a moved key
    /// included), so it does not overtake the call it undoes when that went through the same
    /// driver. Its reply is awaited for one request timeout, as any call's; an undo given up
    /// on stays queued and is still sent.
    pub(crate) async fn run_undo(
        self: &Arc<Self>,
        call: ScriptCall,
        name: &str,
        operation: Operation,
    ) -> Result<Value> {
        self.undo_within(call, name, operation, Some(self.request_timeout))
            .await
    }

    /// [`run_undo`](Self::run_undo), its reply awaited for `limit`, or (`None`) until the
    /// driver answers: its rounds are bounded, and a driver that ends drops what it holds. Where
    /// no driver takes it (batching off, a cluster's slot map not read yet), a bounded undo runs
    /// in a task of its own, so that it is sent even when its caller is cut first (in its
    /// caller's future when no Tokio runtime is there to spawn on).
    async fn undo_within(
        self: &Arc<Self>,
        call: ScriptCall,
        name: &str,
        operation: Operation,
        limit: Option<Duration>,
    ) -> Result<Value> {
        let timeout = || Error::Timeout {
            name: name.to_owned(),
            operation,
            after: limit.unwrap_or(self.request_timeout),
        };
        match self.enqueue_undo(Cow::Owned(call), name, operation) {
            Ok(reply) => match limit {
                Some(limit) => match tokio::time::timeout(limit, reply).await {
                    Ok(Ok(outcome)) => outcome,
                    Ok(Err(_)) | Err(_) => Err(timeout()),
                },
                None => reply.await.unwrap_or_else(|_| Err(timeout())),
            },
            Err(call) if limit.is_some() && tokio::runtime::Handle::try_current().is_ok() => {
                // No driver: sent from a task of its own, since redis-rs leaves out a queued
                // command whose caller is gone, and a caller cut while it waits here must not
                // take the undo with it.
                let (sent, reply) = tokio::sync::oneshot::channel();
                let transport = Arc::clone(self);
                let key = name.to_owned();
                self.spawn_detached(async move {
                    let _ = sent.send(transport.run_alone(&call, &key, operation).await);
                });
                reply.await.unwrap_or_else(|_| Err(timeout()))
            }
            Err(call) => self.run_alone(&call, name, operation).await,
        }
    }

    /// Hands `call` to the current runtime, if there is one, to run in the background (a
    /// release nobody awaits); never blocks or panics. A failure is only logged.
    pub(crate) fn run_detached(self: &Arc<Self>, call: ScriptCall, operation: Operation) {
        let transport = Arc::clone(self);
        self.spawn_detached(async move {
            let key = call.first_key();
            if let Err(err) = transport.run(&call, key, operation).await {
                tracing::debug!(lock = key, error = %err, "background {operation} failed");
            }
        });
    }

    /// As [`run_detached`](Self::run_detached) for the undo of a call cut while in flight (see
    /// [`run_undo`](Self::run_undo)): counted for [`settle`](Self::settle) until the driver
    /// has answered it, however long the rounds before it take.
    pub(crate) fn undo_detached(self: &Arc<Self>, call: ScriptCall, operation: Operation) {
        let transport = Arc::clone(self);
        self.spawn_detached(async move {
            let key = call.first_key().to_owned();
            if let Err(err) = transport.undo_within(call, &key, operation, None).await {
                tracing::debug!(lock = key, error = %err, "background {operation} failed");
            }
        });
    }

    /// Hands `task` (background calls nobody awaits) to the current runtime, if there is one,
    /// counted in [`detached`](Self::detached) until it ends.
    pub(crate) fn spawn_detached(
        self: &Arc<Self>,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.detached.fetch_add(1, Ordering::AcqRel);
            let ticket = DetachedTicket(Arc::clone(self));
            runtime.spawn(async move {
                let _ticket = ticket;
                task.await;
            });
        }
    }

    /// Background calls started by [`run_detached`](Self::run_detached) and not finished yet.
    pub(crate) fn detached(&self) -> usize {
        self.detached.load(Ordering::Acquire)
    }

    /// Waits until every background call has finished, or `limit` has passed. Returns how many
    /// are still running (0 when all finished).
    ///
    /// Each background call is itself bounded by the request timeout, so a `limit` of one
    /// request timeout covers every call started before this one, but for an undo that waits
    /// behind its driver's slow rounds (then more are reported pending).
    pub(crate) async fn settle(&self, limit: Duration) -> usize {
        let all_done = async {
            loop {
                let notified = self.detached_done.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.detached() == 0 {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(limit, all_done).await;
        self.detached()
    }
}
