//! The no-ORAM baseline under concurrency: readers racing writers never see an integrity
//! error or bytes that were never written, and every block ends as its last write.

use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_oram::BlockId;
use blindfold_proxy::SealedDirect;
use blindfold_store::{JitterStore, MemoryStore, Store};
use rand::{Rng, SeedableRng};

const BS: u32 = 32;

fn value(block: u64, round: u64) -> Vec<u8> {
    vec![(block * 7 + round) as u8 | 1; BS as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_racing_writers_see_only_written_values() {
    let geometry = SealedDirect::geometry(64, BS).unwrap();
    // Replies delayed and reordered at random make reads and writes overlap.
    let jitter = std::time::Duration::from_millis(3);
    let store: Arc<dyn Store> = Arc::new(JitterStore::new(MemoryStore::new(geometry), jitter, 5));
    let sealer = CellSealer::new(&MasterKey::generate(), StoreId::random(), 0);
    let direct = Arc::new(SealedDirect::new(store, sealer, BS).unwrap());
    let mut tasks = Vec::new();
    // Writer w owns blocks w, w+4, ...; it writes rounds 0..10 of each.
    for w in 0..4u64 {
        let d = Arc::clone(&direct);
        tasks.push(tokio::spawn(async move {
            for round in 0..10 {
                let batch: Vec<(BlockId, Vec<u8>)> =
                    (0..16).map(|i| w + 4 * i).map(|b| (BlockId(b), value(b, round))).collect();
                d.write_many(batch).await.unwrap();
            }
        }));
    }
    for r in 0..4u64 {
        let d = Arc::clone(&direct);
        tasks.push(tokio::spawn(async move {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(r);
            for _ in 0..100 {
                let blocks: Vec<BlockId> = (0..8).map(|_| BlockId(rng.gen_range(0..64))).collect();
                let got = d.read_many(&blocks).await.expect("no integrity error while racing");
                for (b, data) in blocks.iter().zip(got) {
                    let ok = data == vec![0; BS as usize] || (0..10).any(|r| data == value(b.0, r));
                    assert!(ok, "block {} read bytes never written", b.0);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let all: Vec<BlockId> = (0..64).map(BlockId).collect();
    for (b, data) in all.iter().zip(direct.read_many(&all).await.unwrap()) {
        assert_eq!(data, value(b.0, 9), "block {}", b.0);
    }
    let report = direct.verify(|_, _| {}).await.unwrap();
    assert!(report.failures.is_empty() && report.cells_checked == 64, "{report:?}");
}
