//! Durations in store URL options (`?timeout=30s`): how they are read and written back.

/// Parses a duration option: `500ms`, `30s`, `5m`, `1h`, `2d`, or a plain number of seconds.
pub fn parse_duration(value: &str) -> std::result::Result<std::time::Duration, String> {
    let bad = || format!("{value:?} is not a duration (e.g. `500ms`, `30s`, `5m`, `1h` or `30`)");
    let (number, scale) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, 1)
    } else if let Some(m) = value.strip_suffix('m') {
        (m, 60_000)
    } else if let Some(h) = value.strip_suffix('h') {
        (h, 3_600_000)
    } else if let Some(d) = value.strip_suffix('d') {
        (d, 86_400_000)
    } else {
        (value.strip_suffix('s').unwrap_or(value), 1000)
    };
    let millis: u64 = number.parse().map_err(|_| bad())?;
    let millis = millis.checked_mul(scale).filter(|&m| m > 0).ok_or_else(bad)?;
    Ok(std::time::Duration::from_millis(millis))
}

/// Writes a duration as [`parse_duration`] reads it back.
pub(crate) fn fmt_duration(d: std::time::Duration) -> String {
    let millis = d.as_millis();
    if millis.is_multiple_of(1000) {
        format!("{}s", millis / 1000)
    } else {
        format!("{millis}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn units_from_milliseconds_to_days() {
        let d = |s| parse_duration(s);
        assert_eq!(d("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(d("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(d("30"), Ok(Duration::from_secs(30)));
        assert_eq!(d("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(d("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(d("2d"), Ok(Duration::from_secs(172_800)));
        assert!(d("0s").is_err() && d("1y").is_err() && d("h").is_err() && d("-1s").is_err());
    }
}
