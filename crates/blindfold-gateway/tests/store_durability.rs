//! `--durability store`: every acknowledged write survives the loss of the gateway's data
//! directory, recovered from the store and the key alone, for every engine of the catalogue.

use std::collections::BTreeMap;
use std::path::Path;

use blindfold_gateway::server::{self, Durability, OramEngine, ServeConfig};
use blindfold_store::StoreUrl;
use bytes::Bytes;

mod common;

fn cfg(data: &Path, cells: &Path, key: &Path, engine: OramEngine) -> ServeConfig {
    ServeConfig {
        data_dir: data.to_path_buf(),
        store: Some(StoreUrl::File {
            dir: cells.to_path_buf(),
            sync: blindfold_store::SyncMode::OnFlush,
        }),
        key_file: Some(key.to_path_buf()),
        durability: Durability::Store,
        ..common::file_cfg(data, engine)
    }
}

async fn put(opened: &server::Opened, key: &str, data: &[u8]) {
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data.to_vec()))]);
    opened.objects.put_object("b", key, body, None, BTreeMap::new(), false).await.unwrap();
}

fn data(i: usize) -> Vec<u8> {
    (0..300 + i * 517).map(|j| (i * 31 + j) as u8).collect()
}

/// The operator's scenario of the issue: objects, a clean stop, a restart, more objects and a
/// delete, then the machine is lost without a clean stop. Everything acknowledged comes back.
async fn nothing_acknowledged_is_lost(engine: OramEngine) {
    let root = tempfile::tempdir().unwrap();
    let cells = root.path().join("cells");
    let key = root.path().join("key.json");
    let first = root.path().join("data1");
    let mut expect = BTreeMap::new();
    {
        let opened = server::open(&cfg(&first, &cells, &key, engine)).await.unwrap();
        assert!(opened.journal.is_some(), "{engine}: --durability store did not start the log");
        opened.objects.directory().create_bucket("b").unwrap();
        opened.objects.directory().settle().await.unwrap();
        for i in 0..5 {
            put(&opened, &format!("k{i}"), &data(i)).await;
            expect.insert(format!("k{i}"), data(i));
        }
        opened.objects.shutdown().await.unwrap();
        server::write_snapshot(&opened).await.unwrap();
    }
    {
        let opened = server::open(&cfg(&first, &cells, &key, engine)).await.unwrap();
        for i in 5..10 {
            put(&opened, &format!("k{i}"), &data(i)).await;
            expect.insert(format!("k{i}"), data(i));
        }
        // Overwritten and deleted after the last clean stop, too.
        put(&opened, "k1", b"newer").await;
        expect.insert("k1".into(), b"newer".to_vec());
        assert!(opened.objects.delete_object("b", "k2").await.unwrap());
        expect.remove("k2");
        // The machine is lost: no clean stop, no snapshot, the data directory gone.
        drop(opened);
    }
    std::fs::remove_dir_all(&first).unwrap();
    let second = root.path().join("data2");
    let (opened, about) =
        server::recover(&cfg(&second, &cells, &key, engine)).await.unwrap_or_else(|e| {
            panic!("{engine}: recover: {e}");
        });
    assert!(about.contains("every acknowledged write is back"), "{engine}: {about}");
    let names: Vec<String> = opened
        .objects
        .directory()
        .list("b", "", "", 100)
        .unwrap()
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(names, expect.keys().cloned().collect::<Vec<_>>(), "{engine}: {about}");
    for (k, v) in &expect {
        assert_eq!(&common::read_object(&opened, k).await.unwrap(), v, "{engine}: {k}");
    }
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{engine}: {report:?}");
    // The recovered gateway logs to the store in its turn: lose it again, recover again.
    put(&opened, "after", b"after the first recovery").await;
    drop(opened);
    std::fs::remove_dir_all(&second).unwrap();
    let third = root.path().join("data3");
    let (opened, _) = server::recover(&cfg(&third, &cells, &key, engine)).await.unwrap();
    assert_eq!(common::read_object(&opened, "after").await.unwrap(), b"after the first recovery");
    assert_eq!(common::read_object(&opened, "k1").await.unwrap(), b"newer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_oram_loses_nothing_acknowledged_with_the_data_directory() {
    nothing_acknowledged_is_lost(OramEngine::PathOram).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tao_loses_nothing_acknowledged_with_the_data_directory() {
    nothing_acknowledged_is_lost(OramEngine::Tao).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tee_loses_nothing_acknowledged_with_the_data_directory() {
    nothing_acknowledged_is_lost(OramEngine::Tee).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_engines_lose_nothing_acknowledged_with_the_data_directory() {
    for engine in [OramEngine::ObliviStore, OramEngine::Curious, OramEngine::CuriousPath] {
        nothing_acknowledged_is_lost(engine).await;
    }
}

/// A new engine fails to compile here until it has a test above.
#[allow(dead_code)]
fn every_engine_has_a_test(engine: OramEngine) {
    match engine {
        OramEngine::PathOram
        | OramEngine::Tao
        | OramEngine::Tee
        | OramEngine::ObliviStore
        | OramEngine::Curious
        | OramEngine::CuriousPath => {}
    }
}
