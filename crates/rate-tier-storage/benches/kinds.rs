//! The kinds of limit beside the GCRA rate, in memory: one decision with
//! one window (N = 100), with one calendar period, and a concurrency slot
//! taken then given back, each against one GCRA rate check, on
//! `MemoryStorage::check_sync` (issue 22).
//!
//! Every case runs the same loop on a store of its own: the check built
//! per call (`BucketCheck::of_rule`, as a limiter builds it per request),
//! a `FakeClock` set forward by the same step before every call, one
//! `check_sync`, and an assertion that it passed. No case ever refuses (a
//! refusal writes nothing and would flatter it): every call reads,
//! decides and writes its bucket.
//!
//! - `rate`: 1 per µs with a burst of about 71 minutes (limits.rs's quota).
//! - `window`: at most 100 in a window of `100 × step × users`, so that
//!   each user comes back once every `window / 100`: after a prefill of
//!   100 rounds the log is full (100 entries) and at every call its oldest
//!   entry has just expired, 99 are counted, and the call passes with 0
//!   left, drops the expired entry and appends one. That is a window's
//!   realistic cost, a full log read and shifted, not an empty log's.
//! - `period`: `u32::MAX` a calendar month (UTC): never refuses.
//! - `slot`: a concurrency limit of 100, one slot taken (`check_sync`) and
//!   given back (`Storage::release_local`) per iteration: the entry is
//!   made and dropped each time, as for a user with nothing else in flight.
//!
//! Two groups: one hot user (`kinds/memory_one_user`, a step of 1 ms, a
//! window of 100 ms) and 100,000 users round-robin
//! (`kinds/memory_100k_users`, a step of 10 µs, a window of 100 s; the
//! windows' prefill is 10M checks and holds about 100 MiB of logs).
//!
//! `cargo bench -p rate-tier-storage --bench kinds` (`-- --quick` as
//! `cargo xtask bench` runs it) for the rows "period / rate" (goal ≤ 1.2),
//! "window / rate" (≤ 3) and "slot taken and given back / rate" (≤ 2).
//! A Redis group, when Redis decides these kinds, is
//! `kinds/redis_<users>` with the same bench names (see xtask's rows.rs).
#![allow(clippy::unwrap_used, missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::{
    BucketCheck, Concurrency, Decision, LimitName, MemoryStorage, Period,
    PeriodUnit, Quota, Rule, Storage, Window,
};

const USERS: usize = 100_000;
/// The window's limit: its log holds this many entries.
const N: u32 = 100;
/// 2026-01-01T00:00:00Z, in µs: a calendar the period can place.
const START_US: u64 = 1_767_225_600_000_000;

/// The rule of each case, by bench name, for a group whose window is
/// `window`.
fn rule(case: &str, window: Duration) -> Rule {
    match case {
        "rate" => Quota::per_second(1_000_000).allow_burst(u32::MAX).into(),
        "window" => Window::new(N, window).unwrap().into(),
        "period" => Period::new(u32::MAX, PeriodUnit::Month, 0).unwrap().into(),
        "slot" => Concurrency::new(N).unwrap().into(),
        _ => unreachable!("no case {case}"),
    }
}

/// One case's loop: the next user, the clock a step on, one decision (and
/// for a slot, its release).
struct Case {
    store: MemoryStorage,
    clock: FakeClock,
    name: LimitName,
    rule: Rule,
    now_us: u64,
    step_us: u64,
    next: usize,
}

impl Case {
    fn new(case: &'static str, window: Duration, step_us: u64) -> Case {
        let clock = FakeClock::at_us(START_US);
        Case {
            store: MemoryStorage::builder().clock(clock.clone()).build(),
            clock,
            name: LimitName::new(case).unwrap(),
            rule: rule(case, window),
            now_us: START_US,
            step_us,
            next: 0,
        }
    }

    #[inline(always)]
    fn call(&mut self, users: &[String]) -> Decision {
        self.next = (self.next + 1) % users.len();
        self.now_us += self.step_us;
        self.clock.set_us(self.now_us);
        let check = BucketCheck::of_rule(
            &self.name,
            black_box(&users[self.next]),
            self.rule,
            1,
        )
        .unwrap();
        let mut out = [Decision::default()];
        let verdict = self
            .store
            .check_sync(std::slice::from_ref(&check), &mut out)
            .unwrap()
            .verdict;
        assert!(verdict.allowed, "{:?} refused", self.rule.kind());
        if matches!(self.rule, Rule::Concurrency(_)) {
            self.store.release_local(&[check]).unwrap().unwrap();
        }
        out[0]
    }
}

fn kinds(c: &mut Criterion) {
    let users: Vec<String> =
        (0..USERS).map(|i| format!("user-{i:08}")).collect();
    // (group, users, step): each user comes back every `window / N`.
    for (group, spread, step_us) in
        [("one_user", 1, 1_000), ("100k_users", USERS, 10)]
    {
        let users = &users[..spread];
        let window =
            Duration::from_micros(u64::from(N) * spread as u64 * step_us);
        let mut group = c.benchmark_group(format!("kinds/memory_{group}"));
        for case in ["rate", "window", "period", "slot"] {
            let mut bench = Case::new(case, window, step_us);
            // Every bucket made; a window's log full (N rounds).
            let rounds = if case == "window" { N as usize } else { 1 };
            let mut last = Decision::default();
            for _ in 0..rounds * spread {
                last = bench.call(users);
            }
            if case == "window" {
                assert_eq!(last.remaining, 0, "the log is not full");
            }
            group.bench_function(case, |b| b.iter(|| bench.call(users)));
        }
        group.finish();
    }
}

criterion_group!(benches, kinds);
criterion_main!(benches);
