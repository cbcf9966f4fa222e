//! The S3 front end's HTTP plumbing: requests refused before `s3s` sees them, bodies without
//! a length, operation names for the metrics, error messages that say what to do, and the
//! plain and TLS serving loops.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::objects::ObjectLayer;
use crate::observe::Observer;
use crate::open::Opened;
use crate::recovery::write_snapshot;
use crate::s3::Gateway;
use crate::Result;

/// Why the gateway refuses a request before `s3s` authenticates it, if it does.
///
/// `s3s` compares legacy SigV2 signatures with ordinary equality (a timing side channel), so
/// nothing it would authenticate as SigV2 may reach it. This mirrors how `s3s` 0.14 picks the
/// scheme (`SignatureContext::check`), on the request as `s3s` parses it, erring towards refusal:
///
/// - a POST with a `multipart/form-data` body (a browser-form upload) is authenticated from
///   its form fields, as SigV2 when it has a `signature` field and no `x-amz-signature`. The
///   fields are known only once the body has been read, so every form POST is refused;
/// - a query string that, decoded as `s3s` decodes it, has a parameter named `Signature`
///   (a SigV2 presigned URL; `s3s` tries it before `X-Amz-Signature`);
/// - an `Authorization` header in the SigV2 form `AWS <access key>:<signature>`.
pub fn refusal<B>(req: &hyper::Request<B>) -> Option<&'static str> {
    let headers = |name| req.headers().get_all(name).into_iter().map(|v| v.as_bytes());
    let form = req.method() == hyper::Method::POST
        && headers(hyper::header::CONTENT_TYPE).any(|v| {
            let v = String::from_utf8_lossy(v).trim().to_ascii_lowercase();
            v.starts_with("multipart/form-data")
        });
    if form {
        return Some(
            "Browser-form (POST) uploads are not accepted; upload with a SigV4-signed PUT",
        );
    }
    // A query that does not decode is refused by `s3s` (InvalidURI) before any signature check.
    let query_v2 = req.uri().query().is_some_and(|q| {
        serde_urlencoded::from_str::<Vec<(String, String)>>(q)
            .is_ok_and(|pairs| pairs.iter().any(|(name, _)| name == "Signature"))
    });
    let header_v2 = headers(hyper::header::AUTHORIZATION).any(|v| v.starts_with(b"AWS "));
    (query_v2 || header_v2)
        .then_some("Signature Version 2 is not accepted; sign requests with SigV4")
}

fn refused(message: &str) -> s3s::HttpResponse {
    error_response(hyper::StatusCode::FORBIDDEN, "AccessDenied", message)
}

/// An S3 error answered by the gateway itself, before `s3s`.
fn error_response(status: hyper::StatusCode, code: &str, message: &str) -> s3s::HttpResponse {
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code>\
         <Message>{message}</Message></Error>"
    );
    let mut resp = hyper::Response::new(s3s::Body::from(xml));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/xml"),
    );
    resp
}

/// The most a request body sent without a length (chunked transfer encoding, no
/// `Content-Length`) may hold.
pub const UNSIZED_BODY_LIMIT: usize = 16 << 20;

/// Whether a request body comes without the length `s3s` needs to check its payload hash:
/// chunked transfer encoding, no `Content-Length`, and no `aws-chunked` framing (which
/// carries its own decoded length). Such a body is read into memory first, up to
/// [`UNSIZED_BODY_LIMIT`].
fn needs_length(req: &hyper::Request<hyper::body::Incoming>) -> bool {
    use hyper::body::Body as _;
    let headers = req.headers();
    let streaming = headers
        .get("x-amz-content-sha256")
        .is_some_and(|v| v.as_bytes().starts_with(b"STREAMING-"));
    !headers.contains_key(hyper::header::CONTENT_LENGTH)
        && !streaming
        && !req.body().is_end_stream()
        && req.body().size_hint().exact().is_none()
}

/// Why a body without a length was not read.
#[derive(Debug)]
enum UnsizedBody {
    TooLarge,
    Broken,
}

/// Reads a whole body of at most `limit` bytes.
async fn read_limited(
    mut body: hyper::body::Incoming,
    limit: usize,
) -> std::result::Result<bytes::Bytes, UnsizedBody> {
    use hyper::body::Body as _;
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|_| UnsizedBody::Broken)?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(UnsizedBody::TooLarge);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}

fn unsized_refused(e: UnsizedBody) -> s3s::HttpResponse {
    match e {
        UnsizedBody::TooLarge => error_response(
            hyper::StatusCode::LENGTH_REQUIRED,
            "MissingContentLength",
            "A body sent without Content-Length may hold at most 16 MiB; send Content-Length",
        ),
        UnsizedBody::Broken => error_response(
            hyper::StatusCode::BAD_REQUEST,
            "IncompleteBody",
            "The request body could not be read to its end",
        ),
    }
}

/// Whether a request asks for `100 Continue` before it sends its body.
fn expects_continue<B>(req: &hyper::Request<B>) -> bool {
    req.headers()
        .get(hyper::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// A request body that records whether it was read to its end.
#[derive(Debug)]
struct TrackedBody {
    inner: hyper::body::Incoming,
    read_all: Arc<AtomicBool>,
    observer: Arc<Observer>,
}

impl http_body::Body for TrackedBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<std::result::Result<http_body::Frame<bytes::Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.observer.s3_received(data.len() as u64);
            }
        }
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => self.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            self.read_all.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Answers one HTTP request: what [`refusal`] names is refused, everything else goes to the S3 service.
///
/// The response says `Connection: close` when the connection cannot carry another request
/// cleanly (RFC 9110 §10.1.1):
///
/// - the request body was not read to its end (a request refused before its body, such as a
///   bad signature or an unknown upload id): hyper then closes the connection rather than
///   wait for a body that a client sending `Expect: 100-continue` will never send, and a
///   client must know before it reuses the connection;
/// - the request said `Expect: 100-continue` but has an empty body. hyper never sends
///   `100 Continue` for an empty body, only the final response (RFC 9110 allows it); botocore
///   (the aws CLI, boto3, git-remote-s3) then keeps that response's status line on the
///   connection and misreads the next response on it, so the next PUT hangs until its read
///   timeout (60 s). Closing makes botocore drop the connection and that state with it.
async fn handle(
    service: s3s::service::S3Service,
    observer: Arc<Observer>,
    objects: Arc<ObjectLayer>,
    req: hyper::Request<hyper::body::Incoming>,
) -> std::result::Result<s3s::HttpResponse, s3s::HttpError> {
    let started = std::time::Instant::now();
    let operation = s3_operation(&req);
    let name = observer.recording().then(|| object_name(req.uri().path()));
    // A HEAD answer carries the object's Content-Length but no body.
    let head = req.method() == hyper::Method::HEAD;
    let resp = if req.method() == hyper::Method::OPTIONS {
        let mut resp = preflight(&objects, &req);
        // Its body (a preflight has none) is not read: the connection cannot carry another.
        if !hyper::body::Body::is_end_stream(req.body()) {
            resp.headers_mut().insert(
                hyper::header::CONNECTION,
                hyper::header::HeaderValue::from_static("close"),
            );
        }
        resp
    } else {
        let allowed = cors_allowed(&objects, &req);
        let mut resp = handle_inner(service, Arc::clone(&observer), req).await?;
        if let Some(a) = allowed {
            cors_headers(resp.headers_mut(), &a);
        }
        resp
    };
    let sent = resp
        .headers()
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .filter(|_| !head)
        .unwrap_or(0);
    observer.s3_sent(sent);
    observer.s3(operation, resp.status().as_u16(), started.elapsed(), name);
    Ok(resp)
}

/// The bucket a path-style request names (empty at the root), decoded.
fn bucket_of(path: &str) -> String {
    let first = path.trim_start_matches('/').split('/').next().unwrap_or_default();
    percent_encoding::percent_decode_str(first).decode_utf8_lossy().into_owned()
}

/// The CORS rules of the bucket a request names (`None`: none, or no such bucket).
fn cors_rules<B>(objects: &ObjectLayer, req: &hyper::Request<B>) -> Option<crate::cors::Rules> {
    let bucket = bucket_of(req.uri().path());
    if bucket.is_empty() {
        return None;
    }
    let doc = objects.directory().bucket_setting(&bucket, crate::cors::SETTING).ok()??;
    match crate::directory::parse_setting(Some(doc), crate::cors::SETTING) {
        Ok(rules) => rules,
        Err(e) => {
            tracing::error!(error = %e, "a bucket's CORS rules are unreadable; CORS is off for it");
            None
        }
    }
}

fn header<'a, B>(req: &'a hyper::Request<B>, name: &str) -> Option<&'a str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// What the bucket's CORS rules allow an ordinary request with an `Origin` header (its method,
/// or the one `Access-Control-Request-Method` names).
fn cors_allowed<B>(objects: &ObjectLayer, req: &hyper::Request<B>) -> Option<crate::cors::Allowed> {
    let origin = header(req, "origin")?;
    let method = header(req, "access-control-request-method").unwrap_or(req.method().as_str());
    cors_rules(objects, req)?.allow(origin, method, &[])
}

fn cors_headers(h: &mut hyper::HeaderMap, a: &crate::cors::Allowed) {
    use hyper::header::{self, HeaderValue};
    let mut set = |name: header::HeaderName, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            h.insert(name, v);
        }
    };
    set(header::ACCESS_CONTROL_ALLOW_ORIGIN, &a.origin);
    set(header::ACCESS_CONTROL_ALLOW_METHODS, &a.methods);
    if let Some(v) = &a.headers {
        set(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
    }
    if let Some(v) = &a.expose {
        set(header::ACCESS_CONTROL_EXPOSE_HEADERS, v);
    }
    if let Some(v) = a.max_age {
        set(header::ACCESS_CONTROL_MAX_AGE, &v.to_string());
    }
    if a.origin != "*" {
        h.append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

/// The answer to a CORS preflight (`OPTIONS`), from the bucket's rules alone: no S3 operation
/// runs and no signature is needed, as browsers send none.
fn preflight<B>(objects: &ObjectLayer, req: &hyper::Request<B>) -> s3s::HttpResponse {
    use hyper::StatusCode;
    let (Some(origin), Some(method)) =
        (header(req, "origin"), header(req, "access-control-request-method"))
    else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "OPTIONS answers CORS preflights only, which need the Origin and \
             Access-Control-Request-Method headers",
        );
    };
    let Some(rules) = cors_rules(objects, req) else {
        return error_response(
            StatusCode::FORBIDDEN,
            "CORSResponse",
            "CORSResponse: this bucket has no CORS rules (add them with PutBucketCors)",
        );
    };
    let wanted = crate::cors::requested_headers(header(req, "access-control-request-headers"));
    match rules.allow(origin, method, &wanted) {
        Some(a) => {
            let mut resp = hyper::Response::new(s3s::Body::empty());
            cors_headers(resp.headers_mut(), &a);
            resp
        }
        None => error_response(
            StatusCode::FORBIDDEN,
            "CORSResponse",
            "CORSResponse: no CORS rule of this bucket allows this Origin with this \
             Access-Control-Request-Method and these Access-Control-Request-Headers (see \
             GetBucketCors)",
        ),
    }
}

/// The S3 operation a request asks for, from its method, path and query (a fixed set of
/// names, so it can label a metric; never the bucket or key).
pub fn s3_operation<B>(req: &hyper::Request<B>) -> &'static str {
    use hyper::Method;
    let path = req.uri().path().trim_start_matches('/');
    let query = req.uri().query().unwrap_or("");
    let has = |k: &str| query.split('&').any(|p| p.split('=').next().is_some_and(|name| name == k));
    let (bucket, key) = match path.split_once('/') {
        Some((b, k)) => (b, k),
        None => (path, ""),
    };
    let copy = req.headers().contains_key("x-amz-copy-source");
    let m = req.method();
    if *m == Method::OPTIONS {
        return "CorsPreflight";
    }
    if bucket.is_empty() {
        return if *m == Method::GET { "ListBuckets" } else { "Other" };
    }
    if key.is_empty() {
        return match *m {
            Method::GET if has("uploads") => "ListMultipartUploads",
            Method::GET if has("location") => "GetBucketLocation",
            Method::GET if has("versioning") => "GetBucketVersioning",
            Method::GET if has("list-type") => "ListObjectsV2",
            Method::GET
                if query.is_empty() || has("prefix") || has("delimiter") || has("marker") =>
            {
                "ListObjects"
            }
            Method::PUT if query.is_empty() => "CreateBucket",
            Method::HEAD => "HeadBucket",
            Method::DELETE if query.is_empty() => "DeleteBucket",
            Method::POST if has("delete") => "DeleteObjects",
            _ => "OtherBucket",
        };
    }
    match *m {
        Method::GET if has("uploadId") => "ListParts",
        Method::GET if query.is_empty() || !has("tagging") && !has("acl") => "GetObject",
        Method::HEAD => "HeadObject",
        Method::PUT if has("partNumber") && has("uploadId") && copy => "UploadPartCopy",
        Method::PUT if has("partNumber") && has("uploadId") => "UploadPart",
        Method::PUT if copy => "CopyObject",
        Method::PUT if query.is_empty() => "PutObject",
        Method::POST if has("uploads") => "CreateMultipartUpload",
        Method::POST if has("uploadId") => "CompleteMultipartUpload",
        Method::DELETE if has("uploadId") => "AbortMultipartUpload",
        Method::DELETE => "DeleteObject",
        _ => "OtherObject",
    }
}

/// `bucket/key` of a path-style request, decoded, for a recording window (bounded length).
fn object_name(path: &str) -> String {
    let decoded = percent_encoding::percent_decode_str(path.trim_start_matches('/'))
        .decode_utf8_lossy()
        .into_owned();
    decoded.chars().take(256).collect()
}

async fn handle_inner(
    service: s3s::service::S3Service,
    observer: Arc<Observer>,
    req: hyper::Request<hyper::body::Incoming>,
) -> std::result::Result<s3s::HttpResponse, s3s::HttpError> {
    let expect_continue = expects_continue(&req);
    let empty = hyper::body::Body::is_end_stream(req.body());
    let read_all = Arc::new(AtomicBool::new(empty));
    let mut resp = if let Some(why) = refusal(&req) {
        refused(why)
    } else if needs_length(&req) {
        let (parts, body) = req.into_parts();
        match read_limited(body, UNSIZED_BODY_LIMIT).await {
            Ok(body) => {
                observer.s3_received(body.len() as u64);
                read_all.store(true, Ordering::Release);
                let req = hyper::Request::from_parts(parts, s3s::Body::from(body));
                service.call(req).await?
            }
            Err(e) => unsized_refused(e),
        }
    } else {
        let tracked = Arc::clone(&read_all);
        let req = req
            .map(|inner| s3s::Body::http_body(TrackedBody { inner, read_all: tracked, observer }));
        service.call(req).await?
    };
    if resp.status().is_client_error() || resp.status().is_server_error() {
        explain(&mut resp);
    }
    if (expect_continue && empty) || !read_all.load(Ordering::Acquire) {
        resp.headers_mut()
            .insert(hyper::header::CONNECTION, hyper::header::HeaderValue::from_static("close"));
    }
    Ok(resp)
}

/// The standard message of an S3 error code, as S3 words it.
fn standard_message(code: &str) -> Option<&'static str> {
    Some(match code {
        "AccessDenied" => "Access Denied",
        "BadDigest" => "The Content-MD5 you specified did not match what we received.",
        "BucketAlreadyOwnedByYou" => {
            "Your previous request to create the named bucket succeeded and you already own it."
        }
        "BucketNotEmpty" => "The bucket you tried to delete is not empty",
        "EntityTooLarge" => "Your proposed upload exceeds the maximum allowed object size.",
        "EntityTooSmall" => "Your proposed upload is smaller than the minimum allowed object size.",
        "IncompleteBody" => {
            "You did not provide the number of bytes specified by the Content-Length HTTP header."
        }
        "InternalError" => "We encountered an internal error. Please try again.",
        "InvalidAccessKeyId" => "The AWS Access Key Id you provided does not exist in our records.",
        "InvalidArgument" => "Invalid Argument",
        "InvalidBucketName" => "The specified bucket is not valid.",
        "InvalidDigest" => "The Content-MD5 you specified is not valid.",
        "InvalidPart" => {
            "One or more of the specified parts could not be found. The part may not have been \
             uploaded, or the specified entity tag may not match the part's entity tag."
        }
        "InvalidPartOrder" => {
            "The list of parts was not in ascending order. The parts list must be specified in \
             order by part number."
        }
        "InvalidRange" => "The requested range is not satisfiable",
        "InvalidRequest" => "Invalid Request",
        "InvalidURI" => "Couldn't parse the specified URI.",
        "KeyTooLongError" => "Your key is too long.",
        "MalformedXML" => {
            "The XML you provided was not well-formed or did not validate against our published \
             schema."
        }
        "MaxMessageLengthExceeded" => "Your request was too big.",
        "MethodNotAllowed" => "The specified method is not allowed against this resource.",
        "MissingContentLength" => "You must provide the Content-Length HTTP header.",
        "NoSuchBucket" => "The specified bucket does not exist",
        "NoSuchKey" => "The specified key does not exist.",
        "NoSuchUpload" => {
            "The specified multipart upload does not exist. The upload ID might be invalid, or \
             the multipart upload might have been aborted or completed."
        }
        "NotImplemented" => "A header you provided implies functionality that is not implemented.",
        "PreconditionFailed" => "At least one of the preconditions you specified did not hold.",
        "RequestTimeTooSkewed" => {
            "The difference between the request time and the current time is too large."
        }
        "SignatureDoesNotMatch" => {
            "The request signature we calculated does not match the signature you provided. \
             Check your key and signing method."
        }
        "XAmzContentSHA256Mismatch" => {
            "The provided 'x-amz-content-sha256' header does not match what was computed."
        }
        _ => return None,
    })
}

/// Gives an S3 error response without a `<Message>` (as `s3s` sends its own errors and codes
/// raised without one) the standard message of its code, so that clients print more than
/// "Unknown"; and logs the refusal once, at debug level for a client error.
fn explain(resp: &mut s3s::HttpResponse) {
    let status = resp.status().as_u16();
    let Some(xml) = resp.body().bytes() else { return };
    let text = String::from_utf8_lossy(&xml);
    let code = text
        .split_once("<Code>")
        .and_then(|(_, rest)| rest.split_once("</Code>"))
        .map(|(code, _)| code.to_string());
    match &code {
        Some(code) if status < 500 => tracing::debug!(status, code, "request refused"),
        Some(code) => tracing::warn!(status, code, "request failed"),
        None => tracing::debug!(status, "request refused"),
    }
    let Some(message) = code.as_deref().and_then(standard_message) else { return };
    if text.contains("<Message>") {
        return;
    }
    let tag = "</Code>";
    let Some(at) = text.find(tag).map(|i| i + tag.len()) else { return };
    let body = format!("{}<Message>{message}</Message>{}", &text[..at], &text[at..]);
    *resp.body_mut() = s3s::Body::from(body);
    resp.headers_mut().remove(hyper::header::CONTENT_LENGTH);
}

/// Builds the S3 service for an opened gateway: the administrator's keys and the users of
/// `<data-dir>/users.sealed` sign requests; each user's policy is enforced on every operation.
pub fn service(opened: &Opened) -> s3s::service::S3Service {
    let access = crate::users::SharedAccess(access(opened));
    let gateway = Gateway::new(Arc::clone(&opened.objects))
        .with_access(Arc::clone(&access.0))
        .with_lifecycle(opened.lifecycle);
    let mut b = s3s::service::S3ServiceBuilder::new(gateway);
    let authorizer = crate::s3::Authorizer::new(Arc::clone(&access.0), Arc::clone(&opened.objects));
    b.set_auth(access);
    b.set_access(authorizer);
    b.build()
}

/// Who may do what: the administrator's keys and the users file, for every front end.
fn access(opened: &Opened) -> Arc<crate::users::Access> {
    Arc::new(crate::users::Access::new(
        opened.credentials.clone(),
        Some(
            crate::users::UserFile::new(&opened.data_dir, &opened.key)
                .with_previous(opened.previous_key.as_deref()),
        ),
    ))
}

/// Serves S3 on `listener` until `shutdown` resolves, then commits and checkpoints.
pub async fn run(
    opened: Opened,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    run_tls(opened, listener, None, shutdown).await
}

/// [`run`], over TLS when `tls` is given (every connection then starts with a handshake; a
/// client speaking plain HTTP is dropped).
pub async fn run_tls(
    mut opened: Opened,
    listener: tokio::net::TcpListener,
    tls: Option<crate::tls::Tls>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let sweeper = crate::rotation::Sweeper::start(&mut opened);
    let grow_watch = opened.grower.clone().map(|grower| {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task =
            tokio::spawn(crate::grow::watch(grower, opened.grow_at, opened.grow_max, stopped));
        (stop, task)
    });
    let space_watch = opened.space.clone().map(|guard| {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        (stop, tokio::spawn(guard.watch(stopped)))
    });
    let status_answers = {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(crate::usage::answer_requests(
            Arc::clone(&opened.objects),
            opened.data_dir.clone(),
            Arc::clone(&opened.key),
            stopped,
        ));
        (stop, task)
    };
    let lifecycle = {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(crate::lifecycle::run(
            Arc::clone(&opened.objects),
            opened.lifecycle,
            stopped,
        ));
        (stop, task)
    };
    let swift = opened.swift_listener.take().map(|listener| {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let front = Arc::new(crate::swift::Swift::new(
            Arc::clone(&opened.objects),
            access(&opened),
            tls.is_some(),
        ));
        let task = tokio::spawn(crate::swift::serve(
            listener,
            front,
            tls.clone(),
            opened.limits.clone(),
            stopped,
        ));
        (stop, task)
    });
    let service = service(&opened);
    let observer = Arc::clone(&opened.observer);
    let objects = Arc::clone(&opened.objects);
    let make_svc = || {
        let (service, observer, objects) =
            (service.clone(), Arc::clone(&observer), Arc::clone(&objects));
        hyper::service::service_fn(move |req| {
            handle(service.clone(), Arc::clone(&observer), Arc::clone(&objects), req)
        })
    };
    crate::listen::accept_until(&listener, tls.as_ref(), &opened.limits, "s3", make_svc, shutdown)
        .await;
    if let Some(sweeper) = sweeper {
        sweeper.stop().await;
    }
    if let Some((stop, task)) = swift {
        let _ = stop.send(true);
        let _ = task.await;
    }
    let _ = status_answers.0.send(true);
    let _ = status_answers.1.await;
    let _ = lifecycle.0.send(true);
    let _ = lifecycle.1.await;
    if let Some((stop, task)) = grow_watch {
        // A growth under way is finished first.
        let _ = stop.send(true);
        let _ = task.await;
    }
    if let Some((stop, task)) = space_watch {
        let _ = stop.send(true);
        let _ = task.await;
    }
    tracing::info!("shutting down: committing ORAM state");
    let objects = Arc::clone(&opened.objects);
    objects.shutdown().await?;
    if objects.engine_is_durable() {
        if opened.snapshots.lock().is_some() {
            write_snapshot(&opened).await?;
        } else {
            tracing::warn!("no snapshot written: the snapshot area could not be opened at start");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, headers: &[(&str, &str)], uri: &str) -> hyper::Request<()> {
        let mut b = hyper::Request::builder().method(method).uri(uri);
        for (name, value) in headers {
            b = b.header(*name, *value);
        }
        b.body(()).unwrap()
    }

    fn get(auth: Option<&str>, uri: &str) -> hyper::Request<()> {
        let auth: Vec<_> = auth.map(|a| ("authorization", a)).into_iter().collect();
        req("GET", &auth, uri)
    }

    #[test]
    fn s3_operations_are_named_from_method_path_and_query() {
        let copy = [("x-amz-copy-source", "/b/src")];
        for (method, headers, uri, want) in [
            ("GET", &[][..], "/", "ListBuckets"),
            ("PUT", &[][..], "/b", "CreateBucket"),
            ("HEAD", &[][..], "/b", "HeadBucket"),
            ("DELETE", &[][..], "/b", "DeleteBucket"),
            ("GET", &[][..], "/b?list-type=2&prefix=x", "ListObjectsV2"),
            ("GET", &[][..], "/b?prefix=x", "ListObjects"),
            ("GET", &[][..], "/b?location", "GetBucketLocation"),
            ("GET", &[][..], "/b?uploads", "ListMultipartUploads"),
            ("POST", &[][..], "/b?delete", "DeleteObjects"),
            ("GET", &[][..], "/b/k/with/slashes", "GetObject"),
            ("GET", &[][..], "/b/k?versionId=null", "GetObject"),
            ("GET", &[][..], "/b/k?tagging", "OtherObject"),
            ("HEAD", &[][..], "/b/k", "HeadObject"),
            ("PUT", &[][..], "/b/k", "PutObject"),
            ("PUT", &copy[..], "/b/k", "CopyObject"),
            ("PUT", &[][..], "/b/k?partNumber=2&uploadId=u", "UploadPart"),
            ("PUT", &copy[..], "/b/k?partNumber=2&uploadId=u", "UploadPartCopy"),
            ("POST", &[][..], "/b/k?uploads", "CreateMultipartUpload"),
            ("POST", &[][..], "/b/k?uploadId=u", "CompleteMultipartUpload"),
            ("GET", &[][..], "/b/k?uploadId=u", "ListParts"),
            ("DELETE", &[][..], "/b/k?uploadId=u", "AbortMultipartUpload"),
            ("DELETE", &[][..], "/b/k", "DeleteObject"),
            ("PATCH", &[][..], "/", "Other"),
        ] {
            assert_eq!(s3_operation(&req(method, headers, uri)), want, "{method} {uri}");
        }
    }

    #[test]
    fn object_names_for_windows_are_decoded_and_bounded() {
        assert_eq!(object_name("/b/a%20b/%C3%A9"), "b/a b/é");
        assert_eq!(object_name(&format!("/b/{}", "x".repeat(1000))).chars().count(), 256);
    }

    #[test]
    fn what_s3s_would_check_as_sigv2_is_refused() {
        let v2 = |r: &hyper::Request<()>| refusal(r).is_some_and(|m| m.contains("Version 2"));
        assert!(v2(&get(Some("AWS AKID:c2lnbmF0dXJl"), "/b/k")));
        assert!(v2(&get(None, "/b/k?AWSAccessKeyId=A&Expires=1&Signature=abc")));
        // The parameter name as s3s decodes it, not as sent.
        assert!(v2(&get(None, "/b/k?AWSAccessKeyId=A&Expires=1&%53ignature=abc")));
        assert!(v2(&get(None, "/b/k?AWSAccessKeyId=A&Expires=1&Sig%6eature=abc")));
        // s3s tries SigV2 before SigV4: a dummy X-Amz-Signature does not make it SigV4.
        assert!(v2(&get(None, "/b/k?AWSAccessKeyId=A&Expires=1&Signature=a&X-Amz-Signature=b")));
        // Any Authorization header in the SigV2 form, even beside another one.
        let two = [("authorization", "AWS4-HMAC-SHA256 x"), ("authorization", "AWS A:s")];
        assert!(v2(&req("GET", &two, "/b/k")));
    }

    #[test]
    fn browser_form_posts_are_refused() {
        for ct in ["multipart/form-data; boundary=x", " Multipart/Form-Data;boundary=x"] {
            let r = req("POST", &[("content-type", ct)], "/b");
            assert!(refusal(&r).is_some_and(|m| m.contains("POST")), "{ct:?}");
        }
        // Other POSTs (multipart uploads, DeleteObjects) are not form uploads.
        assert_eq!(
            refusal(&req("POST", &[("content-type", "application/xml")], "/b?delete")),
            None
        );
        assert_eq!(refusal(&req("POST", &[], "/b/k?uploads")), None);
    }

    #[test]
    fn sigv4_and_anonymous_requests_pass() {
        let v4 = "AWS4-HMAC-SHA256 Credential=A/2026/us-east-1/s3/aws4_request, \
                  SignedHeaders=host, Signature=ab";
        assert_eq!(refusal(&get(Some(v4), "/b/k")), None);
        let presigned = "/b/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=ab";
        assert_eq!(refusal(&get(None, presigned)), None);
        assert_eq!(refusal(&get(None, "/b/k?signature=lower-case-is-not-sigv2")), None);
        assert_eq!(refusal(&get(None, "/b/k")), None);
    }
}
