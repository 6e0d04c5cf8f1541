//! The lock's state in key layout 2 (docs/design.md, "Key layout"; src/script/lua/prologue.lua):
//! the hash field `until` holds `<lease end ms> <fence> <owner>` followed by ` h<holds>` when the
//! lock is re-entered and ` w<waiters>` when an acquire found it busy since it was last freed
//! (`0 <fence> ` for a free lock). Parsing and formatting only, no server calls.

/// The largest fence a lock hands out: 2^53 - 1 (clients read fences as exact doubles too).
pub const MAX_FENCE: u64 = (1 << 53) - 1;

/// One parsed `until` value; the byte slices borrow from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State<'a> {
    /// The lease end in ms as stored (its digits, written back verbatim as the scripts do).
    pub lease_raw: &'a [u8],
    /// The lease end in ms (0: none).
    pub lease: u64,
    /// The last fence granted as stored (its digits).
    pub fence_raw: &'a [u8],
    /// The last fence granted (0: none yet).
    pub fence: u64,
    /// The owner token (empty for a free lock).
    pub owner: &'a [u8],
    /// A re-entered lock's hold count (` h<n>`), as its digits.
    pub holds: Option<&'a [u8]>,
    /// The waiters mark (` w<x>`): a client tag, `*`, `q` (a queue) or `y<tag>` (a yield).
    pub waiters: Option<&'a [u8]>,
    /// Everything after the owner token, verbatim (the marks: ` h<holds>`, ` w<waiters>`).
    pub marks: &'a [u8],
}

/// Lua's `%s` class: the bytes `%S` does not match.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Parses a run of ASCII digits as u64 (None when empty, not digits or past u64).
pub fn parse_u64(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

/// Below this, a hold count is written by the scripts' Lua (`%.14g`) as its plain digits: the
/// module leaves larger counts to the scripts.
pub const MAX_COUNT: u64 = 100_000_000_000_000;

/// A re-entered lock's hold count (` h<n>`) as a number the module can count on and write as the
/// scripts would (below 10^14); None for anything else.
pub fn parse_count(digits: &[u8]) -> Option<u64> {
    parse_u64(digits).filter(|&n| n < MAX_COUNT)
}

/// The number the leading digits of `bytes` spell and how many there are, in one pass: as
/// `parse_u64` of that run (None when there is none, or past 19 digits or u64).
fn leading_u64(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut n: u64 = 0;
    let mut len = 0;
    for &b in bytes {
        if !b.is_ascii_digit() {
            break;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
        len += 1;
    }
    (1..=19).contains(&len).then_some((n, len))
}

/// The first ` <tag><run>` in `marks` whose run matches `ok` (at least one byte), as Lua's
/// `string.match(marks, ' h(%d+)')` and `' w(%S+)'` find it.
fn find_mark(marks: &[u8], tag: u8, ok: fn(u8) -> bool) -> Option<&[u8]> {
    let mut i = 0;
    while i + 2 < marks.len() + 1 {
        if marks[i] == b' ' && marks.get(i + 1) == Some(&tag) {
            let start = i + 2;
            let len = marks[start..].iter().take_while(|&&b| ok(b)).count();
            if len > 0 {
                return Some(&marks[start..start + len]);
            }
        }
        i += 1;
    }
    None
}

impl<'a> State<'a> {
    /// Parses an `until` value of layout 2 as the prologue's pattern
    /// `^(%d+) (%d+) (%S*)(.*)$` does; None for anything else (a layout-1 key's `until`, or
    /// numbers past u64, which the module leaves to the scripts).
    pub fn parse(value: &'a [u8]) -> Option<Self> {
        let (lease, d1) = leading_u64(value)?;
        let lease_raw = &value[..d1];
        let rest = value[d1..].strip_prefix(b" ")?;
        let (fence, d2) = leading_u64(rest)?;
        let fence_raw = &rest[..d2];
        let rest = rest[d2..].strip_prefix(b" ")?;
        let o = rest.iter().take_while(|&&b| !is_space(b)).count();
        let (owner, marks) = rest.split_at(o);
        let (holds, waiters) = if marks.is_empty() {
            (None, None)
        } else {
            (
                find_mark(marks, b'h', |b| b.is_ascii_digit()),
                find_mark(marks, b'w', |b| !is_space(b)),
            )
        };
        Some(State {
            lease_raw,
            lease,
            fence_raw,
            fence,
            owner,
            holds,
            waiters,
            marks,
        })
    }

    /// Whether Lua's pattern `^(%d+) (%d+) (%S*)(.*)$` matches `value` (digits, a space,
    /// digits, a space): true also where [`parse`](Self::parse) is not, for numbers past u64.
    pub fn lua_matches(value: &[u8]) -> bool {
        let digits = |b: &[u8]| b.iter().take_while(|c| c.is_ascii_digit()).count();
        let d1 = digits(value);
        if d1 == 0 || value.get(d1) != Some(&b' ') {
            return false;
        }
        let rest = &value[d1 + 1..];
        let d2 = digits(rest);
        d2 > 0 && rest.get(d2) == Some(&b' ')
    }

    /// The state of a lock never granted (no key, or a hash without `until`).
    pub fn free() -> State<'a> {
        State {
            lease_raw: b"0",
            lease: 0,
            fence_raw: b"0",
            fence: 0,
            owner: b"",
            holds: None,
            waiters: None,
            marks: b"",
        }
    }

    /// Whether the module reads this state as the scripts' Lua does: its lease end and fence
    /// are at most 2^53 - 1. Lua reads them as doubles, exact up to there; past it (digits a
    /// client never writes: the module and the scripts never store such a lease or fence) the
    /// scripts' answers are their own (`tonumber` rounds, `%d` wraps a number past 2^63, a lease
    /// left comes out of Lua's integer conversion), so every command leaves such a state to them
    /// (`-FALLBACK`, before any write).
    pub fn exact(&self) -> bool {
        self.lease <= MAX_FENCE && self.fence <= MAX_FENCE
    }

    /// The prologue's `live`: an owner holds an unexpired lease.
    pub fn live(&self, now_ms: u64) -> bool {
        !self.owner.is_empty() && self.lease > now_ms
    }

    /// This state's value with its lease end moved to `ends` (the rest verbatim).
    pub fn with_lease(&self, ends: u64) -> Buf {
        let mut lease = Buf::new();
        lease.push_u64(ends);
        let mut value = Buf::new();
        format(
            &mut value,
            lease.bytes(),
            self.fence_raw,
            self.owner,
            self.holds,
            self.waiters,
        );
        value
    }

    /// This state's value with the waiters mark `mark` (the rest verbatim).
    pub fn with_waiters(&self, mark: Option<&[u8]>) -> Buf {
        let mut value = Buf::new();
        format(
            &mut value,
            self.lease_raw,
            self.fence_raw,
            self.owner,
            self.holds,
            mark,
        );
        value
    }
}

/// A small byte buffer on the stack that moves to the heap past 160 bytes (a state value with
/// an owner token of the usual 32 characters needs about 70): the hot path allocates nothing.
pub struct Buf {
    stack: [u8; 160],
    len: usize,
    heap: Option<Vec<u8>>,
}

impl Buf {
    /// An empty buffer.
    pub fn new() -> Buf {
        Buf {
            stack: [0; 160],
            len: 0,
            heap: None,
        }
    }

    /// Appends `data`.
    pub fn push(&mut self, data: &[u8]) -> &mut Buf {
        if let Some(heap) = &mut self.heap {
            heap.extend_from_slice(data);
        } else if self.len + data.len() <= self.stack.len() {
            self.stack[self.len..self.len + data.len()].copy_from_slice(data);
            self.len += data.len();
        } else {
            let mut heap = Vec::with_capacity(self.len + data.len() + 32);
            heap.extend_from_slice(&self.stack[..self.len]);
            heap.extend_from_slice(data);
            self.heap = Some(heap);
        }
        self
    }

    /// Appends the decimal digits of `n` (two at a time: a lease end has 13, a clock fence 16).
    pub fn push_u64(&mut self, n: u64) -> &mut Buf {
        const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819\
            2021222324252627282930313233343536373839\
            4041424344454647484950515253545556575859\
            6061626364656667686970717273747576777879\
            8081828384858687888990919293949596979899";
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut n = n;
        while n >= 100 {
            let d = (n % 100) as usize * 2;
            n /= 100;
            i -= 2;
            digits[i..i + 2].copy_from_slice(&PAIRS[d..d + 2]);
        }
        if n >= 10 {
            let d = n as usize * 2;
            i -= 2;
            digits[i..i + 2].copy_from_slice(&PAIRS[d..d + 2]);
        } else {
            i -= 1;
            digits[i] = b'0' + n as u8;
        }
        self.push(&digits[i..])
    }

    /// The bytes so far.
    pub fn bytes(&self) -> &[u8] {
        match &self.heap {
            Some(heap) => heap,
            None => &self.stack[..self.len],
        }
    }
}

/// Appends a state to `out`: "<lease> <fence> <owner>[ h<holds>][ w<waiters>]" (keep.lua's
/// `store`), the lease end and fence as digits.
pub fn format<'b>(
    out: &'b mut Buf,
    lease: &[u8],
    fence: &[u8],
    owner: &[u8],
    holds: Option<&[u8]>,
    waiters: Option<&[u8]>,
) -> &'b [u8] {
    out.push(lease)
        .push(b" ")
        .push(fence)
        .push(b" ")
        .push(owner);
    if let Some(h) = holds {
        out.push(b" h").push(h);
    }
    if let Some(w) = waiters {
        out.push(b" w").push(w);
    }
    out.bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_layout() {
        let s = State::parse(b"1700000000000 42 abcdef h3 w*").unwrap();
        assert_eq!(
            (s.lease, s.fence, s.owner),
            (1_700_000_000_000, 42, &b"abcdef"[..])
        );
        assert_eq!((s.holds, s.waiters), (Some(&b"3"[..]), Some(&b"*"[..])));
        let free = State::parse(b"0 7 ").unwrap();
        assert_eq!(
            (free.lease, free.fence, free.owner, free.waiters),
            (0, 7, &b""[..], None)
        );
        let queued = State::parse(b"0 7  wq").unwrap();
        assert_eq!((queued.owner, queued.waiters), (&b""[..], Some(&b"q"[..])));
        assert!(State::parse(b"1700000000000").is_none());
        assert!(State::parse(b"x 1 a").is_none());
        assert!(State::parse(b"99999999999999999999 1 a").is_none());
        assert!(!free.live(1));
        assert!(State::parse(b"10 1 a").unwrap().live(9));
        assert!(!State::parse(b"10 1 a").unwrap().live(10));
    }

    #[test]
    fn numbers_past_2_53_are_not_the_modules() {
        let exact = |v: &[u8]| State::parse(v).unwrap().exact();
        assert!(exact(b"9007199254740991 9007199254740991 a h3"));
        assert!(exact(b"0 9007199254740991 "));
        // The review's states: a lease end past 2^63 (a re-entered lock's lease, kept by extend
        // and reenter, made the key's expiry negative) and a fence of 19 digits (a reply of
        // `fence as i64` went negative).
        assert!(!exact(b"9300000000000000000 5 own"));
        assert!(!exact(b"9300000000000000000 5 own h3"));
        assert!(!exact(b"9999999999999 9999999999999999999 own"));
        assert!(!exact(b"9007199254740992 5 own"));
        assert!(!exact(b"1700000000000 9007199254740992 own"));
        assert!(!exact(b"0 9999999999999999999 "));
    }

    #[test]
    fn formats_as_store() {
        assert_eq!(
            format(&mut Buf::new(), b"5", b"6", b"o", None, Some(b"*")),
            b"5 6 o w*"
        );
        assert_eq!(
            format(&mut Buf::new(), b"0", b"6", b"", None, None),
            b"0 6 "
        );
        let mut b = Buf::new();
        b.push_u64(0).push_u64(9_007_199_254_740_991);
        assert_eq!(b.bytes(), b"09007199254740991");
        for n in [
            1,
            9,
            10,
            99,
            100,
            101,
            999,
            1000,
            1_795_730_058_739,
            u64::MAX,
        ] {
            let mut b = Buf::new();
            b.push_u64(n);
            assert_eq!(b.bytes(), n.to_string().as_bytes());
        }
        let long = vec![b'x'; 300];
        let mut b = Buf::new();
        assert_eq!(
            format(&mut b, b"1", b"2", &long, Some(b"3"), None).len(),
            4 + 300 + 3
        );
        assert!(b.bytes().starts_with(b"1 2 xxx") && b.bytes().ends_with(b"x h3"));
    }
}
