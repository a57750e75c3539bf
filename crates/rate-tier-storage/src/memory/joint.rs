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

use crate::sync::{AtomicU64, Ordering, spin};
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use std::cell::Cell;

use gcra_core::{
    Charge, Decision, JointError, JointReservation, Verdict, check_all,
    reserve_all,
};
use smallvec::SmallVec;

use super::table::{LOCKED, NO_TAT, Table};
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

/// The fast path's core: locks `cells` in `order` (the buckets' names),
/// reads their TATs into `stored`, decides, and commits the writes as it
/// unlocks; or, when the decision writes buckets the table does not hold
/// (`None` cells), unlocks them unchanged and says how many.
#[cfg(all(test, trt_loom))]
pub(super) fn decide_locked(
    cells: &[Option<&AtomicU64>],
    order: &[usize],
    stored: &mut [Option<u64>],
    charges: &[Charge],
    now: u64,
    out: &mut [Decision],
) -> Result<Result<Verdict, usize>, StorageError> {
    judge_locked(cells, order, stored, charges, now, out, Check)
}

/// [`decide_locked`]'s steps, judged by `judge`.
#[inline(always)]
pub(super) fn judge_locked<J: Judge>(
    cells: &[Option<&AtomicU64>],
    order: &[usize],
    stored: &mut [Option<u64>],
    charges: &[Charge],
    now: u64,
    out: &mut [Decision],
    judge: J,
) -> Result<Result<Verdict, usize>, StorageError> {
    let locked = LockedBuckets::new(cells, order, stored);
    let verdict = judge.judge(charges, locked.stored, now, out)?;
    Ok(match unheld_writes(cells, out) {
        0 => {
            locked.commit(out);
            Ok(verdict)
        }
        needed => Err(needed),
    })
}

/// [`Inner::charge_rates`] on the cells found: locked in `order`, charged
/// only if every charge passes, unlocked either way. Whether all passed.
#[inline(always)]
pub(super) fn charge_cells(
    cells: &[&AtomicU64],
    order: &[usize],
    charges: &[RateCharge<'_>],
    now: u64,
    out: &mut [Decision],
) -> bool {
    let mut held = [NO_TAT; FEW];
    for &i in order {
        held[i] = lock(cells[i]);
    }
    let mut all_pass = true;
    for ((charge, decision), &word) in charges.iter().zip(&mut *out).zip(&held)
    {
        match charge.quota.check(stored(word), now, charge.cost) {
            Ok(passed) if passed.allowed => *decision = passed,
            _ => {
                all_pass = false;
                break;
            }
        }
    }
    // Unlocked with the charges, or as they were (`check` never panics: no
    // lock is left held by an unwinding).
    for ((cell, decision), &word) in cells.iter().zip(&*out).zip(&held) {
        let write = match decision.store {
            Some(store) if all_pass => store.tat_us,
            _ => word,
        };
        cell.store(write, Ordering::Release);
    }
    all_pass
}

/// How many of the writes in `out` go to buckets the table does not hold.
/// A missing bucket is a full one, so the decision made without it is
/// exact (no insert can happen under the read locks): if it writes nothing
/// there (a refusal, a peek), it stands as it is.
fn unheld_writes(cells: &[Option<&AtomicU64>], out: &[Decision]) -> usize {
    cells
        .iter()
        .zip(out)
        .filter(|(cell, decision)| cell.is_none() && decision.store.is_some())
        .count()
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

/// The buckets of one joint decision, locked; unlocked when dropped,
/// unchanged, or by [`commit`](Self::commit) with the decision's writes.
pub(super) struct LockedBuckets<'s, 'a> {
    cells: &'s [Option<&'a AtomicU64>],
    stored: &'s [Option<u64>],
}

impl<'s, 'a> LockedBuckets<'s, 'a> {
    /// Locks `cells` in `order` (one global order: the buckets' names),
    /// reading their words into `stored` (a rate's TAT or a period's word).
    pub(super) fn new(
        cells: &'s [Option<&'a AtomicU64>],
        order: &[usize],
        stored: &'s mut [Option<u64>],
    ) -> Self {
        for &i in order {
            if let Some(cell) = cells[i] {
                stored[i] = self::stored(lock(cell));
            }
        }
        LockedBuckets { cells, stored }
    }

    /// Unlocks with the decision's writes.
    fn commit(self, out: &[Decision]) {
        for ((cell, stored), decision) in
            self.cells.iter().zip(self.stored).zip(out)
        {
            if let Some(cell) = cell {
                let write = decision.store.map(|s| s.tat_us);
                cell.store(
                    write.or(*stored).unwrap_or(NO_TAT),
                    Ordering::Release,
                );
            }
        }
        // Unlocked: nothing left for `drop`.
        std::mem::forget(self);
    }

    /// The words read, in the order of the cells.
    pub(super) fn stored(&self) -> &[Option<u64>] {
        self.stored
    }

    /// Unlocks with `writes`, a word per cell (`None`: unchanged).
    pub(super) fn commit_words(self, writes: &[Option<u64>]) {
        for ((cell, stored), write) in
            self.cells.iter().zip(self.stored).zip(writes)
        {
            if let Some(cell) = cell {
                cell.store(
                    write.or(*stored).unwrap_or(NO_TAT),
                    Ordering::Release,
                );
            }
        }
        // Unlocked: nothing left for `drop`.
        std::mem::forget(self);
    }
}

impl Drop for LockedBuckets<'_, '_> {
    fn drop(&mut self) {
        for (cell, stored) in self.cells.iter().zip(self.stored) {
            if let Some(cell) = cell {
                cell.store(stored.unwrap_or(NO_TAT), Ordering::Release);
            }
        }
    }
}

fn no_room() -> StorageError {
    StorageError::Backend(
        "memory storage: no room for the buckets of one decision: the \
         capacity is below the buckets it charges"
            .into(),
    )
}

/// Takes a bucket's lock bit; returns the TAT it held. Inlined for the
/// usual case, a free bit taken at once; a held one waits out of line.
#[inline(always)]
fn lock(cell: &AtomicU64) -> u64 {
    try_lock(cell).unwrap_or_else(|| lock_contended(cell))
}

/// The bit taken if it is free at this read: the TAT it guarded.
#[inline(always)]
fn try_lock(cell: &AtomicU64) -> Option<u64> {
    let current = cell.load(Ordering::Relaxed);
    (current & LOCKED == 0
        && cell
            .compare_exchange_weak(
                current,
                current | LOCKED,
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .is_ok())
    .then_some(current)
}

/// [`lock`] of a bit another decision holds: spins until it is free.
#[cold]
#[inline(never)]
fn lock_contended(cell: &AtomicU64) -> u64 {
    let mut spins = 0u32;
    loop {
        if let Some(current) = try_lock(cell) {
            return current;
        }
        spins = spins.saturating_add(1);
        spin(spins);
    }
}

/// The lock-bit protocol under the model checker (`cargo xtask loom`):
/// every interleaving of two or three threads over shared buckets, each of
/// a burst of 1 (the first charge fills it), keeps each decision all or
/// nothing, charges each bucket once, leaves no lock bit set, and ends (a
/// deadlock fails the model).
#[cfg(all(test, trt_loom))]
mod loom_model {
    use gcra_core::{Charge, Decision, Quota};
    use loom::sync::Arc;
    use loom::thread;

    use super::super::decide::decide_in_place;
    use super::super::table::{LOCKED, NO_TAT};
    use super::{RateCharge, charge_cells, decide_locked};
    use crate::bucket::{BucketCheck, LimitName};
    use crate::sync::{AtomicU64, Ordering};

    const NOW: u64 = 1_000_000;
    const FULL: u64 = NOW + 1_000_000;

    fn quota() -> Quota {
        Quota::per_second(1)
    }

    /// One joint decision over `cells`, locked in `order`: passed?
    fn joint(cells: &[&AtomicU64], order: &[usize]) -> bool {
        let cells: Vec<Option<&AtomicU64>> =
            cells.iter().map(|c| Some(*c)).collect();
        let mut stored = vec![None; cells.len()];
        let charges = vec![Charge::new(quota(), 1); cells.len()];
        let mut out = vec![Decision::default(); cells.len()];
        match decide_locked(&cells, order, &mut stored, &charges, NOW, &mut out)
        {
            Ok(Ok(verdict)) => verdict.allowed,
            other => panic!("{other:?}"),
        }
    }

    /// One check of one bucket, by compare-and-swap: passed?
    fn single(cell: &AtomicU64) -> bool {
        let name = LimitName::new("b").unwrap();
        let check = BucketCheck::new(&name, "ana", quota(), 1).unwrap();
        decide_in_place(cell, check.quota(), 1, NOW)
            .unwrap()
            .allowed
    }

    /// Every interleaving with at most `preemptions` preemptions (the
    /// threads' own yields, in every spin, come on top).
    fn model(preemptions: usize, test: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        builder.preemption_bound = Some(preemptions);
        builder.max_branches = 100_000;
        builder.check(test);
    }

    fn bucket() -> Arc<AtomicU64> {
        Arc::new(AtomicU64::new(NO_TAT))
    }

    fn value(cell: &AtomicU64) -> u64 {
        let value = cell.load(Ordering::SeqCst);
        assert_eq!(value & LOCKED, 0, "a lock bit left set");
        value
    }

    #[test]
    fn two_joint_decisions_given_in_opposite_orders() {
        model(3, || {
            let (a, b) = (bucket(), bucket());
            let other = {
                let (a, b) = (a.clone(), b.clone());
                // Given as [b, a]; locked in name order, a first.
                thread::spawn(move || joint(&[&b, &a], &[1, 0]))
            };
            let mine = joint(&[&a, &b], &[0, 1]);
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs, "exactly one passes: {mine} {theirs}");
            assert_eq!((value(&a), value(&b)), (FULL, FULL));
        });
    }

    /// [`charge_cells`] of `cells` (given in `order`): passed?
    fn lean(cells: &[&AtomicU64], order: &[usize]) -> bool {
        let name = LimitName::new("b").unwrap();
        let charge = RateCharge {
            limit: &name,
            partition: "ana",
            quota: quota(),
            cost: 1,
        };
        let charges = vec![charge; cells.len()];
        let mut out = vec![Decision::default(); cells.len()];
        charge_cells(cells, order, &charges, NOW, &mut out)
    }

    #[test]
    fn a_lean_charge_and_a_joint_decision_given_in_opposite_orders() {
        model(3, || {
            let (a, b) = (bucket(), bucket());
            let other = {
                let (a, b) = (a.clone(), b.clone());
                thread::spawn(move || lean(&[&b, &a], &[1, 0]))
            };
            let mine = joint(&[&a, &b], &[0, 1]);
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs, "exactly one passes: {mine} {theirs}");
            assert_eq!((value(&a), value(&b)), (FULL, FULL));
        });
    }

    #[test]
    fn a_lean_charge_and_a_single_check() {
        model(3, || {
            let (a, b) = (bucket(), bucket());
            let other = {
                let b = b.clone();
                thread::spawn(move || single(&b))
            };
            let mine = lean(&[&a, &b], &[0, 1]);
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs, "exactly one passes: {mine} {theirs}");
            // The lean charge writes `a` only if it passed.
            assert_eq!(value(&a) == FULL, mine, "a charged iff it passed");
            assert_eq!(value(&b), FULL);
        });
    }

    #[test]
    fn a_joint_rate_and_period_and_a_single_period_check() {
        // A period of 1 a day shared by a joint decision (with a rate of
        // burst 1) and a check of the period alone by compare-and-swap:
        // exactly one passes the period, and the joint decision charges
        // its rate iff it passed.
        use super::super::mixed::decide_cells;
        use super::super::period::{PERIOD, decide_in_place as period_alone};
        use gcra_core::{Period, PeriodUnit};

        fn daily() -> Period {
            Period::new(1, PeriodUnit::Day, 0).unwrap()
        }
        model(2, || {
            let (rate, day) = (bucket(), bucket());
            let alone = {
                let day = day.clone();
                thread::spawn(move || {
                    let name = LimitName::new("d").unwrap();
                    let check =
                        BucketCheck::of_rule(&name, "ana", daily().into(), 1)
                            .unwrap();
                    let mut out = Decision::default();
                    period_alone(&day, &daily(), &check, NOW, &mut out)
                        .unwrap()
                        .allowed
                })
            };
            let (plan, d) =
                (LimitName::new("b").unwrap(), LimitName::new("d").unwrap());
            let checks = [
                BucketCheck::new(&plan, "ana", quota(), 1).unwrap(),
                BucketCheck::of_rule(&d, "ana", daily().into(), 1).unwrap(),
            ];
            let mut out = [Decision::default(); 2];
            let cells = [Some(&*rate), Some(&*day)];
            let joint = decide_cells(&cells, &[0, 1], &checks, NOW, &mut out)
                .unwrap()
                .expect("both held")
                .allowed;
            let alone = alone.join().unwrap();
            assert!(joint ^ alone, "exactly one passes: {joint} {alone}");
            assert_eq!(value(&rate) == FULL, joint, "rate charged iff joint");
            let day = value(&day);
            assert_ne!(day & PERIOD, 0, "a period's word");
            assert_eq!(day as u32, 1, "the period counted once");
        });
    }

    #[test]
    fn joint_decisions_and_a_single_check_over_a_shared_bucket() {
        // Three threads spinning on one lock bit: two preemptions already
        // take many minutes; see BENCHMARKS.md for the runs made.
        let preemptions = std::env::var("TRT_LOOM_PREEMPTIONS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        model(preemptions, || {
            let (a, b, c) = (bucket(), bucket(), bucket());
            let ab = {
                let (a, b) = (a.clone(), b.clone());
                thread::spawn(move || joint(&[&a, &b], &[0, 1]))
            };
            let alone = {
                let b = b.clone();
                thread::spawn(move || single(&b))
            };
            let bc = joint(&[&b, &c], &[0, 1]);
            let (ab, alone) = (ab.join().unwrap(), alone.join().unwrap());
            // b has room for one: exactly one of the three passes, and a
            // joint decision charges both of its buckets or neither.
            assert_eq!(u8::from(ab) + u8::from(bc) + u8::from(alone), 1);
            assert_eq!(value(&b), FULL);
            assert_eq!(value(&a) == FULL, ab, "a charged iff ab passed");
            assert_eq!(value(&c) == FULL, bc, "c charged iff bc passed");
        });
    }
}
