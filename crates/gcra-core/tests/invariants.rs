//! Property tests of the GCRA invariants, with the store simulated here: an
//! `Option<u64>` TAT to which every `Decision::store` is applied.

mod common;

use common::{
    MAX, Params, Tick, cost, medium_params, monotone_tick, small_params, tick,
    u,
};
use gcra_core::{CheckError, Decision, MAX_TIME_US, Quota};
use proptest::prelude::*;

/// A store holding one bucket, and the clock.
#[derive(Debug, Clone)]
struct Sim {
    quota: Quota,
    tat: Option<u64>,
}

impl Sim {
    /// Checks and applies the decision's write, as a store does.
    fn check(&mut self, now: u64, cost: u32) -> Result<Decision, CheckError> {
        let result = self.quota.check(self.tat, now, cost);
        if let Ok(Decision { store: Some(s), .. }) = result {
            self.tat = Some(s.tat_us);
        }
        result
    }
}

fn params() -> impl Strategy<Value = Params> {
    prop_oneof![3 => small_params(), 1 => medium_params()]
}

/// What the store holds before the first request.
#[derive(Debug, Clone, Copy)]
enum Initial {
    Empty,
    /// A TAT up to 3 tau ahead of the start (beyond tau: a debt; beyond
    /// 2 tau: a clock that went back).
    Ahead(u64),
    /// A TAT in the past.
    Behind(u64),
    /// Garbage beyond 2^53.
    Corrupt(u64),
}

impl Initial {
    fn resolve(self, start: i128, tau: i128) -> Option<u64> {
        match self {
            Initial::Empty => None,
            Initial::Ahead(raw) => {
                Some(u(start + i128::from(raw) % (3 * tau + 1)))
            }
            Initial::Behind(raw) => {
                Some(u((start - i128::from(raw) % (tau + 1)).max(0)))
            }
            Initial::Corrupt(raw) => {
                Some(MAX_TIME_US + 1 + raw % (u64::MAX - MAX_TIME_US))
            }
        }
    }
}

fn initial() -> impl Strategy<Value = Initial> {
    prop_oneof![
        2 => Just(Initial::Empty),
        2 => any::<u64>().prop_map(Initial::Ahead),
        1 => any::<u64>().prop_map(Initial::Behind),
        1 => any::<u64>().prop_map(Initial::Corrupt),
    ]
}

/// Times start early and move by at most a few tau per step, so with these
/// quotas they stay far below 2^53: no `TimeOutOfRange` in these tests.
fn start() -> impl Strategy<Value = i128> {
    (0i128..1_000_000).boxed()
}

proptest! {
    #![proptest_config(common::config(
        512,
        concat!(env!("CARGO_MANIFEST_DIR"), "/proptest-regressions/invariants.txt"),
    ))]

    /// (a) Over any window of a monotone clock, the cost allowed is at most
    /// `B + t / T`, stated exactly in integers:
    ///
    /// for allowed requests `i <= j` at times `s_i <= s_j`,
    /// `T * (c_i + ... + c_j) <= tau + (s_j - s_i)`.
    ///
    /// Why: with a monotone clock the TAT is capped at most once, before any
    /// request is allowed (after a decision the stored TAT is at most
    /// `now + tau`, hence at most `later + tau`), so from request `i` on the
    /// TAT only grows: the effective TAT at `i` is `>= s_i`, each allowed
    /// request adds `T * c`, and a refusal leaves it alone. So the new TAT
    /// after `j` is `>= s_i + T * (c_i + ... + c_j)`, and being allowed means
    /// it is `<= s_j + tau`. For a window `[t0, t0 + t]` take `i`, `j` the
    /// first and last allowed requests in it: `T * C <= tau + t`, i.e.
    /// `C <= B + t / T` (without rounding `t / T` up or down).
    #[test]
    fn a_window_never_exceeds_burst_plus_rate(
        p in params(),
        start in start(),
        init in initial(),
        steps in prop::collection::vec((monotone_tick(), cost()), 1..120),
    ) {
        let (t, tau) = (p.t(), p.tau());
        let mut sim = Sim { quota: p.quota(), tat: init.resolve(start, tau) };
        let mut now = start;
        let mut allowed: Vec<(i128, i128)> = Vec::new(); // (time, cost)
        for (tick, cost) in steps {
            now = tick.apply(now, t, tau);
            let cost = cost.resolve(p.burst());
            if let Ok(d) = sim.check(u(now), cost)
                && d.allowed
            {
                allowed.push((now, i128::from(cost)));
            }
        }
        for i in 0..allowed.len() {
            let mut total = 0;
            for j in i..allowed.len() {
                total += allowed[j].1;
                let span = allowed[j].0 - allowed[i].0;
                prop_assert!(
                    t * total <= tau + span,
                    "cost {} allowed in {} µs from request {} to {}: T = {}, tau = {}",
                    total, span, i, j, t, tau
                );
            }
        }
    }

    /// (a, tight) A greedy client of cost 1 on an empty bucket, retrying
    /// exactly after `retry_after`, gets exactly `B + floor(t / T)` requests in
    /// `[t0, t0 + t]`: the bound above is reached, GCRA is not stingier.
    #[test]
    fn a_bound_is_reached_by_a_greedy_client(
        p in small_params(),
        t0 in 0u64..1_000_000,
        intervals in 0u64..40,
        extra in 0u64..10,
    ) {
        let t = u(p.t());
        let window = intervals * t + extra % t;
        let mut sim = Sim { quota: p.quota(), tat: None };
        let mut now = t0;
        let mut count = 0u64;
        let most = u64::from(p.burst()) + window / t;
        while now <= t0 + window {
            let d = sim.check(now, 1).unwrap();
            if d.allowed {
                count += 1;
                // Beyond the bound: a broken limiter, not a long wait.
                prop_assert!(count <= most, "{} passed, at most {}", count, most);
            } else {
                prop_assert!(d.retry_after_us >= 1);
                now += d.retry_after_us;
            }
        }
        prop_assert_eq!(count, most);
    }

    /// (b) After a refusal with `retry_after = r`, the same request passes at
    /// `now + r` and not at `now + r - 1` (nothing in between). Also: `r` is
    /// at least 1 µs and at most `T * cost` plus the debt the TAT carries
    /// beyond `tau` (at most the quota's max debt, a capped TAT included).
    #[test]
    fn b_retry_after_is_exact(
        p in params(),
        start in start(),
        init in initial(),
        steps in prop::collection::vec((tick(), cost()), 1..80),
    ) {
        let (t, tau) = (p.t(), p.tau());
        let mut sim = Sim { quota: p.quota(), tat: init.resolve(start, tau) };
        let mut now = start;
        for (tick, cost) in steps {
            now = tick.apply(now, t, tau);
            let cost = cost.resolve(p.burst());
            let Ok(d) = sim.check(u(now), cost) else { continue };
            if d.allowed {
                continue;
            }
            let r = i128::from(d.retry_after_us);
            let debt = (i128::from(d.reset_after_us) - tau).max(0);
            let max_debt = p.ceiling() - tau;
            prop_assert!(debt <= max_debt, "debt {} beyond {}", debt, max_debt);
            prop_assert!(
                r >= 1 && r <= t * i128::from(cost) + debt,
                "retry {} for cost {} with debt {}", r, cost, debt
            );
            let at_retry = sim.clone().check(u(now + r), cost).unwrap();
            prop_assert!(
                at_retry.allowed,
                "refused again at now + {}: {:?}", r, at_retry
            );
            let just_before = sim.clone().check(u(now + r - 1), cost).unwrap();
            prop_assert!(!just_before.allowed, "allowed at now + {} - 1", r);
            // One µs early, the wait is exactly one µs.
            prop_assert_eq!(just_before.retry_after_us, 1);
        }
    }

    /// (c) `remaining` never exceeds `B - cost` on an allowed request, is 0
    /// on a refusal, and is exact: that many more requests of cost 1 pass
    /// right now, and the next one does not.
    #[test]
    fn c_remaining_is_bounded_and_exact(
        p in params(),
        start in start(),
        init in initial(),
        steps in prop::collection::vec((tick(), cost()), 1..60),
    ) {
        let (t, tau) = (p.t(), p.tau());
        let mut sim = Sim { quota: p.quota(), tat: init.resolve(start, tau) };
        let mut now = start;
        for (tick, cost) in steps {
            now = tick.apply(now, t, tau);
            let cost = cost.resolve(p.burst());
            let Ok(d) = sim.check(u(now), cost) else { continue };
            if !d.allowed {
                prop_assert_eq!(d.remaining, 0);
                continue;
            }
            prop_assert!(
                d.remaining <= u64::from(p.burst() - cost),
                "remaining {} > B {} - cost {}", d.remaining, p.burst(), cost
            );
            let mut probe = sim.clone();
            for k in (0..d.remaining).rev() {
                let next = probe.check(u(now), 1).unwrap();
                prop_assert!(next.allowed);
                prop_assert_eq!(next.remaining, k);
            }
            prop_assert!(!probe.check(u(now), 1).unwrap().allowed);
        }
    }

    /// (d) `reset_after <=` the ceiling (`tau + max debt`) always, and
    /// `<= tau` when allowed (only a
    /// refusal sees a debt); every write's ttl covers it, rounded
    /// up to the millisecond but not further (`ttl_ms * 1000 >= reset_after`,
    /// `< reset_after + 1000`, at least 1 ms), and the written TAT is
    /// `now + reset_after`. And it means what it says: with no request in
    /// between, the whole burst passes at `now + reset_after`, not 1 µs
    /// before.
    #[test]
    fn d_reset_after_and_ttl(
        p in params(),
        start in start(),
        init in initial(),
        steps in prop::collection::vec((tick(), cost()), 1..80),
    ) {
        let (t, tau) = (p.t(), p.tau());
        let mut sim = Sim { quota: p.quota(), tat: init.resolve(start, tau) };
        let mut now = start;
        for (tick, cost) in steps {
            now = tick.apply(now, t, tau);
            let cost = cost.resolve(p.burst());
            let Ok(d) = sim.check(u(now), cost) else { continue };
            let reset = i128::from(d.reset_after_us);
            prop_assert!(reset <= p.ceiling(), "reset_after {} > ceiling {}", reset, p.ceiling());
            if d.allowed {
                prop_assert!(reset <= tau, "allowed with reset_after {} > tau {}", reset, tau);
                prop_assert!(d.store.is_some(), "an allowed request must be stored");
            }
            if let Some(s) = d.store {
                let ttl_us = i128::from(s.ttl_ms) * 1000;
                prop_assert!(s.ttl_ms >= 1);
                prop_assert!(
                    ttl_us >= reset && ttl_us < reset + 1000,
                    "ttl {} ms for {} µs", s.ttl_ms, reset
                );
                prop_assert_eq!(i128::from(s.tat_us), now + reset);
            }
            let burst = p.burst();
            prop_assert!(sim.clone().check(u(now + reset), burst).unwrap().allowed);
            if reset > 0 {
                let early = sim.clone().check(u(now + reset - 1), burst);
                prop_assert!(!early.unwrap().allowed);
            }
        }
    }

    /// (e) A refusal writes nothing, unless the stored TAT was beyond
    /// the ceiling, `now + tau + max debt` (the clock went back): then it
    /// writes exactly that.
    /// Errors never write (`check` returns no decision at all).
    #[test]
    fn e_refusal_only_writes_a_capped_tat(
        p in params(),
        start in start(),
        init in initial(),
        steps in prop::collection::vec((tick(), cost()), 1..80),
    ) {
        let (t, tau) = (p.t(), p.tau());
        let mut sim = Sim { quota: p.quota(), tat: init.resolve(start, tau) };
        let mut now = start;
        for (tick, cost) in steps {
            now = tick.apply(now, t, tau);
            let cost = cost.resolve(p.burst());
            let before = sim.tat;
            let result = sim.check(u(now), cost);
            let d = match result {
                Ok(d) => d,
                Err(e) => {
                    prop_assert!(
                        matches!(
                            e,
                            CheckError::ZeroCost
                                | CheckError::CostExceedsBurst { .. }
                        ),
                        "unexpected {:?}", e
                    );
                    prop_assert_eq!(sim.tat, before);
                    continue;
                }
            };
            if d.allowed {
                continue;
            }
            let stored = before.map(i128::from).filter(|&s| s <= MAX);
            let ceiling = p.ceiling();
            if stored.is_some_and(|s| s > now + ceiling) {
                let s = d.store.unwrap();
                prop_assert_eq!(i128::from(s.tat_us), now + ceiling);
                prop_assert_eq!(s.ttl_ms, u((ceiling + 999) / 1000));
                prop_assert_eq!(d.reset_after_us, u(ceiling));
                prop_assert_eq!(
                    i128::from(d.retry_after_us),
                    ceiling - tau + t * i128::from(cost)
                );
            } else {
                prop_assert_eq!(d.store, None);
                prop_assert_eq!(sim.tat, before);
            }
        }
    }

    /// A TAT at or before now is a full bucket: the same answer as no TAT.
    #[test]
    fn stale_tat_is_the_same_as_none(
        p in params(),
        now in 0u64..1_000_000_000,
        behind in 0u64..1_000_000_000,
        cost in cost(),
    ) {
        let quota = p.quota();
        let cost = cost.resolve(p.burst());
        let stale = now.saturating_sub(behind);
        let fresh = quota.check(None, now, cost);
        prop_assert_eq!(quota.check(Some(stale), now, cost), fresh);
        prop_assert_eq!(quota.check(Some(now), now, cost), fresh);
    }

    /// With a monotone clock the stored TAT never moves backwards.
    #[test]
    fn monotone_clock_never_moves_the_tat_back(
        p in params(),
        start in start(),
        steps in prop::collection::vec((monotone_tick(), cost()), 1..80),
    ) {
        let (t, tau) = (p.t(), p.tau());
        let mut sim = Sim { quota: p.quota(), tat: None };
        let mut now = start;
        for (tick, cost) in steps {
            now = tick.apply(now, t, tau);
            let before = sim.tat;
            let _ = sim.check(u(now), cost.resolve(p.burst()));
            prop_assert!(sim.tat >= before, "{:?} -> {:?}", before, sim.tat);
        }
    }
}

#[test]
fn ticks_cover_the_clock_moves() {
    // The strategies above rely on Tick::apply; pin its arithmetic.
    assert_eq!(Tick::Same.apply(10, 3, 9), 10);
    assert_eq!(Tick::Micro(false).apply(0, 3, 9), 0);
    assert_eq!(Tick::Intervals(7).apply(10, 3, 9), 10);
    assert_eq!(Tick::Bursts(27).apply(10, 3, 9), 37);
    assert_eq!(Tick::Back(0).apply(10, 3, 9), 9);
    assert_eq!(Tick::Back(17).apply(100, 3, 9), 100 - 1 - 17);
}
