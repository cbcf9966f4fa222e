//! Damgård–Jurik costs at the reference paper's 1024-bit modulus: `cargo bench -p blindfold-dj`.
//!
//! Group `dj-1024`: single operations at layers 1 to 3. Group `onion-1024`: what Onion ORAM
//! spends its time on — the client encrypting selector bits (`SecretKey::encrypt_many`, alone on
//! the calling thread for one item and on all cores for 16) and the server's select over 16
//! blocks (one chunk column, one core; and `select_blocks` over 33 chunk columns, all cores).

use blindfold_dj::{Integer, SecretKey};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;
use std::time::Duration;

fn dj(c: &mut Criterion) {
    let mut rng = ChaCha20Rng::seed_from_u64(1024);
    let sk = SecretKey::generate(1024, &mut rng).unwrap();
    let pk = sk.public().clone();
    let mut group = c.benchmark_group("dj-1024");
    group.sample_size(10);
    for s in 1..=3u32 {
        let m = Integer::from(pk.plaintext_bound(s).unwrap() - 12345u32);
        let ct = pk.encrypt(&m, s, &mut rng).unwrap();
        group.bench_function(format!("encrypt-public/s={s}"), |b| {
            b.iter(|| pk.encrypt(&m, s, &mut rng).unwrap())
        });
        group.bench_function(format!("encrypt-secret-crt/s={s}"), |b| {
            b.iter(|| sk.encrypt(&m, s, &mut rng).unwrap())
        });
        group.bench_function(format!("decrypt-crt/s={s}"), |b| b.iter(|| sk.decrypt(&ct)));
        group.bench_function(format!("mul-scalar/s={s}"), |b| {
            b.iter(|| pk.mul_scalar(&ct, &m).unwrap())
        });
        let ms: Vec<Integer> = (0..8u32).map(|i| Integer::from(&m - i)).collect();
        group.bench_function(format!("encrypt-many-8-secret/s={s}"), |b| {
            b.iter(|| sk.encrypt_many(&ms, s, &mut rng).unwrap())
        });
    }
    group.finish();
}

/// Bases per select (a bucket of Onion ORAM) and chunk columns per block (4096-byte blocks at
/// layer 1 of a 1024-bit key).
const BASES: usize = 16;
const CHUNKS: usize = 33;

fn onion(c: &mut Criterion) {
    let mut rng = ChaCha20Rng::seed_from_u64(1025);
    let sk = SecretKey::generate(1024, &mut rng).unwrap();
    let pk = sk.public().clone();
    let mut group = c.benchmark_group("onion-1024");
    group.sample_size(10).sampling_mode(SamplingMode::Flat).warm_up_time(Duration::from_secs(1));
    let bits: Vec<Integer> = (0..BASES).map(|i| Integer::from(u32::from(i == 3))).collect();
    for s in [1u32, 2, 3, 6, 11] {
        group.bench_function(format!("encrypt-selector-1/s={s}"), |b| {
            b.iter(|| sk.encrypt_many(&bits[3..4], s, &mut rng).unwrap())
        });
        group.bench_function(format!("encrypt-selector-{BASES}/s={s}"), |b| {
            b.iter(|| sk.encrypt_many(&bits, s, &mut rng).unwrap())
        });
    }
    for s in [2u32, 6, 11] {
        let selector = sk.encrypt_many(&bits, s, &mut rng).unwrap();
        // Values as Onion ORAM's: random plaintexts of nearly full size for layer s, as the
        // inner ciphertexts of layer s - 1 are.
        let len = pk.plaintext_chunk_len(s).unwrap();
        let blocks: Vec<Vec<Integer>> = (0..BASES)
            .map(|_| {
                (0..CHUNKS)
                    .map(|_| {
                        let mut bytes = vec![0u8; len];
                        rng.fill_bytes(&mut bytes);
                        pk.plaintext_from_bytes(s, &bytes).unwrap()
                    })
                    .collect()
            })
            .collect();
        let column: Vec<Integer> = blocks.iter().map(|b| b[0].clone()).collect();
        group.bench_function(format!("select-{BASES}/s={s}"), |b| {
            b.iter(|| pk.select(&selector, &column).unwrap())
        });
        group.bench_function(format!("select-blocks-{BASES}x{CHUNKS}/s={s}"), |b| {
            b.iter(|| pk.select_blocks(&selector, &blocks).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, dj, onion);
criterion_main!(benches);
