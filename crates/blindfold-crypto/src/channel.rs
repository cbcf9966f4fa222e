//! A sealed, ordered channel between two processes that hold the same master key: the primary
//! gateway and its standby (`blindfold-gateway`'s log feed).
//!
//! Each side opens a connection with 32 random bytes of its own; both derive one key per
//! direction from the master key and the two nonces, so that nothing recorded on one
//! connection opens on another:
//!
//! ```text
//! salt          = "blindfold channel v1" || initiator's nonce (32) || responder's nonce (32)
//! key(dir)      = HKDF-SHA256(salt, ikm = master key, info = label || " " || dir)
//!                 dir = "initiator" or "responder" (the side that seals)
//! nonce(n)      = n u64 LE || 0 0 0 0      (n: messages sealed so far in that direction)
//! sealed(n)     = AES-256-GCM(key(dir), nonce(n), ad = label, message) || tag (16)
//! ```
//!
//! The counter in the nonce makes every message's place in its direction part of what is
//! authenticated: a message dropped, replayed, reordered or moved to the other direction does
//! not open, and neither does one altered or sealed under another key. After the first
//! failure the channel is useless (the caller closes the connection).

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};

use crate::{derive_key, CryptoError, MasterKey};

/// Bytes of each side's opening nonce.
pub const CHANNEL_NONCE_LEN: usize = 32;
const TAG_LEN: usize = 16;

/// One end of a sealed channel (see the module documentation).
pub struct ChannelCipher {
    label: &'static str,
    send: LessSafeKey,
    recv: LessSafeKey,
    sent: u64,
    received: u64,
}

impl std::fmt::Debug for ChannelCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelCipher")
            .field("label", &self.label)
            .field("sent", &self.sent)
            .field("received", &self.received)
            .finish_non_exhaustive()
    }
}

fn direction_key(master: &MasterKey, salt: &[u8], label: &str, dir: &str) -> LessSafeKey {
    let key = derive_key(master, salt, &format!("{label} {dir}"));
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key[..]).expect("a 32-byte AES-256 key"))
}

fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; NONCE_LEN];
    b[..8].copy_from_slice(&n.to_le_bytes());
    Nonce::assume_unique_for_key(b)
}

impl ChannelCipher {
    /// Bytes sealing adds to a message (the tag).
    pub const OVERHEAD: usize = TAG_LEN;

    /// The end of the channel `label` (one label per use) between the side that opened the
    /// connection (`initiator` nonce) and the side that accepted it (`responder` nonce);
    /// `initiator_side` says which of the two this end is.
    pub fn new(
        master: &MasterKey,
        label: &'static str,
        initiator: &[u8; CHANNEL_NONCE_LEN],
        responder: &[u8; CHANNEL_NONCE_LEN],
        initiator_side: bool,
    ) -> Self {
        let mut salt = Vec::with_capacity(20 + 2 * CHANNEL_NONCE_LEN);
        salt.extend_from_slice(b"blindfold channel v1");
        salt.extend_from_slice(initiator);
        salt.extend_from_slice(responder);
        let i = direction_key(master, &salt, label, "initiator");
        let r = direction_key(master, &salt, label, "responder");
        let (send, recv) = if initiator_side { (i, r) } else { (r, i) };
        Self { label, send, recv, sent: 0, received: 0 }
    }

    /// Seals the next message of this direction.
    pub fn seal(&mut self, message: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(message.len() + TAG_LEN);
        out.extend_from_slice(message);
        let tag = self
            .send
            .seal_in_place_separate_tag(
                nonce(self.sent),
                Aad::from(self.label.as_bytes()),
                &mut out,
            )
            // Only fails for messages longer than AES-GCM allows (64 GiB).
            .expect("a message within AES-GCM's limit");
        out.extend_from_slice(tag.as_ref());
        self.sent += 1;
        out
    }

    /// Opens the next message of the other direction. A message that is not the next one
    /// sealed by the other end under this channel's keys is an error, and so is every message
    /// after it.
    pub fn open(&mut self, sealed: &[u8]) -> Result<Vec<u8>, CryptoError> {
        if sealed.len() < TAG_LEN {
            return Err(CryptoError::Malformed(format!(
                "a channel message of {} bytes, shorter than its tag",
                sealed.len()
            )));
        }
        if self.received == u64::MAX {
            return Err(CryptoError::Malformed("the channel failed earlier".into()));
        }
        let mut buf = sealed.to_vec();
        let opened = self
            .recv
            .open_in_place(nonce(self.received), Aad::from(self.label.as_bytes()), &mut buf)
            .map(|p| p.len());
        match opened {
            Ok(len) => {
                buf.truncate(len);
                self.received += 1;
                Ok(buf)
            }
            Err(_) => {
                self.received = u64::MAX;
                Err(CryptoError::Integrity { cell: u64::MAX, segment: 0 })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LABEL: &str = "blindfold test channel v1";

    fn pair(a: &MasterKey, b: &MasterKey) -> (ChannelCipher, ChannelCipher) {
        let (ni, nr) = ([1u8; 32], [2u8; 32]);
        (
            ChannelCipher::new(a, LABEL, &ni, &nr, true),
            ChannelCipher::new(b, LABEL, &ni, &nr, false),
        )
    }

    #[test]
    fn messages_open_in_order_both_ways() {
        let k = MasterKey::from_bytes([9; 32]);
        let (mut i, mut r) = pair(&k, &k);
        for n in 0..5u8 {
            let m = vec![n; 10 + n as usize];
            assert_eq!(r.open(&i.seal(&m)).unwrap(), m);
            assert_eq!(i.open(&r.seal(&m)).unwrap(), m);
        }
        assert_eq!(r.open(&i.seal(b"")).unwrap(), b"");
    }

    #[test]
    fn dropped_replayed_reordered_reflected_or_altered_messages_do_not_open() {
        let k = MasterKey::from_bytes([9; 32]);
        let (mut i, mut r) = pair(&k, &k);
        let (a, b) = (i.seal(b"first"), i.seal(b"second"));
        // Reordered (and so: one dropped).
        assert!(pair(&k, &k).1.open(&b).is_err());
        assert_eq!(r.open(&a).unwrap(), b"first");
        // Replayed.
        assert!(r.open(&a).is_err());
        // And the channel stays shut after a failure, even for the right message.
        assert!(r.open(&b).is_err());
        // Reflected: a message sealed by one end, handed back to it.
        let (mut i, _) = pair(&k, &k);
        let own = i.seal(b"mine");
        assert!(i.open(&own).is_err());
        // Altered, and cut short.
        let (mut i, mut r) = pair(&k, &k);
        let mut m = i.seal(b"payload");
        m[2] ^= 1;
        assert!(r.open(&m).is_err());
        assert!(pair(&k, &k).1.open(&[0u8; 5]).is_err());
    }

    #[test]
    fn another_key_or_another_connection_does_not_open() {
        let k = MasterKey::from_bytes([9; 32]);
        let (mut i, _) = pair(&k, &k);
        let m = i.seal(b"hello");
        let (_, mut other_key) = pair(&k, &MasterKey::from_bytes([8; 32]));
        assert!(other_key.open(&m).is_err());
        // Same key, another connection's nonces: a recording is useless.
        let mut later = ChannelCipher::new(&k, LABEL, &[1u8; 32], &[3u8; 32], false);
        assert!(later.open(&m).is_err());
        let mut other_label =
            ChannelCipher::new(&k, "another use v1", &[1u8; 32], &[2u8; 32], false);
        assert!(other_label.open(&m).is_err());
    }
}
