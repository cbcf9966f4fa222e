//! What machine a result was measured on, so figures are never reported without it.

use serde::Serialize;

/// The machine a benchmark ran on.
#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    /// CPU model name.
    pub cpu: String,
    /// Logical cores available to this process.
    pub cores: usize,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// Operating system and architecture.
    pub os: String,
    /// blindfold version.
    pub blindfold: String,
}

impl Machine {
    /// Reads the current machine's description (Linux `/proc`; placeholders elsewhere).
    pub fn current() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_bytes = kib_field(&meminfo, "MemTotal:").unwrap_or(0) * 1024;
        Self {
            cpu,
            cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            memory_bytes,
            os: format!("{} {}", std::env::consts::OS, std::env::consts::ARCH),
            blindfold: env!("CARGO_PKG_VERSION").to_string(),
        }
    }

    /// One line for the top of a report.
    pub fn summary(&self) -> String {
        format!(
            "{} · {} cores · {:.1} GiB · {} · blindfold {}",
            self.cpu,
            self.cores,
            self.memory_bytes as f64 / (1u64 << 30) as f64,
            self.os,
            self.blindfold
        )
    }
}

fn kib_field(text: &str, key: &str) -> Option<u64> {
    text.lines().find(|l| l.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()
}

/// Peak resident memory of this process so far, in bytes (Linux; 0 elsewhere).
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    kib_field(&status, "VmHWM:").unwrap_or(0) * 1024
}
