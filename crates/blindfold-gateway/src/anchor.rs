//! The anchor (`--anchor PATH|URL`): a small sealed record, kept somewhere the operator trusts
//! (a second disk, another machine), of how far the store-side log ([`crate::storelog`]) is
//! known to reach.
//!
//! Without it, a store that loses or withholds the tail of its log after the gateway's machine
//! is lost rolls the recovered gateway back to an earlier acknowledged state, and nothing the
//! store holds can show it: a log that ends early looks like a log that ended there. With it,
//! the gateway records, before it acknowledges a group of writes, the number of log entries
//! that are durable; `blindfold recover` and a standby's takeover refuse a store whose log
//! ends before that number.
//!
//! # Layout
//!
//! Two cells of one store array named [`ARRAY`] (on a `PATH`, the file `anchor.cells` in
//! that directory), written in turn, so that a write cut short by a crash leaves the other
//! intact. A cell's plaintext is `magic (8) ‖ format (1) ‖ entries (8) ‖ generation (8) ‖
//! written at, ns (16)`, zero-padded to [`RECORD`] bytes, sealed under a key of its own derived
//! from the master key and bound to its slot. The newest is the one with more entries.
//!
//! # Cost
//!
//! One small write and one flush (a `fdatasync` on a file) per group commit, before the group
//! is acknowledged: on a local disk a fraction of a millisecond beside the store's round trip;
//! on another machine, one more round trip to it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use blindfold_crypto::{CellAd, CellSealer, MasterKey, StoreId};
use blindfold_store::{open_store, CellId, Geometry, Store, StoreUrl, SyncMode};

use crate::{GatewayError, Result};

/// The anchor's store array.
pub const ARRAY: &str = "anchor";
/// Plaintext bytes of one record.
pub const RECORD: usize = 64;
const MAGIC: &[u8; 8] = b"bf-ancr\0";
const FORMAT: u8 = 1;

/// Where the anchor lives, as given to `--anchor`: a directory on a trusted disk, or the URL of
/// a store the operator trusts (any of `file://`, `s3://`, `redis://`, `remote://`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AnchorSpec(pub StoreUrl);

impl std::str::FromStr for AnchorSpec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let url = if s.contains("://") || s.starts_with("memory:") || s.starts_with("file:") {
            s.parse::<StoreUrl>().map_err(|e| e.to_string())?
        } else {
            if s.is_empty() {
                return Err("an empty path: give a directory on a disk you trust".into());
            }
            StoreUrl::File { dir: s.into(), sync: SyncMode::OnFlush }
        };
        match &url {
            StoreUrl::Memory => Err("memory: is lost when the gateway exits, and an anchor must \
                                     outlive it: give a directory on another disk, or a store \
                                     URL on another machine"
                .into()),
            StoreUrl::File { sync: SyncMode::None, .. } => Err("an anchor must be durable when \
                                                                a write is acknowledged: drop \
                                                                ?sync=none"
                .into()),
            _ => Ok(AnchorSpec(url)),
        }
    }
}

impl std::fmt::Display for AnchorSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            StoreUrl::File { dir, sync: SyncMode::OnFlush } => write!(f, "{}", dir.display()),
            url => write!(f, "{url}"),
        }
    }
}

/// Nanoseconds since the Unix epoch, now (when a record is written).
pub fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i128)
        .unwrap_or(0)
}

/// What an anchor records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnchorRecord {
    /// Every entry of the store-side log below this number was durable in the store when the
    /// record was written (and every write acknowledged before then is among them).
    pub entries: u64,
    /// The lease generation of the gateway that wrote it.
    pub generation: u64,
    /// When, in nanoseconds since the Unix epoch.
    pub written_ns: i128,
}

impl AnchorRecord {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(RECORD);
        b.extend_from_slice(MAGIC);
        b.push(FORMAT);
        b.extend_from_slice(&self.entries.to_le_bytes());
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.written_ns.to_le_bytes());
        b.resize(RECORD, 0);
        b
    }

    fn decode(b: &[u8]) -> Option<AnchorRecord> {
        if b.len() != RECORD || &b[..8] != MAGIC || b[8] != FORMAT {
            return None;
        }
        Some(AnchorRecord {
            entries: u64::from_le_bytes(b[9..17].try_into().ok()?),
            generation: u64::from_le_bytes(b[17..25].try_into().ok()?),
            written_ns: i128::from_le_bytes(b[25..41].try_into().ok()?),
        })
    }

    /// When it was written, for the operator.
    pub fn when(&self) -> String {
        time::OffsetDateTime::from_unix_timestamp_nanos(self.written_ns)
            .map(|t| t.to_string())
            .unwrap_or_else(|_| "an unknown time".into())
    }
}

/// An opened anchor.
pub struct Anchor {
    spec: AnchorSpec,
    store: Arc<dyn Store>,
    sealer: CellSealer,
    /// Records written by this process; the next goes to slot `writes % 2`.
    writes: AtomicU64,
}

impl std::fmt::Debug for Anchor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Anchor").field("at", &self.spec.to_string()).finish_non_exhaustive()
    }
}

impl Anchor {
    /// Opens (creating if missing) the anchor at `spec`.
    pub async fn open(spec: &AnchorSpec, key: &MasterKey) -> Result<Anchor> {
        let geometry = Geometry::new(2, (RECORD + CellSealer::OVERHEAD) as u32)
            .map_err(|e| GatewayError::Config(e.to_string()))?;
        if let StoreUrl::File { dir, .. } = &spec.0 {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                if !parent.is_dir() {
                    return Err(GatewayError::Config(format!(
                        "--anchor {spec}: {} does not exist; the anchor belongs on a disk you \
                         trust, mounted before the gateway starts",
                        parent.display()
                    )));
                }
            }
        }
        let store = open_store(&spec.0, ARRAY, geometry)
            .await
            .map_err(|e| GatewayError::Config(format!("opening the anchor at {spec}: {e}")))?;
        let anchor = Anchor {
            spec: spec.clone(),
            store,
            sealer: CellSealer::new(key, StoreId(*b"blindfold-anchor"), 0),
            writes: AtomicU64::new(0),
        };
        // The first write goes to the slot not holding the newest record, so that a crash
        // during it leaves that record.
        if let Some((slot, _)) = anchor.slots().await? {
            anchor.writes.store(slot + 1, Ordering::Relaxed);
        }
        Ok(anchor)
    }

    /// Where it is, as the operator gave it.
    pub fn spec(&self) -> &AnchorSpec {
        &self.spec
    }

    /// The newest record, or None if the anchor was never written. A slot that does not open
    /// (never written, or a write cut short) is passed over; if neither opens but one holds
    /// something, the anchor was damaged or sealed under another key: an error, since reading
    /// it as empty would give up the very check it exists for.
    pub async fn read(&self) -> Result<Option<AnchorRecord>> {
        Ok(self.slots().await?.map(|(_, r)| r))
    }

    /// The newest record and its slot ([`Anchor::read`]).
    async fn slots(&self) -> Result<Option<(u64, AnchorRecord)>> {
        let cells = self.store.read(&[CellId(0), CellId(1)]).await.map_err(|e| {
            GatewayError::Config(format!("reading the anchor at {}: {e}", self.spec))
        })?;
        let mut newest: Option<(u64, AnchorRecord)> = None;
        let mut unreadable = 0;
        for (slot, cell) in (0u64..).zip(&cells) {
            let ad = CellAd { cell: slot, version: 0, segment: 0 };
            match self.sealer.open(&ad, cell).ok().and_then(|p| AnchorRecord::decode(&p)) {
                Some(r) if newest.is_none_or(|(_, n)| r.entries > n.entries) => {
                    newest = Some((slot, r))
                }
                Some(_) => {}
                None if cell.iter().any(|&b| b != 0) => unreadable += 1,
                None => {}
            }
        }
        if newest.is_none() && unreadable > 0 {
            return Err(GatewayError::Corrupt(format!(
                "the anchor at {} does not open under this key: it was damaged, or belongs to \
                 another gateway. Check the path (an anchor is per gateway and key)",
                self.spec
            )));
        }
        Ok(newest)
    }

    /// Writes `record` durably (write, then flush) into the slot not written last.
    pub async fn write(&self, record: AnchorRecord) -> Result<()> {
        let slot = self.writes.fetch_add(1, Ordering::Relaxed) % 2;
        let ad = CellAd { cell: slot, version: 0, segment: 0 };
        let sealed = self
            .sealer
            .seal(&ad, &record.encode())
            .map_err(|e| GatewayError::Corrupt(e.to_string()))?;
        let err = |e: blindfold_store::StoreError| {
            GatewayError::Config(format!("writing the anchor at {}: {e}", self.spec))
        };
        self.store.write(vec![(CellId(slot), sealed)]).await.map_err(err)?;
        self.store.flush().await.map_err(err)?;
        Ok(())
    }

    /// Fails unless a log recovered up to (not including) entry `reached` holds everything
    /// the anchor records as acknowledged.
    pub async fn check(&self, reached: u64) -> Result<Option<AnchorRecord>> {
        let Some(record) = self.read().await? else {
            return Ok(None);
        };
        if reached < record.entries {
            return Err(GatewayError::Corrupt(format!(
                "the store rolled the gateway back: the anchor at {} records {} entries of the \
                 store-side log as acknowledged (written {} under lease generation {}), but the \
                 store's checkpoint and log reach only {reached}: the store lost or withheld \
                 its last {} entries. Nothing was recovered from it. Restore the store's log \
                 (a backup or replica of the store), then run this again; recovering without \
                 --anchor would accept the loss",
                self.spec,
                record.entries,
                record.when(),
                record.generation,
                record.entries - reached,
            )));
        }
        Ok(Some(record))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(entries: u64) -> AnchorRecord {
        AnchorRecord { entries, generation: 3, written_ns: 1_700_000_000_000_000_000 }
    }

    #[test]
    fn specs_parse_and_volatile_ones_are_refused() {
        let p: AnchorSpec = "/mnt/second/bf".parse().unwrap();
        assert_eq!(p.0, StoreUrl::File { dir: "/mnt/second/bf".into(), sync: SyncMode::OnFlush });
        assert_eq!(p.to_string(), "/mnt/second/bf");
        assert!(matches!(
            "redis://127.0.0.1:6379/0".parse::<AnchorSpec>().unwrap().0,
            StoreUrl::Redis { .. }
        ));
        let e = "memory:".parse::<AnchorSpec>().unwrap_err();
        assert!(e.contains("outlive"), "{e}");
        let e = "file:///tmp/a?sync=none".parse::<AnchorSpec>().unwrap_err();
        assert!(e.contains("sync=none"), "{e}");
        assert!("".parse::<AnchorSpec>().is_err());
    }

    #[tokio::test]
    async fn the_newest_record_survives_a_torn_write_and_another_key_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let spec: AnchorSpec = dir.path().join("a").to_str().unwrap().parse().unwrap();
        let key = MasterKey::from_bytes([5; 32]);
        let a = Anchor::open(&spec, &key).await.unwrap();
        assert_eq!(a.read().await.unwrap(), None, "a fresh anchor holds nothing");
        a.write(record(5)).await.unwrap();
        a.write(record(7)).await.unwrap();
        assert_eq!(a.read().await.unwrap(), Some(record(7)));
        drop(a);
        // Reopened, the next write goes to the older slot: a write torn there keeps 7.
        let a = Anchor::open(&spec, &key).await.unwrap();
        a.write(record(9)).await.unwrap();
        assert_eq!(a.read().await.unwrap(), Some(record(9)));
        a.store.write(vec![(CellId(0), vec![0xA5; RECORD + CellSealer::OVERHEAD])]).await.unwrap();
        assert_eq!(a.read().await.unwrap(), Some(record(7)), "slot 0 held the newest record");
        // The check: a log reaching 7 passes, one reaching 6 is a rollback.
        assert!(a.check(7).await.unwrap().is_some());
        let e = a.check(6).await.unwrap_err().to_string();
        assert!(e.contains("rolled the gateway back") && e.contains("last 1 entries"), "{e}");
        // Under another key the anchor does not open: an error, never "empty".
        drop(a);
        let other = Anchor::open(&spec, &MasterKey::from_bytes([6; 32])).await.unwrap_err();
        assert!(other.to_string().contains("does not open under this key"), "{other}");
    }
}
