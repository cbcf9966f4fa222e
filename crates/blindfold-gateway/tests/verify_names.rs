//! `verify` names the objects a damaged cell makes unreadable: every object it names fails
//! to read, every other object reads back.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::common;

use blindfold_gateway::server::{self, OpenHooks, OramEngine, ServeConfig};
use blindfold_store::{CellId, Store};
use bytes::Bytes;
use common::{file_cfg, read_object};
use parking_lot::Mutex;

async fn open(cfg: &ServeConfig) -> (server::Opened, Arc<dyn Store>) {
    let slot: Arc<Mutex<Option<Arc<dyn Store>>>> = Arc::new(Mutex::new(None));
    let keep = Arc::clone(&slot);
    let hooks = OpenHooks {
        wrap_store: Some(Box::new(move |inner| {
            *keep.lock() = Some(Arc::clone(&inner));
            inner
        })),
        ..OpenHooks::default()
    };
    let opened = server::open_with(cfg, hooks).await.unwrap();
    let store = slot.lock().take().unwrap();
    (opened, store)
}

async fn check(engine: OramEngine) {
    let root = tempfile::tempdir().unwrap();
    let cfg = file_cfg(root.path(), engine);
    let (opened, store) = open(&cfg).await;
    opened.objects.directory().create_bucket("b").unwrap();
    let n = 80u8;
    for i in 0..n {
        let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(vec![i; 1000]))]);
        opened
            .objects
            .put_object("b", &format!("k{i}"), body, None, BTreeMap::new(), false)
            .await
            .unwrap();
    }
    opened.objects.shutdown().await.unwrap();
    // Damage one written bucket of the fourth level (it lies on one eighth of the paths): both
    // of its copies, as the store keeps two slots per cell (store cell `c + n` is the second).
    assert!(opened.params.two_slots());
    let slot = store.geometry().cell_count() / 2;
    let mut damaged = None;
    for cell in 7..15u64 {
        for copy in [cell, cell + slot] {
            let mut bytes = store.read(&[CellId(copy)]).await.unwrap().pop().unwrap();
            if bytes.iter().any(|&b| b != 0) {
                let at = bytes.len() / 2;
                bytes[at] ^= 1;
                store.write(vec![(CellId(copy), bytes)]).await.unwrap();
                damaged = Some(cell);
            }
        }
        if damaged.is_some() {
            break;
        }
    }
    let damaged = damaged.expect("a written bucket on level 3");
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    assert_eq!(report.bad_cells.len(), 1);
    assert_eq!(report.bad_cells[0].0, damaged);
    let named = report.damaged_objects.expect("a position map in memory names them");
    assert!(!named.is_empty(), "{engine:?}: about a tenth of 80 objects lie under that bucket");
    assert!(named.len() < n as usize / 2, "{engine:?}: {} named", named.len());
    // Every other object reads back; a named one does not.
    for i in 0..n {
        let key = format!("k{i}");
        if !named.contains(&format!("b/{key}")) {
            assert_eq!(
                read_object(&opened, &key).await.unwrap(),
                vec![i; 1000],
                "{engine:?} {key}"
            );
        }
    }
    let first = named[0].strip_prefix("b/").unwrap().to_owned();
    assert!(read_object(&opened, &first).await.is_err(), "{engine:?}: {first} is named but reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_names_the_damaged_objects_tao() {
    check(OramEngine::Tao).await;
}

#[tokio::test]
async fn verify_names_the_damaged_objects_path_oram() {
    check(OramEngine::PathOram).await;
}
