//! Under real concurrency (a 4-worker multi-thread runtime, 200 tasks on one
//! key, the fake clock frozen) exactly the quota passes: through
//! `RateTier::check` and through the layer, one clone of the service per task;
//! with a tier and a route limit, exactly the tighter one's quota, and the
//! refused requests charge nothing.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    Limit, LimitReason, Quota, RateTier, TierIdentity, TierLimitLayer,
};

const TASKS: usize = 200;

fn limiter(clock: &FakeClock) -> RateTier {
    RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .build()
}

/// `TASKS` concurrent `check`s of `cost` on one bucket: (allowed, refused).
async fn race_check(tier: &'static str, cost: u32) -> (usize, usize) {
    let clock = FakeClock::at_us(1_790_947_094_000_000);
    let limiter = limiter(&clock);
    let handles: Vec<_> = (0..TASKS)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                limiter.check("ana", tier, cost).await.unwrap()
            })
        })
        .collect();
    let (mut allowed, mut refused) = (0, 0);
    for handle in handles {
        match handle.await.unwrap() {
            Ok(_) => allowed += 1,
            Err(limited) => {
                assert_eq!(limited.reason(), LimitReason::RateLimited);
                refused += 1;
            }
        }
    }
    (allowed, refused)
}

/// `TASKS` concurrent requests through the layer on one key.
async fn race_layer(tier: &'static str, cost: u32) -> (usize, usize, usize) {
    let clock = FakeClock::at_us(1_790_947_094_000_000);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let layer = TierLimitLayer::new(limiter(&clock))
        .identifier_fn(move |_| Some(TierIdentity::new("ana", tier)))
        .cost_fn(move |_| cost);
    let app = Router::new()
        .route(
            "/data",
            get(move || async move {
                c.fetch_add(1, Ordering::SeqCst);
                "data"
            }),
        )
        .layer(layer);
    let handles: Vec<_> = (0..TASKS)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                let request = Request::builder()
                    .uri("/data")
                    .body(Body::empty())
                    .unwrap();
                app.oneshot(request).await.unwrap().status()
            })
        })
        .collect();
    let (mut ok, mut limited) = (0, 0);
    for handle in handles {
        match handle.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected {other}"),
        }
    }
    (ok, limited, calls.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_lets_exactly_the_burst_through_10_per_minute() {
    assert_eq!(race_check("free", 1).await, (10, 190));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_lets_exactly_the_burst_through_100_per_minute() {
    assert_eq!(race_check("pro", 1).await, (100, 100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_with_cost_3_on_a_burst_of_10_lets_3_through() {
    assert_eq!(race_check("free", 3).await, (3, 197));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn layer_lets_exactly_the_burst_through_10_per_minute() {
    assert_eq!(race_layer("free", 1).await, (10, 190, 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn layer_lets_exactly_the_burst_through_100_per_minute() {
    assert_eq!(race_layer("pro", 1).await, (100, 100, 100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn layer_with_cost_3_on_a_burst_of_10_lets_3_through() {
    assert_eq!(race_layer("free", 3).await, (3, 197, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_users_at_once_each_get_exactly_their_burst() {
    let clock = FakeClock::at_us(1_790_947_094_000_000);
    let limiter = limiter(&clock);
    let users = 20;
    let handles: Vec<_> = (0..users * 15)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let user = format!("user{}", i % users);
                let ok = limiter.check(&user, "free", 1).await.unwrap().is_ok();
                (i % users, ok)
            })
        })
        .collect();
    let mut per_user = vec![0; users];
    for handle in handles {
        let (user, ok) = handle.await.unwrap();
        per_user[user] += usize::from(ok);
    }
    assert_eq!(per_user, vec![10; users]);
}

/// `TASKS` concurrent `/search`es of one user through the layer, with the
/// tier (`tier`) and a `search` limit of `search` per minute: (200s, 429s,
/// handler calls, the tier's remaining, the search limit's remaining).
async fn race_two_limits(
    tier: &'static str,
    search: u32,
    cost: u32,
) -> (usize, usize, usize, u64, u64) {
    let clock = FakeClock::at_us(1_790_947_094_000_000);
    let tiers = limiter(&clock);
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let layer = TierLimitLayer::new(tiers.clone())
        .identifier_fn(move |_| Some(TierIdentity::new("ana", tier)))
        .cost_fn(move |_| cost)
        .limit(
            Limit::new("search", Quota::per_minute(search))
                .when(|req| req.uri.path() == "/search"),
        )
        .peek_when(|req| req.uri.path() == "/quota");
    let app = Router::new()
        .route(
            "/search",
            get(move || async move {
                c.fetch_add(1, Ordering::SeqCst);
                "search"
            }),
        )
        .route(
            "/quota",
            get(
                |axum::Extension(info): axum::Extension<
                    tower_rate_tier::RateLimitInfo,
                >| async move {
                    info.limits()
                        .map(|l| l.remaining.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                },
            ),
        )
        .layer(layer);
    let handles: Vec<_> = (0..TASKS)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                let request = Request::builder()
                    .uri("/search")
                    .body(Body::empty())
                    .unwrap();
                app.oneshot(request).await.unwrap().status()
            })
        })
        .collect();
    let (mut ok, mut limited) = (0, 0);
    for handle in handles {
        match handle.await.unwrap() {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => limited += 1,
            other => panic!("unexpected {other}"),
        }
    }
    let quota = app
        .oneshot(Request::get("/quota").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let body = http_body_util::BodyExt::collect(quota.into_body())
        .await
        .unwrap()
        .to_bytes();
    let left: Vec<u64> = std::str::from_utf8(&body)
        .unwrap()
        .split(' ')
        .map(|n| n.parse().unwrap())
        .collect();
    (ok, limited, calls.load(Ordering::SeqCst), left[0], left[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_route_limit_tighter_than_the_plan_exactly_its_quota_passes() {
    // Search 3 a minute, the tier 10: 3 pass, the tier paid 3, not 200.
    assert_eq!(race_two_limits("free", 3, 1).await, (3, 197, 3, 7, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_plan_tighter_than_the_route_limit_exactly_its_quota_passes() {
    // The tier 10 a minute, search 50: 10 pass, search paid 10.
    assert_eq!(race_two_limits("free", 50, 1).await, (10, 190, 10, 0, 40));
    // Pro, 100, cost 3 (on the tier; 1 on search): 33 pass.
    assert_eq!(race_two_limits("pro", 50, 3).await, (33, 167, 33, 1, 17));
}
