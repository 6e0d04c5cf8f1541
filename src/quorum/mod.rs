//! The fenced quorum lock over N independent deployments ("Redlock done right"): `client.rs`
//! the client and its locking calls; `connect.rs` its builder and the refusal of deployments
//! that reach one server; `shared.rs` the deployments and settings the client and its guards
//! share; `attempt.rs` one acquisition's two rounds; `guard.rs` the guard over the nodes'
//! holds; `race.rs` the requests to all nodes at once.
//!
//! Each deployment (a standalone server or a whole cluster) is reached through an ordinary
//! [`Client`] in clock fence mode, and holds the quorum lock in the mutex's key with the
//! mutex's scripts; only the commit round has a script of its own (`quorum_commit`).
//!
//! 1. **acquire**: the mutex's acquire script on every node at once, owner token `O`: a node
//!    that grants answers `t_i = max(counter + 1, TIME µs + 1, floor + 1)`.
//! 2. Fewer than a majority granted within the validity (`TTL − elapsed − drift`, drift =
//!    TTL/100 + [`QuorumClientBuilder::drift`]): release everywhere, fail or retry.
//! 3. **commit**: `T = max t_i` over the granting nodes; `quorum_commit` on each of them sets
//!    its stored fence to `max(stored, T)` while `O` still owns the lock there.
//! 4. `T` is handed out only once a majority confirmed the commit within the validity;
//!    otherwise release everywhere, fail or retry.
//!
//! Any later majority shares a node with the commit majority, whose stored fence is at least
//! `T`, so the next token is above `T` whatever the clocks do (as long as acknowledged writes
//! survive a restart: see `docs/safety.md`).

mod attempt;
mod client;
mod connect;
mod guard;
mod race;
mod shared;

pub use client::QuorumClient;
pub use connect::QuorumClientBuilder;
pub use guard::QuorumGuard;
