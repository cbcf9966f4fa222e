//! The flags that name a gateway's data directory, its key and its store, shared by the
//! commands that open one, and what they open it with.

use std::path::PathBuf;

use anyhow::{bail, Result};
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::passphrase::read_passphrase;

#[derive(Args, Debug)]
pub struct KeyArgs {
    /// The key file.
    #[arg(long, default_value = "blindfold-data/key.json")]
    pub key_file: PathBuf,
    /// The key file is protected by a passphrase: read it from $BLINDFOLD_PASSPHRASE, or else
    /// one line of standard input.
    #[arg(long)]
    pub passphrase: bool,
}

#[derive(Args, Debug)]
pub struct GatewayArgs {
    /// Trusted state directory (key, credentials, directory, ORAM state, default store);
    /// created on first start, so its parent must exist.
    #[arg(long, default_value = "blindfold-data", env = "BLINDFOLD_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Untrusted store, fixed when the data directory is created (default: files in
    /// <data-dir>/cells): `file:///dir` (its parent must exist; `?sync=none|flush|always`),
    /// `s3://bucket/prefix?endpoint=http://host:port&region=…` (any S3-compatible store;
    /// credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), `redis://host:port/db`,
    /// `remote://host:port` (a `blindfold storage-server`), or `memory:` (lost on exit; tests).
    #[arg(long)]
    pub store: Option<StoreUrl>,
    /// Key file (default: <data-dir>/key.json, created on first start).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// The key file is (or is to be) protected by a passphrase: read it from
    /// $BLINDFOLD_PASSPHRASE, or else one line of standard input.
    #[arg(long)]
    pub passphrase: bool,
    /// Where a write is made durable before it is acknowledged. `store`: in the store too —
    /// each access batch's reveal records, each commit's record and each directory change are
    /// appended to a log in the store (batch writes of 64 KiB cells shared by concurrent
    /// requests, several in flight), and checkpoints of the trusted state go to the store every
    /// 30 s; `blindfold recover` on a new machine then restores every acknowledged write from
    /// the store and the key alone. Its cost is store round trips: a small write waits for
    /// two more than under `local` (its reveal records, then its commit record and directory
    /// change in one append; three with engines other than tao), a read for one (measured
    /// with 30 clients: 0.86–0.96 of `local`'s throughput on a MinIO on the same machine,
    /// 0.58–0.60 behind 50 ms, 0.91–0.93 there with a standby on the log feed
    /// (--standby-listen) and 0.93–0.96 with --reads-ahead-of-log; docs/benchmarks.md),
    /// and the log adds about a third to the bytes sent. `local`: in the data directory only (its redo log; a fsync, no store round
    /// trip): a lost data directory loses what was written since the last store checkpoint.
    /// `auto`: `store` for s3://, redis:// and remote:// stores, `local` for files.
    #[arg(long, value_enum, default_value = "auto")]
    pub durability: DurabilityArg,
    /// With `--durability store`: how long the gateway's lease on the store lasts unless it
    /// renews it (every quarter of it). A second gateway is refused while it lasts; after the
    /// gateway dies, a standby or `blindfold recover` elsewhere waits at most this long.
    /// Keep it well above the clock difference between the machines. `500ms`, `5s`, `5`.
    #[arg(long, value_parser = blindfold_store::parse_duration, default_value = "5s")]
    pub lease_ttl: std::time::Duration,
    /// With `--durability store`: a small sealed record, kept somewhere you trust, of how far
    /// the store-side log reaches — a directory on another disk, or the URL of another store
    /// (`file://`, `s3://`, `redis://`, `remote://`). `serve` updates it before each group of
    /// writes is acknowledged (one small flushed write: on a local disk well under a
    /// millisecond, on another machine one more round trip); `recover` and a standby's
    /// takeover then refuse a store that lost or withheld the log's newest entries, which
    /// would otherwise roll the gateway back unnoticed (SECURITY.md). Give the same one to
    /// every run and to `recover`.
    #[arg(long, value_name = "PATH|URL")]
    pub anchor: Option<blindfold_gateway::anchor::AnchorSpec>,
    /// With `--durability store`: a read no longer waits for the store to hold the record of
    /// the path it is about to read (its reveal record still goes to the store's log at once,
    /// and the next acknowledged write waits for it). That saves a read its extra store round
    /// trip (30 clients behind 50 ms: 0.93–0.96 of `local`'s throughput instead of 0.58–0.60;
    /// docs/benchmarks.md).
    /// What it costs: the store may lack the last reads' reveal records when the machine is
    /// lost, so a recovery from the store alone (`blindfold recover`, a standby's takeover)
    /// rebuilds the whole tree with fresh random leaves before serving — it reads every cell
    /// of the store array and writes every cell of a new one, setting blocks aside on the
    /// local disk beyond --rebuild-memory — instead of replaying the log. Nothing acknowledged
    /// is lost either way. The TaoStore and Path/Ring ORAM engines read ahead; the others keep
    /// waiting (the flag changes nothing for them, and their recovery rebuilds nothing). Not
    /// for gateways over ORAM nodes.
    #[arg(long)]
    pub reads_ahead_of_log: bool,
    /// How much block data a rebuild of the tree may hold in memory (TaoStore, Path and Ring
    /// ORAM): a recovery that rebuilds (after --reads-ahead-of-log, or a standby's takeover
    /// from such a gateway) and `blindfold grow`, here or in the running gateway. What does
    /// not fit is set aside on the data directory's disk, sealed under a key that lives only
    /// in memory, and read back in the order the new tree is written: the disk then needs
    /// room for the blocks in use. The partition and `tee` engines hold their blocks in
    /// memory regardless. `1GiB`, `512MiB`; at least 64 KiB.
    #[arg(long, value_name = "SIZE", value_parser = blindfold_gateway::server::parse_size, default_value = "1GiB")]
    pub rebuild_memory: u64,
}

/// `--durability`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DurabilityArg {
    /// `store` for s3://, redis:// and remote:// stores, `local` for the others.
    Auto,
    /// In the data directory only.
    Local,
    /// In the store as well.
    Store,
}

impl From<DurabilityArg> for blindfold_gateway::server::Durability {
    fn from(d: DurabilityArg) -> Self {
        use blindfold_gateway::server::Durability;
        match d {
            DurabilityArg::Auto => Durability::Auto,
            DurabilityArg::Local => Durability::Local,
            DurabilityArg::Store => Durability::Store,
        }
    }
}

#[derive(Args, Debug)]
pub struct UserDirArgs {
    /// The gateway's data directory.
    #[arg(long, default_value = "blindfold-data", env = "BLINDFOLD_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Key file (default: <data-dir>/key.json).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// The key file is protected by a passphrase: read it from $BLINDFOLD_PASSPHRASE, or else
    /// one line of standard input.
    #[arg(long)]
    pub passphrase: bool,
}

/// File recording the time of the last clean stop in a data directory.
pub const CLEAN_STOP_FILE: &str = "last-clean-stop";

pub fn serve_config(g: &GatewayArgs) -> Result<blindfold_gateway::server::ServeConfig> {
    blindfold_proxy::rebuild::set_memory_limit(g.rebuild_memory);
    let passphrase =
        if g.passphrase { Some(std::sync::Arc::new(read_passphrase()?)) } else { None };
    Ok(blindfold_gateway::server::ServeConfig {
        listen: "127.0.0.1:0".parse().expect("address"),
        data_dir: g.data_dir.clone(),
        store: g.store.clone(),
        key_file: g.key_file.clone(),
        passphrase,
        credentials: None,
        capacity: 1 << 30,
        block_size: 4096,
        pad_objects: false,
        cache_mib: blindfold_gateway::server::DEFAULT_CACHE_MIB,
        engine: Default::default(),
        in_place: false,
        pack_levels: 1,
        durability: g.durability.into(),
        lease_ttl: Some(g.lease_ttl),
        anchor: g.anchor.clone(),
        reads_ahead_of_log: g.reads_ahead_of_log,
        log_feed: None,
    })
}

/// Where the blocks of a gateway that keeps them on ORAM nodes live, for the commands that
/// open its data directory.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClusterArgs {
    /// The ORAM nodes of a gateway that keeps its blocks on nodes (as given to `serve
    /// --nodes`), comma-separated `https://host:port`; they must be running.
    #[arg(long, value_delimiter = ',', requires = "tls_dir")]
    pub nodes: Vec<String>,
    /// With --nodes: the balancer's certificates (`blindfold cluster-certs`, `balancer`).
    #[arg(long, requires = "nodes")]
    pub tls_dir: Option<std::path::PathBuf>,
}

/// Opens the gateway of `cfg` over its own store or, for a data directory whose blocks live on
/// ORAM nodes, over the nodes at `nodes` with the balancer's certificates in `tls_dir`.
pub async fn open_gateway(
    cfg: &blindfold_gateway::server::ServeConfig,
    nodes: &[String],
    tls_dir: Option<&std::path::Path>,
) -> Result<blindfold_gateway::server::Opened> {
    use blindfold_gateway::server::read_params;
    let balancer_dir = blindfold_node::balancer::is_balancer_dir(&cfg.data_dir.join("oram"));
    Ok(match tls_dir {
        Some(tls_dir) => {
            if read_params(&cfg.data_dir)?.is_some() && !balancer_dir {
                bail!("{} keeps its blocks in its own store, not on nodes", cfg.data_dir.display());
            }
            let tls = blindfold_node::ClusterTls::load(tls_dir)?;
            let factory = blindfold_node::balancer::engine_factory(
                nodes.to_vec(),
                tls,
                blindfold_node::BalancerConfig::default(),
            );
            let hooks = blindfold_gateway::server::OpenHooks {
                engine_factory: Some(factory),
                ..Default::default()
            };
            blindfold_gateway::server::open_with(cfg, hooks).await?
        }
        None if balancer_dir => bail!(
            "{} keeps its blocks on ORAM nodes: give --nodes (see {}) and --tls-dir",
            cfg.data_dir.display(),
            cfg.data_dir.join("oram").join(blindfold_node::balancer::NODES_FILE).display()
        ),
        None => blindfold_gateway::server::open(cfg).await?,
    })
}

/// Whether a gateway holds the data directory `dir` open (its directory database is locked).
pub fn gateway_running(dir: &std::path::Path) -> bool {
    match std::fs::File::open(dir.join("meta.redb")) {
        Ok(f) => matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}
