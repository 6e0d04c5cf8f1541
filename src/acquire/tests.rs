//! The wait loop driven with a fake request under tokio's paused time: no server, no I/O.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{drive, Attempt, Listen, Local, Waiter, RECHECK};
use crate::error::{Error, Operation, Result};
use crate::runtime::wakeups::Readiness;

const MS: Duration = Duration::from_millis(1);
const REQUEST_TIMEOUT: Duration = Duration::from_millis(1000);

/// Where a fake request can be stopped (to cancel the call there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting in the client's local queue.
    Local,
    /// An attempt in flight: its undo armed.
    Attempt,
    /// Waiting for the subscription to be made.
    Ready,
    /// Subscribed, waiting for a wake-up.
    Wait,
}

/// What the fake request and its listeners record.
#[derive(Default)]
struct Record {
    attempts: AtomicU32,
    /// Attempts cut while in flight, whose undo ran.
    undone: AtomicU32,
    /// Grants handed out and not dropped yet.
    held: Arc<AtomicU32>,
    listeners: AtomicU32,
    listeners_dropped: Arc<AtomicU32>,
    woken: AtomicU32,
}

/// A test-only request: answers from `replies` (then busy for 10 s), optionally subscribed
/// through a [`FakeListener`], and stops for good at `stop_at`, announcing it on `stopped`.
struct Fake {
    replies: Mutex<VecDeque<Reply>>,
    /// `None`: wake-ups off (polling).
    listening: Option<Readiness>,
    release: Arc<Notify>,
    stop_at: Option<Stage>,
    stopped: Notify,
    record: Record,
}

#[derive(Clone, Copy)]
enum Reply {
    Granted,
    Busy(Duration),
    Transient,
    /// Never answers.
    Hang,
}

/// A grant: counted in `held` until dropped.
struct Grant(Arc<AtomicU32>);

impl Drop for Grant {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The fake attempt's undo: counts in `undone` when dropped armed.
struct Armed<'a>(Option<&'a AtomicU32>);

impl Drop for Armed<'_> {
    fn drop(&mut self) {
        if let Some(undone) = self.0 {
            undone.fetch_add(1, Ordering::SeqCst);
        }
    }
}

struct FakeListener<'a> {
    fake: &'a Fake,
    dropped: Arc<AtomicU32>,
}

impl Drop for FakeListener<'_> {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

impl Listen for FakeListener<'_> {
    async fn ready(&mut self, _limit: Duration) -> Readiness {
        self.fake.stage(Stage::Ready).await;
        self.fake.listening.expect("subscribed")
    }

    async fn wait(&mut self, pause: Duration) -> bool {
        self.fake.stage(Stage::Wait).await;
        tokio::select! {
            () = self.fake.release.notified() => true,
            () = tokio::time::sleep(pause) => false,
        }
    }
}

impl Fake {
    fn new(replies: &[Reply], listening: Option<Readiness>) -> Self {
        Self {
            replies: Mutex::new(replies.iter().copied().collect()),
            listening,
            release: Arc::default(),
            stop_at: None,
            stopped: Notify::new(),
            record: Record::default(),
        }
    }

    fn stopping_at(mut self, stage: Stage) -> Self {
        self.stop_at = Some(stage);
        self
    }

    /// Stops here for good if this is the stage to stop at.
    async fn stage(&self, stage: Stage) {
        if self.stop_at == Some(stage) {
            self.stopped.notify_one();
            std::future::pending::<()>().await;
        }
    }

    fn count(counter: &AtomicU32) -> u32 {
        counter.load(Ordering::SeqCst)
    }
}

impl<'f> Waiter for &'f Fake {
    type Granted = Grant;
    type Listener = FakeListener<'f>;

    fn name(&self) -> &str {
        "fake"
    }

    fn busy(&self, waited: Duration, retry_after: Duration) -> Error {
        Error::Busy {
            name: "fake".to_owned(),
            waited,
            retry_after,
        }
    }

    fn request_timeout(&self) -> Duration {
        REQUEST_TIMEOUT
    }

    async fn wait_local(&self, _until: Instant) -> Local<Grant> {
        self.stage(Stage::Local).await;
        Local::NotHeld
    }

    async fn attempt(&self) -> Result<Attempt<Grant>> {
        self.record.attempts.fetch_add(1, Ordering::SeqCst);
        let mut armed = Armed(Some(&self.record.undone));
        self.stage(Stage::Attempt).await;
        let reply = self.replies.lock().unwrap().pop_front();
        let outcome = match reply.unwrap_or(Reply::Busy(10_000 * MS)) {
            Reply::Granted => {
                self.record.held.fetch_add(1, Ordering::SeqCst);
                Ok(Attempt::Granted(Grant(Arc::clone(&self.record.held))))
            }
            Reply::Busy(retry_after) => Ok(Attempt::Busy { retry_after }),
            Reply::Transient => Err(Error::Timeout {
                name: "fake".to_owned(),
                operation: Operation::Acquire,
                after: REQUEST_TIMEOUT,
            }),
            Reply::Hang => std::future::pending().await,
        };
        armed.0 = None;
        outcome
    }

    fn subscribe(&self) -> Option<FakeListener<'f>> {
        self.listening?;
        self.record.listeners.fetch_add(1, Ordering::SeqCst);
        Some(FakeListener {
            fake: self,
            dropped: Arc::clone(&self.record.listeners_dropped),
        })
    }

    fn granted_after(&self, _waited: Duration) {}

    fn woken(&self) {
        self.record.woken.fetch_add(1, Ordering::SeqCst);
    }
}

fn waited(err: &Error) -> Duration {
    match err {
        Error::Busy { waited, .. } => *waited,
        other => panic!("expected Busy, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn gives_up_exactly_at_the_deadline() {
    for listening in [None, Some(Readiness::Ready)] {
        let fake = Fake::new(&[], listening);
        let started = Instant::now();
        let err = drive(&&fake, 1000 * MS, None).await.err().expect("busy");
        // The last attempt is made at the deadline, not before it and not a pause after it.
        assert_eq!(waited(&err), 1000 * MS, "{listening:?}");
        assert_eq!(started.elapsed(), 1000 * MS, "{listening:?}");
        assert!(Fake::count(&fake.record.attempts) > 2);
    }
}

#[tokio::test(start_paused = true)]
async fn zero_timeout_makes_one_attempt() {
    let fake = Fake::new(&[], Some(Readiness::Ready));
    let err = drive(&&fake, Duration::ZERO, None)
        .await
        .err()
        .expect("busy");
    assert_eq!(waited(&err), Duration::ZERO);
    assert_eq!(Fake::count(&fake.record.attempts), 1);
    assert_eq!(Fake::count(&fake.record.listeners), 0);
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_shortens_the_wait() {
    let fake = Fake::new(
        &[
            Reply::Busy(10_000 * MS),
            Reply::Busy(10_000 * MS),
            Reply::Granted,
        ],
        Some(Readiness::Ready),
    );
    let release = Arc::clone(&fake.release);
    let started = Instant::now();
    let releaser = tokio::spawn(async move {
        tokio::time::sleep(40 * MS).await;
        release.notify_one();
    });
    let grant = drive(&&fake, 60_000 * MS, None).await.expect("granted");
    // Busy, subscribed, busy again, then woken at 40 ms: well before the re-check period.
    assert_eq!(started.elapsed(), 40 * MS);
    assert!(40 * MS < RECHECK);
    assert_eq!(Fake::count(&fake.record.woken), 1);
    assert_eq!(Fake::count(&fake.record.attempts), 3);
    assert_eq!(Fake::count(&fake.record.held), 1);
    drop(grant);
    releaser.await.unwrap();
    assert_eq!(Fake::count(&fake.record.listeners_dropped), 1);
}

#[tokio::test(start_paused = true)]
async fn a_short_lease_is_tried_again_at_its_end() {
    let fake = Fake::new(
        &[Reply::Busy(30 * MS), Reply::Busy(30 * MS), Reply::Granted],
        Some(Readiness::Ready),
    );
    let started = Instant::now();
    let _grant = drive(&&fake, 60_000 * MS, None).await.expect("granted");
    // Retried at the lease end plus at most 2 ms of jitter, without a wake-up.
    let elapsed = started.elapsed();
    assert!(elapsed >= 30 * MS && elapsed <= 33 * MS, "{elapsed:?}");
    assert_eq!(Fake::count(&fake.record.woken), 0);
}

#[tokio::test(start_paused = true)]
async fn transient_errors_back_off_then_succeed() {
    let fake = Fake::new(
        &[Reply::Transient, Reply::Transient, Reply::Granted],
        Some(Readiness::Ready),
    );
    let started = Instant::now();
    let _grant = drive(&&fake, 60_000 * MS, None).await.expect("granted");
    // Two backoff pauses: 2.5-5 ms then 5-10 ms (each rounded up to the timer's millisecond).
    let elapsed = started.elapsed();
    assert!(elapsed >= 7 * MS && elapsed <= 17 * MS, "{elapsed:?}");
    assert_eq!(Fake::count(&fake.record.listeners), 0);
}

#[tokio::test(start_paused = true)]
async fn a_hung_attempt_is_cut_at_the_outer_bound_and_undone() {
    let fake = Fake::new(&[Reply::Hang], None);
    let started = Instant::now();
    let err = drive(&&fake, 500 * MS, None).await.err().expect("timeout");
    assert!(
        matches!(err, Error::Timeout { after, .. } if after == 500 * MS + REQUEST_TIMEOUT),
        "{err:?}"
    );
    assert_eq!(started.elapsed(), 500 * MS + REQUEST_TIMEOUT);
    assert_eq!(Fake::count(&fake.record.undone), 1);
}

#[tokio::test(start_paused = true)]
async fn cancelling_at_every_stage_leaves_nothing_held() {
    for stage in [Stage::Local, Stage::Attempt, Stage::Ready, Stage::Wait] {
        let fake = Fake::new(&[], Some(Readiness::Ready)).stopping_at(stage);
        {
            let waiter = &fake;
            let call = drive(&waiter, 60_000 * MS, None);
            tokio::pin!(call);
            tokio::select! {
                biased;
                outcome = &mut call => panic!("{stage:?}: ended with {:?}", outcome.err()),
                () = fake.stopped.notified() => {}
            }
            // Dropped here, stopped at `stage`.
        }
        let in_flight = u32::from(stage == Stage::Attempt);
        assert_eq!(Fake::count(&fake.record.undone), in_flight, "{stage:?}");
        assert_eq!(Fake::count(&fake.record.held), 0, "{stage:?}");
        assert_eq!(
            Fake::count(&fake.record.listeners_dropped),
            Fake::count(&fake.record.listeners),
            "{stage:?}: a registration outlived the call"
        );
    }
}
