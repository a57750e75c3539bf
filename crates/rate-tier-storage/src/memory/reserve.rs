//! Reservations ([`StorageExt::reserve`](crate::StorageExt::reserve)): the same
//! buckets and locks as a check, judged by [`gcra_core::reserve_all`].
//!
//! One bucket is reserved by a compare-and-swap loop on its TAT, as a check
//! is (by its check alone when it passes now: nothing waits); several by
//! the joint path's lock bits ([`Reserving`]). A reservation
//! too long writes nothing, so, like a refusal, it never makes a bucket.

use std::cell::Cell;
use std::time::Duration;

use gcra_core::{Decision, JointReservation, Verdict, Write};

use super::decide::write_of;
use super::joint::{Judge, Reserving};
use super::{Inner, MemoryStorage, read, rewrite_in_place};
use crate::bucket::{BucketCancel, BucketCheck};
use crate::storage::{
    Decided, StorageError, micros, only_rates, validate_reservation,
};
use crate::sync::AtomicU64;

impl MemoryStorage {
    /// The same as [`StorageExt::reserve`](crate::StorageExt::reserve),
    /// synchronously.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rate_tier_storage::{BucketCheck, Decision, LimitName, MemoryStorage, Quota};
    /// use rate_tier_storage::clock::FakeClock;
    /// let store = MemoryStorage::with_clock(FakeClock::at_us(0));
    /// let name = LimitName::new("provider")?;
    /// let quota = Quota::per_second(10).allow_burst(1).allow_debt(Duration::from_secs(1));
    /// let check = [BucketCheck::new(&name, "", quota, 1)?];
    /// let mut out = [Decision::default()];
    /// let waits: Vec<u64> = (0..2)
    ///     .map(|_| store.reserve_sync(&check, Duration::from_millis(150), &mut out).map(|d| d.wait_us))
    ///     .collect::<Result<_, _>>()?;
    /// assert_eq!(waits, [0, 100_000]);
    /// // The third would wait 200 ms, longer than 150 ms: not reserved.
    /// let third = store.reserve_sync(&check, Duration::from_millis(150), &mut out)?;
    /// assert!(!third.verdict.allowed);
    /// assert_eq!(third.wait_us, 200_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// A reservation of one rate that passes at once is decided inline in
    /// the caller, as [`check_sync`](Self::check_sync) decides a check.
    #[inline(always)]
    pub fn reserve_sync(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        if let ([check], [slot]) = (checks, &mut *out)
            && let Some(decided) = self.reserve_at_once(check, max_wait, slot)
        {
            return Ok(decided);
        }
        self.inner.reservation(checks, max_wait, out)
    }

    /// One rate, held, that passes now: its check is the reservation
    /// (`reserve_all` at a wait of 0, a shadow's pass included), written in
    /// one compare-and-swap loop only on a pass. `None`, with nothing
    /// written (not even the cap of a TAT from a clock that went back), for
    /// anything else (a cost of 0 fails the check): the full path decides
    /// it. A period's count, in the same table, is never read as a TAT.
    #[inline(always)]
    fn reserve_at_once(
        &self,
        check: &BucketCheck<'_>,
        max_wait: Duration,
        out: &mut Decision,
    ) -> Option<Decided> {
        if !check.is_rate() {
            return None;
        }
        let inner = &*self.inner;
        let (name, index) = inner.name(check);
        let now = inner.clock.now_us();
        let quota = check.quota();
        let table = read(&inner.shards[index].table);
        let entry = table.find(name)?;
        // An error (a cost above the burst) is the full path's to answer.
        let passed = rewrite_in_place(&entry.tat, |current| {
            let decision = quota.check(current, now, check.cost())?;
            Ok(match decision.allowed {
                true => (write_of(&decision), Some(decision)),
                false => (Write::Keep, None),
            })
        })
        .ok()??;
        *out = passed;
        let joint = JointReservation {
            reserved: true,
            wait_us: 0,
            by: None,
            most_us: micros(max_wait).min(quota.max_wait_us()),
        };
        Some(
            Decided::of_reservation(&joint, Some(now), "memory")
                .with_store_clock(now),
        )
    }

    /// The same as [`StorageExt::cancel`](crate::StorageExt::cancel),
    /// synchronously.
    pub fn cancel_sync(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Result<(), StorageError> {
        let now = self.inner.clock.now_us();
        reserved
            .iter()
            .try_for_each(|cancel| self.inner.cancel(cancel, now))
    }
}

impl Inner {
    #[inline(never)]
    fn reservation(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        let max_wait_us = validate_reservation(checks, out, max_wait)?;
        let now = self.clock.now_us();
        let joint = Cell::new(None);
        let judge = Reserving {
            max_wait_us,
            joint: &joint,
        };
        match (checks, &mut *out) {
            ([check], [slot]) => self.reserve_one(check, now, slot, judge)?,
            _ => self.judge_many(checks, now, out, judge)?,
        };
        let joint = joint.get().ok_or_else(|| {
            StorageError::Protocol(
                "memory storage: a reservation was not judged".into(),
            )
        })?;
        Ok(Decided::of_reservation(&joint, Some(now), "memory")
            .with_store_clock(now))
    }

    /// One bucket: a compare-and-swap loop when the table holds it; else a
    /// full bucket, made only if the reservation writes it.
    fn reserve_one(
        &self,
        check: &BucketCheck<'_>,
        now: u64,
        out: &mut Decision,
        judge: Reserving<'_>,
    ) -> Result<Verdict, StorageError> {
        let (name, index) = self.name(check);
        let shard = &self.shards[index];
        {
            let table = read(&shard.table);
            if let Some(entry) = table.find(name) {
                return judge_in_place(&entry.tat, check, now, out, judge);
            }
        }
        let verdict = judge_one(check, None, now, out, judge)?;
        let Some(store) = out.store else {
            return Ok(verdict);
        };
        let mut room = self.room_for(shard, name, now, &[])?;
        let verdict = match room.table.find(name) {
            // Made by another thread in between.
            Some(entry) => judge_in_place(&entry.tat, check, now, out, judge)?,
            None => {
                room.table.insert(name, store.tat_us);
                verdict
            }
        };
        self.made(room);
        Ok(verdict)
    }

    fn cancel(
        &self,
        cancel: &BucketCancel<'_>,
        now: u64,
    ) -> Result<(), StorageError> {
        only_rates(std::slice::from_ref(&cancel.bucket))?;
        let (name, index) = self.name(&cancel.bucket);
        let table = read(&self.shards[index].table);
        // A bucket the table no longer holds is full: nothing to give back.
        if let Some(entry) = table.find(name) {
            rewrite_in_place(&entry.tat, |tat| {
                Ok((cancel.write(tat, now), ()))
            })?;
        }
        Ok(())
    }
}

fn judge_one(
    check: &BucketCheck<'_>,
    stored: Option<u64>,
    now: u64,
    out: &mut Decision,
    judge: Reserving<'_>,
) -> Result<Verdict, StorageError> {
    judge.judge(&[check.charge()], &[stored], now, std::slice::from_mut(out))
}

/// A compare-and-swap loop: the reservation is written only if the TAT it
/// was judged on is still the stored one.
fn judge_in_place(
    tat: &AtomicU64,
    check: &BucketCheck<'_>,
    now: u64,
    out: &mut Decision,
    judge: Reserving<'_>,
) -> Result<Verdict, StorageError> {
    rewrite_in_place(tat, |current| {
        let judged = judge_one(check, current, now, out, judge)?;
        Ok((write_of(out), judged))
    })
}
