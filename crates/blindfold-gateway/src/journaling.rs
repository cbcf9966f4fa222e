//! Starting a gateway's store-side log (`--durability store`, [`crate::storelog`]): the
//! store's lease (one writer), the first store checkpoint, the engine's tap and the directory
//! attached to the log, and the background tasks that checkpoint and renew the lease.

use std::sync::Arc;
use std::time::Duration;

use blindfold_crypto::MasterKey;
use blindfold_store::lease::system_clock_ms as unix_ms;
use blindfold_store::StoreUrl;

use crate::storelog::{open_ring, JournalPoint, StoreLog, DEFAULT_CELLS};
use crate::{GatewayError, Result};

/// How often the background checkpointer writes a store checkpoint when anything changed,
/// besides whenever the ring passes half full or the engine checkpoints.
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(30);

/// How long the gateway's lease on its store lasts unless renewed (`--lease-ttl`): a
/// successor waits at most this long after the gateway died. Renewed every quarter of it.
pub const LEASE_TTL: Duration = Duration::from_secs(5);
/// The lease's name in the store.
pub const LEASE: &str = "gateway";

/// A running gateway's store-side log, its lease and its background tasks.
pub struct Journal {
    /// The log.
    pub log: Arc<StoreLog>,
    leases: Arc<dyn blindfold_store::LeaseStore>,
    tasks: parking_lot::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Where the standby's log feed is served (`--standby-listen`), if it is.
    pub feed_addr: Option<std::net::SocketAddr>,
    /// Standbys kept in this process ([`Journal::follow_here`]).
    followers: parking_lot::Mutex<Vec<crate::feed::Follower>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("log", &self.log).finish_non_exhaustive()
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
    }
}

impl Journal {
    /// Benchmarks: a standby's end of the log feed in this process, kept as long as the
    /// journal, holding the log's tail as a standby on another machine would.
    #[doc(hidden)]
    pub fn follow_here(&self, key: Arc<MasterKey>) -> Result<()> {
        let addr = self.feed_addr.ok_or_else(|| {
            GatewayError::Config("this gateway serves no log feed (--standby-listen)".into())
        })?;
        let f = crate::feed::follow(addr.to_string(), key, "in-process standby".into());
        self.followers.lock().push(f);
        Ok(())
    }

    /// Stops the background checkpointer (a clean stop writes the last checkpoint itself).
    pub fn stop(&self) {
        if let Some(task) = self.tasks.lock().first() {
            task.abort();
        }
    }

    /// Stops renewing the lease and checkpointing, without fencing anything: what a process
    /// paused for a while looks like from outside (tests).
    #[doc(hidden)]
    pub fn freeze(&self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
    }

    /// Gives the lease up (after the last checkpoint of a clean stop), so that a successor
    /// need not wait for it to expire; stops renewing it.
    pub async fn release(&self) -> Result<()> {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
        self.log.close("the gateway stopped and gave up its lease".into());
        self.leases
            .release(LEASE, self.log.generation())
            .await
            .map_err(|e| GatewayError::Config(format!("releasing the store's lease: {e}")))
    }
}

/// This process, as the lease names its holder: host and pid.
fn holder() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().chars().filter(|c| !c.is_control()).take(64).collect::<String>())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".into());
    format!("{host} pid {}", std::process::id())
}

/// Takes the store's lease, refusing clearly while another gateway holds it. Returns it
/// with the moment the request that took it was sent (by both clocks): it lasts `ttl` from
/// then.
async fn take_lease(
    leases: &dyn blindfold_store::LeaseStore,
    ttl: Duration,
) -> Result<(blindfold_store::LeaseInfo, tokio::time::Instant, u64)> {
    let me = holder();
    let mut sent = (tokio::time::Instant::now(), unix_ms());
    let mut first = leases.acquire(LEASE, &me, ttl).await;
    if let Err(blindfold_store::StoreError::LeaseHeld { holder, expires_in, .. }) = &first {
        // Often this gateway's own predecessor, killed a moment ago (a supervisor restarting
        // it): wait once for that lease to run out. A live holder renews it meanwhile.
        if *expires_in <= ttl.max(LEASE_TTL) * 2 {
            tracing::warn!(
                holder = %holder,
                "the store's lease is held; waiting {:.1} s for it to lapse (a gateway that died?)",
                expires_in.as_secs_f64()
            );
            tokio::time::sleep(*expires_in + Duration::from_millis(100)).await;
            sent = (tokio::time::Instant::now(), unix_ms());
            first = leases.acquire(LEASE, &me, ttl).await;
        }
    }
    match first {
        Ok(info) => Ok((info, sent.0, sent.1)),
        Err(blindfold_store::StoreError::LeaseHeld { holder, generation, expires_in, .. }) => {
            Err(GatewayError::Config(format!(
                "another gateway ({holder}, lease generation {generation}) is writing to this \
                 store; its lease runs out in {:.1} s unless it renews it. Stop it first (or, \
                 if it died, wait for its lease to lapse and start again); two gateways on one \
                 store would overwrite each other's cells",
                expires_in.as_secs_f64()
            )))
        }
        Err(e) if e.is_retryable() => {
            // The lease may have been taken all the same: carry on if it is ours.
            match leases.inspect(LEASE).await {
                Ok(Some(info)) if info.holder == me => Ok((info, sent.0, sent.1)),
                _ => Err(GatewayError::Config(format!("taking the store's lease: {e}"))),
            }
        }
        Err(e) => Err(GatewayError::Config(format!("taking the store's lease: {e}"))),
    }
}

/// Renews the lease every quarter of `ttl`; fences the log when the lease is lost, or when
/// it could not be renewed before it would lapse (a successor may then take over).
async fn keep_lease(
    leases: Arc<dyn blindfold_store::LeaseStore>,
    log: Arc<StoreLog>,
    ttl: Duration,
    mut deadline: tokio::time::Instant,
) {
    loop {
        tokio::time::sleep(ttl / 4).await;
        let sent = tokio::time::Instant::now();
        let sent_unix_ms = unix_ms();
        match leases.renew(LEASE, log.generation(), ttl).await {
            Ok(_) => {
                deadline = sent + ttl;
                log.gate().extend(sent.into_std(), sent_unix_ms, ttl);
            }
            Err(e @ blindfold_store::StoreError::LeaseLost { .. }) => {
                log.fence(format!(
                    "this gateway lost its lease on the store ({e}); it acknowledges nothing \
                     more. Another gateway took over: point clients at it"
                ));
                return;
            }
            Err(e) => {
                // A quarter of the ttl is kept as a margin for clocks and slow replies.
                if tokio::time::Instant::now() + ttl / 4 >= deadline {
                    log.fence(format!(
                        "the store's lease could not be renewed before it lapses ({e}); this \
                         gateway acknowledges nothing more, since a successor may take over. \
                         Restart it once the store is reachable"
                    ));
                    return;
                }
                tracing::warn!(error = %e, "renewing the store's lease failed; retrying");
            }
        }
    }
}

/// Where a new run's log starts: after every cell the newest store checkpoint's log may
/// hold, or (no checkpoint of a log) at a random place far from any earlier run's.
fn start_after(point: Option<&JournalPoint>) -> (u64, u64) {
    match point {
        Some(p) => (p.read_from + p.cells, p.next_entry),
        None => (rand::random::<u64>() >> 16 | 1 << 40, 0),
    }
}

/// What starting the store-side log of a gateway just opened takes (`--durability store`):
/// [`start`] takes the store's lease, writes a store checkpoint of the state as it is, then
/// attaches the log to the engine's tap and to the directory, and starts the background
/// checkpointer and the lease's renewal. Call before serving.
pub struct Start<'a> {
    /// The store.
    pub url: &'a StoreUrl,
    /// The master key.
    pub key: &'a Arc<MasterKey>,
    /// The data directory.
    pub dir: &'a std::path::Path,
    /// The object layer (its directory is logged).
    pub objects: &'a Arc<crate::objects::ObjectLayer>,
    /// The engine's tap.
    pub tap: blindfold_proxy::Tap,
    /// The snapshot area, where store checkpoints go.
    pub slot: &'a crate::snapshot::SnapshotSlot,
    /// The gateway's parameters.
    pub params: &'a crate::datadir::GatewayParams,
    /// The lease's ttl.
    pub lease_ttl: Duration,
    /// Applied to the log's array once opened, as to the engine's (the operator's counters, a
    /// benchmark's emulated link).
    pub wrap: Option<&'a crate::hooks::StoreWrapper>,
    /// Where to record how far the log reaches (`--anchor`).
    pub anchor: Option<&'a crate::anchor::AnchorSpec>,
    /// The gate the engine's store passes: given the lease's deadline, shut when fenced.
    pub gate: Arc<blindfold_store::LeaseGate>,
    /// Reads go out before the store holds their reveal records (`--reads-ahead-of-log`).
    pub reads_ahead: bool,
    /// Serve the standby's log feed on this address (`--standby-listen`).
    pub feed_listen: Option<std::net::SocketAddr>,
}

impl std::fmt::Debug for Start<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Start")
            .field("url", &self.url)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// [`Start`]s the store-side log; see [`Start`].
pub async fn start(s: Start<'_>) -> Result<Arc<Journal>> {
    let Start {
        url,
        key,
        dir,
        objects,
        tap,
        slot,
        params,
        lease_ttl,
        wrap,
        anchor,
        gate,
        reads_ahead,
        feed_listen,
    } = s;
    let Some(array) = slot.lock().clone() else {
        return Err(GatewayError::Config(
            "--durability store needs the snapshot area in the store, which could not be \
             opened: run `blindfold verify`, or serve with --durability local"
                .into(),
        ));
    };
    let latest = crate::snapshot::read_latest(&*array.store, key).await.ok();
    let point = latest.as_ref().and_then(|s| s.journal.as_ref());
    let (start, mut next_entry) = start_after(point);
    let anchor = match anchor {
        Some(spec) => {
            let anchor = crate::anchor::Anchor::open(spec, key).await?;
            // Entry numbers only go up, so that the anchor never reads as behind: a store
            // checkpoint older than the anchor (the store rolled back while this data directory,
            // which is newer, survived) continues from the anchor's number.
            if let Some(record) = anchor.read().await? {
                next_entry = next_entry.max(record.entries);
            }
            Some(Arc::new(anchor))
        }
        None => None,
    };
    let ring = open_ring(url, point.map_or(DEFAULT_CELLS, |p| p.cells)).await?;
    // The log's own writes pass the lease's gate too (a late write after a pause).
    let ring = blindfold_store::GatedStore::wrap(ring, Arc::clone(&gate));
    let ring = match wrap {
        Some(wrap) => wrap(ring),
        None => ring,
    };
    let oram = dir.join("oram");
    let read = |name: &str| -> Result<Vec<u8>> {
        let path = oram.join(name);
        match std::fs::read(&path) {
            Ok(b) => Ok(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(GatewayError::Config(format!("reading {}: {e}", path.display()))),
        }
    };
    let checkpoint = read(blindfold_proxy::state_file::CHECKPOINT)?;
    let redo = read(blindfold_proxy::state_file::REDO_LOG)?;
    let leases = blindfold_store::open_lease_store(url)
        .await
        .map_err(|e| GatewayError::Config(format!("opening the store's lease: {e}")))?;
    let (lease, taken, taken_unix_ms) = take_lease(&*leases, lease_ttl).await?;
    gate.extend(taken.into_std(), taken_unix_ms, lease_ttl);
    if let Some(p) = point {
        if p.generation > lease.generation {
            return Err(GatewayError::Corrupt(format!(
                "the store's newest checkpoint was written under lease generation {} but the \
                 store's lease is at generation {}: the lease record was reset or rolled back",
                p.generation, lease.generation
            )));
        }
    }
    let mut log = StoreLog::new(ring, key, start, next_entry, lease.generation, checkpoint, redo);
    if let Some(anchor) = anchor {
        log.set_anchor(anchor);
    }
    log.set_gate(gate);
    log.set_reads_ahead(reads_ahead);
    let listener = match feed_listen {
        Some(addr) => {
            let l = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                GatewayError::Config(format!(
                    "--standby-listen {addr}: cannot listen there for a standby ({e}); give a \
                     free address of this machine"
                ))
            })?;
            log.set_feed();
            Some(l)
        }
        None => None,
    };
    let log = Arc::new(log);
    let feed_addr = listener.as_ref().and_then(|l| l.local_addr().ok());
    // Renewed from now on: the first store checkpoint below may take longer than the ttl.
    let renewer = tokio::spawn(keep_lease(
        Arc::clone(&leases),
        Arc::clone(&log),
        lease_ttl,
        taken + lease_ttl,
    ));
    if let Err(e) =
        crate::snapshot::write_journal_snapshot(slot, key, dir, objects, &log, params).await
    {
        renewer.abort();
        return Err(e);
    }
    tap.attach(Arc::clone(&log) as Arc<dyn blindfold_proxy::LogMirror>);
    objects.directory().attach_journal(Arc::clone(&log));
    let task = {
        let (log, slot, key, dir, objects, params) = (
            Arc::clone(&log),
            Arc::clone(slot),
            Arc::clone(key),
            dir.to_path_buf(),
            Arc::clone(objects),
            params.clone(),
        );
        tokio::spawn(async move {
            let mut covered = log.next_entry();
            loop {
                // Woken, only when one is due (a wake-up may be left over from before the
                // last checkpoint); else every CHECKPOINT_EVERY when anything changed.
                let woken = tokio::select! {
                    _ = log.wake.notified() => true,
                    _ = tokio::time::sleep(CHECKPOINT_EVERY) => false,
                };
                let due = log.take_checkpoint_due();
                if (woken && !due) || log.next_entry() == covered {
                    continue;
                }
                let next = log.next_entry();
                let written = crate::snapshot::write_journal_snapshot(
                    &slot, &key, &dir, &objects, &log, &params,
                )
                .await;
                match written {
                    Ok(seq) => {
                        covered = next;
                        tracing::debug!(seq, "store checkpoint written");
                    }
                    Err(e) => tracing::warn!(
                        error = %e,
                        "a store checkpoint could not be written; the store-side log keeps \
                         everything since the last one (writes wait once it is full)"
                    ),
                }
            }
        })
    };
    let mut tasks = vec![task, renewer];
    if let Some(listener) = listener {
        tracing::info!(address = ?feed_addr, "serving the log feed to a standby (--standby-listen)");
        tasks.push(tokio::spawn(crate::feed::serve(listener, Arc::clone(&log), Arc::clone(key))));
        if let Some(feed) = log.feed() {
            tasks.push(tokio::spawn(crate::feed::keep_status(Arc::clone(feed), dir.to_path_buf())));
        }
    }
    tracing::info!(generation = lease.generation, holder = %lease.holder, "took the store's lease");
    Ok(Arc::new(Journal {
        log,
        leases,
        tasks: parking_lot::Mutex::new(tasks),
        feed_addr,
        followers: parking_lot::Mutex::new(Vec::new()),
    }))
}
