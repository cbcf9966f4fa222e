//! `blindfold report`: the thesis's experiments as a Markdown report with plots.

use std::path::PathBuf;

use anyhow::Result;
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::parse::parse_block_size;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Toy sizes (workloads × 1/1024, one engine and block size, a generated git repository).
    #[arg(long)]
    pub quick: bool,
    /// Directory for report.md, report.json and the plots.
    #[arg(long, default_value = "blindfold-report")]
    pub out: PathBuf,
    /// An S3 server for the private cloud and the git workload:
    /// s3://BUCKET?endpoint=http://HOST:PORT, its credentials in AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY (without it the git workload is skipped).
    #[arg(long)]
    pub s3: Option<StoreUrl>,
    /// The git workload's repository (the thesis's: openstacksdk-2019.bundle) [default:
    /// openstacksdk-2019.bundle in the current directory, or beside a source checkout].
    #[arg(long, env = "BLINDFOLD_BUNDLE")]
    pub bundle: Option<PathBuf>,
    /// Engines, comma-separated [default: tao,path-oram; --quick: tao].
    #[arg(long, value_delimiter = ',')]
    pub engine: Vec<blindfold_gateway::server::OramEngine>,
    /// Block sizes, comma-separated [default: 4KiB,64KiB,256KiB; --quick: 4KiB].
    #[arg(long, value_delimiter = ',', value_parser = parse_block_size)]
    pub block_size: Vec<u32>,
    /// Multiply every object size of the workloads by this [default: 1/64; --quick: 1/1024].
    #[arg(long)]
    pub scale: Option<f64>,
    /// The public cloud's emulated round trip, ms.
    #[arg(long, default_value_t = 20)]
    pub rtt_ms: u64,
    /// The public cloud's emulated bandwidth each way, Mbit/s.
    #[arg(long, default_value_t = 100)]
    pub mbit: u64,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: ReportArgs) -> Result<()> {
    runtime::on_all_cores(report(a))
}

async fn report(a: ReportArgs) -> Result<()> {
    use blindfold_bench::report::{self, ReportParams};
    let mut p = ReportParams::new(a.quick);
    if !a.engine.is_empty() {
        p.engines = a.engine;
    }
    if !a.block_size.is_empty() {
        p.block_sizes = a.block_size;
    }
    if let Some(scale) = a.scale {
        p.scale = scale;
    }
    p.rtt_ms = a.rtt_ms;
    p.mbit = a.mbit;
    p.s3 = a.s3;
    p.bundle = blindfold_bench::git::find_bundle(a.bundle);
    p.seed = a.seed;
    p.progress = !a.quiet;
    let r = report::run(p).await?;
    let files = report::write(&r, &a.out)?;
    println!("blindfold report: {:.0} s on {}", r.seconds, r.machine.summary());
    for f in files {
        println!("  wrote {}", f.display());
    }
    Ok(())
}
