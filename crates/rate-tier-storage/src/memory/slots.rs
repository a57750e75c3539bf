//! Counts in flight (concurrency limits) in sharded tables of their own:
//! one `AtomicU64` word per bucket, its count, beside the rates' table.
//!
//! A take alone is one lookup under the shard's read lock and one
//! compare-and-swap loop; a release is the same, and a release of a slot
//! never taken (a count of 0, or no word) writes nothing. Only a new count
//! takes the write lock, to insert. A word whose count went back to 0 is
//! dead: kept for the next take (no insert per request), dropped by the
//! sweep.
//!
//! The tables are apart from the rates' so that a count is never evicted
//! and never counts in the capacity: they take no part in room-making, and
//! no word of another kind is ever read as a count (a limit reloaded from
//! a window or a rate to a concurrency limit starts from 0; its old bucket
//! stays the old kind's). A limit reloaded away from concurrency keeps its
//! count until the requests that hold it give it back.
//!
//! A decision with a count among other kinds is made under the windows'
//! map (`kinds.rs`): it takes the write locks of its counts' shards
//! (sorted, after the map and before any shard of the rates' table), so
//! no take or release runs on them meanwhile, and writes the counts only
//! if the whole decision stands. No path holding a shard of the rates'
//! table takes one of these.

use std::sync::RwLockWriteGuard;

use gcra_core::{CheckError, Concurrency, ConcurrencyDecision, Verdict};
use smallvec::SmallVec;

use super::table::Table;
use super::{FEW, Inner, read, write};
use crate::bucket::BucketCheck;
use crate::rule::Rule;
use crate::storage::StorageError;
use crate::sync::{self, Ordering};
use gcra_core::Decision;

/// A word's count (words only ever hold a `u32`; anything else reads as
/// full, which refuses rather than lets more run).
#[inline]
fn count_of(word: u64) -> u32 {
    u32::try_from(word).unwrap_or(u32::MAX)
}

/// One take of `cost` slots by compare-and-swap on a held word.
#[inline(always)]
pub(super) fn take_in_place(
    word: &sync::AtomicU64,
    concurrency: &Concurrency,
    cost: u32,
) -> Result<ConcurrencyDecision, CheckError> {
    let mut current = word.load(Ordering::Acquire);
    loop {
        let decided = concurrency.acquire(count_of(current), cost)?;
        let Some(count) = decided.write else {
            return Ok(decided);
        };
        match word.compare_exchange_weak(
            current,
            u64::from(count),
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Ok(decided),
            Err(actual) => current = actual,
        }
    }
}

/// Gives `cost` slots back to a held word: nothing written when it holds
/// none.
#[inline]
pub(super) fn release_in_place(
    word: &sync::AtomicU64,
    concurrency: &Concurrency,
    cost: u32,
) {
    // `Err` is a count of 0 (or a cost of 0): nothing to give back.
    let _ = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
        let held = count_of(held);
        let left = concurrency.release(held, cost);
        (left != held).then_some(u64::from(left))
    });
}

impl Inner {
    /// One concurrency limit alone: a take by compare-and-swap on its word,
    /// inserted (under the shard's write lock) only by a take that passes.
    #[inline]
    pub(super) fn take_alone(
        &self,
        concurrency: &Concurrency,
        check: &BucketCheck<'_>,
        out: &mut Decision,
    ) -> Result<Verdict, StorageError> {
        let (name, index) = self.name(check);
        let shard = &self.slots[index];
        let cost = check.cost();
        let decided = {
            let table = read(&shard.table);
            match table.find(name) {
                Some(entry) => take_in_place(&entry.tat, concurrency, cost)?,
                None => {
                    drop(table);
                    self.take_new(concurrency, name, index, cost)?
                }
            }
        };
        *out = decided.as_decision();
        Ok(Verdict::of([check.is_shadow()], std::slice::from_ref(out)))
    }

    /// A count the tables do not hold yet: 0 in flight. Decided before any
    /// write lock, so that a refusal or a peek stores nothing.
    #[cold]
    fn take_new(
        &self,
        concurrency: &Concurrency,
        name: u64,
        index: usize,
        cost: u32,
    ) -> Result<ConcurrencyDecision, CheckError> {
        let decided = concurrency.acquire(0, cost)?;
        let Some(count) = decided.write else {
            return Ok(decided);
        };
        let mut table = write(&self.slots[index].table);
        // Another thread may have made it in between.
        if let Some(entry) = table.find(name) {
            return take_in_place(&entry.tat, concurrency, cost);
        }
        table.insert(name, u64::from(count));
        Ok(decided)
    }

    /// Gives back the slots of concurrency limits a request held (each
    /// check's cost), once it ended. Any other kind is refused before
    /// anything is given back.
    pub(super) fn release(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        if !slots
            .iter()
            .all(|check| matches!(check.rule(), Rule::Concurrency(_)))
        {
            return Err(StorageError::Unsupported(
                "releasing a bucket that is not a concurrency limit",
            ));
        }
        for check in slots {
            let Rule::Concurrency(concurrency) = check.rule() else {
                continue;
            };
            let (name, index) = self.name(check);
            let table = read(&self.slots[index].table);
            if let Some(entry) = table.find(name) {
                release_in_place(&entry.tat, &concurrency, check.cost());
            }
        }
        Ok(())
    }

    /// The write locks of the counts' shards of `checks`, in shard order.
    pub(super) fn lock_slots(&self, checks: &[BucketCheck<'_>]) -> Slots<'_> {
        let mut shards: SmallVec<[usize; FEW]> = checks
            .iter()
            .filter(|check| matches!(check.rule(), Rule::Concurrency(_)))
            .map(|check| self.name(check).1)
            .collect();
        shards.sort_unstable();
        shards.dedup();
        let guards = shards
            .iter()
            .map(|&index| write(&self.slots[index].table))
            .collect();
        Slots { shards, guards }
    }

    /// Drops the counts back at 0 (kept until now for the next take).
    pub(super) fn sweep_slots(&self, now: u64) {
        for shard in &*self.slots {
            let swept = write(&shard.table).sweep_by(
                now,
                self.sweep_interval_us,
                |entry| entry.tat.load(Ordering::Relaxed) != 0,
            );
            self.freed_bytes
                .fetch_add(swept.freed_bytes, Ordering::Relaxed);
        }
    }

    /// Counts held (0 included, until a sweep).
    pub(super) fn slots_len(&self) -> usize {
        self.slots
            .iter()
            .map(|shard| read(&shard.table).entries.len())
            .sum()
    }
}

/// The counts' shards one decision holds (see the module docs).
pub(super) struct Slots<'a> {
    shards: SmallVec<[usize; FEW]>,
    guards: SmallVec<[RwLockWriteGuard<'a, Table>; FEW]>,
}

impl Slots<'_> {
    fn table(&self, shard: usize) -> Option<&Table> {
        let at = self.shards.binary_search(&shard).ok()?;
        self.guards.get(at).map(|guard| &**guard)
    }

    /// The count in flight of `name` (0 when it holds none).
    pub(super) fn count(&self, name: u64, shard: usize) -> u32 {
        self.table(shard)
            .and_then(|table| table.find(name))
            .map_or(0, |entry| count_of(entry.tat.load(Ordering::Acquire)))
    }

    /// Writes `name`'s count (no other thread is on the shard meanwhile).
    pub(super) fn set(&mut self, name: u64, shard: usize, count: u32) {
        let Ok(at) = self.shards.binary_search(&shard) else {
            return;
        };
        let Some(table) = self.guards.get_mut(at) else {
            return;
        };
        match table.find(name) {
            Some(entry) => entry.tat.store(u64::from(count), Ordering::Release),
            None if count > 0 => table.insert(name, u64::from(count)),
            None => {}
        }
    }
}

/// Take and release races on one word under the model checker (`cargo
/// xtask loom`): the count never exceeds the limit, never goes below 0, a
/// release of a slot never taken changes nothing, and every slot taken and
/// given back leaves it at 0.
#[cfg(all(test, trt_loom))]
mod loom_model {
    use gcra_core::Concurrency;
    use loom::sync::Arc;
    use loom::thread;

    use super::{release_in_place, take_in_place};
    use crate::sync::{AtomicU64, Ordering};

    fn limit() -> Concurrency {
        Concurrency::new(1).unwrap()
    }

    #[test]
    fn two_takes_and_their_releases_on_a_limit_of_one() {
        loom::model(|| {
            let word = Arc::new(AtomicU64::new(0));
            let other = {
                let word = word.clone();
                thread::spawn(move || {
                    let taken =
                        take_in_place(&word, &limit(), 1).unwrap().allowed;
                    let seen = word.load(Ordering::SeqCst);
                    assert!(seen <= 1, "over the limit: {seen}");
                    if taken {
                        release_in_place(&word, &limit(), 1);
                    }
                    taken
                })
            };
            let mine = take_in_place(&word, &limit(), 1).unwrap().allowed;
            if mine {
                release_in_place(&word, &limit(), 1);
            }
            let theirs = other.join().unwrap();
            assert!(mine || theirs, "a free slot refused to both");
            assert_eq!(word.load(Ordering::SeqCst), 0);
        });
    }

    #[test]
    fn a_release_racing_a_take_never_goes_below_zero() {
        loom::model(|| {
            let word = Arc::new(AtomicU64::new(0));
            let stray = {
                let word = word.clone();
                // A release with no slot held by anyone yet, racing a take.
                thread::spawn(move || release_in_place(&word, &limit(), 1))
            };
            let taken = take_in_place(&word, &limit(), 1).unwrap().allowed;
            stray.join().unwrap();
            assert!(taken, "the free slot was refused");
            // Either order: a release before the take finds 0 and writes
            // nothing; after it, it gives the one slot back.
            let left = word.load(Ordering::SeqCst);
            assert!(left <= 1, "{left}");
        });
    }
}
