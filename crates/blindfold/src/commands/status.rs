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
        let standby = dir.join(blindfold_gateway::standby::STATUS_FILE);
        if let Ok(text) = std::fs::read_to_string(&standby) {
            println!("blindfold status {}", dir.display());
            println!("  {}", text.trim());
            return Ok(());
        }
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
    match lease(&p.store) {
        Ok(line) => println!("  lease: {line}"),
        Err(e) => println!("  lease: unknown ({e})"),
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

/// Who holds the store's lease (`--durability store`), as the store records it.
fn lease(store: &str) -> Result<String> {
    let url: blindfold_store::StoreUrl = store.parse()?;
    let mut line = String::new();
    crate::commands::runtime::on_one_core(async {
        let leases = blindfold_store::open_lease_store(&url).await?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        line = match leases.inspect(blindfold_gateway::journaling::LEASE).await? {
            None => "never taken (the gateway runs with --durability local)".into(),
            Some(l) if l.is_released() => format!(
                "free: {} gave it up at a clean stop (generation {})",
                l.holder, l.generation
            ),
            Some(l) if l.is_live(now) => format!(
                "held by {} (generation {}), renewed until {:.1} s from now",
                l.holder,
                l.generation,
                (l.expires_unix_ms - now) as f64 / 1000.0
            ),
            Some(l) => format!(
                "lapsed {:.1} s ago: {} (generation {}) stopped renewing it (died?); a standby \
                 or `blindfold recover` may take over",
                (now - l.expires_unix_ms) as f64 / 1000.0,
                l.holder,
                l.generation
            ),
        };
        Ok(())
    })?;
    Ok(line)
}
