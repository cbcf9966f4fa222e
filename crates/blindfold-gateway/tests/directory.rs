//! The directory database at rest: sealed under the key, refused when damaged or under
//! another key.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_gateway::objects::ObjectLayer;
use blindfold_gateway::Directory;
use blindfold_oram::PathOramConfig;
use blindfold_proxy::{DurablePathOram, SealedPathOram};
use blindfold_store::{MemoryStore, Store};
use bytes::Bytes;

const BUCKET: &str = "zebra-bucket-4711";
const KEY: &str = "secret-report-quux-2026.txt";
const META: &str = "metavalue-plugh";

fn body(data: &[u8]) -> futures::stream::Iter<std::vec::IntoIter<Result<Bytes, std::io::Error>>> {
    futures::stream::iter(vec![Ok(Bytes::copy_from_slice(data))])
}

/// Writes a few objects with telltale names into a directory at `dir/meta.redb`.
async fn fill(dir: &Path, key: &MasterKey) {
    let config = PathOramConfig::builder(256, 64).build().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
    let engine = DurablePathOram::create(&dir.join("oram"), config, store, key, StoreId::random())
        .await
        .unwrap();
    let directory = Directory::open(&dir.join("meta.redb"), 256, key).unwrap();
    let layer = Arc::new(ObjectLayer::new(directory, engine, false));
    layer.directory().create_bucket(BUCKET).unwrap();
    let meta = BTreeMap::from([("note".to_string(), META.to_string())]);
    for i in 0..20 {
        let name = format!("{KEY}-{i}");
        layer
            .put_object(
                BUCKET,
                &name,
                body(&[i as u8; 300]),
                Some("text/x-telltale".into()),
                meta.clone(),
                false,
            )
            .await
            .unwrap();
    }
    layer.create_upload(BUCKET, KEY, None, meta).await.unwrap();
    layer.shutdown().await.unwrap();
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn the_directory_file_holds_no_names_or_metadata_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    fill(dir.path(), &key).await;
    let bytes = std::fs::read(dir.path().join("meta.redb")).unwrap();
    assert!(bytes.len() > 4096, "the directory was written");
    for needle in [BUCKET, KEY, META, "text/x-telltale", "buckets", "objects", "redb"] {
        assert!(!contains(&bytes, needle), "{needle:?} is readable in meta.redb");
    }
    // Nor does any other file of the data directory hold names (block contents are the
    // ORAM's business, not checked here).
    let mut files = vec![dir.path().to_path_buf()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            let bytes = std::fs::read(&p).unwrap();
            for needle in [BUCKET, KEY, META] {
                assert!(!contains(&bytes, needle), "{needle:?} is readable in {}", p.display());
            }
        }
    }
    // It opens again under the right key with everything in it.
    let d = Directory::open(&dir.path().join("meta.redb"), 256, &key).unwrap();
    assert_eq!(d.counts().unwrap(), (1, 20));
    let o = d.object(BUCKET, &format!("{KEY}-3")).unwrap().expect("object");
    assert_eq!(o.metadata["note"], META);
}

#[tokio::test]
async fn another_key_or_a_damaged_directory_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    fill(dir.path(), &key).await;
    let path = dir.path().join("meta.redb");
    let err = Directory::open(&path, 256, &MasterKey::generate()).unwrap_err().to_string();
    assert!(err.contains("another key"), "{err}");

    // Flip one byte at a time in a few places of the file; every open either fails with a
    // message or (a page redb does not read at open) succeeds, and never panics. A flip in
    // the page redb reads first (its header) must be caught.
    let clean = std::fs::read(&path).unwrap();
    let slot = 12 + 4096 + 16;
    for at in [0usize, 20, 64 + 12 + 5, 64 + slot + 200, clean.len() - 1] {
        let mut bytes = clean.clone();
        bytes[at] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let opened = std::panic::catch_unwind(|| Directory::open(&path, 256, &key).map(drop));
        let result = opened.unwrap_or_else(|_| panic!("opening panicked (byte {at} flipped)"));
        if at < 64 + slot {
            let err = result.expect_err("a damaged header or first page is refused").to_string();
            assert!(
                err.contains("neither a sealed directory nor a plaintext one")
                    || err.contains("another key")
                    || err.contains("failed authentication"),
                "byte {at}: {err}"
            );
        }
    }
    std::fs::write(&path, &clean).unwrap();
    assert_eq!(Directory::open(&path, 256, &key).unwrap().counts().unwrap(), (1, 20));
}
