//! [`FileStore`]: the cells in one preallocated local file, read and written in place.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rand::Rng;

use crate::{ByteRange, CellId, Geometry, Result, Store, StoreError};

/// Bytes before the first cell.
const HEADER_LEN: usize = 4096;
const MAGIC: [u8; 16] = *b"blindfold-cells\0";
const FORMAT_VERSION: u32 = 1;
const CHECKSUM_AT: usize = 48;
/// Reads of at most this many bytes run on the async executor itself: a hop to tokio's blocking
/// pool and back costs tens of microseconds, more than reading a path of small cells from the
/// page cache. Larger reads go to the blocking pool.
const INLINE_READ_BYTES: usize = 64 << 10;

/// How long opening waits for another handle to let go of the file lock (a handle may linger
/// briefly after a cancelled request whose blocking I/O is still finishing).
const LOCK_WAIT: Duration = Duration::from_millis(1000);

/// When a [`FileStore`] asks the operating system to make writes durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// Never: [`Store::flush`] does nothing. Fast, and a machine crash may lose writes.
    None,
    /// On [`Store::flush`] (`fdatasync`), as the [`Store`] contract asks.
    #[default]
    OnFlush,
    /// After every write batch, and on [`Store::flush`].
    Always,
}

impl SyncMode {
    /// The name used in store URLs: `none`, `flush` or `always`.
    pub fn as_str(&self) -> &'static str {
        match self {
            SyncMode::None => "none",
            SyncMode::OnFlush => "flush",
            SyncMode::Always => "always",
        }
    }

    /// The mode named `name` in a store URL (`none`, `flush` or `always`), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "none" => Some(SyncMode::None),
            "flush" => Some(SyncMode::OnFlush),
            "always" => Some(SyncMode::Always),
            _ => None,
        }
    }
}

impl std::fmt::Display for SyncMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An array of cells in one local file, read and written in place with positioned I/O on
/// tokio's blocking thread pool.
///
/// The file is preallocated when created; cells never written read as zeros.
///
/// # File format (version 1)
///
/// ```text
/// offset  size  field
/// 0       16    magic "blindfold-cells\0"
/// 16      4     format version, u32 little-endian (1)
/// 20      4     cell size in bytes, u32 little-endian
/// 24      8     cell count, u64 little-endian
/// 32      16    store-file id (random, fixed when the file is created)
/// 48      4     CRC-32 (IEEE) of the whole 4096-byte header with these 4 bytes left out
/// 52      4044  zero (reserved; covered by the checksum)
/// 4096    ...   cell i at 4096 + i * cell size
/// ```
///
/// A new file is built under a temporary name in the same directory (header written, space
/// preallocated, synced) and then linked into place, so a crash during creation never leaves a
/// half-made store at the real path (at worst a `.NAME.tmp-…` file beside it, safe to delete).
/// While a `FileStore` is open it holds an exclusive advisory lock (`flock`) on the file, so two
/// processes cannot write the same array.
#[derive(Debug)]
pub struct FileStore {
    path: PathBuf,
    geometry: Geometry,
    sync: SyncMode,
    file_id: [u8; 16],
    file: Arc<File>,
}

impl FileStore {
    /// Opens the store file at `path`, checking that it has `geometry`, or creates it (and its
    /// parent directories) preallocated to that geometry if there is no file there.
    ///
    /// Blocks on file I/O (and on preallocating the whole array when creating); call it from
    /// `spawn_blocking` in latency-sensitive async code. Fails with
    /// [`StoreError::GeometryMismatch`] if the file has another shape, [`StoreError::NotAStore`]
    /// if it is not a blindfold cell file or is damaged, [`StoreError::InUse`] if another handle
    /// holds it.
    pub fn create_or_open(
        path: impl AsRef<Path>,
        geometry: Geometry,
        sync: SyncMode,
    ) -> Result<Self> {
        let path = path.as_ref();
        match OpenOptions::new().read(true).write(true).open(path) {
            Ok(file) => Self::check(file, path, Some(geometry), sync),
            Err(e) if e.kind() == ErrorKind::NotFound => Self::create(path, geometry, sync),
            Err(e) => Err(StoreError::io(format!("opening {}", path.display()), e)),
        }
    }

    /// Opens the existing store file at `path`, taking the geometry from its header.
    ///
    /// Blocks on file I/O. Fails with [`StoreError::NotAStore`] if the file is not a blindfold
    /// cell file or is damaged, with [`StoreError::Io`] if there is no file.
    pub fn open_existing(path: impl AsRef<Path>, sync: SyncMode) -> Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| StoreError::io(format!("opening {}", path.display()), e))?;
        Self::check(file, path, None, sync)
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// When writes are made durable.
    pub fn sync_mode(&self) -> SyncMode {
        self.sync
    }

    /// The random id written into the header when the file was created; a copy of the file
    /// has the same id, a re-created file a new one.
    pub fn file_id(&self) -> [u8; 16] {
        self.file_id
    }

    fn create(path: &Path, geometry: Geometry, sync: SyncMode) -> Result<Self> {
        let io = |what: &str, e| StoreError::io(format!("{what} {}", path.display()), e);
        let file_name = path.file_name().ok_or_else(|| {
            StoreError::io(
                format!("creating {}", path.display()),
                std::io::Error::new(ErrorKind::InvalidInput, "the path names no file"),
            )
        })?;
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&dir).map_err(|e| io("creating the directory of", e))?;

        let mut rng = rand::thread_rng();
        let file_id: [u8; 16] = rng.gen();
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(file_name);
        tmp_name.push(format!(".tmp-{:016x}", rng.gen::<u64>()));
        let tmp = dir.join(tmp_name);

        let built = (|| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(|e| io("creating a temporary file for", e))?;
            let len = (HEADER_LEN as u64).checked_add(geometry.total_bytes()).ok_or_else(|| {
                StoreError::InvalidGeometry(format!("{geometry:?} is too large for one file"))
            })?;
            preallocate(&file, len).map_err(|e| io("preallocating", e))?;
            file.write_all_at(&encode_header(geometry, file_id), 0)
                .map_err(|e| io("writing the header of", e))?;
            file.sync_all().map_err(|e| io("syncing", e))?;
            Ok(file)
        })();
        let file = match built {
            Ok(file) => file,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };

        // A hard link never replaces an existing file: if another creator won the race, use
        // its file. Some file systems have no hard links; there a rename does (and may replace
        // a file created at the same instant, which is as good as either creator winning).
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => {
                let _ = std::fs::remove_file(&tmp);
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                drop(file);
                let _ = std::fs::remove_file(&tmp);
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(|e| io("opening", e))?;
                return Self::check(file, path, Some(geometry), sync);
            }
            Err(_) => {
                if let Err(e) = std::fs::rename(&tmp, path) {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(io("moving a new store file into place at", e));
                }
            }
        }
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("syncing the directory of", e))?;
        lock(&file, path)?;
        tracing::debug!(path = %path.display(), ?geometry, "created store file");
        Ok(Self { path: path.to_path_buf(), geometry, sync, file_id, file: Arc::new(file) })
    }

    fn check(file: File, path: &Path, wanted: Option<Geometry>, sync: SyncMode) -> Result<Self> {
        let not_a_store =
            |reason: String| StoreError::NotAStore { path: path.to_path_buf(), reason };
        lock(&file, path)?;
        let len = file
            .metadata()
            .map_err(|e| StoreError::io(format!("reading metadata of {}", path.display()), e))?
            .len();
        if len < HEADER_LEN as u64 {
            return Err(not_a_store(format!(
                "it is {len} bytes long, shorter than the {HEADER_LEN}-byte header"
            )));
        }
        let mut header = [0u8; HEADER_LEN];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| StoreError::io(format!("reading the header of {}", path.display()), e))?;
        let (found, file_id) = decode_header(&header).map_err(not_a_store)?;
        if let Some(wanted) = wanted {
            if wanted != found {
                return Err(StoreError::GeometryMismatch {
                    path: path.to_path_buf(),
                    found_cells: found.cell_count(),
                    found_size: found.cell_size(),
                    wanted_cells: wanted.cell_count(),
                    wanted_size: wanted.cell_size(),
                });
            }
        }
        let needed = (HEADER_LEN as u64).saturating_add(found.total_bytes());
        if len < needed {
            return Err(not_a_store(format!(
                "it is {len} bytes long, but its header describes {} cells of {} bytes, which \
                 need {needed} bytes: the file was truncated",
                found.cell_count(),
                found.cell_size()
            )));
        }
        Ok(Self { path: path.to_path_buf(), geometry: found, sync, file_id, file: Arc::new(file) })
    }

    fn offset(&self, cell: CellId) -> u64 {
        HEADER_LEN as u64 + cell.0 * u64::from(self.geometry.cell_size())
    }

    /// Runs `f` on the file in tokio's blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&File) -> std::io::Result<T> + Send + 'static,
        context: impl FnOnce() -> String,
    ) -> Result<T> {
        let file = Arc::clone(&self.file);
        match tokio::task::spawn_blocking(move || f(&file)).await {
            Ok(result) => result.map_err(|e| StoreError::io(context(), e)),
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(join) => Err(StoreError::io(
                context(),
                std::io::Error::new(ErrorKind::Interrupted, join.to_string()),
            )),
        }
    }
}

/// Takes an exclusive advisory lock on `file`, waiting up to [`LOCK_WAIT`] for another handle.
fn lock(file: &File, path: &Path) -> Result<()> {
    use rustix::fs::{flock, FlockOperation};
    let start = Instant::now();
    loop {
        match flock(file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
                if start.elapsed() >= LOCK_WAIT {
                    return Err(StoreError::InUse { path: path.to_path_buf() });
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) if e == rustix::io::Errno::INTR => {}
            Err(e) => {
                return Err(StoreError::io(format!("locking {}", path.display()), e.into()));
            }
        }
    }
}

/// Reserves `len` bytes of disk for `file` (and sets its length), falling back to a sparse
/// file where the file system cannot preallocate.
fn preallocate(file: &File, len: u64) -> std::io::Result<()> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        use rustix::fs::{fallocate, FallocateFlags};
        use rustix::io::Errno;
        match fallocate(file, FallocateFlags::empty(), 0, len) {
            Ok(()) => return Ok(()),
            Err(e) if e == Errno::OPNOTSUPP || e == Errno::NOSYS || e == Errno::INVAL => {
                tracing::debug!("cannot preallocate ({e}); the store file will be sparse");
            }
            Err(e) => return Err(e.into()),
        }
    }
    file.set_len(len)
}

fn checksum(header: &[u8; HEADER_LEN]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header[..CHECKSUM_AT]);
    hasher.update(&header[CHECKSUM_AT + 4..]);
    hasher.finalize()
}

fn encode_header(geometry: Geometry, file_id: [u8; 16]) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..16].copy_from_slice(&MAGIC);
    h[16..20].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[20..24].copy_from_slice(&geometry.cell_size().to_le_bytes());
    h[24..32].copy_from_slice(&geometry.cell_count().to_le_bytes());
    h[32..48].copy_from_slice(&file_id);
    let crc = checksum(&h);
    h[CHECKSUM_AT..CHECKSUM_AT + 4].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The geometry and file id in `h`, or why `h` is not a valid header.
fn decode_header(h: &[u8; HEADER_LEN]) -> std::result::Result<(Geometry, [u8; 16]), String> {
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
    if h[0..16] != MAGIC {
        return Err("it does not start with the blindfold cell-file magic bytes".into());
    }
    let stored = u32_at(CHECKSUM_AT);
    let computed = checksum(h);
    if stored != computed {
        return Err(format!(
            "the header checksum does not match (stored {stored:08x}, computed {computed:08x}): \
             the header is damaged"
        ));
    }
    let version = u32_at(16);
    if version != FORMAT_VERSION {
        return Err(format!(
            "it has format version {version}; this build reads version {FORMAT_VERSION}"
        ));
    }
    let cell_size = u32_at(20);
    let cell_count = u64::from_le_bytes(h[24..32].try_into().unwrap());
    let geometry = Geometry::new(cell_count, cell_size)
        .map_err(|e| format!("its header holds an impossible shape: {e}"))?;
    Ok((geometry, h[32..48].try_into().unwrap()))
}

/// Longest run of adjacent cells read or written with one system call.
const MAX_RUN_BYTES: usize = 1 << 20;

/// Splits cell offsets, in request order, into runs of adjacent cells (each starting where
/// the one before it ends), at most [`MAX_RUN_BYTES`] long: `(offset, cells)` pairs. A node of
/// a tree is usually stored in adjacent cells, so an eviction's hundreds of cells take a few
/// system calls instead of one each.
fn runs(offsets: impl Iterator<Item = u64>, size: usize) -> Vec<(u64, usize)> {
    let most = (MAX_RUN_BYTES / size.max(1)).max(1);
    let mut runs: Vec<(u64, usize)> = Vec::new();
    for at in offsets {
        match runs.last_mut() {
            Some((start, n)) if *n < most && *start + (*n * size) as u64 == at => *n += 1,
            _ => runs.push((at, 1)),
        }
    }
    runs
}

#[async_trait]
impl Store for FileStore {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        for &c in cells {
            self.geometry.check_cell(c)?;
        }
        if cells.is_empty() {
            return Ok(Vec::new());
        }
        let size = self.geometry.cell_size() as usize;
        let runs = runs(cells.iter().map(|&c| self.offset(c)), size);
        let read_all = move |file: &File| -> std::io::Result<Vec<Vec<u8>>> {
            let mut out = Vec::with_capacity(runs.iter().map(|r| r.1).sum());
            for (at, n) in runs {
                if n == 1 {
                    let mut buf = vec![0u8; size];
                    file.read_exact_at(&mut buf, at)?;
                    out.push(buf);
                } else {
                    let mut buf = vec![0u8; n * size];
                    file.read_exact_at(&mut buf, at)?;
                    out.extend(buf.chunks_exact(size).map(<[u8]>::to_vec));
                }
            }
            Ok(out)
        };
        let context = || format!("reading {} cells from {}", cells.len(), self.path.display());
        if cells.len().saturating_mul(size) <= INLINE_READ_BYTES {
            return read_all(&self.file).map_err(|e| StoreError::io(context(), e));
        }
        self.blocking(read_all, context).await
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        for r in ranges {
            self.geometry.check_range(r)?;
        }
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let jobs: Vec<(u64, usize)> = ranges
            .iter()
            .map(|r| (self.offset(r.cell) + u64::from(r.offset), r.len as usize))
            .collect();
        self.blocking(
            move |file| {
                jobs.into_iter()
                    .map(|(at, len)| {
                        let mut buf = vec![0u8; len];
                        file.read_exact_at(&mut buf, at)?;
                        Ok(buf)
                    })
                    .collect()
            },
            || format!("reading {} ranges from {}", ranges.len(), self.path.display()),
        )
        .await
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.write_cells(cells).await
    }

    async fn write_shared(&self, cells: Vec<(CellId, Arc<Vec<u8>>)>) -> Result<()> {
        self.write_cells(cells).await
    }

    async fn flush(&self) -> Result<()> {
        if self.sync == SyncMode::None {
            return Ok(());
        }
        self.blocking(|file| file.sync_data(), || format!("syncing {}", self.path.display())).await
    }
}

impl FileStore {
    /// Writes a batch from the caller's buffers, owned or shared (no copy but where runs of
    /// adjacent cells are joined into one write).
    async fn write_cells<B>(&self, cells: Vec<(CellId, B)>) -> Result<()>
    where
        B: AsRef<Vec<u8>> + Send + 'static,
    {
        for (c, data) in &cells {
            self.geometry.check_write(*c, data.as_ref())?;
        }
        if cells.is_empty() {
            return Ok(());
        }
        let count = cells.len();
        let size = self.geometry.cell_size() as usize;
        let runs = runs(cells.iter().map(|(c, _)| self.offset(*c)), size);
        let sync = self.sync == SyncMode::Always;
        self.blocking(
            move |file| {
                // Runs in order, so the last of duplicate cells wins (a run never holds a cell
                // twice: its offsets rise).
                let mut data = cells.into_iter().map(|(_, d)| d);
                let mut joined = Vec::new();
                for (at, n) in runs {
                    if n == 1 {
                        let one = data.next().expect("a cell per run entry");
                        file.write_all_at(one.as_ref(), at)?;
                    } else {
                        joined.clear();
                        data.by_ref().take(n).for_each(|d| joined.extend_from_slice(d.as_ref()));
                        file.write_all_at(&joined, at)?;
                    }
                }
                if sync {
                    file.sync_data()?;
                }
                Ok(())
            },
            || format!("writing {count} cells to {}", self.path.display()),
        )
        .await
    }
}
