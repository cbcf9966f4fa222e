//! The public key: encryption, onion wrapping and the homomorphic operations a server performs.

use std::fmt;

use rand::{CryptoRng, RngCore};
use rug::integer::Order;
use rug::Integer;

use crate::ciphertext::Ciphertext;
use crate::error::{DjError, Result};
use crate::math;
use crate::multiexp::{self, OddPowers};
use crate::parallel::par_map;
use crate::{MAX_LAYER, MAX_N_BITS, MIN_N_BITS};

const PUBLIC_MAGIC: &[u8; 8] = b"BFDJPK01";

/// The most memory the select's tables of odd powers may take, over all bases (each base's window
/// narrows to fit its share): 32 MiB.
const SELECT_TABLE_BUDGET: usize = 32 << 20;

/// A Damgård–Jurik public key: the modulus `n` and its powers `n^0 ..= n^(MAX_LAYER + 1)`,
/// computed once so that every layer's moduli are at hand.
#[derive(Clone, PartialEq, Eq)]
pub struct PublicKey {
    pub(crate) pow: Vec<Integer>,
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublicKey").field("n_bits", &self.n().significant_bits()).finish()
    }
}

/// The product of the primes up to `MAX_LAYER + 1`: `n` must be prime to it so that every
/// `k!` with `k <= MAX_LAYER` is invertible modulo powers of `n`.
fn small_primorial() -> Integer {
    let mut acc = Integer::from(1);
    for k in 2..=MAX_LAYER + 1 {
        if (2..k).all(|d| k % d != 0) {
            acc *= k;
        }
    }
    acc
}

pub(crate) fn check_layer(layer: u32, min: u32) -> Result<()> {
    if layer < min || layer > MAX_LAYER {
        return Err(DjError::Layer { layer, min, max: MAX_LAYER });
    }
    Ok(())
}

impl PublicKey {
    /// The public key of modulus `n`, after checking that `n` can be one: odd, composite, of a
    /// supported size, and free of prime factors up to `MAX_LAYER + 1`. (Whether `n` really is
    /// a product of two large primes cannot be checked without the factors.)
    pub fn from_modulus(n: Integer) -> Result<Self> {
        let bits = n.significant_bits();
        if !(MIN_N_BITS..=MAX_N_BITS).contains(&bits) {
            return Err(DjError::Key("modulus size out of range"));
        }
        if n.is_even() {
            return Err(DjError::Key("modulus is even"));
        }
        if Integer::from(n.gcd_ref(&small_primorial())) != 1 {
            return Err(DjError::Key("modulus has a small prime factor"));
        }
        if math::is_prime(&n) || n.is_perfect_square() {
            return Err(DjError::Key("modulus is not a product of two distinct primes"));
        }
        Ok(Self::from_modulus_unchecked(n))
    }

    pub(crate) fn from_modulus_unchecked(n: Integer) -> Self {
        Self { pow: math::powers(&n, MAX_LAYER + 1) }
    }

    /// The modulus `n`.
    pub fn n(&self) -> &Integer {
        &self.pow[1]
    }

    /// The size of `n` in bits.
    pub fn n_bits(&self) -> u32 {
        self.n().significant_bits()
    }

    /// `n^s`: the plaintext space of layer `s` is `[0, n^s)`.
    pub fn plaintext_bound(&self, layer: u32) -> Result<&Integer> {
        check_layer(layer, 1)?;
        Ok(&self.pow[layer as usize])
    }

    /// `n^(s+1)`: the modulus of layer `s`'s ciphertexts.
    pub fn ciphertext_modulus(&self, layer: u32) -> Result<&Integer> {
        check_layer(layer, 1)?;
        Ok(&self.pow[layer as usize + 1])
    }

    /// The length in bytes of an encoded ciphertext of layer `s`.
    pub fn ciphertext_len(&self, layer: u32) -> Result<usize> {
        Ok(math::byte_len(self.ciphertext_modulus(layer)?))
    }

    /// How many bytes of data always fit in one plaintext of layer `s`: any byte string of this
    /// length, read as a big-endian number, is below `n^s`.
    pub fn plaintext_chunk_len(&self, layer: u32) -> Result<usize> {
        let bound = self.plaintext_bound(layer)?;
        Ok(((bound.significant_bits() - 1) / 8) as usize)
    }

    /// The encoding: `"BFDJPK01"`, the length of `n` in bytes (u32, big-endian), `n` big-endian.
    pub fn to_bytes(&self) -> Vec<u8> {
        let n = self.n().to_digits::<u8>(Order::Msf);
        let mut out = Vec::with_capacity(12 + n.len());
        out.extend_from_slice(PUBLIC_MAGIC);
        out.extend_from_slice(&(n.len() as u32).to_be_bytes());
        out.extend_from_slice(&n);
        out
    }

    /// Decodes and checks [`to_bytes`](Self::to_bytes)'s output; anything else is an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let n = read_field(bytes, PUBLIC_MAGIC, 1)?.remove(0);
        Self::from_modulus(n)
    }

    /// Reads big-endian bytes as a plaintext of layer `s`, refusing a value not below `n^s`
    /// (any [`plaintext_chunk_len`](Self::plaintext_chunk_len) bytes, or the encoding of a
    /// layer-`(s-1)` ciphertext, always fits).
    pub fn plaintext_from_bytes(&self, layer: u32, bytes: &[u8]) -> Result<Integer> {
        check_layer(layer, 1)?;
        if bytes.len() > math::byte_len(&self.pow[layer as usize]) {
            return Err(DjError::PlaintextRange { layer });
        }
        let m = Integer::from_digits(bytes, Order::Msf);
        self.check_plaintext(&m, layer)?;
        Ok(m)
    }

    /// Writes a plaintext as exactly `len` big-endian bytes, the inverse of
    /// [`plaintext_from_bytes`](Self::plaintext_from_bytes) for data chunks; a negative value or
    /// one that needs more than `len` bytes is refused.
    pub fn plaintext_to_bytes(&self, m: &Integer, len: usize) -> Result<Vec<u8>> {
        if *m < 0 || m.significant_bits() as usize > len * 8 {
            return Err(DjError::Shape {
                what: "plaintext against its byte length",
                left: m.significant_bits() as usize,
                right: len * 8,
            });
        }
        let digits = m.to_digits::<u8>(Order::Msf);
        let mut out = vec![0u8; len - digits.len()];
        out.extend_from_slice(&digits);
        Ok(out)
    }

    pub(crate) fn check_plaintext(&self, m: &Integer, layer: u32) -> Result<()> {
        if *m < 0 || *m >= self.pow[layer as usize] {
            return Err(DjError::PlaintextRange { layer });
        }
        Ok(())
    }

    /// Refuses encryption randomness that is not a unit of `Z_n`.
    pub(crate) fn check_randomness(&self, r: &Integer) -> Result<()> {
        if *r <= 0 || r >= self.n() || Integer::from(r.gcd_ref(self.n())) != 1 {
            return Err(DjError::Key("randomness is not a unit of Z_n"));
        }
        Ok(())
    }

    /// `r^(n^s) mod n^(s+1)`, the random factor of a layer-`s` ciphertext.
    fn blinding(&self, r: &Integer, layer: u32) -> Integer {
        let modulus = &self.pow[layer as usize + 1];
        r.pow_mod_ref(&self.pow[layer as usize], modulus)
            .map(Integer::from)
            .expect("the exponent is positive")
    }

    /// Encrypts `m` (in `[0, n^s)`) at layer `s`: `(1+n)^m · r^(n^s) mod n^(s+1)` with `r`
    /// uniform among the units of `Z_n`. The first factor is a short binomial sum, not a power.
    pub fn encrypt<R: RngCore + CryptoRng + ?Sized>(
        &self,
        m: &Integer,
        layer: u32,
        rng: &mut R,
    ) -> Result<Ciphertext> {
        check_layer(layer, 1)?;
        let r = math::random_unit(rng, self.n());
        self.encrypt_with_randomness(m, layer, &r)
    }

    /// Encrypts `m` at layer `s` with the given randomness `r`, a unit of `Z_n`. For known-answer
    /// tests and for callers that draw `r` themselves: reusing an `r` links the ciphertexts.
    pub fn encrypt_with_randomness(
        &self,
        m: &Integer,
        layer: u32,
        r: &Integer,
    ) -> Result<Ciphertext> {
        check_layer(layer, 1)?;
        self.check_plaintext(m, layer)?;
        self.check_randomness(r)?;
        let g = math::one_plus_pow(&self.pow, layer, m);
        let value = (g * self.blinding(r, layer)) % &self.pow[layer as usize + 1];
        Ok(Ciphertext { layer, value })
    }

    /// Encrypts every plaintext at layer `s`, on all cores. The randomness is drawn from `rng`
    /// first, in order, so a seeded generator gives the same ciphertexts on any machine.
    pub fn encrypt_many<R: RngCore + CryptoRng + ?Sized>(
        &self,
        ms: &[Integer],
        layer: u32,
        rng: &mut R,
    ) -> Result<Vec<Ciphertext>> {
        check_layer(layer, 1)?;
        for m in ms {
            self.check_plaintext(m, layer)?;
        }
        let work: Vec<(&Integer, Integer)> =
            ms.iter().map(|m| (m, math::random_unit(rng, self.n()))).collect();
        par_map(&work, |(m, r)| self.encrypt_with_randomness(m, layer, r)).into_iter().collect()
    }

    /// Adds an onion layer: encrypts the layer-`s` ciphertext, as a plaintext of layer `s + 1`,
    /// giving a ciphertext of layer `s + 1`.
    pub fn wrap<R: RngCore + CryptoRng + ?Sized>(
        &self,
        inner: &Ciphertext,
        rng: &mut R,
    ) -> Result<Ciphertext> {
        check_layer(inner.layer + 1, 2)?;
        self.encrypt(&inner.value, inner.layer + 1, rng)
    }

    /// Reads a ciphertext of layer `s` from exactly [`ciphertext_len`](Self::ciphertext_len)
    /// big-endian bytes, refusing values that are not below `n^(s+1)` or not units (a non-unit
    /// is never produced by encryption, and would reveal a factor of `n`).
    pub fn ciphertext_from_bytes(&self, layer: u32, bytes: &[u8]) -> Result<Ciphertext> {
        let expected = self.ciphertext_len(layer)?;
        if bytes.len() != expected {
            return Err(DjError::Length { what: "ciphertext", expected, got: bytes.len() });
        }
        self.ciphertext_from_value(layer, Integer::from_digits(bytes, Order::Msf))
    }

    /// Takes a number as a ciphertext of layer `s`, with the checks of
    /// [`ciphertext_from_bytes`](Self::ciphertext_from_bytes).
    pub fn ciphertext_from_value(&self, layer: u32, value: Integer) -> Result<Ciphertext> {
        check_layer(layer, 1)?;
        if value >= self.pow[layer as usize + 1] || value < 0 {
            return Err(DjError::Ciphertext { layer, reason: "value is not below n^(s+1)" });
        }
        if Integer::from(value.gcd_ref(self.n())) != 1 {
            return Err(DjError::Ciphertext { layer, reason: "value is not a unit modulo n" });
        }
        Ok(Ciphertext { layer, value })
    }

    /// The fixed-width encoding of a ciphertext: [`ciphertext_len`](Self::ciphertext_len)
    /// big-endian bytes.
    pub fn ciphertext_to_bytes(&self, c: &Ciphertext) -> Vec<u8> {
        math::to_fixed_bytes(&c.value, math::byte_len(&self.pow[c.layer as usize + 1]))
    }

    fn same_layer(a: &Ciphertext, b: &Ciphertext) -> Result<u32> {
        if a.layer != b.layer {
            return Err(DjError::LayerMismatch { left: a.layer, right: b.layer });
        }
        Ok(a.layer)
    }

    /// Homomorphic addition: a ciphertext of `a + b mod n^s`.
    pub fn add(&self, a: &Ciphertext, b: &Ciphertext) -> Result<Ciphertext> {
        let layer = Self::same_layer(a, b)?;
        let value = Integer::from(&a.value * &b.value) % &self.pow[layer as usize + 1];
        Ok(Ciphertext { layer, value })
    }

    /// Homomorphic subtraction: a ciphertext of `a - b mod n^s`.
    pub fn sub(&self, a: &Ciphertext, b: &Ciphertext) -> Result<Ciphertext> {
        let layer = Self::same_layer(a, b)?;
        let modulus = &self.pow[layer as usize + 1];
        let inverse = b
            .value
            .invert_ref(modulus)
            .map(Integer::from)
            .ok_or(DjError::Ciphertext { layer, reason: "value is not a unit modulo n" })?;
        let value = (inverse * &a.value) % modulus;
        Ok(Ciphertext { layer, value })
    }

    /// Adds a known plaintext `m` (in `[0, n^s)`) to the encrypted one.
    pub fn add_plain(&self, a: &Ciphertext, m: &Integer) -> Result<Ciphertext> {
        self.check_plaintext(m, a.layer)?;
        let g = math::one_plus_pow(&self.pow, a.layer, m);
        let value = (g * &a.value) % &self.pow[a.layer as usize + 1];
        Ok(Ciphertext { layer: a.layer, value })
    }

    /// Homomorphic scalar multiplication: a ciphertext of `k · a mod n^s`, for `k` in `[0, n^s)`.
    pub fn mul_scalar(&self, a: &Ciphertext, k: &Integer) -> Result<Ciphertext> {
        self.check_plaintext(k, a.layer)?;
        let value = a
            .value
            .pow_mod_ref(k, &self.pow[a.layer as usize + 1])
            .map(Integer::from)
            .expect("the exponent is non-negative");
        Ok(Ciphertext { layer: a.layer, value })
    }

    /// A fresh-looking ciphertext of the same plaintext (multiplies in a new `r^(n^s)`).
    pub fn rerandomize<R: RngCore + CryptoRng + ?Sized>(
        &self,
        a: &Ciphertext,
        rng: &mut R,
    ) -> Ciphertext {
        let r = math::random_unit(rng, self.n());
        let value = (self.blinding(&r, a.layer) * &a.value) % &self.pow[a.layer as usize + 1];
        Ciphertext { layer: a.layer, value }
    }

    /// Homomorphic select, the server's step in Onion ORAM: `Π selector_i ^ values_i mod
    /// n^(s+1)`, which encrypts `Σ b_i · values_i mod n^s` when `selector_i` encrypts `b_i`. With
    /// a selector that encrypts a unit vector it encrypts exactly one of `values`, and the
    /// server cannot tell which. Every `values_i` must lie in `[0, n^s)`; it is typically a
    /// ciphertext of layer `s - 1` (that is how each select adds an onion layer).
    ///
    /// Computed by Straus's simultaneous exponentiation: the squarings are shared by all the
    /// terms (about `|v|` in all instead of `|v|` per term) and a zero `values_i` costs nothing.
    /// The result is the same integer as the product of separate powers.
    pub fn select(&self, selector: &[Ciphertext], values: &[Integer]) -> Result<Ciphertext> {
        if selector.len() != values.len() || selector.is_empty() {
            return Err(DjError::Shape {
                what: "selector against values",
                left: selector.len(),
                right: values.len(),
            });
        }
        let layer = selector[0].layer;
        self.check_select_column(selector, |i| &values[i])?;
        let modulus = &self.pow[layer as usize + 1];
        let entry = multiexp::entry_bytes(modulus);
        let tables: Vec<Option<OddPowers>> = selector
            .iter()
            .zip(values)
            .map(|(c, v)| {
                (*v != 0).then(|| {
                    let width =
                        OddPowers::width_for(v.significant_bits(), 1, entry, SELECT_TABLE_BUDGET);
                    OddPowers::new(&c.value, width, modulus)
                })
            })
            .collect();
        let terms: Vec<(Option<&OddPowers>, &Integer)> =
            tables.iter().map(Option::as_ref).zip(values).collect();
        Ok(Ciphertext { layer, value: multiexp::multi_pow(&terms, modulus) })
    }

    /// The checks of [`select`](Self::select), in its order: for each term, the selector's layer
    /// and then the value's range.
    fn check_select_column<'a>(
        &self,
        selector: &[Ciphertext],
        value: impl Fn(usize) -> &'a Integer,
    ) -> Result<()> {
        let layer = selector[0].layer;
        for (i, c) in selector.iter().enumerate() {
            Self::same_layer(&selector[0], c)?;
            self.check_plaintext(value(i), layer)?;
        }
        Ok(())
    }

    /// [`select`](Self::select) over whole blocks, chunk by chunk: `blocks[i][j]` is chunk `j` of
    /// block `i`, all blocks have as many chunks, and the result's chunk `j` selects among the
    /// blocks' chunks `j`. Each selector ciphertext's table of odd powers is built once (on all
    /// cores) and serves every chunk column; the columns are then computed on all cores. Errors
    /// are those `select` would give for the first failing column.
    pub fn select_blocks(
        &self,
        selector: &[Ciphertext],
        blocks: &[Vec<Integer>],
    ) -> Result<Vec<Ciphertext>> {
        if selector.len() != blocks.len() || blocks.is_empty() {
            return Err(DjError::Shape {
                what: "selector against blocks",
                left: selector.len(),
                right: blocks.len(),
            });
        }
        let chunks = blocks[0].len();
        if let Some(bad) = blocks.iter().find(|b| b.len() != chunks) {
            return Err(DjError::Shape {
                what: "chunks per block",
                left: chunks,
                right: bad.len(),
            });
        }
        (0..chunks).try_for_each(|j| self.check_select_column(selector, |i| &blocks[i][j]))?;
        let layer = selector[0].layer;
        let modulus = &self.pow[layer as usize + 1];
        let entry = multiexp::entry_bytes(modulus);
        let budget = SELECT_TABLE_BUDGET / selector.len();
        let bases: Vec<usize> = (0..selector.len()).collect();
        // A base whose every value is zero gets no table: it costs nothing.
        let tables: Vec<Option<OddPowers>> = par_map(&bases, |&i| {
            let bits = blocks[i].iter().map(Integer::significant_bits).max().unwrap_or(0);
            (bits > 0).then(|| {
                let width = OddPowers::width_for(bits, chunks, entry, budget);
                OddPowers::new(&selector[i].value, width, modulus)
            })
        });
        let columns: Vec<usize> = (0..chunks).collect();
        Ok(par_map(&columns, |&j| {
            let terms: Vec<(Option<&OddPowers>, &Integer)> =
                tables.iter().map(Option::as_ref).zip(blocks.iter().map(|b| &b[j])).collect();
            Ciphertext { layer, value: multiexp::multi_pow(&terms, modulus) }
        }))
    }
}

/// Reads `magic`, then `count` length-prefixed (u32, big-endian) big-endian numbers, and checks
/// that nothing follows. Every length is checked against what remains before anything is
/// allocated, and numbers must be minimal (no leading zero byte).
pub(crate) fn read_field(bytes: &[u8], magic: &[u8; 8], count: usize) -> Result<Vec<Integer>> {
    let max_len = MAX_N_BITS.div_ceil(8) as usize;
    let rest =
        bytes.strip_prefix(magic.as_slice()).ok_or(DjError::Key("wrong magic or version"))?;
    let mut rest = rest;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, tail) = rest.split_first_chunk::<4>().ok_or(DjError::Key("truncated length"))?;
        let len = u32::from_be_bytes(*len) as usize;
        if len == 0 || len > max_len || len > tail.len() {
            return Err(DjError::Key("field length out of range"));
        }
        let (field, tail) = tail.split_at(len);
        if field[0] == 0 {
            return Err(DjError::Key("number with a leading zero byte"));
        }
        out.push(Integer::from_digits(field, Order::Msf));
        rest = tail;
    }
    if !rest.is_empty() {
        return Err(DjError::Key("trailing bytes"));
    }
    Ok(out)
}
