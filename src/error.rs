//! The one error type of fencelock.

use std::time::Duration;

use crate::fence::FenceToken;
use crate::human::HumanDuration;

/// `Result` with fencelock's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in fencelock.
///
/// Each message names the lock (or the server) concerned and says what to do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock name cannot be used.
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName {
        /// The name as given (shortened when long).
        name: String,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// An option for a lock (TTL, timeout, slot, tag, prefix, replica count) is out of range.
    #[error("invalid options for lock {name:?}: {reason}")]
    InvalidOptions {
        /// The lock concerned.
        name: String,
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// A client setting or URL cannot be used.
    #[error("invalid client configuration: {reason}")]
    InvalidConfig {
        /// What is wrong and how to fix it.
        reason: String,
    },

    /// No server could be reached, a server refused the credentials, or the TLS handshake
    /// failed; `source` (through [`std::error::Error::source`]) carries the cause.
    #[error("cannot connect to {target}: {reason}")]
    Connect {
        /// The URL or node that was tried.
        target: String,
        /// What happened and what to check.
        reason: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<redis::RedisError>,
    },

    /// The lock is held by another owner: [`try_lock`](crate::Client::try_lock) failed, or
    /// [`lock`](crate::Client::lock) ran out of time.
    #[error(
        "lock {name:?} is held by another owner (waited {}; it frees in {} at the latest \
         unless extended): retry later or wait longer",
        HumanDuration(*.waited),
        HumanDuration(*.retry_after)
    )]
    Busy {
        /// The lock concerned.
        name: String,
        /// How long this call waited.
        waited: Duration,
        /// The lock's remaining TTL at the last attempt.
        retry_after: Duration,
    },

    /// The lock was granted but fewer replicas than required confirmed it within the WAIT
    /// timeout; fencelock released it again.
    #[error(
        "lock {name:?} was granted but only {acked} of {required} required replicas confirmed \
         it; it was released again: check replica health or lower the requirement"
    )]
    ReplicasNotConfirmed {
        /// The lock concerned.
        name: String,
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas required.
        required: u32,
    },

    /// The lock had expired (no owner) when it was released or extended.
    #[error(
        "lock {name:?} had already expired: another owner may have held it meanwhile, so \
         storage must have rejected stale writes by fence; use a longer TTL or extend sooner"
    )]
    Expired {
        /// The lock concerned.
        name: String,
    },

    /// An operator freed the lock while this guard held it
    /// ([`Client::force_unlock`](crate::Client::force_unlock), `fencelock unlock --force`):
    /// the release, extension or renewal found this hold gone and the forced unlock's marker
    /// naming it.
    #[error(
        "lock {name:?} was freed by a force unlock while held: another owner may hold it now, so \
         stop writing under its fence and acquire it again if the work must go on"
    )]
    ForceUnlocked {
        /// The lock concerned.
        name: String,
    },

    /// The lock is held by another owner now, so this guard no longer owns it.
    #[error(
        "lock {name:?} is now held by another owner: this holder lost it (TTL ran out) and must \
         stop writing; use a longer TTL or extend sooner"
    )]
    NotOwner {
        /// The lock concerned.
        name: String,
    },

    /// The watchdog could not renew the lock before its lease ran out (Redis did not answer),
    /// so another owner may hold it now.
    #[error(
        "lock {name:?} could not be renewed before its lease ran out (Redis did not answer): \
         another owner may hold it, so stop writing under its fence and acquire it again"
    )]
    LeaseUnconfirmed {
        /// The lock concerned.
        name: String,
    },

    /// The watchdog stopped renewing the lock because Redis refused a renewal with an error
    /// that retrying does not cure: the lock's key was overwritten with another type
    /// (`WRONGTYPE`), the script failed, or the reply made no sense. The lease in Redis ends
    /// with its TTL at the latest; another owner may hold the lock after that.
    #[error(
        "lock {name:?} could not be renewed ({reason}), so the watchdog stopped renewing it: \
         stop writing under its fence; check that no other program writes the lock's keys, \
         then acquire it again"
    )]
    RenewalFailed {
        /// The lock concerned.
        name: String,
        /// The error Redis answered the renewal with.
        reason: String,
    },

    /// The watchdog stopped renewing the lock because it was held for the maximum hold time.
    #[error(
        "lock {name:?} was held for its maximum hold time of {} and its lease has ended: \
         stop writing under its fence; raise the maximum (`max_hold`, the CLI's --max-hold) if \
         the work needs longer",
        HumanDuration(*.max_hold)
    )]
    MaxHoldReached {
        /// The lock concerned.
        name: String,
        /// The maximum hold time set.
        max_hold: Duration,
    },

    /// A call did not finish within its deadline.
    #[error(
        "{operation} on lock {name:?} did not finish within {}: a Redis node is slow or \
         not answering; {}",
        HumanDuration(*.after),
        .operation.after_timeout()
    )]
    Timeout {
        /// The lock concerned.
        name: String,
        /// What was being done.
        operation: Operation,
        /// The deadline that passed.
        after: Duration,
    },

    /// Redis answered with an error, or the connection failed.
    #[error(
        "{operation} on lock {name:?} failed: {source}{}",
        redis_advice(source)
    )]
    Redis {
        /// The lock concerned.
        name: String,
        /// What was being done.
        operation: Operation,
        /// The error from the Redis client.
        #[source]
        source: redis::RedisError,
    },

    /// Redis refused the call because it reached `maxmemory` (policy `noeviction`). Releases,
    /// extensions and renewals still run at `maxmemory`; acquisitions and re-entries do not.
    #[error(
        "{operation} on lock {name:?} was refused: Redis is out of memory (maxmemory reached \
         under noeviction); free memory or raise maxmemory, held locks can still be released"
    )]
    OutOfMemory {
        /// The lock concerned.
        name: String,
        /// What was being done.
        operation: Operation,
        /// The `OOM` error from Redis.
        #[source]
        source: redis::RedisError,
    },

    /// The client requires fencelock's Redis module
    /// ([`ModuleUse::Required`](crate::ModuleUse::Required)) and the node serving the lock does
    /// not load it (it answered "unknown command"). Nothing was written.
    #[error(
        "{operation} on lock {name:?} needs fencelock's Redis module, which the node serving \
         it does not load: load it there (`loadmodule` in redis.conf or MODULE LOAD, see \
         docs/design.md, \"Redis module\"), or build the client with ModuleUse::Auto to fall \
         back to the scripts"
    )]
    ModuleMissing {
        /// The lock concerned.
        name: String,
        /// What was being done.
        operation: Operation,
    },

    /// Redis answered with something the scripts never return.
    #[error(
        "{operation} on lock {name:?} got an unexpected reply ({detail}): is another program \
         using the same keys? choose another key prefix"
    )]
    UnexpectedReply {
        /// The lock concerned.
        name: String,
        /// What was being done.
        operation: Operation,
        /// The reply, as far as it helps.
        detail: String,
    },

    /// A latch did not open within the wait's timeout: its count was still above zero, or it
    /// was not set (never, or its open state expired), which does not read as open.
    #[error(
        "latch {name:?} did not open within {} ({}): wait longer, or check that every \
         party counts down",
        HumanDuration(*.waited),
        latch_state(.remaining)
    )]
    LatchNotOpen {
        /// The latch concerned.
        name: String,
        /// How long the call waited.
        waited: Duration,
        /// The count still outstanding at the last look; `None` when the latch was not set.
        remaining: Option<u64>,
    },

    /// A latch's count-down found no round to count in: the latch is not set (never, or its
    /// open state expired), or the generation the count-down named is not the current one (the
    /// latch was set again: the count-down belongs to a round that is over).
    #[error("count-down on latch {name:?} refused: {}", refused(.generation, .current))]
    CountDownRefused {
        /// The latch concerned.
        name: String,
        /// The generation the count-down named, if it named one.
        generation: Option<FenceToken>,
        /// The latch's current generation; `None` when it is not set.
        current: Option<FenceToken>,
    },

    /// A read-write lock refused to change a hold's kind: a read hold asked for a write hold
    /// (an upgrade, which could deadlock two readers), or a write hold with re-entered holds
    /// asked to downgrade.
    #[error("read-write lock {name:?}: {reason}")]
    RoleRefused {
        /// The lock concerned.
        name: String,
        /// What was refused and what to do instead.
        reason: String,
    },

    /// The semaphore already exists with another number of permits: every user of a semaphore
    /// must give the same limit (change it with [`Semaphore::set_limit`](crate::Semaphore::set_limit)).
    #[error(
        "semaphore {name:?} has {stored} permits, not {requested}: use the same number of \
         permits everywhere (the CLI's --permits {stored}), or change it with set_limit"
    )]
    LimitMismatch {
        /// The semaphore concerned.
        name: String,
        /// The limit stored in Redis.
        stored: u32,
        /// The limit this call gave.
        requested: u32,
    },

    /// A semaphore's limit was lowered below the number of permits a waiting call asks for
    /// ([`Semaphore::set_limit`](crate::Semaphore::set_limit) while it waited): the call can
    /// never be granted, so it ended at once, and its reservation was withdrawn.
    #[error(
        "semaphore {name:?} now has {limit} permits, fewer than the {count} this call asks for \
         (its limit was lowered while the call waited): ask for at most {limit}, or raise the \
         limit with set_limit"
    )]
    LimitBelowCount {
        /// The semaphore concerned.
        name: String,
        /// The permits the call asked for.
        count: u32,
        /// The semaphore's limit now.
        limit: u32,
    },

    /// [`Client::shutdown`](crate::Client::shutdown) returned before every background release
    /// (of a dropped guard, or of a cancelled acquire) had finished: those locks may stay held
    /// until their TTL ends.
    #[error(
        "{pending} background releases had not finished within {}: their locks stay held \
         until their TTL ends; check that Redis answers, or give shutdown more time",
        HumanDuration(*.after)
    )]
    ShutdownIncomplete {
        /// Background releases still running.
        pending: usize,
        /// How long shutdown waited.
        after: Duration,
    },
}

/// How a latch that did not open stood.
fn latch_state(remaining: &Option<u64>) -> String {
    match remaining {
        Some(count) => format!("{count} count-downs outstanding"),
        None => "it is not set, never or no longer, which is not open".into(),
    }
}

/// Why a count-down was refused.
fn refused(generation: &Option<FenceToken>, current: &Option<FenceToken>) -> String {
    match (generation, current) {
        (_, None) => "the latch is not set (never, or its open state expired): set it first".into(),
        (Some(generation), Some(current)) => format!(
            "generation {generation} is over, the latch was set again (generation {current}): \
             count down in the current round only if this party belongs to it"
        ),
        (None, Some(current)) => format!("the current generation is {current}"),
    }
}

impl Error {
    /// True when the guard's ownership is gone or can no longer be relied on
    /// ([`Error::Expired`], [`Error::ForceUnlocked`], [`Error::NotOwner`],
    /// [`Error::LeaseUnconfirmed`], [`Error::RenewalFailed`], [`Error::MaxHoldReached`]).
    pub fn is_lock_lost(&self) -> bool {
        matches!(
            self,
            Error::Expired { .. }
                | Error::ForceUnlocked { .. }
                | Error::NotOwner { .. }
                | Error::LeaseUnconfirmed { .. }
                | Error::RenewalFailed { .. }
                | Error::MaxHoldReached { .. }
        )
    }

    /// True when the lock was not acquired because another owner holds it.
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }

    /// True when Redis answered `TRYAGAIN`: the key's slot is migrating (a grant with no stored
    /// fence in the epoch fence modes is refused there until the migration ends).
    pub(crate) fn is_slot_migrating(&self) -> bool {
        matches!(self, Error::Redis { source, .. } if source.code() == Some("TRYAGAIN"))
    }

    /// True when a deadline passed, the connection failed, the cluster is changing (failover,
    /// resharding) or the server is busy (loading, or running a long script), so trying again
    /// may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Redis { source, .. } => {
                source.is_io_error()
                    || source.is_timeout()
                    || source.is_connection_dropped()
                    || source.kind() == redis::ErrorKind::ClusterConnectionNotFound
                    || matches!(
                        source.code(),
                        Some(
                            "CLUSTERDOWN"
                                | "TRYAGAIN"
                                | "MASTERDOWN"
                                | "LOADING"
                                | "BUSY"
                                | "READONLY"
                                | "MOVED"
                                | "ASK"
                        )
                    )
            }
            _ => false,
        }
    }
}

/// What a call was doing when it failed: the operation an [`Error`] names.
///
/// # Examples
///
/// ```
/// use fencelock::Operation;
///
/// assert_eq!(Operation::Acquire.to_string(), "acquire");
/// assert_eq!(Operation::WriteLock.as_str(), "write lock");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Acquiring a mutex or semaphore permits.
    Acquire,
    /// Acquiring a fair lock.
    FairAcquire,
    /// Taking a read hold.
    ReadLock,
    /// Taking a write hold.
    WriteLock,
    /// Taking several mutexes in one call.
    AcquireAll,
    /// Releasing a mutex to the client's next waiting task.
    Handoff,
    /// Releasing a hold.
    Release,
    /// Extending a hold's lease.
    Extend,
    /// The watchdog renewing leases.
    Renew,
    /// Taking a held lock again (re-entry).
    Reenter,
    /// Turning a write hold into a read hold.
    Downgrade,
    /// Giving up a fair lock's place in the queue.
    Withdraw,
    /// Withdrawing a waiting writer's intent.
    WithdrawIntent,
    /// Changing a semaphore's limit.
    SetLimit,
    /// Counting a semaphore's free permits.
    Available,
    /// Setting a latch.
    LatchSet,
    /// Counting a latch down.
    LatchCountDown,
    /// Reading a latch.
    LatchRead,
    /// Inspecting a primitive's key.
    Inspect,
    /// Freeing a primitive's key by force.
    ForceUnlock,
    /// Listing keys (`SCAN`).
    Scan,
    /// Reading a server's `INFO`.
    Info,
    /// Reading the cluster's slot map.
    ClusterSlots,
    /// Asking a node whether it loads fencelock's Redis module (`COMMAND INFO`).
    ModuleCheck,
    /// Subscribing to a primitive's release channel.
    Subscribe,
    /// A write checked against a fence (`fenced_set`).
    FencedWrite,
    /// A quorum lock's acquire round on one deployment.
    QuorumAcquire,
    /// A quorum lock's commit round on one deployment.
    QuorumCommit,
    /// Acquiring a quorum lock, when fewer than a majority of deployments answered.
    QuorumLock,
    /// Releasing a quorum lock, when fewer than a majority of deployments answered.
    QuorumRelease,
    /// Extending a quorum lock, when fewer than a majority of deployments confirmed.
    QuorumExtend,
}

/// What to do about a Redis error, where the error alone does not say (appended to the message).
fn redis_advice(error: &redis::RedisError) -> &'static str {
    match error.code() {
        Some("WRONGTYPE") => {
            " (another program keeps a value of another type at this lock's key: remove that \
             key, or give fencelock another key prefix)"
        }
        _ => "",
    }
}

impl Operation {
    /// Whether this operation takes a hold (a lock, a permit, a place among readers or
    /// writers): when it does not finish in time, the primitive was not acquired, rather than
    /// some other call going unanswered.
    ///
    /// ```
    /// use fencelock::Operation;
    ///
    /// assert!(Operation::Acquire.acquires());
    /// assert!(!Operation::Release.acquires());
    /// ```
    #[must_use]
    pub const fn acquires(self) -> bool {
        matches!(
            self,
            Operation::Acquire
                | Operation::FairAcquire
                | Operation::ReadLock
                | Operation::WriteLock
                | Operation::AcquireAll
                | Operation::QuorumAcquire
                | Operation::QuorumCommit
                | Operation::QuorumLock
        )
    }

    /// What a caller should make of this operation's timeout (the end of its message).
    const fn after_timeout(self) -> &'static str {
        const NOT_ACQUIRED: &str = "the outcome is unknown, so treat the lock as not held (what \
                                    it may have granted is released in the background)";
        if self.acquires() {
            return NOT_ACQUIRED;
        }
        match self {
            Operation::Handoff
            | Operation::Release
            | Operation::QuorumRelease
            | Operation::ForceUnlock => {
                "the outcome is unknown: the lock may stay held until its lease ends"
            }
            Operation::Extend
            | Operation::Renew
            | Operation::Reenter
            | Operation::Downgrade
            | Operation::QuorumExtend => {
                "the outcome is unknown: count on no more than the lease the hold had before"
            }
            Operation::Inspect
            | Operation::Scan
            | Operation::Info
            | Operation::ClusterSlots
            | Operation::ModuleCheck
            | Operation::LatchRead
            | Operation::Available
            | Operation::Subscribe => "nothing was changed; try again once the node answers",
            Operation::Withdraw
            | Operation::WithdrawIntent
            | Operation::SetLimit
            | Operation::LatchSet
            | Operation::LatchCountDown
            | Operation::FencedWrite => {
                "the outcome is unknown: look at the state before relying on it"
            }
            // The operations that acquire, answered above.
            _ => NOT_ACQUIRED,
        }
    }

    /// The operation as error messages name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Operation::Acquire => "acquire",
            Operation::FairAcquire => "fair acquire",
            Operation::ReadLock => "read lock",
            Operation::WriteLock => "write lock",
            Operation::AcquireAll => "acquire all",
            Operation::Handoff => "handoff",
            Operation::Release => "release",
            Operation::Extend => "extend",
            Operation::Renew => "renew",
            Operation::Reenter => "reenter",
            Operation::Downgrade => "downgrade",
            Operation::Withdraw => "withdraw",
            Operation::WithdrawIntent => "withdraw intent",
            Operation::SetLimit => "set_limit",
            Operation::Available => "available",
            Operation::LatchSet => "latch set",
            Operation::LatchCountDown => "latch count-down",
            Operation::LatchRead => "latch read",
            Operation::Inspect => "inspect",
            Operation::ForceUnlock => "force_unlock",
            Operation::Scan => "scan",
            Operation::Info => "info",
            Operation::ClusterSlots => "cluster slots",
            Operation::ModuleCheck => "module check",
            Operation::Subscribe => "subscribe",
            Operation::FencedWrite => "fenced write",
            Operation::QuorumAcquire => "quorum acquire",
            Operation::QuorumCommit => "quorum commit",
            Operation::QuorumLock => "quorum lock (fewer than a majority of deployments answered)",
            Operation::QuorumRelease => {
                "quorum release (fewer than a majority of deployments answered)"
            }
            Operation::QuorumExtend => {
                "quorum extend (fewer than a majority of deployments confirmed)"
            }
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
