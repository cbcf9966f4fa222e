//! Durations in store URL options (`?timeout=30s`): how they are read and written back.

/// Parses a duration option: `30s`, `500ms`, or a plain number of seconds.
pub fn parse_duration(value: &str) -> std::result::Result<std::time::Duration, String> {
    let bad = || format!("{value:?} is not a duration (e.g. `30s`, `500ms` or `30`)");
    let (number, scale) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, 1)
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
