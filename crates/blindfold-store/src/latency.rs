//! [`LatencyStore`]: emulates a wide-area link (round-trip time and a bandwidth limit shared by
//! all calls) in front of a local store, so the papers' WAN experiments run on one machine.
//!
//! # Model
//!
//! Each call
//!
//! 1. sends its request upstream: [`LinkConfig::ADDRESS_BYTES`] per requested cell or range,
//!    plus the buffers of a write, at the upstream bandwidth;
//! 2. travels half the round-trip time;
//! 3. runs on the inner store;
//! 4. sends its response downstream (the bytes read; nothing for a write) at the
//!    downstream bandwidth;
//! 5. travels the other half of the round-trip time.
//!
//! A flush does not cross the link: it runs on the inner store at once. The stores a wide-area
//! link stands for (S3, Redis) acknowledge a write only once it is durable, and their flush
//! does nothing ([`crate::S3Store`]'s and [`crate::RedisStore`]'s are empty), so a model that
//! charged it a round trip would charge every engine that flushes before a log record, and
//! every sealed baseline's PUT, a round trip no real store costs them. Our own storage server
//! (`remote://`) does answer a flush with a message of its own: in front of it, this model
//! leaves that message its real socket's time and adds no emulated round trip to it.
//!
//! Each direction of the link is one queue: a transfer starts when the link is free, so
//! concurrent calls share the bandwidth. Propagation delay is per call, so concurrent calls
//! overlap in it.
//!
//! # Accuracy
//!
//! The link keeps an exact timetable (nanoseconds), so the bandwidth and the queueing are exact
//! however many calls run. Each call sleeps at most twice, each time until an absolute instant of
//! that timetable, so an early or late wake-up of the first sleep is not carried into the second.
//! tokio's timer has millisecond resolution; each sleep ends on the tick nearest to its ideal
//! instant, so one call returns within half a millisecond of its ideal time (1% of a 50 ms
//! round trip; plus the scheduler's own delay under real time, where the errors of many calls
//! also average out). A call whose transfers take microseconds (a 4 KiB cell at 1 Gbit/s) is not
//! rounded up to a whole extra millisecond, and no call sleeps for a sub-millisecond remainder.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::{ByteRange, CellId, Geometry, Result, Store, StoreError};

/// The shape of an emulated network link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    /// Round-trip time: every call pays it once.
    pub rtt: Duration,
    /// Bandwidth from the caller to the store in bits per second; `None` for unlimited.
    /// `Some(0)` is invalid.
    pub up_bits_per_sec: Option<u64>,
    /// Bandwidth from the store to the caller in bits per second; `None` for unlimited.
    /// `Some(0)` is invalid.
    pub down_bits_per_sec: Option<u64>,
}

impl LinkConfig {
    /// Request bytes charged per addressed cell or range (an address and a length), in addition
    /// to the buffers a write carries.
    pub const ADDRESS_BYTES: u64 = 16;

    /// A link with the given round-trip time and bandwidths; fails if a bandwidth is zero.
    pub fn new(
        rtt: Duration,
        up_bits_per_sec: Option<u64>,
        down_bits_per_sec: Option<u64>,
    ) -> Result<Self> {
        let link = Self { rtt, up_bits_per_sec, down_bits_per_sec };
        link.validate()?;
        Ok(link)
    }

    /// A symmetric link of `rtt_ms` milliseconds round trip and `mbit_per_sec` megabits
    /// (10^6 bits) per second each way; `mbit_per_sec` must be non-zero.
    pub fn wan(rtt_ms: u64, mbit_per_sec: u64) -> Self {
        Self::symmetric(Duration::from_millis(rtt_ms), mbit_per_sec.saturating_mul(1_000_000))
    }

    /// A symmetric link with the given round-trip time and `bits_per_sec` each way (for speeds
    /// such as 512 kbit/s); `bits_per_sec` must be non-zero.
    pub fn symmetric(rtt: Duration, bits_per_sec: u64) -> Self {
        Self { rtt, up_bits_per_sec: Some(bits_per_sec), down_bits_per_sec: Some(bits_per_sec) }
    }

    /// A link with the given round-trip time and no bandwidth limit.
    pub fn unlimited(rtt: Duration) -> Self {
        Self { rtt, up_bits_per_sec: None, down_bits_per_sec: None }
    }

    /// Checks that no bandwidth is zero.
    pub fn validate(&self) -> Result<()> {
        if self.up_bits_per_sec == Some(0) || self.down_bits_per_sec == Some(0) {
            return Err(StoreError::InvalidConfig(format!(
                "link bandwidth must be positive (use None for an unlimited link): {self:?}"
            )));
        }
        Ok(())
    }

    /// Time to send `bytes` upstream on an otherwise idle link (without propagation delay).
    pub fn up_time(&self, bytes: u64) -> Duration {
        transfer_time(bytes, self.up_bits_per_sec)
    }

    /// Time to send `bytes` downstream on an otherwise idle link (without propagation delay).
    pub fn down_time(&self, bytes: u64) -> Duration {
        transfer_time(bytes, self.down_bits_per_sec)
    }
}

fn transfer_time(bytes: u64, bits_per_sec: Option<u64>) -> Duration {
    match bits_per_sec {
        None | Some(0) => Duration::ZERO,
        Some(bps) => {
            let nanos = (u128::from(bytes) * 8 * 1_000_000_000).div_ceil(u128::from(bps));
            Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
        }
    }
}

/// When each direction of the link is next free; `None` means free now.
#[derive(Debug, Default)]
struct Timetable {
    up_free_at: Option<Instant>,
    down_free_at: Option<Instant>,
}

/// Books a transfer of `duration` on a link direction that is free at `free_at`, starting no
/// earlier than `ready`; returns when the transfer ends.
fn book(free_at: &mut Option<Instant>, ready: Instant, duration: Duration) -> Instant {
    let start = free_at.map_or(ready, |free| free.max(ready));
    let end = start + duration;
    *free_at = Some(end);
    end
}

/// Half of tokio's timer tick (one millisecond).
const HALF_TICK: Duration = Duration::from_micros(500);

/// Sleeps until the timer tick nearest to `deadline`; returns at once if that is now or past.
///
/// tokio's timer fires on whole milliseconds and rounds a deadline up to the next one; aiming
/// half a tick early rounds to the nearest tick instead, so the timing error of a call is at
/// most half a millisecond either way and errors of a sequence of calls average out rather than
/// add up.
async fn sleep_until(deadline: Instant) {
    let Some(target) = deadline.checked_sub(HALF_TICK) else {
        return;
    };
    if target > Instant::now() {
        tokio::time::sleep_until(target).await;
    }
}

/// A store reached over an emulated network link: every call to `S` pays the link's round-trip
/// time and its transfers at the link's bandwidth, shared with concurrent calls.
#[derive(Debug)]
pub struct LatencyStore<S> {
    inner: S,
    link: LinkConfig,
    timetable: Mutex<Timetable>,
}

/// The bytes a write sends over the link: each cell's address and its buffer.
fn upload_bytes<B: AsRef<Vec<u8>>>(cells: &[(CellId, B)]) -> u64 {
    cells.iter().map(|(_, b)| LinkConfig::ADDRESS_BYTES + b.as_ref().len() as u64).sum()
}

impl<S: Store> LatencyStore<S> {
    /// Puts `inner` behind `link`.
    ///
    /// # Panics
    ///
    /// If a bandwidth of `link` is zero (see [`LinkConfig::validate`]).
    pub fn new(inner: S, link: LinkConfig) -> Self {
        if let Err(e) = link.validate() {
            panic!("LatencyStore::new: {e}");
        }
        Self { inner, link, timetable: Mutex::new(Timetable::default()) }
    }

    /// The emulated link.
    pub fn link(&self) -> LinkConfig {
        self.link
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Runs `op` as one call across the link (for capability traits implemented elsewhere in
    /// this crate).
    pub(crate) async fn across_link<T, F>(
        &self,
        up_bytes: u64,
        op: F,
        down_bytes: impl FnOnce(&Result<T>) -> u64,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        self.across(up_bytes, op, down_bytes).await
    }

    /// Runs `op` as one call across the link: `up_bytes` of request, `down_bytes(result)` of
    /// response.
    async fn across<T, F>(
        &self,
        up_bytes: u64,
        op: F,
        down_bytes: impl FnOnce(&Result<T>) -> u64,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let first_half = self.link.rtt / 2;
        let second_half = self.link.rtt - first_half;
        let up_time = self.link.up_time(up_bytes);
        let sent = {
            let mut t = self.timetable.lock();
            let now = Instant::now();
            if self.link.up_bits_per_sec.is_some() {
                book(&mut t.up_free_at, now, up_time)
            } else {
                now
            }
        };
        // The instant the request reaches the store, on the ideal timetable.
        let arrives = sent + first_half;
        sleep_until(arrives).await;

        let started = Instant::now();
        let result = op.await;
        // Measured from the ideal arrival, so a late wake-up above is not counted twice.
        let answered = arrives + started.elapsed();

        let down_time = self.link.down_time(down_bytes(&result));
        let received = {
            let mut t = self.timetable.lock();
            if self.link.down_bits_per_sec.is_some() {
                book(&mut t.down_free_at, answered, down_time)
            } else {
                answered
            }
        };
        sleep_until(received + second_half).await;
        result
    }
}

fn response_bytes(result: &Result<Vec<Vec<u8>>>) -> u64 {
    match result {
        Ok(buffers) => buffers.iter().map(|b| b.len() as u64).sum(),
        Err(_) => 0,
    }
}

#[async_trait]
impl<S: Store> Store for LatencyStore<S> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        let up = cells.len() as u64 * LinkConfig::ADDRESS_BYTES;
        self.across(up, self.inner.read(cells), response_bytes).await
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        let up = ranges.len() as u64 * LinkConfig::ADDRESS_BYTES;
        self.across(up, self.inner.read_ranges(ranges), response_bytes).await
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.across(upload_bytes(&cells), self.inner.write(cells), |_| 0).await
    }

    async fn write_shared(&self, cells: Vec<(CellId, std::sync::Arc<Vec<u8>>)>) -> Result<()> {
        self.across(upload_bytes(&cells), self.inner.write_shared(cells), |_| 0).await
    }

    async fn flush(&self) -> Result<()> {
        // Not across the link (see the module's docs).
        self.inner.flush().await
    }
    fn writes_may_be_retried(&self) -> bool {
        self.inner.writes_may_be_retried()
    }
}
