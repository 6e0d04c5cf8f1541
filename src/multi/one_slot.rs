//! The mutex's one-slot request: when every key shares one slot, one `lock_all.lua` call grants
//! them all, or none.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::acquire::{replicas, Attempt, InFlight, Request};
use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::held::{Grant, Held};
use crate::keys::LockKeys;
use crate::lock::{LockGuard, MUTEX};
use crate::options::LockOptions;
use crate::script::{parse_fence, parse_reply, ttl_millis, ScriptCall, LOCK_ALL, LOCK_ALL_FLOOR};

/// The one-slot request: every key granted by one script call, or none.
pub(super) struct AcquireAll<'a> {
    /// The members, in the caller's order.
    keys: &'a [LockKeys],
    options: &'a LockOptions,
    /// The member last found busy: its name in errors, its channel for the wake-up.
    busy: AtomicUsize,
}

impl<'a> AcquireAll<'a> {
    /// The request for `keys` (at least one, all of one slot), in the caller's order.
    pub(super) fn new(keys: &'a [LockKeys], options: &'a LockOptions) -> Self {
        Self {
            keys,
            options,
            busy: AtomicUsize::new(0),
        }
    }

    fn busy_keys(&self) -> &LockKeys {
        &self.keys[self.busy.load(Ordering::Relaxed).min(self.keys.len() - 1)]
    }
}

impl Request for AcquireAll<'_> {
    type Granted = Vec<LockGuard>;

    fn name(&self) -> &str {
        self.busy_keys().name()
    }

    fn channel(&self) -> &str {
        self.busy_keys().lock_key()
    }

    async fn attempt(&self, core: &Arc<Core>) -> Result<Attempt<Vec<LockGuard>>> {
        let (keys, options) = (self.keys, self.options);
        let name = keys[0].name();
        let owner = crate::owner::token(core.tag());
        let started = Instant::now();
        let lease = options.first_lease();
        let ttl_ms = ttl_millis(lease);
        let floor = core.floor(options).to_string();
        let lock_keys: Vec<&str> = keys.iter().map(LockKeys::lock_key).collect();
        let script = if core.reads_floor() {
            &LOCK_ALL_FLOOR
        } else {
            &LOCK_ALL
        };
        let call = ScriptCall::new(
            script,
            &lock_keys,
            &[&owner, &ttl_ms, &floor, core.fence_arg(), core.expiry()],
        );
        let undos: Vec<ScriptCall> = lock_keys
            .iter()
            .map(|key| MUTEX.release_call(core, key, &owner, ""))
            .collect();
        let in_flight: Vec<InFlight> = undos
            .iter()
            .map(|undo| InFlight::arm(&core.transport, undo.clone()))
            .collect();
        let (reply, acks) =
            replicas::run_granting(core, &call, name, Operation::Acquire, options.wait).await?;
        let reply = parse_reply::<Vec<i64>>(name, Operation::Acquire, reply)?;
        let unexpected = |detail: String| Error::UnexpectedReply {
            name: name.to_owned(),
            operation: Operation::Acquire,
            detail,
        };
        match reply.as_slice() {
            [1 | 2, behind, fences @ ..] if fences.len() == keys.len() => {
                if *behind > 0 {
                    core.clock_behind("mutex", name, *behind);
                }
                let fences = fences
                    .iter()
                    .zip(keys)
                    .map(|(fence, k)| parse_fence(k.name(), Operation::Acquire, "fence", *fence))
                    .collect::<Result<Vec<_>>>()?;
                // The members' undos stay armed until the replicas confirmed: a call dropped
                // meanwhile, or too few acknowledgements, releases every member (the first by
                // `confirm` itself, the rest in the background as their undos fire).
                let confirmed =
                    replicas::confirm(core, "mutex", name, acks, || undos[0].clone()).await;
                let replicas_acked = match confirmed {
                    Ok(acked) => {
                        in_flight.into_iter().for_each(InFlight::disarm);
                        acked
                    }
                    Err(err) => {
                        drop(in_flight);
                        return Err(err);
                    }
                };
                tracing::debug!(lock = name, members = keys.len(), "acquired all");
                let guards = keys
                    .iter()
                    .zip(fences)
                    .map(|(k, fence)| {
                        let grant = Grant {
                            weight: 1,
                            keys: k.clone(),
                            owner: owner.clone(),
                            hold: String::new(),
                            fence,
                            sent: started,
                            ttl: lease,
                            replicas_acked,
                        };
                        LockGuard::new(Held::new(core, &MUTEX, grant, options))
                    })
                    .collect();
                Ok(Attempt::Granted(guards))
            }
            [0, pttl, index] => {
                in_flight.into_iter().for_each(InFlight::disarm);
                let index = usize::try_from(*index).unwrap_or(1).max(1) - 1;
                self.busy
                    .store(index.min(keys.len() - 1), Ordering::Relaxed);
                Ok(Attempt::Busy {
                    retry_after: Duration::from_millis(u64::try_from(*pttl).unwrap_or(0)),
                })
            }
            other => Err(unexpected(format!("{other:?}"))),
        }
    }
}
