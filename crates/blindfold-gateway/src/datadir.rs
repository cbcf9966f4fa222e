//! The data directory's files and the small helpers that write them safely.
//!
//! ```text
//! <data-dir>/
//!   key.json           master key (0600) — losing it loses the data
//!   credentials.json   S3 access key and secret (0600), generated on first start if not given
//!   gateway.json       public parameters fixed at creation (store URL, block size, capacity, …);
//!                      written last on first start: its presence marks a directory holding a store
//!   key-check.json     a known text sealed under the key: recognises a key from another store
//!   meta.redb          the directory (buckets, objects, uploads, block allocator)
//!   oram/              ORAM trusted state: checkpoint.bin, redo.log
//!   cells/             the default untrusted store (file backend): oram.cells
//! ```

use std::path::{Path, PathBuf};

use crate::{GatewayError, Result};
use blindfold_proxy::catalogue::PARAMS_VERSION;
use blindfold_store::StoreUrl;

/// The public parameters of a data directory (its `gateway.json`): see
/// [`blindfold_proxy::EngineParams`].
pub type GatewayParams = blindfold_proxy::EngineParams;

/// A key rotation in progress, in the data directory: the new key and the sweep's progress,
/// sealed under the old key (see [`crate::rotation`]; store checkpoints carry it too).
pub const ROTATION_FILE: &str = "rotation.sealed";

/// Writes `bytes` to `path` atomically and durably: a private (0600) temporary file beside it,
/// fsync, rename, then an fsync of the directory.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| GatewayError::Config(format!("writing {}: {e}", tmp.display())))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| GatewayError::Config(format!("writing {}: {e}", tmp.display())))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| GatewayError::Config(format!("writing {}: {e}", path.display())))?;
    sync_parent(path)
}

/// Fsyncs the directory holding `path`, so that a rename or removal there is durable.
pub(crate) fn sync_parent(path: &Path) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(parent)
        .and_then(|d| d.sync_all())
        .map_err(|e| GatewayError::Config(format!("syncing {}: {e}", parent.display())))
}

pub(crate) fn random_token(len: usize, alphabet: &[u8]) -> String {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    (0..len).map(|_| alphabet[rng.gen_range(0..alphabet.len())] as char).collect()
}

/// Reads `<dir>/gateway.json`, if there is one.
pub fn read_params(dir: &Path) -> Result<Option<GatewayParams>> {
    let path = dir.join("gateway.json");
    let raw = match std::fs::read(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(GatewayError::Config(format!("reading {}: {e}", path.display()))),
    };
    serde_json::from_slice(&raw)
        .map_err(|e| GatewayError::Config(format!("{}: {e}", path.display())))
        .and_then(|p: GatewayParams| {
            if p.format != "blindfold-gateway" {
                return Err(GatewayError::Config(format!(
                    "{}: not a blindfold gateway's parameters (format {:?})",
                    path.display(),
                    p.format
                )));
            }
            if p.version == 0 || p.version > PARAMS_VERSION {
                return Err(GatewayError::Config(format!(
                    "{}: format version {} was made by a newer blindfold (this one, {}, reads \
                     versions 1 to {PARAMS_VERSION}); run the newer version",
                    path.display(),
                    p.version,
                    env!("CARGO_PKG_VERSION")
                )));
            }
            Ok(Some(p))
        })
}

/// Marks a data directory that `recover` is filling; removed (with `gateway.json` written)
/// when it is done. A directory with this mark and no `gateway.json` holds a half-made
/// recovery, which the next `recover` clears and starts again.
pub(crate) const RECOVERING: &str = "recovering";

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| GatewayError::Config(format!("syncing {}: {e}", dir.display())))
}

/// Store arrays a growth or a recovery's rebuild replaced, removed once a snapshot of the new
/// state is in the store (until then `recover` may need them).
pub const RETIRED_FILE: &str = "retired-arrays.json";

pub(crate) fn read_retired(dir: &Path) -> Vec<String> {
    std::fs::read(dir.join(RETIRED_FILE))
        .ok()
        .and_then(|raw| serde_json::from_slice(&raw).ok())
        .unwrap_or_default()
}

/// Records that the store array `name` is no longer used (after `gateway.json` names its
/// successor: never before, or a crash could leave the live array listed).
pub(crate) fn retire(dir: &Path, name: String) -> Result<()> {
    let mut names = read_retired(dir);
    if !names.contains(&name) {
        names.push(name);
        write_private(&dir.join(RETIRED_FILE), &serde_json::to_vec_pretty(&names).expect("json"))?;
    }
    Ok(())
}

/// After a snapshot naming only the arrays `in_use` is in the store: removes the retired
/// arrays (and `replaced`, the snapshot array the index named before) where the store can.
/// Returns the names removed. Failures are logged, never fatal: the arrays only take room.
pub(crate) async fn remove_retired(
    dir: &Path,
    url: &StoreUrl,
    replaced: Option<&str>,
    in_use: &[String],
) -> Vec<String> {
    let mut names = read_retired(dir);
    names.extend(replaced.map(str::to_owned));
    names.retain(|n| !in_use.contains(n));
    if names.is_empty() {
        return Vec::new();
    }
    let mut removed = Vec::new();
    for name in &names {
        match blindfold_store::remove_array(url, name).await {
            Ok(true) => removed.push(name.clone()),
            Ok(false) => tracing::info!(
                array = %name,
                "no longer used (a growth or a recovery's rebuild replaced it), and nothing \
                 was removed: this kind of store (Redis, a storage server) cannot remove an \
                 array, or it was gone already; delete it from the store if it is still there"
            ),
            Err(e) => tracing::warn!(error = %e, array = %name, "an unused array was not removed"),
        }
    }
    if let Err(e) = std::fs::remove_file(dir.join(RETIRED_FILE)) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(error = %e, "{RETIRED_FILE} was not removed");
        }
    }
    removed
}
