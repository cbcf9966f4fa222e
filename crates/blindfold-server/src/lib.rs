//! The untrusted storage server of blindfold (`blindfold storage-server`).
//!
//! It serves the named cell arrays of one backing store (`memory:` or `file:///dir`) over TCP
//! with the protocol of [`blindfold_store::remote::protocol`], and offers the server-side
//! computations of the store layer: today [`XorStore::read_xor`], tomorrow Onion ORAM's
//! homomorphic select and the TEE design's trusted component, each one more operation code
//! dispatched to one more capability trait. A gateway reaches it with `remote://host:port`.
//!
//! Each connection is served by a reader task, a writer task and one task per request (at
//! most [`MAX_IN_FLIGHT`] at once per connection), so a client may pipeline many requests;
//! answers carry the request id and may come back in any order.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use blindfold_store::StoreUrl;
//! let server = blindfold_server::Server::bind("127.0.0.1:0", StoreUrl::Memory).await?;
//! println!("serving on {}", server.local_addr());
//! server.run().await
//! # }
//! ```
//!
//! # Security
//!
//! The server is the adversary of the threat model: it is trusted with nothing and sees only
//! sealed cells, the requests (kind, addresses, sizes, timing) and the array names. It runs
//! without authentication; bind it to an address only the gateway can reach.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use blindfold_store::remote::protocol::{self, op, Decoder, Encoder};
use blindfold_store::{open_xor_store, Geometry, StoreError, StoreUrl, XorStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex, RwLock, Semaphore};

/// Requests served at once on one connection; further ones wait to be read.
pub const MAX_IN_FLIGHT: usize = 64;

/// The arrays this server holds, by name (shared by all connections).
#[derive(Debug)]
struct Arrays {
    url: StoreUrl,
    open: Mutex<HashMap<String, Arc<dyn XorStore>>>,
}

impl Arrays {
    async fn open(&self, name: &str, geometry: Geometry) -> Result<Arc<dyn XorStore>, StoreError> {
        let mut open = self.open.lock().await;
        if let Some(store) = open.get(name) {
            let found = store.geometry();
            if found != geometry {
                return Err(StoreError::GeometryMismatch {
                    path: name.into(),
                    found_cells: found.cell_count(),
                    found_size: found.cell_size(),
                    wanted_cells: geometry.cell_count(),
                    wanted_size: geometry.cell_size(),
                });
            }
            return Ok(Arc::clone(store));
        }
        let store = open_xor_store(&self.url, name, geometry).await?;
        open.insert(name.to_string(), Arc::clone(&store));
        tracing::info!(name, ?geometry, "opened array");
        Ok(store)
    }
}

/// A bound storage server; [`Server::run`] serves until the task is dropped or aborted.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    arrays: Arc<Arrays>,
}

impl Server {
    /// Binds `addr` (e.g. `127.0.0.1:7420`; port 0 picks a free one) to serve arrays of `url`.
    pub async fn bind(addr: &str, url: StoreUrl) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Ok(Self { listener, arrays: Arc::new(Arrays { url, open: Mutex::default() }) })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// Serves connections until an accept fails for good. Dropping (or aborting) the future
    /// closes every connection it accepted.
    pub async fn run(self) -> std::io::Result<()> {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
                Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            };
            let (stream, peer) = match accepted {
                Ok(c) => c,
                Err(e) if is_transient(&e) => {
                    tracing::warn!(error = %e, "accept failed; continuing");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let arrays = Arc::clone(&self.arrays);
            conns.spawn(async move {
                if let Err(e) = serve_connection(stream, arrays).await {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
            });
        }
    }

    /// Serves in a background task; returns its address and a handle that stops it when
    /// aborted (tests, in-process use).
    pub fn spawn(self) -> (SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>) {
        let addr = self.local_addr();
        (addr, tokio::spawn(self.run()))
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock)
        || e.raw_os_error().is_some_and(|c| c == 24 || c == 23) // EMFILE, ENFILE
}

async fn serve_connection(mut stream: TcpStream, arrays: Arc<Arrays>) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let mut hello = [0u8; protocol::HELLO_LEN];
    stream.read_exact(&mut hello).await?;
    stream.write_all(&protocol::hello()).await?;
    match protocol::parse_hello(&hello) {
        Ok(v) if v == protocol::VERSION => {}
        Ok(v) => {
            tracing::info!(version = v, "client speaks another protocol version; closing");
            return Ok(());
        }
        Err(e) => {
            tracing::info!(error = %e, "not a blindfold client; closing");
            return Ok(());
        }
    }
    let (mut rd, wr) = stream.into_split();
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(async move {
        let mut wr = BufWriter::new(wr);
        while let Some(frame) = rx.recv().await {
            wr.write_all(&frame).await?;
            while let Ok(more) = rx.try_recv() {
                wr.write_all(&more).await?;
            }
            wr.flush().await?;
        }
        wr.shutdown().await
    });
    let handles: Arc<RwLock<Vec<Arc<dyn XorStore>>>> = Arc::default();
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let result = loop {
        let mut len = [0u8; 4];
        match rd.read_exact(&mut len).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(e) => break Err(e),
        }
        let len = u32::from_le_bytes(len) as usize;
        if !(9..=protocol::MAX_FRAME).contains(&len) {
            break Err(std::io::Error::other(format!("a request frame of {len} bytes")));
        }
        let mut frame = vec![0u8; len];
        if let Err(e) = rd.read_exact(&mut frame).await {
            break Err(e);
        }
        let permit = Arc::clone(&slots).acquire_owned().await.expect("never closed");
        let (tx, arrays, handles) = (tx.clone(), Arc::clone(&arrays), Arc::clone(&handles));
        tokio::spawn(async move {
            let id = u64::from_le_bytes(frame[..8].try_into().unwrap());
            let op = frame[8];
            let answer = handle(op, &frame[9..], &arrays, &handles).await;
            let mut out = Encoder::frame();
            out.u64(id);
            match answer {
                Ok(body) => {
                    out.u8(0).bytes(&body);
                }
                Err(e) => {
                    out.u8(1);
                    protocol::put_error(&mut out, &e);
                }
            }
            let frame = match out.finish() {
                Ok(f) => f,
                Err(e) => {
                    let mut out = Encoder::frame();
                    out.u64(id).u8(1);
                    protocol::put_error(&mut out, &e);
                    out.finish().expect("an error frame is small")
                }
            };
            let _ = tx.send(frame).await;
            drop(permit);
        });
    };
    drop(tx);
    let _ = writer.await;
    result
}

fn bad(e: String) -> StoreError {
    StoreError::InvalidRequest(e)
}

async fn handle(
    op: u8,
    body: &[u8],
    arrays: &Arrays,
    handles: &RwLock<Vec<Arc<dyn XorStore>>>,
) -> Result<Vec<u8>, StoreError> {
    let mut d = Decoder::new(body);
    if op == op::OPEN {
        let cells = d.u64().map_err(bad)?;
        let size = d.u32().map_err(bad)?;
        let n = d.u16().map_err(bad)? as usize;
        let name = std::str::from_utf8(d.take(n).map_err(bad)?)
            .map_err(|_| bad("array name is not UTF-8".into()))?
            .to_string();
        d.end().map_err(bad)?;
        let store = arrays.open(&name, Geometry::new(cells, size)?).await?;
        let mut hs = handles.write().await;
        hs.push(store);
        let mut e = Encoder::default();
        e.u32((hs.len() - 1) as u32);
        return Ok(e.0);
    }
    let h = d.u32().map_err(bad)? as usize;
    let store = handles
        .read()
        .await
        .get(h)
        .cloned()
        .ok_or_else(|| bad(format!("no array with handle {h} on this connection")))?;
    match op {
        op::READ => {
            let cells = d.cells().map_err(bad)?;
            d.end().map_err(bad)?;
            Ok(store.read(&cells).await?.concat())
        }
        op::READ_RANGES => {
            let ranges = d.ranges().map_err(bad)?;
            d.end().map_err(bad)?;
            Ok(store.read_ranges(&ranges).await?.concat())
        }
        op::READ_XOR => {
            let ranges = d.ranges().map_err(bad)?;
            d.end().map_err(bad)?;
            store.read_xor(&ranges).await
        }
        op::WRITE => {
            let n = d.count(12).map_err(bad)?;
            let mut heads = Vec::with_capacity(n);
            for _ in 0..n {
                heads.push((d.u64().map_err(bad)?, d.u32().map_err(bad)? as usize));
            }
            let mut cells = Vec::with_capacity(n);
            for (c, len) in heads {
                cells.push((blindfold_store::CellId(c), d.take(len).map_err(bad)?.to_vec()));
            }
            d.end().map_err(bad)?;
            store.write(cells).await?;
            Ok(Vec::new())
        }
        op::FLUSH => {
            d.end().map_err(bad)?;
            store.flush().await?;
            Ok(Vec::new())
        }
        other => Err(StoreError::Unsupported(format!("operation {other} of the storage protocol"))),
    }
}
