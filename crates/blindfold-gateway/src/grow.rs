//! Growing the oblivious store: more capacity in the same data directory, while the gateway
//! serves (`blindfold grow --capacity SIZE`, or `blindfold serve --grow-at PERCENT`).
//!
//! # How it goes
//!
//! A growth rebuilds the ORAM tree into a larger one in a new store array, with the machinery
//! `recover` uses ([`blindfold_proxy::rebuild::grow_path_oram`],
//! [`blindfold_proxy::rebuild::grow_tao`]):
//!
//! 1. the engine is handed over exclusively ([`Swappable::exclusive`]): requests in flight
//!    finish, new ones wait (none fails), and the engine commits and checkpoints;
//! 2. the intent, [`INTENT_FILE`] (target size, old and new array generation), is written
//!    atomically;
//! 3. every cell of the old array is read in cell order and authenticated; every block is kept
//!    in memory. A cell that does not authenticate stops the growth with nothing changed: the
//!    intent is removed and the gateway serves on at the old size;
//! 4. a fresh tree of the new size is bulk-loaded with every block (fresh uniformly random
//!    leaves), sealed under a fresh random key epoch, every cell written once in cell order,
//!    into the array `oram.g<N+1>` (the ObliviStore and CURIOUS engines: every block to a fresh
//!    uniformly random partition of the larger engine, every top level or first bucket copy
//!    written once, from a fresh random serial on);
//! 5. the engine's checkpoint is replaced atomically — the point of no return — then
//!    `gateway.json` gets the new capacity and generation, then the intent is removed;
//! 6. the engine is reopened on the new array and the directory's capacity raised; a snapshot
//!    of the grown state goes to a snapshot array of the new size, and the snapshot index names
//!    it once it is written. Then requests flow again, and the old arrays, which nothing names
//!    any more, are removed from the store where it can ([`blindfold_store::remove_array`]:
//!    file and S3 stores; on Redis and remote stores the operator deletes them).
//!
//! With a log in the store (`--durability store`, [`crate::storelog`]) the growth holds the
//! log's checkpoint lock from step 1 on, hands the grown engine's redo log to the log in step
//! 6, and writes a store checkpoint of the grown state instead of a snapshot. Until it is in
//! the store, the store's newest checkpoint names the old array (not removed before then) and
//! the log after it holds only the old engine's records, so recovering from the store alone
//! after a loss mid-growth gives the gateway at its old size. If that checkpoint cannot be
//! written, the log is fenced (nothing more is acknowledged) and a restart writes one.
//!
//! A crash anywhere loses nothing. Before step 5 the old checkpoint and the old array are
//! untouched: the next start finds the intent and runs the growth again from step 3 (the half
//! written new array is simply written again). After it, the next start finds the intent with
//! a checkpoint that already holds the target size, and finishes steps 5 and 6.
//!
//! An engine whose blocks live elsewhere (the load balancer over ORAM nodes) grows in place
//! instead ([`SharedEngine::grow_in_place`]): with the engine quiet it makes room where its
//! blocks live (each node too small rebuilds its own tree, as above), then `gateway.json` gets the
//! new capacity — the point of no return: a crash after it reopens the engine at the new size,
//! which finishes the growth — then the engine serves it and the directory's capacity is raised.
//! Nothing moves in the gateway's store.
//!
//! # What the store learns
//!
//! That a growth happened, when, how long it took, and the old and new sizes: a read of every
//! cell of the old array, then a write of every cell of the new one, both in a fixed order that
//! depends on neither the data, nor which blocks are in use, nor the access history. Every
//! block gets a fresh leaf independent of its old one (as in `recover`), so no later access
//! can be linked to an access before the growth by its path; the old array's ciphertexts do not
//! open in the new one (fresh key epoch). With `--grow-at`, the moment of the growth tells the
//! store when the gateway's use crossed the threshold: a coarse fact about how full it is.
//!
//! # Costs and limits
//!
//! Requests wait while the tree is rebuilt: about the time to read the old array and write the
//! new one (docs/operations.md gives measured figures). Every block in use is held in memory
//! during the rebuild, so a growth that would need more than the memory available is refused
//! up front.
//! The store holds the old and the new array at once while it grows. Shrinking is not
//! supported. A growth waits for a key rotation under way in the same process to end (the
//! rebuild opens every cell under one key): `blindfold grow` keeps waiting, `--grow-at` holds
//! off.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use blindfold_crypto::MasterKey;
use blindfold_proxy::catalogue::EngineStore;
use blindfold_proxy::rebuild::{fresh_epoch, Rebuilt};
use blindfold_proxy::{InPlaceGrowth, ProxyError};
use blindfold_store::{open_store, Store, StoreError, StoreUrl};
use serde::{Deserialize, Serialize};

pub use crate::datadir::RETIRED_FILE;
use crate::datadir::{read_params, retire, sync_parent, write_private, GatewayParams};
use crate::engine::{SharedEngine, Swappable};
use crate::hooks::StoreWrapper;
use crate::objects::ObjectLayer;
use crate::observe::Observer;
use crate::snapshot::SnapshotSlot;
use crate::{GatewayError, Result};
use blindfold_proxy::catalogue::{
    cached_bytes_of, oram_array, oram_config, oram_geometry, physical_view,
};

/// The growth in progress, in the data directory.
pub const INTENT_FILE: &str = "growing.json";
/// A request from `blindfold grow` to the gateway running on the data directory.
pub const REQUEST_FILE: &str = "grow-request.json";
/// The answer to [`REQUEST_FILE`], written before the request is removed.
pub const RESULT_FILE: &str = "grow-result.json";

/// Generations tried for the new array when earlier growths left arrays of other sizes.
const GENERATION_TRIES: u32 = 16;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Intent {
    /// Capacity in blocks the growth makes.
    blocks: u64,
    /// Generation of the array grown from.
    from_generation: u32,
    /// Generation of the array grown into.
    to_generation: u32,
}

/// A request to grow to `blocks` (what `blindfold grow` writes for a running gateway).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Request {
    /// The capacity wanted, in blocks.
    pub blocks: u64,
}

/// The answer to a [`Request`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Answer {
    /// What was done, or why not.
    pub message: String,
    /// The growth, if it happened.
    pub grown: Option<Grown>,
}

/// What a growth did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Grown {
    /// Capacity before, in blocks.
    pub from_blocks: u64,
    /// Capacity after, in blocks.
    pub to_blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// The array no longer used (it may be deleted from the store).
    pub old_array: String,
    /// The array now holding the tree.
    pub new_array: String,
    /// Cells read from the old array.
    pub cells_read: u64,
    /// Cells written to the new array.
    pub cells_written: u64,
    /// Whether the old array was removed from the store (file stores; the others keep it
    /// until the operator deletes it).
    #[serde(default)]
    pub old_array_removed: bool,
    /// How long requests waited, in seconds.
    pub seconds: f64,
    /// For an engine whose blocks live elsewhere (ORAM nodes), which grew in place instead
    /// of into a new array: what it did.
    #[serde(default)]
    pub in_place: Option<String>,
    /// Bytes of blocks set aside, sealed, on the local disk because they did not fit in the
    /// rebuild's memory limit (`--rebuild-memory`).
    #[serde(default)]
    pub set_aside_bytes: u64,
}

impl Grown {
    /// One line for the operator.
    pub fn describe(&self) -> String {
        let bytes = |b: u64| crate::params::human_bytes(b * u64::from(self.block_size));
        if let Some(done) = &self.in_place {
            return format!(
                "grew the store from {} to {} ({} → {} blocks) in {:.1} s, in place: {done}",
                bytes(self.from_blocks),
                bytes(self.to_blocks),
                self.from_blocks,
                self.to_blocks,
                self.seconds,
            );
        }
        let old = if self.old_array_removed {
            format!("{} was removed from the store", self.old_array)
        } else {
            format!("{} is no longer used and may be deleted from the store", self.old_array)
        };
        let aside = if self.set_aside_bytes > 0 {
            format!(
                "; {} of blocks waited, sealed, on the local disk (beyond --rebuild-memory)",
                crate::params::human_bytes(self.set_aside_bytes)
            )
        } else {
            String::new()
        };
        format!(
            "grew the store from {} to {} ({} → {} blocks) in {:.1} s: read {} cells of {}, \
             wrote {} cells of {}; {old}{aside}",
            bytes(self.from_blocks),
            bytes(self.to_blocks),
            self.from_blocks,
            self.to_blocks,
            self.seconds,
            self.cells_read,
            self.old_array,
            self.cells_written,
            self.new_array,
        )
    }
}

/// Where a test can cut a growth short, as a crash at that instant would.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPoint {
    /// The intent is written; nothing else.
    AfterIntent,
    /// Half the new array is written.
    HalfWritten,
    /// The engine's checkpoint names the new tree; `gateway.json` still the old one.
    AfterCheckpoint,
    /// `gateway.json` names the new tree; the intent is still there.
    AfterParams,
}

fn simulated(at: CrashPoint) -> GatewayError {
    GatewayError::Config(format!("simulated crash at {at:?}"))
}

fn read_intent(dir: &Path) -> Result<Option<Intent>> {
    let path = dir.join(INTENT_FILE);
    match std::fs::read(&path) {
        Ok(raw) => serde_json::from_slice(&raw)
            .map(Some)
            .map_err(|e| GatewayError::Corrupt(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(GatewayError::Config(format!("reading {}: {e}", path.display()))),
    }
}

fn remove_intent(dir: &Path) -> Result<()> {
    let path = dir.join(INTENT_FILE);
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(GatewayError::Config(format!("removing {}: {e}", path.display())))
        }
        _ => {}
    }
    sync_parent(&path)
}

fn write_params(dir: &Path, params: &GatewayParams) -> Result<()> {
    write_private(&dir.join("gateway.json"), &serde_json::to_vec_pretty(params).expect("json"))
}

/// The parameters of `params` grown to `blocks` in array generation `generation`, checked.
fn grown_params(params: &GatewayParams, blocks: u64, generation: u32) -> Result<GatewayParams> {
    let p = GatewayParams { blocks, generation, ..params.clone() };
    oram_config(&p)?;
    blindfold_proxy::lifecycle::check(&p)?;
    Ok(p)
}

/// Checks that a growth of `params` to `blocks` is allowed and fits in memory.
fn check_request(params: &GatewayParams, blocks: u64, used_blocks: u64) -> Result<()> {
    if blocks <= params.blocks {
        return Err(GatewayError::Config(format!(
            "the store already holds {} ({} blocks); growing needs a larger capacity (shrinking \
             is not supported)",
            crate::params::human_bytes(params.blocks * u64::from(params.block_size)),
            params.blocks
        )));
    }
    grown_params(params, blocks, params.generation.saturating_add(1))?;
    // The rebuild holds every block in use, plus its bookkeeping, in memory at once.
    let needed = used_blocks.saturating_mul(u64::from(params.block_size) + 64) + (64 << 20);
    if let Some(available) = available_memory() {
        if needed > available {
            return Err(GatewayError::Config(format!(
                "growing rebuilds the tree with every block in use in memory ({} needed, {} \
                 available): free memory first; nothing was changed",
                crate::params::human_bytes(needed),
                crate::params::human_bytes(available)
            )));
        }
    }
    Ok(())
}

/// `MemAvailable` of `/proc/meminfo`, in bytes (None where there is none).
fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Opens the new array of a growth: generation `from + 1`, or the next one whose array (if an
/// earlier growth that stopped left one) has the right size.
async fn open_new_array(
    url: &StoreUrl,
    params: &GatewayParams,
    blocks: u64,
    first: u32,
) -> Result<(GatewayParams, Arc<dyn Store>)> {
    let mut generation = first;
    for _ in 0..GENERATION_TRIES {
        let p = grown_params(params, blocks, generation)?;
        let name = oram_array(generation);
        match open_store(url, &name, oram_geometry(&p)?).await {
            Ok(store) => return Ok((p, store)),
            Err(StoreError::GeometryMismatch { .. }) => {
                tracing::info!(array = %name, "left by an earlier growth of another size; trying the next");
            }
            Err(e) => return Err(GatewayError::Config(format!("opening store array {name}: {e}"))),
        }
        generation = generation
            .checked_add(1)
            .ok_or_else(|| GatewayError::Config("store array generations exhausted".into()))?;
    }
    Err(GatewayError::Config(format!(
        "arrays {}..{} all exist with other sizes: delete the unused ones from the store",
        oram_array(first),
        oram_array(generation)
    )))
}

/// `store`, stopping (as a crash would) once a quarter of its cells have been written (tests).
pub(crate) fn cut_short(store: Arc<dyn Store>) -> Arc<dyn Store> {
    let quarter = (store.geometry().cell_count() / 4) as i64;
    Arc::new(CutShort { inner: store, left: quarter.into() })
}

/// A store that stops (as a crash would) once `limit` cells have been written to it.
#[derive(Debug)]
struct CutShort {
    inner: Arc<dyn Store>,
    left: std::sync::atomic::AtomicI64,
}

#[async_trait::async_trait]
impl Store for CutShort {
    fn geometry(&self) -> blindfold_store::Geometry {
        self.inner.geometry()
    }
    async fn read(
        &self,
        cells: &[blindfold_store::CellId],
    ) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.inner.read(cells).await
    }
    async fn read_ranges(
        &self,
        ranges: &[blindfold_store::ByteRange],
    ) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.inner.read_ranges(ranges).await
    }
    async fn write(
        &self,
        cells: Vec<(blindfold_store::CellId, Vec<u8>)>,
    ) -> blindfold_store::Result<()> {
        let n = cells.len() as i64;
        if self.left.fetch_sub(n, std::sync::atomic::Ordering::SeqCst) < n {
            return Err(StoreError::Unsupported("simulated crash at HalfWritten".into()));
        }
        self.inner.write(cells).await
    }
    async fn flush(&self) -> blindfold_store::Result<()> {
        self.inner.flush().await
    }
}

/// Grows the tree of a data directory whose engine is closed (checkpointed, nothing in its
/// redo log) from `params` to `blocks`, through steps 2–5 of the module documentation.
/// `replaced` is set once the checkpoint names the new tree. Returns the new parameters.
async fn grow_closed(
    dir: &Path,
    params: &GatewayParams,
    url: &StoreUrl,
    key: &MasterKey,
    blocks: u64,
    crash: Option<CrashPoint>,
    replaced: &mut bool,
) -> Result<(GatewayParams, Rebuilt)> {
    let first = match read_intent(dir)? {
        Some(i) if i.from_generation == params.generation && i.blocks == blocks => i.to_generation,
        _ => params
            .generation
            .checked_add(1)
            .ok_or_else(|| GatewayError::Config("store array generations exhausted".into()))?,
    };
    let (new_params, new) = open_new_array(url, params, blocks, first).await?;
    let intent =
        Intent { blocks, from_generation: params.generation, to_generation: new_params.generation };
    write_private(&dir.join(INTENT_FILE), &serde_json::to_vec_pretty(&intent).expect("json"))?;
    if crash == Some(CrashPoint::AfterIntent) {
        return Err(simulated(CrashPoint::AfterIntent));
    }
    let old_name = oram_array(params.generation);
    let old = open_store(url, &old_name, oram_geometry(params)?)
        .await
        .map_err(|e| GatewayError::Config(format!("opening store array {old_name}: {e}")))?;
    let new: Arc<dyn Store> =
        if crash == Some(CrashPoint::HalfWritten) { cut_short(new) } else { new };
    let oram_dir = dir.join("oram");
    let epoch = fresh_epoch();
    let rebuilt =
        blindfold_proxy::lifecycle::grow(&new_params, &oram_dir, old, new, key, epoch).await?;
    *replaced = true;
    if crash == Some(CrashPoint::AfterCheckpoint) {
        return Err(simulated(CrashPoint::AfterCheckpoint));
    }
    write_params(dir, &new_params)?;
    retire(dir, old_name)?;
    if crash == Some(CrashPoint::AfterParams) {
        return Err(simulated(CrashPoint::AfterParams));
    }
    remove_intent(dir)?;
    Ok((new_params, rebuilt))
}

/// The number of blocks of the tree the checkpoint in `dir` describes.
fn checkpoint_blocks(dir: &Path, params: &GatewayParams, key: &MasterKey) -> Result<u64> {
    let oram_dir = dir.join("oram");
    Ok(blindfold_proxy::lifecycle::saved_blocks(params.engine, &oram_dir, key)?)
}

/// At start: finishes or redoes a growth a crash interrupted, before the engine opens.
/// `key` is the key the ORAM state is sealed under (growths never overlap a key rotation).
/// Returns the parameters to open with and a note for the operator, if there was a growth.
pub(crate) async fn resume(
    dir: &Path,
    params: GatewayParams,
    url: &StoreUrl,
    key: &MasterKey,
) -> Result<(GatewayParams, Option<String>)> {
    let Some(intent) = read_intent(dir)? else {
        return Ok((params, None));
    };
    if params.generation == intent.to_generation {
        // gateway.json was written; only the intent was left.
        retire(dir, oram_array(intent.from_generation))?;
        remove_intent(dir)?;
        return Ok((params, Some("finished an interrupted growth of the store".into())));
    }
    if params.generation != intent.from_generation {
        remove_intent(dir)?;
        return Ok((params, Some("removed the record of a growth that no longer applies".into())));
    }
    let saved = checkpoint_blocks(dir, &params, key)?;
    if saved == intent.blocks {
        // Past the point of no return: the checkpoint holds the new tree.
        let new_params = grown_params(&params, intent.blocks, intent.to_generation)?;
        write_params(dir, &new_params)?;
        retire(dir, oram_array(params.generation))?;
        remove_intent(dir)?;
        return Ok((
            new_params,
            Some(format!(
                "finished an interrupted growth of the store to {} blocks",
                intent.blocks
            )),
        ));
    }
    if saved != params.blocks {
        return Err(GatewayError::Corrupt(format!(
            "the ORAM checkpoint holds {saved} blocks, but gateway.json says {} and the \
             interrupted growth {}",
            params.blocks, intent.blocks
        )));
    }
    let started = Instant::now();
    let mut replaced = false;
    let (new_params, rebuilt) =
        grow_closed(dir, &params, url, key, intent.blocks, None, &mut replaced).await?;
    let grown = grown_report(&params, &new_params, &rebuilt, started);
    Ok((new_params, Some(format!("resumed an interrupted growth: {}", grown.describe()))))
}

fn grown_report(
    from: &GatewayParams,
    to: &GatewayParams,
    rebuilt: &Rebuilt,
    started: Instant,
) -> Grown {
    Grown {
        from_blocks: from.blocks,
        to_blocks: to.blocks,
        block_size: from.block_size,
        old_array: oram_array(from.generation),
        new_array: oram_array(to.generation),
        cells_read: rebuilt.cells_read,
        cells_written: rebuilt.cells_written,
        old_array_removed: false,
        seconds: started.elapsed().as_secs_f64(),
        in_place: None,
        set_aside_bytes: rebuilt.set_aside_bytes,
    }
}

/// The engine in place while a growth rebuilds the tree (no call reaches it then), and after
/// a growth that failed past its point of no return: it refuses everything, so the gateway
/// stops; the next start finishes the growth.
#[derive(Debug)]
struct Stopped {
    block_size: usize,
    kind: &'static str,
}

#[async_trait::async_trait]
impl SharedEngine for Stopped {
    fn block_size(&self) -> usize {
        self.block_size
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn durable(&self) -> bool {
        true
    }
    async fn read_many(
        &self,
        _: &[blindfold_oram::BlockId],
    ) -> blindfold_proxy::Result<Vec<Vec<u8>>> {
        Err(ProxyError::Poisoned)
    }
    async fn write_many(
        &self,
        _: Vec<(blindfold_oram::BlockId, Vec<u8>)>,
    ) -> blindfold_proxy::Result<()> {
        Err(ProxyError::Poisoned)
    }
    async fn commit(&self) -> blindfold_proxy::Result<()> {
        Err(ProxyError::Poisoned)
    }
    async fn shutdown(&self) -> blindfold_proxy::Result<()> {
        // Refused, so that no snapshot pairs the saved tree with parameters a failed growth
        // may not have updated: the next start finishes the growth first.
        Err(ProxyError::Poisoned)
    }
    fn verify<'a>(
        &'a self,
        _: &'a mut dyn FnMut(u64, u64),
    ) -> futures::future::LocalBoxFuture<'a, blindfold_proxy::Result<blindfold_proxy::VerifyReport>>
    {
        Box::pin(async { Err(ProxyError::Poisoned) })
    }
}

/// Grows a running gateway's store (see the module documentation).
pub struct Grower {
    dir: PathBuf,
    key: Arc<MasterKey>,
    engine: Arc<Swappable>,
    objects: Arc<ObjectLayer>,
    observer: Arc<Observer>,
    wrap_store: Option<Arc<StoreWrapper>>,
    /// The store (with any secret its `--store` URL gave, which gateway.json leaves out).
    url: StoreUrl,
    snapshots: SnapshotSlot,
    rotating: bool,
    /// The store-side log, when the gateway keeps one (`--durability store`): a growth holds
    /// its checkpoint lock throughout, hands the grown engine's log to it, and ends with a
    /// store checkpoint of the grown state.
    journal: parking_lot::Mutex<Option<Arc<crate::storelog::StoreLog>>>,
    busy: tokio::sync::Mutex<()>,
    crash: parking_lot::Mutex<Option<CrashPoint>>,
}

impl std::fmt::Debug for Grower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grower").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// What a [`Grower`] needs from the gateway it grows.
pub(crate) struct GrowerParts {
    pub dir: PathBuf,
    pub key: Arc<MasterKey>,
    pub engine: Arc<Swappable>,
    pub objects: Arc<ObjectLayer>,
    pub observer: Arc<Observer>,
    pub wrap_store: Option<Arc<StoreWrapper>>,
    pub store_url: StoreUrl,
    pub snapshots: SnapshotSlot,
    pub rotating: bool,
}

impl Grower {
    pub(crate) fn new(p: GrowerParts) -> Self {
        Self {
            dir: p.dir,
            key: p.key,
            engine: p.engine,
            objects: p.objects,
            observer: p.observer,
            wrap_store: p.wrap_store,
            url: p.store_url,
            snapshots: p.snapshots,
            rotating: p.rotating,
            journal: parking_lot::Mutex::new(None),
            busy: tokio::sync::Mutex::new(()),
            crash: parking_lot::Mutex::new(None),
        }
    }

    /// Makes the next growth stop at `at` as a crash would (for tests).
    #[doc(hidden)]
    pub fn crash_at(&self, at: Option<CrashPoint>) {
        *self.crash.lock() = at;
    }

    /// From now on, growths go through the store-side `log` (see [`Grower::grow`]).
    pub(crate) fn set_journal(&self, log: Arc<crate::storelog::StoreLog>) {
        *self.journal.lock() = Some(log);
    }

    /// Whether a key rotation is under way in this process (growths wait until it has ended:
    /// the rebuild reads under one key).
    pub fn rotating(&self) -> bool {
        self.rotating && self.dir.join(crate::rotation::ROTATION_FILE).exists()
    }

    /// The capacity now, in blocks.
    pub fn capacity(&self) -> u64 {
        self.objects.directory().capacity()
    }

    /// Blocks in use (owned by objects, uploads or writes in progress).
    pub fn used_blocks(&self) -> u64 {
        let d = self.objects.directory();
        d.capacity() - d.free_blocks()
    }

    /// Grows the store to `blocks` blocks while the gateway serves; requests wait meanwhile.
    pub async fn grow(&self, blocks: u64) -> Result<Grown> {
        let _one = self.busy.lock().await;
        // With a store-side log, no store checkpoint is written while the engine and
        // gateway.json change: the store's newest checkpoint names the old tree (which stays
        // in the store) until the one of the grown state replaces it.
        let journal = self.journal.lock().clone();
        let checkpoints_held = match &journal {
            Some(log) => Some(log.checkpoints().await),
            None => None,
        };
        if self.rotating() {
            return Err(GatewayError::Config(
                "a key rotation is under way: grow the store once it has ended (the gateway \
                 logs it)"
                    .into(),
            ));
        }
        let params = read_params(&self.dir)?
            .ok_or_else(|| GatewayError::Config("gateway.json is missing".into()))?;
        check_request(&params, blocks, self.used_blocks())?;
        let crash = *self.crash.lock();
        tracing::info!(from = params.blocks, to = blocks, "growing the store: requests wait");
        let started = Instant::now();
        let mut engine = self.engine.exclusive().await;
        let room = engine.grow_in_place(blocks, InPlaceGrowth::MakeRoom).await;
        if let Some(room) = room {
            let logged = journal.as_ref().zip(checkpoints_held.as_ref());
            return self
                .grow_in_place(&engine, &params, blocks, room, crash, started, logged)
                .await;
        }
        engine.shutdown().await?;
        // Closed, as at a clean stop: the rebuild reads its checkpoint and its store array.
        let stopped = self.stopped(&engine);
        drop(std::mem::replace(&mut *engine, stopped));
        self.observer.release_store();
        let mut replaced = false;
        let grown =
            grow_closed(&self.dir, &params, &self.url, &self.key, blocks, crash, &mut replaced)
                .await;
        let (new_params, rebuilt) = match grown {
            Ok(v) => v,
            // A simulated crash: the engine stays closed, as the process would be gone.
            Err(e) if crash.is_some() => return Err(e),
            Err(e) if !replaced => {
                // Nothing changed: serve on at the old size, from the checkpoint just saved.
                let reopened = match remove_intent(&self.dir) {
                    Ok(()) => self.open_engine(&params).await,
                    Err(r) => Err(r),
                };
                let reopened = match (reopened, &journal) {
                    (Ok(old), Some(log)) => self.attach(&old, log).await.map(|()| old),
                    (r, _) => r,
                };
                return match reopened {
                    Ok(old) => {
                        *engine = old;
                        tracing::warn!(error = %e, "the store was not grown");
                        Err(e)
                    }
                    Err(r) => Err(GatewayError::Config(format!(
                        "{e}; and then the engine did not reopen ({r}): restart the gateway"
                    ))),
                };
            }
            Err(e) => {
                // The checkpoint names the new tree: only a restart can finish the growth.
                return Err(GatewayError::Config(format!(
                    "growing failed after the new tree was saved ({e}); restart the gateway to \
                     finish the growth"
                )));
            }
        };
        let opened = match self.open_engine(&new_params).await {
            Ok(e) => match &journal {
                Some(log) => self.attach(&e, log).await.map(|()| e),
                None => Ok(e),
            },
            Err(e) => Err(e),
        };
        match opened {
            Ok(e) => *engine = e,
            Err(e) => {
                if let Some(log) = &journal {
                    log.fence(format!(
                        "the store grew, but its new engine did not open ({e}); the store-side \
                         log acknowledges nothing more: restart the gateway"
                    ));
                }
                return Err(GatewayError::Config(format!(
                    "the store grew, but its new engine did not open ({e}); restart the gateway"
                )));
            }
        }
        self.objects.directory().grow_to(new_params.blocks);
        // The directory and the checkpoint match while no commit can run: snapshot now.
        let snapshot = match (&journal, &checkpoints_held) {
            // (The store's newest checkpoint still names the old tree: the grown engine's log
            // must not follow it there.)
            (Some(log), Some(held)) => self.logged_snapshot(log, held, &new_params).await,
            _ => self.snapshot(&new_params).await,
        };
        drop(engine);
        let mut grown = grown_report(&params, &new_params, &rebuilt, started);
        match snapshot {
            // The newest snapshot names the new arrays: the old ones serve nothing any more.
            Ok(removed) => grown.old_array_removed = removed.contains(&grown.old_array),
            Err(e) => tracing::warn!(
                error = %e,
                "no snapshot of the grown store was written (the next clean stop writes one); \
                 the old arrays stay in the store"
            ),
        }
        tracing::info!("{}", grown.describe());
        Ok(grown)
    }

    /// The rest of a growth of an engine whose blocks live elsewhere, after its first step
    /// (`room`): the new capacity is recorded in `gateway.json` — the point of no return: a
    /// crash after it reopens the engine at the new size, which finishes the growth — then
    /// the engine serves it. Nothing moves in the gateway's store.
    #[allow(clippy::too_many_arguments)]
    async fn grow_in_place(
        &self,
        engine: &Arc<dyn SharedEngine>,
        params: &GatewayParams,
        blocks: u64,
        room: blindfold_proxy::Result<String>,
        crash: Option<CrashPoint>,
        started: Instant,
        logged: Option<(&Arc<crate::storelog::StoreLog>, &tokio::sync::MutexGuard<'_, ()>)>,
    ) -> Result<Grown> {
        let room = match room {
            Ok(room) => room,
            Err(e) => {
                tracing::warn!(error = %e, "the store was not grown");
                return Err(GatewayError::Config(format!(
                    "{e}; nothing else was changed: the gateway serves on at {} blocks",
                    params.blocks
                )));
            }
        };
        if crash == Some(CrashPoint::AfterCheckpoint) {
            return Err(simulated(CrashPoint::AfterCheckpoint));
        }
        let new_params = grown_params(params, blocks, params.generation)?;
        write_params(&self.dir, &new_params)?;
        if crash == Some(CrashPoint::AfterParams) {
            return Err(simulated(CrashPoint::AfterParams));
        }
        let adopted = engine.grow_in_place(blocks, InPlaceGrowth::Adopt).await;
        let adopted = adopted.expect("an engine that made room in place grows in place");
        let adopted = adopted.map_err(|e| {
            GatewayError::Config(format!(
                "the new capacity is recorded, but the engine did not take it ({e}); restart \
                 the gateway to finish the growth"
            ))
        })?;
        self.objects.directory().grow_to(blocks);
        let snapshot = match logged {
            // A store checkpoint of the grown state (the engine's own checkpoints of each
            // step went to the log already); a plain snapshot would end the log there. (The
            // store's newest checkpoint is of the smaller capacity: what the log holds after
            // it may name the new blocks.)
            Some((log, held)) => self.logged_snapshot(log, held, &new_params).await,
            None => self.snapshot(&new_params).await,
        };
        if let Err(e) = snapshot {
            tracing::warn!(error = %e, "no snapshot of the grown store was written (the next clean stop writes one)");
        }
        let grown = Grown {
            from_blocks: params.blocks,
            to_blocks: blocks,
            block_size: params.block_size,
            old_array: String::new(),
            new_array: String::new(),
            cells_read: 0,
            cells_written: 0,
            old_array_removed: false,
            seconds: started.elapsed().as_secs_f64(),
            in_place: Some(format!("{room}; {adopted}")),
            set_aside_bytes: 0,
        };
        tracing::info!("{}", grown.describe());
        Ok(grown)
    }

    /// The store checkpoint that ends a growth under `--durability store` (the caller holds
    /// the log's checkpoint lock, `held`); returns the retired arrays it removed. If it cannot
    /// be written the log is fenced: the store's newest checkpoint is of the state before the
    /// growth, which what the log holds from now on must not follow.
    async fn logged_snapshot(
        &self,
        log: &Arc<crate::storelog::StoreLog>,
        held: &tokio::sync::MutexGuard<'_, ()>,
        new_params: &GatewayParams,
    ) -> Result<Vec<String>> {
        let written = crate::snapshot::write_journal_snapshot_held(
            &self.snapshots,
            &self.key,
            &self.dir,
            &self.objects,
            log,
            new_params,
            held,
            true,
        )
        .await;
        written.map(|(_, removed)| removed).inspect_err(|e| {
            log.fence(format!(
                "the store grew, but no store checkpoint of the grown state could be written \
                 ({e}); the store-side log acknowledges nothing more: restart the gateway (its \
                 start writes one)"
            ))
        })
    }

    /// Hands `engine`'s redo log to the store-side `log`, starting from its checkpoint and log
    /// as they are on disk now.
    async fn attach(
        &self,
        engine: &Arc<dyn SharedEngine>,
        log: &Arc<crate::storelog::StoreLog>,
    ) -> Result<()> {
        let tap = engine.journal_tap().await.ok_or_else(|| {
            GatewayError::Config("the grown engine keeps no redo log to hand to the store".into())
        })?;
        tap.attach(Arc::clone(log) as Arc<dyn blindfold_proxy::LogMirror>);
        tap.checkpointed(&self.dir.join("oram")).await?;
        Ok(())
    }

    fn stopped(&self, old: &Arc<dyn SharedEngine>) -> Arc<dyn SharedEngine> {
        Arc::new(Stopped { block_size: old.block_size(), kind: old.kind() })
    }

    async fn open_engine(&self, params: &GatewayParams) -> Result<Arc<dyn SharedEngine>> {
        let url = self.url.clone();
        let name = oram_array(params.generation);
        let geometry = oram_geometry(params)?;
        let store = open_store(&url, &name, geometry)
            .await
            .map_err(|e| GatewayError::Config(format!("opening store array {name}: {e}")))?;
        // The grown engine's writes pass the lease's gate, as the first engine's did.
        let store = match self.journal.lock().as_ref() {
            Some(log) => blindfold_store::GatedStore::wrap(store, log.gate()),
            None => store,
        };
        let store = match &self.wrap_store {
            Some(wrap) => wrap(store),
            None => store,
        };
        let store = self.observer.wrap_store(store, physical_view(params)?, geometry.total_bytes());
        let oram_dir = self.dir.join("oram");
        let observer = Arc::clone(&self.observer);
        let wrap_tee = move |tee| observer.wrap_tee_store(tee);
        let store = EngineStore { store, url: &url, array: &name, geometry, wrap_tee: &wrap_tee };
        let opened = blindfold_proxy::lifecycle::open_engine(
            params, &oram_dir, store, &self.key, None, false,
        );
        Ok(opened.await?.0)
    }

    /// Writes a snapshot of the grown state to a snapshot array of its size; returns the
    /// arrays that were removed since nothing needs them any more.
    async fn snapshot(&self, params: &GatewayParams) -> Result<Vec<String>> {
        let url = self.url.clone();
        let previous = self.snapshots.lock().take();
        let min_seq = match &previous {
            Some(a) => crate::snapshot::latest_seq(&*a.store, &self.key).await.unwrap_or(0),
            None => 0,
        };
        let cells = blindfold_proxy::catalogue::engine_cells(params)?;
        let cached = cached_bytes_of(params)?;
        let wanted = crate::snapshot::geometry(params.blocks, cells, cached)?;
        let array = match previous {
            // Still large enough (the room kept for the trusted state grew too little).
            Some(a) if a.store.geometry() == wanted => a,
            other => {
                // Closed first: a file store's array takes one handle at a time.
                drop(other);
                crate::snapshot::open(&url, &[&*self.key], params.blocks, cells, cached).await?
            }
        };
        *self.snapshots.lock() = Some(array);
        crate::snapshot::write_snapshot_to(
            &self.snapshots,
            &self.key,
            None,
            &self.dir,
            &self.objects,
            min_seq,
        )
        .await
        .map(|(_, removed)| removed)
    }
}

/// `grower` as a function that grows the store to at least the given number of blocks and
/// returns how many it holds then: how `blindfold node` lets its balancer grow it (the node's
/// tree is rebuilt into a larger one, as `blindfold grow` does).
pub fn grow_fn(
    grower: Arc<Grower>,
) -> Arc<
    dyn Fn(u64) -> futures::future::BoxFuture<'static, std::result::Result<u64, String>>
        + Send
        + Sync,
> {
    Arc::new(move |blocks| {
        let grower = Arc::clone(&grower);
        Box::pin(async move {
            grower.grow(blocks).await.map(|g| g.to_blocks).map_err(|e| e.to_string())
        })
    })
}

/// Serves growth requests for a running gateway until `stop` turns true: a [`REQUEST_FILE`]
/// from `blindfold grow`, checked every second, and, with `grow_at` (a percentage), a growth
/// to twice the capacity (at most `grow_max` blocks) whenever the blocks in use reach it.
pub async fn watch(
    grower: Arc<Grower>,
    grow_at: Option<u8>,
    grow_max: Option<u64>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut at_limit_logged = false;
    let mut rotation_logged = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let request_path = grower.dir.join(REQUEST_FILE);
        if request_path.exists() && grower.rotating() {
            if !rotation_logged {
                tracing::info!("grow: waiting for the key rotation under way to end");
                rotation_logged = true;
            }
            continue;
        }
        if request_path.exists() {
            let answer = match std::fs::read(&request_path)
                .map_err(|e| e.to_string())
                .and_then(|raw| serde_json::from_slice::<Request>(&raw).map_err(|e| e.to_string()))
            {
                Err(e) => Answer {
                    message: format!("unreadable request {}: {e}", request_path.display()),
                    grown: None,
                },
                Ok(req) => match grower.grow(req.blocks).await {
                    Ok(g) => Answer { message: g.describe(), grown: Some(g) },
                    Err(e) => Answer { message: format!("not grown: {e}"), grown: None },
                },
            };
            tracing::info!("grow: {}", answer.message);
            let written = write_private(
                &grower.dir.join(RESULT_FILE),
                &serde_json::to_vec_pretty(&answer).expect("json"),
            );
            if let Err(e) = written.and_then(|()| {
                std::fs::remove_file(&request_path).map_err(|e| {
                    GatewayError::Config(format!("removing {}: {e}", request_path.display()))
                })
            }) {
                tracing::warn!(error = %e, "could not answer the growth request");
            }
            continue;
        }
        let Some(percent) = grow_at.filter(|_| !grower.rotating()) else { continue };
        let capacity = grower.capacity();
        if grower.used_blocks().saturating_mul(100) < capacity.saturating_mul(u64::from(percent)) {
            continue;
        }
        let target = capacity.saturating_mul(2).min(grow_max.unwrap_or(u64::MAX));
        if target <= capacity {
            if !at_limit_logged {
                tracing::warn!(
                    capacity,
                    "the store is {percent}% full and at --grow-max: not growing further"
                );
                at_limit_logged = true;
            }
            continue;
        }
        match grower.grow(target).await {
            Ok(g) => tracing::info!("grew automatically at {percent}% full: {}", g.describe()),
            Err(e) => {
                tracing::error!("automatic growth failed: {e}");
                // Not again every second: wait a minute before the next try.
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
                    _ = stop.changed() => return,
                }
            }
        }
    }
}
