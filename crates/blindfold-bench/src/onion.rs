//! `blindfold bench onion`: Onion ORAM with real Damgård–Jurik, phase by phase beside seed
//! 002's Table 5 (1024-bit keys, 4 KiB blocks, 2047 buckets, 4096 blocks, τ = 3, 600 requests
//! of which 75 % reads).
//!
//! The ORAM is bulk loaded with every block, and every other slot of the data array is first
//! filled with random numbers of the right size, so that each select computes over full-size
//! exponents from the first request on, as it does in steady state (a never-written slot reads
//! as zeros, and a zero exponent costs nothing). What each access and eviction computes is a
//! public function of the parameters (the scheme is oblivious), so the mean time per access and
//! per eviction over a shorter run (`--ops`) is the steady-state figure; the evictions of 600
//! requests are `600 / τ`.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_dj::SecretKey;
use blindfold_oram::{BlockId, BucketId, OnionOram, OnionOramConfig};
use blindfold_proxy::{OnionPhaseTimes, SealedOnionOram};
use blindfold_store::{MemoryStore, SelectStore, Store};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};
use serde::Serialize;

use crate::machine::Machine;

/// Seed 002's Table 5 (ms; the number of evictions is a count).
pub mod seed {
    /// Building the select vectors of a whole path.
    pub const SELECT_VECTORS_MS: f64 = 46_200.0;
    /// The server's select over a path.
    pub const SERVER_SELECT_MS: f64 = 22_660.0;
    /// Decrypting the returned block (two layers).
    pub const DECRYPT_MS: f64 = 478.4;
    /// Encrypting the block for the root.
    pub const ROOT_ENCRYPT_MS: f64 = 3_464.0;
    /// Triplet-eviction select vectors of a whole path.
    pub const EVICTION_VECTORS_MS: f64 = 720_000.0;
    /// The server's selects of one eviction.
    pub const EVICTION_SELECT_MS: f64 = 329_600.0;
    /// Stripping the leaf bucket.
    pub const LEAF_STRIP_MS: f64 = 24_384.4;
    /// All of one eviction.
    pub const EVICTION_TOTAL_MS: f64 = 1_073_984.4;
    /// Evictions in 600 requests.
    pub const EVICTIONS_PER_600: f64 = 200.0;
    /// Eviction cost per request, amortized.
    pub const AMORTIZED_EVICTION_MS: f64 = 357_994.8;
    /// Everything, per request.
    pub const TOTAL_MS: f64 = 430_797.2;
    /// Data blocks moved over 600 requests (Table 7).
    pub const BLOCKS_MOVED_600: f64 = 2_800.0;
}

/// The target: a hundred times the seed's total per request.
pub const TARGET_MS: f64 = seed::TOTAL_MS / 100.0;

/// Parameters.
#[derive(Clone, Debug, Serialize)]
pub struct OnionBench {
    /// Damgård–Jurik modulus size, bits.
    pub key_bits: u32,
    /// Logical blocks (all bulk loaded).
    pub blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Tree height (leaves = 2^height; 10 gives the seed's 2047 buckets).
    pub height: u32,
    /// Accesses between evictions (τ).
    pub a: u32,
    /// Slots per half bucket (default: the scheme's).
    pub half_slots: Option<u32>,
    /// Slots of a leaf's stripped area (default: the scheme's).
    pub leaf_slots: Option<u32>,
    /// Damgård–Jurik layer of a block under one onion, the seed's `s_0` (default: the
    /// scheme's, [`OnionOramConfig::DEFAULT_FIRST_LAYER`]).
    pub first_layer: Option<u32>,
    /// Requests measured.
    pub ops: u64,
    /// Share of reads.
    pub read_ratio: f64,
    /// Workload, key and ORAM seed.
    pub seed: u64,
    /// Print progress.
    #[serde(skip)]
    pub progress: bool,
}

impl Default for OnionBench {
    fn default() -> Self {
        Self {
            key_bits: 1024,
            blocks: 4096,
            block_size: 4096,
            height: 10,
            a: 3,
            half_slots: None,
            leaf_slots: None,
            first_layer: None,
            ops: 600,
            read_ratio: 0.75,
            seed: 1,
            progress: true,
        }
    }
}

impl OnionBench {
    /// A run of seconds: 512-bit keys, 64 blocks of 256 bytes in a tree of height 3, 30
    /// requests.
    pub fn quick() -> Self {
        Self { key_bits: 512, blocks: 64, block_size: 256, height: 3, ops: 30, ..Self::default() }
    }
}

/// One row of the Table 5 comparison.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseRow {
    /// The operation, in the seed's words.
    pub operation: &'static str,
    /// JSON key of our figure.
    pub key: &'static str,
    /// The seed's figure.
    pub seed: f64,
    /// Ours.
    pub ours: f64,
}

/// The result.
#[derive(Clone, Debug, Serialize)]
pub struct OnionReport {
    /// Where it ran.
    pub machine: Machine,
    /// Parameters.
    pub params: OnionBench,
    /// Slots per half bucket and per stripped area actually used.
    pub half_slots: u32,
    /// Slots of a leaf's stripped area.
    pub leaf_slots: u32,
    /// Damgård–Jurik layer of a block under one onion (chunks of `first_layer · |n|` bits).
    pub first_layer: u32,
    /// Chunks per block.
    pub chunks: u64,
    /// Buckets in the tree.
    pub buckets: u64,
    /// Key generation, ms.
    pub keygen_ms: f64,
    /// Bulk load (and random fill), ms.
    pub load_ms: f64,
    /// Requests measured.
    pub accesses: u64,
    /// Evictions measured.
    pub evictions: u64,
    /// Per access: encrypting the select vectors, ms.
    pub select_vectors_ms: f64,
    /// Per access: the store's combined select, ms.
    pub server_select_ms: f64,
    /// Per access: peeling and opening the answer, ms.
    pub decrypt_ms: f64,
    /// Per access: sealing, encrypting and writing the block into the root, ms.
    pub root_encrypt_ms: f64,
    /// Per access: metadata (read, open, seal, write; evictions' share included), ms.
    pub metadata_ms: f64,
    /// Per eviction: encrypting the triplet eviction's vectors, ms.
    pub eviction_vectors_ms: f64,
    /// Per eviction: the store's selects, ms.
    pub eviction_select_ms: f64,
    /// Per eviction: the leaf strip, ms.
    pub leaf_strip_ms: f64,
    /// Per eviction: all of it, ms.
    pub eviction_total_ms: f64,
    /// Evictions in 600 requests (600 / τ).
    pub evictions_per_600: f64,
    /// Eviction time per request, amortized, ms.
    pub amortized_eviction_ms: f64,
    /// Everything per request, amortized, ms: the target's figure.
    pub amortized_ms_per_access: f64,
    /// Wall-clock time per request as measured (should be close to the amortized figure).
    pub wall_ms_per_access: f64,
    /// Data blocks (slots) moved between client and store per request.
    pub blocks_moved_per_access: f64,
    /// The same over 600 requests (the seed's Table 7 counts 2,800).
    pub blocks_moved_per_600: f64,
    /// Metadata cells moved per request.
    pub meta_blocks_per_access: f64,
    /// Bytes the store holds: data array plus metadata array.
    pub server_bytes: u64,
    /// Bytes of one block as stored at each onion depth 1..=max (the storage formula).
    pub slot_bytes_by_depth: Vec<u64>,
    /// The Table 5 comparison.
    pub table: Vec<PhaseRow>,
    /// Whether this run is the seed's setup (1024-bit key, 4096 blocks of 4 KiB, height 10,
    /// τ = 3), the only one the target applies to.
    pub seed_setup: bool,
    /// Whether `amortized_ms_per_access` meets the target (≤ seed / 100) on the seed's setup.
    pub target_met: bool,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Fills every data cell with random numbers below the modulus of its depth (what a slot
/// holds in steady state, as far as the cost of a select goes).
async fn random_fill(
    store: &MemoryStore,
    config: &OnionOramConfig,
    key: &SecretKey,
    seed: u64,
) -> Result<()> {
    let pk = key.public();
    let cell_size = store.geometry().cell_size() as usize;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let mut batch = Vec::new();
    for b in 0..config.buckets() {
        let bucket = BucketId(b);
        for s in 0..config.slots_of(bucket) {
            let depth = config.depth(bucket, s);
            let clen = SealedOnionOram::chunk_len(config, pk, depth)?;
            let len = SealedOnionOram::slot_len(config, pk, depth)?;
            let mut cell = vec![0u8; cell_size];
            rng.fill_bytes(&mut cell[..len]);
            for chunk in cell[..len].chunks_mut(clen) {
                chunk[0] = 0; // below 2^(8(len-1)) <= n^(layer+1)
            }
            batch.push((config.cell(bucket, s), cell));
            if batch.len() >= 256 {
                store.write(std::mem::take(&mut batch)).await?;
            }
        }
    }
    if !batch.is_empty() {
        store.write(batch).await?;
    }
    Ok(())
}

/// Runs the benchmark.
pub async fn run(p: &OnionBench) -> Result<OnionReport> {
    let mut rng = ChaCha20Rng::seed_from_u64(p.seed);
    let mut builder = OnionOramConfig::builder(p.blocks, p.block_size).height(p.height).a(p.a);
    if let Some(h) = p.half_slots {
        builder = builder.half_slots(h);
    }
    if let Some(l) = p.leaf_slots {
        builder = builder.leaf_slots(l);
    }
    if let Some(s) = p.first_layer {
        builder = builder.first_layer(s);
    }
    let config = builder.build().context("Onion ORAM parameters")?;
    let say = |m: String| {
        if p.progress {
            eprintln!("{m}");
        }
    };
    let t = Instant::now();
    let key = SecretKey::generate(p.key_bits, &mut rng).context("Damgård–Jurik key")?;
    let keygen = t.elapsed();
    say(format!(
        "generated a {}-bit Damgård–Jurik key in {:.1} s",
        p.key_bits,
        keygen.as_secs_f64()
    ));

    let meta = Arc::new(MemoryStore::new(SealedOnionOram::meta_geometry(&config)?));
    let data = Arc::new(MemoryStore::new(SealedOnionOram::data_geometry(&config, key.public())?));
    let server_bytes = meta.geometry().total_bytes() + data.geometry().total_bytes();
    let chunks = SealedOnionOram::chunks(&config, key.public())? as u64;
    let slot_bytes_by_depth = (1..=config.max_depth())
        .map(|d| SealedOnionOram::slot_len(&config, key.public(), d).map(|l| l as u64))
        .collect::<blindfold_proxy::Result<Vec<_>>>()?;
    say(format!(
        "{} buckets, {} slots, {:.1} MiB in the store; filling it and loading {} blocks",
        config.buckets(),
        config.data_cells(),
        server_bytes as f64 / (1 << 20) as f64,
        p.blocks
    ));
    let t = Instant::now();
    random_fill(&data, &config, &key, p.seed).await?;
    let sealer = CellSealer::new(&MasterKey::generate(), StoreId::random(), 0);
    let mut oram = SealedOnionOram::new(
        OnionOram::with_seed(config.clone(), p.seed),
        meta.clone() as Arc<dyn Store>,
        data.clone() as Arc<dyn SelectStore>,
        sealer,
        key,
    )?;
    let bs = p.block_size as usize;
    oram.bulk_load(p.blocks, |b| vec![(b.0 % 251) as u8; bs]).await?;
    let load = t.elapsed();
    say(format!("loaded in {:.1} s; {} requests", load.as_secs_f64(), p.ops));

    let before = oram.oram().stats().clone();
    let base = oram.phase_times().clone();
    let mut wl = ChaCha8Rng::seed_from_u64(p.seed ^ 0xa11);
    let started = Instant::now();
    for i in 0..p.ops {
        let b = wl.gen_range(0..p.blocks);
        let expect = vec![(b % 251) as u8; bs];
        if wl.gen_bool(p.read_ratio) {
            let got = oram.read(BlockId(b)).await?;
            if got != expect {
                anyhow::bail!("block {b} read back wrong");
            }
        } else {
            // Rewrite the same contents, so every read can be checked.
            oram.write(BlockId(b), expect).await?;
        }
        if p.progress {
            let done = i + 1;
            let per = started.elapsed().as_secs_f64() / done as f64;
            eprintln!(
                "  request {done}/{}: {:.1} s per request so far, about {:.0} s left",
                p.ops,
                per,
                per * (p.ops - done) as f64
            );
        }
    }
    let wall = started.elapsed();
    let stats = oram.oram().stats().clone();
    let accesses = stats.accesses - before.accesses;
    let evictions = stats.evictions - before.evictions;
    let t = sub(oram.phase_times(), &base);
    let per_access = |d: Duration| if accesses == 0 { 0.0 } else { ms(d) / accesses as f64 };
    let per_eviction = |d: Duration| if evictions == 0 { 0.0 } else { ms(d) / evictions as f64 };
    let eviction_total = per_eviction(t.eviction_vectors)
        + per_eviction(t.eviction_select)
        + per_eviction(t.leaf_strip);
    let evictions_per_600 = 600.0 / f64::from(p.a);
    let amortized_eviction = eviction_total * evictions_per_600 / 600.0;
    let access_part = per_access(t.select_vectors)
        + per_access(t.server_select)
        + per_access(t.decrypt)
        + per_access(t.root_encrypt)
        + per_access(t.metadata);
    let amortized = access_part + amortized_eviction;
    let moved = (stats.blocks_down - before.blocks_down) + (stats.blocks_up - before.blocks_up);
    let meta_moved =
        (stats.meta_reads - before.meta_reads) + (stats.meta_writes - before.meta_writes);
    let blocks_moved_per_access = moved as f64 / accesses.max(1) as f64;
    let d = OnionBench::default();
    let seed_setup = (p.key_bits, p.blocks, p.block_size, p.height, p.a)
        == (d.key_bits, d.blocks, d.block_size, d.height, d.a);
    let table = vec![
        PhaseRow {
            operation: "Construct select vector for a complete path",
            key: "select_vectors_ms",
            seed: seed::SELECT_VECTORS_MS,
            ours: per_access(t.select_vectors),
        },
        PhaseRow {
            operation: "Select operation on a complete path",
            key: "server_select_ms",
            seed: seed::SERVER_SELECT_MS,
            ours: per_access(t.server_select),
        },
        PhaseRow {
            operation: "Decrypt the received block",
            key: "decrypt_ms",
            seed: seed::DECRYPT_MS,
            ours: per_access(t.decrypt),
        },
        PhaseRow {
            operation: "Encrypt the block for the root",
            key: "root_encrypt_ms",
            seed: seed::ROOT_ENCRYPT_MS,
            ours: per_access(t.root_encrypt),
        },
        PhaseRow {
            operation: "Encrypt triplet eviction vectors for a path",
            key: "eviction_vectors_ms",
            seed: seed::EVICTION_VECTORS_MS,
            ours: per_eviction(t.eviction_vectors),
        },
        PhaseRow {
            operation: "Select operations of one eviction",
            key: "eviction_select_ms",
            seed: seed::EVICTION_SELECT_MS,
            ours: per_eviction(t.eviction_select),
        },
        PhaseRow {
            operation: "Strip the leaf to one layer",
            key: "leaf_strip_ms",
            seed: seed::LEAF_STRIP_MS,
            ours: per_eviction(t.leaf_strip),
        },
        PhaseRow {
            operation: "Total for one eviction",
            key: "eviction_total_ms",
            seed: seed::EVICTION_TOTAL_MS,
            ours: eviction_total,
        },
        PhaseRow {
            operation: "Evictions for 600 requests",
            key: "evictions_per_600",
            seed: seed::EVICTIONS_PER_600,
            ours: evictions_per_600,
        },
        PhaseRow {
            operation: "Amortized eviction cost per request",
            key: "amortized_eviction_ms",
            seed: seed::AMORTIZED_EVICTION_MS,
            ours: amortized_eviction,
        },
        PhaseRow {
            operation: "Total per request",
            key: "amortized_ms_per_access",
            seed: seed::TOTAL_MS,
            ours: amortized,
        },
    ];
    Ok(OnionReport {
        machine: Machine::current(),
        params: p.clone(),
        half_slots: config.half_slots(),
        leaf_slots: config.leaf_slots(),
        first_layer: config.first_layer(),
        chunks,
        buckets: config.buckets(),
        keygen_ms: ms(keygen),
        load_ms: ms(load),
        accesses,
        evictions,
        select_vectors_ms: per_access(t.select_vectors),
        server_select_ms: per_access(t.server_select),
        decrypt_ms: per_access(t.decrypt),
        root_encrypt_ms: per_access(t.root_encrypt),
        metadata_ms: per_access(t.metadata),
        eviction_vectors_ms: per_eviction(t.eviction_vectors),
        eviction_select_ms: per_eviction(t.eviction_select),
        leaf_strip_ms: per_eviction(t.leaf_strip),
        eviction_total_ms: eviction_total,
        evictions_per_600,
        amortized_eviction_ms: amortized_eviction,
        amortized_ms_per_access: amortized,
        wall_ms_per_access: ms(wall) / accesses.max(1) as f64,
        blocks_moved_per_access,
        blocks_moved_per_600: blocks_moved_per_access * 600.0,
        meta_blocks_per_access: meta_moved as f64 / accesses.max(1) as f64,
        server_bytes,
        slot_bytes_by_depth,
        table,
        seed_setup,
        target_met: seed_setup && amortized <= TARGET_MS,
    })
}

fn sub(a: &OnionPhaseTimes, b: &OnionPhaseTimes) -> OnionPhaseTimes {
    OnionPhaseTimes {
        select_vectors: a.select_vectors - b.select_vectors,
        server_select: a.server_select - b.server_select,
        decrypt: a.decrypt - b.decrypt,
        root_encrypt: a.root_encrypt - b.root_encrypt,
        eviction_vectors: a.eviction_vectors - b.eviction_vectors,
        eviction_select: a.eviction_select - b.eviction_select,
        leaf_strip: a.leaf_strip - b.leaf_strip,
        metadata: a.metadata - b.metadata,
    }
}

/// The report as text: the Table 5 comparison, then the counts.
pub fn render(r: &OnionReport) -> String {
    let p = &r.params;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Onion ORAM, Damgård–Jurik {}-bit, blocks under one onion at layer s0 = {} ({} chunks \
         each): {} blocks of {} B, {} buckets (height {}), τ = {}, half buckets of {} slots, \
         leaves of {} + 2×{} slots; {} requests ({} evictions) measured",
        p.key_bits,
        r.first_layer,
        r.chunks,
        p.blocks,
        p.block_size,
        r.buckets,
        p.height,
        p.a,
        r.half_slots,
        r.leaf_slots,
        r.half_slots,
        r.accesses,
        r.evictions
    );
    let _ = writeln!(
        s,
        "machine: {}, {} cores, {:.1} GiB",
        r.machine.cpu,
        r.machine.cores,
        r.machine.memory_bytes as f64 / (1u64 << 30) as f64
    );
    let _ = writeln!(
        s,
        "\n{:<48} {:>14} {:>14} {:>10}",
        "operation (Al-Saleh and Belghith 2018, Table 5)", "paper ms", "ours ms", "speed-up"
    );
    for row in &r.table {
        let speedup = if row.ours > 0.0 && row.key != "evictions_per_600" {
            format!("{:.1}×", row.seed / row.ours)
        } else {
            "-".into()
        };
        let _ = writeln!(
            s,
            "{:<48} {:>14.1} {:>14.1} {:>10}",
            row.operation, row.seed, row.ours, speedup
        );
    }
    let _ = writeln!(
        s,
        "\nmetadata per request {:.1} ms (not in the seed's table, included in the total); \
         wall clock per request {:.1} ms",
        r.metadata_ms, r.wall_ms_per_access
    );
    let _ = writeln!(
        s,
        "data blocks moved per request {:.2} ({:.0} per 600 requests; seed 2,800), metadata cells per request {:.1}",
        r.blocks_moved_per_access, r.blocks_moved_per_600, r.meta_blocks_per_access
    );
    let _ = writeln!(
        s,
        "store holds {:.1} MiB; one block is {} B as stored at depth 1 and {} B at depth {}",
        r.server_bytes as f64 / (1 << 20) as f64,
        r.slot_bytes_by_depth.first().copied().unwrap_or(0),
        r.slot_bytes_by_depth.last().copied().unwrap_or(0),
        r.slot_bytes_by_depth.len()
    );
    if r.seed_setup {
        let _ = writeln!(
            s,
            "target (seed / 100 = {TARGET_MS:.0} ms per request): {} ({:.0} ms)",
            if r.target_met { "met" } else { "NOT met" },
            r.amortized_ms_per_access
        );
    } else {
        let _ = writeln!(
            s,
            "(not the seed's setup: the seed's figures and the target ({TARGET_MS:.0} ms per \
             request) are for 1024-bit keys, 4096 blocks of 4 KiB, height 10, τ = 3)"
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny run: the report's counts follow from the parameters, and every phase was timed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tiny_run_reports_every_phase() {
        // Blocks of 160 bytes sealed to 192 are three chunks of layer 3 (95 bytes each at 256
        // bits), the last one partly padding: every read checks its block.
        let p = OnionBench {
            key_bits: 256,
            blocks: 8,
            block_size: 160,
            height: 2,
            ops: 6,
            progress: false,
            ..OnionBench::default()
        };
        let r = run(&p).await.unwrap();
        assert_eq!((r.first_layer, r.chunks), (OnionOramConfig::DEFAULT_FIRST_LAYER, 3));
        assert_eq!((r.accesses, r.evictions), (6, 2));
        assert!(!r.seed_setup && !r.target_met);
        assert_eq!(r.table.len(), 11);
        for row in &r.table {
            assert!(row.ours > 0.0, "{} not measured", row.operation);
        }
        // Per request: one block down and one up; per eviction the leaf's 2·Zh + Zl slots down
        // and its Zl stripped slots up.
        let per_eviction = f64::from(2 * r.half_slots + 2 * r.leaf_slots);
        let expect = 2.0 + per_eviction * 2.0 / 6.0;
        assert!(
            (r.blocks_moved_per_access - expect).abs() < 1e-9,
            "{} vs {expect}",
            r.blocks_moved_per_access
        );
        assert_eq!(r.slot_bytes_by_depth.len(), 3);
        let text = render(&r);
        assert!(
            text.contains("Total per request") && text.contains("not the seed's setup"),
            "{text}"
        );
    }
}
