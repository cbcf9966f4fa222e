//! `blindfold bench workload`: the thesis's synthetic workloads (seed 003, "Oblivious RAM in
//! practice", workloads A–E) against the gateway, each engine and block size beside the same
//! gateway without ORAM in the same run.
//!
//! The workloads are data: `workloads/<A..E>.toml` in the repository (compiled in), each with
//! the thesis's stages (operations, read and write shares), the objects loaded before the
//! measured stages, and its size distribution (a mixture of log-normal parts or a uniform range,
//! cut to `[min, max]`). A seeded generator turns one into a list of objects and operations;
//! every size is multiplied by one `--scale` factor (the thesis's files reach 4 GB, which this
//! machine's runs scale down), which the report states. Reads pick a loaded object uniformly;
//! writes PUT a new object. The clients run one at a time (the thesis's COSBench files used one
//! worker).
//!
//! Each run drives a live gateway with a real S3 client over HTTP (see [`crate::gateway`]);
//! the metrics are the thesis's: slowdown (runtime over the baseline's), response time,
//! bandwidth overhead (store bytes per logical byte), outsource ratio (trusted storage over
//! store storage), cost multiplier (the price table of `docs/cost.md`, over the baseline) and
//! CPU use. Both of the thesis's baselines run in the same invocation:
//!
//! 1. *the store itself*: the same operations straight against the backend with an object
//!    client (`object_store`: in memory, local files, or the S3 server of `--store s3://…`),
//!    each request paying the emulated link's round trip and transfer time, as every store
//!    request of the gateway does behind `LatencyStore`;
//! 2. *blocks without ORAM*: the same gateway with the ORAM replaced by sealed blocks at fixed
//!    places (`DirectEngine`).

use anyhow::{bail, Context, Result};
use blindfold_gateway::server::{parse_size, OramEngine};
use blindfold_store::StoreUrl;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::gateway::{display, GatewayBench, GatewayReport, Kind, Workload};
use crate::machine::Machine;

/// The logical size of every ORAM of the thesis's experiments (5 GB).
pub const THESIS_CAPACITY: u64 = 5 << 30;

/// The workloads, as checked in.
const FILES: [(&str, &str); 5] = [
    ("A", include_str!("../../../workloads/A.toml")),
    ("B", include_str!("../../../workloads/B.toml")),
    ("C", include_str!("../../../workloads/C.toml")),
    ("D", include_str!("../../../workloads/D.toml")),
    ("E", include_str!("../../../workloads/E.toml")),
];

/// The names of the workloads.
pub fn names() -> Vec<&'static str> {
    FILES.iter().map(|(n, _)| *n).collect()
}

/// One workload description.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// Its letter.
    pub name: String,
    /// What it stands for.
    pub title: String,
    /// Where in the thesis it comes from.
    pub source: String,
    /// Objects loaded before the measured stages.
    pub prepare: usize,
    /// Object sizes.
    pub sizes: Sizes,
    /// The measured stages, in order.
    pub stage: Vec<Stage>,
}

/// A size distribution, cut to `[min, max]`.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Sizes {
    /// Smallest size (`1KB`, `10MB`, … as for `--capacity`).
    pub min: String,
    /// Largest size.
    pub max: String,
    /// Uniform between `min` and `max` (else the log-normal `parts`).
    #[serde(default)]
    pub uniform: bool,
    /// A mixture of log-normal parts.
    #[serde(default)]
    pub parts: Vec<Part>,
}

/// One log-normal part of a size mixture.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    /// Its share of the mixture.
    pub weight: f64,
    /// Its median size.
    pub median: String,
    /// Standard deviation of the natural log of the size.
    pub sigma: f64,
}

/// One stage: `ops` operations, `read` per cent GETs, `write` per cent PUTs of new objects.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// Its name.
    pub name: String,
    /// Operations.
    pub ops: u64,
    /// Per cent reads.
    pub read: u32,
    /// Per cent writes.
    pub write: u32,
}

fn size_of(s: &str, what: &str) -> Result<u64> {
    parse_size(s).map_err(|e| anyhow::anyhow!("{what}: {e}"))
}

impl Spec {
    /// The checked-in workload `name` (`A` … `E`, any case).
    pub fn named(name: &str) -> Result<Self> {
        let Some((_, text)) = FILES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)) else {
            bail!("no workload {name:?}: choose one of {}", names().join(", "));
        };
        Self::parse(text).with_context(|| format!("workloads/{}.toml", name.to_uppercase()))
    }

    /// Parses and checks a description.
    pub fn parse(text: &str) -> Result<Self> {
        let spec: Self = toml::from_str(text)?;
        let (min, max) = (size_of(&spec.sizes.min, "min")?, size_of(&spec.sizes.max, "max")?);
        anyhow::ensure!(min >= 1 && min <= max, "sizes: need 1 <= min <= max");
        anyhow::ensure!(spec.prepare >= 1, "prepare: at least one object");
        anyhow::ensure!(!spec.stage.is_empty(), "at least one stage");
        for s in &spec.stage {
            anyhow::ensure!(s.ops >= 1, "stage {}: no operations", s.name);
            anyhow::ensure!(s.read + s.write == 100, "stage {}: read + write must be 100", s.name);
        }
        if spec.sizes.uniform {
            anyhow::ensure!(spec.sizes.parts.is_empty(), "sizes: uniform or parts, not both");
        } else {
            anyhow::ensure!(!spec.sizes.parts.is_empty(), "sizes: no parts");
            for p in &spec.sizes.parts {
                anyhow::ensure!(p.weight > 0.0 && p.sigma >= 0.0, "sizes: bad part {p:?}");
                size_of(&p.median, "median")?;
            }
        }
        Ok(spec)
    }

    /// Measured operations in all stages.
    pub fn ops(&self) -> u64 {
        self.stage.iter().map(|s| s.ops).sum()
    }

    /// One size at full scale.
    fn draw(&self, rng: &mut ChaCha8Rng) -> u64 {
        let min = size_of(&self.sizes.min, "min").expect("checked") as f64;
        let max = size_of(&self.sizes.max, "max").expect("checked") as f64;
        if self.sizes.uniform {
            return rng.gen_range(min..=max).round() as u64;
        }
        // The part first, then a size from it, drawn again until it lies in [min, max]: each
        // part keeps its weight in the mixture however much of it the cut removes.
        let total: f64 = self.sizes.parts.iter().map(|p| p.weight).sum();
        let mut pick = rng.gen_range(0.0..total);
        let part = self
            .sizes
            .parts
            .iter()
            .find(|p| {
                pick -= p.weight;
                pick < 0.0
            })
            .unwrap_or(&self.sizes.parts[self.sizes.parts.len() - 1]);
        let median = size_of(&part.median, "median").expect("checked") as f64;
        for _ in 0..1000 {
            // A standard normal by Box–Muller.
            let (u1, u2): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
            let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            let s = median * (part.sigma * z).exp();
            if (min..=max).contains(&s) {
                return s.round() as u64;
            }
        }
        median.clamp(min, max) as u64
    }

    /// The objects and operations of one run, sizes times `scale` (at least one byte):
    /// objects `0..prepare` are loaded first; each stage's operations follow in order, with
    /// the stage each belongs to.
    pub fn generate(&self, scale: f64, seed: u64) -> Generated {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let scaled = |s: u64| ((s as f64 * scale).round() as u64).max(1);
        let mut sizes: Vec<u64> = (0..self.prepare).map(|_| scaled(self.draw(&mut rng))).collect();
        let mut ops = Vec::new();
        let mut stages = Vec::new();
        for (i, stage) in self.stage.iter().enumerate() {
            for _ in 0..stage.ops {
                if rng.gen_range(0..100) < stage.read {
                    ops.push((rng.gen_range(0..self.prepare), Kind::Get));
                } else {
                    sizes.push(scaled(self.draw(&mut rng)));
                    ops.push((sizes.len() - 1, Kind::Put));
                }
                stages.push(i);
            }
        }
        Generated { sizes, loaded: self.prepare, ops, stages }
    }
}

/// A generated run: object sizes, how many are loaded first, operations and their stages.
#[derive(Clone, Debug)]
pub struct Generated {
    /// Size of every object (by key).
    pub sizes: Vec<u64>,
    /// Objects loaded before measuring.
    pub loaded: usize,
    /// The measured operations.
    pub ops: Vec<(usize, Kind)>,
    /// The stage of each operation.
    pub stages: Vec<usize>,
}

/// Parameters of `blindfold bench workload`.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadBench {
    /// The workload's letter.
    pub workload: String,
    /// Engines to run.
    #[serde(serialize_with = "displays")]
    pub engines: Vec<OramEngine>,
    /// Block sizes to run, bytes.
    pub block_sizes: Vec<u32>,
    /// Every object size is multiplied by this.
    pub scale: f64,
    /// The gateway's store (each side its own).
    #[serde(serialize_with = "display")]
    pub store: StoreUrl,
    /// Emulated round trip to the store, milliseconds (0: none; the private-cloud topology).
    pub rtt_ms: u64,
    /// Emulated bandwidth each way, Mbit/s.
    pub mbit: Option<u64>,
    /// Workload seed.
    pub seed: u64,
    /// Draw progress bars.
    #[serde(skip)]
    pub progress: bool,
}

pub(crate) fn displays<T: std::fmt::Display, S: serde::Serializer>(
    v: &[T],
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|x| x.to_string()))
}

/// The workload straight against the store (the thesis's first baseline).
#[derive(Clone, Debug, Serialize)]
pub struct StoreSide {
    /// What it ran against.
    pub store: String,
    /// Measured seconds.
    pub seconds: f64,
    /// Mean response time, milliseconds.
    pub mean_ms: f64,
    /// Billable units.
    pub usage: crate::cost::Usage,
}

/// One engine and block size against the baselines.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The engine.
    pub engine: String,
    /// Block size, bytes.
    pub block_size: u32,
    /// Runtime over the store's own (the thesis's slowdown).
    pub store_slowdown: f64,
    /// Cost over the store's own at the first price table entry (the thesis's cost multiplier).
    pub store_cost_multiplier: f64,
    /// Store bytes (both ways) over the bytes the workload moved straight against the store
    /// (the thesis's bandwidth overhead).
    pub store_bandwidth_overhead: f64,
    /// Mean response time over the store's own (the thesis's relative response time, taken
    /// over all operations).
    pub store_response_ratio: f64,
    /// Runtime over the gateway without ORAM.
    pub slowdown: f64,
    /// Mean response time, milliseconds (ORAM; baseline).
    pub response_ms: f64,
    /// The baseline's mean response time, milliseconds.
    pub baseline_response_ms: f64,
    /// Store bytes (both ways) per logical byte the clients moved, over the baseline's.
    pub bandwidth_overhead: f64,
    /// Trusted storage (position map, versions, cached tree top: estimated) over the bytes the
    /// store holds.
    pub outsource_ratio: f64,
    /// The same estimate for an ORAM of the thesis's size ([`THESIS_CAPACITY`]), whatever this
    /// run's capacity: the thesis's proxies always held a 5 GB ORAM.
    pub outsource_ratio_thesis_capacity: f64,
    /// Cost at the first price table entry over the baseline's.
    pub cost_multiplier: f64,
    /// Cores the whole process kept busy while measuring (ORAM side).
    pub cores_busy: f64,
    /// The full gateway report of the run.
    pub report: GatewayReport,
}

/// What `blindfold bench workload` measured.
#[derive(Clone, Debug, Serialize)]
pub struct WorkloadReport {
    /// Always `"workload"`.
    pub scheme: &'static str,
    /// Where it ran.
    pub machine: Machine,
    /// The parameters.
    pub params: WorkloadBench,
    /// The workload description.
    pub spec: Spec,
    /// Objects, loaded objects, measured operations, and bytes of all objects (scaled).
    pub objects: usize,
    /// Objects loaded before measuring.
    pub loaded: usize,
    /// Measured operations.
    pub ops: usize,
    /// Bytes of all objects (scaled).
    pub dataset_bytes: u64,
    /// The store without a gateway.
    pub store_side: StoreSide,
    /// One row per engine and block size.
    pub rows: Vec<Row>,
}

/// An object client for the store `url` names, what to call it, and a directory to remove.
type ObjectClient = (Box<dyn object_store::ObjectStore>, String, Option<std::path::PathBuf>);

/// The store of the first baseline.
fn object_store_for(url: &StoreUrl) -> Result<ObjectClient> {
    Ok(match url {
        StoreUrl::Memory => {
            (Box::new(object_store::memory::InMemory::new()), "memory".into(), None)
        }
        StoreUrl::File { dir, .. } => {
            let d = dir.join(format!("blindfold-bench-workload-{}-store", std::process::id()));
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
            let fs = object_store::local::LocalFileSystem::new_with_prefix(&d)?;
            (Box::new(fs), format!("files in {}", d.display()), Some(d))
        }
        StoreUrl::S3 { bucket, options, .. } => {
            let b = blindfold_store::aws_builder(bucket, options);
            (Box::new(b.build()?), format!("s3://{bucket}"), None)
        }
        other => bail!("the store baseline runs on memory:, file: and s3:// stores, not {other}"),
    })
}

/// Runs the loaded objects and the measured operations straight against the store.
async fn store_side(p: &WorkloadBench, g: &Generated) -> Result<StoreSide> {
    use object_store::{path::Path as ObjectPath, ObjectStoreExt as _, PutPayload};
    let (store, label, cleanup) = object_store_for(&p.store)?;
    let mut rng = ChaCha8Rng::seed_from_u64(p.seed ^ 0x5eed);
    let largest = g.sizes.iter().copied().max().unwrap_or(0) as usize;
    let mut data = vec![0u8; largest + 4096];
    rng.fill(&mut data[..]);
    let data = bytes::Bytes::from(data);
    let body = |key: usize| {
        let off = (key * 61) % 4096;
        data.slice(off..off + g.sizes[key] as usize)
    };
    let run = std::process::id();
    let under = match &p.store {
        StoreUrl::S3 { prefix, .. } if !prefix.trim_matches('/').is_empty() => {
            format!("{}/", prefix.trim_matches('/'))
        }
        _ => String::new(),
    };
    let path =
        |key: usize| ObjectPath::from(format!("{under}blindfold-bench-workload-{run}/{key:06}"));
    // The link: a round trip and the transfer time per request, as `LatencyStore` charges.
    let link = crate::gateway::emulated_link(p.rtt_ms, p.mbit)?;
    for key in 0..g.loaded {
        store.put(&path(key), PutPayload::from(body(key))).await.context("store baseline: load")?;
    }
    let mut usage = crate::cost::Usage { logical_ops: g.ops.len() as u64, ..Default::default() };
    let mut total_ms = 0.0;
    let t = std::time::Instant::now();
    for &(key, kind) in &g.ops {
        let started = std::time::Instant::now();
        let size = g.sizes[key];
        if let Some(link) = &link {
            // (Not even a zero sleep without a link: the timer's granularity is a millisecond.)
            let transfer =
                if kind == Kind::Put { link.up_time(size) } else { link.down_time(size) };
            tokio::time::sleep(link.rtt + transfer).await;
        }
        match kind {
            Kind::Put => {
                store
                    .put(&path(key), PutPayload::from(body(key)))
                    .await
                    .context("store baseline: PUT")?;
                usage.puts += 1;
                usage.bytes_in += size;
            }
            Kind::Get => {
                let got =
                    store.get(&path(key)).await.context("store baseline: GET")?.bytes().await?;
                anyhow::ensure!(got == body(key), "store baseline: GET returned other bytes");
                usage.gets += 1;
                usage.bytes_out += size;
            }
        }
        total_ms += started.elapsed().as_secs_f64() * 1e3;
    }
    let seconds = t.elapsed().as_secs_f64();
    usage.stored_bytes = g.sizes.iter().sum();
    for key in 0..g.sizes.len() {
        let _ = store.delete(&path(key)).await;
    }
    if let Some(d) = cleanup {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(StoreSide { store: label, seconds, mean_ms: total_ms / g.ops.len().max(1) as f64, usage })
}

/// Trusted storage (position map, versions, cached tree top) over the store's bytes, as the
/// gateway's footprint estimates them for this capacity, block size and engine.
fn outsource_ratio(capacity: u64, block_size: u32, engine: OramEngine) -> Result<f64> {
    use blindfold_gateway::server::{default_cache_mib, footprint, new_params, ServeConfig};
    let cfg = ServeConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        data_dir: std::env::temp_dir(),
        store: Some(StoreUrl::Memory),
        key_file: None,
        passphrase: None,
        credentials: None,
        capacity,
        block_size,
        pad_objects: false,
        cache_mib: default_cache_mib(engine, Some(&StoreUrl::Memory)),
        engine,
        in_place: false,
        pack_levels: 1,
        durability: Default::default(),
        lease_ttl: None,
        anchor: None,
        reads_ahead_of_log: false,
        log_feed: None,
    };
    let f = footprint(&new_params(&cfg)?)?;
    Ok(f.trusted_bytes as f64 / f.oram_bytes.max(1) as f64)
}

/// Runs the workload for every engine and block size.
pub async fn run(p: WorkloadBench) -> Result<WorkloadReport> {
    let spec = Spec::named(&p.workload)?;
    anyhow::ensure!(p.scale > 0.0 && p.scale <= 1.0, "--scale must be in (0, 1]");
    anyhow::ensure!(!p.engines.is_empty() && !p.block_sizes.is_empty(), "nothing to run");
    let g = spec.generate(p.scale, p.seed);
    let largest = g.sizes.iter().copied().max().unwrap_or(0);
    anyhow::ensure!(
        largest <= 1 << 30,
        "the largest object would be {largest} bytes: use a smaller --scale (at most 1 GiB)"
    );
    let store_side = store_side(&p, &g).await?;
    let table = crate::cost::PriceTable::builtin();
    let mut rows = Vec::new();
    for &engine in &p.engines {
        for &block_size in &p.block_sizes {
            let params = GatewayBench {
                store: p.store.clone(),
                ops: g.ops.len() as u64,
                objects: g.sizes.len() as u64,
                min_size: 1,
                max_size: largest.max(1),
                concurrency: 1,
                block_size,
                engine,
                rtt_ms: p.rtt_ms,
                mbit: p.mbit,
                seed: p.seed,
                progress: p.progress,
                ..GatewayBench::default()
            };
            let w = Workload::from_parts(g.sizes.clone(), g.loaded, g.ops.clone(), p.seed);
            let r = crate::gateway::run_with(params, w)
                .await
                .with_context(|| format!("{engine}, {block_size}-byte blocks"))?;
            let (o, b) = (&r.oram, &r.baseline);
            let vs_store =
                crate::cost::compare(&table, &o.usage, &store_side.usage, r.dataset_bytes);
            rows.push(Row {
                engine: engine.to_string(),
                block_size,
                store_slowdown: o.seconds / store_side.seconds.max(1e-9),
                store_cost_multiplier: vs_store
                    .providers
                    .first()
                    .and_then(|c| c.multiplier)
                    .unwrap_or(f64::NAN),
                store_bandwidth_overhead: (o.store_bytes_up + o.store_bytes_down) as f64
                    / (store_side.usage.bytes_in + store_side.usage.bytes_out).max(1) as f64,
                store_response_ratio: o.mean_ms / store_side.mean_ms.max(1e-9),
                slowdown: o.seconds / b.seconds.max(1e-9),
                response_ms: o.mean_ms,
                baseline_response_ms: b.mean_ms,
                bandwidth_overhead: o.bandwidth_overhead / b.bandwidth_overhead.max(1e-9),
                outsource_ratio: outsource_ratio(r.capacity_bytes, block_size, engine)?,
                outsource_ratio_thesis_capacity: outsource_ratio(
                    THESIS_CAPACITY,
                    block_size,
                    engine,
                )?,
                cost_multiplier: r
                    .cost
                    .providers
                    .first()
                    .and_then(|c| c.multiplier)
                    .unwrap_or(f64::NAN),
                cores_busy: o.cores_busy,
                report: r,
            });
        }
    }
    Ok(WorkloadReport {
        scheme: "workload",
        machine: Machine::current(),
        objects: g.sizes.len(),
        loaded: g.loaded,
        ops: g.ops.len(),
        dataset_bytes: g.sizes.iter().sum(),
        store_side,
        spec,
        params: p,
        rows,
    })
}

/// The report as a table.
pub fn render(r: &WorkloadReport) -> String {
    let mut s = String::new();
    let p = &r.params;
    s.push_str(&format!("  machine: {}\n", r.machine.summary()));
    s.push_str(&format!(
        "  workload {} ({}; {}): {} objects, {} loaded first, {} measured operations in {} \
         stage(s), sizes × {} ({} in all)\n",
        r.spec.name,
        r.spec.title,
        r.spec.source,
        r.objects,
        r.loaded,
        r.ops,
        r.spec.stage.len(),
        p.scale,
        human(r.dataset_bytes)
    ));
    let link = match (p.rtt_ms, p.mbit) {
        (0, None) => "private cloud (no emulated link)".to_string(),
        (rtt, None) => format!("public cloud: {rtt} ms round trip"),
        (rtt, Some(m)) => format!("public cloud: {rtt} ms round trip, {m} Mbit/s"),
    };
    s.push_str(&format!("  store: {} — {link}\n", p.store));
    s.push_str(&format!(
        "  baseline 1, the store itself ({}): {:.2} s, mean response {:.1} ms\n",
        r.store_side.store, r.store_side.seconds, r.store_side.mean_ms
    ));
    s.push_str(
        "  baseline 2, the same gateway with blocks but no ORAM: columns \"vs 2\", \"base ms\", \"cost2\"\n",
    );
    s.push_str(&format!(
        "  {:<10} {:>7} {:>9} {:>8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>8} {:>6}\n",
        "engine",
        "block",
        "slowdown",
        "cost ×",
        "vs 2",
        "resp. ms",
        "base ms",
        "bandwidth",
        "outsource",
        "cost2 ×",
        "cores"
    ));
    for row in &r.rows {
        s.push_str(&format!(
            "  {:<10} {:>7} {:>8.2}× {:>7.1}× {:>7.2}× {:>10.1} {:>10.1} {:>9.1}× {:>10.5} {:>7.1}× {:>6.2}\n",
            row.engine,
            human(u64::from(row.block_size)),
            row.store_slowdown,
            row.store_cost_multiplier,
            row.slowdown,
            row.response_ms,
            row.baseline_response_ms,
            row.bandwidth_overhead,
            row.outsource_ratio,
            row.cost_multiplier,
            row.cores_busy
        ));
    }
    if r.spec.name == "A" {
        s.push_str(
            "  published (Thoresen, \"Oblivious RAM in practice\", NTNU 2019), workload A behind \
             a public cloud link: slowdown ",
        );
        let refs: Vec<String> =
            crate::gateway::THESIS.iter().map(|(n, lo, hi)| format!("{n} {lo}–{hi}×")).collect();
        s.push_str(&refs.join(", "));
        s.push_str("; cost 36–192×\n");
    }
    s
}

fn human(b: u64) -> String {
    blindfold_gateway::server::human_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_checked_in_workload_parses_and_follows_its_description() {
        for name in names() {
            let spec = Spec::named(name).unwrap();
            let g = spec.generate(1.0, 7);
            assert_eq!(g.ops.len() as u64, spec.ops(), "{name}");
            assert_eq!(g.loaded, spec.prepare);
            let (min, max) =
                (parse_size(&spec.sizes.min).unwrap(), parse_size(&spec.sizes.max).unwrap());
            assert!(
                g.sizes.iter().all(|&s| (min..=max).contains(&s)),
                "{name}: sizes out of range"
            );
            // Reads only ever name loaded objects; every write names a new one.
            let mut written = std::collections::HashSet::new();
            for &(key, kind) in &g.ops {
                match kind {
                    Kind::Get => assert!(key < g.loaded),
                    Kind::Put => assert!(key >= g.loaded && written.insert(key)),
                }
            }
            // The same seed, the same run; another seed, another.
            let again = spec.generate(1.0, 7);
            assert_eq!(again.sizes, g.sizes);
            assert_eq!(again.ops, g.ops);
            assert_ne!(spec.generate(1.0, 8).sizes, g.sizes);
        }
    }

    #[test]
    fn read_shares_and_size_distributions_match_the_thesis() {
        // Workload E alternates quiet stages (95 % reads) and deadline spikes (5 %).
        let e = Spec::named("e").unwrap();
        let mut reads = [0u32; 5];
        let mut total = [0u32; 5];
        for seed in 0..200 {
            let g = e.generate(1.0, seed);
            for (&(_, kind), &stage) in g.ops.iter().zip(&g.stages) {
                total[stage] += 1;
                reads[stage] += u32::from(kind == Kind::Get);
            }
        }
        for (i, want) in [0.95, 0.05, 0.95, 0.05, 0.95].iter().enumerate() {
            let got = f64::from(reads[i]) / f64::from(total[i]);
            assert!((got - want).abs() < 0.02, "stage {i}: {got}");
        }
        // Workload A: about 90 % of files below 4 MB, both peaks present; B is cut at 4 MB;
        // C lies in 10–25 MB.
        let a = Spec::named("A").unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let sizes: Vec<u64> = (0..20_000).map(|_| a.draw(&mut rng)).collect();
        let below = |x: u64| sizes.iter().filter(|&&s| s < x).count() as f64 / sizes.len() as f64;
        assert!((below(4_000_000) - 0.9).abs() < 0.03, "{}", below(4_000_000));
        assert!(below(10_000) > 0.6 && below(10_000) < 0.85, "{}", below(10_000));
        let b = Spec::named("B").unwrap();
        assert!((0..2000).all(|_| b.draw(&mut rng) <= 4_000_000));
        let c = Spec::named("C").unwrap();
        assert!((0..2000).all(|_| (10_000_000..=25_000_000).contains(&c.draw(&mut rng))));
        // Scaling multiplies every size by one factor (at least one byte).
        let g1 = a.generate(1.0, 3);
        let g2 = a.generate(0.01, 3);
        for (x, y) in g1.sizes.iter().zip(&g2.sizes) {
            assert_eq!(*y, ((*x as f64 * 0.01).round() as u64).max(1));
        }
    }

    #[test]
    fn malformed_descriptions_are_refused() {
        let good = include_str!("../../../workloads/B.toml");
        assert!(Spec::parse(good).is_ok());
        for (from, to) in [
            ("read = 90", "read = 91"),
            ("prepare = 10", "prepare = 0"),
            ("max = \"4MB\"", "max = \"4 parsecs\""),
            ("ops = 100", "ops = 0"),
            ("name = \"B\"", "name = \"B\"\nextra = 1"),
        ] {
            assert!(Spec::parse(&good.replace(from, to)).is_err(), "{to}");
        }
        assert!(Spec::named("Z").is_err());
    }
}
