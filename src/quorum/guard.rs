//! The guard of a held quorum lock: one [`Held`] per node that granted it (each renewed by its
//! deployment's watchdog, released and extended with the mutex's scripts), and the quorum's
//! view of them: valid while a majority of those holds is.
//!
//! `Held` fits as it is: one key per node, one owner token for all, and each node's own
//! watchdog already follows each node's lease; the quorum rules (majority, drift) live here.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::fence::FenceToken;
use crate::held::{Held, Scripts};
use crate::keys::LockKeys;
use crate::options::validate_ttl;
use crate::script::{ScriptCall, EXTEND, RELEASE, RENEW};

use super::race::{gather, Progress, Race};
use super::shared::Shared;

/// The scripts a quorum lock's node holds are released, extended and renewed with: the
/// mutex's.
pub(super) static QUORUM: Scripts = Scripts {
    kind: crate::kind::Kind::Mutex,
    release: &RELEASE,
    extend: &EXTEND,
    renew: &RENEW,
    holder_names_hold: false,
};

/// The margin [`Held`] already takes off a lease besides TTL/100 (`runtime::lease`).
const HELD_MARGIN: Duration = Duration::from_millis(2);

/// The release of an owner token on one node where the guard keeps no hold (the node did not
/// grant in time, or did not answer): sent anyway, since a late grant may sit there.
#[derive(Clone)]
pub(super) struct NodeRelease {
    core: Arc<Core>,
    call: ScriptCall,
}

impl NodeRelease {
    pub(super) fn new(core: &Arc<Core>, keys: &LockKeys, owner: &str) -> Self {
        Self {
            core: Arc::clone(core),
            call: QUORUM.release_call(core, keys.lock_key(), owner, ""),
        }
    }

    /// Runs the release now (bounded by the request timeout); the reply is not looked at. An
    /// undo: it follows the node's calls in flight (see `Transport::run_undo`).
    pub(super) async fn run(&self, name: &str) {
        let call = self.call.clone();
        if let Err(err) = self
            .core
            .transport
            .run_undo(call, name, Operation::Release)
            .await
        {
            tracing::debug!(lock = name, error = %err, "quorum release failed on a node");
        }
    }

    /// Runs the release in the background, as an undo (counted for `Client::shutdown`).
    pub(super) fn detach(self) {
        self.core
            .transport
            .undo_detached(self.call, Operation::Release);
    }
}

/// Proof of holding a quorum lock: a majority of the deployments granted it and confirmed its
/// fence token.
///
/// The guard holds the lock on every node that granted it (at least a majority). It stays
/// valid while a majority of those holds is: [`valid_until`](Self::valid_until) is the time
/// until which a majority of the nodes' leases surely run, less the drift allowance. With
/// `LockOptions::watchdog(true)` every node's lease is renewed by its deployment's watchdog,
/// and [`lost`](Self::lost) resolves once a majority can no longer be confirmed.
///
/// Release it with [`release`](Self::release). Dropping an unreleased guard releases it on
/// every node in the background (on the current Tokio runtime); without a runtime the lock
/// expires after its TTL.
///
/// # Examples
///
/// ```no_run
/// # async fn run(quorum: fencelock::QuorumClient) -> fencelock::Result<()> {
/// use std::time::Duration;
/// use fencelock::LockOptions;
///
/// let mut guard = quorum.lock("jobs:nightly", &LockOptions::new().watchdog(true)).await?;
/// let fence: i64 = guard.fence().into(); // store it with every write
/// tokio::select! {
///     () = tokio::time::sleep(Duration::from_secs(1)) => guard.release().await?,
///     lost = guard.lost() => eprintln!("stopped: {lost}"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
#[clippy::has_significant_drop]
pub struct QuorumGuard {
    name: String,
    fence: FenceToken,
    shared: Arc<Shared>,
    /// One hold per node that granted.
    holds: Vec<Held>,
    /// Releases for the nodes without a hold, sent when the guard is released or dropped.
    others: Vec<NodeRelease>,
    /// The validity the grant had; once no majority is valid, `valid_until` reports the
    /// earlier of it and the moment asked (a past instant either way).
    granted_valid_until: Instant,
}

impl std::fmt::Debug for QuorumGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuorumGuard")
            .field("name", &self.name)
            .field("fence", &self.fence)
            .field("nodes", &self.holds.len())
            .field("valid_until", &self.valid_until())
            .finish_non_exhaustive()
    }
}

impl QuorumGuard {
    pub(super) fn new(
        name: &str,
        fence: FenceToken,
        shared: Arc<Shared>,
        holds: Vec<Held>,
        others: Vec<NodeRelease>,
        valid_until: Instant,
    ) -> Self {
        Self {
            name: name.to_owned(),
            fence,
            shared,
            holds,
            others,
            granted_valid_until: valid_until,
        }
    }

    /// The fence token of this grant: higher than that of every earlier grant of the lock on
    /// any majority. Present it with every write to protected storage.
    pub fn fence(&self) -> FenceToken {
        self.fence
    }

    /// The name the lock was taken under.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many nodes hold the lock for this guard now (at least a majority at the grant).
    pub fn nodes(&self) -> usize {
        self.holds.len()
    }

    /// Until when the lock is surely valid: the time until which a majority of the nodes'
    /// leases surely run (each measured from before its acquire, extend or renewal request was
    /// sent), less the drift allowance (TTL/100 + `QuorumClientBuilder::drift`). A past
    /// instant once no majority is valid.
    pub fn valid_until(&self) -> Instant {
        self.quorum_until()
            .unwrap_or_else(|| self.granted_valid_until.min(Instant::now()))
    }

    /// True while [`valid_until`](Self::valid_until) lies in the future.
    pub fn is_valid(&self) -> bool {
        self.quorum_until()
            .is_some_and(|until| Instant::now() < until)
    }

    /// The majority-th latest end among the valid holds, less the drift beyond [`Held`]'s
    /// own margin; `None` when fewer than a majority are valid.
    fn quorum_until(&self) -> Option<Instant> {
        let mut ends: Vec<Instant> = self
            .holds
            .iter()
            .filter(|held| held.is_valid())
            .map(Held::valid_until)
            .collect();
        let majority = self.shared.majority;
        if ends.len() < majority {
            return None;
        }
        ends.sort_unstable_by(|a, b| b.cmp(a));
        let end = ends[majority - 1];
        let drift = self.shared.drift;
        Some(if drift >= HELD_MARGIN {
            end.checked_sub(drift - HELD_MARGIN).unwrap_or(end)
        } else {
            end + (HELD_MARGIN - drift)
        })
    }

    /// Resolves when a majority of the nodes' holds can no longer be confirmed, with the
    /// reason: with the watchdog, a majority of the renewals failed or found the lock expired
    /// or taken ([`Error::LeaseUnconfirmed`], [`Error::Expired`], [`Error::NotOwner`],
    /// [`Error::RenewalFailed`]) or the maximum hold time passed ([`Error::MaxHoldReached`]);
    /// without it, [`Error::Expired`] at [`valid_until`](Self::valid_until).
    ///
    /// Race it against the work the lock protects, and stop the work when it resolves.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only watches.
    pub async fn lost(&self) -> Error {
        loop {
            let mut woken: Vec<Pin<Box<tokio::sync::futures::Notified<'_>>>> = self
                .holds
                .iter()
                .map(|held| Box::pin(held.core().watchdog.ended().notified()))
                .collect();
            for notified in &mut woken {
                notified.as_mut().enable();
            }
            let until = match self.quorum_until() {
                Some(until) if Instant::now() < until => until,
                _ => return self.loss(),
            };
            let mut woken = Race::new(woken);
            tokio::select! {
                _ = woken.next(), if woken.pending() > 0 => {}
                () = tokio::time::sleep_until(until.into()) => {}
            }
        }
    }

    /// Why the quorum was lost: the most telling reason a node's hold ended with.
    fn loss(&self) -> Error {
        let name = self.name.clone();
        if !self.holds.iter().any(Held::is_watched) {
            return Error::Expired { name };
        }
        let mut reasons = Vec::new();
        let mut context = Context::from_waker(std::task::Waker::noop());
        for held in self.holds.iter().filter(|held| !held.is_valid()) {
            let lost = std::pin::pin!(held.lost());
            if let Poll::Ready(reason) = lost.poll(&mut context) {
                reasons.push(reason);
            }
        }
        let rank = |err: &Error| match err {
            Error::MaxHoldReached { .. } => 0,
            Error::NotOwner { .. } => 1,
            Error::RenewalFailed { .. } => 2,
            Error::Expired { .. } => 3,
            _ => 4,
        };
        reasons.sort_by_key(rank);
        reasons
            .into_iter()
            .next()
            .unwrap_or(Error::LeaseUnconfirmed { name })
    }

    /// Resets the lease to `ttl` on every node that holds it, at once, and returns the new
    /// [`valid_until`](Self::valid_until) once a majority confirmed. Nodes that answer that
    /// they no longer hold it are dropped from the guard.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] or [`Error::NotOwner`] when fewer than a majority extended and some
    /// node said the lock was lost there; [`Error::Timeout`] or [`Error::Redis`] (one node's
    /// error) when fewer than a majority answered in time; [`Error::InvalidOptions`] for a bad
    /// TTL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call leaves the guard usable (leases may or may not have been
    /// reset); `valid_until` keeps the earlier of the old lease end and the one asked for.
    pub async fn extend(&mut self, ttl: Duration) -> Result<Instant> {
        validate_ttl(&self.name, ttl)?;
        let majority = self.shared.majority;
        let started = Instant::now();
        let deadline = started + self.shared.request_timeout + Duration::from_millis(50);
        let mut answers: Vec<(usize, Result<Instant>)> = Vec::new();
        {
            let race = Race::new(self.holds.iter_mut().map(|held| held.extend(ttl)));
            let mut ok = 0;
            gather(race, started, deadline, |index, outcome, pending| {
                ok += usize::from(outcome.is_ok());
                answers.push((index, outcome));
                Progress::toward(majority, ok, pending)
            })
            .await;
        }
        let ok = answers.iter().filter(|(_, a)| a.is_ok()).count();
        let mut gone: Vec<usize> = Vec::new();
        let mut lost = None;
        let mut other = None;
        for (index, answer) in answers {
            match answer {
                Ok(_) => {}
                Err(err) if matches!(err, Error::Expired { .. } | Error::NotOwner { .. }) => {
                    gone.push(index);
                    if lost.is_none() || matches!(err, Error::NotOwner { .. }) {
                        lost = Some(err);
                    }
                }
                Err(err) => other = other.or(Some(err)),
            }
        }
        gone.sort_unstable();
        for index in gone.into_iter().rev() {
            drop(self.holds.remove(index));
        }
        if ok >= majority {
            return Ok(self.valid_until());
        }
        Err(lost.or(other).unwrap_or_else(|| Error::Timeout {
            name: self.name.clone(),
            operation: Operation::QuorumExtend,
            after: started.elapsed(),
        }))
    }

    /// Releases the lock on every node at once (each call bounded by the request timeout;
    /// nodes slower than the others once a majority answered are released in the background).
    /// Stops the watchdog for it.
    ///
    /// # Errors
    ///
    /// [`Error::Expired`] or [`Error::NotOwner`] when fewer than a majority still held it — so
    /// writes made late under this fence may have been rejected; [`Error::Timeout`] or
    /// [`Error::Redis`] when fewer than a majority answered (the leases then run out after
    /// their TTL).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the call is dropped before the nodes answer, the holds' drops release
    /// them in the background.
    pub async fn release(mut self) -> Result<()> {
        for other in std::mem::take(&mut self.others) {
            other.detach();
        }
        let holds = std::mem::take(&mut self.holds);
        let majority = self.shared.majority;
        let started = Instant::now();
        let deadline = started + self.shared.request_timeout + Duration::from_millis(50);
        let race = Race::new(holds.into_iter().map(Held::release));
        let mut ok = 0;
        let mut lost: Option<Error> = None;
        let mut other: Option<Error> = None;
        gather(race, started, deadline, |_, outcome, pending| {
            match outcome {
                Ok(()) => ok += 1,
                Err(err) if err.is_lock_lost() => {
                    if lost.is_none() || matches!(err, Error::NotOwner { .. }) {
                        lost = Some(err);
                    }
                }
                Err(err) => other = other.take().or(Some(err)),
            }
            Progress::toward(majority, ok, pending)
        })
        .await;
        if ok >= majority {
            tracing::debug!(lock = %self.name, fence = %self.fence, "quorum lock released");
            return Ok(());
        }
        Err(lost.or(other).unwrap_or_else(|| Error::Timeout {
            name: self.name.clone(),
            operation: Operation::QuorumRelease,
            after: started.elapsed(),
        }))
    }
}

impl Drop for QuorumGuard {
    fn drop(&mut self) {
        for other in std::mem::take(&mut self.others) {
            other.detach();
        }
        // Each hold releases itself in the background as it drops.
    }
}
