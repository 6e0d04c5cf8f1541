//! `fencelock status NAME`: one primitive's state, one line (or with `--json` one JSON object:
//! `docs/cli-json.md`); exit 0 whether held or not, 64 for bad input, 69 when Redis cannot be
//! reached.

use std::process::ExitCode;

use clap::Args;
use fencelock::ClientBuilder;

use crate::prelude::{connect, TargetArgs};
use crate::{fail, print_json};

/// Arguments of `fencelock status`.
#[derive(Args, Debug)]
#[command(mut_arg("json", |arg| arg.help(
    "Print one JSON object: name, kind, key, slot, held, fence, lease_ms, holds, waiters, ..."
)))]
pub struct StatusArgs {
    #[command(flatten)]
    target: TargetArgs,
}

/// Runs `fencelock status`.
pub async fn run(builder: ClientBuilder, args: StatusArgs) -> ExitCode {
    let client = match connect(builder).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let target = &args.target;
    let placement = target.placement.placement();
    match client
        .inspect_at(target.kind.kind(), &target.name, &placement)
        .await
    {
        Ok(found) if target.output.json => print_json(&found),
        Ok(found) => {
            println!("{found}");
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    }
}
