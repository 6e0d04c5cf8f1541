//! The scripts' rules as pure functions: argument validation, the fence rule (fence.lua, every
//! mode) and the key-expiry rule of a grant (grant_expiry.lua, as acquire.lua inlines it).

/// The fence modes (fence.lua).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The fence is above TIME in µs.
    Clock,
    /// A plain counter.
    Counter,
    /// The fence is above `cluster_my_epoch` × 2^32.
    Epoch,
    /// The fence is above TIME in µs + `cluster_my_epoch` × 2^34 (the client's epoch-clock).
    Hybrid,
}

impl Mode {
    /// True for the modes whose rule reads the config epoch.
    pub fn reads_epoch(self) -> bool {
        matches!(self, Mode::Epoch | Mode::Hybrid)
    }
}

/// The scripts' error when the config epoch cannot be read (a server without cluster support).
pub const EPOCH_UNREADABLE: &str =
    "ERR fencelock: epoch fence mode cannot read cluster_my_epoch from CLUSTER INFO";

/// The most bytes of an argument an error reply echoes.
pub const ECHO_MAX: usize = 64;

/// The reply to a call on a lock state whose lease end or fence is past 2^53 - 1 (another
/// program's numbers): the scripts judge it, as they would alone.
pub const PAST_2_53: &str = "FALLBACK a lease end or fence past 2^53 - 1";

/// An argument (or key name) as an error reply quotes it: its first characters, at most
/// [`ECHO_MAX`] bytes of them (bytes that are not UTF-8 shown as U+FFFD, a character that
/// would not fit whole left out), and "…" when that is not all of it. A reply never grows
/// with its argument (a 20 MB mode argument was echoed whole).
pub fn quote(arg: &[u8]) -> String {
    // A few bytes more than fit: a character cut at the end of them does not fit either.
    let head = &arg[..arg.len().min(ECHO_MAX + 3)];
    let mut text = String::with_capacity(ECHO_MAX + 3);
    let mut cut = head.len() < arg.len();
    for c in String::from_utf8_lossy(head).chars() {
        if text.len() + c.len_utf8() > ECHO_MAX {
            cut = true;
            break;
        }
        text.push(c);
    }
    if cut {
        text.push('…');
    }
    text
}

/// Parses a mode argument (Err: unknown).
pub fn parse_mode(arg: &[u8]) -> Result<Mode, String> {
    match arg {
        b"clock" => Ok(Mode::Clock),
        b"counter" => Ok(Mode::Counter),
        b"epoch" => Ok(Mode::Epoch),
        b"hybrid" => Ok(Mode::Hybrid),
        _ => Err(format!(
            "ERR fencelock: unknown fence mode '{}' (clock, counter, epoch, hybrid)",
            quote(arg)
        )),
    }
}

/// Parses a decimal argument in `0..=max`, naming it in the error.
pub fn parse_num(arg: &[u8], name: &str, max: u64) -> Result<u64, String> {
    match crate::state::parse_u64(arg) {
        Some(n) if n <= max => Ok(n),
        _ => Err(format!(
            "ERR fencelock: {name} must be a whole number from 0 to {max}"
        )),
    }
}

/// Parses the expiry grace: empty for none (the key is kept for good), else ms.
pub fn parse_grace(arg: &[u8]) -> Result<Option<u64>, String> {
    if arg.is_empty() {
        Ok(None)
    } else {
        parse_num(arg, "the expiry grace", 1 << 40).map(Some)
    }
}

/// Checks an owner token: non-empty, no whitespace (the packed state separates by spaces).
pub fn check_owner(arg: &[u8]) -> Result<(), String> {
    if arg.is_empty()
        || arg
            .iter()
            .any(|&b| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r'))
    {
        return Err(
            "ERR fencelock: the owner token must be non-empty and without whitespace".into(),
        );
    }
    Ok(())
}

/// A grant's fence from the fence rule.
#[derive(Debug, PartialEq, Eq)]
pub struct Fence {
    /// The fence.
    pub fence: u64,
    /// µs the stored fence was ahead of the clock term (modes `clock` and `hybrid`), else 0.
    pub behind: u64,
    /// fence.lua's `memo.shift`: what to take off the fence to read it as server µs (0 in clock
    /// mode, epoch × 2^34 in hybrid mode), None in modes `counter` and `epoch`.
    pub shift: Option<u64>,
}

/// fence.lua's refusal of a grant with no stored fence in a slot that migrates (the key quoted
/// as `quote` cuts it; the script's names it whole).
pub fn migrating(key: &[u8]) -> String {
    format!(
        "TRYAGAIN fencelock: the slot of {} is migrating and its last fence may be on the other \
         node: try again when the migration ends",
        quote(key)
    )
}

/// The fence rule (fence.lua): the next fence above `stored` and `floor`, TIME µs in clock mode,
/// `epoch` × 2^32 in epoch mode, TIME µs + `epoch` × 2^34 in hybrid mode (`epoch` is only read
/// in those two), or the scripts' error text when the epoch is too large for epoch mode or the
/// fence would pass 2^53 - 1.
pub fn next_fence(
    stored: u64,
    floor: u64,
    mode: Mode,
    now_us: u64,
    epoch: u64,
) -> Result<Fence, String> {
    let mut floor = floor;
    let mut behind = 0;
    let mut shift = None;
    match mode {
        Mode::Counter => {}
        Mode::Clock | Mode::Hybrid => {
            let s = if mode == Mode::Hybrid {
                epoch.saturating_mul(1 << 34)
            } else {
                0
            };
            shift = Some(s);
            let clock = now_us.saturating_add(s);
            floor = floor.max(clock);
            if stored > clock {
                behind = stored - clock;
            }
        }
        Mode::Epoch => {
            if epoch >= 1 << 21 {
                return Err(format!(
                    "ERR fencelock: config epoch {epoch} leaves no room below 2^53 for epoch fences"
                ));
            }
            floor = floor.max(epoch << 32);
        }
    }
    let mut fence = stored.saturating_add(1);
    if fence <= floor {
        fence = floor.saturating_add(1);
    }
    if fence > crate::state::MAX_FENCE {
        return Err(format!(
            "ERR fencelock: the next fence would pass 2^53 - 1 (stored {stored}): lower the floor"
        ));
    }
    Ok(Fence {
        fence,
        behind,
        shift,
    })
}

/// What a grant does to the key's expiry (acquire.lua's inlined grant_expiry.lua).
#[derive(Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No grace: remove any expiry.
    Persist,
    /// Set it to this absolute time in ms.
    At(u64),
    /// Set it to this time only if it expires earlier (or has no expiry).
    RaiseTo(u64),
}

/// The key-expiry rule of a grant of `fence` whose lease ends at `ends` (ms), given the fence
/// rule's `shift`: with a shift (clock and hybrid modes) at max(ends, (fence - shift) as ms) +
/// grace; without (counter and epoch modes) at ends + grace, only raised when the fence read as
/// µs is past the lease end.
pub fn grant_expiry(shift: Option<u64>, fence: u64, ends: u64, grace: Option<u64>) -> Expiry {
    let Some(grace) = grace else {
        return Expiry::Persist;
    };
    match shift {
        Some(shift) => Expiry::At(ends.max(fence.saturating_sub(shift).div_ceil(1000)) + grace),
        None if fence > ends.saturating_mul(1000) => Expiry::RaiseTo(ends + grace),
        None => Expiry::At(ends + grace),
    }
}

/// keep.lua's `keep(key, fence, ends)` exactly: in a call that granted with a `shift` (clock
/// and hybrid modes) at max(ends, (fence - shift) as ms) + grace; without one (a call that ran
/// no fence rule, such as extend and re-entry, or a grant in counter or epoch mode) only raised
/// to ends + grace when the fence read as µs is past `(ends + 1) * 1000` (an epoch-clock fence
/// far ahead of the clock), else set to max(ends, fence as ms, rounded up) + grace, which may
/// lower it: a clock fence of the lease end's millisecond or earlier.
pub fn keep_expiry(shift: Option<u64>, fence: u64, ends: u64, grace: Option<u64>) -> Expiry {
    let Some(grace) = grace else {
        return Expiry::Persist;
    };
    if shift.is_none() && fence > ends.saturating_add(1).saturating_mul(1000) {
        return Expiry::RaiseTo(ends + grace);
    }
    let fence_ms = fence.saturating_sub(shift.unwrap_or(0)).div_ceil(1000);
    Expiry::At(ends.max(fence_ms) + grace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(fence: u64, behind: u64, shift: Option<u64>) -> Result<Fence, String> {
        Ok(Fence {
            fence,
            behind,
            shift,
        })
    }

    #[test]
    fn fence_rule() {
        assert_eq!(next_fence(0, 0, Mode::Counter, 5, 3), ok(1, 0, None));
        assert_eq!(next_fence(7, 100, Mode::Counter, 5, 3), ok(101, 0, None));
        assert_eq!(next_fence(7, 0, Mode::Clock, 1000, 3), ok(1001, 0, Some(0)));
        assert_eq!(
            next_fence(2000, 0, Mode::Clock, 1000, 3),
            ok(2001, 1000, Some(0))
        );
        assert!(next_fence(crate::state::MAX_FENCE, 0, Mode::Counter, 0, 0).is_err());
        assert!(next_fence(0, crate::state::MAX_FENCE, Mode::Counter, 0, 0).is_err());
    }

    #[test]
    fn epoch_fence_rule() {
        // fence.lua: max(stored + 1, floor + 1, epoch × 2^32 + 1); behind stays 0.
        assert_eq!(
            next_fence(0, 0, Mode::Epoch, 5, 3),
            ok(3 * 4294967296 + 1, 0, None)
        );
        let above = 3 * 4294967296 + 10;
        assert_eq!(
            next_fence(above, 0, Mode::Epoch, 5, 3),
            ok(above + 1, 0, None)
        );
        assert_eq!(
            next_fence(0, 5 * 4294967296, Mode::Epoch, 5, 3),
            ok(5 * 4294967296 + 1, 0, None)
        );
        assert_eq!(next_fence(0, 0, Mode::Epoch, 5, 0), ok(1, 0, None));
        assert_eq!(
            next_fence(0, 0, Mode::Epoch, 5, 2097151),
            ok(2097151 * 4294967296 + 1, 0, None)
        );
        assert_eq!(
            next_fence(0, 0, Mode::Epoch, 5, 2097152),
            Err(
                "ERR fencelock: config epoch 2097152 leaves no room below 2^53 for epoch fences"
                    .into()
            )
        );
        assert!(next_fence(crate::state::MAX_FENCE, 0, Mode::Epoch, 5, 1).is_err());
    }

    #[test]
    fn hybrid_fence_rule() {
        // fence.lua: max(stored + 1, floor + 1, TIME µs + epoch × 2^34 + 1), behind against
        // the clock term, shift = epoch × 2^34.
        let now = 1_764_000_000_000_000;
        let shift = 3 * 17179869184;
        assert_eq!(
            next_fence(0, 0, Mode::Hybrid, now, 3),
            ok(now + shift + 1, 0, Some(shift))
        );
        assert_eq!(
            next_fence(now + shift + 50, 0, Mode::Hybrid, now, 3),
            ok(now + shift + 51, 50, Some(shift))
        );
        // A fence of an older epoch is below the clock term: not behind.
        assert_eq!(
            next_fence(now + 17179869184, 0, Mode::Hybrid, now, 3),
            ok(now + shift + 1, 0, Some(shift))
        );
        assert_eq!(
            next_fence(0, now + shift + 7, Mode::Hybrid, now, 3),
            ok(now + shift + 8, 0, Some(shift))
        );
        assert_eq!(
            next_fence(0, 0, Mode::Hybrid, now, 0),
            ok(now + 1, 0, Some(0))
        );
        // An epoch whose term passes 2^53: the scripts' fence error, no overflow.
        assert_eq!(
            next_fence(4, 0, Mode::Hybrid, now, 1 << 19),
            Err(
                "ERR fencelock: the next fence would pass 2^53 - 1 (stored 4): lower the floor"
                    .into()
            )
        );
        assert!(next_fence(4, 0, Mode::Hybrid, now, u64::MAX).is_err());
    }

    #[test]
    fn expiry_rule() {
        assert_eq!(
            grant_expiry(Some(0), 5_000_001, 4000, Some(10)),
            Expiry::At(5011)
        );
        assert_eq!(
            grant_expiry(Some(0), 1_000, 4000, Some(10)),
            Expiry::At(4010)
        );
        assert_eq!(grant_expiry(None, 3, 4000, Some(10)), Expiry::At(4010));
        assert_eq!(
            grant_expiry(None, 5_000_000, 4000, Some(10)),
            Expiry::RaiseTo(4010)
        );
        assert_eq!(grant_expiry(None, 3, 4000, None), Expiry::Persist);
    }

    #[test]
    fn keep_rule_of_a_call_that_did_not_grant() {
        // keep.lua without `memo.shift`: raised only past (ends + 1) × 1000 µs, else set.
        assert_eq!(keep_expiry(None, 3, 4000, Some(10)), Expiry::At(4010));
        assert_eq!(
            keep_expiry(None, 4_000_000, 4000, Some(10)),
            Expiry::At(4010)
        );
        // The band the grant's rule raises in: a fence within the lease end's next
        // millisecond is read as that millisecond, and the expiry is set (lowered if later).
        assert_eq!(
            keep_expiry(None, 4_000_001, 4000, Some(10)),
            Expiry::At(4011)
        );
        assert_eq!(
            keep_expiry(None, 4_001_000, 4000, Some(10)),
            Expiry::At(4011)
        );
        assert_eq!(
            grant_expiry(None, 4_000_001, 4000, Some(10)),
            Expiry::RaiseTo(4010)
        );
        assert_eq!(
            keep_expiry(None, 4_001_001, 4000, Some(10)),
            Expiry::RaiseTo(4010)
        );
        assert_eq!(keep_expiry(None, 4_000_500, 4000, None), Expiry::Persist);
        // With a shift it is the grant's rule.
        for fence in [1_000, 4_000_001, 5_000_001] {
            assert_eq!(
                keep_expiry(Some(0), fence, 4000, Some(10)),
                grant_expiry(Some(0), fence, 4000, Some(10))
            );
        }
    }

    #[test]
    fn hybrid_and_epoch_expiry_rule() {
        // grant_expiry.lua with memo.shift = epoch × 2^34: the fence read as server µs.
        let shift = 2 * 17179869184;
        assert_eq!(
            grant_expiry(Some(shift), shift + 5_000_001, 4000, Some(10)),
            Expiry::At(5011)
        );
        assert_eq!(
            grant_expiry(Some(shift), shift + 1_000, 4000, Some(10)),
            Expiry::At(4010)
        );
        assert_eq!(
            grant_expiry(Some(shift), shift + 1, 4000, None),
            Expiry::Persist
        );
        // Epoch mode has no shift: its fence is far past the lease end, so the expiry is raised.
        let (mode, epoch) = (Mode::Epoch, 3);
        let f = next_fence(0, 0, mode, 5, epoch).map(|f| (f.fence, f.shift));
        assert_eq!(f, Ok((3 * 4294967296 + 1, None)));
        assert_eq!(
            grant_expiry(None, 3 * 4294967296 + 1, 4000, Some(10)),
            Expiry::RaiseTo(4010)
        );
    }

    #[test]
    fn echoed_arguments_are_cut_to_64_bytes() {
        assert_eq!(quote(b"clokc"), "clokc");
        assert_eq!(quote(b""), "");
        let a64 = "a".repeat(64);
        assert_eq!(quote(a64.as_bytes()), a64);
        assert_eq!(quote("a".repeat(65).as_bytes()), format!("{a64}…"));
        // The review's 20 MB argument: the reply stays short.
        let huge = vec![b'x'; 20 << 20];
        assert_eq!(quote(&huge), format!("{}…", "x".repeat(64)));
        let e = parse_mode(&huge).unwrap_err();
        assert!(e.len() < 200, "{} bytes", e.len());
        assert!(e.starts_with("ERR fencelock: unknown fence mode 'xxx") && e.contains("…'"));
        assert!(migrating(&huge).len() < 250);
        assert!(migrating(b"{orders}:lock").contains("slot of {orders}:lock is migrating"));
        // Whole characters only: 32 two-byte ones fill 64 bytes; after one byte, 31 fit.
        let e_acute = "é".repeat(40);
        assert_eq!(quote(e_acute.as_bytes()), format!("{}…", "é".repeat(32)));
        assert_eq!(
            quote(format!("a{e_acute}").as_bytes()),
            format!("a{}…", "é".repeat(31))
        );
        assert_eq!(quote("é".repeat(32).as_bytes()), "é".repeat(32));
        // Bytes that are not UTF-8 count as the U+FFFD shown for them (3 bytes each).
        assert_eq!(quote(&[0xff; 100]), format!("{}…", "\u{fffd}".repeat(21)));
        for arg in [&huge[..], e_acute.as_bytes(), &[0xff; 100], &[0xe2, 0x82]] {
            assert!(quote(arg).trim_end_matches('…').len() <= ECHO_MAX);
        }
    }

    #[test]
    fn arguments() {
        assert!(parse_mode(b"nope").is_err());
        assert_eq!(parse_mode(b"hybrid"), Ok(Mode::Hybrid));
        assert_eq!(parse_mode(b"epoch"), Ok(Mode::Epoch));
        assert_eq!(parse_grace(b""), Ok(None));
        assert!(parse_grace(b"-1").is_err());
        assert!(parse_num(b"12a", "x", 100).is_err());
        assert!(check_owner(b"a b").is_err());
        assert!(check_owner(b"").is_err());
    }
}
