//! Workloads and experiments for blindfold.
//!
//! Every experiment measures its baseline in the same run and reports ratios against it, with
//! the machine it ran on. Results print as a table and save as JSON.
//!
//! * [`path::run`] — Path ORAM throughput, bandwidth blow-up, stash and trusted memory, against
//!   the same blocks sealed without ORAM on the same backend (`blindfold bench path`).
//! * [`schemes::run`] — Path vs Ring vs XOR Ring ORAM as in seed 002's experiment: response
//!   time, system latency, stash, blocks moved, per-phase time, link-speed sweep and server
//!   storage, with the papers' formulas beside the measurements (`blindfold bench schemes`).
//! * [`concurrency::run`] — the TaoStore-style concurrent engine by number of clients and
//!   write-back interval, against sequential Path ORAM over the same emulated WAN
//!   (`blindfold bench concurrency`).
//! * [`oblivistore::run`] — seed 001's experiments for the partition engines, TaoStore beside
//!   them: throughput and response time by round trip, seeks per operation on the file
//!   backend, throughput by number of ORAM nodes (`blindfold bench oblivistore`).
//! * [`workload::run`] — the thesis's workloads A–E through the gateway against both of its
//!   baselines (`blindfold bench workload`).
//! * [`git::run`] — the thesis's git workload: push, clone, push, pull of a real repository
//!   with git-remote-s3, through the gateway and straight against the S3 server
//!   (`blindfold bench git`).
//! * [`regress::run`] — a small set of engines at tiny sizes, each against its baseline in the
//!   same run, with generous bounds: CI's guard against a several-fold slowdown
//!   (`blindfold bench regress`).
//! * [`report::run`] — all of the thesis's experiments, written up with plots beside its
//!   figures (`blindfold report`).
//! * `onion::run` (feature `onion`) — Onion ORAM with real Damgård–Jurik, phase by phase
//!   beside seed 002's Table 5 (`blindfold bench onion`).
//! * [`floor`] — this machine's own limits (sealing, copying, the store, the link) and the best
//!   time per operation they allow a scheme; every main benchmark reports its share of it.
//! * [`cost`] — requests and bytes by kind priced at cloud list prices, and the cost multiplier
//!   over the same workload without ORAM.

pub mod concurrency;
pub mod cost;
pub mod floor;
pub mod gateway;
pub mod git;
mod link;
pub mod machine;
pub mod oblivistore;
#[cfg(feature = "onion")]
pub mod onion;
pub mod path;
mod plots;
mod progress;
pub mod regress;
pub mod report;
pub mod schemes;
pub mod seeks;
pub mod slow;
pub mod tee;
pub mod workload;

pub use machine::Machine;
