//! [`MemoryLeaseRecords`]: lease records in this process's memory.

use std::collections::HashMap;

use async_trait::async_trait;
use parking_lot::Mutex;

use super::{LeaseRecords, LoadedRecord};
use crate::Result;

/// Lease records in this process's memory, behind one mutex (the compare-and-swap is a
/// comparison of bytes under the lock). For tests, and for a storage server over `memory:`.
#[derive(Debug, Default)]
pub struct MemoryLeaseRecords {
    records: Mutex<HashMap<String, Vec<u8>>>,
}

#[async_trait]
impl LeaseRecords for MemoryLeaseRecords {
    async fn load(&self, name: &str) -> Result<Option<LoadedRecord>> {
        let records = self.records.lock();
        Ok(records.get(name).map(|r| LoadedRecord { record: r.clone(), token: r.clone() }))
    }

    async fn swap(&self, name: &str, expected: Option<&[u8]>, record: &[u8]) -> Result<bool> {
        let mut records = self.records.lock();
        if records.get(name).map(Vec::as_slice) != expected {
            return Ok(false);
        }
        records.insert(name.to_string(), record.to_vec());
        Ok(true)
    }
}
