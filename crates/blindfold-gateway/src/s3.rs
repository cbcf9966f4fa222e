//! The S3 API (via the `s3s` crate) over the object layer.
//!
//! This is the only place where [`GatewayError`]s become S3 error codes. Nothing here logs
//! bucket names, keys or sizes at info level: they are secrets the gateway exists to protect.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};

use crate::directory::{version_id, ObjectMeta, Part, Version, Versioning, TAGGING_KEY};
use crate::objects::{ObjectLayer, ReadPin};
use crate::GatewayError;

mod acl;
mod authorize;
mod cors_api;
mod lifecycle_api;
pub use authorize::Authorizer;
mod object_lock;
mod policy_api;
mod sse;
use object_lock::LockHeaders;

/// Bytes read before a GET answers, so that small objects fail with a proper error.
const PREFETCH: usize = 1 << 20;
const MAX_KEYS: usize = 1000;
/// Parts in one ListParts answer, as in S3.
const MAX_PARTS: usize = 1000;
/// The smallest part of a multipart upload other than the last, as in S3.
const MIN_PART_SIZE: u64 = 5 << 20;

/// The canned ACL of a request that writes an object (PutObject, CopyObject,
/// CreateMultipartUpload: inputs with the same ACL fields); refuses what [`acl`] cannot honour.
/// With `grant_write`: of a request that also has that field (CreateBucket, PutBucketAcl,
/// PutObjectAcl).
macro_rules! object_acl {
    ($input:ident $(, $extra:ident)?) => {
        acl::check(
            $input.acl.as_ref().map(|a| a.as_str()),
            &[
                $input.grant_full_control.as_ref(),
                $input.grant_read.as_ref(),
                $input.grant_read_acp.as_ref(),
                $input.grant_write_acp.as_ref(),
                $($input.$extra.as_ref(),)?
            ],
        )?
    };
}

/// The SSE-C key an input carries (`customer_key!(input)`), or the key of its copy source
/// (`customer_key!(input, copy_source)`), checked by [`sse::CustomerKey::of`].
macro_rules! customer_key {
    ($input:ident) => {
        sse::CustomerKey::of(
            $input.sse_customer_algorithm.as_deref(),
            $input.sse_customer_key.as_deref(),
            $input.sse_customer_key_md5.as_deref(),
        )?
    };
    ($input:ident, copy_source) => {
        sse::CustomerKey::of(
            $input.copy_source_sse_customer_algorithm.as_deref(),
            $input.copy_source_sse_customer_key.as_deref(),
            $input.copy_source_sse_customer_key_md5.as_deref(),
        )?
    };
}

/// Checks the server-side encryption a write asks for (PutObject, CreateMultipartUpload,
/// CopyObject: inputs with the same fields) and records it in the new object's map
/// ([`sse`]); the [`sse::Written`] says what to answer.
macro_rules! object_sse {
    ($input:ident, $map:ident) => {
        sse::Written::apply(
            &mut $map,
            $input.server_side_encryption.as_ref(),
            $input.ssekms_key_id.as_deref(),
            customer_key!($input),
        )?
    };
}

/// The metadata map of a new object from a request that carries it (PutObject,
/// CreateMultipartUpload: inputs with the same fields): client metadata, standard headers,
/// tags and object lock. Moves the fields it reads.
macro_rules! new_object_map {
    ($self:ident, $input:ident) => {{
        let lock = $self.new_version_lock(
            &$input.bucket,
            $input.object_lock_mode.as_ref(),
            $input.object_lock_retain_until_date.as_ref(),
            $input.object_lock_legal_hold_status.as_ref(),
        )?;
        let mut map = with_tagging(
            metadata_map(
                $input.metadata,
                StandardHeaders::new(
                    $input.cache_control,
                    $input.content_disposition,
                    $input.content_encoding,
                    $input.content_language,
                    $input.expires,
                ),
            ),
            $input.tagging.as_deref(),
        )?;
        crate::lock::apply(&mut map, lock);
        map
    }};
}

/// The S3 service.
#[derive(Debug, Clone)]
pub struct Gateway {
    objects: Arc<ObjectLayer>,
    access: Option<Arc<crate::users::Access>>,
    lifecycle: crate::lifecycle::Schedule,
}

impl Gateway {
    /// Serves `objects`.
    pub fn new(objects: Arc<ObjectLayer>) -> Self {
        Self { objects, access: None, lifecycle: Default::default() }
    }

    /// Counts lifecycle days as `schedule` does (for the `x-amz-expiration` header; the
    /// worker that applies the rules runs on the same schedule).
    pub fn with_lifecycle(mut self, schedule: crate::lifecycle::Schedule) -> Self {
        self.lifecycle = schedule;
        self
    }

    /// Lists to each user only the buckets its policy covers.
    pub fn with_access(mut self, access: Arc<crate::users::Access>) -> Self {
        self.access = Some(access);
        self
    }
}

impl Gateway {
    /// A named bucket setting ([`crate::directory`]'s bucket settings), read as its type;
    /// `None` if not set.
    fn setting<T: for<'a> serde::Deserialize<'a>>(
        &self,
        bucket: &str,
        name: &str,
    ) -> S3Result<Option<T>> {
        let doc = self.objects.directory().bucket_setting(bucket, name).map_err(s3)?;
        crate::directory::parse_setting(doc, name).map_err(s3)
    }

    /// Sets (`Some`) or removes a named bucket setting, durably, in a transaction of its own.
    async fn set_setting<T: serde::Serialize + ?Sized>(
        &self,
        bucket: &str,
        name: &str,
        value: Option<&T>,
    ) -> S3Result<()> {
        let doc = value
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| s3_error!(InternalError, "a bucket setting did not serialise: {e}"))?;
        self.objects
            .directory()
            .transact_durable(&[], |tx| tx.set_bucket_setting(bucket, name, doc.as_deref()))
            .await
            .map_err(s3)
    }
}

/// Refuses a version id the gateway could not have given (`null`, or 32 hex digits) with
/// InvalidArgument, as S3 does, rather than answering that such a version does not exist.
fn check_version_id(id: Option<&str>) -> S3Result<()> {
    match id {
        None | Some("null") => Ok(()),
        Some(id) if id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(()),
        Some(_) => Err(s3_error!(InvalidArgument, "Invalid version id specified")),
    }
}

fn s3(e: GatewayError) -> S3Error {
    use GatewayError as G;
    match e {
        G::NoSuchBucket => s3_error!(NoSuchBucket),
        G::NoSuchKey => s3_error!(NoSuchKey),
        G::NoSuchVersion => s3_error!(NoSuchVersion),
        G::DeleteMarker => s3_error!(
            MethodNotAllowed,
            "The specified method is not allowed against this resource."
        ),
        G::BucketNotEmpty => s3_error!(BucketNotEmpty),
        G::Locked(m) => S3Error::with_message(S3ErrorCode::AccessDenied, m),
        G::InvalidBucketState(m) => S3Error::with_message(S3ErrorCode::InvalidBucketState, m),
        G::NoSuchUpload => s3_error!(NoSuchUpload),
        G::InvalidPart => s3_error!(InvalidPart),
        G::InvalidPartOrder => s3_error!(InvalidPartOrder),
        G::InvalidRange => s3_error!(InvalidRange),
        G::PreconditionFailed => s3_error!(PreconditionFailed),
        G::BadDigest => s3_error!(BadDigest),
        G::TooLarge => s3_error!(EntityTooLarge),
        G::Full { .. } => S3Error::with_message(S3ErrorCode::EntityTooLarge, e.to_string()),
        // 503: clients back off and try again, which succeeds once there is room.
        G::NoRoom(m) => S3Error::with_message(S3ErrorCode::SlowDown, m),
        G::Body(m) => S3Error::with_message(S3ErrorCode::IncompleteBody, m),
        other => {
            if other.is_integrity() {
                tracing::error!("integrity violation detected in the untrusted store");
            } else {
                tracing::error!(error = %other, "internal error");
            }
            S3Error::with_message(S3ErrorCode::InternalError, other.to_string())
        }
    }
}

/// [`s3`] for an error reading one object: an integrity failure names the object to the
/// client that asked for it (its own name; the log stays free of names) and the next step.
fn s3_for_object(e: GatewayError, bucket: &str, key: &str) -> S3Error {
    if !e.is_integrity() {
        return s3(e);
    }
    tracing::error!("integrity violation detected in the untrusted store while reading an object");
    S3Error::with_message(
        S3ErrorCode::InternalError,
        format!(
            "object {bucket}/{key} cannot be read: a cell holding it failed authentication (the \
             store modified, swapped or rolled it back). The gateway stops; the operator can run \
             `blindfold verify` to list the damaged objects, then restart or `blindfold recover`"
        ),
    )
}

/// MalformedXML saying what is wrong with the request's document.
fn malformed(why: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::MalformedXML, why.to_string())
}

/// A date of a request (retention, lifecycle) in nanoseconds since the Unix epoch.
fn ns_of(t: &Timestamp) -> i128 {
    time::OffsetDateTime::from(t.clone()).unix_timestamp_nanos()
}

/// [`ns_of`] back to a date for an answer.
fn timestamp(ns: i128) -> Option<Timestamp> {
    time::OffsetDateTime::from_unix_timestamp_nanos(ns).ok().map(Timestamp::from)
}

fn etag(meta: &ObjectMeta) -> ETag {
    ETag::Strong(meta.etag.clone())
}

/// Client metadata (`x-amz-meta-*`) as stored, with the standard headers added.
fn metadata_map(m: Option<Metadata>, standard: StandardHeaders) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = m
        .map(|m| m.into_iter().filter(|(k, _)| !k.starts_with(STANDARD_PREFIX)).collect())
        .unwrap_or_default();
    standard.store(&mut map);
    map
}

/// The client metadata of a stored map, without the standard headers.
fn to_metadata(m: &BTreeMap<String, String>) -> Option<Metadata> {
    let user: Metadata = m
        .iter()
        .filter(|(k, _)| !k.starts_with(STANDARD_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    (!user.is_empty()).then_some(user)
}

/// Tags on one object at most, as in S3 (a bucket takes 50).
const MAX_OBJECT_TAGS: usize = 10;
const MAX_BUCKET_TAGS: usize = 50;

/// Checks a tag set as S3 does: at most `max` tags, keys of 1 to 128 characters, values of
/// at most 256, no key twice (all InvalidTag).
fn check_tags(tags: &[(String, String)], max: usize) -> S3Result<()> {
    if tags.len() > max {
        return Err(s3_error!(InvalidTag, "Object tags cannot be greater than {max}"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (k, v) in tags {
        if k.is_empty() || k.chars().count() > 128 {
            return Err(s3_error!(InvalidTag, "The TagKey you have provided is invalid"));
        }
        if v.chars().count() > 256 {
            return Err(s3_error!(InvalidTag, "The TagValue you have provided is invalid"));
        }
        if !seen.insert(k.as_str()) {
            return Err(s3_error!(InvalidTag, "Cannot provide multiple Tags with the same key"));
        }
    }
    Ok(())
}

/// Tags as stored ([`TAGGING_KEY`]): the query-string form; `None` for no tags.
fn encode_tags(tags: &[(String, String)]) -> Option<String> {
    (!tags.is_empty()).then(|| serde_urlencoded::to_string(tags).expect("tags encode"))
}

/// Tags from the `x-amz-tagging` header (or from storage), checked.
fn parse_tagging(header: &str) -> S3Result<Vec<(String, String)>> {
    let tags: Vec<(String, String)> = serde_urlencoded::from_str(header)
        .map_err(|_| s3_error!(InvalidArgument, "The tagging header is not a query string"))?;
    check_tags(&tags, MAX_OBJECT_TAGS)?;
    Ok(tags)
}

use crate::directory::object_tags as stored_tags;

/// Tags as S3 answers them: ordered by key.
fn tag_set(mut tags: Vec<(String, String)>) -> TagSet {
    tags.sort();
    tags.into_iter().map(|(k, v)| Tag { key: Some(k), value: Some(v) }).collect()
}

fn from_tag_set(t: Tagging) -> Vec<(String, String)> {
    t.tag_set
        .into_iter()
        .map(|t| (t.key.unwrap_or_default(), t.value.unwrap_or_default()))
        .collect()
}

/// Puts the tags of the `x-amz-tagging` header into an object's metadata map.
fn with_tagging(
    mut map: BTreeMap<String, String>,
    header: Option<&str>,
) -> S3Result<BTreeMap<String, String>> {
    map.remove(TAGGING_KEY);
    if let Some(t) = header.map(parse_tagging).transpose()?.and_then(|t| encode_tags(&t)) {
        map.insert(TAGGING_KEY.into(), t);
    }
    Ok(map)
}

/// The version id to answer with (`x-amz-version-id`): none for a bucket that never had
/// versioning, as S3 answers.
fn answer_version(state: Versioning, meta: &ObjectMeta) -> Option<String> {
    (state != Versioning::Off).then(|| version_id(meta).to_string())
}

/// The version id a write answers with: only where versioning is enabled (a suspended
/// bucket's writes make the `null` version and answer none, as S3 does).
fn written_version(state: Versioning, meta: &ObjectMeta) -> Option<String> {
    (state == Versioning::Enabled).then(|| version_id(meta).to_string())
}

/// NoSuchKey for a key whose latest version is a delete marker, with the headers S3 sends.
fn deleted_key(v: &Version) -> S3Error {
    let mut e = s3_error!(NoSuchKey);
    e.set_headers(marker_headers(v));
    e
}

/// MethodNotAllowed for a read of a delete marker by its version id.
fn marker_not_allowed(v: &Version) -> S3Error {
    let mut e = s3(GatewayError::DeleteMarker);
    e.set_headers(marker_headers(v));
    e
}

fn marker_headers(v: &Version) -> hyper::HeaderMap {
    let mut h = hyper::HeaderMap::new();
    h.insert("x-amz-delete-marker", hyper::header::HeaderValue::from_static("true"));
    if let Ok(id) = hyper::header::HeaderValue::from_str(&v.version_id) {
        h.insert("x-amz-version-id", id);
    }
    h
}

/// A ListObjectVersions page: entries, truncated, and where the next page starts (key,
/// version id).
type VersionsPage = (Vec<VersionEntry>, bool, Option<(String, Option<String>)>);

/// One entry of a ListObjectVersions answer.
enum VersionEntry {
    Object(ObjectVersion),
    Marker(DeleteMarkerEntry),
    Prefix(String),
}

/// Standard headers are kept in an object's metadata map under names that start with this:
/// no header name (so no `x-amz-meta-*` name) contains a colon.
const STANDARD_PREFIX: &str = ":";

/// The standard HTTP headers an object keeps from its upload and returns on GET and HEAD
/// (Content-Type has a field of its own).
#[derive(Debug, Default, Clone)]
struct StandardHeaders {
    cache_control: Option<String>,
    content_disposition: Option<String>,
    content_encoding: Option<String>,
    content_language: Option<String>,
    expires: Option<Timestamp>,
}

impl StandardHeaders {
    const NAMES: [&'static str; 5] = [
        ":cache-control",
        ":content-disposition",
        ":content-encoding",
        ":content-language",
        ":expires",
    ];

    fn new(
        cache_control: Option<String>,
        content_disposition: Option<String>,
        content_encoding: Option<String>,
        content_language: Option<String>,
        expires: Option<Timestamp>,
    ) -> Self {
        // `aws-chunked` describes how the request body was sent, not the object.
        let content_encoding = content_encoding.and_then(|e| {
            let kept: Vec<&str> = e
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("aws-chunked"))
                .collect();
            (!kept.is_empty()).then(|| kept.join(", "))
        });
        Self { cache_control, content_disposition, content_encoding, content_language, expires }
    }

    fn store(self, map: &mut BTreeMap<String, String>) {
        let expires = self.expires.and_then(|t| {
            let mut text = Vec::new();
            t.format(TimestampFormat::HttpDate, &mut text).ok()?;
            String::from_utf8(text).ok()
        });
        let values = [
            self.cache_control,
            self.content_disposition,
            self.content_encoding,
            self.content_language,
            expires,
        ];
        for (name, value) in Self::NAMES.into_iter().zip(values) {
            if let Some(v) = value {
                map.insert(name.to_string(), v);
            }
        }
    }

    fn of(meta: &ObjectMeta) -> Self {
        let get = |i: usize| meta.metadata.get(Self::NAMES[i]).cloned();
        Self {
            cache_control: get(0),
            content_disposition: get(1),
            content_encoding: get(2),
            content_language: get(3),
            expires: get(4).and_then(|t| Timestamp::parse(TimestampFormat::HttpDate, &t).ok()),
        }
    }
}

/// What a request's preconditions say about an existing object (RFC 9110 §13.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Precondition {
    /// Go on.
    Holds,
    /// If-None-Match or If-Modified-Since: 304 for a read, 412 otherwise.
    NotModified,
    /// If-Match or If-Unmodified-Since: 412.
    Fails,
}

/// The four conditional headers of a request (or the four `x-amz-copy-source-if-*` ones).
#[derive(Debug, Default, Clone, Copy)]
struct Conditions<'a> {
    if_match: Option<&'a ETagCondition>,
    if_none_match: Option<&'a ETagCondition>,
    if_modified_since: Option<&'a Timestamp>,
    if_unmodified_since: Option<&'a Timestamp>,
}

impl Conditions<'_> {
    /// Evaluates the conditions on `meta` in the order of RFC 9110: If-Match, else
    /// If-Unmodified-Since; then If-None-Match, else If-Modified-Since. Dates compare in whole
    /// seconds, the precision of Last-Modified.
    fn evaluate(&self, meta: &ObjectMeta) -> Precondition {
        let ours = etag(meta);
        let modified = meta.modified_ns.div_euclid(1_000_000_000);
        let secs =
            |t: &Timestamp| i128::from(time::OffsetDateTime::from(t.clone()).unix_timestamp());
        match self.if_match {
            Some(ETagCondition::Any) => {}
            Some(ETagCondition::ETag(t)) if t.strong_cmp(&ours) => {}
            Some(_) => return Precondition::Fails,
            None => {
                if self.if_unmodified_since.is_some_and(|t| modified > secs(t)) {
                    return Precondition::Fails;
                }
            }
        }
        match self.if_none_match {
            Some(ETagCondition::Any) => return Precondition::NotModified,
            Some(ETagCondition::ETag(t)) if t.weak_cmp(&ours) => return Precondition::NotModified,
            Some(_) => {}
            None => {
                if self.if_modified_since.is_some_and(|t| modified <= secs(t)) {
                    return Precondition::NotModified;
                }
            }
        }
        Precondition::Holds
    }

    /// For a GET or HEAD: 304 or 412 as an error.
    fn check_read(&self, meta: &ObjectMeta) -> S3Result<()> {
        match self.evaluate(meta) {
            Precondition::Holds => Ok(()),
            Precondition::NotModified => {
                let mut e = S3Error::new(S3ErrorCode::NotModified);
                let mut headers = hyper::HeaderMap::new();
                if let Ok(v) = hyper::header::HeaderValue::from_str(&format!("\"{}\"", meta.etag)) {
                    headers.insert(hyper::header::ETAG, v);
                }
                e.set_headers(headers);
                Err(e)
            }
            Precondition::Fails => Err(precondition_failed()),
        }
    }

    /// For a write or a copy source: anything but [`Precondition::Holds`] is 412.
    fn check_write(&self, meta: &ObjectMeta) -> S3Result<()> {
        match self.evaluate(meta) {
            Precondition::Holds => Ok(()),
            _ => Err(precondition_failed()),
        }
    }
}

fn precondition_failed() -> S3Error {
    s3_error!(PreconditionFailed)
}

/// Checks a write's If-Match / If-None-Match against the object it would replace, if any.
/// If-Match needs an object (NoSuchKey without one, as S3 answers); If-None-Match: * needs
/// there to be none.
fn check_destination(
    existing: Option<&ObjectMeta>,
    if_match: Option<&ETagCondition>,
    if_none_match: Option<&ETagCondition>,
) -> S3Result<()> {
    let conditions = Conditions { if_match, if_none_match, ..Default::default() };
    match existing {
        Some(meta) => conditions.check_write(meta),
        None if if_match.is_some() => Err(s3_error!(NoSuchKey)),
        None => Ok(()),
    }
}

/// Parses `x-amz-copy-source-range`, which must be `bytes=first-last` inside the source.
fn copy_range(range: &str, size: u64) -> S3Result<std::ops::Range<u64>> {
    let malformed = || {
        s3_error!(
            InvalidArgument,
            "The x-amz-copy-source-range value must be of the form bytes=first-last where first \
             and last are the zero-based offsets of the first and last bytes to copy"
        )
    };
    let (first, last) =
        range.strip_prefix("bytes=").and_then(|r| r.split_once('-')).ok_or_else(malformed)?;
    let number = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
            .ok_or_else(malformed)
    };
    let (first, last) = (number(first)?, number(last)?);
    if first > last {
        return Err(malformed());
    }
    if last >= size {
        return Err(s3_error!(InvalidRange, "The requested range is not satisfiable"));
    }
    Ok(first..last + 1)
}

/// Whether a listing asks for `encoding-type=url`; any other value is refused.
fn url_encoding(encoding: Option<&EncodingType>) -> S3Result<bool> {
    match encoding {
        None => Ok(false),
        Some(e) if e.as_str() == EncodingType::URL => Ok(true),
        Some(_) => Err(s3_error!(InvalidArgument, "Invalid Encoding Method specified in Request")),
    }
}

/// Percent-encodes a key, prefix, delimiter or marker for `encoding-type=url` answers, keeping
/// what needs no encoding in a URL path.
fn encode_url(s: &str) -> String {
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    const KEEP: &AsciiSet =
        &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');
    utf8_percent_encode(s, KEEP).to_string()
}

/// Applies [`encode_url`] when `on`.
fn encoder(on: bool) -> impl Fn(String) -> String {
    move |s| if on { encode_url(&s) } else { s }
}

fn receiver_stream(
    rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, GatewayError>>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, GatewayError>> + Unpin {
    Box::pin(futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) }))
}

fn body_stream(
    body: Option<StreamingBlob>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, String>> + Unpin {
    match body {
        Some(b) => b.map(|r| r.map_err(|e| e.to_string())).left_stream(),
        None => futures::stream::empty().right_stream(),
    }
}

fn receiver_blob(
    rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, GatewayError>>,
) -> StreamingBlob {
    StreamingBlob::wrap(receiver_stream(rx))
}

/// One page of a multipart upload's parts: those numbered above `after`, at most `max` of
/// them, and whether more follow.
fn parts_page(parts: &BTreeMap<i32, Part>, after: i32, max: usize) -> (Vec<(i32, &Part)>, bool) {
    let mut rest = parts.range(after.saturating_add(1)..).map(|(n, p)| (*n, p));
    let page: Vec<_> = rest.by_ref().take(max).collect();
    (page, rest.next().is_some())
}

fn object_entry(key: String, meta: &ObjectMeta) -> Object {
    Object {
        key: Some(key),
        size: Some(meta.size as i64),
        e_tag: Some(etag(meta)),
        last_modified: Some(Timestamp::from(meta.modified())),
        storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
        ..Default::default()
    }
}

/// The ETag of the object a multipart upload of these (number, ETag) parts makes, if every
/// part has an MD5 ETag.
fn multipart_etag(parts: &[(i32, Option<String>)]) -> Option<String> {
    use md5::{Digest, Md5};
    let mut md5s = Vec::new();
    for (_, etag) in parts {
        let raw = hex::decode(etag.as_deref()?.trim_matches('"')).ok()?;
        if raw.len() != 16 {
            return None;
        }
        md5s.extend_from_slice(&raw);
    }
    Some(format!("{}-{}", hex::encode(Md5::digest(&md5s)), parts.len()))
}

/// `max-keys`: at most [`MAX_KEYS`], never negative.
fn max_keys(m: Option<i32>) -> S3Result<usize> {
    match m {
        Some(m) if m < 0 => Err(s3_error!(InvalidArgument, "max-keys must not be negative")),
        Some(m) => Ok((m as usize).min(MAX_KEYS)),
        None => Ok(MAX_KEYS),
    }
}

/// A continuation token: the hex form of the last name answered.
fn decode_token(t: &str) -> S3Result<String> {
    let bad = || s3_error!(InvalidArgument, "The continuation token provided is incorrect");
    String::from_utf8(hex::decode(t).map_err(|_| bad())?).map_err(|_| bad())
}

fn encode_objects(objects: Vec<Object>, enc: &impl Fn(String) -> String) -> Vec<Object> {
    objects.into_iter().map(|o| Object { key: o.key.map(enc), ..o }).collect()
}

fn encode_prefixes(
    prefixes: Vec<CommonPrefix>,
    enc: &impl Fn(String) -> String,
) -> Vec<CommonPrefix> {
    prefixes.into_iter().map(|p| CommonPrefix { prefix: p.prefix.map(enc) }).collect()
}

/// A listing: objects and common prefixes, whether truncated, and the last key consumed.
struct Listing {
    objects: Vec<Object>,
    prefixes: Vec<CommonPrefix>,
    truncated: bool,
    last: Option<String>,
}

impl Gateway {
    fn list(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        after: &str,
        max_keys: usize,
    ) -> Result<Listing, GatewayError> {
        let dir = self.objects.directory();
        dir.require_bucket(bucket)?;
        // An empty delimiter means no delimiter (rclone and restic send `delimiter=`).
        let delimiter = delimiter.filter(|d| !d.is_empty());
        let mut out =
            Listing { objects: Vec::new(), prefixes: Vec::new(), truncated: false, last: None };
        // S3 answers max-keys=0 with nothing, not truncated.
        if max_keys == 0 {
            return Ok(out);
        }
        let mut cursor = after.to_string();
        // Continuing after a common prefix: skip every key under it, not just the prefix.
        if let Some(d) = delimiter {
            if after.len() > prefix.len() && after.starts_with(prefix) && after.ends_with(d) {
                cursor.push(char::MAX);
            }
        }
        let mut count = 0usize;
        loop {
            let page = dir.list(bucket, prefix, &cursor, 1000)?;
            if page.is_empty() {
                return Ok(out);
            }
            for (key, meta) in page {
                if count == max_keys {
                    out.truncated = true;
                    return Ok(out);
                }
                cursor.clone_from(&key);
                if let Some(d) = delimiter {
                    if let Some(pos) = key[prefix.len()..].find(d) {
                        let common = key[..prefix.len() + pos + d.len()].to_string();
                        // Skip every key under this common prefix.
                        let mut skip_to = common.clone();
                        skip_to.push(char::MAX);
                        cursor = skip_to;
                        out.last = Some(common.clone());
                        out.prefixes.push(CommonPrefix { prefix: Some(common) });
                        count += 1;
                        break;
                    }
                }
                out.last = Some(key.clone());
                out.objects.push(object_entry(key, &meta));
                count += 1;
            }
        }
    }

    /// The bucket's versioning state.
    fn versioning(&self, bucket: &str) -> S3Result<Versioning> {
        Ok(self.objects.directory().bucket_config(bucket).map_err(s3)?.versioning)
    }

    /// The version `version_id` (the current one: `None`) of an object for reading: its
    /// blocks stay pinned while the pin lives. A delete marker is an error, as S3 answers.
    fn version_for_read(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
    ) -> S3Result<(ObjectMeta, Option<ReadPin>)> {
        check_version_id(version_id)?;
        self.objects.directory().require_bucket(bucket).map_err(s3)?;
        let (v, pin) = match self.objects.lookup_version_for_read(bucket, key, version_id) {
            Ok(found) => found,
            // A versioned bucket says so of a key it has no version of, as S3 does.
            Err(GatewayError::NoSuchKey) if self.versioning(bucket)? != Versioning::Off => {
                let mut e = s3_error!(NoSuchKey);
                let mut h = hyper::HeaderMap::new();
                h.insert("x-amz-delete-marker", hyper::header::HeaderValue::from_static("false"));
                e.set_headers(h);
                return Err(e);
            }
            Err(e) => return Err(s3(e)),
        };
        match v.object {
            Some(meta) => Ok((meta, pin)),
            None if version_id.is_some() => Err(marker_not_allowed(&v)),
            None => Err(deleted_key(&v)),
        }
    }

    /// Entries of a ListObjectVersions page: versions and delete markers of keys after
    /// `key_marker` (and of `key_marker` itself after `version_marker`), common prefixes
    /// counted once. Returns the entries, whether more follow, and the markers to go on from.
    fn list_versions(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        key_marker: &str,
        version_marker: Option<&str>,
        max: usize,
    ) -> Result<VersionsPage, GatewayError> {
        let dir = self.objects.directory();
        dir.require_bucket(bucket)?;
        let delimiter = delimiter.filter(|d| !d.is_empty());
        let mut out = Vec::new();
        let mut last: Option<(String, Option<String>)> = None;
        if max == 0 {
            return Ok((out, false, None));
        }
        // The rest of the marker key's versions first.
        let mut cursor = key_marker.to_string();
        if let Some(vm) = version_marker.filter(|_| !key_marker.is_empty()) {
            let versions = dir.versions_of_key(bucket, key_marker)?;
            let mut after = versions.iter().skip_while(|v| v.version_id != vm);
            if after.next().is_some() {
                // Past the marker: none of these is the latest, which comes first.
                for v in after {
                    if out.len() == max {
                        return Ok((out, true, last));
                    }
                    out.push(version_entry(key_marker, v, false));
                    last = Some((key_marker.to_string(), Some(v.version_id.clone())));
                }
            }
        }
        if let Some(d) = delimiter {
            if cursor.len() > prefix.len() && cursor.starts_with(prefix) && cursor.ends_with(d) {
                cursor.push(char::MAX);
            }
        }
        loop {
            let page = dir.key_versions(bucket, prefix, &cursor, 100)?;
            if page.is_empty() {
                return Ok((out, false, last));
            }
            for (key, versions) in page {
                cursor.clone_from(&key);
                if let Some(d) = delimiter {
                    if let Some(pos) = key[prefix.len()..].find(d) {
                        if out.len() == max {
                            return Ok((out, true, last));
                        }
                        let common = key[..prefix.len() + pos + d.len()].to_string();
                        let mut skip_to = common.clone();
                        skip_to.push(char::MAX);
                        cursor = skip_to;
                        last = Some((common.clone(), None));
                        out.push(VersionEntry::Prefix(common));
                        break;
                    }
                }
                for (i, v) in versions.iter().enumerate() {
                    if out.len() == max {
                        return Ok((out, true, last));
                    }
                    out.push(version_entry(&key, v, i == 0));
                    last = Some((key.clone(), Some(v.version_id.clone())));
                }
            }
        }
    }

    /// Deletes one object (the current version: a delete marker where versioning is on) or
    /// one version, and says what it did as DeleteObjects reports it.
    async fn delete_one(
        &self,
        bucket: &str,
        key: &str,
        version: Option<String>,
        bypass_governance: bool,
    ) -> Result<DeletedObject, GatewayError> {
        match version {
            Some(id) => {
                let gone = self.objects.delete_version(bucket, key, &id, bypass_governance).await?;
                let marker = gone.as_ref().is_some_and(|v| v.object.is_none());
                Ok(DeletedObject {
                    delete_marker: marker.then_some(true),
                    delete_marker_version_id: marker.then(|| id.clone()),
                    version_id: Some(id),
                    ..Default::default()
                })
            }
            None => {
                let d = self.objects.delete_current(bucket, key).await?;
                Ok(DeletedObject {
                    delete_marker: d.marker.is_some().then_some(true),
                    delete_marker_version_id: d.marker,
                    ..Default::default()
                })
            }
        }
    }

    /// Replaces the tags of an object's version (`None`: the current one); answers its
    /// version id where versioning is on.
    async fn set_tagging(
        &self,
        bucket: &str,
        key: &str,
        version: Option<String>,
        tags: Option<String>,
    ) -> S3Result<Option<String>> {
        let dir = self.objects.directory();
        let id = dir
            .transact_durable(&[], |tx| {
                tx.require_bucket(bucket)?;
                tx.set_tagging(bucket, key, version.as_deref(), tags.as_deref())
            })
            .await
            .map_err(s3)?;
        Ok((self.versioning(bucket)? != Versioning::Off).then_some(id))
    }

    /// Replaces a bucket's tags (`None`: removes them).
    async fn set_bucket_tags(&self, bucket: &str, tags: Option<String>) -> S3Result<()> {
        self.objects
            .directory()
            .transact_durable(&[], |tx| {
                let mut config = tx.bucket_config(bucket)?;
                config.tags = tags;
                tx.set_bucket_config(bucket, &config)
            })
            .await
            .map_err(s3)
    }
}

fn version_entry(key: &str, v: &Version, latest: bool) -> VersionEntry {
    match &v.object {
        Some(meta) => VersionEntry::Object(ObjectVersion {
            key: Some(key.to_string()),
            size: Some(meta.size as i64),
            e_tag: Some(etag(meta)),
            last_modified: Some(Timestamp::from(meta.modified())),
            is_latest: Some(latest),
            version_id: Some(v.version_id.clone()),
            storage_class: Some(ObjectVersionStorageClass::from_static(
                ObjectVersionStorageClass::STANDARD,
            )),
            ..Default::default()
        }),
        None => VersionEntry::Marker(DeleteMarkerEntry {
            key: Some(key.to_string()),
            is_latest: Some(latest),
            last_modified: Some(Timestamp::from(crate::directory::system_time(v.modified_ns))),
            version_id: Some(v.version_id.clone()),
            ..Default::default()
        }),
    }
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let caller = req.credentials.as_ref().map(|c| c.access_key.clone());
        let visible =
            |name: &str| self.access.as_ref().is_none_or(|a| a.may_see(caller.as_deref(), name));
        let input = req.input;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = match input.max_buckets {
            Some(m) if !(1..=10_000).contains(&m) => {
                return Err(s3_error!(InvalidArgument, "max-buckets must be 1 to 10000"))
            }
            Some(m) => m as usize,
            None => usize::MAX,
        };
        let after = match &input.continuation_token {
            Some(t) => Some(decode_token(t)?),
            None => None,
        };
        let mut buckets: Vec<_> = self
            .objects
            .directory()
            .buckets()
            .map_err(s3)?
            .into_iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .filter(|(name, _)| after.as_ref().is_none_or(|a| name > a))
            .filter(|(name, _)| visible(name))
            .collect();
        buckets.sort_by(|a, b| a.0.cmp(&b.0));
        let more = buckets.len() > max;
        buckets.truncate(max);
        let next = more.then(|| buckets.last().map(|(n, _)| hex::encode(n.as_bytes()))).flatten();
        let list = buckets
            .into_iter()
            .map(|(name, meta)| Bucket {
                name: Some(name),
                creation_date: Some(Timestamp::from(
                    std::time::SystemTime::UNIX_EPOCH
                        + std::time::Duration::from_nanos(meta.created_ns.max(0) as u64),
                )),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(list),
            continuation_token: next,
            prefix: input.prefix,
            ..Default::default()
        }))
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let i = &req.input;
        // Beyond what s3s checks: S3 refuses these in new bucket names (not DNS labels).
        if [".-", "-.", ".."].iter().any(|bad| i.bucket.contains(bad)) {
            return Err(s3_error!(
                InvalidBucketName,
                "The specified bucket is not valid: a name may not hold \"..\", \".-\" or \"-.\""
            ));
        }
        let canned = object_acl!(i, grant_write);
        let created = self.objects.directory().create_bucket(&req.input.bucket).map_err(s3)?;
        self.objects.directory().settle().await.map_err(s3)?;
        if !created {
            return Err(s3_error!(BucketAlreadyOwnedByYou));
        }
        if canned != crate::sharing::Canned::Private {
            self.set_bucket_acl(&req.input.bucket, canned).await?;
        }
        if req.input.object_lock_enabled_for_bucket == Some(true) {
            self.lock_new_bucket(&req.input.bucket).await?;
        }
        tracing::debug!("bucket created");
        Ok(S3Response::new(CreateBucketOutput::default()))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.objects.directory().require_bucket(&req.input.bucket).map_err(s3)?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.objects.directory().require_bucket(&req.input.bucket).map_err(s3)?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.objects.directory().delete_bucket(&req.input.bucket).map_err(s3)?;
        self.objects.directory().settle().await.map_err(s3)?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        let canned = object_acl!(input);
        if let Some(t) = input.tagging.as_deref() {
            parse_tagging(t)?;
        }
        // If-None-Match: * is checked again when the object is published, atomically.
        let if_none_match = matches!(input.if_none_match, Some(ETagCondition::Any));
        if input.if_match.is_some() || input.if_none_match.is_some() {
            let existing =
                self.objects.directory().object(&input.bucket, &input.key).map_err(s3)?;
            check_destination(
                existing.as_ref(),
                input.if_match.as_ref(),
                input.if_none_match.as_ref(),
            )?;
        }
        if let Some(len) = input.content_length {
            if len as u64 > crate::objects::MAX_OBJECT_SIZE {
                return Err(s3_error!(EntityTooLarge));
            }
        }
        let mut map = new_object_map!(self, input);
        acl::apply(&mut map, canned);
        let enc = object_sse!(input, map);
        let meta = self
            .objects
            .put_object(
                &input.bucket,
                &input.key,
                body_stream(input.body),
                input.content_type,
                map,
                if_none_match,
            )
            .await
            .map_err(s3)?;
        tracing::debug!("object stored");
        Ok(S3Response::new(PutObjectOutput {
            expiration: self.expiration(&input.bucket, &input.key, &meta),
            e_tag: Some(etag(&meta)),
            version_id: written_version(self.versioning(&input.bucket)?, &meta),
            checksum_crc32: input.checksum_crc32,
            checksum_crc32c: input.checksum_crc32c,
            checksum_crc64nvme: input.checksum_crc64nvme,
            checksum_sha1: input.checksum_sha1,
            checksum_sha256: input.checksum_sha256,
            server_side_encryption: enc.encryption(),
            sse_customer_algorithm: enc.algorithm(),
            sse_customer_key_md5: enc.customer_md5,
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        sse::refuse_on_read(&req.headers)?;
        let input = req.input;
        let (meta, _pin) =
            self.version_for_read(&input.bucket, &input.key, input.version_id.as_deref())?;
        let enc = sse::check_read(&meta.metadata, customer_key!(input))?;
        let state = self.versioning(&input.bucket)?;
        Conditions {
            if_match: input.if_match.as_ref(),
            if_none_match: input.if_none_match.as_ref(),
            if_modified_since: input.if_modified_since.as_ref(),
            if_unmodified_since: input.if_unmodified_since.as_ref(),
        }
        .check_read(&meta)?;
        let (range, content_range) = match &input.range {
            Some(r) => {
                let rg = r.check(meta.size).map_err(|_| s3_error!(InvalidRange))?;
                let cr = format!("bytes {}-{}/{}", rg.start, rg.end.saturating_sub(1), meta.size);
                (rg, Some(cr))
            }
            None => (0..meta.size, None),
        };
        let len = range.end - range.start;
        let rx = self
            .objects
            .read_range(&meta, range, PREFETCH)
            .await
            .map_err(|e| s3_for_object(e, &input.bucket, &input.key))?;
        // response-* query parameters override what the object says (S3 honours them on
        // signed requests, which every request here is).
        let std = StandardHeaders::of(&meta);
        let lock = LockHeaders::of(&meta);
        let current = input.version_id.is_none();
        Ok(S3Response::new(GetObjectOutput {
            body: Some(receiver_blob(rx)),
            content_length: Some(len as i64),
            content_range,
            content_type: input.response_content_type.or_else(|| meta.content_type.clone()),
            cache_control: input.response_cache_control.or(std.cache_control),
            content_disposition: input.response_content_disposition.or(std.content_disposition),
            content_encoding: input.response_content_encoding.or(std.content_encoding),
            content_language: input.response_content_language.or(std.content_language),
            expires: input.response_expires.or(std.expires),
            e_tag: Some(etag(&meta)),
            last_modified: Some(Timestamp::from(meta.modified())),
            metadata: to_metadata(&meta.metadata),
            accept_ranges: Some("bytes".into()),
            tag_count: Some(stored_tags(&meta).len() as i32).filter(|n| *n > 0),
            version_id: answer_version(state, &meta),
            object_lock_mode: lock.mode,
            object_lock_retain_until_date: lock.until,
            object_lock_legal_hold_status: lock.hold,
            expiration: current
                .then(|| self.expiration(&input.bucket, &input.key, &meta))
                .flatten(),
            server_side_encryption: enc.encryption(),
            sse_customer_algorithm: enc.algorithm(),
            sse_customer_key_md5: enc.customer_md5,
            ..Default::default()
        }))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        sse::refuse_on_read(&req.headers)?;
        let input = req.input;
        let (meta, _pin) =
            self.version_for_read(&input.bucket, &input.key, input.version_id.as_deref())?;
        let enc = sse::check_read(&meta.metadata, customer_key!(input))?;
        let state = self.versioning(&input.bucket)?;
        Conditions {
            if_match: input.if_match.as_ref(),
            if_none_match: input.if_none_match.as_ref(),
            if_modified_since: input.if_modified_since.as_ref(),
            if_unmodified_since: input.if_unmodified_since.as_ref(),
        }
        .check_read(&meta)?;
        let std = StandardHeaders::of(&meta);
        let tags = stored_tags(&meta).len();
        let lock = LockHeaders::of(&meta);
        let current = input.version_id.is_none();
        let mut answer = S3Response::new(HeadObjectOutput {
            content_length: Some(meta.size as i64),
            content_type: meta.content_type.clone(),
            cache_control: std.cache_control,
            content_disposition: std.content_disposition,
            content_encoding: std.content_encoding,
            content_language: std.content_language,
            expires: std.expires,
            e_tag: Some(etag(&meta)),
            last_modified: Some(Timestamp::from(meta.modified())),
            metadata: to_metadata(&meta.metadata),
            accept_ranges: Some("bytes".into()),
            version_id: answer_version(state, &meta),
            object_lock_mode: lock.mode,
            object_lock_retain_until_date: lock.until,
            object_lock_legal_hold_status: lock.hold,
            expiration: current
                .then(|| self.expiration(&input.bucket, &input.key, &meta))
                .flatten(),
            server_side_encryption: enc.encryption(),
            sse_customer_algorithm: enc.algorithm(),
            sse_customer_key_md5: enc.customer_md5,
            ..Default::default()
        });
        // HeadObjectOutput has no field for it; S3 sends it on HEAD as on GET.
        if tags > 0 {
            answer.headers.insert("x-amz-tagging-count", hyper::header::HeaderValue::from(tags));
        }
        Ok(answer)
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        let bypass = self.bypasses(&req, req.input.bypass_governance_retention);
        let input = req.input;
        check_version_id(input.version_id.as_deref())?;
        let d = self
            .delete_one(&input.bucket, &input.key, input.version_id, bypass)
            .await
            .map_err(s3)?;
        Ok(S3Response::new(DeleteObjectOutput {
            delete_marker: d.delete_marker,
            version_id: d.version_id.or(d.delete_marker_version_id),
            ..Default::default()
        }))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let bypass = self.bypasses(&req, req.input.bypass_governance_retention);
        let input = req.input;
        self.objects.directory().require_bucket(&input.bucket).map_err(s3)?;
        if input.delete.objects.len() > MAX_KEYS {
            return Err(s3_error!(MalformedXML, "A DeleteObjects request names at most 1000 keys"));
        }
        let quiet = input.delete.quiet.unwrap_or(false);
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for obj in input.delete.objects {
            match self.delete_one(&input.bucket, &obj.key, obj.version_id.clone(), bypass).await {
                Ok(d) => {
                    if !quiet {
                        deleted.push(DeletedObject { key: Some(obj.key), ..d });
                    }
                }
                Err(e) => {
                    let e = s3(e);
                    let code = e.code().as_str().to_string();
                    errors.push(s3s::dto::Error {
                        key: Some(obj.key),
                        version_id: obj.version_id,
                        message: Some(e.message().unwrap_or(&code).to_string()),
                        code: Some(code),
                    })
                }
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let input = req.input;
        let canned = object_acl!(input);
        let (src_bucket, src_key, src_version) = match &input.copy_source {
            CopySource::Bucket { bucket, key, version_id } => {
                (bucket.to_string(), key.to_string(), version_id.as_deref().map(str::to_string))
            }
            _ => {
                return Err(s3_error!(NotImplemented, "only bucket/key copy sources are supported"))
            }
        };
        let replace_tags = match input.tagging_directive.as_ref().map(|d| d.as_str()) {
            None | Some(TaggingDirective::COPY) => false,
            Some(TaggingDirective::REPLACE) => true,
            Some(_) => return Err(s3_error!(InvalidArgument, "Unknown tagging directive.")),
        };
        if let Some(t) = input.tagging.as_deref() {
            parse_tagging(t)?;
        }
        let (src, _pin) = self.version_for_read(&src_bucket, &src_key, src_version.as_deref())?;
        // An SSE-C source is read with its key; the copy is encrypted as the request says.
        sse::check_read(&src.metadata, customer_key!(input, copy_source))?;
        Conditions {
            if_match: input.copy_source_if_match.as_ref(),
            if_none_match: input.copy_source_if_none_match.as_ref(),
            if_modified_since: input.copy_source_if_modified_since.as_ref(),
            if_unmodified_since: input.copy_source_if_unmodified_since.as_ref(),
        }
        .check_write(&src)?;
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        if !replace && !replace_tags && src_bucket == input.bucket && src_key == input.key {
            return Err(s3_error!(
                InvalidRequest,
                "This copy request is illegal because it is trying to copy an object to itself \
                 without changing the object's metadata, storage class, website redirect \
                 location or encryption attributes."
            ));
        }
        let (content_type, mut map) = if replace {
            let standard = StandardHeaders::new(
                input.cache_control.clone(),
                input.content_disposition.clone(),
                input.content_encoding.clone(),
                input.content_language.clone(),
                input.expires.clone(),
            );
            (input.content_type.clone(), metadata_map(input.metadata.clone(), standard))
        } else {
            (src.content_type.clone(), src.metadata.clone())
        };
        // Tags follow the tagging directive, whatever the metadata directive says.
        map = if replace_tags {
            with_tagging(map, input.tagging.as_deref())?
        } else {
            let tags = encode_tags(&stored_tags(&src));
            with_tagging(map, None)?
                .into_iter()
                .chain(tags.map(|t| (TAGGING_KEY.into(), t)))
                .collect()
        };
        // A copy takes the lock the request names (or the bucket's default), never the
        // source's.
        for k in [crate::lock::MODE_KEY, crate::lock::UNTIL_KEY, crate::lock::HOLD_KEY] {
            map.remove(k);
        }
        let lock = self.new_version_lock(
            &input.bucket,
            input.object_lock_mode.as_ref(),
            input.object_lock_retain_until_date.as_ref(),
            input.object_lock_legal_hold_status.as_ref(),
        )?;
        crate::lock::apply(&mut map, lock);
        // Nor its ACL: the one the request names (private if none), as S3 does.
        acl::apply(&mut map, canned);
        let enc = object_sse!(input, map);
        let meta = self
            .objects
            .copy_object(&src, &input.bucket, &input.key, Some((content_type, map)))
            .await
            .map_err(s3)?;
        let src_state = self.versioning(&src_bucket)?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(&meta)),
                last_modified: Some(Timestamp::from(meta.modified())),
                ..Default::default()
            }),
            version_id: written_version(self.versioning(&input.bucket)?, &meta),
            copy_source_version_id: answer_version(src_state, &src),
            server_side_encryption: enc.encryption(),
            sse_customer_algorithm: enc.algorithm(),
            sse_customer_key_md5: enc.customer_md5,
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let input = req.input;
        let url = url_encoding(input.encoding_type.as_ref())?;
        let enc = encoder(url);
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = max_keys(input.max_keys)?;
        let after = input.marker.clone().unwrap_or_default();
        let l = self
            .list(&input.bucket, &prefix, input.delimiter.as_deref(), &after, max)
            .map_err(s3)?;
        let delimited = input.delimiter.as_deref().is_some_and(|d| !d.is_empty());
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            // botocore decodes Marker, NextMarker, Delimiter and keys of a v1 listing, and not
            // Prefix, which S3 does not encode there.
            prefix: Some(prefix),
            marker: Some(enc(input.marker.unwrap_or_default())),
            max_keys: Some(max as i32),
            is_truncated: Some(l.truncated),
            next_marker: if l.truncated && delimited { l.last.clone().map(&enc) } else { None },
            contents: Some(encode_objects(l.objects, &enc)),
            common_prefixes: Some(encode_prefixes(l.prefixes, &enc)),
            delimiter: input.delimiter.filter(|d| !d.is_empty()).map(&enc),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        let url = url_encoding(input.encoding_type.as_ref())?;
        let enc = encoder(url);
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = max_keys(input.max_keys)?;
        let after = match &input.continuation_token {
            Some(t) => decode_token(t)?,
            None => input.start_after.clone().unwrap_or_default(),
        };
        let l = self
            .list(&input.bucket, &prefix, input.delimiter.as_deref(), &after, max)
            .map_err(s3)?;
        let key_count = (l.objects.len() + l.prefixes.len()) as i32;
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: Some(enc(prefix)),
            max_keys: Some(max as i32),
            key_count: Some(key_count),
            continuation_token: input.continuation_token,
            is_truncated: Some(l.truncated),
            next_continuation_token: if l.truncated {
                l.last.map(|k| hex::encode(k.as_bytes()))
            } else {
                None
            },
            contents: Some(encode_objects(l.objects, &enc)),
            common_prefixes: Some(encode_prefixes(l.prefixes, &enc)),
            delimiter: input.delimiter.filter(|d| !d.is_empty()).map(&enc),
            start_after: input.start_after.map(&enc),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        let canned = object_acl!(input);
        let mut map = new_object_map!(self, input);
        acl::apply(&mut map, canned);
        let enc = object_sse!(input, map);
        let id = self
            .objects
            .create_upload(&input.bucket, &input.key, input.content_type, map)
            .await
            .map_err(s3)?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            server_side_encryption: enc.encryption(),
            sse_customer_algorithm: enc.algorithm(),
            sse_customer_key_md5: enc.customer_md5,
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        if !(1..=10_000).contains(&input.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to 10000"));
        }
        // A part of an SSE-C upload carries the upload's key (and no other does).
        let customer = customer_key!(input);
        let upload = self.objects.directory().upload(&input.upload_id).map_err(s3)?;
        let enc = match upload {
            Some(u) if u.bucket == input.bucket && u.key == input.key => {
                sse::check_read(&u.metadata, customer)?
            }
            _ => return Err(s3_error!(NoSuchUpload)),
        };
        let part = self
            .objects
            .upload_part(
                &input.bucket,
                &input.key,
                &input.upload_id,
                input.part_number,
                body_stream(input.body),
            )
            .await
            .map_err(s3)?;
        // Echo the checksums the client sent: clients compare them.
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(part.etag)),
            checksum_crc32: input.checksum_crc32,
            checksum_crc32c: input.checksum_crc32c,
            checksum_crc64nvme: input.checksum_crc64nvme,
            checksum_sha1: input.checksum_sha1,
            checksum_sha256: input.checksum_sha256,
            server_side_encryption: enc.encryption(),
            sse_customer_algorithm: enc.algorithm(),
            sse_customer_key_md5: enc.customer_md5,
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let parts: Vec<(i32, Option<String>)> = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.part_number.unwrap_or(0), p.e_tag.map(|t| t.value().to_string())))
            .collect();
        if parts.is_empty() {
            return Err(s3_error!(MalformedXML, "no parts listed"));
        }
        let dir = self.objects.directory();
        if input.if_match.is_some() || input.if_none_match.is_some() {
            let existing = dir.object(&input.bucket, &input.key).map_err(s3)?;
            check_destination(
                existing.as_ref(),
                input.if_match.as_ref(),
                input.if_none_match.as_ref(),
            )?;
        }
        // Every part but the last must hold 5 MiB (parts that are missing or do not match are
        // left to the object layer, which says InvalidPart).
        if let Some(up) = dir.upload(&input.upload_id).map_err(s3)? {
            let (_, init) = parts.split_last().expect("parts is not empty");
            if init
                .iter()
                .any(|(n, _)| up.parts.get(n).is_some_and(|p| p.extent.len < MIN_PART_SIZE))
            {
                return Err(s3_error!(
                    EntityTooSmall,
                    "Your proposed upload is smaller than the minimum allowed object size."
                ));
            }
        }
        let meta = match self
            .objects
            .complete_upload(&input.bucket, &input.key, &input.upload_id, &parts)
            .await
        {
            Ok(meta) => meta,
            // Completing again an upload that is done succeeds, as in S3, while the object it
            // made is still there: the listed parts' ETags give the object's ETag.
            Err(GatewayError::NoSuchUpload) => dir
                .object(&input.bucket, &input.key)
                .map_err(s3)?
                .filter(|m| Some(&m.etag) == multipart_etag(&parts).as_ref())
                .ok_or_else(|| s3_error!(NoSuchUpload))?,
            Err(e) => return Err(s3(e)),
        };
        let state = self.versioning(&input.bucket)?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            version_id: written_version(state, &meta),
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(etag(&meta)),
            ..Default::default()
        }))
    }

    async fn upload_part_copy(
        &self,
        req: S3Request<UploadPartCopyInput>,
    ) -> S3Result<S3Response<UploadPartCopyOutput>> {
        let input = req.input;
        if !(1..=10_000).contains(&input.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to 10000"));
        }
        let (src_bucket, src_key, src_version) = match &input.copy_source {
            CopySource::Bucket { bucket, key, version_id } => {
                (bucket.to_string(), key.to_string(), version_id.as_deref().map(str::to_string))
            }
            _ => {
                return Err(s3_error!(NotImplemented, "only bucket/key copy sources are supported"))
            }
        };
        // A version id names the version to copy from, as for CopyObject.
        let (src, _pin) = self.version_for_read(&src_bucket, &src_key, src_version.as_deref())?;
        sse::check_read(&src.metadata, customer_key!(input, copy_source))?;
        Conditions {
            if_match: input.copy_source_if_match.as_ref(),
            if_none_match: input.copy_source_if_none_match.as_ref(),
            if_modified_since: input.copy_source_if_modified_since.as_ref(),
            if_unmodified_since: input.copy_source_if_unmodified_since.as_ref(),
        }
        .check_write(&src)?;
        let range = match &input.copy_source_range {
            Some(r) => copy_range(r, src.size)?,
            None => 0..src.size,
        };
        let rx = self.objects.read_range(&src, range, 0).await.map_err(s3)?;
        let part = self
            .objects
            .upload_part(
                &input.bucket,
                &input.key,
                &input.upload_id,
                input.part_number,
                receiver_stream(rx),
            )
            .await
            .map_err(s3)?;
        Ok(S3Response::new(UploadPartCopyOutput {
            copy_part_result: Some(CopyPartResult {
                e_tag: Some(ETag::Strong(part.etag)),
                last_modified: Some(Timestamp::from(
                    std::time::SystemTime::UNIX_EPOCH
                        + std::time::Duration::from_nanos(part.modified_ns.max(0) as u64),
                )),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    /// Buckets are not versioned: every object is its one version, `null`.
    async fn list_object_versions(
        &self,
        req: S3Request<ListObjectVersionsInput>,
    ) -> S3Result<S3Response<ListObjectVersionsOutput>> {
        let input = req.input;
        let url = url_encoding(input.encoding_type.as_ref())?;
        let enc = encoder(url);
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = max_keys(input.max_keys)?;
        let key_marker = input.key_marker.clone().unwrap_or_default();
        if input.version_id_marker.is_some() && key_marker.is_empty() {
            return Err(s3_error!(
                InvalidArgument,
                "A version-id marker cannot be specified without a key marker."
            ));
        }
        let (entries, truncated, last) = self
            .list_versions(
                &input.bucket,
                &prefix,
                input.delimiter.as_deref(),
                &key_marker,
                input.version_id_marker.as_deref(),
                max,
            )
            .map_err(s3)?;
        let mut versions = Vec::new();
        let mut markers = Vec::new();
        let mut prefixes = Vec::new();
        for e in entries {
            match e {
                VersionEntry::Object(mut o) => {
                    o.key = o.key.map(&enc);
                    versions.push(o);
                }
                VersionEntry::Marker(mut m) => {
                    m.key = m.key.map(&enc);
                    markers.push(m);
                }
                VersionEntry::Prefix(p) => prefixes.push(CommonPrefix { prefix: Some(p) }),
            }
        }
        let (next_key, next_version) = match (truncated, last) {
            (true, Some((k, v))) => (Some(enc(k)), v),
            _ => (None, None),
        };
        Ok(S3Response::new(ListObjectVersionsOutput {
            name: Some(input.bucket),
            prefix: Some(enc(prefix)),
            key_marker: input.key_marker.map(&enc),
            version_id_marker: input.version_id_marker,
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: next_key,
            next_version_id_marker: next_version,
            versions: Some(versions),
            delete_markers: (!markers.is_empty()).then_some(markers),
            common_prefixes: Some(encode_prefixes(prefixes, &enc)),
            delimiter: input.delimiter.filter(|d| !d.is_empty()).map(&enc),
            encoding_type: input.encoding_type,
            ..Default::default()
        }))
    }

    async fn put_bucket_versioning(
        &self,
        req: S3Request<PutBucketVersioningInput>,
    ) -> S3Result<S3Response<PutBucketVersioningOutput>> {
        let input = req.input;
        let c = input.versioning_configuration;
        if c.mfa_delete.as_ref().is_some_and(|m| m.as_str() == MFADelete::ENABLED)
            || input.mfa.is_some()
        {
            return Err(s3_error!(
                NotImplemented,
                "MFA delete is not supported by this gateway (it has no MFA devices)"
            ));
        }
        let state = match c.status.as_ref().map(|s| s.as_str()) {
            Some(BucketVersioningStatus::ENABLED) => Versioning::Enabled,
            Some(BucketVersioningStatus::SUSPENDED) => Versioning::Suspended,
            _ => {
                return Err(s3_error!(
                    MalformedXML,
                    "The versioning status must be Enabled or Suspended"
                ))
            }
        };
        self.objects
            .directory()
            .transact_durable(&[], |tx| {
                if state == Versioning::Suspended
                    && tx.bucket_setting(&input.bucket, crate::lock::SETTING)?.is_some()
                {
                    return Err(GatewayError::InvalidBucketState(
                        "versioning cannot be suspended on a bucket with object lock (object                          lock keeps every version)"
                            .into(),
                    ));
                }
                let mut config = tx.bucket_config(&input.bucket)?;
                config.versioning = state;
                tx.set_bucket_config(&input.bucket, &config)
            })
            .await
            .map_err(s3)?;
        Ok(S3Response::new(PutBucketVersioningOutput::default()))
    }

    async fn get_bucket_versioning(
        &self,
        req: S3Request<GetBucketVersioningInput>,
    ) -> S3Result<S3Response<GetBucketVersioningOutput>> {
        let bucket = &req.input.bucket;
        self.objects.directory().require_bucket(bucket).map_err(s3)?;
        let status = match self.versioning(bucket)? {
            Versioning::Off => None,
            Versioning::Enabled => Some(BucketVersioningStatus::ENABLED),
            Versioning::Suspended => Some(BucketVersioningStatus::SUSPENDED),
        };
        Ok(S3Response::new(GetBucketVersioningOutput {
            status: status.map(BucketVersioningStatus::from_static),
            ..Default::default()
        }))
    }

    async fn get_bucket_acl(
        &self,
        req: S3Request<GetBucketAclInput>,
    ) -> S3Result<S3Response<GetBucketAclOutput>> {
        self.objects.directory().require_bucket(&req.input.bucket).map_err(s3)?;
        Ok(S3Response::new(GetBucketAclOutput {
            owner: Some(acl::owner()),
            grants: Some(acl::grants(self.bucket_acl(&req.input.bucket)?)),
        }))
    }

    async fn put_bucket_acl(
        &self,
        req: S3Request<PutBucketAclInput>,
    ) -> S3Result<S3Response<PutBucketAclOutput>> {
        let i = req.input;
        self.objects.directory().require_bucket(&i.bucket).map_err(s3)?;
        let canned = object_acl!(i, grant_write);
        let canned = acl::check_policy(i.access_control_policy.as_ref())?.unwrap_or(canned);
        self.set_bucket_acl(&i.bucket, canned).await?;
        Ok(S3Response::new(PutBucketAclOutput::default()))
    }

    async fn get_object_acl(
        &self,
        req: S3Request<GetObjectAclInput>,
    ) -> S3Result<S3Response<GetObjectAclOutput>> {
        let i = req.input;
        let (meta, _) = self.version_for_read(&i.bucket, &i.key, i.version_id.as_deref())?;
        Ok(S3Response::new(GetObjectAclOutput {
            owner: Some(acl::owner()),
            grants: Some(acl::grants(crate::sharing::object_acl(&meta.metadata))),
            ..Default::default()
        }))
    }

    async fn put_object_acl(
        &self,
        req: S3Request<PutObjectAclInput>,
    ) -> S3Result<S3Response<PutObjectAclOutput>> {
        let i = req.input;
        self.version_for_read(&i.bucket, &i.key, i.version_id.as_deref())?;
        let canned = object_acl!(i, grant_write);
        let canned = acl::check_policy(i.access_control_policy.as_ref())?.unwrap_or(canned);
        let (bucket, key, version) = (&i.bucket, &i.key, i.version_id.as_deref());
        self.objects
            .directory()
            .transact_durable(&[], |tx| {
                tx.set_object_entries(bucket, key, version, &[acl::entry(canned)])
            })
            .await
            .map_err(s3)?;
        Ok(S3Response::new(PutObjectAclOutput::default()))
    }

    async fn put_bucket_cors(
        &self,
        req: S3Request<PutBucketCorsInput>,
    ) -> S3Result<S3Response<PutBucketCorsOutput>> {
        let i = req.input;
        self.set_cors(&i.bucket, Some(i.cors_configuration)).await?;
        Ok(S3Response::new(PutBucketCorsOutput::default()))
    }

    async fn get_bucket_cors(
        &self,
        req: S3Request<GetBucketCorsInput>,
    ) -> S3Result<S3Response<GetBucketCorsOutput>> {
        let cors_rules = Some(self.cors_rules(&req.input.bucket)?);
        Ok(S3Response::new(GetBucketCorsOutput { cors_rules }))
    }

    async fn delete_bucket_cors(
        &self,
        req: S3Request<DeleteBucketCorsInput>,
    ) -> S3Result<S3Response<DeleteBucketCorsOutput>> {
        self.set_cors(&req.input.bucket, None).await?;
        Ok(S3Response::new(DeleteBucketCorsOutput::default()))
    }

    async fn put_bucket_policy(
        &self,
        req: S3Request<PutBucketPolicyInput>,
    ) -> S3Result<S3Response<PutBucketPolicyOutput>> {
        self.set_bucket_policy(&req.input.bucket, Some(&req.input.policy)).await?;
        Ok(S3Response::new(PutBucketPolicyOutput::default()))
    }

    async fn get_bucket_policy(
        &self,
        req: S3Request<GetBucketPolicyInput>,
    ) -> S3Result<S3Response<GetBucketPolicyOutput>> {
        let policy = Some(self.policy_document(&req.input.bucket)?);
        Ok(S3Response::new(GetBucketPolicyOutput { policy }))
    }

    async fn delete_bucket_policy(
        &self,
        req: S3Request<DeleteBucketPolicyInput>,
    ) -> S3Result<S3Response<DeleteBucketPolicyOutput>> {
        self.set_bucket_policy(&req.input.bucket, None).await?;
        Ok(S3Response::new(DeleteBucketPolicyOutput::default()))
    }

    async fn get_bucket_policy_status(
        &self,
        req: S3Request<GetBucketPolicyStatusInput>,
    ) -> S3Result<S3Response<GetBucketPolicyStatusOutput>> {
        // Public through its policy, or through the bucket's canned ACL.
        let bucket = &req.input.bucket;
        let public = self.bucket_policy(bucket)?.is_some_and(|p| p.is_public())
            || self.bucket_acl(bucket)? != crate::sharing::Canned::Private;
        Ok(S3Response::new(GetBucketPolicyStatusOutput {
            policy_status: Some(PolicyStatus { is_public: Some(public) }),
        }))
    }

    async fn put_bucket_lifecycle_configuration(
        &self,
        req: S3Request<PutBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<PutBucketLifecycleConfigurationOutput>> {
        let input = req.input;
        self.put_lifecycle(&input.bucket, input.lifecycle_configuration).await?;
        Ok(S3Response::new(PutBucketLifecycleConfigurationOutput::default()))
    }

    async fn get_bucket_lifecycle_configuration(
        &self,
        req: S3Request<GetBucketLifecycleConfigurationInput>,
    ) -> S3Result<S3Response<GetBucketLifecycleConfigurationOutput>> {
        Ok(S3Response::new(GetBucketLifecycleConfigurationOutput {
            rules: Some(self.lifecycle_dto(&req.input.bucket)?),
            ..Default::default()
        }))
    }

    async fn delete_bucket_lifecycle(
        &self,
        req: S3Request<DeleteBucketLifecycleInput>,
    ) -> S3Result<S3Response<DeleteBucketLifecycleOutput>> {
        self.objects.directory().require_bucket(&req.input.bucket).map_err(s3)?;
        self.set_lifecycle(&req.input.bucket, None).await?;
        Ok(S3Response::new(DeleteBucketLifecycleOutput::default()))
    }

    async fn put_object_lock_configuration(
        &self,
        req: S3Request<PutObjectLockConfigurationInput>,
    ) -> S3Result<S3Response<PutObjectLockConfigurationOutput>> {
        let input = req.input;
        self.put_lock_configuration(&input.bucket, input.object_lock_configuration).await?;
        Ok(S3Response::new(PutObjectLockConfigurationOutput::default()))
    }

    async fn get_object_lock_configuration(
        &self,
        req: S3Request<GetObjectLockConfigurationInput>,
    ) -> S3Result<S3Response<GetObjectLockConfigurationOutput>> {
        Ok(S3Response::new(GetObjectLockConfigurationOutput {
            object_lock_configuration: Some(self.lock_configuration(&req.input.bucket)?),
        }))
    }

    async fn put_object_retention(
        &self,
        req: S3Request<PutObjectRetentionInput>,
    ) -> S3Result<S3Response<PutObjectRetentionOutput>> {
        let bypass = self.bypasses(&req, req.input.bypass_governance_retention);
        let i = req.input;
        self.put_retention(&i.bucket, &i.key, i.version_id.as_deref(), i.retention, bypass).await?;
        Ok(S3Response::new(PutObjectRetentionOutput::default()))
    }

    async fn get_object_retention(
        &self,
        req: S3Request<GetObjectRetentionInput>,
    ) -> S3Result<S3Response<GetObjectRetentionOutput>> {
        let i = req.input;
        Ok(S3Response::new(GetObjectRetentionOutput {
            retention: Some(self.retention_of(&i.bucket, &i.key, i.version_id.as_deref())?),
        }))
    }

    async fn put_object_legal_hold(
        &self,
        req: S3Request<PutObjectLegalHoldInput>,
    ) -> S3Result<S3Response<PutObjectLegalHoldOutput>> {
        let i = req.input;
        self.put_legal_hold(&i.bucket, &i.key, i.version_id.as_deref(), i.legal_hold).await?;
        Ok(S3Response::new(PutObjectLegalHoldOutput::default()))
    }

    async fn get_object_legal_hold(
        &self,
        req: S3Request<GetObjectLegalHoldInput>,
    ) -> S3Result<S3Response<GetObjectLegalHoldOutput>> {
        let i = req.input;
        Ok(S3Response::new(GetObjectLegalHoldOutput {
            legal_hold: Some(self.legal_hold_of(&i.bucket, &i.key, i.version_id.as_deref())?),
        }))
    }

    async fn put_object_tagging(
        &self,
        req: S3Request<PutObjectTaggingInput>,
    ) -> S3Result<S3Response<PutObjectTaggingOutput>> {
        let input = req.input;
        let tags = from_tag_set(input.tagging);
        check_tags(&tags, MAX_OBJECT_TAGS)?;
        let id = self
            .set_tagging(&input.bucket, &input.key, input.version_id, encode_tags(&tags))
            .await?;
        Ok(S3Response::new(PutObjectTaggingOutput { version_id: id }))
    }

    async fn get_object_tagging(
        &self,
        req: S3Request<GetObjectTaggingInput>,
    ) -> S3Result<S3Response<GetObjectTaggingOutput>> {
        let input = req.input;
        let dir = self.objects.directory();
        dir.require_bucket(&input.bucket).map_err(s3)?;
        let v = dir.version(&input.bucket, &input.key, input.version_id.as_deref()).map_err(s3)?;
        let Some(meta) = v.object.as_ref() else {
            return Err(if input.version_id.is_some() {
                marker_not_allowed(&v)
            } else {
                deleted_key(&v)
            });
        };
        let state = self.versioning(&input.bucket)?;
        Ok(S3Response::new(GetObjectTaggingOutput {
            tag_set: tag_set(stored_tags(meta)),
            version_id: answer_version(state, meta),
        }))
    }

    async fn delete_object_tagging(
        &self,
        req: S3Request<DeleteObjectTaggingInput>,
    ) -> S3Result<S3Response<DeleteObjectTaggingOutput>> {
        let input = req.input;
        let id = self.set_tagging(&input.bucket, &input.key, input.version_id, None).await?;
        Ok(S3Response::with_status(
            DeleteObjectTaggingOutput { version_id: id },
            hyper::StatusCode::NO_CONTENT,
        ))
    }

    async fn put_bucket_tagging(
        &self,
        req: S3Request<PutBucketTaggingInput>,
    ) -> S3Result<S3Response<PutBucketTaggingOutput>> {
        let input = req.input;
        let tags = from_tag_set(input.tagging);
        check_tags(&tags, MAX_BUCKET_TAGS)?;
        self.set_bucket_tags(&input.bucket, encode_tags(&tags)).await?;
        Ok(S3Response::with_status(
            PutBucketTaggingOutput::default(),
            hyper::StatusCode::NO_CONTENT,
        ))
    }

    async fn get_bucket_tagging(
        &self,
        req: S3Request<GetBucketTaggingInput>,
    ) -> S3Result<S3Response<GetBucketTaggingOutput>> {
        let dir = self.objects.directory();
        dir.require_bucket(&req.input.bucket).map_err(s3)?;
        let config = dir.bucket_config(&req.input.bucket).map_err(s3)?;
        let Some(tags) = config.tags else {
            return Err(s3_error!(NoSuchTagSet, "The TagSet does not exist"));
        };
        let tags: Vec<(String, String)> = serde_urlencoded::from_str(&tags).unwrap_or_default();
        Ok(S3Response::new(GetBucketTaggingOutput { tag_set: tag_set(tags) }))
    }

    async fn delete_bucket_tagging(
        &self,
        req: S3Request<DeleteBucketTaggingInput>,
    ) -> S3Result<S3Response<DeleteBucketTaggingOutput>> {
        self.set_bucket_tags(&req.input.bucket, None).await?;
        Ok(S3Response::with_status(
            DeleteBucketTaggingOutput::default(),
            hyper::StatusCode::NO_CONTENT,
        ))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        self.objects.abort_upload(&input.bucket, &input.key, &input.upload_id).await.map_err(s3)?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let input = req.input;
        let up = self
            .objects
            .directory()
            .upload(&input.upload_id)
            .map_err(s3)?
            .ok_or_else(|| s3_error!(NoSuchUpload))?;
        if up.bucket != input.bucket || up.key != input.key {
            return Err(s3_error!(NoSuchUpload));
        }
        let after = input.part_number_marker.unwrap_or(0);
        let max =
            input.max_parts.map(|m| m.clamp(0, MAX_PARTS as i32) as usize).unwrap_or(MAX_PARTS);
        let (page, truncated) = parts_page(&up.parts, after, max);
        let next_marker = page.last().map(|(n, _)| *n);
        let parts = page
            .into_iter()
            .map(|(n, p)| s3s::dto::Part {
                part_number: Some(n),
                e_tag: Some(ETag::Strong(p.etag.clone())),
                size: Some(p.extent.len as i64),
                last_modified: Some(Timestamp::from(
                    std::time::SystemTime::UNIX_EPOCH
                        + std::time::Duration::from_nanos(p.modified_ns.max(0) as u64),
                )),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            parts: Some(parts),
            part_number_marker: input.part_number_marker,
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            next_part_number_marker: if truncated { next_marker } else { None },
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let input = req.input;
        self.objects.directory().require_bucket(&input.bucket).map_err(s3)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let uploads = self
            .objects
            .directory()
            .uploads()
            .map_err(s3)?
            .into_iter()
            .filter(|(_, u)| u.bucket == input.bucket && u.key.starts_with(&prefix))
            .map(|(id, u)| MultipartUpload {
                key: Some(u.key),
                upload_id: Some(id),
                initiated: Some(Timestamp::from(
                    std::time::SystemTime::UNIX_EPOCH
                        + std::time::Duration::from_nanos(u.created_ns.max(0) as u64),
                )),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(input.bucket),
            prefix: input.prefix,
            uploads: Some(uploads),
            is_truncated: Some(false),
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::{Directory, ObjectMeta};
    use blindfold_crypto::{MasterKey, StoreId};
    use blindfold_oram::PathOramConfig;
    use blindfold_proxy::{DurablePathOram, SealedPathOram};
    use blindfold_store::MemoryStore;

    async fn gateway(keys: &[&str]) -> (Gateway, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let config = PathOramConfig::builder(64, 64).build().unwrap();
        let store = Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
        let engine = DurablePathOram::create(
            &dir.path().join("oram"),
            config,
            store,
            &MasterKey::generate(),
            StoreId::random(),
        )
        .await
        .unwrap();
        let directory = Directory::open(
            &dir.path().join("meta.redb"),
            64,
            &blindfold_crypto::MasterKey::generate(),
        )
        .unwrap();
        directory.create_bucket("b").unwrap();
        directory
            .transact(&[], |tx| {
                for k in keys {
                    tx.put_object("b", k, &ObjectMeta::default())?;
                }
                Ok(())
            })
            .unwrap();
        let layer = Arc::new(ObjectLayer::new(directory, engine, false));
        (Gateway::new(layer), dir)
    }

    fn req<T>(input: T) -> S3Request<T> {
        S3Request {
            input,
            method: hyper::Method::GET,
            uri: hyper::Uri::from_static("/"),
            headers: Default::default(),
            extensions: Default::default(),
            credentials: None,
            region: None,
            service: None,
            trailing_headers: None,
        }
    }

    fn blob(data: &[u8]) -> Option<StreamingBlob> {
        Some(StreamingBlob::from(s3s::Body::from(bytes::Bytes::copy_from_slice(data))))
    }

    async fn read(body: Option<StreamingBlob>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut body = body.unwrap();
        while let Some(chunk) = body.next().await {
            out.extend_from_slice(&chunk.unwrap());
        }
        out
    }

    fn code<T: std::fmt::Debug>(r: S3Result<T>) -> S3ErrorCode {
        r.expect_err("an error").code().clone()
    }

    /// A gateway with room for a few 5 MiB parts (64 KiB blocks).
    async fn roomy() -> (Gateway, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let config = PathOramConfig::builder(512, 64 << 10).build().unwrap();
        let store = Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
        let key = MasterKey::generate();
        let engine = DurablePathOram::create(
            &dir.path().join("oram"),
            config,
            store,
            &key,
            StoreId::random(),
        )
        .await
        .unwrap();
        let directory = Directory::open(&dir.path().join("meta.redb"), 512, &key).unwrap();
        directory.create_bucket("b").unwrap();
        let layer = Arc::new(ObjectLayer::new(directory, engine, false));
        (Gateway::new(layer), dir)
    }

    /// A GET that meets a tampered cell names the object to its client (not in the log).
    #[tokio::test]
    async fn an_integrity_failure_names_the_object_to_its_client() {
        let dir = tempfile::tempdir().unwrap();
        let config = PathOramConfig::builder(64, 1024).build().unwrap();
        let store = Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
        let key = MasterKey::generate();
        let engine = DurablePathOram::create(
            &dir.path().join("oram"),
            config,
            store.clone(),
            &key,
            StoreId::random(),
        )
        .await
        .unwrap();
        let directory = Directory::open(&dir.path().join("meta.redb"), 64, &key).unwrap();
        directory.create_bucket("b").unwrap();
        let layer = Arc::new(ObjectLayer::new(directory, engine, false));
        let g = Gateway::new(layer);
        put(&g, "photos/cat.jpg", &[7u8; 3000]).await;
        // The root bucket is on every path.
        let root = blindfold_store::CellId(0);
        let mut cell = blindfold_store::Store::read(&*store, &[root]).await.unwrap().pop().unwrap();
        cell[40] ^= 1;
        blindfold_store::Store::write(&*store, vec![(root, cell)]).await.unwrap();
        let err = g.get_object(req(get_input("photos/cat.jpg"))).await.expect_err("tampered");
        let msg = err.message().unwrap_or_default().to_owned();
        assert!(msg.contains("b/photos/cat.jpg") && msg.contains("blindfold verify"), "{msg}");
    }

    async fn put(g: &Gateway, key: &str, data: &[u8]) -> ETag {
        let input = PutObjectInput {
            bucket: "b".into(),
            key: key.into(),
            body: blob(data),
            ..Default::default()
        };
        g.put_object(req(input)).await.unwrap().output.e_tag.unwrap()
    }

    fn get_input(key: &str) -> GetObjectInput {
        GetObjectInput { bucket: "b".into(), key: key.into(), ..Default::default() }
    }

    fn source(key: &str) -> CopySource {
        CopySource::Bucket { bucket: "b".into(), key: key.into(), version_id: None }
    }

    fn copy_input(from: &str, to: &str) -> CopyObjectInput {
        let b = CopyObjectInput::builder().bucket("b".into()).key(to.into());
        b.copy_source(source(from)).build().unwrap()
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from(time::OffsetDateTime::from_unix_timestamp(secs).unwrap())
    }

    #[tokio::test]
    async fn reads_honour_dates_and_etags_in_rfc_order() {
        let (g, _d) = roomy().await;
        let tag = put(&g, "k", b"data").await;
        let meta = g.objects.directory().object("b", "k").unwrap().unwrap();
        let t = (meta.modified_ns / 1_000_000_000) as i64;
        let other = ETagCondition::ETag(ETag::Strong("0000".into()));
        let ours = ETagCondition::ETag(tag.clone());
        let get = |f: fn(&mut GetObjectInput, i64, &ETagCondition, &ETagCondition)| {
            let mut input = get_input("k");
            f(&mut input, t, &ours, &other);
            g.get_object(req(input))
        };
        // If-Modified-Since: not modified since its own Last-Modified (304), modified since
        // a second earlier.
        assert_eq!(
            code(get(|i, t, _, _| i.if_modified_since = Some(at(t))).await),
            S3ErrorCode::NotModified
        );
        assert!(get(|i, t, _, _| i.if_modified_since = Some(at(t - 1))).await.is_ok());
        // If-Unmodified-Since: fails for a second before, holds from Last-Modified on.
        assert_eq!(
            code(get(|i, t, _, _| i.if_unmodified_since = Some(at(t - 1))).await),
            S3ErrorCode::PreconditionFailed
        );
        assert!(get(|i, t, _, _| i.if_unmodified_since = Some(at(t))).await.is_ok());
        // A matching If-Match overrides a failing If-Unmodified-Since; a non-matching
        // If-None-Match overrides a failing If-Modified-Since.
        assert!(get(|i, t, ours, _| {
            i.if_match = Some(ours.clone());
            i.if_unmodified_since = Some(at(t - 1));
        })
        .await
        .is_ok());
        assert!(get(|i, t, _, other| {
            i.if_none_match = Some(other.clone());
            i.if_modified_since = Some(at(t));
        })
        .await
        .is_ok());
        // HEAD answers the same.
        let head = HeadObjectInput {
            bucket: "b".into(),
            key: "k".into(),
            if_modified_since: Some(at(t)),
            ..Default::default()
        };
        assert_eq!(code(g.head_object(req(head)).await), S3ErrorCode::NotModified);
    }

    #[tokio::test]
    async fn conditional_writes() {
        let (g, _d) = roomy().await;
        let tag = put(&g, "k", b"one").await;
        // If-None-Match with the current ETag refuses the PUT.
        let input = PutObjectInput {
            bucket: "b".into(),
            key: "k".into(),
            body: blob(b"two"),
            if_none_match: Some(ETagCondition::ETag(tag.clone())),
            ..Default::default()
        };
        assert_eq!(code(g.put_object(req(input)).await), S3ErrorCode::PreconditionFailed);
        // If-Match on a key with no object: NoSuchKey, as S3 answers.
        let input = PutObjectInput {
            bucket: "b".into(),
            key: "missing".into(),
            body: blob(b"two"),
            if_match: Some(ETagCondition::Any),
            ..Default::default()
        };
        assert_eq!(code(g.put_object(req(input)).await), S3ErrorCode::NoSuchKey);
        // Copy-source conditions: a matching If-None-Match and a future If-Modified-Since
        // both refuse the copy with 412.
        let copy = |f: fn(&mut CopyObjectInput, &ETag)| {
            let mut input = copy_input("k", "dst");
            f(&mut input, &tag);
            g.copy_object(req(input))
        };
        assert_eq!(
            code(
                copy(|i, t| i.copy_source_if_none_match = Some(ETagCondition::ETag(t.clone())))
                    .await
            ),
            S3ErrorCode::PreconditionFailed
        );
        assert_eq!(
            code(copy(|i, _| i.copy_source_if_modified_since = Some(at(4_102_444_800))).await),
            S3ErrorCode::PreconditionFailed
        );
        assert!(copy(|i, _| i.copy_source_if_unmodified_since = Some(at(4_102_444_800)))
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn standard_headers_are_kept_and_returned() {
        let (g, _d) = roomy().await;
        let expires = at(4_102_444_800);
        let mut metadata = Metadata::new();
        metadata.insert("user".into(), "yes".into());
        let input = PutObjectInput {
            bucket: "b".into(),
            key: "k".into(),
            body: blob(b"x"),
            cache_control: Some("no-cache".into()),
            content_disposition: Some("attachment".into()),
            content_encoding: Some("gzip, aws-chunked".into()),
            content_language: Some("eo".into()),
            expires: Some(expires.clone()),
            metadata: Some(metadata.clone()),
            ..Default::default()
        };
        g.put_object(req(input)).await.unwrap();
        let head = HeadObjectInput { bucket: "b".into(), key: "k".into(), ..Default::default() };
        let h = g.head_object(req(head.clone())).await.unwrap().output;
        assert_eq!(h.cache_control.as_deref(), Some("no-cache"));
        assert_eq!(h.content_disposition.as_deref(), Some("attachment"));
        assert_eq!(h.content_encoding.as_deref(), Some("gzip"));
        assert_eq!(h.content_language.as_deref(), Some("eo"));
        assert_eq!(h.expires, Some(expires));
        assert_eq!(h.metadata, Some(metadata));
        // response-* parameters override them on GET.
        let input = GetObjectInput {
            response_cache_control: Some("max-age=1".into()),
            response_content_type: Some("foo/bar".into()),
            ..get_input("k")
        };
        let o = g.get_object(req(input)).await.unwrap().output;
        assert_eq!(o.cache_control.as_deref(), Some("max-age=1"));
        assert_eq!(o.content_type.as_deref(), Some("foo/bar"));
        assert_eq!(o.content_language.as_deref(), Some("eo"));
        // Copying onto itself needs a metadata REPLACE, which replaces them.
        let copy = |replace: bool| CopyObjectInput {
            metadata_directive: replace
                .then(|| MetadataDirective::from_static(MetadataDirective::REPLACE)),
            cache_control: Some("private".into()),
            ..copy_input("k", "k")
        };
        assert_eq!(code(g.copy_object(req(copy(false))).await), S3ErrorCode::InvalidRequest);
        g.copy_object(req(copy(true))).await.unwrap();
        let h = g.head_object(req(head)).await.unwrap().output;
        assert_eq!(h.cache_control.as_deref(), Some("private"));
        assert_eq!((h.content_language, h.metadata), (None, None));
    }

    #[test]
    fn copy_source_ranges() {
        assert_eq!(copy_range("bytes=0-4", 5).unwrap(), 0..5);
        assert_eq!(copy_range("bytes=2-2", 5).unwrap(), 2..3);
        assert_eq!(code(copy_range("bytes=0-21", 5)), S3ErrorCode::InvalidRange);
        for bad in [
            "0-2",
            "bytes=0",
            "bytes=hello-world",
            "bytes=0-bar",
            "bytes=hello-",
            "bytes=0-",
            "bytes=-2",
            "bytes=0-2,3-5",
            "bytes=3-2",
            "bytes=+1-2",
        ] {
            assert_eq!(code(copy_range(bad, 5)), S3ErrorCode::InvalidArgument, "{bad}");
        }
    }

    async fn start_upload(g: &Gateway, key: &str) -> String {
        let input = CreateMultipartUploadInput {
            bucket: "b".into(),
            key: key.into(),
            ..Default::default()
        };
        g.create_multipart_upload(req(input)).await.unwrap().output.upload_id.unwrap()
    }

    async fn part(g: &Gateway, key: &str, id: &str, n: i32, data: &[u8]) -> CompletedPart {
        let input = UploadPartInput {
            bucket: "b".into(),
            key: key.into(),
            upload_id: id.into(),
            part_number: n,
            body: blob(data),
            ..Default::default()
        };
        let tag = g.upload_part(req(input)).await.unwrap().output.e_tag;
        CompletedPart { part_number: Some(n), e_tag: tag, ..Default::default() }
    }

    fn complete(key: &str, id: &str, parts: Vec<CompletedPart>) -> CompleteMultipartUploadInput {
        CompleteMultipartUploadInput {
            bucket: "b".into(),
            key: key.into(),
            upload_id: id.into(),
            multipart_upload: Some(CompletedMultipartUpload { parts: Some(parts) }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn multipart_rules() {
        let (g, _d) = roomy().await;
        // Parts under 5 MiB are refused unless last.
        let id = start_upload(&g, "small").await;
        let parts =
            vec![part(&g, "small", &id, 1, b"a").await, part(&g, "small", &id, 2, b"b").await];
        assert_eq!(
            code(g.complete_multipart_upload(req(complete("small", &id, parts.clone()))).await),
            S3ErrorCode::EntityTooSmall
        );
        let big = vec![7u8; 5 << 20];
        let parts = vec![part(&g, "small", &id, 1, &big).await, parts[1].clone()];
        g.complete_multipart_upload(req(complete("small", &id, parts.clone()))).await.unwrap();
        // Completing it again answers the same object.
        let again = g.complete_multipart_upload(req(complete("small", &id, parts))).await.unwrap();
        assert_eq!(
            again.output.e_tag,
            Some(etag(&g.objects.directory().object("b", "small").unwrap().unwrap()))
        );
        // If-None-Match: * refuses to complete onto an existing key.
        let id = start_upload(&g, "small").await;
        let parts = vec![part(&g, "small", &id, 1, b"c").await];
        let input = CompleteMultipartUploadInput {
            if_none_match: Some(ETagCondition::Any),
            ..complete("small", &id, parts)
        };
        assert_eq!(
            code(g.complete_multipart_upload(req(input)).await),
            S3ErrorCode::PreconditionFailed
        );
    }

    #[tokio::test]
    async fn upload_part_copy_with_and_without_ranges() {
        let (g, _d) = roomy().await;
        put(&g, "src", b"0123456789").await;
        let id = start_upload(&g, "dst").await;
        let copy = |n: i32, range: Option<&str>| {
            let b = UploadPartCopyInput::builder().bucket("b".into()).key("dst".into());
            let b = b.upload_id(id.clone()).part_number(n).copy_source(source("src"));
            UploadPartCopyInput { copy_source_range: range.map(String::from), ..b.build().unwrap() }
        };
        let whole = g.upload_part_copy(req(copy(1, None))).await.unwrap().output;
        let tail = g.upload_part_copy(req(copy(2, Some("bytes=7-9")))).await.unwrap().output;
        assert_eq!(
            code(g.upload_part_copy(req(copy(3, Some("bytes=5-10")))).await),
            S3ErrorCode::InvalidRange
        );
        assert_eq!(
            code(g.upload_part_copy(req(copy(3, Some("bytes=5-")))).await),
            S3ErrorCode::InvalidArgument
        );
        // The first part is under 5 MiB, so complete through the object layer.
        let parts: Vec<(i32, Option<String>)> = [whole, tail]
            .into_iter()
            .zip(1..)
            .map(|(o, n)| (n, o.copy_part_result.unwrap().e_tag.map(|t| t.value().to_string())))
            .collect();
        g.objects.complete_upload("b", "dst", &id, &parts).await.unwrap();
        let o = g.get_object(req(get_input("dst"))).await.unwrap().output;
        assert_eq!(read(o.body).await, b"0123456789789");
    }

    #[tokio::test]
    async fn listing_details() {
        let keys = ["a b/1", "a+b", "c%d", "e/f"];
        let (g, _d) = gateway(&keys).await;
        let v2 = |f: fn(&mut ListObjectsV2Input)| {
            let mut input = ListObjectsV2Input { bucket: "b".into(), ..Default::default() };
            f(&mut input);
            g.list_objects_v2(req(input))
        };
        let l = v2(|i| {
            i.delimiter = Some("/".into());
            i.encoding_type = Some(EncodingType::from_static(EncodingType::URL));
        })
        .await
        .unwrap()
        .output;
        let keys: Vec<_> = l.contents.unwrap().into_iter().map(|o| o.key.unwrap()).collect();
        assert_eq!(keys, ["a%2Bb", "c%25d"]);
        let prefixes: Vec<_> =
            l.common_prefixes.unwrap().into_iter().map(|p| p.prefix.unwrap()).collect();
        assert_eq!(prefixes, ["a%20b/", "e/"]);
        // max-keys=0: nothing, not truncated. An empty delimiter is no delimiter, not echoed.
        let l = v2(|i| i.max_keys = Some(0)).await.unwrap().output;
        assert_eq!((l.contents.unwrap().len(), l.is_truncated), (0, Some(false)));
        let l = v2(|i| i.delimiter = Some(String::new())).await.unwrap().output;
        assert_eq!((l.contents.unwrap().len(), l.delimiter), (4, None));
        // v1 always answers a Marker.
        let input = ListObjectsInput { bucket: "b".into(), ..Default::default() };
        assert_eq!(g.list_objects(req(input)).await.unwrap().output.marker.as_deref(), Some(""));
        // Every object is its one version, null.
        let input =
            ListObjectVersionsInput { bucket: "b".into(), max_keys: Some(3), ..Default::default() };
        let v = g.list_object_versions(req(input)).await.unwrap().output;
        assert_eq!(v.versions.unwrap().len(), 3);
        assert_eq!((v.is_truncated, v.next_key_marker.as_deref()), (Some(true), Some("c%d")));
        // DeleteObjects names at most 1000 keys.
        let many = (0..1001).map(|i| ObjectIdentifier { key: i.to_string(), ..Default::default() });
        let delete = Delete { objects: many.collect(), quiet: None };
        let input =
            DeleteObjectsInput::builder().bucket("b".into()).delete(delete).build().unwrap();
        assert_eq!(code(g.delete_objects(req(input)).await), S3ErrorCode::MalformedXML);
    }

    #[tokio::test]
    async fn buckets_are_listed_in_pages() {
        let (g, _d) = gateway(&[]).await;
        for name in ["c", "a"] {
            g.objects.directory().create_bucket(name).unwrap();
        }
        let page = |token: Option<String>| ListBucketsInput {
            max_buckets: Some(2),
            continuation_token: token,
            ..Default::default()
        };
        let first = g.list_buckets(req(page(None))).await.unwrap().output;
        let names = |o: &ListBucketsOutput| -> Vec<String> {
            o.buckets.clone().unwrap().into_iter().map(|b| b.name.unwrap()).collect()
        };
        assert_eq!(names(&first), ["a", "b"]);
        let second =
            g.list_buckets(req(page(first.continuation_token.clone()))).await.unwrap().output;
        assert_eq!(names(&second), ["c"]);
        assert_eq!(second.continuation_token, None);
    }

    fn names(l: &Listing) -> (Vec<String>, Vec<String>) {
        (
            l.objects.iter().map(|o| o.key.clone().unwrap()).collect(),
            l.prefixes.iter().map(|p| p.prefix.clone().unwrap()).collect(),
        )
    }

    #[test]
    fn parts_are_listed_in_pages() {
        let parts: BTreeMap<i32, Part> = [1, 2, 3, 5, 8].map(|n| (n, Part::default())).into();
        let numbers = |(page, more): (Vec<(i32, &Part)>, bool)| {
            (page.into_iter().map(|(n, _)| n).collect::<Vec<_>>(), more)
        };
        assert_eq!(numbers(parts_page(&parts, 0, 1000)), (vec![1, 2, 3, 5, 8], false));
        assert_eq!(numbers(parts_page(&parts, 0, 2)), (vec![1, 2], true));
        assert_eq!(numbers(parts_page(&parts, 2, 2)), (vec![3, 5], true));
        assert_eq!(numbers(parts_page(&parts, 5, 2)), (vec![8], false));
        assert_eq!(numbers(parts_page(&parts, 3, 2)), (vec![5, 8], false));
        assert_eq!(numbers(parts_page(&parts, 8, 2)), (vec![], false));
        assert_eq!(numbers(parts_page(&parts, i32::MAX, 2)), (vec![], false));
        assert_eq!(numbers(parts_page(&parts, 0, 0)), (vec![], true));
    }

    #[tokio::test]
    async fn listing_with_delimiters_and_pages() {
        let keys = ["a", "d/1", "d/2", "d/x/3", "e/1", "f", "f/"];
        let (g, _d) = gateway(&keys).await;
        // No delimiter, and an empty delimiter (rclone, restic), list everything.
        for d in [None, Some("")] {
            let l = g.list("b", "", d, "", 1000).unwrap();
            assert_eq!(names(&l).0, keys.to_vec());
            assert!(!l.truncated);
        }
        let l = g.list("b", "", Some("/"), "", 1000).unwrap();
        assert_eq!(
            names(&l),
            (vec!["a".into(), "f".into()], vec!["d/".into(), "e/".into(), "f/".into()])
        );
        let l = g.list("b", "d/", Some("/"), "", 1000).unwrap();
        assert_eq!(names(&l), (vec!["d/1".into(), "d/2".into()], vec!["d/x/".into()]));
        // Pages of two, continuing from the last entry (a common prefix included), must visit
        // every entry exactly once.
        let mut seen = Vec::new();
        let mut after = String::new();
        loop {
            let l = g.list("b", "", Some("/"), &after, 2).unwrap();
            let (o, p) = names(&l);
            seen.extend(o);
            seen.extend(p);
            if !l.truncated {
                break;
            }
            after = l.last.clone().unwrap();
        }
        seen.sort();
        assert_eq!(seen, vec!["a", "d/", "e/", "f", "f/"]);
        // Start-after in the middle.
        let l = g.list("b", "", None, "d/2", 1000).unwrap();
        assert_eq!(names(&l).0, vec!["d/x/3", "e/1", "f", "f/"]);
        assert!(matches!(g.list("nope", "", None, "", 10), Err(GatewayError::NoSuchBucket)));
    }
}
