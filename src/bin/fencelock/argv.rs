//! The command line before and around clap: `exec NAME CMD [ARGS…]` without `--`, boolean
//! switches from the environment, and errors that name the environment variable at fault.

use std::ffi::{OsStr, OsString};

use clap::error::{ContextKind, ContextValue, ErrorKind};

/// clap value parser for on/off switches (`--fair`, `FENCELOCK_FAIR`, ...): `1` or `true` turn
/// the switch on, `0`, `false` or an empty value leave it off (any case); anything else
/// (`yes`, `maybe`, `2`) is refused, so that a typo never turns a switch on.
pub fn switch_arg(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "true" => Ok(true),
        "0" | "false" | "" => Ok(false),
        _ => Err("a switch takes 1 or true (on), 0, false or empty (off)".to_owned()),
    }
}

/// `exec NAME CMD [ARGS…]` as `exec NAME -- CMD [ARGS…]`: when the arguments after `exec` have
/// no `--`, the first one that is neither an option nor an option's value is the one NAME and
/// everything after it is the command, as with flock(1) and `etcdctl lock`. With a `--` (every
/// argument before it that is not an option or an option's value is then a name), and for other
/// subcommands, nothing changes. `cli` is the parser's definition, which tells which options
/// take a value.
pub fn command_after_name(args: Vec<OsString>, cli: &clap::Command) -> Vec<OsString> {
    let mut cli = cli.clone();
    cli.build();
    let Some((at, subcommand)) = subcommand_at(&args, &cli) else {
        return args;
    };
    if subcommand != "exec" || args[at + 1..].iter().any(|arg| arg == "--") {
        return args;
    }
    let Some(exec) = cli.find_subcommand("exec") else {
        return args;
    };
    let Some(name) = first_positional(&args[at + 1..], exec).map(|i| at + 1 + i) else {
        return args;
    };
    let mut args = args;
    if name + 1 < args.len() {
        args.insert(name + 1, OsString::from("--"));
    }
    args
}

/// Where the subcommand is in `args` (after the program name and global options), and its name.
fn subcommand_at(args: &[OsString], cli: &clap::Command) -> Option<(usize, String)> {
    let at = 1 + first_positional(args.get(1..)?, cli)?;
    Some((at, args[at].to_str()?.to_owned()))
}

/// The index of the first argument that is not an option of `command` or an option's value;
/// `None` when there is none before the end or a `--`.
fn first_positional(args: &[OsString], command: &clap::Command) -> Option<usize> {
    let mut index = 0;
    while index < args.len() {
        let Some(arg) = args[index].to_str() else {
            return Some(index);
        };
        if arg == "--" {
            return None;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let takes_value = !long.contains('=')
                && command
                    .get_arguments()
                    .find(|a| a.get_long() == Some(long))
                    .is_some_and(|a| a.get_action().takes_values());
            index += if takes_value { 2 } else { 1 };
        } else if let Some(shorts) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let mut skip = 1;
            for (at, short) in shorts.char_indices() {
                let takes_value = command
                    .get_arguments()
                    .find(|a| a.get_short() == Some(short))
                    .is_some_and(|a| a.get_action().takes_values());
                if takes_value {
                    if at + short.len_utf8() == shorts.len() {
                        skip = 2;
                    }
                    break;
                }
            }
            index += skip;
        } else {
            return Some(index);
        }
    }
    None
}

/// For a bad value that came from an environment variable rather than the command line: the
/// error's line with the variable named instead of the flag, e.g. `invalid value 'maybe' for
/// FENCELOCK_FAIR (the environment variable of --fair): ...`.
pub fn env_error(err: &clap::Error, cli: &clap::Command, argv: &[OsString]) -> Option<String> {
    if !matches!(
        err.kind(),
        ErrorKind::ValueValidation | ErrorKind::InvalidValue
    ) {
        return None;
    }
    let Some(ContextValue::String(flag)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    let Some(ContextValue::String(value)) = err.get(ContextKind::InvalidValue) else {
        return None;
    };
    let long = flag.split_whitespace().next()?.strip_prefix("--")?;
    let arg = find_arg(cli, long)?;
    let variable = arg.get_env()?;
    if std::env::var_os(variable).as_deref() != Some(OsStr::new(value)) {
        return None;
    }
    if on_command_line(arg, long, argv) {
        return None;
    }
    let text = err.render().to_string();
    let line = text.lines().next().unwrap_or_default();
    let line = line.trim_start_matches("error: ");
    let variable = variable.to_string_lossy();
    let mut line = line.replacen(
        &format!("'{flag}'"),
        &format!("{variable} (the environment variable of --{long})"),
        1,
    );
    // An enum's values follow on the next line: `  [possible values: clock, epoch, ...]`.
    if let Some(values) = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("[possible values: "))
    {
        line.push_str(&format!(
            "; possible values: {}",
            values.trim_end_matches(']')
        ));
    }
    Some(line)
}

/// Whether `arg` (long name `long`) is given on the command line `argv`, before its first `--`
/// (what follows is `exec`'s command, whose own flags are not fencelock's).
fn on_command_line(arg: &clap::Arg, long: &str, argv: &[OsString]) -> bool {
    argv.iter().take_while(|a| *a != "--").any(|a| {
        a.to_str().is_some_and(|a| {
            a.strip_prefix("--")
                .is_some_and(|rest| rest == long || rest.starts_with(&format!("{long}=")))
                || arg.get_short().is_some_and(|short| {
                    a.len() > 1 && !a.starts_with("--") && a.starts_with('-') && a.contains(short)
                })
        })
    })
}

/// For two options in conflict where one was given on the command line and the other only by
/// its environment variable (`FENCELOCK_QUIET=1 fencelock -v …`): the long name of the latter,
/// whose variable the command line overrides ([`without_env`]). `None` for any other error,
/// and when both come from the command line or both from the environment.
pub fn overridden_flag(
    err: &clap::Error,
    cli: &clap::Command,
    argv: &[OsString],
) -> Option<String> {
    if err.kind() != ErrorKind::ArgumentConflict {
        return None;
    }
    let mut flags = Vec::new();
    for kind in [ContextKind::InvalidArg, ContextKind::PriorArg] {
        match err.get(kind) {
            Some(ContextValue::String(flag)) => flags.push(flag.clone()),
            Some(ContextValue::Strings(more)) => flags.extend(more.iter().cloned()),
            _ => {}
        }
    }
    let mut given = false;
    let mut from_env = None;
    for flag in &flags {
        let long = flag
            .split(|c: char| c.is_whitespace() || c == '.' || c == '=')
            .next()?
            .strip_prefix("--")?;
        let arg = find_arg(cli, long)?;
        if on_command_line(arg, long, argv) {
            given = true;
        } else if arg.get_env().is_some_and(|v| std::env::var_os(v).is_some()) {
            from_env = Some(long.to_owned());
        }
    }
    from_env.filter(|_| given)
}

/// `cli` with the option whose long name is `long` no longer read from its environment
/// variable, in every subcommand that has it. The process's environment is left as it is: a
/// command `exec` runs still gets the variable.
pub fn without_env(cli: clap::Command, long: &str) -> clap::Command {
    let ids: Vec<String> = cli
        .get_arguments()
        .filter(|a| a.get_long() == Some(long))
        .map(|a| a.get_id().to_string())
        .collect();
    let mut cli = cli;
    for id in ids {
        cli = cli.mut_arg(id, |arg| arg.env(None));
    }
    cli.mut_subcommands(|sub| without_env(sub, long))
}

/// The argument with long name `long` in `cli` or any of its subcommands.
fn find_arg<'a>(cli: &'a clap::Command, long: &str) -> Option<&'a clap::Arg> {
    cli.get_arguments()
        .find(|a| a.get_long() == Some(long))
        .or_else(|| cli.get_subcommands().find_map(|sub| find_arg(sub, long)))
}
