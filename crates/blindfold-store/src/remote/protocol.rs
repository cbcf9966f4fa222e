//! The wire protocol between [`RemoteStore`](super::RemoteStore) and `blindfold storage-server`
//! (version 1). Every integer is little-endian; `docs/design.md` draws the same bytes.
//!
//! # Connection
//!
//! The client opens a TCP connection and sends a 20-byte hello: the magic
//! `"blindfold-store\0"` (16 bytes) and the protocol version (u32, 1). The server answers with
//! the same 20 bytes carrying its own version, and closes the connection if it cannot speak the
//! client's. After that both sides exchange *frames*: a u32 length (of what follows, at most
//! [`MAX_FRAME`]) and that many bytes.
//!
//! # Requests and responses
//!
//! ```text
//! request   id u64 | op u8 | body
//! response  id u64 | status u8 (0 = ok, 1 = error) | body
//! ```
//!
//! The id is chosen by the client and echoed by the server; a client may send many requests
//! without waiting (pipelining) and the server may answer them in any order. Requests that were
//! in flight together carry no ordering promise; a request sent after another one's response
//! arrived sees its effects.
//!
//! | op | name | request body | ok body |
//! |---|---|---|---|
//! | 1 | open | cell_count u64, cell_size u32, name_len u16, name (ASCII) | handle u32 |
//! | 2 | read | handle u32, n u32, n × cell u64 | n × cell_size bytes |
//! | 3 | read ranges | handle u32, n u32, n × (cell u64, offset u32, len u32) | the ranges, concatenated |
//! | 4 | write | handle u32, n u32, n × (cell u64, len u32), then the n buffers | empty |
//! | 5 | flush | handle u32 | empty |
//! | 6 | read xor | as read ranges | one range's length of bytes: the XOR of all ranges |
//!
//! `open` names an array of the server's store (created with that shape if missing) and
//! returns a handle valid on this connection only. Opening an existing array with another
//! shape fails.
//!
//! An error body is `kind u8 | retryable u8 | a u64 | b u64 | c u32 | d u32 | msg_len u32 |
//! msg (UTF-8)`; the numbers carry the fields of the [`StoreError`] variant named by `kind`
//! (unused ones are 0):
//!
//! | kind | error | a | b | c | d |
//! |---|---|---|---|---|---|
//! | 0 | other (message only) | | | | |
//! | 1 | cell out of range | cell | cell_count | | |
//! | 2 | range out of cell | cell | | offset | len, with cell_size in `b` |
//! | 3 | wrong cell size | cell | bytes given | expected | |
//! | 4 | geometry mismatch | found cells | wanted cells | found size | wanted size |
//! | 5 | invalid request | | | | |
//! | 6 | unsupported | | | | |
//! | 7 | I/O error | | | | |
//! | 8 | timed out | | | | |
//! | 9 | invalid geometry | | | | |
//!
//! # Security
//!
//! The protocol adds neither encryption nor authentication: everything it carries is already
//! sealed by the layers above, and the server and the network are untrusted by design. What
//! the server learns is exactly what a [`Store`](crate::Store) learns, plus the array names.

use std::path::PathBuf;

use crate::{ByteRange, CellId, StoreError};

/// First 16 bytes of each side's hello.
pub const MAGIC: [u8; 16] = *b"blindfold-store\0";
/// The protocol version this build speaks.
pub const VERSION: u32 = 1;
/// Length of a hello: magic and version.
pub const HELLO_LEN: usize = 20;
/// Largest frame either side accepts (1 GiB); a larger request fails with
/// [`StoreError::InvalidRequest`] before it is sent.
pub const MAX_FRAME: usize = 1 << 30;

/// Operation codes.
pub mod op {
    /// Open (or create) a named array.
    pub const OPEN: u8 = 1;
    /// Read whole cells.
    pub const READ: u8 = 2;
    /// Read byte ranges.
    pub const READ_RANGES: u8 = 3;
    /// Write whole cells.
    pub const WRITE: u8 = 4;
    /// Durability barrier.
    pub const FLUSH: u8 = 5;
    /// XOR byte ranges on the server.
    pub const READ_XOR: u8 = 6;
}

/// The hello each side sends first.
pub fn hello() -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..16].copy_from_slice(&MAGIC);
    h[16..].copy_from_slice(&VERSION.to_le_bytes());
    h
}

/// The version in a hello, or why it is not one.
pub fn parse_hello(h: &[u8; HELLO_LEN]) -> Result<u32, String> {
    if h[..16] != MAGIC {
        return Err("the peer does not speak the blindfold storage protocol".into());
    }
    Ok(u32::from_le_bytes(h[16..].try_into().unwrap()))
}

/// A little-endian writer into a growing buffer.
#[derive(Debug, Default)]
pub struct Encoder(pub Vec<u8>);

impl Encoder {
    /// A frame under construction: room for the length, filled in by [`Encoder::finish`].
    pub fn frame() -> Self {
        Self(vec![0u8; 4])
    }
    /// Appends a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// Appends a u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    /// Fills in the frame length; fails if the frame is larger than [`MAX_FRAME`].
    pub fn finish(mut self) -> Result<Vec<u8>, StoreError> {
        let len = self.0.len() - 4;
        if len > MAX_FRAME {
            return Err(StoreError::InvalidRequest(format!(
                "a request of {len} bytes is larger than the protocol's {MAX_FRAME}-byte frames; \
                 split the batch"
            )));
        }
        self.0[..4].copy_from_slice(&(len as u32).to_le_bytes());
        Ok(self.0)
    }
}

/// A little-endian reader over one frame.
#[derive(Debug)]
pub struct Decoder<'a> {
    buf: &'a [u8],
}

impl<'a> Decoder<'a> {
    /// Reads from `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
    /// Takes `n` bytes.
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!(
                "frame ends early: wanted {n} more bytes, {} left",
                self.buf.len()
            ));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    /// Takes a byte.
    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    /// Takes a u16.
    pub fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    /// Takes a u32.
    pub fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    /// Takes a u64.
    pub fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    /// What is left.
    pub fn rest(&self) -> &'a [u8] {
        self.buf
    }
    /// Fails unless the whole frame was consumed.
    pub fn end(&self) -> Result<(), String> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected bytes at the end of a frame", self.buf.len()))
        }
    }
    /// Takes a count `n` and checks that at least `n * item` bytes follow, so a hostile count
    /// cannot make us allocate more than the frame holds.
    pub fn count(&mut self, item: usize) -> Result<usize, String> {
        let n = self.u32()? as usize;
        if n.saturating_mul(item) > self.buf.len() {
            return Err(format!("a count of {n} items does not fit in the frame"));
        }
        Ok(n)
    }
    /// Takes `n u32, n × cell u64`.
    pub fn cells(&mut self) -> Result<Vec<CellId>, String> {
        let n = self.count(8)?;
        (0..n).map(|_| self.u64().map(CellId)).collect()
    }
    /// Takes `n u32, n × (cell u64, offset u32, len u32)`.
    pub fn ranges(&mut self) -> Result<Vec<ByteRange>, String> {
        let n = self.count(16)?;
        (0..n)
            .map(|_| {
                Ok(ByteRange { cell: CellId(self.u64()?), offset: self.u32()?, len: self.u32()? })
            })
            .collect()
    }
}

/// Appends `n u32, n × (cell u64, offset u32, len u32)`.
pub fn put_ranges(e: &mut Encoder, ranges: &[ByteRange]) {
    e.u32(ranges.len() as u32);
    for r in ranges {
        e.u64(r.cell.0).u32(r.offset).u32(r.len);
    }
}

/// Appends an error body for `err`.
pub fn put_error(e: &mut Encoder, err: &StoreError) {
    let (kind, a, b, c, d) = match err {
        StoreError::OutOfRange { cell, cell_count } => (1u8, cell.0, *cell_count, 0u32, 0u32),
        StoreError::RangeOutOfCell { cell, offset, len, cell_size } => {
            (2, cell.0, u64::from(*cell_size), *offset, *len)
        }
        StoreError::WrongCellSize { cell, got, expected } => (3, cell.0, *got as u64, *expected, 0),
        StoreError::GeometryMismatch {
            found_cells, found_size, wanted_cells, wanted_size, ..
        } => (4, *found_cells, *wanted_cells, *found_size, *wanted_size),
        StoreError::InvalidRequest(_) => (5, 0, 0, 0, 0),
        StoreError::Unsupported(_) => (6, 0, 0, 0, 0),
        StoreError::Io { .. } => (7, 0, 0, 0, 0),
        StoreError::Timeout(_) => (8, 0, 0, 0, 0),
        StoreError::InvalidGeometry(_) => (9, 0, 0, 0, 0),
        _ => (0, 0, 0, 0, 0),
    };
    let msg = match err {
        StoreError::InvalidRequest(m)
        | StoreError::Unsupported(m)
        | StoreError::Timeout(m)
        | StoreError::InvalidGeometry(m) => m.clone(),
        StoreError::GeometryMismatch { path, .. } => path.display().to_string(),
        other => other.to_string(),
    };
    e.u8(kind).u8(u8::from(err.is_retryable())).u64(a).u64(b).u32(c).u32(d);
    e.u32(msg.len() as u32).bytes(msg.as_bytes());
}

/// The [`StoreError`] an error body describes.
pub fn get_error(d: &mut Decoder<'_>) -> Result<StoreError, String> {
    let kind = d.u8()?;
    let retryable = d.u8()? != 0;
    let (a, b, c, e) = (d.u64()?, d.u64()?, d.u32()?, d.u32()?);
    let n = d.u32()? as usize;
    let msg = String::from_utf8_lossy(d.take(n)?).into_owned();
    Ok(match kind {
        1 => StoreError::OutOfRange { cell: CellId(a), cell_count: b },
        2 => StoreError::RangeOutOfCell { cell: CellId(a), offset: c, len: e, cell_size: b as u32 },
        3 => StoreError::WrongCellSize { cell: CellId(a), got: b as usize, expected: c },
        4 => StoreError::GeometryMismatch {
            path: PathBuf::from(format!("remote array {msg}")),
            found_cells: a,
            found_size: c,
            wanted_cells: b,
            wanted_size: e,
        },
        5 => StoreError::InvalidRequest(msg),
        6 => StoreError::Unsupported(msg),
        7 => StoreError::Io {
            context: "on the storage server".into(),
            source: std::io::Error::other(msg),
            retryable,
        },
        8 => StoreError::Timeout(msg),
        9 => StoreError::InvalidGeometry(msg),
        _ => StoreError::Remote { message: msg, retryable },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip() {
        let errors = [
            StoreError::OutOfRange { cell: CellId(7), cell_count: 5 },
            StoreError::RangeOutOfCell { cell: CellId(1), offset: 3, len: 9, cell_size: 8 },
            StoreError::WrongCellSize { cell: CellId(2), got: 3, expected: 4 },
            StoreError::InvalidRequest("x".into()),
            StoreError::Timeout("slow".into()),
        ];
        for err in errors {
            let mut e = Encoder::default();
            put_error(&mut e, &err);
            let back = get_error(&mut Decoder::new(&e.0)).unwrap();
            assert_eq!(format!("{err:?}"), format!("{back:?}"));
            assert_eq!(err.is_retryable(), back.is_retryable());
        }
    }

    #[test]
    fn hostile_counts_are_refused() {
        let mut e = Encoder::default();
        e.u32(u32::MAX).u64(1);
        assert!(Decoder::new(&e.0).cells().is_err());
    }
}
