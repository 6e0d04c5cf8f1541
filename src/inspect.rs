//! Operations on any primitive's key for operators: [`Client::inspect`] (read-only),
//! [`Client::force_unlock`] (frees whoever holds it, keeps the fence) and
//! [`Client::list_locks`] (`SCAN` of every master under the client's prefix).
//!
//! One read-only script (`script/lua/inspect_read.lua`, `no-writes`) understands every kind's
//! hash; each kind has its own force-unlock script (`allow-oom`, it only frees), which returns
//! the inspection of the state it freed, read in the same atomic step.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use redis::Value;
use tracing::Instrument;

use crate::client::Client;
use crate::error::{Error, Operation, Result};
use crate::fence::FenceToken;
use crate::human::{HumanDuration, Printable};
use crate::keys::{LockKeys, Placement};
use crate::kind::Kind;
use crate::latch::DEFAULT_OPEN_TTL;
use crate::script::{
    parse_reply, ttl_millis, LuaScript, ScriptCall, FAIR_FORCE_UNLOCK, FORCE_UNLOCK, INSPECT,
    LATCH_FORCE_UNLOCK, RW_FORCE_UNLOCK, SEMAPHORE_FORCE_UNLOCK,
};
use crate::transport::Topology;

/// What [`Client::inspect`] read of one primitive's key (or what [`Client::force_unlock`]
/// found and freed), in one atomic step on the key's master.
///
/// Leases are judged against the server's clock, as the scripts judge them. Fields that a
/// kind does not have are `None`.
///
/// With the `serde` feature it serializes as the object `fencelock status --json` prints: the
/// fields by these names (`null` for `None`), fences as numbers, `kind` as
/// [`Kind::as_str`], and `lease_left` as `lease_ms`, whole milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Inspection {
    /// The name as given (or, from [`Client::list_locks`], as decoded from the key).
    pub name: String,
    /// The primitive kind.
    pub kind: Kind,
    /// The Redis key read.
    pub key: String,
    /// The key's hash slot.
    pub slot: u16,
    /// The key exists (a lock that was never taken, or whose key expired, has none).
    pub exists: bool,
    /// A live hold exists: an unexpired lease of the mutex or fair lock, of the writer or a
    /// reader, of a semaphore permit. For a latch: armed (set, count above zero, not open).
    pub held: bool,
    /// The last fence granted (latch: the last generation), `None` when none is stored. The
    /// next grant is above it. For a mutex whose holder's client queues more of its tasks, the
    /// last of the fences reserved for them (see [`Client::lock`]): the holder's may be lower.
    pub fence: Option<FenceToken>,
    /// The longest live lease left (the holder's; readers' or permits': the one ending last),
    /// `None` when nothing is held (always for a latch).
    #[cfg_attr(
        feature = "serde",
        serde(rename = "lease_ms", serialize_with = "serialize_millis")
    )]
    pub lease_left: Option<Duration>,
    /// Live holds: re-entered holds count each (mutex, each read-write owner); a semaphore's
    /// live permits; 0 for a latch.
    pub holds: u64,
    /// Waiters the key records: a fair lock's live queue places; a read-write lock's waiting
    /// writer intent (0 or 1: only the first waiting writer is recorded); a semaphore's
    /// many-permit reservation (0 or 1); a mutex's live queue places, the processes waiting
    /// for it in turn (`None` when it has none; a client's other waiting tasks wait in the
    /// client). `None` for the latch, whose waiters leave no trace in Redis.
    pub waiters: Option<u64>,
    /// Read-write lock: how many owners read (live reader entries).
    pub readers: Option<u64>,
    /// Semaphore: live permits.
    pub permits_in_use: Option<u64>,
    /// Semaphore: the stored limit (`None` when none is stored).
    pub permit_limit: Option<u64>,
    /// Latch: the current generation's remaining count (`Some(0)` once open or never set).
    pub latch_count: Option<u64>,
    /// Latch: the current generation (`None` when not set).
    pub latch_generation: Option<FenceToken>,
    /// Latch: the latest generation that opened (`None` for none).
    pub latch_opened: Option<FenceToken>,
}

/// `Inspection::lease_left` as whole milliseconds.
#[cfg(feature = "serde")]
fn serialize_millis<S: serde::Serializer>(
    lease: &Option<Duration>,
    serializer: S,
) -> std::result::Result<S::Ok, S::Error> {
    match lease {
        Some(lease) => {
            serializer.serialize_u64(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX))
        }
        None => serializer.serialize_none(),
    }
}

impl fmt::Display for Inspection {
    /// One line for people, e.g. `orders:42 mutex held fence 1718000000123456 lease 8.2s
    /// holds 1` or `orders:42 mutex free fence 1718000000123456`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", Printable(&self.name), self.kind)?;
        match (self.kind, self.held, self.exists) {
            (Kind::Latch, true, _) => f.write_str(" armed")?,
            (Kind::Latch, false, true) => f.write_str(" open")?,
            (_, true, _) => f.write_str(" held")?,
            (_, false, _) => f.write_str(" free")?,
        }
        if let Some(fence) = self.fence {
            write!(f, " fence {fence}")?;
        }
        if let Some(lease) = self.lease_left {
            write!(f, " lease {}", HumanDuration(lease))?;
        }
        if self.held && self.kind != Kind::Latch {
            write!(f, " holds {}", self.holds)?;
        }
        if let Some(readers) = self.readers.filter(|&n| n > 0) {
            write!(f, " readers {readers}")?;
        }
        if let (Some(used), Some(limit)) = (self.permits_in_use, self.permit_limit) {
            write!(f, " permits {used}/{limit}")?;
        }
        if let Some(count) = self.latch_count {
            write!(f, " count {count}")?;
        }
        if let Some(waiters) = self.waiters {
            write!(f, " waiters {waiters}")?;
        }
        Ok(())
    }
}

/// What [`Client::list_locks`] found: every primitive's key under the client's prefix.
///
/// With the `serde` feature it serializes as an object of these fields.
#[derive(Debug, Clone, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct LockList {
    /// One inspection per key found, sorted by name, then kind.
    pub locks: Vec<Inspection>,
    /// An upper bound of the keys `SCAN` examined (calls × `COUNT`), over every master.
    pub scanned: u64,
    /// The scan stopped at the cap before it covered every master's keyspace: `locks` is
    /// incomplete.
    pub truncated: bool,
    /// Keys under the prefix with a primitive's name that are not that primitive's (another
    /// program wrote them, e.g. a string where a lock's hash belongs: `WRONGTYPE`), skipped;
    /// each is also logged as a `tracing` warning.
    pub skipped: Vec<String>,
    /// The value of the prefix's floor key, `<prefix>:{floor}:floor`, when one was found: where
    /// a standalone server whose Redis module deletes released locks' keys (`release-deletes
    /// yes`, `docs/module.md`) keeps their last fence. A highest fence taken from this list for
    /// [`ClientBuilder::fence_floor`](crate::ClientBuilder::fence_floor) must include it.
    pub floor: Option<u64>,
}

/// Whether inspecting a key failed because the key is not the primitive's (another type, or a
/// reply the inspection cannot read), rather than because Redis failed.
fn is_foreign(err: &Error) -> bool {
    match err {
        Error::Redis { source, .. } => {
            source.code() == Some("WRONGTYPE") || source.to_string().contains("WRONGTYPE")
        }
        Error::UnexpectedReply { .. } => true,
        _ => false,
    }
}

/// Keys `SCAN` is asked to examine per call.
const SCAN_COUNT: u64 = 1000;

impl Client {
    /// Reads the state of the primitive of `kind` named `name` (placed by name), without
    /// writing: held or not, fence, lease left, holds, waiters and the kind's own figures.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidName`] / [`Error::InvalidOptions`] as [`LockKeys::new`];
    /// [`Error::Timeout`] or [`Error::Redis`] when Redis does not answer in time or fails
    /// (`WRONGTYPE` when another program wrote the key); [`Error::UnexpectedReply`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// use fencelock::Kind;
    ///
    /// let state = client.inspect(Kind::Mutex, "orders:42").await?;
    /// if state.held {
    ///     println!("held, fence {:?}, {:?} left", state.fence, state.lease_left);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, kind: Kind, name: &str) -> Result<Inspection> {
        self.inspect_at(kind, name, &Placement::ByName).await
    }

    /// [`inspect`](Self::inspect) for a primitive pinned with `placement`
    /// (`LockOptions::slot` / `tag`).
    ///
    /// # Errors
    ///
    /// As [`inspect`](Self::inspect).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn inspect_at(
        &self,
        kind: Kind,
        name: &str,
        placement: &Placement,
    ) -> Result<Inspection> {
        let keys = self.kind_keys(kind, name, placement)?;
        let core = self.core();
        let call = ScriptCall::new(
            &INSPECT,
            &[keys.lock_key()],
            &[kind.key_suffix(), core.expiry()],
        );
        let span = tracing::debug_span!("fencelock.inspect", lock = name, kind = kind.as_str());
        let reply = core
            .transport
            .run(&call, name, Operation::Inspect)
            .instrument(span)
            .await?;
        decode(&keys, kind, Operation::Inspect, reply)
    }

    /// Frees the primitive of `kind` named `name` whoever holds it, for operators: every hold
    /// goes, the fence stays (the next grant is above the freed one), the key's expiry follows
    /// the usual rule, and the release is announced to waiters as a release would (a fair
    /// lock's head is woken on its own channel). Waiters' records stay: a fair lock's queue,
    /// a read-write lock's waiting writer intent, a semaphore's reservation. A latch is
    /// opened instead (its current generation, published to its waiters).
    ///
    /// Returns what it found and freed, read in the same atomic step (`held` false: nothing
    /// was held and nothing changed). The old holder learns of the loss: its watchdog's next
    /// renewal, `extend` and `release` answer [`Error::Expired`] (or [`Error::NotOwner`] once
    /// someone else holds it). A mutex release that hands the lock to another task of the
    /// holder's client without a call (see [`Client::lock`]) does not ask Redis: that task
    /// learns of it at its own next call (renewal, `extend`, or a release that goes to Redis).
    /// Storage that checks fences rejects their late writes once a later holder wrote with a
    /// higher fence (every later grant is above the fences reserved for those handoffs).
    ///
    /// # Errors
    ///
    /// As [`inspect`](Self::inspect). Runs at `maxmemory` too (the scripts are `allow-oom`).
    ///
    /// # Cancel safety
    ///
    /// A dropped call may or may not have freed the primitive; [`inspect`](Self::inspect)
    /// tells.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(client: fencelock::Client) -> fencelock::Result<()> {
    /// let freed = client.force_unlock(fencelock::Kind::Mutex, "orders:42").await?;
    /// println!("freed: {freed}");
    /// # Ok(()) }
    /// ```
    pub async fn force_unlock(&self, kind: Kind, name: &str) -> Result<Inspection> {
        self.force_unlock_at(kind, name, &Placement::ByName).await
    }

    /// [`force_unlock`](Self::force_unlock) for a primitive pinned with `placement`.
    ///
    /// # Errors
    ///
    /// As [`inspect`](Self::inspect).
    ///
    /// # Cancel safety
    ///
    /// As [`force_unlock`](Self::force_unlock).
    pub async fn force_unlock_at(
        &self,
        kind: Kind,
        name: &str,
        placement: &Placement,
    ) -> Result<Inspection> {
        let keys = self.kind_keys(kind, name, placement)?;
        let core = self.core();
        let open_ttl = ttl_millis(DEFAULT_OPEN_TTL);
        let call = ScriptCall::new(
            force_script(kind),
            &[keys.lock_key()],
            &[core.transport.announce(), &open_ttl, core.expiry()],
        );
        let span = tracing::info_span!("fencelock.force_unlock", lock = name, kind = kind.as_str());
        let reply = core
            .transport
            .run(&call, name, Operation::ForceUnlock)
            .instrument(span)
            .await?;
        let found = decode(&keys, kind, Operation::ForceUnlock, reply)?;
        tracing::info!(lock = name, kind = kind.as_str(), found = %found, "forced unlock");
        Ok(found)
    }

    /// Every primitive's key under the client's prefix, on every master (`SCAN MATCH
    /// '<prefix>:{*' COUNT 1000`, master by master, each asked by its address), each
    /// inspected: a master that does not answer fails the listing rather than leaving its
    /// locks out. Stops once about
    /// `max_scanned` keys were examined in all (calls × `COUNT`) and says so in
    /// [`LockList::truncated`]. Keys whose names do not decode back to the same key (another
    /// program's keys under the prefix) are skipped; so are keys with a primitive's name that
    /// do not hold that primitive's state (another type, or fields it does not read), listed in
    /// [`LockList::skipped`] and logged as warnings. The prefix's floor key (kept by a Redis
    /// module that deletes released locks' keys) is read into [`LockList::floor`].
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] or [`Error::Redis`] when a master does not answer in time or fails;
    /// an inspection's errors as [`inspect`](Self::inspect).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn list_locks(&self, max_scanned: u64) -> Result<LockList> {
        let core = self.core();
        let pattern = format!("{}{{*", glob_escape(&prefix_part(&core.prefix)));
        let masters = core.transport.masters().await?;
        if masters.is_empty() {
            return Err(Error::UnexpectedReply {
                name: "*".into(),
                operation: Operation::ClusterSlots,
                detail: "no master serves a slot".into(),
            });
        }
        let count = SCAN_COUNT.min(max_scanned.max(1));
        let mut keys = BTreeSet::new();
        let mut list = LockList::default();
        'masters: for master in &masters {
            let mut cursor = 0u64;
            loop {
                if list.scanned >= max_scanned {
                    list.truncated = true;
                    break 'masters;
                }
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(count);
                let reply = core
                    .transport
                    .run_on(master.as_ref(), cmd, Operation::Scan)
                    .await?;
                let (next, found): (u64, Vec<String>) = parse_reply("*", Operation::Scan, reply)?;
                list.scanned += count;
                keys.extend(found);
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        let floor_key = format!("{}{{floor}}:floor", prefix_part(&core.prefix));
        for key in keys {
            if key == floor_key {
                // Only a standalone server's module keeps one (a hand-written one elsewhere, or
                // one that is not a number, is not reported).
                if core.transport.topology() == Topology::Standalone {
                    let mut get = redis::cmd("GET");
                    get.arg(&key);
                    list.floor = match core.transport.run_on_master(0, get, Operation::Scan).await {
                        Ok(value) => redis::from_redis_value::<Option<String>>(value)
                            .ok()
                            .flatten()
                            .and_then(|text| text.parse().ok()),
                        Err(err) if is_foreign(&err) => None,
                        Err(err) => return Err(err),
                    };
                }
                continue;
            }
            let Some((kind, name, placement)) = parse_key(&core.prefix, &key) else {
                continue;
            };
            match self.inspect_at(kind, &name, &placement).await {
                Ok(found) => list.locks.push(found),
                Err(err) if is_foreign(&err) => {
                    tracing::warn!(key = %key, error = %err, "skipped a key that is not a primitive's");
                    list.skipped.push(key);
                }
                Err(err) => return Err(err),
            }
        }
        list.locks
            .sort_by(|a, b| (&a.name, a.kind).cmp(&(&b.name, b.kind)));
        Ok(list)
    }

    fn kind_keys(&self, kind: Kind, name: &str, placement: &Placement) -> Result<LockKeys> {
        LockKeys::of_kind(&self.core().prefix, name, placement, kind.key_suffix())
    }
}

/// `<prefix>:` (or nothing for an empty prefix): what every key of the client starts with.
fn prefix_part(prefix: &str) -> String {
    if prefix.is_empty() {
        String::new()
    } else {
        format!("{prefix}:")
    }
}

/// `text` with Redis glob characters (`*?[]\`) escaped for `SCAN MATCH`.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Undoes the key escaping of names and tags (`%25`, `%7B`, `%7D`).
fn unescape(text: &str) -> String {
    text.replace("%7B", "{")
        .replace("%7D", "}")
        .replace("%25", "%")
}

/// The kind, name and placement of a key under `prefix`, when it is one a client makes:
/// `<prefix>:{<name>}:<suffix>` or `<prefix>:{<tag>}:<name>:<suffix>` (checked by building the
/// key again).
fn parse_key(prefix: &str, key: &str) -> Option<(Kind, String, Placement)> {
    let rest = key.strip_prefix(&prefix_part(prefix))?.strip_prefix('{')?;
    let (tag, tail) = rest.split_once('}')?;
    let (middle, suffix) = tail.rsplit_once(':')?;
    let kind = Kind::from_suffix(suffix)?;
    let (name, placement) = if middle.is_empty() {
        (unescape(tag), Placement::ByName)
    } else {
        (
            unescape(middle.strip_prefix(':')?),
            Placement::Tag(unescape(tag)),
        )
    };
    let again = LockKeys::of_kind(prefix, &name, &placement, suffix).ok()?;
    (again.lock_key() == key).then_some((kind, name, placement))
}

/// The inspection array of `inspect.lua` for `keys`.
fn decode(keys: &LockKeys, kind: Kind, operation: Operation, reply: Value) -> Result<Inspection> {
    let name = keys.name();
    let v: Vec<i64> = parse_reply(name, operation, reply)?;
    let [exists, held, fence, lease, holds, waiters, a, b, c] = v[..] else {
        return Err(Error::UnexpectedReply {
            name: name.to_owned(),
            operation,
            detail: format!("{} fields, expected 9", v.len()),
        });
    };
    let count = |n: i64| u64::try_from(n).ok();
    let token = |n: i64| u64::try_from(n).ok().and_then(FenceToken::new);
    let mut found = Inspection {
        name: name.to_owned(),
        kind,
        key: keys.lock_key().to_owned(),
        slot: keys.slot(),
        exists: exists == 1,
        held: held == 1,
        fence: token(fence),
        lease_left: count(lease).map(Duration::from_millis),
        holds: count(holds).unwrap_or(0),
        waiters: count(waiters),
        readers: None,
        permits_in_use: None,
        permit_limit: None,
        latch_count: None,
        latch_generation: None,
        latch_opened: None,
    };
    match kind {
        Kind::ReadWrite => found.readers = count(a),
        Kind::Semaphore => {
            found.permit_limit = count(a).filter(|&n| n > 0);
            found.permits_in_use = count(b);
        }
        Kind::Latch => {
            found.latch_count = count(a);
            found.latch_generation = token(b);
            found.latch_opened = token(c);
        }
        Kind::Mutex | Kind::Fair => {}
    }
    Ok(found)
}

/// The force-unlock script of `kind`'s keys.
fn force_script(kind: Kind) -> &'static LuaScript {
    match kind {
        Kind::Mutex => &FORCE_UNLOCK,
        Kind::ReadWrite => &RW_FORCE_UNLOCK,
        Kind::Fair => &FAIR_FORCE_UNLOCK,
        Kind::Semaphore => &SEMAPHORE_FORCE_UNLOCK,
        Kind::Latch => &LATCH_FORCE_UNLOCK,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_decode_to_their_kind_name_and_placement() {
        for kind in Kind::ALL {
            for (name, placement) in [
                ("orders:42", Placement::ByName),
                ("we{ir}d%", Placement::ByName),
                ("a:b", Placement::Tag("t{1}".into())),
                ("x", Placement::Slot(12739)),
            ] {
                let keys =
                    LockKeys::of_kind("fencelock", name, &placement, kind.key_suffix()).unwrap();
                let (k, n, p) = parse_key("fencelock", keys.lock_key()).unwrap();
                assert_eq!((k, n.as_str()), (kind, name));
                let again = LockKeys::of_kind("fencelock", &n, &p, k.key_suffix()).unwrap();
                assert_eq!(again.lock_key(), keys.lock_key());
            }
        }
        assert!(parse_key("fencelock", "fencelock:{a}:other").is_none());
        assert!(parse_key("fencelock", "other:{a}:lock").is_none());
        assert!(parse_key("", "{a}:lock").is_some());
        assert_eq!(glob_escape("p*[x]"), "p\\*\\[x\\]");
    }
}
