//! `blindfold bench floor`: this machine's own limits for a cell size and a store.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use blindfold_bench::floor::{self as floor_bench, FloorParams};
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::bench::save::save_json;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct FloorArgs {
    /// The store to measure: `memory:`, `file:///dir`, `s3://bucket/prefix?endpoint=…`,
    /// `redis://…` (the same URLs as the other benchmarks; writes a small `bench-floor` array).
    #[arg(long, default_value = "memory:")]
    pub store: StoreUrl,
    /// Bytes of one sealed cell [default: a Path ORAM bucket of four 4 KiB blocks, as `bench
    /// path` stores it].
    #[arg(long)]
    pub cell_size: Option<u32>,
    /// Round trip of an emulated link to report with the limits, ms.
    #[arg(long)]
    pub rtt_ms: Option<u64>,
    /// Bandwidth of that link, Mbit/s each way [default: unlimited].
    #[arg(long, requires = "rtt_ms")]
    pub mbit: Option<u64>,
    /// Measure an in-process store (`memory:`, `file://`) over a tree this large, MiB (at
    /// most 1024), one random root-to-leaf path per request, as a tree ORAM reads and writes
    /// its array (the benchmarks pass their own tree's size). 0: 64 cells side by side, all
    /// in the cache.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1024))]
    pub array_mib: u64,
    /// Milliseconds given to each measurement (six of them).
    #[arg(long, default_value_t = 300)]
    pub each_ms: u64,
    /// Save the limits as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(args: FloorArgs) -> Result<()> {
    // The rates are per core: one thread measures them.
    runtime::on_one_core(bench_floor(args))
}

async fn bench_floor(args: FloorArgs) -> Result<()> {
    let cell_size = match args.cell_size {
        Some(c) => c,
        None => floor_bench::path_oram_cell_size(4096)?,
    };
    let link = match (args.rtt_ms, args.mbit) {
        (Some(rtt), Some(m)) => Some(blindfold_store::LinkConfig::wan(rtt, m)),
        (Some(rtt), None) => {
            Some(blindfold_store::LinkConfig::unlimited(Duration::from_millis(rtt)))
        }
        _ => None,
    };
    let params = FloorParams {
        each: Duration::from_millis(args.each_ms.max(1)),
        ..FloorParams::new(cell_size)
            .with_store(&args.store)
            .with_link(link)
            .with_array((args.array_mib << 20) / u64::from(cell_size.max(1)))
    };
    let limits = floor_bench::measure(&params).await?;
    println!("blindfold bench floor");
    println!(
        "  machine                            {}",
        blindfold_bench::Machine::current().summary()
    );
    print!("{}", floor_bench::render(&limits));
    save_json(args.json.as_deref(), &limits)?;
    Ok(())
}
