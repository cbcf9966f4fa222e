//! Development-only helpers shared by blindfold's tests: the store conformance suite that every
//! backend and wrapper must pass, and the statistics used by the obliviousness tests.
//! [`servers`] finds the real MinIO and Redis that `scripts/test.sh` starts; [`fuzz`] holds the
//! settings of the randomised-input tests (`BLINDFOLD_FUZZ_CASES`). [`lease`] is the
//! conformance suite of the lease capability (`LeaseStore`), run over every backend. [`xor`]
//! and (feature `select`) `select` check the server-side computation capabilities; [`tee`]
//! checks the TEE design's host with a plaintext stand-in for its trusted component.
//! [`CrashLedger`] and [`DyingStore`] serve the crash-consistency tests. [`engines`] is the engine conformance
//! suite that every engine of the catalogue and a cluster of nodes pass (it depends on
//! `blindfold-proxy`, whose integration tests, not its unit tests, may use it).

pub mod conformance;
mod dying;
pub mod engines;
pub mod fuzz;
pub mod lease;
mod ledger;
#[cfg(feature = "select")]
pub mod select;
pub mod servers;
pub mod stats;
pub mod tee;
pub mod xor;

pub use dying::DyingStore;
pub use ledger::CrashLedger;

/// Fails unless every file of `<manifest_dir>/tests/*.rs` is built: a module of `tests/all.rs`
/// (the one binary most integration tests share) or a `[[test]]` of its own in `Cargo.toml`.
/// A crate with `autotests = false` would otherwise leave a new test file silently unbuilt.
pub fn every_test_file_is_built(manifest_dir: &str) {
    let dir = std::path::Path::new(manifest_dir);
    let read = |p: std::path::PathBuf| {
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
    };
    let all = read(dir.join("tests/all.rs"));
    let manifest = read(dir.join("Cargo.toml"));
    let mut left_out = Vec::new();
    for entry in std::fs::read_dir(dir.join("tests")).expect("list tests/") {
        let name = entry.expect("list tests/").file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".rs") else { continue };
        let in_all = all.lines().any(|l| l.trim() == format!("mod {stem};"));
        let own = manifest.contains(&format!("path = \"tests/{name}\""));
        if stem != "all" && !in_all && !own {
            left_out.push(name);
        }
    }
    assert!(
        left_out.is_empty(),
        "tests/{left_out:?} would never be built: add `mod NAME;` to tests/all.rs, or a [[test]] \
         to Cargo.toml if it changes the whole process (rlimits, signals)"
    );
}
