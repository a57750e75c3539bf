//! What [`RedisStorage`] does per call: the [`Storage`] trait's decisions,
//! settlements, releases and renewals of slots, reservations and resets,
//! each bounded by the store's timeout, on a single Redis or a cluster.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionManager;
use ::redis::{RedisError, Value};
use gcra_core::{Decision, Lease, Verdict};

use super::job::{self, Job};
use super::link::Conn;
use super::reply::{read_counts, read_settled};
use super::script::{self, Call};
use super::{REMEMBERED, RedisStorage, cluster, reserve, reset};
use crate::bucket::{BucketCancel, BucketCheck, BucketSettle};
use crate::event::{StorageEvent, StorageListener, Subscription};
use crate::key;
use crate::rule::Rule;
use crate::storage::{
    Adjustment, Answer, Capabilities, Decided, Mode, Storage, StorageError,
    only_rates, validate, validate_reservation,
};

impl RedisStorage {
    /// Settles `settles` (their keys in `keys`), each call within the
    /// store's timeout; a refund forgets the bucket's remembered refusal.
    async fn settle_all(
        &self,
        keys: &[String],
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        let conn = self.shared.link.current();
        match &*conn {
            Conn::Single(conn) => {
                let adjusts: Vec<(gcra_core::Quota, gcra_core::Adjust)> =
                    settles
                        .iter()
                        .map(|s| (s.bucket.quota(), s.adjust))
                        .collect();
                let call =
                    Call::settle(keys.iter().map(String::as_str), &adjusts);
                let reply =
                    script::within(self.timeout, run_single(conn, &call))
                        .await?;
                read_settled(call.lua, reply, settles.len()).map(drop)?;
            }
            Conn::Cluster(conn) => {
                cluster::settle(conn, keys, settles, self.timeout).await?;
            }
        }
        for (key, settle) in keys.iter().zip(settles) {
            if matches!(settle.adjust, gcra_core::Adjust::Refund(n) if n > 0) {
                self.shared.refusals.forget(key);
            }
        }
        Ok(())
    }

    /// Releases (`renew` `None`) or renews for a lease the slots of
    /// `slots`, each within the store's timeout: see
    /// [`StorageExt::release`](crate::StorageExt::release) and
    /// [`StorageExt::renew`](crate::StorageExt::renew).
    async fn slot_call(
        &self,
        slots: &[BucketCheck<'_>],
        renew: Option<Lease>,
    ) -> Result<(), StorageError> {
        let mut keys = Vec::with_capacity(slots.len());
        let mut taken = Vec::with_capacity(slots.len());
        for check in slots {
            if !matches!(check.rule(), Rule::Concurrency(_)) {
                return Err(StorageError::Unsupported(
                    "releasing or renewing a bucket that is not a concurrency limit",
                ));
            }
            // No id, or no cost: no slot was taken (see `check`).
            if check.cost() > 0 && check.lease() != 0 {
                keys.push(check.key(self.layout()));
                taken.push((check.lease(), check.cost()));
            }
        }
        if keys.is_empty() {
            return Ok(());
        }
        let call = async {
            match &*self.shared.link.current() {
                Conn::Single(conn) => {
                    // One key's few slots: a plain ZREM.
                    if let (None, [key], [one]) = (renew, &*keys, &*taken)
                        && let Some(released) = script::release_by_zrem(
                            &mut conn.clone(),
                            key,
                            *one,
                            self.timeout,
                        )
                        .await
                    {
                        return released.map(drop);
                    }
                    let keys = keys.iter().map(String::as_str);
                    let call = match renew {
                        Some(lease) => Call::renew(keys, &taken, lease),
                        None => Call::release(keys, &taken),
                    };
                    let reply =
                        script::within(self.timeout, run_single(conn, &call))
                            .await?;
                    read_counts(call.lua, reply, taken.len()).map(drop)
                }
                Conn::Cluster(conn) => cluster::slots(
                    &self.shared,
                    conn,
                    &keys,
                    &taken,
                    renew,
                    self.timeout,
                )
                .await
                .map(drop),
            }
        };
        self.bounded(call).await
    }

    /// Runs `call` within the store's timeout, keeping count of the
    /// timeouts in a row: past `rebuild_after`, a new connection.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StorageError>>,
    ) -> Result<T, StorageError> {
        let shared = &*self.shared;
        let result = match tokio::time::timeout(self.timeout, call).await {
            // redis-rs's own timeout (a cluster node's) is ours too.
            Ok(Err(StorageError::Backend(error)))
                if error
                    .downcast_ref::<::redis::RedisError>()
                    .is_some_and(::redis::RedisError::is_timeout) =>
            {
                Err(StorageError::Timeout(self.timeout))
            }
            Ok(result) => result,
            Err(_) => Err(StorageError::Timeout(self.timeout)),
        };
        match &result {
            Err(StorageError::Timeout(_)) => {
                if shared.link.timed_out(self.rebuild_after) {
                    shared.listeners.emit_with(|| StorageEvent::Reconnected {
                        cause: format!(
                            "{} timeouts in a row",
                            self.rebuild_after
                        ),
                    });
                }
            }
            Err(StorageError::Backend(_)) => {}
            _ => shared.link.answered(),
        }
        if result.as_ref().is_err_and(StorageError::is_failure)
            && let Some(slots) = &shared.slots
        {
            slots.failed();
        }
        result
    }
}

/// Runs `call` on a single Redis: `EVALSHA`, and on `NOSCRIPT` redis-rs's
/// `SCRIPT LOAD` and `EVALSHA` again.
pub(super) async fn run_single(
    conn: &ConnectionManager,
    call: &Call<'_>,
) -> Result<Value, RedisError> {
    let mut conn = conn.clone();
    match call.invocation().invoke_async(&mut conn).await {
        // The connection manager hands back the result of the reconnection
        // it started after the last failure; after an outage that is a
        // stale "refused" while Redis may be up again. Nothing was sent, so
        // one retry is safe (a retry after a dropped connection could charge
        // twice, so only refusals are retried), all within the same timeout.
        Err(error) if error.is_connection_refusal() => {
            call.invocation().invoke_async(&mut conn).await
        }
        result => result,
    }
}

impl RedisStorage {
    /// Runs `gcra.lua` (one bucket) or `gcra_all.lua` (several, a peek, a
    /// shadow limit) on the buckets of rates, and `decide_mixed.lua` on a
    /// decision with a window, a period or a concurrency limit.
    ///
    /// Errors: [`StorageError::Timeout`] past the timeout,
    /// [`StorageError::Backend`] for any error of Redis or of the connection
    /// (the script's error replies included), [`StorageError::Protocol`] for
    /// a reply that is not four non-negative integers per bucket,
    /// [`StorageError::Unsupported`] for a concurrency limit's slots taken
    /// without an id ([`BucketCheck::lease_id`]), and on a cluster for
    /// windows, periods and concurrency limits of one decision in two
    /// slots.
    async fn check_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        validate(checks, out)?;
        let mixed = !checks.iter().all(BucketCheck::is_rate);
        if mixed
            && checks.iter().any(|check| {
                matches!(check.rule(), Rule::Concurrency(_))
                    && check.cost() > 0
                    && check.lease() == 0
            })
        {
            return Err(StorageError::Unsupported(
                "concurrency slots on Redis without a slot id (BucketCheck::lease_id)",
            ));
        }
        let job = Job::of(checks, self.layout(), mixed, self.lease);
        if mixed && self.shared.cluster {
            cluster::one_slot_of_kinds(&job)?;
        }
        let refusals = &self.shared.refusals;
        let sent_us = self.clock.now_us();
        if self.remember_refusals
            && self.shared.resets.fresh()
            && let Some(index) =
                refusals.answer(checks, &job.keys, sent_us, out)
        {
            let verdict = Verdict {
                allowed: false,
                retry_after_us: out[index].retry_after_us,
                refused_by: Some(index),
            };
            return Ok(
                Decided::new(verdict, None, REMEMBERED).without_backend()
            );
        }
        let keys = job.keys.clone();
        let decided = self
            .bounded(job::decide(&self.shared, job, self.timeout))
            .await?;
        out.copy_from_slice(&decided);
        let verdict = Verdict::of(checks.iter().map(|c| c.is_shadow()), out);
        if self.remember_refusals
            && let Some(index) = verdict.refused_by
        {
            refusals.remember(checks, &keys, out, index, sent_us);
        }
        Ok(Decided::new(verdict, None, "redis"))
    }

    /// Runs `gcra_settle.lua` on the buckets, within the timeout.
    async fn settle_buckets(
        &self,
        settles: &[BucketSettle<'_>],
    ) -> Result<(), StorageError> {
        let layout = self.layout();
        let keys: Vec<String> =
            settles.iter().map(|s| s.bucket.key(layout)).collect();
        self.bounded(self.settle_all(&keys, settles)).await
    }

    /// Gives back the slots each check's request took under its id
    /// ([`BucketCheck::lease_id`]): exactly those members, by a plain
    /// `ZREM` when one concurrency limit holds at most 64 of them (the
    /// common release: no script), else by `release.lua` (one call; on a
    /// cluster one per slot), within the timeout. A key of another type
    /// holds none of them and releases nothing. A check
    /// without an id or a cost took nothing, and is skipped; a bucket that
    /// is not a concurrency limit is [`StorageError::Unsupported`].
    async fn release_slots(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.slot_call(slots, None).await
    }

    /// Sets the expiry of the slots each check's request still holds to
    /// now + the lease (Redis's `TIME`): `renew.lua`, within the timeout. A
    /// slot already expired is not taken again.
    async fn renew_slots(
        &self,
        slots: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        self.slot_call(slots, Some(self.lease)).await
    }

    /// Runs `reserve.lua` ([`gcra_core::reserve_all`] on Redis's `TIME`)
    /// on the buckets, within the timeout, in a task of its own as a check
    /// is (see [Reservations](RedisStorage#reservations)). Each decision's
    /// `store` is the TAT the script wrote, what
    /// [`StorageExt::cancel`](crate::StorageExt::cancel) compares (a
    /// reservation is the allowed decisions with a cost; a refused shadow
    /// limit's `store` is only a capped TAT); `now_us` is `None` (Redis's
    /// clock). Errors as for a check, and [`StorageError::Unsupported`] for
    /// a window, a period or a concurrency limit, and on a cluster for
    /// buckets in two slots.
    async fn reserve_buckets(
        &self,
        checks: &[BucketCheck<'_>],
        max_wait: Duration,
        out: &mut [Decision],
    ) -> Result<Decided, StorageError> {
        let max_wait_us = validate_reservation(checks, out, max_wait)?;
        if checks.is_empty() {
            return Ok(Decided::reserved_at_once(max_wait_us, "redis"));
        }
        let layout = self.layout();
        let job = reserve::Reservation {
            keys: checks.iter().map(|c| c.key(layout)).collect(),
            charges: checks.iter().map(BucketCheck::charge).collect(),
            max_wait_us,
        };
        if self.shared.cluster {
            reserve::one_slot(&job.keys)?;
        }
        let (decided, joint, redis_now_us) = self
            .bounded(reserve::reserve(&self.shared, job, self.timeout))
            .await?;
        out.copy_from_slice(&decided);
        Ok(Decided::of_reservation(&joint, None, "redis")
            .with_store_clock(redis_now_us))
    }

    /// Runs `cancel.lua` ([`gcra_core::Quota::cancel`] on Redis's `TIME`)
    /// on the buckets, within the timeout: one call, or one per slot on a
    /// cluster. Not retried inside the call; a cancel is safe to send
    /// again (once moved back, the stored TAT is no longer the reserved
    /// one, and a second cancel keeps it).
    async fn cancel_reservations(
        &self,
        reserved: &[BucketCancel<'_>],
    ) -> Result<(), StorageError> {
        for cancel in reserved {
            only_rates(std::slice::from_ref(&cancel.bucket))?;
        }
        if reserved.is_empty() {
            return Ok(());
        }
        let call = reserve::cancel(
            &self.shared,
            reserved,
            self.layout(),
            self.timeout,
        );
        self.bounded(call).await
    }

    /// One `DEL` of the buckets' keys (per hash slot on a cluster); their
    /// remembered refusals forgotten here.
    async fn reset_buckets(
        &self,
        buckets: &[BucketCheck<'_>],
    ) -> Result<(), StorageError> {
        let call =
            reset::reset(&self.shared, buckets, self.layout(), self.timeout);
        self.bounded(call).await
    }
}

impl Storage for RedisStorage {
    fn decide<'a>(
        &'a self,
        checks: &'a [BucketCheck<'a>],
        mode: Mode,
        out: &'a mut [Decision],
    ) -> Answer<'a, Decided> {
        match mode {
            Mode::Check => Answer::pending(self.check_buckets(checks, out)),
            Mode::Reserve { max_wait } => {
                Answer::pending(self.reserve_buckets(checks, max_wait, out))
            }
        }
    }

    fn adjust<'a>(&'a self, adjustment: Adjustment<'a>) -> Answer<'a, ()> {
        Answer::pending(async move {
            match adjustment {
                Adjustment::Settle(settles) => {
                    self.settle_buckets(settles).await
                }
                Adjustment::Cancel(reserved) => {
                    self.cancel_reservations(reserved).await
                }
                Adjustment::Release(slots) => self.release_slots(slots).await,
                Adjustment::Renew(slots) => self.renew_slots(slots).await,
            }
        })
    }

    fn reset<'a>(&'a self, buckets: &'a [BucketCheck<'a>]) -> Answer<'a, ()> {
        Answer::pending(self.reset_buckets(buckets))
    }

    /// Every kind (`decide_mixed.lua`), reservations (`reserve.lua`,
    /// `cancel.lua`) and slots with a lease (a slot not renewed is free
    /// after it). On one Redis a decision spans partitions (it is one
    /// script); on a Redis Cluster it does not: windows, periods and
    /// concurrency limits of one decision must share a hash slot, and only
    /// one partition's buckets do (see
    /// [Redis Cluster](RedisStorage#redis-cluster)).
    ///
    /// ```
    /// use rate_tier_storage::{RedisStorage, Storage};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Neither connects before its first call.
    /// assert!(RedisStorage::from_url("redis://127.0.0.1:6390/")?.capabilities().spans_partitions);
    /// assert!(!RedisStorage::from_cluster_urls(["redis://127.0.0.1:6390/"])?.capabilities().spans_partitions);
    /// # Ok(()) }
    /// ```
    fn capabilities(&self) -> Capabilities {
        let mut redis = Capabilities::new("redis")
            .with_every_kind()
            .always_pending();
        redis.spans_partitions = !self.shared.cluster;
        redis.reserves = true;
        redis.lease = Some(self.lease_duration());
        redis
    }

    /// On a Redis Cluster, the master that owns the bucket's slot
    /// (`host:port`), once the slot map is read: a
    /// [`FallbackStorage`](crate::FallbackStorage) keeps a breaker per
    /// node. On one Redis, `None`: one domain.
    fn failure_domain(&self, check: &BucketCheck<'_>) -> Option<Arc<str>> {
        let slots = self.shared.slots.as_ref()?;
        slots.owner(key::cluster_slot(check.partition(), check.secret()))
    }

    fn subscribe(&self, listener: StorageListener) -> Subscription {
        self.shared.listeners.subscribe(listener)
    }
}
