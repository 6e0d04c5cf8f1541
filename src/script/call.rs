//! The call: [`ScriptCall`], one script invocation owned with its keys and arguments (the
//! `EVALSHA` command built once, its `EVAL` fallback, its batch of calls), what it weighs in a
//! per-node batch ([`EntriesSeen`], [`SCAN_WEIGHT`]) and the milliseconds arguments
//! ([`ttl_millis`], [`ttl_ms`]).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use redis::Cmd;

use super::assemble::LuaScript;
use crate::keys::slot_of;

impl From<ScriptCall> for std::borrow::Cow<'_, ScriptCall> {
    fn from(call: ScriptCall) -> Self {
        std::borrow::Cow::Owned(call)
    }
}

impl<'a> From<&'a ScriptCall> for std::borrow::Cow<'a, ScriptCall> {
    fn from(call: &'a ScriptCall) -> Self {
        std::borrow::Cow::Borrowed(call)
    }
}

/// What a call that reads `entries` entries of a hash that grows with its callers (a fair lock's
/// waiting places, a read-write lock's readers) weighs in a batch, in mutex calls: each entry
/// costs about a quarter of one, so a call on a full queue ([`MAX_FAIR_WAITERS`]) goes alone.
///
/// [`MAX_FAIR_WAITERS`]: crate::MAX_FAIR_WAITERS
pub(crate) fn entries_weight(entries: u32) -> u32 {
    1 + entries / 4
}

/// The least weight of a call that may read every entry of such a hash whatever its last
/// reply said (a fair acquire, withdrawal or release, a write acquire): at most `MAX_BATCH /
/// 32` = 2 of them share a batch, so a batch reads at most 2 × 256 entries (two full queues or
/// read-write locks) even when the counts seen are stale (other clients filled the queue since).
pub(crate) const SCAN_WEIGHT: u32 = 32;

/// Buckets of [`SEEN`]: slots share one by `slot % SEEN_BUCKETS`.
const SEEN_BUCKETS: usize = 1024;

/// The entry count the last reply of a fair or read-write call reported, per slot bucket: the
/// first call of an acquisition weighs by what an earlier call on that slot saw.
static SEEN: [AtomicU32; SEEN_BUCKETS] = [const { AtomicU32::new(0) }; SEEN_BUCKETS];

/// How many queue places or reader entries the calls of one acquisition read, as the replies
/// report them: the weight of its next calls ([`entries_weight`]).
#[derive(Debug)]
pub(crate) struct EntriesSeen {
    bucket: usize,
    /// The least weight of this acquisition's calls.
    floor: u32,
    /// The most this acquisition saw.
    most: AtomicU32,
}

impl EntriesSeen {
    /// Nothing seen yet by this acquisition on `slot`; its calls weigh at least `floor`.
    pub(crate) fn new(slot: u16, floor: u32) -> Self {
        Self {
            bucket: usize::from(slot) % SEEN_BUCKETS,
            floor,
            most: AtomicU32::new(0),
        }
    }

    /// A reply reported `entries`.
    pub(crate) fn note(&self, entries: i64) {
        let entries = u32::try_from(entries.max(0)).unwrap_or(u32::MAX);
        self.most.fetch_max(entries, Ordering::Relaxed);
        SEEN[self.bucket].store(entries, Ordering::Relaxed);
    }

    /// The most this acquisition saw, or what the last reply on its slot bucket reported if
    /// that is more.
    pub(crate) fn entries(&self) -> u32 {
        let most = self.most.load(Ordering::Relaxed);
        most.max(SEEN[self.bucket].load(Ordering::Relaxed))
    }

    /// The weight of the next call: [`entries_weight`] of [`entries`](Self::entries), at least
    /// the floor.
    pub(crate) fn weight(&self) -> u32 {
        entries_weight(self.entries()).max(self.floor)
    }
}

/// One script call with everything it needs, owned: it can be kept, cloned and run later (a
/// background release, a compensating release after WAIT).
///
/// It holds the `EVALSHA sha numkeys keys.. args..` command itself, built once into buffers
/// sized up front: sending it copies nothing, and a batch reads its calls' arguments from it.
#[derive(Debug, Clone)]
pub(crate) struct ScriptCall {
    script: &'static LuaScript,
    /// How many of the arguments after `numkeys` are keys.
    keys: usize,
    /// What the call may cost the server, in units of one mutex call (1 unless set with
    /// [`weighted`](Self::weighted)): a batch carries calls up to a total weight.
    weight: u32,
    /// Whether a node that loads the module may run the call as the script's module command
    /// (see [`module_cmd`](Self::module_cmd)).
    module: bool,
    /// The hash slot of the first key (0 without keys), computed once: routing, lanes and the
    /// module's decline buckets all ask for it.
    slot: u16,
    cmd: Cmd,
}

/// Arguments of `EVALSHA` before the keys: the verb, the SHA and the number of keys.
const HEAD: usize = 3;

impl ScriptCall {
    /// `script` with `KEYS` `keys` and `ARGV` `args`.
    pub(crate) fn new(script: &'static LuaScript, keys: &[&str], args: &[&str]) -> Self {
        let bytes = keys
            .iter()
            .chain(args)
            .map(|part| part.len())
            .sum::<usize>();
        let mut call = Self::start(script, keys, args.len(), bytes);
        for arg in args {
            call.cmd.arg(*arg);
        }
        call
    }

    /// `script` with `KEYS` `keys`, and room for `args` more arguments of about `bytes` bytes
    /// in all (keys included), given with [`arg`](Self::arg).
    pub(crate) fn start(
        script: &'static LuaScript,
        keys: &[&str],
        args: usize,
        bytes: usize,
    ) -> Self {
        let mut cmd = Cmd::with_capacity(HEAD + keys.len() + args, 8 + 40 + 4 + bytes);
        cmd.arg("EVALSHA").arg(script.sha()).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        Self {
            script,
            keys: keys.len(),
            weight: 1,
            module: true,
            slot: keys.first().map_or(0, |key| slot_of(key.as_bytes())),
            cmd,
        }
    }

    /// The same call, weighing `weight` mutex calls (at least 1) in a batch: a semaphore call
    /// reads every permit entry of its semaphore (`docs/design.md`, "Bounded script work").
    pub(crate) fn weighted(mut self, weight: u32) -> Self {
        self.weight = weight.max(1);
        self
    }

    /// The same call, always sent as the script: for calls the module would decline anyway
    /// (a waiter's call with a queue place), which would otherwise cost a round trip more.
    pub(crate) fn script_only(mut self) -> Self {
        self.module = false;
        self
    }

    /// The module command that serves the call's script, if any.
    pub(crate) fn module_name(&self) -> Option<&'static str> {
        self.script.module().map(|module| module.name)
    }

    /// The batched form of the call's module command, if any.
    pub(crate) fn module_batch_name(&self) -> Option<&'static str> {
        self.script.module().and_then(|module| module.batch)
    }

    /// Whether the call may run as a module command (see [`module_cmd`](Self::module_cmd)).
    pub(crate) fn has_module(&self) -> bool {
        self.module && self.keys == 1 && self.script.module().is_some()
    }

    /// The module command that runs this call where a node loads the module
    /// (`<command> key args..`), if the script has one and the call has one key.
    pub(crate) fn module_cmd(&self) -> Option<Cmd> {
        let command = self.script.module().filter(|_| self.has_module())?.name;
        let parts = self.cmd.args_iter().len() - HEAD;
        let mut cmd = Cmd::with_capacity(1 + parts, command.len() + self.cmd_bytes());
        cmd.arg(command);
        for part in self.parts() {
            cmd.arg(part);
        }
        Some(cmd)
    }

    /// Whether `other` runs the same module command as this call (both may go in one batched
    /// module command, [`module_batch_of`](Self::module_batch_of)).
    pub(crate) fn same_module(&self, other: &ScriptCall) -> bool {
        self.has_module() && other.has_module() && std::ptr::eq(self.script, other.script)
    }

    /// One call of the module's batched command running every call of `calls` (calls of one
    /// script that [`has_module`](Self::has_module)), in order: `<batch> key fields key
    /// fields ..`, each call's arguments after its key joined by single spaces, padded to the
    /// command's fields. `None` when a call does not fit it (too many or too few arguments, or
    /// one holding a space).
    pub(crate) fn module_batch_of<'a>(
        calls: impl IntoIterator<Item = &'a ScriptCall> + Clone,
    ) -> Option<Cmd> {
        let first = calls.clone().into_iter().next()?;
        let module = first.script.module()?;
        let batch = module.batch?;
        let (mut args, mut bytes) = (1, batch.len());
        for call in calls.clone() {
            args += 2;
            bytes += call.cmd_bytes() + module.fields + 2;
        }
        let mut cmd = Cmd::with_capacity(args, bytes);
        cmd.arg(batch);
        let mut packed = Vec::with_capacity(64);
        for call in calls {
            let count = call.cmd.args_iter().len() - HEAD - 1;
            let padded = module.optional && count + 1 == module.fields;
            if count != module.fields && !padded {
                return None;
            }
            let mut parts = call.parts();
            cmd.arg(parts.next()?);
            packed.clear();
            for (i, part) in parts.enumerate() {
                if part.contains(&b' ') {
                    return None;
                }
                if i > 0 {
                    packed.push(b' ');
                }
                if padded && i + 1 == count {
                    packed.extend_from_slice(b"0 ");
                }
                packed.extend_from_slice(part);
            }
            cmd.arg(&packed[..]);
        }
        Some(cmd)
    }

    /// The call's weight in a batch, in mutex calls.
    pub(crate) fn weight(&self) -> u32 {
        self.weight
    }

    /// Appends one `ARGV` argument (a string, or a number written in decimal).
    pub(crate) fn arg(mut self, arg: impl redis::ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// The arguments after `numkeys`: the keys, then the `ARGV` arguments.
    fn parts(&self) -> impl Iterator<Item = &[u8]> {
        self.cmd.args_iter().skip(HEAD).filter_map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
    }

    /// The hash slot of the call's first key (0 for a call without keys).
    pub(crate) fn slot(&self) -> u16 {
        self.slot
    }

    /// `KEYS[1]`: what the call is routed by, and named after in the errors of a detached call.
    pub(crate) fn first_key(&self) -> &str {
        self.parts()
            .next()
            .filter(|_| self.keys > 0)
            .and_then(|key| std::str::from_utf8(key).ok())
            .unwrap_or("")
    }

    /// The script that runs this call together with others of the same script for keys of one
    /// node, if the script has one and the call has one key.
    pub(crate) fn batch_script(&self) -> Option<&'static LuaScript> {
        self.script.batch().filter(|_| self.keys == 1)
    }

    /// Whether the call has exactly one key (`KEYS[1]`).
    pub(crate) fn has_one_key(&self) -> bool {
        self.keys == 1
    }

    /// One call of `batch` (the batch twin of the calls' script) running every call of `calls`
    /// (one key each), in order: `KEYS[1]` the first call's key, `ARGV` each call's key,
    /// number of arguments and arguments.
    pub(crate) fn batch_of<'a>(
        batch: &'static LuaScript,
        calls: impl IntoIterator<Item = &'a ScriptCall> + Clone,
    ) -> ScriptCall {
        let (mut args, mut bytes, mut first) = (0, 0, None);
        for call in calls.clone() {
            let parts = call.cmd.args_iter().len() - HEAD;
            args += parts + 1;
            bytes += call.cmd_bytes() + 4;
            first = first.or(Some(call.first_key()));
        }
        let first = first.unwrap_or("");
        let mut batch_call = ScriptCall::start(batch, &[first], args, bytes + first.len());
        for call in calls {
            let mut parts = call.parts();
            let key = parts.next().unwrap_or_default();
            batch_call
                .cmd
                .arg(key)
                .arg(call.cmd.args_iter().len() - HEAD - 1);
            for arg in parts {
                batch_call.cmd.arg(arg);
            }
        }
        batch_call
    }

    /// The bytes of the call's keys and arguments.
    fn cmd_bytes(&self) -> usize {
        self.parts().map(<[u8]>::len).sum()
    }

    /// `EVALSHA sha numkeys keys.. args..`.
    pub(crate) fn evalsha(&self) -> &Cmd {
        &self.cmd
    }

    /// `EVAL source numkeys keys.. args..`, the fallback after `NOSCRIPT`.
    pub(crate) fn eval(&self) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.script.source()).arg(self.keys);
        for part in self.parts() {
            cmd.arg(part);
        }
        cmd
    }
}

/// A duration as the scripts' milliseconds argument (at least 1).
pub(crate) fn ttl_millis(ttl: Duration) -> String {
    ttl_ms(ttl).to_string()
}

/// A duration as the scripts' milliseconds argument (at least 1), as a number.
pub(crate) fn ttl_ms(ttl: Duration) -> u128 {
    ttl.as_millis().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::catalog::{ACQUIRE, RELEASE};

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<not a simple argument>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn a_module_batch_packs_each_call_after_its_key_padding_the_place() {
        let placed = ScriptCall::new(
            &ACQUIRE,
            &["{a}:lock"],
            &["o1", "500", "0", "clock", "30", "9"],
        );
        let plain = ScriptCall::new(&ACQUIRE, &["{b}:lock"], &["o2", "500", "7", "hybrid", ""]);
        let cmd = ScriptCall::module_batch_of([&placed, &plain]).expect("both fit");
        assert_eq!(
            args(&cmd),
            [
                "fencelock.acquire_packed",
                "{a}:lock",
                "o1 500 0 clock 30 9",
                "{b}:lock",
                "o2 500 7 hybrid 0 ",
            ]
        );
        let release = ScriptCall::new(&RELEASE, &["{a}:lock"], &["o1", "", "p", "9"]);
        let cmd = ScriptCall::module_batch_of([&release]).expect("fits");
        assert_eq!(
            args(&cmd),
            ["fencelock.release_packed", "{a}:lock", "o1  p 9"]
        );
    }

    #[test]
    fn a_call_that_does_not_pack_leaves_the_batch_to_single_commands() {
        let spaced = ScriptCall::new(&RELEASE, &["{a}:lock"], &["o1", "a b", "p", "9"]);
        assert!(ScriptCall::module_batch_of([&spaced]).is_none());
        let short = ScriptCall::new(&RELEASE, &["{a}:lock"], &["o1", "9"]);
        assert!(ScriptCall::module_batch_of([&short]).is_none());
        // Only the acquire's place is optional: a release one short is not padded.
        let one_short = ScriptCall::new(&RELEASE, &["{a}:lock"], &["o1", "", "9"]);
        assert!(ScriptCall::module_batch_of([&one_short]).is_none());
    }
}
