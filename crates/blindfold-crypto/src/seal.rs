//! AES-256-GCM sealing of cell segments, bound to store, cell, version and segment.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{PoisonError, RwLock};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use zeroize::Zeroizing;

use crate::{CryptoError, MasterKey, StoreId};

/// Domain-separation prefix of every cell's associated data.
pub(crate) const CELL_AD_PREFIX: &[u8; 17] = b"blindfold-cell-v1";
/// HKDF `info` prefix of every epoch key (the epoch, `u32` LE, follows).
pub(crate) const SEAL_INFO_PREFIX: &[u8; 17] = b"blindfold/seal/v1";

const EPOCH_LEN: usize = 4;
const HEADER_LEN: usize = EPOCH_LEN + NONCE_LEN;
const TAG_LEN: usize = 16;
const AD_LEN: usize = CELL_AD_PREFIX.len() + 16 + 8 + 8 + 4;
const KEY_LEN: usize = 32;

/// Default for [`CellSealer::with_rotation_limit`].
const DEFAULT_SEALS_PER_EPOCH: u64 = 1 << 31;
/// Upper bound for [`CellSealer::with_rotation_limit`]: NIST SP 800-38D §8.3 allows at most
/// 2^32 invocations of one GCM key with random 96-bit nonces.
const MAX_SEALS_PER_EPOCH: u64 = 1 << 32;
/// Epoch keys kept in memory; the cache never grows past this, whatever epochs a store shows us.
const MAX_CACHED_KEYS: usize = 16;

/// What one sealed cell segment is bound to: its address, its version and its segment index.
///
/// Opening a segment with any other `CellAd` than the one it was sealed with fails with
/// [`CryptoError::Integrity`]; that is how swaps (other `cell` or `segment`) and rollbacks
/// (other `version`) are caught. The caller keeps the trusted version of each cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CellAd {
    /// The physical cell address in the store.
    pub cell: u64,
    /// The cell's write counter, kept by the trusted side; must change on every rewrite.
    pub version: u64,
    /// The index of this segment within the cell (0 for single-segment cells).
    pub segment: u32,
}

/// An `hkdf::KeyType` for an arbitrary output length (ring only ships fixed-length ones).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HkdfLen(pub(crate) usize);

impl hkdf::KeyType for HkdfLen {
    fn len(&self) -> usize {
        self.0
    }
}

/// The AES-256-GCM key bytes of `epoch`: HKDF-Expand(prk, "blindfold/seal/v1" || epoch LE, 32),
/// where `prk` = HKDF-Extract(salt = store id, ikm = master key).
pub(crate) fn epoch_key_bytes(prk: &hkdf::Prk, epoch: u32) -> Zeroizing<[u8; KEY_LEN]> {
    let epoch_le = epoch.to_le_bytes();
    let info = [&SEAL_INFO_PREFIX[..], &epoch_le[..]];
    let mut key = Zeroizing::new([0u8; KEY_LEN]);
    prk.expand(&info, HkdfLen(KEY_LEN))
        .and_then(|okm| okm.fill(&mut key[..]))
        // Only fails for outputs longer than 255 hash lengths; 32 bytes never is.
        .expect("HKDF-SHA256 can expand to 32 bytes");
    key
}

/// The associated data of one segment:
/// `"blindfold-cell-v1" || store id || cell u64 LE || version u64 LE || segment u32 LE`.
pub(crate) fn cell_ad_bytes(store: &StoreId, ad: &CellAd) -> [u8; AD_LEN] {
    let mut out = [0u8; AD_LEN];
    let parts: [&[u8]; 5] = [
        CELL_AD_PREFIX,
        &store.0,
        &ad.cell.to_le_bytes(),
        &ad.version.to_le_bytes(),
        &ad.segment.to_le_bytes(),
    ];
    let mut at = 0;
    for part in parts {
        out[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    debug_assert_eq!(at, AD_LEN);
    out
}

/// Seals and opens cell segments with AES-256-GCM.
///
/// A sealed segment is `epoch: u32 LE | nonce: 12 bytes | ciphertext | tag: 16 bytes`, i.e.
/// [`CellSealer::OVERHEAD`] bytes longer than the plaintext. The key of each epoch is derived
/// from the master key with HKDF-SHA256 (salt = store id, info = `"blindfold/seal/v1"` ||
/// epoch LE) and the associated data binds the segment to its store, cell, version and segment
/// index (see the [crate docs](crate) for the exact bytes).
///
/// The sealer is `Send + Sync`; all methods take `&self`, so one sealer can be shared by every
/// worker thread (e.g. behind an `Arc`).
///
/// # Security
///
/// - Tampering, swapping (other cell or segment), rollback (other version), moving a cell to
///   another store, and claiming a key epoch the sealer has not reached all fail with
///   [`CryptoError::Integrity`]; wrong data is never returned.
/// - Nonces are 96 random bits from the operating system. That is safe while one key seals far
///   fewer than 2^32 segments, so the sealer counts its seals and, after
///   [`with_rotation_limit`](Self::with_rotation_limit) of them (default 2^31), moves on to the
///   next epoch, i.e. a fresh key. Counts start from zero in every process, so callers must
///   also start every process at a fresh epoch: persist an epoch larger than any this sealer
///   reached ([`current_epoch`](Self::current_epoch) + 1) and reserve it *before* sealing
///   anything, e.g. by storing `last + 1` at start-up and again whenever `current_epoch`
///   moves past it.
/// - Older epochs stay readable (cells written long ago keep their epoch); only the keys of at
///   most 16 epochs are cached, others are re-derived on each open.
/// - `Debug` shows the store id and the epoch, never key material. The derived AES keys live in
///   `ring` key schedules, which are not wiped on drop; the master key itself is not retained.
pub struct CellSealer {
    store: StoreId,
    /// HKDF-Extract(store id, master key); every epoch key is expanded from it.
    prk: hkdf::Prk,
    base_epoch: u32,
    seals_per_epoch: u64,
    /// Seals reserved so far; seal number `n` uses epoch `base_epoch + n / seals_per_epoch`.
    seals: AtomicU64,
    keys: RwLock<BTreeMap<u32, LessSafeKey>>,
    /// The master key being retired during a key rotation, as its own key chain: segments
    /// that do not open under the current master are tried under it.
    previous: Option<Box<CellSealer>>,
}

impl CellSealer {
    /// Bytes a sealed segment adds to its plaintext: 4-byte key epoch + 12-byte nonce + 16-byte
    /// tag.
    pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;

    /// Bytes of a sealed segment before its ciphertext: the room
    /// [`seal_vec`](Self::seal_vec) expects before the plaintext.
    pub const HEADER: usize = HEADER_LEN;

    /// A sealer for `store`, sealing under `epoch` (and later epochs, see
    /// [`with_rotation_limit`](Self::with_rotation_limit)).
    ///
    /// # Security
    ///
    /// Pass an epoch that no earlier process sealed with; see the type's `# Security` section.
    pub fn new(master: &MasterKey, store: StoreId, epoch: u32) -> Self {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &store.0).extract(master.expose_bytes());
        let first_key = make_key(&prk, epoch);
        Self {
            store,
            prk,
            base_epoch: epoch,
            seals_per_epoch: DEFAULT_SEALS_PER_EPOCH,
            seals: AtomicU64::new(0),
            keys: RwLock::new(BTreeMap::from([(epoch, first_key)])),
            previous: None,
        }
    }

    /// Also opens segments sealed under `previous`, the master key a key rotation is retiring
    /// (for any epoch up to the current one); seals stay under the current master.
    ///
    /// # Security
    ///
    /// A segment now authenticates under either key, so a forgery has two keys to hit instead
    /// of one: negligible, and only until the rotation ends and the sealer is made without it.
    /// Opening an old segment costs one extra copy and a failed authentication first.
    #[must_use]
    pub fn with_previous_key(mut self, previous: &MasterKey) -> Self {
        self.previous = Some(Box::new(Self::new(previous, self.store, 0)));
        self
    }

    /// Whether segments sealed under a retiring master key are opened too.
    pub fn has_previous_key(&self) -> bool {
        self.previous.is_some()
    }

    /// Moves to the next epoch after every `seals_per_epoch` seals (default 2^31).
    ///
    /// Values are clamped to `1..=2^32`: 2^32 is the most that NIST SP 800-38D allows one GCM
    /// key with random nonces. Small values are for tests.
    #[must_use]
    pub fn with_rotation_limit(mut self, seals_per_epoch: u64) -> Self {
        self.seals_per_epoch = seals_per_epoch.clamp(1, MAX_SEALS_PER_EPOCH);
        self
    }

    /// The store this sealer seals for.
    pub fn store_id(&self) -> StoreId {
        self.store
    }

    /// The epoch the next seal will use (saturating at `u32::MAX`).
    ///
    /// Segments claiming a later epoch are refused by [`open`](Self::open).
    pub fn current_epoch(&self) -> u32 {
        self.epoch_of_seal(self.seals.load(Ordering::Relaxed)).unwrap_or(u32::MAX)
    }

    /// Seals `plaintext` for `ad` into `out`, writing `epoch | nonce | ciphertext | tag`.
    ///
    /// # Errors
    ///
    /// - [`CryptoError::Malformed`] unless `out.len() == plaintext.len() + OVERHEAD`, or if the
    ///   plaintext is longer than AES-GCM allows (about 64 GiB).
    /// - [`CryptoError::Rng`] if the random number generator fails.
    /// - [`CryptoError::EpochsExhausted`] after the last epoch's seals are used up.
    pub fn seal_into(
        &self,
        ad: &CellAd,
        plaintext: &[u8],
        out: &mut [u8],
    ) -> Result<(), CryptoError> {
        let expected = plaintext.len().checked_add(Self::OVERHEAD);
        if expected != Some(out.len()) {
            return Err(CryptoError::Malformed(format!(
                "seal_into: output buffer is {} bytes, but a {}-byte plaintext seals to {} bytes",
                out.len(),
                plaintext.len(),
                plaintext.len().saturating_add(Self::OVERHEAD),
            )));
        }
        let (epoch, nonce) = self.next_seal()?;
        self.seal_with_nonce(epoch, nonce, ad, plaintext, out)
    }

    /// The epoch and a fresh nonce for the next seal.
    fn next_seal(&self) -> Result<(u32, [u8; NONCE_LEN]), CryptoError> {
        let seal_number = self.seals.fetch_add(1, Ordering::Relaxed);
        let epoch = self.epoch_of_seal(seal_number).ok_or(CryptoError::EpochsExhausted)?;
        // Nonces come from rand's thread-local CSPRNG (ChaCha, seeded from the operating system
        // and reseeded periodically): as unpredictable as a system call per nonce, without the
        // system call on every seal.
        let mut nonce = [0u8; NONCE_LEN];
        rand::RngCore::try_fill_bytes(&mut rand::thread_rng(), &mut nonce)
            .map_err(|_| CryptoError::Rng)?;
        Ok((epoch, nonce))
    }

    /// Seals in place the plaintext `buf` holds after its first [`HEADER`](Self::HEADER)
    /// bytes (whatever those hold): writes the header there, encrypts the rest and appends the
    /// tag, so that `buf` becomes the sealed segment that [`seal_into`](Self::seal_into) would
    /// have written. A caller that builds its plaintext in such a buffer, with room for the tag
    /// (capacity `plaintext + OVERHEAD`), saves the zeroed output buffer and the copy of the
    /// plaintext into it.
    ///
    /// # Errors
    ///
    /// - [`CryptoError::Malformed`] if `buf` is shorter than the header, or the plaintext is
    ///   longer than AES-GCM allows; `buf` is left as it was.
    /// - [`CryptoError::Rng`], [`CryptoError::EpochsExhausted`]: as
    ///   [`seal_into`](Self::seal_into), `buf` left as it was.
    pub fn seal_vec(&self, ad: &CellAd, buf: &mut Vec<u8>) -> Result<(), CryptoError> {
        if buf.len() < HEADER_LEN {
            return Err(CryptoError::Malformed(format!(
                "seal_vec: a {}-byte buffer has no room for the {HEADER_LEN}-byte header",
                buf.len()
            )));
        }
        let (epoch, nonce) = self.next_seal()?;
        self.seal_vec_with_nonce(epoch, nonce, ad, buf)
    }

    /// [`seal_vec`](Self::seal_vec) with the given epoch and nonce; `buf` holds the header.
    fn seal_vec_with_nonce(
        &self,
        epoch: u32,
        nonce: [u8; NONCE_LEN],
        ad: &CellAd,
        buf: &mut Vec<u8>,
    ) -> Result<(), CryptoError> {
        let (header, body) = buf.split_at_mut(HEADER_LEN);
        let tag = self.seal_body(epoch, nonce, ad, header, body)?;
        buf.extend_from_slice(&tag);
        Ok(())
    }

    /// Seals `plaintext` for `ad` into a new buffer of `plaintext.len() + OVERHEAD` bytes.
    ///
    /// # Errors
    ///
    /// As [`seal_into`](Self::seal_into).
    pub fn seal(&self, ad: &CellAd, plaintext: &[u8]) -> Result<Vec<u8>, CryptoError> {
        let len = plaintext
            .len()
            .checked_add(Self::OVERHEAD)
            .ok_or_else(|| CryptoError::Malformed("plaintext too long to seal".to_owned()))?;
        let mut out = vec![0u8; len];
        self.seal_into(ad, plaintext, &mut out)?;
        Ok(out)
    }

    /// Authenticates and decrypts `sealed` in place; returns the plaintext, which is the slice
    /// `sealed[16..sealed.len() - 16]`.
    ///
    /// # Errors
    ///
    /// - [`CryptoError::Malformed`] if `sealed` is shorter than [`OVERHEAD`](Self::OVERHEAD).
    /// - [`CryptoError::Integrity`] if authentication fails for any reason (see the type's
    ///   `# Security` section). The decrypted region of `sealed` is then zeroed, so no
    ///   unauthenticated plaintext is left behind.
    pub fn open_in_place<'a>(
        &self,
        ad: &CellAd,
        sealed: &'a mut [u8],
    ) -> Result<&'a mut [u8], CryptoError> {
        check_len(sealed.len())?;
        let (header, body) = sealed.split_at_mut(HEADER_LEN);
        let header: &[u8; HEADER_LEN] = (&*header).try_into().expect("split at HEADER_LEN");
        self.open_body(ad, header, body)
    }

    /// Authenticates and decrypts `sealed` into a new buffer.
    ///
    /// # Errors
    ///
    /// As [`open_in_place`](Self::open_in_place).
    pub fn open(&self, ad: &CellAd, sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
        check_len(sealed.len())?;
        let header: &[u8; HEADER_LEN] = sealed[..HEADER_LEN].try_into().expect("length checked");
        let mut body = sealed[HEADER_LEN..].to_vec();
        let plaintext_len = self.open_body(ad, header, &mut body)?.len();
        body.truncate(plaintext_len);
        Ok(body)
    }

    /// The epoch of the `seal_number`-th seal, or `None` past `u32::MAX`.
    fn epoch_of_seal(&self, seal_number: u64) -> Option<u32> {
        let epoch = u64::from(self.base_epoch) + seal_number / self.seals_per_epoch;
        u32::try_from(epoch).ok()
    }

    /// Writes one sealed segment with the given epoch and nonce; `out` has the right length.
    fn seal_with_nonce(
        &self,
        epoch: u32,
        nonce: [u8; NONCE_LEN],
        ad: &CellAd,
        plaintext: &[u8],
        out: &mut [u8],
    ) -> Result<(), CryptoError> {
        let (header, rest) = out.split_at_mut(HEADER_LEN);
        let (body, tag_out) = rest.split_at_mut(plaintext.len());
        body.copy_from_slice(plaintext);
        let tag = self.seal_body(epoch, nonce, ad, header, body)?;
        tag_out.copy_from_slice(&tag);
        Ok(())
    }

    /// Writes `epoch | nonce` into `header` and encrypts `body` in place; returns the tag.
    fn seal_body(
        &self,
        epoch: u32,
        nonce: [u8; NONCE_LEN],
        ad: &CellAd,
        header: &mut [u8],
        body: &mut [u8],
    ) -> Result<[u8; TAG_LEN], CryptoError> {
        let len = body.len();
        let aad = cell_ad_bytes(&self.store, ad);
        let tag = self
            .with_key(epoch, |key| {
                key.seal_in_place_separate_tag(
                    Nonce::assume_unique_for_key(nonce),
                    Aad::from(&aad[..]),
                    body,
                )
            })
            .map_err(|_| {
                CryptoError::Malformed(format!("a {len}-byte plaintext is too long for AES-GCM"))
            })?;
        header[..EPOCH_LEN].copy_from_slice(&epoch.to_le_bytes());
        header[EPOCH_LEN..].copy_from_slice(&nonce);
        Ok(tag.as_ref().try_into().expect("a 16-byte tag"))
    }

    /// Opens `body` (= ciphertext || tag) whose header is `header` (= epoch || nonce).
    fn open_body<'a>(
        &self,
        ad: &CellAd,
        header: &[u8; HEADER_LEN],
        body: &'a mut [u8],
    ) -> Result<&'a mut [u8], CryptoError> {
        let integrity = CryptoError::Integrity { cell: ad.cell, segment: ad.segment };
        let (epoch, nonce) = header.split_at(EPOCH_LEN);
        let epoch = u32::from_le_bytes(epoch.try_into().expect("4-byte epoch"));
        // A store must not make us derive and use keys of epochs we have not reached: a
        // future key may not have been "spent" yet, and no honest segment can carry it.
        if epoch > self.current_epoch() {
            return Err(integrity);
        }
        let aad = cell_ad_bytes(&self.store, ad);
        let Some(previous) = &self.previous else {
            let nonce = Nonce::try_assume_unique_for_key(nonce).expect("12-byte nonce");
            // On failure ring zeroes the decrypted region before returning.
            return self
                .with_key(epoch, |key| key.open_in_place(nonce, Aad::from(&aad[..]), body))
                .map_err(|_| integrity);
        };
        // A failed attempt zeroes the region, so the retiring key gets a copy.
        let copy = Zeroizing::new(body.to_vec());
        let nonce = Nonce::try_assume_unique_for_key(nonce).expect("12-byte nonce");
        let mut opened = self.with_key(epoch, |key| {
            key.open_in_place(nonce, Aad::from(&aad[..]), &mut *body).map(|p| p.len())
        });
        if opened.is_err() {
            body.copy_from_slice(&copy);
            let nonce = Nonce::try_assume_unique_for_key(nonce_of(header)).expect("12-byte nonce");
            opened = previous.with_key(epoch, |key| {
                key.open_in_place(nonce, Aad::from(&aad[..]), &mut *body).map(|p| p.len())
            });
        }
        let len = opened.map_err(|_| integrity)?;
        Ok(&mut body[..len])
    }

    /// Runs `f` with the key of `epoch`, deriving and caching it if needed.
    fn with_key<R>(&self, epoch: u32, f: impl FnOnce(&LessSafeKey) -> R) -> R {
        {
            let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(key) = keys.get(&epoch) {
                return f(key);
            }
        }
        let key = make_key(&self.prk, epoch);
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        if keys.len() >= MAX_CACHED_KEYS && !keys.contains_key(&epoch) {
            // Evict the oldest epoch, but only for a newer one: the epochs we seal with only
            // grow, so the current key always stays cached, while a store replaying many old
            // epochs cannot push newer keys out.
            match keys.first_key_value() {
                Some((&oldest, _)) if oldest < epoch => {
                    keys.remove(&oldest);
                }
                _ => {
                    drop(keys);
                    return f(&key);
                }
            }
        }
        f(keys.entry(epoch).or_insert(key))
    }
}

impl fmt::Debug for CellSealer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CellSealer")
            .field("store", &self.store)
            .field("current_epoch", &self.current_epoch())
            .field("seals_per_epoch", &self.seals_per_epoch)
            .field("keys", &"<redacted>")
            .finish()
    }
}

/// The nonce bytes of a segment header.
fn nonce_of(header: &[u8; HEADER_LEN]) -> &[u8] {
    &header[EPOCH_LEN..]
}

fn check_len(len: usize) -> Result<(), CryptoError> {
    if len < CellSealer::OVERHEAD {
        return Err(CryptoError::Malformed(format!(
            "a sealed segment is at least {} bytes, got {len}",
            CellSealer::OVERHEAD
        )));
    }
    Ok(())
}

/// The AES-256-GCM key of `epoch`.
fn make_key(prk: &hkdf::Prk, epoch: u32) -> LessSafeKey {
    let bytes = epoch_key_bytes(prk, epoch);
    let unbound = UnboundKey::new(&AES_256_GCM, &bytes[..]).expect("32-byte AES-256 key");
    LessSafeKey::new(unbound)
}

/// Seals `plaintext` with AES-256-GCM under a raw key: returns `nonce || ciphertext || tag`.
/// Used for wrapping the master key in key files.
pub(crate) fn seal_raw(
    key: &[u8; KEY_LEN],
    nonce: [u8; NONCE_LEN],
    aad: &[u8],
    plaintext: &[u8],
) -> Vec<u8> {
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("32-byte AES-256 key"));
    let mut out = Vec::with_capacity(NONCE_LEN + plaintext.len() + TAG_LEN);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(plaintext);
    let tag = key
        .seal_in_place_separate_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(aad),
            &mut out[NONCE_LEN..],
        )
        .expect("small plaintexts always seal");
    out.extend_from_slice(tag.as_ref());
    out
}

/// Opens `nonce || ciphertext || tag` from [`seal_raw`] into `out` (which must be exactly the
/// plaintext length); `Err(())` on any authentication failure.
pub(crate) fn open_raw(
    key: &[u8; KEY_LEN],
    aad: &[u8],
    sealed: &[u8],
    out: &mut [u8],
) -> Result<(), ()> {
    if sealed.len() != NONCE_LEN + out.len() + TAG_LEN {
        return Err(());
    }
    let key = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("32-byte AES-256 key"));
    let (nonce, ct_tag) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| ())?;
    let mut buf = Zeroizing::new(ct_tag.to_vec());
    let plaintext = key.open_in_place(nonce, Aad::from(aad), &mut buf[..]).map_err(|_| ())?;
    out.copy_from_slice(plaintext);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master() -> MasterKey {
        MasterKey::from_bytes(core::array::from_fn(|i| i as u8)) // 00 01 .. 1f
    }

    fn store() -> StoreId {
        StoreId(core::array::from_fn(|i| 0xa0 + i as u8)) // a0 a1 .. af
    }

    /// Known answer for our key schedule.
    ///
    /// Expected value computed independently with Python's standard library:
    ///
    /// ```text
    /// python3 -c 'import hmac,hashlib,struct
    /// prk=hmac.new(bytes(range(0xa0,0xb0)),bytes(range(32)),hashlib.sha256).digest()
    /// info=b"blindfold/seal/v1"+struct.pack("<I",7)
    /// print(hmac.new(prk,info+b"\x01",hashlib.sha256).hexdigest())'
    /// ```
    #[test]
    fn a_retiring_master_key_still_opens_but_never_seals() {
        let old = master();
        let new = MasterKey::from_bytes([0x55; 32]);
        let ad = CellAd { cell: 3, version: 2, segment: 0 };
        let before = CellSealer::new(&old, store(), 4).seal(&ad, b"bucket").unwrap();
        let rotating = CellSealer::new(&new, store(), 5).with_previous_key(&old);
        assert!(rotating.has_previous_key());
        assert_eq!(rotating.open(&ad, &before).unwrap(), b"bucket");
        let mut in_place = before.clone();
        assert_eq!(rotating.open_in_place(&ad, &mut in_place).unwrap(), b"bucket");
        let after = rotating.seal(&ad, b"bucket").unwrap();
        assert_eq!(CellSealer::new(&new, store(), 5).open(&ad, &after).unwrap(), b"bucket");
        assert!(CellSealer::new(&old, store(), 5).open(&ad, &after).is_err());
        assert!(CellSealer::new(&new, store(), 5).open(&ad, &before).is_err());
        // Binding and tampering still fail under both keys.
        let other = CellAd { version: 1, ..ad };
        assert!(rotating.open(&other, &before).is_err(), "rollback detected");
        let mut bad = before.clone();
        bad[20] ^= 1;
        assert!(rotating.open(&ad, &bad).is_err(), "tampering detected");
    }

    #[test]
    fn epoch_key_known_answer() {
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &store().0).extract(master().expose_bytes());
        assert_eq!(
            hex::encode(*epoch_key_bytes(&prk, 7)),
            "a3e8f0c4b2aae8e6f37597badd30ee9e3cc1e743bafb5f85314ab1d9b6093a11"
        );
        assert_ne!(*epoch_key_bytes(&prk, 7), *epoch_key_bytes(&prk, 8));
    }

    #[test]
    fn cell_ad_known_answer() {
        let ad = CellAd { cell: 0x0102_0304_0506_0708, version: 42, segment: 3 };
        assert_eq!(
            hex::encode(cell_ad_bytes(&store(), &ad)),
            concat!(
                "626c696e64666f6c642d63656c6c2d7631", // "blindfold-cell-v1"
                "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf",   // store id
                "0807060504030201",                   // cell
                "2a00000000000000",                   // version
                "03000000",                           // segment
            )
        );
    }

    /// Known answer for a whole sealed segment with a fixed nonce.
    ///
    /// Expected bytes computed independently with Python (`cryptography` 48 for AES-GCM, the
    /// HKDF above for the key): `struct.pack("<I",7) + nonce +
    /// AESGCM(key).encrypt(nonce, b"blindfold known-answer test", ad)` with
    /// nonce = 10 11 .. 1b and `ad` as in `cell_ad_known_answer`.
    #[test]
    fn sealed_segment_known_answer() {
        let sealer = CellSealer::new(&master(), store(), 7);
        let ad = CellAd { cell: 0x0102_0304_0506_0708, version: 42, segment: 3 };
        let plaintext = b"blindfold known-answer test";
        let mut out = vec![0u8; plaintext.len() + CellSealer::OVERHEAD];
        let nonce = core::array::from_fn(|i| 0x10 + i as u8);
        sealer.seal_with_nonce(7, nonce, &ad, plaintext, &mut out).unwrap();
        assert_eq!(
            hex::encode(&out),
            concat!(
                "07000000",
                "101112131415161718191a1b",
                "1fc1a662f3c5e54f0b7bc70a85f39f4534424001fa6d2cd6e76c26",
                "92140c6e4f2da0685bf48da51e3c50ec",
            )
        );
        assert_eq!(sealer.open(&ad, &out).unwrap(), plaintext);

        // Sealed in place, after a header's room holding anything, the same segment.
        let mut buf = vec![0xee; CellSealer::HEADER];
        buf.extend_from_slice(plaintext);
        sealer.seal_vec_with_nonce(7, nonce, &ad, &mut buf).unwrap();
        assert_eq!(buf, out);
    }

    #[test]
    fn sealing_in_place_opens_and_refuses_a_buffer_without_a_header() {
        let sealer = CellSealer::new(&master(), store(), 3);
        let ad = CellAd { cell: 9, version: 2, segment: 0 };
        for len in [0, 1, 4096] {
            let plaintext: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut buf = Vec::with_capacity(len + CellSealer::OVERHEAD);
            buf.resize(CellSealer::HEADER, 0);
            buf.extend_from_slice(&plaintext);
            sealer.seal_vec(&ad, &mut buf).unwrap();
            assert_eq!(buf.len(), len + CellSealer::OVERHEAD, "{len} bytes");
            assert_eq!(sealer.open(&ad, &buf).unwrap(), plaintext, "{len} bytes");
            let other = CellAd { version: 3, ..ad };
            assert!(sealer.open(&other, &buf).is_err(), "bound to its version");
        }
        let mut short = vec![0u8; CellSealer::HEADER - 1];
        assert!(matches!(sealer.seal_vec(&ad, &mut short), Err(CryptoError::Malformed(_))));
        assert_eq!(short, vec![0u8; CellSealer::HEADER - 1], "left as it was");
    }

    #[test]
    fn key_cache_is_bounded_and_keeps_newest() {
        let sealer = CellSealer::new(&master(), store(), 100);
        let ad = CellAd { cell: 1, version: 1, segment: 0 };
        let mut sealed = sealer.seal(&ad, b"x").unwrap();
        // Opening segments that claim many old epochs (as a hostile store could make us do)
        // must neither grow the cache past its bound nor evict the current epoch's key.
        for epoch in 0..100u32 {
            sealed[..4].copy_from_slice(&epoch.to_le_bytes());
            assert!(sealer.open(&ad, &sealed).is_err());
        }
        let keys = sealer.keys.read().unwrap();
        assert!(keys.len() <= MAX_CACHED_KEYS, "{} keys cached", keys.len());
        assert!(keys.contains_key(&100));
    }

    #[test]
    fn sealer_debug_shows_no_key_material() {
        let sealer = CellSealer::new(&master(), store(), 7);
        let shown = format!("{sealer:?} {sealer:#?}");
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &store().0).extract(master().expose_bytes());
        let epoch_key = hex::encode(*epoch_key_bytes(&prk, 7));
        assert!(!shown.contains(&epoch_key[..8]), "{shown}");
        assert!(!shown.contains("0001020304"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
