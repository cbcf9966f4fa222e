//! What the commands print for the operator besides their logs: `blindfold: …` notes on
//! standard error, the banner on standard output, and the final error. As plain lines, or —
//! under `--log-format json` — as one JSON object per line on standard error, shaped as the log
//! lines are (`timestamp`, `level`, `fields.message`, `target`), so a log collector reading that
//! stream never meets a line it cannot parse.

use std::sync::atomic::{AtomicBool, Ordering};

static JSON: AtomicBool = AtomicBool::new(false);

/// Chooses JSON lines (`--log-format json`) or plain ones.
pub fn set_json(on: bool) {
    JSON.store(on, Ordering::Relaxed);
}

fn json_line(level: &str, text: &str) -> String {
    let timestamp = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    serde_json::json!({
        "timestamp": timestamp,
        "level": level,
        "fields": { "message": text },
        "target": "blindfold",
    })
    .to_string()
}

/// A note on standard error.
pub fn err_line(text: &str) {
    if JSON.load(Ordering::Relaxed) {
        eprintln!("{}", json_line("INFO", text));
    } else {
        eprintln!("{text}");
    }
}

/// A line of the banner: standard output, or a JSON note on standard error.
pub fn out_line(text: &str) {
    if JSON.load(Ordering::Relaxed) {
        eprintln!("{}", json_line("INFO", text));
    } else {
        println!("{text}");
    }
}

/// The error that ends the command.
pub fn error(text: &str) {
    if JSON.load(Ordering::Relaxed) {
        eprintln!("{}", json_line("ERROR", text));
    } else {
        eprintln!("Error: {text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_parse_and_carry_the_text() {
        let line = json_line("INFO", "created a \"new\" key\nat /x");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["fields"]["message"], "created a \"new\" key\nat /x");
        assert_eq!(v["level"], "INFO");
        assert!(!line.contains('\n'), "one line: {line}");
    }
}
