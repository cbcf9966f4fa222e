//! Several S3 users: access keys with a small policy, kept sealed in the data directory.
//!
//! The gateway's own credentials (`credentials.json`) are the administrator's: every bucket,
//! every operation. `blindfold user add|list|remove|rotate` manages more users in
//! `<data-dir>/users.sealed`; each has an access key, a secret key, the buckets it may use
//! (exact names, `prefix*` patterns, or `*`) and whether it may only read. A running gateway
//! notices a changed file within a second.
//!
//! Enforcement ([`Access`]): a request signed by a user reaches an S3 operation only if its
//! bucket (and, for copies, the source bucket) matches the user's patterns, and only if it
//! reads when the user is read-only; otherwise `AccessDenied`. `ListBuckets` shows a user only
//! the buckets it may use, so one user's bucket names never reach another.
//!
//! File format (`users.sealed`, mode 0600): `BFUSERS1` | nonce (12) | AES-256-GCM(JSON) with
//! tag, additional data `BFUSERS1`, under HKDF(master key, label "blindfold users v1"). Written
//! to a temporary file, fsynced, renamed; edits hold an exclusive `flock` on `users.lock`.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use blindfold_crypto::{derive_key, MasterKey};
use parking_lot::RwLock;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use s3s::S3Result;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::datadir::random_token;

/// The users file in a data directory.
pub const USERS_FILE: &str = "users.sealed";
const LOCK_FILE: &str = "users.lock";
const MAGIC: &[u8; 8] = b"BFUSERS1";
const KEY_LABEL: &str = "blindfold users v1";
/// Largest users file read (a few thousand users).
const MAX_FILE: u64 = 16 << 20;
/// How often a running gateway looks at the file.
const RECHECK: Duration = Duration::from_secs(1);

/// Errors of the users file.
#[derive(Debug, thiserror::Error)]
pub enum UsersError {
    /// Reading or writing failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file does not open under this key, or is not a users file.
    #[error("{0}")]
    Damaged(String),
    /// A request the file cannot take (a duplicate name, an unknown user, a bad pattern).
    #[error("{0}")]
    Invalid(String),
}

type Result<T> = std::result::Result<T, UsersError>;

/// One user.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// A short name (`[a-z0-9][a-z0-9._-]*`, at most 64).
    pub name: String,
    /// The S3 access key.
    pub access_key: String,
    secret_key: String,
    /// Buckets the user may use: exact names, `prefix*`, or `*` for all.
    pub buckets: Vec<String>,
    /// Only reads (GET, HEAD, listings).
    pub read_only: bool,
    /// May delete or shorten what GOVERNANCE retention protects, with the header
    /// `x-amz-bypass-governance-retention: true` (object lock). Never COMPLIANCE.
    #[serde(default)]
    pub bypass_governance: bool,
}

impl std::fmt::Debug for User {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("access_key", &self.access_key)
            .field("buckets", &self.buckets)
            .field("read_only", &self.read_only)
            .field("bypass_governance", &self.bypass_governance)
            .finish_non_exhaustive()
    }
}

impl User {
    /// The secret key (show it once, when made).
    pub fn secret_key(&self) -> &str {
        &self.secret_key
    }

    /// Whether the user may use `bucket` at all.
    pub fn may_use(&self, bucket: &str) -> bool {
        self.buckets.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => bucket.starts_with(prefix),
            None => p == bucket,
        })
    }
}

const KEY_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
const SECRET_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().next().is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(UsersError::Invalid(format!(
            "user name {name:?}: use 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit"
        )))
    }
}

fn check_patterns(buckets: &[String]) -> Result<()> {
    if buckets.is_empty() {
        return Err(UsersError::Invalid(
            "say which buckets the user may use: --buckets NAME,PREFIX*,… (or '*' for all)".into(),
        ));
    }
    for p in buckets {
        let stem = p.strip_suffix('*').unwrap_or(p);
        let ok = !p.is_empty()
            && p.len() <= 63
            && !stem.contains('*')
            && stem
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-".contains(&b));
        if !ok {
            return Err(UsersError::Invalid(format!(
                "bucket pattern {p:?}: a bucket name, a prefix ending in '*', or '*'"
            )));
        }
    }
    Ok(())
}

fn aead(key: &[u8; 32]) -> LessSafeKey {
    // A 32-byte key is always a valid AES-256 key.
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key[..]).expect("AES-256 key"))
}

/// The users of a data directory, read and written under the master key.
pub struct UserFile {
    dir: PathBuf,
    key: Zeroizing<[u8; 32]>,
    /// During a key rotation, the retiring master key's users key: the file may still be
    /// sealed under it (it is read, never written, with it).
    previous: Option<Zeroizing<[u8; 32]>>,
}

impl std::fmt::Debug for UserFile {
    // Never the keys.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserFile").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl UserFile {
    /// The users file of `data_dir`, sealed under a key derived from `master`.
    pub fn new(data_dir: &Path, master: &MasterKey) -> Self {
        Self { dir: data_dir.to_owned(), key: derive_key(master, MAGIC, KEY_LABEL), previous: None }
    }

    /// Also reads a file sealed under `previous`, the master key a rotation is retiring.
    #[must_use]
    pub fn with_previous(mut self, previous: Option<&MasterKey>) -> Self {
        self.previous = previous.map(|p| derive_key(p, MAGIC, KEY_LABEL));
        self
    }

    fn path(&self) -> PathBuf {
        self.dir.join(USERS_FILE)
    }

    fn aead(&self) -> LessSafeKey {
        aead(&self.key)
    }

    /// Every user (none if there is no file).
    pub fn read(&self) -> Result<Vec<User>> {
        let path = self.path();
        let io = |e| UsersError::Io { path: path.clone(), source: e };
        let bytes = match std::fs::File::open(&path) {
            Ok(f) => {
                use std::io::Read as _;
                let mut buf = Vec::new();
                f.take(MAX_FILE + 1).read_to_end(&mut buf).map_err(io)?;
                buf
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(e)),
        };
        let damaged = |why: &str| {
            UsersError::Damaged(format!("{}: {why}; it was not changed", path.display()))
        };
        if bytes.len() as u64 > MAX_FILE {
            return Err(damaged("larger than a users file can be"));
        }
        if bytes.len() < MAGIC.len() + NONCE_LEN + 16 || &bytes[..8] != MAGIC {
            return Err(damaged("not a blindfold users file"));
        }
        let nonce = Nonce::try_assume_unique_for_key(&bytes[8..8 + NONCE_LEN])
            .map_err(|_| damaged("bad nonce"))?;
        let nonce_bytes: [u8; NONCE_LEN] = bytes[8..8 + NONCE_LEN].try_into().expect("12 bytes");
        let mut sealed = bytes[8 + NONCE_LEN..].to_vec();
        let mut opened =
            self.aead().open_in_place(nonce, Aad::from(MAGIC), &mut sealed).map(|p| p.len());
        if let (Err(_), Some(previous)) = (&opened, &self.previous) {
            sealed.copy_from_slice(&bytes[8 + NONCE_LEN..]);
            opened = aead(previous)
                .open_in_place(
                    Nonce::assume_unique_for_key(nonce_bytes),
                    Aad::from(MAGIC),
                    &mut sealed,
                )
                .map(|p| p.len());
        }
        let len = opened.map_err(|_| {
            damaged("does not open under this key (another store's key, or damaged)")
        })?;
        let plain = &sealed[..len];
        serde_json::from_slice(plain).map_err(|e| damaged(&format!("unreadable contents: {e}")))
    }

    fn write(&self, users: &[User]) -> Result<()> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = self.path();
        let tmp = self.dir.join(format!("{USERS_FILE}.tmp"));
        let io = |p: &Path| {
            let p = p.to_owned();
            move |e| UsersError::Io { path: p, source: e }
        };
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| UsersError::Invalid("the system's random source failed".into()))?;
        let mut body = Zeroizing::new(serde_json::to_vec(users).expect("users serialise"));
        let tag = self
            .aead()
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(MAGIC),
                &mut body,
            )
            .map_err(|_| UsersError::Invalid("sealing failed".into()))?;
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(&tmp))?;
        f.write_all(MAGIC).map_err(io(&tmp))?;
        f.write_all(&nonce).map_err(io(&tmp))?;
        f.write_all(&body).map_err(io(&tmp))?;
        f.write_all(tag.as_ref()).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        std::fs::File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io(&self.dir))?;
        Ok(())
    }

    /// Re-seals the users file under `self`'s key if it is still sealed under `old`'s (a key
    /// rotation), atomically and under the file's lock. Returns whether it did.
    pub fn rekey_from(&self, old: &UserFile) -> Result<bool> {
        let under_self = Self { dir: self.dir.clone(), key: self.key.clone(), previous: None };
        if !self.path().exists() || under_self.read().is_ok() {
            return Ok(false);
        }
        let _lock = self.lock()?;
        let users = old.read()?;
        self.write(&users)?;
        Ok(true)
    }

    fn lock(&self) -> Result<std::fs::File> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let lock_path = self.dir.join(LOCK_FILE);
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| UsersError::Io { path: lock_path.clone(), source: e })?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| UsersError::Io { path: lock_path, source: e.into() })?;
        Ok(lock)
    }

    /// Runs `f` on the users under an exclusive lock and writes the result.
    fn edit<R>(&self, f: impl FnOnce(&mut Vec<User>) -> Result<R>) -> Result<R> {
        let _lock = self.lock()?;
        let mut users = self.read()?;
        let r = f(&mut users)?;
        self.write(&users)?;
        Ok(r)
    }

    /// Adds a user with new keys; returns it (with its secret).
    pub fn add(&self, name: &str, buckets: Vec<String>, read_only: bool) -> Result<User> {
        self.add_with(name, buckets, read_only, false)
    }

    /// [`UserFile::add`], saying whether the user may bypass governance retention
    /// ([`User::bypass_governance`]; a read-only user cannot).
    pub fn add_with(
        &self,
        name: &str,
        buckets: Vec<String>,
        read_only: bool,
        bypass_governance: bool,
    ) -> Result<User> {
        if read_only && bypass_governance {
            return Err(UsersError::Invalid(
                "a read-only user cannot delete anything, so cannot bypass governance retention                  either: give one of --read-only and --bypass-governance"
                    .into(),
            ));
        }
        check_name(name)?;
        check_patterns(&buckets)?;
        self.edit(|users| {
            if users.iter().any(|u| u.name == name) {
                return Err(UsersError::Invalid(format!(
                    "a user {name:?} exists already (`blindfold user rotate {name}` gives it new keys)"
                )));
            }
            let user = User {
                name: name.to_owned(),
                access_key: format!("BF{}", random_token(18, KEY_ALPHABET)),
                secret_key: random_token(40, SECRET_ALPHABET),
                buckets,
                read_only,
                bypass_governance,
            };
            users.push(user.clone());
            Ok(user)
        })
    }

    /// Removes a user; its keys stop working within a second on a running gateway.
    pub fn remove(&self, name: &str) -> Result<User> {
        self.edit(|users| {
            let at = users
                .iter()
                .position(|u| u.name == name)
                .ok_or_else(|| UsersError::Invalid(format!("no user {name:?}")))?;
            Ok(users.remove(at))
        })
    }

    /// Gives a user a new secret key (the access key stays); returns it.
    pub fn rotate(&self, name: &str) -> Result<User> {
        self.edit(|users| {
            let u = users
                .iter_mut()
                .find(|u| u.name == name)
                .ok_or_else(|| UsersError::Invalid(format!("no user {name:?}")))?;
            u.secret_key = random_token(40, SECRET_ALPHABET);
            Ok(u.clone())
        })
    }
}

#[derive(Default)]
struct Cached {
    /// The file's (inode, modified time, length) when read: every edit renames a new file
    /// into place, so the inode alone tells, whatever the clock's resolution.
    stamp: Option<(u64, SystemTime, u64)>,
    checked: Option<Instant>,
    by_access_key: HashMap<String, User>,
}

/// Who may sign requests and what each may do: the administrator's keys and the users file.
pub struct Access {
    admin_access_key: String,
    admin_secret_key: s3s::auth::SecretKey,
    file: Option<UserFile>,
    cache: RwLock<Cached>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access").field("admin_access_key", &self.admin_access_key).finish()
    }
}

/// Operations that only read (a read-only user may run these and no others).
const READ_OPERATIONS: &[&str] = &[
    "GetObject",
    "HeadObject",
    "GetObjectAttributes",
    "GetObjectTagging",
    "GetObjectAcl",
    "ListObjects",
    "ListObjectsV2",
    "ListObjectVersions",
    "ListMultipartUploads",
    "ListParts",
    "ListBuckets",
    "HeadBucket",
    "GetBucketLocation",
    "GetBucketVersioning",
    "GetBucketAcl",
    "GetBucketPolicy",
    "GetBucketTagging",
    "GetBucketCors",
    "GetObjectRetention",
    "GetObjectLegalHold",
    "GetObjectLockConfiguration",
    "GetBucketLifecycleConfiguration",
];

impl Access {
    /// The administrator's keys, and users from `file` (none if `None`).
    pub fn new(admin: (String, String), file: Option<UserFile>) -> Self {
        Self {
            admin_access_key: admin.0,
            admin_secret_key: admin.1.into(),
            file,
            cache: RwLock::new(Cached::default()),
        }
    }

    /// Re-reads the users file if it changed (looked at most once a second). A file that
    /// cannot be read leaves no user able to sign in (the administrator still can).
    fn refresh(&self) {
        let Some(file) = &self.file else { return };
        if self.cache.read().checked.is_some_and(|t| t.elapsed() < RECHECK) {
            return;
        }
        let mut cache = self.cache.write();
        if cache.checked.is_some_and(|t| t.elapsed() < RECHECK) {
            return;
        }
        cache.checked = Some(Instant::now());
        let stamp = std::fs::metadata(file.path()).ok().map(|m| {
            use std::os::unix::fs::MetadataExt as _;
            (m.ino(), m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len())
        });
        if stamp == cache.stamp {
            return;
        }
        cache.stamp = stamp;
        match file.read() {
            Ok(users) => {
                tracing::info!(users = users.len(), "users file (re)loaded");
                cache.by_access_key =
                    users.into_iter().map(|u| (u.access_key.clone(), u)).collect();
            }
            Err(e) => {
                tracing::error!(error = %e, "users file unreadable: only the administrator can sign in");
                cache.by_access_key.clear();
            }
        }
    }

    /// The user holding `access_key` (`None` for the administrator or an unknown key).
    fn user(&self, access_key: &str) -> Option<User> {
        self.refresh();
        self.cache.read().by_access_key.get(access_key).cloned()
    }

    /// Whether the holder of `access_key` may see `bucket` (in ListBuckets).
    pub fn may_see(&self, access_key: Option<&str>, bucket: &str) -> bool {
        match access_key {
            None => false,
            Some(k) if k == self.admin_access_key => true,
            Some(k) => self.user(k).is_some_and(|u| u.may_use(bucket)),
        }
    }

    /// Whether `secret` is the secret key of `access_key` (compared in constant time); for
    /// front ends that authenticate with the keys themselves (Swift's TempAuth).
    pub fn secret_matches(&self, access_key: &str, secret: &str) -> bool {
        self.sign_in(access_key, secret).is_some()
    }

    /// Checks `secret` against the secret key of `access_key` (in constant time); on a match,
    /// returns the [`Grant`] a session of the holder is bound to. A front end that issues
    /// tokens keeps it and honours a token only while [`Access::grant`] still returns the same:
    /// a new secret, a removal, or a changed policy ends every session started before it, at
    /// the moment the S3 side refuses the old secret (the same re-read of the users file).
    pub fn sign_in(&self, access_key: &str, secret: &str) -> Option<Grant> {
        use subtle::ConstantTimeEq as _;
        let (expected, grant) = self.secret_and_grant(access_key)?;
        bool::from(expected.as_bytes().ct_eq(secret.as_bytes())).then_some(grant)
    }

    /// The [`Grant`] `access_key` holds now (`None` if it is no longer known).
    pub fn grant(&self, access_key: &str) -> Option<Grant> {
        self.secret_and_grant(access_key).map(|(_, g)| g)
    }

    fn secret_and_grant(&self, access_key: &str) -> Option<(zeroize::Zeroizing<String>, Grant)> {
        if access_key == self.admin_access_key {
            let secret = zeroize::Zeroizing::new(self.admin_secret_key.expose().to_owned());
            let grant = Grant::of(access_key, &secret, &["*".to_owned()], false);
            return Some((secret, grant));
        }
        let u = self.user(access_key)?;
        let grant = Grant::of(&u.access_key, &u.secret_key, &u.buckets, u.read_only);
        Some((zeroize::Zeroizing::new(u.secret_key.clone()), grant))
    }

    /// Whether the holder of `access_key` may bypass GOVERNANCE retention: the administrator,
    /// and users the users file allows to ([`User::bypass_governance`]).
    pub fn may_bypass_governance(&self, access_key: &str) -> bool {
        access_key == self.admin_access_key
            || self.user(access_key).is_some_and(|u| u.bypass_governance && !u.read_only)
    }

    /// Whether the holder of `access_key` may use `bucket`, for reading only (`reads`) or also
    /// writing: the rule the S3 front end starts from, for the other front ends.
    pub fn permits(&self, access_key: &str, bucket: &str, reads: bool) -> bool {
        self.caller(Some(access_key)).may_use(bucket, reads)
    }

    /// Who holds `access_key` (`None`: an unsigned request). An unknown key never gets here:
    /// signature checking refuses it first.
    pub fn caller(&self, access_key: Option<&str>) -> Caller {
        match access_key {
            None => Caller::Anonymous,
            Some(k) if k == self.admin_access_key => Caller::Admin,
            Some(k) => self.user(k).map_or(Caller::Anonymous, Caller::User),
        }
    }
}

/// Who sent a request.
#[derive(Clone, Debug)]
pub enum Caller {
    /// The administrator's keys.
    Admin,
    /// A user of the users file.
    User(User),
    /// An unsigned request.
    Anonymous,
}

impl Caller {
    /// Whether the users file lets the caller run `op` (an S3 operation as s3s names it) on
    /// `bucket`: anything for the administrator, what a user's patterns and read-only flag
    /// allow, nothing for an unsigned request.
    pub fn may(&self, op: &str, bucket: &str) -> bool {
        self.may_use(bucket, is_read(op))
    }

    /// Whether the users file lets the caller use `bucket`, for reading only (`reads`) or
    /// also writing.
    pub fn may_use(&self, bucket: &str, reads: bool) -> bool {
        match self {
            Caller::Admin => true,
            Caller::User(u) => u.may_use(bucket) && (reads || !u.read_only),
            Caller::Anonymous => false,
        }
    }
}

impl Caller {
    /// Whether the caller may ever write: the administrator and users not limited to reads.
    /// Nothing widens this, no policy or ACL: unsigned requests and read-only users only
    /// read.
    pub fn may_write(&self) -> bool {
        match self {
            Caller::Admin => true,
            Caller::User(u) => !u.read_only,
            Caller::Anonymous => false,
        }
    }
}

/// Whether `op` (an S3 operation as s3s names it) only reads.
pub fn is_read(op: &str) -> bool {
    READ_OPERATIONS.contains(&op)
}

/// A digest of everything that entitles a key holder (access key, secret key, buckets,
/// read-only): sessions bound to it end when any of these changes. Compared in constant time;
/// it reveals nothing of the secret (SHA-256 under a domain label).
#[derive(Clone, Copy)]
pub struct Grant([u8; 32]);

impl Grant {
    fn of(access_key: &str, secret: &str, buckets: &[String], read_only: bool) -> Self {
        let mut h = ring::digest::Context::new(&ring::digest::SHA256);
        h.update(b"blindfold grant v1\0");
        for part in [access_key, secret].into_iter().chain(buckets.iter().map(String::as_str)) {
            h.update(&(part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        h.update(&[u8::from(read_only)]);
        let mut out = [0u8; 32];
        out.copy_from_slice(h.finish().as_ref());
        Self(out)
    }

    /// Whether both are the same grant (constant time).
    pub fn same(&self, other: &Grant) -> bool {
        use subtle::ConstantTimeEq as _;
        bool::from(self.0.ct_eq(&other.0))
    }
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grant(…)")
    }
}

/// [`Access`] shared between the auth and access hooks of the S3 service and the gateway.
#[derive(Clone, Debug)]
pub struct SharedAccess(pub std::sync::Arc<Access>);

#[async_trait::async_trait]
impl s3s::auth::S3Auth for SharedAccess {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<s3s::auth::SecretKey> {
        let a = &self.0;
        if access_key == a.admin_access_key {
            return Ok(a.admin_secret_key.clone());
        }
        match a.user(access_key) {
            Some(u) => Ok(u.secret_key.clone().into()),
            // As S3 answers: clients explain this error to their users.
            None => Err(s3s::S3Error::with_message(
                s3s::S3ErrorCode::InvalidAccessKeyId,
                "The access key ID you provided does not exist in our records.",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(dir: &Path) -> UserFile {
        UserFile::new(dir, &MasterKey::from_bytes([9u8; 32]))
    }

    #[test]
    fn in_a_key_rotation_the_old_file_reads_and_is_resealed_under_the_new_key() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (MasterKey::from_bytes([9u8; 32]), MasterKey::from_bytes([10u8; 32]));
        file(dir.path()).add("alice", vec!["team".into()], false).unwrap();
        assert!(UserFile::new(dir.path(), &new).read().is_err());
        let rotating = UserFile::new(dir.path(), &new).with_previous(Some(&old));
        assert_eq!(rotating.read().unwrap()[0].name, "alice");
        assert!(format!("{rotating:?}").len() < 80, "Debug shows no key: {rotating:?}");
        assert!(rotating.rekey_from(&UserFile::new(dir.path(), &old)).unwrap());
        assert_eq!(UserFile::new(dir.path(), &new).read().unwrap()[0].name, "alice");
        assert!(UserFile::new(dir.path(), &old).read().is_err(), "no longer under the old key");
        assert!(!rotating.rekey_from(&UserFile::new(dir.path(), &old)).unwrap(), "done once");
    }

    #[test]
    fn users_are_added_listed_rotated_and_removed_sealed() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(dir.path());
        assert!(f.read().unwrap().is_empty());
        let a = f.add("alice", vec!["team-*".into()], false).unwrap();
        let b = f.add("bob", vec!["*".into()], true).unwrap();
        assert_ne!(a.access_key, b.access_key);
        assert_eq!(a.secret_key().len(), 40);
        assert_eq!(f.read().unwrap(), vec![a.clone(), b.clone()]);
        // Sealed: neither names, keys nor secrets are in the file.
        let raw = std::fs::read(dir.path().join(USERS_FILE)).unwrap();
        for needle in
            [a.name.as_bytes(), a.access_key.as_bytes(), a.secret_key().as_bytes(), b"team-"]
        {
            assert!(!raw.windows(needle.len()).any(|w| w == needle), "{needle:?} in the file");
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(USERS_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let r = f.rotate("alice").unwrap();
        assert_eq!(r.access_key, a.access_key);
        assert_ne!(r.secret_key(), a.secret_key());
        assert!(f.add("alice", vec!["x".into()], false).is_err(), "duplicate name");
        assert!(f.rotate("carol").is_err());
        assert_eq!(f.remove("bob").unwrap().name, "bob");
        assert!(f.remove("bob").is_err());
        assert_eq!(f.read().unwrap().len(), 1);
    }

    #[test]
    fn bad_names_and_patterns_are_refused_and_nothing_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(dir.path());
        for name in ["", "Alice", "-x", "a b", "a/b", &"x".repeat(65)] {
            assert!(f.add(name, vec!["b".into()], false).is_err(), "{name:?}");
        }
        for pattern in ["", "a*b", "**", "Upper", "a/b"] {
            assert!(f.add("u", vec![pattern.into()], false).is_err(), "{pattern:?}");
        }
        assert!(f.add("u", vec![], false).is_err());
        assert!(!dir.path().join(USERS_FILE).exists());
    }

    #[test]
    fn a_wrong_key_or_a_damaged_file_is_an_error_not_an_empty_list() {
        let dir = tempfile::tempdir().unwrap();
        file(dir.path()).add("alice", vec!["b".into()], false).unwrap();
        let other = UserFile::new(dir.path(), &MasterKey::from_bytes([8u8; 32]));
        let e = other.read().unwrap_err().to_string();
        assert!(e.contains("does not open under this key"), "{e}");
        // Editing under the wrong key is refused too (the file is not replaced).
        assert!(other.add("mallory", vec!["*".into()], false).is_err());
        assert_eq!(file(dir.path()).read().unwrap().len(), 1);
        let path = dir.path().join(USERS_FILE);
        let mut raw = std::fs::read(&path).unwrap();
        raw[30] ^= 0x40;
        std::fs::write(&path, &raw).unwrap();
        assert!(file(dir.path()).read().is_err());
        std::fs::write(&path, b"short").unwrap();
        assert!(file(dir.path())
            .read()
            .unwrap_err()
            .to_string()
            .contains("not a blindfold users file"));
    }

    #[test]
    fn a_grant_changes_with_the_secret_the_buckets_and_read_only() {
        let b = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let g = Grant::of("AK", "secret", &b(&["ab", "c"]), false);
        assert!(g.same(&Grant::of("AK", "secret", &b(&["ab", "c"]), false)));
        for other in [
            Grant::of("AK", "secreT", &b(&["ab", "c"]), false),
            Grant::of("AK", "secret", &b(&["a", "bc"]), false),
            Grant::of("AK", "secret", &b(&["ab"]), false),
            Grant::of("AK", "secret", &b(&["ab", "c"]), true),
            Grant::of("AK2", "secret", &b(&["ab", "c"]), false),
        ] {
            assert!(!g.same(&other));
        }
        assert_eq!(format!("{g:?}"), "Grant(…)");
    }

    #[test]
    fn patterns_match_names_prefixes_and_everything() {
        let u = |b: &[&str]| User {
            name: "u".into(),
            access_key: "k".into(),
            secret_key: "s".into(),
            buckets: b.iter().map(|s| s.to_string()).collect(),
            read_only: false,
            bypass_governance: false,
        };
        assert!(u(&["team-*"]).may_use("team-a"));
        assert!(u(&["team-*"]).may_use("team-"));
        assert!(!u(&["team-*"]).may_use("tea"));
        assert!(!u(&["team"]).may_use("team-a"));
        assert!(u(&["team"]).may_use("team"));
        assert!(u(&["*"]).may_use("anything"));
        assert!(!u(&[]).may_use("x"));
        // The secret never shows in Debug.
        assert!(!format!("{:?}", u(&["b"])).contains("secret_key"));
    }

    #[test]
    fn access_answers_for_the_administrator_users_and_strangers() {
        let dir = tempfile::tempdir().unwrap();
        let f = file(dir.path());
        let a = f.add("alice", vec!["team-*".into()], true).unwrap();
        let access = Access::new(("ADMIN".into(), "s".into()), Some(file(dir.path())));
        assert!(access.may_see(Some("ADMIN"), "payroll"));
        assert!(access.may_see(Some(&a.access_key), "team-a"));
        assert!(!access.may_see(Some(&a.access_key), "payroll"));
        assert!(!access.may_see(Some("NOBODY"), "team-a"));
        assert!(!access.may_see(None, "team-a"));
        assert!(access.permits(&a.access_key, "team-a", true));
        assert!(!access.permits(&a.access_key, "team-a", false), "read-only wrote");
        assert!(!access.permits(&a.access_key, "payroll", true));
        assert!(access.permits("ADMIN", "payroll", false));
        assert!(!access.permits("NOBODY", "team-a", true));
    }
}
