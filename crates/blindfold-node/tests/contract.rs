//! The engine conformance suite ([`blindfold_testkit::engines`]) over a cluster: the
//! balancer in front of two ORAM nodes, each a catalogue engine (TaoStore) over a memory store
//! the suite wraps, served on 127.0.0.1 over mutually authenticated gRPC in this process.
//!
//! Run here: the model, a crash at every point and fresh paths after a crash (a crash of the
//! whole cluster: every node's store dies, each after its own count of writes, the balancer
//! with them; the reopen restarts every node over its surviving store, then the balancer),
//! tampering (flip, swap, rollback), abandoned requests, the trace, and key rotation (every
//! node's engine rotated and swept as `blindfold node` does, then the balancer opened under a
//! new key with the old one retiring and swept by the suite under load), recovery (the
//! balancer's state lost after a clean stop and rebuilt from its checkpoint over the running
//! nodes, `Balancer::recover`) and growth (every node grown, then the balancer opened for more
//! blocks, which takes the nodes' new ids). Not yet: a crash of
//! one node or of the balancer alone while the rest runs on (cluster.rs does those by hand;
//! the suite's subject has one "reopen" for the whole).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use blindfold_crypto::MasterKey;
use blindfold_node::balancer::node_blocks_needed;
use blindfold_node::node::{serve, NodeService};
use blindfold_node::wire::NodeInfo;
use blindfold_node::{Balancer, BalancerConfig, ClusterTls};
use blindfold_proxy::catalogue::{physical_view, OramEngine};
use blindfold_proxy::engine::SharedEngine;
use blindfold_proxy::rebuild::Rebuilt;
use blindfold_proxy::ProxyError;
use blindfold_testkit::engines::{self, Capabilities, CatalogueEngine, Subject, Wrap};

const BS: u32 = 64;
const BLOCKS: u64 = 128;
const NODES: usize = 2;

/// One node: its engine (a catalogue subject, so it can be reopened over its surviving
/// store), the engine it serves now and what stops its server.
struct Node {
    subject: CatalogueEngine,
    engine: Option<Arc<dyn SharedEngine>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    url: String,
}

/// A running cluster: its directory (certificates, the balancer's state) and its nodes.
struct Running {
    root: tempfile::TempDir,
    nodes: Vec<Node>,
}

impl Running {
    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url.clone()).collect()
    }

    /// Serves `engine` as node `i` on a fresh port.
    async fn serve(&mut self, i: usize, engine: Arc<dyn SharedEngine>) {
        let node = &mut self.nodes[i];
        let id: [u8; 16] =
            hex::decode(&node.subject.params().store_id).unwrap().try_into().unwrap();
        let blocks = node.subject.blocks();
        let info = NodeInfo { id, blocks, block_size: BS, instance: rand::random() };
        let tls = ClusterTls::load(&self.root.path().join("certs").join(format!("node-{}", i + 1)))
            .unwrap();
        let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
        node.url = format!("https://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = NodeService::new(Arc::clone(&engine), info);
        tokio::spawn(async move {
            let _ = serve(service, listener, &tls, async move {
                let _ = stopped.await;
            })
            .await;
        });
        node.stop = Some(stop);
        node.engine = Some(engine);
    }

    /// Stops every node (a clean stop of its engine where its store still answers).
    async fn stop(&mut self) {
        for node in &mut self.nodes {
            node.stop.take();
            if let Some(engine) = node.engine.take() {
                let _ = engine.shutdown().await;
            }
        }
    }
}

/// Two TaoStore nodes behind a balancer.
struct ClusterSubject {
    /// The balancer's key (a rotation replaces it).
    key: parking_lot::Mutex<[u8; 32]>,
    /// The balancer's logical blocks (a growth raises them).
    blocks: AtomicU64,
    running: tokio::sync::Mutex<Option<Running>>,
}

impl ClusterSubject {
    fn new() -> Self {
        Self {
            key: parking_lot::Mutex::new([7; 32]),
            blocks: AtomicU64::new(BLOCKS),
            running: tokio::sync::Mutex::new(None),
        }
    }

    fn tls(running: &Running) -> Result<ClusterTls, ProxyError> {
        ClusterTls::load(&running.root.path().join("certs").join("balancer"))
            .map_err(|e| ProxyError::Config(e.to_string()))
    }

    async fn balancer(&self, running: &Running, creating: bool) -> Result<Balancer, ProxyError> {
        let key = MasterKey::from_bytes(*self.key.lock());
        self.balancer_under(running, creating, &key, None).await
    }

    async fn balancer_under(
        &self,
        running: &Running,
        creating: bool,
        key: &MasterKey,
        previous: Option<&MasterKey>,
    ) -> Result<Balancer, ProxyError> {
        let tls = Self::tls(running)?;
        Balancer::open_rotating(
            &running.root.path().join("balancer"),
            &running.urls(),
            &tls,
            self.blocks.load(Ordering::SeqCst),
            BS,
            (key, previous),
            creating,
            BalancerConfig::default(),
        )
        .await
        .map_err(|e| ProxyError::Config(e.to_string()))
    }
}

fn per_node() -> u64 {
    node_blocks_needed(BLOCKS, NODES) + 8
}

#[async_trait(?Send)]
impl Subject for ClusterSubject {
    fn name(&self) -> String {
        format!("a balancer over {NODES} tao nodes")
    }

    fn block_size(&self) -> usize {
        BS as usize
    }

    fn blocks(&self) -> u64 {
        BLOCKS
    }

    /// Every node has the same shape, so the reads of both map to targets alike. A crash is
    /// the whole cluster's: every node's store dies (each after its own count of writes, so
    /// one may outlive the other) and the balancer stops with them; the reopen restarts every
    /// node over its surviving store, then the balancer.
    fn capabilities(&self) -> Capabilities {
        let node = CatalogueEngine::new(OramEngine::Tao, per_node(), BS);
        Capabilities {
            crash: true,
            rotate: true,
            rebuild: true,
            view: physical_view(node.params()).ok(),
            ..Capabilities::default()
        }
    }

    async fn create(&self, wrap: Wrap) -> Arc<dyn SharedEngine> {
        let mut guard = self.running.lock().await;
        if let Some(mut old) = guard.take() {
            old.stop().await;
        }
        let root = tempfile::tempdir().unwrap();
        let hosts = vec!["127.0.0.1".to_string(); NODES];
        blindfold_node::write_cluster_certs(&root.path().join("certs"), &hosts).unwrap();
        let nodes = (0..NODES)
            .map(|_| Node {
                subject: CatalogueEngine::new(OramEngine::Tao, per_node(), BS),
                engine: None,
                stop: None,
                url: String::new(),
            })
            .collect();
        let mut running = Running { root, nodes };
        self.blocks.store(BLOCKS, Ordering::SeqCst);
        for i in 0..NODES {
            let engine = running.nodes[i].subject.create(wrap.clone()).await;
            running.serve(i, engine).await;
        }
        let balancer = self.balancer(&running, true).await.unwrap();
        *guard = Some(running);
        Arc::new(balancer)
    }

    async fn reopen(&self, wrap: Wrap) -> Result<Arc<dyn SharedEngine>, ProxyError> {
        let mut guard = self.running.lock().await;
        let running = guard.as_mut().expect("create before reopen");
        running.stop().await;
        for i in 0..NODES {
            let engine = running.nodes[i].subject.reopen(wrap.clone()).await?;
            running.serve(i, engine).await;
        }
        Ok(Arc::new(self.balancer(running, false).await?))
    }

    /// Every node's key rotated as `blindfold node` does it (its engine opened under a new key
    /// with the old one retiring, swept twice while it serves), then the balancer opened under
    /// a new key with the old one retiring; the suite sweeps the balancer under load.
    async fn rotate(&self, wrap: Wrap) -> Result<Arc<dyn SharedEngine>, ProxyError> {
        let mut guard = self.running.lock().await;
        let running = guard.as_mut().expect("create before rotate");
        running.stop().await;
        for i in 0..NODES {
            let engine = running.nodes[i].subject.rotate(wrap.clone()).await?;
            running.serve(i, Arc::clone(&engine)).await;
            let paths = engine.sweep_paths().await;
            for _pass in 0..2 {
                for at in (0..paths).step_by(16) {
                    engine.sweep(at..(at + 16).min(paths)).await?;
                    engine.commit().await?;
                }
            }
        }
        let old = MasterKey::from_bytes(*self.key.lock());
        let new_bytes: [u8; 32] = rand::random();
        let new = MasterKey::from_bytes(new_bytes);
        let balancer = self.balancer_under(running, false, &new, Some(&old)).await?;
        *self.key.lock() = new_bytes;
        Ok(Arc::new(balancer))
    }

    /// Recovery: the balancer's state directory is lost after a clean stop and rebuilt from
    /// its checkpoint (the snapshot a gateway keeps) over the running nodes. Growth: every node
    /// grown into a larger store (as a node's own growth does when the balancer asks it), then
    /// the balancer opened for `grow_to` blocks, which takes the nodes' new ids as it opens.
    async fn rebuild(&self, wrap: Wrap, grow_to: Option<u64>) -> Result<Rebuilt, ProxyError> {
        let mut guard = self.running.lock().await;
        let running = guard.as_mut().expect("create before rebuild");
        let dir = running.root.path().join("balancer");
        let Some(to) = grow_to else {
            let snapshot = std::fs::read(dir.join("checkpoint.bin")).unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
            let key = MasterKey::from_bytes(*self.key.lock());
            let urls = running.urls();
            let r = Balancer::recover(&dir, &snapshot, &urls, &Self::tls(running)?, &key, &|_| {})
                .await
                .map_err(|e| ProxyError::Config(e.to_string()))?;
            return Ok(Rebuilt {
                cells_read: r.ids_read,
                unreadable_cells: Vec::new(),
                blocks_found: r.blocks_found,
                lost: r.lost,
                cells_written: r.ids_written,
                epoch: 0,
                ..Rebuilt::default()
            });
        };
        running.stop().await;
        let need = node_blocks_needed(to, NODES);
        let (mut read, mut written) = (0, 0);
        for i in 0..NODES {
            let r = running.nodes[i].subject.rebuild(wrap.clone(), Some(need)).await?;
            (read, written) = (read + r.cells_read, written + r.cells_written);
            let engine = running.nodes[i].subject.reopen(wrap.clone()).await?;
            running.serve(i, engine).await;
        }
        self.blocks.store(to, Ordering::SeqCst);
        let balancer = self.balancer(running, false).await?;
        let found = balancer.blocks_written() as u64;
        balancer.shutdown().await?;
        Ok(Rebuilt {
            cells_read: read,
            unreadable_cells: Vec::new(),
            blocks_found: found,
            lost: Vec::new(),
            cells_written: written,
            epoch: 0,
            ..Rebuilt::default()
        })
    }
}

macro_rules! checks {
    ($($check:ident)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                engines::$check(&ClusterSubject::new()).await;
            }
        )*
    };
}

checks!(model fresh_after_crash tamper swap rollback abandoned rotate rebuild grow);

/// Fewer and shorter trials than for one engine: each access is a round trip over TLS to
/// both nodes, and each trial restarts both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash() {
    engines::crash_with(&ClusterSubject::new(), 10, 40).await;
}

/// Fewer accesses than for one engine: each is a round trip over TLS to both nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace() {
    engines::trace_with(&ClusterSubject::new(), 100).await;
}
