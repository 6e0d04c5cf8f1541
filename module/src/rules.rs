//! The scripts' rules as pure functions: argument validation, the fence rule (fence.lua, modes
//! `clock` and `counter`) and the key-expiry rule of a grant (keep.lua, as acquire.lua inlines
//! it).

/// The fence modes the module serves; `epoch` and `hybrid` (they read `cluster_my_epoch`) are
/// answered with a FALLBACK error for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The fence is above TIME in µs.
    Clock,
    /// A plain counter.
    Counter,
}

/// Parses a mode argument: Ok(Some) served, Ok(None) a mode left to the scripts, Err unknown.
pub fn parse_mode(arg: &[u8]) -> Result<Option<Mode>, String> {
    match arg {
        b"clock" => Ok(Some(Mode::Clock)),
        b"counter" => Ok(Some(Mode::Counter)),
        b"epoch" | b"hybrid" => Ok(None),
        _ => Err(format!(
            "ERR fencelock: unknown fence mode '{}' (clock, counter, epoch, hybrid)",
            String::from_utf8_lossy(arg)
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

/// The fence rule (fence.lua): the next fence above `stored` and `floor` (and TIME µs in clock
/// mode), with `behind` (µs the stored fence was ahead of the clock, clock mode), or the
/// scripts' error text when it would pass 2^53 - 1.
pub fn next_fence(stored: u64, floor: u64, mode: Mode, now_us: u64) -> Result<(u64, u64), String> {
    let mut floor = floor;
    let mut behind = 0;
    if mode == Mode::Clock {
        floor = floor.max(now_us);
        if stored > now_us {
            behind = stored - now_us;
        }
    }
    let mut fence = stored.saturating_add(1);
    if fence <= floor {
        fence = floor + 1;
    }
    if fence > crate::state::MAX_FENCE {
        return Err(format!(
            "ERR fencelock: the next fence would pass 2^53 - 1 (stored {stored}): lower the floor"
        ));
    }
    Ok((fence, behind))
}

/// What a grant does to the key's expiry (acquire.lua's inlined `keep`).
#[derive(Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No grace: remove any expiry.
    Persist,
    /// Set it to this absolute time in ms.
    At(u64),
    /// Set it to this time only if it expires earlier (or has no expiry).
    RaiseTo(u64),
}

/// The key-expiry rule of a grant of `fence` whose lease ends at `ends` (ms): in clock mode at
/// max(ends, fence as ms) + grace; in counter mode at ends + grace, only raised when the fence
/// read as µs is past the lease end.
pub fn grant_expiry(mode: Mode, fence: u64, ends: u64, grace: Option<u64>) -> Expiry {
    let Some(grace) = grace else {
        return Expiry::Persist;
    };
    match mode {
        Mode::Clock => Expiry::At(ends.max(fence.div_ceil(1000)) + grace),
        Mode::Counter if fence > ends.saturating_mul(1000) => Expiry::RaiseTo(ends + grace),
        Mode::Counter => Expiry::At(ends + grace),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_rule() {
        assert_eq!(next_fence(0, 0, Mode::Counter, 5), Ok((1, 0)));
        assert_eq!(next_fence(7, 100, Mode::Counter, 5), Ok((101, 0)));
        assert_eq!(next_fence(7, 0, Mode::Clock, 1000), Ok((1001, 0)));
        assert_eq!(next_fence(2000, 0, Mode::Clock, 1000), Ok((2001, 1000)));
        assert!(next_fence(crate::state::MAX_FENCE, 0, Mode::Counter, 0).is_err());
        assert!(next_fence(0, crate::state::MAX_FENCE, Mode::Counter, 0).is_err());
    }

    #[test]
    fn expiry_rule() {
        assert_eq!(
            grant_expiry(Mode::Clock, 5_000_001, 4000, Some(10)),
            Expiry::At(5011)
        );
        assert_eq!(
            grant_expiry(Mode::Clock, 1_000, 4000, Some(10)),
            Expiry::At(4010)
        );
        assert_eq!(
            grant_expiry(Mode::Counter, 3, 4000, Some(10)),
            Expiry::At(4010)
        );
        assert_eq!(
            grant_expiry(Mode::Counter, 5_000_000, 4000, Some(10)),
            Expiry::RaiseTo(4010)
        );
        assert_eq!(grant_expiry(Mode::Counter, 3, 4000, None), Expiry::Persist);
    }

    #[test]
    fn arguments() {
        assert!(parse_mode(b"nope").is_err());
        assert_eq!(parse_mode(b"hybrid"), Ok(None));
        assert_eq!(parse_grace(b""), Ok(None));
        assert!(parse_grace(b"-1").is_err());
        assert!(parse_num(b"12a", "x", 100).is_err());
        assert!(check_owner(b"a b").is_err());
        assert!(check_owner(b"").is_err());
    }
}
