//! Hostile input for the node service and for the balancer's side of it: random and mutated
//! frames into every decoder of the wire format and into the node's RPC handlers (a real node
//! over a real engine, in process). Nothing may panic; every refusal is an error that says what
//! is wrong; nothing decoded holds much more than the bytes it came from; and the node goes on
//! serving valid requests.
//!
//! Cases: `BLINDFOLD_FUZZ_CASES` (see `blindfold_testkit::fuzz`).

use std::sync::Arc;

use blindfold_gateway::server::{OramEngine, ServeConfig};
use blindfold_node::node::{info_of, NodeService};
use blindfold_node::proto::node_server::Node;
use blindfold_node::wire::{self, Access, Frame, NodeInfo};
use blindfold_testkit::fuzz;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use tonic::Request;

/// What a decoded value may hold for `len` bytes of input: a few times the input (a write's
/// block is copied out, ids widen into tuples). (The workspace forbids `unsafe`, so there is
/// no counting allocator here: the decoders check lengths before they allocate, and what they
/// return is measured.)
fn bound(len: usize) -> usize {
    4 * len + 64
}

const BS: usize = 64;
const BLOCKS: u64 = 40;

/// A valid Access body, then mutated: bytes flipped, cut short or extended.
fn mutated_access() -> impl Strategy<Value = Vec<u8>> {
    let access = (
        prop::collection::vec(0..BLOCKS + 2, 0..6),
        prop::collection::vec((0..BLOCKS + 2, any::<u8>()), 0..6),
    )
        .prop_map(|(reads, writes)| {
            Access { reads, writes: writes.into_iter().map(|(i, b)| (i, vec![b; BS])).collect() }
                .encode(BS)
        });
    (
        access,
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        prop_oneof![Just(None), (0usize..200).prop_map(Some)],
        prop::collection::vec(any::<u8>(), 0..3),
    )
        .prop_map(|(mut body, flips, cut, tail)| {
            for (at, x) in flips {
                if !body.is_empty() {
                    let i = at.index(body.len());
                    body[i] ^= x;
                }
            }
            if let Some(c) = cut {
                body.truncate(c);
            }
            body.extend(tail);
            body
        })
}

fn any_frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..120),
        mutated_access(),
        // Headers that claim many blocks, with little behind them.
        (any::<u32>(), any::<u32>(), prop::collection::vec(any::<u8>(), 0..64)).prop_map(
            |(r, w, rest)| {
                let mut b = r.to_le_bytes().to_vec();
                b.extend_from_slice(&w.to_le_bytes());
                b.extend(rest);
                b
            }
        ),
    ]
}

/// Every decoder on both sides of the wire, on random and mutated bytes: an answer or an error
/// that says what was wrong, never a panic, and nothing decoded larger than its input.
#[test]
fn decoders_refuse_hostile_bytes_and_hold_no_more_than_they_were_given() {
    let mut runner = TestRunner::new(fuzz::config());
    runner
        .run(&(any_frame(), 0usize..8), |(bytes, reads)| {
            let len = bytes.len();
            match Access::decode(&bytes, BLOCKS, BS) {
                // What decodes is canonical, within the node and no larger than its input.
                Ok(a) => {
                    let held = 8 * a.reads.capacity() + a.writes.capacity() * (32 + BS);
                    prop_assert!(held <= bound(len), "{held} bytes held for {len}");
                    prop_assert_eq!(a.encode(BS), bytes.clone());
                    prop_assert!(a
                        .reads
                        .iter()
                        .chain(a.writes.iter().map(|w| &w.0))
                        .all(|&i| i < BLOCKS));
                }
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
            if let Ok(i) = NodeInfo::decode(&bytes) {
                prop_assert_eq!(i.encode(), bytes.clone());
            }
            prop_assert_eq!(wire::decode_blocks(&bytes, reads, BS).is_ok(), len == 8 + reads * BS);
            prop_assert_eq!(wire::decode_instance(&bytes).is_ok(), len == 8);
            match wire::decode_verify(&bytes) {
                Ok(r) => {
                    let held = r.failures.capacity() * 32
                        + r.failures.iter().map(|f| f.1.capacity()).sum::<usize>();
                    prop_assert!(held <= bound(len), "{held} bytes held for {len}");
                }
                Err(e) => prop_assert!(e.to_string().contains("verify reply"), "{e}"),
            }
            Ok(())
        })
        .unwrap();
}

/// The node's RPC handlers, on a real node (a Path ORAM engine over files), with random and
/// mutated bodies: each call answers or is refused with `InvalidArgument` and a reason; the
/// node then still serves a valid access and reads back what it wrote.
#[test]
fn node_handlers_refuse_hostile_frames_and_keep_serving() {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_path_buf(),
        store: None,
        key_file: None,
        passphrase: None,
        credentials: None,
        capacity: BLOCKS * BS as u64,
        block_size: BS as u32,
        pad_objects: false,
        cache_mib: 0,
        engine: OramEngine::PathOram,
        in_place: false,
        pack_levels: 1,
        durability: Default::default(),
        lease_ttl: None,
        anchor: None,
        reads_ahead_of_log: false,
        log_feed: None,
    };
    let (service, opened) = rt.block_on(async {
        let mut cfg = cfg.clone();
        cfg.credentials = Some(("blindfold-node".into(), "unused".into()));
        let opened = blindfold_gateway::server::open(&cfg).await.unwrap();
        let info = info_of(&opened.params).unwrap();
        (Arc::new(NodeService::new(Arc::clone(opened.objects.engine()), info)), opened)
    });
    let mut runner = TestRunner::new(fuzz::config_scaled(2));
    runner
        .run(&(any_frame(), 0u8..4), |(body, rpc)| {
            let svc = Arc::clone(&service);
            let len = body.len();
            let answer = rt.block_on(async move {
                let req = Request::new(Frame::new(body));
                match rpc {
                    0 => svc.access(req).await,
                    1 => svc.commit(req).await,
                    2 => Node::info(&*svc, req).await,
                    _ => svc.verify(req).await,
                }
            });
            match answer {
                Ok(reply) => {
                    let reply = reply.into_inner().body;
                    prop_assert!(
                        reply.len() <= wire::max_message(BS),
                        "a reply of {}",
                        reply.len()
                    );
                }
                Err(status) => {
                    prop_assert_eq!(status.code(), tonic::Code::InvalidArgument, "{}", status);
                    prop_assert!(!status.message().is_empty());
                    prop_assert!(len > 0 || rpc == 0, "an empty {rpc} body was refused");
                }
            }
            Ok(())
        })
        .unwrap();
    rt.block_on(async {
        let write = Access { reads: vec![], writes: vec![(3, vec![0xab; BS])] }.encode(BS);
        service.access(Request::new(Frame::new(write))).await.unwrap();
        let read = Access { reads: vec![3], writes: vec![] }.encode(BS);
        let reply = service.access(Request::new(Frame::new(read))).await.unwrap();
        let (_, blocks) = wire::decode_blocks(&reply.into_inner().body, 1, BS).unwrap();
        assert_eq!(blocks, vec![vec![0xab; BS]]);
        opened.objects.shutdown().await.unwrap();
    });
}
