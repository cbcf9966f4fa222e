//! The engine catalogue: every oblivious engine the gateway, the nodes, the CLI and the benches
//! can run, with what each needs to know about it in one place.
//!
//! * [`OramEngine`] — the engines, as named on the command line and in `gateway.json`.
//! * [`EngineParams`] — the public parameters a data directory is created with (its
//!   `gateway.json`): engine, capacity, block size, layout, tree top kept in memory.
//! * Per-engine configuration derived from them ([`tao_config`], [`oram_config`],
//!   [`tee_config`], [`oblivistore_config`] with the CURIOUS constants), the store's shape
//!   ([`oram_geometry`], [`engine_cells`]), what an operator's recording shows of it
//!   ([`physical_view`]), and the defaults ([`default_cache_mib`]).
//!
//! Callers ask the catalogue instead of matching on engines themselves, so that adding an
//! engine means adding it here (and to [`crate::engine`]), not in every front end.

use blindfold_oram::oblivistore::ObliviStoreConfig;
use blindfold_oram::tee::TeeOramConfig;
use blindfold_oram::{PathOramConfig, PosMapMode};
use std::sync::Arc;

use blindfold_crypto::StoreId;
use blindfold_store::{CellId, Geometry, Store, StoreUrl, TeeStore};
use serde::{Deserialize, Serialize};

use crate::{
    DurableObliviStore, DurablePathOram, DurableTao, DurableTee, ProxyError, Result,
    SealedPathOram, TaoConfig,
};

/// Name of the store array holding the ORAM.
const ARRAY: &str = "oram";

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

/// Format version of new data directories (see [`EngineParams::version`]).
pub const PARAMS_VERSION: u32 = 2;

/// Public parameters fixed when a data directory is created.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EngineParams {
    /// Always "blindfold-gateway".
    pub format: String,
    /// Format version: 1 = the ORAM's store holds one copy of each cell, overwritten in place
    /// (commits log every cell first); 2 = two slots per cell (commits write the free slot
    /// and log only which cells moved; see `crate::SlottedStore`). New directories
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
    /// object, as every directory made before packing; see `crate::PackedStore`).
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

pub fn tao_config(params: &EngineParams) -> Result<TaoConfig> {
    TaoConfig::builder(params.blocks, params.block_size)
        .z(params.z)
        .write_back_every(TAO_WRITE_BACK_EVERY)
        .build()
        .map_err(|e| ProxyError::Config(e.to_string()))
}

/// The TEE engine's tree: rounds of `blocks / 64` queries (8 to the engine's default 450), arity 8,
/// halved until what one layer of a round works on (three buffers of a node and the blocks
/// coming down, plus the blocks that go up) fits a storage server's default 64 MiB frames.
pub fn tee_config(params: &EngineParams) -> Result<TeeOramConfig> {
    let mut k =
        (params.blocks / 64).clamp(8, u64::from(blindfold_oram::tee::DEFAULT_ROUND_QUERIES)) as u32;
    let cell = blindfold_tee::cell_len(params.block_size as usize) as u64;
    loop {
        let config = TeeOramConfig::builder(params.blocks, params.block_size)
            .round_queries(k)
            .build()
            .map_err(|e| ProxyError::Config(e.to_string()))?;
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
pub fn oblivistore_config(params: &EngineParams) -> Result<ObliviStoreConfig> {
    if params.engine == OramEngine::Curious {
        ObliviStoreConfig::curious(params.blocks, params.block_size, CURIOUS_B)
    } else if params.engine == OramEngine::CuriousPath {
        ObliviStoreConfig::curious_path(params.blocks, params.block_size, CURIOUS_B, CURIOUS_Z)
    } else {
        ObliviStoreConfig::new(params.blocks, params.block_size)
    }
    .map_err(|e| ProxyError::Config(e.to_string()))
}

/// Cells of the ObliviStore engine's store.
pub fn oblivistore_cells(params: &EngineParams) -> Result<u64> {
    oblivistore_config(params)?
        .total_cells()
        .ok_or_else(|| ProxyError::Config("too many cells for one store".into()))
}

pub fn oram_config(params: &EngineParams) -> Result<PathOramConfig> {
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
        .map_err(|e| ProxyError::Config(e.to_string()))
}

/// What the operator's recordings show of the ORAM's store array (see [`PhysicalView`]).
pub fn physical_view(params: &EngineParams) -> Result<PhysicalView> {
    let (copy_cells, leaves) = match params.engine {
        OramEngine::PathOram => {
            let config = oram_config(params)?;
            (config.total_cells(), config.trees()[0].shape.leaves())
        }
        OramEngine::Tao if params.two_slots() && params.tao_pack_levels() > 1 => {
            let t = tao_config(params)?;
            let p = crate::Packing::new(t.shape().levels(), params.tao_pack_levels())
                .map_err(|e| ProxyError::Config(e.to_string()))?;
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
pub fn engine_cells(params: &EngineParams) -> Result<u64> {
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
pub fn oram_geometry(params: &EngineParams) -> Result<blindfold_store::Geometry> {
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

impl EngineParams {
    /// Whether the ORAM's store holds two slots per cell (format version 2 and later).
    pub fn two_slots(&self) -> bool {
        self.version >= 2
    }
}

/// The most top levels of the data tree whose buckets fit in `budget` bytes, leaving at least
/// one level in the store. Each cached level halves nothing but saves one bucket read and
/// write per access, and costs twice the memory of the one above it.
pub fn cache_levels_for(params: &EngineParams, budget: u64) -> Result<u32> {
    let config = oram_config(&EngineParams { cache_levels: 0, ..params.clone() })?;
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
pub fn tao_pinned_for(params: &EngineParams, budget: u64) -> Result<(u32, u64)> {
    let t = tao_config(params)?;
    let cell = u64::from(t.geometry()?.cell_size());
    let inner = t.shape().buckets() - t.shape().leaves();
    let cells = (budget / cell).min(inner);
    Ok(((cells + 1).ilog2(), cells))
}

impl EngineParams {
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
        let packing = crate::Packing::new(shape.levels(), self.tao_pack_levels()).ok()?;
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
    /// [`EngineParams::cache_cells`]).
    pub fn tao_pinned_cells(&self) -> u64 {
        if self.cache_cells > 0 {
            self.cache_cells
        } else {
            crate::PinnedCells::for_levels(self.cache_levels)
        }
    }

    /// Buckets of the data tree kept in trusted memory, with any engine.
    pub fn cached_cells(&self) -> u64 {
        if self.engine == OramEngine::Tao {
            self.tao_pinned_cells()
        } else {
            crate::PinnedCells::for_levels(self.cache_levels)
        }
    }

    /// The cached tree top for people: "3 tree levels", "10 tree levels and 57 % of the next".
    pub fn cache_summary(&self) -> Option<String> {
        let whole = crate::PinnedCells::for_levels(self.cache_levels);
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

/// Bytes of tree top the engine of `params` keeps in trusted memory, at most.
pub fn cached_bytes_of(params: &EngineParams) -> Result<u64> {
    if params.engine == OramEngine::Tao && params.cache_cells > 0 {
        let cell = u64::from(tao_config(params)?.geometry()?.cell_size());
        return Ok(params.cache_cells * cell);
    }
    // (Directories made before partial levels keep the estimate their snapshot area was
    // sized with.)
    Ok(cached_bytes(&oram_config(params)?))
}

pub fn cached_bytes(config: &PathOramConfig) -> u64 {
    config
        .trees()
        .iter()
        .map(|t| (1u64 << config.cache_levels().min(t.shape.levels())) - 1)
        .sum::<u64>()
        * config.bucket_bytes() as u64
}

/// How the store's cells map to what a request targets, for the uniformity test.
///
/// A tree ORAM reads whole paths: every path touches the root, so raw cell counts are never
/// uniform; what must look uniform is the leaf each path reaches. A flat store (no ORAM) is
/// targeted cell by cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum PhysicalView {
    /// A binary tree of buckets, one cell per bucket, heap order, data tree first; a two-slot
    /// store keeps the second copies after the first `copy_cells`.
    Tree {
        /// Cells of one copy of the trees.
        copy_cells: u64,
        /// Leaves of the data tree.
        leaves: u64,
    },
    /// A binary tree stored in groups of several levels per cell ([`crate::Packing`]),
    /// two-slot: a path reads one group per band; the target is the group of the bottom band
    /// it reaches (`first .. first + groups` in either copy).
    Groups {
        /// Cells of one copy (the number of groups).
        copy_cells: u64,
        /// First group of the bottom band.
        first: u64,
        /// Groups of the bottom band.
        groups: u64,
    },
    /// One cell per block.
    Flat {
        /// Cells.
        cells: u64,
    },
}

impl PhysicalView {
    /// Number of distinct targets (leaves, or cells).
    pub fn targets(&self) -> u64 {
        match *self {
            Self::Tree { leaves, .. } => leaves,
            Self::Groups { groups, .. } => groups,
            Self::Flat { cells } => cells,
        }
    }

    /// The target a read of `cell` reaches, if the cell says (a leaf bucket of the data tree,
    /// or any cell of a flat store).
    pub fn target_of(&self, cell: CellId) -> Option<u64> {
        match *self {
            Self::Tree { copy_cells, leaves } => {
                let c = if copy_cells == 0 { cell.0 } else { cell.0 % copy_cells };
                let first_leaf = leaves - 1;
                (c >= first_leaf && c < first_leaf + leaves).then(|| c - first_leaf)
            }
            Self::Groups { copy_cells, first, groups } => {
                let c = cell.0 % copy_cells.max(1);
                (c >= first && c < first + groups).then(|| c - first)
            }
            Self::Flat { cells } => (cell.0 < cells).then_some(cell.0),
        }
    }
}

/// The untrusted store an engine is opened over (see [`open_engine`]).
pub struct EngineStore<'a> {
    /// The store array of the engine's cells, opened (and wrapped) by the caller.
    pub store: Arc<dyn Store>,
    /// Where it is: with the tee engine on a `remote://` store the trusted component runs in
    /// the storage server, which the engine then reaches through the array `array`.
    pub url: &'a StoreUrl,
    /// The array's name in the store ([`oram_array`]).
    pub array: &'a str,
    /// The array's shape ([`oram_geometry`]).
    pub geometry: Geometry,
    /// Applied to a remote trusted component's store once opened (the operator's counters).
    pub wrap_tee: &'a (dyn Fn(Arc<dyn TeeStore>) -> Arc<dyn TeeStore> + Send + Sync),
}

/// Estimated trusted memory of the engine of `params`, in bytes: its position map, a version
/// per cell, the tree top it keeps and (packed TaoStore) the groups it keeps for write-backs.
pub fn trusted_bytes(params: &EngineParams) -> Result<u64> {
    let cells = engine_cells(params)?;
    let cached = cached_bytes_of(params)?;
    // A packed tree keeps recently read groups for the writes that follow.
    let groups = match params.engine {
        OramEngine::Tao if params.two_slots() => {
            DurableTao::packed_cache_bytes(&tao_config(params)?, params.tao_pack_levels())?
        }
        _ => 0,
    };
    let posmap = if params.engine == OramEngine::PathOram && params.blocks > 1 << 20 {
        1 << 19 // recursive: 2^16 entries in memory
    } else {
        params.blocks * 8
    };
    // Every engine holds a cached bucket once: the TaoStore engine sealed until first used,
    // then open (sealed again only for a moment, for a checkpoint or a verify).
    Ok(posmap + cells * 8 + cached + groups)
}

/// The parameters `p` of a new data directory with the engine's use of `budget` bytes of
/// trusted memory for the top of its tree decided, and its packing (`pack_levels` tree levels
/// per store object, TaoStore only), checked. `in_place`: one copy per cell (no tree top in
/// memory for TaoStore then, and no packing).
pub fn fit_memory(
    p: EngineParams,
    budget: u64,
    pack_levels: u32,
    in_place: bool,
) -> Result<EngineParams> {
    if pack_levels > 1 && p.engine != OramEngine::Tao {
        return Err(ProxyError::Config(format!(
            "--pack-levels is for the tao engine; {} keeps one bucket per store object",
            p.engine
        )));
    }
    let p = match p.engine {
        OramEngine::PathOram => EngineParams { cache_levels: cache_levels_for(&p, budget)?, ..p },
        // Keeping the tree top in memory, and packing, need two slots per cell (DurableTao).
        OramEngine::Tao if in_place => {
            if pack_levels > 1 {
                return Err(ProxyError::Config(
                    "--pack-levels needs two slots per object: drop --in-place".into(),
                ));
            }
            tao_config(&p)?;
            p
        }
        OramEngine::Tao => {
            let (cache_levels, cache_cells) = tao_pinned_for(&p, budget)?;
            let p = EngineParams { cache_levels, cache_cells, pack_levels, ..p };
            let levels = tao_config(&p)?.shape().levels();
            crate::Packing::new(levels, p.tao_pack_levels())
                .map_err(|e| ProxyError::Config(format!("--pack-levels {pack_levels}: {e}")))?;
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

impl OramEngine {
    /// Every engine, in the order the docs list them.
    pub const ALL: [OramEngine; 6] =
        [Self::Tao, Self::PathOram, Self::Tee, Self::ObliviStore, Self::Curious, Self::CuriousPath];

    /// Why this engine's store is large by design, whatever the block size (`None` for the
    /// tree engines, whose overhead is the block size's).
    pub fn store_overhead(self) -> Option<&'static str> {
        match self {
            Self::Tee => Some(
                "two areas for every node of its m-ary tree, and room in every leaf for the reads \
                 of an eviction round",
            ),
            Self::ObliviStore => {
                Some("about √N partitions of levels, and two areas for every top level")
            }
            Self::Curious => Some(
                "levels sized for b = 3 blocks per eviction, and two areas for every top level",
            ),
            Self::CuriousPath => Some(
                "two copies of every bucket of its partitions' Path ORAM trees, which have about \
                 twice as many slots as blocks",
            ),
            Self::Tao | Self::PathOram => None,
        }
    }
}

impl std::fmt::Debug for EngineStore<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineStore")
            .field("url", &self.url.to_string())
            .field("array", &self.array)
            .field("geometry", &self.geometry)
            .finish_non_exhaustive()
    }
}

impl EngineParams {
    /// Whether the engine's trusted component runs in another process: the tee engine over a
    /// `remote://` store (`blindfold enclave`), whose host holds the TEE key of one master key.
    /// A key rotation re-keys the engine's cells from the gateway, which holds both master
    /// keys; the operator restarts the trusted component with the new key's TEE key before
    /// the gateway starts under the new key (`blindfold rotate-key` says how).
    pub fn trusted_component_elsewhere(&self) -> bool {
        self.engine == OramEngine::Tee && self.store.starts_with("remote://")
    }

    /// The store id (bound into every seal).
    pub fn store_id(&self) -> Result<StoreId> {
        StoreId::from_hex(&self.store_id).map_err(|e| ProxyError::Config(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_default_follows_the_engine_and_the_store() {
        let s3: StoreUrl = "s3://bucket/prefix".parse().unwrap();
        let file: StoreUrl = "file:///tmp/x".parse().unwrap();
        assert_eq!(default_cache_mib(OramEngine::Tao, Some(&s3)), S3_CACHE_MIB);
        assert_eq!(default_cache_mib(OramEngine::Tao, Some(&file)), DEFAULT_CACHE_MIB);
        assert_eq!(default_cache_mib(OramEngine::Tao, None), DEFAULT_CACHE_MIB);
        assert_eq!(default_cache_mib(OramEngine::PathOram, Some(&s3)), PATH_ORAM_CACHE_MIB);
    }

    /// The TaoStore engine's tree top fills its budget: whole levels and the left part of the
    /// next, never the leaves; a budget of exactly three levels pins three.
    #[test]
    fn the_tao_tree_top_fills_its_memory_budget() {
        let p = EngineParams {
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
        let p = EngineParams { cache_levels, cache_cells, ..p };
        assert_eq!(p.tao_pinned_cells(), 11);
        assert_eq!(p.cache_summary().unwrap(), "3 tree levels and 50 % of the next");
        assert_eq!(cached_bytes_of(&p).unwrap(), 11 * cell);
        // A directory made before partial levels: its whole levels, as before.
        let old = EngineParams { cache_cells: 0, ..p };
        assert_eq!(old.tao_pinned_cells(), 7);
        assert_eq!(old.cache_summary().unwrap(), "3 tree levels");
    }
}
