//! A gateway whose store was damaged reports it once, so the serving process can stop.

use blindfold_gateway::server::{open, ServeConfig};

fn config(dir: &std::path::Path) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_path_buf(),
        store: None,
        key_file: None,
        passphrase: None,
        credentials: Some(("AK".into(), "SK".into())),
        capacity: 64 * 1024,
        block_size: 1024,
        pad_objects: false,
        cache_mib: 0,
        engine: Default::default(),
        in_place: false,
        pack_levels: 1,
        durability: Default::default(),
        lease_ttl: None,
        anchor: None,
        reads_ahead_of_log: false,
        log_feed: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_store_trips_the_stop_signal_once() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    {
        let opened = open(&cfg).await.unwrap();
        assert!(opened.stopped.borrow().is_none());
        opened.objects.directory().create_bucket("b").unwrap();
        let body =
            futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from(vec![7u8; 3000]))]);
        opened.objects.put_object("b", "k", body, None, Default::default(), false).await.unwrap();
        opened.objects.shutdown().await.unwrap();
    }
    // Flip one byte in every cell (past the file header): whatever path the next read takes, it meets a bad cell.
    let cells = tmp.path().join("cells/oram.cells");
    let mut raw = std::fs::read(&cells).unwrap();
    let n = raw.len();
    for i in (4096 + 40..n).step_by(64) {
        raw[i] ^= 1;
    }
    std::fs::write(&cells, raw).unwrap();
    let opened = open(&cfg).await.unwrap();
    let (meta, _pin) = opened.objects.lookup_for_read("b", "k").unwrap().unwrap();
    // The error reaches the reader, through the stream or at once; the engine has reported it
    // by then.
    let mut failed = false;
    match opened.objects.read_range(&meta, 0..3000, 1).await {
        Err(_) => failed = true,
        Ok(mut rx) => {
            while let Some(chunk) = rx.recv().await {
                if chunk.is_err() {
                    failed = true;
                    break;
                }
            }
        }
    }
    assert!(failed, "reading through damaged cells must fail");
    let why = opened.stopped.borrow().clone().expect("the engine reported that it stopped");
    assert!(why.contains("integrity") || why.contains("failed half-way"), "{why}");
}
