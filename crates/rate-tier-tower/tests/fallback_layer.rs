//! The layer over a FallbackStorage whose primary is down: the local share.
//! A cost above the divided burst is transient (503, retry after 1 s), never
//! the 403 of a cost that can never pass; the headers describe the limit
//! the instance actually applies; and a concurrency slot taken locally goes
//! back to the local store.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::{Router, routing::get};
use http::StatusCode;
use support::http::{Events, get_as};
use support::stores::TimingOut;
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::layer::HeaderStyle;
use tower_rate_tier::{
    Concurrency, FallbackStorage, Limit, LimitEvent, Quota, RateTier,
    TierIdentity, TierLimitLayer, policy::OnStorageError,
    storage::StorageEvent,
};

/// 2026-10-02 13:17:14 UTC, on a whole second.
const START_US: u64 = 1_790_947_094_000_000;

/// `quota` on a store that is down, shared by `share` instances while it
/// is; `/` costs 6, `/one` 1.
fn app(
    quota: Quota,
    share: u32,
    policy: Option<OnStorageError>,
    events: &Events,
) -> (Router, FakeClock) {
    let clock = FakeClock::at_us(START_US);
    let storage = FallbackStorage::builder(Arc::new(TimingOut::new("down")))
        .clock(clock.clone())
        .local_share(share)
        .build();
    let mut tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("free", quota)
        .storage(Arc::new(storage));
    if let Some(policy) = policy {
        tiers = tiers.on_storage_error(policy);
    }
    let layer = TierLimitLayer::new(tiers.build())
        .identifier_fn(|_| Some(TierIdentity::new("ana", "free")))
        .cost_fn(|req| if req.uri.path() == "/" { 6 } else { 1 })
        .headers(HeaderStyle::Both)
        .on_event(events.sink());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/one", get(|| async { "ok" }))
        .layer(layer);
    (app, clock)
}

#[tokio::test]
async fn a_cost_above_the_local_share_is_503_with_retry_after_never_403() {
    let events = Events::default();
    let (app, _clock) = app(Quota::per_minute(10), 2, None, &events);
    // 10 per minute shared by 2 instances: a local burst of 5, below 6.
    for _ in 0..3 {
        let r = get_as(&app, None, "/").await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{r:?}");
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.body, r#"{"error":"rate limiter unavailable"}"#);
    }
    // It could pass once the store is back: never the permanent refusal.
    assert_eq!(
        events.count(|e| matches!(e, LimitEvent::CostExceedsBurst { .. })),
        0
    );
    let reported = events.count(|e| {
        matches!(e, LimitEvent::StorageError { error, .. }
            if error.contains("cost 6 is above the burst of 5"))
    });
    assert_eq!(reported, 3, "{:?}", events.all());
    // Nothing was charged: the local bucket is full.
    let r = get_as(&app, None, "/one").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.remaining(), 4);
}

#[tokio::test]
async fn during_an_outage_the_headers_describe_the_local_share() {
    let events = Events::default();
    let (app, clock) = app(Quota::per_minute(10), 2, None, &events);
    // Locally: 10 per 2 minutes, a burst of 5 (one every 12 s).
    let r = get_as(&app, None, "/one").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.limit(), 5);
    assert_eq!(r.remaining(), 4);
    let reset = START_US / 1_000_000 + 12;
    assert_eq!(r.header("x-ratelimit-reset"), Some(&*reset.to_string()));
    assert_eq!(r.header("ratelimit-policy"), Some(r#""free";q=5;w=60"#));
    assert_eq!(r.header("ratelimit"), Some(r#""free";r=4;t=12"#));
    for _ in 0..4 {
        assert_eq!(get_as(&app, None, "/one").await.status, StatusCode::OK);
    }
    let refused = get_as(&app, None, "/one").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.limit(), 5);
    assert_eq!(refused.retry_after(), 12);
    clock.advance(Duration::from_secs(12));
    assert_eq!(get_as(&app, None, "/one").await.remaining(), 0);
    // The store's own events (each local decision) are the limiter's to
    // hear, not a layer's.
    let fallbacks = events.count(|e| {
        matches!(e, LimitEvent::Storage(StorageEvent::Fallback { .. }))
    });
    assert_eq!(fallbacks, 0);
}

/// A quota whose burst is below the share: each instance still lets one
/// request through at once, at the divided rate (1 per 2 minutes for 1 a
/// minute shared by 2), and says so in its headers.
#[tokio::test]
async fn a_burst_below_the_share_is_one_at_a_time_at_the_divided_rate() {
    let events = Events::default();
    let (app, clock) = app(Quota::per_minute(1), 2, None, &events);
    let r = get_as(&app, None, "/one").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!((r.limit(), r.remaining()), (1, 0));
    assert_eq!(r.header("ratelimit-policy"), Some(r#""free";q=1;w=120"#));
    let refused = get_as(&app, None, "/one").await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.retry_after(), 120);
    clock.advance(Duration::from_secs(119));
    assert_eq!(
        get_as(&app, None, "/one").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(get_as(&app, None, "/one").await.status, StatusCode::OK);
}

/// Failing open is a choice: the request above the local share passes,
/// reported.
#[tokio::test]
async fn with_storage_errors_allowed_a_cost_above_the_local_share_passes() {
    let events = Events::default();
    let (app, _clock) = app(
        Quota::per_minute(10),
        2,
        Some(OnStorageError::Allow),
        &events,
    );
    let r = get_as(&app, None, "/").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(!r.has_rate_headers());
    assert_eq!(
        events.count(|e| matches!(
            e,
            LimitEvent::StorageError {
                policy: OnStorageError::Allow,
                ..
            }
        )),
        1
    );
}

/// A concurrency limit behind a fallback whose primary (which decides
/// every kind) is down: the slot is taken locally, held by the response
/// body, and given back to the local store when the body is dropped; the
/// primary is never asked to release it.
#[tokio::test]
async fn a_slot_taken_during_an_outage_goes_back_to_the_local_store() {
    let clock = FakeClock::at_us(START_US);
    let primary = Arc::new(TimingOut::of_every_kind("down"));
    let storage = FallbackStorage::builder(primary.clone())
        .clock(clock.clone())
        .build();
    let tiers = RateTier::builder()
        .clock(clock)
        .tier("free", Quota::per_minute(10))
        .storage(Arc::new(storage.clone()))
        .build();
    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(|_| Some(TierIdentity::new("ana", "free")))
        .limit(Limit::new("uploads", Concurrency::new(1).unwrap()));
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);

    let request = || http::Request::get("/").body(axum::body::Body::empty());
    let held = app.clone().oneshot(request().unwrap()).await.unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(storage.local_slots(), 1);
    let r = get_as(&app, None, "/").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{r:?}");
    assert!(r.body.contains(r#""limit":"uploads""#), "{r:?}");

    let calls = primary.calls();
    drop(held);
    assert_eq!(storage.local_slots(), 0);
    assert_eq!(primary.calls(), calls, "released without the primary");
    assert_eq!(get_as(&app, None, "/").await.status, StatusCode::OK);
}
