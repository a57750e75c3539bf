//! The policies for what does not fit (no identity, unknown tier, store
//! failure, bad costs), configuration errors, and the layer's contract with
//! the service it wraps, through the real layer on a fake clock.
#![allow(clippy::unwrap_used)]

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::{Extension, Router};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_rate_tier::RateTierBuilder;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::key::InvalidTierName;
use tower_rate_tier::{
    ConfigError, LimitEvent, MemoryStorage, OnMissing, OnStorageError,
    OnUnknownTier, Quota, RateLimitInfo, RateTier, Storage, StorageError,
    TierIdentity, TierLimitLayer, tier_cost,
};

// `BucketCheck` and `Decision` (the `Storage` trait's types) are not
// re-exported by tower-rate-tier; the storage crate is one of its
// dependencies, so a test may name them from there.
mod reexport {
    pub(crate) use rate_tier_storage::{BucketCheck, Decision};
}

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
#[should_panic(expected = "invalid tier name: tier name \"a:b\" holds ':'")]
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
#[should_panic(expected = "invalid tier name: tier name is empty")]
fn build_panics_on_an_empty_tier_name() {
    let _ = RateTier::builder().tier("", q()).build();
}

#[test]
#[should_panic(
    expected = "invalid tier name: tier name is longer than 64 bytes"
)]
fn build_panics_on_a_65_byte_tier_name() {
    let _ = RateTier::builder().tier("x".repeat(65), q()).build();
}

// ---------------------------------------------------------------------------
// Storage errors, with a store that always fails.

#[derive(Debug)]
struct FailingStorage {
    calls: AtomicUsize,
}

#[async_trait::async_trait]
impl Storage for FailingStorage {
    async fn check(
        &self,
        _check: &reexport::BucketCheck<'_>,
    ) -> Result<reexport::Decision, StorageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(StorageError::Timeout(Duration::from_millis(100)))
    }

    fn kind(&self) -> &'static str {
        "failing"
    }
}

fn failing() -> Arc<FailingStorage> {
    Arc::new(FailingStorage {
        calls: AtomicUsize::new(0),
    })
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
        assert_eq!(store.calls.load(Ordering::SeqCst), 1);
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
    assert_eq!(store.calls.load(Ordering::SeqCst), 0);
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
        let result: Result<Response<String>, MyError> =
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
            get(show_info)
                .layer::<_, Infallible>(limiter.clone())
                .layer::<_, Infallible>(tier_cost(5)),
        )
        .route("/data", get(show_info).layer::<_, Infallible>(limiter));
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

#[tokio::test]
async fn tier_cost_inside_a_router_layer_limiter_is_a_loud_500() {
    let clock = FakeClock::new();
    let store = MemoryStorage::with_clock(clock.clone());
    let events: Events = Arc::default();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    // The post's trap: the route's layer runs after Router::layer's limiter.
    let app = Router::new()
        .route(
            "/report",
            get(move || async move {
                c.fetch_add(1, Ordering::SeqCst);
                "report"
            })
            .layer(tier_cost(5)),
        )
        .route("/data", get(|| async { "data" }))
        .layer(layer(free10(&clock, &store), &events));

    let r = send(&app, Some("ana"), None, "/report").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert!(r.body.contains("tier_cost()"), "{}", r.body);
    assert!(r.body.contains("runs after the rate limiter"), "{}", r.body);
    assert!(r.body.contains("cost_fn"), "{}", r.body);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the handler was not served"
    );

    // Never silently served at cost 1, however often it is asked.
    for _ in 0..3 {
        let r = send(&app, Some("ana"), None, "/report").await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
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
            tier: "free".into(),
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
