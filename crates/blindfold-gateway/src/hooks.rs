//! What benchmarks and tests may change when they open a data directory ([`OpenHooks`]): the
//! block engine, a wrapper around the store, an engine opened elsewhere.

use std::sync::Arc;

/// Which engine stores the object layer's blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// The data directory's crash-consistent ORAM engine ([`blindfold_proxy::catalogue::OramEngine`]): what the gateway
    /// always uses.
    #[default]
    PathOram,
    /// **Benchmark baseline only**: blocks sealed at fixed cells with no ORAM and no crash
    /// consistency ([`blindfold_proxy::engine::DirectEngine`]), in the store array `direct`. Needs a fresh data
    /// directory, and the directory cannot be reopened afterwards.
    DirectBaseline,
}

/// Wraps the opened untrusted store, e.g. in a [`blindfold_store::CountingStore`].
pub type StoreWrapper =
    Box<dyn Fn(Arc<dyn blindfold_store::Store>) -> Arc<dyn blindfold_store::Store> + Send + Sync>;

pub use blindfold_proxy::engine::EngineFactory;

/// Extras for [`crate::open::open_with`], used by benchmarks and tests; [`crate::open::open`]
/// uses the defaults.
#[derive(Default)]
pub struct OpenHooks {
    /// The block engine.
    pub engine: EngineKind,
    /// Applied to the engine's store right after it is opened.
    pub wrap_store: Option<StoreWrapper>,
    /// Opens the engine instead of the data directory's own ([`EngineFactory`]).
    pub engine_factory: Option<EngineFactory>,
}

impl std::fmt::Debug for OpenHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenHooks")
            .field("engine", &self.engine)
            .field("wrap_store", &self.wrap_store.is_some())
            .field("engine_factory", &self.engine_factory.is_some())
            .finish()
    }
}

/// What rebuilding an engine kept outside the store ([`EngineRebuild`]) found.
#[derive(Clone, Debug, Default)]
pub struct RebuiltElsewhere {
    /// Blocks brought back.
    pub blocks_found: u64,
    /// Blocks written before the snapshot whose data is gone: the objects holding one are
    /// dropped from the directory and named.
    pub lost: Vec<u64>,
    /// One line for the operator: what was read and written, and why blocks were lost.
    pub summary: String,
}

/// Rebuilds the state directory of an engine whose blocks live outside the gateway's store
/// (ORAM nodes) from a snapshot's engine checkpoint: called with the engine's state directory
/// (`<data-dir>/oram`, which it owns: a run cut short leaves there what the next run needs),
/// the checkpoint file bytes and the key.
pub type EngineRebuild = Box<
    dyn FnOnce(
            std::path::PathBuf,
            Vec<u8>,
            Arc<blindfold_crypto::MasterKey>,
        )
            -> futures::future::BoxFuture<'static, blindfold_proxy::Result<RebuiltElsewhere>>
        + Send,
>;

/// Looks at a snapshot's engine checkpoint before `recover` writes anything; an error says
/// why this `recover` cannot restore it (e.g. the snapshot is of a gateway over ORAM nodes
/// and no [`RecoverHooks::rebuild`] was given).
pub type StateCheck = Box<dyn Fn(&[u8]) -> std::result::Result<(), String> + Send + Sync>;

/// Extras for [`crate::recovery::recover_with`]; [`crate::recovery::recover`] uses none.
#[derive(Default)]
pub struct RecoverHooks {
    /// Rebuilds the engine's state from the snapshot instead of the store-array rebuild.
    pub rebuild: Option<EngineRebuild>,
    /// Opens the rebuilt engine (the same factory `serve` uses for this data directory).
    pub engine_factory: Option<EngineFactory>,
    /// Checked on the snapshot's engine checkpoint before anything is written.
    pub check_state: Option<StateCheck>,
    /// A standby's copy of the log's tail that the store may lack ([`crate::feed`]): a
    /// takeover continues the store's log with it.
    pub tail: Option<crate::feed::Tail>,
}

impl std::fmt::Debug for RecoverHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecoverHooks")
            .field("rebuild", &self.rebuild.is_some())
            .field("engine_factory", &self.engine_factory.is_some())
            .field("check_state", &self.check_state.is_some())
            .field("tail", &self.tail.as_ref().map(|t| t.entries.len()))
            .finish()
    }
}
