//! The untrusted storage server of blindfold (`blindfold storage-server`).
//!
//! It serves the named cell arrays of one backing store (`memory:` or `file:///dir`) over TCP
//! with the protocol of [`blindfold_store::remote::protocol`], and offers the server-side
//! computations of the store layer:
//! [`XorStore::read_xor`](blindfold_store::XorStore::read_xor) and, with the feature `select`
//! (which links GMP), Onion ORAM's homomorphic select (`SelectStore`: `read_select`,
//! `read_select_combined`, `write_select`); each is an operation code dispatched to a
//! capability trait. A build without `select` answers the select operations with
//! [`StoreError::Unsupported`]. A gateway reaches it with `remote://host:port?key_file=/path`.
//!
//! It also keeps the lease records of the store's *one writer* lease (ops 12 and 13; see
//! [`blindfold_store::lease`]): a load, and a compare-and-swap that it runs on its own side,
//! over memory for `memory:` and over `<name>.lease` files (under `flock`) for `file:`, so a
//! gateway's [`LeaseStore`](blindfold_store::LeaseStore) over `remote://` has the same atomic
//! step as over the backing store itself.
//!
//! The TEE design's trusted component (seed 004) is one more capability: a server configured
//! with one ([`ServerConfig::with_trusted`]) wraps each array in a [`TeeHost`] and serves
//! [`TeeStore::tee_query`] and [`TeeStore::tee_evict`]; without one it answers them with
//! [`StoreError::Unsupported`]. Its host (this process) reads the cells a request names, calls
//! the trusted component and writes back what it returns, overlapping the I/O with the trusted
//! work.
//!
//! Each connection starts with the protocol's handshake, in which the client proves it holds
//! the server's pre-shared [`AuthKey`] (and the server proves it back); a peer without it gets
//! a refusal and nothing else. Then a reader task decodes requests, a writer task sends
//! answers, and one task per request (at most [`MAX_IN_FLIGHT`] at once per connection) runs
//! it, so a client may pipeline many requests; answers carry the request id and may come back
//! in any order.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use blindfold_server::{Auth, Server, ServerConfig};
//! use blindfold_store::{remote::AuthKey, StoreUrl};
//! let key = AuthKey::load("storage.key".as_ref()).unwrap();
//! let config = ServerConfig::new(Auth::Key(key));
//! let server = Server::bind("127.0.0.1:0", StoreUrl::Memory, config).await?;
//! println!("serving on {}", server.local_addr());
//! server.run().await
//! # }
//! ```
//!
//! # Limits
//!
//! Everything a peer sends is hostile input. Before the handshake the server reads only the
//! fixed-size hello and response, within [`Limits::handshake_timeout`]. After it, every length
//! is checked before anything is allocated: a frame against [`Limits::max_frame`] (a larger
//! one is skipped without being buffered and answered with an error), counts against the
//! frame, the answer a read will need against `max_frame` as well, the bytes a connection
//! holds in requests and answers against [`Limits::connection_buffer`] (further requests wait
//! to be read; for a select, also the data it reads and the numbers it computes with, roughly;
//! for a TEE request, the candidates it reads or three layer buffers and the incoming blocks),
//! lease names against [`Limits::max_leases`], an array's shape against
//! [`Limits::max_array_bytes`], the arrays of a `memory:` store together against
//! [`Limits::max_memory_bytes`], the number of arrays against [`Limits::max_arrays`] and of
//! connections against [`Limits::max_connections`] (more are closed at once). So the server's
//! memory stays below roughly `max_memory_bytes + max_connections × connection_buffer`.
//!
//! # Security
//!
//! The server is the adversary of the threat model: without a trusted component it is trusted
//! with nothing and sees only sealed cells, the requests (kind, addresses, sizes, timing) and
//! the array names. For the TEE design that includes the cells each query and each layer of an
//! eviction round reads and writes, and the tickets' and blocks' sizes, but not which candidate
//! a query selects or how a round permutes the blocks: those travel in tickets sealed for the
//! trusted component.
//! That holds only if the trusted component runs in a real enclave. This build has none: the
//! trusted component runs in the server's own process with the key it was started with, so
//! whoever runs the server (or reads its memory) is trusted with the key and can learn both.
//!
//! The pre-shared key decides who may use the server; it does not protect the frames after the
//! handshake (they need no secrecy, and tampering with them is caught by the seals, as
//! tampering by the server is).

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use blindfold_store::remote::protocol::{self, Encoder, Request};
use blindfold_store::remote::AuthKey;
use blindfold_store::{
    ByteRange, Geometry, LeaseRecords, StoreError, StoreUrl, TeeHost, TeeStore, Trusted,
};
use tokio::io::{sink, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex, OwnedSemaphorePermit, Semaphore};

/// Requests served at once on one connection; further ones wait to be read.
pub const MAX_IN_FLIGHT: usize = 64;

/// The store behind each array: every computation this build serves.
#[cfg(feature = "select")]
type Backing = dyn blindfold_store::ComputeStore;
#[cfg(not(feature = "select"))]
type Backing = dyn blindfold_store::XorStore;

async fn open_backing(
    url: &StoreUrl,
    name: &str,
    geometry: Geometry,
) -> Result<Arc<Backing>, StoreError> {
    #[cfg(feature = "select")]
    return blindfold_store::open_compute_store(url, name, geometry).await;
    #[cfg(not(feature = "select"))]
    return blindfold_store::open_xor_store(url, name, geometry).await;
}

const MIB: usize = 1 << 20;

/// How much a peer may make the server hold. [`Default`] suits a gateway on a machine with a
/// few GiB to spare; each field is a flag of `blindfold storage-server`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest frame accepted (and largest answer sent): 64 MiB (`--max-frame-mib`). Clients
    /// learn it in the handshake and refuse larger batches themselves.
    pub max_frame: usize,
    /// Largest array (cells × cell size): 1 TiB (`--max-array-gib`).
    pub max_array_bytes: u64,
    /// Most bytes all arrays of a `memory:` store may hold together: 4 GiB
    /// (`--max-memory-mib`). Counted by shape when an array is opened, since an array takes
    /// its whole shape once written.
    pub max_memory_bytes: u64,
    /// Most arrays the server holds: 1024 (`--max-arrays`).
    pub max_arrays: usize,
    /// Most lease names the server creates records for (ops 12 and 13) while it runs: 1024.
    /// Each record is at most `MAX_LEASE_RECORD` bytes.
    pub max_leases: usize,
    /// Most connections at once, handshaking ones included: 256 (`--max-connections`).
    pub max_connections: usize,
    /// Most bytes one connection holds in requests and answers at once: 256 MiB
    /// (`--connection-buffer-mib`); at least twice `max_frame`.
    pub connection_buffer: usize,
    /// Time a peer has to complete the handshake: 10 s.
    pub handshake_timeout: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_frame: 64 * MIB,
            max_array_bytes: 1 << 40,
            max_memory_bytes: 4 << 30,
            max_arrays: 1024,
            max_leases: 1024,
            max_connections: 256,
            connection_buffer: 256 * MIB,
            handshake_timeout: std::time::Duration::from_secs(10),
        }
    }
}

impl Limits {
    /// Checks that the limits can be used together.
    pub fn validate(&self) -> Result<(), String> {
        if !(4096..=protocol::MAX_FRAME).contains(&self.max_frame) {
            return Err(format!(
                "the largest frame must be between 4 KiB and {} MiB",
                protocol::MAX_FRAME / MIB
            ));
        }
        if self.connection_buffer > 1 << 40 {
            return Err("a connection's buffer of more than 1 TiB".into());
        }
        if self.connection_buffer / 2 < self.max_frame {
            return Err("a connection's buffer must hold at least two largest frames (a \
                        request and its answer)"
                .into());
        }
        if self.max_arrays == 0 || self.max_connections == 0 || self.max_array_bytes == 0 {
            return Err("the limits on arrays, connections and array size must be positive".into());
        }
        if self.handshake_timeout.is_zero() {
            return Err("the handshake timeout must be positive".into());
        }
        Ok(())
    }
}

/// Who may use the server.
#[derive(Clone, Debug)]
pub enum Auth {
    /// Peers that prove they hold this pre-shared key (the default of the binary).
    Key(AuthKey),
    /// Anyone who can reach the address (`--insecure-no-auth`): for experiments on loopback
    /// only. Clients that hold a key refuse such a server.
    InsecureNone,
}

/// Authentication, limits and trusted component of a server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Who may use it.
    pub auth: Auth,
    /// How much a peer may make it hold.
    pub limits: Limits,
    /// The TEE design's trusted component, if the server runs one: then it serves the TEE
    /// operations over every array.
    pub trusted: Option<Arc<dyn Trusted>>,
}

impl ServerConfig {
    /// `auth` with the default [`Limits`] and no trusted component.
    pub fn new(auth: Auth) -> Self {
        Self { auth, limits: Limits::default(), trusted: None }
    }

    /// The same configuration, serving the TEE operations with `trusted`.
    pub fn with_trusted(self, trusted: Arc<dyn Trusted>) -> Self {
        Self { trusted: Some(trusted), ..self }
    }
}

/// Why a server without a trusted component refuses the TEE operations.
const NO_TRUSTED: &str = "the TEE operations: this storage server runs no trusted component; \
                          start it with --enclave-key";

/// The arrays this server holds, by name (shared by all connections).
#[derive(Debug)]
struct Arrays {
    url: StoreUrl,
    open: Mutex<HashMap<String, Arc<Backing>>>,
    /// Bytes of `memory:` arrays opened so far (by shape).
    memory: Mutex<u64>,
}

impl Arrays {
    async fn open(
        &self,
        name: &str,
        cells: u64,
        size: u32,
        limits: &Limits,
    ) -> Result<Arc<Backing>, StoreError> {
        let geometry = Geometry::new(cells, size)?;
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
        let bytes = geometry.total_bytes();
        if bytes > limits.max_array_bytes {
            return Err(StoreError::InvalidGeometry(format!(
                "{cells} cells of {size} bytes: larger than this server's limit of {} bytes per \
                 array (--max-array-gib)",
                limits.max_array_bytes
            )));
        }
        if open.len() >= limits.max_arrays {
            return Err(StoreError::InvalidRequest(format!(
                "this server holds {} arrays already, its limit (--max-arrays)",
                open.len()
            )));
        }
        let mut memory = self.memory.lock().await;
        let in_memory = matches!(self.url, StoreUrl::Memory);
        if in_memory && memory.saturating_add(bytes) > limits.max_memory_bytes {
            return Err(StoreError::InvalidGeometry(format!(
                "{cells} cells of {size} bytes do not fit in this server's memory limit of {} \
                 bytes ({} taken; --max-memory-mib)",
                limits.max_memory_bytes, *memory
            )));
        }
        let store = open_backing(&self.url, name, geometry).await?;
        if in_memory {
            *memory += bytes;
        }
        open.insert(name.to_string(), Arc::clone(&store));
        tracing::info!(name, ?geometry, "opened array");
        Ok(store)
    }
}

#[derive(Debug)]
struct Shared {
    arrays: Arrays,
    /// The lease records (ops 12 and 13), kept beside the arrays: in memory for `memory:`, as
    /// `<name>.lease` files in the directory for `file:`.
    leases: Arc<dyn LeaseRecords>,
    /// The lease names swapped so far, at most [`Limits::max_leases`]: a peer cannot make the
    /// server keep records without bound.
    lease_names: std::sync::Mutex<HashSet<String>>,
    auth: Auth,
    limits: Limits,
    trusted: Option<Arc<dyn Trusted>>,
}

/// A bound storage server; [`Server::run`] serves until the task is dropped or aborted.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    shared: Arc<Shared>,
}

impl Server {
    /// Binds `addr` (e.g. `127.0.0.1:7420`; port 0 picks a free one) to serve arrays of `url`
    /// to the peers `config` admits. Fails with [`std::io::ErrorKind::InvalidInput`] if the
    /// limits cannot be used together.
    pub async fn bind(addr: &str, url: StoreUrl, config: ServerConfig) -> std::io::Result<Self> {
        config
            .limits
            .validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let listener = TcpListener::bind(addr).await?;
        let leases = blindfold_store::open_lease_records(&url)
            .await
            .map_err(|e| std::io::Error::other(format!("opening the lease records: {e}")))?;
        let arrays = Arrays { url, open: Mutex::default(), memory: Mutex::default() };
        let shared = Arc::new(Shared {
            arrays,
            leases,
            lease_names: std::sync::Mutex::default(),
            auth: config.auth,
            limits: config.limits,
            trusted: config.trusted,
        });
        Ok(Self { listener, shared })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("a bound listener has an address")
    }

    /// Serves connections until an accept fails for good. Dropping (or aborting) the future
    /// closes every connection it accepted.
    pub async fn run(self) -> std::io::Result<()> {
        let mut conns = tokio::task::JoinSet::new();
        let room = Arc::new(Semaphore::new(self.shared.limits.max_connections));
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
            let Ok(permit) = Arc::clone(&room).try_acquire_owned() else {
                tracing::warn!(%peer, "too many connections (--max-connections); closing");
                continue;
            };
            let shared = Arc::clone(&self.shared);
            conns.spawn(async move {
                if let Err(e) = serve_connection(stream, peer, shared).await {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
                drop(permit);
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

/// Hello and authentication: whether the peer may send requests.
async fn handshake(stream: &mut TcpStream, peer: SocketAddr, shared: &Shared) -> io::Result<bool> {
    let mut hello = [0u8; protocol::HELLO_LEN];
    stream.read_exact(&mut hello).await?;
    stream.write_all(&protocol::hello()).await?;
    match protocol::parse_hello(&hello) {
        Ok(v) if v == protocol::VERSION => {}
        Ok(v) => {
            tracing::info!(%peer, version = v, "client speaks another protocol version; closing");
            return Ok(false);
        }
        Err(e) => {
            tracing::info!(%peer, error = %e, "not a blindfold client; closing");
            return Ok(false);
        }
    }
    let (mode, server_nonce) = match &shared.auth {
        Auth::Key(_) => {
            (protocol::AUTH_KEY, blindfold_store::remote::nonce().map_err(io::Error::other)?)
        }
        Auth::InsecureNone => (protocol::AUTH_NONE, [0u8; protocol::NONCE_LEN]),
    };
    stream.write_all(&protocol::challenge(mode, &server_nonce)).await?;
    let mut response = [0u8; protocol::RESPONSE_LEN];
    stream.read_exact(&mut response).await?;
    let client_nonce: [u8; protocol::NONCE_LEN] =
        response[..protocol::NONCE_LEN].try_into().unwrap();
    let proof: [u8; protocol::PROOF_LEN] = response[protocol::NONCE_LEN..].try_into().unwrap();
    let max_frame = shared.limits.max_frame as u32;
    let verdict = match &shared.auth {
        Auth::Key(key) => {
            if !key.verify_client(&server_nonce, &client_nonce, &proof) {
                tracing::info!(%peer, "refused a peer without the key");
                stream
                    .write_all(&protocol::refuse(
                        "refused: this client does not hold the storage server's key (the \
                         remote:// URL's key_file must be the server's --auth-key-file)",
                    ))
                    .await?;
                let _ = stream.shutdown().await;
                return Ok(false);
            }
            protocol::accept(&key.server_proof(&server_nonce, &client_nonce), max_frame)
        }
        Auth::InsecureNone => protocol::accept(&[0u8; protocol::PROOF_LEN], max_frame),
    };
    stream.write_all(&verdict).await?;
    Ok(true)
}

/// An answer on its way to the writer, with the share of the connection's buffer it holds.
type Outgoing = (Vec<u8>, Option<OwnedSemaphorePermit>);

async fn serve_connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
) -> io::Result<()> {
    let _ = stream.set_nodelay(true);
    let limits = &shared.limits;
    match tokio::time::timeout(limits.handshake_timeout, handshake(&mut stream, peer, &shared))
        .await
    {
        Ok(Ok(true)) => {}
        Ok(Ok(false)) => return Ok(()),
        Ok(Err(e)) => return Err(e),
        Err(_) => {
            tracing::info!(%peer, "no handshake in time; closing");
            return Ok(());
        }
    }
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::new(rd);
    let (tx, mut rx) = mpsc::channel::<Outgoing>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(async move {
        let mut wr = BufWriter::new(wr);
        while let Some((frame, permit)) = rx.recv().await {
            wr.write_all(&frame).await?;
            drop((frame, permit));
            while let Ok((more, permit)) = rx.try_recv() {
                wr.write_all(&more).await?;
                drop((more, permit));
            }
            wr.flush().await?;
        }
        wr.shutdown().await
    });
    let budget = Arc::new(Semaphore::new(limits.connection_buffer));
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut handles: Vec<Arc<Backing>> = Vec::new();
    let mut by_name: HashMap<String, u32> = HashMap::new();
    let result = loop {
        let len = match rd.read_u32_le().await {
            Ok(len) => len as usize,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Ok(()),
            Err(e) => break Err(e),
        };
        if len < protocol::FRAME_HEAD {
            break Err(io::Error::other(format!("a request frame of {len} bytes")));
        }
        let (id, op) = match (rd.read_u64_le().await, rd.read_u8().await) {
            (Ok(id), Ok(op)) => (id, op),
            (Err(e), _) | (_, Err(e)) => break Err(e),
        };
        let body_len = len - protocol::FRAME_HEAD;
        let reply = |answer| (protocol::reply_frame(id, answer), None);
        if len > limits.max_frame {
            // Answered at once, then skipped without being buffered, so the connection stays
            // usable.
            let err = StoreError::InvalidRequest(format!(
                "a request of {len} bytes is larger than this server's {}-byte frames \
                 (--max-frame-mib); split the batch",
                limits.max_frame
            ));
            if tx.send(reply(Err(err))).await.is_err() {
                break Ok(());
            }
            let skipped = tokio::io::copy(&mut (&mut rd).take(body_len as u64), &mut sink()).await;
            if let Err(e) = skipped {
                break Err(e);
            }
            continue;
        }
        // `len` ≤ max_frame ≤ 1 GiB, and half the buffer at most: this always returns.
        let mut held = Arc::clone(&budget).acquire_many_owned(len as u32).await.expect("open");
        let mut body = vec![0u8; body_len];
        if let Err(e) = rd.read_exact(&mut body).await {
            break Err(e);
        }
        let request = decode(op, body).await;
        let request = match request {
            Ok(r) => r,
            Err(e) => {
                if tx.send(reply(Err(e))).await.is_err() {
                    break Ok(());
                }
                continue;
            }
        };
        if let Request::Open { cell_count, cell_size, name } = &request {
            // Opened again on the server (which checks the shape), but one handle per name on
            // a connection, so reopening cannot grow the handle table.
            let answer = match shared.arrays.open(name, *cell_count, *cell_size, limits).await {
                Ok(store) => Ok(*by_name.entry(name.clone()).or_insert_with(|| {
                    handles.push(store);
                    (handles.len() - 1) as u32
                })),
                Err(e) => Err(e),
            };
            let answer = answer.map(|h| {
                let mut e = Encoder::default();
                e.u32(h);
                e.0
            });
            if tx.send(reply(answer)).await.is_err() {
                break Ok(());
            }
            continue;
        }
        if matches!(request, Request::LeaseLoad { .. } | Request::LeaseSwap { .. }) {
            // Small and bounded by the decoder (a name and two records); run as its own task,
            // since a file swap waits for a lock and an fsync.
            let slot = Arc::clone(&slots).acquire_owned().await.expect("never closed");
            let (tx, shared) = (tx.clone(), Arc::clone(&shared));
            tokio::spawn(async move {
                let answer = run_lease(request, &shared).await;
                let _ = tx.send((protocol::reply_frame(id, answer), Some(held))).await;
                drop(slot);
            });
            continue;
        }
        let store = match request.handle().and_then(|h| handles.get(h as usize)) {
            Some(s) => Arc::clone(s),
            None => {
                let err = StoreError::InvalidRequest(format!(
                    "no array with handle {:?} on this connection",
                    request.handle()
                ));
                if tx.send(reply(Err(err))).await.is_err() {
                    break Ok(());
                }
                continue;
            }
        };
        // The memory the answer will take, checked and reserved before the request runs.
        let needed = match answer_bytes(&request, store.geometry(), shared.trusted.is_some()) {
            Ok(Some(n)) if n <= limits.max_frame - protocol::FRAME_HEAD => n,
            other => {
                let err = other.err().unwrap_or_else(|| {
                    StoreError::InvalidRequest(format!(
                        "the answer would be larger than this server's {}-byte frames \
                         (--max-frame-mib; for XOR, select and TEE requests, with the data it \
                         is computed from); split the batch",
                        limits.max_frame
                    ))
                });
                if tx.send(reply(Err(err))).await.is_err() {
                    break Ok(());
                }
                continue;
            }
        };
        if needed > 0 {
            let more = Arc::clone(&budget).acquire_many_owned(needed as u32).await.expect("open");
            held.merge(more);
        }
        let slot = Arc::clone(&slots).acquire_owned().await.expect("never closed");
        let tx = tx.clone();
        let trusted = shared.trusted.clone();
        tokio::spawn(async move {
            let answer = run(request, store, trusted).await;
            let _ = tx.send((protocol::reply_frame(id, answer), Some(held))).await;
            drop(slot);
        });
    };
    drop(tx);
    let _ = writer.await;
    result
}

/// Decodes a request body. Select requests carry a public key, whose checks (a primality test)
/// and powers cost milliseconds for large keys: they are decoded off the async executor, so the
/// connection's reader never stalls the server's other connections.
async fn decode(op: u8, body: Vec<u8>) -> Result<Request, StoreError> {
    use protocol::op;
    if ![op::READ_SELECT, op::READ_SELECT_COMBINED, op::WRITE_SELECT].contains(&op) {
        return Request::decode(op, &body);
    }
    match tokio::task::spawn_blocking(move || Request::decode(op, &body)).await {
        Ok(decoded) => decoded,
        Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
        Err(join) => Err(StoreError::InvalidRequest(format!("decoding cancelled: {join}"))),
    }
}

/// Bytes a request's answer (and, for XOR, select and TEE requests, the data it is computed
/// from) will take; `Ok(None)` if more than a `usize` holds, an error for a request this server
/// does not serve (or, for a select or a TEE request, one that fails its checks).
fn answer_bytes(
    request: &Request,
    geometry: Geometry,
    trusted: bool,
) -> Result<Option<usize>, StoreError> {
    let ranges_total = |ranges: &[ByteRange]| {
        ranges.iter().try_fold(0usize, |acc, r| acc.checked_add(r.len as usize))
    };
    Ok(match request {
        Request::Read { cells, .. } => cells.len().checked_mul(geometry.cell_size() as usize),
        Request::ReadRanges { ranges, .. } => ranges_total(ranges),
        // Backends XOR by reading every range first.
        Request::ReadXor { ranges, .. } => ranges_total(ranges)
            .and_then(|t| t.checked_add(ranges.first().map_or(0, |r| r.len as usize))),
        Request::Open { .. } | Request::Write { .. } | Request::Flush { .. } => Some(0),
        Request::TeeQuery { .. } | Request::TeeEvict { .. } if !trusted => {
            return Err(StoreError::Unsupported(NO_TRUSTED.into()))
        }
        // The incoming blocks were counted with the frame; the host copies them once more.
        Request::TeeQuery { cells, ticket, .. } => {
            blindfold_store::check_tee_query(&geometry, cells, ticket)?;
            Some(blindfold_store::tee_query_bytes(&geometry, cells))
        }
        Request::TeeEvict { round, .. } => {
            blindfold_store::check_tee_round(&geometry, round)?;
            Some(blindfold_store::tee_round_bytes(&geometry, round))
        }
        #[cfg(feature = "select")]
        Request::ReadSelect { .. }
        | Request::ReadSelectCombined { .. }
        | Request::WriteSelect { .. } => select_bytes(request, geometry)?,
        _ => {
            return Err(StoreError::Unsupported(format!(
                "operation {} on this storage server (built without the `select` feature)",
                request.op()
            )))
        }
    })
}

/// The numbers of a select's public key: `n^0 ..= n^33`, about 561 times the bytes of `n`.
#[cfg(feature = "select")]
fn key_bytes(request: &blindfold_store::SelectRequest) -> usize {
    (request.public_key.n_bits() as usize).div_ceil(8) * 561
}

/// Working memory of one select, roughly: its ranges as read, the same again as numbers (and
/// their per-chunk columns), and its answer.
#[cfg(feature = "select")]
fn one_select(request: &blindfold_store::SelectRequest, answer: usize) -> Option<usize> {
    let read = request.ranges.iter().try_fold(0usize, |acc, r| acc.checked_add(r.len as usize))?;
    read.checked_mul(3)?.checked_add(answer)
}

/// What a select request will hold while it runs; checks it against the array first, so a bad
/// one is refused before anything is reserved.
#[cfg(feature = "select")]
fn select_bytes(request: &Request, geometry: Geometry) -> Result<Option<usize>, StoreError> {
    use blindfold_store::{check_select_writes, combined_answer_len, select_answer_len};
    Ok(match request {
        Request::ReadSelect { request, .. } => {
            let answer = select_answer_len(&geometry, request)?;
            one_select(request, answer).and_then(|n| n.checked_add(key_bytes(request)))
        }
        Request::ReadSelectCombined { request, .. } => {
            let answer = combined_answer_len(&geometry, request)?;
            // Every group is read and answered before the outer select runs over the answers,
            // each padded to about the outer answer's length.
            let mut total = Some(key_bytes(&request.groups[0]));
            for g in &request.groups {
                let inner = select_answer_len(&geometry, g)?;
                total = total
                    .and_then(|t| t.checked_add(one_select(g, inner)?))
                    .and_then(|t| t.checked_add(answer));
            }
            total.and_then(|t| t.checked_add(answer))
        }
        Request::WriteSelect { writes, .. } => {
            check_select_writes(&geometry, writes)?;
            // One select at a time, its answer a cell; nothing comes back.
            let cell = geometry.cell_size() as usize;
            let mut most = Some(0usize);
            for w in writes {
                most = most.zip(one_select(&w.request, cell)).map(|(a, b)| a.max(b));
            }
            match writes.first() {
                None => Some(0),
                Some(w) => most.and_then(|m| m.checked_add(key_bytes(&w.request))),
            }
        }
        _ => Some(0),
    })
}

/// Runs a lease operation on the server's own records: the compare-and-swap happens here, in
/// one step of the records' backend.
/// A swap first reserves its name among at most [`Limits::max_leases`].
async fn run_lease(request: Request, shared: &Shared) -> Result<Vec<u8>, StoreError> {
    match request {
        Request::LeaseLoad { name } => {
            Ok(protocol::lease_loaded(shared.leases.load(&name).await?.as_ref()))
        }
        Request::LeaseSwap { name, expected, record } => {
            {
                let mut names = shared.lease_names.lock().unwrap_or_else(|p| p.into_inner());
                if !names.contains(&name) {
                    if names.len() >= shared.limits.max_leases {
                        return Err(StoreError::InvalidRequest(format!(
                            "this server keeps {} lease records already, its limit",
                            names.len()
                        )));
                    }
                    names.insert(name.clone());
                }
            }
            Ok(vec![u8::from(shared.leases.swap(&name, expected.as_deref(), &record).await?)])
        }
        other => Err(StoreError::InvalidRequest(format!("operation {} is no lease", other.op()))),
    }
}

async fn run(
    request: Request,
    store: Arc<Backing>,
    trusted: Option<Arc<dyn Trusted>>,
) -> Result<Vec<u8>, StoreError> {
    let host = |trusted: Option<Arc<dyn Trusted>>| match trusted {
        Some(t) => Ok(TeeHost::new(Arc::clone(&store), t)),
        None => Err(StoreError::Unsupported(NO_TRUSTED.into())),
    };
    match request {
        Request::TeeQuery { cells, ticket, .. } => host(trusted)?.tee_query(&cells, &ticket).await,
        Request::TeeEvict { round, .. } => {
            host(trusted)?.tee_evict(&round).await?;
            Ok(Vec::new())
        }
        Request::Read { cells, .. } => Ok(store.read(&cells).await?.concat()),
        Request::ReadRanges { ranges, .. } => Ok(store.read_ranges(&ranges).await?.concat()),
        Request::ReadXor { ranges, .. } => store.read_xor(&ranges).await,
        Request::Write { cells, .. } => {
            store.write(cells).await?;
            Ok(Vec::new())
        }
        Request::Flush { .. } => {
            store.flush().await?;
            Ok(Vec::new())
        }
        #[cfg(feature = "select")]
        Request::ReadSelect { request, .. } => store.read_select(&request).await,
        #[cfg(feature = "select")]
        Request::ReadSelectCombined { request, .. } => store.read_select_combined(&request).await,
        #[cfg(feature = "select")]
        Request::WriteSelect { writes, .. } => {
            store.write_select(&writes).await?;
            Ok(Vec::new())
        }
        Request::Open { .. } => {
            Err(StoreError::InvalidRequest("open is answered by the reader".into()))
        }
        other => Err(StoreError::Unsupported(format!(
            "operation {} on this storage server (built without the `select` feature)",
            other.op()
        ))),
    }
}
