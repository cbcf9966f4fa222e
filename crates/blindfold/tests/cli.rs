//! The `blindfold` binary as a user runs it.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

use blindfold_store::StoreUrl;

fn blindfold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blindfold"))
        .args(args)
        .env_remove("BLINDFOLD_PASSPHRASE")
        .env_remove("BLINDFOLD_REDIS_PASSWORD")
        .output()
        .expect("run blindfold")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

#[test]
fn init_creates_a_private_key_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("sub/key.json");
    let key = key.to_str().unwrap();
    let o = blindfold(&["init", "--key-file", key]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("keep a copy"), "{}", text(&o));
    let mode = std::fs::metadata(key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let before = std::fs::read(key).unwrap();
    let o = blindfold(&["init", "--key-file", key]);
    assert!(!o.status.success(), "second init must fail");
    assert_eq!(std::fs::read(key).unwrap(), before, "the existing key is untouched");
    let o = blindfold(&["check-key", "--key-file", key]);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::set_permissions(key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = blindfold(&["check-key", "--key-file", key]);
    assert!(text(&o).contains("readable by other users"), "{}", text(&o));
}

#[test]
fn passphrase_protected_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key.json");
    let key = key.to_str().unwrap();
    let run = |args: &[&str], pass: &str| {
        Command::new(env!("CARGO_BIN_EXE_blindfold"))
            .args(args)
            .env("BLINDFOLD_PASSPHRASE", pass)
            .output()
            .unwrap()
    };
    assert!(run(&["init", "--key-file", key, "--passphrase"], "correct horse").status.success());
    assert!(run(&["check-key", "--key-file", key, "--passphrase"], "correct horse")
        .status
        .success());
    let o = run(&["check-key", "--key-file", key, "--passphrase"], "wrong horse");
    assert!(!o.status.success());
    assert!(text(&o).to_lowercase().contains("passphrase"), "{}", text(&o));
    let o = blindfold(&["check-key", "--key-file", key]);
    assert!(!o.status.success(), "a passphrase-protected key needs the passphrase");
}

#[test]
fn bench_path_writes_the_promised_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let store = format!("file://{}", dir.path().join("cells").display());
    let o = blindfold(&[
        "bench",
        "path",
        "--blocks",
        "256",
        "--block-size",
        "64",
        "--ops",
        "300",
        "--store",
        &store,
        "--recursive",
        "16",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("slowdown vs baseline"), "{out}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for k in [
        "ops_per_sec",
        "physical_bytes_per_op",
        "blowup",
        "max_stash",
        "trusted_bytes",
        "baseline_ops_per_sec",
        "slowdown",
    ] {
        assert!(v[k].is_number(), "{k} missing in {v}");
    }
    assert!(v["ops_per_sec"].as_f64().unwrap() > 0.0);
    // Path ORAM moves whole paths: many times the block size per access.
    assert!(v["blowup"].as_f64().unwrap() > 10.0, "{v}");
    assert!(v["machine"]["cores"].as_u64().unwrap() >= 1);
    // The store really went to files.
    assert!(dir.path().join("cells/bench-path.cells").exists());
    assert!(dir.path().join("cells/bench-direct.cells").exists());
}

#[test]
fn a_user_error_is_one_message_even_with_backtraces_asked_for() {
    let o = Command::new(env!("CARGO_BIN_EXE_blindfold"))
        .args(["serve", "--data-dir", "/nonexistent-parent/deep/dir"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("Error: the data directory"), "{err}");
    assert!(!err.contains("backtrace") && err.lines().count() <= 2, "{err}");
}

#[test]
fn json_log_format_makes_every_line_of_standard_error_json() {
    use std::io::BufRead;
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    let mut child = Command::new(env!("CARGO_BIN_EXE_blindfold"))
        .args([
            "--log-format",
            "json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--disk-reserve",
            "1MiB",
        ])
        .args(["--data-dir", d.to_str().unwrap(), "--capacity", "1MiB"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut lines = Vec::new();
    // The first start prints notes (new key, "generated S3 credentials") and the banner. The
    // SIGTERM goes out on the first note naming S3 credentials: the handler must already be
    // installed then (it once was not, and the signal killed the gateway).
    while !lines.iter().any(|l: &String| l.contains("S3 credentials")) {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "serve exited: {lines:?}");
        lines.push(line);
    }
    let pid = child.id().to_string();
    assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    for line in err.lines() {
        lines.push(line.unwrap());
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}: {lines:?}", out.status);
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    assert!(lines.iter().any(|l| l.contains("created a new key")), "{lines:?}");
    for line in &lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["timestamp"].is_string(), "{line}");
    }
}

#[test]
fn bad_input_gets_a_clear_error() {
    let o = blindfold(&["bench", "path", "--store", "ftp://x"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("accepted forms") || text(&o).contains("memory:"), "{}", text(&o));
    let o = blindfold(&["bench", "path", "--blocks", "lots"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("not a count"), "{}", text(&o));
    let o = blindfold(&["bench", "path", "--blocks", "64", "--z", "0", "--quiet"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("Z = 0"), "{}", text(&o));
    let o = blindfold(&["bench", "path", "--help"]);
    assert!(o.status.success());
    assert!(text(&o).contains("--cache-levels"));
}

#[test]
fn bench_workload_quick_runs_the_thesis_workload_and_writes_json() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("workload.json");
    let o = blindfold(&[
        "bench",
        "workload",
        "--workload",
        "E",
        "--quick",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("workload E (e-government") && out.contains("5 stage(s)"), "{out}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let row = &v["rows"][0];
    for k in [
        "store_slowdown",
        "store_cost_multiplier",
        "slowdown",
        "response_ms",
        "baseline_response_ms",
        "bandwidth_overhead",
        "outsource_ratio",
        "cost_multiplier",
    ] {
        assert!(row[k].as_f64().is_some_and(|x| x > 0.0), "{k} missing or zero in {row}");
    }
    assert_eq!(v["ops"], 100);
    assert!(v["store_side"]["seconds"].as_f64().is_some_and(|x| x > 0.0), "{v}");
    assert!(out.contains("baseline 1, the store itself"), "{out}");
    // A workload that does not exist is refused by name.
    let o = blindfold(&["bench", "workload", "--workload", "Q", "--quick", "--quiet"]);
    assert!(!o.status.success() && text(&o).contains("A, B, C, D, E"), "{}", text(&o));
}

#[test]
fn bench_git_refuses_what_it_cannot_compare() {
    // The direct side needs an S3 server: another store is refused with the form to use.
    let o = blindfold(&["bench", "git", "--store", "memory:", "--quick", "--quiet"]);
    assert!(!o.status.success() && text(&o).contains("s3://BUCKET?endpoint="), "{}", text(&o));
    // A missing repository bundle is named, with the way out.
    let o = Command::new(env!("CARGO_BIN_EXE_blindfold"))
        .args(["bench", "git", "--store", "s3://bucket?endpoint=http://127.0.0.1:9", "--quiet"])
        .args(["--bundle", "/nonexistent/sdk.bundle"])
        .env("AWS_ACCESS_KEY_ID", "k")
        .env("AWS_SECRET_ACCESS_KEY", "s")
        .output()
        .unwrap();
    let out = text(&o);
    let named = out.contains("/nonexistent/sdk.bundle") && out.contains("--quick");
    // (A machine without git-remote-s3 stops one step earlier, naming it.)
    assert!(!o.status.success() && (named || out.contains("git-remote-s3")), "{out}");
}

#[test]
fn grow_without_a_running_gateway_grows_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().join("d");
    let ds = d.to_str().unwrap();
    serve(&["--data-dir", ds, "--capacity", "1MiB"]).stop();
    let o = blindfold(&["grow", "--data-dir", ds, "--capacity", "512KiB"]);
    assert!(!o.status.success() && text(&o).contains("shrinking is not supported"), "{}", text(&o));
    let o = blindfold(&["grow", "--data-dir", ds, "--capacity", "3MiB"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("grew the store from 1 MiB to 3 MiB"), "{}", text(&o));
    // Said before it starts: what the store will take, and the capacity the same store holds.
    assert!(text(&o).contains("the store will take up to"), "{}", text(&o));
    assert!(text(&o).contains("give --capacity 4MiB to have all of it"), "{}", text(&o));
    let o = blindfold(&["status", "--data-dir", ds]);
    assert!(text(&o).contains("capacity: 3 MiB (768 blocks"), "{}", text(&o));
    // It starts at its new size, the old --capacity flag notwithstanding, and says why.
    let log = serve(&["--data-dir", ds, "--capacity", "1MiB"]).stop();
    assert!(log.contains("--capacity 1 MiB is below this store's capacity, 3 MiB"), "{log}");
    assert!(log.contains("only grows"), "{log}");
    let o = blindfold(&["verify", "--data-dir", ds]);
    assert!(o.status.success(), "{}", text(&o));
    let o = blindfold(&[
        "grow",
        "--data-dir",
        dir.path().join("none").to_str().unwrap(),
        "--capacity",
        "3MiB",
    ]);
    assert!(
        !o.status.success() && text(&o).contains("not a blindfold data directory"),
        "{}",
        text(&o)
    );
}

#[test]
fn bench_gateway_smoke_run_writes_the_promised_json() {
    // Tiny sizes, so this takes a few seconds: it only keeps the benchmark from rotting.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("gateway.json");
    let store = format!("file://{}", dir.path().join("cells").display());
    let o = blindfold(&[
        "bench",
        "gateway",
        "--store",
        &store,
        "--ops",
        "24",
        "--objects",
        "6",
        "--max-size",
        "48KiB",
        "--concurrency",
        "3",
        "--block-size",
        "1024",
        "--quiet",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("slowdown vs baseline") && out.contains("ObliviStore"), "{out}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for k in [
        "ops_per_sec",
        "baseline_ops_per_sec",
        "slowdown",
        "mb_per_sec",
        "p50_ms",
        "p99_ms",
        "bandwidth_overhead",
    ] {
        assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k} missing or zero in {v}");
    }
    // Path ORAM moves whole paths; the baseline about one sealed cell per block.
    assert!(v["bandwidth_overhead"].as_f64().unwrap() > 5.0, "{v}");
    let base = v["baseline"]["bandwidth_overhead"].as_f64().unwrap();
    assert!((0.5..3.0).contains(&base), "{v}");
    assert_eq!(v["get"]["count"].as_u64().unwrap() + v["put"]["count"].as_u64().unwrap(), 24);
    // Both sides priced: the ORAM issues more requests per operation than the baseline.
    let aws = &v["cost"]["providers"][0];
    assert!(aws["multiplier"].as_f64().is_some_and(|m| m > 1.0), "{v}");
    assert!(
        v["usage"]["gets"].as_u64().unwrap() > v["baseline"]["usage"]["gets"].as_u64().unwrap()
    );
    assert!(out.contains("multiplier"), "{out}");
    // Each side's store files are removed afterwards.
    assert_eq!(std::fs::read_dir(dir.path().join("cells")).unwrap().count(), 0);
}

/// `bench regress --only CHECK`, with a slowdown of `factor` injected into the check's engine
/// side if any: whether it passed, its output, and the check's entry of its JSON.
fn regress(check: &str, factor: Option<&str>) -> (bool, String, serde_json::Value) {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("regress.json");
    let inject = factor.map(|f| format!("{check}={f}"));
    let mut args = vec!["bench", "regress", "--only", check, "--json", json.to_str().unwrap()];
    if let Some(i) = &inject {
        args.extend(["--inject-slowdown", i.as_str()]);
    }
    let o = blindfold(&args);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(v["checks"].as_array().unwrap().len(), 1, "{v}");
    (o.status.success(), text(&o), v["checks"][0].clone())
}

/// The proof that the regression set catches a real slowdown: the same check passes as the
/// engine is, and fails by name when its engine side (not its baseline) is made `factor`
/// times slower.
fn a_check_fails_on_an_injected_slowdown(check: &str, factor: u32) {
    let (passed, out, c) = regress(check, None);
    assert!(passed, "{out}");
    assert!(!out.contains("injected"), "{out}");
    let clean = c["ratio"].as_f64().unwrap();
    let (passed, out, c) = regress(check, Some(&factor.to_string()));
    assert!(!passed, "a {factor}x slower engine passed {check}: {out}");
    assert!(out.contains(&format!("{check}: ")) && out.contains("over its bound"), "{out}");
    assert!(out.contains("injected (test hook)"), "{out}");
    assert_eq!(c["ratios"].as_array().unwrap().len(), 3, "tried three times: {c}");
    let slowed = c["ratio"].as_f64().unwrap();
    assert!(slowed > 2.0 * clean, "{clean} then {slowed}");
}

/// `path` only: a 4× slower tao gateway measured 5.7–12.7 against a bound of 5.5, so it
/// passed one of three such tests (docs/benchmarks.md, "The regression set"). Six times, not
/// four: the check's ratio is the floor's rate over Path ORAM's, both measured in the run, and
/// with the whole test suite beside it a clean run can measure 1.05 (2026-11-30, CI), so a 4×
/// slower engine measured 4.22 against the bound of 4.5 and passed.
#[test]
fn bench_regress_fails_when_path_oram_is_6x_slower() {
    a_check_fails_on_an_injected_slowdown("path", 6);
}

#[test]
fn bench_regress_refuses_a_slowdown_it_cannot_inject() {
    for (args, why) in [
        (&["--inject-slowdown", "gateway/nothing=4"][..], "no check is named"),
        (&["--inject-slowdown", "path"][..], "CHECK=FACTOR"),
        (&["--inject-slowdown", "path=0.5"][..], "between 1 and"),
        (&["--inject-slowdown", "path=4", "--only", "gateway/tao"][..], "--only leaves out"),
    ] {
        let o = blindfold(&[&["bench", "regress"][..], args].concat());
        assert!(!o.status.success() && text(&o).contains(why), "{args:?}: {}", text(&o));
    }
    let o = blindfold(&["bench", "regress", "--help"]);
    assert!(text(&o).contains("Test hook"), "{}", text(&o));
}

#[test]
fn bench_concurrency_smoke_run_writes_rows_csv_and_plots() {
    // Tiny sizes and a short round trip: a few seconds, only to keep the harness from rotting.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("concurrency.json");
    let out_dir = dir.path().join("out");
    let o = blindfold(&[
        "bench",
        "concurrency",
        "--dataset-mib",
        "1",
        "--clients",
        "2,8",
        "--k",
        "4",
        "--seconds",
        "0.5",
        "--rtt-ms",
        "5",
        "--quiet",
        "--out-dir",
        out_dir.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("speedup"), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    // Two baseline points and two engine points.
    assert_eq!(rows.len(), 4, "{v}");
    for r in rows {
        for k in ["ops_per_sec", "mean_response_ms", "p99_response_ms", "trusted_bytes"] {
            assert!(r[k].as_f64().is_some_and(|x| x > 0.0), "{k} missing or zero in {r}");
        }
        assert!(r["engine"].is_string() && r["clients"].is_u64() && r["k"].is_u64(), "{r}");
    }
    assert!(rows.iter().any(|r| r["engine"] == "tao" && r["k"] == 4));
    for f in ["concurrency.csv", "throughput-by-clients.svg", "response-time-by-clients.svg"] {
        assert!(out_dir.join(f).exists(), "{f} missing");
    }
}

/// `--durability local,store` adds the gateway's durable engine, once per durability, at each
/// client count, and a line comparing the two: what `serve --durability store` costs.
#[test]
fn bench_concurrency_measures_the_durable_engine_under_both_durabilities() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("concurrency.json");
    let o = blindfold(&[
        "bench",
        "concurrency",
        "--dataset-mib",
        "1",
        "--clients",
        "4",
        "--k",
        "4",
        "--seconds",
        "0.5",
        "--rtt-ms",
        "5",
        "--no-baseline",
        "--durability",
        "local,store",
        "--quiet",
        "--out-dir",
        dir.path().join("out").to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    for engine in ["tao", "tao-local", "tao-store"] {
        let r = rows.iter().find(|r| r["engine"] == engine).unwrap_or_else(|| panic!("{v}"));
        assert!(r["ops_per_sec"].as_f64().is_some_and(|x| x > 0.0), "{r}");
    }
    assert!(text(&o).contains("durable tao, 4 clients: --durability store"), "{}", text(&o));
    // A durability the benchmark does not know is refused, naming the choices.
    let bad = blindfold(&["bench", "concurrency", "--durability", "disk", "--quiet"]);
    assert!(!bad.status.success());
    assert!(text(&bad).contains("local") && text(&bad).contains("store"), "{}", text(&bad));
}

/// A `blindfold serve` started by a test; stopped cleanly (SIGTERM) by [`Served::stop`].
struct Served {
    child: std::process::Child,
    banner: String,
    /// Kept open: the gateway may print more after the banner.
    _stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Served {
    /// Stops it with SIGTERM; returns everything it printed to standard error.
    fn stop(mut self) -> String {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        let out = std::mem::replace(
            &mut self.child,
            Command::new("true").spawn().unwrap(), // placeholder, reaped below
        )
        .wait_with_output()
        .unwrap();
        let _ = self.child.wait();
        assert!(out.status.success(), "serve did not stop cleanly: {}", text(&out));
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

/// Starts `serve` on a free port and waits for its banner; panics with its output if it exits.
fn serve(args: &[&str]) -> Served {
    use std::io::BufRead;
    let port: &[&str] = if args.contains(&"--listen") { &[] } else { &["--listen", "127.0.0.1:0"] };
    let mut child = Command::new(env!("CARGO_BIN_EXE_blindfold"))
        .arg("serve")
        .args(port)
        .args(args)
        .env_remove("BLINDFOLD_PASSPHRASE")
        .env_remove("BLINDFOLD_REDIS_PASSWORD")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run blindfold serve");
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut banner = String::new();
    loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            let out = child.wait_with_output().unwrap();
            panic!("serve exited: {banner}{}", text(&out));
        }
        banner.push_str(&line);
        if line.trim_start().starts_with("S3 credentials") {
            break;
        }
    }
    Served { child, banner, _stdout: stdout }
}

/// `serve` that is expected to fail at start.
fn serve_fails(args: &[&str]) -> String {
    let mut all = vec!["serve"];
    if !args.contains(&"--listen") {
        all.extend(["--listen", "127.0.0.1:0"]);
    }
    all.extend_from_slice(args);
    let o = blindfold(&all);
    assert!(!o.status.success(), "serve should have failed: {}", text(&o));
    text(&o)
}

fn small_store(dir: &std::path::Path) -> Vec<String> {
    vec!["--data-dir".into(), dir.to_str().unwrap().into(), "--capacity".into(), "1MiB".into()]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_lost_or_wrong_key_is_refused_and_never_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d3");
    let args = small_store(&d);
    serve(&strs(&args)).stop();
    let key = d.join("key.json");
    let original = std::fs::read(&key).unwrap();
    std::fs::remove_file(&key).unwrap();
    let before: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
    let out = serve_fails(&strs(&args));
    assert!(out.contains("key.json is missing") && out.contains("backup"), "{out}");
    assert!(!key.exists(), "no new key may be made for a directory that holds a store");
    let after: Vec<_> = std::fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(before, after, "a refused start changes nothing");
    // A key from another backup is recognised as such, not reported as tampering.
    assert!(blindfold(&["init", "--key-file", key.to_str().unwrap()]).status.success());
    let out = serve_fails(&strs(&args));
    assert!(out.contains("does not belong"), "{out}");
    assert!(!out.contains("integrity"), "{out}");
    std::fs::remove_file(&key).unwrap();
    std::fs::write(&key, original).unwrap();
    serve(&strs(&args)).stop();
    // A directory made before key checks existed is accepted and gets one.
    let check = d.join("key-check.json");
    let made = std::fs::read(&check).unwrap();
    std::fs::remove_file(&check).unwrap();
    serve(&strs(&args)).stop();
    assert_eq!(std::fs::read(&check).unwrap().len(), made.len());
}

#[test]
fn a_failed_first_start_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("data");
    // The port is taken: nothing is created.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().to_string();
    let mut args = small_store(&d);
    args.extend(["--listen".into(), port]);
    let out = serve_fails(&strs(&args));
    assert!(out.contains("listening on"), "{out}");
    assert!(!d.exists(), "a failed start must not create the data directory");
    // The admin port is taken: nothing is created, no secret printed.
    let mut args = small_store(&d);
    args.extend(["--admin-listen".into(), taken.local_addr().unwrap().to_string()]);
    let out = serve_fails(&strs(&args));
    assert!(out.contains("--admin-listen") && out.contains("cannot listen"), "{out}");
    assert!(!out.contains("secret key"), "no credentials for a start that failed: {out}");
    assert!(!d.exists(), "a failed start must not create the data directory");
    // A data directory whose parent does not exist is refused, as --help says.
    let deep = tmp.path().join("no/such/deep/dir");
    let out = serve_fails(&strs(&small_store(&deep)));
    assert!(out.contains("does not exist, nor does its parent"), "{out}");
    assert!(!tmp.path().join("no").exists(), "nothing of the mistyped path is made");
    // A disk too small for the store: how much it needs, and a --capacity that fits.
    let out = serve_fails(&[
        "--data-dir",
        d.to_str().unwrap(),
        "--capacity",
        "4TiB",
        "--block-size",
        "65536",
    ]);
    assert!(out.contains("not enough room") && out.contains("--capacity"), "{out}");
    assert!(!d.exists(), "a failed start must not create the data directory");
    // An unreachable store: nothing is created, and the corrected command then works.
    let out =
        serve_fails(&[&strs(&small_store(&d))[..], &["--store", "remote://127.0.0.1:1"]].concat());
    assert!(out.contains("store"), "{out}");
    assert!(!d.exists(), "a failed start must not create the data directory");
    std::fs::create_dir(&d).unwrap();
    let out =
        serve_fails(&[&strs(&small_store(&d))[..], &["--store", "remote://127.0.0.1:1"]].concat());
    assert!(out.contains("store"), "{out}");
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0, "an existing directory stays empty");
    serve(&strs(&small_store(&d))).stop();
    // A mistyped file:// path is not created.
    let d2 = tmp.path().join("d2");
    let typo = format!("file://{}", tmp.path().join("no/such/dir").display());
    let out = serve_fails(&[&strs(&small_store(&d2))[..], &["--store", &typo]].concat());
    assert!(out.contains("does not exist"), "{out}");
    assert!(!tmp.path().join("no").exists() && !d2.exists());
}

#[test]
fn sizes_and_addresses_are_read_as_documented_and_absurd_shapes_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    let ds = d.to_str().unwrap();
    let out = serve_fails(&["--data-dir", ds, "--capacity", "10"]);
    assert!(out.contains("less than one block") && out.contains("bytes"), "{out}");
    let out = serve_fails(&["--data-dir", ds, "--capacity", "4MiB", "--block-size", "100"]);
    assert!(out.contains("--allow-overhead") && out.contains("--block-size"), "{out}");
    assert!(!d.exists());
    // An engine whose store is large by design is told so, without the tree engines' hints.
    let out = serve_fails(&["--data-dir", ds, "--capacity", "4MiB", "--engine", "oblivistore"]);
    assert!(out.contains("the oblivistore engine keeps") && out.contains("--allow-overhead"));
    assert!(!out.contains("--in-place") && !out.contains("4096 takes"), "{out}");
    assert!(!d.exists());
    let o = blindfold(&["serve", "--help"]);
    let help = text(&o);
    for s in ["s3://", "redis://", "remote://", "file://", "bare number is bytes", "GB"] {
        assert!(help.contains(s), "serve --help lacks {s}: {help}");
    }
    // Decimal sizes, a bare port and a host name.
    let s = serve(&["--data-dir", ds, "--capacity", "1.5MiB", "--listen", "0"]);
    assert!(s.banner.contains("1.5 MiB (384 blocks of 4096 bytes)"), "{}", s.banner);
    assert!(s.banner.contains(env!("CARGO_PKG_VERSION")), "{}", s.banner);
    assert!(s.banner.contains("store use: up to") && s.banner.contains("trusted memory"));
    s.stop();
    serve(&["--data-dir", ds, "--listen", "localhost:0"]).stop();
}

#[test]
fn the_secret_is_shown_once_flags_must_agree_and_status_tells_all() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    let ds = d.to_str().unwrap();
    let args = small_store(&d);
    let first = serve(&strs(&args));
    let creds: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("credentials.json")).unwrap()).unwrap();
    let secret = creds["secret_key"].as_str().unwrap().to_string();
    assert!(first.banner.contains(&secret), "{}", first.banner);
    let log = first.stop();
    assert!(!log.contains('\u{1b}'), "colour codes in a log that is not a terminal: {log}");
    let second = serve(&["--data-dir", ds, "--log", "info"]);
    assert!(!second.banner.contains(&secret), "{}", second.banner);
    assert!(second.banner.contains("credentials.json"), "{}", second.banner);
    let log = second.stop();
    assert!(!log.contains('\u{1b}'), "colour codes in a log that is not a terminal: {log}");
    // A larger capacity is a growth, which `blindfold grow` does: the refusal says so.
    let out = serve_fails(&["--data-dir", ds, "--capacity", "2MiB"]);
    assert!(out.contains("blindfold grow") && out.contains("--capacity"), "{out}");
    for (flag, value) in
        [("--engine", "path-oram"), ("--cache-mib", "8"), ("--pad-objects", ""), ("--in-place", "")]
    {
        let mut a = vec!["--data-dir", ds, flag];
        if !value.is_empty() {
            a.push(value);
        }
        let out = serve_fails(&a);
        assert!(out.contains("contradict") && out.contains(flag), "{flag}: {out}");
    }
    let o = blindfold(&["verify", "--data-dir", ds]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("reading every cell") && text(&o).contains("cells"), "{}", text(&o));
    let o = blindfold(&["status", "--data-dir", ds]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    for s in [
        "1 MiB (256 blocks of 4096 bytes",
        "tao engine, two slots per cell",
        "used: 0 of 256 blocks",
        "last clean stop: 2",
        " UTC (",
    ] {
        assert!(out.contains(s), "status lacks {s}: {out}");
    }
    // To the second, for people: no nanoseconds, no offset arithmetic.
    let stop = out.lines().find(|l| l.contains("last clean stop")).unwrap();
    assert!(!stop.contains('.') && stop.ends_with("ago)"), "{stop}");
    // A directory written by a newer blindfold (a higher format version) is refused, saying
    // so, and left as it is.
    let params = d.join("gateway.json");
    let json = std::fs::read_to_string(&params).unwrap();
    assert!(json.contains("\"version\": 2"), "new directories keep two slots per cell: {json}");
    let newer = json.replace("\"version\": 2", "\"version\": 99");
    std::fs::write(&params, &newer).unwrap();
    let out = serve_fails(&["--data-dir", ds]);
    assert!(out.contains("newer blindfold") && out.contains("99"), "{out}");
    assert_eq!(std::fs::read_to_string(&params).unwrap(), newer);
}

/// A new store on an S3-compatible server gets 64 KiB blocks unless `--block-size` says
/// otherwise (the measured default, see `serve --help`); one on local files keeps 4 KiB (checked
/// by the test above).
#[test]
fn a_new_store_on_s3_defaults_to_64_kib_blocks() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, flags, want) in [
        ("default", &[][..], "128 blocks of 65536 bytes"),
        ("explicit", &["--block-size", "16384"][..], "512 blocks of 16384 bytes"),
    ] {
        let Some(url) = blindfold_testkit::servers::s3_url("cli-s3-block-size", "") else {
            return;
        };
        let store = url.to_string();
        let d = tmp.path().join(name);
        let ds = d.to_str().unwrap();
        let mut args = vec!["--data-dir", ds, "--capacity", "8MiB", "--store", &store];
        args.extend_from_slice(flags);
        serve(&args).stop();
        let o = blindfold(&["status", "--data-dir", ds]);
        assert!(o.status.success() && text(&o).contains(want), "{name}: {}", text(&o));
    }
}

/// A password given in `--store redis://:PASSWORD@…` is used on every start (gateway.json keeps
/// the URL without it), without `$BLINDFOLD_REDIS_PASSWORD`; `recover` takes it the same way.
#[test]
fn a_redis_password_in_the_store_flag_is_used_on_every_start() {
    let Some(base) = blindfold_testkit::servers::redis_url("cli-redis-password", "") else {
        return;
    };
    let StoreUrl::Redis { address, .. } = &base else { unreachable!() };
    let Some(password) = address.password.as_ref().map(|p| p.expose().to_owned()) else {
        return; // the tests' Redis always has one; nothing to check without
    };
    // The URL as an operator writes it, password included (Display leaves it out).
    let shown = base.to_string();
    let store = shown.replacen("redis://", &format!("redis://:{password}@"), 1);
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("key.json");
    let key = key.to_str().unwrap();
    assert!(blindfold(&["init", "--key-file", key]).status.success());
    let d = tmp.path().join("data");
    let ds = d.to_str().unwrap();
    let args = ["--data-dir", ds, "--key-file", key, "--capacity", "1MiB", "--store", &store];
    serve(&args).stop();
    serve(&args).stop();
    let fresh = tmp.path().join("fresh");
    let o = blindfold(&[
        "recover",
        "--data-dir",
        fresh.to_str().unwrap(),
        "--store",
        &store,
        "--key-file",
        key,
    ]);
    assert!(o.status.success(), "recover: {}", text(&o));
    assert!(
        !std::fs::read_to_string(d.join("gateway.json")).unwrap().contains(&password),
        "the password is never written to the data directory"
    );
}

#[test]
fn in_place_layout_is_half_the_store_and_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let size = |d: &std::path::Path| -> u64 {
        std::fs::read_dir(d.join("cells"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum()
    };
    let (two, one) = (tmp.path().join("two"), tmp.path().join("one"));
    serve(&strs(&small_store(&two))).stop();
    let mut args = small_store(&one);
    args.push("--in-place".into());
    serve(&strs(&args)).stop();
    let json = std::fs::read_to_string(one.join("gateway.json")).unwrap();
    assert!(json.contains("\"version\": 1"), "{json}");
    let o = blindfold(&["verify", "--data-dir", one.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(size(&two) > size(&one), "{} vs {}", size(&two), size(&one));
}

#[test]
fn user_commands_manage_sealed_users_and_refuse_a_wrong_key() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("users");
    let dir = d.to_str().unwrap();
    let out = text(&blindfold(&["user", "list", "--data-dir", dir]));
    assert!(out.contains("holds no gateway"), "{out}");
    serve(&strs(&small_store(&d))).stop();
    let o = blindfold(&["user", "add", "alice", "--buckets", "team-*,alice", "--data-dir", dir]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    let secret = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("secret key: "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the secret is shown")
        .to_owned();
    assert_eq!(secret.len(), 40, "{out}");
    let list = text(&blindfold(&["user", "list", "--data-dir", dir]));
    assert!(list.contains("alice") && list.contains("team-*,alice"), "{list}");
    assert!(!list.contains(&secret), "list shows the secret: {list}");
    let o = blindfold(&["user", "add", "alice", "--buckets", "x", "--data-dir", dir]);
    assert!(!o.status.success() && text(&o).contains("exists already"), "{}", text(&o));
    let o = blindfold(&["user", "add", "Bad Name", "--buckets", "x", "--data-dir", dir]);
    assert!(!o.status.success() && text(&o).contains("user name"), "{}", text(&o));
    // Another key is refused before anything is written.
    let other = tmp.path().join("other.json");
    assert!(blindfold(&["init", "--key-file", other.to_str().unwrap()]).status.success());
    let o = blindfold(&[
        "user",
        "add",
        "mallory",
        "--buckets",
        "*",
        "--data-dir",
        dir,
        "--key-file",
        other.to_str().unwrap(),
    ]);
    assert!(!o.status.success() && text(&o).contains("not the key"), "{}", text(&o));
    let o = blindfold(&["user", "remove", "alice", "--data-dir", dir]);
    assert!(o.status.success(), "{}", text(&o));
    let list = text(&blindfold(&["user", "list", "--data-dir", dir]));
    assert!(list.contains("no users"), "{list}");
}

/// `serve` with the retired key `old` (written to a file in `tmp`) and `args` is refused.
fn assert_retired_key_refused(tmp: &std::path::Path, old: &[u8], args: &[String]) {
    let retired = tmp.join("retired.json");
    std::fs::write(&retired, old).unwrap();
    let mut with_retired = args.to_vec();
    with_retired.extend(["--key-file".into(), retired.to_str().unwrap().into()]);
    let out = serve_fails(&strs(&with_retired));
    assert!(out.contains("does not belong"), "{out}");
}

/// Waits until the running gateway has finished the key rotation (its file is gone).
fn wait_for_rotation(d: &std::path::Path) {
    let t0 = std::time::Instant::now();
    while d.join("rotation.sealed").exists() {
        assert!(t0.elapsed().as_secs() < 120, "the key rotation did not finish within 120 s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn rotate_key_re_seals_everything_then_retires_the_old_key() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("rot");
    let dir = d.to_str().unwrap();
    let out = text(&blindfold(&["rotate-key", "--data-dir", dir]));
    assert!(out.contains("holds no gateway"), "{out}");
    let args = small_store(&d);
    serve(&strs(&args)).stop();
    let o = blindfold(&["user", "add", "alice", "--buckets", "team-*", "--data-dir", dir]);
    assert!(o.status.success(), "{}", text(&o));
    // Another key is refused, and nothing is written.
    let other = tmp.path().join("other.json");
    assert!(blindfold(&["init", "--key-file", other.to_str().unwrap()]).status.success());
    let o = blindfold(&["rotate-key", "--data-dir", dir, "--key-file", other.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("not the key"), "{}", text(&o));
    assert!(!d.join("rotation.sealed").exists());
    let key = d.join("key.json");
    let old = std::fs::read(&key).unwrap();
    let o = blindfold(&["rotate-key", "--data-dir", dir]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("key.json.next") && text(&o).contains("start"), "{}", text(&o));
    assert!(d.join("rotation.sealed").exists() && d.join("key.json.next").exists());
    assert_eq!(std::fs::read(&key).unwrap(), old, "the key file changes only at the end");
    let o = blindfold(&["rotate-key", "--data-dir", dir]);
    assert!(!o.status.success() && text(&o).contains("already under way"), "{}", text(&o));
    let st = text(&blindfold(&["status", "--data-dir", dir]));
    assert!(st.contains("key rotation: under way"), "{st}");
    // Users can be managed in the middle of a rotation.
    let list = text(&blindfold(&["user", "list", "--data-dir", dir]));
    assert!(list.contains("alice"), "{list}");
    let served = serve(&strs(&args));
    wait_for_rotation(&d);
    let log = served.stop();
    assert!(log.contains("key rotation under way"), "{log}");
    // At the default log level the operator sees it end.
    assert!(log.contains("key rotation finished"), "{log}");
    assert!(!d.join("key.json.next").exists(), "the new key file took the old one's place");
    assert_ne!(std::fs::read(&key).unwrap(), old, "the key file holds the new key");
    let list = text(&blindfold(&["user", "list", "--data-dir", dir]));
    assert!(list.contains("alice"), "{list}");
    let o = blindfold(&["verify", "--data-dir", dir]);
    assert!(o.status.success() && text(&o).contains("OK:"), "{}", text(&o));
    // The retired key opens nothing any more.
    assert_retired_key_refused(tmp.path(), &old, &args);
    // The next rotation puts the new key under a passphrase.
    let o = Command::new(env!("CARGO_BIN_EXE_blindfold"))
        .args(["rotate-key", "--data-dir", dir, "--new-passphrase"])
        .env("BLINDFOLD_NEW_PASSPHRASE", "correct horse battery staple")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let served = serve(&strs(&args));
    wait_for_rotation(&d);
    served.stop();
    let out = serve_fails(&strs(&args));
    assert!(out.contains("passphrase"), "the new key file wants its passphrase: {out}");
    let o = Command::new(env!("CARGO_BIN_EXE_blindfold"))
        .args(["verify", "--data-dir", dir, "--passphrase"])
        .env("BLINDFOLD_PASSPHRASE", "correct horse battery staple")
        .output()
        .unwrap();
    assert!(o.status.success() && text(&o).contains("OK:"), "{}", text(&o));
}

/// The partition engines rotate their key while serving (each partition rebuilt under the
/// new key), and so does the tee engine (re-keyed in place when it opens; refused before
/// 2026-11-28); with its trusted component in another process, `rotate-key` says how to give
/// that process the new key (refused before; the whole rotation through a real `blindfold
/// enclave` runs in the e2e suite's tee-enclave target).
#[test]
fn rotate_key_with_the_partition_and_tee_engines() {
    let tmp = tempfile::tempdir().unwrap();
    for engine in ["oblivistore", "curious-path", "tee"] {
        let d = tmp.path().join(engine);
        let dir = d.to_str().unwrap();
        let mut args = small_store(&d);
        args.extend(["--engine".into(), engine.into(), "--allow-overhead".into()]);
        serve(&strs(&args)).stop();
        let key = d.join("key.json");
        let old = std::fs::read(&key).unwrap();
        let o = blindfold(&["rotate-key", "--data-dir", dir]);
        assert!(o.status.success(), "{engine}: {}", text(&o));
        let served = serve(&strs(&args));
        wait_for_rotation(&d);
        let log = served.stop();
        assert!(log.contains("key rotation under way"), "{engine}: {log}");
        assert_ne!(std::fs::read(&key).unwrap(), old, "{engine}: the key file holds the new key");
        let o = blindfold(&["verify", "--data-dir", dir]);
        assert!(o.status.success() && text(&o).contains("OK:"), "{engine}: {}", text(&o));
        assert_retired_key_refused(tmp.path(), &old, &args);
    }

    // The same data directory, its parameters saying its trusted component is in a storage
    // server: prepared, with the step for the trusted component's host.
    let d = tmp.path().join("tee");
    let params = d.join("gateway.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&params).unwrap()).unwrap();
    json["store"] = "remote://127.0.0.1:1".into();
    std::fs::write(&params, serde_json::to_vec(&json).unwrap()).unwrap();
    let o = blindfold(&["rotate-key", "--data-dir", d.to_str().unwrap()]);
    let next = d.join("key.json.next");
    let step = format!("blindfold enclave-key --key-file {}", next.display());
    assert!(o.status.success() && text(&o).contains(&step), "{}", text(&o));
    assert!(next.exists());
}

/// `serve` with `args` (and `BLINDFOLD_ADMIN_TOKEN` set to `token_env` when given) must exit
/// with an error within a minute; returns what it printed. A gateway that starts instead is
/// killed and the test fails.
fn serve_refused(args: &[&str], token_env: Option<&str>) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_blindfold"));
    cmd.arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("BLINDFOLD_PASSPHRASE")
        .env_remove("BLINDFOLD_ADMIN_TOKEN")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(t) = token_env {
        cmd.env("BLINDFOLD_ADMIN_TOKEN", t);
    }
    let mut child = cmd.spawn().expect("run blindfold serve");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("serve {args:?} (token variable {token_env:?}) started: {}", text(&out));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "serve should have failed: {}", text(&out));
    text(&out)
}

#[test]
fn a_blank_admin_token_is_refused_from_the_flag_the_variable_and_the_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    let store = small_store(&d);
    let base = [&strs(&store)[..], &["--admin-listen", "127.0.0.1:0"]].concat();
    let config = tmp.path().join("blindfold.toml");
    std::fs::write(&config, "admin-token = \"\"\n").unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let blank_file = tmp.path().join("blank.toml");
    std::fs::write(&blank_file, "admin-token = \"  \"\n").unwrap();
    std::fs::set_permissions(&blank_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cases: [(&str, Vec<&str>, Option<&str>); 6] = [
        ("empty flag", vec!["--admin-token", ""], None),
        ("blank flag", vec!["--admin-token", "   "], None),
        ("empty variable", vec![], Some("")),
        ("blank variable", vec![], Some(" \t ")),
        ("empty config key", vec!["--config", config.to_str().unwrap()], None),
        ("blank config key", vec!["--config", blank_file.to_str().unwrap()], None),
    ];
    for (what, extra, env) in cases {
        let out = serve_refused(&[&base[..], &extra[..]].concat(), env);
        assert!(out.contains("admin token") && out.contains("blank"), "{what}: {out}");
        assert!(out.contains("anyone"), "{what}: the message says why: {out}");
        assert!(!d.exists(), "{what}: a refused start creates nothing");
    }
    // A token too short to be a secret is refused the same way.
    let out = serve_refused(&[&base[..], &["--admin-token", "abc"]].concat(), None);
    assert!(out.contains("admin token") && out.contains("16"), "{out}");
    // A real token starts.
    serve(&[&base[..], &["--admin-token", "a-real-admin-token-0123"]].concat()).stop();
}

/// A `blindfold node` process on a free port; stopped with SIGTERM when dropped.
struct NodeProcess {
    child: std::process::Child,
    url: String,
}

impl NodeProcess {
    fn start(dir: &std::path::Path, tls: &std::path::Path, blocks: u64) -> Self {
        use std::io::BufRead;
        let mut child = Command::new(env!("CARGO_BIN_EXE_blindfold"))
            .args(["node", "--listen", "127.0.0.1:0", "--data-dir", dir.to_str().unwrap()])
            .args(["--tls-dir", tls.to_str().unwrap(), "--blocks", &blocks.to_string()])
            .args(["--block-size", "4096"])
            .env_remove("BLINDFOLD_PASSPHRASE")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run blindfold node");
        let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        // Owned at once by the value whose drop stops and reaps it, also if this panics.
        let mut node = Self { child, url: String::new() };
        loop {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "blindfold node exited");
            if let Some(url) = line.trim().strip_prefix("blindfold node serving at ") {
                node.url = url.to_owned();
                // The rest of its output is not needed; keep the pipe drained.
                std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
                return node;
            }
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

/// `recover` of a gateway whose blocks live on `blindfold node` processes: refused without
/// --nodes, done with them (in another order), and the recovered directory serves.
#[test]
fn recover_a_gateway_over_nodes() {
    let tmp = tempfile::tempdir().unwrap();
    let path = |p: &str| tmp.path().join(p).to_str().unwrap().to_owned();
    let o =
        blindfold(&["cluster-certs", "--out", &path("certs"), "--nodes", "127.0.0.1,127.0.0.1"]);
    assert!(o.status.success(), "{}", text(&o));
    let nodes: Vec<NodeProcess> = (1..=2)
        .map(|i| {
            let tls = tmp.path().join("certs").join(format!("node-{i}"));
            NodeProcess::start(&tmp.path().join(format!("node{i}")), &tls, 400)
        })
        .collect();
    let urls = format!("{},{}", nodes[0].url, nodes[1].url);
    let reversed = format!("{},{}", nodes[1].url, nodes[0].url);
    let o = blindfold(&["init", "--key-file", &path("key.json")]);
    assert!(o.status.success(), "{}", text(&o));
    let store = format!("file://{}", path("gateway-store"));
    let gateway = |dir: &str| {
        vec![
            "--data-dir".to_owned(),
            path(dir),
            "--store".to_owned(),
            store.clone(),
            "--key-file".to_owned(),
            path("key.json"),
        ]
    };
    let mut args = gateway("gw1");
    args.extend(
        ["--capacity", "1MiB", "--nodes", &urls, "--tls-dir", &path("certs/balancer")]
            .map(String::from),
    );
    serve(&strs(&args)).stop();
    // The gateway's machine is lost; its store and key survive, and so do the nodes.
    std::fs::remove_dir_all(tmp.path().join("gw1")).unwrap();
    let mut args = vec!["recover".to_owned()];
    args.extend(gateway("gw2"));
    let o = blindfold(&strs(&args));
    assert!(!o.status.success(), "recover without --nodes: {}", text(&o));
    assert!(text(&o).contains("give --nodes"), "{}", text(&o));
    assert!(!tmp.path().join("gw2/gateway.json").exists());
    args.extend(["--nodes", &reversed, "--tls-dir", &path("certs/balancer")].map(String::from));
    let o = blindfold(&strs(&args));
    assert!(o.status.success(), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        stderr.contains("reading node 1 of 2") && stderr.contains("writing node 2 of 2"),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("read all") && stdout.contains("--nodes"), "{stdout}");
    let mut args = gateway("gw2");
    args.extend(["--nodes", &urls, "--tls-dir", &path("certs/balancer")].map(String::from));
    let served = serve(&strs(&args));
    assert!(served.banner.contains("oblivious load balancer"), "{}", served.banner);
    served.stop();
    drop(nodes);
}

/// While a gateway serves from a data directory, `status` asks it how full the store is (the
/// directory database is the gateway's alone), and `verify` refuses at once, saying to stop
/// the gateway first.
#[test]
fn status_and_verify_on_a_directory_a_gateway_serves_from() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path().join("d");
    let ds = d.to_str().unwrap();
    let served = serve(&strs(&small_store(&d)));
    let o = blindfold(&["status", "--data-dir", ds]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for s in ["used: 0 of 256 blocks (0.0%)", "0 objects, 0 bytes", "from the running gateway"] {
        assert!(out.contains(s), "status lacks {s:?}: {out}");
    }
    assert!(!out.contains("in use by another process"), "{out}");
    assert!(out.contains("data directory's disk:"), "{out}");
    let o = blindfold(&["verify", "--data-dir", ds]);
    let out = text(&o);
    assert!(!o.status.success(), "verify on a live directory succeeded: {out}");
    assert!(out.contains("a gateway is serving from"), "{out}");
    assert!(out.contains("stop it") && out.contains("blindfold verify"), "{out}");
    served.stop();
    // Stopped, both read the directory themselves again.
    let o = blindfold(&["status", "--data-dir", ds]);
    assert!(o.status.success() && text(&o).contains("used: 0 of 256 blocks"), "{}", text(&o));
    let o = blindfold(&["verify", "--data-dir", ds]);
    assert!(o.status.success(), "{}", text(&o));
}
