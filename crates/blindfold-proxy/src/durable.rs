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
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bincode::Options;
use blindfold_crypto::{CellAd, CellSealer, MasterKey, StateSealer, StoreId};
use blindfold_oram::{BlockId, Op, OramDelta, PathOram, PathOramConfig, PathOramState, Progress};
use blindfold_store::{CellId, Store};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::retry::{with_retry, write_sealed, RetryPolicy};
use crate::sealing::{check_geometry, open_cells, seal_cells};
use crate::slots::{slotted_geometry, SlotMap, SlottedStore};
use crate::{ProxyError, Result, SealedPathOram, VersionTable};

pub const CHECKPOINT: &str = "checkpoint.bin";
pub const REDO_LOG: &str = "redo.log";
/// Version 03 adds the slot map of two-slot stores (see [`crate::slots`]).
const CHECKPOINT_MAGIC: &[u8; 8] = b"BFCKPT03";
/// Sealed checkpoints of blindfold 0.2 (no slot map), migrated on open.
const PREV_CHECKPOINT_MAGIC: &[u8; 8] = b"BFCKPT02";
/// A commit of an in-place store: the cells' sealed contents travel in the record.
const RECORD_MAGIC: u32 = 0xB1F0_0D02;
/// A commit of a two-slot store: the cells are already in the store; the record names them.
const SLOT_RECORD_MAGIC: u32 = 0xB1F0_0D03;
const REVEAL_MAGIC: u32 = 0xB1F0_0E02;
/// Unsealed checkpoint and commit records of blindfold 0.1, migrated on open.
const LEGACY_CHECKPOINT_MAGIC: &[u8; 8] = b"BFCKPT01";
const LEGACY_RECORD_MAGIC: u32 = 0xB1F0_0D01;
/// Write a checkpoint once the redo log is larger than this.
const DEFAULT_LOG_LIMIT: u64 = 256 << 20;
/// Commit by itself once this many cells wait in the overlay.
const DEFAULT_MAX_OVERLAY: usize = 4096;
const WRITE_BATCH: usize = 256;
/// Batches of cells a commit, a replay, a rebuild or a whole-store read keeps in flight at once.
const BATCHES_IN_FLIGHT: usize = 8;
/// Bytes of cells a whole-store read (verify, recover, grow) keeps in flight at most.
const READ_AHEAD_BYTES: u64 = 64 << 20;

#[derive(Serialize, Deserialize)]
struct Checkpoint {
    store_id: [u8; 16],
    oram: PathOramState,
    versions: VersionTable,
    /// Which slot holds each cell, for a two-slot store; `None` for an in-place one.
    slots: Option<SlotMap>,
    /// First key epoch no run has sealed with.
    next_epoch: u32,
    /// Sequence number of the last redo record folded into this checkpoint.
    seq: u64,
}

/// A sealed checkpoint of blindfold 0.2 (in-place stores only).
#[derive(Deserialize)]
struct PrevCheckpoint {
    store_id: [u8; 16],
    oram: PathOramState,
    versions: VersionTable,
    next_epoch: u32,
    seq: u64,
}

/// A checkpoint as blindfold 0.1 wrote it (unsealed).
#[derive(Deserialize)]
struct LegacyCheckpoint {
    store_id: [u8; 16],
    oram: PathOramState,
    versions: LegacyVersions,
    next_epoch: u32,
    seq: u64,
}

/// A version table as blindfold 0.1 wrote it.
#[derive(Deserialize)]
pub(crate) struct LegacyVersions {
    pub(crate) versions: Vec<u64>,
}

#[derive(Serialize, Deserialize)]
struct Record {
    seq: u64,
    /// Highest key epoch sealed with so far.
    epoch_high: u32,
    delta: OramDelta,
    cells: Vec<LoggedCell>,
}

/// A commit of a two-slot store: every cell written since the previous commit, with the version
/// and key epoch it was sealed under and the slot it now occupies. The cells themselves were
/// written to the store and flushed before this record was logged.
#[derive(Serialize, Deserialize)]
struct SlotRecord {
    seq: u64,
    /// Highest key epoch sealed with so far.
    epoch_high: u32,
    delta: OramDelta,
    cells: Vec<SlotCell>,
}

/// One cell of a [`SlotRecord`].
#[derive(Serialize, Deserialize)]
pub(crate) struct SlotCell {
    pub(crate) cell: u64,
    pub(crate) version: u64,
    pub(crate) epoch: u32,
    pub(crate) slot: u8,
}

/// Applies the cells of a replayed [`SlotRecord`] to the trusted versions and slot map,
/// checking each against them (the record comes from the data directory). `slot_of` gives the
/// slot-map entry of a cell: itself, or its group in a packed store ([`crate::Packing`]).
pub(crate) fn apply_slot_cells(
    cells: &[SlotCell],
    versions: &mut VersionTable,
    slots: &mut SlotMap,
    slot_of: impl Fn(u64) -> u64,
) -> std::result::Result<(), String> {
    for c in cells {
        if c.cell >= versions.len() || c.slot > 1 {
            return Err(format!("cell {} or slot {} out of range", c.cell, c.slot));
        }
        let entry = slot_of(c.cell);
        if entry >= slots.len() {
            return Err(format!("cell {} out of the slot map", c.cell));
        }
        versions.set(c.cell, c.version);
        versions.set_epoch(c.cell, c.epoch);
        slots.set(entry, c.slot);
    }
    Ok(())
}

/// The commit-record cells of the pending writes (`cell`, its new slot), with their trusted
/// versions and epochs.
pub(crate) fn pending_slot_cells(
    pending: Vec<(u64, u8)>,
    versions: &VersionTable,
) -> Vec<SlotCell> {
    pending
        .into_iter()
        .map(|(cell, slot)| SlotCell {
            cell,
            version: versions.get(cell),
            epoch: versions.epoch(cell),
            slot,
        })
        .collect()
}

/// Logged before the paths of a batch of accesses are read: the seed the accesses draw their
/// leaves from and the blocks they access, in order. Replaying the batch from the committed
/// state with the same seed repeats exactly the same reads and ends with every block on the
/// same fresh, never revealed leaf (see [`DurablePathOram::open`]).
#[derive(Serialize, Deserialize)]
struct Reveal {
    /// Sequence number of the commit this batch follows.
    after: u64,
    seed: [u8; 32],
    blocks: Vec<u64>,
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

/// Writes `cells` to the store in batches of [`WRITE_BATCH`], up to [`BATCHES_IN_FLIGHT`] of
/// them in flight at once, moving rather than copying the cells. Behind a link of round trip
/// `r` this takes about `r · ⌈n / (WRITE_BATCH · BATCHES_IN_FLIGHT)⌉` instead of
/// `r · ⌈n / WRITE_BATCH⌉`. A cell named twice is written once, with its last contents (two
/// concurrent writes of one cell could land in either order).
pub(crate) async fn write_batches(
    store: &dyn Store,
    retry: RetryPolicy,
    cells: impl IntoIterator<Item = (CellId, Vec<u8>)>,
) -> Result<()> {
    use futures::{StreamExt, TryStreamExt};
    let mut cells: Vec<(CellId, Vec<u8>)> = cells.into_iter().collect();
    let mut last: HashMap<u64, usize> = HashMap::with_capacity(cells.len());
    for (i, (c, _)) in cells.iter().enumerate() {
        last.insert(c.0, i);
    }
    if last.len() < cells.len() {
        let mut i = 0;
        cells.retain(|(c, _)| {
            let keep = last[&c.0] == i;
            i += 1;
            keep
        });
    }
    let mut batches = Vec::with_capacity(cells.len().div_ceil(WRITE_BATCH));
    while cells.len() > WRITE_BATCH {
        let rest = cells.split_off(WRITE_BATCH);
        batches.push(std::mem::replace(&mut cells, rest));
    }
    batches.push(cells);
    futures::stream::iter(batches)
        .map(|batch| write_sealed(store, retry, batch))
        .buffer_unordered(BATCHES_IN_FLIGHT)
        .try_collect::<()>()
        .await
}

/// Reads cells `0..total` of `store` in order, `batch` at a time, with several reads in flight
/// (as many as fit in [`READ_AHEAD_BYTES`], at most [`BATCHES_IN_FLIGHT`]); yields each
/// batch's first cell and contents, in order. What `verify` and `recover` read through.
pub(crate) fn read_in_order(
    store: &dyn Store,
    retry: RetryPolicy,
    total: u64,
    batch: u64,
) -> impl futures::Stream<Item = Result<(u64, Vec<Vec<u8>>)>> + '_ {
    read_batches(store, retry, total, batch, |from, to| (from..to).map(CellId).collect())
}

/// As [`read_in_order`], for the cells `cells` (in that order): yields each batch's first
/// index into `cells` and the batch's contents.
pub(crate) fn read_listed<'a>(
    store: &'a dyn Store,
    retry: RetryPolicy,
    cells: &'a [CellId],
    batch: u64,
) -> impl futures::Stream<Item = Result<(u64, Vec<Vec<u8>>)>> + 'a {
    read_batches(store, retry, cells.len() as u64, batch, |from, to| {
        cells[from as usize..to as usize].to_vec()
    })
}

/// Reads `total` cells in batches of `batch`, batch `[from, to)` being `cells(from, to)`, in
/// order with reads ahead (see [`read_in_order`]).
fn read_batches<'a>(
    store: &'a dyn Store,
    retry: RetryPolicy,
    total: u64,
    batch: u64,
    cells: impl Fn(u64, u64) -> Vec<CellId> + Copy + 'a,
) -> impl futures::Stream<Item = Result<(u64, Vec<Vec<u8>>)>> + 'a {
    use futures::StreamExt;
    let batch = batch.max(1);
    let bytes = batch.saturating_mul(u64::from(store.geometry().cell_size()).max(1));
    let ahead = (READ_AHEAD_BYTES / bytes).clamp(1, BATCHES_IN_FLIGHT as u64) as usize;
    futures::stream::iter((0..total).step_by(batch as usize))
        .map(move |start| async move {
            let cells = cells(start, (start + batch).min(total));
            let fetched = with_retry(retry, || store.read(&cells)).await?;
            if fetched.len() != cells.len() {
                return Err(ProxyError::State(format!(
                    "the store answered {} cells for {}",
                    fetched.len(),
                    cells.len()
                )));
            }
            Ok((start, fetched))
        })
        .buffered(ahead)
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
    /// Block accesses repeated from the log because the last run revealed their paths
    /// without committing (each such block now sits on a fresh leaf).
    pub reaccessed: u64,
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
    /// The store the engine reads and writes: `slotted` if the store has two slots per cell.
    store: Arc<dyn Store>,
    slotted: Option<Arc<SlottedStore>>,
    sealer: CellSealer,
    /// Seals the checkpoint and the redo log.
    state_sealer: StateSealer,
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
    /// Whether accesses log their reveals (off while replaying logged ones).
    journal: bool,
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

/// Largest redo record or checkpoint body accepted from the data directory (1 TiB): a length
/// field above it is damage, never an allocation request.
const MAX_FRAME: u64 = 1 << 40;

/// Creates `path` for writing, private to the owner (mode 0600), truncating it.
pub(crate) fn create_private(path: &Path) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)
}

/// Makes `dir` (created if missing) and every file directly in it private to the owner: the
/// directory 0700, files 0600 (subdirectories are not touched). Returns one warning per path whose mode had to be tightened.
pub fn make_private(dir: &Path) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| io(dir, "creating", e))?;
        }
        let mut tighten = |path: &Path, want: u32| -> Result<()> {
            let meta = std::fs::symlink_metadata(path).map_err(|e| io(path, "inspecting", e))?;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(want))
                    .map_err(|e| io(path, "restricting the mode of", e))?;
                warnings.push(format!(
                    "{} was readable by others (mode {mode:o}); restricted to {want:o}",
                    path.display()
                ));
            }
            Ok(())
        };
        tighten(dir, 0o700)?;
        for entry in std::fs::read_dir(dir).map_err(|e| io(dir, "listing", e))? {
            let entry = entry.map_err(|e| io(dir, "listing", e))?;
            let kind = entry.file_type().map_err(|e| io(&entry.path(), "inspecting", e))?;
            // Subdirectories are left to their owners (the ORAM state directory makes itself
            // private; a `cells` directory of the file store holds only sealed cells).
            if kind.is_file() {
                tighten(&entry.path(), 0o600)?;
            }
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir).map_err(|e| io(dir, "creating", e))?;
    Ok(warnings)
}

/// Makes `dir` ready to hold a new engine's trusted state: creates it (private), and refuses
/// one that already holds a checkpoint.
pub(crate) fn prepare_new_dir(dir: &Path) -> Result<()> {
    make_private(dir)?;
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
    let log = open_log(dir)?;
    empty_log(&log, dir)?;
    sync_dir(dir)?;
    Ok(log)
}

/// Opens `dir/redo.log` for appending (mode 0600), keeping what it holds.
pub fn open_log(dir: &Path) -> Result<File> {
    let log_path = dir.join(REDO_LOG);
    // Append mode: every write lands at the end, also after the log is emptied again.
    let mut o = OpenOptions::new();
    o.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(&log_path).map_err(|e| io(&log_path, "opening", e))
}

/// Replaces `dir/redo.log` atomically by a log holding exactly `frames` (already encoded), and
/// returns it opened for appending. Used at start-up to keep the reveal records of the last
/// window while dropping everything the new checkpoint covers.
pub(crate) fn replace_log(dir: &Path, frames: &[Vec<u8>]) -> Result<File> {
    if frames.is_empty() {
        return open_empty_log(dir);
    }
    let tmp = dir.join(format!("{REDO_LOG}.tmp"));
    let mut f = create_private(&tmp).map_err(|e| io(&tmp, "creating", e))?;
    for frame in frames {
        f.write_all(frame).map_err(|e| io(&tmp, "writing", e))?;
    }
    f.sync_all().map_err(|e| io(&tmp, "syncing", e))?;
    let path = dir.join(REDO_LOG);
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, "renaming into", e))?;
    sync_dir(dir)?;
    open_log(dir)
}

/// Empties the redo log `log` of `dir` and makes that durable.
pub fn empty_log(log: &File, dir: &Path) -> Result<()> {
    log.set_len(0).and_then(|_| log.sync_all()).map_err(|e| io(&dir.join(REDO_LOG), "emptying", e))
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io(dir, "syncing directory", e))
}

fn write_checkpoint(dir: &Path, ckpt: &Checkpoint, sealer: &StateSealer) -> Result<()> {
    write_checkpoint_as(dir, CHECKPOINT_MAGIC, ckpt, sealer)
}

/// Writes `ckpt` to `dir/checkpoint.bin` atomically (temporary file with mode 0600, fsync,
/// rename, directory fsync), sealed under the state key and framed by `magic`, its length and
/// a CRC (the CRC tells a torn write from tampering).
pub fn write_checkpoint_as<T: Serialize>(
    dir: &Path,
    magic: &[u8; 8],
    ckpt: &T,
    sealer: &StateSealer,
) -> Result<()> {
    let plain = bincode::serialize(ckpt).map_err(|e| ProxyError::State(e.to_string()))?;
    let body = sealer.seal(magic, &plain).map_err(ProxyError::Crypto)?;
    drop(plain);
    let tmp = dir.join(format!("{CHECKPOINT}.tmp"));
    let mut f = create_private(&tmp).map_err(|e| io(&tmp, "creating", e))?;
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

/// Decodes checkpoint file bytes (see [`write_checkpoint_as`]); hostile input gives an error
/// message, never a panic or an allocation larger than the input.
pub fn decode_checkpoint<T: serde::de::DeserializeOwned>(
    buf: &[u8],
    magic: &[u8; 8],
    sealer: &StateSealer,
) -> std::result::Result<T, String> {
    let body = checkpoint_body(buf, magic)?;
    let plain = sealer.open(magic, body).map_err(|_| {
        "does not authenticate: damaged, or sealed with another key (is this the data \
         directory's own key file?)"
            .to_string()
    })?;
    decode_bounded(&plain).map_err(|e| format!("cannot decode: {e}"))
}

/// The body of checkpoint file bytes framed by `magic`, its length and its CRC (sealed or,
/// from an earlier version, not); the length is checked against the bytes present.
fn checkpoint_body<'a>(buf: &'a [u8], magic: &[u8; 8]) -> std::result::Result<&'a [u8], String> {
    if buf.len() < 20 || &buf[..8] != magic {
        return Err(format!(
            "not a checkpoint of this engine (expected {:?})",
            String::from_utf8_lossy(magic)
        ));
    }
    let len = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(buf[16..20].try_into().expect("4 bytes"));
    let body = usize::try_from(len)
        .ok()
        .and_then(|len| buf.get(20..20usize.checked_add(len)?))
        .ok_or("truncated")?;
    if crc32fast::hash(body) != crc {
        return Err("checksum mismatch (damaged)".into());
    }
    Ok(body)
}

/// Decodes `bytes` as bincode (the encoding of `bincode::serialize`), allocating no more than
/// the input could hold.
fn decode_bounded<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> bincode::Result<T> {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(bytes.len() as u64)
        .deserialize(bytes)
}

/// The error of a start-up replay of logged reveals that could not complete. The engine
/// must not serve until it does (serving would bring blocks back on revealed leaves), so the
/// start fails, saying why and what to do.
pub(crate) fn replay_failed(e: ProxyError) -> ProxyError {
    match e {
        ProxyError::Integrity { cell, source } => {
            tracing::error!(
                cell,
                "the store's copy of a cell that the start-up replay must read is damaged"
            );
            ProxyError::Integrity { cell, source }
        }
        other => ProxyError::State(format!(
            "repeating the accesses the last run revealed but did not commit failed ({other}); \
             nothing was lost: fix the cause (is the store reachable?) and start again, or run \
             `blindfold verify`"
        )),
    }
}

/// The checkpoint of `dir`, sealed or (migrating) unsealed from an earlier version; the
/// second value says whether it was the latter.
fn load_checkpoint(dir: &Path, sealer: &StateSealer) -> Result<(Checkpoint, bool)> {
    if let Some(prev) = read_prev_checkpoint::<PrevCheckpoint>(dir, PREV_CHECKPOINT_MAGIC, sealer)?
    {
        return Ok((
            Checkpoint {
                store_id: prev.store_id,
                oram: prev.oram,
                versions: prev.versions,
                slots: None,
                next_epoch: prev.next_epoch,
                seq: prev.seq,
            },
            true,
        ));
    }
    read_any_checkpoint(
        dir,
        CHECKPOINT_MAGIC,
        LEGACY_CHECKPOINT_MAGIC,
        sealer,
        |old: LegacyCheckpoint| Checkpoint {
            store_id: old.store_id,
            oram: old.oram,
            versions: VersionTable::from_legacy(old.versions.versions),
            slots: None,
            next_epoch: old.next_epoch,
            seq: old.seq,
        },
    )
}

/// The checkpoint of `dir` if it is a sealed one of the previous format (`magic`), to be
/// converted by the caller and rewritten in the current format; `None` if it is not.
pub(crate) fn read_prev_checkpoint<T: serde::de::DeserializeOwned>(
    dir: &Path,
    magic: &[u8; 8],
    sealer: &StateSealer,
) -> Result<Option<T>> {
    let path = dir.join(CHECKPOINT);
    let mut head = [0u8; 8];
    let is_prev = File::open(&path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .map(|()| &head == magic)
        .unwrap_or(false);
    if !is_prev {
        return Ok(None);
    }
    let buf = std::fs::read(&path).map_err(|e| io(&path, "reading", e))?;
    let old = decode_checkpoint(&buf, magic, sealer)
        .map_err(|m| ProxyError::State(format!("{}: {m}", path.display())))?;
    tracing::info!(
        path = %path.display(),
        "checkpoint of an earlier version: it is rewritten in the current format now"
    );
    Ok(Some(old))
}

/// Decodes an unsealed checkpoint of blindfold 0.1 before its state was sealed (`magic`,
/// length, CRC, bincode body), to migrate it: the caller rewrites it sealed at once.
pub(crate) fn decode_legacy_checkpoint<T: serde::de::DeserializeOwned>(
    buf: &[u8],
    magic: &[u8; 8],
) -> std::result::Result<T, String> {
    let body = checkpoint_body(buf, magic)?;
    decode_bounded(body).map_err(|e| format!("cannot decode: {e}"))
}

/// The checkpoint of `dir` decoded as `T` (sealed, `magic`) or, from an older version, as
/// `L` (unsealed, `legacy`) and converted; the second value says whether it was the latter.
pub(crate) fn read_any_checkpoint<T, L>(
    dir: &Path,
    magic: &[u8; 8],
    legacy: &[u8; 8],
    sealer: &StateSealer,
    convert: impl FnOnce(L) -> T,
) -> Result<(T, bool)>
where
    T: serde::de::DeserializeOwned,
    L: serde::de::DeserializeOwned,
{
    let path = dir.join(CHECKPOINT);
    let buf = std::fs::read(&path).map_err(|e| io(&path, "reading", e))?;
    let bad = |m: String| ProxyError::State(format!("{}: {m}", path.display()));
    if buf.len() >= 8 && &buf[..8] == legacy {
        let old: L = decode_legacy_checkpoint(&buf, legacy).map_err(bad)?;
        tracing::warn!(
            path = %path.display(),
            "migrating an unsealed checkpoint of an earlier version: it is rewritten sealed now"
        );
        return Ok((convert(old), true));
    }
    decode_checkpoint(&buf, magic, sealer).map(|c| (c, false)).map_err(bad)
}

/// One frame of the redo log: its magic and its opened body.
pub struct Frame {
    /// What kind of record it is.
    pub magic: u32,
    /// The opened (plaintext) record.
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The body derives from user data and the access pattern: never printed.
        f.debug_struct("Frame").field("magic", &self.magic).field("len", &self.body.len()).finish()
    }
}

/// Bytes before a redo-log frame's body: magic (4), body length (8), CRC of the body (4).
const FRAME_HEADER: usize = 16;

/// Encodes `record` as one sealed redo-log frame: magic, length and CRC of the sealed body,
/// then the body (the record sealed under the state key, bound to its magic).
///
/// The record is serialized straight into the frame and sealed there, in place: a commit's
/// record can hold megabytes of pinned cells.
pub fn encode_frame<T: Serialize>(magic: u32, record: &T, sealer: &StateSealer) -> Result<Vec<u8>> {
    let size = bincode::serialized_size(record).map_err(|e| ProxyError::State(e.to_string()))?;
    let size = usize::try_from(size).map_err(|_| ProxyError::State("record too large".into()))?;
    let mut frame = Vec::with_capacity(FRAME_HEADER + size + StateSealer::OVERHEAD);
    // Header and nonce, filled in below.
    frame.resize(FRAME_HEADER + StateSealer::NONCE_LEN, 0);
    bincode::serialize_into(&mut frame, record).map_err(|e| ProxyError::State(e.to_string()))?;
    sealer.seal_into(&magic.to_le_bytes(), &mut frame, FRAME_HEADER).map_err(ProxyError::Crypto)?;
    let body_len = (frame.len() - FRAME_HEADER) as u64;
    let crc = crc32fast::hash(&frame[FRAME_HEADER..]);
    frame[..4].copy_from_slice(&magic.to_le_bytes());
    frame[4..12].copy_from_slice(&body_len.to_le_bytes());
    frame[12..16].copy_from_slice(&crc.to_le_bytes());
    Ok(frame)
}

/// Appends already encoded `frame` to the redo log `log` (in `dir`) and fsyncs it. Returns the
/// bytes appended.
pub async fn append_frame(log: &File, dir: &Path, frame: Vec<u8>) -> Result<u64> {
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

/// Appends `record` to the redo log `log` (in `dir`) as one sealed frame with `magic`, and
/// fsyncs it. Returns the bytes appended.
pub async fn append_record<T: Serialize>(
    log: &File,
    dir: &Path,
    magic: u32,
    record: &T,
    sealer: &StateSealer,
) -> Result<u64> {
    let frame = encode_frame(magic, record, sealer)?;
    append_frame(log, dir, frame).await
}

/// Reads every complete frame of the redo log at `path` whose magic is one of `magics`, and
/// opens it, or takes it as it is if its magic is in `plain` (unsealed records of an earlier
/// version, replayed once while migrating); returns them, the bytes they take and the number
/// of bytes of a torn tail (a frame cut short, or with a bad checksum, ends the log: it was
/// being written at a crash). A complete sealed frame that does not authenticate is an error:
/// the log was altered, or belongs to another key.
pub fn read_frames_with_legacy(
    path: &Path,
    magics: &[u32],
    plain: &[u32],
    sealer: &StateSealer,
) -> Result<(Vec<Frame>, u64, u64)> {
    let buf = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(path, "reading", e)),
    };
    decode_frames(&buf, magics, plain, sealer)
        .map_err(|m| ProxyError::State(format!("{}: {m}", path.display())))
}

/// Decodes redo-log bytes (see [`read_frames_with_legacy`]); hostile input gives an error message, never
/// a panic or an allocation larger than the input.
pub(crate) fn decode_frames(
    buf: &[u8],
    magics: &[u32],
    plain: &[u32],
    sealer: &StateSealer,
) -> std::result::Result<(Vec<Frame>, u64, u64), String> {
    let mut frames = Vec::new();
    let mut at = 0usize;
    while buf.len() - at >= FRAME_HEADER {
        let found = u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(buf[at + 4..at + 12].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(buf[at + 12..at + 16].try_into().expect("4 bytes"));
        if len > MAX_FRAME {
            break;
        }
        let start = at + FRAME_HEADER;
        let Some(body) = start.checked_add(len as usize).and_then(|end| buf.get(start..end)) else {
            break;
        };
        let sealed = magics.contains(&found);
        if !(sealed || plain.contains(&found)) || crc32fast::hash(body) != crc {
            break;
        }
        let opened = if sealed {
            sealer.open(&found.to_le_bytes(), body).map_err(|_| {
                format!(
                    "the redo record at byte {at} does not authenticate: damaged, or sealed \
                     with another key"
                )
            })?
        } else {
            body.to_vec()
        };
        frames.push(Frame { magic: found, body: opened });
        at += FRAME_HEADER + len as usize;
    }
    Ok((frames, at as u64, (buf.len() - at) as u64))
}

/// Decodes one opened frame body as a `T`, bounded by the body's size.
pub fn decode_record<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> std::result::Result<T, String> {
    decode_bounded(body).map_err(|e| format!("bad redo record: {e}"))
}

impl DurablePathOram {
    /// Creates a new, empty ORAM whose trusted state lives in `dir` (created if needed, mode
    /// 0700; must not already hold a checkpoint).
    ///
    /// The store's shape chooses how commits are made durable: a store of
    /// [`DurablePathOram::geometry`] (two slots per cell) takes each commit's cells in the
    /// slots not holding the committed copies and the redo log only names them; a store of
    /// [`SealedPathOram::geometry`] (one copy per cell, as directories made before two slots
    /// existed) is overwritten in place, so the redo log carries every cell first.
    pub async fn create(
        dir: &Path,
        config: PathOramConfig,
        store: Arc<dyn Store>,
        key: &MasterKey,
        store_id: StoreId,
    ) -> Result<Self> {
        prepare_new_dir(dir)?;
        let oram = PathOram::new(config);
        let cells = oram.config().total_cells();
        let two_slots = store.geometry() == Self::geometry(oram.config())?;
        let ckpt = Checkpoint {
            store_id: store_id.0,
            oram: oram.export_state()?,
            versions: VersionTable::new(cells),
            slots: two_slots.then(|| SlotMap::new(cells)),
            next_epoch: 0,
            seq: 0,
        };
        write_checkpoint(dir, &ckpt, &StateSealer::new(key))?;
        let _ = std::fs::remove_file(dir.join(REDO_LOG));
        Self::open(dir, store, key).await.map(|(o, _)| o)
    }

    /// Opens the ORAM in `dir`: loads the checkpoint, replays the redo log into the store and
    /// the state, and starts a fresh key epoch. If the last run revealed paths it did not
    /// commit (it crashed, or stopped poisoned), those accesses are first repeated from the
    /// committed state with their logged seeds — the store sees exactly the reads it saw
    /// before — and committed, so every block they touched ends on a leaf never revealed.
    pub async fn open(
        dir: &Path,
        store: Arc<dyn Store>,
        key: &MasterKey,
    ) -> Result<(Self, Recovery)> {
        Self::open_rotating(dir, store, key, None).await
    }

    /// As [`DurablePathOram::open`], in the middle of a key rotation: what was sealed under
    /// `previous` (cells, checkpoint, redo log) still opens, while everything sealed from now
    /// on is sealed under `key`. A [`DurablePathOram::sweep`] over every path, then a commit,
    /// leaves nothing under `previous`.
    pub async fn open_rotating(
        dir: &Path,
        store: Arc<dyn Store>,
        key: &MasterKey,
        previous: Option<&MasterKey>,
    ) -> Result<(Self, Recovery)> {
        let state_sealer = StateSealer::with_keys(key, previous);
        let (ckpt, migrating) = load_checkpoint(dir, &state_sealer)?;
        let store_id = StoreId(ckpt.store_id);
        let mut oram = PathOram::from_state(ckpt.oram, ChaCha20Rng::from_entropy())?;
        let mut versions = ckpt.versions;
        let mut slots = ckpt.slots;
        let logical = SealedPathOram::geometry(oram.config())?;
        match &slots {
            Some(map) => {
                check_geometry(store.geometry(), slotted_geometry(logical)?)?;
                if map.len() != versions.len() {
                    return Err(ProxyError::State(format!(
                        "{}: slot map of {} cells for {} cells",
                        dir.join(CHECKPOINT).display(),
                        map.len(),
                        versions.len()
                    )));
                }
            }
            None => check_geometry(store.geometry(), logical)?,
        }
        let log_path = dir.join(REDO_LOG);
        let (frames, good_bytes, torn_bytes) = read_frames_with_legacy(
            &log_path,
            &[RECORD_MAGIC, SLOT_RECORD_MAGIC, REVEAL_MAGIC],
            &[LEGACY_RECORD_MAGIC],
            &state_sealer,
        )?;
        let mut recovery = Recovery { torn_bytes, ..Recovery::default() };
        let mut seq = ckpt.seq;
        let mut next_epoch = ckpt.next_epoch;
        let retry = RetryPolicy::default();
        let bad = |m: String| ProxyError::State(format!("{}: {m}", log_path.display()));
        let mut reveals: Vec<Reveal> = Vec::new();
        for frame in frames {
            if frame.magic == REVEAL_MAGIC {
                reveals.push(decode_record(&frame.body).map_err(bad)?);
                continue;
            }
            if frame.magic == SLOT_RECORD_MAGIC {
                let rec: SlotRecord = decode_record(&frame.body).map_err(bad)?;
                if rec.seq <= seq {
                    continue;
                }
                let map = slots
                    .as_mut()
                    .ok_or_else(|| bad("two-slot redo record for an in-place store".into()))?;
                apply_slot_cells(&rec.cells, &mut versions, map, |c| c)
                    .map_err(|m| bad(format!("redo record: {m}")))?;
                oram.apply_delta(rec.delta)?;
                next_epoch = next_epoch.max(rec.epoch_high.saturating_add(1));
                seq = rec.seq;
                recovery.replayed += 1;
                continue;
            }
            if slots.is_some() {
                return Err(bad("in-place redo record for a two-slot store".into()));
            }
            let rec: Record = decode_record(&frame.body).map_err(bad)?;
            if rec.seq <= seq {
                continue;
            }
            recovery.cells_rewritten += rec.cells.len() as u64;
            for c in &rec.cells {
                if c.cell >= versions.len() {
                    return Err(bad("redo record: cell out of range".into()));
                }
            }
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
        // Only the batches logged after the last commit revealed paths that the committed
        // state does not account for.
        reveals.retain(|r| r.after == seq);
        if recovery.replayed > 0 {
            with_retry(retry, || store.flush()).await?;
        }
        // Reserve this run's epoch before sealing anything under it.
        let epoch = next_epoch;
        let sealer = cell_sealer(key, previous, store_id, epoch);
        let after = Checkpoint {
            store_id: store_id.0,
            oram: oram.export_state()?,
            versions,
            slots,
            next_epoch: epoch
                .checked_add(1)
                .ok_or(ProxyError::State("key epochs exhausted".into()))?,
            seq,
        };
        if migrating
            || recovery.replayed > 0
            || torn_bytes > 0
            || good_bytes > 0
            || ckpt.next_epoch <= epoch
        {
            write_checkpoint(dir, &after, &state_sealer)?;
        }
        // The reveals stay logged until the commit that accounts for them is durable.
        let kept: Vec<Vec<u8>> = reveals
            .iter()
            .map(|r| encode_frame(REVEAL_MAGIC, r, &state_sealer))
            .collect::<Result<_>>()?;
        let log = replace_log(dir, &kept)?;
        let log_bytes = kept.iter().map(|f| f.len() as u64).sum();
        let oram_state = after.oram;
        let oram = PathOram::from_state(oram_state, ChaCha20Rng::from_entropy())?;
        let slotted = match after.slots {
            Some(map) => Some(Arc::new(SlottedStore::new(Arc::clone(&store), map)?)),
            None => None,
        };
        let store = match &slotted {
            Some(s) => Arc::clone(s) as Arc<dyn Store>,
            None => store,
        };
        let mut this = Self {
            oram,
            store,
            slotted,
            sealer,
            state_sealer,
            store_id,
            versions: after.versions,
            overlay: HashMap::new(),
            dir: dir.to_path_buf(),
            log,
            log_bytes,
            seq,
            next_epoch: after.next_epoch,
            log_limit: DEFAULT_LOG_LIMIT,
            max_overlay: DEFAULT_MAX_OVERLAY,
            retry,
            poisoned: false,
            journal: false,
        };
        let replay = async {
            for r in reveals {
                recovery.reaccessed += r.blocks.len() as u64;
                this.oram.reseed(r.seed);
                let ops = r.blocks.into_iter().map(|b| (BlockId(b), Op::Read)).collect();
                this.batch(ops).await?;
            }
            if recovery.reaccessed > 0 {
                this.commit().await?;
            }
            Ok(())
        };
        replay.await.map_err(replay_failed)?;
        this.journal = true;
        if recovery.replayed > 0 || recovery.torn_bytes > 0 || recovery.reaccessed > 0 {
            tracing::info!(
                replayed = recovery.replayed,
                cells = recovery.cells_rewritten,
                torn_bytes = recovery.torn_bytes,
                reaccessed = recovery.reaccessed,
                "recovered ORAM state from the redo log"
            );
        }
        Ok((this, recovery))
    }

    /// Whether `dir` holds an ORAM created by [`DurablePathOram::create`].
    pub fn exists(dir: &Path) -> bool {
        dir.join(CHECKPOINT).exists()
    }

    /// The store shape of a new engine of `config`: two slots per cell (see
    /// [`crate::slots`]), so commits never overwrite committed cells and the redo log carries
    /// no cell contents.
    pub fn geometry(config: &PathOramConfig) -> Result<blindfold_store::Geometry> {
        slotted_geometry(SealedPathOram::geometry(config)?)
    }

    /// Whether the store holds two slots per cell (else commits overwrite it in place).
    pub fn two_slots(&self) -> bool {
        self.slotted.is_some()
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
            + self.slotted.as_ref().map_or(0, |s| s.trusted_bytes())
            + self.overlay.values().map(|v| v.len() as u64).sum::<u64>()
    }

    /// Blocks whose current path crosses one of the cells `bad` (which, while those cells are
    /// damaged, cannot be read), sorted; `None` with a recursive position map (the map itself
    /// lives in the damaged tree). Blocks in the stash are not among them.
    pub fn blocks_through(&self, bad: &[u64]) -> Option<Vec<u64>> {
        let config = self.oram.config();
        if config.trees().len() != 1 {
            return None;
        }
        let tree = config.trees()[0];
        let state = self.oram.export_state().ok()?;
        let stash: std::collections::HashSet<u64> =
            state.stashes.first().into_iter().flatten().map(|e| e.0).collect();
        let bad: std::collections::HashSet<u64> = bad.iter().copied().collect();
        let shape = tree.shape;
        let mut out: Vec<u64> = state
            .top
            .iter()
            .enumerate()
            .filter(|(id, &v)| {
                v > 0
                    && !stash.contains(&(*id as u64))
                    && (0..shape.levels()).any(|l| {
                        let b = shape.bucket_on_path(blindfold_oram::Leaf(u64::from(v - 1)), l);
                        bad.contains(&(tree.base + b.0))
                    })
            })
            .map(|(id, _)| id as u64)
            .collect();
        out.sort_unstable();
        Some(out)
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
        let mut out = self.access_many(vec![(block, op)]).await?;
        Ok(out.pop().expect("one access, one result"))
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
        match self.run(read, prefetched).await {
            Ok(data) => match self.oram.check_stash() {
                Ok(()) => Ok(data),
                Err(e) => Err(e.into()),
            },
            Err(e) => {
                self.oram.abort();
                self.poison(&e);
                Err(e)
            }
        }
    }

    /// Several accesses of **distinct** blocks. With the position map in memory, the paths of
    /// all of them are fetched in one storage request (the union of the paths, each cell once)
    /// and the accesses then run one after another on those cells, so a batch costs one round
    /// trip instead of one per block. The store sees one read of several independent uniformly
    /// random paths, as it would see them one at a time. With a recursive position map, or
    /// a batch that names a block twice, the accesses run one by one. Returns each block's
    /// previous contents.
    ///
    /// Before any path is read, the batch's blocks and the seed its leaves are drawn from are
    /// appended to the redo log (one fsync per batch), so that a crash or a poisoning cannot
    /// bring these blocks back on the leaves the store is about to see: the next
    /// [`DurablePathOram::open`] repeats the batch and commits it.
    pub async fn access_many(&mut self, ops: Vec<(BlockId, Op)>) -> Result<Vec<Vec<u8>>> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        if ops.is_empty() {
            return Ok(Vec::new());
        }
        // Refuse invalid accesses before logging them: a logged batch is repeated at every
        // start until committed, so it must be one that can run.
        let config = self.oram.config();
        for (block, op) in &ops {
            if block.0 >= config.blocks() {
                return Err(blindfold_oram::OramError::BlockOutOfRange {
                    block: block.0,
                    blocks: config.blocks(),
                }
                .into());
            }
            if let Op::Write(d) = op {
                if d.len() != config.block_size() as usize {
                    return Err(blindfold_oram::OramError::WrongBlockSize {
                        got: d.len(),
                        expected: config.block_size(),
                    }
                    .into());
                }
            }
        }
        if self.journal {
            let mut seed = [0u8; 32];
            rand::rngs::OsRng.fill_bytes(&mut seed);
            let reveal =
                Reveal { after: self.seq, seed, blocks: ops.iter().map(|o| o.0 .0).collect() };
            match append_record(&self.log, &self.dir, REVEAL_MAGIC, &reveal, &self.state_sealer)
                .await
            {
                Ok(len) => self.log_bytes += len,
                Err(e) => {
                    self.poison(&e);
                    return Err(e);
                }
            }
            self.oram.reseed(seed);
        }
        let out = self.batch(ops).await;
        // Commit only between batches: a batch's reveal record must stay after the last
        // commit until all of its accesses are committed.
        if self.overlay.len() >= self.max_overlay && !self.poisoned {
            self.commit().await?;
        }
        out
    }

    /// The accesses of one batch, without logging them.
    async fn batch(&mut self, ops: Vec<(BlockId, Op)>) -> Result<Vec<Vec<u8>>> {
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

    /// Paths a sweep covers ([`PathOram::sweep_paths`]): every leaf of every tree.
    pub fn sweep_paths(&self) -> u64 {
        self.oram.sweep_paths()
    }

    /// Reads and writes back the sweep's paths `range` (see [`PathOram::start_sweep`]),
    /// re-sealing every cell on them under the current key; durable after the next
    /// [`DurablePathOram::commit`]. Call it between accesses: it reveals no block's leaf, so
    /// nothing is logged before its reads.
    pub async fn sweep(&mut self, range: std::ops::Range<u64>) -> Result<()> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        for index in range {
            let read = self.oram.start_sweep(index)?;
            if let Err(e) = self.run(read, None).await {
                self.oram.abort();
                self.poison(&e);
                return Err(e);
            }
        }
        if self.overlay.len() >= self.max_overlay {
            self.commit().await?;
        }
        Ok(())
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
        if let Some(slotted) = self.slotted.clone() {
            if let Err(e) = self.commit_slotted(&slotted, delta).await {
                self.poison(&e);
                return Err(e);
            }
            if self.log_bytes > self.log_limit {
                self.checkpoint()?;
            }
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

    /// A commit of a two-slot store: the dirty cells go to their free slots and are flushed;
    /// then the record naming them is logged; only then do they become the committed copies.
    async fn commit_slotted(&mut self, slotted: &SlottedStore, delta: OramDelta) -> Result<()> {
        let mut cells: Vec<(CellId, Vec<u8>)> =
            self.overlay.drain().map(|(c, sealed)| (CellId(c), sealed)).collect();
        cells.sort_unstable_by_key(|c| c.0);
        write_batches(&*self.store, self.retry, cells).await?;
        let store = Arc::clone(&self.store);
        with_retry(self.retry, || store.flush()).await?;
        let record = SlotRecord {
            seq: self.seq + 1,
            epoch_high: self.sealer.current_epoch(),
            delta,
            cells: pending_slot_cells(slotted.pending(), &self.versions),
        };
        let len =
            append_record(&self.log, &self.dir, SLOT_RECORD_MAGIC, &record, &self.state_sealer)
                .await?;
        // Durable from here on: the record says where every cell's newest copy is.
        self.log_bytes += len;
        self.seq = record.seq;
        slotted.publish();
        Ok(())
    }

    async fn log_and_apply(&mut self, record: Record) -> Result<()> {
        let len =
            append_record(&self.log, &self.dir, RECORD_MAGIC, &record, &self.state_sealer).await?;
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
            slots: self.slotted.as_ref().map(|s| s.map()),
            next_epoch: self.next_epoch.max(self.sealer.current_epoch().saturating_add(1)),
            seq: self.seq,
        };
        write_checkpoint(&self.dir, &ckpt, &self.state_sealer)?;
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

/// Reads every cell of `store` that `versions` says was written, 256 at a time with several
/// batches in flight, and authenticates it under its trusted version; `progress(done, total)`
/// is called as it goes.
pub(crate) async fn verify_cells(
    store: &dyn Store,
    retry: RetryPolicy,
    sealer: &CellSealer,
    versions: &VersionTable,
    mut progress: impl FnMut(u64, u64),
) -> Result<VerifyReport> {
    use futures::StreamExt;
    let total = versions.len();
    let mut report = VerifyReport::default();
    let mut reads = std::pin::pin!(read_in_order(store, retry, total, 256));
    while let Some(read) = reads.next().await {
        let (start, fetched) = read?;
        let end = start + fetched.len() as u64;
        for (cell, mut buf) in (start..end).zip(fetched) {
            let version = versions.get(cell);
            if version == 0 {
                report.never_written += 1;
                continue;
            }
            if let Err(e) = crate::sealing::check_epoch(cell, versions.epoch(cell), &buf) {
                report.failures.push((cell, format!("{e} (sealed under another key epoch)")));
                continue;
            }
            let ad = CellAd { cell, version, segment: 0 };
            match sealer.open_in_place(&ad, &mut buf) {
                Ok(_) => report.cells_checked += 1,
                Err(e) => report.failures.push((cell, e.to_string())),
            }
        }
        progress(end, total);
    }
    Ok(report)
}

#[cfg(test)]
mod hostile_input {
    //! The redo log and the checkpoint are read back from disk: random and mutated bytes must
    //! give an error (or a shorter log), never a panic or a huge allocation. Cases per property:
    //! `BLINDFOLD_FUZZ_CASES` (default 256; the longer run in docs/testing.md uses 100000).
    use proptest::prelude::*;

    use super::*;

    fn cases() -> u32 {
        std::env::var("BLINDFOLD_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    }

    fn sealer() -> StateSealer {
        StateSealer::new(&MasterKey::from_bytes([7; 32]))
    }

    fn valid_log(s: &StateSealer) -> Vec<u8> {
        let reveal = Reveal { after: 3, seed: [1; 32], blocks: vec![1, 2, 3] };
        let record = Record {
            seq: 4,
            epoch_high: 2,
            delta: OramDelta::default(),
            cells: vec![LoggedCell { cell: 1, version: 2, sealed: vec![9; 40] }],
        };
        let mut log = encode_frame(REVEAL_MAGIC, &reveal, s).unwrap();
        log.extend(encode_frame(RECORD_MAGIC, &record, s).unwrap());
        log
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn random_log_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_frames(&bytes, &[RECORD_MAGIC, REVEAL_MAGIC], &[LEGACY_RECORD_MAGIC], &sealer());
        }

        #[test]
        fn mutated_log(at in any::<usize>(), xor in 1u8.., cut in any::<usize>()) {
            let s = sealer();
            let mut log = valid_log(&s);
            let i = at % log.len();
            log[i] ^= xor;
            log.truncate(cut % (log.len() + 1));
            if let Ok((frames, good, torn)) = decode_frames(&log, &[RECORD_MAGIC, REVEAL_MAGIC], &[LEGACY_RECORD_MAGIC], &s) {
                prop_assert_eq!(good + torn, log.len() as u64);
                for f in frames {
                    if f.magic == REVEAL_MAGIC {
                        let _ = decode_record::<Reveal>(&f.body);
                    } else {
                        let _ = decode_record::<Record>(&f.body);
                    }
                }
            }
        }

        #[test]
        fn random_record_bodies(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_record::<Record>(&bytes);
            let _ = decode_record::<SlotRecord>(&bytes);
            let _ = decode_record::<Reveal>(&bytes);
        }

        #[test]
        fn mutated_checkpoint(at in any::<usize>(), xor in 1u8.., cut in any::<usize>()) {
            let s = sealer();
            let dir = tempfile::tempdir().unwrap();
            let oram = PathOram::new(PathOramConfig::builder(16, 8).build().unwrap());
            let ckpt = Checkpoint {
                store_id: [0; 16],
                oram: oram.export_state().unwrap(),
                versions: VersionTable::new(oram.config().total_cells()),
                slots: Some(SlotMap::new(oram.config().total_cells())),
                next_epoch: 1,
                seq: 0,
            };
            write_checkpoint(dir.path(), &ckpt, &s).unwrap();
            let mut bytes = std::fs::read(dir.path().join(CHECKPOINT)).unwrap();
            let i = at % bytes.len();
            bytes[i] ^= xor;
            bytes.truncate(cut % (bytes.len() + 1));
            prop_assert!(decode_checkpoint::<Checkpoint>(&bytes, CHECKPOINT_MAGIC, &s).is_err());
        }

        #[test]
        fn random_checkpoint_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            prop_assert!(decode_checkpoint::<Checkpoint>(&bytes, CHECKPOINT_MAGIC, &sealer()).is_err());
        }
    }

    #[tokio::test]
    async fn invalid_accesses_are_refused_before_they_are_logged() {
        let key = MasterKey::from_bytes([3; 32]);
        let dir = tempfile::tempdir().unwrap();
        let config = PathOramConfig::builder(16, 8).build().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(blindfold_store::MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
        let mut o =
            DurablePathOram::create(dir.path(), config, store.clone(), &key, StoreId::random())
                .await
                .unwrap();
        assert!(o.read(BlockId(16)).await.is_err());
        assert!(o.write(BlockId(1), vec![0; 7]).await.is_err());
        drop(o);
        // Nothing was logged that the next start would have to (and could not) repeat.
        let (_, rec) = DurablePathOram::open(dir.path(), store, &key).await.unwrap();
        assert_eq!(rec.reaccessed, 0);
    }

    #[test]
    fn huge_length_fields_do_not_allocate() {
        // A frame header claiming an enormous body ends the log; it is never allocated.
        let mut log = Vec::new();
        log.extend_from_slice(&RECORD_MAGIC.to_le_bytes());
        log.extend_from_slice(&u64::MAX.to_le_bytes());
        log.extend_from_slice(&0u32.to_le_bytes());
        let (frames, good, torn) = decode_frames(&log, &[RECORD_MAGIC], &[], &sealer()).unwrap();
        assert!(frames.is_empty());
        assert_eq!((good, torn), (0, 16));
        let mut ckpt = CHECKPOINT_MAGIC.to_vec();
        ckpt.extend_from_slice(&u64::MAX.to_le_bytes());
        ckpt.extend_from_slice(&[0; 4]);
        assert!(decode_checkpoint::<Checkpoint>(&ckpt, CHECKPOINT_MAGIC, &sealer()).is_err());
    }
}

#[cfg(test)]
mod migration {
    //! Data directories written before the state was sealed open, are replayed and are
    //! rewritten sealed.
    use super::*;
    use blindfold_store::MemoryStore;

    fn legacy_frame<T: Serialize>(magic: &[u8], body: &T) -> Vec<u8> {
        let body = bincode::serialize(body).unwrap();
        let mut out = magic.to_vec();
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    #[tokio::test]
    async fn unsealed_state_of_an_earlier_version_is_migrated() {
        let key = MasterKey::generate();
        let s = StateSealer::new(&key);
        let dir = tempfile::tempdir().unwrap();
        let config = PathOramConfig::builder(32, 16).cache_levels(1).build().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
        {
            let mut o =
                DurablePathOram::create(dir.path(), config, store.clone(), &key, StoreId::random())
                    .await
                    .unwrap();
            for i in 0..32u8 {
                o.write(BlockId(u64::from(i)), vec![i; 16]).await.unwrap();
            }
            o.commit().await.unwrap();
            o.checkpoint().unwrap();
            o.write(BlockId(3), vec![33; 16]).await.unwrap();
            o.commit().await.unwrap();
        }
        // Rewrite both files the way blindfold 0.1 wrote them: unsealed, without reveals.
        let ckpt_path = dir.path().join(CHECKPOINT);
        let ckpt: Checkpoint =
            decode_checkpoint(&std::fs::read(&ckpt_path).unwrap(), CHECKPOINT_MAGIC, &s).unwrap();
        std::fs::write(&ckpt_path, legacy_frame(LEGACY_CHECKPOINT_MAGIC, &ckpt)).unwrap();
        let log_path = dir.path().join(REDO_LOG);
        let (frames, _, _) = decode_frames(
            &std::fs::read(&log_path).unwrap(),
            &[RECORD_MAGIC, REVEAL_MAGIC],
            &[],
            &s,
        )
        .unwrap();
        let mut log = Vec::new();
        for f in frames.iter().filter(|f| f.magic == RECORD_MAGIC) {
            let rec: Record = decode_record(&f.body).unwrap();
            log.extend(legacy_frame(&LEGACY_RECORD_MAGIC.to_le_bytes(), &rec));
        }
        assert!(!log.is_empty());
        std::fs::write(&log_path, log).unwrap();

        let (mut o, rec) = DurablePathOram::open(dir.path(), store, &key).await.unwrap();
        assert_eq!(rec.replayed, 1, "the unsealed commit record is replayed");
        for i in 0..32u8 {
            let want = if i == 3 { vec![33; 16] } else { vec![i; 16] };
            assert_eq!(o.read(BlockId(u64::from(i))).await.unwrap(), want);
        }
        let bytes = std::fs::read(&ckpt_path).unwrap();
        assert_eq!(&bytes[..8], CHECKPOINT_MAGIC, "rewritten sealed");
    }

    /// A sealed checkpoint of blindfold 0.2 (no slot map) opens as an in-place store, its
    /// redo log replays, and it is rewritten in the current format.
    #[tokio::test]
    async fn sealed_checkpoint_without_slot_map_is_migrated() {
        let key = MasterKey::generate();
        let s = StateSealer::new(&key);
        let dir = tempfile::tempdir().unwrap();
        let config = PathOramConfig::builder(32, 16).build().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
        {
            let mut o =
                DurablePathOram::create(dir.path(), config, store.clone(), &key, StoreId::random())
                    .await
                    .unwrap();
            for i in 0..32u8 {
                o.write(BlockId(u64::from(i)), vec![i; 16]).await.unwrap();
            }
            o.commit().await.unwrap();
            o.checkpoint().unwrap();
            o.write(BlockId(5), vec![55; 16]).await.unwrap();
            o.commit().await.unwrap();
        }
        let ckpt_path = dir.path().join(CHECKPOINT);
        let c: Checkpoint =
            decode_checkpoint(&std::fs::read(&ckpt_path).unwrap(), CHECKPOINT_MAGIC, &s).unwrap();
        assert!(c.slots.is_none());
        // The 0.2 layout: the same fields without the slot map.
        let prev = (c.store_id, c.oram, c.versions, c.next_epoch, c.seq);
        write_checkpoint_as(dir.path(), PREV_CHECKPOINT_MAGIC, &prev, &s).unwrap();
        let (mut o, rec) = DurablePathOram::open(dir.path(), store, &key).await.unwrap();
        assert_eq!(rec.replayed, 1);
        assert!(!o.two_slots());
        for i in 0..32u8 {
            let want = if i == 5 { vec![55; 16] } else { vec![i; 16] };
            assert_eq!(o.read(BlockId(u64::from(i))).await.unwrap(), want);
        }
        let bytes = std::fs::read(&ckpt_path).unwrap();
        assert_eq!(&bytes[..8], CHECKPOINT_MAGIC, "rewritten in the current format");
    }
}

// ---- For `rebuild` (recover): the saved state's parts, and a checkpoint of a rebuilt tree.
// Kept apart from open()/commit() on purpose; they only go through the checkpoint functions.

/// The parts of a [`DurablePathOram`] checkpoint that a rebuild needs.
pub(crate) struct SavedPathOram {
    pub(crate) store_id: StoreId,
    pub(crate) oram: PathOramState,
    pub(crate) versions: VersionTable,
    pub(crate) slots: Option<SlotMap>,
    pub(crate) next_epoch: u32,
    pub(crate) seq: u64,
}

/// Reads the checkpoint in `dir` (the redo log is not looked at: a rebuild starts from a
/// restored snapshot, whose checkpoint has nothing left to replay).
pub(crate) fn load_saved_path_oram(dir: &Path, key: &MasterKey) -> Result<SavedPathOram> {
    let (c, _) = load_checkpoint(dir, &StateSealer::new(key))?;
    Ok(SavedPathOram {
        store_id: StoreId(c.store_id),
        oram: c.oram,
        versions: c.versions,
        slots: c.slots,
        next_epoch: c.next_epoch,
        seq: c.seq,
    })
}

/// Replaces the checkpoint in `dir` with `saved` (atomically) and removes any redo log.
pub(crate) fn save_rebuilt_path_oram(
    dir: &Path,
    saved: SavedPathOram,
    key: &MasterKey,
) -> Result<()> {
    let ckpt = Checkpoint {
        store_id: saved.store_id.0,
        oram: saved.oram,
        versions: saved.versions,
        slots: saved.slots,
        next_epoch: saved.next_epoch,
        seq: saved.seq,
    };
    remove_log(dir)?;
    write_checkpoint(dir, &ckpt, &StateSealer::new(key))
}

/// The cell sealer of a run: sealing under `key` from `epoch` on, and opening what
/// `previous` (a key being rotated out) sealed too.
pub(crate) fn cell_sealer(
    key: &MasterKey,
    previous: Option<&MasterKey>,
    store_id: StoreId,
    epoch: u32,
) -> CellSealer {
    let sealer = CellSealer::new(key, store_id, epoch);
    match previous {
        Some(p) => sealer.with_previous_key(p),
        None => sealer,
    }
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

#[cfg(test)]
mod write_batches_tests {
    //! [`write_batches`] keeps several batches in flight: every cell must still land once,
    //! with its last contents.
    use super::*;
    use blindfold_store::{Geometry, MemoryStore, RecordingStore, TraceOp};

    #[tokio::test]
    async fn every_cell_lands_once_with_its_last_contents() {
        let n = 5 * WRITE_BATCH as u64 + 17;
        let store = RecordingStore::new(MemoryStore::new(Geometry::new(n, 8).unwrap()));
        let mut cells: Vec<(CellId, Vec<u8>)> =
            (0..n).map(|c| (CellId(c), c.to_le_bytes().to_vec())).collect();
        // Cell 3 again, later, with other contents: the later write must win.
        cells.push((CellId(3), 99u64.to_le_bytes().to_vec()));
        write_batches(&store, RetryPolicy::default(), cells).await.unwrap();

        let all: Vec<CellId> = (0..n).map(CellId).collect();
        let back = store.read(&all).await.unwrap();
        for (c, data) in back.iter().enumerate() {
            let want = if c == 3 { 99 } else { c as u64 };
            assert_eq!(data.as_slice(), want.to_le_bytes(), "cell {c}");
        }
        let writes: Vec<_> = store.trace().into_iter().filter(|e| e.op == TraceOp::Write).collect();
        assert_eq!(writes.len(), (n as usize).div_ceil(WRITE_BATCH), "one request per batch");
        let mut seen = std::collections::HashSet::new();
        for w in &writes {
            assert!(w.cells.len() <= WRITE_BATCH);
            for c in &w.cells {
                assert!(seen.insert(c.0), "cell {} written twice", c.0);
            }
        }
        assert_eq!(seen.len() as u64, n);
    }

    /// A store that may fail a write retryably still gets it retried (the batch is kept for
    /// that); one that never does is handed the buffers without a copy.
    #[tokio::test]
    async fn writes_are_retried_where_they_may_fail() {
        use blindfold_store::{CountingStore, FaultConfig, FaultStore};
        let g = Geometry::new(64, 8).unwrap();
        assert!(!MemoryStore::new(g).writes_may_be_retried());
        assert!(!CountingStore::new(MemoryStore::new(g)).writes_may_be_retried());
        let faults = FaultConfig { seed: 3, error_rate: 0.5, ..FaultConfig::default() };
        let flaky = FaultStore::new(MemoryStore::new(g), faults);
        assert!(flaky.writes_may_be_retried());
        let retry =
            RetryPolicy { attempts: 30, first_backoff: std::time::Duration::from_micros(1) };
        for round in 0..20u64 {
            let cells: Vec<(CellId, Vec<u8>)> =
                (0..64).map(|c| (CellId(c), (c + round).to_le_bytes().to_vec())).collect();
            crate::retry::write_sealed(&flaky, retry, cells).await.unwrap();
        }
        let back = flaky.inner().read(&(0..64).map(CellId).collect::<Vec<_>>()).await.unwrap();
        for (c, data) in back.iter().enumerate() {
            assert_eq!(data.as_slice(), (c as u64 + 19).to_le_bytes(), "cell {c}");
        }
    }
}
