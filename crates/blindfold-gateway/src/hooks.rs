//! What benchmarks and tests may change when they open a data directory ([`OpenHooks`]): the
//! block engine, a wrapper around the store, an engine opened elsewhere.

use std::sync::Arc;

/// Which engine stores the object layer's blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EngineKind {
    /// The data directory's crash-consistent ORAM engine ([`OramEngine`]): what the gateway
    /// always uses.
    #[default]
    PathOram,
    /// **Benchmark baseline only**: blocks sealed at fixed cells with no ORAM and no crash
    /// consistency ([`DirectEngine`]), in the store array `direct`. Needs a fresh data
    /// directory, and the directory cannot be reopened afterwards.
    DirectBaseline,
}

/// Wraps the opened untrusted store, e.g. in a [`blindfold_store::CountingStore`].
pub type StoreWrapper =
    Box<dyn Fn(Arc<dyn blindfold_store::Store>) -> Arc<dyn blindfold_store::Store> + Send + Sync>;

pub use blindfold_proxy::engine::EngineFactory;

/// Extras for [`open_with`], used by benchmarks and tests; [`open`] uses the defaults.
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
