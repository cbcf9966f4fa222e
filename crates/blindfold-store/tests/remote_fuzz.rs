//! Hostile input for the storage protocol, client side and shared decoders: random request
//! bodies into the server's decoder, random error bodies into the client's, and a fake server
//! that sends random bytes at every step of the handshake and random answers after it. No
//! panic, no allocation beyond what the input holds (or the request asked for), a clear error.
//!
//! Cases: `BLINDFOLD_FUZZ_CASES` (see `blindfold_testkit::fuzz`).

use std::time::Duration;

use blindfold_store::remote::protocol::{self, get_error, put_error, Decoder, Encoder, Request};
use blindfold_store::remote::AuthKey;
use blindfold_store::{
    ByteRange, CellId, Geometry, RemoteStore, Store, StoreError, TeeLayer, TeeRound,
};
use blindfold_testkit::fuzz;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bytes a decoded request holds on the heap (for selects: the wire size of the selectors,
/// ranges and keys, each key counted once per request, as the decoder shares it).
fn heap_bytes(r: &Request) -> usize {
    match r {
        Request::Open { name, .. } => name.len(),
        Request::Read { cells, .. } => cells.len() * 8,
        Request::ReadRanges { ranges, .. } | Request::ReadXor { ranges, .. } => ranges.len() * 16,
        Request::Write { cells, .. } => cells.iter().map(|(_, d)| 32 + d.len()).sum(),
        Request::Flush { .. } => 0,
        Request::TeeQuery { cells, ticket, .. } => cells.len() * 8 + ticket.len(),
        Request::TeeEvict { round, .. } => {
            let blocks: usize = round.incoming.iter().map(|b| 24 + b.len()).sum();
            let layers: usize = round
                .layers
                .iter()
                .map(|l| 72 + 8 * (l.read.len() + l.write.len()) + l.ticket.len())
                .sum();
            blocks + layers
        }
        #[cfg(feature = "select")]
        Request::ReadSelect { request, .. } => {
            select_heap::of(&[request]) + select_heap::key(&[request])
        }
        #[cfg(feature = "select")]
        Request::ReadSelectCombined { request, .. } => {
            let groups: Vec<_> = request.groups.iter().collect();
            select_heap::of(&groups)
                + select_heap::key(&groups)
                + groups.first().map_or(0, |g| select_heap::ciphertexts(g, &request.outer))
        }
        #[cfg(feature = "select")]
        Request::WriteSelect { writes, .. } => {
            let requests: Vec<_> = writes.iter().map(|w| &w.request).collect();
            select_heap::of(&requests) + select_heap::key(&requests) + 8 * writes.len()
        }
        other => panic!("a request this test does not know: {other:?}"),
    }
}

#[cfg(feature = "select")]
mod select_heap {
    use std::sync::{Arc, OnceLock};

    use blindfold_dj::{Ciphertext, Integer, SecretKey};
    use blindfold_store::{ByteRange, CellId, CombinedSelect, SelectRequest, SelectWrite};
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    /// One small key for every case (generating one per case would dominate the run).
    pub fn secret() -> &'static SecretKey {
        static KEY: OnceLock<SecretKey> = OnceLock::new();
        KEY.get_or_init(|| {
            SecretKey::generate(256, &mut ChaCha20Rng::seed_from_u64(0xf022)).unwrap()
        })
    }

    pub fn ciphertexts(r: &SelectRequest, cs: &[Ciphertext]) -> usize {
        cs.iter().map(|c| 1 + r.public_key.ciphertext_len(c.layer()).unwrap()).sum()
    }

    pub fn of(requests: &[&SelectRequest]) -> usize {
        requests.iter().map(|r| ciphertexts(r, &r.selector) + 16 * r.ranges.len() + 12).sum()
    }

    pub fn key(requests: &[&SelectRequest]) -> usize {
        requests.first().map_or(0, |r| r.public_key.to_bytes().len())
    }

    /// Ciphertexts of random small values at the given layers.
    fn encrypt(layers: &[u32], seed: u64) -> Vec<Ciphertext> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        layers
            .iter()
            .map(|&l| secret().encrypt(&Integer::from(seed % 2), l, &mut rng).unwrap())
            .collect()
    }

    /// A select of any shape (the store, not the wire, checks shapes), with at least one
    /// selector element and one range, as the wire requires.
    pub fn any_select() -> impl Strategy<Value = SelectRequest> {
        (
            prop::collection::vec(1u32..=3, 1..4),
            prop::collection::vec((any::<u64>(), any::<u32>(), any::<u32>()), 1..5),
            any::<u32>(),
            any::<u64>(),
        )
            .prop_map(|(layers, ranges, chunk_len, seed)| SelectRequest {
                public_key: Arc::new(secret().public().clone()),
                selector: encrypt(&layers, seed),
                ranges: ranges
                    .into_iter()
                    .map(|(c, offset, len)| ByteRange { cell: CellId(c), offset, len })
                    .collect(),
                chunk_len,
            })
    }

    pub fn any_combined() -> impl Strategy<Value = CombinedSelect> {
        (
            prop::collection::vec(any_select(), 0..3),
            prop::collection::vec(1u32..=2, 0..3),
            any::<u64>(),
        )
            .prop_map(|(groups, outer, seed)| {
                let outer = if groups.is_empty() { Vec::new() } else { encrypt(&outer, seed) };
                CombinedSelect { groups, outer }
            })
    }

    pub fn any_writes() -> impl Strategy<Value = Vec<SelectWrite>> {
        prop::collection::vec(
            (any_select(), any::<u64>())
                .prop_map(|(request, t)| SelectWrite { request, target: CellId(t) }),
            0..3,
        )
    }
}

fn any_request() -> impl Strategy<Value = Request> {
    let ranges = prop::collection::vec(
        (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(c, offset, len)| ByteRange {
            cell: CellId(c),
            offset,
            len,
        }),
        0..8,
    );
    prop_oneof![
        (any::<u64>(), any::<u32>(), "[a-z0-9._-]{0,40}").prop_map(
            |(cell_count, cell_size, name)| { Request::Open { cell_count, cell_size, name } }
        ),
        (any::<u32>(), prop::collection::vec(any::<u64>().prop_map(CellId), 0..16))
            .prop_map(|(handle, cells)| Request::Read { handle, cells }),
        (any::<u32>(), ranges.clone())
            .prop_map(|(handle, ranges)| Request::ReadRanges { handle, ranges }),
        (any::<u32>(), ranges).prop_map(|(handle, ranges)| Request::ReadXor { handle, ranges }),
        (
            any::<u32>(),
            prop::collection::vec(
                (any::<u64>().prop_map(CellId), prop::collection::vec(any::<u8>(), 0..40)),
                0..6
            )
        )
            .prop_map(|(handle, cells)| Request::Write { handle, cells }),
        any::<u32>().prop_map(|handle| Request::Flush { handle }),
    ]
}

fn any_cells(max: usize) -> impl Strategy<Value = Vec<CellId>> {
    prop::collection::vec(any::<u64>().prop_map(CellId), 0..max)
}

/// TEE requests of any shape (the store, not the wire, checks shapes).
fn any_tee_request() -> impl Strategy<Value = Request> {
    let ticket = || prop::collection::vec(any::<u8>(), 0..40);
    let layer = (any_cells(4), any_cells(4), ticket()).prop_map(|(read, write, ticket)| TeeLayer {
        read,
        write,
        ticket,
    });
    prop_oneof![
        (any::<u32>(), any_cells(6), ticket())
            .prop_map(|(handle, cells, ticket)| Request::TeeQuery { handle, cells, ticket }),
        (
            any::<u32>(),
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 0..4),
            prop::collection::vec(layer, 0..4),
        )
            .prop_map(|(handle, incoming, layers)| Request::TeeEvict {
                handle,
                round: TeeRound { incoming, layers }
            }),
    ]
}

/// Bytes a decoded request may hold for a body of `len` bytes: three times the body for most
/// requests; six for TEE requests, whose blocks and layers cost a 24- or 72-byte header each
/// on the heap for a 4- or 12-byte one on the wire (their number is capped by the TEE limits).
fn heap_bound(r: &Request, len: usize) -> usize {
    match r {
        Request::TeeQuery { .. } | Request::TeeEvict { .. } => 6 * len + 64,
        _ => 3 * len + 64,
    }
}

/// A valid body with some bytes overwritten, some cut and some appended: near misses reach
/// deeper into a decoder than uniform noise.
fn mutated(body: Vec<u8>, edits: Vec<(usize, u8)>, cut: usize, tail: Vec<u8>) -> Vec<u8> {
    let mut b = body;
    for (at, v) in edits {
        if !b.is_empty() {
            let i = at % b.len();
            b[i] = v;
        }
    }
    b.truncate(b.len().saturating_sub(cut));
    b.extend(tail);
    b
}

#[cfg(feature = "select")]
fn any_select_request() -> impl Strategy<Value = Request> {
    use select_heap::{any_combined, any_select, any_writes};
    prop_oneof![
        (any::<u32>(), any_select())
            .prop_map(|(handle, request)| Request::ReadSelect { handle, request }),
        (any::<u32>(), any_combined())
            .prop_map(|(handle, request)| Request::ReadSelectCombined { handle, request }),
        (any::<u32>(), any_writes())
            .prop_map(|(handle, writes)| Request::WriteSelect { handle, writes }),
    ]
}

#[cfg(feature = "select")]
proptest! {
    #![proptest_config(fuzz::config_scaled(4))]

    /// Select requests: keys, ciphertexts of several layers and ranges survive the wire
    /// exactly; near misses (a flipped byte in a key or a ciphertext, a cut, a tail) decode to
    /// a request of bounded size or fail with a clear error.
    #[test]
    fn select_requests_round_trip_and_near_misses_fail_cleanly(
        req in any_select_request(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in 0usize..8,
        tail in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let frame = req.frame(9, protocol::MAX_FRAME).unwrap();
        prop_assert_eq!(frame[12], req.op());
        let body = frame[13..].to_vec();
        prop_assert_eq!(Request::decode(req.op(), &body).unwrap(), req.clone());
        let bad = mutated(body, edits, cut, tail);
        match Request::decode(req.op(), &bad) {
            Ok(r) => prop_assert!(heap_bytes(&r) <= 3 * bad.len() + 64),
            Err(e) => prop_assert!(matches!(e, StoreError::InvalidRequest(_)), "{e:?}"),
        }
        prop_assert!(req.frame(9, frame.len() - 5).is_err());
    }
}

/// Hostile counts and lengths in TEE requests are refused before anything is allocated for
/// them, however many bytes the frame holds.
#[test]
fn hostile_tee_counts_are_refused() {
    use blindfold_store::{MAX_TEE_CELLS, MAX_TEE_LAYERS, MAX_TEE_TICKET};
    let decode = |op: u8, e: &Encoder| Request::decode(op, &e.0);
    let (query, evict) = (protocol::op::TEE_QUERY, protocol::op::TEE_EVICT);
    // Counts larger than the frame.
    let mut e = Encoder::default();
    e.u32(0).u32(u32::MAX).u64(1);
    assert!(decode(query, &e).is_err());
    let mut e = Encoder::default();
    e.u32(0).u32(0).u32(u32::MAX).bytes(&[0; 64]);
    assert!(decode(evict, &e).is_err());
    let mut e = Encoder::default();
    e.u32(0).u32(1).u32(u32::MAX).bytes(&[0; 64]);
    assert!(decode(evict, &e).is_err(), "an incoming block longer than the frame");
    // Counts that fit in a large frame but exceed the limits.
    let mut e = Encoder::default();
    e.u32(0).u32(MAX_TEE_CELLS as u32 + 1).bytes(&vec![0; 8 * (MAX_TEE_CELLS + 1)]).u32(0);
    let err = decode(query, &e).unwrap_err();
    assert!(err.to_string().contains("at most"), "{err}");
    let mut e = Encoder::default();
    e.u32(0).u32(1).u64(0).u32(MAX_TEE_TICKET as u32 + 1).bytes(&vec![0; MAX_TEE_TICKET + 1]);
    assert!(decode(query, &e).unwrap_err().to_string().contains("ticket"));
    let mut e = Encoder::default();
    e.u32(0).u32(MAX_TEE_CELLS as u32 + 1).bytes(&vec![0; 4 * (MAX_TEE_CELLS + 1)]).u32(0);
    assert!(decode(evict, &e).unwrap_err().to_string().contains("incoming blocks"));
    let mut e = Encoder::default();
    e.u32(0).u32(0).u32(MAX_TEE_LAYERS as u32 + 1).bytes(&vec![0; 12 * (MAX_TEE_LAYERS + 1)]);
    assert!(decode(evict, &e).unwrap_err().to_string().contains("layers"));
    // The largest legal shapes decode.
    let mut e = Encoder::default();
    e.u32(0).u32(0).u32(MAX_TEE_LAYERS as u32).bytes(&vec![0; 12 * MAX_TEE_LAYERS]);
    assert!(decode(evict, &e).is_ok());
}

/// What the wire cannot carry is refused before anything is sent: selects under two keys in
/// one request, an outer selector without groups; a bare count with no key fails to decode.
#[cfg(feature = "select")]
#[test]
fn select_requests_the_wire_cannot_carry_are_refused() {
    use std::sync::Arc;

    use blindfold_dj::{Integer, SecretKey};
    use blindfold_store::{CombinedSelect, SelectRequest, SelectWrite};
    use rand::SeedableRng;

    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
    let other = SecretKey::generate(256, &mut rng).unwrap();
    let sk = select_heap::secret();
    let select = |sk: &SecretKey, rng: &mut rand_chacha::ChaCha20Rng| SelectRequest {
        public_key: Arc::new(sk.public().clone()),
        selector: vec![sk.encrypt(&Integer::from(1), 1, rng).unwrap()],
        ranges: vec![ByteRange { cell: CellId(0), offset: 0, len: 31 }],
        chunk_len: 31,
    };
    let mixed = Request::WriteSelect {
        handle: 0,
        writes: vec![
            SelectWrite { request: select(sk, &mut rng), target: CellId(1) },
            SelectWrite { request: select(&other, &mut rng), target: CellId(2) },
        ],
    };
    let err = mixed.frame(1, protocol::MAX_FRAME).unwrap_err();
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err:?}");
    let orphan = Request::ReadSelectCombined {
        handle: 0,
        request: CombinedSelect { groups: Vec::new(), outer: select(sk, &mut rng).selector },
    };
    assert!(orphan.frame(1, protocol::MAX_FRAME).is_err());
    // A selector element made under a larger key does not fit the request key's width: it is
    // written as zeros, which the decoder refuses (not a unit), never as another value.
    let big = SecretKey::generate(512, &mut rng).unwrap();
    let mut r = select(sk, &mut rng);
    r.selector = vec![big.encrypt(&Integer::from(1), 1, &mut rng).unwrap()];
    let req = Request::ReadSelect { handle: 0, request: r };
    let frame = req.frame(1, protocol::MAX_FRAME).unwrap();
    let err = Request::decode(protocol::op::READ_SELECT, &frame[13..]).unwrap_err();
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err:?}");
    // Groups announced with no key behind them, a key longer than any real one.
    let mut e = Encoder::default();
    e.u32(0).u32(3).u32(u32::MAX);
    assert!(Request::decode(protocol::op::READ_SELECT_COMBINED, &e.0).is_err());
    let mut e = Encoder::default();
    e.u32(0).u32(protocol::MAX_KEY_BYTES as u32 + 1).bytes(&[1; 2000]);
    assert!(Request::decode(protocol::op::READ_SELECT, &e.0).is_err());
}

proptest! {
    #![proptest_config(fuzz::config())]

    #[test]
    fn random_request_bodies_decode_or_fail_cleanly(
        op in any::<u8>(),
        body in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        if let Ok(req) = Request::decode(op, &body) {
            // Decoding is exact: the request encodes back to the same bytes, and holds no
            // more than the body carried.
            let mut e = Encoder::default();
            req.encode_body(&mut e);
            prop_assert_eq!(e.0, body.clone());
            prop_assert_eq!(req.op(), op);
            prop_assert!(heap_bytes(&req) <= heap_bound(&req, body.len()));
        }
    }

    #[test]
    fn requests_round_trip_and_near_misses_fail_cleanly(
        req in any_request(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in 0usize..8,
        tail in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let frame = req.frame(77, protocol::MAX_FRAME).unwrap();
        prop_assert_eq!(frame.len() - 4, u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize);
        prop_assert_eq!(u64::from_le_bytes(frame[4..12].try_into().unwrap()), 77);
        prop_assert_eq!(frame[12], req.op());
        let body = frame[13..].to_vec();
        prop_assert_eq!(Request::decode(req.op(), &body).unwrap(), req.clone());
        let bad = mutated(body, edits, cut, tail);
        if let Ok(r) = Request::decode(req.op(), &bad) {
            prop_assert!(heap_bytes(&r) <= 3 * bad.len() + 64);
        }
        // A limit below the frame's size refuses it before anything is sent.
        prop_assert!(req.frame(77, frame.len() - 5).is_err());
    }

    /// TEE requests survive the wire exactly; near misses decode to a request of bounded size
    /// or fail with a clear error.
    #[test]
    fn tee_requests_round_trip_and_near_misses_fail_cleanly(
        req in any_tee_request(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in 0usize..8,
        tail in prop::collection::vec(any::<u8>(), 0..8),
    ) {
        let frame = req.frame(3, protocol::MAX_FRAME).unwrap();
        prop_assert_eq!(frame[12], req.op());
        let body = frame[13..].to_vec();
        prop_assert_eq!(Request::decode(req.op(), &body).unwrap(), req.clone());
        let bad = mutated(body, edits, cut, tail);
        match Request::decode(req.op(), &bad) {
            Ok(r) => prop_assert!(heap_bytes(&r) <= heap_bound(&r, bad.len())),
            Err(e) => prop_assert!(matches!(e, StoreError::InvalidRequest(_)), "{e:?}"),
        }
        prop_assert!(req.frame(3, frame.len() - 5).is_err());
    }

    /// Random bodies for the TEE operations (the generic test rarely reaches deep into them).
    #[test]
    fn random_tee_bodies_decode_or_fail_cleanly(
        op in prop_oneof![Just(protocol::op::TEE_QUERY), Just(protocol::op::TEE_EVICT)],
        body in prop::collection::vec(prop_oneof![4 => 0u8..3, 1 => any::<u8>()], 0..300),
    ) {
        match Request::decode(op, &body) {
            Ok(req) => {
                let mut e = Encoder::default();
                req.encode_body(&mut e);
                prop_assert_eq!(e.0, body.clone());
                prop_assert!(heap_bytes(&req) <= heap_bound(&req, body.len()));
            }
            Err(e) => prop_assert!(matches!(e, StoreError::InvalidRequest(_)), "{e:?}"),
        }
    }

    #[test]
    fn random_reply_bodies_decode_or_fail_cleanly(
        status in any::<u8>(),
        body in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        match protocol::decode_reply(status, body.clone()) {
            Ok(Ok(ok)) => prop_assert_eq!((status, ok), (0, body.clone())),
            Ok(Err(_)) => prop_assert_eq!(status, 1),
            Err(_) => prop_assert!(status != 0),
        }
        let _ = get_error(&mut Decoder::new(&body));
    }

    #[test]
    fn error_bodies_are_bounded_and_round_trip(
        kind in 0u8..8,
        cell in any::<u64>(),
        n in any::<u32>(),
        msg in ".{0,64}",
        long in 0usize..3,
    ) {
        let msg = msg.repeat(1 + long * 200);
        let err = match kind {
            0 => StoreError::OutOfRange { cell: CellId(cell), cell_count: u64::from(n) },
            1 => StoreError::RangeOutOfCell { cell: CellId(cell), offset: n, len: n / 2, cell_size: 7 },
            2 => StoreError::WrongCellSize { cell: CellId(cell), got: n as usize, expected: 9 },
            3 => StoreError::InvalidRequest(msg.clone()),
            4 => StoreError::Unsupported(msg.clone()),
            5 => StoreError::Timeout(msg.clone()),
            6 => StoreError::InvalidGeometry(msg.clone()),
            _ => StoreError::Remote { message: msg.clone(), retryable: n % 2 == 0 },
        };
        let mut e = Encoder::default();
        put_error(&mut e, &err);
        prop_assert!(e.0.len() <= protocol::MAX_ERROR_BODY);
        let back = get_error(&mut Decoder::new(&e.0)).unwrap();
        prop_assert_eq!(back.is_retryable(), err.is_retryable());
        if kind < 3 {
            prop_assert_eq!(format!("{back:?}"), format!("{err:?}"));
        }
        let frame = protocol::reply_frame(5, Err(err));
        prop_assert!(frame.len() <= 4 + protocol::FRAME_HEAD + protocol::MAX_ERROR_BODY);
    }
}

// ---- A fake server that misbehaves at one step of the connection ----

fn key() -> AuthKey {
    AuthKey::from_bytes([0x24; 32])
}

/// Where the fake server starts sending random bytes.
#[derive(Clone, Debug)]
enum Script {
    /// Instead of its hello.
    Hello(Vec<u8>),
    /// After a valid hello, instead of the challenge (and what follows).
    Challenge(Vec<u8>),
    /// After a valid challenge, instead of the verdict.
    Verdict(Vec<u8>),
    /// After accepting the client and answering its `open`, as the answers to a read.
    Answers(Vec<RandomFrame>),
}

/// A reply frame with fields that are right, or not.
#[derive(Clone, Debug)]
struct RandomFrame {
    /// `None`: the right length.
    len: Option<u32>,
    /// `None`: the id of the read.
    id: Option<u64>,
    status: u8,
    body: Vec<u8>,
}

fn any_frame() -> impl Strategy<Value = RandomFrame> {
    (
        prop_oneof![3 => Just(None), 1 => any::<u32>().prop_map(Some)],
        prop_oneof![3 => Just(None), 1 => any::<u64>().prop_map(Some)],
        prop_oneof![2 => Just(0u8), 2 => Just(1u8), 1 => any::<u8>()],
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..80),
            // A well-formed error body.
            (any::<u8>(), ".{0,20}").prop_map(|(k, m)| {
                let mut e = Encoder::default();
                e.u8(k % 11)
                    .u8(1)
                    .u64(1)
                    .u64(2)
                    .u32(3)
                    .u32(4)
                    .u32(m.len() as u32)
                    .bytes(m.as_bytes());
                e.0
            }),
        ],
    )
        .prop_map(|(len, id, status, body)| RandomFrame { len, id, status, body })
}

fn any_script() -> impl Strategy<Value = Script> {
    let bytes = || prop::collection::vec(any::<u8>(), 0..120);
    prop_oneof![
        bytes().prop_map(Script::Hello),
        // A valid hello prefix followed by noise, too.
        bytes().prop_map(|b| Script::Hello([protocol::MAGIC.to_vec(), b].concat())),
        bytes().prop_map(Script::Challenge),
        bytes().prop_map(|b| Script::Verdict([vec![0u8], b].concat())),
        bytes().prop_map(|b| Script::Verdict([vec![1u8], b].concat())),
        bytes().prop_map(Script::Verdict),
        prop::collection::vec(any_frame(), 0..4).prop_map(Script::Answers),
    ]
}

const CELL: u32 = 16;

async fn fake_server(listener: tokio::net::TcpListener, script: Script) {
    let Ok((mut s, _)) = listener.accept().await else { return };
    let mut hello = [0u8; protocol::HELLO_LEN];
    if s.read_exact(&mut hello).await.is_err() {
        return;
    }
    let noise = match script {
        Script::Hello(b) => b,
        Script::Challenge(b) => [protocol::hello().to_vec(), b].concat(),
        Script::Verdict(b) => {
            let _ = s.write_all(&protocol::hello()).await;
            let _ = s.write_all(&protocol::challenge(protocol::AUTH_KEY, &[1; 32])).await;
            let mut response = [0u8; protocol::RESPONSE_LEN];
            if s.read_exact(&mut response).await.is_err() {
                return;
            }
            b
        }
        Script::Answers(frames) => {
            let server_nonce = [1u8; 32];
            let _ = s.write_all(&protocol::hello()).await;
            let _ = s.write_all(&protocol::challenge(protocol::AUTH_KEY, &server_nonce)).await;
            let mut response = [0u8; protocol::RESPONSE_LEN];
            if s.read_exact(&mut response).await.is_err() {
                return;
            }
            let client_nonce = response[..32].try_into().unwrap();
            let proof = key().server_proof(&server_nonce, &client_nonce);
            let _ = s.write_all(&protocol::accept(&proof, 1 << 20)).await;
            // The client's open: read it, answer with handle 0.
            let Ok(len) = s.read_u32_le().await else { return };
            let mut open = vec![0u8; len as usize];
            if s.read_exact(&mut open).await.is_err() {
                return;
            }
            let id = u64::from_le_bytes(open[..8].try_into().unwrap());
            let _ = s.write_all(&protocol::reply_frame(id, Ok(0u32.to_le_bytes().to_vec()))).await;
            let mut out = Vec::new();
            for f in frames {
                let len = f.len.unwrap_or(9 + f.body.len() as u32);
                out.extend_from_slice(&len.to_le_bytes());
                out.extend_from_slice(&f.id.unwrap_or(id + 1).to_le_bytes());
                out.push(f.status);
                out.extend_from_slice(&f.body);
            }
            out
        }
    };
    let _ = s.write_all(&noise).await;
    let _ = s.shutdown().await;
    // Drain what the client sends until it closes, so nothing is reset under it.
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut sink)).await;
}

proptest! {
    #![proptest_config(fuzz::config_scaled(4))]

    #[test]
    fn a_hostile_server_gets_a_clear_error(script in any_script()) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            let server = tokio::spawn(fake_server(listener, script.clone()));
            let g = Geometry::new(4, CELL).unwrap();
            let outcome = tokio::time::timeout(Duration::from_secs(20), async {
                let store = RemoteStore::open(&addr, Some(key()), "fuzz", g).await?;
                store.read(&[CellId(0), CellId(3)]).await
            })
            .await
            .expect("the client gives up on a hostile server, it does not hang");
            match (&script, outcome) {
                // Only a server that answered the read with exactly two cells gets data.
                (Script::Answers(_), Ok(cells)) => {
                    assert_eq!(cells.len(), 2);
                    assert!(cells.iter().all(|c| c.len() == CELL as usize));
                }
                (_, Ok(_)) => panic!("data from a server that never accepted: {script:?}"),
                (_, Err(e)) => assert!(!e.to_string().is_empty()),
            }
            server.abort();
        });
    }
}
