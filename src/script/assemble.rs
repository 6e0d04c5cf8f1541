//! Assembling a script's text: [`LuaScript`] (name, source, SHA1, batch twin), built from a
//! `script/lua/*.lua` file alone or from the shared prologue, then snippets, then the script's
//! body, with the `--@key` split between what runs once per call and once per key.

use std::collections::HashMap;

/// One Lua script and its SHA1.
#[derive(Debug)]
pub(crate) struct LuaScript {
    name: &'static str,
    source: String,
    sha: String,
    /// The script that runs this one for many keys of one node in one call (`batch.lua`
    /// around it), for the scripts the client batches.
    batch: Option<Box<LuaScript>>,
    /// The module command with this script's KEYS, ARGV and replies (`module/`, issue 24),
    /// which a node that loads the module runs in its place.
    module: Option<ModuleCommand>,
}

/// A module command serving a script (see [`LuaScript::served_by`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ModuleCommand {
    /// `<name> key args..`: one call.
    pub(crate) name: &'static str,
    /// `<batch> key fields key fields ..`: many calls, each its key and its other arguments
    /// joined by single spaces (`fields` of them); none for a command sent alone.
    pub(crate) batch: Option<&'static str>,
    /// Arguments after the key per call in the batched form.
    pub(crate) fields: usize,
    /// Whether the argument before the last is optional: a call one short has it absent,
    /// sent in the batched form as `0` (the acquire's place lease).
    pub(crate) optional: bool,
}

impl LuaScript {
    /// The script in `file` (a `script/lua/*.lua` text): its leading `--` comment header is
    /// not sent, and trailing newlines are dropped before hashing, so the text
    /// `$(fencelock script NAME)` yields in a shell (which strips them) has the SHA1 the client
    /// sends.
    pub(super) fn new(name: &'static str, file: &'static str) -> Self {
        Self::from_source(name, without_header(file).trim_end_matches('\n').to_owned())
    }

    /// A script with a shared head in place of the lock prologue (the watchdog's renew scripts,
    /// which loop over many keys): the `#!lua` line of `file`, then `head` (its header
    /// dropped), then the rest of `file`.
    pub(super) fn with_head(name: &'static str, head: &'static str, file: &'static str) -> Self {
        let (shebang, body) = split_shebang(file);
        let source = format!("{shebang}\n{}{body}", without_header(head));
        Self::from_source(name, source.trim_end_matches('\n').to_owned())
    }

    /// A script of a primitive built on the lock prologue: the `#!lua` line of `file`, then the
    /// once-per-call parts of the shared [`PROLOGUE`] and of `snippets` (the primitive's own
    /// prologue, shared rules such as the fence rule `script/lua/fence.lua`), then their
    /// once-per-key parts, headers dropped (see [`op_source`]), then the rest of `file`.
    pub(super) fn with_snippets(
        name: &'static str,
        snippets: &[&'static str],
        file: &'static str,
    ) -> Self {
        Self::on(PROLOGUE, name, snippets, file)
    }

    /// As [`with_snippets`](Self::with_snippets), on [`OWN_PROLOGUE`] in place of the lock
    /// prologue: for the primitives that read their own fields (the read-write lock, the
    /// semaphore), which need neither the mutex's state nor its helpers.
    pub(super) fn own(name: &'static str, snippets: &[&'static str], file: &'static str) -> Self {
        Self::on(OWN_PROLOGUE, name, snippets, file)
    }

    /// As [`batchable`](Self::batchable), on [`OWN_PROLOGUE`] (see [`own`](Self::own)).
    pub(super) fn own_batchable(
        name: &'static str,
        snippets: &[&'static str],
        file: &'static str,
    ) -> Self {
        Self::batchable_on(OWN_PROLOGUE, name, snippets, file)
    }

    /// A script on the prologue `base`, then `snippets`, then `file` (see
    /// [`with_snippets`](Self::with_snippets)).
    fn on(
        base: &'static str,
        name: &'static str,
        snippets: &[&'static str],
        file: &'static str,
    ) -> Self {
        let (shebang, body) = split_shebang(file);
        let (call, key) = op_source(base, snippets, body);
        let source = format!("{shebang}\nlocal memo = {{}}\n{call}{key}");
        Self::from_source(name, source.trim_end_matches('\n').to_owned())
    }

    /// As [`with_snippets`](Self::with_snippets), with the twin that runs the script for many
    /// keys of one node in one call: `batch.lua` around the same prologue, snippets and body,
    /// flagged as the script plus `allow-cross-slot-keys`, named `<name>_batch`.
    pub(super) fn batchable(
        name: &'static str,
        snippets: &[&'static str],
        file: &'static str,
    ) -> Self {
        Self::batchable_on(PROLOGUE, name, snippets, file)
    }

    /// [`batchable`](Self::batchable) on the prologue `base`.
    fn batchable_on(
        base: &'static str,
        name: &'static str,
        snippets: &[&'static str],
        file: &'static str,
    ) -> Self {
        let mut script = Self::on(base, name, snippets, file);
        let (shebang, body) = split_shebang(file);
        let shebang = match shebang.split_once("flags=") {
            Some((head, flags)) => format!("{head}flags={flags},allow-cross-slot-keys"),
            None => format!("{} flags=allow-cross-slot-keys", shebang.trim_end()),
        };
        let (head, tail) = without_header(BATCH)
            .split_once("--@body\n")
            .expect("batch.lua has a --@body line");
        let (before, after) = head
            .split_once("--@call\n")
            .expect("batch.lua has a --@call line");
        let (call, key) = op_source(base, snippets, body);
        let source = format!(
            "{shebang}\nlocal memo = {{}}\n{before}{call}{after}{}\n{tail}",
            key.trim_end_matches('\n')
        );
        let batch_name: &'static str = Box::leak(format!("{name}_batch").into_boxed_str());
        script.batch = Some(Box::new(Self::from_source(
            batch_name,
            source.trim_end_matches('\n').to_owned(),
        )));
        script
    }

    fn from_source(name: &'static str, source: String) -> Self {
        let source = without_unused_functions(source);
        let sha = redis::Script::new(&source).get_hash().to_owned();
        Self {
            name,
            source,
            sha,
            batch: None,
            module: None,
        }
    }

    /// The same script, served by the module command `command` where a node loads the module:
    /// the command takes the script's KEYS then ARGV and gives its replies, or declines with
    /// `-FALLBACK` before any write. Its batched form is `command` + `_packed`, each call's
    /// key then its `fields` other arguments packed in one; with `optional`, the argument
    /// before the last may be absent (sent as `0` in the batched form).
    pub(super) fn served_by(
        mut self,
        command: &'static str,
        fields: usize,
        optional: bool,
    ) -> Self {
        let batch: &'static str = Box::leak(format!("{command}_packed").into_boxed_str());
        self.module = Some(ModuleCommand {
            name: command,
            batch: Some(batch),
            fields,
            optional,
        });
        self
    }

    /// The same script, served by the module command `command` (the script's KEYS then ARGV,
    /// its replies), which has no batched form: each call goes alone.
    pub(super) fn served_alone_by(mut self, command: &'static str) -> Self {
        self.module = Some(ModuleCommand {
            name: command,
            batch: None,
            fields: 0,
            optional: false,
        });
        self
    }

    /// The module command serving this script, if any (see [`served_by`](Self::served_by)).
    pub(crate) fn module(&self) -> Option<ModuleCommand> {
        self.module
    }

    /// The twin that runs this script for many keys of one node in one call, if it has one.
    pub(crate) fn batch(&'static self) -> Option<&'static LuaScript> {
        self.batch.as_deref()
    }

    /// The script's name, as [`ScriptSource::name`].
    ///
    /// [`ScriptSource::name`]: super::ScriptSource::name
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// The SHA1 Redis caches the script under (`EVALSHA`).
    pub(super) fn sha(&self) -> &str {
        &self.sha
    }

    /// The text sent (`EVAL`, `SCRIPT LOAD`): the `#!lua` line first, no trailing newline.
    pub(super) fn source(&self) -> &str {
        &self.source
    }
}

/// `file` with its `--@queue` line (if any) replaced by `snippets`' code, headers dropped and
/// `--@key` lines removed: code a script needs only on a rare path (the mutex's queue), placed
/// inside the block that takes that path, so a call that does not take it creates none of its
/// functions (a closure costs the server about 2–3k instructions per call, measured with
/// `scripts/bench-server-cost.sh`). Built once per process.
pub(super) fn inline_at_queue(file: &'static str, snippets: &[&str]) -> &'static str {
    inline_at(file, "--@queue", snippets)
}

/// `file` with every line equal to `marker` (such as `--@queue`, `--@sem`) replaced by
/// `snippets`' code, headers dropped and `--@key` lines removed (see [`inline_at_queue`]): a
/// script with several rare paths that need the same helpers (the semaphore's resend, scan
/// and many-permit grant) defines them in each such block, and a call that takes none of them
/// defines none. Without such a line, `file` itself. Built once per process.
pub(super) fn inline_at(file: &'static str, marker: &str, snippets: &[&str]) -> &'static str {
    if !file.lines().any(|line| line == marker) {
        return file;
    }
    let mut code = String::new();
    for snippet in snippets {
        for line in without_header(snippet).lines() {
            if line != KEY_MARKER.trim_end() {
                code.push_str(line);
                code.push('\n');
            }
        }
    }
    let mut text = String::with_capacity(file.len() + 4 * code.len());
    for line in file.split_inclusive('\n') {
        if line.trim_end_matches('\n') == marker {
            text.push_str(&code);
        } else {
            text.push_str(line);
        }
    }
    Box::leak(text.into_boxed_str())
}

/// `file` with its `--@fence` line (if any) replaced by the fence rule itself, the lines of
/// `fence_rule` (`script/lua/fence.lua`) between its two `--@fence` lines: the mutex's acquire
/// runs the rule inline, with no function created per call. Built once per process.
pub(super) fn inline_fence(file: &'static str, fence_rule: &str) -> &'static str {
    const MARKER: &str = "--@fence\n";
    let Some(at) = file.find("\n--@fence\n").map(|at| at + 1) else {
        return file;
    };
    let mut parts = fence_rule.split(MARKER);
    let rule = match (parts.next(), parts.next(), parts.next()) {
        (Some(_), Some(rule), Some(_)) => rule,
        _ => panic!("fence.lua has two --@fence lines"),
    };
    let text = format!("{}{rule}{}", &file[..at], &file[at + MARKER.len()..]);
    Box::leak(text.into_boxed_str())
}

/// `source` without the functions nothing in it names: the snippets bring the helpers a family
/// of scripts shares, and a script that creates a closure it never calls still pays for it on
/// every call (about 1.4k instructions each on Redis 7.0: dropping the five the fair lock's
/// release never calls cut its handoff by 6.7k, `scripts/bench-server-cost.sh`). A definition
/// is a line `<indent>local function <name>(` through the first line after it that is
/// `<indent>end` (or that line alone when its code ends with ` end`), every line between
/// indented deeper (else its end is unknown and it stays); it goes when `<name>` occurs as
/// a whole word in no other code (comments aside), and again until none goes, so a helper only a dropped one
/// called goes too.
fn without_unused_functions(source: String) -> String {
    let mut lines: Vec<&str> = source.lines().collect();
    loop {
        let defs = function_definitions(&lines);
        let uses = identifier_counts(&lines);
        let unused: Vec<&(String, usize, usize)> = defs
            .iter()
            .filter(|(name, _, _)| {
                let definitions = defs.iter().filter(|(other, _, _)| other == name).count();
                uses.get(name.as_str()) == Some(&definitions)
            })
            .collect();
        if unused.is_empty() {
            break;
        }
        let mut keep = vec![true; lines.len()];
        for (_, first, last) in unused {
            keep[*first..=*last].iter_mut().for_each(|k| *k = false);
        }
        let mut at = 0;
        lines.retain(|_| {
            at += 1;
            keep[at - 1]
        });
    }
    lines.join("\n")
}

/// Each `local function` of `lines` that ends where [`without_unused_functions`] expects:
/// its name, its first line and its `end` line.
fn function_definitions(lines: &[&str]) -> Vec<(String, usize, usize)> {
    let mut defs = Vec::new();
    for (first, line) in lines.iter().enumerate() {
        let indent = &line[..line.len() - line.trim_start().len()];
        let Some(rest) = line.trim_start().strip_prefix("local function ") else {
            continue;
        };
        let Some((name, _)) = rest.split_once('(') else {
            continue;
        };
        if code_of(line).trim_end().ends_with(" end") {
            defs.push((name.to_owned(), first, first));
            continue;
        }
        let end = format!("{indent}end");
        let Some(last) = (first + 1..lines.len()).find(|&at| lines[at].trim_end() == end) else {
            continue;
        };
        // A body line indented no deeper than the definition (a snippet inlined at column 0
        // inside it) leaves its real end unknown: such a definition is never dropped.
        let nested = |body: &&str| {
            body.trim().is_empty() || body.len() - body.trim_start().len() > indent.len()
        };
        if lines[first + 1..last].iter().all(nested) {
            defs.push((name.to_owned(), first, last));
        }
    }
    defs
}

/// `line` up to its `--` comment, if any (a `--` inside a quoted string is not one).
fn code_of(line: &str) -> &str {
    let mut quote = None;
    let mut escaped = false;
    for (at, c) in line.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None if c == '\'' || c == '"' => quote = Some(c),
            None if line[at..].starts_with("--") => return &line[..at],
            None => {}
        }
    }
    line
}

/// How often each identifier occurs in the code of `lines` (comments aside), one pass.
fn identifier_counts<'a>(lines: &[&'a str]) -> HashMap<&'a str, usize> {
    let mut counts = HashMap::new();
    for line in lines {
        let words = code_of(line).split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
        for word in words.filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')) {
            *counts.entry(word).or_insert(0) += 1;
        }
    }
    counts
}

/// The `#!lua` line of `file` (header skipped) and the rest.
fn split_shebang(file: &str) -> (&str, &str) {
    let file = without_header(file);
    file.split_once('\n').unwrap_or((file, ""))
}

/// The code of a script built on the prologue `base` ([`PROLOGUE`] or [`OWN_PROLOGUE`]) and
/// `snippets` (headers dropped), as what runs once per script call and what runs once per key:
/// the part of the prologue and of each snippet above its `--@key` line (if it has one), then
/// the rest of them and `body`. In a batch the keys share the first part (the time, helper
/// functions that read no key).
fn op_source(base: &'static str, snippets: &[&str], body: &str) -> (String, String) {
    let (mut call, mut key) = (String::new(), String::new());
    for part in std::iter::once(&base).chain(snippets) {
        let text = without_header(part);
        let marker = if text.starts_with(KEY_MARKER) {
            Some(0)
        } else {
            text.find(&format!("\n{KEY_MARKER}")).map(|at| at + 1)
        };
        match marker {
            Some(at) => {
                call.push_str(&text[..at]);
                key.push_str(&text[at + KEY_MARKER.len()..]);
            }
            None => key.push_str(text),
        }
    }
    key.push_str(body);
    (call, key)
}

/// The line that ends a snippet's once-per-call part (see [`op_source`]).
const KEY_MARKER: &str = "--@key\n";

/// `file` without its leading `--` comment lines (a `--@` marker line is not one of them).
fn without_header(file: &str) -> &str {
    let mut rest = file;
    while rest.starts_with("--") && !rest.starts_with("--@") {
        rest = rest.split_once('\n').map_or("", |(_, next)| next);
    }
    rest
}

/// The prologue every lock script starts with (time, the lock's state; no function).
/// Contract: `script/lua/prologue.lua`.
const PROLOGUE: &str = include_str!("lua/prologue.lua");

/// The prologue of the primitives that read their own fields (time and expiry grace only, no
/// key read, no function). Contract: `script/lua/own_prologue.lua`.
const OWN_PROLOGUE: &str = include_str!("lua/own_prologue.lua");

/// The wrapper that runs a batchable script once per key of one node.
/// Contract: `script/lua/batch.lua`.
const BATCH: &str = include_str!("lua/batch.lua");

#[cfg(test)]
mod tests {
    use super::{inline_at, without_unused_functions};

    #[test]
    fn unused_functions_go_and_used_ones_stay() {
        let lines = [
            "#!lua",
            "local function used(a)",
            "  if a then",
            "    return helper(a)",
            "  end",
            "end",
            "local function helper(a) return a end",
            "local function dropped(b)",
            "  return only_dropped_calls_me(b) -- used(b) in a comment does not count",
            "end",
            "local function only_dropped_calls_me(c)",
            "  return c",
            "end",
            "local function mentioned() end",
            "-- mentioned() only in a comment",
            "local function tail() return '' end",
            "local s = 'a -- b' .. tail()",
            "local function inlined() -- unused, but its end is not where its indentation says",
            "do",
            "end",
            "  return 1",
            "end",
            "return used(1)",
        ];
        // `dropped`, the helper only it called, and the one-line `mentioned`.
        let gone = 7..=13;
        let kept: Vec<&str> = (0..lines.len())
            .filter(|at| !gone.contains(at))
            .map(|at| lines[at])
            .collect();
        assert_eq!(without_unused_functions(lines.join("\n")), kept.join("\n"));
    }

    #[test]
    fn inline_at_replaces_every_marker_line_and_nothing_else() {
        let file =
            "-- header\n#!lua\nif a then\n--@sem\nend\nif b then\n--@sem\nend\n-- not --@sem\n";
        let snippet = "-- its header\nlocal function f() end\n--@key\nlocal g = 1\n";
        assert_eq!(
            inline_at(file, "--@sem", &[snippet]),
            "-- header\n#!lua\nif a then\nlocal function f() end\nlocal g = 1\nend\n\
             if b then\nlocal function f() end\nlocal g = 1\nend\n-- not --@sem\n"
        );
        assert_eq!(inline_at(file, "--@queue", &[snippet]), file);
    }
}
