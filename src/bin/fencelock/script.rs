//! `fencelock script NAME`: prints the Lua source (or with `--sha` the SHA1) of one of
//! fencelock's scripts; exit 64 naming the scripts when there is none of that name.

use std::process::ExitCode;

use clap::Args;

use crate::code;

/// Arguments of `fencelock script`.
#[derive(Args, Debug)]
pub struct ScriptArgs {
    /// Print the script's SHA1 (as `SCRIPT LOAD` returns it) instead of its source.
    #[arg(long)]
    sha: bool,
    /// Script name.
    name: String,
}

/// Runs `fencelock script`.
pub fn run(args: ScriptArgs) -> ExitCode {
    let ScriptArgs { sha, name } = args;
    match fencelock::lua_scripts().find(|s| s.name == name) {
        Some(script) => {
            println!("{}", if sha { script.sha1 } else { script.source });
            ExitCode::SUCCESS
        }
        None => {
            let names: Vec<_> = fencelock::lua_scripts().map(|s| s.name).collect();
            say!(
                "fencelock: no script named {name:?}; choose one of {}",
                names.join(", ")
            );
            ExitCode::from(code::USAGE)
        }
    }
}
