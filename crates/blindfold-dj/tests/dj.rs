//! Damgård–Jurik: round trips at every layer, onions, homomorphic identities, known answers
//! from an independent Python implementation (tests/kat.py), and hostile input.

use std::sync::OnceLock;

use blindfold_dj::{Ciphertext, DjError, Integer, PublicKey, SecretKey, MAX_LAYER};
use proptest::prelude::*;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

fn rng(seed: u64) -> ChaCha20Rng {
    ChaCha20Rng::seed_from_u64(seed)
}

/// One 512-bit key for the whole file (generation is the slowest step).
fn key() -> &'static SecretKey {
    static KEY: OnceLock<SecretKey> = OnceLock::new();
    KEY.get_or_init(|| SecretKey::generate(512, &mut rng(512)).unwrap())
}

fn int(x: u64) -> Integer {
    Integer::from(x)
}

/// `n^s - 1`, the largest plaintext of layer `s`.
fn top(pk: &PublicKey, s: u32) -> Integer {
    Integer::from(pk.plaintext_bound(s).unwrap() - 1u32)
}

#[test]
fn round_trip_at_every_layer() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(1);
    for s in 1..=4 {
        let random = {
            let bytes = vec![0xa5u8; pk.plaintext_chunk_len(s).unwrap()];
            Integer::from_digits(&bytes, rug::integer::Order::Msf)
        };
        for m in [int(0), int(1), int(42), top(pk, s), random] {
            let c = pk.encrypt(&m, s, &mut rng).unwrap();
            assert_eq!(c.layer(), s);
            assert!(c.value() < pk.ciphertext_modulus(s).unwrap());
            assert_eq!(sk.decrypt(&c), m, "public encryption, layer {s}");
            let c = sk.encrypt(&m, s, &mut rng).unwrap();
            assert_eq!(sk.decrypt(&c), m, "secret-key (CRT) encryption, layer {s}");
        }
    }
}

#[test]
fn encryption_is_randomized() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(2);
    let a = pk.encrypt(&int(7), 1, &mut rng).unwrap();
    let b = pk.encrypt(&int(7), 1, &mut rng).unwrap();
    assert_ne!(a, b);
    let c = pk.rerandomize(&a, &mut rng);
    assert_ne!(a, c);
    assert_eq!(sk.decrypt(&c), 7);
}

#[test]
fn secret_and_public_encryption_agree_for_the_same_randomness() {
    let sk = key();
    let pk = sk.public();
    for s in 1..=3 {
        let m = top(pk, s) - 99u32;
        let r = Integer::from(pk.n() - 12345u32);
        assert_eq!(
            pk.encrypt_with_randomness(&m, s, &r).unwrap(),
            sk.encrypt_with_randomness(&m, s, &r).unwrap(),
            "layer {s}"
        );
    }
}

#[test]
fn onion_wrap_and_peel() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(3);
    for s in 1..=3 {
        let m = top(pk, s) - 5u32;
        let c1 = pk.encrypt(&m, s, &mut rng).unwrap();
        let c2 = pk.wrap(&c1, &mut rng).unwrap();
        let c3 = sk.wrap(&c2, &mut rng).unwrap();
        assert_eq!((c2.layer(), c3.layer()), (s + 1, s + 2));
        assert_eq!(sk.decrypt(&c2), *c1.value(), "the outer plaintext is the inner ciphertext");
        let back2 = sk.peel(&c3).unwrap();
        assert_eq!(back2, c2);
        let back1 = sk.peel(&back2).unwrap();
        assert_eq!(back1, c1);
        assert_eq!(sk.decrypt(&back1), m);
        assert_eq!(sk.peel_all(&c3, s).unwrap(), m);
        assert!(sk.peel_all(&c1, s + 1).is_err());
    }
    // Layer 1 has nothing to peel.
    let c = pk.encrypt(&int(1), 1, &mut rng).unwrap();
    assert!(matches!(sk.peel(&c), Err(DjError::Layer { layer: 1, .. })));
}

#[test]
fn peel_refuses_an_outer_plaintext_that_is_no_ciphertext() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(4);
    // 0 and n itself are not units: no inner ciphertext is ever one of them.
    for m in [int(0), pk.n().clone()] {
        let c = pk.encrypt(&m, 2, &mut rng).unwrap();
        assert!(matches!(sk.peel(&c), Err(DjError::Ciphertext { layer: 1, .. })), "{m}");
    }
}

#[test]
fn homomorphic_identities() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(5);
    for s in 1..=3 {
        let bound = pk.plaintext_bound(s).unwrap().clone();
        let a = Integer::from(&bound - 1000u32);
        let b = int(123_456_789);
        let ca = pk.encrypt(&a, s, &mut rng).unwrap();
        let cb = pk.encrypt(&b, s, &mut rng).unwrap();
        // Addition wraps modulo n^s.
        let sum = Integer::from(&a + &b) % &bound;
        assert_eq!(sk.decrypt(&pk.add(&ca, &cb).unwrap()), sum);
        assert_eq!(sk.decrypt(&pk.add_plain(&ca, &b).unwrap()), sum);
        assert_eq!(sk.decrypt(&pk.sub(&cb, &ca).unwrap()), Integer::from(&b - &a) + &bound);
        // Scalar multiplication.
        let k = Integer::from(&bound / 3u32);
        let prod = Integer::from(&k * &a) % &bound;
        assert_eq!(sk.decrypt(&pk.mul_scalar(&ca, &k).unwrap()), prod);
        assert_eq!(sk.decrypt(&pk.mul_scalar(&ca, &int(0)).unwrap()), 0);
    }
}

/// Onion ORAM's server step: an encrypted unit vector picks exactly one block, whichever it is.
#[test]
fn selection_vector_selects_exactly_one_block() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(6);
    let s = 2;
    let z = 4usize;
    let chunks = 3usize;
    let blocks: Vec<Vec<Integer>> =
        (0..z).map(|i| (0..chunks).map(|j| top(pk, s) - (1000 * i + j) as u32).collect()).collect();
    for pick in 0..z {
        let bits: Vec<Integer> = (0..z).map(|i| int(u64::from(i == pick))).collect();
        let selector = sk.encrypt_many(&bits, s, &mut rng).unwrap();
        let out = pk.select_blocks(&selector, &blocks).unwrap();
        assert_eq!(sk.decrypt_many(&out), blocks[pick], "pick {pick}");
        let column: Vec<Integer> = blocks.iter().map(|b| b[1].clone()).collect();
        assert_eq!(sk.decrypt(&pk.select(&selector, &column).unwrap()), blocks[pick][1]);
    }
}

/// The same with onion layers, as in Onion ORAM: the blocks are layer-1 ciphertexts, the selector
/// is at layer 2, and the answer is peeled back to the chosen block's plaintext.
#[test]
fn onion_select_returns_the_chosen_inner_ciphertext() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(7);
    let plain: Vec<Integer> = (0..4u64).map(|i| int(1_000_000 + i)).collect();
    let inner = pk.encrypt_many(&plain, 1, &mut rng).unwrap();
    let values: Vec<Integer> = inner.iter().map(|c| c.value().clone()).collect();
    for pick in 0..4 {
        let bits: Vec<Integer> = (0..4).map(|i| int(u64::from(i == pick))).collect();
        let selector = pk.encrypt_many(&bits, 2, &mut rng).unwrap();
        let answer = pk.select(&selector, &values).unwrap();
        assert_eq!(answer.layer(), 2);
        let peeled = sk.peel(&answer).unwrap();
        assert_eq!(peeled, inner[pick]);
        assert_eq!(sk.decrypt(&peeled), plain[pick]);
    }
}

#[test]
fn batches_match_one_at_a_time() {
    let sk = key();
    let pk = sk.public();
    let ms: Vec<Integer> = (0..9u64).map(|i| int(i * 7919)).collect();
    let many = pk.encrypt_many(&ms, 2, &mut rng(8)).unwrap();
    assert_eq!(sk.decrypt_many(&many), ms);
    let many_sk = sk.encrypt_many_uniform(&ms, 2, &mut rng(8)).unwrap();
    // Same seed, same randomness drawn in the same order: the very same ciphertexts.
    assert_eq!(many, many_sk);
    // The fixed-base batch: same plaintexts, other ciphertexts, and reproducible for a seed
    // once the key's base is drawn.
    let fast = sk.encrypt_many(&ms, 2, &mut rng(8)).unwrap();
    assert_eq!(sk.decrypt_many(&fast), ms);
    assert_ne!(fast, many);
    assert_eq!(
        sk.encrypt_many(&ms, 2, &mut rng(9)).unwrap(),
        sk.encrypt_many(&ms, 2, &mut rng(9)).unwrap()
    );
}

/// Onion ORAM's selector bits at every layer it uses, through the fixed-base path, batched and
/// alone, decrypt to the bits; ciphertexts of equal bits differ.
#[test]
fn fixed_base_selectors_decrypt_at_every_layer() {
    let sk = key();
    let mut rng = rng(21);
    for s in [1, 2, 3, 6, 11, MAX_LAYER] {
        let bits: Vec<Integer> = (0..5u64).map(|i| int(u64::from(i == 2))).collect();
        let cs = sk.encrypt_many(&bits, s, &mut rng).unwrap();
        assert!(cs.iter().all(|c| c.layer() == s));
        assert_eq!(sk.decrypt_many(&cs), bits, "layer {s}");
        assert_ne!(cs[0], cs[1]);
        let one = sk.encrypt_fixed_base(&int(1), s, &mut rng).unwrap();
        assert_eq!(sk.decrypt(&one), 1);
    }
    let bound = sk.public().plaintext_bound(1).unwrap().clone();
    assert!(matches!(
        sk.encrypt_many(&[bound], 1, &mut rng),
        Err(DjError::PlaintextRange { layer: 1 })
    ));
    assert!(matches!(sk.encrypt_many(&[int(0)], 0, &mut rng), Err(DjError::Layer { .. })));
}

/// The fixed-base tables are built once and shared: many threads encrypting at once at fresh
/// layers all get correct ciphertexts.
#[test]
fn fixed_base_tables_are_shared_between_threads() {
    let sk = SecretKey::generate(256, &mut rng(22)).unwrap();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let sk = &sk;
            scope.spawn(move || {
                let mut rng = rng(100 + t);
                for s in 1..=4 {
                    let c = sk.encrypt_fixed_base(&int(t), s, &mut rng).unwrap();
                    assert_eq!(sk.decrypt(&c), t);
                }
            });
        }
    });
}

/// The reference select: one `pow_mod` per non-zero term, as the crate computed it before the
/// multi-exponentiation.
fn naive_select(pk: &PublicKey, selector: &[Ciphertext], values: &[Integer]) -> Integer {
    let modulus = pk.ciphertext_modulus(selector[0].layer()).unwrap();
    let mut acc = Integer::from(1);
    for (c, v) in selector.iter().zip(values) {
        if *v != 0 {
            acc *= c.value().clone().pow_mod(v, modulus).unwrap();
            acc %= modulus;
        }
    }
    acc
}

/// Straus's select gives exactly the naive product, on random full-size and short values with
/// zeros and ones among them, at several layers, alone and over blocks.
#[test]
fn select_is_the_product_of_powers() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(23);
    for s in [1, 2, 3, 5] {
        let z = 6;
        let selector: Vec<Ciphertext> =
            (0..z).map(|i| pk.encrypt(&int(i as u64 % 2), s, &mut rng).unwrap()).collect();
        let len = pk.plaintext_chunk_len(s).unwrap();
        let mut blocks: Vec<Vec<Integer>> = (0..z)
            .map(|_| {
                (0..4)
                    .map(|_| {
                        let mut bytes = vec![0u8; len];
                        rand::RngCore::fill_bytes(&mut rng, &mut bytes);
                        pk.plaintext_from_bytes(s, &bytes).unwrap()
                    })
                    .collect()
            })
            .collect();
        blocks[1][0] = int(0);
        blocks[2][1] = int(1);
        blocks[3][2] = int(0xffff);
        blocks[4][3] = top(pk, s);
        blocks[5] = vec![int(0); 4]; // a block that is all zeros: no table at all
        let out = pk.select_blocks(&selector, &blocks).unwrap();
        for (j, got) in out.iter().enumerate() {
            let column: Vec<Integer> = blocks.iter().map(|b| b[j].clone()).collect();
            let want = naive_select(pk, &selector, &column);
            assert_eq!(*got.value(), want, "layer {s}, column {j}");
            assert_eq!(*pk.select(&selector, &column).unwrap().value(), want);
            assert_eq!(got.layer(), s);
        }
        let zeros = vec![int(0); z];
        assert_eq!(*pk.select(&selector, &zeros).unwrap().value(), 1);
    }
}

/// `select_blocks` reports the error `select` gives for the first failing column.
#[test]
fn select_blocks_errors_are_select_errors() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(24);
    let c1 = pk.encrypt(&int(1), 1, &mut rng).unwrap();
    let c2 = pk.encrypt(&int(0), 2, &mut rng).unwrap();
    let bound = pk.plaintext_bound(1).unwrap().clone();
    let blocks = vec![vec![int(1), bound.clone()], vec![int(1), int(2)]];
    let got = pk.select_blocks(&[c1.clone(), c1.clone()], &blocks).unwrap_err();
    let want = pk.select(&[c1.clone(), c1.clone()], &[bound.clone(), int(2)]).unwrap_err();
    assert_eq!(got, want);
    let got = pk.select_blocks(&[c1.clone(), c2.clone()], &blocks).unwrap_err();
    assert_eq!(got, DjError::LayerMismatch { left: 1, right: 2 });
}

#[test]
fn ciphertext_bytes_round_trip_and_validation() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(9);
    for s in 1..=3 {
        let c = pk.encrypt(&int(99), s, &mut rng).unwrap();
        let bytes = pk.ciphertext_to_bytes(&c);
        assert_eq!(bytes.len(), pk.ciphertext_len(s).unwrap());
        assert_eq!(pk.ciphertext_from_bytes(s, &bytes).unwrap(), c);
        // Wrong lengths.
        let err = pk.ciphertext_from_bytes(s, &bytes[1..]).unwrap_err();
        assert!(matches!(err, DjError::Length { .. }), "{err}");
        let mut longer = vec![0u8];
        longer.extend_from_slice(&bytes);
        assert!(matches!(pk.ciphertext_from_bytes(s, &longer), Err(DjError::Length { .. })));
        // Out of range: all ones is above n^(s+1) unless n^(s+1) fills its top byte.
        let ones = vec![0xffu8; bytes.len()];
        let v = Integer::from_digits(&ones, rug::integer::Order::Msf);
        if v >= *pk.ciphertext_modulus(s).unwrap() {
            assert!(matches!(pk.ciphertext_from_bytes(s, &ones), Err(DjError::Ciphertext { .. })));
        }
        let modulus = pk.ciphertext_modulus(s).unwrap().clone();
        assert!(matches!(pk.ciphertext_from_value(s, modulus), Err(DjError::Ciphertext { .. })));
        // Non-units: zero, and a multiple of n.
        assert!(matches!(
            pk.ciphertext_from_bytes(s, &vec![0u8; bytes.len()]),
            Err(DjError::Ciphertext { .. })
        ));
        assert!(matches!(
            pk.ciphertext_from_value(s, pk.n().clone() * 3u32),
            Err(DjError::Ciphertext { .. })
        ));
        // Layers out of range.
        for bad in [0, MAX_LAYER + 1] {
            assert!(matches!(pk.ciphertext_from_bytes(bad, &bytes), Err(DjError::Layer { .. })));
        }
    }
}

#[test]
fn a_factor_of_n_is_rejected_as_a_ciphertext() {
    // A value sharing a factor with n is refused even when it is in range.
    let sk = SecretKey::from_bytes(&key().to_bytes()).unwrap();
    let pk = sk.public();
    let bytes = sk.to_bytes();
    // p is the first field: 8 magic bytes, 4 length bytes, then p.
    let len = u32::from_be_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let p = Integer::from_digits(&bytes[12..12 + len], rug::integer::Order::Msf);
    assert!(matches!(pk.ciphertext_from_value(1, p), Err(DjError::Ciphertext { .. })));
}

#[test]
fn operations_refuse_bad_operands() {
    let sk = key();
    let pk = sk.public();
    let mut rng = rng(10);
    let c1 = pk.encrypt(&int(1), 1, &mut rng).unwrap();
    let c2 = pk.encrypt(&int(1), 2, &mut rng).unwrap();
    assert!(matches!(pk.add(&c1, &c2), Err(DjError::LayerMismatch { left: 1, right: 2 })));
    let bound = pk.plaintext_bound(1).unwrap().clone();
    assert!(matches!(pk.encrypt(&bound, 1, &mut rng), Err(DjError::PlaintextRange { layer: 1 })));
    assert!(matches!(pk.encrypt(&int(0), 0, &mut rng), Err(DjError::Layer { .. })));
    assert!(matches!(
        pk.encrypt(&Integer::from(-1), 1, &mut rng),
        Err(DjError::PlaintextRange { .. })
    ));
    assert!(matches!(pk.mul_scalar(&c1, &bound), Err(DjError::PlaintextRange { .. })));
    assert!(matches!(pk.select(std::slice::from_ref(&c1), &[]), Err(DjError::Shape { .. })));
    assert!(matches!(
        pk.select(&[c1.clone(), c2.clone()], &[int(1), int(1)]),
        Err(DjError::LayerMismatch { .. })
    ));
    assert!(matches!(
        pk.select(std::slice::from_ref(&c1), std::slice::from_ref(&bound)),
        Err(DjError::PlaintextRange { .. })
    ));
    assert!(matches!(
        pk.select_blocks(&[c1.clone(), c1.clone()], &[vec![int(1)], vec![int(1), int(2)]]),
        Err(DjError::Shape { .. })
    ));
    // Plaintexts from bytes: below n^s or refused, too long refused before any arithmetic.
    let n_bytes = pk.n().to_digits::<u8>(rug::integer::Order::Msf);
    assert!(matches!(
        pk.plaintext_from_bytes(1, &n_bytes),
        Err(DjError::PlaintextRange { layer: 1 })
    ));
    assert!(matches!(
        pk.plaintext_from_bytes(1, &vec![1u8; n_bytes.len() + 1]),
        Err(DjError::PlaintextRange { .. })
    ));
    assert_eq!(pk.plaintext_from_bytes(2, &n_bytes).unwrap(), *pk.n());
    assert_eq!(pk.plaintext_from_bytes(1, &[]).unwrap(), 0);
    // Randomness that is not a unit of Z_n.
    assert!(pk.encrypt_with_randomness(&int(1), 1, &int(0)).is_err());
    assert!(pk.encrypt_with_randomness(&int(1), 1, pk.n()).is_err());
    // The deepest layer cannot be wrapped again.
    let deep = pk.encrypt(&int(1), MAX_LAYER, &mut rng);
    if let Ok(deep) = deep {
        assert!(matches!(pk.wrap(&deep, &mut rng), Err(DjError::Layer { .. })));
    }
}

#[test]
fn keys_round_trip_and_hostile_encodings_fail() {
    let sk = key();
    let pk = sk.public();
    let bytes = sk.to_bytes();
    let again = SecretKey::from_bytes(&bytes).unwrap();
    assert_eq!(again.public(), pk);
    assert_eq!(PublicKey::from_bytes(&pk.to_bytes()).unwrap(), *pk);
    // Truncations and trailing bytes.
    for cut in [0, 7, 8, 11, 12, bytes.len() - 1] {
        assert!(SecretKey::from_bytes(&bytes[..cut]).is_err(), "cut {cut}");
    }
    let mut trailing = bytes.to_vec();
    trailing.push(0);
    assert!(SecretKey::from_bytes(&trailing).is_err());
    // A length field claiming 4 GiB allocates nothing and fails.
    let mut huge = b"BFDJPK01".to_vec();
    huge.extend_from_slice(&u32::MAX.to_be_bytes());
    huge.extend_from_slice(&[1u8; 64]);
    assert!(matches!(PublicKey::from_bytes(&huge), Err(DjError::Key(_))));
    // Wrong magic.
    let mut wrong = pk.to_bytes();
    wrong[0] ^= 1;
    assert!(PublicKey::from_bytes(&wrong).is_err());
    // Swapping p for a composite, or making p = q, is refused.
    let n_bits = pk.n_bits();
    let half = n_bits / 2;
    let composite = (Integer::from(1) << (half - 1)) + 1u32 + (Integer::from(1) << (half - 2));
    let composite = if composite.is_even() { composite + 1u32 } else { composite };
    let other = SecretKey::generate(n_bits, &mut rng(11)).unwrap();
    assert!(SecretKey::from_primes(composite.clone(), composite.clone()).is_err());
    let p_bytes = other.to_bytes();
    let len = u32::from_be_bytes(p_bytes[8..12].try_into().unwrap()) as usize;
    let p = Integer::from_digits(&p_bytes[12..12 + len], rug::integer::Order::Msf);
    assert!(matches!(SecretKey::from_primes(p.clone(), p.clone()), Err(DjError::Key(_))));
    assert!(matches!(SecretKey::from_primes(p, composite), Err(DjError::Key(_))));
    // Bad moduli for a public key: even, prime, a square, too small, small factors.
    assert!(PublicKey::from_modulus(Integer::from(pk.n() + 1u32)).is_err());
    assert!(PublicKey::from_modulus(Integer::from(pk.n() * 3u32)).is_err());
    assert!(PublicKey::from_modulus(Integer::from(1_000_003u32)).is_err());
    let big_prime = (Integer::from(1) << 300u32).next_prime();
    assert!(PublicKey::from_modulus(big_prime.clone()).is_err());
    assert!(PublicKey::from_modulus(Integer::from(&big_prime * &big_prime)).is_err());
    // Key sizes.
    assert!(SecretKey::generate(255, &mut rng(12)).is_err());
    assert!(SecretKey::generate(128, &mut rng(12)).is_err());
}

#[test]
fn a_ciphertext_of_another_key_decrypts_to_garbage_without_panicking() {
    let mut rng = rng(13);
    let sk = key();
    let other = SecretKey::generate(768, &mut rng).unwrap();
    for s in 1..=2 {
        let c = other.public().encrypt(&int(5), s, &mut rng).unwrap();
        let _ = sk.decrypt(&c);
        let _ = sk.peel(&c);
        // Even a value divisible by one of our primes (which a hostile peer could send only if
        // it knew the factors) must not panic.
        let bytes = sk.to_bytes();
        let len = u32::from_be_bytes(bytes[8..12].try_into().unwrap()) as usize;
        let p = Integer::from_digits(&bytes[12..12 + len], rug::integer::Order::Msf);
        let c = other.public().ciphertext_from_value(s, p).unwrap();
        let _ = sk.decrypt(&c);
    }
}

#[test]
fn debug_never_prints_the_primes() {
    let sk = key();
    let bytes = sk.to_bytes();
    let len = u32::from_be_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let p = Integer::from_digits(&bytes[12..12 + len], rug::integer::Order::Msf);
    let shown = format!("{sk:?} {sk:#?}");
    assert!(shown.contains("SecretKey"));
    for text in [p.to_string(), p.to_string_radix(16), format!("{:x}", p)] {
        assert!(!shown.contains(&text[..16]), "{shown}");
    }
}

// ---------------------------------------------------------------------------------------------
// Known answers from tests/kat.py (pure Python integers, textbook formulas).

struct Kat {
    p: Integer,
    q: Integer,
    s: u32,
    m: Integer,
    r: Integer,
    c: Integer,
    inner: Option<(u32, Integer, Integer)>,
}

fn kats() -> Vec<Kat> {
    let text = include_str!("kat_vectors.txt");
    text.split("\n\n")
        .filter(|r| !r.trim().is_empty())
        .map(|record| {
            let get = |name: &str| {
                record.lines().find_map(|line| {
                    let (k, v) = line.split_once(" = ")?;
                    (k == name).then(|| Integer::from_str_radix(v.trim(), 16).unwrap())
                })
            };
            let s = get("s").unwrap().to_u32().unwrap();
            let inner = get("inner_s")
                .map(|is| (is.to_u32().unwrap(), get("inner_m").unwrap(), get("inner_r").unwrap()));
            Kat {
                p: get("p").unwrap(),
                q: get("q").unwrap(),
                s,
                m: get("m").unwrap(),
                r: get("r").unwrap(),
                c: get("c").unwrap(),
                inner,
            }
        })
        .collect()
}

#[test]
fn known_answers_from_python() {
    let kats = kats();
    assert_eq!(kats.len(), 28, "the vectors file is complete");
    let mut onions = 0;
    for (i, kat) in kats.iter().enumerate() {
        let sk = SecretKey::from_primes(kat.p.clone(), kat.q.clone()).unwrap();
        let pk = sk.public();
        let c = pk.encrypt_with_randomness(&kat.m, kat.s, &kat.r).unwrap();
        assert_eq!(*c.value(), kat.c, "vector {i}: public encryption");
        let c2 = sk.encrypt_with_randomness(&kat.m, kat.s, &kat.r).unwrap();
        assert_eq!(*c2.value(), kat.c, "vector {i}: CRT encryption");
        let bytes = pk.ciphertext_to_bytes(&c);
        let parsed = pk.ciphertext_from_bytes(kat.s, &bytes).unwrap();
        assert_eq!(sk.decrypt(&parsed), kat.m, "vector {i}: decryption");
        if let Some((inner_s, inner_m, inner_r)) = &kat.inner {
            onions += 1;
            let inner = sk.peel(&parsed).unwrap();
            assert_eq!(inner.layer(), *inner_s);
            assert_eq!(*inner.value(), kat.m);
            assert_eq!(inner, pk.encrypt_with_randomness(inner_m, *inner_s, inner_r).unwrap());
            assert_eq!(sk.peel_all(&parsed, *inner_s).unwrap(), *inner_m, "vector {i}: onion");
        }
    }
    assert_eq!(onions, 4);
}

// ---------------------------------------------------------------------------------------------
// Randomized.

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_plaintexts_round_trip(seed: u64, s in 1u32..=3, bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let sk = key();
        let pk = sk.public();
        let m = Integer::from_digits(&bytes, rug::integer::Order::Msf) % pk.plaintext_bound(s).unwrap();
        let mut rng = rng(seed);
        let c = pk.encrypt(&m, s, &mut rng).unwrap();
        prop_assert_eq!(sk.decrypt(&c), m.clone());
        let outer = sk.wrap(&c, &mut rng).unwrap();
        prop_assert_eq!(sk.peel_all(&outer, s).unwrap(), m);
    }

    #[test]
    fn random_bytes_never_panic_as_ciphertexts(s in 0u32..=4, bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let pk = key().public();
        if let Ok(c) = pk.ciphertext_from_bytes(s, &bytes) {
            prop_assert_eq!(pk.ciphertext_to_bytes(&c), bytes);
            // Anything accepted decrypts without a panic.
            let _ = key().decrypt(&c);
        }
    }

    #[test]
    fn random_bytes_never_panic_as_keys(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = PublicKey::from_bytes(&bytes);
        let _ = SecretKey::from_bytes(&bytes);
        let mut with_magic = b"BFDJSK01".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = SecretKey::from_bytes(&with_magic);
        let mut with_magic = b"BFDJPK01".to_vec();
        with_magic.extend_from_slice(&bytes);
        let _ = PublicKey::from_bytes(&with_magic);
    }
}

#[allow(dead_code)]
fn assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<SecretKey>();
    is::<PublicKey>();
    is::<Ciphertext>();
}
