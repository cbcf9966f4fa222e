//! Keyed digests of blocks: a short tag that tells whether a block read back from somewhere
//! untrusted-for-placement (an ORAM node whose local id may since have been reused) is still the
//! block that was put there.
//!
//! ```text
//! digest = HMAC-SHA256(key, label ‖ block id (u64 LE) ‖ data)[..16]
//! ```
//!
//! The key is a random secret of its own ([`BlockDigestKey::generate`]), kept inside state
//! sealed under the master key, rather than derived from the master key: the digests must
//! stay valid across a key rotation, which re-seals the state but cannot recompute a digest
//! of a block it does not hold.

use std::fmt;

use ring::hmac;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::CryptoError;

/// Domain label hashed before every digested block, so these tags are never confused with
/// another use of HMAC under the same key bytes.
pub const BLOCK_DIGEST_LABEL: &str = "blindfold balancer block digest v1";

/// Length of a block digest in bytes.
pub const BLOCK_DIGEST_LEN: usize = 16;

/// The key of [`BlockDigestKey::digest`].
///
/// # Security
///
/// Secret like the master key: whoever holds it can make a forged block pass the check. It is
/// wiped on drop, never printed, and digests are compared in constant time.
pub struct BlockDigestKey {
    bytes: Zeroizing<[u8; 32]>,
    key: hmac::Key,
}

impl BlockDigestKey {
    /// A fresh key from the operating system's random number generator.
    pub fn generate() -> Result<Self, CryptoError> {
        let mut bytes = Zeroizing::new([0u8; 32]);
        crate::keys::fill_random(&mut bytes[..])?;
        Ok(Self::from_bytes(*bytes))
    }

    /// Wraps key bytes kept in sealed state.
    pub fn from_bytes(b: [u8; 32]) -> Self {
        let bytes = Zeroizing::new(b);
        let key = hmac::Key::new(hmac::HMAC_SHA256, &bytes[..]);
        Self { bytes, key }
    }

    /// The raw key bytes, to be kept in sealed state only.
    pub fn expose_bytes(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// The digest of logical block `block` holding `data`.
    pub fn digest(&self, block: u64, data: &[u8]) -> [u8; BLOCK_DIGEST_LEN] {
        let mut ctx = hmac::Context::with_key(&self.key);
        ctx.update(BLOCK_DIGEST_LABEL.as_bytes());
        ctx.update(&block.to_le_bytes());
        ctx.update(data);
        let tag = ctx.sign();
        let mut out = [0u8; BLOCK_DIGEST_LEN];
        out.copy_from_slice(&tag.as_ref()[..BLOCK_DIGEST_LEN]);
        out
    }

    /// Whether `data` is block `block`'s data that `expected` was made of (constant time).
    pub fn matches(&self, block: u64, data: &[u8], expected: &[u8; BLOCK_DIGEST_LEN]) -> bool {
        self.digest(block, data).ct_eq(expected).into()
    }
}

impl fmt::Debug for BlockDigestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BlockDigestKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_bind_the_key_the_block_and_the_data() {
        let k = BlockDigestKey::from_bytes([3; 32]);
        let d = k.digest(7, b"data");
        assert!(k.matches(7, b"data", &d));
        assert!(!k.matches(8, b"data", &d), "another block id");
        assert!(!k.matches(7, b"dat4", &d), "other data");
        assert!(!BlockDigestKey::from_bytes([4; 32]).matches(7, b"data", &d), "another key");
        let fresh = BlockDigestKey::generate().unwrap();
        assert_ne!(fresh.expose_bytes(), k.expose_bytes());
        assert!(!format!("{fresh:?}").contains("03"));
    }

    /// The construction the module documents (it fixes what a stored digest means): HMAC-SHA256
    /// over the label, the id and the data, cut to 16 bytes.
    #[test]
    fn digest_is_the_documented_construction() {
        let k = BlockDigestKey::from_bytes([0x11; 32]);
        let tag = hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, &[0x11; 32]),
            &[BLOCK_DIGEST_LABEL.as_bytes(), &5u64.to_le_bytes(), b"abc"].concat(),
        );
        assert_eq!(k.digest(5, b"abc")[..], tag.as_ref()[..16]);
    }
}
