//! Helpers shared by the gateway's integration tests (each test binary uses some of them).
#![allow(dead_code)]

use blindfold_gateway::server::{self, OramEngine, ServeConfig};
use blindfold_store::StoreUrl;

/// A small gateway (1 MiB of 1 KiB blocks, no cached levels) over a file store, everything
/// under `root`.
pub fn file_cfg(root: &std::path::Path, engine: OramEngine) -> ServeConfig {
    ServeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: root.join("data"),
        store: Some(StoreUrl::File {
            dir: root.join("cells"),
            sync: blindfold_store::SyncMode::OnFlush,
        }),
        key_file: Some(root.join("key.json")),
        passphrase: None,
        credentials: Some(("ak".into(), "sk".into())),
        capacity: 1 << 20,
        block_size: 1024,
        pad_objects: false,
        cache_mib: 0,
        engine,
        in_place: false,
    }
}

/// The whole of object `key` in bucket `b`, or the error that stopped the read.
pub async fn read_object(opened: &server::Opened, key: &str) -> Result<Vec<u8>, String> {
    let meta = opened.objects.directory().object("b", key).unwrap().expect("object");
    let mut rx =
        opened.objects.read_range(&meta, 0..meta.size, 0).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    while let Some(c) = rx.recv().await {
        out.extend_from_slice(&c.map_err(|e| e.to_string())?);
    }
    Ok(out)
}
