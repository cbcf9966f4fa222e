//! `blindfold bench tee`: the TEE-assisted engine beside seed 004's tables.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::commands::parse::{parse_block_size, parse_size};
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct TeeArgs {
    /// Toy sizes (8 MiB of data, 2,000 queries): about a minute.
    #[arg(long)]
    pub quick: bool,
    /// Table I's data sizes (1 KiB blocks), comma-separated: `1GiB,2GiB,4GiB`.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub data_size: Option<Vec<u64>>,
    /// Tables II and III's block sizes, comma-separated: `1KiB,2KiB,4KiB,8KiB`.
    #[arg(long, value_delimiter = ',', value_parser = parse_block_size)]
    pub block_size: Option<Vec<u32>>,
    /// Table II's data size (the paper's 10 GB, scaled to this machine).
    #[arg(long, value_parser = parse_size)]
    pub table2_size: Option<u64>,
    /// Table III's number of blocks (the paper's 2 million, scaled).
    #[arg(long)]
    pub table3_blocks: Option<u64>,
    /// Queries measured per configuration.
    #[arg(long)]
    pub queries: Option<u64>,
    /// Queries per eviction round (default 450, measured fastest here; the paper's q = 800).
    #[arg(long)]
    pub round_queries: Option<u32>,
    /// Where the store's files go (a directory per configuration, removed after).
    #[arg(long, default_value = ".")]
    pub work_dir: PathBuf,
    /// Which of the paper's tables to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "I,II,III")]
    pub tables: Vec<String>,
    /// Write the rows as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(a: TeeArgs) -> Result<()> {
    runtime::on_all_cores(bench_tee(a))
}

async fn bench_tee(a: TeeArgs) -> Result<()> {
    use blindfold_bench::tee::{self, TeeBench};
    let bin = std::env::current_exe().context("finding this blindfold binary")?;
    std::fs::create_dir_all(&a.work_dir)
        .with_context(|| format!("creating {}", a.work_dir.display()))?;
    let mut b = if a.quick {
        TeeBench::quick(a.work_dir.clone(), bin)
    } else {
        TeeBench::full(a.work_dir.clone(), bin)
    };
    if let Some(v) = a.data_size {
        b.data_sizes = v;
    }
    if let Some(v) = a.block_size {
        b.block_sizes = v;
    }
    if let Some(v) = a.table2_size {
        b.table2_bytes = v;
    }
    if let Some(v) = a.table3_blocks {
        b.table3_blocks = v;
    }
    if let Some(v) = a.queries {
        b.queries = v;
    }
    if let Some(v) = a.round_queries {
        b.round_queries = v;
    }
    b.tables = a.tables;
    let report = tee::run(&b).await?;
    print!("{}", tee::render(&report));
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report.rows)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("rows written to {}", path.display());
    }
    Ok(())
}
