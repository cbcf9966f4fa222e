//! The TEE operations through `remote://` against an in-process storage server whose trusted
//! component is the plaintext stand-in of `blindfold_testkit::tee` (the real enclave is tested
//! end to end elsewhere): the conformance checks, queries during a round, the server's own
//! shape checks and limits on raw frames, and the refusal of a server without a trusted
//! component.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blindfold_server::{Auth, Limits, Server, ServerConfig};
use blindfold_store::remote::protocol::{self, Decoder, Request};
use blindfold_store::remote::AuthKey;
use blindfold_store::{
    open_tee_store, CellId, RemoteStore, Store, StoreError, StoreUrl, TeeLayer, TeeRound, TeeStore,
    Trusted,
};
use blindfold_testkit::tee::{
    self, block, geometry, layer, malformed_queries, malformed_rounds, query_ticket, run_tee,
    sample_round, PlainTrusted,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn key() -> AuthKey {
    AuthKey::from_bytes([0x7e; 32])
}

async fn server(
    trusted: Option<Arc<dyn Trusted>>,
    limits: Limits,
) -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let mut config = ServerConfig { limits, ..ServerConfig::new(Auth::Key(key())) };
    if let Some(t) = trusted {
        config = config.with_trusted(t);
    }
    let (addr, task) = Server::bind("127.0.0.1:0", StoreUrl::Memory, config).await.unwrap().spawn();
    (addr.to_string(), task)
}

async fn open(addr: &str, name: &str) -> RemoteStore {
    RemoteStore::open(addr, Some(key()), name, geometry()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_a_trusted_component_passes_the_tee_checks() {
    let trusted = Arc::new(PlainTrusted::new());
    let (addr, task) =
        server(Some(Arc::clone(&trusted) as Arc<dyn Trusted>), Limits::default()).await;
    run_tee(&open(&addr, "conformance").await).await;
    assert!(trusted.evictions() > 0 && trusted.queries() > 0, "the server's component ran");
    // open_tee_store gives the same for a remote:// URL without an in-process component.
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("storage.key");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&key_file);
        writeln!(f.as_mut().unwrap(), "{}", "7e".repeat(32)).unwrap();
    }
    let url = StoreUrl::parse(&format!("remote://{addr}?key_file={}", key_file.display())).unwrap();
    let store = open_tee_store(&url, "opened", geometry(), None).await.unwrap();
    run_tee(&*store).await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_are_answered_while_a_round_runs_on_the_server() {
    let slow = Arc::new(PlainTrusted::slow(Duration::from_millis(150)));
    let (addr, task) = server(Some(slow as Arc<dyn Trusted>), Limits::default()).await;
    let store = open(&addr, "busy").await;
    store.write(vec![(CellId(20), block(20)), (CellId(21), block(21))]).await.unwrap();
    let done = AtomicBool::new(false);
    let round = async {
        store.tee_evict(&sample_round()).await.unwrap();
        done.store(true, Ordering::SeqCst);
    };
    let queries = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        for i in 0..6u32 {
            let answer =
                store.tee_query(&[CellId(21), CellId(20)], &query_ticket(i % 2)).await.unwrap();
            assert_eq!(answer, block(21 - (i % 2) as u8));
            assert!(!done.load(Ordering::SeqCst), "query {i} waited for the round");
        }
    };
    tokio::join!(round, queries);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_a_trusted_component_says_how_to_start_one() {
    let (addr, task) = server(None, Limits::default()).await;
    let store = open(&addr, "plain").await;
    store.write(vec![(CellId(1), block(1))]).await.unwrap();
    let err = store.tee_query(&[CellId(1)], &query_ticket(0)).await.unwrap_err();
    assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
    assert!(err.to_string().contains("runs no trusted component"), "{err}");
    assert!(err.to_string().contains("--enclave-key"), "{err}");
    let err = store.tee_evict(&sample_round()).await.unwrap_err();
    assert!(matches!(err, StoreError::Unsupported(_)), "{err:?}");
    // Nothing was written, and the connection goes on.
    assert_eq!(store.read(&[CellId(0), CellId(1)]).await.unwrap(), vec![vec![0; 24], block(1)]);
    task.abort();
}

/// A raw connection past the handshake, with array `name` of the TEE geometry as handle 0.
async fn raw(addr: &str, name: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&protocol::hello()).await.unwrap();
    let mut hello = [0u8; protocol::HELLO_LEN];
    s.read_exact(&mut hello).await.unwrap();
    let mut c = [0u8; protocol::CHALLENGE_LEN];
    s.read_exact(&mut c).await.unwrap();
    let (_, server_nonce) = protocol::parse_challenge(&c).unwrap();
    let client_nonce = [3u8; 32];
    s.write_all(&client_nonce).await.unwrap();
    s.write_all(&key().client_proof(&server_nonce, &client_nonce)).await.unwrap();
    let mut verdict = [0u8; 1 + protocol::ACCEPT_LEN];
    s.read_exact(&mut verdict).await.unwrap();
    assert_eq!(verdict[0], 0);
    let open =
        Request::Open { cell_count: tee::CELL_COUNT, cell_size: tee::CELL_SIZE, name: name.into() };
    let (status, body) = call(&mut s, 0, &open).await;
    assert_eq!((status, body), (0, 0u32.to_le_bytes().to_vec()));
    s
}

/// Sends `req` (unchecked: the client's own checks are bypassed) and reads its answer.
async fn call(s: &mut TcpStream, id: u64, req: &Request) -> (u8, Vec<u8>) {
    s.write_all(&req.frame(id, protocol::MAX_FRAME).unwrap()).await.unwrap();
    let len = tokio::time::timeout(Duration::from_secs(10), s.read_u32_le())
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let mut frame = vec![0u8; len as usize];
    s.read_exact(&mut frame).await.unwrap();
    assert_eq!(u64::from_le_bytes(frame[..8].try_into().unwrap()), id);
    (frame[8], frame[9..].to_vec())
}

fn error_of((status, body): (u8, Vec<u8>)) -> StoreError {
    assert_eq!(status, 1, "an error answer");
    protocol::get_error(&mut Decoder::new(&body)).unwrap()
}

/// The server checks shapes itself: a peer that skips the client's checks gets a clear error
/// and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_refuses_malformed_tee_requests_from_a_raw_peer() {
    let trusted = Arc::new(PlainTrusted::new());
    let (addr, task) =
        server(Some(Arc::clone(&trusted) as Arc<dyn Trusted>), Limits::default()).await;
    let mut s = raw(&addr, "raw").await;
    let mut id = 1;
    for (what, round) in malformed_rounds() {
        id += 1;
        let err = error_of(call(&mut s, id, &Request::TeeEvict { handle: 0, round }).await);
        assert!(
            matches!(err, StoreError::InvalidRequest(_) | StoreError::OutOfRange { .. }),
            "{what}: {err:?}"
        );
    }
    for (what, cells, ticket) in malformed_queries() {
        id += 1;
        let err = error_of(call(&mut s, id, &Request::TeeQuery { handle: 0, cells, ticket }).await);
        assert!(
            matches!(err, StoreError::InvalidRequest(_) | StoreError::OutOfRange { .. }),
            "{what}: {err:?}"
        );
    }
    assert_eq!((trusted.queries(), trusted.evictions()), (0, 0), "refused before running");
    // A well-formed request on the same connection still runs.
    let ok = call(
        &mut s,
        99,
        &Request::TeeQuery { handle: 0, cells: vec![CellId(3)], ticket: query_ticket(0) },
    )
    .await;
    assert_eq!(ok, (0, vec![0; tee::CELL_SIZE as usize]));
    let store = open(&addr, "raw").await;
    let all: Vec<CellId> = (0..tee::CELL_COUNT).map(CellId).collect();
    assert!(store.read(&all).await.unwrap().iter().all(|c| c.iter().all(|&b| b == 0)));
    task.abort();
}

/// A round's working memory (incoming blocks and layer buffers) counts against the server's
/// limits: one too large for its frames is refused before it runs, and the server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_too_large_for_the_servers_limits_is_refused() {
    let limits = Limits { max_frame: 8192, connection_buffer: 16384, ..Limits::default() };
    let trusted = Arc::new(PlainTrusted::new());
    let (addr, task) = server(Some(Arc::clone(&trusted) as Arc<dyn Trusted>), limits).await;
    let store = open(&addr, "small").await;
    // 100 incoming blocks of 24 bytes fit in one frame (2.4 KiB and tickets), but the host
    // would hold them and three buffers of 102 blocks: about 10 KiB.
    let q = 100u32;
    let perm: Vec<u32> = (0..q + 2).rev().collect();
    let round = TeeRound {
        incoming: (0..q).map(|i| block(i as u8)).collect(),
        layers: vec![layer(&[0, 1], &[0, 1], &perm)],
    };
    let err = store.tee_evict(&round).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err:?}");
    assert!(err.to_string().contains("--max-frame-mib"), "{err}");
    assert_eq!(trusted.evictions(), 0);
    // A smaller round runs.
    let small = TeeRound {
        incoming: vec![block(5)],
        layers: vec![TeeLayer {
            ticket: tee::evict_ticket(&[2, 1, 0]),
            ..layer(&[0, 1], &[0, 1], &[])
        }],
    };
    store.tee_evict(&small).await.unwrap();
    assert_eq!(store.read(&[CellId(0)]).await.unwrap(), vec![block(5)]);
    task.abort();
}
