//! Sealing behaviour through the public API: round trips, tampering, swaps, rollbacks, epochs.

use std::collections::BTreeMap;
use std::sync::Arc;

use blindfold_crypto::{CellAd, CellSealer, CryptoError, MasterKey, StoreId};

const PLAINTEXT: &[u8] = b"sixteen byte blk and some more bytes to make it longer";

fn master() -> MasterKey {
    MasterKey::from_bytes([0x5a; 32])
}

fn store() -> StoreId {
    StoreId([0x11; 16])
}

fn ad() -> CellAd {
    CellAd { cell: 1234, version: 5, segment: 2 }
}

fn assert_integrity(result: Result<Vec<u8>, CryptoError>, ad: &CellAd, what: &str) {
    match result {
        Err(CryptoError::Integrity { cell, segment }) => {
            assert_eq!((cell, segment), (ad.cell, ad.segment), "{what}");
        }
        other => panic!("{what}: expected an integrity error, got {other:?}"),
    }
}

fn epoch_of(sealed: &[u8]) -> u32 {
    u32::from_le_bytes(sealed[..4].try_into().unwrap())
}

#[test]
fn sealer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<CellSealer>();
}

#[test]
fn round_trip_all_apis_and_sizes() {
    let sealer = CellSealer::new(&master(), store(), 3);
    for len in [0, 1, 15, 16, 17, 4096, 16384] {
        let plaintext: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        let sealed = sealer.seal(&ad(), &plaintext).unwrap();
        assert_eq!(sealed.len(), len + CellSealer::OVERHEAD);
        assert_eq!(epoch_of(&sealed), 3);
        if len >= 16 {
            // Shorter ones could match by chance (probability 2^-8 for one byte).
            assert_ne!(&sealed[16..16 + len], &plaintext[..], "plaintext visible");
        }
        assert_eq!(sealer.open(&ad(), &sealed).unwrap(), plaintext);

        let mut out = vec![0u8; len + CellSealer::OVERHEAD];
        sealer.seal_into(&ad(), &plaintext, &mut out).unwrap();
        let opened = sealer.open_in_place(&ad(), &mut out).unwrap();
        assert_eq!(opened, &plaintext[..]);
    }
    assert_eq!(sealer.store_id(), store());
}

#[test]
fn open_in_place_returns_the_slice_inside_the_buffer() {
    let sealer = CellSealer::new(&master(), store(), 0);
    let mut sealed = sealer.seal(&ad(), PLAINTEXT).unwrap();
    let start = sealed.as_ptr() as usize;
    let opened = sealer.open_in_place(&ad(), &mut sealed).unwrap();
    assert_eq!(opened.as_ptr() as usize, start + 16);
    assert_eq!(opened.len(), PLAINTEXT.len());
}

#[test]
fn nonces_are_fresh() {
    let sealer = CellSealer::new(&master(), store(), 0);
    let a = sealer.seal(&ad(), PLAINTEXT).unwrap();
    let b = sealer.seal(&ad(), PLAINTEXT).unwrap();
    assert_ne!(a[4..16], b[4..16], "nonce repeated");
    assert_ne!(a, b);
}

#[test]
fn seal_into_rejects_wrong_output_length() {
    let sealer = CellSealer::new(&master(), store(), 0);
    for delta in [-1isize, 1] {
        let len = (PLAINTEXT.len() + CellSealer::OVERHEAD).saturating_add_signed(delta);
        let mut out = vec![0u8; len];
        assert!(matches!(
            sealer.seal_into(&ad(), PLAINTEXT, &mut out),
            Err(CryptoError::Malformed(_))
        ));
    }
}

#[test]
fn every_flipped_byte_is_detected() {
    // Epoch 5 so that a flipped epoch bit can point both backwards (a real but wrong key)
    // and forwards (a refused future epoch).
    let sealer = CellSealer::new(&master(), store(), 5);
    let sealed = sealer.seal(&ad(), PLAINTEXT).unwrap();
    let n = sealed.len();
    let classes =
        [("epoch", 0..4), ("nonce", 4..16), ("ciphertext", 16..n - 16), ("tag", n - 16..n)];
    for (class, range) in classes {
        for pos in range {
            for bit in [0x01u8, 0x80] {
                let mut bad = sealed.clone();
                bad[pos] ^= bit;
                let what = format!("{class} byte {pos} bit {bit:#x}");
                assert_integrity(sealer.open(&ad(), &bad), &ad(), &what);
                assert!(sealer.open_in_place(&ad(), &mut bad).is_err(), "{what} (in place)");
            }
        }
    }
    // The untouched segment still opens (the loop above did not test a broken sealer).
    assert_eq!(sealer.open(&ad(), &sealed).unwrap(), PLAINTEXT);
}

#[test]
fn failed_open_in_place_leaves_no_plaintext() {
    let sealer = CellSealer::new(&master(), store(), 0);
    let plaintext = [0xeeu8; 64];
    let mut sealed = sealer.seal(&ad(), &plaintext).unwrap();
    let last = sealed.len() - 1;
    sealed[last] ^= 1;
    assert!(sealer.open_in_place(&ad(), &mut sealed).is_err());
    assert!(
        !sealed.windows(8).any(|w| w == [0xee; 8]),
        "unauthenticated plaintext left in the buffer"
    );
}

#[test]
fn swapped_cell_is_detected() {
    let sealer = CellSealer::new(&master(), store(), 0);
    let sealed = sealer.seal(&ad(), PLAINTEXT).unwrap();
    let other = CellAd { cell: ad().cell + 1, ..ad() };
    assert_integrity(sealer.open(&other, &sealed), &other, "other cell");
}

#[test]
fn rolled_back_version_is_detected() {
    let sealer = CellSealer::new(&master(), store(), 0);
    let old = sealer.seal(&ad(), b"old contents").unwrap();
    let newer = CellAd { version: ad().version + 1, ..ad() };
    let new = sealer.seal(&newer, b"new contents").unwrap();
    assert_eq!(sealer.open(&newer, &new).unwrap(), b"new contents");
    // The store answers the read of version 6 with the stored version-5 segment.
    assert_integrity(sealer.open(&newer, &old), &newer, "replayed old version");
}

#[test]
fn swapped_segment_is_detected() {
    let sealer = CellSealer::new(&master(), store(), 0);
    let sealed = sealer.seal(&ad(), PLAINTEXT).unwrap();
    let other = CellAd { segment: ad().segment + 1, ..ad() };
    assert_integrity(sealer.open(&other, &sealed), &other, "other segment");
}

#[test]
fn other_store_or_key_is_detected() {
    let sealer = CellSealer::new(&master(), store(), 0);
    let sealed = sealer.seal(&ad(), PLAINTEXT).unwrap();
    let other_store = CellSealer::new(&master(), StoreId([0x12; 16]), 0);
    assert_integrity(other_store.open(&ad(), &sealed), &ad(), "other store");
    let other_key = CellSealer::new(&MasterKey::from_bytes([0x5b; 32]), store(), 0);
    assert_integrity(other_key.open(&ad(), &sealed), &ad(), "other master key");
}

#[test]
fn truncated_input_is_malformed() {
    let sealer = CellSealer::new(&master(), store(), 0);
    let sealed = sealer.seal(&ad(), PLAINTEXT).unwrap();
    for len in [0, 1, 4, 16, CellSealer::OVERHEAD - 1] {
        let mut short = sealed[..len].to_vec();
        assert!(
            matches!(sealer.open(&ad(), &short), Err(CryptoError::Malformed(_))),
            "{len} bytes"
        );
        assert!(
            matches!(sealer.open_in_place(&ad(), &mut short), Err(CryptoError::Malformed(_))),
            "{len} bytes in place"
        );
    }
    // Long enough to parse, but cut: authentication fails.
    for cut in [1, 16, PLAINTEXT.len()] {
        let short = &sealed[..sealed.len() - cut];
        assert_integrity(sealer.open(&ad(), short), &ad(), &format!("cut {cut}"));
    }
}

#[test]
fn future_epoch_is_refused() {
    // Same key material, so only the epoch check can refuse the segment.
    let ahead = CellSealer::new(&master(), store(), 10);
    let sealed = ahead.seal(&ad(), PLAINTEXT).unwrap();
    assert_eq!(ahead.open(&ad(), &sealed).unwrap(), PLAINTEXT);
    let behind = CellSealer::new(&master(), store(), 9);
    assert_integrity(behind.open(&ad(), &sealed), &ad(), "future epoch");
    // Epochs the sealer has passed stay readable.
    let later = CellSealer::new(&master(), store(), 11);
    assert_eq!(later.open(&ad(), &sealed).unwrap(), PLAINTEXT);
}

#[test]
fn rotation_advances_epoch_and_keeps_old_segments_readable() {
    let sealer = CellSealer::new(&master(), store(), 0).with_rotation_limit(3);
    let mut sealed = Vec::new();
    for i in 0..7u64 {
        assert_eq!(u64::from(sealer.current_epoch()), i / 3, "before seal {i}");
        let ad = CellAd { cell: i, ..ad() };
        sealed.push((ad, sealer.seal(&ad, PLAINTEXT).unwrap()));
    }
    let epochs: Vec<u32> = sealed.iter().map(|(_, s)| epoch_of(s)).collect();
    assert_eq!(epochs, [0, 0, 0, 1, 1, 1, 2]);
    assert_eq!(sealer.current_epoch(), 2);
    for (ad, s) in &sealed {
        assert_eq!(sealer.open(ad, s).unwrap(), PLAINTEXT);
    }
    // Each epoch really is a different key: relabelling an epoch-0 segment as epoch 1 fails.
    let (ad0, s0) = &sealed[0];
    let mut relabelled = s0.clone();
    relabelled[..4].copy_from_slice(&1u32.to_le_bytes());
    assert_integrity(sealer.open(ad0, &relabelled), ad0, "relabelled epoch");
}

#[test]
fn last_epoch_runs_out_cleanly() {
    let sealer = CellSealer::new(&master(), store(), u32::MAX).with_rotation_limit(2);
    let a = sealer.seal(&ad(), PLAINTEXT).unwrap();
    sealer.seal(&ad(), PLAINTEXT).unwrap();
    assert!(matches!(sealer.seal(&ad(), PLAINTEXT), Err(CryptoError::EpochsExhausted)));
    assert_eq!(sealer.current_epoch(), u32::MAX);
    assert_eq!(sealer.open(&ad(), &a).unwrap(), PLAINTEXT);
}

#[test]
fn concurrent_seals_use_each_epoch_exactly_limit_times() {
    const LIMIT: u64 = 5;
    const THREADS: u64 = 4;
    const PER_THREAD: u64 = 50;
    let sealer = Arc::new(CellSealer::new(&master(), store(), 100).with_rotation_limit(LIMIT));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let sealer = Arc::clone(&sealer);
            std::thread::spawn(move || {
                (0..PER_THREAD)
                    .map(|i| {
                        let ad = CellAd { cell: t * PER_THREAD + i, ..ad() };
                        let sealed = sealer.seal(&ad, PLAINTEXT).unwrap();
                        assert_eq!(sealer.open(&ad, &sealed).unwrap(), PLAINTEXT);
                        epoch_of(&sealed)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut uses: BTreeMap<u32, u64> = BTreeMap::new();
    for handle in handles {
        for epoch in handle.join().unwrap() {
            *uses.entry(epoch).or_default() += 1;
        }
    }
    let total = THREADS * PER_THREAD;
    assert_eq!(uses.len() as u64, total / LIMIT);
    for (epoch, count) in uses {
        assert!((100..100 + (total / LIMIT) as u32).contains(&epoch));
        assert_eq!(count, LIMIT, "epoch {epoch}");
    }
}

#[test]
fn integrity_error_message_explains() {
    let err = CryptoError::Integrity { cell: 77, segment: 1 };
    let msg = err.to_string();
    assert!(msg.contains("integrity check failed for cell 77"), "{msg}");
    assert!(msg.contains("modified, swapped or rolled back"), "{msg}");
}

#[test]
fn sealer_debug_is_redacted() {
    let key = MasterKey::from_bytes([0xc3; 32]);
    let sealer = CellSealer::new(&key, store(), 0);
    let shown = format!("{sealer:?} {sealer:#?}");
    assert!(!shown.contains("c3c3"), "{shown}");
    assert!(!shown.contains("195, 195"), "{shown}"); // 0xc3 as decimal array elements
    assert!(shown.contains("CellSealer"), "{shown}");
}
