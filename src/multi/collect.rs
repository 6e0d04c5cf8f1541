//! Members across slots (and fair or read-write members always), taken one after the other in
//! one canonical order (by slot, then key) under a short provisional lease, then extended to the
//! full lease once all are held; on failure what was taken is released.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::core::Core;
use crate::error::Result;
use crate::held::Held;
use crate::keys::LockKeys;
use crate::options::LockOptions;

use super::member::MultiMember;

/// The provisional lease of a member taken across slots: short, so that a caller that dies
/// while collecting leaves little behind, but a few request timeouts long, so that extending it
/// to the full lease has time to arrive. Above the chosen renewal period, so that the watchdog
/// renews it in time.
fn provisional_lease(core: &Core, options: &LockOptions) -> Duration {
    let short = (core.transport.request_timeout() * 4).max(Duration::from_secs(1));
    let short = short.max(options.renew_every.map_or(Duration::ZERO, |e| e * 2));
    options.first_lease().min(short)
}

/// Takes the members across slots, in canonical order, one after the other; `deadline` bounds
/// the waiting (`None`: one attempt each). Earlier members are kept alive while a later one is
/// awaited. Returns the guards in canonical order, with their index in the caller's order.
pub(super) async fn collect<G: MultiMember>(
    core: &Arc<Core>,
    keys: &[LockKeys],
    options: &LockOptions,
    deadline: Option<Instant>,
) -> Result<Vec<G>> {
    let mut order: Vec<usize> = (0..keys.len()).collect();
    order.sort_by(|&a, &b| {
        (keys[a].slot(), keys[a].lock_key()).cmp(&(keys[b].slot(), keys[b].lock_key()))
    });
    let lease = provisional_lease(core, options);
    let mut provisional = options.clone();
    provisional.ttl = lease;
    let keep_alive = (lease / 3).max(Duration::from_millis(1));
    let mut taken: Vec<(usize, G)> = Vec::with_capacity(keys.len());
    // When the members taken so far must be kept alive: a third of the lease after the earliest
    // of their leases began (the first grant, or the last keep-alive), across the waits for
    // the next members (a timer started afresh for each wait never fired while every member
    // came a little sooner than it, and the first ones expired).
    let mut keep_by: Option<tokio::time::Instant> = None;
    for &index in &order {
        // Boxed and erased: the nested wait futures of both member kinds otherwise make the
        // compiler's layout queries overflow their depth limit in a clean build.
        let mut waiting: Pin<Box<dyn Future<Output = Result<G>> + Send + '_>> =
            Box::pin(G::take(core, &keys[index], &provisional, deadline));
        let outcome = loop {
            let due = keep_by.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                outcome = &mut waiting => break outcome,
                () = tokio::time::sleep_until(due), if keep_by.is_some() => {
                    keep_by = Some(tokio::time::Instant::now() + keep_alive);
                    let mut kept = Ok(());
                    for (_, guard) in &mut taken {
                        if let Err(err) = guard.held_mut().extend(lease).await {
                            kept = Err(err);
                            break;
                        }
                    }
                    if let Err(err) = kept {
                        break Err(err);
                    }
                }
            }
        };
        match outcome {
            Ok(guard) => {
                keep_by.get_or_insert_with(|| tokio::time::Instant::now() + keep_alive);
                taken.push((index, guard));
            }
            Err(err) => {
                release_all(taken).await;
                return Err(err);
            }
        }
    }
    let full = options.first_lease();
    if full > lease {
        for i in 0..taken.len() {
            if let Err(err) = taken[i].1.held_mut().extend(full).await {
                release_all(taken).await;
                return Err(err);
            }
        }
    }
    taken.sort_by_key(|(index, _)| *index);
    Ok(taken.into_iter().map(|(_, guard)| guard).collect())
}

/// Releases the members taken before a failure (errors ignored: what cannot be released
/// expires with its short lease).
async fn release_all<G: MultiMember>(taken: Vec<(usize, G)>) {
    let _ = Held::release_together(taken.into_iter().map(|(_, guard)| guard.into_held())).await;
}
