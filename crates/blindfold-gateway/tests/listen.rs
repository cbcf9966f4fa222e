//! The listeners under hostile clients, over real sockets: connections that send half a header
//! or nothing are cut off, a connection past the limit is answered 503 and closed, and a normal
//! client is served (or cleanly refused) throughout. (Running out of file descriptors is in
//! `tests/listen_fds.rs`, a binary of its own since it lowers the process's limit.)

use std::time::{Duration, Instant};

use blindfold_gateway::listen::Limits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common;

const KEYS: (&str, &str) = ("AKLISTENTEST", "listen-test-secret");

/// A plain request on a fresh connection: its status, or `None` if the connection closed
/// without an answer.
async fn status(addr: std::net::SocketAddr) -> Option<(u16, String)> {
    let mut sock = TcpStream::connect(addr).await.unwrap();
    sock.write_all(b"GET / HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n").await.ok()?;
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut out))
        .await
        .expect("an answer (or a close) within 10 s")
        .ok()?;
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text))
}

/// Waits until the server closes `sock`; how long it took.
async fn closed_by_server(sock: &mut TcpStream, within: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(within, sock.read(&mut buf)).await {
            Err(_) => panic!("still open after {within:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            // An error answer (408) may come first.
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_headers_are_cut_off_and_a_client_past_the_limit_is_refused_cleanly() {
    let limits = Limits::new(16, Duration::from_secs(1), Duration::from_secs(30));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let g = common::Running::start_on(listener, KEYS, None, limits.clone(), || {}).await;
    // Served before the flood (an unsigned request: S3 answers 403).
    let (code, _) = status(g.addr).await.expect("an answer");
    assert_eq!(code, 403);
    // 24 connections that each send half a header, more than the limit.
    let mut flood = Vec::new();
    for _ in 0..24 {
        let mut s = TcpStream::connect(g.addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: gw\r\nX-Slow: ").await.unwrap();
        flood.push(s);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(limits.open_connections(), 16, "the pool holds exactly its limit");
    // A normal client now is refused at once and cleanly: a 503 that says to retry.
    let started = Instant::now();
    let (code, text) = status(g.addr).await.expect("a 503, not a reset");
    assert_eq!(code, 503, "{text}");
    assert!(text.to_ascii_lowercase().contains("retry-after"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(2), "refused without waiting");
    // Every half-header connection is cut off within the header timeout (and a margin).
    for s in &mut flood {
        let took = closed_by_server(s, Duration::from_secs(5)).await;
        assert!(took < Duration::from_secs(4), "cut off after {took:?}");
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(limits.open_connections(), 0, "every place in the pool is back");
    let (code, _) = status(g.addr).await.expect("an answer");
    assert_eq!(code, 403, "served again once the flood is cut off");
    g.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_connections_are_closed_and_keep_alive_still_works() {
    let limits = Limits::new(64, Duration::from_secs(30), Duration::from_secs(1));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let g = common::Running::start_on(listener, KEYS, None, limits.clone(), || {}).await;
    // A connection that never sends a byte.
    let mut silent = TcpStream::connect(g.addr).await.unwrap();
    // A connection that makes two requests, then goes quiet.
    let mut kept = TcpStream::connect(g.addr).await.unwrap();
    for _ in 0..2 {
        kept.write_all(b"GET / HTTP/1.1\r\nHost: gw\r\n\r\n").await.unwrap();
        let (head, _) = common::read_response(&mut kept, false).await;
        assert!(head.starts_with("http/1.1 403"), "{head}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let took = closed_by_server(&mut silent, Duration::from_secs(5)).await;
    assert!(took < Duration::from_secs(4), "silent connection open {took:?}");
    let took = closed_by_server(&mut kept, Duration::from_secs(5)).await;
    assert!(took < Duration::from_secs(3), "idle keep-alive connection open {took:?}");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(limits.open_connections(), 0);
    g.stop().await;
}
