//! Conformance checks for the [`SelectStore`] capability (feature `select`), run on a fresh
//! store of [`geometry()`]: every operation against what the secret key says the answer must
//! hold, and malformed requests failing whole.
//!
//! The checks use a 256-bit Damgård–Jurik key (fast, and far too small for real data) and two
//! kinds of slot: raw bytes selected at layer 1, and layer-1 ciphertexts selected at layer 2 (an
//! onion, as Onion ORAM stores its blocks).

use std::sync::Arc;

use blindfold_dj::{Ciphertext, Integer, PublicKey, SecretKey};
use blindfold_store::{
    ByteRange, CellId, CombinedSelect, Geometry, SelectRequest, SelectStore, SelectWrite,
    StoreError,
};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

/// Cells of the store [`run_select`] expects.
pub const CELL_COUNT: u64 = 8;
/// Bytes per cell of the store [`run_select`] expects.
pub const CELL_SIZE: u32 = 512;

/// The geometry [`run_select`] expects: [`CELL_COUNT`] cells of [`CELL_SIZE`] bytes.
pub fn geometry() -> Geometry {
    Geometry::new(CELL_COUNT, CELL_SIZE).expect("the select geometry is valid")
}

/// Modulus size of the test key.
const KEY_BITS: u32 = 256;
/// Raw slots: cell [`RAW_CELL`] holds [`RAW_SLOTS`] slots of [`CHUNKS`] chunks of
/// `plaintext_chunk_len(1)` bytes.
const RAW_CELL: u64 = 1;
const RAW_SLOTS: u32 = 3;
/// Onion slots: cell [`ONION_CELL`] holds [`ONION_SLOTS`] slots of [`CHUNKS`] layer-1
/// ciphertexts.
const ONION_CELL: u64 = 2;
const ONION_SLOTS: u32 = 2;
const CHUNKS: usize = 2;

fn fail(check: &str, msg: impl std::fmt::Display) -> ! {
    panic!("select store conformance check {check:?} failed: {msg}")
}

/// The key, the data written and how to read answers.
struct Fixture {
    sk: SecretKey,
    pk: Arc<PublicKey>,
    rng: ChaCha20Rng,
    /// Bytes of a raw chunk (`plaintext_chunk_len(1)`).
    raw_chunk: u32,
    /// Bytes of a layer-1 ciphertext (an onion chunk).
    onion_chunk: u32,
    /// The raw slots' bytes.
    raw: Vec<Vec<u8>>,
    /// The onion slots' plaintexts.
    onion: Vec<Vec<Integer>>,
}

impl Fixture {
    fn new(seed: u64) -> Self {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let sk = SecretKey::generate(KEY_BITS, &mut rng).unwrap_or_else(|e| fail("setup", e));
        let pk = Arc::new(sk.public().clone());
        let raw_chunk = pk.plaintext_chunk_len(1).unwrap() as u32;
        let onion_chunk = pk.ciphertext_len(1).unwrap() as u32;
        let raw = (0..RAW_SLOTS)
            .map(|_| {
                let mut b = vec![0u8; raw_chunk as usize * CHUNKS];
                rng.fill_bytes(&mut b);
                b
            })
            .collect();
        let onion = (0..ONION_SLOTS)
            .map(|i| (0..CHUNKS).map(|j| Integer::from(1000 * i + j as u32 + 7)).collect())
            .collect();
        Self { sk, pk, rng, raw_chunk, onion_chunk, raw, onion }
    }

    fn raw_slot_len(&self) -> u32 {
        self.raw_chunk * CHUNKS as u32
    }

    fn onion_slot_len(&self) -> u32 {
        self.onion_chunk * CHUNKS as u32
    }

    /// The cells holding the slots.
    fn cells(&mut self) -> Vec<(CellId, Vec<u8>)> {
        let mut raw_cell = self.raw.concat();
        raw_cell.resize(CELL_SIZE as usize, 0);
        let mut onion_cell = Vec::new();
        for slot in &self.onion {
            for c in self.sk.encrypt_many(slot, 1, &mut self.rng).unwrap() {
                onion_cell.extend_from_slice(&self.pk.ciphertext_to_bytes(&c));
            }
        }
        // Spare bytes that are no layer-1 plaintext, for the out-of-range check.
        onion_cell.resize(CELL_SIZE as usize, 0xee);
        vec![(CellId(RAW_CELL), raw_cell), (CellId(ONION_CELL), onion_cell)]
    }

    /// An encrypted unit vector of `len` elements at `layer`, picking `pick`.
    fn selector(&mut self, len: u32, pick: u32, layer: u32) -> Vec<Ciphertext> {
        let bits: Vec<Integer> = (0..len).map(|i| Integer::from(u32::from(i == pick))).collect();
        self.sk.encrypt_many(&bits, layer, &mut self.rng).unwrap()
    }

    fn raw_request(&mut self, pick: u32) -> SelectRequest {
        let len = self.raw_slot_len();
        SelectRequest {
            public_key: Arc::clone(&self.pk),
            selector: self.selector(RAW_SLOTS, pick, 1),
            ranges: (0..RAW_SLOTS)
                .map(|i| ByteRange { cell: CellId(RAW_CELL), offset: i * len, len })
                .collect(),
            chunk_len: self.raw_chunk,
        }
    }

    fn onion_request(&mut self, pick: u32) -> SelectRequest {
        let len = self.onion_slot_len();
        SelectRequest {
            public_key: Arc::clone(&self.pk),
            selector: self.selector(ONION_SLOTS, pick, 2),
            ranges: (0..ONION_SLOTS)
                .map(|i| ByteRange { cell: CellId(ONION_CELL), offset: i * len, len })
                .collect(),
            chunk_len: self.onion_chunk,
        }
    }

    /// Decrypts layer-1 ciphertexts back into `chunk`-byte plaintexts.
    fn open_layer1(&self, check: &str, answer: &[u8], chunk: u32) -> Vec<u8> {
        let clen = self.onion_chunk as usize;
        if !answer.len().is_multiple_of(clen) {
            fail(check, format!("an answer of {} bytes is no run of ciphertexts", answer.len()));
        }
        let mut out = Vec::new();
        for c in answer.chunks(clen) {
            let c = self.pk.ciphertext_from_bytes(1, c).unwrap_or_else(|e| fail(check, e));
            let m = self.sk.decrypt(&c);
            out.extend(
                self.pk.plaintext_to_bytes(&m, chunk as usize).unwrap_or_else(|e| fail(check, e)),
            );
        }
        out
    }

    /// Peels layer-2 ciphertexts down to their innermost plaintexts.
    fn open_layer2(&self, check: &str, answer: &[u8]) -> Vec<Integer> {
        let clen = self.pk.ciphertext_len(2).unwrap();
        if answer.len() != clen * CHUNKS {
            fail(
                check,
                format!("an answer of {} bytes, not {CHUNKS} layer-2 ciphertexts", answer.len()),
            );
        }
        answer
            .chunks(clen)
            .map(|b| {
                let c = self.pk.ciphertext_from_bytes(2, b).unwrap_or_else(|e| fail(check, e));
                self.sk.peel_all(&c, 1).unwrap_or_else(|e| fail(check, e))
            })
            .collect()
    }
}

/// A well-formed [`SelectStore::read_select`] request over the raw slots [`run_select`] writes,
/// picking slot `pick` (below 3): for tests that break it or send it by other means. Its answer
/// is two layer-1 ciphertexts (128 bytes) under the check's own key.
pub fn sample_request(pick: u32) -> SelectRequest {
    Fixture::new(SEED).raw_request(pick)
}

/// Seed of the key and data of [`run_select`].
const SEED: u64 = 0x5e1ec7;

/// Whether `result` is a refusal of a malformed request (not worth retrying).
fn refused<T: std::fmt::Debug>(check: &str, what: &str, result: Result<T, StoreError>) {
    match result {
        Err(
            e @ (StoreError::InvalidRequest(_)
            | StoreError::RangeOutOfCell { .. }
            | StoreError::OutOfRange { .. }),
        ) if !e.is_retryable() => {}
        other => fail(check, format!("{what}: expected a refusal, got {other:?}")),
    }
}

/// Checks every contract of [`SelectStore`] on `store`, a fresh store of [`geometry()`] (it
/// writes cells 1, 2, 5 and 6). Generates its own 256-bit key.
pub async fn run_select(store: &dyn SelectStore) {
    if store.geometry() != geometry() {
        fail("setup", format!("the store has {:?}, not {:?}", store.geometry(), geometry()));
    }
    let mut fx = Fixture::new(SEED);
    let cells = fx.cells();
    store.write(cells).await.unwrap_or_else(|e| fail("setup", e));

    let check = "read_select picks exactly the chosen raw slot";
    for pick in 0..RAW_SLOTS {
        let r = fx.raw_request(pick);
        let answer = store.read_select(&r).await.unwrap_or_else(|e| fail(check, e));
        let want_len = fx.onion_chunk as usize * CHUNKS;
        if answer.len() != want_len {
            fail(check, format!("{} bytes, not {want_len}", answer.len()));
        }
        if fx.open_layer1(check, &answer, fx.raw_chunk) != fx.raw[pick as usize] {
            fail(check, format!("slot {pick} came back as other bytes"));
        }
    }

    let check = "read_select over onion slots adds a layer";
    for pick in 0..ONION_SLOTS {
        let r = fx.onion_request(pick);
        let answer = store.read_select(&r).await.unwrap_or_else(|e| fail(check, e));
        if fx.open_layer2(check, &answer) != fx.onion[pick as usize] {
            fail(check, format!("slot {pick} came back as other values"));
        }
    }

    let check = "read_select_combined returns the chosen group's answer, padded";
    for (group, pick) in [(0u32, 2u32), (1, 1), (1, 0)] {
        let groups = vec![fx.raw_request(pick % RAW_SLOTS), fx.onion_request(pick % ONION_SLOTS)];
        let outer = fx.selector(2, group, 1);
        let answer = store
            .read_select_combined(&CombinedSelect { groups, outer })
            .await
            .unwrap_or_else(|e| fail(check, e));
        // The longest group answer is the onion group's (layer-2 ciphertexts), padded to whole
        // layer-1 chunks.
        let longest = fx.pk.ciphertext_len(2).unwrap() * CHUNKS;
        let padded_len = longest.div_ceil(fx.raw_chunk as usize) * fx.raw_chunk as usize;
        let padded = fx.open_layer1(check, &answer, fx.raw_chunk);
        if padded.len() != padded_len {
            fail(check, format!("{} padded bytes, not {padded_len}", padded.len()));
        }
        let inner_len = if group == 0 { fx.onion_chunk as usize * CHUNKS } else { longest };
        if padded[inner_len..].iter().any(|&b| b != 0) {
            fail(check, "the padding is not zeros");
        }
        let ok = if group == 0 {
            fx.open_layer1(check, &padded[..inner_len], fx.raw_chunk)
                == fx.raw[(pick % RAW_SLOTS) as usize]
        } else {
            fx.open_layer2(check, &padded[..inner_len]) == fx.onion[(pick % ONION_SLOTS) as usize]
        };
        if !ok {
            fail(check, format!("group {group}, slot {pick} came back as something else"));
        }
    }

    let check = "write_select keeps answers in order";
    // The first answer (layer-1 ciphertexts of raw slot 1) lands in cell 5; the second select
    // reads it back as an onion slot next to onion slot 0 and picks it, into cell 6.
    let first = fx.raw_request(1);
    let slot = fx.onion_slot_len();
    let second = SelectRequest {
        public_key: Arc::clone(&fx.pk),
        selector: fx.selector(2, 0, 2),
        ranges: vec![
            ByteRange { cell: CellId(5), offset: 0, len: slot },
            ByteRange { cell: CellId(ONION_CELL), offset: 0, len: slot },
        ],
        chunk_len: fx.onion_chunk,
    };
    let writes = [
        SelectWrite { request: first, target: CellId(5) },
        SelectWrite { request: second, target: CellId(6) },
    ];
    store.write_select(&writes).await.unwrap_or_else(|e| fail(check, e));
    let back = store.read(&[CellId(5), CellId(6)]).await.unwrap_or_else(|e| fail(check, e));
    let (c5, c6) = (&back[0], &back[1]);
    if c5[slot as usize..].iter().any(|&b| b != 0)
        || fx.open_layer1(check, &c5[..slot as usize], fx.raw_chunk) != fx.raw[1]
    {
        fail(check, "cell 5 does not hold the first answer, zero-padded");
    }
    let onion_answer = fx.pk.ciphertext_len(2).unwrap() * CHUNKS;
    let inner: Vec<u8> = fx
        .open_layer2(check, &c6[..onion_answer])
        .iter()
        .flat_map(|m| fx.pk.plaintext_to_bytes(m, fx.raw_chunk as usize).unwrap())
        .collect();
    if c6[onion_answer..].iter().any(|&b| b != 0) || inner != fx.raw[1] {
        fail(check, "cell 6 does not hold the second answer over the first one");
    }
    let check = "write_select of nothing";
    store.write_select(&[]).await.unwrap_or_else(|e| fail(check, e));

    let check = "malformed read_select fails whole";
    let good = fx.raw_request(0);
    let mut cases: Vec<(&str, SelectRequest)> = Vec::new();
    let mut r = good.clone();
    r.selector.pop();
    cases.push(("a selector shorter than the ranges", r));
    let mut r = good.clone();
    r.selector.clear();
    r.ranges.clear();
    cases.push(("an empty select", r));
    let mut r = good.clone();
    r.ranges[1].len -= 1;
    cases.push(("ranges of different lengths", r));
    let mut r = good.clone();
    r.chunk_len += 1;
    cases.push(("a length that is no multiple of the chunk", r));
    let mut r = good.clone();
    r.chunk_len = 0;
    cases.push(("a zero chunk length", r));
    let mut r = good.clone();
    r.selector[1] = fx.selector(1, 0, 2).remove(0);
    cases.push(("a selector of mixed layers", r));
    let mut r = good.clone();
    r.ranges[2].offset = CELL_SIZE - 4;
    cases.push(("a range past the end of its cell", r));
    let mut r = good.clone();
    r.ranges[0].cell = CellId(CELL_COUNT);
    cases.push(("a cell out of range", r));
    // Layer-1 ciphertexts (and the 0xee tail) read as layer-1 plaintexts: not below n.
    let mut r = fx.onion_request(0);
    r.selector = fx.selector(ONION_SLOTS, 0, 1);
    cases.push(("chunks outside the plaintext space", r));
    for (what, r) in &cases {
        refused(check, what, store.read_select(r).await);
    }

    let check = "malformed read_select_combined fails whole";
    let outer = fx.selector(2, 0, 1);
    let groups = vec![fx.raw_request(0), fx.onion_request(0)];
    let other_key = {
        let mut rng = ChaCha20Rng::seed_from_u64(0x07e4);
        let sk = SecretKey::generate(KEY_BITS, &mut rng).unwrap();
        let mut g = fx.raw_request(0);
        g.public_key = Arc::new(sk.public().clone());
        g.selector = sk.encrypt_many(&[1u32, 0, 0].map(Integer::from), 1, &mut rng).unwrap();
        g
    };
    let combined_cases = [
        (
            "an outer selector shorter than the groups",
            CombinedSelect { groups: groups.clone(), outer: outer[..1].to_vec() },
        ),
        ("no groups", CombinedSelect { groups: Vec::new(), outer: Vec::new() }),
        (
            "a malformed group",
            CombinedSelect {
                groups: vec![groups[0].clone(), cases[2].1.clone()],
                outer: outer.clone(),
            },
        ),
        (
            "groups under two keys",
            CombinedSelect { groups: vec![groups[0].clone(), other_key], outer: outer.clone() },
        ),
        (
            "an outer selector of mixed layers",
            CombinedSelect {
                groups: groups.clone(),
                outer: vec![outer[0].clone(), fx.selector(1, 0, 2).remove(0)],
            },
        ),
    ];
    for (what, r) in &combined_cases {
        refused(check, what, store.read_select_combined(r).await);
    }

    let check = "malformed write_select fails whole, before writing";
    let before = store.read(&[CellId(5), CellId(6)]).await.unwrap_or_else(|e| fail(check, e));
    let fresh = |target| SelectWrite { request: good.clone(), target };
    let big = SelectWrite {
        // A whole cell of 64-byte chunks selected at layer 2: eight 96-byte ciphertexts.
        request: SelectRequest {
            public_key: Arc::clone(&fx.pk),
            selector: fx.selector(1, 0, 2),
            ranges: vec![ByteRange { cell: CellId(7), offset: 0, len: 8 * fx.onion_chunk }],
            chunk_len: fx.onion_chunk,
        },
        target: CellId(6),
    };
    let write_cases = [
        ("a target out of range", vec![fresh(CellId(5)), fresh(CellId(CELL_COUNT))]),
        (
            "a malformed select",
            vec![fresh(CellId(5)), SelectWrite { request: cases[0].1.clone(), target: CellId(6) }],
        ),
        ("an answer longer than a cell", vec![fresh(CellId(5)), big]),
    ];
    for (what, w) in &write_cases {
        refused(check, what, store.write_select(w).await);
    }
    let after = store.read(&[CellId(5), CellId(6)]).await.unwrap_or_else(|e| fail(check, e));
    if after != before {
        fail(check, "a refused batch changed its targets");
    }

    let check = "a good request still works after the refusals";
    let answer = store.read_select(&good).await.unwrap_or_else(|e| fail(check, e));
    if fx.open_layer1(check, &answer, fx.raw_chunk) != fx.raw[0] {
        fail(check, "slot 0 came back as other bytes");
    }
}
