//! Grants confirmed by replicas: the granting script and `WAIT` in one pipeline on a WAIT lane,
//! and a compensating release when fewer replicas acknowledged than asked for.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;

use crate::core::Core;
use crate::error::{Error, Operation, Result};
use crate::script::ScriptCall;
use crate::stats::Counters;

use super::undo::InFlight;

/// How many replicas were asked for and how many acknowledged.
pub(crate) struct Acks {
    required: u32,
    acked: i64,
}

/// Runs the granting `call`; with `wait` (replicas, timeout) set, on a WAIT lane followed by
/// `WAIT`, returning the acknowledgements too.
///
/// # Cancel safety
///
/// As [`crate::transport::Transport::run`]: the caller arms an undo before calling.
pub(crate) async fn run_granting<'c>(
    core: &Arc<Core>,
    call: impl Into<Cow<'c, ScriptCall>>,
    name: &str,
    operation: Operation,
    wait: Option<(u32, Duration)>,
) -> Result<(Value, Option<Acks>)> {
    match wait {
        None => Ok((core.transport.run(call, name, operation).await?, None)),
        Some((required, timeout)) => {
            // Boxed, as the release in `confirm`: the rarer paths allocate their future when
            // taken, so the common path's future (boxed per attempt by the wait loop) stays small.
            let call = call.into();
            let (reply, acked) = Box::pin(
                core.transport
                    .run_then_wait(&call, name, operation, required, timeout),
            )
            .await?;
            Ok((reply, Some(Acks { required, acked })))
        }
    }
}

/// After a grant: the number of replicas that acknowledged it (`None` when none were asked
/// for), or, when fewer acknowledged than asked, [`Error::ReplicasNotConfirmed`] once the call
/// `undo` builds (the grant's release) has run. `kind` labels the metric.
pub(crate) async fn confirm(
    core: &Arc<Core>,
    kind: &'static str,
    name: &str,
    acks: Option<Acks>,
    undo: impl FnOnce() -> ScriptCall,
) -> Result<Option<u32>> {
    let Some(Acks { required, acked }) = acks else {
        return Ok(None);
    };
    let acked = u32::try_from(acked).unwrap_or(0);
    if acked < required {
        // As an undo: a caller dropped meanwhile does not keep the unconfirmed grant from
        // being released (a plain call queued behind a round in flight would be dropped).
        Box::pin(InFlight::arm(&core.transport, undo()).now(name)).await;
        return Err(Error::ReplicasNotConfirmed {
            name: name.to_owned(),
            acked,
            required,
        });
    }
    Counters::add(&core.counters.replica_acks, kind, u64::from(acked));
    Ok(Some(acked))
}
