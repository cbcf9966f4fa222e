//! A TCP relay that puts an emulated link between a client program and a server: the same
//! model as [`blindfold_store::LatencyStore`] (half the round trip each way, and each direction's
//! bytes serialised at its bandwidth), for clients that blindfold does not drive itself — the
//! `git` of `bench git` talking to an S3 server directly.
//!
//! Each accepted connection gets its own connection upstream. In each direction, a chunk read at
//! time `t` starts onto the link when the link is free (at `max(t, free)`), occupies it for
//! `bytes × 8 / bandwidth`, and is delivered half a round trip after it left. A bounded queue
//! between reading and writing stops reading when the link falls behind, as TCP's window would.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result};
use blindfold_store::LinkConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// Chunks in flight per direction before reading pauses.
const QUEUE: usize = 64;
/// Bytes read at once.
const CHUNK: usize = 64 << 10;

/// A relay listening on `127.0.0.1:0`; stops when dropped.
pub(crate) struct LinkProxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LinkProxy {
    /// Relays every connection to `upstream` over `link`.
    pub(crate) async fn start(upstream: SocketAddr, link: LinkConfig) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.context("link proxy: listening")?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                conns.spawn(async move {
                    if let Err(e) = relay(client, upstream, link).await {
                        tracing::debug!("link proxy: connection ended: {e:#}");
                    }
                });
            }
        });
        Ok(Self { addr, task })
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, link: LinkConfig) -> Result<()> {
    let server = TcpStream::connect(upstream)
        .await
        .with_context(|| format!("link proxy: connecting to {upstream}"))?;
    let _ = (client.set_nodelay(true), server.set_nodelay(true));
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let half = link.rtt / 2;
    let (up, down) = tokio::join!(
        pipe(cr, sw, half, |n| link.up_time(n)),
        pipe(sr, cw, half, |n| link.down_time(n))
    );
    up.and(down)
}

/// Copies `r` to `w`, each chunk delayed as the link would: `on_link` is the time its bytes
/// occupy this direction of the link.
async fn pipe(
    mut r: impl AsyncReadExt + Unpin,
    mut w: impl AsyncWriteExt + Unpin,
    delay: Duration,
    on_link: impl Fn(u64) -> Duration,
) -> Result<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(Instant, Vec<u8>)>(QUEUE);
    let reader = async move {
        let mut free = Instant::now();
        loop {
            let mut buf = vec![0u8; CHUNK];
            let n = r.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, anyhow::Error>(()); // dropping `tx` ends the writer
            }
            buf.truncate(n);
            free = free.max(Instant::now()) + on_link(n as u64);
            if tx.send((free + delay, buf)).await.is_err() {
                return Ok(()); // the other side is gone
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            w.write_all(&chunk).await?;
        }
        w.shutdown().await?;
        Ok::<_, anyhow::Error>(())
    };
    let (a, b) = tokio::join!(reader, writer);
    a.and(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bytes_cross_intact_and_no_sooner_than_the_link_allows() {
        // An echo server behind a 40 ms, 8 Mbit/s link.
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (s, _) = echo.accept().await.unwrap();
            let (mut r, mut w) = s.into_split();
            tokio::io::copy(&mut r, &mut w).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let link =
            LinkConfig::new(Duration::from_millis(40), Some(8_000_000), Some(8_000_000)).unwrap();
        let proxy = LinkProxy::start(echo_addr, link).await.unwrap();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let t = std::time::Instant::now();
        let s = TcpStream::connect(proxy.addr).await.unwrap();
        let (mut r, mut w) = s.into_split();
        let sent = data.clone();
        let writer = tokio::spawn(async move {
            w.write_all(&sent).await.unwrap();
            w.shutdown().await.unwrap();
        });
        let mut back = Vec::new();
        r.read_to_end(&mut back).await.unwrap();
        writer.await.unwrap();
        assert_eq!(back, data, "the echo differs");
        // Up and back: one round trip, and 100 kB serialised at 8 Mbit/s each way (100 ms each;
        // the two overlap by all but the last chunk, so at least one of them counts).
        let least = Duration::from_millis(40 + 100);
        assert!(t.elapsed() >= least, "{:?} < {least:?}", t.elapsed());
    }
}
