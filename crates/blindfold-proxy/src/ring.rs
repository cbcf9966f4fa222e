//! [`SealedRingOram`]: Ring ORAM and XOR Ring ORAM over two sealed arrays of an untrusted
//! store — one metadata cell and one data cell per bucket.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blindfold_crypto::{CellAd, CellSealer, XorPads};
use blindfold_oram::ring::{BucketWrite, SlotRead};
use blindfold_oram::{
    BlockId, BucketId, Op, RingInput, RingOram, RingOramConfig, RingOramState, RingPlan, RingRead,
    RingVariant,
};
use blindfold_store::{ByteRange, CellId, Geometry, Store, XorStore};
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::error::{check_array, integrity};
use crate::retry::{with_retry, RetryPolicy};
use crate::sealing::open_cells;
use crate::{ProxyError, Result, VersionTable};

/// The data array: a plain store for Ring ORAM, one that can XOR for XOR Ring ORAM.
#[derive(Clone, Debug)]
pub enum RingData {
    /// Ring ORAM: slots are read with ranged reads.
    Plain(Arc<dyn Store>),
    /// XOR Ring ORAM: online reads ask the store for an XOR.
    Xor(Arc<dyn XorStore>),
}

impl RingData {
    fn store(&self) -> &dyn Store {
        match self {
            RingData::Plain(s) => &**s,
            RingData::Xor(s) => &**s,
        }
    }
}

/// Trusted state of a [`SealedRingOram`] between accesses.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SealedRingState {
    /// The scheme's state (position map, stash, schedule).
    pub oram: RingOramState,
    /// Version of every metadata cell (the data cells' versions live in the sealed metadata).
    pub meta_versions: VersionTable,
}

/// Time spent in each phase of the accesses so far (seed 002's Table 6), summed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RingPhaseTimes {
    /// Reading and opening metadata.
    pub read_meta: Duration,
    /// Sealing and writing metadata on its own (after each access's reads).
    pub write_meta: Duration,
    /// Working out which slot to read in each bucket (the scheme's own CPU time).
    pub get_offsets: Duration,
    /// Reading and opening slots (online and background reads).
    pub read_blocks: Duration,
    /// Choosing and permuting the contents of rewritten buckets (evictions, reshuffles).
    pub reshuffle: Duration,
    /// Sealing and writing whole buckets.
    pub write_buckets: Duration,
}

/// How long the last access took until its answer was known and until it was complete, on
/// tokio's clock (which a benchmark may pause to emulate a link exactly) and on the wall clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessTiming {
    /// From the start of the access to the moment the block's contents were known (tokio's
    /// clock).
    pub response: Duration,
    /// From the start of the access to the end of its last write (tokio's clock).
    pub complete: Duration,
    /// As `response`, on the wall clock.
    pub response_wall: Duration,
    /// As `complete`, on the wall clock.
    pub complete_wall: Duration,
}

/// Ring ORAM or XOR Ring ORAM over sealed, untrusted storage, one access at a time.
///
/// Two arrays: *metadata* (one cell per bucket: the sealed metadata, bound to the bucket and
/// to a trusted per-bucket version) and *data* (one cell per bucket: `Z + S` slots). In Ring
/// ORAM every slot is its own AES-GCM segment (segment `1 + slot`, bound to the bucket and to
/// the data version recorded in the metadata), so a ranged read of one slot is authenticated
/// alone. In XOR Ring ORAM every slot is the block XOR a pad ([`XorPads`]) and carries no tag;
/// what the client recovers is checked against the digest in the metadata.
///
/// Failures poison the instance as with [`SealedPathOram`](crate::SealedPathOram).
///
/// # Security
///
/// See [`blindfold_oram::ring`] for the request pattern and `SECURITY.md` for the XOR
/// variant's integrity argument. Tampering, swapping and rollback are detected in both
/// variants and surface as [`ProxyError::Integrity`] or
/// [`OramError::Integrity`](blindfold_oram::OramError::Integrity) (see
/// [`ProxyError::is_integrity`]).
pub struct SealedRingOram {
    oram: RingOram,
    meta: Arc<dyn Store>,
    data: RingData,
    sealer: CellSealer,
    pads: Option<XorPads>,
    versions: VersionTable,
    retry: RetryPolicy,
    poisoned: bool,
    phases: RingPhaseTimes,
    last: AccessTiming,
}

impl std::fmt::Debug for SealedRingOram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedRingOram")
            .field("oram", &self.oram)
            .field("meta", &self.meta)
            .field("data", &self.data)
            .finish_non_exhaustive()
    }
}

/// Bytes of one slot in the data array.
fn segment_len(config: &RingOramConfig) -> usize {
    config.block_size() as usize
        + match config.variant() {
            RingVariant::Ring => CellSealer::OVERHEAD,
            RingVariant::XorRing => 0,
        }
}

impl SealedRingOram {
    /// The shape of the metadata array: one cell per bucket.
    pub fn meta_geometry(config: &RingOramConfig) -> Result<Geometry> {
        Ok(Geometry::new(config.buckets(), (config.meta_bytes() + CellSealer::OVERHEAD) as u32)?)
    }

    /// The shape of the data array: one cell of `Z + S` slots per bucket.
    pub fn data_geometry(config: &RingOramConfig) -> Result<Geometry> {
        let cell = segment_len(config) * config.slots() as usize;
        let cell = u32::try_from(cell).map_err(|_| ProxyError::Geometry {
            found: "-".into(),
            needed: format!("cells of {cell} bytes"),
        })?;
        Ok(Geometry::new(config.buckets(), cell)?)
    }

    /// Ring ORAM over `meta` and `data` (fresh arrays of the shapes above).
    pub fn new(
        config: RingOramConfig,
        meta: Arc<dyn Store>,
        data: RingData,
        sealer: CellSealer,
        pads: Option<XorPads>,
    ) -> Result<Self> {
        Self::with_oram(RingOram::new(config), meta, data, sealer, pads)
    }

    /// Drives an existing scheme instance (for example a seeded one). The XOR variant needs
    /// `data` to be [`RingData::Xor`] and `pads`.
    pub fn with_oram(
        oram: RingOram,
        meta: Arc<dyn Store>,
        data: RingData,
        sealer: CellSealer,
        pads: Option<XorPads>,
    ) -> Result<Self> {
        let versions = VersionTable::new(oram.config().buckets());
        Self::assemble(oram, meta, data, sealer, pads, versions)
    }

    /// Continues from exported trusted state.
    pub fn from_state(
        state: SealedRingState,
        meta: Arc<dyn Store>,
        data: RingData,
        sealer: CellSealer,
        pads: Option<XorPads>,
        rng: ChaCha20Rng,
    ) -> Result<Self> {
        let oram = RingOram::from_state(state.oram, rng)?;
        if state.meta_versions.len() != oram.config().buckets() {
            return Err(ProxyError::State("version table does not match the tree".into()));
        }
        Self::assemble(oram, meta, data, sealer, pads, state.meta_versions)
    }

    fn assemble(
        mut oram: RingOram,
        meta: Arc<dyn Store>,
        data: RingData,
        sealer: CellSealer,
        pads: Option<XorPads>,
        versions: VersionTable,
    ) -> Result<Self> {
        let config = oram.config().clone();
        check_array(meta.geometry(), Self::meta_geometry(&config)?, "metadata array")?;
        check_array(data.store().geometry(), Self::data_geometry(&config)?, "data array")?;
        if config.variant() == RingVariant::XorRing {
            let Some(p) = &pads else {
                return Err(ProxyError::State("XOR Ring ORAM needs pads".into()));
            };
            if !matches!(data, RingData::Xor(_)) {
                return Err(ProxyError::Store(blindfold_store::StoreError::Unsupported(
                    "server-side XOR: XOR Ring ORAM needs a data store that can XOR".into(),
                )));
            }
            oram.set_write_epoch(p.epoch());
        }
        Ok(Self {
            oram,
            meta,
            data,
            sealer,
            pads,
            versions,
            retry: RetryPolicy::default(),
            poisoned: false,
            phases: RingPhaseTimes::default(),
            last: AccessTiming::default(),
        })
    }

    /// Exports the trusted state (between accesses).
    pub fn export_state(&self) -> Result<SealedRingState> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        Ok(SealedRingState {
            oram: self.oram.export_state()?,
            meta_versions: self.versions.clone(),
        })
    }

    /// Puts other handles on the same arrays in place (for example the same stores seen
    /// through a [`blindfold_store::LatencyStore`] after a fast bulk load).
    pub fn replace_stores(&mut self, meta: Arc<dyn Store>, data: RingData) -> Result<()> {
        let config = self.oram.config();
        if meta.geometry() != Self::meta_geometry(config)?
            || data.store().geometry() != Self::data_geometry(config)?
            || matches!(data, RingData::Plain(_)) && config.variant() == RingVariant::XorRing
        {
            return Err(ProxyError::Geometry {
                found: "other stores".into(),
                needed: "the same shapes and capabilities".into(),
            });
        }
        self.meta = meta;
        self.data = data;
        Ok(())
    }

    /// The scheme (configuration, statistics, stash).
    pub fn oram(&self) -> &RingOram {
        &self.oram
    }

    /// Time spent in each phase so far.
    pub fn phase_times(&self) -> &RingPhaseTimes {
        &self.phases
    }

    /// Timing of the last completed access.
    pub fn last_timing(&self) -> AccessTiming {
        self.last
    }

    /// Bytes of trusted memory: the scheme's state and the metadata versions.
    pub fn trusted_bytes(&self) -> u64 {
        self.oram.trusted_bytes() + self.versions.trusted_bytes()
    }

    /// Reads a block (zeros if never written).
    pub async fn read(&mut self, block: BlockId) -> Result<Vec<u8>> {
        self.access(block, Op::Read).await
    }

    /// Writes a block.
    pub async fn write(&mut self, block: BlockId, data: Vec<u8>) -> Result<()> {
        self.access(block, Op::Write(data)).await.map(drop)
    }

    /// One logical access; returns the block's contents before it.
    pub async fn access(&mut self, block: BlockId, op: Op) -> Result<Vec<u8>> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        let started = (tokio::time::Instant::now(), Instant::now());
        let plan = self.oram.start(block, op)?;
        match self.run(plan, started).await {
            Ok(data) => {
                self.last.complete = started.0.elapsed();
                self.last.complete_wall = started.1.elapsed();
                self.oram.check_stash()?;
                Ok(data)
            }
            Err(e) => {
                self.oram.abort();
                self.poisoned = true;
                tracing::warn!(error = %e, "Ring ORAM access failed part-way; instance poisoned");
                Err(e)
            }
        }
    }

    /// Fills a fresh ORAM so that block `i` holds `data(BlockId(i))`, writing every bucket
    /// once ([`RingOram::bulk_load`]).
    ///
    /// # Security
    ///
    /// Every metadata and data cell is written once, in bucket order; nothing is read.
    pub async fn bulk_load(&mut self, data: impl FnMut(BlockId) -> Vec<u8>) -> Result<()> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        let writes = self.oram.bulk_load(data)?;
        for chunk in writes.chunks(256) {
            if let Err(e) = self.write_buckets(chunk.to_vec()).await {
                self.poisoned = true;
                return Err(e);
            }
        }
        self.oram.check_stash()?;
        Ok(())
    }

    async fn run(
        &mut self,
        mut plan: RingPlan,
        started: (tokio::time::Instant, Instant),
    ) -> Result<Vec<u8>> {
        let mut answer = None;
        loop {
            if let Some(a) = plan.answer.take() {
                self.last.response = started.0.elapsed();
                self.last.response_wall = started.1.elapsed();
                answer = Some(a);
            }
            let t = Instant::now();
            let meta_only = self.seal_metas(std::mem::take(&mut plan.meta_writes))?;
            let seal_meta = t.elapsed();
            let t = Instant::now();
            let (cells, metas) = self.seal_buckets(std::mem::take(&mut plan.bucket_writes))?;
            let seal_buckets = t.elapsed();
            let read = plan.read;
            let ((w_meta, d_meta), (w_buckets, d_buckets), (input, d_read)) = tokio::join!(
                timed(self.put(&*self.meta, meta_only)),
                timed(self.put_buckets(cells, metas)),
                timed(self.fetch(&read)),
            );
            w_meta?;
            w_buckets?;
            let input = input?;
            if d_meta > Duration::ZERO {
                self.phases.write_meta += seal_meta + d_meta;
            }
            if d_buckets > Duration::ZERO {
                self.phases.write_buckets += seal_buckets + d_buckets;
            }
            let Some(input) = input else {
                return Ok(answer.expect("a completed access has an answer"));
            };
            match (&input, &read) {
                (RingInput::Meta(_), _) => self.phases.read_meta += d_read,
                _ => self.phases.read_blocks += d_read,
            }
            let background = matches!(input, RingInput::Slots(_)) && answer.is_some();
            let t = Instant::now();
            plan = self.oram.feed(input).map_err(ProxyError::Oram)?;
            if background {
                self.phases.reshuffle += t.elapsed();
            } else {
                self.phases.get_offsets += t.elapsed();
            }
        }
    }

    fn seal_metas(&mut self, writes: Vec<(BucketId, Vec<u8>)>) -> Result<Vec<(CellId, Vec<u8>)>> {
        let mut out = Vec::with_capacity(writes.len());
        for (b, plain) in writes {
            let version = self.versions.next(b.0);
            let ad = CellAd { cell: b.0, version, segment: 0 };
            let sealed = self.sealer.seal(&ad, &plain).map_err(ProxyError::Crypto)?;
            self.versions.record(b.0, version, &sealed);
            out.push((CellId(b.0), sealed));
        }
        Ok(out)
    }

    /// Seals whole buckets: data cells (every slot) and metadata cells.
    #[allow(clippy::type_complexity)]
    fn seal_buckets(
        &mut self,
        writes: Vec<BucketWrite>,
    ) -> Result<(Vec<(CellId, Vec<u8>)>, Vec<(CellId, Vec<u8>)>)> {
        let seg = segment_len(self.oram.config());
        let mut cells = Vec::with_capacity(writes.len());
        let mut metas = Vec::with_capacity(writes.len());
        for w in writes {
            let mut cell = vec![0u8; seg * w.slots.len()];
            for (k, (slot, out)) in w.slots.iter().zip(cell.chunks_exact_mut(seg)).enumerate() {
                match &self.pads {
                    None => {
                        let ad =
                            CellAd { cell: w.bucket.0, version: w.version, segment: 1 + k as u32 };
                        self.sealer.seal_into(&ad, slot, out).map_err(ProxyError::Crypto)?;
                    }
                    Some(pads) => {
                        out.copy_from_slice(slot);
                        pads.apply(w.epoch, w.bucket.0, w.version, k as u32, out)
                            .map_err(ProxyError::Crypto)?;
                    }
                }
            }
            cells.push((CellId(w.bucket.0), cell));
            metas.push((w.bucket, w.meta));
        }
        let metas = self.seal_metas(metas)?;
        Ok((cells, metas))
    }

    /// Writes sealed cells to `store`, retrying (writes are idempotent).
    async fn put(&self, store: &dyn Store, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        if cells.is_empty() {
            return Ok(());
        }
        Ok(with_retry(self.retry, || store.write(cells.clone())).await?)
    }

    /// Writes whole buckets: data and metadata cells, concurrently.
    async fn put_buckets(
        &self,
        cells: Vec<(CellId, Vec<u8>)>,
        metas: Vec<(CellId, Vec<u8>)>,
    ) -> Result<()> {
        let (a, b) = tokio::join!(self.put(self.data.store(), cells), self.put(&*self.meta, metas));
        a.and(b)
    }

    /// Seals and writes whole buckets (bulk load).
    async fn write_buckets(&mut self, writes: Vec<BucketWrite>) -> Result<()> {
        let (cells, metas) = self.seal_buckets(writes)?;
        self.put_buckets(cells, metas).await
    }

    fn ranges(&self, slots: &[SlotRead]) -> Vec<ByteRange> {
        let seg = segment_len(self.oram.config()) as u32;
        slots
            .iter()
            .map(|r| ByteRange { cell: CellId(r.bucket.0), offset: r.slot * seg, len: seg })
            .collect()
    }

    /// Carries out a read; `None` when the plan is done.
    async fn fetch(&self, read: &RingRead) -> Result<Option<RingInput>> {
        let retry = self.retry;
        match read {
            RingRead::Done => Ok(None),
            RingRead::Meta(buckets) => {
                let cells: Vec<CellId> = buckets.iter().map(|b| CellId(b.0)).collect();
                let meta = &self.meta;
                let fetched = with_retry(retry, || meta.read(&cells)).await?;
                let plain = open_cells(&self.sealer, &self.versions, &cells, fetched)?;
                Ok(Some(RingInput::Meta(plain)))
            }
            RingRead::Slots(slots) => {
                let ranges = self.ranges(slots);
                let data = self.data.store();
                let fetched = with_retry(retry, || data.read_ranges(&ranges)).await?;
                let mut out = Vec::with_capacity(slots.len());
                for (r, mut buf) in slots.iter().zip(fetched) {
                    out.push(self.open_slot(r, &mut buf)?);
                }
                Ok(Some(RingInput::Slots(out)))
            }
            RingRead::Xor(slots) => {
                let RingData::Xor(store) = &self.data else {
                    return Err(ProxyError::State("XOR read without an XOR store".into()));
                };
                let pads = self.pads.as_ref().expect("checked when assembled");
                let ranges = self.ranges(slots);
                let mut x = with_retry(retry, || store.read_xor(&ranges)).await?;
                for r in slots.iter().filter(|r| r.version != 0) {
                    pads.apply(r.epoch, r.bucket.0, r.version, r.slot, &mut x)
                        .map_err(ProxyError::Crypto)?;
                }
                Ok(Some(RingInput::Xor(x)))
            }
        }
    }

    /// Opens one slot's bytes: authenticates a Ring ORAM segment, strips an XOR pad.
    fn open_slot(&self, r: &SlotRead, buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>> {
        match &self.pads {
            None => {
                if r.version == 0 {
                    return Ok(None);
                }
                let ad = CellAd { cell: r.bucket.0, version: r.version, segment: 1 + r.slot };
                let plain =
                    self.sealer.open_in_place(&ad, buf).map_err(|e| integrity(r.bucket.0, e))?;
                Ok(Some(plain.to_vec()))
            }
            Some(pads) => {
                let mut plain = std::mem::take(buf);
                if r.version != 0 {
                    pads.apply(r.epoch, r.bucket.0, r.version, r.slot, &mut plain)
                        .map_err(ProxyError::Crypto)?;
                }
                Ok(Some(plain))
            }
        }
    }
}

/// Runs `fut` and measures how long it took.
async fn timed<T>(fut: impl std::future::Future<Output = T>) -> (T, Duration) {
    let t = Instant::now();
    let out = fut.await;
    (out, t.elapsed())
}
