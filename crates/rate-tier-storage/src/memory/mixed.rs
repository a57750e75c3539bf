//! One decision over rates and periods, the kinds the table holds: the
//! joint protocol of `joint.rs` and `locked.rs` (each bucket's lock bit
//! taken in name order under its shard's read lock), with a period
//! decided on its word beside the rates' TATs. All or nothing across both
//! kinds: the periods are decided first; if one refuses, the rates are only
//! read; if a rate refuses, a period that passed answers with a read of its
//! count, and no word is written but a rate's repair (a TAT capped after
//! the clock went back), as gcra-core's `check_all` writes it.
//!
//! A bucket the table does not hold is a fresh one, decided without it
//! under the read locks; only a decision that writes one takes the write
//! locks of its shards (after reserving its places) and decides again.

use gcra_core::{Charge, Decision, Verdict, check_all};
use smallvec::SmallVec;

use super::joint::joint_error;
use super::locked::LockedBuckets;
use super::table::{NO_TAT, Table};
use super::{FEW, Inner, ROOM_ATTEMPTS, period, read, stored, write};
use crate::bucket::BucketCheck;
use crate::rule::Rule;
use crate::storage::StorageError;
use crate::sync::{AtomicU64, Ordering};
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

/// Takes a window's place when the table has nothing to evict: the debt
/// of the window evicted (`None` for an expired one), or `None` if none.
pub(super) type Spare<'s> = dyn FnMut(u64, &[u64]) -> Option<Option<u64>> + 's;

impl Inner {
    /// Rates and periods decided together (see the module docs). With
    /// `refused`, another bucket of the decision (a window) already
    /// refused: nothing is charged, and each bucket answers what its
    /// charge would have met. Places for new buckets come from the table,
    /// else from `spare`; the evictions are reported once the decision
    /// returns, or, with `deferred`, left there for the caller to report
    /// once it released its own locks.
    pub(super) fn decide_table(
        &self,
        checks: &[BucketCheck<'_>],
        now: u64,
        out: &mut [Decision],
        refused: bool,
        spare: &mut Spare<'_>,
        deferred: Option<&mut SmallVec<[u64; FEW]>>,
    ) -> Result<Verdict, StorageError> {
        let count = checks.len();
        let mut names: SmallVec<[u64; FEW]> = SmallVec::with_capacity(count);
        let mut homes: SmallVec<[usize; FEW]> = SmallVec::with_capacity(count);
        let mut last = None;
        for check in checks {
            let hash = self.partition_hash(&mut last, check);
            names.push(Self::tweak(hash, check));
            homes.push(Self::shard_index(hash));
        }
        let mut order: SmallVec<[usize; FEW]> = (0..count).collect();
        order.sort_unstable_by_key(|&i| names[i]);
        if order
            .windows(2)
            .any(|pair| names[pair[0]] == names[pair[1]])
        {
            return Err(StorageError::DuplicateBucket);
        }
        let mut shards = homes.clone();
        shards.sort_unstable();
        shards.dedup();
        let at = |home: usize| shards.partition_point(|&s| s < home);
        let mut writes: SmallVec<[Option<u64>; FEW]> =
            SmallVec::from_elem(None, count);
        let needed = {
            let guards: SmallVec<[RwLockReadGuard<'_, Table>; FEW]> = shards
                .iter()
                .map(|&shard| read(&self.shards[shard].table))
                .collect();
            let cells: SmallVec<[Option<&AtomicU64>; FEW]> = names
                .iter()
                .zip(&homes)
                .map(|(&name, &home)| {
                    Some(&guards.get(at(home))?.find(name)?.tat)
                })
                .collect();
            let mut words: SmallVec<[Option<u64>; FEW]> =
                SmallVec::from_elem(None, count);
            let locked = LockedBuckets::new(&cells, &order, &mut words);
            // An error unlocks them unchanged.
            let verdict =
                judge(checks, locked.stored(), now, out, &mut writes, refused)?;
            let needed = cells
                .iter()
                .zip(&writes)
                .filter(|(cell, write)| cell.is_none() && write.is_some())
                .count();
            if needed == 0 {
                locked.commit_words(&writes);
                return Ok(verdict);
            }
            needed
        };
        self.insert_table(
            checks, &names, &homes, &shards, now, out, needed, spare, deferred,
        )
    }

    /// The slow path of [`decide_table`](Self::decide_table): `needed`
    /// places reserved, then the write locks of `shards` in order, under
    /// which the decision is made again and written, new buckets inserted.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn insert_table(
        &self,
        checks: &[BucketCheck<'_>],
        names: &[u64],
        homes: &[usize],
        shards: &[usize],
        now: u64,
        out: &mut [Decision],
        mut needed: usize,
        spare: &mut Spare<'_>,
        mut deferred: Option<&mut SmallVec<[u64; FEW]>>,
    ) -> Result<Verdict, StorageError> {
        let at = |home: usize| shards.partition_point(|&s| s < home);
        for _ in 0..ROOM_ATTEMPTS {
            let mut places = self.places_with(needed, names, now, spare)?;
            let mut guards: SmallVec<[RwLockWriteGuard<'_, Table>; FEW]> =
                shards
                    .iter()
                    .map(|&shard| write(&self.shards[shard].table))
                    .collect();
            // No lock bit is held under a write lock.
            let words: SmallVec<[Option<u64>; FEW]> = names
                .iter()
                .zip(homes)
                .map(|(&name, &home)| {
                    let entry = guards.get(at(home))?.find(name)?;
                    stored(entry.tat.load(Ordering::Relaxed))
                })
                .collect();
            let mut writes: SmallVec<[Option<u64>; FEW]> =
                SmallVec::from_elem(None, checks.len());
            let verdict = judge(checks, &words, now, out, &mut writes, false)?;
            // A bucket held without a TAT (reset, or refunded to full) has
            // its place.
            let new = names
                .iter()
                .zip(homes)
                .zip(&writes)
                .filter(|&((&name, &home), write)| {
                    write.is_some()
                        && guards
                            .get(at(home))
                            .and_then(|t| t.find(name))
                            .is_none()
                })
                .count();
            // Room first, for every new bucket: nothing is written unless
            // everything can be.
            let mut short = false;
            while places.reserved < new {
                if !self.reserve() {
                    let evicted = guards
                        .iter_mut()
                        .find_map(|table| table.evict_one(now, names));
                    match evicted {
                        Some(debt_us) => places.evicted.push(debt_us),
                        None => {
                            short = true;
                            break;
                        }
                    }
                }
                places.reserved += 1;
            }
            if short {
                needed = new;
                drop(guards);
                if let Some(deferred) = deferred.as_deref_mut() {
                    deferred.extend(places.evicted.drain(..));
                }
                continue;
            }
            places.reserved -= new;
            for ((&name, &home), write) in names.iter().zip(homes).zip(&writes)
            {
                let (Some(write), Some(table)) =
                    (write, guards.get_mut(at(home)))
                else {
                    continue;
                };
                match table.find(name) {
                    Some(entry) => entry.tat.store(*write, Ordering::Release),
                    None => table.insert(name, *write),
                }
            }
            // The locks before the places: listeners never run under a lock.
            drop(guards);
            if let Some(deferred) = deferred {
                deferred.extend(places.evicted.drain(..));
            }
            drop(places);
            return Ok(verdict);
        }
        Err(StorageError::Backend(
            "memory storage: no room for the buckets of one decision: the \
             capacity is below the buckets it charges"
                .into(),
        ))
    }
}

/// The fast path's core over `cells` held (the loom model's entry): locks
/// them in `order`, decides, and commits the writes as it unlocks; `None`
/// when the decision writes a bucket no cell holds.
#[cfg(all(test, trt_loom))]
pub(super) fn decide_cells(
    cells: &[Option<&AtomicU64>],
    order: &[usize],
    checks: &[BucketCheck<'_>],
    now: u64,
    out: &mut [Decision],
) -> Result<Option<Verdict>, StorageError> {
    let mut words: SmallVec<[Option<u64>; FEW]> =
        SmallVec::from_elem(None, cells.len());
    let mut writes: SmallVec<[Option<u64>; FEW]> =
        SmallVec::from_elem(None, cells.len());
    let locked = LockedBuckets::new(cells, order, &mut words);
    let verdict = judge(checks, locked.stored(), now, out, &mut writes, false)?;
    if cells
        .iter()
        .zip(&writes)
        .any(|(cell, write)| cell.is_none() && write.is_some())
    {
        return Ok(None);
    }
    locked.commit_words(&writes);
    Ok(Some(verdict))
}

/// The decision over the words read (see the module docs): the answers in
/// `out`, the words to write in `writes`.
fn judge(
    checks: &[BucketCheck<'_>],
    words: &[Option<u64>],
    now: u64,
    out: &mut [Decision],
    writes: &mut [Option<u64>],
    refused: bool,
) -> Result<Verdict, StorageError> {
    // The periods first.
    let mut refused_here = false;
    for (i, check) in checks.iter().enumerate() {
        if let Rule::Period(rule) = check.rule() {
            let word = words[i].unwrap_or(NO_TAT);
            let (decided, write) =
                period::decide(&rule, word, now, check.cost())?;
            out[i] = decided.as_decision();
            writes[i] = write;
            refused_here |= !decided.allowed && !check.is_shadow();
        }
    }
    let peeks = refused || refused_here;
    // The rates: charged only if no period refused, else read. A period's
    // word read as a TAT is beyond `MAX_TIME_US`: absent to gcra-core.
    let rates: SmallVec<[usize; FEW]> =
        (0..checks.len()).filter(|&i| checks[i].is_rate()).collect();
    if !rates.is_empty() {
        let charges: SmallVec<[Charge; FEW]> = rates
            .iter()
            .map(|&i| {
                let charge = checks[i].charge();
                if peeks {
                    Charge { cost: 0, ..charge }
                } else {
                    charge
                }
            })
            .collect();
        let stored: SmallVec<[Option<u64>; FEW]> =
            rates.iter().map(|&i| words[i]).collect();
        let mut decided: SmallVec<[Decision; FEW]> =
            SmallVec::from_elem(Decision::default(), rates.len());
        check_all(&charges, &stored, now, &mut decided)
            .map_err(|error| joint_error(error, rates.len(), rates.len()))?;
        for (&i, decision) in rates.iter().zip(&decided) {
            if peeks {
                out[i] = checks[i].would_meet(decision);
                writes[i] = None;
            } else {
                out[i] = *decision;
                writes[i] = decision.store.map(|store| store.tat_us);
            }
        }
    }
    let verdict = Verdict::of(checks.iter().map(BucketCheck::is_shadow), out);
    if refused || !verdict.allowed {
        // Nothing is charged: a period that passed reads as it stands.
        for (i, check) in checks.iter().enumerate() {
            if let Rule::Period(rule) = check.rule()
                && out[i].allowed
            {
                let word = words[i].unwrap_or(NO_TAT);
                out[i] = period::decide(&rule, word, now, 0)?.0.as_decision();
                writes[i] = None;
            }
        }
    }
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use gcra_core::{Decision, Period, PeriodUnit, Quota, Window};

    use crate::bucket::{BucketCheck, LimitName};
    use crate::clock::{Clock, FakeClock};
    use crate::memory::MemoryStorage;

    /// A decision over a period the store holds and a new rate takes one
    /// place, for the new bucket alone: the store stays exactly at its
    /// bound, and a third bucket fits without an eviction.
    #[test]
    fn a_decision_takes_places_only_for_its_new_buckets() {
        let store = MemoryStorage::builder()
            .clock(FakeClock::at_us(1_000_000_000))
            .capacity(3)
            .build();
        let (daily, free) = (
            LimitName::of_limit("daily").unwrap(),
            LimitName::new("free").unwrap(),
        );
        let period = Period::new(100, PeriodUnit::Day, 0).unwrap();
        let day =
            BucketCheck::of_rule(&daily, "ana", period.into(), 1).unwrap();
        let plan =
            BucketCheck::new(&free, "ana", Quota::per_minute(10), 1).unwrap();
        let mut out = [Decision::default(); 2];
        store.check_sync(&[day], &mut out[..1]).unwrap();
        let decided = store.check_sync(&[day, plan], &mut out).unwrap();
        assert!(decided.verdict.allowed);
        assert_eq!((out[0].remaining, out[1].remaining), (98, 9));
        let other =
            BucketCheck::new(&free, "bea", Quota::per_minute(10), 1).unwrap();
        store.check_sync(&[other], &mut out[..1]).unwrap();
        assert_eq!((store.len(), store.evictions()), (3, 0));
    }

    /// Another decision evicts a bucket of this one while it waits for room
    /// (to insert a bucket of its own): this one finds more new buckets
    /// under its locks than it has places for, takes the missing place
    /// (here by evicting that other bucket), and inserts both, the store at
    /// its bound.
    #[test]
    fn a_bucket_evicted_while_the_decision_waits_for_room_is_inserted_again() {
        let clock = FakeClock::at_us(1_000_000_000);
        let store = MemoryStorage::builder()
            .clock(clock.clone())
            .capacity(3)
            .build();
        let names = [
            LimitName::of_limit("daily").unwrap(),
            LimitName::new("free").unwrap(),
            LimitName::of_limit("search").unwrap(),
            LimitName::of_limit("export").unwrap(),
            LimitName::of_limit("login").unwrap(),
        ];
        let [daily, free, search, export, login] = &names;
        let period = Period::new(100, PeriodUnit::Day, 0).unwrap();
        let day = BucketCheck::of_rule(daily, "ana", period.into(), 1).unwrap();
        let rate = |name| {
            BucketCheck::new(name, "ana", Quota::per_minute(10), 1).unwrap()
        };
        let window = Window::new(5, Duration::from_secs(60)).unwrap();
        let logins =
            BucketCheck::of_rule(login, "bea", window.into(), 1).unwrap();
        let mut out = [Decision::default(); 3];
        // Full: ana's day and tier, and bea's logins.
        for held in [day, rate(free), logins] {
            store.check_sync(&[held], &mut out[..1]).unwrap();
        }
        assert_eq!(store.len(), 3);

        let inner = &store.inner;
        let mut waited = false;
        let mut spare = |now: u64, keep: &[u64]| {
            if !waited {
                waited = true;
                // Meanwhile: ana's export, new, evicts a bucket of hers
                // (her tier or her day) for its place.
                store
                    .check_sync(&[rate(export)], &mut [Decision::default()])
                    .unwrap();
            }
            inner.spare_window(now, keep)
        };
        let checks = [day, rate(free), rate(search)];
        let verdict = inner
            .decide_table(
                &checks,
                clock.now_us(),
                &mut out,
                false,
                &mut spare,
                None,
            )
            .unwrap();
        assert!(verdict.allowed && waited);
        // Hers are held; bea's logins and the export made the room.
        assert_eq!((store.len(), store.evictions()), (3, 3));
        // And they hold what the decision answered.
        let mut read = [Decision::default(); 3];
        store
            .check_sync(&checks.map(BucketCheck::as_peek), &mut read)
            .unwrap();
        assert_eq!(read.map(|d| d.remaining), out.map(|d| d.remaining));
    }
}
