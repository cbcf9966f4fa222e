//! [`FaultStore`]: injects seeded errors, time-outs and lost acknowledgements in front of a
//! store, so retry and recovery paths are exercised and every failure reproduces.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::{ByteRange, CellId, Geometry, Result, Store, StoreError};

/// Which faults a [`FaultStore`] injects, and how often. The default injects nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Seed of the fault sequence: the same seed and the same calls give the same faults.
    pub seed: u64,
    /// Probability that a call fails with [`StoreError::Injected`] without reaching the store.
    pub error_rate: f64,
    /// Probability that a call waits [`timeout`](Self::timeout) and then fails with
    /// [`StoreError::Timeout`] without reaching the store.
    pub timeout_rate: f64,
    /// How long an injected time-out waits before failing.
    pub timeout: Duration,
    /// Probability that a write reaches the store and is applied, but the caller gets
    /// [`StoreError::Injected`] as if the acknowledgement had been lost.
    pub lost_ack_rate: f64,
}

impl FaultConfig {
    /// Checks that every rate is in `0..=1` and that they add up to at most 1.
    pub fn validate(&self) -> Result<()> {
        let rates = [
            ("error_rate", self.error_rate),
            ("timeout_rate", self.timeout_rate),
            ("lost_ack_rate", self.lost_ack_rate),
        ];
        for (name, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(StoreError::InvalidConfig(format!(
                    "fault {name} must be between 0 and 1, got {rate}"
                )));
            }
        }
        let sum = self.error_rate + self.timeout_rate + self.lost_ack_rate;
        if sum > 1.0 {
            return Err(StoreError::InvalidConfig(format!(
                "fault rates add up to {sum}, more than 1"
            )));
        }
        Ok(())
    }
}

/// What happens to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Pass,
    Error,
    Timeout,
    LostAck,
}

/// A store that makes some calls to `S` fail, by a seeded random draw per call (see
/// [`FaultConfig`]).
///
/// Exactly one number is drawn per call, in the order calls reach this wrapper, so a sequential
/// run with the same seed meets the same faults. Every injected fault is retryable.
#[derive(Debug)]
pub struct FaultStore<S> {
    inner: S,
    config: FaultConfig,
    rng: Mutex<ChaCha8Rng>,
    calls: AtomicU64,
    injected: AtomicU64,
}

impl<S: Store> FaultStore<S> {
    /// Wraps `inner`, injecting faults as `config` says.
    ///
    /// # Panics
    ///
    /// If `config` is invalid (see [`FaultConfig::validate`]).
    pub fn new(inner: S, config: FaultConfig) -> Self {
        if let Err(e) = config.validate() {
            panic!("FaultStore::new: {e}");
        }
        Self {
            inner,
            config,
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(config.seed)),
            calls: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        }
    }

    /// Number of faults injected so far (errors, time-outs and lost acknowledgements).
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// The configuration in force.
    pub fn config(&self) -> FaultConfig {
        self.config
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Draws the fate of the next call; returns it with the call's number.
    fn draw(&self, is_write: bool) -> (Fate, u64) {
        let u: f64 = self.rng.lock().gen();
        let call = self.calls.fetch_add(1, Ordering::Relaxed);
        let c = &self.config;
        let fate = if u < c.error_rate {
            Fate::Error
        } else if u < c.error_rate + c.timeout_rate {
            Fate::Timeout
        } else if is_write && u < c.error_rate + c.timeout_rate + c.lost_ack_rate {
            Fate::LostAck
        } else {
            Fate::Pass
        };
        if fate != Fate::Pass {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        (fate, call)
    }

    /// Draws and applies the fate of a read-like call (for capability traits implemented
    /// elsewhere in this crate).
    pub(crate) async fn before_read(&self, op: &str) -> Result<()> {
        let (fate, call) = self.draw(false);
        self.before(op, fate, call).await
    }

    /// Runs a write-like call (for capability traits implemented elsewhere in this crate) with
    /// the faults of [`Store::write`]: an error or a time-out instead of the call, or a lost
    /// acknowledgement after it.
    pub(crate) async fn around_write(
        &self,
        op: &str,
        call: impl std::future::Future<Output = Result<()>>,
    ) -> Result<()> {
        let (fate, n) = self.draw(true);
        self.before(op, fate, n).await?;
        call.await?;
        if fate == Fate::LostAck {
            return Err(StoreError::Injected(format!(
                "{op} applied but its acknowledgement was lost, call #{n}"
            )));
        }
        Ok(())
    }

    /// Applies a fault that happens before the store is reached, if one was drawn.
    async fn before(&self, op: &str, fate: Fate, call: u64) -> Result<()> {
        match fate {
            Fate::Error => Err(StoreError::Injected(format!("error on {op}, call #{call}"))),
            Fate::Timeout => {
                tokio::time::sleep(self.config.timeout).await;
                Err(StoreError::Timeout(format!(
                    "injected after {:?} on {op}, call #{call}",
                    self.config.timeout
                )))
            }
            Fate::Pass | Fate::LostAck => Ok(()),
        }
    }
}

#[async_trait]
impl<S: Store> Store for FaultStore<S> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        let (fate, call) = self.draw(false);
        self.before("read", fate, call).await?;
        self.inner.read(cells).await
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        let (fate, call) = self.draw(false);
        self.before("read_ranges", fate, call).await?;
        self.inner.read_ranges(ranges).await
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.around_write("write", self.inner.write(cells)).await
    }

    async fn flush(&self) -> Result<()> {
        let (fate, call) = self.draw(false);
        self.before("flush", fate, call).await?;
        self.inner.flush().await
    }
}
