//! [`TeeCipher`]: the double encryption of cells and the sealing of tickets and answers.

use std::fmt;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::Zeroizing;

use crate::sha::{xor_piece, Midstate, Tail};
use crate::ticket::{EvictTicket, QueryTicket};
use crate::{TeeError, TeeKey};

/// Length of a piece of the outer layer; piece 0 of a cell is its random vector `r`.
pub const PIECE: usize = 32;
/// Length of an AES-GCM tag.
pub const TAG_LEN: usize = 16;

/// HKDF-Expand labels of the three keys derived from the [`TeeKey`].
const GCM_KEY_INFO: &[u8] = b"blindfold tee gcm v1";
const XOR_KEY_INFO: &[u8] = b"blindfold tee xor v1";
const MSG_KEY_INFO: &[u8] = b"blindfold tee msg v1";

/// Associated data of the sealed messages, one label per kind so that no message can be
/// accepted as another kind.
pub(crate) const QUERY_TICKET_AD: &[u8] = b"blindfold-tee query ticket v1";
pub(crate) const EVICT_TICKET_AD: &[u8] = b"blindfold-tee evict ticket v1";
pub(crate) const ANSWER_AD: &[u8] = b"blindfold-tee answer v1";

/// Largest block size a [`TeeCipher`] accepts (piece numbers must fit the `u32` of the
/// keystream; 64 MiB is far beyond any block the engine uses).
pub const MAX_BLOCK_SIZE: usize = 64 << 20;

/// Length of a cell holding a block of `block_size` bytes:
/// `32 + round_up_32(12 + block_size + 16)`.
pub const fn cell_len(block_size: usize) -> usize {
    PIECE + (NONCE_LEN + block_size + TAG_LEN).div_ceil(PIECE) * PIECE
}

/// Fills `out` from the operating system's random generator.
pub(crate) fn fill_random(out: &mut [u8]) -> Result<(), TeeError> {
    SystemRandom::new().fill(out).map_err(|_| TeeError::Rng)
}

/// The double encryption of one store's cells (for one block size), and the sealing of the
/// messages between the gateway and the trusted component. The gateway and the enclave each
/// hold one, built from the same [`TeeKey`].
///
/// See the crate docs for the byte formats.
pub struct TeeCipher {
    block_size: usize,
    cell_len: usize,
    k_gcm: LessSafeKey,
    k_msg: LessSafeKey,
    k_xor: Zeroizing<[u8; 32]>,
}

impl fmt::Debug for TeeCipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TeeCipher")
            .field("block_size", &self.block_size)
            .field("cell_len", &self.cell_len)
            .field("keys", &"<redacted>")
            .finish()
    }
}

struct Len32;
impl hkdf::KeyType for Len32 {
    fn len(&self) -> usize {
        32
    }
}

fn expand(prk: &hkdf::Prk, info: &[u8]) -> Zeroizing<[u8; 32]> {
    let mut k = Zeroizing::new([0u8; 32]);
    prk.expand(&[info], Len32)
        .and_then(|okm| okm.fill(&mut k[..]))
        // Only fails for outputs longer than 255 hash lengths; 32 bytes never is.
        .expect("HKDF-SHA256 can expand to 32 bytes");
    k
}

fn aes_key(bytes: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).expect("a 32-byte AES-256 key"))
}

impl TeeCipher {
    /// The cipher for blocks of `block_size` bytes under `key`.
    ///
    /// # Panics
    ///
    /// If `block_size` exceeds [`MAX_BLOCK_SIZE`] (a configuration error).
    pub fn new(key: &TeeKey, block_size: usize) -> Self {
        assert!(
            block_size <= MAX_BLOCK_SIZE,
            "block size {block_size} exceeds the TEE cipher's maximum {MAX_BLOCK_SIZE}"
        );
        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(key.expose_bytes());
        Self {
            block_size,
            cell_len: cell_len(block_size),
            k_gcm: aes_key(&expand(&prk, GCM_KEY_INFO)),
            k_msg: aes_key(&expand(&prk, MSG_KEY_INFO)),
            k_xor: expand(&prk, XOR_KEY_INFO),
        }
    }

    /// Length of a plaintext block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Length of a cell: `32 + round_up_32(12 + block_size + 16)`.
    pub fn cell_len(&self) -> usize {
        self.cell_len
    }

    /// Number of 32-byte pieces in a cell, piece 0 included.
    pub fn pieces(&self) -> usize {
        self.cell_len / PIECE
    }

    /// Length of a sealed answer: nonce, block, tag.
    pub fn answer_len(&self) -> usize {
        NONCE_LEN + self.block_size + TAG_LEN
    }

    pub(crate) fn k_xor(&self) -> &[u8; 32] {
        &self.k_xor
    }

    /// Double-encrypts one block bound to `ad` (a fresh `r` and a fresh nonce every time).
    pub fn seal(&self, ad: &[u8; 32], plaintext: &[u8]) -> Result<Vec<u8>, TeeError> {
        if plaintext.len() != self.block_size {
            return Err(TeeError::malformed(
                "plaintext",
                format!("{} bytes, the block size is {}", plaintext.len(), self.block_size),
            ));
        }
        let mut cell = vec![0u8; self.cell_len];
        fill_random(&mut cell[..PIECE + NONCE_LEN])?;
        let (head, rest) = cell.split_at_mut(PIECE + NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&head[PIECE..]).expect("12-byte nonce");
        let (body, tail) = rest.split_at_mut(self.block_size);
        body.copy_from_slice(plaintext);
        let tag = self
            .k_gcm
            .seal_in_place_separate_tag(nonce, Aad::from(&ad[..]), body)
            .map_err(|_| TeeError::malformed("plaintext", "too long for AES-GCM"))?;
        tail[..TAG_LEN].copy_from_slice(tag.as_ref());
        self.apply_outer(&mut cell);
        Ok(cell)
    }

    /// Opens a cell sealed for `ad`: checks its length, strips the outer layer, checks the
    /// zero padding and opens the inner AES-GCM layer.
    pub fn open(&self, ad: &[u8; 32], cell: &[u8]) -> Result<Vec<u8>, TeeError> {
        let mut buf = Zeroizing::new(cell.to_vec());
        Ok(self.open_in_place(ad, &mut buf, "cell failed authentication")?.to_vec())
    }

    /// [`TeeCipher::open`] in place; `what` names the cell in an integrity error. Returns the
    /// plaintext, a sub-slice of `cell`.
    pub(crate) fn open_in_place<'a>(
        &self,
        ad: &[u8; 32],
        cell: &'a mut [u8],
        what: &'static str,
    ) -> Result<&'a [u8], TeeError> {
        self.check_cell_len(cell, None)?;
        self.apply_outer(cell);
        let inner = &mut cell[PIECE..];
        let used = NONCE_LEN + self.block_size + TAG_LEN;
        // The padding is public (zero); a nonzero byte means the cell was modified.
        if inner[used..].iter().fold(0u8, |acc, b| acc | b) != 0 {
            return Err(TeeError::Integrity {
                what: "cell padding is not zero (the cell was modified)",
            });
        }
        let (nonce, body) = inner[..used].split_at_mut(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).expect("12-byte nonce");
        let plain = self
            .k_gcm
            .open_in_place(nonce, Aad::from(&ad[..]), body)
            .map_err(|_| TeeError::Integrity { what })?;
        Ok(plain)
    }

    /// Refuses a cell of the wrong length; `index` is its position among several, if any.
    pub(crate) fn check_cell_len(&self, cell: &[u8], index: Option<usize>) -> Result<(), TeeError> {
        if cell.len() == self.cell_len {
            return Ok(());
        }
        let at = index.map(|i| format!(" at position {i}")).unwrap_or_default();
        Err(TeeError::malformed(
            "cell",
            format!("cell{at} has {} bytes, expected {}", cell.len(), self.cell_len),
        ))
    }

    /// XORs pieces 1.. of `cell` with the keystream of its piece 0 (sealing and opening are
    /// the same operation).
    fn apply_outer(&self, cell: &mut [u8]) {
        let (r, rest) = cell.split_at_mut(PIECE);
        let mid = Zeroizing::new(Midstate::new(&self.k_xor, r[..].try_into().expect("32 bytes")));
        for (i, piece) in rest.chunks_exact_mut(PIECE).enumerate() {
            xor_piece(piece, &mid.keystream(&Tail::new(i as u32 + 1)));
        }
    }

    /// Seals a query ticket for the enclave.
    pub fn seal_query(&self, t: &QueryTicket) -> Result<Vec<u8>, TeeError> {
        self.seal_message(QUERY_TICKET_AD, &t.to_bytes()?[..])
    }

    /// Seals an eviction ticket for the enclave.
    pub fn seal_evict(&self, t: &EvictTicket) -> Result<Vec<u8>, TeeError> {
        self.seal_message(EVICT_TICKET_AD, &t.to_bytes()?)
    }

    /// Opens a sealed query ticket (enclave side).
    pub fn open_query(&self, sealed: &[u8]) -> Result<QueryTicket, TeeError> {
        let plain = self.open_message(QUERY_TICKET_AD, sealed, "query ticket")?;
        QueryTicket::from_bytes(&plain)
    }

    /// Opens a sealed eviction ticket (enclave side).
    pub fn open_evict(&self, sealed: &[u8]) -> Result<EvictTicket, TeeError> {
        let plain = self.open_message(EVICT_TICKET_AD, sealed, "evict ticket")?;
        EvictTicket::from_bytes(&plain)
    }

    /// Seals the answer to query `query_id` of `stream` (enclave side).
    pub(crate) fn seal_answer(
        &self,
        stream: &[u8; 16],
        query_id: u64,
        block: &[u8],
    ) -> Result<Vec<u8>, TeeError> {
        self.seal_message(&answer_ad(stream, query_id), block)
    }

    /// Opens the enclave's answer to query `query_id` of `stream`: the plaintext block.
    pub fn open_answer(
        &self,
        stream: &[u8; 16],
        query_id: u64,
        answer: &[u8],
    ) -> Result<Vec<u8>, TeeError> {
        if answer.len() != self.answer_len() {
            return Err(TeeError::malformed(
                "answer",
                format!("{} bytes, expected {}", answer.len(), self.answer_len()),
            ));
        }
        let plain = self.open_message(&answer_ad(stream, query_id), answer, "answer")?;
        Ok(plain.to_vec())
    }

    /// `nonce || AES-256-GCM(k_msg, nonce, ad, plaintext) || tag`.
    pub(crate) fn seal_message(&self, ad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, TeeError> {
        let mut out = vec![0u8; NONCE_LEN + plaintext.len() + TAG_LEN];
        fill_random(&mut out[..NONCE_LEN])?;
        let (nonce, rest) = out.split_at_mut(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).expect("12-byte nonce");
        let (body, tag_out) = rest.split_at_mut(plaintext.len());
        body.copy_from_slice(plaintext);
        let tag = self
            .k_msg
            .seal_in_place_separate_tag(nonce, Aad::from(ad), body)
            .map_err(|_| TeeError::malformed("message", "too long for AES-GCM"))?;
        tag_out.copy_from_slice(tag.as_ref());
        Ok(out)
    }

    /// Opens a message of [`TeeCipher::seal_message`]; `what` names it in errors.
    fn open_message(
        &self,
        ad: &[u8],
        sealed: &[u8],
        what: &'static str,
    ) -> Result<Zeroizing<Vec<u8>>, TeeError> {
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return Err(TeeError::malformed(
                what,
                format!("{} bytes, shorter than nonce and tag", sealed.len()),
            ));
        }
        let nonce = Nonce::try_assume_unique_for_key(&sealed[..NONCE_LEN]).expect("12 bytes");
        let mut buf = Zeroizing::new(sealed[NONCE_LEN..].to_vec());
        let n = self
            .k_msg
            .open_in_place(nonce, Aad::from(ad), &mut buf[..])
            .map_err(|_| TeeError::Integrity { what: integrity_of(what) })?
            .len();
        buf.truncate(n);
        Ok(buf)
    }
}

fn integrity_of(what: &'static str) -> &'static str {
    match what {
        "query ticket" => "query ticket failed authentication (forged, garbled or another kind)",
        "evict ticket" => "evict ticket failed authentication (forged, garbled or another kind)",
        _ => "answer failed authentication (forged, garbled or for another query)",
    }
}

/// `ANSWER_AD || stream || query_id u64 LE`.
fn answer_ad(stream: &[u8; 16], query_id: u64) -> [u8; ANSWER_AD.len() + 24] {
    let mut ad = [0u8; ANSWER_AD.len() + 24];
    ad[..ANSWER_AD.len()].copy_from_slice(ANSWER_AD);
    ad[ANSWER_AD.len()..ANSWER_AD.len() + 16].copy_from_slice(stream);
    ad[ANSWER_AD.len() + 16..].copy_from_slice(&query_id.to_le_bytes());
    ad
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// Opens a cell following the spec's words with independent code (sha2's hasher, ring's
    /// HKDF and AES-GCM directly), so the format cannot drift silently.
    #[test]
    fn cell_format_matches_the_spec() {
        let key = TeeKey::from_bytes([5; 32]);
        let bs = 100;
        let c = TeeCipher::new(&key, bs);
        assert_eq!(c.cell_len(), 32 + 128, "12 + 100 + 16 = 128 is already a multiple of 32");
        let ad = [7u8; 32];
        let pt: Vec<u8> = (0..bs as u8).collect();
        let mut cell = c.seal(&ad, &pt).unwrap();

        let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(key.expose_bytes());
        let k_xor = expand(&prk, b"blindfold tee xor v1");
        let k_gcm = expand(&prk, b"blindfold tee gcm v1");
        let r = cell[..32].to_vec();
        for (i, piece) in cell[32..].chunks_exact_mut(32).enumerate() {
            let mut h = Sha256::new();
            h.update(&k_xor[..]);
            h.update(&r);
            h.update((i as u32 + 1).to_be_bytes());
            let ks: [u8; 32] = h.finalize().into();
            piece.iter_mut().zip(ks).for_each(|(x, k)| *x ^= k);
        }
        let inner = &mut cell[32..];
        let nonce = Nonce::try_assume_unique_for_key(&inner[..12]).unwrap();
        let plain = aes_key(&k_gcm)
            .open_in_place(nonce, Aad::from(&ad[..]), &mut inner[12..12 + bs + 16])
            .unwrap();
        assert_eq!(plain, &pt[..]);

        // Padding: a block size whose inner layer is not a multiple of 32.
        let c = TeeCipher::new(&key, 40);
        assert_eq!(c.cell_len(), 32 + 96);
        assert_eq!(cell_len(0), 64);
        assert_eq!(cell_len(1024), 32 + 1056);
    }

    #[test]
    fn messages_of_one_kind_do_not_open_as_another() {
        let c = TeeCipher::new(&TeeKey::from_bytes([1; 32]), 64);
        let stream = [2; 16];
        let q =
            QueryTicket { stream, query_id: 3, candidates: 2, target: 1, ads: vec![[0; 32]; 2] };
        let sq = c.seal_query(&q).unwrap();
        assert!(c.open_evict(&sq).unwrap_err().is_integrity());
        let e = EvictTicket { stream, round: 1, layer: 0, perm: vec![0; 0] };
        let se = c.seal_evict(&e).unwrap();
        assert!(c.open_query(&se).unwrap_err().is_integrity());
        // A query ticket's plaintext sealed as an answer-sized message under the answer label
        // is not a ticket either.
        let fake = c.seal_message(&answer_ad(&stream, 3), &q.to_bytes().unwrap()[..]).unwrap();
        assert!(c.open_query(&fake).unwrap_err().is_integrity());
    }
}
