//! The homomorphic-select capability: an encrypted unit vector picks exactly one slot's data out
//! of a bucket stored in a cell, and malformed requests fail whole.
#![cfg(feature = "select")]

use std::sync::Arc;
use std::time::Duration;

use blindfold_dj::{Ciphertext, Integer, SecretKey};
use blindfold_store::{
    open_select_store, ByteRange, CellId, CombinedSelect, CountingStore, FaultConfig, FaultStore,
    FileStore, Geometry, LatencyStore, LinkConfig, MemoryStore, RecordingStore, SelectRequest,
    SelectStore, SelectWrite, Store, StoreError, StoreUrl, SyncMode, TraceOp,
};
use blindfold_testkit::select::{self, run_select};
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

const SLOTS: u32 = 3;
const CHUNKS: usize = 2;

/// A bucket of `SLOTS` slots per cell, each slot `CHUNKS` layer-1 ciphertexts of a 256-bit key,
/// so the selector works at layer 2 and the answer is peeled twice (Onion ORAM's read).
struct Fixture {
    sk: SecretKey,
    plain: Vec<Vec<Integer>>,
    slot_len: u32,
    chunk_len: u32,
}

impl Fixture {
    fn new(rng: &mut ChaCha20Rng) -> Self {
        let sk = SecretKey::generate(256, rng).unwrap();
        let chunk_len = sk.public().ciphertext_len(1).unwrap() as u32;
        let plain = (0..SLOTS)
            .map(|i| (0..CHUNKS).map(|j| Integer::from(1000 * i + j as u32)).collect())
            .collect();
        Self { sk, plain, slot_len: chunk_len * CHUNKS as u32, chunk_len }
    }

    fn geometry(&self) -> Geometry {
        Geometry::new(4, self.slot_len * SLOTS + 8).unwrap()
    }

    /// The cell's bytes: the slots' ciphertexts one after the other, then 8 spare bytes.
    fn cell(&self, rng: &mut ChaCha20Rng) -> Vec<u8> {
        let pk = self.sk.public();
        let mut cell = Vec::new();
        for slot in &self.plain {
            for c in pk.encrypt_many(slot, 1, rng).unwrap() {
                cell.extend_from_slice(&pk.ciphertext_to_bytes(&c));
            }
        }
        cell.resize(self.geometry().cell_size() as usize, 0xee);
        cell
    }

    fn request(&self, pick: u32, rng: &mut ChaCha20Rng) -> SelectRequest {
        let bits: Vec<Integer> = (0..SLOTS).map(|i| Integer::from(u32::from(i == pick))).collect();
        SelectRequest {
            public_key: Arc::new(self.sk.public().clone()),
            selector: self.sk.encrypt_many(&bits, 2, rng).unwrap(),
            ranges: (0..SLOTS)
                .map(|i| ByteRange {
                    cell: CellId(2),
                    offset: i * self.slot_len,
                    len: self.slot_len,
                })
                .collect(),
            chunk_len: self.chunk_len,
        }
    }

    /// Parses an answer into layer-2 ciphertexts and peels each down to its plaintext.
    fn open(&self, answer: &[u8]) -> Vec<Integer> {
        let pk = self.sk.public();
        let len = pk.ciphertext_len(2).unwrap();
        assert_eq!(answer.len(), len * CHUNKS, "one layer-2 ciphertext per chunk");
        answer
            .chunks(len)
            .map(|b| {
                let c: Ciphertext = pk.ciphertext_from_bytes(2, b).unwrap();
                self.sk.peel_all(&c, 1).unwrap()
            })
            .collect()
    }
}

async fn selects_each_slot<S: SelectStore>(store: &S, fx: &Fixture, rng: &mut ChaCha20Rng) {
    store.write(vec![(CellId(2), fx.cell(rng))]).await.unwrap();
    for pick in 0..SLOTS {
        let answer = store.read_select(&fx.request(pick, rng)).await.unwrap();
        assert_eq!(fx.open(&answer), fx.plain[pick as usize], "slot {pick}");
    }
}

#[tokio::test]
async fn memory_store_selects_exactly_one_slot() {
    let mut rng = ChaCha20Rng::seed_from_u64(21);
    let fx = Fixture::new(&mut rng);
    let store = MemoryStore::new(fx.geometry());
    selects_each_slot(&store, &fx, &mut rng).await;
    // Through an Arc<dyn SelectStore> as the engine will hold it.
    let shared: Arc<dyn SelectStore> = Arc::new(store);
    let answer = shared.read_select(&fx.request(1, &mut rng)).await.unwrap();
    assert_eq!(fx.open(&answer), fx.plain[1]);
}

#[tokio::test]
async fn file_store_selects_exactly_one_slot() {
    let mut rng = ChaCha20Rng::seed_from_u64(22);
    let fx = Fixture::new(&mut rng);
    let dir = tempfile::tempdir().unwrap();
    let store =
        FileStore::create_or_open(dir.path().join("b.cells"), fx.geometry(), SyncMode::None)
            .unwrap();
    selects_each_slot(&store, &fx, &mut rng).await;
}

fn assert_invalid(result: Result<Vec<u8>, StoreError>, what: &str) {
    match result {
        Err(StoreError::InvalidRequest(_)) | Err(StoreError::RangeOutOfCell { .. }) => {}
        other => panic!("{what}: expected a refused request, got {other:?}"),
    }
}

#[tokio::test]
async fn malformed_requests_fail_whole() {
    let mut rng = ChaCha20Rng::seed_from_u64(23);
    let fx = Fixture::new(&mut rng);
    let store = MemoryStore::new(fx.geometry());
    store.write(vec![(CellId(2), fx.cell(&mut rng))]).await.unwrap();
    let good = fx.request(0, &mut rng);

    let mut r = good.clone();
    r.selector.pop();
    assert_invalid(store.read_select(&r).await, "selector shorter than ranges");

    let mut r = good.clone();
    r.selector.clear();
    r.ranges.clear();
    assert_invalid(store.read_select(&r).await, "empty");

    let mut r = good.clone();
    r.ranges[1].len -= 1;
    assert_invalid(store.read_select(&r).await, "ranges of different lengths");

    let mut r = good.clone();
    r.chunk_len = fx.chunk_len + 1;
    assert_invalid(store.read_select(&r).await, "length not a multiple of the chunk");

    let mut r = good.clone();
    r.chunk_len = 0;
    assert_invalid(store.read_select(&r).await, "zero chunk length");

    let mut r = good.clone();
    r.selector[1] = fx.sk.public().encrypt(&Integer::from(0), 3, &mut rng).unwrap();
    assert_invalid(store.read_select(&r).await, "selector of mixed layers");

    let mut r = good.clone();
    r.ranges[2].offset = fx.geometry().cell_size() - 4;
    assert_invalid(store.read_select(&r).await, "range past the end of its cell");

    // Chunks that are not below n^s: the spare 0xee bytes at the end of the cell, read with a
    // selector at layer 1 (chunks must then be below n, and a layer-1 ciphertext is not).
    let mut r = good.clone();
    let bits: Vec<Integer> = (0..SLOTS).map(|i| Integer::from(u32::from(i == 0))).collect();
    r.selector = fx.sk.encrypt_many(&bits, 1, &mut rng).unwrap();
    assert_invalid(store.read_select(&r).await, "chunks outside the plaintext space");

    // The good request still works after all that.
    let answer = store.read_select(&good).await.unwrap();
    assert_eq!(fx.open(&answer), fx.plain[0]);
}

/// The combined select: two groups at different layers (the bucket of `fx` at layer 2, and a
/// group of raw layer-1 chunks selected at layer 1); the outer select (Paillier, layer 1)
/// brings back exactly the chosen group's answer, zero-padded.
#[tokio::test]
async fn combined_select_returns_the_chosen_groups_answer() {
    let mut rng = ChaCha20Rng::seed_from_u64(24);
    let fx = Fixture::new(&mut rng);
    let store = MemoryStore::new(fx.geometry());
    store.write(vec![(CellId(2), fx.cell(&mut rng))]).await.unwrap();
    let pk = Arc::new(fx.sk.public().clone());
    // Group 1: cell 3 holds two raw plaintext chunks of layer 1 per slot.
    let raw_chunk = pk.plaintext_chunk_len(1).unwrap();
    let mut cell3 = vec![0u8; fx.geometry().cell_size() as usize];
    for (i, b) in cell3.iter_mut().enumerate().take(4 * raw_chunk) {
        *b = (i % 251) as u8 + 1;
    }
    store.write(vec![(CellId(3), cell3.clone())]).await.unwrap();
    let raw_group = |pick: u32, rng: &mut ChaCha20Rng| SelectRequest {
        public_key: Arc::clone(&pk),
        selector: fx
            .sk
            .encrypt_many(
                &[Integer::from(u32::from(pick == 0)), Integer::from(u32::from(pick == 1))],
                1,
                rng,
            )
            .unwrap(),
        ranges: (0..2)
            .map(|i| ByteRange {
                cell: CellId(3),
                offset: i * 2 * raw_chunk as u32,
                len: 2 * raw_chunk as u32,
            })
            .collect(),
        chunk_len: raw_chunk as u32,
    };
    for (group, pick) in [(0usize, 1u32), (1, 0), (1, 1)] {
        let groups = vec![
            fx.request(if group == 0 { pick } else { 0 }, &mut rng),
            raw_group(pick, &mut rng),
        ];
        let outer = fx
            .sk
            .encrypt_many(
                &[Integer::from(u32::from(group == 0)), Integer::from(u32::from(group == 1))],
                1,
                &mut rng,
            )
            .unwrap();
        let request = blindfold_store::CombinedSelect { groups, outer };
        let answer = store.read_select_combined(&request).await.unwrap();
        // Peel the outer layer chunk by chunk back into the padded group answer.
        let outer_chunk = pk.plaintext_chunk_len(1).unwrap();
        let clen = pk.ciphertext_len(1).unwrap();
        let mut padded = Vec::new();
        for c in answer.chunks(clen) {
            let m = fx.sk.decrypt(&pk.ciphertext_from_bytes(1, c).unwrap());
            padded.extend(pk.plaintext_to_bytes(&m, outer_chunk).unwrap());
        }
        if group == 0 {
            let inner_len = pk.ciphertext_len(2).unwrap() * CHUNKS;
            assert_eq!(fx.open(&padded[..inner_len]), fx.plain[pick as usize]);
            assert!(padded[inner_len..].iter().all(|&b| b == 0), "padding is zeros");
        } else {
            let inner_len = pk.ciphertext_len(1).unwrap() * 2;
            let mut got = Vec::new();
            for c in padded[..inner_len].chunks(clen) {
                let m = fx.sk.decrypt(&pk.ciphertext_from_bytes(1, c).unwrap());
                got.extend(pk.plaintext_to_bytes(&m, raw_chunk).unwrap());
            }
            let start = pick as usize * 2 * raw_chunk;
            assert_eq!(got, cell3[start..start + 2 * raw_chunk], "group 1 slot {pick}");
        }
    }
    // One outer element too few fails whole.
    let request = blindfold_store::CombinedSelect {
        groups: vec![fx.request(0, &mut rng)],
        outer: Vec::new(),
    };
    assert_invalid(store.read_select_combined(&request).await, "outer shorter than groups");
}

/// Written selects: the answer lands in the target cell, zero-padded, and a later select in the
/// same batch reads what an earlier one wrote; a bad request fails the batch before any write.
#[tokio::test]
async fn write_select_keeps_answers_in_order() {
    let mut rng = ChaCha20Rng::seed_from_u64(25);
    let fx = Fixture::new(&mut rng);
    let store = MemoryStore::new(fx.geometry());
    store.write(vec![(CellId(2), fx.cell(&mut rng))]).await.unwrap();
    let first =
        blindfold_store::SelectWrite { request: fx.request(2, &mut rng), target: CellId(0) };
    // The second select reads cell 0's answer (layer-2 chunks) as a one-slot bucket at layer 3.
    let pk = Arc::new(fx.sk.public().clone());
    let len2 = pk.ciphertext_len(2).unwrap() as u32;
    let second = blindfold_store::SelectWrite {
        request: SelectRequest {
            public_key: Arc::clone(&pk),
            selector: fx.sk.encrypt_many(&[Integer::from(1)], 3, &mut rng).unwrap(),
            ranges: vec![ByteRange { cell: CellId(0), offset: 0, len: len2 * CHUNKS as u32 }],
            chunk_len: len2,
        },
        target: CellId(1),
    };
    store.write_select(&[first.clone(), second]).await.unwrap();
    let cells = store.read(&[CellId(0), CellId(1)]).await.unwrap();
    let inner = (len2 as usize) * CHUNKS;
    assert_eq!(fx.open(&cells[0][..inner]), fx.plain[2]);
    assert!(cells[0][inner..].iter().all(|&b| b == 0));
    let len3 = pk.ciphertext_len(3).unwrap();
    let peeled: Vec<Integer> = cells[1][..len3 * CHUNKS]
        .chunks(len3)
        .map(|b| fx.sk.peel_all(&pk.ciphertext_from_bytes(3, b).unwrap(), 1).unwrap())
        .collect();
    assert_eq!(peeled, fx.plain[2], "the second select read the first one's answer");

    // A batch whose second request is bad writes nothing.
    store.write(vec![(CellId(0), vec![7; fx.geometry().cell_size() as usize])]).await.unwrap();
    let mut bad = first.clone();
    bad.target = CellId(99);
    let err = store.write_select(&[first, bad]).await.unwrap_err();
    assert!(matches!(err, StoreError::OutOfRange { .. }), "{err:?}");
    assert_eq!(
        store.read(&[CellId(0)]).await.unwrap()[0],
        vec![7; fx.geometry().cell_size() as usize]
    );
}

// ---- Conformance, wrappers and URLs ----------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_file_stores_pass_the_select_conformance_check() {
    run_select(&MemoryStore::new(select::geometry())).await;
    let dir = tempfile::tempdir().unwrap();
    let file =
        FileStore::create_or_open(dir.path().join("s.cells"), select::geometry(), SyncMode::None)
            .unwrap();
    run_select(&file).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_select_store_by_url() {
    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse(&format!("file://{}", dir.path().display())).unwrap();
    let store = open_select_store(&url, "s", select::geometry()).await.unwrap();
    run_select(&*store).await;
    assert!(dir.path().join("s.cells").exists());
    let memory = open_select_store(&StoreUrl::Memory, "m", select::geometry()).await.unwrap();
    run_select(&*memory).await;
    assert!(open_select_store(&url, "../s", select::geometry()).await.is_err());
    // Backends that cannot compute refuse at once, without connecting.
    for text in ["s3://bucket/prefix?endpoint=http://127.0.0.1:9", "redis://127.0.0.1:9/0"] {
        let url = StoreUrl::parse(text).unwrap();
        match open_select_store(&url, "s", select::geometry()).await {
            Err(StoreError::Unsupported(msg)) => assert!(msg.contains("select"), "{msg}"),
            other => panic!("{text}: expected Unsupported, got {:?}", other.map(|_| ())),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrappers_pass_the_conformance_check() {
    let shared: Arc<dyn SelectStore> = Arc::new(MemoryStore::new(select::geometry()));
    let link = LinkConfig::unlimited(Duration::from_millis(1));
    let store = CountingStore::new(RecordingStore::new(FaultStore::new(
        LatencyStore::new(shared, link),
        FaultConfig::default(),
    )));
    run_select(&store).await;
    let c = store.counts();
    assert!(c.select_requests > 0 && c.select_combined_requests > 0, "{c:?}");
    assert!(c.select_write_requests > 0 && c.select_cells_written > 0, "{c:?}");
    let trace = store.inner().trace();
    assert!(trace.iter().any(|e| e.op == TraceOp::WriteSelect && !e.targets.is_empty()));
}

/// One request of each kind through counting, recording and latency wrappers: exact counts,
/// the trace the store sees, and the link charged with the selectors and the answer.
#[tokio::test(start_paused = true)]
async fn wrappers_count_record_and_delay_each_kind() {
    let mut rng = ChaCha20Rng::seed_from_u64(31);
    let fx = Fixture::new(&mut rng);
    // 80 kbit/s: each byte costs 100 µs either way, so the charged bytes show in the time.
    let link = LinkConfig::symmetric(Duration::from_millis(10), 80_000);
    let shared: Arc<dyn SelectStore> = Arc::new(MemoryStore::new(fx.geometry()));
    shared.write(vec![(CellId(2), fx.cell(&mut rng))]).await.unwrap();
    let store = CountingStore::new(RecordingStore::new(LatencyStore::new(shared, link)));
    let pk = fx.sk.public();
    let (len1, len2) = (pk.ciphertext_len(1).unwrap() as u64, pk.ciphertext_len(2).unwrap() as u64);
    let key = pk.to_bytes().len() as u64;

    let request = fx.request(1, &mut rng);
    let start = tokio::time::Instant::now();
    let answer = store.read_select(&request).await.unwrap();
    let took = start.elapsed();
    assert_eq!(fx.open(&answer), fx.plain[1]);
    let sent = u64::from(SLOTS) * len2;
    let answer_len = CHUNKS as u64 * len2;
    let up = key + sent + u64::from(SLOTS) * LinkConfig::ADDRESS_BYTES;
    let want = Duration::from_millis(10) + Duration::from_micros(100 * (up + answer_len));
    assert!(took.abs_diff(want) < Duration::from_millis(1), "{took:?} against {want:?}");
    let c = store.counts();
    let scanned = u64::from(SLOTS * fx.slot_len);
    assert_eq!(
        (c.select_requests, c.select_bytes_sent, c.select_bytes_scanned, c.select_bytes_read),
        (1, sent, scanned, answer_len)
    );
    assert_eq!((c.round_trips, c.bytes_up(), c.bytes_down()), (1, sent, answer_len));
    let trace = store.inner().take_trace();
    assert_eq!(trace.len(), 1);
    assert_eq!(trace[0].shape(), (TraceOp::ReadSelect, SLOTS as usize, sent + answer_len));
    assert_eq!(trace[0].cells, vec![CellId(2); SLOTS as usize]);
    assert_eq!(trace[0].ranges[1], (fx.slot_len, fx.slot_len));

    store.reset();
    let outer = fx.sk.encrypt_many(&[Integer::from(0), Integer::from(1)], 1, &mut rng).unwrap();
    let combined =
        CombinedSelect { groups: vec![fx.request(0, &mut rng), fx.request(2, &mut rng)], outer };
    let answer = store.read_select_combined(&combined).await.unwrap();
    let chunk = pk.plaintext_chunk_len(1).unwrap() as u64;
    let combined_len = answer_len.div_ceil(chunk) * len1;
    assert_eq!(answer.len() as u64, combined_len);
    let c = store.counts();
    assert_eq!(
        (c.select_combined_requests, c.select_bytes_sent, c.select_bytes_scanned),
        (1, 2 * sent + 2 * len1, 2 * scanned)
    );
    assert_eq!((c.select_bytes_read, c.round_trips), (combined_len, 1));
    let trace = store.inner().take_trace();
    assert_eq!(trace[0].op, TraceOp::ReadSelectCombined);
    assert_eq!(trace[0].groups, vec![SLOTS, SLOTS]);
    assert_eq!(trace[0].bytes, 2 * sent + 2 * len1 + combined_len);

    store.reset();
    let writes = [SelectWrite { request: fx.request(0, &mut rng), target: CellId(3) }];
    store.write_select(&writes).await.unwrap();
    let c = store.counts();
    assert_eq!(
        (c.select_write_requests, c.select_cells_written, c.select_bytes_sent, c.select_bytes_read),
        (1, 1, sent, 0)
    );
    let trace = store.inner().take_trace();
    assert_eq!(trace[0].shape(), (TraceOp::WriteSelect, SLOTS as usize, sent));
    assert_eq!((trace[0].groups.clone(), trace[0].targets.clone()), (vec![SLOTS], vec![CellId(3)]));
    let cell = store.read(&[CellId(3)]).await.unwrap().remove(0);
    assert_eq!(fx.open(&cell[..answer_len as usize]), fx.plain[0]);
}

#[tokio::test]
async fn faults_are_injected_into_selects() {
    let mut rng = ChaCha20Rng::seed_from_u64(32);
    let fx = Fixture::new(&mut rng);
    let inner = Arc::new(MemoryStore::new(fx.geometry()));
    inner.write(vec![(CellId(2), fx.cell(&mut rng))]).await.unwrap();
    let failing = FaultStore::new(
        Arc::clone(&inner),
        FaultConfig { error_rate: 1.0, ..FaultConfig::default() },
    );
    let err = failing.read_select(&fx.request(0, &mut rng)).await.unwrap_err();
    assert!(matches!(err, StoreError::Injected(_)) && err.is_retryable(), "{err:?}");
    let combined = CombinedSelect {
        groups: vec![fx.request(0, &mut rng)],
        outer: fx.sk.encrypt_many(&[Integer::from(1)], 1, &mut rng).unwrap(),
    };
    assert!(failing.read_select_combined(&combined).await.is_err());
    let writes = [SelectWrite { request: fx.request(1, &mut rng), target: CellId(0) }];
    assert!(failing.write_select(&writes).await.is_err());
    assert_eq!(
        inner.read(&[CellId(0)]).await.unwrap()[0],
        vec![0; fx.geometry().cell_size() as usize]
    );
    assert_eq!(failing.injected(), 3);

    // A lost acknowledgement: the select write happened, the caller hears an error.
    let lossy = FaultStore::new(
        Arc::clone(&inner),
        FaultConfig { lost_ack_rate: 1.0, ..FaultConfig::default() },
    );
    let err = lossy.write_select(&writes).await.unwrap_err();
    assert!(matches!(err, StoreError::Injected(_)), "{err:?}");
    let cell = inner.read(&[CellId(0)]).await.unwrap().remove(0);
    let answer_len = fx.sk.public().ciphertext_len(2).unwrap() * CHUNKS;
    assert_eq!(fx.open(&cell[..answer_len]), fx.plain[1]);
}
