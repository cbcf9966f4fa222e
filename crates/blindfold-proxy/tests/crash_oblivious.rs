//! Obliviousness across crashes: a block accessed just before a crash (no commit after it)
//! must not be fetched again on the path the store saw, after the restart.
//!
//! Each trial reads (or writes) block X, "crashes" (drops the engine without committing),
//! reopens the data directory and accesses X again; the overlap of the two fetched paths
//! (cells in common) must follow the distribution of two independent random paths — as
//! without a crash — rather than being the whole path. Before the reveal log existed, the
//! overlap was the full path every time. Also checked: what a restart reads before serving
//! anything is only what the store already saw.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_oram::{BlockId, PathOramConfig, PosMapMode};
use blindfold_proxy::{DurablePathOram, DurableTao, SealedPathOram, TaoConfig};
use blindfold_store::{CellId, MemoryStore, RecordingStore, Store, TraceOp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BS: u32 = 32;
const BLOCKS: u64 = 128;
const TRIALS: usize = 120;

type Rec = Arc<RecordingStore<MemoryStore>>;

/// The cells read since the last call, as cells of the tree: with two slots per cell, store
/// cell `c + n` is the second copy of tree cell `c` (which slot is read follows the commits,
/// which the store sees anyway).
fn cells_read(rec: &Rec, n: u64) -> HashSet<CellId> {
    rec.take_trace()
        .into_iter()
        .filter(|e| e.op == TraceOp::Read)
        .flat_map(|e| e.cells)
        .map(|c| CellId(c.0 % n))
        .collect()
}

fn mean(v: &[usize]) -> f64 {
    v.iter().sum::<usize>() as f64 / v.len() as f64
}

/// The two engines behind one small interface for the trials.
// One engine per trial, never moved around: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Engine {
    Tao(DurableTao),
    Path(DurablePathOram),
}

impl Engine {
    async fn access(&mut self, block: u64, write: Option<u8>) {
        let op = match write {
            Some(v) => blindfold_oram::Op::Write(vec![v; BS as usize]),
            None => blindfold_oram::Op::Read,
        };
        match self {
            Engine::Tao(t) => {
                t.access_many(vec![(BlockId(block), op)]).await.unwrap();
            }
            Engine::Path(p) => {
                p.access(BlockId(block), op).await.unwrap();
            }
        }
    }

    async fn commit(&mut self) {
        match self {
            Engine::Tao(t) => t.commit().await.unwrap(),
            Engine::Path(p) => p.commit().await.unwrap(),
        }
    }

    fn tap(&self) -> blindfold_proxy::Tap {
        match self {
            Engine::Tao(t) => t.tap(),
            Engine::Path(p) => p.tap(),
        }
    }

    async fn read(&mut self, block: u64) -> Vec<u8> {
        match self {
            Engine::Tao(t) => t.read_many(&[BlockId(block)]).await.unwrap().pop().unwrap(),
            Engine::Path(p) => p.read(BlockId(block)).await.unwrap(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Tao,
    PathInMemory,
    PathRecursive,
}

fn path_config(kind: Kind) -> PathOramConfig {
    let mut b = PathOramConfig::builder(BLOCKS, BS);
    if kind == Kind::PathRecursive {
        b = b.posmap(PosMapMode::Recursive { max_in_memory_entries: 8 });
    }
    b.build().unwrap()
}

fn tao_config() -> TaoConfig {
    TaoConfig::builder(BLOCKS, BS).write_back_every(4).build().unwrap()
}

async fn create(kind: Kind, dir: &Path, store: Rec, key: &MasterKey) -> Engine {
    let store = store as Arc<dyn Store>;
    match kind {
        Kind::Tao => Engine::Tao(
            DurableTao::create(dir, tao_config(), store, key, StoreId::random()).await.unwrap(),
        ),
        _ => Engine::Path(
            DurablePathOram::create(dir, path_config(kind), store, key, StoreId::random())
                .await
                .unwrap(),
        ),
    }
}

async fn open(kind: Kind, dir: &Path, store: Rec, key: &MasterKey) -> (Engine, u64) {
    let store = store as Arc<dyn Store>;
    match kind {
        Kind::Tao => {
            let (t, r) = DurableTao::open(dir, store, key).await.unwrap();
            (Engine::Tao(t), r.reaccessed)
        }
        _ => {
            let (p, r) = DurablePathOram::open(dir, store, key).await.unwrap();
            (Engine::Path(p), r.reaccessed)
        }
    }
}

/// Two slots per cell, as new gateways have, except for the recursive Path ORAM, which keeps
/// the in-place layout of earlier directories covered too.
fn geometry(kind: Kind) -> blindfold_store::Geometry {
    match kind {
        Kind::Tao => DurableTao::geometry(&tao_config()).unwrap(),
        Kind::PathRecursive => SealedPathOram::geometry(&path_config(kind)).unwrap(),
        _ => DurablePathOram::geometry(&path_config(kind)).unwrap(),
    }
}

/// Cells of the tree (of all trees, for the recursive map).
fn tree_cells(kind: Kind) -> u64 {
    match kind {
        Kind::Tao => tao_config().tree().total_cells(),
        _ => path_config(kind).total_cells(),
    }
}

/// A second home for the engine's redo log, as the gateway's store-side log is
/// (`--durability store`): the checkpoint and log the engine last handed over, and every frame
/// since.
#[derive(Debug, Default)]
pub(crate) struct Mirror {
    files: parking_lot::Mutex<(Vec<u8>, Vec<u8>)>,
    /// Keeps the checkpoint it started from, and every frame after it, whatever checkpoints
    /// the engine hands over later ([`Mirror::from_dir`]).
    stale_base: bool,
}

#[async_trait::async_trait]
impl blindfold_proxy::LogMirror for Mirror {
    fn queue(&self, frames: Arc<Vec<Vec<u8>>>) -> u64 {
        let mut f = self.files.lock();
        for frame in frames.iter() {
            f.1.extend_from_slice(frame);
        }
        0
    }

    async fn durable(&self, _ticket: u64) -> blindfold_proxy::Result<()> {
        Ok(())
    }

    async fn checkpointed(&self, checkpoint: Vec<u8>, log: Vec<u8>) -> blindfold_proxy::Result<()> {
        if !self.stale_base {
            *self.files.lock() = (checkpoint, log);
        }
        Ok(())
    }

    fn wants_checkpoint(&self) -> bool {
        false
    }
}

impl Mirror {
    /// Takes the engine in `dir` as it is now, and everything it logs from now on.
    fn follow(dir: &Path, engine: &Engine) -> Arc<Mirror> {
        let m = Self::from_dir(dir, false);
        engine.tap().attach(Arc::clone(&m) as Arc<dyn blindfold_proxy::LogMirror>);
        m
    }

    /// A mirror of the checkpoint and log in `dir` as they are now, to attach to the engine
    /// there. `stale_base`: it keeps that checkpoint and appends every frame after it, whatever
    /// checkpoints the engine hands over later, as the gateway's store-side log holds them
    /// between an engine checkpoint and the store checkpoint that carries it (the last store
    /// checkpoint, with the engine checkpoint before, and the ring with every frame since).
    pub(crate) fn from_dir(dir: &Path, stale_base: bool) -> Arc<Mirror> {
        let read = |f: &str| std::fs::read(dir.join(f)).unwrap_or_default();
        Arc::new(Mirror {
            files: parking_lot::Mutex::new((read("checkpoint.bin"), read("redo.log"))),
            stale_base,
        })
    }

    /// A new state directory holding only what the mirror has.
    pub(crate) fn restore(&self) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let f = self.files.lock();
        std::fs::write(dir.path().join("checkpoint.bin"), &f.0).unwrap();
        std::fs::write(dir.path().join("redo.log"), &f.1).unwrap();
        dir
    }
}

/// Runs the trials; returns the overlaps with a crash between the two accesses and without.
/// `lose_dir`: the crash also loses the state directory, which is rebuilt from what the
/// engine handed its [`Mirror`] (a gateway recovering from the store alone).
async fn overlaps_in(
    kind: Kind,
    write: bool,
    seed: u64,
    lose_dir: bool,
) -> (Vec<usize>, Vec<usize>) {
    let key = MasterKey::generate();
    let mut dir = tempfile::tempdir().unwrap();
    let rec: Rec = Arc::new(RecordingStore::new(MemoryStore::new(geometry(kind))));
    let n = tree_cells(kind);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut engine = create(kind, dir.path(), Arc::clone(&rec), &key).await;
    for b in 0..BLOCKS {
        engine.access(b, Some(b as u8)).await;
    }
    engine.commit().await;
    let mut mirror = Mirror::follow(dir.path(), &engine);
    let mut crashed = Vec::new();
    let mut calm = Vec::new();
    let mut expect: Vec<u8> = (0..BLOCKS).map(|b| b as u8).collect();
    // Every cell the store has seen read so far.
    let mut seen: HashSet<CellId> = HashSet::new();
    for trial in 0..TRIALS {
        let x = rng.gen_range(0..BLOCKS);
        let value = if write { Some(rng.gen::<u8>()) } else { None };
        rec.clear();
        engine.access(x, value).await;
        let first = cells_read(&rec, n);
        seen.extend(first.iter().copied());
        let crash = trial % 2 == 0;
        if crash {
            // Crash: no commit, the engine is simply gone.
            drop(engine);
            if lose_dir {
                dir = mirror.restore();
            }
            let (reopened, reaccessed) = open(kind, dir.path(), Arc::clone(&rec), &key).await;
            engine = reopened;
            mirror = Mirror::follow(dir.path(), &engine);
            // The revealed access is repeated at restart (with the TaoStore engine also the
            // reads since its last commit: read-only requests do not commit).
            assert!(reaccessed >= 1, "{kind:?}: nothing repeated at restart");
            if kind != Kind::Tao {
                assert_eq!(reaccessed, 1, "{kind:?}: one access since the last commit");
            }
            // Before serving anything, the restart read only cells the store saw read.
            let during_open = cells_read(&rec, n);
            assert!(
                during_open.is_subset(&seen),
                "{kind:?}: the restart read cells no access had read before"
            );
            if kind != Kind::Tao {
                assert_eq!(during_open, first, "{kind:?}: the restart repeats the crashed access");
            }
        } else if let Some(v) = value {
            expect[x as usize] = v;
        }
        // The retried access (a PUT retried after a crash, or the same GET again).
        engine.access(x, value).await;
        let second = cells_read(&rec, n);
        seen.extend(second.iter().copied());
        if let Some(v) = value {
            expect[x as usize] = v;
        }
        let overlap = first.intersection(&second).count();
        if crash {
            crashed.push(overlap)
        } else {
            calm.push(overlap)
        }
        engine.commit().await;
    }
    // The data is intact through all of it.
    for b in 0..BLOCKS {
        assert_eq!(
            engine.read(b).await,
            vec![expect[b as usize]; BS as usize],
            "{kind:?} block {b}"
        );
    }
    (crashed, calm)
}

async fn check(kind: Kind, write: bool, seed: u64) {
    check_in(kind, write, seed, false).await;
}

async fn check_in(kind: Kind, write: bool, seed: u64, lose_dir: bool) {
    let (crashed, calm) = overlaps_in(kind, write, seed, lose_dir).await;
    let path_len = match kind {
        Kind::Tao => tao_config().shape().levels() as f64,
        _ => path_config(kind).cells_per_access() as f64,
    };
    let (c, n) = (mean(&crashed), mean(&calm));
    // Two independent random paths share about two buckets per tree (about 4.8 of the 10
    // cells of the recursive map's three trees); a re-fetched access shares all of them. The
    // tolerance is several standard errors of the difference of the means; the second bound
    // is far below the whole access, which is what a re-fetch gives every time.
    assert!(
        (c - n).abs() < 1.0 && c < path_len * 0.75,
        "{kind:?} write={write}: mean overlap {c:.2} after a crash vs {n:.2} without \
         (whole access: {path_len} cells)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tao_get_after_crash_reads_a_fresh_path() {
    check(Kind::Tao, false, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tao_retried_put_after_crash_reads_a_fresh_path() {
    check(Kind::Tao, true, 2).await;
}

#[tokio::test]
async fn path_oram_get_after_crash_reads_a_fresh_path() {
    check(Kind::PathInMemory, false, 3).await;
}

#[tokio::test]
async fn path_oram_retried_put_after_crash_reads_a_fresh_path() {
    check(Kind::PathInMemory, true, 4).await;
}

#[tokio::test]
async fn recursive_path_oram_get_after_crash_reads_fresh_paths() {
    check(Kind::PathRecursive, false, 5).await;
}

#[tokio::test]
async fn recursive_path_oram_retried_put_after_crash_reads_fresh_paths() {
    check(Kind::PathRecursive, true, 6).await;
}

/// The state directory lost with the crash and rebuilt from the mirror alone (what `blindfold
/// recover` does from the store-side log under `--durability store`): the overlap is still that
/// of two independent paths, and every block reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tao_recovered_from_its_mirror_reads_a_fresh_path() {
    check_in(Kind::Tao, true, 7, true).await;
}

#[tokio::test]
async fn path_oram_recovered_from_its_mirror_reads_a_fresh_path() {
    check_in(Kind::PathInMemory, true, 8, true).await;
    check_in(Kind::PathInMemory, false, 9, true).await;
}
