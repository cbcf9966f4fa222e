//! Server-side encryption as S3 clients ask for it. Every object is already sealed by the
//! gateway (and its blocks are ORAM data), so:
//!
//! * SSE-S3 (`x-amz-server-side-encryption: AES256`) is accepted and reported back;
//! * SSE-C (a customer key with every request) is honoured as an access condition: the key
//!   must come, with its MD5, on every read, copy and part upload of that object, and must be
//!   the key it was written with. The key itself is never stored; the object keeps a salted
//!   SHA-256 digest of it ([`CUSTOMER_ENTRY`]) to compare with. The data is sealed under the
//!   gateway's own keys, not the customer's;
//! * SSE-KMS is refused: the gateway has no key management service to ask.

use std::collections::BTreeMap;

use base64::Engine as _;
use md5::Digest as _;
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Result};

/// Metadata entry of an object written with SSE-C: `salt:digest` in hex.
pub(super) const CUSTOMER_ENTRY: &str = crate::directory::SSE_C_KEY;
/// Metadata entry of an object written with SSE-S3 (`AES256`), to report it on reads.
pub(super) const S3_ENTRY: &str = ":sse";
const ALGORITHM: &str = "AES256";

fn invalid(why: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidArgument, why.to_owned())
}

fn request(why: &str) -> S3Error {
    S3Error::with_message(S3ErrorCode::InvalidRequest, why.to_owned())
}

/// A customer key a request carries, checked against its MD5.
pub(super) struct CustomerKey {
    key: zeroize::Zeroizing<Vec<u8>>,
    /// The key's MD5 as sent (echoed in answers).
    pub md5: String,
}

impl CustomerKey {
    /// The three SSE-C headers of a request: all or none.
    pub fn of(
        algorithm: Option<&str>,
        key: Option<&str>,
        md5: Option<&str>,
    ) -> S3Result<Option<Self>> {
        let (algorithm, key, md5) = match (algorithm, key, md5) {
            (None, None, None) => return Ok(None),
            (Some(a), Some(k), Some(m)) => (a, k, m),
            (None, ..) => {
                return Err(invalid(
                    "an SSE-C key needs its algorithm too: \
                     x-amz-server-side-encryption-customer-algorithm: AES256",
                ))
            }
            (_, None, _) => {
                return Err(invalid(
                    "SSE-C needs the key itself: x-amz-server-side-encryption-customer-key \
                     (256 bits, base64)",
                ))
            }
            (_, _, None) => {
                return Err(invalid(
                    "SSE-C needs the key's MD5 too: \
                     x-amz-server-side-encryption-customer-key-MD5 (base64)",
                ))
            }
        };
        if algorithm != ALGORITHM {
            return Err(invalid("the only SSE-C algorithm is AES256"));
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        let key = zeroize::Zeroizing::new(
            b64.decode(key).map_err(|_| invalid("the SSE-C key is not valid base64"))?,
        );
        if key.len() != 32 {
            return Err(invalid("an SSE-C key for AES256 is 256 bits (32 bytes, base64)"));
        }
        if b64.encode(md5::Md5::digest(&*key)) != md5 {
            return Err(invalid(
                "the SSE-C key does not match its MD5 \
                 (x-amz-server-side-encryption-customer-key-MD5)",
            ));
        }
        Ok(Some(Self { key, md5: md5.to_owned() }))
    }

    fn digest(&self, salt: &[u8]) -> Vec<u8> {
        let mut h = ring::digest::Context::new(&ring::digest::SHA256);
        h.update(b"blindfold sse-c v1\0");
        h.update(salt);
        h.update(&self.key);
        h.finish().as_ref().to_vec()
    }

    /// The entry a new object written with this key keeps: a salted digest, never the key.
    pub fn entry(&self) -> (String, Option<String>) {
        let salt: [u8; 16] = rand::random();
        let value = format!("{}:{}", hex::encode(salt), hex::encode(self.digest(&salt)));
        (CUSTOMER_ENTRY.to_owned(), Some(value))
    }

    fn opens(&self, stored: &str) -> bool {
        let Some((salt, digest)) = stored.split_once(':') else { return false };
        let (Ok(salt), Ok(digest)) = (hex::decode(salt), hex::decode(digest)) else {
            return false;
        };
        use subtle::ConstantTimeEq as _;
        bool::from(self.digest(&salt).ct_eq(&digest))
    }
}

/// Refuses SSE-KMS (`aws:kms`, `aws:kms:dsse`, or a KMS key id) with what to do instead.
pub(super) fn refuse_kms(
    sse: Option<&ServerSideEncryption>,
    kms_key: Option<&str>,
) -> S3Result<()> {
    let kms = sse.is_some_and(|s| s.as_str().starts_with("aws:kms"));
    if kms || kms_key.is_some() {
        return Err(invalid(
            "SSE-KMS needs a key management service, and this gateway has none configured. \
             Every object is already encrypted by the gateway: leave out \
             x-amz-server-side-encryption (or ask for AES256) and the KMS key id",
        ));
    }
    match sse.map(ServerSideEncryption::as_str) {
        None | Some(ALGORITHM) => Ok(()),
        Some(other) => Err(invalid(&format!(
            "The encryption method {other:?} is not supported (AES256 is; every object is \
             encrypted by the gateway)"
        ))),
    }
}

/// Refuses `x-amz-server-side-encryption` (and a KMS key id) on a read, as S3 does: they say
/// how to write, and a read that names them expects something the object does not have.
pub(super) fn refuse_on_read(headers: &hyper::HeaderMap) -> S3Result<()> {
    for h in ["x-amz-server-side-encryption", "x-amz-server-side-encryption-aws-kms-key-id"] {
        if headers.contains_key(h) {
            return Err(invalid(&format!(
                "{h} is a header of writes; a read sends only the SSE-C headers, for an object \
                 written with a customer key"
            )));
        }
    }
    Ok(())
}

/// What a write asked for: the entries the new object keeps and the headers to answer with.
#[derive(Default)]
pub(super) struct Written {
    /// SSE-S3 was asked for.
    pub s3: bool,
    /// The customer key's MD5 (SSE-C).
    pub customer_md5: Option<String>,
}

impl Written {
    /// Checks a write's SSE headers and records them in the new object's `map`.
    pub fn apply(
        map: &mut BTreeMap<String, String>,
        sse: Option<&ServerSideEncryption>,
        kms_key: Option<&str>,
        customer: Option<CustomerKey>,
    ) -> S3Result<Self> {
        refuse_kms(sse, kms_key)?;
        let s3 = sse.is_some();
        if s3 && customer.is_some() {
            return Err(invalid(
                "SSE-C and x-amz-server-side-encryption exclude each other: send one of them",
            ));
        }
        map.remove(CUSTOMER_ENTRY);
        map.remove(S3_ENTRY);
        if s3 {
            map.insert(S3_ENTRY.into(), ALGORITHM.into());
        }
        let customer_md5 = customer.map(|c| {
            let (k, v) = c.entry();
            map.insert(k, v.unwrap_or_default());
            c.md5
        });
        Ok(Self { s3, customer_md5 })
    }

    /// `x-amz-server-side-encryption` of the answer.
    pub fn encryption(&self) -> Option<ServerSideEncryption> {
        self.s3.then(|| ServerSideEncryption::from_static(ServerSideEncryption::AES256))
    }

    /// `x-amz-server-side-encryption-customer-algorithm` of the answer.
    pub fn algorithm(&self) -> Option<String> {
        self.customer_md5.as_ref().map(|_| ALGORITHM.to_owned())
    }
}

/// Checks the key a read (or part upload, or copy source) carries against the object's
/// metadata `map`: an SSE-C object needs its key, another object none. Returns what to
/// report.
pub(super) fn check_read(
    map: &BTreeMap<String, String>,
    customer: Option<CustomerKey>,
) -> S3Result<Written> {
    let s3 = map.contains_key(S3_ENTRY);
    match (map.get(CUSTOMER_ENTRY), customer) {
        (None, None) => Ok(Written { s3, customer_md5: None }),
        (None, Some(_)) => Err(request(
            "this object was not written with an SSE-C key: leave out the \
             x-amz-server-side-encryption-customer-* headers",
        )),
        (Some(_), None) => Err(request(
            "this object was written with an SSE-C key: send it with every read \
             (x-amz-server-side-encryption-customer-algorithm, -key and -key-MD5)",
        )),
        (Some(stored), Some(c)) if c.opens(stored) => {
            Ok(Written { s3: false, customer_md5: Some(c.md5) })
        }
        (Some(_), Some(_)) => Err(S3Error::with_message(
            S3ErrorCode::InvalidRequest,
            "The SSE-C key provided is not the key this object was written with",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> (String, String) {
        let b64 = base64::engine::general_purpose::STANDARD;
        let k = [byte; 32];
        (b64.encode(k), b64.encode(md5::Md5::digest(k)))
    }

    fn customer(byte: u8) -> Option<CustomerKey> {
        let (k, m) = key(byte);
        CustomerKey::of(Some("AES256"), Some(&k), Some(&m)).unwrap()
    }

    #[test]
    fn a_customer_key_is_checked_kept_as_a_salted_digest_and_required_on_reads() {
        let mut map = BTreeMap::new();
        let w = Written::apply(&mut map, None, None, customer(1)).unwrap();
        let (k, m) = key(1);
        assert_eq!(w.customer_md5.as_deref(), Some(m.as_str()));
        let stored = map[CUSTOMER_ENTRY].clone();
        assert!(!stored.contains(&k) && !stored.contains(&hex::encode([1u8; 32])), "{stored}");
        assert!(check_read(&map, customer(1)).is_ok());
        assert_eq!(
            check_read(&map, customer(2)).err().unwrap().code(),
            &S3ErrorCode::InvalidRequest
        );
        assert!(check_read(&map, None).is_err());
        // Two writes with the same key keep different digests (salted).
        let mut again = BTreeMap::new();
        Written::apply(&mut again, None, None, customer(1)).unwrap();
        assert_ne!(again[CUSTOMER_ENTRY], stored);
        // An object without SSE-C refuses a key.
        assert!(check_read(&BTreeMap::new(), customer(1)).is_err());
    }

    #[test]
    fn bad_headers_and_kms_are_refused() {
        let (k, m) = key(3);
        for (a, k, m) in [
            (None, Some(k.as_str()), Some(m.as_str())),
            (Some("AES256"), None, Some(m.as_str())),
            (Some("AES256"), Some(k.as_str()), None),
            (Some("AES128"), Some(k.as_str()), Some(m.as_str())),
            (Some("AES256"), Some(k.as_str()), Some("AAAAAAAAAAAAAAAAAAAAAA==")),
            (Some("AES256"), Some("c2hvcnQ="), Some(m.as_str())),
        ] {
            assert!(CustomerKey::of(a, k, m).is_err(), "{a:?} {k:?} {m:?}");
        }
        let kms = ServerSideEncryption::from_static(ServerSideEncryption::AWS_KMS);
        assert!(refuse_kms(Some(&kms), None).is_err());
        assert!(refuse_kms(None, Some("key-1")).is_err());
        let s3 = ServerSideEncryption::from_static(ServerSideEncryption::AES256);
        assert!(refuse_kms(Some(&s3), None).is_ok());
        assert!(Written::apply(&mut BTreeMap::new(), Some(&s3), None, customer(4)).is_err());
    }
}
