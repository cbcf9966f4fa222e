//! Keys for the gateway's own files, derived from the master key.
//!
//! ```text
//! key = HKDF-Expand(HKDF-Extract(salt, ikm = master key), info = label, 32 bytes)   [SHA-256]
//! ```
//!
//! Each use names itself with its own label, so keys for different purposes are independent.
//! Labels in use:
//!
//! | label | salt | used for |
//! |---|---|---|
//! | `"blindfold directory v1"` | the directory file's random 16-byte id | AES-256-GCM pages of `meta.redb` (`blindfold-gateway`) |
//! | `"blindfold log feed v1 initiator"`, `"… responder"` | both ends' connection nonces | the standby's log feed, one key per direction ([`crate::ChannelCipher`]) |
//!
//! Not a derived key but a domain label of its own: `"blindfold balancer block digest v1"`
//! prefixes every HMAC of [`crate::BlockDigestKey`], whose key is random (see there why).

use ring::hkdf;
use zeroize::Zeroizing;

use crate::seal::HkdfLen;
use crate::MasterKey;

/// Label of the directory database's page key.
pub const DIRECTORY_KEY_LABEL: &str = "blindfold directory v1";

/// A 32-byte key for `label` (and `salt`), derived from `master` with HKDF-SHA256.
///
/// # Security
///
/// The result is secret like the master key; it is wiped on drop. Use a label of your own for
/// every purpose (and list it above), never a label of another use.
pub fn derive_key(master: &MasterKey, salt: &[u8], label: &str) -> Zeroizing<[u8; 32]> {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, salt).extract(master.expose_bytes());
    let mut key = Zeroizing::new([0u8; 32]);
    prk.expand(&[label.as_bytes()], HkdfLen(32))
        .and_then(|okm| okm.fill(&mut key[..]))
        // Only fails for outputs longer than 255 hash lengths; 32 bytes never is.
        .expect("HKDF-SHA256 can expand to 32 bytes");
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_salts_and_masters_give_independent_keys() {
        let m = MasterKey::from_bytes([7u8; 32]);
        let a = derive_key(&m, b"salt", DIRECTORY_KEY_LABEL);
        assert_eq!(*a, *derive_key(&m, b"salt", DIRECTORY_KEY_LABEL), "deterministic");
        assert_ne!(*a, *derive_key(&m, b"salt", "another use v1"));
        assert_ne!(*a, *derive_key(&m, b"other", DIRECTORY_KEY_LABEL));
        assert_ne!(
            *a,
            *derive_key(&MasterKey::from_bytes([8u8; 32]), b"salt", DIRECTORY_KEY_LABEL)
        );
    }
}
