//! An exhaustive, bounded model check of the fenced quorum lock (issue 12; the argument is in
//! docs/safety.md, "Quorum lock (fenced Redlock)"). Plain Rust, no Redis: a breadth-first search
//! over every interleaving of a few clients and three nodes, within bounds on clock ticks,
//! acquisitions, restarts and resends, checking the fencing invariants in every state reached.
//!
//! What is modelled, per lock:
//! - three nodes, each with {owner, stored fence, lease end}, a clock and an up/down flag;
//! - round 1 (acquire) as the acquire script in clock mode does it: a node grants when no live
//!   lease is held (or answers the stored fence again to the same owner) and grants
//!   `t = max(fence + 1, clock + 1)`, storing `fence = t`, `owner`, `lease end = clock + TTL`;
//! - round 2 (`quorum_commit`): only while the same owner holds a live lease there, the node
//!   sets `fence = max(fence, T)`; T is usable once a majority acknowledged the commit;
//! - release: owner-checked removal of the owner (the fence is kept);
//! - key expiry: a node with no live lease may lose the whole key (fence included) once its
//!   clock has passed both the lease end and the fence, as `keep()` in the prologue arranges
//!   (the model's expiry grace is 0, the most aggressive choice);
//! - messages: every request is delivered at any later time or never; a reply may be lost; a
//!   request may be delivered twice (a resend); clients pause for as long as they like (there
//!   are no client clocks: a client never knows its lease ended), give up at any time and
//!   release what they asked for, with owner tokens unique per acquisition;
//! - clocks: a global tick advances every node's clock (also while it is down); a drift step
//!   advances one node's clock alone while all clocks stay within the model's skew bound; the
//!   starting clocks are every combination of the given offsets within that bound;
//! - restarts: with persistence (acknowledged writes survive) a restart changes no state, so it
//!   is the same as a paused node with lost messages, which every run includes; empty restarts
//!   wipe the node's state and bring it back after a delay counted in ticks (real time).
//!
//! Invariants, checked in every state:
//! - I1 unique: no two acquisitions ever hold the same usable token;
//! - I1 order: a token is above every token that was already usable when its acquire began
//!   (real-time order: an acquire that starts after another one's token became usable gets a
//!   larger token);
//! - I1 strict (only where a test asks for it): tokens increase in the order they became
//!   usable, whatever overlapped — the wording the task started from, which does NOT hold (test
//!   `usable_order_is_not_token_order_when_a_stale_client_commits_late`);
//! - I2: a fenced store that keeps the highest token it accepted (equal passes) never accepts a
//!   write of an acquisition after it accepted one of an acquisition that began after the first
//!   one's token became usable (a stale write).
//!
//! Not modelled: floors (a floor only raises a node's answer), extend/renew (an owner-checked
//! lease change that writes no fence), re-entrancy, the client's validity timing (mutual
//! exclusion is not checked here; the fence must hold without it).

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

const NODES: usize = 3;
const MAJORITY: u32 = 2;
const MAX_CLIENTS: usize = 3;
const MAX_ACQUISITIONS: usize = 6;
const NAMES: [char; NODES] = ['A', 'B', 'C'];

/// Pending-request bits, per node and acquisition.
const ACQUIRE: u8 = 1;
const COMMIT: u8 = 2;
const RELEASE: u8 = 4;

/// What a node restart does to the lock's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Restarts {
    /// Acknowledged writes survive (AOF `appendfsync always`): no state changes.
    Persistent,
    /// Up to `crashes` times, a node loses its whole state and comes back `delay` ticks later
    /// (0: at once); while down it answers nothing.
    Empty { delay: u8, crashes: u8 },
}

/// The bounds and the protocol variant of one run.
#[derive(Clone, Copy, Debug)]
struct Model {
    /// Round 2 (commit) on; off is "Redlock + max": T = max of round 1, used at once.
    commit_round: bool,
    clients: usize,
    /// Acquisitions each client makes, one after the other.
    attempts: u8,
    /// Lease length in ticks.
    ttl: u8,
    /// Global clock ticks (real time) the run may take.
    ticks: u8,
    /// Each node starts with one of these clock values.
    offsets: &'static [u8],
    /// Largest difference between two node clocks, at the start and after drift steps.
    skew: u8,
    /// Drift steps (one node's clock advancing alone) the run may take.
    drift: u8,
    restarts: Restarts,
    /// Requests that may be delivered twice.
    resends: u8,
    /// `quorum_commit` also refuses (answers 0) when the node's stored fence is above T: the
    /// node granted again after the answer the client used (see
    /// `a_resent_acquire_breaks_the_commit_unless_it_checks_the_fence`).
    commit_checks_fence: bool,
    /// Holders write to the modelled fenced store (I2).
    store: bool,
    /// Replies may be lost (else a node's answer reaches the client at once).
    lost_replies: bool,
    /// A node grants only if its lock was not written (granted or committed) earlier in the
    /// same tick: the image of "fewer than one grant per clock unit" (a script takes ~30 µs,
    /// `TIME` counts µs; a round trip takes longer), which keeps every fence at most one above
    /// the fastest clock. Needed only where an argument relies on clocks (empty restarts).
    one_write_per_tick: bool,
    /// Also check the strict order (usable order = token order).
    strict_usable_order: bool,
    /// A run reaching more states fails (keeps CI time bounded).
    max_states: usize,
}

/// Persistent nodes, two concurrent clients, one node's clock 3 ticks ahead of or behind the
/// others (or none), leases of one tick, one tick of real time. Sized for CI (a debug build).
const PERSISTENT: Model = Model {
    commit_round: true,
    clients: 2,
    attempts: 1,
    ttl: 1,
    ticks: 1,
    offsets: &[0, 3],
    skew: 3,
    drift: 0,
    restarts: Restarts::Persistent,
    resends: 0,
    lost_replies: false,
    commit_checks_fence: false,
    store: true,
    one_write_per_tick: false,
    strict_usable_order: false,
    max_states: 1_000_000,
};

/// Wider bounds, for a release build: `QUORUM_MODEL_WIDE=1 cargo test --release --test
/// quorum_model -- --nocapture` (too slow for CI in a debug build).
fn wide() -> bool {
    std::env::var_os("QUORUM_MODEL_WIDE").is_some()
}

/// Empty restarts: one client acquiring twice in a row (the restart argument is about
/// sequential acquisitions; concurrency is `PERSISTENT`'s part), one crash, clocks `skew`
/// apart or equal, a node granting at most once per tick.
fn restarting(delay: u8, skew: u8) -> Model {
    const OFFSETS: [&[u8]; 4] = [&[0], &[0, 1], &[0, 2], &[0, 3]];
    Model {
        clients: 1,
        attempts: 2,
        ttl: 1,
        ticks: delay,
        offsets: OFFSETS[skew as usize],
        skew,
        drift: 0,
        restarts: Restarts::Empty { delay, crashes: 1 },
        lost_replies: false,
        store: false,
        one_write_per_tick: true,
        max_states: 3_000_000,
        ..PERSISTENT
    }
}

/// One node with everything in the state that is about it (so that sorting nodes is the
/// symmetry reduction over node names).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
struct Node {
    clock: u8,
    /// 0 none, else acquisition id + 1 (only while the lease is live: expired owners are
    /// cleared, which changes no behaviour).
    owner: u8,
    fence: u8,
    lease_end: u8,
    /// 0 up; d + 1 down, may restart in d ticks.
    down: u8,
    /// Written during the current tick (for `one_write_per_tick`).
    written: bool,
    /// Requests on their way to this node, per acquisition (ACQUIRE | COMMIT | RELEASE).
    pending: [u8; MAX_ACQUISITIONS],
    /// Per client: the round-1 answer its current acquisition received from this node.
    grant: [u8; MAX_CLIENTS],
    /// Bit per client: its current acquisition's commit was acknowledged by this node.
    acked: u8,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
enum Phase {
    #[default]
    Idle,
    Round1,
    Round2,
    Holding,
    Done,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Debug)]
struct Client {
    phase: Phase,
    attempt: u8,
    /// T, from the end of round 1.
    token: u8,
    /// The highest token usable when this acquisition began.
    floor: u8,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
struct State {
    nodes: [Node; NODES],
    clients: [Client; MAX_CLIENTS],
    /// The T each acquisition's commit requests carry.
    commit_token: [u8; MAX_ACQUISITIONS],
    /// `after[y]`: bit per acquisition already usable when acquisition y began.
    after: [u8; MAX_ACQUISITIONS],
    now: u8,
    crashes: u8,
    drift: u8,
    resends: u8,
    usable_max: u8,
    /// Bit per token value that became usable.
    usable_tokens: u64,
    /// Bit per acquisition whose token became usable.
    usable_acqs: u8,
    store_max: u8,
    /// Bit per acquisition whose write the store accepted.
    store_writers: u8,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Start(u8),
    Deliver {
        node: u8,
        acq: u8,
        kind: u8,
        reply: bool,
        resend: bool,
    },
    EndRound1(u8),
    GiveUp(u8),
    Write(u8),
    Release(u8),
    Tick,
    Drift(u8),
    Crash(u8),
    Restart(u8),
    KeyExpires(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Violation {
    /// A usable token not above one that was usable when its acquire began.
    Regression { token: u8, floor: u8 },
    /// Two acquisitions with the same usable token.
    Duplicate { token: u8 },
    /// A usable token not above one that became usable earlier (strict order only).
    OutOfOrder { token: u8, earlier: u8 },
    /// The store accepted a write of an acquisition after one of a later acquisition.
    StaleWrite { token: u8, newer: u8 },
}

/// The outcome of one run.
struct Outcome {
    states: usize,
    /// The most tokens that became usable in one run (a check that the bounds let runs
    /// get somewhere).
    most_usable: u32,
    transitions: usize,
    depth: usize,
    millis: u128,
    violation: Option<(Violation, Vec<String>)>,
}

fn acq_of(model: &Model, c: usize, attempt: u8) -> u8 {
    (c as u8) * model.attempts + attempt
}

fn name(model: &Model, acq: u8) -> String {
    if model.attempts == 1 {
        format!("c{}", acq + 1)
    } else {
        format!("c{}#{}", acq / model.attempts + 1, acq % model.attempts + 1)
    }
}

fn remap_bits(bits: u8, map: &[u8; MAX_ACQUISITIONS]) -> u8 {
    (0..MAX_ACQUISITIONS)
        .filter(|&i| bits & (1 << i) != 0)
        .fold(0, |acc, i| acc | 1 << map[i])
}

impl State {
    fn initial(model: &Model, clocks: [u8; NODES]) -> State {
        let mut nodes = [Node::default(); NODES];
        for (n, node) in nodes.iter_mut().enumerate() {
            node.clock = clocks[n];
        }
        let mut clients = [Client::default(); MAX_CLIENTS];
        for c in clients.iter_mut().skip(model.clients) {
            c.phase = Phase::Done;
        }
        State {
            nodes,
            clients,
            commit_token: [0; MAX_ACQUISITIONS],
            after: [0; MAX_ACQUISITIONS],
            now: 0,
            crashes: match model.restarts {
                Restarts::Empty { crashes, .. } => crashes,
                Restarts::Persistent => 0,
            },
            drift: model.drift,
            resends: model.resends,
            usable_max: 0,
            usable_tokens: 0,
            usable_acqs: 0,
            store_max: 0,
            store_writers: 0,
        }
    }

    fn grants(&self, c: usize) -> u32 {
        self.nodes.iter().filter(|n| n.grant[c] > 0).count() as u32
    }

    fn finish_attempt(&mut self, model: &Model, c: usize) {
        for node in self.nodes.iter_mut() {
            node.grant[c] = 0;
            node.acked &= !(1 << c);
        }
        let attempt = self.clients[c].attempt + 1;
        self.clients[c] = Client {
            attempt,
            phase: if attempt < model.attempts {
                Phase::Idle
            } else {
                Phase::Done
            },
            ..Client::default()
        };
    }

    /// Client `c` may use its token T from now on: check I1.
    fn become_usable(&mut self, model: &Model, c: usize, token: u8) -> Result<(), Violation> {
        let client = self.clients[c];
        if token <= client.floor {
            return Err(Violation::Regression {
                token,
                floor: client.floor,
            });
        }
        assert!(token < 64, "token {token} beyond the model's token set");
        if self.usable_tokens & (1 << token) != 0 {
            return Err(Violation::Duplicate { token });
        }
        if model.strict_usable_order && token <= self.usable_max {
            return Err(Violation::OutOfOrder {
                token,
                earlier: self.usable_max,
            });
        }
        self.usable_tokens |= 1 << token;
        self.usable_max = self.usable_max.max(token);
        self.usable_acqs |= 1 << acq_of(model, c, client.attempt);
        self.clients[c].phase = Phase::Holding;
        self.clients[c].token = token;
        Ok(())
    }

    /// Canonical form of the lock state: expired owners cleared, requests that can no longer
    /// change anything dropped.
    fn normalize(&mut self) {
        for node in self.nodes.iter_mut() {
            if node.owner != 0 && node.clock >= node.lease_end {
                node.owner = 0;
            }
            if node.owner == 0 {
                node.lease_end = 0;
            }
            // A commit or release acts only while its acquisition owns the node; once it does
            // not, only a pending acquire could make it the owner again (owners are unique).
            for acq in 0..MAX_ACQUISITIONS {
                let p = node.pending[acq];
                if p & ACQUIRE == 0 && node.owner != acq as u8 + 1 {
                    node.pending[acq] = 0;
                }
            }
        }
    }

    /// The same state with client `c` renamed `perm[c]`.
    fn rename_clients(&self, model: &Model, perm: &[usize; MAX_CLIENTS]) -> State {
        let mut map = [0u8; MAX_ACQUISITIONS];
        for c in 0..model.clients {
            for a in 0..model.attempts {
                map[acq_of(model, c, a) as usize] = acq_of(model, perm[c], a);
            }
        }
        let mut t = *self;
        let acqs = model.clients * model.attempts as usize;
        for (c, &to) in perm.iter().enumerate().take(model.clients) {
            t.clients[to] = self.clients[c];
        }
        for (n, node) in self.nodes.iter().enumerate() {
            let new = &mut t.nodes[n];
            if node.owner != 0 {
                new.owner = map[node.owner as usize - 1] + 1;
            }
            new.acked = 0;
            for (c, &to) in perm.iter().enumerate().take(model.clients) {
                new.grant[to] = node.grant[c];
                if node.acked & (1 << c) != 0 {
                    new.acked |= 1 << to;
                }
            }
            for (acq, &to) in map.iter().enumerate().take(acqs) {
                new.pending[to as usize] = node.pending[acq];
            }
        }
        for (acq, &to) in map.iter().enumerate().take(acqs) {
            t.commit_token[to as usize] = self.commit_token[acq];
            t.after[to as usize] = remap_bits(self.after[acq], &map);
        }
        t.usable_acqs = remap_bits(self.usable_acqs, &map);
        t.store_writers = remap_bits(self.store_writers, &map);
        t
    }

    /// One representative of the states equal to this one up to the names of nodes and of
    /// clients (they all behave alike, and the checks do not name them).
    fn canonical(&self, model: &Model) -> State {
        const PERMS: [[usize; 3]; 6] = [
            [0, 1, 2],
            [1, 0, 2],
            [0, 2, 1],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        let count = match model.clients {
            1 => 1,
            2 => 2,
            _ => 6,
        };
        let mut best: Option<State> = None;
        for perm in &PERMS[..count] {
            let mut t = if count == 1 {
                *self
            } else {
                self.rename_clients(model, perm)
            };
            t.nodes.sort_unstable();
            if best.is_none_or(|b| t < b) {
                best = Some(t);
            }
        }
        best.unwrap()
    }
}

/// Every step the model knows, enabled or not.
fn candidates(model: &Model, s: &State, steps: &mut Vec<Step>) {
    steps.clear();
    for c in 0..model.clients as u8 {
        steps.extend([
            Step::Start(c),
            Step::EndRound1(c),
            Step::GiveUp(c),
            Step::Write(c),
            Step::Release(c),
        ]);
    }
    for (n, node) in s.nodes.iter().enumerate() {
        for (acq, &p) in node.pending.iter().enumerate() {
            for kind in [ACQUIRE, COMMIT, RELEASE] {
                if p & kind == 0 {
                    continue;
                }
                for reply in [true, false] {
                    if !reply && !model.lost_replies {
                        continue;
                    }
                    for resend in [false, true] {
                        steps.push(Step::Deliver {
                            node: n as u8,
                            acq: acq as u8,
                            kind,
                            reply,
                            resend,
                        });
                    }
                }
            }
        }
    }
    steps.push(Step::Tick);
    for n in 0..NODES as u8 {
        steps.extend([
            Step::Drift(n),
            Step::Crash(n),
            Step::Restart(n),
            Step::KeyExpires(n),
        ]);
    }
}

/// The state after `step`, `None` when the step is not enabled (or changes nothing), or the
/// invariant it breaks.
fn apply(model: &Model, s: &State, step: Step) -> Option<Result<State, Violation>> {
    let mut s = *s;
    match step {
        Step::Start(c) => {
            let c = c as usize;
            if s.clients[c].phase != Phase::Idle {
                return None;
            }
            let acq = acq_of(model, c, s.clients[c].attempt) as usize;
            s.after[acq] = s.usable_acqs;
            s.clients[c].phase = Phase::Round1;
            s.clients[c].floor = s.usable_max;
            for node in s.nodes.iter_mut() {
                node.pending[acq] |= ACQUIRE;
            }
        }
        Step::Deliver {
            node: n,
            acq,
            kind,
            reply,
            resend,
        } => {
            let n = n as usize;
            let node = &mut s.nodes[n];
            if node.down != 0 || node.pending[acq as usize] & kind == 0 {
                return None;
            }
            // Requests of one acquisition reach a node in the order sent (one connection): a
            // release delivered while the acquire is still pending means the acquire was lost.
            if kind == RELEASE {
                node.pending[acq as usize] &= !ACQUIRE;
            }
            if resend {
                if s.resends == 0 || kind == RELEASE {
                    return None;
                }
                s.resends -= 1;
            } else {
                node.pending[acq as usize] &= !kind;
            }
            let live = node.owner != 0 && node.clock < node.lease_end;
            let answer = match kind {
                ACQUIRE if live && node.owner == acq + 1 => Some(node.fence),
                ACQUIRE if live => None,
                ACQUIRE => {
                    if model.one_write_per_tick && node.written {
                        return None;
                    }
                    let t = (node.fence + 1).max(node.clock + 1);
                    node.fence = t;
                    node.owner = acq + 1;
                    node.lease_end = node.clock + model.ttl;
                    node.written = true;
                    Some(t)
                }
                COMMIT
                    if live
                        && node.owner == acq + 1
                        && !(model.commit_checks_fence
                            && node.fence > s.commit_token[acq as usize]) =>
                {
                    node.fence = node.fence.max(s.commit_token[acq as usize]);
                    node.written = true;
                    Some(1)
                }
                COMMIT => None,
                _ => {
                    if node.owner == acq + 1 {
                        node.owner = 0;
                    }
                    None
                }
            };
            if !reply && answer.is_none() {
                return None;
            }
            if let (true, Some(answer)) = (reply, answer) {
                let c = (acq / model.attempts) as usize;
                let client = s.clients[c];
                if client.attempt == acq % model.attempts {
                    match (kind, client.phase) {
                        (ACQUIRE, Phase::Round1) => s.nodes[n].grant[c] = answer,
                        (COMMIT, Phase::Round2) if s.nodes[n].acked & (1 << c) == 0 => {
                            s.nodes[n].acked |= 1 << c;
                            let acks = s.nodes.iter().filter(|x| x.acked & (1 << c) != 0).count();
                            if acks as u32 >= MAJORITY {
                                if let Err(v) = s.become_usable(model, c, client.token) {
                                    return Some(Err(v));
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        Step::EndRound1(c) => {
            let c = c as usize;
            if s.clients[c].phase != Phase::Round1 || s.grants(c) < MAJORITY {
                return None;
            }
            let token = s.nodes.iter().map(|n| n.grant[c]).max().unwrap();
            if model.commit_round {
                let acq = acq_of(model, c, s.clients[c].attempt) as usize;
                s.commit_token[acq] = token;
                for node in s.nodes.iter_mut() {
                    if node.grant[c] > 0 {
                        node.pending[acq] |= COMMIT;
                    }
                }
                s.clients[c].phase = Phase::Round2;
                s.clients[c].token = token;
            } else if let Err(v) = s.become_usable(model, c, token) {
                return Some(Err(v));
            }
        }
        Step::GiveUp(c) | Step::Release(c) => {
            let c = c as usize;
            let phase = s.clients[c].phase;
            let ok = match step {
                Step::GiveUp(_) => matches!(phase, Phase::Round1 | Phase::Round2),
                _ => phase == Phase::Holding,
            };
            if !ok {
                return None;
            }
            let acq = acq_of(model, c, s.clients[c].attempt) as usize;
            for node in s.nodes.iter_mut() {
                node.pending[acq] |= RELEASE;
            }
            s.finish_attempt(model, c);
        }
        Step::Write(c) => {
            let c = c as usize;
            let client = s.clients[c];
            if !model.store || client.phase != Phase::Holding || client.token < s.store_max {
                return None;
            }
            let acq = acq_of(model, c, client.attempt);
            for y in 0..MAX_ACQUISITIONS {
                if y as u8 != acq && s.store_writers & (1 << y) != 0 && s.after[y] & (1 << acq) != 0
                {
                    return Some(Err(Violation::StaleWrite {
                        token: client.token,
                        newer: s.store_max,
                    }));
                }
            }
            if s.store_max == client.token && s.store_writers & (1 << acq) != 0 {
                return None;
            }
            s.store_max = client.token;
            s.store_writers |= 1 << acq;
        }
        Step::Tick => {
            if s.now >= model.ticks {
                return None;
            }
            s.now += 1;
            for node in s.nodes.iter_mut() {
                node.clock += 1;
                node.written = false;
                if node.down > 1 {
                    node.down -= 1;
                }
            }
        }
        Step::Drift(n) => {
            if s.drift == 0 {
                return None;
            }
            s.drift -= 1;
            s.nodes[n as usize].clock += 1;
            let max = s.nodes.iter().map(|x| x.clock).max().unwrap();
            let min = s.nodes.iter().map(|x| x.clock).min().unwrap();
            if max - min > model.skew {
                return None;
            }
        }
        Step::Crash(n) => {
            let Restarts::Empty { delay, .. } = model.restarts else {
                return None;
            };
            let node = &mut s.nodes[n as usize];
            if s.crashes == 0 || node.down != 0 {
                return None;
            }
            s.crashes -= 1;
            // The lock's state is gone; requests on their way and answers already sent are not.
            *node = Node {
                clock: node.clock,
                written: node.written,
                down: if delay == 0 { 0 } else { delay + 1 },
                pending: node.pending,
                grant: node.grant,
                acked: node.acked,
                ..Node::default()
            };
        }
        Step::Restart(n) => {
            let node = &mut s.nodes[n as usize];
            if node.down != 1 {
                return None;
            }
            node.down = 0;
        }
        Step::KeyExpires(n) => {
            let node = &mut s.nodes[n as usize];
            // Normalized: owner 0 means no live lease, and the lease end is behind the clock.
            if node.down != 0 || node.owner != 0 || node.fence == 0 || node.clock < node.fence {
                return None;
            }
            node.fence = 0;
        }
    }
    s.normalize();
    Some(Ok(s))
}

/// One line describing `step` taken in `before` (for traces).
fn describe(model: &Model, before: &State, step: Step, after: Option<&State>) -> String {
    let acq_name = |c: u8| {
        name(
            model,
            acq_of(model, c as usize, before.clients[c as usize].attempt),
        )
    };
    match step {
        Step::Start(c) => format!(
            "{} starts: round 1 sent to A, B, C (highest usable token so far {})",
            acq_name(c),
            before.usable_max
        ),
        Step::Deliver {
            node: n,
            acq,
            kind,
            reply,
            resend,
        } => {
            let n = n as usize;
            let b = before.nodes[n];
            let a = after.map(|s| s.nodes[n]).unwrap_or(b);
            let who = name(model, acq);
            let mut line = match kind {
                ACQUIRE if a.owner == acq + 1 && b.owner != acq + 1 => format!(
                    "{} (clock {}, stored fence {}) grants {} token {}",
                    NAMES[n], b.clock, b.fence, who, a.fence
                ),
                ACQUIRE if b.owner == acq + 1 => {
                    format!("{} answers {} its fence {} again", NAMES[n], who, b.fence)
                }
                ACQUIRE => format!("{} refuses {} (held)", NAMES[n], who),
                COMMIT
                    if b.owner == acq + 1
                        && !(model.commit_checks_fence
                            && b.fence > before.commit_token[acq as usize]) =>
                {
                    format!(
                        "{} commits {}'s T={} (stored fence {} -> {})",
                        NAMES[n],
                        who,
                        before.commit_token[acq as usize],
                        b.fence,
                        b.fence.max(before.commit_token[acq as usize])
                    )
                }
                COMMIT => format!("{} refuses {}'s commit", NAMES[n], who),
                _ if b.owner == acq + 1 => {
                    format!("{} releases {} (fence {} kept)", NAMES[n], who, b.fence)
                }
                _ => format!("{} ignores {}'s release", NAMES[n], who),
            };
            if !reply {
                line.push_str(", reply lost");
            }
            if resend {
                line.push_str(" (resent: the request stays pending)");
            }
            let c = (acq / model.attempts) as usize;
            match after {
                Some(s)
                    if s.clients[c].phase == Phase::Holding
                        && before.clients[c].phase != Phase::Holding =>
                {
                    line.push_str(&format!(
                        "; majority acknowledged: {} may use T={}",
                        who, s.clients[c].token
                    ));
                }
                None => line.push_str(&format!(
                    "; majority acknowledged: {} may use T={}",
                    who, before.clients[c].token
                )),
                _ => {}
            }
            line
        }
        Step::EndRound1(c) => {
            let granted: Vec<String> = (0..NODES)
                .filter(|&n| before.nodes[n].grant[c as usize] > 0)
                .map(|n| format!("{}:{}", NAMES[n], before.nodes[n].grant[c as usize]))
                .collect();
            let t = before.nodes.iter().map(|n| n.grant[c as usize]).max();
            if model.commit_round {
                format!(
                    "{} has grants {}; T={}, commit sent to those nodes",
                    acq_name(c),
                    granted.join(" "),
                    t.unwrap()
                )
            } else {
                format!(
                    "{} has grants {}; uses T={} at once (no commit round)",
                    acq_name(c),
                    granted.join(" "),
                    t.unwrap()
                )
            }
        }
        Step::GiveUp(c) => format!("{} gives up, release sent to all", acq_name(c)),
        Step::Write(c) => format!(
            "{} writes to the store with token {} (store's highest {})",
            acq_name(c),
            before.clients[c as usize].token,
            before.store_max
        ),
        Step::Release(c) => format!("{} releases, release sent to all", acq_name(c)),
        Step::Tick => {
            let s = after.unwrap_or(before);
            format!(
                "tick: clocks A={} B={} C={}",
                s.nodes[0].clock, s.nodes[1].clock, s.nodes[2].clock
            )
        }
        Step::Drift(n) => format!("{}'s clock steps ahead alone", NAMES[n as usize]),
        Step::Crash(n) => match model.restarts {
            Restarts::Empty { delay, .. } if delay > 0 => format!(
                "{} crashes, state lost; may be back after {} tick(s)",
                NAMES[n as usize], delay
            ),
            _ => format!("{} restarts empty", NAMES[n as usize]),
        },
        Step::Restart(n) => format!("{} is back, empty", NAMES[n as usize]),
        Step::KeyExpires(n) => format!(
            "{}'s key expires (fence {} lost at clock {})",
            NAMES[n as usize], before.nodes[n as usize].fence, before.nodes[n as usize].clock
        ),
    }
}

enum Origin {
    Root(usize),
    From(u32, Step),
}

/// Breadth-first search over every state the model can reach (one per class of states equal
/// up to node and client names); stops at the first violation, which is then one of the
/// shortest, and returns its trace.
fn check(model: &Model) -> Outcome {
    assert!(model.clients <= MAX_CLIENTS);
    assert!(model.clients * model.attempts as usize <= MAX_ACQUISITIONS);
    let started = Instant::now();
    let mut roots = Vec::new();
    for &a in model.offsets {
        for &b in model.offsets {
            for &c in model.offsets {
                let (max, min) = (a.max(b).max(c), a.min(b).min(c));
                // Shifting every clock by the same amount changes nothing: the slowest starts at 0.
                if max - min <= model.skew && min == 0 {
                    roots.push(State::initial(model, [a, b, c]));
                }
            }
        }
    }
    let mut seen: HashSet<State> = HashSet::new();
    let mut origin: Vec<Origin> = Vec::new();
    // The states themselves (not their representatives), so that a trace replays as found.
    let mut queue: VecDeque<(State, u32, usize)> = VecDeque::new();
    for (i, root) in roots.iter().enumerate() {
        if seen.insert(root.canonical(model)) {
            queue.push_back((*root, origin.len() as u32, 0));
            origin.push(Origin::Root(i));
        }
    }
    let mut transitions = 0;
    let mut depth = 0;
    let mut most_usable = 0;
    let mut steps = Vec::new();
    while let Some((state, index, d)) = queue.pop_front() {
        depth = depth.max(d);
        most_usable = most_usable.max(state.usable_tokens.count_ones());
        candidates(model, &state, &mut steps);
        for &step in &steps {
            let Some(next) = apply(model, &state, step) else {
                continue;
            };
            transitions += 1;
            match next {
                Ok(next) => {
                    if seen.insert(next.canonical(model)) {
                        assert!(
                            seen.len() <= model.max_states,
                            "more than {} states: the bounds are too wide for CI",
                            model.max_states
                        );
                        queue.push_back((next, origin.len() as u32, d + 1));
                        origin.push(Origin::From(index, step));
                    }
                }
                Err(violation) => {
                    let trace = trace(model, &roots, &origin, index, step);
                    return Outcome {
                        states: seen.len(),
                        most_usable,
                        transitions,
                        depth,
                        millis: started.elapsed().as_millis(),
                        violation: Some((violation, trace)),
                    };
                }
            }
        }
    }
    Outcome {
        states: seen.len(),
        most_usable,
        transitions,
        depth,
        millis: started.elapsed().as_millis(),
        violation: None,
    }
}

/// The steps from a root to state `index`, then `last`, replayed and described.
fn trace(model: &Model, roots: &[State], origin: &[Origin], index: u32, last: Step) -> Vec<String> {
    let mut steps = vec![last];
    let mut at = index;
    let root = loop {
        match origin[at as usize] {
            Origin::Root(r) => break r,
            Origin::From(parent, step) => {
                steps.push(step);
                at = parent;
            }
        }
    };
    steps.reverse();
    let mut s = roots[root];
    let mut lines = vec![format!(
        "start: clocks A={} B={} C={}, no keys",
        s.nodes[0].clock, s.nodes[1].clock, s.nodes[2].clock
    )];
    for step in steps {
        match apply(model, &s, step).expect("a replayed step is enabled") {
            Ok(next) => {
                lines.push(describe(model, &s, step, Some(&next)));
                s = next;
            }
            Err(v) => lines.push(format!(
                "{} => VIOLATION {:?}",
                describe(model, &s, step, None),
                v
            )),
        }
    }
    lines
}

fn run(label: &str, model: &Model) -> Outcome {
    let out = check(model);
    println!(
        "{label}: {} states, {} transitions, depth {}, up to {} usable tokens, {} ms; {}",
        out.states,
        out.transitions,
        out.depth,
        out.most_usable,
        out.millis,
        match &out.violation {
            None => "no violation".to_owned(),
            Some((v, trace)) => format!("{v:?} after {} steps", trace.len() - 1),
        }
    );
    if let Some((_, trace)) = &out.violation {
        for (i, line) in trace.iter().enumerate() {
            println!("  {i:2}. {line}");
        }
    }
    out
}

#[test]
fn commit_round_keeps_tokens_monotonic() {
    let model = if wide() {
        // No resends here: see `a_resent_acquire_breaks_the_commit_unless_it_checks_the_fence`.
        Model {
            ttl: 2,
            ticks: 2,
            lost_replies: true,
            max_states: 100_000_000,
            ..PERSISTENT
        }
    } else {
        PERSISTENT
    };
    let out = run("commit round, persistent nodes", &model);
    assert!(out.violation.is_none());
    assert!(out.states > 10_000, "only {} states", out.states);
    assert!(out.most_usable >= 2, "runs never got two usable tokens");
}

#[test]
fn no_commit_round_loses_monotonicity() {
    // The A=5, B=0, C=0: a node whose clock is ahead answers a high token that the
    // majority's other node never learns.
    // One client acquiring twice, so that the shortest counterexample is this one and not one
    // of two clients overlapping after a lease ran out (see the next run).
    let model = Model {
        commit_round: false,
        clients: 1,
        attempts: 2,
        // No tick: every answer is read at one instant, so answers differ only through the
        // clocks' offsets.
        ticks: 0,
        ..PERSISTENT
    };
    let out = run("no commit round, sequential, one clock 3 ahead", &model);
    let (violation, trace) = out.violation.expect("a counterexample");
    assert!(
        matches!(violation, Violation::Regression { .. }),
        "{violation:?}"
    );
    assert!(trace.iter().any(|l| l.contains("uses T=4 at once")));
    // Two clients whose grants straddle a lease's end get the same token even with equal
    // clocks (in the model's coarse ticks: the two nodes answer within one clock unit).
    let model = Model {
        commit_round: false,
        offsets: &[0],
        skew: 0,
        ..PERSISTENT
    };
    let out = run("no commit round, two clients, equal clocks", &model);
    assert!(out.violation.is_some());
}

#[test]
fn usable_order_is_not_token_order_when_a_stale_client_commits_late() {
    // The stricter claim "tokens increase in the order they become usable" is false: a client
    // whose lease ran out on one node while its commit to another was under way can become
    // usable after a newer holder with a larger token. The fence still orders them (its token
    // is the lower one: storage rejects it after the newer holder wrote), which is what I1's
    // real-time form and I2 check.
    let model = Model {
        ttl: 2,
        ticks: 2,
        offsets: &[0],
        skew: 0,
        strict_usable_order: true,
        store: false,
        ..PERSISTENT
    };
    let out = run("commit round, strict usable order", &model);
    let (violation, _) = out.violation.expect("a counterexample");
    assert!(
        matches!(violation, Violation::OutOfOrder { .. }),
        "{violation:?}"
    );
}

#[test]
fn restart_empty_breaks_without_delay() {
    // Back one tick after the crash (a restart takes some time), one clock 1 ahead: the node
    // that lost the committed fence answers from its own, slower clock.
    let out = run(
        "commit round, empty restart after 1 tick, skew 1",
        &restarting(1, 1),
    );
    let (violation, _) = out.violation.expect("a counterexample");
    assert!(matches!(
        violation,
        Violation::Regression { .. } | Violation::Duplicate { .. }
    ));
}

#[test]
fn delayed_restart_keeps_monotonic_with_bounded_skew() {
    // Delay > skew: safe. Delay = skew: a counterexample under the same bounds (for skew 1
    // that is `restart_empty_breaks_without_delay`, so CI runs it once).
    let skews: &[u8] = if wide() { &[1, 2] } else { &[1] };
    for &skew in skews {
        let out = run(
            &format!(
                "commit round, empty restart after {} ticks, skew {skew}",
                skew + 1
            ),
            &restarting(skew + 1, skew),
        );
        assert!(out.violation.is_none());
        assert!(out.most_usable >= 2);
        if skew > 1 {
            let out = run(
                &format!("commit round, empty restart after {skew} ticks, skew {skew}"),
                &restarting(skew, skew),
            );
            assert!(out.violation.is_some());
        }
    }
}

#[test]
fn a_resent_acquire_breaks_the_commit_unless_it_checks_the_fence() {
    // A round-1 request executed twice (redis-rs resends a script after an I/O error), the
    // second time after the first grant's lease ended and another holder took and released
    // the node: the node grants the same owner again, higher, but the client keeps the first
    // answer, so its T can equal the other holder's while its commit there succeeds. Only the
    // client's validity check (timing) stands in the way; a commit that refuses when the
    // stored fence is above T closes it (the intersection argument then holds again: the
    // commit succeeds only on a node whose latest grant to this owner answered at most T).
    let model = Model {
        offsets: &[0],
        skew: 0,
        resends: 1,
        lost_replies: true,
        store: false,
        ..PERSISTENT
    };
    let out = run("commit round, a resent acquire", &model);
    let (violation, _) = out.violation.expect("a counterexample");
    assert!(
        matches!(violation, Violation::Duplicate { .. }),
        "{violation:?}"
    );
    // The fix this suggests, checked under the same bounds (270,456 states, too slow for a
    // debug build in CI, so only with QUORUM_MODEL_WIDE).
    if !wide() {
        return;
    }
    let out = run(
        "commit round refusing when the stored fence is above T, a resent acquire",
        &Model {
            commit_checks_fence: true,
            ..model
        },
    );
    assert!(out.violation.is_none());
}
