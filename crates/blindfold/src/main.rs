//! The `blindfold` command: an oblivious storage gateway and its tools.
//!
//! This file holds the command line's top (global flags, the list of commands) and sends each
//! command to its module under `commands/`.

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};

use commands::bench::BenchCommand;
use commands::cluster_certs::ClusterCertsArgs;
use commands::data_dir::KeyArgs;
use commands::enclave_key::EnclaveKeyArgs;
use commands::grow::GrowArgs;
use commands::init::InitArgs;
use commands::node::NodeArgs;
use commands::report::ReportArgs;
use commands::rotate_key::RotateKeyArgs;
use commands::serve::ServeArgs;
use commands::status::StatusArgs;
use commands::storage_server::StorageServerArgs;
use commands::user::UserCommand;
use commands::verify::VerifyArgs;

/// A line for the operator on standard error (`blindfold: …` notes): as it is, or as one JSON
/// object under `--log-format json` ([`say`]).
macro_rules! say_err {
    ($($t:tt)*) => { $crate::say::err_line(&format!($($t)*)) };
}

/// A line of a command's report on standard output (the banner): as it is, or as one JSON
/// object on standard error under `--log-format json` ([`say`]).
macro_rules! say_out {
    ($($t:tt)*) => { $crate::say::out_line(&format!($($t)*)) };
}

mod commands;
mod config;
mod say;

/// blindfold keeps data in untrusted storage through Oblivious RAM: the store sees only
/// uniformly random-looking, fixed-size, authenticated-encrypted requests.
#[derive(Parser, Debug)]
#[command(name = "blindfold", version, about, long_about = None)]
struct Cli {
    /// Log filter (also RUST_LOG), e.g. `info`, `debug`, `blindfold_proxy=debug`. Default:
    /// blindfold's own events at `info` (growth, key rotation, snapshots, a full disk) and
    /// everything else at `warn` for the long-running commands (serve, node, storage-server,
    /// enclave); `warn` for the others.
    #[arg(long, global = true)]
    log: Option<String>,

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
    /// Needs --store (where the cells and the snapshot are) and --key-file; writes a new data
    /// directory, then verifies it. The snapshot is the state at the gateway's last clean
    /// shutdown. For a gateway whose blocks lived on ORAM nodes, also give --nodes (every node
    /// of the cluster) and --tls-dir; its snapshot is in its --store, which must have outlived
    /// the lost machine (by default it is files inside the data directory).
    Recover(commands::recover::RecoverArgs),
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
    /// Run the experiments of Thoresen's thesis "Oblivious RAM in practice" (NTNU, 2019)
    /// and write a Markdown report with plots.
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
    /// Run the TEE design's trusted component beside the untrusted storage (Zhang's "A
    /// Practical Oblivious Cloud Storage System based on TEE and Client Gateway"): a
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

/// Format of log lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Runs the command; an error ends the process with one clear message (never a backtrace,
/// whatever `RUST_BACKTRACE` says: these are the operator's errors, not the program's) and
/// exit status 1.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            say::error(&format!("{e:#}"));
            std::process::ExitCode::FAILURE
        }
    }
}

/// blindfold's own crates, whose `info` events the long-running commands show by default.
const OWN_CRATES: &[&str] = &[
    "blindfold",
    "blindfold_gateway",
    "blindfold_proxy",
    "blindfold_store",
    "blindfold_node",
    "blindfold_server",
    "blindfold_tee",
];

fn run() -> Result<()> {
    let args = match config::apply_config_file(Cli::command(), std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("blindfold: {e:#}");
            std::process::exit(2);
        }
    };
    let cli = Cli::parse_from(args);
    say::set_json(cli.log_format == LogFormat::Json);
    let log = cli.log.clone().unwrap_or_else(|| match cli.command {
        Command::Serve(_) | Command::Node(_) | Command::StorageServer(_) | Command::Enclave(_) => {
            let own: Vec<String> = OWN_CRATES.iter().map(|c| format!("{c}=info")).collect();
            format!("warn,{}", own.join(","))
        }
        _ => "warn".to_owned(),
    });
    // `s3s` logs every refused request at ERROR under `s3s::ops`; the gateway logs each one
    // itself, once, at the level it deserves, so that target is off unless asked for.
    let directives = if log.contains("s3s") { log.clone() } else { format!("{log},s3s::ops=off") };
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
        Command::Serve(a) => commands::serve::run(a),
        Command::Verify(a) => commands::verify::run(a),
        Command::Status(a) => commands::status::run(a),
        Command::Recover(a) => commands::recover::run(a),
        Command::Init(a) => commands::init::run(a),
        Command::CheckKey(a) => commands::check_key::run(a),
        Command::User(c) => commands::user::run(c),
        Command::RotateKey(a) => commands::rotate_key::run(a),
        Command::Grow(a) => commands::grow::run(a),
        Command::Bench(c) => commands::bench::run(c),
        Command::Report(a) => commands::report::run(a),
        Command::StorageServer(a) => commands::storage_server::run(a),
        Command::Enclave(a) => commands::enclave::run(a),
        Command::EnclaveKey(a) => commands::enclave_key::run(a),
        Command::ClusterCerts(a) => commands::cluster_certs::run(a),
        Command::Node(a) => commands::node::run(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
