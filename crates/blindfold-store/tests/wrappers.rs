//! Exact behaviour of the wrappers: counting, recording, latency and faults.

use std::time::Duration;

use blindfold_store::{
    ByteRange, CellId, CountingStore, Counts, FaultConfig, FaultStore, Geometry, LatencyStore,
    LinkConfig, MemoryStore, RecordingStore, Store, StoreError, TraceEvent, TraceOp,
};
use tokio::time::Instant;

fn geometry() -> Geometry {
    Geometry::new(10, 32).unwrap()
}

fn memory() -> MemoryStore {
    MemoryStore::new(geometry())
}

fn range(cell: u64, offset: u32, len: u32) -> ByteRange {
    ByteRange { cell: CellId(cell), offset, len }
}

/// A fixed sequence of calls, two of them invalid, used by the counting and recording tests.
async fn known_calls(store: &dyn Store) {
    store.write(vec![(CellId(1), vec![1; 32]), (CellId(2), vec![2; 32])]).await.unwrap();
    store.read(&[CellId(1), CellId(2), CellId(3)]).await.unwrap();
    store.read_ranges(&[range(1, 0, 4), range(2, 8, 8)]).await.unwrap();
    store.flush().await.unwrap();
    store.read(&[CellId(99)]).await.unwrap_err();
    store.write(vec![(CellId(0), vec![0; 3])]).await.unwrap_err();
    store.write(vec![(CellId(4), vec![4; 32])]).await.unwrap();
}

// ---- counting -------------------------------------------------------------------------------

#[tokio::test]
async fn counting_is_exact_for_a_known_sequence() {
    let store = CountingStore::new(memory());
    known_calls(&store).await;
    let expected = Counts {
        read_requests: 2,
        cells_read: 4,
        bytes_read: 96, // the failed read returned nothing
        range_requests: 1,
        ranges_read: 2,
        range_bytes_read: 12,
        write_requests: 3,
        cells_written: 4,
        bytes_written: 64 + 3 + 32, // the rejected buffer was still sent
        flushes: 1,
        round_trips: 7,
        ..Counts::default()
    };
    assert_eq!(store.counts(), expected);
    assert_eq!(expected.bytes_down(), 108);
    assert_eq!(expected.bytes_up(), 99);

    let before = store.counts();
    store.read(&[CellId(5)]).await.unwrap();
    let delta = store.counts().since(&before);
    assert_eq!(
        delta,
        Counts {
            read_requests: 1,
            cells_read: 1,
            bytes_read: 32,
            round_trips: 1,
            ..Counts::default()
        }
    );

    let json = serde_json::to_value(store.counts()).unwrap();
    assert_eq!(json["round_trips"], 8);
    assert_eq!(json["range_bytes_read"], 12);

    store.reset();
    assert_eq!(store.counts(), Counts::default());
    // The wrapper changes nothing about the data.
    assert_eq!(store.inner().read(&[CellId(4)]).await.unwrap(), vec![vec![4; 32]]);
}

// ---- recording ------------------------------------------------------------------------------

fn event(op: TraceOp, cells: &[u64], bytes: u64) -> TraceEvent {
    TraceEvent::new(op, cells.iter().map(|&c| CellId(c)).collect(), Vec::new(), bytes)
}

fn expected_trace() -> Vec<TraceEvent> {
    vec![
        event(TraceOp::Write, &[1, 2], 64),
        event(TraceOp::Read, &[1, 2, 3], 96),
        TraceEvent { ranges: vec![(0, 4), (8, 8)], ..event(TraceOp::ReadRanges, &[1, 2], 12) },
        event(TraceOp::Flush, &[], 0),
        event(TraceOp::Read, &[99], 32), // rejected, but the adversary saw it
        event(TraceOp::Write, &[0], 3),
        event(TraceOp::Write, &[4], 32),
    ]
}

#[tokio::test]
async fn recording_trace_is_exact() {
    let store = RecordingStore::new(memory());
    known_calls(&store).await;
    let trace = store.trace();
    assert_eq!(trace, expected_trace());
    let shapes: Vec<_> = trace.iter().map(TraceEvent::shape).collect();
    assert_eq!(
        shapes,
        vec![
            (TraceOp::Write, 2, 64),
            (TraceOp::Read, 3, 96),
            (TraceOp::ReadRanges, 2, 12),
            (TraceOp::Flush, 0, 0),
            (TraceOp::Read, 1, 32),
            (TraceOp::Write, 1, 3),
            (TraceOp::Write, 1, 32),
        ]
    );

    assert_eq!(store.take_trace(), expected_trace());
    assert!(store.trace().is_empty());
    store.flush().await.unwrap();
    assert_eq!(store.trace().len(), 1);
    store.clear();
    assert!(store.trace().is_empty());

    let json = serde_json::to_string(&expected_trace()).unwrap();
    let back: Vec<TraceEvent> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, expected_trace());
}

#[tokio::test]
async fn recording_with_payloads_keeps_the_written_bytes() {
    let store = RecordingStore::with_payloads(memory());
    known_calls(&store).await;
    let mut expected = expected_trace();
    expected[0].payloads = vec![vec![1; 32], vec![2; 32]];
    expected[5].payloads = vec![vec![0; 3]];
    expected[6].payloads = vec![vec![4; 32]];
    assert_eq!(store.trace(), expected);
}

// ---- latency --------------------------------------------------------------------------------

/// 8 Mbit/s: one byte per microsecond.
const MBIT8: u64 = 8_000_000;

fn big_geometry() -> Geometry {
    Geometry::new(8, 10_000).unwrap()
}

fn slow_link() -> LinkConfig {
    LinkConfig::new(Duration::from_millis(50), Some(MBIT8), Some(MBIT8)).unwrap()
}

/// Asserts that `got` is within a timer tick of `want`.
#[track_caller]
fn assert_close(got: Duration, want: Duration) {
    let diff = got.abs_diff(want);
    assert!(diff <= Duration::from_millis(1), "took {got:?}, expected {want:?}");
}

#[test]
fn link_config_arithmetic() {
    let link = LinkConfig::wan(50, 1000);
    assert_eq!(link.rtt, Duration::from_millis(50));
    assert_eq!(link.up_bits_per_sec, Some(1_000_000_000));
    assert_eq!(link.down_time(4096), Duration::from_nanos(32_768));
    assert_eq!(slow_link().up_time(10_000), Duration::from_millis(10));
    assert_eq!(LinkConfig::unlimited(Duration::ZERO).down_time(1 << 30), Duration::ZERO);
    // Sub-nanosecond remainders round up: 1 byte at 3 bit/s is 2.666… s.
    assert_eq!(
        LinkConfig::symmetric(Duration::ZERO, 3).up_time(1),
        Duration::from_nanos(2_666_666_667)
    );
    assert!(matches!(
        LinkConfig::new(Duration::ZERO, Some(0), None),
        Err(StoreError::InvalidConfig(_))
    ));
}

#[test]
#[should_panic(expected = "bandwidth must be positive")]
fn zero_bandwidth_is_refused() {
    let _ = LatencyStore::new(memory(), LinkConfig::wan(50, 0));
}

#[tokio::test(start_paused = true)]
async fn one_call_costs_rtt_plus_transfer() {
    let store = LatencyStore::new(MemoryStore::new(big_geometry()), slow_link());
    let rtt = Duration::from_millis(50);

    // A read sends 16 bytes of address and receives 10 000 bytes.
    let start = Instant::now();
    store.read(&[CellId(1)]).await.unwrap();
    assert_close(start.elapsed(), rtt + Duration::from_micros(16 + 10_000));

    // A write sends the cell and its address; the answer is empty.
    let start = Instant::now();
    store.write(vec![(CellId(1), vec![9; 10_000])]).await.unwrap();
    assert_close(start.elapsed(), rtt + Duration::from_micros(10_016));

    // Ranged reads receive only the ranges.
    let start = Instant::now();
    store.read_ranges(&[range(1, 0, 2000), range(2, 0, 3000)]).await.unwrap();
    assert_close(start.elapsed(), rtt + Duration::from_micros(32 + 5000));

    // A flush does not cross the link: the stores a link stands for (S3, Redis) make a write
    // durable before acknowledging it, and their flush does nothing.
    let start = Instant::now();
    store.flush().await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);

    // Rejected requests still cross the link.
    let start = Instant::now();
    store.read(&[CellId(100)]).await.unwrap_err();
    assert_close(start.elapsed(), rtt);
}

#[tokio::test(start_paused = true)]
async fn concurrent_calls_share_bandwidth_and_overlap_latency() {
    let store = LatencyStore::new(MemoryStore::new(big_geometry()), slow_link());
    let start = Instant::now();
    let call = |c: u64| {
        let store = &store;
        async move {
            store.read(&[CellId(c)]).await.unwrap();
            start.elapsed()
        }
    };
    let (a, b) = tokio::join!(call(1), call(2));
    // Both requests go up at once (16 µs each, one after the other) and cross in parallel;
    // the second response to reach the link waits for the first on the downstream link. (Both
    // arrive on the same timer tick, so which one goes first is up to the scheduler.)
    let (first, second) = (a.min(b), a.max(b));
    assert_close(first, Duration::from_micros(50_000 + 16 + 10_000));
    assert_close(second, Duration::from_micros(50_000 + 16 + 20_000));
}

#[tokio::test(start_paused = true)]
async fn propagation_overlaps_without_a_bandwidth_limit() {
    let store = LatencyStore::new(
        MemoryStore::new(big_geometry()),
        LinkConfig::unlimited(Duration::from_millis(50)),
    );
    let start = Instant::now();
    let ranges: Vec<[ByteRange; 1]> = (0..8).map(|c| [range(c, 0, 10_000)]).collect();
    let set: Vec<_> = ranges.iter().map(|r| store.read_ranges(r)).collect();
    let results = join_all(set).await;
    assert!(results.iter().all(Result::is_ok));
    assert_close(start.elapsed(), Duration::from_millis(50));
}

/// Polls every future to completion on this task.
async fn join_all<F: std::future::Future + Unpin>(mut futures: Vec<F>) -> Vec<F::Output> {
    use std::task::Poll;
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futures.iter_mut().zip(out.iter_mut()) {
            if slot.is_none() {
                match std::pin::Pin::new(f).poll(cx) {
                    Poll::Ready(v) => *slot = Some(v),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

#[tokio::test(start_paused = true)]
async fn accurate_at_50ms_and_1_gbit() {
    let store = LatencyStore::new(
        MemoryStore::new(Geometry::new(64, 65_536).unwrap()),
        LinkConfig::wan(50, 1000),
    );
    let link = store.link();

    // Sequential calls: each ends on the timer tick nearest to its ideal end, so small calls
    // (whose transfer takes far less than a tick) are not rounded up to a whole extra tick.
    for (bytes, tolerance) in [(4096, 200), (65_536, 100)] {
        let start = Instant::now();
        for c in 0..20 {
            store.read_ranges(&[range(c, 0, bytes)]).await.unwrap();
        }
        let ideal = 20 * (link.rtt + link.up_time(16) + link.down_time(bytes.into()));
        let got = start.elapsed();
        let error = got.abs_diff(ideal);
        assert!(error <= 20 * Duration::from_micros(500), "took {got:?}, ideal {ideal:?}");
        assert!(error < ideal / tolerance, "took {got:?}, ideal {ideal:?}");
    }

    // Concurrent calls: the link is shared exactly.
    let start = Instant::now();
    let ids: Vec<[CellId; 1]> = (0..64).map(|c| [CellId(c)]).collect();
    let calls: Vec<_> = ids.iter().map(|id| store.read(id)).collect();
    for r in join_all(calls).await {
        r.unwrap();
    }
    let ideal = link.rtt + link.up_time(16) + 64 * link.down_time(65_536);
    assert_close(start.elapsed(), ideal);
}

// ---- faults ---------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Injected,
    Timeout,
}

async fn outcomes(store: &dyn Store, calls: u64) -> Vec<Outcome> {
    let mut out = Vec::new();
    for i in 0..calls {
        let result = if i % 2 == 0 {
            store.read(&[CellId(i % 10)]).await.map(|_| ())
        } else {
            store.write(vec![(CellId(i % 10), vec![i as u8; 32])]).await
        };
        out.push(match result {
            Ok(()) => Outcome::Ok,
            Err(e) => {
                assert!(e.is_retryable(), "{e:?} should be retryable");
                match e {
                    StoreError::Injected(_) => Outcome::Injected,
                    StoreError::Timeout(_) => Outcome::Timeout,
                    other => panic!("unexpected error {other:?}"),
                }
            }
        });
    }
    out
}

fn mixed(seed: u64) -> FaultConfig {
    FaultConfig {
        seed,
        error_rate: 0.1,
        timeout_rate: 0.05,
        timeout: Duration::from_millis(5),
        lost_ack_rate: 0.2,
    }
}

#[tokio::test(start_paused = true)]
async fn same_seed_same_faults() {
    let a = outcomes(&FaultStore::new(memory(), mixed(42)), 300).await;
    let b = outcomes(&FaultStore::new(memory(), mixed(42)), 300).await;
    let c = outcomes(&FaultStore::new(memory(), mixed(43)), 300).await;
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.contains(&Outcome::Ok) && a.contains(&Outcome::Injected));
    assert!(a.contains(&Outcome::Timeout));
}

#[tokio::test(start_paused = true)]
async fn fault_rates_are_respected() {
    let store = FaultStore::new(CountingStore::new(memory()), mixed(7));
    let out = outcomes(&store, 2000).await;
    let counts = store.inner().counts();
    let forwarded_reads = counts.read_requests;
    let forwarded_writes = counts.write_requests;
    // Errors and time-outs stop 15% of all 2000 calls; lost acks hit 20% of the 1000 writes,
    // which are forwarded and then reported as failures.
    let timeouts = out.iter().filter(|&&o| o == Outcome::Timeout).count() as u64;
    let failures = out.iter().filter(|&&o| o != Outcome::Ok).count() as u64;
    let stopped = 2000 - forwarded_reads - forwarded_writes;
    let lost_acks = failures - stopped;
    // Within four standard deviations (the seed is fixed, so this never flakes).
    let within = |got: u64, want: f64| (got as f64 - want).abs() < 4.0 * want.sqrt();
    assert!(within(stopped, 300.0), "{stopped} calls stopped, expected about 300");
    assert!(within(timeouts, 100.0), "{timeouts} time-outs, expected about 100");
    assert!(within(lost_acks, 200.0), "{lost_acks} lost acks");
    assert_eq!(store.injected(), failures);
}

#[tokio::test]
async fn lost_acks_really_write() {
    let config = FaultConfig { seed: 1, lost_ack_rate: 1.0, ..FaultConfig::default() };
    let store = FaultStore::new(memory(), config);
    let err = store.write(vec![(CellId(3), vec![3; 32])]).await.unwrap_err();
    assert!(matches!(err, StoreError::Injected(_)) && err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("acknowledgement"), "{err}");
    // Reads are not affected by the lost-ack rate, and see the write.
    assert_eq!(store.read(&[CellId(3)]).await.unwrap(), vec![vec![3; 32]]);
    assert_eq!(store.injected(), 1);
}

#[tokio::test]
async fn injected_errors_never_reach_the_store() {
    let config = FaultConfig { seed: 1, error_rate: 1.0, ..FaultConfig::default() };
    let store = FaultStore::new(CountingStore::new(memory()), config);
    for _ in 0..5 {
        let err = store.write(vec![(CellId(3), vec![3; 32])]).await.unwrap_err();
        assert!(matches!(err, StoreError::Injected(_)) && err.is_retryable());
        assert!(store.read(&[CellId(3)]).await.unwrap_err().is_retryable());
        assert!(store.flush().await.unwrap_err().is_retryable());
    }
    assert_eq!(store.inner().counts(), Counts::default());
    assert_eq!(store.injected(), 15);
    assert_eq!(store.inner().inner().read(&[CellId(3)]).await.unwrap(), vec![vec![0; 32]]);
}

#[tokio::test(start_paused = true)]
async fn timeouts_wait_then_fail_without_forwarding() {
    let timeout = Duration::from_secs(3);
    let config = FaultConfig { seed: 1, timeout_rate: 1.0, timeout, ..FaultConfig::default() };
    let store = FaultStore::new(CountingStore::new(memory()), config);
    let start = Instant::now();
    let err = store.read_ranges(&[range(0, 0, 1)]).await.unwrap_err();
    assert_eq!(start.elapsed(), timeout);
    assert!(matches!(err, StoreError::Timeout(_)) && err.is_retryable(), "{err:?}");
    assert_eq!(store.inner().counts(), Counts::default());
}

#[test]
fn fault_configs_are_validated() {
    assert!(FaultConfig::default().validate().is_ok());
    let bad = [
        FaultConfig { error_rate: -0.1, ..FaultConfig::default() },
        FaultConfig { timeout_rate: 1.5, ..FaultConfig::default() },
        FaultConfig { lost_ack_rate: f64::NAN, ..FaultConfig::default() },
        FaultConfig { error_rate: 0.6, timeout_rate: 0.6, ..FaultConfig::default() },
    ];
    for config in bad {
        assert!(matches!(config.validate(), Err(StoreError::InvalidConfig(_))), "{config:?}");
    }
}

#[test]
#[should_panic(expected = "FaultStore::new")]
fn invalid_fault_config_is_refused() {
    let _ = FaultStore::new(memory(), FaultConfig { error_rate: 2.0, ..FaultConfig::default() });
}
