//! `blindfold verify`: check every stored cell and the trusted state's consistency.

use anyhow::{bail, Result};
use clap::Args;

use crate::commands::data_dir::{
    gateway_running, open_gateway, serve_config, ClusterArgs, GatewayArgs,
};
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

pub fn run(a: VerifyArgs) -> Result<()> {
    runtime::on_all_cores(verify(a))
}

async fn verify(a: VerifyArgs) -> Result<()> {
    let cfg = serve_config(&a.gateway)?;
    if !cfg.data_dir.join("gateway.json").exists() {
        bail!("{} is not a blindfold data directory (no gateway.json)", cfg.data_dir.display());
    }
    if gateway_running(&cfg.data_dir) {
        // Verifying reads every cell through the engine, which the serving gateway alone
        // drives (one writer per store): it must not run beside it.
        bail!(
            "a gateway is serving from {dir}: stop it first (SIGTERM or Ctrl-C: a clean stop), \
             then run `blindfold verify --data-dir {dir}` again; meanwhile `blindfold status \
             --data-dir {dir}` shows how full it is and /metrics counts integrity errors \
             (blindfold_integrity_errors_total) as it serves",
            dir = cfg.data_dir.display()
        );
    }
    eprintln!("blindfold verify: opening {}", cfg.data_dir.display());
    let opened = open_gateway(&cfg, &a.cluster.nodes, a.cluster.tls_dir.as_deref()).await?;
    eprintln!("blindfold verify: reading every cell of {}", opened.params.store);
    // A bar on a terminal; elsewhere (logs, pipes) a line every tenth of the way.
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let pb = if tty { indicatif::ProgressBar::new(0) } else { indicatif::ProgressBar::hidden() };
    let mut tenths = 0;
    let report = blindfold_gateway::verify::verify(&opened, |done, total| {
        pb.set_length(total);
        pb.set_position(done);
        let t = (done * 10).checked_div(total).unwrap_or(10);
        if !tty && t > tenths {
            tenths = t;
            eprintln!("  checked {done} of {total} cells");
        }
    })
    .await?;
    pb.finish_and_clear();
    if opened.journal.is_some() {
        // A clean stop: the store checkpoint written, the store's lease given back.
        opened.objects.shutdown().await?;
        blindfold_gateway::server::write_snapshot(&opened).await?;
    }
    println!("blindfold verify {}", cfg.data_dir.display());
    println!("  buckets: {}, objects: {}", report.buckets, report.objects);
    println!("  cells authenticated: {}, never written: {}", report.cells_ok, report.cells_unused);
    for (cell, e) in &report.bad_cells {
        println!("  BAD cell {cell}: {e}");
    }
    match &report.damaged_objects {
        Some(names) => {
            for name in names {
                println!("  DAMAGED object (unreadable while those cells are bad): {name}");
            }
        }
        None => println!(
            "  the objects affected cannot be named with a recursive position map; every \
             object may be"
        ),
    }
    for p in &report.directory_problems {
        println!("  DIRECTORY: {p}");
    }
    if report.is_clean() {
        println!("  OK: every stored cell is authentic and the directory is consistent");
        Ok(())
    } else {
        bail!(
            "verification failed: {} bad cells, {} directory problems",
            report.bad_cells.len(),
            report.directory_problems.len()
        )
    }
}
