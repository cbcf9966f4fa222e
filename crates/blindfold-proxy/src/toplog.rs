//! How [`crate::DurableTao`] logs the tree top it keeps open in trusted memory: by block, and
//! a block only when the log does not already hold its contents.
//!
//! Each commit's redo record must let the next start rebuild every pinned bucket
//! ([`crate::pinned`]) the commit changed. Logging those buckets sealed and whole costs a full
//! bucket per change, although most changes only move blocks around the top (an eviction
//! takes a block out of one bucket and puts it in another) or change one slot of `Z`.
//!
//! So the record lists each changed bucket's blocks (id and leaf), and a block's contents only
//! when they are new to the log. Both sides keep a [`TopPool`]: the contents of every block in
//! the top as the last checkpoint and the records since left it. The writer compares by
//! pointer (the engine shares a block's contents between its copies, and a write makes new
//! ones), so deciding costs nothing; replay takes a block named without contents from its own
//! pool, built the same way from the same records.
//!
//! A checkpoint does not start the writer's pool afresh. Every block in the pool is in a
//! bucket as the records left it, so in the open top the checkpoint holds by block, with the
//! same contents; a replay starts its pool from that top ([`TopPool::starting_from`]), which
//! holds all the writer's. A replay from an earlier checkpoint, with every record since (a
//! recovery from the gateway's store-side log between an engine checkpoint and the store
//! checkpoint carrying it), holds them too: a block the writer had from before that earlier
//! checkpoint was in its top. (Started empty at each checkpoint, as until 2026-12-02, the
//! first record after it carried the whole top again: 10–14 MiB in the gateway's benchmark,
//! against 2–4 MiB for the others. Started from the checkpoint's whole top, the writer would
//! name blocks of buckets it opened from their sealed copies since the earlier checkpoint,
//! which a replay from that one lacks.)
//!
//! The record is sealed whole ([`blindfold_crypto::StateSealer`]), so the open contents in it
//! are as safe as the sealed cells were.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::tao::TopWritten;

/// One changed bucket of the tree top in a redo record.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TopBucket {
    pub(crate) cell: u64,
    pub(crate) version: u64,
    pub(crate) blocks: Vec<TopBlock>,
}

/// One block of a [`TopBucket`].
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TopBlock {
    pub(crate) id: u64,
    pub(crate) leaf: u32,
    /// `None`: the contents this block has in the pool.
    #[serde(serialize_with = "ser_contents", deserialize_with = "de_contents")]
    pub(crate) data: Option<Arc<[u8]>>,
}

fn ser_contents<S: Serializer>(data: &Option<Arc<[u8]>>, s: S) -> Result<S::Ok, S::Error> {
    data.as_deref().map(serde_bytes::Bytes::new).serialize(s)
}

fn de_contents<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Arc<[u8]>>, D::Error> {
    let data: Option<serde_bytes::ByteBuf> = Deserialize::deserialize(d)?;
    Ok(data.map(|b| b.into_vec().into()))
}

/// The contents of the blocks in the logged tree top; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct TopPool {
    blocks: HashMap<u64, Arc<[u8]>>,
    /// Each logged bucket's block ids.
    buckets: HashMap<u64, Vec<u64>>,
}

impl TopPool {
    /// The record entries for `written`: a block's contents only where the pool lacks them.
    pub(crate) fn encode(&self, written: &[TopWritten]) -> Vec<TopBucket> {
        written
            .iter()
            .map(|w| TopBucket {
                cell: w.cell,
                version: w.version,
                blocks: w
                    .blocks
                    .iter()
                    .map(|(id, leaf, data)| {
                        let known = self.blocks.get(id).is_some_and(|d| Arc::ptr_eq(d, data));
                        TopBlock { id: *id, leaf: *leaf, data: (!known).then(|| data.clone()) }
                    })
                    .collect(),
            })
            .collect()
    }

    /// A replayed record's entries, with every block's contents (from the pool where the
    /// record left them out). `block_size` and `z` bound what a bucket may hold.
    pub(crate) fn resolve(
        &self,
        logged: Vec<TopBucket>,
        block_size: usize,
        z: usize,
    ) -> Result<Vec<TopWritten>, String> {
        logged
            .into_iter()
            .map(|b| {
                if b.blocks.len() > z {
                    return Err(format!("top bucket {} holds {} blocks", b.cell, b.blocks.len()));
                }
                let blocks = b
                    .blocks
                    .into_iter()
                    .map(|e| {
                        let data = match e.data {
                            Some(d) => d,
                            None => self.blocks.get(&e.id).cloned().ok_or_else(|| {
                                format!("top bucket {} names a block the log never held", b.cell)
                            })?,
                        };
                        if data.len() != block_size {
                            return Err(format!(
                                "top bucket {} holds a block of {} bytes",
                                b.cell,
                                data.len()
                            ));
                        }
                        Ok((e.id, e.leaf, data))
                    })
                    .collect::<Result<_, String>>()?;
                Ok(TopWritten { cell: b.cell, version: b.version, blocks })
            })
            .collect()
    }

    /// Takes in a record's buckets (as [`TopPool::encode`] was given them, or as
    /// [`TopPool::resolve`] returned them): blocks that left the logged top are forgotten.
    /// Every lookup of a record happens before this, on both sides.
    pub(crate) fn apply(&mut self, written: &[TopWritten]) {
        for w in written {
            for id in self.buckets.remove(&w.cell).unwrap_or_default() {
                self.blocks.remove(&id);
            }
        }
        for w in written {
            self.buckets.insert(w.cell, w.blocks.iter().map(|e| e.0).collect());
            for (id, _, data) in &w.blocks {
                self.blocks.insert(*id, data.clone());
            }
        }
    }

    /// A replay's pool from a checkpoint holding `top` (every open bucket, by block).
    pub(crate) fn starting_from(top: &[TopWritten]) -> Self {
        let mut pool = Self::default();
        pool.apply(top);
        pool
    }

    /// Blocks it holds.
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(cell: u64, version: u64, blocks: &[(u64, &Arc<[u8]>)]) -> TopWritten {
        TopWritten {
            cell,
            version,
            blocks: blocks.iter().map(|(id, d)| (*id, 7, Arc::clone(d))).collect(),
        }
    }

    fn roundtrip(written: &[TopBucket]) -> Vec<TopBucket> {
        bincode::deserialize(&bincode::serialize(written).unwrap()).unwrap()
    }

    #[test]
    fn a_moved_block_is_named_and_replay_finds_its_contents() {
        let contents = |byte: u8| -> Arc<[u8]> { vec![byte; 4].into() };
        let (a, b, b2) = (contents(1), contents(2), contents(2));
        let (mut writer, mut replay) = (TopPool::default(), TopPool::default());
        let mut commit = |written: Vec<TopWritten>| -> (Vec<TopBucket>, Vec<TopWritten>) {
            let logged = roundtrip(&writer.encode(&written));
            writer.apply(&written);
            let resolved = replay.resolve(roundtrip(&logged), 4, 2).unwrap();
            replay.apply(&resolved);
            (logged, resolved)
        };
        // First record: both blocks are new to the log.
        let (logged, _) = commit(vec![bucket(0, 1, &[(5, &a)]), bucket(1, 1, &[(6, &b)])]);
        assert!(logged.iter().all(|t| t.blocks.iter().all(|e| e.data.is_some())));
        // Block 5 moves to bucket 2 unchanged: named only. Block 6 gets new (equal) contents
        // in a new buffer: logged again, since only the pointer is compared.
        let (logged, resolved) = commit(vec![bucket(0, 2, &[]), bucket(2, 1, &[(5, &a)])]);
        assert!(logged[1].blocks[0].data.is_none());
        assert_eq!(&resolved[1].blocks[0].2[..], &[1; 4]);
        let (logged, _) = commit(vec![bucket(1, 2, &[(6, &b2)])]);
        assert!(logged[0].blocks[0].data.is_some());
        assert_eq!((writer.len(), replay.len()), (2, 2));
    }

    #[test]
    fn a_block_that_left_the_logged_top_must_be_logged_again() {
        let a: Arc<[u8]> = vec![1; 4].into();
        let mut pool = TopPool::default();
        let first = vec![bucket(3, 1, &[(9, &a)])];
        pool.apply(&first);
        // Bucket 3 is logged without block 9 (it went down the tree, to the store).
        pool.apply(&[bucket(3, 2, &[])]);
        let again = pool.encode(&first);
        assert!(again[0].blocks[0].data.is_some(), "block 9 is no longer in the pool");
        // And a record naming it without contents is refused, not guessed.
        let named = vec![TopBucket {
            cell: 3,
            version: 3,
            blocks: vec![TopBlock { id: 9, leaf: 0, data: None }],
        }];
        assert!(pool.resolve(named, 4, 2).is_err());
    }

    #[test]
    fn oversized_buckets_and_blocks_are_refused() {
        let a: Arc<[u8]> = vec![1; 4].into();
        let pool = TopPool::default();
        let logged = pool.encode(&[bucket(0, 1, &[(1, &a), (2, &a), (3, &a)])]);
        assert!(pool.resolve(logged, 4, 2).unwrap_err().contains("holds 3 blocks"));
        let logged = pool.encode(&[bucket(0, 1, &[(1, &a)])]);
        assert!(pool.resolve(logged, 8, 2).unwrap_err().contains("of 4 bytes"));
    }
}
