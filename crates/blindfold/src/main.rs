//! The `blindfold` command: an oblivious storage gateway and its tools.

use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use blindfold_bench::path::{self as path_bench, PathBench};
use blindfold_crypto::{create_key_file, key_file_permissions_ok, load_key_file, Passphrase};
use blindfold_store::StoreUrl;
use clap::{Args, Parser, Subcommand};

/// blindfold keeps data in untrusted storage through Oblivious RAM: the store sees only
/// uniformly random-looking, fixed-size, authenticated-encrypted requests.
#[derive(Parser, Debug)]
#[command(name = "blindfold", version, about, long_about = None)]
struct Cli {
    /// Log filter (also RUST_LOG), e.g. `info`, `debug`, `blindfold_proxy=debug`.
    #[arg(long, global = true, default_value = "warn")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a new key file (mode 0600). Losing the key loses the data.
    Init(InitArgs),
    /// Check that a key file loads (and that its permissions are private).
    CheckKey(KeyArgs),
    /// Run a benchmark; results print as a table and can be saved as JSON.
    #[command(subcommand)]
    Bench(BenchCommand),
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
    /// Where cells go: `memory:` or `file:///path/to/dir` (optionally `?sync=none|flush|always`).
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
    };
    let report = path_bench::run(params).await?;
    println!("blindfold bench path");
    print!("{}", path_bench::render(&report));
    if let Some(path) = args.json {
        let json = serde_json::to_string_pretty(&report)?;
        std::fs::write(&path, json + "\n")
            .with_context(|| format!("writing {}", path.display()))?;
        println!("  saved {}", path.display());
    }
    Ok(())
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&cli.log))
        .context("invalid --log filter")?;
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    match cli.command {
        Command::Init(a) => init(a),
        Command::CheckKey(a) => check_key(a),
        Command::Bench(BenchCommand::Path(a)) => {
            // One core: the engine is sequential, and the figures are quoted per core.
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(bench_path(a))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
