//! The engine conformance suite ([`blindfold_testkit::engines`]) over a cluster: the
//! balancer in front of two ORAM nodes, each a catalogue engine (TaoStore) over a memory store
//! the suite wraps, served on 127.0.0.1 over mutually authenticated gRPC in this process.
//!
//! Run here: the model, tampering (flip, swap, rollback), abandoned requests and the trace.
//! Not yet: the crash checks (`crash`, `fresh_after_crash`) — a crash of the cluster is a crash
//! of the balancer or of one node, each a separate engine with its own state, which the
//! suite's single "the store died, reopen" shape does not express (cluster.rs crashes nodes
//! and the balancer by hand); and `rotate` — the balancer has no sweep (`sweep_paths` is 0),
//! each node rotates its own key.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use blindfold_crypto::MasterKey;
use blindfold_node::balancer::node_blocks_needed;
use blindfold_node::node::{serve, NodeService};
use blindfold_node::wire::NodeInfo;
use blindfold_node::{Balancer, BalancerConfig, ClusterTls};
use blindfold_proxy::catalogue::{physical_view, OramEngine};
use blindfold_proxy::engine::SharedEngine;
use blindfold_proxy::ProxyError;
use blindfold_testkit::engines::{self, Capabilities, CatalogueEngine, Subject, Wrap};
use parking_lot::Mutex;

const BS: u32 = 64;
const BLOCKS: u64 = 128;
const NODES: usize = 2;

/// A running cluster: its directory (certificates, the balancer's state) and what stops the
/// nodes' servers when dropped.
struct Running {
    root: tempfile::TempDir,
    urls: Vec<String>,
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
    _nodes: Vec<CatalogueEngine>,
}

/// Two TaoStore nodes behind a balancer.
struct ClusterSubject {
    key: MasterKey,
    running: Mutex<Option<Arc<Running>>>,
}

impl ClusterSubject {
    fn new() -> Self {
        Self { key: MasterKey::from_bytes([7; 32]), running: Mutex::new(None) }
    }

    async fn balancer(&self, running: &Running, creating: bool) -> Result<Balancer, ProxyError> {
        let tls = ClusterTls::load(&running.root.path().join("certs").join("balancer"))
            .map_err(|e| ProxyError::Config(e.to_string()))?;
        Balancer::open(
            &running.root.path().join("balancer"),
            &running.urls,
            &tls,
            BLOCKS,
            BS,
            &self.key,
            creating,
            BalancerConfig::default(),
        )
        .await
        .map_err(|e| ProxyError::Config(e.to_string()))
    }
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

    /// Every node has the same shape, so the reads of both map to targets alike.
    fn capabilities(&self) -> Capabilities {
        let node = CatalogueEngine::new(OramEngine::Tao, node_blocks_needed(BLOCKS, NODES) + 8, BS);
        Capabilities { view: physical_view(node.params()).ok(), ..Capabilities::default() }
    }

    async fn create(&self, wrap: Wrap) -> Arc<dyn SharedEngine> {
        let root = tempfile::tempdir().unwrap();
        let hosts = vec!["127.0.0.1".to_string(); NODES];
        blindfold_node::write_cluster_certs(&root.path().join("certs"), &hosts).unwrap();
        let per_node = node_blocks_needed(BLOCKS, NODES) + 8;
        let (mut urls, mut stops, mut nodes) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..NODES {
            let node = CatalogueEngine::new(OramEngine::Tao, per_node, BS);
            let engine = node.create(wrap.clone()).await;
            let id: [u8; 16] = hex::decode(&node.params().store_id).unwrap().try_into().unwrap();
            let info = NodeInfo { id, blocks: per_node, block_size: BS, instance: rand::random() };
            let tls = ClusterTls::load(&root.path().join("certs").join(format!("node-{}", i + 1)))
                .unwrap();
            let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
            urls.push(format!("https://{}", listener.local_addr().unwrap()));
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let service = NodeService::new(engine, info);
            tokio::spawn(async move {
                let _ = serve(service, listener, &tls, async move {
                    let _ = stopped.await;
                })
                .await;
            });
            stops.push(stop);
            nodes.push(node);
        }
        let running = Arc::new(Running { root, urls, _stops: stops, _nodes: nodes });
        *self.running.lock() = Some(Arc::clone(&running));
        Arc::new(self.balancer(&running, true).await.unwrap())
    }

    /// Opens the balancer again over the nodes, which keep running (and keep the stores the
    /// suite wrapped when they were created: `wrap` applies to nothing new).
    async fn reopen(&self, _wrap: Wrap) -> Result<Arc<dyn SharedEngine>, ProxyError> {
        let running = self.running.lock().clone().expect("create before reopen");
        Ok(Arc::new(self.balancer(&running, false).await?))
    }

    async fn rotate(&self, _wrap: Wrap) -> Result<Arc<dyn SharedEngine>, ProxyError> {
        Err(ProxyError::Config("a cluster rotates each node's key on the node".into()))
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

checks!(model tamper swap rollback abandoned);

/// Fewer accesses than for one engine: each is a round trip over TLS to both nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace() {
    engines::trace_with(&ClusterSubject::new(), 100).await;
}
