//! The TEE design's host ([`TeeHost`]) against a plaintext stand-in for the trusted component
//! (`blindfold_testkit::tee::PlainTrusted`; the real enclave is tested with it elsewhere): the
//! semantics of queries and rounds, the order of the host's store requests, concurrency, the
//! shape checks, and what the wrappers count and record.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blindfold_store::{
    open_tee_store, CellId, CountingStore, FaultConfig, FaultStore, JitterStore, LatencyStore,
    LinkConfig, MemoryStore, RecordingStore, Store, StoreError, StoreUrl, TeeHost, TeeRound,
    TeeStore, TraceOp, Trusted,
};
use blindfold_testkit::tee::{
    self, block, evict_ticket, geometry, layer, malformed_queries, malformed_rounds, model_round,
    query_ticket, run_tee, sample_round, PlainTrusted,
};

fn plain() -> Arc<dyn Trusted> {
    Arc::new(PlainTrusted::new())
}

fn host() -> TeeHost<MemoryStore> {
    TeeHost::new(MemoryStore::new(geometry()), plain())
}

#[tokio::test]
async fn the_host_passes_the_tee_conformance_checks() {
    run_tee(&host()).await;
    // Through every wrapper, and through shared pointers.
    let shared: Arc<dyn TeeStore> = Arc::new(host());
    run_tee(&CountingStore::new(RecordingStore::new(Arc::clone(&shared)))).await;
    run_tee(&FaultStore::new(Box::new(host()) as Box<dyn TeeStore>, FaultConfig::default())).await;
    run_tee(&JitterStore::new(host(), Duration::from_millis(1), 7)).await;
    run_tee(&LatencyStore::new(host(), LinkConfig::unlimited(Duration::ZERO))).await;
}

#[tokio::test]
async fn a_round_moves_blocks_exactly_as_the_contract_says() {
    let store = host();
    let before: Vec<(CellId, Vec<u8>)> =
        (0..tee::CELL_COUNT).map(|c| (CellId(c), block(c as u8))).collect();
    store.write(before.clone()).await.unwrap();
    // Three layers of 2 cells; two incoming blocks; permutations written out by hand.
    let round = TeeRound {
        incoming: vec![block(200), block(201)],
        layers: vec![
            layer(&[0, 1], &[0, 1], &[2, 3, 0, 1]),
            layer(&[2, 3], &[2, 3], &[1, 0, 3, 2]),
            layer(&[4, 5], &[6, 7], &[3, 1, 0, 2]),
        ],
    };
    store.tee_evict(&round).await.unwrap();
    let got = store.read(&(0..8).map(CellId).collect::<Vec<_>>()).await.unwrap();
    // Layer 0: [c0, c1, in200, in201] → positions [2, 3, 0, 1]: [in200, in201, c0, c1];
    // cells 0, 1 ← in200, in201; carry [c0, c1].
    assert_eq!(got[0], block(200));
    assert_eq!(got[1], block(201));
    // Layer 1: [c2, c3, c0, c1] → [c3, c2, c1, c0]; cells 2, 3 ← c3, c2; carry [c1, c0].
    assert_eq!(got[2], block(3));
    assert_eq!(got[3], block(2));
    // Layer 2 reads 4, 5 and writes 6, 7: [c4, c5, c1, c0] → [c1, c5, c0, c4]; cells 6, 7 ←
    // c1, c5; the carry [c0, c4] is dropped, and cells 4, 5 keep what they held.
    assert_eq!(got[6], block(1));
    assert_eq!(got[7], block(5));
    assert_eq!(got[4], block(4));
    assert_eq!(got[5], block(5));
    // Nothing else changed.
    let rest = store.read(&(8..tee::CELL_COUNT).map(CellId).collect::<Vec<_>>()).await.unwrap();
    assert_eq!(rest, before[8..].iter().map(|(_, b)| b.clone()).collect::<Vec<_>>());
}

#[tokio::test]
async fn rounds_agree_with_the_model_over_random_shapes() {
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(12);
    let store = host();
    let mut model: Vec<Vec<u8>> = (0..tee::CELL_COUNT).map(|c| block(c as u8)).collect();
    store
        .write(model.iter().enumerate().map(|(c, b)| (CellId(c as u64), b.clone())).collect())
        .await
        .unwrap();
    for case in 0..40 {
        let q = rng.gen_range(0..4);
        let incoming = (0..q).map(|i| block(150 + case as u8 + i)).collect();
        let layers = (0..rng.gen_range(1..6))
            .map(|_| {
                let z = rng.gen_range(0..4);
                let pick = |rng: &mut rand_chacha::ChaCha8Rng| -> Vec<u64> {
                    (0..z).map(|_| rng.gen_range(0..tee::CELL_COUNT)).collect()
                };
                let (read, write) = (pick(&mut rng), pick(&mut rng));
                let mut perm: Vec<u32> = (0..(z + q) as u32).collect();
                perm.shuffle(&mut rng);
                layer(&read, &write, &perm)
            })
            .collect();
        let round = TeeRound { incoming, layers };
        store.tee_evict(&round).await.unwrap();
        model_round(&mut model, &round);
        let got = store.read(&(0..tee::CELL_COUNT).map(CellId).collect::<Vec<_>>()).await.unwrap();
        assert_eq!(got, model, "case {case}: {round:?}");
    }
}

/// The host's own requests, in the order it issues them: a function of the round's shape.
#[tokio::test]
async fn the_host_prefetches_and_writes_behind_in_a_fixed_order() {
    let recorded = Arc::new(RecordingStore::new(MemoryStore::new(geometry())));
    let store = TeeHost::new(Arc::clone(&recorded), plain());
    let disjoint = TeeRound {
        incoming: vec![block(1)],
        layers: vec![
            layer(&[0, 1], &[0, 1], &[0, 1, 2]),
            layer(&[2, 3], &[2, 3], &[2, 1, 0]),
            layer(&[4, 5], &[4, 5], &[1, 2, 0]),
        ],
    };
    let shape = |trace: Vec<blindfold_store::TraceEvent>| -> Vec<(TraceOp, Vec<u64>)> {
        trace.into_iter().map(|e| (e.op, e.cells.iter().map(|c| c.0).collect())).collect()
    };
    for _ in 0..5 {
        store.tee_evict(&disjoint).await.unwrap();
        // Layer i + 1 is read while layer i is evicted, layer i written while i + 1 is.
        assert_eq!(
            shape(recorded.take_trace()),
            vec![
                (TraceOp::Read, vec![0, 1]),
                (TraceOp::Read, vec![2, 3]),
                (TraceOp::Write, vec![0, 1]),
                (TraceOp::Read, vec![4, 5]),
                (TraceOp::Write, vec![2, 3]),
                (TraceOp::Write, vec![4, 5]),
            ]
        );
    }
    // The sample round's third layer reads a cell its first one writes: it is read after that
    // write has returned.
    store.tee_evict(&sample_round()).await.unwrap();
    assert_eq!(
        shape(recorded.take_trace()),
        vec![
            (TraceOp::Read, vec![0, 1]),
            (TraceOp::Read, vec![2, 3, 4]),
            (TraceOp::Write, vec![0, 1]),
            (TraceOp::Write, vec![10, 11, 12]),
            (TraceOp::Read, vec![1, 5]),
            (TraceOp::Write, vec![1, 5]),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_run_while_a_round_is_in_flight() {
    let slow = Arc::new(PlainTrusted::slow(Duration::from_millis(150)));
    let store = TeeHost::new(MemoryStore::new(geometry()), Arc::clone(&slow) as Arc<dyn Trusted>);
    store.write(vec![(CellId(20), block(20)), (CellId(21), block(21))]).await.unwrap();
    let done = AtomicBool::new(false);
    let round = async {
        store.tee_evict(&sample_round()).await.unwrap();
        done.store(true, Ordering::SeqCst);
    };
    let queries = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        for i in 0..10u32 {
            let answer =
                store.tee_query(&[CellId(20), CellId(21)], &query_ticket(i % 2)).await.unwrap();
            assert_eq!(answer, block(20 + (i % 2) as u8));
            assert!(!done.load(Ordering::SeqCst), "query {i} waited for the round");
        }
    };
    tokio::join!(round, queries);
    assert!(done.load(Ordering::SeqCst));
    assert_eq!((slow.queries(), slow.evictions()), (10, 3));
}

#[tokio::test]
async fn malformed_requests_are_refused_before_any_request_reaches_the_store() {
    let recorded = Arc::new(RecordingStore::new(MemoryStore::new(geometry())));
    let trusted = Arc::new(PlainTrusted::new());
    let store = TeeHost::new(Arc::clone(&recorded), Arc::clone(&trusted) as Arc<dyn Trusted>);
    for (what, round) in malformed_rounds() {
        let err = store.tee_evict(&round).await.unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidRequest(_) | StoreError::OutOfRange { .. }),
            "{what}: {err:?}"
        );
        assert!(!err.to_string().is_empty());
    }
    for (what, cells, ticket) in malformed_queries() {
        let err = store.tee_query(&cells, &ticket).await.unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidRequest(_) | StoreError::OutOfRange { .. }),
            "{what}: {err:?}"
        );
    }
    assert_eq!(recorded.trace(), Vec::new(), "nothing was read or written");
    assert_eq!((trusted.queries(), trusted.evictions()), (0, 0));
    // The messages say what is wrong.
    let mut unequal = sample_round();
    unequal.layers[1].write.pop();
    let msg = store.tee_evict(&unequal).await.unwrap_err().to_string();
    assert!(msg.contains("layer 1 reads 3 cells but writes 2"), "{msg}");
    let mut short = sample_round();
    short.incoming[1].pop();
    let msg = store.tee_evict(&short).await.unwrap_err().to_string();
    assert!(msg.contains("incoming block 1 has 23 bytes"), "{msg}");
}

/// A trusted component that breaks its contract is caught by the host, not written.
#[tokio::test]
async fn a_trusted_component_that_changes_block_sizes_is_an_error() {
    #[derive(Debug)]
    struct Shrinking;
    impl Trusted for Shrinking {
        fn query(&self, _: &[Vec<u8>], _: &[u8]) -> blindfold_store::Result<Vec<u8>> {
            Ok(vec![0; 1 << 20])
        }
        fn evict(&self, blocks: &mut [Vec<u8>], _: &[u8]) -> blindfold_store::Result<()> {
            blocks.iter_mut().for_each(|b| b.truncate(1));
            Ok(())
        }
    }
    let store = TeeHost::new(MemoryStore::new(geometry()), Arc::new(Shrinking));
    let err = store.tee_evict(&sample_round()).await.unwrap_err();
    assert!(err.to_string().contains("block of 1 bytes"), "{err}");
    let err = store.tee_query(&[CellId(0)], &[]).await.unwrap_err();
    assert!(err.to_string().contains("answered with 1048576 bytes"), "{err}");
    assert_eq!(store.read(&[CellId(0)]).await.unwrap(), vec![vec![0; tee::CELL_SIZE as usize]]);
}

/// Eviction layers run at a lower priority than everything else (so a waking query is served
/// first); queries, and the threads that served a round, keep the normal one.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_runs_at_a_lower_priority_than_queries() {
    use std::sync::Mutex;
    #[derive(Debug, Default)]
    struct Niceness {
        query: Mutex<Vec<i32>>,
        evict: Mutex<Vec<i32>>,
    }
    fn nice() -> i32 {
        rustix::process::getpriority_process(None).unwrap()
    }
    impl Trusted for Niceness {
        fn query(&self, c: &[Vec<u8>], _: &[u8]) -> blindfold_store::Result<Vec<u8>> {
            self.query.lock().unwrap().push(nice());
            Ok(c[0].clone())
        }
        fn evict(&self, _: &mut [Vec<u8>], _: &[u8]) -> blindfold_store::Result<()> {
            self.evict.lock().unwrap().push(nice());
            Ok(())
        }
    }
    let normal = nice();
    let trusted = Arc::new(Niceness::default());
    let store = TeeHost::new(MemoryStore::new(geometry()), Arc::clone(&trusted) as _);
    for i in 0..3u8 {
        store.tee_evict(&sample_round()).await.unwrap();
        store.tee_query(&[CellId(i.into()), CellId(9)], &query_ticket(1)).await.unwrap();
    }
    // Reads through the blocking pool after rounds ran: still at the normal priority.
    let pooled = tokio::task::spawn_blocking(nice).await.unwrap();
    let evict = trusted.evict.lock().unwrap().clone();
    assert_eq!(evict.len(), 9, "three rounds of three layers");
    assert!(evict.iter().all(|&n| n == (normal + 10).min(19)), "{evict:?} (normal {normal})");
    assert_eq!(*trusted.query.lock().unwrap(), vec![normal; 3]);
    assert_eq!(pooled, normal);
}

#[tokio::test]
async fn the_recording_store_sees_cells_not_tickets() {
    let store = RecordingStore::new(host());
    store.tee_query(&[CellId(4), CellId(9)], &query_ticket(1)).await.unwrap();
    store.tee_evict(&sample_round()).await.unwrap();
    let trace = store.trace();
    let cell = u64::from(tee::CELL_SIZE);
    assert_eq!(trace[0].op, TraceOp::TeeQuery);
    assert_eq!(trace[0].cells, vec![CellId(4), CellId(9)]);
    assert_eq!(trace[0].bytes, 4, "the ticket's bytes");
    assert_eq!(trace[1].op, TraceOp::TeeEvict);
    assert_eq!(trace[1].groups, vec![2, 3, 2]);
    assert_eq!(trace[1].bytes, 2 * cell + 4 * (4 + 5 + 4), "incoming blocks and tickets");
    let layers: Vec<(TraceOp, Vec<CellId>, u64)> =
        trace[2..].iter().map(|e| (e.op, e.cells.clone(), e.bytes)).collect();
    let ids = |v: &[u64]| v.iter().copied().map(CellId).collect::<Vec<_>>();
    assert_eq!(
        layers,
        vec![
            (TraceOp::Read, ids(&[0, 1]), 2 * cell),
            (TraceOp::Write, ids(&[0, 1]), 2 * cell),
            (TraceOp::Read, ids(&[2, 3, 4]), 3 * cell),
            (TraceOp::Write, ids(&[10, 11, 12]), 3 * cell),
            (TraceOp::Read, ids(&[1, 5]), 2 * cell),
            (TraceOp::Write, ids(&[1, 5]), 2 * cell),
        ]
    );
    // Two queries with different targets look the same.
    store.clear();
    for t in 0..2 {
        store.tee_query(&[CellId(4), CellId(9)], &query_ticket(t)).await.unwrap();
    }
    let trace = store.trace();
    assert_eq!(trace[0], trace[1]);
}

#[tokio::test]
async fn the_counting_store_counts_tee_requests() {
    let store = CountingStore::new(host());
    store.tee_query(&[CellId(1), CellId(2), CellId(3)], &query_ticket(2)).await.unwrap();
    store.tee_evict(&sample_round()).await.unwrap();
    let c = store.counts();
    let cell = u64::from(tee::CELL_SIZE);
    assert_eq!((c.tee_queries, c.tee_query_cells, c.tee_rounds), (1, 3, 1));
    assert_eq!((c.tee_cells_read, c.tee_cells_written), (7, 7));
    assert_eq!(c.tee_bytes_sent, 4 + 2 * cell + 4 * 13);
    assert_eq!(c.tee_bytes_read, cell);
    assert_eq!(c.round_trips, 2);
    assert_eq!(c.bytes_up(), c.tee_bytes_sent);
    assert_eq!(c.bytes_down(), cell);
    // The host's reads and writes are not requests across the link.
    assert_eq!((c.read_requests, c.write_requests), (0, 0));
    let mut zero = c.since(&c);
    assert_eq!(zero.tee_rounds, 0);
    zero = zero.plus(&c);
    assert_eq!(zero, c);
    store.reset();
    assert_eq!(store.counts().tee_bytes_sent, 0);
}

#[tokio::test(start_paused = true)]
async fn the_latency_store_charges_one_round_trip_and_the_bytes() {
    // 8 kbit/s: 1000 bytes a second each way.
    let link = LinkConfig::symmetric(Duration::from_millis(100), 8_000);
    let store = LatencyStore::new(host(), link);
    let start = tokio::time::Instant::now();
    store.tee_query(&[CellId(1), CellId(2)], &query_ticket(0)).await.unwrap();
    // Up: 2 addresses and a 4-byte ticket (36 bytes); down: a 24-byte answer.
    let took = start.elapsed();
    let want = Duration::from_millis(100 + 36 + 24);
    assert!(took.abs_diff(want) <= Duration::from_millis(1), "{took:?}");
    let start = tokio::time::Instant::now();
    store.tee_evict(&sample_round()).await.unwrap();
    // Up: two blocks, 52 ticket bytes and 14 addresses.
    let want = Duration::from_millis(100 + 48 + 52 + 14 * 16);
    let took = start.elapsed();
    assert!(took.abs_diff(want) <= Duration::from_millis(1), "{took:?}");
}

#[tokio::test]
async fn the_fault_store_fails_tee_requests_like_others() {
    let always = FaultConfig { error_rate: 1.0, ..FaultConfig::default() };
    let store = FaultStore::new(host(), always);
    let err = store.tee_query(&[CellId(1)], &query_ticket(0)).await.unwrap_err();
    assert!(matches!(err, StoreError::Injected(_)) && err.to_string().contains("tee_query"));
    let err = store.tee_evict(&sample_round()).await.unwrap_err();
    assert!(err.to_string().contains("tee_evict"), "{err}");
    // A lost acknowledgement: the round ran, the caller hears otherwise.
    let lost = FaultConfig { lost_ack_rate: 1.0, ..FaultConfig::default() };
    let store = FaultStore::new(host(), lost);
    let round = TeeRound { incoming: vec![block(77)], layers: vec![layer(&[0], &[0], &[1, 0])] };
    assert!(store.tee_evict(&round).await.is_err());
    assert_eq!(store.read(&[CellId(0)]).await.unwrap(), vec![block(77)]);
    assert_eq!(store.injected(), 1);
}

#[tokio::test]
async fn open_tee_store_needs_a_trusted_component_for_local_backends() {
    let g = geometry();
    let err = open_tee_store(&StoreUrl::Memory, "t", g, None).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidConfig(_)), "{err:?}");
    assert!(err.to_string().contains("trusted component"), "{err}");
    let store = open_tee_store(&StoreUrl::Memory, "t", g, Some(plain())).await.unwrap();
    run_tee(&*store).await;
    let dir = tempfile::tempdir().unwrap();
    let url = StoreUrl::parse(&format!("file://{}", dir.path().display())).unwrap();
    let store = open_tee_store(&url, "t", g, Some(plain())).await.unwrap();
    run_tee(&*store).await;
    // A trusted component for a remote store runs in the server, not here.
    let remote = StoreUrl::parse("remote://127.0.0.1:1").unwrap();
    let err = open_tee_store(&remote, "t", g, Some(plain())).await.unwrap_err();
    assert!(err.to_string().contains("storage server"), "{err}");
    // Tickets are opaque to the host: the stand-in's are only read by the stand-in.
    assert_eq!(evict_ticket(&[1, 0]).len(), 8);
}
