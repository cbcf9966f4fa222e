//! [`SealedOnionOram`]: Onion ORAM ([`blindfold_oram::onion`]) over a metadata array and a
//! data array that computes homomorphic selects ([`SelectStore`]).
//!
//! # What is stored
//!
//! * **Metadata**: one cell per bucket, the bucket's [`BucketMeta`] sealed with AES-GCM and
//!   bound to the bucket and to a trusted per-bucket version ([`VersionTable`]).
//! * **Data**: one cell per slot. The innermost content of a block is the block sealed with
//!   AES-GCM, bound to the block id and to the block's trusted write counter (kept in the
//!   position map). It is cut into `C` pieces of `plaintext_chunk_len(s0)` bytes, `s0` the
//!   configuration's first layer ([`OnionOramConfig::first_layer`]); a slot of onion depth `d`
//!   holds `C` Damgård–Jurik ciphertexts of layer `s0 + d - 1`, each
//!   `ciphertext_len(s0 + d - 1)` bytes, and a select over depth-`d` slots (selector of layer
//!   `s0 + d`, chunk = one ciphertext of layer `s0 + d - 1`) turns them into `C` ciphertexts of
//!   layer `s0 + d`. The store's cells are sized for the deepest slots (a leaf's halves);
//!   shallower slots use a prefix.
//!
//! A chunk at depth `d` is therefore `(s0 + d) / s0` times the size of the plaintext piece it
//! carries (Damgård–Jurik's `(1 + 1/s)` per layer, compounded from `s = s0`), plus the AES-GCM
//! overhead and the rounding to whole pieces.
//!
//! # Integrity
//!
//! Metadata is authenticated (tampering, swapping and rollback fail the AES-GCM open). The
//! block that an access selects is opened with AES-GCM after peeling every layer, so a store
//! that tampers with slots, rolls them back, swaps them, or computes a select other than the
//! one asked for, is caught when the block it damaged is read: an integrity error, never wrong
//! data. A store that misbehaves on purpose can still learn whether a slot it damaged was the
//! one read (the read fails or not); SECURITY.md states this (Onion ORAM's semi-honest server
//! for the homomorphic part).
//!
//! Failures poison the instance as with [`SealedPathOram`](crate::SealedPathOram).

use std::sync::Arc;
use std::time::{Duration, Instant};

use blindfold_crypto::{CellAd, CellSealer};
use blindfold_dj::{Ciphertext, DjError, Integer, PublicKey, SecretKey};
use blindfold_oram::onion::{BucketMeta, EvictionPlan, SlotGroup};
use blindfold_oram::{BlockId, BucketId, OnionOram, OnionOramConfig, OnionOramState, OramError};
use blindfold_store::{
    ByteRange, CellId, CombinedSelect, Geometry, SelectRequest, SelectStore, SelectWrite, Store,
};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};

use crate::error::{check_array, integrity};
use crate::{ProxyError, Result, VersionTable};

/// Time spent in each phase (the reference paper's Table 5), summed over the accesses and
/// evictions so far.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OnionPhaseTimes {
    /// Encrypting the access's selection vectors (one per group of the path, and the one over
    /// the groups).
    pub select_vectors: Duration,
    /// The store's combined select (computation and transfer).
    pub server_select: Duration,
    /// Peeling the answer down to the sealed block and opening it.
    pub decrypt: Duration,
    /// Sealing the block and encrypting it (one layer) for the root.
    pub root_encrypt: Duration,
    /// Encrypting the triplet eviction's selection vectors.
    pub eviction_vectors: Duration,
    /// The store computing and keeping the eviction's selects.
    pub eviction_select: Duration,
    /// Stripping the leaf: downloading it, peeling its blocks, re-encrypting the stripped
    /// area under one layer and writing it.
    pub leaf_strip: Duration,
    /// Reading, opening, sealing and writing metadata.
    pub metadata: Duration,
}

/// Trusted state of a [`SealedOnionOram`] between accesses (the Damgård–Jurik key is kept
/// apart: it is key material, sealed like the master key).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SealedOnionState {
    /// The scheme's state (position map with write counters, schedule).
    pub oram: OnionOramState,
    /// Version of every metadata cell.
    pub meta_versions: VersionTable,
}

/// Onion ORAM over sealed, untrusted storage, one access at a time.
pub struct SealedOnionOram {
    oram: OnionOram,
    meta: Arc<dyn Store>,
    data: Arc<dyn SelectStore>,
    sealer: CellSealer,
    key: Arc<SecretKey>,
    public: Arc<PublicKey>,
    versions: VersionTable,
    rng: ChaCha20Rng,
    poisoned: bool,
    phases: OnionPhaseTimes,
    chunks: usize,
    /// The layer of the select that combines the path's groups (1: Paillier, cheapest per
    /// byte; the answer is then twice the deepest group's answer).
    combine_layer: u32,
}

impl std::fmt::Debug for SealedOnionOram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedOnionOram")
            .field("oram", &self.oram)
            .field("meta", &self.meta)
            .field("data", &self.data)
            .finish_non_exhaustive()
    }
}

fn dj(what: &str, e: DjError) -> ProxyError {
    ProxyError::Oram(OramError::Integrity(format!("{what}: {e}")))
}

impl SealedOnionOram {
    /// Chunks per block: the sealed block cut into plaintexts of the first layer.
    pub fn chunks(config: &OnionOramConfig, public: &PublicKey) -> Result<usize> {
        let piece = public.plaintext_chunk_len(config.first_layer()).map_err(|e| dj("key", e))?;
        Ok((config.block_size() as usize + CellSealer::OVERHEAD).div_ceil(piece))
    }

    /// Bytes of a slot of onion depth `depth`.
    pub fn slot_len(config: &OnionOramConfig, public: &PublicKey, depth: u32) -> Result<usize> {
        Ok(Self::chunks(config, public)? * Self::chunk_len(config, public, depth)?)
    }

    /// Bytes of one chunk of a slot of onion depth `depth` (a ciphertext of its layer).
    pub fn chunk_len(config: &OnionOramConfig, public: &PublicKey, depth: u32) -> Result<usize> {
        public.ciphertext_len(config.layer(depth)).map_err(|e| dj("key", e))
    }

    /// The shape of the metadata array: one cell per bucket.
    pub fn meta_geometry(config: &OnionOramConfig) -> Result<Geometry> {
        Ok(Geometry::new(config.buckets(), (config.meta_bytes() + CellSealer::OVERHEAD) as u32)?)
    }

    /// The shape of the data array: one cell per slot, sized for the deepest slots.
    pub fn data_geometry(config: &OnionOramConfig, public: &PublicKey) -> Result<Geometry> {
        let len = Self::slot_len(config, public, config.max_depth())?;
        let len = u32::try_from(len).map_err(|_| ProxyError::Geometry {
            found: "-".into(),
            needed: format!("cells of {len} bytes"),
        })?;
        Ok(Geometry::new(config.data_cells(), len)?)
    }

    /// Onion ORAM over fresh `meta` and `data` arrays of the shapes above.
    pub fn new(
        oram: OnionOram,
        meta: Arc<dyn Store>,
        data: Arc<dyn SelectStore>,
        sealer: CellSealer,
        key: SecretKey,
    ) -> Result<Self> {
        let versions = VersionTable::new(oram.config().buckets());
        Self::assemble(oram, meta, data, sealer, key, versions)
    }

    /// Continues from exported trusted state.
    pub fn from_state(
        state: SealedOnionState,
        meta: Arc<dyn Store>,
        data: Arc<dyn SelectStore>,
        sealer: CellSealer,
        key: SecretKey,
        rng: ChaCha20Rng,
    ) -> Result<Self> {
        let oram = OnionOram::from_state(state.oram, rng)?;
        if state.meta_versions.len() != oram.config().buckets() {
            return Err(ProxyError::State("version table does not match the tree".into()));
        }
        Self::assemble(oram, meta, data, sealer, key, state.meta_versions)
    }

    fn assemble(
        oram: OnionOram,
        meta: Arc<dyn Store>,
        data: Arc<dyn SelectStore>,
        sealer: CellSealer,
        key: SecretKey,
        versions: VersionTable,
    ) -> Result<Self> {
        let config = oram.config().clone();
        let public = Arc::new(key.public().clone());
        // The deepest select's selector: a leaf's halves are selected by the access.
        let top = config.layer(config.max_depth()) + 1;
        if top > blindfold_dj::MAX_LAYER {
            return Err(ProxyError::Oram(OramError::InvalidConfig(format!(
                "first layer {} and tree height {} need Damgård–Jurik layer {top}; at most {}",
                config.first_layer(),
                config.max_depth() - 1,
                blindfold_dj::MAX_LAYER
            ))));
        }
        check_array(meta.geometry(), Self::meta_geometry(&config)?, "metadata array")?;
        check_array(data.geometry(), Self::data_geometry(&config, &public)?, "data array")?;
        let chunks = Self::chunks(&config, &public)?;
        Ok(Self {
            oram,
            meta,
            data,
            sealer,
            key: Arc::new(key),
            public,
            versions,
            rng: ChaCha20Rng::from_entropy(),
            poisoned: false,
            phases: OnionPhaseTimes::default(),
            chunks,
            combine_layer: 1,
        })
    }

    /// Exports the trusted state (between accesses).
    pub fn export_state(&self) -> Result<SealedOnionState> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        Ok(SealedOnionState {
            oram: self.oram.export_state()?,
            meta_versions: self.versions.clone(),
        })
    }

    /// The scheme (configuration, statistics).
    pub fn oram(&self) -> &OnionOram {
        &self.oram
    }

    /// The Damgård–Jurik public key the store computes with.
    pub fn public_key(&self) -> &Arc<PublicKey> {
        &self.public
    }

    /// Time spent in each phase so far.
    pub fn phase_times(&self) -> &OnionPhaseTimes {
        &self.phases
    }

    /// Bytes of trusted memory: the position map and the metadata versions.
    pub fn trusted_bytes(&self) -> u64 {
        self.oram.trusted_bytes() + self.versions.trusted_bytes()
    }

    /// Reads a block (zeros if never written).
    pub async fn read(&mut self, block: BlockId) -> Result<Vec<u8>> {
        self.access(block, None).await
    }

    /// Writes a block.
    pub async fn write(&mut self, block: BlockId, data: Vec<u8>) -> Result<()> {
        self.access(block, Some(data)).await.map(drop)
    }

    /// One logical access (a write if `data` is given); returns the block's contents before it.
    pub async fn access(&mut self, block: BlockId, data: Option<Vec<u8>>) -> Result<Vec<u8>> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        if let Some(d) = &data {
            if d.len() != self.oram.config().block_size() as usize {
                return Err(ProxyError::Oram(OramError::WrongBlockSize {
                    got: d.len(),
                    expected: self.oram.config().block_size(),
                }));
            }
        }
        // Refused requests (block out of range) fail here, before anything reaches the store,
        // and leave the instance usable.
        let buckets = self.oram.start(block)?;
        match self.run(block, buckets, data).await {
            Ok(old) => Ok(old),
            Err(e) => {
                self.oram.abort();
                self.poisoned = true;
                tracing::warn!(error = %e, "Onion ORAM access failed part-way; instance poisoned");
                Err(e)
            }
        }
    }

    /// Fills a fresh ORAM so that block `i` holds `data(BlockId(i))` for `i < count`, each
    /// sealed and encrypted under one layer straight into a stripped slot of a uniformly random
    /// leaf ([`OnionOram::bulk_place`]).
    pub async fn bulk_load(
        &mut self,
        count: u64,
        mut data: impl FnMut(BlockId) -> Vec<u8>,
    ) -> Result<()> {
        if self.poisoned {
            return Err(ProxyError::Poisoned);
        }
        let placed = self.oram.bulk_place(count)?;
        let bs = self.oram.config().block_size() as usize;
        let mut batch = Vec::new();
        for (block, cell) in placed.cells {
            let content = data(block);
            if content.len() != bs {
                self.poisoned = true;
                return Err(ProxyError::Oram(OramError::WrongBlockSize {
                    got: content.len(),
                    expected: bs as u32,
                }));
            }
            let ad = CellAd { cell: block.0, version: 1, segment: 1 };
            let sealed = self.sealer.seal(&ad, &content).map_err(ProxyError::Crypto)?;
            batch.push((cell, self.encrypt_block(&sealed)?));
            if batch.len() >= 64 {
                self.data.write(std::mem::take(&mut batch)).await?;
            }
        }
        if !batch.is_empty() {
            self.data.write(batch).await?;
        }
        self.write_metas(placed.metas).await
    }

    async fn read_metas(&mut self, buckets: &[BucketId]) -> Result<Vec<BucketMeta>> {
        let t = Instant::now();
        let cells: Vec<CellId> = buckets.iter().map(|b| CellId(b.0)).collect();
        let raw = self.meta.read(&cells).await?;
        let config = self.oram.config().clone();
        let mut out = Vec::with_capacity(raw.len());
        for (b, sealed) in buckets.iter().zip(raw) {
            let version = self.versions.get(b.0);
            if version == 0 {
                out.push(BucketMeta::empty(config.slots_of(*b)));
                continue;
            }
            let ad = CellAd { cell: b.0, version, segment: 0 };
            let plain = self.sealer.open(&ad, &sealed).map_err(|e| integrity(b.0, e))?;
            out.push(BucketMeta::decode(&config, config.slots_of(*b), &plain)?);
        }
        self.phases.metadata += t.elapsed();
        Ok(out)
    }

    async fn write_metas(&mut self, metas: Vec<(BucketId, BucketMeta)>) -> Result<()> {
        let t = Instant::now();
        let len = self.oram.config().meta_bytes();
        let mut cells = Vec::with_capacity(metas.len());
        for (b, m) in metas {
            let version = self.versions.next(b.0);
            let ad = CellAd { cell: b.0, version, segment: 0 };
            let sealed = self.sealer.seal(&ad, &m.encode(len)).map_err(ProxyError::Crypto)?;
            self.versions.record(b.0, version, &sealed);
            cells.push((CellId(b.0), sealed));
        }
        self.meta.write(cells).await?;
        self.phases.metadata += t.elapsed();
        Ok(())
    }

    /// The Damgård–Jurik layer of a slot of onion depth `depth`.
    fn layer(&self, depth: u32) -> u32 {
        self.oram.config().layer(depth)
    }

    /// Encrypts `bits` (0 or 1) at `layer`, on all cores.
    fn encrypt_bits(&mut self, bits: &[bool], layer: u32) -> Result<Vec<Ciphertext>> {
        let values: Vec<Integer> = bits.iter().map(|&b| Integer::from(u32::from(b))).collect();
        self.key.encrypt_many(&values, layer, &mut self.rng).map_err(|e| dj("selector", e))
    }

    /// The store's request for a select over `group`'s slots under `selector`.
    fn select_request(
        &self,
        group: &SlotGroup,
        selector: Vec<Ciphertext>,
    ) -> Result<SelectRequest> {
        let config = self.oram.config();
        let len = Self::slot_len(config, &self.public, group.depth)? as u32;
        let chunk_len = Self::chunk_len(config, &self.public, group.depth)? as u32;
        Ok(SelectRequest {
            public_key: Arc::clone(&self.public),
            selector,
            ranges: group.cells.iter().map(|&cell| ByteRange { cell, offset: 0, len }).collect(),
            chunk_len,
        })
    }

    /// Encrypts a block's innermost bytes (sealed block, padded to whole pieces) under one
    /// onion (the first layer): a whole data cell (zero-padded).
    fn encrypt_block(&mut self, innermost: &[u8]) -> Result<Vec<u8>> {
        let first = self.oram.config().first_layer();
        let piece = self.public.plaintext_chunk_len(first).map_err(|e| dj("key", e))?;
        let mut padded = innermost.to_vec();
        padded.resize(self.chunks * piece, 0);
        let values: Vec<Integer> = padded
            .chunks(piece)
            .map(|c| self.public.plaintext_from_bytes(first, c))
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| dj("block", e))?;
        let cs =
            self.key.encrypt_many(&values, first, &mut self.rng).map_err(|e| dj("block", e))?;
        let cell = self.data.geometry().cell_size() as usize;
        let mut out = Vec::with_capacity(cell);
        for c in &cs {
            out.extend_from_slice(&self.public.ciphertext_to_bytes(c));
        }
        out.resize(cell, 0);
        Ok(out)
    }

    /// Peels a slot's content of onion depth `depth` (its first `slot_len(depth)` bytes) down
    /// to the innermost bytes, on all cores.
    fn peel(&self, bytes: &[u8], depth: u32) -> Result<Vec<u8>> {
        let config = self.oram.config();
        let (layer, first) = (config.layer(depth), config.first_layer());
        let clen = Self::chunk_len(config, &self.public, depth)?;
        let piece = self.public.plaintext_chunk_len(first).map_err(|e| dj("key", e))?;
        let need = self.chunks * clen;
        if bytes.len() < need {
            return Err(dj(
                "slot",
                DjError::Shape { what: "slot bytes", left: bytes.len(), right: need },
            ));
        }
        let cs = bytes[..need]
            .chunks(clen)
            .map(|b| self.public.ciphertext_from_bytes(layer, b))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| dj("peeling a slot", e))?;
        let mut out = Vec::with_capacity(self.chunks * piece);
        for m in self.key.peel_all_many(&cs, first) {
            let m = m.map_err(|e| dj("peeling a slot", e))?;
            out.extend(
                self.public.plaintext_to_bytes(&m, piece).map_err(|e| dj("peeling a slot", e))?,
            );
        }
        Ok(out)
    }

    fn open_block(&self, innermost: &[u8], block: BlockId, version: u64) -> Result<Vec<u8>> {
        let sealed_len = self.oram.config().block_size() as usize + CellSealer::OVERHEAD;
        let ad = CellAd { cell: block.0, version, segment: 1 };
        self.sealer.open(&ad, &innermost[..sealed_len]).map_err(|e| integrity(block.0, e))
    }

    async fn run(
        &mut self,
        block: BlockId,
        buckets: Vec<BucketId>,
        data: Option<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let metas = self.read_metas(&buckets).await?;
        let plan = self.oram.plan_select(metas)?;

        // Selection vectors: one per group at its depth + 1, one over the groups.
        let t = Instant::now();
        let mut groups = Vec::with_capacity(plan.groups.len());
        for (g, group) in plan.groups.iter().enumerate() {
            let bits: Vec<bool> =
                (0..group.cells.len()).map(|s| plan.hit == Some((g, s))).collect();
            let selector = self.encrypt_bits(&bits, self.layer(group.depth) + 1)?;
            groups.push(self.select_request(group, selector)?);
        }
        let outer_bits: Vec<bool> =
            (0..plan.groups.len()).map(|g| plan.hit.is_some_and(|(h, _)| h == g)).collect();
        let outer = self.encrypt_bits(&outer_bits, self.combine_layer)?;
        self.phases.select_vectors += t.elapsed();

        let t = Instant::now();
        let answer = self.data.read_select_combined(&CombinedSelect { groups, outer }).await?;
        self.phases.server_select += t.elapsed();

        let t = Instant::now();
        let bs = self.oram.config().block_size() as usize;
        let old = match plan.hit {
            None => vec![0; bs],
            Some((g, _)) => {
                let s = self.combine_layer;
                let clen = self.public.ciphertext_len(s).map_err(|e| dj("key", e))?;
                let piece = self.public.plaintext_chunk_len(s).map_err(|e| dj("key", e))?;
                if answer.is_empty() || answer.len() % clen != 0 {
                    return Err(dj(
                        "answer",
                        DjError::Shape { what: "answer bytes", left: answer.len(), right: clen },
                    ));
                }
                let cs = answer
                    .chunks(clen)
                    .map(|b| self.public.ciphertext_from_bytes(s, b))
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(|e| dj("combined answer", e))?;
                let mut padded = Vec::with_capacity(cs.len() * piece);
                for m in self.key.decrypt_many(&cs) {
                    padded.extend(
                        self.public
                            .plaintext_to_bytes(&m, piece)
                            .map_err(|e| dj("combined answer", e))?,
                    );
                }
                let depth = plan.groups[g].depth + 1;
                let innermost = self.peel(&padded, depth)?;
                self.open_block(&innermost, block, plan.version)?
            }
        };
        self.phases.decrypt += t.elapsed();

        let fin = self.oram.finish(data.is_some())?;
        let t = Instant::now();
        let innermost = if fin.real {
            let content = data.as_ref().unwrap_or(&old);
            let ad = CellAd { cell: block.0, version: fin.version, segment: 1 };
            self.sealer.seal(&ad, content).map_err(ProxyError::Crypto)?
        } else {
            vec![0; bs + CellSealer::OVERHEAD]
        };
        let cell = self.encrypt_block(&innermost)?;
        self.phases.root_encrypt += t.elapsed();
        let t = Instant::now();
        self.data.write(vec![(fin.root_cell, cell)]).await?;
        self.phases.root_encrypt += t.elapsed();
        self.write_metas(fin.metas).await?;
        if fin.evict {
            self.evict().await?;
        }
        Ok(old)
    }

    async fn evict(&mut self) -> Result<()> {
        let buckets = self.oram.start_eviction()?;
        let metas = self.read_metas(&buckets).await?;
        let plan = self.oram.plan_eviction(metas)?;

        let t = Instant::now();
        let mut writes = Vec::new();
        for step in &plan.steps {
            let width = step.parent.cells.len();
            let layer = self.layer(step.parent.depth) + 1;
            // All selection vectors of this step in one batch (one layer).
            let mut bits = Vec::new();
            for (target, take) in &step.targets {
                debug_assert_eq!(self.layer(target.depth), layer);
                for src in take {
                    bits.extend((0..width).map(|i| *src == Some(i)));
                }
            }
            let mut elements = self.encrypt_bits(&bits, layer)?.into_iter();
            for (target, _) in &step.targets {
                for &cell in &target.cells {
                    let selector: Vec<Ciphertext> = elements.by_ref().take(width).collect();
                    writes.push(SelectWrite {
                        request: self.select_request(&step.parent, selector)?,
                        target: cell,
                    });
                }
            }
        }
        self.phases.eviction_vectors += t.elapsed();

        let t = Instant::now();
        self.data.write_select(&writes).await?;
        self.phases.eviction_select += t.elapsed();

        let t = Instant::now();
        self.strip(&plan).await?;
        self.phases.leaf_strip += t.elapsed();
        self.write_metas(plan.metas).await
    }

    /// Downloads the eviction leaf's halves and stripped area, peels the real blocks and writes
    /// the stripped area back under one layer (real blocks where the plan puts them, dummies
    /// elsewhere). Only real blocks are peeled: how long that takes depends on how many there
    /// are, which only the gateway host's timing shows (SECURITY.md).
    async fn strip(&mut self, plan: &EvictionPlan) -> Result<()> {
        let config = self.oram.config().clone();
        let mut ranges = Vec::new();
        let mut depths = Vec::new();
        for g in &plan.strip.sources {
            let len = Self::slot_len(&config, &self.public, g.depth)? as u32;
            for &cell in &g.cells {
                ranges.push(ByteRange { cell, offset: 0, len });
                depths.push(g.depth);
            }
        }
        let contents = self.data.read_ranges(&ranges).await?;
        let bs = config.block_size() as usize;
        let mut cells = Vec::with_capacity(plan.strip.stripped.len());
        for (cell, src) in plan.strip.stripped.iter().zip(&plan.strip.placement) {
            let innermost = match src {
                Some(s) => self.peel(&contents[*s], depths[*s])?,
                None => vec![0; bs + CellSealer::OVERHEAD],
            };
            cells.push((*cell, self.encrypt_block(&innermost)?));
        }
        self.data.write(cells).await?;
        Ok(())
    }
}
