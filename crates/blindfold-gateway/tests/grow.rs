//! Growing a gateway's store in its data directory (`blindfold grow`, `serve --grow-at`):
//! objects survive (checked against a model), the new room takes objects, requests during the
//! growth wait and succeed, a crash at any step loses nothing and the next start finishes the
//! growth, a damaged store stops it with nothing changed, and `recover` finds the grown state.

use std::collections::BTreeMap;
use std::path::Path;

use blindfold_gateway::grow::CrashPoint;
use blindfold_gateway::server::{self, OramEngine, ServeConfig};
use blindfold_gateway::GatewayError;
use bytes::Bytes;

const BLOCK: u32 = 1024;
/// 48 blocks to start with.
const CAPACITY: u64 = 48 * BLOCK as u64;

use crate::common;

fn cfg(root: &Path, engine: OramEngine) -> ServeConfig {
    ServeConfig { capacity: CAPACITY, ..common::file_cfg(root, engine) }
}

async fn put(opened: &server::Opened, key: &str, data: &[u8]) -> Result<(), GatewayError> {
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data.to_vec()))]);
    opened.objects.put_object("b", key, body, None, BTreeMap::new(), false).await.map(|_| ())
}

async fn get(opened: &server::Opened, key: &str) -> Vec<u8> {
    common::read_object(opened, key).await.unwrap()
}

fn object(i: usize) -> Vec<u8> {
    (0..3000 + i * 7).map(|j| (i * 31 + j) as u8).collect()
}

/// Puts objects until the store is full; returns the model.
async fn fill(opened: &server::Opened) -> BTreeMap<String, Vec<u8>> {
    opened.objects.directory().create_bucket("b").unwrap();
    let mut model = BTreeMap::new();
    for i in 0.. {
        let data = object(i);
        match put(opened, &format!("k{i}"), &data).await {
            Ok(()) => {
                model.insert(format!("k{i}"), data);
            }
            Err(GatewayError::Full { .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(model.len() >= 10, "{}", model.len());
    model
}

async fn check(opened: &server::Opened, model: &BTreeMap<String, Vec<u8>>) {
    for (k, v) in model {
        assert_eq!(&get(opened, k).await, v, "{k}");
    }
    let report = blindfold_gateway::verify::verify(opened, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
}

async fn stop(opened: server::Opened) {
    opened.objects.shutdown().await.unwrap();
    server::write_snapshot(&opened).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_path_oram_store_grows_while_serving() {
    grows_while_serving(OramEngine::PathOram).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tao_store_grows_while_serving() {
    grows_while_serving(OramEngine::Tao).await;
}

/// ObliviStore and both kinds of CURIOUS: every block to a fresh partition of the larger
/// engine.
/// Refused ("the tee engine cannot grow its store yet") until 2026-11-28.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_tee_store_grows_while_serving() {
    grows_while_serving(OramEngine::Tee).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_partition_engine_stores_grow_while_serving() {
    for engine in [OramEngine::ObliviStore, OramEngine::Curious, OramEngine::CuriousPath] {
        grows_while_serving(engine).await;
    }
}

/// The same over the real S3 (MinIO) and Redis servers the test script starts: the arrays are
/// new objects / keys there, and the old ones stay (those stores do not delete arrays).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_store_grows_over_real_s3_and_redis() {
    if let Some(url) = blindfold_testkit::servers::s3_url("gateway-grow-s3", "") {
        grows_on(OramEngine::Tao, Some(url)).await;
    }
    if let Some(url) = common::redis_url("gateway-grow-redis") {
        grows_on(OramEngine::PathOram, Some(url)).await;
    }
}

async fn grows_while_serving(engine: OramEngine) {
    grows_on(engine, None).await;
}

/// The tao engine's tree stored two levels per store object: the growth, the restart and the
/// `recover` after it keep the packing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_packed_tao_store_grows_while_serving() {
    grows_packed(OramEngine::Tao, None, 2).await;
}

/// `store`: `None` for files under the test's directory.
async fn grows_on(engine: OramEngine, store: Option<blindfold_store::StoreUrl>) {
    grows_packed(engine, store, 1).await;
}

async fn grows_packed(engine: OramEngine, store: Option<blindfold_store::StoreUrl>, pack: u32) {
    let root = tempfile::tempdir().unwrap();
    let file_store = store.is_none();
    // File and S3 stores remove an array nothing uses any more; Redis keeps it.
    let removes = file_store || matches!(store, Some(blindfold_store::StoreUrl::S3 { .. }));
    let cfg = |root: &Path, engine| match &store {
        // Growing while serving is for `--durability local` (refused under `store`).
        Some(url) => ServeConfig {
            store: Some(url.clone()),
            pack_levels: pack,
            durability: server::Durability::Local,
            ..cfg(root, engine)
        },
        None => ServeConfig { pack_levels: pack, ..cfg(root, engine) },
    };
    let opened = server::open(&cfg(root.path(), engine)).await.unwrap();
    if pack > 1 {
        // The packed tree's cache of groups counts in the trusted-memory estimate: on a store
        // this small, room for all of them (half the two-slot store).
        let packed = server::footprint(&opened.params).unwrap();
        let flat =
            server::footprint(&server::GatewayParams { pack_levels: 1, ..opened.params.clone() })
                .unwrap();
        assert_eq!(packed.trusted_bytes - flat.trusted_bytes, packed.oram_bytes / 2);
    }
    let mut model = fill(&opened).await;
    let grower = opened.grower.clone().unwrap();
    let blocks = opened.params.blocks;
    // Readers keep reading through the growth: they wait, and get the right bytes.
    let readers: Vec<_> = (0..3)
        .map(|r| {
            let objects = std::sync::Arc::clone(&opened.objects);
            let model = model.clone();
            tokio::spawn(async move {
                for round in 0..20 {
                    let (k, v) = model.iter().nth((r * 7 + round) % model.len()).unwrap();
                    let meta = objects.directory().object("b", k).unwrap().unwrap();
                    let mut rx = objects.read_range(&meta, 0..meta.size, 0).await.unwrap();
                    let mut out = Vec::new();
                    while let Some(c) = rx.recv().await {
                        out.extend_from_slice(&c.unwrap());
                    }
                    assert_eq!(&out, v, "{k}");
                }
            })
        })
        .collect();
    let grown = grower.grow(blocks * 4).await.unwrap();
    for r in readers {
        r.await.unwrap();
    }
    assert_eq!(grown.to_blocks, blocks * 4);
    assert_eq!(opened.objects.directory().capacity(), blocks * 4);
    assert_eq!(server::read_params(&root.path().join("data")).unwrap().unwrap().blocks, blocks * 4);
    assert!(!root.path().join("data").join(blindfold_gateway::grow::INTENT_FILE).exists());
    // The old tree's array is gone from a file or S3 store; the new one is there.
    assert_eq!(grown.old_array_removed, removes, "{grown:?}");
    if file_store {
        assert!(!root.path().join("cells").join("oram.cells").exists());
        assert!(root.path().join("cells").join(format!("{}.cells", grown.new_array)).exists());
    }
    check(&opened, &model).await;
    // The new room takes objects.
    for i in 1000..1000 + model.len() {
        let data = object(i);
        put(&opened, &format!("k{i}"), &data).await.unwrap();
        model.insert(format!("k{i}"), data);
    }
    // Shrinking is refused, with nothing changed.
    let e = grower.grow(blocks).await.unwrap_err();
    assert!(e.to_string().contains("shrinking is not supported"), "{e}");
    drop(grower);
    stop(opened).await;
    let opened = server::open(&cfg(root.path(), engine)).await.unwrap();
    assert_eq!(opened.params.blocks, blocks * 4);
    assert_eq!(opened.params.tao_pack_levels(), pack);
    check(&opened, &model).await;
    stop(opened).await;

    // The snapshot in the store is the grown one: `recover` brings back every object.
    let mut rcfg = cfg(root.path(), engine);
    rcfg.data_dir = root.path().join("recovered");
    let (opened, _) = server::recover(&rcfg).await.unwrap();
    assert_eq!(opened.params.blocks, blocks * 4);
    assert_eq!(opened.params.tao_pack_levels(), pack);
    check(&opened, &model).await;
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// A crash at each step of a growth (the process dies: nothing is shut down) loses no object,
/// and the next start finishes the growth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_any_step_of_a_growth_loses_nothing() {
    for engine in [
        OramEngine::PathOram,
        OramEngine::Tao,
        OramEngine::ObliviStore,
        OramEngine::Curious,
        OramEngine::CuriousPath,
        OramEngine::Tee,
    ] {
        for at in [
            CrashPoint::AfterIntent,
            CrashPoint::HalfWritten,
            CrashPoint::AfterCheckpoint,
            CrashPoint::AfterParams,
        ] {
            let root = tempfile::tempdir().unwrap();
            let opened = server::open(&cfg(root.path(), engine)).await.unwrap();
            let mut model = fill(&opened).await;
            let blocks = opened.params.blocks;
            let grower = opened.grower.clone().unwrap();
            grower.crash_at(Some(at));
            grower.grow(blocks * 2).await.unwrap_err();
            drop(grower);
            drop(opened);
            let opened = server::open(&cfg(root.path(), engine)).await.unwrap();
            assert!(
                opened.notes.iter().any(|n| n.contains("growth")),
                "{engine} {at:?}: {:?}",
                opened.notes
            );
            assert_eq!(opened.params.blocks, blocks * 2, "{engine} {at:?}");
            assert_eq!(opened.objects.directory().capacity(), blocks * 2);
            check(&opened, &model).await;
            put(&opened, "after", &object(7)).await.unwrap();
            model.insert("after".into(), object(7));
            stop(opened).await;
            // Once a snapshot of the grown state is in the store, only the new tree's array is.
            let trees: Vec<String> = std::fs::read_dir(root.path().join("cells"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("oram"))
                .collect();
            assert_eq!(trees, ["oram.g1.cells"], "{engine} {at:?}");
            let opened = server::open(&cfg(root.path(), engine)).await.unwrap();
            check(&opened, &model).await;
        }
    }
}

/// A store whose cells do not authenticate is not grown: the gateway serves on at its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_store_is_not_grown() {
    damaged_store_is_not_grown(OramEngine::PathOram).await;
    damaged_store_is_not_grown(OramEngine::CuriousPath).await;
    damaged_store_is_not_grown(OramEngine::Tee).await;
}

async fn damaged_store_is_not_grown(engine: OramEngine) {
    use blindfold_store::{CellId, Store};
    let root = tempfile::tempdir().unwrap();
    let opened = server::open(&cfg(root.path(), engine)).await.unwrap();
    let model = fill(&opened).await;
    let blocks = opened.params.blocks;
    stop(opened).await;
    // Damage (then repair) every written cell of the ORAM's array, the gateway stopped.
    let damage = || async {
        let file = blindfold_store::FileStore::open_existing(
            root.path().join("cells").join("oram.cells"),
            blindfold_store::SyncMode::OnFlush,
        )
        .unwrap();
        let cells: Vec<CellId> = (0..file.geometry().cell_count()).map(CellId).collect();
        let all = file.read(&cells).await.unwrap();
        let mut written: Vec<_> =
            cells.into_iter().zip(all).filter(|(_, d)| d.iter().any(|&b| b != 0)).collect();
        written.iter_mut().for_each(|(_, d)| d[50] ^= 1);
        file.write(written).await.unwrap();
        file.flush().await.unwrap();
    };
    damage().await;
    let opened = server::open(&cfg(root.path(), engine)).await.unwrap();
    let e = opened.grower.clone().unwrap().grow(blocks * 2).await.unwrap_err();
    assert!(e.to_string().contains("do not authenticate"), "{e}");
    let data = root.path().join("data");
    assert_eq!(server::read_params(&data).unwrap().unwrap().blocks, blocks);
    assert!(!data.join(blindfold_gateway::grow::INTENT_FILE).exists());
    assert_eq!(opened.objects.directory().capacity(), blocks);
    opened.objects.shutdown().await.unwrap();
    drop(opened);
    damage().await;
    // Repaired, the store serves at its size, and grows.
    let opened = server::open(&cfg(root.path(), engine)).await.unwrap();
    check(&opened, &model).await;
    opened.grower.clone().unwrap().grow(blocks * 2).await.unwrap();
    check(&opened, &model).await;
}
