//! The in-process fast paths answer exactly as the full path does. Two
//! limiters with the same tiers and limits: one holds its memory store
//! itself (the tier alone and a user's rates together are decided in
//! place), the other reaches an identical store only through I/O (every
//! decision prepared, concluded and awaited). Random sequences of
//! decisions and clock steps must get the same answers from both, field
//! for field, refusals included.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use support::stores::Remote;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    Limit, LimitRequest, MemoryStorage, Quota, RateTier, Settle, Window,
};

/// The limits a request may carry: rates (one settled, one per tier, one
/// keyed by address, one in shadow mode) and a window, which no fast path
/// takes.
fn limits() -> Vec<Limit> {
    vec![
        Limit::new("search", Quota::per_minute(3)),
        Limit::new("tokens", Quota::per_second(5).allow_burst(8))
            .settle(Settle::from_header("x-tokens")),
        Limit::new("route", Quota::per_minute(20))
            .tier("pro", Quota::per_minute(4)),
        Limit::new("ip", Quota::per_minute(6)),
        Limit::new("shadowed", Quota::per_minute(2)).shadow(),
        Limit::new("login", Window::new(2, Duration::from_secs(30)).unwrap()),
    ]
}

fn limiter(clock: &FakeClock, remote: bool) -> RateTier {
    let memory = MemoryStorage::with_clock(clock.clone());
    let builder = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_second(2).allow_burst(4));
    match remote {
        false => builder.storage(Arc::new(memory)),
        true => builder.storage(Arc::new(Remote::new(memory))),
    }
    .build()
}

#[derive(Debug, Clone)]
enum Op {
    /// A user, a tier, the tier's cost, and limits by index with costs
    /// (keyed by the address when the flag says so).
    Decide(usize, usize, u32, Vec<(usize, u32, bool)>),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            0..2usize,
            0..3usize,
            0..5u32,
            prop::collection::vec((0..6usize, 0..4u32, any::<bool>()), 0..5),
        )
            .prop_map(|(user, tier, cost, extra)| Op::Decide(user, tier, cost, extra)),
        1 => (0..20_000_000u64).prop_map(Op::Advance),
    ]
}

/// Polls a decision to its end on a runtime of the test's own.
fn run<F: Future>(runtime: &tokio::runtime::Runtime, future: F) -> F::Output {
    runtime.block_on(future)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn fast_paths_answer_as_the_full_path(ops in prop::collection::vec(op(), 1..60)) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let clock = FakeClock::at_us(1_000_000);
        let (fast, full) = (limiter(&clock, false), limiter(&clock, true));
        let limits = limits();
        let users = ["ana", "bo"];
        // "gold" is no tier: the unknown-tier policy answers.
        let tiers = ["free", "pro", "gold"];
        for op in ops {
            match op {
                Op::Advance(us) => clock.advance(Duration::from_micros(us)),
                Op::Decide(user, tier, cost, extra) => {
                    let mut request = LimitRequest::new(users[user], tiers[tier], cost);
                    for &(index, cost, keyed) in &extra {
                        request = match keyed {
                            true => request.limit_keyed(&limits[index], "203.0.113.7", cost),
                            false => request.limit(&limits[index], cost),
                        };
                    }
                    let answer = |limiter: &RateTier| {
                        format!("{:?}", run(&runtime, limiter.decide(&request)))
                    };
                    prop_assert_eq!(answer(&fast), answer(&full), "{:?}", request);
                }
            }
        }
    }
}

/// The joint fast path: rates, all passing, on buckets already made
/// (a user's, in one shard; with an address's, in two), answered with
/// every limit's state; a refusal goes to the full path and charges
/// nothing.
#[test]
fn rates_decided_together_in_place() {
    let limits = limits();
    let own = LimitRequest::new("ana", "free", 1)
        .limit(&limits[0], 1)
        .limit(&limits[3], 2);
    let keyed = LimitRequest::new("ana", "free", 1)
        .limit(&limits[0], 1)
        .limit_keyed(&limits[3], "203.0.113.7", 2);
    for request in [own, keyed] {
        three_pass_then_search_refuses(&request);
    }
}

fn three_pass_then_search_refuses(request: &LimitRequest<'_>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let clock = FakeClock::new();
    let (fast, full) = (limiter(&clock, false), limiter(&clock, true));
    for _ in 0..3 {
        let fast_answer = run(&runtime, fast.decide(request)).unwrap();
        let full_answer = run(&runtime, full.decide(request)).unwrap();
        assert_eq!(format!("{fast_answer:?}"), format!("{full_answer:?}"));
    }
    let refused = run(&runtime, fast.decide(request)).unwrap().unwrap_err();
    assert_eq!(refused.limit_name(), "search");
    // The fourth was refused by `search` (3 a minute): nothing charged.
    let info = run(&runtime, fast.peek("ana", "free")).unwrap();
    assert_eq!(info.remaining, 7);
}
