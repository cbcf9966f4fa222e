//! After `blindfold rotate-key` reports finished, the retired key opens nothing: not a cell of
//! any store array (both slots of every cell, both snapshot slots, the snapshot index), not a
//! file of the data directory — for every engine that rotates, and also when the rotation was
//! cut short by a crash and resumed.
//!
//! The store is a file store, read here the way its owner could read it: raw, from the files.
//!
//! How a cell is judged: everything the old key ever sealed was sealed before
//! `rotation::prepare` (from then on every run seals under the new key), and every sealed cell
//! starts with its key epoch and a 96-bit random nonce. So the old key's ciphertexts are
//! exactly the cells present before the rotation; one whose epoch and nonce are still in the
//! store afterwards (at any place) is one of them, and it opens under the old key as it did
//! before. Snapshot slots are also opened outright with the old key, and every file of the
//! data directory is opened with the old key by its own format.

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blindfold_crypto::{load_key_file, CellAd, CellSealer, MasterKey, StateSealer, StoreId};
use blindfold_gateway::rotation::{self, ROTATION_FILE};
use blindfold_gateway::server::{self, OpenHooks, OramEngine};
use blindfold_store::{CellId, CountingStore, Geometry, MemoryStore, Store};
use blindfold_testkit::DyingStore;
use bytes::Bytes;

/// An engine and its store layout.
#[derive(Clone, Copy, Debug)]
struct Setup {
    engine: OramEngine,
    /// Top of the tree kept in trusted memory (0: none).
    cache_mib: u64,
    /// Tree levels per store object (tao).
    pack_levels: u32,
}

const fn plain(engine: OramEngine) -> Setup {
    Setup { engine, cache_mib: 0, pack_levels: 1 }
}

/// The engines that rotate their key (node clusters: `crates/blindfold-node/tests/cluster.rs`;
/// the tee engine since 2026-11-28).
const ENGINES: [Setup; 6] = [
    plain(OramEngine::Tao),
    plain(OramEngine::PathOram),
    plain(OramEngine::ObliviStore),
    plain(OramEngine::Curious),
    plain(OramEngine::CuriousPath),
    plain(OramEngine::Tee),
];

/// The default engine's other layouts: two tree levels per store object, and the top of the
/// tree pinned in trusted memory (its buckets then live in the checkpoint and the log).
const TAO_LAYOUTS: [Setup; 2] = [
    Setup { engine: OramEngine::Tao, cache_mib: 0, pack_levels: 2 },
    Setup { engine: OramEngine::Tao, cache_mib: 1, pack_levels: 1 },
];

fn cfg(root: &Path, setup: Setup) -> server::ServeConfig {
    server::ServeConfig {
        capacity: 256 << 10,
        cache_mib: setup.cache_mib,
        pack_levels: setup.pack_levels,
        durability: Default::default(),
        lease_ttl: None,
        anchor: None,
        reads_ahead_of_log: false,
        log_feed: None,
        ..common::file_cfg(root, setup.engine)
    }
}

async fn put(opened: &server::Opened, key: &str, data: Vec<u8>) {
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(data))]);
    opened.objects.put_object("b", key, body, None, BTreeMap::new(), false).await.unwrap();
}

/// An object's contents: recognisable, different per object.
fn contents(i: u8) -> Vec<u8> {
    (0..3000u32).map(|j| (j as u8) ^ i).collect()
}

/// One array of a file store, read raw: its cells.
fn raw_cells(file: &Path) -> (Geometry, Vec<Vec<u8>>) {
    let raw = std::fs::read(file).unwrap();
    let size = u32::from_le_bytes(raw[20..24].try_into().unwrap());
    let count = u64::from_le_bytes(raw[24..32].try_into().unwrap());
    let cells = (0..count as usize)
        .map(|i| {
            let at = 4096 + i * size as usize;
            raw.get(at..at + size as usize).map_or_else(|| vec![0; size as usize], <[u8]>::to_vec)
        })
        .collect();
    (Geometry::new(count, size).unwrap(), cells)
}

/// Every array of the store under `cells`, by file name.
fn arrays(cells: &Path) -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(cells)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cells"))
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    out
}

/// The key epoch and nonce that start each sealed segment of a cell (unique to one
/// ciphertext): one segment per cell, or, in a packed tao array, one per bucket of the group
/// (which the cell holds side by side, each sealed on its own). A scan of every segment
/// boundary of every size up to 15 buckets per cell covers both.
fn heads_of(cell: &[u8]) -> Vec<[u8; 16]> {
    let mut out = Vec::new();
    for members in [1, 3, 7, 15] {
        if !cell.len().is_multiple_of(members) {
            continue;
        }
        let size = cell.len() / members;
        for seg in cell.chunks(size) {
            if seg.len() >= 16 && seg[..16].iter().any(|&b| b != 0) {
                out.push(seg[..16].try_into().unwrap());
            }
        }
    }
    out
}

/// The heads of every written cell of every array: the old key's ciphertexts, when taken just
/// before the rotation.
fn heads(cells: &Path) -> HashSet<[u8; 16]> {
    arrays(cells).iter().flat_map(|(_, p)| raw_cells(p).1).flat_map(|c| heads_of(&c)).collect()
}

/// What still opens under `old`, one line each.
async fn opens_under(old: &MasterKey, before: &HashSet<[u8; 16]>, root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    // Every cell of every store array, both slots: still an old ciphertext?
    let mut stale: BTreeMap<String, u64> = BTreeMap::new();
    for (name, path) in arrays(&root.join("cells")) {
        let (g, cells) = raw_cells(&path);
        for c in &cells {
            if heads_of(c).iter().any(|h| before.contains(h)) {
                *stale.entry(name.clone()).or_default() += 1;
            }
        }
        if name.starts_with("snapshot") {
            // Opened outright: the snapshot slots and the index under the old key.
            let mem = MemoryStore::new(g);
            let all: Vec<(CellId, Vec<u8>)> =
                cells.iter().cloned().enumerate().map(|(i, c)| (CellId(i as u64), c)).collect();
            mem.write(all).await.unwrap();
            if name == "snapshot-index.cells" {
                let snap = CellSealer::new(old, StoreId(*b"blindfold-snap!!"), 0);
                let ad = CellAd { cell: 0, version: 1, segment: 0 };
                if snap.open(&ad, &cells[0]).is_ok() {
                    found.push(format!("{name}: the snapshot index opens"));
                }
            } else if let Some(seq) = blindfold_gateway::snapshot::latest_seq(&mem, old).await {
                found.push(format!("{name}: snapshot #{seq} opens"));
            }
        }
    }
    for (name, n) in stale {
        found.push(format!("{name}: {n} cells still sealed under the old key"));
    }
    found.extend(files_opening_under(old, &root.join("data")));
    found
}

/// The files of the data directory that open under `old`, each opened by its own format; a
/// file of a kind this test does not know fails the test (teach it the new kind).
fn files_opening_under(old: &MasterKey, data: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![data.to_path_buf()];
    let state = StateSealer::new(old);
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            let name = path.strip_prefix(data).unwrap().to_string_lossy().into_owned();
            let raw = std::fs::read(&path).unwrap();
            let opens = match name.as_str() {
                // Plain text, nothing sealed: the public parameters and the S3 credentials.
                "gateway.json" | "credentials.json" | "users.lock" => false,
                "key.json" => {
                    load_key_file(&path, None).is_ok_and(|k| k.expose_bytes() == old.expose_bytes())
                }
                "key-check.json" => {
                    let v: serde_json::Value = serde_json::from_slice(&raw).unwrap();
                    let id = StoreId::from_hex(v["store_id"].as_str().unwrap()).unwrap();
                    let sealed = hex::decode(v["sealed"].as_str().unwrap()).unwrap();
                    let ad = CellAd { cell: u64::MAX, version: u64::MAX, segment: u32::MAX };
                    CellSealer::new(old, id, 0).open(&ad, &sealed).is_ok()
                }
                "meta.redb" => sealed_directory_opens(old, &raw),
                "users.sealed" => blindfold_gateway::users::UserFile::new(data, old).read().is_ok(),
                "oram/checkpoint.bin" => {
                    let len = u64::from_le_bytes(raw[8..16].try_into().unwrap()) as usize;
                    state.open(&raw[..8], &raw[20..20 + len]).is_ok()
                }
                "oram/redo.log" => log_frames_opening(&state, &raw) > 0,
                // Sealed under the old key by design while the rotation lasts.
                ROTATION_FILE => true,
                "key.json.next" => false,
                other => panic!("{other}: a file this test does not know; teach it its format"),
            };
            if opens {
                found.push(format!("data directory: {name} opens"));
            }
        }
    }
    found
}

/// Whether the sealed directory database (see `sealed_file.rs`) has a header or a page that
/// opens under `old`.
fn sealed_directory_opens(old: &MasterKey, raw: &[u8]) -> bool {
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let id: [u8; 16] = raw[16..32].try_into().unwrap();
    let bytes = blindfold_crypto::derive_key(old, &id, blindfold_crypto::DIRECTORY_KEY_LABEL);
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &bytes[..]).unwrap());
    let open = |nonce: &[u8], ad: &[u8], sealed: &[u8]| {
        let mut buf = sealed.to_vec();
        let n = Nonce::assume_unique_for_key(nonce.try_into().unwrap());
        key.open_in_place(n, Aad::from(ad), &mut buf).is_ok()
    };
    let header_ad = [&b"blindfold-dir-header-v1"[..], &raw[..32]].concat();
    if open(&raw[32..44], &header_ad, &raw[44..60]) {
        return true;
    }
    let slot = 12 + 4096 + 16;
    (0..(raw.len() - 64) / slot).any(|i| {
        let at = 64 + i * slot;
        let ad = [&b"blindfold-dir-page-v1"[..], &id, &(i as u64).to_le_bytes()].concat();
        open(&raw[at..at + 12], &ad, &raw[at..at + slot])
            || open(&raw[at..at + 12], &ad, &raw[at + 12..at + slot])
    })
}

/// Redo-log frames (magic u32, length u64, CRC u32, sealed body) that open under `state`.
fn log_frames_opening(state: &StateSealer, raw: &[u8]) -> usize {
    let (mut at, mut n) = (0, 0);
    while raw.len() - at >= 16 {
        let magic = &raw[at..at + 4];
        let len = u64::from_le_bytes(raw[at + 4..at + 12].try_into().unwrap()) as usize;
        let Some(body) = raw.get(at + 16..at + 16 + len) else { break };
        n += usize::from(state.open(magic, body).is_ok());
        at += 16 + len;
    }
    n
}

/// A data directory with objects, a user and two snapshots (both slots) under its first key,
/// stopped cleanly; then `rotate-key`. Returns the old key.
async fn prepared(root: &Path, engine: Setup) -> MasterKey {
    let cfg = cfg(root, engine);
    for round in 0..2u8 {
        let opened = server::open(&cfg).await.unwrap();
        if round == 0 {
            opened.objects.directory().create_bucket("b").unwrap();
            let users = blindfold_gateway::users::UserFile::new(&cfg.data_dir, &opened.key);
            users.add("alice", vec!["b".into()], false).unwrap();
        }
        for i in 0..4 {
            put(&opened, &format!("before-{round}-{i}"), contents(round * 4 + i)).await;
        }
        opened.objects.shutdown().await.unwrap();
        server::write_snapshot(&opened).await.unwrap();
    }
    let key_path = cfg.key_file.clone().unwrap();
    let old = load_key_file(&key_path, None).unwrap();
    rotation::prepare(&cfg.data_dir, &key_path, &old, None).unwrap();
    old
}

/// Serves the data directory until the rotation reports finished (its file is gone), or until
/// `died` says the process was killed; then what opens under `old` at that instant (for a
/// finished rotation), and after the clean stop that follows.
async fn serve_rotation(
    root: &Path,
    engine: Setup,
    hooks: OpenHooks,
    died: impl Fn() -> bool + Send + 'static,
    old: &MasterKey,
    before: &HashSet<[u8; 16]>,
) -> Option<(Vec<String>, Vec<String>)> {
    let cfg = cfg(root, engine);
    let opened = match server::open_with(&cfg, hooks).await {
        Ok(opened) => opened,
        // The tee engine re-keys its cells as it opens: the crash can come then.
        Err(e) => {
            assert!(died(), "{engine:?}: {e}");
            return None;
        }
    };
    assert!(opened.rotation.is_some(), "{engine:?}: a rotation is under way");
    // An ordinary write in the middle of the rotation (it may meet the crash: the next start
    // writes it again).
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from(contents(99)))]);
    let during = opened.objects.put_object("b", "during", body, None, BTreeMap::new(), false);
    if let Err(e) = during.await {
        assert!(died(), "{engine:?}: {e}");
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let file = cfg.data_dir.join(ROTATION_FILE);
    let at_finish = Arc::new(parking_lot::Mutex::new(None));
    let seen = Arc::clone(&at_finish);
    let (old2, before2, root2) =
        (MasterKey::from_bytes(*old.expose_bytes()), before.clone(), root.to_owned());
    let served = server::run(opened, listener, async move {
        let t0 = std::time::Instant::now();
        while file.exists() && !died() {
            assert!(t0.elapsed().as_secs() < 300, "{engine:?}: the rotation did not finish");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        if !file.exists() {
            *seen.lock() = Some(opens_under(&old2, &before2, &root2).await);
        }
    })
    .await;
    let at_finish = at_finish.lock().take()?;
    served.unwrap();
    Some((at_finish, opens_under(old, before, root).await))
}

/// Every object reads back after the rotation, under the new key alone.
async fn objects_intact(root: &Path, engine: Setup) {
    let cfg = cfg(root, engine);
    let opened = server::open(&cfg).await.unwrap();
    assert!(opened.rotation.is_none());
    for round in 0..2u8 {
        for i in 0..4 {
            let got = common::read_object(&opened, &format!("before-{round}-{i}")).await.unwrap();
            assert_eq!(got, contents(round * 4 + i), "{engine:?}");
        }
    }
    assert_eq!(common::read_object(&opened, "during").await.unwrap(), contents(99));
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{engine:?}: {report:?}");
    opened.objects.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_rotation_the_old_key_opens_nothing() {
    let mut failures = Vec::new();
    for engine in ENGINES.into_iter().chain(TAO_LAYOUTS) {
        let root = tempfile::tempdir().unwrap();
        let old = prepared(root.path(), engine).await;
        let before = heads(&root.path().join("cells"));
        let never = || false;
        let (at_finish, after_stop) =
            serve_rotation(root.path(), engine, OpenHooks::default(), never, &old, &before)
                .await
                .expect("finished");
        failures.extend(at_finish.iter().map(|f| format!("{engine:?}, at the finish: {f}")));
        failures.extend(after_stop.iter().map(|f| format!("{engine:?}, after the stop: {f}")));
        objects_intact(root.path(), engine).await;
    }
    assert!(failures.is_empty(), "the retired key still opens:\n{}", failures.join("\n"));
}

type Counted = CountingStore<Arc<dyn Store>>;

/// Cell writes to the ORAM array of a whole rotation of `engine` (from the start that takes it
/// up to its clean stop), to place the crashes below.
async fn rotation_writes(engine: Setup) -> u64 {
    let root = tempfile::tempdir().unwrap();
    let old = prepared(root.path(), engine).await;
    let counted: Arc<parking_lot::Mutex<Option<Arc<Counted>>>> = Default::default();
    let slot = Arc::clone(&counted);
    let hooks = OpenHooks {
        wrap_store: Some(Box::new(move |s: Arc<dyn Store>| {
            let c = Arc::new(CountingStore::new(s));
            *slot.lock() = Some(Arc::clone(&c));
            c as Arc<dyn Store>
        })),
        ..OpenHooks::default()
    };
    let before = heads(&root.path().join("cells"));
    serve_rotation(root.path(), engine, hooks, || false, &old, &before).await.expect("finished");
    let writes = counted.lock().as_ref().unwrap().counts().cells_written;
    writes
}

/// The rotation is cut short by a crash — the store dies after a tenth, half and nine tenths of
/// the cell writes a whole rotation makes: in the first pass of the sweep, about where the
/// second begins, in the second (for the partition engines, also while small levels are
/// cleared) — the gateway starts again and resumes it; once it reports finished, the old key
/// opens nothing and every object reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_cut_short_by_a_crash_resumes_to_the_same_end() {
    let mut failures = Vec::new();
    for engine in ENGINES {
        let total = rotation_writes(engine).await as i64;
        for writes in [total / 10, total / 2, total * 9 / 10] {
            let root = tempfile::tempdir().unwrap();
            let old = prepared(root.path(), engine).await;
            let before = heads(&root.path().join("cells"));
            let dying: Arc<parking_lot::Mutex<Option<Arc<DyingStore>>>> = Default::default();
            let slot = Arc::clone(&dying);
            let hooks = OpenHooks {
                wrap_store: Some(Box::new(move |s: Arc<dyn Store>| {
                    let d = Arc::new(DyingStore::new(s, writes));
                    *slot.lock() = Some(Arc::clone(&d));
                    d as Arc<dyn Store>
                })),
                ..OpenHooks::default()
            };
            let probe = Arc::clone(&dying);
            let died = move || probe.lock().as_ref().is_some_and(|d| d.is_dead());
            let first = serve_rotation(root.path(), engine, hooks, died, &old, &before).await;
            assert!(first.is_none(), "{engine:?}: no crash after {writes} of {total} writes");
            // The process is gone; the next start resumes the rotation.
            drop(dying);
            let (at_finish, after_stop) =
                serve_rotation(root.path(), engine, OpenHooks::default(), || false, &old, &before)
                    .await
                    .expect("the resumed rotation finishes");
            let what = format!("{engine:?}, crash after {writes} of {total} writes");
            failures.extend(at_finish.iter().map(|f| format!("{what}, at the finish: {f}")));
            failures.extend(after_stop.iter().map(|f| format!("{what}, after the stop: {f}")));
            objects_intact(root.path(), engine).await;
        }
    }
    assert!(failures.is_empty(), "the retired key still opens:\n{}", failures.join("\n"));
}
