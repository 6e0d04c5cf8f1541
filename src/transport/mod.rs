//! The transport: every Redis call of a client, its guards and its background tasks goes
//! through [`Transport`], which runs, queues and bounds the calls, maps their failures to
//! [`Error`], and rebuilds the main connection after repeated failures.
//!
//! Its parts, each in its own file:
//! - `connection.rs`: the connection handle, the deployment's [`Topology`], the timeouts;
//! - `endpoint.rs`: the seeds and the deployment found there, which opens every connection;
//! - `probe.rs`: probing the seeds, and why a connection failed;
//! - `subscriber.rs`: the waiters' subscriber connection;
//! - `eval.rs`: `EVALSHA` with the `NOSCRIPT` fallback;
//! - `module.rs`: fencelock's Redis module as a path for calls, with the script as fallback;
//! - `slots.rs`: the `CLUSTER SLOTS` reply read: its ranges, their nodes, hosts and ports;
//! - `batch.rs`: the per-node drivers that batch one-key calls;
//! - `direct.rs`: lone calls sent past a quiet driver;
//! - `lanes.rs`: the WAIT lanes;
//! - `detached.rs`: undos and background calls, which finish after their caller;
//! - `tls.rs`: crypto provider, TLS files, TLS failures.

mod batch;
mod connection;
mod detached;
mod direct;
mod endpoint;
mod eval;
mod lanes;
mod module;
mod probe;
pub(crate) mod slots;
mod subscriber;
mod tls;

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use redis::{Cmd, RedisResult, Value};
use tokio::sync::Notify;

use crate::error::{Error, Operation, Result};
use crate::script::ScriptCall;

pub(crate) use batch::SlotMap;
pub(crate) use connection::Timeouts;
pub use connection::Topology;
pub(crate) use endpoint::{Endpoint, Seeds};
pub(crate) use module::Master;
pub use module::ModuleUse;
pub(crate) use subscriber::Subscriber;
pub(crate) use tls::TlsFiles;

use batch::{Batcher, Entry};
use connection::Connection;
use eval::eval;
use lanes::Lanes;
use module::{Modules, Verdict};

/// Where the reply of a queued call arrives ([`Transport::queue`]).
pub(crate) enum Reply {
    /// Queued on the node's driver: its reply arrives here.
    Queued(tokio::sync::oneshot::Receiver<Result<Value>>),
    /// Sent past the driver, whose lane was quiet: awaiting it drives the call.
    Direct(direct::Direct),
}

/// After this many consecutive timeouts or connection errors the main connection is rebuilt.
const REBUILD_AFTER: u32 = 2;

/// The connections of one client and their health: every Redis call of the client, its guards
/// and its background tasks goes through here, bounded by the request timeout.
pub(crate) struct Transport {
    /// The main connection; replaced when it keeps timing out (see [`Transport::observe`]).
    conn: RwLock<Connection>,
    /// Consecutive transient failures on the main connection.
    failures: AtomicU32,
    /// A rebuild is under way.
    rebuilding: AtomicBool,
    /// Rebuilds done, for [`crate::Stats::connection_rebuilds`].
    rebuilds: AtomicU64,
    lanes: Lanes,
    request_timeout: Duration,
    /// Background calls ([`Transport::run_detached`]) not yet finished, for
    /// [`Transport::settle`].
    detached: AtomicUsize,
    /// Signalled whenever a background call finishes.
    detached_done: Notify,
    /// Sends concurrent calls of one script for keys of one node as one call.
    batcher: Batcher,
    /// Where the module serves calls, and what it served.
    modules: Modules,
}

impl Transport {
    /// The transport over `conn`, the main connection [`Endpoint::discover`] opened.
    pub(crate) fn new(
        endpoint: Endpoint,
        conn: Connection,
        wait_lanes: usize,
        request_timeout: Duration,
        batching: bool,
        module: ModuleUse,
    ) -> Self {
        Self {
            modules: Modules::new(module),
            batcher: Batcher::new(batching, endpoint.topology),
            conn: RwLock::new(conn),
            failures: AtomicU32::new(0),
            rebuilding: AtomicBool::new(false),
            rebuilds: AtomicU64::new(0),
            lanes: Lanes::new(endpoint, wait_lanes),
            request_timeout,
            detached: AtomicUsize::new(0),
            detached_done: Notify::new(),
        }
    }

    pub(crate) fn endpoint(&self) -> &Endpoint {
        self.lanes.endpoint()
    }

    pub(crate) fn topology(&self) -> Topology {
        self.endpoint().topology
    }

    /// Whether grants should read the floor key of fencelock's Redis module (which, loaded
    /// with `release-deletes yes`, deletes released locks' keys and keeps their fences there):
    /// on a standalone server the client does not know to lack the module, with the module not
    /// turned off. A cluster's nodes never delete (the module refuses the option there).
    pub(crate) fn reads_floor(&self) -> bool {
        self.topology() == Topology::Standalone && self.modules.may_serve_standalone()
    }

    /// The deadline of one call.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// How release scripts announce a freed lock: `s` SPUBLISH, `p` PUBLISH.
    pub(crate) fn announce(&self) -> &'static str {
        match self.topology() {
            Topology::Cluster => "s",
            Topology::Standalone => "p",
        }
    }

    /// How often the main connection was rebuilt.
    pub(crate) fn rebuilds(&self) -> u64 {
        self.rebuilds.load(Ordering::Relaxed)
    }

    /// `CLUSTER SLOTS` from any node, within the request timeout.
    pub(crate) async fn cluster_slots(&self) -> Result<Value> {
        let mut conn = self.connection();
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
        let reply = bounded(
            "*",
            Operation::ClusterSlots,
            self.request_timeout,
            cmd.query_async(&mut conn),
        )
        .await?;
        self.endpoint().learn(&reply);
        Ok(reply)
    }

    /// With [`ModuleUse::Required`], checks that every master loads fencelock's Redis module
    /// (`COMMAND INFO fencelock.acquire` answers the command): at connect, so a client that
    /// requires it fails there rather than at its first lock. Nothing to check otherwise.
    ///
    /// On a cluster the masters are those of a `CLUSTER SLOTS` read now, and each is asked on
    /// its own connection, by its address ([`run_on_node`](Self::run_on_node)): routed by
    /// slot, redis-rs would send the command, which has no key and so is never redirected, to
    /// another node of the shard or any node when it has no connection to that master, whose
    /// answer says nothing of the master's. A master that cannot be asked fails the check.
    /// It runs once: a master that joins or is promoted later is not checked, and a call it
    /// lacks the module for fails with [`Error::ModuleMissing`].
    ///
    /// # Errors
    ///
    /// [`Error::Connect`] naming a master without the module or one that could not be asked;
    /// the errors of reading the slot map.
    pub(crate) async fn check_module(&self) -> Result<()> {
        if !self.modules.required() {
            return Ok(());
        }
        for master in self.masters().await? {
            let node = master
                .as_ref()
                .map_or_else(|| self.endpoint().nodes.to_string(), Master::addr);
            let cmd = redis::cmd("COMMAND")
                .arg("INFO")
                .arg("fencelock.acquire")
                .to_owned();
            let reply = self
                .run_on(master.as_ref(), cmd, Operation::ModuleCheck)
                .await;
            let reason = match reply {
                Ok(reply) if module::loaded(&reply) => continue,
                Ok(_) => "the client requires fencelock's Redis module (ModuleUse::Required) \
                          and this node does not load it: load it (docs/module.md) or use \
                          ModuleUse::Auto"
                    .to_owned(),
                Err(err) => format!(
                    "the client requires fencelock's Redis module (ModuleUse::Required) and \
                     this master could not be asked whether it loads it ({err})"
                ),
            };
            return Err(Error::Connect {
                target: node,
                reason,
                source: None,
            });
        }
        Ok(())
    }

    /// The masters to run a command of one node on (`SCAN`, `COMMAND INFO`): each master of a
    /// `CLUSTER SLOTS` read now, or `None` for the standalone server. See [`run_on`](Self::run_on).
    pub(crate) async fn masters(&self) -> Result<Vec<Option<Master>>> {
        Ok(match self.topology() {
            Topology::Standalone => vec![None],
            Topology::Cluster => module::masters(&self.cluster_slots().await?)
                .into_iter()
                .map(Some)
                .collect(),
        })
    }

    /// Runs `cmd` on `master` of [`masters`](Self::masters) itself, by its address, or on the
    /// standalone server (`None`), within the request timeout. Routed by slot, redis-rs would
    /// send a command without keys (never redirected) to another node when it has no
    /// connection to that master (it stopped answering), whose answer says nothing of the
    /// master's.
    pub(crate) async fn run_on(
        &self,
        master: Option<&Master>,
        cmd: Cmd,
        operation: Operation,
    ) -> Result<Value> {
        match master {
            Some(master) => self.run_on_node(master, cmd, operation).await,
            None => self.run_on_master(0, cmd, operation).await,
        }
    }

    /// Runs `cmd` on the cluster node `master` itself, by its address, within the request
    /// timeout (redis-rs opens the connection again if it has none, and fails the call if the
    /// node is not in its slot map). A master the slot map gave no host of its own
    /// ([`Master::own_host`]) goes by its slot, as
    /// [`run_on_master`](Self::run_on_master) does.
    async fn run_on_node(&self, master: &Master, cmd: Cmd, operation: Operation) -> Result<Value> {
        use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
        if !master.own_host() {
            return self.run_on_master(master.slot, cmd, operation).await;
        }
        let Connection::Cluster(mut conn) = self.connection() else {
            return self.run_on_master(master.slot, cmd, operation).await;
        };
        let route = SingleNodeRoutingInfo::ByAddress {
            host: master.host.clone(),
            port: master.port,
        };
        let call = async move {
            conn.route_command(cmd, RoutingInfo::SingleNode(route))
                .await
        };
        bounded("*", operation, self.request_timeout, call).await
    }

    /// Runs `cmd` on the master serving `slot` (a cluster; the client's slot map routes it) or
    /// on the server (standalone), within the request timeout: for commands that belong to
    /// one node, such as `SCAN`.
    pub(crate) async fn run_on_master(
        &self,
        slot: u16,
        cmd: Cmd,
        operation: Operation,
    ) -> Result<Value> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        let mut conn = self.connection();
        let call = async move {
            match &mut conn {
                Connection::Cluster(c) => {
                    let route = Route::new(slot, SlotAddr::Master);
                    c.route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await
                }
                other => cmd.query_async(other).await,
            }
        };
        bounded("*", operation, self.request_timeout, call).await
    }

    fn connection(&self) -> Connection {
        self.conn
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many batch calls were sent (each carrying two or more calls), and how many calls
    /// they carried.
    pub(crate) fn batches(&self) -> (u64, u64) {
        let batcher = &self.batcher;
        (
            batcher.batches.load(Ordering::Relaxed),
            batcher.batched_calls.load(Ordering::Relaxed),
        )
    }

    /// Runs `call` on the main connection within the request timeout; errors name `name` and
    /// `operation`. Calls of a batchable script are queued for their node and sent together
    /// with the calls of the same script that other tasks make meanwhile (see `batch.rs`).
    ///
    /// # Cancel safety
    ///
    /// A call dropped before it was sent is not sent; one dropped after may still run (the
    /// callers arm an undo). A call sent past the driver (`direct.rs`) is sent before this
    /// future first returns, and dropped, runs on to its end in the background.
    ///
    /// A call given by value is queued as it is; one given by reference is copied when queued.
    pub(crate) async fn run<'c>(
        self: &Arc<Self>,
        call: impl Into<Cow<'c, ScriptCall>>,
        name: &str,
        operation: Operation,
    ) -> Result<Value> {
        match self.queue(call, name, operation) {
            Ok(reply) => self.reply(reply, name, operation).await,
            Err(call) => self.run_alone(&call, name, operation).await,
        }
    }

    /// The batching lane of a key of slot `slot` (`batch.rs`): a call of several locks keeps
    /// its order with the calls of each of them only when they share the first key's lane, so
    /// the watchdog groups its renewals by node and lane.
    pub(crate) fn lane(&self, slot: u16) -> usize {
        self.batcher.lane(slot)
    }

    /// Queues `call` on its node's driver, if it goes through one (see [`run`](Self::run)):
    /// then it is sent after every call queued before it on that node's lane of its first key
    /// (the lane of every key of one lock) for its first key's slot, or that may reach keys of
    /// other slots (a watchdog's renewal; see `batch.rs`), and the reply arrives
    /// on the receiver ([`reply`](Self::reply)). Gives the call back when it must be sent on
    /// its own (with [`run`](Self::run)).
    ///
    /// When the lane has nothing queued, in flight or sent directly (for a call the module
    /// serves on a cluster node: its slot's bucket of the lane), the call goes past the driver
    /// (`direct.rs`): it is on its way to the connection when this returns, so the calls of
    /// its bucket queued after it still reach Redis after it.
    pub(crate) fn queue<'c>(
        self: &Arc<Self>,
        call: impl Into<Cow<'c, ScriptCall>>,
        name: &str,
        operation: Operation,
    ) -> std::result::Result<Reply, Cow<'c, ScriptCall>> {
        let call = call.into();
        let Some(node) = self.batcher.node(self, &call) else {
            return Err(call);
        };
        let lane = self.batcher.lane_state(node, call.slot());
        let bucket = self.batcher.bucket(call.slot());
        let ticket = if self.batcher.per_bucket() && self.modules.serves(&call, Some(node)) {
            lane.try_direct_in_bucket(bucket)
        } else {
            lane.try_direct(bucket)
        };
        if let Some(ticket) = ticket {
            let direct = direct::Direct::start(self, call.into_owned(), name, operation, ticket);
            return Ok(Reply::Direct(direct));
        }
        self.to_driver(call, node, &lane, name, operation, false)
            .map(Reply::Queued)
    }

    /// Queues the undo `call` on its node's driver, sent after the lane's calls in flight
    /// (`after_in_flight`, see `batch.rs`).
    fn enqueue_undo<'c>(
        self: &Arc<Self>,
        call: Cow<'c, ScriptCall>,
        name: &str,
        operation: Operation,
    ) -> std::result::Result<tokio::sync::oneshot::Receiver<Result<Value>>, Cow<'c, ScriptCall>>
    {
        let Some(node) = self.batcher.node(self, &call) else {
            return Err(call);
        };
        let lane = self.batcher.lane_state(node, call.slot());
        self.to_driver(call, node, &lane, name, operation, true)
    }

    fn to_driver<'c>(
        self: &Arc<Self>,
        call: Cow<'c, ScriptCall>,
        node: usize,
        lane: &Arc<direct::LaneState>,
        name: &str,
        operation: Operation,
        after_in_flight: bool,
    ) -> std::result::Result<tokio::sync::oneshot::Receiver<Result<Value>>, Cow<'c, ScriptCall>>
    {
        let busy = lane.queued(self.batcher.bucket(call.slot()));
        let (entry, reply) = Entry::new(call.into_owned(), name, operation, after_in_flight, busy);
        match self.batcher.queue(self, node, lane, entry) {
            Ok(()) => Ok(reply),
            Err(entry) => Err(Cow::Owned(entry.into_call())),
        }
    }

    /// The reply of a queued call, within the request timeout.
    pub(crate) async fn reply(
        &self,
        reply: Reply,
        name: &str,
        operation: Operation,
    ) -> Result<Value> {
        let queued = match reply {
            Reply::Queued(queued) => queued,
            // Bounded by the request timeout where it runs (`run_alone`).
            Reply::Direct(direct) => return direct.await,
        };
        match tokio::time::timeout(self.request_timeout, queued).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) | Err(_) => Err(Error::Timeout {
                name: name.to_owned(),
                operation,
                after: self.request_timeout,
            }),
        }
    }

    /// Runs `call` on its own on the main connection within the request timeout, past the
    /// node's driver: for a call that no call queued before it can conflict with (a handoff:
    /// its releasing owner has nothing else in flight, its new owner's token is fresh), which
    /// saves the driver's task hop on a path where every grant waits for the one before.
    pub(crate) async fn run_direct(
        self: &Arc<Self>,
        call: &ScriptCall,
        name: &str,
        operation: Operation,
    ) -> Result<Value> {
        self.run_alone(call, name, operation).await
    }

    /// How many calls the module answered, and how many it declined or whose node lacked it
    /// (run as scripts).
    pub(crate) fn module_calls(&self) -> (u64, u64) {
        (
            self.modules.served.load(Ordering::Relaxed),
            self.modules.declined.load(Ordering::Relaxed),
        )
    }

    /// Runs `call` on its own on the main connection within the request timeout: as the
    /// module's command where its node may load the module (then as the script if the module
    /// declines or is missing: see `module.rs`), else as the script.
    async fn run_alone(
        self: &Arc<Self>,
        call: &ScriptCall,
        name: &str,
        operation: Operation,
    ) -> Result<Value> {
        let node = self.batcher.node_index(self, call);
        let Some(cmd) = self.modules.command(call, node) else {
            return self.run_script(call, name, operation).await;
        };
        let mut conn = self.connection();
        // One deadline for both steps: the script after `-FALLBACK` is not sent past it.
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        let run = async {
            let reply = cmd.query_async::<Value>(&mut conn).await;
            match self.modules.judge(reply, call, node) {
                Verdict::Served(reply) => Ok(reply),
                Verdict::Script => {
                    eval::before(deadline).await;
                    Ok(eval(&mut conn, call, deadline).await)
                }
                Verdict::Missing => Err(()),
            }
        };
        let outcome = match tokio::time::timeout_at(deadline, run).await {
            Ok(Ok(reply)) => classify(name, operation, reply),
            Ok(Err(())) => Err(Error::ModuleMissing {
                name: name.to_owned(),
                operation,
            }),
            Err(_) => Err(Error::Timeout {
                name: name.to_owned(),
                operation,
                after: self.request_timeout,
            }),
        };
        self.observe(&outcome);
        outcome
    }

    /// Runs `call` on its own as the script (never the module's command), within the request
    /// timeout.
    async fn run_script(
        self: &Arc<Self>,
        call: &ScriptCall,
        name: &str,
        operation: Operation,
    ) -> Result<Value> {
        let mut conn = self.connection();
        // `bounded`'s timer starts at its first poll, at once: not before this deadline, so
        // the call never waits on a second step it may not send.
        let deadline = tokio::time::Instant::now() + self.request_timeout;
        let call = eval(&mut conn, call, deadline);
        let outcome = bounded(name, operation, self.request_timeout, call).await;
        self.observe(&outcome);
        outcome
    }

    /// Runs `call` and then `WAIT replicas wait` in one pipeline on a WAIT lane, within the
    /// request timeout plus `wait`. Returns the script's reply and how many replicas
    /// acknowledged.
    pub(crate) async fn run_then_wait(
        self: &Arc<Self>,
        call: &ScriptCall,
        name: &str,
        operation: Operation,
        replicas: u32,
        wait: Duration,
    ) -> Result<(Value, i64)> {
        let limit = self.request_timeout + wait;
        let call = self.lanes.eval_then_wait(call, replicas, wait);
        let outcome = bounded(name, operation, limit, call).await;
        self.observe(&outcome);
        outcome
    }

    /// Counts consecutive transient failures and rebuilds the main connection after
    /// [`REBUILD_AFTER`] of them. redis-rs keeps routing a slot to a master that stopped
    /// answering with its socket open (SIGSTOP) even after a replica was promoted; a new
    /// connection reads a fresh slot map and routes to the new master.
    /// `TRYAGAIN` is an answer (a slot that migrates, for as long as it does), not a sign of
    /// a connection gone stale: it neither counts nor resets the count.
    fn observe<T>(self: &Arc<Self>, outcome: &Result<T>) {
        match outcome {
            Err(err) if err.is_slot_migrating() => {}
            Err(err) if err.is_transient() => {
                if self.failures.fetch_add(1, Ordering::AcqRel) + 1 >= REBUILD_AFTER {
                    self.rebuild();
                }
            }
            _ => self.failures.store(0, Ordering::Release),
        }
    }

    fn rebuild(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.rebuilding.swap(true, Ordering::AcqRel) {
            return;
        }
        let transport = Arc::clone(self);
        runtime.spawn(async move {
            if transport.topology() == Topology::Cluster {
                // The nodes serving now, for when every seed stopped answering: the old
                // connection still reaches some node (one bounded call; a failure leaves the
                // nodes learnt before).
                let _ = transport.cluster_slots().await;
            }
            match transport.endpoint().main_connection().await {
                Ok(conn) => {
                    *transport.conn.write().unwrap_or_else(PoisonError::into_inner) = conn;
                    transport.failures.store(0, Ordering::Release);
                    transport.rebuilds.fetch_add(1, Ordering::Relaxed);
                    // The batching drivers' map of which node serves a slot, read anew.
                    transport.batcher.refresh(&transport);
                    #[cfg(feature = "metrics")]
                    metrics::counter!(
                        crate::stats::names::CONNECTION_REBUILDS,
                        "kind" => crate::stats::CLIENT_KIND
                    )
                    .increment(1);
                    tracing::info!(nodes = %transport.endpoint().nodes, "rebuilt the connection after repeated timeouts");
                }
                Err(err) => tracing::warn!(error = %err, "could not rebuild the connection"),
            }
            transport.rebuilding.store(false, Ordering::Release);
        });
    }
}

/// A Redis call's outcome as this crate's result, naming the lock in the error.
fn classify<T>(name: &str, operation: Operation, outcome: RedisResult<T>) -> Result<T> {
    match outcome {
        Ok(value) => Ok(value),
        Err(source) if source.code() == Some("OOM") => Err(Error::OutOfMemory {
            name: name.to_owned(),
            operation,
            source,
        }),
        Err(source) => Err(Error::Redis {
            name: name.to_owned(),
            operation,
            source,
        }),
    }
}

/// Bounds a Redis call by `limit`, naming the lock in the error.
async fn bounded<T>(
    name: &str,
    operation: Operation,
    limit: Duration,
    call: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T> {
    match tokio::time::timeout(limit, call).await {
        Ok(outcome) => classify(name, operation, outcome),
        Err(_) => Err(Error::Timeout {
            name: name.to_owned(),
            operation,
            after: limit,
        }),
    }
}
