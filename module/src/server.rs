//! The server calls the commands make, through the module API's raw functions: the lock key
//! opened once per call (and the floor key, floor.rs), its hash field read and written, its
//! expiry, replication of the effects (never the command: it reads the clock), and the replies.
//! Every function pointer used here is checked when the module loads (`check_api`), so none is
//! missing at call time.

use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_longlong};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};

use crate::rules::Expiry;
use crate::state::{parse_u64, State};

/// Calls a module API function; its presence was checked at load (`check_api`).
macro_rules! api {
    ($name:ident) => {
        match raw::$name {
            Some(f) => f,
            None => panic!(concat!(stringify!($name), " missing (checked at load)")),
        }
    };
}

/// True when every module API function the commands call is present (checked at load).
pub fn check_api() -> bool {
    // SAFETY: the pointers are set once by RedisModule_Init before this runs; read by value.
    unsafe {
        { raw::RedisModule_OpenKey }.is_some()
            && { raw::RedisModule_CloseKey }.is_some()
            && { raw::RedisModule_KeyType }.is_some()
            && { raw::RedisModule_HashGet }.is_some()
            && { raw::RedisModule_HashSet }.is_some()
            && { raw::RedisModule_GetAbsExpire }.is_some()
            && { raw::RedisModule_SetAbsExpire }.is_some()
            && { raw::RedisModule_SetExpire }.is_some()
            && { raw::RedisModule_Replicate }.is_some()
            && { raw::RedisModule_CreateString }.is_some()
            && { raw::RedisModule_FreeString }.is_some()
            && { raw::RedisModule_StringPtrLen }.is_some()
            && { raw::RedisModule_ReplyWithLongLong }.is_some()
            && { raw::RedisModule_ReplyWithArray }.is_some()
            && { raw::RedisModule_ReplyWithError }.is_some()
            && { raw::RedisModule_NotifyKeyspaceEvent }.is_some()
            && { raw::RedisModule_GetContextFlags }.is_some()
            && { raw::RedisModule_PublishMessage }.is_some()
            && { raw::RedisModule_WrongArity }.is_some()
            && { raw::RedisModule_ScanCursorCreate }.is_some()
            && { raw::RedisModule_ScanCursorDestroy }.is_some()
            && { raw::RedisModule_ScanKey }.is_some()
            && { raw::RedisModule_StringDMA }.is_some()
            && { raw::RedisModule_StringSet }.is_some()
            && { raw::RedisModule_DeleteKey }.is_some()
    }
}

/// The bytes of a server string (valid while the string lives).
pub fn bytes<'a>(s: *mut RedisModuleString) -> &'a [u8] {
    let mut len: usize = 0;
    // SAFETY: `s` is a live string of this call; the server returns its buffer and length.
    unsafe {
        let p = api!(RedisModule_StringPtrLen)(s, &mut len);
        if p.is_null() {
            return &[];
        }
        std::slice::from_raw_parts(p.cast::<u8>(), len)
    }
}

/// A string the module created, freed on drop.
pub struct Owned {
    ctx: *mut RedisModuleCtx,
    /// The server string.
    pub ptr: *mut RedisModuleString,
}

impl Owned {
    /// A new server string holding `data`.
    pub fn new(ctx: *mut RedisModuleCtx, data: &[u8]) -> Owned {
        // SAFETY: copies `data` into a new string owned by this value.
        let ptr = unsafe {
            api!(RedisModule_CreateString)(ctx, data.as_ptr().cast::<c_char>(), data.len())
        };
        Owned { ctx, ptr }
    }

    /// A new server string holding `data`, without a context: kept until `free_retained`.
    pub fn retained(data: &[u8]) -> *mut RedisModuleString {
        // SAFETY: copies `data` into a new string that no call's context frees.
        unsafe {
            api!(RedisModule_CreateString)(
                ptr::null_mut(),
                data.as_ptr().cast::<c_char>(),
                data.len(),
            )
        }
    }

    /// Frees a string made by `retained`.
    pub fn free_retained(s: *mut RedisModuleString) {
        // SAFETY: made by `retained`, freed once (its holder dropped it).
        unsafe { api!(RedisModule_FreeString)(ptr::null_mut(), s) }
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        bytes(self.ptr)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: created by this module and not freed elsewhere.
            unsafe { api!(RedisModule_FreeString)(self.ctx, self.ptr) }
        }
    }
}

/// What kind of value the lock key holds.
#[derive(Debug, PartialEq, Eq)]
pub enum Kind {
    /// No key.
    Empty,
    /// A hash (a lock of either layout, or a queue's fields only).
    Hash,
    /// A string (the floor, floor.rs).
    String,
    /// Anything else: the scripts' `HGET` fails with WRONGTYPE.
    Other,
}

/// A key the call opened (the lock key, for reading and writing for the whole call; the floor
/// key, floor.rs); closed on drop.
pub struct Key {
    ctx: *mut RedisModuleCtx,
    key: *mut RedisModuleKey,
    name: *mut RedisModuleString,
}

/// The field name `until` as a server string, made once at load (`init_strings`): the hot path
/// neither builds it per call nor looks up a C string.
static UNTIL: AtomicPtr<RedisModuleString> = AtomicPtr::new(ptr::null_mut());

/// Makes the server strings the commands share (at load, before any command runs).
pub fn init_strings() -> bool {
    // SAFETY: a string without a context: kept for the module's life, never freed.
    let s = unsafe { api!(RedisModule_CreateString)(ptr::null_mut(), c"until".as_ptr(), 5) };
    UNTIL.store(s, Ordering::Release);
    !s.is_null()
}

fn until() -> *mut RedisModuleString {
    UNTIL.load(Ordering::Acquire)
}

impl Key {
    /// Opens `name` (the command's first argument) for reading and writing.
    pub fn open(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) -> Key {
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        // SAFETY: `ctx` and `name` are the command's own; the key is closed on drop.
        let key = unsafe { api!(RedisModule_OpenKey)(ctx, name, mode) }.cast::<RedisModuleKey>();
        Key { ctx, key, name }
    }

    /// Opens `name` for reading only (a key the call may not write: it is not created).
    pub fn open_read(ctx: *mut RedisModuleCtx, name: *mut RedisModuleString) -> Key {
        // SAFETY: as `open`.
        let key = unsafe { api!(RedisModule_OpenKey)(ctx, name, raw::REDISMODULE_READ as c_int) }
            .cast::<RedisModuleKey>();
        Key { ctx, key, name }
    }

    /// The value of a string key read as a decimal number (`GET`; the key must be a string);
    /// `None` when it is not one.
    pub fn string_u64(&self) -> Option<u64> {
        let mut len: usize = 0;
        // SAFETY: an open string key; the buffer is read before anything else touches the key.
        unsafe {
            let p = api!(RedisModule_StringDMA)(self.key, &mut len, raw::REDISMODULE_READ as c_int);
            if p.is_null() {
                return None;
            }
            parse_u64(std::slice::from_raw_parts(p.cast::<u8>(), len))
        }
    }

    /// `SET key value PXAT ms` (`ms` -1: `SET key value`, no expiry), replicated as that
    /// command, with its keyspace events (the key is a string or empty, open for writing). An
    /// expiry the server refuses is neither kept nor replicated: `SET key value` is, and the
    /// call answers an error (`refuse_expiry`).
    pub fn set_string(&self, value: &[u8], ms: i64) {
        let v = Owned::new(self.ctx, value);
        // SAFETY: a key open for writing; the strings live until after the replication call.
        unsafe {
            api!(RedisModule_StringSet)(self.key, v.ptr);
            let refused = ms != -1
                && api!(RedisModule_SetAbsExpire)(self.key, ms) != raw::REDISMODULE_OK as c_int;
            if refused {
                refuse_expiry();
            }
            if ms == -1 || refused {
                api!(RedisModule_Replicate)(
                    self.ctx,
                    c"SET".as_ptr(),
                    c"ss".as_ptr(),
                    self.name,
                    v.ptr,
                );
            } else {
                api!(RedisModule_Replicate)(
                    self.ctx,
                    c"SET".as_ptr(),
                    c"sscl".as_ptr(),
                    self.name,
                    v.ptr,
                    c"PXAT".as_ptr(),
                    ms as c_longlong,
                );
            }
            api!(RedisModule_NotifyKeyspaceEvent)(
                self.ctx,
                raw::REDISMODULE_NOTIFY_STRING as c_int,
                c"set".as_ptr(),
                self.name,
            );
        }
    }

    /// `DEL key`, replicated as that command, with its keyspace event (the key exists).
    pub fn delete(&self) {
        // SAFETY: a key open for writing that holds a value.
        unsafe {
            api!(RedisModule_DeleteKey)(self.key);
            api!(RedisModule_Replicate)(self.ctx, c"DEL".as_ptr(), c"s".as_ptr(), self.name);
            api!(RedisModule_NotifyKeyspaceEvent)(
                self.ctx,
                raw::REDISMODULE_NOTIFY_GENERIC as c_int,
                c"del".as_ptr(),
                self.name,
            );
        }
    }

    /// The key's name.
    pub fn name_bytes(&self) -> &[u8] {
        bytes(self.name)
    }

    /// What the key holds.
    pub fn kind(&self) -> Kind {
        if self.key.is_null() {
            return Kind::Empty;
        }
        // SAFETY: an open key.
        let t = unsafe { api!(RedisModule_KeyType)(self.key) } as isize;
        if t == raw::REDISMODULE_KEYTYPE_EMPTY {
            Kind::Empty
        } else if t == raw::REDISMODULE_KEYTYPE_HASH {
            Kind::Hash
        } else if t == raw::REDISMODULE_KEYTYPE_STRING {
            Kind::String
        } else {
            Kind::Other
        }
    }

    /// The value of `until`, the packed state, for a command that reads it: `Ok(None)` for an
    /// empty key or a hash without it; `Err` with the reply to send for a key of another type
    /// (`WRONGTYPE`) or of layout 1 (`-FALLBACK`: its `fence` field stands where `until` is
    /// missing).
    fn read_until(&self) -> Result<Option<Owned>, Reply> {
        match self.kind() {
            Kind::Empty => Ok(None),
            Kind::Hash => match self.hget_until() {
                Some(value) => Ok(Some(value)),
                None if self.hexists(c"fence") => Err(Reply::Error("FALLBACK key layout 1".into())),
                None => Ok(None),
            },
            Kind::String | Kind::Other => Err(Reply::Error(
                "WRONGTYPE Operation against a key holding the wrong kind of value".into(),
            )),
        }
    }

    /// `HGET key until` as renew.lua reads it: `Ok(None)` for an empty key or a hash without
    /// the field (a key of layout 1 included: it reads as expired), `Err(WRONGTYPE)` for a key
    /// of another type.
    pub fn read_until_any(&self) -> Result<Option<Owned>, Reply> {
        match self.kind() {
            Kind::Empty => Ok(None),
            Kind::Hash => Ok(self.hget_until()),
            Kind::String | Kind::Other => Err(Reply::Error(
                "WRONGTYPE Operation against a key holding the wrong kind of value".into(),
            )),
        }
    }

    /// The lock's state, read into `value` (which the state borrows) and parsed: `Ok(None)` for
    /// an empty key or a hash without it, `Err` with the reply to send for a key of another
    /// type (`WRONGTYPE`) or one the module leaves to the scripts (`-FALLBACK`: layout 1, numbers
    /// past u64, or a lease end or fence past 2^53 - 1, `State::exact`). Every command but the
    /// renewal reads its lock here, before its first write.
    pub fn read_state<'v>(&self, value: &'v mut Option<Owned>) -> Result<Option<State<'v>>, Reply> {
        *value = self.read_until()?;
        let value: &'v Option<Owned> = value;
        Key::parsed(value)
    }

    /// The state `read_until` read, parsed; `Err` with `-FALLBACK` for one the module leaves to
    /// the scripts (layout 1, numbers past u64, a lease end or fence past 2^53 - 1).
    fn parsed(value: &Option<Owned>) -> Result<Option<State<'_>>, Reply> {
        match value {
            Some(v) => match State::parse(v.bytes()) {
                Some(s) if s.exact() => Ok(Some(s)),
                Some(_) => Err(Reply::Error(crate::rules::PAST_2_53.into())),
                None => Err(Reply::Error(
                    "FALLBACK key layout 1 (or an unreadable state)".into(),
                )),
            },
            None => Ok(None),
        }
    }

    /// `HGET key until` (the key must be a hash).
    pub fn hget_until(&self) -> Option<Owned> {
        self.hash_get(raw::REDISMODULE_HASH_NONE, until().cast_const().cast())
    }

    /// `HGET key field` (the key must be a hash).
    pub fn hget(&self, field: &CStr) -> Option<Owned> {
        self.hash_get(raw::REDISMODULE_HASH_CFIELDS, field.as_ptr().cast())
    }

    /// `HGET` of one field: `field` a server string (`flags` NONE) or a C string (CFIELDS).
    fn hash_get(&self, flags: u32, field: *const std::ffi::c_void) -> Option<Owned> {
        let mut out: *mut RedisModuleString = ptr::null_mut();
        // SAFETY: a hash key open for reading; one field of the kind `flags` says, one
        // output, NULL-terminated.
        let rc = unsafe {
            api!(RedisModule_HashGet)(
                self.key,
                flags as c_int,
                field,
                &mut out as *mut *mut RedisModuleString,
                ptr::null_mut::<c_char>(),
            )
        };
        if rc != raw::REDISMODULE_OK as c_int || out.is_null() {
            return None;
        }
        Some(Owned {
            ctx: self.ctx,
            ptr: out,
        })
    }

    /// `HEXISTS key field` (the key must be a hash).
    pub fn hexists(&self, field: &CStr) -> bool {
        let mut exists: c_int = 0;
        // SAFETY: as `hget`, with the EXISTS flag: one int output.
        let rc = unsafe {
            api!(RedisModule_HashGet)(
                self.key,
                (raw::REDISMODULE_HASH_CFIELDS | raw::REDISMODULE_HASH_EXISTS) as c_int,
                field.as_ptr(),
                &mut exists as *mut c_int,
                ptr::null_mut::<c_char>(),
            )
        };
        rc == raw::REDISMODULE_OK as c_int && exists != 0
    }

    /// `HSET key until value`, replicated as that command.
    pub fn set_until(&self, value: &[u8]) {
        let v = Owned::new(self.ctx, value);
        self.hash_set(until(), v.ptr);
    }

    /// `HGET key field`, the field given as bytes (the key must be a hash).
    pub fn hget_field(&self, field: &[u8]) -> Option<Owned> {
        let f = Owned::new(self.ctx, field);
        self.hash_get(raw::REDISMODULE_HASH_NONE, f.ptr.cast_const().cast())
    }

    /// `HLEN key` (0 for an empty key).
    pub fn len(&self) -> u64 {
        if self.key.is_null() {
            return 0;
        }
        // SAFETY: an open key.
        unsafe { api!(RedisModule_ValueLength)(self.key) as u64 }
    }

    /// `HSET key field value [field value …]`, replicated as one such command, with its
    /// keyspace event (the key is a hash or empty).
    pub fn hset_fields(&self, pairs: &[(&[u8], &[u8])]) {
        let owned: Vec<Owned> = pairs
            .iter()
            .flat_map(|(f, v)| [Owned::new(self.ctx, f), Owned::new(self.ctx, v)])
            .collect();
        let mut args: Vec<*mut RedisModuleString> = owned.iter().map(|o| o.ptr).collect();
        // SAFETY: a key open for writing; the strings live until after the replication call;
        // `v` takes the array and its length.
        unsafe {
            for pair in args.chunks(2) {
                api!(RedisModule_HashSet)(
                    self.key,
                    raw::REDISMODULE_HASH_NONE as c_int,
                    pair[0],
                    pair[1],
                    ptr::null_mut::<c_char>(),
                );
            }
            api!(RedisModule_Replicate)(
                self.ctx,
                c"HSET".as_ptr(),
                c"sv".as_ptr(),
                self.name,
                args.as_mut_ptr(),
                args.len(),
            );
            api!(RedisModule_NotifyKeyspaceEvent)(
                self.ctx,
                raw::REDISMODULE_NOTIFY_HASH as c_int,
                c"hset".as_ptr(),
                self.name,
            );
        }
    }

    /// `HDEL key field …` of the fields given as bytes, replicated as one `HDEL` of those that
    /// were there; returns how many were.
    pub fn hdel_fields(&self, fields: &[Vec<u8>]) -> usize {
        let owned: Vec<Owned> = fields.iter().map(|f| Owned::new(self.ctx, f)).collect();
        self.delete_fields(&owned)
    }

    /// `HEXISTS key field`, the field given as bytes (the key must be a hash).
    pub fn hexists_bytes(&self, field: &[u8]) -> bool {
        let f = Owned::new(self.ctx, field);
        let mut exists: c_int = 0;
        // SAFETY: as `hexists`, the field a server string of this call.
        let rc = unsafe {
            api!(RedisModule_HashGet)(
                self.key,
                raw::REDISMODULE_HASH_EXISTS as c_int,
                f.ptr,
                &mut exists as *mut c_int,
                ptr::null_mut::<c_char>(),
            )
        };
        rc == raw::REDISMODULE_OK as c_int && exists != 0
    }

    /// `HSET key field value`, replicated as that command (the key is a hash or empty).
    pub fn hset(&self, field: &[u8], value: &[u8]) {
        let (f, v) = (Owned::new(self.ctx, field), Owned::new(self.ctx, value));
        self.hash_set(f.ptr, v.ptr);
    }

    /// `HDEL key field`, the field given as bytes, replicated as that command; false (nothing
    /// written) when the field was not there.
    pub fn hdel(&self, field: &[u8]) -> bool {
        let f = Owned::new(self.ctx, field);
        self.delete_fields(&[f]) == 1
    }

    /// Removes every `h:<id>` field (a re-entered lock's holds; keep.lua's `clear`), replicated
    /// as one `HDEL`.
    pub fn clear_holds(&self) {
        /// Collects the fields that start with `h:` into the `Vec<Vec<u8>>` at `privdata`.
        unsafe extern "C" fn collect(
            _key: *mut RedisModuleKey,
            field: *mut RedisModuleString,
            _value: *mut RedisModuleString,
            privdata: *mut std::ffi::c_void,
        ) {
            // SAFETY: `privdata` is the vector `clear_holds` passes, alive for the scan.
            let fields = unsafe { &mut *privdata.cast::<Vec<Vec<u8>>>() };
            let name = bytes(field);
            if name.starts_with(b"h:") {
                fields.push(name.to_vec());
            }
        }
        let mut fields: Vec<Vec<u8>> = Vec::new();
        // SAFETY: a hash key open for reading; the cursor is destroyed after the scan, and the
        // key is not written while it runs.
        unsafe {
            let cursor = api!(RedisModule_ScanCursorCreate)();
            while api!(RedisModule_ScanKey)(
                self.key,
                cursor,
                Some(collect),
                (&mut fields as *mut Vec<Vec<u8>>).cast(),
            ) != 0
            {}
            api!(RedisModule_ScanCursorDestroy)(cursor);
        }
        let owned: Vec<Owned> = fields.iter().map(|f| Owned::new(self.ctx, f)).collect();
        self.delete_fields(&owned);
    }

    /// Deletes `fields` from the hash and replicates one `HDEL` of those that were there, with
    /// its keyspace event; returns how many were.
    fn delete_fields(&self, fields: &[Owned]) -> usize {
        let mut deleted: Vec<*mut RedisModuleString> = Vec::with_capacity(fields.len());
        for f in fields {
            // SAFETY: a hash key open for writing; the field a live string of this call.
            let n = unsafe {
                api!(RedisModule_HashSet)(
                    self.key,
                    raw::REDISMODULE_HASH_NONE as c_int,
                    f.ptr,
                    raw::REDISMODULE_HASH_DELETE,
                    ptr::null_mut::<c_char>(),
                )
            };
            if n > 0 {
                deleted.push(f.ptr);
            }
        }
        if !deleted.is_empty() {
            // SAFETY: the strings live until after the call; `v` takes the array and its
            // length.
            unsafe {
                api!(RedisModule_Replicate)(
                    self.ctx,
                    c"HDEL".as_ptr(),
                    c"sv".as_ptr(),
                    self.name,
                    deleted.as_mut_ptr(),
                    deleted.len(),
                );
                api!(RedisModule_NotifyKeyspaceEvent)(
                    self.ctx,
                    raw::REDISMODULE_NOTIFY_HASH as c_int,
                    c"hdel".as_ptr(),
                    self.name,
                );
            }
        }
        deleted.len()
    }

    /// `HSET key field value` of server strings, replicated as that command, with its keyspace
    /// event.
    fn hash_set(&self, field: *mut RedisModuleString, value: *mut RedisModuleString) {
        // SAFETY: a key open for writing (a hash or empty, checked by the caller); both strings
        // live until after the replication call.
        unsafe {
            api!(RedisModule_HashSet)(
                self.key,
                raw::REDISMODULE_HASH_NONE as c_int,
                field,
                value,
                ptr::null_mut::<c_char>(),
            );
            api!(RedisModule_Replicate)(
                self.ctx,
                c"HSET".as_ptr(),
                c"sss".as_ptr(),
                self.name,
                field,
                value,
            );
            api!(RedisModule_NotifyKeyspaceEvent)(
                self.ctx,
                raw::REDISMODULE_NOTIFY_HASH as c_int,
                c"hset".as_ptr(),
                self.name,
            );
        }
    }

    /// What a call for `owner` answers on a lock it does not hold: -2 when a forced unlock
    /// freed this owner's hold (`forced`, force_unlock.lua), else -1 while another owner holds
    /// it (`live`), 0 when it is free or expired (the scripts' order of checks).
    pub fn not_held(&self, owner: &[u8], live: bool) -> i64 {
        if self.kind() == Kind::Hash {
            if let Some(forced) = self.hget(c"forced") {
                if forced.bytes() == owner {
                    return -2;
                }
            }
        }
        if live {
            -1
        } else {
            0
        }
    }

    /// Applies the key-expiry rule's outcome (`rules::grant_expiry`).
    pub fn apply(&self, expiry: Expiry) {
        match expiry {
            Expiry::Persist => self.persist(),
            Expiry::At(ms) => self.expire_at(ms),
            Expiry::RaiseTo(ms) => self.raise_expiry(ms, false),
        }
    }

    /// Raises the key's expiry to `ms` when it expires earlier; a key without one gets it, or,
    /// with `only_if_set` (`PEXPIREAT … GT`), keeps none.
    pub fn raise_expiry(&self, ms: u64, only_if_set: bool) {
        let current = self.expire_time();
        if only_if_set && current == -1 {
            return;
        }
        // Past i64::MAX it is later than any expiry (and `expire_at` refuses it).
        if i64::try_from(ms).is_ok_and(|ms| current >= ms) {
            return;
        }
        self.expire_at(ms);
    }

    /// `PEXPIRETIME key`: the absolute expiry in ms, -1 for none.
    pub fn expire_time(&self) -> i64 {
        // SAFETY: an open key.
        let t = unsafe { api!(RedisModule_GetAbsExpire)(self.key) };
        if t == raw::REDISMODULE_NO_EXPIRE as i64 {
            -1
        } else {
            t
        }
    }

    /// `PEXPIREAT key ms`, replicated as that command (the key exists: it was just written),
    /// only when the server took it: a time it refuses (past i64::MAX, or one the server does
    /// not set) is neither set nor replicated, and the call answers an error (`refuse_expiry`),
    /// so master, replicas and AOF stay alike.
    pub fn expire_at(&self, ms: u64) {
        let Ok(ms) = i64::try_from(ms) else {
            refuse_expiry();
            return;
        };
        // SAFETY: a key open for writing that holds a value.
        unsafe {
            if api!(RedisModule_SetAbsExpire)(self.key, ms) != raw::REDISMODULE_OK as c_int {
                refuse_expiry();
                return;
            }
            api!(RedisModule_Replicate)(
                self.ctx,
                c"PEXPIREAT".as_ptr(),
                c"sl".as_ptr(),
                self.name,
                ms as c_longlong,
            );
            api!(RedisModule_NotifyKeyspaceEvent)(
                self.ctx,
                raw::REDISMODULE_NOTIFY_GENERIC as c_int,
                c"expire".as_ptr(),
                self.name,
            );
        }
    }

    /// `PERSIST key`: replicated only when it removed an expiry (as the command propagates).
    pub fn persist(&self) {
        if self.expire_time() == -1 {
            return;
        }
        // SAFETY: a key open for writing that holds a value.
        unsafe {
            api!(RedisModule_SetExpire)(self.key, raw::REDISMODULE_NO_EXPIRE as i64);
            api!(RedisModule_Replicate)(self.ctx, c"PERSIST".as_ptr(), c"s".as_ptr(), self.name);
            api!(RedisModule_NotifyKeyspaceEvent)(
                self.ctx,
                raw::REDISMODULE_NOTIFY_GENERIC as c_int,
                c"persist".as_ptr(),
                self.name,
            );
        }
    }

    /// True when the server runs in cluster mode.
    pub fn in_cluster(ctx: *mut RedisModuleCtx) -> bool {
        // SAFETY: the command's context; the function's presence was checked at load.
        unsafe {
            api!(RedisModule_GetContextFlags)(ctx) as u32 & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0
        }
    }

    /// True when this server has `SPUBLISH` for modules (Redis 7.0 and later).
    pub fn can_spublish() -> bool {
        // SAFETY: set once at load, only read.
        unsafe { { raw::RedisModule_PublishMessageShard }.is_some() }
    }

    /// `PUBLISH key ""` (`shard` false) or `SPUBLISH key ""`, as a script's call: on a cluster
    /// the server sends it to the other nodes (or the shard's), on a standalone server it is
    /// replicated so subscribers of the replicas hear it too. False when `SPUBLISH` is not
    /// available (a server before 7.0): nothing was sent.
    pub fn announce(&self, shard: bool) -> bool {
        self.publish(self.name, b"", shard)
    }

    /// `PUBLISH channel message` (`shard` false) or `SPUBLISH`, as a script's call (see
    /// `announce`); `channel` given as bytes.
    pub fn publish_to(&self, channel: &[u8], message: &[u8], shard: bool) -> bool {
        let channel = Owned::new(self.ctx, channel);
        self.publish(channel.ptr, message, shard)
    }

    fn publish(&self, channel: *mut RedisModuleString, message: &[u8], shard: bool) -> bool {
        let message = Owned::new(self.ctx, message);
        // SAFETY: the channel and message are live strings; the optional API is checked here.
        unsafe {
            let cluster = api!(RedisModule_GetContextFlags)(self.ctx) as u32
                & raw::REDISMODULE_CTX_FLAGS_CLUSTER
                != 0;
            if shard {
                match raw::RedisModule_PublishMessageShard {
                    Some(f) => f(self.ctx, channel, message.ptr),
                    None => return false,
                };
            } else {
                api!(RedisModule_PublishMessage)(self.ctx, channel, message.ptr);
            }
            if !cluster {
                let cmd = if shard { c"SPUBLISH" } else { c"PUBLISH" };
                api!(RedisModule_Replicate)(
                    self.ctx,
                    cmd.as_ptr(),
                    c"ss".as_ptr(),
                    channel,
                    message.ptr,
                );
            }
        }
        true
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: opened by `open`, closed once.
            unsafe { api!(RedisModule_CloseKey)(self.key) }
        }
    }
}

/// A command's reply, sent by `send` after the command's work.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// An integer.
    Int(i64),
    /// An array of integers.
    Ints(Vec<i64>),
    /// An error reply (its first word the error code, e.g. `ERR`, `FALLBACK`, `WRONGTYPE`).
    Error(String),
    /// The server's own wrong-arity error.
    WrongArity,
}

/// Set when the server refused an expiry the call set (`expire_at`, `set_string`): the call's
/// reply becomes [`EXPIRY_REFUSED`] (`send`, which every command's reply, and each item's of a
/// batch, goes through; all on the server's main thread).
static EXPIRY_WAS_REFUSED: AtomicBool = AtomicBool::new(false);

/// The reply of a call whose expiry the server refused. The module computes no such expiry
/// (lease ends and fences past 2^53 - 1 are left to the scripts), so this is a guard: without
/// it the call's other writes would be answered as done while the key kept no expiry.
pub const EXPIRY_REFUSED: &str = "ERR fencelock module: the server refused the key's expiry \
    (out of range): it was neither set nor replicated, the call's other writes stand";

/// Marks the call's expiry as refused (see [`EXPIRY_WAS_REFUSED`]).
fn refuse_expiry() {
    EXPIRY_WAS_REFUSED.store(true, Ordering::Relaxed);
}

/// `reply`, or the error [`EXPIRY_REFUSED`] when the call's expiry was refused (the mark is
/// cleared).
fn finish(reply: Reply) -> Reply {
    if EXPIRY_WAS_REFUSED.swap(false, Ordering::Relaxed) {
        Reply::Error(EXPIRY_REFUSED.into())
    } else {
        reply
    }
}

/// Sends `reply` (or, when the call's expiry was refused, the error [`EXPIRY_REFUSED`]).
pub fn send(ctx: *mut RedisModuleCtx, reply: Reply) -> c_int {
    let reply = finish(reply);
    // SAFETY: the command's context; error text without NUL bytes (replaced if any).
    unsafe {
        match reply {
            Reply::Int(n) => api!(RedisModule_ReplyWithLongLong)(ctx, n),
            Reply::Ints(v) => {
                api!(RedisModule_ReplyWithArray)(ctx, v.len() as _);
                for n in v {
                    api!(RedisModule_ReplyWithLongLong)(ctx, n);
                }
                raw::REDISMODULE_OK as c_int
            }
            Reply::Error(text) => {
                let text = std::ffi::CString::new(text.replace('\0', " ")).unwrap_or_default();
                api!(RedisModule_ReplyWithError)(ctx, text.as_ptr())
            }
            Reply::WrongArity => api!(RedisModule_WrongArity)(ctx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_expiry_makes_that_calls_reply_an_error() {
        refuse_expiry();
        assert_eq!(
            finish(Reply::Ints(vec![1, 5, 1000])),
            Reply::Error(EXPIRY_REFUSED.into())
        );
        // Cleared: the next call answers as it would.
        assert_eq!(finish(Reply::Int(7)), Reply::Int(7));
    }
}
