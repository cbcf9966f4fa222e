//! Onion ORAM over sealed stores with real Damgård–Jurik (small keys: the arithmetic is the
//! same at every size): agreement with a `HashMap`, tampering, swapping and rollback of data
//! and metadata detected.
#![cfg(feature = "onion")]

use std::collections::HashMap;
use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_dj::SecretKey;
use blindfold_oram::{BlockId, OnionOram, OnionOramConfig};
use blindfold_proxy::{ProxyError, SealedOnionOram};
use blindfold_store::{CellId, MemoryStore, SelectStore, Store};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

const BS: u32 = 24;

struct Fixture {
    oram: SealedOnionOram,
    meta: Arc<MemoryStore>,
    data: Arc<MemoryStore>,
    config: OnionOramConfig,
}

fn fixture(blocks: u64, height: u32, seed: u64) -> Fixture {
    fixture_at(blocks, height, seed, OnionOramConfig::DEFAULT_FIRST_LAYER)
}

/// A fixture whose blocks start at Damgård–Jurik layer `first_layer`.
fn fixture_at(blocks: u64, height: u32, seed: u64, first_layer: u32) -> Fixture {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let key = SecretKey::generate(256, &mut rng).unwrap();
    let config = OnionOramConfig::builder(blocks, BS)
        .height(height)
        .first_layer(first_layer)
        .build()
        .unwrap();
    let meta = Arc::new(MemoryStore::new(SealedOnionOram::meta_geometry(&config).unwrap()));
    let data =
        Arc::new(MemoryStore::new(SealedOnionOram::data_geometry(&config, key.public()).unwrap()));
    let sealer = CellSealer::new(&MasterKey::generate(), StoreId::random(), 0);
    let oram = SealedOnionOram::new(
        OnionOram::with_seed(config.clone(), seed),
        meta.clone() as Arc<dyn Store>,
        data.clone() as Arc<dyn SelectStore>,
        sealer,
        key,
    )
    .unwrap();
    Fixture { oram, meta, data, config }
}

fn block(i: u32) -> Vec<u8> {
    (0..BS).map(|k| (i * 7 + k) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agrees_with_a_hashmap() {
    agrees_with_a_hashmap_at(OnionOramConfig::DEFAULT_FIRST_LAYER).await;
}

/// The same with Paillier chunks (`s0 = 1`, the layout before the first layer was
/// configurable) and with chunks of four layers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agrees_with_a_hashmap_at_other_first_layers() {
    agrees_with_a_hashmap_at(1).await;
    agrees_with_a_hashmap_at(4).await;
}

async fn agrees_with_a_hashmap_at(first_layer: u32) {
    let mut fx = fixture_at(12, 2, 1, first_layer);
    // A slot at depth d holds ciphertexts of layer s0 + d - 1, and blocks are cut into
    // plaintexts of layer s0.
    let pk = fx.oram.public_key().clone();
    let chunks =
        (BS as usize + CellSealer::OVERHEAD).div_ceil(pk.plaintext_chunk_len(first_layer).unwrap());
    assert_eq!(SealedOnionOram::chunks(&fx.config, &pk).unwrap(), chunks);
    for d in 1..=fx.config.max_depth() {
        assert_eq!(
            SealedOnionOram::slot_len(&fx.config, &pk, d).unwrap(),
            chunks * pk.ciphertext_len(first_layer + d - 1).unwrap()
        );
    }
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut rng = ChaCha20Rng::seed_from_u64(2);
    // 90 accesses: 30 evictions, every leaf stripped several times, blocks found in every
    // kind of slot (root, halves, stripped areas).
    for i in 0..90u32 {
        let b = rng.gen_range(0..12u64);
        let expected = model.get(&b).cloned().unwrap_or(vec![0; BS as usize]);
        if rng.gen_bool(0.5) {
            let old = fx.oram.access(BlockId(b), Some(block(i))).await.unwrap();
            assert_eq!(old, expected, "write {i} of block {b}");
            model.insert(b, block(i));
        } else {
            assert_eq!(fx.oram.read(BlockId(b)).await.unwrap(), expected, "read {i} of block {b}");
        }
    }
    let stats = fx.oram.oram().stats().clone();
    assert_eq!(stats.evictions, 30);
    assert_eq!(stats.accesses, 90);
    let t = fx.oram.phase_times();
    assert!(
        t.server_select > std::time::Duration::ZERO
            && t.eviction_select > std::time::Duration::ZERO
    );
    // Every slot's bytes are ciphertexts, never the block in clear.
    let cells =
        fx.data.read(&(0..fx.config.data_cells()).map(CellId).collect::<Vec<_>>()).await.unwrap();
    for (i, bytes) in model.values().enumerate() {
        assert!(
            !cells.iter().any(|c| c.windows(bytes.len()).any(|w| w == bytes.as_slice())),
            "block {i} in clear"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_writes_are_refused_without_harm() {
    let mut fx = fixture(4, 1, 3);
    let err = fx.oram.write(BlockId(0), vec![1; 3]).await.unwrap_err();
    assert!(matches!(err, ProxyError::Oram(_)), "{err}");
    let err = fx.oram.read(BlockId(4)).await.unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    fx.oram.write(BlockId(1), block(1)).await.unwrap();
    assert_eq!(fx.oram.read(BlockId(1)).await.unwrap(), block(1));
}

/// Writes block 0 and returns the fixture right after (the block sits in root slot 0 under
/// one layer; no eviction yet with A = 3).
async fn written() -> Fixture {
    let mut fx = fixture(4, 1, 5);
    fx.oram.write(BlockId(0), block(9)).await.unwrap();
    fx
}

fn assert_integrity(r: Result<Vec<u8>, ProxyError>, what: &str) {
    match r {
        Err(e) if e.is_integrity() => {}
        other => panic!("{what}: expected an integrity error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_data_is_detected() {
    let mut fx = written().await;
    let root0 = fx.config.cell(blindfold_oram::BucketId(0), 0);
    let mut bytes = fx.data.read(&[root0]).await.unwrap().remove(0);
    // Change one ciphertext of the block into another valid-looking one: multiply the first
    // chunk's value by 1 (no change) is useless; flip a low bit instead (still below n^2).
    let clen = fx.oram.public_key().ciphertext_len(fx.config.layer(1)).unwrap();
    bytes[clen - 1] ^= 1;
    fx.data.write(vec![(root0, bytes)]).await.unwrap();
    assert_integrity(fx.oram.read(BlockId(0)).await, "flipped bit in a slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapped_slots_are_detected() {
    let mut fx = fixture(4, 1, 6);
    fx.oram.write(BlockId(0), block(1)).await.unwrap();
    fx.oram.write(BlockId(1), block(2)).await.unwrap();
    // Root slots 0 and 1 hold blocks 0 and 1: swap their cells.
    let (a, b) = (
        fx.config.cell(blindfold_oram::BucketId(0), 0),
        fx.config.cell(blindfold_oram::BucketId(0), 1),
    );
    let cells = fx.data.read(&[a, b]).await.unwrap();
    fx.data.write(vec![(a, cells[1].clone()), (b, cells[0].clone())]).await.unwrap();
    assert_integrity(fx.oram.read(BlockId(0)).await, "swapped slots");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_data_is_detected() {
    let mut fx = fixture(4, 1, 7);
    fx.oram.write(BlockId(2), block(1)).await.unwrap(); // root slot 0
    let root0 = fx.config.cell(blindfold_oram::BucketId(0), 0);
    let old = fx.data.read(&[root0]).await.unwrap().remove(0);
    // Two more accesses, an eviction, and block 2 rewritten into root slot 0 again.
    fx.oram.write(BlockId(3), block(2)).await.unwrap();
    fx.oram.write(BlockId(1), block(3)).await.unwrap();
    fx.oram.write(BlockId(2), block(4)).await.unwrap();
    let meta_root = fx.meta.read(&[CellId(0)]).await.unwrap().remove(0);
    let _ = meta_root;
    // The store brings back the first version of block 2's slot.
    fx.data.write(vec![(root0, old)]).await.unwrap();
    assert_integrity(fx.oram.read(BlockId(2)).await, "rolled-back slot");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_or_rolled_back_metadata_is_detected() {
    let mut fx = written().await;
    let mut m = fx.meta.read(&[CellId(0)]).await.unwrap().remove(0);
    m[20] ^= 4;
    fx.meta.write(vec![(CellId(0), m)]).await.unwrap();
    assert_integrity(fx.oram.read(BlockId(0)).await, "tampered metadata");

    let mut fx = written().await;
    let before = fx.meta.read(&[CellId(0)]).await.unwrap().remove(0);
    fx.oram.write(BlockId(1), block(3)).await.unwrap();
    fx.meta.write(vec![(CellId(0), before)]).await.unwrap();
    assert_integrity(fx.oram.read(BlockId(1)).await, "rolled-back metadata");

    // Swapping two buckets' metadata cells (leaves 1 and 2 of a height-1 tree).
    let mut fx = written().await;
    fx.oram.read(BlockId(3)).await.unwrap();
    fx.oram.read(BlockId(3)).await.unwrap(); // eviction: leaves now hold metadata
    let cells = fx.meta.read(&[CellId(1), CellId(2)]).await.unwrap();
    fx.meta
        .write(vec![(CellId(1), cells[1].clone()), (CellId(2), cells[0].clone())])
        .await
        .unwrap();
    let mut failed = false;
    for b in 0..4 {
        if let Err(e) = fx.oram.read(BlockId(b)).await {
            assert!(e.is_integrity(), "{e}");
            failed = true;
            break;
        }
    }
    assert!(failed, "swapped metadata went unnoticed");
}
