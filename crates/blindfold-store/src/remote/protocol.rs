//! The wire protocol between [`RemoteStore`](super::RemoteStore) and `blindfold storage-server`
//! (version 2). Every integer is little-endian; `docs/design.md` draws the same bytes.
//!
//! # Connection and handshake
//!
//! ```text
//! client → server  hello      magic "blindfold-store\0" (16) | version u32 (2)
//! server → client  hello      the same 20 bytes with the server's version
//! server → client  challenge  auth u8 (0 none, 1 pre-shared key) | server nonce (32)
//! client → server  response   client nonce (32) | proof (32)
//! server → client  verdict    0 | server proof (32) | max_frame u32      (accepted)
//!                             1 | msg_len u16 | msg (UTF-8, ≤ 1024)      (refused; then close)
//! ```
//!
//! With a key `K`, the client's proof is `HMAC-SHA256(K, "blindfold-storage-auth v2 client" |
//! server nonce | client nonce)` and the server's the same with `… server`; each side checks
//! the other's in constant time, so both prove they hold `K` and neither proof can be replayed
//! on another connection (the other side's nonce is fresh). A server started with
//! `--insecure-no-auth` sends auth 0 and a zero nonce, ignores the response and sends a zero
//! proof; a client that holds a key refuses such a server, one without a key refuses a server
//! that asks for one. The server closes the connection if the versions differ. `max_frame` is
//! the largest frame the server accepts, so the client refuses a larger batch before sending
//! it. After the handshake both sides exchange *frames*: a u32 length (of what follows) and
//! that many bytes.
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
//! | 7 | read select | handle u32, key, select | the select's answer |
//! | 8 | read select combined | handle u32, g u32, key (if g > 0), g × select, outer | the combined answer |
//! | 9 | write select | handle u32, n u32, key (if n > 0), n × (target u64, select) | empty |
//! | 10 | TEE query | handle u32, cells as read, ticket | the trusted component's answer |
//! | 11 | TEE evict | handle u32, n u32, n × len u32, the n blocks, l u32, l × layer | empty |
//! | 12 | lease load | name | 0, or 1, token, record |
//! | 13 | lease swap | name, 0 or 1 and token, record | swapped u8 (0 or 1) |
//!
//! `open` names an array of the server's store (created with that shape if missing) and
//! returns a handle valid on this connection only. Opening an existing array with another
//! shape fails.
//!
//! Ops 7–9 carry Onion ORAM's homomorphic selects (`SelectStore`, feature
//! `select`; a build without it answers them with "unsupported"). One Damgård–Jurik public key
//! serves the whole request:
//!
//! ```text
//! key          key_len u32 (≤ MAX_KEY_BYTES) | PublicKey::to_bytes
//! ciphertexts  n u32 | n × (layer u8 | ciphertext: ciphertext_len(layer) bytes, big-endian)
//! select       selector: ciphertexts (n ≥ 1) | chunk_len u32 | ranges as read ranges (≥ 1)
//! outer        ciphertexts (none when there are no groups)
//! ```
//!
//! The decoder checks the key (`PublicKey::from_bytes`) and every ciphertext (range and
//! invertibility under the key) before the request runs; the shape of each select (one selector
//! element per range, one layer, equal lengths, chunking) is checked by the store, as for a
//! local one. New operation codes did not change the version: a server that does not know one
//! answers it with an "unsupported" error and the connection goes on.
//!
//! Ops 10 and 11 carry the TEE design's requests (`TeeStore`, seed 004): a query names the
//! cells the server's host reads and hands to its trusted component with the sealed ticket;
//! an eviction round carries the blocks the gateway uploads and, per layer, the cells read
//! and written and the layer's sealed ticket:
//!
//! ```text
//! ticket       ticket_len u32 (≤ MAX_TEE_TICKET) | ticket bytes
//! layer        read: n u32, n × cell u64 | write: n u32, n × cell u64 | ticket
//! ```
//!
//! The decoder bounds every count by the bytes left and by the limits of `blindfold_store::tee`
//! (cells per query or layer, layers per round, ticket length); the shape (equal read and write
//! counts, one cell per incoming block, cells in range) is checked by the store, as for a local
//! one. A server without a trusted component answers both with "unsupported".
//!
//! Ops 12 and 13 carry the lease capability's atomic step (`LeaseRecords`): they name no
//! array, and work on the server's lease records, one small record per lease name. The
//! server compares and replaces a record in one step: a swap with token 0 succeeds only if
//! there is no record, with token 1 only if the record's token is still the one given (the
//! server's token is the record itself); it answers 1 if it wrote, 0 if not.
//!
//! ```text
//! name    name_len u16 (≤ 128) | name (a valid array name: ASCII letters, digits, `.`, `_`, `-`)
//! token   token_len u16 (≤ MAX_LEASE_RECORD) | token bytes
//! record  record_len u16 (≤ MAX_LEASE_RECORD) | record bytes
//! ```
//!
//! An error body is `kind u8 | retryable u8 | a u64 | b u64 | c u32 | d u32 | msg_len u32 |
//! msg (UTF-8)`, at most [`MAX_ERROR_BODY`] bytes; the numbers carry the fields of the
//! [`StoreError`] variant named by `kind` (unused ones are 0):
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
//! | 10 | the trusted component refused | integrity (0 or 1) | | | |
//!
//! # Sizes
//!
//! Every length is checked before anything is allocated for it: a frame against the reader's
//! limit (the server's `max_frame`; on the client, the answer its request can have — an ok
//! body exactly as long as the request asks for, an error body at most [`MAX_ERROR_BODY`]), a
//! count against the bytes left in the frame.
//!
//! # Security
//!
//! The handshake authenticates both ends; it does not encrypt or authenticate the frames that
//! follow. Everything they carry is sealed by the layers above (so tampering is detected
//! there), and the server is untrusted by design; what an attacker on the network can do to the
//! frames is what the server itself could. What the key keeps away is the use of the server by
//! anyone else: a peer without it is refused after the handshake and can neither read, write
//! nor exhaust the arrays.

use std::path::PathBuf;
#[cfg(feature = "select")]
use std::sync::Arc;

#[cfg(feature = "select")]
use blindfold_dj::{Ciphertext, PublicKey};

use crate::{ByteRange, CellId, LoadedRecord, StoreError, TeeLayer, TeeRound, MAX_LEASE_RECORD};
#[cfg(feature = "select")]
use crate::{CombinedSelect, SelectRequest, SelectWrite};
use crate::{MAX_TEE_CELLS, MAX_TEE_LAYERS, MAX_TEE_TICKET};

/// First 16 bytes of each side's hello.
pub const MAGIC: [u8; 16] = *b"blindfold-store\0";
/// The protocol version this build speaks.
pub const VERSION: u32 = 2;
/// Length of a hello: magic and version.
pub const HELLO_LEN: usize = 20;
/// Largest frame this build can send or accept (1 GiB); a server may accept less (it says so in
/// the handshake), and a larger request fails with [`StoreError::InvalidRequest`] before it is
/// sent.
pub const MAX_FRAME: usize = 1 << 30;
/// Smallest frame: a request's id and op, a response's id and status.
pub const FRAME_HEAD: usize = 9;
/// Largest error body (header and message).
pub const MAX_ERROR_BODY: usize = 30 + MAX_ERROR_MESSAGE;
/// Longest message in an error body; longer ones are cut.
pub const MAX_ERROR_MESSAGE: usize = 4096;
/// Length of each side's nonce.
pub const NONCE_LEN: usize = 32;
/// Length of each side's proof.
pub const PROOF_LEN: usize = 32;
/// Length of the server's challenge: auth mode and nonce.
pub const CHALLENGE_LEN: usize = 1 + NONCE_LEN;
/// Length of the client's response: nonce and proof.
pub const RESPONSE_LEN: usize = NONCE_LEN + PROOF_LEN;
/// Length of an accepting verdict after its status byte: server proof and max frame.
pub const ACCEPT_LEN: usize = PROOF_LEN + 4;
/// Longest refusal message.
pub const MAX_REFUSAL: usize = 1024;
/// Challenge auth mode: the server takes anyone (`--insecure-no-auth`).
pub const AUTH_NONE: u8 = 0;
/// Challenge auth mode: the client must prove it holds the pre-shared key.
pub const AUTH_KEY: u8 = 1;
/// Longest encoded public key in a select request: `PublicKey::to_bytes` of the largest
/// modulus `blindfold-dj` accepts (8192 bits).
pub const MAX_KEY_BYTES: usize = 12 + 8192 / 8;

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
    /// Homomorphic select on the server (feature `select`).
    pub const READ_SELECT: u8 = 7;
    /// Several selects combined by one more (feature `select`).
    pub const READ_SELECT_COMBINED: u8 = 8;
    /// Selects whose answers the server writes into cells (feature `select`).
    pub const WRITE_SELECT: u8 = 9;
    /// A query answered by the server's trusted component (`TeeStore::tee_query`).
    pub const TEE_QUERY: u8 = 10;
    /// An eviction round run by the server's host and trusted component
    /// (`TeeStore::tee_evict`).
    pub const TEE_EVICT: u8 = 11;
    /// Read a lease record and its token (`LeaseRecords::load`).
    pub const LEASE_LOAD: u8 = 12;
    /// Replace a lease record if its token is unchanged (`LeaseRecords::swap`).
    pub const LEASE_SWAP: u8 = 13;
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

/// The server's challenge.
pub fn challenge(auth: u8, nonce: &[u8; NONCE_LEN]) -> [u8; CHALLENGE_LEN] {
    let mut c = [0u8; CHALLENGE_LEN];
    c[0] = auth;
    c[1..].copy_from_slice(nonce);
    c
}

/// Whether the server asks for a key (and its nonce), or why the bytes are no challenge.
pub fn parse_challenge(c: &[u8; CHALLENGE_LEN]) -> Result<(bool, [u8; NONCE_LEN]), String> {
    let keyed = match c[0] {
        AUTH_NONE => false,
        AUTH_KEY => true,
        m => return Err(format!("unknown authentication mode {m}")),
    };
    Ok((keyed, c[1..].try_into().unwrap()))
}

/// An accepting verdict: status 0, the server's proof, its largest frame.
pub fn accept(proof: &[u8; PROOF_LEN], max_frame: u32) -> Vec<u8> {
    let mut e = Encoder::default();
    e.u8(0).bytes(proof).u32(max_frame);
    e.0
}

/// A refusing verdict: status 1 and a message (cut to [`MAX_REFUSAL`] bytes).
pub fn refuse(message: &str) -> Vec<u8> {
    let msg = cut(message, MAX_REFUSAL);
    let mut e = Encoder::default();
    e.u8(1).u16(msg.len() as u16).bytes(msg.as_bytes());
    e.0
}

/// The body of an accepting verdict (after its status byte): the server's proof and its
/// largest frame (which must be at least [`FRAME_HEAD`] bytes and at most [`MAX_FRAME`]).
pub fn parse_accept(b: &[u8; ACCEPT_LEN]) -> Result<([u8; PROOF_LEN], usize), String> {
    let proof = b[..PROOF_LEN].try_into().unwrap();
    let max_frame = u32::from_le_bytes(b[PROOF_LEN..].try_into().unwrap()) as usize;
    if !(FRAME_HEAD..=MAX_FRAME).contains(&max_frame) {
        return Err(format!("a largest frame of {max_frame} bytes"));
    }
    Ok((proof, max_frame))
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// One request, as the client sends it and the server decodes it.
///
/// Non-exhaustive: the select operations exist only with the `select` feature, which another
/// crate of a build may turn on, so code outside this crate answers requests it does not know.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    /// Open (creating if missing) the array `name` of this shape.
    Open {
        /// Number of cells.
        cell_count: u64,
        /// Bytes per cell.
        cell_size: u32,
        /// The array's name.
        name: String,
    },
    /// Read whole cells.
    Read {
        /// From `open`.
        handle: u32,
        /// The cells.
        cells: Vec<CellId>,
    },
    /// Read byte ranges.
    ReadRanges {
        /// From `open`.
        handle: u32,
        /// The ranges.
        ranges: Vec<ByteRange>,
    },
    /// Write whole cells.
    Write {
        /// From `open`.
        handle: u32,
        /// The cells and their new contents.
        cells: Vec<(CellId, Vec<u8>)>,
    },
    /// Durability barrier.
    Flush {
        /// From `open`.
        handle: u32,
    },
    /// XOR byte ranges on the server.
    ReadXor {
        /// From `open`.
        handle: u32,
        /// The ranges, all of one length.
        ranges: Vec<ByteRange>,
    },
    /// A homomorphic select on the server.
    #[cfg(feature = "select")]
    ReadSelect {
        /// From `open`.
        handle: u32,
        /// The select.
        request: SelectRequest,
    },
    /// Several selects combined by one more on the server.
    #[cfg(feature = "select")]
    ReadSelectCombined {
        /// From `open`.
        handle: u32,
        /// The selects and the outer selector.
        request: CombinedSelect,
    },
    /// Selects whose answers the server writes into cells.
    #[cfg(feature = "select")]
    WriteSelect {
        /// From `open`.
        handle: u32,
        /// The selects and their targets.
        writes: Vec<SelectWrite>,
    },
    /// A query answered by the server's trusted component.
    TeeQuery {
        /// From `open`.
        handle: u32,
        /// The candidates' cells.
        cells: Vec<CellId>,
        /// The sealed query ticket.
        ticket: Vec<u8>,
    },
    /// An eviction round run by the server's host and trusted component.
    TeeEvict {
        /// From `open`.
        handle: u32,
        /// The round.
        round: TeeRound,
    },
    /// Read a lease record and its token.
    LeaseLoad {
        /// The lease's name.
        name: String,
    },
    /// Replace a lease record if its token is unchanged.
    LeaseSwap {
        /// The lease's name.
        name: String,
        /// The token read with the record (`None`: succeed only if there is no record).
        expected: Option<Vec<u8>>,
        /// The new record.
        record: Vec<u8>,
    },
}

impl Request {
    /// Its operation code.
    pub fn op(&self) -> u8 {
        match self {
            Request::Open { .. } => op::OPEN,
            Request::Read { .. } => op::READ,
            Request::ReadRanges { .. } => op::READ_RANGES,
            Request::Write { .. } => op::WRITE,
            Request::Flush { .. } => op::FLUSH,
            Request::ReadXor { .. } => op::READ_XOR,
            Request::TeeQuery { .. } => op::TEE_QUERY,
            Request::TeeEvict { .. } => op::TEE_EVICT,
            Request::LeaseLoad { .. } => op::LEASE_LOAD,
            Request::LeaseSwap { .. } => op::LEASE_SWAP,
            #[cfg(feature = "select")]
            Request::ReadSelect { .. } => op::READ_SELECT,
            #[cfg(feature = "select")]
            Request::ReadSelectCombined { .. } => op::READ_SELECT_COMBINED,
            #[cfg(feature = "select")]
            Request::WriteSelect { .. } => op::WRITE_SELECT,
        }
    }

    /// The array handle it is addressed to (`None` for `open` and the lease operations).
    pub fn handle(&self) -> Option<u32> {
        match self {
            Request::Open { .. } | Request::LeaseLoad { .. } | Request::LeaseSwap { .. } => None,
            Request::Read { handle, .. }
            | Request::ReadRanges { handle, .. }
            | Request::ReadXor { handle, .. }
            | Request::Write { handle, .. }
            | Request::Flush { handle }
            | Request::TeeQuery { handle, .. }
            | Request::TeeEvict { handle, .. } => Some(*handle),
            #[cfg(feature = "select")]
            Request::ReadSelect { handle, .. }
            | Request::ReadSelectCombined { handle, .. }
            | Request::WriteSelect { handle, .. } => Some(*handle),
        }
    }

    /// Appends its body.
    pub fn encode_body(&self, e: &mut Encoder) {
        match self {
            Request::Open { cell_count, cell_size, name } => {
                e.u64(*cell_count).u32(*cell_size).u16(name.len() as u16).bytes(name.as_bytes());
            }
            Request::Read { handle, cells } => {
                e.u32(*handle).u32(cells.len() as u32);
                for c in cells {
                    e.u64(c.0);
                }
            }
            Request::ReadRanges { handle, ranges } | Request::ReadXor { handle, ranges } => {
                e.u32(*handle);
                put_ranges(e, ranges);
            }
            Request::Write { handle, cells } => {
                e.u32(*handle).u32(cells.len() as u32);
                for (c, data) in cells {
                    e.u64(c.0).u32(data.len() as u32);
                }
                for (_, data) in cells {
                    e.bytes(data);
                }
            }
            Request::Flush { handle } => {
                e.u32(*handle);
            }
            Request::LeaseLoad { name } => put_short(e, name.as_bytes()),
            Request::LeaseSwap { name, expected, record } => {
                put_short(e, name.as_bytes());
                match expected {
                    None => {
                        e.u8(0);
                    }
                    Some(token) => {
                        e.u8(1);
                        put_short(e, token);
                    }
                }
                put_short(e, record);
            }
            Request::TeeQuery { handle, cells, ticket } => {
                e.u32(*handle);
                put_cells(e, cells);
                e.u32(ticket.len() as u32).bytes(ticket);
            }
            Request::TeeEvict { handle, round } => {
                e.u32(*handle).u32(round.incoming.len() as u32);
                for b in &round.incoming {
                    e.u32(b.len() as u32);
                }
                for b in &round.incoming {
                    e.bytes(b);
                }
                e.u32(round.layers.len() as u32);
                for l in &round.layers {
                    put_cells(e, &l.read);
                    put_cells(e, &l.write);
                    e.u32(l.ticket.len() as u32).bytes(&l.ticket);
                }
            }
            #[cfg(feature = "select")]
            Request::ReadSelect { handle, request } => {
                e.u32(*handle);
                put_key(e, &request.public_key);
                put_select(e, &request.public_key, request);
            }
            #[cfg(feature = "select")]
            Request::ReadSelectCombined { handle, request } => {
                e.u32(*handle).u32(request.groups.len() as u32);
                if let Some(first) = request.groups.first() {
                    let pk = &first.public_key;
                    put_key(e, pk);
                    for g in &request.groups {
                        put_select(e, pk, g);
                    }
                    put_ciphertexts(e, pk, &request.outer);
                } else {
                    // No key to encode the outer selector with: the decoder wants none.
                    e.u32(0);
                }
            }
            #[cfg(feature = "select")]
            Request::WriteSelect { handle, writes } => {
                e.u32(*handle).u32(writes.len() as u32);
                if let Some(first) = writes.first() {
                    let pk = &first.request.public_key;
                    put_key(e, pk);
                    for w in writes {
                        e.u64(w.target.0);
                        put_select(e, pk, &w.request);
                    }
                }
            }
        }
    }

    /// Whether [`encode_body`](Self::encode_body) can write it faithfully: a select request
    /// must use one public key throughout (the wire carries one per request) and, for a combined
    /// select without groups, no outer selector. Only select requests can fail.
    pub fn check_encodable(&self) -> Result<(), StoreError> {
        #[cfg(feature = "select")]
        {
            let (keys, extra): (Vec<&PublicKey>, bool) = match self {
                Request::ReadSelect { request, .. } => (vec![&*request.public_key], false),
                Request::ReadSelectCombined { request, .. } => (
                    request.groups.iter().map(|g| &*g.public_key).collect(),
                    request.groups.is_empty() && !request.outer.is_empty(),
                ),
                Request::WriteSelect { writes, .. } => {
                    (writes.iter().map(|w| &*w.request.public_key).collect(), false)
                }
                _ => return Ok(()),
            };
            if extra {
                return Err(StoreError::InvalidRequest(
                    "a combined select with an outer selector but no groups".into(),
                ));
            }
            if let Some(first) = keys.first() {
                if keys.iter().any(|k| k.n() != first.n()) {
                    return Err(StoreError::InvalidRequest(
                        "a select request under more than one public key (the storage \
                         protocol carries one per request)"
                            .into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Its whole frame (length, id, op, body); fails if it is longer than `max_frame` or cannot
    /// be encoded ([`check_encodable`](Self::check_encodable)).
    pub fn frame(&self, id: u64, max_frame: usize) -> Result<Vec<u8>, StoreError> {
        self.check_encodable()?;
        let mut e = Encoder::frame();
        e.u64(id).u8(self.op());
        self.encode_body(&mut e);
        e.finish_within(max_frame)
    }

    /// Decodes the body of a request with operation `op`. Counts are checked against the
    /// bytes left before anything is allocated for them.
    pub fn decode(op: u8, body: &[u8]) -> Result<Self, StoreError> {
        let bad = StoreError::InvalidRequest;
        let mut d = Decoder::new(body);
        let req = match op {
            op::OPEN => {
                let cell_count = d.u64().map_err(bad)?;
                let cell_size = d.u32().map_err(bad)?;
                let n = d.u16().map_err(bad)? as usize;
                let name = std::str::from_utf8(d.take(n).map_err(bad)?)
                    .map_err(|_| bad("array name is not UTF-8".into()))?
                    .to_string();
                Request::Open { cell_count, cell_size, name }
            }
            op::READ => {
                let handle = d.u32().map_err(bad)?;
                Request::Read { handle, cells: d.cells().map_err(bad)? }
            }
            op::READ_RANGES => {
                let handle = d.u32().map_err(bad)?;
                Request::ReadRanges { handle, ranges: d.ranges().map_err(bad)? }
            }
            op::READ_XOR => {
                let handle = d.u32().map_err(bad)?;
                Request::ReadXor { handle, ranges: d.ranges().map_err(bad)? }
            }
            op::WRITE => {
                let handle = d.u32().map_err(bad)?;
                let n = d.count(12).map_err(bad)?;
                let mut heads = Vec::with_capacity(n);
                for _ in 0..n {
                    heads.push((d.u64().map_err(bad)?, d.u32().map_err(bad)? as usize));
                }
                let mut cells = Vec::with_capacity(n);
                for (c, len) in heads {
                    cells.push((CellId(c), d.take(len).map_err(bad)?.to_vec()));
                }
                Request::Write { handle, cells }
            }
            op::FLUSH => Request::Flush { handle: d.u32().map_err(bad)? },
            op::LEASE_LOAD => Request::LeaseLoad { name: lease_name(&mut d)? },
            op::LEASE_SWAP => {
                let name = lease_name(&mut d)?;
                let expected = match d.u8().map_err(bad)? {
                    0 => None,
                    1 => Some(lease_bytes(&mut d, "token")?),
                    b => return Err(bad(format!("a lease swap's token flag of {b}"))),
                };
                let record = lease_bytes(&mut d, "record")?;
                Request::LeaseSwap { name, expected, record }
            }
            op::TEE_QUERY => {
                let handle = d.u32().map_err(bad)?;
                let cells = tee_cells(&mut d).map_err(bad)?;
                let ticket = tee_ticket(&mut d).map_err(bad)?;
                Request::TeeQuery { handle, cells, ticket }
            }
            op::TEE_EVICT => {
                let handle = d.u32().map_err(bad)?;
                Request::TeeEvict { handle, round: tee_round(&mut d).map_err(bad)? }
            }
            #[cfg(feature = "select")]
            op::READ_SELECT => {
                let handle = d.u32().map_err(bad)?;
                let pk = get_key(&mut d).map_err(bad)?;
                Request::ReadSelect { handle, request: get_select(&mut d, &pk).map_err(bad)? }
            }
            #[cfg(feature = "select")]
            op::READ_SELECT_COMBINED => {
                let handle = d.u32().map_err(bad)?;
                let n = d.u32().map_err(bad)? as usize;
                let request = if n == 0 {
                    if d.u32().map_err(bad)? != 0 {
                        return Err(bad("an outer selector without groups".into()));
                    }
                    CombinedSelect { groups: Vec::new(), outer: Vec::new() }
                } else {
                    let pk = get_key(&mut d).map_err(bad)?;
                    check_count(&d, n, min_select_bytes(&pk)).map_err(bad)?;
                    let mut groups = Vec::with_capacity(n);
                    for _ in 0..n {
                        groups.push(get_select(&mut d, &pk).map_err(bad)?);
                    }
                    let outer = get_ciphertexts(&mut d, &pk).map_err(bad)?;
                    CombinedSelect { groups, outer }
                };
                Request::ReadSelectCombined { handle, request }
            }
            #[cfg(feature = "select")]
            op::WRITE_SELECT => {
                let handle = d.u32().map_err(bad)?;
                let n = d.u32().map_err(bad)? as usize;
                let mut writes = Vec::new();
                if n > 0 {
                    let pk = get_key(&mut d).map_err(bad)?;
                    check_count(&d, n, 8 + min_select_bytes(&pk)).map_err(bad)?;
                    writes.reserve_exact(n);
                    for _ in 0..n {
                        let target = CellId(d.u64().map_err(bad)?);
                        let request = get_select(&mut d, &pk).map_err(bad)?;
                        writes.push(SelectWrite { request, target });
                    }
                }
                Request::WriteSelect { handle, writes }
            }
            other => {
                return Err(StoreError::Unsupported(format!(
                    "operation {other} of the storage protocol"
                )))
            }
        };
        d.end().map_err(bad)?;
        Ok(req)
    }
}

/// The frame answering request `id`: its ok body or its error.
pub fn reply_frame(id: u64, answer: Result<Vec<u8>, StoreError>) -> Vec<u8> {
    let error_frame = |err: &StoreError| {
        let mut out = Encoder::frame();
        out.u64(id).u8(1);
        put_error(&mut out, err);
        out.finish().expect("an error frame is small")
    };
    match answer {
        Ok(body) => {
            let mut out = Encoder::frame();
            out.u64(id).u8(0).bytes(&body);
            out.finish().unwrap_or_else(|e| error_frame(&e))
        }
        Err(e) => error_frame(&e),
    }
}

/// What a response says, from its status byte and body: the ok body, or the error it carries;
/// `Err` if it is no valid response.
pub fn decode_reply(status: u8, body: Vec<u8>) -> Result<Result<Vec<u8>, StoreError>, String> {
    match status {
        0 => Ok(Ok(body)),
        1 => {
            let mut d = Decoder::new(&body);
            let err = get_error(&mut d)?;
            d.end()?;
            Ok(Err(err))
        }
        s => Err(format!("status byte {s}")),
    }
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
    pub fn finish(self) -> Result<Vec<u8>, StoreError> {
        self.finish_within(MAX_FRAME)
    }
    /// Fills in the frame length; fails if the frame is larger than `max_frame` (or
    /// [`MAX_FRAME`]).
    pub fn finish_within(mut self, max_frame: usize) -> Result<Vec<u8>, StoreError> {
        let len = self.0.len() - 4;
        let max = max_frame.min(MAX_FRAME);
        if len > max {
            return Err(StoreError::InvalidRequest(format!(
                "a request of {len} bytes is larger than the storage server's {max}-byte \
                 frames; split the batch (or raise the server's --max-frame-mib)"
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

/// Checks that `n` items of at least `item` bytes each fit in what is left of the frame.
#[cfg(feature = "select")]
fn check_count(d: &Decoder<'_>, n: usize, item: usize) -> Result<(), String> {
    if n.saturating_mul(item) > d.rest().len() {
        return Err(format!("a count of {n} items does not fit in the frame"));
    }
    Ok(())
}

/// Appends `key_len u32 | key`.
#[cfg(feature = "select")]
fn put_key(e: &mut Encoder, pk: &PublicKey) {
    let key = pk.to_bytes();
    e.u32(key.len() as u32).bytes(&key);
}

/// Takes `key_len u32 | key` and checks the key.
#[cfg(feature = "select")]
fn get_key(d: &mut Decoder<'_>) -> Result<Arc<PublicKey>, String> {
    let len = d.u32()? as usize;
    if len > MAX_KEY_BYTES {
        return Err(format!("a public key of {len} bytes (at most {MAX_KEY_BYTES})"));
    }
    let key = PublicKey::from_bytes(d.take(len)?).map_err(|e| format!("public key: {e}"))?;
    Ok(Arc::new(key))
}

/// Appends `n u32 | n × (layer u8 | ciphertext)`, each in its layer's width under `pk`. A
/// ciphertext that does not fit that width (made under another key) is written as zeros, which
/// the decoder refuses; [`Request::check_encodable`] keeps keys from being mixed.
#[cfg(feature = "select")]
fn put_ciphertexts(e: &mut Encoder, pk: &PublicKey, cs: &[Ciphertext]) {
    e.u32(cs.len() as u32);
    for c in cs {
        let width = pk.ciphertext_len(c.layer()).unwrap_or(0);
        e.u8(c.layer() as u8);
        if c.value().significant_bits() as usize <= 8 * width {
            e.bytes(&pk.ciphertext_to_bytes(c));
        } else {
            e.bytes(&vec![0u8; width]);
        }
    }
}

/// Takes `n u32 | n × (layer u8 | ciphertext)`, checking each ciphertext under `pk`.
#[cfg(feature = "select")]
fn get_ciphertexts(d: &mut Decoder<'_>, pk: &PublicKey) -> Result<Vec<Ciphertext>, String> {
    let smallest = pk.ciphertext_len(1).map_err(|e| e.to_string())?;
    let n = d.count(1 + smallest)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let layer = u32::from(d.u8()?);
        let len = pk.ciphertext_len(layer).map_err(|e| format!("ciphertext: {e}"))?;
        let c = pk
            .ciphertext_from_bytes(layer, d.take(len)?)
            .map_err(|e| format!("ciphertext: {e}"))?;
        out.push(c);
    }
    Ok(out)
}

/// The fewest bytes a select under `pk` takes on the wire: one selector element of layer 1,
/// the chunk length and one range.
#[cfg(feature = "select")]
fn min_select_bytes(pk: &PublicKey) -> usize {
    4 + 1 + pk.ciphertext_len(1).unwrap_or(0) + 4 + 4 + 16
}

/// Appends a select's selector, chunk length and ranges (its key is written once per request).
#[cfg(feature = "select")]
fn put_select(e: &mut Encoder, pk: &PublicKey, r: &SelectRequest) {
    put_ciphertexts(e, pk, &r.selector);
    e.u32(r.chunk_len);
    put_ranges(e, &r.ranges);
}

/// Takes a select under `pk`: a selector of at least one element, the chunk length and at
/// least one range.
#[cfg(feature = "select")]
fn get_select(d: &mut Decoder<'_>, pk: &Arc<PublicKey>) -> Result<SelectRequest, String> {
    let selector = get_ciphertexts(d, pk)?;
    let chunk_len = d.u32()?;
    let ranges = d.ranges()?;
    if selector.is_empty() || ranges.is_empty() {
        return Err("a select without a selector or without ranges".into());
    }
    Ok(SelectRequest { public_key: Arc::clone(pk), selector, ranges, chunk_len })
}

/// Appends `n u32, n × cell u64`.
pub fn put_cells(e: &mut Encoder, cells: &[CellId]) {
    e.u32(cells.len() as u32);
    for c in cells {
        e.u64(c.0);
    }
}

/// Takes `n u32, n × cell u64` with at most [`MAX_TEE_CELLS`] cells.
fn tee_cells(d: &mut Decoder<'_>) -> Result<Vec<CellId>, String> {
    let n = d.count(8)?;
    if n > MAX_TEE_CELLS {
        return Err(format!("{n} cells in a TEE request (at most {MAX_TEE_CELLS})"));
    }
    (0..n).map(|_| d.u64().map(CellId)).collect()
}

/// Takes `ticket_len u32 | ticket` of at most [`MAX_TEE_TICKET`] bytes.
fn tee_ticket(d: &mut Decoder<'_>) -> Result<Vec<u8>, String> {
    let n = d.u32()? as usize;
    if n > MAX_TEE_TICKET {
        return Err(format!("a TEE ticket of {n} bytes (at most {MAX_TEE_TICKET})"));
    }
    Ok(d.take(n)?.to_vec())
}

/// Takes an eviction round: the incoming blocks (at most [`MAX_TEE_CELLS`]) and the layers (at
/// most [`MAX_TEE_LAYERS`]).
fn tee_round(d: &mut Decoder<'_>) -> Result<TeeRound, String> {
    let n = d.count(4)?;
    if n > MAX_TEE_CELLS {
        return Err(format!("{n} incoming blocks in a TEE round (at most {MAX_TEE_CELLS})"));
    }
    let lens = (0..n).map(|_| d.u32().map(|l| l as usize)).collect::<Result<Vec<_>, _>>()?;
    let mut incoming = Vec::with_capacity(n);
    for len in lens {
        incoming.push(d.take(len)?.to_vec());
    }
    // A layer takes at least its two counts and its ticket length.
    let l = d.count(12)?;
    if l > MAX_TEE_LAYERS {
        return Err(format!("{l} layers in a TEE round (at most {MAX_TEE_LAYERS})"));
    }
    let mut layers = Vec::with_capacity(l);
    for _ in 0..l {
        let read = tee_cells(d)?;
        let write = tee_cells(d)?;
        let ticket = tee_ticket(d)?;
        layers.push(TeeLayer { read, write, ticket });
    }
    Ok(TeeRound { incoming, layers })
}

/// Appends `len u16 | bytes` (callers keep `bytes` within a u16: names and lease records are
/// checked before they are sent).
fn put_short(e: &mut Encoder, bytes: &[u8]) {
    let len = bytes.len().min(usize::from(u16::MAX));
    e.u16(len as u16).bytes(&bytes[..len]);
}

/// Takes a lease name: `len u16 | name`, a valid array name (at most 128 bytes).
fn lease_name(d: &mut Decoder<'_>) -> Result<String, StoreError> {
    let n = usize::from(d.u16().map_err(StoreError::InvalidRequest)?);
    if n > 128 {
        return Err(StoreError::InvalidRequest(format!("a lease name of {n} bytes (at most 128)")));
    }
    let bytes = d.take(n).map_err(StoreError::InvalidRequest)?;
    let name = std::str::from_utf8(bytes)
        .map_err(|_| StoreError::InvalidRequest("a lease name that is not UTF-8".into()))?;
    crate::url::check_name(name)?;
    Ok(name.to_string())
}

/// Takes `len u16 | bytes` of at most [`MAX_LEASE_RECORD`] bytes.
fn lease_bytes(d: &mut Decoder<'_>, what: &str) -> Result<Vec<u8>, StoreError> {
    let n = usize::from(d.u16().map_err(StoreError::InvalidRequest)?);
    if n > MAX_LEASE_RECORD {
        return Err(StoreError::InvalidRequest(format!(
            "a lease {what} of {n} bytes (at most {MAX_LEASE_RECORD})"
        )));
    }
    Ok(d.take(n).map_err(StoreError::InvalidRequest)?.to_vec())
}

/// The ok body of a lease load: `0`, or `1 | token | record`.
pub fn lease_loaded(loaded: Option<&LoadedRecord>) -> Vec<u8> {
    let mut e = Encoder::default();
    match loaded {
        None => {
            e.u8(0);
        }
        Some(l) => {
            e.u8(1);
            put_short(&mut e, &l.token);
            put_short(&mut e, &l.record);
        }
    }
    e.0
}

/// The record and token in the ok body of a lease load, each at most [`MAX_LEASE_RECORD`]
/// bytes.
pub fn parse_lease_loaded(body: &[u8]) -> Result<Option<LoadedRecord>, String> {
    let mut d = Decoder::new(body);
    let loaded = match d.u8()? {
        0 => None,
        1 => {
            let token = lease_bytes(&mut d, "token").map_err(|e| e.to_string())?;
            let record = lease_bytes(&mut d, "record").map_err(|e| e.to_string())?;
            Some(LoadedRecord { record, token })
        }
        b => return Err(format!("a lease load's presence flag of {b}")),
    };
    d.end()?;
    Ok(loaded)
}

/// The longest ok body of a lease load.
pub const MAX_LEASE_LOADED: usize = 1 + 2 * (2 + MAX_LEASE_RECORD);

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
        StoreError::Trusted { integrity, .. } => (10, u64::from(*integrity), 0, 0, 0),
        _ => (0, 0, 0, 0, 0),
    };
    let msg = match err {
        StoreError::InvalidRequest(m)
        | StoreError::Unsupported(m)
        | StoreError::Timeout(m)
        | StoreError::InvalidGeometry(m)
        | StoreError::Trusted { message: m, .. } => m.clone(),
        StoreError::GeometryMismatch { path, .. } => path.display().to_string(),
        other => other.to_string(),
    };
    let msg = cut(&msg, MAX_ERROR_MESSAGE);
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
        10 => StoreError::Trusted { integrity: a == 1, message: msg },
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
            StoreError::Trusted { integrity: true, message: "t".into() },
            StoreError::Trusted { integrity: false, message: "u".into() },
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
