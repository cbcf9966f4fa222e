//! The balancer's connection to one node.

use std::time::Duration;

use blindfold_crypto::CryptoError;
use blindfold_proxy::{ProxyError, VerifyReport};
use blindfold_store::StoreError;
use tonic::transport::{Channel, Endpoint};

use crate::certs::{host_of, ClusterTls};
use crate::proto::node_client::NodeClient as Stub;
use crate::wire::{self, Access, Frame, NodeInfo};
use crate::NodeError;

/// How long a node may take to answer one request.
pub const RPC_TIMEOUT: Duration = Duration::from_secs(120);

/// Metadata key carrying the cell of a node's integrity error.
pub(crate) const CELL_KEY: &str = "x-blindfold-cell";

/// A mutually authenticated gRPC connection to one node.
#[derive(Clone)]
pub struct NodeClient {
    url: String,
    /// The node's name, as its certificate proved it.
    name: String,
    stub: Stub<Channel>,
    info: NodeInfo,
}

impl std::fmt::Debug for NodeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClient")
            .field("url", &self.url)
            .field("name", &self.name)
            .field("info", &self.info)
            .finish()
    }
}

/// Renders an error with its causes (tonic's transport errors say little at the top).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

impl NodeClient {
    /// Connects to the node at `url` (`https://host:port`), presenting the balancer's
    /// certificate, and asks what it serves. Which node answers is what its certificate
    /// proves: the handshake expects each of the cluster's node names in turn (the one the
    /// node's position suggests, `hint`, first) and succeeds only for the name the node holds
    /// the key of ([`NodeClient::name`]). Fails if no name is proved (a node whose certificate
    /// the cluster CA did not sign, or one of another cluster).
    pub async fn connect(url: &str, hint: usize, tls: &ClusterTls) -> Result<Self, NodeError> {
        let url = if url.contains("://") { url.to_owned() } else { format!("https://{url}") };
        if !url.starts_with("https://") {
            return Err(NodeError::Config(format!(
                "{url}: nodes are reached over TLS only (https://host:port)"
            )));
        }
        host_of(&url)?;
        let names = tls.node_names()?;
        let first = hint.min(names.len() - 1);
        let order = std::iter::once(first).chain((0..names.len()).filter(|&i| i != first));
        let mut last = None;
        for i in order {
            match Self::connect_as(&url, &names[i], tls).await {
                // rustls checks the name after the chain: only a certificate of this cluster's
                // CA for another name gets here.
                Err(NodeError::Rpc { message, .. })
                    if message.contains("not valid for name")
                        || message.contains("NotValidForName") =>
                {
                    last = Some(message);
                }
                other => return other,
            }
        }
        Err(NodeError::Rpc {
            node: url.clone(),
            message: format!(
                "the node proved none of the cluster's {} node names: {}",
                names.len(),
                last.unwrap_or_default()
            ),
        })
    }

    /// [`NodeClient::connect`], expecting the node's certificate to be for `name`.
    async fn connect_as(url: &str, name: &str, tls: &ClusterTls) -> Result<Self, NodeError> {
        let url = url.to_owned();
        let rpc = |message: String| NodeError::Rpc { node: url.clone(), message };
        let endpoint = Endpoint::from_shared(url.clone())
            .map_err(|e| rpc(chain(&e)))?
            .tls_config(tls.client(name))
            .map_err(|e| rpc(chain(&e)))?
            .connect_timeout(Duration::from_secs(10))
            .timeout(RPC_TIMEOUT)
            .tcp_nodelay(true);
        let channel = endpoint.connect().await.map_err(|e| rpc(chain(&e)))?;
        // Until the node has said its block size, nothing larger than an Info reply comes in.
        let mut stub = Stub::new(channel).max_decoding_message_size(1024);
        let reply = stub
            .info(Frame::default())
            .await
            .map_err(|s| rpc(format!("{} ({:?})", s.message(), s.code())))?;
        let info = NodeInfo::decode(&reply.into_inner().body).map_err(|e| rpc(e.to_string()))?;
        let limit = wire::max_message(info.block_size as usize);
        let stub = stub.max_decoding_message_size(limit).max_encoding_message_size(limit);
        Ok(Self { url, name: name.to_owned(), stub, info })
    }

    /// The node's address.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The node's name, as its certificate proved it (`node-<i>.blindfold`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the node said about itself when connected.
    pub fn info(&self) -> NodeInfo {
        self.info
    }

    fn status_error(&self, s: tonic::Status) -> ProxyError {
        if s.code() == tonic::Code::DataLoss {
            let cell = s
                .metadata()
                .get(CELL_KEY)
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(u64::MAX);
            tracing::error!(node = %self.url, cell, "the node's engine found a damaged cell");
            return ProxyError::Integrity {
                cell,
                source: CryptoError::Integrity { cell, segment: 0 },
            };
        }
        ProxyError::Store(StoreError::Remote {
            message: format!("node {}: {} ({:?})", self.url, s.message(), s.code()),
            retryable: matches!(s.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded),
        })
    }

    fn wire_error(&self, e: NodeError) -> ProxyError {
        ProxyError::Store(StoreError::Remote {
            message: format!("node {}: {e}", self.url),
            retryable: false,
        })
    }

    /// One Access request: the blocks read, in order, and the node's instance.
    pub async fn access(&self, req: &Access) -> Result<(u64, Vec<Vec<u8>>), ProxyError> {
        let bs = self.info.block_size as usize;
        let reply = self
            .stub
            .clone()
            .access(Frame::new(req.encode(bs)))
            .await
            .map_err(|s| self.status_error(s))?;
        wire::decode_blocks(&reply.into_inner().body, req.reads.len(), bs)
            .map_err(|e| self.wire_error(e))
    }

    /// Commits the node's engine; returns its instance.
    pub async fn commit(&self) -> Result<u64, ProxyError> {
        let reply =
            self.stub.clone().commit(Frame::default()).await.map_err(|s| self.status_error(s))?;
        wire::decode_instance(&reply.into_inner().body).map_err(|e| self.wire_error(e))
    }

    /// Authenticates every cell of the node's store.
    pub async fn verify(&self) -> Result<VerifyReport, ProxyError> {
        let mut stub = self.stub.clone();
        let mut req = tonic::Request::new(Frame::default());
        // A whole store takes longer than one access.
        req.set_timeout(Duration::from_secs(24 * 3600));
        let reply = stub.verify(req).await.map_err(|s| self.status_error(s))?;
        wire::decode_verify(&reply.into_inner().body).map_err(|e| self.wire_error(e))
    }

    /// Asks the node to hold at least `blocks` local ids, growing its engine if it holds fewer
    /// (a node that holds enough answers at once); returns what it holds then. A growth
    /// rebuilds the node's tree, which takes about the time to read and write its store.
    pub async fn grow(&self, blocks: u64) -> Result<NodeInfo, ProxyError> {
        let mut req = tonic::Request::new(Frame::new(wire::encode_grow(blocks)));
        req.set_timeout(Duration::from_secs(24 * 3600));
        let reply = self.stub.clone().grow(req).await.map_err(|s| self.status_error(s))?;
        let info = NodeInfo::decode(&reply.into_inner().body).map_err(|e| self.wire_error(e))?;
        if info.id != self.info.id || info.block_size != self.info.block_size {
            return Err(self
                .wire_error(NodeError::Wire("the node answered a growth as another node".into())));
        }
        Ok(info)
    }

    /// Sends raw bytes as an Access request (tests of the node's refusals).
    #[doc(hidden)]
    pub async fn raw_access(&self, body: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
        Ok(self.stub.clone().access(Frame::new(body)).await?.into_inner().body)
    }
}
