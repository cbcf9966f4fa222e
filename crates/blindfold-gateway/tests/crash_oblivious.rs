//! The reproduction, at the gateway: a GET of one object before a crash and a GET of
//! the same object after the restart used to read exactly the same cells. With the reveal log
//! they share only what two GETs without a crash share (the top of the tree).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use blindfold_gateway::server::{self, OpenHooks, OramEngine, ServeConfig};
use blindfold_store::{CellId, RecordingStore, Store, StoreUrl, TraceOp};
use bytes::Bytes;
use parking_lot::Mutex;

type Rec = Arc<RecordingStore<Arc<dyn Store>>>;

fn cfg(root: &std::path::Path, engine: OramEngine) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: root.join("data"),
        store: Some(StoreUrl::File {
            dir: root.join("cells"),
            sync: blindfold_store::SyncMode::OnFlush,
        }),
        key_file: Some(root.join("key.json")),
        passphrase: None,
        credentials: Some(("ak".into(), "sk".into())),
        capacity: 1 << 20,
        block_size: 1024,
        pad_objects: false,
        cache_mib: 0,
        engine,
    }
}

/// Opens the gateway with a recording store in front of its ORAM store.
async fn open(cfg: &ServeConfig) -> (server::Opened, Rec) {
    let slot: Arc<Mutex<Option<Rec>>> = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&slot);
    let hooks = OpenHooks {
        wrap_store: Some(Box::new(move |inner| {
            let rec = Arc::new(RecordingStore::new(inner));
            *keep.lock() = Some(Arc::clone(&rec));
            rec as Arc<dyn Store>
        })),
        ..OpenHooks::default()
    };
    let opened = server::open_with(cfg, hooks).await.unwrap();
    let rec = slot.lock().take().expect("the store was wrapped");
    (opened, rec)
}

async fn get(opened: &server::Opened, key: &str) -> Vec<u8> {
    let meta = opened.objects.directory().object("b", key).unwrap().expect("object");
    let mut rx = opened.objects.read_range(&meta, 0..meta.size, 0).await.unwrap();
    let mut out = Vec::new();
    while let Some(c) = rx.recv().await {
        out.extend_from_slice(&c.unwrap());
    }
    out
}

fn reads(rec: &Rec) -> HashSet<CellId> {
    rec.take_trace().into_iter().filter(|e| e.op == TraceOp::Read).flat_map(|e| e.cells).collect()
}

async fn check(engine: OramEngine) {
    let root = tempfile::tempdir().unwrap();
    let cfg = cfg(root.path(), engine);
    let (mut opened, mut rec) = open(&cfg).await;
    opened.objects.directory().create_bucket("b").unwrap();
    let data = vec![7u8; 6 * 1024]; // six blocks
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data.clone()))]);
    opened.objects.put_object("b", "k", body, None, BTreeMap::new(), false).await.unwrap();
    let (mut crashed, mut calm) = (Vec::new(), Vec::new());
    for trial in 0..16 {
        // A PUT commits everything so far: the GET below starts from a committed state.
        let d = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![1u8; 10]))]);
        opened.objects.put_object("b", "d", d, None, BTreeMap::new(), false).await.unwrap();
        rec.clear();
        assert_eq!(get(&opened, "k").await, data);
        let first = reads(&rec);
        if trial % 2 == 0 {
            // kill -9: nothing is committed, shut down or snapshotted.
            drop(opened);
            drop(rec);
            (opened, rec) = open(&cfg).await;
            rec.clear();
        }
        assert_eq!(get(&opened, "k").await, data);
        let second = reads(&rec);
        let share = first.intersection(&second).count() as f64 / first.len() as f64;
        if trial % 2 == 0 {
            crashed.push(share)
        } else {
            calm.push(share)
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let (c, n) = (mean(&crashed), mean(&calm));
    assert!(
        c < 0.6 && (c - n).abs() < 0.25,
        "{engine:?}: a GET after a crash shares {:.0} % of its cells with the GET before it \
         (without a crash: {:.0} %)",
        c * 100.0,
        n * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_after_kill_reads_fresh_paths_tao() {
    check(OramEngine::Tao).await;
}

#[tokio::test]
async fn get_after_kill_reads_fresh_paths_path_oram() {
    check(OramEngine::PathOram).await;
}
