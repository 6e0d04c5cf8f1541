//! Compile-time checks that the public futures and guards can cross threads (as tokio's
//! `tests/async_send_sync.rs`): a future that is not `Send` cannot be spawned on a multi-thread
//! runtime, a guard that is not `Send` cannot be held across an `.await` in such a task. No
//! server is needed: the futures are built in functions that are type-checked, never run.

use std::time::Duration;

use fencelock::{
    Client, Error, FairLockGuard, Latch, LockGuard, LockOptions, MultiGuard, Permit, PermitGuard,
    QuorumClient, QuorumGuard, ReadGuard, Semaphore, WriteGuard,
};

fn send<T: Send>(_: &T) {}
fn send_sync<T: Send + Sync>() {}

/// Builds every acquiring future and requires it to be `Send`; a change that makes one of them
/// `!Send` fails to compile here.
#[allow(dead_code)]
fn acquiring_futures_are_send(
    client: &Client,
    quorum: &QuorumClient,
    semaphore: &Semaphore,
    latch: &Latch,
) {
    let options = LockOptions::default();
    send(&client.lock("a", &options));
    send(&client.try_lock("a", &options));
    send(&client.fair_lock("a", &options));
    send(&client.try_fair_lock("a", &options));
    send(&client.read_lock("a", &options));
    send(&client.try_read_lock("a", &options));
    send(&client.write_lock("a", &options));
    send(&client.try_write_lock("a", &options));
    send(&client.lock_all(&["a", "b"], &options));
    send(&client.fair_lock_all(&["a", "b"], &options));
    send(&client.read_lock_all(&["a", "b"], &options));
    send(&client.write_lock_all(&["a", "b"], &options));
    send(&client.with_lock("a", &options, |_fence| async { Ok::<(), Error>(()) }));
    send(&semaphore.acquire(&options));
    send(&semaphore.acquire_many(2, &options));
    send(&semaphore.try_acquire(&options));
    send(&latch.wait(Duration::from_secs(1)));
    send(&quorum.lock("a", &options));
}

/// The releasing and extending futures of the guards.
#[allow(dead_code)]
fn guard_futures_are_send(
    lock: LockGuard,
    fair: FairLockGuard,
    permit: PermitGuard,
    multi: MultiGuard,
) {
    send(&lock.lost());
    send(&fair.lost());
    send(&permit.lost());
    send(&multi.lost());
    send(&lock.release());
    send(&fair.release());
    send(&permit.release());
    send(&multi.release());
}

#[test]
fn futures_are_send() {
    // The checks are the type-checking of these functions; naming them keeps them compiled.
    let _: fn(&Client, &QuorumClient, &Semaphore, &Latch) = acquiring_futures_are_send;
    let _: fn(LockGuard, FairLockGuard, PermitGuard, MultiGuard) = guard_futures_are_send;
}

#[test]
fn guards_and_handles_are_send_and_sync() {
    send_sync::<LockGuard>();
    send_sync::<FairLockGuard>();
    send_sync::<ReadGuard>();
    send_sync::<WriteGuard>();
    send_sync::<PermitGuard>();
    send_sync::<Permit>();
    send_sync::<MultiGuard>();
    send_sync::<MultiGuard<FairLockGuard>>();
    send_sync::<MultiGuard<ReadGuard>>();
    send_sync::<MultiGuard<WriteGuard>>();
    send_sync::<QuorumGuard>();
    send_sync::<Client>();
    send_sync::<QuorumClient>();
    send_sync::<Semaphore>();
    send_sync::<Latch>();
    send_sync::<Error>();
}
