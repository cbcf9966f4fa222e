//! `blindfold bench regress`: CI's check that no engine became several times slower than its
//! baseline.

use std::path::PathBuf;

use anyhow::Result;
use blindfold_bench::regress::{self, Injection, RegressParams};
use clap::Args;

use crate::commands::bench::save::save_json;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct RegressArgs {
    /// Multiply every bound by this (below 1 is stricter).
    #[arg(long, default_value_t = 1.0)]
    pub bound_scale: f64,
    /// Run only these checks, comma-separated: `path`, `concurrency`, `gateway` or
    /// `gateway/<engine>` [default: all].
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Save the results as JSON to this file (written before the verdict).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw progress bars.
    #[arg(long)]
    pub progress: bool,
    /// Test hook, to prove that a check fails when its engine slows down: makes CHECK's engine
    /// side about FACTOR times slower (its baseline untouched), e.g. `gateway/tao=4`. Never
    /// for a real measurement.
    #[arg(long, value_name = "CHECK=FACTOR")]
    pub inject_slowdown: Option<Injection>,
}

pub fn run(args: RegressArgs) -> Result<()> {
    runtime::on_all_cores(async move {
        let report = regress::run(RegressParams {
            bound_scale: args.bound_scale,
            only: args.only,
            inject_slowdown: args.inject_slowdown,
            progress: args.progress,
        })
        .await?;
        println!("blindfold bench regress");
        print!("{}", regress::render(&report));
        save_json(args.json.as_deref(), &report)?;
        report.verdict()
    })
}
