//! The homomorphic-select capability: an encrypted unit vector picks exactly one slot's data out
//! of a bucket stored in a cell, and malformed requests fail whole.
#![cfg(feature = "select")]

use std::sync::Arc;

use blindfold_dj::{Ciphertext, Integer, SecretKey};
use blindfold_store::{
    ByteRange, CellId, FileStore, Geometry, MemoryStore, SelectRequest, SelectStore, Store,
    StoreError, SyncMode,
};
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
