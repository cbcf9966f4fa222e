//! Hostile input for the storage server, over real sockets: random bytes at every step of the
//! handshake, and random frames (well-framed or not) from an authenticated peer. The server must
//! answer every well-framed request with a well-formed answer or close the connection, never
//! panic or allocate beyond its limits, and go on serving the gateway. The server runs a
//! (plaintext stand-in) trusted component, so TEE requests of any shape reach its host.
//!
//! Cases: `BLINDFOLD_FUZZ_CASES` (see `blindfold_testkit::fuzz`).

use std::sync::Arc;
use std::time::Duration;

use blindfold_server::{Auth, Limits, Server, ServerConfig};
use blindfold_store::remote::protocol::{self, op, Encoder, Request};
use blindfold_store::remote::AuthKey;
use blindfold_store::{CellId, Geometry, RemoteStore, Store, StoreUrl, TeeLayer, TeeRound};
use blindfold_testkit::fuzz;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn key() -> AuthKey {
    AuthKey::from_bytes([0x66; 32])
}

/// What the peer sends.
#[derive(Clone, Debug)]
enum Attack {
    /// Random bytes from the first byte on (sometimes after a valid hello).
    Raw { valid_hello: bool, bytes: Vec<u8> },
    /// After a valid handshake: requests with correct length prefixes and random content, then
    /// an `open` with id `u64::MAX` whose answer ends the case.
    Frames(Vec<(u8, Vec<u8>)>),
    /// After a valid handshake: frames whose op and handle are valid and whose body is random.
    Bodies(Vec<(u8, Vec<u8>)>),
    /// After a valid handshake: random bytes, then the peer closes.
    Garbage(Vec<u8>),
    /// After a valid handshake: well-encoded TEE requests of random shapes and tickets.
    Tee(Vec<Request>),
}

/// Cells of the fuzzed array (64 of 32 bytes), some out of range.
fn any_cells() -> impl Strategy<Value = Vec<CellId>> {
    prop::collection::vec((0u64..70).prop_map(CellId), 0..5)
}

fn any_tee_request() -> impl Strategy<Value = Request> {
    let ticket = || prop::collection::vec(0u8..6, 0..24);
    let block = prop_oneof![4 => Just(32usize), 1 => 0usize..40]
        .prop_flat_map(|n| prop::collection::vec(any::<u8>(), n));
    let layer = (any_cells(), any_cells(), ticket()).prop_map(|(read, write, ticket)| TeeLayer {
        read,
        write,
        ticket,
    });
    prop_oneof![
        (any_cells(), ticket()).prop_map(|(cells, ticket)| Request::TeeQuery {
            handle: 0,
            cells,
            ticket
        }),
        (prop::collection::vec(block, 0..3), prop::collection::vec(layer, 0..4)).prop_map(
            |(incoming, layers)| Request::TeeEvict {
                handle: 0,
                round: TeeRound { incoming, layers }
            }
        ),
    ]
}

fn any_attack() -> impl Strategy<Value = Attack> {
    let bytes = || prop::collection::vec(any::<u8>(), 0..200);
    let ops = prop_oneof![1u8..=11, any::<u8>()];
    prop_oneof![
        (any::<bool>(), bytes())
            .prop_map(|(valid_hello, bytes)| Attack::Raw { valid_hello, bytes }),
        prop::collection::vec((ops.clone(), bytes()), 0..6).prop_map(Attack::Frames),
        prop::collection::vec((ops, bytes()), 0..6).prop_map(Attack::Bodies),
        bytes().prop_map(Attack::Garbage),
        prop::collection::vec(any_tee_request(), 1..6).prop_map(Attack::Tee),
    ]
}

async fn handshake(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&protocol::hello()).await.unwrap();
    let mut hello = [0u8; protocol::HELLO_LEN];
    s.read_exact(&mut hello).await.unwrap();
    let mut c = [0u8; protocol::CHALLENGE_LEN];
    s.read_exact(&mut c).await.unwrap();
    let (_, server_nonce) = protocol::parse_challenge(&c).unwrap();
    let client_nonce = [5u8; 32];
    s.write_all(&client_nonce).await.unwrap();
    s.write_all(&key().client_proof(&server_nonce, &client_nonce)).await.unwrap();
    let mut verdict = [0u8; 1 + protocol::ACCEPT_LEN];
    s.read_exact(&mut verdict).await.unwrap();
    assert_eq!(verdict[0], 0);
    s
}

/// Reads answers until the one to `last`; each must be well-formed. `false` if the server
/// closed the connection first.
async fn answers_until(s: &mut TcpStream, last: u64, max_frame: usize) -> bool {
    loop {
        let Ok(len) = s.read_u32_le().await else { return false };
        let len = len as usize;
        assert!((protocol::FRAME_HEAD..=max_frame).contains(&len), "a frame of {len} bytes");
        let mut frame = vec![0u8; len];
        if s.read_exact(&mut frame).await.is_err() {
            return false;
        }
        let id = u64::from_le_bytes(frame[..8].try_into().unwrap());
        let reply = protocol::decode_reply(frame[8], frame[9..].to_vec());
        assert!(reply.is_ok(), "a malformed answer: {reply:?}");
        if id == last {
            return true;
        }
    }
}

async fn attack(addr: &str, attack: Attack, max_frame: usize) {
    match attack {
        Attack::Raw { valid_hello, bytes } => {
            let mut s = TcpStream::connect(addr).await.unwrap();
            if valid_hello {
                let _ = s.write_all(&protocol::hello()).await;
            }
            let _ = s.write_all(&bytes).await;
            let _ = s.shutdown().await;
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got).await;
            // At most the hello, the challenge and a refusal: never an answer to a request.
            assert!(
                got.len()
                    <= protocol::HELLO_LEN + protocol::CHALLENGE_LEN + 3 + protocol::MAX_REFUSAL
            );
            if got.len() > protocol::HELLO_LEN + protocol::CHALLENGE_LEN {
                assert_eq!(got[protocol::HELLO_LEN + protocol::CHALLENGE_LEN], 1, "refused");
            }
        }
        Attack::Frames(frames) => requests(addr, frames, false, max_frame).await,
        Attack::Bodies(frames) => requests(addr, frames, true, max_frame).await,
        Attack::Tee(reqs) => {
            let frames = reqs
                .iter()
                .map(|r| {
                    let mut e = Encoder::default();
                    r.encode_body(&mut e);
                    (r.op(), e.0)
                })
                .collect();
            requests(addr, frames, false, max_frame).await
        }
        Attack::Garbage(bytes) => {
            let mut s = handshake(addr).await;
            let _ = s.write_all(&bytes).await;
            let _ = s.shutdown().await;
            let mut got = Vec::new();
            let _ = s.read_to_end(&mut got).await;
        }
    }
}

/// Well-framed requests with random contents (after the handle, if `with_handle`), then an
/// `open` whose answer ends the case: every request must be answered.
async fn requests(addr: &str, frames: Vec<(u8, Vec<u8>)>, with_handle: bool, max_frame: usize) {
    let mut s = handshake(addr).await;
    // An array to aim at: handle 0.
    let mut open = Encoder::frame();
    open.u64(0).u8(op::OPEN).u64(64).u32(32).u16(1).bytes(b"f");
    s.write_all(&open.finish().unwrap()).await.unwrap();
    assert!(answers_until(&mut s, 0, max_frame).await);
    for (i, (op, body)) in frames.into_iter().enumerate() {
        let mut f = Encoder::frame();
        f.u64(i as u64 + 1).u8(op);
        if with_handle && (2..=11).contains(&op) {
            f.u32(0); // the handle
        }
        f.bytes(&body);
        if s.write_all(&f.finish().unwrap()).await.is_err() {
            return;
        }
    }
    let mut last = Encoder::frame();
    last.u64(u64::MAX).u8(op::OPEN).u64(64).u32(32).u16(1).bytes(b"f");
    if s.write_all(&last.finish().unwrap()).await.is_ok() {
        assert!(
            answers_until(&mut s, u64::MAX, max_frame).await,
            "well-framed requests are answered"
        );
    }
}

#[test]
fn hostile_peers_never_break_the_server() {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let max_frame = 64 << 10;
    let limits = Limits {
        max_frame,
        connection_buffer: 4 * max_frame,
        max_memory_bytes: 1 << 20,
        handshake_timeout: Duration::from_secs(5),
        ..Limits::default()
    };
    let (addr, task) = rt.block_on(async {
        let config = ServerConfig { limits, ..ServerConfig::new(Auth::Key(key())) }
            .with_trusted(Arc::new(blindfold_testkit::tee::PlainTrusted::new()));
        let (addr, task) =
            Server::bind("127.0.0.1:0", StoreUrl::Memory, config).await.unwrap().spawn();
        (addr.to_string(), task)
    });
    let mut runner = TestRunner::new(fuzz::config_scaled(2));
    runner
        .run(&any_attack(), |a| {
            rt.block_on(async {
                tokio::time::timeout(Duration::from_secs(20), attack(&addr, a, max_frame))
                    .await
                    .expect("the server answers or closes; it does not hang");
            });
            Ok(())
        })
        .unwrap();
    rt.block_on(async {
        let store = RemoteStore::open(&addr, Some(key()), "after", Geometry::new(4, 8).unwrap())
            .await
            .unwrap();
        store.write(vec![(CellId(2), vec![1; 8])]).await.unwrap();
        assert_eq!(store.read(&[CellId(2)]).await.unwrap(), vec![vec![1; 8]]);
        assert!(!task.is_finished(), "the server is still running");
        task.abort();
    });
}
