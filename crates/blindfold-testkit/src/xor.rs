//! Conformance checks for the [`XorStore`] capability, run after (or instead of) the store
//! suite on a fresh store of [`conformance::geometry()`](crate::conformance::geometry).

use blindfold_store::{ByteRange, CellId, StoreError, XorStore};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::conformance::{CELL_COUNT, CELL_SIZE};

fn fail(check: &str, msg: impl std::fmt::Display) -> ! {
    panic!("XOR store conformance check {check:?} failed: {msg}")
}

fn range(c: u64, offset: u32, len: u32) -> ByteRange {
    ByteRange { cell: CellId(c), offset, len }
}

/// Checks every contract of [`XorStore::read_xor`] against what [`blindfold_store::Store`]
/// reads return. Overwrites some cells.
pub async fn run_xor(store: &dyn XorStore) {
    let mut rng = ChaCha8Rng::seed_from_u64(0x0a0b);
    let cells: Vec<(CellId, Vec<u8>)> = (0..CELL_COUNT)
        .step_by(3)
        .map(|c| {
            let mut b = vec![0u8; CELL_SIZE as usize];
            rng.fill_bytes(&mut b);
            (CellId(c), b)
        })
        .collect();
    store.write(cells.clone()).await.unwrap_or_else(|e| fail("setup", e));
    let cell = |c: u64| cells.iter().find(|(id, _)| id.0 == c).map(|(_, b)| b.clone());

    let check = "xor of ranges equals the xor of their contents";
    for batch in [
        vec![range(0, 0, 16), range(3, 8, 16), range(6, 64, 16)],
        vec![range(9, 0, CELL_SIZE)],
        vec![range(12, 5, 7), range(1, 5, 7), range(CELL_COUNT - 1, 0, 7)], // unwritten cells
        vec![range(15, 0, 10), range(15, 0, 10)],                           // cancels out
    ] {
        let got = store.read_xor(&batch).await.unwrap_or_else(|e| fail(check, e));
        let mut want = vec![0u8; batch[0].len as usize];
        for r in &batch {
            let c = cell(r.cell.0).unwrap_or_else(|| vec![0u8; CELL_SIZE as usize]);
            for (w, b) in want.iter_mut().zip(&c[r.offset as usize..(r.offset + r.len) as usize]) {
                *w ^= b;
            }
        }
        if got != want {
            fail(check, format!("{batch:?} gave {} bytes that differ", got.len()));
        }
    }

    let check = "empty batch";
    let got = store.read_xor(&[]).await.unwrap_or_else(|e| fail(check, e));
    if !got.is_empty() {
        fail(check, format!("returned {} bytes", got.len()));
    }

    let check = "invalid batches fail whole";
    type Expect = fn(&StoreError) -> bool;
    let cases: [(Vec<ByteRange>, Expect); 3] = [
        (vec![range(0, 0, 4), range(1, 0, 5)], |e| matches!(e, StoreError::InvalidRequest(_))),
        (vec![range(0, 0, 4), range(CELL_COUNT, 0, 4)], |e| {
            matches!(e, StoreError::OutOfRange { .. })
        }),
        (vec![range(0, CELL_SIZE - 2, 4)], |e| matches!(e, StoreError::RangeOutOfCell { .. })),
    ];
    for (batch, ok) in cases {
        match store.read_xor(&batch).await {
            Err(e) if ok(&e) && !e.is_retryable() => {}
            other => fail(check, format!("{batch:?} gave {other:?}")),
        }
    }
}
