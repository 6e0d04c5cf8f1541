//! The fault-injection suite, short form: every fault once, with every primitive as one lane
//! (mutex, read-write lock, fair lock, semaphore, latch) beside the plain recipe, 200 grants per
//! lane. The long run is `cargo run --release --example chaos` (see docs/safety.md).

mod common;

use common::chaos::{self, Fault, Kind, Plan, Report};

/// Runs are serialised: each starts its own six-node cluster and failover timing needs the CPU.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const GRANTS: usize = 200;

/// Runs `fault` with every lane and checks every fencelock lane: it kept granting, and no
/// duplicate token, regression, stale write or lost update, nor two holders at once where the
/// leases promise none (before the fault; throughout one that loses no write). Returns the
/// reports.
async fn run(fault: Fault) -> Vec<Report> {
    let _serial = SERIAL.lock().await;
    let reports = chaos::run(&Plan::new(fault, GRANTS)).await;
    eprintln!("{}", Report::HEADER);
    for report in &reports {
        eprintln!("{}", report.row());
    }
    assert_eq!(reports.len(), Kind::ALL.len(), "one report per lane");
    for report in reports.iter().filter(|r| r.kind.is_fencelock()) {
        assert!(report.grants >= GRANTS, "lane kept granting: {report:?}");
        assert_eq!(report.fencing_violations(), 0, "{report:?}");
        assert_eq!(report.lost_updates, 0, "{report:?}");
        assert_eq!(report.exclusion_violations(), 0, "{report:?}");
    }
    reports
}

/// The checker itself: it counts a double grant as an overlap (so a lock that granted twice
/// with rising tokens would fail the runs above).
#[test]
fn the_overlap_check_finds_double_grants() {
    chaos::overlap_check_finds_double_grants();
}

fn lane(reports: &[Report], kind: Kind) -> &Report {
    reports
        .iter()
        .find(|r| r.kind == kind)
        .expect("every lane reports")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn master_kill() {
    run(Fault::MasterKill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn master_paused_past_node_timeout_then_resumed() {
    run(Fault::MasterPause).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn manual_failover() {
    run(Fault::Failover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forced_failover() {
    run(Fault::FailoverForce).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn takeover() {
    run(Fault::FailoverTakeover).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forced_loss_fences_hold_while_the_plain_counter_repeats() {
    let reports = run(Fault::ForcedLoss).await;
    let plain = lane(&reports, Kind::Plain);
    assert!(
        plain.duplicate_tokens + plain.regressions > 0,
        "the plain counter shows the lost writes: {plain:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slot_migration_while_locks_are_taken() {
    run(Fault::SlotMigration).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn paused_client_late_write_is_rejected_only_with_fencing() {
    let reports = run(Fault::ClientPause).await;
    for report in reports
        .iter()
        .filter(|r| r.kind.is_fencelock() && r.kind.has_store())
    {
        assert!(
            report.writes_rejected > 0,
            "late writes rejected: {report:?}"
        );
    }
    let plain = lane(&reports, Kind::Plain);
    assert!(
        plain.stale_writes_accepted > 0 && plain.lost_updates > 0,
        "the plain lock lets the late writer through: {plain:?}"
    );
}
