//! `MemoryStorage`'s reservations (src/memory/reserve.rs): waits in turn,
//! a wait too long charges nothing, several limits as one slot, giving back,
//! exact slots under threads, and random sequences against gcra-core's
//! `reserve_all` and `Quota::cancel` over a map.
//!
//! Plain threads and a fake clock: no runtime, no sleep.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use gcra_core::{Charge, JointReservation, Write, reserve_all};
use proptest::prelude::*;
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    BucketCheck, Decided, Decision, LimitName, MemoryStorage, Period,
    PeriodUnit, Quota, Storage, StorageError, Window,
};

const START_US: u64 = 1_000_000_000;
const MS: u64 = 1_000;

fn store() -> (FakeClock, MemoryStorage) {
    let clock = FakeClock::at_us(START_US);
    (clock.clone(), MemoryStorage::with_clock(clock))
}

/// 10 a second, evenly (one every 100 ms), waits up to 1 s.
fn even() -> Quota {
    Quota::per_second(10)
        .allow_burst(1)
        .allow_debt(Duration::from_secs(1))
}

fn reserve(
    store: &MemoryStorage,
    checks: &[BucketCheck<'_>],
    max_wait: Duration,
) -> (Decided, Vec<Decision>) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store.reserve_sync(checks, max_wait, &mut out).unwrap();
    (decided, out)
}

/// What a peek sees of `check`'s bucket: its state, unchanged by it.
fn peek(store: &MemoryStorage, check: &BucketCheck<'_>) -> Decision {
    let mut out = [Decision::default()];
    store.check_sync(&[check.as_peek()], &mut out).unwrap();
    out[0]
}

/// After the clock went back, a bucket's TAT lies beyond its ceiling: a
/// reservation, whether it goes at once, waits or is refused, answers and
/// writes what gcra-core's `reserve_all` does of that TAT (capped), the
/// refused one included (it writes the cap and nothing else).
#[test]
fn a_reservation_after_the_clock_went_back_is_reserve_all_of_the_capped_bucket()
{
    let name = LimitName::of_limit("x").unwrap();
    for (back_ms, max_wait_ms) in
        [(5_000, 0), (5_000, 1_000), (50, 0), (50, 1_000)]
    {
        let (clock, store) = store();
        let check = BucketCheck::new(&name, "p", even(), 1).unwrap();
        reserve(&store, std::slice::from_ref(&check), Duration::ZERO);
        let stored = Some(START_US + 100 * MS);
        let now = START_US - back_ms * MS;
        clock.set_us(now);
        let mut expected = [Decision::default()];
        let joint = reserve_all(
            &[check.charge()],
            &[stored],
            now,
            max_wait_ms * MS,
            &mut expected,
        )
        .unwrap();
        let (decided, out) = reserve(
            &store,
            std::slice::from_ref(&check),
            Duration::from_millis(max_wait_ms),
        );
        let case = format!("back {back_ms} ms, waiting up to {max_wait_ms} ms");
        assert_eq!(decided.verdict, joint.verdict(), "{case}");
        assert_eq!(decided.wait_us, joint.wait_us, "{case}");
        assert_eq!(out[..], expected[..], "{case}");
        let written = expected[0].store.map(|s| s.tat_us).or(stored);
        let model = even().peek(written, now).unwrap();
        assert_eq!(peek(&store, &check), model, "{case}");
    }
}

#[test]
fn callers_wait_in_turn_and_a_wait_too_long_charges_nothing() {
    let (_, store) = store();
    let name = LimitName::new("provider").unwrap();
    let check = BucketCheck::new(&name, "", even(), 1).unwrap();
    let waits: Vec<u64> = (0..=10)
        .map(|_| reserve(&store, &[check], Duration::from_secs(5)).0)
        .inspect(|decided| assert!(decided.verdict.allowed))
        .map(|decided| decided.wait_us)
        .collect();
    assert_eq!(waits, (0..=10).map(|i| i * 100 * MS).collect::<Vec<_>>());

    // The 12th would wait 1.1 s: beyond the quota's debt of 1 s, whatever
    // the caller allows.
    let before = peek(&store, &check);
    let (decided, out) = reserve(&store, &[check], Duration::from_secs(5));
    assert!(!decided.verdict.allowed);
    assert_eq!(decided.wait_us, 1_100 * MS);
    assert_eq!(decided.verdict.retry_after_us, 100 * MS);
    assert_eq!(decided.verdict.refused_by, Some(0));
    assert!(out[0].store.is_none());
    assert_eq!(peek(&store, &check), before);

    // Nor within a caller's own shorter maximum.
    let (decided, _) = reserve(&store, &[check], Duration::from_millis(300));
    assert!(!decided.verdict.allowed);
    assert_eq!(peek(&store, &check), before);
}

#[test]
fn several_limits_reserve_one_slot_or_nothing() {
    let (_, store) = store();
    let (second, day) = (
        LimitName::of_limit("per-second").unwrap(),
        LimitName::of_limit("per-day").unwrap(),
    );
    let per_day = Quota::per_day(3).allow_debt(Duration::from_secs(10));
    let checks = [
        BucketCheck::new(&second, "acct", even(), 1).unwrap(),
        BucketCheck::new(&day, "acct", per_day, 1).unwrap(),
    ];
    // The second's limit spaces the calls; the day's counts each of them.
    for i in 0..3 {
        let (decided, out) = reserve(&store, &checks, Duration::from_secs(1));
        assert!(decided.verdict.allowed);
        assert_eq!(decided.wait_us, i * 100 * MS);
        assert_eq!(out[1].remaining, 2 - i);
    }
    // The day's quota is spent: the wait is hours, nothing is charged in
    // either limit.
    let before = [peek(&store, &checks[0]), peek(&store, &checks[1])];
    let (decided, _) = reserve(&store, &checks, Duration::from_secs(1));
    assert!(!decided.verdict.allowed);
    assert_eq!(decided.verdict.refused_by, Some(1));
    assert_eq!([peek(&store, &checks[0]), peek(&store, &checks[1])], before);
}

#[test]
fn a_reservation_given_back_while_last_is_as_if_never_made() {
    let (clock, store) = store();
    let name = LimitName::new("provider").unwrap();
    let check = BucketCheck::new(&name, "", even(), 1).unwrap();
    reserve(&store, &[check], Duration::from_secs(1));
    let before = peek(&store, &check);
    let (_, out) = reserve(&store, &[check], Duration::from_secs(1));
    store
        .cancel_sync(&[check.cancel(out[0].store.unwrap().tat_us)])
        .unwrap();
    assert_eq!(peek(&store, &check), before);
    // The next caller gets the slot given back.
    let (decided, _) = reserve(&store, &[check], Duration::from_secs(1));
    assert_eq!(decided.wait_us, 100 * MS);

    // Given back after its slot passed: nothing left to give.
    clock.advance(Duration::from_secs(1));
    let (_, out) = reserve(&store, &[check], Duration::from_secs(1));
    clock.advance(Duration::from_secs(1));
    store
        .cancel_sync(&[check.cancel(out[0].store.unwrap().tat_us)])
        .unwrap();
    assert_eq!(peek(&store, &check).remaining, 1);
}

#[test]
fn a_reservation_given_back_after_a_later_one_is_lost_not_handed_out_twice() {
    let (_, store) = store();
    let name = LimitName::new("provider").unwrap();
    let check = BucketCheck::new(&name, "", even(), 1).unwrap();
    let (_, first) = reserve(&store, &[check], Duration::from_secs(1));
    let (_, second) = reserve(&store, &[check], Duration::from_secs(1));
    let before = peek(&store, &check);
    store
        .cancel_sync(&[check.cancel(first[0].store.unwrap().tat_us)])
        .unwrap();
    assert_eq!(peek(&store, &check), before);
    // The later caller keeps its slot; the next waits after it.
    let (decided, out) = reserve(&store, &[check], Duration::from_secs(1));
    assert_eq!(decided.wait_us, 200 * MS);
    assert_eq!(
        out[0].store.unwrap().tat_us,
        second[0].store.unwrap().tat_us + 100 * MS
    );
}

#[test]
fn only_rates_reserve() {
    let (_, store) = store();
    let name = LimitName::of_limit("login").unwrap();
    let window = Window::new(5, Duration::from_secs(60)).unwrap();
    let check = BucketCheck::of_rule(&name, "ana", window.into(), 1).unwrap();
    let mut out = [Decision::default()];
    let error = store
        .reserve_sync(&[check], Duration::from_secs(1), &mut out)
        .unwrap_err();
    assert!(matches!(error, StorageError::Unsupported(_)), "{error}");
    assert!(!error.is_failure());
    assert!(store.capabilities().reserves);

    // A period's count lives in the rates' table: a reservation of one
    // the store holds is refused as well, and leaves its count as it was.
    let quota = Period::new(3, PeriodUnit::Day, 0).unwrap();
    let daily = BucketCheck::of_rule(&name, "bo", quota.into(), 1).unwrap();
    store.check_sync(&[daily], &mut out).unwrap();
    assert_eq!(out[0].remaining, 2);
    let error = store
        .reserve_sync(&[daily], Duration::from_secs(1), &mut out)
        .unwrap_err();
    assert!(matches!(error, StorageError::Unsupported(_)), "{error}");
    store.check_sync(&[daily.as_peek()], &mut out).unwrap();
    assert_eq!(out[0].remaining, 2, "the period's count changed");
}

/// Threads reserving at one instant get every slot once: the waits are
/// exactly 0, T, 2T, ... with none twice and none skipped, alone or as a
/// joint reservation whose buckets they name in opposite orders.
#[test]
fn slots_under_threads_are_each_given_once() {
    const THREADS: usize = 8;
    const EACH: usize = 25;
    let (_, store) = store();
    let store = Arc::new(store);
    let debt = Duration::from_secs(60);
    let quota = Quota::per_second(100).allow_burst(1).allow_debt(debt);
    let roomy = Quota::per_second(1_000).allow_debt(debt);
    let barrier = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (store, barrier) = (store.clone(), barrier.clone());
            thread::spawn(move || {
                let a = LimitName::of_limit("a").unwrap();
                let b = LimitName::of_limit("b").unwrap();
                let even = BucketCheck::new(&a, "", quota, 1).unwrap();
                let other = BucketCheck::new(&b, "", roomy, 1).unwrap();
                barrier.wait();
                (0..EACH)
                    .map(|i| {
                        let checks = match (t + i) % 3 {
                            0 => vec![even],
                            1 => vec![even, other],
                            _ => vec![other, even],
                        };
                        let (decided, _) = reserve(&store, &checks, debt);
                        assert!(decided.verdict.allowed);
                        decided.wait_us
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let waits: Vec<u64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let distinct: BTreeSet<u64> = waits.iter().copied().collect();
    assert_eq!(distinct.len(), THREADS * EACH);
    let expected: BTreeSet<u64> =
        (0..(THREADS * EACH) as u64).map(|i| i * 10 * MS).collect();
    assert_eq!(distinct, expected);
}

// ---------------------------------------------------------------------------
// Random sequences against a model

#[derive(Debug, Clone)]
enum Op {
    Advance(u64),
    /// Reserve these buckets (distinct indices), with these costs, in
    /// shadow or not, waiting at most this long.
    Reserve(Vec<(usize, u32, bool)>, u64),
    /// Give back the n-th reservation made so far (modulo their count).
    Cancel(usize),
}

fn quota_strategy() -> impl Strategy<Value = Quota> {
    (1u32..20, 1u64..5_000, 1u32..6, 0u64..3_000).prop_map(
        |(limit, period_ms, burst, debt_ms)| {
            Quota::new(limit, Duration::from_millis(period_ms))
                .unwrap()
                .allow_burst(burst.min(limit))
                .allow_debt(Duration::from_millis(debt_ms))
        },
    )
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let pick = proptest::sample::subsequence(vec![0usize, 1, 2], 1..=3)
        .prop_flat_map(|buckets| {
            let n = buckets.len();
            (
                Just(buckets),
                proptest::collection::vec(
                    (0u32..3, proptest::bool::weighted(0.2)),
                    n,
                ),
            )
        })
        .prop_map(|(buckets, costs)| {
            buckets
                .into_iter()
                .zip(costs)
                .map(|(b, (cost, shadow))| (b, cost, shadow))
                .collect::<Vec<_>>()
        });
    prop_oneof![
        (0u64..2_000_000).prop_map(Op::Advance),
        (pick, 0u64..4_000_000).prop_map(|(b, w)| Op::Reserve(b, w)),
        (0usize..16).prop_map(Op::Cancel),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every reservation, refusal and give-back is what gcra-core says of a
    /// map of TATs.
    #[test]
    fn reservations_follow_gcra_core(
        quotas in proptest::collection::vec(quota_strategy(), 3),
        ops in proptest::collection::vec(op_strategy(), 1..40),
    ) {
        let (clock, store) = store();
        let names: Vec<LimitName> = ["x", "y", "z"]
            .iter()
            .map(|n| LimitName::of_limit(*n).unwrap())
            .collect();
        let mut now = START_US;
        let mut model: HashMap<usize, u64> = HashMap::new();
        // Each reservation made: its buckets, costs and written TATs.
        let mut made: Vec<Vec<(usize, u32, u64)>> = Vec::new();
        for op in ops {
            match op {
                Op::Advance(us) => {
                    now += us;
                    clock.advance(Duration::from_micros(us));
                }
                Op::Reserve(picked, max_wait_us) => {
                    let checks: Vec<BucketCheck<'_>> = picked
                        .iter()
                        .map(|&(b, cost, shadow)| {
                            let cost = cost.min(quotas[b].burst());
                            BucketCheck::new(&names[b], "p", quotas[b], cost)
                                .unwrap()
                                .shadow(shadow)
                        })
                        .collect();
                    let charges: Vec<Charge> =
                        checks.iter().map(BucketCheck::charge).collect();
                    let stored: Vec<Option<u64>> =
                        picked.iter().map(|(b, _, _)| model.get(b).copied()).collect();
                    let mut expected = vec![Decision::default(); checks.len()];
                    let joint: JointReservation = reserve_all(
                        &charges, &stored, now, max_wait_us, &mut expected,
                    ).unwrap();
                    let (decided, out) = reserve(
                        &store, &checks, Duration::from_micros(max_wait_us),
                    );
                    prop_assert_eq!(decided.verdict, joint.verdict());
                    prop_assert_eq!(decided.wait_us, joint.wait_us);
                    prop_assert_eq!(&out, &expected);
                    let mut written = Vec::new();
                    for ((&(b, _, _), check), decision) in
                        picked.iter().zip(&checks).zip(&expected)
                    {
                        if let Some(store) = decision.store {
                            model.insert(b, store.tat_us);
                            if check.cost() > 0 {
                                written.push((b, check.cost(), store.tat_us));
                            }
                        }
                    }
                    if joint.reserved && !written.is_empty() {
                        made.push(written);
                    }
                }
                Op::Cancel(n) => {
                    if made.is_empty() {
                        continue;
                    }
                    let given = made.remove(n % made.len());
                    let cancels: Vec<_> = given
                        .iter()
                        .map(|&(b, cost, tat)| {
                            BucketCheck::new(&names[b], "p", quotas[b], cost)
                                .unwrap()
                                .cancel(tat)
                        })
                        .collect();
                    store.cancel_sync(&cancels).unwrap();
                    for (cancel, &(b, _, _)) in cancels.iter().zip(&given) {
                        match cancel.write(model.get(&b).copied(), now) {
                            Write::Keep => {}
                            Write::Set(store) => {
                                model.insert(b, store.tat_us);
                            }
                            Write::Clear => {
                                model.remove(&b);
                            }
                        }
                    }
                }
            }
        }
        // What remains: each bucket's peek as the model's.
        for (b, name) in names.iter().enumerate() {
            let check = BucketCheck::peek(name, "p", quotas[b]);
            let expected = quotas[b].peek(model.get(&b).copied(), now).unwrap();
            prop_assert_eq!(peek(&store, &check), expected);
        }
    }
}
