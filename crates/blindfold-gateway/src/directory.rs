//! The directory: buckets, objects, multipart uploads and the block allocator, in an embedded
//! transactional database (`redb`) in the trusted state directory, sealed at rest under a key
//! derived from the master key ([`crate::sealed_file`]).
//!
//! The directory never leaves the gateway: listing, heads and deletes cost no storage traffic at
//! all. It refers to logical ORAM blocks; a block belongs to at most one object or upload part,
//! and the allocator's free list and high-water mark say which blocks belong to nobody.
//!
//! Durability order (see `objects.rs`): block contents are committed in the ORAM first, then the
//! directory transaction that makes them reachable. A crash between the two leaves unreachable
//! blocks that the allocator still counts as free: nothing is lost and nothing leaks.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;
use std::time::SystemTime;

use blindfold_crypto::MasterKey;
use parking_lot::Mutex;
use redb::{Database, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{Deserialize, Serialize};

use crate::sealed_file::SealedFile;
use crate::{GatewayError, Result};

const BUCKETS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("buckets");
const OBJECTS: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("objects");
const UPLOADS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("uploads");
const FREE: TableDefinition<'_, u64, ()> = TableDefinition::new("free_blocks");
const ALLOC: TableDefinition<'_, &str, u64> = TableDefinition::new("alloc");
/// Noncurrent versions and delete markers of versioned buckets, keyed by (bucket, key,
/// `u64::MAX - seq`), so a key's versions read newest first. Records: [`enc_v1`] of [`Version`].
/// The current version of a key stays in `objects`, as in an unversioned bucket.
const VERSIONS: TableDefinition<'_, (&str, &str, u64), &[u8]> =
    TableDefinition::new("object_versions");
/// Bucket settings (versioning, tags); no record means the defaults. Records: [`enc_v1`] of
/// [`BucketConfig`].
const BUCKET_CONFIG: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("bucket_config");
/// Named bucket settings added after versioning (object lock, lifecycle, ...), keyed (bucket,
/// name). A record is the setting's JSON document: self-describing, so a setting's type can
/// gain fields (with serde defaults) without a new record format. No record: not set.
const BUCKET_SETTINGS: TableDefinition<'_, (&str, &str), &str> =
    TableDefinition::new("bucket_settings");

/// The metadata entry of an object that holds its version id; no entry means `null` (written
/// while versioning was off or suspended). Like the standard headers kept beside it, its name
/// starts with a colon, which no header name contains, so it never mixes with user metadata.
pub const VERSION_ID_KEY: &str = ":version-id";
/// The metadata entry of an object that holds its tags, in the query-string form of the
/// `x-amz-tagging` header (`k1=v1&k2=v2`, URL-encoded); no entry means no tags.
pub const TAGGING_KEY: &str = ":tagging";
/// Metadata entry of an object written with an SSE-C customer key: a salted digest of the
/// key (never the key), which every read must match (the S3 front end checks it; front ends
/// that cannot carry the key refuse to read such an object).
pub const SSE_C_KEY: &str = ":sse-c";
/// The version id of an object written while versioning was off or suspended.
pub const NULL_VERSION: &str = "null";

/// A bucket's versioning state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Versioning {
    /// Never enabled: a write replaces the object, a delete removes it.
    #[default]
    Off,
    /// Every write adds a version; a delete adds a delete marker.
    Enabled,
    /// Writes and deletes replace the `null` version; older versions are kept.
    Suspended,
}

/// A bucket's settings beyond its existence.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketConfig {
    /// Versioning.
    pub versioning: Versioning,
    /// Bucket tags, in the form of [`TAGGING_KEY`]; `None`: no tag set.
    pub tags: Option<String>,
}

/// One version of an object: data, or a delete marker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// Its version id (`null` for [`NULL_VERSION`]).
    pub version_id: String,
    /// When it was written, nanoseconds since the Unix epoch.
    pub modified_ns: i128,
    /// The object; `None` for a delete marker.
    pub object: Option<ObjectMeta>,
}

impl Version {
    /// An object as a version.
    pub fn of(meta: ObjectMeta) -> Self {
        Self {
            version_id: version_id(&meta).to_string(),
            modified_ns: meta.modified_ns,
            object: Some(meta),
        }
    }
}

/// A named bucket setting's JSON document (see `BUCKET_SETTINGS`) read as its type; `None`
/// if not set. A document that does not parse is corrupt trusted state, never "not set".
pub fn parse_setting<T: for<'a> Deserialize<'a>>(
    doc: Option<String>,
    name: &str,
) -> Result<Option<T>> {
    doc.map(|d| serde_json::from_str(&d))
        .transpose()
        .map_err(|e| GatewayError::Corrupt(format!("the bucket setting {name:?}: {e}")))
}

/// The tags of an object ([`TAGGING_KEY`]), in the order given.
pub fn object_tags(meta: &ObjectMeta) -> Vec<(String, String)> {
    meta.metadata
        .get(TAGGING_KEY)
        .and_then(|t| serde_urlencoded::from_str(t).ok())
        .unwrap_or_default()
}

/// The version id of an object ([`VERSION_ID_KEY`]).
pub fn version_id(meta: &ObjectMeta) -> &str {
    meta.metadata.get(VERSION_ID_KEY).map(String::as_str).unwrap_or(NULL_VERSION)
}

/// What a delete without a version id did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    /// There was a current object.
    pub existed: bool,
    /// The delete marker it added (versioning enabled or suspended).
    pub marker: Option<String>,
}

/// Format tag of the records of the tables added with versioning ([`VERSIONS`],
/// [`BUCKET_CONFIG`]): a record is this byte, then the bincode of the value. A later layout
/// takes the next tag, and records of this one stay readable through it.
const RECORD_V1: u8 = 1;

fn enc_v1<T: Serialize>(v: &T) -> Vec<u8> {
    let mut out = vec![RECORD_V1];
    bincode::serialize_into(&mut out, v).expect("directory records serialise");
    out
}

fn dec_v1<T: for<'a> Deserialize<'a>>(b: &[u8]) -> Result<T> {
    match b.split_first() {
        Some((&RECORD_V1, rest)) => dec(rest),
        _ => Err(GatewayError::Corrupt("directory record of an unknown format".into())),
    }
}

/// A run of bytes stored in whole blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    /// Bytes of data (the last block may be partly used).
    pub len: u64,
    /// Logical blocks, in order (may include padding blocks beyond `len`).
    pub blocks: Vec<u64>,
}

/// What the directory knows about an object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    /// Size in bytes.
    pub size: u64,
    /// The S3 ETag (without quotes): MD5 hex, or `md5-of-md5s-N` after a multipart upload.
    pub etag: String,
    /// Content-Type given at upload.
    pub content_type: Option<String>,
    /// User metadata (`x-amz-meta-*`).
    pub metadata: BTreeMap<String, String>,
    /// Last modification, nanoseconds since the Unix epoch.
    pub modified_ns: i128,
    /// The data.
    pub extents: Vec<Extent>,
}

impl ObjectMeta {
    /// Every block the object owns.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.extents.iter().flat_map(|e| e.blocks.iter().copied())
    }

    /// Last modification time.
    pub fn modified(&self) -> SystemTime {
        system_time(self.modified_ns)
    }
}

/// Nanoseconds since the Unix epoch (as the directory keeps times) as a [`SystemTime`], clamped
/// to what one can hold.
pub fn system_time(ns: i128) -> SystemTime {
    let ns = ns.max(0) as u128;
    SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(ns.min(u64::MAX as u128) as u64)
}

/// One uploaded part of a multipart upload.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Part {
    /// ETag of the part (MD5 hex).
    pub etag: String,
    /// MD5 of the part, raw (for the multipart ETag).
    pub md5: Vec<u8>,
    /// The data.
    pub extent: Extent,
    /// When it was uploaded, nanoseconds since the Unix epoch.
    pub modified_ns: i128,
}

/// A multipart upload in progress.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Upload {
    /// Bucket.
    pub bucket: String,
    /// Key.
    pub key: String,
    /// Started, nanoseconds since the Unix epoch.
    pub created_ns: i128,
    /// Content-Type for the final object.
    pub content_type: Option<String>,
    /// User metadata for the final object.
    pub metadata: BTreeMap<String, String>,
    /// Parts by number.
    pub parts: BTreeMap<i32, Part>,
}

/// Bucket record.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BucketMeta {
    /// Created, nanoseconds since the Unix epoch.
    pub created_ns: i128,
}

/// One change to the directory, as the store-side log records it ([`crate::storelog`]):
/// replayed in order through the same calls, they rebuild the directory from a dump.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum DirOp {
    /// A transaction claimed these reserved blocks.
    Claim(Vec<u64>),
    /// [`Tx::put_object`].
    PutObject { bucket: String, key: String, meta: ObjectMeta },
    /// [`Tx::delete_object`].
    DeleteObject { bucket: String, key: String },
    /// [`Tx::put_upload`].
    PutUpload { id: String, upload: Upload },
    /// [`Tx::delete_upload`].
    DeleteUpload { id: String },
    /// [`Tx::release`].
    Release(Vec<u64>),
    /// [`Directory::create_bucket`].
    CreateBucket { name: String, meta: BucketMeta },
    /// [`Directory::delete_bucket`].
    DeleteBucket { name: String },
    // Added with versioning and tagging; variants are positional in bincode: append only.
    /// [`Tx::put_version`].
    PutVersion { bucket: String, key: String, meta: ObjectMeta, version_id: String },
    /// [`Tx::delete_current`].
    DeleteCurrent { bucket: String, key: String, marker_id: String, modified_ns: i128 },
    /// [`Tx::delete_version`].
    DeleteVersion { bucket: String, key: String, version_id: String },
    /// [`Tx::set_tagging`].
    SetTagging { bucket: String, key: String, version_id: Option<String>, tagging: Option<String> },
    /// [`Tx::set_bucket_config`].
    SetBucketConfig { bucket: String, config: BucketConfig },
    // Added with object lock.
    /// [`Tx::set_bucket_setting`].
    SetBucketSetting { bucket: String, name: String, value: Option<String> },
    /// [`Tx::set_object_entries`].
    SetObjectEntries {
        bucket: String,
        key: String,
        version_id: Option<String>,
        entries: Vec<(String, Option<String>)>,
    },
}

/// The operations of one transaction as the store-side log carries them.
fn encode_ops(ops: &[DirOp]) -> Vec<u8> {
    bincode::serialize(ops).expect("directory operations serialize")
}

/// Operations read back from the store-side log ([`encode_ops`]); bounded by the input.
pub fn decode_ops(bytes: &[u8]) -> Result<Vec<DirOp>> {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(bytes.len() as u64)
        .deserialize(bytes)
        .map_err(|e| {
            GatewayError::Corrupt(format!("a directory record of the store-side log: {e}"))
        })
}

/// Where the directory's changes go besides its database (`--durability store`).
pub type DirJournal = std::sync::Arc<crate::storelog::StoreLog>;

/// A moment (nanoseconds since the Unix epoch) for the operator: when a snapshot was
/// written, until when a version is retained.
pub fn written_at(created_ns: i128) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(created_ns)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| "unknown time".into())
}

/// Nanoseconds since the Unix epoch, now.
pub fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

fn enc<T: Serialize>(v: &T) -> Vec<u8> {
    bincode::serialize(v).expect("directory records serialise")
}

fn dec<T: for<'a> Deserialize<'a>>(b: &[u8]) -> Result<T> {
    bincode::deserialize(b).map_err(|e| GatewayError::Corrupt(format!("directory record: {e}")))
}

fn db_err(e: impl std::fmt::Display) -> GatewayError {
    GatewayError::Directory(e.to_string())
}

struct Alloc {
    next: u64,
    /// Free-listed blocks below `next` that nobody has reserved (durably, the reserved ones
    /// are free too: see [`Directory::dump_with`]).
    free: BTreeSet<u64>,
    /// Blocks handed out by `allocate` and not yet claimed or given back: from the free list,
    /// or at and above `next`. Never also in `free`, so an allocation does not walk past
    /// the blocks other writers hold (a 16 MiB PUT reserves 4,096 of them one at a time).
    reserved: HashSet<u64>,
    /// Where the next tail block is looked for: every block from `next` up to here is
    /// reserved, unless one was given back (which lowers it). Without it, each allocation
    /// walked every tail block other writers held.
    tail: u64,
    /// Blocks a reader may still read, with the number of such readers. They are never handed
    /// out by `allocate`, even once freed, so a GET that races a PUT or DELETE of the same key
    /// still reads the object it looked up, never another object's new data.
    pinned: HashMap<u64, u32>,
}

impl Alloc {
    /// The free list as the database has it: reserved blocks below the mark are free until
    /// a transaction claims them.
    fn durably_free(&self) -> Vec<u64> {
        let reserved = self.reserved.iter().copied().filter(|b| *b < self.next);
        self.free.iter().copied().chain(reserved).collect()
    }
}

/// Blocks handed out by [`Directory::allocate`] and not yet committed or released.
#[derive(Debug, Default)]
pub struct Reservation {
    /// The blocks.
    pub blocks: Vec<u64>,
}

/// The trusted directory and block allocator.
pub struct Directory {
    db: Database,
    /// Raised (never lowered) when the store grows.
    capacity: std::sync::atomic::AtomicU64,
    alloc: Mutex<Alloc>,
    /// The store-side log, once attached: every transaction's operations are queued in it,
    /// in commit order, before [`Directory::transact`] returns.
    journal: parking_lot::RwLock<Option<DirJournal>>,
    /// Whether new data is accepted now (see [`crate::space`]): refused while the data
    /// directory's disk is nearly full.
    writes: WriteGate,
    /// Objects and their bytes, counted once on first asking ([`Directory::object_totals`])
    /// and kept up to date by every transaction after (under the allocator's lock, as the
    /// transactions are), so a scrape never reads the whole directory.
    totals: Mutex<Option<ObjectTotals>>,
}

/// How many objects the directory holds and how many bytes they are (as clients sent them,
/// before blocks and padding).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectTotals {
    /// Objects.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory").field("capacity", &self.capacity()).finish_non_exhaustive()
    }
}

/// Whether new data is accepted, and why not when it is refused: asked by
/// [`Directory::allocate`], set by the watcher of the data directory's disk
/// ([`crate::space::Guard`]).
#[derive(Clone, Debug, Default)]
pub struct WriteGate(std::sync::Arc<parking_lot::RwLock<Option<String>>>);

impl WriteGate {
    /// Why new data is refused now (`None`: accepted).
    pub fn refused(&self) -> Option<String> {
        self.0.read().clone()
    }

    /// Refuses new data for `why`, or accepts it again (`None`).
    pub fn set(&self, why: Option<String>) {
        *self.0.write() = why;
    }
}

/// A directory transaction in progress; see [`Directory::transact`].
pub struct Tx<'a> {
    txn: &'a redb::WriteTransaction,
    release: Vec<u64>,
    /// The operations, for the store-side log (only when one is attached).
    ops: Option<Vec<DirOp>>,
    /// Change to the objects and their bytes, applied to the totals once committed.
    delta: (i64, i128),
}

impl std::fmt::Debug for Tx<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tx").finish_non_exhaustive()
    }
}

impl Tx<'_> {
    /// Fails with NoSuchBucket unless the bucket exists.
    pub fn require_bucket(&self, name: &str) -> Result<()> {
        let t = self.txn.open_table(BUCKETS).map_err(db_err)?;
        let found = t.get(name).map_err(db_err)?.is_some();
        if found {
            Ok(())
        } else {
            Err(GatewayError::NoSuchBucket)
        }
    }

    /// The object at (bucket, key).
    pub fn object(&self, bucket: &str, key: &str) -> Result<Option<ObjectMeta>> {
        let t = self.txn.open_table(OBJECTS).map_err(db_err)?;
        let out = t.get((bucket, key)).map_err(db_err)?.map(|v| dec(v.value())).transpose();
        out
    }

    /// Inserts or replaces an object; the replaced object's blocks are freed.
    pub fn put_object(&mut self, bucket: &str, key: &str, meta: &ObjectMeta) -> Result<()> {
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::PutObject {
                bucket: bucket.into(),
                key: key.into(),
                meta: meta.clone(),
            });
        }
        let mut t = self.txn.open_table(OBJECTS).map_err(db_err)?;
        let old = t.insert((bucket, key), enc(meta).as_slice()).map_err(db_err)?;
        self.delta.0 += 1;
        self.delta.1 += i128::from(meta.size);
        if let Some(old) = old {
            let old: ObjectMeta = dec(old.value())?;
            self.release.extend(old.blocks());
            self.delta.0 -= 1;
            self.delta.1 -= i128::from(old.size);
        }
        Ok(())
    }

    /// Removes an object and frees its blocks; false if there was none.
    pub fn delete_object(&mut self, bucket: &str, key: &str) -> Result<bool> {
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::DeleteObject { bucket: bucket.into(), key: key.into() });
        }
        let mut t = self.txn.open_table(OBJECTS).map_err(db_err)?;
        let old = t.remove((bucket, key)).map_err(db_err)?;
        match old {
            Some(old) => {
                let old: ObjectMeta = dec(old.value())?;
                self.release.extend(old.blocks());
                self.delta.0 -= 1;
                self.delta.1 -= i128::from(old.size);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The upload with this id.
    pub fn upload(&self, id: &str) -> Result<Option<Upload>> {
        let t = self.txn.open_table(UPLOADS).map_err(db_err)?;
        let out = t.get(id).map_err(db_err)?.map(|v| dec(v.value())).transpose();
        out
    }

    /// Inserts or replaces an upload record (blocks are not touched).
    pub fn put_upload(&mut self, id: &str, up: &Upload) -> Result<()> {
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::PutUpload { id: id.into(), upload: up.clone() });
        }
        let mut t = self.txn.open_table(UPLOADS).map_err(db_err)?;
        t.insert(id, enc(up).as_slice()).map_err(db_err)?;
        Ok(())
    }

    /// Removes an upload record (blocks are not touched).
    pub fn delete_upload(&mut self, id: &str) -> Result<()> {
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::DeleteUpload { id: id.into() });
        }
        let mut t = self.txn.open_table(UPLOADS).map_err(db_err)?;
        t.remove(id).map_err(db_err)?;
        Ok(())
    }

    /// The bucket's settings (defaults without a record).
    pub fn bucket_config(&self, bucket: &str) -> Result<BucketConfig> {
        let t = self.txn.open_table(BUCKET_CONFIG).map_err(db_err)?;
        let out = t.get(bucket).map_err(db_err)?.map(|v| dec_v1(v.value())).transpose();
        Ok(out?.unwrap_or_default())
    }

    /// Replaces the bucket's settings.
    pub fn set_bucket_config(&mut self, bucket: &str, config: &BucketConfig) -> Result<()> {
        self.require_bucket(bucket)?;
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::SetBucketConfig { bucket: bucket.into(), config: config.clone() });
        }
        let mut t = self.txn.open_table(BUCKET_CONFIG).map_err(db_err)?;
        t.insert(bucket, enc_v1(config).as_slice()).map_err(db_err)?;
        Ok(())
    }

    /// Records an operation that changes nothing, so that the transaction writes an entry
    /// to the store-side log even if it changes nothing else (the lifecycle worker's runs all
    /// look alike to the store: [`crate::lifecycle`]).
    pub fn mark(&mut self) {
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::Release(Vec::new()));
        }
    }

    /// The bucket's setting `name` (its JSON document), `None` if not set.
    pub fn bucket_setting(&self, bucket: &str, name: &str) -> Result<Option<String>> {
        let t = self.txn.open_table(BUCKET_SETTINGS).map_err(db_err)?;
        let out = t.get((bucket, name)).map_err(db_err)?.map(|v| v.value().to_string());
        Ok(out)
    }

    /// Sets (or, with `None`, removes) the bucket's setting `name`.
    pub fn set_bucket_setting(
        &mut self,
        bucket: &str,
        name: &str,
        value: Option<&str>,
    ) -> Result<()> {
        self.require_bucket(bucket)?;
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::SetBucketSetting {
                bucket: bucket.into(),
                name: name.into(),
                value: value.map(Into::into),
            });
        }
        let mut t = self.txn.open_table(BUCKET_SETTINGS).map_err(db_err)?;
        match value {
            Some(v) => t.insert((bucket, name), v).map_err(db_err)?,
            None => t.remove((bucket, name)).map_err(db_err)?,
        };
        Ok(())
    }

    /// Makes `meta` the current version of (bucket, key), as the bucket's versioning says:
    /// off, it replaces the object (whose blocks are freed); enabled, it becomes version
    /// `version_id` and the object it follows becomes noncurrent; suspended, it becomes the
    /// `null` version, replacing the one there was. Returns the object as stored.
    pub fn put_version(
        &mut self,
        bucket: &str,
        key: &str,
        meta: &ObjectMeta,
        version_id: &str,
    ) -> Result<ObjectMeta> {
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::PutVersion {
                bucket: bucket.into(),
                key: key.into(),
                meta: meta.clone(),
                version_id: version_id.into(),
            });
        }
        let state = self.bucket_config(bucket)?.versioning;
        let mut meta = meta.clone();
        let old = self.take_current(bucket, key)?;
        match state {
            Versioning::Off => {
                meta.metadata.remove(VERSION_ID_KEY);
                if let Some(old) = old {
                    self.release.extend(old.blocks());
                }
            }
            Versioning::Enabled => {
                meta.metadata.insert(VERSION_ID_KEY.into(), version_id.into());
                if let Some(old) = old {
                    self.archive(bucket, key, Version::of(old))?;
                }
            }
            Versioning::Suspended => {
                meta.metadata.remove(VERSION_ID_KEY);
                self.replace_null(bucket, key, old)?;
            }
        }
        self.set_current(bucket, key, &meta)?;
        Ok(meta)
    }

    /// Deletes (bucket, key) without naming a version: with versioning off the object goes
    /// (its blocks are freed); enabled, it becomes noncurrent under a new delete marker
    /// `marker_id`; suspended, the `null` version goes and a `null` delete marker is added.
    pub fn delete_current(
        &mut self,
        bucket: &str,
        key: &str,
        marker_id: &str,
        modified_ns: i128,
    ) -> Result<Deleted> {
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::DeleteCurrent {
                bucket: bucket.into(),
                key: key.into(),
                marker_id: marker_id.into(),
                modified_ns,
            });
        }
        let state = self.bucket_config(bucket)?.versioning;
        let old = self.take_current(bucket, key)?;
        let existed = old.is_some();
        let marker = match state {
            Versioning::Off => {
                if let Some(old) = old {
                    self.release.extend(old.blocks());
                }
                return Ok(Deleted { existed, marker: None });
            }
            Versioning::Enabled => {
                if let Some(old) = old {
                    self.archive(bucket, key, Version::of(old))?;
                }
                marker_id.to_string()
            }
            Versioning::Suspended => {
                self.replace_null(bucket, key, old)?;
                NULL_VERSION.to_string()
            }
        };
        let v = Version { version_id: marker.clone(), modified_ns, object: None };
        self.archive(bucket, key, v)?;
        Ok(Deleted { existed, marker: Some(marker) })
    }

    /// Deletes one version for good (its blocks are freed); if it was the current one, the
    /// newest remaining version becomes current. Returns the version, `None` if there was none.
    pub fn delete_version(
        &mut self,
        bucket: &str,
        key: &str,
        version_id: &str,
    ) -> Result<Option<Version>> {
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::DeleteVersion {
                bucket: bucket.into(),
                key: key.into(),
                version_id: version_id.into(),
            });
        }
        let gone = match self.object(bucket, key)? {
            Some(cur) if self::version_id(&cur) == version_id => {
                let cur = self.take_current(bucket, key)?.expect("present");
                Some(Version::of(cur))
            }
            _ => match self.find_archived(bucket, key, version_id)? {
                Some((rank, _)) => Some(self.unarchive(bucket, key, rank)?),
                None => None,
            },
        };
        if let Some(v) = &gone {
            if let Some(o) = &v.object {
                self.release.extend(o.blocks());
            }
            self.promote(bucket, key)?;
        }
        Ok(gone)
    }

    /// The version `version_id` of (bucket, key), or the current one (`None`): an object,
    /// or a delete marker. Fails with NoSuchKey / NoSuchVersion if there is none.
    pub fn version(&self, bucket: &str, key: &str, version_id: Option<&str>) -> Result<Version> {
        let cur = self.object(bucket, key)?;
        let t = self.txn.open_table(VERSIONS).map_err(db_err)?;
        let archived = archived_of(&t, bucket, key)?;
        resolve_version(cur, &archived, version_id)
    }

    /// Replaces the tags ([`TAGGING_KEY`]) of a version (the current one: `None`); returns
    /// its version id. A delete marker has none: [`GatewayError::DeleteMarker`].
    pub fn set_tagging(
        &mut self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        tagging: Option<&str>,
    ) -> Result<String> {
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::SetTagging {
                bucket: bucket.into(),
                key: key.into(),
                version_id: version_id.map(Into::into),
                tagging: tagging.map(Into::into),
            });
        }
        self.edit_version(bucket, key, version_id, |m| match tagging {
            Some(t) => {
                m.metadata.insert(TAGGING_KEY.into(), t.into());
            }
            None => {
                m.metadata.remove(TAGGING_KEY);
            }
        })
    }

    /// Sets (`Some`) or removes (`None`) entries of the metadata map of a version (the current
    /// one: `None`), such as the object-lock entries of [`crate::lock`]; returns its version
    /// id. A delete marker has none: [`GatewayError::DeleteMarker`].
    pub fn set_object_entries(
        &mut self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        entries: &[(String, Option<String>)],
    ) -> Result<String> {
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::SetObjectEntries {
                bucket: bucket.into(),
                key: key.into(),
                version_id: version_id.map(Into::into),
                entries: entries.to_vec(),
            });
        }
        self.edit_version(bucket, key, version_id, |m| {
            for (name, value) in entries {
                match value {
                    Some(v) => m.metadata.insert(name.clone(), v.clone()),
                    None => m.metadata.remove(name),
                };
            }
        })
    }

    /// Changes the object of a version (the current one: `None`) in place; returns its
    /// version id.
    fn edit_version(
        &mut self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
        set: impl FnOnce(&mut ObjectMeta),
    ) -> Result<String> {
        if let Some(mut cur) = self.object(bucket, key)? {
            if version_id.is_none_or(|id| id == self::version_id(&cur)) {
                set(&mut cur);
                let mut t = self.txn.open_table(OBJECTS).map_err(db_err)?;
                t.insert((bucket, key), enc(&cur).as_slice()).map_err(db_err)?;
                return Ok(self::version_id(&cur).to_string());
            }
        }
        let Some(id) = version_id else {
            return Err(match self.newest_archived(bucket, key)? {
                Some(_) => GatewayError::DeleteMarker,
                None => GatewayError::NoSuchKey,
            });
        };
        let (rank, mut v) =
            self.find_archived(bucket, key, id)?.ok_or(GatewayError::NoSuchVersion)?;
        let Some(o) = v.object.as_mut() else {
            return Err(GatewayError::DeleteMarker);
        };
        set(o);
        let mut t = self.txn.open_table(VERSIONS).map_err(db_err)?;
        t.insert((bucket, key, rank), enc_v1(&v).as_slice()).map_err(db_err)?;
        Ok(id.to_string())
    }

    /// Removes and returns the current object (blocks untouched).
    fn take_current(&mut self, bucket: &str, key: &str) -> Result<Option<ObjectMeta>> {
        let mut t = self.txn.open_table(OBJECTS).map_err(db_err)?;
        let old = t.remove((bucket, key)).map_err(db_err)?;
        let old: Option<ObjectMeta> = old.map(|v| dec(v.value())).transpose()?;
        if let Some(o) = &old {
            self.delta.0 -= 1;
            self.delta.1 -= i128::from(o.size);
        }
        Ok(old)
    }

    /// Makes `meta` current; there is no current object.
    fn set_current(&mut self, bucket: &str, key: &str, meta: &ObjectMeta) -> Result<()> {
        let mut t = self.txn.open_table(OBJECTS).map_err(db_err)?;
        t.insert((bucket, key), enc(meta).as_slice()).map_err(db_err)?;
        self.delta.0 += 1;
        self.delta.1 += i128::from(meta.size);
        Ok(())
    }

    /// The newest noncurrent version (or delete marker) of a key, with its rank.
    fn newest_archived(&self, bucket: &str, key: &str) -> Result<Option<(u64, Version)>> {
        let t = self.txn.open_table(VERSIONS).map_err(db_err)?;
        let mut r = t.range((bucket, key, 0)..=(bucket, key, u64::MAX)).map_err(db_err)?;
        let first = match r.next() {
            Some(item) => {
                let (k, v) = item.map_err(db_err)?;
                Some((k.value().2, dec_v1(v.value())?))
            }
            None => None,
        };
        Ok(first)
    }

    /// The noncurrent version `version_id` of a key, with its rank.
    fn find_archived(
        &self,
        bucket: &str,
        key: &str,
        version_id: &str,
    ) -> Result<Option<(u64, Version)>> {
        let t = self.txn.open_table(VERSIONS).map_err(db_err)?;
        for item in t.range((bucket, key, 0)..=(bucket, key, u64::MAX)).map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            let v: Version = dec_v1(v.value())?;
            if v.version_id == version_id {
                return Ok(Some((k.value().2, v)));
            }
        }
        Ok(None)
    }

    /// Files `v` as the newest noncurrent version of the key. The current object, if any, is
    /// always newer than every noncurrent version, so ranks follow the order of writes.
    fn archive(&mut self, bucket: &str, key: &str, v: Version) -> Result<()> {
        let rank = match self.newest_archived(bucket, key)? {
            Some((rank, _)) => rank.checked_sub(1).ok_or_else(|| {
                GatewayError::Corrupt("a key has run out of version numbers".into())
            })?,
            None => u64::MAX - 1,
        };
        if let Some(o) = &v.object {
            self.delta.0 += 1;
            self.delta.1 += i128::from(o.size);
        }
        let mut t = self.txn.open_table(VERSIONS).map_err(db_err)?;
        t.insert((bucket, key, rank), enc_v1(&v).as_slice()).map_err(db_err)?;
        Ok(())
    }

    /// Removes a noncurrent version (blocks untouched).
    fn unarchive(&mut self, bucket: &str, key: &str, rank: u64) -> Result<Version> {
        let mut t = self.txn.open_table(VERSIONS).map_err(db_err)?;
        let v = t.remove((bucket, key, rank)).map_err(db_err)?;
        let v: Version = v
            .map(|v| dec_v1(v.value()))
            .transpose()?
            .ok_or_else(|| GatewayError::Corrupt("a version vanished".into()))?;
        if let Some(o) = &v.object {
            self.delta.0 -= 1;
            self.delta.1 -= i128::from(o.size);
        }
        Ok(v)
    }

    /// Suspended versioning: the `null` version goes (current `old`, or noncurrent), any other
    /// current object becomes noncurrent.
    fn replace_null(&mut self, bucket: &str, key: &str, old: Option<ObjectMeta>) -> Result<()> {
        if let Some(old) = old {
            if version_id(&old) == NULL_VERSION {
                self.release.extend(old.blocks());
            } else {
                self.archive(bucket, key, Version::of(old))?;
            }
        }
        if let Some((rank, _)) = self.find_archived(bucket, key, NULL_VERSION)? {
            let v = self.unarchive(bucket, key, rank)?;
            if let Some(o) = v.object {
                self.release.extend(o.blocks());
            }
        }
        Ok(())
    }

    /// With no current object, the newest noncurrent version becomes current if it is an
    /// object (a delete marker stays where it is: the key then reads as deleted).
    fn promote(&mut self, bucket: &str, key: &str) -> Result<()> {
        if self.object(bucket, key)?.is_some() {
            return Ok(());
        }
        if let Some((rank, Version { object: Some(_), .. })) = self.newest_archived(bucket, key)? {
            let v = self.unarchive(bucket, key, rank)?;
            self.set_current(bucket, key, v.object.as_ref().expect("an object"))?;
        }
        Ok(())
    }

    /// Frees blocks when the transaction commits.
    pub fn release(&mut self, blocks: impl IntoIterator<Item = u64>) {
        let at = self.release.len();
        self.release.extend(blocks);
        if let Some(ops) = &mut self.ops {
            ops.push(DirOp::Release(self.release[at..].to_vec()));
        }
    }
}

/// The noncurrent versions of a key, newest first, with their ranks.
fn archived_of(
    t: &impl ReadableTable<(&'static str, &'static str, u64), &'static [u8]>,
    bucket: &str,
    key: &str,
) -> Result<Vec<(u64, Version)>> {
    let mut out = Vec::new();
    for item in t.range((bucket, key, 0)..=(bucket, key, u64::MAX)).map_err(db_err)? {
        let (k, v) = item.map_err(db_err)?;
        out.push((k.value().2, dec_v1(v.value())?));
    }
    Ok(out)
}

/// The version `id` (the latest: `None`) among a key's current object and noncurrent versions.
fn resolve_version(
    cur: Option<ObjectMeta>,
    archived: &[(u64, Version)],
    id: Option<&str>,
) -> Result<Version> {
    match id {
        None => match cur {
            Some(cur) => Ok(Version::of(cur)),
            None => match archived.first() {
                Some((_, v)) if v.object.is_none() => Ok(v.clone()),
                _ => Err(GatewayError::NoSuchKey),
            },
        },
        Some(id) => match cur {
            Some(cur) if version_id(&cur) == id => Ok(Version::of(cur)),
            _ => archived
                .iter()
                .find(|(_, v)| v.version_id == id)
                .map(|(_, v)| v.clone())
                .ok_or(GatewayError::NoSuchVersion),
        },
    }
}

fn all_versions_of(txn: &redb::ReadTransaction) -> Result<Vec<(String, String, u64, Version)>> {
    let mut out = Vec::new();
    for item in txn.open_table(VERSIONS).map_err(db_err)?.iter().map_err(db_err)? {
        let (k, v) = item.map_err(db_err)?;
        let (b, key, rank) = k.value();
        out.push((b.to_string(), key.to_string(), rank, dec_v1(v.value())?));
    }
    Ok(out)
}

fn bucket_configs_of(txn: &redb::ReadTransaction) -> Result<Vec<(String, BucketConfig)>> {
    let mut out = Vec::new();
    for item in txn.open_table(BUCKET_CONFIG).map_err(db_err)?.iter().map_err(db_err)? {
        let (k, v) = item.map_err(db_err)?;
        out.push((k.value().to_string(), dec_v1(v.value())?));
    }
    Ok(out)
}

fn settings_of(txn: &redb::ReadTransaction) -> Result<Vec<(String, String, String)>> {
    let mut out = Vec::new();
    for item in txn.open_table(BUCKET_SETTINGS).map_err(db_err)?.iter().map_err(db_err)? {
        let (k, v) = item.map_err(db_err)?;
        let (b, n) = k.value();
        out.push((b.to_string(), n.to_string(), v.value().to_string()));
    }
    Ok(out)
}

/// Opens the sealed database at `path`, creating it if it does not exist.
fn open_sealed(path: &Path, master: &MasterKey, create: bool) -> Result<Database> {
    let backend =
        if create { SealedFile::create(path, master) } else { SealedFile::open(path, master) }
            .map_err(|e| GatewayError::Directory(format!("{}: {e}", path.display())))?;
    redb::Builder::new()
        .create_with_backend(backend)
        .map_err(|e| GatewayError::Directory(format!("{}: {e}", path.display())))
}

impl Directory {
    /// The gate that refuses new data while the data directory's disk is nearly full
    /// ([`crate::space::Guard::attach`]).
    pub fn write_gate(&self) -> WriteGate {
        self.writes.clone()
    }

    /// Opens (or creates) the directory database for an ORAM of `capacity` blocks, sealed
    /// under a key derived from `master` (see [`crate::sealed_file`]).
    ///
    /// A directory written by an earlier version in the clear is converted once: it is copied
    /// into a new sealed file, which then replaces it atomically (rename). The old file's
    /// bytes may survive in the disk's free space; see `SECURITY.md`.
    pub fn open(path: &Path, capacity: u64, master: &MasterKey) -> Result<Self> {
        let exists = path.exists();
        if exists && !SealedFile::is_sealed(path).map_err(db_err)? {
            Self::seal_plaintext(path, capacity, master)?;
        }
        Self::from_db(open_sealed(path, master, !exists)?, capacity)
    }

    /// Re-seals the directory database at `path` under `new` if it is still sealed under
    /// `old` (a key rotation): it is copied into a new file sealed under `new`, which then
    /// replaces it atomically (rename), so a crash leaves one or the other, both readable
    /// while the rotation lasts. Nothing to do if it already opens under `new`.
    pub fn rekey(path: &Path, capacity: u64, new: &MasterKey, old: &MasterKey) -> Result<bool> {
        if !path.exists() || SealedFile::open(path, new).is_ok() {
            return Ok(false);
        }
        let dump = Self::from_db(open_sealed(path, old, false)?, capacity)?.dump()?;
        Self::replace_sealed(path, &dump, new, "redb.rekey")?;
        Ok(true)
    }

    /// Rewrites the plaintext redb database at `path` as a sealed one, in place.
    fn seal_plaintext(path: &Path, capacity: u64, master: &MasterKey) -> Result<()> {
        let old = Database::open(path).map_err(|e| {
            GatewayError::Directory(format!(
                "{} is neither a sealed directory nor a plaintext one: {e}",
                path.display()
            ))
        })?;
        let dump = Self::from_db(old, capacity)?.dump()?;
        Self::replace_sealed(path, &dump, master, "redb.sealing")?;
        tracing::info!("the directory database is now sealed at rest");
        Ok(())
    }

    /// Replaces the database at `path` with `dump` sealed under `master`: written to a new
    /// file beside it (extension `tmp_ext`), which is then renamed over it and the directory
    /// fsynced, so a crash leaves one file or the other, whole.
    fn replace_sealed(
        path: &Path,
        dump: &DirectoryDump,
        master: &MasterKey,
        tmp_ext: &str,
    ) -> Result<()> {
        let tmp = path.with_extension(tmp_ext);
        // A leftover from a replacement that crashed before its rename.
        match std::fs::remove_file(&tmp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(db_err(e)),
            _ => {}
        }
        Self::write_dump(open_sealed(&tmp, master, true)?, dump)?;
        std::fs::rename(&tmp, path).map_err(db_err)?;
        if let Some(parent) = path.parent() {
            std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(db_err)?;
        }
        Ok(())
    }

    fn from_db(db: Database, capacity: u64) -> Result<Self> {
        let txn = db.begin_write().map_err(db_err)?;
        let (next, free) = {
            txn.open_table(BUCKETS).map_err(db_err)?;
            txn.open_table(OBJECTS).map_err(db_err)?;
            txn.open_table(UPLOADS).map_err(db_err)?;
            txn.open_table(VERSIONS).map_err(db_err)?;
            txn.open_table(BUCKET_CONFIG).map_err(db_err)?;
            txn.open_table(BUCKET_SETTINGS).map_err(db_err)?;
            let free_t = txn.open_table(FREE).map_err(db_err)?;
            let alloc_t = txn.open_table(ALLOC).map_err(db_err)?;
            let next = alloc_t.get("next").map_err(db_err)?.map(|v| v.value()).unwrap_or(0);
            let mut free = BTreeSet::new();
            for item in free_t.iter().map_err(db_err)? {
                free.insert(item.map_err(db_err)?.0.value());
            }
            (next, free)
        };
        txn.commit().map_err(db_err)?;
        if next > capacity {
            return Err(GatewayError::Corrupt(format!(
                "the directory uses {next} blocks but the ORAM holds {capacity}"
            )));
        }
        Ok(Self {
            db,
            capacity: capacity.into(),
            journal: parking_lot::RwLock::new(None),
            writes: WriteGate::default(),
            totals: Mutex::new(None),
            alloc: Mutex::new(Alloc {
                next,
                free,
                reserved: HashSet::new(),
                tail: next,
                pinned: HashMap::new(),
            }),
        })
    }

    /// Logical blocks the ORAM holds.
    pub fn capacity(&self) -> u64 {
        self.capacity.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Raises the capacity to `blocks` once the ORAM holds that many (a growth of the store);
    /// a smaller value changes nothing.
    pub fn grow_to(&self, blocks: u64) {
        // Under the allocator's lock, so no allocation sees a capacity half-way.
        let _a = self.alloc.lock();
        self.capacity.fetch_max(blocks, std::sync::atomic::Ordering::AcqRel);
    }

    /// Blocks neither owned nor reserved.
    pub fn free_blocks(&self) -> u64 {
        let a = self.alloc.lock();
        let reserved_tail = a.reserved.iter().filter(|&&b| b >= a.next).count() as u64;
        a.free.len() as u64 + (self.capacity() - a.next) - reserved_tail
    }

    /// Reserves `n` free blocks (not yet durable: a crash frees them again).
    pub fn allocate(&self, n: u64) -> Result<Reservation> {
        if let Some(why) = self.writes.refused() {
            return Err(GatewayError::NoRoom(why));
        }
        let mut a = self.alloc.lock();
        let mut blocks = Vec::with_capacity(n as usize);
        // Pinned blocks stay on the free list until their readers are done.
        let candidates: Vec<u64> =
            a.free.iter().copied().filter(|b| !a.pinned.contains_key(b)).take(n as usize).collect();
        blocks.extend(candidates);
        let mut next = a.next.max(a.tail);
        while (blocks.len() as u64) < n {
            // Skip tail blocks another writer already reserved.
            while a.reserved.contains(&next) {
                next += 1;
            }
            if next >= self.capacity() {
                return Err(GatewayError::Full { capacity: self.capacity() });
            }
            blocks.push(next);
            next += 1;
        }
        a.tail = next;
        for &b in &blocks {
            a.free.remove(&b);
            a.reserved.insert(b);
        }
        Ok(Reservation { blocks })
    }

    /// Looks an object up and pins its blocks in the same step, so no transaction can free
    /// and reuse them in between; the caller must [`Directory::unpin`] them when done.
    pub fn object_pinned(&self, bucket: &str, key: &str) -> Result<Option<ObjectMeta>> {
        // Transactions free blocks under this lock: the lookup sees the object either before
        // or after a replacement, and in the first case pins before the blocks become free.
        let mut a = self.alloc.lock();
        let meta = self.object(bucket, key)?;
        if let Some(m) = &meta {
            for b in m.blocks() {
                *a.pinned.entry(b).or_insert(0) += 1;
            }
        }
        Ok(meta)
    }

    /// Pins blocks again (one more reader); see [`Directory::object_pinned`].
    pub fn pin(&self, blocks: &[u64]) {
        let mut a = self.alloc.lock();
        for &b in blocks {
            *a.pinned.entry(b).or_insert(0) += 1;
        }
    }

    /// Releases one reader's pin on each block.
    pub fn unpin(&self, blocks: &[u64]) {
        let mut a = self.alloc.lock();
        for b in blocks {
            if let Some(n) = a.pinned.get_mut(b) {
                *n -= 1;
                if *n == 0 {
                    a.pinned.remove(b);
                }
            }
        }
    }

    /// Blocks pinned by readers right now (for tests and diagnostics).
    pub fn pinned_blocks(&self) -> usize {
        self.alloc.lock().pinned.len()
    }

    /// Gives back reserved blocks that will not be used.
    pub fn unreserve(&self, blocks: &[u64]) {
        let mut a = self.alloc.lock();
        for &b in blocks {
            // Below the mark it is a free-listed block again; above, the tail's.
            if a.reserved.remove(&b) {
                if b < a.next {
                    a.free.insert(b);
                } else {
                    a.tail = a.tail.min(b);
                }
            }
        }
    }

    /// Runs `f` in one atomic, durable transaction. Reserved blocks in `claim` become owned
    /// when it commits; blocks released inside become free. If `f` fails nothing changes (the
    /// reservation stays; the caller unreserves). Transactions are serialised.
    pub fn transact<T>(
        &self,
        claim: &[u64],
        f: impl FnOnce(&mut Tx<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut a = self.alloc.lock();
        let journal = self.journal.read().clone();
        let txn = self.db.begin_write().map_err(db_err)?;
        let ops = journal.as_ref().map(|_| {
            if claim.is_empty() {
                Vec::new()
            } else {
                vec![DirOp::Claim(claim.to_vec())]
            }
        });
        let mut tx = Tx { txn: &txn, release: Vec::new(), ops, delta: (0, 0) };
        let out = f(&mut tx)?;
        let release = std::mem::take(&mut tx.release);
        let ops = tx.ops.take();
        let delta = tx.delta;
        let claimed: HashSet<u64> = claim.iter().copied().collect();
        let mut next = a.next;
        let mut gaps = Vec::new();
        {
            let mut free = txn.open_table(FREE).map_err(db_err)?;
            for &b in claim {
                if b >= next {
                    // Blocks between the old mark and this one that nobody claims become free.
                    gaps.extend((next..b).filter(|g| !claimed.contains(g)));
                    next = b + 1;
                } else {
                    free.remove(b).map_err(db_err)?;
                }
            }
            gaps.retain(|g| *g < next && !claimed.contains(g));
            for &g in &gaps {
                free.insert(g, ()).map_err(db_err)?;
            }
            for &b in &release {
                free.insert(b, ()).map_err(db_err)?;
            }
            let mut alloc = txn.open_table(ALLOC).map_err(db_err)?;
            alloc.insert("next", next).map_err(db_err)?;
        }
        txn.commit().map_err(db_err)?;
        // Queued under the lock, so the log's order is the commit order.
        if let (Some(j), Some(ops)) = (journal, ops) {
            if !ops.is_empty() {
                j.enqueue(crate::storelog::Entry::Directory(encode_ops(&ops)));
            }
        }
        // Mirror in memory only once durable.
        if let Some(t) = self.totals.lock().as_mut() {
            t.objects = (i128::from(t.objects) + i128::from(delta.0)).max(0) as u64;
            t.bytes = (i128::from(t.bytes) + delta.1).max(0) as u64;
        }
        a.next = next;
        for b in claim {
            a.free.remove(b);
            a.reserved.remove(b);
        }
        // A gap another writer has reserved stays its until it claims or gives it back.
        let gaps: Vec<u64> = gaps.into_iter().filter(|g| !a.reserved.contains(g)).collect();
        a.free.extend(gaps);
        a.free.extend(release);
        Ok(out)
    }

    /// Creates a bucket; false if it already existed.
    pub fn create_bucket(&self, name: &str) -> Result<bool> {
        self.create_bucket_as(name, &BucketMeta { created_ns: now_ns() })
    }

    fn create_bucket_as(&self, name: &str, meta: &BucketMeta) -> Result<bool> {
        let _a = self.alloc.lock();
        let txn = self.db.begin_write().map_err(db_err)?;
        let created = {
            let mut t = txn.open_table(BUCKETS).map_err(db_err)?;
            if t.get(name).map_err(db_err)?.is_some() {
                false
            } else {
                t.insert(name, enc(meta).as_slice()).map_err(db_err)?;
                true
            }
        };
        txn.commit().map_err(db_err)?;
        if let (true, Some(j)) = (created, self.journal.read().as_ref()) {
            j.enqueue(crate::storelog::Entry::Directory(encode_ops(&[DirOp::CreateBucket {
                name: name.into(),
                meta: meta.clone(),
            }])));
        }
        Ok(created)
    }

    /// Deletes an empty bucket. Errors: no such bucket, not empty.
    pub fn delete_bucket(&self, name: &str) -> Result<()> {
        let _a = self.alloc.lock();
        let txn = self.db.begin_write().map_err(db_err)?;
        {
            let mut t = txn.open_table(BUCKETS).map_err(db_err)?;
            if t.get(name).map_err(db_err)?.is_none() {
                return Err(GatewayError::NoSuchBucket);
            }
            let objects = txn.open_table(OBJECTS).map_err(db_err)?;
            let mut range = objects.range((name, "")..).map_err(db_err)?;
            if let Some(item) = range.next() {
                if item.map_err(db_err)?.0.value().0 == name {
                    return Err(GatewayError::BucketNotEmpty);
                }
            }
            // Noncurrent versions and delete markers keep a bucket from being deleted too.
            let versions = txn.open_table(VERSIONS).map_err(db_err)?;
            let mut range = versions.range((name, "", 0)..).map_err(db_err)?;
            if let Some(item) = range.next() {
                if item.map_err(db_err)?.0.value().0 == name {
                    return Err(GatewayError::BucketNotEmpty);
                }
            }
            t.remove(name).map_err(db_err)?;
            txn.open_table(BUCKET_CONFIG).map_err(db_err)?.remove(name).map_err(db_err)?;
            let mut settings = txn.open_table(BUCKET_SETTINGS).map_err(db_err)?;
            let names: Vec<String> = settings
                .range((name, "")..)
                .map_err(db_err)?
                .map_while(|item| {
                    let (k, _) = item.ok()?;
                    let (b, n) = k.value();
                    (b == name).then(|| n.to_string())
                })
                .collect();
            for n in names {
                settings.remove((name, n.as_str())).map_err(db_err)?;
            }
        }
        txn.commit().map_err(db_err)?;
        if let Some(j) = self.journal.read().as_ref() {
            j.enqueue(crate::storelog::Entry::Directory(encode_ops(&[DirOp::DeleteBucket {
                name: name.into(),
            }])));
        }
        Ok(())
    }

    /// From now on every change is queued in the store-side log `journal`.
    pub fn attach_journal(&self, journal: DirJournal) {
        let _a = self.alloc.lock();
        *self.journal.write() = Some(journal);
    }

    /// Returns once every change made so far is durable in the store-side log (at once
    /// without one). Call before acknowledging a change.
    pub async fn settle(&self) -> Result<()> {
        let journal = self.journal.read().clone();
        match journal {
            Some(j) => {
                let next = j.next_entry();
                if next == 0 {
                    return Ok(());
                }
                j.durable(next - 1).await
            }
            None => Ok(()),
        }
    }

    /// [`Directory::transact`], then [`Directory::settle`]: durable in the store-side log too.
    pub async fn transact_durable<T>(
        &self,
        claim: &[u64],
        f: impl FnOnce(&mut Tx<'_>) -> Result<T>,
    ) -> Result<T> {
        let out = self.transact(claim, f)?;
        self.settle().await?;
        Ok(out)
    }

    /// Applies operations read back from the store-side log, in order (recovery).
    pub fn apply(&self, ops: Vec<DirOp>) -> Result<()> {
        let mut claim = Vec::new();
        let mut rest = Vec::new();
        for op in ops {
            match op {
                DirOp::Claim(b) => claim.extend(b),
                DirOp::CreateBucket { name, meta } => {
                    self.create_bucket_as(&name, &meta)?;
                }
                DirOp::DeleteBucket { name } => match self.delete_bucket(&name) {
                    Ok(()) | Err(GatewayError::NoSuchBucket) => {}
                    Err(e) => return Err(e),
                },
                other => rest.push(other),
            }
        }
        if claim.is_empty() && rest.is_empty() {
            return Ok(());
        }
        self.transact(&claim, |tx| {
            for op in rest {
                match op {
                    DirOp::PutObject { bucket, key, meta } => {
                        tx.put_object(&bucket, &key, &meta)?
                    }
                    DirOp::DeleteObject { bucket, key } => {
                        tx.delete_object(&bucket, &key)?;
                    }
                    DirOp::PutUpload { id, upload } => tx.put_upload(&id, &upload)?,
                    DirOp::DeleteUpload { id } => tx.delete_upload(&id)?,
                    DirOp::Release(b) => tx.release(b),
                    DirOp::PutVersion { bucket, key, meta, version_id } => {
                        tx.put_version(&bucket, &key, &meta, &version_id)?;
                    }
                    DirOp::DeleteCurrent { bucket, key, marker_id, modified_ns } => {
                        tx.delete_current(&bucket, &key, &marker_id, modified_ns)?;
                    }
                    DirOp::DeleteVersion { bucket, key, version_id } => {
                        tx.delete_version(&bucket, &key, &version_id)?;
                    }
                    DirOp::SetTagging { bucket, key, version_id, tagging } => {
                        // As the original: a version gone since is no error on replay.
                        match tx.set_tagging(
                            &bucket,
                            &key,
                            version_id.as_deref(),
                            tagging.as_deref(),
                        ) {
                            Ok(_)
                            | Err(GatewayError::NoSuchKey)
                            | Err(GatewayError::NoSuchVersion)
                            | Err(GatewayError::DeleteMarker) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    DirOp::SetBucketConfig { bucket, config } => {
                        tx.set_bucket_config(&bucket, &config)?
                    }
                    DirOp::SetBucketSetting { bucket, name, value } => {
                        tx.set_bucket_setting(&bucket, &name, value.as_deref())?
                    }
                    DirOp::SetObjectEntries { bucket, key, version_id, entries } => {
                        // As for tags: a version gone since is no error on replay.
                        match tx.set_object_entries(&bucket, &key, version_id.as_deref(), &entries)
                        {
                            Ok(_)
                            | Err(GatewayError::NoSuchKey)
                            | Err(GatewayError::NoSuchVersion)
                            | Err(GatewayError::DeleteMarker) => {}
                            Err(e) => return Err(e),
                        }
                    }
                    DirOp::Claim(_) | DirOp::CreateBucket { .. } | DirOp::DeleteBucket { .. } => {}
                }
            }
            Ok(())
        })
    }

    /// Runs `capture` with the directory's lock held and a read transaction begun (so no
    /// change can land between the two), then dumps what that transaction sees: a dump that
    /// matches the store-side log's position `capture` read.
    pub fn dump_with<C>(&self, capture: impl FnOnce() -> C) -> Result<(C, DirectoryDump)> {
        let (txn, captured, next, free) = {
            let a = self.alloc.lock();
            let txn = self.db.begin_read().map_err(db_err)?;
            // Blocks reserved for writes in flight are free as of this transaction (below the
            // high-water mark; above it every block is free anyway): a write that claims one
            // later is in the log after the capture.
            (txn, capture(), a.next, a.durably_free())
        };
        Ok((captured, Self::dump_txn(&txn, next, free)?))
    }

    /// The bucket's record, if it exists.
    pub fn bucket(&self, name: &str) -> Result<Option<BucketMeta>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let t = txn.open_table(BUCKETS).map_err(db_err)?;
        t.get(name).map_err(db_err)?.map(|v| dec(v.value())).transpose()
    }

    /// Fails with NoSuchBucket unless the bucket exists.
    pub fn require_bucket(&self, name: &str) -> Result<()> {
        self.bucket(name)?.map(drop).ok_or(GatewayError::NoSuchBucket)
    }

    /// All buckets, by name.
    pub fn buckets(&self) -> Result<Vec<(String, BucketMeta)>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let t = txn.open_table(BUCKETS).map_err(db_err)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            out.push((k.value().to_string(), dec(v.value())?));
        }
        Ok(out)
    }

    /// The bucket's settings (defaults without a record).
    pub fn bucket_config(&self, bucket: &str) -> Result<BucketConfig> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let t = txn.open_table(BUCKET_CONFIG).map_err(db_err)?;
        let out = t.get(bucket).map_err(db_err)?.map(|v| dec_v1(v.value())).transpose();
        Ok(out?.unwrap_or_default())
    }

    /// The bucket's setting `name` (its JSON document), `None` if not set.
    pub fn bucket_setting(&self, bucket: &str, name: &str) -> Result<Option<String>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let t = txn.open_table(BUCKET_SETTINGS).map_err(db_err)?;
        let out = t.get((bucket, name)).map_err(db_err)?.map(|v| v.value().to_string());
        Ok(out)
    }

    /// The version `version_id` of (bucket, key), or the current one (`None`); see
    /// [`Tx::version`].
    pub fn version(&self, bucket: &str, key: &str, version_id: Option<&str>) -> Result<Version> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let cur: Option<ObjectMeta> = {
            let t = txn.open_table(OBJECTS).map_err(db_err)?;
            let out = t.get((bucket, key)).map_err(db_err)?.map(|v| dec(v.value())).transpose();
            out?
        };
        let t = txn.open_table(VERSIONS).map_err(db_err)?;
        let archived = archived_of(&t, bucket, key)?;
        resolve_version(cur, &archived, version_id)
    }

    /// [`Directory::version`] with the blocks of an object pinned, as
    /// [`Directory::object_pinned`] does; the caller unpins them.
    pub fn version_pinned(
        &self,
        bucket: &str,
        key: &str,
        version_id: Option<&str>,
    ) -> Result<Version> {
        let mut a = self.alloc.lock();
        let v = self.version(bucket, key, version_id)?;
        if let Some(m) = &v.object {
            for b in m.blocks() {
                *a.pinned.entry(b).or_insert(0) += 1;
            }
        }
        Ok(v)
    }

    /// Keys of `bucket` that start with `prefix` and sort after `after`, in key order, at
    /// most `limit` of them, each with all its versions newest first (the first is the
    /// latest: the current object, or the delete marker that hides the key).
    pub fn key_versions(
        &self,
        bucket: &str,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, Vec<Version>)>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let objects = txn.open_table(OBJECTS).map_err(db_err)?;
        let versions = txn.open_table(VERSIONS).map_err(db_err)?;
        let start = if after >= prefix { after } else { prefix };
        let mut keys = BTreeSet::new();
        for item in objects.range((bucket, start)..).map_err(db_err)? {
            let (k, _) = item.map_err(db_err)?;
            let (b, key) = k.value();
            if b != bucket || !key.starts_with(prefix) || keys.len() >= limit {
                break;
            }
            if key > after {
                keys.insert(key.to_string());
            }
        }
        let mut found = 0;
        for item in versions.range((bucket, start, 0)..).map_err(db_err)? {
            let (k, _) = item.map_err(db_err)?;
            let (b, key, _) = k.value();
            if b != bucket || !key.starts_with(prefix) || found >= limit {
                break;
            }
            if key > after && keys.insert(key.to_string()) {
                found += 1;
            }
        }
        let mut out = Vec::new();
        for key in keys.into_iter().take(limit) {
            let mut all = Vec::new();
            if let Some(v) = objects.get((bucket, key.as_str())).map_err(db_err)? {
                all.push(Version::of(dec(v.value())?));
            }
            all.extend(archived_of(&versions, bucket, &key)?.into_iter().map(|(_, v)| v));
            out.push((key, all));
        }
        Ok(out)
    }

    /// Every version of one key, newest first (the current object, if any, first).
    pub fn versions_of_key(&self, bucket: &str, key: &str) -> Result<Vec<Version>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let objects = txn.open_table(OBJECTS).map_err(db_err)?;
        let versions = txn.open_table(VERSIONS).map_err(db_err)?;
        let mut all = Vec::new();
        if let Some(v) = objects.get((bucket, key)).map_err(db_err)? {
            all.push(Version::of(dec(v.value())?));
        }
        all.extend(archived_of(&versions, bucket, key)?.into_iter().map(|(_, v)| v));
        Ok(all)
    }

    /// Every noncurrent version and delete marker: (bucket, key, rank, version).
    pub fn all_versions(&self) -> Result<Vec<(String, String, u64, Version)>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        all_versions_of(&txn)
    }

    /// Every bucket's settings that differ from the defaults.
    pub fn bucket_configs(&self) -> Result<Vec<(String, BucketConfig)>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        bucket_configs_of(&txn)
    }

    /// One object.
    pub fn object(&self, bucket: &str, key: &str) -> Result<Option<ObjectMeta>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let t = txn.open_table(OBJECTS).map_err(db_err)?;
        t.get((bucket, key)).map_err(db_err)?.map(|v| dec(v.value())).transpose()
    }

    /// Objects of `bucket` whose keys start with `prefix` and sort after `after`, in key order,
    /// at most `limit` of them (the caller asks for one more to learn whether it is truncated).
    pub fn list(
        &self,
        bucket: &str,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, ObjectMeta)>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let t = txn.open_table(OBJECTS).map_err(db_err)?;
        let start = if after >= prefix { after } else { prefix };
        let mut out = Vec::new();
        for item in t.range((bucket, start)..).map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            let (b, key) = k.value();
            if b != bucket || !key.starts_with(prefix) {
                break;
            }
            if key <= after {
                continue;
            }
            out.push((key.to_string(), dec(v.value())?));
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// One upload.
    pub fn upload(&self, id: &str) -> Result<Option<Upload>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let t = txn.open_table(UPLOADS).map_err(db_err)?;
        t.get(id).map_err(db_err)?.map(|v| dec(v.value())).transpose()
    }

    /// All uploads: (id, upload).
    pub fn uploads(&self) -> Result<Vec<(String, Upload)>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let t = txn.open_table(UPLOADS).map_err(db_err)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            out.push((k.value().to_string(), dec(v.value())?));
        }
        Ok(out)
    }

    /// Every object of every bucket (for verification).
    pub fn all_objects(&self) -> Result<Vec<(String, String, ObjectMeta)>> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let t = txn.open_table(OBJECTS).map_err(db_err)?;
        let mut out = Vec::new();
        for item in t.iter().map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            let (b, key) = k.value();
            out.push((b.to_string(), key.to_string(), dec(v.value())?));
        }
        Ok(out)
    }

    /// Objects and their bytes: counted from the database on the first call (one pass over the
    /// objects), then kept by every transaction.
    pub fn object_totals(&self) -> Result<ObjectTotals> {
        // Under the allocator's lock, which every transaction holds until it has applied its
        // change: the count and the changes after it never overlap.
        let _a = self.alloc.lock();
        if let Some(t) = *self.totals.lock() {
            return Ok(t);
        }
        let txn = self.db.begin_read().map_err(db_err)?;
        let mut t = ObjectTotals::default();
        for item in txn.open_table(OBJECTS).map_err(db_err)?.iter().map_err(db_err)? {
            let (_, v) = item.map_err(db_err)?;
            let meta: ObjectMeta = dec(v.value())?;
            t.objects += 1;
            t.bytes += meta.size;
        }
        // Noncurrent versions hold blocks too, and count as objects.
        for (_, _, _, v) in all_versions_of(&txn)? {
            if let Some(meta) = v.object {
                t.objects += 1;
                t.bytes += meta.size;
            }
        }
        *self.totals.lock() = Some(t);
        Ok(t)
    }

    /// Counts of buckets and objects.
    pub fn counts(&self) -> Result<(u64, u64)> {
        let txn = self.db.begin_read().map_err(db_err)?;
        let b = txn.open_table(BUCKETS).map_err(db_err)?.len().map_err(db_err)?;
        let o = txn.open_table(OBJECTS).map_err(db_err)?.len().map_err(db_err)?;
        Ok((b, o))
    }

    /// Checks that every block is owned at most once, owned blocks are below the high-water
    /// mark and not free-listed. Returns a list of problems (empty if consistent).
    pub fn check(&self) -> Result<Vec<String>> {
        let mut problems = Vec::new();
        let (next, free) = {
            let a = self.alloc.lock();
            (a.next, a.free.clone())
        };
        let mut owner: std::collections::HashMap<u64, String> = std::collections::HashMap::new();
        let mut claim = |b: u64, who: String, problems: &mut Vec<String>| {
            if b >= next {
                problems.push(format!("{who} uses block {b} above the allocation mark {next}"));
            }
            if free.contains(&b) {
                problems.push(format!("{who} uses block {b}, which is on the free list"));
            }
            if let Some(prev) = owner.insert(b, who.clone()) {
                problems.push(format!("block {b} is used by both {prev} and {who}"));
            }
        };
        let objects = self.all_objects()?;
        for (i, (_, _, meta)) in objects.iter().enumerate() {
            let who = format!("object #{i}");
            let mut total = 0u64;
            for e in &meta.extents {
                total += e.len;
            }
            if total != meta.size {
                problems
                    .push(format!("{who}: extents hold {total} bytes, size says {}", meta.size));
            }
            for b in meta.blocks() {
                claim(b, who.clone(), &mut problems);
            }
        }
        for (bucket, key, _, v) in self.all_versions()? {
            let _ = (bucket, key);
            if let Some(meta) = v.object {
                for b in meta.blocks() {
                    claim(b, format!("a noncurrent version ({})", v.version_id), &mut problems);
                }
            }
        }
        for (id, up) in self.uploads()? {
            for (n, p) in &up.parts {
                for &b in &p.extent.blocks {
                    claim(b, format!("upload {id} part {n}"), &mut problems);
                }
            }
        }
        Ok(problems)
    }
}

/// The whole directory, for the encrypted snapshot kept in the untrusted store.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DirectoryDump {
    /// Buckets.
    pub buckets: Vec<(String, BucketMeta)>,
    /// Objects: (bucket, key, meta).
    pub objects: Vec<(String, String, ObjectMeta)>,
    /// Uploads in progress.
    pub uploads: Vec<(String, Upload)>,
    /// Allocation high-water mark.
    pub next: u64,
    /// Free-listed blocks below it.
    pub free: Vec<u64>,
    /// Noncurrent versions and delete markers: (bucket, key, rank, version).
    pub versions: Vec<(String, String, u64, Version)>,
    /// Bucket settings.
    pub configs: Vec<(String, BucketConfig)>,
    /// Named bucket settings: (bucket, name, JSON document).
    pub settings: Vec<(String, String, String)>,
}

/// A [`DirectoryDump`] as snapshots of format `BFSNAP06` held it (before named settings).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DirectoryDumpV6 {
    /// Buckets.
    pub buckets: Vec<(String, BucketMeta)>,
    /// Objects: (bucket, key, meta).
    pub objects: Vec<(String, String, ObjectMeta)>,
    /// Uploads in progress.
    pub uploads: Vec<(String, Upload)>,
    /// Allocation high-water mark.
    pub next: u64,
    /// Free-listed blocks below it.
    pub free: Vec<u64>,
    /// Noncurrent versions and delete markers.
    pub versions: Vec<(String, String, u64, Version)>,
    /// Bucket settings.
    pub configs: Vec<(String, BucketConfig)>,
}

impl From<DirectoryDumpV6> for DirectoryDump {
    fn from(d: DirectoryDumpV6) -> Self {
        DirectoryDump {
            buckets: d.buckets,
            objects: d.objects,
            uploads: d.uploads,
            next: d.next,
            free: d.free,
            versions: d.versions,
            configs: d.configs,
            settings: Vec::new(),
        }
    }
}

/// A [`DirectoryDump`] as snapshots before versioning held it (format `BFSNAP05` and older).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DirectoryDumpV5 {
    /// Buckets.
    pub buckets: Vec<(String, BucketMeta)>,
    /// Objects: (bucket, key, meta).
    pub objects: Vec<(String, String, ObjectMeta)>,
    /// Uploads in progress.
    pub uploads: Vec<(String, Upload)>,
    /// Allocation high-water mark.
    pub next: u64,
    /// Free-listed blocks below it.
    pub free: Vec<u64>,
}

impl From<DirectoryDumpV5> for DirectoryDump {
    fn from(d: DirectoryDumpV5) -> Self {
        DirectoryDump {
            buckets: d.buckets,
            objects: d.objects,
            uploads: d.uploads,
            next: d.next,
            free: d.free,
            versions: Vec::new(),
            configs: Vec::new(),
            settings: Vec::new(),
        }
    }
}

impl Directory {
    /// Everything in the directory.
    pub fn dump(&self) -> Result<DirectoryDump> {
        let (next, free) = {
            let a = self.alloc.lock();
            (a.next, a.durably_free())
        };
        Ok(DirectoryDump {
            buckets: self.buckets()?,
            objects: self.all_objects()?,
            uploads: self.uploads()?,
            next,
            free,
            versions: self.all_versions()?,
            configs: self.bucket_configs()?,
            settings: settings_of(&self.db.begin_read().map_err(db_err)?)?,
        })
    }

    /// Everything the read transaction `txn` sees, with the allocator's `next` and `free`.
    fn dump_txn(txn: &redb::ReadTransaction, next: u64, free: Vec<u64>) -> Result<DirectoryDump> {
        let mut buckets = Vec::new();
        for item in txn.open_table(BUCKETS).map_err(db_err)?.iter().map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            buckets.push((k.value().to_string(), dec(v.value())?));
        }
        let mut objects = Vec::new();
        for item in txn.open_table(OBJECTS).map_err(db_err)?.iter().map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            let (b, key) = k.value();
            objects.push((b.to_string(), key.to_string(), dec(v.value())?));
        }
        let mut uploads = Vec::new();
        for item in txn.open_table(UPLOADS).map_err(db_err)?.iter().map_err(db_err)? {
            let (k, v) = item.map_err(db_err)?;
            uploads.push((k.value().to_string(), dec(v.value())?));
        }
        let versions = all_versions_of(txn)?;
        let configs = bucket_configs_of(txn)?;
        let settings = settings_of(txn)?;
        Ok(DirectoryDump { buckets, objects, uploads, next, free, versions, configs, settings })
    }

    /// Creates a new directory database at `path` holding `dump`, sealed under `master`.
    pub fn restore(
        path: &Path,
        capacity: u64,
        dump: &DirectoryDump,
        master: &MasterKey,
    ) -> Result<Self> {
        if path.exists() {
            return Err(GatewayError::Config(format!("{} already exists", path.display())));
        }
        Self::write_dump(open_sealed(path, master, true)?, dump)?;
        Self::open(path, capacity, master)
    }

    /// Writes `dump` into the empty database `db` (and closes it).
    fn write_dump(db: Database, dump: &DirectoryDump) -> Result<()> {
        {
            let txn = db.begin_write().map_err(db_err)?;
            {
                let mut b = txn.open_table(BUCKETS).map_err(db_err)?;
                for (name, meta) in &dump.buckets {
                    b.insert(name.as_str(), enc(meta).as_slice()).map_err(db_err)?;
                }
                let mut o = txn.open_table(OBJECTS).map_err(db_err)?;
                for (bucket, key, meta) in &dump.objects {
                    o.insert((bucket.as_str(), key.as_str()), enc(meta).as_slice())
                        .map_err(db_err)?;
                }
                let mut u = txn.open_table(UPLOADS).map_err(db_err)?;
                for (id, up) in &dump.uploads {
                    u.insert(id.as_str(), enc(up).as_slice()).map_err(db_err)?;
                }
                let mut v = txn.open_table(VERSIONS).map_err(db_err)?;
                for (bucket, key, rank, version) in &dump.versions {
                    v.insert((bucket.as_str(), key.as_str(), *rank), enc_v1(version).as_slice())
                        .map_err(db_err)?;
                }
                let mut c = txn.open_table(BUCKET_CONFIG).map_err(db_err)?;
                for (bucket, config) in &dump.configs {
                    c.insert(bucket.as_str(), enc_v1(config).as_slice()).map_err(db_err)?;
                }
                let mut st = txn.open_table(BUCKET_SETTINGS).map_err(db_err)?;
                for (bucket, name, value) in &dump.settings {
                    st.insert((bucket.as_str(), name.as_str()), value.as_str()).map_err(db_err)?;
                }
                let mut f = txn.open_table(FREE).map_err(db_err)?;
                for &blk in &dump.free {
                    f.insert(blk, ()).map_err(db_err)?;
                }
                let mut a = txn.open_table(ALLOC).map_err(db_err)?;
                a.insert("next", dump.next).map_err(db_err)?;
            }
            txn.commit().map_err(db_err)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The objects and their bytes follow puts, overwrites, deletes and a replay, and agree
    /// with a fresh count after a reopen.
    #[test]
    fn object_totals_follow_every_change() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let key = MasterKey::from_bytes([7u8; 32]);
        let d = Directory::open(&path, 64, &key).unwrap();
        d.create_bucket("b").unwrap();
        assert_eq!(d.object_totals().unwrap(), ObjectTotals { objects: 0, bytes: 0 });
        let put = |name: &str, size: u64| {
            let blocks = d.allocate(1).unwrap().blocks;
            let meta = ObjectMeta {
                size,
                extents: vec![Extent { len: size, blocks: blocks.clone() }],
                ..Default::default()
            };
            d.transact(&blocks, |tx| tx.put_object("b", name, &meta)).unwrap();
        };
        put("x", 100);
        put("y", 1000);
        put("x", 10);
        assert_eq!(d.object_totals().unwrap(), ObjectTotals { objects: 2, bytes: 1010 });
        d.transact(&[], |tx| tx.delete_object("b", "y")).unwrap();
        d.transact(&[], |tx| tx.delete_object("b", "nothing")).unwrap();
        assert_eq!(d.object_totals().unwrap(), ObjectTotals { objects: 1, bytes: 10 });
        // A replay from the store-side log goes through the same transactions.
        let meta = ObjectMeta { size: 5, ..Default::default() };
        d.apply(vec![DirOp::PutObject { bucket: "b".into(), key: "z".into(), meta }]).unwrap();
        assert_eq!(d.object_totals().unwrap(), ObjectTotals { objects: 2, bytes: 15 });
        drop(d);
        let d = Directory::open(&path, 64, &key).unwrap();
        assert_eq!(d.object_totals().unwrap(), ObjectTotals { objects: 2, bytes: 15 });
    }

    /// Blocks freed by a delete are handed out again one at a time, each once; while they are
    /// reserved the free count leaves them out and a dump lists each free block once; a
    /// reservation given back makes them free again.
    #[test]
    fn reserved_blocks_from_the_free_list_are_counted_and_dumped_once() {
        let dir = tempfile::tempdir().unwrap();
        let key = MasterKey::from_bytes([3u8; 32]);
        let d = Directory::open(&dir.path().join("meta.redb"), 64, &key).unwrap();
        d.create_bucket("b").unwrap();
        let blocks = d.allocate(10).unwrap().blocks;
        let meta = ObjectMeta {
            size: 10,
            extents: vec![Extent { len: 10, blocks: blocks.clone() }],
            ..Default::default()
        };
        d.transact(&blocks, |tx| tx.put_object("b", "x", &meta)).unwrap();
        d.transact(&[], |tx| tx.delete_object("b", "x")).unwrap();
        assert_eq!(d.free_blocks(), 64);
        // One at a time, as a streamed PUT reserves them.
        let mut taken = Vec::new();
        for _ in 0..12 {
            taken.push(d.allocate(1).unwrap().blocks[0]);
        }
        let distinct: BTreeSet<u64> = taken.iter().copied().collect();
        assert_eq!(distinct.len(), 12, "a block was handed out twice: {taken:?}");
        assert!(blocks.iter().all(|b| distinct.contains(b)), "the free list comes first");
        assert_eq!(d.free_blocks(), 52);
        let ((), dump) = d.dump_with(|| ()).unwrap();
        let listed: BTreeSet<u64> = dump.free.iter().copied().collect();
        assert_eq!(listed.len(), dump.free.len(), "a free block is dumped twice: {:?}", dump.free);
        // Durably, every block below the mark is still free.
        assert_eq!(listed, blocks.iter().copied().collect());
        d.unreserve(&taken);
        assert_eq!(d.free_blocks(), 64);
        let again: BTreeSet<u64> = d.allocate(12).unwrap().blocks.into_iter().collect();
        assert_eq!(again, distinct);
    }

    /// Tail blocks (above the high-water mark) reserved by writers in flight are skipped,
    /// and one given back is handed out again before any higher block.
    #[test]
    fn tail_blocks_are_handed_out_once_and_reused_when_given_back() {
        let dir = tempfile::tempdir().unwrap();
        let key = MasterKey::from_bytes([4u8; 32]);
        let d = Directory::open(&dir.path().join("meta.redb"), 64, &key).unwrap();
        let a: Vec<u64> = (0..5).map(|_| d.allocate(1).unwrap().blocks[0]).collect();
        let b: Vec<u64> = d.allocate(3).unwrap().blocks;
        assert_eq!(a, vec![0, 1, 2, 3, 4]);
        assert_eq!(b, vec![5, 6, 7]);
        d.unreserve(&[a[2]]);
        assert_eq!(d.free_blocks(), 64 - 7);
        assert_eq!(d.allocate(2).unwrap().blocks, vec![2, 8]);
        // A writer claims a later block: the blocks below it that others hold stay theirs.
        d.create_bucket("k").unwrap();
        let meta = ObjectMeta {
            size: 1,
            extents: vec![Extent { len: 1, blocks: vec![b[2]] }],
            ..Default::default()
        };
        d.transact(&[b[2]], |tx| tx.put_object("k", "o", &meta)).unwrap();
        assert_eq!(d.free_blocks(), 64 - 9);
        d.unreserve(&[a[0], b[0]]);
        assert_eq!(d.free_blocks(), 64 - 7);
        let next: BTreeSet<u64> = d.allocate(3).unwrap().blocks.into_iter().collect();
        assert_eq!(next, BTreeSet::from([0, 5, 9]));
        assert!(d.check().unwrap().is_empty());
    }

    #[test]
    fn a_plaintext_directory_is_sealed_once_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        {
            // As an earlier version wrote it: plain redb.
            let d = Directory::from_db(Database::create(&path).unwrap(), 64).unwrap();
            d.create_bucket("plain-bucket-xyzzy").unwrap();
            let blocks = d.allocate(2).unwrap().blocks;
            let meta = ObjectMeta {
                size: 100,
                etag: "e".into(),
                extents: vec![Extent { len: 100, blocks: blocks.clone() }],
                ..Default::default()
            };
            d.transact(&blocks, |tx| tx.put_object("plain-bucket-xyzzy", "plain-key", &meta))
                .unwrap();
        }
        let before = std::fs::read(&path).unwrap();
        assert!(before.windows(10).any(|w| w == b"plain-buck"), "the old file is in the clear");
        let key = MasterKey::from_bytes([1u8; 32]);
        let d = Directory::open(&path, 64, &key).unwrap();
        assert_eq!(d.counts().unwrap(), (1, 1));
        assert_eq!(d.object("plain-bucket-xyzzy", "plain-key").unwrap().unwrap().size, 100);
        assert_eq!(d.free_blocks(), 62);
        drop(d);
        let after = std::fs::read(&path).unwrap();
        assert_eq!(&after[..8], crate::sealed_file::MAGIC);
        assert!(!after.windows(10).any(|w| w == b"plain-buck"));
        assert!(!path.with_extension("redb.sealing").exists());
        // Opening again uses the sealed file as it is.
        assert_eq!(Directory::open(&path, 64, &key).unwrap().counts().unwrap(), (1, 1));
    }
}
