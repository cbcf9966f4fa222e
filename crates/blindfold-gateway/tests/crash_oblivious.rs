//! The reproduction, at the gateway: a GET of one object before a crash and a GET of
//! the same object after the restart used to read exactly the same cells. With the reveal log
//! they share only what two GETs without a crash share (the top of the tree).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use crate::common;

use blindfold_gateway::server::{self, OpenHooks, OramEngine, ServeConfig};
use blindfold_store::{CellId, RecordingStore, Store, TraceOp};
use bytes::Bytes;
use common::{file_cfg, read_object};
use parking_lot::Mutex;

type Rec = Arc<RecordingStore<Arc<dyn Store>>>;

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

/// The tree cells read since the last call. New gateways keep two slots per cell: store cell
/// `c + n` is the second copy of tree cell `c`, and which copy a read goes to follows the
/// commits (which the store sees anyway), so reads are compared as tree cells.
fn reads(rec: &Rec) -> HashSet<CellId> {
    let n = rec.geometry().cell_count() / 2;
    rec.take_trace()
        .into_iter()
        .filter(|e| e.op == TraceOp::Read)
        .flat_map(|e| e.cells)
        .map(|c| CellId(c.0 % n))
        .collect()
}

async fn check(engine: OramEngine) {
    let root = tempfile::tempdir().unwrap();
    let cfg = file_cfg(root.path(), engine);
    let (mut opened, mut rec) = open(&cfg).await;
    assert!(opened.params.two_slots());
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
        assert_eq!(read_object(&opened, "k").await.unwrap(), data);
        let first = reads(&rec);
        if trial % 2 == 0 {
            // kill -9: nothing is committed, shut down or snapshotted.
            drop(opened);
            drop(rec);
            (opened, rec) = open(&cfg).await;
            rec.clear();
        }
        assert_eq!(read_object(&opened, "k").await.unwrap(), data);
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
