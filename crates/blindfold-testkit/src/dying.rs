//! A store that dies part-way, for crash-consistency tests.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use blindfold_store::{ByteRange, CellId, Geometry, Store, StoreError};

/// A store that "dies" after a number of cell writes: the write that crosses the limit applies
/// only a prefix of its cells, and every later read, write or flush fails, as if the process
/// had been killed at that instant.
#[derive(Debug)]
pub struct DyingStore {
    inner: Arc<dyn Store>,
    writes_left: AtomicI64,
}

impl DyingStore {
    /// `inner`, dying after `cell_writes` more cells are written.
    pub fn new(inner: Arc<dyn Store>, cell_writes: i64) -> Self {
        Self { inner, writes_left: AtomicI64::new(cell_writes) }
    }

    fn dead(&self) -> StoreError {
        StoreError::Io {
            context: "process killed".into(),
            source: std::io::Error::other("killed"),
            retryable: false,
        }
    }

    /// Dies now, as if the process were killed: every later request fails.
    pub fn kill(&self) {
        self.writes_left.store(-1, Ordering::SeqCst);
    }

    /// Whether the store has died (a write crossed the limit).
    pub fn is_dead(&self) -> bool {
        self.writes_left.load(Ordering::SeqCst) < 0
    }
}

#[async_trait]
impl Store for DyingStore {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        if self.is_dead() {
            return Err(self.dead());
        }
        self.inner.read(cells).await
    }

    async fn read_ranges(&self, r: &[ByteRange]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        if self.is_dead() {
            return Err(self.dead());
        }
        self.inner.read_ranges(r).await
    }

    async fn write(&self, mut cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
        let left = self.writes_left.fetch_sub(cells.len() as i64, Ordering::SeqCst);
        if left < cells.len() as i64 {
            cells.truncate(left.max(0) as usize);
            self.inner.write(cells).await?;
            self.writes_left.store(-1, Ordering::SeqCst);
            return Err(self.dead());
        }
        self.inner.write(cells).await
    }

    async fn flush(&self) -> blindfold_store::Result<()> {
        if self.is_dead() {
            return Err(self.dead());
        }
        self.inner.flush().await
    }
}
