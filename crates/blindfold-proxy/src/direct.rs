use std::collections::HashMap;
use std::sync::Arc;

use blindfold_crypto::CellSealer;
use blindfold_oram::BlockId;
use blindfold_store::{CellId, Geometry, Store};
use parking_lot::Mutex;

use crate::durable::verify_cells;
use crate::retry::{with_retry, write_sealed, RetryPolicy};
use crate::sealing::{open_cell, seal_cell};
use crate::{ProxyError, Result, VerifyReport, VersionTable};

/// The baseline without ORAM: block `i` is sealed (with the same AEAD, versions and integrity)
/// and kept in cell `i`. The store sees exactly which block is read or written; this exists so
/// benchmarks can report what obliviousness costs over plain encrypted storage.
///
/// Usable from many tasks at once (`&self`), so a concurrent baseline is not held back by a
/// queue. A block being written is answered from memory until its store write returned; a
/// read that raced a write to the store is retried. Two concurrent writes of the *same* block
/// are not supported (the gateway's object layer never issues them).
pub struct SealedDirect {
    store: Arc<dyn Store>,
    sealer: CellSealer,
    state: Mutex<DirectState>,
    block_size: u32,
}

struct DirectState {
    versions: VersionTable,
    /// Blocks whose store write has not returned yet: (version, contents).
    in_flight: HashMap<u64, (u64, Vec<u8>)>,
}

impl std::fmt::Debug for SealedDirect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SealedDirect").field("store", &self.store).finish_non_exhaustive()
    }
}

impl SealedDirect {
    /// The store shape for `blocks` blocks of `block_size` bytes.
    pub fn geometry(blocks: u64, block_size: u32) -> Result<Geometry> {
        Ok(Geometry::new(blocks, block_size + CellSealer::OVERHEAD as u32)?)
    }

    /// A new, empty baseline store.
    pub fn new(store: Arc<dyn Store>, sealer: CellSealer, block_size: u32) -> Result<Self> {
        let g = store.geometry();
        if g.cell_size() as usize != block_size as usize + CellSealer::OVERHEAD {
            return Err(ProxyError::Geometry {
                found: format!("cells of {} bytes", g.cell_size()),
                needed: format!("cells of {} bytes", block_size as usize + CellSealer::OVERHEAD),
            });
        }
        // Epochs unknown (ANY_EPOCH): see `read_many`.
        let versions = VersionTable::from_legacy(vec![0; g.cell_count() as usize]);
        let state = Mutex::new(DirectState { versions, in_flight: HashMap::new() });
        Ok(Self { store, sealer, state, block_size })
    }

    /// Reads a block (zeros if never written).
    pub async fn read(&self, block: BlockId) -> Result<Vec<u8>> {
        Ok(self.read_many(&[block]).await?.pop().expect("one block asked, one returned"))
    }

    /// Reads several blocks in one storage request (zeros for blocks never written).
    pub async fn read_many(&self, blocks: &[BlockId]) -> Result<Vec<Vec<u8>>> {
        let g = self.store.geometry();
        for b in blocks {
            g.check_cell(CellId(b.0))?;
        }
        let mut out: Vec<Option<Vec<u8>>> = vec![None; blocks.len()];
        let mut todo: Vec<usize> = (0..blocks.len()).collect();
        for attempt in 0..4 {
            // Blocks being written come from memory; the rest from the store, opened under the
            // versions seen now — unless a write replaced them meanwhile, then again.
            let mut fetch: Vec<(usize, u64)> = Vec::new();
            {
                let st = self.state.lock();
                for &i in &todo {
                    match st.in_flight.get(&blocks[i].0) {
                        Some((_, data)) => out[i] = Some(data.clone()),
                        None => fetch.push((i, st.versions.get(blocks[i].0))),
                    }
                }
            }
            if fetch.is_empty() {
                break;
            }
            let cells: Vec<CellId> = fetch.iter().map(|&(i, _)| CellId(blocks[i].0)).collect();
            let store = Arc::clone(&self.store);
            let fetched = with_retry(RetryPolicy::default(), || store.read(&cells)).await?;
            let raced: Vec<bool> = {
                let st = self.state.lock();
                fetch
                    .iter()
                    .map(|&(i, v)| {
                        st.versions.get(blocks[i].0) != v || st.in_flight.contains_key(&blocks[i].0)
                    })
                    .collect()
            };
            todo.clear();
            for (((i, version), buf), raced) in fetch.into_iter().zip(fetched).zip(raced) {
                if raced && attempt < 3 {
                    todo.push(i);
                    continue;
                }
                out[i] = Some(if version == 0 {
                    vec![0u8; self.block_size as usize]
                } else {
                    // The baseline never restarts on a store (its versions live in memory only),
                    // so there is no other timeline whose epochs need telling apart.
                    let any = VersionTable::ANY_EPOCH;
                    open_cell(&self.sealer, CellId(blocks[i].0), version, any, buf)?
                });
            }
            if todo.is_empty() {
                break;
            }
        }
        Ok(out.into_iter().map(|o| o.expect("every block was read")).collect())
    }

    /// Writes a block.
    pub async fn write(&self, block: BlockId, data: Vec<u8>) -> Result<()> {
        self.write_many(vec![(block, data)]).await
    }

    /// Writes several blocks: seals each under its next version and sends them to the store
    /// in one batch.
    pub async fn write_many(&self, blocks: Vec<(BlockId, Vec<u8>)>) -> Result<()> {
        let g = self.store.geometry();
        for (block, data) in &blocks {
            g.check_cell(CellId(block.0))?;
            if data.len() != self.block_size as usize {
                return Err(blindfold_oram::OramError::WrongBlockSize {
                    got: data.len(),
                    expected: self.block_size,
                }
                .into());
            }
        }
        let mut sealed = Vec::with_capacity(blocks.len());
        let mut mine = Vec::with_capacity(blocks.len());
        for (block, data) in blocks {
            let version = {
                let mut st = self.state.lock();
                let v = st.versions.next(block.0);
                st.versions.set(block.0, v);
                st.in_flight.insert(block.0, (v, data.clone()));
                v
            };
            sealed
                .push((CellId(block.0), seal_cell(&self.sealer, CellId(block.0), version, &data)?));
            mine.push((block.0, version));
        }
        let written = write_sealed(&*self.store, RetryPolicy::default(), sealed).await;
        let mut st = self.state.lock();
        for (b, v) in mine {
            if st.in_flight.get(&b).is_some_and(|(w, _)| *w == v) {
                st.in_flight.remove(&b);
            }
        }
        written
    }

    /// Flushes the store (its durability barrier).
    pub async fn flush(&self) -> Result<()> {
        let store = Arc::clone(&self.store);
        Ok(with_retry(RetryPolicy::default(), || store.flush()).await?)
    }

    /// Reads every written cell and authenticates it against the trusted versions;
    /// `progress(done, total)` is called as it goes.
    pub async fn verify(&self, progress: impl FnMut(u64, u64)) -> Result<VerifyReport> {
        let versions = self.state.lock().versions.clone();
        verify_cells(&*self.store, RetryPolicy::default(), &self.sealer, &versions, progress).await
    }

    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Bytes of trusted memory (the version table).
    pub fn trusted_bytes(&self) -> u64 {
        self.state.lock().versions.trusted_bytes()
    }
}
