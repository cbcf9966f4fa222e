//! `blindfold bench git`: the thesis's real workload (seed 003, "Oblivious RAM in practice",
//! the git experiment): a real repository pushed to a bucket with the real `git` and
//! `git-remote-s3`, cloned, a new commit pushed and pulled, each step timed, through the gateway
//! for each engine and block size and straight against the S3 server in the same run.
//!
//! The repository is the one the thesis used: `openstacksdk-2019.bundle` (OpenStack SDK cut at
//! 5,893 commits, see `../shared/data/README.md`). `--quick` builds a small repository of its
//! own instead (seeded, a few dozen commits of text files), so the command runs in seconds and
//! needs no data files.
//!
//! Sides, all in one run and in this order:
//!
//! 1. *the S3 server directly*: git-remote-s3 against the `--store s3://…` server itself, with
//!    the credentials of the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`);
//! 2. *the gateway without ORAM*: the same gateway with blocks sealed at fixed places;
//! 3. *the gateway* for each engine and block size, its cells in the same S3 server.
//!
//! Each gateway runs in this process (as in [`crate::gateway`]) with its cells under its own
//! prefix of the store's bucket; git-remote-s3 (boto3) talks to it over HTTP with SigV4. Every
//! side is checked: the clone and the pull must end at the pushed commit. git-remote-s3 keeps
//! one git bundle per branch, so a push uploads the whole repository and a clone downloads it:
//! the workload is a few large objects, plus the helper's listings and lock objects.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use blindfold_gateway::server::{EngineKind, OramEngine};
use blindfold_store::StoreUrl;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::gateway::{display, LiveGateway, LiveSetup};
use crate::machine::Machine;

/// The branch of the thesis's repository in the bundle.
pub const BUNDLE_BRANCH: &str = "sdk-2019";

/// Where the bundle lies beside a checkout of blindfold.
pub const DEFAULT_BUNDLE: &str = "../shared/data/openstacksdk-2019.bundle";

/// The bundle's file name.
pub const BUNDLE_NAME: &str = "openstacksdk-2019.bundle";

/// The repository bundle to use: the one given (`--bundle`, `$BLINDFOLD_BUNDLE`), else
/// [`BUNDLE_NAME`] in the current directory, else the one beside a source checkout
/// ([`DEFAULT_BUNDLE`]), if either exists; else the one given or the current directory's, so
/// that the error names a path the user chose or can create.
pub fn find_bundle(given: Option<std::path::PathBuf>) -> std::path::PathBuf {
    if let Some(p) = given {
        return p;
    }
    let here = std::path::PathBuf::from(BUNDLE_NAME);
    [here.clone(), std::path::PathBuf::from(DEFAULT_BUNDLE)]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or(here)
}

/// The thesis's git figures (seed 003): a clone of the 6.3 MB repository through its ORAM
/// proxies took 82–94 minutes.
pub const THESIS_CLONE_MINUTES: (f64, f64) = (82.0, 94.0);

/// The clone through the gateway should take at most this many times the direct clone.
pub const AIM: f64 = 10.0;

/// Parameters of `blindfold bench git`.
#[derive(Clone, Debug, Serialize)]
pub struct GitBench {
    /// The repository: a git bundle (`None`: a small generated repository, `--quick`).
    pub bundle: Option<PathBuf>,
    /// The branch of the bundle to push.
    pub branch: String,
    /// Engines to run.
    #[serde(serialize_with = "crate::workload::displays")]
    pub engines: Vec<OramEngine>,
    /// Block sizes to run, bytes.
    pub block_sizes: Vec<u32>,
    /// The S3 server: the direct side's bucket, and where the gateways keep their cells.
    #[serde(serialize_with = "display")]
    pub store: StoreUrl,
    /// Trusted memory for the tree top, MiB (default: each engine's).
    pub cache_mib: Option<u64>,
    /// Emulated round trip to the S3 server, ms (0: none, the private cloud). The direct
    /// side's git reaches the server through a relay with this link, each gateway its store
    /// through [`blindfold_store::LatencyStore`]; git reaches a gateway on this machine directly
    /// (the thesis's public cloud: the proxy beside the client).
    pub rtt_ms: u64,
    /// Emulated bandwidth each way, Mbit/s.
    pub mbit: Option<u64>,
    /// Seed of the generated repository.
    pub seed: u64,
    /// Print a line per step.
    #[serde(skip)]
    pub progress: bool,
}

/// The seconds each step took on one side.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Steps {
    /// `git push` of the whole repository.
    pub push: f64,
    /// `git clone`.
    pub clone: f64,
    /// `git push` of one new commit.
    pub push_commit: f64,
    /// `git pull` of that commit into the clone.
    pub pull: f64,
}

impl Steps {
    /// All four.
    pub fn total(&self) -> f64 {
        self.push + self.clone + self.push_commit + self.pull
    }
}

/// One side of the run.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    /// What it ran against.
    pub target: String,
    /// The engine (gateway sides with ORAM).
    pub engine: Option<String>,
    /// Block size, bytes (gateway sides).
    pub block_size: Option<u32>,
    /// Seconds per step.
    pub steps: Steps,
    /// Clone time over the direct clone's.
    pub clone_ratio: f64,
    /// All steps over the direct side's.
    pub total_ratio: f64,
    /// Store requests of the gateway (both ways) during the four steps.
    pub store_requests: Option<u64>,
    /// Store bytes (both ways) during the four steps.
    pub store_bytes: Option<u64>,
}

/// What `blindfold bench git` measured.
#[derive(Clone, Debug, Serialize)]
pub struct GitReport {
    /// Always `"git"`.
    pub scheme: &'static str,
    /// Where it ran.
    pub machine: Machine,
    /// The parameters.
    pub params: GitBench,
    /// What the repository is.
    pub repository: String,
    /// Commits on the pushed branch.
    pub commits: u64,
    /// Bytes of the bundle git-remote-s3 uploads for it.
    pub bundle_bytes: u64,
    /// The S3 server directly, then the gateway without ORAM, then each engine and block size.
    pub sides: Vec<Side>,
}

impl GitReport {
    /// The fastest clone through the gateway with ORAM, over the direct clone (`None` if no
    /// ORAM side ran).
    pub fn best_clone_ratio(&self) -> Option<f64> {
        self.sides.iter().filter(|s| s.engine.is_some()).map(|s| s.clone_ratio).reduce(f64::min)
    }
}

/// The caller's AWS variables that git's children do not inherit.
const FOREIGN_AWS: [&str; 7] = [
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_CA_BUNDLE",
];

/// Runs `git` with `args` in `dir` under `env`; its output is returned, its failure is an error
/// with what it printed.
fn git(dir: &Path, env: &[(String, String)], args: &[&str]) -> Result<String> {
    let mut cmd = Command::new("git");
    // Nothing of the caller's AWS setup may send a side's requests elsewhere: a profile, a
    // service-specific endpoint (it overrides AWS_ENDPOINT_URL in boto3) or a session token
    // meant for other credentials. `env` puts back what a side needs.
    for var in FOREIGN_AWS {
        cmd.env_remove(var);
    }
    let out = cmd
        .current_dir(dir)
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .args(args)
        .output()
        .with_context(|| format!("running git {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "git {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Whether `name` is an executable on `PATH`.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

/// The environment every git command runs in: no user or system configuration, an AWS
/// configuration of its own (path-style addressing, SigV4), and `creds`/`endpoint` for boto3.
fn base_env(work: &Path) -> Result<Vec<(String, String)>> {
    let gitconfig = work.join("gitconfig");
    std::fs::write(
        &gitconfig,
        "[user]\n\tname = blindfold bench\n\temail = bench@blindfold.invalid\n\
         [init]\n\tdefaultBranch = main\n[advice]\n\tdetachedHead = false\n",
    )?;
    let awsconfig = work.join("aws-config");
    std::fs::write(
        &awsconfig,
        "[default]\nregion = us-east-1\ns3 =\n  addressing_style = path\n  signature_version = s3v4\n",
    )?;
    let credentials = work.join("aws-credentials");
    std::fs::write(&credentials, "")?;
    let s = |p: &Path| p.display().to_string();
    Ok(vec![
        ("GIT_CONFIG_GLOBAL".into(), s(&gitconfig)),
        ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
        ("GIT_TERMINAL_PROMPT".into(), "0".into()),
        ("AWS_CONFIG_FILE".into(), s(&awsconfig)),
        ("AWS_SHARED_CREDENTIALS_FILE".into(), s(&credentials)),
        ("AWS_DEFAULT_REGION".into(), "us-east-1".into()),
        ("AWS_REGION".into(), "us-east-1".into()),
    ])
}

/// A small repository of its own for `--quick`: `commits` commits of seeded text files.
fn generate_repo(dir: &Path, env: &[(String, String)], seed: u64, commits: usize) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    git(dir, env, &["init", "-q", "-b", "main"])?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for c in 0..commits {
        for _ in 0..3 {
            let file = format!("src/module_{:02}.py", rng.gen_range(0..24));
            let lines: Vec<String> = (0..rng.gen_range(20..200))
                .map(|i| format!("value_{i} = {:#018x}  # commit {c}", rng.gen::<u64>()))
                .collect();
            let path = dir.join(&file);
            std::fs::create_dir_all(path.parent().expect("has a parent"))?;
            std::fs::write(&path, lines.join("\n") + "\n")?;
        }
        git(dir, env, &["add", "-A"])?;
        git(dir, env, &["commit", "-q", "-m", &format!("change {c}")])?;
    }
    Ok(())
}

/// Times one side's four steps against `remote` (an `s3://bucket/prefix` URL) with `env`.
fn run_steps(
    work: &Path,
    env: &[(String, String)],
    src: &Path,
    branch: &str,
    remote: &str,
    label: &str,
    progress: bool,
) -> Result<Steps> {
    let say = |step: &str, secs: f64| {
        if progress {
            eprintln!("  {label}: {step} {secs:.2} s");
        }
    };
    let timed = |args: &[&str], dir: &Path| -> Result<f64> {
        let t = Instant::now();
        git(dir, env, args).with_context(|| format!("{label}: git {}", args[0]))?;
        Ok(t.elapsed().as_secs_f64())
    };
    let dst = work.join(format!("clone-{}", label.replace(|c: char| !c.is_alphanumeric(), "-")));
    let _ = std::fs::remove_dir_all(&dst);
    let mut steps = Steps {
        push: timed(&["push", "-q", remote, &format!("{branch}:refs/heads/main")], src)?,
        ..Steps::default()
    };
    say("push", steps.push);
    steps.clone = timed(&["clone", "-q", remote, &dst.display().to_string()], work)?;
    say("clone", steps.clone);
    let pushed = git(src, env, &["rev-parse", branch])?;
    let cloned = git(&dst, env, &["rev-parse", "HEAD"])?;
    anyhow::ensure!(pushed == cloned, "{label}: the clone is at {cloned}, the push was {pushed}");

    // One new commit on the pushed branch, pushed and pulled.
    let file = src.join("BLINDFOLD-BENCH.txt");
    std::fs::write(&file, format!("a change pushed by blindfold bench git to {label}\n"))?;
    git(src, env, &["checkout", "-q", branch])?;
    git(src, env, &["add", "BLINDFOLD-BENCH.txt"])?;
    git(src, env, &["commit", "-q", "-m", &format!("bench: {label}")])?;
    steps.push_commit = timed(&["push", "-q", remote, &format!("{branch}:refs/heads/main")], src)?;
    say("push a commit", steps.push_commit);
    steps.pull = timed(&["pull", "-q", "--ff-only"], &dst)?;
    say("pull", steps.pull);
    let pushed = git(src, env, &["rev-parse", branch])?;
    let pulled = git(&dst, env, &["rev-parse", "HEAD"])?;
    anyhow::ensure!(pushed == pulled, "{label}: the pull is at {pulled}, the push was {pushed}");
    // The next side starts from the same repository.
    git(src, env, &["reset", "-q", "--hard", &format!("{branch}~1")])?;
    let _ = std::fs::remove_dir_all(&dst);
    Ok(steps)
}

/// Removes every object under `prefix` of the bucket (the sides' leftovers).
async fn remove_prefix(s3: &dyn object_store::ObjectStore, prefix: &str) -> Result<()> {
    use futures::TryStreamExt as _;
    use object_store::ObjectStoreExt as _;
    let p = object_store::path::Path::from(prefix);
    let found: Vec<_> = s3.list(Some(&p)).try_collect().await?;
    for o in found {
        s3.delete(&o.location).await?;
    }
    Ok(())
}

/// Runs the bench.
pub async fn run(p: GitBench) -> Result<GitReport> {
    let StoreUrl::S3 { bucket, prefix, options } = &p.store else {
        bail!(
            "bench git compares the gateway with the S3 server itself: give --store \
             s3://BUCKET?endpoint=http://HOST:PORT (e.g. a MinIO), with its credentials in \
             AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        );
    };
    anyhow::ensure!(!p.engines.is_empty() && !p.block_sizes.is_empty(), "nothing to run");
    for tool in ["git", "git-remote-s3"] {
        anyhow::ensure!(
            on_path(tool),
            "bench git needs {tool} on PATH (git from your package manager, git-remote-s3 from \
             pip: `pip install git-remote-s3`)"
        );
    }
    let mut endpoint = options.endpoint.clone().unwrap_or_default();
    let link = crate::gateway::emulated_link(p.rtt_ms, p.mbit)?;
    // The direct side's git reaches the server through the emulated link.
    let _relay = match link {
        None => None,
        Some(link) => {
            let Some(hostport) = endpoint.strip_prefix("http://") else {
                bail!(
                    "an emulated link (--rtt-ms, --mbit) needs the S3 server's endpoint as \
                     http://HOST:PORT (the direct side's requests are relayed through it)"
                );
            };
            let hostport = hostport.trim_end_matches('/');
            let upstream = tokio::net::lookup_host(hostport)
                .await
                .with_context(|| format!("resolving {hostport}"))?
                .next()
                .with_context(|| format!("{hostport} has no address"))?;
            let relay = crate::link::LinkProxy::start(upstream, link).await?;
            endpoint = format!("http://{}", relay.addr);
            Some(relay)
        }
    };
    let key = std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_default();
    let secret = std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_default();
    anyhow::ensure!(
        !key.is_empty() && !secret.is_empty(),
        "bench git: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to the S3 server's credentials"
    );

    let work = tempfile::Builder::new().prefix("blindfold-bench-git-").tempdir()?;
    let env = base_env(work.path())?;
    let src = work.path().join("src");
    let (repository, branch) = match &p.bundle {
        Some(bundle) => {
            anyhow::ensure!(
                bundle.is_file(),
                "no bundle at {} (the thesis's repository, openstacksdk-2019.bundle; give its \
                 path with --bundle, or use --quick for a small generated repository)",
                bundle.display()
            );
            let b = bundle.canonicalize()?.display().to_string();
            git(work.path(), &env, &["clone", "-q", "--no-checkout", &b, "src"])?;
            git(&src, &env, &["checkout", "-q", &p.branch])?;
            (format!("{} (branch {})", bundle.display(), p.branch), p.branch.clone())
        }
        None => {
            generate_repo(&src, &env, p.seed, 40)?;
            ("a generated repository (40 commits of text files, --quick)".into(), "main".into())
        }
    };
    let commits: u64 = git(&src, &env, &["rev-list", "--count", &branch])?.parse()?;
    let bundle_file = work.path().join("size.bundle");
    git(&src, &env, &["bundle", "create", "-q", &bundle_file.display().to_string(), &branch])?;
    let bundle_bytes = std::fs::metadata(&bundle_file)?.len();
    std::fs::remove_file(&bundle_file)?;
    if p.progress {
        eprintln!("  repository: {repository}: {commits} commits, a {bundle_bytes}-byte bundle");
    }

    let run_id = format!("blindfold-bench-git-{}", std::process::id());
    let under = match prefix.trim_matches('/') {
        "" => run_id.clone(),
        pre => format!("{pre}/{run_id}"),
    };
    let s3: Box<dyn object_store::ObjectStore> =
        Box::new(blindfold_store::aws_builder(bucket, options).build()?);

    // Side 1: the S3 server itself.
    let mut direct_env = env.clone();
    direct_env.extend([
        ("AWS_ACCESS_KEY_ID".to_string(), key),
        ("AWS_SECRET_ACCESS_KEY".to_string(), secret),
    ]);
    // The direct side uses the caller's own credentials, temporary ones and a CA bundle
    // included.
    for var in ["AWS_SESSION_TOKEN", "AWS_CA_BUNDLE"] {
        if let Ok(v) = std::env::var(var) {
            direct_env.push((var.to_string(), v));
        }
    }
    if !endpoint.is_empty() {
        direct_env.push(("AWS_ENDPOINT_URL".into(), endpoint));
    }
    if let Some(region) = &options.region {
        direct_env.push(("AWS_REGION".into(), region.clone()));
        direct_env.push(("AWS_DEFAULT_REGION".into(), region.clone()));
    }
    let (w, s, br) = (work.path().to_path_buf(), src.clone(), branch.clone());
    let remote = format!("s3://{bucket}/{under}/direct/repo");
    let progress = p.progress;
    let direct = tokio::task::spawn_blocking(move || {
        run_steps(&w, &direct_env, &s, &br, &remote, "S3 server directly", progress)
    })
    .await??;
    let mut sides = vec![Side {
        target: format!("the S3 server directly (s3://{bucket})"),
        engine: None,
        block_size: None,
        clone_ratio: 1.0,
        total_ratio: 1.0,
        steps: direct.clone(),
        store_requests: None,
        store_bytes: None,
    }];

    // Room for two bundles (the old one stays until the new one is written), the lock objects
    // and the listings, with room to spare.
    let capacity = (bundle_bytes * 4).max(16 << 20);
    let mut runs: Vec<(EngineKind, OramEngine, u32)> =
        vec![(EngineKind::DirectBaseline, p.engines[0], p.block_sizes[0])];
    for &e in &p.engines {
        for &b in &p.block_sizes {
            runs.push((EngineKind::PathOram, e, b));
        }
    }
    for (n, (kind, engine, block_size)) in runs.into_iter().enumerate() {
        let label = match kind {
            EngineKind::DirectBaseline => format!("gateway without ORAM, {}", human(block_size)),
            EngineKind::PathOram => format!("gateway {engine}, {}", human(block_size)),
        };
        let data_dir = tempfile::Builder::new().prefix("blindfold-bench-git-gw-").tempdir()?;
        let store = StoreUrl::S3 {
            bucket: bucket.clone(),
            prefix: format!("{under}/gateway-{n}"),
            options: options.clone(),
        };
        let cache_mib = p
            .cache_mib
            .unwrap_or_else(|| blindfold_gateway::server::default_cache_mib(engine, Some(&store)));
        let setup = LiveSetup {
            store,
            data_dir: data_dir.path().to_path_buf(),
            capacity,
            block_size,
            cache_mib,
            engine,
            kind,
            in_place: false,
            pack_levels: 1,
            durability: Default::default(),
            reads_ahead_of_log: false,
            standby: false,
            rtt_ms: p.rtt_ms,
            mbit: p.mbit,
            slowdown: None,
        };
        let live = LiveGateway::start(setup, "bench").await.with_context(|| label.clone())?;
        let mut gw_env = env.clone();
        gw_env.extend([
            ("AWS_ACCESS_KEY_ID".to_string(), crate::gateway::ACCESS_KEY.to_string()),
            ("AWS_SECRET_ACCESS_KEY".to_string(), crate::gateway::SECRET_KEY.to_string()),
            ("AWS_ENDPOINT_URL".to_string(), format!("http://{}", live.addr)),
        ]);
        live.counts.reset();
        let (w, s, br, l) = (work.path().to_path_buf(), src.clone(), branch.clone(), label.clone());
        let steps = tokio::task::spawn_blocking(move || {
            run_steps(&w, &gw_env, &s, &br, "s3://bench/repo", &l, progress)
        })
        .await?;
        let objects = Arc::clone(&live.objects);
        let finished = objects.shutdown().await;
        drop(objects);
        let c = live.counts.counts();
        live.stop().await?;
        let steps = steps?;
        finished?;
        sides.push(Side {
            engine: (kind == EngineKind::PathOram).then(|| engine.to_string()),
            block_size: Some(block_size),
            clone_ratio: steps.clone / direct.clone.max(1e-9),
            total_ratio: steps.total() / direct.total().max(1e-9),
            steps,
            store_requests: Some(c.round_trips),
            store_bytes: Some(c.bytes_up() + c.bytes_down()),
            target: label,
        });
    }
    if let Err(e) = remove_prefix(s3.as_ref(), &under).await {
        tracing::warn!("bench git: could not remove {under}/ from s3://{bucket}: {e:#}");
    }
    Ok(GitReport {
        scheme: "git",
        machine: Machine::current(),
        params: p,
        repository,
        commits,
        bundle_bytes,
        sides,
    })
}

fn human(b: u32) -> String {
    blindfold_gateway::server::human_bytes(u64::from(b))
}

/// The report as a table.
pub fn render(r: &GitReport) -> String {
    let mut s = String::new();
    s.push_str(&format!("  machine: {}\n", r.machine.summary()));
    s.push_str(&format!(
        "  repository: {}: {} commits, {} bundle; store {}\n",
        r.repository,
        r.commits,
        blindfold_gateway::server::human_bytes(r.bundle_bytes),
        r.params.store
    ));
    s.push_str(&match (r.params.rtt_ms, r.params.mbit) {
        (0, None) => "  private cloud: no emulated link\n".to_string(),
        (rtt, mbit) => format!(
            "  public cloud: an emulated link of {rtt} ms round trip{} between this machine and \
             the S3 server (git and each gateway on this machine)\n",
            mbit.map_or(String::new(), |m| format!(", {m} Mbit/s each way"))
        ),
    });
    s.push_str(&format!(
        "  {:<44} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}\n",
        "side", "push s", "clone s", "commit s", "pull s", "clone ×", "total ×", "requests"
    ));
    for side in &r.sides {
        s.push_str(&format!(
            "  {:<44} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2}× {:>8.2}× {:>9}\n",
            side.target,
            side.steps.push,
            side.steps.clone,
            side.steps.push_commit,
            side.steps.pull,
            side.clone_ratio,
            side.total_ratio,
            side.store_requests.map_or("-".to_string(), |n| n.to_string())
        ));
    }
    if let Some(best) = r.best_clone_ratio() {
        s.push_str(&format!(
            "  best clone through the gateway: {best:.2}× the direct clone (aim: at most {AIM}×; \
             thesis: {}–{} minutes for its clone of a 6.3 MB repository)\n",
            THESIS_CLONE_MINUTES.0, THESIS_CLONE_MINUTES.1
        ));
    }
    s
}
