//! `blindfold bench concurrency`: the concurrent engine vs. sequential Path ORAM by clients.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

use crate::commands::bench::save::save_json;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct ConcurrencyArgs {
    /// A short run (64 MiB data set, 10/30/100/500 clients, k = 40 and 160, 3 s per point).
    #[arg(long)]
    pub quick: bool,
    /// Logical data set in MiB [default: 1024; --quick: 64].
    #[arg(long)]
    pub dataset_mib: Option<u64>,
    /// Bytes per block.
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    /// Numbers of concurrent clients, comma-separated [default: 10,20,30,40,50,60,100,200,500,1000].
    #[arg(long, value_delimiter = ',')]
    pub clients: Option<Vec<usize>>,
    /// Write-back intervals k, comma-separated [default: 40,80,160,240].
    #[arg(long, value_delimiter = ',')]
    pub k: Option<Vec<usize>>,
    /// Measured seconds per point [default: 10; --quick: 3].
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Round-trip time of the emulated link, ms.
    #[arg(long, default_value_t = 50)]
    pub rtt_ms: u64,
    /// Bandwidth of the emulated link (each way), Mbit/s [default: unlimited].
    #[arg(long)]
    pub mbit: Option<u64>,
    /// Share of reads.
    #[arg(long, default_value_t = 0.5)]
    pub read_ratio: f64,
    /// Skip the sequential Path ORAM baseline.
    #[arg(long)]
    pub no_baseline: bool,
    /// Seed of the workload and the engines.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also measure the gateway's durable engine (tao with its redo log and commits: a write
    /// returns once committed) at each client count, once per durability listed,
    /// comma-separated: `--durability local,store` compares keeping writes in the data
    /// directory with keeping them in the store too (`serve --durability`), in the same run.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub durability: Vec<crate::commands::data_dir::DurabilityArg>,
    /// Directory for the CSV file and SVG plots.
    #[arg(long, default_value = "blindfold-bench-concurrency")]
    pub out_dir: PathBuf,
    /// Save the report (one row per run) as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(args: ConcurrencyArgs) -> Result<()> {
    // Many clients and one engine share the machine's cores.
    runtime::on_all_cores(bench_concurrency(args))
}

async fn bench_concurrency(args: ConcurrencyArgs) -> Result<()> {
    use blindfold_bench::concurrency::{self, ConcurrencyBench};
    let mut bench = if args.quick { ConcurrencyBench::quick() } else { Default::default() };
    if let Some(d) = args.dataset_mib {
        bench.dataset_mib = d;
    }
    if let Some(c) = args.clients {
        bench.clients = c;
    }
    if let Some(k) = args.k {
        bench.ks = k;
    }
    if let Some(s) = args.seconds {
        if s.is_nan() || s <= 0.0 {
            bail!("--seconds must be positive");
        }
        bench.seconds = s;
    }
    if !(0.0..=1.0).contains(&args.read_ratio) {
        bail!("--read-ratio must be between 0 and 1");
    }
    bench.block_size = args.block_size;
    bench.rtt_ms = args.rtt_ms;
    bench.mbit = args.mbit;
    bench.read_ratio = args.read_ratio;
    bench.baseline = !args.no_baseline;
    bench.seed = args.seed;
    bench.durability = args.durability.into_iter().map(Into::into).collect();
    bench.progress = !args.quiet;
    let report = concurrency::run(bench).await?;
    print!("{}", concurrency::render(&report));
    for path in concurrency::save(&report, &args.out_dir)? {
        println!("  saved {}", path.display());
    }
    save_json(args.json.as_deref(), &report)?;
    Ok(())
}
