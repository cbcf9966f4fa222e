//! A full disk is a wait, not a failure.
//!
//! The gateway keeps a reserve of disk space in its data directory and gives it up the moment
//! the disk fills (see `blindfold_gateway::space`), refusing new data until the operator frees
//! room. Between the disk filling and the reserve being given up, a write of trusted state — a
//! redo-log append, a checkpoint — can meet `ENOSPC`. Failing it would stop the engine (its
//! trusted state could no longer follow the store); [`waiting_for_room`] instead retries it,
//! undoing each cut-short attempt, until it succeeds or [`PATIENCE`] runs out.

use std::path::Path;
use std::time::{Duration, Instant};

/// How long a write that finds its disk full waits for room before it fails. Long enough for
/// the gateway's watcher (which polls every second) to give up its reserve, and for an
/// operator who sees the warning to free space.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Whether `e` says the disk (or the user's quota on it) is full.
pub fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded)
}

/// Runs the blocking write `attempt` on `path` until it succeeds or fails for a reason other
/// than a full disk; a full disk is waited out (polling every 100 ms) for up to [`PATIENCE`].
/// `attempt` must leave nothing behind when it fails (truncate what it appended), since it
/// runs again from the start.
pub fn waiting_for_room<T>(
    path: &Path,
    attempt: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    waiting_for_room_at_most(path, PATIENCE, attempt)
}

/// [`waiting_for_room`] with its patience given.
pub fn waiting_for_room_at_most<T>(
    path: &Path,
    patience: Duration,
    mut attempt: impl FnMut() -> std::io::Result<T>,
) -> std::io::Result<T> {
    let started = Instant::now();
    let mut warned = false;
    loop {
        match attempt() {
            Err(e) if is_disk_full(&e) && started.elapsed() < patience => {
                if !warned {
                    warned = true;
                    tracing::warn!(
                        path = %path.display(),
                        "the disk is full: waiting up to {}s for room to write there (free \
                         space on that disk; new data is refused meanwhile, nothing is lost)",
                        patience.as_secs()
                    );
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) if is_disk_full(&e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!(
                        "{e} — waited {}s for room; free space on the disk holding {} and \
                         start again (nothing acknowledged was lost)",
                        started.elapsed().as_secs(),
                        path.display()
                    ),
                ));
            }
            other => {
                if warned {
                    tracing::warn!(path = %path.display(), "room again: the write went through");
                }
                return other;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> std::io::Error {
        std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error())
    }

    #[test]
    fn a_full_disk_is_waited_out_and_other_errors_are_not() {
        let mut tries = 0;
        let r = waiting_for_room(Path::new("/x"), || {
            tries += 1;
            if tries < 3 {
                Err(full())
            } else {
                Ok(tries)
            }
        });
        assert_eq!(r.unwrap(), 3);

        let mut tries = 0;
        let r: std::io::Result<()> = waiting_for_room(Path::new("/x"), || {
            tries += 1;
            Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
        });
        assert!(r.is_err());
        assert_eq!(tries, 1, "only a full disk is retried");
    }

    #[test]
    fn patience_runs_out_with_a_message_naming_the_path() {
        let e = waiting_for_room_at_most(Path::new("/data/redo.log"), Duration::ZERO, || {
            Err::<(), _>(full())
        })
        .unwrap_err();
        assert!(is_disk_full(&e), "the kind survives: {e}");
        assert!(e.to_string().contains("/data/redo.log"), "{e}");
        assert!(e.to_string().contains("free space"), "{e}");
    }
}
