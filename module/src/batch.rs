//! The batched commands: the client's per-node batches of the mutex's acquire or release as one
//! command, so the server's work per command (reading, parsing, looking up and dispatching it)
//! is paid once per batch.
//!
//! `fencelock.acquire_batch <key> <owner> <ttl> <floor> <mode> <place> <grace> [<key> …]`: items
//! of exactly 7 arguments each (`<place>` `0` for none: the single command's 6-argument form),
//! each served as `fencelock.acquire <key> <owner> <ttl> <floor> <mode> <place> <grace>` is (the
//! same code), in order.
//!
//! `fencelock.release_batch <key> <owner> <hold id> <announce> <grace> [<key> …]`: items of
//! exactly 5 arguments each, each served as `fencelock.release` is, in order.
//!
//! Reply: an array with one element per item, in order: the item's own reply (an integer or an
//! array of integers, exactly the single command's) or its own error reply (`-FALLBACK <reason>`
//! for the client to send that item through the script, `-WRONGTYPE …`, `-ERR …`); an item's
//! error leaves the other items served. The whole command is refused with one error reply, and
//! nothing done, when it has no item, a number of arguments that is not a multiple of the
//! stride, or more than [`MAX_ITEMS`] items.
//!
//! The server's clock is read once per call: every item sees the same time, as in the scripts'
//! batch (`batch.lua`). Keys: every item's key (key spec first key 1, last key -1, step 7 or 5),
//! so `COMMAND GETKEYS` lists them all and a cluster refuses keys of several slots (`CROSSSLOT`)
//! like any multi-key command. Flags as the single commands: `acquire_batch` is `write deny-oom`,
//! `release_batch` is `write` (allowed at maxmemory). Replication: each item's effects as its
//! single command replicates them, in order; the server wraps one call's in `MULTI`/`EXEC`.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleString};

use crate::server::{self, Reply};
use crate::{acquire, release, Run};

/// The most items one batched call may carry (bounded work per call).
pub const MAX_ITEMS: usize = 64;

/// Arguments per item of `fencelock.acquire_batch` (its key spec's step).
pub const ACQUIRE_STRIDE: usize = 7;

/// Arguments per item of `fencelock.release_batch` (its key spec's step).
pub const RELEASE_STRIDE: usize = 5;

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

/// Serves a batched call: checks its shape, then runs `run` per item under `catch_unwind`,
/// sending each item's reply as an element of one array.
fn handle(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    stride: usize,
    run: Run,
) -> c_int {
    let argc = usize::try_from(argc).unwrap_or(0);
    if argv.is_null() {
        return server::send(ctx, Reply::WrongArity);
    }
    let n = match items(argc.saturating_sub(1), stride) {
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
    for item in argv[1..].chunks_exact(stride) {
        let reply = catch_unwind(AssertUnwindSafe(|| {
            let mut args: [&[u8]; ACQUIRE_STRIDE] = [&[]; ACQUIRE_STRIDE];
            for (slot, &arg) in args.iter_mut().zip(item) {
                *slot = server::bytes(arg);
            }
            run(ctx, item[0], &args[..stride], now_us)
        }))
        .unwrap_or_else(|_| {
            Reply::Error("ERR fencelock module: internal error (the item was refused)".into())
        });
        server::send(ctx, reply);
    }
    raw::REDISMODULE_OK as c_int
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

/// `fencelock.acquire_batch`.
pub extern "C" fn acquire_batch_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, ACQUIRE_STRIDE, acquire::run)
}

/// `fencelock.release_batch`.
pub extern "C" fn release_batch_command(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    handle(ctx, argv, argc, RELEASE_STRIDE, release::run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_of_whole_strides() {
        assert_eq!(items(7, ACQUIRE_STRIDE), Ok(1));
        assert_eq!(items(14, ACQUIRE_STRIDE), Ok(2));
        assert_eq!(items(5, RELEASE_STRIDE), Ok(1));
        assert_eq!(
            items(MAX_ITEMS * ACQUIRE_STRIDE, ACQUIRE_STRIDE),
            Ok(MAX_ITEMS)
        );
        assert_eq!(
            items(MAX_ITEMS * RELEASE_STRIDE, RELEASE_STRIDE),
            Ok(MAX_ITEMS)
        );
    }

    #[test]
    fn no_item_or_a_partial_item_is_wrong_arity() {
        assert_eq!(items(0, ACQUIRE_STRIDE), Err(Refusal::Arity));
        assert_eq!(items(6, ACQUIRE_STRIDE), Err(Refusal::Arity));
        assert_eq!(items(8, ACQUIRE_STRIDE), Err(Refusal::Arity));
        assert_eq!(items(4, RELEASE_STRIDE), Err(Refusal::Arity));
        assert_eq!(items(11, RELEASE_STRIDE), Err(Refusal::Arity));
        assert_eq!(items(5, 0), Err(Refusal::Arity));
    }

    #[test]
    fn more_than_the_bound_is_refused() {
        assert_eq!(
            items((MAX_ITEMS + 1) * ACQUIRE_STRIDE, ACQUIRE_STRIDE),
            Err(Refusal::TooMany)
        );
        assert_eq!(
            items((MAX_ITEMS + 1) * RELEASE_STRIDE, RELEASE_STRIDE),
            Err(Refusal::TooMany)
        );
    }
}
