//! [`Enclave`]: the trusted component's two entry points, `query` and `evict`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use subtle::{ConditionallySelectable, ConstantTimeEq};
use zeroize::Zeroizing;

use crate::cipher::{fill_random, PIECE};
use crate::pages::Pages;
use crate::sha::{xor_piece, Midstate, Tail};
use crate::trace::{Access, Area, Tracer};
use crate::{TeeCipher, TeeError, TeeKey};

/// Most blocks one `evict` call permutes: a 4 KiB page holds 8192 nibbles.
pub const MAX_EVICT_BLOCKS: usize = 8192;

/// Most streams whose last eviction, and most streams whose last query, the replay tables
/// remember.
pub const MAX_STREAMS: usize = 4096;

/// The trusted component: selects query targets obliviously and permutes and re-encrypts
/// blocks during eviction. See the crate docs for the interface, the formats and the security
/// argument.
///
/// No I/O; the only state kept between calls is the replay tables: the last `(round, layer)`
/// accepted per eviction stream and the last query number answered per query stream, at most
/// [`MAX_STREAMS`] streams each. Memory allocated by a call is a constant (the 768 KiB of
/// eviction pages) plus an amount proportional to its inputs.
pub struct Enclave {
    cipher: TeeCipher,
    replay: Mutex<HashMap<[u8; 16], (u64, u32)>>,
    queries: Mutex<HashMap<[u8; 16], u64>>,
}

impl fmt::Debug for Enclave {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let streams = self.replay.lock().map(|m| m.len()).unwrap_or(0);
        f.debug_struct("Enclave").field("cipher", &self.cipher).field("streams", &streams).finish()
    }
}

impl Enclave {
    /// The trusted component for blocks of `block_size` bytes under `key`.
    ///
    /// # Panics
    ///
    /// As [`TeeCipher::new`].
    pub fn new(key: &TeeKey, block_size: usize) -> Self {
        Self {
            cipher: TeeCipher::new(key, block_size),
            replay: Mutex::new(HashMap::new()),
            queries: Mutex::new(HashMap::new()),
        }
    }

    /// Length of the plaintext blocks.
    pub fn block_size(&self) -> usize {
        self.cipher.block_size()
    }

    /// Length of the cells this enclave reads.
    pub fn cell_len(&self) -> usize {
        self.cipher.cell_len()
    }

    /// The paper's `enclave_query`: strips both layers of every candidate, checking each
    /// against its `ad` in the sealed query `ticket`, selects candidate `target` obliviously and
    /// returns the block sealed for the gateway, bound to the ticket's `(stream, query_id)`.
    ///
    /// A ticket is answered at most once, and only if its `query_id` is above every number
    /// answered before on its stream: a replayed or reordered ticket is refused. A ticket
    /// handed cells other than those it was made for is refused whatever its target (every
    /// candidate must open under its own `ad`), so the answer cannot tell the host which cell
    /// was wanted.
    ///
    /// # Errors
    ///
    /// [`TeeError::Integrity`] if the ticket or any candidate fails authentication,
    /// [`TeeError::QueryReplay`] for a ticket whose number is not above the last answered on its
    /// stream, [`TeeError::Malformed`] if the candidates do not match the ticket's count or a
    /// cell has the wrong length, [`TeeError::TooManyStreams`] if the query table is full. A
    /// ticket refused for its shape or number is not consumed; one whose candidates fail
    /// authentication is.
    pub fn query(&self, candidates: &[Vec<u8>], ticket: &[u8]) -> Result<Vec<u8>, TeeError> {
        self.query_with(candidates, ticket, &mut |_: Access| {})
    }

    /// [`Enclave::query`], reporting every access to `trace` (instrumentation for tests).
    pub fn query_traced(
        &self,
        candidates: &[Vec<u8>],
        ticket: &[u8],
        trace: &mut dyn FnMut(Access),
    ) -> Result<Vec<u8>, TeeError> {
        self.query_with(candidates, ticket, trace)
    }

    fn query_with<T: Tracer + ?Sized>(
        &self,
        candidates: &[Vec<u8>],
        ticket: &[u8],
        t: &mut T,
    ) -> Result<Vec<u8>, TeeError> {
        let ticket = self.cipher.open_query(ticket)?;
        if candidates.len() != ticket.candidates as usize {
            return Err(TeeError::malformed(
                "query call",
                format!(
                    "the ticket names {} candidates, {} were handed in",
                    ticket.candidates,
                    candidates.len()
                ),
            ));
        }
        for (i, c) in candidates.iter().enumerate() {
            self.cipher.check_cell_len(c, Some(i))?;
        }
        self.accept_query(&ticket.stream, ticket.query_id)?;
        // Every candidate is opened under its own ad, in order, and its plaintext passed
        // through the one-block buffer with a constant-time select: every piece of every
        // candidate is read, and every piece of the buffer read and written, in the same
        // order whatever the target. Whether a candidate opens depends only on the cells the
        // host handed in, never on the target.
        let mut scratch = Zeroizing::new(vec![0u8; self.cipher.cell_len()]);
        let mut buf = Zeroizing::new(vec![0u8; self.cipher.block_size()]);
        let zeros = Zeroizing::new(vec![0u8; self.cipher.block_size()]);
        let mut all_open = true;
        for (c, (cell, ad)) in candidates.iter().zip(&ticket.ads).enumerate() {
            let chosen = (c as u32).ct_eq(&ticket.target);
            for i in 0..self.cipher.pieces() {
                t.record(Access::Cell { cell: c as u32, piece: i as u32, write: false });
            }
            scratch.copy_from_slice(cell);
            let opened = self.cipher.open_in_place(ad, &mut scratch[..], "a candidate");
            all_open &= opened.is_ok();
            let block: &[u8] = match &opened {
                Ok(b) => b,
                Err(_) => &zeros[..],
            };
            for (i, (dst, src)) in buf.chunks_mut(PIECE).zip(block.chunks(PIECE)).enumerate() {
                t.record(Access::Buffer { piece: i as u32, write: false });
                select_piece(dst, src, chosen);
                t.record(Access::Buffer { piece: i as u32, write: true });
            }
        }
        if !all_open {
            return Err(TeeError::Integrity {
                what: "a candidate failed authentication (modified, swapped, rolled back, or not \
                       a cell the ticket was made for)",
            });
        }
        self.cipher.seal_answer(&ticket.stream, ticket.query_id, &buf)
    }

    /// The query replay check: answers `query_id` on `stream` only if it is above the last
    /// answered there, and remembers it.
    fn accept_query(&self, stream: &[u8; 16], query_id: u64) -> Result<(), TeeError> {
        let mut table = self.queries.lock().unwrap_or_else(|e| e.into_inner());
        let table_len = table.len();
        match table.get_mut(stream) {
            Some(last) if query_id <= *last => Err(TeeError::QueryReplay { query_id, last: *last }),
            Some(last) => {
                *last = query_id;
                Ok(())
            }
            None if table_len >= MAX_STREAMS => Err(TeeError::TooManyStreams { max: MAX_STREAMS }),
            None => {
                table.insert(*stream, query_id);
                Ok(())
            }
        }
    }

    /// The paper's `evict`: moves the block at position `j` of `blocks` to position `perm[j]`
    /// of the sealed eviction `ticket`, giving every block a fresh random vector (outer layer
    /// re-encrypted; the inner layer is untouched), in place.
    ///
    /// # Errors
    ///
    /// [`TeeError::Integrity`] for a ticket that fails authentication, [`TeeError::Replay`]
    /// for one not newer than the last accepted on its stream, [`TeeError::TooManyBlocks`] for
    /// more than [`MAX_EVICT_BLOCKS`] blocks, [`TeeError::Malformed`] if the ticket's
    /// permutation does not have one entry per block or a cell has the wrong length,
    /// [`TeeError::TooManyStreams`] if the replay table is full. On error `blocks` is
    /// unchanged and the ticket is not consumed (except for [`TeeError::Rng`], never reached
    /// after the replay check).
    pub fn evict(&self, blocks: &mut [Vec<u8>], ticket: &[u8]) -> Result<(), TeeError> {
        self.evict_with(blocks, ticket, &mut |_: Access| {}, true)
    }

    /// [`Enclave::evict`], reporting every access to `trace` (instrumentation for tests).
    pub fn evict_traced(
        &self,
        blocks: &mut [Vec<u8>],
        ticket: &[u8],
        trace: &mut dyn FnMut(Access),
    ) -> Result<(), TeeError> {
        self.evict_with(blocks, ticket, trace, false)
    }

    fn evict_with<T: Tracer + ?Sized>(
        &self,
        blocks: &mut [Vec<u8>],
        ticket: &[u8],
        t: &mut T,
        parallel: bool,
    ) -> Result<(), TeeError> {
        let ticket = self.cipher.open_evict(ticket)?;
        let s = blocks.len();
        if s > MAX_EVICT_BLOCKS {
            return Err(TeeError::TooManyBlocks { blocks: s, max: MAX_EVICT_BLOCKS });
        }
        if ticket.perm.len() != s {
            return Err(TeeError::malformed(
                "evict call",
                format!("the ticket permutes {} blocks, {s} were handed in", ticket.perm.len()),
            ));
        }
        for (i, b) in blocks.iter().enumerate() {
            self.cipher.check_cell_len(b, Some(i))?;
        }
        let mut fresh = Zeroizing::new(vec![0u8; PIECE * s]);
        fill_random(&mut fresh)?;
        self.accept(&ticket.stream, ticket.round, ticket.layer)?;
        self.permute(blocks, &ticket.perm, &fresh, t, parallel);
        Ok(())
    }

    /// The replay check: accepts `(round, layer)` on `stream` only if it is strictly after the
    /// last accepted one, and remembers it.
    fn accept(&self, stream: &[u8; 16], round: u64, layer: u32) -> Result<(), TeeError> {
        // A panic while holding the lock leaves the table consistent (one insert or update).
        let mut table = self.replay.lock().unwrap_or_else(|e| e.into_inner());
        let table_len = table.len();
        match table.get_mut(stream) {
            Some(last) if (round, layer) <= *last => {
                Err(TeeError::Replay { round, layer, last_round: last.0, last_layer: last.1 })
            }
            Some(last) => {
                *last = (round, layer);
                Ok(())
            }
            None if table_len >= MAX_STREAMS => Err(TeeError::TooManyStreams { max: MAX_STREAMS }),
            None => {
                table.insert(*stream, (round, layer));
                Ok(())
            }
        }
    }

    /// The oblivious piece-wise permutation and re-encryption (all inputs checked).
    ///
    /// Secret-dependent addresses are only `perm[b]` inside a page of NRVP and PIECE; every
    /// other index is a loop counter, so the sequence of pages and cell pieces touched depends
    /// on `s` and the cell length alone.
    fn permute<T: Tracer + ?Sized>(
        &self,
        blocks: &mut [Vec<u8>],
        perm: &[u32],
        fresh: &[u8],
        t: &mut T,
        parallel: bool,
    ) {
        let s = blocks.len();
        if s == 0 {
            return;
        }
        let k_xor = self.cipher.k_xor();
        let mut orvp = Pages::new(Area::Orvp, s);
        let mut nrvp = Pages::new(Area::Nrvp, s);

        // Old random vectors into ORVP, in position order.
        for (b, cell) in blocks.iter().enumerate() {
            t.record(Access::Cell { cell: b as u32, piece: 0, write: false });
            orvp.scatter(b, cell[..PIECE].try_into().expect("32 bytes"), t);
        }
        // New random vectors into NRVP, and out as piece 0 of every output position.
        for (k, (cell, v)) in blocks.iter_mut().zip(fresh.chunks_exact(PIECE)).enumerate() {
            let v: &[u8; 32] = v.try_into().expect("32 bytes");
            nrvp.scatter(k, v, t);
            cell[..PIECE].copy_from_slice(v);
            t.record(Access::Cell { cell: k as u32, piece: 0, write: true });
        }
        // For every source position b: the midstate of its old vector and of the new vector of
        // its destination perm[b] (gathered through every page of NRVP).
        let mut old = Zeroizing::new(Vec::with_capacity(s));
        let mut new = Zeroizing::new(Vec::with_capacity(s));
        for (b, &dest) in perm.iter().enumerate() {
            let r_old = Zeroizing::new(orvp.gather(b, t));
            old.push(Midstate::new(k_xor, &r_old));
            let r_new = Zeroizing::new(nrvp.gather(dest as usize, t));
            new.push(Midstate::new(k_xor, &r_new));
        }
        // Pieces 1.. of every block: re-encrypted and moved to their destination through PIECE.
        let pieces = self.cipher.pieces();
        let threads = if parallel {
            std::thread::available_parallelism().map_or(1, |n| n.get()).min(4).min(pieces - 1)
        } else {
            1
        }
        .max(1);
        // The pieces are independent: with several threads each takes a run of them, with
        // PIECE pages of its own, and does exactly what one thread does for its pieces (so the
        // page accesses of each thread follow the same public sequence).
        let per = (pieces - 1).div_ceil(threads);
        let mut runs: Vec<Vec<&mut [u8]>> = (0..threads).map(|_| Vec::with_capacity(s)).collect();
        for cell in blocks.iter_mut() {
            let mut rest: &mut [u8] = &mut cell[PIECE..pieces * PIECE];
            for run in runs.iter_mut() {
                let take = (per * PIECE).min(rest.len());
                let (mine, others) = std::mem::take(&mut rest).split_at_mut(take);
                run.push(mine);
                rest = others;
            }
        }
        if threads == 1 {
            let run = runs.pop().expect("one run");
            reencrypt_run(run, 1, perm, &old[..], &new[..], t);
            return;
        }
        let (old, new) = (&old[..], &new[..]);
        std::thread::scope(|scope| {
            for (r, cells) in runs.into_iter().enumerate() {
                scope.spawn(move || {
                    reencrypt_run(cells, 1 + r * per, perm, old, new, &mut |_: Access| {})
                });
            }
        });
    }
}

/// Re-encrypts a run of pieces of every block — `cells[b]` holds pieces `first..` of block `b`
/// — and moves each to position `perm[b]`: piece by piece, every block's piece is stripped of
/// the old vector's keystream, given the new one's and scattered to its destination in PIECE;
/// then PIECE is copied out in position order. (Two pieces per pass, with two PIECE
/// structures, was measured 10 % slower.)
fn reencrypt_run<T: Tracer + ?Sized>(
    mut cells: Vec<&mut [u8]>,
    first: usize,
    perm: &[u32],
    old: &[Midstate],
    new: &[Midstate],
    t: &mut T,
) {
    let count = cells.first().map_or(0, |c| c.len() / PIECE);
    let mut piece = Pages::new(Area::Piece, perm.len());
    for jj in 0..count {
        let j = (first + jj) as u32;
        let tail = Tail::new(j);
        let range = jj * PIECE..(jj + 1) * PIECE;
        for (b, cell) in cells.iter().enumerate() {
            t.record(Access::Cell { cell: b as u32, piece: j, write: false });
            let mut x: [u8; 32] = cell[range.clone()].try_into().expect("32 bytes");
            xor_piece(&mut x, &old[b].keystream(&tail));
            xor_piece(&mut x, &new[b].keystream(&tail));
            piece.scatter(perm[b] as usize, &x, t);
        }
        gather_into(&piece, &mut cells, range, &mut |a: Access| {
            t.record(match a {
                Access::Cell { cell, .. } => Access::Cell { cell, piece: j, write: true },
                other => other,
            })
        });
    }
}

/// Copies the vector of position `k` out of `piece` into `cells[k][range]`, for every `k` in
/// order, two positions per pass over the pages (adjacent in every page); reports
/// the page reads and then, as `Access::Cell { cell: k, .. }` with `write`, each copy.
fn gather_into<C: AsMut<[u8]>, T: Tracer + ?Sized>(
    piece: &Pages,
    cells: &mut [C],
    range: std::ops::Range<usize>,
    t: &mut T,
) {
    let k_last = cells.len().saturating_sub(1);
    let mut pairs = cells.chunks_exact_mut(2);
    for (i, pair) in (&mut pairs).enumerate() {
        let k = 2 * i;
        let (a, b) = piece.gather_pair(k, t);
        for (off, (cell, x)) in pair.iter_mut().zip([a, b]).enumerate() {
            cell.as_mut()[range.clone()].copy_from_slice(&x);
            t.record(Access::Cell { cell: (k + off) as u32, piece: 0, write: true });
        }
    }
    if let [last] = pairs.into_remainder() {
        let k = k_last;
        let x = piece.gather(k, t);
        last.as_mut()[range].copy_from_slice(&x);
        t.record(Access::Cell { cell: k as u32, piece: 0, write: true });
    }
}

/// `dst = chosen ? src : dst` over one piece (of equal lengths, up to 32 bytes), without a
/// branch on `chosen`: 8-byte words, then the bytes of a short last piece.
#[inline]
fn select_piece(dst: &mut [u8], src: &[u8], chosen: subtle::Choice) {
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        let a = u64::from_le_bytes(d.try_into().expect("8 bytes"));
        let b = u64::from_le_bytes(s.try_into().expect("8 bytes"));
        d.copy_from_slice(&u64::conditional_select(&a, &b, chosen).to_le_bytes());
    }
    for (d, s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = u8::conditional_select(d, s, chosen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cipher::EVICT_TICKET_AD;

    /// The host keeps the enclave behind `Arc<dyn Trusted>` (`Send + Sync + Debug`).
    #[test]
    fn the_enclave_can_be_shared_between_threads() {
        fn shareable<T: Send + Sync + fmt::Debug>() {}
        shareable::<Enclave>();
        shareable::<TeeCipher>();
        shareable::<TeeKey>();
    }

    /// A ticket whose permutation is not one, sealed with the right key (only a buggy gateway
    /// could make it): the enclave refuses it and leaves the blocks alone.
    #[test]
    fn sealed_non_permutations_are_refused_by_the_enclave() {
        let key = TeeKey::from_bytes([3; 32]);
        let c = TeeCipher::new(&key, 32);
        let e = Enclave::new(&key, 32);
        let mut blocks: Vec<Vec<u8>> =
            (0..3).map(|i| c.seal(&[i; 32], &[i; 32]).unwrap()).collect();
        let before = blocks.clone();
        for perm in [[0u32, 0, 1], [0, 1, 3], [2, 2, 2], [u32::MAX, 0, 1]] {
            let mut raw = vec![9u8; 16];
            raw.extend_from_slice(&1u64.to_le_bytes());
            raw.extend_from_slice(&0u32.to_le_bytes());
            raw.extend_from_slice(&3u32.to_le_bytes());
            perm.iter().for_each(|p| raw.extend_from_slice(&p.to_le_bytes()));
            let sealed = c.seal_message(EVICT_TICKET_AD, &raw).unwrap();
            let err = e.evict(&mut blocks, &sealed).unwrap_err();
            assert!(err.to_string().contains("not a permutation"), "{perm:?}: {err}");
        }
        assert_eq!(blocks, before);
        // A count that disagrees with the entries.
        let mut raw = vec![9u8; 16];
        raw.extend_from_slice(&[0; 12]);
        raw.extend_from_slice(&4u32.to_le_bytes());
        [0u32, 1, 2].iter().for_each(|p| raw.extend_from_slice(&p.to_le_bytes()));
        let sealed = c.seal_message(EVICT_TICKET_AD, &raw).unwrap();
        assert!(matches!(e.evict(&mut blocks, &sealed), Err(TeeError::Malformed { .. })));
    }

    /// Sealed tickets (so they pass authentication, as only a buggy or compromised gateway could
    /// make them) with random or mutated contents, against random candidates and blocks: the
    /// enclave answers or refuses with an error, never panics, leaves the blocks of a refused
    /// eviction untouched, and answers with exactly one sealed block.
    mod hostile_frames {
        use super::*;
        use crate::cipher::QUERY_TICKET_AD;
        use crate::{EvictTicket, QueryTicket};
        use proptest::prelude::*;

        const BS: usize = 32;

        fn cells(c: &TeeCipher, n: usize, junk: &[u8]) -> Vec<Vec<u8>> {
            (0..n)
                .map(|i| {
                    let mut cell = c.seal(&[i as u8; 32], &[i as u8; BS]).unwrap();
                    if let Some(&x) = junk.get(i) {
                        let at = x as usize % cell.len();
                        cell[at] ^= x | 1;
                    }
                    cell
                })
                .collect()
        }

        /// A valid ticket's plaintext for `n` candidates, then mutated.
        fn query_plaintext(
            n: u32,
            target: u32,
            counter: u64,
            flips: &[(usize, u8)],
            cut: Option<usize>,
        ) -> Vec<u8> {
            let t = QueryTicket {
                stream: [5; 16],
                query_id: counter,
                candidates: n.max(1),
                target: target % n.max(1),
                ads: (0..n.max(1)).map(|i| [i as u8; 32]).collect(),
            };
            let mut b = t.to_bytes().unwrap().to_vec();
            for &(at, x) in flips {
                let i = at % b.len();
                b[i] ^= x;
            }
            if let Some(c) = cut {
                b.truncate(c);
            }
            b
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn sealed_query_tickets_of_any_content_never_panic(
                n in 0u32..6,
                given in 0usize..7,
                target in any::<u32>(),
                counter in any::<u64>(),
                flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
                cut in proptest::option::of(0usize..80),
                random in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
                junk in proptest::collection::vec(any::<u8>(), 0..3),
            ) {
                let c = TeeCipher::new(&TeeKey::from_bytes([4; 32]), BS);
                let e = Enclave::new(&TeeKey::from_bytes([4; 32]), BS);
                let plain = random.unwrap_or_else(|| query_plaintext(n, target, counter, &flips, cut));
                let sealed = c.seal_message(QUERY_TICKET_AD, &plain).unwrap();
                let cands = cells(&c, given, &junk);
                match e.query(&cands, &sealed) {
                    Ok(answer) => prop_assert_eq!(answer.len(), c.answer_len()),
                    Err(err) => prop_assert!(!err.to_string().is_empty()),
                }
                // The same ticket again is never answered a second time.
                prop_assert!(e.query(&cands, &sealed).is_err());
            }

            #[test]
            fn sealed_evict_tickets_of_any_content_never_panic(
                perm in proptest::collection::vec(0u32..8, 0..8),
                given in 0usize..8,
                round in any::<u64>(),
                layer in any::<u32>(),
                flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..3),
                junk in proptest::collection::vec(any::<u8>(), 0..2),
            ) {
                let c = TeeCipher::new(&TeeKey::from_bytes([4; 32]), BS);
                let e = Enclave::new(&TeeKey::from_bytes([4; 32]), BS);
                let mut raw = vec![9u8; 16];
                raw.extend_from_slice(&round.to_le_bytes());
                raw.extend_from_slice(&layer.to_le_bytes());
                raw.extend_from_slice(&(perm.len() as u32).to_le_bytes());
                perm.iter().for_each(|p| raw.extend_from_slice(&p.to_le_bytes()));
                for &(at, x) in &flips {
                    let i = at % raw.len();
                    raw[i] ^= x;
                }
                let sealed = c.seal_message(EVICT_TICKET_AD, &raw).unwrap();
                let mut blocks = cells(&c, given, &junk);
                let before = blocks.clone();
                match e.evict(&mut blocks, &sealed) {
                    Ok(()) => {
                        prop_assert_eq!(blocks.len(), before.len());
                        prop_assert!(EvictTicket::from_bytes(&raw).is_ok());
                    }
                    Err(err) => {
                        prop_assert!(!err.to_string().is_empty());
                        prop_assert_eq!(&blocks, &before, "a refused eviction changed the blocks");
                    }
                }
            }
        }
    }
}
