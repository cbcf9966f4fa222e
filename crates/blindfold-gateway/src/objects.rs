//! The object layer: S3 objects as runs of fixed-size logical ORAM blocks.
//!
//! An object of `n` bytes takes `⌈n / B⌉` blocks of `B` bytes (the block size, 4 KiB by
//! default); the last block is zero-filled past the end. Objects stream in and out in batches of
//! [`SharedEngine::batch_blocks`] blocks, so memory use does not grow with object size.
//!
//! With padding on, every object (and every multipart part) is stored in a power-of-two number
//! of blocks (at least one): a 5-block object takes 8 blocks, the extra 3 holding zeros, and
//! every read of it — ranged or not — reads 8 blocks, so the store can tell only the size class.
//! A multipart object's GET reads its data blocks plus dummy accesses up to the class of its
//! total size, like a single PUT of that size (see [`ObjectLayer::read_range`]).
//!
//! Durability of a PUT: blocks are written through the ORAM, the ORAM commits (redo log fsync,
//! then the store), and only then does one directory transaction make the object visible and
//! free the blocks of the object it replaces. The PUT is acknowledged after that.
//!
//! A request may be abandoned at any await point (its client goes away, or the server drops
//! its future). Engine work therefore runs in tasks of its own that finish whatever happens
//! to the request, and blocks reserved for a write go back to the allocator ([`Reserved`])
//! only once the engine work started on them has ended.

use std::collections::BTreeMap;
use std::sync::Arc;

use blindfold_oram::BlockId;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use md5::{Digest, Md5};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::directory::{now_ns, Deleted, Directory, Extent, ObjectMeta, Part, Upload, Version};
use crate::engine::{BlockEngine, Serialized, SharedEngine};
use crate::{GatewayError, Result};

/// The S3 upper bound on one object, also ours.
pub const MAX_OBJECT_SIZE: u64 = 5 << 40;

/// Objects over oblivious storage.
pub struct ObjectLayer {
    dir: Arc<Directory>,
    engine: Arc<dyn SharedEngine>,
    block_size: usize,
    pad: bool,
}

impl std::fmt::Debug for ObjectLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectLayer")
            .field("block_size", &self.block_size)
            .field("pad", &self.pad)
            .finish_non_exhaustive()
    }
}

/// Holds an object's blocks back from reuse while it is being read (see
/// [`Directory::object_pinned`]); dropping it lets them be reused once freed.
#[derive(Debug)]
pub struct ReadPin {
    layer: Arc<ObjectLayer>,
    blocks: Vec<u64>,
}

impl Drop for ReadPin {
    fn drop(&mut self) {
        self.layer.dir.unpin(&self.blocks);
    }
}

/// Blocks reserved for a write in progress. Claimed by the directory transaction that makes
/// them part of an object or part ([`Reserved::claimed`]); otherwise — the request failed, or
/// its future was dropped — they go back to the allocator when this is dropped, but only once
/// the engine task last started on them (a batch of writes, or the commit) has ended: a write
/// abandoned by its request must not land in a block another request has been given since.
#[derive(Debug)]
pub struct Reserved {
    dir: Arc<Directory>,
    blocks: Vec<u64>,
    running: Option<JoinHandle<Result<()>>>,
}

impl Reserved {
    fn new(dir: &Arc<Directory>) -> Self {
        Self { dir: Arc::clone(dir), blocks: Vec::new(), running: None }
    }

    /// The reserved blocks, in the order they were reserved.
    pub fn blocks(&self) -> &[u64] {
        &self.blocks
    }

    /// Runs `work` on the blocks in a task of its own, which runs to its end even if this
    /// request is abandoned while it waits.
    async fn run(
        &mut self,
        work: impl std::future::Future<Output = Result<()>> + Send + 'static,
    ) -> Result<()> {
        let task = self.running.insert(tokio::spawn(work));
        let r = task.await;
        self.running = None;
        r.map_err(engine_task_failed)?
    }

    /// The blocks were claimed by a directory transaction: nothing to give back.
    pub fn claimed(mut self) {
        self.blocks.clear();
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        let blocks = std::mem::take(&mut self.blocks);
        if blocks.is_empty() {
            return;
        }
        match (self.running.take(), tokio::runtime::Handle::try_current()) {
            (None, _) => self.dir.unreserve(&blocks),
            (Some(task), Ok(rt)) => {
                let dir = Arc::clone(&self.dir);
                rt.spawn(async move {
                    let _ = task.await;
                    dir.unreserve(&blocks);
                });
            }
            // No runtime: the process is stopping, and reservations do not outlive it.
            (Some(_), Err(_)) => {}
        }
    }
}

/// An engine task that panicked or was cancelled (the runtime stopping).
fn engine_task_failed(e: tokio::task::JoinError) -> GatewayError {
    GatewayError::Corrupt(format!("an engine task ended abnormally: {e}"))
}

/// One step of a read plan: the block to read (`None`: a dummy access, drawn at read time) and
/// the slice `lo..hi` of it that belongs to the requested range (empty for padding reads).
#[derive(Clone, Copy, Debug)]
struct Step {
    block: Option<u64>,
    lo: usize,
    hi: usize,
}

/// A fresh version id: 32 random hex digits (never `null`).
pub(crate) fn new_version_id() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// Blocks an object of `len` bytes occupies, before padding.
fn blocks_for(len: u64, block: usize) -> u64 {
    len.div_ceil(block as u64)
}

/// Blocks after padding to the size class.
pub fn padded(blocks: u64) -> u64 {
    blocks.max(1).next_power_of_two()
}

/// The object an upload completes into with the listed (part number, ETag) pairs, after
/// checking them: ascending numbers, uploaded parts, matching ETags.
fn assemble(
    up: &Upload,
    bucket: &str,
    key: &str,
    parts: &[(i32, Option<String>)],
) -> Result<ObjectMeta> {
    if up.bucket != bucket || up.key != key {
        return Err(GatewayError::NoSuchUpload);
    }
    let mut last = 0;
    let mut md5s = Vec::new();
    let mut extents = Vec::new();
    let mut size = 0u64;
    for (n, etag) in parts {
        if *n <= last {
            return Err(GatewayError::InvalidPartOrder);
        }
        last = *n;
        let p = up.parts.get(n).ok_or(GatewayError::InvalidPart)?;
        if let Some(e) = etag {
            if e.trim_matches('"') != p.etag {
                return Err(GatewayError::InvalidPart);
            }
        }
        md5s.extend_from_slice(&p.md5);
        size += p.extent.len;
        extents.push(p.extent.clone());
    }
    Ok(ObjectMeta {
        size,
        etag: format!("{}-{}", hex::encode(Md5::digest(&md5s)), parts.len()),
        content_type: up.content_type.clone(),
        metadata: up.metadata.clone(),
        modified_ns: now_ns(),
        extents,
    })
}

impl ObjectLayer {
    /// Assembles the layer over a one-access-at-a-time `engine` (normally a
    /// [`blindfold_proxy::DurablePathOram`]).
    pub fn new(dir: Directory, engine: impl BlockEngine + Sync + 'static, pad: bool) -> Self {
        Self::with_engine(dir, Arc::new(Serialized::new(engine)), pad)
    }

    /// Assembles the layer over an engine chosen at run time.
    pub fn with_engine(dir: Directory, engine: Arc<dyn SharedEngine>, pad: bool) -> Self {
        let block_size = engine.block_size();
        Self { dir: Arc::new(dir), engine, block_size, pad }
    }

    /// The directory.
    pub fn directory(&self) -> &Directory {
        &self.dir
    }

    /// Bytes per logical block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Whether object sizes are padded to size classes.
    pub fn pads(&self) -> bool {
        self.pad
    }

    /// The block engine.
    pub fn engine(&self) -> &Arc<dyn SharedEngine> {
        &self.engine
    }

    /// Whether the engine's trusted state survives a restart (false only for the benchmark
    /// baseline, [`crate::engine::DirectEngine`]).
    pub fn engine_is_durable(&self) -> bool {
        self.engine.durable()
    }

    /// Verifies every stored cell; see [`blindfold_proxy::DurablePathOram::verify`].
    pub async fn verify_cells(
        &self,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<blindfold_proxy::VerifyReport> {
        Ok(self.engine.verify(&mut progress).await?)
    }

    /// The blocks that cannot be read while the cells `bad` are damaged, if the engine can tell.
    pub async fn blocks_through(&self, bad: &[u64]) -> Option<Vec<u64>> {
        self.engine.blocks_through(bad).await
    }

    /// Commits pending ORAM work and writes a checkpoint (clean shutdown).
    pub async fn shutdown(&self) -> Result<()> {
        Ok(self.engine.shutdown().await?)
    }

    /// Writes blocks reserved in `reserved` (see [`Reserved::run`]).
    async fn write_blocks(
        &self,
        blocks: Vec<(BlockId, Vec<u8>)>,
        reserved: &mut Reserved,
    ) -> Result<()> {
        let engine = Arc::clone(&self.engine);
        reserved.run(async move { Ok(engine.write_many(blocks).await?) }).await
    }

    /// Reads blocks in a task of its own, so an abandoned read never stops an engine
    /// mid-access. The task holds `pin`: the blocks stay out of reuse until it ends, even
    /// when the GET that started it has gone.
    async fn read_blocks(&self, blocks: Vec<BlockId>, pin: Arc<ReadPin>) -> Result<Vec<Vec<u8>>> {
        let engine = Arc::clone(&self.engine);
        let task = tokio::spawn(async move {
            let _pin = pin;
            Ok(engine.read_many(&blocks).await?)
        });
        task.await.map_err(engine_task_failed)?
    }

    /// Commits the engine, in a task of its own (see [`Reserved::run`]): a commit abandoned
    /// half-way would leave the engine's trusted state and the store out of step. Returns what
    /// is left of it ([`SharedEngine::commit_queued`]): the commit record's way to the
    /// store-side log, which [`ObjectLayer::settle_with`] waits for beside the directory
    /// transaction that follows it.
    async fn commit_engine(&self, reserved: &mut Reserved) -> Result<blindfold_proxy::Mirrored> {
        let engine = Arc::clone(&self.engine);
        let queued = Arc::new(parking_lot::Mutex::new(None));
        let out = Arc::clone(&queued);
        reserved
            .run(async move {
                *out.lock() = Some(engine.commit_queued().await?);
                Ok(())
            })
            .await?;
        let queued = queued.lock().take();
        Ok(queued.unwrap_or_default())
    }

    /// Returns once the engine's commit (`engine`, from [`ObjectLayer::commit_engine`]) and
    /// the directory's transactions since are durable. Under `--durability store` both are
    /// entries of the one store-side log, queued in that order: they go to the store in one
    /// group commit, and the PUT waits for the store once, not twice.
    async fn settle_with(&self, engine: blindfold_proxy::Mirrored) -> Result<()> {
        let (e, d) = tokio::join!(engine.wait(), self.dir.settle());
        e?;
        d
    }

    /// Writes a byte stream into freshly reserved blocks. Returns the extent, its MD5 and the
    /// reservation of its blocks (to claim in a directory transaction; dropped, it gives them
    /// back). Blocks are written but not yet committed.
    pub async fn write_stream<S, E>(&self, mut body: S) -> Result<(Extent, [u8; 16], Reserved)>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let bs = self.block_size;
        let batch_blocks = self.engine.batch_blocks();
        let mut md5 = Md5::new();
        let mut buf: Vec<u8> = Vec::with_capacity(bs);
        let mut extent = Extent::default();
        let mut batch: Vec<(BlockId, Vec<u8>)> = Vec::with_capacity(batch_blocks);
        let mut reserved = Reserved::new(&self.dir);
        // Reserves a block for `data` and queues it; writes the queue when it is full.
        let queue = |data: Vec<u8>,
                     extent: &mut Extent,
                     reserved: &mut Reserved,
                     batch: &mut Vec<(BlockId, Vec<u8>)>|
         -> Result<bool> {
            let b = self.dir.allocate(1)?.blocks[0];
            reserved.blocks.push(b);
            extent.blocks.push(b);
            batch.push((BlockId(b), data));
            Ok(batch.len() == batch_blocks)
        };
        let result: Result<()> = async {
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|e| GatewayError::Body(e.to_string()))?;
                md5.update(&chunk);
                extent.len += chunk.len() as u64;
                if extent.len > MAX_OBJECT_SIZE {
                    return Err(GatewayError::TooLarge);
                }
                let mut rest: &[u8] = &chunk;
                while !rest.is_empty() {
                    let take = (bs - buf.len()).min(rest.len());
                    buf.extend_from_slice(&rest[..take]);
                    rest = &rest[take..];
                    if buf.len() == bs {
                        let full = std::mem::replace(&mut buf, Vec::with_capacity(bs));
                        if queue(full, &mut extent, &mut reserved, &mut batch)? {
                            self.write_blocks(std::mem::take(&mut batch), &mut reserved).await?;
                        }
                    }
                }
            }
            if !buf.is_empty() {
                buf.resize(bs, 0);
                if queue(std::mem::take(&mut buf), &mut extent, &mut reserved, &mut batch)? {
                    self.write_blocks(std::mem::take(&mut batch), &mut reserved).await?;
                }
            }
            if self.pad {
                let want = padded(extent.blocks.len() as u64);
                while (extent.blocks.len() as u64) < want {
                    if queue(vec![0u8; bs], &mut extent, &mut reserved, &mut batch)? {
                        self.write_blocks(std::mem::take(&mut batch), &mut reserved).await?;
                    }
                }
            }
            self.write_blocks(std::mem::take(&mut batch), &mut reserved).await
        }
        .await;
        result?; // on failure `reserved`, dropped, gives the blocks back
        Ok((extent, md5.finalize().into(), reserved))
    }

    /// Stores an object (replacing any object at the same key) and returns its metadata.
    pub async fn put_object<S, E>(
        &self,
        bucket: &str,
        key: &str,
        body: S,
        content_type: Option<String>,
        metadata: BTreeMap<String, String>,
        if_none_match: bool,
    ) -> Result<ObjectMeta>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        self.put_object_expecting(bucket, key, body, content_type, metadata, if_none_match, None)
            .await
    }

    /// [`ObjectLayer::put_object`], refusing with [`GatewayError::BadDigest`] — nothing stored,
    /// nothing replaced — a body whose MD5 is not `expected_md5`.
    #[allow(clippy::too_many_arguments)]
    pub async fn put_object_expecting<S, E>(
        &self,
        bucket: &str,
        key: &str,
        body: S,
        content_type: Option<String>,
        metadata: BTreeMap<String, String>,
        if_none_match: bool,
        expected_md5: Option<[u8; 16]>,
    ) -> Result<ObjectMeta>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        self.dir.require_bucket(bucket)?;
        if if_none_match && self.dir.object(bucket, key)?.is_some() {
            return Err(GatewayError::PreconditionFailed);
        }
        let (extent, md5, reserved) = self.write_stream(body).await?;
        if expected_md5.is_some_and(|want| want != md5) {
            return Err(GatewayError::BadDigest);
        }
        let meta = ObjectMeta {
            size: extent.len,
            etag: hex::encode(md5),
            content_type,
            metadata,
            modified_ns: now_ns(),
            extents: vec![extent],
        };
        self.publish(bucket, key, meta, if_none_match, reserved).await
    }

    /// Commits the engine, then makes `meta` (whose blocks are `reserved`) visible at
    /// (bucket, key).
    async fn publish(
        &self,
        bucket: &str,
        key: &str,
        meta: ObjectMeta,
        if_none_match: bool,
        mut reserved: Reserved,
    ) -> Result<ObjectMeta> {
        let engine = self.commit_engine(&mut reserved).await?;
        let meta = self.dir.transact(reserved.blocks(), |tx| {
            tx.require_bucket(bucket)?;
            if if_none_match && tx.object(bucket, key)?.is_some() {
                return Err(GatewayError::PreconditionFailed);
            }
            put_new_version(tx, bucket, key, meta.clone())
        })?;
        reserved.claimed();
        self.settle_with(engine).await?;
        Ok(meta)
    }

    /// Deletes an object; deleting a missing object succeeds (as in S3). In a versioned
    /// bucket this adds a delete marker ([`crate::directory::Tx::delete_current`]). True if
    /// there was a current object.
    pub async fn delete_object(&self, bucket: &str, key: &str) -> Result<bool> {
        Ok(self.delete_current(bucket, key).await?.existed)
    }

    /// [`ObjectLayer::delete_object`], telling the delete marker it added.
    pub async fn delete_current(&self, bucket: &str, key: &str) -> Result<Deleted> {
        let marker = new_version_id();
        self.dir
            .transact_durable(&[], |tx| {
                tx.require_bucket(bucket)?;
                tx.delete_current(bucket, key, &marker, now_ns())
            })
            .await
    }

    /// Deletes one version of an object for good (its blocks are freed in trusted state, as
    /// a delete frees them); `None` if there was no such version. A version that object lock
    /// protects stays ([`GatewayError::Locked`]): its legal hold, or its retention unless
    /// `bypass_governance` and the mode is GOVERNANCE ([`crate::lock::check_delete`]),
    /// checked in the same transaction as the delete.
    pub async fn delete_version(
        &self,
        bucket: &str,
        key: &str,
        version_id: &str,
        bypass_governance: bool,
    ) -> Result<Option<Version>> {
        self.dir
            .transact_durable(&[], |tx| {
                tx.require_bucket(bucket)?;
                match tx.version(bucket, key, Some(version_id)) {
                    Ok(Version { object: Some(meta), .. }) => {
                        crate::lock::check_delete(&meta, bypass_governance, now_ns())?
                    }
                    Ok(_) | Err(GatewayError::NoSuchKey) | Err(GatewayError::NoSuchVersion) => {}
                    Err(e) => return Err(e),
                }
                tx.delete_version(bucket, key, version_id)
            })
            .await
    }

    /// Looks a version up for reading (the current one: `None`), its blocks pinned as
    /// [`ObjectLayer::lookup_for_read`] pins them. Reading it then is the same as reading a
    /// current object: [`ObjectLayer::read_range`] of its metadata, the same plan of ORAM
    /// accesses; nothing about versions reaches the store.
    pub fn lookup_version_for_read(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
    ) -> Result<(Version, Option<ReadPin>)> {
        let v = self.dir.version_pinned(bucket, key, version_id)?;
        let pin = v
            .object
            .as_ref()
            .map(|meta| ReadPin { layer: Arc::clone(self), blocks: meta.blocks().collect() });
        Ok((v, pin))
    }

    /// The read plan of the byte range `range` of `meta`: the blocks to read, in order, and
    /// for each the slice of it that belongs to the range.
    ///
    /// With padding on, the plan reads exactly [`padded`]`(⌈size / B⌉)` blocks whatever the
    /// range and however the object was uploaded: every data block, then dummy accesses up
    /// to the size class — the object's own padding blocks first, then (for a multipart
    /// object, whose parts were padded one by one) random blocks drawn at read time. Read in
    /// groups of [`SharedEngine::batch_blocks`], this gives a multipart object the same trace
    /// shape as a single PUT of its size.
    fn plan_read(&self, meta: &ObjectMeta, range: std::ops::Range<u64>) -> Vec<Step> {
        let bs = self.block_size as u64;
        let mut out = Vec::new();
        let mut spare = Vec::new(); // blocks the object owns beyond its data
        let mut base = 0u64; // object offset of the current extent
        for e in &meta.extents {
            let data = blocks_for(e.len, self.block_size) as usize;
            for (i, &b) in e.blocks.iter().enumerate() {
                if i >= data {
                    spare.push(b);
                    continue;
                }
                let start = base + i as u64 * bs;
                let data_end = (start + bs).min(base + e.len);
                let lo = range.start.max(start);
                let hi = range.end.min(data_end);
                if lo < hi {
                    out.push(Step {
                        block: Some(b),
                        lo: (lo - start) as usize,
                        hi: (hi - start) as usize,
                    });
                } else if self.pad {
                    out.push(Step { block: Some(b), lo: 0, hi: 0 });
                }
            }
            base += e.len;
        }
        if self.pad {
            let want = padded(blocks_for(meta.size, self.block_size)) as usize;
            let mut spare = spare.into_iter();
            while out.len() < want {
                out.push(Step { block: spare.next(), lo: 0, hi: 0 });
            }
        }
        out
    }

    /// The blocks to read for one group of a plan: dummy steps become random blocks, distinct
    /// from the others of the group (engines refuse a batch that names a block twice). Which
    /// block a dummy reads does not show in the trace: every ORAM access reads a random path.
    fn resolve(&self, group: &[Step]) -> Vec<BlockId> {
        let capacity = self.dir.capacity();
        let mut taken: std::collections::HashSet<u64> =
            group.iter().filter_map(|s| s.block).collect();
        let mut rng = rand::thread_rng();
        let mut ids = Vec::with_capacity(group.len());
        for step in group {
            match step.block {
                Some(b) => ids.push(BlockId(b)),
                // An ORAM smaller than one batch has no distinct block left to draw. Dummies
                // end the plan, so a skipped one only shortens the group's tail.
                None if taken.len() as u64 >= capacity => {}
                None => loop {
                    let b = rand::Rng::gen_range(&mut rng, 0..capacity);
                    if taken.insert(b) {
                        ids.push(BlockId(b));
                        break;
                    }
                },
            }
        }
        ids
    }

    /// Looks an object up for reading: its blocks stay pinned (not reused, even if a PUT or
    /// DELETE frees them) until the returned [`ReadPin`] is dropped. Use it, not
    /// [`Directory::object`], before [`ObjectLayer::read_range`].
    pub fn lookup_for_read(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
    ) -> Result<Option<(ObjectMeta, ReadPin)>> {
        Ok(self.dir.object_pinned(bucket, key)?.map(|meta| {
            let blocks = meta.blocks().collect();
            (meta, ReadPin { layer: Arc::clone(self), blocks })
        }))
    }

    /// Streams `range` of an object. The first `prefetch` bytes are read before this returns,
    /// so a small object's integrity failure becomes an error response rather than a cut-off
    /// body. The object's blocks stay pinned until the stream ends; `meta` should come from
    /// [`ObjectLayer::lookup_for_read`] (whose pin may be dropped once this returns), so that
    /// no concurrent replacement can free and reuse them before the pin is taken.
    ///
    /// The reads run in a task of their own. With padding on it always finishes the whole
    /// padded plan, even when the reader goes away early (a client that disconnects, or this
    /// future dropped while it prefetches): otherwise where a GET stopped would show how far
    /// it got.
    pub async fn read_range(
        self: &Arc<Self>,
        meta: &ObjectMeta,
        range: std::ops::Range<u64>,
        prefetch: usize,
    ) -> Result<mpsc::Receiver<std::result::Result<Bytes, GatewayError>>> {
        let blocks: Vec<u64> = meta.blocks().collect();
        self.dir.pin(&blocks);
        let pin = ReadPin { layer: Arc::clone(self), blocks };
        let plan = self.plan_read(meta, range);
        let (tx, rx) = mpsc::channel(8);
        let (ready_tx, ready_rx) = oneshot::channel();
        tokio::spawn(Arc::clone(self).stream_plan(plan, prefetch, pin, tx, ready_tx));
        match ready_rx.await {
            Ok(Ok(())) => Ok(rx),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(GatewayError::Corrupt("the object reader stopped".into())),
        }
    }

    /// Groups of blocks a GET reads at once ([`ObjectLayer::stream_plan`]).
    const READ_AHEAD: usize = 4;

    /// Runs a read plan: reads it group by group, up to [`Self::READ_AHEAD`] groups at once,
    /// and sends the bytes to `tx` in order. `ready` is told once `prefetch` bytes are read
    /// (or the first error). Stops early when the reader is gone only if padding is off.
    async fn stream_plan(
        self: Arc<Self>,
        plan: Vec<Step>,
        prefetch: usize,
        pin: ReadPin,
        tx: mpsc::Sender<std::result::Result<Bytes, GatewayError>>,
        ready: oneshot::Sender<Result<()>>,
    ) {
        const CHUNK: usize = 64 * 1024;
        let mut ready = Some(ready);
        let mut listening = true;
        let mut pending: Vec<u8> = Vec::new();
        let mut fetched = 0usize;
        // Up to READ_AHEAD groups are read at once, so a large GET keeps the engine busy
        // while one group waits (for the reveal log's fsync, a round trip, a commit); the
        // bytes still go out in order.
        let pin = Arc::new(pin);
        let groups: Vec<Vec<Step>> =
            plan.chunks(self.engine.batch_blocks()).map(<[Step]>::to_vec).collect();
        let mut groups = futures::stream::iter(groups)
            .map(|group| {
                let ids = self.resolve(&group);
                let (layer, pin) = (Arc::clone(&self), Arc::clone(&pin));
                async move {
                    let read = layer.read_blocks(ids, pin).await;
                    (group, read)
                }
            })
            .buffered(Self::READ_AHEAD);
        while let Some((group, read)) = groups.next().await {
            if fetched >= prefetch {
                if let Some(r) = ready.take() {
                    let _ = r.send(Ok(()));
                }
            }
            let blocks = match read {
                Ok(blocks) => blocks,
                Err(e) => {
                    match ready.take() {
                        Some(r) => {
                            let _ = r.send(Err(e));
                        }
                        None => {
                            tracing::error!(error = %e, "read failed while streaming an object");
                            let _ = tx.send(Err(e)).await;
                        }
                    }
                    return;
                }
            };
            fetched += self.block_size * group.len();
            if !listening {
                continue;
            }
            for (step, block) in group.iter().zip(blocks) {
                if step.hi > step.lo {
                    pending.extend_from_slice(&block[step.lo..step.hi]);
                }
            }
            if ready.is_none() && pending.len() >= CHUNK {
                let chunk = Bytes::from(std::mem::take(&mut pending));
                if tx.send(Ok(chunk)).await.is_err() {
                    if !self.pad {
                        return;
                    }
                    listening = false;
                }
            }
        }
        if let Some(r) = ready.take() {
            let _ = r.send(Ok(()));
        }
        if listening && !pending.is_empty() {
            let _ = tx.send(Ok(Bytes::from(pending))).await;
        }
    }

    /// Copies an object's data into new blocks (ORAM reads then writes) under another key.
    pub async fn copy_object(
        self: &Arc<Self>,
        src: &ObjectMeta,
        bucket: &str,
        key: &str,
        metadata: Option<(Option<String>, BTreeMap<String, String>)>,
    ) -> Result<ObjectMeta> {
        self.dir.require_bucket(bucket)?;
        let rx = self.read_range(src, 0..src.size, 0).await?;
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
        let (extent, _, reserved) = self.write_stream(Box::pin(stream)).await?;
        let (content_type, meta_map) =
            metadata.unwrap_or((src.content_type.clone(), src.metadata.clone()));
        let meta = ObjectMeta {
            size: extent.len,
            etag: src.etag.clone(),
            content_type,
            metadata: meta_map,
            modified_ns: now_ns(),
            extents: vec![extent],
        };
        self.publish(bucket, key, meta, false, reserved).await
    }

    /// Starts a multipart upload; returns its id.
    pub async fn create_upload(
        &self,
        bucket: &str,
        key: &str,
        content_type: Option<String>,
        metadata: BTreeMap<String, String>,
    ) -> Result<String> {
        let id = hex::encode(rand::random::<[u8; 16]>());
        let up = Upload {
            bucket: bucket.to_string(),
            key: key.to_string(),
            created_ns: now_ns(),
            content_type,
            metadata,
            parts: BTreeMap::new(),
        };
        self.dir
            .transact_durable(&[], |tx| {
                tx.require_bucket(bucket)?;
                tx.put_upload(&id, &up)
            })
            .await?;
        Ok(id)
    }

    /// Stores one part (replacing an earlier upload of the same part number).
    pub async fn upload_part<S, E>(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part_number: i32,
        body: S,
    ) -> Result<Part>
    where
        S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let up = self.dir.upload(upload_id)?.ok_or(GatewayError::NoSuchUpload)?;
        if up.bucket != bucket || up.key != key {
            return Err(GatewayError::NoSuchUpload);
        }
        let (extent, md5, mut reserved) = self.write_stream(body).await?;
        let part =
            Part { etag: hex::encode(md5), md5: md5.to_vec(), extent, modified_ns: now_ns() };
        let engine = self.commit_engine(&mut reserved).await?;
        self.dir.transact(reserved.blocks(), |tx| {
            let mut up = tx.upload(upload_id)?.ok_or(GatewayError::NoSuchUpload)?;
            if let Some(old) = up.parts.insert(part_number, part.clone()) {
                tx.release(old.extent.blocks);
            }
            tx.put_upload(upload_id, &up)
        })?;
        reserved.claimed();
        self.settle_with(engine).await?;
        Ok(part)
    }

    /// Completes an upload from the listed (part number, ETag) pairs.
    ///
    /// With padding on, an object whose parts end in partly filled blocks can hold more data
    /// blocks than its size class (each part but the last may add one); its GET would then
    /// read more than the class. Such an object is first copied into one fresh extent of the
    /// class (reads of its parts, writes of the copy), then published; see `SECURITY.md`.
    pub async fn complete_upload(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(i32, Option<String>)],
    ) -> Result<ObjectMeta> {
        if self.pad {
            let up = self.dir.upload(upload_id)?.ok_or(GatewayError::NoSuchUpload)?;
            let draft = assemble(&up, bucket, key, parts)?;
            let data: u64 = draft.extents.iter().map(|e| blocks_for(e.len, self.block_size)).sum();
            if data > padded(blocks_for(draft.size, self.block_size)) {
                return self.complete_repacked(bucket, key, upload_id, parts, draft).await;
            }
        }
        let meta = self.dir.transact(&[], |tx| {
            tx.require_bucket(bucket)?;
            let up = tx.upload(upload_id)?.ok_or(GatewayError::NoSuchUpload)?;
            let meta = assemble(&up, bucket, key, parts)?;
            for (n, p) in &up.parts {
                if !parts.iter().any(|(m, _)| m == n) {
                    tx.release(p.extent.blocks.iter().copied());
                }
            }
            tx.delete_upload(upload_id)?;
            put_new_version(tx, bucket, key, meta.clone())
        })?;
        self.dir.settle().await?;
        Ok(meta)
    }

    /// Completes an upload by copying `draft` (its parts, as listed) into one extent.
    async fn complete_repacked(
        self: &Arc<Self>,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(i32, Option<String>)],
        draft: ObjectMeta,
    ) -> Result<ObjectMeta> {
        // If the upload changes meanwhile (a part replaced, an abort), its blocks may be freed
        // and reused under the copy; the transaction below then finds the upload changed and
        // the copy is dropped.
        let rx = self.read_range(&draft, 0..draft.size, 0).await?;
        let stream =
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
        let (extent, _, mut reserved) = self.write_stream(Box::pin(stream)).await?;
        let engine = self.commit_engine(&mut reserved).await?;
        let r = self.dir.transact(reserved.blocks(), |tx| {
            tx.require_bucket(bucket)?;
            let up = tx.upload(upload_id)?.ok_or(GatewayError::NoSuchUpload)?;
            let now = assemble(&up, bucket, key, parts)?;
            if now.extents != draft.extents {
                return Err(GatewayError::InvalidPart);
            }
            // The copy replaces every part, listed or not.
            for p in up.parts.values() {
                tx.release(p.extent.blocks.iter().copied());
            }
            let meta = ObjectMeta { extents: vec![extent.clone()], ..now };
            tx.delete_upload(upload_id)?;
            put_new_version(tx, bucket, key, meta.clone())
        });
        if r.is_ok() {
            reserved.claimed();
            self.settle_with(engine).await?;
        }
        r
    }

    /// Aborts an upload and frees its parts.
    pub async fn abort_upload(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        self.dir
            .transact_durable(&[], |tx| {
                let up = tx.upload(upload_id)?.ok_or(GatewayError::NoSuchUpload)?;
                if up.bucket != bucket || up.key != key {
                    return Err(GatewayError::NoSuchUpload);
                }
                for p in up.parts.values() {
                    tx.release(p.extent.blocks.iter().copied());
                }
                tx.delete_upload(upload_id)
            })
            .await
    }

    /// Bytes the object occupies in blocks (padding included): what the store can infer.
    pub fn stored_blocks(&self, size: u64) -> u64 {
        let b = blocks_for(size, self.block_size);
        if self.pad {
            padded(b)
        } else {
            b
        }
    }
}

/// Makes `meta` the newest version of (bucket, key) under a new version id, with the bucket's
/// default retention if object lock gives one and the request named none
/// ([`crate::lock::fill_default`]): every write path goes through here, whatever front end.
fn put_new_version(
    tx: &mut crate::directory::Tx<'_>,
    bucket: &str,
    key: &str,
    mut meta: ObjectMeta,
) -> Result<ObjectMeta> {
    crate::lock::fill_default(tx, bucket, &mut meta, now_ns())?;
    tx.put_version(bucket, key, &meta, &new_version_id())
}
