//! [`XorPads`]: deterministic keystreams ("pads") for XOR Ring ORAM's block slots.
//!
//! XOR Ring ORAM needs slot ciphertexts that the client can strip after the store XORed
//! several of them together: each slot is `plaintext XOR pad(cell, version, slot)`, and the
//! client regenerates every pad of the slots it asked for. So the pads must be a function of
//! public coordinates and a secret key, and a pad must never encrypt two different plaintexts.
//!
//! ```text
//! prk          = HKDF-Extract(salt = store id, ikm = master key)                 [SHA-256]
//! key(epoch)   = HKDF-Expand(prk, "blindfold/xorpad/v1" || epoch u32 LE, 32 bytes)
//! nonce        = cell (low 40 bits, LE) || version (low 48 bits, LE) || slot (u8)   12 bytes
//! pad          = the AES-256-CTR keystream of AES-256-GCM(key(epoch), nonce) — i.e. the
//!                ciphertext of a zero plaintext; the GCM tag is not used
//! ```
//!
//! # Security
//!
//! The keystream is AES-CTR under a key used for nothing else, so pads are pseudorandom and a
//! dummy slot (zeros XOR pad) looks exactly like a real one. Uniqueness: the caller bumps a
//! bucket's version every time it rewrites the bucket and never reuses a (cell, version) pair
//! within an epoch; [`XorPads::pad_into`] refuses coordinates outside the nonce's bit widths.
//! Reusing a pair after a rollback of the caller's trusted state would reveal the XOR of two
//! plaintexts, which is why every process should start a fresh epoch, as with
//! [`CellSealer`](crate::CellSealer). Pads give confidentiality only: a slot's ciphertext is
//! malleable, so callers authenticate what they recover by other means (XOR Ring ORAM keeps a
//! digest of each block in the sealed bucket metadata).

use std::fmt;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hkdf;

use crate::seal::HkdfLen;
use crate::{CryptoError, MasterKey, StoreId};

const PAD_INFO_PREFIX: &[u8; 19] = b"blindfold/xorpad/v1";

/// Generates the pads of XOR Ring ORAM slots; see the module docs.
pub struct XorPads {
    prk: hkdf::Prk,
    epoch: u32,
    key: LessSafeKey,
}

impl fmt::Debug for XorPads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("XorPads").field("epoch", &self.epoch).field("key", &"<redacted>").finish()
    }
}

fn pad_key(prk: &hkdf::Prk, epoch: u32) -> LessSafeKey {
    let epoch_le = epoch.to_le_bytes();
    let info = [&PAD_INFO_PREFIX[..], &epoch_le[..]];
    let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
    prk.expand(&info, HkdfLen(32))
        .and_then(|okm| okm.fill(&mut bytes[..]))
        .expect("HKDF-SHA256 can expand to 32 bytes");
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &bytes[..]).expect("32-byte key"))
}

impl XorPads {
    /// Pads for `store`, writing new slots under `epoch`.
    pub fn new(master: &MasterKey, store: StoreId, epoch: u32) -> Self {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &store.0).extract(master.expose_bytes());
        let key = pad_key(&prk, epoch);
        Self { prk, epoch, key }
    }

    /// The epoch new slots are written under.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    /// XORs the pad of `(epoch, cell, version, slot)` into `buf` (encrypting or decrypting it:
    /// the operation is its own inverse).
    ///
    /// # Errors
    ///
    /// [`CryptoError::Malformed`] if `cell` needs more than 40 bits, `version` more than 48 or
    /// `slot` more than 8, or if `buf` is longer than AES-GCM allows.
    pub fn apply(
        &self,
        epoch: u32,
        cell: u64,
        version: u64,
        slot: u32,
        buf: &mut [u8],
    ) -> Result<(), CryptoError> {
        if cell >> 40 != 0 || version >> 48 != 0 || slot > 255 {
            return Err(CryptoError::Malformed(format!(
                "pad coordinates out of range: cell {cell}, version {version}, slot {slot}"
            )));
        }
        let mut nonce = [0u8; 12];
        nonce[..5].copy_from_slice(&cell.to_le_bytes()[..5]);
        nonce[5..11].copy_from_slice(&version.to_le_bytes()[..6]);
        nonce[11] = slot as u8;
        let run = |key: &LessSafeKey, buf: &mut [u8]| {
            key.seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), buf)
                .map(drop)
                .map_err(|_| CryptoError::Malformed("buffer too long for a pad".into()))
        };
        if epoch == self.epoch {
            run(&self.key, buf)
        } else {
            run(&pad_key(&self.prk, epoch), buf)
        }
    }

    /// The pad itself, `len` bytes (for tests and for stripping many pads from one XOR).
    pub fn pad_into(
        &self,
        epoch: u32,
        cell: u64,
        version: u64,
        slot: u32,
        out: &mut [u8],
    ) -> Result<(), CryptoError> {
        out.fill(0);
        self.apply(epoch, cell, version, slot, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pads() -> XorPads {
        XorPads::new(&MasterKey::from_bytes([7; 32]), StoreId([9; 16]), 1)
    }

    #[test]
    fn apply_is_an_involution_and_pads_differ() {
        let p = pads();
        let mut buf = b"attack at dawn, bring snacks".to_vec();
        p.apply(1, 5, 2, 3, &mut buf).unwrap();
        assert_ne!(&buf[..], b"attack at dawn, bring snacks");
        p.apply(1, 5, 2, 3, &mut buf).unwrap();
        assert_eq!(&buf[..], b"attack at dawn, bring snacks");
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        p.pad_into(1, 5, 2, 3, &mut a).unwrap();
        for (e, c, v, s) in [(1, 5, 2, 4), (1, 5, 3, 3), (1, 6, 2, 3), (2, 5, 2, 3)] {
            p.pad_into(e, c, v, s, &mut b).unwrap();
            assert_ne!(a, b, "({e}, {c}, {v}, {s})");
        }
        assert!(p.apply(1, 1 << 40, 0, 0, &mut b).is_err());
        assert!(p.apply(1, 0, 1 << 48, 0, &mut b).is_err());
        assert!(p.apply(1, 0, 0, 256, &mut b).is_err());
    }

    #[test]
    fn xor_of_padded_slots_strips_to_the_xor_of_plaintexts() {
        let p = pads();
        let blocks = [[1u8; 16], [0u8; 16], [0u8; 16]];
        let mut acc = [0u8; 16];
        for (i, b) in blocks.iter().enumerate() {
            let mut c = *b;
            p.apply(1, i as u64, 1, 0, &mut c).unwrap();
            for (x, y) in acc.iter_mut().zip(c) {
                *x ^= y;
            }
        }
        for i in 0..3 {
            p.apply(1, i, 1, 0, &mut acc).unwrap();
        }
        assert_eq!(acc, [1u8; 16]);
    }
}
