//! S3 lifecycle through the gateway's S3 operations: configurations are checked and answered
//! as given, the worker expires what the rules say (current and noncurrent versions, lone
//! delete markers, old uploads) and nothing object lock protects, the `x-amz-expiration`
//! header names the rule, and what the store sees of a run does not depend on what expired.

use std::sync::Arc;
use std::time::Duration;

use blindfold_gateway::lifecycle::{self, Schedule};
use blindfold_store::{RecordingStore, Store};
use parking_lot::Mutex;
use s3s::dto::*;
use s3s::{S3ErrorCode, S3};

use crate::common;
use crate::s3_api;
use s3_api::*;

const DAY: i128 = 86_400 * 1_000_000_000;

fn rule(id: &str, prefix: &str, f: impl FnOnce(&mut LifecycleRule)) -> LifecycleRule {
    let mut r = LifecycleRule {
        id: Some(id.into()),
        status: ExpirationStatus::from_static(ExpirationStatus::ENABLED),
        prefix: Some(prefix.into()),
        abort_incomplete_multipart_upload: None,
        expiration: None,
        filter: None,
        noncurrent_version_expiration: None,
        noncurrent_version_transitions: None,
        transitions: None,
    };
    f(&mut r);
    r
}

fn days(n: i32) -> impl FnOnce(&mut LifecycleRule) {
    move |r| {
        r.expiration = Some(LifecycleExpiration { days: Some(n), ..Default::default() });
    }
}

async fn put_rules(g: &blindfold_gateway::Gateway, rules: Vec<LifecycleRule>) -> s3s::S3Result<()> {
    let input = PutBucketLifecycleConfigurationInput {
        bucket: "b".into(),
        lifecycle_configuration: Some(BucketLifecycleConfiguration { rules }),
        ..Default::default()
    };
    g.put_bucket_lifecycle_configuration(req(input)).await.map(|_| ())
}

async fn get_rules(g: &blindfold_gateway::Gateway) -> s3s::S3Result<Vec<LifecycleRule>> {
    let input = GetBucketLifecycleConfigurationInput { bucket: "b".into(), ..Default::default() };
    Ok(g.get_bucket_lifecycle_configuration(req(input)).await?.output.rules.unwrap_or_default())
}

fn now() -> i128 {
    time::OffsetDateTime::now_utc().unix_timestamp_nanos()
}

#[tokio::test]
async fn configurations_are_checked_and_answered_as_given() {
    let s = setup(64, 256, false).await;
    let g = &s.g;
    assert_eq!(code(get_rules(g).await), S3ErrorCode::NoSuchLifecycleConfiguration);
    let rules = vec![
        rule("logs", "logs/", days(31)),
        rule("tmp", "tmp/", |r| {
            r.prefix = None;
            r.filter = Some(LifecycleRuleFilter {
                and: Some(LifecycleRuleAndOperator {
                    prefix: Some("tmp/".into()),
                    tags: Some(vec![Tag { key: Some("k".into()), value: Some("v".into()) }]),
                    object_size_greater_than: Some(10),
                    object_size_less_than: None,
                }),
                ..Default::default()
            });
            r.noncurrent_version_expiration = Some(NoncurrentVersionExpiration {
                noncurrent_days: Some(2),
                newer_noncurrent_versions: Some(3),
            });
            r.abort_incomplete_multipart_upload =
                Some(AbortIncompleteMultipartUpload { days_after_initiation: Some(1) });
        }),
    ];
    put_rules(g, rules.clone()).await.unwrap();
    assert_eq!(get_rules(g).await.unwrap(), rules);
    // Refused clearly, and the rules in place stay.
    let bad: Vec<(Vec<LifecycleRule>, &str)> = vec![
        (vec![rule(&"a".repeat(256), "x/", days(1))], "InvalidArgument"),
        (vec![rule("same", "x/", days(1)), rule("same", "y/", days(2))], "InvalidArgument"),
        (vec![rule("zero", "x/", days(0))], "InvalidArgument"),
        (
            vec![rule("status", "x/", |r| {
                r.status = ExpirationStatus::from("enabled".to_string());
                r.expiration = Some(LifecycleExpiration { days: Some(1), ..Default::default() });
            })],
            "MalformedXML",
        ),
        (vec![rule("nothing", "x/", |_| {})], "InvalidRequest"),
        (
            vec![rule("transition", "x/", |r| {
                r.transitions = Some(vec![Transition { days: Some(1), ..Default::default() }]);
            })],
            "InvalidStorageClass",
        ),
        (vec![], "MalformedXML"),
    ];
    for (rules, want) in bad {
        let e = put_rules(g, rules).await.expect_err("refused");
        assert_eq!(e.code().as_str(), want, "{e:?}");
        assert!(e.message().is_some_and(|m| !m.is_empty()));
    }
    assert_eq!(get_rules(g).await.unwrap().len(), 2);
    let input = DeleteBucketLifecycleInput { bucket: "b".into(), ..Default::default() };
    g.delete_bucket_lifecycle(req(input)).await.unwrap();
    assert_eq!(code(get_rules(g).await), S3ErrorCode::NoSuchLifecycleConfiguration);
}

#[tokio::test]
async fn the_worker_expires_what_the_rules_say_and_the_store_sees_nothing() {
    let s = setup(256, 256, false).await;
    let g = &s.g;
    versioning(g, "Enabled").await;
    let old = put(g, "logs/a", b"first").await.unwrap();
    let cur = put(g, "logs/a", b"second").await.unwrap();
    put(g, "keep/a", b"kept").await.unwrap();
    put(g, "gone/a", b"x").await.unwrap();
    let (_, marker) = delete(g, "gone/a", None).await;
    let marker = marker.unwrap();
    let input = CreateMultipartUploadInput {
        bucket: "b".into(),
        key: "logs/upload".into(),
        ..Default::default()
    };
    g.create_multipart_upload(req(input)).await.unwrap();
    put_rules(
        g,
        vec![
            rule("logs", "logs/", |r| {
                r.expiration = Some(LifecycleExpiration { days: Some(2), ..Default::default() });
                r.noncurrent_version_expiration = Some(NoncurrentVersionExpiration {
                    noncurrent_days: Some(1),
                    newer_noncurrent_versions: None,
                });
                r.abort_incomplete_multipart_upload =
                    Some(AbortIncompleteMultipartUpload { days_after_initiation: Some(1) });
            }),
            rule("markers", "gone/", |r| {
                r.noncurrent_version_expiration = Some(NoncurrentVersionExpiration {
                    noncurrent_days: Some(1),
                    newer_noncurrent_versions: None,
                });
                r.expiration = Some(LifecycleExpiration {
                    expired_object_delete_marker: Some(true),
                    ..Default::default()
                });
            }),
        ],
    )
    .await
    .unwrap();
    // The header says when and by which rule (rounded up to midnight UTC).
    let head = g
        .head_object(req(HeadObjectInput {
            bucket: "b".into(),
            key: "logs/a".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output;
    let exp = head.expiration.expect("x-amz-expiration");
    assert!(exp.ends_with("GMT\", rule-id=\"logs\""), "{exp}");
    assert!(exp.starts_with("expiry-date=\""), "{exp}");
    let s1 = Schedule::default();
    // Expiring changes trusted state only: not one request of a run reaches the store.
    let apply = |at: i128| {
        let (layer, recording) = (Arc::clone(&s.layer), Arc::clone(&s.recording));
        async move {
            recording.clear();
            let a = lifecycle::apply(&layer, &s1, at).await.unwrap();
            assert!(recording.trace().is_empty(), "{} store requests", recording.trace().len());
            a
        }
    };
    // Nothing is old enough yet.
    let a = apply(now()).await;
    assert_eq!(a, lifecycle::Applied::default());
    // A day and a half later: the noncurrent versions and the upload go, the current one
    // stays (two days), and so does the lone marker's noncurrent version until the next run.
    let a = apply(now() + 2 * DAY).await;
    assert_eq!((a.expired, a.removed, a.aborted), (0, 2, 1), "{a:?}");
    assert_eq!(code(get(g, "logs/a", Some(&old)).await), S3ErrorCode::NoSuchVersion);
    assert_eq!(get(g, "logs/a", Some(&cur)).await.unwrap(), b"second");
    // The marker, alone now, goes at the next run; the current version expires at day 3.
    let a = apply(now() + 4 * DAY).await;
    assert_eq!((a.expired, a.removed), (1, 1), "{a:?}");
    let versions = entries(&list_page(g, None, None, None, None, None).await);
    assert!(versions.iter().all(|(k, _, _, _)| k != "gone/a"), "{versions:?}");
    assert!(!versions.iter().any(|(_, v, _, _)| v == &marker));
    // With no version left, a read of the key says it is no delete marker, as S3 does.
    let e = get(g, "gone/a", None).await.expect_err("nothing left");
    assert_eq!(e.headers().unwrap()["x-amz-delete-marker"], "false");
    assert_eq!(code(get(g, "logs/a", None).await), S3ErrorCode::NoSuchKey);
    assert_eq!(get(g, "keep/a", None).await.unwrap(), b"kept");
    assert!(s.layer.directory().check().unwrap().is_empty());
}

#[tokio::test]
async fn lifecycle_never_removes_a_locked_version() {
    let s = setup(256, 256, false).await;
    let g = &s.g;
    versioning(g, "Enabled").await;
    let input = PutObjectLockConfigurationInput {
        bucket: "b".into(),
        object_lock_configuration: Some(ObjectLockConfiguration {
            object_lock_enabled: Some(ObjectLockEnabled::from_static(ObjectLockEnabled::ENABLED)),
            rule: Some(ObjectLockRule {
                default_retention: Some(DefaultRetention {
                    mode: Some(ObjectLockRetentionMode::from_static("GOVERNANCE")),
                    days: Some(30),
                    years: None,
                }),
            }),
        }),
        ..Default::default()
    };
    g.put_object_lock_configuration(req(input)).await.unwrap();
    let v1 = put(g, "k", b"one").await.unwrap();
    put(g, "k", b"two").await.unwrap();
    put_rules(
        g,
        vec![rule("all", "", |r| {
            r.noncurrent_version_expiration = Some(NoncurrentVersionExpiration {
                noncurrent_days: Some(1),
                newer_noncurrent_versions: None,
            });
        })],
    )
    .await
    .unwrap();
    let a = lifecycle::apply(&s.layer, &Schedule::default(), now() + 5 * DAY).await.unwrap();
    assert_eq!((a.removed, a.locked), (0, 1), "{a:?}");
    assert_eq!(get(g, "k", Some(&v1)).await.unwrap(), b"one");
    // Once the retention has run out, it goes.
    let a = lifecycle::apply(&s.layer, &Schedule::default(), now() + 40 * DAY).await.unwrap();
    assert_eq!((a.removed, a.locked), (1, 0), "{a:?}");
}

type Rec = Arc<RecordingStore<Arc<dyn Store>>>;

/// Under `--durability store`, a run that expires objects and a run that expires nothing
/// write the same thing to the store: one log group of the same cells, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_looks_the_same_to_the_store_whatever_expires() {
    use blindfold_gateway::server::{self, Durability, OpenHooks, OramEngine, ServeConfig};
    let root = tempfile::tempdir().unwrap();
    let cfg = ServeConfig {
        durability: Durability::Store,
        lease_ttl: Some(Duration::from_secs(120)),
        ..common::file_cfg(root.path(), OramEngine::PathOram)
    };
    let recs: Arc<Mutex<Vec<Rec>>> = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&recs);
    let hooks = OpenHooks {
        wrap_store: Some(Box::new(move |inner| {
            let rec = Arc::new(RecordingStore::new(inner));
            keep.lock().push(Arc::clone(&rec));
            rec as Arc<dyn Store>
        })),
        ..OpenHooks::default()
    };
    let opened = server::open_with(&cfg, hooks).await.unwrap();
    let g = blindfold_gateway::Gateway::new(Arc::clone(&opened.objects));
    opened.objects.directory().create_bucket("b").unwrap();
    opened.objects.directory().settle().await.unwrap();
    for i in 0..20 {
        put(&g, &format!("tmp/{i}"), b"short-lived").await;
    }
    put_rules(&g, vec![rule("tmp", "tmp/", days(1))]).await.unwrap();
    let recs = recs.lock().clone();
    assert!(recs.len() >= 2, "the ORAM store and the log's ring are both recorded");
    let run = |at: i128| {
        let (objects, recs) = (Arc::clone(&opened.objects), recs.clone());
        async move {
            for r in &recs {
                r.clear();
            }
            let a = lifecycle::apply(&objects, &Schedule::default(), at).await.unwrap();
            let seen: Vec<_> = recs
                .iter()
                .map(|r| r.take_trace().iter().map(|e| e.shape()).collect::<Vec<_>>())
                .collect();
            (a, seen)
        }
    };
    let (nothing, quiet) = run(now()).await;
    assert_eq!(nothing.expired, 0);
    let (all, busy) = run(now() + 3 * DAY).await;
    assert_eq!(all.expired, 20);
    assert_eq!(quiet, busy, "the store told a run with expirations from one without");
    assert!(busy.iter().any(|t| !t.is_empty()), "a run writes its log entry");
    drop(g);
    opened.objects.shutdown().await.unwrap();
}
