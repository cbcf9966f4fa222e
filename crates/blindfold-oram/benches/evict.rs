//! Micro-benchmark of one Path ORAM access without I/O or crypto: parsing a fetched path into
//! the stash, remapping, and greedy eviction back into buckets. This is the scheme's own CPU
//! cost per access, to compare with sealing (see blindfold-crypto's `seal` bench).

use std::collections::HashMap;

use blindfold_oram::{BlockId, Op, PathOram, PathOramConfig, Progress};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rand::{Rng, SeedableRng};

fn access(oram: &mut PathOram, cells: &mut HashMap<u64, Vec<u8>>, block: u64, op: Op) {
    let mut read = oram.start(BlockId(block), op).unwrap();
    loop {
        let fetched = read.iter().map(|c| cells.remove(&c.0)).collect();
        match oram.feed(fetched).unwrap() {
            Progress::Continue { writes, read: next } => {
                cells.extend(writes.into_iter().map(|(c, d)| (c.0, d)));
                read = next;
            }
            Progress::Done { writes, .. } => {
                cells.extend(writes.into_iter().map(|(c, d)| (c.0, d)));
                return;
            }
        }
    }
}

fn bench_access(c: &mut Criterion) {
    let mut group = c.benchmark_group("path_oram_access");
    for &(blocks, block_size) in &[(1u64 << 12, 4096u32), (1 << 16, 256)] {
        let config = PathOramConfig::builder(blocks, block_size).build().unwrap();
        let path_bytes = config.cells_per_access() * config.bucket_bytes() as u64;
        let mut oram = PathOram::with_seed(config, 1);
        let mut cells = HashMap::new();
        for b in 0..blocks {
            access(&mut oram, &mut cells, b, Op::Write(vec![b as u8; block_size as usize]));
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(2);
        group.throughput(Throughput::Bytes(path_bytes));
        group.bench_function(BenchmarkId::new("read", format!("{blocks}x{block_size}B")), |b| {
            b.iter(|| access(&mut oram, &mut cells, rng.gen_range(0..blocks), Op::Read))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_access);
criterion_main!(benches);
