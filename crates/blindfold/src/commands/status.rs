//! `blindfold status`: what a data directory holds, from its trusted state alone, or, while a
//! gateway serves from it (and so holds its directory database), as that gateway tells it.

use std::path::PathBuf;

use anyhow::{bail, Result};
use blindfold_crypto::load_key_file;
use clap::Args;

use crate::commands::data_dir::{gateway_running, CLEAN_STOP_FILE};
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
    let feed = dir.join(blindfold_gateway::feed::STATUS_FILE);
    if let (Ok(text), Ok(meta)) = (std::fs::read_to_string(&feed), std::fs::metadata(&feed)) {
        // Rewritten while it changes: an old one is news only while the gateway runs.
        let age = meta.modified().ok().and_then(|m| m.elapsed().ok()).unwrap_or_default();
        println!(
            "  log feed (--standby-listen): {}{}",
            text.trim(),
            if age.as_secs() > 60 {
                format!(" (as of {} s ago, when it last changed)", age.as_secs())
            } else {
                String::new()
            }
        );
    }
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
    let key = load_key_file(&key_path, pass.as_ref()).map_err(|e| anyhow::anyhow!("{e}"));
    let running = gateway_running(dir);
    let usage = key.and_then(|key| {
        if running {
            ask_the_gateway(dir, &key)
        } else {
            let d = blindfold_gateway::Directory::open(&dir.join("meta.redb"), p.blocks, &key)?;
            let (buckets, _) = d.counts()?;
            let totals = d.object_totals()?;
            let disk = blindfold_gateway::usage::disk_space(dir);
            let usage = blindfold_gateway::usage::Usage {
                blocks_used: d.capacity() - d.free_blocks(),
                blocks_capacity: d.capacity(),
                block_size: p.block_size,
                objects: totals.objects,
                object_bytes: totals.bytes,
                data_dir_free_bytes: disk.map(|d| d.0),
                data_dir_size_bytes: disk.map(|d| d.1),
                tls_not_after: None,
            };
            Ok((usage, format!("{buckets} buckets, ")))
        }
    });
    match usage {
        Ok((u, buckets)) => {
            println!(
                "  used: {} of {} blocks ({:.1}%), {buckets}{} objects, {}{}",
                u.blocks_used,
                u.blocks_capacity,
                100.0 * u.blocks_used as f64 / u.blocks_capacity.max(1) as f64,
                u.objects,
                human_bytes(u.object_bytes),
                if running { " (from the running gateway)" } else { "" }
            );
            let free = u.blocks_capacity.saturating_sub(u.blocks_used);
            println!(
                "  room: {} more in whole blocks; a larger write is refused (EntityTooLarge) \
                 until `blindfold grow` raises the capacity",
                human_bytes(free * u64::from(u.block_size))
            );
            if let (Some(free), Some(size)) = (u.data_dir_free_bytes, u.data_dir_size_bytes) {
                println!(
                    "  data directory's disk: {} free of {}",
                    human_bytes(free),
                    human_bytes(size)
                );
            }
        }
        Err(e) if running => println!("  used: unknown (the running gateway did not say: {e})"),
        Err(e) => println!("  used: unknown ({e})"),
    }
    match std::fs::read_to_string(dir.join(CLEAN_STOP_FILE)) {
        Ok(t) => println!("  last clean stop: {}", when(t.trim())),
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

/// How full the store is, asked of the gateway serving from `dir` (see
/// `blindfold_gateway::usage`): it answers within a second or two.
fn ask_the_gateway(
    dir: &std::path::Path,
    key: &blindfold_crypto::MasterKey,
) -> Result<(blindfold_gateway::usage::Usage, String)> {
    use blindfold_gateway::usage::{open_answer, ANSWER_FILE, REQUEST_FILE};
    let (request, answer) = (dir.join(REQUEST_FILE), dir.join(ANSWER_FILE));
    let _ = std::fs::remove_file(&answer);
    std::fs::write(&request, b"")
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", request.display()))?;
    let started = std::time::Instant::now();
    while request.exists() {
        if started.elapsed() > std::time::Duration::from_secs(10) {
            let _ = std::fs::remove_file(&request);
            bail!("no answer within 10 s (is it an older blindfold, or stuck?)");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let sealed =
        std::fs::read(&answer).map_err(|e| anyhow::anyhow!("reading {}: {e}", answer.display()))?;
    let _ = std::fs::remove_file(&answer);
    Ok((open_answer(&sealed, key)?, String::new()))
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

/// A recorded time for people: `2026-11-29 01:40:37 UTC (3 h ago)`. Older data directories
/// recorded it with nanoseconds and an offset; those are shown to the second.
fn when(recorded: &str) -> String {
    use time::format_description::well_known::Rfc3339;
    let Ok(t) = time::OffsetDateTime::parse(recorded, &Rfc3339) else {
        // `2026-11-29 1:40:37.213779 +00:00:00`: drop the fraction.
        return match recorded.split_once('.') {
            Some((head, tail)) => match tail.split_once(' ') {
                Some((_, offset)) => format!("{head} {offset}"),
                None => head.to_owned(),
            },
            None => recorded.to_owned(),
        };
    };
    let t = t.to_offset(time::UtcOffset::UTC);
    let ago = (time::OffsetDateTime::now_utc() - t).whole_seconds().max(0) as u64;
    let ago = match ago {
        0..=119 => format!("{ago} s ago"),
        120..=7199 => format!("{} min ago", ago / 60),
        7200..=172_799 => format!("{} h ago", ago / 3600),
        _ => format!("{} days ago", ago / 86_400),
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC ({ago})",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use super::when;

    #[test]
    fn recorded_times_read_to_the_second() {
        assert!(when("2026-11-29T01:40:37Z").starts_with("2026-11-29 01:40:37 UTC ("));
        assert_eq!(when("2026-11-29 1:40:37.213779 +00:00:00"), "2026-11-29 1:40:37 +00:00:00");
    }
}
