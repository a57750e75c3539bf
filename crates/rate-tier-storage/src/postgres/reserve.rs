//! Reservations on PostgreSQL ([`StorageExt::reserve`](crate::StorageExt::reserve),
//! [`StorageExt::cancel`](crate::StorageExt::cancel)): `<table>_reserve` and
//! `<table>_cancel` (migration.sql), one call each.
//!
//! A reservation is [`gcra_core::reserve_all`] in one function call, on
//! the database's clock read once its buckets are locked (the locks of a
//! check, in the same order: a check and a reservation over the same rows
//! wait for each other and never deadlock). It is sent once, in a task, as
//! a check is (see `job.rs`): never retried, and given back when its reply
//! comes after its caller left.

use std::time::Duration;

use gcra_core::{Decision, JointReservation, MAX_TIME_US, StoreTat};

use super::args::{check_args, int8};
use super::job::{self, Call};
use super::schema::Schema;
use super::{InvalidTable, PostgresStorage};
use crate::bucket::{BucketCancel, BucketCheck};
use crate::key::KeyLayout;
use crate::storage::{Decided, StorageError, only_rates, validate_reservation};

impl PostgresStorage {
    /// The statement of a reservation: `$1` the keys, `$2` 5 arguments per
    /// key (as [`BucketCheck::script_args`]), `$3` the caller's wait (see
    /// [`reserve_wait_arg`](Self::reserve_wait_arg)); at the database's
    /// clock as the store sends it, or with the time as its parameter `$4`
    /// (µs since the epoch) for the tests that drive time. Its reply is
    /// read by [`read_reservation`](Self::read_reservation). For tests.
    ///
    /// ```
    /// use rate_tier_storage::PostgresStorage;
    /// let sql = PostgresStorage::reserve_sql("rate_tier_buckets", false)?;
    /// assert!(sql.contains("rate_tier_buckets_reserve($1::text[], $2::int8[], $3::int8)"));
    /// # Ok::<(), rate_tier_storage::InvalidTable>(())
    /// ```
    #[doc(hidden)]
    pub fn reserve_sql(
        table: &str,
        time_as_parameter: bool,
    ) -> Result<String, InvalidTable> {
        let schema = Schema::new(table)?;
        Ok(if time_as_parameter {
            format!(
                "SELECT {table}_reserve_at($1::text[], $2::int8[], $3::int8, $4::int8)"
            )
        } else {
            schema.reserve
        })
    }

    /// The statement that gives reservations back: `$1` the keys, `$2` 3
    /// arguments per key (`T`, the cost, the TAT the reservation wrote);
    /// at the database's clock, or with the time as its parameter `$3`.
    /// Its reply: per key 0 (kept), 1 (moved back) or 2 (cleared). For
    /// tests.
    #[doc(hidden)]
    pub fn cancel_sql(
        table: &str,
        time_as_parameter: bool,
    ) -> Result<String, InvalidTable> {
        let schema = Schema::new(table)?;
        Ok(if time_as_parameter {
            format!(
                "SELECT {table}_cancel_at($1::text[], $2::int8[], $3::int8)"
            )
        } else {
            schema.cancel
        })
    }

    /// The caller's wait as the reservation function takes it: at most
    /// 2^53 µs (any wait beyond every quota's most is the same). For tests.
    ///
    /// ```
    /// use rate_tier_storage::PostgresStorage;
    /// assert_eq!(PostgresStorage::reserve_wait_arg(250_000), 250_000);
    /// assert_eq!(PostgresStorage::reserve_wait_arg(u64::MAX), 1 << 53);
    /// ```
    #[doc(hidden)]
    pub fn reserve_wait_arg(max_wait_us: u64) -> i64 {
        i64::try_from(max_wait_us.min(MAX_TIME_US)).unwrap_or(i64::MAX)
    }

    /// Reads the reservation function's reply into `out` (5 non-negative
    /// integers per key, then 5), each decision's `store` the TAT written
    /// (its expiry from the function's now), and returns the reservation
    /// and the function's now. `max_wait_us` is the caller's wait, before
    /// [`reserve_wait_arg`](Self::reserve_wait_arg) bounded it. For tests.
    ///
    /// # Errors
    ///
    /// A reply of another length, or with a value out of its range
    /// ([`StorageError::Protocol`]).
    ///
    /// ```
    /// use gcra_core::Decision;
    /// use rate_tier_storage::PostgresStorage;
    /// // One key, reserved 100 ms from now (set by key 1), its TAT written
    /// // 200 ms ahead; the most wait 1 s.
    /// let now = 1_000_000;
    /// let reply = [1, 0, 0, 200_000, now + 200_000, 1, 100_000, 1, 1_000_000, now];
    /// let mut out = [Decision::default()];
    /// let (joint, at) = PostgresStorage::read_reservation(&reply, 5_000_000, &mut out)?;
    /// assert!(joint.reserved);
    /// assert_eq!((joint.wait_us, joint.by, joint.most_us, at), (100_000, Some(0), 1_000_000, 1_000_000));
    /// assert_eq!(out[0].store.map(|s| (s.tat_us, s.ttl_ms)), Some((1_200_000, 200)));
    /// # Ok::<(), rate_tier_storage::StorageError>(())
    /// ```
    #[doc(hidden)]
    pub fn read_reservation(
        reply: &[i64],
        max_wait_us: u64,
        out: &mut [Decision],
    ) -> Result<(JointReservation, u64), StorageError> {
        let n = out.len();
        let bad = || {
            StorageError::Protocol(format!(
                "the reservation function returned {reply:?} for {n} keys"
            ))
        };
        let numbers: Vec<u64> = reply
            .iter()
            .map(|&v| u64::try_from(v))
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        if numbers.len() != n.saturating_add(1).saturating_mul(5) {
            return Err(bad());
        }
        let (per_key, tail) = numbers.split_at(n.saturating_mul(5));
        let &[reserved, wait_us, by, most_us, now_us] = tail else {
            return Err(bad());
        };
        let flag = |value: u64| match value {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(bad()),
        };
        for (slot, v) in out.iter_mut().zip(per_key.chunks_exact(5)) {
            *slot = Decision {
                allowed: flag(v[0])?,
                remaining: v[1],
                retry_after_us: v[2],
                reset_after_us: v[3],
                store: (v[4] > 0).then(|| StoreTat {
                    tat_us: v[4],
                    ttl_ms: v[4].saturating_sub(now_us).div_ceil(1000),
                }),
            };
        }
        let by = match usize::try_from(by) {
            Ok(0) => None,
            Ok(position) if position <= n => Some(position - 1),
            _ => return Err(bad()),
        };
        // The wait was sent bounded: left as sent, it is the caller's.
        let sent = max_wait_us.min(MAX_TIME_US);
        let most_us = if most_us == sent {
            max_wait_us
        } else {
            most_us
        };
        let joint = JointReservation {
            reserved: flag(reserved)?,
            wait_us,
            by,
            most_us,
        };
        Ok((joint, now_us))
    }

    /// [`StorageExt::reserve`](crate::StorageExt::reserve): one call of the
    /// reservation function.
    pub(super) async fn reserve_rates(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        let max_wait_us = validate_reservation(checks, out, max_wait)?;
        if checks.is_empty() {
            return Ok(Decided::reserved_at_once(max_wait_us, "postgres"));
        }
        let keys: Vec<String> =
            checks.iter().map(|c| c.key(KeyLayout::Single)).collect();
        let args = check_args(checks)?;
        let wait = Self::reserve_wait_arg(max_wait_us);
        let reply = job::reserve(&self.inner, keys, args, wait).await?;
        let (joint, now) = Self::read_reservation(&reply, max_wait_us, out)?;
        // The database's clock, as for a check: not this process's; given
        // apart, for a caller that compares clocks (a shaper).
        Ok(Decided::of_reservation(&joint, None, "postgres")
            .with_store_clock(now))
    }

    /// [`StorageExt::cancel`](crate::StorageExt::cancel): one call of the cancel
    /// function, every bucket compared and moved back on its own.
    pub(super) async fn cancel_rates(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Result<(), StorageError> {
        let mut keys = Vec::with_capacity(reserved.len());
        let mut args = Vec::with_capacity(reserved.len() * 3);
        for cancel in reserved {
            only_rates(std::slice::from_ref(&cancel.bucket))?;
            // A TAT beyond int8 is no stored one: nothing to give back.
            let Ok(tat) = i64::try_from(cancel.tat_us) else {
                continue;
            };
            let t = int8(cancel.bucket.quota().emission_interval_us())?;
            keys.push(cancel.bucket.key(KeyLayout::Single));
            args.extend([t, i64::from(cancel.bucket.cost()), tat]);
        }
        if keys.is_empty() {
            return Ok(());
        }
        job::run(&self.inner, Call::Cancel, keys, args)
            .await
            .map(drop)
    }
}
