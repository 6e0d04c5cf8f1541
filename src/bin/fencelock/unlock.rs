//! `fencelock unlock --force NAME`: frees one primitive whoever holds it (opens a latch); one
//! line (or with `--json` one JSON object: `docs/cli-json.md`); exit 0 whether something was
//! held or not, 64 for bad input or without `--force`, 69 when Redis cannot be reached.

use std::process::ExitCode;

use clap::Args;
use fencelock::{ClientBuilder, Inspection, Kind};
use serde::Serialize;

use crate::prelude::{connect, TargetArgs};
use crate::{code, fail, print_json};

/// Arguments of `fencelock unlock`.
#[derive(Args, Debug)]
#[command(mut_arg("json", |arg| arg.help(
    "Print one JSON object: the state before (the fields of `status --json`) and `freed` (true \
     when something was held, or a latch armed, and is now free or open)"
)))]
pub struct UnlockArgs {
    /// Required: free NAME whoever holds it (the fence is kept, so the next grant is higher;
    /// the old holder finds its lock lost).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    target: TargetArgs,
}

/// What `unlock --force --json` prints: the state before, and whether it was freed.
#[derive(Serialize)]
struct Unlocked<'a> {
    #[serde(flatten)]
    before: &'a Inspection,
    freed: bool,
}

/// Runs `fencelock unlock --force`.
pub async fn run(builder: ClientBuilder, args: UnlockArgs) -> ExitCode {
    let target = &args.target;
    if !args.force {
        say!(
            "fencelock: unlock needs --force: it frees {:?} whoever holds it (see `fencelock status`)",
            target.name
        );
        return ExitCode::from(code::USAGE);
    }
    let client = match connect(builder).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    let placement = target.placement.placement();
    match client
        .force_unlock_at(target.kind.kind(), &target.name, &placement)
        .await
    {
        Ok(found) if target.output.json => print_json(&Unlocked {
            freed: found.held,
            before: &found,
        }),
        Ok(found) if found.held => {
            let verb = if found.kind == Kind::Latch {
                "opened"
            } else {
                "freed"
            };
            println!("{verb}: {found}");
            ExitCode::SUCCESS
        }
        Ok(found) => {
            println!("nothing to free: {found}");
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    }
}
