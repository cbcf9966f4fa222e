//! The S3 and Redis backends against real servers: the MinIO and Redis that `scripts/test.sh`
//! starts on 127.0.0.1 (see `blindfold_testkit::servers`). No mocks: every request here goes
//! over TCP to the real server.
//!
//! Without the servers these tests print a notice and pass, except under `CI=true`, where a
//! missing server fails them.

use std::time::{Duration, Instant};

use blindfold_store::{
    open_store, CellId, CountingStore, Geometry, RedisStore, S3Credentials, S3Options, S3Store,
    Store, StoreError, StoreUrl,
};
use blindfold_testkit::{conformance, servers};
use object_store::ObjectStoreExt;

fn g(cells: u64, size: u32) -> Geometry {
    Geometry::new(cells, size).unwrap()
}

/// A TCP port on 127.0.0.1 with nothing listening (bound, then released).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn s3_parts(url: &StoreUrl) -> (String, String, S3Options) {
    match url {
        StoreUrl::S3 { bucket, prefix, options } => {
            (bucket.clone(), prefix.clone(), options.clone())
        }
        other => panic!("not an s3 URL: {other}"),
    }
}

/// A raw `object_store` client on the test bucket, to look at and tamper with objects behind
/// the backend's back.
fn raw_s3(endpoint: &str, bucket: &str) -> object_store::aws::AmazonS3 {
    object_store::aws::AmazonS3Builder::from_env()
        .with_endpoint(endpoint)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_allow_http(true)
        .build()
        .unwrap()
}

// ---- S3 (MinIO) -----------------------------------------------------------------------------

#[tokio::test]
async fn s3_passes_the_conformance_suite() {
    let Some(url) = servers::s3_url("s3-conformance", "") else { return };
    let store =
        CountingStore::new(open_store(&url, "cells", conformance::geometry()).await.unwrap());
    conformance::run(&store).await;
    assert!(store.counts().round_trips > 100);
}

#[tokio::test]
async fn s3_passes_the_conformance_suite_one_request_at_a_time() {
    let Some(url) = servers::s3_url("s3-conformance-serial", "concurrency=1&retries=0") else {
        return;
    };
    let store = open_store(&url, "cells", conformance::geometry()).await.unwrap();
    conformance::run(&*store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_passes_the_conformance_suite_on_a_multi_threaded_runtime() {
    let Some(url) = servers::s3_url("s3-conformance-mt", "concurrency=4") else { return };
    let store = open_store(&url, "cells", conformance::geometry()).await.unwrap();
    conformance::run(&*store).await;
}

#[tokio::test]
async fn s3_layout_is_one_object_per_cell_plus_a_marker() {
    let Some((endpoint, bucket)) = servers::s3_server("s3-layout") else { return };
    let url = servers::s3_url("s3-layout", "").unwrap();
    let (_, prefix, options) = s3_parts(&url);
    let store = S3Store::open(&bucket, &prefix, &options, "tree", g(10, 32)).await.unwrap();
    assert_eq!(store.object_name(CellId(7)), format!("{prefix}/tree/7"));
    store.write(vec![(CellId(7), vec![0xAB; 32])]).await.unwrap();

    let raw = raw_s3(&endpoint, &bucket);
    let cell = raw.get(&format!("{prefix}/tree/7").into()).await.unwrap().bytes().await.unwrap();
    assert_eq!(&cell[..], &[0xAB; 32][..]);
    let marker = raw.get(&format!("{prefix}/tree/geometry").into()).await.unwrap();
    let marker = String::from_utf8(marker.bytes().await.unwrap().to_vec()).unwrap();
    assert!(marker.contains("cell_count=10") && marker.contains("cell_size=32"), "{marker}");
    // Never-written cells have no object at all (they read as zeros).
    let missing = raw.get(&format!("{prefix}/tree/3").into()).await;
    assert!(matches!(missing, Err(object_store::Error::NotFound { .. })), "{missing:?}");
    assert_eq!(store.read(&[CellId(3)]).await.unwrap(), vec![vec![0; 32]]);
}

/// `remove_array` on S3 deletes the array's cells and marker, and nothing of an array whose
/// name starts the same (a growth's `oram.g1` beside `oram`).
#[tokio::test]
async fn s3_remove_array_deletes_one_array_only() {
    let Some((endpoint, bucket)) = servers::s3_server("s3-remove") else { return };
    let url = servers::s3_url("s3-remove", "").unwrap();
    let (_, prefix, _) = s3_parts(&url);
    let old = open_store(&url, "oram", g(300, 16)).await.unwrap();
    let cells: Vec<_> = (0..300).map(|c| (CellId(c), vec![c as u8; 16])).collect();
    old.write(cells).await.unwrap();
    old.flush().await.unwrap();
    let next = open_store(&url, "oram.g1", g(4, 16)).await.unwrap();
    next.write(vec![(CellId(2), vec![7; 16])]).await.unwrap();
    next.flush().await.unwrap();
    drop(old);

    assert!(blindfold_store::remove_array(&url, "oram").await.unwrap());
    let raw = raw_s3(&endpoint, &bucket);
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let left: Vec<_> = raw
        .list(Some(&format!("{prefix}/oram").as_str().into()))
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
        .unwrap();
    assert!(
        left.is_empty(),
        "{} objects of the removed array left: {:?}",
        left.len(),
        &left[..3.min(left.len())]
    );
    assert!(!blindfold_store::remove_array(&url, "oram").await.unwrap(), "nothing left to remove");
    assert_eq!(next.read(&[CellId(2)]).await.unwrap(), vec![vec![7; 16]]);
    let again = open_store(&url, "oram.g1", g(4, 16)).await.unwrap();
    assert_eq!(again.read(&[CellId(2)]).await.unwrap(), vec![vec![7; 16]]);
}

#[tokio::test]
async fn s3_reopening_keeps_cells_and_checks_the_geometry() {
    let Some(url) = servers::s3_url("s3-reopen", "") else { return };
    let store = open_store(&url, "data", g(50, 16)).await.unwrap();
    store.write(vec![(CellId(49), vec![9; 16]), (CellId(0), vec![1; 16])]).await.unwrap();
    store.flush().await.unwrap();
    drop(store);

    let again = open_store(&url, "data", g(50, 16)).await.unwrap();
    assert_eq!(again.read(&[CellId(0), CellId(49)]).await.unwrap(), vec![vec![1; 16], vec![9; 16]]);

    for wrong in [g(51, 16), g(50, 17)] {
        let err = open_store(&url, "data", wrong).await.unwrap_err();
        assert!(matches!(err, StoreError::GeometryMismatch { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("50 cells of 16 bytes") && msg.contains("/data"), "{msg}");
        assert!(!err.is_retryable());
    }
    // Another name under the same URL is another array.
    open_store(&url, "other", g(5, 5)).await.unwrap();
}

#[tokio::test]
async fn s3_a_foreign_marker_is_refused() {
    let Some((endpoint, bucket)) = servers::s3_server("s3-foreign-marker") else { return };
    let url = servers::s3_url("s3-foreign-marker", "").unwrap();
    let (_, prefix, _) = s3_parts(&url);
    let raw = raw_s3(&endpoint, &bucket);
    raw.put(&format!("{prefix}/x/geometry").into(), "not ours".into()).await.unwrap();
    let err = open_store(&url, "x", g(4, 4)).await.unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err:?}");
}

#[tokio::test]
async fn s3_an_object_of_the_wrong_size_is_an_error_not_data() {
    let Some((endpoint, bucket)) = servers::s3_server("s3-wrong-size") else { return };
    let url = servers::s3_url("s3-wrong-size", "").unwrap();
    let (_, prefix, _) = s3_parts(&url);
    let store = open_store(&url, "c", g(4, 64)).await.unwrap();
    let raw = raw_s3(&endpoint, &bucket);
    raw.put(&format!("{prefix}/c/2").into(), vec![1u8; 63].into()).await.unwrap();
    let err = store.read(&[CellId(1), CellId(2)]).await.unwrap_err();
    assert!(err.to_string().contains("63 bytes"), "{err}");
    assert!(!err.is_retryable(), "{err:?}");
    // A ranged read inside the short object still works; one past its end does not.
    assert_eq!(
        store
            .read_ranges(&[blindfold_store::ByteRange { cell: CellId(2), offset: 0, len: 8 }])
            .await
            .unwrap(),
        vec![vec![1; 8]]
    );
    let err = store
        .read_ranges(&[blindfold_store::ByteRange { cell: CellId(2), offset: 60, len: 4 }])
        .await
        .unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
}

#[tokio::test]
async fn s3_a_missing_bucket_is_a_clear_error() {
    let Some((endpoint, _)) = servers::s3_server("s3-missing-bucket") else { return };
    let url =
        StoreUrl::parse(&format!("s3://blindfold-no-such-bucket/p?endpoint={endpoint}")).unwrap();
    let err = open_store(&url, "c", g(4, 4)).await.unwrap_err();
    assert!(matches!(err, StoreError::Missing { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("bucket \"blindfold-no-such-bucket\" does not exist"), "{msg}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn s3_bad_credentials_are_refused() {
    let Some((_, bucket)) = servers::s3_server("s3-bad-credentials") else { return };
    let url = servers::s3_url("s3-bad-credentials", "").unwrap();
    let (_, prefix, options) = s3_parts(&url);
    for (key, secret) in [("blindfold-test", "wrong-secret"), ("nobody", "wrong-secret")] {
        let creds = S3Credentials {
            access_key_id: key.into(),
            secret_access_key: secret.into(),
            session_token: None,
        };
        let err =
            S3Store::open_with_credentials(&bucket, &prefix, &options, Some(creds), "c", g(4, 4))
                .await
                .unwrap_err();
        assert!(matches!(err, StoreError::AccessDenied { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("access denied") && msg.contains("AWS_SECRET_ACCESS_KEY"), "{msg}");
        assert!(!msg.contains("wrong-secret"), "the secret leaked into {msg}");
        assert!(!err.is_retryable());
    }
}

#[tokio::test]
async fn s3_an_unreachable_endpoint_fails_quickly_and_may_be_retried() {
    // Needs no server, but runs with the others so that CI covers it with real credentials.
    if servers::s3_server("s3-unreachable").is_none() {
        return;
    }
    let port = closed_port();
    let url = StoreUrl::parse(&format!(
        "s3://blindfold-test/p?endpoint=http://127.0.0.1:{port}&retries=2&timeout=2s"
    ))
    .unwrap();
    let start = Instant::now();
    let err = open_store(&url, "c", g(4, 4)).await.unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(err.is_retryable());
}

// ---- Redis ----------------------------------------------------------------------------------

fn redis_parts(url: &StoreUrl) -> (blindfold_store::RedisAddress, blindfold_store::RedisOptions) {
    match url {
        StoreUrl::Redis { address, options } => (address.clone(), options.clone()),
        other => panic!("not a redis URL: {other}"),
    }
}

async fn raw_redis(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

#[tokio::test]
async fn redis_passes_the_conformance_suite() {
    let Some(url) = servers::redis_url("redis-conformance", "") else { return };
    let store =
        CountingStore::new(open_store(&url, "cells", conformance::geometry()).await.unwrap());
    conformance::run(&store).await;
    assert!(store.counts().round_trips > 100);
}

#[tokio::test]
async fn redis_passes_the_conformance_suite_with_one_connection() {
    let Some(url) = servers::redis_url("redis-conformance-one", "pool=1") else { return };
    let store = open_store(&url, "cells", conformance::geometry()).await.unwrap();
    conformance::run(&*store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_passes_the_conformance_suite_on_a_multi_threaded_runtime() {
    let Some(url) = servers::redis_url("redis-conformance-mt", "pool=3") else { return };
    let store = open_store(&url, "cells", conformance::geometry()).await.unwrap();
    conformance::run(&*store).await;
}

#[tokio::test]
async fn redis_layout_is_one_key_per_cell_plus_a_marker() {
    let Some(server) = servers::redis_server("redis-layout") else { return };
    let url = servers::redis_url("redis-layout", "").unwrap();
    let (address, options) = redis_parts(&url);
    let store = RedisStore::open(&address, &options, "tree", g(10, 32)).await.unwrap();
    assert_eq!(store.key(CellId(7)), format!("{}:tree:7", options.prefix));
    // Batches larger than one MGET/MSET chunk.
    let many: Vec<(CellId, Vec<u8>)> = (0..10).map(|i| (CellId(i), vec![i as u8; 32])).collect();
    store.write(many).await.unwrap();
    let ids: Vec<CellId> = (0..600).map(|i| CellId(i % 10)).collect();
    let got = store.read(&ids).await.unwrap();
    assert!(got.iter().zip(&ids).all(|(v, c)| *v == vec![c.0 as u8; 32]));

    let mut raw = raw_redis(&server).await;
    let cell: Vec<u8> = redis::cmd("GET")
        .arg(format!("{}:tree:7", options.prefix))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(cell, vec![7u8; 32]);
    let marker: String = redis::cmd("GET")
        .arg(format!("{}:tree:geometry", options.prefix))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(marker.contains("cell_count=10") && marker.contains("cell_size=32"), "{marker}");
}

#[tokio::test]
async fn redis_reopening_keeps_cells_and_checks_the_geometry() {
    let Some(url) = servers::redis_url("redis-reopen", "") else { return };
    let store = open_store(&url, "data", g(50, 16)).await.unwrap();
    store.write(vec![(CellId(49), vec![9; 16])]).await.unwrap();
    drop(store);
    let again = open_store(&url, "data", g(50, 16)).await.unwrap();
    assert_eq!(again.read(&[CellId(49)]).await.unwrap(), vec![vec![9; 16]]);
    let err = open_store(&url, "data", g(50, 32)).await.unwrap_err();
    assert!(matches!(err, StoreError::GeometryMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains("50 cells of 16 bytes"), "{err}");
}

#[tokio::test]
async fn redis_a_value_of_the_wrong_size_is_an_error_not_data() {
    let Some(server) = servers::redis_server("redis-wrong-size") else { return };
    let url = servers::redis_url("redis-wrong-size", "").unwrap();
    let (_, options) = redis_parts(&url);
    let store = open_store(&url, "c", g(4, 64)).await.unwrap();
    let mut raw = raw_redis(&server).await;
    let _: () = redis::cmd("SET")
        .arg(format!("{}:c:2", options.prefix))
        .arg(vec![1u8; 63])
        .query_async(&mut raw)
        .await
        .unwrap();
    let err = store.read(&[CellId(2)]).await.unwrap_err();
    assert!(err.to_string().contains("63 bytes"), "{err}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn redis_a_wrong_password_is_refused() {
    let Some(url) = servers::redis_url("redis-bad-password", "") else { return };
    let (mut address, options) = redis_parts(&url);
    address.password = Some(blindfold_store::RedisPassword::new("not-the-password"));
    let err = RedisStore::open(&address, &options, "c", g(4, 4)).await.unwrap_err();
    assert!(matches!(err, StoreError::AccessDenied { .. }), "{err:?}");
    assert!(!err.to_string().contains("not-the-password"), "{err}");
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn redis_a_missing_database_is_a_clear_error() {
    let Some(url) = servers::redis_url("redis-missing-db", "") else { return };
    let (mut address, options) = redis_parts(&url);
    address.db = 999;
    let err = RedisStore::open(&address, &options, "c", g(4, 4)).await.unwrap_err();
    assert!(matches!(err, StoreError::Missing { .. }), "{err:?}");
}

#[tokio::test]
async fn redis_an_unreachable_server_fails_quickly_and_may_be_retried() {
    if servers::redis_server("redis-unreachable").is_none() {
        return;
    }
    let port = closed_port();
    let url = StoreUrl::parse(&format!("redis://127.0.0.1:{port}/0")).unwrap();
    let start = Instant::now();
    let err = open_store(&url, "c", g(4, 4)).await.unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(20), "took {:?}", start.elapsed());
    assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(err.is_retryable());
}

// ---- Leases (the one-writer capability) ------------------------------------------------------

/// Three handles opened separately on one URL, so races go through the server.
async fn lease_handles(url: &StoreUrl) -> Vec<std::sync::Arc<dyn blindfold_store::LeaseStore>> {
    let mut handles = Vec::new();
    for _ in 0..3 {
        handles.push(blindfold_store::open_lease_store(url).await.unwrap());
    }
    handles
}

#[tokio::test]
async fn s3_passes_the_lease_suite() {
    let Some((endpoint, bucket)) = servers::s3_server("s3-lease") else { return };
    let url = servers::s3_url("s3-lease", "").unwrap();
    blindfold_testkit::lease::run(&lease_handles(&url).await).await;
    // One object per lease, beside (never among) the arrays' objects.
    let (_, prefix, _) = s3_parts(&url);
    let raw = raw_s3(&endpoint, &bucket);
    let record = raw.get(&format!("{prefix}/.lease/race").into()).await.unwrap();
    let record = String::from_utf8(record.bytes().await.unwrap().to_vec()).unwrap();
    assert!(record.starts_with("blindfold-lease v1\ngeneration=2\n"), "{record}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_passes_the_lease_suite_on_a_multi_threaded_runtime() {
    let Some(url) = servers::s3_url("s3-lease-mt", "") else { return };
    blindfold_testkit::lease::run(&lease_handles(&url).await).await;
}

#[tokio::test]
async fn redis_passes_the_lease_suite() {
    let Some(base) = servers::redis_server("redis-lease") else { return };
    let url = servers::redis_url("redis-lease", "").unwrap();
    blindfold_testkit::lease::run(&lease_handles(&url).await).await;
    // One key per lease, without expiry: the generation outlives the lease.
    let (_, options) = redis_parts(&url);
    let mut raw = raw_redis(&base).await;
    let key = format!("{}:.lease:race", options.prefix);
    let record: String = redis::cmd("GET").arg(&key).query_async(&mut raw).await.unwrap();
    assert!(record.starts_with("blindfold-lease v1\ngeneration=2\n"), "{record}");
    let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut raw).await.unwrap();
    assert_eq!(ttl, -1, "no expiry on the record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_passes_the_lease_suite_on_a_multi_threaded_runtime() {
    let Some(url) = servers::redis_url("redis-lease-mt", "") else { return };
    blindfold_testkit::lease::run(&lease_handles(&url).await).await;
}
