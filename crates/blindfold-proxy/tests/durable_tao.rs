//! Crash consistency of `DurableTao`: concurrent writers, grouped commits, and a store that
//! dies part-way through a commit; after a restart every acknowledged write reads back and
//! every stored cell authenticates.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_oram::BlockId;
use blindfold_proxy::{DurableTao, ProxyError, TaoConfig};
use blindfold_store::{CellId, MemoryStore, Store};
use blindfold_testkit::DyingStore;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BS: u32 = 32;

fn config() -> TaoConfig {
    TaoConfig::builder(64, BS).write_back_every(4).build().unwrap()
}

/// A new engine over `store` with the tree's first `pinned` buckets (heap order) in trusted
/// memory.
async fn create(
    dir: &std::path::Path,
    config: TaoConfig,
    store: Arc<dyn Store>,
    key: &MasterKey,
    pinned: u64,
) -> DurableTao {
    DurableTao::create_pinned_cells(dir, config, store, key, StoreId::random(), pinned)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_writes_survive_a_crash_at_any_point() {
    let key = MasterKey::generate();
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for trial in 0..40u64 {
        let dir = tempfile::tempdir().unwrap();
        // Trials 0, 1, 4, 5, … keep two slots per cell; the others overwrite in place. Of the
        // two-slot ones, some store the tree in subtrees of two or three levels per object.
        let two_slots = (trial / 2) % 2 == 0;
        let pack = match trial % 16 {
            1 | 4 => 2,
            8 | 13 => 3,
            _ => 1,
        };
        let geometry = if two_slots {
            DurableTao::packed_geometry(&config(), pack).unwrap()
        } else {
            config().geometry().unwrap()
        };
        let backing: Arc<dyn Store> = Arc::new(MemoryStore::new(geometry));
        let mut acked: HashMap<u64, Vec<u8>> = HashMap::new();
        {
            // Three two-slot trials in four keep the top of the tree in trusted memory (their
            // changes travel in the commit records), with checkpoints along the way or not:
            // two whole levels, or two levels and half the next, or three and 3 of 8.
            let pinned = match trial % 8 {
                _ if !two_slots => 0,
                0 => 3,
                1 => 5,
                4 => 10,
                _ => 0,
            };
            let mut tao = DurableTao::create_packed(
                dir.path(),
                config(),
                backing.clone(),
                &key,
                StoreId::random(),
                pinned,
                if two_slots { pack } else { 1 },
            )
            .await
            .unwrap();
            assert_eq!(tao.two_slots(), two_slots);
            assert_eq!(tao.pack_levels(), if two_slots { pack } else { 1 });
            if trial % 2 == 1 {
                tao.set_log_limit(2_000); // checkpoints along the way
            }
            let tao = Arc::new(tao);
            // Concurrent writers, each committing its own batches.
            let mut tasks = Vec::new();
            for w in 0..4u64 {
                let tao = Arc::clone(&tao);
                let seed = rng.gen::<u64>();
                tasks.push(tokio::spawn(async move {
                    let mut rng = ChaCha8Rng::seed_from_u64(seed);
                    let mut mine = HashMap::new();
                    for i in 0..rng.gen_range(1..6u64) {
                        // Writer w owns blocks w, w+4, w+8, ...
                        let blocks: Vec<u64> =
                            (0..3).map(|_| w + 4 * rng.gen_range(0..16)).collect();
                        let mut batch: HashMap<u64, Vec<u8>> = HashMap::new();
                        for b in blocks {
                            batch.insert(b, vec![(trial * 7 + w * 31 + i) as u8; BS as usize]);
                        }
                        let list: Vec<(BlockId, Vec<u8>)> =
                            batch.iter().map(|(b, d)| (BlockId(*b), d.clone())).collect();
                        tao.write_many(list).await.unwrap();
                        // Reads change the trusted state too (remapping).
                        tao.read_many(&[BlockId(rng.gen_range(0..64))]).await.unwrap();
                        tao.commit().await.unwrap();
                        mine.extend(batch);
                    }
                    mine
                }));
            }
            for t in tasks {
                acked.extend(t.await.unwrap());
            }
        }

        // Reopen over a store that dies after a random number of cell writes; one more
        // write + commit that may be cut anywhere (even while the restart replays the log).
        let dying = Arc::new(DyingStore::new(backing.clone(), rng.gen_range(0..60)));
        let b = rng.gen_range(0..64);
        let new = vec![0xEE; BS as usize];
        let old = acked.get(&b).cloned().unwrap_or_else(|| vec![0; BS as usize]);
        let outcome = async {
            let (tao, _) = DurableTao::open(dir.path(), dying, &key).await?;
            tao.write_many(vec![(BlockId(b), new.clone())]).await?;
            tao.commit().await
        }
        .await;
        let committed = outcome.is_ok();
        if let Err(e) = &outcome {
            assert!(matches!(e, ProxyError::Store(_) | ProxyError::Poisoned), "trial {trial}: {e}");
        }
        if rng.gen_bool(0.3) {
            let mut f =
                std::fs::OpenOptions::new().append(true).open(dir.path().join("redo.log")).unwrap();
            let garbage: Vec<u8> = (0..rng.gen_range(1..300)).map(|_| rng.gen()).collect();
            f.write_all(&garbage).unwrap();
        }

        let (tao, _) = DurableTao::open(dir.path(), backing.clone(), &key).await.unwrap();
        let got = tao.read_many(&[BlockId(b)]).await.unwrap().pop().unwrap();
        if committed {
            assert_eq!(got, new, "trial {trial}: committed write lost");
            acked.insert(b, new.clone());
        } else {
            assert!(got == new || got == old, "trial {trial}: block {b} is neither old nor new");
            acked.insert(b, got);
        }
        let blocks: Vec<BlockId> = acked.keys().map(|&b| BlockId(b)).collect();
        let data = tao.read_many(&blocks).await.unwrap();
        for (blk, d) in blocks.iter().zip(data) {
            assert_eq!(&d, &acked[&blk.0], "trial {trial} block {}", blk.0);
        }
        let report = tao.verify(|_, _| {}).await.unwrap();
        assert!(report.failures.is_empty(), "trial {trial}: {:?}", report.failures);
        assert!(report.cells_checked > 0);
    }
}

#[tokio::test]
async fn tampering_is_reported_by_verify_and_reads() {
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let backing: Arc<dyn Store> = Arc::new(MemoryStore::new(config().geometry().unwrap()));
    let tao = DurableTao::create(dir.path(), config(), backing.clone(), &key, StoreId::random())
        .await
        .unwrap();
    let all: Vec<(BlockId, Vec<u8>)> = (0..64).map(|b| (BlockId(b), vec![b as u8; 32])).collect();
    tao.write_many(all).await.unwrap();
    tao.shutdown().await.unwrap();
    drop(tao);
    // Flip a byte of the root bucket (every path goes through it).
    let mut root = backing.read(&[CellId(0)]).await.unwrap().pop().unwrap();
    root[40] ^= 1;
    backing.write(vec![(CellId(0), root)]).await.unwrap();
    let (tao, _) = DurableTao::open(dir.path(), backing, &key).await.unwrap();
    let report = tao.verify(|_, _| {}).await.unwrap();
    assert_eq!(report.failures.len(), 1, "{report:?}");
    assert_eq!(report.failures[0].0, 0);
    assert!(matches!(tao.read_many(&[BlockId(5)]).await, Err(ProxyError::Integrity { .. })));
}

/// With the top of the tree pinned, the engine keeps those buckets open and rewrites (so
/// seals and logs) one only when a write-back changed it, and its commit records name the
/// blocks the log already holds instead of carrying them again; whatever it skipped, every
/// write survives commits, checkpoints, crashes and restarts, and every cell authenticates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_top_buckets_are_not_rewritten_and_nothing_is_lost() {
    let key = MasterKey::generate();
    let (mut tao, backing, dir, pinned) = pinned_top_engine(&key).await;
    // The sealed top were every pinned cell held sealed.
    let cell_size = backing.geometry().cell_size();
    let sealed_top = pinned * u64::from(cell_size);
    // Trusted memory besides the engine's own: the pinned store's sealed copies, the slot map
    // (a byte a cell) and the overlay (empty after a commit).
    let sealed_held = |tao: &DurableTao| tao.trusted_bytes() - tao.engine().trusted_bytes();
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(17);
    let (mut named, mut with_contents) = (0, 0);
    for round in 0..8u32 {
        for op in 0..40 {
            let b = rng.gen_range(0..256);
            if rng.gen_bool(0.5) {
                let d: Vec<u8> = (0..BS).map(|_| rng.gen()).collect();
                tao.write_many(vec![(BlockId(b), d.clone())]).await.unwrap();
                model.insert(b, d);
            } else {
                let got = tao.read_many(&[BlockId(b)]).await.unwrap().pop().unwrap();
                let want = model.get(&b).cloned().unwrap_or_else(|| vec![0; BS as usize]);
                assert_eq!(got, want, "round {round} block {b}");
            }
            if op % 10 == 9 {
                tao.commit().await.unwrap();
            }
        }
        assert!(tao.engine().top_unchanged() > 0, "round {round}: every top bucket rewritten");
        // The top buckets the engine holds open have no sealed copy besides.
        let held = sealed_held(&tao);
        assert!(held < sealed_top / 2, "round {round}: {held} of {sealed_top} bytes still sealed");
        if round % 2 == 1 {
            let (n, c) = tao.top_blocks_logged();
            (named, with_contents) = (named + n, with_contents + c);
            drop(tao); // a crash: what was committed is in the redo log
            tao = DurableTao::open(dir.path(), backing.clone(), &key).await.unwrap().0;
            if round >= 3 {
                // From here on a checkpoint every few commits: each starts the log afresh.
                tao.set_log_limit(4_000);
            }
        }
    }
    assert!(with_contents < named, "records named no block the log held: {with_contents}/{named}");
    assert_holds(&tao, &model, "").await;
    let report = tao.verify(|_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    // A verify (as a checkpoint) seals the open top for a moment and lets go of it again.
    assert!(sealed_held(&tao) < sealed_top / 2);
    assert_holds(&tao, &model, "").await;
}

/// A checkpoint holds the open tree top whole, so the commit after it names the blocks the
/// checkpoint holds instead of logging their contents again (it did: the first record after
/// each checkpoint carried the whole top, megabytes in the gateway's benchmark); replay finds
/// them in the checkpoint after a crash right after that commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commit_after_a_checkpoint_names_the_top_it_holds() {
    let key = MasterKey::generate();
    let (mut tao, backing, dir, _) = pinned_top_engine(&key).await;
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for round in 0..4u32 {
        // Fill the top: every block written, some twice.
        for _ in 0..300 {
            tao.write_many(vec![random_write(&mut rng, &mut model)]).await.unwrap();
        }
        tao.commit().await.unwrap();
        checkpoint_running(&mut tao, random_write(&mut rng, &mut model)).await;
        // Reads: their write-backs rewrite top buckets whose blocks the checkpoint holds (about
        // half the blocks these records name are; the rest come up from below the top, and are
        // logged with their contents).
        let before = tao.top_blocks_logged();
        for _ in 0..40 {
            let b = rng.gen_range(0..256);
            let got = tao.read_many(&[BlockId(b)]).await.unwrap().pop().unwrap();
            let want = model.get(&b).cloned().unwrap_or_else(|| vec![0; BS as usize]);
            assert_eq!(got, want, "round {round} block {b}");
        }
        // (A commit covers writes: reads alone wait for the next one.)
        tao.write_many(vec![random_write(&mut rng, &mut model)]).await.unwrap();
        tao.commit().await.unwrap();
        let after = tao.top_blocks_logged();
        let (named, with_contents) = (after.0 - before.0, after.1 - before.1);
        assert!(named > 0, "round {round}: the reads' commit named no top block");
        assert!(
            with_contents * 4 < named * 3,
            "round {round}: the commit after a checkpoint logged {with_contents} of the \
             {named} top blocks it named with their contents"
        );
        // A crash: the replay resolves those names from the checkpoint's top.
        drop(tao);
        tao = DurableTao::open(dir.path(), backing.clone(), &key).await.unwrap().0;
        assert_holds(&tao, &model, &format!("round {round}")).await;
    }
    let report = tao.verify(|_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}

/// Every block of `model` reads back as it says (`what`: where, for the message).
async fn assert_holds(tao: &DurableTao, model: &HashMap<u64, Vec<u8>>, what: &str) {
    for (b, d) in model {
        assert_eq!(&tao.read_many(&[BlockId(*b)]).await.unwrap()[0], d, "{what} block {b}");
    }
}

/// The 256-block engine with the whole tree above its leaves pinned in trusted memory, over a
/// new memory store and state directory; and the number of pinned buckets.
async fn pinned_top_engine(
    key: &MasterKey,
) -> (DurableTao, Arc<dyn Store>, tempfile::TempDir, u64) {
    let config = TaoConfig::builder(256, BS).write_back_every(4).build().unwrap();
    let backing: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurableTao::geometry(&config).unwrap()));
    let dir = tempfile::tempdir().unwrap();
    // All but the leaves.
    let pinned = config.shape().buckets() - config.shape().leaves();
    let tao = create(dir.path(), config, backing.clone(), key, pinned).await;
    (tao, backing, dir, pinned)
}

/// New contents for one of the first 256 blocks, noted in `model`.
fn random_write(rng: &mut ChaCha8Rng, model: &mut HashMap<u64, Vec<u8>>) -> (BlockId, Vec<u8>) {
    let b = rng.gen_range(0..256);
    let d: Vec<u8> = (0..BS).map(|_| rng.gen()).collect();
    model.insert(b, d.clone());
    (BlockId(b), d)
}

/// Reads `n` blocks at random.
async fn read_some(tao: &DurableTao, n: usize, rng: &mut ChaCha8Rng) {
    for _ in 0..n {
        let b = rng.gen_range(0..256);
        let _ = tao.read_many(&[BlockId(b)]).await.unwrap();
    }
}

/// Writes `w` and commits with the redo log over its limit: a checkpoint while requests run.
async fn checkpoint_running(tao: &mut DurableTao, w: (BlockId, Vec<u8>)) {
    tao.set_log_limit(1);
    tao.write_many(vec![w]).await.unwrap();
    tao.commit().await.unwrap();
    tao.set_log_limit(u64::MAX);
}

/// The gateway's store-side log holds, between an engine checkpoint and the store checkpoint
/// that carries it, the engine checkpoint before and every frame since, the later ones named
/// against the newer checkpoint: a recovery from the store replays those on the older one. So
/// a record after a checkpoint names without contents only blocks the log already held before
/// it, never those of top buckets the engine reopened from their sealed copies since (a replay
/// from the older checkpoint has no contents for them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_after_a_checkpoint_replay_on_the_checkpoint_before_it() {
    let key = MasterKey::generate();
    for seed in 0..4u64 {
        let (mut tao, backing, dir, _) = pinned_top_engine(&key).await;
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        for _ in 0..300 {
            tao.write_many(vec![random_write(&mut rng, &mut model)]).await.unwrap();
        }
        tao.shutdown().await.unwrap();
        drop(tao);
        // Reopened, the engine holds the top sealed and opens its buckets as paths reach them:
        // a checkpoint right away holds most of them sealed, not by block.
        tao = DurableTao::open(dir.path(), backing.clone(), &key).await.unwrap().0;
        checkpoint_running(&mut tao, random_write(&mut rng, &mut model)).await;
        // The store checkpoint carries that one; the ring, every frame after it.
        let mirror = crate::crash_oblivious::Mirror::from_dir(dir.path(), true);
        tao.tap().attach(mirror.clone());
        // Reads open top buckets from their sealed copies; the next checkpoint holds them
        // by block (while requests run: its log is over the limit).
        read_some(&tao, 30, &mut rng).await;
        checkpoint_running(&mut tao, random_write(&mut rng, &mut model)).await;
        // Reads move blocks of those reopened buckets around the top; a write to commit them.
        let before = tao.top_blocks_logged();
        read_some(&tao, 40, &mut rng).await;
        tao.write_many(vec![random_write(&mut rng, &mut model)]).await.unwrap();
        tao.commit().await.unwrap();
        let after = tao.top_blocks_logged();
        assert!(
            after.1 - before.1 < after.0 - before.0,
            "seed {seed}: the records after the checkpoint named no block without its contents"
        );
        drop(tao);
        // The machine is lost: only what the store-side log would hold.
        let restored = mirror.restore();
        let (tao, _) = DurableTao::open(restored.path(), backing, &key)
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: replay on the older checkpoint: {e}"));
        assert_holds(&tao, &model, &format!("seed {seed}")).await;
    }
}

/// With the top of the tree pinned in trusted memory (whole levels, or part of the next one
/// too), the store never sees a read or a write of it (in either slot), while the engine
/// agrees with a model across commits, restarts, a crash and a rebuild into a new array (whose
/// first start reads the top back once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinned_top_levels_never_reach_the_store() {
    use blindfold_store::{RecordingStore, TraceOp};
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let n = config().tree().total_cells();
    let rec =
        Arc::new(RecordingStore::new(MemoryStore::new(DurableTao::geometry(&config()).unwrap())));
    let all = config().shape().levels();
    assert!(
        DurableTao::create_pinned(dir.path(), config(), rec.clone(), &key, StoreId::random(), all)
            .await
            .is_err(),
        "some level must stay in the store"
    );
    let inner = config().shape().buckets() - config().shape().leaves();
    assert!(
        DurableTao::create_pinned_cells(
            dir.path(),
            config(),
            rec.clone(),
            &key,
            StoreId::random(),
            inner + 1
        )
        .await
        .is_err(),
        "the leaves stay in the store"
    );
    let dir = tempfile::tempdir().unwrap();
    let in_place = Arc::new(MemoryStore::new(config().geometry().unwrap()));
    assert!(
        DurableTao::create_pinned(dir.path(), config(), in_place, &key, StoreId::random(), 3)
            .await
            .is_err(),
        "pinning needs two slots"
    );
    // Three whole levels (7 cells), then three levels and half the next (11).
    for count in [7u64, 11] {
        let rec = Arc::new(RecordingStore::new(MemoryStore::new(
            DurableTao::geometry(&config()).unwrap(),
        )));
        let dir = tempfile::tempdir().unwrap();
        // Cells 0..count, also at n..n+count in the second slot.
        let top = |c: u64| c % n < count;
        // The pinned cells a recording store saw since its trace was last taken.
        let seen_top = |r: &RecordingStore<MemoryStore>| -> Vec<u64> {
            let cells = r.take_trace().into_iter().flat_map(|e| e.cells);
            cells.map(|c| c.0).filter(|&c| top(c)).collect()
        };
        let tao = DurableTao::create_pinned_cells(
            dir.path(),
            config(),
            rec.clone(),
            &key,
            StoreId::random(),
            count,
        )
        .await
        .unwrap();
        let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for round in 0..4u8 {
            for _ in 0..20 {
                let b = rng.gen_range(0..64);
                let d: Vec<u8> = (0..BS).map(|_| rng.gen()).collect();
                tao.write_many(vec![(BlockId(b), d.clone())]).await.unwrap();
                model.insert(b, d);
                tao.read_many(&[BlockId(rng.gen_range(0..64))]).await.unwrap();
            }
            tao.commit().await.unwrap();
            if round == 2 {
                tao.shutdown().await.unwrap(); // a checkpoint with the pinned cells
            }
        }
        drop(tao); // a crash: the last commits are only in the redo log
        let (tao, _) = DurableTao::open(dir.path(), rec.clone(), &key).await.unwrap();
        assert_holds(&tao, &model, "").await;
        let report = tao.verify(|_, _| {}).await.unwrap();
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        tao.shutdown().await.unwrap();
        let touched = seen_top(&rec);
        assert!(touched.is_empty(), "the store saw pinned cells {touched:?}");

        // Recover into a new array: every cell is written there, and the first start reads the
        // top back once (and only then).
        let fresh = Arc::new(RecordingStore::new(MemoryStore::new(
            DurableTao::geometry(&config()).unwrap(),
        )));
        let rebuilt = blindfold_proxy::rebuild::rebuild_tao(
            dir.path(),
            rec.clone(),
            fresh.clone(),
            &key,
            blindfold_proxy::rebuild::fresh_epoch(),
        )
        .await
        .unwrap();
        // (Blocks only ever read have a leaf but no stored copy: the rebuild lists them as lost,
        // and they read as zeros, as before.)
        assert!(rebuilt.unreadable_cells.is_empty(), "{rebuilt:?}");
        assert!(rebuilt.lost.iter().all(|b| !model.contains_key(b)), "{rebuilt:?}");
        fresh.clear();
        let (tao, _) = DurableTao::open(dir.path(), fresh.clone(), &key).await.unwrap();
        let first: Vec<(TraceOp, Vec<u64>)> = fresh
            .take_trace()
            .into_iter()
            .map(|e| (e.op, e.cells.iter().map(|c| c.0).collect()))
            .collect();
        let read_top: Vec<u64> = first
            .iter()
            .filter(|(op, _)| *op == TraceOp::Read)
            .flat_map(|(_, c)| c.iter().copied())
            .filter(|&c| top(c))
            .collect();
        assert_eq!(read_top.len() as u64, count, "the top read once at the first start: {first:?}");
        assert_holds(&tao, &model, "").await;
        tao.commit().await.unwrap();
        let later = seen_top(&fresh);
        assert!(later.is_empty(), "after the start the store saw pinned cells {later:?}");
    }
}

/// Back-pressure: many clients at once over a slow store, with a small bound on the engine's
/// in-memory subtree. Requests wait for room instead of failing with a capacity error, and the
/// subtree stays under its bound. (Without admission control the clients' paths pile up in the
/// subtree and the requests fail with `ProxyError::Capacity`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_clients_waits_instead_of_overflowing_trusted_memory() {
    use blindfold_store::{LatencyStore, LinkConfig};
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    // 1024 blocks: a tree of 511 buckets, 9 on a path; 16 clients with 4 paths each in flight
    // would want up to 576 of them.
    let limit = 64;
    let config =
        TaoConfig::builder(1024, BS).write_back_every(4).subtree_limit(limit).build().unwrap();
    let link = LinkConfig::new(std::time::Duration::from_millis(2), None, None).unwrap();
    let store: Arc<dyn Store> =
        Arc::new(LatencyStore::new(MemoryStore::new(DurableTao::geometry(&config).unwrap()), link));
    let tao = Arc::new(
        DurableTao::create(dir.path(), config, store, &key, StoreId::random()).await.unwrap(),
    );
    let mut tasks = Vec::new();
    for c in 0..16u64 {
        let tao = Arc::clone(&tao);
        tasks.push(tokio::spawn(async move {
            for i in 0..6u64 {
                let blocks: Vec<(BlockId, Vec<u8>)> = (0..4)
                    .map(|j| (BlockId(c * 4 + j), vec![(c + i) as u8; BS as usize]))
                    .collect();
                tao.write_many(blocks).await?;
                if i % 3 == 2 {
                    tao.commit().await?;
                }
            }
            Ok::<_, ProxyError>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().expect("no request fails for lack of room");
    }
    let stats = tao.engine().stats();
    assert!(stats.max_subtree <= limit, "subtree reached {} buckets", stats.max_subtree);
    tao.commit().await.unwrap();
    for c in 0..16u64 {
        let got = tao.read_many(&[BlockId(c * 4)]).await.unwrap();
        assert_eq!(got[0], vec![(c + 5) as u8; BS as usize], "client {c}");
    }
}

/// A store whose writes hang once armed, until released: a commit stuck while writing its
/// cells.
#[derive(Debug)]
struct StallingWrites {
    inner: Arc<dyn Store>,
    armed: std::sync::atomic::AtomicBool,
    stalled: tokio::sync::Notify,
    release: tokio::sync::watch::Sender<bool>,
}

impl StallingWrites {
    fn new(inner: Arc<dyn Store>) -> Self {
        Self {
            inner,
            armed: false.into(),
            stalled: tokio::sync::Notify::new(),
            release: tokio::sync::watch::Sender::new(false),
        }
    }
}

#[async_trait::async_trait]
impl Store for StallingWrites {
    fn geometry(&self) -> blindfold_store::Geometry {
        self.inner.geometry()
    }
    async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.inner.read(cells).await
    }
    async fn read_ranges(
        &self,
        ranges: &[blindfold_store::ByteRange],
    ) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.inner.read_ranges(ranges).await
    }
    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
        if self.armed.load(std::sync::atomic::Ordering::SeqCst) {
            self.stalled.notify_one();
            let _ = self.release.subscribe().wait_for(|go| *go).await;
        }
        self.inner.write(cells).await
    }
    async fn flush(&self) -> blindfold_store::Result<()> {
        self.inner.flush().await
    }
}

/// Commits write the store while requests go on. A request served during that window reveals
/// its block's path too: if the process dies before the commit is durable, the next start
/// must still move that block to a fresh leaf. (Failed when the start replayed only the
/// reveals that follow the last durable commit: every block read during the stuck commit
/// came back on the very leaf the store had just seen.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_served_during_a_commit_stay_oblivious_across_a_crash() {
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let stuck = StuckCommit::start(dir.path(), &key, None).await;
    // Meanwhile, reads are served; note the leaf each one showed the store.
    let before = stuck.read_revealed(&stuck.tao).await;
    // kill -9: the commit never finishes.
    let StuckCommit { tao, rec, committing, n, .. } = stuck;
    committing.abort();
    let _ = committing.await;
    drop(tao);
    let (tao, recovery) = DurableTao::open(dir.path(), rec.clone(), &key).await.unwrap();
    assert!(recovery.reaccessed >= REVEALED.len() as u64, "{recovery:?}");
    // A fresh leaf repeats one in 64 times; all six repeat when the window is forgotten.
    let again = repeats(&tao, &rec, n, &before).await;
    assert!(again <= 2, "{again} of {} blocks read their revealed path again", REVEALED.len());
    let got = tao.read_many(&[BlockId(5)]).await.unwrap().pop().unwrap();
    assert!(got == vec![5; BS as usize] || got == vec![0xEE; BS as usize]);
}

type Recorded = blindfold_store::RecordingStore<MemoryStore>;

/// Blocks read while a commit is stuck (each holds its own number).
const REVEALED: [u64; 6] = [9, 17, 33, 65, 100, 127];

/// A store of 128 blocks, each holding its number (committed), over a recording store whose
/// writes then stall: a commit of a write to block 5 is stuck writing the store.
struct StuckCommit {
    tao: Arc<DurableTao>,
    rec: Arc<Recorded>,
    stall: Arc<StallingWrites>,
    committing: tokio::task::JoinHandle<Result<(), ProxyError>>,
    /// Cells per slot.
    n: u64,
}

impl StuckCommit {
    /// `log_limit`: the engine's (`Some(1)`: every commit after the first checkpoints).
    async fn start(dir: &std::path::Path, key: &MasterKey, log_limit: Option<u64>) -> Self {
        let config = TaoConfig::builder(128, BS).write_back_every(4).build().unwrap();
        let n = config.tree().total_cells();
        let rec = Arc::new(Recorded::new(MemoryStore::new(DurableTao::geometry(&config).unwrap())));
        let stall = Arc::new(StallingWrites::new(rec.clone()));
        let mut tao =
            DurableTao::create(dir, config, stall.clone(), key, StoreId::random()).await.unwrap();
        if let Some(limit) = log_limit {
            tao.set_log_limit(limit);
        }
        let tao = Arc::new(tao);
        for b in 0..128u64 {
            tao.write_many(vec![(BlockId(b), vec![b as u8; BS as usize])]).await.unwrap();
        }
        tao.commit().await.unwrap();
        // A PUT whose commit gets stuck writing the store.
        stall.armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let stalled = stall.stalled.notified();
        let committing = {
            let tao = Arc::clone(&tao);
            tokio::spawn(async move {
                tao.write_many(vec![(BlockId(5), vec![0xEE; BS as usize])]).await.unwrap();
                tao.commit().await
            })
        };
        stalled.await;
        Self { tao, rec, stall, committing, n }
    }

    /// Reads each of [`REVEALED`] through `tao` (within 20 s each: they must not wait for the
    /// stuck commit) and returns the leaf bucket each one showed the store.
    async fn read_revealed(&self, tao: &DurableTao) -> Vec<u64> {
        let mut leaves = Vec::new();
        for b in REVEALED {
            self.rec.clear();
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(20),
                tao.read_many(&[BlockId(b)]),
            )
            .await
            .expect("a read waited for the stuck commit");
            assert_eq!(read.unwrap()[0], vec![b as u8; BS as usize]);
            leaves.push(deepest_read(&self.rec, self.n));
        }
        leaves
    }
}

/// The deepest bucket (either slot) read since the trace was last taken: the leaf of the one
/// path read.
fn deepest_read(rec: &Recorded, n: u64) -> u64 {
    rec.take_trace()
        .into_iter()
        .filter(|e| e.op == blindfold_store::TraceOp::Read)
        .flat_map(|e| e.cells)
        .map(|c| c.0 % n)
        .max()
        .unwrap()
}

/// Reads each of [`REVEALED`] again (after a restart) and counts those that showed the store
/// the same leaf as `before`.
async fn repeats(tao: &DurableTao, rec: &Recorded, n: u64, before: &[u64]) -> usize {
    let mut again = 0;
    for (b, leaf) in REVEALED.iter().zip(before) {
        rec.clear();
        assert_eq!(tao.read_many(&[BlockId(*b)]).await.unwrap()[0], vec![*b as u8; BS as usize]);
        again += usize::from(deepest_read(rec, n) == *leaf);
    }
    again
}

/// Packed two levels per store object, a bucket tampered with inside its object, two objects
/// swapped, or the store rolled back to an older copy of every object: `verify` names the
/// damaged buckets and a read is an integrity error, never wrong data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_packed_tree_detects_tampering_swaps_and_rollback() {
    let key = MasterKey::generate();
    let geometry = DurableTao::packed_geometry(&config(), 2).unwrap();
    let bucket = config().geometry().unwrap().cell_size() as usize;
    assert_eq!(geometry.cell_size() as usize, 3 * bucket);
    let objects = geometry.cell_count();
    for attack in ["tamper", "swap", "rollback"] {
        let dir = tempfile::tempdir().unwrap();
        let backing = Arc::new(MemoryStore::new(geometry));
        let fill = |tag: u8| -> Vec<(BlockId, Vec<u8>)> {
            (0..64).map(|b| (BlockId(b), vec![tag ^ b as u8; BS as usize])).collect()
        };
        let tao = DurableTao::create_packed(
            dir.path(),
            config(),
            backing.clone(),
            &key,
            StoreId::random(),
            0,
            2,
        )
        .await
        .unwrap();
        tao.write_many(fill(1)).await.unwrap();
        tao.shutdown().await.unwrap();
        let all: Vec<CellId> = (0..objects).map(CellId).collect();
        let old = backing.read(&all).await.unwrap();
        tao.write_many(fill(2)).await.unwrap();
        tao.shutdown().await.unwrap();
        drop(tao);
        // Object 0 (either slot) holds the root's group: every path crosses it.
        let half = objects / 2;
        match attack {
            "tamper" => {
                for o in [0, half] {
                    let mut data = backing.read(&[CellId(o)]).await.unwrap().pop().unwrap();
                    data[40] ^= 1; // inside the root bucket, the group's first member
                    backing.write(vec![(CellId(o), data)]).await.unwrap();
                }
            }
            "swap" => {
                for o in [0, half] {
                    let pair = backing.read(&[CellId(o), CellId(o + 1)]).await.unwrap();
                    backing
                        .write(vec![(CellId(o), pair[1].clone()), (CellId(o + 1), pair[0].clone())])
                        .await
                        .unwrap();
                }
            }
            _ => {
                backing.write(all.iter().copied().zip(old).collect()).await.unwrap();
            }
        }
        let (tao, _) = DurableTao::open(dir.path(), backing.clone(), &key).await.unwrap();
        assert_eq!(tao.pack_levels(), 2);
        let report = tao.verify(|_, _| {}).await.unwrap();
        assert!(report.failures.iter().any(|f| f.0 == 0), "{attack}: {:?}", report.failures);
        let read = tao.read_many(&[BlockId(5)]).await;
        assert!(matches!(read, Err(ProxyError::Integrity { .. })), "{attack}: {read:?}");
    }
}

/// The groups a packed tree keeps for its write-backs are trusted memory: counted in
/// `trusted_bytes`, and never more than `packed_cache_bytes` says (here the whole store, which
/// is smaller than the cache's room).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_packed_tree_counts_its_group_cache_as_trusted_memory() {
    let key = MasterKey::generate();
    let geometry = DurableTao::packed_geometry(&config(), 2).unwrap();
    let bound = DurableTao::packed_cache_bytes(&config(), 2).unwrap();
    assert_eq!(bound, geometry.cell_count() / 2 * u64::from(geometry.cell_size()));
    assert_eq!(DurableTao::packed_cache_bytes(&config(), 1).unwrap(), 0);
    let mut held = Vec::new();
    for pack in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        let geometry = DurableTao::packed_geometry(&config(), pack).unwrap();
        let tao = DurableTao::create_packed(
            dir.path(),
            config(),
            Arc::new(MemoryStore::new(geometry)),
            &key,
            StoreId::random(),
            0,
            pack,
        )
        .await
        .unwrap();
        let blocks: Vec<(BlockId, Vec<u8>)> =
            (0..64).map(|b| (BlockId(b), vec![b as u8; BS as usize])).collect();
        tao.write_many(blocks).await.unwrap();
        tao.commit().await.unwrap();
        let ids: Vec<BlockId> = (0..64).map(BlockId).collect();
        tao.read_many(&ids).await.unwrap();
        held.push(tao.trusted_bytes());
    }
    let extra = held[1].saturating_sub(held[0]);
    // Every group was just read, so the cache holds most of them.
    assert!(extra >= bound / 2, "the packed tree's cache is not counted: {held:?}, {bound}");
    assert!(extra <= bound + bound / 2, "{extra} bytes more than unpacked, bound {bound}");
}

/// A commit that checkpoints lets requests go on too, and the checkpoint keeps what they
/// revealed: reads served while the commit writes the store run to the end (they would wait
/// for the whole commit if the checkpoint stopped requests), the checkpoint covers the commit
/// (nothing is replayed at the next start), and after a crash the blocks those reads revealed
/// still move to fresh leaves. (Failed when the new log kept only what followed the commit's
/// record: the reveals logged while its cells were being written were dropped.) The same holds
/// for a crash after the new checkpoint is in place but before the log is replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_lets_requests_go_on_and_keeps_their_reveals() {
    for window in [false, true] {
        checkpoint_under_requests(window).await;
    }
}

/// `window`: the crash comes between the checkpoint's rename and the log's replacement (the
/// old log, with the requests' reveals, is put back).
async fn checkpoint_under_requests(window: bool) {
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("redo.log");
    // Every commit after the first checkpoints; the second is stuck writing the store.
    let stuck = StuckCommit::start(dir.path(), &key, Some(1)).await;
    let before = stuck.read_revealed(&stuck.tao).await;
    let StuckCommit { tao, rec, stall, committing, n } = stuck;
    assert!(!committing.is_finished());
    // The log as it stands: older records and reveals, then the reads' (the commit's own
    // record is not written yet).
    let old_log = std::fs::read(&log).unwrap();
    stall.armed.store(false, std::sync::atomic::Ordering::SeqCst);
    stall.release.send_replace(true);
    committing.await.unwrap().unwrap();
    assert!(std::fs::metadata(&log).unwrap().len() < old_log.len() as u64, "log not replaced");
    // kill -9 now: the reads' own commit never happens.
    drop(tao);
    if window {
        std::fs::write(&log, &old_log).unwrap();
    }
    let (tao, recovery) = DurableTao::open(dir.path(), rec.clone(), &key).await.unwrap();
    assert_eq!(recovery.replayed, 0, "the checkpoint covers the commit: {recovery:?}");
    // Exactly the reads: the write before the commit is accounted for by the checkpoint.
    assert_eq!(recovery.reaccessed, REVEALED.len() as u64, "{recovery:?}");
    // A fresh leaf repeats one in 64 times; all six repeat when the reveals are dropped.
    let again = repeats(&tao, &rec, n, &before).await;
    assert!(again <= 2, "{again} of {} blocks read their revealed path again", REVEALED.len());
    assert_eq!(tao.read_many(&[BlockId(5)]).await.unwrap()[0], vec![0xEE; BS as usize]);
    let report = tao.verify(|_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
}

/// While a key rotation may be under way the engine re-seals its pinned top at every
/// write-back, so a commit writes sealed top buckets into the pinned store; a checkpoint taken
/// for that commit must hold those, not the copies from before it. Checkpoints at every commit,
/// a crash, a start: every block reads back and `verify` finds every cell as the trusted
/// versions say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_hold_the_pinned_top_a_rotating_engine_wrote() {
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(MemoryStore::new(DurableTao::geometry(&config()).unwrap()));
    create(dir.path(), config(), store.clone(), &key, 7).await.shutdown().await.unwrap();
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for round in 0..4u8 {
        // A previous key given: the open top is not kept (sweeps re-seal every cell).
        let (mut tao, _) =
            DurableTao::open_rotating(dir.path(), store.clone(), &key, Some(&key)).await.unwrap();
        tao.set_log_limit(1); // every commit checkpoints
        for op in 0..24u8 {
            let b = rng.gen_range(0..64u64);
            let d = vec![round.wrapping_mul(50).wrapping_add(op); BS as usize];
            tao.write_many(vec![(BlockId(b), d.clone())]).await.unwrap();
            model.insert(b, d);
            if op % 4 == 3 {
                tao.commit().await.unwrap();
            }
        }
        drop(tao); // a crash after the last commit
        let (tao, _) = DurableTao::open(dir.path(), store.clone(), &key).await.unwrap();
        assert_holds(&tao, &model, &format!("round {round}")).await;
        let report = tao.verify(|_, _| {}).await.unwrap();
        assert!(report.failures.is_empty(), "round {round}: {:?}", report.failures);
        tao.shutdown().await.unwrap();
    }
}

/// A full overlay is committed once. Every request that ends while the overlay is past its
/// limit asks for a commit, and while the first runs (it waits for the requests in flight to
/// drain) many more ask; those queued behind it must find the overlay emptied and do nothing.
/// (They did not: each ran a commit of its own, each stopping requests to drain them, one
/// after another; behind a 50 ms link a read-only load stalled for seconds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_overlay_is_committed_once_not_once_per_waiting_request() {
    use blindfold_store::{CountingStore, LatencyStore, LinkConfig};
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let config = TaoConfig::builder(1024, BS).write_back_every(4).build().unwrap();
    let link = LinkConfig::new(std::time::Duration::from_millis(2), None, None).unwrap();
    let geometry = DurableTao::geometry(&config).unwrap();
    let counting =
        Arc::new(CountingStore::new(LatencyStore::new(MemoryStore::new(geometry), link)));
    let limit = 64;
    let mut tao = DurableTao::create(
        dir.path(),
        config,
        counting.clone() as Arc<dyn Store>,
        &key,
        StoreId::random(),
    )
    .await
    .unwrap();
    tao.set_max_overlay(limit);
    let tao = Arc::new(tao);
    let before = counting.counts();
    let mut tasks = Vec::new();
    for c in 0..32u64 {
        let tao = Arc::clone(&tao);
        tasks.push(tokio::spawn(async move {
            for i in 0..8u64 {
                tao.read_many(&[BlockId((c * 8 + i) % 1024)]).await?;
            }
            Ok::<_, ProxyError>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let done = counting.counts().since(&before);
    // Nothing but a full overlay commits here, and a commit takes at least the `limit` cells
    // that made it full (the engine's write-back of its subtree adds more).
    assert!(done.flushes >= 1, "256 reads of 9-bucket paths overflow 64 cells: {done:?}");
    assert!(
        done.flushes as usize * limit <= done.cells_written as usize,
        "{} commits wrote only {} cells: commits of a nearly empty overlay",
        done.flushes,
        done.cells_written
    );
}

/// The redo log's frames: (offset, magic) of each, walked by their headers (magic, body
/// length, CRC).
fn frames_of(log: &[u8]) -> Vec<(usize, u32)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 16 <= log.len() {
        let magic = u32::from_le_bytes(log[at..at + 4].try_into().unwrap());
        let len = u64::from_le_bytes(log[at + 4..at + 12].try_into().unwrap()) as usize;
        out.push((at, magic));
        at += 16 + len;
    }
    assert_eq!(at, log.len(), "the log ends inside a frame");
    out
}

/// Under a mirror, a commit's record is logged beside its cells and its landed frame once they
/// are flushed. A crash between the two (the log cut just before the landed frame) leaves a
/// record whose cells all landed: the next opening reads them back and keeps the commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_whose_landed_frame_is_lost_is_kept_once_its_cells_read_back() {
    const BESIDE_RECORD: u32 = 0xB1F0_7A05;
    const LANDED: u32 = 0xB1F0_7C01;
    let key = MasterKey::generate();
    for pack in [1u32, 3] {
        let dir = tempfile::tempdir().unwrap();
        let geometry = DurableTao::packed_geometry(&config(), pack).unwrap();
        let backing: Arc<dyn Store> = Arc::new(MemoryStore::new(geometry));
        let written: Vec<(BlockId, Vec<u8>)> =
            (0..24u64).map(|b| (BlockId(b), vec![b as u8 ^ 0x5A; BS as usize])).collect();
        {
            let tao = DurableTao::create_packed(
                dir.path(),
                config(),
                backing.clone(),
                &key,
                StoreId::random(),
                3,
                pack,
            )
            .await
            .unwrap();
            // A mirror attached makes the engine log a commit's record beside its cells, as
            // under `--durability store`.
            tao.tap().attach(Arc::new(crate::crash_oblivious::Mirror::default()));
            tao.write_many(written.clone()).await.unwrap();
            tao.commit().await.unwrap();
        }
        let log_path = dir.path().join("redo.log");
        let log = std::fs::read(&log_path).unwrap();
        let frames = frames_of(&log);
        let n = frames.len();
        assert!(n >= 2, "pack {pack}: {frames:?}");
        assert_eq!(frames[n - 1].1, LANDED, "pack {pack}: the log ends with the landed frame");
        assert_eq!(
            frames[n - 2].1,
            BESIDE_RECORD,
            "pack {pack}: after the record beside the cells"
        );
        let f = std::fs::OpenOptions::new().write(true).open(&log_path).unwrap();
        f.set_len(frames[n - 1].0 as u64).unwrap();
        drop(f);

        let (tao, recovery) = DurableTao::open(dir.path(), backing.clone(), &key).await.unwrap();
        assert_eq!(recovery.dropped, 0, "pack {pack}: a commit whose cells landed was dropped");
        assert!(recovery.replayed >= 1, "pack {pack}: {recovery:?}");
        let blocks: Vec<BlockId> = written.iter().map(|(b, _)| *b).collect();
        let got = tao.read_many(&blocks).await.unwrap();
        for ((b, want), got) in written.iter().zip(got) {
            assert_eq!(&got, want, "pack {pack}: block {}", b.0);
        }
    }
}
