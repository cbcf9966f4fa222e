//! Master-key rotation in the durable engines (Path ORAM, TaoStore, and the partition engines
//! over levelled and over Path ORAM partitions): opened with a new key and the one it retires,
//! a sweep over every path (interleaved with ordinary accesses) re-seals every cell, after
//! which the engine opens and verifies under the new key alone and no longer under the old;
//! a crash at any point of the sweep loses no committed write; and the sweep's reads are the
//! same whatever the workload.

use std::collections::HashMap;
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_oram::oblivistore::ObliviStoreConfig;
use blindfold_oram::{BlockId, PathOramConfig};
use blindfold_proxy::{DurableObliviStore, DurablePathOram, DurableTao, ProxyError, TaoConfig};
use blindfold_store::{CellId, MemoryStore, RecordingStore, Store, TraceOp};
use blindfold_testkit::DyingStore;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BS: u32 = 32;
const BLOCKS: u64 = 64;

fn path_config() -> PathOramConfig {
    PathOramConfig::builder(BLOCKS, BS).cache_levels(1).build().unwrap()
}

fn tao_config() -> TaoConfig {
    TaoConfig::builder(BLOCKS, BS).write_back_every(4).build().unwrap()
}

/// Which engine a test runs.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Path,
    Tao,
    /// ObliviStore's levelled partitions.
    Levelled,
    /// CURIOUS over Path ORAM partitions.
    Tree,
}

fn part_config(kind: Kind) -> ObliviStoreConfig {
    match kind {
        Kind::Tree => ObliviStoreConfig::curious_path(BLOCKS, BS, 3, 5).unwrap(),
        _ => ObliviStoreConfig::new(BLOCKS, BS).unwrap(),
    }
}

/// One of the engines, behind the calls the test needs.
// One engine per trial, never moved around: its size does not matter.
#[allow(clippy::large_enum_variant)]
enum Engine {
    Path(DurablePathOram),
    Tao(DurableTao),
    Part(DurableObliviStore),
}

impl Engine {
    async fn create(kind: Kind, dir: &std::path::Path, store: Arc<dyn Store>, key: &MasterKey) {
        let id = StoreId::random();
        match kind {
            Kind::Tao => {
                DurableTao::create_pinned(dir, tao_config(), store, key, id, 1).await.unwrap();
            }
            Kind::Path => {
                DurablePathOram::create(dir, path_config(), store, key, id).await.unwrap();
            }
            Kind::Levelled | Kind::Tree => {
                let c = part_config(kind);
                DurableObliviStore::create(dir, c, store, key, id, &mut |_, _| {}).await.unwrap();
            }
        }
    }

    fn geometry(kind: Kind) -> blindfold_store::Geometry {
        match kind {
            Kind::Tao => DurableTao::geometry(&tao_config()).unwrap(),
            Kind::Path => DurablePathOram::geometry(&path_config()).unwrap(),
            Kind::Levelled | Kind::Tree => {
                DurableObliviStore::geometry(&part_config(kind)).unwrap()
            }
        }
    }

    async fn open(
        kind: Kind,
        dir: &std::path::Path,
        store: Arc<dyn Store>,
        key: &MasterKey,
        previous: Option<&MasterKey>,
    ) -> Result<Self, ProxyError> {
        Ok(match kind {
            Kind::Tao => Self::Tao(DurableTao::open_rotating(dir, store, key, previous).await?.0),
            Kind::Path => {
                Self::Path(DurablePathOram::open_rotating(dir, store, key, previous).await?.0)
            }
            Kind::Levelled | Kind::Tree => {
                Self::Part(DurableObliviStore::open_rotating(dir, store, key, previous).await?.0)
            }
        })
    }

    fn sweep_paths(&self) -> u64 {
        match self {
            Self::Path(e) => e.sweep_paths(),
            Self::Tao(e) => e.sweep_paths(),
            Self::Part(e) => e.sweep_paths(),
        }
    }

    async fn sweep(&mut self, range: std::ops::Range<u64>) -> Result<(), ProxyError> {
        match self {
            Self::Path(e) => e.sweep(range).await,
            Self::Tao(e) => e.sweep(range).await,
            Self::Part(e) => e.sweep(range).await,
        }
    }

    async fn write(&mut self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<(), ProxyError> {
        match self {
            Self::Path(e) => {
                let ops = blocks.into_iter().map(|(b, d)| (b, blindfold_oram::Op::Write(d)));
                e.access_many(ops.collect()).await.map(drop)
            }
            Self::Tao(e) => e.write_many(blocks).await,
            Self::Part(e) => e.write_many(blocks).await,
        }
    }

    async fn read(&mut self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>, ProxyError> {
        match self {
            Self::Path(e) => {
                let ops = blocks.iter().map(|&b| (b, blindfold_oram::Op::Read));
                e.access_many(ops.collect()).await
            }
            Self::Tao(e) => e.read_many(blocks).await,
            Self::Part(e) => e.read_many(blocks).await,
        }
    }

    async fn commit(&mut self) -> Result<(), ProxyError> {
        match self {
            Self::Path(e) => e.commit().await,
            Self::Tao(e) => e.commit().await,
            Self::Part(e) => e.commit().await,
        }
    }

    /// A clean stop where the engine has one (so the next open replays nothing: for the
    /// partition engines, an unclean stop would make the next open rebuild, and re-seal,
    /// every partition by itself).
    async fn stop(self) {
        match self {
            Self::Path(mut e) => e.commit().await.unwrap(),
            Self::Tao(e) => e.shutdown().await.unwrap(),
            Self::Part(e) => e.shutdown().await.unwrap(),
        }
    }

    /// Stops everything the engine runs, as a crash of the process would.
    async fn crash(self) {
        if let Self::Part(e) = &self {
            e.halt();
            let _ = e.settle().await;
        }
    }

    async fn verify_clean(&mut self) {
        let report = match self {
            Self::Path(e) => e.verify(|_, _| {}).await.unwrap(),
            Self::Tao(e) => e.verify(|_, _| {}).await.unwrap(),
            Self::Part(e) => e.verify(&mut |_, _| {}).await.unwrap(),
        };
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        assert!(report.cells_checked > 0);
    }
}

fn data(rng: &mut ChaCha8Rng) -> Vec<u8> {
    (0..BS).map(|_| rng.gen()).collect()
}

async fn check_all(e: &mut Engine, model: &HashMap<u64, Vec<u8>>, what: &str) {
    let blocks: Vec<BlockId> = model.keys().map(|&b| BlockId(b)).collect();
    for b in &blocks {
        if let Err(err) = e.read(&[*b]).await {
            panic!("{what}: block {} read fails: {err:?}", b.0);
        }
    }
    let got = e.read(&blocks).await.unwrap();
    for (b, d) in blocks.iter().zip(got) {
        assert_eq!(
            &d,
            &model[&b.0],
            "{what}: block {} (zeros: {})",
            b.0,
            d.iter().all(|&x| x == 0)
        );
    }
}

async fn rotation_reseals_everything(kind: Kind) {
    let tao = kind;
    let (old, new) = (MasterKey::generate(), MasterKey::generate());
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(Engine::geometry(tao)));
    let mut rng = ChaCha8Rng::seed_from_u64(kind as u64);
    let mut model = HashMap::new();
    Engine::create(tao, dir.path(), store.clone(), &old).await;
    {
        let mut e = Engine::open(tao, dir.path(), store.clone(), &old, None).await.unwrap();
        for _ in 0..40 {
            let b = rng.gen_range(0..BLOCKS);
            let d = data(&mut rng);
            e.write(vec![(BlockId(b), d.clone())]).await.unwrap();
            model.insert(b, d);
        }
        e.commit().await.unwrap();
        e.stop().await;
    }
    // Without the old key nothing opens yet.
    assert!(Engine::open(tao, dir.path(), store.clone(), &new, None).await.is_err());
    {
        let mut e = Engine::open(tao, dir.path(), store.clone(), &new, Some(&old)).await.unwrap();
        let paths = e.sweep_paths();
        let mut at = 0;
        while at < paths {
            let b = rng.gen_range(0..BLOCKS);
            let d = data(&mut rng);
            e.write(vec![(BlockId(b), d.clone())]).await.unwrap();
            model.insert(b, d);
            let end = (at + 3).min(paths);
            e.sweep(at..end).await.unwrap();
            e.commit().await.unwrap();
            at = end;
        }
        assert!(e.sweep(paths..paths + 1).await.is_err(), "past the end is refused");
        e.stop().await;
    }
    // The new key alone opens and authenticates every cell; the old one opens nothing.
    let mut e = Engine::open(tao, dir.path(), store.clone(), &new, None).await.unwrap();
    check_all(&mut e, &model, "after the rotation").await;
    e.verify_clean().await;
    drop(e);
    assert!(Engine::open(tao, dir.path(), store.clone(), &old, None).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_oram_rotation_reseals_every_cell() {
    rotation_reseals_everything(Kind::Path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tao_rotation_reseals_every_cell() {
    rotation_reseals_everything(Kind::Tao).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_engines_rotation_reseals_every_cell() {
    rotation_reseals_everything(Kind::Levelled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curious_path_rotation_reseals_every_cell() {
    rotation_reseals_everything(Kind::Tree).await;
}

/// Without the sweep, a rotation is not done: cells nobody touched are still under the old
/// key, so the new key alone fails on them. (This is what the sweep is for.)
#[tokio::test]
async fn without_the_sweep_old_cells_remain() {
    let (old, new) = (MasterKey::generate(), MasterKey::generate());
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new(Engine::geometry(Kind::Path)));
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    Engine::create(Kind::Path, dir.path(), store.clone(), &old).await;
    let mut e = Engine::open(Kind::Path, dir.path(), store.clone(), &old, None).await.unwrap();
    for b in 0..BLOCKS {
        e.write(vec![(BlockId(b), data(&mut rng))]).await.unwrap();
    }
    e.commit().await.unwrap();
    drop(e);
    let mut e =
        Engine::open(Kind::Path, dir.path(), store.clone(), &new, Some(&old)).await.unwrap();
    e.write(vec![(BlockId(0), data(&mut rng))]).await.unwrap();
    e.commit().await.unwrap();
    drop(e);
    let Engine::Path(mut e) =
        Engine::open(Kind::Path, dir.path(), store.clone(), &new, None).await.unwrap()
    else {
        unreachable!()
    };
    let report = e.verify(|_, _| {}).await.unwrap();
    assert!(!report.failures.is_empty(), "cells no access touched are still under the old key");
}

/// A crash at any instant of a rotation (the store dies after a random number of cell
/// writes, in the middle of a sweep or a commit) loses no committed write, and the rotation,
/// resumed from the start, still completes.
async fn crash_during_rotation(kind: Kind) {
    let tao = kind;
    let (old, new) = (MasterKey::generate(), MasterKey::generate());
    let mut rng = ChaCha8Rng::seed_from_u64(40 + kind as u64);
    for trial in 0..12 {
        let dir = tempfile::tempdir().unwrap();
        let backing: Arc<dyn Store> = Arc::new(MemoryStore::new(Engine::geometry(tao)));
        let mut acked = HashMap::new();
        Engine::create(tao, dir.path(), backing.clone(), &old).await;
        {
            let mut e = Engine::open(tao, dir.path(), backing.clone(), &old, None).await.unwrap();
            for b in 0..BLOCKS / 2 {
                let d = data(&mut rng);
                e.write(vec![(BlockId(b), d.clone())]).await.unwrap();
                acked.insert(b, d);
            }
            e.commit().await.unwrap();
            // The process stops here (the partition engines' evictions are tasks of their
            // own: without this they would go on writing beside the next run).
            e.crash().await;
        }
        // The rotation runs over a store that dies part-way.
        let dying = Arc::new(DyingStore::new(backing.clone(), rng.gen_range(0..400)));
        let mut opened = None;
        // The write whose commit had not returned when the store died: it may or may not
        // have landed (a partition engine's shuffle records carry cached blocks as they are).
        let mut in_flight = None;
        let outcome = async {
            let e = opened.insert(Engine::open(tao, dir.path(), dying, &new, Some(&old)).await?);
            let paths = e.sweep_paths();
            let mut at = 0;
            while at < paths {
                let b = rng.gen_range(0..BLOCKS);
                let d = data(&mut rng);
                in_flight = Some((b, d.clone()));
                e.write(vec![(BlockId(b), d.clone())]).await?;
                let end = (at + 4).min(paths);
                e.sweep(at..end).await?;
                e.commit().await?;
                acked.insert(b, d);
                in_flight = None;
                at = end;
            }
            Ok::<(), ProxyError>(())
        }
        .await;
        // The process dies: nothing of this run goes on (the partition engines run their
        // evictions as tasks of their own).
        if let Some(e) = opened {
            e.crash().await;
        }
        if let Err(e) = &outcome {
            assert!(matches!(e, ProxyError::Store(_) | ProxyError::Poisoned), "trial {trial}: {e}");
        }
        // Restart with both keys; committed writes are all there; finish the rotation.
        let mut e = Engine::open(tao, dir.path(), backing.clone(), &new, Some(&old)).await.unwrap();
        if let Some((b, d)) = in_flight {
            // Either the unacknowledged write landed whole, or the block is as acknowledged.
            let now = e.read(&[BlockId(b)]).await.unwrap().remove(0);
            if now == d {
                acked.insert(b, d);
            }
        }
        check_all(&mut e, &acked, &format!("trial {trial} after the crash")).await;
        let paths = e.sweep_paths();
        e.sweep(0..paths).await.unwrap();
        e.commit().await.unwrap();
        drop(e);
        let mut e = Engine::open(tao, dir.path(), backing.clone(), &new, None).await.unwrap();
        check_all(&mut e, &acked, &format!("trial {trial} after the rotation")).await;
        e.verify_clean().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_oram_rotation_survives_crashes() {
    crash_during_rotation(Kind::Path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tao_rotation_survives_crashes() {
    crash_during_rotation(Kind::Tao).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_engines_rotation_survives_crashes() {
    crash_during_rotation(Kind::Levelled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curious_path_rotation_survives_crashes() {
    crash_during_rotation(Kind::Tree).await;
}

/// The cells a sweep reads, for a workload of `hot` (a few blocks) or uniform writes before
/// it: the store's view of the sweep.
async fn sweep_reads(tao: bool, hot: bool) -> Vec<Vec<u64>> {
    let tao = if tao { Kind::Tao } else { Kind::Path };
    let key = MasterKey::generate();
    let dir = tempfile::tempdir().unwrap();
    let rec = Arc::new(RecordingStore::new(MemoryStore::new(Engine::geometry(tao))));
    let store: Arc<dyn Store> = rec.clone();
    Engine::create(tao, dir.path(), store.clone(), &key).await;
    let mut e =
        Engine::open(tao, dir.path(), store, &key, Some(&MasterKey::generate())).await.unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(u64::from(hot));
    for _ in 0..50 {
        let b = if hot { rng.gen_range(0..2) } else { rng.gen_range(0..BLOCKS) };
        e.write(vec![(BlockId(b), data(&mut rng))]).await.unwrap();
    }
    e.commit().await.unwrap();
    rec.clear();
    let paths = e.sweep_paths();
    for i in 0..paths {
        e.sweep(i..i + 1).await.unwrap();
    }
    e.commit().await.unwrap();
    // Two-slot stores read either slot of a cell (whichever was committed last): logical cell
    // `c` of `n` is store cell `c` or `c + n`. Compare the logical cells, i.e. the paths.
    let n = Engine::geometry(tao).cell_count() / 2;
    let reads: Vec<Vec<u64>> = rec
        .trace()
        .into_iter()
        .filter(|ev| ev.op == TraceOp::Read)
        .map(|ev| ev.cells.iter().map(|c: &CellId| c.0 % n).collect())
        .collect();
    assert_eq!(reads.len() as u64, paths, "one read per sweep path");
    reads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_reads_the_same_paths_whatever_the_workload() {
    for tao in [false, true] {
        let uniform = sweep_reads(tao, false).await;
        let hot = sweep_reads(tao, true).await;
        assert_eq!(uniform, hot, "tao = {tao}");
        assert!(uniform.iter().all(|r| !r.is_empty()));
    }
}
