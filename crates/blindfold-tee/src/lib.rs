//! The trusted component of blindfold's TEE-assisted engine (seed 004).

mod cipher;
mod enclave;
mod error;
mod key;
mod pages;
mod sha;
mod ticket;
pub mod trace;

pub use cipher::{cell_len, TeeCipher, MAX_BLOCK_SIZE};
pub use enclave::{Enclave, MAX_EVICT_BLOCKS, MAX_STREAMS};
pub use error::TeeError;
pub use key::{TeeKey, TEE_KEY_LABEL};
pub use pages::{PAGES, PAGE_SIZE};
pub use ticket::{EvictTicket, QueryTicket};
