//! Requests abandoned part-way: a client that goes away, or a server that drops a request's
//! future (a timeout, a closed connection), at any await point of a PUT. Nothing acknowledged
//! may be lost, the engine must keep serving (never poisoned or wedged by a half-done commit),
//! reserved blocks must come back, and a restart must find every acknowledged object.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_gateway::engine::SharedEngine;
use blindfold_gateway::objects::ObjectLayer;
use blindfold_gateway::Directory;
use blindfold_oram::{BlockId, PathOramConfig};
use blindfold_proxy::{DurablePathOram, DurableTao, TaoConfig};
use blindfold_store::{Geometry, JitterStore, MemoryStore, Store};
use bytes::Bytes;
use rand::{Rng, SeedableRng};

const BLOCKS: u64 = 1024;
const BS: u32 = 256;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Path,
    /// The TaoStore engine overwriting cells in place (data in the redo log).
    TaoInPlace,
    /// The TaoStore engine on a two-slot store (commits write while requests go on).
    TaoTwoSlots,
}

fn geometry(kind: Kind) -> Geometry {
    match kind {
        Kind::Path => DurablePathOram::geometry(&path_config()).unwrap(),
        Kind::TaoInPlace => tao_config().geometry().unwrap(),
        Kind::TaoTwoSlots => DurableTao::geometry(&tao_config()).unwrap(),
    }
}

fn path_config() -> PathOramConfig {
    PathOramConfig::builder(BLOCKS, BS).build().unwrap()
}

fn tao_config() -> TaoConfig {
    TaoConfig::builder(BLOCKS, BS).write_back_every(8).build().unwrap()
}

/// A slow, reordering store: every call waits up to 2 ms, so abandoning a PUT after a random
/// time stops it anywhere (writing blocks, committing, flushing, logging).
fn store(backing: &Arc<MemoryStore>, seed: u64) -> Arc<dyn Store> {
    Arc::new(JitterStore::new(Arc::clone(backing), Duration::from_millis(2), seed))
}

async fn create(kind: Kind, dir: &Path, store: Arc<dyn Store>, key: &MasterKey) {
    let oram = dir.join("oram");
    match kind {
        Kind::Path => {
            let mut e =
                DurablePathOram::create(&oram, path_config(), store, key, StoreId::random())
                    .await
                    .unwrap();
            e.commit().await.unwrap();
            e.checkpoint().unwrap();
        }
        Kind::TaoInPlace | Kind::TaoTwoSlots => {
            let e = DurableTao::create(&oram, tao_config(), store, key, StoreId::random())
                .await
                .unwrap();
            e.shutdown().await.unwrap();
        }
    }
}

async fn open(kind: Kind, dir: &Path, store: Arc<dyn Store>, key: &MasterKey) -> Arc<ObjectLayer> {
    let oram = dir.join("oram");
    let engine: Arc<dyn SharedEngine> = match kind {
        Kind::Path => {
            let (e, _) = DurablePathOram::open(&oram, store, key).await.unwrap();
            Arc::new(blindfold_gateway::engine::Serialized::new(e))
        }
        Kind::TaoInPlace | Kind::TaoTwoSlots => {
            let (mut e, _) = DurableTao::open(&oram, store, key).await.unwrap();
            e.set_max_overlay(64); // commits forced by a full overlay are abandoned too
            Arc::new(e)
        }
    };
    let directory = Directory::open(&dir.join("meta.redb"), BLOCKS, key).unwrap();
    let layer = Arc::new(ObjectLayer::with_engine(directory, engine, false));
    if layer.directory().require_bucket("b").is_err() {
        layer.directory().create_bucket("b").unwrap();
    }
    layer
}

async fn get(layer: &Arc<ObjectLayer>, key: &str) -> Option<Vec<u8>> {
    let meta = layer.directory().object("b", key).unwrap()?;
    let mut rx = layer.read_range(&meta, 0..meta.size, 4096).await.unwrap();
    let mut out = Vec::new();
    while let Some(chunk) = rx.recv().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    Some(out)
}

fn body(data: &[u8]) -> futures::stream::Iter<std::vec::IntoIter<Result<Bytes, std::io::Error>>> {
    let chunks: Vec<_> = data.chunks(700).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    futures::stream::iter(chunks)
}

/// What a key may hold: its acknowledged value (`None`: absent) and the values of PUTs that
/// were abandoned since (any of which may have landed).
#[derive(Default)]
struct Allowed {
    acked: Option<Vec<u8>>,
    abandoned: Vec<Vec<u8>>,
}

impl Allowed {
    fn check(&mut self, key: &str, got: Option<Vec<u8>>, when: &str) {
        let ok = got == self.acked || got.as_ref().is_some_and(|g| self.abandoned.contains(g));
        assert!(
            ok,
            "{key} {when}: {:?} bytes, acknowledged {:?} bytes",
            got.as_ref().map(Vec::len),
            self.acked.as_ref().map(Vec::len)
        );
        self.acked = got;
        self.abandoned.clear();
    }
}

async fn abandoned_puts(kind: Kind, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let backing = Arc::new(MemoryStore::new(geometry(kind)));
    create(kind, dir.path(), store(&backing, seed), &key).await;
    let layer = open(kind, dir.path(), store(&backing, seed + 1), &key).await;
    let free_at_start = layer.directory().free_blocks();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut keys: HashMap<String, Allowed> = HashMap::new();
    let mut abandoned = 0;
    for i in 0..80u64 {
        let name = format!("k{}", rng.gen_range(0..6));
        let data: Vec<u8> = (0..rng.gen_range(1..3000)).map(|_| rng.gen()).collect();
        let put = layer.put_object("b", &name, body(&data), None, BTreeMap::new(), false);
        let patience = Duration::from_micros(rng.gen_range(0..12_000));
        let allowed = keys.entry(name.clone()).or_default();
        match tokio::time::timeout(patience, put).await {
            Ok(r) => {
                r.unwrap_or_else(|e| panic!("put {i} of {name}: {e}"));
                allowed.acked = Some(data);
                allowed.abandoned.clear();
            }
            Err(_) => {
                abandoned += 1;
                allowed.abandoned.push(data);
            }
        }
        // Every few requests, read everything back: the layer still serves, and each key holds
        // what it may hold.
        if i % 10 == 9 {
            for (name, allowed) in keys.iter_mut() {
                allowed.check(name, get(&layer, name).await, &format!("after request {i}"));
            }
        }
    }
    assert!(abandoned >= 10, "only {abandoned} of 80 PUTs were abandoned");
    // Let the abandoned work drain, then settle what every key holds.
    tokio::time::sleep(Duration::from_millis(200)).await;
    for (name, allowed) in keys.iter_mut() {
        allowed.check(name, get(&layer, name).await, "after the run");
    }
    // Reserved blocks came back: what is free is what the live objects leave.
    let used: u64 = keys
        .values()
        .filter_map(|a| a.acked.as_ref())
        .map(|d| (d.len() as u64).div_ceil(u64::from(BS)))
        .sum();
    assert_eq!(
        layer.directory().free_blocks(),
        free_at_start - used,
        "blocks reserved by abandoned PUTs were never given back"
    );
    assert!(layer.directory().check().unwrap().is_empty());
    layer.shutdown().await.unwrap();
    drop(layer);
    // A restart finds every object as it was acknowledged.
    let layer = open(kind, dir.path(), store(&backing, seed + 2), &key).await;
    for (name, allowed) in keys.iter_mut() {
        allowed.check(name, get(&layer, name).await, "after a restart");
    }
    layer.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_puts_on_path_oram_lose_nothing_and_leak_nothing() {
    abandoned_puts(Kind::Path, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_puts_on_the_tao_engine_in_place_lose_nothing_and_leak_nothing() {
    abandoned_puts(Kind::TaoInPlace, 11).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_puts_on_the_tao_engine_with_two_slots_lose_nothing_and_leak_nothing() {
    abandoned_puts(Kind::TaoTwoSlots, 21).await;
}

/// An engine whose writes wait, while `hold` is set, until `release` is notified: a write that
/// its request abandoned, still on its way to the store.
#[derive(Debug)]
struct Held {
    inner: Arc<dyn SharedEngine>,
    hold: std::sync::atomic::AtomicBool,
    release: tokio::sync::Notify,
}

#[async_trait::async_trait]
impl SharedEngine for Held {
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }
    fn kind(&self) -> &'static str {
        "held"
    }
    fn durable(&self) -> bool {
        true
    }
    async fn read_many(&self, blocks: &[BlockId]) -> blindfold_proxy::Result<Vec<Vec<u8>>> {
        self.inner.read_many(blocks).await
    }
    async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> blindfold_proxy::Result<()> {
        if self.hold.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.release.notified().await;
        }
        self.inner.write_many(blocks).await
    }
    async fn commit(&self) -> blindfold_proxy::Result<()> {
        self.inner.commit().await
    }
    async fn shutdown(&self) -> blindfold_proxy::Result<()> {
        self.inner.shutdown().await
    }
    fn verify<'a>(
        &'a self,
        progress: &'a mut dyn FnMut(u64, u64),
    ) -> futures::future::LocalBoxFuture<'a, blindfold_proxy::Result<blindfold_proxy::VerifyReport>>
    {
        self.inner.verify(progress)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_of_an_abandoned_put_are_reused_only_after_its_last_write_ended() {
    let dir = tempfile::tempdir().unwrap();
    let key = MasterKey::generate();
    let backing = Arc::new(MemoryStore::new(geometry(Kind::Path)));
    create(Kind::Path, dir.path(), backing.clone(), &key).await;
    let (engine, _) = DurablePathOram::open(&dir.path().join("oram"), backing, &key).await.unwrap();
    let held = Arc::new(Held {
        inner: Arc::new(blindfold_gateway::engine::Serialized::new(engine)),
        hold: true.into(),
        release: tokio::sync::Notify::new(),
    });
    let directory = Directory::open(&dir.path().join("meta.redb"), BLOCKS, &key).unwrap();
    let layer = Arc::new(ObjectLayer::with_engine(directory, held.clone(), false));
    layer.directory().create_bucket("b").unwrap();
    // PUT "a" is abandoned while its write waits.
    let a = vec![0xAA; 3 * BS as usize];
    let put = layer.put_object("b", "a", body(&a), None, BTreeMap::new(), false);
    assert!(tokio::time::timeout(Duration::from_millis(50), put).await.is_err());
    // PUT "b" is acknowledged; then the abandoned write reaches the engine.
    let b = vec![0xBB; 3 * BS as usize];
    layer.put_object("b", "b", body(&b), None, BTreeMap::new(), false).await.unwrap();
    held.release.notify_one();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(get(&layer, "b").await, Some(b), "an abandoned write landed in a reused block");
    assert_eq!(get(&layer, "a").await, None);
    // Once it ended, its blocks came back.
    assert_eq!(layer.directory().free_blocks(), BLOCKS - 3);
}
