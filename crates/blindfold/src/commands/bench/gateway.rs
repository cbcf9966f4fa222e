//! `blindfold bench gateway`: a mixed S3 workload through the gateway vs. without ORAM.

use std::path::PathBuf;

use anyhow::Result;
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::bench::save::save_json;
use crate::commands::parse::parse_count;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct GatewayBenchArgs {
    /// Where each side's cells go: `memory:` or `file:///path/to/dir` (each side gets its own
    /// subdirectory there, removed afterwards).
    #[arg(long, default_value = "memory:")]
    pub store: StoreUrl,
    /// Measured operations, each side [default: 400; --quick: 100].
    #[arg(long, value_parser = parse_count)]
    pub ops: Option<u64>,
    /// Distinct objects, each PUT once before measuring [default: 64; --quick: 32].
    #[arg(long, value_parser = parse_count)]
    pub objects: Option<u64>,
    /// Smallest object (e.g. 1KiB).
    #[arg(long, default_value = "1KiB", value_parser = blindfold_gateway::server::parse_size)]
    pub min_size: u64,
    /// Largest object [default: 16MiB; --quick: 1MiB].
    #[arg(long, value_parser = blindfold_gateway::server::parse_size)]
    pub max_size: Option<u64>,
    /// Share of GETs among the measured operations.
    #[arg(long, default_value_t = 0.75)]
    pub read_ratio: f64,
    /// Clients sending requests at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Logical capacity of each gateway (default: sized to the workload).
    #[arg(long, value_parser = blindfold_gateway::server::parse_size)]
    pub capacity: Option<u64>,
    /// ORAM block size, bytes.
    #[arg(long, default_value_t = 4096)]
    pub block_size: u32,
    /// Trusted memory (MiB) for the top levels of the ORAM tree, as `serve --cache-mib`
    /// [default: as `serve`: 128 with tao, 256 with tao on an s3:// store, 32 with path-oram].
    #[arg(long)]
    pub cache_mib: Option<u64>,
    /// The gateway's engine, as `serve --engine`: tao, path-oram, tee, oblivistore, curious or
    /// curious-path.
    #[arg(long, default_value_t = blindfold_gateway::server::OramEngine::Tao)]
    pub engine: blindfold_gateway::server::OramEngine,
    /// The ORAM side keeps one copy of each cell, overwritten in place after the redo log
    /// carries it, as `serve --in-place` (default: two slots per cell, cells never in the log).
    #[arg(long)]
    pub in_place: bool,
    /// Levels of the tao engine's tree per store object, as `serve --pack-levels` (1 to 4).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4))]
    pub pack_levels: u32,
    /// Where the engine side makes a write durable before acknowledging it (see `serve
    /// --durability`): run once with `local` and once with `store` to measure what keeping
    /// the log in the store costs.
    #[arg(long, value_enum, default_value = "auto")]
    pub durability: crate::commands::data_dir::DurabilityArg,
    /// With `--durability store`: reads go ahead of the store-side log, as `serve
    /// --reads-ahead-of-log`.
    #[arg(long)]
    pub reads_ahead_of_log: bool,
    /// With `--durability store`: a standby follows the engine side's log feed over the
    /// loopback (as `serve --standby-listen` and `serve --standby --primary`), and a read waits
    /// for it or the store, whichever holds its reveal record first.
    #[arg(long, conflicts_with = "reads_ahead_of_log")]
    pub standby: bool,
    /// Prices for the cost table: a JSON or TOML file overriding or adding providers (format
    /// in docs/cost.md; e.g. docs/prices-aws-in-region.toml); the built-in list prices
    /// otherwise.
    #[arg(long, value_name = "FILE")]
    pub prices: Option<PathBuf>,
    /// Emulate a network between each gateway and its store: round trip in milliseconds,
    /// applied to both sides alike (e.g. 20 for a cloud region nearby). Every read and write
    /// pays it; a flush does not (an S3 or Redis store acknowledges a write once durable).
    #[arg(long, default_value_t = 0)]
    pub rtt_ms: u64,
    /// Emulated link bandwidth each way, Mbit/s (default: unlimited).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub mbit: Option<u64>,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A small run of a few seconds per side.
    #[arg(long)]
    pub quick: bool,
    /// Save the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(args: GatewayBenchArgs) -> Result<()> {
    // Clients and gateway share the machine's cores, as a local deployment would.
    runtime::on_all_cores(bench_gateway(args))
}

async fn bench_gateway(args: GatewayBenchArgs) -> Result<()> {
    use blindfold_bench::gateway::{self as gateway_bench, GatewayBench};
    let preset = if args.quick { GatewayBench::default().quick() } else { GatewayBench::default() };
    let store = args.store;
    let params = GatewayBench {
        store: store.clone(),
        ops: args.ops.unwrap_or(preset.ops),
        objects: args.objects.unwrap_or(preset.objects),
        min_size: args.min_size,
        max_size: args.max_size.unwrap_or(preset.max_size),
        read_ratio: args.read_ratio,
        concurrency: args.concurrency,
        capacity: args.capacity,
        block_size: args.block_size,
        cache_mib: args
            .cache_mib
            .unwrap_or(blindfold_gateway::server::default_cache_mib(args.engine, Some(&store))),
        engine: args.engine,
        in_place: args.in_place,
        pack_levels: args.pack_levels,
        durability: args.durability.into(),
        reads_ahead_of_log: args.reads_ahead_of_log,
        standby: args.standby,
        prices: match &args.prices {
            Some(path) => blindfold_bench::cost::PriceTable::load(path)?,
            None => blindfold_bench::cost::PriceTable::builtin(),
        },
        rtt_ms: args.rtt_ms,
        mbit: args.mbit,
        seed: args.seed,
        inject_slowdown: None,
        progress: !args.quiet,
    };
    let report = gateway_bench::run(params).await?;
    println!("blindfold bench gateway");
    print!("{}", gateway_bench::render(&report));
    save_json(args.json.as_deref(), &report)?;
    Ok(())
}
