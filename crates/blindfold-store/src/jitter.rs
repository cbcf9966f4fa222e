//! [`JitterStore`]: delays every call by a seeded random time before and after it reaches the
//! store, so concurrent calls overtake each other. It plays the adversarial network scheduler
//! of TaoStore's threat model: replies come back in an order the caller does not choose.

use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{ByteRange, CellId, Geometry, Result, Store};

/// A store that holds each call for a random time in `0..=max_delay` before passing it on to
/// `S`, and holds its reply for another such time before returning it.
///
/// Two delays are drawn per call from a generator seeded by the caller, in the order calls
/// reach the wrapper. The store's contracts still hold: a call's effect happens between its
/// start and its return, so a read that starts after a write returned sees the write. Calls
/// that overlap in time may take effect and return in any order.
#[derive(Debug)]
pub struct JitterStore<S> {
    inner: S,
    max_delay: Duration,
    rng: Mutex<ChaCha8Rng>,
}

impl<S: Store> JitterStore<S> {
    /// Wraps `inner`, delaying each call and each reply by up to `max_delay`.
    pub fn new(inner: S, max_delay: Duration, seed: u64) -> Self {
        Self { inner, max_delay, rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)) }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn draw(&self) -> (Duration, Duration) {
        let max = self.max_delay.as_micros() as u64;
        let mut rng = self.rng.lock();
        let mut one = || Duration::from_micros(rng.gen_range(0..=max));
        (one(), one())
    }

    /// Runs `call` between two random pauses (also for capability traits implemented
    /// elsewhere in this crate).
    pub(crate) async fn delayed<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        let (before, after) = self.draw();
        pause(before).await;
        let out = call.await;
        pause(after).await;
        out
    }
}

/// Sleeps for `d`, or just yields to the scheduler when `d` is zero, so even undelayed calls
/// let others run first.
async fn pause(d: Duration) {
    if d.is_zero() {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(d).await;
    }
}

#[async_trait]
impl<S: Store> Store for JitterStore<S> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        self.delayed(self.inner.read(cells)).await
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        self.delayed(self.inner.read_ranges(ranges)).await
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.delayed(self.inner.write(cells)).await
    }

    async fn flush(&self) -> Result<()> {
        self.delayed(self.inner.flush()).await
    }
}
