//! The S3 calls of bucket policies ([`crate::sharing`] holds the rules).

use s3s::{S3Error, S3ErrorCode, S3Result};

use super::{s3, Gateway};
use crate::sharing::{self, Policy};

impl Gateway {
    /// A bucket's policy; `None`: none set.
    pub(super) fn bucket_policy(&self, bucket: &str) -> S3Result<Option<Policy>> {
        self.objects.directory().require_bucket(bucket).map_err(s3)?;
        sharing::policy_of(self.objects.directory(), bucket).map_err(s3)
    }

    /// PutBucketPolicy (`Some`) and DeleteBucketPolicy (`None`).
    pub(super) async fn set_bucket_policy(&self, bucket: &str, doc: Option<&str>) -> S3Result<()> {
        self.objects.directory().require_bucket(bucket).map_err(s3)?;
        let policy = doc
            .map(|d| Policy::parse(d, bucket))
            .transpose()
            .map_err(|why| S3Error::with_message(S3ErrorCode::MalformedPolicy, why))?;
        self.set_setting(bucket, sharing::POLICY, policy.as_ref()).await?;
        tracing::debug!(set = doc.is_some(), "bucket policy changed");
        Ok(())
    }

    /// GetBucketPolicy.
    pub(super) fn policy_document(&self, bucket: &str) -> S3Result<String> {
        match self.bucket_policy(bucket)? {
            Some(p) => Ok(p.document().to_owned()),
            None => Err(S3Error::with_message(
                S3ErrorCode::NoSuchBucketPolicy,
                "The bucket policy does not exist",
            )),
        }
    }
}
