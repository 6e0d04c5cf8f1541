//! Durations written for people, the one format every message uses.

use std::fmt;
use std::time::Duration;

/// A [`Duration`] rounded for people when displayed: `850µs`, `15ms`, `1.2s`, `42s`,
/// `2m 5s`, `1h 30m`, `3d 4h`, `12y 10d` (years of 365.25 days, as humantime reads them), with
/// at most two units (what is left over is rounded into the smaller one), instead of
/// `Debug`'s `1.0040633s`. Every duration in fencelock's messages goes through it; the output
/// parses back with humantime (the CLI's duration syntax), to within the rounding.
///
/// ```
/// use std::time::Duration;
/// use fencelock::HumanDuration;
///
/// assert_eq!(HumanDuration(Duration::from_nanos(1_004_063_300)).to_string(), "1s");
/// assert_eq!(HumanDuration(Duration::from_millis(8_240)).to_string(), "8.2s");
/// assert_eq!(HumanDuration(Duration::from_secs(125)).to_string(), "2m 5s");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl From<Duration> for HumanDuration {
    fn from(duration: Duration) -> Self {
        Self(duration)
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MINUTE: u128 = 60;
        const HOUR: u128 = 60 * MINUTE;
        const DAY: u128 = 24 * HOUR;
        const YEAR: u128 = 365 * DAY + DAY / 4;
        let nanos = self.0.as_nanos();
        let rounded = |unit: u128| (nanos + unit / 2) / unit;
        if nanos == 0 {
            return f.write_str("0s");
        }
        if nanos < 1_000 {
            return write!(f, "{nanos}ns");
        }
        if nanos < 999_500 {
            return write!(f, "{}µs", rounded(1_000));
        }
        if nanos < 999_500_000 {
            return write!(f, "{}ms", rounded(1_000_000));
        }
        // Tenths of a second below 10 s ("8.2s"), whole units above.
        let tenths = rounded(100_000_000);
        if tenths < 100 {
            return match tenths % 10 {
                0 => write!(f, "{}s", tenths / 10),
                tenth => write!(f, "{}.{tenth}s", tenths / 10),
            };
        }
        let secs = rounded(1_000_000_000);
        let two =
            |f: &mut fmt::Formatter<'_>, big: u128, big_unit: &str, small: u128, small_unit| {
                match small {
                    0 => write!(f, "{big}{big_unit}"),
                    _ => write!(f, "{big}{big_unit} {small}{small_unit}"),
                }
            };
        if secs < MINUTE {
            return write!(f, "{secs}s");
        }
        if secs < HOUR {
            return two(f, secs / MINUTE, "m", secs % MINUTE, "s");
        }
        let minutes = (secs + MINUTE / 2) / MINUTE;
        if minutes * MINUTE < DAY {
            return two(f, minutes / 60, "h", minutes % 60, "m");
        }
        let hours = (secs + HOUR / 2) / HOUR;
        if hours * HOUR < YEAR {
            return two(f, hours / 24, "d", hours % 24, "h");
        }
        // Years of 365.25 days, as humantime reads `y`: counted in quarter days so that a
        // whole number of years prints without a day left over.
        const QUARTER_DAY: u128 = DAY / 4;
        const QUARTERS_PER_YEAR: u128 = 365 * 4 + 1;
        let quarters = (secs + QUARTER_DAY / 2) / QUARTER_DAY;
        let (years, left) = (quarters / QUARTERS_PER_YEAR, quarters % QUARTERS_PER_YEAR);
        two(f, years, "y", (left + 2) / 4, "d")
    }
}

/// A name as a line for people shows it: control characters (a newline, an escape sequence
/// that a terminal would run) written as escapes (`\n`, `\u{1b}`), everything else as it is.
/// Lock names may hold any bytes Redis keys can; every message and table shows them this way.
///
/// ```
/// use fencelock::Printable;
///
/// assert_eq!(Printable("orders:42").to_string(), "orders:42");
/// assert_eq!(Printable("a\x1b[2Jb\n").to_string(), "a\\u{1b}[2Jb\\n");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Printable<'a>(pub &'a str);

impl fmt::Display for Printable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.0.chars().any(char::is_control) {
            return f.write_str(self.0);
        }
        for c in self.0.chars() {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::HumanDuration;
    use std::time::Duration;

    fn human(duration: Duration) -> String {
        HumanDuration(duration).to_string()
    }

    #[test]
    fn durations_are_rounded_for_people() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(40), "40ns"),
            (Duration::from_nanos(850_400), "850µs"),
            (Duration::from_nanos(999_700), "1ms"),
            (Duration::from_micros(15_400), "15ms"),
            (Duration::from_micros(999_600), "1s"),
            (Duration::from_nanos(1_004_063_300), "1s"),
            (Duration::from_millis(1_500), "1.5s"),
            (Duration::from_millis(8_249), "8.2s"),
            (Duration::from_millis(9_960), "10s"),
            (Duration::from_millis(42_400), "42s"),
            (Duration::from_millis(59_600), "1m"),
            (Duration::from_secs(125), "2m 5s"),
            (Duration::from_secs(3_599), "59m 59s"),
            (Duration::from_secs(3_600), "1h"),
            (Duration::from_secs(5_430), "1h 31m"),
            (Duration::from_secs(86_399), "1d"),
            (Duration::from_secs(3 * 86_400 + 4 * 3_600), "3d 4h"),
            (Duration::from_secs(400 * 86_400), "1y 35d"),
            (Duration::from_secs(365 * 86_400), "365d"),
            (Duration::from_secs(365 * 86_400 + 6 * 3_600), "1y"),
            (Duration::from_secs(2 * 31_557_600 - 1), "2y"),
            (crate::MAX_TTL, "146135511y 191d"),
            (Duration::MAX, "584542046090y 229d"),
        ];
        for (duration, expected) in cases {
            assert_eq!(human(duration), expected, "{duration:?}");
        }
    }
}
