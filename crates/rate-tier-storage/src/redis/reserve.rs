//! Reservations on Redis ([`StorageExt::reserve`](crate::StorageExt::reserve),
//! [`StorageExt::cancel`](crate::StorageExt::cancel)): `reserve.lua` and
//! `cancel.lua`, one call each on a single Redis, one per slot on a
//! cluster.
//!
//! A reservation is a write, sent the way a check is: in a task of its
//! own, retried only when the connection was refused (nothing was sent),
//! never after a reply was lost (it may have run: a second call would
//! reserve a second slot). A caller that stops waiting answered without
//! Redis, so when the reply comes after it left, the task gives the
//! reservation back (`cancel.lua`): exact while no later reservation or
//! pass was made in the bucket; else the slot stays taken (never handed out
//! twice) and is reported [`StorageEvent::Unrefunded`], as is a cancel that
//! fails. A reply that never comes leaves the reservation unknown, as a
//! check's charge.
//!
//! On a cluster a reservation is decided only in one slot (one user's
//! buckets are, by the hash tag): its slot is one instant on one clock for
//! every limit, and a reservation made in one slot could not be undone
//! exactly when another refuses ([`Quota::cancel`](gcra_core::Quota::cancel)
//! loses the slot after a later one), so over two slots it is
//! [`StorageError::Unsupported`] before anything is sent, as windows and
//! periods in two slots are.

use std::sync::Arc;
use std::time::Duration;

use gcra_core::{Charge, Decision, JointReservation};
use smallvec::SmallVec;

use super::link::Conn;
use super::reply::{read_counts, read_reservation};
use super::script::{Call, LATE_ANSWER, within};
use super::{Shared, cluster, run_single};
use crate::bucket::BucketCancel;
use crate::event::StorageEvent;
use crate::key::{self, KeyLayout};
use crate::storage::StorageError;

/// A late reservation's cancel is tried this many times before it is
/// reported [`StorageEvent::Unrefunded`] (as a late check's refund).
const CANCEL_TRIES: usize = 3;

/// What a reservation over buckets of two slots of a cluster is answered.
pub(super) const RESERVE_IN_TWO_SLOTS: &str =
    "a reservation over buckets in two slots of a Redis Cluster";

/// One reservation, owned by its task: the keys as sent, the charges and
/// the caller's wait.
pub(super) struct Reservation {
    pub(super) keys: Vec<String>,
    pub(super) charges: Vec<Charge>,
    pub(super) max_wait_us: u64,
}

/// A reservation's answer: each bucket's decision (its `store` the TAT
/// written) and the summary.
/// Each bucket's decision, the reservation, and Redis's `TIME` (µs) when
/// it was made.
pub(super) type Reserved = (Vec<Decision>, JointReservation, u64);

/// Refuses a reservation over two slots of a cluster (see the module
/// docs), before anything is sent; returns the one slot.
pub(super) fn one_slot(keys: &[String]) -> Result<u16, StorageError> {
    let mut slots = keys.iter().map(|k| key::slot_of_key(k));
    let first = slots.next().unwrap_or(0);
    match slots.all(|slot| slot == first) {
        true => Ok(first),
        false => Err(StorageError::Unsupported(RESERVE_IN_TWO_SLOTS)),
    }
}

/// Runs `job` in a task and waits for its answer; a caller that stops
/// waiting leaves the task to give back what Redis reserved for it.
pub(super) async fn reserve(
    shared: &Arc<Shared>,
    job: Reservation,
    timeout: Duration,
) -> Result<Reserved, StorageError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task_shared = shared.clone();
    tokio::spawn(async move {
        let conn = task_shared.link.current();
        let result = run(&task_shared, &conn, &job).await;
        if let Err(Ok((out, joint, _))) = tx.send(result)
            && joint.reserved
        {
            // Nobody waits for this slot any more: give it back, in the
            // buckets it charged (a shadow that refused at the slot wrote
            // at most a cap, which is no reservation).
            let reserved: SmallVec<[(usize, u64); 4]> = out
                .iter()
                .enumerate()
                .filter(|(i, d)| job.charges[*i].cost > 0 && d.allowed)
                .filter_map(|(i, d)| d.store.map(|s| (i, s.tat_us)))
                .collect();
            cancel_late(&task_shared, &conn, &job, &reserved, timeout).await;
        }
    });
    match rx.await {
        Ok(result) => result,
        Err(_) => Err(StorageError::Backend(
            "the Redis reservation task ended without an answer".into(),
        )),
    }
}

/// The reservation itself: one call, waited for [`LATE_ANSWER`] at most.
async fn run(
    shared: &Shared,
    conn: &Conn,
    job: &Reservation,
) -> Result<Reserved, StorageError> {
    let call = Call::reserve(
        job.keys.iter().map(String::as_str),
        &job.charges,
        job.max_wait_us,
    );
    let reply = match conn {
        Conn::Single(single) => {
            within(LATE_ANSWER, run_single(single, &call)).await?
        }
        Conn::Cluster(cluster) => {
            let slot = one_slot(&job.keys)?;
            within(LATE_ANSWER, cluster::run(cluster, &call))
                .await
                .map_err(|error| cluster::in_domain(shared, slot, error))?
        }
    };
    let mut out = vec![Decision::default(); job.keys.len()];
    let (joint, now_us) =
        read_reservation(call.lua, reply, job.max_wait_us, &mut out)?;
    Ok((out, joint, now_us))
}

/// Gives back the buckets `(position, TAT)` a late reservation wrote,
/// tried [`CANCEL_TRIES`] times; what stays taken is reported.
async fn cancel_late(
    shared: &Shared,
    conn: &Conn,
    job: &Reservation,
    reserved: &[(usize, u64)],
    timeout: Duration,
) {
    if reserved.is_empty() {
        return;
    }
    let keys = reserved.iter().map(|&(i, _)| job.keys[i].as_str());
    let args: SmallVec<[(u64, u32, u64); 4]> = reserved
        .iter()
        .map(|&(i, tat)| {
            let charge = &job.charges[i];
            (charge.quota.emission_interval_us(), charge.cost, tat)
        })
        .collect();
    let call = Call::cancel(keys, &args);
    let mut counts = None;
    for _ in 0..CANCEL_TRIES {
        let reply = match conn {
            Conn::Single(single) => {
                within(timeout, run_single(single, &call)).await
            }
            Conn::Cluster(cluster) => {
                within(timeout, cluster::run(cluster, &call)).await
            }
        };
        if let Ok(done) =
            reply.and_then(|r| read_counts(call.lua, r, reserved.len()))
        {
            counts = Some(done);
            break;
        }
    }
    for (k, &(i, _)) in reserved.iter().enumerate() {
        let given_back = counts.as_ref().is_some_and(|c| c[k] > 0);
        if given_back {
            shared.refusals.forget(&job.keys[i]);
        } else {
            shared.listeners.emit_with(|| StorageEvent::Unrefunded {
                limit: key::limit_of_key(&job.keys[i]).to_owned(),
                units: job.charges[i].cost,
            });
        }
    }
}

/// Gives back `reserved` (keys laid out as `layout`): `cancel.lua`, one
/// call on a single Redis, one per slot on a cluster (a failure named by
/// the node that owns the slot), each within `timeout`. A bucket moved
/// back forgets its remembered refusal.
pub(super) async fn cancel(
    shared: &Shared,
    reserved: &[BucketCancel<'_>],
    layout: KeyLayout,
    timeout: Duration,
) -> Result<(), StorageError> {
    let keys: Vec<String> =
        reserved.iter().map(|c| c.bucket.key(layout)).collect();
    let args: Vec<(u64, u32, u64)> = reserved
        .iter()
        .map(|c| {
            let t = c.bucket.quota().emission_interval_us();
            (t, c.bucket.cost(), c.tat_us)
        })
        .collect();
    let conn = shared.link.current();
    let mut counts = vec![0; keys.len()];
    match &*conn {
        Conn::Single(single) => {
            let call = Call::cancel(keys.iter().map(String::as_str), &args);
            let reply = within(timeout, run_single(single, &call)).await?;
            counts = read_counts(call.lua, reply, keys.len())?;
        }
        Conn::Cluster(conn) => {
            for (slot, group) in
                cluster::by_slot(keys.iter().map(String::as_str))
            {
                let part: SmallVec<[(u64, u32, u64); 4]> =
                    group.iter().map(|&i| args[i]).collect();
                let call = Call::cancel(
                    group.iter().map(|&i| keys[i].as_str()),
                    &part,
                );
                let done =
                    match within(timeout, cluster::run(conn, &call)).await {
                        Ok(reply) => read_counts(call.lua, reply, group.len()),
                        Err(error) => Err(error),
                    }
                    .map_err(|error| cluster::in_domain(shared, slot, error))?;
                for (&i, count) in group.iter().zip(done) {
                    counts[i] = count;
                }
            }
        }
    }
    for (key, count) in keys.iter().zip(counts) {
        if count > 0 {
            shared.refusals.forget(key);
        }
    }
    Ok(())
}
