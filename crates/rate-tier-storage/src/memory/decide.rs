//! One bucket decided in its table: its name, a rate's compare-and-swap
//! loop in place, a new bucket inserted, a settlement.

use std::sync::atomic::Ordering;

use gcra_core::{Decision, Quota, Verdict, Write};

use super::table::{LOCKED, NO_TAT};
use super::{Inner, SHARDS, Shard, TWEAK, read};
use crate::bucket::{BucketCheck, BucketSettle, LimitName};
use crate::rule::Rule;
use crate::storage::{Decided, StorageError};
use crate::sync::{self, spin};

impl Inner {
    /// The bucket's name: a keyed SipHash-1-3 of the partition, tweaked by
    /// the limit's fixed id (spread by an odd constant). Without the key no
    /// partition can be aimed at another's name; two limits of one
    /// partition differ by their tweak.
    /// Returns the name and its shard (picked by the partition's hash).
    #[inline]
    pub(super) fn name(&self, check: &BucketCheck<'_>) -> (u64, usize) {
        self.name_of(check.limit_name(), check.partition())
    }

    /// [`name`](Self::name) of bucket (`limit`, `partition`).
    #[inline]
    pub(super) fn name_of(
        &self,
        limit: &LimitName,
        partition: &str,
    ) -> (u64, usize) {
        let hash = self.hasher.hash(partition.as_bytes());
        let name = hash ^ limit.id().wrapping_mul(TWEAK);
        (name, Self::shard_index(hash))
    }

    /// A partition's hash made the bucket's name by the limit's tweak.
    #[inline]
    pub(super) fn tweak(hash: u64, check: &BucketCheck<'_>) -> u64 {
        hash ^ check.limit_name().id().wrapping_mul(TWEAK)
    }

    /// The shard of a partition's hash: one per partition, whatever the
    /// limit, so that one user's buckets share a shard.
    #[inline]
    pub(super) fn shard_index(hash: u64) -> usize {
        // Bits 32..38: the table uses the low bits and the top 7 of names.
        (hash >> 32) as usize % SHARDS
    }

    #[inline]
    pub(super) fn check(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        // One bucket is distinct and of the right length: nothing to
        // validate.
        if let ([check], [slot]) = (checks, &mut *out) {
            return self.decide_one(check, slot);
        }
        if checks.len() != out.len() {
            return Err(StorageError::LengthMismatch {
                checks: checks.len(),
                out: out.len(),
            });
        }
        let now = self.clock.now_us();
        let verdict = if checks.iter().all(BucketCheck::is_rate) {
            self.decide_many(checks, now, out)?
        } else if checks.iter().all(in_table) {
            self.decide_table(
                checks,
                now,
                out,
                false,
                &mut |now, keep| self.spare_window(now, keep),
                None,
            )?
        } else {
            self.decide_kinds(checks, now, out)?
        };
        Ok(Decided::new(verdict, Some(now), "memory"))
    }

    /// The hot path: one bucket, one hash, one clock read, one
    /// compare-and-swap loop under the shard's read lock.
    #[inline(always)]
    pub(super) fn decide_one(
        &self,
        check: &BucketCheck<'_>,
        out: &mut Decision,
    ) -> Result<Decided, StorageError> {
        // Every single check comes here (`check_sync`, `check_one`): a
        // window or a period is never decided as a rate.
        match check.rule() {
            Rule::Rate(_) => {}
            Rule::Period(period) => {
                let now = self.clock.now_us();
                let verdict =
                    self.decide_period_one(&period, check, now, out)?;
                return Ok(Decided::new(verdict, Some(now), "memory"));
            }
            Rule::Concurrency(concurrency) => {
                let verdict = self.take_alone(&concurrency, check, out)?;
                let now = self.clock.now_us();
                return Ok(Decided::new(verdict, Some(now), "memory"));
            }
            // Every other kind: the table of kinds (`kinds.rs`).
            _ => return self.decide_kind_alone(check, out),
        }
        let now;
        (*out, now) = self.decide_rate(
            check.limit_name(),
            check.partition(),
            &check.quota(),
            check.cost(),
        )?;
        let verdict =
            Verdict::of([check.is_shadow()], std::slice::from_ref(out));
        Ok(Decided::new(verdict, Some(now), "memory"))
    }

    /// A rate's bucket (`limit`, `partition`) charged `cost` (0: a peek),
    /// and the time it was decided at. Returned by value, not written
    /// through a reference: inlined, the decision stays in registers
    /// (a copy of it through memory stalls on store forwarding).
    #[inline(always)]
    pub(super) fn decide_rate(
        &self,
        limit: &LimitName,
        partition: &str,
        quota: &Quota,
        cost: u32,
    ) -> Result<(Decision, u64), StorageError> {
        let (name, shard) = self.name_of(limit, partition);
        let shard = &self.shards[shard];
        let now = self.clock.now_us();
        let table = read(&shard.table);
        let decision = match table.find(name) {
            Some(entry) => decide_in_place(&entry.tat, *quota, cost, now)?,
            None => {
                drop(table);
                let check = BucketCheck::new(limit, partition, *quota, cost)?;
                let mut out = Decision::default();
                self.decide_new(&check, name, shard, now, &mut out)?;
                out
            }
        };
        Ok((decision, now))
    }

    /// One window, alone.
    #[cold]
    #[inline(never)]
    pub(super) fn decide_kind_alone(
        &self,
        check: &BucketCheck<'_>,
        out: &mut Decision,
    ) -> Result<Decided, StorageError> {
        let now = self.clock.now_us();
        let verdict = match self.decide_live_alone(check, now, out)? {
            Some(verdict) => verdict,
            None => self.decide_kinds(
                std::slice::from_ref(check),
                now,
                std::slice::from_mut(out),
            )?,
        };
        Ok(Decided::new(verdict, Some(now), "memory"))
    }

    /// A bucket the table does not hold yet.
    #[cold]
    pub(super) fn decide_new(
        &self,
        check: &BucketCheck<'_>,
        name: u64,
        shard: &Shard,
        now: u64,
        out: &mut Decision,
    ) -> Result<(), StorageError> {
        // A new bucket is a full one: decide before taking the write lock,
        // so that a refusal or a peek stores nothing (and evicts no one).
        decide_alone(check, None, now, out)?;
        let Some(store) = out.store else {
            return Ok(());
        };
        let mut room = self.room_for(shard, name, now, &[])?;
        // Another thread may have created it in between.
        match room.table.find(name) {
            Some(entry) => {
                *out = decide_in_place(
                    &entry.tat,
                    check.quota(),
                    check.cost(),
                    now,
                )?;
            }
            None => room.table.insert(name, store.tat_us),
        }
        self.made(room);
        Ok(())
    }

    pub(super) fn settle(
        &self,
        settle: &BucketSettle<'_>,
        now: u64,
    ) -> Result<(), StorageError> {
        let bucket = &settle.bucket;
        if !bucket.is_rate() {
            return Err(StorageError::Unsupported(
                "settling a window or a period (only a rate is settled)",
            ));
        }
        let (name, index) = self.name(bucket);
        let shard = &self.shards[index];
        {
            let table = read(&shard.table);
            if let Some(entry) = table.find(name) {
                return settle_in_place(&entry.tat, settle, now);
            }
        }
        // A missing bucket is full: a refund has nothing to give back.
        let settled = bucket.quota().settle(None, now, settle.adjust)?;
        let Write::Set(store) = settled.write else {
            return Ok(());
        };
        let mut room = self.room_for(shard, name, now, &[])?;
        match room.table.find(name) {
            // Made by another thread in between.
            Some(entry) => settle_in_place(&entry.tat, settle, now)?,
            None => room.table.insert(name, store.tat_us),
        }
        self.made(room);
        Ok(())
    }
}

/// The stored word a cell holds, if any. As a rate's TAT, a period's word
/// (bit 62 set) is beyond `MAX_TIME_US`, which gcra-core reads as absent.
pub(super) fn stored(word: u64) -> Option<u64> {
    (word != NO_TAT).then_some(word)
}

/// Whether `check`'s bucket lives in the table: a rate or a period.
pub(super) fn in_table(check: &BucketCheck<'_>) -> bool {
    matches!(check.rule(), Rule::Rate(_) | Rule::Period(_))
}

/// One bucket's decision: [`gcra_core::check_all`] of one charge, without
/// its loops.
pub(super) fn decide_alone(
    check: &BucketCheck<'_>,
    stored: Option<u64>,
    now: u64,
    out: &mut Decision,
) -> Result<(), StorageError> {
    let quota = check.quota();
    *out = match check.cost() {
        0 => quota.peek(stored, now),
        cost => quota.check(stored, now, cost),
    }?;
    Ok(())
}

/// One compare-and-swap loop: the decision is applied only if the TAT it
/// was made from is still the stored one.
#[inline(always)]
pub(super) fn decide_in_place(
    tat: &sync::AtomicU64,
    quota: Quota,
    cost: u32,
    now: u64,
) -> Result<Decision, StorageError> {
    // Inlined into the caller's path: the plain check is the hot path.
    rewrite_in_place(
        tat,
        #[inline(always)]
        |current| {
            let decision = match cost {
                0 => quota.peek(current, now),
                cost => quota.check(current, now, cost),
            }?;
            Ok((write_of(&decision), decision))
        },
    )
}

/// What `decision` writes to its bucket.
#[inline(always)]
pub(super) fn write_of(decision: &Decision) -> Write {
    decision.store.map_or(Write::Keep, Write::Set)
}

pub(super) fn settle_in_place(
    tat: &sync::AtomicU64,
    settle: &BucketSettle<'_>,
    now: u64,
) -> Result<(), StorageError> {
    let quota = settle.bucket.quota();
    rewrite_in_place(tat, |current| {
        Ok((quota.settle(current, now, settle.adjust)?.write, ()))
    })
}

/// Rewrites a bucket's TAT by `write` of the stored one, in a
/// compare-and-swap loop that waits out a joint decision's lock bit: what
/// `write` answered with the write that was applied.
#[inline(always)]
pub(super) fn rewrite_in_place<T>(
    tat: &sync::AtomicU64,
    mut write: impl FnMut(Option<u64>) -> Result<(Write, T), StorageError>,
) -> Result<T, StorageError> {
    let mut current = tat.load(Ordering::Acquire);
    loop {
        if current & LOCKED != 0 {
            // A joint decision holds the bucket for a few instructions.
            spin(0);
            current = tat.load(Ordering::Acquire);
            continue;
        }
        let (write, answer) = write(stored(current))?;
        let next = match write {
            Write::Keep => return Ok(answer),
            Write::Set(store) => store.tat_us,
            Write::Clear => NO_TAT,
        };
        match tat.compare_exchange_weak(
            current,
            next,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => return Ok(answer),
            Err(actual) => current = actual,
        }
    }
}
