//! S3 object lock through the gateway's S3 operations: retention and legal holds refuse
//! every S3 path that would remove a version (DELETE of a version, DeleteObjects), bucket
//! defaults reach every write path, retention only grows unless governance is bypassed, and
//! it all comes back from the store alone.

use s3s::dto::*;
use s3s::{S3ErrorCode, S3};

use crate::common;
use crate::s3_api;
use s3_api::*;

fn days_from_now(days: i64) -> Timestamp {
    let t = time::OffsetDateTime::now_utc() + time::Duration::days(days);
    Timestamp::from(t.replace_nanosecond(0).unwrap())
}

async fn enable_lock(g: &blindfold_gateway::Gateway, default: Option<(&str, i32)>) -> S3Result<()> {
    let rule = default.map(|(mode, days)| ObjectLockRule {
        default_retention: Some(DefaultRetention {
            mode: Some(ObjectLockRetentionMode::from(mode.to_string())),
            days: Some(days),
            years: None,
        }),
    });
    let input = PutObjectLockConfigurationInput {
        bucket: "b".into(),
        object_lock_configuration: Some(ObjectLockConfiguration {
            object_lock_enabled: Some(ObjectLockEnabled::from_static(ObjectLockEnabled::ENABLED)),
            rule,
        }),
        ..Default::default()
    };
    g.put_object_lock_configuration(req(input)).await.map(|_| ())
}

type S3Result<T> = s3s::S3Result<T>;

async fn put_locked(
    g: &blindfold_gateway::Gateway,
    key: &str,
    retention: Option<(&str, Timestamp)>,
    hold: bool,
) -> S3Result<String> {
    let input = PutObjectInput {
        bucket: "b".into(),
        key: key.into(),
        body: blob(b"locked data"),
        object_lock_mode: retention.as_ref().map(|(m, _)| ObjectLockMode::from(m.to_string())),
        object_lock_retain_until_date: retention.map(|(_, t)| t),
        object_lock_legal_hold_status: hold.then(|| ObjectLockLegalHoldStatus::from_static("ON")),
        ..Default::default()
    };
    Ok(g.put_object(req(input)).await?.output.version_id.expect("a version id"))
}

async fn delete_version(
    g: &blindfold_gateway::Gateway,
    key: &str,
    version: &str,
    bypass: bool,
) -> S3Result<()> {
    let input = DeleteObjectInput {
        bucket: "b".into(),
        key: key.into(),
        version_id: Some(version.into()),
        bypass_governance_retention: bypass.then_some(true),
        ..Default::default()
    };
    g.delete_object(req(input)).await.map(|_| ())
}

async fn set_retention(
    g: &blindfold_gateway::Gateway,
    key: &str,
    version: Option<&str>,
    mode: &str,
    until: Timestamp,
    bypass: bool,
) -> S3Result<()> {
    let input = PutObjectRetentionInput {
        bucket: "b".into(),
        key: key.into(),
        version_id: version.map(Into::into),
        retention: Some(ObjectLockRetention {
            mode: Some(ObjectLockRetentionMode::from(mode.to_string())),
            retain_until_date: Some(until),
        }),
        bypass_governance_retention: bypass.then_some(true),
        ..Default::default()
    };
    g.put_object_retention(req(input)).await.map(|_| ())
}

async fn set_hold(g: &blindfold_gateway::Gateway, key: &str, version: &str, on: bool) {
    let input = PutObjectLegalHoldInput {
        bucket: "b".into(),
        key: key.into(),
        version_id: Some(version.into()),
        legal_hold: Some(ObjectLockLegalHold {
            status: Some(ObjectLockLegalHoldStatus::from_static(if on { "ON" } else { "OFF" })),
        }),
        ..Default::default()
    };
    g.put_object_legal_hold(req(input)).await.unwrap();
}

async fn head(g: &blindfold_gateway::Gateway, key: &str, version: &str) -> HeadObjectOutput {
    let input = HeadObjectInput {
        bucket: "b".into(),
        key: key.into(),
        version_id: Some(version.into()),
        ..Default::default()
    };
    g.head_object(req(input)).await.unwrap().output
}

/// Deletes through DeleteObjects; returns the error code for the one key, if any.
async fn delete_many(
    g: &blindfold_gateway::Gateway,
    key: &str,
    version: &str,
    bypass: bool,
) -> Option<String> {
    let mut input = DeleteObjectsInput::builder()
        .bucket("b".into())
        .delete(Delete {
            objects: vec![ObjectIdentifier {
                key: key.into(),
                version_id: Some(version.into()),
                ..Default::default()
            }],
            quiet: None,
        })
        .build()
        .unwrap();
    input.bypass_governance_retention = bypass.then_some(true);
    let out = g.delete_objects(req(input)).await.unwrap().output;
    out.errors.and_then(|e| e.into_iter().next()).and_then(|e| e.code)
}

#[tokio::test]
async fn locked_versions_cannot_be_removed_by_any_s3_call() {
    let s = setup(256, 256, false).await;
    let g = &s.g;
    // Object lock needs versioning, and lock calls need object lock.
    let err = enable_lock(g, None).await.expect_err("not versioned");
    assert_eq!(err.code(), &S3ErrorCode::InvalidBucketState);
    assert!(err.message().unwrap().contains("PutBucketVersioning"), "{err:?}");
    let plain = put(g, "plain", b"x").await;
    assert_eq!(plain, None);
    let e = set_retention(g, "plain", None, "GOVERNANCE", days_from_now(1), false).await;
    assert_eq!(code(e), S3ErrorCode::InvalidRequest);
    versioning(g, "Enabled").await;
    enable_lock(g, None).await.unwrap();
    // Versioning cannot be suspended any more.
    let input = PutBucketVersioningInput::builder()
        .bucket("b".into())
        .versioning_configuration(VersioningConfiguration {
            status: Some(BucketVersioningStatus::from_static(BucketVersioningStatus::SUSPENDED)),
            mfa_delete: None,
        })
        .build()
        .unwrap();
    assert_eq!(code(g.put_bucket_versioning(req(input)).await), S3ErrorCode::InvalidBucketState);

    // GOVERNANCE: refused without bypass on both delete calls; a delete marker is fine.
    let gov = put_locked(g, "gov", Some(("GOVERNANCE", days_from_now(1))), false).await.unwrap();
    assert_eq!(code(delete_version(g, "gov", &gov, false).await), S3ErrorCode::AccessDenied);
    assert_eq!(delete_many(g, "gov", &gov, false).await.as_deref(), Some("AccessDenied"));
    let (marker, _) = delete(g, "gov", None).await;
    assert!(marker);
    assert_eq!(get(g, "gov", Some(&gov)).await.unwrap(), b"locked data");
    let h = head(g, "gov", &gov).await;
    assert_eq!(h.object_lock_mode.unwrap().as_str(), "GOVERNANCE");
    assert!(h.object_lock_retain_until_date.is_some());
    // Retention grows freely, shrinks or changes mode only with bypass.
    set_retention(g, "gov", Some(&gov), "GOVERNANCE", days_from_now(3), false).await.unwrap();
    let shorter = set_retention(g, "gov", Some(&gov), "GOVERNANCE", days_from_now(2), false);
    assert_eq!(code(shorter.await), S3ErrorCode::AccessDenied);
    set_retention(g, "gov", Some(&gov), "GOVERNANCE", days_from_now(2), true).await.unwrap();
    // Bypass deletes it (the signer may: no access policy here, as for the administrator).
    delete_version(g, "gov", &gov, true).await.unwrap();
    assert_eq!(code(get(g, "gov", Some(&gov)).await), S3ErrorCode::NoSuchVersion);

    // COMPLIANCE: nothing removes it or shortens it, bypass or not.
    let comp = put_locked(g, "comp", Some(("COMPLIANCE", days_from_now(1))), false).await.unwrap();
    for bypass in [false, true] {
        assert_eq!(code(delete_version(g, "comp", &comp, bypass).await), S3ErrorCode::AccessDenied);
        assert_eq!(delete_many(g, "comp", &comp, bypass).await.as_deref(), Some("AccessDenied"));
        let e = set_retention(g, "comp", None, "GOVERNANCE", days_from_now(5), bypass).await;
        assert_eq!(code(e), S3ErrorCode::AccessDenied);
    }
    set_retention(g, "comp", None, "COMPLIANCE", days_from_now(9), false).await.unwrap();
    assert_eq!(get(g, "comp", Some(&comp)).await.unwrap(), b"locked data");

    // A legal hold blocks even a bypassing delete until it is lifted.
    let held = put_locked(g, "held", None, true).await.unwrap();
    assert_eq!(head(g, "held", &held).await.object_lock_legal_hold_status.unwrap().as_str(), "ON");
    assert_eq!(code(delete_version(g, "held", &held, true).await), S3ErrorCode::AccessDenied);
    set_hold(g, "held", &held, false).await;
    delete_version(g, "held", &held, false).await.unwrap();

    // Bad requests are refused clearly.
    let e = put_locked(g, "bad", Some(("governance", days_from_now(1))), false).await;
    assert_eq!(code(e), S3ErrorCode::InvalidArgument);
    let e = put_locked(g, "bad", Some(("GOVERNANCE", days_from_now(-1))), false).await;
    assert_eq!(code(e), S3ErrorCode::InvalidArgument);
    let e = set_retention(g, "comp", None, "abc", days_from_now(9), false).await;
    assert_eq!(code(e), S3ErrorCode::MalformedXML);
}

#[tokio::test]
async fn a_bucket_default_reaches_every_write_path() {
    let s = setup(256, 256, false).await;
    let g = &s.g;
    versioning(g, "Enabled").await;
    let e = enable_lock(g, Some(("GOVERNANCE", 0))).await.expect_err("zero days");
    assert_eq!(e.code().as_str(), "InvalidRetentionPeriod");
    enable_lock(g, Some(("COMPLIANCE", 2))).await.unwrap();
    let conf = g
        .get_object_lock_configuration(req(GetObjectLockConfigurationInput {
            bucket: "b".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output
        .object_lock_configuration
        .unwrap();
    let d = conf.rule.unwrap().default_retention.unwrap();
    assert_eq!((d.mode.unwrap().as_str(), d.days, d.years), ("COMPLIANCE", Some(2), None));
    // PUT, copy and multipart: all get the default.
    let v = put(g, "put", b"data").await.unwrap();
    let input = CopyObjectInput::builder()
        .bucket("b".into())
        .key("copy".into())
        .copy_source(CopySource::Bucket { bucket: "b".into(), key: "put".into(), version_id: None })
        .build()
        .unwrap();
    let c = g.copy_object(req(input)).await.unwrap().output.version_id.unwrap();
    let up = g
        .create_multipart_upload(req(CreateMultipartUploadInput {
            bucket: "b".into(),
            key: "mp".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output
        .upload_id
        .unwrap();
    let part = g
        .upload_part(req(UploadPartInput {
            bucket: "b".into(),
            key: "mp".into(),
            upload_id: up.clone(),
            part_number: 1,
            body: blob(b"part"),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output
        .e_tag;
    let m = complete_one(g, "b", "mp", up, part).await.unwrap().version_id.unwrap();
    let in_two_days = time::OffsetDateTime::now_utc() + time::Duration::days(2);
    for (key, version) in [("put", &v), ("copy", &c), ("mp", &m)] {
        let h = head(g, key, version).await;
        assert_eq!(
            h.object_lock_mode.map(|m| m.as_str().to_string()).as_deref(),
            Some("COMPLIANCE")
        );
        let until = time::OffsetDateTime::from(h.object_lock_retain_until_date.unwrap());
        assert!((until - in_two_days).abs() < time::Duration::minutes(1), "{key}: {until}");
        assert_eq!(code(delete_version(g, key, version, true).await), S3ErrorCode::AccessDenied);
    }
}

/// Object lock settings and the retention and holds of versions, written after the last
/// snapshot (in the store-side log only), come back from the store alone and still refuse
/// deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_come_back_from_the_store_alone() {
    use blindfold_gateway::server::{self, Durability, OramEngine, ServeConfig};
    use std::time::Duration;
    const TTL: Duration = Duration::from_millis(400);
    let root = tempfile::tempdir().unwrap();
    let store = blindfold_store::StoreUrl::File {
        dir: root.path().join("cells"),
        sync: blindfold_store::SyncMode::OnFlush,
    };
    let key = root.path().join("key.json");
    let cfg = |data: &std::path::Path| ServeConfig {
        data_dir: data.to_path_buf(),
        store: Some(store.clone()),
        key_file: Some(key.clone()),
        durability: Durability::Store,
        lease_ttl: Some(TTL),
        ..common::file_cfg(data, OramEngine::PathOram)
    };
    let first = root.path().join("data1");
    let until = days_from_now(4);
    let (gov, held, dflt) = {
        let opened = server::open(&cfg(&first)).await.unwrap();
        let g = blindfold_gateway::Gateway::new(std::sync::Arc::clone(&opened.objects));
        let input = CreateBucketInput {
            bucket: "b".into(),
            object_lock_enabled_for_bucket: Some(true),
            ..Default::default()
        };
        g.create_bucket(req(input)).await.unwrap();
        let gov = put_locked(&g, "gov", Some(("GOVERNANCE", days_from_now(1))), false).await;
        let gov = gov.unwrap();
        set_retention(&g, "gov", None, "GOVERNANCE", until.clone(), false).await.unwrap();
        let held = put(&g, "held", b"to hold").await.unwrap();
        set_hold(&g, "held", &held, true).await;
        enable_lock(&g, Some(("GOVERNANCE", 7))).await.unwrap();
        let dflt = put(&g, "default", b"by default").await.unwrap();
        drop(g);
        drop(opened); // the machine is lost: no clean stop, no snapshot
        (gov, held, dflt)
    };
    std::fs::remove_dir_all(&first).unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    let (opened, about) = server::recover(&cfg(&root.path().join("data2"))).await.unwrap();
    let g = blindfold_gateway::Gateway::new(std::sync::Arc::clone(&opened.objects));
    let r = g
        .get_object_retention(req(GetObjectRetentionInput {
            bucket: "b".into(),
            key: "gov".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output
        .retention
        .unwrap();
    assert_eq!(r.retain_until_date, Some(until), "{about}");
    assert_eq!(head(&g, "held", &held).await.object_lock_legal_hold_status.unwrap().as_str(), "ON");
    assert_eq!(head(&g, "default", &dflt).await.object_lock_mode.unwrap().as_str(), "GOVERNANCE");
    for (k, v) in [("gov", &gov), ("held", &held), ("default", &dflt)] {
        assert_eq!(code(delete_version(&g, k, v, false).await), S3ErrorCode::AccessDenied, "{k}");
    }
    let err = enable_lock(&g, None).await;
    assert!(err.is_ok(), "the bucket still has object lock and versioning: {err:?}");
}
