//! fencelock's Redis module (issue 24): the mutex's hot path as native commands on key layout
//! 2, `fencelock.acquire`, `fencelock.release`, `fencelock.extend` and `fencelock.reenter`,
//! with exactly the KEYS, ARGV and replies of the scripts acquire.lua, release.lua, extend.lua
//! and reenter.lua (src/script/lua/), so both serve one lock together; the mutex's queue of
//! waiting processes (queue.rs, issue 25: a busy caller's place, the release's handoff to the
//! head); and the fair lock's `fencelock.fair_acquire` and `fencelock.fair_release` (fair.rs) on
//! the same queue. What a command does not serve natively it answers with `-FALLBACK <reason>`
//! before any write, for the client to send through the script; among it every lock state with
//! a lease end or fence past 2^53 - 1, which Lua reads inexactly (`State::exact`).
//!
//! `fencelock.acquire_packed`, `fencelock.release_packed`, `fencelock.extend_packed` and
//! `fencelock.reenter_packed` (batch.rs) serve the client's per-node batches as one command,
//! each item (its key and its other arguments packed in one) exactly as its single command.
//!
//! Safety inside the server: every argument is validated with an error reply, every call runs
//! under `catch_unwind` (a panic becomes an error reply, never unwinds into Redis), and the
//! effects are replicated as the commands the scripts run (`HSET`, `HDEL`, `PEXPIREAT`,
//! `PERSIST`; with `release-deletes yes` also `SET … PXAT` of the floor and `DEL`, floor.rs),
//! never the command itself: it reads the clock.

mod acquire;
mod batch;
mod epoch;
mod extend;
mod fair;
mod floor;
mod queue;
mod reenter;
mod release;
mod renew;
mod rules;
mod server;
mod state;

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{SystemTime, UNIX_EPOCH};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};
use redis_module::{redis_module, Context, RedisString, Status};

use server::Reply;

/// The server's clock in µs, as the scripts' `TIME`.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

type Run = fn(*mut RedisModuleCtx, *mut RedisModuleString, &[&[u8]], u64) -> Reply;

/// Runs a command under `catch_unwind` and sends its reply.
fn handle(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    run: Run,
) -> c_int {
    let reply = catch_unwind(AssertUnwindSafe(|| {
        let n = usize::try_from(argc).unwrap_or(0);
        if !(2..=9).contains(&n) || argv.is_null() {
            return Reply::WrongArity;
        }
        // SAFETY: the server passes `argc` live argument strings.
        let argv = unsafe { std::slice::from_raw_parts(argv, n) };
        let mut args: [&[u8]; 8] = [&[]; 8];
        for (slot, &arg) in args.iter_mut().zip(&argv[1..]) {
            *slot = server::bytes(arg);
        }
        run(ctx, argv[1], &args[..n - 1], now_us())
    }))
    .unwrap_or_else(|_| {
        Reply::Error("ERR fencelock module: internal error (the call was refused)".into())
    });
    server::send(ctx, reply)
}

extern "C" fn acquire_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, acquire::run)
}

extern "C" fn extend_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, extend::run)
}

extern "C" fn reenter_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, reenter::run)
}

/// `fencelock.renew`: any number of arguments up to [`renew::MAX_LOCKS`] triples.
extern "C" fn renew_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    let reply = catch_unwind(AssertUnwindSafe(|| {
        let n = usize::try_from(argc).unwrap_or(0);
        if n < 2 || argv.is_null() {
            return Reply::WrongArity;
        }
        if n - 1 > 2 + 3 * renew::MAX_LOCKS {
            return Reply::Error(format!(
                "ERR fencelock: at most {} locks per renewal call",
                renew::MAX_LOCKS
            ));
        }
        // SAFETY: the server passes `argc` live argument strings.
        let argv = unsafe { std::slice::from_raw_parts(argv, n) };
        let args: Vec<&[u8]> = argv[1..].iter().map(|&a| server::bytes(a)).collect();
        renew::run(ctx, &argv[1..], &args, now_us())
    }))
    .unwrap_or_else(|_| {
        Reply::Error("ERR fencelock module: internal error (the call was refused)".into())
    });
    server::send(ctx, reply)
}

extern "C" fn fair_acquire_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, fair::acquire)
}

extern "C" fn fair_release_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, fair::release)
}

extern "C" fn release_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, release::run)
}

/// The module's load arguments (`loadmodule PATH [release-deletes yes|no]`): whether a
/// release deletes a freed lock's key and keeps its fence in the floor (floor.rs; off by
/// default: the key is kept as the scripts keep it; standalone servers only). `Err` names what
/// is wrong.
fn options(args: &[String]) -> Result<bool, String> {
    let mut deletes = false;
    let mut rest = args.iter();
    while let Some(name) = rest.next() {
        let value = rest.next().map(|v| v.to_ascii_lowercase());
        match (name.to_ascii_lowercase().as_str(), value.as_deref()) {
            ("release-deletes", Some("yes")) => deletes = true,
            ("release-deletes", Some("no")) => deletes = false,
            ("release-deletes", _) => {
                return Err(
                    "release-deletes takes yes or no (loadmodule PATH release-deletes yes)".into(),
                )
            }
            (other, _) => {
                return Err(format!(
                    "unknown module argument {other:?}: the one argument is release-deletes yes|no"
                ))
            }
        }
    }
    Ok(deletes)
}

type Command = extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int;

/// Registers the commands: the key is the first argument, a batch's keys every item's first
/// (COMMAND GETKEYS, cluster routing).
fn init(ctx: &Context, args: &[RedisString]) -> Status {
    if !server::check_api() || !epoch::check_api() || !server::init_strings() {
        ctx.log_warning("fencelock: this server lacks a module API function the commands need");
        return Status::Err;
    }
    let args: Vec<String> = args.iter().map(|a| a.to_string_lossy()).collect();
    // SAFETY: the load's context; the function's presence was checked above (check_api).
    let cluster = unsafe {
        { raw::RedisModule_GetContextFlags }
            .is_some_and(|f| f(ctx.ctx) as u32 & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0)
    };
    match options(&args) {
        Ok(true) if cluster => {
            ctx.log_warning(
                "fencelock: release-deletes yes is for standalone servers: in cluster mode a slot \
                 migration would find the floor key on both nodes (docs/module.md)",
            );
            return Status::Err;
        }
        Ok(deletes) => floor::set_release_deletes(deletes),
        Err(message) => {
            ctx.log_warning(&format!("fencelock: {message}"));
            return Status::Err;
        }
    }
    // (name, handler, flags, first key, last key, key step): the batches name every item's key
    // (last key -1), the renewal every lock key (the routing key is the first of them).
    let packed = batch::STRIDE as c_int;
    let commands: [(
        &std::ffi::CStr,
        Command,
        &std::ffi::CStr,
        c_int,
        c_int,
        c_int,
    ); 11] = [
        (
            c"fencelock.acquire",
            acquire_command,
            c"write deny-oom",
            1,
            1,
            1,
        ),
        (c"fencelock.release", release_command, c"write", 1, 1, 1),
        (c"fencelock.extend", extend_command, c"write", 1, 1, 1),
        (
            c"fencelock.reenter",
            reenter_command,
            c"write deny-oom",
            1,
            1,
            1,
        ),
        (c"fencelock.renew", renew_command, c"write", 2, -2, 3),
        (
            c"fencelock.fair_acquire",
            fair_acquire_command,
            c"write deny-oom",
            1,
            1,
            1,
        ),
        (
            c"fencelock.fair_release",
            fair_release_command,
            c"write",
            1,
            1,
            1,
        ),
        (
            c"fencelock.acquire_packed",
            batch::acquire_packed_command,
            c"write deny-oom",
            1,
            -1,
            packed,
        ),
        (
            c"fencelock.release_packed",
            batch::release_packed_command,
            c"write",
            1,
            -1,
            packed,
        ),
        (
            c"fencelock.extend_packed",
            batch::extend_packed_command,
            c"write",
            1,
            -1,
            packed,
        ),
        (
            c"fencelock.reenter_packed",
            batch::reenter_packed_command,
            c"write deny-oom",
            1,
            -1,
            packed,
        ),
    ];
    for (name, command, flags, first, last, step) in commands {
        // SAFETY: the load-time context; static C strings.
        let rc = unsafe {
            match raw::RedisModule_CreateCommand {
                Some(create) => create(
                    ctx.ctx,
                    name.as_ptr(),
                    Some(command),
                    flags.as_ptr(),
                    first,
                    last,
                    step,
                ),
                None => raw::REDISMODULE_ERR as c_int,
            }
        };
        if rc != raw::REDISMODULE_OK as c_int {
            ctx.log_warning(&format!(
                "fencelock: cannot create {}",
                name.to_string_lossy()
            ));
            return Status::Err;
        }
        if !set_write_category(ctx.ctx, name) {
            ctx.log_warning(&format!(
                "fencelock: cannot put {} in the ACL category @write",
                name.to_string_lossy()
            ));
        }
    }
    // Only a node in cluster mode has a config epoch to cache (a server without it answers the
    // epoch read with an error, and cluster mode is fixed at startup): elsewhere no filter
    // costs every command the server runs.
    // SAFETY: the load-time context; the flags are set from the configuration read before
    // modules load.
    let cluster = unsafe {
        raw::RedisModule_GetContextFlags
            .is_none_or(|flags| flags(ctx.ctx) as u32 & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0)
    };
    if !epoch::subscribe(ctx.ctx) || (cluster && !epoch::register_filter(ctx.ctx)) {
        ctx.log_warning(
            "fencelock: cannot subscribe to replication role changes or register a command filter",
        );
        return Status::Err;
    }
    Status::Ok
}

/// Puts the command `name` in the ACL category `@write`, as its `write` flag puts a built-in
/// command, on a server whose module API can (Redis 7.2 and later); true where it cannot (7.0
/// and 7.1: a module command is then in no category but `@all`, `docs/module.md`).
fn set_write_category(ctx: *mut RedisModuleCtx, name: &std::ffi::CStr) -> bool {
    // SAFETY: the load-time context and a command this module just created; optional API
    // functions checked before use.
    unsafe {
        let (Some(get), Some(set)) = (
            raw::RedisModule_GetCommand,
            raw::RedisModule_SetCommandACLCategories,
        ) else {
            return true;
        };
        let command = get(ctx, name.as_ptr());
        !command.is_null() && set(command, c"write".as_ptr()) == raw::REDISMODULE_OK as c_int
    }
}

/// The server's allocator in the module; the system's in unit tests, which run without a server.
#[cfg(not(test))]
type ModuleAlloc = redis_module::alloc::RedisAlloc;
#[cfg(not(test))]
const MODULE_ALLOC: ModuleAlloc = redis_module::alloc::RedisAlloc;
#[cfg(test)]
type ModuleAlloc = std::alloc::System;
#[cfg(test)]
const MODULE_ALLOC: ModuleAlloc = std::alloc::System;

redis_module! {
    name: "fencelock",
    version: 1,
    allocator: (ModuleAlloc, MODULE_ALLOC),
    data_types: [],
    init: init,
}

#[cfg(test)]
mod tests {
    use super::options;

    #[test]
    fn load_arguments() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(options(&args(&[])), Ok(false));
        assert_eq!(options(&args(&["release-deletes", "yes"])), Ok(true));
        assert_eq!(options(&args(&["RELEASE-DELETES", "No"])), Ok(false));
        assert!(options(&args(&["release-deletes"])).is_err());
        assert!(options(&args(&["release-deletes", "maybe"])).is_err());
        assert!(options(&args(&["other", "yes"]))
            .unwrap_err()
            .contains("other"));
    }
}
