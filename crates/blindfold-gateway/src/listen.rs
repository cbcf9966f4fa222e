//! Accepting connections on the gateway's listeners (S3, Swift, admin) so that no client can
//! hold the gateway: clients are hostile too.
//!
//! - **A limit on open connections** ([`Limits::max_connections`], one pool shared by the S3 and
//!   Swift listeners; the admin listener has its own small pool). A connection past the limit is
//!   answered `503 Service Unavailable` with `Retry-After` (in the clear; over TLS it is closed,
//!   as no handshake can be spent on it) and closed, so the file descriptors it would hold stay
//!   free for the clients already served.
//! - **A deadline for a request's header** ([`Limits::header_timeout`], hyper's own
//!   `header_read_timeout`): a client that sends half a header is cut off.
//! - **An idle deadline** ([`Limits::idle_timeout`]): a connection on which no byte moves either
//!   way while no request of it is being answered is closed. A request the gateway is working on
//!   (a large PUT being committed, a response body it is still producing) is never cut by it.
//! - **Backoff when `accept` fails** (out of file descriptors, say): the loop sleeps from 5 ms
//!   doubling to a second instead of spinning, and says so at most once every
//!   [`LogThrottle`] period with a count of what it left out, so the log stays small.
//!
//! The TLS handshake has its own deadline ([`crate::tls::HANDSHAKE_TIMEOUT`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;

use crate::tls::{Tls, HANDSHAKE_TIMEOUT};

/// Default [`Limits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// Default [`Limits::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// Default [`Limits::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections the admin listener serves at once.
pub const ADMIN_MAX_CONNECTIONS: usize = 64;
/// Refusals (503 answers) being written at once; past this a refused connection is just closed.
const MAX_REFUSING: usize = 256;
/// How long a refusal waits for the rest of what its client sent before closing (a client that
/// never stops sending holds its place no longer).
const REFUSAL_LINGER: Duration = Duration::from_millis(250);
/// Longest sleep between two failing `accept` calls.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// What a listener allows its clients. Clones share one connection pool.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections open at once (over all listeners sharing these limits).
    pub max_connections: usize,
    /// How long a client may take to send a request's header.
    pub header_timeout: Duration,
    /// How long a connection may stay with no byte moving while no request of it is answered.
    pub idle_timeout: Duration,
    open: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
}

impl Default for Limits {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_CONNECTIONS, DEFAULT_HEADER_TIMEOUT, DEFAULT_IDLE_TIMEOUT)
    }
}

impl Limits {
    /// Limits with a fresh pool of `max_connections` (at least 1).
    pub fn new(max_connections: usize, header_timeout: Duration, idle_timeout: Duration) -> Self {
        let max_connections = max_connections.max(1);
        Self {
            max_connections,
            header_timeout,
            idle_timeout,
            open: Arc::new(Semaphore::new(max_connections)),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
        }
    }

    /// The same timeouts with a pool of its own of `max_connections` (for the admin listener).
    pub fn separate(&self, max_connections: usize) -> Self {
        Self::new(max_connections, self.header_timeout, self.idle_timeout)
    }

    /// Connections open now under these limits.
    pub fn open_connections(&self) -> usize {
        self.max_connections - self.open.available_permits()
    }

    fn http(&self) -> hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor> {
        let mut http =
            hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        http.http1()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(self.header_timeout);
        http
    }
}

/// Lets a repeated log line through at most once a period, counting what it held back.
#[derive(Debug)]
pub struct LogThrottle {
    period: Duration,
    last: Mutex<Option<Instant>>,
    held_back: AtomicU64,
}

impl LogThrottle {
    /// A throttle that lets one line through per `period`.
    pub const fn new(period: Duration) -> Self {
        Self { period, last: Mutex::new(None), held_back: AtomicU64::new(0) }
    }

    /// `Some(n)` if a line may be written now (`n` lines were held back since the last one);
    /// `None` if this one is to be held back.
    pub fn allow(&self) -> Option<u64> {
        let now = Instant::now();
        let mut last = self.last.lock();
        if last.is_some_and(|t| now.duration_since(t) < self.period) {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.held_back.swap(0, Ordering::Relaxed))
    }
}

/// Whether a failed `accept` is about the one connection (the next may work at once) rather
/// than the process or the machine (out of descriptors or memory: wait before trying again).
fn only_this_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(e.kind(), K::ConnectionAborted | K::ConnectionReset | K::ConnectionRefused)
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Accepts connections on `listener` until `until` resolves, serving each on its own task
/// (over `tls` when given) with a service from `make_svc`, within `limits`. `what` names the
/// listener in logs.
pub async fn accept_until<F, S, B>(
    listener: &tokio::net::TcpListener,
    tls: Option<&Tls>,
    limits: &Limits,
    what: &'static str,
    mut make_svc: F,
    until: impl Future<Output = ()>,
) where
    F: FnMut() -> S,
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<B>,
        > + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let http = limits.http();
    let accept_failed = LogThrottle::new(Duration::from_secs(10));
    let full = LogThrottle::new(Duration::from_secs(10));
    let mut backoff = Duration::ZERO;
    tokio::pin!(until);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut until => return,
        };
        let (socket, peer) = match accepted {
            Ok(a) => {
                backoff = Duration::ZERO;
                a
            }
            Err(e) => {
                if let Some(held_back) = accept_failed.allow() {
                    tracing::warn!(
                        error = %e,
                        listener = what,
                        held_back,
                        "accept failed (out of file descriptors? raise `ulimit -n` or lower \
                         --max-connections); retrying with backoff"
                    );
                }
                if only_this_connection(&e) {
                    continue;
                }
                backoff = (backoff * 2).clamp(Duration::from_millis(5), MAX_ACCEPT_BACKOFF);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    () = &mut until => return,
                }
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&limits.open).try_acquire_owned() else {
            if let Some(held_back) = full.allow() {
                tracing::warn!(
                    listener = what,
                    max = limits.max_connections,
                    held_back,
                    "connection refused: the connection limit is reached (--max-connections)"
                );
            }
            refuse(socket, tls.is_some(), &limits.refusing);
            continue;
        };
        // Without this, a small response written as headers then body waits ~40 ms for the
        // client's delayed ACK (Nagle's algorithm).
        if let Err(e) = socket.set_nodelay(true) {
            tracing::debug!(error = %e, listener = what, "could not set TCP_NODELAY");
        }
        let svc = Counted { inner: make_svc(), busy: Arc::new(AtomicUsize::new(0)) };
        spawn_connection(http.clone(), socket, peer, tls, svc, limits.idle_timeout, permit, what);
    }
}

/// Answers a connection past the limit with a 503 (in the clear) and closes it, on a task of
/// its own bounded by [`MAX_REFUSING`] and [`REFUSAL_LINGER`]; past that bound it is just closed.
fn refuse(socket: tokio::net::TcpStream, tls: bool, refusing: &Arc<Semaphore>) {
    let Ok(permit) = Arc::clone(refusing).try_acquire_owned() else { return };
    if tls {
        return;
    }
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let _permit = permit;
        let mut socket = socket;
        let body = "The gateway serves as many connections as it may at once; try again shortly.\n";
        let reply = format!(
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let answered = tokio::time::timeout(REFUSAL_LINGER, async {
            socket.write_all(reply.as_bytes()).await?;
            socket.shutdown().await
        })
        .await;
        if !matches!(answered, Ok(Ok(()))) {
            return;
        }
        // Read what the client sent, so that closing does not reset the connection before it
        // reads the answer.
        let _ = tokio::time::timeout(REFUSAL_LINGER, async {
            let mut sink = [0u8; 4096];
            while socket.read(&mut sink).await? > 0 {}
            Ok::<_, std::io::Error>(())
        })
        .await;
    });
}

/// Serves one accepted connection on its own task: over TLS when `tls` is given (after a
/// handshake bounded by [`HANDSHAKE_TIMEOUT`]), else in the clear; closed when idle for
/// `idle` (see the module's documentation). `permit` is its place in the connection pool,
/// given back when it ends. `what` names the listener in debug logs.
#[allow(clippy::too_many_arguments)]
fn spawn_connection<S, B>(
    http: hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
    socket: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    tls: Option<&Tls>,
    svc: Counted<S>,
    idle: Duration,
    permit: tokio::sync::OwnedSemaphorePermit,
    what: &'static str,
) where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = hyper::Response<B>,
        > + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    use hyper_util::rt::TokioIo;
    let acceptor = tls.map(|t| t.acceptor().clone());
    let busy = Arc::clone(&svc.busy);
    tokio::spawn(async move {
        let _permit = permit;
        let served = match acceptor {
            None => {
                http.serve_connection(TokioIo::new(Watched::new(socket, idle, busy)), svc).await
            }
            Some(acceptor) => {
                // A TLS ClientHello starts with 0x16; a letter is a client speaking plain HTTP
                // to an HTTPS port: tell it so (rustls alone would answer with bytes it cannot
                // read) and close.
                let mut first = [0u8; 1];
                if let Ok(Ok(1)) =
                    tokio::time::timeout(HANDSHAKE_TIMEOUT, socket.peek(&mut first)).await
                {
                    if first[0].is_ascii_alphabetic() {
                        return refuse_plain_http(socket, peer, what).await;
                    }
                }
                let stream =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            return tracing::debug!(error = %e, %peer, what, "TLS handshake failed");
                        }
                        Err(_) => {
                            return tracing::debug!(%peer, what, "TLS handshake timed out");
                        }
                    };
                http.serve_connection(TokioIo::new(Watched::new(stream, idle, busy)), svc).await
            }
        };
        if let Err(e) = served {
            tracing::debug!(error = %e, %peer, what, "connection ended with an error");
        }
    });
}

/// Answers a plain-HTTP request on an HTTPS listener with a 400 that says to use https://.
async fn refuse_plain_http(
    mut socket: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    what: &str,
) {
    use tokio::io::AsyncWriteExt as _;
    tracing::debug!(%peer, what, "plain HTTP on the HTTPS listener");
    let message = "This port serves HTTPS: use an https:// endpoint (and trust the gateway's \
                   certificate; the banner of `blindfold serve` says how).";
    // S3 clients show an error's message only when it comes as S3's XML.
    let (kind, body) = if what == "s3" {
        (
            "application/xml",
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>InvalidRequest</Code>\
                 <Message>{message}</Message></Error>\n"
            ),
        )
    } else {
        ("text/plain", format!("{message}\n"))
    };
    let reply = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(HANDSHAKE_TIMEOUT, socket.write_all(reply.as_bytes())).await;
    let _ = socket.shutdown().await;
}

/// A service that counts the requests of its connection being answered (so [`Watched`] does
/// not cut a connection whose request the gateway is still working on).
struct Counted<S> {
    inner: S,
    busy: Arc<AtomicUsize>,
}

/// Counts one request while it lives.
struct Busy(Arc<AtomicUsize>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<S, R, B> hyper::service::Service<R> for Counted<S>
where
    S: hyper::service::Service<R, Response = hyper::Response<B>>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = hyper::Response<CountedBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn call(&self, req: R) -> Self::Future {
        self.busy.fetch_add(1, Ordering::AcqRel);
        let busy = Busy(Arc::clone(&self.busy));
        let fut = self.inner.call(req);
        Box::pin(async move {
            let response = fut.await?;
            // Counted until hyper has sent (or dropped) the whole body.
            Ok(response.map(|inner| CountedBody { inner: Box::pin(inner), _busy: busy }))
        })
    }
}

/// A response body that keeps its request counted (see [`Counted`]) until it is sent or
/// dropped, so a body the gateway is still producing is never cut as idle.
struct CountedBody<B> {
    inner: Pin<Box<B>>,
    _busy: Busy,
}

impl<B: hyper::body::Body> hyper::body::Body for CountedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        self.inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection's byte stream that fails with `TimedOut` once no byte has moved either way for
/// `idle` while no request of it is being answered.
struct Watched<T> {
    inner: T,
    idle: Duration,
    deadline: Pin<Box<tokio::time::Sleep>>,
    busy: Arc<AtomicUsize>,
}

impl<T> Watched<T> {
    fn new(inner: T, idle: Duration, busy: Arc<AtomicUsize>) -> Self {
        Self { inner, idle, deadline: Box::pin(tokio::time::sleep(idle)), busy }
    }

    fn moved(&mut self) {
        self.deadline.as_mut().reset(tokio::time::Instant::now() + self.idle);
    }

    /// What a read or write of the inner stream (`polled`) becomes: a result that `progressed`
    /// (moved bytes) restarts the idle time; a pending one fails once the connection has been
    /// idle too long.
    fn settle<R>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<std::io::Result<R>>,
        progressed: impl FnOnce(&std::io::Result<R>) -> bool,
    ) -> Poll<std::io::Result<R>> {
        match polled {
            Poll::Ready(r) => {
                if progressed(&r) {
                    self.moved();
                }
                Poll::Ready(r)
            }
            Poll::Pending => match self.check_idle(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
        }
    }

    /// On a pending read or write: `Err` once the connection has been idle too long.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> std::io::Result<()> {
        if self.busy.load(Ordering::Acquire) > 0 {
            // Answering a request: the idle time starts again when it is done.
            self.moved();
            return Ok(());
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "connection idle for longer than --idle-timeout",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let grew = buf.filled().len() > before;
        self.settle(cx, polled, |_| grew)
    }
}

/// Whether a write moved bytes.
fn wrote(r: &std::io::Result<usize>) -> bool {
    r.as_ref().is_ok_and(|&n| n > 0)
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.settle(cx, polled, wrote)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.settle(cx, polled, wrote)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A listener with a one-second idle timeout whose one route answers after `delay`, with a
    /// body of two chunks `gap` apart; what a client reads from it.
    async fn slow_answer(delay: Duration, gap: Duration) -> String {
        use http_body_util::StreamBody;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits::new(8, Duration::from_secs(5), Duration::from_secs(1));
        let make_svc = move || {
            hyper::service::service_fn(move |_req| async move {
                tokio::time::sleep(delay).await;
                let chunks = futures::stream::unfold(0u8, move |i| async move {
                    match i {
                        0 => Some((
                            Ok::<_, std::io::Error>(hyper::body::Frame::data(
                                bytes::Bytes::from_static(b"first "),
                            )),
                            1,
                        )),
                        1 => {
                            tokio::time::sleep(gap).await;
                            Some((
                                Ok(hyper::body::Frame::data(bytes::Bytes::from_static(b"last"))),
                                2,
                            ))
                        }
                        _ => None,
                    }
                });
                Ok::<_, std::convert::Infallible>(hyper::Response::new(StreamBody::new(chunks)))
            })
        };
        tokio::spawn(async move {
            accept_until(&listener, None, &limits, "test", make_svc, std::future::pending()).await
        });
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        sock.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), sock.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    /// Whether `text` is the whole chunked answer (both chunks and the last, empty one).
    fn whole(text: &str) -> bool {
        text.starts_with("HTTP/1.1 200")
            && text.contains("first ")
            && text.ends_with("last\r\n0\r\n\r\n")
    }

    #[tokio::test]
    async fn a_request_being_answered_is_never_cut_as_idle() {
        // Two seconds before the answer, then two seconds inside its body: both longer than
        // the idle timeout, with no byte moving.
        let text = slow_answer(Duration::from_secs(2), Duration::ZERO).await;
        assert!(whole(&text), "{text:?}");
        let text = slow_answer(Duration::ZERO, Duration::from_secs(2)).await;
        assert!(whole(&text), "{text:?}");
    }

    #[test]
    fn a_throttle_lets_one_line_through_per_period_and_counts_the_rest() {
        let t = LogThrottle::new(Duration::from_millis(200));
        assert_eq!(t.allow(), Some(0));
        for _ in 0..1000 {
            assert_eq!(t.allow(), None);
        }
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(t.allow(), Some(1000));
        assert_eq!(t.allow(), None);
    }
}
