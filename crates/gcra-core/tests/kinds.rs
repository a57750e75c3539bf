//! Limits of several kinds decided as one, the way gcra-core's crate docs
//! ("Several kinds in one decision") tell a store to: each decided alone,
//! the verdict by `Verdict::of` over their `as_decision()`, every write
//! applied on a pass and none of a passing limit's on a refusal. Each
//! limit's own promise must hold under the combination.

mod common;

use core::time::Duration;

use gcra_core::{
    Concurrency, Decision, LogWrite, Period, PeriodUnit, Quota, Verdict, Window,
};
use proptest::prelude::*;

/// The store: one key per limit.
#[derive(Debug, Default)]
struct Store {
    tat: Option<u64>,
    log: Vec<u64>,
    record: Option<(u64, u32)>,
    in_flight: u32,
}

fn apply(log: &mut Vec<u64>, write: &LogWrite) {
    let kept = write.kept(log.len());
    log.truncate(kept.end);
    log.drain(..kept.start);
    log.extend(std::iter::repeat_n(write.entry_us, write.append));
}

proptest! {
    #![proptest_config(common::config(
        512,
        concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/kinds.txt"),
    ))]

    #[test]
    fn all_or_nothing_across_kinds(
        shadow in prop::array::uniform4(prop::bool::weighted(0.2)),
        steps in prop::collection::vec((0u64..30, 0u32..=2, any::<bool>()), 1..80),
    ) {
        let quota = Quota::new(3, Duration::from_micros(30)).unwrap(); // T = 10
        let window = Window::new(2, Duration::from_micros(25)).unwrap();
        // A "day" of the test is a real day: one period per run.
        let period = Period::new(12, PeriodUnit::Day, 0).unwrap();
        let slots = Concurrency::new(2).unwrap();

        let mut store = Store::default();
        let mut now = 0u64;
        let mut window_units: Vec<u64> = Vec::new(); // charged to the window
        let mut period_units = 0u32; // charged to the period
        let mut running: Vec<u32> = Vec::new(); // slots acquired
        for (advance, cost, end_one) in steps {
            now += advance;
            if end_one && let Some(c) = running.pop() {
                store.in_flight = slots.release(store.in_flight, c);
            }
            // 1. Each limit alone (cost 0: a peek, GCRA's included).
            let gcra = if cost == 0 {
                quota.peek(store.tat, now)
            } else {
                quota.check(store.tat, now, cost)
            }
            .unwrap();
            let win = window.check(&store.log, now, cost).unwrap();
            let per = period.check(store.record, now, cost).unwrap();
            let conc = slots.acquire(store.in_flight, cost).unwrap();
            // 2. The verdict.
            let answers: [Decision; 4] =
                [gcra, win.as_decision(), per.as_decision(), conc.as_decision()];
            let verdict = Verdict::of(shadow, &answers);
            let enforced_pass =
                answers.iter().zip(shadow).all(|(d, s)| s || d.allowed);
            prop_assert_eq!(verdict.allowed, enforced_pass);
            if verdict.allowed {
                // 3. Every write: a charge where the limit passed, at most
                // a repair where a shadow limit refused.
                if let Some(s) = gcra.store { store.tat = Some(s.tat_us); }
                if let Some(w) = win.write { apply(&mut store.log, &w); }
                if let Some(w) = per.write { store.record = Some((w.start_us, w.count)); }
                if let Some(n) = conc.write { store.in_flight = n; }
                if cost > 0 {
                    if win.allowed {
                        window_units.extend(std::iter::repeat_n(now, cost as usize));
                    }
                    if per.allowed { period_units += cost; }
                    if conc.allowed { running.push(cost); }
                }
            } else {
                // 4. No write of a limit that passed; a refusal's own write
                // is a repair, applied.
                prop_assert!(verdict.retry_after_us > 0);
                if !gcra.allowed && let Some(s) = gcra.store {
                    store.tat = Some(s.tat_us);
                }
                if !win.allowed && let Some(w) = win.write {
                    prop_assert_eq!(w.append, w.drop_newest, "a re-stamp only");
                    apply(&mut store.log, &w);
                }
                prop_assert!(per.allowed || per.write.is_none());
                prop_assert!(conc.allowed || conc.write.is_none());
            }
            // Each limit's promise, over what it charged, enforced or not.
            prop_assert_eq!(store.in_flight, running.iter().sum::<u32>());
            prop_assert!(store.in_flight <= 2);
            prop_assert!(period_units <= 12);
            let recent = window_units.iter().filter(|&&t| t + 25 > now).count();
            prop_assert!(recent <= 2, "{} units in the window at {}", recent, now);
        }
    }
}
