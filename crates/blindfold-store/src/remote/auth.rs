//! [`AuthKey`]: the pre-shared key that lets a gateway use a `blindfold storage-server`, and
//! the proofs of the challenge–response handshake built from it.
//!
//! The key file holds 64 hex digits (32 random bytes) and an optional trailing newline; it is
//! created with mode 0600 and refused if its group or others may read it.

use std::fmt;
use std::io::{Read, Write};
use std::path::Path;

use ring::hmac;
use zeroize::Zeroizing;

use super::protocol::{NONCE_LEN, PROOF_LEN};
use crate::StoreError;

/// Label of the client's proof: `HMAC-SHA256(key, CLIENT_LABEL | server nonce | client nonce)`.
pub const CLIENT_LABEL: &[u8] = b"blindfold-storage-auth v2 client";
/// Label of the server's proof, over the same nonces. Two labels, so that neither side's
/// proof can be replayed as the other's.
pub const SERVER_LABEL: &[u8] = b"blindfold-storage-auth v2 server";

/// Longest key file read (a key file is 65 bytes; anything much longer is not one).
const MAX_KEY_FILE: u64 = 1024;

/// Parses the contents of a 32-byte key file: exactly 64 hex digits, optionally followed by
/// whitespace. The error never quotes the input (it may be key material). Shared by every raw
/// key file (this one, the TEE design's trusted-component key).
pub fn parse_key_hex(text: &[u8]) -> Result<Zeroizing<[u8; 32]>, String> {
    let end = text.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
    let digits = &text[..end];
    if digits.len() != 64 {
        return Err(format!(
            "expected 64 hex digits (32 random bytes), found {} bytes",
            digits.len()
        ));
    }
    let mut k = Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(digits, &mut k[..])
        .map_err(|_| "expected hex digits only (0-9, a-f)".to_string())?;
    Ok(k)
}

/// Reads a 32-byte key file (see [`parse_key_hex`]): a regular file of at most
/// `MAX_KEY_FILE` bytes that its group and others may not read. The error says why, without
/// the path (callers name the file).
pub fn read_key_file(path: &Path) -> Result<Zeroizing<[u8; 32]>, String> {
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "its mode is {:o}: group or others may read the key; `chmod 600` it",
                mode & 0o777
            ));
        }
    }
    let mut text = Zeroizing::new(Vec::new());
    file.take(MAX_KEY_FILE + 1).read_to_end(&mut text).map_err(|e| e.to_string())?;
    if text.len() as u64 > MAX_KEY_FILE {
        return Err(format!("larger than {MAX_KEY_FILE} bytes; not a key file"));
    }
    parse_key_hex(&text)
}

/// Writes `key` as a new key file at `path`: 64 hex digits and a newline, mode 0600, synced,
/// never over an existing file.
pub fn write_key_file(path: &Path, key: &[u8; 32]) -> Result<(), String> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            "already exists; refusing to overwrite a key".to_string()
        } else {
            e.to_string()
        }
    })?;
    let mut text = Zeroizing::new(hex::encode(&key[..]));
    text.push('\n');
    file.write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    file.sync_all().map_err(|e| e.to_string())
}

/// A 32-byte pre-shared key. Wiped on drop, never printed.
#[derive(Clone)]
pub struct AuthKey(Zeroizing<[u8; 32]>);

impl fmt::Debug for AuthKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthKey(<redacted>)")
    }
}

impl AuthKey {
    /// Key length in bytes.
    pub const LEN: usize = 32;

    /// A key from its bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// A fresh random key from the operating system's generator.
    pub fn generate() -> Result<Self, StoreError> {
        let mut k = Zeroizing::new([0u8; 32]);
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut k[..])
            .map_err(|_| StoreError::InvalidConfig("the system random generator failed".into()))?;
        Ok(Self(k))
    }

    /// Parses a key file's contents: 64 hex digits, optionally followed by whitespace. The
    /// error never quotes the input (it may be key material).
    pub fn parse(text: &[u8]) -> Result<Self, String> {
        parse_key_hex(text).map(Self)
    }

    /// Loads the key file at `path`, refusing one that its group or others can read.
    pub fn load(path: &Path) -> Result<Self, StoreError> {
        read_key_file(path).map(Self).map_err(|reason| {
            StoreError::InvalidConfig(format!("storage auth key file {}: {reason}", path.display()))
        })
    }

    /// Creates a new key file at `path` (mode 0600, never overwriting a file) holding a fresh
    /// key, and returns the key.
    pub fn create(path: &Path) -> Result<Self, StoreError> {
        let bad = |reason: String| {
            StoreError::InvalidConfig(format!(
                "creating storage auth key file {}: {reason}",
                path.display()
            ))
        };
        let key = Self::generate()?;
        write_key_file(path, &key.0).map_err(bad)?;
        Ok(key)
    }

    fn proof(
        &self,
        label: &[u8],
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
    ) -> hmac::Tag {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.0[..]);
        let mut ctx = hmac::Context::with_key(&key);
        ctx.update(label);
        ctx.update(server_nonce);
        ctx.update(client_nonce);
        ctx.sign()
    }

    fn verify(
        &self,
        label: &[u8],
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
        proof: &[u8; PROOF_LEN],
    ) -> bool {
        let key = hmac::Key::new(hmac::HMAC_SHA256, &self.0[..]);
        let mut msg = Vec::with_capacity(label.len() + 2 * NONCE_LEN);
        msg.extend_from_slice(label);
        msg.extend_from_slice(server_nonce);
        msg.extend_from_slice(client_nonce);
        // ring compares the tags in constant time.
        hmac::verify(&key, &msg, proof).is_ok()
    }

    /// The client's proof of the key for this pair of nonces.
    pub fn client_proof(
        &self,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
    ) -> [u8; PROOF_LEN] {
        self.proof(CLIENT_LABEL, server_nonce, client_nonce).as_ref().try_into().unwrap()
    }

    /// The server's proof of the key for this pair of nonces.
    pub fn server_proof(
        &self,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
    ) -> [u8; PROOF_LEN] {
        self.proof(SERVER_LABEL, server_nonce, client_nonce).as_ref().try_into().unwrap()
    }

    /// Whether `proof` is the client's proof for these nonces (constant time).
    pub fn verify_client(
        &self,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
        proof: &[u8; PROOF_LEN],
    ) -> bool {
        self.verify(CLIENT_LABEL, server_nonce, client_nonce, proof)
    }

    /// Whether `proof` is the server's proof for these nonces (constant time).
    pub fn verify_server(
        &self,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
        proof: &[u8; PROOF_LEN],
    ) -> bool {
        self.verify(SERVER_LABEL, server_nonce, client_nonce, proof)
    }
}

/// A fresh random nonce.
pub fn nonce() -> Result<[u8; NONCE_LEN], StoreError> {
    let mut n = [0u8; NONCE_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut n)
        .map_err(|_| StoreError::InvalidConfig("the system random generator failed".into()))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_verify_and_do_not_cross() {
        let k = AuthKey::from_bytes([7; 32]);
        let (s, c) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let p = k.client_proof(&s, &c);
        assert!(k.verify_client(&s, &c, &p));
        assert!(!k.verify_server(&s, &c, &p), "a client proof is not a server proof");
        assert!(!k.verify_client(&c, &s, &p), "nonces are bound in order");
        assert!(!AuthKey::from_bytes([8; 32]).verify_client(&s, &c, &p));
        assert!(k.verify_server(&s, &c, &k.server_proof(&s, &c)));
    }

    #[test]
    fn known_answer() {
        // HMAC-SHA256(0x00..1f, CLIENT_LABEL | 32×0x01 | 32×0x02), computed independently with
        // Python's hmac module.
        let k = AuthKey::from_bytes(std::array::from_fn(|i| i as u8));
        let p = k.client_proof(&[1; NONCE_LEN], &[2; NONCE_LEN]);
        assert_eq!(hex::encode(p), KAT_CLIENT_PROOF);
    }
    const KAT_CLIENT_PROOF: &str =
        "f9145b4c43f0c2fbf22ad7ef6d0db0d09ce62e58a4fa77279554aac3cadb1144";

    #[test]
    fn key_text_is_parsed_strictly() {
        let hex64 = "ab".repeat(32);
        assert!(AuthKey::parse(hex64.as_bytes()).is_ok());
        assert!(AuthKey::parse(format!("{hex64}\n").as_bytes()).is_ok());
        for bad in ["", "ab", &"zz".repeat(32), &format!("{hex64}00"), &format!(" {hex64}")] {
            let err = AuthKey::parse(bad.as_bytes()).unwrap_err();
            assert!(!err.contains("zz"), "errors do not quote the key: {err}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn key_files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("auth.key");
        let k = AuthKey::create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let back = AuthKey::load(&path).unwrap();
        assert_eq!(k.0[..], back.0[..]);
        assert!(AuthKey::create(&path).is_err(), "never overwrites");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = AuthKey::load(&path).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
    }
}
