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
