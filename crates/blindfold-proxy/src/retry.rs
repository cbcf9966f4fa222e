//! Retrying what the store may fail for a moment: requests with a retryable error are tried
//! again with a doubling backoff, and a batch of writes is retried whole (writes of sealed cells
//! are idempotent).

use std::time::Duration;

use blindfold_store::{CellId, Store, StoreError};

use crate::Result;

/// How often a retryable storage error is retried before the access fails.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryPolicy {
    pub attempts: u32,
    pub first_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { attempts: 4, first_backoff: Duration::from_millis(5) }
    }
}

pub(crate) async fn with_retry<T, F, Fut>(policy: RetryPolicy, mut f: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut backoff = policy.first_backoff;
    let mut attempt = 1;
    loop {
        match f().await {
            Err(e) if e.is_retryable() && attempt < policy.attempts => {
                tracing::debug!(attempt, error = %e, "retrying storage request");
                tokio::time::sleep(backoff).await;
                backoff *= 2;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// Writes sealed cells, retrying a failed batch whole (writes are idempotent).
pub(crate) async fn write_sealed(
    store: &dyn Store,
    retry: RetryPolicy,
    sealed: Vec<(CellId, Vec<u8>)>,
) -> Result<()> {
    if sealed.is_empty() {
        return Ok(());
    }
    if !store.writes_may_be_retried() {
        // Nothing to keep for a retry: the buffers go to the store as they are.
        return Ok(store.write(sealed).await?);
    }
    match store.write(sealed.clone()).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_retryable() => {
            tracing::debug!(error = %e, "retrying storage write");
            Ok(with_retry(retry, || store.write(sealed.clone())).await?)
        }
        Err(e) => Err(e.into()),
    }
}
