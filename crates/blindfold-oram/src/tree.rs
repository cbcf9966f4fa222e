//! Binary tree geometry shared by the tree ORAMs.
//!
//! Buckets are numbered in heap order: the root is bucket 0 and the children of bucket `i` are
//! `2i + 1` and `2i + 2`. A tree of height `L` has levels `0..=L`, `2^L` leaves and
//! `2^(L+1) - 1` buckets. Leaf `x` is bucket `2^L - 1 + x`.

use serde::{Deserialize, Serialize};

use crate::{BucketId, Leaf};

/// Shape of one binary tree of buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeShape {
    height: u32,
}

impl TreeShape {
    /// Largest supported height: leaves must fit the 32-bit entries of the position map.
    pub const MAX_HEIGHT: u32 = 31;

    /// A tree with `2^height` leaves. `height` must be at most [`TreeShape::MAX_HEIGHT`].
    pub fn with_height(height: u32) -> Option<Self> {
        (height <= Self::MAX_HEIGHT).then_some(Self { height })
    }

    /// The smallest tree with at least `leaves` leaves.
    pub fn for_leaves(leaves: u64) -> Option<Self> {
        let leaves = leaves.max(1).checked_next_power_of_two()?;
        Self::with_height(leaves.trailing_zeros())
    }

    /// Height `L` (the root is level 0, leaves are level `L`).
    pub fn height(&self) -> u32 {
        self.height
    }

    /// Number of levels, `L + 1`: the length of every path.
    pub fn levels(&self) -> u32 {
        self.height + 1
    }

    /// Number of leaves, `2^L`.
    pub fn leaves(&self) -> u64 {
        1u64 << self.height
    }

    /// Number of buckets, `2^(L+1) - 1`.
    pub fn buckets(&self) -> u64 {
        (1u64 << (self.height + 1)) - 1
    }

    /// The bucket at `level` on the path from the root to `leaf`.
    pub fn bucket_on_path(&self, leaf: Leaf, level: u32) -> BucketId {
        debug_assert!(leaf.0 < self.leaves() && level <= self.height);
        BucketId(((leaf.0 + self.leaves()) >> (self.height - level)) - 1)
    }

    /// Deepest level at which the paths to `a` and `b` still share a bucket.
    pub fn common_depth(&self, a: Leaf, b: Leaf) -> u32 {
        let diverge = 64 - (a.0 ^ b.0).leading_zeros();
        self.height - diverge
    }

    /// Level of a bucket.
    pub fn level_of(&self, bucket: BucketId) -> u32 {
        63 - (bucket.0 + 1).leading_zeros()
    }

    /// The leaf of the leftmost path through `bucket`'s subtree is not needed by the schemes;
    /// this returns the leaf reached from a leaf-level bucket.
    pub fn leaf_of(&self, bucket: BucketId) -> Option<Leaf> {
        let first = self.leaves() - 1;
        (bucket.0 >= first && bucket.0 < self.buckets()).then(|| Leaf(bucket.0 - first))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_heap_ordered() {
        let t = TreeShape::with_height(3).unwrap();
        assert_eq!(t.buckets(), 15);
        assert_eq!(t.leaves(), 8);
        let path: Vec<u64> = (0..=3).map(|l| t.bucket_on_path(Leaf(5), l).0).collect();
        // leaf 5 is bucket 12; its ancestors are 5, 2, 0.
        assert_eq!(path, vec![0, 2, 5, 12]);
        assert_eq!(t.leaf_of(BucketId(12)), Some(Leaf(5)));
        assert_eq!(t.leaf_of(BucketId(5)), None);
        for (l, b) in path.iter().enumerate() {
            assert_eq!(t.level_of(BucketId(*b)), l as u32);
        }
    }

    #[test]
    fn common_depth_matches_paths() {
        let t = TreeShape::with_height(4).unwrap();
        for a in 0..16 {
            for b in 0..16 {
                let d = t.common_depth(Leaf(a), Leaf(b));
                for l in 0..=4 {
                    let same = t.bucket_on_path(Leaf(a), l) == t.bucket_on_path(Leaf(b), l);
                    assert_eq!(same, l <= d, "a={a} b={b} level={l} depth={d}");
                }
            }
        }
    }

    #[test]
    fn for_leaves_rounds_up() {
        assert_eq!(TreeShape::for_leaves(1).unwrap().height(), 0);
        assert_eq!(TreeShape::for_leaves(1024).unwrap().height(), 10);
        assert_eq!(TreeShape::for_leaves(1025).unwrap().height(), 11);
        assert!(TreeShape::with_height(32).is_none());
    }
}
