//! The SHA-256 keystream of the outer layer, with the midstate after `k_xor || r` reused for
//! every piece.
//!
//! The keystream of piece `i` is `SHA-256(k_xor || r || u32_be(i))`: a 68-byte message, so two
//! compression-function blocks. The first block, `k_xor || r`, is the same for every piece of a
//! block; its output (the midstate) is computed once and the second block — `u32_be(i)`, the
//! `0x80` end marker, zeros and the bit length 544 — is the same for every block at piece `i`.

use sha2::block_api::compress256;
use zeroize::Zeroize;

/// SHA-256's initial hash value (FIPS 180-4 §5.3.3).
const IV: [u32; 8] = [
    0x6a09_e667,
    0xbb67_ae85,
    0x3c6e_f372,
    0xa54f_f53a,
    0x510e_527f,
    0x9b05_688c,
    0x1f83_d9ab,
    0x5be0_cd19,
];

/// Bit length of `k_xor || r || u32_be(i)`.
const MESSAGE_BITS: u64 = (32 + 32 + 4) * 8;

/// The SHA-256 state after absorbing `k_xor || r`. Secret (it stands for `k_xor`); wiped by
/// its owners.
#[derive(Clone, Zeroize)]
pub(crate) struct Midstate([u32; 8]);

impl Midstate {
    pub(crate) fn new(k_xor: &[u8; 32], r: &[u8; 32]) -> Self {
        let mut block = [0u8; 64];
        block[..32].copy_from_slice(k_xor);
        block[32..].copy_from_slice(r);
        let mut state = IV;
        compress256(&mut state, &[block]);
        block.zeroize();
        Self(state)
    }

    /// `SHA-256(k_xor || r || u32_be(i))` for the piece whose tail is `tail`.
    #[inline]
    pub(crate) fn keystream(&self, tail: &Tail) -> [u8; 32] {
        let mut state = self.0;
        compress256(&mut state, std::slice::from_ref(&tail.0));
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(state) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        out
    }
}

/// The final (padded) SHA-256 block of piece `i`'s keystream; public.
pub(crate) struct Tail([u8; 64]);

impl Tail {
    pub(crate) fn new(piece: u32) -> Self {
        let mut b = [0u8; 64];
        b[..4].copy_from_slice(&piece.to_be_bytes());
        b[4] = 0x80;
        b[56..].copy_from_slice(&MESSAGE_BITS.to_be_bytes());
        Self(b)
    }
}

/// XORs `a ^= b` over one 32-byte piece.
#[inline]
pub(crate) fn xor_piece(a: &mut [u8], b: &[u8; 32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x ^= y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn midstate_keystream_is_sha256_of_the_whole_message() {
        let k = [0x11u8; 32];
        let r: [u8; 32] = std::array::from_fn(|i| i as u8 * 7);
        let mid = Midstate::new(&k, &r);
        for i in [0u32, 1, 2, 33, 256, 0x0102_0304, u32::MAX] {
            let mut h = Sha256::new();
            h.update(k);
            h.update(r);
            h.update(i.to_be_bytes());
            let want: [u8; 32] = h.finalize().into();
            assert_eq!(mid.keystream(&Tail::new(i)), want, "piece {i}");
        }
    }

    #[test]
    fn known_answer() {
        // SHA-256(32×0x00 || 32×0x01 || 00 00 00 01), computed independently with Python's
        // hashlib.
        let mid = Midstate::new(&[0; 32], &[1; 32]);
        assert_eq!(hex::encode(mid.keystream(&Tail::new(1))), KAT);
    }
    const KAT: &str = "7688c8e264ee3ccf9da06df2f1f21f12fe4b8c6184a0c4e4ee75b0cb91a3b318";
}
