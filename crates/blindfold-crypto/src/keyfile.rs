//! Key files: the master key on disk, raw or wrapped under an Argon2id passphrase key.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;

use argon2::{Algorithm, Argon2, Block, Params, Version};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use zeroize::{Zeroize, ZeroizeOnDrop, Zeroizing};

use crate::keys::fill_random;
use crate::seal::{open_raw, seal_raw};
use crate::{CryptoError, MasterKey, Passphrase};

const FORMAT: &str = "blindfold-key";
const VERSION: u32 = 1;
const KIND_RAW: &str = "raw";
const KIND_ARGON2ID: &str = "argon2id";
/// Associated data of the AES-256-GCM key wrap.
const KEYWRAP_AD: &[u8] = b"blindfold-keywrap-v1";
const SALT_LEN: usize = 16;
const WRAP_NONCE_LEN: usize = 12;
/// A key file is a few hundred bytes; anything much larger is not one.
const MAX_KEY_FILE_LEN: u64 = 64 * 1024;

/// Argon2id cost parameters for passphrase-protected key files.
///
/// [`Default`] is 64 MiB, 3 passes, 1 lane: RFC 9106 §4's second recommended option with the
/// parallelism lowered to the one lane the `argon2` crate computes, and above OWASP's minimum
/// (19 MiB, 2 passes). Deriving a key takes about 0.13 s on one core of the development
/// machine (optimized build).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KdfParams {
    /// Memory in KiB (at least `8 * p_cost`).
    pub m_cost_kib: u32,
    /// Number of passes (at least 1).
    pub t_cost: u32,
    /// Degree of parallelism, i.e. lanes (at least 1).
    pub p_cost: u32,
}

impl KdfParams {
    /// Most memory a key file may ask for (4 GiB), so that a corrupted file cannot exhaust the
    /// machine.
    pub const MAX_M_COST_KIB: u32 = 4 * 1024 * 1024;
    /// Most passes a key file may ask for.
    pub const MAX_T_COST: u32 = 1_000;
    /// Most lanes a key file may ask for.
    pub const MAX_P_COST: u32 = 64;

    /// Tiny parameters (64 KiB, 1 pass) that make tests fast.
    ///
    /// # Security
    ///
    /// A passphrase protected with these can be brute-forced cheaply. Never use them for a
    /// real key file.
    pub const fn insecure_for_tests() -> Self {
        Self { m_cost_kib: 64, t_cost: 1, p_cost: 1 }
    }

    /// Checks the parameters are valid for Argon2id and within this crate's limits.
    ///
    /// # Errors
    ///
    /// [`CryptoError::Malformed`] describing the bad parameter.
    pub fn validate(&self) -> Result<(), CryptoError> {
        self.to_argon2().map(|_| ())
    }

    fn to_argon2(self) -> Result<Params, CryptoError> {
        if self.m_cost_kib > Self::MAX_M_COST_KIB
            || self.t_cost > Self::MAX_T_COST
            || self.p_cost > Self::MAX_P_COST
        {
            return Err(CryptoError::Malformed(format!(
                "Argon2id parameters {self:?} exceed the limits \
                 (m_cost_kib <= {}, t_cost <= {}, p_cost <= {})",
                Self::MAX_M_COST_KIB,
                Self::MAX_T_COST,
                Self::MAX_P_COST
            )));
        }
        Params::new(self.m_cost_kib, self.t_cost, self.p_cost, Some(32))
            .map_err(|e| CryptoError::Malformed(format!("Argon2id parameters {self:?}: {e}")))
    }
}

impl Default for KdfParams {
    fn default() -> Self {
        Self { m_cost_kib: 64 * 1024, t_cost: 3, p_cost: 1 }
    }
}

/// Creates a new key file at `path` holding a fresh random master key, and returns the key.
///
/// Without a passphrase the key is stored in hex; with one it is wrapped with AES-256-GCM under
/// an Argon2id key derived with [`KdfParams::default`]. See [`create_key_file_with`].
///
/// # Errors
///
/// As [`create_key_file_with`].
pub fn create_key_file(
    path: &Path,
    passphrase: Option<&Passphrase>,
) -> Result<MasterKey, CryptoError> {
    create_key_file_with(path, passphrase, KdfParams::default())
}

/// Creates a new key file at `path` holding a fresh random master key, with the given Argon2id
/// parameters (used only with a passphrase), and returns the key.
///
/// The file is JSON, written atomically: a temporary file in the same directory is created
/// with mode `0600`, written and fsynced, then linked into place (failing if `path` appeared
/// meanwhile), and the directory is fsynced.
///
/// # Security
///
/// An existing file is never overwritten: losing a master key loses the store. Without a
/// passphrase anyone who can read the file can read the store; keep it on an encrypted disk
/// or use a passphrase.
///
/// # Errors
///
/// - [`CryptoError::KeyFile`] if `path` exists, has no file name, the passphrase is empty, or
///   `kdf` is invalid.
/// - [`CryptoError::Io`] if writing fails; [`CryptoError::Rng`] if the system RNG fails.
pub fn create_key_file_with(
    path: &Path,
    passphrase: Option<&Passphrase>,
    kdf: KdfParams,
) -> Result<MasterKey, CryptoError> {
    let key_file_error = |reason: String| CryptoError::KeyFile { path: path.to_owned(), reason };
    if fs::symlink_metadata(path).is_ok() {
        return Err(key_file_error(already_exists()));
    }
    let master = MasterKey::try_generate()?;
    let doc = match passphrase {
        None => KeyFileDoc {
            kind: KIND_RAW.to_owned(),
            key: Some(SecretHex(hex::encode(master.expose_bytes()))),
            ..KeyFileDoc::empty()
        },
        Some(passphrase) => {
            if passphrase.is_empty() {
                return Err(key_file_error("the passphrase is empty".to_owned()));
            }
            kdf.validate().map_err(|e| key_file_error(format!("bad KDF parameters: {e}")))?;
            let mut salt = [0u8; SALT_LEN];
            fill_random(&mut salt)?;
            let mut nonce = [0u8; WRAP_NONCE_LEN];
            fill_random(&mut nonce)?;
            let kek = derive_wrapping_key(passphrase, &salt, kdf)
                .map_err(|e| key_file_error(format!("key derivation failed: {e}")))?;
            let wrapped = seal_raw(&kek, nonce, KEYWRAP_AD, master.expose_bytes());
            KeyFileDoc {
                kind: KIND_ARGON2ID.to_owned(),
                m_cost_kib: Some(kdf.m_cost_kib),
                t_cost: Some(kdf.t_cost),
                p_cost: Some(kdf.p_cost),
                salt: Some(hex::encode(salt)),
                wrapped: Some(hex::encode(wrapped)),
                ..KeyFileDoc::empty()
            }
        }
    };
    let mut json = Zeroizing::new(serde_json::to_vec(&doc).expect("key file serializes"));
    json.push(b'\n');
    write_new_file(path, &json)?;
    Ok(master)
}

/// Loads the master key from the key file at `path`.
///
/// A passphrase given for an unprotected (raw) key file is ignored.
///
/// # Security
///
/// The file's permissions are not checked here; call [`key_file_permissions_ok`] and warn if
/// it returns `false`.
///
/// # Errors
///
/// - [`CryptoError::PassphraseRequired`] if the file is passphrase-protected and `passphrase`
///   is `None`; [`CryptoError::WrongPassphrase`] if it does not unlock the file.
/// - [`CryptoError::KeyFile`] if the file is not a valid version-1 blindfold key file.
/// - [`CryptoError::Io`] if it cannot be read.
pub fn load_key_file(
    path: &Path,
    passphrase: Option<&Passphrase>,
) -> Result<MasterKey, CryptoError> {
    let key_file_error = |reason: String| CryptoError::KeyFile { path: path.to_owned(), reason };
    let contents = read_small_file(path)?;
    // serde_json's messages can quote input, which may be key material: report the position.
    let doc: KeyFileDoc = serde_json::from_slice(&contents).map_err(|e| {
        key_file_error(format!(
            "not a blindfold key file (invalid JSON or field type at line {}, column {})",
            e.line(),
            e.column()
        ))
    })?;
    if doc.format != FORMAT {
        return Err(key_file_error(format!(
            "not a blindfold key file (format {:?}, expected {FORMAT:?})",
            doc.format
        )));
    }
    if doc.version != VERSION {
        return Err(key_file_error(format!(
            "unsupported key file version {} (this build reads version {VERSION})",
            doc.version
        )));
    }
    let missing = |field: &str| key_file_error(format!("missing field {field:?}"));
    match doc.kind.as_str() {
        KIND_RAW => {
            let hex_key = doc.key.as_ref().ok_or_else(|| missing("key"))?;
            let mut key = Zeroizing::new([0u8; MasterKey::LEN]);
            hex::decode_to_slice(&hex_key.0, &mut key[..])
                .map_err(|_| key_file_error("\"key\" must be 64 hex digits".to_owned()))?;
            Ok(MasterKey::from_bytes(*key))
        }
        KIND_ARGON2ID => {
            let kdf = KdfParams {
                m_cost_kib: doc.m_cost_kib.ok_or_else(|| missing("m_cost_kib"))?,
                t_cost: doc.t_cost.ok_or_else(|| missing("t_cost"))?,
                p_cost: doc.p_cost.ok_or_else(|| missing("p_cost"))?,
            };
            kdf.validate().map_err(|e| key_file_error(format!("bad KDF parameters: {e}")))?;
            let mut salt = [0u8; SALT_LEN];
            hex::decode_to_slice(doc.salt.as_ref().ok_or_else(|| missing("salt"))?, &mut salt)
                .map_err(|_| {
                    key_file_error(format!("\"salt\" must be {} hex digits", 2 * SALT_LEN))
                })?;
            let wrapped = hex::decode(doc.wrapped.as_ref().ok_or_else(|| missing("wrapped"))?)
                .map_err(|_| key_file_error("\"wrapped\" must be hex".to_owned()))?;
            if wrapped.len() != WRAP_NONCE_LEN + MasterKey::LEN + 16 {
                return Err(key_file_error(format!(
                    "\"wrapped\" must be {} bytes (nonce, wrapped key, tag), got {}",
                    WRAP_NONCE_LEN + MasterKey::LEN + 16,
                    wrapped.len()
                )));
            }
            let passphrase = passphrase
                .ok_or_else(|| CryptoError::PassphraseRequired { path: path.to_owned() })?;
            let kek = derive_wrapping_key(passphrase, &salt, kdf)
                .map_err(|e| key_file_error(format!("key derivation failed: {e}")))?;
            let mut key = Zeroizing::new([0u8; MasterKey::LEN]);
            open_raw(&kek, KEYWRAP_AD, &wrapped, &mut key[..])
                .map_err(|()| CryptoError::WrongPassphrase { path: path.to_owned() })?;
            Ok(MasterKey::from_bytes(*key))
        }
        other => Err(key_file_error(format!(
            "unknown key kind {other:?} (expected {KIND_RAW:?} or {KIND_ARGON2ID:?})"
        ))),
    }
}

/// Whether the key file at `path` is private to its owner: `Ok(false)` if its group or others
/// have any permission bit set (e.g. mode `0644`). Always `Ok(true)` on non-Unix systems.
///
/// [`load_key_file`] accepts such files; the binary should warn about them.
///
/// # Errors
///
/// [`CryptoError::Io`] if the file's metadata cannot be read.
pub fn key_file_permissions_ok(path: &Path) -> Result<bool, CryptoError> {
    let metadata = fs::metadata(path).map_err(|source| io_error(path, source))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        Ok(metadata.permissions().mode() & 0o077 == 0)
    }
    #[cfg(not(unix))]
    {
        let _ = metadata;
        Ok(true)
    }
}

/// Argon2id(passphrase, salt) → 32-byte AES-256-GCM key-wrapping key. Argon2's working memory
/// (which holds passphrase-derived data) is wiped before it is freed.
fn derive_wrapping_key(
    passphrase: &Passphrase,
    salt: &[u8],
    kdf: KdfParams,
) -> Result<Zeroizing<[u8; 32]>, CryptoError> {
    let params = kdf.to_argon2()?;
    let mut memory = vec![Block::default(); params.block_count()];
    let argon2 = Argon2::new(Algorithm::Argon2id, Version::V0x13, params);
    let mut key = Zeroizing::new([0u8; 32]);
    let result = argon2.hash_password_into_with_memory(
        passphrase.as_bytes(),
        salt,
        &mut key[..],
        &mut memory,
    );
    memory.zeroize();
    result.map_err(|e| CryptoError::Malformed(format!("Argon2id failed: {e}")))?;
    Ok(key)
}

/// The JSON document of a key file. Kind-specific fields are optional here and checked in
/// [`load_key_file`], which keeps the parser free of buffering (no copies of the key hex).
#[derive(Serialize, Deserialize)]
struct KeyFileDoc {
    format: String,
    version: u32,
    kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<SecretHex>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    m_cost_kib: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    t_cost: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    p_cost: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    salt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    wrapped: Option<String>,
}

impl KeyFileDoc {
    fn empty() -> Self {
        Self {
            format: FORMAT.to_owned(),
            version: VERSION,
            kind: String::new(),
            key: None,
            m_cost_kib: None,
            t_cost: None,
            p_cost: None,
            salt: None,
            wrapped: None,
        }
    }
}

/// Hex of a raw master key, wiped on drop.
#[derive(Zeroize, ZeroizeOnDrop)]
struct SecretHex(String);

impl Serialize for SecretHex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SecretHex {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(SecretHex)
    }
}

fn io_error(path: &Path, source: io::Error) -> CryptoError {
    CryptoError::Io { path: path.to_owned(), source }
}

fn already_exists() -> String {
    "the file already exists; refusing to overwrite it (move it away first if you really \
     mean to replace this key: data sealed under it becomes unreadable)"
        .to_owned()
}

/// Reads a file of at most [`MAX_KEY_FILE_LEN`] bytes into a buffer that is wiped on drop.
fn read_small_file(path: &Path) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
    let file = File::open(path).map_err(|source| io_error(path, source))?;
    let mut contents = Zeroizing::new(Vec::with_capacity(1024));
    file.take(MAX_KEY_FILE_LEN + 1)
        .read_to_end(&mut contents)
        .map_err(|source| io_error(path, source))?;
    if contents.len() as u64 > MAX_KEY_FILE_LEN {
        return Err(CryptoError::KeyFile {
            path: path.to_owned(),
            reason: format!("larger than {MAX_KEY_FILE_LEN} bytes; not a key file"),
        });
    }
    Ok(contents)
}

/// Writes `contents` to the new file `path` (mode 0600) atomically, never replacing an
/// existing file.
fn write_new_file(path: &Path, contents: &[u8]) -> Result<(), CryptoError> {
    let file_name = path.file_name().ok_or_else(|| CryptoError::KeyFile {
        path: path.to_owned(),
        reason: "the path has no file name".to_owned(),
    })?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut suffix = [0u8; 8];
    fill_random(&mut suffix)?;
    let tmp = dir.join(format!(".{}.tmp-{}", file_name.to_string_lossy(), hex::encode(suffix)));
    let result = write_temp_then_link(&tmp, path, contents);
    // Best effort: after success `tmp` is an extra link (or already renamed away).
    let _ = fs::remove_file(&tmp);
    result?;
    sync_dir(dir)
}

fn write_temp_then_link(tmp: &Path, path: &Path, contents: &[u8]) -> Result<(), CryptoError> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(tmp).map_err(|source| io_error(tmp, source))?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|source| io_error(tmp, source))?;
    drop(file);
    // A hard link fails if `path` exists, so a file created since our check is never
    // clobbered; `rename` would silently replace it.
    match fs::hard_link(tmp, path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            Err(CryptoError::KeyFile { path: path.to_owned(), reason: already_exists() })
        }
        // Some file systems have no hard links: fall back to a rename after checking again.
        Err(_) if fs::symlink_metadata(path).is_ok() => {
            Err(CryptoError::KeyFile { path: path.to_owned(), reason: already_exists() })
        }
        Err(_) => fs::rename(tmp, path).map_err(|source| io_error(path, source)),
    }
}

/// Makes the new directory entry durable.
fn sync_dir(dir: &Path) -> Result<(), CryptoError> {
    #[cfg(unix)]
    {
        File::open(dir).and_then(|d| d.sync_all()).map_err(|source| io_error(dir, source))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(())
    }
}
