//! The S3 calls of CORS configuration ([`crate::cors`] holds the rules; the HTTP layer
//! answers preflights and adds the headers).

use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};

use super::{s3, Gateway};
use crate::cors::{self, Rule, Rules};

impl Gateway {
    /// PutBucketCors (`Some`) and DeleteBucketCors (`None`).
    pub(super) async fn set_cors(
        &self,
        bucket: &str,
        conf: Option<CORSConfiguration>,
    ) -> S3Result<()> {
        self.objects.directory().require_bucket(bucket).map_err(s3)?;
        let doc = match conf {
            None => None,
            Some(c) => {
                let rules = Rules {
                    rules: c
                        .cors_rules
                        .into_iter()
                        .map(|r| Rule {
                            id: r.id,
                            origins: r.allowed_origins,
                            methods: r.allowed_methods,
                            headers: r.allowed_headers.unwrap_or_default(),
                            expose: r.expose_headers.unwrap_or_default(),
                            max_age: r.max_age_seconds,
                        })
                        .collect(),
                };
                rules
                    .check()
                    .map_err(|why| S3Error::with_message(S3ErrorCode::InvalidRequest, why))?;
                Some(serde_json::to_string(&rules).map_err(|e| s3_error!(InternalError, "{e}"))?)
            }
        };
        self.objects
            .directory()
            .transact_durable(&[], |tx| {
                tx.set_bucket_setting(bucket, cors::SETTING, doc.as_deref())
            })
            .await
            .map_err(s3)
    }

    /// GetBucketCors.
    pub(super) fn cors_rules(&self, bucket: &str) -> S3Result<CORSRules> {
        let dir = self.objects.directory();
        dir.require_bucket(bucket).map_err(s3)?;
        let doc = dir.bucket_setting(bucket, cors::SETTING).map_err(s3)?;
        let rules: Rules =
            crate::directory::parse_setting(doc, cors::SETTING).map_err(s3)?.ok_or_else(|| {
                s3_error!(NoSuchCORSConfiguration, "The CORS configuration does not exist")
            })?;
        let some = |v: Vec<String>| (!v.is_empty()).then_some(v);
        Ok(rules
            .rules
            .into_iter()
            .map(|r| CORSRule {
                id: r.id,
                allowed_origins: r.origins,
                allowed_methods: r.methods,
                allowed_headers: some(r.headers),
                expose_headers: some(r.expose),
                max_age_seconds: r.max_age,
            })
            .collect())
    }
}
