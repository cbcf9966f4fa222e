//! The tokio runtimes the asynchronous commands run on.

use std::future::Future;

use anyhow::Result;

/// Runs `task` to its end on a runtime with a worker thread per core.
pub fn on_all_cores(task: impl Future<Output = Result<()>>) -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(task)
}

/// Runs `task` to its end on this thread alone.
pub fn on_one_core(task: impl Future<Output = Result<()>>) -> Result<()> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(task)
}
