//! `fencelock latch`: arm, count down and wait for a countdown latch.
//!
//! `set NAME COUNT` prints the new generation; `count-down NAME [--id ID]` prints the count
//! still outstanding; `wait NAME [--timeout D]` prints the generation that opened and exits 0,
//! or exits 75 when the latch did not open in time; a signal while it waits ends it by that
//! signal (a shell reports 128 + its number: 130 SIGINT, 143 SIGTERM, 129 SIGHUP; SIGQUIT
//! exits 131). 64 bad input, 69 Redis
//! unreachable. With `--json` each prints one JSON object instead (see `docs/cli-json.md`).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use fencelock::ClientBuilder;
use serde::Serialize;

use crate::prelude::OutputArgs;
use crate::signals::Signals;
use crate::{fail, print_json, timeout_arg};

/// Arguments of `fencelock latch` (`--json` is global: given before or after the action).
#[derive(Args, Debug)]
#[command(mut_arg("json", |arg| arg.global(true).help(
    "Print one JSON object: `set`/`wait` {name, generation}, `count-down` {name, id, remaining}"
)))]
pub struct LatchArgs {
    #[command(flatten)]
    output: OutputArgs,
    /// The global -q: no note on stderr about the random id `count-down` chose.
    #[arg(skip)]
    pub quiet: bool,
    #[command(subcommand)]
    command: LatchCommand,
}

/// `latch set --json` and `latch wait --json`.
#[derive(Serialize)]
struct Generation<'a> {
    name: &'a str,
    generation: u64,
}

/// `latch count-down --json`.
#[derive(Serialize)]
struct CountedDown<'a> {
    name: &'a str,
    id: &'a str,
    remaining: u64,
}

#[derive(Subcommand, Debug)]
enum LatchCommand {
    /// Arm latch NAME with COUNT (0 opens it at once), starting a new generation; prints the
    /// generation (a fence token above every earlier one).
    Set {
        /// Latch name.
        name: String,
        /// How many distinct ids must count down before the latch opens.
        count: u64,
    },
    /// Count down latch NAME once for ID; prints the count still outstanding (0: open).
    #[command(name = "count-down")]
    CountDown {
        /// Latch name.
        name: String,
        /// This party's id: the same id counts once per generation, so a retry with the same
        /// id is safe. Default: a random id (printed on stderr), which counts every time.
        #[arg(long, env = "FENCELOCK_LATCH_ID")]
        id: Option<String>,
    },
    /// Wait until latch NAME is open (count zero); prints the generation that opened. A latch
    /// that was never set is not open. Exits 75 if it does not open within --timeout.
    Wait {
        /// Latch name.
        name: String,
        /// How long to wait (woken as soon as the last count-down lands); 0 looks once. A bare
        /// number is seconds.
        #[arg(long, env = "FENCELOCK_TIMEOUT", default_value = "30s", value_parser = timeout_arg)]
        timeout: Duration,
    },
}

/// Runs `fencelock latch ...`.
pub async fn run(builder: ClientBuilder, args: LatchArgs) -> ExitCode {
    if let LatchCommand::Wait { name, timeout } = &args.command {
        return wait(builder, name, *timeout, args.output.json).await;
    }
    let client = match builder.connect().await {
        Ok(client) => client,
        Err(err) => return fail(&err),
    };
    let json = args.output.json;
    let outcome = match args.command {
        LatchCommand::Set { name, count } => match client.latch(&name) {
            Ok(latch) => latch.set(count).await.map(|g| {
                if json {
                    print_json(&Generation {
                        name: &name,
                        generation: g.into(),
                    })
                } else {
                    println!("{g}");
                    ExitCode::SUCCESS
                }
            }),
            Err(err) => Err(err),
        },
        LatchCommand::CountDown { name, id } => {
            let id = id.unwrap_or_else(|| {
                let id = uuid::Uuid::new_v4().simple().to_string();
                if !args.quiet {
                    say!("fencelock: counting down as id {id} (pass --id to make retries safe)");
                }
                id
            });
            match client.latch(&name) {
                Ok(latch) => latch.count_down(&id).await.map(|remaining| {
                    if json {
                        print_json(&CountedDown {
                            name: &name,
                            id: &id,
                            remaining,
                        })
                    } else {
                        println!("{remaining}");
                        ExitCode::SUCCESS
                    }
                }),
                Err(err) => Err(err),
            }
        }
        LatchCommand::Wait { .. } => return ExitCode::from(crate::code::USAGE),
    };
    outcome.unwrap_or_else(|err| fail(&err))
}

/// `latch wait`: SIGINT, SIGTERM, SIGHUP and SIGQUIT are caught before it connects and end
/// the wait (its subscription is dropped; a latch wait holds nothing); `main` then dies by
/// the signal ([`Received::end`](crate::signals::Received::end)).
async fn wait(builder: ClientBuilder, name: &str, timeout: Duration, json: bool) -> ExitCode {
    let mut signals = Signals::install();
    let waited = signals
        .interruptible(async {
            let client = builder.connect().await?;
            let outcome = client.latch(name)?.wait(timeout).await;
            let _ = client.shutdown().await;
            outcome
        })
        .await;
    match waited {
        Ok(Ok(generation)) if json => print_json(&Generation {
            name,
            generation: generation.into(),
        }),
        Ok(Ok(generation)) => {
            println!("{generation}");
            ExitCode::SUCCESS
        }
        Ok(Err(err)) => fail(&err),
        Err(received) => {
            say!(
                "fencelock: latch wait stopped by {} while waiting for latch {name:?}",
                received.name
            );
            received.end()
        }
    }
}
