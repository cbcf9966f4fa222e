//! blindfold's distributed mode, as in ObliviStore's distributed setting: several ORAM nodes
//! behind one oblivious load balancer.
//!
//! ```text
//! S3 clients ─▶ blindfold serve --nodes …   the gateway; its block engine is the Balancer
//!                    │ gRPC, mutual TLS (cluster CA), fixed-size frames
//!        ┌───────────┼───────────┐
//!   blindfold node  node  …  node           each an ordinary blindfold engine (tao, path-oram, …)
//!        │           │           │          in its own data directory
//!      store       store       store        any backend: file, s3, redis, remote
//! ```
//!
//! * [`balancer`] — the [`balancer::Balancer`], a `SharedEngine` that spreads block accesses
//!   over the nodes so that which node serves which request reveals nothing (position map,
//!   eviction cache, fake reads, redo log); its design and leakage are in its documentation.
//! * [`recover`] — rebuilding a lost balancer's state from a snapshot of its checkpoint.
//! * [`node`] — `blindfold node`: an engine opened as the gateway opens one, served over gRPC.
//! * [`client`] — the balancer's connection to a node.
//! * [`wire`] — the one protobuf message and the fixed layouts inside it.
//! * [`certs`] — the cluster CA and certificates (`blindfold cluster-certs`), and the TLS setup
//!   of both ends.
//!
//! The gRPC stubs are generated in `build.rs` from a Rust description of the service (no
//! `.proto` file, no `protoc`).

pub mod balancer;
pub mod certs;
pub mod client;
mod error;
pub mod node;
pub mod recover;
pub mod wire;

pub use balancer::{Balancer, BalancerConfig};
pub use certs::{write_cluster_certs, ClusterTls};
pub use client::NodeClient;
pub use error::NodeError;

/// The generated gRPC client and server of the node service.
#[allow(missing_docs, missing_debug_implementations, clippy::all, rust_2018_idioms)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/blindfold.node.v1.Node.rs"));
}
