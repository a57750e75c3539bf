//! [`Storage::reset`](crate::Storage::reset) in memory: every bucket of the
//! set back to full at once, under the windows' map and then the write
//! locks of the table's shards (in shard order), the order every decision
//! takes them in: no decision is halfway through any of them meanwhile. A
//! rate's or a period's word is cleared (its entry kept: a fresh bucket),
//! a window forgotten.

use smallvec::SmallVec;

use super::table::NO_TAT;
use super::{Inner, MemoryStorage, write};
use crate::bucket::BucketCheck;
use crate::rule::Rule;
use crate::storage::StorageError;
use crate::sync::Ordering;

impl MemoryStorage {
    /// The same as [`Storage::reset`](crate::Storage::reset),
    /// synchronously.
    ///
    /// ```
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage, Quota, Window};
    /// use std::time::Duration;
    /// let store = MemoryStorage::new();
    /// let (pro, login) = (LimitName::new("pro")?, LimitName::of_limit("login")?);
    /// let window = Window::new(1, Duration::from_secs(60))?;
    /// let checks = [
    ///     BucketCheck::new(&pro, "key_ada", Quota::per_minute(1), 1)?,
    ///     BucketCheck::of_rule(&login, "key_ada", window.into(), 1)?,
    /// ];
    /// let mut out = [Decision::default(); 2];
    /// assert!(store.check_sync(&checks, &mut out)?.verdict.allowed);
    /// assert!(!store.check_sync(&checks, &mut out)?.verdict.allowed);
    /// store.reset_sync(&checks)?;
    /// assert!(store.check_sync(&checks, &mut out)?.verdict.allowed);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reset_sync(
        &self,
        buckets: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.inner.reset(buckets);
        Ok(())
    }
}

impl Inner {
    fn reset(&self, buckets: &[BucketCheck<'_>]) {
        let mut rates: SmallVec<[(u64, usize); 4]> = SmallVec::new();
        let mut others: SmallVec<[u64; 4]> = SmallVec::new();
        for bucket in buckets {
            let (name, shard) = self.name(bucket);
            match bucket.rule() {
                Rule::Rate(_) | Rule::Period(_) => rates.push((name, shard)),
                // A concurrency limit's slots belong to requests that
                // still run.
                Rule::Concurrency(_) => {}
                _ => others.push(name),
            }
        }
        let mut shards: SmallVec<[usize; 4]> =
            rates.iter().map(|&(_, shard)| shard).collect();
        shards.sort_unstable();
        shards.dedup();
        self.forget_with(&others, || {
            let guards: SmallVec<[_; 4]> = shards
                .iter()
                .map(|&shard| write(&self.shards[shard].table))
                .collect();
            for &(name, shard) in &rates {
                let at = shards.partition_point(|&s| s < shard);
                if let Some(entry) = guards.get(at).and_then(|t| t.find(name)) {
                    // No lock bit is held under a write lock.
                    entry.tat.store(NO_TAT, Ordering::Release);
                }
            }
        });
    }
}
