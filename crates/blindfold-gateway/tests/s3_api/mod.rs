//! A gateway driven through its S3 operations directly (no HTTP), over a recorded in-memory
//! store: for the versioning and tagging tests.
#![allow(dead_code)]

use std::sync::Arc;

use blindfold_crypto::{MasterKey, StoreId};
use blindfold_gateway::objects::ObjectLayer;
use blindfold_gateway::{Directory, Gateway};
use blindfold_oram::PathOramConfig;
use blindfold_proxy::{DurablePathOram, SealedPathOram};
use blindfold_store::{MemoryStore, RecordingStore, Store};
use futures::StreamExt;
use s3s::dto::*;
use s3s::{S3ErrorCode, S3Request, S3Result, S3};

pub struct Setup {
    pub g: Gateway,
    pub layer: Arc<ObjectLayer>,
    pub recording: Arc<RecordingStore<MemoryStore>>,
    pub _dir: tempfile::TempDir,
}

/// A gateway of `blocks` blocks of `block_size` bytes with the bucket `b`.
pub async fn setup(blocks: u64, block_size: u32, pad: bool) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let config = PathOramConfig::builder(blocks, block_size).build().unwrap();
    let recording =
        Arc::new(RecordingStore::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap())));
    let store: Arc<dyn Store> = recording.clone();
    let key = MasterKey::generate();
    let engine =
        DurablePathOram::create(&dir.path().join("oram"), config, store, &key, StoreId::random())
            .await
            .unwrap();
    let directory = Directory::open(&dir.path().join("meta.redb"), blocks, &key).unwrap();
    directory.create_bucket("b").unwrap();
    let layer = Arc::new(ObjectLayer::new(directory, engine, pad));
    Setup { g: Gateway::new(Arc::clone(&layer)), layer, recording, _dir: dir }
}

pub fn req<T>(input: T) -> S3Request<T> {
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

pub fn blob(data: &[u8]) -> Option<StreamingBlob> {
    Some(StreamingBlob::from(s3s::Body::from(bytes::Bytes::copy_from_slice(data))))
}

pub async fn read(body: Option<StreamingBlob>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut body = body.unwrap();
    while let Some(chunk) = body.next().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    out
}

pub fn code<T: std::fmt::Debug>(r: S3Result<T>) -> S3ErrorCode {
    r.expect_err("an error").code().clone()
}

pub async fn versioning(g: &Gateway, status: &str) {
    let input = PutBucketVersioningInput::builder()
        .bucket("b".into())
        .versioning_configuration(VersioningConfiguration {
            status: Some(BucketVersioningStatus::from(status.to_string())),
            mfa_delete: None,
        })
        .build()
        .unwrap();
    g.put_bucket_versioning(req(input)).await.unwrap();
}

/// Completes the upload `upload_id` of `bucket/key` from its one part (of ETag `etag`).
pub async fn complete_one(
    g: &Gateway,
    bucket: &str,
    key: &str,
    upload_id: String,
    etag: Option<ETag>,
) -> S3Result<CompleteMultipartUploadOutput> {
    let input = CompleteMultipartUploadInput {
        bucket: bucket.into(),
        key: key.into(),
        upload_id,
        multipart_upload: Some(CompletedMultipartUpload {
            parts: Some(vec![CompletedPart {
                e_tag: etag,
                part_number: Some(1),
                ..Default::default()
            }]),
        }),
        ..Default::default()
    };
    Ok(g.complete_multipart_upload(req(input)).await?.output)
}

/// PUT; returns the version id answered.
pub async fn put(g: &Gateway, key: &str, data: &[u8]) -> Option<String> {
    put_tagged(g, key, data, None).await
}

pub async fn put_tagged(g: &Gateway, key: &str, data: &[u8], tags: Option<&str>) -> Option<String> {
    let input = PutObjectInput {
        bucket: "b".into(),
        key: key.into(),
        body: blob(data),
        tagging: tags.map(Into::into),
        ..Default::default()
    };
    g.put_object(req(input)).await.unwrap().output.version_id
}

/// GET of a version (the current one: `None`).
pub async fn get(g: &Gateway, key: &str, version: Option<&str>) -> S3Result<Vec<u8>> {
    let input = GetObjectInput {
        bucket: "b".into(),
        key: key.into(),
        version_id: version.map(Into::into),
        ..Default::default()
    };
    let out = g.get_object(req(input)).await?;
    Ok(read(out.output.body).await)
}

/// DELETE; returns (delete marker, version id) as answered.
pub async fn delete(g: &Gateway, key: &str, version: Option<&str>) -> (bool, Option<String>) {
    let input = DeleteObjectInput {
        bucket: "b".into(),
        key: key.into(),
        version_id: version.map(Into::into),
        ..Default::default()
    };
    let out = g.delete_object(req(input)).await.unwrap().output;
    (out.delete_marker.unwrap_or(false), out.version_id)
}

/// One listing entry: (key, version id, latest, delete marker).
pub type Entry = (String, String, bool, bool);

/// ListObjectVersions, one page.
pub async fn list_page(
    g: &Gateway,
    prefix: Option<&str>,
    delimiter: Option<&str>,
    key_marker: Option<&str>,
    version_marker: Option<&str>,
    max: Option<i32>,
) -> ListObjectVersionsOutput {
    let input = ListObjectVersionsInput {
        bucket: "b".into(),
        prefix: prefix.map(Into::into),
        delimiter: delimiter.map(Into::into),
        key_marker: key_marker.map(Into::into),
        version_id_marker: version_marker.map(Into::into),
        max_keys: max,
        ..Default::default()
    };
    g.list_object_versions(req(input)).await.unwrap().output
}

/// The entries of a page, sorted (S3 answers versions and delete markers in two lists).
pub fn entries(out: &ListObjectVersionsOutput) -> Vec<Entry> {
    let mut all: Vec<Entry> = Vec::new();
    for v in out.versions.iter().flatten() {
        all.push((
            v.key.clone().unwrap(),
            v.version_id.clone().unwrap(),
            v.is_latest.unwrap(),
            false,
        ));
    }
    for m in out.delete_markers.iter().flatten() {
        all.push((
            m.key.clone().unwrap(),
            m.version_id.clone().unwrap(),
            m.is_latest.unwrap(),
            true,
        ));
    }
    all.sort();
    all
}
