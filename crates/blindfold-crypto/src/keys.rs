//! Secret and public key-related types: [`StoreId`], [`MasterKey`], [`Passphrase`].

use std::fmt;
use std::str::FromStr;

use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::CryptoError;

/// Fills `buf` from the operating system's CSPRNG.
pub(crate) fn fill_random(buf: &mut [u8]) -> Result<(), CryptoError> {
    SystemRandom::new().fill(buf).map_err(|_| CryptoError::Rng)
}

/// 16 random public bytes naming one store.
///
/// The id is bound into every cell's associated data and is the HKDF salt of every sealing
/// key, so a cell copied from one store into another fails authentication.
///
/// It is not secret: it may be printed, logged and stored in plain text.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct StoreId(pub [u8; 16]);

impl StoreId {
    /// A fresh id from the operating system's random number generator.
    ///
    /// # Panics
    ///
    /// If the operating system's random number generator fails (see [`StoreId::try_random`]).
    pub fn random() -> Self {
        Self::try_random().expect("the system random number generator failed")
    }

    /// A fresh id from the operating system's random number generator, or
    /// [`CryptoError::Rng`] if it fails.
    pub fn try_random() -> Result<Self, CryptoError> {
        let mut id = [0u8; 16];
        fill_random(&mut id)?;
        Ok(Self(id))
    }

    /// An id drawn from `rng`, for reproducible tests and simulations with a seeded generator.
    pub fn from_rng<R: rand::RngCore + rand::CryptoRng>(rng: &mut R) -> Self {
        let mut id = [0u8; 16];
        rng.fill_bytes(&mut id);
        Self(id)
    }

    /// The id as 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses exactly 32 hex digits (either case).
    ///
    /// # Errors
    ///
    /// [`CryptoError::Malformed`] if `s` is not 32 hex digits.
    pub fn from_hex(s: &str) -> Result<Self, CryptoError> {
        let mut id = [0u8; 16];
        hex::decode_to_slice(s, &mut id)
            .map_err(|e| CryptoError::Malformed(format!("store id must be 32 hex digits: {e}")))?;
        Ok(Self(id))
    }
}

impl fmt::Display for StoreId {
    /// Writes the id as 32 lowercase hex digits, like [`StoreId::to_hex`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl FromStr for StoreId {
    type Err = CryptoError;

    /// Same as [`StoreId::from_hex`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_hex(s)
    }
}

/// The 32-byte master secret of one store; every sealing key is derived from it.
///
/// # Security
///
/// - The bytes are wiped when the value is dropped.
/// - `Debug` prints `MasterKey(<redacted>)`; there is no `Display` and no `Serialize`. The only
///   ways to persist a key are [`create_key_file`](crate::create_key_file) and
///   [`expose_bytes`](MasterKey::expose_bytes).
/// - `==` compares in constant time.
/// - The type is deliberately not `Clone`: pass `&MasterKey` around.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct MasterKey([u8; 32]);

impl MasterKey {
    /// The length of a master key in bytes.
    pub const LEN: usize = 32;

    /// A fresh key from the operating system's random number generator.
    ///
    /// # Panics
    ///
    /// If the operating system's random number generator fails (see
    /// [`MasterKey::try_generate`]).
    pub fn generate() -> Self {
        Self::try_generate().expect("the system random number generator failed")
    }

    /// A fresh key from the operating system's random number generator, or
    /// [`CryptoError::Rng`] if it fails.
    pub fn try_generate() -> Result<Self, CryptoError> {
        let mut key = Self([0u8; 32]);
        fill_random(&mut key.0)?;
        Ok(key)
    }

    /// Wraps existing key bytes.
    ///
    /// # Security
    ///
    /// `b` is moved in, but the caller's own copies (e.g. a buffer it was read into) are not
    /// wiped by this crate; wipe them with [`zeroize`].
    pub fn from_bytes(b: [u8; 32]) -> Self {
        Self(b)
    }

    /// The raw key bytes.
    ///
    /// # Security
    ///
    /// Anyone holding these bytes can read and forge every cell of the store. Do not log,
    /// print or copy them; wipe any copy you make.
    pub fn expose_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(<redacted>)")
    }
}

impl PartialEq for MasterKey {
    /// Constant-time comparison.
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl Eq for MasterKey {}

/// A passphrase that protects a key file.
///
/// # Security
///
/// The text is wiped when the value is dropped and `Debug` prints `Passphrase(<redacted>)`.
/// The `String` handed to [`Passphrase::new`] is moved in, so no copy stays behind, but earlier
/// copies (e.g. reallocations while it was read) are out of this type's reach.
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct Passphrase(String);

impl Passphrase {
    /// Takes ownership of `s`.
    pub fn new(s: String) -> Self {
        Self(s)
    }

    /// Whether the passphrase is the empty string (which [`create_key_file`](crate::create_key_file)
    /// refuses).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The passphrase bytes, for the KDF.
    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl From<String> for Passphrase {
    fn from(s: String) -> Self {
        Self::new(s)
    }
}

impl fmt::Debug for Passphrase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Passphrase(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_id_hex_round_trip() {
        let id = StoreId(*b"0123456789abcdef");
        assert_eq!(id.to_hex(), "30313233343536373839616263646566");
        assert_eq!(StoreId::from_hex(&id.to_hex()).unwrap(), id);
        assert_eq!(StoreId::from_hex("30313233343536373839616263646566").unwrap(), id);
        assert_eq!(id.to_string(), id.to_hex());
        assert_eq!(id.to_hex().parse::<StoreId>().unwrap(), id);
    }

    #[test]
    fn store_id_from_hex_rejects_bad_input() {
        for bad in ["", "00", &"0".repeat(31), &"0".repeat(33), &"zz".repeat(16)] {
            assert!(
                matches!(StoreId::from_hex(bad), Err(CryptoError::Malformed(_))),
                "{bad:?} was accepted"
            );
        }
    }

    #[test]
    fn random_store_ids_differ() {
        assert_ne!(StoreId::random(), StoreId::random());
    }

    #[test]
    fn store_id_from_seeded_rng_is_reproducible() {
        use rand::SeedableRng;
        let a = StoreId::from_rng(&mut rand::rngs::StdRng::seed_from_u64(7));
        let b = StoreId::from_rng(&mut rand::rngs::StdRng::seed_from_u64(7));
        let c = StoreId::from_rng(&mut rand::rngs::StdRng::seed_from_u64(8));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn master_key_equality() {
        let a = MasterKey::from_bytes([7; 32]);
        let b = MasterKey::from_bytes([7; 32]);
        let mut other = [7; 32];
        other[31] = 8;
        let c = MasterKey::from_bytes(other);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(MasterKey::generate(), MasterKey::generate());
    }

    #[test]
    fn master_key_debug_is_redacted() {
        let key = MasterKey::from_bytes([0xab; 32]);
        let shown = format!("{key:?} {key:#?}");
        assert!(!shown.contains("ab"), "{shown}");
        assert!(!shown.contains("171"), "{shown}"); // 0xab in decimal
        assert_eq!(format!("{key:?}"), "MasterKey(<redacted>)");
    }

    #[test]
    fn passphrase_debug_is_redacted() {
        let p = Passphrase::new("hunter2-swordfish".to_owned());
        let shown = format!("{p:?} {p:#?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(format!("{p:?}"), "Passphrase(<redacted>)");
        assert!(!p.is_empty());
        assert!(Passphrase::new(String::new()).is_empty());
    }
}
