//! Property tests of reservations (`Quota::reserve`, `Quota::cancel`)
//! against an oracle written from the rules in i128, and against the
//! checks they stand for: a reserved request, made at its slot, is a pass.

mod common;

use common::{
    MAX, Params, cost, medium_params, monotone_tick, small_params, tick, u,
};
use gcra_core::{
    Charge, CheckError, Decision, Quota, Reserve, Write, check_all, reserve_all,
};
use proptest::prelude::*;

/// The rules of `Quota::reserve`, from the user's numbers, in i128.
fn oracle(
    p: &Params,
    stored: Option<u64>,
    now: u64,
    cost: u32,
    max_wait: u64,
) -> Result<(bool, i128, Option<i128>), CheckError> {
    if cost == 0 {
        return Err(CheckError::ZeroCost);
    }
    if cost > p.burst() {
        return Err(CheckError::CostExceedsBurst {
            cost,
            burst: p.burst(),
        });
    }
    let now_i = i128::from(now);
    if now_i > MAX {
        return Err(CheckError::TimeOutOfRange);
    }
    let ceiling = now_i + p.ceiling();
    let (tat, capped) = match stored.map(i128::from) {
        Some(s) if s <= MAX && s >= now_i => {
            if s > ceiling {
                (ceiling, true)
            } else {
                (s, false)
            }
        }
        _ => (now_i, false),
    };
    let new_tat = tat + p.t() * i128::from(cost);
    if new_tat > MAX {
        return Err(CheckError::TimeOutOfRange);
    }
    let wait = (new_tat - p.tau() - now_i).max(0);
    let most = i128::from(max_wait).min(p.ceiling() - p.tau());
    if wait <= most {
        Ok((true, wait, Some(new_tat)))
    } else {
        Ok((false, wait, capped.then_some(tat)))
    }
}

fn outcome(reserve: Reserve) -> (bool, i128, Option<i128>) {
    match reserve {
        Reserve::Reserved(r) => (
            true,
            i128::from(r.wait_us),
            Some(i128::from(r.store.tat_us)),
        ),
        Reserve::TooLong { wait_us, store } => (
            false,
            i128::from(wait_us),
            store.map(|s| i128::from(s.tat_us)),
        ),
    }
}

fn any_max_wait() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => 0u64..=200,
        2 => 0u64..=200_000_000,
        1 => Just(u64::MAX),
    ]
}

proptest! {
    #![proptest_config(common::config(
        2048,
        concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/reserve.txt"),
    ))]

    /// Any stored TAT, time, cost and wait: the crate does what the rules
    /// say.
    #[test]
    fn reserve_matches_the_rules(
        p in prop_oneof![small_params(), medium_params()],
        stored in prop::option::of(prop_oneof![
            3 => 0u64..=1_000_000_000,
            1 => any::<u64>(),
        ]),
        now in prop_oneof![3 => 0u64..=1_000_000_000, 1 => any::<u64>()],
        cost in cost(),
        max_wait in any_max_wait(),
    ) {
        let quota = p.quota();
        let cost = cost.resolve(p.burst());
        let got = quota.reserve(stored, now, cost, max_wait).map(outcome);
        prop_assert_eq!(got, oracle(&p, stored, now, cost, max_wait));
    }

    /// Callers reserving at any times, each waiting its slot: made at their
    /// slots, in order, their requests are all passes of a plain check on a
    /// bucket of its own, so they go no faster than the quota; a
    /// reservation too long leaves the bucket as it was.
    #[test]
    fn reservations_are_the_quotas_passes_at_their_slots(
        p in small_params(),
        steps in prop::collection::vec((monotone_tick(), cost(), any_max_wait()), 1..60),
    ) {
        let quota = p.quota();
        let (t, tau) = (p.t(), p.tau());
        let mut now: i128 = 1_000;
        let mut tat: Option<u64> = None;
        let mut slots: Vec<(u64, u32)> = Vec::new();
        for (tick, cost, max_wait) in steps {
            now = tick.apply(now, t, tau);
            let cost = cost.resolve(p.burst()).clamp(1, p.burst());
            match quota.reserve(tat, u(now), cost, max_wait).unwrap() {
                Reserve::Reserved(r) => {
                    prop_assert!(r.wait_us <= max_wait.min(quota.max_wait_us()));
                    tat = Some(r.store.tat_us);
                    slots.push((u(now) + r.wait_us, cost));
                }
                Reserve::TooLong { store, wait_us } => {
                    prop_assert!(store.is_none(), "the clock never went back");
                    prop_assert!(wait_us > max_wait.min(quota.max_wait_us()));
                }
            }
        }
        prop_assert!(slots.windows(2).all(|w| w[0].0 <= w[1].0), "slots in order: {:?}", slots);
        let mut replay: Option<u64> = None;
        for &(at, cost) in &slots {
            let d = quota.check(replay, at, cost).unwrap();
            prop_assert!(d.allowed, "the slot at {} is not a pass: {:?}", at, slots);
            replay = d.store.map(|s| s.tat_us);
        }
        prop_assert_eq!(replay, tat);
    }

    /// A reservation given back while it is the last leaves the bucket as
    /// if it never was: the next reservation is the same as without it.
    /// Given back after a later one, nothing changes.
    #[test]
    fn cancel_is_exact_while_last_and_keeps_later_slots(
        p in small_params(),
        before in prop::option::of(0u64..=2_000),
        now in 0u64..=2_000,
        later in tick(),
        cost in 1u32..=3,
    ) {
        let quota = p.quota();
        let cost = cost.min(p.burst());
        let Reserve::Reserved(r) = quota.reserve(before, now, cost, u64::MAX).unwrap() else {
            return Ok(());
        };
        let after = u(later.apply(i128::from(now), p.t(), p.tau()).max(i128::from(now)));
        let back = match quota.cancel(Some(r.store.tat_us), after, &r) {
            Write::Set(s) => Some(s.tat_us),
            Write::Clear | Write::Keep => None,
        };
        // The same as a bucket that only saw `before`.
        let without = quota.reserve(before, after, 1, u64::MAX).unwrap();
        let with_back = quota.reserve(back, after, 1, u64::MAX).unwrap();
        prop_assert_eq!(
            outcome(with_back),
            outcome(without),
            "before {:?}, reserved {:?}, back {:?}", before, r, back
        );
        // A later reservation keeps its slot: nothing given back.
        if let Reserve::Reserved(next) = quota.reserve(Some(r.store.tat_us), now, 1, u64::MAX).unwrap() {
            prop_assert_eq!(quota.cancel(Some(next.store.tat_us), now, &r), Write::Keep);
        }
    }
}

proptest! {
    #![proptest_config(common::config(
        1024,
        concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/reserve.txt"),
    ))]

    /// Several limits reserve one slot: the earliest instant at which
    /// `check_all` passes them all (an enforced peek in debt included: it
    /// passes once the debt is paid), charged as `check_all` charges them
    /// then; a wait too long charges nothing.
    #[test]
    fn reserve_all_is_check_all_at_the_earliest_common_slot(
        limits in prop::collection::vec(
            (small_params(), prop::option::of(0u64..=3_000), 0u32..=3, any::<bool>()),
            1..4,
        ),
        now in 0u64..=2_000,
        max_wait in any_max_wait(),
    ) {
        let charges: Vec<Charge> = limits
            .iter()
            .map(|(p, _, cost, shadow)| {
                let charge = Charge::new(p.quota(), (*cost).min(p.burst()));
                if *shadow { charge.shadow() } else { charge }
            })
            .collect();
        let stored: Vec<Option<u64>> = limits.iter().map(|l| l.1).collect();
        let mut out = vec![Decision::default(); charges.len()];
        let r = reserve_all(&charges, &stored, now, max_wait, &mut out).unwrap();
        let enforced = || charges.iter().filter(|c| !c.shadow);
        let most = enforced()
            .map(|c| c.quota.max_wait_us())
            .fold(max_wait, u64::min);
        prop_assert_eq!(r.reserved, r.wait_us <= most);
        let go = now + r.wait_us;
        let mut at_go = vec![Decision::default(); charges.len()];
        let verdict = check_all(&charges, &stored, go, &mut at_go).unwrap();
        // A TAT beyond the ceiling (a clock that went back) is capped
        // against each instant's own ceiling: the slot is then the capped
        // bucket's, and never reserved (its wait exceeds the max debt).
        let capped = |c: &Charge, tat: &Option<u64>| {
            tat.is_some_and(|t| t > now + c.quota.ceiling_us())
        };
        let mut all = charges.iter().zip(&stored);
        if all.clone().any(|(c, tat)| capped(c, tat)) {
            prop_assert!(
                !r.reserved
                    || !all.any(|(c, tat)| capped(c, tat) && !c.shadow && c.cost > 0)
            );
            return Ok(());
        }
        prop_assert!(verdict.allowed, "every limit passes at {}", go);
        if r.wait_us == 0 {
            // Nothing waits: the reservation is the decision at `now`, whole.
            prop_assert_eq!(r.by, None);
            prop_assert_eq!(&out, &at_go);
        }
        if r.wait_us > 0 {
            let mut before = vec![Decision::default(); charges.len()];
            let earlier = check_all(&charges, &stored, go - 1, &mut before).unwrap();
            prop_assert!(!earlier.allowed, "and not a microsecond earlier");
        }
        for (i, (got, then)) in out.iter().zip(&at_go).enumerate() {
            if charges[i].cost == 0 {
                prop_assert_eq!(*got, charges[i].quota.peek(stored[i], now).unwrap());
            } else if r.reserved {
                prop_assert_eq!(got.store.map(|s| s.tat_us), then.store.map(|s| s.tat_us), "limit {}", i);
                prop_assert_eq!(got.allowed, then.allowed);
                if let Some(s) = got.store {
                    prop_assert_eq!(s.ttl_ms, (s.tat_us - now).div_ceil(1000));
                }
            } else {
                let stands = charges[i].quota.peek(stored[i], now).unwrap();
                prop_assert_eq!(got.remaining, stands.remaining);
                // Only a TAT from a clock that went back is written: capped.
                let ceiling = now + charges[i].quota.ceiling_us();
                prop_assert!(
                    got.store.is_none_or(|s| s.tat_us == ceiling && stored[i] > Some(ceiling)),
                    "{:?}", got
                );
            }
        }
    }
}

#[test]
fn a_burst_of_one_spaces_every_caller_by_the_interval() {
    let quota = Quota::per_second(20)
        .allow_burst(1)
        .allow_debt(std::time::Duration::from_secs(10));
    let mut tat = None;
    let mut at = Vec::new();
    // 200 callers at once: each waits one interval (50 ms) more.
    for _ in 0..200 {
        let Reserve::Reserved(r) = quota.reserve(tat, 0, 1, u64::MAX).unwrap()
        else {
            panic!("a wait within the debt is reserved");
        };
        tat = Some(r.store.tat_us);
        at.push(r.wait_us);
    }
    let expected: Vec<u64> = (0..200).map(|k| k * 50_000).collect();
    assert_eq!(at, expected);
    // The 201st would wait 10 s: beyond its 1 s.
    assert_eq!(
        quota.reserve(tat, 0, 1, 1_000_000),
        Ok(Reserve::TooLong {
            wait_us: 10_000_000,
            store: None
        })
    );
}
