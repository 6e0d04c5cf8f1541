//! `fencelock completions SHELL`: prints a completion script for SHELL.

use std::process::ExitCode;

use clap::Args;

/// Arguments of `fencelock completions`.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// Runs `fencelock completions`.
pub fn run(args: CompletionsArgs) -> ExitCode {
    clap_complete::generate(
        args.shell,
        &mut crate::cli_command(),
        "fencelock",
        &mut std::io::stdout(),
    );
    ExitCode::SUCCESS
}
