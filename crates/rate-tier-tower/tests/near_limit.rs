//! `RateTierBuilder::near_limit`: an event (and a metric) once per crossing
//! of a limit's near-end, for the tier and a limit of its own; never for a
//! shadow limit or a concurrency limit; an invalid ratio refused at build.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    Concurrency, ConfigError, Limit, LimitEvent, LimitRequest, Quota, RateTier,
};

type Near = Arc<Mutex<Vec<(&'static str, u64, u32)>>>;

fn limiter(clock: &FakeClock, ratio: f64) -> (RateTier, Near) {
    let near: Near = Arc::default();
    let seen = near.clone();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .clock(clock.clone())
        .near_limit(ratio)
        .on_event(move |event| {
            if let LimitEvent::NearLimit {
                limit,
                remaining,
                of,
                ..
            } = event
            {
                seen.lock().unwrap().push((*limit, *remaining, *of));
            }
        })
        .build();
    (tiers, near)
}

#[tokio::test]
async fn once_per_crossing_for_the_plan_and_a_limit() {
    let clock = FakeClock::at_us(1_000_000_000);
    let (tiers, near) = limiter(&clock, 0.8);
    let search = Limit::new("search", Quota::per_minute(5));
    for _ in 0..10 {
        let request = LimitRequest::new("ana", "free", 1).limit(&search, 1);
        let _ = tiers.decide(&request).await.unwrap();
    }
    // search: 1 left of 5 after the 4th, once; its refusals that follow
    // charge the tier nothing, so free stays at 5 left: not near.
    assert_eq!(*near.lock().unwrap(), [("search", 1, 5)]);
    // Refilled and crossed again: reported again.
    near.lock().unwrap().clear();
    clock.advance(Duration::from_secs(60));
    for _ in 0..8 {
        tiers.check("ana", "free", 1).await.unwrap().unwrap();
    }
    assert_eq!(*near.lock().unwrap(), [("free", 2, 10)]);
}

#[tokio::test]
async fn a_cost_that_jumps_over_the_threshold_is_reported() {
    let clock = FakeClock::at_us(1_000_000_000);
    let (tiers, near) = limiter(&clock, 0.5);
    tiers.check("bea", "free", 4).await.unwrap().unwrap();
    assert!(near.lock().unwrap().is_empty(), "6 left of 10: not yet");
    tiers.check("bea", "free", 3).await.unwrap().unwrap();
    assert_eq!(*near.lock().unwrap(), [("free", 3, 10)]);
}

#[tokio::test]
async fn shadow_and_concurrency_limits_are_never_near() {
    let clock = FakeClock::at_us(1_000_000_000);
    let (tiers, near) = limiter(&clock, 0.5);
    let shadow = Limit::new("trial", Quota::per_minute(2)).shadow();
    let slots = Limit::new("uploads", Concurrency::new(2).unwrap());
    for _ in 0..2 {
        let request = LimitRequest::new("eva", "free", 1)
            .limit(&shadow, 1)
            .limit(&slots, 1);
        assert!(tiers.decide(&request).await.unwrap().is_ok());
    }
    assert!(near.lock().unwrap().is_empty(), "{near:?}");
}

#[test]
fn a_ratio_outside_zero_to_one_is_refused() {
    for ratio in [0.0, -0.5, 1.5, f64::NAN] {
        let error = RateTier::builder()
            .tier("free", Quota::per_minute(10))
            .near_limit(ratio)
            .try_build()
            .unwrap_err();
        assert!(matches!(error, ConfigError::InvalidNearLimit(_)), "{ratio}");
    }
}

#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_metric_counts_the_crossings_by_tier_and_limit() {
    use tower_rate_tier::metrics::RateLimitMetrics;
    use tower_rate_tier::metrics::prometheus_client::encoding::text::encode;
    use tower_rate_tier::metrics::prometheus_client::registry::Registry;

    let mut registry = Registry::default();
    let metrics = RateLimitMetrics::new(&mut registry);
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .clock(FakeClock::at_us(1_000_000_000))
        .near_limit(0.8)
        .observe(metrics)
        .build();
    for user in ["ana", "bea"] {
        for _ in 0..9 {
            tiers.check(user, "free", 1).await.unwrap().unwrap();
        }
    }
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    assert!(
        text.contains(
            r#"rate_tier_near_limit_total{tier="free",limit="free"} 2"#
        ),
        "{text}"
    );
}
