//! [`S3Store`]: cells as objects in any S3-compatible object store (AWS S3, MinIO, Ceph,
//! Backblaze B2, Cloudflare R2, …), through the `object_store` crate.
//!
//! # Layout
//!
//! One object per cell, named `<prefix>/<name>/<cell id in decimal>`, each exactly one cell
//! long, plus one small marker object `<prefix>/<name>/geometry` that records the shape of the
//! array. A cell that was never written has no object; reading it (a `404`) gives zeros, so a new
//! array needs no initialisation pass and costs nothing to create. Ranged reads are HTTP ranged
//! GETs of the cell's object.
//!
//! # Requests
//!
//! A batch becomes one request per cell (or range), up to [`S3Options::concurrency`] in flight
//! at once. Duplicate cells in a write batch are written once, with the last buffer. Each
//! request is retried with exponential backoff by `object_store` on connection errors, 5xx
//! answers and timeouts ([`S3Options::retries`] times, within [`S3Options::timeout`] each);
//! what still fails is mapped to a [`StoreError`] whose
//! [`is_retryable`](StoreError::is_retryable) says whether the caller may try again.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{self, StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::client::{HttpError, HttpErrorKind};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig,
};

use crate::{ByteRange, CellId, Geometry, Result, Store, StoreError};

/// Name of the marker object (next to the cells) that records the geometry.
const MARKER: &str = "geometry";
/// First line of the marker object.
const MARKER_FORMAT: &str = "format=blindfold-cells-s3";
/// Version of this layout.
const MARKER_VERSION: u32 = 1;

/// Options of an `s3://` store URL. Credentials are never part of them: they come from the
/// environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, or the
/// instance's role on AWS).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct S3Options {
    /// Endpoint of an S3-compatible service, e.g. `http://127.0.0.1:9000`; `None` for AWS
    /// (or `AWS_ENDPOINT` from the environment).
    pub endpoint: Option<String>,
    /// Region; `None` takes `AWS_REGION` from the environment, else `us-east-1`.
    pub region: Option<String>,
    /// Address buckets as `bucket.host` (virtual-hosted style) instead of `host/bucket` (path
    /// style, the default, which every S3-compatible server understands).
    pub virtual_hosted: bool,
    /// Requests in flight at once for one batch.
    pub concurrency: usize,
    /// Time limit of one HTTP request (connecting has its own limit of 5 s).
    pub timeout: Duration,
    /// Retries of one request (with exponential backoff) before an error is returned.
    pub retries: usize,
}

impl Default for S3Options {
    fn default() -> Self {
        Self {
            endpoint: None,
            region: None,
            virtual_hosted: false,
            concurrency: 32,
            timeout: Duration::from_secs(30),
            retries: 3,
        }
    }
}

/// An `object_store` S3 client builder for `bucket` with these options, the credentials taken
/// from the environment (`AWS_ACCESS_KEY_ID`, …; [`S3Store::open`] may set explicit ones).
///
/// An endpoint given here wins over the environment's: `object_store` would otherwise let an
/// `AWS_ENDPOINT_URL_S3` left in the caller's environment replace it, and send the cells to
/// another server.
pub fn aws_builder(bucket: &str, options: &S3Options) -> AmazonS3Builder {
    let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket);
    if let Some(region) = &options.region {
        b = b.with_region(region);
    }
    if let Some(endpoint) = &options.endpoint {
        b = b
            .with_endpoint(endpoint)
            .with_config(AmazonS3ConfigKey::S3Endpoint, endpoint)
            .with_allow_http(endpoint.starts_with("http://"));
    }
    b.with_virtual_hosted_style_request(options.virtual_hosted)
}

/// The `object_store` client of an `s3://` URL: timeouts, retries and credentials (explicit,
/// or from the environment) as [`S3Store::open`] documents them. `label` names the store in
/// errors.
pub(crate) fn build_client(
    bucket: &str,
    options: &S3Options,
    credentials: Option<S3Credentials>,
    label: &str,
) -> Result<AmazonS3> {
    let config_error = |reason: String| StoreError::InvalidConfig(format!("{label}: {reason}"));
    let mut builder = aws_builder(bucket, options);
    let mut client_options = ClientOptions::new()
        .with_timeout(options.timeout)
        .with_connect_timeout(Duration::from_secs(5))
        .with_pool_max_idle_per_host(options.concurrency.max(1));
    if let Some(endpoint) = &options.endpoint {
        client_options = client_options.with_allow_http(endpoint.starts_with("http://"));
    }
    builder = builder.with_client_options(client_options).with_retry(RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: options.retries,
        retry_timeout: options.timeout.saturating_mul(2).max(Duration::from_secs(10)),
    });
    let explicit = credentials.is_some();
    if let Some(c) = credentials {
        builder =
            builder.with_access_key_id(c.access_key_id).with_secret_access_key(c.secret_access_key);
        if let Some(token) = c.session_token {
            builder = builder.with_token(token);
        }
    }
    // Without a key, object_store would ask the EC2 instance metadata service, which only
    // exists on AWS; anywhere else that is a long wait for a confusing error.
    if options.endpoint.is_some()
        && !explicit
        && std::env::var_os("AWS_ACCESS_KEY_ID").is_none()
        && std::env::var_os("AWS_WEB_IDENTITY_TOKEN_FILE").is_none()
        && std::env::var_os("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI").is_none()
        && std::env::var_os("AWS_CONTAINER_CREDENTIALS_FULL_URI").is_none()
    {
        return Err(StoreError::AccessDenied {
            store: label.to_string(),
            reason: "no credentials: AWS_ACCESS_KEY_ID is not set".into(),
        });
    }
    builder.build().map_err(|e| config_error(e.to_string()))
}

/// Credentials given explicitly (for example from command-line flags) instead of through the
/// environment. Never printed.
#[derive(Clone)]
pub struct S3Credentials {
    /// The access key id.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// A session token, for temporary credentials.
    pub session_token: Option<String>,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field("session_token", &self.session_token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// An array of cells stored as one object per cell in an S3 bucket (layout in the
/// [module docs](self)).
///
/// Open it with [`S3Store::open`] or through [`crate::open_store`] with an
/// `s3://bucket/prefix?endpoint=…` URL.
pub struct S3Store {
    client: Arc<AmazonS3>,
    /// `<prefix>/<name>` (no leading or trailing `/`).
    base: String,
    geometry: Geometry,
    concurrency: usize,
    /// `s3://bucket/prefix/name`, for messages.
    label: String,
    /// Where requests go, for messages.
    endpoint: String,
    bucket: String,
}

impl fmt::Debug for S3Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Store")
            .field("store", &self.label)
            .field("endpoint", &self.endpoint)
            .field("geometry", &self.geometry)
            .field("concurrency", &self.concurrency)
            .finish()
    }
}

/// Where the array `name` lives: its key prefix `<prefix>/<name>` (no leading or trailing
/// `/`), `s3://bucket/prefix/name` for messages, and the endpoint's name for messages.
struct Location {
    base: String,
    label: String,
    endpoint: String,
}

impl Location {
    fn of(bucket: &str, prefix: &str, options: &S3Options, name: &str) -> Self {
        let prefix = prefix.trim_matches('/');
        let base = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
        let label = format!("s3://{bucket}/{base}");
        let endpoint = options.endpoint.clone().unwrap_or_else(|| "AWS S3".to_string());
        Self { base, label, endpoint }
    }
}

impl S3Store {
    /// Opens the array `name` under `prefix` in `bucket`, checking that it has `geometry`, or
    /// creates it (by writing its geometry marker) if there is none.
    ///
    /// Fails with [`StoreError::GeometryMismatch`] if the array exists with another shape,
    /// [`StoreError::NotAStore`] if its marker is not a blindfold marker,
    /// [`StoreError::AccessDenied`] for bad or missing credentials, [`StoreError::Missing`] if
    /// the bucket does not exist, [`StoreError::Unreachable`] if the endpoint cannot be
    /// reached. `prefix` may be empty; `name` must be a valid store name (see
    /// [`crate::open_store`]).
    pub async fn open(
        bucket: &str,
        prefix: &str,
        options: &S3Options,
        name: &str,
        geometry: Geometry,
    ) -> Result<Self> {
        Self::open_with_credentials(bucket, prefix, options, None, name, geometry).await
    }

    /// [`S3Store::open`] with explicit credentials; `None` takes them from the environment
    /// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, or the instance's
    /// role on AWS).
    pub async fn open_with_credentials(
        bucket: &str,
        prefix: &str,
        options: &S3Options,
        credentials: Option<S3Credentials>,
        name: &str,
        geometry: Geometry,
    ) -> Result<Self> {
        let Location { base, label, endpoint } = Location::of(bucket, prefix, options, name);
        let config_error = |reason: String| StoreError::InvalidConfig(format!("{label}: {reason}"));
        if options.concurrency == 0 {
            return Err(config_error("concurrency must be at least 1".into()));
        }

        let client = build_client(bucket, options, credentials, &label)?;

        let store = Self {
            client: Arc::new(client),
            base,
            geometry,
            concurrency: options.concurrency,
            label,
            endpoint,
            bucket: bucket.to_string(),
        };
        store.check_marker().await?;
        tracing::debug!(store = %store.label, ?geometry, "opened S3 store");
        Ok(store)
    }

    /// Removes the array `name` under `prefix` in `bucket`: every object under
    /// `<prefix>/<name>/` (its cells and its marker; another array whose name merely starts
    /// the same is not touched). Returns whether there was anything to remove. Only for an
    /// array nothing uses any more ([`crate::remove_array`]).
    pub async fn remove(
        bucket: &str,
        prefix: &str,
        options: &S3Options,
        name: &str,
    ) -> Result<bool> {
        let Location { base, label, endpoint } = Location::of(bucket, prefix, options, name);
        let client = build_client(bucket, options, None, &label)?;
        let dir = Path::from(base.as_str());
        let listed = client.list(Some(&dir)).map_ok(|meta| meta.location).boxed();
        let mut removed = client.delete_stream(listed);
        let mut any = false;
        while let Some(done) = removed.next().await {
            match done {
                Ok(_) => any = true,
                // Gone already (another remover, or a listing that lags a delete).
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    return Err(map_error(&label, &endpoint, bucket, "removing the array", e))
                }
            }
        }
        Ok(any)
    }

    /// Reads the geometry marker, writing it first if the array is new.
    async fn check_marker(&self) -> Result<()> {
        let path = self.path_of(MARKER);
        if let Some(found) = self.read_marker(&path).await? {
            return self.compare(&found);
        }
        let payload = PutPayload::from(marker_text(self.geometry).into_bytes());
        let create = PutOptions { mode: PutMode::Create, ..PutOptions::default() };
        match self.client.put_opts(&path, payload.clone(), create).await {
            Ok(_) => Ok(()),
            // Another process created it first: it must agree with us.
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => {
                match self.read_marker(&path).await? {
                    Some(found) => self.compare(&found),
                    None => Err(self.backend(
                        "creating the geometry marker",
                        "the marker was reported to exist but cannot be read".into(),
                        true,
                    )),
                }
            }
            // Servers without conditional writes: a plain write (a race between two creators
            // of the same new array is then not detected).
            Err(object_store::Error::NotImplemented { .. })
            | Err(object_store::Error::NotSupported { .. }) => self
                .client
                .put(&path, payload)
                .await
                .map(|_| ())
                .map_err(|e| self.map_error("writing the geometry marker", e)),
            Err(e) => Err(self.map_error("writing the geometry marker", e)),
        }
    }

    async fn read_marker(&self, path: &Path) -> Result<Option<String>> {
        let context = "reading the geometry marker";
        match self.client.get(path).await {
            Ok(got) => {
                let bytes = got.bytes().await.map_err(|e| self.map_error(context, e))?;
                Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
            }
            Err(e @ object_store::Error::NotFound { .. }) => {
                if let Some(missing) = self.missing_bucket(&e) {
                    return Err(missing);
                }
                Ok(None)
            }
            Err(e) => Err(self.map_error(context, e)),
        }
    }

    fn compare(&self, marker: &str) -> Result<()> {
        let found = parse_marker(marker).map_err(|reason| StoreError::NotAStore {
            path: format!("{}/{MARKER}", self.label).into(),
            reason,
        })?;
        if found != self.geometry {
            return Err(StoreError::GeometryMismatch {
                path: self.label.clone().into(),
                found_cells: found.cell_count(),
                found_size: found.cell_size(),
                wanted_cells: self.geometry.cell_count(),
                wanted_size: self.geometry.cell_size(),
            });
        }
        Ok(())
    }

    /// `s3://bucket/prefix/name`: where this array lives.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The object that holds `cell` (relative to the bucket).
    pub fn object_name(&self, cell: CellId) -> String {
        format!("{}/{}", self.base, cell.0)
    }

    fn path_of(&self, leaf: &str) -> Path {
        // `base` is made of validated segments and `leaf` of digits or a fixed word, so the
        // path needs no escaping.
        Path::from(format!("{}/{leaf}", self.base))
    }

    fn cell_path(&self, cell: CellId) -> Path {
        self.path_of(&cell.0.to_string())
    }

    async fn get_cell(&self, cell: CellId) -> Result<Vec<u8>> {
        let size = self.geometry.cell_size() as usize;
        let context = || format!("reading cell {}", cell.0);
        match self.client.get(&self.cell_path(cell)).await {
            Ok(got) => {
                let bytes = got.bytes().await.map_err(|e| self.map_error(&context(), e))?;
                if bytes.len() != size {
                    return Err(self.wrong_size(cell, bytes.len()));
                }
                Ok(Vec::from(bytes))
            }
            Err(e @ object_store::Error::NotFound { .. }) => match self.missing_bucket(&e) {
                Some(missing) => Err(missing),
                None => Ok(vec![0u8; size]),
            },
            Err(e) => Err(self.map_error(&context(), e)),
        }
    }

    async fn get_range(&self, range: ByteRange) -> Result<Vec<u8>> {
        if range.len == 0 {
            return Ok(Vec::new());
        }
        let start = u64::from(range.offset);
        let end = start + u64::from(range.len);
        let context = || format!("reading {} bytes of cell {}", range.len, range.cell.0);
        match self.client.get_range(&self.cell_path(range.cell), start..end).await {
            Ok(bytes) if bytes.len() == range.len as usize => Ok(Vec::from(bytes)),
            Ok(bytes) => Err(self.backend(
                &context(),
                format!("the server returned {} bytes instead of {}", bytes.len(), range.len),
                false,
            )),
            Err(e @ object_store::Error::NotFound { .. }) => match self.missing_bucket(&e) {
                Some(missing) => Err(missing),
                None => Ok(vec![0u8; range.len as usize]),
            },
            Err(e) => Err(self.map_error(&context(), e)),
        }
    }

    /// Checks a batch, then PUTs the last buffer given for each cell, several at once.
    async fn put_cells<B: AsRef<Vec<u8>>>(
        &self,
        cells: Vec<(CellId, B)>,
        body: impl Fn(B) -> bytes::Bytes,
    ) -> Result<()> {
        for (cell, data) in &cells {
            self.geometry.check_write(*cell, data.as_ref())?;
        }
        // The last buffer for a cell wins: keep only the last occurrence of each cell.
        let mut seen = HashSet::with_capacity(cells.len());
        let mut unique: Vec<(CellId, bytes::Bytes)> = cells
            .into_iter()
            .rev()
            .filter(|(cell, _)| seen.insert(*cell))
            .map(|(cell, data)| (cell, body(data)))
            .collect();
        unique.reverse();
        stream::iter(unique.into_iter().map(Ok))
            .try_for_each_concurrent(self.concurrency, |(cell, data)| self.put_cell(cell, data))
            .await
    }

    async fn put_cell(&self, cell: CellId, data: bytes::Bytes) -> Result<()> {
        self.client
            .put(&self.cell_path(cell), PutPayload::from(data))
            .await
            .map(|_| ())
            .map_err(|e| self.map_error(&format!("writing cell {}", cell.0), e))
    }

    fn wrong_size(&self, cell: CellId, got: usize) -> StoreError {
        self.backend(
            &format!("reading cell {}", cell.0),
            format!(
                "its object holds {got} bytes but cells are {} bytes: it was changed by \
                 something other than blindfold",
                self.geometry.cell_size()
            ),
            false,
        )
    }

    fn backend(&self, context: &str, reason: String, retryable: bool) -> StoreError {
        StoreError::Backend {
            store: self.label.clone(),
            context: context.to_string(),
            source: reason.into(),
            retryable,
        }
    }

    /// A `404` that names the bucket rather than the object means the bucket is gone.
    fn missing_bucket(&self, e: &object_store::Error) -> Option<StoreError> {
        missing_bucket(&self.label, &self.bucket, e)
    }

    /// Maps an `object_store` error (after its own retries) to a [`StoreError`].
    fn map_error(&self, context: &str, e: object_store::Error) -> StoreError {
        map_error(&self.label, &self.endpoint, &self.bucket, context, e)
    }
}

/// A `404` that names the bucket rather than the object means the bucket is gone.
pub(crate) fn missing_bucket(
    label: &str,
    bucket: &str,
    e: &object_store::Error,
) -> Option<StoreError> {
    let text = error_text(e);
    text.contains("NoSuchBucket").then(|| StoreError::Missing {
        store: label.to_string(),
        what: format!("bucket {:?}", bucket),
        reason: format!(
            "{}; create it first (e.g. `aws s3 mb s3://{}`)",
            s3_message(&text).unwrap_or_else(|| "NoSuchBucket".into()),
            bucket
        ),
    })
}

/// Maps an `object_store` error (after its own retries) to a [`StoreError`].
pub(crate) fn map_error(
    label: &str,
    endpoint: &str,
    bucket: &str,
    context: &str,
    e: object_store::Error,
) -> StoreError {
    use object_store::Error as E;
    if let Some(missing) = missing_bucket(label, bucket, &e) {
        return missing;
    }
    let text = error_text(&e);
    match e {
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => StoreError::AccessDenied {
            store: label.to_string(),
            reason: s3_message(&text).unwrap_or(text),
        },
        E::NotFound { .. } => StoreError::Backend {
            store: label.to_string(),
            context: context.into(),
            source: Box::new(e),
            retryable: false,
        },
        e => {
            let (retryable, timeout, connect) = match http_error_kind(&e) {
                Some(HttpErrorKind::Connect) => (true, false, true),
                Some(HttpErrorKind::Timeout) => (true, true, false),
                Some(HttpErrorKind::Request | HttpErrorKind::Interrupted) => (true, false, false),
                _ => (server_may_recover(&text), false, false),
            };
            if connect {
                StoreError::Unreachable {
                    store: label.to_string(),
                    endpoint: endpoint.to_string(),
                    reason: text,
                }
            } else if timeout {
                StoreError::Timeout(format!("{}: {context}: {text}", label))
            } else {
                StoreError::Backend {
                    store: label.to_string(),
                    context: context.into(),
                    source: Box::new(e),
                    retryable,
                }
            }
        }
    }
}

/// The whole chain of an error as one line.
fn error_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let more = s.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = s.source();
    }
    text
}

/// The kind of the transport error behind `e`, if there is one.
fn http_error_kind(e: &(dyn std::error::Error + 'static)) -> Option<HttpErrorKind> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = current {
        if let Some(http) = err.downcast_ref::<HttpError>() {
            return Some(http.kind());
        }
        current = err.source();
    }
    None
}

/// Whether an error answer from the server may go away: 5xx, 429 and S3's `SlowDown`.
fn server_may_recover(text: &str) -> bool {
    if text.contains("SlowDown") || text.contains("InternalError") {
        return true;
    }
    let Some(at) = text.find("status code: ") else { return false };
    let code = &text[at + "status code: ".len()..];
    code.starts_with('5') || code.starts_with("429")
}

/// `Code: Message` out of an S3 XML error body inside `text`, if there is one.
fn s3_message(text: &str) -> Option<String> {
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let end = text[start..].find(&format!("</{name}>"))? + start;
        Some(text[start..end].to_string())
    };
    match (tag("Code"), tag("Message")) {
        (Some(code), Some(message)) => Some(format!("{code}: {message}")),
        (Some(code), None) => Some(code),
        _ => None,
    }
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
    match version {
        Some(MARKER_VERSION) => {}
        Some(v) => {
            return Err(format!(
                "its layout version is {v}; this build reads version {MARKER_VERSION}"
            ))
        }
        None => return Err("its geometry marker has no version".into()),
    }
    let (Some(count), Some(size)) = (count, size) else {
        return Err("its geometry marker lacks cell_count or cell_size".into());
    };
    Geometry::new(count, size).map_err(|e| format!("its geometry marker is impossible: {e}"))
}

/// Parses what follows `s3:` in a store URL: `//bucket[/prefix][?options]`.
pub(crate) fn parse_url(rest: &str) -> std::result::Result<(String, String, S3Options), String> {
    let form = "write it as `s3://bucket/prefix?endpoint=http://host:port&region=…`";
    let rest = rest.strip_prefix("//").ok_or_else(|| format!("no `//` after `s3:`; {form}"))?;
    if rest.contains('#') {
        return Err("a fragment (`#…`) is not allowed".into());
    }
    let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
    check_bucket(bucket)?;
    let prefix = prefix.trim_end_matches('/');
    if !prefix.is_empty() {
        for segment in prefix.split('/') {
            if segment.is_empty() || segment == "." || segment == ".." {
                return Err(format!("prefix {prefix:?} has an empty, `.` or `..` segment; {form}"));
            }
            if !segment.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
                return Err(format!(
                    "prefix {prefix:?}: only ASCII letters, digits, `.`, `_`, `-` and `/` are \
                     allowed"
                ));
            }
        }
    }
    let mut options = S3Options::default();
    let mut seen = HashSet::new();
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        if !seen.insert(key.to_string()) {
            return Err(format!("`{key}` is given more than once"));
        }
        match &*key {
            "endpoint" => {
                let parsed = url::Url::parse(&value)
                    .map_err(|e| format!("endpoint {value:?} is not a URL: {e}"))?;
                if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                    return Err(format!(
                        "endpoint {value:?} must be `http://host[:port]` or `https://host[:port]`"
                    ));
                }
                options.endpoint = Some(value.trim_end_matches('/').to_string());
            }
            "region" => {
                if value.is_empty() {
                    return Err("`region` is empty".into());
                }
                options.region = Some(value.to_string());
            }
            "style" => {
                options.virtual_hosted = match &*value {
                    "path" => false,
                    "virtual" => true,
                    _ => return Err(format!("style={value:?} is not `path` or `virtual`")),
                }
            }
            "concurrency" => {
                options.concurrency =
                    value.parse().ok().filter(|&n: &usize| (1..=1024).contains(&n)).ok_or_else(
                        || format!("concurrency={value:?} is not a number in 1..=1024"),
                    )?
            }
            "timeout" => options.timeout = crate::duration::parse_duration(&value)?,
            "retries" => {
                options.retries = value
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n <= 100)
                    .ok_or_else(|| format!("retries={value:?} is not a number in 0..=100"))?
            }
            other => {
                return Err(format!(
                    "unknown option {other:?}; the options are endpoint, region, \
                     style=path|virtual, concurrency, timeout and retries (credentials come \
                     from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, never from the URL)"
                ))
            }
        }
    }
    Ok((bucket.to_string(), prefix.to_string(), options))
}

/// S3's bucket naming rules, so that a typo fails here rather than as a signature error.
fn check_bucket(bucket: &str) -> std::result::Result<(), String> {
    let ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-.".contains(&b))
        && bucket.as_bytes()[0].is_ascii_alphanumeric()
        && bucket.as_bytes()[bucket.len() - 1].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "bucket name {bucket:?} is not valid: 3 to 63 lowercase letters, digits, `.` or `-`, \
             starting and ending with a letter or digit"
        ))
    }
}

/// Writes the URL that [`parse_url`] reads back as the same bucket, prefix and options.
pub(crate) fn fmt_url(
    f: &mut fmt::Formatter<'_>,
    bucket: &str,
    prefix: &str,
    options: &S3Options,
) -> fmt::Result {
    write!(f, "s3://{bucket}")?;
    if !prefix.is_empty() {
        write!(f, "/{prefix}")?;
    }
    let default = S3Options::default();
    let mut query = url::form_urlencoded::Serializer::new(String::new());
    if let Some(endpoint) = &options.endpoint {
        query.append_pair("endpoint", endpoint);
    }
    if let Some(region) = &options.region {
        query.append_pair("region", region);
    }
    if options.virtual_hosted {
        query.append_pair("style", "virtual");
    }
    if options.concurrency != default.concurrency {
        query.append_pair("concurrency", &options.concurrency.to_string());
    }
    if options.timeout != default.timeout {
        query.append_pair("timeout", &crate::duration::fmt_duration(options.timeout));
    }
    if options.retries != default.retries {
        query.append_pair("retries", &options.retries.to_string());
    }
    let query = query.finish();
    if !query.is_empty() {
        write!(f, "?{query}")?;
    }
    Ok(())
}

/// A cell's buffer shared with its writer, as the body of a PUT.
struct SharedCell(Arc<Vec<u8>>);

impl AsRef<[u8]> for SharedCell {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

#[async_trait]
impl Store for S3Store {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn read(&self, cells: &[CellId]) -> Result<Vec<Vec<u8>>> {
        for &cell in cells {
            self.geometry.check_cell(cell)?;
        }
        let cells = cells.to_vec();
        stream::iter(cells.into_iter().map(|cell| self.get_cell(cell)))
            .buffered(self.concurrency)
            .try_collect()
            .await
    }

    async fn read_ranges(&self, ranges: &[ByteRange]) -> Result<Vec<Vec<u8>>> {
        for range in ranges {
            self.geometry.check_range(range)?;
        }
        let ranges = ranges.to_vec();
        stream::iter(ranges.into_iter().map(|range| self.get_range(range)))
            .buffered(self.concurrency)
            .try_collect()
            .await
    }

    async fn write(&self, cells: Vec<(CellId, Vec<u8>)>) -> Result<()> {
        self.put_cells(cells, bytes::Bytes::from).await
    }

    /// Each object's body is the shared buffer itself (held until its PUT is done).
    async fn write_shared(&self, cells: Vec<(CellId, Arc<Vec<u8>>)>) -> Result<()> {
        self.put_cells(cells, |d| bytes::Bytes::from_owner(SharedCell(d))).await
    }

    /// Nothing to do: S3 acknowledges a PUT only once the object is stored durably.
    async fn flush(&self) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_explicit_endpoint_wins_over_the_environment() {
        // object_store gives AWS_ENDPOINT_URL_S3 precedence over `with_endpoint`; the builder
        // must pin the service-specific key too, whatever the caller's environment holds.
        let options = S3Options {
            endpoint: Some("http://127.0.0.1:9000".into()),
            region: Some("eu-west-1".into()),
            ..S3Options::default()
        };
        let b = aws_builder("bucket", &options);
        for key in [AmazonS3ConfigKey::Endpoint, AmazonS3ConfigKey::S3Endpoint] {
            assert_eq!(b.get_config_value(&key).as_deref(), Some("http://127.0.0.1:9000"));
        }
        assert_eq!(b.get_config_value(&AmazonS3ConfigKey::Region).as_deref(), Some("eu-west-1"));
        assert_eq!(b.get_config_value(&AmazonS3ConfigKey::Bucket).as_deref(), Some("bucket"));
    }

    use super::*;

    #[test]
    fn marker_round_trips() {
        let g = Geometry::new(97, 80).unwrap();
        assert_eq!(parse_marker(&marker_text(g)).unwrap(), g);
        assert!(parse_marker("hello").unwrap_err().contains("does not start"));
        let v2 = marker_text(g).replace("version=1", "version=2");
        assert!(parse_marker(&v2).unwrap_err().contains("version is 2"));
        let bad = marker_text(g).replace("cell_size=80", "cell_size=0");
        assert!(parse_marker(&bad).unwrap_err().contains("impossible"));
    }

    #[test]
    fn server_errors_are_classified() {
        assert!(server_may_recover("Server returned non-2xx status code: 503 Service Unavailable"));
        assert!(server_may_recover("Server returned non-2xx status code: 429 Too Many Requests"));
        assert!(server_may_recover("... <Code>SlowDown</Code> ..."));
        assert!(!server_may_recover("Server returned non-2xx status code: 400 Bad Request"));
        assert_eq!(
            s3_message("x <Error><Code>AccessDenied</Code><Message>No.</Message></Error>").unwrap(),
            "AccessDenied: No."
        );
        assert_eq!(s3_message("plain"), None);
    }
}
