//! The `blindfold` binary as a user runs it.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Output};

fn blindfold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_blindfold"))
        .args(args)
        .env_remove("BLINDFOLD_PASSPHRASE")
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
    // Each side's store files are removed afterwards.
    assert_eq!(std::fs::read_dir(dir.path().join("cells")).unwrap().count(), 0);
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
