//! `fencelock slot NAME`: prints the hash slot and the Redis key of lock NAME (or with `--json`
//! one JSON object: `docs/cli-json.md`), without connecting; exit 64 for bad input.

use std::process::ExitCode;

use clap::Args;
use fencelock::LockKeys;
use serde::Serialize;

use crate::prelude::{OutputArgs, PlacementArgs};
use crate::{fail, print_json};

/// Arguments of `fencelock slot`.
#[derive(Args, Debug)]
#[command(mut_arg("json", |arg| arg.help("Print one JSON object: name, slot, key")))]
pub struct SlotArgs {
    /// Lock name.
    name: String,
    #[command(flatten)]
    placement: PlacementArgs,
    #[command(flatten)]
    output: OutputArgs,
}

/// `slot --json`.
#[derive(Serialize)]
struct SlotJson<'a> {
    name: &'a str,
    slot: u16,
    key: &'a str,
}

/// Runs `fencelock slot` for keys under `prefix`.
pub fn run(prefix: &str, args: SlotArgs) -> ExitCode {
    let name = &args.name;
    match LockKeys::new(prefix, name, &args.placement.placement()) {
        Ok(keys) if args.output.json => print_json(&SlotJson {
            name,
            slot: keys.slot(),
            key: keys.lock_key(),
        }),
        Ok(keys) => {
            println!("slot {}", keys.slot());
            println!("lock {}", keys.lock_key());
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    }
}
