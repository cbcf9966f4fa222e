//! Server-side encryption requests through the S3 operations: an SSE-C object needs its key
//! on every read, copy and part upload (checked by its MD5 and against the key it was written
//! with), SSE-S3 is reported back, SSE-KMS is refused, and nothing refused is written.

use base64::Engine as _;
use md5::Digest as _;
use s3s::dto::*;
use s3s::{S3ErrorCode, S3};

use crate::s3_api;
use s3_api::*;

/// The three SSE-C header values of a key made of `byte`.
fn key(byte: u8) -> (String, String, String) {
    let b64 = base64::engine::general_purpose::STANDARD;
    ("AES256".into(), b64.encode([byte; 32]), b64.encode(md5::Md5::digest([byte; 32])))
}

async fn get_with(
    g: &blindfold_gateway::Gateway,
    k: &str,
    sse: Option<(String, String, String)>,
) -> s3s::S3Result<Vec<u8>> {
    let (a, k2, m) = sse.map_or((None, None, None), |(a, k, m)| (Some(a), Some(k), Some(m)));
    let input = GetObjectInput {
        bucket: "b".into(),
        key: k.into(),
        sse_customer_algorithm: a,
        sse_customer_key: k2,
        sse_customer_key_md5: m,
        ..Default::default()
    };
    let out = g.get_object(req(input)).await?.output;
    assert!(out.sse_customer_key_md5.is_some() == k.starts_with("sse-c"), "{k}");
    Ok(read(out.body).await)
}

#[tokio::test]
async fn sse_c_needs_its_key_on_every_read_and_kms_is_refused() {
    let s = setup(64, 256, false).await;
    let g = &s.g;
    let (a, k, m) = key(7);
    let input = PutObjectInput {
        bucket: "b".into(),
        key: "sse-c".into(),
        body: blob(b"customer data"),
        sse_customer_algorithm: Some(a.clone()),
        sse_customer_key: Some(k.clone()),
        sse_customer_key_md5: Some(m.clone()),
        ..Default::default()
    };
    let out = g.put_object(req(input)).await.unwrap().output;
    assert_eq!(out.sse_customer_key_md5.as_deref(), Some(m.as_str()));
    // Reads: the right key opens it; no key, another key, a key to a plain object: refused.
    assert_eq!(get_with(g, "sse-c", Some(key(7))).await.unwrap(), b"customer data");
    assert_eq!(code(get_with(g, "sse-c", None).await), S3ErrorCode::InvalidRequest);
    assert_eq!(code(get_with(g, "sse-c", Some(key(8))).await), S3ErrorCode::InvalidRequest);
    let head = |sse: Option<(String, String, String)>| {
        let (a, k, m) = sse.map_or((None, None, None), |(a, k, m)| (Some(a), Some(k), Some(m)));
        g.head_object(req(HeadObjectInput {
            bucket: "b".into(),
            key: "sse-c".into(),
            sse_customer_algorithm: a,
            sse_customer_key: k,
            sse_customer_key_md5: m,
            ..Default::default()
        }))
    };
    assert_eq!(code(head(None).await), S3ErrorCode::InvalidRequest);
    assert!(head(Some(key(7))).await.is_ok());
    put(g, "plain", b"plain data").await;
    assert_eq!(code(get_with(g, "plain", Some(key(7))).await), S3ErrorCode::InvalidRequest);
    // A wrong MD5 is refused, and nothing is written.
    let input = PutObjectInput {
        bucket: "b".into(),
        key: "bad-md5".into(),
        body: blob(b"x"),
        sse_customer_algorithm: Some(a.clone()),
        sse_customer_key: Some(k.clone()),
        sse_customer_key_md5: Some(key(9).2),
        ..Default::default()
    };
    assert_eq!(code(g.put_object(req(input)).await), S3ErrorCode::InvalidArgument);
    assert_eq!(code(get(g, "bad-md5", None).await), S3ErrorCode::NoSuchKey);
    // A copy reads its source with the source's key.
    let copy = |with_key: bool| {
        let mut input = CopyObjectInput::builder()
            .bucket("b".into())
            .key("copied".into())
            .copy_source(CopySource::Bucket {
                bucket: "b".into(),
                key: "sse-c".into(),
                version_id: None,
            })
            .build()
            .unwrap();
        if with_key {
            input.copy_source_sse_customer_algorithm = Some(a.clone());
            input.copy_source_sse_customer_key = Some(k.clone());
            input.copy_source_sse_customer_key_md5 = Some(m.clone());
        }
        input
    };
    assert_eq!(code(g.copy_object(req(copy(false))).await), S3ErrorCode::InvalidRequest);
    g.copy_object(req(copy(true))).await.unwrap();
    assert_eq!(get(g, "copied", None).await.unwrap(), b"customer data", "copied unencrypted");
    // Multipart: every part carries the upload's key.
    let create = CreateMultipartUploadInput {
        bucket: "b".into(),
        key: "sse-c-mp".into(),
        sse_customer_algorithm: Some(a.clone()),
        sse_customer_key: Some(k.clone()),
        sse_customer_key_md5: Some(m.clone()),
        ..Default::default()
    };
    let id = g.create_multipart_upload(req(create)).await.unwrap().output.upload_id.unwrap();
    let part = |sse: Option<(String, String, String)>| {
        let (a, k, m) = sse.map_or((None, None, None), |(a, k, m)| (Some(a), Some(k), Some(m)));
        g.upload_part(req(UploadPartInput {
            bucket: "b".into(),
            key: "sse-c-mp".into(),
            upload_id: id.clone(),
            part_number: 1,
            body: blob(b"part"),
            sse_customer_algorithm: a,
            sse_customer_key: k,
            sse_customer_key_md5: m,
            ..Default::default()
        }))
    };
    assert_eq!(code(part(None).await), S3ErrorCode::InvalidRequest);
    assert_eq!(code(part(Some(key(8))).await), S3ErrorCode::InvalidRequest);
    part(Some(key(7))).await.unwrap();

    // SSE-S3 is reported; SSE-KMS is refused and not written.
    let input = PutObjectInput {
        bucket: "b".into(),
        key: "s3".into(),
        body: blob(b"x"),
        server_side_encryption: Some(ServerSideEncryption::from_static("AES256")),
        ..Default::default()
    };
    let out = g.put_object(req(input)).await.unwrap().output;
    assert_eq!(out.server_side_encryption.unwrap().as_str(), "AES256");
    let got = g
        .get_object(req(GetObjectInput {
            bucket: "b".into(),
            key: "s3".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output;
    assert_eq!(got.server_side_encryption.unwrap().as_str(), "AES256");
    // A read that names SSE-S3 or SSE-KMS is refused (those are headers of writes).
    let mut read_kms =
        req(GetObjectInput { bucket: "b".into(), key: "s3".into(), ..Default::default() });
    read_kms.headers.insert("x-amz-server-side-encryption", "aws:kms".parse().unwrap());
    assert_eq!(code(g.get_object(read_kms).await), S3ErrorCode::InvalidArgument);
    let input = PutObjectInput {
        bucket: "b".into(),
        key: "kms".into(),
        body: blob(b"x"),
        server_side_encryption: Some(ServerSideEncryption::from_static("aws:kms")),
        ssekms_key_id: Some("key-1".into()),
        ..Default::default()
    };
    let e = g.put_object(req(input)).await.unwrap_err();
    assert_eq!(e.code(), &S3ErrorCode::InvalidArgument);
    assert!(e.message().unwrap().contains("SSE-KMS"), "{e:?}");
    assert_eq!(code(get(g, "kms", None).await), S3ErrorCode::NoSuchKey);
}
