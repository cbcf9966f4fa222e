//! The S3 calls of object lock ([`crate::lock`] holds the rules): bucket configuration,
//! retention and legal holds of versions, and the lock of a new version.

use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Result};

use super::{malformed, ns_of, s3, timestamp, Gateway};
use crate::directory::{now_ns, ObjectMeta, Version, Versioning};
use crate::lock::{self, BucketLock, DefaultRetention as DefaultPeriod, Mode, Retention};
use crate::GatewayError;

type Entries = Vec<(String, Option<String>)>;

fn no_lock() -> S3Error {
    s3_error!(
        InvalidRequest,
        "Bucket is missing Object Lock Configuration: object lock is enabled when a bucket is \
         created (x-amz-bucket-object-lock-enabled: true) or with PutObjectLockConfiguration \
         on a bucket with versioning enabled"
    )
}

fn parse_mode(m: Option<&str>) -> S3Result<Mode> {
    m.and_then(Mode::parse)
        .ok_or_else(|| malformed("the retention mode must be GOVERNANCE or COMPLIANCE"))
}

/// A legal hold status as S3 spells it (`ON`, `OFF`).
fn parse_hold(s: &str) -> Option<bool> {
    match s {
        "ON" => Some(true),
        "OFF" => Some(false),
        _ => None,
    }
}

/// What GET and HEAD report of a version's lock.
pub(super) struct LockHeaders {
    pub mode: Option<ObjectLockMode>,
    pub until: Option<Timestamp>,
    pub hold: Option<ObjectLockLegalHoldStatus>,
}

impl LockHeaders {
    pub(super) fn of(meta: &ObjectMeta) -> Self {
        let r = lock::retention(meta);
        let hold = meta.metadata.contains_key(lock::HOLD_KEY).then(|| {
            ObjectLockLegalHoldStatus::from_static(if lock::legal_hold(meta) {
                "ON"
            } else {
                "OFF"
            })
        });
        Self {
            mode: r.map(|r| ObjectLockMode::from(r.mode.as_str().to_string())),
            until: r.and_then(|r| timestamp(r.until_ns)),
            hold,
        }
    }
}

impl Gateway {
    /// The bucket's object lock configuration; `None`: object lock is off.
    pub(super) fn bucket_lock(&self, bucket: &str) -> S3Result<Option<BucketLock>> {
        let dir = self.objects.directory();
        dir.require_bucket(bucket).map_err(s3)?;
        let doc = dir.bucket_setting(bucket, lock::SETTING).map_err(s3)?;
        crate::directory::parse_setting(doc, lock::SETTING).map_err(s3)
    }

    /// Whether a request that asked to bypass governance retention (`asked`) may: its
    /// signer is the administrator or a user the users file allows to.
    pub(super) fn bypasses<T>(&self, req: &S3Request<T>, asked: Option<bool>) -> bool {
        if asked != Some(true) {
            return false;
        }
        match (&self.access, &req.credentials) {
            (None, _) => true,
            (Some(a), Some(c)) => a.may_bypass_governance(&c.access_key),
            (Some(_), None) => false,
        }
    }

    /// The lock entries of a new version of an object in `bucket`: the retention and legal
    /// hold the request names, else the bucket's default retention.
    pub(super) fn new_version_lock(
        &self,
        bucket: &str,
        mode: Option<&ObjectLockMode>,
        until: Option<&Timestamp>,
        hold: Option<&ObjectLockLegalHoldStatus>,
    ) -> S3Result<Entries> {
        let asked = mode.is_some() || until.is_some() || hold.is_some();
        if !asked {
            return Ok(Vec::new());
        }
        if self.bucket_lock(bucket)?.is_none() {
            return Err(no_lock());
        }
        let now = now_ns();
        let retention = match (mode, until) {
            (Some(m), Some(u)) => {
                let mode = Mode::parse(m.as_str())
                    .ok_or_else(|| s3_error!(InvalidArgument, "Unknown wormMode directive."))?;
                let until_ns = ns_of(u);
                if until_ns <= now {
                    return Err(s3_error!(
                        InvalidArgument,
                        "The retain until date must be in the future!"
                    ));
                }
                Some(Retention { mode, until_ns })
            }
            // The bucket's default, if any, is given where the version is written
            // (crate::lock::fill_default), for every front end.
            (None, None) => None,
            _ => {
                return Err(s3_error!(
                    InvalidArgument,
                    "x-amz-object-lock-retain-until-date and x-amz-object-lock-mode must both \
                     be supplied"
                ))
            }
        };
        let mut entries =
            if retention.is_some() { lock::retention_entries(retention) } else { Vec::new() };
        if let Some(h) = hold {
            let on = parse_hold(h.as_str()).ok_or_else(|| {
                s3_error!(InvalidArgument, "Legal Hold must be either of 'ON' or 'OFF'")
            })?;
            entries.push(lock::hold_entry(on));
        }
        Ok(entries)
    }

    /// Turns object lock on for a bucket just created with it: versioning on, no default.
    pub(super) async fn lock_new_bucket(&self, bucket: &str) -> S3Result<()> {
        let doc = serde_json::to_string(&BucketLock::default()).expect("serialises");
        self.objects
            .directory()
            .transact_durable(&[], |tx| {
                let mut config = tx.bucket_config(bucket)?;
                config.versioning = Versioning::Enabled;
                tx.set_bucket_config(bucket, &config)?;
                tx.set_bucket_setting(bucket, lock::SETTING, Some(&doc))
            })
            .await
            .map_err(s3)
    }

    /// PutObjectLockConfiguration: turns object lock on (versioning must be enabled; it
    /// cannot be turned off again) and sets or clears the default retention.
    pub(super) async fn put_lock_configuration(
        &self,
        bucket: &str,
        conf: Option<ObjectLockConfiguration>,
    ) -> S3Result<()> {
        let conf = conf.ok_or_else(|| malformed("an ObjectLockConfiguration is required"))?;
        if conf.object_lock_enabled.as_ref().map(|e| e.as_str()) != Some("Enabled") {
            return Err(malformed("ObjectLockEnabled must be Enabled"));
        }
        let default = match conf.rule.and_then(|r| r.default_retention) {
            None => None,
            Some(d) => {
                let mode = parse_mode(d.mode.as_ref().map(|m| m.as_str()))?;
                let period = |n: Option<i32>| -> S3Result<Option<u32>> {
                    match n {
                        Some(n) if n <= 0 => {
                            let mut e = S3Error::with_message(
                                S3ErrorCode::Custom("InvalidRetentionPeriod".into()),
                                "the default retention period must be a positive number of \
                                 days or years",
                            );
                            e.set_status_code(hyper::StatusCode::BAD_REQUEST);
                            Err(e)
                        }
                        n => Ok(n.map(|n| n as u32)),
                    }
                };
                let (days, years) = match (d.days, d.years) {
                    (Some(_), Some(_)) | (None, None) => {
                        return Err(malformed(
                            "a default retention gives either Days or Years, not both",
                        ))
                    }
                    (days, years) => (period(days)?, period(years)?),
                };
                Some(DefaultPeriod { mode, days, years })
            }
        };
        let doc = serde_json::to_string(&BucketLock { default }).expect("serialises");
        self.objects
            .directory()
            .transact_durable(&[], |tx| {
                if tx.bucket_config(bucket)?.versioning != Versioning::Enabled
                    && tx.bucket_setting(bucket, lock::SETTING)?.is_none()
                {
                    return Err(GatewayError::InvalidBucketState(
                        "object lock needs versioning: enable it on the bucket \
                         (PutBucketVersioning Enabled), then try again"
                            .into(),
                    ));
                }
                tx.set_bucket_setting(bucket, lock::SETTING, Some(&doc))
            })
            .await
            .map_err(s3)
    }

    /// GetObjectLockConfiguration.
    pub(super) fn lock_configuration(&self, bucket: &str) -> S3Result<ObjectLockConfiguration> {
        let config = self.bucket_lock(bucket)?.ok_or_else(|| {
            s3_error!(
                ObjectLockConfigurationNotFoundError,
                "Object Lock configuration does not exist for this bucket"
            )
        })?;
        Ok(ObjectLockConfiguration {
            object_lock_enabled: Some(ObjectLockEnabled::from_static(ObjectLockEnabled::ENABLED)),
            rule: config.default.map(|d| ObjectLockRule {
                default_retention: Some(DefaultRetention {
                    mode: Some(ObjectLockRetentionMode::from(d.mode.as_str().to_string())),
                    days: d.days.map(|n| n as i32),
                    years: d.years.map(|n| n as i32),
                }),
            }),
        })
    }

    /// The version an object-lock call names, in a bucket with object lock on.
    fn locked_version(
        &self,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<ObjectMeta> {
        if self.bucket_lock(bucket)?.is_none() {
            return Err(no_lock());
        }
        match self.objects.directory().version(bucket, key, version).map_err(s3)? {
            Version { object: Some(meta), .. } => Ok(meta),
            v if version.is_some() => Err(super::marker_not_allowed(&v)),
            v => Err(super::deleted_key(&v)),
        }
    }

    /// PutObjectRetention: sets a version's retention, if the rules allow the change.
    pub(super) async fn put_retention(
        &self,
        bucket: &str,
        key: &str,
        version: Option<&str>,
        retention: Option<ObjectLockRetention>,
        bypass: bool,
    ) -> S3Result<()> {
        self.locked_version(bucket, key, version)?;
        let r = retention.ok_or_else(|| malformed("a Retention is required"))?;
        let new = match (r.mode, r.retain_until_date) {
            (None, None) => None,
            (Some(m), Some(d)) => {
                Some(Retention { mode: parse_mode(Some(m.as_str()))?, until_ns: ns_of(&d) })
            }
            _ => return Err(malformed("a Retention gives both Mode and RetainUntilDate")),
        };
        let now = now_ns();
        if new.is_some_and(|n| n.until_ns <= now) {
            return Err(s3_error!(InvalidArgument, "The retain until date must be in the future!"));
        }
        self.objects
            .directory()
            .transact_durable(&[], |tx| {
                if let Some(meta) = tx.version(bucket, key, version)?.object {
                    lock::check_change(lock::retention(&meta), new, bypass, now)?;
                }
                tx.set_object_entries(bucket, key, version, &lock::retention_entries(new))
            })
            .await
            .map_err(s3)?;
        Ok(())
    }

    /// GetObjectRetention.
    pub(super) fn retention_of(
        &self,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<ObjectLockRetention> {
        let meta = self.locked_version(bucket, key, version)?;
        let r = lock::retention(&meta).ok_or_else(|| {
            s3_error!(
                NoSuchObjectLockConfiguration,
                "The specified object does not have a ObjectLock configuration"
            )
        })?;
        Ok(ObjectLockRetention {
            mode: Some(ObjectLockRetentionMode::from(r.mode.as_str().to_string())),
            retain_until_date: timestamp(r.until_ns),
        })
    }

    /// PutObjectLegalHold.
    pub(super) async fn put_legal_hold(
        &self,
        bucket: &str,
        key: &str,
        version: Option<&str>,
        hold: Option<ObjectLockLegalHold>,
    ) -> S3Result<()> {
        self.locked_version(bucket, key, version)?;
        let on = hold
            .and_then(|h| h.status)
            .and_then(|s| parse_hold(s.as_str()))
            .ok_or_else(|| malformed("the legal hold Status must be ON or OFF"))?;
        self.objects
            .directory()
            .transact_durable(&[], |tx| {
                tx.set_object_entries(bucket, key, version, &[lock::hold_entry(on)])
            })
            .await
            .map_err(s3)?;
        Ok(())
    }

    /// GetObjectLegalHold.
    pub(super) fn legal_hold_of(
        &self,
        bucket: &str,
        key: &str,
        version: Option<&str>,
    ) -> S3Result<ObjectLockLegalHold> {
        let meta = self.locked_version(bucket, key, version)?;
        let status = if lock::legal_hold(&meta) { "ON" } else { "OFF" };
        Ok(ObjectLockLegalHold { status: Some(ObjectLockLegalHoldStatus::from_static(status)) })
    }
}
