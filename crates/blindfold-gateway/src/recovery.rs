//! After a lost data directory: `blindfold recover` rebuilds one from the store's newest
//! snapshot and the key; [`write_snapshot`] writes that snapshot at a clean stop.

use std::path::Path;
use std::sync::Arc;

use crate::datadir::{sync_dir, write_private, RECOVERING};
use crate::directory::Directory;
use crate::hooks::{OpenHooks, RecoverHooks};
use crate::open::{open_with, Opened};
use crate::params::ServeConfig;
use crate::{GatewayError, Result};
use blindfold_crypto::load_key_file;
use blindfold_proxy::catalogue::{oram_array, oram_geometry};
use blindfold_store::open_store;

/// Writes the encrypted snapshot of the trusted state to the store. Call with the ORAM
/// committed and checkpointed and no traffic (clean shutdown).
pub async fn write_snapshot(opened: &Opened) -> Result<u64> {
    if let Some(journal) = &opened.journal {
        // The log's own checkpoint: a later `recover` continues it from the log. Then the
        // lease goes, so that the next gateway need not wait for it to lapse.
        journal.stop();
        let seq = crate::snapshot::write_journal_snapshot(
            &opened.snapshots,
            &opened.key,
            &opened.data_dir,
            &opened.objects,
            &journal.log,
            &opened.params,
        )
        .await?;
        journal.release().await?;
        return Ok(seq);
    }
    Ok(crate::snapshot::write_snapshot_to(
        &opened.snapshots,
        &opened.key,
        opened.previous_key.as_deref(),
        &opened.data_dir,
        &opened.objects,
        0,
    )
    .await?
    .0)
}

/// Rebuilds a data directory from the store's newest snapshot and the key, then opens it.
/// Returns the opened gateway and a description of what was done, for the operator.
///
/// The snapshot's tree is not continued but rebuilt ([`blindfold_proxy::rebuild`]): every
/// cell of the snapshot's store array is read and authenticated, and the blocks found are
/// loaded into a fresh tree with fresh random leaves, sealed under a fresh random key epoch,
/// in a new store array (the next [`crate::datadir::GatewayParams`]`::generation`). Objects that had a block in a
/// cell the lost gateway rewrote after the snapshot (or that fails authentication for any
/// other reason) are dropped from the directory and named in the description. The old array
/// is left untouched; the operator can delete it afterwards.
pub async fn recover(cfg: &ServeConfig) -> Result<(Opened, String)> {
    recover_until(cfg, None).await
}

/// The newest snapshot in the store at `url`, and the key it is sealed under: the key in
/// `key_path` (`key`), or, in the middle of a key rotation (the store checkpoints of
/// `--durability store` are then sealed under the new key), the new key waiting beside it as
/// `<key file>.next`. A checkpoint of a rotation under way needs the old key file as
/// `--key-file`: it alone opens the rotation's file. Also returns the key file the recovered
/// gateway is to use: `<key file>.next` when its checkpoint was written once the rotation's
/// sweep had ended (the machine was lost before the new key file replaced the old one).
async fn latest_snapshot(
    url: &blindfold_store::StoreUrl,
    key_path: &Path,
    key: Arc<blindfold_crypto::MasterKey>,
    passphrase: Option<&blindfold_crypto::Passphrase>,
) -> Result<(crate::snapshot::Snapshot, Arc<blindfold_crypto::MasterKey>, std::path::PathBuf)> {
    let read = |key: Arc<blindfold_crypto::MasterKey>| async move {
        let snaps = crate::snapshot::open_for_recovery(url, &key).await?;
        let snap = crate::snapshot::read_latest(&*snaps, &key).await?;
        Ok::<_, GatewayError>((snap, key))
    };
    let first = read(Arc::clone(&key)).await;
    let next_path = crate::rotation::next_key_path(key_path);
    let (snap, read_with) = match first {
        Ok(found) => found,
        Err(e) if next_path.exists() => {
            let next = load_key_file(&next_path, passphrase)
                .map_err(|e| GatewayError::Config(e.to_string()))?;
            read(Arc::new(next)).await.map_err(|_| e)?
        }
        Err(e) => return Err(e),
    };
    if snap.rotation.is_some() && Arc::ptr_eq(&read_with, &key) {
        return Err(GatewayError::Config(format!(
            "the store's newest checkpoint was written during a key rotation, and the key in {} \
             is the new one: give the key file of before the rotation as --key-file (with the \
             new one beside it as {}), which opens what the old key sealed; nothing was changed",
            key_path.display(),
            next_path.display()
        )));
    }
    if snap.rotation.is_none() && !Arc::ptr_eq(&read_with, &key) {
        tracing::warn!(
            "the store's checkpoint is sealed under the key in {} (a key rotation had ended \
             without replacing {}): the recovered gateway uses it; move it over {} once \
             recovered",
            next_path.display(),
            key_path.display(),
            key_path.display()
        );
        return Ok((snap, read_with, next_path));
    }
    Ok((snap, read_with, key_path.to_path_buf()))
}

/// [`recover`] for a gateway whose engine keeps its blocks elsewhere (ORAM nodes): `hooks`
/// rebuild the engine's state from the snapshot and open it (see [`RecoverHooks`]). The
/// directory and the crash-safety are those of [`recover`]: a run cut short at any point is
/// run again (the rebuild hook takes up what its earlier run left in `<data-dir>/oram`).
pub async fn recover_with(cfg: &ServeConfig, hooks: RecoverHooks) -> Result<(Opened, String)> {
    recover_until_with(cfg, hooks, None).await
}

/// Where a test can cut a `recover` short, as a crash at that instant would.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecoverCrash {
    /// A quarter of the new array is written.
    HalfWritten,
    /// The engine's checkpoint names the rebuilt engine; the directory is not restored yet.
    AfterRebuild,
    /// The directory is restored; `gateway.json` is not written yet.
    AfterDirectory,
}

/// [`recover`], stopping as a crash would at `crash` (tests).
#[doc(hidden)]
pub async fn recover_until(
    cfg: &ServeConfig,
    crash: Option<RecoverCrash>,
) -> Result<(Opened, String)> {
    recover_until_with(cfg, RecoverHooks::default(), crash).await
}

/// [`recover_with`], stopping as a crash would at `crash` (tests).
#[doc(hidden)]
pub async fn recover_until_with(
    cfg: &ServeConfig,
    hooks: RecoverHooks,
    crash: Option<RecoverCrash>,
) -> Result<(Opened, String)> {
    let simulated = |at: RecoverCrash| GatewayError::Config(format!("simulated crash at {at:?}"));
    let dir = &cfg.data_dir;
    if dir.join("gateway.json").exists() {
        return Err(GatewayError::Config(format!(
            "{} already holds a gateway; recover into a new, empty directory",
            dir.display()
        )));
    }
    let url = cfg.store.clone().ok_or_else(|| {
        GatewayError::Config("--store is required: recovery reads the store's snapshot".into())
    })?;
    let key_path = cfg.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    let key = Arc::new(
        load_key_file(&key_path, cfg.passphrase.as_deref())
            .map_err(|e| GatewayError::Config(e.to_string()))?,
    );
    let anchor = match &cfg.anchor {
        Some(spec) => Some(crate::anchor::Anchor::open(spec, &key).await?),
        None => None,
    };
    let (snap, key, key_path) =
        latest_snapshot(&url, &key_path, key, cfg.passphrase.as_deref()).await?;
    if let Some(check) = &hooks.check_state {
        check(&snap.oram_checkpoint).map_err(GatewayError::Config)?;
    }
    let cfg_err = |what: &str, p: &Path, e: std::io::Error| {
        GatewayError::Config(format!("{what} {}: {e}", p.display()))
    };
    let oram_dir = dir.join("oram");
    if dir.join(RECOVERING).exists() {
        // An earlier recover stopped half-way: nothing of it is in use yet. (A rebuild hook
        // owns the engine's directory: it takes up what its earlier run left there. A
        // recovery from the store's log rewrites it whole.)
        let engine_dir =
            (hooks.rebuild.is_none() || snap.journal.is_some()).then(|| oram_dir.clone());
        for leftover in engine_dir.into_iter().chain([dir.join("meta.redb")]) {
            let removed = if leftover.is_dir() {
                std::fs::remove_dir_all(&leftover)
            } else {
                std::fs::remove_file(&leftover)
            };
            match removed {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(cfg_err("removing", &leftover, e))
                }
                _ => {}
            }
        }
    }
    std::fs::create_dir_all(&oram_dir).map_err(|e| cfg_err("creating", &oram_dir, e))?;
    write_private(&dir.join(RECOVERING), b"")?;
    let mut params = snap.params.clone();
    params.store = url.to_string();
    // A rebuild moves the engine's cells into the next generation's array: the old one is
    // removed from the store once a checkpoint of the recovered gateway no longer names it.
    let old_array = oram_array(params.generation);
    let replaced = |params: &crate::datadir::GatewayParams| {
        (oram_array(params.generation) != old_array).then(|| old_array.clone())
    };
    // With a log in the store, even an engine whose blocks live elsewhere (ORAM nodes, each
    // logging in its own store) is continued, not rebuilt: its state and every change since
    // are here, and opening it replays them as after a crash.
    if let Some(point) = &snap.journal {
        if snap.reads_ahead_of_log
            && (hooks.rebuild.is_some()
                || hooks.engine_factory.is_some()
                || snap.rotation.is_some())
        {
            return Err(GatewayError::Config(
                "the store's newest checkpoint was written by a gateway that let reads go ahead \
                 of the store-side log, which only a gateway keeping its blocks in this store \
                 and rotating no key may do: this recovery cannot rebuild its tree; nothing was \
                 changed"
                    .into(),
            ));
        }
        let (mut about, reached, ahead) =
            from_store_log(dir, &snap, point, &params, &url, &key, hooks.tail.as_ref(), crash)
                .await?;
        if let Some(why) = ahead {
            // The log may lack the reveal records of the last reads the store saw: continuing
            // the tree would read those blocks again on the same paths. Every block gets a
            // fresh leaf instead.
            let (p, rebuilt) = rebuild_after_log(&params, &url, &oram_dir, &key, crash).await?;
            params = p;
            about.push_str(&format!(
                "; the lost gateway let reads go ahead of the log ({why}), so the tree was \
                 rebuilt with fresh leaves: {rebuilt}"
            ));
        }
        if let Some(rotation) = &snap.rotation {
            // The rotation goes on where the checkpoint left it: the gateway opened next
            // finds its file and opens what the old key sealed with the key file given.
            write_private(&dir.join(crate::rotation::ROTATION_FILE), rotation)?;
            about.push_str("; a key rotation was under way: it resumes when the gateway starts");
        }
        if let Some(anchor) = anchor {
            // Before the directory becomes a gateway: a refused recovery leaves none.
            about.push_str(&match anchor.check(reached).await? {
                Some(r) => format!(
                    "; the anchor at {} agrees (it records {} entries, written {})",
                    anchor.spec(),
                    r.entries,
                    r.when()
                ),
                None => format!("; the anchor at {} was never written", anchor.spec()),
            });
            // The gateway opened next writes it in its turn (a file anchor is locked).
            drop(anchor);
        }
        let mut cfg = cfg.clone();
        if cfg.durability == crate::params::Durability::Auto {
            // The store held a log: keep logging there.
            cfg.durability = crate::params::Durability::Store;
        }
        let retired = replaced(&params);
        let opened = finish(&cfg, &params, key_path, hooks.engine_factory, retired).await?;
        return Ok((opened, about));
    }
    if let Some(anchor) = anchor {
        // No log to replay: the checkpoint must reach as far as the anchor says.
        anchor.check(snap.journal.as_ref().map_or(0, |p| p.next_entry)).await?;
    }
    let (lost, about_engine) = match hooks.rebuild {
        Some(rebuild) => {
            // The engine's blocks are not in this store: no array is read or written.
            let rebuilt =
                rebuild(oram_dir.clone(), snap.oram_checkpoint.clone(), Arc::clone(&key)).await?;
            let about = format!("{} blocks; {}", rebuilt.blocks_found, rebuilt.summary);
            (rebuilt.lost, about)
        }
        None => {
            let (p, rebuilt, about) =
                rebuild_in_store(&params, &url, &oram_dir, &snap.oram_checkpoint, &key, crash)
                    .await?;
            params = p;
            (rebuilt.lost, about)
        }
    };
    if crash == Some(RecoverCrash::AfterRebuild) {
        return Err(simulated(RecoverCrash::AfterRebuild));
    }
    // Objects and uploads with a lost block are dropped: reading them would give zeros.
    let lost: std::collections::HashSet<u64> = lost.into_iter().collect();
    let mut directory = snap.directory;
    let mut dropped = Vec::new();
    let mut freed = Vec::new();
    directory.objects.retain(|(bucket, key, meta)| {
        let keep = !meta.blocks().any(|b| lost.contains(&b));
        if !keep {
            dropped.push(format!("{bucket}/{key}"));
            freed.extend(meta.blocks());
        }
        keep
    });
    // Noncurrent versions with a lost block go the same way (a delete marker holds none).
    directory.versions.retain(|(bucket, key, _, v)| {
        let Some(meta) = &v.object else { return true };
        let keep = !meta.blocks().any(|b| lost.contains(&b));
        if !keep {
            dropped.push(format!("{bucket}/{key} (version {})", v.version_id));
            freed.extend(meta.blocks());
        }
        keep
    });
    directory.uploads.retain(|(_, up)| {
        let keep = !up.parts.values().any(|p| p.extent.blocks.iter().any(|b| lost.contains(b)));
        if !keep {
            freed.extend(up.parts.values().flat_map(|p| p.extent.blocks.iter().copied()));
        }
        keep
    });
    directory.free.extend(freed);
    directory.free.sort_unstable();
    directory.free.dedup();
    Directory::restore(&dir.join("meta.redb"), params.blocks, &directory, &key)?;
    if crash == Some(RecoverCrash::AfterDirectory) {
        return Err(simulated(RecoverCrash::AfterDirectory));
    }
    let when = crate::directory::written_at(snap.created_ns);
    let mut about = format!(
        "snapshot #{} written {} ({} buckets, {} objects); rebuilt {about_engine}",
        snap.seq,
        when,
        directory.buckets.len(),
        directory.objects.len(),
    );
    if !dropped.is_empty() {
        about.push_str(&format!("; {} objects held a lost block and are lost", dropped.len()));
        for name in dropped.iter().take(20) {
            about.push_str(&format!("\n    lost: {name}"));
        }
        if dropped.len() > 20 {
            about.push_str(&format!("\n    … and {} more", dropped.len() - 20));
        }
    }
    let retired = replaced(&params);
    let opened = finish(cfg, &params, key_path, hooks.engine_factory, retired).await?;
    Ok((opened, about))
}

/// The last steps of a recovery: `gateway.json` makes the directory a gateway (written
/// atomically), the marker of a recovery under way goes, and the gateway is opened with the
/// key at `key_path`. `retired`, the store array a rebuild replaced, is listed for removal
/// once `gateway.json` names its successor ([`crate::datadir::retire`]): the gateway's next
/// store checkpoint removes it.
async fn finish(
    cfg: &ServeConfig,
    params: &crate::datadir::GatewayParams,
    key_path: std::path::PathBuf,
    engine_factory: Option<crate::hooks::EngineFactory>,
    retired: Option<String>,
) -> Result<Opened> {
    let dir = &cfg.data_dir;
    write_private(&dir.join("gateway.json"), &serde_json::to_vec_pretty(params).expect("json"))?;
    sync_dir(dir)?;
    if let Some(name) = retired {
        crate::datadir::retire(dir, name)?;
    }
    let marker = dir.join(RECOVERING);
    std::fs::remove_file(&marker)
        .map_err(|e| GatewayError::Config(format!("removing {}: {e}", marker.display())))?;
    let mut cfg = cfg.clone();
    cfg.key_file = Some(key_path);
    open_with(&cfg, OpenHooks { engine_factory, ..Default::default() }).await
}

/// Rebuilds the data directory `cfg.data_dir` from a store checkpoint `snap` and the
/// store-side log after it (`--durability store`): the engine's checkpoint file, its redo log
/// (what it held at the checkpoint, then every frame logged since), and the directory (the
/// checkpoint's, then every operation logged since). The engine's cells stay where they are,
/// in the same array: opening the directory replays the redo log as after a crash, reading
/// again exactly the paths the store already saw. Reads the log 64 cells at a time; writes
/// nothing to the store (a run cut short is simply run again). A standby's `tail` of the log
/// ([`crate::feed::Tail`]) continues it. Returns what was done, the number of the first log
/// entry it does not hold (for the anchor's check), and why the tree must be rebuilt, if it
/// must: reads may have gone ahead of what the store and the tail hold.
#[allow(clippy::too_many_arguments)]
async fn from_store_log(
    dir: &Path,
    snap: &crate::snapshot::Snapshot,
    point: &crate::storelog::JournalPoint,
    params: &crate::datadir::GatewayParams,
    url: &blindfold_store::StoreUrl,
    key: &blindfold_crypto::MasterKey,
    tail: Option<&crate::feed::Tail>,
    crash: Option<RecoverCrash>,
) -> Result<(String, u64, Option<String>)> {
    use std::io::Write;
    let io = |what: &str, p: &Path, e: std::io::Error| {
        GatewayError::Config(format!("{what} {}: {e}", p.display()))
    };
    let oram_dir = dir.join("oram");
    write_private(&oram_dir.join(blindfold_proxy::state_file::CHECKPOINT), &snap.oram_checkpoint)?;
    let log_path = oram_dir.join(blindfold_proxy::state_file::REDO_LOG);
    write_private(&log_path, &point.redo_log)?;
    let mut redo = std::fs::OpenOptions::new()
        .append(true)
        .open(&log_path)
        .map_err(|e| io("opening", &log_path, e))?;
    let directory =
        Directory::restore(&dir.join("meta.redb"), params.blocks, &snap.directory, key)?;
    let ring = crate::storelog::open_ring(url, point.cells).await?;
    let (mut frames, mut transactions) = (0u64, 0u64);
    // Whether reads may have gone ahead of what the store holds: on the checkpoint's word,
    // then on each `Standby` entry's (`Some(None)`: a session whose id the log after the
    // checkpoint has not named yet).
    let mut standby: Option<Option<u64>> = snap.reads_ahead_of_log.then_some(None);
    let mut apply = |entry: crate::storelog::Entry| -> Result<()> {
        match entry {
            crate::storelog::Entry::Engine(f) => {
                for frame in f {
                    redo.write_all(&frame).map_err(|e| io("writing", &log_path, e))?;
                    frames += 1;
                }
            }
            crate::storelog::Entry::Directory(ops) => {
                directory.apply(crate::directory::decode_ops(&ops)?)?;
                transactions += 1;
            }
            crate::storelog::Entry::Standby(session) => standby = session.map(Some),
        }
        Ok(())
    };
    let entries = crate::storelog::replay(&*ring, key, point, |_, entry| apply(entry)).await?;
    let mut reached = point.next_entry + entries;
    let mut from_tail = 0u64;
    if let Some(t) = tail {
        // The standby's tail continues the store's log where it ends. Starting beyond that
        // end, it would prove that the store lost entries it had been seen to hold.
        if t.base > reached {
            return Err(GatewayError::Corrupt(format!(
                "the store's log ends at entry {reached}, but the primary had told this standby \
                 that the store held every entry below {}: the store lost or withheld \
                 acknowledged entries (rolled back?)",
                t.base
            )));
        }
        let skip = (reached - t.base) as usize;
        for e in t.entries.iter().skip(skip) {
            apply(crate::storelog::decode_entry(e)?)?;
            from_tail += 1;
        }
        reached += from_tail;
    }
    // An engine whose reads always wait for the log (the partition engines, `tee`) left no
    // read the store saw without its reveal, whatever the gateway was told.
    if !blindfold_proxy::lifecycle::reads_go_ahead(params.engine) {
        standby = None;
    }
    let ahead = match standby {
        None => None,
        Some(Some(s)) if tail.is_some_and(|t| t.session == s) => None,
        Some(None) => Some(
            "--reads-ahead-of-log, or on the word of a standby whose copy of the log's tail this \
             recovery does not have"
                .to_string(),
        ),
        Some(Some(_)) => Some(
            "on the word of a standby that held the log's tail; this recovery does not have it"
                .to_string(),
        ),
    };
    redo.sync_all().map_err(|e| io("syncing", &log_path, e))?;
    drop(directory);
    sync_dir(&oram_dir)?;
    if crash == Some(RecoverCrash::AfterDirectory) {
        return Err(GatewayError::Config("simulated crash at AfterDirectory".into()));
    }
    let when = crate::directory::written_at(snap.created_ns);
    let tail_note = if tail.is_some() {
        format!(" and {from_tail} more from this standby's copy of the log's tail")
    } else {
        String::new()
    };
    let about = format!(
        "store checkpoint #{} written {when} ({} buckets, {} objects), then {entries} entries \
         of the store-side log{tail_note} ({frames} engine records, {transactions} directory \
         transactions): every acknowledged write is back; the engine's cells stay in store \
         array {}",
        snap.seq,
        snap.directory.buckets.len(),
        snap.directory.objects.len(),
        oram_array(params.generation),
    );
    Ok((about, reached, ahead))
}

/// After [`from_store_log`] for a gateway that let reads go ahead of the log: opens the engine
/// on its array, which replays the log's records as after a crash (reading again exactly the
/// paths they name, which the store saw), stops it cleanly, then rebuilds its tree into the
/// next generation's array with fresh leaves under a fresh key epoch ([`rebuild_in_store`]).
/// Nothing goes to the store-side log: a run cut short is run again from the store's
/// checkpoint and log, which still name the old array. Returns the new parameters and what
/// was done.
async fn rebuild_after_log(
    params: &crate::datadir::GatewayParams,
    url: &blindfold_store::StoreUrl,
    oram_dir: &Path,
    key: &blindfold_crypto::MasterKey,
    crash: Option<RecoverCrash>,
) -> Result<(crate::datadir::GatewayParams, String)> {
    let array = oram_array(params.generation);
    let geometry = oram_geometry(params)?;
    let store = open_store(url, &array, geometry)
        .await
        .map_err(|e| GatewayError::Config(format!("opening store array {array}: {e}")))?;
    let same = |tee| tee;
    let engine_store = blindfold_proxy::catalogue::EngineStore {
        store,
        url,
        array: &array,
        geometry,
        wrap_tee: &same,
    };
    let (engine, _) =
        blindfold_proxy::lifecycle::open_engine(params, oram_dir, engine_store, key, None, false)
            .await?;
    engine.shutdown().await?;
    drop(engine);
    let ckpt_path = oram_dir.join(blindfold_proxy::state_file::CHECKPOINT);
    let checkpoint = std::fs::read(&ckpt_path)
        .map_err(|e| GatewayError::Config(format!("reading {}: {e}", ckpt_path.display())))?;
    let (new_params, rebuilt, about) =
        rebuild_in_store(params, url, oram_dir, &checkpoint, key, crash).await?;
    // Every cell the replayed engine names must open under the versions it keeps: one that
    // does not was altered or lost by the store. (Blocks named by no cell are no damage: a
    // reveal replayed from the log gives a block a leaf even when the write that followed
    // never committed, and such a block was never anywhere; the new tree holds zeros for
    // it, as the old one read.)
    if !rebuilt.unreadable_cells.is_empty() {
        return Err(GatewayError::Corrupt(format!(
            "{} cells of store array {array} failed authentication while the tree was rebuilt \
             (the store altered or lost them; the first is cell {}); the recovery stopped \
             before the data directory became a gateway — run `blindfold recover` again once \
             the store is repaired",
            rebuilt.unreadable_cells.len(),
            rebuilt.unreadable_cells[0]
        )));
    }
    Ok((new_params, about))
}

/// The rebuild of an engine whose blocks are in the store: from the snapshot's array into
/// the next generation's. Returns the new parameters, what the rebuild found and what was done.
async fn rebuild_in_store(
    params: &crate::datadir::GatewayParams,
    url: &blindfold_store::StoreUrl,
    oram_dir: &Path,
    checkpoint: &[u8],
    key: &blindfold_crypto::MasterKey,
    crash: Option<RecoverCrash>,
) -> Result<(crate::datadir::GatewayParams, blindfold_proxy::rebuild::Rebuilt, String)> {
    let mut params = params.clone();
    let old_array = oram_array(params.generation);
    params.generation = params
        .generation
        .checked_add(1)
        .ok_or_else(|| GatewayError::Config("store array generations exhausted".into()))?;
    let new_array = oram_array(params.generation);
    let geometry = oram_geometry(&params)?;
    let open_array = |name: String| {
        let url = url.clone();
        async move {
            open_store(&url, &name, geometry)
                .await
                .map_err(|e| GatewayError::Config(format!("opening store array {name}: {e}")))
        }
    };
    let old = open_array(old_array.clone()).await?;
    let new = open_array(new_array.clone()).await?;
    let new = match crash {
        Some(RecoverCrash::HalfWritten) => crate::grow::cut_short(new),
        _ => new,
    };
    write_private(&oram_dir.join("checkpoint.bin"), checkpoint)?;
    let epoch = blindfold_proxy::rebuild::fresh_epoch();
    let rebuilt =
        blindfold_proxy::lifecycle::rebuild(&params, oram_dir, old, new, key, epoch).await?;
    let mut about = format!(
        "{} blocks into store array {new_array} under a fresh key epoch; the old array \
         {old_array} is removed from the store once the recovered gateway's first store \
         checkpoint is in it",
        rebuilt.blocks_found
    );
    if rebuilt.set_aside_bytes > 0 {
        about.push_str(&format!(
            "; the blocks did not fit in --rebuild-memory ({}): {} of them waited, sealed, on \
             this disk, and are removed",
            crate::params::human_bytes(blindfold_proxy::rebuild::memory_limit()),
            crate::params::human_bytes(rebuilt.set_aside_bytes)
        ));
    }
    if !rebuilt.unreadable_cells.is_empty() {
        about.push_str(&format!(
            "; {} cells changed after the snapshot (the gateway wrote after its last clean \
             stop) or failed authentication",
            rebuilt.unreadable_cells.len()
        ));
    }
    Ok((params, rebuilt, about))
}
