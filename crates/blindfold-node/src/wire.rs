//! What travels between the balancer and a node: one protobuf message, [`Frame`], whose single
//! `bytes` field holds a fixed-layout body (little-endian integers, whole blocks).
//!
//! Protobuf leaves out fields equal to their default and writes integers as varints, so a
//! message of several typed fields would change size with its values. One `bytes` field of a
//! length fixed by the layout keeps every request and reply for `r` block reads and `w` block
//! writes at a size that depends only on `r`, `w` and the block size:
//!
//! ```text
//! Info     request  (empty)
//!          reply    "BFN1" | node id (16) | blocks u64 | block size u32 | instance u64   40 bytes
//! Access   request  r u32 | w u32 | r × local id u64 | w × (local id u64 | block)
//!          reply    instance u64 | r × block                        (reads in request order)
//! Commit   request  (empty)
//!          reply    instance u64
//! Verify   request  (empty)
//!          reply    cells checked u64 | never written u64 | n u32 | n × (cell u64 | len u16 | text)
//! Grow     request  blocks u64                                              8 bytes
//!          reply    as Info (the node's blocks after the growth)
//! ```
//!
//! Every decoder checks the exact length before it allocates, so a hostile peer gets an error,
//! never a panic or an allocation larger than what it sent.

use crate::NodeError;

/// The one message of the node service.
#[derive(Clone, PartialEq, prost::Message)]
#[prost(skip_debug)]
pub struct Frame {
    /// The fixed-layout body (see the module documentation).
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Bodies carry plaintext blocks: never printed.
        f.debug_struct("Frame").field("len", &self.body.len()).finish()
    }
}

impl Frame {
    /// A frame with `body`.
    pub fn new(body: Vec<u8>) -> Self {
        Self { body }
    }
}

/// Most block reads plus writes in one Access request; larger batches are split.
pub const MAX_BLOCKS_PER_RPC: usize = 1024;

/// Largest block a node serves (1 MiB).
pub const MAX_BLOCK_SIZE: usize = 1 << 20;

/// The largest encoded message (request or reply) for blocks of `block_size` bytes, with room
/// for the protobuf and gRPC framing: what both ends accept.
pub fn max_message(block_size: usize) -> usize {
    8 + MAX_BLOCKS_PER_RPC * (8 + block_size) + 64
}

const INFO_MAGIC: &[u8; 4] = b"BFN1";

/// What a node says about itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's store id: fixed when its data directory was made, so a balancer recognises
    /// the node behind an address.
    pub id: [u8; 16],
    /// Logical blocks of the node's engine (local ids `0..blocks`).
    pub blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Random, fixed for the life of the node process: a different value means the node
    /// restarted (and lost what it had not committed).
    pub instance: u64,
}

impl NodeInfo {
    /// The Info reply.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(40);
        b.extend_from_slice(INFO_MAGIC);
        b.extend_from_slice(&self.id);
        b.extend_from_slice(&self.blocks.to_le_bytes());
        b.extend_from_slice(&self.block_size.to_le_bytes());
        b.extend_from_slice(&self.instance.to_le_bytes());
        b
    }

    /// Decodes an Info reply.
    pub fn decode(b: &[u8]) -> Result<Self, NodeError> {
        if b.len() != 40 || &b[..4] != INFO_MAGIC {
            return Err(NodeError::Wire(format!(
                "not a blindfold node's info reply ({} bytes)",
                b.len()
            )));
        }
        let info = Self {
            id: b[4..20].try_into().expect("16 bytes"),
            blocks: u64_at(b, 20),
            block_size: u32::from_le_bytes(b[28..32].try_into().expect("4 bytes")),
            instance: u64_at(b, 32),
        };
        if info.blocks < 2 || info.block_size == 0 || info.block_size as usize > MAX_BLOCK_SIZE {
            return Err(NodeError::Wire(format!(
                "the node reports {} blocks of {} bytes",
                info.blocks, info.block_size
            )));
        }
        Ok(info)
    }
}

/// A Grow request body: the number of local ids the node is to hold at least.
pub fn encode_grow(blocks: u64) -> Vec<u8> {
    blocks.to_le_bytes().to_vec()
}

/// Decodes a Grow request body.
pub fn decode_grow(b: &[u8]) -> Result<u64, NodeError> {
    if b.len() != 8 {
        return Err(NodeError::Wire(format!("a grow request is 8 bytes, not {}", b.len())));
    }
    Ok(u64_at(b, 0))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Bytes of an Access request body with `reads` reads and `writes` writes.
pub fn access_len(reads: usize, writes: usize, block_size: usize) -> usize {
    8 + 8 * reads + writes * (8 + block_size)
}

/// An Access request: the local ids to read, then the local ids to write with their blocks.
#[derive(Clone, PartialEq, Eq)]
pub struct Access {
    /// Local ids to read, in order.
    pub reads: Vec<u64>,
    /// Local ids to write and their blocks, in order.
    pub writes: Vec<(u64, Vec<u8>)>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("reads", &self.reads.len())
            .field("writes", &self.writes.len())
            .finish()
    }
}

impl Access {
    /// The request body; every block must be `block_size` bytes.
    pub fn encode(&self, block_size: usize) -> Vec<u8> {
        let mut b = Vec::with_capacity(access_len(self.reads.len(), self.writes.len(), block_size));
        b.extend_from_slice(&(self.reads.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.writes.len() as u32).to_le_bytes());
        for id in &self.reads {
            b.extend_from_slice(&id.to_le_bytes());
        }
        for (id, block) in &self.writes {
            debug_assert_eq!(block.len(), block_size);
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(block);
        }
        b
    }

    /// Decodes a request body for a node of `blocks` blocks of `block_size` bytes: the length
    /// must be exactly what its counts say, the counts at most [`MAX_BLOCKS_PER_RPC`], every
    /// local id below `blocks`, and no id named twice among the reads or among the writes (the
    /// node runs each list as one engine batch of distinct blocks).
    pub fn decode(b: &[u8], blocks: u64, block_size: usize) -> Result<Self, NodeError> {
        if b.len() < 8 {
            return Err(NodeError::Wire(format!(
                "an access request of {} bytes is shorter than its 8-byte header",
                b.len()
            )));
        }
        let reads = u32::from_le_bytes(b[..4].try_into().expect("4 bytes")) as usize;
        let writes = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
        if reads.saturating_add(writes) > MAX_BLOCKS_PER_RPC {
            return Err(NodeError::Wire(format!(
                "an access request for {reads} reads and {writes} writes exceeds the limit of \
                 {MAX_BLOCKS_PER_RPC} blocks"
            )));
        }
        let want = access_len(reads, writes, block_size);
        if b.len() != want {
            return Err(NodeError::Wire(format!(
                "an access request for {reads} reads and {writes} writes of {block_size}-byte \
                 blocks takes {want} bytes, not {}",
                b.len()
            )));
        }
        let check = |id: u64| {
            if id >= blocks {
                Err(NodeError::Wire(format!("local id {id} is beyond the node's {blocks} blocks")))
            } else {
                Ok(id)
            }
        };
        let twice = |ids: &mut Vec<u64>, what: &str| {
            ids.sort_unstable();
            match ids.windows(2).find(|p| p[0] == p[1]) {
                Some(p) => Err(NodeError::Wire(format!(
                    "an access request names local id {} twice among its {what}",
                    p[0]
                ))),
                None => Ok(()),
            }
        };
        let mut at = 8;
        let mut r = Vec::with_capacity(reads);
        for _ in 0..reads {
            r.push(check(u64_at(b, at))?);
            at += 8;
        }
        twice(&mut r.clone(), "reads")?;
        let mut w = Vec::with_capacity(writes);
        let mut ids = Vec::with_capacity(writes);
        for _ in 0..writes {
            let id = check(u64_at(b, at))?;
            ids.push(id);
            w.push((id, b[at + 8..at + 8 + block_size].to_vec()));
            at += 8 + block_size;
        }
        twice(&mut ids, "writes")?;
        Ok(Self { reads: r, writes: w })
    }
}

/// Splits an Access reply into the node's instance and `reads` blocks of `block_size` bytes.
pub fn decode_blocks(
    b: &[u8],
    reads: usize,
    block_size: usize,
) -> Result<(u64, Vec<Vec<u8>>), NodeError> {
    if b.len() != 8 + reads * block_size {
        return Err(NodeError::Wire(format!(
            "an access reply for {reads} reads of {block_size}-byte blocks has {} bytes",
            b.len()
        )));
    }
    Ok((u64_at(b, 0), b[8..].chunks_exact(block_size.max(1)).map(<[u8]>::to_vec).collect()))
}

/// Decodes a Commit reply: the node's instance.
pub fn decode_instance(b: &[u8]) -> Result<u64, NodeError> {
    if b.len() != 8 {
        return Err(NodeError::Wire(format!("a commit reply of {} bytes, not 8", b.len())));
    }
    Ok(u64_at(b, 0))
}

/// Most failures a Verify reply lists (the count is complete, the list is cut).
pub const MAX_VERIFY_FAILURES: usize = 1000;

/// Encodes a Verify reply.
pub fn encode_verify(r: &blindfold_proxy::VerifyReport) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&r.cells_checked.to_le_bytes());
    b.extend_from_slice(&r.never_written.to_le_bytes());
    let listed = &r.failures[..r.failures.len().min(MAX_VERIFY_FAILURES)];
    b.extend_from_slice(&(listed.len() as u32).to_le_bytes());
    for (cell, text) in listed {
        let text = &text.as_bytes()[..text.len().min(200)];
        b.extend_from_slice(&cell.to_le_bytes());
        b.extend_from_slice(&(text.len() as u16).to_le_bytes());
        b.extend_from_slice(text);
    }
    b
}

/// Decodes a Verify reply.
pub fn decode_verify(b: &[u8]) -> Result<blindfold_proxy::VerifyReport, NodeError> {
    let bad = || NodeError::Wire("a malformed verify reply".into());
    if b.len() < 20 {
        return Err(bad());
    }
    let n = u32::from_le_bytes(b[16..20].try_into().expect("4 bytes")) as usize;
    // Each failure takes at least 10 bytes: a count the body cannot hold is refused before
    // anything is allocated for it.
    if n > MAX_VERIFY_FAILURES || n * 10 > b.len() - 20 {
        return Err(bad());
    }
    let mut failures = Vec::with_capacity(n);
    let mut at = 20;
    for _ in 0..n {
        let head = b.get(at..at + 10).ok_or_else(bad)?;
        let cell = u64_at(head, 0);
        let len = u16::from_le_bytes(head[8..10].try_into().expect("2 bytes")) as usize;
        let text = b.get(at + 10..at + 10 + len).ok_or_else(bad)?;
        failures.push((cell, String::from_utf8_lossy(text).into_owned()));
        at += 10 + len;
    }
    if at != b.len() {
        return Err(bad());
    }
    Ok(blindfold_proxy::VerifyReport {
        cells_checked: u64_at(b, 0),
        never_written: u64_at(b, 8),
        failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_requests_round_trip_and_have_a_size_fixed_by_their_counts() {
        let a = Access { reads: vec![3, 0], writes: vec![(1, vec![7; 16])] };
        let b = a.encode(16);
        assert_eq!(b.len(), access_len(2, 1, 16));
        assert_eq!(Access::decode(&b, 4, 16).unwrap(), a);
        let other = Access { reads: vec![1, 0], writes: vec![(0, vec![0; 16])] }.encode(16);
        assert_eq!(other.len(), b.len());
    }

    #[test]
    fn hostile_access_requests_are_refused() {
        let good = Access { reads: vec![1], writes: vec![(2, vec![1; 16])] }.encode(16);
        assert!(Access::decode(&good[..good.len() - 1], 4, 16).is_err());
        assert!(Access::decode(&[good.clone(), vec![0]].concat(), 4, 16).is_err());
        assert!(Access::decode(&good, 2, 16).is_err(), "local id beyond the node");
        assert!(Access::decode(&good, 4, 32).is_err(), "wrong block size");
        assert!(Access::decode(&[1, 2, 3], 4, 16).is_err());
        let mut huge = vec![0u8; 8];
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Access::decode(&huge, 4, 16).is_err());
        // An id twice among the reads, or among the writes (once in each list is fine).
        for (reads, writes) in
            [(vec![1, 1], vec![]), (vec![], vec![2, 2]), (vec![3, 0, 3], vec![0])]
        {
            let a =
                Access { reads, writes: writes.into_iter().map(|i| (i, vec![0; 16])).collect() };
            let e = Access::decode(&a.encode(16), 4, 16).unwrap_err().to_string();
            assert!(e.contains("twice"), "{e}");
        }
        let both = Access { reads: vec![1], writes: vec![(1, vec![0; 16])] };
        assert_eq!(Access::decode(&both.encode(16), 4, 16).unwrap(), both);
    }

    #[test]
    fn info_and_verify_round_trip() {
        let i = NodeInfo { id: [5; 16], blocks: 9, block_size: 64, instance: 77 };
        assert_eq!(NodeInfo::decode(&i.encode()).unwrap(), i);
        assert!(NodeInfo::decode(&i.encode()[1..]).is_err());
        let r = blindfold_proxy::VerifyReport {
            cells_checked: 10,
            never_written: 2,
            failures: vec![(4, "bad".into())],
        };
        let back = decode_verify(&encode_verify(&r)).unwrap();
        assert_eq!((back.cells_checked, back.never_written, back.failures), (10, 2, r.failures));
        assert!(decode_verify(&[0; 19]).is_err());
    }
}
