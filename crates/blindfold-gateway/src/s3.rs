//! The S3 API (via the `s3s` crate) over the object layer.
//!
//! This is the only place where [`GatewayError`]s become S3 error codes. Nothing here logs
//! bucket names, keys or sizes at info level: they are secrets the gateway exists to protect.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result, S3};

use crate::directory::{ObjectMeta, Part};
use crate::objects::{ObjectLayer, ReadPin};
use crate::GatewayError;

/// Bytes read before a GET answers, so that small objects fail with a proper error.
const PREFETCH: usize = 1 << 20;
const MAX_KEYS: usize = 1000;
/// Parts in one ListParts answer, as in S3.
const MAX_PARTS: usize = 1000;

/// The S3 service.
#[derive(Debug, Clone)]
pub struct Gateway {
    objects: Arc<ObjectLayer>,
}

impl Gateway {
    /// Serves `objects`.
    pub fn new(objects: Arc<ObjectLayer>) -> Self {
        Self { objects }
    }
}

fn s3(e: GatewayError) -> S3Error {
    use GatewayError as G;
    match e {
        G::NoSuchBucket => s3_error!(NoSuchBucket),
        G::NoSuchKey => s3_error!(NoSuchKey),
        G::BucketNotEmpty => s3_error!(BucketNotEmpty),
        G::NoSuchUpload => s3_error!(NoSuchUpload),
        G::InvalidPart => s3_error!(InvalidPart),
        G::InvalidPartOrder => s3_error!(InvalidPartOrder),
        G::InvalidRange => s3_error!(InvalidRange),
        G::PreconditionFailed => s3_error!(PreconditionFailed),
        G::TooLarge => s3_error!(EntityTooLarge),
        G::Full { .. } => S3Error::with_message(S3ErrorCode::EntityTooLarge, e.to_string()),
        G::Body(m) => S3Error::with_message(S3ErrorCode::IncompleteBody, m),
        other => {
            if other.is_integrity() {
                tracing::error!("integrity violation detected in the untrusted store");
            } else {
                tracing::error!(error = %other, "internal error");
            }
            S3Error::with_message(S3ErrorCode::InternalError, other.to_string())
        }
    }
}

fn etag(meta: &ObjectMeta) -> ETag {
    ETag::Strong(meta.etag.clone())
}

fn metadata_map(m: Option<Metadata>) -> BTreeMap<String, String> {
    m.map(|m| m.into_iter().collect()).unwrap_or_default()
}

fn to_metadata(m: &BTreeMap<String, String>) -> Option<Metadata> {
    (!m.is_empty()).then(|| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// Checks If-Match / If-None-Match for a read. Returns NotModified as an error for 304.
fn check_conditions(
    meta: &ObjectMeta,
    if_match: Option<&IfMatch>,
    if_none_match: Option<&IfNoneMatch>,
) -> S3Result<()> {
    let ours = etag(meta);
    if let Some(cond) = if_match {
        let ok = match cond {
            ETagCondition::Any => true,
            ETagCondition::ETag(t) => t.strong_cmp(&ours),
        };
        if !ok {
            return Err(s3_error!(PreconditionFailed));
        }
    }
    if let Some(cond) = if_none_match {
        let hit = match cond {
            ETagCondition::Any => true,
            ETagCondition::ETag(t) => t.weak_cmp(&ours),
        };
        if hit {
            return Err(S3Error::new(S3ErrorCode::NotModified));
        }
    }
    Ok(())
}

fn body_stream(
    body: Option<StreamingBlob>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, String>> + Unpin {
    match body {
        Some(b) => b.map(|r| r.map_err(|e| e.to_string())).left_stream(),
        None => futures::stream::empty().right_stream(),
    }
}

fn receiver_blob(
    rx: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, GatewayError>>,
) -> StreamingBlob {
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
    StreamingBlob::wrap(stream)
}

/// One page of a multipart upload's parts: those numbered above `after`, at most `max` of
/// them, and whether more follow.
fn parts_page(parts: &BTreeMap<i32, Part>, after: i32, max: usize) -> (Vec<(i32, &Part)>, bool) {
    let mut rest = parts.range(after.saturating_add(1)..).map(|(n, p)| (*n, p));
    let page: Vec<_> = rest.by_ref().take(max).collect();
    (page, rest.next().is_some())
}

fn object_entry(key: String, meta: &ObjectMeta) -> Object {
    Object {
        key: Some(key),
        size: Some(meta.size as i64),
        e_tag: Some(etag(meta)),
        last_modified: Some(Timestamp::from(meta.modified())),
        storage_class: Some(ObjectStorageClass::from_static(ObjectStorageClass::STANDARD)),
        ..Default::default()
    }
}

/// A listing: objects and common prefixes, whether truncated, and the last key consumed.
struct Listing {
    objects: Vec<Object>,
    prefixes: Vec<CommonPrefix>,
    truncated: bool,
    last: Option<String>,
}

impl Gateway {
    fn list(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        after: &str,
        max_keys: usize,
    ) -> Result<Listing, GatewayError> {
        let dir = self.objects.directory();
        dir.require_bucket(bucket)?;
        // An empty delimiter means no delimiter (rclone and restic send `delimiter=`).
        let delimiter = delimiter.filter(|d| !d.is_empty());
        let mut out =
            Listing { objects: Vec::new(), prefixes: Vec::new(), truncated: false, last: None };
        let mut cursor = after.to_string();
        // Continuing after a common prefix: skip every key under it, not just the prefix.
        if let Some(d) = delimiter {
            if after.len() > prefix.len() && after.starts_with(prefix) && after.ends_with(d) {
                cursor.push(char::MAX);
            }
        }
        let mut count = 0usize;
        loop {
            let page = dir.list(bucket, prefix, &cursor, 1000)?;
            if page.is_empty() {
                return Ok(out);
            }
            for (key, meta) in page {
                if count == max_keys {
                    out.truncated = true;
                    return Ok(out);
                }
                cursor.clone_from(&key);
                if let Some(d) = delimiter {
                    if let Some(pos) = key[prefix.len()..].find(d) {
                        let common = key[..prefix.len() + pos + d.len()].to_string();
                        // Skip every key under this common prefix.
                        let mut skip_to = common.clone();
                        skip_to.push(char::MAX);
                        cursor = skip_to;
                        out.last = Some(common.clone());
                        out.prefixes.push(CommonPrefix { prefix: Some(common) });
                        count += 1;
                        break;
                    }
                }
                out.last = Some(key.clone());
                out.objects.push(object_entry(key, &meta));
                count += 1;
            }
        }
    }

    fn head(&self, bucket: &str, key: &str) -> S3Result<ObjectMeta> {
        let dir = self.objects.directory();
        dir.require_bucket(bucket).map_err(s3)?;
        dir.object(bucket, key).map_err(s3)?.ok_or_else(|| s3_error!(NoSuchKey))
    }

    /// [`Gateway::head`] for reading the data: the blocks stay pinned while the pin lives.
    fn head_for_read(&self, bucket: &str, key: &str) -> S3Result<(ObjectMeta, ReadPin)> {
        self.objects.directory().require_bucket(bucket).map_err(s3)?;
        self.objects.lookup_for_read(bucket, key).map_err(s3)?.ok_or_else(|| s3_error!(NoSuchKey))
    }
}

#[async_trait::async_trait]
impl S3 for Gateway {
    async fn list_buckets(
        &self,
        _req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let buckets = self.objects.directory().buckets().map_err(s3)?;
        let list = buckets
            .into_iter()
            .map(|(name, meta)| Bucket {
                name: Some(name),
                creation_date: Some(Timestamp::from(
                    std::time::SystemTime::UNIX_EPOCH
                        + std::time::Duration::from_nanos(meta.created_ns.max(0) as u64),
                )),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput { buckets: Some(list), ..Default::default() }))
    }

    async fn create_bucket(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let created = self.objects.directory().create_bucket(&req.input.bucket).map_err(s3)?;
        if !created {
            return Err(s3_error!(BucketAlreadyOwnedByYou));
        }
        tracing::debug!("bucket created");
        Ok(S3Response::new(CreateBucketOutput::default()))
    }

    async fn head_bucket(
        &self,
        req: S3Request<HeadBucketInput>,
    ) -> S3Result<S3Response<HeadBucketOutput>> {
        self.objects.directory().require_bucket(&req.input.bucket).map_err(s3)?;
        Ok(S3Response::new(HeadBucketOutput::default()))
    }

    async fn get_bucket_location(
        &self,
        req: S3Request<GetBucketLocationInput>,
    ) -> S3Result<S3Response<GetBucketLocationOutput>> {
        self.objects.directory().require_bucket(&req.input.bucket).map_err(s3)?;
        Ok(S3Response::new(GetBucketLocationOutput::default()))
    }

    async fn delete_bucket(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        self.objects.directory().delete_bucket(&req.input.bucket).map_err(s3)?;
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    async fn put_object(
        &self,
        req: S3Request<PutObjectInput>,
    ) -> S3Result<S3Response<PutObjectOutput>> {
        let input = req.input;
        let if_none_match = matches!(input.if_none_match, Some(ETagCondition::Any));
        if let Some(cond) = &input.if_match {
            let meta = self.objects.directory().object(&input.bucket, &input.key).map_err(s3)?;
            let ok = match (cond, &meta) {
                (_, None) => false,
                (ETagCondition::Any, Some(_)) => true,
                (ETagCondition::ETag(t), Some(m)) => t.strong_cmp(&etag(m)),
            };
            if !ok {
                return Err(s3_error!(PreconditionFailed));
            }
        }
        if let Some(len) = input.content_length {
            if len as u64 > crate::objects::MAX_OBJECT_SIZE {
                return Err(s3_error!(EntityTooLarge));
            }
        }
        let meta = self
            .objects
            .put_object(
                &input.bucket,
                &input.key,
                body_stream(input.body),
                input.content_type,
                metadata_map(input.metadata),
                if_none_match,
            )
            .await
            .map_err(s3)?;
        tracing::debug!("object stored");
        Ok(S3Response::new(PutObjectOutput {
            e_tag: Some(etag(&meta)),
            checksum_crc32: input.checksum_crc32,
            checksum_crc32c: input.checksum_crc32c,
            checksum_crc64nvme: input.checksum_crc64nvme,
            checksum_sha1: input.checksum_sha1,
            checksum_sha256: input.checksum_sha256,
            ..Default::default()
        }))
    }

    async fn get_object(
        &self,
        req: S3Request<GetObjectInput>,
    ) -> S3Result<S3Response<GetObjectOutput>> {
        let input = req.input;
        let (meta, _pin) = self.head_for_read(&input.bucket, &input.key)?;
        check_conditions(&meta, input.if_match.as_ref(), input.if_none_match.as_ref())?;
        let (range, content_range) = match &input.range {
            Some(r) => {
                let rg = r.check(meta.size).map_err(|_| s3_error!(InvalidRange))?;
                let cr = format!("bytes {}-{}/{}", rg.start, rg.end.saturating_sub(1), meta.size);
                (rg, Some(cr))
            }
            None => (0..meta.size, None),
        };
        let len = range.end - range.start;
        let rx = self.objects.read_range(&meta, range, PREFETCH).await.map_err(s3)?;
        Ok(S3Response::new(GetObjectOutput {
            body: Some(receiver_blob(rx)),
            content_length: Some(len as i64),
            content_range,
            content_type: meta.content_type.clone(),
            e_tag: Some(etag(&meta)),
            last_modified: Some(Timestamp::from(meta.modified())),
            metadata: to_metadata(&meta.metadata),
            accept_ranges: Some("bytes".into()),
            ..Default::default()
        }))
    }

    async fn head_object(
        &self,
        req: S3Request<HeadObjectInput>,
    ) -> S3Result<S3Response<HeadObjectOutput>> {
        let input = req.input;
        let meta = self.head(&input.bucket, &input.key)?;
        check_conditions(&meta, input.if_match.as_ref(), input.if_none_match.as_ref())?;
        Ok(S3Response::new(HeadObjectOutput {
            content_length: Some(meta.size as i64),
            content_type: meta.content_type.clone(),
            e_tag: Some(etag(&meta)),
            last_modified: Some(Timestamp::from(meta.modified())),
            metadata: to_metadata(&meta.metadata),
            accept_ranges: Some("bytes".into()),
            ..Default::default()
        }))
    }

    async fn delete_object(
        &self,
        req: S3Request<DeleteObjectInput>,
    ) -> S3Result<S3Response<DeleteObjectOutput>> {
        self.objects.delete_object(&req.input.bucket, &req.input.key).map_err(s3)?;
        Ok(S3Response::new(DeleteObjectOutput::default()))
    }

    async fn delete_objects(
        &self,
        req: S3Request<DeleteObjectsInput>,
    ) -> S3Result<S3Response<DeleteObjectsOutput>> {
        let input = req.input;
        self.objects.directory().require_bucket(&input.bucket).map_err(s3)?;
        let quiet = input.delete.quiet.unwrap_or(false);
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for obj in input.delete.objects {
            match self.objects.delete_object(&input.bucket, &obj.key) {
                Ok(_) => {
                    if !quiet {
                        deleted.push(DeletedObject { key: Some(obj.key), ..Default::default() });
                    }
                }
                Err(e) => errors.push(s3s::dto::Error {
                    key: Some(obj.key),
                    code: Some("InternalError".into()),
                    message: Some(e.to_string()),
                    ..Default::default()
                }),
            }
        }
        Ok(S3Response::new(DeleteObjectsOutput {
            deleted: Some(deleted),
            errors: (!errors.is_empty()).then_some(errors),
            ..Default::default()
        }))
    }

    async fn copy_object(
        &self,
        req: S3Request<CopyObjectInput>,
    ) -> S3Result<S3Response<CopyObjectOutput>> {
        let input = req.input;
        let (src_bucket, src_key) = match &input.copy_source {
            CopySource::Bucket { bucket, key, .. } => (bucket.to_string(), key.to_string()),
            _ => {
                return Err(s3_error!(NotImplemented, "only bucket/key copy sources are supported"))
            }
        };
        let (src, _pin) = self.head_for_read(&src_bucket, &src_key)?;
        if let Some(cond) = &input.copy_source_if_match {
            if !matches!(cond, ETagCondition::Any)
                && !matches!(cond, ETagCondition::ETag(t) if t.strong_cmp(&etag(&src)))
            {
                return Err(s3_error!(PreconditionFailed));
            }
        }
        let replace = input
            .metadata_directive
            .as_ref()
            .is_some_and(|d| d.as_str() == MetadataDirective::REPLACE);
        let metadata =
            replace.then(|| (input.content_type.clone(), metadata_map(input.metadata.clone())));
        let meta = self
            .objects
            .copy_object(&src, &input.bucket, &input.key, metadata)
            .await
            .map_err(s3)?;
        Ok(S3Response::new(CopyObjectOutput {
            copy_object_result: Some(CopyObjectResult {
                e_tag: Some(etag(&meta)),
                last_modified: Some(Timestamp::from(meta.modified())),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    async fn list_objects(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let input = req.input;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = input.max_keys.map(|m| m.clamp(0, MAX_KEYS as i32) as usize).unwrap_or(MAX_KEYS);
        let after = input.marker.clone().unwrap_or_default();
        let l = self
            .list(&input.bucket, &prefix, input.delimiter.as_deref(), &after, max)
            .map_err(s3)?;
        let delimited = input.delimiter.as_deref().is_some_and(|d| !d.is_empty());
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(input.bucket),
            prefix: Some(prefix),
            marker: input.marker,
            max_keys: Some(max as i32),
            is_truncated: Some(l.truncated),
            next_marker: if l.truncated && delimited { l.last.clone() } else { None },
            contents: Some(l.objects),
            common_prefixes: Some(l.prefixes),
            delimiter: input.delimiter,
            ..Default::default()
        }))
    }

    async fn list_objects_v2(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let input = req.input;
        let prefix = input.prefix.clone().unwrap_or_default();
        let max = input.max_keys.map(|m| m.clamp(0, MAX_KEYS as i32) as usize).unwrap_or(MAX_KEYS);
        let after = match &input.continuation_token {
            Some(t) => String::from_utf8(
                hex::decode(t).map_err(|_| s3_error!(InvalidArgument, "bad continuation token"))?,
            )
            .map_err(|_| s3_error!(InvalidArgument, "bad continuation token"))?,
            None => input.start_after.clone().unwrap_or_default(),
        };
        let l = self
            .list(&input.bucket, &prefix, input.delimiter.as_deref(), &after, max)
            .map_err(s3)?;
        let key_count = (l.objects.len() + l.prefixes.len()) as i32;
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(input.bucket),
            prefix: Some(prefix),
            max_keys: Some(max as i32),
            key_count: Some(key_count),
            continuation_token: input.continuation_token,
            is_truncated: Some(l.truncated),
            next_continuation_token: if l.truncated {
                l.last.map(|k| hex::encode(k.as_bytes()))
            } else {
                None
            },
            contents: Some(l.objects),
            common_prefixes: Some(l.prefixes),
            delimiter: input.delimiter,
            start_after: input.start_after,
            ..Default::default()
        }))
    }

    async fn create_multipart_upload(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let input = req.input;
        let id = self
            .objects
            .create_upload(
                &input.bucket,
                &input.key,
                input.content_type,
                metadata_map(input.metadata),
            )
            .map_err(s3)?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(id),
            ..Default::default()
        }))
    }

    async fn upload_part(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let input = req.input;
        if !(1..=10_000).contains(&input.part_number) {
            return Err(s3_error!(InvalidArgument, "part numbers are 1 to 10000"));
        }
        let part = self
            .objects
            .upload_part(
                &input.bucket,
                &input.key,
                &input.upload_id,
                input.part_number,
                body_stream(input.body),
            )
            .await
            .map_err(s3)?;
        // Echo the checksums the client sent: clients compare them.
        Ok(S3Response::new(UploadPartOutput {
            e_tag: Some(ETag::Strong(part.etag)),
            checksum_crc32: input.checksum_crc32,
            checksum_crc32c: input.checksum_crc32c,
            checksum_crc64nvme: input.checksum_crc64nvme,
            checksum_sha1: input.checksum_sha1,
            checksum_sha256: input.checksum_sha256,
            ..Default::default()
        }))
    }

    async fn complete_multipart_upload(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let input = req.input;
        let parts: Vec<(i32, Option<String>)> = input
            .multipart_upload
            .and_then(|m| m.parts)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.part_number.unwrap_or(0), p.e_tag.map(|t| t.value().to_string())))
            .collect();
        if parts.is_empty() {
            return Err(s3_error!(MalformedXML, "no parts listed"));
        }
        let meta = self
            .objects
            .complete_upload(&input.bucket, &input.key, &input.upload_id, &parts)
            .await
            .map_err(s3)?;
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            e_tag: Some(etag(&meta)),
            ..Default::default()
        }))
    }

    async fn abort_multipart_upload(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let input = req.input;
        self.objects.abort_upload(&input.bucket, &input.key, &input.upload_id).map_err(s3)?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    async fn list_parts(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let input = req.input;
        let up = self
            .objects
            .directory()
            .upload(&input.upload_id)
            .map_err(s3)?
            .ok_or_else(|| s3_error!(NoSuchUpload))?;
        if up.bucket != input.bucket || up.key != input.key {
            return Err(s3_error!(NoSuchUpload));
        }
        let after = input.part_number_marker.unwrap_or(0);
        let max =
            input.max_parts.map(|m| m.clamp(0, MAX_PARTS as i32) as usize).unwrap_or(MAX_PARTS);
        let (page, truncated) = parts_page(&up.parts, after, max);
        let next_marker = page.last().map(|(n, _)| *n);
        let parts = page
            .into_iter()
            .map(|(n, p)| s3s::dto::Part {
                part_number: Some(n),
                e_tag: Some(ETag::Strong(p.etag.clone())),
                size: Some(p.extent.len as i64),
                last_modified: Some(Timestamp::from(
                    std::time::SystemTime::UNIX_EPOCH
                        + std::time::Duration::from_nanos(p.modified_ns.max(0) as u64),
                )),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(input.bucket),
            key: Some(input.key),
            upload_id: Some(input.upload_id),
            parts: Some(parts),
            part_number_marker: input.part_number_marker,
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            next_part_number_marker: if truncated { next_marker } else { None },
            ..Default::default()
        }))
    }

    async fn list_multipart_uploads(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let input = req.input;
        self.objects.directory().require_bucket(&input.bucket).map_err(s3)?;
        let prefix = input.prefix.clone().unwrap_or_default();
        let uploads = self
            .objects
            .directory()
            .uploads()
            .map_err(s3)?
            .into_iter()
            .filter(|(_, u)| u.bucket == input.bucket && u.key.starts_with(&prefix))
            .map(|(id, u)| MultipartUpload {
                key: Some(u.key),
                upload_id: Some(id),
                initiated: Some(Timestamp::from(
                    std::time::SystemTime::UNIX_EPOCH
                        + std::time::Duration::from_nanos(u.created_ns.max(0) as u64),
                )),
                ..Default::default()
            })
            .collect();
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(input.bucket),
            prefix: input.prefix,
            uploads: Some(uploads),
            is_truncated: Some(false),
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::directory::{Directory, ObjectMeta};
    use blindfold_crypto::{MasterKey, StoreId};
    use blindfold_oram::PathOramConfig;
    use blindfold_proxy::{DurablePathOram, SealedPathOram};
    use blindfold_store::MemoryStore;

    async fn gateway(keys: &[&str]) -> (Gateway, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let config = PathOramConfig::builder(64, 64).build().unwrap();
        let store = Arc::new(MemoryStore::new(SealedPathOram::geometry(&config).unwrap()));
        let engine = DurablePathOram::create(
            &dir.path().join("oram"),
            config,
            store,
            &MasterKey::generate(),
            StoreId::random(),
        )
        .await
        .unwrap();
        let directory = Directory::open(
            &dir.path().join("meta.redb"),
            64,
            &blindfold_crypto::MasterKey::generate(),
        )
        .unwrap();
        directory.create_bucket("b").unwrap();
        directory
            .transact(&[], |tx| {
                for k in keys {
                    tx.put_object("b", k, &ObjectMeta::default())?;
                }
                Ok(())
            })
            .unwrap();
        let layer = Arc::new(ObjectLayer::new(directory, engine, false));
        (Gateway::new(layer), dir)
    }

    fn names(l: &Listing) -> (Vec<String>, Vec<String>) {
        (
            l.objects.iter().map(|o| o.key.clone().unwrap()).collect(),
            l.prefixes.iter().map(|p| p.prefix.clone().unwrap()).collect(),
        )
    }

    #[test]
    fn parts_are_listed_in_pages() {
        let parts: BTreeMap<i32, Part> = [1, 2, 3, 5, 8].map(|n| (n, Part::default())).into();
        let numbers = |(page, more): (Vec<(i32, &Part)>, bool)| {
            (page.into_iter().map(|(n, _)| n).collect::<Vec<_>>(), more)
        };
        assert_eq!(numbers(parts_page(&parts, 0, 1000)), (vec![1, 2, 3, 5, 8], false));
        assert_eq!(numbers(parts_page(&parts, 0, 2)), (vec![1, 2], true));
        assert_eq!(numbers(parts_page(&parts, 2, 2)), (vec![3, 5], true));
        assert_eq!(numbers(parts_page(&parts, 5, 2)), (vec![8], false));
        assert_eq!(numbers(parts_page(&parts, 3, 2)), (vec![5, 8], false));
        assert_eq!(numbers(parts_page(&parts, 8, 2)), (vec![], false));
        assert_eq!(numbers(parts_page(&parts, i32::MAX, 2)), (vec![], false));
        assert_eq!(numbers(parts_page(&parts, 0, 0)), (vec![], true));
    }

    #[tokio::test]
    async fn listing_with_delimiters_and_pages() {
        let keys = ["a", "d/1", "d/2", "d/x/3", "e/1", "f", "f/"];
        let (g, _d) = gateway(&keys).await;
        // No delimiter, and an empty delimiter (rclone, restic), list everything.
        for d in [None, Some("")] {
            let l = g.list("b", "", d, "", 1000).unwrap();
            assert_eq!(names(&l).0, keys.to_vec());
            assert!(!l.truncated);
        }
        let l = g.list("b", "", Some("/"), "", 1000).unwrap();
        assert_eq!(
            names(&l),
            (vec!["a".into(), "f".into()], vec!["d/".into(), "e/".into(), "f/".into()])
        );
        let l = g.list("b", "d/", Some("/"), "", 1000).unwrap();
        assert_eq!(names(&l), (vec!["d/1".into(), "d/2".into()], vec!["d/x/".into()]));
        // Pages of two, continuing from the last entry (a common prefix included), must visit
        // every entry exactly once.
        let mut seen = Vec::new();
        let mut after = String::new();
        loop {
            let l = g.list("b", "", Some("/"), &after, 2).unwrap();
            let (o, p) = names(&l);
            seen.extend(o);
            seen.extend(p);
            if !l.truncated {
                break;
            }
            after = l.last.clone().unwrap();
        }
        seen.sort();
        assert_eq!(seen, vec!["a", "d/", "e/", "f", "f/"]);
        // Start-after in the middle.
        let l = g.list("b", "", None, "d/2", 1000).unwrap();
        assert_eq!(names(&l).0, vec!["d/x/3", "e/1", "f", "f/"]);
        assert!(matches!(g.list("nope", "", None, "", 10), Err(GatewayError::NoSuchBucket)));
    }
}
