//! `blindfold bench oblivistore`: seed 001's experiments (ObliviStore) for the partition engines.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use crate::commands::bench::save::save_json;
use crate::commands::parse::{parse_block_size, parse_count};
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct ObliviStoreArgs {
    /// A run of under three minutes: 4,096 blocks, round trips 0, 50 and 200 ms, 1 and 2
    /// nodes, up to 2,000 operations or 6 s per point.
    #[arg(long)]
    pub quick: bool,
    /// Engines, comma-separated: oblivistore, curious, curious-path, tao [default: all four].
    #[arg(long, value_delimiter = ',')]
    pub engines: Option<Vec<String>>,
    /// Round trips of the latency experiment, ms, comma-separated [default:
    /// 0,50,100,200,500,1000; --quick: 0,50,200].
    #[arg(long, value_delimiter = ',')]
    pub rtt_ms: Option<Vec<u64>>,
    /// Numbers of ORAM nodes, comma-separated [default: 1,2,4; --quick: 1,2].
    #[arg(long, value_delimiter = ',')]
    pub nodes: Option<Vec<usize>>,
    /// Round trip of each node's link in the nodes experiment, ms.
    #[arg(long, default_value_t = 50)]
    pub nodes_rtt_ms: u64,
    /// Bandwidth of each node's link in the nodes experiment, each way, Mbit/s; 0: unlimited.
    /// The paper's nodes were each bounded by their own disks and network, so by default a
    /// node's link is what bounds it.
    #[arg(long, default_value_t = 100)]
    pub nodes_mbit: u64,
    /// Bandwidth of every emulated link of the latency and seeks experiments, each way,
    /// Mbit/s [default: unlimited].
    #[arg(long)]
    pub mbit: Option<u64>,
    /// Logical blocks, e.g. 65536 or 2^16 [default: 2^16; --quick: 4096].
    #[arg(long, value_parser = parse_count)]
    pub blocks: Option<u64>,
    /// Bytes per block.
    #[arg(long, value_parser = parse_block_size, default_value = "4KiB")]
    pub block_size: u32,
    /// Closed-loop clients per node [default: 64 + 4 per ms of round trip, at most 4096].
    #[arg(long)]
    pub clients: Option<usize>,
    /// Operations per point, at most [default: 20000; --quick: 2000].
    #[arg(long, value_parser = parse_count)]
    pub ops: Option<u64>,
    /// Seconds per point, at most [default: 20; --quick: 6].
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Share of reads.
    #[arg(long, default_value_t = 0.5)]
    pub read_ratio: f64,
    /// Backend of the latency and nodes experiments: memory or file (the seeks experiment
    /// always uses files).
    #[arg(long, default_value = "memory")]
    pub store: blindfold_bench::oblivistore::StoreKind,
    /// Skip the seeks experiment.
    #[arg(long)]
    pub no_seeks: bool,
    /// Where engine state and cell files go (a temporary directory per engine, removed after)
    /// [default: the system's temporary directory].
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Directory for the CSV file and SVG plots.
    #[arg(long, default_value = "blindfold-bench-oblivistore")]
    pub out_dir: PathBuf,
    /// Save the rows as a JSON list to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress output.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: ObliviStoreArgs) -> Result<()> {
    // Many clients and the engine's background shuffles share the machine's cores.
    runtime::on_all_cores(bench_oblivistore(a))
}

async fn bench_oblivistore(a: ObliviStoreArgs) -> Result<()> {
    use blindfold_bench::oblivistore::{self, ObliviStoreBench};
    let mut b = if a.quick { ObliviStoreBench::quick() } else { ObliviStoreBench::default() };
    if let Some(v) = a.engines {
        b.engines = v.into_iter().map(|e| e.trim().to_ascii_lowercase()).collect();
    }
    if let Some(v) = a.rtt_ms {
        b.rtts_ms = v;
    }
    if let Some(v) = a.nodes {
        b.nodes = v;
    }
    if let Some(v) = a.blocks {
        b.blocks = v;
    }
    if let Some(v) = a.ops {
        b.ops = v;
    }
    if let Some(v) = a.seconds {
        if v.is_nan() || v <= 0.0 {
            bail!("--seconds must be positive");
        }
        b.max_seconds = v;
    }
    if let Some(d) = a.work_dir {
        b.work_dir = d;
    }
    b.nodes_rtt_ms = a.nodes_rtt_ms;
    b.nodes_mbit = Some(a.nodes_mbit).filter(|&m| m > 0);
    b.mbit = a.mbit;
    b.block_size = a.block_size;
    b.clients = a.clients;
    b.read_ratio = a.read_ratio;
    b.store = a.store;
    b.seeks = !a.no_seeks;
    b.seed = a.seed;
    b.progress = !a.quiet;
    let report = oblivistore::run(&b).await?;
    print!("{}", oblivistore::render(&report));
    for path in oblivistore::save(&report, &a.out_dir)? {
        println!("  saved {}", path.display());
    }
    save_json(a.json.as_deref(), &report.rows)
}
