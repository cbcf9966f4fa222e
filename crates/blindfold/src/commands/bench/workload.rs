//! `blindfold bench workload`: the thesis's workloads A-E (seed 003).

use std::path::PathBuf;

use anyhow::Result;
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::bench::save::save_json;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct WorkloadBenchArgs {
    /// The workload: A (home user), B (traveling user), C (email backup), D (code
    /// distribution) or E (e-government).
    #[arg(long)]
    pub workload: String,
    /// Engines, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "tao,path-oram")]
    pub engine: Vec<blindfold_gateway::server::OramEngine>,
    /// Block sizes, comma-separated (e.g. 4KiB,64KiB) [default: 4KiB,64KiB; --quick: 4KiB].
    #[arg(long, value_delimiter = ',', value_parser = blindfold_gateway::server::parse_size)]
    pub block_size: Vec<u64>,
    /// Multiply every object size by this (the thesis's files reach 4 GB) [default: 1/64;
    /// --quick: 1/1024].
    #[arg(long)]
    pub scale: Option<f64>,
    /// A short run: one engine (the first), one block size, tiny objects.
    #[arg(long)]
    pub quick: bool,
    /// Where each side's cells go: `memory:` or `file:///path/to/dir`.
    #[arg(long, default_value = "memory:")]
    pub store: StoreUrl,
    /// Round-trip time of an emulated link to the store, ms (0: the private cloud).
    #[arg(long, default_value_t = 0)]
    pub rtt_ms: u64,
    /// Bandwidth of the emulated link (each way), Mbit/s [default: unlimited].
    #[arg(long)]
    pub mbit: Option<u64>,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Save the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: WorkloadBenchArgs) -> Result<()> {
    runtime::on_all_cores(bench_workload(a))
}

async fn bench_workload(a: WorkloadBenchArgs) -> Result<()> {
    use blindfold_bench::workload::{self, WorkloadBench};
    let mut engines = a.engine;
    let mut block_sizes: Vec<u32> = a
        .block_size
        .iter()
        .map(|&b| u32::try_from(b).map_err(|_| anyhow::anyhow!("--block-size {b} is too large")))
        .collect::<Result<_>>()?;
    if block_sizes.is_empty() {
        block_sizes = if a.quick { vec![4096] } else { vec![4096, 65536] };
    }
    if a.quick {
        engines.truncate(1);
        block_sizes.truncate(1);
    }
    let params = WorkloadBench {
        workload: a.workload,
        engines,
        block_sizes,
        scale: a.scale.unwrap_or(if a.quick { 1.0 / 1024.0 } else { 1.0 / 64.0 }),
        store: a.store,
        rtt_ms: a.rtt_ms,
        mbit: a.mbit,
        seed: a.seed,
        progress: !a.quiet,
    };
    let report = workload::run(params).await?;
    println!("blindfold bench workload");
    print!("{}", workload::render(&report));
    save_json(a.json.as_deref(), &report)?;
    Ok(())
}
