//! Keys and cell sealing for blindfold.
//!
//! Everything blindfold puts into the untrusted store passes through a [`CellSealer`]: each
//! cell segment is encrypted and authenticated with AES-256-GCM, bound to the store, its
//! address, its version and its segment index. Tampering, swapping two cells and replaying an
//! older version of a cell are all caught as [`CryptoError::Integrity`] — never as wrong data.
//! The one master secret ([`MasterKey`]) lives in a key file, raw or protected by an Argon2id
//! passphrase ([`create_key_file`], [`load_key_file`]).
//!
//! The primitives come from `ring` (AES-256-GCM, HKDF-SHA256, the system RNG) and `argon2`;
//! this crate only composes them. Secret types wipe themselves on drop, print as
//! `<redacted>` and compare in constant time.
//!
//! # Sealed segment
//!
//! ```text
//! offset  0        4                16                      len-16        len
//!         | epoch  | nonce          | ciphertext            | tag          |
//!           u32 LE   12 random bytes  same length as plaintext  16 bytes
//! ```
//!
//! [`CellSealer::OVERHEAD`] = 32 bytes. Keys and associated data:
//!
//! ```text
//! prk         = HKDF-Extract(salt = store id (16 bytes), ikm = master key (32 bytes))   [SHA-256]
//! key(epoch)  = HKDF-Expand(prk, info = "blindfold/seal/v1" || epoch u32 LE, 32 bytes)
//! ad          = "blindfold-cell-v1" || store id (16) || cell u64 LE || version u64 LE
//!               || segment u32 LE                                            (53 bytes)
//! ct || tag   = AES-256-GCM(key(epoch), nonce, ad, plaintext)
//! ```
//!
//! The epoch is not in the associated data: it picks the key, so a changed epoch fails
//! authentication just the same. A sealer refuses epochs later than its current one.
//!
//! Random nonces are safe while one key seals far fewer than 2^32 segments (NIST SP 800-38D
//! §8.3), so the sealer moves to a fresh epoch key after a configurable number of seals
//! (default 2^31), and each gateway start passes a new epoch; see [`CellSealer`].
//!
//! # Key file
//!
//! JSON, created with mode `0600`, atomically, never over an existing file:
//!
//! ```text
//! {"format":"blindfold-key","version":1,"kind":"raw","key":"<64 hex digits>"}
//! {"format":"blindfold-key","version":1,"kind":"argon2id","m_cost_kib":65536,"t_cost":3,
//!  "p_cost":1,"salt":"<32 hex digits>","wrapped":"<120 hex digits>"}
//! ```
//!
//! `wrapped` = nonce (12) || AES-256-GCM(kek, nonce, ad = "blindfold-keywrap-v1", master key)
//! || tag (16), where kek = Argon2id v1.3 (passphrase, salt, m_cost_kib, t_cost, p_cost), 32
//! bytes.
//!
//! # Example
//!
//! ```
//! use blindfold_crypto::{CellAd, CellSealer, CryptoError, MasterKey, StoreId};
//!
//! let master = MasterKey::generate();
//! let store = StoreId::random();
//! // The epoch comes from the gateway's durable state: a new one at every start.
//! let sealer = CellSealer::new(&master, store, 1);
//!
//! let ad = CellAd { cell: 42, version: 7, segment: 0 };
//! let sealed = sealer.seal(&ad, b"hello, untrusted world")?;
//! assert_eq!(sealed.len(), 22 + CellSealer::OVERHEAD);
//! assert_eq!(sealer.open(&ad, &sealed)?, b"hello, untrusted world");
//!
//! // The store serves the previous version of cell 42 instead (a rollback): caught.
//! let stale = CellAd { version: 6, ..ad };
//! assert!(matches!(sealer.open(&stale, &sealed), Err(CryptoError::Integrity { cell: 42, .. })));
//!
//! // Zero-copy variant for hot paths.
//! let mut buf = vec![0u8; 4096 + CellSealer::OVERHEAD];
//! sealer.seal_into(&ad, &[1u8; 4096], &mut buf)?;
//! let plaintext = sealer.open_in_place(&ad, &mut buf)?;
//! assert_eq!(plaintext, &[1u8; 4096][..]);
//! # Ok::<(), CryptoError>(())
//! ```

mod channel;
mod derive;
mod digest;
mod error;
mod keyfile;
mod keys;
mod pad;
mod seal;
mod state;

pub use channel::{ChannelCipher, CHANNEL_NONCE_LEN};
pub use derive::{derive_key, DIRECTORY_KEY_LABEL};
pub use digest::{BlockDigestKey, BLOCK_DIGEST_LABEL, BLOCK_DIGEST_LEN};
pub use error::CryptoError;
pub use keyfile::{
    create_key_file, create_key_file_with, key_file_permissions_ok, load_key_file, KdfParams,
};
pub use keys::{MasterKey, Passphrase, StoreId};
pub use pad::XorPads;
pub use seal::{CellAd, CellSealer};
pub use state::StateSealer;
