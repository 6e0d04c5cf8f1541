//! The WAIT lanes: connections of their own for a script followed by `WAIT`, which blocks its
//! connection while it waits.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::{RedisError, RedisResult, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::script::ScriptCall;

use super::connection::Connection;
use super::endpoint::Endpoint;
use super::eval::eval_then_wait;

/// Dedicated connections for WAIT, which blocks its connection while it waits: each lane serves
/// one acquisition at a time, so WAIT never delays unrelated lock traffic on the main connection.
pub(super) struct Lanes {
    endpoint: Endpoint,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
}

/// A lane checked out of [`Lanes`]; it goes back when [`Lane::finish`] is called after a clean
/// reply, and is closed when dropped otherwise (its state after an error or timeout is unknown).
struct Lane<'a> {
    conn: Connection,
    lanes: &'a Lanes,
    _permit: OwnedSemaphorePermit,
}

impl Lanes {
    pub(super) fn new(endpoint: Endpoint, count: usize) -> Self {
        Self {
            endpoint,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(count.max(1))),
        }
    }

    pub(super) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Runs `call` and then `WAIT replicas wait` in one pipeline on a lane (see
    /// [`eval_then_wait`]); the lane goes back after a clean reply. Returns the script's reply
    /// and how many replicas acknowledged. Unbounded: the caller bounds it.
    pub(super) async fn eval_then_wait(
        &self,
        call: &ScriptCall,
        replicas: u32,
        wait: Duration,
    ) -> RedisResult<(Value, i64)> {
        let mut lane = self.checkout().await?;
        let reply = eval_then_wait(&mut lane.conn, call, replicas, wait).await?;
        lane.finish();
        Ok(reply)
    }

    /// Waits for a free lane, opening a new connection when no idle one is left.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped call holds no permit and opens nothing that outlives it.
    async fn checkout(&self) -> RedisResult<Lane<'_>> {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| RedisError::from((redis::ErrorKind::Client, "client closed")))?;
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self.endpoint.open_lane().await?,
        };
        Ok(Lane {
            conn,
            lanes: self,
            _permit: permit,
        })
    }
}

impl Lane<'_> {
    /// Returns the lane to the pool for the next caller.
    fn finish(self) {
        self.lanes
            .idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(self.conn);
    }
}
