//! Sealing and opening cells against their trusted versions: every engine's cells go through
//! these, so a modified, swapped or rolled-back cell is an integrity error wherever it is read.

use blindfold_crypto::{CellAd, CellSealer, CryptoError};
use blindfold_store::{CellId, Geometry};

use crate::error::integrity;
use crate::{ProxyError, Result, VersionTable};

/// Bytes in front of the ciphertext in a sealed cell (key epoch and nonce); the rest of
/// [`CellSealer::OVERHEAD`] is the tag at the end.
const SEAL_HEADER: usize = CellSealer::OVERHEAD - 16;

/// Refuses a store whose cells are of another size than `needed`'s, or fewer.
pub(crate) fn check_geometry(found: Geometry, needed: Geometry) -> Result<()> {
    crate::error::check_array(found, needed, "the store")
}

/// Opens fetched cells against the trusted versions. Cells at version 0 were never written:
/// their contents are ignored (the read was still issued, so the store saw nothing special).
pub(crate) fn open_cells(
    sealer: &CellSealer,
    versions: &VersionTable,
    cells: &[CellId],
    fetched: Vec<Vec<u8>>,
) -> Result<Vec<Option<Vec<u8>>>> {
    let mut out = Vec::with_capacity(cells.len());
    for (cell, buf) in cells.iter().zip(fetched) {
        let version = versions.get(cell.0);
        if version == 0 {
            out.push(None);
            continue;
        }
        out.push(Some(open_cell(sealer, *cell, version, versions.epoch(cell.0), buf)?));
    }
    Ok(out)
}

/// Seals plaintext cells under their next versions and records those versions.
pub(crate) fn seal_cells(
    sealer: &CellSealer,
    versions: &mut VersionTable,
    plain: Vec<(CellId, Vec<u8>)>,
) -> Result<Vec<(CellId, Vec<u8>)>> {
    let mut out = Vec::with_capacity(plain.len());
    for (cell, data) in plain {
        let version = versions.next(cell.0);
        let sealed = seal_cell(sealer, cell, version, &data)?;
        versions.record(cell.0, version, &sealed);
        out.push((cell, sealed));
    }
    Ok(out)
}

/// Seals one plaintext cell under `version` (which the caller records as the cell's version).
pub(crate) fn seal_cell(
    sealer: &CellSealer,
    cell: CellId,
    version: u64,
    data: &[u8],
) -> Result<Vec<u8>> {
    seal_cell_with(sealer, cell, version, data.len(), |buf| buf.extend_from_slice(data))
}

/// Seals one cell under `version` (which the caller records) whose plaintext `encode`
/// appends to the buffer it is given: the plaintext is built where it is encrypted, after the
/// room for the seal's header ([`CellSealer::seal_vec`]), with no zeroed buffer and no copy.
pub(crate) fn seal_cell_with(
    sealer: &CellSealer,
    cell: CellId,
    version: u64,
    plain_len: usize,
    encode: impl FnOnce(&mut Vec<u8>),
) -> Result<Vec<u8>> {
    let ad = CellAd { cell: cell.0, version, segment: 0 };
    let mut buf = Vec::with_capacity(plain_len + CellSealer::OVERHEAD);
    buf.resize(CellSealer::HEADER, 0);
    encode(&mut buf);
    sealer.seal_vec(&ad, &mut buf).map_err(ProxyError::Crypto)?;
    Ok(buf)
}

/// Refuses a sealed cell whose header names another key epoch than `epoch` (the one its
/// trusted version was sealed under), unless that is [`VersionTable::ANY_EPOCH`].
pub(crate) fn check_epoch(cell: u64, epoch: u32, sealed: &[u8]) -> Result<()> {
    if epoch == VersionTable::ANY_EPOCH || crate::versions::sealed_epoch(sealed) == Some(epoch) {
        return Ok(());
    }
    Err(ProxyError::Integrity { cell, source: CryptoError::Integrity { cell, segment: 0 } })
}

/// Opens one fetched cell sealed under `version` (non-zero) and key epoch `epoch` (see
/// [`check_epoch`]) and returns its plaintext.
pub(crate) fn open_cell(
    sealer: &CellSealer,
    cell: CellId,
    version: u64,
    epoch: u32,
    buf: Vec<u8>,
) -> Result<Vec<u8>> {
    let (mut buf, plain) = open_cell_in(sealer, cell, version, epoch, buf)?;
    buf.truncate(plain.end);
    buf.drain(..plain.start);
    Ok(buf)
}

/// As [`open_cell`], for a caller that only reads the plaintext: returns the buffer opened in
/// place and where in it the plaintext lies, sparing a move of the whole cell to its front.
pub(crate) fn open_cell_in(
    sealer: &CellSealer,
    cell: CellId,
    version: u64,
    epoch: u32,
    mut buf: Vec<u8>,
) -> Result<(Vec<u8>, std::ops::Range<usize>)> {
    check_epoch(cell.0, epoch, &buf)?;
    let ad = CellAd { cell: cell.0, version, segment: 0 };
    let len =
        sealer.open_in_place(&ad, &mut buf).map_err(|source| integrity(cell.0, source))?.len();
    Ok((buf, SEAL_HEADER..SEAL_HEADER + len))
}
