//! The store conformance suite: one set of checks that every [`Store`] backend and wrapper
//! must pass.
//!
//! ```
//! use blindfold_store::{CountingStore, MemoryStore};
//! use blindfold_testkit::conformance;
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = CountingStore::new(MemoryStore::new(conformance::geometry()));
//! conformance::run(&store).await;
//! assert!(store.counts().round_trips > 0); // the caller still has its wrapper
//! # });
//! ```
//!
//! [`run`] takes a fresh, never-written store of [`geometry()`] and checks every contract in
//! the [`Store`] docs against a model of what the store should hold. Each failed check panics
//! with a message naming the check (`store conformance check "…" failed: …`).
//!
//! The suite borrows the store (`&dyn Store`), so the caller keeps its wrapper and can inspect
//! it afterwards. Concurrency is checked by running many workers as futures on one task
//! (`tokio::join!`), interleaved at every request, as an async caller with several requests in
//! flight uses a store; backends that hand work to threads (the file store's blocking pool)
//! then really run the requests in parallel.

use blindfold_store::{ByteRange, CellId, Geometry, Store, StoreError};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Number of cells in the conformance geometry (odd, to catch off-by-one errors).
pub const CELL_COUNT: u64 = 97;
/// Bytes per cell in the conformance geometry (not a power of two, for the same reason).
pub const CELL_SIZE: u32 = 80;
/// Number of concurrent workers in the concurrency check.
const WORKERS: u64 = 8;

/// The geometry [`run`] expects: [`CELL_COUNT`] cells of [`CELL_SIZE`] bytes.
pub fn geometry() -> Geometry {
    Geometry::new(CELL_COUNT, CELL_SIZE).expect("the conformance geometry is valid")
}

fn fail(check: &str, msg: impl std::fmt::Display) -> ! {
    panic!("store conformance check {check:?} failed: {msg}")
}

/// What the store should hold, and a source of cell contents.
struct Model {
    cells: Vec<Vec<u8>>,
    rng: ChaCha8Rng,
}

impl Model {
    fn new() -> Self {
        Self {
            cells: vec![vec![0u8; CELL_SIZE as usize]; CELL_COUNT as usize],
            rng: ChaCha8Rng::seed_from_u64(0x5eed_c0de),
        }
    }

    /// Fresh random contents for one cell (never all zero).
    fn contents(&mut self) -> Vec<u8> {
        let mut buf = vec![0u8; CELL_SIZE as usize];
        self.rng.fill_bytes(&mut buf);
        buf[0] |= 1;
        buf
    }

    fn cell(&self, c: u64) -> &[u8] {
        &self.cells[c as usize]
    }

    fn set(&mut self, c: u64, data: &[u8]) {
        self.cells[c as usize] = data.to_vec();
    }
}

async fn read(store: &dyn Store, check: &str, cells: &[u64]) -> Vec<Vec<u8>> {
    let ids: Vec<CellId> = cells.iter().map(|&c| CellId(c)).collect();
    let out = store
        .read(&ids)
        .await
        .unwrap_or_else(|e| fail(check, format!("read of {ids:?} returned an error: {e}")));
    if out.len() != ids.len() {
        fail(check, format!("read of {} cells returned {} buffers", ids.len(), out.len()));
    }
    out
}

async fn read_ranges(store: &dyn Store, check: &str, ranges: &[ByteRange]) -> Vec<Vec<u8>> {
    let out = store.read_ranges(ranges).await.unwrap_or_else(|e| {
        fail(check, format!("read_ranges of {ranges:?} returned an error: {e}"))
    });
    if out.len() != ranges.len() {
        fail(
            check,
            format!("read_ranges of {} ranges returned {} buffers", ranges.len(), out.len()),
        );
    }
    out
}

async fn write(store: &dyn Store, check: &str, model: &mut Model, cells: Vec<(u64, Vec<u8>)>) {
    let batch: Vec<(CellId, Vec<u8>)> =
        cells.iter().map(|(c, d)| (CellId(*c), d.clone())).collect();
    store.write(batch).await.unwrap_or_else(|e| {
        let ids: Vec<u64> = cells.iter().map(|(c, _)| *c).collect();
        fail(check, format!("write of cells {ids:?} returned an error: {e}"))
    });
    for (c, d) in &cells {
        model.set(*c, d);
    }
}

/// Checks that `cells` read back as the model says, one batch, in order.
async fn expect_cells(store: &dyn Store, check: &str, model: &Model, cells: &[u64]) {
    let got = read(store, check, cells).await;
    let what = if cells.len() > 12 {
        format!("a read of {} cells", cells.len())
    } else {
        format!("a read of {cells:?}")
    };
    for (i, (&c, data)) in cells.iter().zip(&got).enumerate() {
        if data.as_slice() != model.cell(c) {
            fail(
                check,
                format!(
                    "entry {i} of {what} (cell {c}) is {}, expected {}",
                    show(data),
                    show(model.cell(c))
                ),
            );
        }
    }
}

/// Checks that the whole store reads back as the model says.
async fn expect_model(store: &dyn Store, check: &str, model: &Model) {
    let all: Vec<u64> = (0..CELL_COUNT).collect();
    expect_cells(store, check, model, &all).await;
}

/// Checks that `ranges` read back as slices of the model, one batch, in order.
async fn expect_ranges(store: &dyn Store, check: &str, model: &Model, ranges: &[(u64, u32, u32)]) {
    let req: Vec<ByteRange> =
        ranges.iter().map(|&(c, offset, len)| ByteRange { cell: CellId(c), offset, len }).collect();
    let got = read_ranges(store, check, &req).await;
    for (i, (&(c, off, len), data)) in ranges.iter().zip(&got).enumerate() {
        let want = &model.cell(c)[off as usize..(off + len) as usize];
        if data.as_slice() != want {
            fail(
                check,
                format!(
                    "range {i} (cell {c}, offset {off}, len {len}) is {}, expected {}",
                    show(data),
                    show(want)
                ),
            );
        }
    }
}

/// A short description of a buffer for failure messages.
fn show(data: &[u8]) -> String {
    let head: Vec<String> = data.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{} bytes [{}{}]", data.len(), head.join(" "), if data.len() > 8 { " …" } else { "" })
}

/// Checks that `result` is an error matching `expected` that is not retryable.
fn expect_error<T>(
    check: &str,
    what: &str,
    result: Result<T, StoreError>,
    expected: &str,
    matches: fn(&StoreError) -> bool,
) {
    match result {
        Ok(_) => fail(check, format!("{what} succeeded, expected a {expected} error")),
        Err(e) if !matches(&e) => {
            fail(check, format!("{what} failed with {e:?}, expected {expected}"))
        }
        Err(e) if e.is_retryable() => {
            fail(check, format!("{what} failed with {e:?}, which claims to be retryable"))
        }
        Err(_) => {}
    }
}

fn is_out_of_range(e: &StoreError) -> bool {
    matches!(e, StoreError::OutOfRange { .. })
}

fn is_range_out_of_cell(e: &StoreError) -> bool {
    matches!(e, StoreError::RangeOutOfCell { .. })
}

fn is_wrong_cell_size(e: &StoreError) -> bool {
    matches!(e, StoreError::WrongCellSize { .. })
}

fn range(c: u64, offset: u32, len: u32) -> ByteRange {
    ByteRange { cell: CellId(c), offset, len }
}

/// Runs every check on `store`, which must be fresh (never written) and of [`geometry()`].
///
/// Panics, naming the check, at the first contract the store breaks. Needs a tokio runtime
/// with time and the blocking pool available (any `#[tokio::test]` runtime).
pub async fn run(store: &dyn Store) {
    let size = CELL_SIZE;
    let last = CELL_COUNT - 1;
    let mut model = Model::new();

    // --- shape and the empty store -------------------------------------------------------
    let check = "geometry";
    if store.geometry() != geometry() {
        fail(
            check,
            format!("the store has {:?}, the suite needs {:?}", store.geometry(), geometry()),
        );
    }

    let check = "fresh cells read as zeros";
    expect_model(store, check, &model).await;
    expect_cells(store, check, &model, &[last, 0, last]).await;
    expect_ranges(store, check, &model, &[(0, 0, size), (last, size - 3, 3), (40, 7, 9)]).await;

    let check = "empty batches";
    let got =
        store.read(&[]).await.unwrap_or_else(|e| fail(check, format!("read(&[]) failed: {e}")));
    if !got.is_empty() {
        fail(check, format!("read(&[]) returned {} buffers", got.len()));
    }
    let got = store
        .read_ranges(&[])
        .await
        .unwrap_or_else(|e| fail(check, format!("read_ranges(&[]) failed: {e}")));
    if !got.is_empty() {
        fail(check, format!("read_ranges(&[]) returned {} buffers", got.len()));
    }
    store
        .write(Vec::new())
        .await
        .unwrap_or_else(|e| fail(check, format!("write(vec![]) failed: {e}")));
    expect_model(store, check, &model).await;

    // --- writes and reads ----------------------------------------------------------------
    let check = "write then read round trip";
    let cells = [0, 1, 5, 50, last];
    let batch: Vec<(u64, Vec<u8>)> = cells.iter().map(|&c| (c, model.contents())).collect();
    write(store, check, &mut model, batch).await;
    for &c in &cells {
        expect_cells(store, check, &model, &[c]).await;
    }
    expect_cells(store, check, &model, &cells).await;

    let check = "overwrite replaces a cell";
    let data = model.contents();
    write(store, check, &mut model, vec![(5, data)]).await;
    expect_cells(store, check, &model, &[5]).await;

    let check = "batch order is preserved";
    expect_cells(store, check, &model, &[50, 0, last, 3, 1, 5, 2]).await;
    let reversed: Vec<u64> = (0..CELL_COUNT).rev().collect();
    expect_cells(store, check, &model, &reversed).await;

    let check = "duplicate cells in a read batch";
    expect_cells(store, check, &model, &[5, 5, 0, 5, 3, 3]).await;

    let check = "the last of duplicate writes wins";
    let (a, x, b) = (model.contents(), model.contents(), model.contents());
    write(store, check, &mut model, vec![(7, a), (8, x), (7, b)]).await;
    let (a, b, c) = (model.contents(), model.contents(), model.contents());
    write(store, check, &mut model, vec![(9, a), (9, b), (9, c)]).await;
    expect_cells(store, check, &model, &[7, 8, 9]).await;

    // Backends may join adjacent cells into one request (the file store does): runs that
    // rise, fall, repeat a cell and reach the last cell must all come back cell by cell.
    let check = "runs of adjacent cells";
    let order = [20, 21, 22, 23, 30, 24, 25, 22, 60, 61, 62, 61, last - 1, last];
    let batch: Vec<(u64, Vec<u8>)> = order.iter().map(|&c| (c, model.contents())).collect();
    write(store, check, &mut model, batch).await;
    expect_cells(store, check, &model, &[19, 20, 21, 22, 23, 24, 25, 26]).await;
    expect_cells(store, check, &model, &[62, 61, 60, 60, 61, 62, 63, last - 1, last]).await;
    let all: Vec<u64> = (0..CELL_COUNT).collect();
    expect_cells(store, check, &model, &all).await;

    // Shared buffers (`write_shared`): the same cells as an owned write, the caller keeping
    // its buffers; runs, duplicates (the last wins) and a buffer the caller no longer holds.
    let check = "shared writes";
    let order = [40, 41, 42, 3, 41, 70, last];
    let batch: Vec<(u64, Vec<u8>)> = order.iter().map(|&c| (c, model.contents())).collect();
    let shared: Vec<(CellId, std::sync::Arc<Vec<u8>>)> =
        batch.iter().map(|(c, d)| (CellId(*c), std::sync::Arc::new(d.clone()))).collect();
    let kept = shared.clone();
    store.write_shared(shared).await.unwrap_or_else(|e| {
        fail(check, format!("write_shared of cells {order:?} returned an error: {e}"))
    });
    for (c, d) in &batch {
        model.set(*c, d);
    }
    for ((_, sent), (_, d)) in kept.iter().zip(&batch) {
        if sent.as_slice() != d.as_slice() {
            fail(check, "write_shared changed a buffer the caller shares".to_owned());
        }
    }
    drop(kept);
    expect_cells(store, check, &model, &[39, 40, 41, 42, 43, 3, 70, last]).await;
    let data = model.contents();
    store
        .write_shared(vec![(CellId(3), std::sync::Arc::new(data.clone()))])
        .await
        .unwrap_or_else(|e| fail(check, format!("write_shared of a sole buffer failed: {e}")));
    model.set(3, &data);
    expect_cells(store, check, &model, &[3, 40]).await;

    let check = "ranged reads";
    for cell in [50, 3, last] {
        expect_ranges(
            store,
            check,
            &model,
            &[
                (cell, 0, 10),       // start
                (cell, 17, 23),      // middle
                (cell, size - 9, 9), // end
                (cell, 0, 0),        // empty at the start
                (cell, size, 0),     // empty at the very end
                (cell, 31, 0),       // empty in the middle
                (cell, 0, size),     // the whole cell
                (cell, size - 1, 1), // last byte
            ],
        )
        .await;
    }
    expect_ranges(store, check, &model, &[(50, 4, 4), (0, 60, 20), (50, 4, 4), (3, 0, 1)]).await;

    // --- invalid requests fail whole and change nothing ----------------------------------
    let check = "out-of-range cell";
    expect_error(
        check,
        "read of cell_count",
        store.read(&[CellId(CELL_COUNT)]).await,
        "OutOfRange",
        is_out_of_range,
    );
    expect_error(
        check,
        "read of [0, 1, cell_count]",
        store.read(&[CellId(0), CellId(1), CellId(CELL_COUNT)]).await,
        "OutOfRange",
        is_out_of_range,
    );
    expect_error(
        check,
        "read of u64::MAX",
        store.read(&[CellId(u64::MAX)]).await,
        "OutOfRange",
        is_out_of_range,
    );
    expect_error(
        check,
        "read_ranges of a cell past the end",
        store.read_ranges(&[range(0, 0, 1), range(CELL_COUNT, 0, 1)]).await,
        "OutOfRange",
        is_out_of_range,
    );
    let good = model.contents();
    expect_error(
        check,
        "write of [(10, ok), (cell_count, ok)]",
        store.write(vec![(CellId(10), good.clone()), (CellId(CELL_COUNT), good.clone())]).await,
        "OutOfRange",
        is_out_of_range,
    );
    expect_error(
        check,
        "write of [(u64::MAX, ok), (11, ok)]",
        store.write(vec![(CellId(u64::MAX), good.clone()), (CellId(11), good.clone())]).await,
        "OutOfRange",
        is_out_of_range,
    );
    expect_model(store, "out-of-range requests leave the store unchanged", &model).await;

    let check = "range past the cell end";
    for (offset, len) in [
        (size - 4, 5),
        (size + 1, 0),
        (0, size + 1),
        (1, size),
        (u32::MAX, u32::MAX),
        (u32::MAX, 0),
    ] {
        expect_error(
            check,
            &format!("read_ranges of [(50, 0, 1), (50, {offset}, {len})]"),
            store.read_ranges(&[range(50, 0, 1), range(50, offset, len)]).await,
            "RangeOutOfCell",
            is_range_out_of_cell,
        );
    }

    let check = "wrong-size write";
    let sizes = [0, 1, size as usize - 1, size as usize + 1, 2 * size as usize];
    for len in sizes {
        expect_error(
            check,
            &format!("write of {len} bytes to cell 12"),
            store.write(vec![(CellId(12), vec![0xAB; len])]).await,
            "WrongCellSize",
            is_wrong_cell_size,
        );
    }
    expect_error(
        check,
        "write of [(10, ok), (11, short), (12, ok)]",
        store
            .write(vec![
                (CellId(10), good.clone()),
                (CellId(11), vec![0xAB; size as usize - 1]),
                (CellId(12), good.clone()),
            ])
            .await,
        "WrongCellSize",
        is_wrong_cell_size,
    );
    expect_error(
        check,
        "write of [(5, ok), (0, long)] over written cells",
        store
            .write(vec![(CellId(5), good.clone()), (CellId(0), vec![0xAB; size as usize + 1])])
            .await,
        "WrongCellSize",
        is_wrong_cell_size,
    );
    expect_error(
        check,
        "shared write of [(10, ok), (11, long)]",
        store
            .write_shared(vec![
                (CellId(10), std::sync::Arc::new(good.clone())),
                (CellId(11), std::sync::Arc::new(vec![0xAB; size as usize + 1])),
            ])
            .await,
        "WrongCellSize",
        is_wrong_cell_size,
    );
    expect_model(store, "wrong-size write batches leave the store unchanged", &model).await;

    // --- whole-array batches, flush ------------------------------------------------------
    let check = "one batch covering every cell";
    let batch: Vec<(u64, Vec<u8>)> = (0..CELL_COUNT).map(|c| (c, model.contents())).collect();
    write(store, check, &mut model, batch).await;
    expect_model(store, check, &model).await;
    expect_cells(store, check, &model, &reversed).await;

    let check = "flush";
    store.flush().await.unwrap_or_else(|e| fail(check, format!("flush failed: {e}")));
    store.flush().await.unwrap_or_else(|e| fail(check, format!("a second flush failed: {e}")));
    expect_model(store, check, &model).await;

    // --- concurrency ---------------------------------------------------------------------
    let check = "concurrent workers on disjoint cells";
    let worker_data: Vec<Vec<Vec<Vec<u8>>>> = (0..WORKERS)
        .map(|w| {
            let mine = (w..CELL_COUNT).step_by(WORKERS as usize).count();
            (0..3).map(|_| (0..mine).map(|_| model.contents()).collect()).collect()
        })
        .collect();
    let worker = |w: u64| {
        let rounds = &worker_data[w as usize];
        async move {
            let mine: Vec<u64> = (w..CELL_COUNT).step_by(WORKERS as usize).collect();
            for round in rounds {
                // Two write batches per round, so writes of different workers interleave.
                let half = mine.len() / 2;
                let (first, second) = (mine.split_at(half), round.split_at(half));
                for (cells, data) in [(first.0, second.0), (first.1, second.1)] {
                    let batch: Vec<(CellId, Vec<u8>)> =
                        cells.iter().zip(data).map(|(&c, d)| (CellId(c), d.clone())).collect();
                    store
                        .write(batch)
                        .await
                        .unwrap_or_else(|e| fail(check, format!("worker {w}: write failed: {e}")));
                    tokio::task::yield_now().await;
                }
                let ids: Vec<CellId> = mine.iter().map(|&c| CellId(c)).collect();
                let got = store
                    .read(&ids)
                    .await
                    .unwrap_or_else(|e| fail(check, format!("worker {w}: read failed: {e}")));
                if got != *round {
                    fail(
                        check,
                        format!("worker {w}: its cells {mine:?} did not read back as written"),
                    );
                }
                let ranges: Vec<ByteRange> = mine.iter().map(|&c| range(c, 8, 16)).collect();
                let got = store.read_ranges(&ranges).await.unwrap_or_else(|e| {
                    fail(check, format!("worker {w}: read_ranges failed: {e}"))
                });
                for (i, data) in got.iter().enumerate() {
                    if data.as_slice() != &round[i][8..24] {
                        fail(check, format!("worker {w}: range of cell {} did not match", mine[i]));
                    }
                }
            }
        }
    };
    // One future per worker; `WORKERS` is 8.
    tokio::join!(
        worker(0),
        worker(1),
        worker(2),
        worker(3),
        worker(4),
        worker(5),
        worker(6),
        worker(7)
    );
    for w in 0..WORKERS {
        let last_round = worker_data[w as usize].last().unwrap();
        for (i, c) in (w..CELL_COUNT).step_by(WORKERS as usize).enumerate() {
            model.set(c, &last_round[i]);
        }
    }
    expect_model(store, check, &model).await;

    // --- the last cell -------------------------------------------------------------------
    let check = "the last cell";
    let data = model.contents();
    write(store, check, &mut model, vec![(last, data)]).await;
    expect_cells(store, check, &model, &[last]).await;
    expect_ranges(store, check, &model, &[(last, size - 1, 1), (last, 0, size), (last, size, 0)])
        .await;
    expect_cells(store, check, &model, &[last - 1, last]).await;

    expect_model(store, "final contents", &model).await;
}
