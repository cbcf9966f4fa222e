//! The storage server under hostile peers, on raw sockets: peers without the key, a huge
//! `open` shape, huge length prefixes and counts, too many arrays or connections. The server
//! must refuse or answer with an error, and keep serving the gateway.

use std::time::Duration;

use blindfold_server::{Auth, Limits, Server, ServerConfig};
use blindfold_store::remote::protocol::{self, op, Decoder, Encoder};
use blindfold_store::remote::AuthKey;
use blindfold_store::{CellId, Geometry, RemoteStore, Store, StoreError, StoreUrl};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn key() -> AuthKey {
    AuthKey::from_bytes([0x42; 32])
}

async fn start(
    url: StoreUrl,
    limits: Limits,
) -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let config = ServerConfig { limits, ..ServerConfig::new(Auth::Key(key())) };
    let (addr, task) = Server::bind("127.0.0.1:0", url, config).await.unwrap().spawn();
    (addr.to_string(), task)
}

/// Hello, then the server's challenge.
async fn hello(addr: &str) -> (TcpStream, bool, [u8; 32]) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&protocol::hello()).await.unwrap();
    let mut hello = [0u8; protocol::HELLO_LEN];
    s.read_exact(&mut hello).await.unwrap();
    assert_eq!(protocol::parse_hello(&hello), Ok(protocol::VERSION));
    let mut c = [0u8; protocol::CHALLENGE_LEN];
    s.read_exact(&mut c).await.unwrap();
    let (keyed, nonce) = protocol::parse_challenge(&c).unwrap();
    (s, keyed, nonce)
}

/// A raw connection that completed the handshake with the key; returns the server's frame limit.
async fn connect(addr: &str) -> (TcpStream, usize) {
    let (mut s, keyed, server_nonce) = hello(addr).await;
    assert!(keyed);
    let client_nonce = [9u8; 32];
    s.write_all(&client_nonce).await.unwrap();
    s.write_all(&key().client_proof(&server_nonce, &client_nonce)).await.unwrap();
    assert_eq!(s.read_u8().await.unwrap(), 0, "accepted");
    let mut accept = [0u8; protocol::ACCEPT_LEN];
    s.read_exact(&mut accept).await.unwrap();
    let (proof, max_frame) = protocol::parse_accept(&accept).unwrap();
    assert!(key().verify_server(&server_nonce, &client_nonce, &proof));
    (s, max_frame)
}

async fn request(s: &mut TcpStream, id: u64, op: u8, body: &Encoder) -> (u8, Vec<u8>) {
    let mut f = Encoder::frame();
    f.u64(id).u8(op).bytes(&body.0);
    s.write_all(&f.finish().unwrap()).await.unwrap();
    answer(s, id).await
}

async fn answer(s: &mut TcpStream, id: u64) -> (u8, Vec<u8>) {
    let len = tokio::time::timeout(Duration::from_secs(10), s.read_u32_le())
        .await
        .expect("an answer within 10 s")
        .expect("an answer, not a closed connection");
    let mut frame = vec![0u8; len as usize];
    s.read_exact(&mut frame).await.unwrap();
    assert_eq!(u64::from_le_bytes(frame[..8].try_into().unwrap()), id);
    (frame[8], frame[9..].to_vec())
}

fn error_of(status: u8, body: &[u8]) -> StoreError {
    assert_eq!(status, 1, "an error answer");
    protocol::get_error(&mut Decoder::new(body)).unwrap()
}

/// The gateway is still served: open, write, read back.
async fn still_serves(addr: &str, name: &str) {
    let store =
        RemoteStore::open(addr, Some(key()), name, Geometry::new(4, 16).unwrap()).await.unwrap();
    store.write(vec![(CellId(1), vec![9; 16])]).await.unwrap();
    assert_eq!(store.read(&[CellId(1)]).await.unwrap(), vec![vec![9; 16]]);
}

/// Whether the peer closes the connection (within 10 s) without sending anything more.
async fn closed_silently(s: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut rest)).await;
    match read {
        Ok(Ok(n)) => n == 0,
        Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionReset && rest.is_empty(),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_open_shape_is_refused_and_the_server_keeps_serving() {
    let (addr, task) = start(StoreUrl::Memory, Limits::default()).await;
    let (mut s, _) = connect(&addr).await;
    // 2^50 cells of 8 bytes: 8 PiB, which no machine holds. (Before the limits, the server
    // accepted it, and the write below aborted the process allocating the array.)
    let mut open = Encoder::default();
    open.u64(1 << 50).u32(8).u16(4).bytes(b"huge");
    let (status, body) = request(&mut s, 1, op::OPEN, &open).await;
    if status == 0 {
        let mut w = Encoder::default();
        w.u32(0).u32(1).u64(0).u32(8).bytes(&[7; 8]);
        let (status, _) = request(&mut s, 2, op::WRITE, &w).await;
        assert_eq!(status, 1, "a write into an 8 PiB array must fail");
    } else {
        let err = error_of(status, &body);
        assert!(matches!(err, StoreError::InvalidGeometry(_)), "{err:?}");
        assert!(err.to_string().contains("--max-array-gib"), "{err}");
    }
    // Below the per-array limit, but more than the memory limit of a memory: store.
    let mut open = Encoder::default();
    open.u64(1 << 30).u32(1 << 10).u16(3).bytes(b"big");
    let err = error_of_request(&mut s, 3, op::OPEN, &open).await;
    assert!(err.to_string().contains("--max-memory-mib"), "{err}");
    still_serves(&addr, "fine").await;
    task.abort();
}

async fn error_of_request(s: &mut TcpStream, id: u64, op: u8, body: &Encoder) -> StoreError {
    let (status, body) = request(s, id, op, body).await;
    error_of(status, &body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_lengths_and_counts_are_answered_with_errors() {
    let limits = Limits { max_frame: 64 << 10, connection_buffer: 128 << 10, ..Limits::default() };
    let (addr, task) = start(StoreUrl::Memory, limits).await;
    let (mut s, max_frame) = connect(&addr).await;
    assert_eq!(max_frame, 64 << 10, "the handshake announces the limit");
    let mut open = Encoder::default();
    open.u64(1 << 20).u32(64).u16(1).bytes(b"a");
    let (status, body) = request(&mut s, 1, op::OPEN, &open).await;
    assert_eq!((status, body.len()), (0, 4));
    let handle = u32::from_le_bytes(body[..4].try_into().unwrap());

    // A frame above the limit, sent in full: skipped unread, answered, the connection lives on.
    let big = 1 << 20;
    let mut f = Encoder::default();
    f.u32(big as u32 + 9).u64(2).u8(op::WRITE);
    s.write_all(&f.0).await.unwrap();
    s.write_all(&vec![0u8; big]).await.unwrap();
    let (status, body) = answer(&mut s, 2).await;
    let err = error_of(status, &body);
    assert!(err.to_string().contains("--max-frame-mib"), "{err}");

    // A count of 2^32 - 1 cells in a frame that holds one.
    let mut read = Encoder::default();
    read.u32(handle).u32(u32::MAX).u64(0);
    let err = error_of_request(&mut s, 3, op::READ, &read).await;
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err:?}");

    // A read whose answer (4096 cells of 64 bytes = 256 KiB) is larger than a frame.
    let mut read = Encoder::default();
    read.u32(handle).u32(4096);
    for c in 0..4096u64 {
        read.u64(c);
    }
    let err = error_of_request(&mut s, 4, op::READ, &read).await;
    assert!(err.to_string().contains("answer would be larger"), "{err}");

    // The client learned the limit in the handshake and refuses a larger batch itself.
    let store = RemoteStore::open(&addr, Some(key()), "a", Geometry::new(1 << 20, 64).unwrap())
        .await
        .unwrap();
    let batch = (0..2048u64).map(|c| (CellId(c), vec![1u8; 64])).collect();
    let err = store.write(batch).await.unwrap_err();
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err:?}");
    assert!(err.to_string().contains("split the batch"), "{err}");

    // A length prefix of 4 GiB: answered at once (the body would only be skipped).
    let mut f = Encoder::default();
    f.u32(u32::MAX).u64(5).u8(op::WRITE);
    s.write_all(&f.0).await.unwrap();
    let (status, body) = answer(&mut s, 5).await;
    assert!(error_of(status, &body).to_string().contains("--max-frame-mib"));
    drop(s);
    still_serves(&addr, "b").await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_without_the_key_is_refused_and_nothing_else() {
    let (addr, task) = start(StoreUrl::Memory, Limits::default()).await;
    let g = Geometry::new(4, 16).unwrap();

    // The wrong key: a clear refusal.
    let err =
        RemoteStore::open(&addr, Some(AuthKey::from_bytes([1; 32])), "x", g).await.unwrap_err();
    assert!(matches!(err, StoreError::AccessDenied { .. }), "{err:?}");
    assert!(err.to_string().contains("does not hold the storage server's key"), "{err}");
    assert!(!err.is_retryable());
    // No key at all: the client says what is missing.
    let err = RemoteStore::open(&addr, None, "x", g).await.unwrap_err();
    assert!(matches!(err, StoreError::AccessDenied { .. }), "{err:?}");
    assert!(err.to_string().contains("key_file"), "{err}");

    // On the wire: a guessed proof gets the refusal verdict, then the connection closes.
    let (mut s, keyed, _) = hello(&addr).await;
    assert!(keyed);
    s.write_all(&[0u8; protocol::RESPONSE_LEN]).await.unwrap();
    assert_eq!(s.read_u8().await.unwrap(), 1, "refused");
    let n = s.read_u16_le().await.unwrap() as usize;
    let mut msg = vec![0u8; n];
    s.read_exact(&mut msg).await.unwrap();
    assert!(String::from_utf8(msg).unwrap().starts_with("refused"));
    assert!(closed_silently(&mut s).await, "nothing after the refusal");

    // Not a blindfold client at all.
    let mut s = TcpStream::connect(&addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n\r\n").await.unwrap();
    let mut hello = [0u8; protocol::HELLO_LEN];
    s.read_exact(&mut hello).await.unwrap();
    assert!(closed_silently(&mut s).await);

    still_serves(&addr, "after").await;
    task.abort();
}

#[tokio::test]
async fn clients_authenticate_the_server_too() {
    let g = Geometry::new(4, 16).unwrap();
    // A server without authentication: served without a key, refused by a client with one.
    let config = ServerConfig::new(Auth::InsecureNone);
    let (addr, task) = Server::bind("127.0.0.1:0", StoreUrl::Memory, config).await.unwrap().spawn();
    let addr = addr.to_string();
    let store = RemoteStore::open(&addr, None, "open", g).await.unwrap();
    store.write(vec![(CellId(0), vec![1; 16])]).await.unwrap();
    let err = RemoteStore::open(&addr, Some(key()), "open", g).await.unwrap_err();
    assert!(matches!(err, StoreError::AccessDenied { .. }), "{err:?}");
    task.abort();

    // An impostor that asks for a key and accepts any proof: it cannot prove it holds the key.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let impostor = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; protocol::HELLO_LEN];
        s.read_exact(&mut buf).await.unwrap();
        s.write_all(&protocol::hello()).await.unwrap();
        s.write_all(&protocol::challenge(protocol::AUTH_KEY, &[3; 32])).await.unwrap();
        let mut response = [0u8; protocol::RESPONSE_LEN];
        s.read_exact(&mut response).await.unwrap();
        s.write_all(&protocol::accept(&[0; 32], 1 << 20)).await.unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
        rest
    });
    let err = RemoteStore::open(&addr, Some(key()), "x", g).await.unwrap_err();
    assert!(matches!(err, StoreError::AccessDenied { .. }), "{err:?}");
    assert!(err.to_string().contains("server's proof"), "{err}");
    assert!(impostor.await.unwrap().is_empty(), "the client sent no request");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arrays_connections_and_handshakes_are_limited() {
    let limits = Limits {
        max_arrays: 2,
        max_connections: 2,
        handshake_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let (addr, task) = start(StoreUrl::Memory, limits).await;
    let g = Geometry::new(4, 16).unwrap();
    let a = RemoteStore::open(&addr, Some(key()), "a", g).await.unwrap();
    // The same array again, on this connection or another, takes no new slot.
    let (mut s, _) = connect(&addr).await;
    let mut open = Encoder::default();
    open.u64(4).u32(16).u16(1).bytes(b"b");
    for id in 1..4 {
        let (status, body) = request(&mut s, id, op::OPEN, &open).await;
        assert_eq!((status, body), (0, 0u32.to_le_bytes().to_vec()), "one handle per name");
    }
    let mut other_shape = Encoder::default();
    other_shape.u64(5).u32(16).u16(1).bytes(b"b");
    let err = error_of_request(&mut s, 4, op::OPEN, &other_shape).await;
    assert!(matches!(err, StoreError::GeometryMismatch { .. }), "{err:?}");
    let mut open = Encoder::default();
    open.u64(4).u32(16).u16(1).bytes(b"c");
    let err = error_of_request(&mut s, 5, op::OPEN, &open).await;
    assert!(err.to_string().contains("--max-arrays"), "{err}");
    // Two connections are open (`a`'s and `s`): a third is closed at once.
    let err = RemoteStore::open(&addr, Some(key()), "a", g).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    drop(s);
    drop(a);

    // A peer that never completes the handshake is closed after the timeout.
    let limits = Limits { handshake_timeout: Duration::from_millis(200), ..Limits::default() };
    let (addr2, task2) = start(StoreUrl::Memory, limits).await;
    let mut idle = TcpStream::connect(&addr2).await.unwrap();
    assert!(closed_silently(&mut idle).await);
    still_serves(&addr2, "x").await;
    task.abort();
    task2.abort();
}

#[tokio::test]
async fn limits_that_cannot_work_together_are_refused() {
    for limits in [
        Limits { max_frame: 1 << 20, connection_buffer: 1 << 20, ..Limits::default() },
        Limits { max_frame: 100, ..Limits::default() },
        Limits { max_connections: 0, ..Limits::default() },
        Limits { connection_buffer: usize::MAX, ..Limits::default() },
    ] {
        let config = ServerConfig { limits, ..ServerConfig::new(Auth::Key(key())) };
        let err = Server::bind("127.0.0.1:0", StoreUrl::Memory, config).await.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
    }
}

/// Select requests the client would never send (it checks them first), sent raw: a selector
/// shorter than its ranges, a body of noise, a count of groups no frame holds, a key longer
/// than any real one. Each is answered with an error; then a good one is served.
#[cfg(feature = "select")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_select_requests_are_answered_with_errors() {
    use blindfold_store::remote::protocol::Request;
    use blindfold_testkit::select;

    let (addr, task) = start(StoreUrl::Memory, Limits::default()).await;
    let (mut s, _) = connect(&addr).await;
    let g = select::geometry();
    let mut open = Encoder::default();
    open.u64(g.cell_count()).u32(g.cell_size()).u16(1).bytes(b"s");
    let (status, body) = request(&mut s, 1, op::OPEN, &open).await;
    assert_eq!(status, 0);
    let handle = u32::from_le_bytes(body[..4].try_into().unwrap());

    let body_of = |req: Request| {
        let frame = req.frame(0, protocol::MAX_FRAME).unwrap();
        Encoder(frame[13..].to_vec())
    };
    let mut short = select::sample_request(0);
    short.selector.pop();
    let req = Request::ReadSelect { handle, request: short };
    let err = error_of_request(&mut s, 2, op::READ_SELECT, &body_of(req)).await;
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err:?}");

    let mut noise = Encoder::default();
    noise.u32(handle).bytes(&[0x5a; 300]);
    for (id, op) in [(3, op::READ_SELECT), (4, op::READ_SELECT_COMBINED), (5, op::WRITE_SELECT)] {
        let err = error_of_request(&mut s, id, op, &noise).await;
        assert!(matches!(err, StoreError::InvalidRequest(_)), "op {op}: {err:?}");
    }
    let key = select::sample_request(0).public_key.to_bytes();
    let mut groups = Encoder::default();
    groups.u32(handle).u32(u32::MAX).u32(key.len() as u32).bytes(&key).u32(1);
    let err = error_of_request(&mut s, 6, op::READ_SELECT_COMBINED, &groups).await;
    assert!(err.to_string().contains("does not fit"), "{err}");
    let mut long_key = Encoder::default();
    long_key.u32(handle).u32(1 << 20).bytes(&[1; 64]);
    let err = error_of_request(&mut s, 7, op::READ_SELECT, &long_key).await;
    assert!(matches!(err, StoreError::InvalidRequest(_)), "{err:?}");

    // A good select on the same connection: one answer of two layer-1 ciphertexts.
    let good = Request::ReadSelect { handle, request: select::sample_request(1) };
    let (status, body) = request(&mut s, 8, op::READ_SELECT, &body_of(good)).await;
    assert_eq!((status, body.len()), (0, 128));
    drop(s);
    still_serves(&addr, "b").await;
    task.abort();
}

/// The lease operations (12 and 13) from a hostile peer: bad names, oversized and truncated
/// records and tokens, bad flags. Each is answered with an error, nothing is stored, and the
/// server goes on serving; a garbage record a peer manages to store is refused by the gateway,
/// not trusted.
#[tokio::test]
async fn hostile_lease_requests_are_refused() {
    let (addr, task) = start(StoreUrl::Memory, Limits::default()).await;
    let (mut s, _) = connect(&addr).await;
    let short = |e: &mut Encoder, bytes: &[u8]| {
        e.u16(bytes.len() as u16).bytes(bytes);
    };

    // (op, body, (what is wrong, what the error must say))
    let refused = |op: u8, body: Encoder, why: (&'static str, &'static str)| (op, body, why);
    let mut cases = Vec::new();
    for name in
        [&b""[..], b"../escape", b"a/b", b".lease", b"nul\0", &[0xff, 0xfe][..], &[b'n'; 200][..]]
    {
        let mut e = Encoder::default();
        short(&mut e, name);
        cases.push(refused(op::LEASE_LOAD, e, ("a bad lease name", "name")));
    }
    let mut e = Encoder::default();
    e.u16(60_000).bytes(b"gw");
    cases.push(refused(op::LEASE_LOAD, e, ("a name longer than the frame", "at most 128")));
    let mut e = Encoder::default();
    short(&mut e, b"gw");
    e.u8(0);
    short(&mut e, &[b'r'; 2000]);
    cases.push(refused(op::LEASE_SWAP, e, ("a record over 1024 bytes", "record of 2000 bytes")));
    let mut e = Encoder::default();
    short(&mut e, b"gw");
    e.u8(1);
    short(&mut e, &[b't'; 1025]);
    short(&mut e, b"record");
    cases.push(refused(op::LEASE_SWAP, e, ("a token over 1024 bytes", "token of 1025 bytes")));
    let mut e = Encoder::default();
    short(&mut e, b"gw");
    e.u8(7);
    short(&mut e, b"record");
    cases.push(refused(op::LEASE_SWAP, e, ("a bad token flag", "flag of 7")));
    let mut e = Encoder::default();
    short(&mut e, b"gw");
    e.u8(0).u16(1000).bytes(b"short");
    cases.push(refused(op::LEASE_SWAP, e, ("a truncated record", "ends early")));
    let mut e = Encoder::default();
    short(&mut e, b"gw");
    e.u8(0);
    short(&mut e, b"record");
    e.u8(0);
    cases.push(refused(op::LEASE_SWAP, e, ("trailing bytes", "unexpected bytes")));
    for (id, (op, body, why)) in (1..).zip(cases) {
        let (status, body) = request(&mut s, id, op, &body).await;
        let err = error_of(status, &body);
        assert!(err.to_string().contains(why.1), "{}: {err}", why.0);
    }
    // Nothing was stored by any of them.
    let mut e = Encoder::default();
    short(&mut e, b"gw");
    assert_eq!(request(&mut s, 100, op::LEASE_LOAD, &e).await, (0, vec![0]));

    // A peer with the key may store garbage; the gateway refuses to read it as a lease.
    let mut e = Encoder::default();
    short(&mut e, b"gateway");
    e.u8(0);
    short(&mut e, b"holder=\x1b[2J evil\ngeneration=18446744073709551615\n");
    assert_eq!(request(&mut s, 101, op::LEASE_SWAP, &e).await, (0, vec![1]));
    let leases = blindfold_store::Leases::new(
        blindfold_store::remote::RemoteLeaseRecords::connect(&addr, Some(key())).await.unwrap(),
    );
    use blindfold_store::LeaseStore;
    let err = leases.acquire("gateway", "gw", Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err:?}");

    still_serves(&addr, "after-leases").await;
    task.abort();
}

/// A peer cannot make the server keep lease records without bound: past `max_leases` names a
/// new one is refused, and the names it has go on working.
#[tokio::test]
async fn lease_names_are_bounded() {
    let limits = Limits { max_leases: 3, ..Limits::default() };
    let (addr, task) = start(StoreUrl::Memory, limits).await;
    let (mut s, _) = connect(&addr).await;
    let swap = |name: &str| {
        let mut e = Encoder::default();
        e.u16(name.len() as u16).bytes(name.as_bytes()).u8(0).u16(1).bytes(b"r");
        e
    };
    for (id, name) in (1..).zip(["a", "b", "c"]) {
        assert_eq!(request(&mut s, id, op::LEASE_SWAP, &swap(name)).await, (0, vec![1]));
    }
    let (status, body) = request(&mut s, 9, op::LEASE_SWAP, &swap("d")).await;
    let err = error_of(status, &body);
    assert!(err.to_string().contains("limit"), "{err}");
    // A known name is still served (the swap from nothing loses: the record exists).
    assert_eq!(request(&mut s, 10, op::LEASE_SWAP, &swap("a")).await, (0, vec![0]));
    task.abort();
}
