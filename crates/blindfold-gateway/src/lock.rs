//! S3 Object Lock: retention periods and legal holds on object versions.
//!
//! Everything here lives in trusted state: a bucket's lock configuration is a named bucket
//! setting ([`SETTING`]), and a version's retention and legal hold are entries of its
//! metadata map ([`MODE_KEY`], [`UNTIL_KEY`], [`HOLD_KEY`]), whose names start with a colon
//! like the other entries that are not client metadata. Nothing of it reaches the store: a
//! locked version is ordinary ORAM data. The rules are checked inside the directory
//! transaction that would remove a version ([`check_delete`]) or change its retention
//! ([`check_change`]), so no concurrent request can slip between the check and the change.

use serde::{Deserialize, Serialize};

use crate::directory::ObjectMeta;
use crate::{GatewayError, Result};

/// The bucket setting that holds a bucket's [`BucketLock`]; present once object lock is
/// enabled, which cannot be undone.
pub const SETTING: &str = "object-lock";
/// Metadata entry of a version: its retention mode (`GOVERNANCE` or `COMPLIANCE`).
pub const MODE_KEY: &str = ":lock-mode";
/// Metadata entry of a version: the end of its retention, nanoseconds since the Unix epoch.
pub const UNTIL_KEY: &str = ":lock-until";
/// Metadata entry of a version: `ON` while it is under a legal hold.
pub const HOLD_KEY: &str = ":legal-hold";

const NS_PER_DAY: i128 = 86_400 * 1_000_000_000;

/// A retention mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// Users allowed to bypass governance retention may still shorten it or delete.
    Governance,
    /// Nobody can shorten it or delete the version before its date through S3.
    Compliance,
}

impl Mode {
    /// The mode as S3 spells it, exactly (S3 refuses other cases).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "GOVERNANCE" => Some(Self::Governance),
            "COMPLIANCE" => Some(Self::Compliance),
            _ => None,
        }
    }

    /// As S3 spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Governance => "GOVERNANCE",
            Self::Compliance => "COMPLIANCE",
        }
    }
}

/// A bucket's object lock configuration (the [`SETTING`] document).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketLock {
    /// Retention given to every new version that names none.
    #[serde(default)]
    pub default: Option<DefaultRetention>,
}

/// A bucket's default retention: a mode and a period in days or in years.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefaultRetention {
    /// Mode.
    pub mode: Mode,
    /// Period in days (exactly one of `days` and `years`).
    pub days: Option<u32>,
    /// Period in years of 365 days.
    pub years: Option<u32>,
}

impl DefaultRetention {
    /// The retention of a version written at `now_ns`.
    pub fn from(&self, now_ns: i128) -> Retention {
        let days = i128::from(self.days.unwrap_or(0)) + 365 * i128::from(self.years.unwrap_or(0));
        Retention { mode: self.mode, until_ns: now_ns + days * NS_PER_DAY }
    }
}

/// A version's retention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Mode.
    pub mode: Mode,
    /// Retained until, nanoseconds since the Unix epoch.
    pub until_ns: i128,
}

impl Retention {
    fn active(&self, now_ns: i128) -> bool {
        self.until_ns > now_ns
    }
}

/// The retention a version carries, if any.
pub fn retention(meta: &ObjectMeta) -> Option<Retention> {
    let mode = Mode::parse(meta.metadata.get(MODE_KEY)?)?;
    let until_ns = meta.metadata.get(UNTIL_KEY)?.parse().ok()?;
    Some(Retention { mode, until_ns })
}

/// Whether a version is under a legal hold.
pub fn legal_hold(meta: &ObjectMeta) -> bool {
    meta.metadata.get(HOLD_KEY).is_some_and(|v| v == "ON")
}

/// The metadata entries that give a version `retention` (`None`: none).
pub fn retention_entries(retention: Option<Retention>) -> Vec<(String, Option<String>)> {
    vec![
        (MODE_KEY.into(), retention.map(|r| r.mode.as_str().to_string())),
        (UNTIL_KEY.into(), retention.map(|r| r.until_ns.to_string())),
    ]
}

/// The metadata entry that puts a version under a legal hold or lifts it.
pub fn hold_entry(on: bool) -> (String, Option<String>) {
    (HOLD_KEY.into(), on.then(|| "ON".to_string()))
}

/// Writes the entries into a metadata map (a new version's).
pub fn apply(
    map: &mut std::collections::BTreeMap<String, String>,
    entries: Vec<(String, Option<String>)>,
) {
    for (k, v) in entries {
        match v {
            Some(v) => map.insert(k, v),
            None => map.remove(&k),
        };
    }
}

/// Gives a new version of an object in `bucket` the bucket's default retention, if object
/// lock is on with a default and the version carries no retention of its own.
pub fn fill_default(
    tx: &crate::directory::Tx<'_>,
    bucket: &str,
    meta: &mut ObjectMeta,
    now_ns: i128,
) -> Result<()> {
    if meta.metadata.contains_key(MODE_KEY) {
        return Ok(());
    }
    let doc = tx.bucket_setting(bucket, SETTING)?;
    let Some(lock) = crate::directory::parse_setting::<BucketLock>(doc, SETTING)? else {
        return Ok(());
    };
    if let Some(d) = lock.default {
        apply(&mut meta.metadata, retention_entries(Some(d.from(now_ns))));
    }
    Ok(())
}

fn date(ns: i128) -> String {
    crate::directory::written_at(ns)
}

/// Refuses to remove a version that its legal hold or its retention protects. `bypass`:
/// the request asked to bypass governance retention and its signer may.
pub fn check_delete(meta: &ObjectMeta, bypass: bool, now_ns: i128) -> Result<()> {
    if legal_hold(meta) {
        return Err(GatewayError::Locked(
            "this object version is under a legal hold; lift it (PutObjectLegalHold with \
             Status OFF) before deleting it"
                .into(),
        ));
    }
    match retention(meta) {
        Some(r) if r.active(now_ns) => match r.mode {
            Mode::Compliance => Err(GatewayError::Locked(format!(
                "this object version is under COMPLIANCE retention until {}; nobody can \
                 delete it before then",
                date(r.until_ns)
            ))),
            Mode::Governance if !bypass => Err(GatewayError::Locked(format!(
                "this object version is under GOVERNANCE retention until {}; a user allowed \
                 to may delete it with the header x-amz-bypass-governance-retention: true",
                date(r.until_ns)
            ))),
            Mode::Governance => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Refuses a change of retention from `old` to `new` that the rules forbid: while `old` is
/// in force, COMPLIANCE can only be extended (same mode, a later or equal date), and
/// GOVERNANCE can only be extended unless the request bypasses governance retention.
pub fn check_change(
    old: Option<Retention>,
    new: Option<Retention>,
    bypass: bool,
    now_ns: i128,
) -> Result<()> {
    let Some(old) = old.filter(|o| o.active(now_ns)) else { return Ok(()) };
    let extends = new.is_some_and(|n| n.mode == old.mode && n.until_ns >= old.until_ns);
    if extends || (old.mode == Mode::Governance && bypass) {
        return Ok(());
    }
    Err(GatewayError::Locked(match old.mode {
        Mode::Compliance => format!(
            "this object version is under COMPLIANCE retention until {}: its retention can \
             only be extended, never shortened, removed or changed to GOVERNANCE",
            date(old.until_ns)
        ),
        Mode::Governance => format!(
            "this object version is under GOVERNANCE retention until {}: shortening, removing \
             or changing it needs the header x-amz-bypass-governance-retention: true, from a \
             user allowed to",
            date(old.until_ns)
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(entries: Vec<(String, Option<String>)>) -> ObjectMeta {
        let mut m = ObjectMeta::default();
        apply(&mut m.metadata, entries);
        m
    }

    const NOW: i128 = 1_000 * NS_PER_DAY;

    fn ret(mode: Mode, days_from_now: i128) -> Option<Retention> {
        Some(Retention { mode, until_ns: NOW + days_from_now * NS_PER_DAY })
    }

    #[test]
    fn retention_and_holds_round_trip_through_the_metadata_map() {
        let m = meta(retention_entries(ret(Mode::Compliance, 3)));
        assert_eq!(retention(&m), ret(Mode::Compliance, 3));
        assert!(!legal_hold(&m));
        let mut m = meta(vec![hold_entry(true)]);
        assert!(legal_hold(&m) && retention(&m).is_none());
        apply(&mut m.metadata, vec![hold_entry(false)]);
        assert!(!legal_hold(&m) && m.metadata.is_empty());
    }

    #[test]
    fn deletes_are_refused_while_a_version_is_protected() {
        let gov = meta(retention_entries(ret(Mode::Governance, 1)));
        assert!(matches!(check_delete(&gov, false, NOW), Err(GatewayError::Locked(_))));
        assert!(check_delete(&gov, true, NOW).is_ok());
        let comp = meta(retention_entries(ret(Mode::Compliance, 1)));
        assert!(check_delete(&comp, true, NOW).is_err());
        // Once the date has passed, nothing protects it.
        assert!(check_delete(&comp, false, NOW + 2 * NS_PER_DAY).is_ok());
        let held = meta(vec![hold_entry(true)]);
        assert!(check_delete(&held, true, NOW).is_err());
        assert!(check_delete(&ObjectMeta::default(), false, NOW).is_ok());
    }

    #[test]
    fn retention_only_grows_unless_governance_is_bypassed() {
        use Mode::*;
        assert!(check_change(ret(Governance, 2), ret(Governance, 3), false, NOW).is_ok());
        assert!(check_change(ret(Governance, 2), ret(Governance, 1), false, NOW).is_err());
        assert!(check_change(ret(Governance, 2), ret(Governance, 1), true, NOW).is_ok());
        assert!(check_change(ret(Governance, 2), ret(Compliance, 2), false, NOW).is_err());
        assert!(check_change(ret(Governance, 2), ret(Compliance, 2), true, NOW).is_ok());
        assert!(check_change(ret(Governance, 2), None, false, NOW).is_err());
        assert!(check_change(ret(Compliance, 2), ret(Compliance, 5), false, NOW).is_ok());
        assert!(check_change(ret(Compliance, 2), ret(Compliance, 1), true, NOW).is_err());
        assert!(check_change(ret(Compliance, 2), ret(Governance, 9), true, NOW).is_err());
        assert!(check_change(ret(Compliance, 2), None, true, NOW).is_err());
        // Expired retention no longer binds; none at all never did.
        assert!(check_change(ret(Compliance, -1), None, false, NOW).is_ok());
        assert!(check_change(None, ret(Governance, 1), false, NOW).is_ok());
    }

    #[test]
    fn default_retention_counts_days_or_years_from_the_write() {
        let d = DefaultRetention { mode: Mode::Governance, days: Some(2), years: None };
        assert_eq!(d.from(NOW), ret(Mode::Governance, 2).unwrap());
        let y = DefaultRetention { mode: Mode::Compliance, days: None, years: Some(1) };
        assert_eq!(y.from(NOW), ret(Mode::Compliance, 365).unwrap());
    }
}
