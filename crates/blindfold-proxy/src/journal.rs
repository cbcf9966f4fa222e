//! The trusted-state files of every durable engine: a sealed checkpoint, written atomically, and
//! a redo log of sealed, checksummed frames, in the engine's state directory.
//!
//! Every engine that keeps state across crashes (Path ORAM, TaoStore, the partition engines,
//! the TEE engine and the node's load balancer) writes the same two files:
//!
//! * `checkpoint.bin`: `magic (8) ‖ body length (8) ‖ CRC-32 (4) ‖ body`, the body sealed under
//!   the master key's [`StateSealer`] with the magic as associated data. Written to a temporary
//!   file (mode 0600), fsynced, renamed into place, and the directory fsynced: a crash leaves
//!   the old checkpoint or the new one, never a mix ([`write_checkpoint_as`]).
//! * `redo.log`: frames `magic (4) ‖ body length (8) ‖ CRC-32 (4) ‖ sealed body`, appended and
//!   fsynced ([`append_record`]). A torn last frame (a crash mid-append) fails its CRC and is cut
//!   off when the log is read back ([`read_frames_with_legacy`]); a frame whose CRC holds but
//!   whose seal does not open is tampering, and stops the open.
//!
//! What each engine logs (the frame magics and bodies) stays with the engine. Everything here
//! reads bytes from the data directory as hostile input: a bad length is an error, never an
//! allocation (see the `hostile_input` tests in `durable.rs`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bincode::Options;
use blindfold_crypto::StateSealer;
use serde::Serialize;

use crate::{ProxyError, Result};

/// The checkpoint's file name in a state directory.
pub const CHECKPOINT: &str = "checkpoint.bin";
/// The redo log's file name in a state directory.
pub const REDO_LOG: &str = "redo.log";

/// A file-system error on `path`, saying what was being done.
pub(crate) fn io(path: &Path, what: &str, e: std::io::Error) -> ProxyError {
    if blindfold_store::room::is_disk_full(&e) {
        return ProxyError::DiskFull(format!("{what} {}: {e}", path.display()));
    }
    ProxyError::State(format!("{what} {}: {e}", path.display()))
}

/// Largest redo record or checkpoint body accepted from the data directory (1 TiB): a length
/// field above it is damage, never an allocation request.
const MAX_FRAME: u64 = 1 << 40;

/// Creates `path` for writing, private to the owner (mode 0600), truncating it.
pub(crate) fn create_private(path: &Path) -> std::io::Result<File> {
    let mut o = OpenOptions::new();
    o.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(path)
}

/// Makes `dir` (created if missing) and every file directly in it private to the owner: the
/// directory 0700, files 0600 (subdirectories are not touched). Returns one warning per path whose mode had to be tightened.
pub fn make_private(dir: &Path) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| io(dir, "creating", e))?;
        }
        let mut tighten = |path: &Path, want: u32| -> Result<()> {
            let meta = std::fs::symlink_metadata(path).map_err(|e| io(path, "inspecting", e))?;
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(want))
                    .map_err(|e| io(path, "restricting the mode of", e))?;
                warnings.push(format!(
                    "{} was readable by others (mode {mode:o}); restricted to {want:o}",
                    path.display()
                ));
            }
            Ok(())
        };
        tighten(dir, 0o700)?;
        for entry in std::fs::read_dir(dir).map_err(|e| io(dir, "listing", e))? {
            let entry = entry.map_err(|e| io(dir, "listing", e))?;
            let kind = entry.file_type().map_err(|e| io(&entry.path(), "inspecting", e))?;
            // Subdirectories are left to their owners (the ORAM state directory makes itself
            // private; a `cells` directory of the file store holds only sealed cells).
            if kind.is_file() {
                tighten(&entry.path(), 0o600)?;
            }
        }
    }
    #[cfg(not(unix))]
    std::fs::create_dir_all(dir).map_err(|e| io(dir, "creating", e))?;
    Ok(warnings)
}

/// Makes `dir` ready to hold a new engine's trusted state: creates it (private), and refuses
/// one that already holds a checkpoint.
pub(crate) fn prepare_new_dir(dir: &Path) -> Result<()> {
    make_private(dir)?;
    if dir.join(CHECKPOINT).exists() {
        return Err(ProxyError::State(format!(
            "{} already holds an ORAM; open it instead",
            dir.display()
        )));
    }
    Ok(())
}

/// Opens `dir/redo.log` for appending, emptied (its records are in the checkpoint just
/// written), with the emptying and the directory made durable.
pub(crate) fn open_empty_log(dir: &Path) -> Result<File> {
    let log = open_log(dir)?;
    empty_log(&log, dir)?;
    sync_dir(dir)?;
    Ok(log)
}

/// Opens `dir/redo.log` for appending (mode 0600), keeping what it holds.
pub fn open_log(dir: &Path) -> Result<File> {
    let log_path = dir.join(REDO_LOG);
    // Append mode: every write lands at the end, also after the log is emptied again.
    let mut o = OpenOptions::new();
    o.create(true).append(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
    o.open(&log_path).map_err(|e| io(&log_path, "opening", e))
}

/// Replaces `dir/redo.log` atomically by a log holding exactly `frames` (already encoded), and
/// returns it opened for appending. Used at start-up to keep the reveal records of the last
/// window while dropping everything the new checkpoint covers.
pub(crate) fn replace_log(dir: &Path, frames: &[Vec<u8>]) -> Result<File> {
    if frames.is_empty() {
        return open_empty_log(dir);
    }
    let tmp = dir.join(format!("{REDO_LOG}.tmp"));
    let mut f = create_private(&tmp).map_err(|e| io(&tmp, "creating", e))?;
    for frame in frames {
        f.write_all(frame).map_err(|e| io(&tmp, "writing", e))?;
    }
    f.sync_all().map_err(|e| io(&tmp, "syncing", e))?;
    let path = dir.join(REDO_LOG);
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, "renaming into", e))?;
    sync_dir(dir)?;
    open_log(dir)
}

/// Empties the redo log `log` of `dir` and makes that durable.
pub fn empty_log(log: &File, dir: &Path) -> Result<()> {
    log.set_len(0).and_then(|_| log.sync_all()).map_err(|e| io(&dir.join(REDO_LOG), "emptying", e))
}

pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io(dir, "syncing directory", e))
}

/// Writes `ckpt` to `dir/checkpoint.bin` atomically (temporary file with mode 0600, fsync,
/// rename, directory fsync), sealed under the state key and framed by `magic`, its length and
/// a CRC (the CRC tells a torn write from tampering).
pub fn write_checkpoint_as<T: Serialize>(
    dir: &Path,
    magic: &[u8; 8],
    ckpt: &T,
    sealer: &StateSealer,
) -> Result<()> {
    let plain = bincode::serialize(ckpt).map_err(|e| ProxyError::State(e.to_string()))?;
    let body = sealer.seal(magic, &plain).map_err(ProxyError::Crypto)?;
    drop(plain);
    let tmp = dir.join(format!("{CHECKPOINT}.tmp"));
    let mut head = Vec::with_capacity(20);
    head.extend_from_slice(magic);
    head.extend_from_slice(&(body.len() as u64).to_le_bytes());
    head.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    // A full disk is waited out; each attempt starts the temporary file afresh.
    blindfold_store::room::waiting_for_room(&tmp, || {
        let mut f = create_private(&tmp)?;
        f.write_all(&head)?;
        f.write_all(&body)?;
        f.sync_all()
    })
    .map_err(|e| io(&tmp, "writing", e))?;
    let path = dir.join(CHECKPOINT);
    std::fs::rename(&tmp, &path).map_err(|e| io(&path, "renaming into", e))?;
    sync_dir(dir)
}

/// Decodes checkpoint file bytes (see [`write_checkpoint_as`]); hostile input gives an error
/// message, never a panic or an allocation larger than the input.
pub fn decode_checkpoint<T: serde::de::DeserializeOwned>(
    buf: &[u8],
    magic: &[u8; 8],
    sealer: &StateSealer,
) -> std::result::Result<T, String> {
    let body = checkpoint_body(buf, magic)?;
    let plain = sealer.open(magic, body).map_err(|_| {
        "does not authenticate: damaged, or sealed with another key (is this the data \
         directory's own key file?)"
            .to_string()
    })?;
    decode_bounded(&plain).map_err(|e| format!("cannot decode: {e}"))
}

/// The body of checkpoint file bytes framed by `magic`, its length and its CRC (sealed or,
/// from an earlier version, not); the length is checked against the bytes present.
fn checkpoint_body<'a>(buf: &'a [u8], magic: &[u8; 8]) -> std::result::Result<&'a [u8], String> {
    if buf.len() < 20 || &buf[..8] != magic {
        return Err(format!(
            "not a checkpoint of this engine (expected {:?})",
            String::from_utf8_lossy(magic)
        ));
    }
    let len = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes"));
    let crc = u32::from_le_bytes(buf[16..20].try_into().expect("4 bytes"));
    let body = usize::try_from(len)
        .ok()
        .and_then(|len| buf.get(20..20usize.checked_add(len)?))
        .ok_or("truncated")?;
    if crc32fast::hash(body) != crc {
        return Err("checksum mismatch (damaged)".into());
    }
    Ok(body)
}

/// Decodes `bytes` as bincode (the encoding of `bincode::serialize`), allocating no more than
/// the input could hold.
fn decode_bounded<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> bincode::Result<T> {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(bytes.len() as u64)
        .deserialize(bytes)
}

/// The checkpoint of `dir` if it is a sealed one of the previous format (`magic`), to be
/// converted by the caller and rewritten in the current format; `None` if it is not.
pub(crate) fn read_prev_checkpoint<T: serde::de::DeserializeOwned>(
    dir: &Path,
    magic: &[u8; 8],
    sealer: &StateSealer,
) -> Result<Option<T>> {
    let path = dir.join(CHECKPOINT);
    let mut head = [0u8; 8];
    let is_prev = File::open(&path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .map(|()| &head == magic)
        .unwrap_or(false);
    if !is_prev {
        return Ok(None);
    }
    let buf = std::fs::read(&path).map_err(|e| io(&path, "reading", e))?;
    let old = decode_checkpoint(&buf, magic, sealer)
        .map_err(|m| ProxyError::State(format!("{}: {m}", path.display())))?;
    tracing::info!(
        path = %path.display(),
        "checkpoint of an earlier version: it is rewritten in the current format now"
    );
    Ok(Some(old))
}

/// Decodes an unsealed checkpoint of blindfold 0.1 before its state was sealed (`magic`,
/// length, CRC, bincode body), to migrate it: the caller rewrites it sealed at once.
pub(crate) fn decode_legacy_checkpoint<T: serde::de::DeserializeOwned>(
    buf: &[u8],
    magic: &[u8; 8],
) -> std::result::Result<T, String> {
    let body = checkpoint_body(buf, magic)?;
    decode_bounded(body).map_err(|e| format!("cannot decode: {e}"))
}

/// The checkpoint of `dir` decoded as `T` (sealed, `magic`) or, from an older version, as
/// `L` (unsealed, `legacy`) and converted; the second value says whether it was the latter.
pub(crate) fn read_any_checkpoint<T, L>(
    dir: &Path,
    magic: &[u8; 8],
    legacy: &[u8; 8],
    sealer: &StateSealer,
    convert: impl FnOnce(L) -> T,
) -> Result<(T, bool)>
where
    T: serde::de::DeserializeOwned,
    L: serde::de::DeserializeOwned,
{
    let path = dir.join(CHECKPOINT);
    let buf = std::fs::read(&path).map_err(|e| io(&path, "reading", e))?;
    let bad = |m: String| ProxyError::State(format!("{}: {m}", path.display()));
    if buf.len() >= 8 && &buf[..8] == legacy {
        let old: L = decode_legacy_checkpoint(&buf, legacy).map_err(bad)?;
        tracing::warn!(
            path = %path.display(),
            "migrating an unsealed checkpoint of an earlier version: it is rewritten sealed now"
        );
        return Ok((convert(old), true));
    }
    decode_checkpoint(&buf, magic, sealer).map(|c| (c, false)).map_err(bad)
}

/// One frame of the redo log: its magic and its opened body.
pub struct Frame {
    /// What kind of record it is.
    pub magic: u32,
    /// The opened (plaintext) record.
    pub body: Vec<u8>,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The body derives from user data and the access pattern: never printed.
        f.debug_struct("Frame").field("magic", &self.magic).field("len", &self.body.len()).finish()
    }
}

/// Bytes before a redo-log frame's body: magic (4), body length (8), CRC of the body (4).
const FRAME_HEADER: usize = 16;

/// Encodes `record` as one sealed redo-log frame: magic, length and CRC of the sealed body,
/// then the body (the record sealed under the state key, bound to its magic).
///
/// The record is serialized straight into the frame and sealed there, in place: a commit's
/// record can hold megabytes of pinned cells.
pub fn encode_frame<T: Serialize>(magic: u32, record: &T, sealer: &StateSealer) -> Result<Vec<u8>> {
    let size = bincode::serialized_size(record).map_err(|e| ProxyError::State(e.to_string()))?;
    let size = usize::try_from(size).map_err(|_| ProxyError::State("record too large".into()))?;
    let mut frame = Vec::with_capacity(FRAME_HEADER + size + StateSealer::OVERHEAD);
    // Header and nonce, filled in below.
    frame.resize(FRAME_HEADER + StateSealer::NONCE_LEN, 0);
    bincode::serialize_into(&mut frame, record).map_err(|e| ProxyError::State(e.to_string()))?;
    sealer.seal_into(&magic.to_le_bytes(), &mut frame, FRAME_HEADER).map_err(ProxyError::Crypto)?;
    let body_len = (frame.len() - FRAME_HEADER) as u64;
    let crc = crc32fast::hash(&frame[FRAME_HEADER..]);
    frame[..4].copy_from_slice(&magic.to_le_bytes());
    frame[4..12].copy_from_slice(&body_len.to_le_bytes());
    frame[12..16].copy_from_slice(&crc.to_le_bytes());
    Ok(frame)
}

/// Appends already encoded `frames` to the redo log `log` (in `dir`) and fsyncs it, and hands
/// them to `tap`'s mirror (if one is attached) at the same time; returns once both hold them.
/// Returns the bytes appended.
pub async fn append_frames(log: &File, dir: &Path, tap: &Tap, frames: Vec<Vec<u8>>) -> Result<u64> {
    let (len, mirrored) = append_frames_mirroring(log, dir, tap, frames).await?;
    mirrored.wait().await?;
    Ok(len)
}

/// What an append leaves to wait for: the mirror's copy of its frames (nothing when no mirror
/// is attached). Cloned, it can be waited for by several callers.
#[derive(Clone, Debug, Default)]
pub struct Mirrored(Option<(Arc<dyn LogMirror>, u64)>);

impl Mirrored {
    /// Returns once the mirror holds the frames (and every frame handed to it before them).
    pub async fn wait(&self) -> Result<()> {
        match &self.0 {
            Some((mirror, ticket)) => mirror.durable(*ticket).await,
            None => Ok(()),
        }
    }

    /// Returns once a read may go out after these frames, a reveal record
    /// ([`LogMirror::readable`]).
    pub async fn readable(&self) -> Result<()> {
        match &self.0 {
            Some((mirror, ticket)) => mirror.readable(*ticket).await,
            None => Ok(()),
        }
    }
}

/// As [`append_frames`], but returns once the local log holds the frames: the mirror's copy,
/// already under way, is left to [`Mirrored::wait`]. Called with the engine's log lock held,
/// this keeps the frames' order in the mirror while letting the lock go before the mirror's
/// round trip (a store far away), so that later appends need not wait for it.
pub async fn append_frames_mirroring(
    log: &File,
    dir: &Path,
    tap: &Tap,
    frames: Vec<Vec<u8>>,
) -> Result<(u64, Mirrored)> {
    append_to_log(log, dir, tap, frames, ToMirror::Now).await
}

/// As [`append_frames_mirroring`], for a reveal record: its write to the mirror starts at once,
/// unless the mirror says a read need not wait for it there ([`LogMirror::linger`]); then it
/// starts that long after, if no write has taken it along by then (the next commit's record,
/// or another reveal's). The caller waits with [`Mirrored::readable`].
pub async fn append_reveal_frames(
    log: &File,
    dir: &Path,
    tap: &Tap,
    frames: Vec<Vec<u8>>,
) -> Result<(u64, Mirrored)> {
    append_to_log(log, dir, tap, frames, ToMirror::Linger).await
}

/// As [`append_frames_mirroring`], but the mirror's copy is only queued: it goes out with the
/// first wait for it or for anything queued after it ([`Mirrored::wait`], or the mirror's own
/// wait for a later entry), in one group with whatever else is queued by then. For a record
/// whose caller logs an entry of its own right after it and waits for both.
pub async fn append_frames_queued(
    log: &File,
    dir: &Path,
    tap: &Tap,
    frames: Vec<Vec<u8>>,
) -> Result<(u64, Mirrored)> {
    append_to_log(log, dir, tap, frames, ToMirror::Queued).await
}

/// When frames appended to the local log start on their way to the mirror.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ToMirror {
    /// At once.
    Now,
    /// With the first wait for them or for anything queued after them.
    Queued,
    /// After the mirror's [`LogMirror::linger`], if no write took them along before; at once
    /// if the mirror has none.
    Linger,
}

async fn append_to_log(
    log: &File,
    dir: &Path,
    tap: &Tap,
    frames: Vec<Vec<u8>>,
    when: ToMirror,
) -> Result<(u64, Mirrored)> {
    let log = log.try_clone().map_err(|e| io(dir, "cloning log handle", e))?;
    let path = dir.join(REDO_LOG);
    let len = frames.iter().map(|f| f.len() as u64).sum();
    let mirror = tap.mirror();
    let shared = Arc::new(frames);
    // Queued in order now; written to the mirror while the local log is fsynced.
    let mirrored = match mirror {
        Some(m) => {
            let ticket = m.queue(Arc::clone(&shared));
            // How long until the write starts, if it is to start without a wait for it.
            let start_in = match when {
                ToMirror::Now => Some(Duration::ZERO),
                ToMirror::Queued => None,
                ToMirror::Linger => Some(m.linger().unwrap_or_default()),
            };
            if let Some(delay) = start_in {
                let started = Arc::clone(&m);
                tokio::spawn(async move {
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    // Failures are kept by the mirror and answered to every waiter. (Taken
                    // along by another write meanwhile, this returns at once.)
                    let _ = started.durable(ticket).await;
                });
            }
            Mirrored(Some((m, ticket)))
        }
        None => Mirrored(None),
    };
    let local = {
        let frames = Arc::clone(&shared);
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            let mut log = log;
            // A full disk is waited out (the gateway gives up its reserve of space within a
            // second): each attempt cut short is cut off again, so no torn frame stays behind.
            let start = log.metadata()?.len();
            blindfold_store::room::waiting_for_room(&path, || {
                let written = frames.iter().try_for_each(|f| log.write_all(f));
                let r = written.and_then(|()| log.sync_data());
                if r.is_err() {
                    let _ = log.set_len(start);
                }
                r
            })
        })
    };
    local
        .await
        .map_err(|e| ProxyError::State(format!("log writer panicked: {e}")))?
        .map_err(|e| io(&path, "appending to", e))?;
    Ok((len, mirrored))
}

/// Appends a record of what a read is about to reveal (encoded `frame`) to the redo log `log`
/// (in `dir`), fsyncs it and mirrors it through `tap`. Returns once the mirror holds it too,
/// (or a standby holds it for the mirror, [`LogMirror::readable`]), unless the mirror lets reads
/// go ahead of it ([`LogMirror::reads_wait`]); then its copy is under way, and the next commit,
/// which waits for the mirror, covers it. Returns the bytes appended.
pub async fn append_reveal(log: &File, dir: &Path, tap: &Tap, frame: Vec<u8>) -> Result<u64> {
    let (len, mirrored) = append_reveal_frames(log, dir, tap, vec![frame]).await?;
    if tap.reads_wait() {
        mirrored.readable().await?;
    }
    Ok(len)
}

/// Appends already encoded `frame` to the redo log `log` (in `dir`), fsyncs it and mirrors it
/// through `tap` ([`append_frames`]). Returns the bytes appended.
pub async fn append_frame(log: &File, dir: &Path, tap: &Tap, frame: Vec<u8>) -> Result<u64> {
    append_frames(log, dir, tap, vec![frame]).await
}

/// Appends `record` to the redo log `log` (in `dir`) as one sealed frame with `magic`, fsyncs
/// it and mirrors it through `tap`. Returns the bytes appended.
pub async fn append_record<T: Serialize>(
    log: &File,
    dir: &Path,
    tap: &Tap,
    magic: u32,
    record: &T,
    sealer: &StateSealer,
) -> Result<u64> {
    let frame = encode_frame(magic, record, sealer)?;
    append_frame(log, dir, tap, frame).await
}

/// A second home for an engine's redo log, beside its state directory: the gateway's log in
/// the untrusted store (`--durability store`), from which a new machine rebuilds the state
/// directory when the gateway's own disk is lost.
///
/// An engine hands the mirror, in log order, every frame it appends ([`LogMirror::queue`]) and
/// every checkpoint it writes ([`LogMirror::checkpointed`]); an append returns only once the
/// mirror holds the frames too. A checkpoint is handed over with the engine's log lock held,
/// so no frame of the engine comes between the checkpoint and what the mirror records of it.
#[async_trait::async_trait]
pub trait LogMirror: Send + Sync + std::fmt::Debug {
    /// Frames just appended to the local log (encoded as in `redo.log`), queued in order (call
    /// with the engine's log lock held); returns a ticket for [`LogMirror::durable`].
    fn queue(&self, frames: Arc<Vec<Vec<u8>>>) -> u64;
    /// Returns once the frames queued with `ticket`, and all queued before them, are durable
    /// in the mirror.
    async fn durable(&self, ticket: u64) -> Result<()>;
    /// The engine wrote `checkpoint` (the bytes of `checkpoint.bin`) and replaced its log by
    /// `log` (the bytes of `redo.log`, usually empty): frames handed over before this call are
    /// covered by it.
    async fn checkpointed(&self, checkpoint: Vec<u8>, log: Vec<u8>) -> Result<()>;
    /// True when the mirror would like the engine to checkpoint soon (its log is filling up).
    fn wants_checkpoint(&self) -> bool;
    /// Whether a read waits for the mirror to hold the record of what it reveals before its
    /// path goes out (the default). A mirror that answers false takes those records in order
    /// but lets reads go ahead of them: whoever rebuilds the engine from the mirror alone
    /// must then give every block a fresh leaf, as the mirror may lack the last reveals.
    fn reads_wait(&self) -> bool {
        true
    }
    /// Returns once a read whose reveal record was queued with `ticket` may go out: by default
    /// once the mirror holds the record ([`LogMirror::durable`]). A mirror with a second
    /// trusted home for its records (a standby that holds the log's tail) may answer sooner;
    /// it then answers for the record's safety as if it were durable. Only called after the
    /// record's write to the mirror was started, or scheduled ([`LogMirror::linger`]).
    async fn readable(&self, ticket: u64) -> Result<()> {
        self.durable(ticket).await
    }
    /// How long a reveal record may wait to go to the mirror with company, when no read waits
    /// for the mirror to hold it (it waits for a standby, or goes ahead of the log): `None`
    /// (the default) sends it at once. Asked as each reveal record is queued.
    fn linger(&self) -> Option<Duration> {
        None
    }
}

/// Where an engine's redo log is mirrored, if anywhere: a shared, initially empty slot that
/// the gateway fills once the engine is open ([`Tap::attach`]). Cloning shares the slot.
#[derive(Clone, Default)]
pub struct Tap(Arc<parking_lot::RwLock<Option<Arc<dyn LogMirror>>>>);

impl std::fmt::Debug for Tap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tap").field("attached", &self.0.read().is_some()).finish()
    }
}

impl Tap {
    /// From now on, every frame and checkpoint of the engine also goes to `mirror`.
    pub fn attach(&self, mirror: Arc<dyn LogMirror>) {
        *self.0.write() = Some(mirror);
    }

    /// The attached mirror, if any.
    pub fn mirror(&self) -> Option<Arc<dyn LogMirror>> {
        self.0.read().clone()
    }

    /// Hands the checkpoint the engine just wrote in `dir` (and the log it kept) to the mirror.
    /// Call with the engine's log lock held, after the checkpoint and the log are durable.
    pub async fn checkpointed(&self, dir: &Path) -> Result<()> {
        let Some(mirror) = self.mirror() else { return Ok(()) };
        let ckpt_path = dir.join(CHECKPOINT);
        let checkpoint = std::fs::read(&ckpt_path).map_err(|e| io(&ckpt_path, "reading", e))?;
        let log_path = dir.join(REDO_LOG);
        let log = match std::fs::read(&log_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(&log_path, "reading", e)),
        };
        mirror.checkpointed(checkpoint, log).await
    }

    /// Whether reads wait for the attached mirror to hold their reveal records
    /// ([`LogMirror::reads_wait`]); true when no mirror is attached (the local log alone is
    /// always waited for).
    pub fn reads_wait(&self) -> bool {
        self.0.read().as_ref().is_none_or(|m| m.reads_wait())
    }

    /// True when the attached mirror asks for a checkpoint.
    pub fn wants_checkpoint(&self) -> bool {
        self.0.read().as_ref().is_some_and(|m| m.wants_checkpoint())
    }
}

/// Reads every complete frame of the redo log at `path` whose magic is one of `magics`, and
/// opens it, or takes it as it is if its magic is in `plain` (unsealed records of an earlier
/// version, replayed once while migrating); returns them, the bytes they take and the number
/// of bytes of a torn tail (a frame cut short, or with a bad checksum, ends the log: it was
/// being written at a crash). A complete sealed frame that does not authenticate is an error:
/// the log was altered, or belongs to another key.
pub fn read_frames_with_legacy(
    path: &Path,
    magics: &[u32],
    plain: &[u32],
    sealer: &StateSealer,
) -> Result<(Vec<Frame>, u64, u64)> {
    let buf = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io(path, "reading", e)),
    };
    decode_frames(&buf, magics, plain, sealer)
        .map_err(|m| ProxyError::State(format!("{}: {m}", path.display())))
}

/// Decodes redo-log bytes (see [`read_frames_with_legacy`]); hostile input gives an error message, never
/// a panic or an allocation larger than the input.
pub(crate) fn decode_frames(
    buf: &[u8],
    magics: &[u32],
    plain: &[u32],
    sealer: &StateSealer,
) -> std::result::Result<(Vec<Frame>, u64, u64), String> {
    let mut frames = Vec::new();
    let mut at = 0usize;
    while buf.len() - at >= FRAME_HEADER {
        let found = u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        let len = u64::from_le_bytes(buf[at + 4..at + 12].try_into().expect("8 bytes"));
        let crc = u32::from_le_bytes(buf[at + 12..at + 16].try_into().expect("4 bytes"));
        if len > MAX_FRAME {
            break;
        }
        let start = at + FRAME_HEADER;
        let Some(body) = start.checked_add(len as usize).and_then(|end| buf.get(start..end)) else {
            break;
        };
        let sealed = magics.contains(&found);
        if !(sealed || plain.contains(&found)) || crc32fast::hash(body) != crc {
            break;
        }
        let opened = if sealed {
            sealer.open(&found.to_le_bytes(), body).map_err(|_| {
                format!(
                    "the redo record at byte {at} does not authenticate: damaged, or sealed \
                     with another key"
                )
            })?
        } else {
            body.to_vec()
        };
        frames.push(Frame { magic: found, body: opened });
        at += FRAME_HEADER + len as usize;
    }
    Ok((frames, at as u64, (buf.len() - at) as u64))
}

/// Decodes one opened frame body as a `T`, bounded by the body's size.
pub fn decode_record<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> std::result::Result<T, String> {
    decode_bounded(body).map_err(|e| format!("bad redo record: {e}"))
}

/// Removes `dir/redo.log` if present.
pub(crate) fn remove_log(dir: &Path) -> Result<()> {
    let log = dir.join(REDO_LOG);
    match std::fs::remove_file(&log) {
        Ok(()) => sync_dir(dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(&log, "removing", e)),
    }
}
