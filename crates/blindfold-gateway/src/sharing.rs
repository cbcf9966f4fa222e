//! Sharing a bucket beyond the gateway's users: canned ACLs and bucket policies.
//!
//! Access starts from the users file (`blindfold user`): the administrator may do anything, a
//! user what its bucket patterns and read-only flag allow, and an unsigned request nothing. A
//! bucket's owner (the administrator, or a user who may write the bucket) can widen that:
//!
//! * a canned ACL on the bucket or on one object: `public-read` lets anyone, signed or not,
//!   read (list the bucket; GET and HEAD the object), `authenticated-read` lets anyone who
//!   signs with keys of this gateway read. Other canned ACLs and explicit grants are refused;
//! * a bucket policy: statements that `Allow` or `Deny` S3 actions on the bucket and its
//!   objects to principals: `*` (everyone, unsigned requests too) or the gateway's users, named
//!   by user name, access key, or an IAM ARN ending in `user/NAME`.
//!
//! A `Deny` that matches wins over everything, the administrator included, except that the
//! administrator can always read, replace and delete the bucket's policy (so a policy cannot
//! lock the gateway out of its own bucket). Everything here is trusted state: a policy is a
//! named bucket setting ([`POLICY`]), a bucket's canned ACL another ([`ACL`]), an object's
//! canned ACL an entry of its metadata map ([`OBJECT_ACL_KEY`]). Deciding touches the
//! directory only, never the store, so who was refused does not show in the store's trace.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The bucket setting holding a bucket's [`Policy`].
pub const POLICY: &str = "policy";
/// The bucket setting holding a bucket's [`Canned`] ACL (absent: private).
pub const ACL: &str = "acl";
/// Metadata entry of an object: its [`Canned`] ACL, when not private.
pub const OBJECT_ACL_KEY: &str = ":acl";
/// The largest policy document S3 takes (20 KiB).
pub const MAX_POLICY_BYTES: usize = 20 * 1024;

/// A canned ACL the gateway honours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Canned {
    /// Only the owner and the users the users file allows (the default).
    Private,
    /// Everyone may read, unsigned requests included.
    PublicRead,
    /// Everyone who signs with keys of this gateway may read.
    AuthenticatedRead,
}

impl Canned {
    /// A canned ACL header's value; `Err` names why a known one cannot be honoured.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "private" | "bucket-owner-full-control" | "bucket-owner-read" => Ok(Self::Private),
            "public-read" => Ok(Self::PublicRead),
            "authenticated-read" => Ok(Self::AuthenticatedRead),
            "public-read-write" => Err(
                "the canned ACL \"public-read-write\" would let anyone write or delete without \
                 signing; the gateway does not allow anonymous writes (give writers keys with \
                 `blindfold user add`)"
                    .into(),
            ),
            other => Err(format!(
                "the canned ACL {other:?} is not supported (supported: private, public-read, \
                 authenticated-read, bucket-owner-full-control, bucket-owner-read)"
            )),
        }
    }

    /// As S3 spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Private => "private",
            Self::PublicRead => "public-read",
            Self::AuthenticatedRead => "authenticated-read",
        }
    }

    /// Whether a reader who is `who` may read under this ACL.
    pub fn lets_read(self, who: &Who<'_>) -> bool {
        match self {
            Self::Private => false,
            Self::PublicRead => true,
            Self::AuthenticatedRead => !matches!(who, Who::Anonymous),
        }
    }
}

/// A bucket's policy (`None`: none set, or no such bucket).
pub fn policy_of(dir: &crate::directory::Directory, bucket: &str) -> crate::Result<Option<Policy>> {
    let doc = match dir.bucket_setting(bucket, POLICY) {
        Ok(doc) => doc,
        Err(crate::GatewayError::NoSuchBucket) => None,
        Err(e) => return Err(e),
    };
    crate::directory::parse_setting(doc, POLICY)
}

/// A bucket's canned ACL ([`ACL`]; private if none is set).
pub fn bucket_acl(dir: &crate::directory::Directory, bucket: &str) -> crate::Result<Canned> {
    let doc = dir.bucket_setting(bucket, ACL)?;
    let name: Option<String> = crate::directory::parse_setting(doc, ACL)?;
    Ok(name.and_then(|n| Canned::parse(&n).ok()).unwrap_or(Canned::Private))
}

/// The canned ACL of an object version's metadata map ([`OBJECT_ACL_KEY`]; private if none).
pub fn object_acl(map: &std::collections::BTreeMap<String, String>) -> Canned {
    map.get(OBJECT_ACL_KEY).and_then(|c| Canned::parse(c).ok()).unwrap_or(Canned::Private)
}

impl<'a> Who<'a> {
    /// The [`Who`] of a caller the users file names.
    pub fn of(caller: &'a crate::users::Caller) -> Self {
        use crate::users::Caller;
        match caller {
            Caller::Admin => Who::Admin,
            Caller::User(u) => Who::User { name: &u.name, access_key: &u.access_key },
            Caller::Anonymous => Who::Anonymous,
        }
    }
}

/// Who sent a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Who<'a> {
    /// The administrator's keys.
    Admin,
    /// A user of the users file: its name and access key.
    User { name: &'a str, access_key: &'a str },
    /// An unsigned request.
    Anonymous,
}

/// What a policy says of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A statement that matches denies it.
    Deny,
    /// No statement denies it and one allows it.
    Allow,
    /// No statement matches.
    Silent,
}

/// A statement's principals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Principals {
    /// Everyone, unsigned requests included.
    Everyone,
    /// These users (names, access keys, or ARNs ending in `user/NAME`).
    Users(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Statement {
    deny: bool,
    principals: Principals,
    /// Lower-case action patterns (`s3:getobject`, `s3:get*`, `*`).
    actions: Vec<String>,
    /// Resource patterns without the `arn:aws:s3:::` prefix (`bucket`, `bucket/*`).
    resources: Vec<String>,
}

/// A bucket policy: the document as given, and its statements as understood.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    document: String,
    statements: Vec<Statement>,
}

const ARN_PREFIX: &str = "arn:aws:s3:::";

/// A string or a list of strings (both forms are legal in a policy).
fn strings(v: &Value, what: &str) -> Result<Vec<String>, String> {
    match v {
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(a) if !a.is_empty() => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned).ok_or_else(|| format!("{what} must be strings")))
            .collect(),
        _ => Err(format!("{what} must be a string or a non-empty list of strings")),
    }
}

fn principals(v: &Value) -> Result<Principals, String> {
    if v.as_str() == Some("*") {
        return Ok(Principals::Everyone);
    }
    let Some(map) = v.as_object() else {
        return Err("Principal must be \"*\" or {\"AWS\": …}".into());
    };
    let mut users = Vec::new();
    for (kind, who) in map {
        if kind != "AWS" {
            return Err(format!(
                "the principal kind {kind:?} is not supported: principals are \"*\" or {{\"AWS\": \
                 …}} naming this gateway's users (user name, access key, or an ARN ending in \
                 user/NAME)"
            ));
        }
        for w in strings(who, "AWS principals")? {
            if w == "*" {
                return Ok(Principals::Everyone);
            }
            users.push(w);
        }
    }
    if users.is_empty() {
        return Err("Principal names nobody".into());
    }
    Ok(Principals::Users(users))
}

impl Policy {
    /// Checks and reads a policy `document` for `bucket`. `Err` says what is wrong (S3's
    /// MalformedPolicy); nothing a statement says is ever ignored: what cannot be enforced
    /// (conditions, `NotAction`, other principal kinds, resources of other buckets) is refused.
    pub fn parse(document: &str, bucket: &str) -> Result<Self, String> {
        if document.len() > MAX_POLICY_BYTES {
            return Err(format!("a policy is at most {MAX_POLICY_BYTES} bytes"));
        }
        let v: Value =
            serde_json::from_str(document).map_err(|e| format!("the policy is not JSON: {e}"))?;
        let Some(top) = v.as_object() else {
            return Err("a policy is a JSON object".into());
        };
        for key in top.keys() {
            if !matches!(key.as_str(), "Version" | "Id" | "Statement") {
                return Err(format!("unknown policy element {key:?}"));
            }
        }
        if let Some(ver) = top.get("Version") {
            if !matches!(ver.as_str(), Some("2012-10-17" | "2008-10-17")) {
                return Err("Version must be \"2012-10-17\" (or \"2008-10-17\")".into());
            }
        }
        let list = match top.get("Statement") {
            Some(Value::Array(a)) if !a.is_empty() => a.clone(),
            Some(s @ Value::Object(_)) => vec![s.clone()],
            _ => return Err("a policy needs a Statement".into()),
        };
        let mut statements = Vec::with_capacity(list.len());
        for (n, s) in list.iter().enumerate() {
            let at = |e: String| format!("statement {}: {e}", n + 1);
            let Some(s) = s.as_object() else {
                return Err(at("a statement is a JSON object".into()));
            };
            for key in s.keys() {
                match key.as_str() {
                    "Sid" | "Effect" | "Principal" | "Action" | "Resource" => {}
                    "Condition" | "NotAction" | "NotResource" | "NotPrincipal" => {
                        return Err(at(format!(
                            "{key} is not supported by this gateway, and a policy is never \
                             saved with parts left unenforced; express it with Action, Resource \
                             and Principal"
                        )))
                    }
                    other => return Err(at(format!("unknown element {other:?}"))),
                }
            }
            let deny = match s.get("Effect").and_then(Value::as_str) {
                Some("Allow") => false,
                Some("Deny") => true,
                _ => return Err(at("Effect must be Allow or Deny".into())),
            };
            let principals =
                principals(s.get("Principal").ok_or_else(|| at("Principal is missing".into()))?)
                    .map_err(at)?;
            let actions = strings(s.get("Action").unwrap_or(&Value::Null), "Action")
                .map_err(at)?
                .into_iter()
                .map(|a| {
                    let a = a.to_ascii_lowercase();
                    if a == "*" || a.starts_with("s3:") {
                        Ok(a)
                    } else {
                        Err(at(format!("the action {a:?} is not an S3 action (s3:…)")))
                    }
                })
                .collect::<Result<_, _>>()?;
            let resources = strings(s.get("Resource").unwrap_or(&Value::Null), "Resource")
                .map_err(at)?
                .into_iter()
                .map(|r| {
                    let rest = r.strip_prefix(ARN_PREFIX).ok_or_else(|| {
                        at(format!("the resource {r:?} is not an S3 ARN ({ARN_PREFIX}…)"))
                    })?;
                    let of_bucket = rest.split('/').next().unwrap_or_default();
                    if matches(of_bucket, bucket) || rest == "*" {
                        Ok(rest.to_owned())
                    } else {
                        Err(at(format!(
                            "Policy has invalid resource {r:?}: not of bucket {bucket}"
                        )))
                    }
                })
                .collect::<Result<_, _>>()?;
            statements.push(Statement { deny, principals, actions, resources });
        }
        Ok(Self { document: document.to_owned(), statements })
    }

    /// The document as it was given.
    pub fn document(&self) -> &str {
        &self.document
    }

    /// Whether a statement allows something to everyone (GetBucketPolicyStatus' IsPublic).
    pub fn is_public(&self) -> bool {
        self.statements.iter().any(|s| !s.deny && s.principals == Principals::Everyone)
    }

    /// What the policy says of `who` doing `action` (`s3:GetObject`) on `resource` (`bucket`
    /// or `bucket/key`).
    pub fn decide(&self, who: &Who<'_>, action: &str, resource: &str) -> Decision {
        let action = action.to_ascii_lowercase();
        let mut allowed = false;
        for s in &self.statements {
            let applies = principal_matches(&s.principals, who)
                && s.actions.iter().any(|a| matches(a, &action))
                && s.resources.iter().any(|r| matches(r, resource));
            if applies && s.deny {
                return Decision::Deny;
            }
            allowed |= applies;
        }
        if allowed {
            Decision::Allow
        } else {
            Decision::Silent
        }
    }
}

fn principal_matches(p: &Principals, who: &Who<'_>) -> bool {
    match (p, who) {
        (Principals::Everyone, _) => true,
        (Principals::Users(list), Who::User { name, access_key }) => list.iter().any(|w| {
            w == name
                || w == access_key
                || w.rsplit_once(":user/").is_some_and(|(_, n)| n.rsplit('/').next() == Some(name))
        }),
        // The administrator and unsigned requests are only ever "*".
        _ => false,
    }
}

/// Glob matching as IAM does it: `*` any run of characters, `?` one character.
pub fn matches(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The IAM action an S3 operation (as s3s names it) needs.
pub fn action_of(op: &str) -> String {
    let same = match op {
        "HeadObject" => "GetObject",
        "ListObjects" | "ListObjectsV2" | "HeadBucket" => "ListBucket",
        "ListObjectVersions" => "ListBucketVersions",
        "ListMultipartUploads" => "ListBucketMultipartUploads",
        "ListParts" => "ListMultipartUploadParts",
        "CreateMultipartUpload"
        | "UploadPart"
        | "UploadPartCopy"
        | "CompleteMultipartUpload"
        | "CopyObject" => "PutObject",
        "DeleteObjects" => "DeleteObject",
        "PutBucketLifecycleConfiguration" | "DeleteBucketLifecycle" => "PutLifecycleConfiguration",
        "GetBucketLifecycleConfiguration" => "GetLifecycleConfiguration",
        "PutObjectLockConfiguration" => "PutBucketObjectLockConfiguration",
        "GetObjectLockConfiguration" => "GetBucketObjectLockConfiguration",
        "DeleteBucketTagging" => "PutBucketTagging",
        "PutBucketCors" | "DeleteBucketCors" => "PutBucketCORS",
        "GetBucketCors" => "GetBucketCORS",
        "GetObjectAttributes" => "GetObject",
        other => other,
    };
    format!("s3:{same}")
}

/// Operations a canned ACL's read permission covers: on a bucket, listing it; on an object,
/// reading it.
pub fn read_by_acl(op: &str) -> Option<AclTarget> {
    match op {
        "ListObjects" | "ListObjectsV2" | "ListObjectVersions" | "HeadBucket" => {
            Some(AclTarget::Bucket)
        }
        "GetObject" | "HeadObject" => Some(AclTarget::Object),
        _ => None,
    }
}

/// What a canned ACL is read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AclTarget {
    /// The bucket's ACL ([`ACL`]).
    Bucket,
    /// The object's ACL ([`OBJECT_ACL_KEY`]).
    Object,
}

/// Operations that manage the policy itself: the administrator can always run them.
pub fn manages_policy(op: &str) -> bool {
    matches!(
        op,
        "GetBucketPolicy" | "PutBucketPolicy" | "DeleteBucketPolicy" | "GetBucketPolicyStatus"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALT: Who<'static> = Who::User { name: "alt", access_key: "AKALT" };

    fn policy(statements: &str) -> Policy {
        Policy::parse(&format!(r#"{{"Version":"2012-10-17","Statement":{statements}}}"#), "b")
            .unwrap()
    }

    #[test]
    fn globs_match_as_iam_does() {
        for (p, t, want) in [
            ("b/*", "b/x/y", true),
            ("b/*", "b", false),
            ("b", "b", true),
            ("s3:get*", "s3:getobject", true),
            ("*", "", true),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*suffix", "xsuffix", true),
            ("start*end", "startmiddleend", true),
            ("start*end", "startmiddle", false),
            ("b/pre*/*", "b/prefix/k", true),
            ("b/pre*/*", "b/other/k", false),
        ] {
            assert_eq!(matches(p, t), want, "{p} ~ {t}");
        }
    }

    #[test]
    fn deny_wins_and_principals_name_users() {
        let p = policy(
            r#"[{"Effect":"Allow","Principal":"*","Action":["s3:GetObject","s3:ListBucket"],
                 "Resource":["arn:aws:s3:::b","arn:aws:s3:::b/*"]},
                {"Effect":"Deny","Principal":{"AWS":["arn:aws:iam::123:user/alt"]},
                 "Action":"s3:*","Resource":"arn:aws:s3:::b/secret/*"}]"#,
        );
        assert_eq!(p.decide(&Who::Anonymous, "s3:GetObject", "b/k"), Decision::Allow);
        assert_eq!(p.decide(&Who::Anonymous, "s3:PutObject", "b/k"), Decision::Silent);
        assert_eq!(p.decide(&Who::Anonymous, "s3:ListBucket", "b"), Decision::Allow);
        assert_eq!(p.decide(&ALT, "s3:GetObject", "b/secret/x"), Decision::Deny);
        assert_eq!(p.decide(&Who::Anonymous, "s3:GetObject", "b/secret/x"), Decision::Allow);
        let bob = Who::User { name: "bob", access_key: "AKBOB" };
        assert_eq!(p.decide(&bob, "s3:GetObject", "b/secret/x"), Decision::Allow);
        assert!(p.is_public());
        // By access key or name alike; the administrator is only ever "*".
        let q = policy(
            r#"{"Effect":"Deny","Principal":{"AWS":["AKALT","bob"]},"Action":"s3:DeleteObject",
                "Resource":"arn:aws:s3:::b/*"}"#,
        );
        assert_eq!(q.decide(&ALT, "s3:DeleteObject", "b/k"), Decision::Deny);
        assert_eq!(q.decide(&bob, "s3:deleteobject", "b/k"), Decision::Deny);
        assert_eq!(q.decide(&Who::Admin, "s3:DeleteObject", "b/k"), Decision::Silent);
        assert!(!q.is_public());
    }

    #[test]
    fn what_cannot_be_enforced_is_refused_not_ignored() {
        let bad = |s: &str, why: &str| {
            let doc = format!(r#"{{"Version":"2012-10-17","Statement":[{{{s}}}]}}"#);
            let e = Policy::parse(&doc, "b").unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        };
        let ok = r#""Effect":"Allow","Principal":"*","Action":"s3:GetObject""#;
        bad(&format!(r#"{ok},"Resource":"arn:aws:s3:::b/*","Condition":{{}}"#), "Condition");
        bad(&format!(r#"{ok},"Resource":"arn:aws:s3:::other/*""#), "invalid resource");
        bad(&format!(r#"{ok},"Resource":"b/*""#), "not an S3 ARN");
        bad(ok, "Resource");
        bad(
            r#""Effect":"Allow","Principal":{"Service":"x"},"Action":"s3:GetObject","Resource":"arn:aws:s3:::b""#,
            "principal kind",
        );
        bad(
            r#""Effect":"Maybe","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b""#,
            "Effect",
        );
        bad(
            r#""Effect":"Allow","Principal":"*","Action":"iam:Get","Resource":"arn:aws:s3:::b""#,
            "not an S3 action",
        );
        assert!(Policy::parse("{", "b").unwrap_err().contains("not JSON"));
        assert!(Policy::parse(&"x".repeat(MAX_POLICY_BYTES + 1), "b").is_err());
    }

    #[test]
    fn canned_acls_read_as_documented() {
        assert_eq!(Canned::parse("bucket-owner-read"), Ok(Canned::Private));
        assert!(Canned::parse("public-read-write").unwrap_err().contains("anonymous"));
        assert!(Canned::parse("log-delivery-write").is_err());
        assert!(Canned::PublicRead.lets_read(&Who::Anonymous));
        assert!(!Canned::AuthenticatedRead.lets_read(&Who::Anonymous));
        assert!(Canned::AuthenticatedRead.lets_read(&ALT));
        assert!(!Canned::Private.lets_read(&ALT));
    }
}
