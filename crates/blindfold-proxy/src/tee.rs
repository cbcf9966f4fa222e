//! The TEE-assisted engine (seed 004): the gateway's side, crash-consistent.
//!
//! [`DurableTee`] drives a [`TeeOram`] planner against a [`TeeStore`]: a store whose host runs
//! the trusted component (`blindfold_tee::Enclave`) beside the cells. Per query the gateway
//! sends the cells of one path and a sealed ticket naming which of them it wants; the trusted
//! component selects it obliviously, checks its seal and returns it sealed for the gateway.
//! Every `k` queries a round goes up: the blocks waiting in the gateway's ring, sealed, and one
//! sealed permutation per layer of the next eviction path. Many queries run at once; a round
//! runs in the background while queries go on (they read the areas the round does not write).
//!
//! # Cells
//!
//! Every cell is sealed twice (`blindfold_tee::TeeCipher`): AES-256-GCM bound to what the cell
//! holds — `(block, serial)` or `(dummy, serial)`, serials unique per sealing — and to the store,
//! then the SHA-256-XOR layer the trusted component refreshes at every eviction. The planner
//! knows what every slot holds, so the trusted component checks the selected cell against
//! exactly that: a cell the store altered, swapped with another or rolled back to an earlier
//! sealing does not open, and the query fails with [`ProxyError::Integrity`].
//!
//! # Tickets
//!
//! A query ticket names what every one of its cells holds (the trusted component opens each
//! under that and refuses the query if any does not open, so the store cannot hand a ticket
//! other cells to learn from the answer which one was wanted) and carries the next number of
//! one of [`QUERY_STREAMS`] query streams, taken for the query while it is in flight: the
//! component answers a number once, and only above the last it answered on the stream, so a
//! captured ticket cannot be replayed or delivered out of order. Eviction tickets carry their
//! `(round, layer)`, checked the same way on the store id's stream.
//!
//! # Crash consistency
//!
//! The trusted state lives in a directory: a sealed checkpoint and a redo log (the same frame
//! format as [`crate::DurablePathOram`]'s). Writes go to the ring; [`DurableTee::commit`] logs
//! the ring's new data and fsyncs. A round is logged (with the ring's new data, the tags that go
//! up, the fresh leaves and the permutations) and fsynced *before* it is sent, and marked done
//! after. Rounds write only the other area of each node, so a round cut short by a crash is
//! carried out again from the intact areas it reads. After a crash the gateway does not know
//! which slots the store saw read, so every node is reshuffled before it is read again
//! ([`TeeOram::exhaust_all`]).

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blindfold_crypto::{CryptoError, MasterKey, StateSealer, StoreId};
use blindfold_oram::tee::{
    QueryStep, RoundPlan, RoundRecord, SlotTag, TeeOram, TeeOramConfig, TeeOramState, TeeOramStats,
};
use blindfold_oram::{BlockId, Op};
use blindfold_store::{CellId, Geometry, Store, StoreError, TeeLayer, TeeRound, TeeStore};
use blindfold_tee::{EvictTicket, QueryTicket, TeeCipher, TeeKey};
use serde::{Deserialize, Serialize};

use crate::journal::{
    append_record, decode_checkpoint, decode_record, open_empty_log, prepare_new_dir,
    read_frames_with_legacy, write_checkpoint_as, CHECKPOINT, REDO_LOG,
};
use crate::retry::{with_retry, RetryPolicy};
use crate::{ProxyError, Recovery, Result, VerifyReport};

const CHECKPOINT_MAGIC: &[u8; 8] = b"BFTEEC01";
/// The ring's new data (a commit).
const RING_MAGIC: u32 = 0xB1F0_7E01;
/// A round, logged before it is sent, with the ring's new data.
const ROUND_MAGIC: u32 = 0xB1F0_7E02;
/// A round the store carried out.
const DONE_MAGIC: u32 = 0xB1F0_7E03;
/// Write a checkpoint at shutdown, and on open, once the log is larger than this.
const LOG_LIMIT: u64 = 256 << 20;
/// Queries wait while this many rounds' worth of blocks wait in the ring.
const RING_ROUNDS: usize = 3;
/// Query streams: queries in flight at once (more wait for a stream). Each stream carries one
/// query at a time, so the trusted component sees every stream's ticket numbers in order.
const QUERY_STREAMS: usize = 64;

/// The query streams of a [`DurableTee`]: each has its own id (derived from the store id) and
/// next ticket number. A query takes a free stream for as long as its ticket (or the tickets of
/// its retries) may be in flight, so the numbers a stream's tickets reach the trusted component
/// with always increase, and the component can refuse every ticket that is not newer than the
/// last it answered on its stream (a replay, or one held back and delivered late).
///
/// The numbers start, when the engine is created or opened, from the clock in microseconds, as
/// the numbers of rounds carried out again after a crash do: above any number an earlier run
/// can have used (none sends a query per microsecond per stream), so a trusted component that
/// lived on across a crash still answers. A clock set back by more than the earlier run's
/// lifetime would have its queries refused (as replays) until it catches up.
struct Lanes {
    free: parking_lot::Mutex<Vec<(usize, u64)>>,
    permits: tokio::sync::Semaphore,
    store_id: StoreId,
}

/// A query stream taken by one query; given back when dropped.
struct Lane<'a> {
    lanes: &'a Lanes,
    index: usize,
    next: u64,
    _permit: tokio::sync::SemaphorePermit<'a>,
}

impl Lanes {
    fn new(store_id: StoreId) -> Self {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64);
        Self {
            // Popped from the end: a query alone always takes stream 0.
            free: parking_lot::Mutex::new((0..QUERY_STREAMS).rev().map(|i| (i, start)).collect()),
            permits: tokio::sync::Semaphore::new(QUERY_STREAMS),
            store_id,
        }
    }

    async fn take(&self) -> Result<Lane<'_>> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| ProxyError::State("the query streams were closed".into()))?;
        let (index, next) = self.free.lock().pop().expect("a permit means a free stream");
        Ok(Lane { lanes: self, index, next, _permit: permit })
    }
}

impl Lane<'_> {
    /// The stream's id: the store id with the stream's number folded into its last two bytes
    /// and its first byte flipped (the rounds' stream is the store id itself).
    fn stream(&self) -> [u8; 16] {
        let mut s = self.lanes.store_id.0;
        s[0] ^= 0xa5;
        let i = (self.index as u16).to_le_bytes();
        s[14] ^= i[0];
        s[15] ^= i[1];
        s
    }

    /// The next ticket number of the stream.
    fn number(&mut self) -> u64 {
        let n = self.next;
        self.next += 1;
        n
    }
}

impl Drop for Lane<'_> {
    fn drop(&mut self) {
        self.lanes.free.lock().push((self.index, self.next));
    }
}

#[derive(Serialize, Deserialize)]
struct Checkpoint {
    store_id: [u8; 16],
    oram: TeeOramState,
}

#[derive(Serialize, Deserialize)]
struct RingRecord {
    blocks: Vec<(u64, Vec<u8>)>,
}

#[derive(Serialize, Deserialize)]
struct RoundLog {
    ring: Vec<(u64, Vec<u8>)>,
    round: RoundRecord,
}

#[derive(Serialize, Deserialize)]
struct DoneRecord {
    round: u64,
}

/// The associated data a cell's inner seal binds: what it holds, and the store.
fn cell_ad(store: &StoreId, tag: SlotTag) -> [u8; 32] {
    let mut ad = [0u8; 32];
    ad[..8].copy_from_slice(&tag.block.to_le_bytes());
    ad[8..16].copy_from_slice(&tag.serial.to_le_bytes());
    ad[16..].copy_from_slice(&store.0);
    ad
}

/// Blocks a new engine starts with: `count` blocks (0, 1, …), block `b` holding `fill(b)`.
pub struct Preload<'a> {
    /// How many.
    pub count: u64,
    /// Each one's data.
    pub fill: &'a (dyn Fn(u64) -> Vec<u8> + Sync),
}

impl std::fmt::Debug for Preload<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Preload").field("count", &self.count).finish_non_exhaustive()
    }
}

impl Preload<'_> {
    /// No blocks: every block reads as zeros.
    pub fn none() -> Preload<'static> {
        Preload { count: 0, fill: &|_| Vec::new() }
    }
}

struct Sched {
    oram: TeeOram,
    /// Blocks with an access in progress (one access per block at a time).
    busy: HashSet<u64>,
    /// Blocks whose data in the ring the redo log has not seen.
    dirty: HashSet<u64>,
    /// Rounds landed (each makes other areas current).
    generation: u64,
    /// Queries in flight, by the generation they were planned in.
    outstanding: BTreeMap<u64, usize>,
    /// A round (not a reshuffle) is being prepared or carried out.
    rounding: bool,
    /// Why the engine stopped, if it did.
    poisoned: Option<String>,
    /// Bytes in the redo log.
    log_bytes: u64,
    /// Checkpoints waiting for quiet: new accesses wait while this is not zero.
    holding: u32,
    /// Accesses that waited (for a round, a reshuffle, a checkpoint or room in the ring).
    waits: u64,
    /// Nothing was sent to the store since the checkpoint: before the first query, the log
    /// gets a record saying otherwise, so that a crash after it has every node reshuffled.
    clean: bool,
}

impl Sched {
    fn oldest_outstanding(&self) -> Option<u64> {
        self.outstanding.iter().find(|(_, &n)| n > 0).map(|(&g, _)| g)
    }

    fn take_dirty(&mut self) -> Vec<(u64, Vec<u8>)> {
        let mut out: Vec<(u64, Vec<u8>)> = self
            .dirty
            .drain()
            .filter_map(|b| self.oram.ring_data(b).map(|d| (b, d.to_vec())))
            .collect();
        out.sort_unstable_by_key(|(b, _)| *b);
        out
    }
}

struct Inner {
    dir: PathBuf,
    store: Arc<dyn TeeStore>,
    cipher: TeeCipher,
    store_id: StoreId,
    sealer: StateSealer,
    sched: parking_lot::Mutex<Sched>,
    /// Bumped whenever something a waiting access may wait for changes.
    bell: tokio::sync::watch::Sender<u64>,
    log: tokio::sync::Mutex<File>,
    /// Where the redo log is mirrored (the gateway's log in the store), once attached.
    tap: crate::journal::Tap,
    lanes: Lanes,
}

/// The TEE-assisted engine, crash-consistent; see the [module docs](self). Cheap to share:
/// every method takes `&self` and many run at once.
#[derive(Clone)]
pub struct DurableTee {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DurableTee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableTee").field("dir", &self.inner.dir).finish_non_exhaustive()
    }
}

/// Counters of a [`DurableTee`].
#[derive(Clone, Copy, Debug, Default)]
pub struct TeeEngineStats {
    /// The planner's counters.
    pub oram: TeeOramStats,
    /// Blocks waiting in the ring.
    pub waiting: usize,
    /// Bytes of trusted state.
    pub trusted_bytes: u64,
}

impl DurableTee {
    /// The store's shape for `config`: every node's two areas, cells of the double-sealed size.
    pub fn geometry(config: &TeeOramConfig) -> Result<Geometry> {
        let cell = blindfold_tee::cell_len(config.block_size() as usize);
        if cell > u32::MAX as usize {
            return Err(ProxyError::State("blocks too large for a cell".into()));
        }
        Geometry::new(config.total_cells(), cell as u32).map_err(ProxyError::Store)
    }

    /// The key the trusted component shares with gateways of this master key (give it to the
    /// trusted component's host with `blindfold enclave-key`). One per master key, so the host
    /// can be set up before a gateway creates its store; every cell and ticket binds the
    /// store's id instead.
    pub fn tee_key(key: &MasterKey) -> TeeKey {
        TeeKey::derive_from_master(key, &StoreId([0; 16]))
    }

    /// Creates a new engine in `dir` over `store`, every block reading as zeros except those of
    /// `preload` (a bulk load straight into the leaves). Seals every
    /// cell of the current areas once (`progress(done, total)` as it goes).
    pub async fn create(
        dir: &Path,
        config: TeeOramConfig,
        store: Arc<dyn TeeStore>,
        key: &MasterKey,
        store_id: StoreId,
        preload: Preload<'_>,
        progress: &mut (dyn FnMut(u64, u64) + Send),
    ) -> Result<Self> {
        let (loaded, fill) = (preload.count, preload.fill);
        prepare_new_dir(dir)?;
        check_geometry(&store, &config)?;
        let mut oram = TeeOram::new(config.clone());
        oram.bulk_place(loaded)?;
        let cipher = TeeCipher::new(&Self::tee_key(key), config.block_size() as usize);
        let total = config.total_cells() / 2;
        let cells: Vec<(CellId, SlotTag)> = oram.initial_cells().collect();
        let bs = config.block_size() as usize;
        let mut done = 0u64;
        for chunk in cells.chunks(1024) {
            let sealed = chunk
                .iter()
                .map(|&(c, t)| {
                    let data = if t.block == blindfold_oram::tee::DUMMY {
                        vec![0u8; bs]
                    } else {
                        fill(t.block)
                    };
                    cipher.seal(&cell_ad(&store_id, t), &data).map(|s| (c, s))
                })
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| ProxyError::State(format!("sealing the first cells: {e}")))?;
            with_retry(RetryPolicy::default(), || store.write(sealed.clone())).await?;
            done += chunk.len() as u64;
            progress(done, total);
        }
        store.flush().await?;
        let sealer = StateSealer::new(key);
        let ckpt = Checkpoint { store_id: store_id.0, oram: oram.state()? };
        write_checkpoint_as(dir, CHECKPOINT_MAGIC, &ckpt, &sealer)?;
        let log = open_empty_log(dir)?;
        Ok(Self::assemble(dir, store, cipher, store_id, sealer, oram, log, 0))
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        dir: &Path,
        store: Arc<dyn TeeStore>,
        cipher: TeeCipher,
        store_id: StoreId,
        sealer: StateSealer,
        oram: TeeOram,
        log: File,
        log_bytes: u64,
    ) -> Self {
        let sched = Sched {
            oram,
            busy: HashSet::new(),
            dirty: HashSet::new(),
            generation: 0,
            outstanding: BTreeMap::new(),
            rounding: false,
            poisoned: None,
            log_bytes,
            holding: 0,
            waits: 0,
            clean: true,
        };
        Self {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                store,
                cipher,
                store_id,
                sealer,
                sched: parking_lot::Mutex::new(sched),
                bell: tokio::sync::watch::channel(0).0,
                log: tokio::sync::Mutex::new(log),
                tap: crate::journal::Tap::default(),
                lanes: Lanes::new(store_id),
            }),
        }
    }

    /// Whether the checkpoint in `dir` opens under `key` (during a key rotation: whether this
    /// engine has been re-keyed already).
    pub fn sealed_under(dir: &Path, key: &MasterKey) -> bool {
        read_checkpoint(dir, &StateSealer::new(key)).is_ok()
    }

    /// Whether `dir` holds a TEE engine's trusted state.
    pub fn exists(dir: &Path) -> bool {
        std::fs::read(dir.join(CHECKPOINT)).is_ok_and(|b| b.starts_with(CHECKPOINT_MAGIC))
    }

    /// Opens the engine in `dir` over `store`: loads the checkpoint, replays the redo log,
    /// carries out again a round the log holds but did not see land, and has every node
    /// reshuffled before it is read again. Then writes a fresh checkpoint.
    pub async fn open(
        dir: &Path,
        store: Arc<dyn TeeStore>,
        key: &MasterKey,
    ) -> Result<(Self, Recovery)> {
        crate::make_private(dir)?;
        let sealer = StateSealer::new(key);
        let ckpt = read_checkpoint(dir, &sealer)?;
        let store_id = StoreId(ckpt.store_id);
        let mut oram = TeeOram::from_state(ckpt.oram, None)?;
        check_geometry(&store, oram.config())?;
        let cipher = TeeCipher::new(&Self::tee_key(key), oram.config().block_size() as usize);
        let (frames, _, torn) = read_frames_with_legacy(
            &dir.join(REDO_LOG),
            &[RING_MAGIC, ROUND_MAGIC, DONE_MAGIC],
            &[],
            &sealer,
        )?;
        let mut rec = Recovery { torn_bytes: torn, ..Recovery::default() };
        // Decode everything first: a damaged record stops the open before anything is sent.
        enum Entry {
            Ring(RingRecord),
            Round(RoundLog),
            Done(u64),
        }
        let mut entries = Vec::with_capacity(frames.len());
        for f in &frames {
            let bad =
                |m: String| ProxyError::State(format!("{}: {m}", dir.join(REDO_LOG).display()));
            entries.push(match f.magic {
                RING_MAGIC => Entry::Ring(decode_record(&f.body).map_err(bad)?),
                ROUND_MAGIC => Entry::Round(decode_record(&f.body).map_err(bad)?),
                _ => Entry::Done(decode_record::<DoneRecord>(&f.body).map_err(bad)?.round),
            });
        }
        // Rounds carried out again get numbers from the clock (microseconds), far above the
        // planner's counter and above those of an earlier recovery that may have been cut
        // short before its checkpoint; the trusted component refuses numbers it has seen.
        let mut again = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let mut highest = 0u64;
        for (i, e) in entries.iter().enumerate() {
            rec.replayed += 1;
            match e {
                Entry::Ring(r) => {
                    for (b, d) in &r.blocks {
                        oram.replay_ring(*b, d.clone())?;
                    }
                }
                Entry::Done(_) => {}
                Entry::Round(r) => {
                    for (b, d) in &r.ring {
                        oram.replay_ring(*b, d.clone())?;
                    }
                    highest = highest.max(r.round.round);
                    let landed = entries[i + 1..]
                        .iter()
                        .find(|e| !matches!(e, Entry::Ring(_)))
                        .is_some_and(|e| matches!(e, Entry::Done(d) if *d == r.round.round));
                    if !landed {
                        // Cut short by the crash (or never sent): carry it out again, under a
                        // round number the trusted component has not seen.
                        again = again.max(highest) + 1;
                        let plan = replan(&oram, &r.round, again)?;
                        let round = seal_round(&cipher, &store_id, &plan)?;
                        store.tee_evict(&round).await.map_err(|e| store_error(e, 0))?;
                        rec.cells_rewritten +=
                            plan.layers.iter().map(|l| l.write.len() as u64).sum::<u64>();
                    }
                    oram.replay_round(&r.round)?;
                }
            }
        }
        oram.skip_rounds_past(highest.max(again));
        if !entries.is_empty() || torn > 0 {
            // The store may have seen any slot read since the checkpoint.
            oram.exhaust_all();
        }
        store.flush().await?;
        let ckpt = Checkpoint { store_id: store_id.0, oram: oram.state()? };
        write_checkpoint_as(dir, CHECKPOINT_MAGIC, &ckpt, &sealer)?;
        let log = open_empty_log(dir)?;
        Ok((Self::assemble(dir, store, cipher, store_id, sealer, oram, log, 0), rec))
    }

    /// Overwrites every cell of every node's *other* area (the one its current cells are not
    /// in, which nothing reads before an eviction writes it) with zeros, in cell order. A key
    /// rotation calls it on every open while the rotation is under way: the re-keying in place
    /// ([`crate::rebuild::rekey_tee`]) leaves the old key's cells there. Call it before the
    /// engine serves (an eviction writes those areas).
    pub async fn clear_spare_areas(&self) -> Result<u64> {
        let spare: Vec<CellId> = {
            let sched = self.inner.sched.lock();
            let oram = &sched.oram;
            let mut cells = Vec::new();
            for node in 0..oram.config().nodes() as u32 {
                cells.extend(oram.node_areas(node)?.1);
            }
            cells
        };
        let mut spare = spare;
        spare.sort_unstable_by_key(|c| c.0);
        let zeros = vec![0u8; self.inner.cipher.cell_len()];
        for chunk in spare.chunks(1024) {
            let batch: Vec<(CellId, Vec<u8>)> = chunk.iter().map(|&c| (c, zeros.clone())).collect();
            with_retry(RetryPolicy::default(), || self.inner.store.write(batch.clone())).await?;
        }
        self.inner.store.flush().await?;
        Ok(spare.len() as u64)
    }

    /// Where this engine's redo log is mirrored ([`crate::Tap::attach`]).
    pub fn tap(&self) -> crate::journal::Tap {
        self.inner.tap.clone()
    }

    /// The planner's configuration.
    pub fn config(&self) -> TeeOramConfig {
        self.inner.sched.lock().oram.config().clone()
    }

    /// A key rotation's sweep: one step, with nothing left to do. This engine is re-keyed when
    /// it opens during a rotation ([`crate::rebuild::rekey_tee`]: every cell rewritten under
    /// the new key and a fresh store id), before it serves.
    pub fn sweep_paths(&self) -> u64 {
        1
    }

    /// The sweep's one step: the cells were re-sealed when the engine opened; nothing is read
    /// or written.
    pub async fn sweep(&self, _range: std::ops::Range<u64>) -> Result<()> {
        self.check_live()
    }

    /// Counters.
    pub fn stats(&self) -> TeeEngineStats {
        let s = self.inner.sched.lock();
        TeeEngineStats {
            oram: s.oram.stats(),
            waiting: s.oram.waiting(),
            trusted_bytes: s.oram.trusted_bytes(),
        }
    }

    /// Accesses so far that waited for a round, a reshuffle, a checkpoint or room in the ring
    /// (the others were served at once).
    pub fn waits(&self) -> u64 {
        self.inner.sched.lock().waits
    }

    /// Where every block in the tree lives now: `(block, cell)`. Trusted information, for
    /// diagnostics (which blocks a damaged cell holds) and tests.
    pub fn block_cells(&self) -> Vec<(u64, CellId)> {
        self.inner.sched.lock().oram.blocks_in_tree().collect()
    }

    /// Whether a round or reshuffle is being prepared or carried out.
    pub fn evicting(&self) -> bool {
        let s = self.inner.sched.lock();
        s.rounding || s.oram.in_flight()
    }

    /// Bytes of trusted state (index table, index blocks, ring).
    pub fn trusted_bytes(&self) -> u64 {
        self.inner.sched.lock().oram.trusted_bytes()
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn TeeStore> {
        &self.inner.store
    }

    block_calls!(DurableTee);

    fn poison(&self, why: &ProxyError) {
        let mut s = self.inner.sched.lock();
        if s.poisoned.is_none() {
            tracing::error!(error = %why, "the TEE engine stopped");
            s.poisoned = Some(why.to_string());
        }
        drop(s);
        self.inner.bell.send_modify(|v| *v += 1);
    }

    fn ring(&self) {
        self.inner.bell.send_modify(|v| *v += 1);
    }

    /// One access: the block's data before it (the new data is in place after a write).
    ///
    /// Runs as its own task: a caller that gives up (a client that disconnects) does not
    /// leave a query or a reshuffle half done.
    pub async fn access(&self, block: BlockId, op: Op) -> Result<Vec<u8>> {
        let me = self.clone();
        tokio::spawn(async move { me.access_inner(block, op).await })
            .await
            .map_err(|e| ProxyError::State(format!("an access task failed: {e}")))?
    }

    async fn access_inner(&self, block: BlockId, op: Op) -> Result<Vec<u8>> {
        let inner = &self.inner;
        let mut bell = inner.bell.subscribe();
        let arrived = std::time::Instant::now();
        let mut waited_for: Option<&'static str> = None;
        let (plan, generation) = loop {
            let seen = *bell.borrow_and_update();
            if inner.sched.lock().clean {
                self.mark_unclean().await?;
            }
            let reshuffle = {
                let mut s = inner.sched.lock();
                if s.poisoned.is_some() {
                    return Err(ProxyError::Poisoned);
                }
                let c = s.oram.config().round_blocks() as usize;
                // Backpressure while rounds lag behind: wait for the one running to land (with
                // none running, the queries must go on to make the next one due). The lag is
                // counted in queries, which the store sees, never in the blocks waiting in the
                // ring: how many of those there are depends on which blocks were written, and
                // queries that waited on it ran ahead of the rounds by a workload-dependent
                // amount. Each query adds at most one block to the ring and each round takes up
                // to `c` out, so the ring still holds at most about RING_ROUNDS rounds' worth:
                // the bound the ring had before, now reached by every workload alike.
                let lagging = s.oram.queries_ahead() as usize >= RING_ROUNDS * c
                    && (s.rounding || s.oram.in_flight());
                if s.busy.contains(&block.0) || s.holding > 0 || lagging {
                    s.waits += 1;
                    waited_for = Some(if lagging {
                        "the ring to drain"
                    } else if s.holding > 0 {
                        "a round to be planned"
                    } else {
                        "another access to the block"
                    });
                    None
                } else {
                    match s.oram.plan_query(block)? {
                        QueryStep::Query(p) => {
                            s.busy.insert(block.0);
                            let g = s.generation;
                            *s.outstanding.entry(g).or_default() += 1;
                            break (p, g);
                        }
                        QueryStep::Wait => {
                            s.waits += 1;
                            waited_for = Some("a round to rewrite an exhausted node");
                            None
                        }
                        QueryStep::Reshuffle(r) => {
                            s.waits += 1;
                            waited_for = Some("a reshuffle");
                            Some(r)
                        }
                    }
                }
            };
            match reshuffle {
                Some(r) => self.log_and_run(r, false).await?,
                None => {
                    if bell.wait_for(|v| *v != seen).await.is_err() {
                        return Err(ProxyError::State("the engine was dropped".into()));
                    }
                }
            }
        };
        if let Some(what) = waited_for {
            tracing::debug!(
                waited_ms = arrived.elapsed().as_secs_f64() * 1e3,
                last_reason = what,
                "an access waited"
            );
        }
        let result = self.query(&plan).await;
        let mut s = inner.sched.lock();
        if let Some(n) = s.outstanding.get_mut(&generation) {
            *n -= 1;
        }
        s.busy.remove(&block.0);
        let done = match result {
            Ok(fetched) => {
                let fetched = if plan.real { Some(fetched) } else { plan.data.clone() };
                let write = match op {
                    Op::Write(d) => Some(d),
                    Op::Read => None,
                };
                s.oram.finish_query(block, fetched, write).map_err(ProxyError::from)
            }
            Err(e) => Err(e),
        };
        let done = match done {
            Ok(d) => d,
            Err(e) => {
                drop(s);
                self.poison(&e);
                return Err(e);
            }
        };
        if done.ring_changed {
            s.dirty.insert(block.0);
        }
        drop(s);
        self.ring();
        self.kick();
        Ok(done.data)
    }

    /// Refuses to go on once the engine stopped (nothing more may reach the log or the store:
    /// the trusted state in memory may no longer match them).
    fn check_live(&self) -> Result<()> {
        match &self.inner.sched.lock().poisoned {
            Some(why) => Err(ProxyError::State(format!("the engine stopped: {why}"))),
            None => Ok(()),
        }
    }

    /// Stops the engine as a crash would, for tests: nothing more reaches the log (an append
    /// in progress finishes first) or starts on the store.
    pub async fn halt(&self) {
        self.inner.sched.lock().poisoned.get_or_insert_with(|| "halted".into());
        drop(self.inner.log.lock().await);
        self.ring();
    }

    /// Logs (and syncs) that queries are about to reach the store, before the first one after
    /// a checkpoint: the checkpoint's record of which slots were read is then no longer the
    /// truth, and a recovery must reshuffle every node.
    async fn mark_unclean(&self) -> Result<()> {
        let inner = &self.inner;
        let log = inner.log.lock().await;
        if !inner.sched.lock().clean {
            return Ok(());
        }
        self.check_live()?;
        let marker = RingRecord { blocks: Vec::new() };
        let n =
            append_record(&log, &inner.dir, &inner.tap, RING_MAGIC, &marker, &inner.sealer).await?;
        let mut s = inner.sched.lock();
        s.log_bytes += n;
        s.clean = false;
        Ok(())
    }

    /// Starts the round that is due, if one is and none is being prepared.
    fn kick(&self) {
        {
            let mut s = self.inner.sched.lock();
            if s.poisoned.is_some() || s.rounding || s.holding > 0 || !s.oram.round_due() {
                return;
            }
            s.rounding = true;
        }
        let me = self.clone();
        tokio::spawn(async move {
            if let Err(e) = me.background_round().await {
                me.poison(&e);
            }
        });
    }

    /// Sends one query and opens the answer. The ticket names what every cell of the plan
    /// holds (so the trusted component refuses it with any other cells) and carries the next
    /// number of a query stream taken for the query; a retry after a failure that may pass
    /// goes out as a new ticket with the stream's next number (the first may have reached the
    /// trusted component, which answers a number once).
    async fn query(&self, plan: &blindfold_oram::tee::QueryPlan) -> Result<Vec<u8>> {
        let inner = &self.inner;
        let target_cell = plan.cells[plan.target as usize].0;
        let ads: Vec<[u8; 32]> = plan.tags.iter().map(|t| cell_ad(&inner.store_id, *t)).collect();
        let mut lane = inner.lanes.take().await?;
        let stream = lane.stream();
        let policy = RetryPolicy::default();
        let mut backoff = policy.first_backoff;
        for attempt in 1.. {
            let query_id = lane.number();
            let ticket = QueryTicket {
                stream,
                query_id,
                candidates: plan.cells.len() as u32,
                target: plan.target,
                ads: ads.clone(),
            };
            let sealed = inner
                .cipher
                .seal_query(&ticket)
                .map_err(|e| ProxyError::State(format!("sealing a query ticket: {e}")))?;
            match inner.store.tee_query(&plan.cells, &sealed).await {
                Ok(answer) => {
                    return inner.cipher.open_answer(&stream, query_id, &answer).map_err(|e| {
                        ProxyError::Integrity {
                            cell: target_cell,
                            source: CryptoError::Malformed(format!(
                                "the trusted component's answer: {e}"
                            )),
                        }
                    });
                }
                Err(e) if e.is_retryable() && attempt < policy.attempts => {
                    tracing::debug!(attempt, error = %e, "sending the query again");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                Err(e) => return Err(store_error(e, target_cell)),
            }
        }
        unreachable!("the loop returns")
    }

    /// Waits until no query of an earlier generation is in flight (they may read the areas a
    /// round is about to write).
    async fn barrier(&self) -> Result<()> {
        self.wait_until(|s| s.oldest_outstanding().is_none_or(|g| g >= s.generation)).await
    }

    /// Waits until `ready` holds of the scheduler (checked whenever the bell rings), or the
    /// engine stops.
    async fn wait_until(&self, ready: impl Fn(&Sched) -> bool) -> Result<()> {
        let mut bell = self.inner.bell.subscribe();
        loop {
            let seen = *bell.borrow_and_update();
            {
                let s = self.inner.sched.lock();
                if let Some(why) = &s.poisoned {
                    return Err(ProxyError::State(format!("the engine stopped: {why}")));
                }
                if ready(&s) {
                    return Ok(());
                }
            }
            if bell.wait_for(|v| *v != seen).await.is_err() {
                return Err(ProxyError::State("the engine was dropped".into()));
            }
        }
    }

    /// Plans the round that is due and carries it out (a background task).
    async fn background_round(&self) -> Result<()> {
        // A block a query is fetching has left the tree in the planner's view, but its data
        // is not in the ring yet: a round planned now may drop its old copy, and the redo log
        // would not hold the block. So new queries wait, and the round is planned once the
        // queries in flight have landed their blocks in the ring (a pause of one query).
        self.inner.sched.lock().holding += 1;
        let started = std::time::Instant::now();
        let drained = self.drain_queries().await;
        let drain_ms = started.elapsed().as_secs_f64() * 1e3;
        let result = match drained {
            Ok(()) => self.plan_and_log_round().await,
            Err(e) => Err(e),
        };
        self.inner.sched.lock().holding -= 1;
        tracing::debug!(
            drain_ms,
            held_ms = started.elapsed().as_secs_f64() * 1e3,
            "queries held while a round was planned and logged"
        );
        self.ring();
        match result {
            Ok(Some(plan)) => self.log_and_run(plan, true).await,
            Ok(None) => Ok(()),
            Err(e) => {
                self.inner.sched.lock().rounding = false;
                Err(e)
            }
        }
    }

    /// Waits until no query is in flight.
    async fn drain_queries(&self) -> Result<()> {
        self.wait_until(|s| s.oldest_outstanding().is_none()).await
    }

    /// Plans the round that is due and logs it (with the ring's new data, taken under the log's
    /// lock so the log's order is the planning order). `None` if none is due.
    async fn plan_and_log_round(&self) -> Result<Option<RoundPlan>> {
        let inner = &self.inner;
        let log = inner.log.lock().await;
        let planned = {
            let mut s = inner.sched.lock();
            if s.poisoned.is_some() || !s.oram.round_due() {
                // (A reshuffle in flight: the next query starts the round once it lands.)
                s.rounding = false;
                None
            } else {
                let ring = s.take_dirty();
                match s.oram.plan_round() {
                    Ok(plan) => Some((ring, plan)),
                    Err(e) => {
                        s.rounding = false;
                        return Err(e.into());
                    }
                }
            }
        };
        let Some((ring, plan)) = planned else {
            return Ok(None);
        };
        let planned_at = std::time::Instant::now();
        self.check_live()?;
        let record = RoundLog { ring, round: plan.record() };
        let n = append_record(&log, &inner.dir, &inner.tap, ROUND_MAGIC, &record, &inner.sealer)
            .await?;
        inner.sched.lock().log_bytes += n;
        tracing::debug!(
            round = plan.round,
            record_bytes = n,
            log_ms = planned_at.elapsed().as_secs_f64() * 1e3,
            "round logged"
        );
        Ok(Some(plan))
    }

    /// Logs `plan` (a reshuffle, with the ring's new data) or takes it as logged (a round),
    /// sends it, logs it done and applies it.
    async fn log_and_run(&self, plan: RoundPlan, is_round: bool) -> Result<()> {
        let result = if is_round {
            // Planned and logged by `plan_and_log_round`.
            self.run_logged(plan).await
        } else {
            self.log_and_run_inner(plan).await
        };
        if is_round {
            self.inner.sched.lock().rounding = false;
        }
        if let Err(e) = &result {
            self.poison(e);
        }
        self.ring();
        // Accesses may all be waiting for room in the ring: the next round cannot wait for
        // one of them to finish.
        self.kick();
        result
    }

    async fn log_and_run_inner(&self, plan: RoundPlan) -> Result<()> {
        let inner = &self.inner;
        {
            let log = inner.log.lock().await;
            let ring = inner.sched.lock().take_dirty();
            let record = RoundLog { ring, round: plan.record() };
            self.check_live()?;
            let n =
                append_record(&log, &inner.dir, &inner.tap, ROUND_MAGIC, &record, &inner.sealer)
                    .await?;
            inner.sched.lock().log_bytes += n;
        }
        self.run_logged(plan).await
    }

    /// Carries out a logged round or reshuffle: waits for the queries that may read the areas
    /// it writes, sends it, logs it done and applies it.
    async fn run_logged(&self, plan: RoundPlan) -> Result<()> {
        let inner = &self.inner;
        self.barrier().await?;
        let sent = std::time::Instant::now();
        self.send_round(plan.clone()).await?;
        tracing::debug!(
            round = plan.round,
            round_ms = sent.elapsed().as_secs_f64() * 1e3,
            "round carried out by the trusted component"
        );
        {
            // Logged done before it is applied: a later round (planned only after this one is
            // applied) then always follows the mark in the log.
            let log = inner.log.lock().await;
            let done = DoneRecord { round: plan.round };
            self.check_live()?;
            let n = append_record(&log, &inner.dir, &inner.tap, DONE_MAGIC, &done, &inner.sealer)
                .await?;
            let mut s = inner.sched.lock();
            s.log_bytes += n;
            s.oram.finish_round()?;
            s.generation += 1;
        }
        Ok(())
    }

    /// Sends a round; a failure that may pass is retried under a new round number (an attempt
    /// may have reached the trusted component, which refuses a ticket twice).
    async fn send_round(&self, mut plan: RoundPlan) -> Result<()> {
        let inner = &self.inner;
        let policy = RetryPolicy::default();
        let mut backoff = policy.first_backoff;
        for attempt in 1.. {
            let round = seal_round(&inner.cipher, &inner.store_id, &plan)?;
            match inner.store.tee_evict(&round).await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_retryable() && attempt < policy.attempts => {
                    tracing::debug!(attempt, error = %e, "sending the eviction round again");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                    plan.round = inner.sched.lock().oram.renumber_round();
                }
                Err(e) => return Err(store_error(e, 0)),
            }
        }
        unreachable!("the loop returns")
    }

    /// Makes every write that completed before this call durable.
    pub async fn commit(&self) -> Result<()> {
        let inner = &self.inner;
        let log = inner.log.lock().await;
        let blocks = {
            let mut s = inner.sched.lock();
            if let Some(why) = &s.poisoned {
                return Err(ProxyError::State(format!("the engine stopped: {why}")));
            }
            s.take_dirty()
        };
        if blocks.is_empty() {
            return Ok(());
        }
        self.check_live()?;
        let n = append_record(
            &log,
            &inner.dir,
            &inner.tap,
            RING_MAGIC,
            &RingRecord { blocks },
            &inner.sealer,
        )
        .await?;
        let big = {
            let mut s = inner.sched.lock();
            s.log_bytes += n;
            s.log_bytes > LOG_LIMIT
        } || inner.tap.wants_checkpoint();
        drop(log);
        if big {
            self.checkpoint().await?;
        }
        Ok(())
    }

    /// Holds new accesses back until nothing is in flight, then writes a checkpoint and empties
    /// the redo log.
    async fn checkpoint(&self) -> Result<()> {
        self.checkpoint_then(true).await
    }

    /// [`DurableTee::checkpoint`]; `kick`: start the round that is due, if any, right after.
    async fn checkpoint_then(&self, kick: bool) -> Result<()> {
        let inner = &self.inner;
        inner.sched.lock().holding += 1;
        let result = async {
            self.quiesce().await?;
            let log = inner.log.lock().await;
            let state = {
                let mut s = inner.sched.lock();
                s.dirty.clear();
                s.oram.state()?
            };
            inner.store.flush().await?;
            let ckpt = Checkpoint { store_id: inner.store_id.0, oram: state };
            write_checkpoint_as(&inner.dir, CHECKPOINT_MAGIC, &ckpt, &inner.sealer)?;
            crate::journal::empty_log(&log, &inner.dir)?;
            {
                let mut s = inner.sched.lock();
                s.log_bytes = 0;
                s.clean = true;
            }
            // Still under the log's lock: no frame comes between the checkpoint and the
            // mirror's record of it.
            inner.tap.checkpointed(&inner.dir).await
        }
        .await;
        inner.sched.lock().holding -= 1;
        self.ring();
        if kick {
            self.kick();
        }
        result
    }

    /// Waits until no query, round or reshuffle is in flight.
    async fn quiesce(&self) -> Result<()> {
        self.wait_until(|s| !s.rounding && !s.oram.in_flight() && s.oldest_outstanding().is_none())
            .await
    }

    /// Waits for what is in flight, then writes a checkpoint and empties the redo log (a clean
    /// shutdown). The engine stays usable: accesses after it start rounds again as they fall due.
    pub async fn shutdown(&self) -> Result<()> {
        self.checkpoint_then(false).await
    }

    /// Waits until no query, round or reshuffle is in flight and no round is due (tests and
    /// benchmarks).
    pub async fn settle(&self) -> Result<()> {
        loop {
            self.kick();
            self.quiesce().await?;
            if !self.inner.sched.lock().oram.round_due() {
                return Ok(());
            }
        }
    }

    /// Bytes in the redo log (a checkpoint at shutdown or open empties it).
    pub fn log_bytes(&self) -> u64 {
        self.inner.sched.lock().log_bytes
    }

    /// Authenticates every cell of the current areas against what the planner says it holds
    /// (reading them directly: a full scan shows the store nothing about accesses). Call it
    /// with no accesses in flight.
    pub async fn verify(&self, mut progress: impl FnMut(u64, u64)) -> Result<VerifyReport> {
        let cells: Vec<(CellId, SlotTag)> = self.inner.sched.lock().oram.current_cells().collect();
        let total = cells.len() as u64;
        let mut report = VerifyReport::default();
        for chunk in cells.chunks(512) {
            let ids: Vec<CellId> = chunk.iter().map(|c| c.0).collect();
            let data = self.inner.store.read(&ids).await?;
            for ((cell, tag), bytes) in chunk.iter().zip(data) {
                match self.inner.cipher.open(&cell_ad(&self.inner.store_id, *tag), &bytes) {
                    Ok(_) => report.cells_checked += 1,
                    Err(e) => report.failures.push((cell.0, e.to_string())),
                }
            }
            progress(report.cells_checked + report.failures.len() as u64, total);
        }
        Ok(report)
    }
}

/// Rebuilds the TEE engine whose checkpoint is in `dir` (over the cells of `old`) into `new`, a
/// plain store laid out for `grow_to` (a larger tree of the same block size) or for the same
/// configuration; then replaces the checkpoint and empties the redo log. For `blindfold recover`
/// and `blindfold grow`, as [`crate::rebuild`] does for the other engines:
///
/// 1. every cell of the old array is read, both areas of every node, in cell order (a fixed
///    order: nothing the store sees depends on which blocks are where); the cells of the
///    current areas are opened here, in the gateway, under what the checkpoint says they hold
///    (the gateway holds the same key as the trusted component). Cells that do not open are
///    counted, and the blocks they held are lost; a growth refuses to lose any;
/// 2. every block found, and every block of the checkpoint's ring, is placed at a fresh
///    uniformly random leaf of a fresh tree, sealed under a **fresh random store id**, so no
///    cell of the old array (or of a lost timeline after the snapshot) opens in the new one,
///    and no query ticket or round of the old store id is accepted for it; every cell of the new
///    tree's current areas is written once, in cell order;
/// 3. only then is the checkpoint replaced (atomically), naming the new store id.
///
/// The trusted component needs no new key: its key derives from the master key alone, and the
/// store id is bound into every cell and ticket.
pub async fn rebuild_tee(
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
    grow_to: Option<TeeOramConfig>,
) -> Result<crate::rebuild::Rebuilt> {
    let target = Target { store: new, grow_to, beside: false };
    rebuild_tee_into(dir, old, (key, key), epoch, target).await
}

/// Re-keys the TEE engine whose checkpoint in `dir` is sealed under `old_key` (stopped
/// cleanly: nothing in its redo log) to `new_key`, in place, for a key rotation: every cell of
/// `store` is read in cell order and the current areas opened under the old key; a fresh tree
/// under a fresh store id, sealed under the new key, is written into every node's *other* area
/// (which the old tree keeps nothing live in), and the checkpoint is replaced, under the new
/// key, last. A crash before that leaves the old tree whole; run it again.
pub async fn rekey_tee(
    dir: &Path,
    store: Arc<dyn Store>,
    old_key: &MasterKey,
    new_key: &MasterKey,
) -> Result<crate::rebuild::Rebuilt> {
    let target = Target { store: Arc::clone(&store), grow_to: None, beside: true };
    rebuild_tee_into(dir, store, (old_key, new_key), 0, target).await
}

/// Where a TEE rebuild writes: a new array (`beside` false, optionally larger) or the other
/// areas of the same one.
struct Target {
    store: Arc<dyn Store>,
    grow_to: Option<TeeOramConfig>,
    beside: bool,
}

async fn rebuild_tee_into(
    dir: &Path,
    old: Arc<dyn Store>,
    (key, new_key): (&MasterKey, &MasterKey),
    epoch: u32,
    Target { store: new, grow_to, beside }: Target,
) -> Result<crate::rebuild::Rebuilt> {
    use futures::StreamExt;
    let sealer = StateSealer::new(key);
    let ckpt = read_checkpoint(dir, &sealer)?;
    let store_id = StoreId(ckpt.store_id);
    let oram = TeeOram::from_state(ckpt.oram, None)?;
    let config = oram.config().clone();
    if let Some(to) = &grow_to {
        if to.blocks() <= config.blocks() || to.block_size() != config.block_size() {
            return Err(ProxyError::State(format!(
                "cannot grow a TEE tree of {} blocks of {} bytes into one of {} blocks of {} \
                 bytes: growing adds blocks and keeps their size",
                config.blocks(),
                config.block_size(),
                to.blocks(),
                to.block_size()
            )));
        }
    }
    let target = grow_to.clone().unwrap_or_else(|| config.clone());
    let needed = DurableTee::geometry(&config)?;
    crate::error::check_array(old.geometry(), needed, "the TEE engine's old array")?;
    crate::error::check_array(new.geometry(), DurableTee::geometry(&target)?, "the new array")?;
    let bs = config.block_size() as usize;
    let cipher = TeeCipher::new(&DurableTee::tee_key(key), bs);
    let tags: std::collections::HashMap<u64, SlotTag> =
        oram.current_cells().map(|(c, t)| (c.0, t)).collect();
    let live: std::collections::HashMap<u64, u64> =
        oram.blocks_in_tree().map(|(b, c)| (c.0, b)).collect();
    let mut report = crate::rebuild::Rebuilt { epoch, ..Default::default() };
    let mut found: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let total = config.total_cells();
    let mut reads =
        std::pin::pin!(crate::bulk::read_in_order(&*old, RetryPolicy::default(), total, 256));
    while let Some(read) = reads.next().await {
        let (start, fetched) = read?;
        report.cells_read += fetched.len() as u64;
        for (cell, bytes) in (start..).zip(fetched) {
            let Some(tag) = tags.get(&cell) else { continue };
            match cipher.open(&cell_ad(&store_id, *tag), &bytes) {
                Ok(plain) => {
                    if let Some(&b) = live.get(&cell) {
                        found.insert(b, plain);
                    }
                }
                Err(e) if e.is_integrity() => report.unreadable_cells.push(cell),
                Err(e) => return Err(ProxyError::State(format!("opening cell {cell}: {e}"))),
            }
        }
    }
    if grow_to.is_some() {
        crate::rebuild::refuse_damage(&report)?;
    }
    for (b, d) in oram.ring_blocks() {
        found.insert(b, d.to_vec());
    }
    report.lost =
        (0..config.blocks()).filter(|&b| oram.is_written(b) && !found.contains_key(&b)).collect();
    report.blocks_found = found.len() as u64;
    // The fresh tree, under a fresh store id (and the new key).
    let new_id = StoreId::random();
    let mut fresh = if beside { TeeOram::new_beside(&oram) } else { TeeOram::new(target.clone()) };
    drop(oram);
    let cipher = TeeCipher::new(&DurableTee::tee_key(new_key), bs);
    fresh.bulk_place_blocks(found.keys().copied())?;
    let cells: Vec<(CellId, SlotTag)> = fresh.initial_cells().collect();
    for chunk in cells.chunks(1024) {
        let sealed = chunk
            .iter()
            .map(|&(c, t)| {
                let zeros;
                let data = if t.block == blindfold_oram::tee::DUMMY {
                    zeros = vec![0u8; bs];
                    &zeros
                } else {
                    &found[&t.block]
                };
                cipher.seal(&cell_ad(&new_id, t), data).map(|s| (c, s))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| ProxyError::State(format!("sealing the rebuilt cells: {e}")))?;
        with_retry(RetryPolicy::default(), || new.write(sealed.clone())).await?;
        report.cells_written += chunk.len() as u64;
    }
    new.flush().await?;
    let ckpt = Checkpoint { store_id: new_id.0, oram: fresh.state()? };
    crate::journal::remove_log(dir)?;
    write_checkpoint_as(dir, CHECKPOINT_MAGIC, &ckpt, &StateSealer::new(new_key))?;
    Ok(report)
}

/// The number of blocks of the TEE tree whose checkpoint is in `dir`.
pub fn saved_tee_blocks(dir: &Path, key: &MasterKey) -> Result<u64> {
    Ok(read_checkpoint(dir, &StateSealer::new(key))?.oram.config().blocks())
}

/// The checkpoint in `dir`, opened with `sealer`.
fn read_checkpoint(dir: &Path, sealer: &StateSealer) -> Result<Checkpoint> {
    let path = dir.join(CHECKPOINT);
    let raw = std::fs::read(&path).map_err(|e| crate::journal::io(&path, "reading", e))?;
    decode_checkpoint(&raw, CHECKPOINT_MAGIC, sealer)
        .map_err(|m| ProxyError::State(format!("{}: {m}", path.display())))
}

fn check_geometry(store: &Arc<dyn TeeStore>, config: &TeeOramConfig) -> Result<()> {
    let needed = DurableTee::geometry(config)?;
    crate::error::check_array(store.geometry(), needed, "the TEE engine's array")
}

/// A store error from a query: the trusted component's refusal to open the selected cell is an
/// integrity violation at that cell.
fn store_error(e: StoreError, cell: u64) -> ProxyError {
    if e.is_integrity() {
        ProxyError::Integrity {
            cell,
            source: CryptoError::Malformed(format!("the trusted component: {e}")),
        }
    } else {
        ProxyError::Store(e)
    }
}

/// Seals a round for the trusted component: the cells that go up, and one ticket per layer.
fn seal_round(cipher: &TeeCipher, store_id: &StoreId, plan: &RoundPlan) -> Result<TeeRound> {
    let seal_err = |e: blindfold_tee::TeeError| ProxyError::State(format!("sealing a round: {e}"));
    let incoming = plan
        .incoming
        .iter()
        .map(|u| cipher.seal(&cell_ad(store_id, u.tag), &u.data))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(seal_err)?;
    let layers = plan
        .layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let ticket = EvictTicket {
                stream: store_id.0,
                round: plan.round,
                layer: i as u32,
                perm: l.perm.clone(),
            };
            Ok(TeeLayer {
                read: l.read.clone(),
                write: l.write.clone(),
                ticket: cipher.seal_evict(&ticket).map_err(seal_err)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(TeeRound { incoming, layers })
}

/// The plan of a logged round, to carry it out again after a crash under round number `round`:
/// the cells each layer reads and writes follow from the planner's state before the round.
fn replan(oram: &TeeOram, record: &RoundRecord, round: u64) -> Result<RoundPlan> {
    let incoming = record
        .incoming
        .iter()
        .map(|t| {
            let data = if t.block == blindfold_oram::tee::DUMMY {
                vec![0u8; oram.config().block_size() as usize]
            } else {
                oram.ring_data(t.block)
                    .ok_or_else(|| {
                        ProxyError::State(format!(
                            "redo log: block {} went up but its data is not in the log",
                            t.block
                        ))
                    })?
                    .to_vec()
            };
            Ok(blindfold_oram::tee::Upload { tag: *t, data })
        })
        .collect::<Result<Vec<_>>>()?;
    let layers = record
        .layers
        .iter()
        .map(|(node, perm)| {
            let (read, write) = oram.node_areas(*node)?;
            Ok(blindfold_oram::tee::LayerPlan { node: *node, read, write, perm: perm.clone() })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RoundPlan { round, incoming, layers, leaves: record.leaves.clone() })
}
