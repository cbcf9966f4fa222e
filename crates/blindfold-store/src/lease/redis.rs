//! Lease records as Redis keys, replaced by a compare-and-set Lua script.

use std::fmt;

use ::redis::aio::ConnectionManager;
use async_trait::async_trait;

use super::{LeaseRecords, LoadedRecord, MAX_LEASE_RECORD};
use crate::redis::{connect_pool, map_error};
use crate::{RedisAddress, RedisOptions, Result, StoreError};

/// Sets `KEYS[1]` to `ARGV[3]` if it holds `ARGV[2]` (`ARGV[1] == "1"`) or does not exist
/// (`ARGV[1] == "0"`); answers 1 if it did, 0 if not. Redis runs a script atomically, so no
/// other command comes between the comparison and the write.
const SWAP: &str = r#"
local current = redis.call('GET', KEYS[1])
if ARGV[1] == '0' then
  if current then return 0 end
elseif (not current) or current ~= ARGV[2] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3])
return 1
"#;

/// The record of `name` is the key `<prefix>:.lease:<name>`, without expiry (expiry lives in
/// the record, so the generation outlives it). The token is the value itself; a swap is one
/// `EVAL` of a compare-and-set script.
pub(crate) struct RedisLeaseRecords {
    connection: ConnectionManager,
    /// `<prefix>:.lease:`
    keys: String,
    label: String,
    endpoint: String,
}

impl fmt::Debug for RedisLeaseRecords {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLeaseRecords").field("store", &self.label).finish()
    }
}

impl RedisLeaseRecords {
    pub(crate) async fn open(address: &RedisAddress, options: &RedisOptions) -> Result<Self> {
        let endpoint = format!("{}:{}", address.host, address.port);
        let keys = format!("{}:.lease:", options.prefix);
        let label = format!("redis://{endpoint}/{} (keys {keys}…)", address.db);
        let one = RedisOptions { pool: 1, ..options.clone() };
        let mut pool = connect_pool(address, &one, &label, &endpoint).await?;
        let connection = pool.pop().ok_or_else(|| {
            StoreError::InvalidConfig(format!("{label}: no connection could be made"))
        })?;
        Ok(Self { connection, keys, label, endpoint })
    }
}

#[async_trait]
impl LeaseRecords for RedisLeaseRecords {
    async fn load(&self, name: &str) -> Result<Option<LoadedRecord>> {
        let mut con = self.connection.clone();
        let value: Option<Vec<u8>> = ::redis::cmd("GET")
            .arg(format!("{}{name}", self.keys))
            .query_async(&mut con)
            .await
            .map_err(|e| map_error(&self.label, &self.endpoint, "reading a lease record", e))?;
        match value {
            Some(v) if v.len() > MAX_LEASE_RECORD => Err(StoreError::NotAStore {
                path: format!("{} key {}{name}", self.label, self.keys).into(),
                reason: format!("a lease record of {} bytes", v.len()),
            }),
            Some(v) => Ok(Some(LoadedRecord { token: v.clone(), record: v })),
            None => Ok(None),
        }
    }

    async fn swap(&self, name: &str, expected: Option<&[u8]>, record: &[u8]) -> Result<bool> {
        let mut con = self.connection.clone();
        let swapped: i64 = ::redis::cmd("EVAL")
            .arg(SWAP)
            .arg(1)
            .arg(format!("{}{name}", self.keys))
            .arg(if expected.is_some() { "1" } else { "0" })
            .arg(expected.unwrap_or_default())
            .arg(record)
            .query_async(&mut con)
            .await
            .map_err(|e| map_error(&self.label, &self.endpoint, "replacing a lease record", e))?;
        Ok(swapped == 1)
    }
}
