//! Number theory behind the scheme: sampling, primes, powers of `1 + b` and their logarithm,
//! fixed-width byte codecs, and a best-effort wipe of secret integers.

use rand::{CryptoRng, RngCore};
use rug::integer::{IsPrime, Order};
use rug::ops::RemRounding;
use rug::{Assign, Integer};

/// Miller–Rabin rounds on top of GMP's own checks (trial division and BPSW): the chance that a
/// composite passes is below 2^-64 for random candidates.
const PRIME_REPS: u32 = 32;

/// A uniform integer in `[0, bound)`, by rejection of `bits(bound)`-bit samples (each accepted with
/// probability above one half, so the loop ends quickly; `bound` must be positive).
pub(crate) fn random_below<R: RngCore + CryptoRng + ?Sized>(
    rng: &mut R,
    bound: &Integer,
) -> Integer {
    debug_assert!(*bound > 0);
    let bits = bound.significant_bits();
    let len = bits.div_ceil(8) as usize;
    let spare = len as u32 * 8 - bits;
    let mut buf = vec![0u8; len];
    loop {
        rng.fill_bytes(&mut buf);
        buf[0] &= 0xff >> spare;
        let x = Integer::from_digits(&buf, Order::Msf);
        if x < *bound {
            return x;
        }
    }
}

/// A uniform unit of `Z_n`: a value in `[1, n)` prime to `n`. For an RSA modulus a non-unit
/// would reveal a factor, so the retry never happens in practice; it keeps the contract exact.
pub(crate) fn random_unit<R: RngCore + CryptoRng + ?Sized>(rng: &mut R, n: &Integer) -> Integer {
    loop {
        let r = random_below(rng, n);
        if r != 0 && Integer::from(r.gcd_ref(n)) == 1 {
            return r;
        }
    }
}

/// A random prime of exactly `bits` bits whose two top bits are set (so the product of two has
/// exactly `2 * bits` bits).
pub(crate) fn random_prime<R: RngCore + CryptoRng + ?Sized>(rng: &mut R, bits: u32) -> Integer {
    debug_assert!(bits >= 16);
    let len = bits.div_ceil(8) as usize;
    let spare = len as u32 * 8 - bits;
    let mut buf = vec![0u8; len];
    loop {
        rng.fill_bytes(&mut buf);
        buf[0] &= 0xff >> spare;
        let mut candidate = Integer::from_digits(&buf, Order::Msf);
        candidate.set_bit(bits - 1, true);
        candidate.set_bit(bits - 2, true);
        candidate.set_bit(0, true);
        if candidate.is_probably_prime(PRIME_REPS) != IsPrime::No {
            buf.fill(0);
            return candidate;
        }
    }
}

/// Whether `x` is (very probably) prime.
pub(crate) fn is_prime(x: &Integer) -> bool {
    x.is_probably_prime(PRIME_REPS) != IsPrime::No
}

/// `b^0, b^1, …, b^top`.
pub(crate) fn powers(b: &Integer, top: u32) -> Vec<Integer> {
    let mut out = Vec::with_capacity(top as usize + 1);
    out.push(Integer::from(1));
    for j in 1..=top as usize {
        let next = Integer::from(&out[j - 1] * b);
        out.push(next);
    }
    out
}

/// The binomial coefficient `x choose k` modulo `modulus`, for `k` below every prime factor of
/// `modulus` (so `k!` is invertible). The numerator is the falling factorial `x (x-1) … (x-k+1)`.
fn binomial_mod(x: &Integer, k: u32, modulus: &Integer) -> Integer {
    let mut numerator = Integer::from(1);
    let mut factorial = Integer::from(1);
    for i in 0..k {
        numerator *= Integer::from(x - i);
        numerator %= modulus;
        factorial *= i + 1;
    }
    let inverse = factorial
        .invert(modulus)
        .expect("k! is a unit: the modulus has no prime factor up to MAX_LAYER + 1");
    numerator *= inverse;
    numerator.rem_euc(modulus)
}

/// `(1 + b)^x mod b^(s+1)` without exponentiation: the binomial expansion stops after `s + 1`
/// terms because `b^(s+1)` vanishes, so this costs `O(s^2)` multiplications instead of a full
/// modular power. `pow` holds `b^0 ..= b^(s+1)`; `x` may be any non-negative integer.
pub(crate) fn one_plus_pow(pow: &[Integer], s: u32, x: &Integer) -> Integer {
    let modulus = &pow[s as usize + 1];
    let mut acc = Integer::from(1);
    for k in 1..=s {
        // C(x, k) = 0 for k > x, and then for every larger k: a small x (a selector bit) stops
        // here instead of inverting k! modulo a large power of b.
        if *x < k {
            break;
        }
        // C(x, k) b^k only matters modulo b^(s+1), so C(x, k) modulo b^(s+1-k) suffices.
        let c = binomial_mod(x, k, &pow[(s + 1 - k) as usize]);
        acc += c * &pow[k as usize];
    }
    acc.rem_euc(modulus)
}

/// The logarithm to base `1 + b`: given `a = (1 + b)^x mod b^(s+1)`, returns `x mod b^s`.
///
/// Damgård and Jurik's digit-by-digit extraction. Modulo `b^(j+1)` the binomial expansion reads
/// `a = 1 + x b + C(x,2) b^2 + … + C(x,j) b^j`, so `(a mod b^(j+1) - 1) / b` is
/// `x + Σ_{k=2..j} C(x,k) b^(k-1)` modulo `b^j`; every correction term carries a factor `b`
/// and so depends only on `x mod b^(j-1)`, which the previous round found. Each round therefore
/// learns one more base-`b` digit of `x`. Returns `None` if `a` is not `1 mod b` (then it is not
/// a power of `1 + b`). `pow` holds `b^0 ..= b^(s+1)`; every prime factor of `b` must exceed `s`.
pub(crate) fn one_plus_log(pow: &[Integer], s: u32, a: &Integer) -> Option<Integer> {
    let mut x = Integer::new();
    for j in 1..=s as usize {
        let modulus = &pow[j];
        let mut t = Integer::from(a % &pow[j + 1]) - 1u32;
        if !t.is_divisible(&pow[1]) {
            return None;
        }
        t.div_exact_mut(&pow[1]);
        for k in 2..=j {
            let c = binomial_mod(&x, k as u32, modulus);
            t -= c * &pow[k - 1];
        }
        x = t.rem_euc(modulus);
    }
    Some(x)
}

/// Big-endian bytes of `x`, left-padded with zeros to exactly `len` bytes (`x` must fit).
pub(crate) fn to_fixed_bytes(x: &Integer, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let used = x.significant_digits::<u8>();
    debug_assert!(used <= len, "value does not fit its fixed width");
    x.write_digits(&mut out[len - used..], Order::Msf);
    out
}

/// The number of bytes that hold any value below `bound`.
pub(crate) fn byte_len(bound: &Integer) -> usize {
    Integer::from(bound - 1u32).significant_digits::<u8>().max(1)
}

/// A uniform integer in `[0, 2^bits)`.
pub(crate) fn random_bits<R: RngCore + CryptoRng + ?Sized>(rng: &mut R, bits: u32) -> Integer {
    let len = bits.div_ceil(8) as usize;
    let mut buf = vec![0u8; len];
    rng.fill_bytes(&mut buf);
    if len > 0 {
        buf[0] &= 0xff >> (len as u32 * 8 - bits);
    }
    let x = Integer::from_digits(&buf, Order::Msf);
    buf.fill(0);
    x
}

/// Overwrites the whole allocation of a secret integer before it is freed (best effort: GMP's
/// scratch space during arithmetic is not covered, see the crate docs). Assigning a value of as
/// many limbs as the allocation holds makes GMP copy over every limb in place.
pub(crate) fn wipe(x: &mut Integer) {
    let bits = x.capacity();
    if bits == 0 {
        return;
    }
    let mut ones = Integer::from(1) << bits as u32;
    ones -= 1u32;
    x.assign(&ones);
    x.assign(0u32);
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    #[test]
    fn one_plus_power_and_log_invert_each_other() {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let b = Integer::from(1_000_003u32) * 1_000_033u32;
        for s in 1..=5 {
            let pow = powers(&b, s + 1);
            for _ in 0..20 {
                let x = random_below(&mut rng, &pow[s as usize + 1]);
                let direct = Integer::from(1u32 + &b).pow_mod(&x, &pow[s as usize + 1]).unwrap();
                assert_eq!(one_plus_pow(&pow, s, &x), direct, "s = {s}");
                let back = one_plus_log(&pow, s, &direct).unwrap();
                assert_eq!(back, Integer::from(&x % &pow[s as usize]), "s = {s}");
            }
        }
    }

    #[test]
    fn one_plus_pow_of_small_exponents() {
        let b = Integer::from(1_000_003u32) * 1_000_033u32;
        let pow = powers(&b, 8);
        for s in 1..=7 {
            for x in 0..=9u32 {
                let direct =
                    Integer::from(1u32 + &b).pow_mod(&Integer::from(x), &pow[s as usize + 1]);
                assert_eq!(one_plus_pow(&pow, s, &Integer::from(x)), direct.unwrap(), "{x}, {s}");
            }
        }
    }

    #[test]
    fn random_bits_stay_below_the_bound() {
        let mut rng = ChaCha20Rng::seed_from_u64(8);
        for bits in [1, 7, 8, 9, 256] {
            let xs: Vec<Integer> = (0..50).map(|_| random_bits(&mut rng, bits)).collect();
            assert!(xs.iter().all(|x| x.significant_bits() <= bits));
            assert!(xs.iter().any(|x| x.significant_bits() == bits), "{bits}");
        }
    }

    #[test]
    fn log_rejects_values_not_one_mod_b() {
        let b = Integer::from(1_000_003u32) * 1_000_033u32;
        let pow = powers(&b, 3);
        assert!(one_plus_log(&pow, 2, &Integer::from(2)).is_none());
    }

    #[test]
    fn wipe_zeroes_value() {
        let mut x = Integer::from(0xdead_beef_u32) << 4000u32;
        wipe(&mut x);
        assert_eq!(x, 0);
    }

    #[test]
    fn fixed_bytes_pad_on_the_left() {
        assert_eq!(to_fixed_bytes(&Integer::from(0x0102), 4), vec![0, 0, 1, 2]);
        assert_eq!(to_fixed_bytes(&Integer::new(), 2), vec![0, 0]);
        assert_eq!(byte_len(&Integer::from(256)), 1);
        assert_eq!(byte_len(&Integer::from(257)), 2);
    }
}
