//! A decision sent to Redis, owned and run to its end in a task of its
//! own, whatever its caller does.
//!
//! A caller that stops waiting (its timeout fired, or its future was
//! dropped) answered without Redis: a fallback decided locally, or a policy
//! did. Whatever Redis then decides for it must not stay charged, or the
//! request is charged twice (locally and in Redis) or charged for a
//! decision nobody saw. So the decision runs in a task: its caller waits for
//! it within the store's timeout, and when the caller is gone by the time
//! the answer comes, the task refunds every charge it made. On a Redis
//! Cluster the slots a decision charged are refunded when a later slot
//! refuses or fails, in the same task, so that a caller going away cannot
//! cut that in half either.
//!
//! The task waits [`LATE_ANSWER`] at most for each answer. A connection
//! that never answers leaves a decision unknown: it may have been charged
//! (the request was sent), and nothing can tell.

use std::sync::Arc;
use std::time::Duration;

use ::redis::Value;
use gcra_core::{Adjust, Charge, Decision, Quota, Verdict};
use smallvec::SmallVec;

use super::cluster;
use super::link::Conn;
use super::script::{Call, read_decisions, read_settled};
use super::{Shared, backend, run_single};
use crate::bucket::BucketCheck;
use crate::event::StorageEvent;
use crate::key::{self, KeyLayout};
use crate::storage::StorageError;

/// How long a decision's task waits for an answer its caller may have given
/// up on: long enough for a slow Redis, short enough that a silent one does
/// not pile up tasks (a fallback's breaker stops the calls after a few
/// failures).
pub(super) const LATE_ANSWER: Duration = Duration::from_secs(1);

/// Refunds are tried this many times before the charge is reported
/// [`StorageEvent::Unrefunded`].
const REFUND_TRIES: usize = 3;

/// One decision: the buckets' keys (as sent to Redis) and charges, owned.
#[derive(Debug, Clone)]
pub(super) struct Job {
    pub(super) keys: Vec<String>,
    pub(super) charges: Vec<Charge>,
}

impl Job {
    /// The decision over `checks`, their keys laid out as `layout`.
    pub(super) fn of(checks: &[BucketCheck<'_>], layout: KeyLayout) -> Job {
        Job {
            keys: checks.iter().map(|c| c.key(layout)).collect(),
            charges: checks.iter().map(BucketCheck::charge).collect(),
        }
    }

    /// The keys, borrowed.
    pub(super) fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(String::as_str)
    }

    /// The positions `out` charged: none if it refused; else every bucket
    /// with a cost that passed on its own (a shadow limit that would have
    /// refused was not charged).
    pub(super) fn charged(&self, out: &[Decision]) -> SmallVec<[usize; 4]> {
        let verdict = Verdict::of(self.charges.iter().map(|c| c.shadow), out);
        if !verdict.allowed {
            return SmallVec::new();
        }
        (0..self.charges.len())
            .filter(|&i| {
                self.charges[i].cost > 0
                    && out.get(i).is_some_and(|d| d.allowed)
            })
            .collect()
    }
}

/// Runs `job` in a task and waits for its answer; a caller that stops
/// waiting leaves the task to refund what Redis charges for it.
pub(super) async fn decide(
    shared: &Arc<Shared>,
    job: Job,
    timeout: Duration,
) -> Result<Vec<Decision>, StorageError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task_shared = shared.clone();
    tokio::spawn(async move {
        let conn = task_shared.link.current();
        let result = run(&task_shared, &conn, &job, timeout).await;
        if let Err(Ok(out)) = tx.send(result) {
            // Nobody waits for this decision any more: undo it.
            let charged = job.charged(&out);
            let refunds: SmallVec<[(usize, u32); 4]> =
                charged.iter().map(|&i| (i, job.charges[i].cost)).collect();
            refund(&task_shared, &conn, &job, &refunds, timeout).await;
        }
    });
    match rx.await {
        Ok(result) => result,
        // The task panicked: nothing to read the answer from.
        Err(_) => Err(StorageError::Backend(
            "the Redis decision task ended without an answer".into(),
        )),
    }
}

/// The decision itself, on the connection's kind.
async fn run(
    shared: &Shared,
    conn: &Conn,
    job: &Job,
    timeout: Duration,
) -> Result<Vec<Decision>, StorageError> {
    match conn {
        Conn::Single(conn) => {
            let call = Call::check(job.keys(), &job.charges);
            let reply = within(LATE_ANSWER, run_single(conn, &call)).await?;
            let mut out = vec![Decision::default(); job.keys.len()];
            read_decisions(call.lua, reply, &mut out)?;
            Ok(out)
        }
        Conn::Cluster(cluster) => {
            cluster::decide(shared, cluster, job, timeout).await
        }
    }
}

/// Runs a call within `bound`, its errors as the store's.
pub(super) async fn within(
    bound: Duration,
    call: impl Future<Output = Result<Value, ::redis::RedisError>>,
) -> Result<Value, StorageError> {
    match tokio::time::timeout(bound, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) if error.is_timeout() => {
            Err(StorageError::Timeout(bound))
        }
        Ok(Err(error)) => Err(backend(error)),
        Err(_) => Err(StorageError::Timeout(bound)),
    }
}

/// Refunds `units` of each bucket `(position, units)` of `job`, one call
/// per slot, each tried [`REFUND_TRIES`] times; forgets their remembered
/// refusals (they may pass now). What could not be refunded is reported.
/// Returns each refunded bucket's state after the refund, by position.
pub(super) async fn refund(
    shared: &Shared,
    conn: &Conn,
    job: &Job,
    refunds: &[(usize, u32)],
    timeout: Duration,
) -> SmallVec<[(usize, u64, u64); 4]> {
    let mut states = SmallVec::new();
    let groups = match conn {
        Conn::Single(_) => {
            let all: SmallVec<[usize; 4]> = (0..refunds.len()).collect();
            SmallVec::<[SmallVec<[usize; 4]>; 2]>::from_elem(all, 1)
        }
        Conn::Cluster(_) => {
            cluster::by_slot(refunds.iter().map(|&(i, _)| job.keys[i].as_str()))
                .into_iter()
                .map(|(_, group)| group)
                .collect()
        }
    };
    for group in groups {
        let part: SmallVec<[(usize, u32); 4]> =
            group.iter().map(|&g| refunds[g]).collect();
        if part.is_empty() {
            continue;
        }
        let keys = part.iter().map(|&(i, _)| job.keys[i].as_str());
        let adjusts: SmallVec<[(Quota, Adjust); 4]> = part
            .iter()
            .map(|&(i, units)| (job.charges[i].quota, Adjust::Refund(units)))
            .collect();
        let call = Call::settle(keys, &adjusts);
        let mut done = None;
        for _ in 0..REFUND_TRIES {
            let reply = match conn {
                Conn::Single(single) => {
                    within(timeout, run_single(single, &call)).await
                }
                Conn::Cluster(cluster) => {
                    within(timeout, cluster::run(cluster, &call)).await
                }
            };
            if let Ok(settled) =
                reply.and_then(|r| read_settled(call.lua, r, part.len()))
            {
                done = Some(settled);
                break;
            }
        }
        match done {
            Some(settled) => {
                for (&(i, _), (remaining, reset)) in part.iter().zip(settled) {
                    shared.refusals.forget(&job.keys[i]);
                    states.push((i, remaining, reset));
                }
            }
            None => {
                for &(i, units) in &part {
                    shared.listeners.emit_with(|| StorageEvent::Unrefunded {
                        limit: key::limit_of_key(&job.keys[i]).to_owned(),
                        units,
                    });
                }
            }
        }
    }
    states
}
