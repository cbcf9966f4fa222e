//! `blindfold bench schemes`: Path vs Ring vs XOR Ring ORAM (seed 002).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::bench::save::save_json;
use crate::commands::parse::parse_count;

#[derive(Args, Debug)]
pub struct SchemesArgs {
    /// A shorter run (200 requests instead of 600), same tables.
    #[arg(long)]
    pub quick: bool,
    /// Real blocks stored.
    #[arg(long, value_parser = parse_count)]
    pub blocks: Option<u64>,
    /// Bytes per block.
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Requests per scheme and speed.
    #[arg(long, value_parser = parse_count)]
    pub ops: Option<u64>,
    /// Real slots per bucket.
    #[arg(long, default_value_t = 4)]
    pub z: u32,
    /// Dummy slots per bucket (Ring ORAM).
    #[arg(long, default_value_t = 2)]
    pub s: u32,
    /// Accesses between evictions (Ring ORAM).
    #[arg(long, default_value_t = 3)]
    pub a: u32,
    /// Share of reads.
    #[arg(long, default_value_t = 0.75)]
    pub read_ratio: f64,
    /// Mean time between request arrivals (Poisson), ms; the seed used one minute.
    #[arg(long, default_value_t = 60_000.0)]
    pub interarrival_ms: f64,
    /// Round-trip time of the emulated link, ms.
    #[arg(long, default_value_t = 0.2)]
    pub rtt_ms: f64,
    /// Link speeds of the sweep in Mbit/s, comma-separated (default: the seed's nine, 0.512
    /// to 1000).
    #[arg(long, value_delimiter = ',')]
    pub speeds_mbit: Option<Vec<f64>>,
    /// Where the cells live: `memory:` or `remote://host:port` (a `blindfold storage-server`).
    #[arg(long, default_value = "memory:")]
    pub store: StoreUrl,
    /// Seed of the workload and the schemes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// A `blindfold bench onion --json` report: its measured time per request fills Onion
    /// ORAM's "with AHE" rows (without it they are left out).
    #[arg(long)]
    pub onion_json: Option<PathBuf>,
    /// Directory for the CSV files and SVG plots.
    #[arg(long, default_value = "blindfold-bench-schemes")]
    pub out_dir: PathBuf,
    /// Save the whole report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(args: SchemesArgs) -> Result<()> {
    use blindfold_bench::schemes;
    let mut bench = if args.quick { schemes::SchemesBench::quick() } else { Default::default() };
    if let Some(b) = args.blocks {
        bench.blocks = b;
    }
    if let Some(b) = args.block_size {
        bench.block_size = b;
    }
    if let Some(o) = args.ops {
        bench.ops = o;
    }
    (bench.z, bench.s, bench.a) = (args.z, args.s, args.a);
    bench.read_ratio = args.read_ratio;
    bench.interarrival_ms = args.interarrival_ms;
    bench.rtt_ms = args.rtt_ms;
    if let Some(speeds) = args.speeds_mbit {
        if speeds.iter().any(|v| v.is_nan() || *v <= 0.0) {
            bail!("link speeds must be positive");
        }
        bench.speeds = speeds.iter().map(|v| (v * 1e6).round() as u64).collect();
    }
    bench.store = args.store;
    bench.seed = args.seed;
    bench.progress = !args.quiet;
    if let Some(path) = &args.onion_json {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the bench onion report {}", path.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let ms = v
            .get("amortized_ms_per_access")
            .and_then(serde_json::Value::as_f64)
            .with_context(|| {
                format!(
                    "{} has no amortized_ms_per_access: not a bench onion report",
                    path.display()
                )
            })?;
        if !(ms.is_finite() && ms >= 0.0) {
            bail!("{}: amortized_ms_per_access must be a non-negative number", path.display());
        }
        bench.onion_ahe_ms = Some(ms);
    }
    let report = schemes::run(&bench)?;
    print!("{}", schemes::render(&report));
    for path in schemes::save(&report, &args.out_dir)? {
        println!("  saved {}", path.display());
    }
    save_json(args.json.as_deref(), &report)?;
    Ok(())
}
