//! The slots of concurrency limits taken by the local store, so that each
//! goes back to the store that took it.
//!
//! A slot taken on the primary is released there (by its lease id: a
//! release of an id the primary does not hold changes nothing). A slot
//! taken locally, during an outage, is remembered here by its lease id and
//! bucket, and released locally: sent to the primary it would stay taken
//! in memory, and a local release of a slot the local store never took
//! would free another request's. A local slot is forgotten when it is
//! released, so a second release of it goes to the primary, where (on
//! Redis and PostgreSQL, which release by id) it changes nothing.
//!
//! The local store does not expire slots, so the local ones are not
//! renewed; the primary's are, through the primary.

use std::collections::HashSet;
use std::sync::PoisonError;

use gcra_core::Decision;
use smallvec::SmallVec;

use super::Inner;
use crate::bucket::BucketCheck;
use crate::rule::Rule;
use crate::storage::StorageError;

/// A slot taken locally: its lease id and the local store's bucket.
pub(super) type LocalSlot = (u64, u64);

/// The local slots held, by lease id and bucket.
pub(super) type LocalSlots = HashSet<LocalSlot>;

fn takes_slot(check: &BucketCheck<'_>) -> bool {
    matches!(check.rule(), Rule::Concurrency(_)) && check.cost() > 0
}

impl Inner {
    fn local_slot(&self, check: &BucketCheck<'_>) -> LocalSlot {
        (check.lease(), self.local.bucket_id(check))
    }

    /// Refuses a local decision that would take a slot without a lease
    /// id: nothing could tell its release from another request's.
    pub(super) fn slots_have_ids(
        checks: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        if checks.iter().any(|c| takes_slot(c) && c.lease() == 0) {
            return Err(StorageError::Unsupported(
                "a concurrency slot without a lease id behind a fallback",
            ));
        }
        Ok(())
    }

    /// Remembers the slots a passed local decision took.
    pub(super) fn took_locally(
        &self,
        checks: &[BucketCheck<'_>],
        out: &[Decision],
    ) {
        let mut taken = checks
            .iter()
            .zip(out)
            .filter(|(check, decision)| takes_slot(check) && decision.allowed)
            .map(|(check, _)| self.local_slot(check))
            .peekable();
        if taken.peek().is_some() {
            self.slots().extend(taken);
        }
    }

    /// Gives back, in the local store, the slots `checks` took there and
    /// forgets them; returns the checks that hold none here (the
    /// primary's).
    pub(super) fn release_here<'c>(
        &self,
        checks: &[BucketCheck<'c>],
    ) -> Result<SmallVec<[BucketCheck<'c>; 2]>, StorageError> {
        let mut here: SmallVec<[BucketCheck<'c>; 2]> = SmallVec::new();
        let mut there = SmallVec::new();
        {
            let mut slots = self.slots();
            for check in checks {
                if slots.is_empty() || !slots.remove(&self.local_slot(check)) {
                    there.push(*check);
                } else {
                    here.push(
                        check.with_rule(check.rule().divided(self.local_share)),
                    );
                }
            }
        }
        if !here.is_empty() {
            self.local.release_sync(&here)?;
        }
        Ok(there)
    }

    /// The checks of `checks` whose slots are not local.
    pub(super) fn not_here<'c>(
        &self,
        checks: &[BucketCheck<'c>],
    ) -> SmallVec<[BucketCheck<'c>; 2]> {
        let slots = self.slots();
        checks
            .iter()
            .filter(|check| {
                slots.is_empty() || !slots.contains(&self.local_slot(check))
            })
            .copied()
            .collect()
    }

    /// Local slots held (for tests and inspection).
    pub(super) fn local_slots(&self) -> usize {
        self.slots().len()
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, LocalSlots> {
        self.local_slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
