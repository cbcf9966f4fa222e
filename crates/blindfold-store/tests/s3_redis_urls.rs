//! `s3://` and `redis://` store URLs: what parses, what does not and why, and that `Display`
//! writes a URL that parses back to the same value (never with a password).

use std::time::Duration;

use blindfold_store::{RedisAddress, RedisOptions, RedisPassword, S3Options, StoreError, StoreUrl};

fn s3(bucket: &str, prefix: &str, options: S3Options) -> StoreUrl {
    StoreUrl::S3 { bucket: bucket.into(), prefix: prefix.into(), options }
}

fn redis(host: &str, port: u16, db: u32) -> RedisAddress {
    RedisAddress { host: host.into(), port, db, username: None, password: None }
}

#[test]
fn s3_urls_parse() {
    let minio = S3Options {
        endpoint: Some("http://127.0.0.1:9000".into()),
        region: Some("eu-west-1".into()),
        ..S3Options::default()
    };
    let cases = [
        ("s3://bucket", s3("bucket", "", S3Options::default())),
        ("s3://bucket/", s3("bucket", "", S3Options::default())),
        ("s3://my.bucket-1/a/b_c/", s3("my.bucket-1", "a/b_c", S3Options::default())),
        (
            "s3://b12/p?endpoint=http://127.0.0.1:9000/&region=eu-west-1",
            s3("b12", "p", minio.clone()),
        ),
        (
            "s3://b12/p?endpoint=http%3A%2F%2F127.0.0.1%3A9000&region=eu-west-1",
            s3("b12", "p", minio),
        ),
        (
            "s3://bkt?style=virtual&concurrency=8&timeout=500ms&retries=0",
            s3(
                "bkt",
                "",
                S3Options {
                    virtual_hosted: true,
                    concurrency: 8,
                    timeout: Duration::from_millis(500),
                    retries: 0,
                    ..S3Options::default()
                },
            ),
        ),
        (
            "S3://bkt?timeout=7",
            s3("bkt", "", S3Options { timeout: Duration::from_secs(7), ..S3Options::default() }),
        ),
    ];
    for (text, want) in cases {
        assert_eq!(StoreUrl::parse(text).unwrap(), want, "{text}");
    }
}

#[test]
fn redis_urls_parse() {
    let with_password = RedisAddress {
        username: Some("app".into()),
        password: Some(RedisPassword::new("p@ss:w/rd")),
        ..redis("cache.internal", 6380, 2)
    };
    let cases = [
        ("redis://127.0.0.1:6379/0", redis("127.0.0.1", 6379, 0), RedisOptions::default()),
        ("redis://localhost", redis("localhost", 6379, 0), RedisOptions::default()),
        ("redis://localhost/", redis("localhost", 6379, 0), RedisOptions::default()),
        ("redis://[::1]:7000/3", redis("::1", 7000, 3), RedisOptions::default()),
        (
            "redis://app:p%40ss%3Aw%2Frd@cache.internal:6380/2",
            with_password,
            RedisOptions::default(),
        ),
        (
            "redis://h:1/0?prefix=team:x&pool=2&timeout=3s",
            redis("h", 1, 0),
            RedisOptions { prefix: "team:x".into(), pool: 2, timeout: Duration::from_secs(3) },
        ),
    ];
    for (text, address, options) in cases {
        assert_eq!(StoreUrl::parse(text).unwrap(), StoreUrl::Redis { address, options }, "{text}");
    }
}

#[test]
fn bad_s3_and_redis_urls_say_what_is_wrong() {
    let cases = [
        ("s3:bucket", "no `//`"),
        ("s3://", "bucket name \"\" is not valid"),
        ("s3://Bucket", "bucket name \"Bucket\" is not valid"),
        ("s3://ab", "is not valid"),
        ("s3://bucket/a//b", "empty, `.` or `..` segment"),
        ("s3://bucket/a/../b", "empty, `.` or `..` segment"),
        ("s3://bucket/a b", "only ASCII letters"),
        ("s3://bucket?endpoint=ftp://x", "must be `http://host[:port]`"),
        ("s3://bucket?endpoint=nonsense", "is not a URL"),
        ("s3://bucket?secret=x", "never from the URL"),
        ("s3://bucket?region=a&region=b", "more than once"),
        ("s3://bucket?concurrency=0", "concurrency=\"0\""),
        ("s3://bucket?timeout=soon", "not a duration"),
        ("s3://bucket?style=sideways", "`path` or `virtual`"),
        ("s3://bucket#x", "fragment"),
        ("redis:host", "no `//`"),
        ("redis://", "no host"),
        ("redis://h:0/0", "port 0"),
        ("redis://h:99999/0", "invalid port"),
        ("redis://h/zero", "not a database number"),
        ("redis://h/0?pool=0", "pool=\"0\""),
        ("redis://h/0?prefix=a%20b", "prefix=\"a b\""),
        ("redis://h/0?db=1", "unknown option \"db\""),
        ("rediss://h/0", "rediss:// is not supported yet"),
    ];
    for (text, hint) in cases {
        let err = StoreUrl::parse(text).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, StoreError::InvalidUrl { .. }), "{text}: {err:?}");
        assert!(msg.contains(hint), "{text}: {msg:?} should contain {hint:?}");
        assert!(!err.is_retryable());
    }
}

#[test]
fn display_round_trips_and_hides_the_password() {
    let urls = [
        "s3://bucket",
        "s3://bucket/a/b",
        "s3://bucket/p?endpoint=http%3A%2F%2F127.0.0.1%3A9000&region=us-east-1",
        "s3://bucket/p?style=virtual&concurrency=3&timeout=250ms&retries=9",
        "redis://127.0.0.1:6379/0",
        "redis://[::1]:7000/3?prefix=x%3Ay&pool=2&timeout=1s",
        "redis://app@h:1/0",
    ];
    for text in urls {
        let url = StoreUrl::parse(text).unwrap();
        assert_eq!(url.to_string(), text);
        assert_eq!(StoreUrl::parse(&url.to_string()).unwrap(), url, "{text}");
    }
    let secret = StoreUrl::parse("redis://:hunter2@h:1/0").unwrap();
    assert_eq!(secret.to_string(), "redis://h:1/0");
    assert!(!format!("{secret:?}").contains("hunter2"));
}
