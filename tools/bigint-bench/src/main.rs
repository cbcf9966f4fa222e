//! Times `base^exp mod m` for the shapes Damgård–Jurik needs with a 1024-bit `n`:
//! `m = n^2` with `exp = n` (Paillier, s = 1) and `m = n^3` with `exp = n^2` (s = 2), plus a
//! secret-sized exponent (1024 bits, as in decryption). Prints one line per library and shape.

use std::hint::black_box;
use std::time::Instant;

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use rug::integer::Order;
use rug::ops::Pow;
use rug::Integer;

/// A deterministic stream of bytes (xorshift), so every library sees the same numbers.
fn bytes(seed: &mut u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 24) as u8
        })
        .collect()
}

/// The median of `reps` timed calls, in milliseconds (the median shrugs off the other tenants of
/// a shared machine).
fn time<F: FnMut()>(reps: u32, mut f: F) -> f64 {
    f(); // warm up
    let mut samples: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn main() {
    let reps: u32 = std::env::var("REPS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut n_bytes = bytes(&mut seed, 128);
    n_bytes[0] |= 0xc0;
    n_bytes[127] |= 1;
    let n = Integer::from_digits(&n_bytes, Order::Msf);
    let secret = Integer::from_digits(&bytes(&mut seed, 128), Order::Msf);
    println!("library        shape                          ms/op");
    for s in 1..=2u32 {
        let m = n.clone().pow(s + 1);
        let e = n.clone().pow(s);
        let base = Integer::from_digits(
            &bytes(&mut seed, (m.significant_bits() / 8) as usize),
            Order::Msf,
        ) % &m;
        let shapes = [
            (format!("mod n^{} exp n^{s}", s + 1), e.clone()),
            (format!("mod n^{} exp 1024-bit", s + 1), secret.clone()),
        ];
        for (label, e) in shapes {
            // rug (GMP): variable-time mpz_powm and constant-time mpz_powm_sec.
            let t = time(reps, || {
                black_box(base.pow_mod_ref(&e, &m).map(Integer::from));
            });
            println!("rug powm       {label:<30} {t:8.2}");
            let t = time(reps, || {
                black_box(Integer::from(base.secure_pow_mod_ref(&e, &m)));
            });
            println!("rug powm_sec   {label:<30} {t:8.2}");

            // num-bigint
            let nb =
                |x: &Integer| num_bigint::BigUint::from_bytes_be(&x.to_digits::<u8>(Order::Msf));
            let (b2, e2, m2) = (nb(&base), nb(&e), nb(&m));
            let expect = base.pow_mod_ref(&e, &m).map(Integer::from).unwrap();
            assert_eq!(nb(&expect), b2.modpow(&e2, &m2));
            let t = time(reps, || {
                black_box(b2.modpow(&e2, &m2));
            });
            println!("num-bigint     {label:<30} {t:8.2}");

            // crypto-bigint, heap-backed Montgomery form (constant time and vartime)
            let bits = m.significant_bits().next_multiple_of(64);
            let cb = |x: &Integer| {
                BoxedUint::from_be_slice(&x.to_digits::<u8>(Order::Msf), bits).unwrap()
            };
            let params = BoxedMontyParams::new_vartime(Odd::new(cb(&m)).unwrap());
            let b3 = BoxedMontyForm::new(cb(&base), &params);
            let e3 = cb(&e);
            assert_eq!(b3.pow(&e3).retrieve(), cb(&expect));
            let t = time(reps, || {
                black_box(b3.pow(&e3));
            });
            println!("crypto-bigint  {label:<30} {t:8.2}");
        }
    }
}
