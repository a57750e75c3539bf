//! Every kind of limit over a store that can only read and compare-and-swap
//! small values: [`Cells`], and [`CellStorage`], which runs gcra-core's
//! rules itself over them.
//!
//! A store that offers a read of several keys and a write of several keys
//! made only if none changed since the read (a transaction with conditions:
//! DynamoDB's `TransactWriteItems`, etcd's `Txn`, an SQL `UPDATE ... WHERE
//! version = $read`) implements [`Cells`], two methods, and
//! [`CellStorage`] gives it rates, windows, periods and concurrency limits,
//! with reservations, settlements, releases, renewals and resets. A
//! decision is one round of reads, gcra-core, and one conditional write of
//! every cell it read: a lost race is decided again from a new read, at
//! most [`CellStorageBuilder::attempts`] times, then [`StorageError::Contended`].
//!
//! ```
//! use rate_tier_storage::{BucketCheck, Decision, LimitName, Quota, Storage, StorageExt};
//! use rate_tier_storage::cells::{CellStorage, MemoryCells};
//! use rate_tier_storage::clock::FakeClock;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = CellStorage::with_clock(MemoryCells::new(), FakeClock::new());
//! let free = LimitName::new("free")?;
//! let check = [BucketCheck::new(&free, "ana", Quota::per_minute(2), 1)?];
//! let mut out = [Decision::default()];
//! assert!(store.check(&check, &mut out).await?.verdict.allowed);
//! assert!(store.check(&check, &mut out).await?.verdict.allowed);
//! let third = store.check(&check, &mut out).await?;
//! assert_eq!((third.verdict.allowed, third.verdict.retry_after_us), (false, 30_000_000));
//! # Ok(()) }
//! ```
//!
//! A cell is keyed as the shared stores key a bucket
//! ([`BucketCheck::key`](crate::BucketCheck::key), the single-node layout: `trt:<limit>:<hash of the
//! partition>`, never the partition in clear), and holds one kind's state
//! behind a tag byte, documented in `cells/codec.rs`: 9 bytes for a rate,
//! 13 for a period, 8 per entry for a window's log, 20 per holder for a
//! concurrency limit. A value that is not the state of the rule reading it
//! (corrupted, or another kind's after a reload changed the kind) is read
//! as a fresh bucket and replaced by the next write; never a panic.

mod cell_storage;
mod codec;
mod judge;
mod memory;

use std::fmt;
use std::sync::Arc;

pub use self::cell_storage::{CellStorage, CellStorageBuilder};
pub use self::memory::MemoryCells;
use crate::storage::StorageError;

/// A cell as read: its bytes and its version.
///
/// ```
/// use rate_tier_storage::cells::Snapshot;
/// let read = Snapshot::new(vec![1, 2], 7);
/// assert_eq!((read.value.len(), read.version), (2, 7));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The bytes.
    pub value: Vec<u8>,
    /// Opaque to [`CellStorage`]: handed back in [`CellWrite::expected`],
    /// the store's to compare. It must change whenever the value does
    /// (a counter, a revision, a timestamp of the write).
    pub version: u64,
}

impl Snapshot {
    /// A cell holding `value` at `version`.
    pub fn new(value: Vec<u8>, version: u64) -> Snapshot {
        Snapshot { value, version }
    }
}

/// What a write does to one cell.
///
/// ```
/// use rate_tier_storage::cells::Change;
/// let put = Change::Put { value: vec![1], ttl_ms: 60_000 };
/// assert_ne!(put, Change::Delete);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Nothing: only the condition on the cell holds the write.
    Keep,
    /// Store these bytes. After `ttl_ms` the value describes a bucket as
    /// fresh as an absent one: a store with expiry (Redis's `PEXPIRE`,
    /// DynamoDB's TTL attribute) may drop it then, and one without may
    /// ignore it.
    Put {
        /// The new bytes.
        value: Vec<u8>,
        /// How long they are worth keeping, in ms.
        ttl_ms: u64,
    },
    /// Remove the cell: the bucket is fresh.
    Delete,
}

/// One cell of a conditional write ([`Cells::write_if`]).
///
/// ```
/// use rate_tier_storage::cells::{CellWrite, Change};
/// // Create the cell, if nobody did since it was read as absent.
/// let create = CellWrite {
///     key: "trt:free:ab12",
///     expected: None,
///     change: Change::Put { value: vec![1, 0, 0, 0, 0, 0, 0, 0, 0], ttl_ms: 6_000 },
/// };
/// assert_eq!(create.expected, None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CellWrite<'a> {
    /// The cell's key.
    pub key: &'a str,
    /// The version it was read at ([`Snapshot::version`]); `None`: it was
    /// read as absent, and must still be.
    pub expected: Option<u64>,
    /// What to do with it.
    pub change: Change,
}

/// A store of small values under keys that can be read and
/// compare-and-swapped, several at once: all [`CellStorage`] needs to
/// decide every kind of limit.
///
/// Two methods are required; [`Cells::kind`] names the store. See
/// [`MemoryCells`] for a reference implementation and how a store such as
/// DynamoDB maps onto it.
///
/// ```
/// use std::sync::Arc;
/// use rate_tier_storage::cells::{Cells, MemoryCells};
/// // Shared between stores, or behind a trait object.
/// let cells: Arc<dyn Cells> = Arc::new(MemoryCells::new());
/// assert_eq!(cells.kind(), "memory-cells");
/// ```
#[async_trait::async_trait]
pub trait Cells: Send + Sync + fmt::Debug + 'static {
    /// The cells under `keys`, in their order: `None` for a key that holds
    /// none. Each cell as it was at some instant of the call (the keys need
    /// not be read at one instant: the write checks them all).
    async fn read(
        &self,
        keys: &[String],
    ) -> Result<Vec<Option<Snapshot>>, StorageError>;

    /// Applies every write only if every cell of `writes` is still at its
    /// [`CellWrite::expected`] version (absent, for `None`), atomically:
    /// all of them, or none. `Ok(false)` when a condition failed (nothing
    /// was written); an error when the store failed (nothing must be
    /// written either, or the error must say the store cannot tell).
    async fn write_if(
        &self,
        writes: &[CellWrite<'_>],
    ) -> Result<bool, StorageError>;

    /// A short label for metrics and logs ([`Capabilities::label`](crate::Capabilities::label) of a
    /// [`CellStorage`] over it).
    fn kind(&self) -> &'static str {
        "cells"
    }
}

#[async_trait::async_trait]
impl<C: Cells + ?Sized> Cells for Arc<C> {
    async fn read(
        &self,
        keys: &[String],
    ) -> Result<Vec<Option<Snapshot>>, StorageError> {
        (**self).read(keys).await
    }

    async fn write_if(
        &self,
        writes: &[CellWrite<'_>],
    ) -> Result<bool, StorageError> {
        (**self).write_if(writes).await
    }

    fn kind(&self) -> &'static str {
        (**self).kind()
    }
}
