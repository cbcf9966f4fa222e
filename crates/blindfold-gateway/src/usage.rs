//! How full a running gateway is ([`Usage`]), gathered for the metrics and the dashboard, and
//! told to `blindfold status`, which cannot read the directory database while the gateway
//! holds it.
//!
//! `status` asks as `blindfold grow` does, through the data directory: it writes
//! [`REQUEST_FILE`]; the gateway checks for one every second and answers in [`ANSWER_FILE`],
//! sealed under the master key (object counts and sizes derive from user data, and everything
//! of that kind in the data directory is sealed), then removes the request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blindfold_crypto::{MasterKey, StateSealer};

use crate::datadir::write_private;
use crate::objects::ObjectLayer;
pub use crate::observe::Usage;
use crate::{GatewayError, Result};

/// `blindfold status` asks a running gateway with this file.
pub const REQUEST_FILE: &str = "status-request";
/// The gateway's answer to [`REQUEST_FILE`] (a sealed [`Usage`]), written before the request
/// is removed.
pub const ANSWER_FILE: &str = "status-answer.sealed";
/// Binds a sealed answer to its purpose.
const AAD: &[u8] = b"blindfold status answer v1";

/// Free and total bytes of the file system holding `dir` (for the gateway's user, as `df`
/// shows them), or `None` if it cannot be asked.
pub fn disk_space(dir: &Path) -> Option<(u64, u64)> {
    crate::space::disk_space(dir).ok()
}

/// How full the gateway of `objects` is now, with its data directory `data_dir` and the
/// certificate of `tls`.
pub fn gather(objects: &ObjectLayer, data_dir: &Path, tls: Option<&crate::tls::Tls>) -> Usage {
    let d = objects.directory();
    let capacity = d.capacity();
    let totals = d.object_totals().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot count the objects");
        Default::default()
    });
    let disk = disk_space(data_dir);
    Usage {
        blocks_used: capacity.saturating_sub(d.free_blocks()),
        blocks_capacity: capacity,
        block_size: objects.block_size() as u32,
        objects: totals.objects,
        object_bytes: totals.bytes,
        data_dir_free_bytes: disk.map(|d| d.0),
        data_dir_size_bytes: disk.map(|d| d.1),
        tls_not_after: tls.and_then(crate::tls::Tls::not_after),
    }
}

/// Answers `blindfold status` for a running gateway until `stop` turns true: a
/// [`REQUEST_FILE`] in `data_dir`, checked every second.
pub async fn answer_requests(
    objects: Arc<ObjectLayer>,
    data_dir: PathBuf,
    key: Arc<MasterKey>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let sealer = StateSealer::new(&key);
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        let request = data_dir.join(REQUEST_FILE);
        if !request.exists() {
            continue;
        }
        let usage = gather(&objects, &data_dir, None);
        let answered = sealer
            .seal(AAD, &serde_json::to_vec(&usage).expect("usage serializes"))
            .map_err(|e| GatewayError::Config(format!("sealing the status answer: {e}")))
            .and_then(|sealed| write_private(&data_dir.join(ANSWER_FILE), &sealed))
            .and_then(|()| {
                std::fs::remove_file(&request).map_err(|e| {
                    GatewayError::Config(format!("removing {}: {e}", request.display()))
                })
            });
        if let Err(e) = answered {
            tracing::warn!(error = %e, "could not answer blindfold status");
        }
    }
}

/// Opens an answer read from [`ANSWER_FILE`] with the master key.
pub fn open_answer(sealed: &[u8], key: &MasterKey) -> Result<Usage> {
    let plain = StateSealer::new(key)
        .open(AAD, sealed)
        .map_err(|e| GatewayError::Config(format!("the gateway's status answer: {e}")))?;
    serde_json::from_slice(&plain)
        .map_err(|e| GatewayError::Config(format!("the gateway's status answer: {e}")))
}
