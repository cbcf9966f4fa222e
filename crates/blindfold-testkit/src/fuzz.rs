//! The shared settings of the randomised-input ("hostile input") tests: every decoder of bytes
//! from outside runs under `proptest` with [`config`].
//!
//! The number of cases comes from `BLINDFOLD_FUZZ_CASES` (default [`DEFAULT_CASES`], which
//! keeps the whole set to seconds in the normal test run); a longer run sets it higher, e.g.
//! `BLINDFOLD_FUZZ_CASES=100000 cargo test --release --workspace`. Failures print the seed and the
//! shrunk input; no regression files are written.

use proptest::test_runner::Config;

/// Cases per property when `BLINDFOLD_FUZZ_CASES` is not set.
pub const DEFAULT_CASES: u32 = 256;

/// The number of cases per property: `BLINDFOLD_FUZZ_CASES`, or [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    std::env::var("BLINDFOLD_FUZZ_CASES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_CASES)
}

/// The proptest configuration for a property with [`cases`] cases; `divisor` lowers the count
/// for properties whose cases are expensive (a network round trip each), at least one.
pub fn config_scaled(divisor: u32) -> Config {
    Config {
        cases: (cases() / divisor.max(1)).max(1),
        failure_persistence: None,
        ..Config::default()
    }
}

/// The proptest configuration for a property with [`cases`] cases.
pub fn config() -> Config {
    config_scaled(1)
}
