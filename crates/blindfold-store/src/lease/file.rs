//! [`FileLeaseRecords`]: lease records as small files in a store directory.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use rand::Rng;

use super::{LeaseRecords, LoadedRecord, MAX_LEASE_RECORD};
use crate::{Result, StoreError};

/// Lease records in the directory of a `file:` store: the record of `name` is
/// `<dir>/<name>.lease`, replaced only under an exclusive `flock` of `<dir>/<name>.lease.lock`.
///
/// A swap takes the lock, reads the record, compares it with the expected one and, if they
/// match, writes the new record to a temporary file, syncs it, renames it over the record and
/// syncs the directory, then lets the lock go. Readers need no lock: a rename replaces the
/// record whole. Processes on one machine (or on a file system whose `flock` works across
/// machines) thus see one compare-and-swap at a time; the lock is released by the kernel if a
/// process dies holding it.
#[derive(Debug, Clone)]
pub struct FileLeaseRecords {
    dir: PathBuf,
}

impl FileLeaseRecords {
    /// Records in `dir` (created on the first write if missing).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The file holding the record of `name`.
    pub fn record_path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.lease"))
    }

    async fn blocking<T: Send + 'static>(
        &self,
        what: String,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        match tokio::task::spawn_blocking(f).await {
            Ok(result) => result,
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => Err(StoreError::io(
                what,
                std::io::Error::new(ErrorKind::Interrupted, join.to_string()),
            )),
        }
    }
}

/// The record at `path`, at most [`MAX_LEASE_RECORD`] bytes, or `None` if there is no file.
fn read_record(path: &Path) -> Result<Option<Vec<u8>>> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StoreError::io(format!("opening {}", path.display()), e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_LEASE_RECORD as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| StoreError::io(format!("reading {}", path.display()), e))?;
    if bytes.len() > MAX_LEASE_RECORD {
        return Err(StoreError::NotAStore {
            path: path.to_path_buf(),
            reason: format!("a lease record longer than {MAX_LEASE_RECORD} bytes"),
        });
    }
    Ok(Some(bytes))
}

/// Replaces the record at `path` with `record`: temporary file, sync, rename, sync of the
/// directory.
fn replace(dir: &Path, path: &Path, record: &[u8]) -> Result<()> {
    let io = |what: &str, e| StoreError::io(format!("{what} {}", path.display()), e);
    let tmp = dir.join(format!(
        ".{}.tmp-{:016x}",
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        rand::thread_rng().gen::<u64>()
    ));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| io("creating a temporary file for", e))?;
        file.write_all(record).map_err(|e| io("writing a temporary file for", e))?;
        file.sync_all().map_err(|e| io("syncing a temporary file for", e))?;
        std::fs::rename(&tmp, path).map_err(|e| io("renaming a temporary file to", e))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(format!("syncing the directory {}", dir.display()), e))
}

fn swap_locked(dir: &Path, path: &Path, expected: Option<&[u8]>, record: &[u8]) -> Result<bool> {
    use rustix::fs::{flock, FlockOperation};
    std::fs::create_dir_all(dir)
        .map_err(|e| StoreError::io(format!("creating the directory {}", dir.display()), e))?;
    let mut lock_path = path.as_os_str().to_owned();
    lock_path.push(".lock");
    let lock_path = PathBuf::from(lock_path);
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| StoreError::io(format!("opening {}", lock_path.display()), e))?;
    loop {
        match flock(&lock, FlockOperation::LockExclusive) {
            Ok(()) => break,
            Err(e) if e == rustix::io::Errno::INTR => {}
            Err(e) => {
                return Err(StoreError::io(format!("locking {}", lock_path.display()), e.into()))
            }
        }
    }
    // The lock goes with `lock` when it is dropped, whatever happens below.
    if read_record(path)?.as_deref() != expected {
        return Ok(false);
    }
    replace(dir, path, record)?;
    Ok(true)
}

#[async_trait]
impl LeaseRecords for FileLeaseRecords {
    async fn load(&self, name: &str) -> Result<Option<LoadedRecord>> {
        let path = self.record_path(name);
        let what = format!("reading {}", path.display());
        let record = self.blocking(what, move || read_record(&path)).await?;
        Ok(record.map(|r| LoadedRecord { token: r.clone(), record: r }))
    }

    async fn swap(&self, name: &str, expected: Option<&[u8]>, record: &[u8]) -> Result<bool> {
        let (dir, path) = (self.dir.clone(), self.record_path(name));
        let what = format!("replacing {}", path.display());
        let (expected, record) = (expected.map(<[u8]>::to_vec), record.to_vec());
        self.blocking(what, move || swap_locked(&dir, &path, expected.as_deref(), &record)).await
    }
}
