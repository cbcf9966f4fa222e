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
        opened.objects.delete_object("b", "k3").unwrap();
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
