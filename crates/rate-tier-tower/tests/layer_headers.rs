//! The IETF RateLimit fields (draft-ietf-httpapi-ratelimit-headers-10),
//! alone or beside x-ratelimit-*.
#![allow(clippy::unwrap_used, missing_docs)]

use axum::body::Body;
use axum::{Router, routing::get};
use http::{Request, Response};
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::layer::HeaderStyle;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};

fn app(style: HeaderStyle) -> Router {
    let tiers = RateTier::builder()
        .clock(FakeClock::at_us(1_790_947_094_250_000))
        .tier("free", Quota::per_minute(10))
        .tier("steady", Quota::per_hour(100).allow_burst(5))
        .build();
    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let tier = headers.get("x-tier")?.to_str().ok()?;
            Some(TierIdentity::new("ana@example.com", tier))
        })
        .headers(style);
    Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(layer)
}

async fn get_as(app: &Router, tier: &str) -> Response<Body> {
    let request = Request::get("/")
        .header("x-tier", tier)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(request).await.unwrap()
}

fn header<'a>(response: &'a Response<Body>, name: &str) -> Option<&'a str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn ietf_fields_count_down_and_the_429_waits_at_least_t() {
    let app = app(HeaderStyle::Ietf);
    let first = get_as(&app, "free").await;
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some(r#""free";q=10;w=60"#)
    );
    assert_eq!(header(&first, "ratelimit"), Some(r#""free";r=9;t=6"#));
    assert_eq!(header(&first, "x-ratelimit-limit"), None);
    for _ in 0..9 {
        get_as(&app, "free").await;
    }
    let refused = get_as(&app, "free").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "ratelimit"), Some(r#""free";r=0;t=6"#));
    let retry: u64 = header(&refused, "retry-after").unwrap().parse().unwrap();
    let t: u64 = header(&refused, "ratelimit")
        .unwrap()
        .rsplit("t=")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= t, "Retry-After {retry} earlier than t {t}");
}

#[tokio::test]
async fn the_window_is_the_time_a_full_burst_takes_to_come_back() {
    let app = app(HeaderStyle::Ietf);
    // 100 per hour is one per 36 s; a burst of 5 comes back in 180 s.
    let response = get_as(&app, "steady").await;
    assert_eq!(
        header(&response, "ratelimit-policy"),
        Some(r#""steady";q=5;w=180"#)
    );
    assert_eq!(header(&response, "ratelimit"), Some(r#""steady";r=4;t=36"#));
}

#[tokio::test]
async fn both_styles_side_by_side_and_no_partition_key() {
    let app = app(HeaderStyle::Both);
    let response = get_as(&app, "free").await;
    assert_eq!(header(&response, "x-ratelimit-limit"), Some("10"));
    assert_eq!(header(&response, "x-ratelimit-remaining"), Some("9"));
    assert_eq!(header(&response, "ratelimit"), Some(r#""free";r=9;t=6"#));
    // The user never appears in any header, and no pk parameter is sent.
    for (name, value) in response.headers() {
        let value = value.to_str().unwrap();
        assert!(!value.contains("ana"), "{name}: {value}");
        assert!(!value.contains("pk="), "{name}: {value}");
    }
}

#[tokio::test]
async fn the_default_is_the_posts_headers_only() {
    let app = app(HeaderStyle::default());
    let response = get_as(&app, "free").await;
    assert_eq!(header(&response, "x-ratelimit-limit"), Some("10"));
    assert_eq!(header(&response, "ratelimit"), None);
    assert_eq!(header(&response, "ratelimit-policy"), None);
}

#[tokio::test]
async fn no_rate_limit_headers_but_a_refusal_still_says_when_to_retry() {
    let app = app(HeaderStyle::None);
    for _ in 0..10 {
        let passed = get_as(&app, "free").await;
        assert_eq!(passed.status(), 200);
        for name in ["x-ratelimit-limit", "ratelimit", "ratelimit-policy"] {
            assert_eq!(header(&passed, name), None, "{name}");
        }
    }
    let refused = get_as(&app, "free").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "retry-after"), Some("6"));
    assert_eq!(header(&refused, "x-ratelimit-remaining"), None);
    assert_eq!(header(&refused, "ratelimit"), None);
}
