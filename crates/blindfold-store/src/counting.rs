//! [`CountingStore`]: counts requests, cells, bytes and round trips, the cost measures every
//! ORAM paper reports (bandwidth blow-up, round trips per access).

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{ByteRange, CellId, Geometry, Result, Store};

/// Totals seen by a [`CountingStore`] since it was made or last [reset](CountingStore::reset).
///
/// Request, cell and round-trip counts are taken when a call is issued, whether or not it
/// succeeds; bytes are the payload bytes that actually crossed the link: written bytes when a
/// write is issued, read bytes only when a read returns them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Calls to [`Store::read`].
    pub read_requests: u64,
    /// Cells asked for by [`Store::read`], duplicates included.
    pub cells_read: u64,
    /// Bytes returned by [`Store::read`].
    pub bytes_read: u64,
    /// Calls to [`Store::read_ranges`].
    pub range_requests: u64,
    /// Ranges asked for by [`Store::read_ranges`].
    pub ranges_read: u64,
    /// Bytes returned by [`Store::read_ranges`].
    pub range_bytes_read: u64,
    /// Calls to [`Store::write`].
    pub write_requests: u64,
    /// Cells sent by [`Store::write`], duplicates included.
    pub cells_written: u64,
    /// Bytes sent by [`Store::write`].
    pub bytes_written: u64,
    /// Calls to [`Store::flush`].
    pub flushes: u64,
    /// Calls to [`XorStore::read_xor`](crate::XorStore::read_xor).
    #[serde(default)]
    pub xor_requests: u64,
    /// Ranges XORed together by the store for [`XorStore::read_xor`](crate::XorStore::read_xor).
    #[serde(default)]
    pub xor_ranges: u64,
    /// Bytes returned by [`XorStore::read_xor`](crate::XorStore::read_xor) (one range's worth
    /// per call).
    #[serde(default)]
    pub xor_bytes_read: u64,
    /// Calls to `SelectStore::read_select` (feature
    /// `select`).
    #[serde(default)]
    pub select_requests: u64,
    /// Calls to `SelectStore::read_select_combined`.
    #[serde(default)]
    pub select_combined_requests: u64,
    /// Calls to `SelectStore::write_select`.
    #[serde(default)]
    pub select_write_requests: u64,
    /// Bytes of the ranges the store reads on its side to answer selects of every kind (they
    /// do not cross the link).
    #[serde(default)]
    pub select_bytes_scanned: u64,
    /// Selector ciphertext bytes sent with selects of every kind (inner and outer selectors;
    /// the public key and the addresses are not counted).
    #[serde(default)]
    pub select_bytes_sent: u64,
    /// Bytes returned by `read_select` and `read_select_combined`.
    #[serde(default)]
    pub select_bytes_read: u64,
    /// Cells written by the store with the answers of `write_select`.
    #[serde(default)]
    pub select_cells_written: u64,
    /// Calls to [`TeeStore::tee_query`](crate::TeeStore::tee_query).
    #[serde(default)]
    pub tee_queries: u64,
    /// Cells the host reads for TEE queries (they do not cross the link).
    #[serde(default)]
    pub tee_query_cells: u64,
    /// Calls to [`TeeStore::tee_evict`](crate::TeeStore::tee_evict): eviction rounds.
    #[serde(default)]
    pub tee_rounds: u64,
    /// Cells the host reads for eviction rounds (they do not cross the link).
    #[serde(default)]
    pub tee_cells_read: u64,
    /// Cells the host writes for eviction rounds (they do not cross the link).
    #[serde(default)]
    pub tee_cells_written: u64,
    /// Bytes sent to the host with TEE requests: tickets and incoming blocks.
    #[serde(default)]
    pub tee_bytes_sent: u64,
    /// Bytes of the answers to TEE queries.
    #[serde(default)]
    pub tee_bytes_read: u64,
    /// Calls of any kind: each one is a round trip to the store.
    pub round_trips: u64,
}

impl Counts {
    /// Bytes from the store to the caller (whole-cell, ranged, XOR and select reads, TEE
    /// answers).
    pub fn bytes_down(&self) -> u64 {
        self.bytes_read
            + self.range_bytes_read
            + self.xor_bytes_read
            + self.select_bytes_read
            + self.tee_bytes_read
    }

    /// Bytes from the caller to the store (written cells, select ciphertexts, TEE tickets and
    /// incoming blocks).
    pub fn bytes_up(&self) -> u64 {
        self.bytes_written + self.select_bytes_sent + self.tee_bytes_sent
    }

    /// What happened between `earlier` and `self` (field by field, saturating at zero).
    pub fn since(&self, earlier: &Counts) -> Counts {
        self.fieldwise(earlier, u64::saturating_sub)
    }

    /// Both counts together (field by field), e.g. across a store that was replaced.
    pub fn plus(&self, other: &Counts) -> Counts {
        self.fieldwise(other, u64::saturating_add)
    }

    fn fieldwise(&self, o: &Counts, f: fn(u64, u64) -> u64) -> Counts {
        Counts {
            read_requests: f(self.read_requests, o.read_requests),
            cells_read: f(self.cells_read, o.cells_read),
            bytes_read: f(self.bytes_read, o.bytes_read),
            range_requests: f(self.range_requests, o.range_requests),
            ranges_read: f(self.ranges_read, o.ranges_read),
            range_bytes_read: f(self.range_bytes_read, o.range_bytes_read),
            write_requests: f(self.write_requests, o.write_requests),
            cells_written: f(self.cells_written, o.cells_written),
            bytes_written: f(self.bytes_written, o.bytes_written),
            flushes: f(self.flushes, o.flushes),
            xor_requests: f(self.xor_requests, o.xor_requests),
            xor_ranges: f(self.xor_ranges, o.xor_ranges),
            xor_bytes_read: f(self.xor_bytes_read, o.xor_bytes_read),
            select_requests: f(self.select_requests, o.select_requests),
            select_combined_requests: f(self.select_combined_requests, o.select_combined_requests),
            select_write_requests: f(self.select_write_requests, o.select_write_requests),
            select_bytes_scanned: f(self.select_bytes_scanned, o.select_bytes_scanned),
            select_bytes_sent: f(self.select_bytes_sent, o.select_bytes_sent),
            select_bytes_read: f(self.select_bytes_read, o.select_bytes_read),
            select_cells_written: f(self.select_cells_written, o.select_cells_written),
            tee_queries: f(self.tee_queries, o.tee_queries),
            tee_query_cells: f(self.tee_query_cells, o.tee_query_cells),
            tee_rounds: f(self.tee_rounds, o.tee_rounds),
            tee_cells_read: f(self.tee_cells_read, o.tee_cells_read),
            tee_cells_written: f(self.tee_cells_written, o.tee_cells_written),
            tee_bytes_sent: f(self.tee_bytes_sent, o.tee_bytes_sent),
            tee_bytes_read: f(self.tee_bytes_read, o.tee_bytes_read),
            round_trips: f(self.round_trips, o.round_trips),
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    read_requests: AtomicU64,
    cells_read: AtomicU64,
    bytes_read: AtomicU64,
    range_requests: AtomicU64,
    ranges_read: AtomicU64,
    range_bytes_read: AtomicU64,
    write_requests: AtomicU64,
    cells_written: AtomicU64,
    bytes_written: AtomicU64,
    flushes: AtomicU64,
    xor_requests: AtomicU64,
    xor_ranges: AtomicU64,
    xor_bytes_read: AtomicU64,
    select_requests: AtomicU64,
    select_combined_requests: AtomicU64,
    select_write_requests: AtomicU64,
    select_bytes_scanned: AtomicU64,
    select_bytes_sent: AtomicU64,
    select_bytes_read: AtomicU64,
    select_cells_written: AtomicU64,
    tee_queries: AtomicU64,
    tee_query_cells: AtomicU64,
    tee_rounds: AtomicU64,
    tee_cells_read: AtomicU64,
    tee_cells_written: AtomicU64,
    tee_bytes_sent: AtomicU64,
    tee_bytes_read: AtomicU64,
    round_trips: AtomicU64,
}

/// The kind of a select request, for [`CountingStore::count_select`].
#[cfg(feature = "select")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SelectKind {
    Read,
    Combined,
    Write,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

fn payload_bytes(buffers: &[Vec<u8>]) -> u64 {
    buffers.iter().map(|b| b.len() as u64).sum()
}

/// A store that counts the requests passing through it to `S` and changes nothing else.
///
/// Counting uses relaxed atomics, so it is cheap enough to leave on in benchmarks; a
/// [`counts`](Self::counts) taken while calls are in flight may mix fields from before and
/// after one of them.
#[derive(Debug)]
pub struct CountingStore<S> {
    inner: S,
    counters: Counters,
}

impl<S: Store> CountingStore<S> {
    /// Wraps `inner` with all counts at zero.
    pub fn new(inner: S) -> Self {
        Self { inner, counters: Counters::default() }
    }

    /// The totals so far.
    pub fn counts(&self) -> Counts {
        let c = &self.counters;
        Counts {
            read_requests: get(&c.read_requests),
            cells_read: get(&c.cells_read),
            bytes_read: get(&c.bytes_read),
            range_requests: get(&c.range_requests),
            ranges_read: get(&c.ranges_read),
            range_bytes_read: get(&c.range_bytes_read),
            write_requests: get(&c.write_requests),
            cells_written: get(&c.cells_written),
            bytes_written: get(&c.bytes_written),
            flushes: get(&c.flushes),
            xor_requests: get(&c.xor_requests),
            xor_ranges: get(&c.xor_ranges),
            xor_bytes_read: get(&c.xor_bytes_read),
            select_requests: get(&c.select_requests),
            select_combined_requests: get(&c.select_combined_requests),
            select_write_requests: get(&c.select_write_requests),
            select_bytes_scanned: get(&c.select_bytes_scanned),
            select_bytes_sent: get(&c.select_bytes_sent),
            select_bytes_read: get(&c.select_bytes_read),
            select_cells_written: get(&c.select_cells_written),
            tee_queries: get(&c.tee_queries),
            tee_query_cells: get(&c.tee_query_cells),
            tee_rounds: get(&c.tee_rounds),
            tee_cells_read: get(&c.tee_cells_read),
            tee_cells_written: get(&c.tee_cells_written),
            tee_bytes_sent: get(&c.tee_bytes_sent),
            tee_bytes_read: get(&c.tee_bytes_read),
            round_trips: get(&c.round_trips),
        }
    }

    /// Sets every count back to zero.
    pub fn reset(&self) {
        let c = &self.counters;
        for counter in [
            &c.read_requests,
            &c.cells_read,
            &c.bytes_read,
            &c.range_requests,
            &c.ranges_read,
            &c.range_bytes_read,
            &c.write_requests,
            &c.cells_written,
            &c.bytes_written,
            &c.flushes,
            &c.xor_requests,
            &c.xor_ranges,
            &c.xor_bytes_read,
            &c.select_requests,
            &c.select_combined_requests,
            &c.select_write_requests,
            &c.select_bytes_scanned,
            &c.select_bytes_sent,
            &c.select_bytes_read,
            &c.select_cells_written,
            &c.tee_queries,
            &c.tee_query_cells,
            &c.tee_rounds,
            &c.tee_cells_read,
            &c.tee_cells_written,
            &c.tee_bytes_sent,
            &c.tee_bytes_read,
            &c.round_trips,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Counts an XOR request of `ranges` ranges as it is issued.
    pub(crate) fn count_xor(&self, ranges: usize) {
        let c = &self.counters;
        add(&c.round_trips, 1);
        add(&c.xor_requests, 1);
        add(&c.xor_ranges, ranges as u64);
    }

    /// Counts the bytes an XOR request returned.
    pub(crate) fn count_xor_bytes(&self, bytes: usize) {
        add(&self.counters.xor_bytes_read, bytes as u64);
    }

    /// Counts a select request as it is issued: its kind, the selector bytes it sends, the
    /// range bytes the store will read, the cells it will write.
    #[cfg(feature = "select")]
    pub(crate) fn count_select(&self, kind: SelectKind, sent: u64, scanned: u64, cells: u64) {
        let c = &self.counters;
        add(&c.round_trips, 1);
        add(
            match kind {
                SelectKind::Read => &c.select_requests,
                SelectKind::Combined => &c.select_combined_requests,
                SelectKind::Write => &c.select_write_requests,
            },
            1,
        );
        add(&c.select_bytes_sent, sent);
        add(&c.select_bytes_scanned, scanned);
        add(&c.select_cells_written, cells);
    }

    /// Counts a TEE query of `cells` cells and a `ticket`-byte ticket as it is issued.
    pub(crate) fn count_tee_query(&self, cells: u64, ticket: u64) {
        let c = &self.counters;
        add(&c.round_trips, 1);
        add(&c.tee_queries, 1);
        add(&c.tee_query_cells, cells);
        add(&c.tee_bytes_sent, ticket);
    }

    /// Counts the bytes of a TEE query's answer.
    pub(crate) fn count_tee_answer(&self, bytes: u64) {
        add(&self.counters.tee_bytes_read, bytes);
    }

    /// Counts an eviction round as it is issued: the cells its host reads and writes, the
    /// bytes (incoming blocks and tickets) it sends.
    pub(crate) fn count_tee_round(&self, read: u64, written: u64, sent: u64) {
        let c = &self.counters;
        add(&c.round_trips, 1);
        add(&c.tee_rounds, 1);
        add(&c.tee_cells_read, read);
        add(&c.tee_cells_written, written);
        add(&c.tee_bytes_sent, sent);
    }

    /// Counts the bytes a select read returned.
    #[cfg(feature = "select")]
    pub(crate) fn count_select_answer(&self, bytes: usize) {
        add(&self.counters.select_bytes_read, bytes as u64);
    }

    /// Counts one write request of `cells` cells and `bytes` bytes.
    fn count_write(&self, cells: usize, bytes: usize) {
        let c = &self.counters;
        add(&c.round_trips, 1);
        add(&c.write_requests, 1);
        add(&c.cells_written, cells as u64);
        add(&c.bytes_written, bytes as u64);
    }
}

#[async_trait]
impl<S: Store> Store for CountingStore<S> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        let c = &self.counters;
        add(&c.round_trips, 1);
        add(&c.read_requests, 1);
        add(&c.cells_read, cells.len() as u64);
        let out = self.inner.read(cells).await?;
        add(&c.bytes_read, payload_bytes(&out));
        Ok(out)
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        let c = &self.counters;
        add(&c.round_trips, 1);
        add(&c.range_requests, 1);
        add(&c.ranges_read, ranges.len() as u64);
        let out = self.inner.read_ranges(ranges).await?;
        add(&c.range_bytes_read, payload_bytes(&out));
        Ok(out)
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.count_write(cells.len(), cells.iter().map(|(_, b)| b.len()).sum());
        self.inner.write(cells).await
    }

    async fn write_shared(&self, cells: Vec<(CellId, std::sync::Arc<Vec<u8>>)>) -> Result<()> {
        self.count_write(cells.len(), cells.iter().map(|(_, b)| b.len()).sum());
        self.inner.write_shared(cells).await
    }

    async fn flush(&self) -> Result<()> {
        add(&self.counters.round_trips, 1);
        add(&self.counters.flushes, 1);
        self.inner.flush().await
    }
    fn writes_may_be_retried(&self) -> bool {
        self.inner.writes_may_be_retried()
    }
}
