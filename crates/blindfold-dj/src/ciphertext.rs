//! Ciphertexts and their fixed-width encoding.

use std::fmt;

use rug::Integer;

/// A Damgård–Jurik ciphertext of layer `s`: a unit of `Z_(n^(s+1))` that encrypts a plaintext of
/// `Z_(n^s)`.
///
/// A ciphertext of layer `s` is, as a number below `n^(s+1)`, also a valid plaintext of layer
/// `s + 1`: that is how onion layers nest ([`PublicKey::wrap`](crate::PublicKey::wrap),
/// [`SecretKey::peel`](crate::SecretKey::peel)). Values of this type come only from this crate's
/// operations or from [`PublicKey::ciphertext_from_bytes`](crate::PublicKey::ciphertext_from_bytes),
/// which checks range and invertibility, so every one is well formed for the key it was made
/// with. Using it with another key gives garbage, never a panic.
#[derive(Clone, PartialEq, Eq)]
pub struct Ciphertext {
    pub(crate) layer: u32,
    pub(crate) value: Integer,
}

impl Ciphertext {
    /// The layer `s`: the plaintext space is `Z_(n^s)`, the ciphertext space `Z_(n^(s+1))`.
    pub fn layer(&self) -> u32 {
        self.layer
    }

    /// The ciphertext as a number below `n^(s+1)`.
    pub fn value(&self) -> &Integer {
        &self.value
    }

    /// The ciphertext as a number, consuming it.
    pub fn into_value(self) -> Integer {
        self.value
    }
}

impl fmt::Debug for Ciphertext {
    // The number itself is thousands of digits and says nothing useful in a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ciphertext")
            .field("layer", &self.layer)
            .field("bits", &self.value.significant_bits())
            .finish()
    }
}
