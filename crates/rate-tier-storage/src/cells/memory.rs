//! [`MemoryCells`]: the reference [`Cells`], a map behind a mutex.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::{CellWrite, Cells, Change, Snapshot};
use crate::storage::StorageError;

/// An in-process [`Cells`]: every cell and its version in one map behind
/// one mutex. The reference a new store is tested against, and a store for
/// tests; it keeps a cell until it is overwritten or deleted (it ignores
/// [`Change::Put`]'s `ttl_ms`).
///
/// Versions come from one counter that only grows, so a cell deleted and
/// made again never comes back with a version a slow writer still holds.
///
/// # Writing a store of your own
///
/// A store needs a read of several keys and a conditional write of several
/// keys, all or nothing. On DynamoDB, `read` is a `BatchGetItem` (strongly
/// consistent) of items `{ key, value, version }`, and `write_if` one
/// `TransactWriteItems`: a `Put` with `ConditionExpression`
/// `version = :read` (or `attribute_not_exists(key)` for a cell read as
/// absent) and `version = :read + 1`, a `Delete` with the same condition,
/// a `ConditionCheck` for [`Change::Keep`]; a `TransactionCanceledException`
/// for a failed condition is `Ok(false)`, anything else an error. The shape
/// of it, here over a map:
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
/// use rate_tier_storage::StorageError;
/// use rate_tier_storage::cells::{CellStorage, CellWrite, Cells, Change, Snapshot};
///
/// #[derive(Debug, Default)]
/// struct Table(Mutex<HashMap<String, (Vec<u8>, u64)>>);
///
/// #[async_trait::async_trait]
/// impl Cells for Table {
///     async fn read(&self, keys: &[String]) -> Result<Vec<Option<Snapshot>>, StorageError> {
///         let items = self.0.lock().unwrap();
///         Ok(keys
///             .iter()
///             .map(|key| items.get(key).map(|(value, version)| Snapshot::new(value.clone(), *version)))
///             .collect())
///     }
///
///     async fn write_if(&self, writes: &[CellWrite<'_>]) -> Result<bool, StorageError> {
///         let mut items = self.0.lock().unwrap();
///         // The conditions, every one before any write.
///         if writes.iter().any(|w| items.get(w.key).map(|item| item.1) != w.expected) {
///             return Ok(false);
///         }
///         for write in writes {
///             let version = write.expected.map_or(1, |v| v + 1);
///             match &write.change {
///                 Change::Keep => {}
///                 Change::Put { value, .. } => {
///                     items.insert(write.key.to_owned(), (value.clone(), version));
///                 }
///                 Change::Delete => {
///                     items.remove(write.key);
///                 }
///             }
///         }
///         Ok(true)
///     }
/// }
///
/// // Every kind of limit now runs on it.
/// let store = CellStorage::new(Table::default());
/// # let _ = store;
/// ```
///
/// (A version counted per key, as above, can come back after a delete:
/// a writer that read the first life of a cell could then overwrite its
/// second. Stores that keep no version, or reuse them, should count them
/// from somewhere that only grows, as [`MemoryCells`] does, or never
/// delete: put an empty value instead, which every kind reads as absent.)
///
/// ```
/// use rate_tier_storage::cells::{CellWrite, Cells, Change, MemoryCells};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cells = MemoryCells::new();
/// let keys = ["k".to_owned()];
/// assert_eq!(cells.read(&keys).await?, [None]);
/// let put = Change::Put { value: vec![1], ttl_ms: 0 };
/// assert!(cells.write_if(&[CellWrite { key: "k", expected: None, change: put.clone() }]).await?);
/// // A create-if-absent of a cell that now exists loses.
/// assert!(!cells.write_if(&[CellWrite { key: "k", expected: None, change: put }]).await?);
/// assert_eq!(cells.read(&keys).await?[0].as_ref().map(|s| s.value.clone()), Some(vec![1]));
/// # Ok(()) }
/// ```
#[derive(Debug, Default)]
pub struct MemoryCells {
    inner: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    cells: HashMap<String, Snapshot>,
    versions: u64,
}

impl MemoryCells {
    /// An empty map.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many cells it holds.
    ///
    /// ```
    /// assert_eq!(rate_tier_storage::cells::MemoryCells::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.lock().cells.len()
    }

    /// Whether it holds no cell.
    ///
    /// ```
    /// assert!(rate_tier_storage::cells::MemoryCells::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // Every write below is made whole or not at all under the lock.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait::async_trait]
impl Cells for MemoryCells {
    async fn read(
        &self,
        keys: &[String],
    ) -> Result<Vec<Option<Snapshot>>, StorageError> {
        let held = self.lock();
        Ok(keys
            .iter()
            .map(|key| held.cells.get(key).cloned())
            .collect())
    }

    async fn write_if(
        &self,
        writes: &[CellWrite<'_>],
    ) -> Result<bool, StorageError> {
        let mut held = self.lock();
        let current = |held: &Held, key: &str| {
            held.cells.get(key).map(|snapshot| snapshot.version)
        };
        if writes.iter().any(|w| current(&held, w.key) != w.expected) {
            return Ok(false);
        }
        for write in writes {
            match &write.change {
                Change::Keep => {}
                Change::Put { value, .. } => {
                    held.versions = held.versions.wrapping_add(1);
                    let snapshot = Snapshot::new(value.clone(), held.versions);
                    held.cells.insert(write.key.to_owned(), snapshot);
                }
                Change::Delete => {
                    held.cells.remove(write.key);
                }
            }
        }
        Ok(true)
    }

    fn kind(&self) -> &'static str {
        "memory-cells"
    }
}
