//! [`DurableTao`]: the concurrent [`TaoOram`] made crash-consistent, for the gateway.
//!
//! # How it stays consistent
//!
//! The engine runs over an [`OverlayStore`]: its reads go to the real store (the store sees
//! every read, exactly as without the overlay), but its writes — the write-backs of its subtree
//! — land in an in-memory overlay, which later reads see. Nothing reaches the real store
//! between commits, so the store always holds the state of the last commit.
//!
//! [`DurableTao::commit`] stops new requests, waits for the ones in flight, makes the engine
//! write back its whole subtree (into the overlay) and exports its trusted state. Then, on a
//! store with two slots per cell (the default; see [`crate::slots`]), it lets requests go on
//! and, while they run:
//!
//! 1. writes the overlay's cells (moved aside, still visible to reads) to the slots that do not
//!    hold the committed copies, and flushes the store;
//! 2. appends one redo record — which cells moved, their versions, the changed position-map
//!    entries, the stash, the changed buckets of the tree top kept in memory (by block, and a
//!    block's contents only when the log does not hold them yet: [`crate::toplog`]) — and
//!    fsyncs it;
//! 3. switches the slots and forgets the moved-aside cells.
//!
//! Requests served meanwhile log their reveals as following the commit being made; if it
//! never becomes durable, the next start replays them after the earlier ones. When the log
//! has grown past its limit, the commit also captures a checkpoint of the state it exports
//! (while requests are stopped anyway: the open tree top and the pinned cells are copied) and
//! writes it once its record is durable, while requests go on; the new log keeps the reveals
//! logged since the capture, which the checkpoint does not account for. On an in-place store
//! requests stay stopped throughout, and the record carries the sealed cells themselves
//! before they overwrite the store.
//!
//! A crash before the record is durable loses only unacknowledged work; after it, the next
//! start replays the record. Commits are grouped: one that finds its caller's writes already
//! covered by another caller's commit returns at once. Between commits, requests run fully
//! concurrently; a commit (or an overlay grown past its bound) is a short pause for everyone.
//!
//! # Security
//!
//! As [`TaoOram`] for reads. Writes are deferred to the commit and each dirty cell is written
//! once per commit, so the store learns how many distinct cells the write-backs since the last
//! commit covered (a function of the random paths only) and when commits happen (which follows
//! the clients' request timing, already public). A commit writes back every fetched path,
//! including an incomplete batch of fewer than `k` paths.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use blindfold_crypto::{CellSealer, MasterKey, StateSealer, StoreId};
use blindfold_oram::{BlockId, Op};
use blindfold_store::{ByteRange, CellId, Geometry, Store};
use parking_lot::Mutex;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::bulk::{write_batches, write_shared_batches};
use crate::durable::{
    apply_slot_cells, cell_sealer, pending_slot_cells, verify_cells, LegacyVersions, LoggedCell,
    SlotCell,
};
use crate::journal::{
    append_frames_mirroring, append_frames_queued, append_record, append_reveal_frames,
    decode_record, empty_log, encode_frame, prepare_new_dir, read_any_checkpoint,
    read_frames_with_legacy, read_prev_checkpoint, replace_log, write_checkpoint_as, Mirrored, Tap,
    CHECKPOINT, REDO_LOG,
};
use crate::packed::{PackedStore, Packing};
use crate::pinned::{PinnedCells, PinnedStore};
use crate::retry::{with_retry, RetryPolicy};
use crate::sealing::seal_cell;
use crate::slots::{slotted_geometry, SlotMap, SlottedStore};
use crate::tao::{encode_bucket, TopWritten};
use crate::toplog::{TopBucket, TopPool};
use crate::{
    ProxyError, Recovery, Result, Reveal, TaoConfig, TaoOram, TaoState, TaoStats, VerifyReport,
};

/// Version 3 adds the slot map of two-slot stores (see [`crate::slots`]).
const CHECKPOINT_MAGIC: &[u8; 8] = b"BFTAOCK4";
/// Sealed checkpoints whose pinned top was a number of whole levels, migrated on open.
const V3_CHECKPOINT_MAGIC: &[u8; 8] = b"BFTAOCK3";
/// Sealed checkpoints of blindfold 0.2 (no slot map), migrated on open.
const PREV_CHECKPOINT_MAGIC: &[u8; 8] = b"BFTAOCK2";
/// A commit of an in-place store: the cells' sealed contents travel in the record.
const RECORD_MAGIC: u32 = 0xB1F0_7A02;
/// A commit of a two-slot store: the cells are already in the store; the record names them.
/// Written by blindfold 0.3 (pinned cells sealed and whole), replayed on open.
const SLOT_RECORD_MAGIC: u32 = 0xB1F0_7A03;
/// As [`SLOT_RECORD_MAGIC`], with the open tree top logged by block ([`crate::toplog`]).
const TOP_RECORD_MAGIC: u32 = 0xB1F0_7A04;
/// As [`TOP_RECORD_MAGIC`], logged while the commit's cells were still being written (under
/// `--durability store`, the record's round trip to the store runs beside the cells'): the
/// commit counts only once a [`LANDED_MAGIC`] frame names it, or, for the last record of the
/// log, once its cells read back from the store ([`DurableTao::open`]).
const BESIDE_RECORD_MAGIC: u32 = 0xB1F0_7A05;
/// Logged once the cells of the commit record it names are in the store.
const LANDED_MAGIC: u32 = 0xB1F0_7C01;
const REVEAL_MAGIC: u32 = 0xB1F0_7B02;
/// Unsealed checkpoint and commit records of blindfold 0.1, migrated on open.
const LEGACY_CHECKPOINT_MAGIC: &[u8; 8] = b"BFTAOCK1";
const LEGACY_RECORD_MAGIC: u32 = 0xB1F0_7A01;
/// Write a checkpoint once the redo log is larger than this.
const DEFAULT_LOG_LIMIT: u64 = 256 << 20;
/// Commit by itself once this many cells wait in the overlay.
const DEFAULT_MAX_OVERLAY: usize = 8192;

#[derive(Serialize, Deserialize)]
struct Checkpoint {
    store_id: [u8; 16],
    state: TaoState,
    /// Which slot holds each cell, for a two-slot store; `None` for an in-place one.
    slots: Option<SlotMap>,
    /// The top of the tree, kept in trusted memory (two-slot stores only): sealed, but for the
    /// buckets the engine held open, which are empty here and in `top`.
    pinned: PinnedCells,
    /// The tree top the engine held open, by block, every block with its contents: it costs
    /// what it holds, not a sealed cell per bucket, and takes no sealing at a checkpoint.
    top: Vec<TopBucket>,
    /// First key epoch no run has sealed with.
    next_epoch: u32,
    /// Sequence number of the last redo record folded into this checkpoint.
    seq: u64,
}

/// A sealed checkpoint of blindfold 0.2 (in-place stores only).
#[derive(Deserialize)]
struct PrevCheckpoint {
    store_id: [u8; 16],
    state: TaoState,
    next_epoch: u32,
    seq: u64,
}

/// A checkpoint of format 3: as [`Checkpoint`], the pinned top counted in whole levels.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct V3Checkpoint {
    store_id: [u8; 16],
    state: TaoState,
    slots: Option<SlotMap>,
    pinned: V3Pinned,
    next_epoch: u32,
    seq: u64,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct V3Pinned {
    levels: u32,
    cells: Option<Vec<serde_bytes::ByteBuf>>,
}

/// A checkpoint as blindfold 0.1 wrote it (unsealed).
#[derive(Deserialize)]
struct LegacyCheckpoint {
    store_id: [u8; 16],
    state: LegacyState,
    next_epoch: u32,
    seq: u64,
}

#[derive(Deserialize)]
struct LegacyState {
    config: TaoConfig,
    posmap: Vec<u32>,
    stash: Vec<(u64, u32, Vec<u8>)>,
    versions: LegacyVersions,
    stats: TaoStats,
}

#[derive(Serialize, Deserialize)]
struct Record {
    seq: u64,
    /// Highest key epoch sealed with so far.
    epoch_high: u32,
    /// Changed position-map entries: (block, leaf + 1).
    posmap: Vec<(u32, u32)>,
    /// The stash, whole.
    stash: Vec<(u64, u32, Vec<u8>)>,
    stats: TaoStats,
    cells: Vec<LoggedCell>,
}

/// A commit of a two-slot store: the state change and the cells written (to their free slots,
/// flushed before this record was logged).
#[derive(Serialize, Deserialize)]
struct SlotRecord {
    seq: u64,
    /// Highest key epoch sealed with so far.
    epoch_high: u32,
    /// Changed position-map entries: (block, leaf + 1).
    posmap: Vec<(u32, u32)>,
    /// The stash, whole.
    stash: Vec<(u64, u32, Vec<u8>)>,
    stats: TaoStats,
    cells: Vec<SlotCell>,
    /// The pinned cells (top of the tree) this commit changed, with their sealed bytes (those
    /// not in a [`TopRecord`]'s `top`).
    pinned: Vec<LoggedCell>,
}

/// A commit of a two-slot store whose engine keeps the pinned tree top open: as
/// [`SlotRecord`], plus the open top buckets the commit changed, by block (replayed after
/// `pinned`).
#[derive(Serialize, Deserialize)]
struct TopRecord {
    slots: SlotRecord,
    top: Vec<TopBucket>,
}

/// What replaying the last record changed, to put back if its cells are not in the store.
struct Undo {
    state: TaoState,
    slots: Option<SlotMap>,
    pinned_logged: HashMap<u64, Vec<u8>>,
    pinned_open: HashMap<u64, TopWritten>,
    seq: u64,
    next_epoch: u32,
    /// The record's store cells.
    cells: Vec<SlotCell>,
}

/// Whether every cell a commit record names opens from the slot it names, under the version
/// it names (`reader` has the slot map with the record applied). The store sees reads of
/// cells it saw written, in the order the record lists them: nothing about blocks.
async fn cells_landed(
    reader: SlottedStore,
    packing: &Packing,
    cell_size: u32,
    opener: &CellSealer,
    cells: &[SlotCell],
    retry: RetryPolicy,
) -> Result<bool> {
    let slotted = Arc::new(reader);
    let reader: Arc<dyn Store> = if packing.is_packed() {
        Arc::new(PackedStore::new(slotted, packing.clone(), cell_size)?)
    } else {
        slotted
    };
    for chunk in cells.chunks(256) {
        let ids: Vec<CellId> = chunk.iter().map(|c| CellId(c.cell)).collect();
        let fetched = with_retry(retry, || reader.read(&ids)).await?;
        for (c, buf) in chunk.iter().zip(fetched) {
            if crate::sealing::open_cell(opener, CellId(c.cell), c.version, c.epoch, buf).is_err() {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

/// The cells of commit `seq` (a [`BESIDE_RECORD_MAGIC`] record) are in the store.
#[derive(Serialize, Deserialize)]
struct Landed {
    seq: u64,
}

/// What requests revealed since the last commit, logged before their paths are read: one
/// record per group of batches made durable together.
#[derive(Serialize, Deserialize)]
struct RevealRecord {
    /// Sequence number of the commit these requests follow.
    after: u64,
    reveals: Vec<Reveal>,
}

/// The reveal journal: requests' reveals queue here in arrival order (under the engine's
/// lock), and whoever needs theirs durable writes the whole queue as one record with one
/// fsync, so concurrent batches share fsyncs (group commit).
#[derive(Debug)]
struct Journal {
    queue: Mutex<JournalQueue>,
    /// Reveals durable so far (a count over the whole run).
    durable: AtomicU64,
    /// Records in the local log whose copy in the mirror is still awaited: the reveals each
    /// covers (a count over the whole run) and what to wait for.
    mirroring: Mutex<std::collections::VecDeque<(u64, Mirrored)>>,
    /// Held while writing; the log handle the journal appends through.
    writer: tokio::sync::Mutex<File>,
    dir: PathBuf,
    /// Where the redo log is mirrored (the gateway's log in the store), once attached.
    tap: Tap,
    sealer: StateSealer,
    /// Sequence number of the last commit (records name it).
    after: AtomicU64,
}

#[derive(Debug, Default)]
struct JournalQueue {
    pending: Vec<Reveal>,
    /// Reveals queued so far (a count over the whole run).
    queued: u64,
}

impl Journal {
    /// Queues `reveals`; returns the count that must be durable before they are revealed.
    fn push(&self, reveals: &[Reveal]) -> u64 {
        let mut q = self.queue.lock();
        q.pending.extend_from_slice(reveals);
        q.queued += reveals.len() as u64;
        q.queued
    }

    /// Makes the first `upto` reveals durable, writing everything queued at once. The log
    /// lock is held while the record goes into the local log, not while the mirror (the store,
    /// far away) takes it: later syncs write their records meanwhile.
    async fn sync(&self, upto: u64) -> Result<()> {
        if self.durable.load(Ordering::SeqCst) >= upto {
            return Ok(());
        }
        let (end, mirrored) = {
            let log = self.writer.lock().await;
            if self.durable.load(Ordering::SeqCst) >= upto {
                return Ok(()); // another caller's write covered ours while we queued
            }
            let in_flight = self.mirroring.lock().iter().find(|(end, _)| *end >= upto).cloned();
            match in_flight {
                // In the local log already, on its way to the mirror.
                Some(sent) => sent,
                None => {
                    let (reveals, end) = {
                        let mut q = self.queue.lock();
                        (std::mem::take(&mut q.pending), q.queued)
                    };
                    let record = RevealRecord { after: self.after.load(Ordering::SeqCst), reveals };
                    let frame = encode_frame(REVEAL_MAGIC, &record, &self.sealer)?;
                    let (_, mirrored) =
                        append_reveal_frames(&log, &self.dir, &self.tap, vec![frame]).await?;
                    self.mirroring.lock().push_back((end, mirrored.clone()));
                    (end, mirrored)
                }
            }
        };
        // A mirror that lets reads go ahead has the record on its way (within its linger, if
        // no write takes it along sooner); the next commit waits for it (and everything before
        // it) in order. (A standby holding the log's tail may let the read go before the
        // mirror holds it: `LogMirror::readable`.)
        if self.tap.reads_wait() {
            mirrored.readable().await?;
        }
        self.durable.fetch_max(end, Ordering::SeqCst);
        self.mirroring.lock().retain(|(e, _)| *e > end);
        Ok(())
    }
}

/// A store whose writes stay in memory until [`OverlayStore::take`]: reads go to the inner
/// store and see the overlay's newer copies. A commit that lets requests go on while it writes
/// moves the waiting cells aside ([`OverlayStore::begin_commit`]); reads keep seeing them there
/// until [`OverlayStore::end_commit`], once the store holds them as committed.
#[derive(Debug)]
pub struct OverlayStore {
    inner: Arc<dyn Store>,
    overlay: Mutex<Layers>,
}

#[derive(Debug, Default)]
struct Layers {
    /// Written since the last commit began.
    current: HashMap<u64, Arc<Vec<u8>>>,
    /// Taken by the commit in progress, until it is durable.
    committing: HashMap<u64, Arc<Vec<u8>>>,
}

impl Layers {
    fn newest(&self, cell: u64) -> Option<&Arc<Vec<u8>>> {
        self.current.get(&cell).or_else(|| self.committing.get(&cell))
    }
}

impl OverlayStore {
    /// An empty overlay over `inner`.
    pub fn new(inner: Arc<dyn Store>) -> Self {
        Self { inner, overlay: Mutex::new(Layers::default()) }
    }

    /// Cells waiting in the overlay (not counting a commit in progress).
    pub fn len(&self) -> usize {
        self.overlay.lock().current.len()
    }

    /// Whether no cell waits in the overlay (not counting a commit in progress).
    pub fn is_empty(&self) -> bool {
        self.overlay.lock().current.is_empty()
    }

    /// Cells held in memory, a commit in progress included.
    pub fn held(&self) -> usize {
        let o = self.overlay.lock();
        o.current.len() + o.committing.len()
    }

    /// Takes every waiting cell, sorted by cell.
    pub fn take(&self) -> Vec<(u64, Vec<u8>)> {
        let mut cells: Vec<_> = std::mem::take(&mut self.overlay.lock().current)
            .into_iter()
            .map(|(c, d)| (c, Arc::unwrap_or_clone(d)))
            .collect();
        cells.sort_unstable_by_key(|c| c.0);
        cells
    }

    /// Moves every waiting cell aside for a commit (reads still see them) and returns shared
    /// references to them, sorted by cell: the copies the store's writes take are made by the
    /// caller, after requests were let go again. One commit at a time.
    pub fn begin_commit(&self) -> Vec<(u64, Arc<Vec<u8>>)> {
        let mut o = self.overlay.lock();
        debug_assert!(o.committing.is_empty(), "one commit at a time");
        o.committing = std::mem::take(&mut o.current);
        let mut cells: Vec<_> = o.committing.iter().map(|(&c, d)| (c, Arc::clone(d))).collect();
        cells.sort_unstable_by_key(|c| c.0);
        cells
    }

    /// Forgets the cells of the commit in progress: the store now holds them as committed.
    pub fn end_commit(&self) {
        self.overlay.lock().committing.clear();
    }
}

#[async_trait]
impl Store for OverlayStore {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        // The copies current when the read is issued, as a store would answer.
        let newer: Vec<Option<Vec<u8>>> = {
            let o = self.overlay.lock();
            cells.iter().map(|c| o.newest(c.0).map(|d| d.to_vec())).collect()
        };
        let mut fetched = self.inner.read(cells).await?;
        for (buf, newer) in fetched.iter_mut().zip(newer) {
            if let Some(n) = newer {
                *buf = n;
            }
        }
        Ok(fetched)
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        let newer: Vec<Option<Vec<u8>>> = {
            let o = self.overlay.lock();
            ranges
                .iter()
                .map(|r| {
                    o.newest(r.cell.0)
                        .map(|c| c[r.offset as usize..(r.offset + r.len) as usize].to_vec())
                })
                .collect()
        };
        let mut fetched = self.inner.read_ranges(ranges).await?;
        for (buf, newer) in fetched.iter_mut().zip(newer) {
            if let Some(n) = newer {
                *buf = n;
            }
        }
        Ok(fetched)
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
        let g = self.inner.geometry();
        for (c, data) in &cells {
            g.check_write(*c, data)?;
        }
        let mut o = self.overlay.lock();
        for (c, data) in cells {
            o.current.insert(c.0, Arc::new(data));
        }
        Ok(())
    }

    async fn flush(&self) -> blindfold_store::Result<()> {
        Ok(())
    }
    fn writes_may_be_retried(&self) -> bool {
        false // writes go to memory
    }
}

/// The position-map entries of `now` that differ from `before`, as (block, leaf + 1).
fn changed_posmap(now: &[u32], before: &[u32]) -> Vec<(u32, u32)> {
    now.iter()
        .zip(before)
        .enumerate()
        .filter(|(_, (now, before))| now != before)
        .map(|(i, (&now, _))| (i as u32, now))
        .collect()
}

/// A commit whose cells and state were taken with requests stopped, to be written with
/// requests running.
struct Prepared {
    cells: Vec<(u64, Arc<Vec<u8>>)>,
    posmap: Vec<(u32, u32)>,
    state: TaoState,
    /// The open tree top's buckets written since the last commit.
    top: Vec<TopWritten>,
}

/// Replaces `dir`'s redo log by what it holds from byte `from` on, less the byte range
/// `leave_out` (a commit record the new checkpoint covers); returns the new log, opened for
/// appending, and its length.
fn keep_after(
    dir: &Path,
    from: u64,
    leave_out: Option<std::ops::Range<u64>>,
) -> Result<(File, u64)> {
    use std::io::{Read, Seek, SeekFrom};
    let path = dir.join(REDO_LOG);
    let io = |what, e| crate::journal::io(&path, what, e);
    let mut f = File::open(&path).map_err(|e| io("opening", e))?;
    let len = f.metadata().map_err(|e| io("reading the size of", e))?.len();
    let leave_out = leave_out.unwrap_or(len..len);
    if from > len || from > leave_out.start || leave_out.end > len {
        return Err(ProxyError::State(format!(
            "{}: {len} bytes, shorter than this run's appends ({from}, {leave_out:?})",
            path.display()
        )));
    }
    let mut tail = Vec::new();
    f.seek(SeekFrom::Start(from)).map_err(|e| io("seeking in", e))?;
    f.take(len - from).read_to_end(&mut tail).map_err(|e| io("reading", e))?;
    let cut = |at: u64| (at - from) as usize;
    let kept: Vec<Vec<u8>> = [0..cut(leave_out.start), cut(leave_out.end)..tail.len()]
        .into_iter()
        .filter(|r| r.start < r.end)
        .map(|r| tail[r].to_vec())
        .collect();
    let bytes = kept.iter().map(|k| k.len() as u64).sum();
    Ok((replace_log(dir, &kept)?, bytes))
}

/// The redo log's length now.
fn log_len(c: &Committer) -> Result<u64> {
    let len = c
        .log
        .metadata()
        .map_err(|e| crate::journal::io(&c.dir.join(REDO_LOG), "reading the size of", e))?;
    Ok(len.len())
}

/// What only a commit touches.
#[derive(Debug)]
struct Committer {
    dir: PathBuf,
    log: File,
    log_bytes: u64,
    seq: u64,
    next_epoch: u32,
    store_id: StoreId,
    /// The position map as of the last commit, to log only what changed.
    posmap: Vec<u32>,
    sealer: Arc<StateSealer>,
    /// The tree top's blocks as the records since the checkpoint left them.
    pool: TopPool,
    /// Where in the redo log the last commit record lies (byte range; set by
    /// [`DurableTao::finish_prepared`]).
    last_record: Option<std::ops::Range<u64>>,
}

/// A checkpoint captured with requests stopped, to be written once the commit prepared with
/// it is durable ([`DurableTao::write_captured_checkpoint`]).
struct Captured {
    /// Without its pinned cells, which the commit may still write ([`DurableTao::write_captured_checkpoint`]
    /// adds them).
    ckpt: Checkpoint,
    /// The pinned cells the checkpoint holds open, by block, in `ckpt.top`.
    open: Vec<u64>,
    /// The redo log's length when it was captured: the reveals logged after it are of
    /// requests the checkpoint does not account for.
    log_at: u64,
}

/// The TaoStore engine with a crash-consistent trusted state; see the module documentation.
pub struct DurableTao {
    tao: TaoOram,
    overlay: Arc<OverlayStore>,
    /// The store commits write to: `pinned` if the top of the tree is kept in memory, else
    /// `slotted` if the store has two slots per cell, else the store itself.
    store: Arc<dyn Store>,
    slotted: Option<Arc<SlottedStore>>,
    /// Over `slotted` when several buckets share a store object ([`crate::packed`]).
    packed: Option<Arc<PackedStore>>,
    pinned: Option<Arc<PinnedStore>>,
    /// Requests hold it shared; a commit holds it exclusively.
    gate: tokio::sync::RwLock<()>,
    /// Held while a batch waits for room in trusted memory and is submitted, so batches are
    /// admitted one at a time ([`TaoOram::wait_for_room`]).
    admission: tokio::sync::Mutex<()>,
    committer: tokio::sync::Mutex<Committer>,
    /// The last commit record's copy in the mirror (the store-side log), which a non-stop
    /// commit does not wait for: [`DurableTao::commit`] waits for it, the next commit waits for
    /// it before writing into slots the record frees, and a checkpoint before it is written.
    unmirrored: parking_lot::Mutex<Mirrored>,
    /// Opens cells for `verify` (never seals).
    opener: CellSealer,
    /// Reveals logged before their paths are read.
    journal: Journal,
    /// Write batches completed.
    written: AtomicU64,
    /// Value of `written` that the last commit covered.
    committed: AtomicU64,
    /// Blocks of the open tree top that commit records named, and of those the ones logged
    /// with their contents ([`DurableTao::top_blocks_logged`]).
    top_named: AtomicU64,
    top_with_contents: AtomicU64,
    poisoned: AtomicBool,
    max_overlay: usize,
    log_limit: u64,
    retry: RetryPolicy,
}

impl std::fmt::Debug for DurableTao {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableTao").field("config", self.tao.config()).finish_non_exhaustive()
    }
}

impl DurableTao {
    /// Creates a new, empty engine whose trusted state lives in `dir` (created if needed; must
    /// not already hold a checkpoint). As [`crate::DurablePathOram::create`], a store of
    /// [`DurableTao::geometry`] (two slots per cell) keeps cell contents out of the redo log;
    /// one of [`TaoConfig::geometry`] is overwritten in place.
    pub async fn create(
        dir: &Path,
        config: TaoConfig,
        store: Arc<dyn Store>,
        key: &MasterKey,
        store_id: StoreId,
    ) -> Result<Self> {
        Self::create_pinned_cells(dir, config, store, key, store_id, 0).await
    }

    /// As [`DurableTao::create`], keeping the top `pinned_levels` levels of the tree in trusted
    /// memory (see [`crate::pinned`]); needs a two-slot store.
    pub async fn create_pinned(
        dir: &Path,
        config: TaoConfig,
        store: Arc<dyn Store>,
        key: &MasterKey,
        store_id: StoreId,
        pinned_levels: u32,
    ) -> Result<Self> {
        // All levels, or more, are more buckets than the tree has above its leaves: refused there.
        let count = PinnedCells::for_levels(pinned_levels);
        Self::create_pinned_cells(dir, config, store, key, store_id, count).await
    }

    /// As [`DurableTao::create`], keeping the tree's first `pinned` buckets in heap order in
    /// trusted memory: whole top levels and possibly the left part of the next (see
    /// [`crate::pinned`]). The leaves stay in the store, so `pinned` is at most the tree's
    /// inner buckets. Needs a two-slot store.
    pub async fn create_pinned_cells(
        dir: &Path,
        config: TaoConfig,
        store: Arc<dyn Store>,
        key: &MasterKey,
        store_id: StoreId,
        pinned: u64,
    ) -> Result<Self> {
        Self::create_packed(dir, config, store, key, store_id, pinned, 1).await
    }

    /// As [`DurableTao::create_pinned_cells`], with the tree stored in subtrees of
    /// `pack_levels` levels per store object ([`crate::packed`]; 1 is a bucket per object).
    /// The store must have [`DurableTao::packed_geometry`]'s shape, two slots per object.
    pub async fn create_packed(
        dir: &Path,
        config: TaoConfig,
        store: Arc<dyn Store>,
        key: &MasterKey,
        store_id: StoreId,
        pinned: u64,
        pack_levels: u32,
    ) -> Result<Self> {
        let packing = Packing::new(config.shape().levels(), pack_levels)?;
        let two_slots = store.geometry() == Self::packed_geometry(&config, pack_levels)?;
        if packing.is_packed() && !two_slots {
            return Err(ProxyError::Geometry {
                found: format!(
                    "{} cells of {} bytes",
                    store.geometry().cell_count(),
                    store.geometry().cell_size()
                ),
                needed: format!("two slots of {} groups of {pack_levels} levels", packing.groups()),
            });
        }
        if pinned > 0 && !two_slots {
            return Err(ProxyError::State(
                "keeping the top of the tree in memory needs a store with two slots per cell"
                    .into(),
            ));
        }
        let inner = config.shape().buckets() - config.shape().leaves();
        if pinned > inner {
            return Err(ProxyError::State(format!(
                "{pinned} buckets in memory: the tree has {inner} above its leaves, and the \
                 leaves stay in the store"
            )));
        }
        prepare_new_dir(dir)?;
        let state = TaoState {
            posmap: vec![0; config.blocks() as usize],
            stash: Vec::new(),
            versions: crate::VersionTable::new(config.tree().total_cells()),
            stats: TaoStats::default(),
            config,
        };
        let ckpt = Checkpoint {
            store_id: store_id.0,
            state,
            slots: two_slots.then(|| SlotMap::new(packing.groups())),
            pinned: PinnedCells {
                count: pinned,
                cells: Some(vec![serde_bytes::ByteBuf::new(); pinned as usize]),
            },
            top: Vec::new(),
            next_epoch: 0,
            seq: 0,
        };
        write_checkpoint_as(dir, CHECKPOINT_MAGIC, &ckpt, &StateSealer::new(key))?;
        let _ = std::fs::remove_file(dir.join(REDO_LOG));
        Self::open(dir, store, key).await.map(|(t, _)| t)
    }

    /// Whether `dir` holds trusted state (of some engine).
    pub fn exists(dir: &Path) -> bool {
        dir.join(CHECKPOINT).exists()
    }

    /// The store shape of a new engine of `config`: two slots per cell (see [`crate::slots`]).
    pub fn geometry(config: &TaoConfig) -> Result<Geometry> {
        slotted_geometry(config.geometry()?)
    }

    /// The store shape of a new engine of `config` whose tree is stored in subtrees of
    /// `pack_levels` levels per store object ([`crate::packed`]), two slots each.
    pub fn packed_geometry(config: &TaoConfig, pack_levels: u32) -> Result<Geometry> {
        let packing = Packing::new(config.shape().levels(), pack_levels)?;
        slotted_geometry(packing.geometry(config.geometry()?.cell_size())?)
    }

    /// Trusted memory the cache of a packed tree's groups may take (0 unpacked; see
    /// [`PackedStore`]).
    pub fn packed_cache_bytes(config: &TaoConfig, pack_levels: u32) -> Result<u64> {
        if pack_levels <= 1 {
            return Ok(0);
        }
        let packing = Packing::new(config.shape().levels(), pack_levels)?;
        PackedStore::cache_bytes(&packing, config.geometry()?.cell_size())
    }

    /// The writes a commit is about to log: each bucket with its new slot.
    fn pending_cells(&self, slotted: &SlottedStore) -> Vec<(u64, u8)> {
        match &self.packed {
            Some(p) => p.pending(),
            None => slotted.pending(),
        }
    }

    /// Levels of the tree per store object (1: a bucket per object).
    pub fn pack_levels(&self) -> u32 {
        self.packed.as_ref().map_or(1, |p| p.packing().depth())
    }

    /// Whether the store holds two slots per cell (else commits overwrite it in place).
    pub fn two_slots(&self) -> bool {
        self.slotted.is_some()
    }

    /// Opens the engine in `dir`: loads the checkpoint, replays the redo log into the store and
    /// the state, and starts a fresh key epoch. Requests that the last run revealed but did
    /// not commit (it crashed, or stopped poisoned) are then accounted for: their paths are
    /// read again and their blocks moved to their logged fresh leaves
    /// ([`TaoOram::replay_reveals`]) and committed, before any new request.
    pub async fn open(
        dir: &Path,
        store: Arc<dyn Store>,
        key: &MasterKey,
    ) -> Result<(Self, Recovery)> {
        Self::open_rotating(dir, store, key, None).await
    }

    /// As [`DurableTao::open`], in the middle of a key rotation: what was sealed under
    /// `previous` (cells, checkpoint, redo log) still opens, while everything sealed from now
    /// on is sealed under `key`. A [`DurableTao::sweep`] over every path, then a commit, leaves
    /// nothing under `previous`.
    pub async fn open_rotating(
        dir: &Path,
        store: Arc<dyn Store>,
        key: &MasterKey,
        previous: Option<&MasterKey>,
    ) -> Result<(Self, Recovery)> {
        let state_sealer = StateSealer::with_keys(key, previous);
        let ckpt = load_checkpoint(dir, &state_sealer)?;
        let store_id = StoreId(ckpt.store_id);
        let mut state = ckpt.state;
        let mut slots = ckpt.slots;
        let pinned_cells = ckpt.pinned;
        // The slot map has a bit per store object: per bucket, or per group of a packed tree.
        let levels = state.config.shape().levels();
        let packing = match &slots {
            Some(map) => Packing::for_groups(levels, map.len()).map_err(|e| {
                ProxyError::State(format!(
                    "{}: slot map of {} cells for {} cells ({e})",
                    dir.join(CHECKPOINT).display(),
                    map.len(),
                    state.versions.len()
                ))
            })?,
            None => Packing::new(levels, 1)?,
        };
        if state.versions.len() != packing.buckets() {
            return Err(ProxyError::State(format!(
                "{}: {} cell versions for a tree of {} buckets",
                dir.join(CHECKPOINT).display(),
                state.versions.len(),
                packing.buckets()
            )));
        }
        if pinned_cells.count > 0 && slots.is_none() {
            return Err(ProxyError::State(format!(
                "{}: pinned tree top on an in-place store",
                dir.join(CHECKPOINT).display()
            )));
        }
        // Pinned cells the checkpoint holds open, or that replayed commits changed, put back
        // once the pinned store is up: sealed as logged, or open by block (sealed below, under
        // this run's epoch).
        let mut pinned_logged: HashMap<u64, Vec<u8>> = HashMap::new();
        let ckpt_top = resolve_top(dir, ckpt.top, pinned_cells.count, &state.config)?;
        // The records after the checkpoint may name the blocks it holds without their
        // contents: the writer's pool goes on across checkpoints ([`crate::toplog`]).
        let mut pool = TopPool::starting_from(&ckpt_top);
        let mut pinned_open: HashMap<u64, TopWritten> =
            ckpt_top.into_iter().map(|w| (w.cell, w)).collect();
        let log_path = dir.join(REDO_LOG);
        let (frames, _, torn_bytes) = read_frames_with_legacy(
            &log_path,
            &[
                RECORD_MAGIC,
                SLOT_RECORD_MAGIC,
                TOP_RECORD_MAGIC,
                BESIDE_RECORD_MAGIC,
                LANDED_MAGIC,
                REVEAL_MAGIC,
            ],
            &[LEGACY_RECORD_MAGIC],
            &state_sealer,
        )?;
        let mut recovery = Recovery { torn_bytes, ..Recovery::default() };
        let mut seq = ckpt.seq;
        let mut next_epoch = ckpt.next_epoch;
        let retry = RetryPolicy::default();
        let bad = |m: &str| ProxyError::State(format!("{}: redo record: {m}", log_path.display()));
        let mut revealed: Vec<RevealRecord> = Vec::new();
        // Commits whose cells a later frame says are in the store; and the last record of the
        // log, if it was logged beside its cells: unless it landed, it counts only if its
        // cells read back, so the state before it is kept until they have.
        let mut landed: HashSet<u64> = HashSet::new();
        for frame in frames.iter().filter(|f| f.magic == LANDED_MAGIC) {
            landed.insert(decode_record::<Landed>(&frame.body).map_err(|m| bad(&m))?.seq);
        }
        let is_record = |m: u32| m != REVEAL_MAGIC && m != LANDED_MAGIC;
        let unsure = frames
            .iter()
            .rposition(|f| is_record(f.magic))
            .filter(|&i| frames[i].magic == BESIDE_RECORD_MAGIC);
        let mut undo: Option<Undo> = None;
        for (i, frame) in frames.into_iter().enumerate() {
            if frame.magic == REVEAL_MAGIC {
                revealed.push(decode_record(&frame.body).map_err(|m| bad(&m))?);
                continue;
            }
            if frame.magic == LANDED_MAGIC {
                continue;
            }
            if frame.magic == SLOT_RECORD_MAGIC
                || frame.magic == TOP_RECORD_MAGIC
                || frame.magic == BESIDE_RECORD_MAGIC
            {
                let TopRecord { slots: rec, top } = if frame.magic == SLOT_RECORD_MAGIC {
                    let slots = decode_record(&frame.body).map_err(|m| bad(&m))?;
                    TopRecord { slots, top: Vec::new() }
                } else {
                    decode_record(&frame.body).map_err(|m| bad(&m))?
                };
                if rec.seq <= seq {
                    continue;
                }
                if unsure == Some(i) && !landed.contains(&rec.seq) {
                    undo = Some(Undo {
                        state: state.clone(),
                        slots: slots.clone(),
                        pinned_logged: pinned_logged.clone(),
                        pinned_open: pinned_open.clone(),
                        seq,
                        next_epoch,
                        cells: rec.cells.clone(),
                    });
                }
                let map = slots.as_mut().ok_or_else(|| bad("two-slot record, in-place store"))?;
                apply_slot_cells(&rec.cells, &mut state.versions, map, |c| packing.group_of(c).0)
                    .map_err(|m| bad(&m))?;
                let pinned_count = pinned_cells.count;
                for c in rec.pinned {
                    if c.cell >= pinned_count {
                        return Err(bad("pinned cell out of range"));
                    }
                    state.versions.record(c.cell, c.version, &c.sealed);
                    pinned_open.remove(&c.cell);
                    pinned_logged.insert(c.cell, c.sealed);
                }
                let config = &state.config;
                let block_size = config.block_size() as usize;
                let top =
                    pool.resolve(top, block_size, config.z() as usize).map_err(|m| bad(&m))?;
                pool.apply(&top);
                for w in top {
                    check_top(&w, pinned_count, config).map_err(|m| bad(&m))?;
                    state.versions.set(w.cell, w.version);
                    pinned_logged.remove(&w.cell);
                    pinned_open.insert(w.cell, w);
                }
                for (i, v) in rec.posmap {
                    *state.posmap.get_mut(i as usize).ok_or_else(|| bad("block out of range"))? = v;
                }
                state.stash = rec.stash;
                state.stats = rec.stats;
                next_epoch = next_epoch.max(rec.epoch_high.saturating_add(1));
                seq = rec.seq;
                recovery.replayed += 1;
                continue;
            }
            if slots.is_some() {
                return Err(bad("in-place record, two-slot store"));
            }
            let rec: Record = decode_record(&frame.body).map_err(|m| bad(&m))?;
            if rec.seq <= seq {
                continue;
            }
            recovery.cells_rewritten += rec.cells.len() as u64;
            for c in &rec.cells {
                if c.cell >= state.versions.len() {
                    return Err(bad("cell out of range"));
                }
                state.versions.record(c.cell, c.version, &c.sealed);
            }
            let cells = rec.cells.into_iter().map(|c| (CellId(c.cell), c.sealed));
            write_batches(&*store, retry, cells).await?;
            for (i, v) in rec.posmap {
                *state.posmap.get_mut(i as usize).ok_or_else(|| bad("block out of range"))? = v;
            }
            state.stash = rec.stash;
            state.stats = rec.stats;
            next_epoch = next_epoch.max(rec.epoch_high.saturating_add(1));
            seq = rec.seq;
            recovery.replayed += 1;
        }
        if let Some(undo) = undo {
            let map = slots.clone().ok_or_else(|| bad("two-slot record, in-place store"))?;
            let cell_size = state.config.geometry()?.cell_size();
            let opener = cell_sealer(key, previous, store_id, next_epoch);
            let reader = SlottedStore::new(Arc::clone(&store), map)?;
            if !cells_landed(reader, &packing, cell_size, &opener, &undo.cells, retry).await? {
                tracing::warn!(
                    commit = seq,
                    cells = undo.cells.len(),
                    "the last commit record's cells did not all reach the store before the \
                     gateway stopped: nothing was acknowledged on that commit, so it is dropped \
                     and the reveals logged since are replayed on the commit before it"
                );
                state = undo.state;
                slots = undo.slots;
                pinned_logged = undo.pinned_logged;
                pinned_open = undo.pinned_open;
                seq = undo.seq;
                next_epoch = undo.next_epoch;
                recovery.replayed -= 1;
                recovery.dropped += 1;
            }
        }
        // Reveals logged after the last durable commit: those that follow it, and those of
        // requests that ran while a later commit was being written (which never became
        // durable), in log order.
        revealed.retain(|r| r.after >= seq);
        if recovery.replayed > 0 {
            with_retry(retry, || store.flush()).await?;
        }
        // Reserve this run's epoch before sealing anything under it (the checkpoint below
        // reserves it; the top buckets sealed before it stay in trusted memory until then).
        let epoch = next_epoch;
        let top_sealer = cell_sealer(key, previous, store_id, epoch);
        let mut reopened: Vec<TopWritten> = pinned_open.into_values().collect();
        reopened.sort_unstable_by_key(|w| w.cell);
        for w in &reopened {
            let blocks = w.blocks.iter().map(|(id, leaf, data)| (*id, *leaf, &data[..]));
            let sealed = seal_cell(
                &top_sealer,
                CellId(w.cell),
                w.version,
                &encode_bucket(&state.config, blocks),
            )?;
            state.versions.record(w.cell, w.version, &sealed);
            pinned_logged.insert(w.cell, sealed);
        }
        // The layers under the engine: the store, its slot map, the pinned top of the tree
        // (with the changes the replayed records logged, so the checkpoint below has them).
        let slotted = match &slots {
            Some(map) => Some(Arc::new(SlottedStore::new(Arc::clone(&store), map.clone())?)),
            None => None,
        };
        let packed = match &slotted {
            Some(s) if packing.is_packed() => Some(Arc::new(PackedStore::new(
                Arc::clone(s),
                packing,
                state.config.geometry()?.cell_size(),
            )?)),
            _ => None,
        };
        let store = match (&packed, &slotted) {
            (Some(p), _) => Arc::clone(p) as Arc<dyn Store>,
            (None, Some(s)) => Arc::clone(s) as Arc<dyn Store>,
            (None, None) => store,
        };
        let pinned = if pinned_cells.count > 0 {
            let p = PinnedStore::new(Arc::clone(&store), pinned_cells).await?;
            p.restore(pinned_logged.into_iter().collect())?;
            Some(Arc::new(p))
        } else {
            None
        };
        let store = match &pinned {
            Some(p) => Arc::clone(p) as Arc<dyn Store>,
            None => store,
        };
        // The buckets just sealed from blocks go into the checkpoint as blocks again: it then
        // costs what the top holds, as a running engine's checkpoint does.
        let reopened_cells: Vec<u64> = reopened.iter().map(|w| w.cell).collect();
        let after = Checkpoint {
            store_id: store_id.0,
            state,
            slots,
            pinned: pinned
                .as_ref()
                .map(|p| p.export_open(&reopened_cells))
                .transpose()?
                .unwrap_or_default(),
            top: TopPool::default().encode(&reopened),
            next_epoch: epoch
                .checked_add(1)
                .ok_or(ProxyError::State("key epochs exhausted".into()))?,
            seq,
        };
        write_checkpoint_as(dir, CHECKPOINT_MAGIC, &after, &state_sealer)?;
        // The reveals stay logged until the commit that accounts for them is durable.
        let kept: Vec<Vec<u8>> = revealed
            .iter()
            .map(|r| encode_frame(REVEAL_MAGIC, r, &state_sealer))
            .collect::<Result<_>>()?;
        let log = replace_log(dir, &kept)?;
        let log_bytes = kept.iter().map(|f| f.len() as u64).sum();
        let overlay = Arc::new(OverlayStore::new(Arc::clone(&store)));
        let posmap = after.state.posmap.clone();
        let tao = TaoOram::from_state(
            after.state,
            overlay.clone() as Arc<dyn Store>,
            cell_sealer(key, previous, store_id, epoch),
            ChaCha20Rng::from_entropy(),
        )?;
        // The pinned top stays open in the engine, rewritten only when it changes; a key
        // rotation's sweeps must re-seal every cell, so not while one may be under way.
        if let (Some(p), None) = (&pinned, previous) {
            tao.keep_top_resident(p.count());
            tao.record_top_writes();
        }
        let journal_log = log.try_clone().map_err(|e| crate::journal::io(dir, "cloning", e))?;
        let this = Self {
            tao,
            overlay,
            store,
            slotted,
            packed,
            pinned,
            gate: tokio::sync::RwLock::new(()),
            admission: tokio::sync::Mutex::new(()),
            unmirrored: Default::default(),
            committer: tokio::sync::Mutex::new(Committer {
                dir: dir.to_path_buf(),
                log,
                log_bytes,
                seq,
                next_epoch: after.next_epoch,
                store_id,
                posmap,
                sealer: Arc::new(StateSealer::with_keys(key, previous)),
                pool: TopPool::default(),
                last_record: None,
            }),
            opener: cell_sealer(key, previous, store_id, epoch),
            journal: Journal {
                queue: Mutex::new(JournalQueue::default()),
                durable: AtomicU64::new(0),
                mirroring: Mutex::new(std::collections::VecDeque::new()),
                writer: tokio::sync::Mutex::new(journal_log),
                dir: dir.to_path_buf(),
                tap: Tap::default(),
                sealer: state_sealer,
                after: AtomicU64::new(seq),
            },
            written: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            top_named: AtomicU64::new(0),
            top_with_contents: AtomicU64::new(0),
            poisoned: AtomicBool::new(false),
            max_overlay: DEFAULT_MAX_OVERLAY,
            log_limit: DEFAULT_LOG_LIMIT,
            retry,
        };
        let reveals: Vec<Reveal> = revealed.into_iter().flat_map(|r| r.reveals).collect();
        if !reveals.is_empty() {
            recovery.reaccessed = reveals.len() as u64;
            let replay = async {
                this.tao.replay_reveals(&reveals).await?;
                this.commit_now().await
            };
            replay.await.map_err(crate::durable::replay_failed)?;
        }
        if recovery.replayed > 0 || recovery.torn_bytes > 0 || recovery.reaccessed > 0 {
            tracing::info!(
                replayed = recovery.replayed,
                cells = recovery.cells_rewritten,
                torn_bytes = recovery.torn_bytes,
                reaccessed = recovery.reaccessed,
                "recovered TaoStore engine state from the redo log"
            );
        }
        Ok((this, recovery))
    }

    /// Commits by itself once `cells` cells wait in the overlay (default 8192).
    pub fn set_max_overlay(&mut self, cells: usize) {
        self.max_overlay = cells.max(1);
    }

    /// Where this engine's redo log is mirrored ([`Tap::attach`]).
    pub fn tap(&self) -> Tap {
        self.journal.tap.clone()
    }

    /// Writes a checkpoint once the redo log exceeds `bytes` (default 256 MiB).
    pub fn set_log_limit(&mut self, bytes: u64) {
        self.log_limit = bytes;
    }

    /// The engine.
    pub fn engine(&self) -> &TaoOram {
        &self.tao
    }

    /// Bytes of trusted memory held now (the engine's, plus the overlay of sealed cells).
    pub fn trusted_bytes(&self) -> u64 {
        self.tao.trusted_bytes()
            + self.slotted.as_ref().map_or(0, |s| s.trusted_bytes())
            + self.pinned.as_ref().map_or(0, |p| p.trusted_bytes())
            + self.packed.as_ref().map_or(0, |p| p.trusted_bytes())
            + self.overlay.held() as u64 * u64::from(self.store.geometry().cell_size())
    }

    /// Blocks of the open tree top that this run's commit records named, and how many of
    /// them carried their contents (the rest were known to the log; see [`crate::toplog`]).
    pub fn top_blocks_logged(&self) -> (u64, u64) {
        (self.top_named.load(Ordering::Relaxed), self.top_with_contents.load(Ordering::Relaxed))
    }

    fn check(&self) -> Result<()> {
        if self.poisoned.load(Ordering::SeqCst) || self.tao.is_poisoned() {
            return Err(ProxyError::Poisoned);
        }
        Ok(())
    }

    /// Runs `ops` concurrently (replies in order); returns each block's previous contents.
    pub async fn access_many(&self, ops: Vec<(BlockId, Op)>) -> Result<Vec<Vec<u8>>> {
        self.check()?;
        let writes = ops.iter().any(|o| matches!(o.1, Op::Write(_)));
        let out = {
            // Back-pressure: wait (before taking the gate, so commits go on) until the batch
            // fits under the engine's trusted-memory mark; one batch admitted at a time.
            let admitted = self.admission.lock().await;
            self.tao.wait_for_room(ops.len()).await;
            let _shared = self.gate.read().await;
            // The batch's reveals are queued in arrival order and made durable (grouped with
            // other batches' into one fsync) before any of its paths is read.
            let mut upto = 0;
            let (replies, go) = self.tao.submit_gated(ops, |r| upto = self.journal.push(r))?;
            drop(admitted);
            if let Err(e) = self.journal.sync(upto).await {
                self.poisoned.store(true, Ordering::SeqCst);
                tracing::error!(error = %e, "cannot log reveals; refusing further accesses");
                drop(go); // the requests fail without reading anything
                for r in replies {
                    let _ = r.await;
                }
                return Err(e);
            }
            let _ = go.send(true);
            let mut out = Vec::with_capacity(replies.len());
            for r in replies {
                out.push(r.await?);
            }
            if writes {
                self.written.fetch_add(1, Ordering::SeqCst);
            }
            out
        };
        self.commit_if_full().await?;
        Ok(out)
    }

    /// Paths a sweep covers ([`TaoOram::sweep_paths`]): one per leaf.
    pub fn sweep_paths(&self) -> u64 {
        self.tao.sweep_paths()
    }

    /// Reads and writes back the sweep's paths `range` (leaves, in order; see
    /// [`TaoOram::sweep`]), re-sealing every cell on them under the current key. Runs
    /// alongside requests; durable after the next [`DurableTao::commit`].
    pub async fn sweep(&self, range: std::ops::Range<u64>) -> Result<()> {
        self.check()?;
        {
            let admitted = self.admission.lock().await;
            let n = usize::try_from(range.end.saturating_sub(range.start)).unwrap_or(usize::MAX);
            self.tao.wait_for_room(n).await;
            let _shared = self.gate.read().await;
            let replies: Vec<crate::tao::Reply> =
                range.map(|leaf| self.tao.sweep(leaf)).collect::<Result<_>>()?;
            drop(admitted);
            for r in replies {
                r.await?;
            }
            self.written.fetch_add(1, Ordering::SeqCst);
        }
        self.commit_if_full().await?;
        Ok(())
    }

    /// Reads blocks (zeros if never written), concurrently.
    pub async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        self.access_many(blocks.iter().map(|&b| (b, Op::Read)).collect()).await
    }

    /// Writes blocks, concurrently; durable after the next [`DurableTao::commit`].
    pub async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        self.access_many(blocks.into_iter().map(|(b, d)| (b, Op::Write(d))).collect()).await?;
        Ok(())
    }

    /// Makes every write that completed before this call durable. Concurrent callers share
    /// commits.
    pub async fn commit(&self) -> Result<()> {
        self.commit_queued().await?.wait().await
    }

    /// As [`DurableTao::commit`], but returns once the commit record is in the local redo log
    /// and queued for the mirror (the store-side log), with what is left to wait for: the
    /// writes are durable once [`Mirrored::wait`] returns, or once any later entry of the same
    /// mirror is durable. A caller that logs an entry of its own after the commit's (the
    /// gateway's directory transaction) thus waits for the store once for both.
    pub async fn commit_queued(&self) -> Result<Mirrored> {
        self.check()?;
        let mine = self.written.load(Ordering::SeqCst);
        // `committed` is raised after the record's mirror handle is kept: the handle read
        // after it covers these writes (or a later record, which covers them too).
        if self.committed.load(Ordering::SeqCst) >= mine {
            return Ok(self.unmirrored.lock().clone());
        }
        let mut c = self.committer.lock().await;
        if self.committed.load(Ordering::SeqCst) < mine {
            self.commit_all(&mut c).await?;
        }
        // (else another caller's commit covered these writes while we queued)
        Ok(self.unmirrored.lock().clone())
    }

    /// Waits until the last commit record is in the mirror.
    async fn mirrored(&self) -> Result<()> {
        let m = self.unmirrored.lock().clone();
        m.wait().await
    }

    /// A commit whatever has been written.
    async fn commit_now(&self) -> Result<()> {
        let mut c = self.committer.lock().await;
        self.commit_all(&mut c).await
    }

    /// A commit if the overlay holds [`DurableTao::set_max_overlay`] cells or more, checked
    /// again once the committer is ours: every request that ends while the overlay is full
    /// asks, and those that queued behind the commit that emptied it have nothing to do.
    async fn commit_if_full(&self) -> Result<()> {
        if self.overlay.len() < self.max_overlay {
            return Ok(());
        }
        let mut c = self.committer.lock().await;
        if self.overlay.len() < self.max_overlay {
            return Ok(());
        }
        self.commit_all(&mut c).await
    }

    /// With the committer held: stops requests, commits everything written so far, and
    /// records what it covered for the grouping in [`DurableTao::commit`].
    ///
    /// On a two-slot store (and with no checkpoint due) requests are stopped only while the
    /// engine writes back into the overlay and its state is exported; the store writes, the
    /// flush and the record's fsync then run while requests go on (see [`DurableTao::prepare`]).
    async fn commit_all(&self, c: &mut Committer) -> Result<()> {
        if self.slotted.is_some() {
            let started = std::time::Instant::now();
            let due = c.log_bytes > self.log_limit || self.journal.tap.wants_checkpoint();
            let (covered, prepared, drained, stopped) = {
                let _exclusive = self.gate.write().await;
                let drained = started.elapsed();
                self.check()?;
                let covered = self.written.load(Ordering::SeqCst);
                // A checkpoint due is taken of the state this commit makes durable: captured
                // now, written once the commit is. (No reveal is being logged: requests log
                // theirs holding the gate shared.)
                let log_at = if due { log_len(c).map(Some) } else { Ok(None) };
                let prepared = match (log_at, self.prepare(c).await) {
                    (Ok(Some(log_at)), Ok(p)) => self
                        .capture_checkpoint(c)
                        .map(|(ckpt, open)| (p, Some(Captured { ckpt, open, log_at }))),
                    (Ok(None), Ok(p)) => Ok((p, None)),
                    (Err(e), _) | (_, Err(e)) => Err(e),
                };
                (covered, prepared, drained, started.elapsed())
            };
            let r = match prepared {
                Ok((p, ckpt)) => {
                    let r = match p {
                        Some(p) => self.finish_prepared(c, p).await,
                        None => Ok(()),
                    };
                    match (r, ckpt) {
                        (Ok(()), Some(k)) => match self.mirrored().await {
                            Ok(()) => self.write_captured_checkpoint(c, k).await,
                            Err(e) => Err(e),
                        },
                        (r, _) => r,
                    }
                }
                Err(e) => Err(e),
            };
            tracing::debug!(
                drain_ms = drained.as_secs_f64() * 1e3,
                stopped_ms = stopped.as_secs_f64() * 1e3,
                total_ms = started.elapsed().as_secs_f64() * 1e3,
                log_bytes = c.log_bytes,
                checkpoint = due,
                "non-stop commit"
            );
            if let Err(e) = &r {
                self.poisoned.store(true, Ordering::SeqCst);
                tracing::error!(error = %e, "commit failed; refusing further accesses until restart");
            }
            r?;
            self.committed.store(covered, Ordering::SeqCst);
            return Ok(());
        }
        let started = std::time::Instant::now();
        let _exclusive = self.gate.write().await;
        let covered = self.written.load(Ordering::SeqCst);
        self.commit_locked(c).await?;
        self.committed.store(covered, Ordering::SeqCst);
        tracing::debug!(total_ms = started.elapsed().as_secs_f64() * 1e3, "stopping commit");
        Ok(())
    }

    /// With the gate held exclusively, on a two-slot store: writes the engine's subtree back
    /// into the overlay, exports the state and moves the overlay's cells aside for the commit
    /// (`None`: nothing to commit). Requests that run after this, while the commit writes,
    /// log their reveals as following the commit being made (`after` = its sequence number):
    /// if it never becomes durable, the next start replays them after the earlier ones (see
    /// [`DurableTao::open`]).
    async fn prepare(&self, c: &mut Committer) -> Result<Option<Prepared>> {
        let started = std::time::Instant::now();
        self.tao.flush().await?;
        let flushed = started.elapsed();
        let state = self.tao.export_state()?;
        // The top buckets the engine now holds open: their sealed copies are let go.
        if let Some(p) = &self.pinned {
            p.release(&self.tao.take_newly_open());
        }
        let posmap = changed_posmap(&state.posmap, &c.posmap);
        tracing::debug!(
            flush_ms = flushed.as_secs_f64() * 1e3,
            export_ms = (started.elapsed() - flushed).as_secs_f64() * 1e3,
            "commit prepared"
        );
        if self.overlay.is_empty() && posmap.is_empty() {
            return Ok(None);
        }
        let cells = self.overlay.begin_commit();
        let top = self.tao.take_top_written();
        self.journal.after.store(c.seq + 1, Ordering::SeqCst);
        Ok(Some(Prepared { cells, posmap, state, top }))
    }

    /// Without the gate: the prepared cells to their free slots, the flush, the record; then
    /// the slots switch and the overlay forgets the cells.
    ///
    /// With a mirror attached (the store-side log of `--durability store`), the record goes
    /// to it *beside* the cells instead of after them: one round trip to the store instead of
    /// two. It is then logged as [`BESIDE_RECORD_MAGIC`] and followed, once the cells are
    /// flushed, by a [`LANDED_MAGIC`] frame. The commit's caller logs its own entry (the
    /// directory transaction) after that frame, so anything acknowledged after the commit
    /// proves it landed; a record cut off from its cells by a crash is one nothing was
    /// acknowledged on, and [`DurableTao::open`] drops it.
    async fn finish_prepared(&self, c: &mut Committer, p: Prepared) -> Result<()> {
        let slotted = self.slotted.as_ref().expect("prepared commits are two-slot ones");
        let Prepared { cells, posmap, state, top } = p;
        let started = std::time::Instant::now();
        let n_cells = cells.len();
        // The overlay keeps its reference until the commit is durable, so each is a copy,
        // made by the task that writes its batch.
        let mut cells: Vec<(CellId, Arc<Vec<u8>>)> =
            cells.into_iter().map(|(c, sealed)| (CellId(c), sealed)).collect();
        // The slots this commit writes are those the last record freed: only once that record
        // is in the mirror too (else a recovery from the store would find them overwritten).
        self.mirrored().await?;
        // Packed, a group's buckets go in one write batch as far as the batches allow: each
        // batch writes every group it touches whole.
        if let Some(p) = &self.packed {
            cells.sort_unstable_by_key(|(c, _)| p.packing().group_of(c.0));
        }
        let beside = self.journal.tap.mirror().is_some();
        // The pinned top's cells stay in trusted memory (no round trip): written first, so
        // that the record can carry those it logs sealed.
        let pinned_count = self.pinned.as_ref().map_or(0, |p| p.count());
        let (top_cells, cells): (Vec<_>, Vec<_>) =
            cells.into_iter().partition(|(c, _)| c.0 < pinned_count);
        if !top_cells.is_empty() {
            write_shared_batches(&self.store, self.retry, top_cells).await?;
        }
        // Where the cells go: the free slot of each (of its group, packed). Written after the
        // record, they must go exactly where it says; checked once they are written.
        let free = self.free_slots(slotted, &cells);
        let mut cells = Some(cells);
        let mut written = free.clone();
        if !beside {
            written = self.write_commit_cells(slotted, cells.take(), None).await?;
        }
        let stored = started.elapsed();
        let pinned = self.pinned.as_ref().map(|p| p.take_dirty()).unwrap_or_default();
        // Pinned cells the open top logs by block need no sealed copy.
        let by_block: HashSet<u64> = top.iter().map(|w| w.cell).collect();
        let record = TopRecord {
            slots: SlotRecord {
                seq: c.seq + 1,
                epoch_high: self.tao.current_epoch(),
                posmap,
                stash: state.stash,
                stats: state.stats,
                cells: pending_slot_cells(written, &state.versions),
                pinned: pinned
                    .into_iter()
                    .filter(|(cell, _)| !by_block.contains(cell))
                    .map(|(cell, sealed)| LoggedCell {
                        cell,
                        version: state.versions.get(cell),
                        sealed,
                    })
                    .collect(),
            },
            top: c.pool.encode(&top),
        };
        let n_pinned = record.slots.pinned.len();
        let n_top = record.top.len();
        let top_blocks: usize = record.top.iter().map(|b| b.blocks.len()).sum();
        let top_logged: usize =
            record.top.iter().flat_map(|b| &b.blocks).filter(|e| e.data.is_some()).count();
        let seq = record.slots.seq;
        let magic = if beside { BESIDE_RECORD_MAGIC } else { TOP_RECORD_MAGIC };
        // Sealed off the request threads (megabytes when many new blocks reach the top).
        let sealer = Arc::clone(&c.sealer);
        let frame = tokio::task::spawn_blocking(move || encode_frame(magic, &record, &sealer))
            .await
            .map_err(|e| ProxyError::State(format!("record encoder panicked: {e}")))??;
        let encoded = started.elapsed();
        // One append at a time: the reveal journal writes to the same file, and a frame must
        // never be split by another (a write cut short, e.g. by a full disk, is retried).
        // Beside the cells, the record starts for the store at once.
        let append = async {
            let _journal = self.journal.writer.lock().await;
            let (appended, mirrored) = if beside {
                append_frames_mirroring(&c.log, &c.dir, &self.journal.tap, vec![frame]).await?
            } else {
                append_frames_queued(&c.log, &c.dir, &self.journal.tap, vec![frame]).await?
            };
            let end = log_len(c)?;
            c.last_record = Some(end.saturating_sub(appended)..end);
            Ok::<_, ProxyError>((appended, mirrored))
        };
        let (mut appended, mut mirrored) = if beside {
            // The cells go to slots nothing durable names yet, so they need not wait for the
            // record's fsync: written while the local log takes it, and the store too.
            let (appended, written) =
                tokio::join!(append, self.write_commit_cells(slotted, cells.take(), Some(&free)));
            written?;
            appended?
        } else {
            append.await?
        };
        if beside {
            let landed = encode_frame(LANDED_MAGIC, &Landed { seq }, &c.sealer)?;
            let _journal = self.journal.writer.lock().await;
            // Fsynced before anything is acknowledged on the commit: an opening that finds
            // it keeps the commit whatever the store answers for its cells since (a store
            // that rolls them back is caught when they are read), where one that does not
            // reads them back and drops the commit if they are not there.
            let (n, m) =
                append_frames_queued(&c.log, &c.dir, &self.journal.tap, vec![landed]).await?;
            appended += n;
            mirrored = m;
        }
        // Reveals append while the mirror (the store) takes the record, and the commit ends
        // without waiting for it (`unmirrored`): reads may see the new slots already (they saw
        // the moved-aside cells while the commit wrote; their reveals follow this commit), and
        // nothing overwrites the slots the record frees before it is there.
        *self.unmirrored.lock() = mirrored;
        c.pool.apply(&top);
        self.top_named.fetch_add(top_blocks as u64, Ordering::Relaxed);
        self.top_with_contents.fetch_add(top_logged as u64, Ordering::Relaxed);
        tracing::debug!(
            cells = n_cells,
            read_backs = self.packed.as_ref().map_or(0, |p| p.read_backs()),
            pinned = n_pinned,
            top_buckets = n_top,
            top_blocks,
            top_logged,
            pool_blocks = c.pool.len(),
            record_bytes = appended,
            store_ms = stored.as_secs_f64() * 1e3,
            encode_ms = encoded.saturating_sub(stored).as_secs_f64() * 1e3,
            beside,
            log_ms = (started.elapsed() - encoded).as_secs_f64() * 1e3,
            "commit written"
        );
        c.log_bytes += appended;
        c.seq = seq;
        match &self.packed {
            Some(p) => p.publish(),
            None => slotted.publish(),
        }
        self.overlay.end_commit();
        c.posmap = state.posmap;
        Ok(())
    }

    /// The free slot of each of a commit's store cells (of its group, packed), sorted by
    /// cell: where writing them will put them.
    fn free_slots(
        &self,
        slotted: &SlottedStore,
        cells: &[(CellId, Arc<Vec<u8>>)],
    ) -> Vec<(u64, u8)> {
        let mut ids: Vec<u64> = cells.iter().map(|(c, _)| c.0).collect();
        ids.sort_unstable();
        ids.dedup();
        match &self.packed {
            Some(p) => {
                let groups: Vec<u64> = ids.iter().map(|&b| p.packing().group_of(b).0).collect();
                let slots = slotted.free_slots(&groups);
                ids.into_iter().zip(slots).map(|(b, (_, slot))| (b, slot)).collect()
            }
            None => slotted.free_slots(&ids),
        }
    }

    /// Writes a commit's store cells to their free slots and flushes; returns where they went
    /// (sorted by cell), which must be `named` when a record already names them.
    async fn write_commit_cells(
        &self,
        slotted: &SlottedStore,
        cells: Option<Vec<(CellId, Arc<Vec<u8>>)>>,
        named: Option<&[(u64, u8)]>,
    ) -> Result<Vec<(u64, u8)>> {
        write_shared_batches(&self.store, self.retry, cells.unwrap_or_default()).await?;
        let store = Arc::clone(&self.store);
        with_retry(self.retry, || store.flush()).await?;
        let mut written = self.pending_cells(slotted);
        written.sort_unstable();
        match named {
            Some(named) if named != written => Err(ProxyError::State(format!(
                "a commit wrote {} store cells where its record named {}: refusing to go on",
                written.len(),
                named.len()
            ))),
            _ => Ok(written),
        }
    }

    /// With the gate held exclusively: write back, log, apply.
    async fn commit_locked(&self, c: &mut Committer) -> Result<()> {
        self.check()?;
        let r = self.commit_inner(c).await;
        if let Err(e) = &r {
            self.poisoned.store(true, Ordering::SeqCst);
            tracing::error!(error = %e, "commit failed; refusing further accesses until restart");
        }
        r
    }

    async fn commit_inner(&self, c: &mut Committer) -> Result<()> {
        if self.slotted.is_some() {
            // As a non-stop commit, but with requests stopped throughout (the caller holds
            // the gate): shutdown, verify, or a commit that checkpoints.
            if let Some(p) = self.prepare(c).await? {
                self.finish_prepared(c, p).await?;
            }
            self.mirrored().await?;
            if c.log_bytes > self.log_limit || self.journal.tap.wants_checkpoint() {
                self.checkpoint_locked(c)?;
                self.journal.tap.checkpointed(&c.dir).await?;
            }
            return Ok(());
        }
        self.tao.flush().await?;
        let state = self.tao.export_state()?;
        let cells = self.overlay.take();
        let posmap = changed_posmap(&state.posmap, &c.posmap);
        if cells.is_empty() && posmap.is_empty() {
            return Ok(());
        }
        let record = Record {
            seq: c.seq + 1,
            epoch_high: self.tao.current_epoch(),
            posmap,
            stash: state.stash,
            stats: state.stats,
            cells: cells
                .into_iter()
                .map(|(cell, sealed)| LoggedCell {
                    cell,
                    version: state.versions.get(cell),
                    sealed,
                })
                .collect(),
        };
        c.log_bytes +=
            append_record(&c.log, &c.dir, &self.journal.tap, RECORD_MAGIC, &record, &c.sealer)
                .await?;
        c.seq = record.seq;
        // Reveals logged from now on follow this commit.
        self.journal.after.store(c.seq, Ordering::SeqCst);
        c.posmap = state.posmap;
        // Durable from here on: a crash now is repaired by replaying the record.
        let cells = record.cells.into_iter().map(|l| (CellId(l.cell), l.sealed));
        write_batches(&*self.store, self.retry, cells).await?;
        let store = Arc::clone(&self.store);
        with_retry(self.retry, || store.flush()).await?;
        if c.log_bytes > self.log_limit || self.journal.tap.wants_checkpoint() {
            self.checkpoint_locked(c)?;
            self.journal.tap.checkpointed(&c.dir).await?;
        }
        Ok(())
    }

    /// With the gate held exclusively and nothing in the overlay: the whole state to the
    /// checkpoint, and an empty log.
    fn checkpoint_locked(&self, c: &mut Committer) -> Result<()> {
        let (mut ckpt, open) = self.capture_checkpoint(c)?;
        ckpt.pinned = self.export_pinned(&open)?;
        write_checkpoint_as(&c.dir, CHECKPOINT_MAGIC, &ckpt, &c.sealer)?;
        // Records from now on are replayed from this checkpoint, which holds the top whole:
        // the pool goes on (every block it holds is in that top; [`crate::toplog`]).
        c.next_epoch = ckpt.next_epoch;
        empty_log(&c.log, &c.dir)?;
        c.log_bytes = 0;
        c.last_record = None;
        Ok(())
    }

    /// With the gate held exclusively and the engine flushed: the checkpoint of the state as
    /// it is, as of the commit after `c.seq` if one is prepared, and the pinned cells it holds
    /// open. Copies the open top. Its slot map and its pinned cells are the caller's to fill
    /// in once the store and the pinned store hold that commit's cells
    /// ([`DurableTao::export_pinned`]); so are the sealing and the writing.
    fn capture_checkpoint(&self, c: &Committer) -> Result<(Checkpoint, Vec<u64>)> {
        // The top the engine holds open goes in by block, as it is; the pinned store's sealed
        // copies of those buckets may be stale or let go, and are left out.
        let open = self.tao.open_top()?;
        let cells: Vec<u64> = open.iter().map(|w| w.cell).collect();
        let state = self.tao.export_state()?;
        if !open.is_empty() && self.pinned.is_none() {
            return Err(ProxyError::State("open tree top without a pinned store".into()));
        }
        let ckpt = Checkpoint {
            store_id: c.store_id.0,
            state,
            slots: self.slotted.as_ref().map(|s| s.map()),
            pinned: PinnedCells::default(),
            // An empty pool: every block with its contents.
            top: TopPool::default().encode(&open),
            next_epoch: c.next_epoch.max(self.tao.current_epoch().saturating_add(1)),
            seq: c.seq,
        };
        Ok((ckpt, cells))
    }

    /// The pinned store's cells for a checkpoint, but the `open` ones (sorted), which it holds
    /// by block. Only commits write the pinned store (from the overlay), so between one
    /// commit and the next, with the committer held, it is the state that commit left.
    fn export_pinned(&self, open: &[u64]) -> Result<PinnedCells> {
        Ok(self.pinned.as_ref().map(|p| p.export_open(open)).transpose()?.unwrap_or_default())
    }

    /// Without the gate, on a two-slot store, once the commit prepared with `captured` is
    /// durable (or there was nothing to commit): writes the checkpoint as of that commit, then
    /// replaces the redo log by the reveals logged since the capture (of requests served
    /// meanwhile, which the checkpoint does not account for), leaving out the commit's own
    /// record. A crash before the checkpoint is renamed into place replays the log as before;
    /// one after it, before the log is replaced, skips the records the checkpoint covers and
    /// keeps those reveals, as the new log does.
    async fn write_captured_checkpoint(&self, c: &mut Committer, captured: Captured) -> Result<()> {
        let started = std::time::Instant::now();
        let Captured { mut ckpt, open, log_at } = captured;
        ckpt.seq = c.seq;
        // The slot map and the pinned cells as that commit left them: no other commit has
        // written since. (Captured before it, the pinned cells would miss what it wrote.)
        ckpt.slots = self.slotted.as_ref().map(|s| s.map());
        ckpt.pinned = self.export_pinned(&open)?;
        let next_epoch = ckpt.next_epoch;
        let (dir, sealer) = (c.dir.clone(), Arc::clone(&c.sealer));
        tokio::task::spawn_blocking(move || {
            write_checkpoint_as(&dir, CHECKPOINT_MAGIC, &ckpt, &sealer)
        })
        .await
        .map_err(|e| ProxyError::State(format!("checkpoint writer panicked: {e}")))??;
        let written = started.elapsed();
        // The pool goes on: every block it holds is in the top this checkpoint holds.
        c.next_epoch = next_epoch;
        // Reveals may be appending: hold the journal's writer while the log is replaced.
        let mut journal = self.journal.writer.lock().await;
        let record = c.last_record.take().filter(|r| r.start >= log_at);
        let dir = c.dir.clone();
        let (new, kept) = tokio::task::spawn_blocking(move || keep_after(&dir, log_at, record))
            .await
            .map_err(|e| ProxyError::State(format!("redo log rewriter panicked: {e}")))??;
        let path = c.dir.join(REDO_LOG);
        *journal = new.try_clone().map_err(|e| crate::journal::io(&path, "cloning", e))?;
        c.log = new;
        c.log_bytes = kept;
        self.journal.tap.checkpointed(&c.dir).await?;
        drop(journal);
        tracing::debug!(
            checkpoint_ms = written.as_secs_f64() * 1e3,
            total_ms = started.elapsed().as_secs_f64() * 1e3,
            kept_bytes = c.log_bytes,
            "checkpoint written while requests ran"
        );
        Ok(())
    }

    /// With the gate held exclusively and the engine flushed: the open tree top's buckets that
    /// commits logged by block but nobody sealed since ([`TaoOram::record_top_writes`]), and
    /// those whose sealed copies the pinned store let go ([`PinnedStore::release`]), are sealed
    /// into the pinned store, so that every copy there matches the trusted versions. Returns
    /// the cells to let go of again afterwards.
    fn seal_top(&self) -> Result<Vec<u64>> {
        let held = self.pinned.as_ref().map(|p| p.held()).unwrap_or_default();
        let sealed = self.tao.seal_top(&held)?;
        match &self.pinned {
            Some(p) => p.restore(sealed)?,
            None if sealed.is_empty() => {}
            None => return Err(ProxyError::State("open tree top without a pinned store".into())),
        }
        Ok(held)
    }

    /// Commits, then writes the whole trusted state to the checkpoint (clean shutdown).
    pub async fn shutdown(&self) -> Result<()> {
        let mut c = self.committer.lock().await;
        let _exclusive = self.gate.write().await;
        self.commit_locked(&mut c).await?;
        self.checkpoint_locked(&mut c)
    }

    /// Commits, then reads every written cell of the store and authenticates it against the
    /// trusted versions. `progress(done, total)` is called as it goes.
    pub async fn verify(&self, progress: impl FnMut(u64, u64)) -> Result<VerifyReport> {
        let mut c = self.committer.lock().await;
        let _exclusive = self.gate.write().await;
        self.commit_locked(&mut c).await?;
        let held = self.seal_top()?;
        let versions = self.tao.export_state()?.versions;
        let report =
            verify_cells(&*self.store, self.retry, &self.opener, &versions, progress).await;
        if let Some(p) = &self.pinned {
            p.release(&held);
        }
        report
    }
}

// ---- For `rebuild` (recover): the saved state, and a checkpoint of a rebuilt tree. Kept
// apart from open()/commit() on purpose; they only go through the checkpoint functions.

/// The parts of a [`DurableTao`] checkpoint that a rebuild needs.
pub(crate) struct SavedTao {
    pub(crate) store_id: StoreId,
    pub(crate) state: TaoState,
    pub(crate) slots: Option<SlotMap>,
    pub(crate) pinned: PinnedCells,
    /// The tree top the checkpoint holds open (its cells are empty in `pinned`).
    pub(crate) top: Vec<TopWritten>,
    pub(crate) next_epoch: u32,
    pub(crate) seq: u64,
}

/// The checkpoint of `dir`, sealed or (migrating) unsealed from an earlier version.
fn load_checkpoint(dir: &Path, sealer: &StateSealer) -> Result<Checkpoint> {
    if let Some(v3) = read_prev_checkpoint::<V3Checkpoint>(dir, V3_CHECKPOINT_MAGIC, sealer)? {
        return Ok(Checkpoint {
            store_id: v3.store_id,
            state: v3.state,
            slots: v3.slots,
            pinned: PinnedCells {
                count: PinnedCells::for_levels(v3.pinned.levels),
                cells: v3.pinned.cells,
            },
            top: Vec::new(),
            next_epoch: v3.next_epoch,
            seq: v3.seq,
        });
    }
    if let Some(prev) = read_prev_checkpoint::<PrevCheckpoint>(dir, PREV_CHECKPOINT_MAGIC, sealer)?
    {
        return Ok(Checkpoint {
            store_id: prev.store_id,
            state: prev.state,
            slots: None,
            pinned: PinnedCells::default(),
            top: Vec::new(),
            next_epoch: prev.next_epoch,
            seq: prev.seq,
        });
    }
    let (ckpt, _) = read_any_checkpoint(
        dir,
        CHECKPOINT_MAGIC,
        LEGACY_CHECKPOINT_MAGIC,
        sealer,
        |old: LegacyCheckpoint| Checkpoint {
            store_id: old.store_id,
            state: TaoState {
                config: old.state.config,
                posmap: old.state.posmap,
                stash: old.state.stash,
                versions: crate::VersionTable::from_legacy(old.state.versions.versions),
                stats: old.state.stats,
            },
            slots: None,
            pinned: PinnedCells::default(),
            top: Vec::new(),
            next_epoch: old.next_epoch,
            seq: old.seq,
        },
    )?;
    Ok(ckpt)
}

/// The open tree top of the checkpoint in `dir`, every block with its contents, checked
/// against the tree.
fn resolve_top(
    dir: &Path,
    top: Vec<TopBucket>,
    pinned: u64,
    config: &TaoConfig,
) -> Result<Vec<TopWritten>> {
    let (block_size, z) = (config.block_size() as usize, config.z() as usize);
    let checked = TopPool::default()
        .resolve(top, block_size, z)
        .and_then(|top| top.iter().try_for_each(|w| check_top(w, pinned, config)).map(|()| top));
    checked.map_err(|m| ProxyError::State(format!("{}: {m}", dir.join(CHECKPOINT).display())))
}

/// Checks a tree top bucket from a redo record or a checkpoint against the tree.
fn check_top(w: &TopWritten, pinned: u64, config: &TaoConfig) -> std::result::Result<(), String> {
    if w.cell >= pinned {
        return Err("pinned cell out of range".into());
    }
    let leaves = config.shape().leaves();
    if w.blocks.iter().any(|e| e.0 >= config.blocks() || u64::from(e.1) >= leaves) {
        return Err("top bucket names a block or leaf out of range".into());
    }
    Ok(())
}

/// Reads the checkpoint in `dir` (the redo log is not looked at; see
/// [`crate::durable::load_saved_path_oram`]).
pub(crate) fn load_saved_tao(dir: &Path, key: &MasterKey) -> Result<SavedTao> {
    let c = load_checkpoint(dir, &StateSealer::new(key))?;
    let top = resolve_top(dir, c.top, c.pinned.count, &c.state.config)?;
    Ok(SavedTao {
        store_id: StoreId(c.store_id),
        state: c.state,
        slots: c.slots,
        pinned: c.pinned,
        top,
        next_epoch: c.next_epoch,
        seq: c.seq,
    })
}

/// Replaces the checkpoint in `dir` with `saved` (atomically) and removes any redo log.
pub(crate) fn save_rebuilt_tao(dir: &Path, saved: SavedTao, key: &MasterKey) -> Result<()> {
    let ckpt = Checkpoint {
        store_id: saved.store_id.0,
        state: saved.state,
        slots: saved.slots,
        pinned: saved.pinned,
        top: TopPool::default().encode(&saved.top),
        next_epoch: saved.next_epoch,
        seq: saved.seq,
    };
    crate::journal::remove_log(dir)?;
    write_checkpoint_as(dir, CHECKPOINT_MAGIC, &ckpt, &StateSealer::new(key))
}

#[cfg(test)]
mod tests {
    use blindfold_store::MemoryStore;

    use super::*;

    /// A checkpoint of format 3 (the pinned top counted in whole levels) opens with its top and
    /// every committed block, and is rewritten in the current format.
    #[tokio::test]
    async fn a_format_3_checkpoint_opens_with_its_pinned_top() {
        let key = MasterKey::generate();
        let dir = tempfile::tempdir().unwrap();
        let config = TaoConfig::builder(64, 32).write_back_every(4).build().unwrap();
        let store: Arc<dyn Store> =
            Arc::new(MemoryStore::new(DurableTao::geometry(&config).unwrap()));
        let tao = DurableTao::create_pinned(
            dir.path(),
            config,
            store.clone(),
            &key,
            StoreId::random(),
            2,
        )
        .await
        .unwrap();
        let blocks: Vec<(BlockId, Vec<u8>)> =
            (0..64).map(|b| (BlockId(b), vec![b as u8; 32])).collect();
        tao.write_many(blocks.clone()).await.unwrap();
        tao.commit().await.unwrap();
        tao.shutdown().await.unwrap();
        drop(tao);
        // The checkpoint holds the top the engine held open by block, and not sealed.
        let sealer = StateSealer::new(&key);
        let ckpt = load_checkpoint(dir.path(), &sealer).unwrap();
        assert!(!ckpt.top.is_empty());
        let cells = ckpt.pinned.cells.as_ref().unwrap();
        assert!(ckpt.top.iter().all(|b| cells[b.cell as usize].is_empty()));
        // A start keeps them by block in the checkpoint it writes; a crash right after, and
        // another. Then a clean stop before anything opened the top: all of it sealed, as
        // format 3 held it.
        for _ in 0..2 {
            drop(DurableTao::open(dir.path(), store.clone(), &key).await.unwrap());
            let again = load_checkpoint(dir.path(), &sealer).unwrap();
            let cells: Vec<u64> = again.top.iter().map(|b| b.cell).collect();
            assert_eq!(cells, ckpt.top.iter().map(|b| b.cell).collect::<Vec<_>>());
        }
        let (tao, _) = DurableTao::open(dir.path(), store.clone(), &key).await.unwrap();
        tao.shutdown().await.unwrap();
        drop(tao);
        let ckpt = load_checkpoint(dir.path(), &sealer).unwrap();
        assert_eq!(ckpt.pinned.count, 3);
        assert!(ckpt.top.is_empty());
        assert!(ckpt.pinned.cells.as_ref().unwrap().iter().all(|c| !c.is_empty()));
        let v3 = V3Checkpoint {
            store_id: ckpt.store_id,
            state: ckpt.state,
            slots: ckpt.slots,
            pinned: V3Pinned { levels: 2, cells: ckpt.pinned.cells },
            next_epoch: ckpt.next_epoch,
            seq: ckpt.seq,
        };
        write_checkpoint_as(dir.path(), V3_CHECKPOINT_MAGIC, &v3, &sealer).unwrap();
        let (tao, _) = DurableTao::open(dir.path(), store, &key).await.unwrap();
        let ids: Vec<BlockId> = blocks.iter().map(|(b, _)| *b).collect();
        let got = tao.read_many(&ids).await.unwrap();
        assert!(got.iter().zip(&blocks).all(|(g, (_, d))| g == d));
        let head = std::fs::read(dir.path().join(CHECKPOINT)).unwrap();
        assert_eq!(&head[..8], CHECKPOINT_MAGIC);
        assert_eq!(load_checkpoint(dir.path(), &sealer).unwrap().pinned.count, 3);
    }
}
