//! Starting and serving a gateway, for callers outside this crate: one place that names what
//! the modules below provide.
//!
//! - [`crate::params`]: the operator's choices and the parameters of a new data directory;
//! - [`crate::datadir`]: the data directory's files;
//! - [`crate::keys`]: its key check, keys and credentials;
//! - [`crate::hooks`]: what benchmarks and tests may change when they open one;
//! - [`crate::open`]: opening or creating it;
//! - [`crate::http`]: serving it over HTTP and HTTPS;
//! - [`crate::recovery`]: rebuilding it from the store's snapshot.
//!
//! The engines and their parameters are `blindfold_proxy::catalogue`'s.

pub use blindfold_proxy::catalogue::{
    cache_levels_for, cached_bytes, cached_bytes_of, default_cache_mib, engine_cells,
    oblivistore_cells, oblivistore_config, oram_array, oram_config, oram_geometry, physical_view,
    tao_config, tao_pinned_for, tee_config, OramEngine, CURIOUS_B, CURIOUS_Z, DEFAULT_CACHE_MIB,
    PARAMS_VERSION, PATH_ORAM_CACHE_MIB, S3_CACHE_MIB, TAO_WRITE_BACK_EVERY,
};

pub use crate::datadir::{read_params, GatewayParams};
pub use crate::hooks::{
    EngineFactory, EngineKind, EngineRebuild, OpenHooks, RebuiltElsewhere, RecoverHooks,
    StateCheck, StoreWrapper,
};
pub use crate::http::{refusal, run, run_tls, s3_operation, service, UNSIZED_BODY_LIMIT};
pub use crate::keys::{data_dir_keys, KEY_CHECK_FILE};
pub use crate::open::{open, open_with, Opened};
pub use crate::params::{
    footprint, human_bytes, new_params, parse_size, Durability, Footprint, ServeConfig,
};
pub use crate::recovery::{
    recover, recover_until, recover_until_with, recover_with, write_snapshot, RecoverCrash,
};
