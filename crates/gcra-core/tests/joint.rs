//! Peek, settle and the joint decision over several limits, against
//! oracles written here from their contracts, and the GCRA invariants they
//! must keep.

mod common;

use common::{Params, medium_params, small_params, u};
use gcra_core::{
    Adjust, Charge, CheckError, Decision, JointError, Quota, StoreTat, Verdict,
    Write, check_all,
};
use proptest::prelude::*;

const SECOND: u64 = 1_000_000;

fn params() -> impl Strategy<Value = Params> {
    prop_oneof![3 => small_params(), 1 => medium_params()]
}

/// A TAT around `now`: none, behind, a burst ahead, a debt, or capped.
fn stored_near(now: i128, tau: i128, raw: Option<u64>) -> Option<u64> {
    raw.map(|raw| u((now - tau + i128::from(raw) % (4 * tau + 2)).max(0)))
}

/// The joint contract, composed from single-bucket decisions.
fn oracle(
    charges: &[Charge],
    stored: &[Option<u64>],
    now: u64,
) -> Result<(Verdict, Vec<Decision>), JointError> {
    let mut alone = Vec::new();
    for (index, (c, tat)) in charges.iter().zip(stored).enumerate() {
        let d = if c.cost == 0 {
            c.quota.peek(*tat, now)
        } else {
            c.quota.check(*tat, now, c.cost)
        };
        alone.push(d.map_err(|error| JointError::Charge { index, error })?);
    }
    let mut refused_by = None;
    let mut wait = 0;
    for (i, (c, d)) in charges.iter().zip(&alone).enumerate() {
        if !c.shadow
            && !d.allowed
            && (refused_by.is_none() || d.retry_after_us > wait)
        {
            refused_by = Some(i);
            wait = d.retry_after_us;
        }
    }
    if refused_by.is_none() {
        let verdict = Verdict {
            allowed: true,
            retry_after_us: 0,
            refused_by,
        };
        return Ok((verdict, alone));
    }
    let out = charges
        .iter()
        .zip(stored)
        .zip(alone)
        .map(|((c, tat), d)| {
            if !d.allowed || c.cost == 0 {
                return d;
            }
            // Would have passed: the bucket as it stands. A peek says that,
            // and the write is only a cap (what a refusal would store).
            let peek = c.quota.peek(*tat, now).unwrap();
            let cap = c.quota.check(*tat, now, c.quota.burst()).unwrap();
            let capped = match cap.store {
                Some(s) if !cap.allowed => Some(s),
                _ => None,
            };
            Decision {
                store: capped,
                ..peek
            }
        })
        .collect();
    Ok((
        Verdict {
            allowed: false,
            retry_after_us: wait,
            refused_by,
        },
        out,
    ))
}

fn charge() -> impl Strategy<Value = (Params, u32, bool, Option<u64>)> {
    (
        params(),
        prop_oneof![1 => Just(0u32), 6 => 1u32..=4, 1 => 5u32..=20],
        prop::bool::weighted(0.2),
        prop::option::weighted(0.8, any::<u64>()),
    )
}

proptest! {
    #![proptest_config(common::config(
        1024,
        concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/joint.txt"),
    ))]

    /// Every field of every bucket's answer, the verdict and each write.
    #[test]
    fn check_all_matches_its_contract(
        now in 0u64..1_000_000_000,
        limits in prop::collection::vec(charge(), 1..6),
    ) {
        let charges: Vec<Charge> = limits
            .iter()
            .map(|(p, cost, shadow, _)| Charge {
                quota: p.quota(),
                cost: (*cost).min(p.burst()),
                shadow: *shadow,
            })
            .collect();
        let stored: Vec<Option<u64>> = limits
            .iter()
            .map(|(p, _, _, raw)| stored_near(i128::from(now), p.tau(), *raw))
            .collect();
        let mut out = vec![Decision::default(); charges.len()];
        let got = check_all(&charges, &stored, now, &mut out);
        let want = oracle(&charges, &stored, now);
        match (got, want) {
            (Ok(verdict), Ok((v, decisions))) => {
                prop_assert_eq!(verdict, v);
                prop_assert_eq!(out, decisions);
            }
            (got, want) => prop_assert_eq!(got, want.map(|(v, _)| v)),
        }
    }

    /// A tier and an endpoint limit of one user, hammered: exactly the
    /// tighter one's quota passes, and a refused request charges nothing
    /// (the tier's remaining proves it).
    #[test]
    fn the_tighter_limit_decides_and_a_refusal_charges_nothing(
        plan in 1u32..=50,
        endpoint in 1u32..=50,
        requests in 1u32..=120,
    ) {
        let charges = [
            Charge::new(Quota::per_minute(plan), 1),
            Charge::new(Quota::per_minute(endpoint), 1),
        ];
        let mut stored = [None, None];
        let mut passed = 0;
        for _ in 0..requests {
            let mut out = [Decision::default(); 2];
            let verdict = check_all(&charges, &stored, 0, &mut out).unwrap();
            if verdict.allowed {
                passed += 1;
            }
            for (tat, d) in stored.iter_mut().zip(out) {
                if let Some(s) = d.store {
                    *tat = Some(s.tat_us);
                }
            }
        }
        let expected = requests.min(plan).min(endpoint);
        prop_assert_eq!(passed, expected);
        let left = charges[0].quota.peek(stored[0], 0).unwrap().remaining;
        prop_assert_eq!(left, u64::from(plan - expected));
    }

    /// A peek writes nothing, and its `remaining` is exact: that many
    /// requests of cost 1 pass now, and the next does not. It refuses
    /// exactly while the bucket is in debt (more than tau ahead), until
    /// the debt is paid: then a request of cost 1 waits one interval more.
    #[test]
    fn peek_is_exact_and_writes_nothing(
        p in params(),
        now in 0u64..1_000_000_000,
        raw in prop::option::of(any::<u64>()),
    ) {
        let quota = p.quota();
        let mut tat = stored_near(i128::from(now), p.tau(), raw);
        let peek = quota.peek(tat, now).unwrap();
        prop_assert!(peek.store.is_none());
        prop_assert!(i128::from(peek.reset_after_us) <= p.ceiling());
        let debt = (i128::from(peek.reset_after_us) - p.tau()).max(0);
        prop_assert_eq!(peek.allowed, debt == 0);
        prop_assert_eq!(i128::from(peek.retry_after_us), debt);
        if !peek.allowed {
            let next = quota.check(tat, now, 1).unwrap();
            prop_assert_eq!(
                i128::from(next.retry_after_us),
                debt + p.t()
            );
        }
        for _ in 0..peek.remaining {
            let d = quota.check(tat, now, 1).unwrap();
            prop_assert!(d.allowed);
            tat = d.store.map(|s| s.tat_us);
        }
        prop_assert!(!quota.check(tat, now, 1).unwrap().allowed);
    }

    /// What a charge would have met, told from a peek of its bucket alone
    /// (a store that read a bucket instead of charging it): the refusal a
    /// real check of the same bucket at the same time gives (the same wait,
    /// the same time to full), or the peek itself when the check passes.
    #[test]
    fn would_meet_answers_as_the_check_it_stands_for(
        p in params(),
        now in 0u64..1_000_000_000,
        raw in prop::option::of(any::<u64>()),
        cost in prop_oneof![Just(0u32), 1u32..=4, 1u32..=40],
    ) {
        let quota = p.quota();
        let cost = cost.min(p.burst());
        let tat = stored_near(i128::from(now), p.tau(), raw);
        let peek = quota.peek(tat, now).unwrap();
        let would = Charge::new(quota, cost).would_meet(&peek);
        if cost == 0 {
            prop_assert_eq!(would, peek);
            return Ok(());
        }
        let real = quota.check(tat, now, cost).unwrap();
        prop_assert_eq!(would.allowed, real.allowed);
        if real.allowed {
            prop_assert_eq!(would, peek);
        } else {
            prop_assert_eq!(would.retry_after_us, real.retry_after_us);
            prop_assert_eq!(would.reset_after_us, real.reset_after_us);
            prop_assert_eq!(would.remaining, real.remaining);
            prop_assert!(would.store.is_none());
        }
    }

    /// Settling: a charge moves the TAT by exactly `T * n` up to the
    /// ceiling, never refusing; a refund by exactly `T * n` down to now; the
    /// write is what the store must hold, and the next check waits for it.
    #[test]
    fn settle_moves_the_tat_exactly_within_now_and_the_ceiling(
        p in params(),
        now in 0u64..1_000_000_000,
        raw in prop::option::of(any::<u64>()),
        units in prop_oneof![Just(0u32), 1u32..=30, any::<u32>()],
        refund in any::<bool>(),
    ) {
        let quota = p.quota();
        let (t, ceiling) = (p.t(), p.ceiling());
        let now_i = i128::from(now);
        let tat = stored_near(now_i, p.tau(), raw);
        // Where the bucket stands (rule 1), computed here.
        let stand = match tat.map(i128::from) {
            Some(s) if s >= now_i => s.min(now_i + ceiling),
            _ => now_i,
        };
        let adjust = if refund { Adjust::Refund(units) } else { Adjust::Charge(units) };
        let settled = quota.settle(tat, now, adjust).unwrap();
        let moved = t * i128::from(units);
        let expected = if refund {
            (stand - moved).max(now_i)
        } else {
            (stand + moved).min(now_i + ceiling)
        };
        let after = match settled.write {
            Write::Keep => tat.map_or(now_i, |s| i128::from(s).max(now_i)),
            Write::Set(StoreTat { tat_us, ttl_ms }) => {
                prop_assert_eq!(i128::from(ttl_ms), (i128::from(tat_us) - now_i + 999) / 1000);
                i128::from(tat_us)
            }
            Write::Clear => now_i,
        };
        prop_assert_eq!(after.max(now_i).min(now_i + ceiling), expected);
        prop_assert_eq!(i128::from(settled.reset_after_us), expected - now_i);
        if settled.write == Write::Keep {
            prop_assert_eq!(expected, stand);
        }
        // What the next request sees is the settled bucket.
        let stored_after = match settled.write {
            Write::Keep => tat,
            Write::Set(s) => Some(s.tat_us),
            Write::Clear => None,
        };
        let next = quota.peek(stored_after, now).unwrap();
        prop_assert_eq!(next.remaining, settled.remaining);
    }

    /// Charging a settlement and refunding it at once restores the bucket,
    /// unless the charge hit the ceiling.
    #[test]
    fn a_refund_undoes_a_charge(
        p in params(),
        now in 0u64..1_000_000_000,
        raw in prop::option::of(any::<u64>()),
        units in 1u32..=30,
    ) {
        let quota = p.quota();
        // Within a burst of now: a charge of a few units stays off the ceiling.
        let tau = p.tau();
        let tat = raw.map(|raw| u((i128::from(now) - tau + i128::from(raw) % (2 * tau + 1)).max(0)));
        let stand = quota.peek(tat, now).unwrap().reset_after_us;
        let units = 1 + (units - 1) % p.burst();
        let charged = quota.settle(tat, now, Adjust::Charge(units)).unwrap();
        // At the ceiling already, a charge changes nothing to undo.
        let Write::Set(s) = charged.write else {
            prop_assume!(false);
            unreachable!()
        };
        prop_assume!(i128::from(s.tat_us - now) < p.ceiling());
        let back = quota.settle(Some(s.tat_us), now, Adjust::Refund(units)).unwrap();
        prop_assert_eq!(back.reset_after_us, stand);
    }
}

#[test]
fn the_post_numbers_with_a_search_limit() {
    // Free (10/min) and search (3/min): three searches pass, the fourth is
    // refused by `search` with its wait, and the tier keeps 7.
    let charges = [
        Charge::new(Quota::per_minute(10), 1),
        Charge::new(Quota::per_minute(3), 1),
    ];
    let mut stored = [None, None];
    for expected_left in [9, 8, 7] {
        let mut out = [Decision::default(); 2];
        let v = check_all(&charges, &stored, 0, &mut out).unwrap();
        assert!(v.allowed);
        assert_eq!(out[0].remaining, expected_left);
        stored = [
            out[0].store.map(|s| s.tat_us),
            out[1].store.map(|s| s.tat_us),
        ];
    }
    let mut out = [Decision::default(); 2];
    let v = check_all(&charges, &stored, 0, &mut out).unwrap();
    assert_eq!(
        v,
        Verdict {
            allowed: false,
            retry_after_us: 20 * SECOND,
            refused_by: Some(1)
        }
    );
    assert_eq!(
        (out[0].allowed, out[0].remaining, out[0].store),
        (true, 7, None)
    );
    assert_eq!((out[1].allowed, out[1].store), (false, None));
}

#[test]
fn a_shadow_limit_reports_without_refusing_and_is_charged_only_when_it_passes()
{
    let charges = [
        Charge::new(Quota::per_minute(10), 1),
        Charge::new(Quota::per_minute(1), 1).shadow(),
    ];
    let mut stored = [None, None];
    let mut shadow_refusals = 0;
    for _ in 0..4 {
        let mut out = [Decision::default(); 2];
        let v = check_all(&charges, &stored, 0, &mut out).unwrap();
        assert!(v.allowed && v.refused_by.is_none());
        if !out[1].allowed {
            shadow_refusals += 1;
            assert_eq!(out[1].store, None);
        }
        stored = [
            out[0].store.map(|s| s.tat_us).or(stored[0]),
            out[1].store.map(|s| s.tat_us).or(stored[1]),
        ];
    }
    assert_eq!(shadow_refusals, 3);
    // The shadow bucket holds exactly one charge, as if it were enforced.
    assert_eq!(stored[1], Some(60 * SECOND));
    assert_eq!(stored[0], Some(24 * SECOND));
}

#[test]
fn the_longest_wait_names_the_refusal_and_ties_go_to_the_first() {
    let full = Some(60 * SECOND);
    let charges = [
        Charge::new(Quota::per_minute(10), 1), // waits 6 s
        Charge::new(Quota::per_minute(2), 1),  // waits 30 s
        Charge::new(Quota::per_minute(2), 1),  // waits 30 s too
    ];
    let mut out = [Decision::default(); 3];
    let v = check_all(&charges, &[full, full, full], 0, &mut out).unwrap();
    assert_eq!((v.refused_by, v.retry_after_us), (Some(1), 30 * SECOND));
}

#[test]
fn errors_name_the_limit_and_decide_nothing() {
    let charges = [
        Charge::new(Quota::per_minute(10), 1),
        Charge::new(Quota::per_minute(3), 4),
    ];
    let mut out = [Decision::default(); 2];
    assert_eq!(
        check_all(&charges, &[None, None], 0, &mut out),
        Err(JointError::Charge {
            index: 1,
            error: CheckError::CostExceedsBurst { cost: 4, burst: 3 }
        })
    );
    assert_eq!(
        check_all(&charges, &[None], 0, &mut out),
        Err(JointError::LengthMismatch)
    );
    assert_eq!(
        JointError::Charge {
            index: 1,
            error: CheckError::ZeroCost
        }
        .to_string(),
        "limit 1: request cost must be at least 1"
    );
}

#[test]
fn a_settled_debt_survives_the_clock_back_cap() {
    // SPEC: 1200 tokens on 1000/min: the next request waits about 12 s.
    let quota = Quota::per_minute(1000);
    let first = quota.check(None, 0, 1).unwrap();
    let settled = quota
        .settle(first.store.map(|s| s.tat_us), 0, Adjust::between(1, 1200))
        .unwrap();
    let Write::Set(debt) = settled.write else {
        panic!("{settled:?}")
    };
    assert_eq!(debt.tat_us, 72 * SECOND);
    assert_eq!(settled.remaining, 0);
    let next = quota.check(Some(debt.tat_us), 0, 1).unwrap();
    assert_eq!(next.retry_after_us, 12_060_000);
    assert_eq!(next.store, None, "the debt is not capped away");
    // With the default bound, a debt beyond an hour stops at the ceiling.
    let huge = quota.settle(None, 0, Adjust::Charge(u32::MAX)).unwrap();
    assert_eq!(
        huge.write,
        Write::Set(StoreTat {
            tat_us: 3_660 * SECOND,
            ttl_ms: 3_660_000
        })
    );
}

#[test]
fn an_unbounded_debt_is_carried_whole_through_every_later_check() {
    // SPEC: 1,000,000 tokens on 1000/min: the next request waits about
    // 1000 minutes, and no later check caps the debt away.
    let quota = Quota::per_minute(1000).unbounded_debt();
    let first = quota.check(None, 0, 1).unwrap();
    let settled = quota
        .settle(
            first.store.map(|s| s.tat_us),
            0,
            Adjust::between(1, 1_000_000),
        )
        .unwrap();
    let Write::Set(debt) = settled.write else {
        panic!("{settled:?}")
    };
    assert_eq!(debt.tat_us, 60_000 * SECOND);
    let mut now = 0;
    while now < 59_000 * SECOND {
        let next = quota.check(Some(debt.tat_us), now, 1).unwrap();
        assert!(!next.allowed, "passed at {now} µs");
        assert_eq!(next.store, None, "the debt is capped at {now} µs");
        assert_eq!(
            next.retry_after_us,
            60_000 * SECOND + 60_000 - 60 * SECOND - now
        );
        now += 997 * SECOND;
    }
    // A clock that jumped back beyond even that bound is still capped.
    let bounded = Quota::per_minute(1000)
        .allow_debt(std::time::Duration::from_secs(3600));
    let jumped = bounded.check(Some(10_000 * SECOND), 0, 1).unwrap();
    assert_eq!(jumped.store.map(|s| s.tat_us), Some(3660 * SECOND));
}

#[test]
fn a_refund_never_moves_a_tat_below_now() {
    let quota = Quota::per_minute(10);
    let s = quota
        .settle(Some(12 * SECOND), 0, Adjust::Refund(5))
        .unwrap();
    assert_eq!(s.write, Write::Clear);
    assert_eq!((s.remaining, s.reset_after_us), (10, 0));
    // Nothing to refund in a full bucket.
    let s = quota.settle(None, 0, Adjust::Refund(5)).unwrap();
    assert_eq!(s.write, Write::Keep);
    let s = quota
        .settle(Some(30 * SECOND), 0, Adjust::Refund(2))
        .unwrap();
    assert_eq!(
        s.write,
        Write::Set(StoreTat {
            tat_us: 18 * SECOND,
            ttl_ms: 18_000
        })
    );
}

#[test]
fn a_settlement_at_the_end_of_time_is_a_typed_error_and_up_to_it_is_not() {
    // T = tau = 1 s. At now = 2^53 - 3 s a charge of 2 lands at 2^53 - 1 s
    // (fine), a charge of 4 beyond the ceiling stops at now + 2 s = 2^53 - 1 s
    // too; now = 2^53 - 1 s and a charge of 1 lands exactly on 2^53.
    use gcra_core::MAX_TIME_US;
    let quota = Quota::per_second(1);
    let now = MAX_TIME_US - 3 * SECOND;
    let fits = quota.settle(None, now, Adjust::Charge(2)).unwrap();
    assert_eq!(fits.reset_after_us, 2 * SECOND);
    let edge = MAX_TIME_US - SECOND;
    let exactly = quota.settle(None, edge, Adjust::Charge(1)).unwrap();
    assert_eq!(exactly.reset_after_us, SECOND, "a TAT of exactly 2^53");
    let beyond = quota.unbounded_debt().settle(None, edge, Adjust::Charge(2));
    assert_eq!(beyond, Err(CheckError::TimeOutOfRange));
}
