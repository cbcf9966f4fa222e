//! `blindfold status`: what a data directory holds, from its trusted state alone.

use std::path::PathBuf;

use anyhow::{bail, Result};
use blindfold_crypto::load_key_file;
use clap::Args;

use crate::commands::data_dir::CLEAN_STOP_FILE;
use crate::commands::passphrase::read_passphrase;

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Trusted state directory.
    #[arg(long, default_value = "blindfold-data", env = "BLINDFOLD_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Key file (the directory database is sealed under it); default `<data-dir>/key.json`.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// The key file is protected by a passphrase: read it from $BLINDFOLD_PASSPHRASE, or else
    /// one line of standard input.
    #[arg(long)]
    pub passphrase: bool,
}

pub fn run(a: StatusArgs) -> Result<()> {
    use blindfold_gateway::server::{footprint, human_bytes, read_params};
    let dir = &a.data_dir;
    let Some(p) = read_params(dir)? else {
        bail!("{} is not a blindfold data directory (no gateway.json)", dir.display());
    };
    let f = footprint(&p)?;
    println!("blindfold status {}", dir.display());
    println!(
        "  store: {} ({} engine, {})",
        p.store,
        p.engine,
        if p.two_slots() { p.layout() } else { "cells overwritten in place".into() }
    );
    println!(
        "  capacity: {} ({} blocks of {} bytes, Z = {}{}{})",
        human_bytes(f.capacity_bytes),
        f.blocks,
        f.block_size,
        p.z,
        p.cache_summary().map(|c| format!(", {c} in memory")).unwrap_or_default(),
        if p.pad_objects { ", object sizes padded" } else { "" }
    );
    println!(
        "  store use: up to {}; trusted memory: about {}",
        human_bytes(f.store_bytes),
        human_bytes(f.trusted_bytes)
    );
    if let Some((objects, buckets)) = p.tao_path_objects() {
        println!(
            "  an access reads and writes {objects} store object(s) ({buckets} bucket(s) of its \
             path below the cached top)"
        );
    }
    let key_path = a.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    let pass = if a.passphrase { Some(read_passphrase()?) } else { None };
    let opened = load_key_file(&key_path, pass.as_ref())
        .map_err(|e| anyhow::anyhow!("{e}"))
        .and_then(|key| {
            blindfold_gateway::Directory::open(&dir.join("meta.redb"), p.blocks, &key)
                .map_err(|e| anyhow::anyhow!("{e}"))
        });
    match opened {
        Ok(d) => {
            let (buckets, objects) = d.counts()?;
            let used = p.blocks - d.free_blocks();
            println!(
                "  used: {} of {} blocks ({:.1}%), {buckets} buckets, {objects} objects",
                used,
                p.blocks,
                100.0 * used as f64 / p.blocks as f64
            );
        }
        Err(e) => println!("  used: unknown ({e}; is a gateway running on it?)"),
    }
    match std::fs::read_to_string(dir.join(CLEAN_STOP_FILE)) {
        Ok(t) => println!("  last clean stop: {}", t.trim()),
        Err(_) => println!(
            "  last clean stop: none since the last start (running now, or it stopped \
             uncleanly: the next start replays the redo log)"
        ),
    }
    if dir.join(blindfold_gateway::rotation::ROTATION_FILE).exists() {
        println!(
            "  key rotation: under way (`blindfold serve` re-seals the cells while it serves, \
             then replaces the key file; keep the key file and its .next until then)"
        );
    }
    if dir.join(blindfold_gateway::grow::INTENT_FILE).exists() {
        println!(
            "  growth: under way, or interrupted (a running gateway finishes it; otherwise the \
             next start of `blindfold serve` or `blindfold grow` does)"
        );
    }
    Ok(())
}
