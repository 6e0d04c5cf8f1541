//! The arguments several subcommands share, declared once and flattened where they apply (as
//! cargo's `command_prelude.rs`): which primitive of a name ([`KindArgs`]), where its keys live
//! ([`PlacementArgs`]), `--json` ([`OutputArgs`]), the scan bound ([`ScanArgs`]), and the
//! one primitive `status` and `unlock` act on ([`TargetArgs`]). A subcommand whose flag needs
//! its own help text sets it with `#[command(mut_arg(...))]`.

use std::process::ExitCode;

use clap::Args;
use fencelock::{Client, ClientBuilder, Kind, Placement};

use crate::fail;

/// Which primitive of a name: the mutex unless one of these is given.
#[derive(Args, Debug)]
#[group(multiple = false)]
pub struct KindArgs {
    /// The read-write lock NAME (`:rw`).
    #[arg(long, env = "FENCELOCK_READ", value_parser = crate::switch_arg)]
    read: bool,
    /// The read-write lock NAME (`:rw`), as --read.
    #[arg(long, env = "FENCELOCK_WRITE", value_parser = crate::switch_arg)]
    write: bool,
    /// The fair lock NAME (`:fair`).
    #[arg(long, env = "FENCELOCK_FAIR", value_parser = crate::switch_arg)]
    fair: bool,
    /// The semaphore NAME (`:sem`); N is not checked against the stored limit.
    #[arg(long, env = "FENCELOCK_PERMITS", value_name = "N")]
    permits: Option<u32>,
    /// The countdown latch NAME (`:latch`); unlock --force opens it.
    #[arg(long, env = "FENCELOCK_LATCH", value_parser = crate::switch_arg)]
    latch: bool,
}

impl KindArgs {
    /// The kind these flags name.
    pub fn kind(&self) -> Kind {
        if self.read || self.write {
            Kind::ReadWrite
        } else if self.fair {
            Kind::Fair
        } else if self.permits.is_some() {
            Kind::Semaphore
        } else if self.latch {
            Kind::Latch
        } else {
            Kind::Mutex
        }
    }
}

/// Where a lock's keys live.
#[derive(Args, Debug, Clone)]
pub struct PlacementArgs {
    /// Pin the lock to this hash slot (0..16383).
    #[arg(
        long,
        env = "FENCELOCK_SLOT",
        conflicts_with = "tag",
        value_parser = clap::value_parser!(u16).range(0..=i64::from(fencelock::SLOT_COUNT - 1))
    )]
    slot: Option<u16>,
    /// Use this hash tag instead of the name.
    #[arg(long, env = "FENCELOCK_TAG")]
    tag: Option<String>,
}

impl PlacementArgs {
    /// The placement these flags ask for.
    pub fn placement(&self) -> Placement {
        match (self.slot, &self.tag) {
            (Some(slot), _) => Placement::Slot(slot),
            (None, Some(tag)) => Placement::Tag(tag.clone()),
            (None, None) => Placement::ByName,
        }
    }
}

/// `--json` (`FENCELOCK_JSON`): one JSON value on stdout instead of text. Each subcommand sets
/// the help (what its JSON holds, `docs/cli-json.md`).
#[derive(Args, Debug)]
pub struct OutputArgs {
    /// Print JSON.
    #[arg(long, env = "FENCELOCK_JSON", value_parser = crate::switch_arg)]
    pub json: bool,
}

/// `--max-keys` (`FENCELOCK_MAX_KEYS`): how far `list` and `top` scan.
#[derive(Args, Debug)]
pub struct ScanArgs {
    /// Stop after SCAN examined about this many keys in all.
    #[arg(
        long,
        env = "FENCELOCK_MAX_KEYS",
        default_value_t = 100_000,
        value_name = "N"
    )]
    pub max_keys: u64,
}

/// The one primitive `status` and `unlock` act on: its kind, placement and name, and `--json`.
#[derive(Args, Debug)]
pub struct TargetArgs {
    #[command(flatten)]
    pub kind: KindArgs,
    #[command(flatten)]
    pub placement: PlacementArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    /// Lock name.
    pub name: String,
}

/// Connects the client of an operator command; `Err` carries the exit code (the error printed).
pub async fn connect(builder: ClientBuilder) -> Result<Client, ExitCode> {
    builder.connect().await.map_err(|err| fail(&err))
}
