//! blindfold's S3 gateway: ordinary S3 clients in front, oblivious storage behind.
//!
//! ```text
//! S3 client ──SigV4/HTTP──▶ s3.rs (s3s)            the S3 API; errors mapped in one place
//!                           objects.rs             objects ⇄ fixed-size blocks, padding, streaming
//!                           directory.rs (redb)    buckets, objects, uploads, block allocator,
//!                           sealed_file.rs         sealed at rest page by page
//!                           engine.rs              the engine behind the object layer (contract and
//!                                                  engines in blindfold_proxy), watched and
//!                                                  swappable while serving
//!                           Store                  untrusted cells (file, memory, …)
//! ```
//!
//! Starting one: [`params`] (the operator's choices, new parameters), [`datadir`] (its files),
//! [`keys`] (key check, keys, credentials), [`hooks`] (what tests and benchmarks change),
//! [`open`] (opening or creating a data directory), [`http`] (serving it), [`recovery`]
//! (rebuilding one from the store's snapshot), [`grow`] and [`rotation`]; [`server`] re-exports
//! what other crates use.
//!
//! Listing, heads and deletes are answered from the trusted directory and cost no storage
//! traffic; reads and writes of object data become ORAM accesses, one per block. A PUT is
//! acknowledged only after its blocks are committed in the ORAM and the directory transaction
//! that publishes the object is durable, so a crash at any instant loses no acknowledged write.
//!
//! [`server::open`] prepares a data directory (key, credentials, parameters) and
//! [`server::run`] serves it.

pub mod admin;
pub mod anchor;
pub mod cors;
pub mod datadir;
mod directory;
pub mod engine;
mod error;
pub mod feed;
pub mod grow;
pub mod hooks;
pub mod http;
pub mod journaling;
pub mod keys;
pub mod lifecycle;
pub mod listen;
pub mod lock;
pub mod objects;
pub mod observe;
pub mod open;
pub mod params;
pub mod recovery;
pub mod rotation;
mod s3;
pub mod sealed_file;
pub mod server;
pub mod sharing;
pub mod snapshot;
pub mod space;
pub mod standby;
pub mod storelog;
pub mod swift;
pub mod tls;
pub mod usage;
pub mod users;
pub mod verify;

pub use directory::{
    BucketConfig, Deleted, Directory, Extent, ObjectMeta, ObjectTotals, Version, Versioning,
};
pub use error::GatewayError;
pub use s3::Gateway;

/// Result type of this crate.
pub type Result<T, E = GatewayError> = std::result::Result<T, E>;
