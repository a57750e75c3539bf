//! The policies for what does not fit (no identity, unknown tier, store
//! failure, bad costs), configuration errors, and the layer's contract with
//! the service it wraps, through the real layer on a fake clock.
#![allow(clippy::unwrap_used)]

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use support::stores::TimingOut;
use tower::{ServiceBuilder, ServiceExt};
use tower_rate_tier::RateTierBuilder;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::layer::LimitBody;
use tower_rate_tier::storage::key::InvalidTierName;
use tower_rate_tier::{
    ConfigError, LimitEvent, MemoryStorage, OnMissing, Quota, RateLimitInfo,
    RateTier, TierIdentity, TierLimitLayer, Tiers, policy::OnIdentityError,
    policy::OnStorageError, policy::OnUnknownTier, tier_cost,
};

type Events = Arc<Mutex<Vec<LimitEvent>>>;

/// Identity from `x-api-key: user` and `x-tier: tier` (tier defaults to free).
fn layer(tiers: RateTier, events: &Events) -> TierLimitLayer {
    let sink = events.clone();
    TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let user = headers.get("x-api-key")?.to_str().ok()?;
            let tier = headers
                .get("x-tier")
                .and_then(|t| t.to_str().ok())
                .unwrap_or("free");
            Some(TierIdentity::new(user, tier))
        })
        .on_event(move |event| sink.lock().unwrap().push(event.clone()))
}

fn counting_app(calls: &Arc<AtomicUsize>) -> Router {
    let calls = calls.clone();
    Router::new().route(
        "/data",
        get(move || async move {
            calls.fetch_add(1, Ordering::SeqCst);
            "data"
        }),
    )
}

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    fn remaining(&self) -> u64 {
        self.header("x-ratelimit-remaining")
            .unwrap()
            .parse()
            .unwrap()
    }
    fn has_rate_headers(&self) -> bool {
        [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]
        .iter()
        .any(|h| self.headers.contains_key(*h))
    }
}

async fn send(
    app: &Router,
    user: Option<&str>,
    tier: Option<&str>,
    path: &str,
) -> Reply {
    let mut request = Request::builder().uri(path);
    if let Some(user) = user {
        request = request.header("x-api-key", user);
    }
    if let Some(tier) = tier {
        request = request.header("x-tier", tier);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn free3(clock: &FakeClock) -> RateTierBuilder {
    RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(3))
}

// ---------------------------------------------------------------------------
// No identity.

#[tokio::test]
async fn use_default_puts_every_anonymous_request_in_one_bucket() {
    let clock = FakeClock::at_us(1_000_000_000);
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let tiers = free3(&clock)
        .default_tier("free")
        .on_missing(OnMissing::UseDefault)
        .build();
    let app = counting_app(&calls).layer(layer(tiers, &events));

    for k in 1..=3u64 {
        let r = send(&app, None, None, "/data").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.header("x-ratelimit-limit"), Some("3"));
        assert_eq!(r.remaining(), 3 - k);
    }
    // A fourth anonymous client shares the same, now empty, bucket.
    let r = send(&app, None, None, "/data").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // An identified user on the same tier still has her own full bucket.
    let r = send(&app, Some("ana"), None, "/data").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.remaining(), 2);
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    let missing = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| **e == LimitEvent::MissingIdentity)
        .count();
    assert_eq!(missing, 4, "one MissingIdentity per anonymous request");
}

#[tokio::test]
async fn with_a_default_tier_the_missing_policy_defaults_to_use_default() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let tiers = free3(&clock).default_tier("free").build();
    let app = counting_app(&calls).layer(layer(tiers, &events));
    let r = send(&app, None, None, "/data").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.remaining(), 2);
}

#[tokio::test]
async fn without_a_default_tier_the_missing_policy_defaults_to_401() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let app = counting_app(&calls).layer(layer(free3(&clock).build(), &events));
    let r = send(&app, None, None, "/data").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(*events.lock().unwrap(), vec![LimitEvent::MissingIdentity]);
}

#[tokio::test]
async fn missing_deny_uses_the_chosen_status() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let tiers = free3(&clock)
        .default_tier("free")
        .on_missing(OnMissing::Deny(StatusCode::PROXY_AUTHENTICATION_REQUIRED))
        .build();
    let app = counting_app(&calls).layer(layer(tiers, &events));
    let r = send(&app, None, None, "/data").await;
    assert_eq!(r.status, StatusCode::PROXY_AUTHENTICATION_REQUIRED);
    assert!(!r.has_rate_headers());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// Unknown tier.

#[tokio::test]
async fn unknown_tier_without_a_default_is_403() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let app = counting_app(&calls).layer(layer(free3(&clock).build(), &events));
    let r = send(&app, Some("eva"), Some("gold"), "/data").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.header("retry-after"), None);
    assert_eq!(r.body, r#"{"error":"unknown tier"}"#);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        *events.lock().unwrap(),
        vec![LimitEvent::UnknownTier {
            user_id: "eva".into(),
            tier: "gold".into(),
            policy: OnUnknownTier::Deny,
        }]
    );
}

#[tokio::test]
async fn unknown_tier_deny_with_a_default_is_403() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let tiers = free3(&clock)
        .default_tier("free")
        .on_unknown_tier(OnUnknownTier::Deny)
        .build();
    let app = counting_app(&calls).layer(layer(tiers, &events));
    for _ in 0..3 {
        let r = send(&app, Some("eva"), Some("gold"), "/data").await;
        assert_eq!(r.status, StatusCode::FORBIDDEN);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(events.lock().unwrap().len(), 3);
    // A known tier is unaffected by the policy.
    assert_eq!(send(&app, Some("eva"), None, "/data").await.remaining(), 2);
}

#[tokio::test]
async fn unknown_tier_allow_passes_beyond_any_quota_with_an_event_each() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let tiers = free3(&clock)
        .default_tier("free")
        .on_unknown_tier(OnUnknownTier::Allow)
        .build();
    let app = counting_app(&calls).layer(layer(tiers, &events));
    for _ in 0..20 {
        let r = send(&app, Some("eva"), Some("gold"), "/data").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, "data");
        assert!(!r.has_rate_headers(), "{:?}", r.headers);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 20);
    let expected = LimitEvent::UnknownTier {
        user_id: "eva".into(),
        tier: "gold".into(),
        policy: OnUnknownTier::Allow,
    };
    assert_eq!(*events.lock().unwrap(), vec![expected; 20]);
}

// ---------------------------------------------------------------------------
// Configuration errors: typed from try_build, a panic with the error from build.

fn q() -> Quota {
    Quota::per_minute(10)
}

#[test]
fn config_errors_are_typed() {
    assert_eq!(
        RateTier::builder().try_build().unwrap_err(),
        ConfigError::NoTiers
    );
    assert_eq!(
        RateTier::builder()
            .tier("free", q())
            .tier("free", Quota::per_minute(20))
            .try_build()
            .unwrap_err(),
        ConfigError::DuplicateTier("free".into())
    );
    assert_eq!(
        RateTier::builder()
            .tier("free", q())
            .default_tier("gold")
            .try_build()
            .unwrap_err(),
        ConfigError::UnknownDefaultTier("gold".into())
    );
    assert_eq!(
        RateTier::builder()
            .tier("free", q())
            .on_missing(OnMissing::UseDefault)
            .try_build()
            .unwrap_err(),
        ConfigError::NoDefaultTier("OnMissing::UseDefault")
    );
    assert_eq!(
        RateTier::builder()
            .tier("free", q())
            .on_unknown_tier(OnUnknownTier::UseDefault)
            .try_build()
            .unwrap_err(),
        ConfigError::NoDefaultTier("OnUnknownTier::UseDefault")
    );
    let bad_char = |name: &str, found: char| {
        assert_eq!(
            RateTier::builder().tier(name, q()).try_build().unwrap_err(),
            ConfigError::InvalidTierName(InvalidTierName::BadChar {
                name: name.into(),
                found
            }),
            "{name:?}"
        );
    };
    bad_char("free:x", ':');
    bad_char("{free}", '{');
    bad_char("free tier", ' ');
    bad_char("frée", 'é');
    assert_eq!(
        RateTier::builder().tier("", q()).try_build().unwrap_err(),
        ConfigError::InvalidTierName(InvalidTierName::Empty)
    );
    assert_eq!(
        RateTier::builder()
            .tier("a".repeat(65), q())
            .try_build()
            .unwrap_err(),
        ConfigError::InvalidTierName(InvalidTierName::TooLong)
    );
    // The boundary: 64 bytes and the whole allowed alphabet are fine.
    assert!(
        RateTier::builder()
            .tier("a".repeat(64), q())
            .try_build()
            .is_ok()
    );
    assert!(
        RateTier::builder()
            .tier("Pro-2026.v2_x", q())
            .try_build()
            .is_ok()
    );
    // A default tier with a valid policy is fine.
    assert!(
        RateTier::builder()
            .tier("free", q())
            .default_tier("free")
            .on_missing(OnMissing::UseDefault)
            .on_unknown_tier(OnUnknownTier::UseDefault)
            .try_build()
            .is_ok()
    );
}

/// An empty secret would be an HMAC that protects nothing.
#[test]
fn an_empty_key_secret_is_refused_at_build() {
    let err = RateTier::builder()
        .tier("free", q())
        .key_secret("")
        .try_build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::EmptyKeySecret(_)), "{err:?}");
    let err = RateTier::builder()
        .tier("free", q())
        .key_secret(Vec::<u8>::new())
        .try_build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::EmptyKeySecret(_)), "{err:?}");
    assert!(err.to_string().contains("empty"), "{err}");
    assert!(tower_rate_tier::storage::key::KeySecret::new("").is_err());
    // One byte is a secret.
    assert!(
        RateTier::builder()
            .tier("free", q())
            .key_secret("k")
            .try_build()
            .is_ok()
    );
}

#[test]
#[should_panic(expected = "invalid RateTier configuration")]
fn build_panics_on_an_empty_key_secret() {
    let _ = RateTier::builder().tier("free", q()).key_secret("").build();
}

#[test]
fn a_refusal_policy_needs_an_error_status() {
    for (builder, policy) in [
        (
            Tiers::builder().on_missing(OnMissing::Deny(StatusCode::OK)),
            "OnMissing::Deny",
        ),
        (
            Tiers::builder()
                .on_storage_error(OnStorageError::Deny(StatusCode::OK)),
            "OnStorageError::Deny",
        ),
        (
            Tiers::builder()
                .on_identity_error(OnIdentityError::Deny(StatusCode::FOUND)),
            "OnIdentityError::Deny",
        ),
    ] {
        let err = builder.tier("free", q()).build().unwrap_err();
        assert!(
            matches!(err, ConfigError::NotAnErrorStatus { policy: p, .. } if p == policy),
            "{err:?}"
        );
    }
}

#[test]
fn a_limit_cannot_share_a_name_with_another_limit_but_may_with_a_tier() {
    use tower_rate_tier::Limit;
    let tiers = RateTier::builder().tier("free", q()).build();
    let layer = TierLimitLayer::new(tiers)
        .limit(Limit::new("search", Quota::per_minute(3)));
    let again = layer
        .clone()
        .try_limit(Limit::new("search", Quota::per_minute(5)))
        .unwrap_err();
    assert_eq!(again, ConfigError::DuplicateLimit("search".into()));
    // A tier and a limit of one name are in separate namespaces: their
    // buckets never meet.
    assert!(
        layer
            .try_limit(Limit::new("free", Quota::per_minute(5)))
            .is_ok()
    );
    assert!(matches!(
        Limit::try_new("a b", q()),
        Err(ConfigError::InvalidTierName(_))
    ));
}

#[test]
#[should_panic(expected = "invalid limit")]
fn a_duplicate_limit_panics_at_start_up() {
    use tower_rate_tier::Limit;
    let tiers = RateTier::builder().tier("free", q()).build();
    let _ = TierLimitLayer::new(tiers)
        .limit(Limit::new("search", Quota::per_minute(3)))
        .limit(Limit::new("search", Quota::per_minute(3)));
}

#[test]
#[should_panic(expected = "invalid RateTier configuration: no tier configured")]
fn build_panics_on_no_tiers() {
    let _ = RateTier::builder().build();
}

#[test]
#[should_panic(expected = "tier \"free\" is configured twice")]
fn build_panics_on_a_duplicate_tier() {
    let _ = RateTier::builder()
        .tier("free", q())
        .tier("free", q())
        .build();
}

#[test]
#[should_panic(expected = "default tier \"gold\" is not a configured tier")]
fn build_panics_on_an_unconfigured_default_tier() {
    let _ = RateTier::builder()
        .tier("free", q())
        .default_tier("gold")
        .build();
}

#[test]
#[should_panic(expected = "OnMissing::UseDefault needs a default tier")]
fn build_panics_on_use_default_missing_without_a_default() {
    let _ = RateTier::builder()
        .tier("free", q())
        .on_missing(OnMissing::UseDefault)
        .build();
}

#[test]
#[should_panic(expected = "OnUnknownTier::UseDefault needs a default tier")]
fn build_panics_on_use_default_unknown_without_a_default() {
    let _ = RateTier::builder()
        .tier("free", q())
        .on_unknown_tier(OnUnknownTier::UseDefault)
        .build();
}

#[test]
#[should_panic(expected = "invalid name: tier name \"a:b\" holds ':'")]
fn build_panics_on_a_colon_in_a_tier_name() {
    let _ = RateTier::builder().tier("a:b", q()).build();
}

#[test]
#[should_panic(expected = "holds '{'")]
fn build_panics_on_a_brace_in_a_tier_name() {
    let _ = RateTier::builder().tier("{a}", q()).build();
}

#[test]
#[should_panic(expected = "holds ' '")]
fn build_panics_on_a_space_in_a_tier_name() {
    let _ = RateTier::builder().tier("a b", q()).build();
}

#[test]
#[should_panic(expected = "invalid name: tier name is empty")]
fn build_panics_on_an_empty_tier_name() {
    let _ = RateTier::builder().tier("", q()).build();
}

#[test]
#[should_panic(expected = "invalid name: tier name is longer than 64 bytes")]
fn build_panics_on_a_65_byte_tier_name() {
    let _ = RateTier::builder().tier("x".repeat(65), q()).build();
}

// ---------------------------------------------------------------------------
// Storage errors, with a store that always fails.

fn failing() -> Arc<TimingOut> {
    Arc::new(TimingOut::new("failing"))
}

#[tokio::test]
async fn storage_error_deny_is_503_with_retry_after_1_and_an_event() {
    for policy in [
        None,
        Some(OnStorageError::Deny(StatusCode::SERVICE_UNAVAILABLE)),
    ] {
        let store = failing();
        let events: Events = Arc::default();
        let calls = Arc::new(AtomicUsize::new(0));
        let mut builder = free3(&FakeClock::new()).storage(store.clone());
        if let Some(policy) = policy {
            builder = builder.on_storage_error(policy);
        }
        let app = counting_app(&calls).layer(layer(builder.build(), &events));
        let r = send(&app, Some("ana"), None, "/data").await;
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{policy:?}");
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.body, r#"{"error":"rate limiter unavailable"}"#);
        assert!(!r.has_rate_headers());
        assert_eq!(calls.load(Ordering::SeqCst), 0, "inner not called");
        assert_eq!(store.calls(), 1);
        let evs = events.lock().unwrap().clone();
        assert_eq!(evs.len(), 1);
        match &evs[0] {
            LimitEvent::StorageError {
                storage,
                error,
                policy,
            } => {
                assert_eq!(*storage, "failing");
                assert!(error.contains("did not answer"), "{error}");
                assert_eq!(
                    *policy,
                    OnStorageError::Deny(StatusCode::SERVICE_UNAVAILABLE)
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn storage_error_allow_passes_and_reports_each_time() {
    let store = failing();
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let tiers = free3(&FakeClock::new())
        .storage(store.clone())
        .on_storage_error(OnStorageError::Allow)
        .build();
    let app = counting_app(&calls).layer(layer(tiers, &events));
    for _ in 0..5 {
        let r = send(&app, Some("ana"), None, "/data").await;
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.body, "data");
        assert!(!r.has_rate_headers());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);
    let evs = events.lock().unwrap().clone();
    assert_eq!(evs.len(), 5);
    assert!(evs.iter().all(|e| matches!(
        e,
        LimitEvent::StorageError {
            storage: "failing",
            policy: OnStorageError::Allow,
            ..
        }
    )));
}

#[tokio::test]
async fn a_failing_store_is_not_asked_for_requests_refused_before_it() {
    // No identity (401), unknown tier (403), cost above the burst (403):
    // decided without the store.
    let store = failing();
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let tiers = free3(&FakeClock::new()).storage(store.clone()).build();
    let app = counting_app(&calls).layer(layer(tiers, &events).cost_fn(|_| 4));
    assert_eq!(
        send(&app, None, None, "/data").await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        send(&app, Some("a"), Some("gold"), "/data").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        send(&app, Some("a"), None, "/data").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(store.calls(), 0);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

// ---------------------------------------------------------------------------
// The wrapped service: not called on refusals, errors pass through.

#[derive(Debug, PartialEq, Eq)]
struct MyError(u32);

#[tokio::test]
async fn the_inner_error_type_passes_through_unchanged() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let inner = tower::service_fn(move |_req: Request<String>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Err::<Response<String>, MyError>(MyError(42)) }
    });
    let service =
        tower::Layer::layer(&layer(free3(&clock).build(), &events), inner);
    let req = || {
        Request::builder()
            .uri("/x")
            .header("x-api-key", "ana")
            .body(String::new())
            .unwrap()
    };
    for _ in 0..3 {
        let result: Result<Response<LimitBody<String>>, MyError> =
            service.clone().oneshot(req()).await;
        assert_eq!(result.unwrap_err(), MyError(42));
    }
    // The three errors were still charged; the fourth is refused by the
    // limiter itself, as a response, and the inner service is not called.
    let refused = service.clone().oneshot(req()).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn the_inner_service_is_not_called_on_any_refusal() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let inner = tower::service_fn(move |_req: Request<String>| {
        counter.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, Infallible>(Response::new(String::from("ok"))) }
    });
    let tiers = free3(&clock).build();
    let service = tower::Layer::layer(
        &layer(tiers, &events)
            .cost_fn(|req| req.uri.path()[1..].parse().unwrap_or(1)),
        inner,
    );
    let send = |user: Option<&str>, tier: Option<&str>, path: &str| {
        let mut request = Request::builder().uri(path);
        if let Some(user) = user {
            request = request.header("x-api-key", user);
        }
        if let Some(tier) = tier {
            request = request.header("x-tier", tier);
        }
        service
            .clone()
            .oneshot(request.body(String::new()).unwrap())
    };
    let statuses = [
        send(None, None, "/1").await.unwrap().status(), // no identity
        send(Some("a"), Some("gold"), "/1").await.unwrap().status(), // unknown tier
        send(Some("a"), None, "/4").await.unwrap().status(), // cost > burst
        send(Some("a"), None, "/0").await.unwrap().status(), // cost 0
    ];
    assert_eq!(
        statuses,
        [
            StatusCode::UNAUTHORIZED,
            StatusCode::FORBIDDEN,
            StatusCode::FORBIDDEN,
            StatusCode::INTERNAL_SERVER_ERROR
        ]
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        send(Some("a"), None, "/3").await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        send(Some("a"), None, "/1").await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

// ---------------------------------------------------------------------------
// Costs.

fn free10(clock: &FakeClock, store: &MemoryStorage) -> RateTier {
    RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .default_tier("free")
        .storage(Arc::new(store.clone()))
        .build()
}

async fn show_info(Extension(info): Extension<RateLimitInfo>) -> String {
    format!(
        "{} limit={} remaining={} cost={}",
        info.tier, info.limit, info.remaining, info.cost
    )
}

#[tokio::test]
async fn tier_cost_outside_a_per_route_limiter_charges_its_cost() {
    let clock = FakeClock::new();
    let store = MemoryStorage::with_clock(clock.clone());
    let events: Events = Arc::default();
    let limiter = layer(free10(&clock, &store), &events);
    let app = Router::new()
        .route(
            "/report",
            get(show_info).layer(
                ServiceBuilder::new()
                    .layer(tier_cost(5))
                    .layer(limiter.clone()),
            ),
        )
        .route("/data", get(show_info).layer(limiter));
    let r = send(&app, Some("ana"), None, "/report").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.remaining(), 5);
    assert_eq!(r.body, "free limit=10 remaining=5 cost=5");
    let r = send(&app, Some("ana"), None, "/data").await;
    assert_eq!(r.remaining(), 4);
    assert_eq!(r.body, "free limit=10 remaining=4 cost=1");
    let r = send(&app, Some("ana"), None, "/report").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    // 5 more would need 1 more interval than left: 6 s.
    assert_eq!(r.header("retry-after"), Some("6"));
}

/// `tier_cost` under a tier-wide `Router::layer` limiter: it wraps a
/// route's own limiter (placed anywhere else it does not compile: a doctest
/// of `tier_cost` proves it), every request is answered, and the two
/// limiters each charge their own buckets.
#[tokio::test]
async fn tier_cost_on_a_route_limiter_under_a_plan_wide_limiter_charges_each_its_own()
 {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    // The tier: 10 a minute for everything. Reports: 10 units a minute of
    // their own, a report costing 5 of them. Two limiters, two stores.
    let plan = free10(&clock, &MemoryStorage::with_clock(clock.clone()));
    let reports = free10(&clock, &MemoryStorage::with_clock(clock.clone()));
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let app = Router::new()
        .route(
            "/report",
            get(move |info: Extension<RateLimitInfo>| {
                c.fetch_add(1, Ordering::SeqCst);
                show_info(info)
            })
            .layer(
                ServiceBuilder::new()
                    .layer(tier_cost(5))
                    .layer(layer(reports.clone(), &events)),
            ),
        )
        .route("/data", get(show_info))
        .layer(layer(plan.clone(), &events));

    for (k, plan_left, reports_left) in [(1, 9, 5), (2, 8, 0)] {
        let r = send(&app, Some("ana"), None, "/report").await;
        assert_eq!(r.status, StatusCode::OK, "report {k}: {}", r.body);
        // The handler sees the route's limiter, the innermost.
        assert_eq!(
            r.body,
            format!("free limit=10 remaining={reports_left} cost=5")
        );
        // The response's headers are the tier's, the outermost.
        assert_eq!(r.remaining(), plan_left, "report {k}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(plan.peek("ana", "free").await.unwrap().remaining, 8);
    assert_eq!(reports.peek("ana", "free").await.unwrap().remaining, 0);

    // A third report: the route's limiter refuses (reports are spent)...
    let r = send(&app, Some("ana"), None, "/report").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("retry-after"), Some("30"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    // ...after the tier charged its 1: two limiters are two decisions (a
    // Limit of the tier-wide layer is the one-decision way).
    assert_eq!(plan.peek("ana", "free").await.unwrap().remaining, 7);
    // Other routes pay the tier only.
    let r = send(&app, Some("ana"), None, "/data").await;
    assert_eq!(r.body, "free limit=10 remaining=6 cost=1");
    assert_eq!(reports.peek("ana", "free").await.unwrap().remaining, 0);
}

/// The cost a `tier_cost` layer gives is for the limiter it wraps, and for
/// no other: a per-route limiter nested inside charges its own cost.
#[tokio::test]
async fn a_tier_cost_is_charged_only_by_the_limiter_it_wraps() {
    let clock = FakeClock::new();
    let events: Events = Arc::default();
    let plan = free10(&clock, &MemoryStorage::with_clock(clock.clone()));
    let route = free10(&clock, &MemoryStorage::with_clock(clock.clone()));
    // Every request costs 5 on the tier; /data has a limiter of its own,
    // whose cost is its default, 1.
    let app = Router::new()
        .route("/data", get(show_info).layer(layer(route.clone(), &events)))
        .layer(
            ServiceBuilder::new()
                .layer(tier_cost(5))
                .layer(layer(plan.clone(), &events)),
        );
    let r = send(&app, Some("ana"), None, "/data").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(plan.peek("ana", "free").await.unwrap().remaining, 5);
    assert_eq!(r.body, "free limit=10 remaining=9 cost=1");
    assert_eq!(route.peek("ana", "free").await.unwrap().remaining, 9);
}

#[tokio::test]
async fn a_cost_fn_returning_zero_is_500_with_an_event_and_no_store_write() {
    let clock = FakeClock::new();
    let store = MemoryStorage::with_clock(clock.clone());
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let limiter = layer(free10(&clock, &store), &events)
        .cost_fn(|req| if req.uri.path() == "/data" { 0 } else { 1 });
    let app = counting_app(&calls)
        .route("/other", get(|| async { "other" }))
        .layer(limiter);
    let r = send(&app, Some("ana"), None, "/data").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.body, r#"{"error":"invalid request cost"}"#);
    assert!(!r.has_rate_headers());
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(*events.lock().unwrap(), vec![LimitEvent::InvalidCost]);
    assert_eq!(store.len(), 0, "store untouched");
    // Ana's bucket is full.
    assert_eq!(send(&app, Some("ana"), None, "/other").await.remaining(), 9);
}

#[tokio::test]
async fn a_cost_fn_above_the_burst_is_403_and_no_store_write() {
    let clock = FakeClock::new();
    let store = MemoryStorage::with_clock(clock.clone());
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let limiter = layer(free10(&clock, &store), &events).cost_fn(|_| 11);
    let app = counting_app(&calls).layer(limiter);
    let r = send(&app, Some("ana"), None, "/data").await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.header("retry-after"), None);
    assert!(r.body.contains("\"cost\":11"), "{}", r.body);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(store.len(), 0);
    assert_eq!(
        *events.lock().unwrap(),
        vec![LimitEvent::CostExceedsBurst {
            user_id: "ana".into(),
            tier: "free",
            limit: "free",
            cost: 11,
            burst: 10
        }]
    );
}

#[tokio::test]
async fn the_rate_limit_info_reaches_the_handler() {
    let clock = FakeClock::at_us(1_790_947_094_250_000);
    let store = MemoryStorage::with_clock(clock.clone());
    let events: Events = Arc::default();
    let seen: Arc<Mutex<Option<RateLimitInfo>>> = Arc::default();
    let sink = seen.clone();
    let app = Router::new()
        .route(
            "/data",
            get(
                move |Extension(info): Extension<RateLimitInfo>| async move {
                    *sink.lock().unwrap() = Some(info);
                    "data"
                },
            ),
        )
        .layer(layer(free10(&clock, &store), &events).cost_fn(|_| 3));
    let r = send(&app, Some("ana"), None, "/data").await;
    assert_eq!(r.status, StatusCode::OK);
    let info = seen.lock().unwrap().clone().unwrap();
    assert_eq!(&*info.tier, "free");
    assert_eq!(info.limit, 10);
    assert_eq!(info.remaining, 7);
    assert_eq!(info.cost, 3);
    assert_eq!(info.reset_after, Duration::from_secs(18));
    assert_eq!(info.now_us, 1_790_947_094_250_000);
    assert_eq!(info.reset_unix_secs(), 1_790_947_113);
    assert_eq!(r.header("x-ratelimit-reset"), Some("1790947113"));
}

// ---------------------------------------------------------------------------
// The service and its future.

#[derive(Clone, Debug, PartialEq)]
struct Named(&'static str);

impl tower::Service<Request<String>> for Named {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<String>) -> Self::Future {
        std::future::ready(Ok(Response::new(self.0.to_owned())))
    }
}

#[test]
fn the_service_gives_its_inner_service_back() {
    let events: Events = Arc::default();
    let mut service = tower::Layer::layer(
        &layer(free3(&FakeClock::new()).build(), &events),
        Named("inner"),
    );
    assert_eq!(service.get_ref(), &Named("inner"));
    service.get_mut().0 = "changed";
    assert_eq!(service.clone().into_inner(), Named("changed"));
    assert!(format!("{service:?}").contains("changed"));
}

fn poll_once<F: std::future::Future + Unpin>(
    future: &mut F,
) -> std::task::Poll<F::Output> {
    let waker = std::task::Waker::noop();
    std::pin::Pin::new(future).poll(&mut std::task::Context::from_waker(waker))
}

/// Like every future, it must not be polled after it completed; it says so
/// instead of hanging.
#[test]
#[should_panic(expected = "polled after completion")]
fn a_response_future_polled_after_completion_panics() {
    use tower::Service;
    let events: Events = Arc::default();
    let mut service = tower::Layer::layer(
        &layer(free3(&FakeClock::new()).build(), &events),
        Named("inner"),
    );
    let request = Request::builder()
        .header("x-api-key", "ana")
        .body(String::new())
        .unwrap();
    let mut future = Box::pin(service.call(request));
    let std::task::Poll::Ready(response) = poll_once(&mut future) else {
        panic!("an in-memory decision waited");
    };
    assert_eq!(response.unwrap().body().get_ref(), "inner");
    let _ = poll_once(&mut future);
}

#[test]
#[should_panic(expected = "polled after completion")]
fn a_refusals_response_future_polled_after_completion_panics() {
    use tower::Service;
    let events: Events = Arc::default();
    let mut service = tower::Layer::layer(
        &layer(free3(&FakeClock::new()).build(), &events),
        Named("inner"),
    );
    let anonymous = Request::new(String::new());
    let mut future = Box::pin(service.call(anonymous));
    let std::task::Poll::Ready(response) = poll_once(&mut future) else {
        panic!("a refusal waited");
    };
    assert_eq!(response.unwrap().status(), StatusCode::UNAUTHORIZED);
    let _ = poll_once(&mut future);
}
