//! Throughput of sealing and opening one cell segment (AES-256-GCM plus our header and AD).
//!
//! `cargo bench -p blindfold-crypto --bench seal`

use std::hint::black_box;

use blindfold_crypto::{CellAd, CellSealer, MasterKey, StoreId};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

const SIZES: [usize; 2] = [4 * 1024, 16 * 1024];

fn sealer() -> CellSealer {
    CellSealer::new(&MasterKey::from_bytes([7; 32]), StoreId([9; 16]), 1)
}

const AD: CellAd = CellAd { cell: 12345, version: 678, segment: 0 };

fn seal_into(c: &mut Criterion) {
    let sealer = sealer();
    let mut group = c.benchmark_group("seal_into");
    for size in SIZES {
        let plaintext = vec![0xa5u8; size];
        let mut out = vec![0u8; size + CellSealer::OVERHEAD];
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(format!("{}KiB", size / 1024), |b| {
            b.iter(|| {
                sealer.seal_into(black_box(&AD), black_box(&plaintext), &mut out).unwrap();
            });
        });
    }
    group.finish();
}

fn open_in_place(c: &mut Criterion) {
    let sealer = sealer();
    let mut group = c.benchmark_group("open_in_place");
    for size in SIZES {
        let sealed = sealer.seal(&AD, &vec![0xa5u8; size]).unwrap();
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_function(format!("{}KiB", size / 1024), |b| {
            // Opening decrypts in place, so every iteration gets a fresh copy (not timed).
            b.iter_batched_ref(
                || sealed.clone(),
                |buf| {
                    let plaintext = sealer.open_in_place(black_box(&AD), buf).unwrap();
                    black_box(plaintext.len());
                },
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

criterion_group!(benches, seal_into, open_in_place);
criterion_main!(benches);
