//! The `EVALSHA` calls with their fallback: a script is sent by SHA and, on `NOSCRIPT` (a
//! freshly promoted master, a flushed script cache), once more with its full source; alone,
//! followed by `WAIT` in one pipeline, or as a batch whose per-call errors stay values.

use std::time::Duration;

use tokio::time::Instant;

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, RedisResult, Value};

use crate::script::ScriptCall;

use super::connection::Connection;

/// Runs `script` by SHA, falling back to the full source once on `NOSCRIPT`, but not once
/// `deadline` has passed (see [`before`]): the caller bounds the call by the same deadline.
pub(super) async fn eval(
    conn: &mut Connection,
    call: &ScriptCall,
    deadline: Instant,
) -> RedisResult<Value> {
    match call.evalsha().query_async(conn).await {
        Err(err) if is_noscript(&err) => {
            before(deadline).await;
            call.eval().query_async(conn).await
        }
        other => other,
    }
}

/// Returns at once before `deadline`, and never from then on: a call's second step (the
/// script's source after `NOSCRIPT`, the script after the module's `-FALLBACK`) is not sent
/// past its call's deadline, which ends the call as a timeout (the caller's
/// `timeout_at(deadline, …)`). A call driven by its caller's polls (`direct.rs`) whose caller
/// stopped polling and came back late would otherwise send it then, as `timeout` polls the
/// call before its timer.
pub(super) async fn before(deadline: Instant) {
    if Instant::now() >= deadline {
        std::future::pending::<()>().await;
    }
}

/// Runs `script` and then `WAIT replicas timeout` in one pipeline on one node connection, so
/// WAIT counts acknowledgements of exactly the script's writes. Returns the script's reply and
/// the number of replicas that acknowledged.
///
/// The replicas have `wait` from the first send: after `NOSCRIPT` the resent script's `WAIT`
/// gets what is left of it (at least 1 ms; `WAIT … 0` would block for ever), as the `WAIT`
/// pipelined after the refused `EVALSHA` may already have blocked for all of it. Two whole
/// timeouts would overrun the caller's bound (request timeout + `wait`), failing as a timeout
/// where the replicas' answer (`ReplicasNotConfirmed`) was due.
pub(super) async fn eval_then_wait(
    conn: &mut Connection,
    call: &ScriptCall,
    replicas: u32,
    wait: Duration,
) -> RedisResult<(Value, i64)> {
    let until = tokio::time::Instant::now() + wait;
    let pipe = |invocation: Cmd, wait: Duration| {
        let wait_ms = wait.as_millis().max(1).to_string();
        let mut pipe = redis::pipe();
        pipe.add_command(invocation)
            .add_command(redis::cmd("WAIT").arg(replicas).arg(wait_ms).to_owned());
        pipe
    };
    match pipe(call.evalsha().clone(), wait).query_async(conn).await {
        Err(err) if is_noscript(&err) => {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            pipe(call.eval(), left).query_async(conn).await
        }
        other => other,
    }
}

/// Runs a batch call by SHA (falling back to the source on `NOSCRIPT`) and returns its reply
/// as it came: the per-call error replies inside it stay values.
pub(super) async fn eval_raw(conn: &mut Connection, call: &ScriptCall) -> RedisResult<Value> {
    let raw = |reply: RedisResult<Value>| match reply {
        Ok(Value::ServerError(error)) => Err(RedisError::from(error)),
        other => other,
    };
    match raw(conn.req_packed_command(call.evalsha()).await) {
        Err(err) if is_noscript(&err) => raw(conn.req_packed_command(&call.eval()).await),
        other => other,
    }
}

fn is_noscript(err: &RedisError) -> bool {
    err.code() == Some("NOSCRIPT")
}
