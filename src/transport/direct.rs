//! Calls sent past their node's driver while their lane, or their slot's bucket of it, is quiet
//! ([`Transport::queue`]): a lone call (one task's loop of locks, a hot lock's waiting process)
//! skips the driver's queue, its task hop and the caller's second timer, about a fifth of the
//! client's work per call.
//!
//! A lane is quiet when nothing is queued on its driver, in flight there or sent directly and
//! unanswered ([`LaneState`]). A call the module serves on a cluster node needs only its
//! bucket of the lane (its slot's share, [`BUCKETS`] per lane) to be quiet: the driver would
//! send it alone anyway (a batched module command carries the keys of one slot, and calls on
//! random names seldom share one), so under load such calls go out from their callers, one by
//! one, as they would from the driver. A direct call is handed to the connection before
//! [`Transport::queue`] returns (its first poll), so every call of its bucket queued after it,
//! directly or through the driver (which the call makes busy), reaches Redis after it, as
//! through the driver. A direct call dropped unanswered runs on in the background
//! ([`Transport::spawn_detached`]) and the driver sends an undo only once the direct calls of
//! the undo's bucket (of its lane, on a standalone server) are answered, resends included: an
//! undo never overtakes the call it undoes.
//!
//! A direct call moves on only when its caller polls it. Both its steps are held to one
//! deadline, the request timeout from its first poll: its second step (the script's source
//! after `NOSCRIPT`, the script after the module's `-FALLBACK`) is not sent once that deadline
//! has passed (`eval::before`), so a caller that stopped polling and comes back late gets the
//! timeout without a grant sent then. (Its ticket is still kept until the caller polls it to
//! its end or drops it, holding back its bucket's undos meanwhile: releasing it earlier would
//! let an undo overtake a resend redis-rs may still make.)

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use redis::Value;
use tokio::sync::Notify;

use crate::error::{Operation, Result};
use crate::script::ScriptCall;

use super::Transport;

/// Slot buckets per lane on a cluster: the keys of one slot share a bucket, so a call's order
/// with the earlier calls of its keys is kept per bucket.
pub(super) const BUCKETS: usize = 256;

/// What one lane (a node's driver and the calls sent past it) has unanswered, in all and, on
/// a cluster, per slot bucket.
pub(super) struct LaneState {
    /// Calls queued on the driver or sent directly and not yet answered (or dropped).
    busy: AtomicUsize,
    /// Direct calls not yet answered (a lane without buckets).
    direct: AtomicUsize,
    /// Per bucket, on a cluster (none on a standalone server, whose calls all keep the lane's
    /// order): its calls queued, in flight or direct, and its direct calls unanswered.
    buckets: Box<[Bucket]>,
    /// Notified whenever the last direct call in flight (of a bucket, or of a lane without
    /// buckets) is answered.
    direct_done: Notify,
}

#[derive(Default)]
struct Bucket {
    busy: AtomicUsize,
    direct: AtomicUsize,
}

impl LaneState {
    /// A lane with nothing unanswered, with slot buckets (`per_bucket`, on a cluster) or not.
    pub(super) fn new(per_bucket: bool) -> Self {
        let buckets = if per_bucket { BUCKETS } else { 0 };
        Self {
            busy: AtomicUsize::new(0),
            direct: AtomicUsize::new(0),
            buckets: (0..buckets).map(|_| Bucket::default()).collect(),
            direct_done: Notify::new(),
        }
    }

    /// Bucket number `bucket`, `None` in a lane without buckets.
    fn bucket(&self, bucket: usize) -> Option<&Bucket> {
        let count = self.buckets.len();
        (count > 0).then(|| &self.buckets[bucket % count])
    }

    /// The count of unanswered direct calls that bucket `bucket`'s undos wait for: the
    /// bucket's, or the lane's without buckets.
    fn direct_count(&self, bucket: usize) -> &AtomicUsize {
        self.bucket(bucket).map_or(&self.direct, |at| &at.direct)
    }

    /// Claims the quiet lane for one direct call of bucket `bucket`, if the lane is quiet.
    pub(super) fn try_direct(self: &Arc<Self>, bucket: usize) -> Option<DirectTicket> {
        self.busy
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        if let Some(at) = self.bucket(bucket) {
            at.busy.fetch_add(1, Ordering::AcqRel);
        }
        self.direct_count(bucket).fetch_add(1, Ordering::AcqRel);
        Some(DirectTicket(Arc::clone(self), bucket))
    }

    /// Claims the quiet bucket `bucket` for one direct call, if the lane has buckets and that
    /// one is quiet, whatever the rest of the lane has unanswered.
    pub(super) fn try_direct_in_bucket(self: &Arc<Self>, bucket: usize) -> Option<DirectTicket> {
        let at = self.bucket(bucket)?;
        at.busy
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        at.direct.fetch_add(1, Ordering::AcqRel);
        self.busy.fetch_add(1, Ordering::AcqRel);
        Some(DirectTicket(Arc::clone(self), bucket))
    }

    /// Counts a call of bucket `bucket` queued on the lane's driver until the ticket drops
    /// (answered, or left out).
    pub(super) fn queued(self: &Arc<Self>, bucket: usize) -> BusyTicket {
        self.busy.fetch_add(1, Ordering::AcqRel);
        if let Some(at) = self.bucket(bucket) {
            at.busy.fetch_add(1, Ordering::AcqRel);
        }
        BusyTicket(Arc::clone(self), bucket)
    }

    /// Waits until no direct call of the buckets `buckets` (of the lane, without buckets) is in
    /// flight (none can start meanwhile: the caller's queued undos keep their buckets and the
    /// lane busy).
    pub(super) async fn directs_answered(self: Arc<Self>, buckets: Vec<usize>) {
        loop {
            let notified = self.direct_done.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if buckets
                .iter()
                .all(|&bucket| self.direct_count(bucket).load(Ordering::Acquire) == 0)
            {
                return;
            }
            notified.await;
        }
    }
}

/// A call queued on a lane's driver, counted as busy (in its lane and bucket) until dropped.
pub(super) struct BusyTicket(Arc<LaneState>, usize);

impl BusyTicket {
    /// The slot bucket number of the call.
    pub(super) fn bucket(&self) -> usize {
        self.1
    }
}

impl Drop for BusyTicket {
    fn drop(&mut self) {
        if let Some(at) = self.0.bucket(self.1) {
            at.busy.fetch_sub(1, Ordering::AcqRel);
        }
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A direct call, counted as busy and direct (in its lane and bucket) until dropped.
pub(super) struct DirectTicket(Arc<LaneState>, usize);

impl Drop for DirectTicket {
    fn drop(&mut self) {
        let lane = &self.0;
        if lane.direct_count(self.1).fetch_sub(1, Ordering::AcqRel) == 1 {
            lane.direct_done.notify_waiters();
        }
        if let Some(at) = lane.bucket(self.1) {
            at.busy.fetch_sub(1, Ordering::AcqRel);
        }
        lane.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

type Call = Pin<Box<dyn Future<Output = Result<Value>> + Send>>;

/// The reply of a direct call: awaiting it drives the call, which already went to the
/// connection.
pub(crate) struct Direct {
    call: Option<Call>,
    transport: Arc<Transport>,
}

impl Direct {
    /// Starts `call` on its own past the driver (as [`Transport::run_alone`]) and hands it to
    /// the connection before returning.
    pub(super) fn start(
        transport: &Arc<Transport>,
        call: ScriptCall,
        name: &str,
        operation: Operation,
        ticket: DirectTicket,
    ) -> Self {
        let name = name.to_owned();
        let sender = Arc::clone(transport);
        // Unconstrained: the runtime's cooperative budget must not make the first poll return
        // before the call is written.
        let mut call: Call = Box::pin(tokio::task::unconstrained(async move {
            let outcome = sender.run_alone(&call, &name, operation).await;
            drop(ticket);
            outcome
        }));
        // The first poll writes the call to the connection's queue; the caller's await polls
        // it again with its own waker.
        let first = call.as_mut().poll(&mut Context::from_waker(Waker::noop()));
        let call = match first {
            Poll::Ready(outcome) => Box::pin(std::future::ready(outcome)),
            Poll::Pending => call,
        };
        Self {
            call: Some(call),
            transport: Arc::clone(transport),
        }
    }
}

impl Future for Direct {
    type Output = Result<Value>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(call) = self.call.as_mut() else {
            return Poll::Pending;
        };
        let outcome = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(outcome)
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            // Dropped unanswered: the call may be on its way (or resent), so it runs to its
            // end, keeping the lane's undos behind it.
            self.transport.spawn_detached(async move {
                let _ = call.await;
            });
        }
    }
}
