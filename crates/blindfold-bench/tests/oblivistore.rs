//! `bench oblivistore` at toy sizes: every experiment produces its rows, the JSON rows carry
//! every field the issue names, the link is really in the way, CURIOUS and two ORAM nodes behind
//! the load balancer (over real gRPC with mutual TLS) produce rows too.

use std::time::Duration;

use blindfold_bench::oblivistore::{self, build_engine, ObliviStoreBench, StoreKind};
use blindfold_store::LinkConfig;

const FIELDS: [&str; 11] = [
    "engine",
    "nodes",
    "rtt_ms",
    "clients",
    "ops_per_sec",
    "mb_per_sec",
    "mean_response_ms",
    "p99_response_ms",
    "blowup",
    "seeks_per_op",
    "trusted_bytes",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn toy_run_produces_every_experiment() {
    let work = tempfile::tempdir().unwrap();
    let p = ObliviStoreBench {
        rtts_ms: vec![0, 20],
        nodes: vec![1, 2],
        nodes_rtt_ms: 20,
        blocks: 256,
        block_size: 256,
        clients: Some(8),
        ops: 150,
        max_seconds: 5.0,
        work_dir: work.path().to_path_buf(),
        progress: false,
        ..ObliviStoreBench::default()
    };
    let r = oblivistore::run(&p).await.unwrap();
    let find = |exp: &str, engine: &str, rtt: u64| {
        r.rows
            .iter()
            .find(|x| x.experiment == exp && x.engine == engine && x.rtt_ms == rtt)
            .unwrap_or_else(|| panic!("no {exp} row for {engine} at {rtt} ms"))
    };
    for engine in ["oblivistore", "curious", "curious-path", "tao"] {
        let fast = find("latency", engine, 0);
        let slow = find("latency", engine, 20);
        let seeks = find("seeks", engine, 0);
        let one = find("nodes", engine, 20);
        let two = r
            .rows
            .iter()
            .find(|x| x.experiment == "nodes" && x.engine == engine && x.nodes == 2)
            .unwrap_or_else(|| panic!("no two-node row for {engine}"));
        assert_eq!(two.clients, 2 * one.clients);
        for x in [fast, slow, seeks, one, two] {
            assert!(x.ops > 0 && x.ops <= 150 + 8, "{engine}: {} ops", x.ops);
            assert!(x.ops_per_sec > 0.0 && x.mb_per_sec > 0.0);
            assert!(x.blowup > 1.0, "{engine}: blow-up {}", x.blowup);
            assert!(x.seeks_per_op > 0.0, "{engine}: no seek counted");
            assert!(x.trusted_bytes > 0);
            assert!(x.store_per_logical_byte > 1.0);
            assert!(x.p99_response_ms >= x.p50_response_ms);
        }
        assert_eq!(seeks.store, StoreKind::File);
        assert_eq!(fast.store, StoreKind::Memory);
        // Every operation crosses the 20 ms link at least once.
        assert!(slow.mean_response_ms >= 19.0, "{engine}: {} ms", slow.mean_response_ms);
        assert!(fast.mean_response_ms < slow.mean_response_ms);
        assert_eq!((one.nodes, one.clients), (1, 8));
    }
    assert!(r.skipped.is_empty(), "{:?}", r.skipped.iter().map(|s| &s.reason).collect::<Vec<_>>());
    // The JSON rows carry every field, as numbers or strings, never null.
    let json = serde_json::to_value(&r.rows).unwrap();
    let rows = json.as_array().unwrap();
    assert_eq!(rows.len(), r.rows.len());
    for row in rows {
        for f in FIELDS {
            let v = row.get(f).unwrap_or_else(|| panic!("{f} missing from {row}"));
            assert!(v.is_number() || v.is_string(), "{f} = {v}");
        }
    }
    // The tables, verdicts, CSV and plots.
    let text = oblivistore::render(&r);
    assert!(text.contains("machine:") && text.contains("31.5 MB/s"), "{text}");
    // 31.5 MB/s, the port's rates for oblivistore, curious and curious-path, the nodes.
    assert_eq!(r.targets.len(), 5);
    assert!(r.targets.last().unwrap().met.is_some(), "nodes > 1 judged");
    let out = work.path().join("out");
    let files = oblivistore::save(&r, &out).unwrap();
    assert_eq!(files.len(), 5);
    let csv = std::fs::read_to_string(out.join("oblivistore.csv")).unwrap();
    assert_eq!(csv.lines().count(), r.rows.len() + 1);
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "svg")) {
        let svg = std::fs::read_to_string(f).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("<polyline"), "{}", f.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_engine_builds_every_engine_and_refuses_others() {
    let dir = tempfile::tempdir().unwrap();
    let link = LinkConfig::unlimited(Duration::ZERO);
    let b = build_engine("curious", 1, link, StoreKind::Memory, 64, 64, dir.path()).await.unwrap();
    assert_eq!(b.engine.kind(), "curious");
    let b =
        build_engine("curious-path", 1, link, StoreKind::Memory, 64, 64, dir.path()).await.unwrap();
    assert_eq!(b.engine.kind(), "curious-path");
    let b =
        build_engine("oblivistore", 3, link, StoreKind::Memory, 64, 64, dir.path()).await.unwrap();
    assert_eq!(b.engine.kind(), "nodes");
    let e = build_engine("oblivistore", 0, link, StoreKind::Memory, 64, 64, dir.path()).await;
    assert!(e.err().unwrap().to_string().contains("at least 1"));
    let e = build_engine("ring", 1, link, StoreKind::Memory, 64, 64, dir.path()).await;
    assert!(e.err().unwrap().to_string().contains("unknown engine"));
    let b =
        build_engine("oblivistore", 1, link, StoreKind::Memory, 64, 64, dir.path()).await.unwrap();
    assert_eq!(b.engine.kind(), "oblivistore");
    assert!(b.store_bytes() > 64 * 64);
}
