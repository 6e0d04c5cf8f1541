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

/// What fence.lua's check of a key's slot found: its `EXISTS key key:~` (two keys, the second
/// never written) answered, or the server refused it as fence.lua classifies the refusal.
#[derive(Debug, PartialEq, Eq)]
pub enum SlotCheck {
    /// Answered: this node serves the slot, and it does not migrate.
    Stable,
    /// Refused as fence.lua's refusal naming a non local key or rehashing: a slot this node
    /// imports or exports (`ASK`, `TRYAGAIN`); the grant is refused with `TRYAGAIN`.
    Migrating,
    /// Refused otherwise: fence.lua's grant answers this error reply as it is.
    Refused(&'static str),
}

/// fence.lua's check of the slot of `key` before a grant with no stored fence: the same call,
/// `EXISTS key key:~`, which the server's cluster check refuses (through `RM_Call`, with the
/// calling client's `ASKING`) in a slot that migrates, and answers on a node that owns it.
/// `RM_Call` tells a refusal only by errno (`EPERM` for every refusal but a cluster that is
/// down, whose texts a script sees as they are), where the script sees the server's text, so a
/// refusal is classified from what the server would have told the script
/// ([`classify_refusal`]): whether the two keys are in different slots (a key without a hash
/// tag), and the server's version.
pub fn check_slot(ctx: *mut RedisModuleCtx, key: &[u8]) -> SlotCheck {
    let mut never_written = Vec::with_capacity(key.len() + 2);
    never_written.extend_from_slice(key);
    never_written.extend_from_slice(b":~");
    // SAFETY: the command's context; static C strings; each buffer is passed with its length
    // and outlives the call; the reply is freed before returning, errno read right after the
    // call. Presence checked at load.
    unsafe {
        let Some(call) = raw::RedisModule_Call else {
            return SlotCheck::Migrating;
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
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            let version = { raw::RedisModule_GetServerVersion }.map_or(0, |f| f());
            return classify_refusal(errno, key_slot(key) != key_slot(&never_written), version);
        }
        if let Some(free) = raw::RedisModule_FreeCallReply {
            free(reply);
        }
        SlotCheck::Stable
    }
}

/// The first server version (`RM_GetServerVersion`, 0x00MMmmpp) whose scripts tell a command
/// of keys in two slots from one in a slot that migrates: Redis 7.4 ("Command '<name>' in
/// script attempted to access keys that don't hash to the same slot"); before it both are "a
/// non local key". Valkey reports its own version here (8.0 has the new text, 7.2 the old).
const SCRIPTS_TELL_CROSS_SLOT: i32 = 0x0007_0400;

/// How fence.lua classifies the refusal of its `EXISTS key key:~` (its error names a non
/// local key or rehashing: migrating; any other error is the grant's reply), from what
/// `RM_Call` tells of it: `errno` (`ENETDOWN`, `EROFS`: a cluster that is down; `EPERM`: any
/// other refusal), whether the two keys are in different slots (`crosses`), and the server's
/// `version`. The script's texts, by server (script.c, `scriptVerifyClusterState`): keys of
/// two slots are "a non local key" before Redis 7.4 and "keys that don't hash to the same slot"
/// from it; a slot that migrates is "a non local key" or (7.4) "rehashing"; a cluster that is
/// down is named so in every version.
pub fn classify_refusal(errno: i32, crosses: bool, version: i32) -> SlotCheck {
    match errno {
        libc::ENETDOWN => SlotCheck::Refused(
            "ERR Script attempted to execute a command while the cluster is down",
        ),
        libc::EROFS => SlotCheck::Refused(
            "ERR Script attempted to execute a write command while the cluster is down and \
             readonly",
        ),
        _ if crosses && version >= SCRIPTS_TELL_CROSS_SLOT => SlotCheck::Refused(
            "ERR Command 'exists' in script attempted to access keys that don't hash to the \
             same slot",
        ),
        _ => SlotCheck::Migrating,
    }
}

/// CRC16 (XMODEM), the cluster's key hash (the `crc16` crate, as the client computes slots).
fn crc16(data: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(data)
}

/// The cluster hash slot of `key` (`CLUSTER KEYSLOT`): CRC16 of its hash tag (what lies between
/// its first `{` and the first `}` after it, when not empty), else of the whole key, mod 16384.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&close| close > 0)
            .map(|close| &rest[..close])
    });
    crc16(tagged.unwrap_or(key)) & 0x3fff
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
    fn key_slots_as_cluster_keyslot() {
        assert_eq!(crc16(b"123456789"), 0x31c3);
        // CLUSTER KEYSLOT on Redis 7.0.15.
        assert_eq!(key_slot(b"notag"), 15322);
        assert_eq!(key_slot(b"notag:~"), 2963);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"fencelock:{orders}:lock:~"), key_slot(b"orders"));
        // An empty tag, or none closed, hashes the whole key.
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") & 0x3fff);
        assert_eq!(key_slot(b"foo{bar"), crc16(b"foo{bar") & 0x3fff);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
    }

    #[test]
    fn refusals_classified_as_fence_lua_does() {
        let (perm, v70, v74) = (libc::EPERM, 0x0007_000f, 0x0007_0401);
        // A key without a hash tag: `key:~` is in another slot. Before 7.4 the script's error
        // names a non local key (TRYAGAIN, as the module answered); from 7.4 it names the two
        // slots, and the script answers it as it is (the module answered TRYAGAIN: a review).
        assert_eq!(classify_refusal(perm, true, v70), SlotCheck::Migrating);
        assert_eq!(
            classify_refusal(perm, true, v74),
            SlotCheck::Refused(
                "ERR Command 'exists' in script attempted to access keys that don't hash to \
                 the same slot"
            )
        );
        assert!(matches!(
            classify_refusal(perm, true, 0x0008_0000),
            SlotCheck::Refused(_)
        ));
        // One slot, refused: it migrates (ASK, TRYAGAIN), in every version.
        assert_eq!(classify_refusal(perm, false, v70), SlotCheck::Migrating);
        assert_eq!(classify_refusal(perm, false, v74), SlotCheck::Migrating);
        // A cluster that is down is named so.
        assert!(matches!(
            classify_refusal(libc::ENETDOWN, false, v70),
            SlotCheck::Refused(e) if e.contains("cluster is down")
        ));
        assert!(matches!(
            classify_refusal(libc::EROFS, true, v74),
            SlotCheck::Refused(e) if e.contains("down and readonly")
        ));
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
