//! `blindfold serve`: the S3 API (and Swift, and the admin listener) over oblivious storage.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use blindfold_gateway::tls::{Tls, TlsSource};
use blindfold_store::StoreUrl;
use clap::Args;

use crate::commands::data_dir::{open_gateway, serve_config, GatewayArgs, CLEAN_STOP_FILE};
use crate::commands::parse::parse_listen;
use crate::commands::runtime;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Read settings from a TOML file: each key is a long flag of `blindfold serve` without
    /// its dashes (`data-dir = "/var/lib/blindfold"`, `admin-listen = "127.0.0.1:9101"`,
    /// `in-place = true`). Flags and environment variables given as well override it.
    /// `docs/blindfold.example.toml` lists every key.
    #[arg(long, env = "BLINDFOLD_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub gateway: GatewayArgs,
    /// Address to listen on: `host:port` (a name or an IP address) or a bare port (on
    /// 127.0.0.1).
    #[arg(long, default_value = "127.0.0.1:9100", env = "BLINDFOLD_LISTEN", value_parser = parse_listen)]
    pub listen: std::net::SocketAddr,
    /// S3 access key (default: from <data-dir>/credentials.json, generated on first start).
    #[arg(long, env = "BLINDFOLD_ACCESS_KEY", requires = "secret_key", value_parser = parse_access_key)]
    pub access_key: Option<String>,
    /// S3 secret key (not blank).
    #[arg(long, env = "BLINDFOLD_SECRET_KEY", requires = "access_key", hide_env_values = true, value_parser = parse_secret_key)]
    pub secret_key: Option<String>,
    /// Logical capacity of a new store [default: 1GiB]: a bare number is bytes; KiB, MiB,
    /// GiB, TiB are powers of 1024, KB, MB, GB, TB powers of 1000; decimals are accepted
    /// (1.5GiB). The store takes about 4.2 times this, 2.1 with --in-place (the banner says
    /// exactly).
    #[arg(long, value_parser = blindfold_gateway::server::parse_size)]
    pub capacity: Option<u64>,
    /// ORAM block size of a new store, in bytes [default: 65536 on an `s3://` store, where
    /// requests are slow and billed; 4096 on any other]. Every block carries fixed overhead
    /// (sealing, tree slots): small blocks make the store many times the capacity.
    #[arg(long)]
    pub block_size: Option<u32>,
    /// Create a new store even if it takes more than 3 bytes of store per byte of capacity
    /// (small blocks).
    #[arg(long)]
    pub allow_overhead: bool,
    /// Pad every object to a power-of-two number of blocks, so the store learns only each
    /// object's size class (costs up to 2× space and traffic). Fixed at creation.
    #[arg(long)]
    pub pad_objects: bool,
    /// Trusted memory (MiB) for the top levels of the ORAM tree of a new store: each cached
    /// level saves one bucket of storage traffic per access, for either engine (with `tao`,
    /// not on an --in-place store; `tao` holds each cached bucket sealed until first used,
    /// then open instead, and fills the budget bucket by bucket: whole levels, then the left
    /// part of the next, so paths to leaves below that part skip one more bucket). Fixed at
    /// creation [default: 128 with tao (256 on an s3:// store, which bills every request and
    /// byte a cached level saves), 32 with path-oram].
    #[arg(long)]
    pub cache_mib: Option<u64>,
    /// Oblivious engine of a new store: `tao` (concurrent, TaoStore design: many block
    /// accesses in flight at once), `path-oram` (sequential Path ORAM), `tee` (Zhang's
    /// TEE-assisted engine), `oblivistore` (ObliviStore: partitions of levelled ORAMs,
    /// shuffled in the background; about 6× the capacity in store space), `curious` (CURIOUS
    /// over the same partitions: one partition per access, up to b = 3 blocks per eviction)
    /// or `curious-path` (CURIOUS over Path ORAM partitions with buckets of z = 5: one path
    /// read and written back per access). Fixed at creation [default: tao].
    #[arg(long)]
    pub engine: Option<blindfold_gateway::server::OramEngine>,
    /// Lay a new store out with one copy of each ORAM cell, overwritten in place: half the
    /// store size, but every commit first writes its cells to the local redo log (the
    /// default keeps two slots per cell and logs only which cells moved). Fixed at creation.
    #[arg(long)]
    pub in_place: bool,
    /// With the tao engine: store the ORAM tree in subtrees of this many levels (1 to 4) per
    /// store object, so an access costs a store request per that many levels of its path
    /// instead of one per level, and moves the whole subtrees (2^N - 1 buckets for N). Up to
    /// 256 MiB of recently read subtrees stay in trusted memory for the write-backs (counted
    /// in the banner's estimate). Pays on a store that bills and waits per request (S3); see
    /// "Packing" in docs/benchmarks.md. Fixed at creation [default: 1, a bucket per object].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    pub pack_levels: Option<u32>,
    /// Also serve the admin listener on this address: Prometheus `/metrics`, `/healthz`,
    /// `/readyz`, the dashboard (`/`) and the access-pattern visualizer (`/visualizer`).
    /// Everything but the probes needs the S3 keys (HTTP Basic) or --admin-token. Off by
    /// default; keep it on a private address.
    #[arg(long, env = "BLINDFOLD_ADMIN_LISTEN", value_parser = parse_listen)]
    pub admin_listen: Option<std::net::SocketAddr>,
    /// A token that also opens the admin listener (`Authorization: Bearer TOKEN`), so a
    /// Prometheus server need not hold the S3 secret.
    /// At least 16 visible characters; a blank one is refused (it would let anyone in).
    #[arg(long, env = "BLINDFOLD_ADMIN_TOKEN", hide_env_values = true, value_parser = parse_admin_token)]
    pub admin_token: Option<String>,
    /// Price table entry for the cost metrics: aws-s3, gcs, azure-blob, ibm-cos,
    /// backblaze-b2 or cloudflare-r2 (see docs/cost.md), or an id from --prices.
    #[arg(long, default_value = "aws-s3")]
    pub price_provider: String,
    /// Override the built-in prices (JSON or TOML, as for `bench gateway --prices`).
    #[arg(long)]
    pub prices: Option<PathBuf>,
    /// Serve S3 (and the admin listener) over HTTPS with a self-signed certificate, made on
    /// first start in <data-dir>/tls/ (for localhost, 127.0.0.1, ::1 and --tls-name) and
    /// reused; the banner prints its fingerprint and how to make clients trust it. For a
    /// certificate of your own, give --tls-cert and --tls-key instead.
    #[arg(long, value_enum, env = "BLINDFOLD_TLS", conflicts_with_all = ["tls_cert", "tls_key"])]
    pub tls: Option<TlsMode>,
    /// Serve over HTTPS with this certificate chain (PEM, leaf first). Reloaded with its key
    /// on SIGHUP: new connections get the new certificate, open ones are not dropped.
    #[arg(long, env = "BLINDFOLD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "BLINDFOLD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// More names (DNS names or IP addresses, comma-separated) for the self-signed
    /// certificate of `--tls self-signed`; used when it is first made.
    #[arg(long, value_delimiter = ',', requires = "tls")]
    pub tls_name: Vec<String>,
    /// Grow the store automatically, to twice its capacity, when this percentage of its
    /// blocks is in use (1-100; off by default). Requests wait while it grows; the store
    /// learns when the threshold was crossed (see SECURITY.md).
    #[arg(long, env = "BLINDFOLD_GROW_AT", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub grow_at: Option<u8>,
    /// Also serve the OpenStack Swift API on this address (`host:port` or a bare port), over the
    /// same buckets and objects as S3: TempAuth sign-in at `/auth/v1.0` with
    /// `X-Auth-User: <account>:<access key>` and `X-Auth-Key: <secret key>` (the S3 keys), e.g.
    /// `swift -A http://ADDR/auth/v1.0 -U blindfold:AK -K SK list`. Off by default.
    #[arg(long, env = "BLINDFOLD_SWIFT_LISTEN", value_parser = parse_listen)]
    pub swift_listen: Option<std::net::SocketAddr>,
    /// How often the lifecycle worker applies the buckets' lifecycle rules (expirations,
    /// noncurrent versions, incomplete uploads). A fixed schedule: the store sees the same
    /// work every run, whatever expires (see SECURITY.md). `30s`, `1h`.
    #[arg(long, value_parser = blindfold_store::parse_duration, default_value = "1h")]
    pub lifecycle_every: std::time::Duration,
    /// How long one day of the lifecycle rules lasts: 24 hours, or shorter to try rules out
    /// without waiting days (with `10s`, "Days: 3" expires an object 30 seconds after it was
    /// written). With anything but 24h, expiry times are not rounded to midnight.
    #[arg(long, value_parser = blindfold_store::parse_duration, default_value = "24h")]
    pub lifecycle_day: std::time::Duration,
    /// Connections the S3 and Swift listeners hold open at once, together; one past it is
    /// answered 503 (Retry-After) and closed. Keep it below the file-descriptor limit
    /// (`ulimit -n`) less what the store needs. The admin listener has 64 of its own.
    #[arg(long, env = "BLINDFOLD_MAX_CONNECTIONS", default_value_t = blindfold_gateway::listen::DEFAULT_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,
    /// Seconds a client may take to send a request's header before it is cut off (a client
    /// sending half a header holds nothing for long).
    #[arg(long, env = "BLINDFOLD_HEADER_TIMEOUT", default_value_t = blindfold_gateway::listen::DEFAULT_HEADER_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout: u64,
    /// Seconds a connection may stay with no byte moving while none of its requests is being
    /// answered, before it is closed.
    #[arg(long, env = "BLINDFOLD_IDLE_TIMEOUT", default_value_t = blindfold_gateway::listen::DEFAULT_IDLE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_timeout: u64,
    /// The largest capacity automatic growth goes to (default: no limit).
    #[arg(long, requires = "grow_at", value_parser = blindfold_gateway::server::parse_size)]
    pub grow_max: Option<u64>,
    /// Keep the blocks on these ORAM nodes (`blindfold node`), comma-separated
    /// `https://host:port`, with this gateway as their oblivious load balancer. Fixed at
    /// creation: later starts need the same nodes (in any order).
    #[arg(long, value_delimiter = ',', requires = "tls_dir", conflicts_with = "grow_at")]
    pub nodes: Vec<String>,
    /// With --nodes: the balancer's certificates, a directory written by `blindfold
    /// cluster-certs` (`balancer`).
    #[arg(long, requires = "nodes")]
    pub tls_dir: Option<PathBuf>,
    /// Wait as a standby of the gateway that holds the lease on --store (run with
    /// `--durability store`): follow its store checkpoints and log, and take over as soon as
    /// its lease lapses (within --lease-ttl of its death, plus the replay of its log): recover
    /// --data-dir (empty until then) from the store alone, take the lease, and serve on
    /// --listen. Put a DNS name or load balancer in front of both so clients reconnect. A
    /// standby of a gateway over ORAM nodes is given the same --nodes and --tls-dir.
    #[arg(long, requires = "store")]
    pub standby: bool,
    /// With `--durability store`: serve the log feed to one standby on this address (for
    /// example `0.0.0.0:7070`; keep it on a private network). A standby started with `--standby
    /// --primary HOST:PORT` receives every entry of the store-side log as it is queued, over a
    /// connection sealed under the key (anyone without the key file is refused), and a read then
    /// waits for the standby or the store, whichever holds its reveal record first: on a LAN a
    /// read no longer waits for the store's round trip. A write still waits for the store. While
    /// a standby is connected, a recovery from the store alone (`blindfold recover`, or a standby
    /// that was not connected) rebuilds the tree with fresh leaves, as with
    /// --reads-ahead-of-log; the connected standby's takeover replays the log instead. Without a
    /// connected standby, reads wait for the store as before.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["standby", "reads_ahead_of_log"])]
    pub standby_listen: Option<std::net::SocketAddr>,
    /// With --standby: follow the primary's log feed at HOST:PORT (its --standby-listen), so
    /// that reads on the primary need not wait for the store, and a takeover replays the log's
    /// tail the store may lack instead of rebuilding the tree.
    #[arg(long, value_name = "HOST:PORT", requires = "standby")]
    pub primary: Option<String>,
    /// Disk space kept in reserve in the data directory (a file, `disk-reserve`), given up the
    /// moment the disk fills: the engine's logs then have room, reads, listings and deletes go
    /// on, and new data is refused (S3 503 SlowDown, Swift 507, naming the disk and what to
    /// free) until there is room for the reserve again, when writing resumes by itself. `0`
    /// turns this off (a full disk then stops the gateway).
    #[arg(long, env = "BLINDFOLD_DISK_RESERVE", default_value = "64MiB", value_parser = blindfold_gateway::server::parse_size)]
    pub disk_reserve: u64,
}

/// How `serve` gets a TLS certificate without --tls-cert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    /// Make a self-signed certificate on first start and keep it in <data-dir>/tls/.
    SelfSigned,
}

pub fn run(a: ServeArgs) -> Result<()> {
    runtime::on_all_cores(serve(a))
}

/// Parses `--admin-token`: refuses a blank or short token (see
/// [`blindfold_gateway::admin::check_admin_token`]), from the flag, the variable or the config
/// file alike.
fn parse_admin_token(s: &str) -> Result<String, String> {
    blindfold_gateway::admin::check_admin_token(s)?;
    Ok(s.to_owned())
}

/// Parses `--access-key`: not blank.
fn parse_access_key(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("the access key is blank: give one, or leave --access-key and \
                    $BLINDFOLD_ACCESS_KEY unset to use <data-dir>/credentials.json"
            .into());
    }
    Ok(s.to_owned())
}

/// Parses `--secret-key`: not blank (an empty secret would let anyone who knows the access
/// key sign requests).
fn parse_secret_key(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("the secret key is blank, which would let anyone who knows the access key \
                    in: give one, or leave --secret-key and $BLINDFOLD_SECRET_KEY unset to use \
                    <data-dir>/credentials.json"
            .into());
    }
    Ok(s.to_owned())
}

/// Flags that fix a new store's shape must agree with an existing data directory.
fn check_flags_against(a: &ServeArgs, p: &blindfold_gateway::server::GatewayParams) -> Result<()> {
    use blindfold_gateway::server::human_bytes;
    let mut clashes = Vec::new();
    if let Some(c) = a.capacity {
        // A store grown past the capacity it was made with still starts with that flag.
        let blocks = c / u64::from(a.block_size.unwrap_or(p.block_size));
        if blocks > p.blocks {
            bail!(
                "--capacity {}: {} holds {}; to make it larger, run `blindfold grow \
                 --data-dir {} --capacity {}` (the gateway may keep running)",
                human_bytes(c),
                a.gateway.data_dir.display(),
                human_bytes(p.blocks * u64::from(p.block_size)),
                a.gateway.data_dir.display(),
                human_bytes(c),
            );
        }
        if blocks < p.blocks {
            say_err!(
                "blindfold: --capacity {} is below this store's capacity, {}: a store's capacity \
                 is fixed when it is made and only grows (`blindfold grow`), so it starts at its \
                 own size; the flag can go",
                human_bytes(c),
                human_bytes(p.blocks * u64::from(p.block_size))
            );
        }
    }
    if let Some(b) = a.block_size.filter(|&b| b != p.block_size) {
        clashes.push(format!("--block-size {b} (it uses {})", p.block_size));
    }
    if a.pad_objects && !p.pad_objects {
        clashes.push("--pad-objects (it was created without padding)".into());
    }
    if a.in_place && p.two_slots() {
        clashes.push("--in-place (it keeps two slots per cell)".into());
    }
    if let Some(e) = a.engine.filter(|&e| e != p.engine) {
        clashes.push(format!("--engine {e} (it uses {})", p.engine));
    }
    if let Some(l) = a.pack_levels.filter(|&l| l != p.tao_pack_levels()) {
        clashes.push(format!("--pack-levels {l} (it keeps {})", p.layout()));
    }
    if a.cache_mib.is_some() {
        let kept = p.cache_summary().unwrap_or_else(|| "no tree level".into());
        clashes.push(format!("--cache-mib (it keeps {kept} in memory)"));
    }
    if !clashes.is_empty() {
        bail!(
            "{} already holds a store, whose shape was fixed when it was created; these flags \
             contradict it: {}. Leave them out to use the store as it is, or give another \
             --data-dir to create a new one",
            a.gateway.data_dir.display(),
            clashes.join(", ")
        );
    }
    Ok(())
}

/// The block size of a new store when `--block-size` is not given: 64 KiB on an S3-compatible
/// store, 4 KiB on every other. Measured with `bench gateway` (docs/benchmarks.md, "Block
/// size"): on MinIO, 64 KiB blocks gave the gateway 2.5 times the throughput of 4 KiB blocks at
/// 0.39 times the dollars at S3 list prices (a request-priced store that is slow per request);
/// on local files or memory, 4 KiB blocks were fastest.
fn default_block_size(store: Option<&StoreUrl>) -> u32 {
    match store {
        Some(StoreUrl::S3 { .. }) => 64 << 10,
        _ => 4096,
    }
}

async fn serve(a: ServeArgs) -> Result<()> {
    use blindfold_gateway::server::{footprint, human_bytes, new_params, read_params};
    let mut cfg = serve_config(&a.gateway)?;
    cfg.log_feed = match (&a.standby_listen, &a.primary) {
        (Some(addr), _) => Some(blindfold_gateway::feed::LogFeed::Serve(*addr)),
        (None, Some(primary)) => Some(blindfold_gateway::feed::LogFeed::Follow(primary.clone())),
        (None, None) => None,
    };
    cfg.listen = a.listen;
    cfg.credentials = a.access_key.clone().zip(a.secret_key.clone());
    cfg.capacity = a.capacity.unwrap_or(1 << 30);
    cfg.block_size = a.block_size.unwrap_or_else(|| default_block_size(cfg.store.as_ref()));
    cfg.pad_objects = a.pad_objects;
    cfg.engine = a.engine.unwrap_or_default();
    cfg.cache_mib = a.cache_mib.unwrap_or_else(|| {
        blindfold_gateway::server::default_cache_mib(cfg.engine, cfg.store.as_ref())
    });
    cfg.in_place = a.in_place;
    cfg.pack_levels = a.pack_levels.unwrap_or(1);
    // Everything that can be checked is checked before anything is created.
    match read_params(&cfg.data_dir)? {
        Some(p) => check_flags_against(&a, &p)?,
        None => {
            // A mistyped --data-dir is not silently made either: its parent must exist.
            let d = &cfg.data_dir;
            let parent = d.parent().filter(|p| !p.as_os_str().is_empty());
            if !d.exists() && parent.is_some_and(|p| !p.is_dir()) {
                bail!(
                    "the data directory {} does not exist, nor does its parent {}: check the \
                     path, or create the parent directory first",
                    d.display(),
                    parent.map(|p| p.display().to_string()).unwrap_or_default()
                );
            }
            // A mistyped `file://` path is not silently made: its parent must exist.
            if let Some(StoreUrl::File { dir, .. }) = &cfg.store {
                let parent_ok = dir.parent().is_none_or(|p| p.as_os_str().is_empty() || p.exists());
                if !dir.exists() && !parent_ok {
                    bail!(
                        "the store directory {} does not exist, nor does its parent: check the \
                         path, or create the parent directory first",
                        dir.display()
                    );
                }
            }
            let p = new_params(&cfg)?;
            let f = footprint(&p)?;
            // (A balancer's blocks live on its nodes, each with its own disk.)
            if a.nodes.is_empty() {
                check_room(&cfg, &f, a.disk_reserve)?;
            }
            // Per copy of each cell: the two-slot layout doubles every block's share.
            let copies = if p.two_slots() { 2.0 } else { 1.0 };
            // The engines whose store is large by design, whatever the block size.
            let by_design = p.engine.store_overhead();
            if let (Some(why), false) = (by_design, a.allow_overhead) {
                if f.ratio() > 3.0 * copies {
                    bail!(
                        "this store would take {} in the store for {} of capacity ({:.1}×): the \
                         {} engine keeps {why}. A larger --block-size changes little; pass \
                         --allow-overhead to accept it, or use --engine tao (about {}×)",
                        human_bytes(f.oram_bytes),
                        human_bytes(f.capacity_bytes),
                        f.ratio(),
                        p.engine,
                        2 * copies as u32
                    );
                }
            }
            if by_design.is_none() && f.ratio() > 3.0 * copies && !a.allow_overhead {
                bail!(
                    "this store would take {} in the store for {} of capacity ({:.1}× — each \
                     {}-byte block carries fixed overhead: its seal and its share of the tree, \
                     {}); use a larger --block-size (4096 takes about {}×), or pass \
                     --allow-overhead",
                    human_bytes(f.oram_bytes),
                    human_bytes(f.capacity_bytes),
                    f.ratio(),
                    f.block_size,
                    if p.two_slots() {
                        "twice: two slots per cell (--in-place keeps one)"
                    } else {
                        "once: one copy per cell"
                    },
                    2 * copies as u32
                );
            }
        }
    }
    // Certificate files of the operator's are checked before anything is created.
    let mut tls = match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => Some(
            Tls::load(TlsSource::Files { cert: cert.clone(), key: key.clone() })
                .context("--tls-cert/--tls-key")?,
        ),
        _ => None,
    };
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .with_context(|| format!("listening on {}", cfg.listen))?;
    let addr = listener.local_addr()?;
    let swift_listener = match a.swift_listen {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.with_context(|| {
            format!("--swift-listen {addr}: cannot listen there (in use, or not ours)")
        })?),
        None => None,
    };
    // Every listener is bound before anything is created: a taken port changes nothing.
    let admin = match a.admin_listen {
        Some(admin_addr) => {
            Some(tokio::net::TcpListener::bind(admin_addr).await.with_context(|| {
                format!("--admin-listen {admin_addr}: cannot listen there (in use, or not ours)")
            })?)
        }
        None => None,
    };
    let model = match a.admin_listen {
        Some(_) => Some(cost_model(&a.price_provider, a.prices.as_deref())?),
        None => None,
    };
    let space = blindfold_gateway::space::Guard::prepare(&cfg.data_dir, a.disk_reserve);
    let mut opened = if a.standby {
        let say: std::sync::Arc<dyn Fn(&str) + Send + Sync> =
            std::sync::Arc::new(|m: &str| say_err!("blindfold serve: {m}"));
        // Over ORAM nodes (--nodes): the takeover opens the balancer over them.
        let cluster = crate::commands::data_dir::ClusterArgs {
            nodes: a.nodes.clone(),
            tls_dir: a.tls_dir.clone(),
        };
        let hooks = move || {
            crate::commands::recover::hooks(&cluster)
                .map_err(|e| blindfold_gateway::GatewayError::Config(format!("{e:#}")))
        };
        let (opened, about) = blindfold_gateway::standby::take_over_with(&cfg, say, &hooks).await?;
        say_err!("blindfold serve: standby {about}");
        opened
    } else {
        open_gateway(&cfg, &a.nodes, a.tls_dir.as_deref()).await?
    };
    opened.limits = blindfold_gateway::listen::Limits::new(
        a.max_connections as usize,
        std::time::Duration::from_secs(a.header_timeout),
        std::time::Duration::from_secs(a.idle_timeout),
    );
    opened.grow_at = a.grow_at;
    opened.lifecycle =
        blindfold_gateway::lifecycle::Schedule { every: a.lifecycle_every, day: a.lifecycle_day };
    space.attach(opened.objects.directory().write_gate());
    opened.space = Some(space);
    opened.grow_max = a.grow_max.map(|m| m / u64::from(opened.params.block_size));
    if a.tls == Some(TlsMode::SelfSigned) {
        let dir = cfg.data_dir.join("tls");
        tls = Some(
            Tls::load(TlsSource::SelfSigned { dir: dir.clone(), names: a.tls_name.clone() })
                .with_context(|| format!("--tls self-signed (in {})", dir.display()))?,
        );
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    // Installed before anything is printed: a SIGTERM sent on seeing the first note (or the
    // banner) stops the gateway cleanly instead of killing it.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    for note in &opened.notes {
        say_err!("blindfold: {note}");
    }
    let _ = std::fs::remove_file(cfg.data_dir.join(CLEAN_STOP_FILE));
    let f = footprint(&opened.params)?;
    let (ak, sk) = opened.credentials.clone();
    say_out!("blindfold {} serving S3 at {scheme}://{addr}", env!("CARGO_PKG_VERSION"));
    if let Some(t) = &tls {
        let (cert, key) = t.source().files();
        say_out!("  TLS: {} (SHA-256 {})", cert.display(), t.fingerprint());
        if matches!(t.source(), TlsSource::SelfSigned { .. }) {
            say_out!(
                "  trust it: aws --ca-bundle {c} | AWS_CA_BUNDLE={c} (boto3, git-remote-s3) | \
                 rclone --ca-cert {c} | restic --cacert {c} | s3cmd --ca-certs={c} | swift --os-cacert {c} | curl --cacert {c}",
                c = cert.display()
            );
        } else {
            say_out!("  key: {} (both reloaded on SIGHUP)", key.display());
        }
    }
    if let Some(l) = swift_listener {
        let swift_addr = l.local_addr()?;
        // A self-signed certificate must be named to the client, or it refuses the gateway.
        let cacert = match &tls {
            Some(t) if matches!(t.source(), TlsSource::SelfSigned { .. }) => {
                format!(" --os-cacert {}", t.source().files().0.display())
            }
            _ => String::new(),
        };
        say_out!(
            "  swift: {scheme}://{swift_addr}/auth/v1.0 (TempAuth: user blindfold:<access key>, \
             key <secret key>; e.g. swift{cacert} -A {scheme}://{swift_addr}/auth/v1.0 -U \
             blindfold:{ak} -K … list)"
        );
        opened.swift_listener = Some(l);
    }
    say_out!("  data directory: {} (back up key.json)", cfg.data_dir.display());
    if a.nodes.is_empty() {
        say_out!("  store: {} ({} engine)", opened.params.store, opened.params.engine);
    } else {
        say_out!("  nodes: {} (oblivious load balancer)", a.nodes.join(", "));
    }
    say_out!(
        "  capacity: {} ({} blocks of {} bytes){}",
        human_bytes(f.capacity_bytes),
        f.blocks,
        f.block_size,
        if opened.params.pad_objects { ", object sizes padded" } else { "" }
    );
    if a.nodes.is_empty() {
        say_out!(
            "  store use: up to {}; trusted memory: about {}",
            human_bytes(f.store_bytes),
            human_bytes(f.trusted_bytes)
        );
    }
    if opened.new_credentials {
        say_out!(
            "  S3 credentials (saved in {}): access key {ak}, secret key {sk}",
            cfg.data_dir.join("credentials.json").display()
        );
        say_out!("  try: AWS_ACCESS_KEY_ID={ak} AWS_SECRET_ACCESS_KEY={sk} AWS_DEFAULT_REGION=us-east-1 aws --endpoint-url {scheme}://{addr} s3 ls{}", if tls.is_some() { " (with --ca-bundle, above)" } else { "" });
    } else if a.access_key.is_some() {
        say_out!("  S3 credentials: access key {ak} (from --access-key / $BLINDFOLD_ACCESS_KEY)");
    } else {
        say_out!(
            "  S3 credentials: access key {ak}, secret key in {}",
            cfg.data_dir.join("credentials.json").display()
        );
    }
    if let (Some(admin), Some((model, price_basis))) = (admin, model) {
        opened.observer.set_cost_model(a.price_provider.clone(), model);
        let admin_addr = admin.local_addr()?;
        let auth = blindfold_gateway::admin::AdminAuth::new(
            opened.credentials.clone(),
            a.admin_token.clone(),
        )
        .map_err(|e| anyhow::anyhow!("--admin-token: {e}"))?;
        let state = blindfold_gateway::admin::AdminState::new(&opened, auth, Some(price_basis));
        let limits = opened.limits.separate(blindfold_gateway::listen::ADMIN_MAX_CONNECTIONS);
        tokio::spawn(blindfold_gateway::admin::serve(admin, state, tls.clone(), limits));
        say_out!(
            "  admin: {scheme}://{admin_addr}/ (dashboard, /visualizer, /metrics; log in with the S3 \
             keys{})",
            if a.admin_token.is_some() { " or the admin token" } else { "" }
        );
        tracing::info!(address = %admin_addr, "admin listener started");
    }
    let mut stopped = opened.stopped.clone();
    let shutdown = async move {
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::select! {
            _ = ctrl_c => say_err!("blindfold: shutting down"),
            _ = term.recv() => say_err!("blindfold: shutting down"),
            _ = stopped.wait_for(|v| v.is_some()) => {}
        }
    };
    let data_dir = cfg.data_dir.clone();
    let stopped = opened.stopped.clone();
    // With the trusted component in `blindfold enclave`, a wrong TEE key there (after a key
    // rotation, before it was restarted with the new one) fails every read like tampering.
    let enclave_hint = if opened.params.trusted_component_elsewhere() {
        format!(
            "; with the trusted component in `blindfold enclave`, also check that it runs with \
             this key's TEE key (after a key rotation: `blindfold enclave-key --key-file {}`, \
             then restart it with --enclave-key)",
            cfg.key_file.clone().unwrap_or_else(|| cfg.data_dir.join("key.json")).display()
        )
    } else {
        String::new()
    };
    if let Some(t) = &tls {
        blindfold_gateway::tls::reload_on_sighup(vec![t.clone()])
            .context("installing the SIGHUP handler")?;
    }
    let served = blindfold_gateway::server::run_tls(opened, listener, tls, shutdown).await;
    if let Some(why) = stopped.borrow().clone() {
        let d = data_dir.display();
        if why.starts_with("the disk is full") {
            bail!(
                "stopped serving: {why}. Nothing acknowledged was lost. Next: free space on the \
                 disk holding {d}, then start `blindfold serve` again (it replays the redo log); \
                 a larger --disk-reserve gives the gateway more room to keep serving reads on a \
                 full disk"
            );
        }
        bail!(
            "stopped serving: {why}. The trusted state may no longer match the store, so every \
             request would fail. Next: start `blindfold serve` again (it reloads the trusted \
             state and replays the redo log); run `blindfold verify --data-dir {d}` to list the \
             damaged cells and name the objects they make unreadable (names stay out of this \
             log); if every cell fails, check that key.json is this store's key{enclave_hint}; \
             to rebuild the data directory from the store's snapshot, use `blindfold recover`"
        );
    }
    served?;
    // RFC 3339 to the second: `status` shows it to people.
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default();
    // Private like every file of the data directory (the start-up check would warn).
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(data_dir.join(CLEAN_STOP_FILE))?
            .write_all((now + "\n").as_bytes())
    };
    let _ = write();
    Ok(())
}

/// Refuses to create a store that cannot fit on its disk (with the disk reserve beside it),
/// saying how much it needs and the largest --capacity that fits. Only local file stores are
/// checked: other stores' room is theirs to tell.
fn check_room(
    cfg: &blindfold_gateway::server::ServeConfig,
    f: &blindfold_gateway::server::Footprint,
    reserve: u64,
) -> Result<()> {
    use blindfold_gateway::server::human_bytes;
    let store_dir = match &cfg.store {
        None => cfg.data_dir.join("cells"),
        Some(StoreUrl::File { dir, .. }) => dir.clone(),
        Some(_) => return Ok(()),
    };
    // The nearest existing directory on the way to it tells the disk.
    let Some(existing) = store_dir.ancestors().find(|p| p.is_dir()) else { return Ok(()) };
    let Ok((free, _)) = blindfold_gateway::space::disk_space(existing) else { return Ok(()) };
    let need = f.store_bytes.saturating_add(reserve).saturating_add(f.trusted_bytes);
    if free >= need {
        return Ok(());
    }
    let per_byte = need as f64 / f.capacity_bytes.max(1) as f64;
    let fits = ((free.saturating_sub(reserve)) as f64 / per_byte) as u64;
    bail!(
        "not enough room on the disk holding {}: a store of {} capacity takes up to {} there \
         (plus {} for the trusted state and the disk reserve), and the disk has {} free. Free \
         space, choose a larger disk (--data-dir, or --store file://…), or start with a \
         smaller --capacity (about {} fits)",
        existing.display(),
        human_bytes(f.capacity_bytes),
        human_bytes(f.store_bytes),
        human_bytes(need - f.store_bytes),
        human_bytes(free),
        human_bytes(fits),
    )
}

/// The cost metrics' price model: dollars of requests and transfer for store counts, and
/// dollars per month of storage, at one provider's list prices; and that provider's name (the
/// basis the dashboard states beside the figure).
fn cost_model(
    provider: &str,
    prices: Option<&std::path::Path>,
) -> Result<(blindfold_gateway::observe::CostModel, String)> {
    use blindfold_bench::cost::{PriceTable, Usage};
    let table = match prices {
        Some(path) => PriceTable::load(path)?,
        None => PriceTable::builtin(),
    };
    let Some(p) = table.providers.iter().find(|p| p.id == provider).cloned() else {
        let ids: Vec<&str> = table.providers.iter().map(|p| p.id.as_str()).collect();
        bail!(
            "--price-provider {provider:?} is not in the price table (it has {})",
            ids.join(", ")
        );
    };
    let name = p.name.clone();
    let model = std::sync::Arc::new(move |counts: &blindfold_store::Counts, stored: u64| {
        let usage = Usage::from_counts(counts, 1, stored);
        let (requests, transfer) = usage.dollars_per_op(&p);
        (requests + transfer, usage.storage_per_month(&p))
    });
    Ok((model, name))
}
