//! One decision over several buckets, atomic across them: each bucket's
//! lock bit is taken in one global order (the buckets' names) under the
//! read locks of their shards (taken in shard order), the decision is made
//! on what they held, and the writes are committed as they unlock.
//!
//! A bucket the table does not hold is a full one, and under the read locks
//! no insert can happen: the decision made without it is exact. If it
//! writes nothing there (a refusal, a peek) it stands, and the store is
//! left as it was (no entry made, no one evicted). Only a decision that
//! charges a new bucket takes the slow path: the places it needs reserved
//! first (evicting where the store is full), then the write locks of its
//! shards, in shard order, under which it decides again and inserts.

use crate::sync::{AtomicU64, Ordering};
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use std::cell::Cell;

use gcra_core::{
    Charge, Decision, JointError, JointReservation, Verdict, check_all,
    reserve_all,
};
use smallvec::SmallVec;

use super::locked::{charge_cells, judge_locked};
use super::table::Table;
use super::{FEW, Inner, ROOM_ATTEMPTS, TWEAK, read, stored, write};
use crate::bucket::{BucketCheck, LimitName};
use crate::storage::StorageError;

/// A rate's bucket for
/// [`MemoryStorage::try_charge_rates`](super::MemoryStorage::try_charge_rates):
/// `limit`'s bucket of `partition`, under `quota`, charged `cost`.
#[derive(Debug, Clone, Copy)]
pub struct RateCharge<'a> {
    /// The limit's name.
    pub limit: &'a LimitName,
    /// Whose bucket: a user, a key.
    pub partition: &'a str,
    /// The limit's rate.
    pub quota: gcra_core::Quota,
    /// What the request costs it, at least 1.
    pub cost: u32,
}

impl Inner {
    /// Several buckets, locked in name order, checked together.
    pub(super) fn decide_many(
        &self,
        checks: &[BucketCheck<'_>],
        now: u64,
        out: &mut [Decision],
    ) -> Result<Verdict, StorageError> {
        self.judge_many(checks, now, out, Check)
    }

    /// Several buckets, locked in name order, judged together by `judge`
    /// (a check, or a reservation).
    #[inline(always)]
    pub(super) fn judge_many<J: Judge>(
        &self,
        checks: &[BucketCheck<'_>],
        now: u64,
        out: &mut [Decision],
        judge: J,
    ) -> Result<Verdict, StorageError> {
        if (2..=FEW).contains(&checks.len()) {
            return self.decide_few(checks, now, out, judge);
        }
        // Filled by pushes: for a few items, cheaper than `collect`.
        let count = checks.len();
        let mut names: SmallVec<[u64; 4]> = SmallVec::with_capacity(count);
        let mut charges: SmallVec<[Charge; 4]> = SmallVec::with_capacity(count);
        let mut homes: SmallVec<[usize; 4]> = SmallVec::with_capacity(count);
        let mut order: SmallVec<[usize; 4]> = SmallVec::with_capacity(count);
        let mut last = None;
        for (i, check) in checks.iter().enumerate() {
            let hash = self.partition_hash(&mut last, check);
            names.push(Self::tweak(hash, check));
            charges.push(check.charge());
            homes.push(Self::shard_index(hash));
            order.push(i);
        }
        order.sort_unstable_by_key(|&i| names[i]);
        // Two checks of one bucket have one name (and two names that
        // collide are one bucket here, and would lock one cell twice):
        // compared as names, not as strings.
        if order
            .windows(2)
            .any(|pair| names[pair[0]] == names[pair[1]])
        {
            return Err(StorageError::DuplicateBucket);
        }
        let mut shards = homes.clone();
        shards.sort_unstable();
        shards.dedup();
        let needed = {
            // One read lock per shard, in shard order: readers only, and
            // never the same lock twice.
            let mut guards: SmallVec<[RwLockReadGuard<'_, Table>; 4]> =
                SmallVec::with_capacity(shards.len());
            for &shard in &shards {
                guards.push(read(&self.shards[shard].table));
            }
            let mut cells: SmallVec<[Option<&AtomicU64>; 4]> =
                SmallVec::with_capacity(count);
            for (&name, home) in names.iter().zip(&homes) {
                let cell = shards
                    .binary_search(home)
                    .ok()
                    .and_then(|i| guards.get(i))
                    .and_then(|table| table.find(name))
                    .map(|entry| &entry.tat);
                cells.push(cell);
            }
            let mut stored: SmallVec<[Option<u64>; 4]> =
                SmallVec::from_elem(None, count);
            match judge_locked(
                &cells,
                &order,
                &mut stored,
                &charges,
                now,
                out,
                judge,
            )? {
                Ok(verdict) => return Ok(verdict),
                Err(needed) => needed,
            }
        };
        self.decide_inserting(
            &charges, &names, &homes, &shards, now, out, needed, judge,
        )
    }

    /// [`MemoryStorage::try_charge_rates`](super::MemoryStorage::try_charge_rates):
    /// every bucket held, locked in name order, charged only
    /// if all pass. `None`: not decided here, nothing written.
    #[inline]
    pub(super) fn charge_rates(
        &self,
        charges: &[RateCharge<'_>],
        out: &mut [Decision],
    ) -> Option<u64> {
        let count = charges.len();
        if !(1..=FEW).contains(&count) || out.len() != count {
            return None;
        }
        let mut names = [0u64; FEW];
        let mut homes = [0usize; FEW];
        let mut order = [0usize; FEW];
        let mut one_shard = true;
        let mut last: Option<(&str, u64)> = None;
        for (i, charge) in charges.iter().enumerate() {
            if charge.cost == 0 || charge.cost > charge.quota.burst() {
                return None;
            }
            let hash = match last {
                Some((seen, hash)) if std::ptr::eq(seen, charge.partition) => {
                    hash
                }
                _ => self.hasher.hash(charge.partition.as_bytes()),
            };
            last = Some((charge.partition, hash));
            homes[i] = Self::shard_index(hash);
            one_shard &= homes[i] == homes[0];
            names[i] = hash ^ charge.limit.id().wrapping_mul(TWEAK);
            let mut at = i;
            while at > 0 && names[order[at - 1]] > names[i] {
                order[at] = order[at - 1];
                at -= 1;
            }
            if at > 0 && names[order[at - 1]] == names[i] {
                return None;
            }
            order[at] = i;
        }
        let (names, homes, order) =
            (&names[..count], &homes[..count], &order[..count]);
        if !one_shard {
            return self
                .charge_across_shards(charges, names, homes, order, out);
        }
        let now = self.clock.now_us();
        let table = read(&self.shards[homes[0]].table);
        let first = &table.find(names[0])?.tat;
        let mut cells = [first; FEW];
        for (cell, name) in cells[1..count].iter_mut().zip(&names[1..]) {
            *cell = &table.find(*name)?.tat;
        }
        charge_cells(&cells[..count], order, charges, now, out).then_some(now)
    }

    /// [`charge_rates`](Self::charge_rates) over the buckets of several
    /// shards (a user's limits and one per address, say): the shards' read
    /// locks taken in shard order, as every joint decision takes them.
    fn charge_across_shards(
        &self,
        charges: &[RateCharge<'_>],
        names: &[u64],
        homes: &[usize],
        order: &[usize],
        out: &mut [Decision],
    ) -> Option<u64> {
        let mut shards: SmallVec<[usize; FEW]> = SmallVec::from_slice(homes);
        shards.sort_unstable();
        shards.dedup();
        let now = self.clock.now_us();
        let guards: SmallVec<[RwLockReadGuard<'_, Table>; FEW]> = shards
            .iter()
            .map(|&shard| read(&self.shards[shard].table))
            .collect();
        let mut cells: SmallVec<[&AtomicU64; FEW]> = SmallVec::new();
        for (&name, home) in names.iter().zip(homes) {
            let table = guards.get(shards.binary_search(home).ok()?)?;
            cells.push(&table.find(name)?.tat);
        }
        charge_cells(&cells, order, charges, now, out).then_some(now)
    }

    /// `check`'s partition hash; the last one again when the partition is
    /// the same string (a user's limits share the user's partition: it is
    /// hashed once per decision).
    #[inline]
    pub(super) fn partition_hash<'c>(
        &self,
        last: &mut Option<(&'c str, u64)>,
        check: &'c BucketCheck<'_>,
    ) -> u64 {
        let partition = check.partition();
        let hash = match *last {
            Some((seen, hash)) if std::ptr::eq(seen, partition) => hash,
            _ => self.hasher.hash(partition.as_bytes()),
        };
        *last = Some((partition, hash));
        hash
    }

    /// [`decide_many`](Self::decide_many) of a few buckets (a user's tier
    /// and limits): the same steps on stack arrays, and usually one shard
    /// (a user's buckets share theirs), so one read lock.
    #[inline(always)]
    fn decide_few<J: Judge>(
        &self,
        checks: &[BucketCheck<'_>],
        now: u64,
        out: &mut [Decision],
        judge: J,
    ) -> Result<Verdict, StorageError> {
        let count = checks.len();
        let mut names = [0u64; FEW];
        let mut homes = [0usize; FEW];
        let mut order = [0usize; FEW];
        let mut last = None;
        for (i, check) in checks.iter().enumerate() {
            let hash = self.partition_hash(&mut last, check);
            names[i] = Self::tweak(hash, check);
            homes[i] = Self::shard_index(hash);
            // Insertion sort by name, as the items come; equal names are
            // one bucket twice.
            let mut at = i;
            while at > 0 && names[order[at - 1]] > names[i] {
                order[at] = order[at - 1];
                at -= 1;
            }
            if at > 0 && names[order[at - 1]] == names[i] {
                return Err(StorageError::DuplicateBucket);
            }
            order[at] = i;
        }
        let (names, homes, order) =
            (&names[..count], &homes[..count], &order[..count]);
        // A loop over a filled array: `array::from_fn` costs more.
        let mut charges = [checks[0].charge(); FEW];
        for (charge, check) in charges[1..count].iter_mut().zip(&checks[1..]) {
            *charge = check.charge();
        }
        // The distinct shards, in order; and where each check's is.
        let mut shards = [0usize; FEW];
        let mut shard_count = 0;
        for &home in homes {
            let at = shards[..shard_count].partition_point(|&s| s < home);
            if at == shard_count || shards[at] != home {
                shards.copy_within(at..shard_count, at + 1);
                shards[at] = home;
                shard_count += 1;
            }
        }
        let shards = &shards[..shard_count];
        let needed = {
            // One read lock per shard, in shard order.
            let mut guards: [Option<RwLockReadGuard<'_, Table>>; FEW] =
                [const { None }; FEW];
            for (guard, &shard) in guards.iter_mut().zip(shards) {
                *guard = Some(read(&self.shards[shard].table));
            }
            let mut cells: [Option<&AtomicU64>; FEW] = [None; FEW];
            for (i, cell) in cells[..count].iter_mut().enumerate() {
                // Usually one shard: no search.
                let at = match shards {
                    [_] => 0,
                    _ => shards.partition_point(|&s| s < homes[i]),
                };
                *cell = guards
                    .get(at)
                    .and_then(Option::as_ref)
                    .and_then(|table| table.find(names[i]))
                    .map(|entry| &entry.tat);
            }
            let cells = &cells[..count];
            let mut stored = [None; FEW];
            match judge_locked(
                cells,
                order,
                &mut stored[..count],
                &charges[..count],
                now,
                out,
                judge,
            )? {
                Ok(verdict) => return Ok(verdict),
                Err(needed) => needed,
            }
        };
        self.decide_inserting(
            &charges[..count],
            names,
            homes,
            shards,
            now,
            out,
            needed,
            judge,
        )
    }

    /// The slow path of a decision that charges buckets the table does not
    /// hold: `needed` places reserved first (each one evicting, in a full
    /// store, a bucket that is not one of this decision's), then the write
    /// locks of `shards` (sorted) in order, under which no lock bit is
    /// held: the decision is made again on what the tables hold, and
    /// written, new buckets inserted. Places left over are given back.
    #[cold]
    #[allow(clippy::too_many_arguments)]
    fn decide_inserting<J: Judge>(
        &self,
        charges: &[Charge],
        names: &[u64],
        homes: &[usize],
        shards: &[usize],
        now: u64,
        out: &mut [Decision],
        mut needed: usize,
        judge: J,
    ) -> Result<Verdict, StorageError> {
        // Another decision may take a bucket of ours away between the count
        // and the locks: then more places, and again.
        for _ in 0..ROOM_ATTEMPTS {
            let places = self.places(needed, names, now)?;
            match self.insert_locked(
                charges, names, homes, shards, now, out, places, judge,
            )? {
                Ok(verdict) => return Ok(verdict),
                Err(more) => needed = more,
            }
        }
        Err(no_room())
    }

    /// [`decide_inserting`](Self::decide_inserting) under the write locks,
    /// with `places` reserved: the verdict, or (nothing written) how many
    /// new buckets it needs.
    #[allow(clippy::too_many_arguments)]
    fn insert_locked<J: Judge>(
        &self,
        charges: &[Charge],
        names: &[u64],
        homes: &[usize],
        shards: &[usize],
        now: u64,
        out: &mut [Decision],
        mut places: super::Places<'_>,
        judge: J,
    ) -> Result<Result<Verdict, usize>, StorageError> {
        let mut guards: SmallVec<[RwLockWriteGuard<'_, Table>; 4]> =
            SmallVec::with_capacity(shards.len());
        for &shard in shards {
            guards.push(write(&self.shards[shard].table));
        }
        let at = |home: usize| shards.partition_point(|&s| s < home);
        let stored: SmallVec<[Option<u64>; 4]> = names
            .iter()
            .zip(homes)
            .map(|(&name, &home)| {
                let entry = guards.get(at(home))?.find(name)?;
                // No lock bit is held under a write lock.
                stored(entry.tat.load(Ordering::Relaxed))
            })
            .collect();
        let verdict = judge.judge(charges, &stored, now, out)?;
        // Room first, for every new bucket, so that nothing is written
        // unless everything can be (dropped, `places` gives back all it
        // holds). A bucket held without a TAT (reset, or refunded to full)
        // has its place.
        let new = names
            .iter()
            .zip(homes)
            .zip(&*out)
            .filter(|&((&name, &home), decision)| {
                decision.store.is_some()
                    && guards.get(at(home)).and_then(|t| t.find(name)).is_none()
            })
            .count();
        while places.reserved < new {
            if !self.reserve() {
                let evicted = guards
                    .iter_mut()
                    .find_map(|table| table.evict_one(now, names));
                match evicted {
                    Some(debt_us) => places.evicted.push(debt_us),
                    None => return Ok(Err(new)),
                }
            }
            places.reserved += 1;
        }
        places.reserved -= new;
        for ((&name, &home), decision) in names.iter().zip(homes).zip(&*out) {
            let (Some(write), Some(table)) =
                (decision.store, guards.get_mut(at(home)))
            else {
                continue;
            };
            match table.find(name) {
                Some(entry) => entry.tat.store(write.tat_us, Ordering::Release),
                None => table.insert(name, write.tat_us),
            }
        }
        // The locks before the places: listeners never run under a lock.
        drop(guards);
        drop(places);
        Ok(Ok(verdict))
    }
}

/// How a joint decision decides on the TATs it locked: [`Check`] or
/// [`Reserving`].
pub(super) trait Judge: Copy {
    fn judge(
        self,
        charges: &[Charge],
        stored: &[Option<u64>],
        now: u64,
        out: &mut [Decision],
    ) -> Result<Verdict, StorageError>;
}

/// [`check_all`].
#[derive(Clone, Copy)]
pub(super) struct Check;

impl Judge for Check {
    #[inline(always)]
    fn judge(
        self,
        charges: &[Charge],
        stored: &[Option<u64>],
        now: u64,
        out: &mut [Decision],
    ) -> Result<Verdict, StorageError> {
        check_all(charges, stored, now, out)
            .map_err(|error| joint_error(error, charges.len(), out.len()))
    }
}

/// [`reserve_all`], waiting at most `max_wait_us`; the last summary is
/// left in `joint` (a compare-and-swap loop may judge more than once).
#[derive(Clone, Copy)]
pub(super) struct Reserving<'a> {
    pub(super) max_wait_us: u64,
    pub(super) joint: &'a Cell<Option<JointReservation>>,
}

impl Judge for Reserving<'_> {
    fn judge(
        self,
        charges: &[Charge],
        stored: &[Option<u64>],
        now: u64,
        out: &mut [Decision],
    ) -> Result<Verdict, StorageError> {
        let joint = reserve_all(charges, stored, now, self.max_wait_us, out)
            .map_err(|error| joint_error(error, charges.len(), out.len()))?;
        self.joint.set(Some(joint));
        Ok(joint.verdict())
    }
}

/// A joint decision's error as the store's.
pub(super) fn joint_error(
    error: JointError,
    checks: usize,
    out: usize,
) -> StorageError {
    match error {
        JointError::Charge { error, .. } => StorageError::Check(error),
        _ => StorageError::LengthMismatch { checks, out },
    }
}

fn no_room() -> StorageError {
    StorageError::Backend(
        "memory storage: no room for the buckets of one decision: the \
         capacity is below the buckets it charges"
            .into(),
    )
}
