use blindfold_proxy::ProxyError;

/// Errors of the node service, the node client and the cluster's certificates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// A peer sent bytes that are not a well-formed message of the node protocol.
    #[error("bad node protocol message: {0}")]
    Wire(String),
    /// Certificates or keys that cannot be used, or a failed TLS setup.
    #[error("{0}")]
    Tls(String),
    /// A configuration that cannot work (node sizes, a different set of nodes, …).
    #[error("{0}")]
    Config(String),
    /// Reaching a node failed, or the node answered with an error.
    #[error("node {node}: {message}")]
    Rpc {
        /// The node's address.
        node: String,
        /// What went wrong.
        message: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The engine (of a node or the balancer's own state) failed.
    #[error(transparent)]
    Engine(#[from] ProxyError),
}

impl From<NodeError> for ProxyError {
    fn from(e: NodeError) -> Self {
        match e {
            NodeError::Engine(e) => e,
            other => ProxyError::State(other.to_string()),
        }
    }
}
