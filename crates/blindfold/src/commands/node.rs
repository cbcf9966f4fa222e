//! `blindfold node`: one ORAM node of a cluster, serving the oblivious load balancer.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::parse::{parse_count, parse_listen};
use crate::commands::passphrase::read_passphrase;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct NodeArgs {
    /// Address to listen on (`host:port`; port 0 picks a free port, printed at start).
    #[arg(long, value_parser = parse_listen)]
    pub listen: std::net::SocketAddr,
    /// The node's own data directory (key, parameters, engine state; created on first start).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The node's untrusted store, as for `serve` (default: files in <data-dir>/cells).
    #[arg(long)]
    pub store: Option<StoreUrl>,
    /// Key file (default: <data-dir>/key.json, created on first start).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// The key file is protected by a passphrase ($BLINDFOLD_PASSPHRASE or standard input).
    #[arg(long)]
    pub passphrase: bool,
    /// The node's certificates: a directory written by `blindfold cluster-certs` (node-<i>).
    #[arg(long)]
    pub tls_dir: PathBuf,
    /// The node's engine, fixed at creation [default: tao].
    #[arg(long)]
    pub engine: Option<blindfold_gateway::server::OramEngine>,
    /// Blocks the node holds, fixed at creation (the balancer says how many it needs).
    #[arg(long, value_parser = parse_count, conflicts_with = "capacity")]
    pub blocks: Option<u64>,
    /// Or the node's capacity in bytes, as `serve --capacity` [default: 64MiB].
    #[arg(long, value_parser = blindfold_gateway::server::parse_size)]
    pub capacity: Option<u64>,
    /// Block size in bytes, fixed at creation; must be the gateway's [default: 4096].
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Trusted memory (MiB) for the top of the node's ORAM tree [default: 128 with tao (256
    /// on an s3:// store), 32 with path-oram].
    #[arg(long)]
    pub cache_mib: Option<u64>,
    /// Where the node makes a write durable before it answers, as `serve --durability`:
    /// `store` logs each of its engine's records in its own store (a lost node machine is
    /// then rebuilt with `blindfold recover --data-dir NEW --store URL --key-file KEY`, keep
    /// the key file off the machine), `local` only in its data directory. `auto`: `store`
    /// for s3://, redis:// and remote:// stores, `local` for files.
    #[arg(long, value_enum, default_value = "auto")]
    pub durability: crate::commands::data_dir::DurabilityArg,
    /// With `--durability store`: the node's lease on its store, as `serve --lease-ttl`.
    #[arg(long, value_parser = blindfold_store::parse_duration, default_value = "5s")]
    pub lease_ttl: std::time::Duration,
    /// With `--durability store`: a trusted record of how far the node's log reaches, as
    /// `serve --anchor` (one per node).
    #[arg(long, value_name = "PATH|URL")]
    pub anchor: Option<blindfold_gateway::anchor::AnchorSpec>,
}

pub fn run(a: NodeArgs) -> Result<()> {
    runtime::on_all_cores(node(a))
}

async fn node(a: NodeArgs) -> Result<()> {
    let passphrase = if a.passphrase { Some(Arc::new(read_passphrase()?)) } else { None };
    let block_size = a.block_size.unwrap_or(4096);
    let capacity = match (a.blocks, a.capacity) {
        (Some(b), _) => b.checked_mul(u64::from(block_size)).context("--blocks is too large")?,
        (None, Some(c)) => c,
        (None, None) => 64 << 20,
    };
    let cfg = blindfold_gateway::server::ServeConfig {
        listen: a.listen,
        data_dir: a.data_dir.clone(),
        store: a.store.clone(),
        key_file: a.key_file.clone(),
        passphrase,
        credentials: None,
        capacity,
        block_size,
        pad_objects: false,
        cache_mib: a.cache_mib.unwrap_or_else(|| {
            blindfold_gateway::server::default_cache_mib(
                a.engine.unwrap_or_default(),
                a.store.as_ref(),
            )
        }),
        engine: a.engine.unwrap_or_default(),
        in_place: false,
        pack_levels: 1,
        durability: a.durability.into(),
        lease_ttl: Some(a.lease_ttl),
        anchor: a.anchor.clone(),
        reads_ahead_of_log: false,
        log_feed: None,
    };
    let tls = blindfold_node::ClusterTls::load(&a.tls_dir)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        say_err!("blindfold node: shutting down");
    };
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .map_err(|e| anyhow::anyhow!("listening on {}: {e}", a.listen))?;
    let addr = listener.local_addr()?;
    // The node's data directory is opened as `serve` opens a gateway's; a node keeps no S3
    // credentials, so none are made.
    let mut cfg = cfg;
    cfg.credentials = Some(("blindfold-node".into(), "unused".into()));
    let mut opened = blindfold_gateway::server::open(&cfg).await?;
    for note in &opened.notes {
        say_err!("blindfold node: {note}");
    }
    let p = &opened.params;
    blindfold_node::node::info_of(p)?;
    say_out!("blindfold node serving at https://{addr}");
    say_out!("  data directory: {} (back up key.json)", a.data_dir.display());
    say_out!("  store: {} ({} engine)", p.store, p.engine);
    say_out!("  blocks: {} of {} bytes; node id {}", p.blocks, p.block_size, p.store_id);
    let node = blindfold_node::node::Opened {
        engine: std::sync::Arc::clone(opened.objects.engine()),
        params: opened.params.clone(),
        stopped: opened.stopped.clone(),
        // The balancer grows the node through the data directory's grower.
        grow: opened.grower.clone().map(blindfold_gateway::grow::grow_fn),
    };
    // A key rotation under way (`blindfold rotate-key --data-dir` of this node) re-seals the
    // node's cells while it serves, as a gateway's does.
    let sweeper = blindfold_gateway::rotation::Sweeper::start(&mut opened);
    blindfold_node::node::run(&node, listener, &tls, &a.data_dir, shutdown).await?;
    if let Some(sweeper) = sweeper {
        sweeper.stop().await;
    }
    // A clean stop: everything committed and checkpointed, and the encrypted snapshot written.
    opened.objects.shutdown().await?;
    if opened.snapshots.lock().is_some() {
        blindfold_gateway::server::write_snapshot(&opened).await?;
    }
    Ok(())
}
