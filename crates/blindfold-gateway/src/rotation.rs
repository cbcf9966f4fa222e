//! Master-key rotation (`blindfold rotate-key`): every cell, and every file of the data
//! directory sealed under the master key, re-sealed under a new one while the gateway serves.
//!
//! # How it goes
//!
//! 1. `blindfold rotate-key` (gateway stopped or running) makes the new key and writes it as a
//!    key file beside the current one (`<key file>.next`, raw or under a new passphrase), reads
//!    it back, and then writes [`ROTATION_FILE`] into the data directory: the new key and the
//!    sweep's progress, sealed under the **old** key's state key. From that instant the
//!    rotation exists; before it, nothing changed (a leftover `.next` is replaced by the next
//!    `rotate-key`).
//! 2. The next `blindfold serve` (a restart, when one was running) finds the file, opens it
//!    with the key it loaded, and from then on seals everything under the new key while still
//!    opening what the old one sealed: the directory database, the users file and the key check
//!    are re-sealed at once (each atomically), the engine's checkpoint and log are written under
//!    the new key as it opens, and every cell an access writes is sealed under the new key.
//! 3. While it serves, a background task sweeps the ORAM **twice**: it reads and writes back
//!    every path in a fixed order, a few at a time, commits, and records how far it got in the
//!    rotation file; then it does it all again. A crash resumes the sweep from the last
//!    recorded point. One pass re-seals every cell's committed copy; the second is for the
//!    copies the first left behind: a store of two slots per cell (and a partition engine's
//!    two top-level areas, or two copies of each bucket) keeps the copy a commit replaced in
//!    the other slot, and one pass writes one slot of each cell. A cell written in two commits
//!    after the rotation began has both its slots under the new key (see `docs/design.md`,
//!    "Key rotation", for why this never overwrites a copy a crash could still need).
//! 4. When both passes are committed, the snapshot area of the store is cleared: every cell
//!    of both snapshot slots is overwritten, in cell order, with zeros sealed under the new key
//!    and bound to no snapshot, and the snapshot index is sealed under the new key. Snapshot
//!    arrays and ORAM arrays that growths retired are removed where the store can. (The next
//!    clean stop writes the first snapshot under the new key.)
//! 5. Then no cell, log record or local file is sealed under the old key any more. The task
//!    renames `<key file>.next` over the key file (the old key is gone from the disk) and
//!    removes the rotation file, the only file the old key sealed. A crash between the two
//!    leaves a rotation file that the new key cannot open next to a key check that it can:
//!    the next start removes it. A crash anywhere before resumes the sweep, or repeats step 4
//!    (which writes the same thing again).
//!
//! # What the store learns
//!
//! That a rotation is under way and how fast it goes: the sweep's reads and writes are of
//! paths fixed in advance (leaf 0, 1, 2, … of each tree, twice), interleaved with ordinary
//! accesses, whose leaves stay fresh and uniform because a sweep neither reads nor changes any
//! block's leaf. Clearing the snapshot area writes every one of its cells once, in cell order:
//! a number fixed by the area's size. Cells carry their key epoch in the clear, as always; the
//! epochs after the rotation are simply larger.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blindfold_crypto::{create_key_file, load_key_file, MasterKey, Passphrase, StateSealer};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::datadir::{read_params, sync_parent, write_private};
use crate::engine::SharedEngine;
use crate::error::GatewayError;
use crate::snapshot::SnapshotSlot;
use blindfold_proxy::catalogue::oram_array;

type Result<T> = std::result::Result<T, GatewayError>;

pub use crate::datadir::ROTATION_FILE;
/// Associated data of the sealed rotation file.
const AAD: &[u8] = b"blindfold rotation v1";
/// Paths swept between two commits (and progress records).
const SWEEP_CHUNK: u64 = 16;

#[derive(Serialize, Deserialize)]
struct Doc {
    /// The new master key, hex.
    new_key: String,
    /// Paths of the sweep committed so far, counting both passes (up to `2 * paths`).
    swept: u64,
    /// Paths in one pass of the sweep (0 until the engine has said).
    paths: u64,
}

/// Where the new key file waits until the rotation ends: `<key file>.next`.
pub fn next_key_path(key_path: &Path) -> PathBuf {
    let mut p = key_path.as_os_str().to_owned();
    p.push(".next");
    PathBuf::from(p)
}

/// The keys of a data directory: the one everything is sealed under from now on, and, during
/// a rotation, the one being retired.
pub struct Keys {
    /// Seals everything from now on.
    pub current: MasterKey,
    /// Still opens what it sealed, until the rotation ends.
    pub previous: Option<MasterKey>,
    /// The rotation, if one is under way.
    pub rotation: Option<Rotation>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").field("rotating", &self.rotation.is_some()).finish_non_exhaustive()
    }
}

/// A rotation under way: where its files are and how far its sweep got.
#[derive(Debug)]
pub struct Rotation {
    dir: PathBuf,
    key_path: PathBuf,
    /// The old key's state sealer: the rotation file is sealed under it.
    sealer: StateSealer,
    new_key_hex: Zeroizing<String>,
    /// Paths swept and committed, counting both passes (up to `2 * paths`).
    pub swept: u64,
    /// Paths in one pass of the sweep (0 until known).
    pub paths: u64,
}

/// Passes of the sweep: the second re-seals what the first left in cells' other slots.
pub const PASSES: u64 = 2;

fn config_err(path: &Path, e: impl std::fmt::Display) -> GatewayError {
    GatewayError::Config(format!("{}: {e}", path.display()))
}

impl Rotation {
    fn save(&self) -> Result<()> {
        let doc =
            Doc { new_key: self.new_key_hex.to_string(), swept: self.swept, paths: self.paths };
        let plain = Zeroizing::new(serde_json::to_vec(&doc).expect("json"));
        let sealed = self
            .sealer
            .seal(AAD, &plain)
            .map_err(|e| GatewayError::Config(format!("sealing the rotation file: {e}")))?;
        write_private(&self.dir.join(ROTATION_FILE), &sealed)
    }

    /// How far the sweep got, for people: "starting now", "120 of 512 paths re-sealed".
    pub fn progress(&self) -> String {
        if self.paths == 0 {
            "starting now".to_string()
        } else {
            format!(
                "{} of {} paths re-sealed (two passes of {})",
                self.swept.min(PASSES * self.paths),
                PASSES * self.paths,
                self.paths
            )
        }
    }

    /// Records that the sweep's first `swept` paths (counting both passes, of `paths` each)
    /// are committed.
    pub fn record(&mut self, swept: u64, paths: u64) -> Result<()> {
        self.swept = swept;
        self.paths = paths;
        self.save()
    }

    /// Ends the rotation once everything is sealed under the new key: the new key file
    /// replaces the old one, then the rotation file goes.
    pub fn finish(self) -> Result<()> {
        let next = next_key_path(&self.key_path);
        if next.exists() {
            std::fs::rename(&next, &self.key_path).map_err(|e| config_err(&self.key_path, e))?;
            sync_parent(&self.key_path)?;
        } else if !self.key_path.exists() {
            return Err(GatewayError::Config(format!(
                "{} and {} are both missing: the new key cannot be put in place",
                next.display(),
                self.key_path.display()
            )));
        }
        let file = self.dir.join(ROTATION_FILE);
        std::fs::remove_file(&file).map_err(|e| config_err(&file, e))?;
        sync_parent(&file)
    }
}

/// Prepares a rotation of the data directory `dir`, whose key (already checked against the
/// directory) is `old`, loaded from `key_path`: writes the new key file beside it
/// (`<key file>.next`, under `new_passphrase` if given) and then the rotation file. Returns
/// the new key file's path.
///
/// # Errors
///
/// A rotation already under way; the key files cannot be written.
pub fn prepare(
    dir: &Path,
    key_path: &Path,
    old: &MasterKey,
    new_passphrase: Option<&Passphrase>,
) -> Result<PathBuf> {
    let file = dir.join(ROTATION_FILE);
    if file.exists() {
        return Err(GatewayError::Config(format!(
            "a key rotation is already under way in {} ({} exists): start `blindfold serve` \
             to let it finish",
            dir.display(),
            file.display()
        )));
    }
    let next = next_key_path(key_path);
    // A leftover of a `rotate-key` that stopped before its rotation file: never used.
    match std::fs::remove_file(&next) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(config_err(&next, e)),
        _ => {}
    }
    let new = create_key_file(&next, new_passphrase).map_err(|e| config_err(&next, e))?;
    let back = load_key_file(&next, new_passphrase).map_err(|e| config_err(&next, e))?;
    if back.expose_bytes() != new.expose_bytes() {
        return Err(GatewayError::Config(format!(
            "{} does not read back the key just written to it",
            next.display()
        )));
    }
    let rotation = Rotation {
        dir: dir.to_owned(),
        key_path: key_path.to_owned(),
        sealer: StateSealer::new(old),
        new_key_hex: Zeroizing::new(hex::encode(new.expose_bytes())),
        swept: 0,
        paths: 0,
    };
    rotation.save()?;
    Ok(next)
}

/// The keys of the data directory `dir` whose key file `key_path` holds `loaded`: `loaded`
/// alone, or, during a rotation, the new key with `loaded` as the one being retired.
///
/// A rotation file that `loaded` cannot open is what a rotation leaves when it stops between
/// putting the new key file in place and removing the file: `is_dir_key(loaded)` then holds
/// (the directory's key check opens under it) and the file is removed. Otherwise it is an
/// error: the key file does not belong to this rotation.
pub fn keys(
    dir: &Path,
    key_path: &Path,
    loaded: MasterKey,
    is_dir_key: impl Fn(&MasterKey) -> Result<bool>,
) -> Result<Keys> {
    let file = dir.join(ROTATION_FILE);
    let sealed = match std::fs::read(&file) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Keys { current: loaded, previous: None, rotation: None });
        }
        Err(e) => return Err(config_err(&file, e)),
    };
    let sealer = StateSealer::new(&loaded);
    let Ok(plain) = sealer.open(AAD, &sealed).map(Zeroizing::new) else {
        if is_dir_key(&loaded)? {
            tracing::info!("removing {}, left by a key rotation that had finished", file.display());
            std::fs::remove_file(&file).map_err(|e| config_err(&file, e))?;
            sync_parent(&file)?;
            return Ok(Keys { current: loaded, previous: None, rotation: None });
        }
        return Err(GatewayError::Config(format!(
            "{} does not open under the key in {}: it belongs to another key (restore the key \
             file this data directory was using when `blindfold rotate-key` ran); nothing \
             was changed",
            file.display(),
            key_path.display()
        )));
    };
    let doc: Doc = serde_json::from_slice(&plain).map_err(|e| config_err(&file, e))?;
    let mut bytes = Zeroizing::new([0u8; 32]);
    hex::decode_to_slice(&doc.new_key, &mut bytes[..])
        .map_err(|_| config_err(&file, "the new key is not 64 hex digits"))?;
    let current = MasterKey::from_bytes(*bytes);
    let rotation = Rotation {
        dir: dir.to_owned(),
        key_path: key_path.to_owned(),
        sealer,
        new_key_hex: Zeroizing::new(doc.new_key),
        swept: doc.swept,
        paths: doc.paths,
    };
    Ok(Keys { current, previous: Some(loaded), rotation: Some(rotation) })
}

/// What the rotation's last steps need besides the engine.
pub struct Ending {
    /// The data directory (its parameters name the store and what growths retired).
    pub dir: PathBuf,
    /// The key everything is sealed under from now on.
    pub key: Arc<MasterKey>,
    /// The store's snapshot area, to be cleared of what the old key sealed.
    pub snapshots: SnapshotSlot,
    /// The store-side log (`--durability store`), whose store checkpoints the snapshot area
    /// holds: they are replaced, never just cleared (see [`replace_old_checkpoints`]).
    pub journal: Option<EndingJournal>,
}

/// What replacing the store checkpoints of a gateway that logs to the store takes.
#[derive(Debug)]
pub struct EndingJournal {
    /// The log.
    pub log: Arc<crate::storelog::StoreLog>,
    /// The object layer (its directory goes into the checkpoint).
    pub objects: Arc<crate::objects::ObjectLayer>,
    /// The parameters, where gateway.json has none.
    pub params: crate::datadir::GatewayParams,
}

impl std::fmt::Debug for Ending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ending").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// Runs the sweep of a rotation to its end while the gateway serves: two passes over every
/// path, a few paths at a time, each chunk committed and then recorded; then clears the
/// snapshot area and finally puts the new key file in place. Returns the number of paths
/// swept by this run. Stops at the first engine error (the engine is then poisoned and the
/// gateway stops; the next start resumes).
pub async fn sweep(
    engine: Arc<dyn SharedEngine>,
    mut rotation: Rotation,
    ending: Ending,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<u64> {
    let paths = engine.sweep_paths().await;
    if paths == 0 {
        return Err(GatewayError::Config(format!(
            "the {} engine cannot re-seal its cells; the rotation cannot finish",
            engine.kind()
        )));
    }
    let total = PASSES * paths;
    let start = rotation.swept.min(total);
    if start > 0 {
        tracing::info!(swept = start, total, "resuming the key rotation's sweep");
    } else {
        tracing::info!(paths, "key rotation: re-sealing every cell under the new key");
    }
    let began = std::time::Instant::now();
    let mut at = start;
    let mut reported = at * 10 / total;
    while at < total {
        if *stop.borrow_and_update() {
            tracing::info!(swept = at, total, "key rotation paused; the next start resumes it");
            return Ok(at - start);
        }
        // A chunk never spans the two passes: the second pass writes each cell again only
        // after the first pass's commit of it is durable.
        let pass_end = (at / paths + 1) * paths;
        let end = (at + SWEEP_CHUNK).min(pass_end);
        engine.sweep(at % paths..(end - 1) % paths + 1).await?;
        engine.commit().await?;
        rotation.record(end, paths)?;
        at = end;
        let tenth = at * 10 / total;
        if tenth > reported {
            reported = tenth;
            tracing::info!(
                swept = at,
                total,
                "key rotation: {}% of the sweep done (two passes over every path)",
                tenth * 10
            );
        }
        tokio::task::yield_now().await;
    }
    match &ending.journal {
        Some(journal) => replace_old_checkpoints(&ending, journal).await?,
        None => clear_old_snapshots(&ending).await?,
    }
    rotation.finish()?;
    tracing::info!(
        paths,
        seconds = began.elapsed().as_secs_f64(),
        "key rotation finished: every cell (both slots) and local file is sealed under the new \
         key, the snapshot area holds nothing the old key sealed, and the new key file replaced \
         the old one"
    );
    Ok(total - start)
}

/// The rotation's sweep running in the background of a serving gateway (or node): started
/// by [`Sweeper::start`] when the opened directory has a rotation under way, stopped between
/// two chunks (never inside an access) by [`Sweeper::stop`]; the next start resumes it.
#[derive(Debug)]
pub struct Sweeper {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sweeper {
    /// Starts the sweep of the rotation under way in `opened`, if any (taking it).
    pub fn start(opened: &mut crate::server::Opened) -> Option<Self> {
        let rotation = opened.rotation.take()?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let engine = Arc::clone(opened.objects.engine());
        let ending = Ending {
            dir: opened.data_dir.clone(),
            key: Arc::clone(&opened.key),
            snapshots: Arc::clone(&opened.snapshots),
            journal: opened.journal.as_ref().map(|j| EndingJournal {
                log: Arc::clone(&j.log),
                objects: Arc::clone(&opened.objects),
                params: opened.params.clone(),
            }),
        };
        let task = tokio::spawn(async move {
            if let Err(e) = sweep(engine, rotation, ending, stopped).await {
                tracing::error!(error = %e, "the key rotation stopped; the next start resumes it");
            }
        });
        Some(Self { stop, task })
    }

    /// Whether the sweep has ended (finished, or stopped by an error).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Stops the sweep between two chunks and waits for it.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// With a store-side log, the snapshot area holds its store checkpoints, without which the log
/// recovers nothing: clearing both slots would leave the store without one until the next.
/// So, holding the log's checkpoint lock, two store checkpoints under the new key are written
/// in turn, each after clearing the slot it goes to, and then the slot of the first one is
/// cleared: at every moment one complete checkpoint is in the store, and in the end one slot
/// holds the newest and the other nothing but zeros, all under the new key (remnants of a
/// larger snapshot under the old key included). Repeating it writes the same again.
async fn replace_old_checkpoints(ending: &Ending, journal: &EndingJournal) -> Result<()> {
    let held = journal.log.checkpoints().await;
    let array = |ending: &Ending| {
        ending.snapshots.lock().clone().ok_or_else(|| {
            GatewayError::Config(
                "the snapshot area could not be opened at start, so the store checkpoints sealed \
                 under the old key cannot be replaced: the key rotation stays unfinished (the \
                 next start tries again; `blindfold verify` checks the store)"
                    .into(),
            )
        })
    };
    let mut last = None;
    for _ in 0..2 {
        let next =
            crate::snapshot::latest_seq(&*array(ending)?.store, &ending.key).await.unwrap_or(0) + 1;
        // The slot the next checkpoint goes to, cleared first (old remnants included).
        crate::snapshot::clear_slot(&*array(ending)?.store, &ending.key, next % 2).await?;
        let (seq, removed) = crate::snapshot::write_journal_snapshot_held(
            &ending.snapshots,
            &ending.key,
            &ending.dir,
            &journal.objects,
            &journal.log,
            &journal.params,
            &held,
            // Every cell is under the new key now.
            false,
        )
        .await?;
        if !removed.is_empty() {
            tracing::info!(?removed, "key rotation: removed arrays nothing names any more");
        }
        last = Some(seq);
    }
    if let Some(seq) = last {
        // The first of the two: the other slot, now an older copy under the new key.
        crate::snapshot::clear_slot(&*array(ending)?.store, &ending.key, (seq + 1) % 2).await?;
    }
    if let Some(a) = ending.snapshots.lock().as_mut() {
        a.replaces = None;
    }
    Ok(())
}

/// Clears the snapshot area of everything the old key sealed: both slots overwritten and
/// the index re-sealed under the new key (see [`crate::snapshot::clear`]); and removes the
/// arrays that nothing names any more (what growths retired, an older snapshot array) where
/// the store can. Repeating it writes the same again.
async fn clear_old_snapshots(ending: &Ending) -> Result<()> {
    let Some(array) = ending.snapshots.lock().clone() else {
        return Err(GatewayError::Config(
            "the snapshot area could not be opened at start, so the snapshots sealed under the \
             old key cannot be cleared: the key rotation stays unfinished (the next start \
             tries again; `blindfold verify` checks the store)"
                .into(),
        ));
    };
    crate::snapshot::clear(&*array.store, &ending.key).await?;
    crate::snapshot::point_index(&ending.snapshots, &array, &ending.key).await?;
    if let Some(params) = read_params(&ending.dir)? {
        let in_use = [oram_array(params.generation), array.name.clone()];
        let removed = crate::datadir::remove_retired(
            &ending.dir,
            &array.url,
            array.replaces.as_deref(),
            &in_use,
        )
        .await;
        if !removed.is_empty() {
            tracing::info!(?removed, "key rotation: removed arrays nothing names any more");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &MasterKey, b: &MasterKey) -> bool {
        a.expose_bytes() == b.expose_bytes()
    }

    #[test]
    fn every_instant_of_the_file_dance_resolves_to_the_right_keys() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let key_path = dir.join("key.json");
        let old = create_key_file(&key_path, None).unwrap();
        // A leftover `.next` of a `rotate-key` cut short is replaced, never used.
        std::fs::write(next_key_path(&key_path), b"junk").unwrap();
        let next = prepare(dir, &key_path, &old, None).unwrap();
        let new = load_key_file(&next, None).unwrap();
        assert!(!same(&new, &old));
        let sealed = std::fs::read(dir.join(ROTATION_FILE)).unwrap();
        assert!(!sealed.windows(32).any(|w| w == new.expose_bytes()), "the new key is sealed");
        assert!(prepare(dir, &key_path, &old, None).is_err(), "one rotation at a time");
        // Under way: the new key seals, the old one opens.
        let never = |_: &MasterKey| -> Result<bool> { panic!("not asked while the file opens") };
        let k = keys(dir, &key_path, load_key_file(&key_path, None).unwrap(), never).unwrap();
        assert!(same(&k.current, &new) && same(k.previous.as_ref().unwrap(), &old));
        let mut r = k.rotation.unwrap();
        r.record(5, 9).unwrap();
        let k = keys(dir, &key_path, load_key_file(&key_path, None).unwrap(), never).unwrap();
        assert_eq!(
            (k.rotation.as_ref().unwrap().swept, k.rotation.as_ref().unwrap().paths),
            (5, 9)
        );
        // A crash after the new key file took its place, before the rotation file went.
        std::fs::rename(&next, &key_path).unwrap();
        let loaded = load_key_file(&key_path, None).unwrap();
        let is_new = |k: &MasterKey| Ok(same(k, &new));
        let k = keys(dir, &key_path, loaded, is_new).unwrap();
        assert!(same(&k.current, &new) && k.previous.is_none() && k.rotation.is_none());
        assert!(!dir.join(ROTATION_FILE).exists(), "the stale file is removed");
        // A key that neither opens the file nor the directory is refused, nothing removed.
        std::fs::write(dir.join(ROTATION_FILE), &sealed).unwrap();
        let err = keys(dir, &key_path, MasterKey::generate(), |_| Ok(false)).unwrap_err();
        assert!(err.to_string().contains("another key"), "{err}");
        assert!(dir.join(ROTATION_FILE).exists());
        // finish() puts the new key in place and removes the file.
        let k = keys(dir, &key_path, old, never).unwrap();
        std::fs::write(next_key_path(&key_path), b"the new key file").unwrap();
        k.rotation.unwrap().finish().unwrap();
        assert_eq!(std::fs::read(&key_path).unwrap(), b"the new key file");
        assert!(!dir.join(ROTATION_FILE).exists() && !next_key_path(&key_path).exists());
    }
}
