//! Damgård–Jurik costs at the reference paper's 1024-bit modulus, layers 1 to 3:
//! `cargo bench -p blindfold-dj`.

use blindfold_dj::{Integer, SecretKey};
use criterion::{criterion_group, criterion_main, Criterion};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

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

criterion_group!(benches, dj);
criterion_main!(benches);
