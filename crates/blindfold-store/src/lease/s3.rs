//! Lease records as objects of an S3-compatible store, replaced with conditional PUTs.

use std::fmt;

use async_trait::async_trait;
use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};

use super::{LeaseRecords, LoadedRecord, MAX_LEASE_RECORD};
use crate::s3::{build_client, map_error, missing_bucket};
use crate::{Result, S3Options, StoreError};

/// The record of `name` is the object `<prefix>/.lease/<name>`. A swap from nothing is a PUT
/// with `If-None-Match: *`, any other a PUT with `If-Match: <ETag>` of the record read
/// (the token); the server refuses either with `412 Precondition Failed` if the object changed
/// in between. AWS S3 and MinIO both honour these headers; a server that does not is refused
/// with [`StoreError::Unsupported`] rather than used without them.
pub(crate) struct S3LeaseRecords {
    client: AmazonS3,
    /// `<prefix>/.lease` (no leading `/`).
    base: String,
    label: String,
    endpoint: String,
    bucket: String,
}

impl fmt::Debug for S3LeaseRecords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3LeaseRecords").field("store", &self.label).finish()
    }
}

impl S3LeaseRecords {
    pub(crate) async fn open(bucket: &str, prefix: &str, options: &S3Options) -> Result<Self> {
        let prefix = prefix.trim_matches('/');
        let base = if prefix.is_empty() { ".lease".into() } else { format!("{prefix}/.lease") };
        let label = format!("s3://{bucket}/{base}");
        let client = build_client(bucket, options, None, &label)?;
        let endpoint = options.endpoint.clone().unwrap_or_else(|| "AWS S3".to_string());
        Ok(Self { client, base, label, endpoint, bucket: bucket.to_string() })
    }

    fn path(&self, name: &str) -> Path {
        // `base` is made of validated segments and `name` is a checked lease name.
        Path::from(format!("{}/{name}", self.base))
    }

    fn error(&self, context: &str, e: object_store::Error) -> StoreError {
        map_error(&self.label, &self.endpoint, &self.bucket, context, e)
    }
}

#[async_trait]
impl LeaseRecords for S3LeaseRecords {
    async fn load(&self, name: &str) -> Result<Option<LoadedRecord>> {
        let context = format!("reading lease record {name:?}");
        let got = match self.client.get(&self.path(name)).await {
            Ok(got) => got,
            Err(e @ object_store::Error::NotFound { .. }) => {
                return match missing_bucket(&self.label, &self.bucket, &e) {
                    Some(missing) => Err(missing),
                    None => Ok(None),
                }
            }
            Err(e) => return Err(self.error(&context, e)),
        };
        if got.meta.size > MAX_LEASE_RECORD as u64 {
            return Err(StoreError::NotAStore {
                path: format!("{}/{name}", self.label).into(),
                reason: format!("a lease record of {} bytes", got.meta.size),
            });
        }
        let token = got.meta.e_tag.clone().ok_or_else(|| {
            StoreError::Unsupported(format!(
            "leases on {}: the server gives no ETag, so it cannot replace objects conditionally",
            self.label
        ))
        })?;
        let bytes = got.bytes().await.map_err(|e| self.error(&context, e))?;
        if bytes.len() > MAX_LEASE_RECORD || token.len() > MAX_LEASE_RECORD {
            return Err(StoreError::NotAStore {
                path: format!("{}/{name}", self.label).into(),
                reason: "a lease record (or its ETag) that is too long".into(),
            });
        }
        Ok(Some(LoadedRecord { record: bytes.to_vec(), token: token.into_bytes() }))
    }

    async fn swap(&self, name: &str, expected: Option<&[u8]>, record: &[u8]) -> Result<bool> {
        let mode = match expected {
            None => PutMode::Create,
            Some(token) => PutMode::Update(UpdateVersion {
                e_tag: Some(String::from_utf8_lossy(token).into_owned()),
                version: None,
            }),
        };
        let options = PutOptions { mode, ..PutOptions::default() };
        let payload = PutPayload::from(record.to_vec());
        match self.client.put_opts(&self.path(name), payload, options).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => Ok(false),
            Err(e @ object_store::Error::NotImplemented { .. })
            | Err(e @ object_store::Error::NotSupported { .. }) => Err(StoreError::Unsupported(
                format!("leases on {}: conditional writes ({e})", self.label),
            )),
            Err(e) => Err(self.error(&format!("writing lease record {name:?}"), e)),
        }
    }
}
