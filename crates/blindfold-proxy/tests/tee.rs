//! The TEE-assisted engine end to end with the real trusted component (`blindfold_tee::Enclave`)
//! in its host (`TeeHost`), where it goes beyond the engine suite (`tests/contract.rs`, which
//! runs the `HashMap` model under reordering, tampering, swapping and rollback over this engine
//! too): a tampered cell stops the engine; committed writes surviving a crash at any point with
//! the trusted component living on across the gateway's crashes or not; what the store sees
//! (paths, schedule, no slot read twice between writes, across crashes too); query tickets.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_oram::tee::TeeOramConfig;
use blindfold_oram::BlockId;
use blindfold_proxy::{DurableTee, Preload, ProxyError};
use blindfold_store::{MemoryStore, RecordingStore, Store, TeeHost, TeeStore, TraceEvent, TraceOp};
use blindfold_tee::Enclave;
use blindfold_testkit::{CrashLedger, DyingStore};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BS: u32 = 64;

fn config(blocks: u64) -> TeeOramConfig {
    TeeOramConfig::builder(blocks, BS).arity(4).round_queries(8).build().unwrap()
}

fn host(backing: Arc<dyn Store>, key: &MasterKey) -> Arc<dyn TeeStore> {
    let enclave = Enclave::new(&DurableTee::tee_key(key), BS as usize);
    Arc::new(TeeHost::new(backing, Arc::new(enclave)))
}

fn data(tag: u64) -> Vec<u8> {
    let mut d = vec![0u8; BS as usize];
    d[..8].copy_from_slice(&tag.to_le_bytes());
    d[8..16].copy_from_slice(&(!tag).to_le_bytes());
    d
}

async fn create(
    dir: &std::path::Path,
    config: TeeOramConfig,
    store: Arc<dyn TeeStore>,
    key: &MasterKey,
    id: StoreId,
) -> DurableTee {
    DurableTee::create(dir, config, store, key, id, Preload::none(), &mut |_, _| {}).await.unwrap()
}

/// An engine with blocks 0..32 written and committed, over a store the test can reach.
async fn written(
    dir: &std::path::Path,
) -> (DurableTee, Arc<MemoryStore>, MasterKey, HashMap<u64, Vec<u8>>) {
    let config = config(64);
    let key = MasterKey::generate();
    let id = StoreId::random();
    let backing = Arc::new(MemoryStore::new(DurableTee::geometry(&config).unwrap()));
    let engine = create(dir, config, host(backing.clone(), &key), &key, id).await;
    let mut model = HashMap::new();
    for round in 0..3u64 {
        for b in 0..32u64 {
            engine.write(BlockId(b), data(round * 100 + b)).await.unwrap();
            model.insert(b, data(round * 100 + b));
        }
    }
    engine.commit().await.unwrap();
    engine.settle().await.unwrap();
    assert!(engine.block_cells().len() >= 8, "{:?}", engine.stats());
    (engine, backing, key, model)
}

fn is_integrity(r: &Result<Vec<u8>, ProxyError>) -> bool {
    matches!(r, Err(e) if e.is_integrity())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_cell_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let (engine, backing, _, _) = written(dir.path()).await;
    let (block, cell) = engine.block_cells()[0];
    let mut bytes = backing.read(&[cell]).await.unwrap().remove(0);
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    backing.write(vec![(cell, bytes)]).await.unwrap();
    let r = engine.read(BlockId(block)).await;
    assert!(is_integrity(&r), "{r:?}");
    // The engine stops after an integrity error.
    assert!(matches!(engine.read(BlockId(block)).await, Err(ProxyError::Poisoned)));
}

/// Every query's cells (in order), and checks that none is read by a query twice before a
/// round writes it.
fn queries_checked(trace: &[TraceEvent], read: &mut HashSet<u64>) -> Vec<Vec<u64>> {
    let mut queries = Vec::new();
    for e in trace {
        match e.op {
            TraceOp::TeeQuery => {
                for c in &e.cells {
                    assert!(read.insert(c.0), "cell {} read by two queries between writes", c.0);
                }
                queries.push(e.cells.iter().map(|c| c.0).collect());
            }
            TraceOp::Write => {
                for c in &e.cells {
                    read.remove(&c.0);
                }
            }
            _ => {}
        }
    }
    queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_writes_survive_a_crash_at_any_point_and_no_slot_is_read_twice() {
    for seed in [7, 8, 9] {
        crash_run(seed).await;
    }
}

async fn crash_run(seed: u64) {
    let config = config(64);
    let key = MasterKey::generate();
    let id = StoreId::random();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let geometry = DurableTee::geometry(&config).unwrap();
    let backing: Arc<dyn Store> = Arc::new(MemoryStore::new(geometry));
    let dir = tempfile::tempdir().unwrap();
    // The host's trusted component lives on across the gateway's crashes in half the trials
    // (it then refuses round numbers it has seen), and restarts with it in the others.
    let enclave = Arc::new(Enclave::new(&DurableTee::tee_key(&key), BS as usize));
    let recorder = Arc::new(RecordingStore::new(TeeHost::new(backing.clone(), enclave.clone())));
    let engine = create(dir.path(), config, recorder.clone(), &key, id).await;
    engine.shutdown().await.unwrap();
    drop(engine);
    let mut ledger = CrashLedger::new(BS as usize);
    let mut read_cells = HashSet::new();
    let mut crashes = 0;
    for trial in 0..24u64 {
        let dying: Arc<dyn Store> =
            Arc::new(DyingStore::new(backing.clone(), rng.gen_range(0..3000)));
        let enclave = if trial % 2 == 0 {
            enclave.clone()
        } else {
            Arc::new(Enclave::new(&DurableTee::tee_key(&key), BS as usize))
        };
        let recorder = Arc::new(RecordingStore::new(TeeHost::new(dying, enclave)));
        let Ok((engine, _)) = DurableTee::open(dir.path(), recorder.clone(), &key).await else {
            crashes += 1; // the store died while the engine recovered
            queries_checked(&recorder.take_trace(), &mut read_cells);
            continue;
        };
        for b in ledger.blocks() {
            let Ok(got) = engine.read(BlockId(b)).await else { break }; // the store died again
            ledger.recovered(b, got, &format!("after crash {crashes} (trial {trial})"));
        }
        let e = &engine;
        let died = ledger
            .write_and_commit(
                400,
                64,
                &mut rng,
                |i| data(trial * 10_000 + i),
                |b, d| async move { e.write(BlockId(b), d).await.is_ok() },
                || async { e.commit().await.is_ok() },
            )
            .await;
        if !died && engine.shutdown().await.is_ok() {
            ledger.committed();
        } else {
            ledger.crashed();
        }
        crashes += u32::from(died);
        engine.halt().await;
        queries_checked(&recorder.take_trace(), &mut read_cells);
        drop(engine);
    }
    assert!(crashes >= 5, "the store died only {crashes} times");
    let recorder = Arc::new(RecordingStore::new(TeeHost::new(backing.clone(), enclave)));
    let (engine, _) = DurableTee::open(dir.path(), recorder.clone(), &key).await.unwrap();
    for b in ledger.acked_blocks() {
        let got = engine.read(BlockId(b)).await.unwrap();
        ledger.check(b, &got, "at the end");
    }
    queries_checked(&recorder.take_trace(), &mut read_cells);
    let report = engine.verify(|_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}

/// Runs `ops` accesses (block chosen by `pick`) and returns the store's trace.
async fn trace_of(pick: impl Fn(u64) -> u64) -> (TeeOramConfig, Vec<TraceEvent>) {
    let config = config(256);
    let key = MasterKey::generate();
    let id = StoreId::random();
    let backing: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurableTee::geometry(&config).unwrap()));
    let recorder = Arc::new(RecordingStore::new(TeeHost::new(
        backing,
        Arc::new(Enclave::new(&DurableTee::tee_key(&key), BS as usize)),
    )));
    let dir = tempfile::tempdir().unwrap();
    let engine = create(dir.path(), config.clone(), recorder.clone(), &key, id).await;
    recorder.clear();
    for i in 0..2000u64 {
        let b = pick(i);
        if i % 2 == 0 {
            engine.write(BlockId(b), data(i)).await.unwrap();
        } else {
            engine.read(BlockId(b)).await.unwrap();
        }
    }
    engine.shutdown().await.unwrap();
    (config, recorder.take_trace())
}

/// The node (index within its layer) of each layer's cell in `cells` (one per layer, root first).
fn nodes_of(config: &TeeOramConfig, cells: &[u64]) -> Vec<u64> {
    let m = u64::from(config.arity());
    let mut base = 0u64;
    let mut out = Vec::new();
    for (layer, &c) in cells.iter().enumerate() {
        let z = u64::from(config.slots_at(layer as u32));
        out.push((c - base) / (2 * z));
        base += m.pow(layer as u32) * 2 * z;
    }
    out
}

/// The leaf-layer node (0..leaves) of a query, checking its cells form one root-to-leaf path.
fn leaf_of(config: &TeeOramConfig, cells: &[u64]) -> u64 {
    let m = u64::from(config.arity());
    let mut base = 0u64;
    let mut prev: Option<u64> = None;
    for (layer, &c) in cells.iter().enumerate() {
        let z = u64::from(config.slots_at(layer as u32));
        let count = m.pow(layer as u32);
        assert!(c >= base && c < base + count * 2 * z, "cell {c} is not on layer {layer}");
        let idx = (c - base) / (2 * z);
        if let Some(p) = prev {
            assert_eq!(idx / m, p, "a query's cells are not on one path");
        }
        prev = Some(idx);
        base += count * 2 * z;
    }
    prev.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_sees_uniform_paths_and_a_fixed_schedule_whatever_the_workload() {
    let (config, hammer) = trace_of(|_| 3).await;
    let (_, scan) = trace_of(|i| i % 256).await;
    let leaves = config.leaves() as usize;
    let mut shapes = Vec::new();
    for (name, trace) in [("hammer", &hammer), ("scan", &scan)] {
        let queries = queries_checked(trace, &mut HashSet::new());
        assert_eq!(queries.len(), 2000, "{name}: one query per access");
        let mut counts = vec![0f64; leaves];
        for q in &queries {
            assert_eq!(q.len() as u32, config.layers());
            counts[leaf_of(&config, q) as usize] += 1.0;
        }
        let expected = queries.len() as f64 / leaves as f64;
        let chi: f64 = counts.iter().map(|c| (c - expected).powi(2) / expected).sum();
        let df = (leaves - 1) as f64;
        assert!(
            chi < df + 6.0 * (2.0 * df).sqrt(),
            "{name}: query leaves not uniform (chi² {chi})"
        );
        // The eviction rounds (those carrying blocks up; reshuffles carry none): which cells
        // each layer reads, in order.
        let cell = blindfold_tee::cell_len(BS as usize) as u64;
        let up = u64::from(config.round_blocks()) * cell;
        // Which node each layer reads, by its first cell (the area a node is in also depends
        // on its reshuffles, which follow the random paths).
        let rounds: Vec<Vec<u64>> = trace
            .iter()
            .enumerate()
            .filter(|(_, e)| e.op == TraceOp::TeeEvict && e.bytes >= up)
            .map(|(i, e)| {
                let firsts: Vec<u64> = trace[i + 1..i + 1 + 2 * e.groups.len()]
                    .iter()
                    .filter(|r| r.op == TraceOp::Read)
                    .map(|r| r.cells[0].0)
                    .collect();
                nodes_of(&config, &firsts)
            })
            .collect();
        shapes.push(rounds);
    }
    // (Rounds may lag behind the queries, so the runs stop after different numbers of them:
    // the same sequence, cut at different points.)
    let first_difference = shapes[0].iter().zip(&shapes[1]).position(|(a, b)| a != b);
    assert!(
        shapes[0].len().min(shapes[1].len()) > 50 && first_difference.is_none(),
        "the eviction rounds depend on the workload: {} and {} rounds, first difference at {:?}",
        shapes[0].len(),
        shapes[1].len(),
        first_difference
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_alone_before_a_crash_are_not_forgotten() {
    // Only reads after a clean start (nothing for the redo log but the fact that queries
    // went out), then a crash: the restarted engine must not read any of those cells again
    // before their nodes are rewritten.
    let config = config(64);
    let key = MasterKey::generate();
    let id = StoreId::random();
    let backing: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurableTee::geometry(&config).unwrap()));
    let enclave = Arc::new(Enclave::new(&DurableTee::tee_key(&key), BS as usize));
    let recorder = Arc::new(RecordingStore::new(TeeHost::new(backing.clone(), enclave.clone())));
    let dir = tempfile::tempdir().unwrap();
    let engine = create(dir.path(), config, recorder.clone(), &key, id).await;
    engine.shutdown().await.unwrap();
    drop(engine);
    let mut read_cells = HashSet::new();
    queries_checked(&recorder.take_trace(), &mut read_cells);
    for _ in 0..4 {
        let (engine, _) = DurableTee::open(dir.path(), recorder.clone(), &key).await.unwrap();
        for b in 0..6u64 {
            engine.read(BlockId(b)).await.unwrap();
        }
        engine.halt().await; // a crash: no commit, no round, no checkpoint
        drop(engine);
        queries_checked(&recorder.take_trace(), &mut read_cells);
    }
}

/// A query as the host hands it to the trusted component: the candidate cells, the ticket.
type Captured = (Vec<Vec<u8>>, Vec<u8>);

/// The storage host as an attacker sees it: it keeps a copy of every query it hands the
/// trusted component and passes it on.
#[derive(Debug)]
struct Spy {
    enclave: Arc<Enclave>,
    queries: parking_lot::Mutex<Vec<Captured>>,
}

impl blindfold_store::Trusted for Spy {
    fn query(&self, candidates: &[Vec<u8>], ticket: &[u8]) -> blindfold_store::Result<Vec<u8>> {
        self.queries.lock().push((candidates.to_vec(), ticket.to_vec()));
        blindfold_store::Trusted::query(&*self.enclave, candidates, ticket)
    }

    fn evict(&self, blocks: &mut [Vec<u8>], ticket: &[u8]) -> blindfold_store::Result<()> {
        blindfold_store::Trusted::evict(&*self.enclave, blocks, ticket)
    }
}

/// The attack on query tickets (#43, point 5). The host captures the tickets of real
/// queries and tries them again: replayed to the same trusted component, re-targeted (every
/// candidate replaced by one cell, to learn from the answer whether that cell was the target)
/// on a trusted component that never saw them, and delivered out of order. Every attempt must
/// be refused with an error, and the genuine queries must have been answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captured_query_tickets_cannot_be_replayed_retargeted_or_reordered() {
    let config = config(64);
    let key = MasterKey::generate();
    let tee_key = DurableTee::tee_key(&key);
    let backing: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurableTee::geometry(&config).unwrap()));
    let enclave = Arc::new(Enclave::new(&tee_key, BS as usize));
    let spy = Arc::new(Spy { enclave: enclave.clone(), queries: Default::default() });
    let host: Arc<dyn TeeStore> = Arc::new(TeeHost::new(backing, spy.clone()));
    let dir = tempfile::tempdir().unwrap();
    let engine = create(dir.path(), config, host, &key, StoreId::random()).await;
    for b in 0..16u64 {
        engine.write(BlockId(b), data(b)).await.unwrap();
    }
    engine.commit().await.unwrap();
    engine.settle().await.unwrap();
    spy.queries.lock().clear();
    // Queries one at a time, as a client reading objects.
    for b in 0..8u64 {
        assert_eq!(engine.read(BlockId(b)).await.unwrap(), data(b));
    }
    let captured = spy.queries.lock().clone();
    assert!(captured.len() >= 8, "{} queries captured", captured.len());

    // 1. Replayed to the trusted component that answered them.
    let replayed: Vec<usize> = (0..captured.len())
        .filter(|&i| enclave.query(&captured[i].0, &captured[i].1).is_ok())
        .collect();
    // 2. Re-targeted: all candidates set to candidate x, on a trusted component that never saw
    //    the ticket (a fresh one per attempt, so that only the candidates can make it refuse).
    let mut answered = 0;
    let mut targets_found = 0;
    for (cands, ticket) in &captured {
        let mut found = false;
        for x in 0..cands.len() {
            let fresh = Enclave::new(&tee_key, BS as usize);
            let all_x = vec![cands[x].clone(); cands.len()];
            if fresh.query(&all_x, ticket).is_ok() {
                answered += 1;
                found = true;
            }
        }
        targets_found += usize::from(found);
    }
    // 3. Reordered: the second query's ticket, then the first's, on a fresh trusted component.
    let fresh = Enclave::new(&tee_key, BS as usize);
    let second = fresh.query(&captured[1].0, &captured[1].1);
    let first = fresh.query(&captured[0].0, &captured[0].1);
    let attempts: usize = captured.iter().map(|c| c.0.len()).sum();
    assert!(
        replayed.is_empty() && answered == 0 && first.is_err(),
        "replayed tickets answered: {} of {}; re-targeted tickets answered: {answered} of \
         {attempts}, showing the target of {targets_found} of {} queries; the earlier of two \
         reordered tickets answered: {}",
        replayed.len(),
        captured.len(),
        captured.len(),
        first.is_ok()
    );
    // In order, a ticket the trusted component has not seen is answered.
    assert!(second.is_ok(), "{second:?}");
    // The refusals say why.
    let replay = enclave.query(&captured[0].0, &captured[0].1).unwrap_err().to_string();
    assert!(replay.contains("replay"), "{replay}");
    let reorder = first.unwrap_err().to_string();
    assert!(reorder.contains("replay"), "{reorder}");
    // The engine goes on answering (its own tickets are fresh).
    for b in 8..12u64 {
        assert_eq!(engine.read(BlockId(b)).await.unwrap(), data(b));
    }
}
