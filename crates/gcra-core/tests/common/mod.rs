//! Shared by the property tests: quota parameters, clock moves, config.
#![allow(dead_code)] // each test file uses a different subset

use core::time::Duration;

use gcra_core::{MAX_TIME_US, Quota};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;

pub(crate) const MAX: i128 = MAX_TIME_US as i128;

/// `cases` (or `PROPTEST_CASES` when set), with failures persisted to
/// `path`: a file under `crates/gcra-core/proptest-regressions/`, committed,
/// instead of proptest's default (next to the test file, since `tests/` has
/// no `lib.rs`).
pub(crate) fn config(cases: u32, path: &'static str) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(cases),
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            path,
        ))),
        ..ProptestConfig::default()
    }
}

/// A quota as the user spells it: `limit` per `period_us`, optional burst.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    pub(crate) limit: u32,
    pub(crate) period_us: u64,
    pub(crate) burst: Option<u32>,
    /// The most debt a settlement may leave, µs; `None`: the default, an
    /// hour or one burst window if longer.
    pub(crate) max_debt: Option<u64>,
}

impl Params {
    pub(crate) fn quota(&self) -> Quota {
        let q = Quota::new(self.limit, Duration::from_micros(self.period_us))
            .unwrap();
        let q = match self.burst {
            Some(b) => q.try_allow_burst(b).unwrap(),
            None => q,
        };
        match self.max_debt {
            Some(debt) => {
                q.try_allow_debt(Duration::from_micros(debt)).unwrap()
            }
            None => q,
        }
    }
    pub(crate) fn burst(&self) -> u32 {
        self.burst.unwrap_or(self.limit)
    }
    /// T, computed here from the user's numbers: rounded up, so that the
    /// quota never allows more than its rate.
    pub(crate) fn t(&self) -> i128 {
        let (period, limit) =
            (i128::from(self.period_us), i128::from(self.limit));
        (period + limit - 1) / limit
    }
    pub(crate) fn tau(&self) -> i128 {
        self.t() * i128::from(self.burst())
    }
    /// How far ahead a stored TAT is kept: a burst, plus at most the
    /// quota's debt (left by a settlement or a reservation; an hour, or one
    /// burst if longer, by default).
    pub(crate) fn ceiling(&self) -> i128 {
        const HOUR_US: i128 = 3_600_000_000;
        self.tau() + self.max_debt.map_or(self.tau().max(HOUR_US), i128::from)
    }
}

/// Tiny quotas (T of 1..=10 µs, bursts up to 12): the state space is small
/// enough that random sequences hit every edge.
pub(crate) fn small_params() -> impl Strategy<Value = Params> {
    (
        1u32..=6,
        1u64..=10,
        0u64..6,
        prop::option::of(1u32..=12),
        prop::option::weighted(0.3, 0u64..=400),
    )
        .prop_map(|(limit, t, extra, burst, max_debt)| Params {
            limit,
            period_us: t * u64::from(limit) + extra % u64::from(limit),
            burst,
            max_debt,
        })
}

/// Realistic quotas: up to 1000 per up to 10 s, bursts up to 2000.
pub(crate) fn medium_params() -> impl Strategy<Value = Params> {
    (
        1u32..=1000,
        1u64..=10_000_000,
        prop::option::of(1u32..=2000),
        prop::option::weighted(0.3, 0u64..=100_000_000_000),
    )
        .prop_map(|(limit, period, burst, max_debt)| Params {
            limit,
            period_us: period.max(u64::from(limit)),
            burst,
            max_debt,
        })
}

/// How the clock moves before a request, in units of the quota.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Tick {
    Same,
    Micro(bool),
    /// Up to two intervals forward.
    Intervals(u64),
    /// Up to three burst offsets forward.
    Bursts(u64),
    /// Backwards, up to two burst offsets.
    Back(u64),
}

impl Tick {
    /// The next time (never below 0).
    pub(crate) fn apply(self, now: i128, t: i128, tau: i128) -> i128 {
        let next = match self {
            Tick::Same => now,
            Tick::Micro(forward) => now + if forward { 1 } else { -1 },
            Tick::Intervals(raw) => now + i128::from(raw) % (2 * t + 1),
            Tick::Bursts(raw) => now + i128::from(raw) % (3 * tau + 1),
            Tick::Back(raw) => now - 1 - i128::from(raw) % (2 * tau),
        };
        next.max(0)
    }
}

/// Any clock move, backwards included.
pub(crate) fn tick() -> impl Strategy<Value = Tick> {
    prop_oneof![
        3 => Just(Tick::Same),
        1 => any::<bool>().prop_map(Tick::Micro),
        6 => any::<u64>().prop_map(Tick::Intervals),
        2 => any::<u64>().prop_map(Tick::Bursts),
        1 => any::<u64>().prop_map(Tick::Back),
    ]
}

/// A clock that never goes backwards.
pub(crate) fn monotone_tick() -> impl Strategy<Value = Tick> {
    prop_oneof![
        3 => Just(Tick::Same),
        1 => Just(Tick::Micro(true)),
        6 => any::<u64>().prop_map(Tick::Intervals),
        1 => any::<u64>().prop_map(Tick::Bursts),
    ]
}

/// A request's cost, resolved against the quota's burst.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Cost {
    Small(u32),
    /// `raw % (burst + 3)`: 0 ..= burst + 2.
    Any(u64),
}

impl Cost {
    pub(crate) fn resolve(self, burst: u32) -> u32 {
        match self {
            Cost::Small(c) => c,
            Cost::Any(raw) => {
                u32::try_from(raw % (u64::from(burst) + 3)).unwrap_or(u32::MAX)
            }
        }
    }
}

pub(crate) fn cost() -> impl Strategy<Value = Cost> {
    prop_oneof![
        3 => (1u32..=3).prop_map(Cost::Small),
        2 => any::<u64>().prop_map(Cost::Any),
    ]
}

pub(crate) fn u(v: i128) -> u64 {
    u64::try_from(v).unwrap()
}
