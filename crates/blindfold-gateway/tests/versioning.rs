//! S3 versioning through the gateway's S3 operations: versions, delete markers, suspended
//! buckets, listing in pages, a model-based check, what the store sees when an old version is
//! read, and recovery of it all from the store alone.

use std::collections::BTreeMap;

use s3s::dto::*;
use s3s::{S3ErrorCode, S3};

use crate::common;
use crate::s3_api;
use s3_api::*;

#[tokio::test]
async fn versions_delete_markers_and_reads_by_version() {
    let s = setup(256, 256, false).await;
    let g = &s.g;
    // Not versioned: no version ids, GetBucketVersioning has no status.
    assert_eq!(put(g, "k", b"unversioned").await, None);
    let out = g
        .get_bucket_versioning(req(GetBucketVersioningInput {
            bucket: "b".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output;
    assert_eq!(out.status, None);
    versioning(g, "Enabled").await;
    let out = g
        .get_bucket_versioning(req(GetBucketVersioningInput {
            bucket: "b".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output;
    assert_eq!(out.status.unwrap().as_str(), "Enabled");
    let v1 = put(g, "k", b"one").await.expect("a version id");
    let v2 = put(g, "k", b"two, longer").await.expect("a version id");
    assert_ne!(v1, v2);
    assert_eq!(get(g, "k", None).await.unwrap(), b"two, longer");
    assert_eq!(get(g, "k", Some(&v1)).await.unwrap(), b"one");
    assert_eq!(get(g, "k", Some("null")).await.unwrap(), b"unversioned");
    // A version id the gateway could not have given is malformed; a well-formed one unknown.
    assert_eq!(code(get(g, "k", Some("nope")).await), S3ErrorCode::InvalidArgument);
    let unknown = "0123456789abcdef0123456789abcdef";
    assert_eq!(code(get(g, "k", Some(unknown)).await), S3ErrorCode::NoSuchVersion);
    // HEAD of an old version.
    let head = g
        .head_object(req(HeadObjectInput {
            bucket: "b".into(),
            key: "k".into(),
            version_id: Some(v1.clone()),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output;
    assert_eq!((head.content_length, head.version_id.as_deref()), (Some(3), Some(v1.as_str())));
    // A delete adds a marker; the key reads as gone, its versions stay.
    let (marker, m) = delete(g, "k", None).await;
    let m = m.expect("the marker's version id");
    assert!(marker);
    let err = get(g, "k", None).await.expect_err("deleted");
    assert_eq!(err.code(), &S3ErrorCode::NoSuchKey);
    assert_eq!(err.headers().unwrap()["x-amz-delete-marker"], "true");
    assert_eq!(code(get(g, "k", Some(&m)).await), S3ErrorCode::MethodNotAllowed);
    assert_eq!(get(g, "k", Some(&v2)).await.unwrap(), b"two, longer");
    let all = entries(&list_page(g, None, None, None, None, None).await);
    let want: Vec<Entry> = {
        let mut w = vec![
            ("k".into(), m.clone(), true, true),
            ("k".into(), v2.clone(), false, false),
            ("k".into(), v1.clone(), false, false),
            ("k".into(), "null".into(), false, false),
        ];
        w.sort();
        w
    };
    assert_eq!(all, want);
    // The bucket is not empty while versions remain.
    let del = g.delete_bucket(req(DeleteBucketInput { bucket: "b".into(), ..Default::default() }));
    assert_eq!(code(del.await), S3ErrorCode::BucketNotEmpty);
    // Deleting the marker brings the newest version back.
    assert_eq!(delete(g, "k", Some(&m)).await, (true, Some(m.clone())));
    assert_eq!(get(g, "k", None).await.unwrap(), b"two, longer");
    // Deleting the current version for good: the one before becomes current.
    assert_eq!(delete(g, "k", Some(&v2)).await, (false, Some(v2.clone())));
    assert_eq!(get(g, "k", None).await.unwrap(), b"one");
    // Copy from an old version.
    let copy = CopyObjectInput::builder()
        .bucket("b".into())
        .key("copy".into())
        .copy_source(CopySource::Bucket {
            bucket: "b".into(),
            key: "k".into(),
            version_id: Some("null".into()),
        })
        .build()
        .unwrap();
    let out = g.copy_object(req(copy)).await.unwrap().output;
    assert_eq!(out.copy_source_version_id.as_deref(), Some("null"));
    assert!(out.version_id.is_some());
    assert_eq!(get(g, "copy", None).await.unwrap(), b"unversioned");
    // UploadPartCopy from an old version too (into another bucket: this one's listing follows).
    let parts = CreateBucketInput { bucket: "parts".into(), ..Default::default() };
    g.create_bucket(req(parts)).await.unwrap();
    let create = CreateMultipartUploadInput {
        bucket: "parts".into(),
        key: "mp".into(),
        ..Default::default()
    };
    let id = g.create_multipart_upload(req(create)).await.unwrap().output.upload_id.unwrap();
    let part = UploadPartCopyInput::builder()
        .bucket("parts".into())
        .key("mp".into())
        .upload_id(id.clone())
        .part_number(1)
        .copy_source(CopySource::Bucket {
            bucket: "b".into(),
            key: "k".into(),
            version_id: Some("null".into()),
        })
        .build()
        .unwrap();
    let etag = g.upload_part_copy(req(part)).await.unwrap().output.copy_part_result.unwrap().e_tag;
    complete_one(g, "parts", "mp", id, etag).await.unwrap();
    let got = g
        .get_object(req(GetObjectInput {
            bucket: "parts".into(),
            key: "mp".into(),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert_eq!(read(got.output.body).await, b"unversioned");
    // DeleteObjects with version ids.
    let del = DeleteObjectsInput::builder()
        .bucket("b".into())
        .delete(Delete {
            objects: vec![
                ObjectIdentifier {
                    key: "k".into(),
                    version_id: Some(v1.clone()),
                    ..Default::default()
                },
                ObjectIdentifier {
                    key: "k".into(),
                    version_id: Some("null".into()),
                    ..Default::default()
                },
                ObjectIdentifier { key: "copy".into(), ..Default::default() },
            ],
            quiet: None,
        })
        .build()
        .unwrap();
    let out = g.delete_objects(req(del)).await.unwrap().output;
    let deleted = out.deleted.unwrap();
    assert_eq!(deleted.len(), 3);
    assert_eq!(deleted[2].delete_marker, Some(true));
    assert_eq!(code(get(g, "k", None).await), S3ErrorCode::NoSuchKey);
    let left = entries(&list_page(g, None, None, None, None, None).await);
    assert_eq!(left.len(), 2, "the copy's version and its marker: {left:?}");
    assert!(s.layer.directory().check().unwrap().is_empty());
}

#[tokio::test]
async fn suspended_versioning_replaces_the_null_version() {
    let s = setup(256, 256, false).await;
    let g = &s.g;
    versioning(g, "Enabled").await;
    let v1 = put(g, "k", b"kept").await.unwrap();
    versioning(g, "Suspended").await;
    // A suspended bucket's writes answer no version id, as S3's do.
    assert_eq!(put(g, "k", b"null one").await, None);
    let free = s.layer.directory().free_blocks();
    assert_eq!(put(g, "k", b"null two").await, None);
    assert_eq!(s.layer.directory().free_blocks(), free, "the null version was replaced");
    assert_eq!(get(g, "k", Some("null")).await.unwrap(), b"null two");
    assert_eq!(get(g, "k", Some(&v1)).await.unwrap(), b"kept");
    // A delete: the null version goes, a null delete marker takes its place.
    assert_eq!(delete(g, "k", None).await, (true, Some("null".into())));
    let all = entries(&list_page(g, None, None, None, None, None).await);
    let mut want = vec![("k".into(), "null".into(), true, true), ("k".into(), v1, false, false)];
    want.sort();
    assert_eq!(all, want);
    // MFA delete is refused with a clear error.
    let input = PutBucketVersioningInput::builder()
        .bucket("b".into())
        .versioning_configuration(VersioningConfiguration {
            status: Some(BucketVersioningStatus::from_static(BucketVersioningStatus::ENABLED)),
            mfa_delete: Some(MFADelete::from_static(MFADelete::ENABLED)),
        })
        .build()
        .unwrap();
    let err = s.g.put_bucket_versioning(req(input)).await.expect_err("MFA delete");
    assert_eq!(err.code(), &S3ErrorCode::NotImplemented);
    assert!(err.message().unwrap().contains("MFA"));
}

#[tokio::test]
async fn versions_list_in_pages_with_prefixes() {
    let s = setup(512, 64, false).await;
    let g = &s.g;
    versioning(g, "Enabled").await;
    for key in ["a", "d/x", "d/y", "e"] {
        for i in 0..3 {
            put(g, key, format!("{key}{i}").as_bytes()).await;
        }
    }
    delete(g, "e", None).await;
    let full = entries(&list_page(g, None, None, None, None, None).await);
    assert_eq!(full.len(), 13);
    for max in [1, 2, 5] {
        let mut got = Vec::new();
        let (mut km, mut vm): (Option<String>, Option<String>) = (None, None);
        loop {
            let page = list_page(g, None, None, km.as_deref(), vm.as_deref(), Some(max)).await;
            let e = entries(&page);
            assert!(e.len() <= max as usize);
            got.extend(e);
            if !page.is_truncated.unwrap() {
                break;
            }
            km = page.next_key_marker;
            vm = page.next_version_id_marker;
        }
        got.sort();
        assert_eq!(got, full, "pages of {max}");
    }
    // A delimiter folds d/ into one common prefix; a prefix narrows.
    let page = list_page(g, None, Some("/"), None, None, None).await;
    let prefixes: Vec<_> =
        page.common_prefixes.clone().unwrap().into_iter().map(|p| p.prefix.unwrap()).collect();
    assert_eq!(prefixes, vec!["d/".to_string()]);
    assert_eq!(entries(&page).len(), 7);
    let page = list_page(g, Some("d/"), None, None, None, None).await;
    assert_eq!(entries(&page).len(), 6);
}

/// A version in the model: its id and its data (`None`: a delete marker).
type ModelVersion = (String, Option<Vec<u8>>);

/// Random versioned puts, deletes (current and by version) and reads of any version, against
/// a simple model: a list of versions per key, newest last.
#[tokio::test]
async fn versioned_operations_follow_a_model() {
    use rand::{Rng, SeedableRng};
    let s = setup(1024, 64, false).await;
    let g = &s.g;
    versioning(g, "Enabled").await;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(48);
    // key → versions, oldest first: (version id, data; None for a delete marker).
    let mut model: BTreeMap<String, Vec<ModelVersion>> = BTreeMap::new();
    let keys = ["a", "b", "c/d"];
    for step in 0..120 {
        let key = keys[rng.gen_range(0..keys.len())];
        match rng.gen_range(0..10) {
            0..=3 => {
                let data: Vec<u8> = (0..rng.gen_range(0..200)).map(|_| rng.gen()).collect();
                let id = put(g, key, &data).await.unwrap();
                model.entry(key.into()).or_default().push((id, Some(data)));
            }
            4..=5 => {
                let (marker, id) = delete(g, key, None).await;
                assert!(marker);
                model.entry(key.into()).or_default().push((id.unwrap(), None));
            }
            6 => {
                let versions = model.entry(key.into()).or_default();
                if !versions.is_empty() {
                    let i = rng.gen_range(0..versions.len());
                    let (id, data) = versions.remove(i);
                    assert_eq!(delete(g, key, Some(&id)).await, (data.is_none(), Some(id)));
                }
            }
            _ => {
                let versions = model.entry(key.into()).or_default();
                if versions.is_empty() {
                    assert_eq!(code(get(g, key, None).await), S3ErrorCode::NoSuchKey, "{step}");
                    continue;
                }
                let (id, data) = &versions[rng.gen_range(0..versions.len())];
                match data {
                    Some(d) => assert_eq!(&get(g, key, Some(id)).await.unwrap(), d, "{step}"),
                    None => {
                        assert_eq!(code(get(g, key, Some(id)).await), S3ErrorCode::MethodNotAllowed)
                    }
                }
                let latest = versions.last().unwrap();
                match &latest.1 {
                    Some(d) => assert_eq!(&get(g, key, None).await.unwrap(), d, "{step}"),
                    None => assert_eq!(code(get(g, key, None).await), S3ErrorCode::NoSuchKey),
                }
            }
        }
        // Every key reads as its latest version says: its data, or gone.
        for (key, versions) in &model {
            match versions.last() {
                Some((_, Some(d))) => assert_eq!(&get(g, key, None).await.unwrap(), d, "{step}"),
                _ => assert_eq!(code(get(g, key, None).await), S3ErrorCode::NoSuchKey, "{step}"),
            }
        }
        // The listing agrees with the model, order and latest flags included.
        for (key, versions) in &model {
            let got = s.layer.directory().versions_of_key("b", key).unwrap();
            let want: Vec<(String, bool)> =
                versions.iter().rev().map(|(id, d)| (id.clone(), d.is_none())).collect();
            let got: Vec<(String, bool)> =
                got.iter().map(|v| (v.version_id.clone(), v.object.is_none())).collect();
            assert_eq!(got, want, "step {step}, key {key}");
        }
    }
    let mut want = Vec::new();
    for (key, versions) in &model {
        let n = versions.len();
        for (i, (id, d)) in versions.iter().enumerate() {
            want.push((key.clone(), id.clone(), i + 1 == n, d.is_none()));
        }
    }
    want.sort();
    assert_eq!(entries(&list_page(g, None, None, None, None, None).await), want);
    assert!(s.layer.directory().check().unwrap().is_empty());
}

/// Reading an old version is the same ORAM access as reading the current object: the store
/// sees the same kinds of requests, as many, touching as many cells on average (which cells,
/// and how many a batch of random paths shares, vary from read to read for every object).
#[tokio::test]
async fn reading_an_old_version_looks_like_reading_the_current_one() {
    use blindfold_store::{TraceEvent, TraceOp};
    let s = setup(256, 64, true).await;
    let g = &s.g;
    versioning(g, "Enabled").await;
    let old = put(g, "k", &[1u8; 300]).await.unwrap();
    put(g, "k", &[2u8; 400]).await.unwrap();
    put(g, "other", &[3u8; 350]).await.unwrap();
    // (kinds of requests in order, cells read) of `n` reads.
    let reads = |trace: Vec<TraceEvent>| {
        let kinds: Vec<TraceOp> = trace.iter().map(|e| e.op).collect();
        let cells: usize =
            trace.iter().filter(|e| e.op == TraceOp::Read).map(|e| e.shape().1).sum();
        (kinds, cells)
    };
    const N: usize = 12;
    let mut per = Vec::new();
    for (key, version) in [("k", Some(old.as_str())), ("k", None), ("other", None)] {
        let mut kinds = None;
        let mut cells = 0;
        s.recording.clear();
        for _ in 0..N {
            get(g, key, version).await.unwrap();
            let (k, c) = reads(s.recording.take_trace());
            assert!(!k.is_empty());
            assert!(kinds.is_none() || kinds.as_ref() == Some(&k), "{key} {version:?}: {k:?}");
            kinds = Some(k);
            cells += c;
        }
        per.push((kinds.unwrap(), cells as f64 / N as f64));
    }
    for (kinds, cells) in &per[1..] {
        assert_eq!(kinds, &per[0].0, "the same requests");
        let ratio = cells / per[0].1;
        assert!((0.8..1.25).contains(&ratio), "cells per read: {} vs {cells}", per[0].1);
    }
    // Listing versions, reading the versioning state and deleting touch no storage at all.
    s.recording.clear();
    list_page(g, None, None, None, None, None).await;
    delete(g, "k", None).await;
    assert!(s.recording.take_trace().is_empty());
}

/// Per key its versions newest first: id, and size and tags (`None`: a delete marker); and
/// the bucket's settings.
type VersionState =
    (Vec<(String, Vec<(String, Option<(u64, Option<String>)>)>)>, blindfold_gateway::BucketConfig);

/// Everything the directory says about versions: per key, its versions newest first (id,
/// size and tags of each, or a delete marker), and the bucket's settings.
fn version_state(d: &blindfold_gateway::Directory) -> VersionState {
    let keys = d.key_versions("b", "", "", 1000).unwrap();
    let keys = keys
        .into_iter()
        .map(|(k, vs)| {
            let vs = vs
                .into_iter()
                .map(|v| {
                    let o = v.object.map(|o| (o.size, o.metadata.get(":tagging").cloned()));
                    (v.version_id, o)
                })
                .collect();
            (k, vs)
        })
        .collect();
    (keys, d.bucket_config("b").unwrap())
}

/// A versioned bucket with several versions, a delete marker, object and bucket tags, made
/// partly before a snapshot and partly after it (in the store-side log only), comes back
/// identical from the store alone, every version readable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_come_back_from_the_store_alone() {
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
    let v1 = {
        let opened = server::open(&cfg(&first)).await.unwrap();
        let g = blindfold_gateway::Gateway::new(std::sync::Arc::clone(&opened.objects));
        opened.objects.directory().create_bucket("b").unwrap();
        opened.objects.directory().settle().await.unwrap();
        put(&g, "k", b"before versioning").await;
        versioning(&g, "Enabled").await;
        let v1 = put_tagged(&g, "k", b"first version", Some("n=1")).await.unwrap();
        opened.objects.shutdown().await.unwrap();
        server::write_snapshot(&opened).await.unwrap();
        v1
    };
    let (before, data) = {
        // After the snapshot: in the store-side log only.
        let opened = server::open(&cfg(&first)).await.unwrap();
        let g = blindfold_gateway::Gateway::new(std::sync::Arc::clone(&opened.objects));
        let v2 = put(&g, "k", b"second version").await.unwrap();
        let (_, marker) = delete(&g, "k", None).await;
        let v3 = put_tagged(&g, "j", b"another key", Some("a=b&c=d")).await.unwrap();
        put(&g, "j", b"j again").await.unwrap();
        let mut input = PutObjectTaggingInput::builder()
            .bucket("b".into())
            .key("k".into())
            .tagging(Tagging {
                tag_set: vec![Tag { key: Some("late".into()), value: Some("tag".into()) }],
            })
            .build()
            .unwrap();
        input.version_id = Some(v2.clone());
        g.put_object_tagging(req(input)).await.unwrap();
        let input = PutBucketTaggingInput::builder()
            .bucket("b".into())
            .tagging(Tagging {
                tag_set: vec![Tag { key: Some("env".into()), value: Some("prod".into()) }],
            })
            .build()
            .unwrap();
        g.put_bucket_tagging(req(input)).await.unwrap();
        versioning(&g, "Suspended").await;
        put(&g, "n", b"null version").await;
        delete(&g, "j", Some(&v3)).await;
        let state = version_state(opened.objects.directory());
        assert!(state
            .0
            .iter()
            .any(|(_, vs)| vs.iter().any(|(id, o)| o.is_none() && Some(id) == marker.as_ref())));
        let data = vec![
            ("k", "null", b"before versioning".to_vec()),
            ("k", v1.as_str(), b"first version".to_vec()),
            ("k", v2.as_str(), b"second version".to_vec()),
            ("n", "null", b"null version".to_vec()),
        ]
        .into_iter()
        .map(|(k, v, d)| (k.to_string(), v.to_string(), d))
        .collect::<Vec<_>>();
        // The machine is lost: no clean stop, no snapshot, the data directory gone.
        drop(g);
        drop(opened);
        (state, data)
    };
    std::fs::remove_dir_all(&first).unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    let (opened, about) = server::recover(&cfg(&root.path().join("data2"))).await.unwrap();
    assert_eq!(version_state(opened.objects.directory()), before, "{about}");
    let g = blindfold_gateway::Gateway::new(std::sync::Arc::clone(&opened.objects));
    for (k, v, d) in &data {
        assert_eq!(&get(&g, k, Some(v)).await.unwrap(), d, "{k} {v}");
    }
    assert!(opened.objects.directory().check().unwrap().is_empty());
    let report = blindfold_gateway::verify::verify(&opened, |_, _| {}).await.unwrap();
    assert!(report.is_clean(), "{report:?}");
}

/// A dump of the directory (what snapshots, key rotations and sealing carry) restores
/// versions, delete markers, tags and bucket settings as they were.
#[tokio::test]
async fn a_directory_dump_restores_versions() {
    let s = setup(256, 64, false).await;
    let g = &s.g;
    versioning(g, "Enabled").await;
    put_tagged(g, "k", b"one", Some("t=1")).await;
    put(g, "k", b"two").await;
    delete(g, "k", None).await;
    put(g, "x/y", b"three").await;
    let d = s.layer.directory();
    let dump = d.dump().unwrap();
    assert_eq!(dump.versions.len(), 3);
    let dir = tempfile::tempdir().unwrap();
    let key = blindfold_crypto::MasterKey::generate();
    let restored =
        blindfold_gateway::Directory::restore(&dir.path().join("meta.redb"), 256, &dump, &key)
            .unwrap();
    assert_eq!(version_state(&restored), version_state(d));
    assert_eq!(restored.object_totals().unwrap(), d.object_totals().unwrap());
    assert_eq!(restored.free_blocks(), d.free_blocks());
}
