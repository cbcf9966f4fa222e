//! The gateway's instructions to the trusted component, and their byte layouts.
//!
//! Both layouts are fixed, little-endian, and parsed strictly: every length is checked before
//! it is used, and a ticket whose fields do not fit together is refused. The bytes below are
//! the *plaintext* of a ticket; on the wire a ticket is sealed (see
//! [`TeeCipher::seal_query`](crate::TeeCipher::seal_query)).
//!
//! ```text
//! query ticket (32 + 32·c bytes)
//! offset 0        16          24           28       32
//!        | stream | query_id  | candidates | target | ad[0] … ad[c-1] |
//!          16 B     u64 LE      u32 LE       u32 LE   c × 32 B
//!
//! evict ticket (32 + 4·s bytes)
//! offset 0        16       24       28       32
//!        | stream | round  | layer  | s      | perm[0] … perm[s-1] |
//!          16 B     u64 LE   u32 LE   u32 LE   s × u32 LE
//! ```

use std::fmt;

use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::{TeeError, MAX_EVICT_BLOCKS};

/// Which candidate a query wants, and what every candidate must authenticate as.
///
/// Encoded (before sealing) as `32 + 32·c` bytes for `c` candidates:
///
/// ```text
/// offset 0        16          24           28       32
///        | stream | query_id  | candidates | target | ad[0] … ad[c-1] |
///          16 B     u64 LE      u32 LE       u32 LE   c × 32 B
/// ```
///
/// `query_id` is the ticket's number in its stream: the trusted component answers a ticket
/// only if its number is above every number it answered before on that stream, so a captured
/// ticket is answered at most once, and never after a later one. `ads` binds the ticket to
/// its candidates: the trusted component opens every candidate under its `ad` and answers only
/// if all of them authenticate, so a ticket handed other cells (to learn from the answer
/// whether one of them is the target) is refused whatever the target.
#[derive(Clone, PartialEq, Eq, Zeroize, ZeroizeOnDrop)]
pub struct QueryTicket {
    /// The gateway's stream the answer is bound to and the numbers are counted on.
    pub stream: [u8; 16],
    /// The query's number within the stream (strictly increasing); the answer is bound to it.
    pub query_id: u64,
    /// How many candidate cells the host hands in (at least 1, at most
    /// [`QueryTicket::MAX_CANDIDATES`]).
    pub candidates: u32,
    /// Index of the wanted candidate, `< candidates`. Secret.
    pub target: u32,
    /// The associated data each candidate's inner layer was sealed with, in order (one per
    /// candidate; `ads[target]` is the wanted block's). Secret.
    pub ads: Vec<[u8; 32]>,
}

impl fmt::Debug for QueryTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueryTicket")
            .field("stream", &hex::encode(self.stream))
            .field("query_id", &self.query_id)
            .field("candidates", &self.candidates)
            .field("target", &"<redacted>")
            .field("ads", &"<redacted>")
            .finish()
    }
}

impl QueryTicket {
    /// Length of the encoded ticket's fixed header.
    pub const HEADER_LEN: usize = 32;

    /// Most candidates of one query (a path through a tree of at most this many layers).
    pub const MAX_CANDIDATES: usize = 4096;

    /// Length of the encoded ticket for `candidates` candidates.
    pub fn encoded_len(candidates: usize) -> usize {
        Self::HEADER_LEN + 32 * candidates
    }

    /// Checks that the fields fit together: at least one and at most
    /// [`QueryTicket::MAX_CANDIDATES`] candidates, `target < candidates`, one `ad` per candidate.
    pub fn validate(&self) -> Result<(), TeeError> {
        if self.candidates == 0 {
            return Err(TeeError::malformed("query ticket", "no candidates"));
        }
        if self.candidates as usize > Self::MAX_CANDIDATES {
            return Err(TeeError::malformed(
                "query ticket",
                format!("{} candidates (at most {})", self.candidates, Self::MAX_CANDIDATES),
            ));
        }
        if self.target >= self.candidates {
            // Does not print the target: it is secret even when wrong.
            return Err(TeeError::malformed(
                "query ticket",
                format!("the target is not one of the {} candidates", self.candidates),
            ));
        }
        if self.ads.len() != self.candidates as usize {
            return Err(TeeError::malformed(
                "query ticket",
                format!("{} candidates but {} associated data", self.candidates, self.ads.len()),
            ));
        }
        Ok(())
    }

    /// The encoded ticket (see the module docs). Refuses a ticket that does not validate.
    pub fn to_bytes(&self) -> Result<Zeroizing<Vec<u8>>, TeeError> {
        self.validate()?;
        let mut out = Zeroizing::new(Vec::with_capacity(Self::encoded_len(self.ads.len())));
        out.extend_from_slice(&self.stream);
        out.extend_from_slice(&self.query_id.to_le_bytes());
        out.extend_from_slice(&self.candidates.to_le_bytes());
        out.extend_from_slice(&self.target.to_le_bytes());
        for ad in &self.ads {
            out.extend_from_slice(ad);
        }
        Ok(out)
    }

    /// Parses an encoded ticket: the header, then exactly one `ad` per candidate, validating.
    /// The count is checked against the length before anything is allocated for it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TeeError> {
        if bytes.len() < Self::HEADER_LEN {
            return Err(TeeError::malformed(
                "query ticket",
                format!("{} bytes, shorter than its {}-byte header", bytes.len(), Self::HEADER_LEN),
            ));
        }
        let candidates = u32::from_le_bytes(array(&bytes[24..28]));
        let c = candidates as usize;
        if c > Self::MAX_CANDIDATES || bytes.len() != Self::encoded_len(c) {
            return Err(TeeError::malformed(
                "query ticket",
                format!(
                    "{} bytes for {candidates} candidates (expected {}, at most {} candidates)",
                    bytes.len(),
                    Self::encoded_len(c.min(Self::MAX_CANDIDATES)),
                    Self::MAX_CANDIDATES
                ),
            ));
        }
        let t = Self {
            stream: array(&bytes[..16]),
            query_id: u64::from_le_bytes(array(&bytes[16..24])),
            candidates,
            target: u32::from_le_bytes(array(&bytes[28..32])),
            ads: bytes[Self::HEADER_LEN..].chunks_exact(32).map(array::<32>).collect(),
        };
        t.validate()?;
        Ok(t)
    }
}

/// One layer's permutation in an eviction round.
///
/// Encoded (before sealing) as `32 + 4·s` bytes; parsing checks `s <= MAX_EVICT_BLOCKS`, the
/// exact length and that `perm` is a permutation:
///
/// ```text
/// offset 0        16       24       28       32
///        | stream | round  | layer  | s      | perm[0] … perm[s-1] |
///          16 B     u64 LE   u32 LE   u32 LE   s × u32 LE
/// ```
#[derive(Clone, PartialEq, Eq, Zeroize, ZeroizeOnDrop)]
pub struct EvictTicket {
    /// The gateway's stream; replay is checked per stream.
    pub stream: [u8; 16],
    /// The eviction round; with `layer`, must increase strictly within a stream.
    pub round: u64,
    /// The layer within the round.
    pub layer: u32,
    /// The block at position `j` moves to position `perm[j]`; a permutation of `0..s` with
    /// `s <= MAX_EVICT_BLOCKS`. Secret.
    pub perm: Vec<u32>,
}

impl fmt::Debug for EvictTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EvictTicket")
            .field("stream", &hex::encode(self.stream))
            .field("round", &self.round)
            .field("layer", &self.layer)
            .field("blocks", &self.perm.len())
            .field("perm", &"<redacted>")
            .finish()
    }
}

impl EvictTicket {
    /// Length of the encoded ticket's fixed header.
    pub const HEADER_LEN: usize = 32;

    /// Length of the encoded ticket for `s` blocks.
    pub fn encoded_len(s: usize) -> usize {
        Self::HEADER_LEN + 4 * s
    }

    /// Checks that `perm` is a permutation of `0..s` with `s <= MAX_EVICT_BLOCKS`.
    pub fn validate(&self) -> Result<(), TeeError> {
        check_permutation(&self.perm)
    }

    /// The encoded ticket (see the module docs). Refuses a ticket that does not validate.
    pub fn to_bytes(&self) -> Result<Zeroizing<Vec<u8>>, TeeError> {
        self.validate()?;
        let mut out = Zeroizing::new(Vec::with_capacity(Self::encoded_len(self.perm.len())));
        out.extend_from_slice(&self.stream);
        out.extend_from_slice(&self.round.to_le_bytes());
        out.extend_from_slice(&self.layer.to_le_bytes());
        out.extend_from_slice(&(self.perm.len() as u32).to_le_bytes());
        for p in &self.perm {
            out.extend_from_slice(&p.to_le_bytes());
        }
        Ok(out)
    }

    /// Parses an encoded ticket: the header, then exactly `s` entries, forming a permutation.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TeeError> {
        if bytes.len() < Self::HEADER_LEN {
            return Err(TeeError::malformed(
                "evict ticket",
                format!("{} bytes, shorter than its {}-byte header", bytes.len(), Self::HEADER_LEN),
            ));
        }
        let s = u32::from_le_bytes(array(&bytes[28..32])) as usize;
        if s > MAX_EVICT_BLOCKS {
            return Err(TeeError::TooManyBlocks { blocks: s, max: MAX_EVICT_BLOCKS });
        }
        if bytes.len() != Self::encoded_len(s) {
            return Err(TeeError::malformed(
                "evict ticket",
                format!("{} bytes, expected {} for {s} blocks", bytes.len(), Self::encoded_len(s)),
            ));
        }
        let t = Self {
            stream: array(&bytes[..16]),
            round: u64::from_le_bytes(array(&bytes[16..24])),
            layer: u32::from_le_bytes(array(&bytes[24..28])),
            perm: bytes[Self::HEADER_LEN..]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(array(c)))
                .collect(),
        };
        t.validate()?;
        Ok(t)
    }
}

/// A set of up to [`MAX_EVICT_BLOCKS`] indices in 1 KiB, aligned so that it lies in one 4 KiB
/// page: marking `perm[j]` then touches the same page whatever `perm[j]` is.
#[repr(C, align(1024))]
struct IndexSet([u64; MAX_EVICT_BLOCKS / 64]);

/// Refuses anything but a permutation of `0..perm.len()` with at most [`MAX_EVICT_BLOCKS`]
/// entries. The error does not say which entry is wrong (the permutation is secret).
pub(crate) fn check_permutation(perm: &[u32]) -> Result<(), TeeError> {
    let s = perm.len();
    if s > MAX_EVICT_BLOCKS {
        return Err(TeeError::TooManyBlocks { blocks: s, max: MAX_EVICT_BLOCKS });
    }
    let mut seen = IndexSet([0; MAX_EVICT_BLOCKS / 64]);
    // Accumulate instead of returning early, so the time does not say where the fault is.
    let mut ok = true;
    for &p in perm {
        let p = p as usize;
        let in_range = p < s;
        let p = if in_range { p } else { 0 };
        let (word, bit) = (p / 64, 1u64 << (p % 64));
        ok &= in_range & (seen.0[word] & bit == 0);
        seen.0[word] |= bit;
    }
    seen.0.zeroize();
    if ok {
        Ok(())
    } else {
        Err(TeeError::malformed("evict ticket", format!("perm is not a permutation of 0..{s}")))
    }
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    b.try_into().expect("caller slices exactly N bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query() -> QueryTicket {
        QueryTicket {
            stream: [3; 16],
            query_id: 0x0102_0304_0506_0708,
            candidates: 5,
            target: 4,
            ads: (0..5).map(|i| [9 + i; 32]).collect(),
        }
    }

    #[test]
    fn query_ticket_layout_round_trips() {
        let t = query();
        let b = t.to_bytes().unwrap();
        assert_eq!(b.len(), 32 + 5 * 32);
        assert_eq!(&b[16..24], &[8, 7, 6, 5, 4, 3, 2, 1], "little endian");
        assert_eq!(&b[24..32], &[5, 0, 0, 0, 4, 0, 0, 0]);
        assert_eq!(&b[32..64], &[9; 32]);
        assert_eq!(&b[160..], &[13; 32]);
        assert_eq!(QueryTicket::from_bytes(&b[..]).unwrap(), t);
        assert!(QueryTicket::from_bytes(&b[..b.len() - 1]).is_err());
        let mut long = b.to_vec();
        long.push(0);
        assert!(QueryTicket::from_bytes(&long).is_err());
        // One ad short of the count, and a count that asks for more than the limit.
        assert!(QueryTicket { ads: vec![[0; 32]; 4], ..query() }.to_bytes().is_err());
        let mut huge = b[..32].to_vec();
        huge[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(QueryTicket::from_bytes(&huge).is_err());
    }

    #[test]
    fn query_ticket_target_must_be_a_candidate() {
        for (candidates, target) in [(0, 0), (5, 5), (5, u32::MAX)] {
            let t = QueryTicket { candidates, target, ads: query().ads.clone(), ..query() };
            assert!(t.to_bytes().is_err());
            let mut b = query().to_bytes().unwrap();
            b[24..28].copy_from_slice(&candidates.to_le_bytes());
            b[28..32].copy_from_slice(&target.to_le_bytes());
            let err = QueryTicket::from_bytes(&b).unwrap_err().to_string();
            assert!(!err.contains(&target.to_string()) || candidates == target, "{err}");
        }
    }

    #[test]
    fn evict_ticket_layout_round_trips() {
        let t = EvictTicket { stream: [1; 16], round: 7, layer: 2, perm: vec![2, 0, 1] };
        let b = t.to_bytes().unwrap();
        assert_eq!(b.len(), 44);
        assert_eq!(&b[28..32], &[3, 0, 0, 0]);
        assert_eq!(&b[32..], &[2, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(EvictTicket::from_bytes(&b).unwrap(), t);
        assert!(EvictTicket::from_bytes(&b[..43]).is_err());
        let mut long = b.to_vec();
        long.extend_from_slice(&[0; 4]);
        assert!(EvictTicket::from_bytes(&long).is_err(), "entries beyond s");
        let empty = EvictTicket { perm: vec![], ..t.clone() };
        assert_eq!(EvictTicket::from_bytes(&empty.to_bytes().unwrap()).unwrap(), empty);
    }

    #[test]
    fn only_permutations_are_accepted() {
        for bad in [vec![0, 0], vec![1, 2], vec![0, 1, 3], vec![u32::MAX], vec![1, 1, 0]] {
            assert!(check_permutation(&bad).is_err(), "{bad:?}");
            let t = EvictTicket { stream: [0; 16], round: 0, layer: 0, perm: bad };
            assert!(t.to_bytes().is_err());
        }
        let mut b = EvictTicket { stream: [0; 16], round: 0, layer: 0, perm: vec![1, 0] }
            .to_bytes()
            .unwrap();
        b[32] = 0; // perm = [0, 0]
        assert!(EvictTicket::from_bytes(&b).is_err());
        let full: Vec<u32> = (0..MAX_EVICT_BLOCKS as u32).rev().collect();
        assert!(check_permutation(&full).is_ok());
        let over: Vec<u32> = (0..=MAX_EVICT_BLOCKS as u32).collect();
        assert!(matches!(check_permutation(&over), Err(TeeError::TooManyBlocks { .. })));
    }

    #[test]
    fn oversized_counts_are_refused_before_allocating() {
        let mut b = [0u8; 32];
        b[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(EvictTicket::from_bytes(&b), Err(TeeError::TooManyBlocks { .. })));
    }

    #[test]
    fn debug_hides_secrets() {
        let d = format!("{:?}", query());
        assert!(d.contains("<redacted>") && !d.contains("target: 4"), "{d}");
        let t = EvictTicket { stream: [1; 16], round: 7, layer: 2, perm: vec![2, 0, 1] };
        assert!(!format!("{t:?}").contains("[2, 0, 1]"));
    }
}
