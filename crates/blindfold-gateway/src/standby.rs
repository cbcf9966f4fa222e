//! A standby gateway (`blindfold serve --standby`): it watches the store's lease and follows
//! the store checkpoints and the store-side log of the primary (`--durability store`), and
//! takes over as soon as the primary's lease lapses: it recovers the data directory from the
//! store alone ([`crate::recovery`]), takes the lease under the next generation, and serves.
//!
//! Following the log means reading and authenticating it as recovery will: the standby knows
//! at every moment that a takeover will succeed and how much it will replay, and says so in
//! `<data-dir>/standby-status` (shown by `blindfold status`). It writes nothing to the store
//! while the primary holds the lease.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use blindfold_store::lease::system_clock_ms as now_ms;

use crate::open::Opened;
use crate::params::ServeConfig;
use crate::{GatewayError, Result};

/// The file in which a waiting standby says where it stands.
pub const STATUS_FILE: &str = "standby-status";

/// How often the standby looks at the lease (at most; sooner when it is about to lapse).
const POLL: Duration = Duration::from_millis(500);
/// How often it reads the log through.
const FOLLOW_EVERY: Duration = Duration::from_secs(5);

/// How far the standby is behind the primary: the newest store checkpoint and the entries
/// of the log after it that a takeover replays.
async fn follow(
    url: &blindfold_store::StoreUrl,
    key: &blindfold_crypto::MasterKey,
    on_feed: bool,
) -> Result<String> {
    let snaps = crate::snapshot::open_for_recovery(url, key).await?;
    let mut tries = 0;
    let (snap, entries, started) = loop {
        let snap = crate::snapshot::read_latest(&*snaps, key).await?;
        let Some(point) = &snap.journal else {
            return Ok(format!(
                "store checkpoint #{} has no log after it (the primary runs with --durability \
                 local: a takeover restores that checkpoint only)",
                snap.seq
            ));
        };
        let ring = crate::storelog::open_ring(url, point.cells).await?;
        let started = std::time::Instant::now();
        match crate::storelog::replay(&*ring, key, point, |_, _| Ok(())).await {
            Ok(entries) => break (snap, entries, started),
            Err(e) => {
                // The live primary reuses the log's cells once a newer checkpoint covers them:
                // a read that started from the older checkpoint can meet a cell of the next
                // lap. Only an error that stays once read from the newest one is news.
                let newest = crate::snapshot::read_latest(&*snaps, key).await?.seq;
                tries += 1;
                if newest == snap.seq || tries == 3 {
                    return Err(e);
                }
            }
        }
    };
    let age = (crate::directory::now_ns() - snap.created_ns).max(0) as f64 / 1e9;
    let then = match (snap.reads_ahead_of_log, on_feed) {
        (false, _) => "",
        (true, false) => {
            " and then rebuilds the tree with fresh leaves (the primary reads ahead of the log: \
             the rebuild reads and rewrites the whole store array)"
        }
        (true, true) => {
            " and this standby's copy of the log's tail (the primary's reads go ahead of the \
             store's log on this standby's word: no rebuild, unless the feed broke off and \
             another standby's word counted since)"
        }
    };
    Ok(format!(
        "store checkpoint #{} ({age:.0} s old) and {entries} log entries after it, all \
         authentic (read in {:.2} s): a takeover replays them{then}",
        snap.seq,
        started.elapsed().as_secs_f64()
    ))
}

fn write_status(dir: &Path, text: &str) {
    let _ = crate::datadir::write_private(&dir.join(STATUS_FILE), text.as_bytes());
}

/// Waits as a standby until the primary's lease lapses, then recovers the data directory of
/// `cfg` (which must be empty) from the store and returns it opened, holding the lease, with
/// a description of the takeover. `say` receives what the operator should see.
pub async fn take_over(
    cfg: &ServeConfig,
    say: Arc<dyn Fn(&str) + Send + Sync>,
) -> Result<(Opened, String)> {
    take_over_with(cfg, say, &|| Ok(crate::hooks::RecoverHooks::default())).await
}

/// [`take_over`] for a gateway whose engine keeps its blocks elsewhere (ORAM nodes): `hooks`
/// gives the recovery's hooks, as `blindfold recover` is given them, at each attempt.
pub async fn take_over_with(
    cfg: &ServeConfig,
    say: Arc<dyn Fn(&str) + Send + Sync>,
    hooks: &(dyn Fn() -> Result<crate::hooks::RecoverHooks> + Send + Sync),
) -> Result<(Opened, String)> {
    let dir = &cfg.data_dir;
    if dir.join("gateway.json").exists() {
        return Err(GatewayError::Config(format!(
            "{} already holds a gateway: a standby starts from an empty data directory and fills \
             it when it takes over",
            dir.display()
        )));
    }
    let url = cfg.store.clone().ok_or_else(|| {
        GatewayError::Config("--standby needs --store: the primary's store".into())
    })?;
    let key_path = cfg.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    let key = blindfold_crypto::load_key_file(&key_path, cfg.passphrase.as_deref())
        .map_err(|e| GatewayError::Config(e.to_string()))?;
    blindfold_proxy::make_private(dir)?;
    let leases = blindfold_store::open_lease_store(&url)
        .await
        .map_err(|e| GatewayError::Config(format!("opening the store's lease: {e}")))?;
    let key = Arc::new(key);
    let primary = match &cfg.log_feed {
        Some(crate::feed::LogFeed::Follow(addr)) => Some(addr.clone()),
        _ => None,
    };
    let start_following = || {
        primary.clone().map(|addr| {
            let name = format!("standby {}", dir.display());
            crate::feed::follow(addr, Arc::clone(&key), name)
        })
    };
    let mut follower = start_following();
    let mut followed: Option<std::time::Instant> = None;
    let mut last_said = String::new();
    loop {
        let now = now_ms();
        let lease = match leases.inspect(crate::journaling::LEASE).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "standby: cannot read the store's lease; retrying");
                tokio::time::sleep(POLL).await;
                continue;
            }
        };
        match &lease {
            Some(info) if info.is_live(now) => {
                if followed.is_none_or(|t| t.elapsed() >= FOLLOW_EVERY) {
                    followed = Some(std::time::Instant::now());
                    let behind = follow(&url, &key, follower.is_some()).await.unwrap_or_else(|e| {
                        format!("the store's checkpoint or log cannot be read ({e})")
                    });
                    let feed = follower
                        .as_ref()
                        .map(|f| format!("; {}", f.describe()))
                        .unwrap_or_default();
                    let text = format!(
                        "standby: the primary {} holds the lease (generation {}); {behind}{feed}",
                        info.holder, info.generation
                    );
                    write_status(dir, &text);
                    if text != last_said {
                        say(&text);
                        last_said = text;
                    }
                }
                let until = Duration::from_millis(info.expires_unix_ms.saturating_sub(now));
                tokio::time::sleep(until.min(POLL).max(Duration::from_millis(20))).await;
                continue;
            }
            _ => {}
        }
        let lapsed = std::time::Instant::now();
        say(&match &lease {
            Some(info) => format!(
                "standby: the lease of {} (generation {}) lapsed; taking over",
                info.holder, info.generation
            ),
            None => "standby: no gateway holds the store's lease; taking over".into(),
        });
        let _ = std::fs::remove_file(dir.join(STATUS_FILE));
        let mut cfg = cfg.clone();
        cfg.key_file = Some(key_path.clone());
        // A standby that held the log's tail continues the store's log with it.
        cfg.log_feed = None;
        let tail = follower.take().and_then(|f| f.stop());
        let mut recover_hooks = hooks()?;
        recover_hooks.tail = tail;
        match crate::recovery::recover_with(&cfg, recover_hooks).await {
            Ok((opened, about)) => {
                let took = lapsed.elapsed().as_secs_f64();
                return Ok((opened, format!("took over in {took:.2} s: restored {about}")));
            }
            Err(e) if e.to_string().contains("another gateway") => {
                // Another standby was faster: back to waiting, from an empty directory.
                say(&format!("standby: {e}; waiting again"));
                follower = start_following();
                for entry in std::fs::read_dir(dir)
                    .map_err(|e| GatewayError::Config(format!("reading {}: {e}", dir.display())))?
                {
                    let path = entry.map_err(|e| GatewayError::Config(e.to_string()))?.path();
                    if path == key_path {
                        continue;
                    }
                    let _ = if path.is_dir() {
                        std::fs::remove_dir_all(&path)
                    } else {
                        std::fs::remove_file(&path)
                    };
                }
            }
            Err(e) => return Err(e),
        }
    }
}
