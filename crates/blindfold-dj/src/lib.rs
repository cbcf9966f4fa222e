//! Damgård–Jurik additively homomorphic public-key encryption, with onion layers: the
//! cryptosystem under blindfold's Onion ORAM.
//!
//! With `n = p q`, a ciphertext of *layer* `s` is `c = (1+n)^m · r^(n^s) mod n^(s+1)`: a unit
//! of `Z_(n^(s+1))` that hides a plaintext `m` of `Z_(n^s)` (`s = 1` is Paillier's scheme).
//! Multiplying ciphertexts adds plaintexts, raising one to a power `k` multiplies its plaintext by
//! `k`, and so a server holding an encrypted unit vector can select one of several values
//! without learning which ([`PublicKey::select`]). Since a layer-`s` ciphertext is below
//! `n^(s+1)`, it is a plaintext of layer `s + 1`: encrypting it again adds an onion layer
//! ([`PublicKey::wrap`]), decrypting removes one ([`SecretKey::peel`]).
//!
//! Design in a few lines (figures and the choice of GMP in `docs/design.md`):
//! - big integers are GMP's, through `rug`; `(1+n)^m` is a short binomial sum, never a power;
//! - the key holder decrypts and encrypts modulo `p^(s+1)` and `q^(s+1)` and joins by CRT, with
//!   the decryption exponent `p - 1` (Damgård–Jurik's digit-by-digit logarithm, base `1 + p`);
//! - the client's batch encryption ([`SecretKey::encrypt_many`], what Onion ORAM calls for its
//!   selectors) uses Damgård–Jurik–Nielsen's fixed base: `(1+n)^m · h_s^α` with a 256-bit `α`
//!   and a per-layer table of powers of `h_s`, tens of multiplications instead of a power;
//! - the server's select `Π c_i^(v_i)` is one Straus multi-exponentiation (shared squarings), and
//!   `select_blocks` reuses each base's window table across the chunk columns;
//! - batches (`encrypt_many`, `decrypt_many`, `select_blocks`) spread over all cores;
//! - every value from outside is checked: keys, ciphertext lengths, ranges and invertibility.
//!
//! # Security
//! Semantic security rests on the decisional composite residuosity assumption for `n`; use at
//! least 2048-bit moduli for new data (the reference paper measured 1024 bits). The fixed-base
//! encryption of [`SecretKey::encrypt_many`] adds a short-exponent assumption (stated in
//! `docs/design.md`); [`SecretKey::encrypt`], [`SecretKey::encrypt_many_uniform`] and public-key
//! encryption draw `r` uniformly and need DCR alone. Encryption is
//! randomized; reusing randomness through `encrypt_with_randomness` links ciphertexts. Timing:
//! decryption uses GMP's side-channel-silent power for its secret exponent, but the rest of GMP
//! is variable-time, and so is the fixed-base encryption's table lookup (indexed by the digits of
//! the secret exponent `α`), and side channels on the gateway host are out of scope (SECURITY.md).
//! Secret numbers are overwritten when a [`SecretKey`] is dropped; copies GMP leaves in its
//! scratch memory while computing are not, which the safe `rug` API cannot reach.
//!
//! ```
//! use blindfold_dj::{Integer, SecretKey};
//! use rand::SeedableRng;
//!
//! let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
//! let sk = SecretKey::generate(256, &mut rng).unwrap();
//! let pk = sk.public();
//! let a = pk.encrypt(&Integer::from(20), 1, &mut rng).unwrap();
//! let b = pk.encrypt(&Integer::from(22), 1, &mut rng).unwrap();
//! assert_eq!(sk.decrypt(&pk.add(&a, &b).unwrap()), 42);
//! // An onion: the ciphertext `a` becomes the plaintext of a layer-2 ciphertext.
//! let outer = pk.wrap(&a, &mut rng).unwrap();
//! assert_eq!(sk.peel(&outer).unwrap(), a);
//! ```

mod ciphertext;
mod error;
mod math;
mod multiexp;
mod parallel;
mod public;
mod secret;

pub use ciphertext::Ciphertext;
pub use error::{DjError, Result};
pub use public::PublicKey;
/// The big-integer type of plaintexts (GMP's, through `rug`).
pub use rug::Integer;
pub use secret::SecretKey;

/// The deepest layer supported: plaintexts up to `Z_(n^32)`. Onion ORAM adds one layer per tree
/// level a block descends, so this covers trees of about 30 levels.
pub const MAX_LAYER: u32 = 32;
/// The smallest modulus accepted, in bits (for tests; real keys should have 2048).
pub const MIN_N_BITS: u32 = 256;
/// The largest modulus accepted, in bits; also bounds what a decoder allocates.
pub const MAX_N_BITS: u32 = 8192;
