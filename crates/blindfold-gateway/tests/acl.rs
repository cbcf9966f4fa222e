//! ACLs through the S3 operations: the canned ACLs the gateway honours (private, public-read,
//! authenticated-read) are kept and read back as grants; anything else (public-read-write,
//! grants to other accounts) is refused clearly, and the write it came with does not happen.
//! Who may then read is tested over HTTP in `sharing.rs`.

use s3s::dto::*;
use s3s::{S3ErrorCode, S3};

use crate::s3_api;
use s3_api::*;

fn not_supported<T: std::fmt::Debug>(r: s3s::S3Result<T>) {
    let e = r.expect_err("refused");
    assert_eq!(e.code(), &S3ErrorCode::AccessControlListNotSupported, "{e:?}");
}

/// The groups an object's ACL grants READ to.
async fn readers(g: &blindfold_gateway::Gateway, key: &str) -> Vec<String> {
    let acl = g
        .get_object_acl(req(GetObjectAclInput {
            bucket: "b".into(),
            key: key.into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output;
    let grants = acl.grants.unwrap();
    assert_eq!(grants[0].permission.as_ref().unwrap().as_str(), Permission::FULL_CONTROL);
    assert_eq!(grants[0].grantee.as_ref().unwrap().id, acl.owner.unwrap().id);
    grants[1..].iter().map(|g| g.grantee.as_ref().unwrap().uri.clone().unwrap()).collect()
}

#[tokio::test]
async fn canned_acls_are_kept_and_grants_refused_never_ignored() {
    let s = setup(64, 256, false).await;
    let g = &s.g;
    // Anonymous writes and grants to others are refused, and nothing is written.
    for (key, acl, grant) in [
        ("rw", Some(ObjectCannedACL::PUBLIC_READ_WRITE), None),
        ("granted", None, Some("uri=\"http://acs.amazonaws.com/groups/global/AllUsers\"")),
    ] {
        let input = PutObjectInput {
            bucket: "b".into(),
            key: key.into(),
            body: blob(b"x"),
            acl: acl.map(ObjectCannedACL::from_static),
            grant_read: grant.map(Into::into),
            ..Default::default()
        };
        not_supported(g.put_object(req(input)).await);
        assert_eq!(code(get(g, key, None).await), S3ErrorCode::NoSuchKey);
    }
    // Private, public-read and authenticated-read are kept and read back.
    for (key, acl, want) in [
        ("private", ObjectCannedACL::PRIVATE, vec![]),
        ("public", ObjectCannedACL::PUBLIC_READ, vec!["AllUsers"]),
        ("signed", ObjectCannedACL::AUTHENTICATED_READ, vec!["AuthenticatedUsers"]),
    ] {
        let input = PutObjectInput {
            bucket: "b".into(),
            key: key.into(),
            body: blob(b"x"),
            acl: Some(ObjectCannedACL::from_static(acl)),
            ..Default::default()
        };
        g.put_object(req(input)).await.unwrap();
        let got = readers(g, key).await;
        assert_eq!(got.len(), want.len(), "{key}: {got:?}");
        assert!(got.iter().zip(&want).all(|(g, w)| g.ends_with(w)), "{key}: {got:?}");
    }
    // PutObjectAcl changes it; a refused one leaves it as it was.
    let set = |acl: &'static str| PutObjectAclInput {
        bucket: "b".into(),
        key: "public".into(),
        acl: Some(ObjectCannedACL::from_static(acl)),
        ..Default::default()
    };
    not_supported(g.put_object_acl(req(set(ObjectCannedACL::PUBLIC_READ_WRITE))).await);
    assert_eq!(readers(g, "public").await.len(), 1);
    g.put_object_acl(req(set(ObjectCannedACL::PRIVATE))).await.unwrap();
    assert!(readers(g, "public").await.is_empty());
    // Buckets: a public-read-write one is not created; public-read is kept.
    let input = CreateBucketInput {
        bucket: "shared".into(),
        acl: Some(BucketCannedACL::from_static(BucketCannedACL::PUBLIC_READ_WRITE)),
        ..Default::default()
    };
    not_supported(g.create_bucket(req(input)).await);
    let head =
        g.head_bucket(req(HeadBucketInput { bucket: "shared".into(), ..Default::default() }));
    assert_eq!(code(head.await), S3ErrorCode::NoSuchBucket);
    let bucket_grants =
        || g.get_bucket_acl(req(GetBucketAclInput { bucket: "b".into(), ..Default::default() }));
    let input = PutBucketAclInput {
        bucket: "b".into(),
        acl: Some(BucketCannedACL::from_static(BucketCannedACL::PUBLIC_READ)),
        ..Default::default()
    };
    g.put_bucket_acl(req(input)).await.unwrap();
    assert_eq!(bucket_grants().await.unwrap().output.grants.unwrap().len(), 2);
    let input = PutBucketAclInput {
        bucket: "b".into(),
        acl: Some(BucketCannedACL::from_static(BucketCannedACL::PRIVATE)),
        ..Default::default()
    };
    g.put_bucket_acl(req(input)).await.unwrap();
    assert_eq!(bucket_grants().await.unwrap().output.grants.unwrap().len(), 1);
}

#[tokio::test]
async fn bucket_names_s3_refuses_are_refused() {
    let s = setup(64, 256, false).await;
    for name in ["a.-b", "a-.b", "a..b"] {
        let input = CreateBucketInput { bucket: name.into(), ..Default::default() };
        assert_eq!(code(s.g.create_bucket(req(input)).await), S3ErrorCode::InvalidBucketName);
    }
    let input = CreateBucketInput { bucket: "a-b.c".into(), ..Default::default() };
    s.g.create_bucket(req(input)).await.unwrap();
}
