//! Who may run which S3 request: the users file first, then the bucket's policy and canned
//! ACLs ([`crate::sharing`]). Runs before a request's body is read; every answer comes from
//! the directory, none from the store.

use std::sync::Arc;

use s3s::access::{S3Access, S3AccessContext};
use s3s::dto::*;
use s3s::path::S3Path;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Result};

use crate::objects::ObjectLayer;
use crate::sharing::{self, AclTarget, Canned, Decision, Policy, Who};
use crate::users::{is_read, Access, Caller};

/// The S3 front end's access check.
pub struct Authorizer {
    access: Arc<Access>,
    objects: Arc<ObjectLayer>,
}

impl Authorizer {
    /// Decides with `access` (the users file) and the bucket settings of `objects`.
    pub fn new(access: Arc<Access>, objects: Arc<ObjectLayer>) -> Self {
        Self { access, objects }
    }

    fn policy(&self, bucket: &str) -> S3Result<Option<Policy>> {
        // A missing bucket has no policy; the operation answers NoSuchBucket itself.
        sharing::policy_of(self.objects.directory(), bucket).map_err(super::s3)
    }

    /// The canned ACL that decides a read: the bucket's, or the object version's. Anything
    /// unreadable (no such bucket, key or version) counts as private.
    fn canned(&self, bucket: &str, key: Option<(&str, Option<&str>)>) -> Canned {
        let dir = self.objects.directory();
        match key {
            None => sharing::bucket_acl(dir, bucket).unwrap_or(Canned::Private),
            Some((key, version)) => dir
                .version(bucket, key, version)
                .ok()
                .and_then(|v| v.object)
                .map_or(Canned::Private, |m| sharing::object_acl(&m.metadata)),
        }
    }

    /// Whether `caller` may run `op` on `bucket` (and `key`, of `version`). `Err` is the
    /// refusal to send.
    fn authorize(
        &self,
        caller: &Caller,
        op: &str,
        bucket: &str,
        key: Option<&str>,
        version: Option<&str>,
    ) -> S3Result<()> {
        let policy = self.policy(bucket)?;
        self.authorize_under(policy.as_ref(), caller, op, bucket, key, version)
    }

    /// [`Authorizer::authorize`] under the bucket's `policy`, read once by the caller (once
    /// for all the keys of a DeleteObjects).
    fn authorize_under(
        &self,
        policy: Option<&Policy>,
        caller: &Caller,
        op: &str,
        bucket: &str,
        key: Option<&str>,
        version: Option<&str>,
    ) -> S3Result<()> {
        let who = Who::of(caller);
        let action = sharing::action_of(op);
        let resource = match key {
            Some(k) => format!("{bucket}/{k}"),
            None => bucket.to_owned(),
        };
        let decision = match policy {
            Some(p) => p.decide(&who, &action, &resource),
            None => Decision::Silent,
        };
        if decision == Decision::Deny && !(who == Who::Admin && sharing::manages_policy(op)) {
            tracing::debug!(op, "request denied by the bucket policy");
            return Err(S3Error::with_message(
                S3ErrorCode::AccessDenied,
                format!("Access Denied: the bucket policy denies {action} here"),
            ));
        }
        if !is_read(op) && !caller.may_write() {
            // No policy makes an unsigned request or a read-only user write.
            return Err(refusal(caller));
        }
        if caller.may(op, bucket) || decision == Decision::Allow {
            return Ok(());
        }
        let by_acl = match sharing::read_by_acl(op) {
            Some(AclTarget::Bucket) => self.canned(bucket, None),
            Some(AclTarget::Object) => match key {
                Some(k) => self.canned(bucket, Some((k, version))),
                None => Canned::Private,
            },
            None => Canned::Private,
        };
        if by_acl.lets_read(&who) {
            return Ok(());
        }
        Err(refusal(caller))
    }

    fn caller<T>(&self, req: &S3Request<T>) -> Caller {
        self.access.caller(req.credentials.as_ref().map(|c| c.access_key.as_str()))
    }

    fn check_copy_source<T>(&self, req: &S3Request<T>, source: &CopySource) -> S3Result<()> {
        match source {
            CopySource::Bucket { bucket, key, version_id } => self.authorize(
                &self.caller(req),
                "GetObject",
                bucket,
                Some(key),
                version_id.as_deref(),
            ),
            _ => Err(s3_error!(AccessDenied, "Access Denied")),
        }
    }
}

fn refusal(caller: &Caller) -> S3Error {
    match caller {
        Caller::Anonymous => s3_error!(AccessDenied, "Access Denied (the request is unsigned)"),
        _ => s3_error!(AccessDenied, "Access Denied"),
    }
}

/// The `versionId` of a request's query, if any.
fn version_of(uri: &hyper::Uri) -> Option<String> {
    let q = uri.query()?;
    serde_urlencoded::from_str::<Vec<(String, String)>>(q)
        .ok()?
        .into_iter()
        .find_map(|(k, v)| (k == "versionId").then_some(v))
}

#[async_trait::async_trait]
impl S3Access for Authorizer {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let caller = self.access.caller(cx.credentials().map(|c| c.access_key.as_str()));
        let op = cx.s3_op().name();
        match cx.s3_path() {
            // ListBuckets (filtered by the gateway); nothing else works on the root.
            S3Path::Root => match caller {
                Caller::Anonymous => Err(s3_error!(AccessDenied, "Signature is required")),
                Caller::Admin => Ok(()),
                Caller::User(_) if op == "ListBuckets" => Ok(()),
                Caller::User(_) => Err(s3_error!(AccessDenied, "Access Denied")),
            },
            // Decided key by key, in `delete_objects`.
            S3Path::Bucket { .. } if op == "DeleteObjects" => Ok(()),
            S3Path::Bucket { bucket } => self.authorize(&caller, op, bucket, None, None),
            S3Path::Object { bucket, key } => {
                let version = version_of(cx.uri());
                self.authorize(&caller, op, bucket, Some(key), version.as_deref())
            }
        }
    }

    async fn copy_object(&self, req: &mut S3Request<CopyObjectInput>) -> S3Result<()> {
        let source = req.input.copy_source.clone();
        self.check_copy_source(req, &source)
    }

    async fn upload_part_copy(&self, req: &mut S3Request<UploadPartCopyInput>) -> S3Result<()> {
        let source = req.input.copy_source.clone();
        self.check_copy_source(req, &source)
    }

    async fn delete_objects(&self, req: &mut S3Request<DeleteObjectsInput>) -> S3Result<()> {
        let caller = self.caller(req);
        let bucket = &req.input.bucket;
        if req.input.delete.objects.is_empty() {
            return self.authorize(&caller, "DeleteObjects", bucket, None, None);
        }
        let policy = self.policy(bucket)?;
        for o in &req.input.delete.objects {
            self.authorize_under(
                policy.as_ref(),
                &caller,
                "DeleteObject",
                bucket,
                Some(&o.key),
                None,
            )?;
        }
        Ok(())
    }
}
