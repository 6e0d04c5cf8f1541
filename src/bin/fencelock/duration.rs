//! Durations written as `300ms`, `2s`, `1m`, `1h` (or `0`).

use std::time::Duration;

/// Parses `<integer><unit>` with unit `ms`, `s`, `m` or `h`; a bare `0` is zero.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 300ms, 2s, 1m or 1h"))?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration: write e.g. 300ms, 2s, 1m or 1h"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("{text:?} has an unknown unit: use ms, s, m or h")),
    };
    number
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long"))
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
        for bad in ["", "5", "5x", "ms", "-1s", "1.5s", "99999999999999999999h"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
