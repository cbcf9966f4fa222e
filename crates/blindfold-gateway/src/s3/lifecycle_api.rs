//! The S3 calls of lifecycle ([`crate::lifecycle`] holds the rules and the worker): bucket
//! configuration, and the `x-amz-expiration` header of an object.

use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Result};

use super::{malformed, ns_of, s3, timestamp, Gateway};
use crate::directory::ObjectMeta;
use crate::lifecycle::{self, Filter, Rule, Rules};

fn invalid(why: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, why)
}

fn positive(n: Option<i32>, what: &str) -> S3Result<Option<u32>> {
    match n {
        Some(n) if n <= 0 => Err(invalid(format!("{what} must be a positive number of days"))),
        n => Ok(n.map(|n| n as u32)),
    }
}

fn size(n: Option<i64>) -> S3Result<Option<u64>> {
    match n {
        Some(n) if n < 0 => Err(invalid("an object size in a filter cannot be negative".into())),
        n => Ok(n.map(|n| n as u64)),
    }
}

fn tag_pair(t: Tag) -> S3Result<(String, String)> {
    match (t.key, t.value) {
        (Some(k), v) => Ok((k, v.unwrap_or_default())),
        _ => Err(malformed("a tag in a lifecycle filter needs a Key")),
    }
}

/// A rule of a request, checked.
fn rule_of(r: LifecycleRule, n: usize) -> S3Result<Rule> {
    let enabled = match r.status.as_str() {
        ExpirationStatus::ENABLED => true,
        ExpirationStatus::DISABLED => false,
        _ => return Err(malformed("a rule's Status must be Enabled or Disabled")),
    };
    let id = r.id.unwrap_or_else(|| format!("rule-{}", n + 1));
    if id.len() > 255 {
        return Err(invalid("a rule's ID is at most 255 characters".into()));
    }
    if r.transitions.as_ref().is_some_and(|t| !t.is_empty())
        || r.noncurrent_version_transitions.as_ref().is_some_and(|t| !t.is_empty())
    {
        return Err(S3Error::with_message(
            S3ErrorCode::InvalidStorageClass,
            "transitions are not supported: blindfold has one storage class (expirations are)",
        ));
    }
    if r.prefix.is_some() && r.filter.is_some() {
        return Err(malformed("a rule gives a Prefix or a Filter, not both"));
    }
    let filter = match r.filter {
        None => None,
        Some(f) => Some(match f.and {
            Some(a) => Filter {
                and: true,
                prefix: a.prefix,
                tags: a
                    .tags
                    .unwrap_or_default()
                    .into_iter()
                    .map(tag_pair)
                    .collect::<S3Result<_>>()?,
                size_gt: size(a.object_size_greater_than)?,
                size_lt: size(a.object_size_less_than)?,
            },
            None => Filter {
                and: false,
                prefix: f.prefix,
                tags: f.tag.into_iter().map(tag_pair).collect::<S3Result<_>>()?,
                size_gt: size(f.object_size_greater_than)?,
                size_lt: size(f.object_size_less_than)?,
            },
        }),
    };
    let mut rule = Rule { id, enabled, prefix: r.prefix, filter, ..Default::default() };
    if let Some(e) = r.expiration {
        if e.days.is_some() && e.date.is_some() {
            return Err(malformed("an Expiration gives Days or Date, not both"));
        }
        if e.expired_object_delete_marker.is_some() && (e.days.is_some() || e.date.is_some()) {
            return Err(malformed(
                "ExpiredObjectDeleteMarker cannot be given with Days or Date in one Expiration",
            ));
        }
        rule.expiration_days = positive(e.days, "'Days' of an Expiration")?;
        if let Some(d) = &e.date {
            let t = time::OffsetDateTime::from(d.clone());
            if t.time() != time::Time::MIDNIGHT || t.offset() != time::UtcOffset::UTC {
                return Err(invalid("an Expiration Date must be at midnight UTC".into()));
            }
            rule.expiration_date_ns = Some(ns_of(d));
        }
        rule.expired_object_delete_marker = e.expired_object_delete_marker;
    }
    if let Some(nc) = r.noncurrent_version_expiration {
        rule.noncurrent_days = positive(nc.noncurrent_days, "NoncurrentDays")?;
        rule.newer_noncurrent = match nc.newer_noncurrent_versions {
            Some(n) if n <= 0 => {
                return Err(invalid("NewerNoncurrentVersions must be positive".into()))
            }
            n => n.map(|n| n as u32),
        };
        if rule.noncurrent_days.is_none() {
            return Err(malformed("a NoncurrentVersionExpiration needs NoncurrentDays"));
        }
    }
    if let Some(a) = r.abort_incomplete_multipart_upload {
        rule.abort_multipart_days = positive(a.days_after_initiation, "DaysAfterInitiation")?;
    }
    let acts = rule.expiration_days.is_some()
        || rule.expiration_date_ns.is_some()
        || rule.expired_object_delete_marker.is_some()
        || rule.noncurrent_days.is_some()
        || rule.abort_multipart_days.is_some();
    if !acts {
        return Err(s3_error!(
            InvalidRequest,
            "At least one action needs to be specified in a rule"
        ));
    }
    Ok(rule)
}

fn s3_tag((k, v): &(String, String)) -> Tag {
    Tag { key: Some(k.clone()), value: Some(v.clone()) }
}

/// A stored rule as S3 answers it.
fn rule_dto(r: &Rule) -> LifecycleRule {
    let filter = r.filter.as_ref().map(|f| {
        if f.and {
            LifecycleRuleFilter {
                and: Some(LifecycleRuleAndOperator {
                    prefix: f.prefix.clone(),
                    tags: Some(f.tags.iter().map(s3_tag).collect()),
                    object_size_greater_than: f.size_gt.map(|n| n as i64),
                    object_size_less_than: f.size_lt.map(|n| n as i64),
                }),
                ..Default::default()
            }
        } else {
            LifecycleRuleFilter {
                prefix: f.prefix.clone(),
                tag: f.tags.first().map(s3_tag),
                object_size_greater_than: f.size_gt.map(|n| n as i64),
                object_size_less_than: f.size_lt.map(|n| n as i64),
                ..Default::default()
            }
        }
    });
    let expiration = (r.expiration_days.is_some()
        || r.expiration_date_ns.is_some()
        || r.expired_object_delete_marker.is_some())
    .then(|| LifecycleExpiration {
        days: r.expiration_days.map(|n| n as i32),
        date: r.expiration_date_ns.and_then(timestamp),
        expired_object_delete_marker: r.expired_object_delete_marker,
    });
    LifecycleRule {
        id: Some(r.id.clone()),
        status: ExpirationStatus::from_static(if r.enabled {
            ExpirationStatus::ENABLED
        } else {
            ExpirationStatus::DISABLED
        }),
        prefix: r.prefix.clone(),
        filter,
        expiration,
        noncurrent_version_expiration: r.noncurrent_days.map(|d| NoncurrentVersionExpiration {
            noncurrent_days: Some(d as i32),
            newer_noncurrent_versions: r.newer_noncurrent.map(|n| n as i32),
        }),
        abort_incomplete_multipart_upload: r
            .abort_multipart_days
            .map(|d| AbortIncompleteMultipartUpload { days_after_initiation: Some(d as i32) }),
        noncurrent_version_transitions: None,
        transitions: None,
    }
}

impl Gateway {
    /// The bucket's lifecycle rules; `None`: none configured.
    pub(super) fn lifecycle_rules(&self, bucket: &str) -> S3Result<Option<Rules>> {
        self.setting(bucket, lifecycle::SETTING)
    }

    /// PutBucketLifecycleConfiguration: replaces the bucket's rules.
    pub(super) async fn put_lifecycle(
        &self,
        bucket: &str,
        conf: Option<BucketLifecycleConfiguration>,
    ) -> S3Result<()> {
        self.objects.directory().require_bucket(bucket).map_err(s3)?;
        let conf = conf.ok_or_else(|| malformed("a LifecycleConfiguration is required"))?;
        if conf.rules.is_empty() {
            return Err(malformed("a LifecycleConfiguration has at least one Rule"));
        }
        if conf.rules.len() > lifecycle::MAX_RULES {
            return Err(invalid(format!("at most {} rules", lifecycle::MAX_RULES)));
        }
        let rules: Vec<Rule> = conf
            .rules
            .into_iter()
            .enumerate()
            .map(|(n, r)| rule_of(r, n))
            .collect::<S3Result<_>>()?;
        let mut ids: Vec<&str> = rules.iter().map(|r| r.id.as_str()).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("two rules have the same ID".into()));
        }
        self.set_lifecycle(bucket, Some(Rules { rules })).await
    }

    /// Replaces (`None`: removes) the bucket's rules.
    pub(super) async fn set_lifecycle(&self, bucket: &str, rules: Option<Rules>) -> S3Result<()> {
        self.set_setting(bucket, lifecycle::SETTING, rules.as_ref()).await
    }

    /// GetBucketLifecycleConfiguration.
    pub(super) fn lifecycle_dto(&self, bucket: &str) -> S3Result<Vec<LifecycleRule>> {
        self.objects.directory().require_bucket(bucket).map_err(s3)?;
        let rules = self.lifecycle_rules(bucket)?.ok_or_else(|| {
            s3_error!(NoSuchLifecycleConfiguration, "The lifecycle configuration does not exist")
        })?;
        Ok(rules.rules.iter().map(rule_dto).collect())
    }

    /// The `x-amz-expiration` header of the current version `meta` of `key`: when the
    /// bucket's rules expire it, and which rule.
    pub(super) fn expiration(&self, bucket: &str, key: &str, meta: &ObjectMeta) -> Option<String> {
        let rules = self.lifecycle_rules(bucket).ok()??;
        let (at, id) = rules.expiry(&self.lifecycle, key, meta)?;
        let mut date = Vec::new();
        timestamp(at)?.format(TimestampFormat::HttpDate, &mut date).ok()?;
        let date = String::from_utf8(date).ok()?;
        Some(format!("expiry-date=\"{date}\", rule-id=\"{id}\""))
    }
}
