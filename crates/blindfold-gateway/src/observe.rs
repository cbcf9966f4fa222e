//! What an operator can see of a running gateway: Prometheus metrics, a short history for the
//! dashboard, and recording windows for the access-pattern visualizer.
//!
//! One [`Observer`] per gateway collects:
//!
//! - S3 requests by operation and status, their latency, bytes in and out ([`Observer::s3`],
//!   called by the HTTP loop);
//! - every request to the untrusted store, by kind, with cells and bytes ([`TappedStore`],
//!   wrapped around the engine's store, above a [`CountingStore`]);
//! - logical block traffic, commits and their duration, integrity errors (the engine watcher
//!   in `engine.rs`);
//! - gauges read when scraped: stash, subtree, trusted memory, resident memory, poisoned;
//! - how full the gateway is ([`Usage`]: blocks in use of the capacity, objects and their
//!   bytes, the data directory's disk, the serving certificate's end of validity), set by the
//!   admin listener before each scrape and each second of history.
//!
//! No label ever carries an object name, bucket name or key: operations, statuses and request
//! kinds are fixed, small sets. Object names appear only in a [recording window](Window),
//! which the operator starts on purpose, which lives in the gateway's memory only, and which
//! the admin listener shows only to a caller holding the credentials.

pub use blindfold_proxy::catalogue::PhysicalView;
pub use blindfold_proxy::engine::EngineGauges;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use blindfold_store::{
    ByteRange, CellId, CountingStore, Counts, Geometry, Store, TeeRound, TeeStore,
};
use parking_lot::Mutex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use serde::Serialize;

/// Most events a recording window keeps of each kind (physical, logical); later ones are
/// counted but dropped, so a window costs at most a few MiB of trusted memory.
pub const WINDOW_EVENT_CAP: usize = 200_000;
/// Most S3 requests a window keeps.
pub const WINDOW_REQUEST_CAP: usize = 5_000;
/// Longest recording window.
pub const WINDOW_MAX: Duration = Duration::from_secs(600);
/// How often a recording window's report is built for the visualizer's polls at most: polls in
/// between (from any number of clients) get the same bytes, so polling costs the recording
/// path one copy of the window per period, whoever polls.
pub const WINDOW_REPORT_EVERY: Duration = Duration::from_millis(250);
/// Bins of the uniformity test over the store's view.
pub const UNIFORMITY_BINS: u64 = 32;
/// Points of dashboard history (one per second).
pub const HISTORY_POINTS: usize = 600;

/// Pearson's chi-square test of `counts` against the uniform distribution.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Uniformity {
    /// Samples.
    pub samples: u64,
    /// The statistic.
    pub chi_square: f64,
    /// Degrees of freedom.
    pub dof: f64,
    /// Probability of a statistic at least this large if the targets were uniform; `None`
    /// with fewer than 5 expected samples per bin (the test would mean nothing).
    pub p_value: Option<f64>,
}

/// Chi-square uniformity of a histogram.
pub fn uniformity(counts: &[u64]) -> Uniformity {
    use statrs::distribution::{ChiSquared, ContinuousCDF};
    let samples: u64 = counts.iter().sum();
    let bins = counts.len().max(1) as f64;
    let expected = samples as f64 / bins;
    let chi_square = if expected > 0.0 {
        counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum()
    } else {
        0.0
    };
    let dof = bins - 1.0;
    let p_value = (expected >= 5.0 && dof >= 1.0)
        .then(|| ChiSquared::new(dof).map(|d| 1.0 - d.cdf(chi_square)).ok())
        .flatten();
    Uniformity { samples, chi_square, dof, p_value }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    operation: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProviderLabel {
    provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InfoLabels {
    version: &'static str,
    engine: String,
    layout: String,
    block_size: u32,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_25, 2.0, 18))
}

/// Prices the store traffic so far: `(provider id, dollars of requests and transfer for these
/// counts, dollars per month for storing `stored_bytes`)`.
pub type CostModel = Arc<dyn Fn(&Counts, u64) -> (f64, f64) + Send + Sync>;

/// One recorded physical request (what the store saw).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct PhysicalEvent {
    /// Milliseconds since the window started.
    pub t_ms: u32,
    /// `true` for a write.
    pub write: bool,
    /// The target reached (leaf or cell), if any of the request's cells names one.
    pub target: Option<u64>,
    /// Cells in the request.
    pub cells: u32,
}

/// One recorded logical block access (what the gateway asked of the engine).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct LogicalEvent {
    /// Milliseconds since the window started.
    pub t_ms: u32,
    /// The block.
    pub block: u64,
    /// `true` for a write.
    pub write: bool,
}

/// One recorded S3 request: the operator's view, names included.
#[derive(Clone, Debug, Serialize)]
pub struct RequestEvent {
    /// Milliseconds since the window started.
    pub t_ms: u32,
    /// S3 operation.
    pub operation: &'static str,
    /// `bucket/key` as requested (the operator's own data).
    pub name: String,
    /// HTTP status.
    pub status: u16,
}

/// A recording of what the gateway was asked and what the store saw, for a chosen time.
#[derive(Debug)]
pub struct Window {
    started: Instant,
    length: Duration,
    physical: Vec<PhysicalEvent>,
    logical: Vec<LogicalEvent>,
    requests: Vec<RequestEvent>,
    dropped: u64,
    histogram: Vec<u64>,
    view: PhysicalView,
    label: String,
}

/// A window as the visualizer receives it.
#[derive(Clone, Debug, Serialize)]
pub struct WindowReport {
    /// What was recorded (the live gateway, or a demo run).
    pub label: String,
    /// Whether it is still recording.
    pub recording: bool,
    /// Milliseconds recorded so far.
    pub elapsed_ms: u64,
    /// Chosen length in milliseconds.
    pub length_ms: u64,
    /// How the store's cells map to targets.
    pub view: PhysicalView,
    /// Targets (leaves or cells) the heat map's rows span.
    pub targets: u64,
    /// Reads per target bin ([`UNIFORMITY_BINS`] bins).
    pub histogram: Vec<u64>,
    /// The uniformity test over `histogram`.
    pub uniformity: Uniformity,
    /// Physical requests.
    pub physical: Vec<PhysicalEvent>,
    /// Logical block accesses.
    pub logical: Vec<LogicalEvent>,
    /// S3 requests.
    pub requests: Vec<RequestEvent>,
    /// Events not kept (over the cap).
    pub dropped: u64,
}

impl Window {
    fn new(view: PhysicalView, length: Duration, label: String) -> Self {
        Self {
            started: Instant::now(),
            length,
            physical: Vec::new(),
            logical: Vec::new(),
            requests: Vec::new(),
            dropped: 0,
            histogram: vec![0; UNIFORMITY_BINS as usize],
            view,
            label,
        }
    }

    fn open(&self) -> bool {
        self.started.elapsed() < self.length
    }

    fn t_ms(&self) -> u32 {
        self.started.elapsed().as_millis().min(u128::from(u32::MAX)) as u32
    }

    fn physical(&mut self, write: bool, cells: &[CellId]) {
        let t_ms = self.t_ms();
        let mut targets: Vec<u64> = cells.iter().filter_map(|&c| self.view.target_of(c)).collect();
        targets.dedup();
        if targets.is_empty() {
            targets.push(u64::MAX);
        }
        let n = self.view.targets().max(1);
        for target in targets {
            let target = (target != u64::MAX).then_some(target);
            if let (false, Some(t)) = (write, target) {
                let bin = (t.min(n - 1) * UNIFORMITY_BINS / n) as usize;
                self.histogram[bin] += 1;
            }
            if self.physical.len() < WINDOW_EVENT_CAP {
                self.physical.push(PhysicalEvent {
                    t_ms,
                    write,
                    target,
                    cells: cells.len() as u32,
                });
            } else {
                self.dropped += 1;
            }
        }
    }

    fn logical(&mut self, block: u64, write: bool) {
        let t_ms = self.t_ms();
        if self.logical.len() < WINDOW_EVENT_CAP {
            self.logical.push(LogicalEvent { t_ms, block, write });
        } else {
            self.dropped += 1;
        }
    }

    fn report(&self) -> WindowReport {
        let elapsed = self.started.elapsed().min(self.length);
        WindowReport {
            label: self.label.clone(),
            recording: self.open(),
            elapsed_ms: elapsed.as_millis() as u64,
            length_ms: self.length.as_millis() as u64,
            view: self.view,
            targets: self.view.targets(),
            histogram: self.histogram.clone(),
            uniformity: uniformity(&self.histogram),
            physical: self.physical.clone(),
            logical: self.logical.clone(),
            requests: self.requests.clone(),
            dropped: self.dropped,
        }
    }
}

/// How full a gateway is, as the metrics, the dashboard and `blindfold status` show it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Usage {
    /// Logical blocks owned by objects, uploads or writes in progress.
    pub blocks_used: u64,
    /// Logical blocks the store holds (the capacity; a growth raises it).
    pub blocks_capacity: u64,
    /// Block size in bytes.
    pub block_size: u32,
    /// Objects stored.
    pub objects: u64,
    /// Their bytes, as clients sent them (before blocks and padding).
    pub object_bytes: u64,
    /// Bytes free for the gateway's user on the data directory's file system (statvfs),
    /// `None` if it could not be read.
    pub data_dir_free_bytes: Option<u64>,
    /// Size of that file system in bytes.
    pub data_dir_size_bytes: Option<u64>,
    /// End of validity of the serving certificate (its notAfter), unix seconds; `None`
    /// without TLS.
    pub tls_not_after: Option<i64>,
}

/// One second of dashboard history.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HistoryPoint {
    /// Unix time, seconds.
    pub t: u64,
    /// S3 requests per second.
    pub requests_per_s: f64,
    /// S3 bytes in + out per second.
    pub s3_bytes_per_s: f64,
    /// Store bytes (both directions) per second.
    pub store_bytes_per_s: f64,
    /// Latency percentiles of the S3 requests that ended in this second, milliseconds.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Store bytes per logical block byte since start.
    pub blowup: f64,
    /// Store bytes per logical block byte in this second; `None` in a second without block
    /// traffic (nothing to divide by).
    pub blowup_interval: Option<f64>,
    /// Stash blocks now.
    pub stash: u64,
    /// Dollars of store requests and transfer since start.
    pub cost_dollars: f64,
    /// Resident memory of the process, bytes.
    pub resident_bytes: u64,
}

/// The metrics and recordings of one gateway. Cheap to update from every request.
pub struct Observer {
    registry: Registry,
    s3_requests: Family<RequestLabels, Counter>,
    s3_latency: Family<OperationLabel, Histogram, fn() -> Histogram>,
    s3_in: Counter,
    s3_out: Counter,
    store_requests: Family<KindLabel, Counter>,
    store_cells: Family<KindLabel, Counter>,
    store_bytes: Family<DirectionLabel, Counter>,
    block_bytes: Family<DirectionLabel, Counter>,
    blowup: Gauge<f64, AtomicU64>,
    commits: Counter,
    commit_seconds: Histogram,
    integrity_errors: Counter,
    poisoned: Gauge,
    stash: Gauge,
    stash_max: Gauge,
    subtree: Gauge,
    trusted: Gauge,
    resident: Gauge,
    cost: Family<ProviderLabel, Gauge<f64, AtomicU64>>,
    storage_cost: Family<ProviderLabel, Gauge<f64, AtomicU64>>,
    blocks_used: Gauge,
    blocks_capacity: Gauge,
    objects: Gauge,
    object_bytes: Gauge,
    disk_free: Gauge,
    disk_size: Gauge,
    /// The serving certificate's notAfter, once a [`Usage`] with one was set (no series
    /// without TLS).
    tls_not_after: Arc<TlsExpiry>,
    s3_total: AtomicU64,
    counting: Mutex<Option<Arc<Counted>>>,
    /// The TEE requests to a trusted component in another process, counted (see
    /// [`Observer::wrap_tee_store`]).
    tee_counting: Mutex<Option<Arc<CountedTee>>>,
    /// Counts of stores no longer in use (replaced by a growth), so totals never go back.
    carried: Mutex<Counts>,
    stored_bytes: AtomicU64,
    recent_latencies: Mutex<Vec<f32>>,
    window: Mutex<Option<Window>>,
    window_on: AtomicBool,
    /// The last report of the window as JSON, and when it was built.
    window_json: Mutex<Option<(Instant, bytes::Bytes)>>,
    view: Mutex<Option<PhysicalView>>,
    history: Mutex<std::collections::VecDeque<HistoryPoint>>,
    /// Totals at the last sample: S3 requests, S3 bytes, store bytes, block bytes.
    last: Mutex<(u64, u64, u64, u64)>,
    cost_model: Mutex<Option<(String, CostModel)>>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Default for Observer {
    fn default() -> Self {
        Self::new()
    }
}

impl Observer {
    /// A new observer with every metric registered at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("blindfold");
        let s3_requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "s3_requests",
            "S3 requests answered, by operation and HTTP status",
            s3_requests.clone(),
        );
        let s3_latency =
            Family::<OperationLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        registry.register(
            "s3_request_duration_seconds",
            "Time from receiving an S3 request to its response headers, by operation",
            s3_latency.clone(),
        );
        let s3_in = Counter::default();
        registry.register(
            "s3_received_bytes",
            "Request body bytes received from S3 clients",
            s3_in.clone(),
        );
        let s3_out = Counter::default();
        registry.register(
            "s3_sent_bytes",
            "Response body bytes sent to S3 clients (by Content-Length)",
            s3_out.clone(),
        );
        let store_requests = Family::<KindLabel, Counter>::default();
        registry.register(
            "store_requests",
            "Requests to the untrusted store, by kind (read, read_ranges, write, flush)",
            store_requests.clone(),
        );
        let store_cells = Family::<KindLabel, Counter>::default();
        registry.register(
            "store_cells",
            "Cells read from or written to the untrusted store",
            store_cells.clone(),
        );
        let store_bytes = Family::<DirectionLabel, Counter>::default();
        registry.register(
            "store_bytes",
            "Bytes moved to (up) and from (down) the untrusted store",
            store_bytes.clone(),
        );
        let block_bytes = Family::<DirectionLabel, Counter>::default();
        registry.register(
            "block_bytes",
            "Logical block bytes the object layer read from or wrote to the engine",
            block_bytes.clone(),
        );
        let blowup = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "bandwidth_blowup",
            "Store bytes (both directions) per logical block byte, since start",
            blowup.clone(),
        );
        let commits = Counter::default();
        registry.register(
            "commits",
            "Commits of the engine (writes made durable)",
            commits.clone(),
        );
        let commit_seconds = Histogram::new(exponential_buckets(0.000_25, 2.0, 18));
        registry.register(
            "commit_duration_seconds",
            "Time each commit took, as its caller waited",
            commit_seconds.clone(),
        );
        let integrity_errors = Counter::default();
        registry.register(
            "integrity_errors",
            "Engine errors that mean the store's data failed authentication or rolled back",
            integrity_errors.clone(),
        );
        let poisoned = Gauge::default();
        registry.register(
            "engine_poisoned",
            "1 once the engine refuses all work (integrity violation or a poisoned driver)",
            poisoned.clone(),
        );
        let stash = Gauge::default();
        registry.register("stash_blocks", "Blocks in the ORAM stash now", stash.clone());
        let stash_max = Gauge::default();
        registry.register(
            "stash_blocks_max",
            "Largest ORAM stash seen since start",
            stash_max.clone(),
        );
        let subtree = Gauge::default();
        registry.register(
            "subtree_buckets",
            "Buckets held in the concurrent engine's subtree now",
            subtree.clone(),
        );
        let trusted = Gauge::default();
        registry.register(
            "trusted_memory_bytes",
            "Bytes of trusted memory the engine's state takes (position map, stash, caches)",
            trusted.clone(),
        );
        let resident = Gauge::default();
        registry.register(
            "process_resident_bytes",
            "Resident memory of the gateway process",
            resident.clone(),
        );
        let cost = Family::<ProviderLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "store_cost_dollars",
            "Dollars of store requests and transfer since start, at the chosen price table",
            cost.clone(),
        );
        let storage_cost = Family::<ProviderLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "storage_cost_dollars_per_month",
            "Dollars per month of storing the store's cells, at the chosen price table",
            storage_cost.clone(),
        );
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let g = Gauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let blocks_used = gauge(
            &mut registry,
            "store_blocks_used",
            "Logical blocks in use (objects, uploads, writes in progress); a write that needs \
             more than capacity minus this is refused (EntityTooLarge)",
        );
        let blocks_capacity = gauge(
            &mut registry,
            "store_blocks_capacity",
            "Logical blocks the store holds (blindfold grow raises it)",
        );
        let objects = gauge(&mut registry, "objects", "Objects stored");
        let object_bytes = gauge(
            &mut registry,
            "object_bytes",
            "Bytes of the objects stored, as clients sent them (before blocks and padding)",
        );
        let disk_free = gauge(
            &mut registry,
            "data_dir_free_bytes",
            "Bytes free for the gateway on the data directory's file system",
        );
        let disk_size = gauge(
            &mut registry,
            "data_dir_size_bytes",
            "Size of the data directory's file system in bytes",
        );
        let tls_not_after = Arc::new(TlsExpiry::default());
        registry.register_collector(Box::new(Arc::clone(&tls_not_after)));
        Self {
            registry,
            blocks_used,
            blocks_capacity,
            objects,
            object_bytes,
            disk_free,
            disk_size,
            tls_not_after,
            s3_requests,
            s3_latency,
            s3_in,
            s3_out,
            store_requests,
            store_cells,
            store_bytes,
            block_bytes,
            blowup,
            commits,
            commit_seconds,
            integrity_errors,
            poisoned,
            stash,
            stash_max,
            subtree,
            trusted,
            resident,
            cost,
            storage_cost,
            s3_total: AtomicU64::new(0),
            counting: Mutex::new(None),
            tee_counting: Mutex::new(None),
            carried: Mutex::new(Counts::default()),
            stored_bytes: AtomicU64::new(0),
            recent_latencies: Mutex::new(Vec::new()),
            window: Mutex::new(None),
            window_on: AtomicBool::new(false),
            window_json: Mutex::new(None),
            view: Mutex::new(None),
            history: Mutex::new(std::collections::VecDeque::new()),
            last: Mutex::new((0, 0, 0, 0)),
            cost_model: Mutex::new(None),
        }
    }

    /// Registers the engine's identity as `blindfold_info{engine, layout, block_size}`.
    pub fn set_info(&mut self, engine: &str, layout: &str, block_size: u32) {
        let info = Family::<InfoLabels, Gauge>::default();
        info.get_or_create(&InfoLabels {
            version: env!("CARGO_PKG_VERSION"),
            engine: engine.to_owned(),
            layout: layout.to_owned(),
            block_size,
        })
        .set(1);
        self.registry.register("info", "The gateway's version, engine and layout", info);
    }

    /// Wraps the engine's store: counts every request and feeds recording windows.
    /// `stored_bytes` is the size of the array (for the storage cost).
    pub fn wrap_store(
        self: &Arc<Self>,
        store: Arc<dyn Store>,
        view: PhysicalView,
        stored_bytes: u64,
    ) -> Arc<dyn Store> {
        let counting = Arc::new(CountingStore::new(store));
        *self.counting.lock() = Some(Arc::clone(&counting));
        *self.view.lock() = Some(view);
        self.stored_bytes.store(stored_bytes, Ordering::Relaxed);
        Arc::new(TappedStore { inner: counting, observer: Arc::clone(self) })
    }

    /// Counts and taps the requests to a trusted component that runs beside a remote store
    /// (`blindfold enclave`): the TEE engine's queries and rounds then reach the store as TEE
    /// requests only, which the plain store's tap never sees. Their counts join
    /// [`Observer::store_counts`]; the cells a query reads join the recording windows.
    pub fn wrap_tee_store(self: &Arc<Self>, tee: Arc<dyn TeeStore>) -> Arc<dyn TeeStore> {
        let counting = Arc::new(CountingStore::new(tee));
        *self.tee_counting.lock() = Some(Arc::clone(&counting));
        Arc::new(TappedStore { inner: counting, observer: Arc::clone(self) })
    }

    /// Lets go of the wrapped store (a growth is about to replace it), keeping its counts in
    /// the totals.
    pub fn release_store(&self) {
        let plain = self.counting.lock().take().map(|c| c.counts());
        let tee = self.tee_counting.lock().take().map(|c| c.counts());
        let mut carried = self.carried.lock();
        for counts in plain.into_iter().chain(tee) {
            *carried = carried.plus(&counts);
        }
    }

    /// Prices the store traffic with `model` under the provider name `provider`.
    pub fn set_cost_model(&self, provider: String, model: CostModel) {
        *self.cost_model.lock() = Some((provider, model));
    }

    /// The store counts so far (zero if no store is wrapped).
    pub fn store_counts(&self) -> Counts {
        let current = self.counting.lock().as_ref().map(|c| c.counts()).unwrap_or_default();
        let tee = self.tee_counting.lock().as_ref().map(|c| c.counts()).unwrap_or_default();
        current.plus(&tee).plus(&self.carried.lock())
    }

    /// Records one answered S3 request.
    pub fn s3(
        &self,
        operation: &'static str,
        status: u16,
        elapsed: Duration,
        name: Option<String>,
    ) {
        self.s3_requests.get_or_create(&RequestLabels { operation, status }).inc();
        self.s3_total.fetch_add(1, Ordering::Relaxed);
        let secs = elapsed.as_secs_f64();
        self.s3_latency.get_or_create(&OperationLabel { operation }).observe(secs);
        {
            let mut recent = self.recent_latencies.lock();
            if recent.len() < 100_000 {
                recent.push((secs * 1000.0) as f32);
            }
        }
        if self.window_on.load(Ordering::Relaxed) {
            let mut w = self.window.lock();
            if let Some(w) = w.as_mut().filter(|w| w.open()) {
                if w.requests.len() < WINDOW_REQUEST_CAP {
                    let t_ms = w.t_ms();
                    w.requests.push(RequestEvent {
                        t_ms,
                        operation,
                        name: name.unwrap_or_default(),
                        status,
                    });
                }
            }
        }
    }

    /// Whether a recording window is open (callers skip work for it otherwise).
    pub fn recording(&self) -> bool {
        self.window_on.load(Ordering::Relaxed)
    }

    /// Counts request body bytes received.
    pub fn s3_received(&self, bytes: u64) {
        self.s3_in.inc_by(bytes);
    }

    /// Counts response body bytes sent.
    pub fn s3_sent(&self, bytes: u64) {
        self.s3_out.inc_by(bytes);
    }

    /// Records logical block accesses.
    pub fn blocks(&self, blocks: impl Iterator<Item = u64>, write: bool, block_size: usize) {
        let mut n = 0u64;
        if self.window_on.load(Ordering::Relaxed) {
            let mut w = self.window.lock();
            if let Some(w) = w.as_mut().filter(|w| w.open()) {
                for b in blocks {
                    w.logical(b, write);
                    n += 1;
                }
            } else {
                n = blocks.count() as u64;
            }
        } else {
            n = blocks.count() as u64;
        }
        let direction = if write { "written" } else { "read" };
        self.block_bytes.get_or_create(&DirectionLabel { direction }).inc_by(n * block_size as u64);
    }

    /// Records one commit.
    pub fn commit(&self, took: Duration) {
        self.commits.inc();
        self.commit_seconds.observe(took.as_secs_f64());
    }

    /// Counts an integrity error.
    pub fn integrity_error(&self) {
        self.integrity_errors.inc();
    }

    /// Marks the engine as refusing all work.
    pub fn set_poisoned(&self) {
        self.poisoned.set(1);
    }

    /// Whether the engine refuses all work.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.get() != 0
    }

    fn physical(&self, write: bool, cells: &[CellId]) {
        if self.window_on.load(Ordering::Relaxed) {
            let mut w = self.window.lock();
            if let Some(w) = w.as_mut().filter(|w| w.open()) {
                w.physical(write, cells);
            }
        }
    }

    /// Opens a recording window of `length` (at most [`WINDOW_MAX`]) over this observer's
    /// store, replacing any earlier one. Errors if no store is wrapped.
    pub fn start_window(&self, length: Duration, label: &str) -> Result<(), String> {
        let view = (*self.view.lock()).ok_or("no store to watch")?;
        self.start_window_with(view, length, label);
        Ok(())
    }

    fn start_window_with(&self, view: PhysicalView, length: Duration, label: &str) {
        let length = length.min(WINDOW_MAX).max(Duration::from_millis(100));
        *self.window.lock() = Some(Window::new(view, length, label.to_owned()));
        self.window_on.store(true, Ordering::Relaxed);
        *self.window_json.lock() = None;
    }

    /// Whether a window is recording now (its time has not run out).
    pub fn window_open(&self) -> bool {
        self.window.lock().as_ref().is_some_and(Window::open)
    }

    /// The current (or last) window as JSON (`null` if none), built at most once per
    /// [`WINDOW_REPORT_EVERY`]: concurrent polls wait for one build and share it.
    pub fn window_json(&self) -> bytes::Bytes {
        let mut cached = self.window_json.lock();
        if let Some((at, json)) = &*cached {
            if at.elapsed() < WINDOW_REPORT_EVERY {
                return json.clone();
            }
        }
        let json = bytes::Bytes::from(
            serde_json::to_vec(&self.window()).unwrap_or_else(|_| b"null".to_vec()),
        );
        *cached = Some((Instant::now(), json.clone()));
        json
    }

    /// The current (or last) window.
    pub fn window(&self) -> Option<WindowReport> {
        let w = self.window.lock();
        let report = w.as_ref().map(Window::report);
        if report.as_ref().is_some_and(|r| !r.recording) {
            self.window_on.store(false, Ordering::Relaxed);
        }
        report
    }

    /// Sets the fullness gauges (before a scrape or a sample).
    pub fn set_usage(&self, usage: &Usage) {
        let set = |g: &Gauge, v: u64| g.set(i64::try_from(v).unwrap_or(i64::MAX));
        set(&self.blocks_used, usage.blocks_used);
        set(&self.blocks_capacity, usage.blocks_capacity);
        set(&self.objects, usage.objects);
        set(&self.object_bytes, usage.object_bytes);
        set(&self.disk_free, usage.data_dir_free_bytes.unwrap_or(0));
        set(&self.disk_size, usage.data_dir_size_bytes.unwrap_or(0));
        *self.tls_not_after.0.lock() = usage.tls_not_after;
    }

    /// Updates the gauges read at scrape time.
    pub fn refresh(&self, engine: EngineGauges) {
        self.stash.set(engine.stash as i64);
        self.stash_max.set(engine.stash_max as i64);
        self.subtree.set(engine.subtree as i64);
        self.trusted.set(engine.trusted_bytes as i64);
        self.resident.set(resident_bytes() as i64);
        let counts = self.store_counts();
        // Each call takes and drops its own guard on the family.
        let requests = |kind: &'static str, n: u64| {
            self.store_requests
                .get_or_create(&KindLabel { kind })
                .inner()
                .store(n, Ordering::Relaxed)
        };
        requests("read", counts.read_requests);
        requests("read_ranges", counts.range_requests);
        requests("write", counts.write_requests);
        requests("flush", counts.flushes);
        if counts.tee_queries + counts.tee_rounds > 0 {
            requests("tee_query", counts.tee_queries);
            requests("tee_evict", counts.tee_rounds);
        }
        self.store_cells.get_or_create(&KindLabel { kind: "read" }).inner().store(
            counts.cells_read + counts.ranges_read + counts.tee_query_cells + counts.tee_cells_read,
            Ordering::Relaxed,
        );
        self.store_cells
            .get_or_create(&KindLabel { kind: "write" })
            .inner()
            .store(counts.cells_written + counts.tee_cells_written, Ordering::Relaxed);
        self.store_bytes
            .get_or_create(&DirectionLabel { direction: "down" })
            .inner()
            .store(counts.bytes_down(), Ordering::Relaxed);
        self.store_bytes
            .get_or_create(&DirectionLabel { direction: "up" })
            .inner()
            .store(counts.bytes_up(), Ordering::Relaxed);
        // One guard at a time: a family's read guard held while another entry is created
        // would deadlock.
        let read = self.block_bytes.get_or_create_owned(&DirectionLabel { direction: "read" });
        let written =
            self.block_bytes.get_or_create_owned(&DirectionLabel { direction: "written" });
        let logical = read.get() + written.get();
        let store = counts.bytes_down() + counts.bytes_up();
        self.blowup.set(if logical > 0 { store as f64 / logical as f64 } else { 0.0 });
        if let Some((provider, model)) = self.cost_model.lock().as_ref() {
            let (dollars, monthly) = model(&counts, self.stored_bytes.load(Ordering::Relaxed));
            let label = ProviderLabel { provider: provider.clone() };
            self.cost.get_or_create(&label).set(dollars);
            self.storage_cost.get_or_create(&label).set(monthly);
        }
    }

    /// The metrics in Prometheus text format (call [`Observer::refresh`] first).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Appends one second of history (called once a second by the admin listener).
    pub fn sample(&self, engine: EngineGauges) {
        self.refresh(engine);
        let counts = self.store_counts();
        let requests = self.s3_total.load(Ordering::Relaxed);
        let s3_bytes = self.s3_in.get() + self.s3_out.get();
        let store_bytes = counts.bytes_down() + counts.bytes_up();
        let block_bytes = {
            // One guard at a time (see `refresh`).
            let read = self.block_bytes.get_or_create_owned(&DirectionLabel { direction: "read" });
            let written =
                self.block_bytes.get_or_create_owned(&DirectionLabel { direction: "written" });
            read.get() + written.get()
        };
        let mut last = self.last.lock();
        let (r0, s0, b0, l0) = *last;
        *last = (requests, s3_bytes, store_bytes, block_bytes);
        drop(last);
        let block_delta = block_bytes.saturating_sub(l0);
        let mut lat = std::mem::take(&mut *self.recent_latencies.lock());
        lat.sort_by(f32::total_cmp);
        let pct = |p: f64| -> f64 {
            if lat.is_empty() {
                0.0
            } else {
                f64::from(lat[((lat.len() - 1) as f64 * p).round() as usize])
            }
        };
        let cost = self
            .cost_model
            .lock()
            .as_ref()
            .map(|(_, m)| m(&counts, self.stored_bytes.load(Ordering::Relaxed)).0)
            .unwrap_or(0.0);
        let point = HistoryPoint {
            t: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            requests_per_s: requests.saturating_sub(r0) as f64,
            s3_bytes_per_s: s3_bytes.saturating_sub(s0) as f64,
            store_bytes_per_s: store_bytes.saturating_sub(b0) as f64,
            p50_ms: pct(0.5),
            p90_ms: pct(0.9),
            p99_ms: pct(0.99),
            blowup: self.blowup.get(),
            blowup_interval: (block_delta > 0)
                .then(|| store_bytes.saturating_sub(b0) as f64 / block_delta as f64),
            stash: engine.stash,
            cost_dollars: cost,
            resident_bytes: resident_bytes(),
        };
        let mut h = self.history.lock();
        if h.len() >= HISTORY_POINTS {
            h.pop_front();
        }
        h.push_back(point);
    }

    /// The dashboard history, oldest first.
    pub fn history(&self) -> Vec<HistoryPoint> {
        self.history.lock().iter().cloned().collect()
    }
}

/// `tls_certificate_expiry_timestamp_seconds`, present only once a certificate is known (a
/// gateway without TLS has no such series, rather than a misleading 0).
#[derive(Debug, Default)]
struct TlsExpiry(Mutex<Option<i64>>);

impl prometheus_client::collector::Collector for TlsExpiry {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let Some(t) = *self.0.lock() else { return Ok(()) };
        let gauge = prometheus_client::metrics::gauge::ConstGauge::new(t);
        let metric = encoder.encode_descriptor(
            "tls_certificate_expiry_timestamp_seconds",
            "End of validity (notAfter) of the certificate the listeners present, unix seconds",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

/// The store beneath the tap, counted.
type Counted = CountingStore<Arc<dyn Store>>;

/// A remote trusted component's store beneath its tap, counted.
type CountedTee = CountingStore<Arc<dyn TeeStore>>;

/// Resident memory of this process in bytes (0 where `/proc` is not available).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

/// Feeds an [`Observer`]'s recording windows with every request to the store (the counting
/// is done by the [`CountingStore`] beneath). Over a store with a remote trusted component
/// (`S = Arc<CountedTee>`) the cells each TEE query reads are fed too; a round's cells follow a
/// public schedule and are left out.
#[derive(Debug)]
pub struct TappedStore<S = Arc<Counted>> {
    inner: S,
    observer: Arc<Observer>,
}

impl<S> TappedStore<S> {
    /// Feeds the cells of a write to the recording window, if one is open.
    fn note_write<B>(&self, cells: &[(CellId, B)]) {
        if self.observer.recording() {
            let ids: Vec<CellId> = cells.iter().map(|c| c.0).collect();
            self.observer.physical(true, &ids);
        }
    }
}

#[async_trait]
impl<S: Store> Store for TappedStore<S> {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        self.observer.physical(false, cells);
        self.inner.read(cells).await
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        if self.observer.recording() {
            let cells: Vec<CellId> = ranges.iter().map(|r| r.cell).collect();
            self.observer.physical(false, &cells);
        }
        self.inner.read_ranges(ranges).await
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
        self.note_write(&cells);
        self.inner.write(cells).await
    }

    async fn write_shared(
        &self,
        cells: Vec<(CellId, Arc<Vec<u8>>)>,
    ) -> blindfold_store::Result<()> {
        self.note_write(&cells);
        self.inner.write_shared(cells).await
    }

    async fn flush(&self) -> blindfold_store::Result<()> {
        self.inner.flush().await
    }
    fn writes_may_be_retried(&self) -> bool {
        self.inner.writes_may_be_retried()
    }
}

#[async_trait]
impl TeeStore for TappedStore<Arc<CountedTee>> {
    async fn tee_query(&self, cells: &[CellId], ticket: &[u8]) -> blindfold_store::Result<Vec<u8>> {
        self.observer.physical(false, cells);
        self.inner.tee_query(cells, ticket).await
    }

    async fn tee_evict(&self, round: &TeeRound) -> blindfold_store::Result<()> {
        self.inner.tee_evict(round).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blindfold_store::MemoryStore;

    /// A trusted component in another process is reached by TEE requests only: they are
    /// counted, reach the metrics and the recording windows.
    #[tokio::test]
    async fn tee_requests_to_a_remote_trusted_component_are_counted() {
        use blindfold_testkit::tee::{geometry, query_ticket, sample_round, PlainTrusted};
        let observer = Arc::new(Observer::new());
        // As the gateway does: the plain store (unused by the engine here) first.
        let _plain = flat_store(&observer, geometry().cell_count());
        let host: Arc<dyn TeeStore> = Arc::new(blindfold_store::TeeHost::new(
            MemoryStore::new(geometry()),
            Arc::new(PlainTrusted::new()),
        ));
        let tee = observer.wrap_tee_store(host);
        observer.start_window(Duration::from_secs(60), "tee").unwrap();
        tee.tee_query(&[CellId(4), CellId(9)], &query_ticket(1)).await.unwrap();
        tee.tee_evict(&sample_round()).await.unwrap();
        let recorded = observer.window().unwrap().physical;
        assert_eq!(recorded.len(), 2, "the query's two cells, not the round's");
        let c = observer.store_counts();
        assert_eq!((c.tee_queries, c.tee_query_cells, c.tee_rounds), (1, 2, 1));
        assert!(c.bytes_down() > 0 && c.bytes_up() > 0, "{c:?}");
        observer.refresh(EngineGauges::default());
        let text = observer.encode();
        assert!(text.contains("kind=\"tee_query\"} 1"), "{text}");
        assert!(text.contains("kind=\"tee_evict\"} 1"), "{text}");
        // Carried over a release (a growth), not lost.
        observer.release_store();
        assert_eq!(observer.store_counts().tee_queries, 1);
    }

    #[test]
    fn uniformity_tells_uniform_from_skewed() {
        let flat = uniformity(&[100; 32]);
        assert_eq!(flat.samples, 3200);
        assert_eq!(flat.chi_square, 0.0);
        assert!(flat.p_value.unwrap() > 0.99, "{flat:?}");
        let mut skewed = vec![100u64; 32];
        skewed[3] = 400;
        let skewed = uniformity(&skewed);
        assert!(skewed.p_value.unwrap() < 1e-9, "{skewed:?}");
        // Under 5 expected per bin the test means nothing and says so.
        assert_eq!(uniformity(&[1; 32]).p_value, None);
        assert_eq!(uniformity(&[]).p_value, None);
    }

    #[test]
    fn tree_view_maps_leaf_cells_of_either_copy_to_leaves() {
        // A tree of 4 leaves: 7 buckets in heap order, leaves at cells 3..7; a second copy
        // after them.
        let v = PhysicalView::Tree { copy_cells: 7, leaves: 4 };
        assert_eq!(v.targets(), 4);
        assert_eq!(v.target_of(CellId(0)), None);
        assert_eq!(v.target_of(CellId(2)), None);
        assert_eq!(v.target_of(CellId(3)), Some(0));
        assert_eq!(v.target_of(CellId(6)), Some(3));
        assert_eq!(v.target_of(CellId(7 + 4)), Some(1));
        let flat = PhysicalView::Flat { cells: 10 };
        assert_eq!(flat.target_of(CellId(9)), Some(9));
        assert_eq!(flat.target_of(CellId(10)), None);
    }

    fn flat_store(observer: &Arc<Observer>, cells: u64) -> Arc<dyn Store> {
        let geometry = Geometry::new(cells, 64).unwrap();
        let raw: Arc<dyn Store> = Arc::new(MemoryStore::new(geometry));
        observer.wrap_store(raw, PhysicalView::Flat { cells }, geometry.total_bytes())
    }

    #[tokio::test]
    async fn a_window_records_only_while_open_and_bins_reads() {
        let observer = Arc::new(Observer::new());
        let store = flat_store(&observer, 64);
        // Before any window: counted, not recorded.
        store.read(&[CellId(1)]).await.unwrap();
        assert!(observer.window().is_none());
        observer.start_window(Duration::from_millis(300), "t").unwrap();
        for c in 0..64 {
            store.read(&[CellId(c)]).await.unwrap();
        }
        store.read(&[CellId(0)]).await.unwrap();
        store.write(vec![(CellId(5), vec![0; 64])]).await.unwrap();
        let r = observer.window().unwrap();
        assert!(r.recording);
        assert_eq!(r.physical.len(), 66);
        assert_eq!(r.physical.iter().filter(|e| e.write).count(), 1);
        // 64 cells in 32 bins: two reads per bin, one more in bin 0; writes are not binned.
        assert_eq!(r.histogram[0], 3);
        assert!(r.histogram[1..].iter().all(|&c| c == 2), "{:?}", r.histogram);
        tokio::time::sleep(Duration::from_millis(350)).await;
        store.read(&[CellId(7)]).await.unwrap();
        let r = observer.window().unwrap();
        assert!(!r.recording);
        assert_eq!(r.physical.len(), 66, "recorded after the window closed");
        assert!(!observer.recording());
        // The counts beneath saw everything.
        let counts = observer.store_counts();
        assert_eq!(counts.read_requests, 67);
        assert_eq!(counts.write_requests, 1);
    }

    #[tokio::test]
    async fn metrics_carry_operations_and_never_names() {
        let mut observer = Observer::new();
        observer.set_info("path", "two slots per cell", 4096);
        let observer = Arc::new(observer);
        let store = flat_store(&observer, 8);
        observer.start_window(Duration::from_secs(5), "t").unwrap();
        let secret = "payroll-bucket/2026/salaries.xlsx";
        observer.s3("PutObject", 200, Duration::from_millis(3), Some(secret.into()));
        observer.s3("GetObject", 404, Duration::from_millis(1), Some(secret.into()));
        observer.s3_received(1000);
        observer.blocks([1u64, 2].into_iter(), true, 4096);
        observer.commit(Duration::from_millis(2));
        store.read(&[CellId(1), CellId(2)]).await.unwrap();
        observer.refresh(EngineGauges { stash: 3, stash_max: 9, ..Default::default() });
        let text = observer.encode();
        for needle in [
            "blindfold_s3_requests_total{operation=\"PutObject\",status=\"200\"} 1",
            "blindfold_s3_requests_total{operation=\"GetObject\",status=\"404\"} 1",
            "blindfold_s3_received_bytes_total 1000",
            "blindfold_block_bytes_total{direction=\"written\"} 8192",
            "blindfold_store_requests_total{kind=\"read\"} 1",
            "blindfold_store_cells_total{kind=\"read\"} 2",
            "blindfold_commits_total 1",
            "blindfold_stash_blocks 3",
            "blindfold_stash_blocks_max 9",
            "blindfold_info{version=",
            "engine=\"path\"",
            "blindfold_s3_request_duration_seconds_bucket{le=",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
        for word in ["payroll", "salaries", "2026"] {
            assert!(!text.contains(word), "{word:?} leaked into the metrics");
        }
        // The names are in the window, which only the operator starts.
        let w = observer.window().unwrap();
        assert_eq!(w.requests.len(), 2);
        assert_eq!(w.requests[0].name, secret);
    }

    /// The dashboard's blow-up chart shows each second's own ratio, not the total since start
    /// (which flattens out and hides a change).
    #[tokio::test]
    async fn the_blowup_of_each_second_is_its_own() {
        let observer = Arc::new(Observer::new());
        let store = flat_store(&observer, 8);
        observer.blocks([1u64].into_iter(), false, 64);
        store.read(&[CellId(1), CellId(2)]).await.unwrap();
        observer.sample(EngineGauges::default());
        let first = observer.history().last().unwrap().blowup_interval.unwrap();
        observer.sample(EngineGauges::default());
        assert_eq!(observer.history().last().unwrap().blowup_interval, None);
        observer.blocks([1u64].into_iter(), false, 64);
        store.read(&[CellId(3)]).await.unwrap();
        observer.sample(EngineGauges::default());
        let last = observer.history().last().cloned().unwrap();
        assert!((last.blowup_interval.unwrap() - first / 2.0).abs() < 1e-9, "{last:?}");
        assert!((last.blowup - first * 0.75).abs() < 1e-9, "since start: {last:?}");
    }

    #[test]
    fn history_keeps_the_last_points_only() {
        let observer = Observer::new();
        for _ in 0..HISTORY_POINTS + 5 {
            observer.s3("GetObject", 200, Duration::from_millis(10), None);
            observer.sample(EngineGauges::default());
        }
        let h = observer.history();
        assert_eq!(h.len(), HISTORY_POINTS);
        assert_eq!(h.last().unwrap().blowup_interval, None, "no block traffic, no ratio");
        assert_eq!(h.last().unwrap().requests_per_s, 1.0);
        assert!((h.last().unwrap().p50_ms - 10.0).abs() < 0.5);
    }
}
