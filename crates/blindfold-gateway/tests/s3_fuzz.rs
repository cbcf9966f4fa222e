//! Hostile S3 requests into the gateway's S3 service, built as `blindfold serve` builds it
//! (`server::service`): random methods, paths, queries, headers and bodies, half of them signed
//! with the gateway's credentials (SigV4, so they reach the object layer's handlers) and half
//! unsigned or signed with garbage. The service must never panic and must answer every request
//! with a well-formed HTTP response: a client error carries an S3 XML error body, and no request
//! is answered with a server error other than `501 Not Implemented`.
//!
//! Cases: `BLINDFOLD_FUZZ_CASES` (see `blindfold_testkit::fuzz`).

use std::time::{SystemTime, UNIX_EPOCH};

use crate::common;

use blindfold_gateway::server;
use blindfold_testkit::fuzz;
use http_body_util::BodyExt;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use ring::{digest, hmac};

const ACCESS: &str = "AKIDFUZZ";
const SECRET: &str = "fuzz-secret-key";
const REGION: &str = "us-east-1";

/// One request, before signing.
#[derive(Clone, Debug)]
struct Req {
    method: String,
    path: String,
    query: Vec<(String, String)>,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// `None`: unsigned; `Some(true)`: signed with the gateway's key; `Some(false)`: an
    /// `Authorization` header of random shape.
    signed: Option<bool>,
    garbage_auth: Vec<u8>,
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["GET", "PUT", "POST", "DELETE", "HEAD"]).prop_map(str::to_owned),
        1 => prop::sample::select(vec!["OPTIONS", "PATCH", "TRACE", "CONNECT"]).prop_map(str::to_owned),
        1 => "[A-Z]{1,8}",
    ]
}

/// Paths made of unreserved characters (so the signature's canonical form is the path as sent).
fn path() -> impl Strategy<Value = String> {
    let bucket = prop_oneof![
        "[a-z0-9][a-z0-9.-]{1,10}[a-z0-9]",
        "[A-Za-z0-9._~-]{0,6}",
        Just("fuzz".to_owned())
    ];
    let key = "[A-Za-z0-9._~/-]{0,40}";
    prop_oneof![
        Just("/".to_owned()),
        bucket.clone().prop_map(|b| format!("/{b}")),
        (bucket, key).prop_map(|(b, k)| format!("/{b}/{k}")),
    ]
}

fn query() -> impl Strategy<Value = Vec<(String, String)>> {
    let name = prop_oneof![
        prop::sample::select(vec![
            "uploads",
            "uploadId",
            "partNumber",
            "delete",
            "list-type",
            "prefix",
            "delimiter",
            "max-keys",
            "continuation-token",
            "start-after",
            "marker",
            "versioning",
            "acl",
            "location",
            "tagging",
            "versions",
            "max-parts",
            "part-number-marker",
            "max-uploads",
            "x-id",
            "response-content-type",
            "policy",
            "cors",
            "encoding-type",
        ])
        .prop_map(str::to_owned),
        "[a-zA-Z0-9._~-]{1,12}",
    ];
    let value =
        prop_oneof![Just(String::new()), "[0-9]{1,12}", "-?[0-9]{1,25}", "[a-zA-Z0-9._~-]{0,40}",];
    prop::collection::vec((name, value), 0..4)
}

fn headers() -> impl Strategy<Value = Vec<(String, Vec<u8>)>> {
    let name = prop_oneof![
        prop::sample::select(vec![
            "content-md5",
            "range",
            "x-amz-copy-source",
            "x-amz-copy-source-range",
            "content-type",
            "x-amz-meta-a",
            "if-match",
            "if-none-match",
            "if-modified-since",
            "expect",
            "x-amz-checksum-crc32",
            "x-amz-checksum-sha256",
            "x-amz-sdk-checksum-algorithm",
            "x-amz-storage-class",
            "x-amz-acl",
            "x-amz-tagging",
            "content-encoding",
            "x-amz-decoded-content-length",
            "transfer-encoding",
            "x-amz-server-side-encryption",
            "x-amz-metadata-directive",
            "content-disposition",
            "x-amz-object-lock-mode",
        ])
        .prop_map(str::to_owned),
        "x-amz-[a-z-]{1,12}",
        "[a-z]{1,10}",
    ];
    let value = prop_oneof![
        "[ -~]{0,40}",
        Just(b"bytes=0-".to_vec()).prop_map(|v| String::from_utf8(v).unwrap()),
        "bytes=[0-9]{0,20}-[0-9]{0,20}",
        "/fuzz/[A-Za-z0-9._-]{0,20}",
        Just("aws-chunked".to_owned()),
        Just("100-continue".to_owned()),
    ]
    .prop_map(String::into_bytes);
    let raw = prop::collection::vec(any::<u8>(), 0..20);
    prop::collection::vec((name, prop_oneof![4 => value, 1 => raw]), 0..4)
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let xml = prop_oneof![
        Just("<Delete><Object><Key>a</Key></Object></Delete>".to_owned()),
        Just("<Delete><Quiet>true</Quiet><Object><Key></Key></Object></Delete>".to_owned()),
        Just("<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>\"x\"</ETag></Part></CompleteMultipartUpload>".to_owned()),
        Just("<CompleteMultipartUpload><Part><PartNumber>99999999999</PartNumber></Part></CompleteMultipartUpload>".to_owned()),
        Just("<CreateBucketConfiguration><LocationConstraint>x</LocationConstraint></CreateBucketConfiguration>".to_owned()),
        Just("<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tagging>".to_owned()),
        Just("<".repeat(300)),
        "<[A-Za-z]{1,10}>[ -~]{0,60}</[A-Za-z]{1,10}>",
    ]
    .prop_map(String::into_bytes);
    prop_oneof![
        2 => Just(Vec::new()),
        2 => prop::collection::vec(any::<u8>(), 0..600),
        2 => xml,
        1 => (any::<u8>(), 0usize..70_000).prop_map(|(b, n)| vec![b; n]),
    ]
}

fn request() -> impl Strategy<Value = Req> {
    (
        method(),
        path(),
        query(),
        headers(),
        body(),
        prop_oneof![3 => Just(Some(true)), 1 => Just(Some(false)), 1 => Just(None)],
        prop::collection::vec(any::<u8>(), 0..120),
    )
        .prop_map(|(method, path, query, headers, body, signed, garbage_auth)| Req {
            method,
            path,
            query,
            headers,
            body,
            signed,
            garbage_auth,
        })
}

fn hmac_sha256(key: &[u8], msg: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), msg).as_ref().to_vec()
}

/// `YYYYMMDDTHHMMSSZ` for now.
fn amz_date() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Builds the HTTP request; signed requests carry a valid SigV4 header signature over the
/// method, path, query and the host, date and payload-hash headers.
fn build(r: &Req) -> Option<s3s::HttpRequest> {
    let mut query: Vec<(String, String)> = r.query.clone();
    query.sort();
    let qs: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let qs = qs.join("&");
    let uri = if qs.is_empty() { r.path.clone() } else { format!("{}?{qs}", r.path) };
    let mut b = hyper::Request::builder().method(r.method.as_str()).uri(&uri);
    b = b.header("host", "127.0.0.1:9000");
    for (k, v) in &r.headers {
        b = b.header(k.as_str(), v.as_slice());
    }
    b = b.header("content-length", r.body.len().to_string());
    match r.signed {
        Some(true) => {
            let date = amz_date();
            let day = &date[..8];
            let canonical = format!(
                "{}\n{}\n{qs}\nhost:127.0.0.1:9000\nx-amz-content-sha256:UNSIGNED-PAYLOAD\n\
                 x-amz-date:{date}\n\nhost;x-amz-content-sha256;x-amz-date\nUNSIGNED-PAYLOAD",
                r.method, r.path
            );
            let hashed = hex::encode(digest::digest(&digest::SHA256, canonical.as_bytes()));
            let to_sign =
                format!("AWS4-HMAC-SHA256\n{date}\n{day}/{REGION}/s3/aws4_request\n{hashed}");
            let k = hmac_sha256(format!("AWS4{SECRET}").as_bytes(), day.as_bytes());
            let k = hmac_sha256(&k, REGION.as_bytes());
            let k = hmac_sha256(&k, b"s3");
            let k = hmac_sha256(&k, b"aws4_request");
            let sig = hex::encode(hmac_sha256(&k, to_sign.as_bytes()));
            b = b.header("x-amz-date", date.as_str());
            b = b.header("x-amz-content-sha256", "UNSIGNED-PAYLOAD");
            b = b.header(
                "authorization",
                format!(
                    "AWS4-HMAC-SHA256 Credential={ACCESS}/{day}/{REGION}/s3/aws4_request, \
                     SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={sig}"
                ),
            );
        }
        Some(false) => {
            b = b.header("authorization", r.garbage_auth.as_slice());
        }
        None => {}
    }
    b.body(s3s::Body::from(bytes::Bytes::from(r.body.clone()))).ok()
}

#[test]
fn hostile_s3_requests_get_well_formed_answers() {
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::memory_cfg(dir.path(), ACCESS, SECRET);
    let opened = rt.block_on(server::open(&cfg)).unwrap();
    let service = server::service(&opened);
    // A bucket and an object for the random requests to find.
    let setup = [
        Req {
            method: "PUT".into(),
            path: "/fuzz".into(),
            query: vec![],
            headers: vec![],
            body: vec![],
            signed: Some(true),
            garbage_auth: vec![],
        },
        Req {
            method: "PUT".into(),
            path: "/fuzz/a".into(),
            query: vec![],
            headers: vec![],
            body: b"hello".to_vec(),
            signed: Some(true),
            garbage_auth: vec![],
        },
    ];
    for r in &setup {
        let resp = rt.block_on(service.call(build(r).unwrap())).unwrap();
        assert!(resp.status().is_success(), "setup {r:?}: {}", resp.status());
    }

    let signed_ok = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(fuzz::config());
    runner
        .run(&request(), |r| {
            let Some(req) = build(&r) else { return Ok(()) };
            let resp = rt.block_on(service.call(req));
            let resp = match resp {
                Ok(resp) => resp,
                Err(e) => return Err(TestCaseError::fail(format!("no HTTP answer: {e:?}"))),
            };
            let status = resp.status();
            let body = rt
                .block_on(resp.into_body().collect())
                .map_err(|e| TestCaseError::fail(format!("the body fails: {e:?}")))?
                .to_bytes();
            prop_assert!(
                !status.is_server_error() || status == hyper::StatusCode::NOT_IMPLEMENTED,
                "{status} for {r:?}: {}",
                String::from_utf8_lossy(&body)
            );
            if status.is_client_error() && r.method != "HEAD" {
                let text = String::from_utf8_lossy(&body);
                prop_assert!(
                    text.contains("<Error>") && text.contains("<Code>"),
                    "{status}: {text}"
                );
            }
            if r.signed == Some(true) && status.is_success() {
                signed_ok.set(signed_ok.get() + 1);
            }
            Ok(())
        })
        .unwrap();
    // The signed half reached the handlers (or the sample was too small to say).
    assert!(signed_ok.get() > 0 || fuzz::cases() < 64, "no signed request succeeded");
    rt.block_on(async {
        opened.objects.shutdown().await.unwrap();
    });
}
