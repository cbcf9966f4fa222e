//! Damage to what serving does not need must not stop the gateway: a flipped byte in the
//! header of the snapshot's cell file used to make every start fail.

use std::collections::BTreeMap;

use crate::common;

use blindfold_gateway::server::{self, OramEngine};
use bytes::Bytes;
use common::{file_cfg, read_object};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_file_does_not_stop_the_gateway() {
    let root = tempfile::tempdir().unwrap();
    let cfg = file_cfg(root.path(), OramEngine::Tao);
    let data = vec![5u8; 3000];
    {
        let opened = server::open(&cfg).await.unwrap();
        opened.objects.directory().create_bucket("b").unwrap();
        let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data.clone()))]);
        opened.objects.put_object("b", "k", body, None, BTreeMap::new(), false).await.unwrap();
        opened.objects.shutdown().await.unwrap();
        server::write_snapshot(&opened).await.unwrap();
    }
    let file = root.path().join("cells").join("snapshot.cells");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[20] ^= 0x40; // inside the file's header
    std::fs::write(&file, &bytes).unwrap();

    let opened = server::open(&cfg).await.expect("serves despite the damaged snapshot file");
    assert!(
        opened.notes.iter().any(|n| n.contains("snapshot area")),
        "the operator is told: {:?}",
        opened.notes
    );
    let out = read_object(&opened, "k").await.unwrap();
    assert_eq!(out, data);
    // Shutting down cleanly still works; it only skips the snapshot.
    opened.objects.shutdown().await.unwrap();
    assert!(server::write_snapshot(&opened).await.is_err());
}
