//! Several buckets per store object: the tree cut into subtrees of `d` levels, each stored as
//! one cell of the store below.
//!
//! A path of the tree crosses one bucket per level. With one store object per bucket an access
//! costs one GET per level it reads and one PUT per level it writes, and a cloud store bills
//! per request. Packed, the path crosses one subtree per `d` levels, so requests fall `d`-fold,
//! at the price of moving the whole subtree (`2^d - 1` buckets) for the `d` the path needs.
//!
//! # Layout
//!
//! The levels are cut into bands of `d` levels counted from the leaves up (the top band may
//! be shorter). Every bucket of a band's top level roots one *group*: itself and its
//! descendants within the band, in heap order inside the group. Groups are numbered band by
//! band from the root down, left to right. Every group has room for `2^d - 1` buckets (a
//! shorter top band leaves some of it unused), so the store below has cells of that many
//! bucket cells.
//!
//! # Writes
//!
//! A write names buckets; each group it touches is written whole. Members it does not name
//! keep their contents, taken from the newest copy of the group: the one this store last
//! read or wrote, if it still holds it (a bounded cache of whole groups, see below), else read
//! first (one GET, [`SlottedStore::read_newest`]). Writes are serialised so two of them never
//! assemble the same group from the same old copy.
//!
//! The cache holds sealed groups only (nothing the store does not hold too), up to
//! [`READ_BACK_CACHE_BYTES`], oldest out first. A path's groups are usually still there when
//! its write-back comes, so the write needs no read first. A write always puts its own copy.
//! A read returns the committed copy, so its copy enters only where that is the newest: not
//! for a group written since the last publish, and not if a publish happened while the read
//! was under way (it may have read the copy the publish replaced). A write under way when a
//! read's copy enters puts its own over it before the next write starts.
//!
//! Which groups are read, read back and written follows from which buckets the layer above
//! reads and writes, which the store saw one by one before; so packing tells the store
//! nothing new. Each bucket inside a group stays sealed on its own, bound to its own cell
//! number and version, so a group swapped, rolled back or tampered with fails as a bucket
//! would.
//!
//! # Two slots
//!
//! Packing sits above [`SlottedStore`]: the slot map has a bit per group, and a commit writes
//! each changed group whole to its free slot. The commit record still names the buckets that
//! changed (with their versions), each with its group's new slot ([`PackedStore::pending`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use blindfold_store::{ByteRange, CellId, Geometry, Store, StoreError};
use parking_lot::Mutex;

use crate::slots::SlottedStore;
use crate::{ProxyError, Result};

/// Deepest subtree per store object: 15 buckets.
pub const MAX_PACK_LEVELS: u32 = 4;

/// Room for whole groups kept for the writes that follow their reads (see the module
/// documentation). A commit writes back the groups of every path read since the one before
/// (up to 8192 buckets' worth); measured on MinIO (docs/benchmarks.md, "Packing"), 64 MiB held
/// too few of them and nearly every group written was read back first (190 GETs per operation
/// against 102 with 256 MiB).
pub const READ_BACK_CACHE_BYTES: u64 = 256 << 20;

/// What was written since the last publish.
#[derive(Debug, Default)]
struct Written {
    cells: BTreeSet<u64>,
    groups: std::collections::HashSet<u64>,
}

/// Groups recently read or written, newest copies, oldest out first.
#[derive(Debug, Default)]
struct Cache {
    groups: std::collections::HashMap<u64, Vec<u8>>,
    order: std::collections::VecDeque<u64>,
    capacity: usize,
    /// Bumped by every publish (and a failed write): a read that saw it move keeps its copy
    /// out (see [`PackedStore::read`]).
    changes: u64,
}

impl Cache {
    fn put(&mut self, group: u64, data: Vec<u8>) {
        if self.capacity == 0 {
            return;
        }
        if self.groups.insert(group, data).is_none() {
            self.order.push_back(group);
        }
        while self.groups.len() > self.capacity {
            match self.order.pop_front() {
                Some(old) => {
                    self.groups.remove(&old);
                }
                None => break,
            }
        }
    }
}

/// Whole groups of `group_bytes` that fit in [`READ_BACK_CACHE_BYTES`], at most all of them.
fn cache_groups(packing: &Packing, group_bytes: u32) -> usize {
    (READ_BACK_CACHE_BYTES / u64::from(group_bytes).max(1)).min(packing.groups()) as usize
}

/// How a tree of buckets (heap order) is cut into groups of `depth` levels; see the module
/// documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packing {
    levels: u32,
    depth: u32,
    /// First group of each band, band 0 at the leaves.
    starts: Vec<u64>,
    groups: u64,
}

impl Packing {
    /// The layout of a tree of `levels` levels in groups of `depth` levels (1 ..=
    /// [`MAX_PACK_LEVELS`]; 1 is one bucket per group, the unpacked layout).
    pub fn new(levels: u32, depth: u32) -> Result<Self> {
        if !(1..=MAX_PACK_LEVELS).contains(&depth) || depth > levels.max(1) || levels > 40 {
            return Err(ProxyError::State(format!(
                "packing {depth} levels per store object in a tree of {levels} levels: the \
                 depth must be 1 to {MAX_PACK_LEVELS}, and at most the tree's levels"
            )));
        }
        let bands = levels.div_ceil(depth);
        let mut starts = vec![0u64; bands as usize];
        let mut next = 0u64;
        for b in (0..bands).rev() {
            starts[b as usize] = next;
            next += 1u64 << Self::root_level(levels, depth, b);
        }
        Ok(Self { levels, depth, starts, groups: next })
    }

    /// The packing of a tree of `levels` levels whose two-slot store keeps a slot bit for
    /// `groups` groups: the depth whose group count that is (a checkpoint's slot map says so).
    pub fn for_groups(levels: u32, groups: u64) -> Result<Self> {
        (1..=MAX_PACK_LEVELS)
            .filter_map(|d| Self::new(levels, d).ok())
            .find(|p| p.groups == groups)
            .ok_or_else(|| {
                ProxyError::State(format!(
                    "a slot map of {groups} groups fits no packing of a {levels}-level tree"
                ))
            })
    }

    fn root_level(levels: u32, depth: u32, band: u32) -> u32 {
        levels.saturating_sub((band + 1) * depth)
    }

    /// Levels per group.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Whether groups hold more than one bucket.
    pub fn is_packed(&self) -> bool {
        self.depth > 1
    }

    /// Number of groups (cells of the store below).
    pub fn groups(&self) -> u64 {
        self.groups
    }

    /// Buckets a group has room for: `2^depth - 1`.
    pub fn members(&self) -> u64 {
        (1u64 << self.depth) - 1
    }

    /// Buckets of the tree.
    pub fn buckets(&self) -> u64 {
        (1u64 << self.levels) - 1
    }

    /// The groups of the bottom band (those holding the leaves): the first one and how many.
    /// Each covers `2^(depth - 1)` leaves, or all of them in a tree of fewer levels.
    pub fn bottom_groups(&self) -> (u64, u64) {
        (self.starts[0], 1u64 << Self::root_level(self.levels, self.depth, 0))
    }

    /// The group of bucket `cell` and its place in it.
    pub fn group_of(&self, cell: u64) -> (u64, u64) {
        debug_assert!(cell < self.buckets());
        let level = 63 - (cell + 1).leading_zeros();
        let index = cell + 1 - (1u64 << level);
        let band = (self.levels - 1 - level) / self.depth;
        let below_root = level - Self::root_level(self.levels, self.depth, band);
        let root = index >> below_root;
        let member = (1u64 << below_root) - 1 + (index & ((1u64 << below_root) - 1));
        (self.starts[band as usize] + root, member)
    }

    /// The store shape for buckets of `cell_size` bytes: a cell per group.
    pub fn geometry(&self, cell_size: u32) -> Result<Geometry> {
        let size = u64::from(cell_size) * self.members();
        let size = u32::try_from(size).map_err(|_| {
            ProxyError::State(format!(
                "{} buckets of {cell_size} bytes per store object is over 4 GiB",
                self.members()
            ))
        })?;
        Ok(Geometry::new(self.groups, size)?)
    }
}

/// The buckets of a tree over a two-slot store of groups; see the module documentation.
#[derive(Debug)]
pub struct PackedStore {
    inner: Arc<SlottedStore>,
    packing: Packing,
    logical: Geometry,
    /// Held while a write assembles and stores its groups.
    writing: tokio::sync::Mutex<()>,
    /// Buckets written since the last [`PackedStore::publish`], and their groups. (Locked
    /// before `cache` where both are.)
    written: Mutex<Written>,
    cache: Mutex<Cache>,
    /// Groups read back before a write because the cache did not hold them.
    read_backs: std::sync::atomic::AtomicU64,
}

impl PackedStore {
    /// Buckets of `cell_size` bytes laid out by `packing` over `inner`, whose cells must be its
    /// groups.
    pub fn new(inner: Arc<SlottedStore>, packing: Packing, cell_size: u32) -> Result<Self> {
        let needed = packing.geometry(cell_size)?;
        let found = inner.geometry();
        if found != needed {
            return Err(ProxyError::Geometry {
                found: format!("{} cells of {} bytes", found.cell_count(), found.cell_size()),
                needed: format!(
                    "{} groups of {} buckets of {cell_size} bytes",
                    packing.groups(),
                    packing.members()
                ),
            });
        }
        let logical = Geometry::new(packing.buckets(), cell_size)?;
        let cache =
            Cache { capacity: cache_groups(&packing, needed.cell_size()), ..Cache::default() };
        Ok(Self {
            inner,
            packing,
            logical,
            writing: tokio::sync::Mutex::new(()),
            written: Mutex::new(Written::default()),
            cache: Mutex::new(cache),
            read_backs: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Keeps at most `groups` groups for later writes (0: none, every partial write reads its
    /// groups back first).
    pub fn set_cache_groups(&self, groups: usize) {
        let mut c = self.cache.lock();
        *c = Cache { capacity: groups, changes: c.changes + 1, ..Cache::default() };
    }

    /// Trusted memory the cache of groups holds now (at most [`PackedStore::cache_bytes`] of
    /// the layout).
    pub fn trusted_bytes(&self) -> u64 {
        self.cache.lock().groups.values().map(|g| g.len() as u64).sum()
    }

    /// Trusted memory the cache of groups may hold on a tree laid out by `packing` with
    /// buckets of `cell_size` bytes: [`READ_BACK_CACHE_BYTES`], or the whole store if smaller.
    pub fn cache_bytes(packing: &Packing, cell_size: u32) -> Result<u64> {
        let group = packing.geometry(cell_size)?.cell_size();
        Ok(cache_groups(packing, group) as u64 * u64::from(group))
    }

    /// Groups read back before a write so far (the cache did not hold them).
    pub fn read_backs(&self) -> u64 {
        self.read_backs.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The layout.
    pub fn packing(&self) -> &Packing {
        &self.packing
    }

    /// The buckets written since the last publish, each with the slot its group went to.
    pub fn pending(&self) -> Vec<(u64, u8)> {
        let slots: BTreeMap<u64, u8> = self.inner.pending().into_iter().collect();
        self.written
            .lock()
            .cells
            .iter()
            .map(|&cell| {
                let group = self.packing.group_of(cell).0;
                (cell, *slots.get(&group).expect("a written bucket's group is pending"))
            })
            .collect()
    }

    /// The committed slot map (a bit per group).
    pub fn slot_map(&self) -> crate::SlotMap {
        self.inner.map()
    }

    /// Makes the pending writes the committed copies (see [`SlottedStore::publish`]).
    pub fn publish(&self) {
        let mut written = self.written.lock();
        let mut cache = self.cache.lock();
        self.inner.publish();
        cache.changes += 1;
        *written = Written::default();
    }

    fn size(&self) -> usize {
        self.logical.cell_size() as usize
    }
}

#[async_trait]
impl Store for PackedStore {
    fn geometry(&self) -> Geometry {
        self.logical
    }

    async fn read(&self, cells: &[CellId]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        let mut groups: Vec<CellId> = Vec::new();
        let mut index: BTreeMap<u64, usize> = BTreeMap::new();
        let mut places = Vec::with_capacity(cells.len());
        for c in cells {
            self.logical.check_cell(*c)?;
            let (group, member) = self.packing.group_of(c.0);
            let i = *index.entry(group).or_insert_with(|| {
                groups.push(CellId(group));
                groups.len() - 1
            });
            places.push((i, member as usize));
        }
        let before = self.cache.lock().changes;
        let fetched = self.inner.read(&groups).await?;
        {
            // What a read returns is the committed copy: older than a pending write's.
            let written = self.written.lock();
            let mut cache = self.cache.lock();
            if cache.changes == before {
                for (g, data) in groups.iter().zip(&fetched) {
                    if !cache.groups.contains_key(&g.0) && !written.groups.contains(&g.0) {
                        cache.put(g.0, data.clone());
                    }
                }
            }
        }
        let size = self.size();
        places
            .into_iter()
            .map(|(i, member)| {
                fetched[i].get(member * size..(member + 1) * size).map(<[u8]>::to_vec).ok_or_else(
                    || StoreError::Remote {
                        message: format!("group {} came back short", groups[i].0),
                        retryable: false,
                    },
                )
            })
            .collect()
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> blindfold_store::Result<Vec<Vec<u8>>> {
        let size = self.logical.cell_size();
        let inner: Vec<ByteRange> = ranges
            .iter()
            .map(|r| {
                self.logical.check_range(r)?;
                let (group, member) = self.packing.group_of(r.cell.0);
                Ok(ByteRange {
                    cell: CellId(group),
                    offset: member as u32 * size + r.offset,
                    len: r.len,
                })
            })
            .collect::<blindfold_store::Result<_>>()?;
        self.inner.read_ranges(&inner).await
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> blindfold_store::Result<()> {
        let mut by_group: BTreeMap<u64, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
        let mut names = Vec::with_capacity(cells.len());
        for (c, data) in cells {
            self.logical.check_write(c, &data)?;
            let (group, member) = self.packing.group_of(c.0);
            names.push(c.0);
            by_group.entry(group).or_default().push((member, data));
        }
        let _writing = self.writing.lock().await;
        let members = self.packing.members();
        // Groups the write does not fill: their other members' newest copies, from the cache
        // or read back first.
        let filled = |m: &[(u64, Vec<u8>)]| {
            m.iter().map(|(i, _)| *i).collect::<BTreeSet<_>>().len() as u64 == members
        };
        let mut cached: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut partial: Vec<CellId> = Vec::new();
        {
            let cache = self.cache.lock();
            for (&g, _) in by_group.iter().filter(|(_, m)| !filled(m)) {
                match cache.groups.get(&g) {
                    Some(data) => {
                        cached.insert(g, data.clone());
                    }
                    None => partial.push(CellId(g)),
                }
            }
        }
        self.read_backs.fetch_add(partial.len() as u64, std::sync::atomic::Ordering::Relaxed);
        if !partial.is_empty() {
            let back = self.inner.read_newest(&partial).await?;
            for (g, data) in partial.iter().zip(back) {
                cached.insert(g.0, data);
            }
        }
        let size = self.size();
        let whole = size * members as usize;
        let mut out = Vec::with_capacity(by_group.len());
        for (group, written) in by_group {
            let mut data = if filled(&written) {
                vec![0u8; whole]
            } else {
                cached.remove(&group).expect("an old copy of every partial group")
            };
            if data.len() != whole {
                return Err(StoreError::Remote {
                    message: format!("group {group}: {} bytes, not {whole}", data.len()),
                    retryable: false,
                });
            }
            for (member, bucket) in written {
                let at = member as usize * size;
                data[at..at + size].copy_from_slice(&bucket);
            }
            out.push((CellId(group), data));
        }
        let kept: Vec<(u64, Vec<u8>)> = out.iter().map(|(g, d)| (g.0, d.clone())).collect();
        let result = self.inner.write(out).await;
        let mut written = self.written.lock();
        let mut cache = self.cache.lock();
        match result {
            Ok(()) => {
                for (g, data) in kept {
                    written.groups.insert(g);
                    cache.put(g, data);
                }
                written.cells.extend(names);
                Ok(())
            }
            Err(e) => {
                // What the store holds of these groups is unknown now: no read's copy of
                // them is cached until the next publish.
                for (g, _) in kept {
                    cache.groups.remove(&g);
                    written.groups.insert(g);
                }
                cache.changes += 1;
                Err(e)
            }
        }
    }

    async fn flush(&self) -> blindfold_store::Result<()> {
        self.inner.flush().await
    }

    fn writes_may_be_retried(&self) -> bool {
        self.inner.writes_may_be_retried()
    }
}

#[cfg(test)]
mod tests {
    use blindfold_store::MemoryStore;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::slots::{slotted_geometry, SlotMap};

    #[test]
    fn every_bucket_has_its_own_place() {
        for levels in 1..=9 {
            for depth in 1..=MAX_PACK_LEVELS {
                if depth > levels {
                    assert!(Packing::new(levels, depth).is_err());
                    continue;
                }
                let p = Packing::new(levels, depth).unwrap();
                let mut seen = BTreeSet::new();
                for cell in 0..p.buckets() {
                    let (g, m) = p.group_of(cell);
                    assert!(g < p.groups() && m < p.members(), "{levels}/{depth}: {cell}");
                    assert!(seen.insert((g, m)), "{levels}/{depth}: {cell} shares a place");
                }
                // A path crosses one group per band: ceil(levels / depth) objects.
                let leaf = (1u64 << (levels - 1)) - 1 + 3 % (1u64 << (levels - 1));
                let mut on_path = BTreeSet::new();
                let mut c = leaf;
                loop {
                    on_path.insert(p.group_of(c).0);
                    if c == 0 {
                        break;
                    }
                    c = (c - 1) / 2;
                }
                assert_eq!(on_path.len() as u32, levels.div_ceil(depth));
                // The group count alone says the depth (a checkpoint's slot map has no more).
                assert_eq!(Packing::for_groups(levels, p.groups()).unwrap(), p);
            }
        }
        // … for every tree a gateway can have.
        for levels in 1..=40 {
            for depth in 1..=MAX_PACK_LEVELS.min(levels) {
                let p = Packing::new(levels, depth).unwrap();
                assert_eq!(Packing::for_groups(levels, p.groups()).unwrap(), p);
            }
        }
        assert_eq!(Packing::new(1, 1).unwrap().groups(), 1);
        // Unpacked, a group is a bucket: the layout of earlier stores.
        let flat = Packing::new(6, 1).unwrap();
        assert!((0..63).all(|c| flat.group_of(c) == (c, 0)));
        assert!(Packing::new(6, 0).is_err() && Packing::new(6, MAX_PACK_LEVELS + 1).is_err());
        assert!(Packing::for_groups(6, 7).is_err());
    }

    type Counted = blindfold_store::CountingStore<Arc<MemoryStore>>;

    async fn packed(levels: u32, depth: u32, size: u32) -> (Arc<Counted>, PackedStore) {
        let p = Packing::new(levels, depth).unwrap();
        let g = slotted_geometry(p.geometry(size).unwrap()).unwrap();
        let inner = Arc::new(blindfold_store::CountingStore::new(Arc::new(MemoryStore::new(g))));
        let slotted = Arc::new(
            SlottedStore::new(inner.clone() as Arc<dyn Store>, SlotMap::new(p.groups())).unwrap(),
        );
        (inner, PackedStore::new(slotted, p, size).unwrap())
    }

    #[tokio::test]
    async fn reads_what_was_written_across_commits() {
        // No cache, a cache of two groups (always evicting), the default.
        for groups in [Some(0), Some(2), None] {
            model_run(groups).await;
        }
    }

    async fn model_run(cache_groups: Option<usize>) {
        // A model: the committed copy of each bucket, and what the open commit wrote.
        let (_, s) = packed(7, 3, 8).await;
        if let Some(g) = cache_groups {
            s.set_cache_groups(g);
        }
        let n = s.geometry().cell_count();
        let mut committed = vec![vec![0u8; 8]; n as usize];
        let mut open: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for round in 0..300u32 {
            match rng.gen_range(0..4) {
                0 | 1 => {
                    let k = rng.gen_range(1..12);
                    let cells: Vec<(CellId, Vec<u8>)> = (0..k)
                        .map(|_| {
                            let c = rng.gen_range(0..n);
                            (CellId(c), vec![(round % 251) as u8 ^ c as u8; 8])
                        })
                        .collect();
                    for (c, d) in &cells {
                        open.insert(c.0, d.clone());
                    }
                    s.write(cells).await.unwrap();
                }
                2 => {
                    let pending = s.pending();
                    assert_eq!(
                        pending.iter().map(|p| p.0).collect::<Vec<_>>(),
                        open.keys().copied().collect::<Vec<_>>()
                    );
                    s.publish();
                    for (c, d) in std::mem::take(&mut open) {
                        committed[c as usize] = d;
                    }
                }
                _ => {
                    let cells: Vec<CellId> =
                        (0..rng.gen_range(1..20)).map(|_| CellId(rng.gen_range(0..n))).collect();
                    let got = s.read(&cells).await.unwrap();
                    for (c, d) in cells.iter().zip(got) {
                        assert_eq!(d, committed[c.0 as usize], "round {round}, bucket {}", c.0);
                    }
                }
            }
        }
        // Ranges come from inside the bucket.
        s.publish();
        s.write(vec![(CellId(n - 1), (0..8).collect())]).await.unwrap();
        s.publish();
        let r = s.read_ranges(&[ByteRange { cell: CellId(n - 1), offset: 2, len: 3 }]).await;
        assert_eq!(r.unwrap(), vec![vec![2, 3, 4]]);
    }

    #[tokio::test]
    async fn a_path_costs_one_cell_per_group() {
        let (inner, s) = packed(8, 2, 16).await;
        // Path to leaf 0: buckets 0, 1, 3, 7, 15, 31, 63, 127: four groups of two levels.
        let path: Vec<CellId> = [0u64, 1, 3, 7, 15, 31, 63, 127].map(CellId).to_vec();
        let groups: BTreeSet<u64> = path.iter().map(|c| s.packing().group_of(c.0).0).collect();
        assert_eq!(groups.len(), 4);
        s.write(path.iter().map(|c| (*c, vec![c.0 as u8; 16])).collect()).await.unwrap();
        // Each group read once for the members the write does not name, then written once.
        let w = inner.counts();
        assert_eq!((w.cells_read, w.cells_written), (4, 4));
        s.publish();
        inner.reset();
        let got = s.read(&path).await.unwrap();
        assert!(got.iter().zip(&path).all(|(d, c)| d == &vec![c.0 as u8; 16]));
        assert_eq!(inner.counts().cells_read, 4);
        // The siblings the write did not name kept their (empty) contents.
        assert_eq!(s.read(&[CellId(2), CellId(128)]).await.unwrap(), vec![vec![0; 16]; 2]);
        // Written back after it was read, the path needs no read first: its groups are cached.
        inner.reset();
        let read_backs = s.read_backs();
        s.write(path.iter().map(|c| (*c, vec![7; 16])).collect()).await.unwrap();
        assert_eq!((inner.counts().cells_read, inner.counts().cells_written), (0, 4));
        assert_eq!(s.read_backs(), read_backs);
        s.publish();
        // Without the cache it reads them back.
        s.set_cache_groups(0);
        s.read(&path).await.unwrap();
        inner.reset();
        s.write(path.iter().map(|c| (*c, vec![8; 16])).collect()).await.unwrap();
        assert_eq!((inner.counts().cells_read, inner.counts().cells_written), (4, 4));
        assert_eq!(s.read_backs(), read_backs + 4);
        s.publish();
        // A write naming every member of a group reads nothing first.
        inner.reset();
        let whole: Vec<(CellId, Vec<u8>)> =
            [63u64, 127, 128].iter().map(|&c| (CellId(c), vec![9; 16])).collect();
        assert_eq!(
            whole.iter().map(|(c, _)| s.packing().group_of(c.0).0).collect::<BTreeSet<_>>().len(),
            1
        );
        s.write(whole).await.unwrap();
        assert_eq!((inner.counts().cells_read, inner.counts().cells_written), (0, 1));
    }

    /// Readers filling the cache while a writer writes and publishes, over a store that
    /// delays and reorders every call: a stale copy in the cache would put old buckets back
    /// with a later partial write.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_reads_never_put_a_stale_copy_in_the_cache() {
        for (seed, cache) in [(1u64, 2usize), (2, 4), (3, 1000)] {
            let p = Packing::new(5, 2).unwrap();
            let g = slotted_geometry(p.geometry(8).unwrap()).unwrap();
            let jitter = blindfold_store::JitterStore::new(
                Arc::new(MemoryStore::new(g)),
                std::time::Duration::from_millis(2),
                seed,
            );
            let slotted =
                Arc::new(SlottedStore::new(Arc::new(jitter), SlotMap::new(p.groups())).unwrap());
            let s = Arc::new(PackedStore::new(slotted, p, 8).unwrap());
            s.set_cache_groups(cache);
            let n = s.geometry().cell_count();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let readers: Vec<_> = (0..3)
                .map(|r| {
                    let (s, stop) = (Arc::clone(&s), Arc::clone(&stop));
                    tokio::spawn(async move {
                        let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 10 + r);
                        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                            let cells: Vec<CellId> =
                                (0..4).map(|_| CellId(rng.gen_range(0..n))).collect();
                            s.read(&cells).await.unwrap();
                        }
                    })
                })
                .collect();
            let mut model = vec![vec![0u8; 8]; n as usize];
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            for round in 1..=250u8 {
                let cells: Vec<(CellId, Vec<u8>)> = (0..rng.gen_range(1..3))
                    .map(|_| (CellId(rng.gen_range(0..n)), vec![round; 8]))
                    .collect();
                for (c, d) in &cells {
                    model[c.0 as usize] = d.clone();
                }
                s.write(cells).await.unwrap();
                if rng.gen_bool(0.2) {
                    s.publish();
                }
                tokio::time::sleep(std::time::Duration::from_micros(rng.gen_range(0..1500))).await;
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            for r in readers {
                r.await.unwrap();
            }
            s.publish();
            let all: Vec<CellId> = (0..n).map(CellId).collect();
            let got = s.read(&all).await.unwrap();
            for (c, d) in got.iter().enumerate() {
                assert_eq!(d, &model[c], "seed {seed}, cache {cache}: bucket {c}");
            }
        }
    }

    #[tokio::test]
    async fn a_store_of_another_shape_is_refused() {
        let p = Packing::new(5, 2).unwrap();
        let inner = Arc::new(MemoryStore::new(Geometry::new(2 * 31, 8).unwrap()));
        let slotted = Arc::new(SlottedStore::new(inner, SlotMap::new(31)).unwrap());
        assert!(PackedStore::new(slotted, p, 8).is_err());
    }
}
