//! [`LeaseStore`]: the *one writer* capability — a lease on a store, taken through the store's
//! own conditional writes, so that at most one gateway writes to a store at a time.
//!
//! # Model
//!
//! A lease is a small named record (`name`, e.g. `"gateway"`) kept in the store itself:
//! who holds it ([`LeaseInfo::holder`], a human-readable id such as host name and pid), its
//! *generation* and when it expires ([`LeaseInfo::expires_unix_ms`], wall-clock milliseconds).
//!
//! * [`LeaseStore::acquire`] takes the lease if it was never taken, was released or has
//!   expired; the new holder gets the previous generation plus one (the first holder gets 1).
//!   While the lease is live it is refused with [`StoreError::LeaseHeld`] — whoever holds it,
//!   the same holder name included: names are not proven unique, so a live lease is only ever
//!   extended by [`LeaseStore::renew`] with its generation.
//! * [`LeaseStore::renew`] extends the lease of a generation. It fails with
//!   [`StoreError::LeaseLost`] once the store records another generation (someone else took it
//!   after it expired: the caller is *fenced* and must stop writing) or the lease was
//!   released. Renewing a lease that expired but that nobody took since succeeds with the same
//!   generation: no other holder can have written in between, since every new holder bumps
//!   the generation.
//! * [`LeaseStore::release`] gives the lease up at once (it expires now), so a successor need
//!   not wait; the generation stays, and the next acquire gets the one after it.
//! * [`LeaseStore::inspect`] says what the store records.
//!
//! A holder keeps its lease by renewing it well before it expires (every third of the ttl,
//! say), and stops writing when its own deadline (the time it sent the last successful
//! acquire or renew, plus the ttl) has passed without a renewal.
//!
//! # The atomic step
//!
//! Every backend offers one primitive, [`LeaseRecords`]: read a record with a *token*, and
//! write a record only if the token still matches (compare-and-swap). [`Leases`] runs the
//! lease rules above over any [`LeaseRecords`] in a read, decide, conditional-write loop; a
//! write that lost a race re-reads and decides again, so there is no read-then-write race.
//! Per backend the conditional write is:
//!
//! * memory: a mutex over a map (in-process; a fresh, empty set for every `memory:` opened);
//! * `file://dir`: `<dir>/<name>.lease`, replaced (temporary file, `fsync`, `rename`, `fsync`
//!   of the directory) under an exclusive `flock` of `<dir>/<name>.lease.lock`;
//! * `s3://`: the object `<prefix>/.lease/<name>`, created with `If-None-Match: *` and replaced
//!   with `If-Match: <etag>` (the token is the ETag);
//! * `redis://`: the key `<prefix>:.lease:<name>` (no expiry), replaced by a Lua script that
//!   compares the value and sets it in one step;
//! * `remote://`: ops 12 and 13 of the storage protocol; the storage server runs the same
//!   compare-and-swap on its own records (a map in memory, or the file layout above in its
//!   data directory).
//!
//! Array names cannot start with `.`, so `.lease` never collides with an array's objects or
//! keys, and array files end in `.cells`, not `.lease`.
//!
//! # Record format
//!
//! UTF-8 text, at most [`MAX_LEASE_RECORD`] bytes, readable with the store's own tools:
//!
//! ```text
//! blindfold-lease v1
//! generation=3
//! expires_unix_ms=1767225600000
//! holder=gw-host-1 pid 4242
//! ```
//!
//! A released lease has `expires_unix_ms=0`.
//!
//! # Clocks
//!
//! Expiry is wall-clock time written by the holder and compared by a taker with its own clock
//! (the storage server's clock plays no part). Two gateways whose clocks differ by `skew` may
//! see a lease expire up to `skew` early or late, so the ttl must be much larger than any skew
//! between the machines (NTP keeps it to milliseconds; a ttl of tens of seconds is safe), and a
//! holder must stop writing at its *own* deadline, measured from when it sent the request.
//! The generation is what makes a late writer harmless: a store write path that checks the
//! generation refuses a fenced holder whatever the clocks say.
//!
//! # Hostile input
//!
//! Lease names follow the rule of array names (1 to 128 ASCII letters, digits, `.`, `_` or
//! `-`, not starting with `.`; [`StoreError::InvalidName`]); holder names are 1 to
//! [`MAX_HOLDER_LEN`] bytes of UTF-8 without control characters
//! ([`StoreError::InvalidRequest`]). A stored record that is too long or does not parse is
//! reported as [`StoreError::NotAStore`], never trusted.
//!
//! ```
//! use std::time::Duration;
//! use blindfold_store::{open_lease_store, StoreError, StoreUrl};
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let leases = open_lease_store(&StoreUrl::Memory).await.unwrap();
//! let ttl = Duration::from_secs(30);
//! let mine = leases.acquire("gateway", "host-a pid 1", ttl).await.unwrap();
//! assert_eq!(mine.generation, 1);
//! let refused = leases.acquire("gateway", "host-b pid 2", ttl).await.unwrap_err();
//! assert!(matches!(refused, StoreError::LeaseHeld { .. }));
//! leases.renew("gateway", mine.generation, ttl).await.unwrap();
//! leases.release("gateway", mine.generation).await.unwrap();
//! let next = leases.acquire("gateway", "host-b pid 2", ttl).await.unwrap();
//! assert_eq!(next.generation, 2);
//! # });
//! ```

mod file;
mod gate;
mod memory;
pub(crate) mod redis;
pub(crate) mod s3;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;

pub use file::FileLeaseRecords;
pub use gate::{GatedStore, LeaseGate};
pub use memory::MemoryLeaseRecords;

use crate::{Result, StoreError, StoreUrl};

/// Longest holder name, in bytes.
pub const MAX_HOLDER_LEN: usize = 256;
/// Longest lease record (and record token) a backend stores or accepts, in bytes.
pub const MAX_LEASE_RECORD: usize = 1024;
/// Times [`Leases`] re-reads and tries again after losing a race before it gives up with a
/// retryable error.
const MAX_ATTEMPTS: usize = 64;
/// First line of a lease record.
const RECORD_HEADER: &str = "blindfold-lease v1";

/// Who holds a store's lease, as the store records it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseInfo {
    /// The holder's human-readable id (host name and pid, say), as it gave it to
    /// [`LeaseStore::acquire`].
    pub holder: String,
    /// Grows by one at each new holder, starting at 1; kept across release and expiry.
    pub generation: u64,
    /// When the lease expires, in milliseconds since the Unix epoch by the holder's clock; 0
    /// once released.
    pub expires_unix_ms: u64,
}

impl LeaseInfo {
    /// Whether the lease is live at `now_unix_ms`.
    pub fn is_live(&self, now_unix_ms: u64) -> bool {
        self.expires_unix_ms > now_unix_ms
    }

    /// Whether it was given up with [`LeaseStore::release`].
    pub fn is_released(&self) -> bool {
        self.expires_unix_ms == 0
    }

    /// The record's bytes (format in the [module docs](self)).
    fn encode(&self) -> Vec<u8> {
        format!(
            "{RECORD_HEADER}\ngeneration={}\nexpires_unix_ms={}\nholder={}\n",
            self.generation, self.expires_unix_ms, self.holder
        )
        .into_bytes()
    }

    /// The record in `bytes`, or why it is none.
    fn decode(bytes: &[u8]) -> std::result::Result<Self, String> {
        if bytes.len() > MAX_LEASE_RECORD {
            return Err(format!("a record of {} bytes (at most {MAX_LEASE_RECORD})", bytes.len()));
        }
        let text = std::str::from_utf8(bytes).map_err(|_| "the record is not UTF-8".to_string())?;
        let mut lines = text.lines();
        if lines.next() != Some(RECORD_HEADER) {
            return Err(format!("the record does not start with {RECORD_HEADER:?}"));
        }
        let (mut generation, mut expires, mut holder) = (None, None, None);
        for line in lines {
            let (key, value) =
                line.split_once('=').ok_or_else(|| format!("a line without `=`: {line:?}"))?;
            let number = || value.parse::<u64>().map_err(|_| format!("{key}={value:?}"));
            match key {
                "generation" => generation = Some(number()?),
                "expires_unix_ms" => expires = Some(number()?),
                "holder" => holder = Some(value.to_string()),
                other => return Err(format!("an unknown field {other:?}")),
            }
        }
        match (generation, expires, holder) {
            (Some(generation), Some(expires_unix_ms), Some(holder)) if generation > 0 => {
                check_holder(&holder).map_err(|e| e.to_string())?;
                Ok(Self { holder, generation, expires_unix_ms })
            }
            _ => Err("the record lacks a field (or has generation 0)".into()),
        }
    }
}

/// A store that keeps leases: at most one holder of a named lease at a time, fenced by a
/// generation number (rules in the [module docs](self)).
///
/// Contract (checked by `blindfold_testkit::lease::run`, over every backend):
///
/// * the first acquire of a name gets generation 1, every later successful acquire the
///   previous generation plus one;
/// * an acquire while the lease is live fails with [`StoreError::LeaseHeld`], and of many
///   concurrent acquires of a free lease exactly one succeeds;
/// * after expiry (or release) an acquire succeeds, and from then on a renew of the old
///   generation fails with [`StoreError::LeaseLost`];
/// * a renew of a lease that expired and that nobody took succeeds with the same generation;
///   a renew after release fails with [`StoreError::LeaseLost`];
/// * release of a lease that is no longer ours (or was never taken) does nothing;
/// * [`LeaseStore::inspect`] returns what the last successful call wrote.
#[async_trait]
pub trait LeaseStore: Send + Sync + fmt::Debug {
    /// Takes the lease `name` (e.g. `"gateway"`) for `holder` (a human-readable id: host name
    /// and pid) for `ttl`.
    ///
    /// Succeeds if the lease was never taken, was released or has expired, with the previous
    /// generation plus one (1 for the first holder). Fails with [`StoreError::LeaseHeld`]
    /// (naming the holder and when its lease expires) while the lease is live, whoever holds
    /// it; with [`StoreError::InvalidName`] or [`StoreError::InvalidRequest`] for a bad name,
    /// holder or ttl.
    ///
    /// After a [retryable](StoreError::is_retryable) error the lease may have been taken all
    /// the same (the write landed, its answer was lost): [`inspect`](Self::inspect) it, and
    /// carry on with it if holder and deadline are the caller's own, before trying again.
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<LeaseInfo>;

    /// Extends our lease of `generation` to `ttl` from now.
    ///
    /// Fails with [`StoreError::LeaseLost`] if the store records another generation (someone
    /// took the lease after it expired: we are fenced), if the lease was released, or if there
    /// is no record. A lease that expired but that nobody took is renewed with the same
    /// generation.
    async fn renew(&self, name: &str, generation: u64, ttl: Duration) -> Result<LeaseInfo>;

    /// Gives up our lease of `generation` so a successor need not wait for it to expire; does
    /// nothing if the store records another generation, a released lease or none. The
    /// generation is kept: the next acquire gets `generation + 1`.
    async fn release(&self, name: &str, generation: u64) -> Result<()>;

    /// What the store records now (`None` if the lease was never taken).
    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>>;
}

#[async_trait]
impl<L: LeaseStore + ?Sized> LeaseStore for Arc<L> {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<LeaseInfo> {
        (**self).acquire(name, holder, ttl).await
    }
    async fn renew(&self, name: &str, generation: u64, ttl: Duration) -> Result<LeaseInfo> {
        (**self).renew(name, generation, ttl).await
    }
    async fn release(&self, name: &str, generation: u64) -> Result<()> {
        (**self).release(name, generation).await
    }
    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>> {
        (**self).inspect(name).await
    }
}

/// A stored lease record and the token a conditional write of it compares against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadedRecord {
    /// The record's bytes (at most [`MAX_LEASE_RECORD`]).
    pub record: Vec<u8>,
    /// What [`LeaseRecords::swap`] compares against: the record itself for most backends, the
    /// object's ETag for S3 (at most [`MAX_LEASE_RECORD`] bytes).
    pub token: Vec<u8>,
}

/// The atomic step of a lease: one small record per name, replaced only if it did not change
/// since it was read. Every backend that keeps leases implements it with its own conditional
/// writes; [`Leases`] builds the lease rules on top.
///
/// Contract: [`swap`](Self::swap) with `expected: None` succeeds only if there is no record,
/// with `Some(token)` only if the record's token is still `token`; a failed swap changes
/// nothing and answers `Ok(false)`. Of concurrent swaps against the same state at most one
/// succeeds. Names are checked by the caller ([`Leases`]) and again by the storage server.
#[async_trait]
pub trait LeaseRecords: Send + Sync + fmt::Debug {
    /// The record of `name` and its token, or `None` if there is none.
    async fn load(&self, name: &str) -> Result<Option<LoadedRecord>>;

    /// Writes `record` as the record of `name` if the current token is `expected` (`None`:
    /// if there is no record); `Ok(true)` if it was written, `Ok(false)` if not.
    async fn swap(&self, name: &str, expected: Option<&[u8]>, record: &[u8]) -> Result<bool>;
}

#[async_trait]
impl<R: LeaseRecords + ?Sized> LeaseRecords for Arc<R> {
    async fn load(&self, name: &str) -> Result<Option<LoadedRecord>> {
        (**self).load(name).await
    }
    async fn swap(&self, name: &str, expected: Option<&[u8]>, record: &[u8]) -> Result<bool> {
        (**self).swap(name, expected, record).await
    }
}

/// A clock in milliseconds since the Unix epoch.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The system's wall clock, in milliseconds since the Unix epoch.
pub fn system_clock_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The lease rules of [`LeaseStore`] over any [`LeaseRecords`]: read, decide with the clock,
/// write conditionally, and on a lost race read again.
pub struct Leases<R> {
    records: R,
    clock: Clock,
}

impl<R: fmt::Debug> fmt::Debug for Leases<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leases").field("records", &self.records).finish()
    }
}

/// What one round of [`Leases::update`] decided.
enum Step<T> {
    /// Done without writing.
    Done(T),
    /// Write this record, and answer this if the write succeeds.
    Write(LeaseInfo, T),
}

impl<R: LeaseRecords> Leases<R> {
    /// Leases kept in `records`, timed by the system clock.
    pub fn new(records: R) -> Self {
        Self::with_clock(records, Arc::new(system_clock_ms))
    }

    /// Leases kept in `records`, timed by `clock` (milliseconds since the Unix epoch), for
    /// tests that move time by hand.
    pub fn with_clock(records: R, clock: Clock) -> Self {
        Self { records, clock }
    }

    /// The records underneath.
    pub fn records(&self) -> &R {
        &self.records
    }

    async fn load(&self, name: &str) -> Result<Option<(LeaseInfo, LoadedRecord)>> {
        let Some(loaded) = self.records.load(name).await? else { return Ok(None) };
        let info = LeaseInfo::decode(&loaded.record).map_err(|reason| StoreError::NotAStore {
            path: format!("lease record {name:?}").into(),
            reason,
        })?;
        Ok(Some((info, loaded)))
    }

    /// The loop every operation shares: `decide` looks at the current record (and the time)
    /// and says what to write; the write is conditional on the record not having changed. A
    /// lost race re-reads. If a re-read finds exactly the record we tried to write, that write
    /// landed (its answer was lost, and a retry found the token changed by itself).
    async fn update<T>(
        &self,
        name: &str,
        mut decide: impl FnMut(Option<&LeaseInfo>, u64) -> Result<Step<T>>,
    ) -> Result<T> {
        let mut attempted: Option<(Vec<u8>, T)> = None;
        for _ in 0..MAX_ATTEMPTS {
            let current = self.load(name).await?;
            if let (Some((_, loaded)), Some((bytes, _))) = (&current, &attempted) {
                if loaded.record == *bytes {
                    return Ok(attempted.expect("checked").1);
                }
            }
            let now = (self.clock)();
            match decide(current.as_ref().map(|(info, _)| info), now)? {
                Step::Done(answer) => return Ok(answer),
                Step::Write(info, answer) => {
                    let bytes = info.encode();
                    let token = current.as_ref().map(|(_, loaded)| loaded.token.as_slice());
                    if self.records.swap(name, token, &bytes).await? {
                        return Ok(answer);
                    }
                    attempted = Some((bytes, answer));
                }
            }
        }
        Err(StoreError::Remote {
            message: format!(
                "lease {name:?}: {MAX_ATTEMPTS} conditional writes in a row lost a race; \
                 something keeps changing the record"
            ),
            retryable: true,
        })
    }
}

/// `now + ttl` in milliseconds, for a ttl of at least 1 ms that does not overflow.
fn deadline(now: u64, ttl: Duration) -> Result<u64> {
    let ms = u64::try_from(ttl.as_millis()).ok().filter(|&ms| ms > 0);
    ms.and_then(|ms| now.checked_add(ms)).ok_or_else(|| {
        StoreError::InvalidRequest(format!(
            "a lease ttl of {ttl:?}: it must be at least a millisecond and not absurdly long"
        ))
    })
}

fn lost(name: &str, generation: u64, current: Option<&LeaseInfo>, now: u64) -> StoreError {
    let (current_generation, current_holder, state) = match current {
        None => (0, String::new(), "the store has no record of it".to_string()),
        Some(c) if c.generation != generation => (
            c.generation,
            c.holder.clone(),
            format!("the store records generation {} held by {:?}", c.generation, c.holder),
        ),
        Some(c) if c.is_released() => (c.generation, c.holder.clone(), "it was released".into()),
        Some(c) => (
            c.generation,
            c.holder.clone(),
            format!("it expired {} ms ago", now.saturating_sub(c.expires_unix_ms)),
        ),
    };
    StoreError::LeaseLost {
        name: name.to_string(),
        generation,
        current_generation,
        current_holder,
        reason: state,
    }
}

#[async_trait]
impl<R: LeaseRecords> LeaseStore for Leases<R> {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<LeaseInfo> {
        crate::url::check_name(name)?;
        check_holder(holder)?;
        deadline(0, ttl)?;
        self.update(name, |current, now| {
            let generation = match current {
                None => 1,
                Some(c) if c.is_live(now) => {
                    return Err(StoreError::LeaseHeld {
                        name: name.to_string(),
                        holder: c.holder.clone(),
                        generation: c.generation,
                        expires_in: Duration::from_millis(c.expires_unix_ms - now),
                    })
                }
                Some(c) => c.generation.checked_add(1).ok_or_else(|| {
                    StoreError::InvalidRequest(format!("lease {name:?}: generation overflow"))
                })?,
            };
            let info = LeaseInfo {
                holder: holder.to_string(),
                generation,
                expires_unix_ms: deadline(now, ttl)?,
            };
            Ok(Step::Write(info.clone(), info))
        })
        .await
    }

    async fn renew(&self, name: &str, generation: u64, ttl: Duration) -> Result<LeaseInfo> {
        crate::url::check_name(name)?;
        deadline(0, ttl)?;
        self.update(name, |current, now| match current {
            Some(c) if c.generation == generation && !c.is_released() => {
                let info = LeaseInfo { expires_unix_ms: deadline(now, ttl)?, ..c.clone() };
                Ok(Step::Write(info.clone(), info))
            }
            other => Err(lost(name, generation, other, now)),
        })
        .await
    }

    async fn release(&self, name: &str, generation: u64) -> Result<()> {
        crate::url::check_name(name)?;
        self.update(name, |current, _| match current {
            Some(c) if c.generation == generation && !c.is_released() => {
                Ok(Step::Write(LeaseInfo { expires_unix_ms: 0, ..c.clone() }, ()))
            }
            _ => Ok(Step::Done(())),
        })
        .await
    }

    async fn inspect(&self, name: &str) -> Result<Option<LeaseInfo>> {
        crate::url::check_name(name)?;
        Ok(self.load(name).await?.map(|(info, _)| info))
    }
}

/// Checks a holder name: 1 to [`MAX_HOLDER_LEN`] bytes, no control characters.
pub fn check_holder(holder: &str) -> Result<()> {
    let bad = |why: &str| {
        StoreError::InvalidRequest(format!(
            "lease holder {:?}: {why}; use a short human-readable id such as `host pid 1234`",
            shorten(holder)
        ))
    };
    if holder.is_empty() {
        return Err(bad("it is empty"));
    }
    if holder.len() > MAX_HOLDER_LEN {
        return Err(bad(&format!("it is longer than {MAX_HOLDER_LEN} bytes")));
    }
    if holder.chars().any(char::is_control) {
        return Err(bad("it contains control characters"));
    }
    Ok(())
}

/// At most the first 64 characters of `s`, for messages about hostile input.
fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

/// The [`LeaseRecords`] of the store at `url`: a fresh, empty in-memory set for `memory:`,
/// record files in the directory for `file:`, objects under the prefix for `s3://`, keys under
/// the prefix for `redis://`, and the storage server's records for `remote://`. The storage
/// server uses this to keep its own records.
pub async fn open_lease_records(url: &StoreUrl) -> Result<Arc<dyn LeaseRecords>> {
    Ok(match url {
        StoreUrl::Memory => Arc::new(MemoryLeaseRecords::default()),
        StoreUrl::File { dir, .. } => Arc::new(FileLeaseRecords::new(dir.clone())),
        StoreUrl::S3 { bucket, prefix, options } => {
            Arc::new(s3::S3LeaseRecords::open(bucket, prefix, options).await?)
        }
        StoreUrl::Redis { address, options } => {
            Arc::new(redis::RedisLeaseRecords::open(address, options).await?)
        }
        StoreUrl::Remote { addr, key_file } => {
            let key = key_file.as_deref().map(crate::remote::AuthKey::load).transpose()?;
            Arc::new(crate::remote::RemoteLeaseRecords::connect(addr, key).await?)
        }
    })
}

/// Opens the leases of the store at `url` (see [`open_lease_records`] for where each backend
/// keeps them). Every backend offers leases; `memory:` gives a fresh set each time, so only
/// handles cloned from one [`Arc`] see each other's leases.
pub async fn open_lease_store(url: &StoreUrl) -> Result<Arc<dyn LeaseStore>> {
    Ok(Arc::new(Leases::new(open_lease_records(url).await?)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn records_round_trip_and_foreign_ones_are_refused() {
        let info = LeaseInfo { holder: "h pid 1 = x".into(), generation: 7, expires_unix_ms: 99 };
        assert_eq!(LeaseInfo::decode(&info.encode()).unwrap(), info);
        for bad in [
            &b"hello"[..],
            b"blindfold-lease v1\ngeneration=1\nexpires_unix_ms=1\n",
            b"blindfold-lease v1\ngeneration=0\nexpires_unix_ms=1\nholder=h\n",
            b"blindfold-lease v1\ngeneration=x\nexpires_unix_ms=1\nholder=h\n",
            b"blindfold-lease v1\ngeneration=1\nexpires_unix_ms=1\nholder=\n",
            b"blindfold-lease v1\ngeneration=1\nexpires_unix_ms=1\nholder=h\nextra=1\n",
        ] {
            assert!(LeaseInfo::decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(LeaseInfo::decode(&vec![b'a'; MAX_LEASE_RECORD + 1]).is_err());
    }

    #[test]
    fn holders_are_checked() {
        check_holder("gw-1 pid 42").unwrap();
        check_holder(&"é".repeat(MAX_HOLDER_LEN / 2)).unwrap();
        for bad in ["", "a\nb", "a\u{0}", "tab\there", &"x".repeat(MAX_HOLDER_LEN + 1)] {
            let err = check_holder(bad).unwrap_err();
            assert!(matches!(err, StoreError::InvalidRequest(_)), "{err:?}");
            assert!(err.to_string().len() < 400, "the message is bounded");
        }
    }

    /// Time moved by hand: expiry and renewal after expiry, without sleeping.
    #[tokio::test]
    async fn expiry_follows_the_clock() {
        let now = Arc::new(AtomicU64::new(1_000));
        let clock = Arc::clone(&now);
        let leases = Leases::with_clock(
            MemoryLeaseRecords::default(),
            Arc::new(move || clock.load(Ordering::SeqCst)),
        );
        let ttl = Duration::from_millis(100);
        let a = leases.acquire("gw", "a", ttl).await.unwrap();
        assert_eq!((a.generation, a.expires_unix_ms), (1, 1_100));
        now.store(1_099, Ordering::SeqCst);
        let held = leases.acquire("gw", "b", ttl).await.unwrap_err();
        assert!(
            matches!(&held, StoreError::LeaseHeld { holder, generation: 1, expires_in, .. }
                if holder == "a" && *expires_in == Duration::from_millis(1)),
            "{held:?}"
        );
        // Expired, nobody took it: renewing keeps the generation.
        now.store(5_000, Ordering::SeqCst);
        let again = leases.renew("gw", 1, ttl).await.unwrap();
        assert_eq!((again.generation, again.expires_unix_ms), (1, 5_100));
        now.store(5_100, Ordering::SeqCst);
        let b = leases.acquire("gw", "b", ttl).await.unwrap();
        assert_eq!(b.generation, 2);
        let fenced = leases.renew("gw", 1, ttl).await.unwrap_err();
        assert!(
            matches!(&fenced, StoreError::LeaseLost { current_generation: 2, .. }),
            "{fenced:?}"
        );
        assert!(leases.acquire("gw", "b", Duration::ZERO).await.is_err());
    }
}
