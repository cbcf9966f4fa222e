//! Rebuilding a gateway from the untrusted store and the key alone.

use std::collections::BTreeMap;

use blindfold_gateway::server::{self, OramEngine, ServeConfig};
use blindfold_store::StoreUrl;
use bytes::Bytes;

fn cfg_with(
    data: &std::path::Path,
    cells: &std::path::Path,
    key: &std::path::Path,
    engine: OramEngine,
) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data.to_path_buf(),
        store: Some(StoreUrl::File {
            dir: cells.to_path_buf(),
            sync: blindfold_store::SyncMode::OnFlush,
        }),
        key_file: Some(key.to_path_buf()),
        passphrase: None,
        credentials: Some(("ak".into(), "sk".into())),
        capacity: 1 << 20,
        block_size: 1024,
        pad_objects: false,
        // Small, so that some levels are cached and the rest are in the store: recovery
        // must bring back both.
        cache_mib: 1,
        engine,
        in_place: false,
        pack_levels: 1,
        durability: Default::default(),
        lease_ttl: None,
        anchor: None,
        reads_ahead_of_log: false,
        log_feed: None,
    }
}

async fn read_all(opened: &server::Opened, key: &str) -> Vec<u8> {
    let meta = opened.objects.directory().object("b", key).unwrap().expect("object");
    let mut rx = opened.objects.read_range(&meta, 0..meta.size, 0).await.unwrap();
    let mut out = Vec::new();
    while let Some(c) = rx.recv().await {
        out.extend_from_slice(&c.unwrap());
    }
    out
}

#[tokio::test]
async fn recover_from_store_and_key_alone() {
    recover_with(OramEngine::PathOram).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_the_tao_engine_from_store_and_key_alone() {
    recover_with(OramEngine::Tao).await;
}

/// The TEE engine: its cells are opened in the gateway and a fresh tree is bulk-loaded under a
/// fresh store id. Refused ("cannot rebuild a tee engine's data directory yet") until
/// 2026-11-28.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_the_tee_engine_from_store_and_key_alone() {
    recover_with(OramEngine::Tee).await;
}

/// ObliviStore and both kinds of CURIOUS: their partitions are rebuilt into a new array.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_the_partition_engines_from_store_and_key_alone() {
    for engine in [OramEngine::ObliviStore, OramEngine::Curious, OramEngine::CuriousPath] {
        recover_with(engine).await;
    }
}

async fn recover_with(engine: OramEngine) {
    let cfg =
        |d: &std::path::Path, c: &std::path::Path, k: &std::path::Path| cfg_with(d, c, k, engine);
    let root = tempfile::tempdir().unwrap();
    let cells = root.path().join("cells");
    let key = root.path().join("key.json");
    let first = root.path().join("data1");
    let mut objects = BTreeMap::new();
    {
        let opened = server::open(&cfg(&first, &cells, &key)).await.unwrap();
        opened.objects.directory().create_bucket("b").unwrap();
        for i in 0..20u8 {
            let data = vec![i; 500 + i as usize * 300];
            let body =
                futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data.clone()))]);
            opened
                .objects
                .put_object("b", &format!("k{i}"), body, None, BTreeMap::new(), false)
                .await
                .unwrap();
            objects.insert(format!("k{i}"), data);
        }
        opened.objects.delete_object("b", "k3").await.unwrap();
        objects.remove("k3");
        opened.objects.shutdown().await.unwrap();
        server::write_snapshot(&opened).await.unwrap();
    }
    // The gateway's machine is lost: only the store (cells/) and the key survive.
    std::fs::remove_dir_all(&first).unwrap();
    let second = root.path().join("data2");
    let (opened, about) = server::recover(&cfg(&second, &cells, &key)).await.unwrap();
    assert!(about.contains("20 objects") || about.contains("19 objects"), "{about}");
    for (k, v) in &objects {
        assert_eq!(&read_all(&opened, k).await, v, "{k}");
    }
    assert!(opened.objects.directory().object("b", "k3").unwrap().is_none());
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    // New writes work after recovery.
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(b"after"))]);
    opened.objects.put_object("b", "new", body, None, BTreeMap::new(), false).await.unwrap();
    assert_eq!(read_all(&opened, "new").await, b"after");
    drop(opened);

    // Recovery refuses to overwrite an existing data directory, and needs the right key.
    assert!(server::recover(&cfg(&second, &cells, &key)).await.is_err());
    let other_key = root.path().join("other.json");
    blindfold_crypto::create_key_file(&other_key, None).unwrap();
    let third = root.path().join("data3");
    let e = server::recover(&cfg(&third, &cells, &other_key)).await.unwrap_err();
    assert!(e.to_string().contains("another key"), "{e}");
}

async fn try_read_all(opened: &server::Opened, key: &str) -> Result<Vec<u8>, String> {
    let meta = opened.objects.directory().object("b", key).map_err(|e| e.to_string())?;
    let meta = meta.ok_or("no such object")?;
    let mut rx =
        opened.objects.read_range(&meta, 0..meta.size, 0).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    while let Some(c) = rx.recv().await {
        out.extend_from_slice(&c.map_err(|e| e.to_string())?);
    }
    Ok(out)
}

async fn put(opened: &server::Opened, key: &str, data: Vec<u8>) {
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data))]);
    opened.objects.put_object("b", key, body, None, BTreeMap::new(), false).await.unwrap();
}

/// Every cell of the store array `name` in `cells`, read through a file store of its own.
fn array_file(cells: &std::path::Path, name: &str) -> blindfold_store::FileStore {
    blindfold_store::FileStore::open_existing(
        cells.join(format!("{name}.cells")),
        blindfold_store::SyncMode::OnFlush,
    )
    .unwrap()
}

fn oram_array_of(data: &std::path::Path) -> String {
    let params: serde_json::Value =
        serde_json::from_slice(&std::fs::read(data.join("gateway.json")).unwrap()).unwrap();
    match params.get("generation").and_then(|g| g.as_u64()).unwrap_or(0) {
        0 => "oram".to_owned(),
        n => format!("oram.g{n}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_timeline_ciphertexts_never_authenticate_after_recover_tao() {
    lost_timeline_substitution(OramEngine::Tao).await;
}

#[tokio::test]
async fn lost_timeline_ciphertexts_never_authenticate_after_recover_path_oram() {
    lost_timeline_substitution(OramEngine::PathOram).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_timeline_ciphertexts_never_authenticate_after_recover_partition_and_tee_engines() {
    for engine in
        [OramEngine::ObliviStore, OramEngine::Curious, OramEngine::CuriousPath, OramEngine::Tee]
    {
        lost_timeline_substitution(engine).await;
    }
}

/// A gateway stops cleanly (snapshot S), then goes on writing and is lost (the lost
/// timeline). `recover` from S, the same workload again, and then the store puts the lost
/// timeline's ciphertexts back in place of the recovered ones: none may authenticate, and no
/// read may return the lost timeline's data.
///
/// Failed before recover sealed under a fresh epoch that each cell must name exactly: the
/// recovered run sealed under the same epoch and versions as the lost run, and the lost run's
/// cells whose version matched (the root bucket at least) authenticated.
async fn lost_timeline_substitution(engine: OramEngine) {
    use blindfold_store::{CellId, Store};
    let cfg =
        |d: &std::path::Path, c: &std::path::Path, k: &std::path::Path| cfg_with(d, c, k, engine);
    let root = tempfile::tempdir().unwrap();
    let cells = root.path().join("cells");
    let key = root.path().join("key.json");
    let first = root.path().join("data1");
    let keys: Vec<String> = (0..6).map(|i| format!("k{i}")).collect();
    let value = |tag: u8, i: usize| vec![tag; 700 + 300 * i];
    {
        let opened = server::open(&cfg(&first, &cells, &key)).await.unwrap();
        opened.objects.directory().create_bucket("b").unwrap();
        for (i, k) in keys.iter().enumerate() {
            put(&opened, k, value(1, i)).await;
        }
        opened.objects.shutdown().await.unwrap();
        server::write_snapshot(&opened).await.unwrap();
    }
    // Keep the store as it was at the snapshot: the recovered run starts from it.
    let at_snapshot = std::fs::read(cells.join("oram.cells")).unwrap();
    // The lost timeline: restarts, overwrites every object, stops without a snapshot.
    {
        let opened = server::open(&cfg(&first, &cells, &key)).await.unwrap();
        for (i, k) in keys.iter().enumerate() {
            put(&opened, k, value(0x10, i)).await;
        }
        opened.objects.shutdown().await.unwrap();
    }
    let lost: Vec<Vec<u8>> = {
        let f = array_file(&cells, "oram");
        let all: Vec<CellId> = (0..f.geometry().cell_count()).map(CellId).collect();
        f.read(&all).await.unwrap()
    };
    std::fs::remove_dir_all(&first).unwrap();
    std::fs::write(cells.join("oram.cells"), &at_snapshot).unwrap();

    // Recover from S and run the same workload with other data.
    let second = root.path().join("data2");
    {
        let (opened, _) = server::recover(&cfg(&second, &cells, &key)).await.unwrap();
        for (i, k) in keys.iter().enumerate() {
            put(&opened, k, value(0x20, i)).await;
        }
        opened.objects.shutdown().await.unwrap();
    }
    // The store hands back the lost timeline's ciphertext of every cell.
    {
        let f = array_file(&cells, &oram_array_of(&second));
        assert_eq!(f.geometry().cell_count(), lost.len() as u64);
        let all: Vec<(CellId, Vec<u8>)> =
            lost.iter().enumerate().map(|(i, c)| (CellId(i as u64), c.clone())).collect();
        f.write(all).await.unwrap();
        f.flush().await.unwrap();
    }
    let opened = server::open(&cfg(&second, &cells, &key)).await.unwrap();
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    // The TaoStore engine keeps the top of its tree in trusted memory, out of the store's
    // reach: those cells are checked from memory and authenticate; none of the store's may.
    let pinned = match engine {
        OramEngine::Tao => opened.params.tao_pinned_cells(),
        OramEngine::PathOram
        | OramEngine::ObliviStore
        | OramEngine::Curious
        | OramEngine::CuriousPath
        | OramEngine::Tee => 0,
    };
    assert_eq!(
        report.cells_ok,
        pinned,
        "{} cells of the lost timeline authenticated in the recovered one ({} refused)",
        report.cells_ok,
        report.bad_cells.len()
    );
    assert!(!report.bad_cells.is_empty());
    for (i, k) in keys.iter().enumerate() {
        match try_read_all(&opened, k).await {
            Ok(got) => {
                assert_ne!(got, value(0x10, i), "{k}: the lost timeline's data was returned");
                assert_eq!(got, value(0x20, i), "{k}: wrong data");
            }
            // The first failure is an integrity error; it poisons the engine for the rest.
            Err(e) => assert!(e.contains("integrity") || e.contains("half-way"), "{k}: {e}"),
        }
    }
}

/// An engine whose trusted state holds blocks (CURIOUS's eviction cache, with large blocks)
/// can outgrow the snapshot area sized at start: a clean stop must still write its snapshot
/// (into a larger array, which the index then names), not fail the shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_larger_than_its_area_goes_to_a_larger_one() {
    let root = tempfile::tempdir().unwrap();
    let cells = root.path().join("cells");
    let key = root.path().join("key.json");
    let data = root.path().join("data");
    let cfg = ServeConfig {
        capacity: 32 << 20,
        block_size: 256 * 1024,
        ..cfg_with(&data, &cells, &key, OramEngine::Curious)
    };
    let opened = server::open(&cfg).await.unwrap();
    opened.objects.directory().create_bucket("b").unwrap();
    let area = opened.snapshots.lock().as_ref().unwrap().slot_cells() * 64 * 1024;
    // Writes until the trusted state (most of it the eviction cache) is well past the area.
    let mut objects = BTreeMap::new();
    let mut i = 0u32;
    while opened.objects.engine().gauges().trusted_bytes < area + (1 << 20) {
        assert!(i < 2000, "the trusted state never outgrew the {area}-byte area");
        let k = format!("k{}", i % 24);
        let v = vec![i as u8; 256 * 1024];
        put(&opened, &k, v.clone()).await;
        objects.insert(k, v);
        i += 1;
    }
    opened.objects.shutdown().await.unwrap();
    let seq = server::write_snapshot(&opened).await.unwrap();
    let larger = opened.snapshots.lock().as_ref().map(|a| a.name.clone()).unwrap();
    assert_ne!(larger, blindfold_gateway::snapshot::ARRAY, "the snapshot stayed in the first area");
    // The next snapshot goes into the same, larger array.
    assert_eq!(server::write_snapshot(&opened).await.unwrap(), seq + 1);
    drop(opened);
    let url = cfg.store.clone().unwrap();
    let master = blindfold_crypto::load_key_file(&key, None).unwrap();
    {
        let store = blindfold_gateway::snapshot::open_for_recovery(&url, &master).await.unwrap();
        let snap = blindfold_gateway::snapshot::read_latest(&*store, &master).await.unwrap();
        assert_eq!(snap.seq, seq + 1);
        assert!(
            snap.oram_checkpoint.len() > 1 << 20,
            "the state ({} bytes) fit the first area: the test proves nothing",
            snap.oram_checkpoint.len()
        );
        assert_eq!(snap.directory.objects.len(), objects.len());
    }
    // The gateway opens again on the larger array (not a new one of the estimated size), with
    // everything in place, and its next snapshot follows the last one.
    let opened = server::open(&cfg).await.unwrap();
    assert_eq!(opened.snapshots.lock().as_ref().map(|a| a.name.clone()).unwrap(), larger);
    for (k, v) in &objects {
        assert_eq!(&read_all(&opened, k).await, v, "{k}");
    }
    opened.objects.shutdown().await.unwrap();
    assert_eq!(server::write_snapshot(&opened).await.unwrap(), seq + 2);
}

/// A `recover` cut short at any step (the process dies) leaves a directory that `serve`
/// refuses with a clear message and that the same `recover` run again completes: every object
/// reads back and the store verifies clean. For every engine `recover` rebuilds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recover_cut_short_at_any_step_completes_when_run_again() {
    use server::RecoverCrash;
    for engine in [
        OramEngine::PathOram,
        OramEngine::Tao,
        OramEngine::ObliviStore,
        OramEngine::CuriousPath,
        OramEngine::Tee,
    ] {
        for at in
            [RecoverCrash::HalfWritten, RecoverCrash::AfterRebuild, RecoverCrash::AfterDirectory]
        {
            let cfg = |d: &std::path::Path, c: &std::path::Path, k: &std::path::Path| {
                cfg_with(d, c, k, engine)
            };
            let root = tempfile::tempdir().unwrap();
            let cells = root.path().join("cells");
            let key = root.path().join("key.json");
            let first = root.path().join("data1");
            let mut objects = BTreeMap::new();
            {
                let opened = server::open(&cfg(&first, &cells, &key)).await.unwrap();
                opened.objects.directory().create_bucket("b").unwrap();
                for i in 0..8u8 {
                    let data = vec![i; 900 + i as usize * 500];
                    put(&opened, &format!("k{i}"), data.clone()).await;
                    objects.insert(format!("k{i}"), data);
                }
                opened.objects.shutdown().await.unwrap();
                server::write_snapshot(&opened).await.unwrap();
            }
            std::fs::remove_dir_all(&first).unwrap();
            let second = root.path().join("data2");
            let e = server::recover_until(&cfg(&second, &cells, &key), Some(at)).await.unwrap_err();
            assert!(e.to_string().contains("simulated crash"), "{engine} {at:?}: {e}");
            let e = server::open(&cfg(&second, &cells, &key)).await.unwrap_err();
            assert!(e.to_string().contains("did not finish"), "{engine} {at:?}: {e}");
            let (opened, _) = server::recover(&cfg(&second, &cells, &key)).await.unwrap();
            for (k, v) in &objects {
                assert_eq!(&read_all(&opened, k).await, v, "{engine} {at:?}: {k}");
            }
            let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
            assert!(report.is_clean(), "{engine} {at:?}: {report:?}");
        }
    }
}

/// A new data directory pointed at a store that already holds a gateway is refused, with the
/// key it was made with or any other: a new gateway there would overwrite the old one's
/// arrays. The store is left byte for byte as it was, and `recover` still brings back every
/// object. (Before this check, `serve` made a new gateway over the old arrays.)
#[tokio::test]
async fn a_new_gateway_never_takes_over_a_store_in_use() {
    let cfg = |d: &std::path::Path, c: &std::path::Path, k: &std::path::Path| {
        cfg_with(d, c, k, OramEngine::PathOram)
    };
    let root = tempfile::tempdir().unwrap();
    let cells = root.path().join("cells");
    let key = root.path().join("key.json");
    let first = root.path().join("data1");
    {
        let opened = server::open(&cfg(&first, &cells, &key)).await.unwrap();
        opened.objects.directory().create_bucket("b").unwrap();
        put(&opened, "k", vec![7; 5000]).await;
        opened.objects.shutdown().await.unwrap();
        server::write_snapshot(&opened).await.unwrap();
    }
    let before = std::fs::read(cells.join("oram.cells")).unwrap();
    let second = root.path().join("data2");
    let e = server::open(&cfg(&second, &cells, &key)).await.unwrap_err().to_string();
    assert!(
        e.contains("already holds a blindfold gateway") && e.contains("blindfold recover"),
        "{e}"
    );
    let other = root.path().join("other.json");
    let e = server::open(&cfg(&second, &cells, &other)).await.unwrap_err().to_string();
    assert!(e.contains("another blindfold gateway"), "{e}");
    assert!(!other.exists(), "a refused start left a key behind");
    assert!(!second.join("gateway.json").exists());
    assert_eq!(std::fs::read(cells.join("oram.cells")).unwrap(), before, "the store changed");
    let (opened, _) = server::recover(&cfg(&second, &cells, &key)).await.unwrap();
    assert_eq!(read_all(&opened, "k").await, vec![7; 5000]);
}
