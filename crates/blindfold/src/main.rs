//! The `blindfold` command: an oblivious storage gateway and its tools.

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use blindfold_bench::path::{self as path_bench, PathBench};
use blindfold_crypto::{create_key_file, key_file_permissions_ok, load_key_file, Passphrase};
use blindfold_gateway::tls::{Tls, TlsSource};
use blindfold_store::StoreUrl;
use clap::{Args, Parser, Subcommand};

mod config;

/// blindfold keeps data in untrusted storage through Oblivious RAM: the store sees only
/// uniformly random-looking, fixed-size, authenticated-encrypted requests.
#[derive(Parser, Debug)]
#[command(name = "blindfold", version, about, long_about = None)]
struct Cli {
    /// Log filter (also RUST_LOG), e.g. `info`, `debug`, `blindfold_proxy=debug`.
    #[arg(long, global = true, default_value = "warn")]
    log: String,

    /// Log line format on standard error: `text` (for people) or `json` (one JSON object per
    /// line, for log collectors).
    #[arg(long, global = true, default_value = "text", env = "BLINDFOLD_LOG_FORMAT")]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of the largest variant (store URLs with their options) does
// not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the S3 API over oblivious storage (no configuration needed: everything missing is
    /// created in the data directory on first start).
    Serve(ServeArgs),
    /// Check every stored cell's integrity and the trusted state's consistency. For a gateway
    /// whose blocks live on ORAM nodes, give its --nodes and --tls-dir: each node checks its
    /// own cells.
    Verify(VerifyArgs),
    /// Show a data directory: capacity, how full it is, engine, geometry, disk use, last clean
    /// stop. Reads only the trusted state; touches no store.
    Status(StatusArgs),
    /// Rebuild a lost data directory from the store's encrypted snapshot and the key alone.
    ///
    /// Needs --store (where the cells are) and --key-file; writes a new data directory, then
    /// verifies it. The snapshot is the state at the gateway's last clean shutdown.
    Recover(GatewayArgs),
    /// Create a new key file (mode 0600). Losing the key loses the data.
    Init(InitArgs),
    /// Check that a key file loads (and that its permissions are private).
    CheckKey(KeyArgs),
    /// Manage S3 users besides the administrator's keys: each with its own keys, the buckets
    /// it may use and whether it only reads. Kept sealed in <data-dir>/users.sealed; a running
    /// gateway picks up changes within a second.
    #[command(subcommand)]
    User(UserCommand),
    /// Rotate the master key: make a new key (in <key-file>.next, raw or under
    /// --new-passphrase) that replaces the current one once every cell, log and local file is
    /// re-sealed under it. The re-sealing starts at the next start of `blindfold serve` and
    /// runs while it serves; a crash anywhere resumes it. The store learns only that a
    /// rotation runs (see SECURITY.md).
    RotateKey(RotateKeyArgs),
    /// Grow the store to a larger capacity, in the same data directory, while the gateway
    /// serves (or, when none runs, right here). The tree is rebuilt into a larger one in a new
    /// store array: requests wait meanwhile (seconds per GiB), nothing else changes for
    /// clients. The store learns that a growth happened and the new size, nothing about which
    /// blocks are in use (see SECURITY.md). Shrinking is not supported.
    Grow(GrowArgs),
    /// Run a benchmark; results print as a table and can be saved as JSON.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Run the thesis's experiments (seed 003) and write a Markdown report with plots.
    ///
    /// Runs workloads A-E for each engine and block size in the public cloud (an in-memory
    /// store behind an emulated link) and the private cloud (the S3 server of --s3, or an
    /// in-memory store), then the git workload against the S3 server of --s3, and writes
    /// report.md, report.json and SVG plots to --out, the thesis's figures beside ours.
    /// --quick takes about a minute on toy sizes; the full report about 20 minutes on two cores.
    Report(ReportArgs),
    /// Run the untrusted storage server: serves the cell arrays of a `memory:` or `file:` store
    /// over TCP (and computes XOR on request, and Onion ORAM's homomorphic select in a build
    /// with `--features select`) for gateways using `remote://host:port?key_file=PATH`.
    ///
    /// The server is untrusted by design: it only ever sees sealed cells. Clients must prove
    /// they hold the pre-shared key of `--auth-key-file` (`remote://host:port?key_file=…`).
    StorageServer(StorageServerArgs),
    /// Run the TEE design's trusted component beside the untrusted storage (seed 004): a
    /// storage server (as `storage-server`) whose host also answers the TEE engine's queries
    /// and eviction rounds with the trusted component (`--enclave-key` required).
    ///
    /// There is no SGX here: the trusted component runs as this ordinary process, so whoever
    /// controls this host can read the key and with it every block (SECURITY.md, "The
    /// TEE-assisted engine"). Gateways reach it with `--engine tee --store remote://…`.
    Enclave(StorageServerArgs),
    /// Write the key a data directory's TEE engine shares with its trusted component, for
    /// `blindfold enclave --enclave-key FILE` (mode 0600; refuses to overwrite).
    EnclaveKey(EnclaveKeyArgs),
    /// Write the certificates of a node cluster: a CA, one certificate per node (for its host)
    /// and the balancer's, each set in its own directory (files 0600) for `blindfold node
    /// --tls-dir` and `blindfold serve --nodes … --tls-dir`.
    ClusterCerts(ClusterCertsArgs),
    /// Run one ORAM node of a cluster: an ordinary blindfold engine (any --engine, over any
    /// --store) in its own data directory, serving blocks to the oblivious load balancer
    /// (`blindfold serve --nodes`) over gRPC with mutual TLS. See SECURITY.md, "Distributed mode".
    Node(NodeArgs),
}

#[derive(Args, Debug)]
struct ClusterCertsArgs {
    /// Directory to create (refuses to overwrite certificates).
    #[arg(long)]
    out: PathBuf,
    /// The nodes' hosts (names or IP addresses, `host:port` accepted), comma-separated, in the
    /// order of the `node-1`, `node-2`, … directories. Each node's certificate is for a name of
    /// its own (`node-<i>.blindfold`), so several nodes may share a host.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<String>,
}

#[derive(Args, Debug)]
struct NodeArgs {
    /// Address to listen on (`host:port`; port 0 picks a free port, printed at start).
    #[arg(long, value_parser = parse_listen)]
    listen: std::net::SocketAddr,
    /// The node's own data directory (key, parameters, engine state; created on first start).
    #[arg(long)]
    data_dir: PathBuf,
    /// The node's untrusted store, as for `serve` (default: files in <data-dir>/cells).
    #[arg(long)]
    store: Option<StoreUrl>,
    /// Key file (default: <data-dir>/key.json, created on first start).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// The key file is protected by a passphrase ($BLINDFOLD_PASSPHRASE or standard input).
    #[arg(long)]
    passphrase: bool,
    /// The node's certificates: a directory written by `blindfold cluster-certs` (node-<i>).
    #[arg(long)]
    tls_dir: PathBuf,
    /// The node's engine, fixed at creation [default: tao].
    #[arg(long)]
    engine: Option<blindfold_gateway::server::OramEngine>,
    /// Blocks the node holds, fixed at creation (the balancer says how many it needs).
    #[arg(long, value_parser = parse_count, conflicts_with = "capacity")]
    blocks: Option<u64>,
    /// Or the node's capacity in bytes, as `serve --capacity` [default: 64MiB].
    #[arg(long, value_parser = blindfold_gateway::server::parse_size)]
    capacity: Option<u64>,
    /// Block size in bytes, fixed at creation; must be the gateway's [default: 4096].
    #[arg(long)]
    block_size: Option<u32>,
    /// Trusted memory (MiB) for the top of the node's ORAM tree [default: 128 with tao (256
    /// on an s3:// store), 32 with path-oram].
    #[arg(long)]
    cache_mib: Option<u64>,
}

#[derive(Args, Debug)]
struct EnclaveKeyArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Where to write the TEE key (refuses to overwrite).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct StorageServerArgs {
    /// Address to listen on (`host:port`; port 0 picks a free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:7420")]
    listen: String,
    /// Where the arrays live: `memory:` or `file:///path/to/dir`.
    #[arg(long, default_value = "memory:")]
    store: StoreUrl,
    /// The pre-shared key clients must prove they hold: a file of 64 hex digits, mode 0600.
    /// Gateways name the same file in `remote://host:port?key_file=PATH`.
    #[arg(long, required_unless_present = "insecure_no_auth")]
    auth_key_file: Option<PathBuf>,
    /// Create `--auth-key-file` with a fresh random key if it does not exist.
    #[arg(long, requires = "auth_key_file")]
    generate_auth_key: bool,
    /// Serve anyone who can reach the address, without a key: for experiments on loopback only.
    #[arg(long, conflicts_with = "auth_key_file")]
    insecure_no_auth: bool,
    /// Largest request or answer frame, in MiB; clients split batches to fit.
    #[arg(long, default_value_t = 64)]
    max_frame_mib: usize,
    /// Largest array (cells × cell size), in GiB.
    #[arg(long, default_value_t = 1024)]
    max_array_gib: u64,
    /// Most memory all arrays of a `memory:` store may take together, in MiB.
    #[arg(long, default_value_t = 4096)]
    max_memory_mib: u64,
    /// Most arrays the server holds.
    #[arg(long, default_value_t = 1024)]
    max_arrays: usize,
    /// Most connections at once.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Most bytes one connection may hold in requests and answers at once, in MiB (at least
    /// twice --max-frame-mib).
    #[arg(long, default_value_t = 256)]
    connection_buffer_mib: usize,
    /// Also run the TEE engine's trusted component with this key (64 hex digits, mode 0600;
    /// `blindfold enclave-key` writes it for a data directory): the server then answers the
    /// TEE queries and eviction rounds of `--engine tee` gateways. Without it they are refused.
    #[arg(long)]
    enclave_key: Option<PathBuf>,
    /// Bytes per block of the TEE engine the trusted component serves (the gateway's
    /// --block-size).
    #[arg(long, value_parser = parse_block_size, default_value = "1KiB")]
    enclave_block_size: u32,
}

#[derive(Args, Debug)]
struct StatusArgs {
    /// Trusted state directory.
    #[arg(long, default_value = "blindfold-data", env = "BLINDFOLD_DATA_DIR")]
    data_dir: PathBuf,
    /// Key file (the directory database is sealed under it); default `<data-dir>/key.json`.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// The key file is protected by a passphrase: read it from $BLINDFOLD_PASSPHRASE, or else
    /// one line of standard input.
    #[arg(long)]
    passphrase: bool,
}

#[derive(Subcommand, Debug)]
enum UserCommand {
    /// Add a user; prints its access key and secret key (once: they are not shown again).
    Add {
        /// Its name (a-z, 0-9, '.', '_', '-').
        name: String,
        /// Buckets it may use, comma-separated: names, prefixes ending in '*' (`team-*`), or
        /// '*' for all. It may create and delete the buckets these cover (unless --read-only).
        #[arg(long, value_delimiter = ',', required = true)]
        buckets: Vec<String>,
        /// Only reads: GET, HEAD and listings; every write is AccessDenied.
        #[arg(long)]
        read_only: bool,
        #[command(flatten)]
        dir: UserDirArgs,
    },
    /// List the users: names, access keys, buckets, read-only (never secrets).
    List {
        #[command(flatten)]
        dir: UserDirArgs,
    },
    /// Remove a user: its keys stop working within a second. Its buckets and objects stay.
    Remove {
        /// The user's name.
        name: String,
        #[command(flatten)]
        dir: UserDirArgs,
    },
    /// Give a user a new secret key (the access key stays); prints it once. The old secret
    /// stops working within a second.
    Rotate {
        /// The user's name.
        name: String,
        #[command(flatten)]
        dir: UserDirArgs,
    },
}

#[derive(Args, Debug)]
struct UserDirArgs {
    /// The gateway's data directory.
    #[arg(long, default_value = "blindfold-data", env = "BLINDFOLD_DATA_DIR")]
    data_dir: PathBuf,
    /// Key file (default: <data-dir>/key.json).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// The key file is protected by a passphrase: read it from $BLINDFOLD_PASSPHRASE, or else
    /// one line of standard input.
    #[arg(long)]
    passphrase: bool,
}

fn user_file(a: &UserDirArgs) -> Result<blindfold_gateway::users::UserFile> {
    if !a.data_dir.join("gateway.json").exists() {
        bail!(
            "{} holds no gateway (no gateway.json): give --data-dir of a gateway that has \
             started at least once",
            a.data_dir.display()
        );
    }
    let key_file = a.key_file.clone().unwrap_or_else(|| a.data_dir.join("key.json"));
    let pass = if a.passphrase { Some(read_passphrase()?) } else { None };
    let keys = blindfold_gateway::server::data_dir_keys(&a.data_dir, &key_file, pass.as_ref())?;
    use blindfold_gateway::users::UserFile;
    Ok(match (&keys.rotation, &keys.previous) {
        // A rotation no gateway has begun yet: one still running reads users under the old
        // key, so they stay under it (the gateway that begins the rotation re-seals them).
        (Some(r), Some(old)) if r.paths == 0 => {
            UserFile::new(&a.data_dir, old).with_previous(Some(&keys.current))
        }
        (_, previous) => UserFile::new(&a.data_dir, &keys.current).with_previous(previous.as_ref()),
    })
}

#[derive(Args, Debug)]
struct GrowArgs {
    #[command(flatten)]
    gateway: GatewayArgs,
    /// The new logical capacity, larger than today's (`4GiB`, `1.5TiB`; a bare number is
    /// bytes).
    #[arg(long, value_parser = blindfold_gateway::server::parse_size)]
    capacity: u64,
}

#[derive(Args, Debug)]
struct RotateKeyArgs {
    #[command(flatten)]
    dir: UserDirArgs,
    /// Protect the new key file with a passphrase: read it from $BLINDFOLD_NEW_PASSPHRASE, or
    /// else one line of standard input (after the current one, if --passphrase).
    #[arg(long)]
    new_passphrase: bool,
}

fn rotate_key(a: RotateKeyArgs) -> Result<()> {
    let dir = &a.dir.data_dir;
    if !dir.join("gateway.json").exists() {
        bail!(
            "{} holds no gateway (no gateway.json): give --data-dir of a gateway that has \
             started at least once",
            dir.display()
        );
    }
    // Engines that cannot re-seal their cells are refused before anything is written.
    if let Some(p) = blindfold_gateway::server::read_params(dir)? {
        use blindfold_gateway::server::OramEngine;
        if matches!(p.engine, OramEngine::Tee) {
            bail!(
                "the {} engine of {} cannot re-seal its cells under a new key yet: to change \
                 the key, create a gateway with another engine and copy the objects over (e.g. \
                 with `aws s3 sync`)",
                p.engine,
                dir.display()
            );
        }
    }
    let key_file = a.dir.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    let pass = if a.dir.passphrase { Some(read_passphrase()?) } else { None };
    let keys = blindfold_gateway::server::data_dir_keys(dir, &key_file, pass.as_ref())?;
    if let Some(r) = &keys.rotation {
        bail!(
            "a key rotation is already under way in {} ({}): start `blindfold serve` there to \
             let it finish",
            dir.display(),
            r.progress()
        );
    }
    let new_pass = if a.new_passphrase {
        Some(match std::env::var("BLINDFOLD_NEW_PASSPHRASE") {
            Ok(p) if !p.is_empty() => Passphrase::new(p),
            Ok(_) => bail!("$BLINDFOLD_NEW_PASSPHRASE is empty"),
            Err(_) => {
                eprintln!("new passphrase:");
                read_line_passphrase()?
            }
        })
    } else {
        None
    };
    let next =
        blindfold_gateway::rotation::prepare(dir, &key_file, &keys.current, new_pass.as_ref())?;
    let running = gateway_running(dir);
    println!("prepared a key rotation for {}", dir.display());
    println!("  new key file: {} (keep it as safe as the current one)", next.display());
    println!(
        "  {} `blindfold serve` on this data directory to begin: it re-seals every cell while \
         it serves, then replaces {} with the new key file",
        if running { "a gateway is running there; restart" } else { "start" },
        key_file.display()
    );
    println!("  until it ends, keep both key files: the gateway needs the current one to start");
    Ok(())
}

/// Whether a gateway holds the data directory `dir` open (its directory database is locked).
fn gateway_running(dir: &std::path::Path) -> bool {
    match std::fs::File::open(dir.join("meta.redb")) {
        Ok(f) => matches!(f.try_lock(), Err(std::fs::TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

fn user(cmd: UserCommand) -> Result<()> {
    match cmd {
        UserCommand::Add { name, buckets, read_only, dir } => {
            let u = user_file(&dir)?.add(&name, buckets, read_only)?;
            println!("added user {}", u.name);
            println!("  access key: {}", u.access_key);
            println!("  secret key: {} (shown once)", u.secret_key());
            println!(
                "  buckets: {}{}",
                u.buckets.join(","),
                if u.read_only { " (read only)" } else { "" }
            );
        }
        UserCommand::List { dir } => {
            let users = user_file(&dir)?.read()?;
            if users.is_empty() {
                println!("no users besides the administrator (credentials.json)");
            }
            for u in users {
                println!(
                    "{:<20} {:<22} {}{}",
                    u.name,
                    u.access_key,
                    u.buckets.join(","),
                    if u.read_only { " (read only)" } else { "" }
                );
            }
        }
        UserCommand::Remove { name, dir } => {
            let u = user_file(&dir)?.remove(&name)?;
            println!("removed user {} (access key {})", u.name, u.access_key);
        }
        UserCommand::Rotate { name, dir } => {
            let u = user_file(&dir)?.rotate(&name)?;
            println!("new secret key for {} (access key {})", u.name, u.access_key);
            println!("  secret key: {} (shown once)", u.secret_key());
        }
    }
    Ok(())
}

#[derive(Args, Debug)]
struct KeyArgs {
    /// The key file.
    #[arg(long, default_value = "blindfold-data/key.json")]
    key_file: PathBuf,
    /// The key file is protected by a passphrase: read it from $BLINDFOLD_PASSPHRASE, or else
    /// one line of standard input.
    #[arg(long)]
    passphrase: bool,
}

#[derive(Args, Debug)]
struct GatewayArgs {
    /// Trusted state directory (key, credentials, directory, ORAM state, default store).
    #[arg(long, default_value = "blindfold-data", env = "BLINDFOLD_DATA_DIR")]
    data_dir: PathBuf,
    /// Untrusted store, fixed when the data directory is created (default: files in
    /// <data-dir>/cells): `file:///dir` (its parent must exist; `?sync=none|flush|always`),
    /// `s3://bucket/prefix?endpoint=http://host:port&region=…` (any S3-compatible store;
    /// credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), `redis://host:port/db`,
    /// `remote://host:port` (a `blindfold storage-server`), or `memory:` (lost on exit; tests).
    #[arg(long)]
    store: Option<StoreUrl>,
    /// Key file (default: <data-dir>/key.json, created on first start).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// The key file is (or is to be) protected by a passphrase: read it from
    /// $BLINDFOLD_PASSPHRASE, or else one line of standard input.
    #[arg(long)]
    passphrase: bool,
}

#[derive(Args, Debug)]
struct VerifyArgs {
    #[command(flatten)]
    gateway: GatewayArgs,
    /// The ORAM nodes of a gateway that keeps its blocks on nodes (as given to `serve
    /// --nodes`), comma-separated `https://host:port`; they must be running.
    #[arg(long, value_delimiter = ',', requires = "tls_dir")]
    nodes: Vec<String>,
    /// With --nodes: the balancer's certificates (`blindfold cluster-certs`, `balancer`).
    #[arg(long, requires = "nodes")]
    tls_dir: Option<PathBuf>,
}

/// Format of log lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Read settings from a TOML file: each key is a long flag of `blindfold serve` without
    /// its dashes (`data-dir = "/var/lib/blindfold"`, `admin-listen = "127.0.0.1:9101"`,
    /// `in-place = true`). Flags and environment variables given as well override it.
    /// `docs/blindfold.example.toml` lists every key.
    #[arg(long, env = "BLINDFOLD_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    gateway: GatewayArgs,
    /// Address to listen on: `host:port` (a name or an IP address) or a bare port (on
    /// 127.0.0.1).
    #[arg(long, default_value = "127.0.0.1:9100", env = "BLINDFOLD_LISTEN", value_parser = parse_listen)]
    listen: std::net::SocketAddr,
    /// S3 access key (default: from <data-dir>/credentials.json, generated on first start).
    #[arg(long, env = "BLINDFOLD_ACCESS_KEY", requires = "secret_key", value_parser = parse_access_key)]
    access_key: Option<String>,
    /// S3 secret key (not blank).
    #[arg(long, env = "BLINDFOLD_SECRET_KEY", requires = "access_key", hide_env_values = true, value_parser = parse_secret_key)]
    secret_key: Option<String>,
    /// Logical capacity of a new store [default: 1GiB]: a bare number is bytes; KiB, MiB,
    /// GiB, TiB are powers of 1024, KB, MB, GB, TB powers of 1000; decimals are accepted
    /// (1.5GiB). The store takes about 4.2 times this, 2.1 with --in-place (the banner says
    /// exactly).
    #[arg(long, value_parser = blindfold_gateway::server::parse_size)]
    capacity: Option<u64>,
    /// ORAM block size of a new store, in bytes [default: 65536 on an `s3://` store, where
    /// requests are slow and billed; 4096 on any other]. Every block carries fixed overhead
    /// (sealing, tree slots): small blocks make the store many times the capacity.
    #[arg(long)]
    block_size: Option<u32>,
    /// Create a new store even if it takes more than 3 bytes of store per byte of capacity
    /// (small blocks).
    #[arg(long)]
    allow_overhead: bool,
    /// Pad every object to a power-of-two number of blocks, so the store learns only each
    /// object's size class (costs up to 2× space and traffic). Fixed at creation.
    #[arg(long)]
    pad_objects: bool,
    /// Trusted memory (MiB) for the top levels of the ORAM tree of a new store: each cached
    /// level saves one bucket of storage traffic per access, for either engine (with `tao`,
    /// not on an --in-place store; `tao` holds each cached bucket sealed until first used,
    /// then open instead, and fills the budget bucket by bucket: whole levels, then the left
    /// part of the next, so paths to leaves below that part skip one more bucket). Fixed at
    /// creation [default: 128 with tao (256 on an s3:// store, which bills every request and
    /// byte a cached level saves), 32 with path-oram].
    #[arg(long)]
    cache_mib: Option<u64>,
    /// Oblivious engine of a new store: `tao` (concurrent, TaoStore design: many block
    /// accesses in flight at once), `path-oram` (sequential Path ORAM), `tee` (seed 004's
    /// TEE-assisted engine), `oblivistore` (ObliviStore: partitions of levelled ORAMs,
    /// shuffled in the background; about 6× the capacity in store space), `curious` (CURIOUS
    /// over the same partitions: one partition per access, up to b = 3 blocks per eviction)
    /// or `curious-path` (CURIOUS over Path ORAM partitions with buckets of z = 5: one path
    /// read and written back per access). Fixed at creation [default: tao].
    #[arg(long)]
    engine: Option<blindfold_gateway::server::OramEngine>,
    /// Lay a new store out with one copy of each ORAM cell, overwritten in place: half the
    /// store size, but every commit first writes its cells to the local redo log (the
    /// default keeps two slots per cell and logs only which cells moved). Fixed at creation.
    #[arg(long)]
    in_place: bool,
    /// With the tao engine: store the ORAM tree in subtrees of this many levels (1 to 4) per
    /// store object, so an access costs a store request per that many levels of its path
    /// instead of one per level, and moves the whole subtrees (2^N - 1 buckets for N). Up to
    /// 256 MiB of recently read subtrees stay in trusted memory for the write-backs (counted
    /// in the banner's estimate). Pays on a store that bills and waits per request (S3); see
    /// "Packing" in docs/benchmarks.md. Fixed at creation [default: 1, a bucket per object].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4))]
    pack_levels: Option<u32>,
    /// Also serve the admin listener on this address: Prometheus `/metrics`, `/healthz`,
    /// `/readyz`, the dashboard (`/`) and the access-pattern visualizer (`/visualizer`).
    /// Everything but the probes needs the S3 keys (HTTP Basic) or --admin-token. Off by
    /// default; keep it on a private address.
    #[arg(long, env = "BLINDFOLD_ADMIN_LISTEN", value_parser = parse_listen)]
    admin_listen: Option<std::net::SocketAddr>,
    /// A token that also opens the admin listener (`Authorization: Bearer TOKEN`), so a
    /// Prometheus server need not hold the S3 secret.
    /// At least 16 visible characters; a blank one is refused (it would let anyone in).
    #[arg(long, env = "BLINDFOLD_ADMIN_TOKEN", hide_env_values = true, value_parser = parse_admin_token)]
    admin_token: Option<String>,
    /// Price table entry for the cost metrics: aws-s3, gcs, azure-blob, ibm-cos,
    /// backblaze-b2 or cloudflare-r2 (see docs/cost.md), or an id from --prices.
    #[arg(long, default_value = "aws-s3")]
    price_provider: String,
    /// Override the built-in prices (JSON or TOML, as for `bench gateway --prices`).
    #[arg(long)]
    prices: Option<PathBuf>,
    /// Serve S3 (and the admin listener) over HTTPS with a self-signed certificate, made on
    /// first start in <data-dir>/tls/ (for localhost, 127.0.0.1, ::1 and --tls-name) and
    /// reused; the banner prints its fingerprint and how to make clients trust it. For a
    /// certificate of your own, give --tls-cert and --tls-key instead.
    #[arg(long, value_enum, env = "BLINDFOLD_TLS", conflicts_with_all = ["tls_cert", "tls_key"])]
    tls: Option<TlsMode>,
    /// Serve over HTTPS with this certificate chain (PEM, leaf first). Reloaded with its key
    /// on SIGHUP: new connections get the new certificate, open ones are not dropped.
    #[arg(long, env = "BLINDFOLD_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "BLINDFOLD_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// More names (DNS names or IP addresses, comma-separated) for the self-signed
    /// certificate of `--tls self-signed`; used when it is first made.
    #[arg(long, value_delimiter = ',', requires = "tls")]
    tls_name: Vec<String>,
    /// Grow the store automatically, to twice its capacity, when this percentage of its
    /// blocks is in use (1-100; off by default). Requests wait while it grows; the store
    /// learns when the threshold was crossed (see SECURITY.md).
    #[arg(long, env = "BLINDFOLD_GROW_AT", value_parser = clap::value_parser!(u8).range(1..=100))]
    grow_at: Option<u8>,
    /// Also serve the OpenStack Swift API on this address (`host:port` or a bare port), over the
    /// same buckets and objects as S3: TempAuth sign-in at `/auth/v1.0` with
    /// `X-Auth-User: <account>:<access key>` and `X-Auth-Key: <secret key>` (the S3 keys), e.g.
    /// `swift -A http://ADDR/auth/v1.0 -U blindfold:AK -K SK list`. Off by default.
    #[arg(long, env = "BLINDFOLD_SWIFT_LISTEN", value_parser = parse_listen)]
    swift_listen: Option<std::net::SocketAddr>,
    /// Connections the S3 and Swift listeners hold open at once, together; one past it is
    /// answered 503 (Retry-After) and closed. Keep it below the file-descriptor limit
    /// (`ulimit -n`) less what the store needs. The admin listener has 64 of its own.
    #[arg(long, env = "BLINDFOLD_MAX_CONNECTIONS", default_value_t = blindfold_gateway::listen::DEFAULT_MAX_CONNECTIONS as u32, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_connections: u32,
    /// Seconds a client may take to send a request's header before it is cut off (a client
    /// sending half a header holds nothing for long).
    #[arg(long, env = "BLINDFOLD_HEADER_TIMEOUT", default_value_t = blindfold_gateway::listen::DEFAULT_HEADER_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
    header_timeout: u64,
    /// Seconds a connection may stay with no byte moving while none of its requests is being
    /// answered, before it is closed.
    #[arg(long, env = "BLINDFOLD_IDLE_TIMEOUT", default_value_t = blindfold_gateway::listen::DEFAULT_IDLE_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86_400))]
    idle_timeout: u64,
    /// The largest capacity automatic growth goes to (default: no limit).
    #[arg(long, requires = "grow_at", value_parser = blindfold_gateway::server::parse_size)]
    grow_max: Option<u64>,
    /// Keep the blocks on these ORAM nodes (`blindfold node`), comma-separated
    /// `https://host:port`, with this gateway as their oblivious load balancer. Fixed at
    /// creation: later starts need the same nodes (in any order).
    #[arg(long, value_delimiter = ',', requires = "tls_dir", conflicts_with = "grow_at")]
    nodes: Vec<String>,
    /// With --nodes: the balancer's certificates, a directory written by `blindfold
    /// cluster-certs` (`balancer`).
    #[arg(long, requires = "nodes")]
    tls_dir: Option<PathBuf>,
}

/// How `serve` gets a TLS certificate without --tls-cert.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum TlsMode {
    /// Make a self-signed certificate on first start and keep it in <data-dir>/tls/.
    SelfSigned,
}

#[derive(Args, Debug)]
struct InitArgs {
    #[command(flatten)]
    key: KeyArgs,
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Path ORAM vs. the same blocks sealed without ORAM, on the same backend.
    ///
    /// Fills every block (bulk load), runs a seeded uniform workload through Path ORAM, then
    /// the same workload on a sealed store without ORAM, and reports throughput, bandwidth
    /// blow-up, stash, trusted memory and the slowdown ratio.
    Path(PathArgs),
    /// Path vs Ring vs XOR Ring ORAM, reproducing seed 002's comparison (Tables 4, 6-9).
    ///
    /// Fills each scheme with the same blocks, serves the same seeded workload over an
    /// emulated link (exact link time on a virtual clock plus this machine's measured processing
    /// time), and prints response time, system latency, stash behaviour, blocks moved (with the
    /// papers' formulas), per-phase processing time, a link-speed sweep and server storage.
    /// Saves CSV files and SVG plots to --out-dir.
    Schemes(SchemesArgs),
    /// Onion ORAM with real Damgård–Jurik, phase by phase beside seed 002's Table 5.
    ///
    /// Builds the seed's setup (1024-bit keys, 4 KiB blocks, 2047 buckets, 4096 blocks,
    /// τ = 3), fills the store so every select works on full-size numbers, bulk loads every
    /// block, then serves --ops requests (75 % reads) and reports the time of each phase per
    /// request and per eviction, the amortized time per request, blocks moved and store size.
    /// The full setup takes minutes per request on two cores: use --ops for a shorter
    /// measurement (every access and eviction does the same work, so the means hold), or
    /// --quick for a small run of seconds. Needs a build with `--features onion` (GMP).
    Onion(OnionArgs),
    /// The TEE-assisted engine beside seed 004's Tables I–III (closed-loop client).
    ///
    /// For each configuration: starts the trusted component and its host as their own process
    /// (`blindfold enclave`, cells in files under --work-dir), bulk loads every block through
    /// the gateway's engine over loopback, then one client queries uniformly random blocks,
    /// one at a time, and the best and average latency and the throughput are printed beside
    /// the paper's. The store takes 3.5 to 7 times the data: sizes the paper ran that do not
    /// fit this machine's free disk are scaled down (the report says so). --quick: toy sizes, a minute.
    Tee(TeeArgs),
    /// A mixed S3 workload through the gateway vs. the same gateway without ORAM.
    ///
    /// Starts a gateway in this process on 127.0.0.1 over a temporary data directory, loads
    /// every object (sizes log-uniform between --min-size and --max-size), then runs a seeded
    /// mix of GETs and PUTs from --concurrency clients over HTTP with SigV4. Then does the same
    /// against the same gateway on the same kind of store with the ORAM replaced by blocks
    /// sealed at fixed places (not oblivious; the baseline). Reports throughput, latency
    /// percentiles per operation, bytes moved to the store per logical byte, and the slowdown.
    Gateway(GatewayBenchArgs),
    /// The thesis's workloads A-E (seed 003) through the gateway vs. the same gateway without
    /// ORAM, for each engine and block size.
    ///
    /// The workloads are the checked-in descriptions in workloads/*.toml (stages, read and
    /// write shares, size distributions); every size is multiplied by --scale. Prints slowdown,
    /// response time, bandwidth overhead, outsource ratio, cost multiplier and CPU use per
    /// engine and block size; --rtt-ms/--mbit emulate the public-cloud link (none: the private
    /// cloud).
    Workload(WorkloadBenchArgs),
    /// The thesis's git workload (seed 003): push, clone, push a commit, pull, through the
    /// gateway and straight against the S3 server.
    ///
    /// Pushes the thesis's repository (the OpenStack SDK cut at 5,893 commits, --bundle) to a
    /// bucket with the real git and git-remote-s3, clones it, pushes one new commit and pulls
    /// it, timing each step: first against the S3 server of --store itself, then through the
    /// gateway without ORAM, then through the gateway for each engine and block size, its cells
    /// in the same server. Needs git and git-remote-s3 on PATH and the server's credentials in
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
    Git(GitBenchArgs),
    /// The concurrent TaoStore-style engine vs. sequential Path ORAM, by number of clients.
    ///
    /// Fills a data set (default 1 GiB of 4 KiB blocks) in a memory store behind an emulated
    /// WAN (default 50 ms round trip), then runs closed-loop clients for --seconds per point,
    /// for every client count and write-back interval k, and sequential Path ORAM over the same
    /// link at every client count (the baseline). Prints a table (throughput, response time
    /// percentiles, trusted memory, speedup) and saves CSV and SVG plots to --out-dir.
    Concurrency(ConcurrencyArgs),
    /// Seed 001's experiments (ObliviStore) for the partition engines, TaoStore beside them.
    ///
    /// For each engine: writes every block once, then closed-loop clients (4 KiB blocks,
    /// uniform, 50 % writes) drive the engine directly at each round trip of --rtt-ms (each
    /// node's store behind an emulated link): throughput and response time by round trip
    /// (Figures 4 and 5); seeks per operation with the cells in a file (Figure 7, a seek being
    /// a run of contiguous cells in one store request); aggregate throughput by number of
    /// ORAM nodes (Figure 6: in-process nodes over mutually authenticated gRPC, each with its
    /// own store and link of --nodes-rtt-ms and --nodes-mbit, behind the load balancer of
    /// `serve --nodes`, one node included). Clients per node grow
    /// with the round trip (64 + 4 per ms; the partition engines at most 768) unless --clients
    /// fixes them. Prints the rows beside the paper's figures and the issue's targets, and
    /// saves CSV and SVG plots to --out-dir.
    Oblivistore(ObliviStoreArgs),
}

#[derive(Args, Debug)]
struct ObliviStoreArgs {
    /// A run of under three minutes: 4,096 blocks, round trips 0, 50 and 200 ms, 1 and 2
    /// nodes, up to 2,000 operations or 6 s per point.
    #[arg(long)]
    quick: bool,
    /// Engines, comma-separated: oblivistore, curious, curious-path, tao [default: all four].
    #[arg(long, value_delimiter = ',')]
    engines: Option<Vec<String>>,
    /// Round trips of the latency experiment, ms, comma-separated [default:
    /// 0,50,100,200,500,1000; --quick: 0,50,200].
    #[arg(long, value_delimiter = ',')]
    rtt_ms: Option<Vec<u64>>,
    /// Numbers of ORAM nodes, comma-separated [default: 1,2,4; --quick: 1,2].
    #[arg(long, value_delimiter = ',')]
    nodes: Option<Vec<usize>>,
    /// Round trip of each node's link in the nodes experiment, ms.
    #[arg(long, default_value_t = 50)]
    nodes_rtt_ms: u64,
    /// Bandwidth of each node's link in the nodes experiment, each way, Mbit/s; 0: unlimited.
    /// The paper's nodes were each bounded by their own disks and network, so by default a
    /// node's link is what bounds it.
    #[arg(long, default_value_t = 100)]
    nodes_mbit: u64,
    /// Bandwidth of every emulated link of the latency and seeks experiments, each way,
    /// Mbit/s [default: unlimited].
    #[arg(long)]
    mbit: Option<u64>,
    /// Logical blocks, e.g. 65536 or 2^16 [default: 2^16; --quick: 4096].
    #[arg(long, value_parser = parse_count)]
    blocks: Option<u64>,
    /// Bytes per block.
    #[arg(long, value_parser = parse_block_size, default_value = "4KiB")]
    block_size: u32,
    /// Closed-loop clients per node [default: 64 + 4 per ms of round trip, at most 4096].
    #[arg(long)]
    clients: Option<usize>,
    /// Operations per point, at most [default: 20000; --quick: 2000].
    #[arg(long, value_parser = parse_count)]
    ops: Option<u64>,
    /// Seconds per point, at most [default: 20; --quick: 6].
    #[arg(long)]
    seconds: Option<f64>,
    /// Share of reads.
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// Backend of the latency and nodes experiments: memory or file (the seeks experiment
    /// always uses files).
    #[arg(long, default_value = "memory")]
    store: blindfold_bench::oblivistore::StoreKind,
    /// Skip the seeks experiment.
    #[arg(long)]
    no_seeks: bool,
    /// Where engine state and cell files go (a temporary directory per engine, removed after)
    /// [default: the system's temporary directory].
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for the CSV file and SVG plots.
    #[arg(long, default_value = "blindfold-bench-oblivistore")]
    out_dir: PathBuf,
    /// Save the rows as a JSON list to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress output.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct ConcurrencyArgs {
    /// A short run (64 MiB data set, 10/30/100/500 clients, k = 40 and 160, 3 s per point).
    #[arg(long)]
    quick: bool,
    /// Logical data set in MiB [default: 1024; --quick: 64].
    #[arg(long)]
    dataset_mib: Option<u64>,
    /// Bytes per block.
    #[arg(long, default_value_t = 4096)]
    block_size: u32,
    /// Numbers of concurrent clients, comma-separated [default: 10,20,30,40,50,60,100,200,500,1000].
    #[arg(long, value_delimiter = ',')]
    clients: Option<Vec<usize>>,
    /// Write-back intervals k, comma-separated [default: 40,80,160,240].
    #[arg(long, value_delimiter = ',')]
    k: Option<Vec<usize>>,
    /// Measured seconds per point [default: 10; --quick: 3].
    #[arg(long)]
    seconds: Option<f64>,
    /// Round-trip time of the emulated link, ms.
    #[arg(long, default_value_t = 50)]
    rtt_ms: u64,
    /// Bandwidth of the emulated link (each way), Mbit/s [default: unlimited].
    #[arg(long)]
    mbit: Option<u64>,
    /// Share of reads.
    #[arg(long, default_value_t = 0.5)]
    read_ratio: f64,
    /// Skip the sequential Path ORAM baseline.
    #[arg(long)]
    no_baseline: bool,
    /// Seed of the workload and the engines.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Directory for the CSV file and SVG plots.
    #[arg(long, default_value = "blindfold-bench-concurrency")]
    out_dir: PathBuf,
    /// Save the report (one row per run) as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct SchemesArgs {
    /// A shorter run (200 requests instead of 600), same tables.
    #[arg(long)]
    quick: bool,
    /// Real blocks stored.
    #[arg(long, value_parser = parse_count)]
    blocks: Option<u64>,
    /// Bytes per block.
    #[arg(long)]
    block_size: Option<u32>,
    /// Requests per scheme and speed.
    #[arg(long, value_parser = parse_count)]
    ops: Option<u64>,
    /// Real slots per bucket.
    #[arg(long, default_value_t = 4)]
    z: u32,
    /// Dummy slots per bucket (Ring ORAM).
    #[arg(long, default_value_t = 2)]
    s: u32,
    /// Accesses between evictions (Ring ORAM).
    #[arg(long, default_value_t = 3)]
    a: u32,
    /// Share of reads.
    #[arg(long, default_value_t = 0.75)]
    read_ratio: f64,
    /// Mean time between request arrivals (Poisson), ms; the seed used one minute.
    #[arg(long, default_value_t = 60_000.0)]
    interarrival_ms: f64,
    /// Round-trip time of the emulated link, ms.
    #[arg(long, default_value_t = 0.2)]
    rtt_ms: f64,
    /// Link speeds of the sweep in Mbit/s, comma-separated (default: the seed's nine, 0.512
    /// to 1000).
    #[arg(long, value_delimiter = ',')]
    speeds_mbit: Option<Vec<f64>>,
    /// Where the cells live: `memory:` or `remote://host:port` (a `blindfold storage-server`).
    #[arg(long, default_value = "memory:")]
    store: StoreUrl,
    /// Seed of the workload and the schemes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A `blindfold bench onion --json` report: its measured time per request fills Onion
    /// ORAM's "with AHE" rows (without it they are left out).
    #[arg(long)]
    onion_json: Option<PathBuf>,
    /// Directory for the CSV files and SVG plots.
    #[arg(long, default_value = "blindfold-bench-schemes")]
    out_dir: PathBuf,
    /// Save the whole report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress lines.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct TeeArgs {
    /// Toy sizes (8 MiB of data, 2,000 queries): about a minute.
    #[arg(long)]
    quick: bool,
    /// Table I's data sizes (1 KiB blocks), comma-separated: `1GiB,2GiB,4GiB`.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    data_size: Option<Vec<u64>>,
    /// Tables II and III's block sizes, comma-separated: `1KiB,2KiB,4KiB,8KiB`.
    #[arg(long, value_delimiter = ',', value_parser = parse_block_size)]
    block_size: Option<Vec<u32>>,
    /// Table II's data size (the paper's 10 GB, scaled to this machine).
    #[arg(long, value_parser = parse_size)]
    table2_size: Option<u64>,
    /// Table III's number of blocks (the paper's 2 million, scaled).
    #[arg(long)]
    table3_blocks: Option<u64>,
    /// Queries measured per configuration.
    #[arg(long)]
    queries: Option<u64>,
    /// Queries per eviction round (default 450, measured fastest here; the paper's q = 800).
    #[arg(long)]
    round_queries: Option<u32>,
    /// Where the store's files go (a directory per configuration, removed after).
    #[arg(long, default_value = ".")]
    work_dir: PathBuf,
    /// Which of the paper's tables to run, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "I,II,III")]
    tables: Vec<String>,
    /// Write the rows as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct OnionArgs {
    /// A run of seconds: 512-bit keys, 64 blocks of 256 bytes, height 3, 30 requests.
    #[arg(long)]
    quick: bool,
    /// Damgård–Jurik modulus size in bits (the seed: 1024).
    #[arg(long)]
    key_bits: Option<u32>,
    /// Requests measured (the seed: 600).
    #[arg(long, value_parser = parse_count)]
    ops: Option<u64>,
    /// Logical blocks, all loaded (the seed: 4096).
    #[arg(long, value_parser = parse_count)]
    blocks: Option<u64>,
    /// Bytes per block (the seed: 4096).
    #[arg(long)]
    block_size: Option<u32>,
    /// Tree height: 2^height leaves (the seed's 2047 buckets: 10).
    #[arg(long)]
    height: Option<u32>,
    /// Slots per half bucket (default: 2τ + 2).
    #[arg(long)]
    half_slots: Option<u32>,
    /// Damgård–Jurik layer a block is first encrypted at, the seed's s0: chunks of s0·|n|
    /// bits, each select growing them by one |n| (default 3, measured fastest for the seed's
    /// setup; 1 is Paillier chunks).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=16))]
    first_layer: Option<u32>,
    /// Seed of the key, the workload and the scheme.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Save the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress lines.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct WorkloadBenchArgs {
    /// The workload: A (home user), B (traveling user), C (email backup), D (code
    /// distribution) or E (e-government).
    #[arg(long)]
    workload: String,
    /// Engines, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "tao,path-oram")]
    engine: Vec<blindfold_gateway::server::OramEngine>,
    /// Block sizes, comma-separated (e.g. 4KiB,64KiB) [default: 4KiB,64KiB; --quick: 4KiB].
    #[arg(long, value_delimiter = ',', value_parser = blindfold_gateway::server::parse_size)]
    block_size: Vec<u64>,
    /// Multiply every object size by this (the thesis's files reach 4 GB) [default: 1/64;
    /// --quick: 1/1024].
    #[arg(long)]
    scale: Option<f64>,
    /// A short run: one engine (the first), one block size, tiny objects.
    #[arg(long)]
    quick: bool,
    /// Where each side's cells go: `memory:` or `file:///path/to/dir`.
    #[arg(long, default_value = "memory:")]
    store: StoreUrl,
    /// Round-trip time of an emulated link to the store, ms (0: the private cloud).
    #[arg(long, default_value_t = 0)]
    rtt_ms: u64,
    /// Bandwidth of the emulated link (each way), Mbit/s [default: unlimited].
    #[arg(long)]
    mbit: Option<u64>,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Save the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct ReportArgs {
    /// Toy sizes (workloads × 1/1024, one engine and block size, a generated git repository).
    #[arg(long)]
    quick: bool,
    /// Directory for report.md, report.json and the plots.
    #[arg(long, default_value = "blindfold-report")]
    out: PathBuf,
    /// An S3 server for the private cloud and the git workload:
    /// s3://BUCKET?endpoint=http://HOST:PORT, its credentials in AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY (without it the git workload is skipped).
    #[arg(long)]
    s3: Option<StoreUrl>,
    /// The git workload's repository (the thesis's: openstacksdk-2019.bundle).
    #[arg(long, default_value = blindfold_bench::git::DEFAULT_BUNDLE)]
    bundle: PathBuf,
    /// Engines, comma-separated [default: tao,path-oram; --quick: tao].
    #[arg(long, value_delimiter = ',')]
    engine: Vec<blindfold_gateway::server::OramEngine>,
    /// Block sizes, comma-separated [default: 4KiB,64KiB,256KiB; --quick: 4KiB].
    #[arg(long, value_delimiter = ',', value_parser = parse_block_size)]
    block_size: Vec<u32>,
    /// Multiply every object size of the workloads by this [default: 1/64; --quick: 1/1024].
    #[arg(long)]
    scale: Option<f64>,
    /// The public cloud's emulated round trip, ms.
    #[arg(long, default_value_t = 20)]
    rtt_ms: u64,
    /// The public cloud's emulated bandwidth each way, Mbit/s.
    #[arg(long, default_value_t = 100)]
    mbit: u64,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// No progress lines.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct GitBenchArgs {
    /// The S3 server: s3://BUCKET?endpoint=http://HOST:PORT (e.g. a MinIO). The direct side
    /// pushes there; each gateway keeps its cells under a prefix of the same bucket.
    #[arg(long)]
    store: StoreUrl,
    /// The repository, a git bundle (the thesis's: openstacksdk-2019.bundle).
    #[arg(long, default_value = blindfold_bench::git::DEFAULT_BUNDLE)]
    bundle: PathBuf,
    /// The branch of the bundle to push.
    #[arg(long, default_value = blindfold_bench::git::BUNDLE_BRANCH)]
    branch: String,
    /// Engines, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "tao,path-oram")]
    engine: Vec<blindfold_gateway::server::OramEngine>,
    /// Block sizes, comma-separated (e.g. 4KiB,64KiB).
    #[arg(long, value_delimiter = ',', default_value = "64KiB", value_parser = parse_block_size)]
    block_size: Vec<u32>,
    /// Trusted memory (MiB) for the top levels of the ORAM tree, as `serve --cache-mib`
    /// [default: each engine's, as `serve`].
    #[arg(long)]
    cache_mib: Option<u64>,
    /// A short run: a small generated repository instead of the bundle, the first engine only.
    #[arg(long)]
    quick: bool,
    /// Round-trip time of an emulated link to the S3 server, ms (0: the private cloud). git
    /// reaches the server through a relay with this link, each gateway its store through the
    /// same emulation; git reaches the gateway on this machine directly.
    #[arg(long, default_value_t = 0)]
    rtt_ms: u64,
    /// Bandwidth of the emulated link (each way), Mbit/s [default: unlimited].
    #[arg(long)]
    mbit: Option<u64>,
    /// Seed of the generated repository (--quick).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Save the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress lines.
    #[arg(long, short)]
    quiet: bool,
}

/// Parses a size in bytes (`1GiB`, `512MiB`, `65536`).
fn parse_size(s: &str) -> Result<u64, String> {
    blindfold_gateway::server::parse_size(s)
}

/// Parses a block size (`4KiB`, `65536`) that fits the engine's 32-bit block size.
fn parse_block_size(s: &str) -> Result<u32, String> {
    let b = blindfold_gateway::server::parse_size(s)?;
    u32::try_from(b).map_err(|_| format!("block size {b} is too large"))
}

#[derive(Args, Debug)]
struct GatewayBenchArgs {
    /// Where each side's cells go: `memory:` or `file:///path/to/dir` (each side gets its own
    /// subdirectory there, removed afterwards).
    #[arg(long, default_value = "memory:")]
    store: StoreUrl,
    /// Measured operations, each side [default: 400; --quick: 100].
    #[arg(long, value_parser = parse_count)]
    ops: Option<u64>,
    /// Distinct objects, each PUT once before measuring [default: 64; --quick: 32].
    #[arg(long, value_parser = parse_count)]
    objects: Option<u64>,
    /// Smallest object (e.g. 1KiB).
    #[arg(long, default_value = "1KiB", value_parser = blindfold_gateway::server::parse_size)]
    min_size: u64,
    /// Largest object [default: 16MiB; --quick: 1MiB].
    #[arg(long, value_parser = blindfold_gateway::server::parse_size)]
    max_size: Option<u64>,
    /// Share of GETs among the measured operations.
    #[arg(long, default_value_t = 0.75)]
    read_ratio: f64,
    /// Clients sending requests at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Logical capacity of each gateway (default: sized to the workload).
    #[arg(long, value_parser = blindfold_gateway::server::parse_size)]
    capacity: Option<u64>,
    /// ORAM block size, bytes.
    #[arg(long, default_value_t = 4096)]
    block_size: u32,
    /// Trusted memory (MiB) for the top levels of the ORAM tree, as `serve --cache-mib`
    /// [default: as `serve`: 128 with tao, 256 with tao on an s3:// store, 32 with path-oram].
    #[arg(long)]
    cache_mib: Option<u64>,
    /// The gateway's engine, as `serve --engine`: tao, path-oram, tee, oblivistore, curious or
    /// curious-path.
    #[arg(long, default_value_t = blindfold_gateway::server::OramEngine::Tao)]
    engine: blindfold_gateway::server::OramEngine,
    /// The ORAM side keeps one copy of each cell, overwritten in place after the redo log
    /// carries it, as `serve --in-place` (default: two slots per cell, cells never in the log).
    #[arg(long)]
    in_place: bool,
    /// Levels of the tao engine's tree per store object, as `serve --pack-levels` (1 to 4).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4))]
    pack_levels: u32,
    /// Prices for the cost table: a JSON or TOML file overriding or adding providers (format
    /// in docs/cost.md; e.g. docs/prices-aws-in-region.toml); the built-in list prices
    /// otherwise.
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
    /// Emulate a network between each gateway and its store: round trip in milliseconds,
    /// applied to both sides alike (e.g. 20 for a cloud region nearby).
    #[arg(long, default_value_t = 0)]
    rtt_ms: u64,
    /// Emulated link bandwidth each way, Mbit/s (default: unlimited).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    mbit: Option<u64>,
    /// Seed of the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A small run of a few seconds per side.
    #[arg(long)]
    quick: bool,
    /// Save the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    quiet: bool,
}

#[derive(Args, Debug)]
struct PathArgs {
    /// Logical blocks (a number or a power of two such as 2^20).
    #[arg(long, default_value = "2^16", value_parser = parse_count)]
    blocks: u64,
    /// Bytes per block.
    #[arg(long, default_value_t = 4096)]
    block_size: u32,
    /// Logical accesses to measure (each side).
    #[arg(long, default_value = "20000", value_parser = parse_count)]
    ops: u64,
    /// Where cells go: `memory:`, `file:///path/to/dir` (optionally `?sync=none|flush|always`),
    /// `s3://bucket/prefix?endpoint=http://host:port&region=…` (credentials from
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) or `redis://host:port/db`.
    #[arg(long, default_value = "memory:")]
    store: StoreUrl,
    /// Slots per bucket.
    #[arg(long, default_value_t = 4)]
    z: u32,
    /// Top levels of the tree kept in trusted memory (never sent to the store).
    #[arg(long, default_value_t = 0)]
    cache_levels: u32,
    /// Store the position map recursively, keeping at most this many entries in memory.
    #[arg(long, value_parser = parse_count)]
    recursive: Option<u64>,
    /// Share of reads in the workload.
    #[arg(long, default_value_t = 0.75)]
    read_ratio: f64,
    /// Seed of the workload and of the ORAM's leaves.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Emulate a network round trip to the store, in milliseconds.
    #[arg(long)]
    rtt_ms: Option<f64>,
    /// Emulate a link of this bandwidth (Mbit/s, each direction); needs --rtt-ms.
    #[arg(long, requires = "rtt_ms")]
    bandwidth_mbit: Option<f64>,
    /// Measure on an empty ORAM instead of filling every block first.
    #[arg(long)]
    no_fill: bool,
    /// Save the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Prices for the cost table: a JSON or TOML file overriding or adding providers (format
    /// in docs/cost.md); the built-in list prices otherwise.
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
    /// No progress bars.
    #[arg(long, short)]
    quiet: bool,
}

/// Parses `1000`, `2^20` or `64k`/`1M` (binary multiples).
fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim().replace('_', "");
    if let Some((base, exp)) = s.split_once('^') {
        let base: u64 = base.parse().map_err(|_| format!("bad base in {s:?}"))?;
        let exp: u32 = exp.parse().map_err(|_| format!("bad exponent in {s:?}"))?;
        return base.checked_pow(exp).ok_or_else(|| format!("{s} is too large"));
    }
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s.as_str(), 1),
    };
    let n: u64 =
        num.parse().map_err(|_| format!("{s:?} is not a count (try 1000, 2^20 or 64k)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{s} is too large"))
}

fn read_passphrase() -> Result<Passphrase> {
    if let Ok(p) = std::env::var("BLINDFOLD_PASSPHRASE") {
        return Ok(Passphrase::new(p));
    }
    eprintln!("passphrase (one line on standard input):");
    read_line_passphrase()
}

fn read_line_passphrase() -> Result<Passphrase> {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).context("reading the passphrase")?;
    let line = line.trim_end_matches(['\r', '\n']).to_string();
    if line.is_empty() {
        bail!("empty passphrase");
    }
    Ok(Passphrase::new(line))
}

fn init(args: InitArgs) -> Result<()> {
    let pass = if args.key.passphrase { Some(read_passphrase()?) } else { None };
    if let Some(dir) = args.key.key_file.parent() {
        if !dir.as_os_str().is_empty() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    create_key_file(&args.key.key_file, pass.as_ref())?;
    println!("created key file {}", args.key.key_file.display());
    println!("keep a copy somewhere safe: without this key (and its passphrase, if any) the data cannot be read");
    Ok(())
}

fn enclave_key(args: EnclaveKeyArgs) -> Result<()> {
    let pass = if args.key.passphrase { Some(read_passphrase()?) } else { None };
    let master = load_key_file(&args.key.key_file, pass.as_ref())
        .with_context(|| format!("loading {}", args.key.key_file.display()))?;
    blindfold_proxy::DurableTee::tee_key(&master)
        .write_new(&args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!(
        "wrote the TEE key of {} to {}: start the trusted component with `blindfold enclave \
         --enclave-key {}` (whoever holds this file can read the TEE engine's blocks)",
        args.key.key_file.display(),
        args.out.display(),
        args.out.display()
    );
    Ok(())
}

fn check_key(args: KeyArgs) -> Result<()> {
    let pass = if args.passphrase { Some(read_passphrase()?) } else { None };
    load_key_file(&args.key_file, pass.as_ref())?;
    if !key_file_permissions_ok(&args.key_file)? {
        eprintln!(
            "warning: {} is readable by other users; run `chmod 600` on it",
            args.key_file.display()
        );
    }
    println!("key file {} is valid", args.key_file.display());
    Ok(())
}

async fn bench_path(args: PathArgs) -> Result<()> {
    let params = PathBench {
        blocks: args.blocks,
        block_size: args.block_size,
        ops: args.ops,
        store: args.store,
        z: args.z,
        cache_levels: args.cache_levels,
        recursive: args.recursive,
        read_ratio: args.read_ratio,
        seed: args.seed,
        rtt_ms: args.rtt_ms,
        bandwidth_mbit: args.bandwidth_mbit,
        fill: !args.no_fill,
        progress: !args.quiet,
        prices: match &args.prices {
            Some(path) => blindfold_bench::cost::PriceTable::load(path)?,
            None => blindfold_bench::cost::PriceTable::builtin(),
        },
    };
    let report = path_bench::run(params).await?;
    println!("blindfold bench path");
    print!("{}", path_bench::render(&report));
    save_json(args.json.as_deref(), &report)?;
    Ok(())
}

/// Writes a benchmark report as pretty JSON to `path`, if one was given, and says so.
fn save_json(path: Option<&std::path::Path>, report: &impl serde::Serialize) -> Result<()> {
    if let Some(path) = path {
        let json = serde_json::to_string_pretty(report)?;
        std::fs::write(path, json + "\n").with_context(|| format!("writing {}", path.display()))?;
        println!("  saved {}", path.display());
    }
    Ok(())
}

async fn bench_gateway(args: GatewayBenchArgs) -> Result<()> {
    use blindfold_bench::gateway::{self as gateway_bench, GatewayBench};
    let preset = if args.quick { GatewayBench::default().quick() } else { GatewayBench::default() };
    let store = args.store;
    let params = GatewayBench {
        store: store.clone(),
        ops: args.ops.unwrap_or(preset.ops),
        objects: args.objects.unwrap_or(preset.objects),
        min_size: args.min_size,
        max_size: args.max_size.unwrap_or(preset.max_size),
        read_ratio: args.read_ratio,
        concurrency: args.concurrency,
        capacity: args.capacity,
        block_size: args.block_size,
        cache_mib: args
            .cache_mib
            .unwrap_or(blindfold_gateway::server::default_cache_mib(args.engine, Some(&store))),
        engine: args.engine,
        in_place: args.in_place,
        pack_levels: args.pack_levels,
        prices: match &args.prices {
            Some(path) => blindfold_bench::cost::PriceTable::load(path)?,
            None => blindfold_bench::cost::PriceTable::builtin(),
        },
        rtt_ms: args.rtt_ms,
        mbit: args.mbit,
        seed: args.seed,
        progress: !args.quiet,
    };
    let report = gateway_bench::run(params).await?;
    println!("blindfold bench gateway");
    print!("{}", gateway_bench::render(&report));
    save_json(args.json.as_deref(), &report)?;
    Ok(())
}

async fn bench_workload(a: WorkloadBenchArgs) -> Result<()> {
    use blindfold_bench::workload::{self, WorkloadBench};
    let mut engines = a.engine;
    let mut block_sizes: Vec<u32> = a
        .block_size
        .iter()
        .map(|&b| u32::try_from(b).map_err(|_| anyhow::anyhow!("--block-size {b} is too large")))
        .collect::<Result<_>>()?;
    if block_sizes.is_empty() {
        block_sizes = if a.quick { vec![4096] } else { vec![4096, 65536] };
    }
    if a.quick {
        engines.truncate(1);
        block_sizes.truncate(1);
    }
    let params = WorkloadBench {
        workload: a.workload,
        engines,
        block_sizes,
        scale: a.scale.unwrap_or(if a.quick { 1.0 / 1024.0 } else { 1.0 / 64.0 }),
        store: a.store,
        rtt_ms: a.rtt_ms,
        mbit: a.mbit,
        seed: a.seed,
        progress: !a.quiet,
    };
    let report = workload::run(params).await?;
    println!("blindfold bench workload");
    print!("{}", workload::render(&report));
    save_json(a.json.as_deref(), &report)?;
    Ok(())
}

async fn report(a: ReportArgs) -> Result<()> {
    use blindfold_bench::report::{self, ReportParams};
    let mut p = ReportParams::new(a.quick);
    if !a.engine.is_empty() {
        p.engines = a.engine;
    }
    if !a.block_size.is_empty() {
        p.block_sizes = a.block_size;
    }
    if let Some(scale) = a.scale {
        p.scale = scale;
    }
    p.rtt_ms = a.rtt_ms;
    p.mbit = a.mbit;
    p.s3 = a.s3;
    p.bundle = a.bundle;
    p.seed = a.seed;
    p.progress = !a.quiet;
    let r = report::run(p).await?;
    let files = report::write(&r, &a.out)?;
    println!("blindfold report: {:.0} s on {}", r.seconds, r.machine.summary());
    for f in files {
        println!("  wrote {}", f.display());
    }
    Ok(())
}

async fn bench_git(a: GitBenchArgs) -> Result<()> {
    use blindfold_bench::git::{self, GitBench};
    let mut engines = a.engine;
    if a.quick {
        engines.truncate(1);
    }
    let params = GitBench {
        bundle: (!a.quick).then_some(a.bundle),
        branch: a.branch,
        engines,
        block_sizes: a.block_size,
        store: a.store,
        cache_mib: a.cache_mib,
        rtt_ms: a.rtt_ms,
        mbit: a.mbit,
        seed: a.seed,
        progress: !a.quiet,
    };
    let report = git::run(params).await?;
    println!("blindfold bench git");
    print!("{}", git::render(&report));
    save_json(a.json.as_deref(), &report)?;
    Ok(())
}

fn serve_config(g: &GatewayArgs) -> Result<blindfold_gateway::server::ServeConfig> {
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
    })
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

/// Parses `--listen`: `host:port` (host a name or an address) or a bare port on 127.0.0.1.
fn parse_listen(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let s = s.trim();
    if let Ok(port) = s.parse::<u16>() {
        return Ok(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    }
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    let bad = || {
        format!("{s:?} is not an address to listen on (try 9100, localhost:9100 or 0.0.0.0:9100)")
    };
    if !s.contains(':') {
        return Err(bad());
    }
    let mut addrs = s.to_socket_addrs().map_err(|e| format!("{}: {e}", bad()))?;
    addrs.next().ok_or_else(bad)
}

/// Flags that fix a new store's shape must agree with an existing data directory.
fn check_flags_against(a: &ServeArgs, p: &blindfold_gateway::server::GatewayParams) -> Result<()> {
    let mut clashes = Vec::new();
    if let Some(c) = a.capacity {
        // A store grown past the capacity it was made with still starts with that flag.
        let blocks = c / u64::from(a.block_size.unwrap_or(p.block_size));
        if blocks > p.blocks {
            bail!(
                "--capacity {c}: {} holds {} bytes; to make it larger, run `blindfold grow \
                 --data-dir {} --capacity {c}` (the gateway may keep running)",
                a.gateway.data_dir.display(),
                p.blocks * u64::from(p.block_size),
                a.gateway.data_dir.display()
            );
        }
        if blocks < p.blocks {
            eprintln!(
                "blindfold: --capacity {c} is below the store's {} bytes (it has grown): \
                 starting at its size",
                p.blocks * u64::from(p.block_size)
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

/// File recording the time of the last clean stop in a data directory.
const CLEAN_STOP_FILE: &str = "last-clean-stop";

async fn serve(a: ServeArgs) -> Result<()> {
    use blindfold_gateway::server::{footprint, human_bytes, new_params, read_params};
    let mut cfg = serve_config(&a.gateway)?;
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
            // Per copy of each cell: the two-slot layout doubles every block's share.
            let copies = if p.two_slots() { 2.0 } else { 1.0 };
            use blindfold_gateway::server::OramEngine;
            // The engines whose store is large by design, whatever the block size.
            let by_design = match p.engine {
                OramEngine::Tee => Some(
                    "two areas for every node of its m-ary tree, and room in every leaf for the \
                     reads of an eviction round",
                ),
                OramEngine::ObliviStore => {
                    Some("about √N partitions of levels, and two areas for every top level")
                }
                OramEngine::Curious => Some(
                    "levels sized for b = 3 blocks per eviction, and two areas for every top \
                     level",
                ),
                OramEngine::CuriousPath => Some(
                    "two copies of every bucket of its partitions' Path ORAM trees, which have \
                     about twice as many slots as blocks",
                ),
                OramEngine::Tao | OramEngine::PathOram => None,
            };
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
    let mut opened = open_gateway(&cfg, &a.nodes, a.tls_dir.as_deref()).await?;
    opened.limits = blindfold_gateway::listen::Limits::new(
        a.max_connections as usize,
        std::time::Duration::from_secs(a.header_timeout),
        std::time::Duration::from_secs(a.idle_timeout),
    );
    opened.grow_at = a.grow_at;
    opened.grow_max = a.grow_max.map(|m| m / u64::from(opened.params.block_size));
    if a.tls == Some(TlsMode::SelfSigned) {
        let dir = cfg.data_dir.join("tls");
        tls = Some(
            Tls::load(TlsSource::SelfSigned { dir: dir.clone(), names: a.tls_name.clone() })
                .with_context(|| format!("--tls self-signed (in {})", dir.display()))?,
        );
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    for note in &opened.notes {
        eprintln!("blindfold: {note}");
    }
    let _ = std::fs::remove_file(cfg.data_dir.join(CLEAN_STOP_FILE));
    // Installed before the banner: a SIGTERM right after it stops the gateway cleanly.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let f = footprint(&opened.params)?;
    let (ak, sk) = opened.credentials.clone();
    println!("blindfold {} serving S3 at {scheme}://{addr}", env!("CARGO_PKG_VERSION"));
    if let Some(t) = &tls {
        let (cert, key) = t.source().files();
        println!("  TLS: {} (SHA-256 {})", cert.display(), t.fingerprint());
        if matches!(t.source(), TlsSource::SelfSigned { .. }) {
            println!(
                "  trust it: aws --ca-bundle {c} | AWS_CA_BUNDLE={c} (boto3, git-remote-s3) | \
                 rclone --ca-cert {c} | restic --cacert {c} | s3cmd --ca-certs={c} | curl --cacert {c}",
                c = cert.display()
            );
        } else {
            println!("  key: {} (both reloaded on SIGHUP)", key.display());
        }
    }
    if let Some(l) = swift_listener {
        let swift_addr = l.local_addr()?;
        println!(
            "  swift: {scheme}://{swift_addr}/auth/v1.0 (TempAuth: user blindfold:<access key>, \
             key <secret key>; e.g. swift -A {scheme}://{swift_addr}/auth/v1.0 -U blindfold:{ak} \
             -K … list)"
        );
        opened.swift_listener = Some(l);
    }
    println!("  data directory: {} (back up key.json)", cfg.data_dir.display());
    if a.nodes.is_empty() {
        println!("  store: {} ({} engine)", opened.params.store, opened.params.engine);
    } else {
        println!("  nodes: {} (oblivious load balancer)", a.nodes.join(", "));
    }
    println!(
        "  capacity: {} ({} blocks of {} bytes){}",
        human_bytes(f.capacity_bytes),
        f.blocks,
        f.block_size,
        if opened.params.pad_objects { ", object sizes padded" } else { "" }
    );
    if a.nodes.is_empty() {
        println!(
            "  store use: up to {}; trusted memory: about {}",
            human_bytes(f.store_bytes),
            human_bytes(f.trusted_bytes)
        );
    }
    if opened.new_credentials {
        println!(
            "  S3 credentials (saved in {}): access key {ak}, secret key {sk}",
            cfg.data_dir.join("credentials.json").display()
        );
        println!("  try: AWS_ACCESS_KEY_ID={ak} AWS_SECRET_ACCESS_KEY={sk} AWS_DEFAULT_REGION=us-east-1 aws --endpoint-url {scheme}://{addr} s3 ls{}", if tls.is_some() { " (with --ca-bundle, above)" } else { "" });
    } else if a.access_key.is_some() {
        println!("  S3 credentials: access key {ak} (from --access-key / $BLINDFOLD_ACCESS_KEY)");
    } else {
        println!(
            "  S3 credentials: access key {ak}, secret key in {}",
            cfg.data_dir.join("credentials.json").display()
        );
    }
    if let Some(admin_addr) = a.admin_listen {
        let model = cost_model(&a.price_provider, a.prices.as_deref())?;
        opened.observer.set_cost_model(a.price_provider.clone(), model);
        let admin = tokio::net::TcpListener::bind(admin_addr).await.with_context(|| {
            format!("--admin-listen {admin_addr}: cannot listen there (in use, or not ours)")
        })?;
        let admin_addr = admin.local_addr()?;
        let auth = blindfold_gateway::admin::AdminAuth::new(
            opened.credentials.clone(),
            a.admin_token.clone(),
        )
        .map_err(|e| anyhow::anyhow!("--admin-token: {e}"))?;
        let state = blindfold_gateway::admin::AdminState::new(
            &opened,
            auth,
            Some(a.price_provider.clone()),
        );
        let limits = opened.limits.separate(blindfold_gateway::listen::ADMIN_MAX_CONNECTIONS);
        tokio::spawn(blindfold_gateway::admin::serve(admin, state, tls.clone(), limits));
        println!(
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
            _ = ctrl_c => eprintln!("blindfold: shutting down"),
            _ = term.recv() => eprintln!("blindfold: shutting down"),
            _ = stopped.wait_for(|v| v.is_some()) => {}
        }
    };
    let data_dir = cfg.data_dir.clone();
    let stopped = opened.stopped.clone();
    if let Some(t) = &tls {
        blindfold_gateway::tls::reload_on_sighup(vec![t.clone()])
            .context("installing the SIGHUP handler")?;
    }
    let served = blindfold_gateway::server::run_tls(opened, listener, tls, shutdown).await;
    if let Some(why) = stopped.borrow().clone() {
        let d = data_dir.display();
        bail!(
            "stopped serving: {why}. The trusted state may no longer match the store, so every \
             request would fail. Next: start `blindfold serve` again (it reloads the trusted \
             state and replays the redo log); run `blindfold verify --data-dir {d}` to list the \
             damaged cells and name the objects they make unreadable (names stay out of this \
             log); if every cell fails, check that key.json is this store's key; to \
             rebuild the data directory from the store's snapshot, use `blindfold recover`"
        );
    }
    served?;
    let now = time::OffsetDateTime::now_utc().to_string();
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

/// The cost metrics' price model: dollars of requests and transfer for store counts, and
/// dollars per month of storage, at one provider's list prices.
fn cost_model(
    provider: &str,
    prices: Option<&std::path::Path>,
) -> Result<blindfold_gateway::observe::CostModel> {
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
    Ok(std::sync::Arc::new(move |counts: &blindfold_store::Counts, stored: u64| {
        let usage = Usage::from_counts(counts, 1, stored);
        let (requests, transfer) = usage.dollars_per_op(&p);
        (requests + transfer, usage.storage_per_month(&p))
    }))
}

fn status(a: StatusArgs) -> Result<()> {
    use blindfold_gateway::server::{footprint, human_bytes, read_params};
    let dir = &a.data_dir;
    let Some(p) = read_params(dir)? else {
        bail!("{} is not a blindfold data directory (no gateway.json)", dir.display());
    };
    let f = footprint(&p)?;
    println!("blindfold status {}", dir.display());
    println!(
        "  store: {} ({} engine, {})",
        p.store,
        p.engine,
        if p.two_slots() { p.layout() } else { "cells overwritten in place".into() }
    );
    println!(
        "  capacity: {} ({} blocks of {} bytes, Z = {}{}{})",
        human_bytes(f.capacity_bytes),
        f.blocks,
        f.block_size,
        p.z,
        p.cache_summary().map(|c| format!(", {c} in memory")).unwrap_or_default(),
        if p.pad_objects { ", object sizes padded" } else { "" }
    );
    println!(
        "  store use: up to {}; trusted memory: about {}",
        human_bytes(f.store_bytes),
        human_bytes(f.trusted_bytes)
    );
    if let Some((objects, buckets)) = p.tao_path_objects() {
        println!(
            "  an access reads and writes {objects} store object(s) ({buckets} bucket(s) of its \
             path below the cached top)"
        );
    }
    let key_path = a.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    let pass = if a.passphrase { Some(read_passphrase()?) } else { None };
    let opened = load_key_file(&key_path, pass.as_ref())
        .map_err(|e| anyhow::anyhow!("{e}"))
        .and_then(|key| {
            blindfold_gateway::Directory::open(&dir.join("meta.redb"), p.blocks, &key)
                .map_err(|e| anyhow::anyhow!("{e}"))
        });
    match opened {
        Ok(d) => {
            let (buckets, objects) = d.counts()?;
            let used = p.blocks - d.free_blocks();
            println!(
                "  used: {} of {} blocks ({:.1}%), {buckets} buckets, {objects} objects",
                used,
                p.blocks,
                100.0 * used as f64 / p.blocks as f64
            );
        }
        Err(e) => println!("  used: unknown ({e}; is a gateway running on it?)"),
    }
    match std::fs::read_to_string(dir.join(CLEAN_STOP_FILE)) {
        Ok(t) => println!("  last clean stop: {}", t.trim()),
        Err(_) => println!(
            "  last clean stop: none since the last start (running now, or it stopped \
             uncleanly: the next start replays the redo log)"
        ),
    }
    if dir.join(blindfold_gateway::rotation::ROTATION_FILE).exists() {
        println!(
            "  key rotation: under way (`blindfold serve` re-seals the cells while it serves, \
             then replaces the key file; keep the key file and its .next until then)"
        );
    }
    if dir.join(blindfold_gateway::grow::INTENT_FILE).exists() {
        println!(
            "  growth: under way, or interrupted (a running gateway finishes it; otherwise the \
             next start of `blindfold serve` or `blindfold grow` does)"
        );
    }
    Ok(())
}

/// Opens the gateway of `cfg` over its own store or, for a data directory whose blocks live on
/// ORAM nodes, over the nodes at `nodes` with the balancer's certificates in `tls_dir`.
async fn open_gateway(
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
            eprintln!("{msg}");
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
        println!("blindfold grow: {}", answer.message);
        return Ok(());
    }
    let cfg = serve_config(&a.gateway)?;
    let opened = blindfold_gateway::server::open(&cfg).await?;
    for note in &opened.notes {
        eprintln!("blindfold: {note}");
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
        "blindfold grow: rebuilding the ORAM of {} into {} blocks",
        dir.display(),
        blocks
    ));
    let grown = grower.grow(blocks).await;
    pb.finish_and_clear();
    let objects = std::sync::Arc::clone(&opened.objects);
    objects.shutdown().await?;
    if let Err(e) = blindfold_gateway::server::write_snapshot(&opened).await {
        eprintln!("blindfold: no snapshot written: {e}");
    }
    let grown = grown?;
    println!("blindfold grow: {}", grown.describe());
    Ok(())
}

async fn verify(a: VerifyArgs) -> Result<()> {
    let cfg = serve_config(&a.gateway)?;
    if !cfg.data_dir.join("gateway.json").exists() {
        bail!("{} is not a blindfold data directory (no gateway.json)", cfg.data_dir.display());
    }
    eprintln!("blindfold verify: opening {}", cfg.data_dir.display());
    let opened = open_gateway(&cfg, &a.nodes, a.tls_dir.as_deref()).await?;
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

async fn storage_server(args: StorageServerArgs) -> Result<()> {
    if matches!(args.store, StoreUrl::Remote { .. }) {
        bail!("a storage server keeps its arrays in `memory:` or `file:///dir`, not in another server");
    }
    use blindfold_server::{Auth, Limits, ServerConfig};
    use blindfold_store::remote::AuthKey;
    let auth = match &args.auth_key_file {
        Some(path) if args.generate_auth_key && !path.exists() => {
            let key = AuthKey::create(path)?;
            eprintln!(
                "generated a new storage auth key in {}; give gateways a copy (mode 0600) and \
                 name it in remote://HOST:PORT?key_file=PATH",
                path.display()
            );
            Auth::Key(key)
        }
        Some(path) => Auth::Key(AuthKey::load(path).with_context(|| {
            format!("(create one with --generate-auth-key) loading {}", path.display())
        })?),
        None => {
            eprintln!(
                "WARNING: --insecure-no-auth: anyone who can reach {} can read, overwrite and \
                 fill the arrays",
                args.listen
            );
            Auth::InsecureNone
        }
    };
    const MIB: usize = 1 << 20;
    let limits = Limits {
        max_frame: args.max_frame_mib.saturating_mul(MIB),
        max_array_bytes: args.max_array_gib.saturating_mul(1 << 30),
        max_memory_bytes: args.max_memory_mib.saturating_mul(1 << 20),
        max_arrays: args.max_arrays,
        max_connections: args.max_connections,
        connection_buffer: args.connection_buffer_mib.saturating_mul(MIB),
        ..Limits::default()
    };
    let trusted: Option<Arc<dyn blindfold_store::Trusted>> = match &args.enclave_key {
        Some(path) => {
            let key = blindfold_tee::TeeKey::load(path)
                .with_context(|| format!("loading the enclave key {}", path.display()))?;
            eprintln!(
                "trusted component enabled (blocks of {} bytes); without SGX this host holds \
                 the key and can read the TEE engine's blocks",
                args.enclave_block_size
            );
            Some(Arc::new(blindfold_tee::Enclave::new(&key, args.enclave_block_size as usize)))
        }
        None => None,
    };
    let config = ServerConfig { auth, limits, trusted };
    let server = blindfold_server::Server::bind(&args.listen, args.store.clone(), config)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    // One line on standard output, so scripts (and tests) can learn a port picked with :0.
    println!(
        "blindfold storage-server listening on {} (store {})",
        server.local_addr(),
        args.store
    );
    tokio::select! {
        r = server.run() => r.context("serving")?,
        _ = tokio::signal::ctrl_c() => eprintln!("interrupted; stopping"),
    }
    Ok(())
}

fn bench_schemes(args: SchemesArgs) -> Result<()> {
    use blindfold_bench::schemes;
    let mut bench = if args.quick { schemes::SchemesBench::quick() } else { Default::default() };
    if let Some(b) = args.blocks {
        bench.blocks = b;
    }
    if let Some(b) = args.block_size {
        bench.block_size = b;
    }
    if let Some(o) = args.ops {
        bench.ops = o;
    }
    (bench.z, bench.s, bench.a) = (args.z, args.s, args.a);
    bench.read_ratio = args.read_ratio;
    bench.interarrival_ms = args.interarrival_ms;
    bench.rtt_ms = args.rtt_ms;
    if let Some(speeds) = args.speeds_mbit {
        if speeds.iter().any(|v| v.is_nan() || *v <= 0.0) {
            bail!("link speeds must be positive");
        }
        bench.speeds = speeds.iter().map(|v| (v * 1e6).round() as u64).collect();
    }
    bench.store = args.store;
    bench.seed = args.seed;
    bench.progress = !args.quiet;
    if let Some(path) = &args.onion_json {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the bench onion report {}", path.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let ms = v
            .get("amortized_ms_per_access")
            .and_then(serde_json::Value::as_f64)
            .with_context(|| {
                format!(
                    "{} has no amortized_ms_per_access: not a bench onion report",
                    path.display()
                )
            })?;
        if !(ms.is_finite() && ms >= 0.0) {
            bail!("{}: amortized_ms_per_access must be a non-negative number", path.display());
        }
        bench.onion_ahe_ms = Some(ms);
    }
    let report = schemes::run(&bench)?;
    print!("{}", schemes::render(&report));
    for path in schemes::save(&report, &args.out_dir)? {
        println!("  saved {}", path.display());
    }
    save_json(args.json.as_deref(), &report)?;
    Ok(())
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

async fn bench_concurrency(args: ConcurrencyArgs) -> Result<()> {
    use blindfold_bench::concurrency::{self, ConcurrencyBench};
    let mut bench = if args.quick { ConcurrencyBench::quick() } else { Default::default() };
    if let Some(d) = args.dataset_mib {
        bench.dataset_mib = d;
    }
    if let Some(c) = args.clients {
        bench.clients = c;
    }
    if let Some(k) = args.k {
        bench.ks = k;
    }
    if let Some(s) = args.seconds {
        if s.is_nan() || s <= 0.0 {
            bail!("--seconds must be positive");
        }
        bench.seconds = s;
    }
    if !(0.0..=1.0).contains(&args.read_ratio) {
        bail!("--read-ratio must be between 0 and 1");
    }
    bench.block_size = args.block_size;
    bench.rtt_ms = args.rtt_ms;
    bench.mbit = args.mbit;
    bench.read_ratio = args.read_ratio;
    bench.baseline = !args.no_baseline;
    bench.seed = args.seed;
    bench.progress = !args.quiet;
    let report = concurrency::run(bench).await?;
    print!("{}", concurrency::render(&report));
    for path in concurrency::save(&report, &args.out_dir)? {
        println!("  saved {}", path.display());
    }
    save_json(args.json.as_deref(), &report)?;
    Ok(())
}

fn cluster_certs(a: ClusterCertsArgs) -> Result<()> {
    let written = blindfold_node::write_cluster_certs(&a.out, &a.nodes)?;
    for (dir, what) in written {
        println!("{}: {what}", dir.display());
    }
    Ok(())
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
    };
    let tls = blindfold_node::ClusterTls::load(&a.tls_dir)?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let shutdown = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("blindfold node: shutting down");
    };
    let ready = |addr: std::net::SocketAddr, opened: &blindfold_gateway::server::Opened| {
        for note in &opened.notes {
            eprintln!("blindfold node: {note}");
        }
        let p = &opened.params;
        println!("blindfold node serving at https://{addr}");
        println!("  data directory: {} (back up key.json)", a.data_dir.display());
        println!("  store: {} ({} engine)", p.store, p.engine);
        println!("  blocks: {} of {} bytes; node id {}", p.blocks, p.block_size, p.store_id);
    };
    blindfold_node::node::run(&cfg, a.listen, &tls, ready, shutdown).await?;
    Ok(())
}

async fn bench_oblivistore(a: ObliviStoreArgs) -> Result<()> {
    use blindfold_bench::oblivistore::{self, ObliviStoreBench};
    let mut b = if a.quick { ObliviStoreBench::quick() } else { ObliviStoreBench::default() };
    if let Some(v) = a.engines {
        b.engines = v.into_iter().map(|e| e.trim().to_ascii_lowercase()).collect();
    }
    if let Some(v) = a.rtt_ms {
        b.rtts_ms = v;
    }
    if let Some(v) = a.nodes {
        b.nodes = v;
    }
    if let Some(v) = a.blocks {
        b.blocks = v;
    }
    if let Some(v) = a.ops {
        b.ops = v;
    }
    if let Some(v) = a.seconds {
        if v.is_nan() || v <= 0.0 {
            bail!("--seconds must be positive");
        }
        b.max_seconds = v;
    }
    if let Some(d) = a.work_dir {
        b.work_dir = d;
    }
    b.nodes_rtt_ms = a.nodes_rtt_ms;
    b.nodes_mbit = Some(a.nodes_mbit).filter(|&m| m > 0);
    b.mbit = a.mbit;
    b.block_size = a.block_size;
    b.clients = a.clients;
    b.read_ratio = a.read_ratio;
    b.store = a.store;
    b.seeks = !a.no_seeks;
    b.seed = a.seed;
    b.progress = !a.quiet;
    let report = oblivistore::run(&b).await?;
    print!("{}", oblivistore::render(&report));
    for path in oblivistore::save(&report, &a.out_dir)? {
        println!("  saved {}", path.display());
    }
    save_json(a.json.as_deref(), &report.rows)
}

fn main() -> Result<()> {
    let args = match config::apply_config_file(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("blindfold: {e:#}");
            std::process::exit(2);
        }
    };
    let cli = Cli::parse_from(args);
    // `s3s` logs every refused request at ERROR under `s3s::ops`; the gateway logs each one
    // itself, once, at the level it deserves, so that target is off unless asked for.
    let directives =
        if cli.log.contains("s3s") { cli.log.clone() } else { format!("{},s3s::ops=off", cli.log) };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&directives))
        .context("invalid --log filter")?;
    // Colour codes only where a person reads them, not in a log file.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    match cli.log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_current_span(false)
            .init(),
    }
    match cli.command {
        Command::Serve(a) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(serve(a))
        }
        Command::Verify(a) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(verify(a))
        }
        Command::Recover(a) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(recover(a))
        }
        Command::Init(a) => init(a),
        Command::Status(a) => status(a),
        Command::CheckKey(a) => check_key(a),
        Command::User(c) => user(c),
        Command::RotateKey(a) => rotate_key(a),
        Command::Grow(a) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(grow(a))
        }
        Command::StorageServer(a) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(storage_server(a))
        }
        Command::Enclave(a) => {
            if a.enclave_key.is_none() {
                bail!(
                    "`blindfold enclave` needs --enclave-key FILE (write one with `blindfold \
                     enclave-key --key-file KEY --out FILE`)"
                );
            }
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(storage_server(a))
        }
        Command::EnclaveKey(a) => enclave_key(a),
        Command::ClusterCerts(a) => cluster_certs(a),
        Command::Node(a) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(node(a))
        }
        Command::Report(a) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(report(a))
        }
        Command::Bench(BenchCommand::Schemes(a)) => bench_schemes(a),
        Command::Bench(BenchCommand::Tee(a)) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(bench_tee(a))
        }
        Command::Bench(BenchCommand::Onion(a)) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(bench_onion(a))
        }
        Command::Bench(BenchCommand::Path(a)) => {
            // One core: the engine is sequential, and the figures are quoted per core.
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(bench_path(a))
        }
        Command::Bench(BenchCommand::Concurrency(a)) => {
            // Many clients and one engine share the machine's cores.
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(bench_concurrency(a))
        }
        Command::Bench(BenchCommand::Oblivistore(a)) => {
            // Many clients and the engine's background shuffles share the machine's cores.
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(bench_oblivistore(a))
        }
        Command::Bench(BenchCommand::Workload(a)) => {
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(bench_workload(a))
        }
        Command::Bench(BenchCommand::Git(a)) => {
            // The gateways run in this process while git runs beside them.
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(bench_git(a))
        }
        Command::Bench(BenchCommand::Gateway(a)) => {
            // Clients and gateway share the machine's cores, as a local deployment would.
            let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            rt.block_on(bench_gateway(a))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse() {
        assert_eq!(parse_listen("19412").unwrap(), "127.0.0.1:19412".parse().unwrap());
        assert_eq!(parse_listen("0.0.0.0:80").unwrap(), "0.0.0.0:80".parse().unwrap());
        assert!(parse_listen("localhost:19412").unwrap().ip().is_loopback());
        assert!(parse_listen("nonsense").is_err());
        assert!(parse_listen("99999").is_err());
    }

    #[test]
    fn counts_parse() {
        assert_eq!(parse_count("1000"), Ok(1000));
        assert_eq!(parse_count("2^20"), Ok(1 << 20));
        assert_eq!(parse_count("64k"), Ok(65536));
        assert_eq!(parse_count("1_000"), Ok(1000));
        assert!(parse_count("2^99").is_err());
        assert!(parse_count("lots").is_err());
    }

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
