//! Opening a data directory: creating it on first start (leaving nothing behind if a step
//! fails), or opening an existing one with its key, finishing a growth or a key rotation a
//! crash interrupted, and assembling the store, the engine, the directory and the snapshot
//! area into an [`Opened`] gateway.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::datadir::{read_params, write_private, GatewayParams, RECOVERING};
use crate::directory::Directory;
use crate::engine::{DirectEngine, SharedEngine};
use crate::hooks::{EngineKind, OpenHooks};
use crate::keys::{key_check, key_matches, new_credentials, read_credentials, KEY_CHECK_FILE};
use crate::objects::ObjectLayer;
use crate::observe::{Observer, PhysicalView};
use crate::params::{footprint, human_bytes, new_params, ServeConfig};
use crate::{GatewayError, Result};
use blindfold_crypto::{create_key_file, load_key_file, MasterKey};
use blindfold_proxy::catalogue::{
    cached_bytes_of, engine_cells, oram_array, oram_config, oram_geometry, physical_view,
    tao_config, EngineStore,
};
use blindfold_proxy::{DurableTao, SealedDirect};
use blindfold_store::{open_store, StoreUrl};

/// A running gateway's pieces, for `serve`, `verify` and tests.
#[derive(Debug)]
pub struct Opened {
    /// The object layer.
    pub objects: Arc<ObjectLayer>,
    /// The parameters.
    pub params: GatewayParams,
    /// What startup did, as lines for the operator.
    pub notes: Vec<String>,
    /// Credentials in force.
    pub credentials: (String, String),
    /// Whether this start generated the credentials (show the secret once, now).
    pub new_credentials: bool,
    /// The first error after which the engine refuses all work (integrity violation,
    /// poisoned driver), once there is one: the server should stop (a restart reloads the
    /// trusted state from the data directory).
    pub stopped: tokio::sync::watch::Receiver<Option<String>>,
    /// The master key: everything is sealed under it from now on.
    pub key: Arc<MasterKey>,
    /// During a key rotation, the key being retired: what it sealed still opens.
    pub previous_key: Option<Arc<MasterKey>>,
    /// The key rotation under way, whose sweep [`crate::server::run_tls`] runs while it serves.
    pub rotation: Option<crate::rotation::Rotation>,
    /// The data directory.
    pub data_dir: PathBuf,
    /// The array holding the encrypted snapshot of the trusted state.
    /// `None` when it could not be opened (damaged): the gateway serves anyway, but writes no
    /// snapshot at shutdown. A growth of the store replaces it.
    pub snapshots: crate::snapshot::SnapshotSlot,
    /// Grows the store while the gateway serves (`None` for the baseline engine).
    pub grower: Option<Arc<crate::grow::Grower>>,
    /// Grow automatically (to twice the capacity) when this percentage of blocks is in use.
    pub grow_at: Option<u8>,
    /// Watches the data directory's disk while serving (`--disk-reserve`; see
    /// [`crate::space`]).
    pub space: Option<Arc<crate::space::Guard>>,
    /// The most blocks automatic growth goes to.
    pub grow_max: Option<u64>,
    /// Where to serve the Swift API beside S3 ([`crate::swift`]), if anywhere.
    pub swift_listener: Option<tokio::net::TcpListener>,
    /// When the lifecycle worker runs and how long its days last ([`crate::lifecycle`]).
    pub lifecycle: crate::lifecycle::Schedule,
    /// What the S3 and Swift listeners allow their clients (one connection pool for both).
    pub limits: crate::listen::Limits,
    /// Metrics and recordings of this gateway (see [`crate::observe`]).
    pub observer: Arc<Observer>,
    /// The store-side log (`--durability store`), if on.
    pub journal: Option<Arc<crate::journaling::Journal>>,
}

/// Opens the data directory, creating everything missing on first start.
pub async fn open(cfg: &ServeConfig) -> Result<Opened> {
    open_with(cfg, OpenHooks::default()).await
}

/// [`open`] with a choice of engine and a wrapper around the store.
///
/// An existing data directory (one with `gateway.json`) is only ever opened: a missing key
/// file is an error, never a reason to make a new key. A new one is created in an order that
/// leaves nothing behind if any step fails: parameters are checked and the store and engine
/// opened first; the key, the credentials and the key check are written next, and
/// `gateway.json`, which marks the directory as holding a store, last.
pub async fn open_with(cfg: &ServeConfig, hooks: OpenHooks) -> Result<Opened> {
    let dir = &cfg.data_dir;
    if hooks.engine == EngineKind::DirectBaseline && dir.join("meta.redb").exists() {
        return Err(GatewayError::Config(format!(
            "the direct baseline keeps its cell versions only in memory and needs a fresh data \
             directory; {} is in use",
            dir.display()
        )));
    }
    match read_params(dir)? {
        Some(params) => open_existing(cfg, hooks, params).await,
        None if dir.join(RECOVERING).exists() => Err(GatewayError::Config(format!(
            "{} holds a `blindfold recover` that did not finish: run the same `blindfold \
             recover` again (it starts over; the store's snapshot and arrays are as they were)",
            dir.display()
        ))),
        None => create(cfg, hooks).await,
    }
}

async fn open_existing(
    cfg: &ServeConfig,
    hooks: OpenHooks,
    mut params: GatewayParams,
) -> Result<Opened> {
    let dir = &cfg.data_dir;
    if let Some(url) = &cfg.store {
        if params.store != url.to_string() {
            return Err(GatewayError::Config(format!(
                "{} was created for store {}, not {url}: leave out --store to use it, or give \
                 another --data-dir to create a new store",
                dir.display(),
                params.store,
            )));
        }
    }
    let key_path = cfg.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    if !key_path.exists() {
        return Err(GatewayError::Config(format!(
            "{} is missing — restore it from your backup (or name it with --key-file). {} \
             already holds a store, which only its own key can read, so no new key is made; \
             nothing was changed",
            key_path.display(),
            dir.display()
        )));
    }
    let loaded = load_key_file(&key_path, cfg.passphrase.as_deref())
        .map_err(|e| GatewayError::Config(e.to_string()))?;
    let id = params.store_id()?;
    let keys = crate::rotation::keys(dir, &key_path, loaded, |k| {
        Ok(key_matches(dir, k, id)? == Some(true))
    })?;
    let key = keys.current;
    let mut checked = key_matches(dir, &key, id)?;
    let mut notes = Vec::new();
    if let Some(old) = &keys.previous {
        // A rotation: the key check may still be under the old key (the rotation file opened
        // under it, so it is this directory's key). Everything kept locally under the master
        // key is re-sealed under the new one now, each file atomically.
        if checked != Some(true) {
            checked = key_matches(dir, old, id)?;
        }
        // (`None`: a directory from before key checks; the rotation file vouches for the key.)
        if checked != Some(false) {
            if Directory::rekey(&dir.join("meta.redb"), params.blocks, &key, old)? {
                notes.push("key rotation: re-sealed the directory database".to_string());
            }
            crate::users::UserFile::new(dir, &key)
                .rekey_from(&crate::users::UserFile::new(dir, old))
                .map_err(|e| GatewayError::Config(e.to_string()))?;
            if key_matches(dir, &key, id)? != Some(true) {
                let check = key_check(&key, id)?;
                write_private(
                    &dir.join(KEY_CHECK_FILE),
                    &serde_json::to_vec_pretty(&check).expect("json"),
                )?;
            }
            let r = keys.rotation.as_ref().expect("a previous key comes with a rotation");
            notes.push(format!(
                "key rotation under way ({}): it re-seals every cell while the gateway \
                 serves; the old key file is replaced when it ends",
                r.progress()
            ));
        }
    }
    if checked == Some(false) {
        return Err(GatewayError::Config(format!(
            "the key in {} does not belong to the store in {} (its key check does not match): \
             use the key file backed up with this data directory; nothing was changed",
            key_path.display(),
            dir.display()
        )));
    }
    if hooks.engine == EngineKind::PathOram && hooks.engine_factory.is_none() {
        // A growth a crash interrupted is finished (or redone) before the engine opens. The
        // ORAM state is still under the key it had then: growths never overlap a rotation.
        let state_key = keys.previous.as_ref().unwrap_or(&key);
        let url = store_url(&params, cfg.store.as_ref())?;
        let (grown, note) = crate::grow::resume(dir, params, &url, state_key).await?;
        params = grown;
        notes.extend(note);
    }
    let cred_path = dir.join("credentials.json");
    let mut generated = None;
    let credentials = match &cfg.credentials {
        Some(c) => c.clone(),
        None if cred_path.exists() => read_credentials(&cred_path)?,
        None => {
            let c = new_credentials();
            let pair = (c.access_key.clone(), c.secret_key.clone());
            generated = Some(c);
            pair
        }
    };
    let previous = keys.previous;
    let mut opened =
        assemble(cfg, hooks, params, (key, previous), credentials, false, &mut notes).await?;
    if let Some(mut r) = keys.rotation {
        // Recorded as begun: from now on the users file is kept under the new key.
        let paths = opened.objects.engine().sweep_paths().await;
        r.record(r.swept, paths)?;
        opened.rotation = Some(r);
    }
    if let Some(c) = generated {
        write_private(&cred_path, &serde_json::to_vec_pretty(&c).expect("json"))?;
        notes.push(format!("generated S3 credentials in {}", cred_path.display()));
        opened.new_credentials = true;
    }
    // A directory made before key checks existed gets one, but only once the key is known to
    // be right (it authenticates a snapshot in the store): a check made with a wrong key would
    // lock the right one out.
    let snapshots = opened.snapshots.lock().clone();
    let snapshot_found = match snapshots {
        Some(s) => crate::snapshot::latest_seq(&*s.store, &opened.key).await.is_some(),
        None => false,
    };
    if checked.is_none() && snapshot_found {
        let check = key_check(&opened.key, id)?;
        write_private(
            &dir.join(KEY_CHECK_FILE),
            &serde_json::to_vec_pretty(&check).expect("json"),
        )?;
    }
    opened.notes = notes;
    Ok(opened)
}

/// Paths a first start created, removed again if it fails.
#[derive(Default)]
struct Debris {
    paths: Vec<PathBuf>,
    armed: bool,
}

impl Debris {
    fn add(&mut self, p: PathBuf) {
        self.armed = true;
        self.paths.push(p);
    }
}

impl Drop for Debris {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        for p in self.paths.iter().rev() {
            let _ = if p.is_dir() { std::fs::remove_dir_all(p) } else { std::fs::remove_file(p) };
        }
    }
}

/// Creates a directory (and records it as debris) unless it exists.
fn make_dir(path: &Path, debris: &mut Debris) -> Result<()> {
    if !path.exists() {
        // Record the topmost directory that did not exist, so cleaning removes all of it.
        let mut top = path.to_path_buf();
        while let Some(parent) = top.parent() {
            if parent.as_os_str().is_empty() || parent.exists() {
                break;
            }
            top = parent.to_path_buf();
        }
        // Private from the start (0700): it will hold the key and the trusted state.
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        builder
            .create(path)
            .map_err(|e| GatewayError::Config(format!("creating {}: {e}", path.display())))?;
        debris.add(top);
    }
    Ok(())
}

/// The store of a data directory: the `--store` URL when one is given (it agrees with
/// gateway.json, which keeps the URL without secrets such as a Redis password), else
/// gateway.json's.
pub(crate) fn store_url(params: &GatewayParams, given: Option<&StoreUrl>) -> Result<StoreUrl> {
    match given {
        Some(url) => Ok(url.clone()),
        None => params
            .store
            .parse()
            .map_err(|e: blindfold_store::StoreError| GatewayError::Config(e.to_string())),
    }
}

async fn create(cfg: &ServeConfig, hooks: OpenHooks) -> Result<Opened> {
    let dir = &cfg.data_dir;
    let params = new_params(cfg)?;
    let store_url = store_url(&params, cfg.store.as_ref())?;
    let mut debris = Debris::default();
    make_dir(dir, &mut debris)?;
    let mut notes = Vec::new();
    // What a first start that failed before writing gateway.json left behind holds no data
    // anyone was told about.
    let mut leftovers = false;
    for p in [dir.join("oram"), dir.join("meta.redb"), dir.join(KEY_CHECK_FILE)] {
        if p.exists() {
            leftovers = true;
            let r = if p.is_dir() { std::fs::remove_dir_all(&p) } else { std::fs::remove_file(&p) };
            r.map_err(|e| GatewayError::Config(format!("removing {}: {e}", p.display())))?;
        }
    }
    if leftovers {
        notes.push("removed the leftovers of a first start that did not finish".to_string());
    }
    if let StoreUrl::File { dir: cells, .. } = &store_url {
        make_dir(cells, &mut debris)?;
    }
    // The key: an existing key file is used; a new one is written beside its final name and
    // moved there only when everything else worked.
    let key_path = cfg.key_file.clone().unwrap_or_else(|| dir.join("key.json"));
    let pass = cfg.passphrase.as_deref();
    let (key, new_key) = if key_path.exists() {
        (load_key_file(&key_path, pass).map_err(|e| GatewayError::Config(e.to_string()))?, None)
    } else {
        if let Some(parent) = key_path.parent() {
            if !parent.as_os_str().is_empty() {
                make_dir(parent, &mut debris)?;
            }
        }
        let mut tmp = key_path.clone().into_os_string();
        tmp.push(".new");
        let tmp = PathBuf::from(tmp);
        let _ = std::fs::remove_file(&tmp);
        let k = create_key_file(&tmp, pass).map_err(|e| GatewayError::Config(e.to_string()))?;
        debris.add(tmp.clone());
        (k, Some(tmp))
    };
    debris.add(dir.join("oram"));
    debris.add(dir.join("meta.redb"));
    // A store that already holds a gateway (its snapshot index) is never taken over: the new
    // gateway would overwrite that gateway's arrays.
    if hooks.engine == EngineKind::PathOram {
        match crate::snapshot::existing_index(&store_url, &key).await? {
            Some(true) => {
                return Err(GatewayError::Config(format!(
                    "{} already holds a blindfold gateway sealed with this key, and {} is not \
                     its data directory: to rebuild that directory from the store run \
                     `blindfold recover --data-dir DIR --store {} --key-file {}`; for a new \
                     gateway choose another store location. Nothing was changed",
                    params.store,
                    dir.display(),
                    params.store,
                    key_path.display()
                )))
            }
            Some(false) => {
                return Err(GatewayError::Config(format!(
                    "{} already holds another blindfold gateway's data (sealed with another \
                     key): choose another store location (directory, bucket prefix or \
                     database) for a new gateway, or give the key that gateway was made with. \
                     Nothing was changed",
                    params.store
                )))
            }
            None => {}
        }
    }
    let credentials = match &cfg.credentials {
        Some(c) => (c.clone(), None),
        None => {
            let c = new_credentials();
            ((c.access_key.clone(), c.secret_key.clone()), Some(c))
        }
    };
    let id = params.store_id()?;
    let check = key_check(&key, id)?;
    let mut opened =
        assemble(cfg, hooks, params.clone(), (key, None), credentials.0, true, &mut notes).await?;
    // Everything opened: now the files that make the directory usable, gateway.json last.
    let cred_path = dir.join("credentials.json");
    if let Some(c) = credentials.1 {
        debris.add(cred_path.clone());
        write_private(&cred_path, &serde_json::to_vec_pretty(&c).expect("json"))?;
        notes.push(format!("generated S3 credentials in {}", cred_path.display()));
        opened.new_credentials = true;
    }
    debris.add(dir.join(KEY_CHECK_FILE));
    write_private(&dir.join(KEY_CHECK_FILE), &serde_json::to_vec_pretty(&check).expect("json"))?;
    if let Some(tmp) = new_key {
        std::fs::rename(&tmp, &key_path)
            .map_err(|e| GatewayError::Config(format!("writing {}: {e}", key_path.display())))?;
        debris.add(key_path.clone());
        notes.push(format!(
            "created a new key at {} — back it up: without it the stored data cannot be read",
            key_path.display()
        ));
    }
    let f = footprint(&params)?;
    write_private(&dir.join("gateway.json"), &serde_json::to_vec_pretty(&params).expect("json"))?;
    debris.armed = false;
    notes.push(format!(
        "created an oblivious store of {} ({} blocks of {} bytes) at {}, taking up to {} there",
        human_bytes(f.capacity_bytes),
        f.blocks,
        f.block_size,
        params.store,
        human_bytes(f.store_bytes)
    ));
    if let (Some((objects, buckets)), true) = (params.tao_path_objects(), params.pack_levels > 1) {
        notes.push(format!(
            "packed {} tree levels per store object: an access reads and writes {objects} \
             object(s) holding {buckets} bucket(s) of its path; up to {} of sealed objects stay \
             in memory for the write-backs{}",
            params.tao_pack_levels(),
            human_bytes(DurableTao::packed_cache_bytes(
                &tao_config(&params)?,
                params.tao_pack_levels()
            )?),
            if objects == buckets {
                " — as many as unpacked, each larger: packing pays only when several levels \
                 lie below the cached top (a larger store, or a smaller --cache-mib)"
            } else {
                ""
            }
        ));
    }
    opened.notes = notes;
    Ok(opened)
}

/// Opens the store, the engine (creating it if `creating`), the directory and the snapshot
/// array.
async fn assemble(
    cfg: &ServeConfig,
    hooks: OpenHooks,
    params: GatewayParams,
    (key, previous): (MasterKey, Option<MasterKey>),
    credentials: (String, String),
    creating: bool,
    notes: &mut Vec<String>,
) -> Result<Opened> {
    let dir = &cfg.data_dir;
    let key = Arc::new(key);
    let previous = previous.map(Arc::new);
    let wrap_store = hooks.wrap_store.map(Arc::new);
    // The data directory is private: 0700, its files 0600 (tightened, with a warning, if not).
    for warning in blindfold_proxy::make_private(dir)? {
        tracing::warn!("{warning}");
        notes.push(warning);
    }
    let store_url = store_url(&params, cfg.store.as_ref())?;
    oram_config(&params)?;
    let injected = match hooks.engine_factory {
        Some(open) => {
            let retiring = previous.clone();
            Some(
                open(dir.join("oram"), params.clone(), Arc::clone(&key), retiring, creating)
                    .await?,
            )
        }
        None => None,
    };
    let injected_engine = injected.is_some();
    let (array, geometry) = match hooks.engine {
        EngineKind::PathOram => (oram_array(params.generation), oram_geometry(&params)?),
        EngineKind::DirectBaseline => {
            ("direct".to_owned(), SealedDirect::geometry(params.blocks, params.block_size)?)
        }
    };
    let store = if injected_engine {
        // The engine keeps its blocks elsewhere: nothing of it goes to this store.
        Arc::new(blindfold_store::MemoryStore::new(geometry)) as Arc<dyn blindfold_store::Store>
    } else {
        open_store(&store_url, &array, geometry)
            .await
            .map_err(|e| GatewayError::Config(format!("opening the store {store_url}: {e}")))?
    };
    // Every write of the engine passes the lease's gate (`--durability store`: once the lease
    // lapses unrenewed, as after a long pause, nothing more is written; open otherwise).
    let gate = blindfold_store::LeaseGate::new();
    let store = blindfold_store::GatedStore::wrap(store, Arc::clone(&gate));
    let store = match &wrap_store {
        Some(wrap) => wrap(store),
        None => store,
    };
    // The operator's view: every store request is counted (and fed to recording windows).
    let (view, engine_name, layout) = match hooks.engine {
        EngineKind::DirectBaseline => {
            (PhysicalView::Flat { cells: params.blocks }, "direct".to_owned(), "flat".to_owned())
        }
        EngineKind::PathOram => {
            let layout = match (params.two_slots(), params.tao_pack_levels()) {
                (false, _) => "in-place".to_owned(),
                (true, 1) => "two-slots".to_owned(),
                (true, l) => format!("two-slots, {l} tree levels per object"),
            };
            (physical_view(&params)?, params.engine.to_string(), layout)
        }
    };
    let mut observer = Observer::new();
    observer.set_info(&engine_name, &layout, params.block_size);
    let observer = Arc::new(observer);
    let stored_bytes = geometry.total_bytes();
    let store = observer.wrap_store(store, view, stored_bytes);
    let oram_dir = dir.join("oram");
    let id = params.store_id()?;
    let recovered = |rec: blindfold_proxy::Recovery, notes: &mut Vec<String>| {
        if rec.replayed > 0 || rec.torn_bytes > 0 {
            notes.push(format!(
                "recovered after an unclean stop: replayed {} log records ({} cells)",
                rec.replayed, rec.cells_rewritten
            ));
        }
        if rec.dropped > 0 {
            notes.push(format!(
                "dropped {} commit record(s) whose cells never all reached the store: the \
                 gateway stopped while writing them, before anything was acknowledged on them",
                rec.dropped
            ));
        }
    };
    let engine: Arc<dyn SharedEngine> = if let Some(engine) = injected {
        engine
    } else if hooks.engine == EngineKind::DirectBaseline {
        let sealer = blindfold_crypto::CellSealer::new(&key, id, 0);
        Arc::new(DirectEngine::new(SealedDirect::new(store, sealer, params.block_size)?))
    } else {
        let wrap_tee = |tee| observer.wrap_tee_store(tee);
        let (engine, rec) = blindfold_proxy::lifecycle::open_engine(
            &params,
            &oram_dir,
            EngineStore { store, url: &store_url, array: &array, geometry, wrap_tee: &wrap_tee },
            &key,
            previous.as_deref(),
            creating,
        )
        .await?;
        if let Some(rec) = rec {
            recovered(rec, notes);
        }
        engine
    };
    let directory = Directory::open(&dir.join("meta.redb"), params.blocks, &key)?;
    let cells = engine_cells(&params)?;
    // The snapshot is needed only at shutdown and by `recover`: damage to it must not stop
    // the gateway from serving.
    let keys: Vec<&MasterKey> = std::iter::once(&*key).chain(previous.as_deref()).collect();
    let snapshots = match crate::snapshot::open(
        &store_url,
        &keys,
        params.blocks,
        cells,
        cached_bytes_of(&params)?,
    )
    .await
    {
        Ok(s) => Some(s),
        Err(e) => {
            let warning = format!(
                "the snapshot area in the store cannot be opened ({e}); serving anyway, but \
                     no snapshot will be written at shutdown, so `blindfold recover` would \
                     only find an older one: run `blindfold verify`"
            );
            tracing::warn!("{warning}");
            notes.push(warning);
            None
        }
    };
    let tap = engine.journal_tap().await;
    let swappable = Arc::new(crate::engine::Swappable::new(engine));
    let watched = crate::engine::Watched::observed(
        Arc::clone(&swappable) as Arc<dyn SharedEngine>,
        Arc::clone(&observer),
    );
    let stopped = watched.subscribe();
    let objects =
        Arc::new(ObjectLayer::with_engine(directory, Arc::new(watched), params.pad_objects));
    let snapshots = Arc::new(parking_lot::Mutex::new(snapshots));
    // An injected engine (the load balancer over ORAM nodes) is logged when it hands over a
    // tap: its own state then goes to this store, and each node logs its blocks in its own.
    let loggable = matches!((&tap, hooks.engine), (Some(_), EngineKind::PathOram));
    if cfg.durability == crate::params::Durability::Store && !loggable {
        return Err(GatewayError::Config(format!(
            "--durability store is not available for the {engine_name} engine here (a \
             baseline engine, whose blocks have no redo log): serve with --durability local"
        )));
    }
    if let (Some(anchor), false) = (&cfg.anchor, cfg.durability.in_store(&store_url) && loggable) {
        return Err(GatewayError::Config(format!(
            "--anchor {anchor} records how far the store-side log reaches, and this gateway \
             keeps no log in the store (--durability local, or a file store under \
             --durability auto): serve with --durability store, or without --anchor"
        )));
    }
    if cfg.reads_ahead_of_log && !(cfg.durability.in_store(&store_url) && loggable) {
        return Err(GatewayError::Config(
            "--reads-ahead-of-log lets reads go ahead of the store-side log, and this gateway \
             keeps no log in the store (--durability local, or a file store under --durability \
             auto): serve with --durability store, or without --reads-ahead-of-log"
                .into(),
        ));
    }
    if cfg.reads_ahead_of_log && dir.join(crate::rotation::ROTATION_FILE).exists() {
        return Err(GatewayError::Config(
            "a key rotation is under way in this data directory, and a recovery from the store \
             alone could not rebuild a tree sealed under two keys: serve without \
             --reads-ahead-of-log until the rotation has ended (the gateway logs it)"
                .into(),
        ));
    }
    if cfg.reads_ahead_of_log && injected_engine {
        return Err(GatewayError::Config(
            "--reads-ahead-of-log is not available for a gateway over ORAM nodes (a recovery \
             from the store alone could not rebuild their trees): serve without it"
                .into(),
        ));
    }
    let feed_listen = match &cfg.log_feed {
        Some(crate::feed::LogFeed::Serve(addr)) => Some(*addr),
        _ => None,
    };
    if feed_listen.is_some() {
        let why = if !(cfg.durability.in_store(&store_url) && loggable) {
            Some(
                "this gateway keeps no log in the store (--durability local, or a file store \
                 under --durability auto): serve with --durability store",
            )
        } else if cfg.reads_ahead_of_log {
            Some("reads already go ahead of the log (--reads-ahead-of-log): give one or the other")
        } else if injected_engine {
            Some(
                "a recovery from the store alone could not rebuild the trees of ORAM nodes, and \
                 without the standby it would have to",
            )
        } else if dir.join(crate::rotation::ROTATION_FILE).exists() {
            Some(
                "a key rotation is under way in this data directory, and a recovery from the \
                 store alone could not rebuild a tree sealed under two keys: serve without \
                 --standby-listen until the rotation has ended",
            )
        } else {
            None
        };
        if let Some(why) = why {
            return Err(GatewayError::Config(format!(
                "--standby-listen lets reads go out once a standby holds their reveal records: \
                 {why}"
            )));
        }
    }
    let reads_go_ahead = blindfold_proxy::lifecycle::reads_go_ahead(params.engine);
    if cfg.reads_ahead_of_log && !reads_go_ahead {
        let note = format!(
            "--reads-ahead-of-log changes nothing for the {engine_name} engine: its reads \
             always wait for the store-side log (only tao and path-oram read ahead), and a \
             recovery from the store alone rebuilds nothing"
        );
        tracing::info!("{note}");
        notes.push(note);
    }
    let journal = if cfg.durability.in_store(&store_url) && loggable {
        let tap = tap.expect("checked above");
        let journal = crate::journaling::start(crate::journaling::Start {
            url: &store_url,
            key: &key,
            dir,
            objects: &objects,
            tap,
            slot: &snapshots,
            params: &params,
            lease_ttl: cfg.lease_ttl.unwrap_or(crate::journaling::LEASE_TTL),
            anchor: cfg.anchor.as_ref(),
            wrap: wrap_store.as_deref(),
            gate,
            reads_ahead: cfg.reads_ahead_of_log && reads_go_ahead,
            feed_listen,
        })
        .await?;
        notes.push(format!(
            "durability: store — every write is logged in the store ({} cells of {} KiB) \
             before it is acknowledged; `blindfold recover` restores it from the store alone",
            journal.log.cells(),
            crate::storelog::CHUNK / 1024
        ));
        Some(journal)
    } else {
        None
    };
    // An injected engine (the load balancer over ORAM nodes) grows in place.
    let grower = (hooks.engine == EngineKind::PathOram).then(|| {
        Arc::new(crate::grow::Grower::new(crate::grow::GrowerParts {
            dir: dir.clone(),
            key: Arc::clone(&key),
            engine: swappable,
            objects: Arc::clone(&objects),
            observer: Arc::clone(&observer),
            wrap_store,
            store_url: store_url.clone(),
            snapshots: Arc::clone(&snapshots),
            rotating: previous.is_some(),
        }))
    });
    if let (Some(j), Some(g)) = (&journal, &grower) {
        g.set_journal(Arc::clone(&j.log));
    }
    Ok(Opened {
        objects,
        params,
        notes: Vec::new(),
        credentials,
        new_credentials: false,
        stopped,
        key,
        previous_key: previous,
        rotation: None,
        data_dir: dir.clone(),
        snapshots,
        grower,
        grow_at: None,
        space: None,
        grow_max: None,
        swift_listener: None,
        lifecycle: Default::default(),
        limits: crate::listen::Limits::default(),
        observer,
        journal,
    })
}
