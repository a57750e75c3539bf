//! Redis storage: one atomic Lua GCRA shared by every instance. (In progress.)

use gcra_core::Decision;
use redis::aio::ConnectionManager;

use crate::{BucketCheck, Storage, StorageError};

/// GCRA buckets in Redis, shared by every instance that uses the same Redis.
#[derive(Clone)]
pub struct RedisStorage {
    conn: ConnectionManager,
}

impl std::fmt::Debug for RedisStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStorage").finish_non_exhaustive()
    }
}

impl RedisStorage {
    /// A store on `conn`.
    pub fn new(conn: ConnectionManager) -> Self {
        RedisStorage { conn }
    }
}

#[async_trait::async_trait]
impl Storage for RedisStorage {
    async fn check(&self, check: &BucketCheck<'_>) -> Result<Decision, StorageError> {
        let _ = (&self.conn, check);
        Err(StorageError::Protocol("not implemented yet".into()))
    }

    fn kind(&self) -> &'static str {
        "redis"
    }
}
