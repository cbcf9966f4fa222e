//! `blindfold bench path`: Path ORAM vs. the same blocks sealed without ORAM.

use std::path::PathBuf;

use anyhow::Result;
use blindfold_bench::path::{self as path_bench, PathBench};
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::bench::save::save_json;
use crate::commands::parse::parse_count;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct PathArgs {
    /// Logical blocks (a number or a power of two such as 2^20).
    #[arg(long, default_value = "2^16", value_parser = parse_count)]
    pub blocks: u64,
    /// Bytes per block.
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    /// Logical accesses to measure (each side).
    #[arg(long, default_value = "20000", value_parser = parse_count)]
    pub ops: u64,
    /// Where cells go: `memory:`, `file:///path/to/dir` (optionally `?sync=none|flush|always`),
    /// `s3://bucket/prefix?endpoint=http://host:port&region=…` (credentials from
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) or `redis://host:port/db`.
    #[arg(long, default_value = "memory:")]
    pub store: StoreUrl,
    /// Slots per bucket.
    #[arg(long, default_value_t = 4)]
    pub z: u32,
    /// Top levels of the tree kept in trusted memory (never sent to the store).
    #[arg(long, default_value_t = 0)]
    pub cache_levels: u32,
    /// Store the position map recursively, keeping at most this many entries in memory.
    #[arg(long, value_parser = parse_count)]
    pub recursive: Option<u64>,
    /// Share of reads in the workload.
    #[arg(long, default_value_t = 0.75)]
    pub read_ratio: f64,
    /// Seed of the workload and of the ORAM's leaves.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Emulate a network round trip to the store, in milliseconds.
    #[arg(long)]
    pub rtt_ms: Option<f64>,
    /// Emulate a link of this bandwidth (Mbit/s, each direction); needs --rtt-ms.
    #[arg(long, requires = "rtt_ms")]
    pub bandwidth_mbit: Option<f64>,
    /// Measure on an empty ORAM instead of filling every block first.
    #[arg(long)]
    pub no_fill: bool,
    /// Save the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Prices for the cost table: a JSON or TOML file overriding or adding providers (format
    /// in docs/cost.md); the built-in list prices otherwise.
    #[arg(long, value_name = "FILE")]
    pub prices: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(args: PathArgs) -> Result<()> {
    // One core: the engine is sequential, and the figures are quoted per core.
    runtime::on_one_core(bench_path(args))
}

async fn bench_path(args: PathArgs) -> Result<()> {
    let params = PathBench {
        blocks: args.blocks,
        block_size: args.block_size,
        ops: args.ops,
        store: args.store,
        z: args.z,
        cache_levels: args.cache_levels,
        recursive: args.recursive,
        read_ratio: args.read_ratio,
        seed: args.seed,
        rtt_ms: args.rtt_ms,
        bandwidth_mbit: args.bandwidth_mbit,
        fill: !args.no_fill,
        inject_slowdown: None,
        progress: !args.quiet,
        prices: match &args.prices {
            Some(path) => blindfold_bench::cost::PriceTable::load(path)?,
            None => blindfold_bench::cost::PriceTable::builtin(),
        },
    };
    let report = path_bench::run(params).await?;
    println!("blindfold bench path");
    print!("{}", path_bench::render(&report));
    save_json(args.json.as_deref(), &report)?;
    Ok(())
}
