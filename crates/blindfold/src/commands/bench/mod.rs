//! `blindfold bench`: one module per benchmark, each with its arguments and `run`.

use anyhow::Result;
use clap::Subcommand;

use concurrency::ConcurrencyArgs;
use floor::FloorArgs;
use gateway::GatewayBenchArgs;
use git::GitBenchArgs;
use oblivistore::ObliviStoreArgs;
use onion::OnionArgs;
use path::PathArgs;
use regress::RegressArgs;
use schemes::SchemesArgs;
use tee::TeeArgs;
use workload::WorkloadBenchArgs;

mod concurrency;
mod floor;
mod gateway;
mod git;
mod oblivistore;
mod onion;
mod path;
mod regress;
mod save;
mod schemes;
mod tee;
mod workload;

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Path ORAM vs. the same blocks sealed without ORAM, on the same backend.
    ///
    /// Fills every block (bulk load), runs a seeded uniform workload through Path ORAM, then
    /// the same workload on a sealed store without ORAM, and reports throughput, bandwidth
    /// blow-up, stash, trusted memory and the slowdown ratio.
    Path(PathArgs),
    /// Path vs Ring vs XOR Ring ORAM, reproducing the comparison of Al-Saleh and
    /// Belghith, "Practical Suitability and Experimental Assessment of Tree ORAMs" (2018; Tables
    /// 4, 6-9).
    ///
    /// Fills each scheme with the same blocks, serves the same seeded workload over an
    /// emulated link (exact link time on a virtual clock plus this machine's measured processing
    /// time), and prints response time, system latency, stash behaviour, blocks moved (with the
    /// papers' formulas), per-phase processing time, a link-speed sweep and server storage.
    /// Saves CSV files and SVG plots to --out-dir.
    Schemes(SchemesArgs),
    /// Onion ORAM with real Damgård–Jurik, phase by phase beside Al-Saleh and Belghith's
    /// Table 5 (2018).
    ///
    /// Builds the seed's setup (1024-bit keys, 4 KiB blocks, 2047 buckets, 4096 blocks,
    /// τ = 3), fills the store so every select works on full-size numbers, bulk loads every
    /// block, then serves --ops requests (75 % reads) and reports the time of each phase per
    /// request and per eviction, the amortized time per request, blocks moved and store size.
    /// The full setup takes minutes per request on two cores: use --ops for a shorter
    /// measurement (every access and eviction does the same work, so the means hold), or
    /// --quick for a small run of seconds. Needs a build with `--features onion` (GMP).
    Onion(OnionArgs),
    /// The TEE-assisted engine beside Zhang's Tables I–III (TEE and client
    /// gateway; closed-loop client).
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
    /// The workloads A-E of Thoresen's thesis (2019) through the gateway vs. the same gateway without
    /// ORAM, for each engine and block size.
    ///
    /// The workloads are the checked-in descriptions in workloads/*.toml (stages, read and
    /// write shares, size distributions); every size is multiplied by --scale. Prints slowdown,
    /// response time, bandwidth overhead, outsource ratio, cost multiplier and CPU use per
    /// engine and block size; --rtt-ms/--mbit emulate the public-cloud link (none: the private
    /// cloud).
    Workload(WorkloadBenchArgs),
    /// The git workload of Thoresen's thesis (2019): push, clone, push a commit, pull, through the
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
    /// fixes them. Prints the rows beside the paper's figures and the targets, and
    /// saves CSV and SVG plots to --out-dir.
    Oblivistore(ObliviStoreArgs),
    /// This machine's own limits: sealing and opening a cell (AES-256-GCM) per core, copying
    /// memory, the store's raw write and read throughput and round trip, and the emulated link.
    ///
    /// The main benchmarks (path, gateway, concurrency, oblivistore) measure the same limits in
    /// their own run and print each result as a share of the floor they set for the bytes and
    /// round trips the scheme moves per operation; docs/benchmarks.md explains the model.
    Floor(FloorArgs),
    /// CI's regression set: every engine at a tiny size against its baseline in the same run.
    ///
    /// Runs `bench path`, `bench gateway` for every engine and `bench concurrency` for a second
    /// or two each, and fails, naming the check, when an engine's ratio to its own baseline
    /// exceeds a generous bound (several times the ratios measured on the project's machine):
    /// a several-fold slowdown cannot land silently. Ratios, not times, so a slow machine
    /// slows both sides alike.
    Regress(RegressArgs),
}

/// Runs the benchmark `cmd` names.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Path(a) => path::run(a),
        BenchCommand::Schemes(a) => schemes::run(a),
        BenchCommand::Onion(a) => onion::run(a),
        BenchCommand::Tee(a) => tee::run(a),
        BenchCommand::Gateway(a) => gateway::run(a),
        BenchCommand::Workload(a) => workload::run(a),
        BenchCommand::Git(a) => git::run(a),
        BenchCommand::Concurrency(a) => concurrency::run(a),
        BenchCommand::Oblivistore(a) => oblivistore::run(a),
        BenchCommand::Floor(a) => floor::run(a),
        BenchCommand::Regress(a) => regress::run(a),
    }
}
