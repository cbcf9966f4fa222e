//! `blindfold recover`: rebuild a lost data directory from the store's snapshot and the key.

use std::sync::Arc;

use anyhow::{bail, Result};
use blindfold_gateway::server::{RebuiltElsewhere, RecoverHooks};
use clap::Args;

use crate::commands::data_dir::{serve_config, ClusterArgs, GatewayArgs};
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct RecoverArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// For a gateway whose blocks lived on ORAM nodes (`serve --nodes`): every node of its
    /// cluster, in any order. Recover reads every block of every node and writes every one
    /// again, each kept block at a fresh random place.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

pub fn run(a: RecoverArgs) -> Result<()> {
    runtime::on_all_cores(recover(a))
}

/// What `recover` is given to rebuild the engine: over the nodes with --nodes, else the
/// store's own arrays (refusing a snapshot of a gateway over nodes). A standby's takeover
/// (`serve --standby`) is given the same.
pub fn hooks(cluster: &ClusterArgs) -> Result<RecoverHooks> {
    let Some(tls_dir) = &cluster.tls_dir else {
        return Ok(RecoverHooks {
            check_state: Some(Box::new(|ckpt| {
                if blindfold_node::balancer::is_balancer_checkpoint(ckpt) {
                    Err("the snapshot is of a gateway whose blocks live on ORAM nodes: give \
                         --nodes (every node of its cluster) and --tls-dir (the balancer's \
                         certificates)"
                        .into())
                } else {
                    Ok(())
                }
            })),
            ..Default::default()
        });
    };
    let tls = blindfold_node::ClusterTls::load(tls_dir)?;
    let progress: Arc<dyn Fn(&str) + Send + Sync> =
        Arc::new(|m: &str| eprintln!("blindfold recover: {m}"));
    let rebuild = blindfold_node::recover::rebuild_fn(cluster.nodes.clone(), tls.clone(), progress);
    Ok(RecoverHooks {
        rebuild: Some(Box::new(move |dir, ckpt, key| {
            Box::pin(async move {
                let r = rebuild(dir, ckpt, key).await?;
                Ok(RebuiltElsewhere {
                    blocks_found: r.blocks_found,
                    summary: r.summary(),
                    lost: r.lost,
                })
            })
        })),
        engine_factory: Some(blindfold_node::balancer::engine_factory(
            cluster.nodes.clone(),
            tls,
            blindfold_node::BalancerConfig::default(),
        )),
        check_state: Some(Box::new(blindfold_node::balancer::expect_balancer_checkpoint)),
        tail: None,
    })
}

async fn recover(a: RecoverArgs) -> Result<()> {
    let cfg = serve_config(&a.gateway)?;
    let (opened, about) = blindfold_gateway::server::recover_with(&cfg, hooks(&a.cluster)?).await?;
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
    if opened.journal.is_some() {
        // A clean stop: the store checkpoint is written and the lease given back, so that
        // `blindfold serve` starts at once.
        opened.objects.shutdown().await?;
        blindfold_gateway::server::write_snapshot(&opened).await?;
    }
    // The key stays where it was given: the start command names it unless it is the default.
    let key_arg = match &cfg.key_file {
        Some(k) if *k != cfg.data_dir.join("key.json") => format!(" --key-file {}", k.display()),
        _ => String::new(),
    };
    let nodes_arg = match &a.cluster.tls_dir {
        Some(t) => format!(" --nodes {} --tls-dir {}", a.cluster.nodes.join(","), t.display()),
        None => String::new(),
    };
    println!(
        "  OK: start it with `blindfold serve --data-dir {}{key_arg}{nodes_arg}`",
        cfg.data_dir.display()
    );
    Ok(())
}
