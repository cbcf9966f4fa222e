//! The spread structures of the eviction (ORVP, NRVP, PIECE): page-aligned 4 KiB pages, each
//! holding one slice of the 32-byte vector of every block, so that reading or writing the
//! vector of block `b` touches every page once, in order: *which* pages are touched, and in
//! what order, does not depend on `b`.
//!
//! How many pages depends only on how many blocks the structure holds (public):
//!
//! | blocks | slice of a vector per page | pages |
//! |---|---|---|
//! | ≤ 128 | all 32 bytes | 1 |
//! | ≤ 256, 512, 1024, 2048 | 16, 8, 4, 2 bytes | 2, 4, 8, 16 |
//! | ≤ 4096 | 1 byte | 32 |
//! | ≤ 8192 ([`MAX_EVICT_BLOCKS`]) | one nibble | 64 |
//!
//! Every access to a block's vector costs one cache line per page, and the lines of different
//! pages are far apart, so a structure over few blocks is cheaper per block than one over
//! many (`cargo run --release -p blindfold-tee --example timing S 1024`, one core: 6.7 µs per
//! block at 6,814 blocks, 5.2 at 3,987, 4.1 at 1,909).
//!
//! Within page `p` the slices are rotated by `p` cache lines: block `b`'s slice starts at byte
//! `(b · width + 64·p) mod 4096`. Without the rotation the accesses for one block would sit at
//! the same offset of every page, hence in the same L1 cache set, and evict each other (the
//! eviction ran 2–3× slower); with it they fall in different sets. The rotation is public and
//! the same for every block, so it changes nothing in the page-level argument.

use crate::trace::{Access, Area, Tracer};
use crate::MAX_EVICT_BLOCKS;

/// Size of a page.
pub const PAGE_SIZE: usize = 4096;
/// Pages of the largest structure: one per nibble of a 32-byte vector.
pub const PAGES: usize = 64;

/// Pages of a structure for `blocks` blocks (at most [`MAX_EVICT_BLOCKS`]); see the table in
/// the module's documentation.
pub fn pages_for(blocks: usize) -> usize {
    if blocks > PAGE_SIZE {
        PAGES
    } else {
        32 / width_for(blocks)
    }
}

/// Bytes of a vector per page for `blocks ≤ PAGE_SIZE` blocks: the most that fit.
fn width_for(blocks: usize) -> usize {
    PAGE_SIZE / blocks.next_power_of_two().max(PAGE_SIZE / 32)
}

/// A cache line: the rotation step between consecutive pages.
const LINE: usize = 64;

const _: () = assert!(PAGE_SIZE * 2 == MAX_EVICT_BLOCKS);

/// One page, aligned so that it is exactly one page of the address space.
#[derive(Clone)]
#[repr(C, align(4096))]
struct Page([u8; PAGE_SIZE]);

/// A structure of [`pages_for`]`(blocks)` pages.
pub(crate) struct Pages {
    area: Area,
    /// Bytes of a vector per page; 0 for the nibble layout.
    width: usize,
    /// Blocks it holds.
    blocks: usize,
    pages: Box<[Page]>,
}

impl Pages {
    /// A structure for the vectors of `blocks` blocks (at most [`MAX_EVICT_BLOCKS`]).
    pub(crate) fn new(area: Area, blocks: usize) -> Self {
        assert!(blocks <= MAX_EVICT_BLOCKS, "{blocks} blocks do not fit the spread structures");
        let width = if blocks > PAGE_SIZE { 0 } else { width_for(blocks) };
        let pages = vec![Page([0; PAGE_SIZE]); pages_for(blocks)].into_boxed_slice();
        Self { area, width, blocks, pages }
    }

    /// Stores `v` as the vector of block `index`: slice `p` into page `p`, pages in order.
    #[inline(always)]
    pub(crate) fn scatter<T: Tracer + ?Sized>(&mut self, index: usize, v: &[u8; 32], t: &mut T) {
        debug_assert!(index < self.blocks);
        match self.width {
            0 => self.scatter_nibbles(index, v, t),
            1 => self.scatter_bytes::<1, T>(index, v, t),
            2 => self.scatter_bytes::<2, T>(index, v, t),
            4 => self.scatter_bytes::<4, T>(index, v, t),
            8 => self.scatter_bytes::<8, T>(index, v, t),
            16 => self.scatter_bytes::<16, T>(index, v, t),
            _ => self.scatter_bytes::<32, T>(index, v, t),
        }
    }

    /// The vector of block `index`: slice `p` from page `p`, pages in order.
    #[inline(always)]
    pub(crate) fn gather<T: Tracer + ?Sized>(&self, index: usize, t: &mut T) -> [u8; 32] {
        debug_assert!(index < self.blocks);
        match self.width {
            0 => self.gather_nibbles(index, t),
            1 => self.gather_bytes::<1, T>(index, t),
            2 => self.gather_bytes::<2, T>(index, t),
            4 => self.gather_bytes::<4, T>(index, t),
            8 => self.gather_bytes::<8, T>(index, t),
            16 => self.gather_bytes::<16, T>(index, t),
            _ => self.gather_bytes::<32, T>(index, t),
        }
    }

    #[inline(always)]
    fn scatter_bytes<const W: usize, T: Tracer + ?Sized>(
        &mut self,
        index: usize,
        v: &[u8; 32],
        t: &mut T,
    ) {
        for (p, (page, slice)) in self.pages.iter_mut().zip(v.chunks_exact(W)).enumerate() {
            // `W` divides the line, so a slice never wraps around the page's end.
            let at = (index * W + p * LINE) % PAGE_SIZE;
            page.0[at..at + W].copy_from_slice(slice);
            t.record(Access::Page { area: self.area, page: p as u8, write: true });
        }
    }

    #[inline(always)]
    fn gather_bytes<const W: usize, T: Tracer + ?Sized>(
        &self,
        index: usize,
        t: &mut T,
    ) -> [u8; 32] {
        let mut v = [0u8; 32];
        for (p, (page, slice)) in self.pages.iter().zip(v.chunks_exact_mut(W)).enumerate() {
            let at = (index * W + p * LINE) % PAGE_SIZE;
            slice.copy_from_slice(&page.0[at..at + W]);
            t.record(Access::Page { area: self.area, page: p as u8, write: false });
        }
        v
    }

    /// Two adjacent blocks' slices lie side by side in every page (`index` even, and `2W`
    /// divides the line, so the pair never wraps around the page's end): one read per page.
    #[inline(always)]
    fn gather_pair_bytes<const W: usize, T: Tracer + ?Sized>(
        &self,
        index: usize,
        t: &mut T,
    ) -> ([u8; 32], [u8; 32]) {
        let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
        for (p, (page, (x, y))) in
            self.pages.iter().zip(a.chunks_exact_mut(W).zip(b.chunks_exact_mut(W))).enumerate()
        {
            let at = (index * W + p * LINE) % PAGE_SIZE;
            x.copy_from_slice(&page.0[at..at + W]);
            y.copy_from_slice(&page.0[at + W..at + 2 * W]);
            t.record(Access::Page { area: self.area, page: p as u8, write: false });
        }
        (a, b)
    }

    /// The nibble layout: nibble `p` into page `p`, pages in order 0..64.
    #[inline]
    fn scatter_nibbles<T: Tracer + ?Sized>(&mut self, index: usize, v: &[u8; 32], t: &mut T) {
        let byte = index / 2;
        let shift = (index & 1) * 4;
        let keep = !(0x0fu8 << shift);
        let mut nibbles = [0u8; PAGES];
        for (pair, &x) in nibbles.chunks_exact_mut(2).zip(v) {
            pair[0] = (x & 0x0f) << shift;
            pair[1] = (x >> 4) << shift;
        }
        for (p, (page, nibble)) in self.pages.iter_mut().zip(nibbles).enumerate() {
            let slot = &mut page.0[(byte + p * LINE) % PAGE_SIZE];
            *slot = (*slot & keep) | nibble;
            t.record(Access::Page { area: self.area, page: p as u8, write: true });
        }
    }

    /// The vectors of blocks `index` and `index + 1` (`index` even), with one read of every
    /// page, in order: in the nibble layout both share a byte of every page, in the others
    /// their slices lie side by side.
    #[inline]
    pub(crate) fn gather_pair<T: Tracer + ?Sized>(
        &self,
        index: usize,
        t: &mut T,
    ) -> ([u8; 32], [u8; 32]) {
        debug_assert!(index.is_multiple_of(2) && index + 1 < self.blocks);
        match self.width {
            0 => {}
            1 => return self.gather_pair_bytes::<1, T>(index, t),
            2 => return self.gather_pair_bytes::<2, T>(index, t),
            4 => return self.gather_pair_bytes::<4, T>(index, t),
            8 => return self.gather_pair_bytes::<8, T>(index, t),
            16 => return self.gather_pair_bytes::<16, T>(index, t),
            _ => return self.gather_pair_bytes::<32, T>(index, t),
        }
        let raw = self.read_bytes(index / 2, t);
        let (mut lo, mut hi) = ([0u8; 32], [0u8; 32]);
        for ((l, h), pair) in lo.iter_mut().zip(hi.iter_mut()).zip(raw.chunks_exact(2)) {
            *l = (pair[0] & 0x0f) | (pair[1] << 4);
            *h = (pair[0] >> 4) | (pair[1] & 0xf0);
        }
        (lo, hi)
    }

    /// The nibble layout: nibble `p` from page `p`, pages in order 0..64.
    #[inline]
    fn gather_nibbles<T: Tracer + ?Sized>(&self, index: usize, t: &mut T) -> [u8; 32] {
        let raw = self.read_bytes(index / 2, t);
        let shift = (index & 1) * 4;
        let mut v = [0u8; 32];
        for (x, pair) in v.iter_mut().zip(raw.chunks_exact(2)) {
            *x = ((pair[0] >> shift) & 0x0f) | (((pair[1] >> shift) & 0x0f) << 4);
        }
        v
    }

    /// Byte `byte` of every page's rotated layout (it holds the nibbles of blocks `2·byte` and
    /// `2·byte + 1`), pages in order 0..64. The nibbles are taken apart afterwards, outside
    /// the loop over the pages: done inside it, the variable shifts made scatter and gather
    /// a fifth slower.
    #[inline]
    fn read_bytes<T: Tracer + ?Sized>(&self, byte: usize, t: &mut T) -> [u8; PAGES] {
        let mut raw = [0u8; PAGES];
        for (p, (page, r)) in self.pages.iter().zip(raw.iter_mut()).enumerate() {
            *r = page.0[(byte + p * LINE) % PAGE_SIZE];
            t.record(Access::Page { area: self.area, page: p as u8, write: false });
        }
        raw
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_round_trip_without_disturbing_neighbours() {
        let mut pages = Pages::new(Area::Piece, MAX_EVICT_BLOCKS);
        let mut none = |_: Access| {};
        let v = |i: usize| -> [u8; 32] { std::array::from_fn(|k| (i * 31 + k * 7) as u8) };
        for i in [0, 1, 2, 8190, 8191] {
            pages.scatter(i, &v(i), &mut none);
        }
        for i in [0, 1, 2, 8190, 8191] {
            assert_eq!(pages.gather(i, &mut none), v(i), "block {i}");
        }
        pages.scatter(1, &[0xff; 32], &mut none);
        assert_eq!(pages.gather(0, &mut none), v(0));
        assert_eq!(pages.gather(2, &mut none), v(2));
        assert_eq!(pages.gather(3, &mut none), [0; 32]);
    }

    #[test]
    fn a_pair_gathers_what_two_single_gathers_do() {
        let mut pages = Pages::new(Area::Piece, MAX_EVICT_BLOCKS);
        let mut none = |_: Access| {};
        let v = |i: usize| -> [u8; 32] { std::array::from_fn(|k| (i * 37 + k * 11 + 5) as u8) };
        for i in [0, 1, 2, 3, 4094, 4095, 8190, 8191] {
            pages.scatter(i, &v(i), &mut none);
        }
        for i in [0, 2, 4094, 8190] {
            assert_eq!(pages.gather_pair(i, &mut none), (v(i), v(i + 1)), "pair {i}");
            assert_eq!(pages.gather(i, &mut none), v(i));
            assert_eq!(pages.gather(i + 1, &mut none), v(i + 1));
        }
        let mut seen = Vec::new();
        pages.gather_pair(6, &mut |a| seen.push(a));
        assert_eq!(seen.len(), PAGES);
        assert!(seen
            .iter()
            .enumerate()
            .all(|(p, a)| *a == Access::Page { area: Area::Piece, page: p as u8, write: false }));
    }

    #[test]
    fn every_page_is_touched_once_in_order() {
        let mut pages = Pages::new(Area::Orvp, MAX_EVICT_BLOCKS);
        let mut seen = Vec::new();
        pages.scatter(5, &[1; 32], &mut |a| seen.push(a));
        let mut other = Vec::new();
        pages.scatter(6000, &[2; 32], &mut |a| other.push(a));
        assert_eq!(seen, other);
        assert_eq!(seen.len(), PAGES);
        assert!(seen
            .iter()
            .enumerate()
            .all(|(p, a)| *a == Access::Page { area: Area::Orvp, page: p as u8, write: true }));
    }

    /// Every layout keeps each block's vector apart from its neighbours', and touches its
    /// pages once each, in order, whichever block it is.
    #[test]
    fn every_layout_round_trips_and_touches_all_its_pages_in_order() {
        let v = |i: usize| -> [u8; 32] { std::array::from_fn(|k| (i * 29 + k * 13 + 1) as u8) };
        for (blocks, pages_want) in [
            (1, 1),
            (128, 1),
            (129, 2),
            (256, 2),
            (1000, 8),
            (2048, 16),
            (2049, 32),
            (4096, 32),
            (4097, 64),
            (8192, 64),
        ] {
            assert_eq!(pages_for(blocks), pages_want, "{blocks} blocks");
            let mut pages = Pages::new(Area::Piece, blocks);
            assert_eq!(pages.pages.len(), pages_want);
            for i in 0..blocks {
                pages.scatter(i, &v(i), &mut |_: Access| {});
            }
            let mut traces = Vec::new();
            for i in [0, blocks / 2, blocks - 1] {
                assert_eq!(pages.gather(i, &mut |_: Access| {}), v(i), "{blocks} blocks, #{i}");
                let mut seen = Vec::new();
                pages.scatter(i, &v(i), &mut |a| seen.push(a));
                traces.push(seen);
            }
            for i in 0..blocks {
                assert_eq!(pages.gather(i, &mut |_: Access| {}), v(i), "{blocks} blocks, #{i}");
            }
            for i in (0..blocks.saturating_sub(1)).step_by(2) {
                let mut seen = Vec::new();
                let pair = pages.gather_pair(i, &mut |a| seen.push(a));
                assert_eq!(pair, (v(i), v(i + 1)), "{blocks} blocks, pair #{i}");
                assert_eq!(seen.len(), pages_want, "{blocks} blocks: one read per page");
            }
            let want: Vec<Access> = (0..pages_want)
                .map(|p| Access::Page { area: Area::Piece, page: p as u8, write: true })
                .collect();
            assert!(traces.iter().all(|t| *t == want), "{blocks} blocks: {traces:?}");
        }
    }

    #[test]
    fn pages_are_page_aligned() {
        let pages = Pages::new(Area::Nrvp, MAX_EVICT_BLOCKS);
        for p in pages.pages.iter() {
            assert_eq!(p.0.as_ptr() as usize % PAGE_SIZE, 0);
        }
    }
}
