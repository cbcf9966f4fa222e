//! Rebuilding a durable engine's tree into a new store array, for `blindfold recover`.
//!
//! A snapshot's checkpoint names, for every block, the leaf it had when the snapshot was
//! taken. If the lost gateway went on after that snapshot, every block it accessed had that
//! leaf's path read by the store already; restoring the checkpoint as it is would make the
//! next access of each such block read the same path again, linking requests across the two
//! timelines. And the restored run would seal under the same key epochs and versions as the
//! lost run did, so the store could hand the lost run's ciphertexts back and they would
//! authenticate.
//!
//! So `recover` does not continue the snapshot's tree; it rebuilds it:
//!
//! 1. every cell of the old array is read (in cell order, in batches of 256) and opened under
//!    the snapshot's versions and epochs; every real block found there, in the cached top of
//!    the tree and in the stash is kept in memory. Cells that fail (written by the lost run
//!    after the snapshot, or tampered with) are counted; the blocks they held are *lost*;
//! 2. a fresh tree of the same configuration is bulk-loaded with those blocks
//!    ([`PathOram::bulk_load`]: fresh uniformly random leaves, every bucket once, post-order),
//!    sealed under a fresh random key epoch (see [`fresh_epoch`]) at version 1, into a **new**
//!    store array — the old one is left as it was, so a crash half-way loses nothing and the
//!    rebuild can simply run again;
//! 3. only then the checkpoint in the data directory is replaced (atomically) by the new tree's.
//!
//! # Security
//!
//! The store sees a read of every cell of the old array in a fixed order, then a write of every
//! cell of the new array in a fixed order: nothing depends on the data or the access history.
//! No block's new leaf depends on its old one, so no path the store saw in the lost timeline is
//! fetched for the same block again (beyond what two independent random leaves share). Every
//! cell of the new tree is sealed under the fresh epoch, which each cell's seal must then name
//! exactly (see [`crate::VersionTable`]), so none of the lost timeline's ciphertexts opens.
//!
//! # Partition engines
//!
//! [`rebuild_oblivistore`] and [`grow_oblivistore`] do the same for the ObliviStore and CURIOUS
//! engines ([`crate::DurableObliviStore`]): every cell of every filled level (or every bucket's
//! current copy) is read once and opened under its serial; every block found, and every block
//! in the checkpoint's eviction cache, goes to a fresh uniformly random partition of a new
//! engine ([`ObliviStoreOram::bulk_loaded`]), whose top levels (or first bucket copies) are
//! written once in a fixed order. Their cells are bound to a serial rather than a key epoch, so
//! the new engine's serials start at a [`fresh_serial`].
//!
//! # The TEE engine
//!
//! [`rebuild_tee`] reads every cell of both areas of every node in cell order, opens those of
//! the current areas in the gateway (which holds the trusted component's key), and bulk-loads
//! every block found, and every block of the checkpoint's ring, into a fresh tree sealed under
//! a **fresh random store id**: the TEE engine's cells bind the store id and a serial rather
//! than a key epoch, so a new store id is what keeps the old array's (and a lost timeline's)
//! cells from opening in the new one, and its query and eviction streams fresh for the trusted
//! component.
//!
//! # Growing
//!
//! [`grow_path_oram`] and [`grow_tao`] (for `blindfold grow`) run the same two passes from a
//! cleanly stopped engine into a tree of *more* blocks of the same size and `Z`: every block
//! keeps its contents and gets a fresh leaf in the larger tree, the blocks past the old capacity
//! read as zeros. Unlike a recovery, a cell that does not authenticate stops the growth before
//! the checkpoint is replaced: a growth never loses a block silently. What the store sees is
//! fixed by the two sizes alone.
//!
//! # Memory
//!
//! Path ORAM and TaoStore (recovery and growth): the new tree's leaves are drawn before the
//! old array is read, and [`PathOram::bulk_load_step`] asks for the blocks in the order of
//! those leaves. When the tree's blocks could exceed [`memory_limit`]
//! (`--rebuild-memory`, 1 GiB by default), every real block found is set aside on the local
//! disk, sealed under a key that only this process holds, in parts by its new leaf, each part
//! about a third of the limit; the load then reads the parts back one after the other. At
//! most one part, the few blocks carried up the tree past its end, and the parts' write
//! buffers (a sixth of the limit) are in memory at once; the disk needs room for the blocks
//! found. [`Rebuilt::held_peak_bytes`] and [`Rebuilt::set_aside_bytes`] say what it took.
//! Below the limit the blocks simply stay in memory. Either way the trusted state itself
//! (the position map, 4 bytes per block) and the 12 bytes per block of the bulk load are in
//! memory, as when serving.
//!
//! The partition engines and the TEE engine still hold every real block found in memory
//! until the new engine has placed it: up to `blocks × block_size` bytes.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StateSealer};
use blindfold_oram::oblivistore::{ObliviStoreConfig, ObliviStoreOram, DUMMY};
use blindfold_oram::path::SLOT_HEADER;
use blindfold_oram::{BlockId, BulkLoad, OramError, PathOram, PathOramConfig, PathOramState};
use blindfold_store::{CellId, Store};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::bulk::{read_in_order, write_batches};
use crate::durable::{load_saved_path_oram, save_rebuilt_path_oram, SavedPathOram};
use crate::durable_tao::{load_saved_tao, save_rebuilt_tao, SavedTao};
use crate::packed::{PackedStore, Packing};
use crate::pinned::{PinnedCells, PinnedStore};
use crate::retry::{with_retry, RetryPolicy};
use crate::sealing::{open_cell, seal_cells};
use crate::slots::{SlotMap, SlottedStore};
use crate::{ProxyError, Result, TaoConfig, TaoState, TaoStats, VersionTable};

/// Cells read or written per store request during a rebuild.
const BATCH: usize = 256;

/// Epochs are drawn below this, leaving 2^31 later epochs for the runs that follow (each
/// start takes the next one; the sealer moves on after 2^31 seals).
const EPOCH_RANGE: u32 = 1 << 31;

pub use crate::tee::{rebuild_tee, rekey_tee, saved_tee_blocks};

/// A uniformly random key epoch in `1..2^31`, from the operating system's generator.
///
/// Two timelines (the lost run and a recovered one, or two recoveries from one snapshot) use
/// the same epoch for some cell only if their epoch ranges overlap: about `runs / 2^31` for
/// each pair of timelines, where `runs` counts their restarts.
pub fn fresh_epoch() -> u32 {
    rand::rngs::OsRng.gen_range(1..EPOCH_RANGE)
}

/// A uniformly random first serial in `2^40..2^62`, from the operating system's generator,
/// for the cells of a partition engine's rebuild (the ObliviStore and CURIOUS engines).
///
/// Their cells are bound to an address and a serial, whatever the key epoch: a rebuilt engine
/// must never seal a cell under a serial the lost timeline may have used at the same address,
/// or the store could hand that timeline's cell back and it would open. The lost run's serials
/// lie below `2^40` plus what it used after the snapshot, or (after an earlier recovery) in an
/// independent random range; two timelines of at most `2^40` serials each overlap with
/// probability about `2^-21`, and even then only a cell sealed at the same address under the
/// same serial by both would open.
pub fn fresh_serial() -> u64 {
    rand::rngs::OsRng.gen_range(1u64 << 40..1u64 << 62)
}

/// What a rebuild found and did.
#[derive(Clone, Debug, Default)]
pub struct Rebuilt {
    /// Cells of the old array read (all of them).
    pub cells_read: u64,
    /// Cells of the old array that did not open under the saved versions and epochs: written
    /// after the snapshot by the lost run, or tampered with.
    pub unreadable_cells: Vec<u64>,
    /// Real blocks found (in cells, the cached top of the tree and the stash).
    pub blocks_found: u64,
    /// Blocks that were written before the snapshot but were in no readable cell: their
    /// contents are lost (the new tree holds zeros for them). With a recursive position map,
    /// which blocks were ever written is not known here: then every block not found is listed.
    pub lost: Vec<u64>,
    /// Cells of the new array written.
    pub cells_written: u64,
    /// The key epoch the new tree is sealed under.
    pub epoch: u32,
    /// The most bytes of block contents held in memory at once while the blocks found waited
    /// for the new tree (Path ORAM and TaoStore; see [memory](self#memory)).
    pub held_peak_bytes: u64,
    /// Bytes of sealed block contents set aside on the local disk because they did not fit
    /// in [`memory_limit`] (0 when everything fitted).
    pub set_aside_bytes: u64,
}

/// Rebuilds the [`crate::DurablePathOram`] whose checkpoint is in `dir` (over the cells of
/// `old`) into `new`, a store of the same geometry, sealed under `epoch`; then replaces the
/// checkpoint. See the module documentation.
pub async fn rebuild_path_oram(
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
) -> Result<Rebuilt> {
    path_oram_into(dir, old, new, key, epoch, None).await
}

/// Grows the [`crate::DurablePathOram`] whose checkpoint is in `dir` (over the cells of `old`,
/// shut down cleanly: nothing in its redo log) into `new`, a store laid out for `config`, which
/// must hold more blocks of the same size and shape; then replaces the checkpoint. Every block
/// keeps its contents; the blocks beyond the old capacity read as zeros. A cell that does not
/// authenticate stops the growth before anything is replaced (see [growing](self#growing)).
pub async fn grow_path_oram(
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
    config: PathOramConfig,
) -> Result<Rebuilt> {
    path_oram_into(dir, old, new, key, epoch, Some(config)).await
}

/// The number of blocks of the Path ORAM tree whose checkpoint is in `dir`.
pub fn saved_path_oram_blocks(dir: &Path, key: &MasterKey) -> Result<u64> {
    Ok(load_saved_path_oram(dir, key)?.oram.config.blocks())
}

/// The number of blocks of the TaoStore tree whose checkpoint is in `dir`.
pub fn saved_tao_blocks(dir: &Path, key: &MasterKey) -> Result<u64> {
    Ok(load_saved_tao(dir, key)?.state.config.blocks())
}

/// Checks that a tree of `to` can take the blocks of a tree of `from` by growing.
fn check_growth(from: &PathOramConfig, to: &PathOramConfig) -> Result<()> {
    if to.blocks() <= from.blocks() || to.block_size() != from.block_size() || to.z() != from.z() {
        return Err(ProxyError::State(format!(
            "cannot grow a tree of {} blocks of {} bytes (Z = {}) into one of {} blocks of {} \
             bytes (Z = {}): growing adds blocks and keeps their size",
            from.blocks(),
            from.block_size(),
            from.z(),
            to.blocks(),
            to.block_size(),
            to.z()
        )));
    }
    Ok(())
}

/// A growth copies only what authenticates: any damaged cell stops it, nothing replaced.
pub(crate) fn refuse_damage(report: &Rebuilt) -> Result<()> {
    if let Some(first) = report.unreadable_cells.first() {
        return Err(ProxyError::State(format!(
            "{} cells of the store do not authenticate (the first is cell {first}): growing \
             would lose the blocks in them, so nothing was changed; run `blindfold verify`",
            report.unreadable_cells.len()
        )));
    }
    Ok(())
}

async fn path_oram_into(
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
    grow_to: Option<PathOramConfig>,
) -> Result<Rebuilt> {
    let saved = load_saved_path_oram(dir, key)?;
    let config = saved.oram.config.clone();
    if let Some(to) = &grow_to {
        check_growth(&config, to)?;
    }
    let target = grow_to.clone().unwrap_or_else(|| config.clone());
    let opener = CellSealer::new(key, saved.store_id, saved.next_epoch);
    // The new tree's leaves are drawn first, so that the blocks found can be set aside in the
    // order the load will ask for them (see [memory](self#memory)).
    let mut loading = Loading::start(&target)?;
    let mut found = Found::new(&config, &target, dir)?;
    let mut report = Rebuilt { epoch, ..Rebuilt::default() };
    let data = config.trees()[0];
    let data_cells = data.base..data.base + data.shape.buckets();
    let (old, new) = slotted_pair(old, new, saved.slots, target.total_cells())?;
    read_old(&*old, &opener, &saved.versions, &mut report, |cell, plain| {
        if data_cells.contains(&cell) {
            found.bucket(plain, &loading.load)?;
        }
        Ok(())
    })
    .await?;
    if grow_to.is_some() {
        refuse_damage(&report)?;
    }
    // The cached top of the data tree and its stash are in the checkpoint.
    for bucket in saved.oram.caches.first().into_iter().flatten() {
        found.bucket(bucket, &loading.load)?;
    }
    for (id, _, d) in saved.oram.stashes.into_iter().next().unwrap_or_default() {
        found.block(id, d, &loading.load)?;
    }
    let in_memory = saved.oram.top.len() as u64 == config.blocks();
    report.lost = found.lost(in_memory.then_some(&saved.oram.top[..]));
    report.blocks_found = found.found;
    let sealer = CellSealer::new(key, saved.store_id, epoch);
    let (oram, versions, written) =
        load_new(&target, &mut loading, &mut found, &new, &sealer).await?;
    report.cells_written = written;
    report.held_peak_bytes = found.held_peak_bytes();
    report.set_aside_bytes = found.set_aside_bytes();
    // What was set aside leaves the disk (as it does when a failure drops `found`).
    drop(found);
    save_rebuilt_path_oram(
        dir,
        SavedPathOram {
            store_id: saved.store_id,
            oram,
            versions,
            slots: new.slots(),
            next_epoch: next_epoch(epoch)?,
            seq: saved.seq,
        },
        key,
    )?;
    Ok(report)
}

/// Rebuilds the [`crate::DurableTao`] whose checkpoint is in `dir` (over the cells of `old`)
/// into `new`, sealed under `epoch`; then replaces the checkpoint. See the module
/// documentation.
pub async fn rebuild_tao(
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
) -> Result<Rebuilt> {
    tao_into(dir, old, new, key, epoch, None).await
}

/// Grows the [`crate::DurableTao`] whose checkpoint is in `dir` (shut down cleanly) into
/// `new`, a store laid out for `config` (more blocks of the same size and shape); then
/// replaces the checkpoint. As [`grow_path_oram`].
pub async fn grow_tao(
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
    config: TaoConfig,
) -> Result<Rebuilt> {
    tao_into(dir, old, new, key, epoch, Some(config)).await
}

async fn tao_into(
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
    grow_to: Option<TaoConfig>,
) -> Result<Rebuilt> {
    let saved = load_saved_tao(dir, key)?;
    let state = saved.state;
    let tree = state.config.tree().clone();
    if state.versions.len() != tree.total_cells() || state.posmap.len() as u64 != tree.blocks() {
        return Err(ProxyError::State("saved TaoStore state does not match its tree".into()));
    }
    if let Some(to) = &grow_to {
        check_growth(&tree, to.tree())?;
    }
    let target = grow_to.clone().unwrap_or_else(|| state.config.clone());
    let opener = CellSealer::new(key, saved.store_id, saved.next_epoch);
    let mut loading = Loading::start(target.tree())?;
    let mut found = Found::new(&tree, target.tree(), dir)?;
    let mut report = Rebuilt { epoch, ..Rebuilt::default() };
    let (old, new) = packed_pair(old, new, saved.slots, &state.config, &target)?;
    // The pinned top of the tree is read from the checkpoint; the rebuilt tree writes every
    // cell to the new array, and the next start reads its top back into memory once.
    let pinned = saved.pinned.count;
    let old: Arc<dyn Store> =
        if pinned > 0 { Arc::new(PinnedStore::new(old, saved.pinned).await?) } else { old };
    // The buckets the checkpoint holds open are taken from it, not read (their cells are empty
    // in the pinned store).
    let mut versions = state.versions.clone();
    for w in saved.top {
        versions.set(w.cell, 0);
        for (id, _, data) in w.blocks {
            found.block(id, data.to_vec(), &loading.load)?;
        }
    }
    read_old(&*old, &opener, &versions, &mut report, |_, plain| found.bucket(plain, &loading.load))
        .await?;
    if grow_to.is_some() {
        refuse_damage(&report)?;
    }
    for (id, _, d) in state.stash {
        found.block(id, d, &loading.load)?;
    }
    report.lost = found.lost(Some(&state.posmap));
    report.blocks_found = found.found;
    let sealer = CellSealer::new(key, saved.store_id, epoch);
    let (oram, versions, written) =
        load_new(target.tree(), &mut loading, &mut found, &new, &sealer).await?;
    report.cells_written = written;
    report.held_peak_bytes = found.held_peak_bytes();
    report.set_aside_bytes = found.set_aside_bytes();
    // What was set aside leaves the disk (as it does when a failure drops `found`).
    drop(found);
    let stash = oram.stashes.into_iter().next().unwrap_or_default();
    let state =
        TaoState { config: target, posmap: oram.top, stash, versions, stats: TaoStats::default() };
    save_rebuilt_tao(
        dir,
        SavedTao {
            store_id: saved.store_id,
            state,
            slots: new.slots(),
            pinned: PinnedCells { count: pinned, cells: None },
            top: Vec::new(),
            next_epoch: next_epoch(epoch)?,
            seq: saved.seq,
        },
        key,
    )?;
    Ok(report)
}

/// Rebuilds the [`crate::DurableObliviStore`] (ObliviStore or CURIOUS) whose checkpoint is in
/// `dir` (over the cells of `old`) into `new`, a store of the same geometry, sealed under
/// `epoch` from a [`fresh_serial`] on; then replaces the checkpoint. The store sees a read of
/// every cell of every level the checkpoint has filled (a set the public shuffle schedule
/// fixes) and a write of every partition's top level (or every bucket's first copy): every
/// block found goes to a fresh uniformly random partition.
pub async fn rebuild_oblivistore(
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
) -> Result<Rebuilt> {
    partitions_into(dir, old, new, key, epoch, None).await
}

/// Grows the [`crate::DurableObliviStore`] whose checkpoint is in `dir` (shut down cleanly)
/// into `new`, a store laid out for `config` (more blocks of the same size and the same kind
/// of partitions); then replaces the checkpoint. As [`grow_path_oram`]: every block keeps its
/// contents, a cell that does not authenticate stops the growth with nothing replaced.
pub async fn grow_oblivistore(
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
    config: ObliviStoreConfig,
) -> Result<Rebuilt> {
    partitions_into(dir, old, new, key, epoch, Some(config)).await
}

/// The number of blocks of the ObliviStore or CURIOUS engine whose checkpoint is in `dir`.
pub fn saved_oblivistore_blocks(dir: &Path, key: &MasterKey) -> Result<u64> {
    Ok(crate::oblivistore::load_saved(dir, key)?.oram.config().blocks())
}

async fn partitions_into(
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
    grow_to: Option<ObliviStoreConfig>,
) -> Result<Rebuilt> {
    let saved = crate::oblivistore::load_saved(dir, key)?;
    let config = saved.oram.config().clone();
    crate::oblivistore::check_store(&*old, &config)?;
    if let Some(to) = &grow_to {
        let same_kind = std::mem::discriminant(&to.sub_oram())
            == std::mem::discriminant(&config.sub_oram())
            && to.batch() == config.batch();
        if to.blocks() <= config.blocks() || to.block_size() != config.block_size() || !same_kind {
            return Err(ProxyError::State(format!(
                "cannot grow an engine of {} blocks of {} bytes into one of {} blocks of {} \
                 bytes{}: growing adds blocks and keeps their size and the kind of partitions",
                config.blocks(),
                config.block_size(),
                to.blocks(),
                to.block_size(),
                if same_kind { "" } else { " with other partitions" }
            )));
        }
    }
    let target = grow_to.clone().unwrap_or_else(|| config.clone());
    crate::oblivistore::check_store(&*new, &target)?;
    let bs = config.block_size() as usize;
    let opener = CellSealer::new(key, saved.store_id, saved.next_epoch);
    let mut report = Rebuilt { epoch, ..Rebuilt::default() };
    // Where each stored block's current copy is: cell → block.
    let stored: HashMap<u64, u64> =
        saved.oram.blocks_stored().into_iter().map(|(b, c)| (c.0, b)).collect();
    let slots = saved.oram.filled_cells();
    report.cells_read = slots.len() as u64;
    let mut found: HashMap<u64, Vec<u8>> = HashMap::new();
    crate::oblivistore::open_slots_in_order(&*old, &opener, bs, &slots, |s, opened| {
        match opened {
            Ok(Some(data)) if stored.get(&s.cell.0) == Some(&s.holder) => {
                found.insert(s.holder, data);
            }
            // A dummy, or a copy a later shuffle or read left behind.
            Ok(_) => {}
            Err(_) => report.unreadable_cells.push(s.cell.0),
        }
        Ok(())
    })
    .await?;
    if grow_to.is_some() {
        refuse_damage(&report)?;
    }
    for (b, data) in saved.oram.cached_blocks() {
        found.insert(b, data.to_vec());
    }
    let mut lost: Vec<u64> = stored.values().copied().filter(|b| !found.contains_key(b)).collect();
    lost.sort_unstable();
    report.lost = lost;
    report.blocks_found = found.len() as u64;
    let mut ids: Vec<u64> = found.keys().copied().collect();
    ids.sort_unstable();
    let (mut oram, new_cells, left) = ObliviStoreOram::bulk_loaded(target, ids, fresh_serial())?;
    let sealer = CellSealer::new(key, saved.store_id, epoch);
    let zeros = vec![0u8; bs];
    let retry = RetryPolicy::default();
    for chunk in new_cells.chunks(BATCH * 16) {
        let sealed = chunk
            .iter()
            .map(|c| {
                let data = if c.holder == DUMMY { &zeros } else { &found[&c.holder] };
                crate::oblivistore::seal(&sealer, c.cell, c.serial, c.holder, data)
            })
            .collect::<Result<Vec<_>>>()?;
        report.cells_written += sealed.len() as u64;
        write_batches(&*new, retry, sealed).await?;
    }
    with_retry(retry, || new.flush()).await?;
    for b in left {
        let data = found.remove(&b).expect("found");
        oram.load_cached(b, data)?;
    }
    let next_epoch = next_epoch(epoch)?;
    let rebuilt =
        crate::oblivistore::SavedObliviStore { store_id: saved.store_id, oram, next_epoch };
    crate::oblivistore::save_rebuilt(dir, rebuilt, key)?;
    Ok(report)
}

/// The new array of a rebuild: written through a fresh slot map if the engine keeps two slots
/// per cell (the cells land in slot 1, published once the whole tree is written), else in
/// place.
enum NewArray {
    InPlace(Arc<dyn Store>),
    Slotted(Arc<SlottedStore>),
    Packed(Arc<PackedStore>),
}

impl NewArray {
    fn store(&self) -> &dyn Store {
        match self {
            Self::InPlace(s) => &**s,
            Self::Slotted(s) => &**s,
            Self::Packed(p) => &**p,
        }
    }

    /// The slot map to save, every written cell published.
    fn slots(&self) -> Option<SlotMap> {
        match self {
            Self::InPlace(_) => None,
            Self::Slotted(s) => {
                s.publish();
                Some(s.map())
            }
            Self::Packed(p) => {
                p.publish();
                Some(p.slot_map())
            }
        }
    }
}

/// The old array as the saved state sees it (through its slot map) and the new array (of
/// `new_cells` logical cells) laid out the same way.
fn slotted_pair(
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    slots: Option<SlotMap>,
    new_cells: u64,
) -> Result<(Arc<dyn Store>, NewArray)> {
    Ok(match slots {
        Some(map) => {
            let old = Arc::new(SlottedStore::new(old, map)?) as Arc<dyn Store>;
            (old, NewArray::Slotted(Arc::new(SlottedStore::new(new, SlotMap::new(new_cells))?)))
        }
        None => (old, NewArray::InPlace(new)),
    })
}

/// As [`slotted_pair`] for a TaoStore tree, which may be stored in subtrees of several levels
/// per store object ([`crate::packed`]): the saved slot map says how deep, and the new tree
/// (of `target`'s size) is packed the same way.
fn packed_pair(
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    slots: Option<SlotMap>,
    saved: &TaoConfig,
    target: &TaoConfig,
) -> Result<(Arc<dyn Store>, NewArray)> {
    let Some(map) = slots else {
        return slotted_pair(old, new, None, target.tree().total_cells());
    };
    let depth = Packing::for_groups(saved.shape().levels(), map.len())?.depth();
    if depth == 1 {
        return slotted_pair(old, new, Some(map), target.tree().total_cells());
    }
    let size = saved.geometry()?.cell_size();
    let old_packing = Packing::new(saved.shape().levels(), depth)?;
    let old = Arc::new(SlottedStore::new(old, map)?);
    let old = Arc::new(PackedStore::new(old, old_packing, size)?) as Arc<dyn Store>;
    let packing = Packing::new(target.shape().levels(), depth)?;
    let new = Arc::new(SlottedStore::new(new, SlotMap::new(packing.groups()))?);
    Ok((old, NewArray::Packed(Arc::new(PackedStore::new(new, packing, size)?))))
}

fn next_epoch(epoch: u32) -> Result<u32> {
    epoch.checked_add(1).ok_or(ProxyError::State("key epochs exhausted".into()))
}

/// Reads every cell of `old` in order, `BATCH` at a time (several in flight), and hands each
/// written cell that opens under its saved version and epoch to `take`; the others are listed
/// as unreadable.
async fn read_old(
    old: &dyn Store,
    opener: &CellSealer,
    versions: &VersionTable,
    report: &mut Rebuilt,
    mut take: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let total = versions.len();
    if old.geometry().cell_count() < total {
        return Err(ProxyError::Geometry {
            found: format!("{} cells", old.geometry().cell_count()),
            needed: format!("at least {total} cells"),
        });
    }
    use futures::StreamExt;
    let mut reads = std::pin::pin!(read_in_order(old, RetryPolicy::default(), total, BATCH as u64));
    while let Some(read) = reads.next().await {
        let (start, fetched) = read?;
        report.cells_read += fetched.len() as u64;
        for (cell, buf) in (start..).zip(fetched) {
            let version = versions.get(cell);
            if version == 0 {
                continue;
            }
            match open_cell(opener, CellId(cell), version, versions.epoch(cell), buf) {
                Ok(plain) => take(cell, &plain)?,
                Err(e) if e.is_integrity() => report.unreadable_cells.push(cell),
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// The bytes of block contents a Path ORAM or TaoStore rebuild holds in memory by default
/// (see [memory](self#memory)): 1 GiB.
pub const DEFAULT_MEMORY_LIMIT: u64 = 1 << 30;

/// The smallest limit [`set_memory_limit`] takes: 64 KiB.
pub const MIN_MEMORY_LIMIT: u64 = 64 << 10;

static MEMORY_LIMIT: AtomicU64 = AtomicU64::new(DEFAULT_MEMORY_LIMIT);

/// Sets how many bytes of block contents a Path ORAM or TaoStore rebuild of this process may
/// hold in memory (`blindfold recover --rebuild-memory`, `blindfold grow --rebuild-memory`);
/// values below [`MIN_MEMORY_LIMIT`] are raised to it. What does not fit is set aside,
/// sealed, on the local disk beside the checkpoint.
pub fn set_memory_limit(bytes: u64) {
    MEMORY_LIMIT.store(bytes.max(MIN_MEMORY_LIMIT), Ordering::Relaxed);
}

/// The limit [`set_memory_limit`] set ([`DEFAULT_MEMORY_LIMIT`] unless changed).
pub fn memory_limit() -> u64 {
    MEMORY_LIMIT.load(Ordering::Relaxed)
}

/// The new tree, its leaves drawn before the old array is read.
struct Loading {
    oram: PathOram,
    load: BulkLoad,
}

impl Loading {
    fn start(config: &PathOramConfig) -> Result<Self> {
        let mut oram = PathOram::with_rng(config.clone(), ChaCha20Rng::from_entropy());
        let load = oram.bulk_load()?;
        Ok(Self { oram, load })
    }
}

/// The real blocks found so far: in memory, or (when they might not fit in
/// [`memory_limit`]) set aside on the local disk in parts by their new leaves.
struct Found {
    held: Held,
    /// One bit per block id: found already.
    seen: Vec<u64>,
    /// Blocks found.
    found: u64,
    count: u64,
    block_size: usize,
    z: usize,
}

enum Held {
    Memory(HashMap<u64, Vec<u8>>),
    Aside(Box<Aside>),
}

impl Found {
    /// For the blocks of a tree of `config`, to be loaded into a tree of `target`; parts set
    /// aside go to a directory in `dir`.
    fn new(config: &PathOramConfig, target: &PathOramConfig, dir: &Path) -> Result<Self> {
        let block_size = config.block_size() as usize;
        let most = config.blocks().saturating_mul(block_size as u64);
        let limit = memory_limit();
        let held = if most <= limit {
            Held::Memory(HashMap::new())
        } else {
            Held::Aside(Box::new(Aside::new(dir, most, limit, target.trees()[0].shape.leaves())?))
        };
        Ok(Self {
            held,
            seen: vec![0; config.blocks().div_ceil(64) as usize],
            found: 0,
            count: config.blocks(),
            block_size,
            z: config.z() as usize,
        })
    }

    /// Takes the real blocks of one plaintext bucket (the Path ORAM bucket format).
    fn bucket(&mut self, plain: &[u8], load: &BulkLoad) -> Result<()> {
        let slot = SLOT_HEADER + self.block_size;
        if plain.len() != self.z * slot {
            return Err(OramError::Corrupt(format!(
                "bucket of {} bytes, expected {}",
                plain.len(),
                self.z * slot
            ))
            .into());
        }
        for raw in plain.chunks_exact(slot) {
            let id1 = u64::from_le_bytes(raw[..8].try_into().expect("8 bytes"));
            if id1 != 0 {
                self.block(id1 - 1, raw[SLOT_HEADER..].to_vec(), load)?;
            }
        }
        Ok(())
    }

    fn block(&mut self, id: u64, data: Vec<u8>, load: &BulkLoad) -> Result<()> {
        if id >= self.count || data.len() != self.block_size {
            return Err(OramError::Corrupt(format!("saved block {id} out of range")).into());
        }
        // Path ORAM keeps exactly one copy of every block; two mean the saved state is broken.
        let (word, bit) = ((id / 64) as usize, 1u64 << (id % 64));
        if self.seen[word] & bit != 0 {
            return Err(OramError::Corrupt(format!("block {id} found twice")).into());
        }
        self.seen[word] |= bit;
        self.found += 1;
        match &mut self.held {
            Held::Memory(m) => {
                m.insert(id, data);
            }
            Held::Aside(a) => {
                let leaf = load.data_leaf(id).ok_or_else(|| {
                    ProxyError::State(format!("block {id} has no leaf in the rebuilt tree"))
                })?;
                a.put(leaf, id, &data)?;
            }
        }
        Ok(())
    }

    fn is_found(&self, id: u64) -> bool {
        id < self.count && self.seen[(id / 64) as usize] & (1u64 << (id % 64)) != 0
    }

    /// Blocks that had a leaf (`posmap` entry non-zero) but were not found; every block not
    /// found if the position map is not known.
    fn lost(&self, posmap: Option<&[u32]>) -> Vec<u64> {
        (0..self.count)
            .filter(|&id| !self.is_found(id))
            .filter(|&id| posmap.is_none_or(|p| p[id as usize] != 0))
            .collect()
    }

    /// The contents of block `id` for the new tree (zeros for a block not found), once.
    fn take(&mut self, id: u64) -> Result<Vec<u8>> {
        let zeros = || vec![0u8; self.block_size];
        if !self.is_found(id) {
            return Ok(zeros());
        }
        match &mut self.held {
            Held::Memory(m) => Ok(m.remove(&id).unwrap_or_else(zeros)),
            // Found, so set aside: a block that does not come back was removed from the disk
            // under the rebuild, which must not put zeros in its place.
            Held::Aside(a) => a.take(id)?.map(Ok).unwrap_or_else(|| {
                Err(ProxyError::State(format!(
                    "block {id} was set aside in {} and is no longer there (the files were \
                     altered or removed during the rebuild); nothing was replaced, run it again",
                    a.dir.display()
                )))
            }),
        }
    }

    fn held_peak_bytes(&self) -> u64 {
        match &self.held {
            Held::Memory(_) => self.found * self.block_size as u64,
            Held::Aside(a) => a.peak_blocks * self.block_size as u64,
        }
    }

    fn set_aside_bytes(&self) -> u64 {
        match &self.held {
            Held::Memory(_) => 0,
            Held::Aside(a) => a.written,
        }
    }
}

/// Blocks set aside on the local disk while a rebuild reads the old array, in parts by the
/// leaf the new tree gave them, each part small enough to be read back whole. The bulk load
/// asks for blocks in the order of their leaves, so the parts are read back one after the
/// other; what is left of a part read back (blocks carried up the tree, asked for a little
/// later) stays in memory until asked for.
///
/// Each record is sealed under a key that lives only in this process's memory: the files
/// say nothing to whoever reads the disk, and a rebuild cut short starts over (the files of
/// the one before are removed first).
struct Aside {
    dir: PathBuf,
    parts: u64,
    leaves: u64,
    /// Records not yet appended to each part's file.
    pending: Vec<Vec<u8>>,
    flush_at: usize,
    sealer: StateSealer,
    /// Parts read back so far (in order).
    read_back: u64,
    live: HashMap<u64, Vec<u8>>,
    peak_blocks: u64,
    written: u64,
}

const ASIDE_AAD: &[u8] = b"blindfold rebuild: a block set aside";
const ASIDE_DIR: &str = "rebuild-aside";

impl Aside {
    /// Parts for up to `most` bytes of blocks, each about a third of `limit`, over a tree of
    /// `leaves` leaves; buffers for the parts' records use about a sixth of `limit`.
    fn new(dir: &Path, most: u64, limit: u64, leaves: u64) -> Result<Self> {
        let dir = dir.join(ASIDE_DIR);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(aside_error("removing", &dir, e))
            }
            _ => {}
        }
        std::fs::create_dir_all(&dir).map_err(|e| aside_error("creating", &dir, e))?;
        let parts = most.div_ceil((limit / 3).max(1)).clamp(1, leaves.max(1));
        let flush_at =
            usize::try_from((limit / 6) / parts).unwrap_or(usize::MAX).clamp(4 << 10, 1 << 20);
        Ok(Self {
            dir,
            parts,
            leaves,
            pending: vec![Vec::new(); parts as usize],
            flush_at,
            sealer: StateSealer::new(&MasterKey::generate()),
            read_back: 0,
            live: HashMap::new(),
            peak_blocks: 0,
            written: 0,
        })
    }

    fn part_of(&self, leaf: u32) -> u64 {
        (u128::from(leaf) * u128::from(self.parts) / u128::from(self.leaves.max(1))) as u64
    }

    fn file(&self, part: u64) -> PathBuf {
        self.dir.join(format!("part-{part:05}"))
    }

    fn put(&mut self, leaf: u32, id: u64, data: &[u8]) -> Result<()> {
        let part = self.part_of(leaf).min(self.parts - 1);
        let mut plain = Vec::with_capacity(8 + data.len());
        plain.extend_from_slice(&id.to_le_bytes());
        plain.extend_from_slice(data);
        let sealed = self.sealer.seal(ASIDE_AAD, &plain).map_err(ProxyError::Crypto)?;
        let buf = &mut self.pending[part as usize];
        buf.extend_from_slice(&(sealed.len() as u32).to_le_bytes());
        buf.extend_from_slice(&sealed);
        if buf.len() >= self.flush_at {
            self.flush(part)?;
        }
        Ok(())
    }

    fn flush(&mut self, part: u64) -> Result<()> {
        let buf = std::mem::take(&mut self.pending[part as usize]);
        if buf.is_empty() {
            return Ok(());
        }
        let path = self.file(part);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| aside_error("opening", &path, e))?;
        f.write_all(&buf).map_err(|e| aside_error("writing", &path, e))?;
        self.written += buf.len() as u64;
        Ok(())
    }

    /// Block `id` (which was put here), reading back the next parts until it is in memory.
    fn take(&mut self, id: u64) -> Result<Option<Vec<u8>>> {
        loop {
            if let Some(d) = self.live.remove(&id) {
                return Ok(Some(d));
            }
            if self.read_back == self.parts {
                return Ok(None);
            }
            self.read_part(self.read_back)?;
            self.read_back += 1;
        }
    }

    fn read_part(&mut self, part: u64) -> Result<()> {
        let path = self.file(part);
        let mut bytes = std::mem::take(&mut self.pending[part as usize]);
        if path.exists() {
            let mut on_disk = std::fs::read(&path).map_err(|e| aside_error("reading", &path, e))?;
            on_disk.append(&mut bytes);
            bytes = on_disk;
            std::fs::remove_file(&path).map_err(|e| aside_error("removing", &path, e))?;
        }
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let bad = || ProxyError::State(format!("{} is damaged", path.display()));
            let len = u32::from_le_bytes(rest.get(..4).ok_or_else(bad)?.try_into().expect("4"));
            let sealed = rest.get(4..4 + len as usize).ok_or_else(bad)?;
            let plain = self.sealer.open(ASIDE_AAD, sealed).map_err(|_| bad())?;
            let id = u64::from_le_bytes(plain.get(..8).ok_or_else(bad)?.try_into().expect("8"));
            self.live.insert(id, plain[8..].to_vec());
            rest = &rest[4 + len as usize..];
        }
        self.peak_blocks = self.peak_blocks.max(self.live.len() as u64);
        Ok(())
    }
}

impl Drop for Aside {
    /// A rebuild that failed leaves nothing on the disk either (the next one would remove it
    /// anyway, but an operator may not run one).
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn aside_error(what: &str, path: &Path, e: std::io::Error) -> ProxyError {
    let hint = "the rebuild sets blocks aside there when they do not fit in its memory limit \
                (--rebuild-memory); free space on that disk or raise the limit, and run it again";
    match crate::journal::io(path, what, e) {
        ProxyError::DiskFull(m) => ProxyError::DiskFull(format!("{m}; {hint}")),
        ProxyError::State(m) => ProxyError::State(format!("{m}; {hint}")),
        other => other,
    }
}

/// Bulk-loads the fresh Path ORAM of `loading` with `found` (zeros for every other block),
/// sealing each batch under `sealer` at version 1 and writing it to `new`; flushes `new`.
/// Returns the new trusted state, the versions and the number of cells written.
async fn load_new(
    config: &PathOramConfig,
    loading: &mut Loading,
    found: &mut Found,
    new: &NewArray,
    sealer: &CellSealer,
) -> Result<(PathOramState, VersionTable, u64)> {
    let new = new.store();
    crate::sealing::check_geometry(new.geometry(), crate::SealedPathOram::geometry(config)?)?;
    let Loading { oram, load } = loading;
    let mut versions = VersionTable::new(config.total_cells());
    let mut failed = None;
    let retry = RetryPolicy::default();
    let mut written = 0u64;
    loop {
        // A block set aside that cannot be read back fails the rebuild before its batch is
        // written: nothing goes to the store with zeros in its place.
        let mut data = |b: BlockId| match found.take(b.0) {
            Ok(d) => d,
            Err(e) => {
                failed.get_or_insert(e);
                vec![0u8; config.block_size() as usize]
            }
        };
        let batch = oram.bulk_load_step(load, &mut data, BATCH)?;
        if let Some(e) = failed.take() {
            return Err(e);
        }
        let Some(batch) = batch else { break };
        let sealed = seal_cells(sealer, &mut versions, batch)?;
        written += sealed.len() as u64;
        write_batches(new, retry, sealed).await?;
    }
    with_retry(retry, || new.flush()).await?;
    oram.check_stash()?;
    Ok((oram.export_state()?, versions, written))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks set aside come back in the order of their leaves' parts, once each; a part
    /// whose file was altered on the disk fails the rebuild instead of giving other contents.
    #[test]
    fn blocks_set_aside_come_back_or_fail_loudly() {
        let root = tempfile::tempdir().unwrap();
        let leaves = 64u64;
        let mut a = Aside::new(root.path(), 1 << 20, MIN_MEMORY_LIMIT, leaves).unwrap();
        assert!(a.parts > 4, "{} parts", a.parts);
        let block = |id: u64| vec![id as u8; 4096];
        for id in 0..200u64 {
            a.put((id * 7 % leaves) as u32, id, &block(id)).unwrap();
        }
        for part in 0..a.parts {
            a.flush(part).unwrap();
        }
        assert!(a.written > 200 * 4096);
        let mut ids: Vec<u64> = (0..200).collect();
        ids.sort_by_key(|&id| (id * 7 % leaves, id));
        for id in ids {
            assert_eq!(a.take(id).unwrap(), Some(block(id)), "block {id}");
        }
        assert_eq!(a.take(500).unwrap(), None, "a block never set aside");
        drop(a);

        let mut a = Aside::new(root.path(), 1 << 20, MIN_MEMORY_LIMIT, leaves).unwrap();
        a.put(0, 1, &block(1)).unwrap();
        a.flush(0).unwrap();
        let file = a.file(0);
        let mut bytes = std::fs::read(&file).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&file, bytes).unwrap();
        let err = a.take(1).unwrap_err().to_string();
        assert!(err.contains("is damaged"), "{err}");
        let dir = a.dir.clone();
        drop(a);
        assert!(!dir.exists(), "a rebuild that failed leaves nothing set aside");
    }

    /// A block found and set aside whose record vanished from the disk fails the rebuild; it
    /// is never loaded as zeros. A block never found is zeros.
    #[test]
    fn a_block_set_aside_that_vanished_fails_the_rebuild() {
        let root = tempfile::tempdir().unwrap();
        set_memory_limit(MIN_MEMORY_LIMIT);
        let config = PathOramConfig::builder(4096, 64).build().unwrap();
        let loading = Loading::start(&config).unwrap();
        let mut found = Found::new(&config, &config, root.path()).unwrap();
        assert!(matches!(found.held, Held::Aside(_)), "256 KiB of blocks against 64 KiB");
        for id in 0..64 {
            found.block(id, vec![id as u8; 64], &loading.load).unwrap();
        }
        let Held::Aside(a) = &mut found.held else { unreachable!() };
        for part in 0..a.parts {
            a.flush(part).unwrap();
            let _ = std::fs::remove_file(a.file(part));
        }
        assert_eq!(found.take(100).unwrap(), vec![0; 64], "never found: zeros");
        let err = found.take(3).unwrap_err().to_string();
        assert!(err.contains("is no longer there"), "{err}");
    }
}
