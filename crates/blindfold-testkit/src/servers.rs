//! Real storage servers for tests: where `scripts/servers.sh` started them, and what a test
//! does when they are not there.
//!
//! `scripts/test.sh` starts a throwaway MinIO and Redis on 127.0.0.1 and exports
//! [`S3_ENDPOINT`], [`S3_BUCKET`] (plus MinIO's credentials as `AWS_ACCESS_KEY_ID` and
//! `AWS_SECRET_ACCESS_KEY`) and [`REDIS_URL`]. A test asks for a URL with [`s3_url`] or
//! [`redis_url`]: each call names a fresh prefix, so every test starts from an empty store.
//!
//! Without the variables, a test prints a notice and returns early (`None`) — unless `CI=true`,
//! where a missing server is a failure: CI must never pass by skipping these tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use blindfold_store::StoreUrl;

/// Variable holding the S3 endpoint, e.g. `http://127.0.0.1:41971`.
pub const S3_ENDPOINT: &str = "BLINDFOLD_TEST_S3_ENDPOINT";
/// Variable holding the name of an existing bucket the tests may write to.
pub const S3_BUCKET: &str = "BLINDFOLD_TEST_S3_BUCKET";
/// Variable holding a Redis URL, e.g. `redis://:password@127.0.0.1:34875/0`.
pub const REDIS_URL: &str = "BLINDFOLD_TEST_REDIS_URL";

/// A name no other test (in this process or another) uses: `<test>-<pid>-<time>-<n>`.
pub fn unique(test: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{test}-{}-{}-{n}", std::process::id(), nanos % 1_000_000_000_000)
}

/// The value of `var`, or `None` with a notice (a panic under `CI=true`).
fn required(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            if std::env::var("CI").is_ok_and(|ci| ci == "true") {
                panic!(
                    "{test}: ${var} is not set, but CI=true: the real-server tests must run in \
                     CI (scripts/test.sh starts the servers; see scripts/servers.sh)"
                );
            }
            eprintln!(
                "NOTICE: skipping {test}: ${var} is not set (run ./scripts/test.sh, which starts \
                 MinIO and Redis, or set it yourself)"
            );
            None
        }
    }
}

/// The S3 endpoint and bucket, or `None` (see the [module docs](self)).
pub fn s3_server(test: &str) -> Option<(String, String)> {
    let endpoint = required(S3_ENDPOINT, test)?;
    let bucket = required(S3_BUCKET, test)?;
    Some((endpoint, bucket))
}

/// An `s3://` URL of a fresh prefix on the test server, with `extra` query options
/// (`"concurrency=1"`, or `""`), or `None` (see the [module docs](self)).
pub fn s3_url(test: &str, extra: &str) -> Option<StoreUrl> {
    let (endpoint, bucket) = s3_server(test)?;
    let extra = if extra.is_empty() { String::new() } else { format!("&{extra}") };
    let text =
        format!("s3://{bucket}/{}?endpoint={endpoint}&region=us-east-1{extra}", unique(test));
    Some(StoreUrl::parse(&text).unwrap_or_else(|e| panic!("{test}: bad test URL {text}: {e}")))
}

/// The Redis server's URL as given (password included), or `None` (see the
/// [module docs](self)).
pub fn redis_server(test: &str) -> Option<String> {
    required(REDIS_URL, test)
}

/// A `redis://` URL with a fresh key prefix on the test server, with `extra` query options
/// (`"pool=1"`, or `""`), or `None` (see the [module docs](self)).
pub fn redis_url(test: &str, extra: &str) -> Option<StoreUrl> {
    let base = redis_server(test)?;
    let sep = if base.contains('?') { '&' } else { '?' };
    let extra = if extra.is_empty() { String::new() } else { format!("&{extra}") };
    let text = format!("{base}{sep}prefix={}{extra}", unique(test));
    Some(StoreUrl::parse(&text).unwrap_or_else(|e| panic!("{test}: bad test URL: {e}")))
}
