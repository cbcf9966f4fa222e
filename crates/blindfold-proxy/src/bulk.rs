//! Reading and writing many cells in order, with several batches in flight: commits, replays,
//! rebuilds, growths and whole-store reads (`verify`, `recover`) of every engine.

use std::collections::HashMap;
use std::sync::Arc;

use blindfold_store::{CellId, Store};

use crate::retry::{with_retry, write_sealed, RetryPolicy};
use crate::{ProxyError, Result};

const WRITE_BATCH: usize = 256;

/// Batches of cells a commit, a replay, a rebuild or a whole-store read keeps in flight at once.
const BATCHES_IN_FLIGHT: usize = 8;

/// Bytes of cells a whole-store read (verify, recover, grow) keeps in flight at most.
const READ_AHEAD_BYTES: u64 = 64 << 20;

/// Writes `cells` to the store in batches of [`WRITE_BATCH`], up to [`BATCHES_IN_FLIGHT`] of
/// them in flight at once, moving rather than copying the cells. Behind a link of round trip
/// `r` this takes about `r · ⌈n / (WRITE_BATCH · BATCHES_IN_FLIGHT)⌉` instead of
/// `r · ⌈n / WRITE_BATCH⌉`. A cell named twice is written once, with its last contents (two
/// concurrent writes of one cell could land in either order).
pub(crate) async fn write_batches(
    store: &dyn Store,
    retry: RetryPolicy,
    cells: impl IntoIterator<Item = (CellId, Vec<u8>)>,
) -> Result<()> {
    use futures::{StreamExt, TryStreamExt};
    let mut cells: Vec<(CellId, Vec<u8>)> = cells.into_iter().collect();
    let mut last: HashMap<u64, usize> = HashMap::with_capacity(cells.len());
    for (i, (c, _)) in cells.iter().enumerate() {
        last.insert(c.0, i);
    }
    if last.len() < cells.len() {
        let mut i = 0;
        cells.retain(|(c, _)| {
            let keep = last[&c.0] == i;
            i += 1;
            keep
        });
    }
    futures::stream::iter(write_batches_of(cells))
        .map(|batch| write_sealed(store, retry, batch))
        .buffer_unordered(BATCHES_IN_FLIGHT)
        .try_collect::<()>()
        .await
}

/// Reads cells `0..total` of `store` in order, `batch` at a time, with several reads in flight
/// (as many as fit in [`READ_AHEAD_BYTES`], at most [`BATCHES_IN_FLIGHT`]); yields each
/// batch's first cell and contents, in order. What `verify` and `recover` read through.
pub(crate) fn read_in_order(
    store: &dyn Store,
    retry: RetryPolicy,
    total: u64,
    batch: u64,
) -> impl futures::Stream<Item = Result<(u64, Vec<Vec<u8>>)>> + '_ {
    read_batches(store, retry, total, batch, |from, to| (from..to).map(CellId).collect())
}

/// As [`read_in_order`], for the cells `cells` (in that order): yields each batch's first
/// index into `cells` and the batch's contents.
pub(crate) fn read_listed<'a>(
    store: &'a dyn Store,
    retry: RetryPolicy,
    cells: &'a [CellId],
    batch: u64,
) -> impl futures::Stream<Item = Result<(u64, Vec<Vec<u8>>)>> + 'a {
    read_batches(store, retry, cells.len() as u64, batch, |from, to| {
        cells[from as usize..to as usize].to_vec()
    })
}

/// Reads `total` cells in batches of `batch`, batch `[from, to)` being `cells(from, to)`, in
/// order with reads ahead (see [`read_in_order`]).
fn read_batches<'a>(
    store: &'a dyn Store,
    retry: RetryPolicy,
    total: u64,
    batch: u64,
    cells: impl Fn(u64, u64) -> Vec<CellId> + Copy + 'a,
) -> impl futures::Stream<Item = Result<(u64, Vec<Vec<u8>>)>> + 'a {
    use futures::StreamExt;
    let batch = batch.max(1);
    let bytes = batch.saturating_mul(u64::from(store.geometry().cell_size()).max(1));
    let ahead = (READ_AHEAD_BYTES / bytes).clamp(1, BATCHES_IN_FLIGHT as u64) as usize;
    futures::stream::iter((0..total).step_by(batch as usize))
        .map(move |start| async move {
            let cells = cells(start, (start + batch).min(total));
            let fetched = with_retry(retry, || store.read(&cells)).await?;
            if fetched.len() != cells.len() {
                return Err(ProxyError::State(format!(
                    "the store answered {} cells for {}",
                    fetched.len(),
                    cells.len()
                )));
            }
            Ok((start, fetched))
        })
        .buffered(ahead)
}

/// `cells` cut into write batches of [`WRITE_BATCH`], in order.
fn write_batches_of<T>(mut cells: Vec<T>) -> Vec<Vec<T>> {
    let mut batches = Vec::with_capacity(cells.len().div_ceil(WRITE_BATCH));
    while cells.len() > WRITE_BATCH {
        let rest = cells.split_off(WRITE_BATCH);
        batches.push(std::mem::replace(&mut cells, rest));
    }
    batches.push(cells);
    batches
}

/// [`write_batches`] for cells shared with readers (a commit's, which the overlay still
/// serves until the commit is durable), each batch copied and written in a task of its own,
/// so a store in this process (memory, files) copies them on every core instead of one. The
/// cells must be distinct.
pub(crate) async fn write_shared_batches(
    store: &Arc<dyn Store>,
    retry: RetryPolicy,
    cells: Vec<(CellId, Arc<Vec<u8>>)>,
) -> Result<()> {
    use futures::{StreamExt, TryStreamExt};
    debug_assert!(
        cells.iter().map(|c| c.0).collect::<std::collections::HashSet<_>>().len() == cells.len(),
        "a cell named twice"
    );
    futures::stream::iter(write_batches_of(cells))
        .map(|batch| {
            let store = Arc::clone(store);
            // Shared as they are: a store that can write from a borrowed buffer copies none,
            // and a retry sends the same buffers again.
            let task = tokio::spawn(async move {
                Ok::<_, ProxyError>(with_retry(retry, || store.write_shared(batch.clone())).await?)
            });
            async move {
                task.await
                    .map_err(|e| ProxyError::State(format!("a store write task failed: {e}")))?
            }
        })
        .buffer_unordered(BATCHES_IN_FLIGHT)
        .try_collect::<()>()
        .await
}

#[cfg(test)]
mod write_batches_tests {
    //! [`write_batches`] keeps several batches in flight: every cell must still land once,
    //! with its last contents.
    use super::*;
    use blindfold_store::{Geometry, MemoryStore, RecordingStore, TraceOp};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shared_cells_land_once_each_in_batches() {
        let n = 3 * WRITE_BATCH as u64 + 5;
        let inner = Arc::new(RecordingStore::new(MemoryStore::new(Geometry::new(n, 8).unwrap())));
        let store: Arc<dyn Store> = inner.clone();
        let cells: Vec<(CellId, Arc<Vec<u8>>)> =
            (0..n).map(|c| (CellId(c), Arc::new(c.to_le_bytes().to_vec()))).collect();
        let kept = cells.clone();
        write_shared_batches(&store, RetryPolicy::default(), cells).await.unwrap();
        let all: Vec<CellId> = (0..n).map(CellId).collect();
        for (c, data) in store.read(&all).await.unwrap().iter().enumerate() {
            assert_eq!(data.as_slice(), (c as u64).to_le_bytes(), "cell {c}");
        }
        // The callers' references are untouched.
        assert!(kept.iter().all(|(c, d)| d.as_slice() == c.0.to_le_bytes()));
        let writes: Vec<_> = inner.trace().into_iter().filter(|e| e.op == TraceOp::Write).collect();
        assert_eq!(writes.len(), (n as usize).div_ceil(WRITE_BATCH));
        assert!(writes.iter().all(|w| w.cells.len() <= WRITE_BATCH));
    }

    /// The bottom of a chain of wrappers: notes which buffers reach it shared, and whether
    /// anything arrived as an owned (copied) buffer instead.
    #[derive(Debug)]
    struct Probe {
        inner: MemoryStore,
        shared: parking_lot::Mutex<Vec<usize>>,
        owned: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Store for Probe {
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
            self.owned.fetch_add(cells.len(), std::sync::atomic::Ordering::SeqCst);
            self.inner.write(cells).await
        }
        async fn write_shared(
            &self,
            cells: Vec<(CellId, Arc<Vec<u8>>)>,
        ) -> blindfold_store::Result<()> {
            self.shared.lock().extend(cells.iter().map(|(_, d)| Arc::as_ptr(d) as usize));
            self.inner.write_shared(cells).await
        }
        async fn flush(&self) -> blindfold_store::Result<()> {
            Ok(())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_commit_s_shared_cells_reach_the_store_uncopied() {
        use blindfold_store::{CountingStore, LatencyStore, LinkConfig};
        // The wrappers a commit's cells pass on their way down in the gateway (two slots per
        // cell, the counters, an emulated link, the trace), then the probe.
        let logical = Geometry::new(2 * WRITE_BATCH as u64 + 3, 8).unwrap();
        let physical = crate::slots::slotted_geometry(logical).unwrap();
        let probe = Arc::new(Probe {
            inner: MemoryStore::new(physical),
            shared: parking_lot::Mutex::new(Vec::new()),
            owned: std::sync::atomic::AtomicUsize::new(0),
        });
        let below: Arc<dyn Store> = Arc::new(CountingStore::new(LatencyStore::new(
            RecordingStore::new(Arc::clone(&probe)),
            LinkConfig::unlimited(std::time::Duration::ZERO),
        )));
        let slotted = crate::slots::SlottedStore::new(
            below,
            crate::slots::SlotMap::new(logical.cell_count()),
        )
        .unwrap();
        let store: Arc<dyn Store> = Arc::new(slotted);
        let cells: Vec<(CellId, Arc<Vec<u8>>)> = (0..logical.cell_count())
            .map(|c| (CellId(c), Arc::new(c.to_le_bytes().to_vec())))
            .collect();
        let sent: std::collections::HashSet<usize> =
            cells.iter().map(|(_, d)| Arc::as_ptr(d) as usize).collect();
        let kept = cells.clone();
        write_shared_batches(&store, RetryPolicy::default(), cells).await.unwrap();
        assert_eq!(
            probe.owned.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "cells reached the store as copies"
        );
        let arrived: std::collections::HashSet<usize> =
            probe.shared.lock().iter().copied().collect();
        assert_eq!(arrived, sent, "the store got other buffers than the ones shared");
        drop(kept);
    }

    #[tokio::test]
    async fn every_cell_lands_once_with_its_last_contents() {
        let n = 5 * WRITE_BATCH as u64 + 17;
        let store = RecordingStore::new(MemoryStore::new(Geometry::new(n, 8).unwrap()));
        let mut cells: Vec<(CellId, Vec<u8>)> =
            (0..n).map(|c| (CellId(c), c.to_le_bytes().to_vec())).collect();
        // Cell 3 again, later, with other contents: the later write must win.
        cells.push((CellId(3), 99u64.to_le_bytes().to_vec()));
        write_batches(&store, RetryPolicy::default(), cells).await.unwrap();

        let all: Vec<CellId> = (0..n).map(CellId).collect();
        let back = store.read(&all).await.unwrap();
        for (c, data) in back.iter().enumerate() {
            let want = if c == 3 { 99 } else { c as u64 };
            assert_eq!(data.as_slice(), want.to_le_bytes(), "cell {c}");
        }
        let writes: Vec<_> = store.trace().into_iter().filter(|e| e.op == TraceOp::Write).collect();
        assert_eq!(writes.len(), (n as usize).div_ceil(WRITE_BATCH), "one request per batch");
        let mut seen = std::collections::HashSet::new();
        for w in &writes {
            assert!(w.cells.len() <= WRITE_BATCH);
            for c in &w.cells {
                assert!(seen.insert(c.0), "cell {} written twice", c.0);
            }
        }
        assert_eq!(seen.len() as u64, n);
    }

    /// A store that may fail a write retryably still gets it retried (the batch is kept for
    /// that); one that never does is handed the buffers without a copy.
    #[tokio::test]
    async fn writes_are_retried_where_they_may_fail() {
        use blindfold_store::{CountingStore, FaultConfig, FaultStore};
        let g = Geometry::new(64, 8).unwrap();
        assert!(!MemoryStore::new(g).writes_may_be_retried());
        assert!(!CountingStore::new(MemoryStore::new(g)).writes_may_be_retried());
        let faults = FaultConfig { seed: 3, error_rate: 0.5, ..FaultConfig::default() };
        let flaky = FaultStore::new(MemoryStore::new(g), faults);
        assert!(flaky.writes_may_be_retried());
        let retry =
            RetryPolicy { attempts: 30, first_backoff: std::time::Duration::from_micros(1) };
        for round in 0..20u64 {
            let cells: Vec<(CellId, Vec<u8>)> =
                (0..64).map(|c| (CellId(c), (c + round).to_le_bytes().to_vec())).collect();
            crate::retry::write_sealed(&flaky, retry, cells).await.unwrap();
        }
        let back = flaky.inner().read(&(0..64).map(CellId).collect::<Vec<_>>()).await.unwrap();
        for (c, data) in back.iter().enumerate() {
            assert_eq!(data.as_slice(), (c as u64 + 19).to_le_bytes(), "cell {c}");
        }
    }
}
