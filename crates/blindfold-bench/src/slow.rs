//! [`SlowStore`]: a test hook that makes the side of a benchmark whose store it wraps about
//! `factor` times slower, so that `bench regress --inject-slowdown` can show that a check fails
//! when its engine really slows down. Nothing else uses it.
//!
//! # Model
//!
//! The wrapped side's time is stretched. Each stretch of wall time since the last pause (the
//! engine's own work, its store calls and its link alike), once it reaches [`QUANTUM`], is
//! followed by a pause of `factor − 1` times its length, during which every store call of the
//! side waits: before it reaches the inner store, and again before its answer returns, so a
//! call in flight when a pause starts is held too. An engine that calls its store often is
//! thereby about `factor` times slower, whatever its time goes to; the other side of the
//! benchmark, with its own store, is untouched.
//!
//! A pause ends when the side has taken `factor` times the work counted so far (an absolute
//! instant, so timer lateness does not add up over pauses), so a side takes at most about
//! `factor` times as long as it would have: the hook cannot make a run hang. Pauses are at least
//! [`QUANTUM`] of work apart, so tokio's millisecond timer does not round every store call up
//! to a whole millisecond.

use std::time::Duration;

use async_trait::async_trait;
use blindfold_store::{ByteRange, CellId, Geometry, Result, Store};
use parking_lot::Mutex;
use tokio::time::Instant;

/// The least work between two pauses.
pub const QUANTUM: Duration = Duration::from_millis(10);

/// The largest factor [`SlowStore`] accepts (a larger one would only make a check wait for its
/// time limit).
pub const MAX_FACTOR: f64 = 100.0;

/// `Ok` if `factor` is finite, at least 1 and at most [`MAX_FACTOR`].
pub fn check_factor(factor: f64) -> anyhow::Result<()> {
    anyhow::ensure!(
        factor.is_finite() && (1.0..=MAX_FACTOR).contains(&factor),
        "a slowdown factor must be between 1 and {MAX_FACTOR}, not {factor}"
    );
    Ok(())
}

/// A store whose callers are made about `factor` times slower (see the module's model).
#[derive(Debug)]
pub struct SlowStore<S> {
    inner: S,
    factor: f64,
    clock: Mutex<Clock>,
}

/// The wrapped side's time.
#[derive(Debug)]
struct Clock {
    /// When the store was wrapped.
    start: Instant,
    /// Work counted so far: the stretches between pauses.
    work: Duration,
    /// The end of the pause in progress or of the last one (or `start`): work since then is
    /// not counted yet.
    resume: Instant,
}

impl<S: Store> SlowStore<S> {
    /// Wraps `inner`; `factor` must pass [`check_factor`].
    pub fn new(inner: S, factor: f64) -> anyhow::Result<Self> {
        check_factor(factor)?;
        let now = Instant::now();
        let clock = Clock { start: now, work: Duration::ZERO, resume: now };
        Ok(Self { inner, factor, clock: Mutex::new(clock) })
    }

    /// Waits out the pause in progress, starting one if enough work was done since the last.
    async fn gate(&self) {
        let until = {
            let mut guard = self.clock.lock();
            let c = &mut *guard;
            let now = Instant::now();
            if now >= c.resume && now - c.resume >= QUANTUM {
                c.work += now - c.resume;
                // Each pause ends when the side has taken `factor` times its work so far, an
                // absolute instant: a pause the timer or a loaded machine ended late makes the
                // next one shorter, instead of adding up.
                c.resume = (c.start + c.work.mul_f64(self.factor)).max(now);
            }
            c.resume
        };
        if until > Instant::now() {
            tokio::time::sleep_until(until).await;
            // Work starts again when the first caller of this pause runs, not at `until`: the
            // lateness of its wake-up is the pause's, not the engine's.
            let mut c = self.clock.lock();
            if c.resume == until {
                c.resume = Instant::now().max(until);
            }
        }
    }
}

#[async_trait]
impl<S: Store> Store for SlowStore<S> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        self.gate().await;
        let r = self.inner.read(cells).await;
        self.gate().await;
        r
    }
    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        self.gate().await;
        let r = self.inner.read_ranges(ranges).await;
        self.gate().await;
        r
    }
    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.gate().await;
        let r = self.inner.write(cells).await;
        self.gate().await;
        r
    }
    async fn flush(&self) -> Result<()> {
        self.gate().await;
        let r = self.inner.flush().await;
        self.gate().await;
        r
    }
    fn writes_may_be_retried(&self) -> bool {
        self.inner.writes_may_be_retried()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blindfold_store::MemoryStore;

    #[test]
    fn a_factor_outside_its_range_is_refused() {
        let g = Geometry::new(4, 64).unwrap();
        for f in [0.5, f64::NAN, f64::INFINITY, MAX_FACTOR + 1.0] {
            assert!(SlowStore::new(MemoryStore::new(g), f).is_err(), "{f}");
        }
        assert!(SlowStore::new(MemoryStore::new(g), 1.0).is_ok());
    }

    /// A side that works 2 ms between store calls takes about `factor` times as long, and no
    /// more than that plus a timer tick per pause.
    #[tokio::test(start_paused = true)]
    async fn work_between_calls_is_stretched_by_the_factor() {
        let g = Geometry::new(4, 64).unwrap();
        let s = SlowStore::new(MemoryStore::new(g), 4.0).unwrap();
        let t = Instant::now();
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(2)).await; // the engine's own work
            s.read(&[CellId(0)]).await.unwrap();
        }
        let stretch = t.elapsed().as_secs_f64() / 0.2;
        assert!((3.5..=4.5).contains(&stretch), "{stretch}");
    }
}
