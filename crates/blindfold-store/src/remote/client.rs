//! The client side of the storage protocol: one multiplexed TCP connection per opened array,
//! re-established on demand after a failure.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::protocol::{self, Decoder, Request};
use super::AuthKey;
use crate::{ByteRange, CellId, Geometry, Result, Store, StoreError, XorStore};

type Reply = Result<Vec<u8>>;

/// A request in flight: where its answer goes and the longest ok body it can have.
#[derive(Debug)]
struct Pending {
    tx: oneshot::Sender<Reply>,
    max_ok: usize,
}

/// One live connection: frames go to a writer task, answers come from a reader task.
#[derive(Debug)]
struct Conn {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    pending: Arc<Mutex<HashMap<u64, Pending>>>,
    broken: Arc<AtomicBool>,
    handle: u32,
    /// The largest frame the server accepts (from the handshake).
    max_frame: usize,
}

/// A lost connection: retryable, since every request is idempotent.
fn lost(addr: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Io {
        context: format!("talking to the storage server at {addr}"),
        source: std::io::Error::new(std::io::ErrorKind::ConnectionReset, why.to_string()),
        retryable: true,
    }
}

fn protocol_error(addr: &str, why: impl std::fmt::Display) -> StoreError {
    StoreError::Remote {
        message: format!("the storage server at {addr} broke the protocol: {why}"),
        retryable: false,
    }
}

fn denied(addr: &str, reason: impl Into<String>) -> StoreError {
    StoreError::AccessDenied { store: format!("remote://{addr}"), reason: reason.into() }
}

/// An array of cells held by a `blindfold storage-server` at `host:port`, opened by name.
///
/// Each connection starts with the handshake of [`protocol`]: with a key, client and server
/// prove to each other that they hold it; a wrong or missing key fails with
/// [`StoreError::AccessDenied`]. Requests are pipelined on one TCP connection (many may be in
/// flight; answers are matched by request id). If the connection breaks, requests in flight
/// fail with a *retryable* [`StoreError::Io`] and the next request reconnects. Batches are
/// validated against the geometry and the server's frame limit here as well as on the server,
/// so an invalid batch fails before it is sent; an answer is read only if it is no longer than
/// the request can be answered with (or a bounded error), so a hostile server cannot make it
/// allocate more.
///
/// # Security
///
/// The handshake authenticates both ends; the frames after it are neither encrypted nor
/// authenticated by this layer: they carry cells that are sealed already, and the server is
/// untrusted by design. The server sees exactly what a [`Store`] sees, plus the array names.
#[derive(Debug)]
pub struct RemoteStore {
    link: Link,
    name: String,
    geometry: Geometry,
}

/// A connection to a storage server, re-established on demand: handshake and, for an array,
/// its `open`.
#[derive(Debug)]
struct Link {
    addr: String,
    key: Option<AuthKey>,
    /// The array opened on each new connection, if any.
    array: Option<(String, Geometry)>,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    next_id: AtomicU64,
}

impl RemoteStore {
    /// Connects to the server at `addr` (`host:port`), authenticating with `key` (`None` only
    /// for a server started with `--insecure-no-auth`), and opens (creating if needed) the
    /// array `name` with `geometry`.
    pub async fn open(
        addr: &str,
        key: Option<AuthKey>,
        name: &str,
        geometry: Geometry,
    ) -> Result<Self> {
        let link = Link::new(addr, key, Some((name.to_string(), geometry)));
        link.connection().await?;
        Ok(Self { link, name: name.to_string(), geometry })
    }

    /// The server's address.
    pub fn addr(&self) -> &str {
        &self.link.addr
    }

    /// The array's name on the server.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One request on the array, built for the connection's handle.
    async fn call(&self, max_ok: usize, req: impl FnOnce(u32) -> Request) -> Result<Vec<u8>> {
        let conn = self.link.connection().await?;
        let req = req(conn.handle);
        self.link.call_on(&conn, &req, max_ok).await
    }

    /// Cuts a concatenated answer into buffers of the given lengths.
    fn split(&self, answer: Vec<u8>, lens: impl Iterator<Item = usize>) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        let mut at = 0usize;
        for len in lens {
            let end = at.checked_add(len).filter(|&e| e <= answer.len()).ok_or_else(|| {
                protocol_error(self.addr(), "an answer shorter than the request asked for")
            })?;
            out.push(answer[at..end].to_vec());
            at = end;
        }
        if at != answer.len() {
            return Err(protocol_error(self.addr(), "an answer longer than the request asked for"));
        }
        Ok(out)
    }
}

impl Link {
    fn new(addr: &str, key: Option<AuthKey>, array: Option<(String, Geometry)>) -> Self {
        Self {
            addr: addr.to_string(),
            key,
            array,
            conn: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
        }
    }

    /// The live connection, connecting (and opening the array) if there is none.
    async fn connection(&self) -> Result<Arc<Conn>> {
        let mut slot = self.conn.lock().await;
        if let Some(conn) = slot.as_ref() {
            if !conn.broken.load(Ordering::Acquire) {
                return Ok(Arc::clone(conn));
            }
        }
        *slot = None;
        let conn = Arc::new(self.connect().await?);
        *slot = Some(Arc::clone(&conn));
        Ok(conn)
    }

    /// Hello and authentication; returns the server's largest frame.
    async fn handshake(&self, stream: &mut TcpStream) -> Result<usize> {
        let addr = &self.addr;
        stream.write_all(&protocol::hello()).await.map_err(|e| lost(addr, e))?;
        let mut hello = [0u8; protocol::HELLO_LEN];
        stream.read_exact(&mut hello).await.map_err(|e| lost(addr, e))?;
        let version = protocol::parse_hello(&hello).map_err(|e| protocol_error(addr, e))?;
        if version != protocol::VERSION {
            return Err(protocol_error(
                addr,
                format!("it speaks protocol version {version}, this build {}", protocol::VERSION),
            ));
        }
        let mut challenge = [0u8; protocol::CHALLENGE_LEN];
        stream.read_exact(&mut challenge).await.map_err(|e| lost(addr, e))?;
        let (keyed, server_nonce) =
            protocol::parse_challenge(&challenge).map_err(|e| protocol_error(addr, e))?;
        let client_nonce = super::auth::nonce()?;
        let proof =
            match (&self.key, keyed) {
                (Some(key), true) => key.client_proof(&server_nonce, &client_nonce),
                (None, false) => [0u8; protocol::PROOF_LEN],
                (Some(_), false) => return Err(denied(
                    addr,
                    "the server does not authenticate (it runs with --insecure-no-auth) but this \
                     client has a key_file; refusing to talk to a server that cannot prove it \
                     holds the key",
                )),
                (None, true) => return Err(denied(
                    addr,
                    "the server requires a pre-shared key: add `?key_file=/path` (the file the \
                     server was given with --auth-key-file) to the remote:// URL",
                )),
            };
        let mut response = [0u8; protocol::RESPONSE_LEN];
        response[..protocol::NONCE_LEN].copy_from_slice(&client_nonce);
        response[protocol::NONCE_LEN..].copy_from_slice(&proof);
        stream.write_all(&response).await.map_err(|e| lost(addr, e))?;
        let status = stream.read_u8().await.map_err(|e| lost(addr, e))?;
        match status {
            0 => {}
            1 => {
                let n = stream.read_u16_le().await.map_err(|e| lost(addr, e))? as usize;
                if n > protocol::MAX_REFUSAL {
                    return Err(protocol_error(addr, format!("a refusal of {n} bytes")));
                }
                let mut msg = vec![0u8; n];
                stream.read_exact(&mut msg).await.map_err(|e| lost(addr, e))?;
                return Err(denied(addr, String::from_utf8_lossy(&msg)));
            }
            s => return Err(protocol_error(addr, format!("verdict byte {s}"))),
        }
        let mut accept = [0u8; protocol::ACCEPT_LEN];
        stream.read_exact(&mut accept).await.map_err(|e| lost(addr, e))?;
        let (server_proof, max_frame) =
            protocol::parse_accept(&accept).map_err(|e| protocol_error(addr, e))?;
        if let Some(key) = &self.key {
            if !key.verify_server(&server_nonce, &client_nonce, &server_proof) {
                return Err(denied(
                    addr,
                    "the server's proof does not match this key: it holds another key, or \
                     something else answers at this address",
                ));
            }
        }
        Ok(max_frame)
    }

    async fn connect(&self) -> Result<Conn> {
        let addr = &self.addr;
        // A server that is down may come back: failing to connect is worth retrying.
        let mut stream = TcpStream::connect(addr).await.map_err(|source| StoreError::Io {
            context: format!("connecting to the storage server at {addr}"),
            source,
            retryable: true,
        })?;
        let _ = stream.set_nodelay(true);
        let max_frame = self.handshake(&mut stream).await?;
        let (mut rd, wr) = stream.into_split();
        let (frames, mut outbox) = mpsc::unbounded_channel::<Vec<u8>>();
        let pending: Arc<Mutex<HashMap<u64, Pending>>> = Arc::default();
        let broken = Arc::new(AtomicBool::new(false));

        // Writer: sends frames in order, flushing when there is nothing more to send.
        let writer_broken = Arc::clone(&broken);
        tokio::spawn(async move {
            let mut wr = BufWriter::new(wr);
            while let Some(frame) = outbox.recv().await {
                let mut ok = wr.write_all(&frame).await.is_ok();
                while ok {
                    match outbox.try_recv() {
                        Ok(more) => ok = wr.write_all(&more).await.is_ok(),
                        Err(_) => break,
                    }
                }
                if !ok || wr.flush().await.is_err() {
                    writer_broken.store(true, Ordering::Release);
                    return;
                }
            }
            let _ = wr.shutdown().await;
        });

        // Reader: hands each answer to the request waiting for it; on any failure, fails every
        // request in flight and marks the connection broken.
        let reader_pending = Arc::clone(&pending);
        let reader_broken = Arc::clone(&broken);
        let reader_addr = addr.clone();
        tokio::spawn(async move {
            let why = loop {
                match read_reply(&mut rd, &reader_pending).await {
                    Ok((tx, reply)) => {
                        let reply = reply.map_err(|e| protocol_error(&reader_addr, e));
                        let _ = tx.send(reply.and_then(|r| r));
                    }
                    Err(ReadFailure::Io(e)) => break lost(&reader_addr, e),
                    Err(ReadFailure::Protocol(e)) => break protocol_error(&reader_addr, e),
                }
            };
            reader_broken.store(true, Ordering::Release);
            for (_, p) in reader_pending.lock().drain() {
                let _ = p.tx.send(Err(copy_error(&why)));
            }
        });

        let mut conn = Conn { frames, pending, broken, handle: 0, max_frame };
        if let Some((name, geometry)) = &self.array {
            let open = Request::Open {
                cell_count: geometry.cell_count(),
                cell_size: geometry.cell_size(),
                name: name.clone(),
            };
            let answer = self.call_on(&conn, &open, 4).await?;
            let mut d = Decoder::new(&answer);
            conn.handle = d.u32().map_err(|e| protocol_error(addr, e))?;
            d.end().map_err(|e| protocol_error(addr, e))?;
        }
        Ok(conn)
    }

    /// Sends one request on `conn` and waits for its answer, whose ok body may be at most
    /// `max_ok` bytes.
    async fn call_on(&self, conn: &Conn, req: &Request, max_ok: usize) -> Result<Vec<u8>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = req.frame(id, conn.max_frame)?;
        let (tx, rx) = oneshot::channel();
        conn.pending.lock().insert(id, Pending { tx, max_ok });
        if conn.broken.load(Ordering::Acquire) || conn.frames.send(frame).is_err() {
            conn.pending.lock().remove(&id);
            conn.broken.store(true, Ordering::Release);
            return Err(lost(&self.addr, "the connection is closed"));
        }
        match rx.await {
            Ok(reply) => reply,
            Err(_) => Err(lost(&self.addr, "the connection closed with the request in flight")),
        }
    }
}

/// Why the reader stopped.
enum ReadFailure {
    Io(std::io::Error),
    Protocol(String),
}

/// The same error again, for every request that was in flight when the connection failed.
fn copy_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Io { context, source, retryable } => StoreError::Io {
            context: context.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
            retryable: *retryable,
        },
        StoreError::Remote { message, retryable } => {
            StoreError::Remote { message: message.clone(), retryable: *retryable }
        }
        other => StoreError::Remote { message: other.to_string(), retryable: true },
    }
}

/// The reply to one request whose ok body must be at most `max_ok` bytes, from the bytes
/// of a frame after its length: `Err` if it is no valid reply to that request. Every length
/// is checked before anything is allocated for it.
pub(crate) fn check_reply_len(len: usize, status: u8, max_ok: usize) -> Result<(), String> {
    let body = len - protocol::FRAME_HEAD;
    let max = match status {
        0 => max_ok,
        1 => protocol::MAX_ERROR_BODY,
        s => return Err(format!("status byte {s}")),
    };
    if body > max {
        return Err(format!("an answer of {body} bytes where at most {max} may come"));
    }
    Ok(())
}

/// Reads one reply frame; returns the waiting request's sender and what the reply says.
async fn read_reply(
    rd: &mut (impl AsyncRead + Unpin),
    pending: &Mutex<HashMap<u64, Pending>>,
) -> std::result::Result<(oneshot::Sender<Reply>, std::result::Result<Reply, String>), ReadFailure>
{
    let len = rd.read_u32_le().await.map_err(ReadFailure::Io)? as usize;
    if len < protocol::FRAME_HEAD {
        return Err(ReadFailure::Protocol(format!("a frame of {len} bytes")));
    }
    let id = rd.read_u64_le().await.map_err(ReadFailure::Io)?;
    let status = rd.read_u8().await.map_err(ReadFailure::Io)?;
    let Some(p) = pending.lock().remove(&id) else {
        return Err(ReadFailure::Protocol(format!(
            "an answer to request {id}, which was not sent"
        )));
    };
    if let Err(e) = check_reply_len(len, status, p.max_ok) {
        let _ = p.tx.send(Err(StoreError::Remote { message: e.clone(), retryable: false }));
        return Err(ReadFailure::Protocol(e));
    }
    let mut body = vec![0u8; len - protocol::FRAME_HEAD];
    rd.read_exact(&mut body).await.map_err(ReadFailure::Io)?;
    Ok((p.tx, protocol::decode_reply(status, body)))
}

#[async_trait]
impl Store for RemoteStore {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        for &c in cells {
            self.geometry.check_cell(c)?;
        }
        if cells.is_empty() {
            return Ok(Vec::new());
        }
        let size = self.geometry.cell_size() as usize;
        let answer = self
            .call(size.saturating_mul(cells.len()), |handle| Request::Read {
                handle,
                cells: cells.to_vec(),
            })
            .await?;
        self.split(answer, std::iter::repeat_n(size, cells.len()))
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        for r in ranges {
            self.geometry.check_range(r)?;
        }
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let total = ranges.iter().map(|r| r.len as usize).fold(0usize, usize::saturating_add);
        let answer = self
            .call(total, |handle| Request::ReadRanges { handle, ranges: ranges.to_vec() })
            .await?;
        self.split(answer, ranges.iter().map(|r| r.len as usize))
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        for (c, data) in &cells {
            self.geometry.check_write(*c, data)?;
        }
        if cells.is_empty() {
            return Ok(());
        }
        let answer = self.call(0, |handle| Request::Write { handle, cells }).await?;
        if !answer.is_empty() {
            return Err(protocol_error(self.addr(), "a write answered with data"));
        }
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        let answer = self.call(0, |handle| Request::Flush { handle }).await?;
        if !answer.is_empty() {
            return Err(protocol_error(self.addr(), "a flush answered with data"));
        }
        Ok(())
    }
}

#[async_trait]
impl XorStore for RemoteStore {
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>> {
        let len = crate::check_xor(&self.geometry, ranges)?;
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let answer = self
            .call(len as usize, |handle| Request::ReadXor { handle, ranges: ranges.to_vec() })
            .await?;
        if answer.len() != len as usize {
            return Err(protocol_error(self.addr(), "an XOR answer of the wrong length"));
        }
        Ok(answer)
    }
}

/// The storage server's host reads the cells and its trusted component computes; a server
/// started without one answers [`StoreError::Unsupported`].
#[async_trait]
impl crate::TeeStore for RemoteStore {
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> Result<Vec<u8>> {
        crate::check_tee_query(&self.geometry, cells, ticket)?;
        let max = crate::tee_answer_max(&self.geometry);
        self.call(max, |handle| Request::TeeQuery {
            handle,
            cells: cells.to_vec(),
            ticket: ticket.to_vec(),
        })
        .await
    }

    async fn tee_evict(&self, round: &crate::TeeRound) -> Result<()> {
        crate::check_tee_round(&self.geometry, round)?;
        let answer =
            self.call(0, |handle| Request::TeeEvict { handle, round: round.clone() }).await?;
        if !answer.is_empty() {
            return Err(protocol_error(self.addr(), "an eviction round answered with data"));
        }
        Ok(())
    }
}

#[cfg(feature = "select")]
#[async_trait]
impl crate::SelectStore for RemoteStore {
    async fn read_select(&self, request: &crate::SelectRequest) -> Result<Vec<u8>> {
        let len = crate::select_answer_len(&self.geometry, request)?;
        let answer = self
            .call(len, |handle| Request::ReadSelect { handle, request: request.clone() })
            .await?;
        if answer.len() != len {
            return Err(protocol_error(self.addr(), "a select answer of the wrong length"));
        }
        Ok(answer)
    }

    async fn read_select_combined(&self, request: &crate::CombinedSelect) -> Result<Vec<u8>> {
        let len = crate::combined_answer_len(&self.geometry, request)?;
        let answer = self
            .call(len, |handle| Request::ReadSelectCombined { handle, request: request.clone() })
            .await?;
        if answer.len() != len {
            return Err(protocol_error(
                self.addr(),
                "a combined select answer of the wrong length",
            ));
        }
        Ok(answer)
    }

    async fn write_select(&self, writes: &[crate::SelectWrite]) -> Result<()> {
        crate::check_select_writes(&self.geometry, writes)?;
        if writes.is_empty() {
            return Ok(());
        }
        let answer =
            self.call(0, |handle| Request::WriteSelect { handle, writes: writes.to_vec() }).await?;
        if !answer.is_empty() {
            return Err(protocol_error(self.addr(), "a select write answered with data"));
        }
        Ok(())
    }
}

/// The lease records of a `blindfold storage-server` (ops 12 and 13 of the [`protocol`]): the
/// server compares and replaces each record in one step, on its own side. One connection,
/// opened without an array and re-established on demand.
#[derive(Debug)]
pub struct RemoteLeaseRecords {
    link: Link,
}

impl RemoteLeaseRecords {
    /// Connects to the server at `addr` (`host:port`), authenticating with `key` (`None` only
    /// for a server started with `--insecure-no-auth`).
    pub async fn connect(addr: &str, key: Option<AuthKey>) -> Result<Self> {
        let link = Link::new(addr, key, None);
        link.connection().await?;
        Ok(Self { link })
    }

    async fn call(&self, max_ok: usize, req: Request) -> Result<Vec<u8>> {
        let conn = self.link.connection().await?;
        self.link.call_on(&conn, &req, max_ok).await
    }
}

/// Checks what is sent against the limits the server enforces, so nothing is cut on the wire.
fn check_lease_request(name: &str, parts: &[&[u8]]) -> Result<()> {
    crate::url::check_name(name)?;
    if let Some(long) = parts.iter().find(|p| p.len() > crate::MAX_LEASE_RECORD) {
        return Err(StoreError::InvalidRequest(format!(
            "a lease record or token of {} bytes (at most {})",
            long.len(),
            crate::MAX_LEASE_RECORD
        )));
    }
    Ok(())
}

#[async_trait]
impl crate::LeaseRecords for RemoteLeaseRecords {
    async fn load(&self, name: &str) -> Result<Option<crate::LoadedRecord>> {
        check_lease_request(name, &[])?;
        let answer = self
            .call(protocol::MAX_LEASE_LOADED, Request::LeaseLoad { name: name.to_string() })
            .await?;
        protocol::parse_lease_loaded(&answer).map_err(|e| protocol_error(&self.link.addr, e))
    }

    async fn swap(&self, name: &str, expected: Option<&[u8]>, record: &[u8]) -> Result<bool> {
        check_lease_request(name, &[expected.unwrap_or_default(), record])?;
        let req = Request::LeaseSwap {
            name: name.to_string(),
            expected: expected.map(<[u8]>::to_vec),
            record: record.to_vec(),
        };
        match self.call(1, req).await?.as_slice() {
            [0] => Ok(false),
            [1] => Ok(true),
            other => {
                Err(protocol_error(&self.link.addr, format!("a lease swap answered {other:?}")))
            }
        }
    }
}
