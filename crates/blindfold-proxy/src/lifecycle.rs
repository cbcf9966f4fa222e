//! The lifecycle every crash-consistent engine offers: what the gateway, `blindfold recover`,
//! `blindfold grow` and key rotation ask of an engine, in one trait ([`DurableEngine`]).
//!
//! An engine's trusted state lives in a state directory (a checkpoint and a redo log) and its
//! cells in an untrusted store array. Over that pair an engine can be
//!
//! * **created** for a data directory's parameters ([`DurableEngine::create`]);
//! * **opened** after a clean stop or a crash, replaying its redo log, and during a key
//!   rotation under the key being retired as well ([`DurableEngine::open`]);
//! * **rebuilt** into a new store array with fresh random placement and a fresh key epoch,
//!   from a snapshot's checkpoint (`recover`), or **grown** into a larger one
//!   ([`DurableEngine::rebuild`], see [`crate::rebuild`]);
//! * asked how many blocks its saved checkpoint holds ([`DurableEngine::saved_blocks`]).
//!
//! Committing, checkpointing at a clean stop and re-sealing under a new key while serving are
//! calls of the running engine ([`SharedEngine::commit`], [`SharedEngine::shutdown`],
//! [`SharedEngine::sweep`]). The functions below ([`open_engine`], [`rebuild`], [`grow`],
//! [`saved_blocks`], [`check`]) map each [`OramEngine`] of [`crate::catalogue`] to its
//! implementation in one place, so callers never match on engines themselves.

use std::path::Path;
use std::sync::Arc;

use blindfold_crypto::MasterKey;
use blindfold_store::{Store, StoreUrl, TeeStore};

use crate::catalogue::{
    oblivistore_config, oram_config, tao_config, tee_config, EngineParams, EngineStore, OramEngine,
};
use crate::engine::{Serialized, SharedEngine};
use crate::rebuild::Rebuilt;
use crate::{
    DurableObliviStore, DurablePathOram, DurableTao, DurableTee, ProxyError, Recovery, Result,
};

/// A crash-consistent engine: created, opened (replaying its log), rebuilt and grown through
/// one interface. See the module documentation.
#[async_trait::async_trait]
pub trait DurableEngine: Sized + Send + Sync + 'static {
    /// The engine's configuration, derived from a data directory's parameters.
    type Config: Clone + Send + Sync + 'static;

    /// Whether the engine's reads may go out before the mirror holds their reveal records
    /// ([`crate::journal::LogMirror::reads_wait`] answering false, or a standby's word): only
    /// then can a recovery from the mirror alone lack a reveal the store saw, and only then
    /// must it rebuild the tree. An engine that appends every record through
    /// [`crate::journal::append_frames`] waits for the mirror whatever it answers.
    const READS_GO_AHEAD: bool = false;

    /// The configuration for `params`; an error names what the engine cannot run with.
    fn config(params: &EngineParams) -> Result<Self::Config>;

    /// Creates the engine of `params` in the state directory `dir` (made if missing, refused if
    /// it holds state) over the store of `store`, which must be fresh.
    async fn create(
        dir: &Path,
        params: &EngineParams,
        store: EngineStore<'_>,
        key: &MasterKey,
    ) -> Result<Self>;

    /// Opens the engine whose state is in `dir` over `store`, replaying its redo log after an
    /// unclean stop. `previous` is the key being retired during a key rotation: state and cells
    /// still sealed under it are opened with it (an engine that cannot re-seal refuses it).
    async fn open(
        dir: &Path,
        params: &EngineParams,
        store: EngineStore<'_>,
        key: &MasterKey,
        previous: Option<&MasterKey>,
    ) -> Result<(Self, Recovery)>;

    /// The engine as the object layer shares it.
    fn share(self) -> Arc<dyn SharedEngine>;

    /// Rebuilds the engine whose checkpoint is in `dir`, over the cells of `old`, into `new`
    /// sealed under `epoch`, with fresh random placement; `grow_to` makes the new engine larger
    /// (and refuses to lose any block). Replaces the checkpoint last. See [`crate::rebuild`].
    async fn rebuild(
        dir: &Path,
        old: Arc<dyn Store>,
        new: Arc<dyn Store>,
        key: &MasterKey,
        epoch: u32,
        grow_to: Option<Self::Config>,
    ) -> Result<Rebuilt>;

    /// Blocks the engine whose checkpoint is in `dir` holds.
    fn saved_blocks(dir: &Path, key: &MasterKey) -> Result<u64>;
}

#[async_trait::async_trait]
impl DurableEngine for DurablePathOram {
    type Config = blindfold_oram::PathOramConfig;
    const READS_GO_AHEAD: bool = true;

    fn config(params: &EngineParams) -> Result<Self::Config> {
        oram_config(params)
    }

    async fn create(
        dir: &Path,
        params: &EngineParams,
        store: EngineStore<'_>,
        key: &MasterKey,
    ) -> Result<Self> {
        DurablePathOram::create(dir, oram_config(params)?, store.store, key, params.store_id()?)
            .await
    }

    async fn open(
        dir: &Path,
        _: &EngineParams,
        store: EngineStore<'_>,
        key: &MasterKey,
        previous: Option<&MasterKey>,
    ) -> Result<(Self, Recovery)> {
        DurablePathOram::open_rotating(dir, store.store, key, previous).await
    }

    fn share(self) -> Arc<dyn SharedEngine> {
        Arc::new(Serialized::new(self))
    }

    async fn rebuild(
        dir: &Path,
        old: Arc<dyn Store>,
        new: Arc<dyn Store>,
        key: &MasterKey,
        epoch: u32,
        grow_to: Option<Self::Config>,
    ) -> Result<Rebuilt> {
        match grow_to {
            Some(to) => crate::rebuild::grow_path_oram(dir, old, new, key, epoch, to).await,
            None => crate::rebuild::rebuild_path_oram(dir, old, new, key, epoch).await,
        }
    }

    fn saved_blocks(dir: &Path, key: &MasterKey) -> Result<u64> {
        crate::rebuild::saved_path_oram_blocks(dir, key)
    }
}

#[async_trait::async_trait]
impl DurableEngine for DurableTao {
    type Config = crate::TaoConfig;
    const READS_GO_AHEAD: bool = true;

    fn config(params: &EngineParams) -> Result<Self::Config> {
        tao_config(params)
    }

    async fn create(
        dir: &Path,
        params: &EngineParams,
        store: EngineStore<'_>,
        key: &MasterKey,
    ) -> Result<Self> {
        let (pinned, pack) = (params.tao_pinned_cells(), params.tao_pack_levels());
        let id = params.store_id()?;
        DurableTao::create_packed(dir, tao_config(params)?, store.store, key, id, pinned, pack)
            .await
    }

    async fn open(
        dir: &Path,
        _: &EngineParams,
        store: EngineStore<'_>,
        key: &MasterKey,
        previous: Option<&MasterKey>,
    ) -> Result<(Self, Recovery)> {
        DurableTao::open_rotating(dir, store.store, key, previous).await
    }

    fn share(self) -> Arc<dyn SharedEngine> {
        Arc::new(self)
    }

    async fn rebuild(
        dir: &Path,
        old: Arc<dyn Store>,
        new: Arc<dyn Store>,
        key: &MasterKey,
        epoch: u32,
        grow_to: Option<Self::Config>,
    ) -> Result<Rebuilt> {
        match grow_to {
            Some(to) => crate::rebuild::grow_tao(dir, old, new, key, epoch, to).await,
            None => crate::rebuild::rebuild_tao(dir, old, new, key, epoch).await,
        }
    }

    fn saved_blocks(dir: &Path, key: &MasterKey) -> Result<u64> {
        crate::rebuild::saved_tao_blocks(dir, key)
    }
}

/// ObliviStore and both CURIOUS variants: which one is fixed by the configuration.
#[async_trait::async_trait]
impl DurableEngine for DurableObliviStore {
    type Config = blindfold_oram::oblivistore::ObliviStoreConfig;

    fn config(params: &EngineParams) -> Result<Self::Config> {
        oblivistore_config(params)
    }

    async fn create(
        dir: &Path,
        params: &EngineParams,
        store: EngineStore<'_>,
        key: &MasterKey,
    ) -> Result<Self> {
        let (config, id) = (oblivistore_config(params)?, params.store_id()?);
        DurableObliviStore::create(dir, config, store.store, key, id, &mut |_, _| {}).await
    }

    async fn open(
        dir: &Path,
        _: &EngineParams,
        store: EngineStore<'_>,
        key: &MasterKey,
        previous: Option<&MasterKey>,
    ) -> Result<(Self, Recovery)> {
        DurableObliviStore::open_rotating(dir, store.store, key, previous).await
    }

    fn share(self) -> Arc<dyn SharedEngine> {
        Arc::new(self)
    }

    async fn rebuild(
        dir: &Path,
        old: Arc<dyn Store>,
        new: Arc<dyn Store>,
        key: &MasterKey,
        epoch: u32,
        grow_to: Option<Self::Config>,
    ) -> Result<Rebuilt> {
        match grow_to {
            Some(to) => crate::rebuild::grow_oblivistore(dir, old, new, key, epoch, to).await,
            None => crate::rebuild::rebuild_oblivistore(dir, old, new, key, epoch).await,
        }
    }

    fn saved_blocks(dir: &Path, key: &MasterKey) -> Result<u64> {
        crate::rebuild::saved_oblivistore_blocks(dir, key)
    }
}

/// The trusted component's store for the TEE engine: in the storage server for a `remote://`
/// store (`blindfold enclave`), else in this process over the store array.
async fn tee_store(
    params: &EngineParams,
    store: EngineStore<'_>,
    key: &MasterKey,
) -> Result<Arc<dyn TeeStore>> {
    let EngineStore { store, url, array, geometry, wrap_tee } = store;
    Ok(if matches!(url, StoreUrl::Remote { .. }) {
        let remote = blindfold_store::open_tee_store(url, array, geometry, None)
            .await
            .map_err(|e| ProxyError::Config(format!("opening the store {url}: {e}")))?;
        wrap_tee(remote)
    } else {
        let enclave =
            blindfold_tee::Enclave::new(&DurableTee::tee_key(key), params.block_size as usize);
        Arc::new(blindfold_store::TeeHost::new(store, Arc::new(enclave)))
    })
}

/// The TEE engine: rebuilt and grown by reading its cells in the gateway and bulk-loading a
/// fresh tree under a fresh store id ([`crate::rebuild::rebuild_tee`]). Its trusted component
/// holds one key, so a key rotation re-keys it in place when it opens
/// ([`crate::rebuild::rekey_tee`]) rather than sweeping while it serves; a trusted component in
/// another process must hold the new key's TEE key by then
/// ([`EngineParams::trusted_component_elsewhere`]).
#[async_trait::async_trait]
impl DurableEngine for DurableTee {
    type Config = blindfold_oram::tee::TeeOramConfig;

    fn config(params: &EngineParams) -> Result<Self::Config> {
        tee_config(params)
    }

    async fn create(
        dir: &Path,
        params: &EngineParams,
        store: EngineStore<'_>,
        key: &MasterKey,
    ) -> Result<Self> {
        let config = tee_config(params)?;
        let tee = tee_store(params, store, key).await?;
        let none = crate::Preload::none();
        DurableTee::create(dir, config, tee, key, params.store_id()?, none, &mut |_, _| {}).await
    }

    async fn open(
        dir: &Path,
        params: &EngineParams,
        store: EngineStore<'_>,
        key: &MasterKey,
        previous: Option<&MasterKey>,
    ) -> Result<(Self, Recovery)> {
        if let Some(old) = previous.filter(|_| !DurableTee::sealed_under(dir, key)) {
            // A key rotation that has not reached this engine yet: its state and cells are
            // under the old key. Settle it under the old key (replaying its log, with a
            // trusted component of the old key), then re-key it in place
            // ([`crate::rebuild::rekey_tee`]); a crash anywhere repeats what is left. Both run
            // in this process over the store's cells, also when the engine's trusted component
            // is elsewhere (`remote://`): this process holds both keys.
            let plain = Arc::clone(&store.store);
            let enclave =
                blindfold_tee::Enclave::new(&DurableTee::tee_key(old), params.block_size as usize);
            let host =
                Arc::new(blindfold_store::TeeHost::new(Arc::clone(&plain), Arc::new(enclave)));
            let (settled, _) = DurableTee::open(dir, host, old).await?;
            settled.shutdown().await?;
            drop(settled);
            crate::rebuild::rekey_tee(dir, Arc::clone(&plain), old, key).await?;
        }
        let tee = tee_store(params, store, key).await?;
        let (engine, recovery) = DurableTee::open(dir, tee, key).await?;
        if previous.is_some() {
            // The old key's cells the re-keying left in the spare areas go, on every open until
            // the rotation has finished (a crash after the re-keying but before this repeats it).
            engine.clear_spare_areas().await?;
        }
        Ok((engine, recovery))
    }

    fn share(self) -> Arc<dyn SharedEngine> {
        Arc::new(self)
    }

    async fn rebuild(
        dir: &Path,
        old: Arc<dyn Store>,
        new: Arc<dyn Store>,
        key: &MasterKey,
        epoch: u32,
        grow_to: Option<Self::Config>,
    ) -> Result<Rebuilt> {
        crate::rebuild::rebuild_tee(dir, old, new, key, epoch, grow_to).await
    }

    fn saved_blocks(dir: &Path, key: &MasterKey) -> Result<u64> {
        crate::rebuild::saved_tee_blocks(dir, key)
    }
}

/// Runs `$body` with `$E` the [`DurableEngine`] type of the engine `$engine`: the one place
/// that maps the engine names to their implementations.
macro_rules! with_engine {
    ($engine:expr, $E:ident => $body:expr) => {
        match $engine {
            OramEngine::Tao => {
                type $E = DurableTao;
                $body
            }
            OramEngine::PathOram => {
                type $E = DurablePathOram;
                $body
            }
            OramEngine::Tee => {
                type $E = DurableTee;
                $body
            }
            OramEngine::ObliviStore | OramEngine::Curious | OramEngine::CuriousPath => {
                type $E = DurableObliviStore;
                $body
            }
        }
    };
}

/// Opens the crash-consistent engine of `params` whose trusted state is in `dir`, over
/// `store`, replaying its redo log after an unclean stop; or, when `creating`, creates it
/// there. `previous` is the key being retired during a key rotation: cells still sealed under
/// it are opened with it (engines that cannot re-seal refuse it). Returns the engine, shared by
/// every caller, and what the recovery replayed when one ran.
pub async fn open_engine(
    params: &EngineParams,
    dir: &Path,
    store: EngineStore<'_>,
    key: &MasterKey,
    previous: Option<&MasterKey>,
    creating: bool,
) -> Result<(Arc<dyn SharedEngine>, Option<Recovery>)> {
    with_engine!(params.engine, E => {
        if creating {
            Ok((<E as DurableEngine>::create(dir, params, store, key).await?.share(), None))
        } else {
            let (engine, rec) = <E as DurableEngine>::open(dir, params, store, key, previous).await?;
            Ok((engine.share(), Some(rec)))
        }
    })
}

/// Rebuilds the engine of `params` whose checkpoint is in `dir` (a snapshot's, for `blindfold
/// recover`) from the cells of `old` into `new`, sealed under `epoch` with fresh random
/// placement ([`DurableEngine::rebuild`]).
pub async fn rebuild(
    params: &EngineParams,
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
) -> Result<Rebuilt> {
    with_engine!(params.engine, E => <E as DurableEngine>::rebuild(dir, old, new, key, epoch, None).await)
}

/// Grows the engine whose checkpoint is in `dir` (stopped cleanly) from the cells of `old` into
/// `new`, laid out for `to`, the grown parameters ([`DurableEngine::rebuild`]).
pub async fn grow(
    to: &EngineParams,
    dir: &Path,
    old: Arc<dyn Store>,
    new: Arc<dyn Store>,
    key: &MasterKey,
    epoch: u32,
) -> Result<Rebuilt> {
    with_engine!(to.engine, E => <E as DurableEngine>::rebuild(dir, old, new, key, epoch, Some(<E as DurableEngine>::config(to)?)).await)
}

/// Whether the reads of `engine` may go out ahead of its mirrored log
/// ([`DurableEngine::READS_GO_AHEAD`]).
pub fn reads_go_ahead(engine: OramEngine) -> bool {
    with_engine!(engine, E => <E as DurableEngine>::READS_GO_AHEAD)
}

/// Blocks the checkpoint of `engine` in `dir` holds ([`DurableEngine::saved_blocks`]).
pub fn saved_blocks(engine: OramEngine, dir: &Path, key: &MasterKey) -> Result<u64> {
    with_engine!(engine, E => <E as DurableEngine>::saved_blocks(dir, key))
}

/// Checks that the engine of `params` can run with them (its configuration builds).
pub fn check(params: &EngineParams) -> Result<()> {
    with_engine!(params.engine, E => <E as DurableEngine>::config(params).map(drop))
}
