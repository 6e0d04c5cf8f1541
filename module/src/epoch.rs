//! The node's config epoch (`cluster_my_epoch` of `CLUSTER INFO`) for the fence modes `epoch`
//! and `hybrid`, read cheaply: with `RM_Call` when not cached, then cached with the server's
//! monotonic time of the read. The cache is forgotten (read afresh at the next use) on a
//! replication role change, the start or end of a load, a master link change and a `CONFIG SET`
//! (the server events that can come with a new epoch or a new role), before every command that
//! can give the node a slot or a new epoch (a command filter: `CLUSTER SETSLOT`, `BUMPEPOCH`,
//! …, and `EXEC`), and anyway once it is older than `MAX_AGE_US`; inside `MULTI` it is always
//! read afresh (and the cache forgotten). So the epochs of a node's successive grants never
//! decrease: each is the node's epoch at a read, no older than the previous grant's read. Why a
//! cached epoch is safe: docs/safety.md, "The module's epoch read".
//! All of it runs on the server's main thread (commands and server events).

use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleEvent};

/// The longest a cached epoch is used (µs of the server's monotonic clock).
pub const MAX_AGE_US: u64 = 1_000_000;

/// The cached epoch plus one (0: nothing cached).
static EPOCH_PLUS_ONE: AtomicU64 = AtomicU64::new(0);
/// When it was read (the server's monotonic µs).
static READ_AT_US: AtomicU64 = AtomicU64::new(0);

/// True when every module API function the epoch read calls is present (checked at load).
pub fn check_api() -> bool {
    // SAFETY: the pointers are set once by RedisModule_Init before this runs; read by value.
    unsafe {
        { raw::RedisModule_Call }.is_some()
            && { raw::RedisModule_CallReplyType }.is_some()
            && { raw::RedisModule_CallReplyStringPtr }.is_some()
            && { raw::RedisModule_FreeCallReply }.is_some()
            && { raw::RedisModule_SubscribeToServerEvent }.is_some()
            && { raw::RedisModule_RegisterCommandFilter }.is_some()
            && { raw::RedisModule_CommandFilterArgsCount }.is_some()
            && { raw::RedisModule_CommandFilterArgGet }.is_some()
    }
}

/// The server's monotonic clock in µs, or None on a server without it (then nothing is cached).
fn monotonic_us() -> Option<u64> {
    // SAFETY: an optional API function without arguments, checked here.
    unsafe { { raw::RedisModule_MonotonicMicroseconds }.map(|f| f()) }
}

/// `cluster_my_epoch` from a `CLUSTER INFO` reply, as the scripts' `cluster_my_epoch:(%d+)`.
pub fn parse_my_epoch(info: &[u8]) -> Option<u64> {
    const FIELD: &[u8] = b"cluster_my_epoch:";
    let at = info.windows(FIELD.len()).position(|w| w == FIELD)? + FIELD.len();
    let digits = info[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    crate::state::parse_u64(&info[at..at + digits])
}

/// Reads `CLUSTER INFO` through the server (None on a server without cluster support).
fn read(ctx: *mut RedisModuleCtx) -> Option<u64> {
    // SAFETY: the command's context; static C strings; the reply is freed before returning and
    // its buffer is only read while it lives. Presence of each function was checked at load.
    unsafe {
        let call = { raw::RedisModule_Call }?;
        let reply = call(ctx, c"CLUSTER".as_ptr(), c"c".as_ptr(), c"INFO".as_ptr());
        if reply.is_null() {
            return None;
        }
        let kind = { raw::RedisModule_CallReplyType }?(reply);
        let mut epoch = None;
        if kind == raw::REDISMODULE_REPLY_STRING as c_int {
            let mut len = 0;
            let p = { raw::RedisModule_CallReplyStringPtr }?(reply, &mut len);
            if !p.is_null() {
                epoch = parse_my_epoch(std::slice::from_raw_parts(p.cast::<u8>(), len));
            }
        }
        if let Some(free) = raw::RedisModule_FreeCallReply {
            free(reply);
        }
        epoch
    }
}

/// The node's config epoch: the cached one when younger than `MAX_AGE_US`, else read and
/// cached; inside a transaction always read, and the cache forgotten. None when it cannot be
/// read (a server without cluster support).
pub fn my_epoch(ctx: *mut RedisModuleCtx) -> Option<u64> {
    // SAFETY: the command's context; the function's presence was checked at load.
    let in_multi = unsafe {
        { raw::RedisModule_GetContextFlags }
            .is_none_or(|f| f(ctx) as u32 & raw::REDISMODULE_CTX_FLAGS_MULTI != 0)
    };
    if in_multi {
        // A transaction may have run `CLUSTER SETSLOT` since its `EXEC` passed the filter:
        // read afresh, as the scripts do, and forget the cache (it may be below this read, and
        // the grants of this node must not use a lower epoch after this one).
        forget();
        return read(ctx);
    }
    let now = monotonic_us();
    let cached = EPOCH_PLUS_ONE.load(Ordering::Relaxed);
    if let Some(now) = now {
        if cached != 0 && now.saturating_sub(READ_AT_US.load(Ordering::Relaxed)) < MAX_AGE_US {
            return Some(cached - 1);
        }
    }
    let epoch = read(ctx);
    match (epoch, now) {
        (Some(e), Some(now)) if e < u64::MAX => {
            READ_AT_US.store(now, Ordering::Relaxed);
            EPOCH_PLUS_ONE.store(e + 1, Ordering::Relaxed);
        }
        _ => forget(),
    }
    epoch
}

/// Whether the slot of `key` migrates (this node imports or exports it), so that a grant with no
/// stored fence may not be made here: fence.lua's check, the same call. `EXISTS key key:~` (two
/// keys of the slot, the second never written) is refused by the server's cluster check, which
/// `RM_Call` runs with the calling client's `ASKING`, in a slot that migrates (no reply, errno
/// `EPERM`); on a node that owns the slot it answers. Any refusal counts as migrating: the grant
/// is then refused with `TRYAGAIN`, never made with a fence that could fall below the source's.
pub fn slot_migrating(ctx: *mut RedisModuleCtx, key: &[u8]) -> bool {
    let mut never_written = Vec::with_capacity(key.len() + 2);
    never_written.extend_from_slice(key);
    never_written.extend_from_slice(b":~");
    // SAFETY: the command's context; static C strings; each buffer is passed with its length
    // and outlives the call; the reply is freed before returning. Presence checked at load.
    unsafe {
        let Some(call) = raw::RedisModule_Call else {
            return true;
        };
        let reply = call(
            ctx,
            c"EXISTS".as_ptr(),
            c"bb".as_ptr(),
            key.as_ptr(),
            key.len(),
            never_written.as_ptr(),
            never_written.len(),
        );
        if reply.is_null() {
            return true;
        }
        if let Some(free) = raw::RedisModule_FreeCallReply {
            free(reply);
        }
        false
    }
}

/// Forgets the cached epoch: the next use reads it afresh.
pub fn forget() {
    EPOCH_PLUS_ONE.store(0, Ordering::Relaxed);
}

unsafe extern "C" fn on_event(
    _ctx: *mut RedisModuleCtx,
    _eid: RedisModuleEvent,
    _subevent: u64,
    _data: *mut c_void,
) {
    forget();
}

/// True when a command (its first two arguments) may give this node a slot or a new config
/// epoch, or may run such a command queued earlier: `CLUSTER SETSLOT` (a slot's import bumps the
/// importer's epoch), `ADDSLOTS`, `ADDSLOTSRANGE`, `BUMPEPOCH`, `SET-CONFIG-EPOCH`, `FAILOVER`,
/// `RESET`, `REPLICATE`, and `EXEC` (a queued command passed the filter when it was queued).
pub fn may_change_epoch(name: &[u8], sub: &[u8]) -> bool {
    if name.eq_ignore_ascii_case(b"exec") {
        return true;
    }
    name.eq_ignore_ascii_case(b"cluster")
        && [
            &b"setslot"[..],
            b"addslots",
            b"addslotsrange",
            b"bumpepoch",
            b"set-config-epoch",
            b"failover",
            b"reset",
            b"replicate",
        ]
        .iter()
        .any(|s| sub.eq_ignore_ascii_case(s))
}

/// The command filter: forgets the cached epoch before a command `may_change_epoch` runs. It
/// sees every command the server processes (clients', scripts'), so it returns after one length
/// check for all others.
unsafe extern "C" fn filter(fctx: *mut raw::RedisModuleCommandFilterCtx) {
    let (Some(count), Some(get)) = (
        raw::RedisModule_CommandFilterArgsCount,
        raw::RedisModule_CommandFilterArgGet,
    ) else {
        forget();
        return;
    };
    let name = crate::server::bytes(get(fctx, 0));
    if name.len() != 4 && name.len() != 7 {
        return;
    }
    let sub = if count(fctx) > 1 {
        crate::server::bytes(get(fctx, 1))
    } else {
        &[]
    };
    if may_change_epoch(name, sub) {
        forget();
    }
}

/// Registers `filter` (False when the server has no command filters: the cache could then miss a
/// slot's import, so the module does not load).
pub fn register_filter(ctx: *mut RedisModuleCtx) -> bool {
    // SAFETY: the load-time context; a filter that lives for the module's life. NOSELF: the
    // module's own `CLUSTER INFO` is not filtered.
    unsafe {
        match raw::RedisModule_RegisterCommandFilter {
            Some(register) => !register(
                ctx,
                Some(filter),
                raw::REDISMODULE_CMDFILTER_NOSELF as c_int,
            )
            .is_null(),
            None => false,
        }
    }
}

/// Subscribes `forget` to the server events that can come with a new role or epoch. False when
/// the replication role change cannot be subscribed (the others are optional: a server that
/// lacks one has no such event).
pub fn subscribe(ctx: *mut RedisModuleCtx) -> bool {
    let events = [
        raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
        raw::REDISMODULE_EVENT_LOADING,
        raw::REDISMODULE_EVENT_MASTER_LINK_CHANGE,
        raw::REDISMODULE_EVENT_CONFIG,
    ];
    // SAFETY: set once by RedisModule_Init before this runs; read by value.
    let Some(sub) = (unsafe { raw::RedisModule_SubscribeToServerEvent }) else {
        return false;
    };
    let mut role = false;
    for (i, id) in events.into_iter().enumerate() {
        let event = RedisModuleEvent { id, dataver: 1 };
        // SAFETY: the load-time context; a callback that lives for the module's life.
        let rc = unsafe { sub(ctx, event, Some(on_event)) };
        if i == 0 {
            role = rc == raw::REDISMODULE_OK as c_int;
        }
    }
    role
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_info() {
        let info: &[u8] = b"cluster_state:ok\r\ncluster_current_epoch:9\r\n\
            cluster_my_epoch:7\r\ncluster_stats_messages_sent:1\r\n";
        assert_eq!(parse_my_epoch(info), Some(7));
        assert_eq!(parse_my_epoch(b"cluster_my_epoch:0"), Some(0));
        assert_eq!(parse_my_epoch(b"cluster_my_epoch:\r\n"), None);
        assert_eq!(parse_my_epoch(b"cluster_state:ok\r\n"), None);
    }

    #[test]
    fn commands_that_forget_the_epoch() {
        assert!(may_change_epoch(b"CLUSTER", b"SetSlot"));
        assert!(may_change_epoch(b"cluster", b"bumpepoch"));
        assert!(may_change_epoch(b"exec", b""));
        assert!(!may_change_epoch(b"cluster", b"info"));
        assert!(!may_change_epoch(b"cluster", b""));
        assert!(!may_change_epoch(b"get", b"setslot"));
    }
}
