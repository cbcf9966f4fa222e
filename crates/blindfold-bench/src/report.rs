//! `blindfold report`: the thesis's experiments (seed 003, "Oblivious RAM in practice") in one
//! command, written up as a Markdown report with tables and SVG plots, the thesis's figures
//! beside ours.
//!
//! What it runs, all in one invocation:
//!
//! 1. workloads A–E ([`crate::workload`]) for each engine and block size, in both of the
//!    thesis's topologies: a *public cloud* (an in-memory store behind an emulated link, by
//!    default 20 ms round trip and 100 Mbit/s each way, close to the thesis's 23.6 ms) and a
//!    *private cloud* (the S3 server of `--s3`, e.g. a MinIO on this machine, with no emulated
//!    link; an in-memory store when no server is given);
//! 2. the git workload ([`crate::git`]) against the S3 server of `--s3` (skipped without one).
//!
//! The thesis's figures come from `workloads/thesis.csv` (its Appendix C tables and the git
//! tables, each with the table and line it was read from).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use blindfold_gateway::server::OramEngine;
use blindfold_store::StoreUrl;
use serde::Serialize;

use crate::git::{GitBench, GitReport};
use crate::machine::Machine;
use crate::workload::{WorkloadBench, WorkloadReport};

/// One figure of the thesis.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ThesisFigure {
    /// `A` … `E`, or `git`.
    pub workload: String,
    /// ObliviStore, CURIOUS, RingORAM, NoORAM-blocks (blocks without ORAM), or Baseline.
    pub scheme: String,
    /// Block size as the thesis writes it (`64KB`), `-` for none.
    pub block: String,
    /// `public` or `private`.
    pub topology: String,
    /// `slowdown`, `cost_multiplier`, `bandwidth_overhead`, `rel_response_time`,
    /// `outsource_ratio`, or a git step in seconds (`push_repo_s`, `clone_repo_s`,
    /// `push_commit_s`, `pull_commit_s`).
    pub metric: String,
    /// The value as printed.
    pub value: f64,
    /// Table and line of the thesis's text.
    pub source: String,
}

/// The thesis's figures (`workloads/thesis.csv`).
pub fn thesis() -> Vec<ThesisFigure> {
    parse_thesis(include_str!("../../../workloads/thesis.csv")).expect("workloads/thesis.csv")
}

fn parse_thesis(text: &str) -> Result<Vec<ThesisFigure>> {
    let mut out = Vec::new();
    let mut lines = text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty());
    let header = lines.next().context("no header")?;
    anyhow::ensure!(
        header == "workload,scheme,block,topology,metric,value,source",
        "unexpected header {header:?}"
    );
    for line in lines {
        let f: Vec<&str> = line.splitn(7, ',').collect();
        anyhow::ensure!(f.len() == 7, "short line {line:?}");
        out.push(ThesisFigure {
            workload: f[0].into(),
            scheme: f[1].into(),
            block: f[2].into(),
            topology: f[3].into(),
            metric: f[4].into(),
            value: f[5].parse().with_context(|| format!("value in {line:?}"))?,
            source: f[6].into(),
        });
    }
    Ok(out)
}

/// The ORAM schemes of the thesis, in the order it reports them.
pub const THESIS_SCHEMES: [&str; 3] = ["ObliviStore", "CURIOUS", "RingORAM"];

/// Parameters of `blindfold report`.
#[derive(Clone, Debug, Serialize)]
pub struct ReportParams {
    /// The short run (toy sizes, one engine and block size).
    pub quick: bool,
    /// Engines.
    #[serde(serialize_with = "crate::workload::displays")]
    pub engines: Vec<OramEngine>,
    /// Block sizes, bytes.
    pub block_sizes: Vec<u32>,
    /// Every object size of the workloads is multiplied by this.
    pub scale: f64,
    /// The public cloud's emulated round trip, ms.
    pub rtt_ms: u64,
    /// The public cloud's emulated bandwidth each way, Mbit/s.
    pub mbit: u64,
    /// The S3 server of the private cloud and of the git workload.
    #[serde(serialize_with = "option_display")]
    pub s3: Option<StoreUrl>,
    /// The git workload's repository (not used by `--quick`, which generates one).
    pub bundle: PathBuf,
    /// Workload seed.
    pub seed: u64,
    /// Progress output.
    #[serde(skip)]
    pub progress: bool,
}

fn option_display<S: serde::Serializer>(v: &Option<StoreUrl>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.collect_str(v),
        None => s.serialize_none(),
    }
}

impl ReportParams {
    /// The defaults of the full report, or of `--quick`.
    pub fn new(quick: bool) -> Self {
        Self {
            quick,
            engines: if quick {
                vec![OramEngine::Tao]
            } else {
                vec![OramEngine::Tao, OramEngine::PathOram]
            },
            block_sizes: if quick { vec![4096] } else { vec![4096, 8 << 10, 64 << 10, 256 << 10] },
            scale: if quick { 1.0 / 1024.0 } else { 1.0 / 64.0 },
            rtt_ms: 20,
            mbit: 100,
            s3: None,
            bundle: PathBuf::from(crate::git::DEFAULT_BUNDLE),
            seed: 1,
            progress: true,
        }
    }
}

/// One topology's run of one workload.
#[derive(Clone, Debug, Serialize)]
pub struct TopologyRun {
    /// `public` or `private`.
    pub topology: &'static str,
    /// What it measured.
    pub report: WorkloadReport,
}

/// Everything `blindfold report` measured.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// When it started (UTC).
    pub started: String,
    /// How long it took, seconds.
    pub seconds: f64,
    /// The parameters.
    pub params: ReportParams,
    /// Every workload in every topology.
    pub workloads: Vec<TopologyRun>,
    /// The git workload (if an S3 server was given).
    pub git: Option<GitReport>,
    /// Why the git workload did not run, if it did not.
    pub git_skipped: Option<String>,
}

/// Runs every experiment.
pub async fn run(p: ReportParams) -> Result<Report> {
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let t = Instant::now();
    let names = crate::workload::names();
    let topologies: [(&'static str, StoreUrl, u64, Option<u64>); 2] = [
        ("public", StoreUrl::Memory, p.rtt_ms, Some(p.mbit)),
        ("private", p.s3.clone().unwrap_or(StoreUrl::Memory), 0, None),
    ];
    // Said now, not after the workloads' half hour: the git workload will not run.
    let no_bundle = p.s3.is_some() && !p.quick && !p.bundle.is_file();
    if no_bundle {
        tracing::warn!(
            "report: no repository bundle at {}: the git workload will be skipped (give --bundle)",
            p.bundle.display()
        );
    }
    let total = topologies.len() * names.len() + usize::from(p.s3.is_some() && !no_bundle);
    let mut step = 0;
    let mut workloads = Vec::new();
    for (topology, store, rtt_ms, mbit) in &topologies {
        for name in &names {
            step += 1;
            if p.progress {
                eprintln!("report [{step}/{total}]: workload {name}, {topology} cloud");
            }
            let params = WorkloadBench {
                workload: name.to_string(),
                engines: p.engines.clone(),
                block_sizes: p.block_sizes.clone(),
                scale: p.scale,
                store: store.clone(),
                rtt_ms: *rtt_ms,
                mbit: *mbit,
                seed: p.seed,
                progress: false,
            };
            let report = crate::workload::run(params)
                .await
                .with_context(|| format!("workload {name}, {topology} cloud"))?;
            workloads.push(TopologyRun { topology, report });
        }
    }
    let (git, git_skipped) = match &p.s3 {
        None => (None, Some("no S3 server given (--s3)".to_string())),
        Some(_) if no_bundle => {
            (None, Some(format!("no repository bundle at {}", p.bundle.display())))
        }
        Some(s3) => {
            step += 1;
            if p.progress {
                eprintln!("report [{step}/{total}]: the git workload");
            }
            let params = GitBench {
                bundle: (!p.quick).then(|| p.bundle.clone()),
                branch: crate::git::BUNDLE_BRANCH.into(),
                engines: p.engines.clone(),
                block_sizes: p.block_sizes.clone(),
                store: s3.clone(),
                cache_mib: None,
                rtt_ms: 0,
                mbit: None,
                seed: p.seed,
                progress: false,
            };
            (Some(crate::git::run(params).await.context("the git workload")?), None)
        }
    };
    Ok(Report {
        machine: Machine::current(),
        started,
        seconds: t.elapsed().as_secs_f64(),
        params: p,
        workloads,
        git,
        git_skipped,
    })
}

/// The metrics the report compares with the thesis: the plot's file name, our value of a row,
/// the thesis's metric name, and a title.
type Metric = (&'static str, fn(&crate::workload::Row) -> f64, &'static str, &'static str);

const METRICS: [Metric; 5] = [
    ("slowdown", |r| r.store_slowdown, "slowdown", "Slowdown (runtime over the store's own)"),
    (
        "cost-multiplier",
        |r| r.store_cost_multiplier,
        "cost_multiplier",
        "Cost multiplier (cost over the store's own)",
    ),
    (
        "bandwidth-overhead",
        |r| r.store_bandwidth_overhead,
        "bandwidth_overhead",
        "Bandwidth overhead (bytes moved over the store's own)",
    ),
    (
        "response-time",
        |r| r.store_response_ratio,
        "rel_response_time",
        "Relative response time (over the store's own)",
    ),
    (
        "outsource-ratio",
        |r| 1.0 / r.outsource_ratio_thesis_capacity.max(1e-12),
        "outsource_ratio",
        "Outsource ratio of a 5 GB ORAM (remote over trusted storage; larger: less local)",
    ),
];

fn human(b: u32) -> String {
    blindfold_gateway::server::human_bytes(u64::from(b))
}

fn fmt(v: f64) -> String {
    if !v.is_finite() {
        "–".into()
    } else if v >= 1000.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The thesis's figures for `workload` and `metric` at each block size, per scheme.
fn thesis_of<'a>(
    t: &'a [ThesisFigure],
    workload: &str,
    scheme: &str,
    metric: &str,
) -> impl Iterator<Item = &'a ThesisFigure> {
    let (w, s, m) = (workload.to_string(), scheme.to_string(), metric.to_string());
    t.iter().filter(move |f| f.workload == w && f.scheme == s && f.metric == m)
}

/// The thesis's figure of `metric` for one workload, scheme, block size and topology.
fn thesis_value(
    t: &[ThesisFigure],
    workload: &str,
    scheme: &str,
    block: &str,
    topology: &str,
    metric: &str,
) -> Option<f64> {
    t.iter()
        .find(|f| {
            f.workload == workload
                && f.scheme == scheme
                && f.block == block
                && f.topology == topology
                && f.metric == metric
        })
        .map(|f| f.value)
}

/// Our best (lowest; for the outsource ratio, highest) value of `metric` for `engine` over the
/// block sizes, with the block size.
fn best_row<'a>(
    r: &'a WorkloadReport,
    engine: Option<&str>,
    metric: fn(&crate::workload::Row) -> f64,
    higher_is_better: bool,
) -> Option<&'a crate::workload::Row> {
    r.rows.iter().filter(|row| engine.is_none_or(|e| row.engine == e)).min_by(|a, b| {
        let (x, y) = (metric(a), metric(b));
        if higher_is_better {
            y.total_cmp(&x)
        } else {
            x.total_cmp(&y)
        }
    })
}

/// Writes `report.md`, `report.json` and the plots into `dir`; returns the files written.
pub fn write(r: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let thesis = thesis();
    let mut files = Vec::new();
    let names = crate::workload::names();
    let public: Vec<&WorkloadReport> =
        r.workloads.iter().filter(|w| w.topology == "public").map(|w| &w.report).collect();

    // Plots: one per metric, the workloads along the axis; our engines (best block size) and
    // the thesis's schemes (best block size) side by side, public cloud.
    for (file, metric, thesis_metric, title) in METRICS {
        let higher = file == "outsource-ratio";
        let groups: Vec<String> = names.iter().map(|n| format!("workload {n}")).collect();
        let mut series = Vec::new();
        for e in &r.params.engines {
            let e = e.to_string();
            let vals = public
                .iter()
                .map(|w| best_row(w, Some(&e), metric, higher).map(metric))
                .collect::<Vec<_>>();
            series.push((format!("blindfold {e} (best block size)"), vals));
        }
        for s in THESIS_SCHEMES {
            let vals = names
                .iter()
                .map(|n| {
                    let v = thesis_of(&thesis, n, s, thesis_metric).map(|f| f.value);
                    if higher {
                        v.reduce(f64::max)
                    } else {
                        v.reduce(f64::min)
                    }
                })
                .collect();
            series.push((format!("thesis {s} (best block size)"), vals));
        }
        let path = dir.join(format!("{file}.svg"));
        crate::plots::bar_plot(&path, &format!("{title}, public cloud"), "×", &groups, &series)?;
        files.push(path);
    }
    if let Some(g) = &r.git {
        let steps = ["push", "clone", "push a commit", "pull"];
        let ours = |s: &crate::git::Steps| vec![s.push, s.clone, s.push_commit, s.pull];
        let mut series: Vec<(String, Vec<Option<f64>>)> = g
            .sides
            .iter()
            .map(|s| {
                (format!("blindfold: {}", s.target), ours(&s.steps).into_iter().map(Some).collect())
            })
            .collect();
        for (scheme, block) in [("Baseline", "-"), ("CURIOUS", "16KB"), ("ObliviStore", "64KB")] {
            let vals = ["push_repo_s", "clone_repo_s", "push_commit_s", "pull_commit_s"]
                .iter()
                .map(|m| thesis_value(&thesis, "git", scheme, block, "public", m))
                .collect();
            let name = if block == "-" {
                "thesis: no ORAM (public cloud)".to_string()
            } else {
                format!("thesis: {scheme} {block} (public cloud)")
            };
            series.push((name, vals));
        }
        let path = dir.join("git.svg");
        let groups: Vec<String> = steps.iter().map(|s| s.to_string()).collect();
        crate::plots::bar_plot(
            &path,
            "The git workload: seconds per step",
            "seconds",
            &groups,
            &series,
        )?;
        files.push(path);
    }

    let md = dir.join("report.md");
    std::fs::write(&md, markdown(r, &thesis))
        .with_context(|| format!("writing {}", md.display()))?;
    files.insert(0, md);
    let json = dir.join("report.json");
    std::fs::write(&json, serde_json::to_string_pretty(r)? + "\n")?;
    files.push(json);
    Ok(files)
}

fn markdown(r: &Report, thesis: &[ThesisFigure]) -> String {
    let p = &r.params;
    let mut s = String::new();
    let push = |s: &mut String, line: String| {
        s.push_str(&line);
        s.push('\n');
    };
    push(&mut s, "# blindfold beside \"Oblivious RAM in practice\" (Thoresen, NTNU 2019)\n".into());
    push(&mut s, format!("- Machine: {}", r.machine.summary()));
    push(&mut s, format!("- Command: `{}`", command_line(p)));
    push(
        &mut s,
        format!(
            "- Started {} and took {:.0} s{}",
            r.started,
            r.seconds,
            if p.quick { " (`--quick`: toy sizes, not for comparison)" } else { "" }
        ),
    );
    push(
        &mut s,
        format!(
            "- Engines {}; block sizes {}; every object size of the workloads × {} (the thesis's \
             files reach 4 GB); workload seed {}",
            p.engines.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(", "),
            p.block_sizes.iter().map(|b| human(*b)).collect::<Vec<_>>().join(", "),
            scale_text(p.scale),
            p.seed
        ),
    );
    push(
        &mut s,
        format!(
            "- Public cloud: an in-memory store behind an emulated link of {} ms round trip and \
             {} Mbit/s each way (the thesis: IBM Cloud Object Storage, 23.6 ms, 510 Mbit/s)",
            p.rtt_ms, p.mbit
        ),
    );
    push(
        &mut s,
        match &p.s3 {
            Some(u) => format!("- Private cloud: the S3 server {u} on this machine, no emulated link"),
            None => "- Private cloud: no S3 server was given (`--s3`), so an in-memory store with no \
                     link stands in; it answers in microseconds, so its ratios overstate the ORAM's \
                     share"
                .into(),
        },
    );
    push(&mut s, String::new());
    push(
        &mut s,
        "Every ratio is over the same operations straight against the same store in the same run \
         (the thesis's baseline, \"no ORAM, no blocks\"): slowdown is runtime over runtime, cost \
         multiplier is dollars over dollars at AWS S3 list prices (`docs/cost.md`; the thesis \
         was billed by IBM at the same request and transfer prices), bandwidth overhead is bytes \
         moved over bytes moved, relative response time is mean over mean, outsource ratio is \
         the store's bytes over the gateway's trusted bytes (as the thesis printed it: larger \
         means less local storage), estimated for this run's capacity (sized to the workload) \
         and for the thesis's 5 GB ORAM; the tree top the gateway keeps in trusted memory \
         (128 MiB with tao, 32 with path-oram) is most of a small store. \"vs no ORAM\" is the \
         slowdown against the same gateway with blocks but no ORAM (the thesis's second baseline). The thesis ran workloads A–E in the \
         public cloud only; its figures are from its Appendix C (`workloads/thesis.csv` gives \
         the table and line of each)."
            .into(),
    );
    push(&mut s, String::new());

    // Summary against the targets.
    push(&mut s, "## Summary\n".into());
    push(
        &mut s,
        "| workload | our best slowdown | thesis best slowdown | our best cost × | thesis best cost × |"
            .into(),
    );
    push(&mut s, "|---|---|---|---|---|".into());
    for run in r.workloads.iter().filter(|w| w.topology == "public") {
        let w = &run.report;
        let ours = |m: fn(&crate::workload::Row) -> f64| {
            best_row(w, None, m, false).map_or("–".to_string(), |row| {
                format!("{}× ({}, {})", fmt(m(row)), row.engine, human(row.block_size))
            })
        };
        let theirs = |metric: &str| {
            THESIS_SCHEMES
                .iter()
                .flat_map(|sch| thesis_of(thesis, &w.spec.name, sch, metric))
                .min_by(|a, b| a.value.total_cmp(&b.value))
                .map_or("–".to_string(), |f| {
                    format!("{}× ({}, {})", fmt(f.value), f.scheme, f.block)
                })
        };
        push(
            &mut s,
            format!(
                "| {} ({}) | {} | {} | {} | {} |",
                w.spec.name,
                w.spec.title,
                ours(|r| r.store_slowdown),
                theirs("slowdown"),
                ours(|r| r.store_cost_multiplier),
                theirs("cost_multiplier")
            ),
        );
    }
    push(&mut s, String::new());
    // Toy sizes measure start-up and noise: the targets are judged on full runs only.
    if p.quick {
        push(
            &mut s,
            "No verdict on the targets: `--quick` runs toy sizes for a few seconds, too short to \
             judge; run `blindfold report` without it."
                .into(),
        );
    }
    if let Some(a) = r
        .workloads
        .iter()
        .find(|w| w.topology == "public" && w.report.spec.name == "A")
        .filter(|_| !p.quick)
    {
        let best = |m: fn(&crate::workload::Row) -> f64| {
            best_row(&a.report, None, m, false).map_or(f64::NAN, m)
        };
        let (sd, cost) = (best(|r| r.store_slowdown), best(|r| r.store_cost_multiplier));
        // The targets hold for one engine and block size at once, or not.
        let both = a
            .report
            .rows
            .iter()
            .filter(|r| r.store_slowdown <= 3.0 && r.store_cost_multiplier <= 10.0)
            .min_by(|x, y| x.store_cost_multiplier.total_cmp(&y.store_cost_multiplier));
        push(
            &mut s,
            format!(
                "blindfold's targets, workload A behind the public cloud: slowdown ≤ 3× — {} \
                 ({}×); cost multiplier ≤ 10× — {} ({}×); both by one engine and block size — \
                 {}.",
                met(sd <= 3.0),
                fmt(sd),
                met(cost <= 10.0),
                fmt(cost),
                match both {
                    Some(r) => format!(
                        "{} ({}, {}: {}× and {}×)",
                        met(true),
                        r.engine,
                        human(r.block_size),
                        fmt(r.store_slowdown),
                        fmt(r.store_cost_multiplier)
                    ),
                    None => met(false).to_string(),
                }
            ),
        );
    }
    if let Some(best) = r.git.as_ref().and_then(|g| g.best_clone_ratio()).filter(|_| !p.quick) {
        push(
            &mut s,
            format!(
                "Git: the clone through the gateway ≤ 10× the direct clone — {} ({}×).",
                met(best <= crate::git::AIM),
                fmt(best)
            ),
        );
    }
    push(&mut s, String::new());
    for (file, _, _, title) in METRICS {
        push(&mut s, format!("![{title}]({file}.svg)\n"));
    }

    // Per workload.
    for name in crate::workload::names() {
        let runs: Vec<&TopologyRun> =
            r.workloads.iter().filter(|w| w.report.spec.name == name).collect();
        let Some(first) = runs.first() else { continue };
        let w = &first.report;
        push(&mut s, format!("## Workload {} — {}\n", w.spec.name, w.spec.title));
        push(
            &mut s,
            format!(
                "{} objects ({} loaded first, {} in all), {} measured operations in {} stage(s); \
                 from {}.\n",
                w.objects,
                w.loaded,
                blindfold_gateway::server::human_bytes(w.dataset_bytes),
                w.ops,
                w.spec.stage.len(),
                w.spec.source
            ),
        );
        push(
            &mut s,
            "| topology | engine | block | slowdown | cost × | bandwidth × | response × | outsource (this run; 5 GB) | vs no ORAM | cores busy |"
                .into(),
        );
        push(&mut s, "|---|---|---|---|---|---|---|---|---|---|".into());
        for run in &runs {
            let rep = &run.report;
            for row in &rep.rows {
                push(
                    &mut s,
                    format!(
                        "| {} | {} | {} | {}× | {}× | {}× | {}× | {}; {} | {}× | {:.2} |",
                        run.topology,
                        row.engine,
                        human(row.block_size),
                        fmt(row.store_slowdown),
                        fmt(row.store_cost_multiplier),
                        fmt(row.store_bandwidth_overhead),
                        fmt(row.store_response_ratio),
                        fmt(1.0 / row.outsource_ratio.max(1e-12)),
                        fmt(1.0 / row.outsource_ratio_thesis_capacity.max(1e-12)),
                        fmt(row.slowdown),
                        row.cores_busy
                    ),
                );
            }
            push(
                &mut s,
                format!(
                    "| {} | *the store itself* ({}) | | {:.2} s | | | {:.1} ms | | | |",
                    run.topology,
                    rep.store_side.store,
                    rep.store_side.seconds,
                    rep.store_side.mean_ms
                ),
            );
        }
        push(&mut s, String::new());
        push(&mut s, "The thesis (public cloud):\n".into());
        push(
            &mut s,
            "| scheme | block | slowdown | cost × | bandwidth × | response × | outsource |".into(),
        );
        push(&mut s, "|---|---|---|---|---|---|---|".into());
        let mut keys: Vec<(String, String)> = Vec::new();
        for f in thesis.iter().filter(|f| f.workload == name) {
            let k = (f.scheme.clone(), f.block.clone());
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        for (scheme, block) in keys {
            let v = |m: &str| {
                thesis_value(thesis, name, &scheme, &block, "public", m)
                    .map_or("–".to_string(), fmt)
            };
            push(
                &mut s,
                format!(
                    "| {} | {} | {}× | {}× | {}× | {}× | {} |",
                    if scheme == "NoORAM-blocks" { "blocks, no ORAM" } else { &scheme },
                    block,
                    v("slowdown"),
                    v("cost_multiplier"),
                    v("bandwidth_overhead"),
                    v("rel_response_time"),
                    v("outsource_ratio")
                ),
            );
        }
        push(&mut s, String::new());
    }

    // Git.
    push(&mut s, "## The git workload\n".into());
    match (&r.git, &r.git_skipped) {
        (Some(g), _) => {
            push(
                &mut s,
                format!(
                    "{}: {} commits, a {} bundle, pushed and cloned with git and git-remote-s3; \
                     the gateway's cells and the direct side's objects in the same S3 server \
                     ({}), no emulated link.\n",
                    g.repository,
                    g.commits,
                    blindfold_gateway::server::human_bytes(g.bundle_bytes),
                    g.params.store
                ),
            );
            push(
                &mut s,
                "| side | push s | clone s | push a commit s | pull s | clone × | all steps × |"
                    .into(),
            );
            push(&mut s, "|---|---|---|---|---|---|---|".into());
            for side in &g.sides {
                push(
                    &mut s,
                    format!(
                        "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {}× | {}× |",
                        side.target,
                        side.steps.push,
                        side.steps.clone,
                        side.steps.push_commit,
                        side.steps.pull,
                        fmt(side.clone_ratio),
                        fmt(side.total_ratio)
                    ),
                );
            }
            push(&mut s, "\n![The git workload](git.svg)\n".into());
        }
        (None, why) => {
            push(&mut s, format!("Not run: {}.\n", why.as_deref().unwrap_or("unknown reason")))
        }
    }
    push(
        &mut s,
        "The thesis (OpenStack SDK, 5,894 commits, 6.3 MB cloned; Tables 5.6–5.8):\n".into(),
    );
    push(&mut s, "| scheme | topology | push s | clone s | push a commit s | pull s |".into());
    push(&mut s, "|---|---|---|---|---|---|".into());
    let mut keys: Vec<(String, String, String)> = Vec::new();
    for f in thesis.iter().filter(|f| f.workload == "git") {
        let k = (f.scheme.clone(), f.block.clone(), f.topology.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    for (scheme, block, topology) in keys {
        let v = |m: &str| {
            thesis_value(thesis, "git", &scheme, &block, &topology, m)
                .map_or("–".to_string(), |v| format!("{v:.1}"))
        };
        let who =
            if scheme == "Baseline" { "no ORAM".to_string() } else { format!("{scheme} {block}") };
        push(
            &mut s,
            format!(
                "| {who} | {topology} | {} | {} | {} | {} |",
                v("push_repo_s"),
                v("clone_repo_s"),
                v("push_commit_s"),
                v("pull_commit_s")
            ),
        );
    }
    s
}

/// The command that runs this report again (the S3 server's address as given).
fn command_line(p: &ReportParams) -> String {
    let defaults = ReportParams::new(p.quick);
    let mut c = String::from("blindfold report");
    if p.quick {
        c.push_str(" --quick");
    }
    if let Some(s3) = &p.s3 {
        c.push_str(&format!(" --s3 '{s3}'"));
    }
    if p.engines != defaults.engines {
        let e: Vec<String> = p.engines.iter().map(|e| e.to_string()).collect();
        c.push_str(&format!(" --engine {}", e.join(",")));
    }
    if p.block_sizes != defaults.block_sizes {
        let b: Vec<String> = p.block_sizes.iter().map(|b| b.to_string()).collect();
        c.push_str(&format!(" --block-size {}", b.join(",")));
    }
    if p.scale != defaults.scale {
        c.push_str(&format!(" --scale {}", p.scale));
    }
    if (p.rtt_ms, p.mbit) != (defaults.rtt_ms, defaults.mbit) {
        c.push_str(&format!(" --rtt-ms {} --mbit {}", p.rtt_ms, p.mbit));
    }
    if !p.quick && p.bundle != defaults.bundle {
        c.push_str(&format!(" --bundle {}", p.bundle.display()));
    }
    if p.seed != defaults.seed {
        c.push_str(&format!(" --seed {}", p.seed));
    }
    c
}

fn met(ok: bool) -> &'static str {
    if ok {
        "**met**"
    } else {
        "**not met**"
    }
}

fn scale_text(scale: f64) -> String {
    let inv = 1.0 / scale;
    if (inv - inv.round()).abs() < 1e-9 {
        format!("1/{}", inv.round())
    } else {
        format!("{scale}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thesis_table_is_complete_and_agrees_with_its_summary() {
        let t = thesis();
        // Every workload: three block sizes for each of the three schemes and the blocks-only
        // baseline, five metrics each.
        for w in crate::workload::names() {
            for scheme in THESIS_SCHEMES.iter().chain(&["NoORAM-blocks"]) {
                for m in [
                    "slowdown",
                    "cost_multiplier",
                    "bandwidth_overhead",
                    "rel_response_time",
                    "outsource_ratio",
                ] {
                    let n = thesis_of(&t, w, scheme, m).count();
                    assert_eq!(n, 3, "{w} {scheme} {m}");
                }
            }
        }
        // The ranges quoted elsewhere (`gateway::THESIS`, workload A slowdowns) are these.
        for (name, lo, hi) in crate::gateway::THESIS {
            let scheme = name.replace(' ', "");
            let v: Vec<f64> = thesis_of(&t, "A", &scheme, "slowdown").map(|f| f.value).collect();
            let (min, max) = v.iter().fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
            assert!((min - lo).abs() < 0.5 && (max - hi).abs() < 0.6, "{name}: {min}–{max}");
        }
        // The git clone times are the 82–94 minutes quoted.
        let clones: Vec<f64> = t
            .iter()
            .filter(|f| {
                f.workload == "git"
                    && f.topology == "public"
                    && f.scheme != "Baseline"
                    && f.metric == "clone_repo_s"
            })
            .map(|f| f.value / 60.0)
            .collect();
        assert_eq!(clones.len(), 2);
        let (lo, hi) = crate::git::THESIS_CLONE_MINUTES;
        assert!(clones.iter().all(|m| (lo..hi + 1.0).contains(m)), "{clones:?}");
    }

    #[test]
    fn malformed_thesis_tables_are_refused() {
        let good = "workload,scheme,block,topology,metric,value,source\nA,CURIOUS,64KB,public,slowdown,17,x\n";
        assert_eq!(parse_thesis(good).unwrap().len(), 1);
        assert!(parse_thesis(&good.replace(",17,", ",seventeen,")).is_err());
        assert!(parse_thesis(&good.replace("workload,", "wl,")).is_err());
        assert!(parse_thesis("workload,scheme,block,topology,metric,value,source\nA,CURIOUS\n")
            .is_err());
    }
}
