//! `blindfold bench onion`: Onion ORAM with real Damgård–Jurik (a build with `--features onion`).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;

#[cfg(feature = "onion")]
use crate::commands::bench::save::save_json;
use crate::commands::parse::parse_count;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct OnionArgs {
    /// A run of seconds: 512-bit keys, 64 blocks of 256 bytes, height 3, 30 requests.
    #[arg(long)]
    pub quick: bool,
    /// Damgård–Jurik modulus size in bits (the seed: 1024).
    #[arg(long)]
    pub key_bits: Option<u32>,
    /// Requests measured (the seed: 600).
    #[arg(long, value_parser = parse_count)]
    pub ops: Option<u64>,
    /// Logical blocks, all loaded (the seed: 4096).
    #[arg(long, value_parser = parse_count)]
    pub blocks: Option<u64>,
    /// Bytes per block (the seed: 4096).
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Tree height: 2^height leaves (the seed's 2047 buckets: 10).
    #[arg(long)]
    pub height: Option<u32>,
    /// Slots per half bucket (default: 2τ + 2).
    #[arg(long)]
    pub half_slots: Option<u32>,
    /// Damgård–Jurik layer a block is first encrypted at, the seed's s0: chunks of s0·|n|
    /// bits, each select growing them by one |n| (default 3, measured fastest for the seed's
    /// setup; 1 is Paillier chunks).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub first_layer: Option<u32>,
    /// Seed of the key, the workload and the scheme.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Save the report as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// No progress lines.
    #[arg(long, short)]
    pub quiet: bool,
}

pub fn run(a: OnionArgs) -> Result<()> {
    runtime::on_all_cores(bench_onion(a))
}

#[cfg(feature = "onion")]
async fn bench_onion(a: OnionArgs) -> Result<()> {
    use blindfold_bench::onion::{self, OnionBench};
    let mut b = if a.quick { OnionBench::quick() } else { OnionBench::default() };
    b.key_bits = a.key_bits.unwrap_or(b.key_bits);
    b.ops = a.ops.unwrap_or(b.ops);
    b.blocks = a.blocks.unwrap_or(b.blocks);
    b.block_size = a.block_size.unwrap_or(b.block_size);
    b.height = a.height.unwrap_or(b.height);
    b.half_slots = a.half_slots.or(b.half_slots);
    b.first_layer = a.first_layer.or(b.first_layer);
    b.seed = a.seed;
    b.progress = !a.quiet;
    if b.ops == 0 {
        bail!("--ops must be at least 1");
    }
    let report = onion::run(&b).await?;
    print!("{}", onion::render(&report));
    save_json(a.json.as_deref(), &report)
}

#[cfg(not(feature = "onion"))]
async fn bench_onion(_: OnionArgs) -> Result<()> {
    bail!(
        "this blindfold was built without Onion ORAM; rebuild with \
         `cargo build --release -p blindfold --features onion` (needs libgmp-dev)"
    )
}
