//! The long fault-injection run: for each fault, a fresh local 3-master/3-replica cluster,
//! every fencelock primitive (mutex, read-write lock, fair lock, semaphore, latch) and the plain
//! `SET NX PX` recipe side by side, and the checker's table in markdown.
//!
//! Run: `cargo run --release --example chaos -- [--grants 1000] [--faults kill,pause,...]
//! [--locks mutex,rwlock,...]` (needs `redis-server` and `redis-cli` on the PATH;
//! `scripts/chaos.sh` installs them).
//! Faults: kill, pause, failover, force, takeover, forced-loss, migrate, client-pause.
//! Locks: mutex, rwlock, fair, semaphore, latch, plain (default: all).

#[path = "../tests/common/mod.rs"]
mod common;

use common::chaos::{self, Fault, Kind, Plan, Report};

fn usage() -> ! {
    eprintln!(
        "usage: chaos [--grants N] \
         [--faults kill,pause,failover,force,takeover,forced-loss,migrate,client-pause] \
         [--locks mutex,rwlock,fair,semaphore,latch,plain]"
    );
    std::process::exit(64);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let mut grants = 1000;
    let mut faults = Fault::ALL.to_vec();
    let mut kinds = Kind::ALL.to_vec();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--grants", Some(n)) => grants = n.parse().unwrap_or_else(|_| usage()),
            ("--faults", Some(list)) => {
                faults = list
                    .split(',')
                    .map(|id| Fault::parse(id).unwrap_or_else(|| usage()))
                    .collect()
            }
            ("--locks", Some(list)) => {
                kinds = list
                    .split(',')
                    .map(|id| Kind::parse(id).unwrap_or_else(|| usage()))
                    .collect()
            }
            _ => usage(),
        }
    }
    println!("{}", Report::HEADER);
    let mut violations = 0;
    for fault in faults {
        let plan = Plan {
            kinds: kinds.clone(),
            ..Plan::new(fault, grants)
        };
        for report in chaos::run(&plan).await {
            println!("{}", report.row());
            if report.kind.is_fencelock() {
                violations += report.fencing_violations() + report.lost_updates;
                if report.grants < grants {
                    eprintln!(
                        "{} under {:?}: only {} grants",
                        report.kind.id(),
                        fault,
                        report.grants
                    );
                }
            }
        }
    }
    if violations > 0 {
        eprintln!("fencelock: {violations} fencing violations or lost updates");
        std::process::exit(1);
    }
}
