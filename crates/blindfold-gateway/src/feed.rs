//! The log feed: the primary hands every entry of its store-side log ([`crate::storelog`]) to a
//! standby over a sealed connection as it queues it, and a read goes out as soon as the
//! standby holds its reveal record, instead of waiting for the store to hold it.
//!
//! # Why
//!
//! Under `--durability store` a read must not go out before its reveal record is somewhere a
//! recovery will find it: a recovery that lacked it would read the block again on the path the
//! store already saw. The store is far away (a round trip of tens of milliseconds to S3); a
//! standby on the same network is not. The standby is as trusted as the primary (it holds the
//! key), and it is the one that takes over when the primary dies: holding the log's tail that
//! the store lacks, it replays exactly what the primary revealed, and needs no rebuild.
//!
//! # The rule that keeps a recovery from the store alone safe
//!
//! A store-only recovery (`blindfold recover`, or a standby without the tail) may lack reveal
//! records the standby held. So the log says when reads may have gone ahead of it: once a
//! standby has caught up, the primary appends `Entry::Standby(Some(session))` and lets reads
//! use that standby's acknowledgements only once the store holds that entry; when the standby
//! goes, reads wait for the store again and `Entry::Standby(None)` follows (once it is in the
//! store, so is every reveal before it). A store checkpoint taken while a session is on says so
//! (its reads-ahead flag) and the session's entry is repeated right after it. A recovery whose
//! log ends with a session on rebuilds the tree with fresh leaves, unless it is that session's
//! standby holding the tail ([`Tail`]).
//!
//! # Wire
//!
//! TCP. Each side first sends `BFFEED01` and 32 random bytes; then every message is a 4-byte
//! big-endian length and a message sealed with [`blindfold_crypto::ChannelCipher`] (keys from
//! the master key and both nonces, a counter per direction): a peer without the key, and a
//! message altered, dropped, replayed or reordered, end the connection. The standby says who
//! it is; the primary sends `Start`, then the entries it holds that the store may not, then
//! each new entry, and how far the store holds the log (also once a second, as a heartbeat).
//! The standby acknowledges how far it holds the log. Either side drops a connection silent for
//! [`SILENCE`].

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blindfold_crypto::{ChannelCipher, MasterKey, CHANNEL_NONCE_LEN};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::storelog::{Entry, StoreLog};
use crate::{GatewayError, Result};

/// The channel's label (its keys are derived under it).
pub const LABEL: &str = "blindfold log feed v1";
const MAGIC: &[u8; 8] = b"BFFEED01";
/// The largest message either side accepts (a group of the log is at most half its ring).
const MAX_MESSAGE: usize = 96 << 20;
/// Entries sent in one message, at most (by bytes).
const BATCH_BYTES: usize = 4 << 20;
/// How often the primary says how far the store holds the log when nothing else happens.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A connection silent for this long is dropped.
pub const SILENCE: Duration = Duration::from_secs(5);
/// How long the opening exchange may take.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// How long a standby waits before connecting again.
const RECONNECT: Duration = Duration::from_millis(500);

/// The file in which a primary serving the feed says who follows it (`blindfold status`),
/// rewritten every [`HEARTBEAT`] while it changes.
pub const STATUS_FILE: &str = "feed-status";

/// Where the log feed goes: the primary listens, the standby follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogFeed {
    /// The primary: accept a standby on this address (`serve --standby-listen`).
    Serve(SocketAddr),
    /// The standby: follow the primary at this address (`serve --standby --primary`).
    Follow(String),
}

#[derive(Serialize, Deserialize, Debug)]
enum ToStandby {
    /// A session begins: entries below `first` are in the store.
    Start { session: u64, first: u64 },
    /// Entries numbered from `first`, each encoded as in the log.
    Entries {
        first: u64,
        #[serde(with = "crate::storelog::byte_vecs")]
        entries: Vec<Vec<u8>>,
    },
    /// Every entry below `through` is in the store.
    Durable { through: u64 },
}

#[derive(Serialize, Deserialize, Debug)]
enum ToPrimary {
    /// Who the standby is: `standby` is random per standby process.
    Hello { standby: u64, name: String },
    /// The standby holds every entry below `through` that the store may lack.
    Ack { through: u64 },
}

fn encode<T: Serialize>(m: &T) -> Vec<u8> {
    bincode::serialize(m).expect("feed messages encode")
}

fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T> {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_MESSAGE as u64)
        .deserialize(b)
        .map_err(|e| GatewayError::Corrupt(format!("a log feed message does not decode: {e}")))
}

fn feed_err(what: &str, e: impl std::fmt::Display) -> GatewayError {
    GatewayError::Config(format!("log feed: {what}: {e}"))
}

/// The opening exchange; returns this end's cipher.
async fn handshake(s: &mut TcpStream, key: &MasterKey, initiator: bool) -> Result<ChannelCipher> {
    let mine: [u8; CHANNEL_NONCE_LEN] = rand::random();
    let exchange = async {
        let mut hello = MAGIC.to_vec();
        hello.extend_from_slice(&mine);
        s.write_all(&hello).await?;
        let mut theirs = [0u8; 8 + CHANNEL_NONCE_LEN];
        s.read_exact(&mut theirs).await?;
        Ok::<_, std::io::Error>(theirs)
    };
    let theirs = tokio::time::timeout(HANDSHAKE, exchange)
        .await
        .map_err(|_| feed_err("opening", "no answer"))?
        .map_err(|e| feed_err("opening", e))?;
    if &theirs[..8] != MAGIC {
        return Err(feed_err("opening", "the other end does not speak the log feed"));
    }
    let theirs: [u8; CHANNEL_NONCE_LEN] = theirs[8..].try_into().expect("32 bytes");
    let (i, r) = if initiator { (&mine, &theirs) } else { (&theirs, &mine) };
    Ok(ChannelCipher::new(key, LABEL, i, r, initiator))
}

async fn send<W: AsyncWriteExt + Unpin, T: Serialize>(
    w: &mut W,
    cipher: &parking_lot::Mutex<ChannelCipher>,
    m: &T,
) -> Result<()> {
    let sealed = cipher.lock().seal(&encode(m));
    let mut frame = Vec::with_capacity(4 + sealed.len());
    frame.extend_from_slice(&(sealed.len() as u32).to_be_bytes());
    frame.extend_from_slice(&sealed);
    w.write_all(&frame).await.map_err(|e| feed_err("sending", e))
}

/// The next message, or an error for silence, a bad length, or one that does not open.
async fn recv<R: AsyncReadExt + Unpin, T: for<'de> Deserialize<'de>>(
    r: &mut R,
    cipher: &parking_lot::Mutex<ChannelCipher>,
) -> Result<T> {
    let read = async {
        let mut len = [0u8; 4];
        r.read_exact(&mut len).await.map_err(|e| feed_err("receiving", e))?;
        let len = u32::from_be_bytes(len) as usize;
        if len > MAX_MESSAGE + ChannelCipher::OVERHEAD {
            return Err(feed_err("receiving", format!("a message of {len} bytes")));
        }
        let mut buf = vec![0u8; len];
        r.read_exact(&mut buf).await.map_err(|e| feed_err("receiving", e))?;
        let plain = cipher.lock().open(&buf).map_err(|_| {
            feed_err(
                "receiving",
                "a message that does not open (another key, or altered, replayed or reordered \
                 on the way)",
            )
        })?;
        decode(&plain)
    };
    tokio::time::timeout(SILENCE, read).await.map_err(|_| feed_err("receiving", "silence"))?
}

// ---------------------------------------------------------------------------------------------
// The primary's side.

/// A standby's session with this primary.
#[derive(Debug)]
struct Session {
    id: u64,
    /// Which connection carries it.
    conn: u64,
    peer: String,
    /// The standby holds every entry below this that the store may lack.
    acked: u64,
    /// Its `Standby(Some)` entry is queued: when it ends, `Standby(None)` must follow.
    marked: bool,
    /// Its acknowledgements let reads go (its `Standby(Some)` entry is in the store).
    active: bool,
}

#[derive(Debug, Default)]
struct FeedState {
    /// Entries the store may not hold yet, in order.
    buffer: VecDeque<(u64, Arc<Vec<u8>>)>,
    /// Every entry below this is in the store.
    durable: u64,
    session: Option<Session>,
}

/// The primary's end of the log feed, held by its [`StoreLog`].
#[derive(Debug)]
pub struct Feed {
    incarnation: u64,
    state: parking_lot::Mutex<FeedState>,
    /// Rung when an entry is queued, the store's log grows, or the session changes.
    changed: tokio::sync::Notify,
    /// Rung when the standby acknowledges, or the session changes.
    acked: tokio::sync::Notify,
    conns: AtomicU64,
}

impl Feed {
    /// A feed whose store-side log holds every entry below `durable`.
    pub fn new(durable: u64) -> Self {
        Feed {
            incarnation: rand::random(),
            state: parking_lot::Mutex::new(FeedState { durable, ..Default::default() }),
            changed: tokio::sync::Notify::new(),
            acked: tokio::sync::Notify::new(),
            conns: AtomicU64::new(0),
        }
    }

    /// Entry `n`, just queued (in order, under the log's queue lock).
    pub(crate) fn push(&self, n: u64, encoded: Vec<u8>) {
        self.state.lock().buffer.push_back((n, Arc::new(encoded)));
        self.changed.notify_waiters();
    }

    /// Every entry below `through` is in the store.
    pub(crate) fn store_holds(&self, through: u64) {
        let mut s = self.state.lock();
        if through > s.durable {
            s.durable = through;
            while s.buffer.front().is_some_and(|(n, _)| *n < through) {
                s.buffer.pop_front();
            }
        }
        drop(s);
        self.changed.notify_waiters();
    }

    /// Whether a read after entry `n` may go on the standby's word.
    pub(crate) fn standby_holds(&self, n: u64) -> bool {
        self.state.lock().session.as_ref().is_some_and(|s| s.active && s.acked > n)
    }

    /// Whether a standby's acknowledgements let reads go (its session is on).
    pub(crate) fn standby_on(&self) -> bool {
        self.state.lock().session.as_ref().is_some_and(|s| s.active)
    }

    /// A future rung when the standby acknowledges more (enable it before checking).
    pub(crate) fn acked(&self) -> tokio::sync::futures::Notified<'_> {
        self.acked.notified()
    }

    /// Who follows, and how far: for the operator (`blindfold status`, logs).
    pub fn describe(&self) -> String {
        let s = self.state.lock();
        match &s.session {
            None => "no standby is connected: reads wait for the store".into(),
            Some(x) if x.active => format!(
                "standby {} (session {:016x}) holds the log through entry {} (the store \
                 through {}): reads wait for whichever holds their record first",
                x.peer, x.id, x.acked, s.durable
            ),
            Some(x) => format!(
                "standby {} is catching up (it holds through entry {}, the store through {}): \
                 reads wait for the store",
                x.peer, x.acked, s.durable
            ),
        }
    }
}

/// Keeps `<dir>/`[`STATUS_FILE`] saying what [`Feed::describe`] says, until aborted.
pub async fn keep_status(feed: Arc<Feed>, dir: std::path::PathBuf) {
    let mut said = String::new();
    loop {
        let now = feed.describe();
        if now != said {
            let _ = crate::datadir::write_private(&dir.join(STATUS_FILE), now.as_bytes());
            said = now;
        }
        tokio::time::sleep(HEARTBEAT).await;
    }
}

/// Accepts standbys on `listener` for `log` until aborted (aborting it ends every connection).
pub async fn serve(listener: tokio::net::TcpListener, log: Arc<StoreLog>, key: Arc<MasterKey>) {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let (log, key) = (Arc::clone(&log), Arc::clone(&key));
                    conns.spawn(async move {
                        if let Err(e) = serve_one(stream, peer, &log, &key).await {
                            tracing::warn!(%peer, error = %e, "the standby's log feed ended");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a standby failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_one(
    mut stream: TcpStream,
    peer: SocketAddr,
    log: &Arc<StoreLog>,
    key: &MasterKey,
) -> Result<()> {
    let _ = stream.set_nodelay(true);
    let cipher = parking_lot::Mutex::new(handshake(&mut stream, key, false).await?);
    let (mut r, mut w) = stream.into_split();
    let hello: ToPrimary = recv(&mut r, &cipher).await.map_err(|e| {
        GatewayError::Config(format!(
            "{e} (a standby must be given this gateway's key file; anything else is refused)"
        ))
    })?;
    let ToPrimary::Hello { standby, name } = hello else {
        return Err(feed_err("opening", "the standby did not say who it is"));
    };
    let feed = log.feed().expect("a log that serves a feed has one");
    let conn = feed.conns.fetch_add(1, Ordering::Relaxed) + 1;
    let id = feed.incarnation ^ standby;
    let peer_name: String = format!("{} at {peer}", name.chars().take(80).collect::<String>());
    // (Read before the feed's lock: the log's queue lock is taken before it, never after.)
    let caught_up_at = log.next_entry();
    let first = {
        let mut s = feed.state.lock();
        if let Some(old) = &s.session {
            return Err(feed_err(
                "refused a second standby",
                format!("{} already follows this gateway", old.peer),
            ));
        }
        s.session = Some(Session {
            id,
            conn,
            peer: peer_name.clone(),
            acked: 0,
            marked: false,
            active: false,
        });
        s.durable
    };
    tracing::info!(standby = %peer_name, "a standby connected to the log feed");
    let result =
        feed_session(log, feed, &cipher, &mut r, &mut w, id, conn, first, caught_up_at).await;
    // The session is over: reads wait for the store again, and the log says so.
    let was_marked = {
        let mut s = feed.state.lock();
        match s.session.take() {
            Some(x) if x.conn == conn => x.marked,
            other => {
                s.session = other;
                false
            }
        }
    };
    feed.acked.notify_waiters();
    // (Also when its entry was queued but not yet in the store: the log must not go on naming
    // a session that ended, or every recovery from the store alone would rebuild.)
    if was_marked {
        let n = log.enqueue(Entry::Standby(None));
        let log = Arc::clone(log);
        tokio::spawn(async move {
            let _ = log.durable(n).await;
        });
    }
    tracing::warn!(standby = %peer_name, "the standby left the log feed: reads wait for the store");
    result
}

#[allow(clippy::too_many_arguments)]
async fn feed_session(
    log: &Arc<StoreLog>,
    feed: &Feed,
    cipher: &parking_lot::Mutex<ChannelCipher>,
    r: &mut tokio::net::tcp::OwnedReadHalf,
    w: &mut tokio::net::tcp::OwnedWriteHalf,
    id: u64,
    conn: u64,
    first: u64,
    caught_up_at: u64,
) -> Result<()> {
    send(w, cipher, &ToStandby::Start { session: id, first }).await?;
    let writer = async {
        let mut next = first;
        let mut told_durable = first;
        loop {
            let changed = feed.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let (durable, batch) = {
                let s = feed.state.lock();
                let mut batch = Vec::new();
                let mut bytes = 0;
                next = next.max(s.durable);
                for (n, e) in s.buffer.iter().filter(|(n, _)| *n >= next) {
                    if *n != next + batch.len() as u64 || bytes > BATCH_BYTES {
                        break;
                    }
                    bytes += e.len();
                    batch.push(Arc::clone(e));
                }
                (s.durable, batch)
            };
            if durable > told_durable {
                send(w, cipher, &ToStandby::Durable { through: durable }).await?;
                told_durable = durable;
            }
            if !batch.is_empty() {
                let entries = batch.iter().map(|e| e.as_ref().clone()).collect();
                send(w, cipher, &ToStandby::Entries { first: next, entries }).await?;
                next += batch.len() as u64;
                continue;
            }
            if tokio::time::timeout(HEARTBEAT, changed).await.is_err() {
                send(w, cipher, &ToStandby::Durable { through: told_durable }).await?;
            }
        }
        #[allow(unreachable_code)]
        Ok::<(), GatewayError>(())
    };
    let reader = async {
        loop {
            let ToPrimary::Ack { through } = recv(r, cipher).await? else {
                return Err(feed_err("receiving", "an unexpected message from the standby"));
            };
            let mark = {
                let mut s = feed.state.lock();
                match s.session.as_mut().filter(|x| x.conn == conn) {
                    Some(x) => {
                        x.acked = x.acked.max(through);
                        let mark = !x.marked && through >= caught_up_at;
                        x.marked |= mark;
                        mark
                    }
                    None => false,
                }
            };
            feed.acked.notify_waiters();
            if mark {
                // Caught up: once the store holds the word that this standby's
                // acknowledgements count, they let reads go. (No await between marking the
                // session and queueing its entry: the session cannot end in between.)
                let log = Arc::clone(log);
                let n = log.enqueue(Entry::Standby(Some(id)));
                let feed_log = Arc::clone(&log);
                tokio::spawn(async move {
                    if feed_log.durable(n).await.is_ok() {
                        if let Some(feed) = feed_log.feed() {
                            let mut s = feed.state.lock();
                            if let Some(x) = s.session.as_mut().filter(|x| x.conn == conn) {
                                x.active = true;
                                tracing::info!(standby = %x.peer, "the standby caught up: reads wait for it or the store, whichever is first");
                            }
                            drop(s);
                            feed.acked.notify_waiters();
                        }
                    }
                });
            }
        }
    };
    tokio::select! {
        r = writer => r,
        r = reader => r,
    }
}

// ---------------------------------------------------------------------------------------------
// The standby's side.

/// What a standby holds of the primary's log beyond what the store may hold: entries numbered
/// from `base`, of session `session`.
#[derive(Clone, Debug, Default)]
pub struct Tail {
    /// The session the entries belong to.
    pub session: u64,
    /// The number of the first entry.
    pub base: u64,
    /// The entries, encoded as in the log.
    pub entries: Vec<Vec<u8>>,
}

#[derive(Debug, Default)]
struct FollowState {
    session: Option<u64>,
    base: u64,
    entries: VecDeque<Vec<u8>>,
    connected: bool,
    last_error: Option<String>,
}

impl FollowState {
    fn end(&self) -> u64 {
        self.base + self.entries.len() as u64
    }

    fn apply(&mut self, m: ToStandby) -> Result<()> {
        match m {
            ToStandby::Start { session, first } => {
                if self.session != Some(session) || first > self.end() {
                    self.entries.clear();
                    self.base = first;
                }
                self.session = Some(session);
                self.drop_below(first);
            }
            ToStandby::Durable { through } => self.drop_below(through),
            ToStandby::Entries { first, entries } => {
                if self.session.is_none() {
                    return Err(feed_err("receiving", "entries before the session began"));
                }
                for (i, e) in entries.into_iter().enumerate() {
                    let n = first + i as u64;
                    if n < self.base {
                        continue; // in the store already
                    }
                    if n < self.end() {
                        continue; // held already (sent again after a reconnection)
                    }
                    if n > self.end() {
                        return Err(feed_err(
                            "receiving",
                            format!("entry {n} after entry {} (a gap)", self.end()),
                        ));
                    }
                    self.entries.push_back(e);
                }
            }
        }
        Ok(())
    }

    fn drop_below(&mut self, through: u64) {
        if through >= self.end() {
            self.entries.clear();
            self.base = self.base.max(through);
            return;
        }
        while self.base < through {
            self.entries.pop_front();
            self.base += 1;
        }
    }
}

/// A standby's end of the log feed: follows the primary at an address, reconnecting when the
/// connection ends, until stopped.
#[derive(Debug)]
pub struct Follower {
    state: Arc<parking_lot::Mutex<FollowState>>,
    task: tokio::task::JoinHandle<()>,
    addr: String,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Follows the primary's log feed at `addr` (`host:port`) under `key`, as `name`.
pub fn follow(addr: String, key: Arc<MasterKey>, name: String) -> Follower {
    let state = Arc::new(parking_lot::Mutex::new(FollowState::default()));
    let standby: u64 = rand::random();
    let task = {
        let (state, addr) = (Arc::clone(&state), addr.clone());
        tokio::spawn(async move {
            loop {
                let r = follow_once(&addr, &key, standby, &name, &state).await;
                {
                    let mut s = state.lock();
                    s.connected = false;
                    if let Err(e) = r {
                        let e = e.to_string();
                        if s.last_error.as_ref() != Some(&e) {
                            tracing::warn!(primary = %addr, error = %e, "the log feed from the primary ended; connecting again");
                        }
                        s.last_error = Some(e);
                    }
                }
                tokio::time::sleep(RECONNECT).await;
            }
        })
    };
    Follower { state, task, addr }
}

async fn follow_once(
    addr: &str,
    key: &MasterKey,
    standby: u64,
    name: &str,
    state: &parking_lot::Mutex<FollowState>,
) -> Result<()> {
    let mut stream = tokio::time::timeout(HANDSHAKE, TcpStream::connect(addr))
        .await
        .map_err(|_| feed_err("connecting", "no answer"))?
        .map_err(|e| feed_err(&format!("connecting to {addr}"), e))?;
    let _ = stream.set_nodelay(true);
    let cipher = parking_lot::Mutex::new(handshake(&mut stream, key, true).await?);
    let (mut r, mut w) = stream.into_split();
    send(&mut w, &cipher, &ToPrimary::Hello { standby, name: name.to_string() }).await?;
    loop {
        let m: ToStandby = recv(&mut r, &cipher).await.map_err(|e| {
            GatewayError::Config(format!(
                "{e} (the primary must run with --standby-listen and the same key file)"
            ))
        })?;
        let through = {
            let mut s = state.lock();
            if matches!(m, ToStandby::Start { .. }) {
                // The primary took this standby on (a refused one hears nothing).
                s.connected = true;
                s.last_error = None;
            }
            s.apply(m)?;
            s.end()
        };
        send(&mut w, &cipher, &ToPrimary::Ack { through }).await?;
    }
}

impl Follower {
    /// Stops following; returns what it held of the log's tail (none before a session began).
    pub fn stop(self) -> Option<Tail> {
        self.task.abort();
        let s = self.state.lock();
        s.session.map(|session| Tail {
            session,
            base: s.base,
            entries: s.entries.iter().cloned().collect(),
        })
    }

    /// Where it stands, for the operator.
    pub fn describe(&self) -> String {
        let s = self.state.lock();
        match (s.connected, &s.last_error) {
            (true, _) => format!(
                "following the primary's log feed at {}: it holds {} the store may lack \
                 (through entry {})",
                self.addr,
                match s.entries.len() {
                    1 => "1 entry".to_string(),
                    n => format!("{n} entries"),
                },
                s.end()
            ),
            (false, Some(e)) => {
                format!("not following the primary's log feed at {}: {e}", self.addr)
            }
            (false, None) => format!("connecting to the primary's log feed at {}", self.addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(a: u64, b: u64) -> ToStandby {
        ToStandby::Entries { first: a, entries: (a..b).map(|n| vec![n as u8]).collect() }
    }

    /// [`ToStandby`] as it was encoded before its entries were encoded whole.
    #[derive(Serialize, Deserialize)]
    enum ByteByByte {
        Start { session: u64, first: u64 },
        Entries { first: u64, entries: Vec<Vec<u8>> },
    }

    /// A primary and a standby of the builds before and after entries were encoded whole
    /// understand each other: the bytes are the same.
    #[test]
    fn feed_messages_encode_the_same_bytes_as_when_encoded_byte_by_byte() {
        let e = vec![vec![4; 20_000], Vec::new(), vec![9]];
        let new = encode(&ToStandby::Entries { first: 3, entries: e.clone() });
        let old = encode(&ByteByByte::Entries { first: 3, entries: e.clone() });
        assert_eq!(new, old);
        match bincode::deserialize::<ToStandby>(&old).unwrap() {
            ToStandby::Entries { first: 3, entries } => assert_eq!(entries, e),
            other => panic!("decoded as {other:?}"),
        }
        let start = encode(&ByteByByte::Start { session: 1, first: 2 });
        assert_eq!(start, encode(&ToStandby::Start { session: 1, first: 2 }));
    }

    #[test]
    fn a_standby_keeps_a_contiguous_tail_across_reconnections() {
        let mut s = FollowState::default();
        assert!(s.apply(entries(0, 1)).is_err(), "entries before a session");
        s.apply(ToStandby::Start { session: 7, first: 10 }).unwrap();
        s.apply(entries(10, 14)).unwrap();
        assert_eq!((s.base, s.end()), (10, 14));
        s.apply(ToStandby::Durable { through: 12 }).unwrap();
        assert_eq!((s.base, s.end()), (12, 14));
        assert!(s.apply(entries(15, 16)).is_err(), "a gap");
        // The same session again: what is held stays, what is sent again is skipped.
        let mut s2 = FollowState { session: Some(7), base: 12, ..Default::default() };
        s2.entries.extend([vec![12], vec![13]]);
        s2.apply(ToStandby::Start { session: 7, first: 13 }).unwrap();
        assert_eq!((s2.base, s2.end()), (13, 14));
        s2.apply(entries(13, 16)).unwrap();
        assert_eq!((s2.base, s2.end()), (13, 16));
        assert_eq!(s2.entries.iter().map(|e| e[0]).collect::<Vec<_>>(), vec![13, 14, 15]);
        // Another session (a primary started again): the old tail is not its log.
        s2.apply(ToStandby::Start { session: 8, first: 13 }).unwrap();
        assert_eq!((s2.base, s2.end()), (13, 13));
        // The store holding more than the tail reaches: nothing is held.
        s2.apply(entries(13, 15)).unwrap();
        s2.apply(ToStandby::Durable { through: 20 }).unwrap();
        assert_eq!((s2.base, s2.end()), (20, 20));
    }
}
