//! The fault-injection suite, short form: every fault once, 200 grants per lock. The long run
//! is `cargo run --release --example chaos` (see docs/safety.md).

mod common;

use common::chaos::{self, Fault, Plan, Report, Variant};

/// Runs are serialised: each starts its own six-node cluster and failover timing needs the CPU.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const GRANTS: usize = 200;

async fn run(fault: Fault) -> (Report, Report) {
    let _serial = SERIAL.lock().await;
    let reports = chaos::run(&Plan::new(fault, GRANTS)).await;
    eprintln!("{}", Report::HEADER);
    for report in &reports {
        eprintln!("{}", report.row());
    }
    let fenced = reports.iter().find(|r| r.variant == Variant::Fenced);
    let plain = reports.iter().find(|r| r.variant == Variant::Plain);
    let (fenced, plain) = (fenced.cloned().unwrap(), plain.cloned().unwrap());
    assert!(
        fenced.grants >= GRANTS,
        "fenced lock kept granting: {fenced:?}"
    );
    assert_eq!(fenced.fencing_violations(), 0, "{fenced:?}");
    assert_eq!(fenced.lost_updates, 0, "{fenced:?}");
    (fenced, plain)
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
    let (_, plain) = run(Fault::ForcedLoss).await;
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
    let (fenced, plain) = run(Fault::ClientPause).await;
    assert!(
        fenced.writes_rejected > 0,
        "late writes rejected: {fenced:?}"
    );
    assert!(
        plain.stale_writes_accepted > 0 && plain.lost_updates > 0,
        "the plain lock lets the late writer through: {plain:?}"
    );
}
