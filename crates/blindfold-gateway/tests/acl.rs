//! ACLs, disabled as in an S3 bucket whose owner enforces ownership: reading an ACL answers
//! the owner's full control; setting one that says only that succeeds; anything that would
//! share a bucket or object is refused clearly, and the write it came with does not happen.

use s3s::dto::*;
use s3s::{S3ErrorCode, S3};

use crate::s3_api;
use s3_api::*;

fn not_supported<T: std::fmt::Debug>(r: s3s::S3Result<T>) {
    let e = r.expect_err("refused");
    assert_eq!(e.code(), &S3ErrorCode::AccessControlListNotSupported, "{e:?}");
    assert!(e.message().unwrap().contains("blindfold user add"), "{e:?}");
}

#[tokio::test]
async fn grants_are_refused_never_ignored() {
    let s = setup(64, 256, false).await;
    let g = &s.g;
    // A public object is refused, and not written.
    let input = PutObjectInput {
        bucket: "b".into(),
        key: "public".into(),
        body: blob(b"x"),
        acl: Some(ObjectCannedACL::from_static(ObjectCannedACL::PUBLIC_READ)),
        ..Default::default()
    };
    not_supported(g.put_object(req(input)).await);
    assert_eq!(code(get(g, "public", None).await), S3ErrorCode::NoSuchKey);
    let input = PutObjectInput {
        bucket: "b".into(),
        key: "granted".into(),
        body: blob(b"x"),
        grant_read: Some("uri=\"http://acs.amazonaws.com/groups/global/AllUsers\"".into()),
        ..Default::default()
    };
    not_supported(g.put_object(req(input)).await);
    // Private says what the gateway does anyway.
    let input = PutObjectInput {
        bucket: "b".into(),
        key: "private".into(),
        body: blob(b"x"),
        acl: Some(ObjectCannedACL::from_static(ObjectCannedACL::PRIVATE)),
        ..Default::default()
    };
    g.put_object(req(input)).await.unwrap();
    let acl = g
        .get_object_acl(req(GetObjectAclInput {
            bucket: "b".into(),
            key: "private".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .output;
    let grants = acl.grants.unwrap();
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0].permission.as_ref().unwrap().as_str(), Permission::FULL_CONTROL);
    assert_eq!(grants[0].grantee.as_ref().unwrap().id, acl.owner.unwrap().id);
    let input = PutObjectAclInput {
        bucket: "b".into(),
        key: "private".into(),
        acl: Some(ObjectCannedACL::from_static(ObjectCannedACL::AUTHENTICATED_READ)),
        ..Default::default()
    };
    not_supported(g.put_object_acl(req(input)).await);
    // Buckets: a public one is not created; the ACL of one that exists reads as private.
    let input = CreateBucketInput {
        bucket: "shared".into(),
        acl: Some(BucketCannedACL::from_static(BucketCannedACL::PUBLIC_READ)),
        ..Default::default()
    };
    not_supported(g.create_bucket(req(input)).await);
    let head =
        g.head_bucket(req(HeadBucketInput { bucket: "shared".into(), ..Default::default() }));
    assert_eq!(code(head.await), S3ErrorCode::NoSuchBucket);
    let input = PutBucketAclInput {
        bucket: "b".into(),
        acl: Some(BucketCannedACL::from_static(BucketCannedACL::PUBLIC_READ_WRITE)),
        ..Default::default()
    };
    not_supported(g.put_bucket_acl(req(input)).await);
    let input = PutBucketAclInput {
        bucket: "b".into(),
        acl: Some(BucketCannedACL::from_static(BucketCannedACL::PRIVATE)),
        ..Default::default()
    };
    g.put_bucket_acl(req(input)).await.unwrap();
    let acl = g
        .get_bucket_acl(req(GetBucketAclInput { bucket: "b".into(), ..Default::default() }))
        .await
        .unwrap()
        .output;
    assert_eq!(acl.grants.unwrap().len(), 1);
}
