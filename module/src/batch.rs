//! The batched commands: the client's per-node batches of the mutex's acquire or release as one
//! command, so the server's work per command (reading, parsing, looking up and dispatching it)
//! is paid once per batch, and each item's arguments but its key packed in one, so the server
//! makes and frees two argument strings per item instead of seven or five.
//!
//! `fencelock.acquire_packed <key> <fields> [<key> <fields> …]`: `<fields>` is
//! `<owner> <ttl> <floor> <mode> <place> <grace>` joined by single spaces (`<place>` `0` for
//! none), and the item is served as `fencelock.acquire <key> <owner> <ttl> <floor> <mode>
//! <place> <grace>` is (the same code).
//!
//! `fencelock.release_packed <key> <fields> [<key> <fields> …]`: `<fields>` is
//! `<owner> <hold id> <announce> <grace>` joined by single spaces (an empty field stays empty:
//! `owner   10000` is an owner, no hold id, no announcement and a grace of 10000), served as
//! `fencelock.release` is.
//!
//! `fencelock.extend_packed <key> <fields> [<key> <fields> …]`: `<fields>` is
//! `<owner> <ttl> <grace>`, served as `fencelock.extend` is; `fencelock.reenter_packed`:
//! `<owner> <hold id> <ttl> <grace>`, served as `fencelock.reenter` is.
//!
//! No field holds a space (an owner has no whitespace; the rest are numbers and words), so an
//! item whose fields are not exactly the single command's number is refused with its own
//! `-ERR`, nothing done.
//!
//! Reply: an array with one element per item, in order: the item's own reply (an integer or an
//! array of integers, exactly the single command's) or its own error reply (`-FALLBACK <reason>`
//! for the client to send that item through the script, `-WRONGTYPE …`, `-ERR …`); an item's
//! error leaves the other items served. The whole command is refused with one error reply, and
//! nothing done, when it has no item, an odd number of arguments, or more than [`MAX_ITEMS`]
//! items.
//!
//! The server's clock is read once per call: every item sees the same time, as in the scripts'
//! batch (`batch.lua`). Keys: every item's key (key spec first key 1, last key -1, step 2), so
//! `COMMAND GETKEYS` lists them all and a cluster refuses keys of several slots (`CROSSSLOT`)
//! like any multi-key command. Flags as the single commands: `acquire_packed` and
//! `reenter_packed` are `write deny-oom`, `release_packed` and `extend_packed` are `write`
//! (allowed at maxmemory). Replication: each
//! item's effects as its single command replicates them, in order; the server wraps one call's
//! in `MULTI`/`EXEC`.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use crate::server::{self, Reply};
use crate::{acquire, extend, reenter, release, Run};

/// The most items one batched call may carry (bounded work per call).
pub const MAX_ITEMS: usize = 64;

/// Arguments per item: the key and the packed fields (the commands' key spec step).
pub const STRIDE: usize = 2;

/// Fields packed in an item of `fencelock.acquire_packed`.
pub const ACQUIRE_FIELDS: usize = 6;

/// Fields packed in an item of `fencelock.release_packed`.
pub const RELEASE_FIELDS: usize = 4;

/// Fields packed in an item of `fencelock.extend_packed`.
pub const EXTEND_FIELDS: usize = 3;

/// Fields packed in an item of `fencelock.reenter_packed`.
pub const REENTER_FIELDS: usize = 4;

/// The most fields an item packs.
const MOST_FIELDS: usize = ACQUIRE_FIELDS;

/// Why a batched call is refused as a whole.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No item, or a number of arguments that is not a multiple of the stride.
    Arity,
    /// More than [`MAX_ITEMS`] items.
    TooMany,
}

/// The number of items in `args` arguments (after the command's name) of `stride` each.
pub fn items(args: usize, stride: usize) -> Result<usize, Refusal> {
    if args == 0 || stride == 0 || !args.is_multiple_of(stride) {
        return Err(Refusal::Arity);
    }
    let n = args / stride;
    if n > MAX_ITEMS {
        return Err(Refusal::TooMany);
    }
    Ok(n)
}

/// Serves a batched call: checks its shape, then runs `run` per item under `catch_unwind`
/// with the item's key and its `fields` unpacked, sending each item's reply as an element of
/// one array.
fn handle(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    fields: usize,
    run: Run,
) -> c_int {
    let argc = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() {
        return server::send(ctx, Reply::WrongArity);
    }
    let n = match items(argc.saturating_sub(1), STRIDE) {
        Ok(n) => n,
        Err(Refusal::Arity) => return server::send(ctx, Reply::WrongArity),
        Err(Refusal::TooMany) => {
            return server::send(
                ctx,
                Reply::Error(format!(
                    "ERR fencelock: at most {MAX_ITEMS} items per batched call"
                )),
            )
        }
    };
    // SAFETY: the server passes `argc` live argument strings.
    let argv = unsafe { std::slice::from_raw_parts(argv, argc) };
    let now_us = crate::now_us();
    // SAFETY: the command's context; `n` elements follow.
    unsafe { start_array(ctx, n) };
    for item in argv[1..].chunks_exact(STRIDE) {
        let reply = catch_unwind(AssertUnwindSafe(|| {
            let mut args: [&[u8]; MOST_FIELDS + 1] = [&[]; MOST_FIELDS + 1];
            args[0] = server::bytes(item[0]);
            match unpack(server::bytes(item[1]), &mut args[1..=fields]) {
                Ok(()) => run(ctx, item[0], &args[..=fields], now_us),
                Err(e) => Reply::Error(e),
            }
        }))
        .unwrap_or_else(|_| {
            Reply::Error("ERR fencelock module: internal error (the item was refused)".into())
        });
        server::send(ctx, reply);
    }
    raw::REDISMODULE_OK as c_int
}

/// Splits `packed` at single spaces into exactly `out.len()` fields.
fn unpack<'a>(packed: &'a [u8], out: &mut [&'a [u8]]) -> Result<(), String> {
    let mut split = packed.split(|&b| b == b' ');
    for slot in out.iter_mut() {
        match split.next() {
            Some(field) => *slot = field,
            None => return Err(wrong_fields(out.len())),
        }
    }
    match split.next() {
        Some(_) => Err(wrong_fields(out.len())),
        None => Ok(()),
    }
}

fn wrong_fields(n: usize) -> String {
    format!(
        "ERR fencelock: an item's second argument must be {n} fields separated by single spaces"
    )
}

/// Starts an array reply of `n` elements (`RedisModule_ReplyWithArray` is checked at load).
///
/// # Safety
/// `ctx` is the command's context, and exactly `n` replies follow.
unsafe fn start_array(ctx: *mut RedisModuleCtx, n: usize) {
    if let Some(f) = raw::RedisModule_ReplyWithArray {
        f(ctx, n as _);
    }
}

/// `fencelock.acquire_packed`.
pub extern "C" fn acquire_packed_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, ACQUIRE_FIELDS, acquire::run)
}

/// `fencelock.release_packed`.
pub extern "C" fn release_packed_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, RELEASE_FIELDS, release::run)
}

/// `fencelock.extend_packed`.
pub extern "C" fn extend_packed_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, EXTEND_FIELDS, extend::run)
}

/// `fencelock.reenter_packed`.
pub extern "C" fn reenter_packed_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, REENTER_FIELDS, reenter::run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_of_whole_strides() {
        assert_eq!(items(2, STRIDE), Ok(1));
        assert_eq!(items(4, STRIDE), Ok(2));
        assert_eq!(items(MAX_ITEMS * STRIDE, STRIDE), Ok(MAX_ITEMS));
    }

    #[test]
    fn no_item_or_a_partial_item_is_wrong_arity() {
        assert_eq!(items(0, STRIDE), Err(Refusal::Arity));
        assert_eq!(items(1, STRIDE), Err(Refusal::Arity));
        assert_eq!(items(5, STRIDE), Err(Refusal::Arity));
        assert_eq!(items(5, 0), Err(Refusal::Arity));
    }

    #[test]
    fn more_than_the_bound_is_refused() {
        assert_eq!(
            items((MAX_ITEMS + 1) * STRIDE, STRIDE),
            Err(Refusal::TooMany)
        );
    }

    #[test]
    fn fields_unpack_at_single_spaces_empty_ones_kept() {
        let mut out: [&[u8]; RELEASE_FIELDS] = [&[]; RELEASE_FIELDS];
        assert_eq!(unpack(b"owner   10000", &mut out), Ok(()));
        assert_eq!(out, [&b"owner"[..], b"", b"", b"10000"]);
        let mut out: [&[u8]; ACQUIRE_FIELDS] = [&[]; ACQUIRE_FIELDS];
        assert_eq!(unpack(b"o 10000 0 clock 0 ", &mut out), Ok(()));
        assert_eq!(out, [&b"o"[..], b"10000", b"0", b"clock", b"0", b""]);
    }

    #[test]
    fn too_few_or_too_many_fields_are_refused() {
        let mut out: [&[u8]; RELEASE_FIELDS] = [&[]; RELEASE_FIELDS];
        assert!(unpack(b"owner  10000", &mut out).is_err());
        assert!(unpack(b"owner    10000", &mut out).is_err());
        assert!(unpack(b"", &mut out).is_err());
        let mut out: [&[u8]; ACQUIRE_FIELDS] = [&[]; ACQUIRE_FIELDS];
        assert!(unpack(b"o w 10000 0 clock 0 10000", &mut out).is_err());
    }
}
