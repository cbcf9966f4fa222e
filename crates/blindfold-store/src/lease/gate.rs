//! [`LeaseGate`]: a holder's own check, before each write, that its lease still lasts; and
//! [`GatedStore`], a store whose writes pass it.
//!
//! A holder that stops renewing its lease (a process paused for longer than the ttl: a
//! stopped VM, a debugger, a swapped-out machine) may resume in the middle of writing, after
//! a successor took the store over. Renewal alone cannot stop that write: the renewal task
//! has not run yet when the write goes out. The gate is passed by the write itself, against
//! the deadline of the last successful acquire or renewal (by the monotonic clock and by the
//! wall clock, whichever ends first). Past the deadline nobody knows yet whether the lease is
//! still ours: the write waits for the renewal's verdict — a renewal that succeeds (nobody
//! took the lease meanwhile, so nobody else wrote) lets it go, a lost lease refuses it, and no
//! verdict within twice the ttl refuses it too. What the gate cannot stop is a write already
//! handed to the network before the pause; a successor detects those (the log's
//! generations; the cells' key epochs).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::system_clock_ms as unix_ms;
use crate::{ByteRange, CellId, Geometry, Result, Store, StoreError};

/// Whether this process may still write to a store it holds a lease on. Open (no deadline)
/// until [`LeaseGate::extend`] first sets one; shut for good by [`LeaseGate::shut`].
#[derive(Debug)]
pub struct LeaseGate {
    base: Instant,
    /// Nanoseconds after `base` at which the lease lapses (`u64::MAX`: no deadline yet).
    deadline: AtomicU64,
    /// The same deadline by the wall clock, in milliseconds since the Unix epoch.
    deadline_unix_ms: AtomicU64,
    /// The lease's ttl in milliseconds (how long a write past the deadline waits).
    ttl_ms: AtomicU64,
    shut: parking_lot::Mutex<Option<String>>,
    /// Rung at every renewal and when shut.
    changed: tokio::sync::Notify,
}

impl Default for LeaseGate {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            deadline: AtomicU64::new(u64::MAX),
            deadline_unix_ms: AtomicU64::new(u64::MAX),
            ttl_ms: AtomicU64::new(0),
            shut: parking_lot::Mutex::new(None),
            changed: tokio::sync::Notify::new(),
        }
    }
}

impl LeaseGate {
    /// A gate with no deadline yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The lease was acquired or renewed by a request sent at `sent`, for `ttl`: writes may go
    /// on until `sent + ttl` (and until `sent`'s wall-clock time plus `ttl`).
    pub fn extend(&self, sent: Instant, sent_unix_ms: u64, ttl: Duration) {
        let at = sent.saturating_duration_since(self.base) + ttl;
        let at = u64::try_from(at.as_nanos()).unwrap_or(u64::MAX - 1);
        // Never moved back by a renewal answered out of order (`u64::MAX`: none yet).
        let _ = self.deadline.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| {
            Some(if d == u64::MAX { at } else { d.max(at) })
        });
        let wall = sent_unix_ms.saturating_add(ttl.as_millis() as u64);
        let _ = self.deadline_unix_ms.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| {
            Some(if d == u64::MAX { wall } else { d.max(wall) })
        });
        self.ttl_ms.store(ttl.as_millis() as u64, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// No write passes any more, saying `why` (the lease was lost, or given up).
    pub fn shut(&self, why: String) {
        self.shut.lock().get_or_insert(why);
        self.changed.notify_waiters();
    }

    /// Returns once a write may go out: at once within the lease; past its deadline, once a
    /// renewal extends it. An error when the gate is shut, or when no renewal came within
    /// twice the ttl (the process that renews it is gone or stuck).
    pub async fn pass(&self) -> Result<()> {
        let mut give_up = None;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let lapsed = match self.check() {
                Ok(()) => return Ok(()),
                Err(e) if self.shut.lock().is_some() => return Err(e),
                Err(e) => e,
            };
            let wait = Duration::from_millis(self.ttl_ms.load(Ordering::SeqCst) * 2);
            let until = *give_up.get_or_insert_with(|| tokio::time::Instant::now() + wait);
            if tokio::time::timeout_at(until, changed).await.is_err() {
                return Err(lapsed);
            }
        }
    }

    /// Ok while writes may go on; otherwise why not (see [`LeaseGate::pass`], which waits
    /// for a renewal's verdict past the deadline).
    pub fn check(&self) -> Result<()> {
        if let Some(why) = self.shut.lock().as_ref() {
            return Err(StoreError::Fenced(why.clone()));
        }
        let deadline = self.deadline.load(Ordering::SeqCst);
        if deadline == u64::MAX {
            return Ok(());
        }
        let now = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let (wall_deadline, wall_now) = (self.deadline_unix_ms.load(Ordering::SeqCst), unix_ms());
        if now >= deadline || wall_now >= wall_deadline {
            let late = Duration::from_nanos(now.saturating_sub(deadline))
                .max(Duration::from_millis(wall_now.saturating_sub(wall_deadline)));
            return Err(StoreError::Fenced(format!(
                "this process's lease on the store lapsed {late:.1?} ago without a renewal (was \
                 it paused for longer than the lease's ttl?): another process may hold the \
                 store now, so nothing more is written to it; restart this one"
            )));
        }
        Ok(())
    }
}

/// A store whose writes and flushes pass `gate` first; reads are not gated.
pub struct GatedStore {
    inner: Arc<dyn Store>,
    gate: Arc<LeaseGate>,
}

impl GatedStore {
    /// Wraps `inner`.
    pub fn wrap(inner: Arc<dyn Store>, gate: Arc<LeaseGate>) -> Arc<dyn Store> {
        Arc::new(Self { inner, gate })
    }
}

impl std::fmt::Debug for GatedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GatedStore").field("inner", &self.inner).finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for GatedStore {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        self.inner.read(cells).await
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        self.inner.read_ranges(ranges).await
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.gate.pass().await?;
        self.inner.write(cells).await
    }

    async fn write_shared(&self, cells: Vec<(CellId, Arc<Vec<u8>>)>) -> Result<()> {
        self.gate.pass().await?;
        self.inner.write_shared(cells).await
    }

    async fn flush(&self) -> Result<()> {
        self.gate.pass().await?;
        self.inner.flush().await
    }

    fn writes_may_be_retried(&self) -> bool {
        self.inner.writes_may_be_retried()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn writes_pass_until_the_deadline_then_are_refused() {
        let geometry = Geometry::new(4, 64).unwrap();
        let inner: Arc<dyn Store> = Arc::new(crate::MemoryStore::new(geometry));
        let gate = LeaseGate::new();
        let store = GatedStore::wrap(Arc::clone(&inner), Arc::clone(&gate));
        // No deadline yet: open.
        store.write(vec![(CellId(0), vec![1; 64])]).await.unwrap();
        gate.extend(Instant::now(), unix_ms(), Duration::from_millis(150));
        store.write(vec![(CellId(1), vec![2; 64])]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Past the deadline, a write waits for the renewal's verdict: a renewal lets it go.
        let waiting = {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.write(vec![(CellId(3), vec![7; 64])]).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a write past the deadline went out at once");
        gate.extend(Instant::now(), unix_ms(), Duration::from_millis(150));
        waiting.await.unwrap().unwrap();
        assert_eq!(inner.read(&[CellId(3)]).await.unwrap()[0], vec![7; 64]);
        // No renewal within twice the ttl: refused.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let e = store.write(vec![(CellId(1), vec![3; 64])]).await.unwrap_err();
        assert!(matches!(e, StoreError::Fenced(_)) && !e.is_retryable(), "{e}");
        assert!(e.to_string().contains("lapsed"), "{e}");
        assert_eq!(inner.read(&[CellId(1)]).await.unwrap()[0], vec![2; 64], "written after all");
        // Reads still work; a renewal opens it again.
        assert_eq!(store.read(&[CellId(0)]).await.unwrap()[0], vec![1; 64]);
        gate.extend(Instant::now(), unix_ms(), Duration::from_secs(5));
        store.write(vec![(CellId(1), vec![4; 64])]).await.unwrap();
        // A wall clock past the deadline counts as well (a pause the monotonic clock missed).
        gate.deadline_unix_ms.store(unix_ms() - 1, Ordering::SeqCst);
        assert!(gate.check().is_err());
        // Shut (the lease was lost): refused at once, waiting writes too.
        let waiting = {
            let store = Arc::clone(&store);
            tokio::spawn(async move { store.flush().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        gate.shut("the lease was taken over".into());
        let e = waiting.await.unwrap().unwrap_err();
        assert!(e.to_string().contains("taken over"), "{e}");
        let e = store.write(vec![(CellId(2), vec![5; 64])]).await.unwrap_err();
        assert!(e.to_string().contains("taken over"), "{e}");
    }
}
