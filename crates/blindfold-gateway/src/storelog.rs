//! The gateway's log in the untrusted store (`--durability store`): everything needed to
//! recover an acknowledged write, sealed and appended to the store before the write is
//! acknowledged, so that a new machine with nothing but the key rebuilds the gateway from the
//! store alone (`blindfold recover`), losing nothing.
//!
//! # What is logged
//!
//! *Entries*, numbered from one run of the gateway to the next: the frames the engine appends
//! to its own redo log (through its [`blindfold_proxy::Tap`]: reveal records before a path is
//! read, commit records after), and the directory's operations, one entry per transaction
//! (object put or delete, multipart steps, bucket creation). An engine's frames are handed
//! over in the order of its own log, a directory transaction's operations under the
//! directory's lock, so the log's order is the order in which the state changed.
//!
//! # Layout in the store
//!
//! An array named [`ARRAY`] of fixed-size cells used as a ring: cell `seq % cells` holds the
//! log's `seq`-th cell. Concurrent appends are *group-committed*: an append whose entry is not
//! in a group yet takes every entry queued so far, encodes them as one group, splits it over as
//! many whole cells as it needs, writes them in one batch and flushes. Up to [`IN_FLIGHT`]
//! groups are written at once (a store far away is not left idle while one round trip
//! completes), but they are acknowledged in order: an entry is durable once its group and every
//! group before it are. A reveal record that no read waits for the store to hold (a standby's
//! acknowledgement lets the read go, or reads go ahead of the log) starts no group of its own
//! for [`LINGER`]: it usually rides in the next commit's group. A cell's plaintext is
//! `seq (8) ‖ generation (8) ‖ digest of the previous cell (32) ‖ flags (1) ‖ length (4) ‖
//! durable through (8) ‖ payload`, zero-padded, sealed under a key of its own derived from the
//! master key and bound to its position and to `seq`. *Durable through* is the first cell that
//! was not yet known to be in the store when this one was sent. A cell the store swaps, replays from an earlier lap of the ring, or
//! alters does not open; one spliced from another timeline breaks the chain of digests.
//!
//! # Where the log ends
//!
//! At the first cell that does not open. The cells of the groups in flight at a crash reach
//! the store in any order (an S3 store writes a group's cells in parallel), so intact cells may
//! follow that hole; none of them was acknowledged, and they are dropped. A cell after the hole
//! that was sent once the hole's cell was durable (its *durable through* is past the hole)
//! proves that the store dropped or altered an acknowledged cell: an error, never an end.
//!
//! # Checkpoints
//!
//! The ring stays bounded because a *store checkpoint* is written in the background (to the
//! snapshot area, [`crate::snapshot`], which a crash mid-write leaves intact): the engine's
//! last checkpoint file, the engine's frames since (kept in memory here, bounded: the engine
//! is asked to checkpoint when they pass [`TAIL_LIMIT`]), the directory, and the entry number
//! and cell from which the log continues them. The engine is also asked to checkpoint once
//! half the ring is used since the last store checkpoint, and a store checkpoint follows each
//! of its checkpoints: it then carries the engine's fresh checkpoint and a short tail of
//! frames, not half a ring of them (one is forced at five eighths of the ring). Once it is
//! durable, the cells before it may be reused. Recovery reads the newest store checkpoint, rewrites the state directory and the
//! directory from it, appends the engine's frames logged since to its redo log, applies the
//! directory's operations logged since, and opens the engine as after a crash: it replays its
//! redo log, reading again exactly the paths the store already saw.
//!
//! # What the store learns
//!
//! One batch write of whole cells per group commit, and the checkpoints' size. The number of
//! cells in a group is the size of the sealed state changes rounded up to whole cells: for the
//! engines it follows the number of accesses and commits, which the store sees anyway, never
//! which blocks or objects they touched.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blindfold_crypto::{CellAd, CellSealer, MasterKey, StoreId};
use blindfold_store::{open_store, CellId, Geometry, Store, StoreUrl};
use serde::{Deserialize, Serialize};

use crate::{GatewayError, Result};

/// The store array holding the log.
pub const ARRAY: &str = "journal";
/// Payload and header bytes of one cell (sealed, a cell takes [`CellSealer::OVERHEAD`] more).
pub const CHUNK: usize = 64 * 1024;
/// Cells of the ring by default (128 MiB of log). A new log's ring; an existing one keeps the
/// size its store checkpoint records.
pub const DEFAULT_CELLS: u64 = 2048;
/// Engine frames kept for the next store checkpoint beyond which the engine is asked to
/// checkpoint (its checkpoint replaces them). An engine checkpoint holds commits back while it
/// waits for the store and writes the engine's whole state, and a TaoStore commit record
/// carries its stash and the tree-top buckets it changed (about 300 KiB per PUT in the
/// benchmark's mix): at 16 MiB the engine checkpointed every fifty or so PUTs. At 64 MiB a
/// PUT-only run behind 50 ms sends a fifth fewer log bytes per group commit and gains a few
/// per cent (docs/benchmarks.md).
pub const TAIL_LIMIT: usize = 64 << 20;
/// The header of a cell written before groups were pipelined (no *durable through*).
const OLD_HEADER: usize = 8 + 8 + 32 + 1 + 4;
const HEADER: usize = OLD_HEADER + 8;
const PAYLOAD: usize = CHUNK - HEADER;
/// Flags: the last cell of its group; the header holds *durable through*.
const LAST: u8 = 1;
const HAS_THROUGH: u8 = 2;
/// Groups written to the store at once.
pub const IN_FLIGHT: usize = 8;
/// Cells after a hole that replay looks at for one sent after the hole's cell was durable.
const LOOK_AHEAD: u64 = 64;
/// How long a reveal record may wait for company before its own group goes to the store, when
/// no read waits for the store to hold it (a standby's acknowledgement lets the read go, or
/// reads go ahead of the log): most ride in the group of the next commit's record, instead of
/// each costing the store a write of a whole cell. Bounds how far the store lags the standby.
pub const LINGER: Duration = Duration::from_millis(100);
/// Cells used since the last store checkpoint beyond which the engine is asked to checkpoint
/// (its checkpoint is followed by a store checkpoint): half the ring.
fn engine_checkpoint_at(cells: u64) -> u64 {
    cells / 2
}

/// Cells used since the last store checkpoint beyond which one is written even though the
/// engine has not checkpointed since: five eighths of the ring, leaving three eighths for the
/// appends made while it is written.
fn store_checkpoint_at(cells: u64) -> u64 {
    cells * 5 / 8
}

/// How long an append waits for a store checkpoint to free room in a full ring.
const ROOM_WAIT: Duration = Duration::from_secs(60);

/// One entry of the log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Entry {
    /// Frames the engine appended to its redo log, encoded as in `redo.log`.
    Engine(#[serde(with = "byte_vecs")] Vec<Vec<u8>>),
    /// The operations of one directory transaction, encoded by the directory
    /// ([`crate::directory::DirOp`]; the log does not read them).
    Directory(#[serde(with = "serde_bytes")] Vec<u8>),
    /// From here on, reads may go out once the standby of this session holds their reveal
    /// records (`Some`), or again only once the store does (`None`): [`crate::feed`].
    Standby(Option<u64>),
}

/// Decodes one entry encoded as the log encodes it (a standby's [`crate::feed::Tail`]).
pub fn decode_entry(b: &[u8]) -> Result<Entry> {
    use bincode::Options;
    bincode_opts().with_limit(b.len() as u64 + 64).deserialize(b).map_err(|e| {
        GatewayError::Corrupt(format!("an entry of the log feed does not decode: {e}"))
    })
}

/// Where a store checkpoint says the log continues it; kept in the snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalPoint {
    /// The first cell to read.
    pub read_from: u64,
    /// The digest the cell `read_from` must name as its predecessor's.
    pub chain: [u8; 32],
    /// The first entry the checkpoint does not cover.
    pub next_entry: u64,
    /// The ring's size in cells.
    pub cells: u64,
    /// The lease generation of the gateway that wrote it.
    pub generation: u64,
    /// The engine's redo-log bytes to put after its checkpoint file: what its log held at
    /// that checkpoint, then every frame it logged since up to `next_entry`.
    #[serde(with = "serde_bytes")]
    pub redo_log: Vec<u8>,
}

/// Byte strings encoded whole (`serde_bytes`) rather than byte by byte, inside a sequence.
/// In bincode both give the same bytes (a length, then the bytes), so logs, checkpoints and
/// feeds written either way read either way; whole, megabytes of frames encode and decode at
/// memory speed instead of one call per byte.
pub(crate) mod byte_vecs {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[Vec<u8>], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(v.iter().map(|b| serde_bytes::Bytes::new(b)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Vec<u8>>, D::Error> {
        let v = Vec::<serde_bytes::ByteBuf>::deserialize(d)?;
        Ok(v.into_iter().map(serde_bytes::ByteBuf::into_vec).collect())
    }
}

fn sealer(key: &MasterKey) -> CellSealer {
    // A store id of its own: log cells are never confused with ORAM or snapshot cells.
    CellSealer::new(key, StoreId(*b"blindfold-jrnl!!"), 0)
}

fn geometry(cells: u64) -> Result<Geometry> {
    Geometry::new(cells, (CHUNK + CellSealer::OVERHEAD) as u32)
        .map_err(|e| GatewayError::Config(e.to_string()))
}

/// Opens the log's ring of `cells` cells in the store at `url`.
pub async fn open_ring(url: &StoreUrl, cells: u64) -> Result<Arc<dyn Store>> {
    open_store(url, ARRAY, geometry(cells)?)
        .await
        .map_err(|e| GatewayError::Config(format!("opening the store-side log: {e}")))
}

fn digest(prev: &[u8; 32], plain: &[u8]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(prev);
    ctx.update(plain);
    ctx.finish().as_ref().try_into().expect("SHA-256 is 32 bytes")
}

fn bincode_opts() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new().with_fixint_encoding().allow_trailing_bytes()
}

/// What the engine last checkpointed, and the frames it logged since.
#[derive(Default)]
struct EngineBase {
    /// Shared, so that a capture copies it without holding the queue (tens of MiB).
    checkpoint: Arc<Vec<u8>>,
    /// Its log at the checkpoint, then every frame queued since.
    log: Vec<u8>,
}

struct Queue {
    next_entry: u64,
    pending: Vec<(u64, Entry)>,
    engine: EngineBase,
    /// The session of the last [`Entry::Standby`] queued: reads may go ahead of the store on
    /// its standby's word.
    standby: Option<u64>,
}

/// A group sent to the ring.
#[derive(Clone, Copy)]
struct Group {
    first_entry: u64,
    /// One past its last entry.
    end_entry: u64,
    seq: u64,
    cells: u64,
    prev: [u8; 32],
    /// Written and flushed.
    done: bool,
}

/// What [`StoreLog::send`] did.
enum Send {
    /// The group's sealed cells, and its first cell.
    Sent(Vec<(CellId, Vec<u8>)>, u64),
    /// No room in the ring up to this cell until a checkpoint frees some.
    NoRoom(u64),
}

struct Writer {
    next_seq: u64,
    prev: [u8; 32],
    /// One past the last entry sent in a group.
    sent_entries: u64,
    /// Every cell below this is in the store (each group up to it is done).
    durable_seq: u64,
    /// Entries of the groups up to `durable_seq`.
    durable_entries: u64,
    /// Cells below this are covered by a durable store checkpoint.
    checkpointed_from: u64,
    /// The next cell when the engine last checkpointed (the records before it need not wait
    /// for another engine checkpoint).
    engine_checkpointed_at: u64,
    /// Groups sent since the oldest cell still needed, in flight or done.
    groups: VecDeque<Group>,
}

impl Writer {
    fn in_flight(&self) -> usize {
        self.groups.iter().filter(|g| !g.done).count()
    }

    /// Cells below this may be overwritten: covered by a checkpoint, and no longer being
    /// written (a late write of an old lap must not land on a newer cell).
    fn reusable_from(&self) -> u64 {
        let oldest_in_flight = self.groups.iter().find(|g| !g.done).map(|g| g.seq);
        oldest_in_flight.map_or(self.checkpointed_from, |s| s.min(self.checkpointed_from))
    }
}

/// The log, shared by the engine's tap, the directory and the checkpointer.
pub struct StoreLog {
    ring: Arc<dyn Store>,
    sealer: CellSealer,
    cells: u64,
    generation: u64,
    queue: parking_lot::Mutex<Queue>,
    writer: parking_lot::Mutex<Writer>,
    /// Every entry below this is durable in the store (and recorded in the anchor).
    durable: AtomicU64,
    /// Rung when a group is done or fails.
    progress: tokio::sync::Notify,
    /// Orders the anchor's writes.
    acknowledging: tokio::sync::Mutex<()>,
    /// Held while a store checkpoint is written, and through a growth.
    checkpoints: tokio::sync::Mutex<()>,
    failed: parking_lot::Mutex<Option<String>>,
    want_checkpoint: AtomicBool,
    /// A store checkpoint is due ([`StoreLog::take_checkpoint_due`]).
    checkpoint_due: AtomicBool,
    /// Wakes the checkpointer.
    pub(crate) wake: tokio::sync::Notify,
    /// Rung when a checkpoint frees room.
    room: tokio::sync::Notify,
    appends: AtomicU64,
    bytes: AtomicU64,
    /// Told how far the log reaches before a group is acknowledged (`--anchor`).
    anchor: Option<Arc<crate::anchor::Anchor>>,
    /// Checked by every write of this gateway to the store (its lease still lasts); shut
    /// when the log is fenced or closed.
    gate: Arc<blindfold_store::LeaseGate>,
    /// Reads go out before the store holds their reveal records (`--reads-ahead-of-log`).
    reads_ahead: bool,
    /// Tests: no group reaches the store any more (a store that swallows the log's tail).
    withheld: AtomicBool,
    /// The standby's log feed (`--standby-listen`), if any.
    feed: Option<Arc<crate::feed::Feed>>,
}

impl std::fmt::Debug for StoreLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreLog")
            .field("cells", &self.cells)
            .field("generation", &self.generation)
            .field("durable", &self.durable.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl StoreLog {
    /// A log continuing after `point` (the newest store checkpoint's, or a fresh one), whose
    /// first cell will be `start` (beyond every cell an earlier run may have written), for the
    /// gateway holding lease `generation`. `engine_checkpoint` and `engine_log` are the
    /// engine's files as they are now.
    pub fn new(
        ring: Arc<dyn Store>,
        key: &MasterKey,
        start: u64,
        next_entry: u64,
        generation: u64,
        engine_checkpoint: Vec<u8>,
        engine_log: Vec<u8>,
    ) -> Self {
        let cells = ring.geometry().cell_count();
        // A chain of its own per run: the first cell names a digest of where it starts.
        let prev = digest(&[0; 32], &start.to_le_bytes());
        StoreLog {
            ring,
            sealer: sealer(key),
            cells,
            generation,
            queue: parking_lot::Mutex::new(Queue {
                next_entry,
                pending: Vec::new(),
                engine: EngineBase { checkpoint: Arc::new(engine_checkpoint), log: engine_log },
                standby: None,
            }),
            writer: parking_lot::Mutex::new(Writer {
                next_seq: start,
                prev,
                sent_entries: next_entry,
                durable_seq: start,
                durable_entries: next_entry,
                checkpointed_from: start,
                engine_checkpointed_at: start,
                groups: VecDeque::new(),
            }),
            durable: AtomicU64::new(next_entry),
            progress: tokio::sync::Notify::new(),
            acknowledging: tokio::sync::Mutex::new(()),
            checkpoints: tokio::sync::Mutex::new(()),
            failed: parking_lot::Mutex::new(None),
            want_checkpoint: AtomicBool::new(false),
            checkpoint_due: AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
            room: tokio::sync::Notify::new(),
            appends: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            anchor: None,
            gate: blindfold_store::LeaseGate::new(),
            reads_ahead: false,
            withheld: AtomicBool::new(false),
            feed: None,
        }
    }

    /// Hands every entry queued from now on to a standby's log feed as well, whose
    /// acknowledgements then let reads go ([`crate::feed`]).
    pub fn set_feed(&mut self) {
        self.feed = Some(Arc::new(crate::feed::Feed::new(self.durable.load(Ordering::SeqCst))));
    }

    /// The standby's log feed, if this log serves one.
    pub fn feed(&self) -> Option<&Arc<crate::feed::Feed>> {
        self.feed.as_ref()
    }

    /// The lock a store checkpoint is written under ([`crate::snapshot::write_journal_snapshot`]);
    /// a growth holds it while the engine and gateway.json change.
    pub async fn checkpoints(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.checkpoints.lock().await
    }

    /// Makes `gate` the one this log shuts when fenced (the engine's store passes it too).
    pub fn set_gate(&mut self, gate: Arc<blindfold_store::LeaseGate>) {
        self.gate = gate;
    }

    /// The gate every write of this gateway to the store passes (see
    /// [`blindfold_store::LeaseGate`]).
    pub fn gate(&self) -> Arc<blindfold_store::LeaseGate> {
        Arc::clone(&self.gate)
    }

    /// Lets reads go out before the store holds their reveal records
    /// ([`blindfold_proxy::LogMirror::reads_wait`]); store checkpoints then say so
    /// ([`crate::snapshot::Snapshot::reads_ahead_of_log`]).
    pub fn set_reads_ahead(&mut self, on: bool) {
        self.reads_ahead = on;
    }

    /// Whether reads go out before the store holds their reveal records.
    pub fn reads_ahead(&self) -> bool {
        self.reads_ahead
    }

    /// Tests: from now on no group of this log reaches the store (each write fails before it
    /// is sent), as when the machine is lost before the store took the log's tail.
    #[doc(hidden)]
    pub fn withhold_writes(&self) {
        self.withheld.store(true, Ordering::SeqCst);
    }

    /// Records in `anchor`, before each group is acknowledged, how many entries are durable.
    pub fn set_anchor(&mut self, anchor: Arc<crate::anchor::Anchor>) {
        self.anchor = Some(anchor);
    }

    /// Cells in the ring.
    pub fn cells(&self) -> u64 {
        self.cells
    }

    /// Entries the store holds: every entry numbered below this.
    pub fn durable_entries(&self) -> u64 {
        self.durable.load(Ordering::SeqCst)
    }

    /// Group commits written so far, and the bytes they took in the store.
    pub fn counts(&self) -> (u64, u64) {
        (self.appends.load(Ordering::Relaxed), self.bytes.load(Ordering::Relaxed))
    }

    /// Queues `entry`; returns its number. Call [`StoreLog::durable`] before acknowledging
    /// what it records.
    pub fn enqueue(&self, entry: Entry) -> u64 {
        let mut q = self.queue.lock();
        self.enqueue_locked(&mut q, entry)
    }

    fn enqueue_locked(&self, q: &mut Queue, entry: Entry) -> u64 {
        match &entry {
            Entry::Engine(frames) => {
                for f in frames {
                    q.engine.log.extend_from_slice(f);
                }
                if q.engine.log.len() > TAIL_LIMIT {
                    self.want_checkpoint.store(true, Ordering::Relaxed);
                }
            }
            Entry::Standby(session) => q.standby = *session,
            Entry::Directory(_) => {}
        }
        let n = q.next_entry;
        q.next_entry += 1;
        if let Some(feed) = &self.feed {
            use bincode::Options;
            let encoded = bincode_opts().serialize(&entry).expect("log entries encode");
            feed.push(n, encoded);
        }
        q.pending.push((n, entry));
        n
    }

    /// The number the next entry will get.
    pub fn next_entry(&self) -> u64 {
        self.queue.lock().next_entry
    }

    fn check(&self) -> Result<()> {
        match &*self.failed.lock() {
            Some(why) => Err(GatewayError::Config(format!(
                "the store-side log stopped after a failed write ({why}); nothing more is \
                 acknowledged. Restart the gateway once the store is reachable"
            ))),
            None => Ok(()),
        }
    }

    /// Returns once entry `n` (and every entry before it) is durable in the store, sending
    /// everything queued as one group if `n` is not in a group yet.
    pub async fn durable(&self, n: u64) -> Result<()> {
        loop {
            let progress = self.progress.notified();
            tokio::pin!(progress);
            progress.as_mut().enable();
            if self.durable.load(Ordering::SeqCst) > n {
                return Ok(());
            }
            self.check()?;
            let sent = {
                let mut w = self.writer.lock();
                if n < w.sent_entries || w.in_flight() >= IN_FLIGHT {
                    // In a group already, or the pipeline is full: wait for a group to end.
                    None
                } else {
                    Some(self.send(&mut w, n)?)
                }
            };
            match sent {
                None => progress.await,
                Some(Send::Sent(cells, seq)) => self.write_group(cells, seq).await?,
                Some(Send::NoRoom(end)) => self.wait_for_room(end).await?,
            }
        }
    }

    /// Takes every queued entry into a group (under the writer's lock): seals its cells and
    /// reserves their place in the ring; the caller writes them.
    fn send(&self, w: &mut Writer, n: u64) -> Result<Send> {
        let batch = std::mem::take(&mut self.queue.lock().pending);
        let Some(&(last, _)) = batch.last() else {
            return Err(GatewayError::Config(format!(
                "store-side log: entry {n} was never queued"
            )));
        };
        let payload = {
            use bincode::Options;
            bincode_opts().serialize(&batch).map_err(|e| GatewayError::Corrupt(e.to_string()))?
        };
        let n_cells = payload.len().div_ceil(PAYLOAD).max(1) as u64;
        if n_cells > self.cells / 2 {
            return Err(GatewayError::Config(format!(
                "one group of the store-side log needs {n_cells} cells, more than half its ring \
                 of {}: a larger ring is needed",
                self.cells
            )));
        }
        let end = w.next_seq + n_cells;
        if end > w.reusable_from() + self.cells {
            // No room until a store checkpoint covers the oldest cells: give the entries back
            // and wait without holding the writer (the checkpoint needs it).
            self.queue.lock().pending.splice(0..0, batch);
            return Ok(Send::NoRoom(end));
        }
        let through = w.groups.iter().find(|g| !g.done).map_or(w.next_seq, |g| g.seq);
        let first_entry = batch[0].0;
        let group = Group {
            first_entry,
            end_entry: last + 1,
            seq: w.next_seq,
            cells: n_cells,
            prev: w.prev,
            done: false,
        };
        let mut cells = Vec::with_capacity(n_cells as usize);
        let mut prev = w.prev;
        for (i, chunk) in payload.chunks(PAYLOAD).enumerate() {
            let seq = w.next_seq + i as u64;
            let mut plain = Vec::with_capacity(CHUNK);
            plain.extend_from_slice(&seq.to_le_bytes());
            plain.extend_from_slice(&self.generation.to_le_bytes());
            plain.extend_from_slice(&prev);
            plain.push(HAS_THROUGH | if i as u64 + 1 == n_cells { LAST } else { 0 });
            plain.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
            plain.extend_from_slice(&through.to_le_bytes());
            plain.extend_from_slice(chunk);
            plain.resize(CHUNK, 0);
            prev = digest(&prev, &plain);
            let cell = seq % self.cells;
            let sealed = self
                .sealer
                .seal(&CellAd { cell, version: seq, segment: 0 }, &plain)
                .map_err(|e| GatewayError::Corrupt(e.to_string()))?;
            cells.push((CellId(cell), sealed));
        }
        w.next_seq = end;
        w.prev = prev;
        w.sent_entries = last + 1;
        w.groups.push_back(group);
        Ok(Send::Sent(cells, group.seq))
    }

    /// Queues `entry` and waits until it is durable.
    pub async fn append(&self, entry: Entry) -> Result<()> {
        let n = self.enqueue(entry);
        self.durable(n).await
    }

    /// Writes and flushes the cells of the group starting at cell `seq`, then acknowledges
    /// every group done in order (recording it in the anchor first).
    async fn write_group(&self, cells: Vec<(CellId, Vec<u8>)>, seq: u64) -> Result<()> {
        let n_cells = cells.len() as u64;
        let store_err = |e: blindfold_store::StoreError| {
            GatewayError::Config(format!("writing the store-side log: {e}"))
        };
        let written = if self.withheld.load(Ordering::SeqCst) {
            Err(GatewayError::Config("the store did not take the log's write (a test)".into()))
        } else {
            async {
                self.ring.write(cells).await.map_err(store_err)?;
                self.ring.flush().await.map_err(store_err)
            }
            .await
        };
        if let Err(e) = written {
            *self.failed.lock() = Some(e.to_string());
            tracing::error!(error = %e, "the store-side log could not be written; refusing further writes");
            self.progress.notify_waiters();
            return Err(e);
        }
        self.appends.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(n_cells * (CHUNK + CellSealer::OVERHEAD) as u64, Ordering::Relaxed);
        {
            let mut w = self.writer.lock();
            if let Some(g) = w.groups.iter_mut().find(|g| g.seq == seq) {
                g.done = true;
            }
            // Every group done in order is durable.
            loop {
                let at = w.durable_seq;
                let Some(g) = w.groups.iter().find(|g| g.seq == at && g.done).copied() else {
                    break;
                };
                w.durable_seq += g.cells;
                w.durable_entries = g.end_entry;
            }
            let since_engine = w.next_seq - w.checkpointed_from.max(w.engine_checkpointed_at);
            if since_engine > engine_checkpoint_at(self.cells) {
                // The engine first: its checkpoint replaces the records a store checkpoint
                // would otherwise carry, and the store checkpoint follows it.
                self.want_checkpoint.store(true, Ordering::Relaxed);
            }
            if w.next_seq - w.checkpointed_from > store_checkpoint_at(self.cells) {
                self.wake.notify_one();
            }
        }
        let acknowledged = self.acknowledge().await;
        // Room may have been freed (a done group no longer holds the oldest reusable cell).
        self.room.notify_waiters();
        self.progress.notify_waiters();
        acknowledged
    }

    /// Makes every entry of the groups done in order count as durable, recording their number
    /// in the anchor first.
    async fn acknowledge(&self) -> Result<()> {
        let _order = self.acknowledging.lock().await;
        let entries = self.writer.lock().durable_entries;
        if entries <= self.durable.load(Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(anchor) = &self.anchor {
            let record = crate::anchor::AnchorRecord {
                entries,
                generation: self.generation,
                written_ns: crate::anchor::now_ns(),
            };
            if let Err(e) = anchor.write(record).await {
                // The group is in the store, but acknowledging it unrecorded would let a store
                // that drops it go unnoticed.
                *self.failed.lock() = Some(e.to_string());
                tracing::error!(error = %e, "the anchor could not be written; refusing further writes");
                return Err(e);
            }
        }
        self.durable.fetch_max(entries, Ordering::SeqCst);
        if let Some(feed) = &self.feed {
            feed.store_holds(entries);
        }
        Ok(())
    }

    async fn wait_for_room(&self, end: u64) -> Result<()> {
        let deadline = tokio::time::Instant::now() + ROOM_WAIT;
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            if end <= self.writer.lock().reusable_from() + self.cells {
                return Ok(());
            }
            self.due();
            if tokio::time::timeout_at(deadline, room).await.is_err() {
                return Err(GatewayError::Config(format!(
                    "the store-side log is full ({} cells) and no store checkpoint freed room \
                     within {} s: writes wait for the next one",
                    self.cells,
                    ROOM_WAIT.as_secs()
                )));
            }
        }
    }

    /// Stops the log for good: nothing more is acknowledged (the gateway lost its lease).
    pub fn fence(&self, why: String) {
        {
            let mut failed = self.failed.lock();
            if failed.is_none() {
                tracing::error!("{why}");
                self.gate.shut(why.clone());
                *failed = Some(why);
            }
        }
        self.progress.notify_waiters();
    }

    /// Stops the log at a clean stop: as [`StoreLog::fence`], said as the news it is (an
    /// operator must not find an error in the log of every clean stop).
    pub fn close(&self, why: String) {
        {
            let mut failed = self.failed.lock();
            if failed.is_none() {
                tracing::info!("{why}");
                self.gate.shut(why.clone());
                *failed = Some(why);
            }
        }
        self.progress.notify_waiters();
    }

    /// The lease generation this log's cells carry.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Asks the checkpointer for a store checkpoint.
    fn due(&self) {
        self.checkpoint_due.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    /// Whether a store checkpoint is due: the ring is past five eighths full since the last
    /// one (the engine did not checkpoint in time), or (cleared by asking) the engine
    /// checkpointed or an append waited for room. The checkpointer asks when woken, so that a
    /// wake-up left over from before its last checkpoint does not write another at once.
    pub fn take_checkpoint_due(&self) -> bool {
        let latched = self.checkpoint_due.swap(false, Ordering::SeqCst);
        let w = self.writer.lock();
        latched || w.next_seq - w.checkpointed_from > store_checkpoint_at(self.cells)
    }

    /// True when the engine should checkpoint: its frames kept for the store checkpoint passed
    /// [`TAIL_LIMIT`], or the ring passed half full since the last store checkpoint. The store
    /// checkpoint that follows the engine's then carries that checkpoint and a short tail of
    /// records, not half a ring of them.
    pub fn engine_checkpoint_wanted(&self) -> bool {
        self.want_checkpoint.load(Ordering::Relaxed)
    }

    /// Captures what a store checkpoint at the current position holds of the log. Call with
    /// the directory's lock held and its read transaction begun, so that the directory read
    /// afterwards holds exactly the operations of the entries before the captured position.
    /// The last item says whether reads may go ahead of the store there on a standby's word
    /// ([`crate::feed`]): the checkpoint must say so, and the session's [`Entry::Standby`] is
    /// queued again as the first entry after it, so that the log after the checkpoint names the
    /// session. The engine's checkpoint comes shared: copy it once the directory's lock is
    /// let go.
    pub fn capture(&self) -> (u64, Arc<Vec<u8>>, Vec<u8>, bool) {
        let mut q = self.queue.lock();
        let captured = (q.next_entry, Arc::clone(&q.engine.checkpoint), q.engine.log.clone());
        let on = q.standby.is_some();
        if on {
            let session = q.standby;
            self.enqueue_locked(&mut q, Entry::Standby(session));
        }
        (captured.0, captured.1, captured.2, on)
    }

    /// After [`StoreLog::capture`] at `next_entry`: where the log continues it. Entries before
    /// it that are not written yet need not be: the checkpoint holds what they record (if a
    /// crash loses them, the checkpoint holds more than was acknowledged, never less), and
    /// the group that will hold them is read from, skipping them.
    pub async fn point(&self, next_entry: u64, redo_log: Vec<u8>) -> Result<JournalPoint> {
        let w = self.writer.lock();
        // The group holding `next_entry`, if sent (written or in flight); else the next one
        // will.
        let holding = w
            .groups
            .iter()
            .rev()
            .find(|g| g.first_entry <= next_entry && next_entry < g.end_entry)
            .copied();
        let (read_from, chain) = match holding {
            Some(g) => (g.seq, g.prev),
            None => (w.next_seq, w.prev),
        };
        Ok(JournalPoint {
            read_from,
            chain,
            next_entry,
            cells: self.cells,
            generation: self.generation,
            redo_log,
        })
    }

    /// A store checkpoint holding `point` is durable: the cells before it may be reused.
    pub async fn checkpoint_written(&self, point: &JournalPoint) {
        {
            let mut w = self.writer.lock();
            // Groups still in flight stay: they hold the oldest cell that may not be reused.
            while w.groups.front().is_some_and(|g| g.seq < point.read_from && g.done) {
                w.groups.pop_front();
            }
            w.checkpointed_from = w.checkpointed_from.max(point.read_from);
        }
        self.room.notify_waiters();
    }
}

#[async_trait::async_trait]
impl blindfold_proxy::LogMirror for StoreLog {
    fn queue(&self, frames: Arc<Vec<Vec<u8>>>) -> u64 {
        let frames = Arc::try_unwrap(frames).unwrap_or_else(|a| (*a).clone());
        self.enqueue(Entry::Engine(frames))
    }

    async fn durable(&self, ticket: u64) -> blindfold_proxy::Result<()> {
        StoreLog::durable(self, ticket)
            .await
            .map_err(|e| blindfold_proxy::ProxyError::State(e.to_string()))
    }

    async fn checkpointed(&self, checkpoint: Vec<u8>, log: Vec<u8>) -> blindfold_proxy::Result<()> {
        {
            let mut q = self.queue.lock();
            q.engine = EngineBase { checkpoint: Arc::new(checkpoint), log };
        }
        {
            let mut w = self.writer.lock();
            w.engine_checkpointed_at = w.next_seq;
        }
        self.want_checkpoint.store(false, Ordering::Relaxed);
        // A store checkpoint now lets the ring drop everything before it.
        self.due();
        Ok(())
    }

    fn wants_checkpoint(&self) -> bool {
        self.engine_checkpoint_wanted()
    }

    fn reads_wait(&self) -> bool {
        !self.reads_ahead
    }

    fn linger(&self) -> Option<Duration> {
        let standby = self.feed.as_ref().is_some_and(|f| f.standby_on());
        (self.reads_ahead || standby).then_some(LINGER)
    }

    async fn readable(&self, ticket: u64) -> blindfold_proxy::Result<()> {
        let Some(feed) = &self.feed else {
            return blindfold_proxy::LogMirror::durable(self, ticket).await;
        };
        // The record's write to the store is under way, or will be within LINGER (the caller
        // scheduled it): whichever of the store and the standby holds it first lets the read
        // go. Without a standby whose word counts, the read waits for the store: the write
        // starts now if it had not.
        loop {
            let progress = self.progress.notified();
            tokio::pin!(progress);
            progress.as_mut().enable();
            let acked = feed.acked();
            tokio::pin!(acked);
            acked.as_mut().enable();
            if self.durable.load(Ordering::SeqCst) > ticket || feed.standby_holds(ticket) {
                return Ok(());
            }
            // (A store that will not take the record fails this; while a standby follows, it
            // may still hold the record: it answers or is dropped within the feed's silence
            // limit, which rings `acked`.)
            if !feed.standby_on() {
                return blindfold_proxy::LogMirror::durable(self, ticket).await;
            }
            tokio::select! {
                _ = progress => {}
                _ = acked => {}
            }
        }
    }
}

/// A cell's header (see the module documentation).
struct Header {
    gen: u64,
    named: [u8; 32],
    last: bool,
    len: usize,
    /// Where the payload starts.
    body: usize,
    through: Option<u64>,
}

fn parse_header(plain: &[u8], s: u64) -> Result<Header> {
    let malformed = || GatewayError::Corrupt(format!("store-side log cell {s} is malformed"));
    if plain.len() < HEADER {
        return Err(malformed());
    }
    let u64_at = |at: usize| u64::from_le_bytes(plain[at..at + 8].try_into().expect("8 bytes"));
    let flags = plain[48];
    let len = u32::from_le_bytes(plain[49..53].try_into().expect("4 bytes")) as usize;
    let (body, through) = if flags & HAS_THROUGH != 0 {
        (HEADER, Some(u64_at(OLD_HEADER)))
    } else {
        (OLD_HEADER, None)
    };
    if u64_at(0) != s || flags & !(LAST | HAS_THROUGH) != 0 || body + len > CHUNK {
        return Err(malformed());
    }
    Ok(Header {
        gen: u64_at(8),
        named: plain[16..48].try_into().expect("32 bytes"),
        last: flags & LAST != 0,
        len,
        body,
        through,
    })
}

/// Reads the log after `point` from `ring`, in order, handing each entry numbered from
/// `point.next_entry` on to `each`; a group cut short at the end (a crash mid-write, never
/// acknowledged) is dropped. Reads at most 64 cells at a time. Returns the entries handed on.
///
/// Errors: a cell that does not open while a later one does (the store altered, dropped or
/// swapped a cell in the middle of the log), a broken chain of digests (cells spliced from
/// another timeline), a generation going down (a fenced gateway's late write).
pub async fn replay(
    ring: &dyn Store,
    key: &MasterKey,
    point: &JournalPoint,
    mut each: impl FnMut(u64, Entry) -> Result<()>,
) -> Result<u64> {
    use bincode::Options;
    let sealer = sealer(key);
    let cells = ring.geometry().cell_count();
    if cells != point.cells {
        return Err(GatewayError::Corrupt(format!(
            "the store-side log has {cells} cells where the checkpoint recorded {}",
            point.cells
        )));
    }
    let mut seq = point.read_from;
    let mut prev = point.chain;
    let mut generation = 0u64;
    let mut group = Vec::new();
    let mut handed = 0u64;
    let mut expected = point.next_entry;
    let store_err = |e: blindfold_store::StoreError| {
        GatewayError::Config(format!("reading the store-side log: {e}"))
    };
    'outer: loop {
        let batch: Vec<u64> = (seq..seq + 64).collect();
        let ids: Vec<CellId> = batch.iter().map(|s| CellId(s % cells)).collect();
        let mut fetched = ring.read(&ids).await.map_err(store_err)?;
        for (i, &s) in batch.iter().enumerate() {
            let buf = &mut fetched[i];
            let ad = CellAd { cell: s % cells, version: s, segment: 0 };
            let Ok(plain) = sealer.open_in_place(&ad, buf) else {
                // The end of the log, unless a cell after it was sent once this one was in
                // the store.
                let ahead: Vec<u64> = (s + 1..s + 1 + LOOK_AHEAD.min(cells - 1)).collect();
                let ids: Vec<CellId> = ahead.iter().map(|l| CellId(l % cells)).collect();
                let mut later_cells = ring.read(&ids).await.map_err(store_err)?;
                for (b, &later) in later_cells.iter_mut().zip(&ahead) {
                    let ad = CellAd { cell: later % cells, version: later, segment: 0 };
                    let Ok(p) = sealer.open_in_place(&ad, b) else { continue };
                    // Cells from before groups were pipelined were sent once every earlier
                    // cell was in the store.
                    let through = parse_header(p, later)?.through.unwrap_or(later);
                    if through > s {
                        return Err(GatewayError::Corrupt(format!(
                            "the store-side log's cell {s} is missing or altered while cell \
                             {later}, sent after it was in the store, is intact: the store \
                             tampered with the log"
                        )));
                    }
                }
                break 'outer;
            };
            let Header { gen, named, last, len, body, .. } = parse_header(plain, s)?;
            if named != prev {
                return Err(GatewayError::Corrupt(format!(
                    "the store-side log's cell {s} does not follow the one before it (cells \
                     spliced from another timeline, or reordered)"
                )));
            }
            if gen < generation {
                return Err(GatewayError::Corrupt(format!(
                    "the store-side log's cell {s} was written by lease generation {gen} after \
                     generation {generation}: a fenced gateway's late write"
                )));
            }
            generation = gen;
            prev = digest(&prev, plain);
            group.extend_from_slice(&plain[body..body + len]);
            seq = s + 1;
            if last {
                let entries: Vec<(u64, Entry)> = bincode_opts()
                    .with_limit(group.len() as u64)
                    .deserialize(&group)
                    .map_err(|e| {
                        GatewayError::Corrupt(format!("store-side log group before cell {s}: {e}"))
                    })?;
                group.clear();
                for (n, entry) in entries {
                    if n < point.next_entry {
                        continue;
                    }
                    if n != expected {
                        return Err(GatewayError::Corrupt(format!(
                            "the store-side log skips from entry {expected} to {n}"
                        )));
                    }
                    expected += 1;
                    each(n, entry)?;
                    handed += 1;
                }
            }
        }
    }
    Ok(handed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use blindfold_store::MemoryStore;

    fn key() -> MasterKey {
        MasterKey::from_bytes([7; 32])
    }

    fn ring(cells: u64) -> Arc<dyn Store> {
        Arc::new(MemoryStore::new(geometry(cells).unwrap()))
    }

    fn fresh(ring: &Arc<dyn Store>) -> StoreLog {
        StoreLog::new(Arc::clone(ring), &key(), 0, 0, 1, Vec::new(), Vec::new())
    }

    fn frame(i: u64, len: usize) -> Entry {
        Entry::Engine(vec![vec![(i % 251) as u8; len]])
    }

    /// [`Entry`] as it was encoded before its byte strings were encoded whole.
    #[derive(Serialize, Deserialize)]
    enum ByteByByte {
        Engine(Vec<Vec<u8>>),
        Directory(Vec<u8>),
        Standby(Option<u64>),
    }

    /// Logs written before byte strings were encoded whole read as they did, and new ones read
    /// with the old decoding: the bytes are the same.
    #[test]
    fn entries_encode_the_same_bytes_as_when_encoded_byte_by_byte() {
        use bincode::Options;
        let frames = vec![vec![1, 2, 3], Vec::new(), vec![0xA5; 70_000]];
        let new = vec![
            (1u64, Entry::Engine(frames.clone())),
            (2, Entry::Directory(vec![7; 300])),
            (3, Entry::Standby(Some(9))),
        ];
        let old = vec![
            (1u64, ByteByByte::Engine(frames.clone())),
            (2, ByteByByte::Directory(vec![7; 300])),
            (3, ByteByByte::Standby(Some(9))),
        ];
        let new_bytes = bincode_opts().serialize(&new).unwrap();
        let old_bytes = bincode_opts().serialize(&old).unwrap();
        assert_eq!(new_bytes, old_bytes);
        let back: Vec<(u64, Entry)> = bincode_opts().deserialize(&old_bytes).unwrap();
        assert!(matches!(&back[0].1, Entry::Engine(f) if *f == frames));
        assert!(matches!(&back[1].1, Entry::Directory(d) if *d == vec![7; 300]));
        let again: Vec<(u64, ByteByByte)> = bincode_opts().deserialize(&new_bytes).unwrap();
        assert!(matches!(&again[0].1, ByteByByte::Engine(f) if *f == frames));
    }

    async fn read_all(ring: &dyn Store, point: &JournalPoint) -> Result<Vec<(u64, usize)>> {
        let mut out = Vec::new();
        replay(ring, &key(), point, |n, e| {
            let len = match e {
                Entry::Engine(f) => f[0].len(),
                Entry::Directory(_) | Entry::Standby(_) => 0,
            };
            out.push((n, len));
            Ok(())
        })
        .await?;
        Ok(out)
    }

    async fn start_point(log: &StoreLog) -> JournalPoint {
        let (n, _, redo, _) = log.capture();
        log.point(n, redo).await.unwrap()
    }

    /// The engine is asked to checkpoint only once 64 MiB of its records wait for the next
    /// store checkpoint (at 16 MiB it checkpointed every fifty or so PUTs), the request ends
    /// with its checkpoint, and a new ring's half, at which it is asked whatever its records,
    /// holds such a tail.
    #[tokio::test]
    async fn the_engine_is_asked_to_checkpoint_past_64_mib_of_records() {
        use blindfold_proxy::LogMirror as _;
        let log = fresh(&ring(64));
        let mib = |i: u64| frame(i, 1 << 20);
        for i in 0..48 {
            log.enqueue(mib(i));
        }
        assert!(!log.wants_checkpoint(), "asked for a checkpoint with 48 MiB of records");
        for i in 48..65 {
            log.enqueue(mib(i));
        }
        assert!(log.wants_checkpoint(), "not asked with 65 MiB of records");
        log.checkpointed(Vec::new(), Vec::new()).await.unwrap();
        assert!(!log.wants_checkpoint(), "still asked after the engine's checkpoint");
        assert!(DEFAULT_CELLS * CHUNK as u64 / 2 >= TAIL_LIMIT as u64);
    }

    /// The engine is asked to checkpoint once half the ring is used since the last store
    /// checkpoint, however few its records, and not again until as much more is used: the
    /// store checkpoint that follows the engine's carries a short tail of records, not half a
    /// ring of them. A store checkpoint is due once each time the engine checkpoints, and
    /// while the ring is past five eighths full; asking is what a wake-up left over from before
    /// the last one finds.
    #[tokio::test]
    async fn the_engine_checkpoints_before_the_store_and_a_stale_wake_writes_nothing() {
        use blindfold_proxy::LogMirror as _;
        let log = fresh(&ring(64));
        // One cell per group.
        for i in 0..32 {
            log.append(frame(i, 1000)).await.unwrap();
        }
        assert!(!log.wants_checkpoint(), "asked with 32 of 64 cells used");
        assert!(!log.take_checkpoint_due(), "a store checkpoint due with 32 of 64 cells used");
        log.append(frame(32, 1000)).await.unwrap();
        assert!(log.wants_checkpoint(), "not asked with 33 of 64 cells used (few records)");
        assert!(!log.take_checkpoint_due());
        log.checkpointed(Vec::new(), Vec::new()).await.unwrap();
        assert!(!log.wants_checkpoint(), "still asked after the engine's checkpoint");
        assert!(log.take_checkpoint_due(), "no store checkpoint due after the engine's");
        assert!(!log.take_checkpoint_due(), "due twice for one engine checkpoint");
        for i in 33..40 {
            log.append(frame(i, 1000)).await.unwrap();
        }
        assert!(!log.wants_checkpoint(), "asked again 7 cells after its checkpoint");
        assert!(!log.take_checkpoint_due(), "due with 40 of 64 cells used");
        log.append(frame(40, 1000)).await.unwrap();
        assert!(log.take_checkpoint_due(), "not due with 41 of 64 cells used");
        assert!(log.take_checkpoint_due(), "no longer due while the ring is past 5/8");
        let (n, _, redo, _) = log.capture();
        let point = log.point(n, redo).await.unwrap();
        log.checkpoint_written(&point).await;
        assert!(!log.take_checkpoint_due(), "still due after the store checkpoint");
    }

    #[tokio::test]
    async fn every_acknowledged_entry_reads_back_in_order() {
        let r = ring(64);
        let log = fresh(&r);
        let point = start_point(&log).await;
        for i in 0..10u64 {
            log.append(frame(i, 100 + i as usize * 20_000)).await.unwrap();
        }
        let got = read_all(&*r, &point).await.unwrap();
        assert_eq!(got.len(), 10);
        for (i, (n, len)) in got.into_iter().enumerate() {
            assert_eq!(n, i as u64);
            assert_eq!(len, 100 + i * 20_000);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_share_group_commits() {
        // A store 5 ms away: appends arriving while a group is written join the next one.
        let link = blindfold_store::LinkConfig::new(Duration::from_millis(5), None, None).unwrap();
        let r: Arc<dyn Store> = Arc::new(blindfold_store::LatencyStore::new(
            MemoryStore::new(geometry(64).unwrap()),
            link,
        ));
        let log = Arc::new(fresh(&r));
        let point = start_point(&log).await;
        let tasks: Vec<_> = (0..32u64)
            .map(|i| {
                let log = Arc::clone(&log);
                tokio::spawn(async move { log.append(frame(i, 50)).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        let (appends, _) = log.counts();
        assert!(appends < 32, "{appends} group commits for 32 concurrent appends");
        assert_eq!(read_all(&*r, &point).await.unwrap().len(), 32);
    }

    #[tokio::test]
    async fn a_tampered_cell_in_the_middle_is_an_error_not_an_end() {
        let r = ring(64);
        let log = fresh(&r);
        let point = start_point(&log).await;
        for i in 0..6u64 {
            log.append(frame(i, 10)).await.unwrap();
        }
        let mut cell = r.read(&[CellId(2)]).await.unwrap().pop().unwrap();
        cell[40] ^= 1;
        r.write(vec![(CellId(2), cell)]).await.unwrap();
        let e = read_all(&*r, &point).await.unwrap_err().to_string();
        assert!(e.contains("tampered"), "{e}");
    }

    #[tokio::test]
    async fn a_group_cut_short_in_its_middle_reads_as_the_shorter_log() {
        // A store writes a group's cells in any order (S3: one PUT each, in parallel): a crash
        // can leave a later cell of the last group written and an earlier one not. That group
        // was never acknowledged; the log ends before it.
        let r = ring(64);
        let log = fresh(&r);
        let point = start_point(&log).await;
        for i in 0..3u64 {
            log.append(frame(i, 10)).await.unwrap();
        }
        log.append(frame(3, 3 * PAYLOAD - 100)).await.unwrap();
        assert_eq!(read_all(&*r, &point).await.unwrap().len(), 4);
        r.write(vec![(CellId(3), vec![0; r.geometry().cell_size() as usize])]).await.unwrap();
        assert_eq!(read_all(&*r, &point).await.unwrap().len(), 3);
    }

    #[tokio::test]
    async fn a_dropped_cell_that_was_durable_before_a_later_group_is_tampering() {
        // Cell 1 was durable when cell 3's group was sent: a hole there is the store's doing,
        // even if it is the last cell of the batch read (the next cells are looked at too).
        let r = ring(200);
        let log = fresh(&r);
        let point = start_point(&log).await;
        for i in 0..70u64 {
            log.append(frame(i, 10)).await.unwrap();
        }
        r.write(vec![(CellId(63), vec![0; r.geometry().cell_size() as usize])]).await.unwrap();
        let e = read_all(&*r, &point).await.unwrap_err().to_string();
        assert!(e.contains("tampered"), "{e}");
    }

    /// A store that holds back writes to cell 0 until told.
    #[derive(Debug)]
    struct Held {
        inner: MemoryStore,
        release: tokio::sync::Semaphore,
    }

    #[async_trait::async_trait]
    impl Store for Held {
        fn geometry(&self) -> Geometry {
            self.inner.geometry()
        }
        async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
            self.inner.read(cells).await
        }
        async fn read_ranges(
            &self,
            ranges: &[blindfold_store::ByteRange],
        ) -> blindfold_store::Result<Vec<Vec<u8>>> {
            self.inner.read_ranges(ranges).await
        }
        async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
            if cells.iter().any(|(c, _)| c.0 == 0) {
                self.release.acquire().await.unwrap().forget();
            }
            self.inner.write(cells).await
        }
        async fn flush(&self) -> blindfold_store::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn groups_are_written_together_but_acknowledged_in_order() {
        let held = Arc::new(Held {
            inner: MemoryStore::new(geometry(64).unwrap()),
            release: tokio::sync::Semaphore::new(0),
        });
        let r: Arc<dyn Store> = Arc::clone(&held) as Arc<dyn Store>;
        let log = Arc::new(fresh(&r));
        let point = start_point(&log).await;
        let first = {
            let log = Arc::clone(&log);
            tokio::spawn(async move { log.append(frame(0, 10)).await })
        };
        while log.writer.lock().groups.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let second = {
            let log = Arc::clone(&log);
            tokio::spawn(async move { log.append(frame(1, 10)).await })
        };
        // The second group is written while the first is held back...
        while log.counts().0 < 1 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(log.writer.lock().groups.len(), 2, "two groups sent at once");
        tokio::time::sleep(Duration::from_millis(50)).await;
        // ...but not acknowledged before it.
        assert!(!second.is_finished(), "entry 1 acknowledged while entry 0 was not durable");
        // A crash now: the hole at cell 0 ends the log; the intact cell 1 after it was sent
        // before cell 0 was in the store, so it is dropped, not read as tampering.
        assert_eq!(read_all(&*r, &point).await.unwrap(), vec![]);
        held.release.add_permits(1);
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        assert_eq!(read_all(&*r, &point).await.unwrap(), vec![(0, 10), (1, 10)]);
    }

    #[tokio::test]
    async fn reordered_or_replayed_cells_are_refused() {
        let r = ring(64);
        let log = fresh(&r);
        let point = start_point(&log).await;
        for i in 0..6u64 {
            log.append(frame(i, 10)).await.unwrap();
        }
        // Swapping two cells: neither opens at the other's place.
        let cells = r.read(&[CellId(1), CellId(3)]).await.unwrap();
        r.write(vec![(CellId(1), cells[1].clone()), (CellId(3), cells[0].clone())]).await.unwrap();
        assert!(read_all(&*r, &point).await.is_err());
    }

    #[tokio::test]
    async fn a_cut_tail_reads_as_the_shorter_log() {
        // What only an anchor can catch: the store drops the newest cells.
        let r = ring(64);
        let log = fresh(&r);
        let point = start_point(&log).await;
        for i in 0..6u64 {
            log.append(frame(i, 10)).await.unwrap();
        }
        r.write(vec![(CellId(5), vec![0; r.geometry().cell_size() as usize])]).await.unwrap();
        assert_eq!(read_all(&*r, &point).await.unwrap().len(), 5);
    }

    #[tokio::test]
    async fn a_spliced_timeline_is_refused() {
        // Two logs written from the same point (two gateways recovered from one checkpoint):
        // cells of the second cannot continue the first.
        let r1 = ring(64);
        let r2 = ring(64);
        let a = fresh(&r1);
        let b = fresh(&r2);
        let point = start_point(&a).await;
        for i in 0..4u64 {
            a.append(frame(i, 10)).await.unwrap();
            b.append(frame(i + 100, 10)).await.unwrap();
        }
        let c2 = r2.read(&[CellId(2)]).await.unwrap().pop().unwrap();
        r1.write(vec![(CellId(2), c2)]).await.unwrap();
        let e = read_all(&*r1, &point).await.unwrap_err().to_string();
        assert!(e.contains("does not follow"), "{e}");
    }

    #[tokio::test]
    async fn the_ring_waits_for_a_checkpoint_and_reuses_what_it_covers() {
        let r = ring(8);
        let log = Arc::new(fresh(&r));
        for i in 0..4u64 {
            log.append(frame(i, 10)).await.unwrap();
        }
        // Full after four more; a checkpoint at entry 6 frees the first cells.
        let writer = {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                for i in 4..10u64 {
                    log.append(frame(i, 10)).await.unwrap();
                }
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!writer.is_finished(), "the ring of 8 cells took 10 groups without a checkpoint");
        let (n, _, redo, _) = log.capture();
        let point = log.point(n, redo).await.unwrap();
        log.checkpoint_written(&point).await;
        writer.await.unwrap();
        let got = read_all(&*r, &point).await.unwrap();
        assert_eq!(got.first().map(|g| g.0), Some(n));
        assert_eq!(got.last().map(|g| g.0), Some(9));
    }
}
