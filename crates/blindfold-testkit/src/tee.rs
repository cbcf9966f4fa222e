//! Conformance checks for the [`TeeStore`] capability, run on a fresh store of [`geometry()`]
//! whose trusted component is a [`PlainTrusted`]: a stand-in that reads its tickets in the
//! clear. It exists only so the host side can be tested while the real enclave lives in
//! another crate; it protects nothing.
//!
//! Tickets of the stand-in: a query ticket is the target's index (`u32`, little-endian); an
//! eviction ticket is the permutation (`u32`s, little-endian), where the block at position `j`
//! moves to position `perm[j]`, as the enclave's sealed ones say.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use blindfold_store::{
    CellId, Geometry, Result, StoreError, TeeLayer, TeeRound, TeeStore, Trusted,
};

/// Cells of the store [`run_tee`] expects.
pub const CELL_COUNT: u64 = 32;
/// Bytes per cell of the store [`run_tee`] expects.
pub const CELL_SIZE: u32 = 24;

/// The geometry [`run_tee`] expects: [`CELL_COUNT`] cells of [`CELL_SIZE`] bytes.
pub fn geometry() -> Geometry {
    Geometry::new(CELL_COUNT, CELL_SIZE).expect("the TEE geometry is valid")
}

/// A plaintext stand-in for the trusted component (see the [module docs](self)). It counts its
/// calls and may sleep in each eviction, to make a round last.
#[derive(Debug, Default)]
pub struct PlainTrusted {
    evict_delay: Duration,
    queries: AtomicU64,
    evictions: AtomicU64,
}

impl PlainTrusted {
    /// A stand-in that answers at once.
    pub fn new() -> Self {
        Self::default()
    }

    /// A stand-in that sleeps `delay` (on its thread) in every eviction.
    pub fn slow(delay: Duration) -> Self {
        Self { evict_delay: delay, ..Self::default() }
    }

    /// Queries answered so far.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    /// Layers evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

fn refused(what: impl Into<String>) -> StoreError {
    StoreError::InvalidRequest(what.into())
}

/// The stand-in's query ticket for candidate `target`.
pub fn query_ticket(target: u32) -> Vec<u8> {
    target.to_le_bytes().to_vec()
}

/// The stand-in's eviction ticket for `perm`.
pub fn evict_ticket(perm: &[u32]) -> Vec<u8> {
    perm.iter().flat_map(|p| p.to_le_bytes()).collect()
}

impl Trusted for PlainTrusted {
    fn query(&self, candidates: &[Vec<u8>], ticket: &[u8]) -> Result<Vec<u8>> {
        let target: [u8; 4] = ticket.try_into().map_err(|_| refused("query ticket length"))?;
        let target = u32::from_le_bytes(target) as usize;
        let answer = candidates.get(target).ok_or_else(|| refused("query target out of range"))?;
        self.queries.fetch_add(1, Ordering::Relaxed);
        Ok(answer.clone())
    }

    fn evict(&self, blocks: &mut [Vec<u8>], ticket: &[u8]) -> Result<()> {
        if ticket.len() != 4 * blocks.len() {
            return Err(refused(format!(
                "an eviction ticket for {} blocks over {}",
                ticket.len() / 4,
                blocks.len()
            )));
        }
        let perm: Vec<usize> = ticket
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as usize)
            .collect();
        let mut out = vec![None; blocks.len()];
        for (j, &to) in perm.iter().enumerate() {
            let slot = out.get_mut(to).ok_or_else(|| refused("not a permutation"))?;
            if slot.replace(std::mem::take(&mut blocks[j])).is_some() {
                return Err(refused("not a permutation"));
            }
        }
        for (b, o) in blocks.iter_mut().zip(out) {
            *b = o.expect("a permutation fills every position");
        }
        std::thread::sleep(self.evict_delay);
        self.evictions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// What a round does to `cells` (the whole array, one buffer per cell), by the contract of
/// [`TeeStore::tee_evict`], with the stand-in's tickets read in the clear.
pub fn model_round(cells: &mut [Vec<u8>], round: &TeeRound) {
    let mut carry = round.incoming.clone();
    for layer in &round.layers {
        let mut buf: Vec<Vec<u8>> =
            layer.read.iter().map(|c| cells[c.0 as usize].clone()).collect();
        buf.append(&mut carry);
        PlainTrusted::new().evict(&mut buf, &layer.ticket).expect("a valid model round");
        carry = buf.split_off(layer.write.len());
        for (c, b) in layer.write.iter().zip(buf) {
            cells[c.0 as usize] = b;
        }
    }
}

/// A cell's worth of bytes naming `tag`.
pub fn block(tag: u8) -> Vec<u8> {
    (0..CELL_SIZE).map(|i| tag ^ (i as u8).wrapping_mul(31)).collect()
}

fn cells(ids: &[u64]) -> Vec<CellId> {
    ids.iter().copied().map(CellId).collect()
}

/// A layer of the stand-in reading and writing `read`/`write` with permutation `perm`.
pub fn layer(read: &[u64], write: &[u64], perm: &[u32]) -> TeeLayer {
    TeeLayer { read: cells(read), write: cells(write), ticket: evict_ticket(perm) }
}

/// A three-layer round over the cells [`run_tee`] writes: two incoming blocks; the second
/// layer writes other cells than it reads; the third reads a cell the first one writes.
pub fn sample_round() -> TeeRound {
    TeeRound {
        incoming: vec![block(100), block(101)],
        layers: vec![
            // 2 read + 2 carried: positions 0,1 ← cells 0,1; 2,3 ← incoming.
            layer(&[0, 1], &[0, 1], &[3, 2, 0, 1]),
            // 3 read + 2 carried.
            layer(&[2, 3, 4], &[10, 11, 12], &[4, 0, 3, 1, 2]),
            layer(&[1, 5], &[1, 5], &[1, 3, 2, 0]),
        ],
    }
}

fn fail(check: &str, msg: impl std::fmt::Display) -> ! {
    panic!("TEE store conformance check {check:?} failed: {msg}")
}

/// Runs every check on `store`, a fresh store of [`geometry()`] whose trusted component is a
/// [`PlainTrusted`] (in process or in a storage server).
pub async fn run_tee(store: &dyn TeeStore) {
    assert_eq!(store.geometry(), geometry(), "run_tee needs a store of testkit::tee::geometry()");
    let mut model: Vec<Vec<u8>> = (0..CELL_COUNT).map(|c| block(c as u8)).collect();
    let all: Vec<(CellId, Vec<u8>)> =
        model.iter().enumerate().map(|(c, b)| (CellId(c as u64), b.clone())).collect();
    store.write(all).await.unwrap_or_else(|e| fail("setup", e));
    let everything: Vec<CellId> = (0..CELL_COUNT).map(CellId).collect();

    let check = "tee_query answers the chosen candidate";
    for target in 0..3u32 {
        let answer = store
            .tee_query(&cells(&[7, 3, 9]), &query_ticket(target))
            .await
            .unwrap_or_else(|e| fail(check, e));
        let want = [7u64, 3, 9][target as usize];
        if answer != model[want as usize] {
            fail(check, format!("target {target} answered with another cell"));
        }
    }

    let check = "tee_evict moves blocks as the round says";
    let round = sample_round();
    store.tee_evict(&round).await.unwrap_or_else(|e| fail(check, e));
    model_round(&mut model, &round);
    let now = store.read(&everything).await.unwrap_or_else(|e| fail(check, e));
    for (c, (got, want)) in now.iter().zip(&model).enumerate() {
        if got != want {
            fail(check, format!("cell {c} holds other bytes than the model's"));
        }
    }

    let check = "a trusted component's refusal is an error";
    let mut bad = sample_round();
    bad.layers[0].ticket = evict_ticket(&[0, 0, 1, 2]);
    match store.tee_evict(&bad).await {
        Err(StoreError::InvalidRequest(_)) => {}
        other => fail(check, format!("{other:?}")),
    }
    match store.tee_query(&cells(&[1]), &query_ticket(1)).await {
        Err(StoreError::InvalidRequest(_)) => {}
        other => fail(check, format!("{other:?}")),
    }

    let check = "malformed requests fail whole, before writing";
    let before = store.read(&everything).await.unwrap_or_else(|e| fail(check, e));
    for (what, round) in malformed_rounds() {
        match store.tee_evict(&round).await {
            Err(StoreError::InvalidRequest(_) | StoreError::OutOfRange { .. }) => {}
            other => fail(check, format!("{what}: {other:?}")),
        }
    }
    for (what, ids, ticket) in malformed_queries() {
        match store.tee_query(&ids, &ticket).await {
            Err(StoreError::InvalidRequest(_) | StoreError::OutOfRange { .. }) => {}
            other => fail(check, format!("{what}: {other:?}")),
        }
    }
    let after = store.read(&everything).await.unwrap_or_else(|e| fail(check, e));
    if before != after {
        fail(check, "a refused request changed the store");
    }
}

/// Rounds every store must refuse before touching anything, each with what is wrong with it.
/// The first layer of each is well-formed, so a store that checked lazily would write it.
pub fn malformed_rounds() -> Vec<(&'static str, TeeRound)> {
    let good = || layer(&[0, 1], &[0, 1], &[0, 1, 2]);
    let round = |layers: Vec<TeeLayer>| TeeRound { incoming: vec![block(9)], layers };
    let mut cases = vec![
        ("no layers", round(Vec::new())),
        ("a cell out of range", round(vec![good(), layer(&[2, CELL_COUNT], &[2, 3], &[0, 1, 2])])),
        (
            "a written cell out of range",
            round(vec![good(), layer(&[2, 3], &[2, u64::MAX], &[0, 1, 2])]),
        ),
        ("more cells read than written", round(vec![good(), layer(&[2, 3], &[2], &[0, 1, 2])])),
        ("more cells written than read", round(vec![good(), layer(&[2], &[2, 3], &[0, 1])])),
        ("too many layers", round((0..=blindfold_store::MAX_TEE_LAYERS).map(|_| good()).collect())),
        (
            "a ticket too long",
            round(vec![
                good(),
                TeeLayer { ticket: vec![0; blindfold_store::MAX_TEE_TICKET + 1], ..good() },
            ]),
        ),
        (
            "a layer buffer too large",
            round(vec![
                good(),
                TeeLayer {
                    read: vec![CellId(2); blindfold_store::MAX_TEE_CELLS],
                    write: vec![CellId(2); blindfold_store::MAX_TEE_CELLS],
                    ticket: Vec::new(),
                },
            ]),
        ),
    ];
    let mut short = round(vec![good()]);
    short.incoming[0].pop();
    cases.push(("an incoming block shorter than a cell", short));
    let mut long = round(vec![good()]);
    long.incoming[0].push(0);
    cases.push(("an incoming block longer than a cell", long));
    let mut many = round(vec![good()]);
    many.incoming = vec![block(1); blindfold_store::MAX_TEE_CELLS + 1];
    cases.push(("too many incoming blocks", many));
    cases
}

/// Queries every store must refuse, each with what is wrong with it.
pub fn malformed_queries() -> Vec<(&'static str, Vec<CellId>, Vec<u8>)> {
    vec![
        ("no cells", Vec::new(), query_ticket(0)),
        ("a cell out of range", cells(&[1, CELL_COUNT + 5]), query_ticket(0)),
        ("too many cells", vec![CellId(1); blindfold_store::MAX_TEE_CELLS + 1], query_ticket(0)),
        ("a ticket too long", cells(&[1]), vec![0; blindfold_store::MAX_TEE_TICKET + 1]),
    ]
}
