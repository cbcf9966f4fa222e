//! Workloads and experiments for blindfold.
//!
//! Every experiment measures its baseline in the same run and reports ratios against it, with
//! the machine it ran on. Results print as a table and save as JSON.
//!
//! * [`path::run`] — Path ORAM throughput, bandwidth blow-up, stash and trusted memory, against
//!   the same blocks sealed without ORAM on the same backend (`blindfold bench path`).

pub mod machine;
pub mod path;
mod progress;

pub use machine::Machine;
