//! An encrypted snapshot of the whole trusted state, kept in the untrusted store, so that a
//! new gateway can be rebuilt from the store and the key alone (`blindfold recover`).
//!
//! The snapshot holds the public parameters, the ORAM checkpoint (position map, stash, cell
//! versions) and the directory. It is written at every clean shutdown, after the ORAM state is
//! committed and checkpointed, so it matches the store exactly at that moment.
//!
//! Layout: a store array named `snapshot` (or `snapshot.<cells>` after the store grew: see
//! [`open`]) of 64 KiB cells in two slots used alternately; the array `snapshot-index` names
//! it. A
//! slot is a header cell followed by chunk cells. Chunks are written first, the header last, so
//! a crash while writing leaves the previous slot intact. Every cell is sealed with the master
//! key under a store id derived for snapshots; chunks are bound to their cell and the
//! snapshot's sequence number (as their version), headers to version 0. The header carries the
//! SHA-256 of the whole body, which reading checks, so the chunks of two snapshots that share a
//! sequence number (written by two diverged timelines, e.g. after two `recover`s from the same
//! snapshot) cannot be spliced into one.
//!
//! # Security
//!
//! Contents and integrity are protected like every cell. *Freshness* is not: with no trusted
//! storage left, `recover` cannot tell the newest snapshot from an older one the store replays;
//! it prints the snapshot's sequence number and time so the operator can judge. If the gateway
//! wrote to the store after the snapshot (it crashed later instead of stopping cleanly),
//! `recover` still restores the snapshot, and `verify` lists the cells written since, which no
//! longer match it — the objects stored in them are lost with the local state.

use std::sync::Arc;

use blindfold_crypto::{CellAd, CellSealer, MasterKey, StoreId};
use blindfold_store::{open_store, CellId, Geometry, Store, StoreUrl};
use serde::{Deserialize, Serialize};

use crate::datadir::GatewayParams;
use crate::directory::{DirectoryDump, DirectoryDumpV5, DirectoryDumpV6};
use crate::{GatewayError, Result};

/// Store array holding the snapshot.
pub const ARRAY: &str = "snapshot";
const CHUNK: usize = 64 * 1024;
/// Version 02: the header carries the SHA-256 of the whole body (01 had none, so chunks of two
/// snapshots with the same sequence number could be spliced; 01 headers are not accepted).
/// Version 03: the parameters carry [`GatewayParams::cache_cells`]. Version 04: and
/// [`GatewayParams::pack_levels`]. Versions 02 and 03 are still read.
/// Version 05: and where the store-side log continues the snapshot
/// ([`Snapshot::journal`], `--durability store`). Version 04 is still read.
/// Version 06: the directory carries noncurrent versions, delete markers and bucket settings
/// ([`DirectoryDump::versions`], [`DirectoryDump::configs`]). Version 05 is still read.
/// Version 07: and named bucket settings such as object lock ([`DirectoryDump::settings`]).
/// Version 06 is still read.
/// Version 08: and a key rotation under way ([`Snapshot::rotation`]). Version 09: and whether
/// the gateway that wrote it let reads go ahead of the store-side log
/// ([`Snapshot::reads_ahead_of_log`]). Version 08 is still read.
const MAGIC: &[u8; 8] = b"BFSNAP09";
const MAGIC_V8: &[u8; 8] = b"BFSNAP08";
const MAGIC_V7: &[u8; 8] = b"BFSNAP07";
const MAGIC_V6: &[u8; 8] = b"BFSNAP06";
const MAGIC_V5: &[u8; 8] = b"BFSNAP05";
const MAGIC_V4: &[u8; 8] = b"BFSNAP04";
const MAGIC_V3: &[u8; 8] = b"BFSNAP03";
const MAGIC_V2: &[u8; 8] = b"BFSNAP02";

/// What a snapshot holds.
#[derive(Serialize, Deserialize)]
pub struct Snapshot {
    /// Sequence number (one more than the previous snapshot's).
    pub seq: u64,
    /// When it was written, nanoseconds since the Unix epoch.
    pub created_ns: i128,
    /// The gateway's public parameters.
    pub params: GatewayParams,
    /// The ORAM checkpoint file, as written by `DurablePathOram::checkpoint`.
    #[serde(with = "serde_bytes")]
    pub oram_checkpoint: Vec<u8>,
    /// The directory.
    pub directory: DirectoryDump,
    /// With `--durability store`: where the store-side log continues this snapshot, and the
    /// engine's redo log to put after `oram_checkpoint` ([`crate::storelog`]). `None` for a
    /// snapshot of a clean stop under `--durability local`.
    pub journal: Option<crate::storelog::JournalPoint>,
    /// A key rotation under way when it was written: the rotation file of the data directory
    /// as it was (the new key and the sweep's progress, sealed under the old key), so that a
    /// recovery from the store alone resumes it ([`crate::rotation`]). `None` otherwise, and in
    /// snapshots of format 07 and before.
    #[serde(with = "serde_bytes")]
    pub rotation: Option<Vec<u8>>,
    /// The gateway that wrote it, and the log after it, let reads go out before the store held
    /// their reveal records (`--reads-ahead-of-log`, or on the word of a standby following
    /// the log, [`crate::feed`]): the log may lack the last ones, so a recovery from the store
    /// alone rebuilds the tree with fresh leaves instead of replaying it, unless the log after
    /// it says that no standby's word counts any more, or the recovery is that standby's own.
    /// False in snapshots of format 08 and before.
    pub reads_ahead_of_log: bool,
}

/// A snapshot of format 08: no word on reads ahead of the log.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct SnapshotV8 {
    seq: u64,
    created_ns: i128,
    params: GatewayParams,
    oram_checkpoint: Vec<u8>,
    directory: DirectoryDump,
    journal: Option<crate::storelog::JournalPoint>,
    rotation: Option<Vec<u8>>,
}

impl From<SnapshotV8> for Snapshot {
    fn from(s: SnapshotV8) -> Self {
        Snapshot {
            seq: s.seq,
            created_ns: s.created_ns,
            params: s.params,
            oram_checkpoint: s.oram_checkpoint,
            directory: s.directory,
            journal: s.journal,
            rotation: s.rotation,
            reads_ahead_of_log: false,
        }
    }
}

/// A snapshot of format 07: no rotation file.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct SnapshotV7 {
    seq: u64,
    created_ns: i128,
    params: GatewayParams,
    oram_checkpoint: Vec<u8>,
    directory: DirectoryDump,
    journal: Option<crate::storelog::JournalPoint>,
}

impl From<SnapshotV7> for Snapshot {
    fn from(s: SnapshotV7) -> Self {
        Snapshot {
            seq: s.seq,
            created_ns: s.created_ns,
            params: s.params,
            oram_checkpoint: s.oram_checkpoint,
            directory: s.directory,
            journal: s.journal,
            rotation: None,
            reads_ahead_of_log: false,
        }
    }
}

/// A snapshot of format 06: its directory has no named settings ([`DirectoryDumpV6`]).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct SnapshotV6 {
    seq: u64,
    created_ns: i128,
    params: GatewayParams,
    oram_checkpoint: Vec<u8>,
    directory: DirectoryDumpV6,
    journal: Option<crate::storelog::JournalPoint>,
}

impl From<SnapshotV6> for Snapshot {
    fn from(s: SnapshotV6) -> Self {
        Snapshot {
            seq: s.seq,
            created_ns: s.created_ns,
            params: s.params,
            oram_checkpoint: s.oram_checkpoint,
            directory: s.directory.into(),
            journal: s.journal,
            rotation: None,
            reads_ahead_of_log: false,
        }
    }
}

/// A snapshot of format 05: its directory has no versions ([`DirectoryDumpV5`]).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct SnapshotV5 {
    seq: u64,
    created_ns: i128,
    params: GatewayParams,
    oram_checkpoint: Vec<u8>,
    directory: DirectoryDumpV5,
    journal: Option<crate::storelog::JournalPoint>,
}

impl From<SnapshotV5> for Snapshot {
    fn from(s: SnapshotV5) -> Self {
        Snapshot {
            seq: s.seq,
            created_ns: s.created_ns,
            params: s.params,
            oram_checkpoint: s.oram_checkpoint,
            directory: s.directory.into(),
            journal: s.journal,
            rotation: None,
            reads_ahead_of_log: false,
        }
    }
}

/// A snapshot of an older format, whose parameters (`P`) lack fields added since.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct OldSnapshot<P> {
    seq: u64,
    created_ns: i128,
    params: P,
    oram_checkpoint: Vec<u8>,
    directory: DirectoryDumpV5,
}

/// The parameters of a version 02 snapshot: without [`GatewayParams::cache_cells`].
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct ParamsV2 {
    format: String,
    version: u32,
    store: String,
    store_id: String,
    block_size: u32,
    blocks: u64,
    z: u32,
    pad_objects: bool,
    cache_levels: u32,
    engine: blindfold_proxy::catalogue::OramEngine,
    generation: u32,
}

/// The parameters of a version 03 snapshot: without [`GatewayParams::pack_levels`].
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct ParamsV3 {
    format: String,
    version: u32,
    store: String,
    store_id: String,
    block_size: u32,
    blocks: u64,
    z: u32,
    pad_objects: bool,
    cache_levels: u32,
    cache_cells: u64,
    engine: blindfold_proxy::catalogue::OramEngine,
    generation: u32,
}

impl From<ParamsV2> for ParamsV3 {
    fn from(p: ParamsV2) -> Self {
        ParamsV3 {
            format: p.format,
            version: p.version,
            store: p.store,
            store_id: p.store_id,
            block_size: p.block_size,
            blocks: p.blocks,
            z: p.z,
            pad_objects: p.pad_objects,
            cache_levels: p.cache_levels,
            cache_cells: 0,
            engine: p.engine,
            generation: p.generation,
        }
    }
}

impl From<ParamsV2> for GatewayParams {
    fn from(p: ParamsV2) -> Self {
        ParamsV3::from(p).into()
    }
}

impl From<ParamsV3> for GatewayParams {
    fn from(p: ParamsV3) -> Self {
        GatewayParams {
            format: p.format,
            version: p.version,
            store: p.store,
            store_id: p.store_id,
            block_size: p.block_size,
            blocks: p.blocks,
            z: p.z,
            pad_objects: p.pad_objects,
            cache_levels: p.cache_levels,
            cache_cells: p.cache_cells,
            pack_levels: 0,
            engine: p.engine,
            generation: p.generation,
        }
    }
}

impl<P: Into<GatewayParams>> From<OldSnapshot<P>> for Snapshot {
    fn from(s: OldSnapshot<P>) -> Self {
        Snapshot {
            seq: s.seq,
            created_ns: s.created_ns,
            params: s.params.into(),
            oram_checkpoint: s.oram_checkpoint,
            directory: s.directory.into(),
            journal: None,
            rotation: None,
            reads_ahead_of_log: false,
        }
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The contents are secret: position map, stash, object names.
        f.debug_struct("Snapshot").field("seq", &self.seq).finish_non_exhaustive()
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    magic: [u8; 8],
    seq: u64,
    created_ns: i128,
    len: u64,
    chunks: u32,
    /// SHA-256 of the whole body (the bincode of [`Snapshot`], before chunking). Chunks are
    /// bound only to their cell and the sequence number, so two snapshots of diverged
    /// timelines with the same sequence number could otherwise be spliced chunk by chunk.
    digest: [u8; 32],
}

fn body_digest(body: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, body);
    d.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// Geometry of the snapshot array for a gateway of `blocks` blocks in `cells` ORAM cells with
/// `cached` bytes of tree top kept in trusted memory: room for two copies of the largest
/// plausible state.
pub fn geometry(blocks: u64, cells: u64, cached: u64) -> Result<Geometry> {
    // Position map and versions, plus up to ~300 bytes of directory per block (one small
    // object per block is the worst case), the cached buckets, plus slack.
    let estimate = (1 << 20) + blocks * 16 + cells * 8 + blocks * 300 + cached;
    let per_slot = 1 + estimate.div_ceil(CHUNK as u64);
    Geometry::new(2 * per_slot, (CHUNK + CellSealer::OVERHEAD) as u32)
        .map_err(|e| GatewayError::Config(e.to_string()))
}

fn sealer(key: &MasterKey) -> CellSealer {
    // A store id of its own keeps snapshot cells from ever being confused with ORAM cells, and
    // depends on nothing but the key, so `recover` needs nothing else.
    let id = *b"blindfold-snap!!";
    // Snapshots seal few cells (megabytes per clean shutdown), far below the random-nonce
    // bound, so one epoch suffices.
    CellSealer::new(key, StoreId(id), 0)
}

/// Store array recording which array holds the snapshots and its geometry (fixed shape, so
/// recovery can read it before knowing anything else).
pub const INDEX: &str = "snapshot-index";
const INDEX_CELL: u32 = 256;
/// Longest array name the index records.
const MAX_NAME: usize = 64;

fn index_geometry() -> Geometry {
    Geometry::new(1, INDEX_CELL + CellSealer::OVERHEAD as u32).expect("fixed geometry")
}

/// The array the snapshots go to: its name in the store, the store, and where it is.
#[derive(Clone, Debug)]
pub struct SnapshotArray {
    /// Array name: [`ARRAY`], or `snapshot.<cells>` once the store has grown past the first
    /// array's size.
    pub name: String,
    /// The array.
    pub store: Arc<dyn Store>,
    /// The store it is in.
    pub(crate) url: StoreUrl,
    /// The array the index names until a snapshot is written here (after a growth), which
    /// nothing needs once it is.
    pub replaces: Option<String>,
}

impl SnapshotArray {
    /// Cells per slot: a header and the chunks.
    pub fn slot_cells(&self) -> u64 {
        self.store.geometry().cell_count() / 2
    }

    /// A larger array, for a snapshot of `needed` cells per slot and half as much again to
    /// grow into, named `snapshot.<cells>`. As after a growth of the store, the index names
    /// it only once a snapshot is in it ([`point_index`]); until then the array the index
    /// names stays. An array opened since and never named is removed here: it holds nothing.
    pub async fn larger(&self, needed: u64) -> Result<SnapshotArray> {
        let per_slot = needed.saturating_add(needed / 2);
        let g = Geometry::new(per_slot.saturating_mul(2), (CHUNK + CellSealer::OVERHEAD) as u32)
            .map_err(|e| GatewayError::Config(e.to_string()))?;
        let name = format!("{ARRAY}.{}", g.cell_count());
        let store = open_store(&self.url, &name, g).await.map_err(store_err)?;
        let replaces = match &self.replaces {
            None => self.name.clone(),
            Some(named) => {
                if let Err(e) = blindfold_store::remove_array(&self.url, &self.name).await {
                    tracing::warn!(error = %e, array = %self.name, "an unused snapshot array was not removed");
                }
                named.clone()
            }
        };
        Ok(SnapshotArray { name, store, url: self.url.clone(), replaces: Some(replaces) })
    }
}

/// Cells one slot needs for `snap`: its header and its chunks.
pub fn slot_cells(snap: &Snapshot) -> Result<u64> {
    let len = bincode::serialized_size(snap).map_err(|e| GatewayError::Corrupt(e.to_string()))?;
    Ok(1 + len.div_ceil(CHUNK as u64))
}

/// The snapshot array a running gateway writes to; `None` when it could not be opened. A
/// growth of the store replaces it with a larger one, and so does a trusted state that
/// outgrows it ([`SnapshotArray::larger`]).
pub type SnapshotSlot = Arc<parking_lot::Mutex<Option<SnapshotArray>>>;

fn store_err(e: blindfold_store::StoreError) -> GatewayError {
    GatewayError::Config(format!("opening the snapshot store: {e}"))
}

/// The index's plaintext: the array's cell count, then its name (empty for [`ARRAY`], which is
/// all that versions before growth wrote).
fn encode_index(count: u64, name: &str) -> Vec<u8> {
    let mut plain = count.to_le_bytes().to_vec();
    if name != ARRAY {
        plain.push(name.len() as u8);
        plain.extend_from_slice(name.as_bytes());
    }
    plain.resize(INDEX_CELL as usize, 0);
    plain
}

fn decode_index(plain: &[u8]) -> Result<(u64, String)> {
    let bad = |why: &str| GatewayError::Corrupt(format!("snapshot index: {why}"));
    if plain.len() < 9 {
        return Err(bad("too short"));
    }
    let count = u64::from_le_bytes(plain[..8].try_into().expect("8 bytes"));
    let len = plain[8] as usize;
    if len == 0 {
        return Ok((count, ARRAY.to_owned()));
    }
    let name = plain
        .get(9..9 + len)
        .filter(|_| len <= MAX_NAME)
        .and_then(|b| std::str::from_utf8(b).ok())
        .ok_or_else(|| bad("bad array name"))?;
    let well_formed = name
        .strip_prefix("snapshot.")
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !well_formed {
        return Err(bad("bad array name"));
    }
    Ok((count, name.to_owned()))
}

/// Reads the index under `key`: `None` if there is none or it does not open under `key`.
async fn read_index(index: &dyn Store, key: &MasterKey) -> Result<Option<(u64, String)>> {
    let mut cell = index.read(&[CellId(0)]).await.map_err(store_err)?.pop().unwrap_or_default();
    match sealer(key).open_in_place(&CellAd { cell: 0, version: 1, segment: 0 }, &mut cell) {
        Ok(plain) => decode_index(plain).map(Some),
        Err(_) => Ok(None),
    }
}

/// Whether the store at `url` already has a snapshot index written (by any gateway, under any
/// key): `Some(true)` if it opens under `key`, `Some(false)` if it holds something else, `None`
/// if there is none. A new gateway over such a store would overwrite the arrays it names.
pub async fn existing_index(url: &StoreUrl, key: &MasterKey) -> Result<Option<bool>> {
    let index = open_store(url, INDEX, index_geometry()).await.map_err(store_err)?;
    let cell = index.read(&[CellId(0)]).await.map_err(store_err)?.pop().unwrap_or_default();
    if cell.iter().all(|&b| b == 0) {
        return Ok(None);
    }
    Ok(Some(read_index(&*index, key).await?.is_some()))
}

async fn write_index(index: &dyn Store, key: &MasterKey, count: u64, name: &str) -> Result<()> {
    let sealed = sealer(key)
        .seal(&CellAd { cell: 0, version: 1, segment: 0 }, &encode_index(count, name))
        .map_err(|e| GatewayError::Corrupt(e.to_string()))?;
    index.write(vec![(CellId(0), sealed)]).await.map_err(store_err)?;
    index.flush().await.map_err(store_err)
}

/// Opens (creating if needed) the snapshot array of a gateway of `blocks` blocks in `cells`
/// ORAM cells with `cached` bytes of tree top in trusted memory. `keys` are the keys the index
/// may be sealed under (the current one first; during a key rotation also the old one).
///
/// The index keeps naming the array that holds the newest snapshot: when the gateway has
/// grown and needs a larger array, the new one is opened here but named in the index only
/// once a snapshot is in it ([`point_index`]), so `recover` never finds an empty array.
pub async fn open(
    url: &StoreUrl,
    keys: &[&MasterKey],
    blocks: u64,
    cells: u64,
    cached: u64,
) -> Result<SnapshotArray> {
    let g = geometry(blocks, cells, cached)?;
    let key = keys.first().ok_or_else(|| GatewayError::Config("no key".into()))?;
    let index = open_store(url, INDEX, index_geometry()).await.map_err(store_err)?;
    let mut found = None;
    for k in keys {
        found = read_index(&*index, k).await?;
        if found.is_some() {
            break;
        }
    }
    let (name, g, replaces) = match found {
        // A larger array than this gateway needs is as good (a trusted state outgrew the
        // estimate once: see [`SnapshotArray::larger`]).
        Some((count, name)) if count >= g.cell_count() => {
            // Re-sealed under the current key, which `recover` will use.
            write_index(&*index, key, count, &name).await?;
            let g = Geometry::new(count, g.cell_size())
                .map_err(|e| GatewayError::Config(e.to_string()))?;
            (name, g, None)
        }
        Some((_, old)) => (format!("{ARRAY}.{}", g.cell_count()), g, Some(old)),
        None => {
            write_index(&*index, key, g.cell_count(), ARRAY).await?;
            (ARRAY.to_owned(), g, None)
        }
    };
    let store = open_store(url, &name, g).await.map_err(store_err)?;
    Ok(SnapshotArray { name, store, url: url.clone(), replaces })
}

/// Names `array` in the index (under `key`) as the one holding the newest snapshot. Named,
/// it replaces nothing any more: the array in `slot` of that name loses its `replaces`, so that
/// a later growth keeps it until the next array holds a snapshot (see
/// [`SnapshotArray::larger`]).
pub async fn point_index(
    slot: &SnapshotSlot,
    array: &SnapshotArray,
    key: &MasterKey,
) -> Result<()> {
    let index = open_store(&array.url, INDEX, index_geometry()).await.map_err(store_err)?;
    write_index(&*index, key, array.store.geometry().cell_count(), &array.name).await?;
    if let Some(current) = slot.lock().as_mut().filter(|a| a.name == array.name) {
        current.replaces = None;
    }
    Ok(())
}

/// Opens the snapshot array of an existing store for recovery, learning its name and size
/// from the index.
pub async fn open_for_recovery(url: &StoreUrl, key: &MasterKey) -> Result<Arc<dyn Store>> {
    let index = open_store(url, INDEX, index_geometry()).await.map_err(store_err)?;
    let (count, name) = read_index(&*index, key).await?.ok_or_else(|| {
        GatewayError::Config(
            "no snapshot index in this store, or it was sealed with another key".into(),
        )
    })?;
    let g = Geometry::new(count, (CHUNK + CellSealer::OVERHEAD) as u32)
        .map_err(|e| GatewayError::Corrupt(e.to_string()))?;
    open_store(url, &name, g).await.map_err(store_err)
}

async fn read_header(store: &dyn Store, sealer: &CellSealer, slot_base: u64) -> Option<Header> {
    let mut cell = store.read(&[CellId(slot_base)]).await.ok()?.pop()?;
    let plain = sealer
        .open_in_place(&CellAd { cell: slot_base, version: 0, segment: 0 }, &mut cell)
        .ok()?;
    let h: Header = bincode::deserialize(plain).ok()?;
    [MAGIC, MAGIC_V8, MAGIC_V7, MAGIC_V6, MAGIC_V5, MAGIC_V4, MAGIC_V3, MAGIC_V2]
        .contains(&&h.magic)
        .then_some(h)
}

/// Writes `snap` into the slot its sequence number selects.
pub async fn write(store: &dyn Store, key: &MasterKey, snap: &Snapshot) -> Result<()> {
    let body = bincode::serialize(snap).map_err(|e| GatewayError::Corrupt(e.to_string()))?;
    write_body(store, key, MAGIC, snap.seq, snap.created_ns, &body).await
}

/// Writes an encoded snapshot `body` of format `magic`.
async fn write_body(
    store: &dyn Store,
    key: &MasterKey,
    magic: &[u8; 8],
    seq: u64,
    created_ns: i128,
    body: &[u8],
) -> Result<()> {
    let sealer = sealer(key);
    let per_slot = store.geometry().cell_count() / 2;
    let chunks = body.len().div_ceil(CHUNK) as u64;
    if chunks + 1 > per_slot {
        return Err(GatewayError::Config(format!(
            "the trusted state ({} bytes) no longer fits the snapshot area; snapshot skipped",
            body.len()
        )));
    }
    let base = (seq % 2) * per_slot;
    let mut batch = Vec::new();
    for (i, chunk) in body.chunks(CHUNK).enumerate() {
        let cell = base + 1 + i as u64;
        let mut plain = chunk.to_vec();
        plain.resize(CHUNK, 0);
        let sealed = sealer
            .seal(&CellAd { cell, version: seq, segment: 0 }, &plain)
            .map_err(|e| GatewayError::Corrupt(e.to_string()))?;
        batch.push((CellId(cell), sealed));
        if batch.len() == 64 {
            store
                .write(std::mem::take(&mut batch))
                .await
                .map_err(|e| GatewayError::Config(e.to_string()))?;
        }
    }
    if !batch.is_empty() {
        store.write(batch).await.map_err(|e| GatewayError::Config(e.to_string()))?;
    }
    store.flush().await.map_err(|e| GatewayError::Config(e.to_string()))?;
    let header = Header {
        magic: *magic,
        seq,
        created_ns,
        len: body.len() as u64,
        chunks: chunks as u32,
        digest: body_digest(body),
    };
    let mut plain = bincode::serialize(&header).expect("header");
    plain.resize(CHUNK, 0);
    let sealed = sealer
        .seal(&CellAd { cell: base, version: 0, segment: 0 }, &plain)
        .map_err(|e| GatewayError::Corrupt(e.to_string()))?;
    store
        .write(vec![(CellId(base), sealed)])
        .await
        .map_err(|e| GatewayError::Config(e.to_string()))?;
    store.flush().await.map_err(|e| GatewayError::Config(e.to_string()))?;
    Ok(())
}

/// The version that [`clear`] binds its cells to: no snapshot has it (headers are bound to 0,
/// chunks to their snapshot's sequence number, which counts up from 1).
const CLEARED: u64 = u64::MAX;

/// Overwrites every cell of the snapshot array `store`, both slots, in cell order, with zeros
/// sealed under `key` and bound to no snapshot, then flushes: afterwards no snapshot opens
/// under any key (the end of a key rotation: what an older key sealed is gone). What the
/// store sees depends only on the array's size.
pub async fn clear(store: &dyn Store, key: &MasterKey) -> Result<()> {
    clear_cells(store, key, 0..store.geometry().cell_count()).await
}

/// As [`clear`], for the cells of one slot (`slot` 0 or 1) only: the other keeps its snapshot.
pub async fn clear_slot(store: &dyn Store, key: &MasterKey, slot: u64) -> Result<()> {
    let per_slot = store.geometry().cell_count() / 2;
    clear_cells(store, key, slot * per_slot..(slot + 1) * per_slot).await
}

async fn clear_cells(
    store: &dyn Store,
    key: &MasterKey,
    cells: std::ops::Range<u64>,
) -> Result<()> {
    let sealer = sealer(key);
    let zeros = vec![0u8; CHUNK];
    let (mut at, cells) = (cells.start, cells.end);
    while at < cells {
        let end = (at + 64).min(cells);
        let batch = (at..end)
            .map(|cell| {
                let sealed = sealer
                    .seal(&CellAd { cell, version: CLEARED, segment: 0 }, &zeros)
                    .map_err(|e| GatewayError::Corrupt(e.to_string()))?;
                Ok((CellId(cell), sealed))
            })
            .collect::<Result<Vec<_>>>()?;
        store.write(batch).await.map_err(|e| GatewayError::Config(e.to_string()))?;
        at = end;
    }
    store.flush().await.map_err(|e| GatewayError::Config(e.to_string()))
}

/// The sequence number of the newest readable snapshot, if any.
pub async fn latest_seq(store: &dyn Store, key: &MasterKey) -> Option<u64> {
    let sealer = sealer(key);
    let per_slot = store.geometry().cell_count() / 2;
    let a = read_header(store, &sealer, 0).await.map(|h| h.seq);
    let b = read_header(store, &sealer, per_slot).await.map(|h| h.seq);
    a.max(b)
}

/// Reads the newest snapshot whose every chunk authenticates.
pub async fn read_latest(store: &dyn Store, key: &MasterKey) -> Result<Snapshot> {
    let sealer = sealer(key);
    let per_slot = store.geometry().cell_count() / 2;
    let mut headers = Vec::new();
    for base in [0, per_slot] {
        if let Some(h) = read_header(store, &sealer, base).await {
            headers.push((base, h));
        }
    }
    headers.sort_by_key(|(_, h)| std::cmp::Reverse(h.seq));
    let mut last_err = String::from("no snapshot found (was the gateway ever stopped cleanly?)");
    for (base, h) in headers {
        let cells: Vec<CellId> = (0..u64::from(h.chunks)).map(|i| CellId(base + 1 + i)).collect();
        let mut body = Vec::with_capacity(h.len as usize);
        let mut ok = true;
        for group in cells.chunks(64) {
            let fetched = match store.read(group).await {
                Ok(f) => f,
                Err(e) => {
                    last_err = e.to_string();
                    ok = false;
                    break;
                }
            };
            for (cell, mut buf) in group.iter().zip(fetched) {
                match sealer
                    .open_in_place(&CellAd { cell: cell.0, version: h.seq, segment: 0 }, &mut buf)
                {
                    Ok(p) => body.extend_from_slice(p),
                    Err(e) => {
                        last_err = format!("snapshot {} is damaged: {e}", h.seq);
                        ok = false;
                        break;
                    }
                }
            }
            if !ok {
                break;
            }
        }
        if !ok {
            continue;
        }
        body.truncate(h.len as usize);
        // Not secret (the body is authenticated already, chunk by chunk): a plain compare.
        if body.len() as u64 != h.len || body_digest(&body) != h.digest {
            last_err = format!(
                "snapshot {} is damaged: its chunks do not match its header's digest \
                 (chunks of another snapshot spliced in?)",
                h.seq
            );
            continue;
        }
        let decoded = if &h.magic == MAGIC_V2 {
            bincode::deserialize::<OldSnapshot<ParamsV2>>(&body).map(Snapshot::from)
        } else if &h.magic == MAGIC_V3 {
            bincode::deserialize::<OldSnapshot<ParamsV3>>(&body).map(Snapshot::from)
        } else if &h.magic == MAGIC_V4 {
            bincode::deserialize::<OldSnapshot<GatewayParams>>(&body).map(Snapshot::from)
        } else if &h.magic == MAGIC_V5 {
            bincode::deserialize::<SnapshotV5>(&body).map(Snapshot::from)
        } else if &h.magic == MAGIC_V6 {
            bincode::deserialize::<SnapshotV6>(&body).map(Snapshot::from)
        } else if &h.magic == MAGIC_V7 {
            bincode::deserialize::<SnapshotV7>(&body).map(Snapshot::from)
        } else if &h.magic == MAGIC_V8 {
            bincode::deserialize::<SnapshotV8>(&body).map(Snapshot::from)
        } else {
            bincode::deserialize::<Snapshot>(&body)
        };
        match decoded {
            Ok(s) => return Ok(s),
            Err(e) => last_err = format!("snapshot {} cannot be decoded: {e}", h.seq),
        }
    }
    Err(GatewayError::Config(last_err))
}

/// Writes a snapshot of the data directory `dir` (parameters and checkpoint as on disk, the
/// directory of `objects`) to the array in `slot`, numbered after both the newest one there
/// and `min_seq`; then names that array in the snapshot index. Returns its number and the
/// arrays a growth left behind that this snapshot made unneeded and that were removed.
pub(crate) async fn write_snapshot_to(
    slot: &crate::snapshot::SnapshotSlot,
    key: &MasterKey,
    previous: Option<&MasterKey>,
    dir: &std::path::Path,
    objects: &crate::objects::ObjectLayer,
    min_seq: u64,
) -> Result<(u64, Vec<String>)> {
    let Some(array) = slot.lock().clone() else {
        return Err(GatewayError::Config(
            "the snapshot area could not be opened at start; no snapshot written".into(),
        ));
    };
    let mut latest = crate::snapshot::latest_seq(&*array.store, key).await;
    if let (None, Some(old)) = (latest, previous) {
        // In a key rotation the newest snapshot may still be under the old key.
        latest = crate::snapshot::latest_seq(&*array.store, old).await;
    }
    let seq = latest.unwrap_or(0).max(min_seq) + 1;
    let ckpt_path = dir.join("oram").join("checkpoint.bin");
    let oram_checkpoint = std::fs::read(&ckpt_path)
        .map_err(|e| GatewayError::Config(format!("reading {}: {e}", ckpt_path.display())))?;
    let params = crate::datadir::read_params(dir)?
        .ok_or_else(|| GatewayError::Config(format!("{}: no gateway.json", dir.display())))?;
    let snap = crate::snapshot::Snapshot {
        seq,
        created_ns: crate::directory::now_ns(),
        params,
        oram_checkpoint,
        directory: objects.directory().dump()?,
        journal: None,
        rotation: None,
        reads_ahead_of_log: false,
    };
    put_snapshot(slot, array, key, dir, snap).await
}

/// Writes a store checkpoint of the store-side log `log` (see [`crate::storelog`]): the
/// engine's checkpoint and log as the log last heard of them, the directory and the log's
/// position, all captured at one entry, and the parameters in `dir`'s gateway.json (`fallback`
/// while a new data directory has none yet: a growth changes them); then lets the log reuse
/// the cells it covers. Waits for a growth under way to end (it holds the log's checkpoint lock
/// while the engine and gateway.json change).
pub(crate) async fn write_journal_snapshot(
    slot: &crate::snapshot::SnapshotSlot,
    key: &MasterKey,
    dir: &std::path::Path,
    objects: &crate::objects::ObjectLayer,
    log: &crate::storelog::StoreLog,
    fallback: &GatewayParams,
) -> Result<u64> {
    let held = log.checkpoints().await;
    Ok(write_journal_snapshot_held(slot, key, dir, objects, log, fallback, &held, true).await?.0)
}

/// [`write_journal_snapshot`] for a caller already holding the log's checkpoint lock; also
/// returns the arrays a growth retired that were removed since this checkpoint no longer needs
/// them. `carry_rotation`: a key rotation under way goes along (false once its sweep is done:
/// nothing needs the old key any more).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn write_journal_snapshot_held(
    slot: &crate::snapshot::SnapshotSlot,
    key: &MasterKey,
    dir: &std::path::Path,
    objects: &crate::objects::ObjectLayer,
    log: &crate::storelog::StoreLog,
    fallback: &GatewayParams,
    _held: &tokio::sync::MutexGuard<'_, ()>,
    carry_rotation: bool,
) -> Result<(u64, Vec<String>)> {
    let Some(array) = slot.lock().clone() else {
        return Err(GatewayError::Config(
            "the snapshot area could not be opened at start; no store checkpoint written".into(),
        ));
    };
    let started = std::time::Instant::now();
    let params = crate::datadir::read_params(dir)?.unwrap_or_else(|| fallback.clone());
    let ((next_entry, oram_checkpoint, redo_log, standby_on), directory) =
        objects.directory().dump_with(|| log.capture())?;
    let oram_checkpoint = Arc::unwrap_or_clone(oram_checkpoint);
    let sizes = (oram_checkpoint.len(), redo_log.len());
    let point = log.point(next_entry, redo_log).await?;
    // A rotation under way goes along, so that a recovery from the store resumes it.
    let rotation_file = dir.join(crate::datadir::ROTATION_FILE);
    let rotation = match std::fs::read(&rotation_file) {
        Ok(_) if !carry_rotation => None,
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(GatewayError::Config(format!("reading {}: {e}", rotation_file.display())))
        }
    };
    let seq = crate::snapshot::latest_seq(&*array.store, key).await.unwrap_or(0) + 1;
    // A checkpoint written after the lease lapsed (a pause) could stand in for a successor's.
    log.gate().pass().await.map_err(|e| GatewayError::Config(e.to_string()))?;
    let snap = crate::snapshot::Snapshot {
        seq,
        created_ns: crate::directory::now_ns(),
        params,
        oram_checkpoint,
        directory,
        journal: Some(point.clone()),
        rotation,
        // Reads go ahead of the log's store copy under --reads-ahead-of-log, and on a
        // standby's word while one follows the log ([`crate::feed`]).
        reads_ahead_of_log: log.reads_ahead() || standby_on,
    };
    let (seq, removed) = put_snapshot(slot, array, key, dir, snap).await?;
    log.checkpoint_written(&point).await;
    tracing::debug!(
        seq,
        engine_checkpoint_bytes = sizes.0,
        engine_records_bytes = sizes.1,
        ms = started.elapsed().as_secs_f64() * 1e3,
        "store checkpoint of the log written"
    );
    Ok((seq, removed))
}

/// Writes `snap` to the snapshot area `array` (a larger one if it outgrew it) and names it in
/// the index; removes the arrays a growth retired that it no longer needs.
async fn put_snapshot(
    slot: &crate::snapshot::SnapshotSlot,
    mut array: SnapshotArray,
    key: &MasterKey,
    dir: &std::path::Path,
    snap: Snapshot,
) -> Result<(u64, Vec<String>)> {
    let seq = snap.seq;
    // The area is sized at start from an estimate; a trusted state that holds blocks (an
    // eviction cache, a stash of large blocks) can outgrow it.
    let needed = crate::snapshot::slot_cells(&snap)?;
    if needed > array.slot_cells() {
        let larger = array.larger(needed).await?;
        tracing::info!(
            from = %array.name,
            to = %larger.name,
            "the trusted state outgrew the snapshot area; writing the snapshot to a larger one"
        );
        *slot.lock() = Some(larger.clone());
        array = larger;
    }
    crate::snapshot::write(&*array.store, key, &snap).await?;
    crate::snapshot::point_index(slot, &array, key).await?;
    if snap.journal.is_some() {
        tracing::debug!(seq, array = %array.name, "wrote a store checkpoint of the trusted state");
    } else {
        tracing::info!(seq, array = %array.name, "wrote the encrypted snapshot of the trusted state to the store");
    }
    // The newest snapshot names only the arrays in use now: what growths retired can go.
    let in_use =
        [blindfold_proxy::catalogue::oram_array(snap.params.generation), array.name.clone()];
    let removed =
        crate::datadir::remove_retired(dir, &array.url, array.replaces.as_deref(), &in_use).await;
    Ok((seq, removed))
}

#[cfg(test)]
mod tests {
    use blindfold_store::MemoryStore;

    use super::*;
    use blindfold_proxy::catalogue::OramEngine;

    fn snap(seq: u64, fill: u8) -> Snapshot {
        Snapshot {
            seq,
            created_ns: 1,
            params: GatewayParams {
                format: "blindfold-gateway".into(),
                version: 1,
                store: "mem".into(),
                store_id: "00".repeat(16),
                block_size: 1024,
                blocks: 100,
                z: 4,
                pad_objects: false,
                cache_levels: 0,
                cache_cells: 0,
                pack_levels: 0,
                engine: OramEngine::Tao,
                generation: 0,
            },
            // Several chunks, all inside one byte string, so that a spliced body still decodes.
            oram_checkpoint: vec![fill; 4 * CHUNK],
            directory: DirectoryDump::default(),
            journal: None,
            rotation: None,
            reads_ahead_of_log: false,
        }
    }

    /// [`Snapshot`] and its [`crate::storelog::JournalPoint`] as they were encoded before
    /// their byte strings were encoded whole.
    #[derive(Serialize, Deserialize)]
    struct ByteByByte {
        seq: u64,
        created_ns: i128,
        params: GatewayParams,
        oram_checkpoint: Vec<u8>,
        directory: DirectoryDump,
        journal: Option<PointByteByByte>,
        rotation: Option<Vec<u8>>,
        reads_ahead_of_log: bool,
    }

    #[derive(Serialize, Deserialize)]
    struct PointByteByByte {
        read_from: u64,
        chain: [u8; 32],
        next_entry: u64,
        cells: u64,
        generation: u64,
        redo_log: Vec<u8>,
    }

    /// Snapshots written before byte strings were encoded whole read as they did: the bytes
    /// are the same either way.
    #[test]
    fn a_snapshot_encodes_the_same_bytes_as_when_encoded_byte_by_byte() {
        let point = crate::storelog::JournalPoint {
            read_from: 5,
            chain: [3; 32],
            next_entry: 8,
            cells: 2048,
            generation: 2,
            redo_log: vec![0x5A; 9_000],
        };
        let new = Snapshot {
            journal: Some(point.clone()),
            rotation: Some(vec![1, 2, 3]),
            ..snap(4, 0xC3)
        };
        let s = snap(4, 0xC3);
        let old = ByteByByte {
            seq: s.seq,
            created_ns: s.created_ns,
            params: s.params,
            oram_checkpoint: s.oram_checkpoint,
            directory: s.directory,
            journal: Some(PointByteByByte {
                read_from: point.read_from,
                chain: point.chain,
                next_entry: point.next_entry,
                cells: point.cells,
                generation: point.generation,
                redo_log: point.redo_log.clone(),
            }),
            rotation: Some(vec![1, 2, 3]),
            reads_ahead_of_log: false,
        };
        let old_bytes = bincode::serialize(&old).unwrap();
        assert_eq!(bincode::serialize(&new).unwrap(), old_bytes);
        let back: Snapshot = bincode::deserialize(&old_bytes).unwrap();
        assert_eq!(back.oram_checkpoint, vec![0xC3; 4 * CHUNK]);
        assert_eq!(back.journal, Some(point));
        assert_eq!(back.rotation, Some(vec![1, 2, 3]));
    }

    /// A snapshot of about `bytes` bytes of engine state.
    fn sized(seq: u64, bytes: usize) -> Snapshot {
        Snapshot { oram_checkpoint: vec![seq as u8; bytes], ..snap(seq, 0) }
    }

    /// The trusted state outgrows its area twice: the array the first growth moved to holds
    /// the newest snapshot and the index names it, so the second growth must leave it in place
    /// until the next array holds a snapshot (a crash in between recovers from it). It once
    /// removed it, taking it for an array never written.
    #[tokio::test]
    async fn a_second_growth_of_the_area_keeps_the_array_the_index_names() {
        let root = tempfile::tempdir().unwrap();
        let url = StoreUrl::parse(&format!("file://{}", root.path().display())).unwrap();
        let key = MasterKey::generate();
        let dir = root.path().join("data");
        std::fs::create_dir_all(&dir).unwrap();
        // The array the index names, and whether its cells are still in the store.
        let named = || async {
            let index = open_store(&url, INDEX, index_geometry()).await.unwrap();
            let (_, name) = read_index(&*index, &key).await.unwrap().unwrap();
            let kept = root.path().join(format!("{name}.cells")).exists();
            (name, kept)
        };
        let array = open(&url, &[&key], 100, 1000, 0).await.unwrap();
        let slot: SnapshotSlot = Arc::new(parking_lot::Mutex::new(Some(array.clone())));
        let first = array.slot_cells() as usize * CHUNK;
        put_snapshot(&slot, array, &key, &dir, sized(1, first)).await.unwrap();
        let grown = slot.lock().clone().unwrap();
        assert_ne!(grown.name, ARRAY, "the first snapshot did not outgrow the area");
        // Written and named: what recovery reads from now on.
        assert_eq!(named().await, (grown.name.clone(), true));
        assert_eq!(read_latest(&*grown.store, &key).await.unwrap().seq, 1);
        // The second growth opens a larger array; until a snapshot is in it, a crash must
        // still find the first growth's array whole.
        let slot_array = slot.lock().clone().unwrap();
        let second = slot_array.larger(grown.slot_cells() * 2).await.unwrap();
        assert_ne!(second.name, grown.name);
        assert_eq!(
            named().await,
            (grown.name.clone(), true),
            "the second growth removed the array the index names, with the newest snapshot"
        );
        drop(second);
        // Once a larger array holds a snapshot, the index names it and the first growth's
        // array goes.
        let seq = 2;
        put_snapshot(&slot, slot_array, &key, &dir, sized(seq, first * 3)).await.unwrap();
        let last = slot.lock().clone().unwrap();
        assert_ne!(last.name, grown.name);
        assert_eq!(named().await, (last.name.clone(), true));
        assert_eq!(read_latest(&*last.store, &key).await.unwrap().seq, seq);
        assert!(!root.path().join(format!("{}.cells", grown.name)).exists());
    }

    /// The parameters of [`snap`] as a version 02 snapshot held them.
    fn params_v2(cache_levels: u32, generation: u32) -> ParamsV2 {
        let p = snap(0, 0).params;
        ParamsV2 {
            format: p.format,
            version: p.version,
            store: p.store,
            store_id: p.store_id,
            block_size: p.block_size,
            blocks: p.blocks,
            z: p.z,
            pad_objects: p.pad_objects,
            cache_levels,
            engine: p.engine,
            generation,
        }
    }

    /// An old-format snapshot whose checkpoint is 100 bytes of `fill`.
    fn old_snapshot<P>(seq: u64, params: P, fill: u8) -> OldSnapshot<P> {
        OldSnapshot {
            seq,
            created_ns: 9,
            params,
            oram_checkpoint: vec![fill; 100],
            directory: DirectoryDumpV5::default(),
        }
    }

    /// A format 05 snapshot (before versioning) still reads, with no versions; a format 06
    /// one carries noncurrent versions, delete markers and bucket settings; 07 also named
    /// settings.
    #[tokio::test]
    async fn a_version_5_snapshot_still_reads_and_06_carries_versions() {
        use crate::directory::{BucketConfig, ObjectMeta, Version, Versioning};
        let key = MasterKey::generate();
        let store = MemoryStore::new(geometry(100, 1000, 0).unwrap());
        let s = snap(3, 0x33);
        let old = SnapshotV5 {
            seq: 3,
            created_ns: 1,
            params: s.params,
            oram_checkpoint: vec![0x33; 10],
            directory: DirectoryDumpV5 { next: 17, free: vec![2, 5], ..Default::default() },
            journal: None,
        };
        write_body(&store, &key, MAGIC_V5, 3, 1, &bincode::serialize(&old).unwrap()).await.unwrap();
        let got = read_latest(&store, &key).await.unwrap();
        assert_eq!((got.seq, got.directory.next, got.directory.free), (3, 17, vec![2, 5]));
        assert!(got.directory.versions.is_empty() && got.directory.configs.is_empty());
        let mut new = snap(4, 0x44);
        let marker = Version { version_id: "m".into(), modified_ns: 5, object: None };
        let old_version = Version {
            version_id: "v1".into(),
            modified_ns: 4,
            object: Some(ObjectMeta { size: 3, ..Default::default() }),
        };
        new.directory.versions = vec![
            ("b".into(), "k".into(), u64::MAX - 2, marker),
            ("b".into(), "k".into(), u64::MAX - 1, old_version),
        ];
        let config = BucketConfig { versioning: Versioning::Enabled, tags: Some("a=b".into()) };
        new.directory.configs = vec![("b".into(), config)];
        // As format 06 wrote it: no named settings.
        let v6 = SnapshotV6 {
            seq: 4,
            created_ns: new.created_ns,
            params: new.params.clone(),
            oram_checkpoint: new.oram_checkpoint.clone(),
            directory: crate::directory::DirectoryDumpV6 {
                versions: new.directory.versions.clone(),
                configs: new.directory.configs.clone(),
                ..Default::default()
            },
            journal: None,
        };
        write_body(&store, &key, MAGIC_V6, 4, 1, &bincode::serialize(&v6).unwrap()).await.unwrap();
        let got = read_latest(&store, &key).await.unwrap();
        assert_eq!(got.seq, 4);
        assert_eq!(got.directory.versions, new.directory.versions);
        assert_eq!(got.directory.configs, new.directory.configs);
        assert!(got.directory.settings.is_empty());
        // Format 07 carries named settings (object lock) too.
        new.seq = 5;
        new.directory.settings = vec![("b".into(), "object-lock".into(), "{}".into())];
        let v7 = SnapshotV7 {
            seq: 5,
            created_ns: new.created_ns,
            params: new.params.clone(),
            oram_checkpoint: new.oram_checkpoint.clone(),
            directory: new.directory.clone(),
            journal: None,
        };
        write_body(&store, &key, MAGIC_V7, 5, 1, &bincode::serialize(&v7).unwrap()).await.unwrap();
        let got = read_latest(&store, &key).await.unwrap();
        assert_eq!(got.seq, 5);
        assert_eq!(got.directory.versions, new.directory.versions);
        assert_eq!(got.directory.settings, new.directory.settings);
        assert!(got.rotation.is_none());
        // Format 08 carries a rotation under way.
        let v8 = SnapshotV8 {
            seq: 6,
            created_ns: new.created_ns,
            params: new.params.clone(),
            oram_checkpoint: new.oram_checkpoint.clone(),
            directory: new.directory.clone(),
            journal: None,
            rotation: Some(vec![1, 2, 3]),
        };
        write_body(&store, &key, MAGIC_V8, 6, 0, &bincode::serialize(&v8).unwrap()).await.unwrap();
        let got = read_latest(&store, &key).await.unwrap();
        assert_eq!(
            (got.seq, got.rotation, got.reads_ahead_of_log),
            (6, Some(vec![1, 2, 3]), false)
        );
        // Format 09 says whether reads went ahead of the store-side log.
        new.seq = 7;
        new.reads_ahead_of_log = true;
        write(&store, &key, &new).await.unwrap();
        let got = read_latest(&store, &key).await.unwrap();
        assert_eq!((got.seq, got.reads_ahead_of_log), (7, true));
    }

    /// A snapshot written before the parameters carried `cache_cells` (format 02) still reads,
    /// and a newer one (03) beside it wins by its sequence number.
    #[tokio::test]
    async fn a_version_2_snapshot_still_reads() {
        let key = MasterKey::generate();
        let g = geometry(100, 1000, 0).unwrap();
        let store = MemoryStore::new(g);
        let old = old_snapshot(4, params_v2(3, 2), 0x44);
        let body = bincode::serialize(&old).unwrap();
        write_body(&store, &key, MAGIC_V2, 4, 9, &body).await.unwrap();
        let got = read_latest(&store, &key).await.unwrap();
        assert_eq!((got.seq, got.params.cache_levels, got.params.cache_cells), (4, 3, 0));
        assert_eq!((got.params.generation, got.oram_checkpoint), (2, vec![0x44; 100]));
        let mut new = snap(5, 0x55);
        new.params.cache_cells = 12;
        write(&store, &key, &new).await.unwrap();
        let got = read_latest(&store, &key).await.unwrap();
        assert_eq!((got.seq, got.params.cache_cells), (5, 12));
        // Format 03 (with `cache_cells`, before packing) reads as one bucket per object.
        let v3 = old_snapshot(6, ParamsV3 { cache_cells: 9, ..params_v2(3, 1).into() }, 0x66);
        write_body(&store, &key, MAGIC_V3, 6, 9, &bincode::serialize(&v3).unwrap()).await.unwrap();
        let got = read_latest(&store, &key).await.unwrap();
        assert_eq!((got.seq, got.params.cache_cells, got.params.pack_levels), (6, 9, 0));
        assert_eq!(got.params.tao_pack_levels(), 1);
        let mut new = snap(7, 0x77);
        new.params.pack_levels = 2;
        write(&store, &key, &new).await.unwrap();
        let got = read_latest(&store, &key).await.unwrap();
        assert_eq!((got.seq, got.params.pack_levels), (7, 2));
    }

    /// Two timelines diverged from one snapshot (e.g. two `recover`s) each write a snapshot
    /// with the same sequence number into the same slot. Chunks of one under the header of the
    /// other must not read as a snapshot. Failed before the header carried a body digest: the
    /// spliced snapshot was returned, mixing both timelines' state.
    #[tokio::test]
    async fn spliced_snapshots_are_refused() {
        let key = MasterKey::generate();
        let g = geometry(100, 1000, 0).unwrap();
        let a_store = MemoryStore::new(g);
        let b_store = MemoryStore::new(g);
        write(&a_store, &key, &snap(7, 0xaa)).await.unwrap();
        write(&b_store, &key, &snap(7, 0xbb)).await.unwrap();
        // Each reads back whole.
        assert_eq!(read_latest(&a_store, &key).await.unwrap().oram_checkpoint[0], 0xaa);
        assert_eq!(read_latest(&b_store, &key).await.unwrap().oram_checkpoint[0], 0xbb);
        // The store puts timeline A's third chunk under timeline B's header.
        let per_slot = g.cell_count() / 2;
        let base = per_slot; // seq 7 is odd: the second slot
        let chunk = CellId(base + 3);
        let from_a = a_store.read(&[chunk]).await.unwrap().pop().unwrap();
        b_store.write(vec![(chunk, from_a)]).await.unwrap();
        match read_latest(&b_store, &key).await {
            Ok(s) => panic!(
                "a spliced snapshot was accepted (checkpoint bytes {:#x}..{:#x})",
                s.oram_checkpoint[0],
                s.oram_checkpoint[2 * CHUNK + 10]
            ),
            Err(e) => assert!(e.to_string().contains("digest"), "{e}"),
        }
    }

    /// Hostile snapshot cells: any damaged, swapped or random cell of the snapshot array makes
    /// `read_latest` fall back to the other slot or fail with a message, never panic or return
    /// other data. Cases: `BLINDFOLD_FUZZ_CASES` (default 256), as for the other decoders.
    #[test]
    fn damaged_snapshot_cells_never_read_as_a_snapshot() {
        use proptest::prelude::*;
        let cases =
            std::env::var("BLINDFOLD_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let key = MasterKey::generate();
        let g = geometry(100, 1000, 0).unwrap();
        let pristine = MemoryStore::new(g);
        rt.block_on(write(&pristine, &key, &snap(4, 0x11))).unwrap();
        rt.block_on(write(&pristine, &key, &snap(5, 0x22))).unwrap();
        let cells: Vec<CellId> = (0..g.cell_count()).map(CellId).collect();
        let original = rt.block_on(pristine.read(&cells)).unwrap();
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(cases));
        runner
            .run(
                &(0..g.cell_count(), any::<usize>(), 1u8.., any::<bool>(), any::<u64>()),
                |(cell, at, xor, random, swap_with)| {
                    let store = MemoryStore::new(g);
                    let mut all: Vec<(CellId, Vec<u8>)> =
                        cells.iter().copied().zip(original.iter().cloned()).collect();
                    let i = cell as usize;
                    if random {
                        // Random bytes (the store's own invention), or another cell's bytes.
                        let other = (swap_with % g.cell_count()) as usize;
                        all[i].1 = original[other].clone();
                        let n = all[i].1.len();
                        all[i].1[at % n] ^= xor;
                    } else {
                        let n = all[i].1.len();
                        all[i].1[at % n] ^= xor;
                    }
                    rt.block_on(store.write(all)).unwrap();
                    match rt.block_on(read_latest(&store, &key)) {
                        // Only an intact snapshot may come back: 5, or 4 if 5 was hit.
                        Ok(s) => {
                            let fill = s.oram_checkpoint[0];
                            prop_assert!(
                                (s.seq == 5 && fill == 0x22) || (s.seq == 4 && fill == 0x11)
                            );
                            prop_assert!(s.oram_checkpoint.iter().all(|&b| b == fill));
                        }
                        Err(e) => prop_assert!(!e.to_string().is_empty()),
                    }
                    Ok(())
                },
            )
            .unwrap();
    }
}
