//! [`Store`]: the store a limiter holds, its in-process fast path behind
//! the contract.

use std::sync::Arc;

use gcra_core::Decision;

use crate::bucket::{BucketCancel, BucketCheck, BucketSettle};
use crate::event::{StorageListener, Subscription};
use crate::memory::MemoryStorage;
use crate::storage::{Decided, Storage, StorageError};

/// A store, as a limiter holds it: the memory store by value, so that its
/// decision is inlined into the caller (no virtual call, nothing boxed), or
/// any other [`Storage`] through its trait object. Every method is the
/// [`Storage`] contract's.
///
/// ```
/// use std::sync::Arc;
/// use rate_tier_storage::{BucketCheck, LimitName, MemoryStorage, Store};
/// use gcra_core::{Decision, Quota};
///
/// let store = Store::from(MemoryStorage::new());
/// let free = LimitName::new("free")?;
/// let check = [BucketCheck::new(&free, "ana", Quota::per_minute(10), 1)?];
/// let mut out = [Decision::default()];
/// let decided = store.check_local(&check, &mut out).expect("in process")?;
/// assert!(decided.verdict.allowed);
/// assert_eq!(store.kind(), "memory");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub enum Store {
    /// The in-process store.
    Memory(MemoryStorage),
    /// Any other.
    Other(Arc<dyn Storage>),
}

impl From<MemoryStorage> for Store {
    fn from(memory: MemoryStorage) -> Self {
        Store::Memory(memory)
    }
}

impl From<Arc<dyn Storage>> for Store {
    fn from(storage: Arc<dyn Storage>) -> Self {
        Store::Other(storage)
    }
}

impl Store {
    /// [`Storage::check_local`]: the memory store's decision inlined.
    #[inline(always)]
    pub fn check_local(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Option<Result<Decided, StorageError>> {
        match self {
            Store::Memory(memory) => Some(memory.check_sync(checks, out)),
            Store::Other(storage) => storage.check_local(checks, out),
        }
    }

    /// [`Storage::check`].
    pub async fn check(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        match self {
            Store::Memory(memory) => memory.check_sync(checks, out),
            Store::Other(storage) => storage.check(checks, out).await,
        }
    }

    /// [`Storage::settle_local`].
    pub fn settle_local(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Option<Result<(), StorageError>> {
        match self {
            Store::Memory(memory) => Some(memory.settle_sync(settles)),
            Store::Other(storage) => storage.settle_local(settles),
        }
    }

    /// [`Storage::settle`].
    pub async fn settle(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        match self {
            Store::Memory(memory) => memory.settle_sync(settles),
            Store::Other(storage) => storage.settle(settles).await,
        }
    }

    /// [`Storage::kind`].
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Other(storage) => storage.kind(),
        }
    }

    /// [`Storage::release_local`].
    pub fn release_local(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Option<Result<(), StorageError>> {
        match self {
            Store::Memory(memory) => memory.release_local(slots),
            Store::Other(storage) => storage.release_local(slots),
        }
    }

    /// [`Storage::release`].
    pub async fn release(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        match self {
            Store::Memory(memory) => memory.release(slots).await,
            Store::Other(storage) => storage.release(slots).await,
        }
    }

    /// [`Storage::lease`].
    pub fn lease(&self) -> Option<std::time::Duration> {
        match self {
            Store::Memory(_) => None,
            Store::Other(storage) => storage.lease(),
        }
    }

    /// [`Storage::renew`].
    pub async fn renew(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::Other(storage) => storage.renew(slots).await,
        }
    }

    /// [`Storage::reserve`], without I/O for the memory store.
    pub async fn reserve(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: std::time::Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        match self {
            Store::Memory(memory) => memory.reserve_sync(checks, max_wait, out),
            Store::Other(storage) => {
                match storage.reserve_local(checks, max_wait, out) {
                    Some(decided) => decided,
                    None => storage.reserve(checks, max_wait, out).await,
                }
            }
        }
    }

    /// [`Storage::cancel_local`]: `None` when the store needs I/O.
    pub fn cancel_local(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Option<Result<(), StorageError>> {
        match self {
            Store::Memory(memory) => Some(memory.cancel_sync(reserved)),
            Store::Other(storage) => storage.cancel_local(reserved),
        }
    }

    /// [`Storage::cancel`].
    pub async fn cancel(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Result<(), StorageError> {
        match self {
            Store::Memory(memory) => memory.cancel_sync(reserved),
            Store::Other(storage) => storage.cancel(reserved).await,
        }
    }

    /// [`Storage::reset`], without I/O for the memory store.
    pub async fn reset(
        &self,
        buckets: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        match self {
            Store::Memory(memory) => memory.reset_sync(buckets),
            Store::Other(storage) => storage.reset(buckets).await,
        }
    }

    /// [`Storage::reserves`].
    pub fn reserves(&self) -> bool {
        match self {
            Store::Memory(_) => true,
            Store::Other(storage) => storage.reserves(),
        }
    }

    /// [`Storage::supports`].
    pub fn supports(&self, kind: crate::RuleKind) -> bool {
        match self {
            Store::Memory(memory) => memory.supports(kind),
            Store::Other(storage) => storage.supports(kind),
        }
    }

    /// [`Storage::spans_partitions`].
    pub fn spans_partitions(&self) -> bool {
        match self {
            Store::Memory(memory) => memory.spans_partitions(),
            Store::Other(storage) => storage.spans_partitions(),
        }
    }

    /// [`Storage::subscribe`].
    pub fn subscribe(&self, listener: StorageListener) -> Subscription {
        match self {
            Store::Memory(memory) => Storage::subscribe(memory, listener),
            Store::Other(storage) => storage.subscribe(listener),
        }
    }

    /// The store as a trait object.
    pub fn as_storage(&self) -> Arc<dyn Storage> {
        match self {
            Store::Memory(memory) => Arc::new(memory.clone()),
            Store::Other(storage) => storage.clone(),
        }
    }
}
