//! The contract every exclusive hold of the family passes, whatever the primitive: the mutex,
//! the read-write lock's write hold, the fair lock and a semaphore permit (limit 1).
//!
//! Each check is one generic function over [`Primitive`]; `contract!` instantiates it for every
//! primitive. What a check needs of a primitive is only its public API, plus, for the resend
//! check, how to call its acquire script by hand. The countdown latch has no holds and the read
//! hold is shared by design: their own files (`tests/latch.rs`, `tests/rwlock.rs`) cover the
//! parts of the contract that apply to them.

mod common;

use std::time::Duration;

use common::{alive_tasks, eventually, grant_values, Cluster, Node, Standalone};
use fencelock::{
    Client, Error, FairLockGuard, FenceToken, LockGuard, LockOptions, PermitGuard, Result,
    WriteGuard,
};

/// One exclusive hold of a primitive, seen through its public API.
trait Primitive {
    type Guard: std::fmt::Debug;
    /// The primitive's key suffix (`<prefix>:{NAME}:<kind>`).
    const KIND: &'static str;
    /// The script its acquiring call runs (`fencelock::lua_scripts` name).
    const ACQUIRE: &'static str;
    async fn try_take(client: &Client, name: &str, options: &LockOptions) -> Result<Self::Guard>;
    async fn take(client: &Client, name: &str, options: &LockOptions) -> Result<Self::Guard>;
    fn fence(guard: &Self::Guard) -> FenceToken;
    async fn release(guard: Self::Guard) -> Result<()>;
    async fn lost(guard: &Self::Guard) -> Error;
    /// The acquire script called by hand for `owner` (as redis-rs would resend it).
    fn acquire_by_hand(key: &str, owner: &str) -> redis::Cmd;
    /// Its reply as `(status, fence)`: status 1 granted, 2 the same owner again, 0 refused.
    fn status_and_fence(reply: &[i64]) -> (i64, Option<i64>) {
        (reply[0], reply.get(1).copied())
    }
    /// The server the checks run on.
    fn server() -> Standalone {
        Standalone::start()
    }
}

fn key(kind: &str, name: &str) -> String {
    format!("fencelock:{{{name}}}:{kind}")
}

fn script(name: &str) -> &'static str {
    fencelock::lua_scripts()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("script {name}"))
        .source
}

/// `EVAL <script> 1 key owner ttl floor clock <extra..>`: the argument layout the granting
/// scripts of the mutex, the read-write lock and the fair lock share, then their own (each
/// ends with the expiry grace).
fn eval_grant(script_name: &str, key: &str, owner: &str, extra: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script(script_name))
        .arg(1)
        .arg(key)
        .arg(owner)
        .arg(10_000)
        .arg(0)
        .arg("clock")
        .arg(extra);
    cmd
}

struct Mutex;
impl Primitive for Mutex {
    type Guard = LockGuard;
    const KIND: &'static str = "lock";
    const ACQUIRE: &'static str = "acquire";
    async fn try_take(client: &Client, name: &str, options: &LockOptions) -> Result<LockGuard> {
        client.try_lock(name, options).await
    }
    async fn take(client: &Client, name: &str, options: &LockOptions) -> Result<LockGuard> {
        client.lock(name, options).await
    }
    fn fence(guard: &LockGuard) -> FenceToken {
        guard.fence()
    }
    async fn release(guard: LockGuard) -> Result<()> {
        guard.release().await
    }
    async fn lost(guard: &LockGuard) -> Error {
        guard.lost().await
    }
    fn acquire_by_hand(key: &str, owner: &str) -> redis::Cmd {
        eval_grant("acquire", key, owner, &["10000"])
    }
}

/// The mutex on a server that loads fencelock's Redis module: the client's default
/// (`ModuleUse::Auto`) sends its acquire and release as the module's commands.
struct ModuleMutex;
impl Primitive for ModuleMutex {
    type Guard = LockGuard;
    const KIND: &'static str = "lock";
    const ACQUIRE: &'static str = "acquire";
    async fn try_take(client: &Client, name: &str, options: &LockOptions) -> Result<LockGuard> {
        Mutex::try_take(client, name, options).await
    }
    async fn take(client: &Client, name: &str, options: &LockOptions) -> Result<LockGuard> {
        Mutex::take(client, name, options).await
    }
    fn fence(guard: &LockGuard) -> FenceToken {
        Mutex::fence(guard)
    }
    async fn release(guard: LockGuard) -> Result<()> {
        Mutex::release(guard).await
    }
    async fn lost(guard: &LockGuard) -> Error {
        Mutex::lost(guard).await
    }
    fn acquire_by_hand(key: &str, owner: &str) -> redis::Cmd {
        Mutex::acquire_by_hand(key, owner)
    }
    fn server() -> Standalone {
        Standalone::start_with_module()
    }
}

struct Write;
impl Primitive for Write {
    type Guard = WriteGuard;
    const KIND: &'static str = "rw";
    const ACQUIRE: &'static str = "rw_write";
    async fn try_take(client: &Client, name: &str, options: &LockOptions) -> Result<WriteGuard> {
        client.try_write_lock(name, options).await
    }
    async fn take(client: &Client, name: &str, options: &LockOptions) -> Result<WriteGuard> {
        client.write_lock(name, options).await
    }
    fn fence(guard: &WriteGuard) -> FenceToken {
        guard.fence()
    }
    async fn release(guard: WriteGuard) -> Result<()> {
        guard.release().await
    }
    async fn lost(guard: &WriteGuard) -> Error {
        guard.lost().await
    }
    fn acquire_by_hand(key: &str, owner: &str) -> redis::Cmd {
        eval_grant("rw_write", key, owner, &["", "10000"]) // no intent id: a single attempt
    }
}

struct Fair;
impl Primitive for Fair {
    type Guard = FairLockGuard;
    const KIND: &'static str = "fair";
    const ACQUIRE: &'static str = "fair_acquire";
    async fn try_take(client: &Client, name: &str, options: &LockOptions) -> Result<FairLockGuard> {
        client.try_fair_lock(name, options).await
    }
    async fn take(client: &Client, name: &str, options: &LockOptions) -> Result<FairLockGuard> {
        client.fair_lock(name, options).await
    }
    fn fence(guard: &FairLockGuard) -> FenceToken {
        guard.fence()
    }
    async fn release(guard: FairLockGuard) -> Result<()> {
        guard.release().await
    }
    async fn lost(guard: &FairLockGuard) -> Error {
        guard.lost().await
    }
    fn acquire_by_hand(key: &str, owner: &str) -> redis::Cmd {
        eval_grant("fair_acquire", key, owner, &["0", "256", "10000"]) // place lease 0: no queueing
    }
}

/// The fair lock on a server that loads fencelock's Redis module: its acquire and release go
/// to the module's `fencelock.fair_acquire` and `fencelock.fair_release`.
struct ModuleFair;
impl Primitive for ModuleFair {
    type Guard = FairLockGuard;
    const KIND: &'static str = "fair";
    const ACQUIRE: &'static str = "fair_acquire";
    async fn try_take(client: &Client, name: &str, options: &LockOptions) -> Result<FairLockGuard> {
        Fair::try_take(client, name, options).await
    }
    async fn take(client: &Client, name: &str, options: &LockOptions) -> Result<FairLockGuard> {
        Fair::take(client, name, options).await
    }
    fn fence(guard: &FairLockGuard) -> FenceToken {
        Fair::fence(guard)
    }
    async fn release(guard: FairLockGuard) -> Result<()> {
        Fair::release(guard).await
    }
    async fn lost(guard: &FairLockGuard) -> Error {
        Fair::lost(guard).await
    }
    fn acquire_by_hand(key: &str, owner: &str) -> redis::Cmd {
        Fair::acquire_by_hand(key, owner)
    }
    fn server() -> Standalone {
        Standalone::start_with_module()
    }
}

struct Permit;
impl Primitive for Permit {
    type Guard = PermitGuard;
    const KIND: &'static str = "sem";
    const ACQUIRE: &'static str = "semaphore_acquire";
    async fn try_take(client: &Client, name: &str, options: &LockOptions) -> Result<PermitGuard> {
        client.semaphore(name, 1)?.try_acquire(options).await
    }
    async fn take(client: &Client, name: &str, options: &LockOptions) -> Result<PermitGuard> {
        client.semaphore(name, 1)?.acquire(options).await
    }
    fn fence(guard: &PermitGuard) -> FenceToken {
        guard.fence()
    }
    async fn release(guard: PermitGuard) -> Result<()> {
        guard.release().await
    }
    async fn lost(guard: &PermitGuard) -> Error {
        guard.lost().await
    }
    fn acquire_by_hand(key: &str, owner: &str) -> redis::Cmd {
        // owner, count 1, limit 1, TTL, floor, mode, no waiter id, grace.
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(script("semaphore_acquire"))
            .arg(1)
            .arg(key)
            .arg(owner);
        cmd.arg(&["1", "1", "10000", "0", "clock", "", "10000"]);
        cmd
    }
    /// `{1, behind, lease, number, fence}` / `{2, 0, lease, number, fence}` / `{0, ..}`.
    fn status_and_fence(reply: &[i64]) -> (i64, Option<i64>) {
        (reply[0], reply.get(4).copied())
    }
}

async fn clients(server: &Standalone) -> (Client, Client) {
    let a = Client::connect([server.url()]).await.unwrap();
    let b = Client::connect([server.url()]).await.unwrap();
    (a, b)
}

/// Grant, refuse, release; the next grant's fence is higher; releasing a hold that was lost
/// (its lease ended and another owner took it) says so.
async fn grant_refuse_release<P: Primitive>() {
    let server = P::server();
    let (a, b) = clients(&server).await;
    let options = LockOptions::new().ttl(Duration::from_secs(10));
    let first = P::try_take(&a, "c", &options).await.unwrap();
    let first_fence = P::fence(&first);
    let refused = P::try_take(&b, "c", &options).await.unwrap_err();
    assert!(refused.is_busy(), "{}: {refused:?}", P::KIND);
    P::release(first).await.unwrap();
    let second = P::take(&b, "c", &options).await.unwrap();
    assert!(P::fence(&second) > first_fence, "{}", P::KIND);
    P::release(second).await.unwrap();

    let short = LockOptions::new().ttl(Duration::from_millis(150));
    let late = P::try_take(&a, "d", &short).await.unwrap();
    let late_fence = P::fence(&late);
    let expired = P::lost(&late).await;
    assert!(expired.is_lock_lost(), "{}: {expired:?}", P::KIND);
    let next = P::take(&b, "d", &options.clone().timeout(Duration::from_secs(2)))
        .await
        .unwrap();
    assert!(P::fence(&next) > late_fence, "{}", P::KIND);
    let err = P::release(late).await.unwrap_err();
    assert!(err.is_lock_lost(), "{}: {err:?}", P::KIND);
    P::release(next).await.unwrap();
}

/// The acquire script sent twice for one owner (as redis-rs resends after an I/O error)
/// grants once: the same fence, the counter advanced once.
async fn idempotent_resend<P: Primitive>() {
    let server = P::server();
    let key = key(P::KIND, "resend");
    let first = grant_values(server.node.cmd(&mut P::acquire_by_hand(&key, "owner-1")));
    let again = grant_values(server.node.cmd(&mut P::acquire_by_hand(&key, "owner-1")));
    let (status, fence) = P::status_and_fence(&first);
    assert_eq!(status, 1, "{}: granted {first:?}", P::KIND);
    let (status, fence_again) = P::status_and_fence(&again);
    assert_eq!(status, 2, "{}: a resend is recognised {again:?}", P::KIND);
    assert_eq!(fence, fence_again, "{}: the same fence", P::KIND);
    let stored: Option<i64> = stored_fence(&server.node, P::KIND, &key);
    assert_eq!(stored, fence, "{}: the counter advanced once", P::KIND);
    let other = grant_values(server.node.cmd(&mut P::acquire_by_hand(&key, "owner-2")));
    assert_eq!(
        other[0],
        0,
        "{}: another owner is refused {other:?}",
        P::KIND
    );
}

/// `client`'s one-shot attempts on `name`, 5 ms apart, up to `attempts`: the first guard taken,
/// `None` while it stays busy.
async fn taken_within<P: Primitive>(
    client: &Client,
    name: &str,
    options: &LockOptions,
    attempts: usize,
) -> Option<P::Guard> {
    for _ in 0..attempts {
        match P::try_take(client, name, options).await {
            Ok(guard) => return Some(guard),
            Err(err) if err.is_busy() => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(err) => panic!("{}: {err:?}", P::KIND),
        }
    }
    None
}

/// A call dropped at any moment holds nothing and leaves nothing behind: no holder, no queue
/// place or writer intent that would keep others out, no task.
async fn cancel_safety<P: Primitive>() {
    let server = P::server();
    let (a, b) = clients(&server).await;
    let options = LockOptions::new().ttl(Duration::from_secs(30));
    let baseline = alive_tasks();
    // Uncontended calls dropped at 0 to 3 ms: whatever they took is given back.
    for step in 0..8u64 {
        let dropped = Duration::from_micros(step * 400);
        let _ = tokio::time::timeout(dropped, P::take(&a, "cancel", &options)).await;
        let free = taken_within::<P>(&b, "cancel", &options, 200).await;
        let guard = free.unwrap_or_else(|| panic!("{}: a dropped call kept the hold", P::KIND));
        P::release(guard).await.unwrap();
    }
    // The same on a server that lost the acquiring script but still has the others (restarted,
    // or a promoted replica, and another client has since run a release): the cut call is
    // resent after NOSCRIPT, and its undo must not overtake that resend.
    for step in 0..24u64 {
        let mut conn = server.node.connection().unwrap();
        let mut reload = redis::pipe();
        reload.cmd("SCRIPT").arg("FLUSH").ignore();
        for script in fencelock::lua_scripts().filter(|script| script.name != P::ACQUIRE) {
            reload.cmd("SCRIPT").arg("LOAD").arg(script.source).ignore();
        }
        reload.query::<()>(&mut conn).unwrap();
        let dropped = Duration::from_micros(step * 150);
        let _ = tokio::time::timeout(dropped, P::take(&a, "cancel", &options)).await;
        let free = taken_within::<P>(&b, "cancel", &options, 200).await;
        let guard = free.unwrap_or_else(|| {
            panic!(
                "{}: a call dropped at {dropped:?} on a server without its script kept the hold",
                P::KIND
            )
        });
        P::release(guard).await.unwrap();
    }
    // A waiting call dropped while the hold is taken leaves no place or intent behind: once
    // the holder releases, a one-shot attempt of a third party succeeds at once.
    let holder = P::try_take(&a, "cancel", &options).await.unwrap();
    let waiting = tokio::time::timeout(Duration::from_millis(150), P::take(&b, "cancel", &options));
    assert!(
        waiting.await.is_err(),
        "{}: the waiter was still waiting",
        P::KIND
    );
    P::release(holder).await.unwrap();
    let c = Client::connect([server.url()]).await.unwrap();
    let third = taken_within::<P>(&c, "cancel", &options, 100).await;
    let third = third.unwrap_or_else(|| panic!("{}: the dropped waiter kept others out", P::KIND));
    P::release(third).await.unwrap();
    drop((a, b, c));
    eventually("no task left behind", Duration::from_secs(5), || {
        alive_tasks() <= baseline
    })
    .await;
}

/// With the watchdog a hold outlives its TTL; when the key is lost behind its back, `lost()`
/// says so within a renewal period and the release reports the loss.
async fn watchdog_and_loss<P: Primitive>() {
    let server = P::server();
    let (a, b) = clients(&server).await;
    let ttl = Duration::from_millis(300);
    let watched = LockOptions::new().ttl(ttl).watchdog(true);
    let guard = P::try_take(&a, "watched", &watched).await.unwrap();
    eventually("three renewals", Duration::from_secs(3), || {
        a.stats().renewals >= 3
    })
    .await;
    let refused = P::try_take(&b, "watched", &watched).await.unwrap_err();
    assert!(
        refused.is_busy(),
        "{}: held past its TTL {refused:?}",
        P::KIND
    );
    let _: i64 = server
        .node
        .cmd(redis::cmd("DEL").arg(key(P::KIND, "watched")));
    let lost = tokio::time::timeout(Duration::from_secs(2), P::lost(&guard))
        .await
        .unwrap_or_else(|_| panic!("{}: lost() did not resolve", P::KIND));
    assert!(lost.is_lock_lost(), "{}: {lost:?}", P::KIND);
    let err = P::release(guard).await.unwrap_err();
    assert!(err.is_lock_lost(), "{}: {err:?}", P::KIND);
}

/// Takes and releases `rounds` holds of `name`, returning the highest fence.
async fn cycle<P: Primitive>(client: &Client, name: &str, rounds: usize) -> FenceToken {
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let mut highest = None;
    for _ in 0..rounds {
        let guard = P::take(client, name, &options).await.unwrap();
        highest = highest.max(Some(P::fence(&guard)));
        P::release(guard).await.unwrap();
    }
    highest.unwrap()
}

macro_rules! contract {
    ($($module:ident => $primitive:ty),* $(,)?) => {$(
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread")]
            async fn grant_refuse_release() {
                super::grant_refuse_release::<$primitive>().await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn idempotent_resend() {
                super::idempotent_resend::<$primitive>().await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn cancel_safety() {
                super::cancel_safety::<$primitive>().await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn watchdog_and_loss() {
                super::watchdog_and_loss::<$primitive>().await;
            }
        }
    )*};
}

contract!(
    mutex => Mutex,
    mutex_module => ModuleMutex,
    write => Write,
    fair => Fair,
    fair_module => ModuleFair,
    permit => Permit,
);

/// Tokens of every primitive stay monotonic across a failover that loses acknowledged writes:
/// the replica is cut off, holds are granted on the master, the master dies and the lagging
/// replica takes over.
#[tokio::test(flavor = "multi_thread")]
async fn every_primitive_keeps_fences_monotonic_across_a_forced_loss() {
    let mut cluster = Cluster::start();
    let client = Client::connect(cluster.urls()).await.unwrap();
    let name = "contract";
    let slot = fencelock::slot_of(name.as_bytes());
    let master = cluster.master_of_slot(slot).port;
    let replica = cluster.replica_of(master).port;
    cycle::<Mutex>(&client, name, 2).await;
    cycle::<Write>(&client, name, 2).await;
    cycle::<Fair>(&client, name, 2).await;
    cycle::<Permit>(&client, name, 2).await;
    cluster.cut_off_replica(master, replica);
    let before = [
        cycle::<Mutex>(&client, name, 4).await,
        cycle::<Write>(&client, name, 4).await,
        cycle::<Fair>(&client, name, 4).await,
        cycle::<Permit>(&client, name, 4).await,
    ];
    cluster.take_over_with_lagging_replica(master, replica, slot);
    let promoted: &Node = cluster.node(replica);
    for (kind, before) in ["lock", "rw", "fair", "sem"].iter().zip(before) {
        let kept: Option<u64> = stored_fence(promoted, kind, &key(kind, name));
        assert!(
            kept < Some(before.get()),
            "{kind}: the takeover lost the grants made after the cut ({kept:?} vs {before})"
        );
    }
    let after = [
        cycle::<Mutex>(&client, name, 1).await,
        cycle::<Write>(&client, name, 1).await,
        cycle::<Fair>(&client, name, 1).await,
        cycle::<Permit>(&client, name, 1).await,
    ];
    for ((kind, before), after) in ["mutex", "write", "fair", "permit"]
        .iter()
        .zip(before)
        .zip(after)
    {
        println!("{kind}: {before} -> {after}");
        assert!(after > before, "{kind}: {after} <= {before}");
    }
}

/// The last fence stored in `key` of primitive `kind`: the mutex and the fair lock keep it in
/// their packed state (key layout 2), the others in a field `fence`.
fn stored_fence<T: std::str::FromStr>(node: &Node, kind: &str, key: &str) -> Option<T>
where
    T::Err: std::fmt::Debug,
{
    let fence: Option<String> = match kind {
        "lock" | "fair" => node.lock_field(key, "fence"),
        _ => node.cmd(redis::cmd("HGET").arg(key).arg("fence")),
    };
    fence.map(|f| f.parse().unwrap())
}
