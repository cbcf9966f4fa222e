//! The secret key: key generation, CRT decryption and encryption, peeling onion layers.

use std::fmt;
use std::sync::OnceLock;

use rand::{CryptoRng, RngCore};
use rug::integer::Order;
use rug::ops::RemRounding;
use rug::Integer;
use zeroize::Zeroizing;

use crate::ciphertext::Ciphertext;
use crate::error::{DjError, Result};
use crate::math;
use crate::multiexp::{self, FixedBase};
use crate::parallel::par_map;
use crate::public::{check_layer, read_field, PublicKey};
use crate::{MAX_LAYER, MAX_N_BITS, MIN_N_BITS};

const SECRET_MAGIC: &[u8; 8] = b"BFDJSK01";

/// The most memory one layer's fixed-base table may take: the window narrows to fit (at 1024
/// bits, `w = 8` up to layer 3, 7 for layers 4–5, 6 for layers 6–11; see `docs/design.md`).
const FIXED_BASE_BUDGET: usize = 4 << 20;

/// The length in bits of the random exponent `α` of fixed-base encryption for an `n_bits`-bit
/// modulus: twice the modulus' security level, and never below 256 (`docs/design.md`,
/// "Damgård–Jurik", gives the argument). Levels as NIST SP 800-57's: 128 bits up to 3072-bit
/// moduli, 192 up to 7680, 256 beyond.
pub(crate) fn short_exponent_bits(n_bits: u32) -> u32 {
    match n_bits {
        0..=3072 => 256,
        3073..=7680 => 384,
        _ => 512,
    }
}

/// One prime's half of a layer's secrets: decryption works modulo `p^(s+1)`, where the
/// ciphertext raised to `p - 1` loses its random factor and is a power of `1 + p`.
struct PrimeSide {
    /// `p^0 ..= p^(s+1)`.
    pow: Vec<Integer>,
    /// `p - 1`, the exponent that kills the random factor modulo `p^(s+1)`.
    exp: Integer,
    /// `(a · (p-1))^(-1) mod p^s`, where `1 + n = (1 + p)^a mod p^(s+1)`: turns the logarithm of
    /// `c^(p-1)` back into `m mod p^s`.
    unscale: Integer,
    /// `n^s mod (p^s (p-1))`: the blinding exponent reduced by the order of `Z*_(p^(s+1))`.
    blind_exp: Integer,
}

impl PrimeSide {
    fn new(p: &Integer, n: &Integer, n_pow_s: &Integer, s: u32) -> Self {
        let pow = math::powers(p, s + 1);
        let ps = &pow[s as usize];
        let exp = Integer::from(p - 1u32);
        let one_plus_n = Integer::from(n + 1u32) % &pow[s as usize + 1];
        let a = math::one_plus_log(&pow, s, &one_plus_n).expect("1 + n is 1 mod p");
        let unscale = (a * &exp).invert(ps).expect("a = q mod p and p - 1 are units modulo p^s");
        let order = Integer::from(ps * &exp);
        let blind_exp = Integer::from(n_pow_s % &order);
        Self { pow, exp, unscale, blind_exp }
    }

    /// `m mod p^s` from a ciphertext `c` of layer `s`.
    fn decrypt(&self, c: &Integer, s: u32) -> Integer {
        let modulus = &self.pow[s as usize + 1];
        let reduced = Integer::from(c % modulus);
        // The exponent is secret: GMP's side-channel-silent power.
        let u = reduced.secure_pow_mod(&self.exp, modulus);
        // For a unit `c`, `c^(p-1)` is 1 mod p. Every `Ciphertext` was checked to be a unit for
        // the key it was made with; one of another key may not be, and then decrypts to garbage
        // rather than panicking.
        let x = math::one_plus_log(&self.pow, s, &u).unwrap_or_default();
        (x * &self.unscale) % &self.pow[s as usize]
    }

    /// `r^(n^s) mod p^(s+1)`.
    fn blinding(&self, r: &Integer, s: u32) -> Integer {
        let modulus = &self.pow[s as usize + 1];
        Integer::from(r % modulus).secure_pow_mod(&self.blind_exp, modulus)
    }

    fn wipe(&mut self) {
        self.pow.iter_mut().for_each(math::wipe);
        math::wipe(&mut self.exp);
        math::wipe(&mut self.unscale);
        math::wipe(&mut self.blind_exp);
    }
}

/// Everything decryption and encryption of one layer `s` need, derived from `p` and `q` on
/// first use and kept.
struct LayerKey {
    p: PrimeSide,
    q: PrimeSide,
    /// `(p^s)^(-1) mod q^s`, to join `m mod p^s` and `m mod q^s`.
    crt_plain: Integer,
    /// `(p^(s+1))^(-1) mod q^(s+1)`, to join the two halves of a blinding factor.
    crt_cipher: Integer,
}

impl Drop for LayerKey {
    fn drop(&mut self) {
        self.p.wipe();
        self.q.wipe();
        math::wipe(&mut self.crt_plain);
        math::wipe(&mut self.crt_cipher);
    }
}

/// `x mod a` and `y mod b` joined into the value modulo `a · b` (`a_inv = a^(-1) mod b`).
fn crt(x: &Integer, y: &Integer, a: &Integer, b: &Integer, a_inv: &Integer) -> Integer {
    let h = (Integer::from(y - x) * a_inv).rem_euc(b);
    h * a + x
}

/// A Damgård–Jurik secret key: the primes `p` and `q` of `n = p q` (and the public key).
///
/// Key generation draws `p` and `q` as uniformly random primes of half the modulus size with
/// their two top bits set, so `n` has exactly the requested size, and retries until
/// `gcd(n, (p-1)(q-1)) = 1` (always true for primes of equal size, checked anyway). Safe primes
/// are not needed: the scheme's security rests on the decisional composite residuosity
/// assumption, which is about `n`, and safe primes would only slow key generation by two orders
/// of magnitude.
///
/// Decryption and secret-key encryption work modulo `p^(s+1)` and `q^(s+1)` separately and join
/// the halves by the Chinese remainder theorem: the exponent of decryption shrinks from about
/// `|n|` to `|p|` bits and each modulus to half the size. The secrets derived per layer are
/// computed once and kept. `Debug` shows only the size; dropping the key overwrites its numbers
/// (best effort: see the crate docs about GMP's scratch memory).
pub struct SecretKey {
    public: PublicKey,
    p: Integer,
    q: Integer,
    layers: Vec<OnceLock<LayerKey>>,
    /// `x`, the square of a uniform unit of `Z_n`, drawn by the first fixed-base encryption from
    /// its generator and kept for the key's lifetime (not part of the key's encoding).
    blind_base: OnceLock<Integer>,
    /// Per layer `s`, the fixed-base table of `h_s = x^(n^s) mod n^(s+1)`, built on first use.
    blind_tables: Vec<OnceLock<FixedBase>>,
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretKey").field("n_bits", &self.public.n_bits()).finish_non_exhaustive()
    }
}

impl Drop for SecretKey {
    fn drop(&mut self) {
        math::wipe(&mut self.p);
        math::wipe(&mut self.q);
        if let Some(x) = self.blind_base.get_mut() {
            math::wipe(x);
        }
        self.blind_tables.iter_mut().filter_map(OnceLock::get_mut).for_each(FixedBase::wipe);
    }
}

impl SecretKey {
    /// A fresh key with an `n_bits`-bit modulus (even, from `MIN_N_BITS` to `MAX_N_BITS`; 2048 is
    /// today's usual size, 1024 the reference paper's, tests use 256 or 512).
    pub fn generate<R: RngCore + CryptoRng + ?Sized>(n_bits: u32, rng: &mut R) -> Result<Self> {
        if !(MIN_N_BITS..=MAX_N_BITS).contains(&n_bits) || !n_bits.is_multiple_of(2) {
            return Err(DjError::Key("modulus size must be even and within the supported range"));
        }
        loop {
            let p = math::random_prime(rng, n_bits / 2);
            let q = math::random_prime(rng, n_bits / 2);
            if let Ok(key) = Self::from_primes(p, q) {
                return Ok(key);
            }
        }
    }

    /// The key of the primes `p` and `q`, after checking them: distinct probable primes of the
    /// same size making a modulus of a supported size with `gcd(n, (p-1)(q-1)) = 1`.
    pub fn from_primes(p: Integer, q: Integer) -> Result<Self> {
        // Sizes first, so that hostile input costs no primality test of a huge number.
        if p.significant_bits() != q.significant_bits()
            || p.significant_bits() + q.significant_bits() > MAX_N_BITS + 1
        {
            return Err(DjError::Key(
                "p and q must be of the same size, within the supported range",
            ));
        }
        let n = Integer::from(&p * &q);
        let key = Self {
            public: PublicKey::from_modulus_unchecked(n),
            p,
            q,
            layers: (0..MAX_LAYER).map(|_| OnceLock::new()).collect(),
            blind_base: OnceLock::new(),
            blind_tables: (0..MAX_LAYER).map(|_| OnceLock::new()).collect(),
        };
        key.check()?;
        Ok(key)
    }

    fn check(&self) -> Result<()> {
        let (p, q, n) = (&self.p, &self.q, self.public.n());
        if !(MIN_N_BITS..=MAX_N_BITS).contains(&n.significant_bits()) {
            return Err(DjError::Key("modulus size out of range"));
        }
        if p == q || p.significant_bits() != q.significant_bits() {
            return Err(DjError::Key("p and q must be distinct and of the same size"));
        }
        if !math::is_prime(p) || !math::is_prime(q) {
            return Err(DjError::Key("p or q is not prime"));
        }
        let phi = Integer::from(p - 1u32) * Integer::from(q - 1u32);
        if Integer::from(n.gcd_ref(&phi)) != 1 {
            return Err(DjError::Key("gcd(n, (p-1)(q-1)) is not 1"));
        }
        Ok(())
    }

    /// The associated data under which the gateway seals [`to_bytes`](Self::to_bytes) with
    /// `blindfold_crypto::StateSealer` (a file `onion-key.sealed` in the state directory): it
    /// names the kind of file, so no other sealed state can be passed off as this key.
    pub const SEAL_AAD: &'static [u8] = b"blindfold/onion-key/v1";

    /// The public half.
    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// The secret encoding, for sealing in the key file: `"BFDJSK01"`, then `p` and `q`, each as
    /// its length in bytes (u32, big-endian) and its big-endian bytes. Wiped when dropped.
    pub fn to_bytes(&self) -> Zeroizing<Vec<u8>> {
        let mut out = Zeroizing::new(Vec::new());
        out.extend_from_slice(SECRET_MAGIC);
        for x in [&self.p, &self.q] {
            let digits = Zeroizing::new(x.to_digits::<u8>(Order::Msf));
            out.extend_from_slice(&(digits.len() as u32).to_be_bytes());
            out.extend_from_slice(&digits);
        }
        out
    }

    /// Decodes and checks [`to_bytes`](Self::to_bytes)'s output (every check of
    /// [`from_primes`](Self::from_primes)); anything else is an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let mut fields = read_field(bytes, SECRET_MAGIC, 2)?;
        let q = fields.pop().expect("two fields");
        let p = fields.pop().expect("two fields");
        Self::from_primes(p, q)
    }

    fn layer_key(&self, s: u32) -> &LayerKey {
        self.layers[s as usize - 1].get_or_init(|| {
            let n = self.public.n();
            let n_pow_s = &self.public.pow[s as usize];
            let p = PrimeSide::new(&self.p, n, n_pow_s, s);
            let q = PrimeSide::new(&self.q, n, n_pow_s, s);
            let crt_plain = Integer::from(&p.pow[s as usize])
                .invert(&q.pow[s as usize])
                .expect("distinct primes");
            let crt_cipher = Integer::from(&p.pow[s as usize + 1])
                .invert(&q.pow[s as usize + 1])
                .expect("distinct primes");
            LayerKey { p, q, crt_plain, crt_cipher }
        })
    }

    /// Decrypts a ciphertext of any layer `s` to its plaintext in `[0, n^s)`.
    pub fn decrypt(&self, c: &Ciphertext) -> Integer {
        let s = c.layer;
        let key = self.layer_key(s);
        let mp = key.p.decrypt(&c.value, s);
        let mq = key.q.decrypt(&c.value, s);
        crt(&mp, &mq, &key.p.pow[s as usize], &key.q.pow[s as usize], &key.crt_plain)
    }

    /// Decrypts every ciphertext, on all cores.
    pub fn decrypt_many(&self, cs: &[Ciphertext]) -> Vec<Integer> {
        par_map(cs, |c| self.decrypt(c))
    }

    /// Removes one onion layer: decrypts a ciphertext of layer `s >= 2` and reads the plaintext
    /// as the ciphertext of layer `s - 1` it wraps. A plaintext that is not a valid inner
    /// ciphertext (not a unit) is an error: the outer one did not come from wrapping.
    pub fn peel(&self, c: &Ciphertext) -> Result<Ciphertext> {
        check_layer(c.layer, 2)?;
        let inner = self.decrypt(c);
        self.public.ciphertext_from_value(c.layer - 1, inner)
    }

    /// Removes onion layers until the ciphertext is of layer `innermost` (the layer the onion
    /// was started at, which the ciphertext itself cannot tell), then decrypts that.
    pub fn peel_all(&self, c: &Ciphertext, innermost: u32) -> Result<Integer> {
        check_layer(innermost, 1)?;
        if innermost > c.layer {
            return Err(DjError::Layer { layer: innermost, min: 1, max: c.layer });
        }
        let mut c = c.clone();
        while c.layer > innermost {
            c = self.peel(&c)?;
        }
        Ok(self.decrypt(&c))
    }

    /// [`peel_all`](Self::peel_all) of every ciphertext, on all cores, in order.
    pub fn peel_all_many(&self, cs: &[Ciphertext], innermost: u32) -> Vec<Result<Integer>> {
        par_map(cs, |c| self.peel_all(c, innermost))
    }

    /// Encrypts like [`PublicKey::encrypt`] (same distribution of ciphertexts) but computes the
    /// random factor `r^(n^s)` modulo `p^(s+1)` and `q^(s+1)` with reduced exponents: several
    /// times faster, for the key holder (the ORAM client does all the encrypting).
    pub fn encrypt<R: RngCore + CryptoRng + ?Sized>(
        &self,
        m: &Integer,
        layer: u32,
        rng: &mut R,
    ) -> Result<Ciphertext> {
        check_layer(layer, 1)?;
        let r = math::random_unit(rng, self.public.n());
        self.encrypt_with_randomness(m, layer, &r)
    }

    /// [`encrypt`](Self::encrypt) with the given randomness `r` (a unit of `Z_n`); gives exactly
    /// [`PublicKey::encrypt_with_randomness`]'s ciphertext.
    pub fn encrypt_with_randomness(
        &self,
        m: &Integer,
        layer: u32,
        r: &Integer,
    ) -> Result<Ciphertext> {
        check_layer(layer, 1)?;
        let pk = &self.public;
        pk.check_plaintext(m, layer)?;
        pk.check_randomness(r)?;
        let key = self.layer_key(layer);
        let s = layer as usize;
        let bp = key.p.blinding(r, layer);
        let bq = key.q.blinding(r, layer);
        let blind = crt(&bp, &bq, &key.p.pow[s + 1], &key.q.pow[s + 1], &key.crt_cipher);
        let g = math::one_plus_pow(&pk.pow, layer, m);
        let value = (g * blind) % &pk.pow[s + 1];
        Ok(Ciphertext { layer, value })
    }

    /// Encrypts every plaintext at layer `s`, on all cores, with the fixed-base blinding of
    /// [`encrypt_fixed_base`](Self::encrypt_fixed_base): the client's path in Onion ORAM (the
    /// selector bits, thousands per eviction, and its data), 6 (layer 1) to 110 (layer 11) times
    /// faster than [`encrypt`](Self::encrypt) at 1024 bits. The exponents are drawn from `rng`
    /// first, in order, so a seeded generator gives the same ciphertexts for the same key state.
    /// [`encrypt_many_uniform`](Self::encrypt_many_uniform) keeps the textbook randomness.
    ///
    /// # Security
    /// Semantic security rests on the decisional composite residuosity assumption plus a
    /// short-exponent assumption on `Z*_n` (`docs/design.md`, "Damgård–Jurik").
    pub fn encrypt_many<R: RngCore + CryptoRng + ?Sized>(
        &self,
        ms: &[Integer],
        layer: u32,
        rng: &mut R,
    ) -> Result<Vec<Ciphertext>> {
        check_layer(layer, 1)?;
        for m in ms {
            self.public.check_plaintext(m, layer)?;
        }
        let table = self.blind_table(layer, rng);
        let bits = short_exponent_bits(self.public.n_bits());
        let work: Vec<(&Integer, Integer)> =
            ms.iter().map(|m| (m, math::random_bits(rng, bits))).collect();
        Ok(par_map(&work, |(m, alpha)| self.encrypt_with_exponent(m, layer, table, alpha)))
    }

    /// Encrypts every plaintext at layer `s` with [`encrypt`](Self::encrypt) (uniform `r`), on all
    /// cores; the randomness is drawn from `rng` first, in order, so the ciphertexts are those of
    /// [`PublicKey::encrypt_many`] for the same generator.
    pub fn encrypt_many_uniform<R: RngCore + CryptoRng + ?Sized>(
        &self,
        ms: &[Integer],
        layer: u32,
        rng: &mut R,
    ) -> Result<Vec<Ciphertext>> {
        check_layer(layer, 1)?;
        let work: Vec<(&Integer, Integer)> =
            ms.iter().map(|m| (m, math::random_unit(rng, self.public.n()))).collect();
        par_map(&work, |(m, r)| self.encrypt_with_randomness(m, layer, r)).into_iter().collect()
    }

    /// Encrypts `m` at layer `s` as `(1+n)^m · h_s^α mod n^(s+1)`, Damgård, Jurik and Nielsen's
    /// faster variant: `h_s = x^(n^s)` for a random square `x` of `Z*_n` fixed in the key, and `α`
    /// a uniform exponent of 256 bits (more for moduli above 3072 bits). `h_s^α` comes from a
    /// table of powers of `h_s` built once per layer (at most 4 MiB): about 32–52 modular
    /// multiplications and no squaring, where [`encrypt`](Self::encrypt) raises to an exponent
    /// of `s · |n|` bits. The ciphertext is [`encrypt_with_randomness`](Self::encrypt_with_randomness)
    /// with `r = x^α mod n`, so it decrypts like any other.
    ///
    /// The first call draws `x` from `rng`; the first call at each layer builds its table (at
    /// 1024 bits, about 35 ms at layer 1 and a third of a second at layer 11). Both are kept and
    /// shared by all threads.
    ///
    /// # Security
    /// As [`encrypt_many`](Self::encrypt_many).
    pub fn encrypt_fixed_base<R: RngCore + CryptoRng + ?Sized>(
        &self,
        m: &Integer,
        layer: u32,
        rng: &mut R,
    ) -> Result<Ciphertext> {
        check_layer(layer, 1)?;
        self.public.check_plaintext(m, layer)?;
        let table = self.blind_table(layer, rng);
        let alpha = math::random_bits(rng, short_exponent_bits(self.public.n_bits()));
        Ok(self.encrypt_with_exponent(m, layer, table, &alpha))
    }

    /// `x`, drawing it on first use: the square of a uniform unit (so every `h_s^α` is a square
    /// modulo `p` and `q`, see `docs/design.md`).
    fn blind_base<R: RngCore + CryptoRng + ?Sized>(&self, rng: &mut R) -> &Integer {
        self.blind_base.get_or_init(|| {
            let n = self.public.n();
            let mut y = math::random_unit(rng, n);
            let x = Integer::from(y.square_ref()) % n;
            math::wipe(&mut y);
            x
        })
    }

    /// Layer `s`'s table of powers of `h_s = x^(n^s) mod n^(s+1)`, built on first use.
    fn blind_table<R: RngCore + CryptoRng + ?Sized>(&self, layer: u32, rng: &mut R) -> &FixedBase {
        if let Some(table) = self.blind_tables[layer as usize - 1].get() {
            return table;
        }
        let x = self.blind_base(rng);
        self.blind_tables[layer as usize - 1].get_or_init(|| {
            let modulus = &self.public.pow[layer as usize + 1];
            // h_s = x^(n^s) is the textbook blinding factor of r = x: the CRT encryption of 0.
            let h = self
                .encrypt_with_randomness(&Integer::new(), layer, x)
                .expect("x is a unit below n")
                .into_value();
            let bits = short_exponent_bits(self.public.n_bits());
            let width =
                FixedBase::width_for(bits, multiexp::entry_bytes(modulus), FIXED_BASE_BUDGET);
            FixedBase::new(&h, bits, width, modulus)
        })
    }

    /// `(1+n)^m · h_s^α mod n^(s+1)` for a checked plaintext.
    fn encrypt_with_exponent(
        &self,
        m: &Integer,
        layer: u32,
        table: &FixedBase,
        alpha: &Integer,
    ) -> Ciphertext {
        let pk = &self.public;
        let modulus = &pk.pow[layer as usize + 1];
        let blind = table.pow(alpha, modulus);
        let g = math::one_plus_pow(&pk.pow, layer, m);
        let value = (g * blind) % modulus;
        Ciphertext { layer, value }
    }

    /// Adds an onion layer with [`encrypt`](Self::encrypt): the layer-`s` ciphertext becomes the
    /// plaintext of a ciphertext of layer `s + 1`.
    pub fn wrap<R: RngCore + CryptoRng + ?Sized>(
        &self,
        inner: &Ciphertext,
        rng: &mut R,
    ) -> Result<Ciphertext> {
        check_layer(inner.layer + 1, 2)?;
        self.encrypt(&inner.value, inner.layer + 1, rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn key(bits: u32, seed: u64) -> SecretKey {
        SecretKey::generate(bits, &mut ChaCha20Rng::seed_from_u64(seed)).unwrap()
    }

    /// Known answers from the textbook path: a fixed-base ciphertext with exponent `α` is exactly
    /// `encrypt_with_randomness` with `r = x^α mod n`, the old code's ciphertext.
    #[test]
    fn fixed_base_encryption_is_textbook_encryption_with_r_a_power_of_x() {
        let sk = key(256, 41);
        let n = sk.public.n().clone();
        let x = Integer::from(0x1234_5678_9abc_u64).square() % &n;
        sk.blind_base.set(x.clone()).unwrap();
        let mut rng = ChaCha20Rng::seed_from_u64(42);
        let bits = short_exponent_bits(sk.public.n_bits());
        for layer in [1, 2, 3, 5, 8] {
            let table = sk.blind_table(layer, &mut rng);
            let top = Integer::from(sk.public.plaintext_bound(layer).unwrap() - 1u32);
            let alphas = [
                Integer::new(),
                Integer::from(1),
                (Integer::from(1) << bits) - 1u32,
                math::random_bits(&mut rng, bits),
            ];
            for m in [Integer::new(), Integer::from(1), Integer::from(77), top] {
                for alpha in &alphas {
                    let fast = sk.encrypt_with_exponent(&m, layer, table, alpha);
                    let r = x.clone().pow_mod(alpha, &n).unwrap();
                    let reference = sk.encrypt_with_randomness(&m, layer, &r).unwrap();
                    assert_eq!(fast, reference, "layer {layer}");
                    assert_eq!(sk.decrypt(&fast), m);
                }
            }
        }
    }

    #[test]
    fn the_base_is_drawn_once_and_is_a_square_unit() {
        let sk = key(256, 43);
        let mut rng = ChaCha20Rng::seed_from_u64(44);
        let a = sk.encrypt_many(&[Integer::from(1)], 2, &mut rng).unwrap();
        let x = sk.blind_base.get().unwrap().clone();
        let b = sk.encrypt_fixed_base(&Integer::from(1), 4, &mut rng).unwrap();
        assert_eq!(sk.blind_base.get().unwrap(), &x, "one x for every layer");
        assert_eq!(sk.decrypt(&a[0]), 1);
        assert_eq!(sk.decrypt(&b), 1);
        for prime in [&sk.p, &sk.q] {
            assert_eq!(x.legendre(prime), 1, "x is a square modulo p and q");
        }
    }

    /// The per-layer tables stay within the budget, and at 1024 bits the windows are those the
    /// design document lists.
    #[test]
    fn table_sizes_at_1024_bits() {
        let bits = short_exponent_bits(1024);
        assert_eq!(bits, 256);
        let widths: Vec<u32> = (1..=12u32)
            .map(|s| FixedBase::width_for(bits, (s as usize + 1) * 128, FIXED_BASE_BUDGET))
            .collect();
        assert_eq!(widths, [8, 8, 8, 7, 7, 6, 6, 6, 6, 6, 6, 5]);
        for (s, w) in (1..=12).zip(&widths) {
            assert!(FixedBase::entries(bits, *w) * (s + 1) * 128 <= FIXED_BASE_BUDGET);
        }
        // And a real table (512 bits, layer 2) takes what it says.
        let sk = key(512, 45);
        let table = sk.blind_table(2, &mut ChaCha20Rng::seed_from_u64(46));
        let entry = multiexp::entry_bytes(&sk.public.pow[3]);
        assert!(table.bytes() <= FixedBase::entries(bits, 8) * entry, "{}", table.bytes());
    }
}
