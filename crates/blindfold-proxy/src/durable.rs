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
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blindfold_crypto::{CellAd, CellSealer, MasterKey, StateSealer, StoreId};
use blindfold_oram::{BlockId, Op, OramDelta, PathOram, PathOramConfig, PathOramState, Progress};
use blindfold_store::{CellId, Store};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::bulk::{read_in_order, write_batches};
use crate::journal::{
    append_record, append_reveal, decode_record, empty_log, encode_frame, prepare_new_dir,
    read_any_checkpoint, read_frames_with_legacy, read_prev_checkpoint, remove_log, replace_log,
    write_checkpoint_as, Tap, CHECKPOINT, REDO_LOG,
};
use crate::retry::{with_retry, RetryPolicy};
use crate::sealing::{check_geometry, open_cells, seal_cells};
use crate::slots::{slotted_geometry, SlotMap, SlottedStore};
use crate::{ProxyError, Result, SealedPathOram, VersionTable};

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
#[derive(Clone, Serialize, Deserialize)]
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
    /// Commit records dropped because their cells never all reached the store: logged beside
    /// them under `--durability store` and cut off by a crash, before anything was
    /// acknowledged on them.
    pub dropped: u64,
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
    /// Where the redo log is mirrored (the gateway's log in the store), once attached.
    tap: Tap,
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

fn write_checkpoint(dir: &Path, ckpt: &Checkpoint, sealer: &StateSealer) -> Result<()> {
    write_checkpoint_as(dir, CHECKPOINT_MAGIC, ckpt, sealer)
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
            tap: Tap::default(),
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

    /// Where this engine's redo log is mirrored ([`Tap::attach`]).
    pub fn tap(&self) -> Tap {
        self.tap.clone()
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
            let frame = encode_frame(REVEAL_MAGIC, &reveal, &self.state_sealer);
            let appended = match frame {
                Ok(frame) => append_reveal(&self.log, &self.dir, &self.tap, frame).await,
                Err(e) => Err(e),
            };
            match appended {
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
            if self.log_bytes > self.log_limit || self.tap.wants_checkpoint() {
                self.checkpoint()?;
                self.tap.checkpointed(&self.dir).await?;
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
        if self.log_bytes > self.log_limit || self.tap.wants_checkpoint() {
            self.checkpoint()?;
            self.tap.checkpointed(&self.dir).await?;
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
        let len = append_record(
            &self.log,
            &self.dir,
            &self.tap,
            SLOT_RECORD_MAGIC,
            &record,
            &self.state_sealer,
        )
        .await?;
        // Durable from here on: the record says where every cell's newest copy is.
        self.log_bytes += len;
        self.seq = record.seq;
        slotted.publish();
        Ok(())
    }

    async fn log_and_apply(&mut self, record: Record) -> Result<()> {
        let len = append_record(
            &self.log,
            &self.dir,
            &self.tap,
            RECORD_MAGIC,
            &record,
            &self.state_sealer,
        )
        .await?;
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
    use crate::journal::{decode_checkpoint, decode_frames};

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
    use crate::journal::{decode_checkpoint, decode_frames};
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
