//! A crash-consistent Path ORAM: trusted state in a local directory, made durable with a redo
//! log, so that a `kill -9` at any instant loses nothing that was committed.
//!
//! # How it stays consistent
//!
//! Accesses do not write the store directly. Each access still *reads* its whole path from the
//! store (so the store sees every read, exactly as with [`crate::SealedPathOram`]), but the
//! cells it would write are sealed into an in-memory *overlay*; later reads of those cells take
//! the overlay's copy. [`DurablePathOram::commit`] then:
//!
//! 1. appends one redo record — the sealed cells of the overlay with their versions, plus the
//!    [`OramDelta`] (changed position-map entries and the stash) — to `redo.log` and fsyncs it;
//! 2. writes the cells to the store and flushes the store;
//! 3. forgets the overlay.
//!
//! A crash before step 1 completes leaves a torn record (detected by its checksum and ignored):
//! the store was not touched, and the state is the previous commit. A crash after step 1
//! replays the record at the next start: writing the same sealed bytes again is idempotent.
//! Every so often the whole trusted state is written to `checkpoint.bin` (write, fsync,
//! rename) and the log is emptied; records up to the checkpoint's sequence number are skipped.
//!
//! # Security
//!
//! The store sees the same reads as with [`crate::SealedPathOram`]. Writes are deferred to the
//! commit and each dirty cell is written once per commit, so the store learns how many distinct
//! cells the paths since the last commit covered — a number that depends only on the random
//! leaves, not on which blocks were accessed — and when commits happen (which follows the
//! caller's request timing, already public).
//!
//! Key epochs: every start seals under an epoch no earlier run used (the checkpoint records the
//! next free one before anything is sealed), so random nonces are never reused under one key.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blindfold_crypto::{CellAd, CellSealer, MasterKey, StoreId};
use blindfold_oram::{BlockId, Op, OramDelta, PathOram, PathOramConfig, PathOramState, Progress};
use blindfold_store::{CellId, Store};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::path::{check_geometry, open_cells, seal_cells, with_retry, write_sealed, RetryPolicy};
use crate::{ProxyError, Result, SealedPathOram, VersionTable};

pub(crate) const CHECKPOINT: &str = "checkpoint.bin";
pub(crate) const REDO_LOG: &str = "redo.log";
const CHECKPOINT_MAGIC: &[u8; 8] = b"BFCKPT01";
const RECORD_MAGIC: u32 = 0xB1F0_0D01;
/// Write a checkpoint once the redo log is larger than this.
const DEFAULT_LOG_LIMIT: u64 = 256 << 20;
/// Commit by itself once this many cells wait in the overlay.
const DEFAULT_MAX_OVERLAY: usize = 4096;
const WRITE_BATCH: usize = 256;

#[derive(Serialize, Deserialize)]
struct Checkpoint {
    store_id: [u8; 16],
    oram: PathOramState,
    versions: VersionTable,
    /// First key epoch no run has sealed with.
    next_epoch: u32,
    /// Sequence number of the last redo record folded into this checkpoint.
    seq: u64,
}

#[derive(Serialize, Deserialize)]
struct Record {
    seq: u64,
    /// Highest key epoch sealed with so far.
    epoch_high: u32,
    delta: OramDelta,
    cells: Vec<LoggedCell>,
}

/// One sealed cell of a redo record. Encodes exactly as the tuple `(u64, u64, Vec<u8>)` of
/// earlier versions did; `serde_bytes` only makes the bytes serialize in one piece.
#[derive(Serialize, Deserialize)]
pub(crate) struct LoggedCell {
    pub(crate) cell: u64,
    pub(crate) version: u64,
    #[serde(with = "serde_bytes")]
    pub(crate) sealed: Vec<u8>,
}

/// Writes `cells` to the store in batches of [`WRITE_BATCH`], moving rather than copying them.
pub(crate) async fn write_batches(
    store: &dyn Store,
    retry: RetryPolicy,
    cells: impl IntoIterator<Item = (CellId, Vec<u8>)>,
) -> Result<()> {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    for cell in cells {
        batch.push(cell);
        if batch.len() == WRITE_BATCH {
            write_sealed(store, retry, std::mem::take(&mut batch)).await?;
        }
    }
    write_sealed(store, retry, batch).await
}

/// What [`DurablePathOram::open`] found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Redo records replayed.
    pub replayed: u64,
    /// Cells rewritten while replaying.
    pub cells_rewritten: u64,
    /// Bytes of a torn final record that was discarded.
    pub torn_bytes: u64,
}

/// Result of [`DurablePathOram::verify`].
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    /// Cells read and authenticated.
    pub cells_checked: u64,
    /// Cells never written (nothing to check).
    pub never_written: u64,
    /// Cells that failed authentication, with the error.
    pub failures: Vec<(u64, String)>,
}

/// Path ORAM whose trusted state survives crashes; see the module documentation.
pub struct DurablePathOram {
    oram: PathOram,
    store: Arc<dyn Store>,
    sealer: CellSealer,
    store_id: StoreId,
    versions: VersionTable,
    overlay: HashMap<u64, Vec<u8>>,
    dir: PathBuf,
    log: File,
    log_bytes: u64,
    seq: u64,
    next_epoch: u32,
    log_limit: u64,
    max_overlay: usize,
    retry: RetryPolicy,
    poisoned: bool,
}

impl std::fmt::Debug for DurablePathOram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurablePathOram")
            .field("dir", &self.dir)
            .field("oram", &self.oram)
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

pub(crate) fn io(path: &Path, what: &str, e: std::io::Error) -> ProxyError {
    ProxyError::State(format!("{what} {}: {e}", path.display()))
}

/// Makes `dir` ready to hold a new engine's trusted state: creates it, and refuses one that
/// already holds a checkpoint.
pub(crate) fn prepare_new_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io(dir, "creating", e))?;
    if dir.join(CHECKPOINT).exists() {
        return Err(ProxyError::State(format!(
            "{} already holds an ORAM; open it instead",
            dir.display()
        )));
    }
    Ok(())
}

/// Opens `dir/redo.log` for appending, emptied (its records are in the checkpoint just
/// written), with the emptying and the directory made durable.
pub(crate) fn open_empty_log(dir: &Path) -> Result<File> {
    let log_path = dir.join(REDO_LOG);
    // Append mode: every write lands at the end, also after the log is emptied again.
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| io(&log_path, "opening", e))?;
    empty_log(&log, dir)?;
    sync_dir(dir)?;
    Ok(log)
}

/// Empties the redo log `log` of `dir` and makes that durable.
pub(crate) fn empty_log(log: &File, dir: &Path) -> Result<()> {
    log.set_len(0).and_then(|_| log.sync_all()).map_err(|e| io(&dir.join(REDO_LOG), "emptying", e))
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io(dir, "syncing directory", e))
}

fn write_checkpoint(dir: &Path, ckpt: &Checkpoint) -> Result<()> {
    write_checkpoint_as(dir, CHECKPOINT_MAGIC, ckpt)
}

/// Writes `ckpt` to `dir/checkpoint.bin` atomically (temporary file, fsync, rename, directory
/// fsync), framed by `magic`, its length and a CRC.
pub(crate) fn write_checkpoint_as<T: Serialize>(
    dir: &Path,
    magic: &[u8; 8],
    ckpt: &T,
) -> Result<()> {
    let body = bincode::serialize(ckpt).map_err(|e| ProxyError::State(e.to_string()))?;
    let tmp = dir.join(format!("{CHECKPOINT}.tmp"));
    let mut f = File::create(&tmp).map_err(|e| io(&tmp, "creating", e))?;
    let mut head = Vec::with_capacity(20);
    head.extend_from_slice(magic);
    head.extend_from_slice(&(body.len() as u64).to_le_bytes());
    head.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    f.write_all(&head).and_then(|_| f.write_all(&body)).map_err(|e| io(&tmp, "writing", e))?;
    f.sync_all().map_err(|e| io(&tmp, "syncing", e))?;
    let path = dir.join(CHECKPOINT);
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, "renaming into", e))?;
    sync_dir(dir)
}

fn read_checkpoint(dir: &Path) -> Result<Checkpoint> {
    read_checkpoint_as(dir, CHECKPOINT_MAGIC)
}

/// Reads what [`write_checkpoint_as`] wrote with the same `magic`.
pub(crate) fn read_checkpoint_as<T: serde::de::DeserializeOwned>(
    dir: &Path,
    magic: &[u8; 8],
) -> Result<T> {
    let path = dir.join(CHECKPOINT);
    let mut buf = Vec::new();
    File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut buf))
        .map_err(|e| io(&path, "reading", e))?;
    let bad = |m: &str| ProxyError::State(format!("{}: {m}", path.display()));
    if buf.len() < 20 || &buf[..8] != magic {
        return Err(bad(&format!(
            "not a checkpoint of this engine (expected {:?})",
            String::from_utf8_lossy(magic)
        )));
    }
    let len = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes")) as usize;
    let crc = u32::from_le_bytes(buf[16..20].try_into().expect("4 bytes"));
    let body = buf.get(20..20 + len).ok_or_else(|| bad("truncated"))?;
    if crc32fast::hash(body) != crc {
        return Err(bad("checksum mismatch (damaged)"));
    }
    bincode::deserialize(body).map_err(|e| bad(&format!("cannot decode: {e}")))
}

fn read_log(path: &Path) -> Result<(Vec<Record>, u64, u64)> {
    read_log_as(path, RECORD_MAGIC)
}

/// Appends `record` to the redo log `log` (in `dir`), framed with `magic`, its length and a
/// CRC, and fsyncs it. Returns the bytes appended.
pub(crate) async fn append_record<T: Serialize>(
    log: &File,
    dir: &Path,
    magic: u32,
    record: &T,
) -> Result<u64> {
    // Serialize straight into the frame, leaving room for the header, so the (large) body is
    // not copied again.
    let size = bincode::serialized_size(record).map_err(|e| ProxyError::State(e.to_string()))?;
    let mut frame = Vec::with_capacity(16 + size as usize);
    frame.resize(16, 0);
    bincode::serialize_into(&mut frame, record).map_err(|e| ProxyError::State(e.to_string()))?;
    let crc = crc32fast::hash(&frame[16..]);
    frame[..4].copy_from_slice(&magic.to_le_bytes());
    frame[4..12].copy_from_slice(&size.to_le_bytes());
    frame[12..16].copy_from_slice(&crc.to_le_bytes());
    let log = log.try_clone().map_err(|e| io(dir, "cloning log handle", e))?;
    let path = dir.join(REDO_LOG);
    let len = frame.len() as u64;
    tokio::task::spawn_blocking(move || {
        let mut log = log;
        log.write_all(&frame)?;
        log.sync_data()
    })
    .await
    .map_err(|e| ProxyError::State(format!("log writer panicked: {e}")))?
    .map_err(|e| io(&path, "appending to", e))?;
    Ok(len)
}

/// Reads every complete record framed with `magic`; returns them, the bytes they take and the
/// number of bytes of a torn tail.
pub(crate) fn read_log_as<T: serde::de::DeserializeOwned>(
    path: &Path,
    magic: u32,
) -> Result<(Vec<T>, u64, u64)> {
    let mut buf = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut buf).map_err(|e| io(path, "reading", e))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(path, "opening", e)),
    }
    let mut records = Vec::new();
    let mut at = 0usize;
    while buf.len() - at >= 16 {
        let found = u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(buf[at + 4..at + 12].try_into().expect("8 bytes")) as usize;
        let crc = u32::from_le_bytes(buf[at + 12..at + 16].try_into().expect("4 bytes"));
        let Some(body) = buf.get(at + 16..at + 16 + len) else { break };
        if found != magic || crc32fast::hash(body) != crc {
            break;
        }
        let rec: T = bincode::deserialize(body)
            .map_err(|e| ProxyError::State(format!("{}: bad record: {e}", path.display())))?;
        records.push(rec);
        at += 16 + len;
    }
    Ok((records, at as u64, (buf.len() - at) as u64))
}

impl DurablePathOram {
    /// Creates a new, empty ORAM whose trusted state lives in `dir` (created if needed; must
    /// not already hold a checkpoint).
    pub async fn create(
        dir: &Path,
        config: PathOramConfig,
        store: Arc<dyn Store>,
        key: &MasterKey,
        store_id: StoreId,
    ) -> Result<Self> {
        prepare_new_dir(dir)?;
        let oram = PathOram::new(config);
        let ckpt = Checkpoint {
            store_id: store_id.0,
            oram: oram.export_state()?,
            versions: VersionTable::new(oram.config().total_cells()),
            next_epoch: 0,
            seq: 0,
        };
        write_checkpoint(dir, &ckpt)?;
        let _ = std::fs::remove_file(dir.join(REDO_LOG));
        Self::open(dir, store, key).await.map(|(o, _)| o)
    }

    /// Opens the ORAM in `dir`: loads the checkpoint, replays the redo log into the store and
    /// the state, and starts a fresh key epoch.
    pub async fn open(
        dir: &Path,
        store: Arc<dyn Store>,
        key: &MasterKey,
    ) -> Result<(Self, Recovery)> {
        let ckpt = read_checkpoint(dir)?;
        let store_id = StoreId(ckpt.store_id);
        let mut oram = PathOram::from_state(ckpt.oram, ChaCha20Rng::from_entropy())?;
        let mut versions = ckpt.versions;
        check_geometry(store.geometry(), SealedPathOram::geometry(oram.config())?)?;
        let log_path = dir.join(REDO_LOG);
        let (records, good_bytes, torn_bytes) = read_log(&log_path)?;
        let mut recovery = Recovery { torn_bytes, ..Recovery::default() };
        let mut seq = ckpt.seq;
        let mut next_epoch = ckpt.next_epoch;
        let retry = RetryPolicy::default();
        for rec in records {
            if rec.seq <= seq {
                continue;
            }
            recovery.cells_rewritten += rec.cells.len() as u64;
            let cells = rec.cells.into_iter().map(|c| {
                versions.record(c.cell, c.version, &c.sealed);
                (CellId(c.cell), c.sealed)
            });
            write_batches(&*store, retry, cells).await?;
            oram.apply_delta(rec.delta)?;
            next_epoch = next_epoch.max(rec.epoch_high.saturating_add(1));
            seq = rec.seq;
            recovery.replayed += 1;
        }
        if recovery.replayed > 0 {
            with_retry(retry, || store.flush()).await?;
        }
        // Reserve this run's epoch before sealing anything under it.
        let epoch = next_epoch;
        let sealer = CellSealer::new(key, store_id, epoch);
        let after = Checkpoint {
            store_id: store_id.0,
            oram: oram.export_state()?,
            versions,
            next_epoch: epoch
                .checked_add(1)
                .ok_or(ProxyError::State("key epochs exhausted".into()))?,
            seq,
        };
        if recovery.replayed > 0 || torn_bytes > 0 || good_bytes > 0 || ckpt.next_epoch <= epoch {
            write_checkpoint(dir, &after)?;
        }
        let log = open_empty_log(dir)?;
        let oram_state = after.oram;
        let oram = PathOram::from_state(oram_state, ChaCha20Rng::from_entropy())?;
        if recovery.replayed > 0 || recovery.torn_bytes > 0 {
            tracing::info!(
                replayed = recovery.replayed,
                cells = recovery.cells_rewritten,
                torn_bytes = recovery.torn_bytes,
                "recovered ORAM state from the redo log"
            );
        }
        Ok((
            Self {
                oram,
                store,
                sealer,
                store_id,
                versions: after.versions,
                overlay: HashMap::new(),
                dir: dir.to_path_buf(),
                log,
                log_bytes: 0,
                seq,
                next_epoch: after.next_epoch,
                log_limit: DEFAULT_LOG_LIMIT,
                max_overlay: DEFAULT_MAX_OVERLAY,
                retry,
                poisoned: false,
            },
            recovery,
        ))
    }

    /// Whether `dir` holds an ORAM created by [`DurablePathOram::create`].
    pub fn exists(dir: &Path) -> bool {
        dir.join(CHECKPOINT).exists()
    }

    /// Writes a checkpoint once the redo log exceeds `bytes` (default 256 MiB).
    pub fn set_log_limit(&mut self, bytes: u64) {
        self.log_limit = bytes;
    }

    /// Commits by itself once `cells` cells wait in the overlay (default 4096).
    pub fn set_max_overlay(&mut self, cells: usize) {
        self.max_overlay = cells.max(1);
    }

    /// The scheme (configuration, statistics).
    pub fn oram(&self) -> &PathOram {
        &self.oram
    }

    /// The store id bound into every seal.
    pub fn store_id(&self) -> StoreId {
        self.store_id
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Cells written since the last commit.
    pub fn pending_cells(&self) -> usize {
        self.overlay.len()
    }

    /// Bytes of trusted memory: the scheme's state, versions and the overlay.
    pub fn trusted_bytes(&self) -> u64 {
        self.oram.trusted_bytes()
            + self.versions.trusted_bytes()
            + self.overlay.values().map(|v| v.len() as u64).sum::<u64>()
    }

    /// Reads a block (zeros if never written).
    pub async fn read(&mut self, block: BlockId) -> Result<Vec<u8>> {
        self.access(block, Op::Read).await
    }

    /// Writes a block. Durable only after the next [`DurablePathOram::commit`].
    pub async fn write(&mut self, block: BlockId, data: Vec<u8>) -> Result<()> {
        self.access(block, Op::Write(data)).await.map(drop)
    }

    /// One logical access; returns the block's previous contents. Not durable until
    /// [`DurablePathOram::commit`] (which runs by itself when the overlay grows large).
    pub async fn access(&mut self, block: BlockId, op: Op) -> Result<Vec<u8>> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        self.access_prefetched(block, op, None).await
    }

    async fn access_prefetched(
        &mut self,
        block: BlockId,
        op: Op,
        prefetched: Option<&mut HashMap<u64, Vec<u8>>>,
    ) -> Result<Vec<u8>> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        let read = self.oram.start(block, op)?;
        let result = self.run(read, prefetched).await;
        let result = match result {
            Ok(data) => match self.oram.check_stash() {
                Ok(()) => Ok(data),
                Err(e) => Err(e.into()),
            },
            Err(e) => {
                self.oram.abort();
                self.poison(&e);
                return Err(e);
            }
        };
        if self.overlay.len() >= self.max_overlay {
            self.commit().await?;
        }
        result
    }

    /// Several accesses of **distinct** blocks. With the position map in memory, the paths of
    /// all of them are fetched in one storage request (the union of the paths, each cell once)
    /// and the accesses then run one after another on those cells, so a batch costs one round
    /// trip instead of one per block. The store sees one read of several independent uniformly
    /// random paths, as it would see them one at a time. With a recursive position map, or
    /// a batch that names a block twice, the accesses run one by one. Returns each block's
    /// previous contents.
    pub async fn access_many(&mut self, ops: Vec<(BlockId, Op)>) -> Result<Vec<Vec<u8>>> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        let mut ids: Vec<u64> = ops.iter().map(|o| o.0 .0).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut prefetched: Option<HashMap<u64, Vec<u8>>> = None;
        if ops.len() > 1 && ids.len() == ops.len() {
            let mut cells: Vec<CellId> = Vec::new();
            for (block, _) in &ops {
                match self.oram.upcoming_path(*block)? {
                    Some(path) => cells.extend(path),
                    None => {
                        cells.clear();
                        break;
                    }
                }
            }
            cells.sort_unstable();
            cells.dedup();
            if !cells.is_empty() {
                let store = Arc::clone(&self.store);
                let fetched = match with_retry(self.retry, || store.read(&cells)).await {
                    Ok(f) => f,
                    Err(e) => {
                        let e = ProxyError::from(e);
                        self.poison(&e);
                        return Err(e);
                    }
                };
                // A cell whose newest copy waits in the overlay is read (the store sees the
                // whole union) but its stale stored copy is dropped: should a commit in the
                // middle of the batch empty the overlay, that cell comes from the store again.
                prefetched = Some(
                    cells
                        .iter()
                        .map(|c| c.0)
                        .zip(fetched)
                        .filter(|(c, _)| !self.overlay.contains_key(c))
                        .collect(),
                );
            }
        }
        let mut out = Vec::with_capacity(ops.len());
        for (block, op) in ops {
            out.push(self.access_prefetched(block, op, prefetched.as_mut()).await?);
        }
        Ok(out)
    }

    fn poison(&mut self, e: &ProxyError) {
        self.poisoned = true;
        tracing::error!(error = %e, "ORAM failed part-way; refusing further accesses until restart");
    }

    async fn run(
        &mut self,
        mut read: Vec<CellId>,
        mut prefetched: Option<&mut HashMap<u64, Vec<u8>>>,
    ) -> Result<Vec<u8>> {
        let store = Arc::clone(&self.store);
        let retry = self.retry;
        loop {
            // The store sees every read, even of cells whose newest copy is in the overlay.
            // Cells fetched ahead by `access_many` are used at most once: an access writes back
            // every cell it read, so a later use finds the newer copy in the overlay (or, after
            // a commit emptied the overlay, in the store) — never the stale prefetched one.
            let ahead = match prefetched.as_deref_mut() {
                Some(p) => {
                    let covered = read
                        .iter()
                        .all(|c| p.contains_key(&c.0) || self.overlay.contains_key(&c.0));
                    let taken: Vec<Vec<u8>> =
                        read.iter().map(|c| p.remove(&c.0).unwrap_or_default()).collect();
                    covered.then_some(taken)
                }
                None => None,
            };
            let mut fetched = match ahead {
                Some(f) => f,
                None => with_retry(retry, || store.read(&read)).await?,
            };
            for (cell, buf) in read.iter().zip(fetched.iter_mut()) {
                if let Some(newer) = self.overlay.get(&cell.0) {
                    buf.clone_from(newer);
                }
            }
            let plain = open_cells(&self.sealer, &self.versions, &read, fetched)?;
            let (writes, next, done) = match self.oram.feed(plain)? {
                Progress::Continue { writes, read } => (writes, Some(read), None),
                Progress::Done { writes, data } => (writes, None, Some(data)),
            };
            for (cell, sealed) in seal_cells(&self.sealer, &mut self.versions, writes)? {
                self.overlay.insert(cell.0, sealed);
            }
            match (next, done) {
                (Some(n), _) => read = n,
                (None, Some(data)) => return Ok(data),
                (None, None) => unreachable!("progress is either more reads or done"),
            }
        }
    }

    /// Makes every access so far durable: logs the overlay and the state change, then writes
    /// the cells to the store. On return, a crash at any later instant loses none of it.
    pub async fn commit(&mut self) -> Result<()> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        let delta = self.oram.take_delta()?;
        if self.overlay.is_empty() && delta.top.is_empty() {
            return Ok(());
        }
        let mut cells: Vec<LoggedCell> = self
            .overlay
            .drain()
            .map(|(cell, sealed)| LoggedCell { cell, version: self.versions.get(cell), sealed })
            .collect();
        cells.sort_unstable_by_key(|c| c.cell);
        let record =
            Record { seq: self.seq + 1, epoch_high: self.sealer.current_epoch(), delta, cells };
        match self.log_and_apply(record).await {
            Ok(()) => {}
            Err(e) => {
                self.poison(&e);
                return Err(e);
            }
        }
        if self.log_bytes > self.log_limit {
            self.checkpoint()?;
        }
        Ok(())
    }

    async fn log_and_apply(&mut self, record: Record) -> Result<()> {
        let len = append_record(&self.log, &self.dir, RECORD_MAGIC, &record).await?;
        self.log_bytes += len;
        self.seq = record.seq;
        // Durable from here on: a crash now is repaired by replaying the record.
        let cells = record.cells.into_iter().map(|c| (CellId(c.cell), c.sealed));
        write_batches(&*self.store, self.retry, cells).await?;
        let store = Arc::clone(&self.store);
        with_retry(self.retry, || store.flush()).await?;
        Ok(())
    }

    /// Writes the whole trusted state to the checkpoint and empties the redo log. Only with
    /// nothing pending.
    pub fn checkpoint(&mut self) -> Result<()> {
        if !self.overlay.is_empty() {
            return Err(ProxyError::State("commit before checkpointing".into()));
        }
        let ckpt = Checkpoint {
            store_id: self.store_id.0,
            oram: self.oram.export_state()?,
            versions: self.versions.clone(),
            next_epoch: self.next_epoch.max(self.sealer.current_epoch().saturating_add(1)),
            seq: self.seq,
        };
        write_checkpoint(&self.dir, &ckpt)?;
        self.next_epoch = ckpt.next_epoch;
        empty_log(&self.log, &self.dir)?;
        self.log_bytes = 0;
        Ok(())
    }

    /// Reads every written cell of the store and authenticates it against the trusted versions.
    /// Commits first. `progress(done, total)` is called as it goes.
    pub async fn verify(&mut self, progress: impl FnMut(u64, u64)) -> Result<VerifyReport> {
        self.commit().await?;
        verify_cells(&*self.store, self.retry, &self.sealer, &self.versions, progress).await
    }
}

/// Reads every cell of `store` that `versions` says was written, 256 at a time, and
/// authenticates it under its trusted version; `progress(done, total)` is called as it goes.
pub(crate) async fn verify_cells(
    store: &dyn Store,
    retry: RetryPolicy,
    sealer: &CellSealer,
    versions: &VersionTable,
    mut progress: impl FnMut(u64, u64),
) -> Result<VerifyReport> {
    let total = versions.len();
    let mut report = VerifyReport::default();
    let batch = 256u64;
    let mut start = 0u64;
    while start < total {
        let cells: Vec<CellId> = (start..(start + batch).min(total)).map(CellId).collect();
        let fetched = with_retry(retry, || store.read(&cells)).await?;
        for (cell, mut buf) in cells.iter().zip(fetched) {
            let version = versions.get(cell.0);
            if version == 0 {
                report.never_written += 1;
                continue;
            }
            if let Err(e) = crate::path::check_epoch(cell.0, versions.epoch(cell.0), &buf) {
                report.failures.push((cell.0, format!("{e} (sealed under another key epoch)")));
                continue;
            }
            let ad = CellAd { cell: cell.0, version, segment: 0 };
            match sealer.open_in_place(&ad, &mut buf) {
                Ok(_) => report.cells_checked += 1,
                Err(e) => report.failures.push((cell.0, e.to_string())),
            }
        }
        start += batch;
        progress(start.min(total), total);
    }
    Ok(report)
}

// ---- For `rebuild` (recover): the saved state's parts, and a checkpoint of a rebuilt tree.
// Kept apart from open()/commit() on purpose; they only go through the checkpoint functions.

/// The parts of a [`DurablePathOram`] checkpoint that a rebuild needs.
pub(crate) struct SavedPathOram {
    pub(crate) store_id: StoreId,
    pub(crate) oram: PathOramState,
    pub(crate) versions: VersionTable,
    pub(crate) next_epoch: u32,
    pub(crate) seq: u64,
}

/// Reads the checkpoint in `dir` (the redo log is not looked at: a rebuild starts from a
/// restored snapshot, whose checkpoint has nothing left to replay).
pub(crate) fn load_saved_path_oram(dir: &Path) -> Result<SavedPathOram> {
    let c = read_checkpoint(dir)?;
    Ok(SavedPathOram {
        store_id: StoreId(c.store_id),
        oram: c.oram,
        versions: c.versions,
        next_epoch: c.next_epoch,
        seq: c.seq,
    })
}

/// Replaces the checkpoint in `dir` with `saved` (atomically) and removes any redo log.
pub(crate) fn save_rebuilt_path_oram(dir: &Path, saved: SavedPathOram) -> Result<()> {
    let ckpt = Checkpoint {
        store_id: saved.store_id.0,
        oram: saved.oram,
        versions: saved.versions,
        next_epoch: saved.next_epoch,
        seq: saved.seq,
    };
    remove_log(dir)?;
    write_checkpoint(dir, &ckpt)
}

/// Removes `dir/redo.log` if present.
pub(crate) fn remove_log(dir: &Path) -> Result<()> {
    let log = dir.join(REDO_LOG);
    match std::fs::remove_file(&log) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(&log, "removing", e)),
    }
}
