//! The mutex's queue (issue 25), natively: a busy caller's place (`hold_place`, acquire.lua's
//! busy path with mutex_queue.lua's `hold_place`, written by `keep_place`), an acquire of a free
//! lock with a queue (`acquire_free`: the walk of the arrival index, `Walk`, then `take`), and a
//! release's handoff to the head (`plan_handoff` then `Handoff::apply`, release.lua with
//! mutex_queue.lua's `head` and `hand_head` and fair.lua's `handed` and `wake`), with the
//! scripts' fields (`q:<owner>`, `g:<owner>`, `s:<seq>`, `qseq`, `qh`), replies, key expiry and
//! announcements, so a queue some of whose calls the scripts serve and some the module works as
//! one. The fair lock's commands (fair.rs) are built on the same pieces.
//!
//! A field the scripts would read differently (a number of 2^53 or more, which Lua reads as an
//! inexact double; a counter `HINCRBY` refuses; a place or index value that is not the
//! scripts' own) makes the call answer `-FALLBACK` before any write, for the script to serve.

use crate::epoch;
use crate::rules::{self, Expiry, Mode};
use crate::server::{Key, Reply};
use crate::state::{self, Buf, State};

/// The hash's field count from which a busy caller gets no place (acquire.lua).
const FULL: u64 = 400;

/// Index entries one walk reads at most (mutex_queue.lua's `head`).
const WALK: u64 = 64;

/// Sequence numbers from this on are written by the scripts' Lua in exponent form: left to them.
const MAX_SEQ: u64 = 100_000_000_000_000;

fn fallback(why: &str) -> Reply {
    Reply::Error(format!("FALLBACK {why}"))
}

/// A `(%d+)` capture as the scripts' `tonumber` reads it: exact below 2^53; `Err` from there on
/// (Lua's double is not exact: left to the scripts) and for more than 19 digits.
pub fn number(digits: &[u8]) -> Result<u64, Reply> {
    match state::parse_u64(digits) {
        Some(n) if n <= state::MAX_FENCE => Ok(n),
        Some(_) => Err(fallback("a queue number past 2^53")),
        None => Err(fallback("an unreadable queue number")),
    }
}

/// A field the scripts read with `tonumber(v) or default`: absent is `default`; anything but
/// plain digits below 2^53 is left to the scripts.
fn counter(key: &Key, field: &std::ffi::CStr, default: u64) -> Result<u64, Reply> {
    match key.hget(field) {
        None => Ok(default),
        Some(v) if !v.bytes().is_empty() && v.bytes().iter().all(u8::is_ascii_digit) => {
            number(v.bytes())
        }
        Some(_) => Err(fallback("an unreadable queue counter")),
    }
}

/// Splits `v` at single spaces into exactly `N` words (`None` otherwise).
fn words<const N: usize>(v: &[u8]) -> Option<[&[u8]; N]> {
    let mut out = [&v[..0]; N];
    let mut parts = v.split(|&b| b == b' ');
    for slot in &mut out {
        *slot = parts.next()?;
    }
    parts.next().is_none().then_some(out)
}

fn digits(w: &[u8]) -> bool {
    !w.is_empty() && w.iter().all(u8::is_ascii_digit)
}

/// A place's value as the scripts match it, `^(%d+) (%d+)$`: its seq and lease end, `Ok(None)`
/// when it does not match.
fn place_of(v: &[u8]) -> Result<Option<(u64, u64)>, Reply> {
    match words::<2>(v) {
        Some([seq, ends]) if digits(seq) && digits(ends) => Ok(Some((number(seq)?, number(ends)?))),
        _ => Ok(None),
    }
}

/// `prefix` then `name`: a queue field's name (`q:<owner>`, `g:<owner>`, `s:<seq>`).
pub fn field(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(prefix.len() + name.len());
    f.extend_from_slice(prefix);
    f.extend_from_slice(name);
    f
}

fn seq_field(seq: u64) -> Vec<u8> {
    let mut b = Buf::new();
    b.push(b"s:").push_u64(seq);
    b.bytes().to_vec()
}

/// acquire.lua's caller with a place lease (`args`: key, owner, TTL, floor, mode, place lease,
/// grace) on a lock another owner holds (`lock`, live): keeps the caller's place, its grant
/// arguments and, for a new place, its index entry (`hold_place`), marks the lock queued and
/// raises the key's expiry to cover the place and the lease; answers `{0, wait, 0, queued}`
/// (queued: 1 new place, 0 kept, -1 the hash is full: no place, nothing written).
pub fn hold_place(
    key: &Key,
    lock: &State,
    args: &[&[u8]],
    now_ms: u64,
    place: u64,
    grace: Option<u64>,
) -> Reply {
    let me = args[1];
    let wait = lock.lease.saturating_sub(now_ms) as i64;
    let mut seq = Buf::new();
    let new = match key.hget_field(&field(b"q:", me)) {
        Some(mine) => match leading_seq(mine.bytes()) {
            Some(digits) => {
                seq.push(digits);
                false
            }
            None => return fallback("an unreadable queue place"),
        },
        None => {
            if key.len() >= FULL {
                return Reply::Ints(vec![0, wait, 0, -1]);
            }
            match next_seq(key) {
                Ok(next) => seq.push_u64(next),
                Err(reply) => return reply,
            };
            true
        }
    };
    let place_args = [args[2], args[5], args[3], args[4]];
    let ends = now_ms + place;
    keep_place(
        key,
        lock,
        me,
        seq.bytes(),
        new,
        place_args,
        ends,
        lock.lease,
        grace,
    );
    Reply::Ints(vec![0, wait, 0, i64::from(new)])
}

/// acquire.lua on a free lock with a queue (`waiters` `q`; `args`: key, owner, TTL, floor,
/// mode, [place lease,] grace): the walk of the arrival index to the head; granted (`take`)
/// when the head is the caller or no live place is left in the walk; else busy until the head's
/// place lease ends, and a caller with a place lease keeps its place behind it.
#[allow(clippy::too_many_arguments)]
pub fn acquire_free(
    key: &Key,
    lock: &State,
    args: &[&[u8]],
    now_ms: u64,
    place: u64,
    ttl: u64,
    grace: Option<u64>,
    fence_of: impl FnOnce(u64) -> Result<rules::Fence, Reply>,
) -> Reply {
    let me = args[1];
    if lock.holds.is_some() {
        return fallback("leftover holds of a re-entered lock");
    }
    let walk = match Walk::read(key, now_ms) {
        Ok(walk) => walk,
        Err(reply) => return reply,
    };
    let other_head = walk
        .head
        .as_ref()
        .filter(|(who, _)| who != me)
        .map(|(_, ends)| *ends);
    let Some(head_end) = other_head else {
        let fence = fence_of(lock.fence);
        walk.apply(key);
        return match fence {
            Ok(f) => {
                take(key, &walk, me, f.fence, f.shift, now_ms + ttl, grace);
                Reply::Ints(vec![1, f.fence as i64, f.behind as i64])
            }
            Err(reply) => reply,
        };
    };
    let wait = (head_end - now_ms) as i64;
    if place == 0 {
        walk.apply(key);
        return Reply::Ints(vec![0, wait, 0]);
    }
    // What the place write reads, before the walk's writes (a place the walk deletes is gone).
    let place_field = field(b"q:", me);
    let mut seq = Buf::new();
    let mine = if walk.deletes(&place_field) {
        None
    } else {
        key.hget_field(&place_field)
    };
    let next = match &mine {
        Some(v) => match leading_seq(v.bytes()) {
            Some(digits) => {
                seq.push(digits);
                None
            }
            None => return fallback("an unreadable queue place"),
        },
        None => match next_seq(key) {
            Ok(next) => Some(next),
            Err(reply) => return reply,
        },
    };
    walk.apply(key);
    if let Some(next) = next {
        if key.len() >= FULL {
            return Reply::Ints(vec![0, wait, 0, -1]);
        }
        seq.push_u64(next);
    }
    let new = next.is_some();
    let place_args = [args[2], args[5], args[3], args[4]];
    keep_place(
        key,
        lock,
        me,
        seq.bytes(),
        new,
        place_args,
        now_ms + place,
        head_end,
        grace,
    );
    Reply::Ints(vec![0, wait, 0, i64::from(new)])
}

/// A place's seq as the scripts capture it, `^(%d+) ` (its digits verbatim); `None` when the
/// value does not start so.
pub fn leading_seq(place: &[u8]) -> Option<&[u8]> {
    let n = place.iter().take_while(|b| b.is_ascii_digit()).count();
    (n > 0 && place.get(n) == Some(&b' ')).then(|| &place[..n])
}

/// The seq a new place takes, `qseq` + 1 (the scripts' `hold_place`); a `qseq` that is not a
/// canonical integer (the scripts read it as Lua's `tonumber` does, a non-number as 0) or one
/// past 10^14 is left to the script.
pub fn next_seq(key: &Key) -> Result<u64, Reply> {
    match key.hget(c"qseq") {
        None => Ok(1),
        Some(v) => {
            let v = v.bytes();
            let canonical = digits(v) && (v.len() == 1 || v[0] != b'0');
            match state::parse_u64(v) {
                Some(n) if canonical && n + 1 < MAX_SEQ => Ok(n + 1),
                _ => Err(fallback("an unreadable queue counter")),
            }
        }
    }
}

/// mutex_queue.lua's `hold_place`: `me`'s place `q:<me>` = "<seq> <ends>" and its grant
/// arguments `g:<me>` = "<TTL> <place lease> <floor> <mode>" (`place_args`, verbatim), with
/// `qseq` and its index entry `s:<seq>` when the place is `new`, in one write; the state marked
/// `q`; the key's expiry raised to cover `ends` and `latest`.
#[allow(clippy::too_many_arguments)]
pub fn keep_place(
    key: &Key,
    lock: &State,
    me: &[u8],
    seq: &[u8],
    new: bool,
    place_args: [&[u8]; 4],
    ends: u64,
    latest: u64,
    grace: Option<u64>,
) {
    let mut value = Buf::new();
    value.push(seq).push(b" ").push_u64(ends);
    let mut grant_args = Buf::new();
    grant_args
        .push(place_args[0])
        .push(b" ")
        .push(place_args[1])
        .push(b" ")
        .push(place_args[2])
        .push(b" ")
        .push(place_args[3]);
    let (place_field, grant_field) = (field(b"q:", me), field(b"g:", me));
    if new {
        let index = field(b"s:", seq);
        key.hset_fields(&[
            (b"qseq", seq),
            (&place_field, value.bytes()),
            (&grant_field, grant_args.bytes()),
            (&index, me),
        ]);
    } else {
        key.hset_fields(&[
            (&place_field, value.bytes()),
            (&grant_field, grant_args.bytes()),
        ]);
    }
    if lock.waiters != Some(b"q") {
        key.set_until(lock.with_waiters(Some(b"q")).bytes());
    }
    key.apply(match grace {
        None => Expiry::Persist,
        Some(g) => Expiry::RaiseTo(latest.max(ends) + g),
    });
}

/// mutex_queue.lua's `take`: the free lock granted to `me` with `fence` (the fence rule's
/// `shift`) and a lease to `ends`, by an acquire whose walk found `me` the head (its place,
/// arguments and index entry go, `qh` moves past it) or found no live place (`me`'s place and
/// arguments go, if any); the state marked `q` while entries remain, and the key's expiry
/// raised to cover the grant then (`raise`), else set by keep.lua's rule.
pub fn take(
    key: &Key,
    walk: &Walk,
    me: &[u8],
    fence: u64,
    shift: Option<u64>,
    ends: u64,
    grace: Option<u64>,
) {
    let (mut e, mut f, mut value) = (Buf::new(), Buf::new(), Buf::new());
    e.push_u64(ends);
    f.push_u64(fence);
    let (place_field, grant_field) = (field(b"q:", me), field(b"g:", me));
    let mark: Option<&[u8]> = match walk.head {
        Some(_) => (walk.stop < walk.last).then_some(b"q"),
        None => walk.pending().then_some(b"q"),
    };
    state::format(&mut value, e.bytes(), f.bytes(), me, None, mark);
    if walk.head.is_some() {
        key.hdel_fields(&[place_field, grant_field, seq_field(walk.stop)]);
        let mut qh = Buf::new();
        qh.push_u64(walk.stop + 1);
        key.hset_fields(&[(b"until", value.bytes()), (b"qh", qh.bytes())]);
    } else {
        key.hdel_fields(&[place_field, grant_field]);
        key.set_until(value.bytes());
    }
    let Some(grace) = grace else {
        return key.apply(Expiry::Persist);
    };
    let fence_ms = |shift: u64| fence.saturating_sub(shift).div_ceil(1000);
    key.apply(match mark {
        Some(_) => Expiry::RaiseTo(ends.max(shift.map_or(0, fence_ms)) + grace),
        None => rules::keep_expiry(shift, fence, ends, Some(grace)),
    });
}

/// mutex_queue.lua's `head()` walk of the arrival index, decided by reads only: where it
/// started and stopped (the head's seq, or the first entry not walked), `qseq`, the index
/// entries (and places) it found gone, and the head: its owner and place lease end.
pub struct Walk {
    start: u64,
    /// Where the walk stopped: the head's seq, or the first entry it did not read.
    pub stop: u64,
    /// `qseq`, the last seq handed out.
    pub last: u64,
    dead: Vec<Vec<u8>>,
    /// The head: the live place with the lowest seq the walk reached.
    pub head: Option<(Vec<u8>, u64)>,
}

impl Walk {
    /// Walks from `qh` (at most [`WALK`] entries) to the first live place.
    pub fn read(key: &Key, now_ms: u64) -> Result<Walk, Reply> {
        let start = counter(key, c"qh", 1)?;
        let last = counter(key, c"qseq", 0)?;
        if last >= MAX_SEQ || start >= MAX_SEQ {
            return Err(fallback("a queue sequence past 10^14"));
        }
        let (mut h, mut dead, mut head) = (start, Vec::new(), None);
        while h <= last && h < start + WALK {
            let entry = seq_field(h);
            if let Some(who) = key.hget_field(&entry) {
                let who = who.bytes().to_vec();
                let place = match key.hget_field(&field(b"q:", &who)) {
                    Some(p) => place_of(p.bytes())?,
                    None => None,
                };
                match place {
                    Some((seq, ends)) if seq == h && ends > now_ms => {
                        head = Some((who, ends));
                        break;
                    }
                    Some((seq, _)) if seq == h => {
                        dead.push(entry);
                        dead.push(field(b"q:", &who));
                        dead.push(field(b"g:", &who));
                    }
                    _ => dead.push(entry),
                }
            }
            h += 1;
        }
        Ok(Walk {
            start,
            stop: h,
            last,
            dead,
            head,
        })
    }

    /// `qh` and `qseq` read as [`read`](Self::read) reads them, without walking (a busy call on
    /// a held lock whose index one walk covers, fair_acquire.lua: the holder's release walks):
    /// stopped at `qh`, no head, nothing to delete.
    pub fn unwalked(key: &Key) -> Result<Walk, Reply> {
        let start = counter(key, c"qh", 1)?;
        let last = counter(key, c"qseq", 0)?;
        if last >= MAX_SEQ || start >= MAX_SEQ {
            return Err(fallback("a queue sequence past 10^14"));
        }
        Ok(Walk {
            start,
            stop: start,
            last,
            dead: Vec::new(),
            head: None,
        })
    }

    /// True when the index spans more than one walk's [`WALK`] entries from where this one
    /// started (`qseq - qh >= 64`): a walk from there might stop short of the head.
    pub fn spans_past_a_walk(&self) -> bool {
        self.last.saturating_sub(self.start) >= WALK
    }

    /// True when entries remain at or after where the walk stopped.
    pub fn pending(&self) -> bool {
        self.stop <= self.last
    }

    /// True when the walk deleted `field` (a place it found gone).
    pub fn deletes(&self, field: &[u8]) -> bool {
        self.dead.iter().any(|f| f == field)
    }

    /// The walk's writes: the entries and places found gone deleted, `qh` moved to where it
    /// stopped.
    pub fn apply(&self, key: &Key) {
        if !self.dead.is_empty() {
            key.hdel_fields(&self.dead);
        }
        if self.stop != self.start {
            let mut qh = Buf::new();
            qh.push_u64(self.stop);
            key.hset_fields(&[(b"qh", qh.bytes())]);
        }
    }
}

/// What a release's handoff will do, decided by reads only (so that a case left to the script
/// is declined before the release writes anything).
pub struct Handoff {
    walk: Walk,
    head: Head,
}

enum Head {
    /// No live place found in the walk.
    None,
    /// A head that is only woken (a stale place, no grant arguments, no fence).
    Wake(Vec<u8>),
    /// A grant to the head, announced with its fence.
    Grant {
        who: Vec<u8>,
        seq: u64,
        ends: u64,
        fence: u64,
        behind: u64,
        ttl: u64,
        shift: Option<u64>,
    },
}

/// Reads what `hand_head` (mutex_queue.lua) reads on a lock freed with fence `stored`: the
/// walk of the arrival index, the head's grant arguments and the next fence by them (fair.lua's
/// `handed`).
pub fn plan_handoff(
    key: &Key,
    ctx: *mut redis_module::raw::RedisModuleCtx,
    stored: u64,
    now_ms: u64,
    now_us: u64,
) -> Result<Handoff, Reply> {
    let mut walk = Walk::read(key, now_ms)?;
    let head = match walk.head.take() {
        None => Head::None,
        Some((who, head_end)) => {
            grant_to(key, ctx, who, walk.stop, head_end, stored, now_ms, now_us)?
        }
    };
    Ok(Handoff { walk, head })
}

/// fair.lua's `handed` up to its writes: a grant when the head's arguments are there and its
/// place is fresh (at least two thirds of its lease left) and the fence rule gives a fence;
/// else the head is only woken.
#[allow(clippy::too_many_arguments)]
fn grant_to(
    key: &Key,
    ctx: *mut redis_module::raw::RedisModuleCtx,
    who: Vec<u8>,
    seq: u64,
    head_end: u64,
    stored: u64,
    now_ms: u64,
    now_us: u64,
) -> Result<Head, Reply> {
    let Some(args) = key.hget_field(&field(b"g:", &who)) else {
        return Ok(Head::Wake(who));
    };
    // '^(%d+) (%d+) (%d+) (%S+)$'
    let Some([ttl, place, floor, mode]) = words::<4>(args.bytes()) else {
        return Ok(Head::Wake(who));
    };
    if !(digits(ttl) && digits(place) && digits(floor))
        || mode.is_empty()
        || mode
            .iter()
            .any(|&b| matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r'))
    {
        return Ok(Head::Wake(who));
    }
    let (ttl, place, floor) = (number(ttl)?, number(place)?, number(floor)?);
    if ttl == 0 || place == 0 || (head_end - now_ms).saturating_mul(3) < place.saturating_mul(2) {
        return Ok(Head::Wake(who));
    }
    // fence.lua: a mode it does not name counts on (as `counter`).
    let mode = rules::parse_mode(mode).unwrap_or(Mode::Counter);
    let epoch = if mode.reads_epoch() {
        match epoch::my_epoch(ctx) {
            // Any refusal leaves the grant to the head undone (fair.lua's `handed` wakes it).
            Some(_)
                if stored == 0
                    && epoch::check_slot(ctx, key.name_bytes()) != epoch::SlotCheck::Stable =>
            {
                return Ok(Head::Wake(who))
            }
            Some(e) => e,
            None => return Ok(Head::Wake(who)),
        }
    } else {
        0
    };
    match rules::next_fence(stored, floor, mode, now_us, epoch) {
        Ok(f) => Ok(Head::Grant {
            who,
            seq,
            ends: now_ms + ttl,
            fence: f.fence,
            behind: f.behind,
            ttl,
            shift: f.shift,
        }),
        Err(_) => Ok(Head::Wake(who)),
    }
}

impl Handoff {
    /// `hand_head`'s writes, after the release freed the lock (its state `0 <fence> `): the
    /// walk's deletions and `qh`, then the grant to the head (its place, arguments and index
    /// entry gone, the state its, marked `q` while entries remain, announced on its client's
    /// channel `<key>:w:<first 8 bytes of its owner>` as "<owner> <fence> <behind> <TTL>", the
    /// key's expiry raised to cover it), or the head woken (an empty message) and the free lock
    /// marked `q`, or, with no head, the mark kept while entries or unindexed places may wait.
    /// `announce` is the release's (`s`, `p` or empty: none). True when a head was found (the
    /// release then answers without its own announcement).
    pub fn apply(self, key: &Key, fence_raw: &[u8], announce: &[u8], grace: Option<u64>) -> bool {
        self.walk.apply(key);
        let queued =
            || state::format(&mut Buf::new(), b"0", fence_raw, b"", None, Some(b"q")).to_vec();
        match self.head {
            Head::None => {
                if self.walk.pending() || key.len() > 3 {
                    key.set_until(&queued());
                }
                false
            }
            Head::Wake(who) => {
                wake(key, &who, announce, None);
                key.set_until(&queued());
                true
            }
            Head::Grant {
                who,
                seq,
                ends,
                fence,
                behind,
                ttl,
                shift,
            } => {
                key.hdel_fields(&[field(b"q:", &who), field(b"g:", &who), seq_field(seq)]);
                let mark: Option<&[u8]> = (seq < self.walk.last).then_some(b"q");
                let (mut e, mut f) = (Buf::new(), Buf::new());
                e.push_u64(ends);
                f.push_u64(fence);
                let mut value = Buf::new();
                state::format(&mut value, e.bytes(), f.bytes(), &who, None, mark);
                let mut qh = Buf::new();
                qh.push_u64(seq + 1);
                key.hset_fields(&[(b"until", value.bytes()), (b"qh", qh.bytes())]);
                let mut message = Buf::new();
                message
                    .push_u64(fence)
                    .push(b" ")
                    .push_u64(behind)
                    .push(b" ")
                    .push_u64(ttl);
                wake(key, &who, announce, Some(message.bytes()));
                // raise.lua after a grant: the fence read as server ms counts (clock modes).
                let fence_ms = shift.map_or(0, |s| fence.saturating_sub(s).div_ceil(1000));
                key.apply(match grace {
                    None => Expiry::Persist,
                    Some(g) => Expiry::RaiseTo(ends.max(fence_ms) + g),
                });
                true
            }
        }
    }
}

/// fair.lua's `wake`: announces on `who`'s client's channel, `<key>:w:<who's first 8 bytes>`,
/// an empty message or "<who> <message>"; `announce` `s` SPUBLISH, `p` PUBLISH, else nothing.
fn wake(key: &Key, who: &[u8], announce: &[u8], message: Option<&[u8]>) {
    let shard = match announce {
        b"s" => true,
        b"p" => false,
        _ => return,
    };
    let mut channel = Buf::new();
    channel
        .push(key.name_bytes())
        .push(b":w:")
        .push(&who[..who.len().min(8)]);
    let mut text = Buf::new();
    if let Some(m) = message {
        text.push(who).push(b" ").push(m);
    }
    key.publish_to(channel.bytes(), text.bytes(), shard);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_at_single_spaces() {
        assert_eq!(words::<2>(b"12 34"), Some([&b"12"[..], b"34"]));
        assert_eq!(words::<2>(b"12 34 5"), None);
        assert_eq!(words::<2>(b"12"), None);
        assert_eq!(words::<2>(b"12  34"), None);
        assert_eq!(
            words::<4>(b"30000 600000 0 clock"),
            Some([&b"30000"[..], b"600000", b"0", b"clock"])
        );
    }

    #[test]
    fn places_match_as_the_scripts_do() {
        assert!(matches!(
            place_of(b"7 1764000000000"),
            Ok(Some((7, 1_764_000_000_000)))
        ));
        assert!(matches!(place_of(b"7 x"), Ok(None)));
        assert!(matches!(place_of(b"7"), Ok(None)));
        assert!(matches!(place_of(b"7 1764000000000 1"), Ok(None)));
        // 16 digits below 2^53 read exactly (a clock fence as a floor); 2^53 and above are left
        // to the script, whose double is not exact.
        assert!(matches!(
            place_of(b"7 1764000000000000"),
            Ok(Some((7, 1_764_000_000_000_000)))
        ));
        assert!(place_of(b"7 9007199254740992").is_err());
    }
}
