//! The OpenStack Swift front end (`blindfold serve --swift-listen ADDR`): the Swift object API
//! over the same object layer as S3, so the same buckets and objects are reachable through both.
//!
//! What it speaks:
//!
//! - **TempAuth-style v1 auth**: `GET /auth/v1.0` with `X-Auth-User: <account>:<access key>`
//!   and `X-Auth-Key: <secret key>` (the S3 keys: the administrator's or a user's, see
//!   `blindfold user`) answers `X-Auth-Token` and `X-Storage-Url: …/v1/AUTH_<account>`. Tokens
//!   live in memory for [`TOKEN_TTL`]; a restart signs everyone out.
//! - **Account** `/v1/AUTH_<account>`: `GET` lists the containers the key may use (plain or
//!   `?format=json`; `prefix`, `marker`, `end_marker`, `limit`), `HEAD` gives counts and bytes.
//! - **Container** (a bucket): `PUT` creates, `DELETE` removes an empty one (`409` if not),
//!   `HEAD` gives counts, `GET` lists objects (plain or JSON, with `prefix`, `delimiter`,
//!   `marker`, `end_marker`, `limit`), `POST` is accepted on an existing container (metadata is
//!   not kept).
//! - **Object**: `PUT` (an `ETag` header is checked against the body's MD5: `422` and nothing
//!   stored if it differs; `X-Object-Meta-*` and `Content-Type` kept; `X-Copy-From` copies),
//!   `GET` with a single `Range`, `HEAD`, `DELETE`.
//!
//! Not there: large-object manifests (DLO/SLO), object versioning, ACLs, `POST` metadata
//! updates of objects, bulk operations. Every request is checked against the same per-user
//! policy as S3 (buckets, read-only). The store sees the same ORAM traffic as for S3.
//!
//! Container names follow the S3 bucket rules (3–63 lower-case letters, digits, `-` and `.`),
//! so that every container is a bucket too.

use std::collections::{BTreeMap, HashMap};
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use parking_lot::Mutex;
use serde::Serialize;

use crate::directory::ObjectMeta;
use crate::objects::ObjectLayer;
use crate::users::Access;
use crate::GatewayError;

/// How long a token stays valid.
pub const TOKEN_TTL: Duration = Duration::from_secs(24 * 3600);
/// Most entries one listing returns (Swift's default and maximum).
const LIST_LIMIT: usize = 10_000;
/// Most tokens held at once; when all are in use (after dropping the expired), a sign-in is
/// refused with 503 until one expires: nobody's session is ended to make room.
pub const MAX_TOKENS: usize = 100_000;
/// Most tokens one key holder has at once; a further sign-in ends that holder's oldest session
/// (never another holder's).
pub const MAX_TOKENS_PER_USER: usize = 256;

type Body = BoxBody<Bytes, std::io::Error>;

struct Token {
    access_key: String,
    account: String,
    expires: Instant,
    /// What the holder was entitled to at sign-in: a later rotation, removal or policy change
    /// ends the session (see [`Access::sign_in`]).
    grant: crate::users::Grant,
}

/// The live tokens, and each holder's tokens oldest first (so a holder's oldest goes in O(1)
/// and the lock is never held for a scan, but for a sweep of the expired at most once a second).
#[derive(Default)]
struct Tokens {
    by_token: HashMap<String, Token>,
    /// Per access key, tokens in the order issued (some may have gone from `by_token`).
    by_holder: HashMap<String, std::collections::VecDeque<String>>,
    swept: Option<Instant>,
}

impl Tokens {
    /// Adds a token; `Err` if the table is full of live tokens of other holders.
    fn insert(&mut self, token: String, t: Token, now: Instant) -> Result<(), ()> {
        // The expired go once a minute, or once a second while the table is full (never a
        // scan per sign-in).
        let every = if self.by_token.len() >= MAX_TOKENS { 1 } else { 60 };
        if self.swept.is_none_or(|s| now.duration_since(s) >= Duration::from_secs(every)) {
            self.swept = Some(now);
            self.by_token.retain(|_, t| t.expires > now);
            let live = &self.by_token;
            self.by_holder.retain(|_, q| {
                q.retain(|k| live.contains_key(k));
                !q.is_empty()
            });
        }
        let queue = self.by_holder.entry(t.access_key.clone()).or_default();
        while queue.len() >= MAX_TOKENS_PER_USER {
            if let Some(oldest) = queue.pop_front() {
                self.by_token.remove(&oldest);
            }
        }
        if self.by_token.len() >= MAX_TOKENS {
            if queue.is_empty() {
                self.by_holder.remove(&t.access_key);
            }
            return Err(());
        }
        queue.push_back(token.clone());
        self.by_token.insert(token, t);
        Ok(())
    }
}

/// The Swift front end of one gateway.
pub struct Swift {
    objects: Arc<ObjectLayer>,
    access: Arc<Access>,
    tokens: Mutex<Tokens>,
    /// `https` when served over TLS (for the storage URL).
    scheme: &'static str,
}

impl std::fmt::Debug for Swift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Swift").finish_non_exhaustive()
    }
}

fn full(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()).map_err(|e| match e {}).boxed());
    *r.status_mut() = status;
    r
}

fn empty(status: StatusCode) -> Response<Body> {
    full(status, Bytes::new())
}

fn text(status: StatusCode, msg: &str) -> Response<Body> {
    let mut r = full(status, format!("<html><h1>{status}</h1><p>{msg}</p></html>"));
    r.headers_mut().insert("content-type", HeaderValue::from_static("text/html; charset=UTF-8"));
    r
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

fn set(r: &mut Response<Body>, name: &'static str, value: impl ToString) {
    if let Ok(v) = HeaderValue::from_str(&value.to_string()) {
        r.headers_mut().insert(name, v);
    }
}

/// HTTP date (`Tue, 15 Nov 1994 08:12:31 GMT`).
fn http_date(t: std::time::SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
    const MONTHS: [&str; 12] =
        ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    format!(
        "{}, {:02} {} {} {:02}:{:02}:{:02} GMT",
        DAYS[t.weekday().number_days_from_monday() as usize],
        t.day(),
        MONTHS[t.month() as usize - 1],
        t.year(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Swift's listing time format (`2024-05-01T12:00:00.000000`, UTC).
fn list_date(t: std::time::SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}",
        t.year(),
        t.month() as u8,
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

/// Whether `name` is a valid container (S3 bucket) name.
fn valid_container(name: &str) -> bool {
    let b = name.as_bytes();
    (3..=63).contains(&b.len())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && !name.contains("..")
}

/// A single byte range of an object of `size` bytes: `Ok(None)` without a usable header (none,
/// not in bytes, several ranges, or malformed: HTTP says to ignore those and answer the whole
/// object), `Err` for a well-formed range that cannot be satisfied.
fn parse_range(value: Option<&str>, size: u64) -> Result<Option<std::ops::Range<u64>>, ()> {
    let Some(spec) = value.and_then(|v| v.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    let Some((a, b)) = spec.split_once('-').filter(|_| !spec.contains(',')) else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let num = |s: &str| s.parse::<u64>().ok();
    Ok(Some(match (a.is_empty(), num(a), num(b)) {
        // A suffix: the last `n` bytes.
        (true, _, Some(0)) => return Err(()),
        (true, _, Some(n)) if size > 0 => size.saturating_sub(n)..size,
        (true, _, Some(_)) => return Err(()),
        (false, Some(start), None) if b.is_empty() => {
            if start >= size {
                return Err(());
            }
            start..size
        }
        (false, Some(start), Some(last)) if last >= start => {
            if start >= size {
                return Err(());
            }
            start..last.saturating_add(1).min(size)
        }
        _ => return Ok(None),
    }))
}

#[derive(Serialize)]
struct ContainerEntry {
    name: String,
    count: u64,
    bytes: u64,
    last_modified: String,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ObjectEntry {
    Object { name: String, hash: String, bytes: u64, content_type: String, last_modified: String },
    Subdir { subdir: String },
}

/// What a plain-text listing shows of an entry.
trait Named {
    fn name(&self) -> &str;
}

impl Named for ContainerEntry {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Named for ObjectEntry {
    fn name(&self) -> &str {
        match self {
            Self::Object { name, .. } => name,
            Self::Subdir { subdir } => subdir,
        }
    }
}

struct Listing {
    prefix: String,
    delimiter: Option<String>,
    marker: String,
    end_marker: Option<String>,
    limit: usize,
    json: bool,
}

impl Listing {
    fn from_query(
        query: Option<&str>,
        accept: Option<&str>,
    ) -> Result<Self, (StatusCode, &'static str)> {
        let pairs: Vec<(String, String)> = serde_urlencoded::from_str(query.unwrap_or(""))
            .map_err(|_| (StatusCode::BAD_REQUEST, "The query string does not decode"))?;
        let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let limit = match get("limit") {
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|&l| l <= LIST_LIMIT)
                .ok_or((StatusCode::PRECONDITION_FAILED, "limit must be 0 to 10000"))?,
            None => LIST_LIMIT,
        };
        let json = match get("format").as_deref() {
            Some("json") => true,
            Some("plain") | None => accept.is_some_and(|a| a.contains("application/json")),
            Some(_) => return Err((StatusCode::BAD_REQUEST, "format must be json or plain")),
        };
        Ok(Self {
            prefix: get("prefix").unwrap_or_default(),
            delimiter: get("delimiter").filter(|d| !d.is_empty()),
            marker: get("marker").unwrap_or_default(),
            end_marker: get("end_marker").filter(|e| !e.is_empty()),
            limit,
            json,
        })
    }

    fn answer<T: Serialize + Named>(&self, entries: &[T]) -> Response<Body> {
        if self.json {
            let mut r = full(StatusCode::OK, serde_json::to_vec(entries).expect("json"));
            set(&mut r, "content-type", "application/json; charset=utf-8");
            return r;
        }
        if entries.is_empty() {
            return empty(StatusCode::NO_CONTENT);
        }
        let mut body = String::new();
        for e in entries {
            body.push_str(e.name());
            body.push('\n');
        }
        let mut r = full(StatusCode::OK, body);
        set(&mut r, "content-type", "text/plain; charset=utf-8");
        r
    }
}

/// What a request addresses.
enum Target {
    Account,
    Container(String),
    Object(String, String),
}

impl Swift {
    /// The Swift front end over `objects`, checking keys and policies with `access`; `tls`
    /// when it is served over HTTPS.
    pub fn new(objects: Arc<ObjectLayer>, access: Arc<Access>, tls: bool) -> Self {
        let scheme = if tls { "https" } else { "http" };
        Self { objects, access, tokens: Mutex::new(Tokens::default()), scheme }
    }

    /// Answers one request.
    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        if path == "/auth/v1.0" || path == "/auth/v1" {
            return self.auth(&req);
        }
        if path == "/info" {
            return full(StatusCode::OK, r#"{"swift":{"version":"blindfold"}}"#);
        }
        let Some(rest) = path.strip_prefix("/v1/") else {
            return text(StatusCode::NOT_FOUND, "Not Found");
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s).decode_utf8().map(|c| c.into_owned()).ok()
        };
        let mut parts = rest.splitn(3, '/');
        let account = parts.next().unwrap_or("");
        let container = parts.next().filter(|c| !c.is_empty()).map(decode);
        let object = parts.next().filter(|o| !o.is_empty()).map(decode);
        let Some(account) = account.strip_prefix("AUTH_").and_then(decode) else {
            return text(StatusCode::NOT_FOUND, "Not Found");
        };
        let Some(access_key) = self.token_holder(req.headers(), &account) else {
            return text(StatusCode::UNAUTHORIZED, "This server could not verify that you are authorized to access the document you requested.");
        };
        let target = match (container, object) {
            (None, None) => Target::Account,
            (Some(Some(c)), None) => Target::Container(c),
            (Some(Some(c)), Some(Some(o))) if o.len() <= 1024 => Target::Object(c, o),
            _ => return text(StatusCode::BAD_REQUEST, "The path does not decode"),
        };
        let reads = matches!(*req.method(), Method::GET | Method::HEAD);
        if let Target::Container(c) | Target::Object(c, _) = &target {
            if !self.access.permits(&access_key, c, reads) {
                return text(StatusCode::FORBIDDEN, "Access was denied to this resource.");
            }
            let key = match &target {
                Target::Object(_, o) => Some(o.as_str()),
                _ => None,
            };
            if let Some(refusal) = self.denied(&access_key, req.method(), c, key) {
                return refusal;
            }
        }
        let result = match target {
            Target::Account => self.account(req, &access_key).await,
            Target::Container(c) => self.container(req, &c).await,
            Target::Object(c, o) => self.object(req, &access_key, &c, &o).await,
        };
        result.unwrap_or_else(|e| error_response(&e))
    }

    /// A bucket policy's `Deny` binds Swift requests too (its `Allow` statements and canned
    /// ACLs widen S3 access only): the S3 action a Swift request amounts to, checked against
    /// the container's policy. `Some` is the refusal to send.
    fn denied(
        &self,
        access_key: &str,
        method: &Method,
        container: &str,
        object: Option<&str>,
    ) -> Option<Response<Body>> {
        let policy = match crate::sharing::policy_of(self.objects.directory(), container) {
            Ok(p) => p?,
            Err(e) => return Some(error_response(&e)),
        };
        let action = match (object.is_some(), method.as_str()) {
            (true, "GET" | "HEAD") => "s3:GetObject",
            (true, "PUT" | "POST" | "COPY") => "s3:PutObject",
            (true, "DELETE") => "s3:DeleteObject",
            (false, "GET" | "HEAD") => "s3:ListBucket",
            (false, "PUT" | "POST") => "s3:CreateBucket",
            (false, "DELETE") => "s3:DeleteBucket",
            _ => "s3:*",
        };
        let resource = match object {
            Some(o) => format!("{container}/{o}"),
            None => container.to_owned(),
        };
        let caller = self.access.caller(Some(access_key));
        let who = crate::sharing::Who::of(&caller);
        (policy.decide(&who, action, &resource) == crate::sharing::Decision::Deny).then(|| {
            text(StatusCode::FORBIDDEN, &format!("The bucket policy denies {action} here."))
        })
    }

    fn auth(&self, req: &Request<Incoming>) -> Response<Body> {
        let h = req.headers();
        let user = header(h, "x-auth-user").or_else(|| header(h, "x-storage-user"));
        let key = header(h, "x-auth-key").or_else(|| header(h, "x-storage-pass"));
        let (Some(user), Some(key)) = (user, key) else {
            return text(StatusCode::UNAUTHORIZED, "X-Auth-User and X-Auth-Key are required");
        };
        let Some((account, access_key)) = user.split_once(':') else {
            return text(StatusCode::UNAUTHORIZED, "X-Auth-User is <account>:<access key>");
        };
        let account_ok = !account.is_empty()
            && account.len() <= 64
            && account.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        let grant = if account_ok { self.access.sign_in(access_key, key) } else { None };
        let Some(grant) = grant else {
            static REFUSED: crate::listen::LogThrottle =
                crate::listen::LogThrottle::new(Duration::from_secs(10));
            if let Some(held_back) = REFUSED.allow() {
                tracing::info!(held_back, "swift: sign-in refused");
            }
            return text(StatusCode::UNAUTHORIZED, "Unauthorized");
        };
        let token = format!("AUTH_tk{}", crate::datadir::random_token(32, b"0123456789abcdef"));
        let now = Instant::now();
        let t = Token {
            access_key: access_key.to_owned(),
            account: account.to_owned(),
            expires: now + TOKEN_TTL,
            grant,
        };
        if self.tokens.lock().insert(token.clone(), t, now).is_err() {
            static FULL: crate::listen::LogThrottle =
                crate::listen::LogThrottle::new(Duration::from_secs(10));
            if let Some(held_back) = FULL.allow() {
                tracing::warn!(
                    max = MAX_TOKENS,
                    held_back,
                    "swift: sign-in refused: every token place holds a live session (tokens \
                     last {} h; signing in again ends a user's own oldest)",
                    TOKEN_TTL.as_secs() / 3600
                );
            }
            let mut r = text(
                StatusCode::SERVICE_UNAVAILABLE,
                "Too many sessions are open; try again later.",
            );
            set(&mut r, "retry-after", 60);
            return r;
        }
        let host = header(h, "host").unwrap_or("localhost");
        let scheme = self.scheme;
        let mut r = empty(StatusCode::OK);
        set(&mut r, "x-storage-url", format!("{scheme}://{host}/v1/AUTH_{account}"));
        set(&mut r, "x-auth-token", &token);
        set(&mut r, "x-storage-token", &token);
        set(&mut r, "x-auth-token-expires", TOKEN_TTL.as_secs());
        r
    }
}

fn error_response(e: &GatewayError) -> Response<Body> {
    use GatewayError as G;
    let (status, msg) = match e {
        G::NoSuchBucket | G::NoSuchKey => (StatusCode::NOT_FOUND, "Not Found".to_owned()),
        G::BucketNotEmpty => (StatusCode::CONFLICT, "There was a conflict when trying to complete your request: the container is not empty.".to_owned()),
        G::BadDigest => (StatusCode::UNPROCESSABLE_ENTITY, e.to_string()),
        G::InvalidRange => (StatusCode::RANGE_NOT_SATISFIABLE, e.to_string()),
        G::Full { .. } | G::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, e.to_string()),
        G::NoRoom(m) => (StatusCode::INSUFFICIENT_STORAGE, m.clone()),
        G::Body(_) => (StatusCode::BAD_REQUEST, e.to_string()),
        G::PreconditionFailed => (StatusCode::PRECONDITION_FAILED, e.to_string()),
        other => {
            if other.is_integrity() {
                tracing::error!("swift: integrity violation detected in the untrusted store");
            } else {
                tracing::error!(error = %other, "swift: internal error");
            }
            (StatusCode::INTERNAL_SERVER_ERROR, other.to_string())
        }
    };
    text(status, &msg)
}

/// The request body as a stream of byte chunks.
fn body_stream(body: Incoming) -> Pin<Box<dyn Stream<Item = Result<Bytes, hyper::Error>> + Send>> {
    Box::pin(http_body_util::BodyStream::new(body).filter_map(|frame| async move {
        match frame {
            Ok(f) => f.into_data().ok().map(Ok),
            Err(e) => Some(Err(e)),
        }
    }))
}

/// User metadata from `X-Object-Meta-*` headers (names lower-cased, as S3 keeps them).
fn object_metadata(h: &HeaderMap) -> Result<BTreeMap<String, String>, GatewayError> {
    let mut out = BTreeMap::new();
    for (name, value) in h {
        if let Some(key) = name.as_str().strip_prefix("x-object-meta-") {
            let value = value
                .to_str()
                .map_err(|_| GatewayError::Body(format!("metadata {key} is not visible ASCII")))?;
            out.insert(key.to_owned(), value.to_owned());
        }
    }
    Ok(out)
}

fn object_headers(r: &mut Response<Body>, meta: &ObjectMeta) {
    set(r, "etag", &meta.etag);
    set(r, "last-modified", http_date(meta.modified()));
    set(r, "x-timestamp", format!("{:.5}", meta.modified_ns as f64 / 1e9));
    set(r, "accept-ranges", "bytes");
    set(r, "content-type", meta.content_type.as_deref().unwrap_or("application/octet-stream"));
    for (k, v) in &meta.metadata {
        if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(format!("x-object-meta-{k}").as_bytes()),
            HeaderValue::from_str(v),
        ) {
            r.headers_mut().insert(name, value);
        }
    }
}

type Answer = Result<Response<Body>, GatewayError>;

impl Swift {
    /// The access key a valid token for `account` was issued to.
    /// A token whose holder's secret, existence or policy changed since sign-in is refused
    /// (and dropped), as soon as the S3 side refuses the old secret.
    fn token_holder(&self, h: &HeaderMap, account: &str) -> Option<String> {
        let token = header(h, "x-auth-token").or_else(|| header(h, "x-storage-token"))?;
        let (holder, grant) = {
            let tokens = self.tokens.lock();
            let t = tokens.by_token.get(token)?;
            if t.expires <= Instant::now() || t.account != account {
                return None;
            }
            (t.access_key.clone(), t.grant)
        };
        // Outside the token lock: this may re-read the users file.
        if self.access.grant(&holder).is_some_and(|now| now.same(&grant)) {
            return Some(holder);
        }
        tracing::info!(
            "swift: a token issued before its holder's keys or policy changed was refused"
        );
        self.tokens.lock().by_token.remove(token);
        None
    }

    /// Why an object of `container` is not there: no such container, or no such object.
    fn missing(&self, container: &str) -> GatewayError {
        match self.objects.directory().require_bucket(container) {
            Err(e) => e,
            Ok(()) => GatewayError::NoSuchKey,
        }
    }

    /// Objects and bytes in `container`.
    fn usage(&self, container: &str) -> Result<(u64, u64), GatewayError> {
        let dir = self.objects.directory();
        let (mut count, mut bytes, mut after) = (0u64, 0u64, String::new());
        loop {
            let batch = dir.list(container, "", &after, 1000)?;
            let Some((last, _)) = batch.last() else { break };
            after = last.clone();
            count += batch.len() as u64;
            bytes += batch.iter().map(|(_, m)| m.size).sum::<u64>();
        }
        Ok((count, bytes))
    }

    async fn account(&self, req: Request<Incoming>, access_key: &str) -> Answer {
        let visible: Vec<_> = self
            .objects
            .directory()
            .buckets()?
            .into_iter()
            .filter(|(name, _)| self.access.permits(access_key, name, true))
            .collect();
        match *req.method() {
            Method::HEAD => {
                let (mut objects, mut bytes) = (0, 0);
                for (name, _) in &visible {
                    let (c, b) = self.usage(name)?;
                    objects += c;
                    bytes += b;
                }
                let mut r = empty(StatusCode::NO_CONTENT);
                set(&mut r, "x-account-container-count", visible.len());
                set(&mut r, "x-account-object-count", objects);
                set(&mut r, "x-account-bytes-used", bytes);
                Ok(r)
            }
            Method::GET => {
                let l =
                    match Listing::from_query(req.uri().query(), header(req.headers(), "accept")) {
                        Ok(l) => l,
                        Err((status, why)) => return Ok(text(status, why)),
                    };
                let mut entries = Vec::new();
                for (name, meta) in visible {
                    if !name.starts_with(&l.prefix)
                        || name <= l.marker
                        || l.end_marker.as_ref().is_some_and(|e| &name >= e)
                    {
                        continue;
                    }
                    if entries.len() >= l.limit {
                        break;
                    }
                    let (count, bytes) = if l.json { self.usage(&name)? } else { (0, 0) };
                    let created = std::time::UNIX_EPOCH
                        + Duration::from_nanos(meta.created_ns.clamp(0, u64::MAX as i128) as u64);
                    entries.push(ContainerEntry {
                        last_modified: list_date(created),
                        name,
                        count,
                        bytes,
                    });
                }
                Ok(l.answer(&entries))
            }
            _ => Ok(text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")),
        }
    }

    async fn container(&self, req: Request<Incoming>, name: &str) -> Answer {
        let dir = self.objects.directory();
        match *req.method() {
            Method::PUT => {
                if !valid_container(name) {
                    return Ok(text(
                        StatusCode::BAD_REQUEST,
                        "Container names are 3-63 lower-case letters, digits, '-' and '.' (the S3 bucket rules)",
                    ));
                }
                let created = dir.create_bucket(name)?;
                dir.settle().await?;
                Ok(empty(if created { StatusCode::CREATED } else { StatusCode::ACCEPTED }))
            }
            Method::POST => {
                dir.require_bucket(name)?;
                Ok(empty(StatusCode::NO_CONTENT))
            }
            Method::DELETE => {
                dir.delete_bucket(name)?;
                dir.settle().await?;
                Ok(empty(StatusCode::NO_CONTENT))
            }
            Method::HEAD => {
                dir.require_bucket(name)?;
                let (count, bytes) = self.usage(name)?;
                let mut r = empty(StatusCode::NO_CONTENT);
                set(&mut r, "x-container-object-count", count);
                set(&mut r, "x-container-bytes-used", bytes);
                Ok(r)
            }
            Method::GET => {
                dir.require_bucket(name)?;
                let l =
                    match Listing::from_query(req.uri().query(), header(req.headers(), "accept")) {
                        Ok(l) => l,
                        Err((status, why)) => return Ok(text(status, why)),
                    };
                Ok(l.answer(&self.list_objects(name, &l)?))
            }
            _ => Ok(text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")),
        }
    }

    fn list_objects(&self, container: &str, l: &Listing) -> Result<Vec<ObjectEntry>, GatewayError> {
        let dir = self.objects.directory();
        let mut entries = Vec::new();
        let mut after = l.marker.clone();
        'pages: while entries.len() < l.limit {
            let batch = dir.list(container, &l.prefix, &after, 1000)?;
            if batch.is_empty() {
                break;
            }
            for (key, meta) in batch {
                after.clone_from(&key);
                if l.end_marker.as_ref().is_some_and(|e| &key >= e) {
                    break 'pages;
                }
                let rest = &key[l.prefix.len()..];
                if let Some(d) = &l.delimiter {
                    if let Some(i) = rest.find(d.as_str()) {
                        let subdir = format!("{}{}", l.prefix, &rest[..i + d.len()]);
                        // Every key under it sorts right after it: skip them all (so it comes
                        // once). One equal to the marker was the last entry of the previous page.
                        after = format!("{subdir}{}", char::MAX);
                        if subdir != l.marker {
                            entries.push(ObjectEntry::Subdir { subdir });
                        }
                        continue 'pages;
                    }
                }
                entries.push(ObjectEntry::Object {
                    hash: meta.etag.clone(),
                    bytes: meta.size,
                    content_type: meta
                        .content_type
                        .clone()
                        .unwrap_or_else(|| "application/octet-stream".into()),
                    last_modified: list_date(meta.modified()),
                    name: key,
                });
                if entries.len() >= l.limit {
                    break 'pages;
                }
            }
        }
        Ok(entries)
    }

    async fn object(
        &self,
        req: Request<Incoming>,
        access_key: &str,
        container: &str,
        key: &str,
    ) -> Answer {
        match *req.method() {
            Method::PUT => self.put(req, access_key, container, key).await,
            Method::GET | Method::HEAD => self.get(req, container, key).await,
            Method::DELETE => {
                if self.objects.directory().object(container, key)?.is_none() {
                    return Err(self.missing(container));
                }
                self.objects.delete_object(container, key).await?;
                Ok(empty(StatusCode::NO_CONTENT))
            }
            _ => Ok(text(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed")),
        }
    }

    async fn put(
        &self,
        req: Request<Incoming>,
        access_key: &str,
        container: &str,
        key: &str,
    ) -> Answer {
        let h = req.headers().clone();
        let content_type = header(&h, "content-type").map(str::to_owned);
        let metadata = object_metadata(&h)?;
        if let Some(from) = header(&h, "x-copy-from") {
            let from = percent_encoding::percent_decode_str(from.trim_start_matches('/'))
                .decode_utf8()
                .map_err(|_| GatewayError::Body("X-Copy-From does not decode".into()))?
                .into_owned();
            let Some((src_c, src_o)) = from.split_once('/') else {
                return Ok(text(
                    StatusCode::PRECONDITION_FAILED,
                    "X-Copy-From is <container>/<object>",
                ));
            };
            if !self.access.permits(access_key, src_c, true) {
                return Ok(text(StatusCode::FORBIDDEN, "Access was denied to the copy source."));
            }
            if let Some(refusal) = self.denied(access_key, &Method::GET, src_c, Some(src_o)) {
                return Ok(refusal);
            }
            let Some((src, _pin)) = self.objects.lookup_for_read(src_c, src_o)? else {
                return Err(self.missing(src_c));
            };
            if src.metadata.contains_key(crate::directory::SSE_C_KEY) {
                return Ok(sse_c_refused());
            }
            let meta = self.objects.copy_object(&src, container, key, None).await?;
            let mut r = empty(StatusCode::CREATED);
            set(&mut r, "etag", &meta.etag);
            return Ok(r);
        }
        let expected = match header(&h, "etag") {
            Some(e) => {
                let e = e.trim_matches('"');
                let raw = hex::decode(e).ok().and_then(|b| <[u8; 16]>::try_from(b).ok());
                match raw {
                    Some(md5) => Some(md5),
                    None => {
                        return Ok(text(StatusCode::UNPROCESSABLE_ENTITY, "ETag is not an MD5"))
                    }
                }
            }
            None => None,
        };
        let body = body_stream(req.into_body());
        let meta = self
            .objects
            .put_object_expecting(container, key, body, content_type, metadata, false, expected)
            .await?;
        let mut r = empty(StatusCode::CREATED);
        set(&mut r, "etag", &meta.etag);
        set(&mut r, "last-modified", http_date(meta.modified()));
        Ok(r)
    }

    async fn get(&self, req: Request<Incoming>, container: &str, key: &str) -> Answer {
        let Some((meta, _pin)) = self.objects.lookup_for_read(container, key)? else {
            return Err(self.missing(container));
        };
        if meta.metadata.contains_key(crate::directory::SSE_C_KEY) {
            return Ok(sse_c_refused());
        }
        let range = match parse_range(header(req.headers(), "range"), meta.size) {
            Ok(r) => r,
            Err(()) => {
                let mut r =
                    text(StatusCode::RANGE_NOT_SATISFIABLE, "Requested range not satisfiable");
                set(&mut r, "content-range", format!("bytes */{}", meta.size));
                return Ok(r);
            }
        };
        let head = *req.method() == Method::HEAD;
        let (status, span) = match &range {
            Some(r) => (StatusCode::PARTIAL_CONTENT, r.clone()),
            None => (StatusCode::OK, 0..meta.size),
        };
        let mut r = if head {
            empty(status)
        } else {
            let rx = self.objects.read_range(&meta, span.clone(), 64 << 10).await?;
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                let item = rx.recv().await?;
                let frame = item.map(Frame::data).map_err(|e| std::io::Error::other(e.to_string()));
                Some((frame, rx))
            });
            let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
            *r.status_mut() = status;
            r
        };
        object_headers(&mut r, &meta);
        set(&mut r, "content-length", span.end - span.start);
        if range.is_some() {
            set(
                &mut r,
                "content-range",
                format!("bytes {}-{}/{}", span.start, span.end - 1, meta.size),
            );
        }
        Ok(r)
    }
}

/// Serves the Swift API on `listener` (over `tls` if given, within `limits`) until `stop` turns
/// true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    swift: Arc<Swift>,
    tls: Option<crate::tls::Tls>,
    limits: crate::listen::Limits,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let make_svc = || {
        let swift = Arc::clone(&swift);
        hyper::service::service_fn(move |req| {
            let swift = Arc::clone(&swift);
            async move { Ok::<_, std::convert::Infallible>(swift.handle(req).await) }
        })
    };
    let stopped = async move {
        let _ = stop.wait_for(|&s| s).await;
    };
    crate::listen::accept_until(&listener, tls.as_ref(), &limits, "swift", make_svc, stopped).await;
}

/// The answer to a read of an object written over S3 with an SSE-C key, which Swift cannot
/// carry.
fn sse_c_refused() -> Response<Body> {
    text(
        StatusCode::FORBIDDEN,
        "This object was written over S3 with a customer-provided key (SSE-C); read it over S3 \
         with that key",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_parsed_as_http_says() {
        assert_eq!(parse_range(None, 10), Ok(None));
        assert_eq!(parse_range(Some("bytes=0-3"), 10), Ok(Some(0..4)));
        assert_eq!(parse_range(Some("bytes=5-"), 10), Ok(Some(5..10)));
        assert_eq!(parse_range(Some("bytes=-3"), 10), Ok(Some(7..10)));
        assert_eq!(parse_range(Some("bytes=-30"), 10), Ok(Some(0..10)));
        assert_eq!(parse_range(Some("bytes=8-100"), 10), Ok(Some(8..10)));
        // Well-formed but outside the object: 416.
        assert_eq!(parse_range(Some("bytes=10-"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=12-20"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=-0"), 10), Err(()));
        assert_eq!(parse_range(Some("bytes=-5"), 0), Err(()));
        // Malformed, several ranges, other units: ignored (the whole object).
        for ignored in ["bytes=4-2", "bytes=x-2", "bytes=0-1,4-5", "items=0-1", "bytes=", "bytes=-"]
        {
            assert_eq!(parse_range(Some(ignored), 10), Ok(None), "{ignored}");
        }
    }

    #[test]
    fn container_names_follow_the_bucket_rules() {
        for ok in ["abc", "my-container", "a.b.c", "0123456789"] {
            assert!(valid_container(ok), "{ok}");
        }
        for bad in ["ab", "Upper", "a..b", "-abc", "abc-", "with space", "a/b", &"x".repeat(64)] {
            assert!(!valid_container(bad), "{bad}");
        }
    }

    #[test]
    fn dates_are_formatted_for_http_and_listings() {
        let t = std::time::UNIX_EPOCH + Duration::from_secs(784_887_151);
        assert_eq!(http_date(t), "Tue, 15 Nov 1994 08:12:31 GMT");
        assert_eq!(list_date(t), "1994-11-15T08:12:31.000000");
    }
}
