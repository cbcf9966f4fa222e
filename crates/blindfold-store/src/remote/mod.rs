//! [`RemoteStore`]: arrays served by `blindfold storage-server` over TCP, and the wire
//! [`protocol`] both sides speak.
//!
//! The untrusted storage server runs as its own process (`blindfold storage-server --listen
//! ADDR --store memory:|file:///dir`, or in-process with the `blindfold-server` crate); a
//! gateway reaches it with the store URL `remote://host:port?key_file=/path` (the key file is
//! the server's `--auth-key-file`, see [`AuthKey`]). The server offers the
//! [`XorStore`](crate::XorStore) capability, which it computes next to the data, so XOR Ring
//! ORAM's online read returns one block instead of a path of them, and (feature `select`)
//! `SelectStore`, Onion ORAM's homomorphic select; a server started with a trusted component
//! also offers [`TeeStore`](crate::TeeStore), the TEE design's queries and eviction rounds.
//! Every server keeps lease records ([`RemoteLeaseRecords`]), compared and replaced on its
//! side, for the [`LeaseStore`](crate::LeaseStore) capability.

mod auth;
mod client;
pub mod protocol;

pub use auth::{nonce, parse_key_hex, read_key_file, write_key_file, AuthKey};
pub use client::{RemoteLeaseRecords, RemoteStore};
