//! [`StoreUrl`] and [`open_store`]: choosing a backend from one string in a configuration file
//! or on the command line.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use percent_encoding::{percent_decode_str, AsciiSet, CONTROLS};

use crate::{
    FileStore, Geometry, MemoryStore, RedisAddress, RedisOptions, Result, S3Options, Store,
    StoreError, SyncMode,
};

const ACCEPTED: &str = "accepted forms are `memory:`, `file:///absolute/dir` and \
                        `file:relative/dir`, a file form optionally followed by \
                        `?sync=none|flush|always`, \
                        `s3://bucket/prefix?endpoint=…&region=…`, `redis://host:port/db` and \
                        `remote://host:port?key_file=/path`";

/// Schemes that later versions will accept.
const PLANNED: [&str; 3] = ["rediss", "http", "https"];

/// Bytes escaped when a path is written into a URL: enough that parsing it back gives the same
/// path.
const PATH_ESCAPES: &AsciiSet = &CONTROLS.add(b' ').add(b'%').add(b'?').add(b'#');

/// Where a set of cell arrays lives, parsed from a URL.
///
/// `Display` writes a URL that [`StoreUrl::parse`] reads back as the same value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum StoreUrl {
    /// `memory:` — fresh arrays in this process's memory, gone when it exits.
    Memory,
    /// `file:///absolute/dir` or `file:relative/dir` — one [`FileStore`] file per array in
    /// `dir`, named `<name>.cells`.
    File {
        /// The directory holding the files (created if missing).
        dir: PathBuf,
        /// When writes are made durable (`?sync=none|flush|always`, default `flush`).
        sync: SyncMode,
    },
    /// `s3://bucket/prefix?endpoint=…&region=…` — one object per cell in a bucket of any
    /// S3-compatible store (see [`crate::S3Store`]).
    S3 {
        /// The bucket.
        bucket: String,
        /// Key prefix inside the bucket, without leading or trailing `/` (may be empty); each
        /// array lives under `<prefix>/<name>/`.
        prefix: String,
        /// Endpoint, region and request options.
        options: S3Options,
    },
    /// `redis://[user[:password]@]host[:port][/db]` — one key per cell in a Redis database
    /// (see [`crate::RedisStore`]).
    Redis {
        /// Server, database and credentials.
        address: RedisAddress,
        /// Key prefix and connection options.
        options: RedisOptions,
    },
    /// `remote://host:port?key_file=/path` — arrays served by a `blindfold storage-server`
    /// listening there (see [`crate::remote`]), authenticated with the pre-shared key in the
    /// key file; without `key_file`, only a server started with `--insecure-no-auth` serves.
    Remote {
        /// `host:port` of the server.
        addr: String,
        /// The server's pre-shared key file (`--auth-key-file` on the server).
        key_file: Option<PathBuf>,
    },
}

impl StoreUrl {
    /// Parses `memory:`, `memory://`, `file:///absolute/dir`, `file://localhost/absolute/dir`,
    /// `file:/absolute/dir` or `file:relative/dir`, the file forms with an optional
    /// `?sync=none|flush|always`; percent-escapes in paths are decoded.
    pub fn parse(url: &str) -> Result<Self> {
        let bad = |reason: String| StoreError::InvalidUrl { url: url.to_string(), reason };
        let Some((scheme, rest)) = url.split_once(':').filter(|(s, _)| !s.is_empty()) else {
            return Err(bad(format!(
                "it has no scheme (for a directory, write `file:{url}`); {ACCEPTED}"
            )));
        };
        let scheme = scheme.to_ascii_lowercase();
        match scheme.as_str() {
            "memory" => {
                if rest.is_empty() || rest == "//" {
                    Ok(StoreUrl::Memory)
                } else {
                    Err(bad(format!("`memory:` takes no path or options; {ACCEPTED}")))
                }
            }
            "file" => parse_file(rest).map_err(bad),
            "remote" => parse_remote(rest).map_err(bad),
            "s3" => crate::s3::parse_url(rest)
                .map(|(bucket, prefix, options)| StoreUrl::S3 { bucket, prefix, options })
                .map_err(bad),
            "redis" => crate::redis::parse_url(rest)
                .map(|(address, options)| StoreUrl::Redis { address, options })
                .map_err(bad),
            s if PLANNED.contains(&s) => {
                Err(bad(format!("{s}:// is not supported yet; {ACCEPTED}")))
            }
            s => Err(bad(format!(
                "unknown scheme {s:?} (for a directory, write `file:PATH`); {ACCEPTED}"
            ))),
        }
    }
}

/// Parses the part of `remote://host:port[?key_file=/path]` after the colon.
fn parse_remote(rest: &str) -> std::result::Result<StoreUrl, String> {
    let form = "write it as `remote://host:port?key_file=/path/to/auth.key`, e.g. \
                `remote://127.0.0.1:7420?key_file=/etc/blindfold/storage.key`";
    let addr = rest.strip_prefix("//").ok_or_else(|| format!("no `//`; {form}"))?;
    let (addr, query) = match addr.split_once('?') {
        Some((a, q)) => (a, Some(q)),
        None => (addr, None),
    };
    let addr = addr.strip_suffix('/').unwrap_or(addr);
    if addr.contains(['/', '#', '@']) {
        return Err(format!("a remote store takes no path, fragment or user; {form}"));
    }
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("no port; {form}"))?;
    if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(format!("{addr:?} is not host:port; {form}"));
    }
    let mut key_file = None;
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if key != "key_file" {
            return Err(format!("unknown option {key:?}; the only option is `key_file=/path`"));
        }
        if key_file.is_some() {
            return Err("`key_file` is given more than once".into());
        }
        if value.is_empty() {
            return Err("`key_file` is empty".into());
        }
        key_file = Some(PathBuf::from(value.into_owned()));
    }
    Ok(StoreUrl::Remote { addr: addr.to_string(), key_file })
}

fn parse_file(rest: &str) -> std::result::Result<StoreUrl, String> {
    if rest.contains('#') {
        return Err("a fragment (`#…`) is not allowed; write a `#` in a path as `%23`".into());
    }
    let (path_part, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    let raw_path = if let Some(after) = path_part.strip_prefix("//") {
        let (host, path) = after.split_at(after.find('/').unwrap_or(after.len()));
        if !(host.is_empty() || host.eq_ignore_ascii_case("localhost")) {
            return Err(format!(
                "a file URL cannot name a host ({host:?}); for a local directory write \
                 `file:///absolute/dir` or `file:relative/dir`"
            ));
        }
        if path.is_empty() {
            return Err(
                "`file://` needs an absolute path, as in `file:///var/lib/blindfold`".into()
            );
        }
        path
    } else {
        path_part
    };
    if raw_path.is_empty() {
        return Err(
            "`file:` needs a directory, as in `file:cells` or `file:///var/lib/blindfold`".into()
        );
    }
    let dir = PathBuf::from(OsString::from_vec(percent_decode_str(raw_path).collect()));

    let mut sync = None;
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        if key != "sync" {
            return Err(format!(
                "unknown option {key:?}; the only option is `sync=none|flush|always`"
            ));
        }
        if sync.is_some() {
            return Err("`sync` is given more than once".into());
        }
        sync =
            Some(SyncMode::from_name(&value).ok_or_else(|| {
                format!("sync={value:?} is not one of `none`, `flush`, `always`")
            })?);
    }
    Ok(StoreUrl::File { dir, sync: sync.unwrap_or_default() })
}

impl FromStr for StoreUrl {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self> {
        StoreUrl::parse(s)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory:"),
            StoreUrl::File { dir, sync } => {
                f.write_str(if dir.is_absolute() { "file://" } else { "file:" })?;
                let bytes = dir.as_os_str().as_bytes();
                for piece in percent_encoding::percent_encode(bytes, PATH_ESCAPES) {
                    f.write_str(piece)?;
                }
                if *sync != SyncMode::default() {
                    write!(f, "?sync={sync}")?;
                }
                Ok(())
            }
            StoreUrl::Remote { addr, key_file } => {
                write!(f, "remote://{addr}")?;
                if let Some(path) = key_file {
                    let query = url::form_urlencoded::Serializer::new(String::new())
                        .append_pair("key_file", &path.to_string_lossy())
                        .finish();
                    write!(f, "?{query}")?;
                }
                Ok(())
            }
            StoreUrl::S3 { bucket, prefix, options } => {
                crate::s3::fmt_url(f, bucket, prefix, options)
            }
            StoreUrl::Redis { address, options } => crate::redis::fmt_url(f, address, options),
        }
    }
}

/// Checks a store name: 1 to 128 ASCII letters, digits, `.`, `_` or `-`, not starting with `.`.
pub(crate) fn check_name(name: &str) -> Result<()> {
    let bad =
        |reason: &str| StoreError::InvalidName { name: name.to_string(), reason: reason.into() };
    if name.is_empty() {
        return Err(bad("it is empty"));
    }
    if name.len() > 128 {
        return Err(bad("it is longer than 128 bytes"));
    }
    if name.starts_with('.') {
        return Err(bad("it starts with `.`"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(bad("only ASCII letters, digits, `.`, `_` and `-` are allowed"));
    }
    Ok(())
}

/// Opens (creating if needed) the array called `name` of the given geometry at `url`: a fresh
/// [`MemoryStore`] for `memory:`, the file `<dir>/<name>.cells` for a file URL.
///
/// `name` lets one URL hold several arrays (a data tree, position-map trees, …); it must be 1
/// to 128 ASCII letters, digits, `.`, `_` or `-`, not starting with `.`
/// ([`StoreError::InvalidName`] otherwise). File errors are those of
/// [`FileStore::create_or_open`], which runs on tokio's blocking pool.
pub async fn open_store(url: &StoreUrl, name: &str, geometry: Geometry) -> Result<Arc<dyn Store>> {
    check_name(name)?;
    match url {
        StoreUrl::Memory => Ok(Arc::new(MemoryStore::new(geometry))),
        StoreUrl::File { dir, sync } => {
            let path = dir.join(format!("{name}.cells"));
            let sync = *sync;
            let opened = tokio::task::spawn_blocking(move || {
                FileStore::create_or_open(path, geometry, sync)
            })
            .await;
            match opened {
                Ok(store) => Ok(Arc::new(store?)),
                Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
                Err(join) => Err(StoreError::io(
                    format!("opening store {name:?} in {}", dir.display()),
                    std::io::Error::new(std::io::ErrorKind::Interrupted, join.to_string()),
                )),
            }
        }
        StoreUrl::Remote { addr, key_file } => {
            let key = key_file.as_deref().map(crate::remote::AuthKey::load).transpose()?;
            Ok(Arc::new(crate::RemoteStore::open(addr, key, name, geometry).await?))
        }
        StoreUrl::S3 { bucket, prefix, options } => {
            Ok(Arc::new(crate::S3Store::open(bucket, prefix, options, name, geometry).await?))
        }
        StoreUrl::Redis { address, options } => {
            Ok(Arc::new(crate::RedisStore::open(address, options, name, geometry).await?))
        }
    }
}

/// Removes the array `name` from the store at `url`, if this kind of store can: returns
/// whether it was removed. File stores delete `<name>.cells` (`false` if it is not there);
/// S3 stores delete every object under `<prefix>/<name>/` (`false` if there was none);
/// memory stores keep nothing anyway; Redis and remote stores are left as they are (the
/// operator deletes the array with the store's own tools). Only for arrays nothing uses any
/// more, such as the tree a growth or a recovery's rebuild replaced.
pub async fn remove_array(url: &StoreUrl, name: &str) -> Result<bool> {
    check_name(name)?;
    match url {
        StoreUrl::File { dir, .. } => {
            let path = dir.join(format!("{name}.cells"));
            match tokio::fs::remove_file(&path).await {
                Ok(()) => {
                    if let Ok(d) = std::fs::File::open(dir) {
                        let _ = d.sync_all();
                    }
                    Ok(true)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(StoreError::io(format!("removing {}", path.display()), e)),
            }
        }
        StoreUrl::S3 { bucket, prefix, options } => {
            crate::S3Store::remove(bucket, prefix, options, name).await
        }
        StoreUrl::Memory | StoreUrl::Remote { .. } | StoreUrl::Redis { .. } => Ok(false),
    }
}
