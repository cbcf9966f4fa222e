//! Room on the data directory's disk: a full disk refuses new data, never loses any.
//!
//! Every request, reads included, writes a little trusted state (the engine logs each access's
//! reveal before it reads a path; commits and checkpoints follow). A disk that fills up would
//! otherwise stop the engine half-way. So the gateway keeps a *reserve* — a file of
//! `--disk-reserve` bytes, [`RESERVE_FILE`] in the data directory — and watches the disk's free
//! space every second:
//!
//! * when it drops below the reserve's size, the reserve file is deleted (its space goes to the
//!   engine's logs and checkpoints, so reads, lists and deletes go on) and new data is refused
//!   with a clear error ([`WriteGate`]: S3 `503 SlowDown`, Swift `507`), naming the disk and
//!   how much to free;
//! * once there is room for the reserve again and the reserve's size beyond it, the reserve is
//!   made again and writes resume by themselves.
//!
//! A write of trusted state that meets the full disk before the watcher has acted waits for
//! room (`blindfold_store::room`) rather than failing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use crate::directory::WriteGate;

use crate::params::human_bytes;

/// The reserve's file name in the data directory.
pub const RESERVE_FILE: &str = "disk-reserve";
/// The reserve's default size (`--disk-reserve`).
pub const DEFAULT_RESERVE: u64 = 64 << 20;
/// How often the watcher looks at the disk.
const EVERY: Duration = Duration::from_secs(1);
/// How often, at most, the watcher repeats that writes are still refused.
const REMIND_EVERY: Duration = Duration::from_secs(60);

/// Free and total bytes of the file system holding `path`, as an unprivileged user may use them.
pub fn disk_space(path: &Path) -> std::io::Result<(u64, u64)> {
    let s = rustix::fs::statvfs(path)?;
    Ok((s.f_bavail.saturating_mul(s.f_frsize), s.f_blocks.saturating_mul(s.f_frsize)))
}

/// Watches the data directory's disk; see the module's documentation.
#[derive(Debug)]
pub struct Guard {
    dir: PathBuf,
    reserve: u64,
    gate: Mutex<WriteGate>,
    /// When writes were last said to be refused (for the reminder).
    said: Mutex<Option<Instant>>,
}

impl Guard {
    /// Before the engine opens: if the disk holding `dir` is short of room, gives up the reserve
    /// now (the engine's start replays its log and may write a checkpoint), and starts with
    /// writes refused. `reserve` 0 turns the guard off.
    pub fn prepare(dir: &Path, reserve: u64) -> Arc<Guard> {
        let g = Arc::new(Guard {
            dir: dir.to_path_buf(),
            reserve,
            gate: Mutex::new(WriteGate::default()),
            said: Mutex::new(None),
        });
        // Only a reserve left by an earlier run is given up here: nothing is created before
        // the gateway has opened (a start that fails leaves the directory as it was).
        if reserve > 0 && g.reserve_path().exists() {
            g.step();
        }
        g
    }

    /// The gate the directory asks; from now on the watcher sets this one.
    pub fn attach(&self, gate: WriteGate) {
        let old = std::mem::replace(&mut *self.gate.lock(), gate.clone());
        gate.set(old.refused());
    }

    /// Why new data is refused now (`None`: accepted).
    pub fn refused(&self) -> Option<String> {
        self.gate.lock().refused()
    }

    fn reserve_path(&self) -> PathBuf {
        self.dir.join(RESERVE_FILE)
    }

    /// One look at the disk: gives up or remakes the reserve, refuses or accepts writes.
    pub fn step(&self) {
        if self.reserve == 0 {
            return;
        }
        let (free, _) = match disk_space(&self.dir) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, dir = %self.dir.display(), "cannot read free space");
                return;
            }
        };
        let gate = self.gate.lock().clone();
        let refused = gate.refused().is_some();
        let held = self.reserve_path().exists();
        if !refused {
            if held && free >= self.reserve {
                return;
            }
            // A first start, or one after the reserve was lost: make it if it fits and leaves
            // its size free beside it.
            if !held && free >= self.reserve.saturating_mul(2) && self.make_reserve().is_ok() {
                return;
            }
            let mut free = free;
            if held {
                match std::fs::remove_file(self.reserve_path()) {
                    // What is free now, the reserve given up included, is what the message tells.
                    Ok(()) => free = disk_space(&self.dir).map_or(free, |s| s.0),
                    Err(e) => tracing::warn!(error = %e, "cannot give up the disk reserve"),
                }
            }
            let why = self.message(free);
            tracing::error!("{why}");
            *self.said.lock() = Some(Instant::now());
            gate.set(Some(why));
            return;
        }
        // Writes are refused: resume once the reserve fits and leaves its size free beside it.
        if free >= self.reserve.saturating_mul(2) && self.make_reserve().is_ok() {
            gate.set(None);
            *self.said.lock() = None;
            tracing::warn!(
                dir = %self.dir.display(),
                free = %human_bytes(free),
                "room again on the data directory's disk: new data is accepted again"
            );
            return;
        }
        let mut said = self.said.lock();
        if said.is_none_or(|t| t.elapsed() >= REMIND_EVERY) {
            let why = self.message(free);
            tracing::error!("{why}");
            gate.set(Some(why));
            *said = Some(Instant::now());
        }
    }

    fn message(&self, free: u64) -> String {
        let need = self.reserve.saturating_mul(2).saturating_sub(free);
        format!(
            "the disk holding the data directory {} is nearly full ({} free; the gateway keeps \
             {} there for its logs): new data is refused until there is room — free at least {} \
             on that disk (or move the data directory to a larger one); reads, listings and \
             deletes go on, and writing resumes by itself",
            self.dir.display(),
            human_bytes(free),
            human_bytes(self.reserve),
            human_bytes(need.max(1)),
        )
    }

    /// Writes the reserve file (real blocks, not a sparse file) in full, or nothing.
    fn make_reserve(&self) -> std::io::Result<()> {
        use std::io::Write;
        let path = self.reserve_path();
        let tmp = self.dir.join(format!("{RESERVE_FILE}.tmp"));
        let r = (|| {
            let mut o = std::fs::OpenOptions::new();
            o.write(true).create(true).truncate(true);
            // Private like every file of the data directory (the start-up check would warn).
            std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
            let mut f = o.open(&tmp)?;
            let chunk = vec![0u8; 1 << 20];
            let mut left = self.reserve;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                f.write_all(&chunk[..n])?;
                left -= n as u64;
            }
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })();
        if r.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        r
    }

    /// Looks at the disk every second until `stopped` turns true.
    pub async fn watch(self: Arc<Self>, mut stopped: tokio::sync::watch::Receiver<bool>) {
        if self.reserve == 0 {
            return;
        }
        loop {
            let me = Arc::clone(&self);
            // Making the reserve writes up to its size: off the runtime's threads.
            let _ = tokio::task::spawn_blocking(move || me.step()).await;
            tokio::select! {
                _ = tokio::time::sleep(EVERY) => {}
                _ = stopped.changed() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guard_with_room_makes_its_reserve_and_accepts_writes() {
        let dir = tempfile::tempdir().unwrap();
        let g = Guard::prepare(dir.path(), 1 << 20);
        let gate = WriteGate::default();
        g.attach(gate.clone());
        g.step();
        assert_eq!(gate.refused(), None);
        let len = std::fs::metadata(dir.path().join(RESERVE_FILE)).unwrap().len();
        assert_eq!(len, 1 << 20);
    }

    #[test]
    fn a_reserve_larger_than_the_free_space_refuses_writes_and_says_what_to_free() {
        let dir = tempfile::tempdir().unwrap();
        let (free, _) = disk_space(dir.path()).unwrap();
        let g = Guard::prepare(dir.path(), free.saturating_mul(4).max(1 << 40));
        let gate = WriteGate::default();
        g.attach(gate.clone());
        g.step();
        let why = gate.refused().expect("refused");
        assert!(why.contains(&dir.path().display().to_string()), "{why}");
        assert!(why.contains("free at least"), "{why}");
        assert!(!dir.path().join(RESERVE_FILE).exists());
    }
}
