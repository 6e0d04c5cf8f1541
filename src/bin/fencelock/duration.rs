//! Durations on the command line, parsed by `humantime`: `300ms`, `2s`, `1m30s`, `1.5s`,
//! `2h 15m`, `1day`; a bare `0` is zero.

use std::time::Duration;

/// The forms named in every error message.
const FORMS: &str = "write a number with a unit, e.g. 300ms, 2s, 1.5s, 1m30s or 1h (or 0)";

/// Parses a duration; the error is one line that names the accepted forms.
pub fn parse(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|err| format!("{text:?}: {err}; {FORMS}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("2h 15m"), Ok(Duration::from_secs(8100)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse(" 10ms "), Ok(Duration::from_millis(10)));
        for bad in ["", "5", "5x", "ms", "-1s", "1s-", "99999999999999999999h"] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains("1m30s") && !err.contains('\n'), "{bad}: {err}");
        }
    }
}
