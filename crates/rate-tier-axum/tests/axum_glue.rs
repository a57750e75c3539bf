//! The axum glue through a real Router, with a fake clock.
#![allow(clippy::unwrap_used)]

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::response::IntoResponse;
use axum::{Router, routing::get};
use http_body_util::BodyExt;
use rate_tier_axum::{LimitRejection, RateLimit, api_key};
use tower::{ServiceBuilder, ServiceExt};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    Limit, LimitRequest, Quota, RateTier, TierLimitLayer, tier_cost,
};

fn plan_of(key: &str) -> Option<&'static str> {
    match key {
        "key_ana" => Some("free"),
        _ => None,
    }
}

fn limiter() -> TierLimitLayer {
    let tiers = RateTier::builder()
        .clock(FakeClock::at_us(1_000_000_000))
        .tier("free", Quota::per_minute(10))
        .default_tier("free")
        .build();
    TierLimitLayer::new(tiers).identifier_fn(api_key("x-api-key", plan_of))
}

fn get_as(path: &str, key: &str) -> Request<Body> {
    Request::get(path)
        .header("x-api-key", key)
        .body(Body::empty())
        .unwrap()
}

async fn text(response: axum::response::Response) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

async fn remaining(RateLimit(info): RateLimit) -> String {
    format!("{} {} {}", info.tier, info.remaining, info.cost)
}

#[tokio::test]
async fn extractor_sees_what_the_limiter_decided() {
    let app = Router::new()
        .route("/data", get(remaining))
        .layer(limiter());
    let first = app
        .clone()
        .oneshot(get_as("/data", "key_ana"))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(text(first).await, "free 9 1");
    let second = app.oneshot(get_as("/data", "key_ana")).await.unwrap();
    assert_eq!(text(second).await, "free 8 1");
}

#[tokio::test]
async fn extractor_without_a_limiter_is_a_500_and_optional_is_none() {
    async fn optional(info: Option<RateLimit>) -> &'static str {
        if info.is_some() { "some" } else { "none" }
    }
    let app = Router::new()
        .route("/required", get(remaining))
        .route("/optional", get(optional));
    let required = app
        .clone()
        .oneshot(get_as("/required", "key_ana"))
        .await
        .unwrap();
    assert_eq!(required.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(text(required).await.contains("TierLimitLayer"));
    let optional = app.oneshot(get_as("/optional", "key_ana")).await.unwrap();
    assert_eq!(text(optional).await, "none");
}

#[tokio::test]
async fn route_cost_outside_a_route_limiter_is_charged() {
    let app = Router::new().route(
        "/report",
        get(remaining)
            .layer(ServiceBuilder::new().layer(tier_cost(5)).layer(limiter())),
    );
    let response = app.oneshot(get_as("/report", "key_ana")).await.unwrap();
    assert_eq!(response.headers()["x-ratelimit-remaining"], "5");
    assert_eq!(text(response).await, "free 5 5");
}

/// `tier_cost` under a tier-wide `Router::layer` limiter: it wraps a
/// route's own limiter (anywhere else it does not compile), every request
/// is answered, and each limiter charges its own buckets; the extractor
/// sees the innermost, the route's.
#[tokio::test]
async fn route_cost_on_a_route_limiter_under_a_router_limiter_works() {
    let plan = limiter();
    let reports = limiter();
    let app = Router::new()
        .route(
            "/report",
            get(remaining).layer(
                ServiceBuilder::new()
                    .layer(tier_cost(5))
                    .layer(reports.clone()),
            ),
        )
        .route("/data", get(remaining))
        .layer(plan.clone());
    let response = app
        .clone()
        .oneshot(get_as("/report", "key_ana"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    // The outer limiter's headers, the inner limiter's info.
    assert_eq!(response.headers()["x-ratelimit-remaining"], "9");
    assert_eq!(text(response).await, "free 5 5");
    let response = app.oneshot(get_as("/data", "key_ana")).await.unwrap();
    assert_eq!(text(response).await, "free 8 1");
    assert_eq!(
        reports
            .tiers()
            .peek("key_ana", "free")
            .await
            .unwrap()
            .remaining,
        5
    );
}

/// A limit of its own is in the extractor's info, and a peek route sees
/// every limit without charging any.
#[tokio::test]
async fn the_extractor_lists_every_limit_of_the_decision() {
    async fn limits(RateLimit(info): RateLimit) -> String {
        info.limits()
            .map(|l| format!("{}:{}", l.name, l.remaining))
            .collect::<Vec<_>>()
            .join(" ")
    }
    let layer = limiter()
        .limit(
            Limit::new("search", Quota::per_minute(3))
                .when(|req| req.uri.path() == "/search"),
        )
        .peek_when(|req| req.uri.path() == "/quota");
    let app = Router::new()
        .route("/search", get(limits))
        .route("/quota", get(limits))
        .layer(layer);
    let search = app
        .clone()
        .oneshot(get_as("/search", "key_ana"))
        .await
        .unwrap();
    assert_eq!(text(search).await, "free:9 search:2");
    for _ in 0..3 {
        let quota = app
            .clone()
            .oneshot(get_as("/quota", "key_ana"))
            .await
            .unwrap();
        assert_eq!(text(quota).await, "free:9 search:2");
    }
}

#[tokio::test]
async fn rejection_matches_the_layer_response() {
    let limiter = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(10))
        .build();
    for _ in 0..10 {
        limiter.check("ana", "free", 1).await.unwrap().unwrap();
    }
    let limited = limiter.check("ana", "free", 1).await.unwrap().unwrap_err();
    let response = LimitRejection::from(limited).into_response();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "6");
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(
        text(response).await,
        r#"{"error":"rate limit exceeded","tier":"free","retry_after":6}"#
    );

    let never = limiter.check("bea", "free", 11).await.unwrap().unwrap_err();
    let response = LimitRejection::from(never).into_response();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(response.headers().get("retry-after").is_none());
}

/// A refusal by a limit of its own names it, as the layer's does.
#[tokio::test]
async fn a_rejection_by_a_limit_names_it() {
    let limiter = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(10))
        .build();
    let search = Limit::new("search", Quota::per_minute(3));
    let request = LimitRequest::new("ana", "free", 1).limit(&search, 1);
    for _ in 0..3 {
        limiter.decide(&request).await.unwrap().unwrap();
    }
    let limited = limiter.decide(&request).await.unwrap().unwrap_err();
    let response = LimitRejection::from(limited).into_response();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "20");
    assert_eq!(response.headers()["x-ratelimit-limit"], "3");
    assert_eq!(
        text(response).await,
        r#"{"error":"rate limit exceeded","tier":"free","limit":"search","retry_after":20}"#
    );
}

/// `api_key` maps a key to its tier by a lookup; a key the lookup does not
/// know is no identity, whatever it looks like (never a tier picked from
/// what the client sent).
#[tokio::test]
async fn api_key_never_takes_the_plan_from_the_key_itself() {
    let app = Router::new()
        .route("/data", get(remaining))
        .layer(limiter());
    // No identity, and the default tier: the one anonymous bucket of free.
    for (i, key) in ["pro_anything", "pro", "key_ana2"].into_iter().enumerate()
    {
        let response = app.clone().oneshot(get_as("/data", key)).await.unwrap();
        assert_eq!(text(response).await, format!("free {} 1", 9 - i));
    }
    // The known key has a bucket of its own.
    let response = app.oneshot(get_as("/data", "key_ana")).await.unwrap();
    assert_eq!(text(response).await, "free 9 1");
}

/// A limit per address (1 a minute) read from axum's `ConnectInfo`.
fn per_address() -> TierLimitLayer {
    limiter().limit(
        Limit::new("ip", Quota::per_minute(1))
            .per_client_ip(rate_tier_axum::CONNECT_INFO),
    )
}

fn from(peer: &str) -> Request<Body> {
    let mut request = get_as("/", "key_ana");
    let peer: std::net::SocketAddr = peer.parse().unwrap();
    request
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    request
}

#[tokio::test]
async fn a_limit_per_address_without_connect_info_is_a_loud_500_not_one_bucket()
{
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = events.clone();
    let layer = per_address().on_event(move |event| {
        sink.lock().unwrap().push(format!("{event:?}"));
    });
    // Served without into_make_service_with_connect_info: no address.
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer);
    for _ in 0..2 {
        let response = app.clone().oneshot(get_as("/", "key_ana")).await;
        let response = response.unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(text(response).await.contains("no client address"));
    }
    let seen = events.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert!(seen[0].contains("NoClientAddress"), "{seen:?}");
    assert!(seen[0].contains("axum ConnectInfo"), "{seen:?}");

    // With the address, one bucket per client: one spent, another served.
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(per_address());
    let ok = |r: &axum::response::Response| r.status() == StatusCode::OK;
    let first = app.clone().oneshot(from("203.0.113.7:4000")).await.unwrap();
    assert!(ok(&first));
    let again = app.clone().oneshot(from("203.0.113.7:4001")).await.unwrap();
    assert_eq!(again.status(), StatusCode::TOO_MANY_REQUESTS);
    let other = app.oneshot(from("198.51.100.9:4000")).await.unwrap();
    assert!(ok(&other));
}
