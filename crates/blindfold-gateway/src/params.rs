//! The parameters of a new data directory: the operator's choices ([`ServeConfig`]), checked
//! and turned into the directory's public parameters ([`new_params`]), and what a store of
//! them takes ([`footprint`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::datadir::GatewayParams;
use crate::{GatewayError, Result};
use blindfold_crypto::{Passphrase, StoreId};
use blindfold_proxy::catalogue::{
    cached_bytes_of, engine_cells, oram_config, oram_geometry, OramEngine, PARAMS_VERSION,
};
use blindfold_store::StoreUrl;

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
    /// Where an acknowledged write is made durable (`--durability`).
    pub durability: Durability,
    /// With `--durability store`: how long the gateway's lease on the store lasts unless
    /// renewed (`--lease-ttl`; default [`crate::journaling::LEASE_TTL`]). A successor (a
    /// standby, or `recover` on a new machine) waits at most this long after the gateway died.
    pub lease_ttl: Option<std::time::Duration>,
    /// With `--durability store`: the trusted record of how far the store-side log reaches
    /// (`--anchor`, [`crate::anchor`]), written before each group of writes is acknowledged
    /// and checked by `recover` and a standby's takeover.
    pub anchor: Option<crate::anchor::AnchorSpec>,
    /// With `--durability store`: reads go out once their reveal records are in the local log
    /// and on their way to the store's, without waiting for the store to hold them
    /// (`--reads-ahead-of-log`). Store checkpoints say so, and a recovery from the store alone
    /// then rebuilds the tree with fresh leaves ([`crate::recovery`]).
    pub reads_ahead_of_log: bool,
    /// With `--durability store`: the standby's log feed ([`crate::feed`]). On a primary
    /// (`--standby-listen`), a standby that connects holds the log's tail, and reads wait for
    /// it or the store, whichever holds their reveal records first; on a standby (`--primary`),
    /// the primary to follow, whose tail a takeover then continues the store's log with.
    pub log_feed: Option<crate::feed::LogFeed>,
}

/// Where an acknowledged write is made durable before it is acknowledged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// `store` for `s3://`, `redis://` and `remote://` stores, `local` for the others.
    #[default]
    Auto,
    /// In the data directory only (the engine's redo log and the directory's database): a
    /// lost data directory loses what was written after the last store checkpoint.
    Local,
    /// In the store as well: every commit's trusted-state changes are sealed and appended to
    /// a log in the store before the write is acknowledged, and checkpoints of the trusted
    /// state go to the store in the background, so `blindfold recover` on a new machine
    /// restores every acknowledged write from the store and the key alone
    /// ([`crate::storelog`]).
    Store,
}

impl Durability {
    /// Whether writes go to the store-side log on `store`.
    pub fn in_store(self, store: &StoreUrl) -> bool {
        match self {
            Durability::Local => false,
            Durability::Store => true,
            Durability::Auto => {
                matches!(
                    store,
                    StoreUrl::S3 { .. } | StoreUrl::Redis { .. } | StoreUrl::Remote { .. }
                )
            }
        }
    }
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

/// The footprint of a store with these parameters.
pub fn footprint(params: &GatewayParams) -> Result<Footprint> {
    oram_config(params)?;
    let geometry = oram_geometry(params)?;
    let cells = engine_cells(params)?;
    let cached = cached_bytes_of(params)?;
    let snap = crate::snapshot::geometry(params.blocks, cells, cached)?;
    let bytes = |g: &blindfold_store::Geometry| g.cell_count() * u64::from(g.cell_size());
    Ok(Footprint {
        blocks: params.blocks,
        block_size: params.block_size,
        capacity_bytes: params.blocks * u64::from(params.block_size),
        store_bytes: bytes(&geometry) + bytes(&snap),
        oram_bytes: bytes(&geometry),
        trusted_bytes: blindfold_proxy::catalogue::trusted_bytes(params)?,
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
    let budget = cfg.cache_mib.saturating_mul(1 << 20);
    let p = blindfold_proxy::catalogue::fit_memory(p, budget, cfg.pack_levels, cfg.in_place)?;
    oram_config(&p)?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

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
