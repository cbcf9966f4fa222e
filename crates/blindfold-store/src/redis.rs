//! [`RedisStore`]: cells as Redis string values, for deployments that want low latency.
//!
//! # Layout
//!
//! Cell `i` of the array `name` is the key `<prefix>:<name>:<i>` (default prefix `blindfold`),
//! holding exactly one cell of bytes; `<prefix>:<name>:geometry` records the array's shape.
//! A cell never written has no key and reads as zeros, so a new array needs no initialisation.
//!
//! # Requests
//!
//! A read batch is `MGET` (in chunks of [`CHUNK`] keys, all sent in one pipeline), a ranged read
//! batch is one pipeline of `GETRANGE`, and a write batch is `MSET` inside `MULTI`/`EXEC`, so the
//! server applies a whole batch or none of it. Requests go over a small pool of multiplexed
//! connections ([`RedisOptions::pool`], round robin), each of which pipelines every request
//! given to it and reconnects by itself after a dropped connection.
//!
//! Durability is the server's: with `appendonly yes` and `appendfsync always` an acknowledged
//! write survives a crash of the Redis server; with Redis's defaults it may not.
//! [`Store::flush`] therefore does nothing.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{ErrorKind, RedisError, RetryMethod};
use async_trait::async_trait;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

use crate::{ByteRange, CellId, Geometry, Result, Store, StoreError};

/// Keys per `MGET` or `MSET` command; larger batches are split and pipelined.
pub const CHUNK: usize = 256;
/// First line of the geometry marker.
const MARKER_FORMAT: &str = "format=blindfold-cells-redis";
/// Version of this layout.
const MARKER_VERSION: u32 = 1;

/// A password that never prints.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RedisPassword(String);

impl RedisPassword {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        Self(password.into())
    }

    /// The password itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RedisPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Which Redis server and database, from a `redis://[user[:password]@]host[:port][/db]` URL.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RedisAddress {
    /// Host name or IP address.
    pub host: String,
    /// TCP port (default 6379).
    pub port: u16,
    /// Database number (default 0).
    pub db: u32,
    /// ACL user name, if any.
    pub username: Option<String>,
    /// Password, if any. `$BLINDFOLD_REDIS_PASSWORD` is used when the URL has none.
    pub password: Option<RedisPassword>,
}

/// Options of a `redis://` store URL.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RedisOptions {
    /// First part of every key (`<prefix>:<name>:<cell>`).
    pub prefix: String,
    /// Number of multiplexed connections.
    pub pool: usize,
    /// Time limit for one command or pipeline to be answered.
    pub timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self { prefix: "blindfold".into(), pool: 4, timeout: Duration::from_secs(10) }
    }
}

/// An array of cells stored as Redis keys (layout in the [module docs](self)).
///
/// Open it with [`RedisStore::open`] or through [`crate::open_store`] with a
/// `redis://host:port/db` URL.
pub struct RedisStore {
    pool: Vec<ConnectionManager>,
    next: AtomicUsize,
    /// `<prefix>:<name>:`
    keys: String,
    geometry: Geometry,
    /// `redis://host:port/db` and the key prefix, without secrets, for messages.
    label: String,
    endpoint: String,
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("store", &self.label)
            .field("geometry", &self.geometry)
            .field("pool", &self.pool.len())
            .finish()
    }
}

impl RedisStore {
    /// Connects to the server at `address` and opens the array `name`, checking that it has
    /// `geometry`, or creates it (by writing its geometry marker) if there is none.
    ///
    /// Fails with [`StoreError::GeometryMismatch`] if the array exists with another shape,
    /// [`StoreError::NotAStore`] if its marker is not a blindfold marker,
    /// [`StoreError::AccessDenied`] for a wrong or missing password, [`StoreError::Missing`]
    /// for a database number the server does not have, [`StoreError::Unreachable`] if the
    /// server cannot be reached.
    pub async fn open(
        address: &RedisAddress,
        options: &RedisOptions,
        name: &str,
        geometry: Geometry,
    ) -> Result<Self> {
        let endpoint = format!("{}:{}", address.host, address.port);
        let label = format!("redis://{endpoint}/{} (keys {}:{name}:…)", address.db, options.prefix);
        if options.pool == 0 {
            return Err(StoreError::InvalidConfig(format!("{label}: pool must be at least 1")));
        }
        let partial = Self {
            pool: Vec::new(),
            next: AtomicUsize::new(0),
            keys: format!("{}:{name}:", options.prefix),
            geometry,
            label,
            endpoint,
        };
        let pool = connect_pool(address, options, &partial.label, &partial.endpoint).await?;
        let store = Self { pool, ..partial };
        store.check_marker().await?;
        tracing::debug!(store = %store.label, ?geometry, "opened Redis store");
        Ok(store)
    }

    /// Where this array lives (without secrets).
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The key that holds `cell`.
    pub fn key(&self, cell: CellId) -> String {
        format!("{}{}", self.keys, cell.0)
    }

    fn marker_key(&self) -> String {
        format!("{}geometry", self.keys)
    }

    /// The next connection of the pool.
    fn connection(&self) -> ConnectionManager {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.pool.len();
        self.pool[i].clone()
    }

    async fn check_marker(&self) -> Result<()> {
        let mut con = self.connection();
        let key = self.marker_key();
        let mut pipe = ::redis::pipe();
        pipe.cmd("SET").arg(&key).arg(marker_text(self.geometry)).arg("NX").ignore();
        pipe.cmd("GET").arg(&key);
        let (found,): (Option<String>,) = pipe
            .query_async(&mut con)
            .await
            .map_err(|e| self.map_error("reading the geometry marker", e))?;
        let found = found.ok_or_else(|| {
            self.backend("reading the geometry marker", "it vanished after SET NX".into(), true)
        })?;
        let geometry = parse_marker(&found).map_err(|reason| StoreError::NotAStore {
            path: format!("{} key {key}", self.label).into(),
            reason,
        })?;
        if geometry != self.geometry {
            return Err(StoreError::GeometryMismatch {
                path: self.label.clone().into(),
                found_cells: geometry.cell_count(),
                found_size: geometry.cell_size(),
                wanted_cells: self.geometry.cell_count(),
                wanted_size: self.geometry.cell_size(),
            });
        }
        Ok(())
    }

    fn backend(&self, context: &str, reason: String, retryable: bool) -> StoreError {
        StoreError::Backend {
            store: self.label.clone(),
            context: context.to_string(),
            source: reason.into(),
            retryable,
        }
    }

    /// Maps a Redis client error to a [`StoreError`].
    fn map_error(&self, context: &str, e: RedisError) -> StoreError {
        map_error(&self.label, &self.endpoint, context, e)
    }

    fn wrong_size(&self, cell: CellId, got: usize) -> StoreError {
        self.backend(
            &format!("reading cell {}", cell.0),
            format!(
                "its key holds {got} bytes but cells are {} bytes: it was changed by something \
                 other than blindfold",
                self.geometry.cell_size()
            ),
            false,
        )
    }
}

/// Maps a Redis client error to a [`StoreError`].
pub(crate) fn map_error(label: &str, endpoint: &str, context: &str, e: RedisError) -> StoreError {
    let code = e.code().unwrap_or_default().to_string();
    if e.kind() == ErrorKind::AuthenticationFailed
        || matches!(code.as_str(), "NOAUTH" | "WRONGPASS" | "NOPERM")
    {
        return StoreError::AccessDenied { store: label.to_string(), reason: e.to_string() };
    }
    if e.to_string().contains("DB index is out of range") {
        return StoreError::Missing {
            store: label.to_string(),
            what: "the database".into(),
            reason: e.to_string(),
        };
    }
    if e.is_connection_refusal() {
        return StoreError::Unreachable {
            store: label.to_string(),
            endpoint: endpoint.to_string(),
            reason: e.to_string(),
        };
    }
    if e.is_timeout() {
        return StoreError::Timeout(format!("{}: {context}: {e}", label));
    }
    let retryable = e.is_io_error()
        || e.is_connection_dropped()
        || matches!(code.as_str(), "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN")
        || matches!(e.retry_method(), RetryMethod::WaitAndRetry | RetryMethod::Reconnect);
    StoreError::Backend {
        store: label.to_string(),
        context: context.to_string(),
        source: Box::new(e),
        retryable,
    }
}

/// The pool of multiplexed connections of a `redis://` URL (password from the URL or from
/// `$BLINDFOLD_REDIS_PASSWORD`); `label` and `endpoint` name the store in errors.
pub(crate) async fn connect_pool(
    address: &RedisAddress,
    options: &RedisOptions,
    label: &str,
    endpoint: &str,
) -> Result<Vec<ConnectionManager>> {
    let mut url = String::from("redis://");
    let password = address
        .password
        .clone()
        .or_else(|| std::env::var("BLINDFOLD_REDIS_PASSWORD").ok().map(RedisPassword));
    if address.username.is_some() || password.is_some() {
        if let Some(user) = &address.username {
            url.extend(utf8_percent_encode(user, NON_ALPHANUMERIC));
        }
        if let Some(password) = &password {
            url.push(':');
            url.extend(utf8_percent_encode(password.expose(), NON_ALPHANUMERIC));
        }
        url.push('@');
    }
    let host = if address.host.contains(':') {
        format!("[{}]", address.host)
    } else {
        address.host.clone()
    };
    url.push_str(&format!("{host}:{}/{}", address.port, address.db));

    let client = ::redis::Client::open(url.as_str())
        .map_err(|e| map_error(label, endpoint, "parsing the server address", e))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(options.timeout))
        .set_number_of_retries(3)
        .set_min_delay(Duration::from_millis(50))
        .set_max_delay(Duration::from_secs(2));
    let mut pool = Vec::with_capacity(options.pool);
    for _ in 0..options.pool {
        let connection = ConnectionManager::new_with_config(client.clone(), config.clone())
            .await
            .map_err(|e| map_error(label, endpoint, "connecting", e))?;
        pool.push(connection);
    }
    Ok(pool)
}

fn marker_text(geometry: Geometry) -> String {
    format!(
        "{MARKER_FORMAT}\nversion={MARKER_VERSION}\ncell_count={}\ncell_size={}\n",
        geometry.cell_count(),
        geometry.cell_size()
    )
}

/// The geometry recorded in a marker, or why it is not a valid marker.
fn parse_marker(text: &str) -> std::result::Result<Geometry, String> {
    let mut lines = text.lines();
    if lines.next() != Some(MARKER_FORMAT) {
        return Err(format!("its geometry marker does not start with {MARKER_FORMAT:?}"));
    }
    let (mut version, mut count, mut size) = (None, None, None);
    for line in lines {
        let Some((key, value)) = line.split_once('=') else { continue };
        match key {
            "version" => version = value.parse::<u32>().ok(),
            "cell_count" => count = value.parse::<u64>().ok(),
            "cell_size" => size = value.parse::<u32>().ok(),
            _ => {}
        }
    }
    if version != Some(MARKER_VERSION) {
        return Err(format!(
            "its layout version is {version:?}; this build reads version {MARKER_VERSION}"
        ));
    }
    let (Some(count), Some(size)) = (count, size) else {
        return Err("its geometry marker lacks cell_count or cell_size".into());
    };
    Geometry::new(count, size).map_err(|e| format!("its geometry marker is impossible: {e}"))
}

/// Parses what follows `redis:` in a store URL:
/// `//[user[:password]@]host[:port][/db][?prefix=…&pool=…&timeout=…]`.
pub(crate) fn parse_url(rest: &str) -> std::result::Result<(RedisAddress, RedisOptions), String> {
    let form = "write it as `redis://host:port/db`, e.g. `redis://127.0.0.1:6379/0`";
    if !rest.starts_with("//") {
        return Err(format!("no `//` after `redis:`; {form}"));
    }
    let url = url::Url::parse(&format!("redis:{rest}")).map_err(|e| format!("{e}; {form}"))?;
    if url.fragment().is_some() {
        return Err("a fragment (`#…`) is not allowed".into());
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) if !d.is_empty() => d.to_string(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        _ => return Err(format!("no host; {form}")),
    };
    let port = url.port().unwrap_or(6379);
    if port == 0 {
        return Err(format!("port 0 is not a port; {form}"));
    }
    let path = url.path().trim_matches('/');
    let db = if path.is_empty() {
        0
    } else {
        path.parse::<u32>().map_err(|_| format!("{path:?} is not a database number; {form}"))?
    };
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s).decode_utf8().map(|c| c.into_owned()).map_err(
            |_| "the user name or password is not UTF-8 after percent-decoding".to_string(),
        )
    };
    let username = match url.username() {
        "" => None,
        user => Some(decode(user)?),
    };
    let password = url.password().map(decode).transpose()?.map(RedisPassword);
    let mut options = RedisOptions::default();
    let mut seen = std::collections::HashSet::new();
    for (key, value) in url.query_pairs() {
        if !seen.insert(key.to_string()) {
            return Err(format!("`{key}` is given more than once"));
        }
        match &*key {
            "prefix" => {
                let ok = (1..=128).contains(&value.len())
                    && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
                if !ok {
                    return Err(format!(
                        "prefix={value:?}: 1 to 128 ASCII letters, digits, `.`, `_`, `:`, `/` \
                         or `-`"
                    ));
                }
                options.prefix = value.to_string();
            }
            "pool" => {
                options.pool = value
                    .parse()
                    .ok()
                    .filter(|&n: &usize| (1..=64).contains(&n))
                    .ok_or_else(|| format!("pool={value:?} is not a number in 1..=64"))?
            }
            "timeout" => options.timeout = crate::duration::parse_duration(&value)?,
            other => {
                return Err(format!(
                    "unknown option {other:?}; the options are prefix, pool and timeout"
                ))
            }
        }
    }
    Ok((RedisAddress { host, port, db, username, password }, options))
}

/// Writes the URL that [`parse_url`] reads back as the same address and options, except that
/// the password is never written.
pub(crate) fn fmt_url(
    f: &mut fmt::Formatter<'_>,
    address: &RedisAddress,
    options: &RedisOptions,
) -> fmt::Result {
    f.write_str("redis://")?;
    if let Some(user) = &address.username {
        write!(f, "{}@", utf8_percent_encode(user, NON_ALPHANUMERIC))?;
    }
    if address.host.contains(':') {
        write!(f, "[{}]", address.host)?;
    } else {
        f.write_str(&address.host)?;
    }
    write!(f, ":{}/{}", address.port, address.db)?;
    let default = RedisOptions::default();
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    if options.prefix != default.prefix {
        query.append_pair("prefix", &options.prefix);
    }
    if options.pool != default.pool {
        query.append_pair("pool", &options.pool.to_string());
    }
    if options.timeout != default.timeout {
        query.append_pair("timeout", &crate::duration::fmt_duration(options.timeout));
    }
    let query = query.finish();
    if !query.is_empty() {
        write!(f, "?{query}")?;
    }
    Ok(())
}

#[async_trait]
impl Store for RedisStore {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        for &cell in cells {
            self.geometry.check_cell(cell)?;
        }
        if cells.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = ::redis::pipe();
        for chunk in cells.chunks(CHUNK) {
            let keys: Vec<String> = chunk.iter().map(|&c| self.key(c)).collect();
            pipe.cmd("MGET").arg(keys);
        }
        let mut con = self.connection();
        let chunks: Vec<Vec<Option<Vec<u8>>>> = pipe
            .query_async(&mut con)
            .await
            .map_err(|e| self.map_error(&format!("reading {} cells", cells.len()), e))?;
        let size = self.geometry.cell_size() as usize;
        let mut out = Vec::with_capacity(cells.len());
        for (&cell, value) in cells.iter().zip(chunks.into_iter().flatten()) {
            match value {
                None => out.push(vec![0u8; size]),
                Some(v) if v.len() == size => out.push(v),
                Some(v) => return Err(self.wrong_size(cell, v.len())),
            }
        }
        if out.len() != cells.len() {
            return Err(self.backend(
                "reading cells",
                format!("the server answered {} values for {} keys", out.len(), cells.len()),
                false,
            ));
        }
        Ok(out)
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        for range in ranges {
            self.geometry.check_range(range)?;
        }
        let asked: Vec<&ByteRange> = ranges.iter().filter(|r| r.len > 0).collect();
        let mut answers: Vec<Vec<u8>> = Vec::new();
        if !asked.is_empty() {
            let mut pipe = ::redis::pipe();
            for r in &asked {
                let end = u64::from(r.offset) + u64::from(r.len) - 1; // GETRANGE's end is inclusive
                pipe.cmd("GETRANGE").arg(self.key(r.cell)).arg(r.offset).arg(end);
            }
            let mut con = self.connection();
            answers = pipe
                .query_async(&mut con)
                .await
                .map_err(|e| self.map_error(&format!("reading {} ranges", asked.len()), e))?;
            if answers.len() != asked.len() {
                return Err(self.backend(
                    "reading ranges",
                    format!(
                        "the server answered {} values for {} ranges",
                        answers.len(),
                        asked.len()
                    ),
                    false,
                ));
            }
        }
        let mut answers = answers.into_iter();
        let mut out = Vec::with_capacity(ranges.len());
        for r in ranges {
            if r.len == 0 {
                out.push(Vec::new());
                continue;
            }
            let value = answers.next().unwrap_or_default();
            if value.is_empty() {
                // No such key: a cell never written.
                out.push(vec![0u8; r.len as usize]);
            } else if value.len() == r.len as usize {
                out.push(value);
            } else {
                return Err(self.wrong_size(r.cell, value.len()));
            }
        }
        Ok(out)
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.set_cells(&cells).await
    }

    async fn write_shared(&self, cells: Vec<(CellId, std::sync::Arc<Vec<u8>>)>) -> Result<()> {
        self.set_cells(&cells).await
    }

    /// Nothing to send: durability is the server's configuration (see the
    /// [module docs](self)).
    async fn flush(&self) -> Result<()> {
        Ok(())
    }
}

impl RedisStore {
    /// Checks a batch, then sets every cell from the caller's buffers in one transaction.
    async fn set_cells<B: AsRef<Vec<u8>>>(&self, cells: &[(CellId, B)]) -> Result<()> {
        for (cell, data) in cells {
            self.geometry.check_write(*cell, data.as_ref())?;
        }
        if cells.is_empty() {
            return Ok(());
        }
        // One transaction: the server applies every MSET of the batch or none. Within MSET a
        // later value for the same key wins, as the trait asks.
        let mut pipe = ::redis::pipe();
        pipe.atomic();
        for chunk in cells.chunks(CHUNK) {
            let cmd = pipe.cmd("MSET");
            for (cell, data) in chunk {
                cmd.arg(self.key(*cell)).arg(data.as_ref().as_slice());
            }
            cmd.ignore();
        }
        let mut con = self.connection();
        pipe.query_async::<()>(&mut con)
            .await
            .map_err(|e| self.map_error(&format!("writing {} cells", cells.len()), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_round_trips() {
        let g = Geometry::new(97, 80).unwrap();
        assert_eq!(parse_marker(&marker_text(g)).unwrap(), g);
        assert!(parse_marker("x").unwrap_err().contains("does not start"));
        assert!(parse_marker(&marker_text(g).replace("=1\n", "=9\n"))
            .unwrap_err()
            .contains("version"));
    }

    #[test]
    fn passwords_do_not_print() {
        let a = RedisAddress {
            host: "h".into(),
            port: 1,
            db: 0,
            username: None,
            password: Some(RedisPassword::new("hunter2")),
        };
        assert!(!format!("{a:?}").contains("hunter2"));
    }
}
