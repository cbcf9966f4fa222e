//! Sealing of the gateway's *local* trusted state at rest: redo-log records and checkpoints.
//!
//! The data directory is trusted while the gateway runs, but its files hold what the store must
//! never see in the clear (the stash and cached buckets are user data; the position map is the
//! access pattern). They are sealed under a key of their own, derived from the master key, so a
//! passphrase-protected key file protects the whole data directory at rest, and a file copied
//! from another gateway or altered on disk fails to open.
//!
//! ```text
//! prk    = HKDF-Extract(salt = "blindfold-state-v1", ikm = master key)     [SHA-256]
//! key    = HKDF-Expand(prk, info = "blindfold/state/v1", 32 bytes)
//! sealed = nonce (12 random bytes) || AES-256-GCM(key, nonce, aad, plaintext) || tag (16)
//! ```
//!
//! The caller's `aad` names what the bytes are (a file kind and, for log records, their
//! sequence number), so a record cannot be passed off as a checkpoint or moved in the log.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use crate::seal::HkdfLen;
use crate::{CryptoError, MasterKey};

const SALT: &[u8] = b"blindfold-state-v1";
const INFO: &[u8] = b"blindfold/state/v1";
const TAG_LEN: usize = 16;

/// Seals local trusted-state files (see the module documentation). Random nonces: one key
/// seals one record per commit and one file per checkpoint, far below the 2^32 bound.
pub struct StateSealer {
    key: LessSafeKey,
    rng: SystemRandom,
    /// The state key of a master key being retired by a key rotation: what does not open
    /// under `key` is tried under it. Nothing is sealed under it.
    previous: Option<LessSafeKey>,
}

impl std::fmt::Debug for StateSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateSealer(<redacted>)")
    }
}

impl StateSealer {
    /// Bytes that sealing adds: 12-byte nonce and 16-byte tag.
    pub const OVERHEAD: usize = NONCE_LEN + TAG_LEN;
    /// Bytes of the nonce that starts a sealed record ([`StateSealer::seal_into`]).
    pub const NONCE_LEN: usize = NONCE_LEN;

    /// The state sealer of `master`.
    pub fn new(master: &MasterKey) -> Self {
        Self { key: state_key(master), rng: SystemRandom::new(), previous: None }
    }

    /// Also opens what was sealed under `previous`, the master key a key rotation is
    /// retiring; seals stay under the current master.
    #[must_use]
    pub fn with_previous_key(mut self, previous: &MasterKey) -> Self {
        self.previous = Some(state_key(previous));
        self
    }

    /// As [`StateSealer::new`], plus [`StateSealer::with_previous_key`] when `previous` is
    /// given.
    pub fn with_keys(master: &MasterKey, previous: Option<&MasterKey>) -> Self {
        let s = Self::new(master);
        match previous {
            Some(p) => s.with_previous_key(p),
            None => s,
        }
    }
}

fn state_key(master: &MasterKey) -> LessSafeKey {
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, SALT).extract(master.expose_bytes());
    let mut bytes = Zeroizing::new([0u8; 32]);
    prk.expand(&[INFO], HkdfLen(32))
        .and_then(|okm| okm.fill(&mut bytes[..]))
        .expect("HKDF-SHA256 can expand to 32 bytes");
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &bytes[..]).expect("a 32-byte AES-256 key"))
}

impl StateSealer {
    /// Seals `plaintext`, bound to `aad`.
    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let mut out = Vec::with_capacity(plaintext.len() + Self::OVERHEAD);
        out.extend_from_slice(&[0u8; NONCE_LEN]);
        out.extend_from_slice(plaintext);
        self.seal_into(aad, &mut out, 0)?;
        Ok(out)
    }

    /// Seals in place what `buf` holds after `start + NONCE_LEN` bytes, bound to `aad`: the
    /// nonce goes into `buf[start .. start + NONCE_LEN]` (whatever was there is overwritten)
    /// and the tag is appended, so `buf[start..]` becomes what [`StateSealer::seal`] returns
    /// for that plaintext. For large records serialized straight into their frame: no copy.
    pub fn seal_into(
        &self,
        aad: &[u8],
        buf: &mut Vec<u8>,
        start: usize,
    ) -> Result<(), CryptoError> {
        if buf.len() < start + NONCE_LEN {
            return Err(CryptoError::Malformed("no room for the nonce".into()));
        }
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| CryptoError::Rng)?;
        buf[start..start + NONCE_LEN].copy_from_slice(&nonce);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut buf[start + NONCE_LEN..],
            )
            .map_err(|_| CryptoError::Malformed("plaintext too long for AES-GCM".into()))?;
        buf.extend_from_slice(tag.as_ref());
        Ok(())
    }

    /// Opens what [`StateSealer::seal`] returned for the same `aad`. Any change, another key or
    /// another `aad` fails with [`CryptoError::Malformed`] naming no secret.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
        if sealed.len() < Self::OVERHEAD {
            return Err(CryptoError::Malformed(format!(
                "sealed state of {} bytes is shorter than its {}-byte overhead",
                sealed.len(),
                Self::OVERHEAD
            )));
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce: [u8; NONCE_LEN] = nonce.try_into().expect("12-byte nonce");
        let mut body = body.to_vec();
        let mut opened = self
            .key
            .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body)
            .map(|p| p.len());
        if let (Err(_), Some(previous)) = (&opened, &self.previous) {
            body.copy_from_slice(&sealed[NONCE_LEN..]);
            opened = previous
                .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::from(aad), &mut body)
                .map(|p| p.len());
        }
        let plain = opened.map_err(|_| {
            CryptoError::Malformed(
                "sealed state does not authenticate (damaged, or sealed with another key)".into(),
            )
        })?;
        body.truncate(plain);
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_binding() {
        let key = MasterKey::generate();
        let s = StateSealer::new(&key);
        let sealed = s.seal(b"ckpt", b"position map").unwrap();
        assert_eq!(sealed.len(), 12 + StateSealer::OVERHEAD);
        assert_eq!(s.open(b"ckpt", &sealed).unwrap(), b"position map");
        assert!(s.open(b"redo", &sealed).is_err(), "aad is bound");
        let other = StateSealer::new(&MasterKey::generate());
        assert!(other.open(b"ckpt", &sealed).is_err(), "another key fails");
        for i in 0..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert!(s.open(b"ckpt", &bad).is_err(), "flip at {i} detected");
        }
        assert!(s.open(b"ckpt", &sealed[..10]).is_err());
        assert!(!sealed.windows(8).any(|w| w == b"position"), "no plaintext in the output");
    }

    #[test]
    fn sealing_in_place_gives_what_seal_gives() {
        let key = MasterKey::generate();
        let s = StateSealer::new(&key);
        let mut buf = b"header--".to_vec();
        buf.extend_from_slice(&[0xAA; NONCE_LEN]);
        buf.extend_from_slice(b"redo record");
        s.seal_into(b"redo", &mut buf, 8).unwrap();
        assert_eq!(&buf[..8], b"header--", "what precedes `start` is left alone");
        assert_eq!(buf.len(), 8 + 11 + StateSealer::OVERHEAD);
        assert_eq!(s.open(b"redo", &buf[8..]).unwrap(), b"redo record");
        assert!(s.open(b"ckpt", &buf[8..]).is_err(), "aad is bound");
        assert_ne!(&buf[8..8 + NONCE_LEN], &[0xAA; NONCE_LEN], "a fresh nonce");
        assert!(s.seal_into(b"redo", &mut vec![0u8; 11], 0).is_err(), "no room for a nonce");
    }

    #[test]
    fn a_retiring_key_still_opens_but_never_seals() {
        let (old, new) = (MasterKey::generate(), MasterKey::generate());
        let before = StateSealer::new(&old).seal(b"ckpt", b"stash").unwrap();
        let rotating = StateSealer::with_keys(&new, Some(&old));
        assert_eq!(rotating.open(b"ckpt", &before).unwrap(), b"stash");
        let after = rotating.seal(b"ckpt", b"stash").unwrap();
        assert_eq!(StateSealer::new(&new).open(b"ckpt", &after).unwrap(), b"stash");
        assert!(StateSealer::new(&old).open(b"ckpt", &after).is_err(), "sealed under the new key");
        assert!(StateSealer::new(&new).open(b"ckpt", &before).is_err());
        let mut bad = before.clone();
        bad[20] ^= 1;
        assert!(rotating.open(b"ckpt", &bad).is_err(), "tampering fails under both keys");
        assert!(rotating.open(b"redo", &before).is_err(), "aad still bound");
    }
}
