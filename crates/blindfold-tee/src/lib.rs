//! The trusted component of blindfold's TEE-assisted engine (seed 004, §III).
//!
//! In the TEE-assisted design the untrusted storage host reads and writes cells, and a small
//! trusted component beside it does the two things that need the key: pick the wanted block
//! out of a query's candidates without revealing which, and shuffle and re-encrypt the blocks
//! of an eviction without revealing how. This crate is that component, plus the gateway's half
//! of the shared cryptography. It is pure and synchronous: no I/O, no threads, no clock; state
//! kept between calls is only the replay tables (of eviction rounds and of query numbers). It is written so it could be moved
//! into an SGX enclave unchanged in shape: the host hands in byte slices, gets byte slices back.
//!
//! # Interface
//!
//! | call | paper | does |
//! |---|---|---|
//! | [`Enclave::query`]`(candidates, ticket)` | `enclave_query` | check the ticket's number is new on its stream, strip both layers of every candidate and check each against its `ad` in the ticket, obliviously select candidate `target`, return the block sealed to `(stream, query_id)` |
//! | [`Enclave::evict`]`(blocks, ticket)` | `evict` | move block `j` to `perm[j]`, giving every block a fresh outer layer, in place |
//!
//! The gateway uses a [`TeeCipher`] built from the same [`TeeKey`] to seal cells
//! ([`TeeCipher::seal`]), tickets ([`TeeCipher::seal_query`], [`TeeCipher::seal_evict`]) and to
//! open answers ([`TeeCipher::open_answer`]). The gateway obtains the key with
//! [`TeeKey::derive_from_master`] (`HKDF-SHA256(salt = store id, ikm = master key, info =
//! "blindfold tee v1")`); the trusted component loads it from a key file ([`TeeKey::load`]).
//!
//! # Cell format
//!
//! ```text
//! cell_len(block_size) = 32 + round_up_32(12 + block_size + 16)
//!
//! inner  = nonce (12, random) || AES-256-GCM(k_gcm, nonce, aad = AD, block) || tag (16)
//!          || zero padding to a multiple of 32
//! cell   = r (32, random)                                        piece 0
//!          || inner[i-1] XOR SHA-256(k_xor || r || u32_be(i))    piece i = 1, 2, …
//! ```
//!
//! `AD` is 32 opaque bytes chosen by the gateway (block id and version, or a dummy). `k_xor ||
//! r` is exactly one SHA-256 block: its midstate is computed once per block and reused for
//! every piece. Opening checks the length, the zero padding and the GCM tag; any change to a
//! cell is [`TeeError::Integrity`].
//!
//! # Keys and sealed messages
//!
//! ```text
//! prk                 = HKDF-Extract(salt = empty, ikm = TeeKey)                 [SHA-256]
//! k_gcm, k_xor, k_msg = HKDF-Expand(prk, "blindfold tee gcm v1" | "… xor v1" | "… msg v1", 32)
//! message             = nonce (12, random) || AES-256-GCM(k_msg, nonce, aad, plaintext) || tag
//!   query ticket  aad = "blindfold-tee query ticket v1"     plaintext = QueryTicket (32 + 32c B)
//!   evict ticket  aad = "blindfold-tee evict ticket v1"     plaintext = EvictTicket (32 + 4s B)
//!   answer        aad = "blindfold-tee answer v1" || stream (16) || query_id u64 LE
//!                                                           plaintext = the block
//! ```
//!
//! One label per kind, so no message is accepted as another kind. The ticket layouts, fixed
//! and little-endian, are drawn on [`QueryTicket`] and [`EvictTicket`].
//!
//! # Freshness and binding
//!
//! Every ticket carries a counter the component checks, so a captured ticket is used at most
//! once and never after a later one of its stream: an eviction ticket must be strictly newer,
//! as `(round, layer)`, than the last one accepted on its `stream` ([`TeeError::Replay`]); a
//! query ticket's `query_id` must be above the last one answered on its `stream`
//! ([`TeeError::QueryReplay`]; the gateway keeps one stream per query in flight, so its own
//! tickets always arrive in order). A query ticket is also bound to its candidates: it holds
//! the inner-layer associated data of every candidate, and the component answers only if every
//! candidate opens under its own, so the host cannot learn the target by handing a ticket
//! other cells (all of them the same cell, say) and watching whether it is answered. The tables
//! hold at most [`MAX_STREAMS`] streams each and live in memory only, so a restarted component
//! accepts any number again; the gateway's numbers come from a durable counter and the clock
//! (see `blindfold_proxy::DurableTee`), but only a real enclave, keeping the tables in sealed
//! storage with a hardware monotonic counter, could stop a host that restarts it from replaying
//! tickets to the new instance. Without SGX the host holds the key anyway (below).
//!
//! # Threat model
//!
//! Without SGX — the setting here — the trusted component runs as an ordinary process, and the
//! host that runs it holds the [`TeeKey`]: it can read every block and learn every query target
//! and permutation, so the storage host must be trusted with the key just as the gateway is;
//! the design then only protects against an adversary who sees the storage and the traffic
//! but not that process. With a real enclave, the key would be provisioned to it after remote
//! attestation and never leave it; the host would see only what crosses this interface (cells,
//! sealed tickets and answers, sizes, timing) and the enclave's memory accesses at page
//! granularity (page faults, as in controlled-channel attacks), which is what the
//! obliviousness below is built for. Finer side channels (cache lines, branch predictors,
//! speculative execution) are out of scope, as in the paper.
//!
//! # Why the accesses do not depend on the secrets
//!
//! *Query.* Every candidate is opened (every 32-byte piece read) under its own `ad`, in order,
//! and every piece of its plaintext passed through the one-block buffer, read and written, in
//! a fixed order; the target is chosen with `subtle`'s constant-time select over 64-bit words,
//! with no branch on it. Whether a candidate opens depends on the cells handed in, not on the
//! target.
//!
//! *Eviction.* Three structures of page-aligned 4 KiB pages — ORVP (old random vectors), NRVP
//! (new random vectors), PIECE (the current piece of every output block) — hold a 32-byte
//! vector per block spread over their pages: for more than 4,096 blocks as 64 nibbles, nibble
//! `p` in page `p` (so one page holds 8192 blocks, [`MAX_EVICT_BLOCKS`]); for fewer, as 32
//! bytes in 32 pages, or slices of 2 to 32 bytes in 16 down to 1 page ([`pages_for`]: the
//! count depends on `s` alone). Reading or writing any block's vector touches all the pages of
//! the structure, in order, once each. The algorithm, with `s` blocks and pieces `1..n`:
//!
//! 1. for each position `b` in order: read piece 0 of block `b` into ORVP at `b`;
//! 2. for each position `k` in order: put a fresh random vector into NRVP at `k` and out as
//!    piece 0 of block `k`;
//! 3. for each `b` in order: SHA-256 midstates of ORVP at `b` and of NRVP at `perm[b]`;
//! 4. for each piece `j` in `1..n`: for each `b` in order, read piece `j` of block `b`, XOR
//!    with the old keystream and the new one, write it into PIECE at `perm[b]`; then for each
//!    `k` in order, copy PIECE at `k` out as piece `j` of block `k`.
//!
//! The only secret-dependent addresses are `perm[b]` *within* NRVP and PIECE pages, and every
//! such access touches all the structure's pages, so the sequence of pages and cell pieces touched depends
//! on `s` and the block size alone. [`Enclave::evict_traced`] reports that sequence and the
//! tests check it is identical for different permutations. (The paper recomputes both random
//! vectors from the pages for every piece; keeping two midstates per position, indexed by the
//! public `b`, is faster and leaks nothing more.)
//!
//! # Example
//!
//! ```
//! use blindfold_tee::{Enclave, EvictTicket, QueryTicket, TeeCipher, TeeError, TeeKey};
//!
//! let key = TeeKey::generate()?;
//! let gateway = TeeCipher::new(&key, 64);
//! let enclave = Enclave::new(&key, 64);
//! let stream = [7u8; 16];
//!
//! // The gateway seals three blocks; the host stores the cells.
//! let mut cells: Vec<Vec<u8>> =
//!     (0..3u8).map(|i| gateway.seal(&[i; 32], &[i; 64])).collect::<Result<_, _>>()?;
//!
//! // Eviction: block j moves to perm[j]; the host sees only fresh-looking cells.
//! let perm = vec![2, 0, 1];
//! let ticket = gateway.seal_evict(&EvictTicket { stream, round: 1, layer: 0, perm })?;
//! enclave.evict(&mut cells, &ticket)?;
//! assert!(matches!(enclave.evict(&mut cells, &ticket), Err(TeeError::Replay { .. })));
//!
//! // Query: block 0 is now at position 2; the host learns neither. The ticket names what
//! // every position holds.
//! let ads = vec![[1; 32], [2; 32], [0; 32]];
//! let q = QueryTicket { stream, query_id: 1, candidates: 3, target: 2, ads };
//! let ticket = gateway.seal_query(&q)?;
//! let answer = enclave.query(&cells, &ticket)?;
//! assert_eq!(gateway.open_answer(&stream, 1, &answer)?, [0u8; 64]);
//! // The same ticket again is refused.
//! assert!(matches!(enclave.query(&cells, &ticket), Err(TeeError::QueryReplay { .. })));
//! # Ok::<(), TeeError>(())
//! ```

mod cipher;
mod enclave;
mod error;
mod host;
mod key;
mod pages;
mod sha;
mod ticket;
pub mod trace;

pub use cipher::{cell_len, TeeCipher, MAX_BLOCK_SIZE};
pub use enclave::{Enclave, MAX_EVICT_BLOCKS, MAX_STREAMS};
pub use error::TeeError;
pub use key::{TeeKey, TEE_KEY_LABEL};
pub use pages::{pages_for, PAGES, PAGE_SIZE};
pub use ticket::{EvictTicket, QueryTicket};
