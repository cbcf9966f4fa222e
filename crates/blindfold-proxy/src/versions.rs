use serde::{Deserialize, Serialize};

/// Trusted write counters and key epochs, one of each per cell. A cell's version is bound into
/// its seal, so the store cannot hand back an older ciphertext of a cell (rollback) or another
/// cell's ciphertext (swap) without failing authentication. Version 0 means "never written".
///
/// The key epoch a cell was last sealed under is recorded too, and a cell is opened only if its
/// header names exactly that epoch. Within one timeline versions alone suffice; but two
/// timelines that diverged from one saved state (a `recover` from a snapshot after which the
/// lost gateway went on writing) reuse the same versions, and the epoch is what tells their
/// ciphertexts apart: `recover` reseals everything under a fresh random epoch, so the lost
/// timeline's cells (other epochs) are refused even when their version matches.
///
/// Costs 12 bytes of trusted memory per cell, i.e. well under 0.1 % of the data for 4 KiB
/// blocks and Z = 4.
///
/// # Format
///
/// Serialized as `{ versions: Vec<u64>, epochs: Vec<u32> }` (two sequences of equal length);
/// tables saved before epochs were recorded held only `versions` and are read with
/// [`VersionTable::from_legacy`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Repr")]
pub struct VersionTable {
    versions: Vec<u64>,
    /// Key epoch of each cell's current version; [`VersionTable::ANY_EPOCH`] if unknown.
    epochs: Vec<u32>,
}

#[derive(Deserialize)]
struct Repr {
    versions: Vec<u64>,
    epochs: Vec<u32>,
}

impl TryFrom<Repr> for VersionTable {
    type Error = String;
    fn try_from(r: Repr) -> Result<Self, String> {
        if r.versions.len() != r.epochs.len() {
            return Err(format!(
                "version table: {} versions but {} epochs",
                r.versions.len(),
                r.epochs.len()
            ));
        }
        Ok(Self { versions: r.versions, epochs: r.epochs })
    }
}

/// The key epoch named by the header of a sealed cell (its first 4 bytes), or `None` if it is
/// too short to have one.
pub(crate) fn sealed_epoch(sealed: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(sealed.get(..4)?.try_into().expect("4 bytes")))
}

impl VersionTable {
    /// Marks a cell whose epoch is not known (tables saved before epochs were recorded, and
    /// the in-memory baseline): any epoch the sealer accepts is accepted.
    pub const ANY_EPOCH: u32 = u32::MAX;

    /// All cells at version 0.
    pub fn new(cells: u64) -> Self {
        Self { versions: vec![0; cells as usize], epochs: vec![0; cells as usize] }
    }

    /// A table saved before epochs were recorded: every cell's epoch is unknown until it is
    /// next sealed (cells are then checked as before: version only).
    pub fn from_legacy(versions: Vec<u64>) -> Self {
        let epochs = vec![Self::ANY_EPOCH; versions.len()];
        Self { versions, epochs }
    }

    /// Number of cells covered.
    pub fn len(&self) -> u64 {
        self.versions.len() as u64
    }

    /// Whether the table covers no cells.
    pub fn is_empty(&self) -> bool {
        self.versions.is_empty()
    }

    /// Current version of `cell` (0 if never written).
    pub fn get(&self, cell: u64) -> u64 {
        self.versions[cell as usize]
    }

    /// Key epoch `cell`'s current version was sealed under ([`Self::ANY_EPOCH`] if unknown).
    pub fn epoch(&self, cell: u64) -> u32 {
        self.epochs[cell as usize]
    }

    /// The version the next write of `cell` will carry.
    pub fn next(&self, cell: u64) -> u64 {
        self.versions[cell as usize] + 1
    }

    /// Records that `cell` now holds `version`. The caller records its epoch as well, with
    /// [`VersionTable::set_epoch`], before the cell is opened again; [`VersionTable::record`]
    /// does both.
    pub fn set(&mut self, cell: u64, version: u64) {
        self.versions[cell as usize] = version;
    }

    /// Records the key epoch `cell`'s current version was sealed under.
    pub fn set_epoch(&mut self, cell: u64, epoch: u32) {
        self.epochs[cell as usize] = epoch;
    }

    /// Records that `cell` now holds `sealed`, sealed under `version`: the epoch is read from
    /// the seal's header.
    pub fn record(&mut self, cell: u64, version: u64, sealed: &[u8]) {
        self.versions[cell as usize] = version;
        self.epochs[cell as usize] = sealed_epoch(sealed).unwrap_or(Self::ANY_EPOCH);
    }

    /// Bytes of trusted memory used.
    pub fn trusted_bytes(&self) -> u64 {
        self.versions.len() as u64 * 12
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_round_trip_and_mismatched_lengths_refused() {
        let mut t = VersionTable::new(3);
        t.record(1, 5, &[7, 0, 0, 0, 9, 9]);
        let bytes = bincode::serialize(&t).unwrap();
        let back: VersionTable = bincode::deserialize(&bytes).unwrap();
        assert_eq!(back, t);
        assert_eq!((back.get(1), back.epoch(1)), (5, 7));
        let bad = bincode::serialize(&(vec![1u64, 2], vec![0u32])).unwrap();
        assert!(bincode::deserialize::<VersionTable>(&bad).is_err());
    }
}
