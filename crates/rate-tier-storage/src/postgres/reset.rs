//! [`Storage::reset`](crate::Storage::reset) on PostgreSQL: the buckets'
//! rows deleted in one transaction that first takes their advisory locks,
//! in the order every decision takes them, so no decision in flight writes
//! back what it read before the reset.

use super::{Inner, PostgresStorage};
use crate::bucket::BucketCheck;
use crate::key::KeyLayout;
use crate::rule::Rule;
use crate::storage::StorageError;

impl PostgresStorage {
    pub(super) async fn reset_buckets(
        &self,
        buckets: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        // A concurrency limit's slots belong to requests that still run.
        let keys: Vec<String> = buckets
            .iter()
            .filter(|bucket| !matches!(bucket.rule(), Rule::Concurrency(_)))
            .map(|bucket| bucket.key(KeyLayout::Single))
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        let inner = &*self.inner;
        let timeout = inner.timeout;
        match tokio::time::timeout(timeout, delete(inner, &keys)).await {
            Ok(result) => result,
            Err(_) => Err(StorageError::Timeout(timeout)),
        }
    }
}

async fn delete(inner: &Inner, keys: &[String]) -> Result<(), StorageError> {
    let table = &inner.schema.table;
    let mut client = inner.client().await?;
    let transaction = client.transaction().await.map_err(|e| inner.error(e))?;
    transaction
        .execute(&format!("SELECT {table}_locked($1)"), &[&keys])
        .await
        .map_err(|e| inner.error(e))?;
    transaction
        .execute(
            &format!("DELETE FROM {table} WHERE key = ANY($1)"),
            &[&keys],
        )
        .await
        .map_err(|e| inner.error(e))?;
    transaction.commit().await.map_err(|e| inner.error(e))
}
