//! The ObliviStore engine (seed 001): the gateway's side, concurrent and crash-consistent.
//!
//! [`DurableObliviStore`] drives an [`ObliviStoreOram`] planner against a [`Store`]. Accesses
//! run at once, also on one partition: an access reads one slot per filled level of its
//! partition (around the levels its shuffle in flight merges, if any; see the planner's docs),
//! queues the eviction that must follow the read (a background task; a partition runs one
//! shuffle at a time, its lock) and answers as soon as its block is known. More evictions go to
//! uniformly random partitions at rate ν per access, in the background. A Path ORAM partition
//! is held by an access from its read until its write-back has landed.
//!
//! # Scheduling
//!
//! - **Answers in arrival order.** An access answers only after every access that arrived
//!   before it has answered (TaoStore's sequencer). Without it, a store that delays one
//!   partition's replies learns whether a later request asked for the same block: that
//!   request waits for the delayed read only then. `tests/oblivistore.rs` shows the leak with
//!   the order switched off and its absence with it on.
//! - **A repeated block is a fake read.** An access to a block already being accessed, cached
//!   or never written reads a uniformly random partition and takes the block from the cache.
//! - **Bounded trusted memory, public waits.** Accesses take eviction permits from a fixed
//!   pool (1,024) before they start and the evictions they cause give them back when their
//!   shuffles land; a shuffle takes room in a fixed shuffle buffer (256 MiB of blocks) for the
//!   cells it reads and writes before it reads them. How long anything waits depends only on
//!   how many accesses and evictions are in flight and on shuffle sizes (public), never on what
//!   is cached.
//!
//! # Cells
//!
//! A cell is `holder: u64 LE ‖ block` sealed with AES-256-GCM bound to the cell's address and
//! the serial of the level build that wrote it (serials are unique, reserved in the redo log
//! before use). The planner knows each slot's serial and holder, so a cell the store altered,
//! swapped or rolled back does not open, or opens to the wrong holder: [`ProxyError::Integrity`].
//!
//! # Crash consistency
//!
//! The trusted state is a sealed checkpoint and a redo log. Which slots a read takes is not
//! logged; which block it shows is, before the read goes out (a reveal record: a crash then
//! makes the rebuild send that block to a fresh partition, so its next access is not linked to
//! the cut-off one). Writes are logged at [`DurableObliviStore::commit`]; a finished shuffle is
//! logged with the data of every cached block whose stored copy it retired. Before a shuffle
//! writes, the store is flushed and the log is synced through the partition's previous record,
//! so no cell the durable state still needs is ever overwritten; the top level alternates
//! between two areas for the same reason. After an unclean stop the log is replayed and every
//! partition is rebuilt into its top level: the store may have seen any slot read since the
//! checkpoint, and a rebuild reads them all once and makes every slot fresh.
//!
//! # Path ORAM partitions (CURIOUS's tree sub-ORAM)
//!
//! With [`ObliviStoreConfig::curious_path`] each partition is a Path ORAM tree whose buckets
//! exist in two copies. An access reads the current copy of every bucket on one path (the
//! block's leaf, or a uniformly random one) and every block on it goes to the cache; the
//! eviction that follows writes that same path to the buckets' other copies, so here too no
//! cell the durable state names is overwritten. A rebuild after an unclean stop reads a whole
//! tree and writes it to the other copies under fresh leaves.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use blindfold_crypto::{CellAd, CellSealer, MasterKey, StateSealer, StoreId};
use blindfold_oram::oblivistore::{
    ObliviStoreConfig, ObliviStoreOram, ObliviStoreState, ObliviStoreStats, Shuffle, ShuffleRecord,
    SlotRead, DUMMY,
};
use blindfold_oram::{BlockId, Op};
use blindfold_store::{CellId, Geometry, Store};
use serde::{Deserialize, Serialize};

use crate::bulk::read_listed;
use crate::error::integrity;
use crate::journal::{
    decode_checkpoint, decode_record, encode_frame, open_empty_log, prepare_new_dir,
    read_frames_with_legacy, write_checkpoint_as, CHECKPOINT, REDO_LOG,
};
use crate::retry::{with_retry, RetryPolicy};
use crate::{ProxyError, Recovery, Result, VerifyReport};

const CHECKPOINT_MAGIC: &[u8; 8] = b"BFOSTC01";
/// Blocks written by clients.
const WRITES_MAGIC: u32 = 0xB1F0_5701;
/// A finished shuffle.
const SHUFFLE_MAGIC: u32 = 0xB1F0_5702;
/// Serials below a bound may be in use.
const RESERVE_MAGIC: u32 = 0xB1F0_5703;
/// Something was sent to the store since the checkpoint.
const START_MAGIC: u32 = 0xB1F0_5704;
/// An access's read is about to go out (naming the block, for a real read).
const REVEAL_MAGIC: u32 = 0xB1F0_5705;
/// Cells a whole-engine read (`verify`, `recover`, `grow`) asks the store for per request.
const SLOTS_PER_READ: u64 = 256;
/// Serials reserved at a time.
const RESERVE_STEP: u64 = 1 << 16;
/// Write a checkpoint once the log is larger than this (at a quiet moment).
const LOG_LIMIT: u64 = 256 << 20;
/// Evictions in flight at most: accesses take one permit per eviction they cause before they
/// start (each eviction holds one partition until its shuffle lands).
const EVICTION_PERMITS: u32 = 1024;
/// Bytes of blocks the shuffles in flight may hold at once (each takes as many block permits as
/// it reads and writes cells, a public number, before it reads; at least two of the largest
/// level fit whatever the block size).
const SHUFFLE_BUFFER_BYTES: u64 = 256 << 20;

#[derive(Serialize, Deserialize)]
struct Checkpoint {
    store_id: [u8; 16],
    oram: ObliviStoreState,
    /// First key epoch no run has sealed under (every start seals under a fresh one, so the
    /// random-nonce bound of one GCM key holds across restarts too).
    #[serde(default)]
    next_epoch: u32,
}

#[derive(Serialize, Deserialize)]
struct WritesRecord {
    blocks: Vec<(u64, u32, serde_bytes::ByteBuf)>,
}

#[derive(Serialize, Deserialize)]
struct ReserveRecord {
    below: u64,
    /// Key epochs below this may have been sealed under.
    #[serde(default)]
    epochs_below: u32,
}

#[derive(Serialize, Deserialize)]
struct StartRecord {
    at: u64,
}

/// Synced before an access's read goes out: the block whose place the read shows (`None`
/// for a fake read, logged all the same so that every read waits alike).
#[derive(Serialize, Deserialize)]
struct RevealRecord {
    block: Option<u64>,
}

struct St {
    oram: ObliviStoreOram,
    poisoned: Option<String>,
    /// Nothing was sent to the store since the checkpoint.
    clean: bool,
    /// Serials below this are reserved in the log (queued).
    reserved: u64,
    /// Key epochs below this are reserved in the log (queued) or the checkpoint.
    epochs_reserved: u32,
    /// Background evictions owed (ν per access).
    debt: f64,
    /// Frames waiting for the log writer, in the order of the state changes they record.
    queue: Vec<Vec<u8>>,
    /// A queued frame names cells (a shuffle's): the store is flushed before it is written.
    queue_names_cells: bool,
    /// Sequence number of the last frame queued.
    queued: u64,
    /// Per partition, the sequence number of its last record.
    last: Vec<u64>,
    /// Accesses and evictions in flight.
    active: u64,
    /// Checkpoints waiting for quiet: new accesses wait while this is not zero.
    holding: u32,
    /// Bytes in the redo log.
    log_bytes: u64,
    /// The next access read's ticket (levelled partitions).
    read_ticket: u64,
    /// Per levelled partition, the tickets of its access reads still in flight: a shuffle
    /// writes only once every read planned before it has its answer (a level it writes may
    /// be one such a read took a slot of before the level was merged).
    open_reads: HashMap<u32, BTreeSet<u64>>,
}

impl St {
    fn push(&mut self, frame: Vec<u8>) -> u64 {
        self.log_bytes += frame.len() as u64;
        self.queue.push(frame);
        self.queued += 1;
        self.queued
    }

    fn open_read(&mut self, p: u32) -> u64 {
        let t = self.read_ticket;
        self.read_ticket += 1;
        self.open_reads.entry(p).or_default().insert(t);
        t
    }

    fn close_read(&mut self, p: u32, t: u64) {
        if let Some(open) = self.open_reads.get_mut(&p) {
            open.remove(&t);
            if open.is_empty() {
                self.open_reads.remove(&p);
            }
        }
    }

    /// Whether every read of `p` with a ticket below `before` has its answer.
    fn reads_done(&self, p: u32, before: u64) -> bool {
        self.open_reads.get(&p).and_then(|o| o.first()).is_none_or(|&t| t >= before)
    }
}

struct Log {
    file: File,
    /// Sequence number of the last frame written and synced.
    synced: u64,
}

/// Answers in arrival order.
struct Sequencer {
    next: AtomicU64,
    done: parking_lot::Mutex<(u64, BTreeSet<u64>)>,
    bell: tokio::sync::watch::Sender<u64>,
}

impl Sequencer {
    fn new() -> Self {
        Self {
            next: AtomicU64::new(0),
            done: parking_lot::Mutex::new((0, BTreeSet::new())),
            bell: tokio::sync::watch::channel(0).0,
        }
    }

    fn ticket(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst)
    }

    /// Marks `t` done and returns once every ticket before it is done.
    async fn release(&self, t: u64) {
        {
            let mut d = self.done.lock();
            d.1.insert(t);
            let mut released = d.0;
            while d.1.remove(&released) {
                released += 1;
            }
            d.0 = released;
            self.bell.send_replace(released);
        }
        let mut rx = self.bell.subscribe();
        let _ = rx.wait_for(|&r| r > t).await;
    }
}

struct Inner {
    dir: PathBuf,
    store: Arc<dyn Store>,
    sealer: CellSealer,
    state_sealer: StateSealer,
    store_id: StoreId,
    st: parking_lot::Mutex<St>,
    parts: Vec<Arc<tokio::sync::Mutex<()>>>,
    log: tokio::sync::Mutex<Log>,
    /// Where the redo log is mirrored (the gateway's log in the store), once attached.
    tap: crate::journal::Tap,
    /// Bumped when a block's data arrives, an access or eviction ends, or the engine stops.
    bell: tokio::sync::watch::Sender<u64>,
    seq: Sequencer,
    permits: Arc<tokio::sync::Semaphore>,
    /// Block permits of the shuffle buffer.
    buffer: Arc<tokio::sync::Semaphore>,
    buffer_blocks: u32,
    in_order: bool,
    /// The partitions are Path ORAM trees.
    tree: bool,
}

/// The ObliviStore engine, crash-consistent; see the [module docs](self). Cheap to share:
/// every method takes `&self` and many run at once.
#[derive(Clone)]
pub struct DurableObliviStore {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DurableObliviStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableObliviStore").field("dir", &self.inner.dir).finish_non_exhaustive()
    }
}

/// Counters of a [`DurableObliviStore`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ObliviStoreEngineStats {
    /// The planner's counters.
    pub oram: ObliviStoreStats,
    /// Blocks in the eviction cache.
    pub cached: usize,
    /// Bytes of trusted state.
    pub trusted_bytes: u64,
}

fn cell_plain(holder: u64, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + data.len());
    v.extend_from_slice(&holder.to_le_bytes());
    v.extend_from_slice(data);
    v
}

impl DurableObliviStore {
    /// The store's shape for `config`.
    pub fn geometry(config: &ObliviStoreConfig) -> Result<Geometry> {
        let cells = config
            .total_cells()
            .ok_or_else(|| ProxyError::State("too many cells for one store".into()))?;
        let cell = 8 + config.block_size() as usize + CellSealer::OVERHEAD;
        Geometry::new(cells, cell as u32).map_err(ProxyError::Store)
    }

    /// Creates a new engine in `dir` over `store`: every block reads as zeros. Seals every
    /// top level's first area once (`progress(done, total)` as it goes).
    pub async fn create(
        dir: &Path,
        config: ObliviStoreConfig,
        store: Arc<dyn Store>,
        key: &MasterKey,
        store_id: StoreId,
        progress: &mut (dyn FnMut(u64, u64) + Send),
    ) -> Result<Self> {
        prepare_new_dir(dir)?;
        check_store(&*store, &config)?;
        let oram = ObliviStoreOram::new(config.clone());
        let sealer = CellSealer::new(key, store_id, 0);
        let cells: Vec<SlotRead> = oram.initial_cells().collect();
        let zeros = vec![0u8; config.block_size() as usize];
        let total = cells.len() as u64;
        let mut done = 0;
        for chunk in cells.chunks(1024) {
            let sealed = chunk
                .iter()
                .map(|c| seal(&sealer, c.cell, c.serial, c.holder, &zeros))
                .collect::<Result<Vec<_>>>()?;
            with_retry(RetryPolicy::default(), || store.write(sealed.clone())).await?;
            done += chunk.len() as u64;
            progress(done, total);
        }
        store.flush().await?;
        let state_sealer = StateSealer::new(key);
        let next_epoch = sealer.current_epoch().saturating_add(1);
        let ckpt = Checkpoint { store_id: store_id.0, oram: oram.state()?, next_epoch };
        write_checkpoint_as(dir, CHECKPOINT_MAGIC, &ckpt, &state_sealer)?;
        let log = open_empty_log(dir)?;
        Ok(Self::assemble(dir, store, sealer, state_sealer, store_id, oram, log, true))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        dir: &Path,
        store: Arc<dyn Store>,
        sealer: CellSealer,
        state_sealer: StateSealer,
        store_id: StoreId,
        oram: ObliviStoreOram,
        log: File,
        in_order: bool,
    ) -> Self {
        let partitions = oram.config().partitions() as usize;
        let c = oram.config();
        let largest = c.largest_shuffle();
        let tree = c.path_shape().is_some();
        let buffer_blocks = (SHUFFLE_BUFFER_BYTES / u64::from(c.block_size()).max(1))
            .max(4 * largest)
            .min(u64::from(u32::MAX >> 3)) as u32;
        let st = St {
            reserved: oram.next_serial(),
            epochs_reserved: sealer.current_epoch().saturating_add(1),
            oram,
            poisoned: None,
            clean: true,
            debt: 0.0,
            queue: Vec::new(),
            queue_names_cells: false,
            queued: 0,
            last: vec![0; partitions],
            active: 0,
            holding: 0,
            log_bytes: 0,
            read_ticket: 0,
            open_reads: HashMap::new(),
        };
        Self {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                store,
                sealer,
                state_sealer,
                store_id,
                st: parking_lot::Mutex::new(st),
                parts: (0..partitions).map(|_| Arc::new(tokio::sync::Mutex::new(()))).collect(),
                log: tokio::sync::Mutex::new(Log { file: log, synced: 0 }),
                tap: crate::journal::Tap::default(),
                bell: tokio::sync::watch::channel(0).0,
                seq: Sequencer::new(),
                permits: Arc::new(tokio::sync::Semaphore::new(EVICTION_PERMITS as usize)),
                buffer: Arc::new(tokio::sync::Semaphore::new(buffer_blocks as usize)),
                buffer_blocks,
                in_order,
                tree,
            }),
        }
    }

    /// Whether `dir` holds an ObliviStore engine's trusted state.
    pub fn exists(dir: &Path) -> bool {
        std::fs::read(dir.join(CHECKPOINT)).is_ok_and(|b| b.starts_with(CHECKPOINT_MAGIC))
    }

    /// Opens the engine in `dir` over `store`: loads the checkpoint, replays the redo log and,
    /// after an unclean stop, rebuilds every partition. Then writes a fresh checkpoint.
    pub async fn open(
        dir: &Path,
        store: Arc<dyn Store>,
        key: &MasterKey,
    ) -> Result<(Self, Recovery)> {
        Self::open_rotating(dir, store, key, None).await
    }

    /// As [`DurableObliviStore::open`], in the middle of a key rotation: what was sealed under
    /// `previous` (cells, checkpoint, redo log) still opens, while everything sealed from now
    /// on is sealed under `key`. A [`DurableObliviStore::sweep`] over every partition, then a
    /// commit, leaves no cell the engine will read under `previous`.
    pub async fn open_rotating(
        dir: &Path,
        store: Arc<dyn Store>,
        key: &MasterKey,
        previous: Option<&MasterKey>,
    ) -> Result<(Self, Recovery)> {
        crate::make_private(dir)?;
        let state_sealer = StateSealer::with_keys(key, previous);
        let ckpt = read_checkpoint(dir, &state_sealer)?;
        let store_id = StoreId(ckpt.store_id);
        let mut oram = ObliviStoreOram::from_state(ckpt.oram)?;
        check_store(&*store, oram.config())?;
        let mut epoch = ckpt.next_epoch;
        let log_path = dir.join(REDO_LOG);
        let (frames, _, torn) = read_frames_with_legacy(
            &log_path,
            &[WRITES_MAGIC, SHUFFLE_MAGIC, RESERVE_MAGIC, START_MAGIC, REVEAL_MAGIC],
            &[],
            &state_sealer,
        )?;
        let mut rec = Recovery { torn_bytes: torn, ..Recovery::default() };
        let bad = |m: String| ProxyError::State(format!("{}: {m}", log_path.display()));
        let mut floor = oram.next_serial();
        for (i, f) in frames.iter().enumerate() {
            // Which record a replay stopped at (the log and the record say what went wrong).
            let at = |e: blindfold_oram::OramError| match e {
                blindfold_oram::OramError::Corrupt(m) => {
                    ProxyError::from(blindfold_oram::OramError::Corrupt(format!(
                        "{}, record {} of {}: {m}",
                        log_path.display(),
                        i + 1,
                        frames.len()
                    )))
                }
                other => other.into(),
            };
            rec.replayed += 1;
            match f.magic {
                WRITES_MAGIC => {
                    let r: WritesRecord = decode_record(&f.body).map_err(bad)?;
                    let blocks: Vec<_> =
                        r.blocks.into_iter().map(|(b, t, d)| (b, t, d.into_vec())).collect();
                    oram.replay_writes(&blocks).map_err(at)?;
                }
                SHUFFLE_MAGIC => {
                    let r: ShuffleRecord = decode_record(&f.body).map_err(bad)?;
                    oram.replay_shuffle(&r).map_err(at)?;
                }
                RESERVE_MAGIC => {
                    let r: ReserveRecord = decode_record(&f.body).map_err(bad)?;
                    floor = floor.max(r.below);
                    epoch = epoch.max(r.epochs_below);
                }
                REVEAL_MAGIC => {
                    let r: RevealRecord = decode_record(&f.body).map_err(bad)?;
                    if let Some(b) = r.block {
                        oram.replay_reveal(b).map_err(at)?;
                    }
                }
                _ => {
                    decode_record::<StartRecord>(&f.body).map_err(bad)?;
                }
            }
        }
        oram.skip_serials_to(floor);
        let unclean = !frames.is_empty() || torn > 0;
        if unclean {
            // A cached block's fake read goes where it is bound: one cut off by the crash may
            // have shown that partition, so every cached block is bound afresh.
            oram.retarget_cached();
        }
        let log = crate::journal::open_log(dir)?;
        // This run seals under epochs no earlier run used, reserved in the log before the
        // first seal.
        let mut sealer = CellSealer::new(key, store_id, epoch);
        if let Some(old) = previous {
            sealer = sealer.with_previous_key(old);
        }
        let engine = Self::assemble(dir, store, sealer, state_sealer, store_id, oram, log, true);
        // Serials (after an unclean stop, above any the last run may have used) and this run's
        // key epochs, reserved before anything is sealed.
        let serials = if unclean { floor + RESERVE_STEP } else { engine.inner.st.lock().reserved };
        engine.reserve_now(serials).await?;
        if unclean {
            // The store may have seen any slot read since the checkpoint: rebuild everything.
            let partitions = engine.config().partitions();
            for p in 0..partitions {
                let sh = engine.inner.st.lock().oram.plan_rebuild(p);
                rec.cells_rewritten += sh.writes.len() as u64;
                engine.run_shuffle(sh, 0).await?;
            }
        }
        engine.checkpoint_quiet().await?;
        Ok((engine, rec))
    }

    /// Switches the arrival-order answers off (tests: shows the leak it prevents).
    pub fn set_in_order(&mut self, in_order: bool) {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.in_order = in_order;
        }
    }

    /// The planner's configuration.
    pub fn config(&self) -> ObliviStoreConfig {
        self.inner.st.lock().oram.config().clone()
    }

    /// Counters.
    pub fn stats(&self) -> ObliviStoreEngineStats {
        let s = self.inner.st.lock();
        ObliviStoreEngineStats {
            oram: s.oram.stats(),
            cached: s.oram.cached(),
            trusted_bytes: s.oram.trusted_bytes(),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// The store's id (bound into every cell).
    pub fn store_id(&self) -> StoreId {
        self.inner.store_id
    }

    /// Where every stored block lives now: `(block, cell)` (diagnostics, tests).
    pub fn block_cells(&self) -> Vec<(u64, CellId)> {
        self.inner.st.lock().oram.blocks_stored()
    }

    /// Checks the planner's invariants (tests; only when [`DurableObliviStore::settle`]d).
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.inner.st.lock().oram.check_invariants()
    }

    fn ring(&self) {
        self.inner.bell.send_modify(|v| *v += 1);
    }

    fn poison(&self, why: &ProxyError) {
        let mut s = self.inner.st.lock();
        if s.poisoned.is_none() {
            tracing::error!(error = %why, "the ObliviStore engine stopped");
            s.poisoned = Some(why.to_string());
        }
        drop(s);
        self.ring();
    }

    /// Waits until `ready` holds (checked whenever the bell rings).
    async fn wait_until(&self, mut ready: impl FnMut(&mut St) -> Result<bool>) -> Result<()> {
        let mut bell = self.inner.bell.subscribe();
        loop {
            let seen = *bell.borrow_and_update();
            {
                let mut s = self.inner.st.lock();
                if s.poisoned.is_some() {
                    return Err(ProxyError::Poisoned);
                }
                if ready(&mut s)? {
                    return Ok(());
                }
            }
            if bell.wait_for(|v| *v != seen).await.is_err() {
                return Err(ProxyError::State("the engine was dropped".into()));
            }
        }
    }

    /// Writes the queued log frames and syncs the log through `seq` (after flushing the
    /// store, so every cell a record names is durable before the record is).
    async fn sync_through(&self, seq: u64) -> Result<()> {
        let mut log = self.inner.log.lock().await;
        if self.inner.st.lock().poisoned.is_some() {
            // A stopped engine writes nothing more (as after a crash).
            return Err(ProxyError::Poisoned);
        }
        if log.synced >= seq {
            return Ok(());
        }
        let (frames, upto, names_cells) = {
            let mut s = self.inner.st.lock();
            (std::mem::take(&mut s.queue), s.queued, std::mem::take(&mut s.queue_names_cells))
        };
        // The frames are out of the queue: if they do not reach the log, no later frame may
        // either (a record that builds on a lost one would replay wrongly), so the engine stops.
        let written = async {
            // Only a shuffle's record needs its cells durable first (a reveal before a read,
            // say, does not wait for a flush of the store).
            if names_cells {
                self.inner.store.flush().await?;
            }
            crate::journal::append_frames(&log.file, &self.inner.dir, &self.inner.tap, frames)
                .await
                .map(|_| ())
        }
        .await;
        if let Err(e) = &written {
            self.poison(e);
        }
        written?;
        log.synced = upto;
        Ok(())
    }

    fn frame<T: Serialize>(&self, magic: u32, record: &T) -> Result<Vec<u8>> {
        encode_frame(magic, record, &self.inner.state_sealer)
    }

    /// Queues a reservation of serials below `below` and syncs it.
    /// (With it, key epochs up to two past the sealer's current one, so that no seal of this
    /// run uses an epoch the log does not hold.)
    async fn reserve_now(&self, below: u64) -> Result<()> {
        let epochs_below = self.inner.sealer.current_epoch().saturating_add(2);
        let seq = {
            let mut s = self.inner.st.lock();
            s.reserved = s.reserved.max(below);
            s.epochs_reserved = s.epochs_reserved.max(epochs_below);
            let r = ReserveRecord { below: s.reserved, epochs_below: s.epochs_reserved };
            let f = self.frame(RESERVE_MAGIC, &r)?;
            s.push(f)
        };
        self.sync_through(seq).await
    }

    /// Before the first store request after a checkpoint: a synced record saying requests
    /// went out, so that a crash from here on rebuilds every partition.
    async fn mark_unclean(&self) -> Result<()> {
        let f = self.frame(START_MAGIC, &StartRecord { at: 0 })?;
        let seq = {
            let mut s = self.inner.st.lock();
            if !s.clean {
                return Ok(());
            }
            s.clean = false;
            s.push(f)
        };
        self.sync_through(seq).await
    }

    block_calls!(DurableObliviStore);

    /// One access: the block's data before it. Runs as its own task, so a caller that gives
    /// up does not leave a read or a shuffle half done.
    pub async fn access(&self, block: BlockId, op: Op) -> Result<Vec<u8>> {
        let ticket = self.inner.seq.ticket();
        let me = self.clone();
        tokio::spawn(async move {
            let result = me.access_inner(block, op).await;
            if me.inner.in_order {
                // Released even if the caller went away: later answers wait for this one.
                me.inner.seq.release(ticket).await;
            }
            result
        })
        .await
        .map_err(|e| ProxyError::State(format!("an access task failed: {e}")))?
    }

    async fn access_inner(&self, block: BlockId, op: Op) -> Result<Vec<u8>> {
        self.count_in().await?;
        let result = self.access_counted(block, op).await;
        self.count_out();
        result
    }

    /// Waits while a checkpoint needs quiet, then counts one more access or sweep in flight.
    async fn count_in(&self) -> Result<()> {
        self.wait_until(|s| {
            if s.holding == 0 {
                s.active += 1;
                Ok(true)
            } else {
                Ok(false)
            }
        })
        .await
    }

    /// The end of an access, sweep or eviction counted in flight.
    fn count_out(&self) {
        self.inner.st.lock().active -= 1;
        self.ring();
    }

    async fn access_counted(&self, block: BlockId, op: Op) -> Result<Vec<u8>> {
        let inner = &self.inner;
        let b = block.0;
        // Eviction permits: this access's own eviction and the background ones it owes.
        let evictions = {
            let mut s = inner.st.lock();
            s.debt += s.oram.config().evict_rate();
            let extra = s.debt.floor();
            s.debt -= extra;
            1 + extra as u32
        };
        let permits = inner
            .permits
            .clone()
            .acquire_many_owned(evictions.min(EVICTION_PERMITS))
            .await
            .map_err(|_| ProxyError::State("the engine was closed".into()))?;
        if inner.st.lock().clean {
            self.mark_unclean().await?;
        }
        let (p, real) = inner.st.lock().oram.begin(b)?;
        // The read will show the block's partition: logged (and synced) before it goes out, so
        // that a crash from here on makes the rebuild send the block to a fresh partition
        // (else its next access after the recovery would read the same partition again).
        // Logged before the partition is locked, so the sync overlaps the wait for it; every
        // access logs one, real or fake, so every read waits alike.
        let reveal = RevealRecord { block: real.then_some(b) };
        let synced = match self.frame(REVEAL_MAGIC, &reveal) {
            Ok(f) => {
                let seq = inner.st.lock().push(f);
                self.sync_through(seq).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = synced {
            inner.st.lock().oram.unpin(b);
            self.poison(&e);
            return Err(e);
        }
        let (plan, ticket, guard, early) = if self.inner.tree {
            // A Path ORAM partition: held from its read until its write-back has landed.
            let guard = inner.parts[p as usize].clone().lock_owned().await;
            let planned = inner.st.lock().oram.plan_read(b, p, real).map_err(ProxyError::from);
            match planned {
                Ok(plan) => (plan, None, Some(guard), None),
                Err(e) => {
                    inner.st.lock().oram.unpin(b);
                    self.poison(&e);
                    return Err(e);
                }
            }
        } else {
            // A levelled partition is read around its shuffle in flight, if any (once the
            // public read counts allow). If none is, the eviction that pairs with this read is
            // planned now, so that its shuffle's reads (a public number of unread slots of the
            // levels it merges) go out beside the access's read and the log sync its writes
            // need runs meanwhile; else it waits for the partition behind the shuffles queued.
            let mut planned = None;
            let waited = self
                .wait_until(|s| {
                    if !s.oram.readable(p) {
                        return Ok(false);
                    }
                    let plan = s.oram.plan_read(b, p, real)?;
                    let ticket = s.open_read(p);
                    let guard = inner.parts[p as usize].clone().try_lock_owned().ok();
                    let sh = guard.as_ref().map(|_| (s.oram.plan_evict(p), s.read_ticket));
                    planned = Some((plan, ticket, guard, sh));
                    Ok(true)
                })
                .await;
            if let Err(e) = waited {
                inner.st.lock().oram.unpin(b);
                self.poison(&e);
                return Err(e);
            }
            let (plan, ticket, guard, sh) = planned.expect("planned when the wait ended");
            let early = match sh {
                Some((sh, before)) => match self.shuffle_room(&sh).await {
                    Ok(room) => Some((sh, before, room)),
                    Err(e) => {
                        inner.st.lock().close_read(p, ticket);
                        return Err(e);
                    }
                },
                None => None,
            };
            (plan, Some(ticket), guard, early)
        };
        let (fetched, prefetched) = match &early {
            Some((sh, _, _)) => {
                let (a, b, c) = tokio::join!(
                    self.read_slots(&plan.slots),
                    async { Ok(self.fetched(sh, self.read_slots(&sh.reads).await?)) },
                    self.before_write(sh)
                );
                (a, b.and_then(|f| c.map(|_| Some(f))))
            }
            None => (self.read_slots(&plan.slots).await, Ok(None)),
        };
        let (fetched, prefetched) = match (fetched, prefetched) {
            (Ok(f), Ok(p)) => (f, p),
            (Err(e), _) | (_, Err(e)) => {
                if let Some(t) = ticket {
                    inner.st.lock().close_read(p, t);
                }
                self.poison(&e);
                return Err(e);
            }
        };
        {
            // The block, and (a Path ORAM partition) every other block the read took, land in
            // the same step that ends the read's ticket: a shuffle waiting for the ticket may
            // retire the slot read, and its record carries the block's data only if it is
            // there (between two steps, a replay would lose the block).
            let mut s = inner.st.lock();
            for (i, data) in fetched.into_iter().enumerate() {
                if plan.real == Some(i) || plan.keep.contains(&i) {
                    let data = data.expect("a live slot holds a block");
                    s.oram.fill(plan.slots[i].holder, data);
                }
            }
            if let Some(t) = ticket {
                s.close_read(p, t);
            }
        }
        self.ring();
        // The eviction that pairs with this read, then the background ones, each holding its
        // partition until its shuffle has landed.
        let mut permits = permits;
        let own = permits.split(1).expect("at least one permit");
        match (early, prefetched, guard) {
            (Some((sh, before, room)), Some(pre), Some(guard)) => {
                self.spawn_planned_eviction(guard, own, room, sh, pre, before)
            }
            (_, _, guard) => self.spawn_eviction(p, guard, own),
        }
        while permits.num_permits() > 0 {
            let one = permits.split(1).expect("counted");
            let q = {
                use rand::Rng;
                rand::thread_rng().gen_range(0..self.config().partitions())
            };
            self.spawn_eviction(q, None, one);
        }
        // A read planned while the partition's shuffle was reading answers after those reads
        // (they may carry its block; every such access waits alike).
        if let Some(serial) = plan.after {
            if let Err(e) = self.wait_until(|s| Ok(s.oram.shuffle_arrived(p, serial))).await {
                self.inner.st.lock().oram.unpin(b);
                return Err(e);
            }
        }
        // The block's data: arrived now, or with the access it is repeated from.
        let mut result = None;
        let mut op = Some(op);
        let waited = self
            .wait_until(|s| {
                if s.oram.ready(b) {
                    result = Some(s.oram.finish(b, op.take().expect("once")));
                    Ok(true)
                } else {
                    Ok(false)
                }
            })
            .await;
        if let Err(e) = waited {
            self.inner.st.lock().oram.unpin(b);
            return Err(e);
        }
        self.ring();
        Ok(result.expect("set when ready")?)
    }

    fn spawn_eviction(
        &self,
        partition: u32,
        guard: Option<tokio::sync::OwnedMutexGuard<()>>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let me = self.clone();
        me.inner.st.lock().active += 1;
        tokio::spawn(async move {
            let guard = match guard {
                Some(g) => g,
                None => me.inner.parts[partition as usize].clone().lock_owned().await,
            };
            let planned = {
                let mut s = me.inner.st.lock();
                // A stopped engine plans nothing more (as `wait_until` refuses for the
                // accesses): a shuffle it cut short still holds the partition in the planner.
                s.poisoned.is_none().then(|| (s.oram.plan_evict(partition), s.read_ticket))
            };
            let done = match planned {
                None => Ok(()),
                Some((sh, before)) => match me.shuffle_room(&sh).await {
                    Ok(_room) => me.run_shuffle(sh, before).await,
                    Err(e) => Err(e),
                },
            };
            if let Err(e) = done {
                me.poison(&e);
            }
            drop(guard);
            drop(permit);
            me.count_out();
        });
    }

    /// Room in the shuffle buffer for what `sh` reads and writes (its size follows from the
    /// partition's counter: a public wait).
    async fn shuffle_room(&self, sh: &Shuffle) -> Result<tokio::sync::OwnedSemaphorePermit> {
        let want = ((sh.reads.len() + sh.writes.len()) as u32).min(self.inner.buffer_blocks);
        self.inner
            .buffer
            .clone()
            .acquire_many_owned(want)
            .await
            .map_err(|_| ProxyError::State("the engine was closed".into()))
    }

    /// The eviction planned with an access's read, its cells read and its log sync done:
    /// writes the new level and logs it, holding the partition until then.
    fn spawn_planned_eviction(
        &self,
        guard: tokio::sync::OwnedMutexGuard<()>,
        permit: tokio::sync::OwnedSemaphorePermit,
        room: tokio::sync::OwnedSemaphorePermit,
        sh: Shuffle,
        blocks: HashMap<u64, Vec<u8>>,
        before: u64,
    ) {
        let me = self.clone();
        me.inner.st.lock().active += 1;
        tokio::spawn(async move {
            if let Err(e) = me.write_shuffle(sh, blocks, before).await {
                me.poison(&e);
            }
            drop(room);
            drop(guard);
            drop(permit);
            me.count_out();
        });
    }

    /// Reads and opens `slots`: each one's block data if it holds a block.
    async fn read_slots(&self, slots: &[SlotRead]) -> Result<Vec<Option<Vec<u8>>>> {
        if slots.is_empty() {
            return Ok(Vec::new());
        }
        let cells: Vec<CellId> = slots.iter().map(|s| s.cell).collect();
        let store = &self.inner.store;
        let raw = with_retry(RetryPolicy::default(), || store.read(&cells)).await?;
        if raw.len() != slots.len() {
            return Err(ProxyError::State("the store answered the wrong number of cells".into()));
        }
        let sealer = &self.inner.sealer;
        let bs = self.inner.st.lock().oram.config().block_size() as usize;
        raw.into_iter().zip(slots).map(|(bytes, s)| open_slot(sealer, bs, s, &bytes)).collect()
    }

    /// Carries out a shuffle the caller holds the partition for, and logs it (`before`: the
    /// first access read ticket not planned before it).
    async fn run_shuffle(&self, sh: Shuffle, before: u64) -> Result<()> {
        self.before_write(&sh).await?;
        let blocks = self.fetched(&sh, self.read_slots(&sh.reads).await?);
        self.write_shuffle(sh, blocks, before).await
    }

    /// A shuffle's reads arrived (`fetched`, in the order of `sh.reads`): the live blocks
    /// among them and their data, of which the planner gets a copy for the accesses reading
    /// around the shuffle (levelled partitions).
    fn fetched(&self, sh: &Shuffle, fetched: Vec<Option<Vec<u8>>>) -> HashMap<u64, Vec<u8>> {
        let live: HashMap<u64, Vec<u8>> = sh
            .reads
            .iter()
            .zip(fetched)
            .zip(&sh.live)
            .filter_map(|((s, d), &live)| Some((s.holder, d.filter(|_| live)?)))
            .collect();
        if !self.inner.tree {
            self.inner.st.lock().oram.shuffle_fetched(sh.partition, sh.serial, live.clone());
            self.ring();
        }
        live
    }

    /// What must be durable before a shuffle of a partition the caller holds writes: its
    /// serial reserved, and the partition's previous record (which retired the levels it
    /// writes) in the log.
    async fn before_write(&self, sh: &Shuffle) -> Result<()> {
        let p = sh.partition;
        let (need, reserve) = {
            let s = self.inner.st.lock();
            // A new serial, or a seal that may reach an epoch not reserved yet: reserve more.
            let epoch_due =
                self.inner.sealer.current_epoch().saturating_add(1) >= s.epochs_reserved;
            let serial_due = sh.serial >= s.reserved;
            (
                s.last[p as usize],
                (serial_due || epoch_due).then_some(s.reserved.max(sh.serial + RESERVE_STEP)),
            )
        };
        if let Some(below) = reserve {
            self.reserve_now(below).await?;
        }
        self.sync_through(need).await
    }

    /// Writes a shuffle whose cells were read (`blocks`: the live ones, from
    /// [`DurableObliviStore::fetched`]) and whose [`DurableObliviStore::before_write`] is
    /// done, once every access read of the partition planned before it (tickets below
    /// `before`) has its answer; then logs it.
    async fn write_shuffle(
        &self,
        sh: Shuffle,
        mut blocks: HashMap<u64, Vec<u8>>,
        before: u64,
    ) -> Result<()> {
        let p = sh.partition;
        self.wait_until(|s| Ok(s.reads_done(p, before))).await?;
        let bs = self.inner.st.lock().oram.config().block_size() as usize;
        let zeros = vec![0u8; bs];
        let mut cells = Vec::with_capacity(sh.writes.len());
        for &(cell, holder) in &sh.writes {
            let data: &[u8] = if holder == DUMMY {
                &zeros
            } else if let Some((_, d)) = sh.evicted.iter().find(|(b, _)| *b == holder) {
                d
            } else {
                blocks
                    .get(&holder)
                    .ok_or_else(|| ProxyError::State(format!("a shuffle lost block {holder}")))?
            };
            cells.push(seal(&self.inner.sealer, cell, sh.serial, holder, data)?);
        }
        if self.inner.st.lock().poisoned.is_some() {
            return Err(ProxyError::Poisoned);
        }
        let store = &self.inner.store;
        with_retry(RetryPolicy::default(), || store.write(cells.clone())).await?;
        let spilled: Vec<(u64, Vec<u8>)> =
            sh.spill.iter().filter_map(|b| blocks.remove(b).map(|d| (*b, d))).collect();
        let mut s = self.inner.st.lock();
        let record = s.oram.finish_shuffle(sh, spilled)?;
        let frame = self.frame(SHUFFLE_MAGIC, &record)?;
        let seq = s.push(frame);
        s.queue_names_cells = true;
        s.last[p as usize] = seq;
        Ok(())
    }

    /// Partitions a key rotation's sweep rebuilds, one "path" each (see
    /// [`DurableObliviStore::sweep`]).
    pub fn sweep_paths(&self) -> u64 {
        u64::from(self.config().partitions())
    }

    /// Rebuilds the partitions `range`, in order, each into fresh cells sealed under the
    /// current key (a key rotation): every cell of the partition the engine may read again is
    /// rewritten. Which partitions it touches depends only on `range`, and each rebuild reads
    /// the partition's unread cells and writes its top level (or a whole tree), as after a
    /// restart. Runs alongside requests; durable after the next
    /// [`DurableObliviStore::commit`].
    pub async fn sweep(&self, range: std::ops::Range<u64>) -> Result<()> {
        if range.end > self.sweep_paths() {
            return Err(ProxyError::State(format!(
                "a sweep up to partition {} of {}",
                range.end,
                self.sweep_paths()
            )));
        }
        for p in range {
            self.count_in().await?;
            let done = self.sweep_one(p as u32).await;
            self.count_out();
            done?;
        }
        Ok(())
    }

    async fn sweep_one(&self, p: u32) -> Result<()> {
        if self.inner.st.lock().clean {
            self.mark_unclean().await?;
        }
        let _guard = self.inner.parts[p as usize].clone().lock_owned().await;
        let (sh, before) = {
            let mut s = self.inner.st.lock();
            (s.oram.plan_rebuild(p), s.read_ticket)
        };
        let _room = self.shuffle_room(&sh).await?;
        let mut done = self.run_shuffle(sh, before).await;
        if done.is_ok() {
            done = self.clear_small_levels(p).await;
        }
        if let Err(e) = &done {
            self.poison(e);
        }
        done
    }

    /// After a rebuild of the levelled partition `p` (its partition lock held): its small
    /// levels hold nothing it will read again, but their cells keep what earlier builds
    /// sealed (during a key rotation: under the key being retired). Once the rebuild's record
    /// is durable — until then a crash replays the levels the rebuild retired, and needs their
    /// cells — every cell of every small level is overwritten, in cell order, with a dummy
    /// sealed under the current key and bound to a serial no level has (`u64::MAX`), and the
    /// store is flushed. Which cells depends only on `p`. Path ORAM partitions have no small
    /// levels: a rebuild writes every bucket's other copy.
    async fn clear_small_levels(&self, p: u32) -> Result<()> {
        let (cells, bs, last) = {
            let s = self.inner.st.lock();
            let config = s.oram.config();
            if config.path_shape().is_some() {
                return Ok(());
            }
            let small: u64 = (0..config.levels()).map(|l| config.level_slots(l)).sum();
            let first = config.cell(p, 0, 0, 0).0;
            (first..first + small, config.block_size() as usize, s.last[p as usize])
        };
        if cells.is_empty() {
            return Ok(());
        }
        self.sync_through(last).await?;
        let zeros = vec![0u8; bs];
        let sealed = cells
            .map(|c| seal(&self.inner.sealer, CellId(c), u64::MAX, DUMMY, &zeros))
            .collect::<Result<Vec<_>>>()?;
        let store = &self.inner.store;
        for chunk in sealed.chunks(1024) {
            with_retry(RetryPolicy::default(), || store.write(chunk.to_vec())).await?;
        }
        with_retry(RetryPolicy::default(), || store.flush()).await?;
        Ok(())
    }

    /// Makes every write that completed before this call durable.
    pub async fn commit(&self) -> Result<()> {
        let seq = {
            let mut s = self.inner.st.lock();
            if s.poisoned.is_some() {
                // Why was logged when it stopped.
                return Err(ProxyError::Poisoned);
            }
            let dirty = s.oram.take_dirty();
            if dirty.is_empty() {
                s.queued
            } else {
                let blocks = dirty
                    .into_iter()
                    .map(|(b, t, d)| (b, t, serde_bytes::ByteBuf::from(d)))
                    .collect();
                let f = self.frame(WRITES_MAGIC, &WritesRecord { blocks })?;
                s.push(f)
            }
        };
        self.sync_through(seq).await?;
        let big = self.inner.st.lock().log_bytes > LOG_LIMIT || self.inner.tap.wants_checkpoint();
        if big {
            self.checkpoint().await?;
        }
        Ok(())
    }

    /// Where this engine's redo log is mirrored ([`crate::Tap::attach`]).
    pub fn tap(&self) -> crate::journal::Tap {
        self.inner.tap.clone()
    }

    /// Waits until no access or eviction is in flight.
    pub async fn settle(&self) -> Result<()> {
        self.wait_until(|s| Ok(s.active == 0)).await
    }

    /// Commits and writes a checkpoint (new accesses wait meanwhile); the engine stays usable.
    pub async fn checkpoint(&self) -> Result<()> {
        self.inner.st.lock().holding += 1;
        let quiet = self.wait_until(|s| Ok(s.active == 0)).await;
        let result = match quiet {
            Ok(()) => self.checkpoint_quiet().await,
            Err(e) => Err(e),
        };
        self.inner.st.lock().holding -= 1;
        self.ring();
        result
    }

    async fn checkpoint_quiet(&self) -> Result<()> {
        let mut log = self.inner.log.lock().await;
        self.inner.store.flush().await?;
        let ckpt = {
            let s = self.inner.st.lock();
            let next_epoch =
                s.epochs_reserved.max(self.inner.sealer.current_epoch().saturating_add(1));
            Checkpoint { store_id: self.inner.store_id.0, oram: s.oram.state()?, next_epoch }
        };
        write_checkpoint_as(&self.inner.dir, CHECKPOINT_MAGIC, &ckpt, &self.inner.state_sealer)?;
        log.file = open_empty_log(&self.inner.dir)?;
        {
            let mut s = self.inner.st.lock();
            s.queue.clear();
            s.queue_names_cells = false;
            log.synced = s.queued;
            s.clean = true;
            s.log_bytes = 0;
            s.reserved = s.oram.next_serial();
        }
        // Still under the log's lock: no frame comes between the checkpoint and the mirror's
        // record of it.
        self.inner.tap.checkpointed(&self.inner.dir).await
    }

    /// Clean shutdown: a checkpoint, after which nothing needs replaying.
    pub async fn shutdown(&self) -> Result<()> {
        self.commit().await?;
        self.checkpoint().await
    }

    /// Stops the engine as a crash would (tests): nothing more is written.
    pub fn halt(&self) {
        self.poison(&ProxyError::State("halted".into()));
    }

    /// Authenticates every cell of every filled level (`progress(done, total)`).
    pub async fn verify(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<VerifyReport> {
        self.inner.st.lock().holding += 1;
        let result = async {
            self.wait_until(|s| Ok(s.active == 0)).await?;
            let (slots, bs) = {
                let s = self.inner.st.lock();
                (s.oram.filled_cells(), s.oram.config().block_size() as usize)
            };
            let mut report = VerifyReport::default();
            let total = slots.len() as u64;
            open_slots_in_order(&*self.inner.store, &self.inner.sealer, bs, &slots, |s, opened| {
                match opened {
                    Ok(_) => report.cells_checked += 1,
                    Err(e) => report.failures.push((s.cell.0, e.to_string())),
                }
                let done = report.cells_checked + report.failures.len() as u64;
                if done.is_multiple_of(SLOTS_PER_READ) || done == total {
                    progress(done, total);
                }
                Ok(())
            })
            .await?;
            Ok(report)
        }
        .await;
        self.inner.st.lock().holding -= 1;
        self.ring();
        result
    }
}

/// Opens the cell `bytes` read for `s` (blocks of `bs` bytes): its block's data, `None` for a
/// dummy; an integrity error if it does not open under its serial or holds another block.
pub(crate) fn open_slot(
    sealer: &CellSealer,
    bs: usize,
    s: &SlotRead,
    bytes: &[u8],
) -> Result<Option<Vec<u8>>> {
    let ad = CellAd { cell: s.cell.0, version: s.serial, segment: 0 };
    let plain = sealer.open(&ad, bytes).map_err(|e| integrity(s.cell.0, e))?;
    if plain.len() != 8 + bs
        || u64::from_le_bytes(plain[..8].try_into().expect("8 bytes")) != s.holder
    {
        return Err(ProxyError::Integrity {
            cell: s.cell.0,
            source: blindfold_crypto::CryptoError::Malformed(
                "the cell holds another block than it should".into(),
            ),
        });
    }
    Ok((s.holder != DUMMY).then(|| plain[8..].to_vec()))
}

/// Reads `slots` from `store` in order ([`SLOTS_PER_READ`] per request, several requests in
/// flight) and hands each to `take` with what opening it gave: its block's data (`None`: a
/// dummy) or an integrity error. Any other error stops the read.
pub(crate) async fn open_slots_in_order(
    store: &dyn Store,
    sealer: &CellSealer,
    bs: usize,
    slots: &[SlotRead],
    mut take: impl FnMut(&SlotRead, Result<Option<Vec<u8>>>) -> Result<()>,
) -> Result<()> {
    use futures::StreamExt;
    let cells: Vec<CellId> = slots.iter().map(|s| s.cell).collect();
    let mut reads =
        std::pin::pin!(read_listed(store, RetryPolicy::default(), &cells, SLOTS_PER_READ));
    while let Some(read) = reads.next().await {
        let (start, fetched) = read?;
        for (s, bytes) in slots[start as usize..].iter().zip(fetched) {
            match open_slot(sealer, bs, s, &bytes) {
                Err(e) if !e.is_integrity() => return Err(e),
                opened => take(s, opened)?,
            }
        }
    }
    Ok(())
}

/// A saved engine's trusted state, as `recover` and a growth read it.
pub(crate) struct SavedObliviStore {
    pub store_id: StoreId,
    pub oram: ObliviStoreOram,
    pub next_epoch: u32,
}

fn read_checkpoint(dir: &Path, state_sealer: &StateSealer) -> Result<Checkpoint> {
    let path = dir.join(CHECKPOINT);
    let raw = std::fs::read(&path).map_err(|e| crate::journal::io(&path, "reading", e))?;
    decode_checkpoint(&raw, CHECKPOINT_MAGIC, state_sealer)
        .map_err(|m| ProxyError::State(format!("{}: {m}", path.display())))
}

/// Loads the checkpoint in `dir` (of an engine stopped cleanly, or a snapshot's).
pub(crate) fn load_saved(dir: &Path, key: &MasterKey) -> Result<SavedObliviStore> {
    let ckpt = read_checkpoint(dir, &StateSealer::new(key))?;
    Ok(SavedObliviStore {
        store_id: StoreId(ckpt.store_id),
        oram: ObliviStoreOram::from_state(ckpt.oram)?,
        next_epoch: ckpt.next_epoch,
    })
}

/// Replaces the checkpoint in `dir` with `saved` (atomically) and removes any redo log.
pub(crate) fn save_rebuilt(dir: &Path, saved: SavedObliviStore, key: &MasterKey) -> Result<()> {
    let ckpt = Checkpoint {
        store_id: saved.store_id.0,
        oram: saved.oram.state()?,
        next_epoch: saved.next_epoch,
    };
    crate::journal::remove_log(dir)?;
    write_checkpoint_as(dir, CHECKPOINT_MAGIC, &ckpt, &StateSealer::new(key))
}

/// Checks that `store` has the shape [`DurableObliviStore::geometry`] gives for `config`.
pub(crate) fn check_store(store: &dyn Store, config: &ObliviStoreConfig) -> Result<()> {
    crate::error::check_array(store.geometry(), DurableObliviStore::geometry(config)?, "the store")
}

pub(crate) fn seal(
    sealer: &CellSealer,
    cell: CellId,
    serial: u64,
    holder: u64,
    data: &[u8],
) -> Result<(CellId, Vec<u8>)> {
    let ad = CellAd { cell: cell.0, version: serial, segment: 0 };
    sealer.seal(&ad, &cell_plain(holder, data)).map(|s| (cell, s)).map_err(ProxyError::Crypto)
}
