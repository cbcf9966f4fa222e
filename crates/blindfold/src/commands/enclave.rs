//! `blindfold enclave`: a storage server that also runs the TEE engine's trusted component.

use anyhow::{bail, Result};

use crate::commands::storage_server::{self, StorageServerArgs};

/// `blindfold storage-server` with `--enclave-key` required.
pub fn run(a: StorageServerArgs) -> Result<()> {
    if a.enclave_key.is_none() {
        bail!(
            "`blindfold enclave` needs --enclave-key FILE (write one with `blindfold \
             enclave-key --key-file KEY --out FILE`)"
        );
    }
    storage_server::run(a)
}
