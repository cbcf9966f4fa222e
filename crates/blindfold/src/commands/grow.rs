//! `blindfold grow`: grow a store to a larger capacity, through its running gateway or here.

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::commands::data_dir::{
    gateway_running, open_gateway, serve_config, ClusterArgs, GatewayArgs,
};
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct GrowArgs {
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// A gateway that keeps its blocks on ORAM nodes grows them too (each node rebuilds its
    /// own tree); not needed when the gateway is running.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// The new logical capacity, larger than today's (`4GiB`, `1.5TiB`; a bare number is
    /// bytes).
    #[arg(long, value_parser = blindfold_gateway::server::parse_size)]
    pub capacity: u64,
}

pub fn run(a: GrowArgs) -> Result<()> {
    runtime::on_all_cores(grow(a))
}

async fn grow(a: GrowArgs) -> Result<()> {
    use blindfold_gateway::grow::{Answer, Request, REQUEST_FILE, RESULT_FILE};
    use blindfold_gateway::server::{human_bytes, read_params};
    let dir = &a.gateway.data_dir;
    let Some(params) = read_params(dir)? else {
        bail!("{} is not a blindfold data directory (no gateway.json)", dir.display());
    };
    let blocks = a.capacity / u64::from(params.block_size);
    let now = params.blocks * u64::from(params.block_size);
    if blocks <= params.blocks {
        bail!(
            "{} already holds {} ({} blocks of {} bytes): give a larger --capacity (shrinking \
             is not supported); nothing was changed",
            dir.display(),
            human_bytes(now),
            params.blocks,
            params.block_size
        );
    }
    say_err!("{}", what_it_takes(&params, blocks));
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let spinner = |msg: String| {
        let pb = if tty {
            indicatif::ProgressBar::new_spinner()
        } else {
            indicatif::ProgressBar::hidden()
        };
        pb.enable_steady_tick(std::time::Duration::from_millis(200));
        pb.set_message(msg.clone());
        if !tty {
            say_err!("{msg}");
        }
        pb
    };
    if gateway_running(dir) {
        // The running gateway does it: it checks for a request every second.
        let _ = std::fs::remove_file(dir.join(RESULT_FILE));
        let request = dir.join(REQUEST_FILE);
        let tmp = dir.join(format!("{REQUEST_FILE}.tmp"));
        std::fs::write(&tmp, serde_json::to_vec(&Request { blocks })?)
            .and_then(|()| std::fs::rename(&tmp, &request))
            .with_context(|| format!("writing {}", request.display()))?;
        let pb = spinner(format!(
            "blindfold grow: the gateway on {} is growing the store to {} (requests wait meanwhile)",
            dir.display(),
            human_bytes(blocks * u64::from(params.block_size))
        ));
        let started = std::time::Instant::now();
        while request.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            if started.elapsed() > std::time::Duration::from_secs(10) && !gateway_running(dir) {
                pb.finish_and_clear();
                let _ = std::fs::remove_file(&request);
                bail!(
                    "the gateway stopped before it answered; run `blindfold grow` again (it \
                     grows right here when no gateway runs)"
                );
            }
        }
        pb.finish_and_clear();
        let raw = std::fs::read(dir.join(RESULT_FILE))
            .with_context(|| format!("reading the answer {}", dir.join(RESULT_FILE).display()))?;
        let answer: Answer = serde_json::from_slice(&raw)?;
        if answer.grown.is_none() {
            bail!("{}", answer.message);
        }
        say_out!("blindfold grow: {}", answer.message);
        return Ok(());
    }
    let cfg = serve_config(&a.gateway)?;
    let opened = open_gateway(&cfg, &a.cluster.nodes, a.cluster.tls_dir.as_deref()).await?;
    for note in &opened.notes {
        say_err!("blindfold: {note}");
    }
    let Some(grower) = opened.grower.clone() else {
        bail!(
            "the {} engine of {} cannot grow its store yet (nothing was changed): create a \
             larger gateway and copy the objects over (e.g. with `aws s3 sync`)",
            opened.params.engine,
            dir.display()
        );
    };
    let pb = spinner(format!(
        "blindfold grow: growing the ORAM of {} to {} blocks",
        dir.display(),
        blocks
    ));
    let grown = grower.grow(blocks).await;
    pb.finish_and_clear();
    let objects = std::sync::Arc::clone(&opened.objects);
    objects.shutdown().await?;
    if let Err(e) = blindfold_gateway::server::write_snapshot(&opened).await {
        say_err!("blindfold: no snapshot written: {e}");
    }
    let grown = grown?;
    say_out!("blindfold grow: {}", grown.describe());
    Ok(())
}

/// What a growth to `blocks` will take in the store, said before it starts: the store's size
/// goes by the ORAM tree's depth, so a capacity just past a power of two doubles it — then the
/// largest capacity the same store holds is named too.
fn what_it_takes(params: &blindfold_gateway::server::GatewayParams, blocks: u64) -> String {
    use blindfold_gateway::server::{footprint, human_bytes};
    // (the store's whole use, and the tree's part of it)
    let sized = |b: u64| {
        let mut p = params.clone();
        p.blocks = b;
        footprint(&p).map(|f| (f.store_bytes, f.oram_bytes)).ok()
    };
    let bs = u64::from(params.block_size);
    let (Some((now, _)), Some((then, tree))) = (sized(params.blocks), sized(blocks)) else {
        return format!("blindfold grow: growing to {}", human_bytes(blocks * bs));
    };
    let mut line = format!(
        "blindfold grow: {} → {} of capacity; the store will take up to {} (now {})",
        human_bytes(params.blocks * bs),
        human_bytes(blocks * bs),
        human_bytes(then),
        human_bytes(now)
    );
    // The largest capacity with the same store size (the search stops at 4 times the request).
    let (mut lo, mut hi) = (blocks, blocks.saturating_mul(4));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if sized(mid).is_some_and(|(_, t)| t <= tree) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    if lo >= blocks.saturating_add(blocks / 4) {
        line.push_str(&format!(
            ": the store's size goes by the depth of the ORAM tree, so the same store holds up to \
             {} — give --capacity {} to have all of it",
            human_bytes(lo * bs),
            human_bytes(lo * bs).replace(' ', "")
        ));
    }
    line
}
