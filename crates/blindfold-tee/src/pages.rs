//! The nibble-spread structures of the eviction (ORVP, NRVP, PIECE): 64 pages of 4 KiB, page
//! `p` holding nibble `p` of the 32-byte vector of every block.
//!
//! Reading or writing the vector of block `b` touches every page once, so *which* pages are
//! touched, and in what order, does not depend on `b`. One page holds 8192 nibbles, hence
//! [`MAX_EVICT_BLOCKS`](crate::MAX_EVICT_BLOCKS).
//!
//! Within page `p` the nibbles are rotated by `p` cache lines: block `b`'s nibble is at byte
//! `(b / 2 + 64·p) mod 4096`. Without the rotation the 64 accesses for one block would sit at
//! the same offset of 64 pages, hence in the same L1 cache set, and evict each other (the
//! eviction ran 2–3× slower); with it they fall in 64 different sets. The rotation is public
//! and the same for every block, so it changes nothing in the page-level argument.

use crate::trace::{Access, Area, Tracer};
use crate::MAX_EVICT_BLOCKS;

/// Size of a page.
pub const PAGE_SIZE: usize = 4096;
/// Pages per structure: one per nibble of a 32-byte vector.
pub const PAGES: usize = 64;

/// A cache line: the rotation step between consecutive pages.
const LINE: usize = 64;

const _: () = assert!(PAGE_SIZE * 2 == MAX_EVICT_BLOCKS);

/// One page, aligned so that it is exactly one page of the address space.
#[derive(Clone)]
#[repr(C, align(4096))]
struct Page([u8; PAGE_SIZE]);

/// A structure of [`PAGES`] pages.
pub(crate) struct Pages {
    area: Area,
    pages: Box<[Page]>,
}

impl Pages {
    pub(crate) fn new(area: Area) -> Self {
        Self { area, pages: vec![Page([0; PAGE_SIZE]); PAGES].into_boxed_slice() }
    }

    /// Stores `v` as the vector of block `index` (`< MAX_EVICT_BLOCKS`): nibble `p` into page
    /// `p`, pages in order 0..64.
    #[inline]
    pub(crate) fn scatter<T: Tracer + ?Sized>(&mut self, index: usize, v: &[u8; 32], t: &mut T) {
        debug_assert!(index < MAX_EVICT_BLOCKS);
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

    /// The vectors of blocks `index` and `index + 1` (`index` even): both nibbles of a page
    /// share a byte, so one read of every page, in order 0..64, gives both.
    #[inline]
    pub(crate) fn gather_pair<T: Tracer + ?Sized>(
        &self,
        index: usize,
        t: &mut T,
    ) -> ([u8; 32], [u8; 32]) {
        debug_assert!(index.is_multiple_of(2) && index + 1 < MAX_EVICT_BLOCKS);
        let raw = self.read_bytes(index / 2, t);
        let (mut lo, mut hi) = ([0u8; 32], [0u8; 32]);
        for ((l, h), pair) in lo.iter_mut().zip(hi.iter_mut()).zip(raw.chunks_exact(2)) {
            *l = (pair[0] & 0x0f) | (pair[1] << 4);
            *h = (pair[0] >> 4) | (pair[1] & 0xf0);
        }
        (lo, hi)
    }

    /// The vector of block `index`: nibble `p` from page `p`, pages in order 0..64.
    #[inline]
    pub(crate) fn gather<T: Tracer + ?Sized>(&self, index: usize, t: &mut T) -> [u8; 32] {
        debug_assert!(index < MAX_EVICT_BLOCKS);
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
        let mut pages = Pages::new(Area::Piece);
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
        let mut pages = Pages::new(Area::Piece);
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
        let mut pages = Pages::new(Area::Orvp);
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

    #[test]
    fn pages_are_page_aligned() {
        let pages = Pages::new(Area::Nrvp);
        for p in pages.pages.iter() {
            assert_eq!(p.0.as_ptr() as usize % PAGE_SIZE, 0);
        }
    }
}
