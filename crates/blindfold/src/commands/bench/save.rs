//! Saving a benchmark's report.

use anyhow::{Context, Result};

/// Writes a benchmark report as pretty JSON to `path`, if one was given, and says so.
pub fn save_json(path: Option<&std::path::Path>, report: &impl serde::Serialize) -> Result<()> {
    if let Some(path) = path {
        let json = serde_json::to_string_pretty(report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("  saved {}", path.display());
    }
    Ok(())
}
