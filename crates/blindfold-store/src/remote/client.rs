//! The client side of the storage protocol: one multiplexed TCP connection per opened array,
//! re-established on demand after a failure.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use super::protocol::{self, op, Decoder, Encoder};
use crate::{ByteRange, CellId, Geometry, Result, Store, StoreError, XorStore};

type Reply = Result<Vec<u8>>;

/// One live connection: frames go to a writer task, answers come from a reader task.
#[derive(Debug)]
struct Conn {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>,
    broken: Arc<AtomicBool>,
    handle: u32,
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

/// An array of cells held by a `blindfold storage-server` at `host:port`, opened by name.
///
/// Requests are pipelined on one TCP connection (many may be in flight; answers are matched
/// by request id). If the connection breaks, requests in flight fail with a *retryable*
/// [`StoreError::Io`] and the next request reconnects. Batches are validated against the
/// geometry here as well as on the server, so an invalid batch fails before it is sent.
///
/// # Security
///
/// Nothing is encrypted or authenticated on the wire by this layer: it carries cells that are
/// sealed already, and the server is untrusted by design. The server sees exactly what a
/// [`Store`] sees, plus the array names.
#[derive(Debug)]
pub struct RemoteStore {
    addr: String,
    name: String,
    geometry: Geometry,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    next_id: AtomicU64,
}

impl RemoteStore {
    /// Connects to the server at `addr` (`host:port`) and opens (creating if needed) the array
    /// `name` with `geometry`.
    pub async fn open(addr: &str, name: &str, geometry: Geometry) -> Result<Self> {
        let store = Self {
            addr: addr.to_string(),
            name: name.to_string(),
            geometry,
            conn: tokio::sync::Mutex::new(None),
            next_id: AtomicU64::new(1),
        };
        store.connection().await?;
        Ok(store)
    }

    /// The server's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The array's name on the server.
    pub fn name(&self) -> &str {
        &self.name
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

    async fn connect(&self) -> Result<Conn> {
        let addr = &self.addr;
        // A server that is down may come back: failing to connect is worth retrying.
        let mut stream = TcpStream::connect(addr).await.map_err(|source| StoreError::Io {
            context: format!("connecting to the storage server at {addr}"),
            source,
            retryable: true,
        })?;
        let _ = stream.set_nodelay(true);
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
        let (mut rd, wr) = stream.into_split();
        let (frames, mut outbox) = mpsc::unbounded_channel::<Vec<u8>>();
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>> = Arc::default();
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
                let mut len = [0u8; 4];
                if let Err(e) = rd.read_exact(&mut len).await {
                    break lost(&reader_addr, e);
                }
                let len = u32::from_le_bytes(len) as usize;
                if !(9..=protocol::MAX_FRAME).contains(&len) {
                    break protocol_error(&reader_addr, format!("a frame of {len} bytes"));
                }
                let mut frame = vec![0u8; len];
                if let Err(e) = rd.read_exact(&mut frame).await {
                    break lost(&reader_addr, e);
                }
                let id = u64::from_le_bytes(frame[..8].try_into().unwrap());
                let reply = match frame[8] {
                    0 => {
                        frame.drain(..9);
                        Ok(frame)
                    }
                    1 => match protocol::get_error(&mut Decoder::new(&frame[9..])) {
                        Ok(e) => Err(e),
                        Err(e) => Err(protocol_error(&reader_addr, e)),
                    },
                    s => Err(protocol_error(&reader_addr, format!("status byte {s}"))),
                };
                if let Some(tx) = reader_pending.lock().remove(&id) {
                    let _ = tx.send(reply);
                }
            };
            reader_broken.store(true, Ordering::Release);
            for (_, tx) in reader_pending.lock().drain() {
                let _ = tx.send(Err(lost(&reader_addr, &why)));
            }
        });

        let mut conn = Conn { frames, pending, broken, handle: 0 };
        let mut open = Encoder::default();
        open.u64(self.geometry.cell_count()).u32(self.geometry.cell_size());
        open.u16(self.name.len() as u16).bytes(self.name.as_bytes());
        let answer = self.call_on(&conn, op::OPEN, open).await?;
        let mut d = Decoder::new(&answer);
        conn.handle = d.u32().map_err(|e| protocol_error(addr, e))?;
        Ok(conn)
    }

    /// Sends one request on `conn` and waits for its answer.
    async fn call_on(&self, conn: &Conn, op: u8, body: Encoder) -> Result<Vec<u8>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Encoder::frame();
        frame.u64(id).u8(op).bytes(&body.0);
        let frame = frame.finish()?;
        let (tx, rx) = oneshot::channel();
        conn.pending.lock().insert(id, tx);
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

    /// One request on the array: `body` follows the handle.
    async fn call(&self, op: u8, body: impl FnOnce(&mut Encoder)) -> Result<Vec<u8>> {
        let conn = self.connection().await?;
        let mut e = Encoder::default();
        e.u32(conn.handle);
        body(&mut e);
        self.call_on(&conn, op, e).await
    }

    /// Cuts a concatenated answer into buffers of the given lengths.
    fn split(&self, answer: Vec<u8>, lens: impl Iterator<Item = usize>) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        let mut at = 0usize;
        for len in lens {
            let end = at.checked_add(len).filter(|&e| e <= answer.len()).ok_or_else(|| {
                protocol_error(&self.addr, "an answer shorter than the request asked for")
            })?;
            out.push(answer[at..end].to_vec());
            at = end;
        }
        if at != answer.len() {
            return Err(protocol_error(&self.addr, "an answer longer than the request asked for"));
        }
        Ok(out)
    }
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
        let answer = self
            .call(op::READ, |e| {
                e.u32(cells.len() as u32);
                for c in cells {
                    e.u64(c.0);
                }
            })
            .await?;
        let size = self.geometry.cell_size() as usize;
        self.split(answer, std::iter::repeat_n(size, cells.len()))
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        for r in ranges {
            self.geometry.check_range(r)?;
        }
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let answer = self.call(op::READ_RANGES, |e| protocol::put_ranges(e, ranges)).await?;
        self.split(answer, ranges.iter().map(|r| r.len as usize))
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        for (c, data) in &cells {
            self.geometry.check_write(*c, data)?;
        }
        if cells.is_empty() {
            return Ok(());
        }
        let answer = self
            .call(op::WRITE, |e| {
                e.u32(cells.len() as u32);
                for (c, data) in &cells {
                    e.u64(c.0).u32(data.len() as u32);
                }
                for (_, data) in &cells {
                    e.bytes(data);
                }
            })
            .await?;
        if !answer.is_empty() {
            return Err(protocol_error(&self.addr, "a write answered with data"));
        }
        Ok(())
    }

    async fn flush(&self) -> Result<()> {
        self.call(op::FLUSH, |_| {}).await.map(drop)
    }
}

#[async_trait]
impl XorStore for RemoteStore {
    async fn read_xor(&self, ranges: &[ByteRange]) -> Result<Vec<u8>> {
        let len = crate::check_xor(&self.geometry, ranges)?;
        if ranges.is_empty() {
            return Ok(Vec::new());
        }
        let answer = self.call(op::READ_XOR, |e| protocol::put_ranges(e, ranges)).await?;
        if answer.len() != len as usize {
            return Err(protocol_error(&self.addr, "an XOR answer of the wrong length"));
        }
        Ok(answer)
    }
}
