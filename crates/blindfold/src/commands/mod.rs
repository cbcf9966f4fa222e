//! The commands of `blindfold`, one module each (`blindfold rotate-key` is `rotate_key`),
//! each with its clap arguments and a `run` function that `main` calls. Below them, imported
//! by them and importing none of them: the flags and helpers several commands share
//! (`data_dir`, `parse`, `passphrase`, `runtime`).

pub mod bench;
pub mod check_key;
pub mod cluster_certs;
pub mod enclave;
pub mod enclave_key;
pub mod grow;
pub mod init;
pub mod node;
pub mod recover;
pub mod report;
pub mod rotate_key;
pub mod serve;
pub mod status;
pub mod storage_server;
pub mod user;
pub mod verify;

pub mod data_dir;
pub mod parse;
pub mod passphrase;
pub mod runtime;
