//! One ORAM node: an ordinary blindfold engine in its own data directory, served to the
//! balancer over mutually authenticated gRPC.
//!
//! The node's caller opens its data directory exactly as `blindfold serve` does (key,
//! parameters, any engine over any store URL, crash recovery: `blindfold node` does it with the
//! gateway's opener) and hands this module the engine; the node serves the engine's blocks,
//! numbered `0..blocks` ("local ids"), instead of objects. Each Access request runs as exactly one engine `read_many` of its reads and one
//! `write_many` of its writes (a request names no id twice among either: the decoder refuses
//! one that does), so what the node's store sees per request depends only on its counts of
//! reads and writes, never on the ids or the workload behind them.
//!
//! A Grow request (the balancer growing the cluster, see `Balancer`'s growth) makes the node
//! grow its engine through the hook its caller gives, [`Opened::grow`] (`blindfold node` hands
//! the data directory's grower: the node's tree is rebuilt into a larger one, as `blindfold
//! grow` does); requests wait meanwhile.

use std::sync::Arc;

use blindfold_oram::BlockId;
use blindfold_proxy::{EngineParams, ProxyError, SharedEngine};
use tonic::{Request, Response, Status};

use crate::certs::ClusterTls;
use crate::client::CELL_KEY;
use crate::proto::node_server::{Node, NodeServer};
use crate::wire::{self, Access, Frame, NodeInfo};
use crate::NodeError;

/// Grows the node's engine to at least the given number of blocks and returns how many it
/// holds then (`blindfold node` hands the data directory's grower; see
/// `blindfold_gateway::grow`).
pub type GrowHook =
    Arc<dyn Fn(u64) -> futures::future::BoxFuture<'static, Result<u64, String>> + Send + Sync>;

/// Serves one engine's blocks.
pub struct NodeService {
    engine: Arc<dyn SharedEngine>,
    info: parking_lot::RwLock<NodeInfo>,
    grow: Option<GrowHook>,
    /// One growth at a time.
    growing: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for NodeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeService")
            .field("engine", &self.engine)
            .field("info", &*self.info.read())
            .field("grows", &self.grow.is_some())
            .finish()
    }
}

fn engine_status(e: ProxyError) -> Status {
    match &e {
        ProxyError::Integrity { cell, .. } => {
            let mut s = Status::data_loss(e.to_string());
            if let Ok(v) = cell.to_string().parse() {
                s.metadata_mut().insert(CELL_KEY, v);
            }
            s
        }
        _ if e.is_integrity() => Status::data_loss(e.to_string()),
        ProxyError::Poisoned => Status::failed_precondition(e.to_string()),
        _ if e.is_retryable() => Status::unavailable(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

impl NodeService {
    /// Serves `engine`, which holds `info.blocks` blocks of `info.block_size` bytes.
    pub fn new(engine: Arc<dyn SharedEngine>, info: NodeInfo) -> Self {
        Self {
            engine,
            info: parking_lot::RwLock::new(info),
            grow: None,
            growing: tokio::sync::Mutex::new(()),
        }
    }

    /// Lets the balancer grow the node through `grow` (without it, Grow requests are refused).
    pub fn with_grow(mut self, grow: Option<GrowHook>) -> Self {
        self.grow = grow;
        self
    }

    /// The engine's node info.
    pub fn info(&self) -> NodeInfo {
        *self.info.read()
    }

    /// Runs `a` on a task of its own: a request the balancer gives up on (a dropped
    /// connection, a timeout) still finishes its engine calls, which are not all safe to
    /// cancel half-way.
    async fn run(&self, a: Access) -> Result<Vec<u8>, ProxyError> {
        let (engine, info) = (Arc::clone(&self.engine), self.info());
        tokio::spawn(run_access(engine, info, a))
            .await
            .map_err(|e| ProxyError::State(format!("an access stopped: {e}")))?
    }
}

async fn run_access(
    engine: Arc<dyn SharedEngine>,
    info: NodeInfo,
    a: Access,
) -> Result<Vec<u8>, ProxyError> {
    let bs = info.block_size as usize;
    let mut reply = Vec::with_capacity(8 + a.reads.len() * bs);
    reply.extend_from_slice(&info.instance.to_le_bytes());
    // One engine call for the reads and one for the writes, whatever the ids: the ids are
    // distinct within each list (checked by `Access::decode`).
    if !a.reads.is_empty() {
        let ids: Vec<BlockId> = a.reads.iter().map(|&i| BlockId(i)).collect();
        let blocks = engine.read_many(&ids).await?;
        if blocks.len() != ids.len() {
            return Err(ProxyError::State("the engine returned too few blocks".into()));
        }
        for block in blocks {
            if block.len() != bs {
                return Err(ProxyError::State("the engine returned a short block".into()));
            }
            reply.extend_from_slice(&block);
        }
    }
    if !a.writes.is_empty() {
        engine.write_many(a.writes.into_iter().map(|(i, d)| (BlockId(i), d)).collect()).await?;
    }
    Ok(reply)
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn info(&self, _req: Request<Frame>) -> Result<Response<Frame>, Status> {
        Ok(Response::new(Frame::new(self.info().encode())))
    }

    async fn access(&self, req: Request<Frame>) -> Result<Response<Frame>, Status> {
        let info = self.info();
        let bs = info.block_size as usize;
        let access = Access::decode(&req.into_inner().body, info.blocks, bs)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let reply = self.run(access).await.map_err(engine_status)?;
        Ok(Response::new(Frame::new(reply)))
    }

    async fn commit(&self, req: Request<Frame>) -> Result<Response<Frame>, Status> {
        if !req.get_ref().body.is_empty() {
            return Err(Status::invalid_argument("a commit request carries no body"));
        }
        // On a task of its own, as accesses are: a commit must never stop half-way.
        let engine = Arc::clone(&self.engine);
        tokio::spawn(async move { engine.commit().await })
            .await
            .map_err(|e| Status::internal(format!("the commit stopped: {e}")))?
            .map_err(engine_status)?;
        Ok(Response::new(Frame::new(self.info().instance.to_le_bytes().to_vec())))
    }

    async fn grow(&self, req: Request<Frame>) -> Result<Response<Frame>, Status> {
        let blocks = wire::decode_grow(&req.into_inner().body)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let _one = self.growing.lock().await;
        if blocks > self.info().blocks {
            let Some(grow) = self.grow.clone() else {
                return Err(Status::failed_precondition(
                    "this node cannot grow: it serves an engine without a data directory",
                ));
            };
            tracing::info!(from = self.info().blocks, to = blocks, "the balancer grows this node");
            // On a task of its own: a growth must never stop half-way.
            let grown = tokio::spawn(async move { grow(blocks).await })
                .await
                .map_err(|e| Status::internal(format!("the growth stopped: {e}")))?
                .map_err(|e| Status::failed_precondition(format!("the node did not grow: {e}")))?;
            if grown < blocks {
                return Err(Status::internal(format!(
                    "the node grew to {grown} blocks, not the {blocks} asked for"
                )));
            }
            self.info.write().blocks = grown;
        }
        Ok(Response::new(Frame::new(self.info().encode())))
    }

    async fn verify(&self, req: Request<Frame>) -> Result<Response<Frame>, Status> {
        if !req.get_ref().body.is_empty() {
            return Err(Status::invalid_argument("a verify request carries no body"));
        }
        // The engine's verify future is not Send: it runs on a blocking thread of its own.
        let engine = Arc::clone(&self.engine);
        let handle = tokio::runtime::Handle::current();
        let report = tokio::task::spawn_blocking(move || {
            handle.block_on(async move { engine.verify(&mut |_, _| {}).await })
        })
        .await
        .map_err(|e| Status::internal(format!("verify stopped: {e}")))?
        .map_err(engine_status)?;
        Ok(Response::new(Frame::new(wire::encode_verify(&report))))
    }
}

/// The node info of a data directory with the parameters `params` (a fresh instance number
/// per process).
pub fn info_of(params: &EngineParams) -> Result<NodeInfo, NodeError> {
    let raw = hex::decode(&params.store_id)
        .ok()
        .and_then(|b| <[u8; 16]>::try_from(b).ok())
        .ok_or_else(|| NodeError::Config("the data directory's store id is not 16 bytes".into()))?;
    if params.blocks < 2 {
        return Err(NodeError::Config("a node needs at least 2 blocks".into()));
    }
    if params.block_size as usize > wire::MAX_BLOCK_SIZE {
        return Err(NodeError::Config(format!(
            "a node serves blocks of at most {} bytes",
            wire::MAX_BLOCK_SIZE
        )));
    }
    Ok(NodeInfo {
        id: raw,
        blocks: params.blocks,
        block_size: params.block_size,
        instance: rand::random(),
    })
}

/// Serves `service` on `listener` over mutually authenticated TLS until `shutdown` resolves
/// (requests in flight finish first).
pub async fn serve(
    service: NodeService,
    listener: tokio::net::TcpListener,
    tls: &ClusterTls,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), NodeError> {
    let limit = wire::max_message(service.info().block_size as usize);
    let server =
        NodeServer::new(service).max_decoding_message_size(limit).max_encoding_message_size(limit);
    tonic::transport::Server::builder()
        .tls_config(tls.server())
        .map_err(|e| NodeError::Tls(format!("the node's TLS setup: {e}")))?
        .timeout(crate::client::RPC_TIMEOUT)
        .concurrency_limit_per_connection(256)
        .add_service(server)
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            shutdown,
        )
        .await
        .map_err(|e| NodeError::Rpc { node: "this node".into(), message: e.to_string() })
}

/// An opened node engine, as [`run`] serves it.
pub struct Opened {
    /// The engine.
    pub engine: Arc<dyn SharedEngine>,
    /// The data directory's parameters.
    pub params: EngineParams,
    /// Becomes `Some(why)` when the engine stops on an integrity error.
    pub stopped: tokio::sync::watch::Receiver<Option<String>>,
    /// Grows the engine when the balancer asks (`None`: Grow requests are refused).
    pub grow: Option<GrowHook>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("engine", &self.engine)
            .field("params", &self.params)
            .field("grows", &self.grow.is_some())
            .finish_non_exhaustive()
    }
}

/// `blindfold node`'s serving loop: serves `opened` on `listener` until `shutdown` resolves or
/// the engine stops on an integrity error (requests in flight finish first). The caller then
/// commits and checkpoints the engine (after a clean stop only); the error of a stopped engine
/// says what to do, for the data directory `data_dir`.
pub async fn run(
    opened: &Opened,
    listener: tokio::net::TcpListener,
    tls: &ClusterTls,
    data_dir: &std::path::Path,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), NodeError> {
    let info = info_of(&opened.params)?;
    let service = NodeService::new(Arc::clone(&opened.engine), info).with_grow(opened.grow.clone());
    let mut stopped = opened.stopped.clone();
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            _ = stopped.wait_for(|v| v.is_some()) => {}
        }
    };
    serve(service, listener, tls, stop).await?;
    if let Some(why) = opened.stopped.borrow().clone() {
        return Err(NodeError::Config(format!(
            "stopped serving: {why}; start the node again (it replays its redo log) and run \
             `blindfold verify --data-dir {}`",
            data_dir.display()
        )));
    }
    Ok(())
}
