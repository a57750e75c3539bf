//! The lock bits of a joint decision's buckets: each bucket's word
//! carries a lock bit ([`LOCKED`]), taken in one global order (the
//! buckets' names) so that two decisions over shared buckets never wait
//! on each other in a cycle, and cleared as the decision's writes are
//! committed, or as the words were when it writes nothing.

use crate::sync::{AtomicU64, Ordering, spin};

use gcra_core::{Charge, Decision, Verdict};

use super::joint::{Judge, RateCharge};
use super::table::{LOCKED, NO_TAT};
use super::{FEW, stored};
use crate::storage::StorageError;

/// The fast path's core: locks `cells` in `order` (the buckets' names),
/// reads their TATs into `stored`, decides by `judge`, and commits the
/// writes as it unlocks; or, when the decision writes buckets the table
/// does not hold (`None` cells), unlocks them unchanged and says how many.
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

/// [`Inner::charge_rates`](super::Inner::charge_rates) on the cells found: locked in `order`, charged
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
    use super::super::joint::Check;
    use super::super::table::{LOCKED, NO_TAT};
    use super::{RateCharge, charge_cells, judge_locked};
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
        let decided = judge_locked(
            &cells,
            order,
            &mut stored,
            &charges,
            NOW,
            &mut out,
            Check,
        );
        match decided {
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

    /// A joint decision over buckets a and b against `other` over b and a
    /// (given as [b, a]; locked in name order, a first): exactly one
    /// passes, and both buckets are charged once.
    fn against_opposite_order(other: fn(&[&AtomicU64], &[usize]) -> bool) {
        model(3, move || {
            let (a, b) = (bucket(), bucket());
            let theirs = {
                let (a, b) = (a.clone(), b.clone());
                thread::spawn(move || other(&[&b, &a], &[1, 0]))
            };
            let mine = joint(&[&a, &b], &[0, 1]);
            let theirs = theirs.join().unwrap();
            assert!(mine ^ theirs, "exactly one passes: {mine} {theirs}");
            assert_eq!((value(&a), value(&b)), (FULL, FULL));
        });
    }

    #[test]
    fn two_joint_decisions_given_in_opposite_orders() {
        against_opposite_order(joint);
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
        against_opposite_order(lean);
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
