//! Sealed Ring ORAM and XOR Ring ORAM: a `HashMap` model over a grid of parameters, and
//! tampering, swapping and rollback of metadata and slots, all detected.

use std::collections::HashMap;
use std::sync::Arc;

use blindfold_crypto::{CellSealer, MasterKey, StoreId, XorPads};
use blindfold_oram::{BlockId, Op, RingOram, RingOramConfig, RingVariant};
use blindfold_proxy::{ProxyError, RingData, SealedRingOram};
use blindfold_store::{CellId, MemoryStore, Store, XorStore};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

struct Setup {
    oram: SealedRingOram,
    meta: Arc<MemoryStore>,
    data: Arc<MemoryStore>,
}

fn setup(config: RingOramConfig, seed: u64) -> Setup {
    let meta = Arc::new(MemoryStore::new(SealedRingOram::meta_geometry(&config).unwrap()));
    let data = Arc::new(MemoryStore::new(SealedRingOram::data_geometry(&config).unwrap()));
    let key = MasterKey::generate();
    let id = StoreId::random();
    let (ring_data, pads) = match config.variant() {
        RingVariant::Ring => (RingData::Plain(data.clone() as Arc<dyn Store>), None),
        RingVariant::XorRing => {
            (RingData::Xor(data.clone() as Arc<dyn XorStore>), Some(XorPads::new(&key, id, 3)))
        }
    };
    let oram = SealedRingOram::with_oram(
        RingOram::with_seed(config, seed),
        meta.clone(),
        ring_data,
        CellSealer::new(&key, id, 3),
        pads,
    )
    .unwrap();
    Setup { oram, meta, data }
}

fn block(i: u64, bs: usize) -> Vec<u8> {
    (0..bs).map(|j| (i as u8).wrapping_mul(31).wrapping_add(j as u8)).collect()
}

#[tokio::test]
async fn model_over_a_grid() {
    let mut seed = 0;
    for variant in [RingVariant::Ring, RingVariant::XorRing] {
        for (blocks, bs, z, s, a, bulk) in [
            (64, 32, 4, 2, 3, false),
            (64, 32, 4, 5, 3, true),
            (100, 16, 2, 3, 2, true),
            (150, 24, 8, 12, 8, false),
        ] {
            seed += 1;
            let config = RingOramConfig::builder(blocks, bs)
                .z(z)
                .s(s)
                .a(a)
                .variant(variant)
                .build()
                .unwrap();
            let mut st = setup(config.clone(), seed);
            let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
            if bulk {
                st.oram.bulk_load(|b| block(b.0, bs as usize)).await.unwrap();
                model.extend((0..blocks).map(|b| (b, block(b, bs as usize))));
            }
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for i in 0..250 {
                let b = if i % 2 == 0 { rng.gen_range(0..blocks) } else { rng.gen_range(0..4) };
                let expect = model.get(&b).cloned().unwrap_or_else(|| vec![0; bs as usize]);
                if rng.gen_bool(0.4) {
                    let d: Vec<u8> = (0..bs).map(|_| rng.gen()).collect();
                    let old = st.oram.access(BlockId(b), Op::Write(d.clone())).await.unwrap();
                    assert_eq!(old, expect, "{config:?} op {i}");
                    model.insert(b, d);
                } else {
                    assert_eq!(
                        st.oram.read(BlockId(b)).await.unwrap(),
                        expect,
                        "{config:?} op {i}"
                    );
                }
            }
            // The trusted state survives an export and import.
            let state = st.oram.export_state().unwrap();
            assert_eq!(state.meta_versions.len(), config.buckets());
        }
    }
}

async fn fresh(variant: RingVariant) -> Setup {
    let config = RingOramConfig::builder(64, 32).z(4).s(2).a(3).variant(variant).build().unwrap();
    let mut st = setup(config, 9);
    st.oram.bulk_load(|b| block(b.0, 32)).await.unwrap();
    st
}

async fn all_cells(store: &MemoryStore) -> Vec<Vec<u8>> {
    let ids: Vec<CellId> = (0..store.geometry().cell_count()).map(CellId).collect();
    store.read(&ids).await.unwrap()
}

async fn put_all(store: &MemoryStore, cells: Vec<Vec<u8>>) {
    store
        .write(cells.into_iter().enumerate().map(|(i, c)| (CellId(i as u64), c)).collect())
        .await
        .unwrap();
}

/// Runs accesses until one fails; every successful one must return correct data.
async fn expect_integrity_error(st: &mut Setup, what: &str) {
    for i in 0..64u64 {
        match st.oram.read(BlockId(i)).await {
            Ok(d) => assert_eq!(d, block(i, 32), "{what}: wrong data instead of an error"),
            Err(e) => {
                assert!(e.is_integrity(), "{what}: {e:?}");
                assert!(matches!(st.oram.read(BlockId(0)).await, Err(ProxyError::Poisoned)));
                return;
            }
        }
    }
    panic!("{what}: tampering went unnoticed for 64 accesses");
}

#[tokio::test]
async fn tampering_with_metadata_or_slots_is_detected() {
    for variant in [RingVariant::Ring, RingVariant::XorRing] {
        // A flipped byte in every metadata cell.
        let mut st = fresh(variant).await;
        let cells = all_cells(&st.meta).await;
        put_all(
            &st.meta,
            cells
                .into_iter()
                .map(|mut c| {
                    c[40] ^= 1;
                    c
                })
                .collect(),
        )
        .await;
        expect_integrity_error(&mut st, &format!("{variant:?} meta flip")).await;

        // A flipped byte in every slot of every bucket.
        let mut st = fresh(variant).await;
        let slot = SealedRingOram::data_geometry(st.oram.oram().config()).unwrap().cell_size()
            as usize
            / 6;
        let cells = all_cells(&st.data).await;
        let flipped = cells.into_iter().map(|mut c| {
            for k in 0..6 {
                c[k * slot + slot / 2] ^= 0x80;
            }
            c
        });
        put_all(&st.data, flipped.collect()).await;
        expect_integrity_error(&mut st, &format!("{variant:?} slot flip")).await;

        // Two slots of every bucket swapped.
        let mut st = fresh(variant).await;
        let cells = all_cells(&st.data).await;
        let swapped = cells.into_iter().map(|c| {
            let mut out = c.clone();
            for k in 0..6 {
                let from = (k + 1) % 6;
                out[k * slot..(k + 1) * slot].copy_from_slice(&c[from * slot..(from + 1) * slot]);
            }
            out
        });
        put_all(&st.data, swapped.collect()).await;
        expect_integrity_error(&mut st, &format!("{variant:?} slot swap")).await;

        // Two buckets' metadata swapped.
        let mut st = fresh(variant).await;
        let mut cells = all_cells(&st.meta).await;
        let n = cells.len();
        for i in 0..n / 2 {
            cells.swap(i, n - 1 - i);
        }
        put_all(&st.meta, cells).await;
        expect_integrity_error(&mut st, &format!("{variant:?} meta swap")).await;
    }
}

#[tokio::test]
async fn rollback_is_detected() {
    for variant in [RingVariant::Ring, RingVariant::XorRing] {
        for whole in [true, false] {
            let mut st = fresh(variant).await;
            let (meta, data) = (all_cells(&st.meta).await, all_cells(&st.data).await);
            for i in 0..30 {
                st.oram.write(BlockId(i), block(i, 32)).await.unwrap();
            }
            // Roll back everything, or only the slots (the metadata stays current).
            if whole {
                put_all(&st.meta, meta).await;
            }
            put_all(&st.data, data).await;
            expect_integrity_error(&mut st, &format!("{variant:?} rollback whole={whole}")).await;
        }
    }
}

#[tokio::test]
async fn xor_ring_needs_an_xor_store_and_pads() {
    let config = RingOramConfig::builder(16, 8).variant(RingVariant::XorRing).build().unwrap();
    let meta = Arc::new(MemoryStore::new(SealedRingOram::meta_geometry(&config).unwrap()));
    let data: Arc<dyn Store> =
        Arc::new(MemoryStore::new(SealedRingOram::data_geometry(&config).unwrap()));
    let key = MasterKey::generate();
    let id = StoreId::random();
    let err = SealedRingOram::new(
        config.clone(),
        meta.clone(),
        RingData::Plain(data),
        CellSealer::new(&key, id, 0),
        Some(XorPads::new(&key, id, 0)),
    )
    .unwrap_err();
    assert!(err.to_string().contains("XOR"), "{err}");
    let data: Arc<dyn XorStore> =
        Arc::new(MemoryStore::new(SealedRingOram::data_geometry(&config).unwrap()));
    assert!(SealedRingOram::new(
        config,
        meta,
        RingData::Xor(data),
        CellSealer::new(&key, id, 0),
        None
    )
    .is_err());
}
