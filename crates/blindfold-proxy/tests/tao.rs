//! The TaoStore-style concurrent engine under adversarial scheduling: a `JitterStore` delays
//! and reorders every storage call and reply at random (seeded).
//!
//! * Many concurrent clients against a `HashMap` model, including many hammering one block.
//! * Replies are released in arrival order.
//! * Obliviousness on the recorded trace: shape independent of the workload, uniform leaves
//!   (fake reads), random-looking written bytes.
//! * Tampering and rollback are integrity errors; flush, export and import round-trip.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use blindfold_crypto::{CellSealer, MasterKey, StoreId};
use blindfold_oram::{BlockId, Op, PathOramConfig};
use blindfold_proxy::{ProxyError, SealedPathOram, TaoConfig, TaoOram, TaoState};
use blindfold_store::{
    CellId, JitterStore, MemoryStore, RecordingStore, Store, TraceEvent, TraceOp,
};
use blindfold_testkit::stats;
use rand::{Rng, SeedableRng};
use rand_chacha::{ChaCha20Rng, ChaCha8Rng};

/// Significance level of the statistical checks (runs are seeded, so passes reproduce).
const ALPHA: f64 = 1e-4;

const BLOCKS: u64 = 512;
const BLOCK_SIZE: u32 = 32;

fn config(k: usize) -> TaoConfig {
    TaoConfig::builder(BLOCKS, BLOCK_SIZE).write_back_every(k).build().unwrap()
}

fn sealer() -> CellSealer {
    CellSealer::new(&MasterKey::generate(), StoreId::random(), 0)
}

fn value(tag: u64) -> Vec<u8> {
    let mut v = vec![0u8; BLOCK_SIZE as usize];
    v[..8].copy_from_slice(&tag.to_le_bytes());
    v[8..16].copy_from_slice(&(!tag).to_le_bytes());
    v
}

fn zeros() -> Vec<u8> {
    vec![0u8; BLOCK_SIZE as usize]
}

struct Setup {
    memory: Arc<MemoryStore>,
    recording: Arc<RecordingStore<Arc<dyn Store>>>,
    oram: Arc<TaoOram>,
}

/// Engine over recording → jitter (up to `jitter_ms`) → memory.
fn setup(k: usize, jitter_ms: u64, seed: u64, payloads: bool) -> Setup {
    let config = config(k);
    let memory = Arc::new(MemoryStore::new(config.geometry().unwrap()));
    let jitter: Arc<dyn Store> =
        Arc::new(JitterStore::new(Arc::clone(&memory), Duration::from_millis(jitter_ms), seed));
    let recording = Arc::new(if payloads {
        RecordingStore::with_payloads(jitter)
    } else {
        RecordingStore::new(jitter)
    });
    let store: Arc<dyn Store> = recording.clone();
    let oram = TaoOram::with_rng(config, store, sealer(), ChaCha20Rng::seed_from_u64(seed));
    Setup { memory, recording, oram: Arc::new(oram.unwrap()) }
}

/// Clients own disjoint blocks, so each can check its own model exactly while all of them
/// share the tree, the stash and the subtree.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_match_a_model() {
    for k in [1, 7, 40] {
        let s = setup(k, 3, k as u64, false);
        let clients: Vec<_> = (0..24u64)
            .map(|c| {
                let oram = Arc::clone(&s.oram);
                tokio::spawn(async move {
                    let mut rng = ChaCha8Rng::seed_from_u64(c);
                    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
                    for i in 0..60u64 {
                        let block = c * 16 + rng.gen_range(0..16);
                        let want = model.get(&block).cloned().unwrap_or_else(zeros);
                        if rng.gen_bool(0.5) {
                            let v = value((c << 32) | (i + 1));
                            let old = oram.access(BlockId(block), Op::Write(v.clone())).await;
                            assert_eq!(old.unwrap(), want, "client {c} op {i} k {k}");
                            model.insert(block, v);
                        } else {
                            let got = oram.read(BlockId(block)).await.unwrap();
                            assert_eq!(got, want, "client {c} op {i} k {k}");
                        }
                    }
                    model
                })
            })
            .collect();
        let mut all = HashMap::new();
        for c in clients {
            all.extend(c.await.unwrap());
        }
        s.oram.flush().await.unwrap();
        assert_eq!(s.oram.subtree_len(), 0, "flush empties the subtree");
        for (block, v) in &all {
            assert_eq!(&s.oram.read(BlockId(*block)).await.unwrap(), v);
        }
        let stats = s.oram.stats();
        assert_eq!(stats.paths_fetched, stats.requests);
        assert!(stats.max_in_flight > 4, "{stats:?}");
    }
}

/// Requests submitted in a known order, many on the same few blocks at once: each reply is
/// exactly what the model holds at that point of the order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hammering_few_blocks_is_linearizable_in_arrival_order() {
    let s = setup(10, 4, 99, false);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    for round in 0..20u64 {
        let mut replies = Vec::new();
        for i in 0..50u64 {
            let block = [3, 3, 3, 200][rng.gen_range(0..4)];
            let before = model.get(&block).cloned().unwrap_or_else(zeros);
            let op = if rng.gen_bool(0.4) {
                let v = value(round * 1000 + i + 1);
                model.insert(block, v.clone());
                Op::Write(v)
            } else {
                Op::Read
            };
            replies.push((s.oram.submit(BlockId(block), op).unwrap(), before));
        }
        for (i, (reply, before)) in replies.into_iter().enumerate() {
            assert_eq!(reply.await.unwrap(), before, "round {round} request {i}");
        }
    }
    let stats = s.oram.stats();
    assert!(stats.fake_reads > 500, "concurrent requests on one block use fake reads: {stats:?}");
}

/// The sequencer releases replies in arrival order, whatever order the store answers in.
#[tokio::test(flavor = "current_thread")]
async fn replies_leave_in_arrival_order() {
    let s = setup(5, 10, 3, false);
    let done = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut watchers = Vec::new();
    for i in 0..64u64 {
        let reply = s.oram.submit(BlockId(i * 7 % BLOCKS), Op::Read).unwrap();
        let done = Arc::clone(&done);
        watchers.push(tokio::spawn(async move {
            reply.await.unwrap();
            done.lock().push(i);
        }));
    }
    for w in watchers {
        w.await.unwrap();
    }
    let order = done.lock().clone();
    assert_eq!(order, (0..64).collect::<Vec<_>>());
    // The store did answer out of order: the path reads were not all recorded in order of
    // their replies (a weak check that the jitter is real).
    assert!(s.recording.trace().len() >= 64);
}

#[derive(Clone, Copy, Debug)]
enum Workload {
    Hammer,
    Uniform,
    Scan,
}

/// Runs `clients` closed-loop clients for `per_client` requests each; returns the trace.
async fn run_workload(w: Workload, seed: u64, payloads: bool) -> (Vec<TraceEvent>, Arc<TaoOram>) {
    const CLIENTS: u64 = 16;
    const PER_CLIENT: u64 = 150;
    let s = setup(10, 2, seed, payloads);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let oram = Arc::clone(&s.oram);
            tokio::spawn(async move {
                let mut rng = ChaCha8Rng::seed_from_u64(seed * 1000 + c);
                for i in 0..PER_CLIENT {
                    let block = match w {
                        Workload::Hammer => 7,
                        Workload::Uniform => rng.gen_range(0..BLOCKS),
                        Workload::Scan => (c * PER_CLIENT + i) % BLOCKS,
                    };
                    let op = if rng.gen_bool(0.5) { Op::Write(vec![0u8; 32]) } else { Op::Read };
                    oram.access(BlockId(block), op).await.unwrap();
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    // Wait for the background write-backs (no partial batch: 2400 is a multiple of k).
    s.oram.flush().await.unwrap();
    (s.recording.take_trace(), s.oram)
}

fn leaf_of_read(e: &TraceEvent) -> u64 {
    let shape = config(1).shape();
    e.cells.last().unwrap().0 - (shape.leaves() - 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trace_shape_and_leaves_do_not_depend_on_the_workload() {
    let shape = config(1).shape();
    let mut write_counts = Vec::new();
    for w in [Workload::Hammer, Workload::Uniform, Workload::Scan] {
        let (trace, oram) = run_workload(w, 11, false).await;
        let reads: Vec<_> = trace.iter().filter(|e| e.op == TraceOp::Read).collect();
        let writes: Vec<_> = trace.iter().filter(|e| e.op == TraceOp::Write).collect();
        assert_eq!(reads.len(), 16 * 150, "{w:?}: one path read per request");
        for r in &reads {
            assert_eq!(r.cells.len() as u32, shape.levels(), "{w:?}: whole paths");
            // The cells are the path to the leaf, root first.
            let leaf = leaf_of_read(r);
            for (level, c) in r.cells.iter().enumerate() {
                assert_eq!(c.0, shape.bucket_on_path(blindfold_oram::Leaf(leaf), level as u32).0);
            }
        }
        let st = oram.stats();
        assert_eq!(st.write_requests as usize, writes.len(), "{w:?}");
        let mut written = 0;
        for wr in &writes {
            // Whole paths: every written cell's parent is written too.
            let cells: std::collections::HashSet<u64> = wr.cells.iter().map(|c| c.0).collect();
            assert!(cells.contains(&0), "{w:?}: the root is on every path");
            assert!(cells.iter().all(|&c| c == 0 || cells.contains(&((c - 1) / 2))), "{w:?}");
            written += wr.cells.len() as u64;
        }
        assert_eq!(written, st.cells_written);
        write_counts.push(st.write_backs);
        let leaves: Vec<u64> = reads.iter().map(|r| leaf_of_read(r)).collect();
        let test = stats::uniformity(&stats::histogram(leaves.iter().copied(), shape.leaves()));
        assert!(test.p_value > ALPHA, "{w:?}: fetched leaves are not uniform: {test:?}");
        // Consecutive requests do not repeat each other's leaves more than chance allows:
        // under the hammer workload a missing fake read would fetch the same path again.
        let repeats = leaves.windows(2).filter(|p| p[0] == p[1]).count();
        assert!(repeats < 2 + leaves.len() / 40, "{w:?}: {repeats} repeated leaves");
        if let Workload::Hammer = w {
            assert!(st.fake_reads > 100, "{st:?}");
        }
    }
    // One batch per k = 10 paths, whatever the workload.
    assert!(write_counts.iter().all(|&n| n == 16 * 150 / 10), "{write_counts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_cells_look_random() {
    let (trace, _) = run_workload(Workload::Hammer, 4, true).await;
    let mut histogram = vec![0u64; 256];
    let mut cells = 0;
    for e in trace.iter().filter(|e| e.op == TraceOp::Write) {
        for p in &e.payloads {
            cells += 1;
            // Skip the key epoch (public, constant) at the front of each sealed cell.
            for &b in &p[4..] {
                histogram[b as usize] += 1;
            }
        }
    }
    assert!(cells > 100);
    let test = stats::uniformity(&histogram);
    assert!(test.p_value > ALPHA, "written bytes are not uniform: {test:?}");
}

/// Writes some blocks and flushes, so the subtree is empty and the next read fetches from the
/// store.
async fn written_and_flushed(s: &Setup) {
    for i in 0..40u64 {
        s.oram.write(BlockId(i), value(i + 1)).await.unwrap();
    }
    s.oram.flush().await.unwrap();
}

async fn all_cells(memory: &MemoryStore) -> Vec<(CellId, Vec<u8>)> {
    let cells: Vec<CellId> = (0..memory.geometry().cell_count()).map(CellId).collect();
    cells.iter().copied().zip(memory.read(&cells).await.unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_cells_are_integrity_errors() {
    let s = setup(4, 1, 21, false);
    written_and_flushed(&s).await;
    let mut cells = all_cells(&s.memory).await;
    for (_, data) in &mut cells {
        let n = data.len();
        data[n / 2] ^= 1;
    }
    s.memory.write(cells).await.unwrap();
    let e = s.oram.read(BlockId(3)).await.unwrap_err();
    assert!(e.is_integrity(), "{e}");
    assert!(s.oram.is_poisoned());
    assert!(matches!(s.oram.read(BlockId(3)).await, Err(ProxyError::Poisoned)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_cells_are_integrity_errors() {
    let s = setup(4, 1, 22, false);
    written_and_flushed(&s).await;
    let old = all_cells(&s.memory).await;
    written_and_flushed(&s).await;
    s.memory.write(old).await.unwrap();
    // Every read fetches the root, which every write-back rewrote.
    let e = s.oram.read(BlockId(3)).await.unwrap_err();
    assert!(e.is_integrity(), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_export_import_round_trip() {
    let s = setup(8, 2, 23, false);
    let mut model = HashMap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for i in 0..203u64 {
        let block = rng.gen_range(0..BLOCKS);
        s.oram.write(BlockId(block), value(i + 1)).await.unwrap();
        model.insert(block, value(i + 1));
    }
    // 203 is not a multiple of k: a batch is still open, so the state is not exportable yet.
    assert!(matches!(s.oram.export_state(), Err(ProxyError::State(_))));
    s.oram.flush().await.unwrap();
    let state = s.oram.export_state().unwrap();
    let json = serde_json::to_vec(&state).unwrap();
    let state: TaoState = serde_json::from_slice(&json).unwrap();
    let store: Arc<dyn Store> = s.recording.clone();
    // Imported under a different key, the cells do not open: import needs the same key (the
    // next test continues with the right one).
    let again = TaoOram::from_state(state, store, sealer(), ChaCha20Rng::seed_from_u64(7)).unwrap();
    let e = again.read(BlockId(*model.keys().next().unwrap())).await.unwrap_err();
    assert!(e.is_integrity(), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_with_the_same_key_continues() {
    let config = config(6);
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(config.geometry().unwrap()));
    let key = MasterKey::generate();
    let id = StoreId::random();
    let oram = TaoOram::new(config, Arc::clone(&memory), CellSealer::new(&key, id, 0)).unwrap();
    let mut model = HashMap::new();
    for i in 0..100u64 {
        let block = (i * 37) % BLOCKS;
        oram.write(BlockId(block), value(i + 1)).await.unwrap();
        model.insert(block, value(i + 1));
    }
    oram.flush().await.unwrap();
    let state = oram.export_state().unwrap();
    drop(oram);
    let again = TaoOram::from_state(
        state,
        memory,
        CellSealer::new(&key, id, 1),
        ChaCha20Rng::seed_from_u64(1),
    )
    .unwrap();
    for (block, v) in &model {
        assert_eq!(&again.read(BlockId(*block)).await.unwrap(), v);
    }
    assert_eq!(again.read(BlockId(1)).await.unwrap(), zeros());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_over_a_bulk_loaded_path_oram() {
    let config = config(10);
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(config.geometry().unwrap()));
    let key = MasterKey::generate();
    let id = StoreId::random();
    let path_config: PathOramConfig = config.tree().clone();
    let mut path =
        SealedPathOram::new(path_config, Arc::clone(&memory), CellSealer::new(&key, id, 0))
            .unwrap();
    path.bulk_load(|b| value(b.0 + 1), |_, _| {}).await.unwrap();
    let state = path.export_state().unwrap();
    let oram = Arc::new(
        TaoOram::from_path_state(
            config,
            state,
            memory,
            CellSealer::new(&key, id, 1),
            ChaCha20Rng::seed_from_u64(2),
        )
        .unwrap(),
    );
    let tasks: Vec<_> = (0..8u64)
        .map(|c| {
            let oram = Arc::clone(&oram);
            tokio::spawn(async move {
                for b in (c..BLOCKS).step_by(8) {
                    assert_eq!(oram.read(BlockId(b)).await.unwrap(), value(b + 1), "block {b}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_stash_bound_is_reported() {
    // 16 leaves: 31 buckets of 4 slots cannot hold 512 blocks.
    let config = TaoConfig::builder(BLOCKS, BLOCK_SIZE).leaves(16).stash_limit(8).build().unwrap();
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new(config.geometry().unwrap()));
    let oram = TaoOram::new(config, memory, sealer()).unwrap();
    let mut saw = false;
    for i in 0..BLOCKS {
        match oram.write(BlockId(i), value(i)).await {
            Ok(()) => {}
            Err(ProxyError::Capacity(m)) => {
                assert!(m.contains("stash"), "{m}");
                saw = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(saw, "overfilling a small tree must overflow the stash");
}

#[tokio::test]
async fn invalid_requests_are_refused() {
    let s = setup(4, 0, 1, false);
    assert!(s.oram.read(BlockId(BLOCKS)).await.is_err());
    assert!(s.oram.write(BlockId(0), vec![0; 3]).await.is_err());
    assert!(TaoConfig::builder(BLOCKS, BLOCK_SIZE).write_back_every(0).build().is_err());
    assert!(!s.oram.is_poisoned());
}

/// Packed two levels per store object ([`blindfold_proxy::PackedStore`] over two slots), the
/// store sees each path as its groups, whatever the workload: a read fetches exactly the
/// groups of one path, to a uniformly random leaf; a write-back writes the groups of whole
/// paths, and reads back first only groups it writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn packed_trace_is_whole_paths_of_groups_whatever_the_workload() {
    use blindfold_proxy::{slotted_geometry, DurableTao, Packing};
    use std::collections::HashSet;
    const CLIENTS: u64 = 8;
    const PER_CLIENT: u64 = 100;
    let config = config(10);
    let shape = config.shape();
    let packing = Packing::new(shape.levels(), 2).unwrap();
    let size = config.geometry().unwrap().cell_size();
    // The groups of the path to each leaf, root first.
    let path_groups = |leaf: u64| -> Vec<u64> {
        let mut g: Vec<u64> = (0..shape.levels())
            .map(|l| packing.group_of(shape.bucket_on_path(blindfold_oram::Leaf(leaf), l).0).0)
            .collect();
        g.dedup();
        g
    };
    let by_groups: HashMap<Vec<u64>, u64> =
        (0..shape.leaves()).map(|leaf| (path_groups(leaf), leaf)).collect();
    // Below the top band every leaf's groups differ only in the last one: by_groups may map
    // several leaves to one set; the read's leaf is then known to within those.
    for w in [Workload::Hammer, Workload::Uniform, Workload::Scan] {
        let memory =
            Arc::new(MemoryStore::new(slotted_geometry(packing.geometry(size).unwrap()).unwrap()));
        let recording = Arc::new(RecordingStore::new(memory as Arc<dyn Store>));
        let dir = tempfile::tempdir().unwrap();
        let key = MasterKey::generate();
        let tao = DurableTao::create_packed(
            dir.path(),
            config.clone(),
            recording.clone() as Arc<dyn Store>,
            &key,
            StoreId::random(),
            0,
            2,
        )
        .await
        .unwrap();
        assert_eq!(tao.pack_levels(), 2);
        let tao = Arc::new(tao);
        recording.take_trace();
        let clients: Vec<_> = (0..CLIENTS)
            .map(|c| {
                let tao = Arc::clone(&tao);
                tokio::spawn(async move {
                    let mut rng = ChaCha8Rng::seed_from_u64(1000 + c);
                    for i in 0..PER_CLIENT {
                        let block = BlockId(match w {
                            Workload::Hammer => 7,
                            Workload::Uniform => rng.gen_range(0..BLOCKS),
                            Workload::Scan => (c * PER_CLIENT + i) % BLOCKS,
                        });
                        if rng.gen_bool(0.5) {
                            tao.write_many(vec![(block, value(i))]).await.unwrap();
                        } else {
                            tao.read_many(&[block]).await.unwrap();
                        }
                        if i % 10 == 9 {
                            tao.commit().await.unwrap();
                        }
                    }
                })
            })
            .collect();
        for c in clients {
            c.await.unwrap();
        }
        tao.commit().await.unwrap();
        let trace = recording.take_trace();
        let n = packing.groups();
        let group = |c: &CellId| c.0 % n; // either slot
        let mut leaves = Vec::new();
        let mut writes = 0;
        for (i, e) in trace.iter().enumerate() {
            let groups: Vec<u64> = e.cells.iter().map(group).collect();
            match e.op {
                TraceOp::Write => {
                    writes += 1;
                    // Whole paths: each written group's parent group is written too.
                    let set: HashSet<u64> = groups.iter().copied().collect();
                    assert!(set.contains(&0), "{w:?}: the root group is on every path");
                    // The read-back before it, if any, names only groups this write writes.
                    if let Some(prev) = i.checked_sub(1).map(|p| &trace[p]) {
                        if prev.op == TraceOp::Read
                            && !by_groups.contains_key(&{
                                let g: Vec<u64> = prev.cells.iter().map(group).collect();
                                g
                            })
                        {
                            assert!(prev.cells.iter().all(|c| set.contains(&group(c))), "{w:?}");
                        }
                    }
                }
                TraceOp::Read => {
                    if let Some(&leaf) = by_groups.get(&groups) {
                        leaves.push(leaf);
                    }
                }
                _ => {}
            }
        }
        assert!(writes > 0);
        // One fetch of a whole path per request (read-backs are not paths of the tree).
        assert_eq!(leaves.len() as u64, CLIENTS * PER_CLIENT, "{w:?}: one path per request");
        // The leaves of the bottom band's groups: uniform over the groups of that band.
        let bottom = 1u64 << (shape.levels() - 1).saturating_sub(1);
        let groups_below: Vec<u64> = leaves.iter().map(|l| l / 2 % bottom).collect();
        let test = stats::uniformity(&stats::histogram(groups_below.iter().copied(), bottom));
        assert!(test.p_value > ALPHA, "{w:?}: fetched paths are not uniform: {test:?}");
    }
}
