//! Development-only helpers shared by blindfold's tests: the store conformance suite that every
//! backend and wrapper must pass, and the statistics used by the obliviousness tests.

pub mod conformance;
pub mod stats;
