//! [`TeeKey`]: the one secret the gateway shares with the trusted component.

use std::fmt;
use std::path::Path;

use blindfold_crypto::{derive_key, MasterKey, StoreId};
use blindfold_store::remote::{parse_key_hex, read_key_file, write_key_file};
use zeroize::Zeroizing;

use crate::TeeError;

/// HKDF label of the TEE key in [`derive_key`]: `derive_key(master, store id bytes, TEE_KEY_LABEL)`.
pub const TEE_KEY_LABEL: &str = "blindfold tee v1";

/// The 32-byte key shared by the gateway and the trusted component. Every key of the double
/// encryption and of the tickets is derived from it (see the crate docs).
///
/// Wiped on drop, printed as `TeeKey(<redacted>)`.
///
/// # Key file
///
/// 64 lowercase or uppercase hex digits and an optional trailing newline (or other trailing
/// whitespace), mode `0600`. [`TeeKey::load`] refuses files that the group or others may read.
#[derive(Clone)]
pub struct TeeKey(Zeroizing<[u8; 32]>);

impl fmt::Debug for TeeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TeeKey(<redacted>)")
    }
}

impl TeeKey {
    /// Key length in bytes.
    pub const LEN: usize = 32;

    /// Wraps key bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// A fresh key from the operating system's random generator.
    pub fn generate() -> Result<Self, TeeError> {
        let mut k = Zeroizing::new([0u8; 32]);
        crate::cipher::fill_random(&mut k[..])?;
        Ok(Self(k))
    }

    /// The key a gateway with `master` uses for the store `store`:
    /// `HKDF-SHA256(salt = store id bytes, ikm = master key, info = "blindfold tee v1")`.
    pub fn derive_from_master(master: &MasterKey, store: &StoreId) -> Self {
        Self(derive_key(master, &store.0, TEE_KEY_LABEL))
    }

    /// The raw key bytes.
    ///
    /// # Security
    ///
    /// Anyone holding them can read every block and forge every ticket. Do not log or copy them.
    pub fn expose_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Parses a key file's contents: exactly 64 hex digits, optionally followed by whitespace.
    /// The error never quotes the input (it may be key material).
    pub fn parse(text: &[u8]) -> Result<Self, String> {
        parse_key_hex(text).map(Self)
    }

    /// Loads the key file at `path`, refusing one that its group or others may read.
    pub fn load(path: &Path) -> Result<Self, TeeError> {
        read_key_file(path)
            .map(Self)
            .map_err(|reason| TeeError::KeyFile { path: path.to_path_buf(), reason })
    }

    /// Creates a key file at `path` (mode `0600`, never over an existing file) holding a fresh
    /// key, and returns the key.
    pub fn create(path: &Path) -> Result<Self, TeeError> {
        let key = Self::generate()?;
        key.write_new(path)?;
        Ok(key)
    }

    /// Writes this key to a new key file at `path` (mode `0600`, never over an existing file),
    /// e.g. a key from [`TeeKey::derive_from_master`] for a trusted component on another host.
    pub fn write_new(&self, path: &Path) -> Result<(), TeeError> {
        write_key_file(path, &self.0)
            .map_err(|reason| TeeError::KeyFile { path: path.to_path_buf(), reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivation_depends_on_master_and_store() {
        let m = MasterKey::from_bytes([7; 32]);
        let s = StoreId([1; 16]);
        let k = TeeKey::derive_from_master(&m, &s);
        assert_eq!(k.expose_bytes(), TeeKey::derive_from_master(&m, &s).expose_bytes());
        assert_ne!(
            k.expose_bytes(),
            TeeKey::derive_from_master(&m, &StoreId([2; 16])).expose_bytes()
        );
        let m2 = MasterKey::from_bytes([8; 32]);
        assert_ne!(k.expose_bytes(), TeeKey::derive_from_master(&m2, &s).expose_bytes());
        assert_eq!(*k.0, *derive_key(&m, &s.0, "blindfold tee v1"));
    }

    #[test]
    fn debug_hides_the_key() {
        let k = TeeKey::from_bytes([0xab; 32]);
        let d = format!("{k:?}");
        assert!(!d.contains("ab") && !d.contains("171"), "{d}");
    }

    #[test]
    fn key_text_is_parsed_strictly() {
        let hex64 = "ab".repeat(32);
        assert_eq!(TeeKey::parse(hex64.as_bytes()).unwrap().expose_bytes(), &[0xab; 32]);
        assert!(TeeKey::parse(format!("{hex64}\n").as_bytes()).is_ok());
        assert!(TeeKey::parse(hex64.to_uppercase().as_bytes()).is_ok());
        let long = format!("{hex64}00");
        let spaced = format!(" {hex64}");
        let zz = "zz".repeat(32);
        let inner_nl = format!("{}\n{}", &hex64[..32], &hex64[32..63]);
        for bad in ["", "ab", &zz, &long, &spaced, &inner_nl, "\u{e9}".repeat(32).as_str()] {
            let err = TeeKey::parse(bad.as_bytes()).unwrap_err();
            assert!(!err.contains("zz") && !err.contains("abab"), "errors do not quote: {err}");
        }
        assert!(TeeKey::parse(&[0xff; 64]).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn key_files_are_private_and_never_overwritten() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tee.key");
        let k = TeeKey::create(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(TeeKey::load(&path).unwrap().expose_bytes(), k.expose_bytes());
        let err = TeeKey::create(&path).unwrap_err().to_string();
        assert!(err.contains("refusing to overwrite"), "{err}");
        assert_eq!(TeeKey::load(&path).unwrap().expose_bytes(), k.expose_bytes(), "unchanged");
        for mode in [0o640, 0o604, 0o644] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = TeeKey::load(&path).unwrap_err().to_string();
            assert!(err.contains("chmod 600"), "{err}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn hostile_key_files_give_errors() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        assert!(TeeKey::load(&dir.path().join("missing")).is_err());
        assert!(TeeKey::load(dir.path()).is_err(), "a directory");
        for (name, body) in [
            ("big", vec![b'a'; 5000]),
            ("short", b"abcd\n".to_vec()),
            ("binary", vec![0u8; 64]),
            ("empty", vec![]),
        ] {
            let p = dir.path().join(name);
            std::fs::write(&p, &body).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            let err = TeeKey::load(&p).unwrap_err();
            assert!(matches!(err, TeeError::KeyFile { .. }), "{name}: {err}");
        }
    }
}
