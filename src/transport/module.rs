//! fencelock's Redis module (`module/`, issue 24) as a path for calls: whether the client uses
//! it ([`ModuleUse`]), which nodes were found without it, and the counts of calls it served and
//! declined. A call whose script has a module command ([`ScriptCall::module_cmd`]) goes to the
//! module first where the node may load it; a node that answers "unknown command" is taken to
//! lack it (its calls go through the scripts; it is asked again after [`RETRY_ABSENT`] or a
//! change of the slot map), and a `-FALLBACK` reply (a case the module leaves to the script,
//! answered before any write) sends the same call through the script.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, Instant};

use redis::{Cmd, RedisError};

use crate::script::ScriptCall;

/// Whether a client runs its calls through fencelock's Redis module where a node loads it
/// ([`ClientBuilder::module`](crate::ClientBuilder::module)).
///
/// The module (`module/` in the repository, `docs/design.md`, "Redis module") serves the
/// mutex's calls (its queue's handoff included) and the fair lock's acquire and release
/// natively, with the same keys, fences, expiry and replies as the scripts: both paths serve one lock together, so a fleet where some nodes load it works.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> fencelock::Result<()> {
/// let client = fencelock::Client::builder(["redis://127.0.0.1:7000"])
///     .module(fencelock::ModuleUse::Off)
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ModuleUse {
    /// Use the module on the nodes that load it and the scripts elsewhere (the default): a
    /// node found without it (it answered "unknown command") is asked again after a minute or
    /// when the cluster's slot map changes; each such finding costs one round trip.
    #[default]
    Auto,
    /// Never use the module: every call is a script.
    Off,
    /// Every call the module serves goes to it; a node without it fails the call with
    /// [`Error::ModuleMissing`](crate::Error::ModuleMissing) (the scripts still run what the
    /// module declines). `connect` checks once that every master loads it, asking each
    /// master by its address (`COMMAND INFO fencelock.acquire`), and fails with
    /// [`Error::Connect`](crate::Error::Connect) naming a master that does not or could not be
    /// asked; a master that joins or is promoted later is not checked again (its calls fail
    /// with `ModuleMissing` if it lacks the module).
    Required,
}

/// How long a node found without the module is left alone before a call asks again.
pub(super) const RETRY_ABSENT: Duration = Duration::from_secs(60);

/// How long the calls for the keys of a slot bucket go straight to the scripts after the
/// module declined one there (a key the module leaves to the scripts, such as one of layout 1:
/// each call would otherwise cost a round trip more).
const AFTER_DECLINE: Duration = Duration::from_secs(1);

/// Slot buckets for [`AFTER_DECLINE`]: slots share one by `slot % DECLINE_BUCKETS`.
const DECLINE_BUCKETS: usize = 1024;

/// The module path of one client.
pub(super) struct Modules {
    setting: ModuleUse,
    /// The nodes found without a command of the module, by command: without the module at
    /// all, or with an older one that lacks a command (its calls go as the script), or lacks
    /// the batched form (its calls go to the module one command each).
    absent: Absent,
    /// Calls the module answered (its own replies, errors included).
    pub(super) served: AtomicU64,
    /// Calls the module declined (`-FALLBACK`) or whose node lacked it, run as scripts.
    pub(super) declined: AtomicU64,
    /// Per slot bucket: when the module last declined a call there, in ms since `start` plus
    /// one (0: never).
    declined_at: Box<[AtomicU64]>,
    start: Instant,
}

/// What the module made of a call.
pub(super) enum Verdict {
    /// Its reply: the call is done.
    Served(redis::RedisResult<redis::Value>),
    /// Send the script.
    Script,
    /// The node lacks the module and the client requires it.
    Missing,
}

impl Modules {
    pub(super) fn new(setting: ModuleUse) -> Self {
        Self {
            setting,
            absent: Absent::default(),
            served: AtomicU64::new(0),
            declined: AtomicU64::new(0),
            declined_at: (0..DECLINE_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            start: Instant::now(),
        }
    }

    /// The module command to send for `call` to node `node` (`None`: unknown), or `None` to
    /// send the script: the module is off, the script has no module command, or the node was
    /// found without it lately (unless the module is required).
    pub(super) fn command(&self, call: &ScriptCall, node: Option<usize>) -> Option<Cmd> {
        if self.serves(call, node) {
            call.module_cmd()
        } else {
            None
        }
    }

    /// Whether `call` would go to the module on node `node` (see [`command`](Self::command)),
    /// without building the command.
    pub(super) fn serves(&self, call: &ScriptCall, node: Option<usize>) -> bool {
        let on = match self.setting {
            ModuleUse::Off => false,
            ModuleUse::Required => true,
            ModuleUse::Auto => call
                .module_name()
                .is_some_and(|name| !self.absent.lacks(node, name)),
        };
        on && call.has_module() && !self.declined_lately(call)
    }

    fn bucket(&self, call: &ScriptCall) -> &AtomicU64 {
        let slot = call.slot();
        &self.declined_at[usize::from(slot) % DECLINE_BUCKETS]
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
    }

    /// Whether the module declined a call for a key of `call`'s slot bucket less than
    /// [`AFTER_DECLINE`] ago.
    fn declined_lately(&self, call: &ScriptCall) -> bool {
        let after = u64::try_from(AFTER_DECLINE.as_millis()).unwrap_or(u64::MAX);
        let at = self.bucket(call).load(Ordering::Relaxed);
        at != 0 && self.now_ms().saturating_sub(at) < after
    }

    /// Whether calls to node `node` may go as the batched command `batch` (the module was
    /// not found without it lately).
    pub(super) fn batches(&self, node: Option<usize>, batch: &str) -> bool {
        !self.absent.lacks(node, batch)
    }

    /// Whether `error`, the answer to the batched module command `batch` on node `node`, says
    /// the node does not know that command: it is then noted (its calls go one command each),
    /// and the calls are to be sent again one by one.
    pub(super) fn batch_unknown(
        &self,
        error: &RedisError,
        node: Option<usize>,
        batch: &'static str,
    ) -> bool {
        let unknown = unknown_command(error);
        if unknown {
            self.absent.mark(node, batch);
        }
        unknown
    }

    /// Judges the module's answer `reply` to `call`, sent to node `node`.
    pub(super) fn judge(
        &self,
        reply: redis::RedisResult<redis::Value>,
        call: &ScriptCall,
        node: Option<usize>,
    ) -> Verdict {
        match reply {
            Err(err) if declined(&err) => {
                self.declined.fetch_add(1, Ordering::Relaxed);
                self.bucket(call).store(self.now_ms(), Ordering::Relaxed);
                Verdict::Script
            }
            Err(err) if unknown_command(&err) => {
                self.declined.fetch_add(1, Ordering::Relaxed);
                if let Some(name) = call.module_name() {
                    self.absent.mark(node, name);
                }
                if self.setting == ModuleUse::Required {
                    Verdict::Missing
                } else {
                    tracing::debug!(node, "a node does not load the fencelock module: scripts");
                    Verdict::Script
                }
            }
            reply => {
                self.served.fetch_add(1, Ordering::Relaxed);
                Verdict::Served(reply)
            }
        }
    }

    /// Counts `calls` more calls sent to the module that it declined or whose node lacked it
    /// (those of a batched command refused as a whole, beyond the one [`judge`](Self::judge)
    /// counted).
    pub(super) fn fell_back(&self, calls: usize) {
        self.declined.fetch_add(calls as u64, Ordering::Relaxed);
    }

    /// Whether the module may serve a standalone server's calls: not turned off, and the
    /// server (node 0) not found without `fencelock.acquire` lately.
    pub(super) fn may_serve_standalone(&self) -> bool {
        match self.setting {
            ModuleUse::Off => false,
            ModuleUse::Required => true,
            ModuleUse::Auto => !self.absent.lacks(Some(0), "fencelock.acquire"),
        }
    }

    /// Whether the client requires the module.
    pub(super) fn required(&self) -> bool {
        self.setting == ModuleUse::Required
    }

    /// Forgets which nodes lacked the module: the slot map changed (node indexes move, nodes
    /// come and go).
    pub(super) fn forget(&self) {
        self.absent.clear();
    }
}

/// Nodes found without a module command, by index (as the slot map numbers them; 0 on a
/// standalone server) and command, with when that was found.
#[derive(Default)]
struct Absent(RwLock<Vec<(usize, &'static str, Instant)>>);

impl Absent {
    /// Whether `node` was found without the command `name` less than [`RETRY_ABSENT`] ago.
    fn lacks(&self, node: Option<usize>, name: &str) -> bool {
        let Some(node) = node else { return false };
        let absent = self.0.read().unwrap_or_else(PoisonError::into_inner);
        absent
            .iter()
            .any(|&(n, c, since)| n == node && c == name && since.elapsed() < RETRY_ABSENT)
    }

    /// `node` (if known) was found without the command `name` now.
    fn mark(&self, node: Option<usize>, name: &'static str) {
        let Some(node) = node else { return };
        let mut absent = self.0.write().unwrap_or_else(PoisonError::into_inner);
        absent.retain(|&(n, c, since)| !(n == node && c == name) && since.elapsed() < RETRY_ABSENT);
        absent.push((node, name, Instant::now()));
    }

    fn clear(&self) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

/// A master of a `CLUSTER SLOTS` reply: the first slot it serves and its address.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Master {
    pub(super) slot: u16,
    /// As the reply gives it (see [`own_host`](Self::own_host)).
    pub(super) host: String,
    pub(super) port: u16,
}

impl Master {
    /// Whether the reply gave the node's own host, which redis-rs keys its connection by:
    /// not empty, `?` (unknown) or a wildcard (`0.0.0.0`, `::`; redis-rs takes the empty and
    /// the wildcard ones for the address of the node that answered the read).
    pub(super) fn own_host(&self) -> bool {
        !matches!(self.host.as_str(), "" | "?" | "0.0.0.0" | "::")
    }

    /// `host:port`, for messages.
    pub(crate) fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// Each master of a `CLUSTER SLOTS` reply once (one whose port cannot be read left out).
pub(super) fn masters(slots: &redis::Value) -> Vec<Master> {
    super::slots::masters(slots)
        .into_iter()
        .filter_map(|(slot, node)| {
            Some(Master {
                slot,
                host: node
                    .host()
                    .map(|host| host.into_owned())
                    .unwrap_or_default(),
                port: node.port()?,
            })
        })
        .collect()
}

/// Whether a `COMMAND INFO fencelock.acquire` reply describes the command (a node without the
/// module answers an array holding nil).
pub(super) fn loaded(reply: &redis::Value) -> bool {
    match reply {
        redis::Value::Array(items) | redis::Value::Set(items) => items
            .first()
            .is_some_and(|item| !matches!(item, redis::Value::Nil)),
        redis::Value::Map(items) => !items.is_empty(),
        _ => false,
    }
}

/// The module declined the call before any write: the script runs it.
fn declined(err: &RedisError) -> bool {
    err.code() == Some("FALLBACK")
}

/// The node does not know the module's command (it does not load the module), or the client's
/// ACL user may not run it (a user allowed the scripts only): both leave the call to the script.
fn unknown_command(err: &RedisError) -> bool {
    err.code() == Some("NOPERM")
        || (err.code() == Some("ERR") && err.to_string().contains("unknown command"))
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::{masters, Master};

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![Value::BulkString(host.into()), Value::Int(port)])
    }

    fn range(start: i64, end: i64, master: Value) -> Value {
        Value::Array(vec![Value::Int(start), Value::Int(end), master])
    }

    #[test]
    fn each_master_once_with_its_first_slot_and_address() {
        let reply = Value::Array(vec![
            range(0, 99, node("10.0.0.1", 7000)),
            range(100, 199, node("10.0.0.2", 7001)),
            range(200, 299, node("10.0.0.1", 7000)),
            range(300, 399, node("", 7002)),
        ]);
        let found = masters(&reply);
        let want = |slot, host: &str, port| Master {
            slot,
            host: host.to_owned(),
            port,
        };
        assert_eq!(
            found,
            [
                want(0, "10.0.0.1", 7000),
                want(100, "10.0.0.2", 7001),
                want(300, "", 7002)
            ]
        );
        assert!(found[0].own_host() && !found[2].own_host());
        assert_eq!(found[1].addr(), "10.0.0.2:7001");
    }
}
