//! Random cases of GCRA buckets, shared by the property tests that drive a
//! store's code (the Redis scripts, the PostgreSQL functions) and gcra-core
//! side by side: the cases, their strategies, and the stores' argument and
//! reply layouts.
#![allow(dead_code, unreachable_pub)]

use gcra_core::{Adjust, Charge, Decision, Quota};
use proptest::prelude::*;
use rate_tier_storage::{BucketCheck, KeyLayout, LimitName};

use crate::lua_support::{
    Corrupt, START_US, advance_strategy, corrupt_strategy, quota_strategy,
};

pub(crate) const USER: &str = "user-1";

/// The limits of the tests, each a bucket of `USER`.
pub(crate) fn names(n: usize) -> Vec<LimitName> {
    (0..n)
        .map(|i| LimitName::new(format!("limit{i}")).unwrap())
        .collect()
}

/// The key `RedisStorage` uses on a cluster (on one node it differs only by
/// the braces).
pub(crate) fn key(name: &LimitName) -> String {
    BucketCheck::peek(name, USER, Quota::per_second(1)).key(KeyLayout::Cluster)
}

/// `gcra_all.lua`'s `ARGV` for one bucket: [`BucketCheck::script_args`],
/// or the same layout by hand for a cost above the burst, which a
/// `BucketCheck` cannot hold.
pub(crate) fn check_args(name: &LimitName, charge: Charge) -> [i64; 5] {
    let args = match BucketCheck::new(name, USER, charge.quota, charge.cost) {
        Ok(check) => check.shadow(charge.shadow).script_args(),
        Err(_) => [
            charge.quota.emission_interval_us(),
            charge.quota.burst_offset_us(),
            u64::from(charge.cost),
            u64::from(charge.shadow),
            charge.quota.max_debt_us(),
        ],
    };
    args.map(|a| i64::try_from(a).unwrap())
}

/// `gcra_settle.lua`'s `ARGV` for one bucket: `T`, `tau`, the units
/// (positive to charge and negative to refund), then the max debt.
pub(crate) fn settle_args(quota: Quota, adjust: Adjust) -> [i64; 4] {
    let [t, tau, _, _, debt] = BucketCheck::peek(&names(1)[0], USER, quota)
        .script_args()
        .map(|a| i64::try_from(a).unwrap());
    let units = match adjust {
        Adjust::Charge(n) => i64::from(n),
        Adjust::Refund(n) => -i64::from(n),
    };
    [t, tau, units, debt]
}

/// A reply of 4 integers per bucket as `Decision`s (`store` is the
/// script's business: `None`).
pub(crate) fn decisions(reply: &[i64]) -> Vec<Decision> {
    reply
        .chunks(4)
        .map(|n| Decision {
            allowed: match n[0] {
                1 => true,
                0 => false,
                other => panic!("allowed = {other}"),
            },
            remaining: u64::try_from(n[1]).unwrap(),
            retry_after_us: u64::try_from(n[2]).unwrap(),
            reset_after_us: u64::try_from(n[3]).unwrap(),
            store: None,
        })
        .collect()
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    /// One decision over the buckets chosen, in that order, with their
    /// cost and shadow flag.
    Check(Vec<(usize, u32, bool)>),
    /// One settlement of the buckets chosen.
    Settle(Vec<(usize, Adjust)>),
}

#[derive(Debug, Clone)]
pub(crate) struct Step {
    pub(crate) advance_us: i64,
    pub(crate) corrupt: Vec<Option<Corrupt>>,
    pub(crate) op: Op,
}

#[derive(Debug, Clone)]
pub(crate) struct Case {
    pub(crate) quotas: Vec<Quota>,
    pub(crate) start_us: u64,
    pub(crate) steps: Vec<Step>,
}

pub(crate) fn cost_strategy(quota: Quota) -> impl Strategy<Value = u32> {
    let burst = quota.burst();
    prop_oneof![
        6 => 1..=burst,
        3 => Just(1u32),
        2 => Just(0u32),
        1 => Just(burst),
        // Above the burst: the whole decision is an error.
        1 => Just(burst.saturating_add(1)),
    ]
}

pub(crate) fn adjust_strategy(quota: Quota) -> impl Strategy<Value = Adjust> {
    let burst = quota.burst();
    let units = prop_oneof![
        6 => 0..=burst,
        2 => burst..=burst.saturating_mul(3),
        1 => Just(u32::MAX),
    ];
    (any::<bool>(), units).prop_map(|(charge, n)| {
        if charge {
            Adjust::Charge(n)
        } else {
            Adjust::Refund(n)
        }
    })
}

/// Some of the buckets `0..n` (at least one), in a random order.
pub(crate) fn subset(n: usize) -> impl Strategy<Value = Vec<usize>> {
    Just((0..n).collect::<Vec<_>>())
        .prop_shuffle()
        .prop_flat_map(move |order| (Just(order), 1..=n))
        .prop_map(|(order, take)| order[..take].to_vec())
}

pub(crate) fn step_strategy(quotas: Vec<Quota>) -> impl Strategy<Value = Step> {
    let n = quotas.len();
    // The clock moves at the pace of the tightest and loosest buckets.
    let advance = prop_oneof![
        advance_strategy(quotas[0]),
        advance_strategy(quotas[n - 1])
    ];
    let corrupt: Vec<_> = quotas.iter().map(|q| corrupt_strategy(*q)).collect();
    let costs: Vec<_> = quotas
        .iter()
        .map(|q| (cost_strategy(*q), prop::bool::weighted(0.25)))
        .collect();
    let adjusts: Vec<_> = quotas.iter().map(|q| adjust_strategy(*q)).collect();
    let op = prop_oneof![
        4 => (subset(n), costs).prop_map(|(chosen, costs)| {
            Op::Check(chosen.into_iter().map(|i| (i, costs[i].0, costs[i].1)).collect())
        }),
        1 => (subset(n), adjusts).prop_map(|(chosen, adjusts)| {
            Op::Settle(chosen.into_iter().map(|i| (i, adjusts[i])).collect())
        }),
    ];
    (advance, corrupt, op).prop_map(|(advance_us, corrupt, op)| Step {
        advance_us,
        corrupt,
        op,
    })
}

pub(crate) fn case_strategy() -> impl Strategy<Value = Case> {
    prop::collection::vec(quota_strategy(), 1..=5).prop_flat_map(|quotas| {
        (
            Just(quotas.clone()),
            START_US..=START_US + 1_000_000_000_000,
            prop::collection::vec(step_strategy(quotas), 1..30),
        )
            .prop_map(|(quotas, start_us, steps)| Case {
                quotas,
                start_us,
                steps,
            })
    })
}
