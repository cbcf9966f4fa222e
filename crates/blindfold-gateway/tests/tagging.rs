//! Object and bucket tagging through the gateway's S3 operations: tags on PUT, on multipart
//! uploads and copies, per version, the limits S3 sets, and bucket tags.

use s3s::dto::*;
use s3s::{S3ErrorCode, S3};

use crate::s3_api;
use s3_api::*;

fn tagging(pairs: &[(&str, &str)]) -> Tagging {
    Tagging {
        tag_set: pairs
            .iter()
            .map(|(k, v)| Tag { key: Some(k.to_string()), value: Some(v.to_string()) })
            .collect(),
    }
}

async fn tags(
    g: &blindfold_gateway::Gateway,
    key: &str,
    version: Option<&str>,
) -> Vec<(String, String)> {
    let input = GetObjectTaggingInput {
        bucket: "b".into(),
        key: key.into(),
        version_id: version.map(Into::into),
        ..Default::default()
    };
    let out = g.get_object_tagging(req(input)).await.unwrap().output;
    out.tag_set.into_iter().map(|t| (t.key.unwrap(), t.value.unwrap())).collect()
}

async fn put_tags(
    g: &blindfold_gateway::Gateway,
    key: &str,
    version: Option<&str>,
    t: Tagging,
) -> s3s::S3Result<s3s::S3Response<PutObjectTaggingOutput>> {
    let mut input = PutObjectTaggingInput::builder()
        .bucket("b".into())
        .key(key.into())
        .tagging(t)
        .build()
        .unwrap();
    input.version_id = version.map(Into::into);
    g.put_object_tagging(req(input)).await
}

fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

#[tokio::test]
async fn tags_on_put_get_and_delete() {
    let s = setup(256, 256, false).await;
    let g = &s.g;
    put_tagged(g, "k", b"data", Some("team=backup&year=2026")).await;
    assert_eq!(tags(g, "k", None).await, pairs(&[("team", "backup"), ("year", "2026")]));
    let out = g
        .get_object(req(GetObjectInput {
            bucket: "b".into(),
            key: "k".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output;
    assert_eq!(out.tag_count, Some(2));
    let head = HeadObjectInput { bucket: "b".into(), key: "k".into(), ..Default::default() };
    let head = g.head_object(req(head)).await.unwrap();
    assert_eq!(head.headers["x-amz-tagging-count"], "2");
    // Tags are no user metadata.
    assert_eq!(out.metadata, None);
    put_tags(g, "k", None, tagging(&[("a", "1")])).await.unwrap();
    assert_eq!(tags(g, "k", None).await, pairs(&[("a", "1")]));
    let input =
        DeleteObjectTaggingInput { bucket: "b".into(), key: "k".into(), ..Default::default() };
    g.delete_object_tagging(req(input)).await.unwrap();
    assert!(tags(g, "k", None).await.is_empty());
    // A new PUT of the key starts without the old tags.
    put_tags(g, "k", None, tagging(&[("a", "1")])).await.unwrap();
    put(g, "k", b"again").await;
    assert!(tags(g, "k", None).await.is_empty());
    // No such key.
    assert_eq!(
        code(put_tags(g, "nothing", None, tagging(&[("a", "1")])).await),
        S3ErrorCode::NoSuchKey
    );
}

#[tokio::test]
async fn tag_limits_are_s3s() {
    let s = setup(256, 256, false).await;
    let g = &s.g;
    put(g, "k", b"data").await;
    let ten: Vec<(String, String)> = (0..10).map(|i| (format!("k{i}"), format!("v{i}"))).collect();
    let as_tagging = |t: &[(String, String)]| Tagging {
        tag_set: t
            .iter()
            .map(|(k, v)| Tag { key: Some(k.clone()), value: Some(v.clone()) })
            .collect(),
    };
    put_tags(g, "k", None, as_tagging(&ten)).await.unwrap();
    let mut eleven = ten.clone();
    eleven.push(("k10".into(), "v".into()));
    assert_eq!(code(put_tags(g, "k", None, as_tagging(&eleven)).await), S3ErrorCode::InvalidTag);
    let long_key = vec![("k".repeat(128), "v".repeat(256))];
    put_tags(g, "k", None, as_tagging(&long_key)).await.unwrap();
    let too_long_key = vec![("k".repeat(129), "v".into())];
    assert_eq!(
        code(put_tags(g, "k", None, as_tagging(&too_long_key)).await),
        S3ErrorCode::InvalidTag
    );
    let too_long_value = vec![("k".into(), "v".repeat(257))];
    assert_eq!(
        code(put_tags(g, "k", None, as_tagging(&too_long_value)).await),
        S3ErrorCode::InvalidTag
    );
    let twice = tagging(&[("a", "1"), ("a", "2")]);
    assert_eq!(code(put_tags(g, "k", None, twice).await), S3ErrorCode::InvalidTag);
    // The refused sets changed nothing.
    assert_eq!(tags(g, "k", None).await, long_key);
    // The header on PUT obeys the same limits, before any data is stored.
    let header: String = (0..11).map(|i| format!("k{i}=v&")).collect();
    let input = PutObjectInput {
        bucket: "b".into(),
        key: "h".into(),
        body: blob(b"x"),
        tagging: Some(header.trim_end_matches('&').into()),
        ..Default::default()
    };
    assert_eq!(code(g.put_object(req(input)).await), S3ErrorCode::InvalidTag);
}

#[tokio::test]
async fn tags_belong_to_versions() {
    let s = setup(256, 256, false).await;
    let g = &s.g;
    versioning(g, "Enabled").await;
    let v1 = put_tagged(g, "k", b"one", Some("v=1")).await.unwrap();
    let v2 = put_tagged(g, "k", b"two", Some("v=2")).await.unwrap();
    assert_eq!(tags(g, "k", Some(&v1)).await, pairs(&[("v", "1")]));
    assert_eq!(tags(g, "k", None).await, pairs(&[("v", "2")]));
    let out = put_tags(g, "k", Some(&v1), tagging(&[("old", "yes")])).await.unwrap().output;
    assert_eq!(out.version_id.as_deref(), Some(v1.as_str()));
    assert_eq!(tags(g, "k", Some(&v1)).await, pairs(&[("old", "yes")]));
    assert_eq!(tags(g, "k", Some(&v2)).await, pairs(&[("v", "2")]));
    // A delete marker has no tags.
    let (_, m) = delete(g, "k", None).await;
    let err = put_tags(g, "k", m.as_deref(), tagging(&[("a", "b")])).await;
    assert_eq!(code(err), S3ErrorCode::MethodNotAllowed);
}

#[tokio::test]
async fn copies_and_uploads_carry_tags() {
    let s = setup(256, 256, false).await;
    let g = &s.g;
    put_tagged(g, "src", b"data", Some("from=src")).await;
    let copy = |to: &str, directive: Option<&str>, tagging: Option<&str>| {
        let mut input = CopyObjectInput::builder()
            .bucket("b".into())
            .key(to.into())
            .copy_source(CopySource::Bucket {
                bucket: "b".into(),
                key: "src".into(),
                version_id: None,
            })
            .build()
            .unwrap();
        input.tagging_directive = directive.map(|d| TaggingDirective::from(d.to_string()));
        input.tagging = tagging.map(Into::into);
        input
    };
    g.copy_object(req(copy("c1", None, None))).await.unwrap();
    assert_eq!(tags(g, "c1", None).await, pairs(&[("from", "src")]));
    g.copy_object(req(copy("c2", Some("REPLACE"), Some("new=tag")))).await.unwrap();
    assert_eq!(tags(g, "c2", None).await, pairs(&[("new", "tag")]));
    g.copy_object(req(copy("c3", Some("REPLACE"), None))).await.unwrap();
    assert!(tags(g, "c3", None).await.is_empty());
    // Metadata replaced, tags copied.
    let mut input = copy("c4", None, None);
    input.metadata_directive = Some(MetadataDirective::from_static(MetadataDirective::REPLACE));
    g.copy_object(req(input)).await.unwrap();
    assert_eq!(tags(g, "c4", None).await, pairs(&[("from", "src")]));
    // A multipart upload takes its tags when it starts.
    let input = CreateMultipartUploadInput {
        bucket: "b".into(),
        key: "mp".into(),
        tagging: Some("part=whole".into()),
        ..Default::default()
    };
    let id = g.create_multipart_upload(req(input)).await.unwrap().output.upload_id.unwrap();
    let input = UploadPartInput {
        bucket: "b".into(),
        key: "mp".into(),
        upload_id: id.clone(),
        part_number: 1,
        body: blob(b"only part"),
        ..Default::default()
    };
    let etag = g.upload_part(req(input)).await.unwrap().output.e_tag;
    complete_one(g, "b", "mp", id, etag).await.unwrap();
    assert_eq!(tags(g, "mp", None).await, pairs(&[("part", "whole")]));
}

#[tokio::test]
async fn bucket_tags() {
    let s = setup(64, 256, false).await;
    let g = &s.g;
    let get = || {
        g.get_bucket_tagging(req(GetBucketTaggingInput {
            bucket: "b".into(),
            ..Default::default()
        }))
    };
    assert_eq!(code(get().await), S3ErrorCode::NoSuchTagSet);
    let input = PutBucketTaggingInput::builder()
        .bucket("b".into())
        .tagging(tagging(&[("cost", "backups"), ("env", "prod")]))
        .build()
        .unwrap();
    g.put_bucket_tagging(req(input)).await.unwrap();
    let got: Vec<_> = get()
        .await
        .unwrap()
        .output
        .tag_set
        .into_iter()
        .map(|t| (t.key.unwrap(), t.value.unwrap()))
        .collect();
    assert_eq!(got, pairs(&[("cost", "backups"), ("env", "prod")]));
    let input = PutBucketTaggingInput::builder()
        .bucket("b".into())
        .tagging(tagging(&[("a", "1"), ("a", "2")]))
        .build()
        .unwrap();
    assert_eq!(code(g.put_bucket_tagging(req(input)).await), S3ErrorCode::InvalidTag);
    g.delete_bucket_tagging(req(DeleteBucketTaggingInput {
        bucket: "b".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    assert_eq!(code(get().await), S3ErrorCode::NoSuchTagSet);
}
