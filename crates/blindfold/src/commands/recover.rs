//! `blindfold recover`: rebuild a lost data directory from the store's snapshot and the key.

use anyhow::{bail, Result};

use crate::commands::data_dir::{serve_config, GatewayArgs};
use crate::commands::runtime;

pub fn run(a: GatewayArgs) -> Result<()> {
    runtime::on_all_cores(recover(a))
}

async fn recover(a: GatewayArgs) -> Result<()> {
    let cfg = serve_config(&a)?;
    let (opened, about) = blindfold_gateway::server::recover(&cfg).await?;
    println!("blindfold recover: restored {about} into {}", cfg.data_dir.display());
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await?;
    println!(
        "  cells authenticated: {}, never written: {}, failed: {}",
        report.cells_ok,
        report.cells_unused,
        report.bad_cells.len()
    );
    if !report.is_clean() {
        bail!(
            "{} cells changed after the snapshot (the gateway wrote after its last clean stop); \
             objects stored in them cannot be recovered",
            report.bad_cells.len()
        );
    }
    // The key stays where it was given: the start command names it unless it is the default.
    let key_arg = match &cfg.key_file {
        Some(k) if *k != cfg.data_dir.join("key.json") => format!(" --key-file {}", k.display()),
        _ => String::new(),
    };
    println!(
        "  OK: start it with `blindfold serve --data-dir {}{key_arg}`",
        cfg.data_dir.display()
    );
    Ok(())
}
