//! One attempt at a quorum lock: the acquire round on every node at once, the commit round on
//! the granting majority, and the undo that releases the attempt's owner token everywhere when
//! it fails or is dropped.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::fence::FenceToken;
use crate::held::{Grant, Held};
use crate::keys::LockKeys;
use crate::options::{instant_after, LockOptions};
use crate::script::{
    parse_fence, parse_reply, ttl_millis, ScriptCall, ACQUIRE, ACQUIRE_FLOOR, QUORUM_COMMIT,
};

use super::guard::{NodeRelease, QuorumGuard, QUORUM};
use super::race::{gather, Progress, Race};
use super::shared::Shared;

/// Why one attempt was not granted.
pub(super) enum Refused {
    /// Enough nodes answered, but too few granted: others hold the lock on some of them; the
    /// longest remaining lease they reported.
    Busy { retry_after: Duration },
    /// Fewer than a majority answered in time (down, paused, slow), or the validity ran out.
    Unanswered,
}

/// One attempt: both rounds under a fresh owner token.
pub(super) async fn attempt(
    shared: &Arc<Shared>,
    name: &str,
    options: &LockOptions,
) -> Result<std::result::Result<QuorumGuard, Refused>> {
    let count = shared.deployments.len();
    let majority = shared.majority;
    let mut nodes: Vec<Option<(Arc<Core>, LockKeys)>> = Vec::with_capacity(count);
    for index in 0..count {
        nodes.push(match shared.client(index) {
            Some(client) => Some((Arc::clone(client.core()), client.keys(name, options)?)),
            None => None,
        });
    }
    let owner = crate::owner::id();
    let lease = options.first_lease();
    let ttl_ms = ttl_millis(lease);
    let floor = options
        .floor
        .max(shared.fence_floor)
        .map_or(0, FenceToken::get)
        .to_string();
    let started = Instant::now();
    let valid_until = instant_after(started, lease.saturating_sub(shared.allowance(lease)));
    let releases: Vec<Option<NodeRelease>> = nodes
        .iter()
        .map(|node| {
            node.as_ref()
                .map(|(core, keys)| NodeRelease::new(core, keys, &owner))
        })
        .collect();
    let undo = Undo {
        releases: Some(releases),
    };

    let round_ends = valid_until.min(instant_after(started, shared.request_timeout));
    let rounds = Rounds {
        nodes: &nodes,
        name,
        owner: &owner,
        majority,
    };
    let Acquired {
        granted,
        busy,
        retry_after,
    } = rounds.acquire(&ttl_ms, &floor, started, round_ends).await;
    if granted.len() < majority || Instant::now() >= valid_until {
        let holding: Vec<usize> = granted.iter().map(|&(index, _)| index).collect();
        undo.now(&holding, name, shared.request_timeout).await;
        return Ok(Err(if granted.len() + busy >= majority && busy > 0 {
            Refused::Busy { retry_after }
        } else {
            Refused::Unanswered
        }));
    }
    let fence = granted
        .iter()
        .map(|&(_, fence)| fence)
        .max()
        .expect("a majority granted");

    let mut holding: Vec<usize> = granted.iter().map(|&(index, _)| index).collect();
    if !shared.skip_commit {
        let commit_started = Instant::now();
        let round_ends = valid_until.min(instant_after(commit_started, shared.request_timeout));
        let (committed, not_owner) = rounds
            .commit(&holding, fence, commit_started, round_ends)
            .await;
        if committed < majority || Instant::now() >= valid_until {
            undo.now(&holding, name, shared.request_timeout).await;
            return Ok(Err(if not_owner.is_empty() {
                Refused::Unanswered
            } else {
                Refused::Busy {
                    retry_after: Duration::ZERO,
                }
            }));
        }
        holding.retain(|index| !not_owner.contains(index));
    }

    // Granted: one hold per node that granted (and did not refuse the commit).
    let mut releases = undo.disarm();
    let mut holds = Vec::with_capacity(holding.len());
    for index in holding {
        let (core, keys) = nodes[index].clone().expect("a granting node is connected");
        releases[index] = None;
        let grant = Grant {
            weight: 1,
            keys,
            owner: owner.clone(),
            hold: String::new(),
            fence,
            sent: started,
            ttl: lease,
            replicas_acked: None,
        };
        holds.push(Held::new(&core, &QUORUM, grant, options));
    }
    tracing::debug!(lock = name, %fence, nodes = holds.len(), "quorum lock acquired");
    Ok(Ok(QuorumGuard::new(
        name,
        fence,
        Arc::clone(shared),
        holds,
        releases.into_iter().flatten().collect(),
        valid_until,
    )))
}

/// What both rounds of one attempt send with: each deployment's node (its client's core and
/// the lock's keys there, `None` while the deployment is not connected), the lock's name, the
/// attempt's owner token, and the majority a round needs.
struct Rounds<'a> {
    nodes: &'a [Option<(Arc<Core>, LockKeys)>],
    name: &'a str,
    owner: &'a str,
    majority: usize,
}

/// What the acquire round found.
struct Acquired {
    /// The nodes that granted, with the fence each answered.
    granted: Vec<(usize, FenceToken)>,
    /// How many nodes answered that another owner holds the lock.
    busy: usize,
    /// The longest remaining lease those reported.
    retry_after: Duration,
}

impl Rounds<'_> {
    /// Round 1: the mutex's acquire script on every node at once, clock rule, read until a
    /// majority granted or no longer can (then the stragglers' grace), or until `round_ends`.
    async fn acquire(
        &self,
        ttl_ms: &str,
        floor: &str,
        started: Instant,
        round_ends: Instant,
    ) -> Acquired {
        let (nodes, name, owner, majority) = (self.nodes, self.name, self.owner, self.majority);
        let round = Race::new(nodes.iter().map(|node| async move {
            let (core, keys) = node.as_ref()?;
            let script = if core.reads_floor() {
                &ACQUIRE_FLOOR
            } else {
                &ACQUIRE
            };
            let call = ScriptCall::new(
                script,
                &[keys.lock_key()],
                &[owner, ttl_ms, floor, "clock", core.expiry()],
            );
            Some(
                core.transport
                    .run(&call, name, Operation::QuorumAcquire)
                    .await,
            )
        }));
        let mut granted: Vec<(usize, FenceToken)> = Vec::new();
        let mut busy = 0;
        let mut retry_after = Duration::ZERO;
        gather(round, started, round_ends, |index, outcome, pending| {
            match outcome.map(|reply| {
                reply.and_then(|v| match v {
                    // A plain grant: the fence alone (acquire.lua).
                    redis::Value::Int(fence) => Ok((1, fence, 0)),
                    v => parse_reply::<(i64, i64, i64)>(name, Operation::QuorumAcquire, v),
                })
            }) {
                Some(Ok((1 | 2, value, behind))) => {
                    // Expected after a commit raised this node's fence to another node's
                    // clock: not the failover symptom `Core::clock_behind` warns about.
                    if behind > 0 {
                        tracing::trace!(
                            lock = name,
                            deployment = index,
                            behind,
                            "stored fence ahead of the node's clock"
                        );
                    }
                    match parse_fence(name, Operation::QuorumAcquire, "fence", value) {
                        Ok(fence) => granted.push((index, fence)),
                        Err(err) => {
                            tracing::warn!(lock = name, deployment = index, error = %err);
                        }
                    }
                }
                Some(Ok((0, pttl, _))) => {
                    busy += 1;
                    retry_after = retry_after.max(Duration::from_millis(pttl.max(0) as u64));
                }
                Some(Ok((status, _, _))) => {
                    tracing::warn!(
                        lock = name,
                        deployment = index,
                        status,
                        "unexpected acquire reply"
                    );
                }
                Some(Err(err)) => {
                    tracing::debug!(
                        lock = name,
                        deployment = index,
                        error = %err,
                        "quorum acquire failed on a node"
                    );
                }
                None => {}
            }
            if granted.len() >= majority || granted.len() + pending < majority {
                Progress::Decided
            } else {
                Progress::Open
            }
        })
        .await;
        Acquired {
            granted,
            busy,
            retry_after,
        }
    }

    /// Round 2: `quorum_commit` of `fence` on the granting nodes `holding` at once, read until a
    /// majority committed or no longer can (then the stragglers' grace), or until `round_ends`.
    /// Returns how many committed and the nodes that answered that `owner` no longer holds it.
    async fn commit(
        &self,
        holding: &[usize],
        fence: FenceToken,
        started: Instant,
        round_ends: Instant,
    ) -> (usize, Vec<usize>) {
        let (nodes, name, owner, majority) = (self.nodes, self.name, self.owner, self.majority);
        let t = fence.get().to_string();
        let round = Race::new(holding.iter().map(|&index| {
            let t = &t;
            let node = &nodes[index];
            async move {
                let (core, keys) = node.as_ref().expect("a granting node is connected");
                let call = ScriptCall::new(
                    &QUORUM_COMMIT,
                    &[keys.lock_key()],
                    &[owner, t, core.expiry()],
                );
                let reply = core
                    .transport
                    .run(&call, name, Operation::QuorumCommit)
                    .await;
                reply.and_then(|v| parse_reply::<i64>(name, Operation::QuorumCommit, v))
            }
        }));
        let mut committed = 0;
        let mut not_owner = Vec::new();
        gather(round, started, round_ends, |slot, outcome, pending| {
            match outcome {
                Ok(1) => committed += 1,
                Ok(_) => not_owner.push(holding[slot]),
                Err(err) => {
                    tracing::debug!(
                        lock = name,
                        deployment = holding[slot],
                        error = %err,
                        "quorum commit failed on a node"
                    );
                }
            }
            Progress::toward(majority, committed, pending)
        })
        .await;
        (committed, not_owner)
    }
}

impl Refused {
    /// The error a call that ends with this refusal returns: `waited` so far, `after` the
    /// deadline that passed.
    pub(super) fn into_error(self, name: &str, waited: Duration, after: Duration) -> Error {
        match self {
            Refused::Busy { retry_after } => Error::Busy {
                name: name.to_owned(),
                waited,
                retry_after,
            },
            Refused::Unanswered => Error::Timeout {
                name: name.to_owned(),
                operation: Operation::QuorumLock,
                after,
            },
        }
    }
}

/// While armed, dropping it releases the attempt's owner token on every node in the background
/// (an attempt dropped or failed after its requests were sent).
struct Undo {
    releases: Option<Vec<Option<NodeRelease>>>,
}

impl Undo {
    /// Releases everywhere now: on the nodes in `granted` (which answered, so answer again
    /// soon) awaited, at most `limit`, so that a process that gives up and exits leaves no
    /// lease there; on the others in the background. A call dropped meanwhile leaves the
    /// releases not yet answered to the background.
    async fn now(mut self, granted: &[usize], name: &str, limit: Duration) {
        let mut awaited = Vec::new();
        for (index, release) in self
            .releases
            .take()
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            match release {
                Some(release) if granted.contains(&index) => awaited.push(release),
                Some(release) => release.detach(),
                None => {}
            }
        }
        // Dropped while waiting: the releases not answered yet go on in the background.
        let mut unanswered = Undo {
            releases: Some(awaited.iter().cloned().map(Some).collect()),
        };
        let started = Instant::now();
        {
            let race = Race::new(awaited.iter().map(|release| release.run(name)));
            gather(
                race,
                started,
                instant_after(started, limit),
                |index, (), _| {
                    if let Some(releases) = unanswered.releases.as_mut() {
                        releases[index] = None;
                    }
                    Progress::Open
                },
            )
            .await;
        }
        // Those that did not answer within the limit were sent: nothing to add.
        unanswered.disarm();
    }

    /// The attempt succeeded: hands back the release calls, nothing is released.
    fn disarm(mut self) -> Vec<Option<NodeRelease>> {
        self.releases.take().unwrap_or_default()
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        for release in self.releases.take().into_iter().flatten().flatten() {
            release.detach();
        }
    }
}
