//! The catalog: one static per script fencelock runs, grouped by primitive, the snippets they
//! are built from, and the public list of them all ([`lua_scripts`], [`ScriptSource`]).
//!
//! Each script's KEYS/ARGV/replies contract is written once, in the comment header of its file
//! in `script/lua/` (not sent to the server); the doc comment of a static names that file.

use std::sync::LazyLock;

use super::assemble::{inline_at, inline_at_queue, inline_fence, LuaScript};

/// A Lua script fencelock runs, for review or for preloading with `SCRIPT LOAD`.
///
/// # Examples
///
/// ```
/// let names: Vec<_> = fencelock::lua_scripts().map(|s| s.name).collect();
/// assert_eq!(
///     names,
///     [
///         "acquire", "acquire_batch", "acquire_floor", "acquire_floor_batch", "lock_all",
///         "lock_all_floor", "release", "release_batch", "handoff", "handoff_floor",
///         "extend", "extend_batch", "reenter", "reenter_batch", "renew", "fenced_set",
///         "latch_set", "latch_count_down", "latch_state",
///         "rw_read", "rw_read_batch", "rw_write", "rw_write_batch", "rw_release",
///         "rw_release_batch", "rw_extend", "rw_extend_batch", "rw_renew", "rw_reenter",
///         "rw_downgrade", "rw_withdraw",
///         "fair_acquire", "fair_acquire_batch", "fair_release", "fair_release_batch",
///         "fair_withdraw", "fair_extend", "fair_extend_batch", "fair_renew", "fair_renew_place",
///         "semaphore_acquire", "semaphore_acquire_batch", "semaphore_release",
///         "semaphore_release_batch", "semaphore_extend", "semaphore_extend_batch",
///         "semaphore_renew", "semaphore_available", "semaphore_set_limit",
///         "inspect", "force_unlock", "rw_force_unlock", "fair_force_unlock",
///         "semaphore_force_unlock", "latch_force_unlock", "quorum_commit",
///     ]
/// );
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ScriptSource {
    /// What the script does: `acquire`, `release`, `extend`, `reenter`, `renew`, `fenced_set`,
    /// `acquire_floor`, `lock_all_floor` and `handoff_floor` (`acquire`, the multi-lock's
    /// `lock_all` and `handoff` reading the floor key a Redis module that deletes released
    /// locks' keys keeps: standalone only),
    /// `inspect`, `force_unlock`, `quorum_commit` (the quorum lock's second round), or a
    /// primitive's script named `<primitive>_<operation>`: `rw_*` (read-write lock), `fair_*`,
    /// `semaphore_*`, `latch_*`. `<name>_batch` runs script `<name>` for many keys of one node
    /// in one call (the client's per-node batching).
    pub name: &'static str,
    /// The SHA1 Redis caches it under (`EVALSHA`).
    pub sha1: &'static str,
    /// The Lua source, `#!lua` first line included, without a trailing newline (the SHA1 is
    /// computed over exactly this text).
    pub source: &'static str,
}

/// Every Lua script fencelock runs, batch twins after their script. Each script's KEYS, ARGV
/// and replies are documented in the comment header of its file in `src/script/lua/` (the
/// header is not part of [`ScriptSource::source`]).
pub fn lua_scripts() -> impl Iterator<Item = ScriptSource> {
    [
        &*ACQUIRE,
        &*ACQUIRE_FLOOR,
        &*LOCK_ALL,
        &*LOCK_ALL_FLOOR,
        &*RELEASE,
        &*HANDOFF,
        &*HANDOFF_FLOOR,
        &*EXTEND,
        &*REENTER,
        &*RENEW,
        &*FENCED_SET,
        &*LATCH_SET,
        &*LATCH_COUNT_DOWN,
        &*LATCH_STATE,
        &*RW_READ,
        &*RW_WRITE,
        &*RW_RELEASE,
        &*RW_EXTEND,
        &*RW_RENEW,
        &*RW_REENTER,
        &*RW_DOWNGRADE,
        &*RW_WITHDRAW,
        &*FAIR_ACQUIRE,
        &*FAIR_RELEASE,
        &*FAIR_WITHDRAW,
        &*FAIR_EXTEND,
        &*FAIR_RENEW,
        &*FAIR_RENEW_PLACE,
        &*SEMAPHORE_ACQUIRE,
        &*SEMAPHORE_RELEASE,
        &*SEMAPHORE_EXTEND,
        &*SEMAPHORE_RENEW,
        &*SEMAPHORE_AVAILABLE,
        &*SEMAPHORE_SET_LIMIT,
        &*INSPECT,
        &*FORCE_UNLOCK,
        &*RW_FORCE_UNLOCK,
        &*FAIR_FORCE_UNLOCK,
        &*SEMAPHORE_FORCE_UNLOCK,
        &*LATCH_FORCE_UNLOCK,
        &*QUORUM_COMMIT,
    ]
    .into_iter()
    .flat_map(|script| std::iter::once(script).chain(script.batch()))
    .map(|script| ScriptSource {
        name: script.name(),
        sha1: script.sha(),
        source: script.source(),
    })
}

// Snippets: inserted after the prologue (see `LuaScript::with_snippets`), each documented in
// its file's header.

/// The fence rule every granting script shares (`next_fence`). Contract: `script/lua/fence.lua`.
const FENCE_RULE: &str = include_str!("lua/fence.lua");

/// The lock prologue's helpers `keep` (the key-expiry rule) and `clear`, for the scripts that
/// call them (acquire and release inline their common paths instead). Contract:
/// `script/lua/keep.lua`.
const KEEP: &str = include_str!("lua/keep.lua");

/// The expiry that is only ever raised (`raise`), for keys holding other callers' entries.
/// Contract: `script/lua/raise.lua`.
const RAISE: &str = include_str!("lua/raise.lua");

/// The head of the watchdog's renew scripts (`now_ms`, `grace`, `codes`).
/// Contract: `script/lua/renew_head.lua`.
const RENEW_HEAD: &str = include_str!("lua/renew_head.lua");

/// A watchdog renew script: [`RENEW_HEAD`], then `file`.
fn renew_script(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::with_head(name, RENEW_HEAD, file)
}

/// The lock prologue's expiry rule `keep` for the scripts on the own prologue.
/// Contract: `script/lua/own_keep.lua`.
const OWN_KEEP: &str = include_str!("lua/own_keep.lua");

/// The read-write lock's state, read with one `HMGET`. Contract: `script/lua/rw_prologue.lua`.
const RW_PROLOGUE: &str = include_str!("lua/rw_prologue.lua");

/// The read-write lock's state, read with one `HGETALL` (for `rw_write`).
/// Contract: `script/lua/rw_state_all.lua`.
const RW_STATE_ALL: &str = include_str!("lua/rw_state_all.lua");

/// The read-write lock's `forget` (remove an entry and its holds).
/// Contract: `script/lua/rw_forget.lua`.
const RW_FORGET: &str = include_str!("lua/rw_forget.lua");

/// The read-write lock's `raise` (the key's expiry, never shortened).
/// Contract: `script/lua/rw_raise.lua`.
const RW_RAISE: &str = include_str!("lua/rw_raise.lua");

/// The read-write lock's `set_until` (move an owner's lease). Contract: `script/lua/rw_lease.lua`.
const RW_LEASE: &str = include_str!("lua/rw_lease.lua");

/// The read-write lock's `role` and `settle` (an owner's own entry).
/// Contract: `script/lua/rw_entry.lua`.
const RW_ENTRY: &str = include_str!("lua/rw_entry.lua");

/// The read-write lock's `was_forced` and `announce`. Contract: `script/lua/rw_notice.lua`.
const RW_NOTICE: &str = include_str!("lua/rw_notice.lua");

/// The read-write lock's snippets for a call on an owner's own entry that may report a forced
/// unlock or announce ([`RW_OWN_LEASE`] also moves the lease and raises the expiry).
const RW_OWN_NOTICE: [&str; 4] = [OWN_KEEP, RW_PROLOGUE, RW_ENTRY, RW_NOTICE];

/// [`RW_OWN_NOTICE`], and the lease move and the expiry raise.
const RW_OWN_LEASE: [&str; 6] = [
    OWN_KEEP,
    RW_PROLOGUE,
    RW_ENTRY,
    RW_NOTICE,
    RW_LEASE,
    RW_RAISE,
];

/// The fair lock's queue (`scan`, `raise`, `wake`). Contract: `script/lua/fair.lua`.
const FAIR: &str = include_str!("lua/fair.lua");

/// A mutex script whose `--@clear` line (inside its branch for a re-entered lock) is replaced
/// by `script/lua/clear_holds.lua`: keep.lua's `clear` written once, inlined where a script
/// defines no function on its common path.
fn with_clear(file: &'static str) -> &'static str {
    inline_at(file, "--@clear", &[include_str!("lua/clear_holds.lua")])
}

/// An acquire whose `--@expiry` line (after its grant's write, on its common path) is replaced
/// by the grant's expiry rule, `script/lua/grant_expiry.lua`: keep.lua's `keep` for a grant,
/// written once for the two acquires that define no function.
fn with_expiry(file: &'static str) -> &'static str {
    inline_at(file, "--@expiry", &[include_str!("lua/grant_expiry.lua")])
}

/// A mutex script whose `--@queue` line (inside the block that meets a queue) is replaced by
/// the fence rule, keep.lua's helpers, [`RAISE`], the [`FAIR`] queue and the mutex's arrival
/// index (`script/lua/mutex_queue.lua`): functions created only by a call that meets a queue
/// (`assemble::inline_at_queue`).
fn with_queue(file: &'static str) -> &'static str {
    inline_at_queue(
        file,
        &[
            FENCE_RULE,
            KEEP,
            RAISE,
            FAIR,
            include_str!("lua/mutex_queue.lua"),
        ],
    )
}

/// The semaphore's layout and the helpers every semaphore script calls (`sem_mine`, ...).
/// Contract: `script/lua/semaphore.lua`.
const SEMAPHORE: &str = include_str!("lua/semaphore.lua");

/// The semaphore's scan and grant helpers (`sem_read`, `sem_expire`, ...).
/// Contract: `script/lua/semaphore_scan.lua`.
const SEMAPHORE_SCAN: &str = include_str!("lua/semaphore_scan.lua");

/// `inspect(kind)`, the state of one key of any kind. Contract: `script/lua/inspect.lua`.
const INSPECT_SNIPPET: &str = include_str!("lua/inspect.lua");

/// A granting script: the prologue, the [`FENCE_RULE`] and [`KEEP`], then `file`.
fn fenced(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::with_snippets(name, &[FENCE_RULE, KEEP], file)
}

/// A read-write lock script: the own prologue, then `snippets` (the state and the helpers it
/// calls, and no others: each function a script defines costs it per call), then `file`.
fn rw_script(name: &'static str, snippets: &[&'static str], file: &'static str) -> LuaScript {
    LuaScript::own(name, snippets, file)
}

/// [`rw_script`], with a batch twin (the calls on the hot path).
fn rw_batchable(name: &'static str, snippets: &[&'static str], file: &'static str) -> LuaScript {
    LuaScript::own_batchable(name, snippets, file)
}

/// A fair lock script: the prologue, the fence rule, [`KEEP`], [`RAISE`], the [`FAIR`] queue,
/// then `file`.
fn fair_script(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::with_snippets(name, &[FENCE_RULE, KEEP, RAISE, FAIR], file)
}

/// [`fair_script`], with a batch twin (the calls on the hot path).
fn fair_batchable(name: &'static str, file: &'static str) -> LuaScript {
    LuaScript::batchable(name, &[FENCE_RULE, KEEP, RAISE, FAIR], file)
}

/// What a semaphore script that scans or grants starts with (after the own prologue): the fence
/// rule, `keep`, the [`SEMAPHORE`] helpers and [`SEMAPHORE_SCAN`].
const SEMAPHORE_SCANNING: &[&str] = &[FENCE_RULE, OWN_KEEP, SEMAPHORE, SEMAPHORE_SCAN];

/// A semaphore script: the own prologue, `snippets`, then `file`.
fn semaphore_script(
    name: &'static str,
    snippets: &[&'static str],
    file: &'static str,
) -> LuaScript {
    LuaScript::own(name, snippets, file)
}

/// The semaphore acquire's body with the scanning helpers (`keep`, [`SEMAPHORE`],
/// [`SEMAPHORE_SCAN`]) inlined at each `--@sem` line, inside the blocks of its rare paths (a
/// resent acquire, the scan, a many-permit grant): a one-permit grant from the index defines
/// no function but the fence rule's (`assemble::inline_at`).
fn acquire_with_helpers(file: &'static str) -> &'static str {
    inline_at(file, "--@sem", &[OWN_KEEP, SEMAPHORE, SEMAPHORE_SCAN])
}

/// The body of a script of a holder's own permits (release, extend, renew) with the
/// [`SEMAPHORE`] helpers inlined at each `--@sem` line, inside the blocks of its rare paths (a
/// release without permit numbers, a command of more than 512 arguments): a release of numbered
/// permits, an extend and a renewal define no function (`assemble::inline_at`).
fn holder_with_helpers(file: &'static str) -> &'static str {
    inline_at(file, "--@sem", &[SEMAPHORE])
}

/// [`semaphore_script`], with a batch twin (the calls on the hot path).
fn semaphore_batchable(
    name: &'static str,
    snippets: &[&'static str],
    file: &'static str,
) -> LuaScript {
    LuaScript::own_batchable(name, snippets, file)
}

// The mutex.

/// Grant the lock to an owner and advance its fence. Contract: `script/lua/acquire.lua`.
pub(crate) static ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| acquire("acquire", FENCE_RULE));

/// [`ACQUIRE`] whose grant of a lock without a key, in a clock mode, takes the floor key of a
/// module that deletes released locks' keys as the lock's last fence: sent to a standalone
/// server that may load the module (the module serves both with `fencelock.acquire`).
/// Contract: `script/lua/acquire.lua`, `script/lua/floor_read.lua`.
pub(crate) static ACQUIRE_FLOOR: LazyLock<LuaScript> =
    LazyLock::new(|| acquire("acquire_floor", &FLOOR_RULE));

/// The mutex's acquire on the fence rule `rule` ([`FENCE_RULE`] or [`FLOOR_RULE`]).
fn acquire(name: &'static str, rule: &'static str) -> LuaScript {
    LuaScript::batchable(
        name,
        &[],
        with_queue(inline_fence(
            with_clear(with_expiry(include_str!("lua/acquire.lua"))),
            rule,
        )),
    )
    .served_by("fencelock.acquire", 6, true)
}

/// The fence rule with the floor key's read (`script/lua/floor_read.lua`) at its `--@floor`
/// line.
static FLOOR_RULE: LazyLock<&'static str> = LazyLock::new(|| {
    inline_at(
        FENCE_RULE,
        "--@floor",
        &[include_str!("lua/floor_read.lua")],
    )
});

/// Grant several locks of one slot to one owner, all or none (the multi-lock).
/// Contract: `script/lua/lock_all.lua`.
pub(crate) static LOCK_ALL: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets("lock_all", &[FENCE_RULE, KEEP, RAISE], lock_all_file())
});

/// `script/lua/lock_all.lua` with the mutex's queue (fair.lua's helpers and
/// `script/lua/mutex_queue.lua`) at its `--@queue` line, the block that meets a lock marked
/// queued: the walk to the queue's head is the mutex's own.
fn lock_all_file() -> &'static str {
    static FILE: LazyLock<&'static str> = LazyLock::new(|| {
        inline_at_queue(
            include_str!("lua/lock_all.lua"),
            &[FAIR, include_str!("lua/mutex_queue.lua")],
        )
    });
    *FILE
}

/// [`LOCK_ALL`] reading the floor key as [`ACQUIRE_FLOOR`] does.
/// Contract: `script/lua/lock_all.lua`, `script/lua/floor_read.lua`.
pub(crate) static LOCK_ALL_FLOOR: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "lock_all_floor",
        &[*FLOOR_RULE, KEEP, RAISE],
        lock_all_file(),
    )
});

/// End one hold; the last frees the lock. Replies an [`Outcome`](super::Outcome) code.
/// Contract: `script/lua/release.lua`.
pub(crate) static RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::batchable(
        "release",
        &[],
        with_queue(with_clear(include_str!("lua/release.lua"))),
    )
    .served_by("fencelock.release", 4, false)
});

/// Release A's hold and grant B of the same client in one call. No batch twin: it
/// is sent on its own (`Transport::run_direct`). Contract: `script/lua/handoff.lua`.
pub(crate) static HANDOFF: LazyLock<LuaScript> =
    LazyLock::new(|| fenced("handoff", with_queue(include_str!("lua/handoff.lua"))));

/// [`HANDOFF`] reading the floor key as [`ACQUIRE_FLOOR`] does (a lock whose key a module
/// deleted after the releasing holder's lease ended). Contract: `script/lua/handoff.lua`,
/// `script/lua/floor_read.lua`.
pub(crate) static HANDOFF_FLOOR: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "handoff_floor",
        &[*FLOOR_RULE, KEEP],
        with_queue(include_str!("lua/handoff.lua")),
    )
});

/// Move an owner's lease end to now + TTL. Contract: `script/lua/extend.lua`.
pub(crate) static EXTEND: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::batchable("extend", &[KEEP], include_str!("lua/extend.lua")).served_by(
        "fencelock.extend",
        3,
        false,
    )
});

/// Add a hold to a lock this owner holds, with the same fence. Contract: `script/lua/reenter.lua`.
pub(crate) static REENTER: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::batchable("reenter", &[KEEP], include_str!("lua/reenter.lua")).served_by(
        "fencelock.reenter",
        4,
        false,
    )
});

/// The watchdog's batch: extend many leases on one node in one call.
/// Contract: `script/lua/renew.lua`.
pub(crate) static RENEW: LazyLock<LuaScript> = LazyLock::new(|| {
    renew_script("renew", include_str!("lua/renew.lua")).served_alone_by("fencelock.renew")
});

// Storage kept in Redis.

/// Store a value only under a fence no lower than any accepted before.
/// Contract: `script/lua/fenced_set.lua`.
pub(crate) static FENCED_SET: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("fenced_set", include_str!("lua/fenced_set.lua")));

// The countdown latch.

/// Start a new generation of a latch (its fence). Contract: `script/lua/latch_set.lua`.
pub(crate) static LATCH_SET: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::own(
        "latch_set",
        &[FENCE_RULE, OWN_KEEP],
        include_str!("lua/latch_set.lua"),
    )
});

/// Count one id down in a latch's generation. Contract: `script/lua/latch_count_down.lua`.
pub(crate) static LATCH_COUNT_DOWN: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("latch_count_down", include_str!("lua/latch_count_down.lua")));

/// A latch's state (`no-writes`). Contract: `script/lua/latch_state.lua`.
pub(crate) static LATCH_STATE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("latch_state", include_str!("lua/latch_state.lua")));

// The read-write lock.

/// Grant a read hold. Contract: `script/lua/rw_read.lua`.
pub(crate) static RW_READ: LazyLock<LuaScript> = LazyLock::new(|| {
    rw_batchable(
        "rw_read",
        &[FENCE_RULE, RW_PROLOGUE, RW_FORGET, RW_RAISE],
        include_str!("lua/rw_read.lua"),
    )
});

/// Grant the write hold, or record the waiting writer's intent.
/// Contract: `script/lua/rw_write.lua`.
pub(crate) static RW_WRITE: LazyLock<LuaScript> = LazyLock::new(|| {
    rw_batchable(
        "rw_write",
        &[FENCE_RULE, RW_STATE_ALL, RW_FORGET, RW_RAISE],
        include_str!("lua/rw_write.lua"),
    )
});

/// End a read or write hold (the release of its [`Kind`](crate::held::Scripts)).
/// Contract: `script/lua/rw_release.lua`.
pub(crate) static RW_RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    rw_batchable(
        "rw_release",
        &[OWN_KEEP, RW_PROLOGUE, RW_ENTRY, RW_FORGET],
        include_str!("lua/rw_release.lua"),
    )
});

/// Move a read or write hold's lease end to now + TTL. Contract: `script/lua/rw_extend.lua`.
pub(crate) static RW_EXTEND: LazyLock<LuaScript> = LazyLock::new(|| {
    rw_batchable(
        "rw_extend",
        &RW_OWN_LEASE,
        include_str!("lua/rw_extend.lua"),
    )
});

/// The watchdog's batch for read and write holds. Contract: `script/lua/rw_renew.lua`.
pub(crate) static RW_RENEW: LazyLock<LuaScript> =
    LazyLock::new(|| renew_script("rw_renew", include_str!("lua/rw_renew.lua")));

/// Add a hold to this owner's read entry or write hold. Contract: `script/lua/rw_reenter.lua`.
pub(crate) static RW_REENTER: LazyLock<LuaScript> = LazyLock::new(|| {
    rw_script(
        "rw_reenter",
        &RW_OWN_LEASE,
        include_str!("lua/rw_reenter.lua"),
    )
});

/// Turn a write hold into a read hold. Contract: `script/lua/rw_downgrade.lua`.
pub(crate) static RW_DOWNGRADE: LazyLock<LuaScript> = LazyLock::new(|| {
    rw_script(
        "rw_downgrade",
        &RW_OWN_NOTICE,
        include_str!("lua/rw_downgrade.lua"),
    )
});

/// Withdraw a waiting writer's intent. Contract: `script/lua/rw_withdraw.lua`.
pub(crate) static RW_WITHDRAW: LazyLock<LuaScript> = LazyLock::new(|| {
    rw_script(
        "rw_withdraw",
        &RW_OWN_NOTICE,
        include_str!("lua/rw_withdraw.lua"),
    )
});

// The fair lock.

/// Grant the fair lock in arrival order, or keep the caller's place.
/// Contract: `script/lua/fair_acquire.lua`; served by the module's `fencelock.fair_acquire`
/// where a node loads it.
pub(crate) static FAIR_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::batchable(
        "fair_acquire",
        &[],
        with_queue(inline_fence(
            with_expiry(include_str!("lua/fair_acquire.lua")),
            FENCE_RULE,
        )),
    )
    .served_alone_by("fencelock.fair_acquire")
});

/// Free the fair lock and hand it to the head of its queue. Contract:
/// `script/lua/fair_release.lua`; served by the module's `fencelock.fair_release` where a node
/// loads it.
pub(crate) static FAIR_RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::batchable(
        "fair_release",
        &[],
        with_queue(include_str!("lua/fair_release.lua")),
    )
    .served_alone_by("fencelock.fair_release")
});

/// Give up a waiting call's place (and a grant it never read).
/// Contract: `script/lua/fair_withdraw.lua`.
pub(crate) static FAIR_WITHDRAW: LazyLock<LuaScript> =
    LazyLock::new(|| fair_script("fair_withdraw", include_str!("lua/fair_withdraw.lua")));

/// Move the fair lock's lease end to now + TTL. Contract: `script/lua/fair_extend.lua`.
pub(crate) static FAIR_EXTEND: LazyLock<LuaScript> =
    LazyLock::new(|| fair_batchable("fair_extend", include_str!("lua/fair_extend.lua")));

/// The watchdog's batch for held fair locks. Contract: `script/lua/fair_renew.lua`.
pub(crate) static FAIR_RENEW: LazyLock<LuaScript> =
    LazyLock::new(|| renew_script("fair_renew", include_str!("lua/fair_renew.lua")));

/// The watchdog's batch for waiting places. Contract: `script/lua/fair_renew_place.lua`.
pub(crate) static FAIR_RENEW_PLACE: LazyLock<LuaScript> =
    LazyLock::new(|| renew_script("fair_renew_place", include_str!("lua/fair_renew_place.lua")));

// The semaphore.

/// Take `count` permits for one owner, all or none. Contract: `script/lua/semaphore_acquire.lua`.
pub(crate) static SEMAPHORE_ACQUIRE: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_batchable(
        "semaphore_acquire",
        &[FENCE_RULE],
        acquire_with_helpers(include_str!("lua/semaphore_acquire.lua")),
    )
});

/// Release an owner's permits, or withdraw a waiter's reservation.
/// Contract: `script/lua/semaphore_release.lua`.
pub(crate) static SEMAPHORE_RELEASE: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_batchable(
        "semaphore_release",
        &[],
        holder_with_helpers(include_str!("lua/semaphore_release.lua")),
    )
});

/// Move the lease end of an owner's permits to now + TTL.
/// Contract: `script/lua/semaphore_extend.lua`.
pub(crate) static SEMAPHORE_EXTEND: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_batchable(
        "semaphore_extend",
        &[],
        holder_with_helpers(include_str!("lua/semaphore_extend.lua")),
    )
});

/// The watchdog's batch for semaphore holds. Contract: `script/lua/semaphore_renew.lua`.
pub(crate) static SEMAPHORE_RENEW: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_script(
        "semaphore_renew",
        &[],
        holder_with_helpers(include_str!("lua/semaphore_renew.lua")),
    )
});

/// The stored limit and the live permits (`no-writes`).
/// Contract: `script/lua/semaphore_available.lua`.
pub(crate) static SEMAPHORE_AVAILABLE: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_script(
        "semaphore_available",
        SEMAPHORE_SCANNING,
        include_str!("lua/semaphore_available.lua"),
    )
});

/// Store a new limit. Contract: `script/lua/semaphore_set_limit.lua`.
pub(crate) static SEMAPHORE_SET_LIMIT: LazyLock<LuaScript> = LazyLock::new(|| {
    semaphore_script(
        "semaphore_set_limit",
        SEMAPHORE_SCANNING,
        include_str!("lua/semaphore_set_limit.lua"),
    )
});

// Operators: inspection and forced unlocks (one per kind, the same ARGV).

/// The state of one key of any kind (`no-writes`).
/// Contract: `script/lua/inspect_read.lua`.
pub(crate) static INSPECT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::own(
        "inspect",
        &[INSPECT_SNIPPET],
        include_str!("lua/inspect_read.lua"),
    )
});

/// Free a mutex whoever holds it.
/// Contract: `script/lua/force_unlock.lua`.
pub(crate) static FORCE_UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "force_unlock",
        &[KEEP, INSPECT_SNIPPET],
        with_queue(include_str!("lua/force_unlock.lua")),
    )
});

/// Free a read-write lock's writer and readers.
/// Contract: `script/lua/rw_force_unlock.lua`.
pub(crate) static RW_FORCE_UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::own(
        "rw_force_unlock",
        &[OWN_KEEP, RW_PROLOGUE, RW_ENTRY, RW_NOTICE, INSPECT_SNIPPET],
        include_str!("lua/rw_force_unlock.lua"),
    )
});

/// Free a fair lock's holder (its queue stays).
/// Contract: `script/lua/fair_force_unlock.lua`.
pub(crate) static FAIR_FORCE_UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "fair_force_unlock",
        &[FENCE_RULE, KEEP, RAISE, FAIR, INSPECT_SNIPPET],
        include_str!("lua/fair_force_unlock.lua"),
    )
});

/// Free every live permit of a semaphore.
/// Contract: `script/lua/semaphore_force_unlock.lua`.
pub(crate) static SEMAPHORE_FORCE_UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::own(
        "semaphore_force_unlock",
        &[OWN_KEEP, SEMAPHORE, SEMAPHORE_SCAN, INSPECT_SNIPPET],
        include_str!("lua/semaphore_force_unlock.lua"),
    )
});

/// Open an armed latch.
/// Contract: `script/lua/latch_force_unlock.lua`.
pub(crate) static LATCH_FORCE_UNLOCK: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::own(
        "latch_force_unlock",
        &[OWN_KEEP, INSPECT_SNIPPET],
        include_str!("lua/latch_force_unlock.lua"),
    )
});

// The quorum lock.

/// The quorum lock's second round: raise a node's fence to the chosen token.
/// Contract: `script/lua/quorum_commit.lua`.
pub(crate) static QUORUM_COMMIT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::with_snippets(
        "quorum_commit",
        &[KEEP],
        include_str!("lua/quorum_commit.lua"),
    )
});
