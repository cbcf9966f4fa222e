//! The shared engine in front of the crash-consistent Path ORAM: batches, and commits grouped
//! across concurrent callers that still cover every caller's writes.

use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_gateway::engine::{Serialized, SharedEngine};
use blindfold_oram::{BlockId, PathOramConfig};
use blindfold_proxy::{DurablePathOram, SealedPathOram};
use blindfold_store::{CountingStore, MemoryStore, Store};

const BLOCK: u32 = 64;

fn block(writer: u64, i: u64) -> Vec<u8> {
    (0..BLOCK as u64).map(|j| (writer * 131 + i * 7 + j) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_commits_cover_every_callers_writes() {
    let dir = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let config = PathOramConfig::builder(512, BLOCK).build().unwrap();
    let backing: Arc<dyn Store> =
        Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
    let counting = Arc::new(CountingStore::new(Arc::clone(&backing)));
    let oram = DurablePathOram::create(
        dir.path(),
        config,
        counting.clone() as Arc<dyn Store>,
        &key,
        StoreId::random(),
    )
    .await
    .unwrap();
    let engine = Arc::new(Serialized::new(oram));

    // 16 writers, each writing 3 batches of 4 distinct blocks and committing after each.
    let writers = 16u64;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let engine = Arc::clone(&engine);
        tasks.push(tokio::spawn(async move {
            for round in 0..3u64 {
                let batch: Vec<(BlockId, Vec<u8>)> = (0..4)
                    .map(|i| {
                        let b = w * 12 + round * 4 + i;
                        (BlockId(b), block(w, round * 4 + i))
                    })
                    .collect();
                engine.write_many(batch).await.unwrap();
                engine.commit().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let flushes = counting.counts().flushes;
    assert!(flushes >= 1, "commits must reach the store");
    eprintln!("{} commits requested, {flushes} store flushes", writers * 3);

    // Crash: no shutdown, no checkpoint. Every acknowledged commit must survive a reopen.
    drop(engine);
    let (oram, _) = DurablePathOram::open(dir.path(), backing, &key).await.unwrap();
    let engine = Serialized::new(oram);
    for w in 0..writers {
        let ids: Vec<BlockId> = (0..12).map(|i| BlockId(w * 12 + i)).collect();
        let got = engine.read_many(&ids).await.unwrap();
        for (i, data) in got.into_iter().enumerate() {
            assert_eq!(data, block(w, i as u64), "writer {w} block {i}");
        }
    }
}

#[tokio::test]
async fn batches_must_name_distinct_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let config = PathOramConfig::builder(64, BLOCK).build().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
    let oram =
        DurablePathOram::create(dir.path(), config, store, &key, StoreId::random()).await.unwrap();
    let engine = Serialized::new(oram);
    let twice = vec![(BlockId(3), vec![1; 64]), (BlockId(3), vec![2; 64])];
    assert!(engine.write_many(twice).await.is_err());
    assert!(engine.read_many(&[BlockId(1), BlockId(2), BlockId(1)]).await.is_err());
    engine.write_many(vec![(BlockId(3), vec![9; 64])]).await.unwrap();
    assert_eq!(engine.read_many(&[BlockId(3)]).await.unwrap(), vec![vec![9; 64]]);
}
