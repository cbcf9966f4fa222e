//! The balancer over real nodes: gRPC over 127.0.0.1 with mutual TLS, each node an ordinary
//! engine over a file store in a temporary directory.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blindfold_crypto::MasterKey;
use blindfold_gateway::server::{OpenHooks, OramEngine, ServeConfig};
use blindfold_node::balancer::{node_blocks_needed, RpcRecord};
use blindfold_node::certs::node_name;
use blindfold_node::{Balancer, BalancerConfig, ClusterTls, NodeClient};
use blindfold_oram::BlockId;
use blindfold_proxy::SharedEngine;
use blindfold_store::{Store, TraceOp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BS: u32 = 64;

/// A node process stand-in: `blindfold node`'s `run` on a task.
struct TestNode {
    dir: PathBuf,
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    crash: Option<tokio::sync::oneshot::Sender<()>>,
    task: std::thread::JoinHandle<Result<(), String>>,
}

impl TestNode {
    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    async fn stop(self) {
        self.stop_result().await.unwrap();
    }

    /// Stops the node as `kill -9` would: its runtime is dropped with whatever it was doing,
    /// nothing committed or checkpointed.
    async fn crash(mut self) {
        let _ = self.crash.take().unwrap().send(());
        let task = self.task;
        tokio::task::spawn_blocking(move || task.join().unwrap()).await.unwrap().unwrap();
    }

    async fn stop_result(mut self) -> Result<(), String> {
        let _ = self.stop.take().unwrap().send(());
        let task = self.task;
        tokio::task::spawn_blocking(move || task.join().unwrap()).await.unwrap()
    }
}

fn node_config(dir: &Path, blocks: u64, engine: OramEngine, listen: SocketAddr) -> ServeConfig {
    ServeConfig {
        listen,
        data_dir: dir.to_path_buf(),
        store: None,
        key_file: None,
        passphrase: None,
        credentials: None,
        capacity: blocks * u64::from(BS),
        block_size: BS,
        pad_objects: false,
        cache_mib: 0,
        engine,
        in_place: false,
        pack_levels: 1,
        durability: Default::default(),
        lease_ttl: None,
        anchor: None,
        reads_ahead_of_log: false,
        log_feed: None,
    }
}

/// `blindfold node` in a test: opens the node's data directory as the command does (with
/// `hooks`), says where it listens on `ready`, serves until `stop` resolves or the engine stops,
/// then stops cleanly (commit, checkpoint, encrypted snapshot).
async fn serve_node(
    mut cfg: ServeConfig,
    hooks: OpenHooks,
    tls: ClusterTls,
    ready: tokio::sync::oneshot::Sender<SocketAddr>,
    stop: impl std::future::Future<Output = ()> + Send,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(cfg.listen).await.map_err(|e| e.to_string())?;
    cfg.credentials = Some(("blindfold-node".into(), "unused".into()));
    let mut opened =
        blindfold_gateway::server::open_with(&cfg, hooks).await.map_err(|e| e.to_string())?;
    let grow = opened.grower.clone().map(blindfold_gateway::grow::grow_fn);
    let node = blindfold_node::node::Opened {
        engine: Arc::clone(opened.objects.engine()),
        params: opened.params.clone(),
        stopped: opened.stopped.clone(),
        grow,
    };
    let _ = ready.send(listener.local_addr().map_err(|e| e.to_string())?);
    let sweeper = blindfold_gateway::rotation::Sweeper::start(&mut opened);
    blindfold_node::node::run(&node, listener, &tls, &cfg.data_dir, stop)
        .await
        .map_err(|e| e.to_string())?;
    if let Some(sweeper) = sweeper {
        sweeper.stop().await;
    }
    opened.objects.shutdown().await.map_err(|e| e.to_string())?;
    if opened.snapshots.lock().is_some() {
        blindfold_gateway::server::write_snapshot(&opened).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}

async fn start_node(
    dir: &Path,
    tls_dir: &Path,
    blocks: u64,
    engine: OramEngine,
    listen: SocketAddr,
) -> TestNode {
    start_node_with(node_config(dir, blocks, engine, listen), tls_dir).await
}

/// `blindfold node` with the data directory, store and flags of `cfg`.
async fn start_node_with(cfg: ServeConfig, tls_dir: &Path) -> TestNode {
    let dir = cfg.data_dir.clone();
    let tls = ClusterTls::load(tls_dir).unwrap();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (crash_tx, crash_rx) = tokio::sync::oneshot::channel::<()>();
    // Each node on a thread and runtime of its own, as its own process would be.
    let task = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let served = rt.block_on(async move {
            let stop = async move {
                let _ = stop_rx.await;
            };
            tokio::select! {
                r = serve_node(cfg, OpenHooks::default(), tls, ready_tx, stop) => r,
                Ok(()) = crash_rx => Ok(()),
            }
        });
        drop(rt);
        served
    });
    let addr = ready_rx.await.expect("the node started");
    TestNode { dir, addr, stop: Some(stop_tx), crash: Some(crash_tx), task }
}

struct Cluster {
    root: tempfile::TempDir,
    nodes: Vec<TestNode>,
    key: MasterKey,
    blocks: u64,
}

impl Cluster {
    async fn new(n: usize, blocks: u64, engine: OramEngine) -> Self {
        let root = tempfile::tempdir().unwrap();
        let hosts = vec!["127.0.0.1".to_string(); n];
        blindfold_node::write_cluster_certs(&root.path().join("certs"), &hosts).unwrap();
        let per_node = node_blocks_needed(blocks, n) + 8;
        let mut nodes = Vec::new();
        for i in 0..n {
            let dir = root.path().join(format!("node{i}"));
            let tls = root.path().join("certs").join(format!("node-{}", i + 1));
            nodes.push(
                start_node(&dir, &tls, per_node, engine, "127.0.0.1:0".parse().unwrap()).await,
            );
        }
        Self { root, nodes, key: MasterKey::from_bytes([9; 32]), blocks }
    }

    fn balancer_tls(&self) -> ClusterTls {
        ClusterTls::load(&self.root.path().join("certs").join("balancer")).unwrap()
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(TestNode::url).collect()
    }

    async fn balancer(&self, creating: bool, config: BalancerConfig) -> Balancer {
        Balancer::open(
            &self.root.path().join("balancer"),
            &self.urls(),
            &self.balancer_tls(),
            self.blocks,
            BS,
            &self.key,
            creating,
            config,
        )
        .await
        .unwrap()
    }

    /// Stops node `i` and starts it again on the same address (a new instance).
    async fn restart_node(&mut self, i: usize, engine: OramEngine) {
        let old = self.nodes.remove(i);
        let (dir, addr) = (old.dir.clone(), old.addr);
        old.stop().await;
        let tls = self.root.path().join("certs").join(format!("node-{}", i + 1));
        let node = start_node(&dir, &tls, 0, engine, addr).await;
        self.nodes.insert(i, node);
    }

    async fn stop(self) {
        for n in self.nodes {
            n.stop().await;
        }
    }
}

fn block(tag: u64) -> Vec<u8> {
    let mut b = vec![0u8; BS as usize];
    b[..8].copy_from_slice(&tag.to_le_bytes());
    b[8..16].copy_from_slice(&(!tag).to_le_bytes());
    b
}

fn seeded(seed: u64) -> BalancerConfig {
    BalancerConfig { seed: Some(seed), record: true, ..BalancerConfig::default() }
}

/// Random reads and writes from concurrent clients, each checked against its own `HashMap`
/// model (clients own disjoint blocks), while all of them also read one shared block that no
/// one writes; commits between; then a clean stop, a reopen and a full read-back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_with_concurrent_clients() {
    let cluster = Cluster::new(3, 96, OramEngine::Tao).await;
    let balancer = Arc::new(cluster.balancer(true, seeded(1)).await);
    let shared = 95u64;
    balancer.write_many(vec![(BlockId(shared), block(4242))]).await.unwrap();
    let clients = 4u64;
    let mut tasks = Vec::new();
    for c in 0..clients {
        let balancer = Arc::clone(&balancer);
        tasks.push(tokio::spawn(async move {
            let mut rng = ChaCha8Rng::seed_from_u64(c);
            let mine: Vec<u64> = (0..95).filter(|b| b % clients == c).collect();
            let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
            for step in 0..40u64 {
                let mut pick: Vec<u64> =
                    (0..rng.gen_range(1..5)).map(|_| mine[rng.gen_range(0..mine.len())]).collect();
                pick.sort_unstable();
                pick.dedup();
                if rng.gen_bool(0.5) {
                    let writes: Vec<(BlockId, Vec<u8>)> = pick
                        .iter()
                        .map(|&b| (BlockId(b), block(b * 1000 + step + c * 100_000)))
                        .collect();
                    for (b, d) in &writes {
                        model.insert(b.0, d.clone());
                    }
                    balancer.write_many(writes).await.unwrap();
                } else {
                    pick.push(shared);
                    let ids: Vec<BlockId> = pick.iter().map(|&b| BlockId(b)).collect();
                    let got = balancer.read_many(&ids).await.unwrap();
                    for (b, d) in pick.iter().zip(got) {
                        let want = if *b == shared {
                            block(4242)
                        } else {
                            model.get(b).cloned().unwrap_or_else(|| vec![0; BS as usize])
                        };
                        assert_eq!(d, want, "client {c} block {b} step {step}");
                    }
                }
                if step % 10 == 9 {
                    balancer.commit().await.unwrap();
                }
            }
            model
        }));
    }
    let mut model = HashMap::new();
    for t in tasks {
        model.extend(t.await.unwrap());
    }
    model.insert(shared, block(4242));
    // The shape: one read and ν writes per access, one request per node per batch.
    let trace = balancer.trace();
    check_shape(&trace, 3, 2);
    assert!(
        balancer.cached_blocks() < 40,
        "the eviction cache grew to {}",
        balancer.cached_blocks()
    );
    balancer.shutdown().await.unwrap();
    drop(balancer);
    let reopened = cluster.balancer(false, seeded(2)).await;
    let ids: Vec<BlockId> = (0..96).map(BlockId).collect();
    let got = reopened.read_many(&ids).await.unwrap();
    for (b, d) in got.into_iter().enumerate() {
        let want = model.get(&(b as u64)).cloned().unwrap_or_else(|| vec![0; BS as usize]);
        assert_eq!(d, want, "block {b} after reopening");
    }
    reopened.shutdown().await.unwrap();
    cluster.stop().await;
}

/// Every batch: exactly `nodes` requests, reads summing to its accesses, writes to ν times them.
fn check_shape(trace: &[RpcRecord], nodes: usize, evictions: usize) {
    let mut batches: HashMap<u64, Vec<&RpcRecord>> = HashMap::new();
    for r in trace {
        batches.entry(r.batch).or_default().push(r);
    }
    assert!(!batches.is_empty());
    for (batch, recs) in batches {
        assert_eq!(recs.len(), nodes, "batch {batch}: one request per node");
        let accesses = recs[0].accesses;
        assert_eq!(recs.iter().map(|r| r.reads).sum::<usize>(), accesses, "batch {batch}");
        assert_eq!(recs.iter().map(|r| r.writes).sum::<usize>(), evictions * accesses);
        for r in recs {
            assert_eq!(
                r.request_bytes,
                blindfold_node::wire::access_len(r.reads, r.writes, BS as usize),
                "sizes depend only on the counts"
            );
        }
    }
}

/// Per access (batches of one): the node read from and the nodes written to.
fn per_access(trace: &[RpcRecord]) -> Vec<(u64, Vec<u64>)> {
    let mut batches: std::collections::BTreeMap<u64, Vec<&RpcRecord>> = Default::default();
    for r in trace {
        batches.entry(r.batch).or_default().push(r);
    }
    batches
        .into_values()
        .map(|recs| {
            let read = recs.iter().find(|r| r.reads == 1).expect("one read").node as u64;
            let writes =
                recs.iter().flat_map(|r| std::iter::repeat_n(r.node as u64, r.writes)).collect();
            (read, writes)
        })
        .collect()
}

/// Which node serves which access reveals nothing: for one hot block and for uniformly random
/// blocks alike, the per-node read and write counts are uniform (chi-square), every access has
/// the same shape, and the node an access reads from is independent of where the previous
/// access wrote (a design that wrote the block straight back would always read the hot block
/// where it was last written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_choice_is_uniform_and_independent_of_the_blocks() {
    use blindfold_testkit::stats::{histogram, independence, uniformity};
    let n = 3u64;
    let cluster = Cluster::new(n as usize, 64, OramEngine::Tao).await;
    let balancer = cluster.balancer(true, seeded(7)).await;
    let accesses = 600u64;
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    // Hot: the same block, reads and writes alternating.
    for i in 0..accesses {
        if i % 2 == 0 {
            balancer.write_many(vec![(BlockId(5), block(i))]).await.unwrap();
        } else {
            assert_eq!(balancer.read_many(&[BlockId(5)]).await.unwrap()[0], block(i - 1));
        }
    }
    let hot = balancer.trace();
    // Uniform: random blocks.
    for i in 0..accesses {
        let b = rng.gen_range(0..64);
        if i % 2 == 0 {
            balancer.write_many(vec![(BlockId(b), block(i))]).await.unwrap();
        } else {
            balancer.read_many(&[BlockId(b)]).await.unwrap();
        }
    }
    let all = balancer.trace();
    let uniform = &all[hot.len()..];
    for (name, trace) in [("hot", &hot[..]), ("uniform", uniform)] {
        check_shape(trace, n as usize, 2);
        let acc = per_access(trace);
        assert_eq!(acc.len() as u64, accesses);
        let reads = histogram(acc.iter().map(|a| a.0), n);
        let writes = histogram(acc.iter().flat_map(|a| a.1.iter().copied()), n);
        let (r, w) = (uniformity(&reads), uniformity(&writes));
        assert!(r.p_value > 1e-3, "{name}: reads per node {reads:?} are not uniform: {r:?}");
        assert!(w.p_value > 1e-3, "{name}: writes per node {writes:?} are not uniform: {w:?}");
        // Where access t wrote (first eviction) against where access t + 1 read.
        let pairs = acc.windows(2).map(|p| (p[0].1[0], p[1].0));
        let ind = independence(pairs, n, n);
        assert!(ind.p_value > 1e-3, "{name}: the next read depends on the last write: {ind:?}");
    }
    balancer.shutdown().await.unwrap();
    cluster.stop().await;
}

/// Concurrent accesses to one block: the later ones send their fake reads at once (every
/// access keeps its shape) and answer from the earlier access's result, in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_accesses_to_one_block_keep_their_shape() {
    let cluster = Cluster::new(2, 32, OramEngine::Tao).await;
    let balancer = Arc::new(cluster.balancer(true, seeded(11)).await);
    balancer.write_many(vec![(BlockId(3), block(1))]).await.unwrap();
    balancer.commit().await.unwrap();
    for round in 0..5u64 {
        let mut tasks = Vec::new();
        for t in 0..8u64 {
            let b = Arc::clone(&balancer);
            tasks.push(tokio::spawn(async move {
                b.read_many(&[BlockId(3)]).await.map(|d| (t, d[0].clone()))
            }));
        }
        for t in tasks {
            let (_, d) = t.await.unwrap().unwrap();
            assert_eq!(d, block(1 + round), "round {round}");
        }
        balancer.write_many(vec![(BlockId(3), block(2 + round))]).await.unwrap();
    }
    check_shape(&balancer.trace(), 2, 2);
    let accesses: usize = {
        let mut seen = std::collections::HashSet::new();
        balancer.trace().iter().filter(|r| seen.insert(r.batch)).map(|r| r.accesses).sum()
    };
    assert_eq!(accesses, 1 + 5 * 8 + 5);
    balancer.shutdown().await.unwrap();
    cluster.stop().await;
}

/// Only holders of a certificate from the cluster CA, for the right role, get in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_refuses_strangers() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
    let cluster = Cluster::new(1, 16, OramEngine::Tao).await;
    let certs = cluster.root.path().join("certs");
    let read = |p: &Path| std::fs::read_to_string(p).unwrap();
    let ca = read(&certs.join("balancer/ca.pem"));
    let url = cluster.urls()[0].clone();
    let node1 = blindfold_node::certs::node_name(1);
    let ask = |tls: ClientTlsConfig| {
        let url = url.clone();
        async move {
            let ch = Endpoint::from_shared(url).unwrap().tls_config(tls).unwrap().connect().await;
            match ch {
                Err(e) => Err(format!("connect: {e}")),
                Ok(ch) => blindfold_node::proto::node_client::NodeClient::new(ch)
                    .info(blindfold_node::wire::Frame::default())
                    .await
                    .map(|_| ())
                    .map_err(|s| format!("info: {s}")),
            }
        }
    };
    // The balancer's certificate works …
    let client = NodeClient::connect(&url, 0, &cluster.balancer_tls()).await.unwrap();
    assert_eq!(client.name(), blindfold_node::certs::node_name(1));
    // … no client certificate does not,
    let bare =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca)).domain_name(&node1);
    assert!(ask(bare).await.is_err(), "a client without a certificate was served");
    // nor a node's certificate (made for servers only),
    let node_id = Identity::from_pem(
        read(&certs.join("node-1/cert.pem")),
        read(&certs.join("node-1/key.pem")),
    );
    let as_node = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&ca))
        .identity(node_id)
        .domain_name(&node1);
    assert!(ask(as_node).await.is_err(), "a node's certificate was accepted as a client");
    // nor a certificate from another CA.
    let other = cluster.root.path().join("other");
    blindfold_node::write_cluster_certs(&other, &["127.0.0.1".into()]).unwrap();
    let stranger = ClusterTls::load(&other.join("balancer")).unwrap();
    assert!(NodeClient::connect(&url, 0, &stranger).await.is_err());
    // A node whose certificate another CA signed is refused by the balancer.
    let impostor = start_node(
        &cluster.root.path().join("impostor"),
        &other.join("node-1"),
        32,
        OramEngine::Tao,
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    let refused =
        NodeClient::connect(&impostor.url(), 0, &cluster.balancer_tls()).await.unwrap_err();
    assert!(refused.to_string().contains(&impostor.addr.to_string()), "{refused}");
    impostor.stop().await;
    cluster.stop().await;
}

/// A damaged cell in a node's store: the read fails with an integrity error that reaches the
/// balancer's caller; nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_node_store_fails_reads_with_an_integrity_error() {
    let mut cluster = Cluster::new(2, 32, OramEngine::PathOram).await;
    let balancer = cluster.balancer(true, seeded(5)).await;
    let all: Vec<(BlockId, Vec<u8>)> = (0..32).map(|b| (BlockId(b), block(b + 7))).collect();
    balancer.write_many(all).await.unwrap();
    // Move most blocks out of the cache onto the nodes.
    for _ in 0..8 {
        balancer.read_many(&[BlockId(31)]).await.unwrap();
    }
    balancer.shutdown().await.unwrap();
    drop(balancer);
    for i in 0..2 {
        let old = cluster.nodes.remove(i);
        let dir = old.dir.clone();
        old.stop().await;
        // Flip every stored byte after the file header.
        let cells = dir.join("cells").join("oram.cells");
        let mut bytes = std::fs::read(&cells).unwrap();
        for b in &mut bytes[4096..] {
            *b ^= 0x5a;
        }
        std::fs::write(&cells, bytes).unwrap();
        let tls = cluster.root.path().join("certs").join(format!("node-{}", i + 1));
        let node =
            start_node(&dir, &tls, 0, OramEngine::PathOram, "127.0.0.1:0".parse().unwrap()).await;
        cluster.nodes.insert(i, node);
    }
    let balancer = cluster.balancer(false, seeded(6)).await;
    let mut failed = None;
    for b in 0..32 {
        if let Err(e) = balancer.read_many(&[BlockId(b)]).await {
            failed = Some(e);
            break;
        }
    }
    let e = failed.expect("a read through a damaged node failed");
    assert!(e.is_integrity(), "not an integrity error: {e}");
    // The balancer refuses further work rather than guess.
    assert!(balancer.read_many(&[BlockId(0)]).await.is_err());
    drop(balancer);
    for n in cluster.nodes {
        let _ = n.stop_result().await; // a node stops by itself on an integrity error
    }
}

/// A block's value at its last acknowledged commit, and the values written after it.
type Acked = (Vec<u8>, Vec<Vec<u8>>);

/// The balancer dropped without a shutdown at random points, under concurrent writes and
/// commits, and every other round its nodes killed too: reopened, every acknowledged write
/// reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_lose_no_acknowledged_write() {
    let mut cluster = Cluster::new(2, 48, OramEngine::Tao).await;
    let mut creating = true;
    // Per block: the value of its last acknowledged commit, and what was written after it.
    let model: Arc<parking_lot::Mutex<HashMap<u64, Acked>>> = Default::default();
    for round in 0..6u64 {
        let balancer = Arc::new(cluster.balancer(creating, seeded(100 + round)).await);
        creating = false;
        // Everything acknowledged so far reads back.
        {
            let m = model.lock().clone();
            let ids: Vec<BlockId> = (0..48).map(BlockId).collect();
            let got = balancer.read_many(&ids).await.unwrap();
            let mut m2 = m.clone();
            for (b, d) in got.into_iter().enumerate() {
                let b = b as u64;
                let (committed, later) =
                    m.get(&b).cloned().unwrap_or((vec![0; BS as usize], Vec::new()));
                assert!(
                    d == committed || later.contains(&d),
                    "round {round}: block {b} lost an acknowledged write"
                );
                m2.insert(b, (d, Vec::new()));
            }
            *model.lock() = m2;
        }
        let mut tasks = Vec::new();
        for c in 0..2u64 {
            let balancer = Arc::clone(&balancer);
            let model = Arc::clone(&model);
            tasks.push(tokio::spawn(async move {
                let mut rng = ChaCha8Rng::seed_from_u64(round * 10 + c);
                for step in 0..1000u64 {
                    let b = rng.gen_range(0..24) * 2 + c;
                    let d = block(round << 32 | c << 24 | step);
                    model
                        .lock()
                        .entry(b)
                        .or_insert((vec![0; BS as usize], Vec::new()))
                        .1
                        .push(d.clone());
                    balancer.write_many(vec![(BlockId(b), d)]).await.unwrap();
                    if rng.gen_bool(0.3) {
                        // What this client wrote so far is acknowledged once commit returns.
                        let mine: Vec<(u64, Vec<u8>)> = model
                            .lock()
                            .iter()
                            .filter(|(b, _)| *b % 2 == c)
                            .filter_map(|(b, (_, l))| l.last().map(|d| (*b, d.clone())))
                            .collect();
                        balancer.commit().await.unwrap();
                        let mut m = model.lock();
                        for (b, d) in mine {
                            let e = m.get_mut(&b).unwrap();
                            let pos = e.1.iter().position(|x| *x == d).unwrap();
                            e.0 = d;
                            e.1.drain(..=pos);
                        }
                    }
                }
            }));
        }
        let mut rng = ChaCha8Rng::seed_from_u64(round);
        tokio::time::sleep(std::time::Duration::from_millis(rng.gen_range(20..300))).await;
        for t in &tasks {
            t.abort();
        }
        for t in tasks {
            let _ = t.await;
        }
        drop(balancer); // no shutdown: a crash
        if round % 2 == 1 {
            for i in 0..cluster.nodes.len() {
                let old = cluster.nodes.remove(i);
                let (dir, addr) = (old.dir.clone(), old.addr);
                old.crash().await;
                let tls = cluster.root.path().join("certs").join(format!("node-{}", i + 1));
                cluster.nodes.insert(i, start_node(&dir, &tls, 0, OramEngine::Tao, addr).await);
            }
        }
    }
    cluster.stop().await;
}

/// A block read and then lost to a crash before a commit is not read from the same place
/// again: the intent record gave it a new node before the read went out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_a_revealed_place_is_not_read_again() {
    let cluster = Cluster::new(2, 16, OramEngine::Tao).await;
    let balancer = cluster.balancer(true, seeded(21)).await;
    balancer.write_many(vec![(BlockId(4), block(44))]).await.unwrap();
    // Other accesses until the block has been evicted to a node.
    let mut i = 0;
    while balancer.place_of(4).is_none() {
        balancer.read_many(&[BlockId(i % 3)]).await.unwrap();
        i += 1;
        assert!(i < 200, "block 4 never left the cache");
    }
    balancer.commit().await.unwrap();
    let place = balancer.place_of(4).unwrap();
    // Read it from there (the network sees that read), then crash before any commit.
    assert_eq!(balancer.read_many(&[BlockId(4)]).await.unwrap()[0], block(44));
    drop(balancer);
    let reopened = cluster.balancer(false, seeded(22)).await;
    assert_ne!(reopened.place_of(4), Some(place), "the crash brought back a revealed place");
    assert_eq!(reopened.read_many(&[BlockId(4)]).await.unwrap()[0], block(44));
    reopened.shutdown().await.unwrap();
    cluster.stop().await;
}

/// Hostile frames: the node refuses wrong sizes and bad ids with a clear error and keeps
/// serving; a node that restarted is noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_refuse_hostile_frames_and_restarts_are_noticed() {
    let mut cluster = Cluster::new(1, 8, OramEngine::Tao).await;
    let client = NodeClient::connect(&cluster.urls()[0], 0, &cluster.balancer_tls()).await.unwrap();
    let blocks = client.info().blocks;
    let good =
        blindfold_node::wire::Access { reads: vec![1], writes: vec![(2, vec![1; BS as usize])] }
            .encode(BS as usize);
    for (what, body) in [
        ("short", good[..good.len() - 1].to_vec()),
        ("long", [good.clone(), vec![0]].concat()),
        ("empty", Vec::new()),
        ("huge counts", [u32::MAX.to_le_bytes(), 0u32.to_le_bytes()].concat()),
        (
            "id beyond the node",
            blindfold_node::wire::Access { reads: vec![blocks], writes: Vec::new() }
                .encode(BS as usize),
        ),
    ] {
        let e = client.raw_access(body).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{what}: {e:?}");
        assert!(!e.message().is_empty());
    }
    // A message beyond the size limit is refused before it is decoded.
    let e = client.raw_access(vec![0; blindfold_node::wire::max_message(BS as usize) + 1]).await;
    assert!(e.is_err());
    // Still serving.
    assert_eq!(client.raw_access(good).await.unwrap().len(), 8 + BS as usize);
    // A balancer notices a node that restarted (and may have lost uncommitted writes).
    let balancer = cluster.balancer(true, seeded(31)).await;
    balancer.write_many(vec![(BlockId(1), block(1))]).await.unwrap();
    cluster.restart_node(0, OramEngine::Tao).await;
    let e = balancer.commit().await.unwrap_err();
    assert!(e.to_string().contains("restarted"), "{e}");
    drop(balancer);
    cluster.stop().await;
}

/// The adversary's view under one node: every request the node's engine sends its store.
type Rec = Arc<blindfold_store::RecordingStore<Arc<dyn blindfold_store::Store>>>;

/// `blindfold node` as [`start_node`] starts it, with a recording store under its engine.
async fn start_recorded_node(
    dir: &Path,
    tls_dir: &Path,
    blocks: u64,
    engine: OramEngine,
) -> (TestNode, Rec) {
    let cfg = node_config(dir, blocks, engine, "127.0.0.1:0".parse().unwrap());
    let tls = ClusterTls::load(tls_dir).unwrap();
    let slot: Arc<parking_lot::Mutex<Option<Rec>>> = Arc::default();
    let keep = Arc::clone(&slot);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (crash_tx, crash_rx) = tokio::sync::oneshot::channel::<()>();
    let task = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let served = rt.block_on(async move {
            let hooks = OpenHooks {
                wrap_store: Some(Box::new(move |inner| {
                    let rec = Arc::new(blindfold_store::RecordingStore::new(inner));
                    *keep.lock() = Some(Arc::clone(&rec));
                    rec as Arc<dyn blindfold_store::Store>
                })),
                ..OpenHooks::default()
            };
            let stop = async move {
                tokio::select! {
                    _ = stop_rx => {}
                    _ = crash_rx => {}
                }
            };
            serve_node(cfg, hooks, tls, ready_tx, stop).await
        });
        drop(rt);
        served
    });
    let addr = ready_rx.await.expect("the node started");
    let rec = slot.lock().take().expect("the node's store was wrapped");
    let node =
        TestNode { dir: dir.to_path_buf(), addr, stop: Some(stop_tx), crash: Some(crash_tx), task };
    (node, rec)
}

/// What one node's store saw during one access: the kind of each request in order, the cells
/// they named, and the highest cell of the first read (which leaf a path reaches).
#[derive(Clone, Debug)]
struct Seen {
    ops: Vec<TraceOp>,
    cells: usize,
    deepest: Option<u64>,
}

fn seen(rec: &Rec) -> Seen {
    let trace = rec.take_trace();
    // Two slots per cell: store cell `c + half` is the second copy of tree cell `c`.
    let half = rec.geometry().cell_count() / 2;
    Seen {
        ops: trace.iter().map(|e| e.op).collect(),
        cells: trace.iter().map(|e| e.cells.len()).sum(),
        deepest: trace
            .iter()
            .find(|e| e.op == TraceOp::Read)
            .and_then(|e| e.cells.iter().map(|c| c.0 % half).max()),
    }
}

/// The reproduction (#43, point 4), over real nodes whose stores record what they see:
/// one GET-sized read at a time, for one block read again and again ("hammer"), uniformly
/// random blocks and a sequential scan. Per access, what each node's store sees must depend
/// only on how many reads and writes the balancer's request to that node carried (the sizes
/// the network sees anyway): the same requests in the same order, and the same distribution of
/// which node is read, how the writes spread and which paths the node's ORAM reads
/// (chi-square across the three workloads). Before the fix, dummy evictions shared one local
/// id and each extra one became a `write_many` of its own, so "hammer" (whose evictions are
/// mostly dummies) showed the node stores more requests per access.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stores_see_the_same_traffic_for_every_workload() {
    use blindfold_testkit::stats::independence;
    use std::collections::BTreeMap;
    let (n, blocks, per_workload) = (2usize, 64u64, 240u64);
    let root = tempfile::tempdir().unwrap();
    let hosts = vec!["127.0.0.1".to_string(); n];
    blindfold_node::write_cluster_certs(&root.path().join("certs"), &hosts).unwrap();
    let mut nodes = Vec::new();
    let mut recs = Vec::new();
    for i in 0..n {
        let (node, rec) = start_recorded_node(
            &root.path().join(format!("node{i}")),
            &root.path().join("certs").join(format!("node-{}", i + 1)),
            node_blocks_needed(blocks, n) + 8,
            OramEngine::PathOram,
        )
        .await;
        nodes.push(node);
        recs.push(rec);
    }
    let urls: Vec<String> = nodes.iter().map(TestNode::url).collect();
    let tls = ClusterTls::load(&root.path().join("certs").join("balancer")).unwrap();
    let balancer = Balancer::open(
        &root.path().join("balancer"),
        &urls,
        &tls,
        blocks,
        BS,
        &MasterKey::from_bytes([9; 32]),
        true,
        seeded(43),
    )
    .await
    .unwrap();
    let all: Vec<(BlockId, Vec<u8>)> = (0..blocks).map(|b| (BlockId(b), block(b))).collect();
    balancer.write_many(all).await.unwrap();
    balancer.commit().await.unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    let workloads = ["hammer", "uniform", "scan"];
    // Per workload, per access, per node: (reads, writes) of the request, and what its store saw.
    type PerNode = Vec<((usize, usize), Seen)>;
    let mut runs: Vec<Vec<PerNode>> = Vec::new();
    for (w, name) in workloads.iter().enumerate() {
        for rec in &recs {
            rec.clear();
        }
        let mut accesses = Vec::new();
        for i in 0..per_workload {
            let b = match w {
                0 => 5,
                1 => rng.gen_range(0..blocks),
                _ => i % blocks,
            };
            let before = balancer.trace().len();
            let got = balancer.read_many(&[BlockId(b)]).await.unwrap();
            assert_eq!(got[0], block(b), "{name}: block {b}");
            let sent = balancer.trace().split_off(before);
            assert_eq!(sent.len(), n, "{name}: one request per node per access");
            accesses
                .push(sent.iter().map(|r| ((r.reads, r.writes), seen(&recs[r.node]))).collect());
            // Commit now and then, as a gateway does after writes (it frees the local ids the
            // reads left, so evictions carry real blocks too); a commit's own traffic is
            // public and left out.
            if i % 16 == 15 {
                balancer.commit().await.unwrap();
                for rec in &recs {
                    rec.clear();
                }
            }
        }
        runs.push(accesses);
    }
    // 1. Counts and order: for each request shape, one sequence of store requests, whatever
    //    the workload.
    // (Request kinds as their discriminants: `TraceOp` has no order.)
    let kinds = |ops: &[TraceOp]| ops.iter().map(|&o| o as u8).collect::<Vec<u8>>();
    let read = TraceOp::Read as u8;
    let mut by_shape: BTreeMap<(usize, usize), BTreeMap<Vec<u8>, [u64; 3]>> = BTreeMap::new();
    for (w, accesses) in runs.iter().enumerate() {
        for per_node in accesses {
            for (shape, s) in per_node {
                by_shape.entry(*shape).or_default().entry(kinds(&s.ops)).or_default()[w] += 1;
            }
        }
    }
    let varying: Vec<String> = by_shape
        .iter()
        .filter(|(_, seqs)| seqs.len() > 1)
        .map(|((r, wr), seqs)| {
            let list: Vec<String> = seqs
                .iter()
                .map(|(ops, counts)| {
                    let reads = ops.iter().filter(|&&o| o == read).count();
                    format!(
                        "{} requests ({reads} reads): hammer/uniform/scan {counts:?}",
                        ops.len()
                    )
                })
                .collect();
            format!("[{r} reads, {wr} writes] -> {}", list.join("; "))
        })
        .collect();
    let per_access = |w: usize| -> (f64, f64) {
        let (mut reqs, mut reads) = (0usize, 0usize);
        for per_node in &runs[w] {
            for (_, s) in per_node {
                reqs += s.ops.len();
                reads += s.ops.iter().filter(|o| **o == TraceOp::Read).count();
            }
        }
        (reqs as f64 / per_workload as f64, reads as f64 / per_workload as f64)
    };
    let summary: Vec<String> = (0..3)
        .map(|w| {
            let (reqs, reads) = per_access(w);
            format!("{}: {reqs:.2} node-store requests, {reads:.2} reads per access", workloads[w])
        })
        .collect();
    eprintln!("{}", summary.join("\n"));
    assert!(
        varying.is_empty(),
        "the node stores' requests per access depend on more than the request shape:\n{}\n{}",
        varying.join("\n"),
        summary.join("\n")
    );
    // 2. Sizes: request sizes per shape have the same distribution in every workload (a batch
    //    of two paths reads their union, whose size varies with their overlap).
    for shape in by_shape.keys() {
        let sizes: Vec<(u64, u64)> = runs
            .iter()
            .enumerate()
            .flat_map(|(w, accesses)| {
                accesses
                    .iter()
                    .flatten()
                    .filter(|(s, _)| s == shape)
                    .map(move |(_, s)| (w as u64, s.cells as u64))
            })
            .collect();
        // Two size classes, split at the median; tested where each holds enough samples.
        let mut all: Vec<u64> = sizes.iter().map(|p| p.1).collect();
        all.sort_unstable();
        let Some(&median) = all.get(all.len() / 2) else { continue };
        let large = all.iter().filter(|&&c| c >= median).count();
        if large.min(all.len() - large) >= 60 {
            let ind = independence(sizes.iter().map(|&(w, c)| (w, u64::from(c >= median))), 3, 2);
            // The nodes' ORAMs draw their leaves from entropy, so this p-value is random
            // from run to run: 10⁻⁶, not 10⁻³, keeps the suite's false alarms rare (a real
            // dependence over these samples gives p far below either).
            assert!(ind.p_value > 1e-6, "shape {shape:?}: request sizes depend on the workload");
        }
    }
    // 3. What is chosen: the node read, how many writes go to node 0, which leaf each node's
    //    ORAM reads; each independent of the workload.
    let reads_at = runs.iter().enumerate().flat_map(|(w, a)| {
        a.iter().map(move |per_node| {
            (w as u64, per_node.iter().position(|(s, _)| s.0 == 1).expect("one read") as u64)
        })
    });
    let ind = independence(reads_at, 3, n as u64);
    assert!(ind.p_value > 1e-3, "the node read depends on the workload: {ind:?}");
    let writes_at = runs
        .iter()
        .enumerate()
        .flat_map(|(w, a)| a.iter().map(move |per_node| (w as u64, per_node[0].0 .1 as u64)));
    let ind = independence(writes_at, 3, 3);
    assert!(ind.p_value > 1e-3, "where the writes go depends on the workload: {ind:?}");
    let leaves: Vec<(u64, u64)> = runs
        .iter()
        .enumerate()
        .flat_map(|(w, a)| {
            a.iter().flatten().filter_map(move |(_, s)| s.deepest.map(|d| (w as u64, d)))
        })
        .collect();
    let mut sorted: Vec<u64> = leaves.iter().map(|p| p.1).collect();
    sorted.sort_unstable();
    let quartile = |d: u64| sorted.partition_point(|&x| x < d) as u64 * 4 / sorted.len() as u64;
    let ind = independence(leaves.iter().map(|&(w, d)| (w, quartile(d))), 3, 4);
    // Random from run to run as the sizes' test above: 10⁻⁶.
    assert!(ind.p_value > 1e-6, "the nodes' paths depend on the workload: {ind:?}");
    balancer.shutdown().await.unwrap();
    drop(balancer);
    for node in nodes {
        node.stop().await;
    }
}

/// Two nodes on one host (#43): a process holding node 2's certificate, at the address the
/// balancer is told is node 1's, must not be taken for node 1; the real nodes are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cannot_stand_in_for_another() {
    let blocks = 16;
    let cluster = Cluster::new(2, blocks, OramEngine::PathOram).await;
    let certs = cluster.root.path().join("certs");
    let impostor = start_node(
        &cluster.root.path().join("impostor"),
        &certs.join("node-2"),
        node_blocks_needed(blocks, 2) + 8,
        OramEngine::PathOram,
        "127.0.0.1:0".parse().unwrap(),
    )
    .await;
    let urls = vec![impostor.url(), cluster.urls()[1].clone()];
    let opened = Balancer::open(
        &cluster.root.path().join("balancer"),
        &urls,
        &cluster.balancer_tls(),
        blocks,
        BS,
        &cluster.key,
        true,
        seeded(1),
    )
    .await;
    let err = opened.expect_err("node 2's certificate was taken for node 1");
    let text = err.to_string();
    assert!(text.contains(&impostor.url()) && text.contains("node-2"), "{text}");
    // Each node's certificate is for its own name: node 2's does not pass for node 1's.
    let tls = cluster.balancer_tls();
    assert_eq!(NodeClient::connect(&impostor.url(), 0, &tls).await.unwrap().name(), node_name(2));
    assert_eq!(
        NodeClient::connect(&cluster.urls()[0], 1, &tls).await.unwrap().name(),
        node_name(1)
    );
    impostor.stop().await;
    // The nodes themselves, each under its own name, are accepted, in any order.
    let balancer = cluster.balancer(true, seeded(2)).await;
    balancer.write_many(vec![(BlockId(1), block(1))]).await.unwrap();
    balancer.shutdown().await.unwrap();
    drop(balancer);
    let swapped = vec![cluster.urls()[1].clone(), cluster.urls()[0].clone()];
    let balancer = Balancer::open(
        &cluster.root.path().join("balancer"),
        &swapped,
        &cluster.balancer_tls(),
        blocks,
        BS,
        &cluster.key,
        false,
        seeded(3),
    )
    .await
    .unwrap();
    assert_eq!(balancer.read_many(&[BlockId(1)]).await.unwrap()[0], block(1));
    balancer.shutdown().await.unwrap();
    drop(balancer);
    cluster.stop().await;
}

/// The balancer remembers which name held which node's data: two nodes restarted with each
/// other's certificates (each proving a name of the cluster, each holding its own data) are
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_that_swapped_certificates_are_refused() {
    let blocks = 16;
    let mut cluster = Cluster::new(2, blocks, OramEngine::PathOram).await;
    let balancer = cluster.balancer(true, seeded(4)).await;
    balancer.write_many(vec![(BlockId(2), block(2))]).await.unwrap();
    balancer.shutdown().await.unwrap();
    drop(balancer);
    let certs = cluster.root.path().join("certs");
    let old: Vec<TestNode> = cluster.nodes.drain(..).collect();
    let mut swapped = Vec::new();
    for (i, node) in old.into_iter().enumerate() {
        let (dir, addr) = (node.dir.clone(), node.addr);
        node.stop().await;
        let other = certs.join(format!("node-{}", 2 - i));
        swapped.push(start_node(&dir, &other, 0, OramEngine::PathOram, addr).await);
    }
    cluster.nodes = swapped;
    let err = Balancer::open(
        &cluster.root.path().join("balancer"),
        &cluster.urls(),
        &cluster.balancer_tls(),
        blocks,
        BS,
        &cluster.key,
        false,
        seeded(5),
    )
    .await
    .expect_err("nodes with swapped certificates were accepted");
    let text = err.to_string();
    assert!(text.contains("holds the data of") && text.contains("stand in"), "{text}");
    cluster.stop().await;
}

/// Key rotation of a node cluster while it serves: each node's data directory rotates its key
/// (`blindfold rotate-key --data-dir <node>`, then the node restarted: its sweep re-seals its
/// cells while it serves), and the balancer opens under a new key with the old one retiring
/// (the gateway's rotation of `serve --nodes`), re-sealing its state. Afterwards the
/// balancer's old key opens nothing, each node has replaced its key file and opens under the
/// new key alone, and every block reads back. (Before 2026-11-28 a node never ran the sweep,
/// so its rotation never ended, and the balancer could not open its state during a rotation.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_rotates_every_key_while_serving() {
    use blindfold_gateway::rotation::ROTATION_FILE;
    let blocks = 32;
    let mut cluster = Cluster::new(2, blocks, OramEngine::Tao).await;
    let balancer = cluster.balancer(true, seeded(7)).await;
    let mut model: HashMap<u64, Vec<u8>> = (0..blocks).map(|b| (b, block(b))).collect();
    balancer
        .write_many(model.iter().map(|(&b, d)| (BlockId(b), d.clone())).collect())
        .await
        .unwrap();
    balancer.shutdown().await.unwrap();
    drop(balancer);
    let mut old_node_keys = Vec::new();
    for i in 0..cluster.nodes.len() {
        let dir = cluster.nodes[i].dir.clone();
        let key_path = dir.join("key.json");
        let old = blindfold_crypto::load_key_file(&key_path, None).unwrap();
        blindfold_gateway::rotation::prepare(&dir, &key_path, &old, None).unwrap();
        old_node_keys.push(std::fs::read(&key_path).unwrap());
        cluster.restart_node(i, OramEngine::Tao).await;
    }
    let new_key = MasterKey::from_bytes([10; 32]);
    let dir = cluster.root.path().join("balancer");
    let open = |key: &'static MasterKey, previous: Option<&'static MasterKey>| {
        let (dir, urls, tls) = (dir.clone(), cluster.urls(), cluster.balancer_tls());
        async move {
            Balancer::open_rotating(
                &dir,
                &urls,
                &tls,
                blocks,
                BS,
                (key, previous),
                false,
                seeded(8),
            )
            .await
        }
    };
    let old_key: &'static MasterKey = Box::leak(Box::new(MasterKey::from_bytes([9; 32])));
    let new_key: &'static MasterKey = Box::leak(Box::new(new_key));
    let balancer = open(new_key, Some(old_key)).await.unwrap();
    assert_eq!(balancer.sweep_paths().await, 1);
    balancer.sweep(0..1).await.unwrap();
    // Served while the nodes sweep: reads and writes.
    let ids: Vec<BlockId> = (0..blocks).map(BlockId).collect();
    for (b, d) in ids.iter().zip(balancer.read_many(&ids).await.unwrap()) {
        assert_eq!(d, model[&b.0], "block {} during the rotation", b.0);
    }
    for b in (0..blocks).step_by(3) {
        model.insert(b, block(b + 1000));
    }
    let w = (0..blocks).step_by(3).map(|b| (BlockId(b), model[&b].clone())).collect();
    balancer.write_many(w).await.unwrap();
    balancer.commit().await.unwrap();
    // Each node's rotation ends by itself (the key file replaced, the rotation file removed).
    for (node, old) in cluster.nodes.iter().zip(&old_node_keys) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while node.dir.join(ROTATION_FILE).exists() {
            assert!(std::time::Instant::now() < deadline, "the node's rotation did not end");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        assert_ne!(&std::fs::read(node.dir.join("key.json")).unwrap(), old);
        assert!(!node.dir.join("key.json.next").exists());
    }
    balancer.shutdown().await.unwrap();
    drop(balancer);
    // The balancer's old key opens nothing now.
    let e = open(old_key, None).await.expect_err("the old key opened the balancer's state");
    assert!(e.to_string().contains("key") || e.to_string().contains("seal"), "{e}");
    // Nodes restarted under their new keys alone, the balancer under its new key alone.
    for i in 0..cluster.nodes.len() {
        cluster.restart_node(i, OramEngine::Tao).await;
    }
    let open = |key: &'static MasterKey| {
        let (dir, urls, tls) = (dir.clone(), cluster.urls(), cluster.balancer_tls());
        async move {
            Balancer::open_rotating(&dir, &urls, &tls, blocks, BS, (key, None), false, seeded(9))
                .await
        }
    };
    let balancer = open(new_key).await.unwrap();
    for (b, d) in ids.iter().zip(balancer.read_many(&ids).await.unwrap()) {
        assert_eq!(d, model[&b.0], "block {} after the rotation", b.0);
    }
    let report = balancer.verify(&mut |_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    balancer.shutdown().await.unwrap();
    drop(balancer);
    cluster.stop().await;
}

/// Writes `blocks` (tags `tag(b)`) and evicts until none is left in the cache, so that the
/// checkpoint places every block on a node.
async fn write_and_settle(
    balancer: &Balancer,
    blocks: std::ops::Range<u64>,
    tag: impl Fn(u64) -> u64,
) {
    let all: Vec<u64> = blocks.collect();
    for chunk in all.chunks(8) {
        balancer
            .write_many(chunk.iter().map(|&b| (BlockId(b), block(tag(b)))).collect())
            .await
            .unwrap();
    }
    let mut i = 0u64;
    while balancer.cached_blocks() > 0 {
        // Reads of a block never written: each makes ν evictions and moves nothing.
        balancer.read_many(&[BlockId(95 - i % 4)]).await.unwrap();
        i += 1;
        assert!(i < 2000, "the cache never emptied");
    }
    balancer.commit().await.unwrap();
}

fn quiet(_: &str) {}

/// The loss of the balancer's state after it kept serving past its snapshot: `recover` keeps
/// every block whose snapshot place still holds it, names the others lost (never answers with
/// another block's data), and moves every kept block to a new place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_rebuilds_a_lost_balancer_from_its_snapshot() {
    let cluster = Cluster::new(3, 96, OramEngine::Tao).await;
    let dir = cluster.root.path().join("balancer");
    let balancer = cluster.balancer(true, seeded(31)).await;
    write_and_settle(&balancer, 0..80, |b| b).await;
    // The clean stop: what the snapshot holds.
    balancer.shutdown().await.unwrap();
    let snapshot = std::fs::read(dir.join("checkpoint.bin")).unwrap();
    let snapshot_place: HashMap<u64, (u32, u64)> =
        (0..80).map(|b| (b, balancer.place_of(b).expect("settled"))).collect();
    drop(balancer);
    // It keeps serving: blocks 0..20 are written again, 20..30 read; their places are freed
    // and evictions give them to other blocks.
    let balancer = cluster.balancer(false, seeded(32)).await;
    for round in 0..3u64 {
        write_and_settle(&balancer, 0..20, |b| 1000 * (round + 1) + b).await;
        let ids: Vec<BlockId> = (20..30).map(BlockId).collect();
        let got = balancer.read_many(&ids).await.unwrap();
        assert_eq!(got[0], block(20));
    }
    balancer.commit().await.unwrap();
    drop(balancer);
    // The machine is lost with the state directory.
    std::fs::remove_dir_all(&dir).unwrap();
    let rec = blindfold_node::recover::recover_until(
        &dir,
        &snapshot,
        &cluster.urls(),
        &cluster.balancer_tls(),
        &cluster.key,
        Some(33),
        None,
        &quiet,
    )
    .await
    .unwrap();
    let per_node = cluster.nodes.len() as u64 * (node_blocks_needed(96, 3) + 8);
    assert_eq!(rec.ids_read, per_node, "every local id of every node is read");
    assert_eq!(rec.ids_written, per_node, "and written");
    assert!(!rec.lost.is_empty(), "no snapshot place was reused: the test shows nothing");
    assert!(
        rec.lost.iter().all(|&b| b < 30),
        "only blocks accessed after the snapshot can be lost: {:?}",
        rec.lost
    );
    assert_eq!(rec.blocks_found + rec.lost.len() as u64, 80);
    assert_eq!(rec.unverifiable, 0);
    let reopened = cluster.balancer(false, seeded(34)).await;
    assert!(!dir.join(blindfold_node::recover::RECOVER_PLAN_DIR).exists(), "plan left behind");
    for b in 0..80u64 {
        if let Some(p) = reopened.place_of(b) {
            assert_ne!(p, snapshot_place[&b], "block {b} kept its snapshot place");
        }
    }
    let ids: Vec<BlockId> = (0..96).map(BlockId).collect();
    let got = reopened.read_many(&ids).await.unwrap();
    for (b, d) in got.into_iter().enumerate() {
        let b = b as u64;
        if rec.lost.contains(&b) || b >= 80 {
            assert_eq!(d, vec![0; BS as usize], "block {b}: lost or never written");
        } else {
            // Accessed after the snapshot or not, a kept block holds its snapshot data.
            assert_eq!(d, block(b), "block {b} after recover");
        }
    }
    reopened.shutdown().await.unwrap();
    cluster.stop().await;
}

/// A recover cut short at each of its steps (as a crash there would) is run again and
/// finishes with every block; each round's clean stop is the next round's snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recover_cut_short_is_run_again() {
    use blindfold_node::recover::{recover_until, RecoverCut};
    let cluster = Cluster::new(3, 96, OramEngine::Tao).await;
    let dir = cluster.root.path().join("balancer");
    let balancer = cluster.balancer(true, seeded(41)).await;
    write_and_settle(&balancer, 0..60, |b| b + 7).await;
    balancer.shutdown().await.unwrap();
    drop(balancer);
    for (round, cut) in [RecoverCut::AfterPlan, RecoverCut::MidWrite, RecoverCut::AfterCommit]
        .into_iter()
        .enumerate()
    {
        let snapshot = std::fs::read(dir.join("checkpoint.bin")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let seed = Some(50 + round as u64);
        let urls = cluster.urls();
        let tls = cluster.balancer_tls();
        let cut_short =
            recover_until(&dir, &snapshot, &urls, &tls, &cluster.key, seed, Some(cut), &quiet)
                .await;
        assert!(cut_short.is_err(), "{cut:?}");
        // An open in between finds no usable state (no checkpoint yet, or the plan's).
        let rec = recover_until(&dir, &snapshot, &urls, &tls, &cluster.key, seed, None, &quiet)
            .await
            .unwrap();
        assert!(rec.resumed, "{cut:?}: the plan was not taken up");
        assert_eq!(rec.ids_read, 0, "{cut:?}: a plan once durable is not read again");
        assert!(rec.lost.is_empty(), "{cut:?}: lost {:?}", rec.lost);
        assert_eq!(rec.blocks_found, 60);
        let reopened = cluster.balancer(false, seeded(60 + round as u64)).await;
        let ids: Vec<BlockId> = (0..60).map(BlockId).collect();
        let got = reopened.read_many(&ids).await.unwrap();
        for (b, d) in got.into_iter().enumerate() {
            assert_eq!(d, block(b as u64 + 7), "{cut:?}: block {b}");
        }
        // The reads moved some blocks to the cache; settle them for the next snapshot.
        let mut i = 0u64;
        while reopened.cached_blocks() > 0 {
            reopened.read_many(&[BlockId(95 - i % 4)]).await.unwrap();
            i += 1;
            assert!(i < 2000);
        }
        reopened.shutdown().await.unwrap();
    }
    cluster.stop().await;
}

/// `recover` names the node that is missing or foreign, and refuses a snapshot that is not a
/// balancer's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recover_refuses_the_wrong_nodes_and_snapshots() {
    let cluster = Cluster::new(3, 32, OramEngine::Tao).await;
    let dir = cluster.root.path().join("balancer");
    let urls = cluster.urls();
    // A balancer over the first two nodes only: the third is of the cluster's CA, not of it.
    let balancer = Balancer::open(
        &dir,
        &urls[..2],
        &cluster.balancer_tls(),
        32,
        BS,
        &cluster.key,
        true,
        seeded(71),
    )
    .await
    .unwrap();
    balancer.write_many(vec![(BlockId(1), block(1))]).await.unwrap();
    balancer.shutdown().await.unwrap();
    drop(balancer);
    let snapshot = std::fs::read(dir.join("checkpoint.bin")).unwrap();
    let lost = cluster.root.path().join("lost");
    let run = |urls: Vec<String>, snapshot: Vec<u8>| {
        let tls = cluster.balancer_tls();
        let (lost, key) = (lost.clone(), &cluster.key);
        async move {
            blindfold_node::recover::recover_until(
                &lost, &snapshot, &urls, &tls, key, None, None, &quiet,
            )
            .await
            .unwrap_err()
            .to_string()
        }
    };
    let e = run(urls[..1].to_vec(), snapshot.clone()).await;
    assert!(e.contains("is not among --nodes"), "{e}");
    let e = run(urls.clone(), snapshot.clone()).await;
    assert!(e.contains(&format!("node {} (", urls[2])) && e.contains("is not one of"), "{e}");
    let mut other = b"BFTAOCK4".to_vec();
    other.extend_from_slice(&snapshot[8..]);
    let e = run(urls[..2].to_vec(), other).await;
    assert!(e.contains("without --nodes"), "{e}");
    assert!(!lost.join("checkpoint.bin").exists(), "a refused recover wrote state");
    cluster.stop().await;
}

/// A gateway over the cluster, with its store (where its snapshot goes) in `store`.
fn gateway_config(data: &Path, store: &Path, key: &Path, blocks: u64) -> ServeConfig {
    let mut cfg = node_config(data, blocks, OramEngine::Tao, "127.0.0.1:0".parse().unwrap());
    cfg.store = Some(blindfold_store::StoreUrl::File {
        dir: store.to_path_buf(),
        sync: blindfold_store::SyncMode::OnFlush,
    });
    cfg.key_file = Some(key.to_path_buf());
    cfg.credentials = Some(("ak".into(), "sk".into()));
    cfg
}

fn gateway_hooks(cluster: &Cluster, seed: u64) -> OpenHooks {
    OpenHooks {
        engine_factory: Some(blindfold_node::balancer::engine_factory(
            cluster.urls(),
            cluster.balancer_tls(),
            seeded(seed),
        )),
        ..Default::default()
    }
}

/// What `blindfold recover --nodes … --tls-dir …` gives the gateway's recover.
fn recover_hooks(cluster: &Cluster, seed: u64) -> blindfold_gateway::server::RecoverHooks {
    recover_hooks_over(cluster.urls(), cluster.balancer_tls(), seed)
}

/// [`recover_hooks`] for the nodes at `urls`.
fn recover_hooks_over(
    urls: Vec<String>,
    tls: ClusterTls,
    seed: u64,
) -> blindfold_gateway::server::RecoverHooks {
    let rebuild =
        blindfold_node::recover::rebuild_fn(urls.clone(), tls.clone(), Arc::new(|_: &str| {}));
    blindfold_gateway::server::RecoverHooks {
        rebuild: Some(Box::new(move |dir, ckpt, key| {
            Box::pin(async move {
                let r = rebuild(dir, ckpt, key).await?;
                Ok(blindfold_gateway::server::RebuiltElsewhere {
                    blocks_found: r.blocks_found,
                    summary: r.summary(),
                    lost: r.lost,
                })
            })
        })),
        engine_factory: Some(blindfold_node::balancer::engine_factory(urls, tls, seeded(seed))),
        check_state: None,
        tail: None,
    }
}

async fn put_object(opened: &blindfold_gateway::server::Opened, key: &str, data: Vec<u8>) {
    let body = futures::stream::iter(vec![Ok::<_, std::io::Error>(bytes::Bytes::from(data))]);
    opened.objects.put_object("b", key, body, None, Default::default(), false).await.unwrap();
}

async fn get_object(opened: &blindfold_gateway::server::Opened, key: &str) -> Option<Vec<u8>> {
    let meta = opened.objects.directory().object("b", key).unwrap()?;
    let mut rx = opened.objects.read_range(&meta, 0..meta.size, 0).await.unwrap();
    let mut out = Vec::new();
    while let Some(c) = rx.recv().await {
        out.extend_from_slice(&c.unwrap());
    }
    Some(out)
}

fn object_data(i: u64) -> Vec<u8> {
    (0..300 + i * 40).map(|j| (j * 7 + i * 13) as u8).collect()
}

/// A gateway over ORAM nodes that served past its last clean stop and lost its machine:
/// `recover` with the rebuild hook brings back every object not touched since the snapshot,
/// names the objects whose blocks are gone, survives being cut short, and the gateway serves
/// again over the same nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_over_nodes_is_recovered_from_its_snapshot() {
    use blindfold_gateway::server::{recover_until_with, recover_with, RecoverCrash};
    let cluster = Cluster::new(3, 256, OramEngine::Tao).await;
    let root = cluster.root.path();
    let (store, key) = (root.join("gateway-store"), root.join("gateway-key.json"));
    blindfold_crypto::create_key_file(&key, None).unwrap();
    let first = root.join("gateway1");
    let cfg = gateway_config(&first, &store, &key, 256);
    {
        let opened =
            blindfold_gateway::server::open_with(&cfg, gateway_hooks(&cluster, 81)).await.unwrap();
        opened.objects.directory().create_bucket("b").unwrap();
        for i in 0..12 {
            put_object(&opened, &format!("k{i}"), object_data(i)).await;
        }
        // The clean stop of `serve`: commit and checkpoint, then the snapshot into the store.
        opened.objects.shutdown().await.unwrap();
        blindfold_gateway::server::write_snapshot(&opened).await.unwrap();
    }
    {
        // It serves again, reading k0..k5 (their blocks move and their places are reused)
        // and writing new objects, then the machine is lost with no clean stop.
        let opened =
            blindfold_gateway::server::open_with(&cfg, gateway_hooks(&cluster, 82)).await.unwrap();
        for round in 0..4 {
            for i in 0..6 {
                assert_eq!(get_object(&opened, &format!("k{i}")).await.unwrap(), object_data(i));
            }
            put_object(&opened, &format!("new{round}"), object_data(50 + round)).await;
        }
        opened.objects.engine().commit().await.unwrap();
    }
    std::fs::remove_dir_all(&first).unwrap();
    let second = root.join("gateway2");
    let cfg2 = gateway_config(&second, &store, &key, 256);
    // Without the nodes, recover says what it needs and writes nothing.
    let e = blindfold_gateway::server::recover_with(
        &cfg2,
        blindfold_gateway::server::RecoverHooks {
            check_state: Some(Box::new(|c| {
                if blindfold_node::balancer::is_balancer_checkpoint(c) {
                    Err("give --nodes".into())
                } else {
                    Ok(())
                }
            })),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("give --nodes"), "{e}");
    assert!(!second.join("gateway.json").exists());
    // Cut short once the nodes are rewritten and before the directory is restored; run again.
    let cut =
        recover_until_with(&cfg2, recover_hooks(&cluster, 83), Some(RecoverCrash::AfterRebuild))
            .await;
    assert!(cut.is_err());
    let (opened, about) = recover_with(&cfg2, recover_hooks(&cluster, 84)).await.unwrap();
    assert!(about.contains("took up an interrupted recover's plan"), "{about}");
    let mut lost = Vec::new();
    for i in 0..12u64 {
        let name = format!("k{i}");
        match get_object(&opened, &name).await {
            Some(d) => assert_eq!(d, object_data(i), "{name}: recovered with other data"),
            None => {
                assert!(i < 6, "{name} was not touched after the snapshot, yet it is lost");
                assert!(about.contains(&format!("lost: b/{name}")), "{name} not named: {about}");
                lost.push(name);
            }
        }
    }
    assert!(!lost.is_empty(), "no snapshot place was reused: the test shows nothing");
    assert!(get_object(&opened, "new0").await.is_none(), "written after the snapshot");
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
    // It serves: a new object over the recovered balancer, and a clean stop.
    put_object(&opened, "after", object_data(99)).await;
    assert_eq!(get_object(&opened, "after").await.unwrap(), object_data(99));
    opened.objects.shutdown().await.unwrap();
    drop(opened);
    cluster.stop().await;
}

/// A gateway over a node cluster grows while it serves (`blindfold grow`, `--grow-at`): the
/// nodes grow their own trees, the balancer hands out their new local ids, the gateway takes the
/// new capacity; nothing is lost, and a crash at either step leaves a gateway that opens (before
/// the new capacity is recorded: at the old size, with nodes to spare; after it: the growth
/// finishes as it opens). No block moves, so the balancer sends no access for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_gateway_grows_while_serving() {
    use blindfold_gateway::grow::CrashPoint;
    let blocks = 32;
    let cluster = Cluster::new(2, blocks, OramEngine::Tao).await;
    let dir = cluster.root.path().join("gateway");
    let mut cfg = node_config(&dir, blocks, OramEngine::Tao, "127.0.0.1:0".parse().unwrap());
    cfg.credentials = Some(("grow-test".into(), "grow-test-secret".into()));
    let open = || {
        let hooks = OpenHooks {
            engine_factory: Some(blindfold_node::balancer::engine_factory(
                cluster.urls(),
                cluster.balancer_tls(),
                seeded(rand::random()),
            )),
            ..Default::default()
        };
        let cfg = cfg.clone();
        async move { blindfold_gateway::server::open_with(&cfg, hooks).await.unwrap() }
    };
    let node_blocks = |i: usize| -> u64 {
        let p = blindfold_gateway::server::read_params(&cluster.nodes[i].dir).unwrap().unwrap();
        p.blocks
    };
    let before: Vec<u64> = (0..2).map(node_blocks).collect();
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let check = |opened: &blindfold_gateway::server::Opened, model: &HashMap<u64, Vec<u8>>| {
        let engine = Arc::clone(opened.objects.engine());
        let model = model.clone();
        async move {
            let ids: Vec<BlockId> = model.keys().map(|&b| BlockId(b)).collect();
            for (b, d) in ids.iter().zip(engine.read_many(&ids).await.unwrap()) {
                assert_eq!(d, model[&b.0], "block {}", b.0);
            }
        }
    };
    let opened = open().await;
    let w: Vec<(BlockId, Vec<u8>)> = (0..blocks).map(|b| (BlockId(b), block(b))).collect();
    model.extend(w.iter().map(|(b, d)| (b.0, d.clone())));
    opened.objects.engine().write_many(w).await.unwrap();
    opened.objects.engine().commit().await.unwrap();

    // A crash once the nodes grew, before the gateway recorded the new capacity.
    let grower = opened.grower.clone().expect("a cluster gateway grows");
    grower.crash_at(Some(CrashPoint::AfterCheckpoint));
    let e = grower.grow(2 * blocks).await.expect_err("the growth was cut short");
    assert!(e.to_string().contains("simulated crash"), "{e}");
    let need = node_blocks_needed(2 * blocks, 2);
    for i in 0..2 {
        assert!(node_blocks(i) >= need, "node {i} holds {} < {need}", node_blocks(i));
    }
    drop((grower, opened));
    let opened = open().await;
    assert_eq!(opened.params.blocks, blocks, "the new capacity was never recorded");
    assert_eq!(opened.objects.directory().capacity(), blocks);
    check(&opened, &model).await;

    // A crash once the new capacity is recorded: the next start finishes the growth.
    let grower = opened.grower.clone().unwrap();
    grower.crash_at(Some(CrashPoint::AfterParams));
    let e = grower.grow(2 * blocks).await.expect_err("the growth was cut short");
    assert!(e.to_string().contains("simulated crash"), "{e}");
    drop((grower, opened));
    let opened = open().await;
    assert_eq!(opened.params.blocks, 2 * blocks);
    assert_eq!(opened.objects.directory().capacity(), 2 * blocks);
    check(&opened, &model).await;
    let w: Vec<(BlockId, Vec<u8>)> =
        (blocks..2 * blocks).map(|b| (BlockId(b), block(b + 7))).collect();
    model.extend(w.iter().map(|(b, d)| (b.0, d.clone())));
    opened.objects.engine().write_many(w).await.unwrap();
    opened.objects.engine().commit().await.unwrap();

    // A growth that runs through, while clients read and write.
    let grower = opened.grower.clone().unwrap();
    let engine = Arc::clone(opened.objects.engine());
    let traffic = {
        let engine = Arc::clone(&engine);
        tokio::spawn(async move {
            for round in 0..20u64 {
                let b = round % blocks;
                engine.write_many(vec![(BlockId(b), block(b + 100 * round))]).await.unwrap();
                engine.read_many(&[BlockId(b)]).await.unwrap();
            }
            engine.commit().await.unwrap();
        })
    };
    let grown = grower.grow(4 * blocks).await.unwrap();
    traffic.await.unwrap();
    for round in 0..20u64 {
        let b = round % blocks;
        model.insert(b, block(b + 100 * round));
    }
    assert_eq!((grown.from_blocks, grown.to_blocks), (2 * blocks, 4 * blocks));
    assert!(grown.describe().contains("in place"), "{}", grown.describe());
    let need = node_blocks_needed(4 * blocks, 2);
    for (i, was) in before.iter().enumerate() {
        assert!(node_blocks(i) >= need && node_blocks(i) > *was);
    }
    assert_eq!(opened.objects.directory().capacity(), 4 * blocks);
    check(&opened, &model).await;
    let w: Vec<(BlockId, Vec<u8>)> =
        (2 * blocks..4 * blocks).map(|b| (BlockId(b), block(b + 9))).collect();
    model.extend(w.iter().map(|(b, d)| (b.0, d.clone())));
    engine.write_many(w).await.unwrap();
    drop(engine);
    opened.objects.shutdown().await.unwrap();
    drop((grower, opened));
    let opened = open().await;
    assert_eq!(opened.params.blocks, 4 * blocks);
    check(&opened, &model).await;
    let report = opened.objects.engine().verify(&mut |_, _| {}).await.unwrap();
    assert!(report.failures.is_empty(), "{:?}", report.failures);
    opened.objects.shutdown().await.unwrap();
    drop(opened);
    cluster.stop().await;
}

/// A growth moves no block and sends no access: every block keeps its place, the balancer's
/// recorded requests are the same before and after (only Grow requests, carrying the new size,
/// go to the nodes), and the new blocks can be written and read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn growing_a_balancer_moves_no_block() {
    use blindfold_proxy::InPlaceGrowth;
    let blocks = 32;
    let cluster = Cluster::new(2, blocks, OramEngine::Tao).await;
    let balancer = cluster.balancer(true, seeded(3)).await;
    let w: Vec<(BlockId, Vec<u8>)> = (0..blocks).map(|b| (BlockId(b), block(b))).collect();
    balancer.write_many(w).await.unwrap();
    balancer.commit().await.unwrap();
    let places: Vec<_> = (0..blocks).map(|b| balancer.place_of(b)).collect();
    let sent = balancer.trace().len();
    let room = balancer.grow_in_place(4 * blocks, InPlaceGrowth::MakeRoom).await.unwrap();
    assert!(room.unwrap().contains("2 of 2 nodes grew"));
    // Not serving the new blocks until adopted.
    let e = balancer.read_many(&[BlockId(blocks)]).await.expect_err("a block beyond the size");
    assert!(e.to_string().contains("beyond"), "{e}");
    balancer.grow_in_place(4 * blocks, InPlaceGrowth::Adopt).await.unwrap().unwrap();
    assert_eq!(balancer.trace().len(), sent, "the growth sent accesses");
    assert_eq!((0..blocks).map(|b| balancer.place_of(b)).collect::<Vec<_>>(), places);
    let need = node_blocks_needed(4 * blocks, 2);
    let nodes: serde_json::Value = serde_json::from_slice(
        &std::fs::read(cluster.root.path().join("balancer").join("nodes.json")).unwrap(),
    )
    .unwrap();
    for n in nodes["nodes"].as_array().unwrap() {
        assert_eq!(n["blocks"].as_u64().unwrap(), need, "{nodes}");
    }
    let w: Vec<(BlockId, Vec<u8>)> = (blocks..4 * blocks).map(|b| (BlockId(b), block(b))).collect();
    balancer.write_many(w).await.unwrap();
    let ids: Vec<BlockId> = (0..4 * blocks).map(BlockId).collect();
    for (b, d) in ids.iter().zip(balancer.read_many(&ids).await.unwrap()) {
        assert_eq!(d, block(b.0), "block {}", b.0);
    }
    // Growing again to a size the nodes already hold sends no Grow request.
    let room = balancer.grow_in_place(4 * blocks, InPlaceGrowth::MakeRoom).await.unwrap();
    assert!(room.unwrap().contains("0 of 2 nodes grew"));
    balancer.shutdown().await.unwrap();
    drop(balancer);
    cluster.stop().await;
}

/// Bucket `b` of `opened` lists exactly the keys of `expect`, each reading back as its value.
async fn check_objects(
    opened: &blindfold_gateway::server::Opened,
    expect: &std::collections::BTreeMap<String, Vec<u8>>,
) {
    let listed = opened.objects.directory().list("b", "", "", 100).unwrap();
    let names: Vec<&String> = listed.iter().map(|(k, _)| k).collect();
    assert_eq!(names, expect.keys().collect::<Vec<_>>());
    for (k, v) in expect {
        let got = get_object(opened, k).await;
        assert!(
            got.as_ref() == Some(v),
            "{k}: recovered with other data ({:?} bytes)",
            got.map(|g| g.len())
        );
    }
}

/// How long the leases of the next test last: a successor of a gateway or node that died
/// waits little.
const TTL: std::time::Duration = std::time::Duration::from_millis(400);

/// Node `i` of a cluster whose machines can be lost: its store and key file outside its data
/// directory, every write logged in its store (`blindfold node --durability store`).
fn logged_node_config(root: &Path, i: usize, blocks: u64, listen: SocketAddr) -> ServeConfig {
    let mut cfg = node_config(&root.join(format!("node{i}")), blocks, OramEngine::Tao, listen);
    cfg.store = Some(blindfold_store::StoreUrl::File {
        dir: root.join(format!("node{i}-store")),
        sync: blindfold_store::SyncMode::OnFlush,
    });
    cfg.key_file = Some(root.join(format!("node{i}-key.json")));
    cfg.durability = blindfold_gateway::server::Durability::Store;
    cfg.lease_ttl = Some(TTL);
    cfg
}

/// `--durability store` over a cluster: the gateway logs the balancer's state and its
/// directory in its store, each node its blocks in its own. A growth while serving, then the
/// gateway's machine and a node's machine are lost together with no clean stop: the node is
/// recovered from its store alone, then the gateway from its store alone over the nodes, and
/// every acknowledged write is back. A standby over the same nodes then takes over from the
/// recovered gateway when it dies, losing nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_under_store_durability_loses_nothing_with_its_machines() {
    use blindfold_gateway::server::{recover, recover_with, write_snapshot, Durability};
    let (n, blocks) = (2, 256);
    let root = tempfile::tempdir().unwrap();
    let r = root.path().to_path_buf();
    blindfold_node::write_cluster_certs(&r.join("certs"), &vec!["127.0.0.1".to_string(); n])
        .unwrap();
    let tls_of = |i: usize| r.join("certs").join(format!("node-{}", i + 1));
    let per_node = node_blocks_needed(blocks, n) + 8;
    let mut nodes = Vec::new();
    for i in 0..n {
        let cfg = logged_node_config(&r, i, per_node, "127.0.0.1:0".parse().unwrap());
        nodes.push(start_node_with(cfg, &tls_of(i)).await);
    }
    let mut cluster = Cluster { root, nodes, key: MasterKey::from_bytes([9; 32]), blocks };
    let (store, key) = (r.join("gateway-store"), r.join("gateway-key.json"));
    let gateway = |name: &str| {
        let mut cfg = gateway_config(&r.join(name), &store, &key, blocks);
        cfg.durability = Durability::Store;
        cfg.lease_ttl = Some(TTL);
        cfg
    };
    let mut expect: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
    let opened =
        blindfold_gateway::server::open_with(&gateway("gateway1"), gateway_hooks(&cluster, 91))
            .await
            .unwrap_or_else(|e| panic!("--durability store over nodes: {e}"));
    assert!(opened.journal.is_some(), "the gateway over nodes keeps no log in its store");
    opened.objects.directory().create_bucket("b").unwrap();
    for i in 0..8u64 {
        put_object(&opened, &format!("k{i}"), object_data(i)).await;
        expect.insert(format!("k{i}"), object_data(i));
    }
    // A growth while serving: the nodes rebuild their trees (each logging in its own store),
    // the balancer takes their new ids, the gateway the new capacity.
    let grower = opened.grower.clone().expect("a cluster gateway grows");
    grower.grow(2 * blocks).await.unwrap_or_else(|e| panic!("grow: {e}"));
    drop(grower);
    // The store's newest checkpoint, right after the growth, is one the log continues (a
    // plain snapshot there would end the log: a loss now would lose what follows).
    {
        let snaps = opened.snapshots.lock().clone().expect("the snapshot area is open");
        let newest =
            blindfold_gateway::snapshot::read_latest(&*snaps.store, &opened.key).await.unwrap();
        assert!(newest.journal.is_some(), "after a growth, snapshot #{} ends the log", newest.seq);
        assert_eq!(newest.params.blocks, 2 * blocks);
    }
    for i in 8..14u64 {
        put_object(&opened, &format!("k{i}"), object_data(i)).await;
        expect.insert(format!("k{i}"), object_data(i));
    }
    put_object(&opened, "k1", object_data(41)).await;
    expect.insert("k1".into(), object_data(41));
    assert!(opened.objects.delete_object("b", "k2").await.unwrap());
    expect.remove("k2");
    // Reads move blocks too (intents, then commit records naming their new places).
    for i in [0u64, 3, 4] {
        assert_eq!(get_object(&opened, &format!("k{i}")).await.unwrap(), object_data(i));
    }
    opened.objects.engine().commit().await.unwrap();

    // Both machines are lost, neither stopping cleanly: the gateway's and node 0's.
    drop(opened);
    let lost = cluster.nodes.remove(0);
    let addr = lost.addr;
    lost.crash().await;
    std::fs::remove_dir_all(r.join("gateway1")).unwrap();
    std::fs::remove_dir_all(r.join("node0")).unwrap();
    tokio::time::sleep(TTL + std::time::Duration::from_millis(100)).await;

    // The node, from its store and key alone (`blindfold recover` on its store), then started
    // again where it was.
    let node_cfg = logged_node_config(&r, 0, per_node, addr);
    {
        let mut cfg = node_cfg.clone();
        cfg.credentials = Some(("blindfold-node".into(), "unused".into()));
        let (node, about) = recover(&cfg).await.unwrap_or_else(|e| panic!("node recover: {e}"));
        assert!(about.contains("every acknowledged write is back"), "{about}");
        node.objects.shutdown().await.unwrap();
        write_snapshot(&node).await.unwrap();
    }
    cluster.nodes.insert(0, start_node_with(node_cfg, &tls_of(0)).await);

    // The gateway, from its store alone, over the nodes.
    let (opened, about) = recover_with(&gateway("gateway2"), recover_hooks(&cluster, 92))
        .await
        .unwrap_or_else(|e| panic!("gateway recover over the nodes: {e}"));
    assert!(about.contains("every acknowledged write is back"), "{about}");
    assert_eq!(opened.objects.directory().capacity(), 2 * blocks, "{about}");
    check_objects(&opened, &expect).await;
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{report:?}");

    // A standby over the same nodes takes over when the recovered gateway dies.
    let standby = {
        let cfg = gateway("standby");
        let (urls, tls) = (cluster.urls(), cluster.balancer_tls());
        tokio::spawn(async move {
            let hooks = move || Ok(recover_hooks_over(urls.clone(), tls.clone(), 93));
            blindfold_gateway::standby::take_over_with(&cfg, Arc::new(|_: &str| {}), &hooks).await
        })
    };
    put_object(&opened, "after", object_data(77)).await;
    expect.insert("after".into(), object_data(77));
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!standby.is_finished(), "the standby took over while the primary held the lease");
    drop(opened);
    let (opened, about) = tokio::time::timeout(std::time::Duration::from_secs(60), standby)
        .await
        .expect("the standby took over within a minute")
        .unwrap()
        .unwrap_or_else(|e| panic!("standby over the nodes: {e}"));
    assert!(about.contains("took over"), "{about}");
    check_objects(&opened, &expect).await;
    opened.objects.shutdown().await.unwrap();
    write_snapshot(&opened).await.unwrap();
    drop(opened);
    cluster.stop().await;
}
