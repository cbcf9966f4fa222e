//! Serde adapters that encode the byte strings inside the trusted state as byte strings rather
//! than as sequences of numbers. bincode writes both the same way (a length, then the bytes),
//! so the on-disk format is unchanged; it is only much faster, since a sequence is encoded one
//! element at a time.

use serde::de::Deserializer;
use serde::ser::{SerializeSeq, Serializer};
use serde::Deserialize;
use serde_bytes::{ByteBuf, Bytes};

/// The stash of every tree: (block id, leaf, contents).
type Stashes = Vec<Vec<(u64, u32, Vec<u8>)>>;
/// Changed cached buckets of every tree: (heap index, contents).
type CacheChanges = Vec<Vec<(u32, Vec<u8>)>>;

/// `Vec<Vec<(u64, u32, Vec<u8>)>>`: the stash of every tree.
pub(crate) mod stashes {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        v: &[Vec<(u64, u32, Vec<u8>)>],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut outer = s.serialize_seq(Some(v.len()))?;
        for stash in v {
            let row: Vec<(u64, u32, &Bytes)> =
                stash.iter().map(|(id, leaf, d)| (*id, *leaf, Bytes::new(d))).collect();
            outer.serialize_element(&row)?;
        }
        outer.end()
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Stashes, D::Error> {
        let raw: Vec<Vec<(u64, u32, ByteBuf)>> = Deserialize::deserialize(d)?;
        Ok(raw
            .into_iter()
            .map(|s| s.into_iter().map(|(id, leaf, b)| (id, leaf, b.into_vec())).collect())
            .collect())
    }
}

/// `Vec<Vec<Vec<u8>>>`: the cached top-level buckets of every tree.
pub(crate) mod caches {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(v: &[Vec<Vec<u8>>], s: S) -> Result<S::Ok, S::Error> {
        let mut outer = s.serialize_seq(Some(v.len()))?;
        for cache in v {
            let row: Vec<&Bytes> = cache.iter().map(|b| Bytes::new(b)).collect();
            outer.serialize_element(&row)?;
        }
        outer.end()
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Vec<Vec<Vec<u8>>>, D::Error> {
        let raw: Vec<Vec<ByteBuf>> = Deserialize::deserialize(d)?;
        Ok(raw.into_iter().map(|c| c.into_iter().map(ByteBuf::into_vec).collect()).collect())
    }
}

/// `Vec<Vec<(u32, Vec<u8>)>>`: changed cached buckets of every tree.
pub(crate) mod cache_changes {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        v: &[Vec<(u32, Vec<u8>)>],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut outer = s.serialize_seq(Some(v.len()))?;
        for changes in v {
            let row: Vec<(u32, &Bytes)> =
                changes.iter().map(|(i, b)| (*i, Bytes::new(b))).collect();
            outer.serialize_element(&row)?;
        }
        outer.end()
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CacheChanges, D::Error> {
        let raw: Vec<Vec<(u32, ByteBuf)>> = Deserialize::deserialize(d)?;
        Ok(raw
            .into_iter()
            .map(|c| c.into_iter().map(|(i, b)| (i, b.into_vec())).collect())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Serialize;

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Fast {
        #[serde(with = "stashes")]
        s: Vec<Vec<(u64, u32, Vec<u8>)>>,
        #[serde(with = "caches")]
        c: Vec<Vec<Vec<u8>>>,
        #[serde(with = "cache_changes")]
        d: Vec<Vec<(u32, Vec<u8>)>>,
    }

    #[derive(Serialize, Deserialize, PartialEq, Debug)]
    struct Plain {
        s: Vec<Vec<(u64, u32, Vec<u8>)>>,
        c: Vec<Vec<Vec<u8>>>,
        d: Vec<Vec<(u32, Vec<u8>)>>,
    }

    #[test]
    fn same_encoding_as_plain_vectors_and_round_trips() {
        let s = vec![vec![(7, 3, vec![1, 2, 3]), (9, 0, vec![])], vec![]];
        let c = vec![vec![vec![0xAA; 5], vec![0x55; 2]]];
        let d = vec![vec![(4, vec![9; 3])], vec![]];
        let fast = Fast { s: s.clone(), c: c.clone(), d: d.clone() };
        let plain = Plain { s, c, d };
        let a = bincode::serialize(&fast).unwrap();
        let b = bincode::serialize(&plain).unwrap();
        assert_eq!(a, b, "bincode must encode both forms alike, or old checkpoints break");
        let back: Fast = bincode::deserialize(&a).unwrap();
        assert_eq!(back, fast);
    }
}
