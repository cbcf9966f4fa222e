//! The trusted component's contract: double encryption, tickets, oblivious query and eviction.

use blindfold_tee::trace::{Access, Area};
use blindfold_tee::{
    Enclave, EvictTicket, QueryTicket, TeeCipher, TeeError, TeeKey, MAX_EVICT_BLOCKS,
};

const STREAM: [u8; 16] = [0x5a; 16];

fn key() -> TeeKey {
    TeeKey::from_bytes([0x42; 32])
}

/// A small deterministic generator for test data and permutations (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn perm(&mut self, s: usize) -> Vec<u32> {
        let mut p: Vec<u32> = (0..s as u32).collect();
        for i in (1..s).rev() {
            p.swap(i, (self.next() % (i as u64 + 1)) as usize);
        }
        p
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn ad(i: usize) -> [u8; 32] {
    let mut a = [0u8; 32];
    a[..8].copy_from_slice(&(i as u64).to_le_bytes());
    a[31] = 0xad;
    a
}

/// `n` cells sealed with `ad(i)`, and their plaintexts.
fn cells(c: &TeeCipher, n: usize, rng: &mut Rng) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let pts: Vec<Vec<u8>> = (0..n).map(|_| rng.bytes(c.block_size())).collect();
    let cells = pts.iter().enumerate().map(|(i, p)| c.seal(&ad(i), p).unwrap()).collect();
    (cells, pts)
}

// ---- double encryption ----

#[test]
fn seal_open_round_trips_for_many_block_sizes() {
    let mut rng = Rng(1);
    for bs in [0, 1, 4, 31, 32, 36, 100, 1024, 4096] {
        let c = TeeCipher::new(&key(), bs);
        assert_eq!(c.cell_len() % 32, 0);
        assert!(c.cell_len() >= 32 + 12 + bs + 16 && c.cell_len() < 64 + 12 + bs + 16);
        let pt = rng.bytes(bs);
        let cell = c.seal(&ad(3), &pt).unwrap();
        assert_eq!(cell.len(), c.cell_len());
        assert_eq!(c.open(&ad(3), &cell).unwrap(), pt, "block size {bs}");
    }
}

#[test]
fn every_flipped_bit_is_caught() {
    let c = TeeCipher::new(&key(), 40); // 12 + 40 + 16 = 68 bytes of inner layer, 28 padding
    let cell = c.seal(&ad(0), &[9; 40]).unwrap();
    for bit in 0..cell.len() * 8 {
        let mut bad = cell.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        let err = c.open(&ad(0), &bad).unwrap_err();
        assert!(err.is_integrity(), "bit {bit}: {err}");
    }
}

#[test]
fn nonzero_padding_is_refused() {
    let c = TeeCipher::new(&key(), 40);
    let cell = c.seal(&ad(0), &[9; 40]).unwrap();
    // Bytes 32 + 68 .. 128 are padding; flipping one there leaves the GCM part intact.
    let mut bad = cell.clone();
    bad[127] ^= 0x80;
    let err = c.open(&ad(0), &bad).unwrap_err();
    assert!(err.to_string().contains("padding"), "{err}");
}

#[test]
fn wrong_ad_key_or_length_is_refused() {
    let c = TeeCipher::new(&key(), 64);
    let cell = c.seal(&ad(1), &[1; 64]).unwrap();
    assert!(c.open(&ad(2), &cell).unwrap_err().is_integrity());
    let other = TeeCipher::new(&TeeKey::from_bytes([0x43; 32]), 64);
    assert!(other.open(&ad(1), &cell).unwrap_err().is_integrity());
    for len in [0, 1, cell.len() - 1, cell.len() + 1, cell.len() + 32, cell.len() - 32] {
        let mut bad = cell.clone();
        bad.resize(len, 0);
        let err = c.open(&ad(1), &bad).unwrap_err();
        assert!(matches!(err, TeeError::Malformed { .. }), "length {len}: {err}");
    }
    assert!(matches!(c.seal(&ad(1), &[1; 63]), Err(TeeError::Malformed { .. })));
    // A cell of another block size.
    let big = TeeCipher::new(&key(), 128).seal(&ad(1), &[1; 128]).unwrap();
    assert!(c.open(&ad(1), &big).is_err());
}

#[test]
fn sealing_is_randomised() {
    let c = TeeCipher::new(&key(), 64);
    let a = c.seal(&ad(0), &[0; 64]).unwrap();
    let b = c.seal(&ad(0), &[0; 64]).unwrap();
    assert_ne!(a[..32], b[..32], "fresh r");
    assert_ne!(a[32..44], b[32..44], "fresh nonce (under different keystreams)");
    assert!(a[32..].iter().zip(&b[32..]).filter(|(x, y)| x == y).count() < 16);
}

// ---- query ----

/// A ticket for `n` candidates sealed with `ad(0)`, `ad(1)`, … (as [`cells`] makes them).
fn query_ticket(c: &TeeCipher, n: usize, target: usize, query_id: u64) -> Vec<u8> {
    c.seal_query(&QueryTicket {
        stream: STREAM,
        query_id,
        candidates: n as u32,
        target: target as u32,
        ads: (0..n).map(ad).collect(),
    })
    .unwrap()
}

#[test]
fn query_returns_the_target_for_every_index() {
    let c = TeeCipher::new(&key(), 256);
    let e = Enclave::new(&key(), 256);
    let (cands, pts) = cells(&c, 7, &mut Rng(2));
    for (target, pt) in pts.iter().enumerate() {
        let answer = e.query(&cands, &query_ticket(&c, 7, target, 10 + target as u64)).unwrap();
        assert_eq!(answer.len(), c.answer_len());
        let block = c.open_answer(&STREAM, 10 + target as u64, &answer).unwrap();
        assert_eq!(&block, pt, "target {target}");
    }
}

#[test]
fn a_tampered_target_is_an_integrity_error() {
    let c = TeeCipher::new(&key(), 64);
    let e = Enclave::new(&key(), 64);
    let (cands, _) = cells(&c, 5, &mut Rng(3));
    for (n, byte) in [0, 31, 32, 50, 100, c.cell_len() - 1].into_iter().enumerate() {
        let mut bad = cands.clone();
        bad[2][byte] ^= 1;
        let err = e.query(&bad, &query_ticket(&c, 5, 2, n as u64 + 1)).unwrap_err();
        assert!(err.is_integrity(), "byte {byte}: {err}");
        if (32 + 12..32 + 12 + 64 + 16).contains(&byte) {
            assert!(err.to_string().contains("candidate failed authentication"), "{err}");
        }
    }
    // The target swapped with another cell (a valid cell under another AD).
    let mut swapped = cands.clone();
    swapped.swap(2, 3);
    assert!(e.query(&swapped, &query_ticket(&c, 5, 2, 10)).unwrap_err().is_integrity());
}

/// A ticket is bound to its candidates: any candidate changed, swapped or replaced, target or
/// not, and the query is refused, so the answer tells the host nothing about the target. In
/// particular the issue's probe (#43), every candidate replaced by one cell x, is refused for
/// every x.
#[test]
fn a_ticket_handed_other_cells_is_refused_whatever_the_target() {
    let c = TeeCipher::new(&key(), 64);
    let (cands, pts) = cells(&c, 5, &mut Rng(4));
    let id = std::cell::Cell::new(0);
    let ask = |cells: &[Vec<u8>], target: usize| {
        id.set(id.get() + 1);
        // A fresh component each time: only the cells can make it refuse.
        Enclave::new(&key(), 64).query(cells, &query_ticket(&c, 5, target, id.get()))
    };
    for (target, pt) in pts.iter().enumerate() {
        for (x, cell) in cands.iter().enumerate() {
            let err = ask(&vec![cell.clone(); 5], target).unwrap_err();
            assert!(err.is_integrity(), "target {target}, all candidates = {x}: {err}");
        }
        for other in (0..5).filter(|&o| o != target) {
            let mut bad = cands.clone();
            bad[other].iter_mut().for_each(|b| *b = !*b);
            assert!(ask(&bad, target).unwrap_err().is_integrity(), "{target} {other}");
        }
        let answer = ask(&cands, target).unwrap();
        assert_eq!(&c.open_answer(&STREAM, id.get(), &answer).unwrap(), pt);
    }
}

/// Every query ticket is answered at most once and only in order: a replayed ticket, and the
/// earlier of two delivered out of order, are refused with a replay error; other streams have
/// numbers of their own.
#[test]
fn query_tickets_are_answered_once_and_in_order() {
    let c = TeeCipher::new(&key(), 64);
    let e = Enclave::new(&key(), 64);
    let (cands, _) = cells(&c, 3, &mut Rng(12));
    let first = query_ticket(&c, 3, 0, 5);
    let second = query_ticket(&c, 3, 1, 6);
    e.query(&cands, &second).unwrap();
    let err = e.query(&cands, &first).unwrap_err();
    assert!(matches!(err, TeeError::QueryReplay { query_id: 5, last: 6 }), "{err}");
    assert!(err.to_string().contains("replayed or reordered"), "{err}");
    let err = e.query(&cands, &second).unwrap_err();
    assert!(matches!(err, TeeError::QueryReplay { query_id: 6, last: 6 }), "{err}");
    e.query(&cands, &query_ticket(&c, 3, 2, 7)).unwrap();
    // Another stream counts on its own.
    let other = QueryTicket {
        stream: [1; 16],
        query_id: 1,
        candidates: 3,
        target: 0,
        ads: (0..3).map(ad).collect(),
    };
    e.query(&cands, &c.seal_query(&other).unwrap()).unwrap();
    // A refusal for the ticket's shape does not use up its number.
    let next = query_ticket(&c, 3, 0, 8);
    assert!(matches!(e.query(&cands[..2], &next), Err(TeeError::Malformed { .. })));
    e.query(&cands, &next).unwrap();
}

#[test]
fn query_refuses_bad_tickets_and_shapes() {
    let c = TeeCipher::new(&key(), 64);
    let e = Enclave::new(&key(), 64);
    let (cands, _) = cells(&c, 4, &mut Rng(5));
    let good = query_ticket(&c, 4, 0, 1);
    assert!(e.query(&cands, &good).is_ok());

    // Forged (another key), garbled (every bit), truncated, empty, another kind.
    let forged = query_ticket(&TeeCipher::new(&TeeKey::from_bytes([1; 32]), 64), 4, 0, 1);
    assert!(e.query(&cands, &forged).unwrap_err().is_integrity());
    for bit in 0..good.len() * 8 {
        let mut bad = good.clone();
        bad[bit / 8] ^= 1 << (bit % 8);
        assert!(e.query(&cands, &bad).unwrap_err().is_integrity(), "bit {bit}");
    }
    for len in [0, 1, 27, good.len() - 1] {
        assert!(e.query(&cands, &good[..len]).is_err(), "length {len}");
    }
    let evict =
        c.seal_evict(&EvictTicket { stream: STREAM, round: 0, layer: 0, perm: vec![0, 1, 2, 3] });
    assert!(e.query(&cands, &evict.unwrap()).unwrap_err().is_integrity());
    // (`good` was answered above: an answer needs a ticket with a new number.)
    let answer = e.query(&cands, &query_ticket(&c, 4, 0, 3)).unwrap();
    assert!(e.query(&cands, &answer).unwrap_err().is_integrity(), "an answer is not a ticket");

    // Shapes: candidate count, cell length.
    let err = e.query(&cands[..3], &good).unwrap_err();
    assert!(matches!(err, TeeError::Malformed { .. }), "{err}");
    let mut short = cands.clone();
    short[3].pop();
    assert!(matches!(e.query(&short, &good), Err(TeeError::Malformed { .. })));
    // Wrong ads: the candidates open under other ads only.
    let t = QueryTicket {
        stream: STREAM,
        query_id: 4,
        candidates: 4,
        target: 0,
        ads: vec![ad(1), ad(2), ad(3), ad(0)],
    };
    assert!(e.query(&cands, &c.seal_query(&t).unwrap()).unwrap_err().is_integrity());
}

#[test]
fn answers_are_bound_to_stream_and_query_id() {
    let c = TeeCipher::new(&key(), 64);
    let e = Enclave::new(&key(), 64);
    let (cands, pts) = cells(&c, 3, &mut Rng(6));
    let answer = e.query(&cands, &query_ticket(&c, 3, 2, 77)).unwrap();
    assert_eq!(c.open_answer(&STREAM, 77, &answer).unwrap(), pts[2]);
    assert!(c.open_answer(&STREAM, 78, &answer).unwrap_err().is_integrity());
    assert!(c.open_answer(&[0; 16], 77, &answer).unwrap_err().is_integrity());
    let mut bad = answer.clone();
    bad[20] ^= 1;
    assert!(c.open_answer(&STREAM, 77, &bad).unwrap_err().is_integrity());
    assert!(matches!(c.open_answer(&STREAM, 77, &answer[1..]), Err(TeeError::Malformed { .. })));
    let other = TeeCipher::new(&TeeKey::from_bytes([1; 32]), 64);
    assert!(other.open_answer(&STREAM, 77, &answer).unwrap_err().is_integrity());
}

#[test]
fn query_touches_the_same_pieces_whatever_the_target() {
    let c = TeeCipher::new(&key(), 100);
    let e = Enclave::new(&key(), 100);
    let n = 5;
    let (cands, _) = cells(&c, n, &mut Rng(7));
    let mut traces = Vec::new();
    for target in 0..n {
        let mut trace = Vec::new();
        let ticket = query_ticket(&c, n, target, target as u64 + 1);
        e.query_traced(&cands, &ticket, &mut |a| trace.push(a)).unwrap();
        traces.push(trace);
    }
    let cell_reads = |t: &[Access]| t.iter().filter(|a| matches!(a, Access::Cell { .. })).count();
    for t in &traces {
        assert_eq!(t, &traces[0]);
        assert_eq!(cell_reads(t), n * c.pieces(), "every piece of every candidate");
    }
}

// ---- eviction ----

fn evict_ticket(c: &TeeCipher, round: u64, layer: u32, perm: &[u32]) -> Vec<u8> {
    c.seal_evict(&EvictTicket { stream: STREAM, round, layer, perm: perm.to_vec() }).unwrap()
}

#[test]
fn evict_moves_and_reencrypts_every_block() {
    let mut rng = Rng(8);
    for (bs, s) in [(100, 13), (1024, 40), (1, 1), (32, 2)] {
        let c = TeeCipher::new(&key(), bs);
        let e = Enclave::new(&key(), bs);
        let (input, pts) = cells(&c, s, &mut rng);
        let perm = rng.perm(s);
        let mut blocks = input.clone();
        e.evict(&mut blocks, &evict_ticket(&c, 1, 0, &perm)).unwrap();
        for j in 0..s {
            let out = &blocks[perm[j] as usize];
            assert_eq!(c.open(&ad(j), out).unwrap(), pts[j], "input {j} at {}", perm[j]);
            // Fresh outer layer: piece 0 and every encrypted piece changed.
            for (p, (a, b)) in out.chunks(32).zip(input[j].chunks(32)).enumerate() {
                assert_ne!(a, b, "block {j} piece {p} was not re-encrypted");
            }
        }
        let mut rs: Vec<&[u8]> = blocks.iter().chain(&input).map(|b| &b[..32]).collect();
        rs.sort();
        rs.dedup();
        assert_eq!(rs.len(), 2 * s, "every piece 0 is fresh");
    }
}

#[test]
fn evict_composes_over_layers_and_rounds() {
    let c = TeeCipher::new(&key(), 64);
    let e = Enclave::new(&key(), 64);
    let mut rng = Rng(9);
    let (mut blocks, pts) = cells(&c, 20, &mut rng);
    let mut at: Vec<usize> = (0..20).collect(); // at[i] = where input i is now
    for round in 0..3u64 {
        for layer in 0..3u32 {
            let perm = rng.perm(20);
            e.evict(&mut blocks, &evict_ticket(&c, round, layer, &perm)).unwrap();
            at.iter_mut().for_each(|p| *p = perm[*p] as usize);
        }
    }
    for (i, &p) in at.iter().enumerate() {
        assert_eq!(c.open(&ad(i), &blocks[p]).unwrap(), pts[i]);
    }
}

fn evict_trace(s: usize, bs: usize, perm: &[u32], stream: u8) -> Vec<Access> {
    let c = TeeCipher::new(&key(), bs);
    let e = Enclave::new(&key(), bs);
    let (mut blocks, _) = cells(&c, s, &mut Rng(10));
    let t = EvictTicket { stream: [stream; 16], round: 0, layer: 0, perm: perm.to_vec() };
    let mut trace = Vec::new();
    e.evict_traced(&mut blocks, &c.seal_evict(&t).unwrap(), &mut |a| trace.push(a)).unwrap();
    trace
}

#[test]
fn evict_page_accesses_do_not_depend_on_the_permutation() {
    let mut rng = Rng(11);
    // One size for each page layout: 1, 2, 8 and 32 pages of whole bytes, and 64 of nibbles.
    for (s, bs) in [(9, 64), (16, 100), (200, 40), (700, 32), (3000, 32), (4100, 32)] {
        let identity: Vec<u32> = (0..s as u32).collect();
        let reverse: Vec<u32> = identity.iter().rev().copied().collect();
        let reference = evict_trace(s, bs, &identity, 1);
        for perm in [reverse, rng.perm(s), rng.perm(s)] {
            let trace = evict_trace(s, bs, &perm, 2);
            assert_eq!(trace.len(), reference.len());
            assert!(trace == reference, "s {s}: the page trace depends on the permutation");
        }
        // The trace is not trivially empty: every page of every structure is used, and every
        // piece of every cell is read and written.
        for area in [Area::Orvp, Area::Nrvp, Area::Piece] {
            for page in 0..blindfold_tee::pages_for(s) as u8 {
                for write in [false, true] {
                    assert!(reference.contains(&Access::Page { area, page, write }));
                }
            }
        }
        let pieces = TeeCipher::new(&key(), bs).pieces();
        let cell_accesses = reference.iter().filter(|a| matches!(a, Access::Cell { .. })).count();
        assert_eq!(cell_accesses, 2 * s * pieces);
    }
}

#[test]
fn replayed_eviction_tickets_are_refused() {
    let c = TeeCipher::new(&key(), 32);
    let e = Enclave::new(&key(), 32);
    let (mut blocks, pts) = cells(&c, 4, &mut Rng(12));
    let perm = [1, 2, 3, 0];
    let t = evict_ticket(&c, 5, 2, &perm);
    e.evict(&mut blocks, &t).unwrap();
    let before = blocks.clone();
    for (round, layer) in [(5, 2), (5, 1), (4, 9), (0, 0)] {
        let old = if (round, layer) == (5, 2) {
            t.clone()
        } else {
            evict_ticket(&c, round, layer, &perm)
        };
        let err = e.evict(&mut blocks, &old).unwrap_err();
        assert!(matches!(err, TeeError::Replay { last_round: 5, last_layer: 2, .. }), "{err}");
        assert_eq!(blocks, before, "a refused eviction leaves the blocks alone");
    }
    e.evict(&mut blocks, &evict_ticket(&c, 5, 3, &perm)).unwrap();
    e.evict(&mut blocks, &evict_ticket(&c, 6, 0, &perm)).unwrap();
    // Another stream has its own history.
    let other = EvictTicket { stream: [1; 16], round: 0, layer: 0, perm: perm.to_vec() };
    e.evict(&mut blocks, &c.seal_evict(&other).unwrap()).unwrap();
    assert!(matches!(
        e.evict(&mut blocks, &c.seal_evict(&other).unwrap()),
        Err(TeeError::Replay { .. })
    ));
    // Four evictions with perm: position 4 - 4 = 0 again (cycle of length 4).
    for (i, pt) in pts.iter().enumerate() {
        assert_eq!(&c.open(&ad(i), &blocks[i]).unwrap(), pt);
    }
}

#[test]
fn evict_refuses_bad_shapes_and_tickets() {
    let c = TeeCipher::new(&key(), 32);
    let e = Enclave::new(&key(), 32);
    let (mut blocks, _) = cells(&c, 4, &mut Rng(13));
    let before = blocks.clone();
    // perm for 3 blocks, 4 handed in; and 5.
    let err = e.evict(&mut blocks, &evict_ticket(&c, 0, 0, &[0, 1, 2])).unwrap_err();
    assert!(matches!(err, TeeError::Malformed { .. }), "{err}");
    let err = e.evict(&mut blocks[..3], &evict_ticket(&c, 0, 1, &[0, 1, 2, 3])).unwrap_err();
    assert!(matches!(err, TeeError::Malformed { .. }), "{err}");
    // A cell of the wrong length.
    let mut short = blocks.clone();
    short[2].truncate(10);
    let err = e.evict(&mut short, &evict_ticket(&c, 0, 2, &[0, 1, 2, 3])).unwrap_err();
    assert!(matches!(err, TeeError::Malformed { .. }), "{err}");
    // Not permutations: the gateway cannot even seal them.
    for bad in [vec![0, 0, 1, 2], vec![0, 1, 2, 4], vec![3, 2, 1, 1]] {
        let t = EvictTicket { stream: STREAM, round: 0, layer: 3, perm: bad };
        assert!(matches!(c.seal_evict(&t), Err(TeeError::Malformed { .. })));
    }
    // Forged, garbled, another kind.
    let good = evict_ticket(&c, 0, 4, &[0, 1, 2, 3]);
    let forged =
        evict_ticket(&TeeCipher::new(&TeeKey::from_bytes([2; 32]), 32), 0, 4, &[0, 1, 2, 3]);
    assert!(e.evict(&mut blocks, &forged).unwrap_err().is_integrity());
    let mut garbled = good.clone();
    garbled[30] ^= 4;
    assert!(e.evict(&mut blocks, &garbled).unwrap_err().is_integrity());
    let q = c.seal_query(&QueryTicket {
        stream: STREAM,
        query_id: 0,
        candidates: 4,
        target: 0,
        ads: (0..4).map(ad).collect(),
    });
    assert!(e.evict(&mut blocks, &q.unwrap()).unwrap_err().is_integrity());
    assert_eq!(blocks, before, "nothing was changed by refused calls");
    // None of those consumed the ticket's (round, layer).
    e.evict(&mut blocks, &good).unwrap();
}

#[test]
fn evictions_beyond_the_page_capacity_are_refused() {
    let c = TeeCipher::new(&key(), 1);
    let e = Enclave::new(&key(), 1);
    let over: Vec<u32> = (0..=MAX_EVICT_BLOCKS as u32).collect();
    let t = EvictTicket { stream: STREAM, round: 0, layer: 0, perm: over };
    assert!(matches!(c.seal_evict(&t), Err(TeeError::TooManyBlocks { blocks: 8193, max: 8192 })));
    // The host hands in more blocks than the pages hold.
    let cell = c.seal(&ad(0), &[7]).unwrap();
    let mut blocks = vec![cell; MAX_EVICT_BLOCKS + 1];
    let full: Vec<u32> = (0..MAX_EVICT_BLOCKS as u32).rev().collect();
    let err = e.evict(&mut blocks, &evict_ticket(&c, 0, 0, &full)).unwrap_err();
    assert!(matches!(err, TeeError::TooManyBlocks { .. }), "{err}");
    // Exactly the capacity works.
    blocks.pop();
    e.evict(&mut blocks, &evict_ticket(&c, 0, 1, &full)).unwrap();
    assert_eq!(c.open(&ad(0), &blocks[0]).unwrap(), [7]);
}

#[test]
fn the_replay_table_is_bounded() {
    let c = TeeCipher::new(&key(), 32);
    let e = Enclave::new(&key(), 32);
    let ticket = |i: usize| {
        let mut stream = [0u8; 16];
        stream[..8].copy_from_slice(&(i as u64).to_le_bytes());
        c.seal_evict(&EvictTicket { stream, round: 0, layer: 0, perm: vec![] }).unwrap()
    };
    for i in 0..blindfold_tee::MAX_STREAMS {
        e.evict(&mut [], &ticket(i)).unwrap();
    }
    let err = e.evict(&mut [], &ticket(usize::MAX)).unwrap_err();
    assert!(matches!(err, TeeError::TooManyStreams { .. }), "{err}");
}

#[test]
fn debug_output_hides_keys() {
    let k = TeeKey::from_bytes([0x42; 32]);
    for d in [format!("{:?}", TeeCipher::new(&k, 32)), format!("{:?}", Enclave::new(&k, 32))] {
        assert!(d.contains("redacted") && !d.contains("42, 42") && !d.contains("4242"), "{d}");
    }
}

// ---- hostile bytes ----

mod hostile {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let c = TeeCipher::new(&key(), 32);
            let _ = QueryTicket::from_bytes(&bytes);
            let _ = EvictTicket::from_bytes(&bytes);
            prop_assert!(c.open_query(&bytes).is_err());
            prop_assert!(c.open_evict(&bytes).is_err());
            prop_assert!(c.open_answer(&STREAM, 0, &bytes).is_err());
            prop_assert!(c.open(&[0; 32], &bytes).is_err());
            let e = Enclave::new(&key(), 32);
            let cell = vec![0u8; c.cell_len()];
            prop_assert!(e.query(std::slice::from_ref(&cell), &bytes).is_err());
            prop_assert!(e.evict(&mut [cell], &bytes).is_err());
        }

        #[test]
        fn evict_ticket_parsing_accepts_exactly_permutations(
            round in any::<u64>(),
            entries in proptest::collection::vec(0u32..12, 0..12),
            extra in 0usize..3,
        ) {
            let mut b = vec![7u8; 16];
            b.extend_from_slice(&round.to_le_bytes());
            b.extend_from_slice(&3u32.to_le_bytes());
            b.extend_from_slice(&(entries.len() as u32).to_le_bytes());
            for e in &entries {
                b.extend_from_slice(&e.to_le_bytes());
            }
            b.extend(std::iter::repeat_n(0u8, extra));
            let mut sorted = entries.clone();
            sorted.sort_unstable();
            let is_perm = sorted.iter().enumerate().all(|(i, &v)| v == i as u32);
            let parsed = EvictTicket::from_bytes(&b);
            prop_assert_eq!(parsed.is_ok(), is_perm && extra == 0);
            if let Ok(t) = parsed {
                prop_assert_eq!(&t.perm, &entries);
                prop_assert_eq!(t.round, round);
            }
        }

        #[test]
        fn cells_with_arbitrary_changes_never_open(
            flips in proptest::collection::vec((0usize..160, 1u8..=255), 1..4),
        ) {
            let c = TeeCipher::new(&key(), 100);
            let cell = c.seal(&ad(0), &[3; 100]).unwrap();
            let mut bad = cell.clone();
            for (at, x) in flips {
                bad[at] ^= x;
            }
            prop_assume!(bad != cell);
            prop_assert!(c.open(&ad(0), &bad).unwrap_err().is_integrity());
        }
    }
}
