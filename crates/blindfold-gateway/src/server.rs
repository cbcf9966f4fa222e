//! Starting a gateway: the data directory, key, credentials, configuration, and the HTTP loop.
//!
//! ```text
//! <data-dir>/
//!   key.json           master key (0600) — losing it loses the data
//!   credentials.json   S3 access key and secret (0600), generated on first start if not given
//!   gateway.json       public parameters fixed at creation (store URL, block size, capacity, …);
//!                      written last on first start: its presence marks a directory holding a store
//!   key-check.json     a known text sealed under the key: recognises a key from another store
//!   meta.redb          the directory (buckets, objects, uploads, block allocator)
//!   oram/              ORAM trusted state: checkpoint.bin, redo.log
//!   cells/             the default untrusted store (file backend): oram.cells
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use blindfold_crypto::{
    create_key_file, load_key_file, CellAd, CellSealer, MasterKey, Passphrase, StoreId,
};
use blindfold_oram::oblivistore::ObliviStoreConfig;
use blindfold_oram::tee::TeeOramConfig;
use blindfold_oram::{PathOramConfig, PosMapMode};
use blindfold_proxy::{
    DurableObliviStore, DurablePathOram, DurableTao, DurableTee, SealedDirect, SealedPathOram,
    TaoConfig,
};
use blindfold_store::{open_store, StoreUrl};
use serde::{Deserialize, Serialize};

use crate::directory::Directory;
use crate::engine::{DirectEngine, Serialized, SharedEngine};
use crate::objects::ObjectLayer;
use crate::observe::{Observer, PhysicalView};
use crate::s3::Gateway;
use crate::{GatewayError, Result};

/// Name of the store array holding the ORAM.
const ARRAY: &str = "oram";

/// How to start a gateway.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Trusted state directory.
    pub data_dir: PathBuf,
    /// Untrusted store; default: files in `<data-dir>/cells`.
    pub store: Option<StoreUrl>,
    /// Key file; default `<data-dir>/key.json`.
    pub key_file: Option<PathBuf>,
    /// Passphrase protecting the key file (new or existing).
    pub passphrase: Option<Arc<Passphrase>>,
    /// S3 credentials; default: `<data-dir>/credentials.json` (generated on first start).
    pub credentials: Option<(String, String)>,
    /// Logical capacity in bytes (used when creating).
    pub capacity: u64,
    /// ORAM block size in bytes (used when creating).
    pub block_size: u32,
    /// Pad object sizes to power-of-two block counts (used when creating).
    pub pad_objects: bool,
    /// Trusted memory, in MiB, for keeping the top of the ORAM tree (used when creating;
    /// with the TaoStore engine only on a two-slot store, the default).
    pub cache_mib: u64,
    /// The ORAM engine of a new data directory.
    pub engine: OramEngine,
    /// Lay a new data directory's ORAM out with one copy per cell, overwritten in place
    /// (half the store, but every commit writes its cells to the local redo log first),
    /// instead of two slots per cell.
    pub in_place: bool,
    /// With the TaoStore engine on a two-slot store: levels of the tree per store object
    /// (1: a bucket per object; 2 or more: subtrees of that many levels, see
    /// `blindfold_proxy::PackedStore`). Used when creating.
    pub pack_levels: u32,
}

/// The oblivious engine under the object layer, fixed when a data directory is created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OramEngine {
    /// The TaoStore-style concurrent engine ([`DurableTao`]): many block accesses in flight at
    /// once. The default.
    #[default]
    Tao,
    /// The sequential crash-consistent Path ORAM ([`DurablePathOram`]): one access at a time,
    /// paths of a batch fetched together; can keep the top of the tree in trusted memory.
    PathOram,
    /// The TEE-assisted engine of seed 004 ([`DurableTee`]): an m-ary tree whose queries and
    /// evictions a trusted component beside the store carries out; the gateway keeps the
    /// index and the blocks waiting to go back. With a local store the trusted component runs
    /// in the gateway's process; with `remote://` in the storage server's (`blindfold enclave`).
    Tee,
    /// ObliviStore (seed 001, [`DurableObliviStore`]): about √N partitions, each a levelled
    /// hierarchical ORAM shuffled in the background; requests to different partitions run at
    /// once. Keeps the position map and an eviction cache in trusted memory.
    ObliviStore,
    /// CURIOUS (seed 003 §3.10.2) over ObliviStore's levelled partitions
    /// ([`DurableObliviStore`] in CURIOUS's setting): every access touches exactly one
    /// partition, its read followed by one eviction into it carrying up to `b` = 3 blocks.
    Curious,
    /// CURIOUS over Path ORAM partitions ([`DurableObliviStore`] with
    /// [`ObliviStoreConfig::curious_path`]): every access reads one whole path of one
    /// partition's tree (buckets of `z` = 5) and writes it back with up to `b` = 3 more blocks.
    CuriousPath,
}

impl OramEngine {
    /// Whether `blindfold grow`, `recover` and key rotation can rebuild this engine's store.
    pub fn can_rebuild(self) -> bool {
        !matches!(self, Self::Tee)
    }
}

impl std::str::FromStr for OramEngine {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "tao" => Ok(Self::Tao),
            "path" | "path-oram" => Ok(Self::PathOram),
            "tee" => Ok(Self::Tee),
            "oblivistore" => Ok(Self::ObliviStore),
            "curious" => Ok(Self::Curious),
            "curious-path" => Ok(Self::CuriousPath),
            other => Err(format!(
                "unknown engine {other:?} (use tao, path-oram, tee, oblivistore, curious or \
                 curious-path)"
            )),
        }
    }
}

impl std::fmt::Display for OramEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tao => "tao",
            Self::PathOram => "path-oram",
            Self::Tee => "tee",
            Self::ObliviStore => "oblivistore",
            Self::Curious => "curious",
            Self::CuriousPath => "curious-path",
        })
    }
}

/// Paths the TaoStore engine fetches between two write-backs.
pub const TAO_WRITE_BACK_EVERY: usize = 40;

fn path_oram_engine() -> OramEngine {
    OramEngine::PathOram
}

/// Default of [`ServeConfig::cache_mib`] for the default engine, `tao`, but on `s3://` stores
/// ([`default_cache_mib`]).
pub const DEFAULT_CACHE_MIB: u64 = 128;

/// Default of [`ServeConfig::cache_mib`] for `path-oram` (and the engines that keep no tree top).
pub const PATH_ORAM_CACHE_MIB: u64 = 32;

/// Default of [`ServeConfig::cache_mib`] for `tao` on an `s3://` store.
pub const S3_CACHE_MIB: u64 = 256;

/// Default of [`ServeConfig::cache_mib`] for `engine` over `store` (`None`: local files),
/// chosen by measurement (`bench gateway`, full mix, docs/benchmarks.md): `tao` keeps the
/// cached top open and checkpoints it by block, so 128 MiB cuts its store traffic from 38 to 23
/// bytes per logical byte at no cost in throughput; on an `s3://` store, which bills every
/// request and every byte out, 256 MiB took the full mix on MinIO from 13.6 to 9.2 times the
/// plain gateway's dollars at AWS list prices. `path-oram` keeps its cache sealed and slowed down
/// with 128 MiB (10.2 → 6.5 ops/s), so it stays at 32 MiB.
pub fn default_cache_mib(engine: OramEngine, store: Option<&StoreUrl>) -> u64 {
    match (engine, store) {
        (OramEngine::Tao, Some(StoreUrl::S3 { .. })) => S3_CACHE_MIB,
        (OramEngine::Tao, _) => DEFAULT_CACHE_MIB,
        _ => PATH_ORAM_CACHE_MIB,
    }
}

/// Format version of new data directories (see [`GatewayParams::version`]).
pub const PARAMS_VERSION: u32 = 2;

/// Public parameters fixed when a data directory is created.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GatewayParams {
    /// Always "blindfold-gateway".
    pub format: String,
    /// Format version: 1 = the ORAM's store holds one copy of each cell, overwritten in place
    /// (commits log every cell first); 2 = two slots per cell (commits write the free slot
    /// and log only which cells moved; see `blindfold_proxy::SlottedStore`). New directories
    /// are made at [`PARAMS_VERSION`]; older ones keep their layout.
    pub version: u32,
    /// The store URL (display form).
    pub store: String,
    /// Store id (hex), bound into every seal.
    pub store_id: String,
    /// ORAM block size.
    pub block_size: u32,
    /// ORAM capacity in blocks.
    pub blocks: u64,
    /// Slots per bucket.
    pub z: u32,
    /// Whether object sizes are padded.
    pub pad_objects: bool,
    /// Top levels of the ORAM tree kept in trusted memory (0 in directories made before
    /// this option existed, and with the TaoStore engine before format version 2).
    #[serde(default)]
    pub cache_levels: u32,
    /// With the TaoStore engine: buckets of the tree kept in trusted memory, in heap order —
    /// the `cache_levels` whole levels and the left part of the next one, as many as fit the
    /// memory budget (0 in directories made before partial levels: `cache_levels` whole
    /// levels then).
    #[serde(default)]
    pub cache_cells: u64,
    /// With the TaoStore engine: levels of the tree per store object (0 or 1: a bucket per
    /// object, as every directory made before packing; see `blindfold_proxy::PackedStore`).
    #[serde(default)]
    pub pack_levels: u32,
    /// The ORAM engine (directories made before there was a choice use Path ORAM).
    #[serde(default = "path_oram_engine")]
    pub engine: OramEngine,
    /// Which store array holds the ORAM: `oram` for generation 0, `oram.g<N>` after the
    /// `N`-th `recover`, which rebuilds the tree into a new array (see [`oram_array`]).
    #[serde(default)]
    pub generation: u32,
}

/// Name of the store array holding the ORAM of `generation`.
pub fn oram_array(generation: u32) -> String {
    if generation == 0 {
        ARRAY.to_owned()
    } else {
        format!("{ARRAY}.g{generation}")
    }
}

#[derive(Serialize, Deserialize)]
struct Credentials {
    access_key: String,
    secret_key: String,
}

/// A running gateway's pieces, for `serve`, `verify` and tests.
#[derive(Debug)]
pub struct Opened {
    /// The object layer.
    pub objects: Arc<ObjectLayer>,
    /// The parameters.
    pub params: GatewayParams,
    /// What startup did, as lines for the operator.
    pub notes: Vec<String>,
    /// Credentials in force.
    pub credentials: (String, String),
    /// Whether this start generated the credentials (show the secret once, now).
    pub new_credentials: bool,
    /// The first error after which the engine refuses all work (integrity violation,
    /// poisoned driver), once there is one: the server should stop (a restart reloads the
    /// trusted state from the data directory).
    pub stopped: tokio::sync::watch::Receiver<Option<String>>,
    /// The master key: everything is sealed under it from now on.
    pub key: Arc<MasterKey>,
    /// During a key rotation, the key being retired: what it sealed still opens.
    pub previous_key: Option<Arc<MasterKey>>,
    /// The key rotation under way, whose sweep [`run_tls`] runs while it serves.
    pub rotation: Option<crate::rotation::Rotation>,
    /// The data directory.
    pub data_dir: PathBuf,
    /// The array holding the encrypted snapshot of the trusted state.
    /// `None` when it could not be opened (damaged): the gateway serves anyway, but writes no
    /// snapshot at shutdown. A growth of the store replaces it.
    pub snapshots: crate::snapshot::SnapshotSlot,
    /// Grows the store while the gateway serves (`None` for the baseline engine).
    pub grower: Option<Arc<crate::grow::Grower>>,
    /// Grow automatically (to twice the capacity) when this percentage of blocks is in use.
    pub grow_at: Option<u8>,
    /// The most blocks automatic growth goes to.
    pub grow_max: Option<u64>,
    /// Where to serve the Swift API beside S3 ([`crate::swift`]), if anywhere.
    pub swift_listener: Option<tokio::net::TcpListener>,
    /// What the S3 and Swift listeners allow their clients (one connection pool for both).
    pub limits: crate::listen::Limits,
    /// Metrics and recordings of this gateway (see [`crate::observe`]).
    pub observer: Arc<Observer>,
}

/// Writes `bytes` to `path` atomically and durably: a private (0600) temporary file beside it,
/// fsync, rename, then an fsync of the directory.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| GatewayError::Config(format!("writing {}: {e}", tmp.display())))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| GatewayError::Config(format!("writing {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| GatewayError::Config(format!("writing {}: {e}", path.display())))?;
    sync_parent(path)
}

/// Fsyncs the directory holding `path`, so that a rename or removal there is durable.
pub(crate) fn sync_parent(path: &Path) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| GatewayError::Config(format!("syncing {}: {e}", parent.display())))
}

pub(crate) fn random_token(len: usize, alphabet: &[u8]) -> String {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    (0..len).map(|_| alphabet[rng.gen_range(0..alphabet.len())] as char).collect()
}

/// Parses a size: a number of bytes, optionally with a decimal fraction and a unit.
///
/// `KiB`, `MiB`, `GiB`, `TiB` (and `K`, `M`, `G`, `T`) are powers of 1024; `KB`, `MB`, `GB`,
/// `TB` powers of 1000; a bare number is bytes. `1.5GiB`, `2GB`, `64MiB`, `4096`. A fraction
/// of a byte is rounded down.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim().replace('_', "");
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || format!("{s:?} is not a size (try 1GiB, 1.5GB, 64MiB or 4096 for bytes)");
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.len() > 18 {
        return Err(bad());
    }
    let int: u128 = if int.is_empty() { 0 } else { int.parse().map_err(|_| bad())? };
    let frac_n: u128 = if frac.is_empty() { 0 } else { frac.parse().map_err(|_| bad())? };
    let mult: u128 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown size unit {other:?} in {s:?} (use KiB, MiB, GiB, TiB or KB, MB, GB, TB)"
            ))
        }
    };
    let too_large = || format!("{s} is too large");
    let whole = int.checked_mul(mult).ok_or_else(too_large)?;
    let part = frac_n * mult / 10u128.pow(frac.len() as u32);
    u64::try_from(whole + part).map_err(|_| too_large())
}

pub(crate) fn tao_config(params: &GatewayParams) -> Result<TaoConfig> {
    TaoConfig::builder(params.blocks, params.block_size)
        .z(params.z)
        .write_back_every(TAO_WRITE_BACK_EVERY)
        .build()
        .map_err(|e| GatewayError::Config(e.to_string()))
}

/// The TEE engine's tree: rounds of `blocks / 64` queries (8 to the engine's default 450), arity 8,
/// halved until what one layer of a round works on (three buffers of a node and the blocks
/// coming down, plus the blocks that go up) fits a storage server's default 64 MiB frames.
pub(crate) fn tee_config(params: &GatewayParams) -> Result<TeeOramConfig> {
    let mut k =
        (params.blocks / 64).clamp(8, u64::from(blindfold_oram::tee::DEFAULT_ROUND_QUERIES)) as u32;
    let cell = blindfold_tee::cell_len(params.block_size as usize) as u64;
    loop {
        let config = TeeOramConfig::builder(params.blocks, params.block_size)
            .round_queries(k)
            .build()
            .map_err(|e| GatewayError::Config(e.to_string()))?;
        let z = u64::from(config.node_slots().max(config.leaf_slots()));
        let c = u64::from(config.round_blocks());
        if (3 * (z + c) + c) * cell <= 48 << 20 || k <= 8 {
            return Ok(config);
        }
        k /= 2;
    }
}

/// CURIOUS's `b`: blocks one eviction carries at most (the thesis ran b = 3).
pub const CURIOUS_B: u32 = 3;

/// CURIOUS's `z`: slots per bucket of its Path ORAM sub-ORAM (the thesis ran z = 5).
pub const CURIOUS_Z: u32 = 5;

/// The partitions of the ObliviStore and CURIOUS engines: the defaults of
/// [`ObliviStoreConfig::new`] and [`ObliviStoreConfig::curious`].
pub(crate) fn oblivistore_config(params: &GatewayParams) -> Result<ObliviStoreConfig> {
    if params.engine == OramEngine::Curious {
        ObliviStoreConfig::curious(params.blocks, params.block_size, CURIOUS_B)
    } else if params.engine == OramEngine::CuriousPath {
        ObliviStoreConfig::curious_path(params.blocks, params.block_size, CURIOUS_B, CURIOUS_Z)
    } else {
        ObliviStoreConfig::new(params.blocks, params.block_size)
    }
    .map_err(|e| GatewayError::Config(e.to_string()))
}

/// Cells of the ObliviStore engine's store.
fn oblivistore_cells(params: &GatewayParams) -> Result<u64> {
    oblivistore_config(params)?
        .total_cells()
        .ok_or_else(|| GatewayError::Config("too many cells for one store".into()))
}

pub(crate) fn oram_config(params: &GatewayParams) -> Result<PathOramConfig> {
    // Keep at most 2^16 position-map entries in memory; bigger maps are stored recursively.
    let posmap = if params.blocks > 1 << 20 {
        PosMapMode::Recursive { max_in_memory_entries: 1 << 16 }
    } else {
        PosMapMode::InMemory
    };
    PathOramConfig::builder(params.blocks, params.block_size)
        .z(params.z)
        .posmap(posmap)
        .cache_levels(params.cache_levels)
        .build()
        .map_err(|e| GatewayError::Config(e.to_string()))
}

/// What the operator's recordings show of the ORAM's store array (see [`PhysicalView`]).
pub(crate) fn physical_view(params: &GatewayParams) -> Result<PhysicalView> {
    let (copy_cells, leaves) = match params.engine {
        OramEngine::PathOram => {
            let config = oram_config(params)?;
            (config.total_cells(), config.trees()[0].shape.leaves())
        }
        OramEngine::Tao if params.two_slots() && params.tao_pack_levels() > 1 => {
            let t = tao_config(params)?;
            let p = blindfold_proxy::Packing::new(t.shape().levels(), params.tao_pack_levels())
                .map_err(|e| GatewayError::Config(e.to_string()))?;
            let (first, groups) = p.bottom_groups();
            return Ok(PhysicalView::Groups { copy_cells: p.groups(), first, groups });
        }
        OramEngine::Tao => {
            let t = tao_config(params)?;
            (t.tree().total_cells(), t.shape().leaves())
        }
        OramEngine::Tee => {
            return Ok(PhysicalView::Flat { cells: tee_config(params)?.total_cells() })
        }
        OramEngine::ObliviStore | OramEngine::Curious | OramEngine::CuriousPath => {
            return Ok(PhysicalView::Flat { cells: oblivistore_cells(params)? })
        }
    };
    Ok(PhysicalView::Tree { copy_cells, leaves })
}

/// Logical cells of the gateway's ORAM engine (one copy of each).
pub(crate) fn engine_cells(params: &GatewayParams) -> Result<u64> {
    Ok(match params.engine {
        OramEngine::PathOram => oram_config(params)?.total_cells(),
        OramEngine::Tao => tao_config(params)?.tree().total_cells(),
        OramEngine::Tee => tee_config(params)?.total_cells(),
        OramEngine::ObliviStore | OramEngine::Curious | OramEngine::CuriousPath => {
            oblivistore_cells(params)?
        }
    })
}

/// The store shape of the gateway's ORAM engine.
pub(crate) fn oram_geometry(params: &GatewayParams) -> Result<blindfold_store::Geometry> {
    Ok(match (params.engine, params.two_slots()) {
        (OramEngine::PathOram, true) => DurablePathOram::geometry(&oram_config(params)?)?,
        (OramEngine::PathOram, false) => SealedPathOram::geometry(&oram_config(params)?)?,
        (OramEngine::Tao, true) => {
            DurableTao::packed_geometry(&tao_config(params)?, params.tao_pack_levels())?
        }
        (OramEngine::Tao, false) => tao_config(params)?.geometry()?,
        (OramEngine::Tee, _) => DurableTee::geometry(&tee_config(params)?)?,
        (OramEngine::ObliviStore | OramEngine::Curious | OramEngine::CuriousPath, _) => {
            DurableObliviStore::geometry(&oblivistore_config(params)?)?
        }
    })
}

impl GatewayParams {
    /// Whether the ORAM's store holds two slots per cell (format version 2 and later).
    pub fn two_slots(&self) -> bool {
        self.version >= 2
    }
}

/// The most top levels of the data tree whose buckets fit in `budget` bytes, leaving at least
/// one level in the store. Each cached level halves nothing but saves one bucket read and
/// write per access, and costs twice the memory of the one above it.
fn cache_levels_for(params: &GatewayParams, budget: u64) -> Result<u32> {
    let config = oram_config(&GatewayParams { cache_levels: 0, ..params.clone() })?;
    let levels = config.trees()[0].shape.levels();
    let bucket = config.bucket_bytes() as u64;
    let mut l = 0;
    while l + 1 < levels && ((1u64 << (l + 1)) - 1).saturating_mul(bucket) <= budget {
        l += 1;
    }
    Ok(l)
}

/// The TaoStore engine's tree top for a memory budget of `budget` bytes: as many buckets in
/// heap order as fit (each costs its sealed cell's size), the leaves left in the store; and the
/// whole levels among them. A budget between two whole levels pins the left part of the next:
/// paths to the leaves below it skip one more bucket in the store.
fn tao_pinned_for(params: &GatewayParams, budget: u64) -> Result<(u32, u64)> {
    let t = tao_config(params)?;
    let cell = u64::from(t.geometry()?.cell_size());
    let inner = t.shape().buckets() - t.shape().leaves();
    let cells = (budget / cell).min(inner);
    Ok(((cells + 1).ilog2(), cells))
}

impl GatewayParams {
    /// Levels of the TaoStore engine's tree per store object (1: a bucket per object).
    pub fn tao_pack_levels(&self) -> u32 {
        self.pack_levels.max(1)
    }

    /// The store layout for people: "in place", "two slots per cell", "two slots per object
    /// of 2 tree levels".
    pub fn layout(&self) -> String {
        match (self.two_slots(), self.engine == OramEngine::Tao && self.tao_pack_levels() > 1) {
            (false, _) => "in place".into(),
            (true, false) => "two slots per cell".into(),
            (true, true) => {
                format!("two slots per object of {} tree levels", self.tao_pack_levels())
            }
        }
    }

    /// With the TaoStore engine on two slots: the store objects a path crosses below the cached
    /// top, and the buckets they hold of it, for the path that skips the fewest (the
    /// rightmost; paths to leaves under a partly cached level skip one bucket more).
    pub fn tao_path_objects(&self) -> Option<(u64, u64)> {
        if self.engine != OramEngine::Tao || !self.two_slots() {
            return None;
        }
        let t = tao_config(self).ok()?;
        let shape = t.shape();
        let packing = blindfold_proxy::Packing::new(shape.levels(), self.tao_pack_levels()).ok()?;
        let pinned = self.tao_pinned_cells();
        let leaf = blindfold_oram::Leaf(shape.leaves() - 1);
        let below: Vec<u64> = (0..shape.levels())
            .map(|l| shape.bucket_on_path(leaf, l).0)
            .filter(|&b| b >= pinned)
            .collect();
        let mut groups: Vec<u64> = below.iter().map(|&b| packing.group_of(b).0).collect();
        groups.dedup();
        Some((groups.len() as u64, below.len() as u64))
    }

    /// Buckets of the TaoStore engine's tree kept in trusted memory (see
    /// [`GatewayParams::cache_cells`]).
    pub fn tao_pinned_cells(&self) -> u64 {
        if self.cache_cells > 0 {
            self.cache_cells
        } else {
            blindfold_proxy::PinnedCells::for_levels(self.cache_levels)
        }
    }

    /// Buckets of the data tree kept in trusted memory, with any engine.
    pub fn cached_cells(&self) -> u64 {
        if self.engine == OramEngine::Tao {
            self.tao_pinned_cells()
        } else {
            blindfold_proxy::PinnedCells::for_levels(self.cache_levels)
        }
    }

    /// The cached tree top for people: "3 tree levels", "10 tree levels and 57 % of the next".
    pub fn cache_summary(&self) -> Option<String> {
        let whole = blindfold_proxy::PinnedCells::for_levels(self.cache_levels);
        let cells = self.cached_cells();
        if cells == 0 {
            return None;
        }
        let levels = format!(
            "{} tree level{}",
            self.cache_levels,
            if self.cache_levels == 1 { "" } else { "s" }
        );
        Some(if cells > whole {
            // Level `k` under `k` whole levels has `2^k = whole + 1` buckets; rounded down, so
            // a level one bucket short never reads as whole.
            let percent = (cells - whole).saturating_mul(100) / (whole + 1);
            format!("{levels} and {percent} % of the next")
        } else {
            levels
        })
    }
}

/// Which engine stores the object layer's blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// The data directory's crash-consistent ORAM engine ([`OramEngine`]): what the gateway
    /// always uses.
    #[default]
    PathOram,
    /// **Benchmark baseline only**: blocks sealed at fixed cells with no ORAM and no crash
    /// consistency ([`DirectEngine`]), in the store array `direct`. Needs a fresh data
    /// directory, and the directory cannot be reopened afterwards.
    DirectBaseline,
}

/// Wraps the opened untrusted store, e.g. in a [`blindfold_store::CountingStore`].
pub type StoreWrapper =
    Box<dyn Fn(Arc<dyn blindfold_store::Store>) -> Arc<dyn blindfold_store::Store> + Send + Sync>;

/// Opens a block engine that keeps its blocks elsewhere than the data directory's store (the
/// load balancer over ORAM nodes, `blindfold-node`), from the ORAM state directory
/// (`<data-dir>/oram`), the parameters, the master key and whether the data directory is being
/// created. The gateway then opens no store array for the engine (the store still holds the
/// encrypted snapshot) and cannot grow it.
pub type EngineFactory = Box<
    dyn FnOnce(
            PathBuf,
            GatewayParams,
            Arc<MasterKey>,
            bool,
        ) -> futures::future::BoxFuture<'static, Result<Arc<dyn SharedEngine>>>
        + Send,
>;

/// Extras for [`open_with`], used by benchmarks and tests; [`open`] uses the defaults.
#[derive(Default)]
pub struct OpenHooks {
    /// The block engine.
    pub engine: EngineKind,
    /// Applied to the engine's store right after it is opened.
    pub wrap_store: Option<StoreWrapper>,
    /// Opens the engine instead of the data directory's own ([`EngineFactory`]).
    pub engine_factory: Option<EngineFactory>,
}

impl std::fmt::Debug for OpenHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenHooks")
            .field("engine", &self.engine)
            .field("wrap_store", &self.wrap_store.is_some())
            .field("engine_factory", &self.engine_factory.is_some())
            .finish()
    }
}

/// File in the data directory holding the key check value: a known text sealed under the key
/// for this store, so a key that does not belong to the directory is recognised at start.
pub const KEY_CHECK_FILE: &str = "key-check.json";

/// What the key check seals. The cell address `u64::MAX` is never an ORAM cell.
const KEY_CHECK_TEXT: &[u8] = b"blindfold key check v1";
const KEY_CHECK_AD: CellAd = CellAd { cell: u64::MAX, version: u64::MAX, segment: u32::MAX };

#[derive(Serialize, Deserialize)]
struct KeyCheck {
    /// The store id (hex) the check is bound to.
    store_id: String,
    /// `KEY_CHECK_TEXT` sealed under the store's cell key (hex).
    sealed: String,
}

fn key_check(key: &MasterKey, store_id: StoreId) -> Result<KeyCheck> {
    let sealed = CellSealer::new(key, store_id, 0)
        .seal(&KEY_CHECK_AD, KEY_CHECK_TEXT)
        .map_err(|e| GatewayError::Config(format!("sealing the key check: {e}")))?;
    Ok(KeyCheck { store_id: store_id.to_hex(), sealed: hex::encode(sealed) })
}

/// Whether `key` opens the key check of the data directory `dir` (true when there is none).
fn key_matches(dir: &Path, key: &MasterKey, store_id: StoreId) -> Result<Option<bool>> {
    let path = dir.join(KEY_CHECK_FILE);
    let raw = match std::fs::read(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(GatewayError::Config(format!("reading {}: {e}", path.display()))),
    };
    let bad = |why: &str| GatewayError::Config(format!("{}: {why}", path.display()));
    let check: KeyCheck = serde_json::from_slice(&raw).map_err(|_| bad("not a key check file"))?;
    if check.store_id != store_id.to_hex() {
        return Err(bad("made for another store (its store id differs from gateway.json)"));
    }
    let sealed = hex::decode(&check.sealed).map_err(|_| bad("not a key check file"))?;
    let opened = CellSealer::new(key, store_id, 0).open(&KEY_CHECK_AD, &sealed);
    Ok(Some(opened.is_ok_and(|t| t == KEY_CHECK_TEXT)))
}

/// The keys of the data directory `dir`, which must hold a store, from its key file
/// `key_path`: the key the file holds, or during a key rotation the new key and the one being
/// retired (see [`crate::rotation::keys`]). Checked against the directory's key check; for
/// commands that seal state of their own (`blindfold user`, `blindfold rotate-key`).
pub fn data_dir_keys(
    dir: &Path,
    key_path: &Path,
    passphrase: Option<&Passphrase>,
) -> Result<crate::rotation::Keys> {
    let params = read_params(dir)?.ok_or_else(|| {
        GatewayError::Config(format!(
            "{} holds no store (no gateway.json): start `blindfold serve` there first",
            dir.display()
        ))
    })?;
    let id = store_id(&params)?;
    let loaded = load_key_file(key_path, passphrase).map_err(|e| {
        GatewayError::Config(format!("loading the key {}: {e}", key_path.display()))
    })?;
    let keys = crate::rotation::keys(dir, key_path, loaded, |k| {
        Ok(key_matches(dir, k, id)? == Some(true))
    })?;
    let mut verdict = key_matches(dir, &keys.current, id)?;
    if let (Some(false), Some(old)) = (verdict, &keys.previous) {
        verdict = key_matches(dir, old, id)?;
    }
    if verdict == Some(false) {
        return Err(GatewayError::Config(format!(
            "the key in {} is not the key of {} (its key check does not open)",
            key_path.display(),
            dir.display()
        )));
    }
    Ok(keys)
}

/// Reads `<dir>/gateway.json`, if there is one.
pub fn read_params(dir: &Path) -> Result<Option<GatewayParams>> {
    let path = dir.join("gateway.json");
    let raw = match std::fs::read(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(GatewayError::Config(format!("reading {}: {e}", path.display()))),
    };
    serde_json::from_slice(&raw)
        .map_err(|e| GatewayError::Config(format!("{}: {e}", path.display())))
        .and_then(|p: GatewayParams| {
            if p.format != "blindfold-gateway" {
                return Err(GatewayError::Config(format!(
                    "{}: not a blindfold gateway's parameters (format {:?})",
                    path.display(),
                    p.format
                )));
            }
            if p.version == 0 || p.version > PARAMS_VERSION {
                return Err(GatewayError::Config(format!(
                    "{}: format version {} was made by a newer blindfold (this one, {}, reads \
                     versions 1 to {PARAMS_VERSION}); run the newer version",
                    path.display(),
                    p.version,
                    env!("CARGO_PKG_VERSION")
                )));
            }
            Ok(Some(p))
        })
}

/// What a store takes: in the untrusted store and in the gateway's trusted memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    /// Logical blocks.
    pub blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Object data it holds: blocks × block size.
    pub capacity_bytes: u64,
    /// Bytes the untrusted store holds once every cell is written (ORAM cells and room for
    /// the encrypted snapshot).
    pub store_bytes: u64,
    /// Of which the ORAM's cells.
    pub oram_bytes: u64,
    /// Estimated trusted memory: position map, cell versions, tree top kept in memory.
    pub trusted_bytes: u64,
}

impl Footprint {
    /// Bytes of ORAM cells per byte of capacity (the snapshot's room is left out: it is
    /// mostly a fixed megabyte).
    pub fn ratio(&self) -> f64 {
        self.oram_bytes as f64 / self.capacity_bytes.max(1) as f64
    }
}

/// Bytes of tree top the engine of `params` keeps in trusted memory, at most.
pub(crate) fn cached_bytes_of(params: &GatewayParams) -> Result<u64> {
    if params.engine == OramEngine::Tao && params.cache_cells > 0 {
        let cell = u64::from(tao_config(params)?.geometry()?.cell_size());
        return Ok(params.cache_cells * cell);
    }
    // (Directories made before partial levels keep the estimate their snapshot area was
    // sized with.)
    Ok(cached_bytes(&oram_config(params)?))
}

pub(crate) fn cached_bytes(config: &PathOramConfig) -> u64 {
    config
        .trees()
        .iter()
        .map(|t| (1u64 << config.cache_levels().min(t.shape.levels())) - 1)
        .sum::<u64>()
        * config.bucket_bytes() as u64
}

/// The footprint of a store with these parameters.
pub fn footprint(params: &GatewayParams) -> Result<Footprint> {
    let config = oram_config(params)?;
    let geometry = oram_geometry(params)?;
    let cells = match params.engine {
        OramEngine::PathOram => config.total_cells(),
        OramEngine::Tao => tao_config(params)?.tree().total_cells(),
        OramEngine::Tee => tee_config(params)?.total_cells(),
        OramEngine::ObliviStore | OramEngine::Curious | OramEngine::CuriousPath => {
            oblivistore_cells(params)?
        }
    };
    let cached = cached_bytes_of(params)?;
    let snap = crate::snapshot::geometry(params.blocks, cells, cached)?;
    // A packed tree keeps recently read groups for the writes that follow.
    let groups = match params.engine {
        OramEngine::Tao if params.two_slots() => {
            DurableTao::packed_cache_bytes(&tao_config(params)?, params.tao_pack_levels())?
        }
        _ => 0,
    };
    let bytes = |g: &blindfold_store::Geometry| g.cell_count() * u64::from(g.cell_size());
    let posmap = if params.engine == OramEngine::PathOram && params.blocks > 1 << 20 {
        1 << 19 // recursive: 2^16 entries in memory
    } else {
        params.blocks * 8
    };
    Ok(Footprint {
        blocks: params.blocks,
        block_size: params.block_size,
        capacity_bytes: params.blocks * u64::from(params.block_size),
        store_bytes: bytes(&geometry) + bytes(&snap),
        oram_bytes: bytes(&geometry),
        // Every engine holds a cached bucket once: the TaoStore engine sealed until first
        // used, then open (sealed again only for a moment, for a checkpoint or a verify).
        trusted_bytes: posmap + cells * 8 + cached + groups,
    })
}

/// Formats a byte count for people: `16 KiB`, `2.1 GiB`, `10 bytes`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", UNITS[unit])
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// The parameters of a new data directory, checked, with nothing created yet.
pub fn new_params(cfg: &ServeConfig) -> Result<GatewayParams> {
    if cfg.block_size < 64 {
        return Err(GatewayError::Config("--block-size must be at least 64 bytes".into()));
    }
    let blocks = cfg.capacity / u64::from(cfg.block_size);
    if blocks == 0 {
        return Err(GatewayError::Config(format!(
            "--capacity {} is less than one block of {} bytes (a bare number is bytes: did you \
             mean {}MiB or {}GiB?)",
            cfg.capacity, cfg.block_size, cfg.capacity, cfg.capacity
        )));
    }
    let abs_dir = std::path::absolute(&cfg.data_dir)
        .map_err(|e| GatewayError::Config(format!("resolving {}: {e}", cfg.data_dir.display())))?;
    // Recorded in gateway.json: absolute, so a later start from another directory finds it.
    let store_url = cfg.store.clone().unwrap_or(StoreUrl::File {
        dir: abs_dir.join("cells"),
        sync: blindfold_store::SyncMode::OnFlush,
    });
    let p = GatewayParams {
        format: "blindfold-gateway".into(),
        version: if cfg.in_place { 1 } else { PARAMS_VERSION },
        store: store_url.to_string(),
        store_id: StoreId::random().to_hex(),
        block_size: cfg.block_size,
        blocks,
        z: 4,
        pad_objects: cfg.pad_objects,
        cache_levels: 0,
        cache_cells: 0,
        pack_levels: 0,
        engine: cfg.engine,
        generation: 0,
    };
    if cfg.pack_levels > 1 && cfg.engine != OramEngine::Tao {
        return Err(GatewayError::Config(format!(
            "--pack-levels is for the tao engine; {} keeps one bucket per store object",
            cfg.engine
        )));
    }
    let p = match cfg.engine {
        OramEngine::PathOram => GatewayParams {
            cache_levels: cache_levels_for(&p, cfg.cache_mib.saturating_mul(1 << 20))?,
            ..p
        },
        // Keeping the tree top in memory, and packing, need two slots per cell (DurableTao).
        OramEngine::Tao if cfg.in_place => {
            if cfg.pack_levels > 1 {
                return Err(GatewayError::Config(
                    "--pack-levels needs two slots per object: drop --in-place".into(),
                ));
            }
            tao_config(&p)?;
            p
        }
        OramEngine::Tao => {
            let (cache_levels, cache_cells) =
                tao_pinned_for(&p, cfg.cache_mib.saturating_mul(1 << 20))?;
            let p = GatewayParams { cache_levels, cache_cells, pack_levels: cfg.pack_levels, ..p };
            let levels = tao_config(&p)?.shape().levels();
            blindfold_proxy::Packing::new(levels, p.tao_pack_levels()).map_err(|e| {
                GatewayError::Config(format!("--pack-levels {}: {e}", cfg.pack_levels))
            })?;
            p
        }
        OramEngine::Tee => {
            tee_config(&p)?;
            p
        }
        OramEngine::ObliviStore | OramEngine::Curious | OramEngine::CuriousPath => {
            oblivistore_config(&p)?;
            p
        }
    };
    oram_config(&p)?;
    Ok(p)
}

/// Opens the data directory, creating everything missing on first start.
pub async fn open(cfg: &ServeConfig) -> Result<Opened> {
    open_with(cfg, OpenHooks::default()).await
}

/// [`open`] with a choice of engine and a wrapper around the store.
///
/// An existing data directory (one with `gateway.json`) is only ever opened: a missing key
/// file is an error, never a reason to make a new key. A new one is created in an order that
/// leaves nothing behind if any step fails: parameters are checked and the store and engine
/// opened first; the key, the credentials and the key check are written next, and
/// `gateway.json`, which marks the directory as holding a store, last.
pub async fn open_with(cfg: &ServeConfig, hooks: OpenHooks) -> Result<Opened> {
    let dir = &cfg.data_dir;
    if hooks.engine == EngineKind::DirectBaseline && dir.join("meta.redb").exists() {
        return Err(GatewayError::Config(format!(
            "the direct baseline keeps its cell versions only in memory and needs a fresh data \
             directory; {} is in use",
            dir.display()
        )));
    }
    match read_params(dir)? {
        Some(params) => open_existing(cfg, hooks, params).await,
        None if dir.join(RECOVERING).exists() => Err(GatewayError::Config(format!(
            "{} holds a `blindfold recover` that did not finish: run the same `blindfold \
             recover` again (it starts over; the store's snapshot and arrays are as they were)",
            dir.display()
        ))),
        None => create(cfg, hooks).await,
    }
}

fn read_credentials(path: &Path) -> Result<(String, String)> {
    let raw = std::fs::read(path)
        .map_err(|e| GatewayError::Config(format!("reading {}: {e}", path.display())))?;
    let c: Credentials = serde_json::from_slice(&raw)
        .map_err(|e| GatewayError::Config(format!("{}: {e}", path.display())))?;
    Ok((c.access_key, c.secret_key))
}

fn new_credentials() -> Credentials {
    Credentials {
        access_key: random_token(20, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
        secret_key: random_token(
            40,
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
        ),
    }
}

fn store_id(params: &GatewayParams) -> Result<StoreId> {
    StoreId::from_hex(&params.store_id).map_err(|e| GatewayError::Config(e.to_string()))
}

async fn open_existing(
    cfg: &ServeConfig,
    hooks: OpenHooks,
    mut params: GatewayParams,
) -> Result<Opened> {
    let dir = &cfg.data_dir;
    if let Some(url) = &cfg.store {
        if params.store != url.to_string() {
            return Err(GatewayError::Config(format!(
                "{} was created for store {}, not {url}: leave out --store to use it, or give \
                 another --data-dir to create a new store",
                dir.display(),
                params.store,
            )));
        }
    }
    let key_path = cfg.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    if !key_path.exists() {
        return Err(GatewayError::Config(format!(
            "{} is missing — restore it from your backup (or name it with --key-file). {} \
             already holds a store, which only its own key can read, so no new key is made; \
             nothing was changed",
            key_path.display(),
            dir.display()
        )));
    }
    let loaded = load_key_file(&key_path, cfg.passphrase.as_deref())
        .map_err(|e| GatewayError::Config(e.to_string()))?;
    let id = store_id(&params)?;
    let keys = crate::rotation::keys(dir, &key_path, loaded, |k| {
        Ok(key_matches(dir, k, id)? == Some(true))
    })?;
    let key = keys.current;
    let mut checked = key_matches(dir, &key, id)?;
    let mut notes = Vec::new();
    if let Some(old) = &keys.previous {
        // A rotation: the key check may still be under the old key (the rotation file opened
        // under it, so it is this directory's key). Everything kept locally under the master
        // key is re-sealed under the new one now, each file atomically.
        if checked != Some(true) {
            checked = key_matches(dir, old, id)?;
        }
        // (`None`: a directory from before key checks; the rotation file vouches for the key.)
        if checked != Some(false) {
            if Directory::rekey(&dir.join("meta.redb"), params.blocks, &key, old)? {
                notes.push("key rotation: re-sealed the directory database".to_string());
            }
            crate::users::UserFile::new(dir, &key)
                .rekey_from(&crate::users::UserFile::new(dir, old))
                .map_err(|e| GatewayError::Config(e.to_string()))?;
            if key_matches(dir, &key, id)? != Some(true) {
                let check = key_check(&key, id)?;
                write_private(
                    &dir.join(KEY_CHECK_FILE),
                    &serde_json::to_vec_pretty(&check).expect("json"),
                )?;
            }
            let r = keys.rotation.as_ref().expect("a previous key comes with a rotation");
            notes.push(format!(
                "key rotation under way ({}): it re-seals every cell while the gateway \
                 serves; the old key file is replaced when it ends",
                r.progress()
            ));
        }
    }
    if checked == Some(false) {
        return Err(GatewayError::Config(format!(
            "the key in {} does not belong to the store in {} (its key check does not match): \
             use the key file backed up with this data directory; nothing was changed",
            key_path.display(),
            dir.display()
        )));
    }
    if hooks.engine == EngineKind::PathOram && hooks.engine_factory.is_none() {
        // A growth a crash interrupted is finished (or redone) before the engine opens. The
        // ORAM state is still under the key it had then: growths never overlap a rotation.
        let state_key = keys.previous.as_ref().unwrap_or(&key);
        let (grown, note) = crate::grow::resume(dir, params, state_key).await?;
        params = grown;
        notes.extend(note);
    }
    let cred_path = dir.join("credentials.json");
    let mut generated = None;
    let credentials = match &cfg.credentials {
        Some(c) => c.clone(),
        None if cred_path.exists() => read_credentials(&cred_path)?,
        None => {
            let c = new_credentials();
            let pair = (c.access_key.clone(), c.secret_key.clone());
            generated = Some(c);
            pair
        }
    };
    let previous = keys.previous;
    let mut opened =
        assemble(cfg, hooks, params, (key, previous), credentials, false, &mut notes).await?;
    if let Some(mut r) = keys.rotation {
        // Recorded as begun: from now on the users file is kept under the new key.
        let paths = opened.objects.engine().sweep_paths().await;
        r.record(r.swept, paths)?;
        opened.rotation = Some(r);
    }
    if let Some(c) = generated {
        write_private(&cred_path, &serde_json::to_vec_pretty(&c).expect("json"))?;
        notes.push(format!("generated S3 credentials in {}", cred_path.display()));
        opened.new_credentials = true;
    }
    // A directory made before key checks existed gets one, but only once the key is known to
    // be right (it authenticates a snapshot in the store): a check made with a wrong key would
    // lock the right one out.
    let snapshots = opened.snapshots.lock().clone();
    let snapshot_found = match snapshots {
        Some(s) => crate::snapshot::latest_seq(&*s.store, &opened.key).await.is_some(),
        None => false,
    };
    if checked.is_none() && snapshot_found {
        let check = key_check(&opened.key, id)?;
        write_private(
            &dir.join(KEY_CHECK_FILE),
            &serde_json::to_vec_pretty(&check).expect("json"),
        )?;
    }
    opened.notes = notes;
    Ok(opened)
}

/// Paths a first start created, removed again if it fails.
#[derive(Default)]
struct Debris {
    paths: Vec<PathBuf>,
    armed: bool,
}

impl Debris {
    fn add(&mut self, p: PathBuf) {
        self.armed = true;
        self.paths.push(p);
    }
}

impl Drop for Debris {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        for p in self.paths.iter().rev() {
            let _ = if p.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) };
        }
    }
}

/// Creates a directory (and records it as debris) unless it exists.
fn make_dir(path: &Path, debris: &mut Debris) -> Result<()> {
    if !path.exists() {
        // Record the topmost directory that did not exist, so cleaning removes all of it.
        let mut top = path.to_path_buf();
        while let Some(parent) = top.parent() {
            if parent.as_os_str().is_empty() || parent.exists() {
                break;
            }
            top = parent.to_path_buf();
        }
        // Private from the start (0700): it will hold the key and the trusted state.
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(path)
            .map_err(|e| GatewayError::Config(format!("creating {}: {e}", path.display())))?;
        debris.add(top);
    }
    Ok(())
}

async fn create(cfg: &ServeConfig, hooks: OpenHooks) -> Result<Opened> {
    let dir = &cfg.data_dir;
    let params = new_params(cfg)?;
    let store_url: StoreUrl = params
        .store
        .parse()
        .map_err(|e: blindfold_store::StoreError| GatewayError::Config(e.to_string()))?;
    let mut debris = Debris::default();
    make_dir(dir, &mut debris)?;
    let mut notes = Vec::new();
    // What a first start that failed before writing gateway.json left behind holds no data
    // anyone was told about.
    let mut leftovers = false;
    for p in [dir.join("oram"), dir.join("meta.redb"), dir.join(KEY_CHECK_FILE)] {
        if p.exists() {
            leftovers = true;
            let r = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            r.map_err(|e| GatewayError::Config(format!("removing {}: {e}", p.display())))?;
        }
    }
    if leftovers {
        notes.push("removed the leftovers of a first start that did not finish".to_string());
    }
    if let StoreUrl::File { dir: cells, .. } = &store_url {
        make_dir(cells, &mut debris)?;
    }
    // The key: an existing key file is used; a new one is written beside its final name and
    // moved there only when everything else worked.
    let key_path = cfg.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    let pass = cfg.passphrase.as_deref();
    let (key, new_key) = if key_path.exists() {
        (load_key_file(&key_path, pass).map_err(|e| GatewayError::Config(e.to_string()))?, None)
    } else {
        if let Some(parent) = key_path.parent() {
            if !parent.as_os_str().is_empty() {
                make_dir(parent, &mut debris)?;
            }
        }
        let mut tmp = key_path.clone().into_os_string();
        tmp.push(".new");
        let tmp = PathBuf::from(tmp);
        let _ = std::fs::remove_file(&tmp);
        let k = create_key_file(&tmp, pass).map_err(|e| GatewayError::Config(e.to_string()))?;
        debris.add(tmp.clone());
        (k, Some(tmp))
    };
    debris.add(dir.join("oram"));
    debris.add(dir.join("meta.redb"));
    // A store that already holds a gateway (its snapshot index) is never taken over: the new
    // gateway would overwrite that gateway's arrays.
    if hooks.engine == EngineKind::PathOram {
        match crate::snapshot::existing_index(&store_url, &key).await? {
            Some(true) => {
                return Err(GatewayError::Config(format!(
                    "{} already holds a blindfold gateway sealed with this key, and {} is not \
                     its data directory: to rebuild that directory from the store run \
                     `blindfold recover --data-dir DIR --store {} --key-file {}`; for a new \
                     gateway choose another store location. Nothing was changed",
                    params.store,
                    dir.display(),
                    params.store,
                    key_path.display()
                )))
            }
            Some(false) => {
                return Err(GatewayError::Config(format!(
                    "{} already holds another blindfold gateway's data (sealed with another \
                     key): choose another store location (directory, bucket prefix or \
                     database) for a new gateway, or give the key that gateway was made with. \
                     Nothing was changed",
                    params.store
                )))
            }
            None => {}
        }
    }
    let credentials = match &cfg.credentials {
        Some(c) => (c.clone(), None),
        None => {
            let c = new_credentials();
            ((c.access_key.clone(), c.secret_key.clone()), Some(c))
        }
    };
    let id = store_id(&params)?;
    let check = key_check(&key, id)?;
    let mut opened =
        assemble(cfg, hooks, params.clone(), (key, None), credentials.0, true, &mut notes).await?;
    // Everything opened: now the files that make the directory usable, gateway.json last.
    let cred_path = dir.join("credentials.json");
    if let Some(c) = credentials.1 {
        debris.add(cred_path.clone());
        write_private(&cred_path, &serde_json::to_vec_pretty(&c).expect("json"))?;
        notes.push(format!("generated S3 credentials in {}", cred_path.display()));
        opened.new_credentials = true;
    }
    debris.add(dir.join(KEY_CHECK_FILE));
    write_private(&dir.join(KEY_CHECK_FILE), &serde_json::to_vec_pretty(&check).expect("json"))?;
    if let Some(tmp) = new_key {
        std::fs::rename(&tmp, &key_path)
            .map_err(|e| GatewayError::Config(format!("writing {}: {e}", key_path.display())))?;
        debris.add(key_path.clone());
        notes.push(format!(
            "created a new key at {} — back it up: without it the stored data cannot be read",
            key_path.display()
        ));
    }
    let f = footprint(&params)?;
    write_private(&dir.join("gateway.json"), &serde_json::to_vec_pretty(&params).expect("json"))?;
    debris.armed = false;
    notes.push(format!(
        "created an oblivious store of {} ({} blocks of {} bytes) at {}, taking up to {} there",
        human_bytes(f.capacity_bytes),
        f.blocks,
        f.block_size,
        params.store,
        human_bytes(f.store_bytes)
    ));
    if let (Some((objects, buckets)), true) = (params.tao_path_objects(), params.pack_levels > 1) {
        notes.push(format!(
            "packed {} tree levels per store object: an access reads and writes {objects} \
             object(s) holding {buckets} bucket(s) of its path; up to {} of sealed objects stay \
             in memory for the write-backs{}",
            params.tao_pack_levels(),
            human_bytes(DurableTao::packed_cache_bytes(
                &tao_config(&params)?,
                params.tao_pack_levels()
            )?),
            if objects == buckets {
                " — as many as unpacked, each larger: packing pays only when several levels \
                 lie below the cached top (a larger store, or a smaller --cache-mib)"
            } else {
                ""
            }
        ));
    }
    opened.notes = notes;
    Ok(opened)
}

/// Opens the store, the engine (creating it if `creating`), the directory and the snapshot
/// array.
async fn assemble(
    cfg: &ServeConfig,
    hooks: OpenHooks,
    params: GatewayParams,
    (key, previous): (MasterKey, Option<MasterKey>),
    credentials: (String, String),
    creating: bool,
    notes: &mut Vec<String>,
) -> Result<Opened> {
    let dir = &cfg.data_dir;
    let key = Arc::new(key);
    let wrap_store = hooks.wrap_store.map(Arc::new);
    // The data directory is private: 0700, its files 0600 (tightened, with a warning, if not).
    for warning in blindfold_proxy::make_private(dir)? {
        tracing::warn!("{warning}");
        notes.push(warning);
    }
    let store_url: StoreUrl = params
        .store
        .parse()
        .map_err(|e: blindfold_store::StoreError| GatewayError::Config(e.to_string()))?;
    let config = oram_config(&params)?;
    let injected = match hooks.engine_factory {
        Some(open) => {
            Some(open(dir.join("oram"), params.clone(), Arc::clone(&key), creating).await?)
        }
        None => None,
    };
    let injected_engine = injected.is_some();
    let (array, geometry) = match hooks.engine {
        EngineKind::PathOram => (oram_array(params.generation), oram_geometry(&params)?),
        EngineKind::DirectBaseline => {
            ("direct".to_owned(), SealedDirect::geometry(params.blocks, params.block_size)?)
        }
    };
    let store = if injected_engine {
        // The engine keeps its blocks elsewhere: nothing of it goes to this store.
        Arc::new(blindfold_store::MemoryStore::new(geometry)) as Arc<dyn blindfold_store::Store>
    } else {
        open_store(&store_url, &array, geometry)
            .await
            .map_err(|e| GatewayError::Config(format!("opening the store {store_url}: {e}")))?
    };
    let store = match &wrap_store {
        Some(wrap) => wrap(store),
        None => store,
    };
    // The operator's view: every store request is counted (and fed to recording windows).
    let (view, engine_name, layout) = match hooks.engine {
        EngineKind::DirectBaseline => {
            (PhysicalView::Flat { cells: params.blocks }, "direct".to_owned(), "flat".to_owned())
        }
        EngineKind::PathOram => {
            let layout = match (params.two_slots(), params.tao_pack_levels()) {
                (false, _) => "in-place".to_owned(),
                (true, 1) => "two-slots".to_owned(),
                (true, l) => format!("two-slots, {l} tree levels per object"),
            };
            (physical_view(&params)?, params.engine.to_string(), layout)
        }
    };
    let mut observer = Observer::new();
    observer.set_info(&engine_name, &layout, params.block_size);
    let observer = Arc::new(observer);
    let stored_bytes = geometry.total_bytes();
    let store = observer.wrap_store(store, view, stored_bytes);
    let oram_dir = dir.join("oram");
    let id = store_id(&params)?;
    let recovered = |rec: blindfold_proxy::Recovery, notes: &mut Vec<String>| {
        if rec.replayed > 0 || rec.torn_bytes > 0 {
            notes.push(format!(
                "recovered after an unclean stop: replayed {} log records ({} cells)",
                rec.replayed, rec.cells_rewritten
            ));
        }
    };
    let engine: Arc<dyn SharedEngine> = if let Some(engine) = injected {
        engine
    } else if hooks.engine == EngineKind::DirectBaseline {
        let sealer = blindfold_crypto::CellSealer::new(&key, id, 0);
        Arc::new(DirectEngine::new(SealedDirect::new(store, sealer, params.block_size)?))
    } else if params.engine == OramEngine::Tee {
        let tee_store: Arc<dyn blindfold_store::TeeStore> =
            if matches!(store_url, StoreUrl::Remote { .. }) {
                // The trusted component runs in the storage server (`blindfold enclave`).
                let remote = blindfold_store::open_tee_store(&store_url, &array, geometry, None)
                    .await
                    .map_err(|e| {
                        GatewayError::Config(format!("opening the store {store_url}: {e}"))
                    })?;
                observer.wrap_tee_store(remote)
            } else {
                // No separate host: the trusted component runs in this process.
                let enclave = blindfold_tee::Enclave::new(
                    &DurableTee::tee_key(&key),
                    params.block_size as usize,
                );
                Arc::new(blindfold_store::TeeHost::new(store, Arc::new(enclave)))
            };
        if creating {
            let config = tee_config(&params)?;
            let none = blindfold_proxy::Preload::none();
            Arc::new(
                DurableTee::create(&oram_dir, config, tee_store, &key, id, none, &mut |_, _| {})
                    .await?,
            )
        } else {
            if previous.is_some() {
                return Err(GatewayError::Config(
                    "the tee engine cannot re-seal its cells under a new key: finish or undo the \
                     key rotation with another engine's data directory"
                        .into(),
                ));
            }
            let (engine, rec) = DurableTee::open(&oram_dir, tee_store, &key).await?;
            recovered(rec, notes);
            Arc::new(engine)
        }
    } else if matches!(
        params.engine,
        OramEngine::ObliviStore | OramEngine::Curious | OramEngine::CuriousPath
    ) {
        if creating {
            let config = oblivistore_config(&params)?;
            Arc::new(
                DurableObliviStore::create(&oram_dir, config, store, &key, id, &mut |_, _| {})
                    .await?,
            )
        } else {
            let (engine, rec) =
                DurableObliviStore::open_rotating(&oram_dir, store, &key, previous.as_ref())
                    .await?;
            recovered(rec, notes);
            Arc::new(engine)
        }
    } else if params.engine == OramEngine::Tao {
        if creating {
            let config = tao_config(&params)?;
            let pinned = params.tao_pinned_cells();
            let pack = params.tao_pack_levels();
            Arc::new(
                DurableTao::create_packed(&oram_dir, config, store, &key, id, pinned, pack).await?,
            )
        } else {
            let (engine, rec) =
                DurableTao::open_rotating(&oram_dir, store, &key, previous.as_ref()).await?;
            recovered(rec, notes);
            Arc::new(engine)
        }
    } else if creating {
        Arc::new(Serialized::new(
            DurablePathOram::create(&oram_dir, config.clone(), store, &key, id).await?,
        ))
    } else {
        let (engine, rec) =
            DurablePathOram::open_rotating(&oram_dir, store, &key, previous.as_ref()).await?;
        recovered(rec, notes);
        Arc::new(Serialized::new(engine))
    };
    let directory = Directory::open(&dir.join("meta.redb"), params.blocks, &key)?;
    let cells = engine_cells(&params)?;
    // The snapshot is needed only at shutdown and by `recover`: damage to it must not stop
    // the gateway from serving.
    let keys: Vec<&MasterKey> = std::iter::once(&*key).chain(previous.as_ref()).collect();
    let snapshots = match crate::snapshot::open(
        &store_url,
        &keys,
        params.blocks,
        cells,
        cached_bytes_of(&params)?,
    )
    .await
    {
        Ok(s) => Some(s),
        Err(e) => {
            let warning = format!(
                "the snapshot area in the store cannot be opened ({e}); serving anyway, but \
                     no snapshot will be written at shutdown, so `blindfold recover` would \
                     only find an older one: run `blindfold verify`"
            );
            tracing::warn!("{warning}");
            notes.push(warning);
            None
        }
    };
    let swappable = Arc::new(crate::engine::Swappable::new(engine));
    let watched = crate::engine::Watched::observed(
        Arc::clone(&swappable) as Arc<dyn SharedEngine>,
        Arc::clone(&observer),
    );
    let stopped = watched.subscribe();
    let objects =
        Arc::new(ObjectLayer::with_engine(directory, Arc::new(watched), params.pad_objects));
    let snapshots = Arc::new(parking_lot::Mutex::new(snapshots));
    let grower =
        (hooks.engine == EngineKind::PathOram && !injected_engine && params.engine.can_rebuild())
            .then(|| {
                Arc::new(crate::grow::Grower::new(crate::grow::GrowerParts {
                    dir: dir.clone(),
                    key: Arc::clone(&key),
                    engine: swappable,
                    objects: Arc::clone(&objects),
                    observer: Arc::clone(&observer),
                    wrap_store,
                    snapshots: Arc::clone(&snapshots),
                    rotating: previous.is_some(),
                }))
            });
    Ok(Opened {
        objects,
        params,
        notes: Vec::new(),
        credentials,
        new_credentials: false,
        stopped,
        key,
        previous_key: previous.map(Arc::new),
        rotation: None,
        data_dir: dir.clone(),
        snapshots,
        grower,
        grow_at: None,
        grow_max: None,
        swift_listener: None,
        limits: crate::listen::Limits::default(),
        observer,
    })
}

/// Why the gateway refuses a request before `s3s` authenticates it, if it does.
///
/// `s3s` compares legacy SigV2 signatures with ordinary equality (a timing side channel), so
/// nothing it would authenticate as SigV2 may reach it. This mirrors how `s3s` 0.14 picks the
/// scheme (`SignatureContext::check`), on the request as `s3s` parses it, erring towards refusal:
///
/// - a POST with a `multipart/form-data` body (a browser-form upload) is authenticated from
///   its form fields, as SigV2 when it has a `signature` field and no `x-amz-signature`. The
///   fields are known only once the body has been read, so every form POST is refused;
/// - a query string that, decoded as `s3s` decodes it, has a parameter named `Signature`
///   (a SigV2 presigned URL; `s3s` tries it before `X-Amz-Signature`);
/// - an `Authorization` header in the SigV2 form `AWS <access key>:<signature>`.
pub fn refusal<B>(req: &hyper::Request<B>) -> Option<&'static str> {
    let headers = |name| req.headers().get_all(name).into_iter().map(|v| v.as_bytes());
    let form = req.method() == hyper::Method::POST
        && headers(hyper::header::CONTENT_TYPE).any(|v| {
            let v = String::from_utf8_lossy(v).trim().to_ascii_lowercase();
            v.starts_with("multipart/form-data")
        });
    if form {
        return Some(
            "Browser-form (POST) uploads are not accepted; upload with a SigV4-signed PUT",
        );
    }
    // A query that does not decode is refused by `s3s` (InvalidURI) before any signature check.
    let query_v2 = req.uri().query().is_some_and(|q| {
        serde_urlencoded::from_str::<Vec<(String, String)>>(q)
            .is_ok_and(|pairs| pairs.iter().any(|(name, _)| name == "Signature"))
    });
    let header_v2 = headers(hyper::header::AUTHORIZATION).any(|v| v.starts_with(b"AWS "));
    (query_v2 || header_v2)
        .then_some("Signature Version 2 is not accepted; sign requests with SigV4")
}

fn refused(message: &str) -> s3s::HttpResponse {
    error_response(hyper::StatusCode::FORBIDDEN, "AccessDenied", message)
}

/// An S3 error answered by the gateway itself, before `s3s`.
fn error_response(status: hyper::StatusCode, code: &str, message: &str) -> s3s::HttpResponse {
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
         <Message>{message}</Message></Error>"
    );
    let mut resp = hyper::Response::new(s3s::Body::from(xml));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/xml"),
    );
    resp
}

/// The most a request body sent without a length (chunked transfer encoding, no
/// `Content-Length`) may hold.
pub const UNSIZED_BODY_LIMIT: usize = 16 << 20;

/// Whether a request body comes without the length `s3s` needs to check its payload hash:
/// chunked transfer encoding, no `Content-Length`, and no `aws-chunked` framing (which
/// carries its own decoded length). Such a body is read into memory first, up to
/// [`UNSIZED_BODY_LIMIT`].
fn needs_length(req: &hyper::Request<hyper::body::Incoming>) -> bool {
    use hyper::body::Body as _;
    let headers = req.headers();
    let streaming = headers
        .get("x-amz-content-sha256")
        .is_some_and(|v| v.as_bytes().starts_with(b"STREAMING-"));
    !headers.contains_key(hyper::header::CONTENT_LENGTH)
        && !streaming
        && !req.body().is_end_stream()
        && req.body().size_hint().exact().is_none()
}

/// Why a body without a length was not read.
#[derive(Debug)]
enum UnsizedBody {
    TooLarge,
    Broken,
}

/// Reads a whole body of at most `limit` bytes.
async fn read_limited(
    mut body: hyper::body::Incoming,
    limit: usize,
) -> std::result::Result<bytes::Bytes, UnsizedBody> {
    use hyper::body::Body as _;
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|_| UnsizedBody::Broken)?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(UnsizedBody::TooLarge);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

fn unsized_refused(e: UnsizedBody) -> s3s::HttpResponse {
    match e {
        UnsizedBody::TooLarge => error_response(
            hyper::StatusCode::LENGTH_REQUIRED,
            "MissingContentLength",
            "A body sent without Content-Length may hold at most 16 MiB; send Content-Length",
        ),
        UnsizedBody::Broken => error_response(
            hyper::StatusCode::BAD_REQUEST,
            "IncompleteBody",
            "The request body could not be read to its end",
        ),
    }
}

/// Whether a request asks for `100 Continue` before it sends its body.
fn expects_continue<B>(req: &hyper::Request<B>) -> bool {
    req.headers()
        .get(hyper::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// A request body that records whether it was read to its end.
#[derive(Debug)]
struct TrackedBody {
    inner: hyper::body::Incoming,
    read_all: Arc<AtomicBool>,
    observer: Arc<Observer>,
}

impl http_body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.observer.s3_received(data.len() as u64);
            }
        }
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            self.read_all.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Answers one HTTP request: what [`refusal`] names is refused, everything else goes to the S3 service.
///
/// The response says `Connection: close` when the connection cannot carry another request
/// cleanly (RFC 9110 §10.1.1):
///
/// - the request body was not read to its end (a request refused before its body, such as a
///   bad signature or an unknown upload id): hyper then closes the connection rather than
///   wait for a body that a client sending `Expect: 100-continue` will never send, and a
///   client must know before it reuses the connection;
/// - the request said `Expect: 100-continue` but has an empty body. hyper never sends
///   `100 Continue` for an empty body, only the final response (RFC 9110 allows it); botocore
///   (the aws CLI, boto3, git-remote-s3) then keeps that response's status line on the
///   connection and misreads the next response on it, so the next PUT hangs until its read
///   timeout (60 s). Closing makes botocore drop the connection and that state with it.
async fn handle(
    service: s3s::service::S3Service,
    observer: Arc<Observer>,
    req: hyper::Request<hyper::body::Incoming>,
) -> std::result::Result<s3s::HttpResponse, s3s::HttpError> {
    let started = std::time::Instant::now();
    let operation = s3_operation(&req);
    let name = observer.recording().then(|| object_name(req.uri().path()));
    // A HEAD answer carries the object's Content-Length but no body.
    let head = req.method() == hyper::Method::HEAD;
    let resp = handle_inner(service, Arc::clone(&observer), req).await?;
    let sent = resp
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .filter(|_| !head)
        .unwrap_or(0);
    observer.s3_sent(sent);
    observer.s3(operation, resp.status().as_u16(), started.elapsed(), name);
    Ok(resp)
}

/// The S3 operation a request asks for, from its method, path and query (a fixed set of
/// names, so it can label a metric; never the bucket or key).
pub fn s3_operation<B>(req: &hyper::Request<B>) -> &'static str {
    use hyper::Method;
    let path = req.uri().path().trim_start_matches('/');
    let query = req.uri().query().unwrap_or("");
    let has = |k: &str| query.split('&').any(|p| p.split('=').next().is_some_and(|name| name == k));
    let (bucket, key) = match path.split_once('/') {
        Some((b, k)) => (b, k),
        None => (path, ""),
    };
    let copy = req.headers().contains_key("x-amz-copy-source");
    let m = req.method();
    if bucket.is_empty() {
        return if *m == Method::GET { "ListBuckets" } else { "Other" };
    }
    if key.is_empty() {
        return match *m {
            Method::GET if has("uploads") => "ListMultipartUploads",
            Method::GET if has("location") => "GetBucketLocation",
            Method::GET if has("versioning") => "GetBucketVersioning",
            Method::GET if has("list-type") => "ListObjectsV2",
            Method::GET
                if query.is_empty() || has("prefix") || has("delimiter") || has("marker") =>
            {
                "ListObjects"
            }
            Method::PUT if query.is_empty() => "CreateBucket",
            Method::HEAD => "HeadBucket",
            Method::DELETE if query.is_empty() => "DeleteBucket",
            Method::POST if has("delete") => "DeleteObjects",
            _ => "OtherBucket",
        };
    }
    match *m {
        Method::GET if has("uploadId") => "ListParts",
        Method::GET if query.is_empty() || !has("tagging") && !has("acl") => "GetObject",
        Method::HEAD => "HeadObject",
        Method::PUT if has("partNumber") && has("uploadId") && copy => "UploadPartCopy",
        Method::PUT if has("partNumber") && has("uploadId") => "UploadPart",
        Method::PUT if copy => "CopyObject",
        Method::PUT if query.is_empty() => "PutObject",
        Method::POST if has("uploads") => "CreateMultipartUpload",
        Method::POST if has("uploadId") => "CompleteMultipartUpload",
        Method::DELETE if has("uploadId") => "AbortMultipartUpload",
        Method::DELETE => "DeleteObject",
        _ => "OtherObject",
    }
}

/// `bucket/key` of a path-style request, decoded, for a recording window (bounded length).
fn object_name(path: &str) -> String {
    let decoded = percent_encoding::percent_decode_str(path.trim_start_matches('/'))
        .decode_utf8_lossy()
        .into_owned();
    decoded.chars().take(256).collect()
}

async fn handle_inner(
    service: s3s::service::S3Service,
    observer: Arc<Observer>,
    req: hyper::Request<hyper::body::Incoming>,
) -> std::result::Result<s3s::HttpResponse, s3s::HttpError> {
    let expect_continue = expects_continue(&req);
    let empty = hyper::body::Body::is_end_stream(req.body());
    let read_all = Arc::new(AtomicBool::new(empty));
    let mut resp = if let Some(why) = refusal(&req) {
        refused(why)
    } else if needs_length(&req) {
        let (parts, body) = req.into_parts();
        match read_limited(body, UNSIZED_BODY_LIMIT).await {
            Ok(body) => {
                observer.s3_received(body.len() as u64);
                read_all.store(true, Ordering::Release);
                let req = hyper::Request::from_parts(parts, s3s::Body::from(body));
                service.call(req).await?
            }
            Err(e) => unsized_refused(e),
        }
    } else {
        let tracked = Arc::clone(&read_all);
        let req = req
            .map(|inner| s3s::Body::http_body(TrackedBody { inner, read_all: tracked, observer }));
        service.call(req).await?
    };
    if resp.status().is_client_error() || resp.status().is_server_error() {
        explain(&mut resp);
    }
    if (expect_continue && empty) || !read_all.load(Ordering::Acquire) {
        resp.headers_mut()
            .insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    Ok(resp)
}

/// The standard message of an S3 error code, as S3 words it.
fn standard_message(code: &str) -> Option<&'static str> {
    Some(match code {
        "AccessDenied" => "Access Denied",
        "BadDigest" => "The Content-MD5 you specified did not match what we received.",
        "BucketAlreadyOwnedByYou" => {
            "Your previous request to create the named bucket succeeded and you already own it."
        }
        "BucketNotEmpty" => "The bucket you tried to delete is not empty",
        "EntityTooLarge" => "Your proposed upload exceeds the maximum allowed object size.",
        "EntityTooSmall" => "Your proposed upload is smaller than the minimum allowed object size.",
        "IncompleteBody" => {
            "You did not provide the number of bytes specified by the Content-Length HTTP header."
        }
        "InternalError" => "We encountered an internal error. Please try again.",
        "InvalidAccessKeyId" => "The AWS Access Key Id you provided does not exist in our records.",
        "InvalidArgument" => "Invalid Argument",
        "InvalidBucketName" => "The specified bucket is not valid.",
        "InvalidDigest" => "The Content-MD5 you specified is not valid.",
        "InvalidPart" => {
            "One or more of the specified parts could not be found. The part may not have been \
             uploaded, or the specified entity tag may not match the part's entity tag."
        }
        "InvalidPartOrder" => {
            "The list of parts was not in ascending order. The parts list must be specified in \
             order by part number."
        }
        "InvalidRange" => "The requested range is not satisfiable",
        "InvalidRequest" => "Invalid Request",
        "InvalidURI" => "Couldn't parse the specified URI.",
        "KeyTooLongError" => "Your key is too long.",
        "MalformedXML" => {
            "The XML you provided was not well-formed or did not validate against our published \
             schema."
        }
        "MaxMessageLengthExceeded" => "Your request was too big.",
        "MethodNotAllowed" => "The specified method is not allowed against this resource.",
        "MissingContentLength" => "You must provide the Content-Length HTTP header.",
        "NoSuchBucket" => "The specified bucket does not exist",
        "NoSuchKey" => "The specified key does not exist.",
        "NoSuchUpload" => {
            "The specified multipart upload does not exist. The upload ID might be invalid, or \
             the multipart upload might have been aborted or completed."
        }
        "NotImplemented" => "A header you provided implies functionality that is not implemented.",
        "PreconditionFailed" => "At least one of the preconditions you specified did not hold.",
        "RequestTimeTooSkewed" => {
            "The difference between the request time and the current time is too large."
        }
        "SignatureDoesNotMatch" => {
            "The request signature we calculated does not match the signature you provided. \
             Check your key and signing method."
        }
        "XAmzContentSHA256Mismatch" => {
            "The provided 'x-amz-content-sha256' header does not match what was computed."
        }
        _ => return None,
    })
}

/// Gives an S3 error response without a `<Message>` (as `s3s` sends its own errors and codes
/// raised without one) the standard message of its code, so that clients print more than
/// "Unknown"; and logs the refusal once, at debug level for a client error.
fn explain(resp: &mut s3s::HttpResponse) {
    let status = resp.status().as_u16();
    let Some(xml) = resp.body().bytes() else { return };
    let text = String::from_utf8_lossy(&xml);
    let code = text
        .split_once("<Code>")
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map(|(code, _)| code.to_string());
    match &code {
        Some(code) if status < 500 => tracing::debug!(status, code, "request refused"),
        Some(code) => tracing::warn!(status, code, "request failed"),
        None => tracing::debug!(status, "request refused"),
    }
    let Some(message) = code.as_deref().and_then(standard_message) else { return };
    if text.contains("<Message>") {
        return;
    }
    let tag = "</Code>";
    let Some(at) = text.find(tag).map(|i| i + tag.len()) else { return };
    let body = format!("{}<Message>{message}</Message>{}", &text[..at], &text[at..]);
    *resp.body_mut() = s3s::Body::from(body);
    resp.headers_mut().remove(hyper::header::CONTENT_LENGTH);
}

/// Builds the S3 service for an opened gateway: the administrator's keys and the users of
/// `<data-dir>/users.sealed` sign requests; each user's policy is enforced on every operation.
pub fn service(opened: &Opened) -> s3s::service::S3Service {
    let access = crate::users::SharedAccess(access(opened));
    let gateway = Gateway::new(Arc::clone(&opened.objects)).with_access(Arc::clone(&access.0));
    let mut b = s3s::service::S3ServiceBuilder::new(gateway);
    b.set_auth(access.clone());
    b.set_access(access);
    b.build()
}

/// Who may do what: the administrator's keys and the users file, for every front end.
fn access(opened: &Opened) -> Arc<crate::users::Access> {
    Arc::new(crate::users::Access::new(
        opened.credentials.clone(),
        Some(
            crate::users::UserFile::new(&opened.data_dir, &opened.key)
                .with_previous(opened.previous_key.as_deref()),
        ),
    ))
}

/// Serves S3 on `listener` until `shutdown` resolves, then commits and checkpoints.
pub async fn run(
    opened: Opened,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    run_tls(opened, listener, None, shutdown).await
}

/// [`run`], over TLS when `tls` is given (every connection then starts with a handshake; a
/// client speaking plain HTTP is dropped).
pub async fn run_tls(
    mut opened: Opened,
    listener: tokio::net::TcpListener,
    tls: Option<crate::tls::Tls>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let sweeper = opened.rotation.take().map(|rotation| {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let engine = Arc::clone(opened.objects.engine());
        let ending = crate::rotation::Ending {
            dir: opened.data_dir.clone(),
            key: Arc::clone(&opened.key),
            snapshots: Arc::clone(&opened.snapshots),
        };
        let task = tokio::spawn(async move {
            if let Err(e) = crate::rotation::sweep(engine, rotation, ending, stopped).await {
                tracing::error!(error = %e, "the key rotation stopped; the next start resumes it");
            }
        });
        (stop, task)
    });
    let grow_watch = opened.grower.clone().map(|grower| {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task =
            tokio::spawn(crate::grow::watch(grower, opened.grow_at, opened.grow_max, stopped));
        (stop, task)
    });
    let swift = opened.swift_listener.take().map(|listener| {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let front = Arc::new(crate::swift::Swift::new(
            Arc::clone(&opened.objects),
            access(&opened),
            tls.is_some(),
        ));
        let task = tokio::spawn(crate::swift::serve(
            listener,
            front,
            tls.clone(),
            opened.limits.clone(),
            stopped,
        ));
        (stop, task)
    });
    let service = service(&opened);
    let observer = Arc::clone(&opened.observer);
    let make_svc = || {
        let (service, observer) = (service.clone(), Arc::clone(&observer));
        hyper::service::service_fn(move |req| handle(service.clone(), Arc::clone(&observer), req))
    };
    crate::listen::accept_until(&listener, tls.as_ref(), &opened.limits, "s3", make_svc, shutdown)
        .await;
    if let Some((stop, task)) = sweeper {
        // The sweep stops between two chunks (never inside an access).
        let _ = stop.send(true);
        let _ = task.await;
    }
    if let Some((stop, task)) = swift {
        let _ = stop.send(true);
        let _ = task.await;
    }
    if let Some((stop, task)) = grow_watch {
        // A growth under way is finished first.
        let _ = stop.send(true);
        let _ = task.await;
    }
    tracing::info!("shutting down: committing ORAM state");
    let objects = Arc::clone(&opened.objects);
    objects.shutdown().await?;
    if objects.engine_is_durable() {
        if opened.snapshots.lock().is_some() {
            write_snapshot(&opened).await?;
        } else {
            tracing::warn!("no snapshot written: the snapshot area could not be opened at start");
        }
    }
    Ok(())
}

/// Writes the encrypted snapshot of the trusted state to the store. Call with the ORAM
/// committed and checkpointed and no traffic (clean shutdown).
pub async fn write_snapshot(opened: &Opened) -> Result<u64> {
    Ok(write_snapshot_to(
        &opened.snapshots,
        &opened.key,
        opened.previous_key.as_deref(),
        &opened.data_dir,
        &opened.objects,
        0,
    )
    .await?
    .0)
}

/// Writes a snapshot of the data directory `dir` (parameters and checkpoint as on disk, the
/// directory of `objects`) to the array in `slot`, numbered after both the newest one there
/// and `min_seq`; then names that array in the snapshot index. Returns its number and the
/// arrays a growth left behind that this snapshot made unneeded and that were removed.
pub(crate) async fn write_snapshot_to(
    slot: &crate::snapshot::SnapshotSlot,
    key: &MasterKey,
    previous: Option<&MasterKey>,
    dir: &Path,
    objects: &ObjectLayer,
    min_seq: u64,
) -> Result<(u64, Vec<String>)> {
    let Some(mut array) = slot.lock().clone() else {
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
    let params = read_params(dir)?
        .ok_or_else(|| GatewayError::Config(format!("{}: no gateway.json", dir.display())))?;
    let snap = crate::snapshot::Snapshot {
        seq,
        created_ns: crate::directory::now_ns(),
        params,
        oram_checkpoint,
        directory: objects.directory().dump()?,
    };
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
    crate::snapshot::point_index(&array, key).await?;
    tracing::info!(seq, array = %array.name, "wrote the encrypted snapshot of the trusted state to the store");
    // The newest snapshot names only the arrays in use now: what growths retired can go.
    let in_use = [oram_array(snap.params.generation), array.name.clone()];
    let removed =
        crate::grow::remove_retired(dir, &snap.params, array.replaces.as_deref(), &in_use).await;
    Ok((seq, removed))
}

/// Marks a data directory that `recover` is filling; removed (with `gateway.json` written)
/// when it is done. A directory with this mark and no `gateway.json` holds a half-made
/// recovery, which the next `recover` clears and starts again.
const RECOVERING: &str = "recovering";

/// Rebuilds a data directory from the store's newest snapshot and the key, then opens it.
/// Returns the opened gateway and a description of what was done, for the operator.
///
/// The snapshot's tree is not continued but rebuilt ([`blindfold_proxy::rebuild`]): every
/// cell of the snapshot's store array is read and authenticated, and the blocks found are
/// loaded into a fresh tree with fresh random leaves, sealed under a fresh random key epoch,
/// in a new store array (the next [`GatewayParams::generation`]). Objects that had a block in a
/// cell the lost gateway rewrote after the snapshot (or that fails authentication for any
/// other reason) are dropped from the directory and named in the description. The old array
/// is left untouched; the operator can delete it afterwards.
pub async fn recover(cfg: &ServeConfig) -> Result<(Opened, String)> {
    recover_until(cfg, None).await
}

/// Where a test can cut a `recover` short, as a crash at that instant would.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoverCrash {
    /// A quarter of the new array is written.
    HalfWritten,
    /// The engine's checkpoint names the rebuilt engine; the directory is not restored yet.
    AfterRebuild,
    /// The directory is restored; `gateway.json` is not written yet.
    AfterDirectory,
}

/// [`recover`], stopping as a crash would at `crash` (tests).
#[doc(hidden)]
pub async fn recover_until(
    cfg: &ServeConfig,
    crash: Option<RecoverCrash>,
) -> Result<(Opened, String)> {
    let simulated = |at: RecoverCrash| GatewayError::Config(format!("simulated crash at {at:?}"));
    let dir = &cfg.data_dir;
    if dir.join("gateway.json").exists() {
        return Err(GatewayError::Config(format!(
            "{} already holds a gateway; recover into a new, empty directory",
            dir.display()
        )));
    }
    let url = cfg.store.clone().ok_or_else(|| {
        GatewayError::Config("--store is required: recovery reads the store's snapshot".into())
    })?;
    let key_path = cfg.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    let key = load_key_file(&key_path, cfg.passphrase.as_deref())
        .map_err(|e| GatewayError::Config(e.to_string()))?;
    let snaps = crate::snapshot::open_for_recovery(&url, &key).await?;
    let snap = crate::snapshot::read_latest(&*snaps, &key).await?;
    drop(snaps);
    let cfg_err = |what: &str, p: &Path, e: std::io::Error| {
        GatewayError::Config(format!("{what} {}: {e}", p.display()))
    };
    let oram_dir = dir.join("oram");
    if dir.join(RECOVERING).exists() {
        // An earlier recover stopped half-way: nothing of it is in use yet.
        for leftover in [oram_dir.clone(), dir.join("meta.redb")] {
            let removed = if leftover.is_dir() {
                std::fs::remove_dir_all(&leftover)
            } else {
                std::fs::remove_file(&leftover)
            };
            match removed {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(cfg_err("removing", &leftover, e))
                }
                _ => {}
            }
        }
    }
    std::fs::create_dir_all(&oram_dir).map_err(|e| cfg_err("creating", &oram_dir, e))?;
    write_private(&dir.join(RECOVERING), b"")?;
    let mut params = snap.params.clone();
    params.store = url.to_string();
    let old_array = oram_array(params.generation);
    params.generation = params
        .generation
        .checked_add(1)
        .ok_or_else(|| GatewayError::Config("store array generations exhausted".into()))?;
    let new_array = oram_array(params.generation);
    let geometry = oram_geometry(&params)?;
    let open_array = |name: String| {
        let url = url.clone();
        async move {
            open_store(&url, &name, geometry)
                .await
                .map_err(|e| GatewayError::Config(format!("opening store array {name}: {e}")))
        }
    };
    let old = open_array(old_array.clone()).await?;
    let new = open_array(new_array.clone()).await?;
    let new = match crash {
        Some(RecoverCrash::HalfWritten) => crate::grow::cut_short(new),
        _ => new,
    };
    write_private(&oram_dir.join("checkpoint.bin"), &snap.oram_checkpoint)?;
    let epoch = blindfold_proxy::rebuild::fresh_epoch();
    let rebuilt = match params.engine {
        OramEngine::Tao => {
            blindfold_proxy::rebuild::rebuild_tao(&oram_dir, old, new, &key, epoch).await?
        }
        OramEngine::PathOram => {
            blindfold_proxy::rebuild::rebuild_path_oram(&oram_dir, old, new, &key, epoch).await?
        }
        OramEngine::Tee => {
            return Err(GatewayError::Config(
                "`blindfold recover` cannot rebuild a tee engine's data directory yet (its cells \
                 are re-permuted only by its trusted component); restore the data directory \
                 from a backup instead"
                    .into(),
            ))
        }
        OramEngine::ObliviStore | OramEngine::Curious | OramEngine::CuriousPath => {
            blindfold_proxy::rebuild::rebuild_oblivistore(&oram_dir, old, new, &key, epoch).await?
        }
    };
    if crash == Some(RecoverCrash::AfterRebuild) {
        return Err(simulated(RecoverCrash::AfterRebuild));
    }
    // Objects and uploads with a lost block are dropped: reading them would give zeros.
    let lost: std::collections::HashSet<u64> = rebuilt.lost.iter().copied().collect();
    let mut directory = snap.directory;
    let mut dropped = Vec::new();
    let mut freed = Vec::new();
    directory.objects.retain(|(bucket, key, meta)| {
        let keep = !meta.blocks().any(|b| lost.contains(&b));
        if !keep {
            dropped.push(format!("{bucket}/{key}"));
            freed.extend(meta.blocks());
        }
        keep
    });
    directory.uploads.retain(|(_, up)| {
        let keep = !up.parts.values().any(|p| p.extent.blocks.iter().any(|b| lost.contains(b)));
        if !keep {
            freed.extend(up.parts.values().flat_map(|p| p.extent.blocks.iter().copied()));
        }
        keep
    });
    directory.free.extend(freed);
    directory.free.sort_unstable();
    directory.free.dedup();
    Directory::restore(&dir.join("meta.redb"), params.blocks, &directory, &key)?;
    if crash == Some(RecoverCrash::AfterDirectory) {
        return Err(simulated(RecoverCrash::AfterDirectory));
    }
    // Last: gateway.json makes the directory a gateway (written atomically).
    write_private(&dir.join("gateway.json"), &serde_json::to_vec_pretty(&params).expect("json"))?;
    sync_dir(dir)?;
    std::fs::remove_file(dir.join(RECOVERING))
        .map_err(|e| cfg_err("removing", &dir.join(RECOVERING), e))?;
    let when = time::OffsetDateTime::from_unix_timestamp_nanos(snap.created_ns)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| "unknown time".into());
    let mut about = format!(
        "snapshot #{} written {} ({} buckets, {} objects); rebuilt {} blocks into store array \
         {} under a fresh key epoch; the old array {} is no longer used and may be deleted",
        snap.seq,
        when,
        directory.buckets.len(),
        directory.objects.len(),
        rebuilt.blocks_found,
        new_array,
        old_array
    );
    if !rebuilt.unreadable_cells.is_empty() {
        about.push_str(&format!(
            "; {} cells changed after the snapshot (the gateway wrote after its last clean \
             stop) or failed authentication: {} objects in them are lost",
            rebuilt.unreadable_cells.len(),
            dropped.len()
        ));
        for name in dropped.iter().take(20) {
            about.push_str(&format!("\n    lost: {name}"));
        }
        if dropped.len() > 20 {
            about.push_str(&format!("\n    … and {} more", dropped.len() - 20));
        }
    }
    let mut cfg = cfg.clone();
    cfg.key_file = Some(key_path);
    let opened = open(&cfg).await?;
    Ok((opened, about))
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| GatewayError::Config(format!("syncing {}: {e}", dir.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, headers: &[(&str, &str)], uri: &str) -> hyper::Request<()> {
        let mut b = hyper::Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            b = b.header(*name, *value);
        }
        b.body(()).unwrap()
    }

    fn get(auth: Option<&str>, uri: &str) -> hyper::Request<()> {
        let auth: Vec<_> = auth.map(|a| ("authorization", a)).into_iter().collect();
        req("GET", &auth, uri)
    }

    #[test]
    fn the_cache_default_follows_the_engine_and_the_store() {
        let s3: StoreUrl = "s3://bucket/prefix".parse().unwrap();
        let file: StoreUrl = "file:///tmp/x".parse().unwrap();
        assert_eq!(default_cache_mib(OramEngine::Tao, Some(&s3)), S3_CACHE_MIB);
        assert_eq!(default_cache_mib(OramEngine::Tao, Some(&file)), DEFAULT_CACHE_MIB);
        assert_eq!(default_cache_mib(OramEngine::Tao, None), DEFAULT_CACHE_MIB);
        assert_eq!(default_cache_mib(OramEngine::PathOram, Some(&s3)), PATH_ORAM_CACHE_MIB);
    }

    #[test]
    fn s3_operations_are_named_from_method_path_and_query() {
        let copy = [("x-amz-copy-source", "/b/src")];
        for (method, headers, uri, want) in [
            ("GET", &[][..], "/", "ListBuckets"),
            ("PUT", &[][..], "/b", "CreateBucket"),
            ("HEAD", &[][..], "/b", "HeadBucket"),
            ("DELETE", &[][..], "/b", "DeleteBucket"),
            ("GET", &[][..], "/b?list-type=2&prefix=x", "ListObjectsV2"),
            ("GET", &[][..], "/b?prefix=x", "ListObjects"),
            ("GET", &[][..], "/b?location", "GetBucketLocation"),
            ("GET", &[][..], "/b?uploads", "ListMultipartUploads"),
            ("POST", &[][..], "/b?delete", "DeleteObjects"),
            ("GET", &[][..], "/b/k/with/slashes", "GetObject"),
            ("GET", &[][..], "/b/k?versionId=null", "GetObject"),
            ("GET", &[][..], "/b/k?tagging", "OtherObject"),
            ("HEAD", &[][..], "/b/k", "HeadObject"),
            ("PUT", &[][..], "/b/k", "PutObject"),
            ("PUT", &copy[..], "/b/k", "CopyObject"),
            ("PUT", &[][..], "/b/k?partNumber=2&uploadId=u", "UploadPart"),
            ("PUT", &copy[..], "/b/k?partNumber=2&uploadId=u", "UploadPartCopy"),
            ("POST", &[][..], "/b/k?uploads", "CreateMultipartUpload"),
            ("POST", &[][..], "/b/k?uploadId=u", "CompleteMultipartUpload"),
            ("GET", &[][..], "/b/k?uploadId=u", "ListParts"),
            ("DELETE", &[][..], "/b/k?uploadId=u", "AbortMultipartUpload"),
            ("DELETE", &[][..], "/b/k", "DeleteObject"),
            ("PATCH", &[][..], "/", "Other"),
        ] {
            assert_eq!(s3_operation(&req(method, headers, uri)), want, "{method} {uri}");
        }
    }

    /// The TaoStore engine's tree top fills its budget: whole levels and the left part of the
    /// next, never the leaves; a budget of exactly three levels pins three.
    #[test]
    fn the_tao_tree_top_fills_its_memory_budget() {
        let p = GatewayParams {
            format: "blindfold-gateway".into(),
            version: PARAMS_VERSION,
            store: "memory:".into(),
            store_id: "00".repeat(16),
            block_size: 1024,
            blocks: 1024,
            z: 4,
            pad_objects: false,
            cache_levels: 0,
            cache_cells: 0,
            pack_levels: 0,
            engine: OramEngine::Tao,
            generation: 0,
        };
        let t = tao_config(&p).unwrap();
        let cell = u64::from(t.geometry().unwrap().cell_size());
        let inner = t.shape().buckets() - t.shape().leaves();
        assert_eq!(inner, 255, "1024 blocks, Z = 4: 256 leaves");
        assert_eq!(tao_pinned_for(&p, 0).unwrap(), (0, 0));
        assert_eq!(tao_pinned_for(&p, 7 * cell).unwrap(), (3, 7));
        assert_eq!(tao_pinned_for(&p, 11 * cell + cell - 1).unwrap(), (3, 11));
        assert_eq!(tao_pinned_for(&p, 1 << 40).unwrap(), (8, 255));
        let (cache_levels, cache_cells) = tao_pinned_for(&p, 11 * cell).unwrap();
        let p = GatewayParams { cache_levels, cache_cells, ..p };
        assert_eq!(p.tao_pinned_cells(), 11);
        assert_eq!(p.cache_summary().unwrap(), "3 tree levels and 50 % of the next");
        assert_eq!(cached_bytes_of(&p).unwrap(), 11 * cell);
        // A directory made before partial levels: its whole levels, as before.
        let old = GatewayParams { cache_cells: 0, ..p };
        assert_eq!(old.tao_pinned_cells(), 7);
        assert_eq!(old.cache_summary().unwrap(), "3 tree levels");
    }

    #[test]
    fn object_names_for_windows_are_decoded_and_bounded() {
        assert_eq!(object_name("/b/a%20b/%C3%A9"), "b/a b/é");
        assert_eq!(object_name(&format!("/b/{}", "x".repeat(1000))).chars().count(), 256);
    }

    #[test]
    fn what_s3s_would_check_as_sigv2_is_refused() {
        let v2 = |r: &hyper::Request<()>| refusal(r).is_some_and(|m| m.contains("Version 2"));
        assert!(v2(&get(Some("AWS AKID:c2lnbmF0dXJl"), "/b/k")));
        assert!(v2(&get(None, "/b/k?AWSAccessKeyId=A&Expires=1&Signature=abc")));
        // The parameter name as s3s decodes it, not as sent.
        assert!(v2(&get(None, "/b/k?AWSAccessKeyId=A&Expires=1&%53ignature=abc")));
        assert!(v2(&get(None, "/b/k?AWSAccessKeyId=A&Expires=1&Sig%6eature=abc")));
        // s3s tries SigV2 before SigV4: a dummy X-Amz-Signature does not make it SigV4.
        assert!(v2(&get(None, "/b/k?AWSAccessKeyId=A&Expires=1&Signature=a&X-Amz-Signature=b")));
        // Any Authorization header in the SigV2 form, even beside another one.
        let two = [("authorization", "AWS4-HMAC-SHA256 x"), ("authorization", "AWS A:s")];
        assert!(v2(&req("GET", &two, "/b/k")));
    }

    #[test]
    fn browser_form_posts_are_refused() {
        for ct in ["multipart/form-data; boundary=x", " Multipart/Form-Data;boundary=x"] {
            let r = req("POST", &[("content-type", ct)], "/b");
            assert!(refusal(&r).is_some_and(|m| m.contains("POST")), "{ct:?}");
        }
        // Other POSTs (multipart uploads, DeleteObjects) are not form uploads.
        assert_eq!(
            refusal(&req("POST", &[("content-type", "application/xml")], "/b?delete")),
            None
        );
        assert_eq!(refusal(&req("POST", &[], "/b/k?uploads")), None);
    }

    #[test]
    fn sigv4_and_anonymous_requests_pass() {
        let v4 = "AWS4-HMAC-SHA256 Credential=A/2026/us-east-1/s3/aws4_request, \
                  SignedHeaders=host, Signature=ab";
        assert_eq!(refusal(&get(Some(v4), "/b/k")), None);
        let presigned = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=ab";
        assert_eq!(refusal(&get(None, presigned)), None);
        assert_eq!(refusal(&get(None, "/b/k?signature=lower-case-is-not-sigv2")), None);
        assert_eq!(refusal(&get(None, "/b/k")), None);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("512k"), Ok(512 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("1XB").is_err());
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5KB"), Ok(1500));
        assert_eq!(parse_size("0.5"), Ok(0));
        assert!(parse_size(".").is_err());
        assert!(parse_size("1.2.3GiB").is_err());
        assert!(parse_size("99999999999TiB").is_err());
    }
}
