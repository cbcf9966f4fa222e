//! `blindfold bench git`: the thesis's git workload (seed 003).

use std::path::PathBuf;

use anyhow::Result;
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::bench::save::save_json;
use crate::commands::parse::parse_block_size;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct GitBenchArgs {
    /// The S3 server: s3://BUCKET?endpoint=http://HOST:PORT (e.g. a MinIO). The direct side
    /// pushes there; each gateway keeps its cells under a prefix of the same bucket.
    #[arg(long)]
    pub store: StoreUrl,
    /// The repository, a git bundle (the thesis's: openstacksdk-2019.bundle) [default:
    /// openstacksdk-2019.bundle in the current directory, or beside a source checkout].
    #[arg(long, env = "BLINDFOLD_BUNDLE")]
    pub bundle: Option<PathBuf>,
    /// The branch of the bundle to push.
    #[arg(long, default_value = blindfold_bench::git::BUNDLE_BRANCH)]
    pub branch: String,
    /// Engines, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "tao,path-oram")]
    pub engine: Vec<blindfold_gateway::server::OramEngine>,
    /// Block sizes, comma-separated (e.g. 4KiB,64KiB).
    #[arg(long, value_delimiter = ',', default_value = "64KiB", value_parser = parse_block_size)]
    pub block_size: Vec<u32>,
    /// Trusted memory (MiB) for the top levels of the ORAM tree, as `serve --cache-mib`
    /// [default: each engine's, as `serve`].
    #[arg(long)]
    pub cache_mib: Option<u64>,
    /// A short run: a small generated repository instead of the bundle, the first engine only.
    #[arg(long)]
    pub quick: bool,
    /// Round-trip time of an emulated link to the S3 server, ms (0: the private cloud). git
    /// reaches the server through a relay with this link, each gateway its store through the
    /// same emulation; git reaches the gateway on this machine directly.
    #[arg(long, default_value_t = 0)]
    pub rtt_ms: u64,
    /// Bandwidth of the emulated link (each way), Mbit/s [default: unlimited].
    #[arg(long)]
    pub mbit: Option<u64>,
    /// Seed of the generated repository (--quick).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Save the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: GitBenchArgs) -> Result<()> {
    // The gateways run in this process while git runs beside them.
    runtime::on_all_cores(bench_git(a))
}

async fn bench_git(a: GitBenchArgs) -> Result<()> {
    use blindfold_bench::git::{self, GitBench};
    let mut engines = a.engine;
    if a.quick {
        engines.truncate(1);
    }
    let params = GitBench {
        bundle: (!a.quick).then(|| git::find_bundle(a.bundle)),
        branch: a.branch,
        engines,
        block_sizes: a.block_size,
        store: a.store,
        cache_mib: a.cache_mib,
        rtt_ms: a.rtt_ms,
        mbit: a.mbit,
        seed: a.seed,
        progress: !a.quiet,
    };
    let report = git::run(params).await?;
    println!("blindfold bench git");
    print!("{}", git::render(&report));
    save_json(a.json.as_deref(), &report)?;
    Ok(())
}
