//! The data directory's secrets: the key check that recognises a key from another store, the
//! keys of a directory (during a key rotation, two), and the S3 credentials.

use std::path::Path;

use crate::datadir::{random_token, read_params};
use crate::{GatewayError, Result};
use blindfold_crypto::{load_key_file, CellAd, CellSealer, MasterKey, Passphrase, StoreId};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
pub(crate) struct Credentials {
    pub(crate) access_key: String,
    pub(crate) secret_key: String,
}

/// File in the data directory holding the key check value: a known text sealed under the key
/// for this store, so a key that does not belong to the directory is recognised at start.
pub const KEY_CHECK_FILE: &str = "key-check.json";

/// What the key check seals. The cell address `u64::MAX` is never an ORAM cell.
const KEY_CHECK_TEXT: &[u8] = b"blindfold key check v1";
const KEY_CHECK_AD: CellAd = CellAd { cell: u64::MAX, version: u64::MAX, segment: u32::MAX };

#[derive(Serialize, Deserialize)]
pub(crate) struct KeyCheck {
    /// The store id (hex) the check is bound to.
    store_id: String,
    /// `KEY_CHECK_TEXT` sealed under the store's cell key (hex).
    sealed: String,
}

pub(crate) fn key_check(key: &MasterKey, store_id: StoreId) -> Result<KeyCheck> {
    let sealed = CellSealer::new(key, store_id, 0)
        .seal(&KEY_CHECK_AD, KEY_CHECK_TEXT)
        .map_err(|e| GatewayError::Config(format!("sealing the key check: {e}")))?;
    Ok(KeyCheck { store_id: store_id.to_hex(), sealed: hex::encode(sealed) })
}

/// Whether `key` opens the key check of the data directory `dir` (true when there is none).
pub(crate) fn key_matches(dir: &Path, key: &MasterKey, store_id: StoreId) -> Result<Option<bool>> {
    let path = dir.join(KEY_CHECK_FILE);
    let raw = match std::fs::read(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(GatewayError::Config(format!("reading {}: {e}", path.display()))),
    };
    let bad = |why: &str| GatewayError::Config(format!("{}: {why}", path.display()));
    let check: KeyCheck = serde_json::from_slice(&raw).map_err(|_| bad("not a key check file"))?;
    if check.store_id != store_id.to_hex() {
        return Err(bad("made for another store (its store id differs from gateway.json)"));
    }
    let sealed = hex::decode(&check.sealed).map_err(|_| bad("not a key check file"))?;
    let opened = CellSealer::new(key, store_id, 0).open(&KEY_CHECK_AD, &sealed);
    Ok(Some(opened.is_ok_and(|t| t == KEY_CHECK_TEXT)))
}

/// The keys of the data directory `dir`, which must hold a store, from its key file
/// `key_path`: the key the file holds, or during a key rotation the new key and the one being
/// retired (see [`crate::rotation::keys`]). Checked against the directory's key check; for
/// commands that seal state of their own (`blindfold user`, `blindfold rotate-key`).
pub fn data_dir_keys(
    dir: &Path,
    key_path: &Path,
    passphrase: Option<&Passphrase>,
) -> Result<crate::rotation::Keys> {
    let params = read_params(dir)?.ok_or_else(|| {
        GatewayError::Config(format!(
            "{} holds no store (no gateway.json): start `blindfold serve` there first",
            dir.display()
        ))
    })?;
    let id = params.store_id()?;
    let loaded = load_key_file(key_path, passphrase).map_err(|e| {
        GatewayError::Config(format!("loading the key {}: {e}", key_path.display()))
    })?;
    let keys = crate::rotation::keys(dir, key_path, loaded, |k| {
        Ok(key_matches(dir, k, id)? == Some(true))
    })?;
    let mut verdict = key_matches(dir, &keys.current, id)?;
    if let (Some(false), Some(old)) = (verdict, &keys.previous) {
        verdict = key_matches(dir, old, id)?;
    }
    if verdict == Some(false) {
        return Err(GatewayError::Config(format!(
            "the key in {} is not the key of {} (its key check does not open)",
            key_path.display(),
            dir.display()
        )));
    }
    Ok(keys)
}

pub(crate) fn read_credentials(path: &Path) -> Result<(String, String)> {
    let raw = std::fs::read(path)
        .map_err(|e| GatewayError::Config(format!("reading {}: {e}", path.display())))?;
    let c: Credentials = serde_json::from_slice(&raw)
        .map_err(|e| GatewayError::Config(format!("{}: {e}", path.display())))?;
    Ok((c.access_key, c.secret_key))
}

pub(crate) fn new_credentials() -> Credentials {
    Credentials {
        access_key: random_token(20, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"),
        secret_key: random_token(
            40,
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
        ),
    }
}
