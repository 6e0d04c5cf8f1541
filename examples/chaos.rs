//! The long fault-injection run: for each fault, a fresh local 3-master/3-replica cluster,
//! every fencelock primitive (mutex, read-write lock, fair lock, semaphore, latch) and the plain
//! `SET NX PX` recipe side by side, and the checker's table in markdown.
//!
//! Run: `cargo run --release --example chaos -- [--grants 1000] [--faults kill,pause,...]
//! [--locks mutex,rwlock,...] [--fence clock,epoch,counter,epoch-clock]` (needs `redis-server`
//! and `redis-cli` on the PATH; `scripts/chaos.sh` installs them).
//! Faults: kill, pause, failover, force, takeover, forced-loss, migrate, client-pause (process
//! faults); minority, latency, client-partition (network namespaces: needs root and iproute2);
//! skew-0s, skew-1s, skew-5s, skew-60s (forced loss onto a replica whose clock is behind: needs
//! gcc for the clock shim); restart-empty, standalone-restart-empty (restarts without
//! persistence). Default: all.
//! Locks: mutex, rwlock, fair, semaphore, latch, plain (default: all).
//! Fence modes: each fault runs once per mode given (default: the library default, epoch-clock);
//! the plain lane ignores it.
//! `--ttl-ms`: every lane's lease (default 500 ms); `--work-ms`: how long a writer holds between
//! its read and its write (default 1 ms).

#[path = "../tests/common/mod.rs"]
mod common;

use common::chaos::{self, Fault, Kind, Plan, Report};
use fencelock::FenceMode;

fn usage() -> ! {
    eprintln!(
        "usage: chaos [--grants N] \
         [--faults kill,pause,failover,force,takeover,forced-loss,migrate,client-pause,\
         minority,latency,client-partition,skew-0s,skew-1s,skew-5s,skew-60s,restart-empty,\
         standalone-restart-empty] [--locks mutex,rwlock,fair,semaphore,latch,plain] \
         [--fence clock,epoch,counter,epoch-clock] [--ttl-ms 500] [--work-ms 1] [--module on] [--workers 4]"
    );
    std::process::exit(64);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let mut grants = 1000;
    let mut faults = Fault::ALL.to_vec();
    let mut kinds = Kind::ALL.to_vec();
    let mut fences = vec![FenceMode::default()];
    let mut ttl = None;
    let mut work = None;
    let mut module = false;
    let mut workers = None;
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
            ("--ttl-ms", Some(ms)) => {
                ttl = Some(std::time::Duration::from_millis(
                    ms.parse().unwrap_or_else(|_| usage()),
                ))
            }
            ("--work-ms", Some(ms)) => {
                work = Some(std::time::Duration::from_millis(
                    ms.parse().unwrap_or_else(|_| usage()),
                ))
            }
            ("--fence", Some(list)) => {
                fences = list
                    .split(',')
                    .map(|id| chaos::parse_fence(id).unwrap_or_else(|| usage()))
                    .collect()
            }
            ("--workers", Some(n)) => workers = Some(n.parse().unwrap_or_else(|_| usage())),
            ("--module", Some(on)) => {
                module = match on.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => usage(),
                }
            }
            _ => usage(),
        }
    }
    println!("{}", Report::HEADER);
    let mut violations = 0;
    for fault in faults {
        for &fence in &fences {
            let mut plan = Plan {
                kinds: kinds.clone(),
                fence,
                module,
                ..Plan::new(fault, grants)
            };
            plan.ttl = ttl.unwrap_or(plan.ttl);
            plan.work = work.unwrap_or(plan.work);
            plan.workers = workers.unwrap_or(plan.workers);
            for report in chaos::run(&plan).await {
                println!("{}", report.row());
                if report.kind.is_fencelock() {
                    violations += report.fencing_violations()
                        + report.lost_updates
                        + report.exclusion_violations();
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
    }
    if violations > 0 {
        eprintln!(
            "fencelock: {violations} fencing violations, lost updates or overlapping holders \
             where the leases promise none"
        );
        std::process::exit(1);
    }
}
