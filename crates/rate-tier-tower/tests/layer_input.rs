//! Bad input never panics: header values that are not UTF-8 or are huge,
//! empty user ids, zero costs and quotas, times out of range.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::BodyExt;
use support::fixtures::{plan_of, post_plans};
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::storage::key::{KeySecret, bucket_key};
use tower_rate_tier::{
    Error, LimitEvent, LimitReason, MemoryStorage, OnMissing, Quota, RateTier,
    TierIdentity, TierLimitLayer, policy::OnUnknownTier, rules::QuotaError,
};

type Events = Arc<Mutex<Vec<LimitEvent>>>;

fn with_events(layer: TierLimitLayer, events: &Events) -> TierLimitLayer {
    let sink = events.clone();
    layer.on_event(move |e| sink.lock().unwrap().push(e.clone()))
}

/// The 0.3 example's app.
fn post_app(clock: &FakeClock, events: &Events) -> Router {
    let layer = TierLimitLayer::new(post_plans(clock).build()).identifier_fn(
        |headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        },
    );
    Router::new()
        .route("/data", get(|| async { "data" }))
        .layer(with_events(layer, events))
}

/// Any key is a free user: the identity is the raw header value, lossily.
fn any_key_app(clock: &FakeClock, events: &Events) -> Router {
    let layer = TierLimitLayer::new(post_plans(clock).build()).identifier_fn(
        |headers| {
            let key = headers.get("x-api-key")?;
            Some(TierIdentity::new(
                String::from_utf8_lossy(key.as_bytes()),
                "free",
            ))
        },
    );
    Router::new()
        .route("/data", get(|| async { "data" }))
        .layer(with_events(layer, events))
}

async fn send(
    app: &Router,
    key: Option<HeaderValue>,
) -> (StatusCode, Option<u64>, String) {
    let mut request = Request::builder().uri("/data");
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let remaining = response
        .headers()
        .get("x-ratelimit-remaining")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, remaining, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn a_non_utf8_api_key_counts_as_missing() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let app = post_app(&clock, &events);
    let key = HeaderValue::from_bytes(b"\xff\xfe").unwrap();
    let (status, remaining, body) = send(&app, Some(key)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(remaining, None);
    assert_eq!(body, r#"{"error":"identity required"}"#);
    assert_eq!(*events.lock().unwrap(), vec![LimitEvent::MissingIdentity]);
}

#[tokio::test]
async fn a_64_kib_api_key_is_handled() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let big = "k".repeat(64 * 1024);

    // The 0.3 example's config: not a known key, so 401.
    let app = post_app(&clock, &events);
    let (status, _, _) =
        send(&app, Some(HeaderValue::from_str(&big).unwrap())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // A config that takes any key: it is an identity, with its own bucket.
    let app = any_key_app(&clock, &events);
    let value = || Some(HeaderValue::from_str(&big).unwrap());
    assert_eq!(send(&app, value()).await.1, Some(9));
    assert_eq!(send(&app, value()).await.1, Some(8));
    // One byte different at the very end: another bucket.
    let mut other = big.clone();
    other.pop();
    other.push('j');
    assert_eq!(
        send(&app, Some(HeaderValue::from_str(&other).unwrap()))
            .await
            .1,
        Some(9)
    );
    // Non-UTF-8 bytes, lossily converted by this identifier: no panic either.
    let mut raw = vec![b'a'; 64 * 1024];
    raw.extend_from_slice(b"\xff\xfe");
    assert_eq!(
        send(&app, Some(HeaderValue::from_bytes(&raw).unwrap()))
            .await
            .0,
        StatusCode::OK
    );
}

#[test]
fn a_shared_store_key_has_a_fixed_length_whatever_the_user_id() {
    let secret = KeySecret::new(b"secret").unwrap();
    let expected = "trt:free:".len() + 40;
    for user in [
        "a".to_owned(),
        "key_ana".to_owned(),
        "k".repeat(64 * 1024),
        "\u{1F600}".repeat(10_000),
        String::new(),
    ] {
        let plain = bucket_key("free", &user, None);
        let keyed = bucket_key("free", &user, Some(&secret));
        assert_eq!(plain.len(), expected, "{} bytes of user id", user.len());
        assert_eq!(keyed.len(), expected);
        assert!(plain.starts_with("trt:free:"));
        assert!(!plain.contains(&user) || user.is_empty() || user == "a");
        assert!(
            plain["trt:free:".len()..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
    }
    assert_eq!(
        bucket_key("free", "key_ana", None),
        "trt:free:33d2315cbeb866b8b237240a98d605f2e6e41b8a"
    );
}

#[tokio::test]
async fn an_empty_user_id_counts_as_missing() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    // The 0.3 example's policy (401)...
    let layer = TierLimitLayer::new(post_plans(&clock).build())
        .identifier_fn(|_| Some(TierIdentity::new("", "pro")));
    let app = Router::new()
        .route("/data", get(|| async { "data" }))
        .layer(with_events(layer, &events));
    assert_eq!(send(&app, None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(*events.lock().unwrap(), vec![LimitEvent::MissingIdentity]);

    // ...and UseDefault: the shared anonymous bucket of the default tier
    // (free, 10), not a "pro" bucket for the user "".
    let tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .on_missing(OnMissing::UseDefault)
        .build();
    let layer = TierLimitLayer::new(tiers).identifier_fn(|headers| {
        let key = headers
            .get("x-api-key")
            .map_or("", |v| v.to_str().unwrap_or(""));
        Some(TierIdentity::new(key, "pro"))
    });
    let app = Router::new()
        .route("/data", get(|| async { "data" }))
        .layer(layer);
    assert_eq!(send(&app, None).await.1, Some(9));
    // No header at all and an empty header share that bucket.
    assert_eq!(
        send(&app, Some(HeaderValue::from_static(""))).await.1,
        Some(8)
    );
    // A real user on pro is unaffected.
    assert_eq!(
        send(&app, Some(HeaderValue::from_static("bea"))).await.1,
        Some(99)
    );
}

#[tokio::test]
async fn check_with_cost_zero_is_a_typed_error() {
    let clock = FakeClock::new();
    let store = MemoryStorage::with_clock(clock.clone());
    let limiter = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .default_tier("free")
        .storage(Arc::new(store.clone()))
        .build();
    assert!(matches!(
        limiter.check("ana", "free", 0).await,
        Err(Error::ZeroCost)
    ));
    // An unknown tier under the default policy uses the default quota: same.
    assert!(matches!(
        limiter.check("ana", "gold", 0).await,
        Err(Error::ZeroCost)
    ));
    assert_eq!(store.len(), 0);
    // And the bucket was not charged.
    let info = limiter.check("ana", "free", 1).await.unwrap().unwrap();
    assert_eq!(info.remaining, 9);
}

/// Cost 0 is an input error whatever the tier: a regression test for an
/// unknown tier under `OnUnknownTier::Allow` answering `Ok(Ok(info))` with
/// cost 0, and `Ok(Err(Limited))` under `Deny`.
#[tokio::test]
async fn check_with_cost_zero_is_an_error_even_for_an_unknown_tier() {
    for policy in [OnUnknownTier::Allow, OnUnknownTier::Deny] {
        let limiter = RateTier::builder()
            .clock(FakeClock::new())
            .tier("free", Quota::per_minute(10))
            .on_unknown_tier(policy)
            .build();
        let got = limiter.check("ana", "gold", 0).await;
        assert!(
            matches!(got, Err(Error::ZeroCost)),
            "{policy:?}: check(\"ana\", \"gold\", 0) = {got:?}, expected Err(ZeroCost)"
        );
    }
}

#[tokio::test]
async fn check_with_a_huge_cost_is_a_403_decision_not_a_panic() {
    let limiter = RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(10))
        .build();
    let limited = limiter
        .check("ana", "free", u32::MAX)
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(
        limited.reason(),
        LimitReason::CostExceedsBurst { cost: u32::MAX }
    );
    assert!(!limited.can_retry());
    assert_eq!(limited.retry_after_secs(), 0);
}

#[test]
fn zero_or_unrepresentable_quotas_are_typed_errors() {
    assert_eq!(
        Quota::new(0, Duration::from_secs(60)),
        Err(QuotaError::ZeroLimit)
    );
    assert_eq!(Quota::new(10, Duration::ZERO), Err(QuotaError::ZeroPeriod));
    assert_eq!(
        Quota::new(10, Duration::from_nanos(999)),
        Err(QuotaError::ZeroPeriod)
    );
    assert_eq!(
        Quota::new(2_000_000, Duration::from_secs(1)),
        Err(QuotaError::IntervalTooSmall)
    );
    assert_eq!(
        Quota::new(1, Duration::from_secs(u64::MAX)),
        Err(QuotaError::OutOfRange)
    );
    assert_eq!(
        Quota::per_minute(10).try_allow_burst(0),
        Err(QuotaError::ZeroBurst)
    );
    assert_eq!(
        Quota::per_day(1).try_allow_burst(u32::MAX),
        Err(QuotaError::OutOfRange)
    );
}

#[tokio::test]
async fn a_clock_beyond_the_gcra_range_is_an_error_not_a_panic() {
    let clock = FakeClock::at_us(u64::MAX);
    let limiter = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .default_tier("free")
        .build();
    assert!(matches!(
        limiter.check("ana", "free", 1).await,
        Err(Error::Check(_))
    ));
    // Through the layer: a 500, and the handler is not called.
    let events: Events = Arc::default();
    let layer = TierLimitLayer::new(limiter)
        .identifier_fn(|_| Some(TierIdentity::new("ana", "free")));
    let app = Router::new()
        .route("/data", get(|| async { "data" }))
        .layer(with_events(layer, &events));
    let (status, remaining, body) = send(&app, None).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(remaining, None);
    assert_ne!(body, "data");
}

#[tokio::test]
async fn a_tier_header_that_would_break_json_never_reaches_a_body() {
    // The identity's tier is attacker-controlled; only configured names are
    // written to responses.
    let clock = FakeClock::new();
    let layer = TierLimitLayer::new(post_plans(&clock).build()).identifier_fn(
        |headers| {
            let tier = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new("mallory", tier))
        },
    );
    let app = Router::new()
        .route("/data", get(|| async { "data" }))
        .layer(layer);
    let evil = || Some(HeaderValue::from_static(r#"free","x":"y"#));
    for _ in 0..10 {
        assert_eq!(send(&app, evil()).await.0, StatusCode::OK);
    }
    let (status, _, body) = send(&app, evil()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        body,
        r#"{"error":"rate limit exceeded","tier":"free","retry_after":6}"#
    );
}
