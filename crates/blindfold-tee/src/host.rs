//! The enclave as the untrusted host calls it: [`blindfold_store::Trusted`] for [`Enclave`].
//!
//! The host (`blindfold_store::TeeHost`, in-process or in `blindfold storage-server
//! --enclave-key`) reads the cells and hands them over; the enclave's refusals become
//! [`StoreError::Trusted`], with `integrity` set when sealed data failed authentication, so the
//! gateway can tell tampering from a bad request even across the wire.

use blindfold_store::{StoreError, Trusted};

use crate::{Enclave, TeeError};

fn refused(e: TeeError) -> StoreError {
    StoreError::Trusted { integrity: e.is_integrity(), message: e.to_string() }
}

impl Trusted for Enclave {
    fn query(&self, candidates: &[Vec<u8>], ticket: &[u8]) -> blindfold_store::Result<Vec<u8>> {
        Enclave::query(self, candidates, ticket).map_err(refused)
    }

    fn evict(&self, blocks: &mut [Vec<u8>], ticket: &[u8]) -> blindfold_store::Result<()> {
        Enclave::evict(self, blocks, ticket).map_err(refused)
    }
}
