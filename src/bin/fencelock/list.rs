//! `fencelock list`: every primitive key under the prefix, one line each (or with `--json` one
//! JSON array: `docs/cli-json.md`), scanning every master up to `--max-keys`; exit 0, 64 for
//! bad input, 69 when Redis cannot be reached.

use std::process::ExitCode;

use clap::Args;
use fencelock::{ClientBuilder, LockList};

use crate::prelude::{connect, OutputArgs, ScanArgs};
use crate::{fail, print_json};

/// Arguments of `fencelock list`.
#[derive(Args, Debug)]
#[command(mut_arg("json", |arg| arg.help(
    "Print one JSON array of objects with the fields of `status --json`"
)))]
#[command(mut_arg("max_keys", |arg| arg.help(
    "Stop after SCAN examined about this many keys in all (a message on stderr says the list \
     is incomplete)"
)))]
pub struct ListArgs {
    #[command(flatten)]
    output: OutputArgs,
    #[command(flatten)]
    scan: ScanArgs,
}

fn truncation_note(list: &LockList) {
    if list.truncated {
        say!(
            "fencelock: stopped after scanning about {} keys (--max-keys): the list is incomplete",
            list.scanned
        );
    }
}

/// Runs `fencelock list`.
pub async fn run(builder: ClientBuilder, args: ListArgs) -> ExitCode {
    let client = match connect(builder).await {
        Ok(client) => client,
        Err(code) => return code,
    };
    match client.list_locks(args.scan.max_keys).await {
        Ok(list) => {
            if args.output.json {
                let printed = print_json(&list.locks);
                if printed != ExitCode::SUCCESS {
                    return printed;
                }
            } else {
                for found in &list.locks {
                    println!("{found}");
                }
            }
            truncation_note(&list);
            if let Some(floor) = list.floor {
                say!(
                    "fencelock: note: the floor key holds {floor}, the last fence of locks whose \
                     keys the Redis module deleted: a fence floor taken from this list must be \
                     at least that"
                );
            }
            for key in &list.skipped {
                say!(
                    "fencelock: warning: skipped key {key:?}: it has a lock's name under the \
                     prefix but is not a lock (another program's key?)"
                );
            }
            ExitCode::SUCCESS
        }
        Err(err) => fail(&err),
    }
}
