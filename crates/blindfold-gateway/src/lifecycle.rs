//! S3 lifecycle rules and the worker that applies them.
//!
//! A bucket's rules are a named bucket setting ([`SETTING`]). The worker wakes on a fixed
//! schedule ([`Schedule::every`], public: it does not depend on any rule or object), finds
//! what the rules expire — current versions, noncurrent versions, delete markers left alone,
//! incomplete multipart uploads — and removes them in one directory transaction per run.
//! Expiring only changes trusted state: the blocks freed go back to the allocator, and nothing
//! is read or written in the store for it. Under `--durability store` every run writes the
//! same one entry to the store-side log whether or not anything expired (at most
//! [`MAX_PER_RUN`] removals, the rest waiting for the next run), so the store learns the
//! schedule, which it knew, and not whether or what a rule matched.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::directory::{ObjectMeta, Version};
use crate::objects::ObjectLayer;
use crate::Result;

/// The bucket setting that holds a bucket's rules (a JSON [`Rules`]).
pub const SETTING: &str = "lifecycle";
/// Rules in one bucket's configuration, as in S3.
pub const MAX_RULES: usize = 1000;
/// Removals in one run at most: what one log cell holds with room to spare.
pub const MAX_PER_RUN: usize = 200;

/// When the worker runs, and how long a lifecycle day lasts.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// Between two runs.
    pub every: Duration,
    /// One day of the rules: 24 hours, or less to test rules without waiting days
    /// (`serve --lifecycle-day`). With 24 hours, expiry dates round up to midnight UTC, as
    /// in S3.
    pub day: Duration,
}

impl Default for Schedule {
    fn default() -> Self {
        Self { every: Duration::from_secs(3600), day: Duration::from_secs(86_400) }
    }
}

impl Schedule {
    fn day_ns(&self) -> i128 {
        self.day.as_nanos() as i128
    }

    /// When something that started at `start_ns` is `days` days old, as the rules count.
    pub fn after_days(&self, start_ns: i128, days: u32) -> i128 {
        let t = start_ns + i128::from(days) * self.day_ns();
        if self.day == Duration::from_secs(86_400) {
            let d = self.day_ns();
            (t + d - 1).div_euclid(d) * d
        } else {
            t
        }
    }
}

/// A bucket's lifecycle configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    /// The rules, in the order given.
    pub rules: Vec<Rule>,
}

/// One rule. The filter keeps the form it was given in (a top-level prefix, or a filter
/// with or without `And`), so that a GET answers what was PUT.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// Its ID (generated if the request gave none).
    pub id: String,
    /// `Enabled` (else `Disabled`: kept, not applied).
    pub enabled: bool,
    /// A top-level `Prefix` (the older form of a filter).
    pub prefix: Option<String>,
    /// A `Filter` element.
    pub filter: Option<Filter>,
    /// Expiration of current versions after this many days.
    pub expiration_days: Option<u32>,
    /// Expiration of current versions from this date (midnight UTC), ns since the epoch.
    pub expiration_date_ns: Option<i128>,
    /// Removes delete markers with no version left behind them.
    pub expired_object_delete_marker: Option<bool>,
    /// Expiration of noncurrent versions this many days after they became noncurrent.
    pub noncurrent_days: Option<u32>,
    /// The newest noncurrent versions kept whatever their age.
    pub newer_noncurrent: Option<u32>,
    /// Aborts multipart uploads this many days after they began.
    pub abort_multipart_days: Option<u32>,
}

/// The conditions of a `Filter` (all must hold).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filter {
    /// Given inside `And`.
    pub and: bool,
    /// Key prefix.
    pub prefix: Option<String>,
    /// Tags the object must carry.
    pub tags: Vec<(String, String)>,
    /// Size strictly greater than.
    pub size_gt: Option<u64>,
    /// Size strictly less than.
    pub size_lt: Option<u64>,
}

impl Rule {
    fn prefix_matches(&self, key: &str) -> bool {
        let p = self.prefix.as_deref().or(self.filter.as_ref().and_then(|f| f.prefix.as_deref()));
        key.starts_with(p.unwrap_or(""))
    }

    /// Whether the rule is on and its filter selects this key (and, if given, this object:
    /// tags and size).
    pub fn selects(&self, key: &str, meta: Option<&ObjectMeta>) -> bool {
        if !self.enabled || !self.prefix_matches(key) {
            return false;
        }
        let Some(f) = &self.filter else { return true };
        let Some(m) = meta else {
            return f.tags.is_empty() && f.size_gt.is_none() && f.size_lt.is_none();
        };
        let tags = crate::directory::object_tags(m);
        f.tags.iter().all(|t| tags.contains(t))
            && f.size_gt.is_none_or(|n| m.size > n)
            && f.size_lt.is_none_or(|n| m.size < n)
    }

    /// When this rule expires a current version `meta` of `key`, if it does.
    pub fn expires_at(&self, s: &Schedule, key: &str, meta: &ObjectMeta) -> Option<i128> {
        if !self.selects(key, Some(meta)) {
            return None;
        }
        match (self.expiration_days, self.expiration_date_ns) {
            (Some(d), _) => Some(s.after_days(meta.modified_ns, d)),
            (None, Some(t)) => Some(t),
            _ => None,
        }
    }
}

impl Rules {
    /// The earliest expiry of a current version by any rule, with that rule's ID: what the
    /// `x-amz-expiration` header says.
    pub fn expiry(&self, s: &Schedule, key: &str, meta: &ObjectMeta) -> Option<(i128, &str)> {
        self.rules
            .iter()
            .filter_map(|r| r.expires_at(s, key, meta).map(|t| (t, r.id.as_str())))
            .min_by_key(|(t, _)| *t)
    }
}

/// One removal a run decided.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    /// The current version goes (a delete marker where versioning is on): the key, and the
    /// version id and write time of the version the rules expired.
    Current(String, String, i128),
    /// A noncurrent version or a lone delete marker goes for good.
    Version(String, String),
    /// A multipart upload is aborted.
    Upload(String),
}

/// What the removals of one key's versions (newest first) are at `now`.
fn key_actions(
    rules: &Rules,
    s: &Schedule,
    key: &str,
    versions: &[Version],
    now: i128,
) -> Vec<Action> {
    let mut out = Vec::new();
    let Some(latest) = versions.first() else { return out };
    match &latest.object {
        Some(meta) if rules.expiry(s, key, meta).is_some_and(|(t, _)| t <= now) => {
            out.push(Action::Current(key.to_string(), latest.version_id.clone(), meta.modified_ns));
        }
        Some(_) => {}
        None if versions.len() == 1 => {
            // Gone at once with ExpiredObjectDeleteMarker; under a rule that expires objects
            // after some days, once the marker itself is that old.
            let lone = rules.rules.iter().any(|r| {
                r.selects(key, None)
                    && (r.expired_object_delete_marker == Some(true)
                        || r.expiration_days
                            .is_some_and(|d| s.after_days(latest.modified_ns, d) <= now))
            });
            if lone {
                out.push(Action::Version(key.to_string(), latest.version_id.clone()));
            }
        }
        None => {}
    }
    // Noncurrent versions: each became noncurrent when the version after it was written.
    for rule in rules.rules.iter().filter(|r| r.noncurrent_days.is_some()) {
        let days = rule.noncurrent_days.unwrap_or(0);
        let mut newer = 0u32;
        for pair in versions.windows(2) {
            let (successor, v) = (&pair[0], &pair[1]);
            let Some(meta) = &v.object else { continue };
            if !rule.selects(key, Some(meta)) {
                continue;
            }
            newer += 1;
            if rule.newer_noncurrent.is_some_and(|n| newer <= n) {
                continue;
            }
            let action = Action::Version(key.to_string(), v.version_id.clone());
            if s.after_days(successor.modified_ns, days) <= now && !out.contains(&action) {
                out.push(action);
            }
        }
    }
    out
}

/// Whether `action`, planned from a read of the directory, still removes what the rules
/// chose, in the transaction `tx` that would carry it out: a client may have written since
/// (a new current version is not the expired one) or deleted the successor of a noncurrent
/// version (which is then current again).
fn still_chosen(tx: &crate::directory::Tx<'_>, bucket: &str, action: &Action) -> Result<bool> {
    Ok(match action {
        Action::Current(key, id, modified_ns) => tx.object(bucket, key)?.is_some_and(|m| {
            crate::directory::version_id(&m) == id && m.modified_ns == *modified_ns
        }),
        Action::Version(key, id) => {
            tx.object(bucket, key)?.is_none_or(|m| crate::directory::version_id(&m) != id)
        }
        Action::Upload(_) => true,
    })
}

/// What one run did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// Current versions expired.
    pub expired: usize,
    /// Noncurrent versions and delete markers removed.
    pub removed: usize,
    /// Multipart uploads aborted.
    pub aborted: usize,
    /// Removals object lock refused (they stay until their retention ends).
    pub locked: usize,
    /// Removals left for the next run ([`MAX_PER_RUN`]).
    pub deferred: bool,
}

/// Applies every bucket's rules once, at `now` (nanoseconds since the epoch).
pub async fn apply(objects: &ObjectLayer, s: &Schedule, now: i128) -> Result<Applied> {
    let dir = objects.directory();
    let mut plan: Vec<(String, Action)> = Vec::new();
    let mut deferred = false;
    'buckets: for (bucket, _) in dir.buckets()? {
        let doc = dir.bucket_setting(&bucket, SETTING)?;
        let Some(rules) = crate::directory::parse_setting::<Rules>(doc, SETTING)? else {
            continue;
        };
        let mut after = String::new();
        loop {
            let page = dir.key_versions(&bucket, "", &after, 100)?;
            let Some((last, _)) = page.last() else { break };
            after = last.clone();
            for (key, versions) in &page {
                for a in key_actions(&rules, s, key, versions, now) {
                    if plan.len() == MAX_PER_RUN {
                        deferred = true;
                        break 'buckets;
                    }
                    plan.push((bucket.clone(), a));
                }
            }
        }
        for (id, up) in dir.uploads()? {
            let old = rules.rules.iter().any(|r| {
                r.selects(&up.key, None)
                    && r.abort_multipart_days.is_some_and(|d| s.after_days(up.created_ns, d) <= now)
            });
            if up.bucket == bucket && old {
                if plan.len() == MAX_PER_RUN {
                    deferred = true;
                    break 'buckets;
                }
                plan.push((bucket.clone(), Action::Upload(id)));
            }
        }
    }
    let mut applied = Applied { deferred, ..Default::default() };
    dir.transact_durable(&[], |tx| {
        applied = Applied { deferred, ..Default::default() };
        // The same one log entry whether or not anything expires (module docs).
        tx.mark();
        for (bucket, action) in &plan {
            if !still_chosen(tx, bucket, action)? {
                continue;
            }
            match action {
                Action::Current(key, _, _) => {
                    let marker = crate::objects::new_version_id();
                    if tx.delete_current(bucket, key, &marker, now)?.existed {
                        applied.expired += 1;
                    }
                }
                Action::Version(key, id) => {
                    if let Ok(Version { object: Some(meta), .. }) =
                        tx.version(bucket, key, Some(id))
                    {
                        // Lifecycle never bypasses governance retention.
                        if crate::lock::check_delete(&meta, false, now).is_err() {
                            applied.locked += 1;
                            continue;
                        }
                    }
                    if tx.delete_version(bucket, key, id)?.is_some() {
                        applied.removed += 1;
                    }
                }
                Action::Upload(id) => {
                    if let Some(up) = tx.upload(id)? {
                        for p in up.parts.values() {
                            tx.release(p.extent.blocks.iter().copied());
                        }
                        tx.delete_upload(id)?;
                        applied.aborted += 1;
                    }
                }
            }
        }
        Ok(())
    })
    .await?;
    Ok(applied)
}

/// Runs [`apply`] on `schedule` until `stop` says so. A failed run is logged and the next
/// one tries again.
pub async fn run(
    objects: std::sync::Arc<ObjectLayer>,
    schedule: Schedule,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(schedule.every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate: start one period from now
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        match apply(&objects, &schedule, crate::directory::now_ns()).await {
            Ok(a) if a == Applied::default() => {}
            Ok(a) => tracing::info!(
                expired = a.expired,
                removed = a.removed,
                aborted = a.aborted,
                locked = a.locked,
                more_next_run = a.deferred,
                "lifecycle rules applied"
            ),
            Err(e) => tracing::warn!(
                error = %e,
                "applying lifecycle rules failed; nothing was half done (one transaction), the \
                 next run tries again"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i128 = 86_400 * 1_000_000_000;

    fn obj(modified_ns: i128, size: u64) -> Option<ObjectMeta> {
        Some(ObjectMeta { size, modified_ns, ..Default::default() })
    }

    fn v(id: &str, modified_ns: i128, object: Option<ObjectMeta>) -> Version {
        Version { version_id: id.into(), modified_ns, object }
    }

    fn rule(f: impl FnOnce(&mut Rule)) -> Rules {
        let mut r = Rule { id: "r".into(), enabled: true, ..Default::default() };
        f(&mut r);
        Rules { rules: vec![r] }
    }

    #[test]
    fn a_real_day_rounds_up_to_midnight_and_a_test_day_does_not() {
        let s = Schedule::default();
        let t = 10 * DAY + 3_600_000_000_000; // 01:00 on day 10
        assert_eq!(s.after_days(t, 1), 12 * DAY);
        assert_eq!(s.after_days(10 * DAY, 1), 11 * DAY);
        let quick = Schedule { every: Duration::from_secs(1), day: Duration::from_secs(10) };
        assert_eq!(quick.after_days(t, 2), t + 20_000_000_000);
    }

    #[test]
    fn current_versions_expire_by_prefix_size_and_tags() {
        let s = Schedule::default();
        let r = rule(|r| {
            r.expiration_days = Some(1);
            r.filter = Some(Filter {
                prefix: Some("logs/".into()),
                size_gt: Some(10),
                tags: vec![("k".into(), "v".into())],
                ..Default::default()
            });
        });
        let mut tagged = obj(0, 11).unwrap();
        tagged.metadata.insert(crate::directory::TAGGING_KEY.into(), "k=v&x=y".into());
        let versions = [v("a", 0, Some(tagged.clone()))];
        assert_eq!(
            key_actions(&r, &s, "logs/1", &versions, DAY),
            vec![Action::Current("logs/1".into(), "a".into(), 0)]
        );
        assert!(key_actions(&r, &s, "logs/1", &versions, DAY - 1).is_empty(), "too young");
        assert!(key_actions(&r, &s, "data/1", &versions, DAY).is_empty(), "other prefix");
        let small = [v("a", 0, obj(0, 10))];
        assert!(key_actions(&r, &s, "logs/1", &small, DAY).is_empty(), "untagged and small");
        let mut off = r.clone();
        off.rules[0].enabled = false;
        assert!(key_actions(&off, &s, "logs/1", &versions, DAY).is_empty(), "disabled");
    }

    /// A run removes only what it looked at: a write that lands between the look and the
    /// run's transaction, or a noncurrent version made current again, is left alone.
    #[test]
    fn a_change_after_the_run_looked_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let key = blindfold_crypto::MasterKey::from_bytes([3u8; 32]);
        let d = crate::directory::Directory::open(&dir.path().join("meta.redb"), 64, &key).unwrap();
        d.create_bucket("b").unwrap();
        let put = |modified_ns: i128| {
            let meta = ObjectMeta { size: 1, modified_ns, ..Default::default() };
            d.transact(&[], |tx| tx.put_version("b", "k", &meta, "v")).unwrap();
        };
        let chosen = |a: &Action| d.transact(&[], |tx| still_chosen(tx, "b", a)).unwrap();
        put(0);
        let s = Schedule::default();
        let expire = rule(|r| r.expiration_days = Some(1));
        let plan = key_actions(&expire, &s, "k", &d.versions_of_key("b", "k").unwrap(), 2 * DAY);
        assert_eq!(plan.len(), 1, "the old object is due: {plan:?}");
        assert!(chosen(&plan[0]));
        put(2 * DAY); // a client writes again before the run's transaction
        assert!(!chosen(&plan[0]), "the new write would have been expired");
        // A noncurrent version planned for removal that is current again stays.
        assert!(!chosen(&Action::Version("k".into(), "null".into())));
        assert!(chosen(&Action::Version("k".into(), "an-old-one".into())));
    }

    #[test]
    fn noncurrent_versions_count_from_their_successor_and_keep_the_newest() {
        let s = Schedule::default();
        let r = rule(|r| {
            r.noncurrent_days = Some(1);
            r.newer_noncurrent = Some(1);
        });
        let versions = [
            v("v4", 5 * DAY, obj(5 * DAY, 1)),
            v("v3", 4 * DAY, obj(4 * DAY, 1)), // noncurrent since day 5: kept as the newest
            v("v2", 2 * DAY, obj(2 * DAY, 1)), // noncurrent since day 4
            v("v1", DAY, obj(DAY, 1)),         // noncurrent since day 2
        ];
        let at = |now| key_actions(&r, &s, "k", &versions, now);
        assert_eq!(at(3 * DAY), vec![Action::Version("k".into(), "v1".into())]);
        assert_eq!(
            at(5 * DAY),
            vec![
                Action::Version("k".into(), "v2".into()),
                Action::Version("k".into(), "v1".into())
            ]
        );
    }

    #[test]
    fn a_lone_delete_marker_goes_when_the_rule_says_so() {
        let s = Schedule::default();
        let r = rule(|r| r.expired_object_delete_marker = Some(true));
        let lone = [v("m", 0, None)];
        assert_eq!(
            key_actions(&r, &s, "k", &lone, 0),
            vec![Action::Version("k".into(), "m".into())]
        );
        let shadowing = [v("m", 0, None), v("a", 0, obj(0, 1))];
        assert!(key_actions(&r, &s, "k", &shadowing, DAY).is_empty());
        let by_days = rule(|r| r.expiration_days = Some(2));
        assert!(key_actions(&by_days, &s, "k", &lone, DAY).is_empty(), "the marker is too young");
        assert_eq!(key_actions(&by_days, &s, "k", &lone, 2 * DAY).len(), 1);
    }
}
