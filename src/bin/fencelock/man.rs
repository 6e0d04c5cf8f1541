//! `fencelock man [--dir DIR]`: the man page (roff) on stdout, or one page per subcommand in
//! DIR; exit 69 when it cannot be written.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::code;

/// Arguments of `fencelock man`.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// Write the pages into this directory instead.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// Runs `fencelock man`.
pub fn run(args: ManArgs) -> ExitCode {
    let command = crate::cli_command();
    let dir = args.dir;
    let written = match &dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).and_then(|()| clap_mangen::generate_to(command, dir))
        }
        None => clap_mangen::Man::new(command).render(&mut std::io::stdout()),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            let place = dir.map_or("stdout".to_owned(), |d| d.display().to_string());
            say!("fencelock: cannot write the man page to {place}: {err}");
            ExitCode::from(code::UNAVAILABLE)
        }
    }
}
