//! What [`CellStorage`](super::CellStorage) decides over the cells it read:
//! pure functions of the decoded states and the time, every rule gcra-core's.
//!
//! A decision over several kinds follows gcra-core's crate docs ("Several
//! kinds in one decision") in the order the memory store takes them, so
//! that both answer alike: windows and concurrency limits first; then the
//! periods; then the rates, charged only if nothing before refused (else
//! read, each answering what its charge would have met); a bucket that
//! passed in a refused decision answers a read of itself. A refused
//! decision writes no charge; only a repair gcra-core asks for (a TAT
//! capped after the clock went back, a window's entries from the future
//! re-stamped), which no decision under a clock that only moves forward
//! meets.

use gcra_core::{
    Charge, CheckError, Decision, JointError, JointReservation, Lease,
    LogWrite, MAX_TIME_US, Verdict, Write, check_all, reserve_all,
};

use super::codec::{Holder, State};
use crate::bucket::{BucketCancel, BucketCheck, BucketSettle};
use crate::rule::Rule;
use crate::storage::StorageError;

/// What becomes of one cell after a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Next {
    /// Not part of the write: left as it is, unchecked.
    Untouched,
    /// Left as it is, but the write happens only if it is still as read.
    Keep,
    /// Replaced by this state, which the store may drop after `ttl_ms`.
    Put(State, u64),
    /// Removed: the bucket is fresh.
    Delete,
}

impl Next {
    fn put(state: State, ttl_ms: u64) -> Next {
        Next::Put(state, ttl_ms)
    }

    fn of_write(write: Write) -> Next {
        match write {
            Write::Keep => Next::Untouched,
            Write::Set(store) => {
                Next::put(State::Rate(store.tat_us), store.ttl_ms)
            }
            Write::Clear => Next::Delete,
        }
    }

    fn writes(&self) -> bool {
        matches!(self, Next::Put(..) | Next::Delete)
    }
}

/// Every cell a write leaves alone is still checked: whatever is written,
/// the whole read it was decided from is still current.
fn conditioned(mut next: Vec<Next>) -> Vec<Next> {
    if next.iter().any(Next::writes) {
        for cell in &mut next {
            if *cell == Next::Untouched {
                *cell = Next::Keep;
            }
        }
    }
    next
}

fn tat(state: &Option<State>) -> Option<u64> {
    match state {
        Some(State::Rate(tat)) => Some(*tat),
        _ => None,
    }
}

fn log(state: &Option<State>) -> &[u64] {
    match state {
        Some(State::Window(log)) => log,
        _ => &[],
    }
}

fn period(state: &Option<State>) -> Option<(u64, u32)> {
    match state {
        Some(State::Period { start_us, count }) => Some((*start_us, *count)),
        _ => None,
    }
}

fn holders(state: &Option<State>) -> &[Holder] {
    match state {
        Some(State::Slots(holders)) => holders,
        _ => &[],
    }
}

fn live(holder: &Holder, now: u64) -> bool {
    Lease::live(&[holder.expiry_us], now) == 1 && holder.count > 0
}

/// The slots held at `now` ([`Lease::live`], each holder by its count).
fn in_flight(holders: &[Holder], now: u64) -> u32 {
    let held = holders
        .iter()
        .filter(|h| live(h, now))
        .map(|h| u64::from(h.count))
        .sum::<u64>();
    u32::try_from(held).unwrap_or(u32::MAX)
}

/// The live holders once `id` took `cost` more slots until `expiry_us`.
fn taken(
    holders: &[Holder],
    id: u64,
    cost: u32,
    expiry_us: u64,
    now: u64,
) -> Vec<Holder> {
    let mut kept: Vec<Holder> =
        holders.iter().filter(|h| live(h, now)).copied().collect();
    // A request's slots are one holder; slots without an id share one per
    // expiry.
    match kept
        .iter_mut()
        .find(|h| h.id == id && (id != 0 || h.expiry_us == expiry_us))
    {
        Some(holder) => {
            holder.count = holder.count.saturating_add(cost);
            holder.expiry_us = expiry_us;
        }
        None => kept.push(Holder {
            id,
            count: cost,
            expiry_us,
        }),
    }
    kept
}

/// A window's log after gcra-core's write.
fn logged(log: &[u64], write: &LogWrite) -> Vec<u64> {
    let kept = write.kept(log.len());
    let room = kept.len().saturating_add(write.append).max(log.len());
    let mut buffer = vec![0; room];
    if let Some(head) = buffer.get_mut(..log.len()) {
        head.copy_from_slice(log);
    }
    // The buffer holds the kept entries and the new ones: it always fits.
    let len = write.apply_in(&mut buffer, log.len()).unwrap_or(0);
    buffer.truncate(len);
    buffer
}

fn joint_error(error: JointError, checks: usize) -> StorageError {
    match error {
        JointError::Charge { error, .. } => StorageError::Check(error),
        _ => StorageError::LengthMismatch {
            checks,
            out: checks,
        },
    }
}

/// One decision over `checks` (`states[i]` read from `checks[i]`'s cell):
/// each bucket's answer in `out`, the verdict, and each cell's next state.
/// New slots of a concurrency limit expire at `expiry_us`.
pub(super) fn check(
    checks: &[BucketCheck<'_>],
    states: &[Option<State>],
    now: u64,
    expiry_us: u64,
    out: &mut [Decision],
) -> Result<(Verdict, Vec<Next>), StorageError> {
    let n = checks.len();
    let mut next = vec![Next::Untouched; n];
    let refuses = |check: &BucketCheck<'_>, decision: &Decision| {
        !decision.allowed && !check.is_shadow()
    };

    // Windows and concurrency limits, each on its own.
    let mut refused = false;
    for (i, check) in checks.iter().enumerate() {
        let (decision, write) = match check.rule() {
            Rule::Window(window) => {
                let decided =
                    window.check(log(&states[i]), now, check.cost())?;
                let write = decided.write.map(|write| {
                    Next::put(
                        State::Window(logged(log(&states[i]), &write)),
                        write.ttl_ms,
                    )
                });
                (decided.as_decision(), write)
            }
            Rule::Concurrency(limit) => {
                let held = holders(&states[i]);
                let decided =
                    limit.acquire(in_flight(held, now), check.cost())?;
                let write = decided.write.map(|_| {
                    let slots = taken(
                        held,
                        check.lease(),
                        check.cost(),
                        expiry_us,
                        now,
                    );
                    Next::put(State::Slots(slots), ttl_ms(expiry_us, now))
                });
                (decided.as_decision(), write)
            }
            Rule::Rate(_) | Rule::Period(_) => continue,
        };
        out[i] = decision;
        next[i] = write.unwrap_or(Next::Untouched);
        refused |= refuses(check, &decision);
    }

    // The periods.
    let mut table_refused = false;
    for (i, check) in checks.iter().enumerate() {
        if let Rule::Period(rule) = check.rule() {
            let decided = rule.check(period(&states[i]), now, check.cost())?;
            out[i] = decided.as_decision();
            next[i] = decided.write.map_or(Next::Untouched, |write| {
                Next::put(
                    State::Period {
                        start_us: write.start_us,
                        count: write.count,
                    },
                    write.ttl_ms,
                )
            });
            table_refused |= refuses(check, &out[i]);
        }
    }

    // The rates: charged only if nothing refused yet, else read.
    let peeks = refused || table_refused;
    let rates: Vec<usize> = (0..n).filter(|&i| checks[i].is_rate()).collect();
    if !rates.is_empty() {
        let charges: Vec<Charge> = rates
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
        let stored: Vec<Option<u64>> =
            rates.iter().map(|&i| tat(&states[i])).collect();
        let mut decided = vec![Decision::default(); rates.len()];
        check_all(&charges, &stored, now, &mut decided)
            .map_err(|error| joint_error(error, n))?;
        for (&i, decision) in rates.iter().zip(&decided) {
            if peeks {
                out[i] = checks[i].would_meet(decision);
            } else {
                out[i] = *decision;
                next[i] = decision.store.map_or(Next::Untouched, |s| {
                    Next::put(State::Rate(s.tat_us), s.ttl_ms)
                });
            }
        }
    }

    // Rates and periods together, as one table.
    let table: Vec<usize> = (0..n)
        .filter(|&i| {
            matches!(checks[i].rule(), Rule::Rate(_) | Rule::Period(_))
        })
        .collect();
    let table_out: Vec<Decision> = table.iter().map(|&i| out[i]).collect();
    let table_allowed =
        Verdict::of(table.iter().map(|&i| checks[i].is_shadow()), &table_out)
            .allowed;
    let allowed = !refused && table_allowed;

    // Refused: a bucket that passed is not charged, and answers a read.
    if !allowed {
        for (i, check) in checks.iter().enumerate() {
            if !out[i].allowed {
                continue;
            }
            let read = match check.rule() {
                Rule::Period(rule) => {
                    rule.check(period(&states[i]), now, 0)?.as_decision()
                }
                Rule::Window(rule) => {
                    rule.check(log(&states[i]), now, 0)?.as_decision()
                }
                Rule::Concurrency(rule) => rule
                    .acquire(in_flight(holders(&states[i]), now), 0)?
                    .as_decision(),
                Rule::Rate(_) => continue,
            };
            out[i] = read;
            next[i] = Next::Untouched;
        }
    }
    let verdict = Verdict::of(checks.iter().map(BucketCheck::is_shadow), out);
    Ok((verdict, conditioned(next)))
}

/// [`gcra_core::reserve_all`] over rates' cells.
pub(super) fn reserve(
    checks: &[BucketCheck<'_>],
    states: &[Option<State>],
    now: u64,
    max_wait_us: u64,
    out: &mut [Decision],
) -> Result<(JointReservation, Vec<Next>), StorageError> {
    let charges: Vec<Charge> = checks.iter().map(BucketCheck::charge).collect();
    let stored: Vec<Option<u64>> = states.iter().map(tat).collect();
    let joint = reserve_all(&charges, &stored, now, max_wait_us, out)
        .map_err(|error| joint_error(error, checks.len()))?;
    let next = out
        .iter()
        .map(|d| {
            d.store.map_or(Next::Untouched, |s| {
                Next::put(State::Rate(s.tat_us), s.ttl_ms)
            })
        })
        .collect();
    Ok((joint, conditioned(next)))
}

/// [`gcra_core::Quota::settle`] of each rate.
pub(super) fn settle(
    settles: &[BucketSettle<'_>],
    states: &[Option<State>],
    now: u64,
) -> Result<Vec<Next>, StorageError> {
    settles
        .iter()
        .zip(states)
        .map(|(settle, state)| {
            let settled =
                settle
                    .bucket
                    .quota()
                    .settle(tat(state), now, settle.adjust)?;
            Ok(Next::of_write(settled.write))
        })
        .collect()
}

/// [`gcra_core::Quota::cancel`] of each reservation.
pub(super) fn cancel(
    reserved: &[BucketCancel<'_>],
    states: &[Option<State>],
    now: u64,
) -> Vec<Next> {
    reserved
        .iter()
        .zip(states)
        .map(|(cancel, state)| Next::of_write(cancel.write(tat(state), now)))
        .collect()
}

/// Gives back each check's cost of slots held under its id
/// ([`gcra_core::Concurrency::release`]); expired holders go with it. A
/// release of slots not held writes nothing.
pub(super) fn release(
    slots: &[BucketCheck<'_>],
    states: &[Option<State>],
    now: u64,
) -> Vec<Next> {
    slots
        .iter()
        .zip(states)
        .map(|(check, state)| {
            let Rule::Concurrency(limit) = check.rule() else {
                return Next::Untouched;
            };
            let mut left = check.cost();
            let mut kept: Vec<Holder> = Vec::new();
            for holder in holders(state).iter().filter(|h| live(h, now)) {
                let mut holder = *holder;
                if holder.id == check.lease() && left > 0 {
                    let count = limit.release(holder.count, left);
                    left -= holder.count - count;
                    holder.count = count;
                }
                if holder.count > 0 {
                    kept.push(holder);
                }
            }
            if left == check.cost() {
                Next::Untouched
            } else if kept.is_empty() {
                Next::Delete
            } else {
                let last =
                    kept.iter().map(|h| h.expiry_us).max().unwrap_or(now);
                Next::put(State::Slots(kept), ttl_ms(last, now))
            }
        })
        .collect()
}

/// Sets the expiry of the live slots each check's id holds to
/// `expiry_us`; an expired slot is not taken again.
pub(super) fn renew(
    slots: &[BucketCheck<'_>],
    states: &[Option<State>],
    now: u64,
    expiry_us: u64,
) -> Vec<Next> {
    slots
        .iter()
        .zip(states)
        .map(|(check, state)| {
            let mut renewed = false;
            let kept: Vec<Holder> = holders(state)
                .iter()
                .filter(|h| live(h, now))
                .map(|h| {
                    let mut holder = *h;
                    if holder.id == check.lease() && check.cost() > 0 {
                        holder.expiry_us = expiry_us;
                        renewed = true;
                    }
                    holder
                })
                .collect();
            if !renewed || !matches!(check.rule(), Rule::Concurrency(_)) {
                return Next::Untouched;
            }
            let last = kept.iter().map(|h| h.expiry_us).max().unwrap_or(now);
            Next::put(State::Slots(kept), ttl_ms(last, now))
        })
        .collect()
}

/// Every bucket back to full, but a concurrency limit's slots: their
/// requests still run.
pub(super) fn reset(buckets: &[BucketCheck<'_>]) -> Vec<Next> {
    buckets
        .iter()
        .map(|bucket| match bucket.rule() {
            Rule::Concurrency(_) => Next::Untouched,
            _ => Next::Delete,
        })
        .collect()
}

/// How long a cell that lasts until `until_us` is worth keeping.
fn ttl_ms(until_us: u64, now: u64) -> u64 {
    until_us.saturating_sub(now).div_ceil(1000)
}

/// When slots taken at `now` expire: `lease` later, or never (as far as
/// gcra-core's times go) without one.
pub(super) fn expiry(
    lease: Option<Lease>,
    now: u64,
) -> Result<u64, CheckError> {
    lease.map_or(Ok(MAX_TIME_US), |lease| lease.expiry(now))
}
