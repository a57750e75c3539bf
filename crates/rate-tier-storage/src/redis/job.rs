//! A decision sent to Redis, owned and run to its end in a task of its
//! own, whatever its caller does: a caller that gave up was answered
//! without Redis, so what Redis charges for it late is refunded here
//! (rates by `gcra_settle.lua`, slots by `release.lua`, windows and
//! periods reported [`StorageEvent::Unrefunded`]). On a Redis Cluster the
//! refunds of a decision over several slots run in the same task, so a
//! caller going away cannot cut them in half. Why: "Late answers" in
//! ARCHITECTURE.md.

use std::sync::Arc;
use std::time::Duration;

use ::redis::cluster_async::ClusterConnection;
use gcra_core::{
    Adjust, Charge, Decision, Lease, Quota, RETRY_HINT_US, Verdict,
};
use smallvec::SmallVec;

use super::cluster;
use super::link::Conn;
use super::reply::{read_counts, read_decisions, read_settled};
use super::script::{Call, LATE_ANSWER, within};
use super::{Shared, run_single};
use crate::bucket::BucketCheck;
use crate::event::StorageEvent;
use crate::key::{self, KeyLayout};
use crate::rule::Rule;
use crate::storage::StorageError;

/// Refunds are tried this many times before the charge is reported
/// [`StorageEvent::Unrefunded`].
const REFUND_TRIES: usize = 3;

/// One decision: the buckets' keys (as sent to Redis) and charges, owned,
/// and their rules and slot ids when one is not a rate.
#[derive(Debug, Clone)]
pub(super) struct Job {
    pub(super) keys: Vec<String>,
    pub(super) charges: Vec<Charge>,
    /// Each bucket's rule, when at least one is a window, a period or a
    /// concurrency limit (the decision is `decide_mixed.lua`'s); empty (no
    /// allocation) for a decision of rates only, `gcra.lua`'s or
    /// `gcra_all.lua`'s.
    rules: Vec<Rule>,
    /// Each bucket's slot id ([`BucketCheck::lease`]), beside `rules`.
    ids: Vec<u64>,
    /// The store's lease of the slots it takes.
    lease: Lease,
}

impl Job {
    /// The decision over `checks`, their keys laid out as `layout`;
    /// `mixed`: at least one of them is not a rate. Slots taken are
    /// leased for `lease`.
    pub(super) fn of(
        checks: &[BucketCheck<'_>],
        layout: KeyLayout,
        mixed: bool,
        lease: Lease,
    ) -> Job {
        let (rules, ids) = match mixed {
            true => checks.iter().map(|c| (c.rule(), c.lease())).unzip(),
            false => (Vec::new(), Vec::new()),
        };
        Job {
            keys: checks.iter().map(|c| c.key(layout)).collect(),
            charges: checks.iter().map(BucketCheck::charge).collect(),
            rules,
            ids,
            lease,
        }
    }

    /// The keys, borrowed.
    pub(super) fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(String::as_str)
    }

    /// Whether the bucket at `index` is a rate (what a refund can give
    /// back).
    pub(super) fn is_rate(&self, index: usize) -> bool {
        self.rules
            .get(index)
            .is_none_or(|rule| matches!(rule, Rule::Rate(_)))
    }

    /// Whether the bucket at `index` is a concurrency limit (whose slots a
    /// release gives back).
    pub(super) fn is_slot(&self, index: usize) -> bool {
        matches!(self.rules.get(index), Some(Rule::Concurrency(_)))
    }

    /// Whether a bucket of the decision is a window, a period or a
    /// concurrency limit.
    pub(super) fn is_mixed(&self) -> bool {
        !self.rules.is_empty()
    }

    /// The call that decides every bucket of the decision at once.
    pub(super) fn call(&self) -> Call<'_> {
        if self.is_mixed() {
            Call::mixed(
                self.keys(),
                &self.charges,
                &self.rules,
                &self.ids,
                self.lease,
            )
        } else {
            Call::check(self.keys(), &self.charges)
        }
    }

    /// The call that decides the buckets at `group` (one slot's), charged
    /// as `charges` (theirs, or peeks of them): `decide_mixed.lua` if one
    /// of them is not a rate, else as [`Call::check`] chooses.
    fn call_of<'k>(&'k self, group: &[usize], charges: &[Charge]) -> Call<'k> {
        let keys = group.iter().map(|&i| self.keys[i].as_str());
        if group.iter().all(|&i| self.is_rate(i)) {
            return Call::check(keys, charges);
        }
        let rules: SmallVec<[Rule; 4]> =
            group.iter().map(|&i| self.rules[i]).collect();
        let ids: SmallVec<[u64; 4]> =
            group.iter().map(|&i| self.ids[i]).collect();
        Call::mixed(keys, charges, &rules, &ids, self.lease)
    }

    /// What the charge of the bucket at `index` would have met, from a
    /// read of it (`peek`, decided at a cost of 0): a rate's by
    /// [`Charge::would_meet`]; a period's exactly (it refuses until the
    /// next period, the peek's reset); a window's pass exactly, and its
    /// refusal with the peek's reset as its wait, the time until every
    /// counted entry has left: never shorter than the real wait (until
    /// enough of the oldest have left), which a read of the count alone
    /// cannot tell; a concurrency limit's exactly (a refusal waits
    /// [`RETRY_HINT_US`], as `Concurrency::acquire` says).
    fn would_meet(&self, index: usize, peek: &Decision) -> Decision {
        let charge = &self.charges[index];
        if self.is_rate(index) {
            return charge.would_meet(peek);
        }
        if u64::from(charge.cost) <= peek.remaining {
            return *peek;
        }
        let wait = match self.is_slot(index) {
            true => RETRY_HINT_US,
            false => peek.reset_after_us,
        };
        Decision {
            allowed: false,
            remaining: 0,
            retry_after_us: wait,
            reset_after_us: peek.reset_after_us,
            store: None,
        }
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
            // Nobody waits for this decision any more: undo it. The rates
            // are refunded and the slots released; a window's entries and
            // a period's count stay charged (over-charging, never
            // forgiving: see the module docs), and are reported.
            let (refunds, others): (
                SmallVec<[usize; 4]>,
                SmallVec<[usize; 4]>,
            ) = job.charged(&out).into_iter().partition(|&i| job.is_rate(i));
            let (slots, kept): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) =
                others.into_iter().partition(|&i| job.is_slot(i));
            release(&task_shared, &conn, &job, &slots, timeout).await;
            for i in kept {
                task_shared
                    .listeners
                    .emit_with(|| StorageEvent::Unrefunded {
                        limit: key::limit_of_key(&job.keys[i]).to_owned(),
                        units: job.charges[i].cost,
                    });
            }
            let refunds: SmallVec<[(usize, u32); 4]> =
                refunds.iter().map(|&i| (i, job.charges[i].cost)).collect();
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
            let call = job.call();
            let reply = within(LATE_ANSWER, run_single(conn, &call)).await?;
            let mut out = vec![Decision::default(); job.keys.len()];
            read_decisions(call.lua, reply, &mut out)?;
            Ok(out)
        }
        Conn::Cluster(cluster) => {
            decide_cluster(shared, cluster, job, timeout).await
        }
    }
}

/// Releases the slots `job` took at `slots` (positions of concurrency
/// limits that passed), one call per slot of the cluster, each tried
/// [`REFUND_TRIES`] times. What could not be released is reported
/// [`StorageEvent::Unrefunded`]: it is free when its lease ends.
async fn release(
    shared: &Shared,
    conn: &Conn,
    job: &Job,
    slots: &[usize],
    timeout: Duration,
) {
    if slots.is_empty() {
        return;
    }
    let groups: SmallVec<[SmallVec<[usize; 4]>; 2]> = match conn {
        Conn::Single(_) => {
            SmallVec::from_elem(slots.iter().copied().collect(), 1)
        }
        Conn::Cluster(_) => {
            cluster::by_slot(slots.iter().map(|&i| job.keys[i].as_str()))
                .into_iter()
                .map(|(_, group)| group.iter().map(|&g| slots[g]).collect())
                .collect()
        }
    };
    for group in groups {
        let keys = group.iter().map(|&i| job.keys[i].as_str());
        let taken: SmallVec<[(u64, u32); 4]> = group
            .iter()
            .map(|&i| (job.ids[i], job.charges[i].cost))
            .collect();
        let call = Call::release(keys, &taken);
        let mut released = false;
        for _ in 0..REFUND_TRIES {
            let reply = match conn {
                Conn::Single(single) => {
                    within(timeout, run_single(single, &call)).await
                }
                Conn::Cluster(cluster) => {
                    within(timeout, cluster::run(cluster, &call)).await
                }
            };
            if reply
                .and_then(|r| read_counts(call.lua, r, group.len()))
                .is_ok()
            {
                released = true;
                break;
            }
        }
        if !released {
            for &i in &group {
                shared.listeners.emit_with(|| StorageEvent::Unrefunded {
                    limit: key::limit_of_key(&job.keys[i]).to_owned(),
                    units: job.charges[i].cost,
                });
            }
        }
    }
}

/// Refunds `units` of each rate bucket `(position, units)` of `job` (a
/// window or a period cannot be refunded: never given here), one call
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

/// Decides `job`. One slot: one call, all or nothing. Several: slot by
/// slot, each call waited for [`LATE_ANSWER`] at most; a refusal refunds
/// the slots already charged and only reads the ones after it, and a
/// failure refunds them and is the answer. The slot of the windows,
/// periods and concurrency limits (one at most: the store refuses a
/// decision with them in two before any call, see
/// `cluster::one_slot_of_kinds`) is decided last, so that what a refusal or
/// a failure undoes is rates alone, and what it takes stands. Run in the
/// decision's own task (see `job.rs`): it ends whatever the caller does.
async fn decide_cluster(
    shared: &Shared,
    conn: &ClusterConnection,
    job: &Job,
    timeout: Duration,
) -> Result<Vec<Decision>, StorageError> {
    let mut out = vec![Decision::default(); job.keys.len()];
    let mut groups = cluster::by_slot(job.keys());
    if job.is_mixed()
        && let Some(kinds) = groups
            .iter()
            .position(|(_, group)| group.iter().any(|&i| !job.is_rate(i)))
    {
        let last = groups.remove(kinds);
        groups.push(last);
    }
    if let [(slot, _)] = groups.as_slice() {
        let call = job.call();
        let reply = within(LATE_ANSWER, cluster::run(conn, &call))
            .await
            .map_err(|error| cluster::in_domain(shared, *slot, error))?;
        read_decisions(call.lua, reply, &mut out)?;
        return Ok(out);
    }
    let started = std::time::Instant::now();
    let whole = Conn::Cluster(conn.clone());
    let mut charged: SmallVec<[(usize, u32); 4]> = SmallVec::new();
    for (g, (slot, group)) in groups.iter().enumerate() {
        let charges: SmallVec<[Charge; 4]> =
            group.iter().map(|&i| job.charges[i]).collect();
        let call = job.call_of(group, &charges);
        let mut decided: SmallVec<[Decision; 4]> =
            SmallVec::from_elem(Decision::default(), group.len());
        let result = match within(LATE_ANSWER, cluster::run(conn, &call)).await
        {
            Ok(reply) => read_decisions(call.lua, reply, &mut decided),
            Err(error) => Err(error),
        };
        if let Err(error) = result {
            // Give back what was taken; the error is the answer.
            refund(shared, &whole, job, &charged, timeout).await;
            return Err(cluster::in_domain(shared, *slot, error));
        }
        for (&i, decision) in group.iter().zip(&decided) {
            out[i] = *decision;
        }
        let verdict = Verdict::of(charges.iter().map(|c| c.shadow), &decided);
        if !verdict.allowed {
            // A refusal, whatever happens next: the charges go back (what
            // cannot be is reported), and the slots after it are read.
            for (i, remaining, reset_after_us) in
                refund(shared, &whole, job, &charged, timeout).await
            {
                out[i] = Decision {
                    allowed: true,
                    remaining,
                    retry_after_us: 0,
                    reset_after_us,
                    store: None,
                };
            }
            // Within the caller's wait: a read is worth nothing once the
            // caller has answered without it.
            let left = (timeout * 3 / 4).saturating_sub(started.elapsed());
            read_only(conn, job, &mut out, &groups[g + 1..], left).await;
            return Ok(out);
        }
        charged.extend(
            group
                .iter()
                .zip(&decided)
                .filter(|(i, d)| job.charges[**i].cost > 0 && d.allowed)
                .map(|(&i, _)| (i, job.charges[i].cost)),
        );
    }
    Ok(out)
}

/// Reads the buckets of `groups` without charging them, and says of each
/// what its charge would have met ([`Job::would_meet`]): GCRA is the same
/// at any origin of time, so a rate read `reset_after` ahead is checked at
/// 0; a window or a period is read by `decide_mixed.lua`. A bucket that
/// would refuse too is reported refusing, with its wait, so that the
/// decision's wait is the longest, as one call would have told it. A read
/// that fails leaves its buckets reported passing with their state unknown:
/// the decision is a refusal whatever they hold.
async fn read_only(
    conn: &ClusterConnection,
    job: &Job,
    out: &mut [Decision],
    groups: &[(u16, SmallVec<[usize; 4]>)],
    within_time: Duration,
) {
    let deadline = tokio::time::Instant::now() + within_time;
    for (_, group) in groups {
        let peeks: SmallVec<[Charge; 4]> = group
            .iter()
            .map(|&i| Charge {
                cost: 0,
                ..job.charges[i]
            })
            .collect();
        let call = job.call_of(group, &peeks);
        let mut decided: SmallVec<[Decision; 4]> =
            SmallVec::from_elem(Decision::default(), peeks.len());
        let left =
            deadline.saturating_duration_since(tokio::time::Instant::now());
        let read = match within(left, cluster::run(conn, &call)).await {
            Ok(reply) => read_decisions(call.lua, reply, &mut decided),
            Err(error) => Err(error),
        };
        for (&i, peek) in group.iter().zip(&decided) {
            out[i] = match &read {
                Err(_) => Decision {
                    allowed: true,
                    ..Decision::default()
                },
                Ok(()) => job.would_meet(i, peek),
            };
        }
    }
}
