//! What a connection is: the handle every call goes through ([`Connection`]: a cluster
//! connection or a single-node one), the kind of deployment behind it ([`Topology`]) and the
//! timeouts every connection is opened with ([`Timeouts`]).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// What kind of deployment the client talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Topology {
    /// A Redis Cluster (`cluster_enabled:1`).
    Cluster,
    /// A single Redis server.
    Standalone,
}

/// Timeouts applied to every connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) connect: Duration,
    pub(crate) response: Duration,
}

/// One handle to Redis: a cluster connection (routes by key, follows MOVED/ASK) or a
/// single-node one.
#[derive(Clone)]
pub(crate) enum Connection {
    Cluster(ClusterConnection),
    Managed(ConnectionManager),
    Direct(MultiplexedConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Cluster(c) => c.req_packed_command(cmd),
            Connection::Managed(c) => c.req_packed_command(cmd),
            Connection::Direct(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Managed(c) => c.req_packed_commands(cmd, offset, count),
            Connection::Direct(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Cluster(c) => c.get_db(),
            Connection::Managed(c) => c.get_db(),
            Connection::Direct(c) => c.get_db(),
        }
    }
}
