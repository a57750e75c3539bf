//! The gRPC layer on a real tonic server over loopback, called by a real
//! tonic client: the standard health service (tonic-health, no codegen)
//! with the example server's tiers (free 10/min, pro 100/min, default free,
//! UNAUTHENTICATED without a key) on a fake clock: exact numbers, no sleep.
//!
//! `Check` costs 1 and `Watch` 50 here: more than the free tier's burst,
//! less than pro's.
#![cfg(feature = "grpc")]
#![allow(clippy::unwrap_used)]

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use support::fixtures::{START_US, plan_of, post_plans};
use support::stores::TimingOut;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_types::StatusExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::layer::HeaderStyle;
use tower_rate_tier::{
    FallbackStorage, GrpcTierLimitLayer, IdentityError, Limit, LimitEvent,
    Quota, RateTier, TierIdentifier, TierIdentity, TierLimitLayer, Window,
    policy::OnStorageError, policy::OnUnknownTier,
};

const START_SECS: u64 = 1_790_947_094;

const WATCH: &str = "/grpc.health.v1.Health/Watch";

type Events = Arc<Mutex<Vec<LimitEvent>>>;

/// Serves the health service behind the layer on 127.0.0.1:0, until the
/// test's runtime ends; returns a connected client.
async fn serve(tiers: RateTier, events: &Events) -> HealthClient<Channel> {
    serve_with(tiers, events, HeaderStyle::default()).await
}

async fn serve_with(
    tiers: RateTier,
    events: &Events,
    headers: HeaderStyle,
) -> HealthClient<Channel> {
    serve_layer(layer(tiers, events).headers(headers).grpc()).await
}

/// The example's identity, costs and events, as an HTTP layer (made a gRPC
/// one with `.grpc()`).
fn layer(tiers: RateTier, events: &Events) -> TierLimitLayer {
    let sink = events.clone();
    TierLimitLayer::new(tiers)
        .identifier_fn(|metadata| {
            let key = metadata.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        })
        .cost_fn(|call| match call.uri.path() {
            WATCH => 50,
            _ => 1,
        })
        .on_event(move |event| sink.lock().unwrap().push(event.clone()))
}

/// Serves the health service behind `layer`; a connected client.
async fn serve_layer(layer: GrpcTierLimitLayer) -> HealthClient<Channel> {
    let (_reporter, health) = tonic_health::server::health_reporter();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = Server::builder()
        .layer(layer)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener));
    tokio::spawn(async move { server.await.unwrap() });

    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

fn call<T>(message: T, key: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("x-api-key", key.parse().unwrap());
    }
    request
}

/// A `Check` of the whole server ("").
fn check(key: Option<&str>) -> Request<HealthCheckRequest> {
    call(
        HealthCheckRequest {
            service: String::new(),
        },
        key,
    )
}

fn meta<'a>(metadata: &'a tonic::metadata::MetadataMap, name: &str) -> &'a str {
    metadata
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {metadata:?}"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn ten_checks_pass_then_resource_exhausted_with_retry_info() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let mut client = serve(post_plans(&clock).build(), &events).await;

    for remaining in (0..10).rev() {
        let response = client.check(check(Some("key_ana"))).await.unwrap();
        let metadata = response.metadata();
        assert_eq!(meta(metadata, "x-ratelimit-limit"), "10");
        assert_eq!(
            meta(metadata, "x-ratelimit-remaining"),
            remaining.to_string()
        );
        // Full again 6 s per request charged after t=0.25 s, rounded up.
        let charged = 10 - remaining;
        assert_eq!(
            meta(metadata, "x-ratelimit-reset"),
            (START_SECS + 6 * charged + 1).to_string()
        );
        assert_eq!(
            response.into_inner().status(),
            ServingStatus::Serving,
            "the inner service answered"
        );
    }

    let status = client.check(check(Some("key_ana"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), "rate limit exceeded");
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(6)));
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "tier:free");
    let metadata = status.metadata();
    assert_eq!(meta(metadata, "retry-after"), "6");
    assert_eq!(meta(metadata, "x-ratelimit-limit"), "10");
    assert_eq!(meta(metadata, "x-ratelimit-remaining"), "0");
    assert_eq!(
        meta(metadata, "x-ratelimit-reset"),
        (START_SECS + 61).to_string()
    );
    assert!(events.lock().unwrap().iter().any(|event| matches!(
        event,
        LimitEvent::Limited { user_id, tier: "free", limit: "free", cost: 1, .. }
            if user_id.as_str() == "key_ana"
    )));

    // Another tier, another bucket.
    let response = client.check(check(Some("key_bea"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "99");

    // A client that waits what it is told passes.
    clock.advance(retry.retry_delay.unwrap());
    let response = client.check(check(Some("key_ana"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "0");
    let status = client.check(check(Some("key_ana"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn no_key_or_an_unknown_key_is_unauthenticated() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let mut client = serve(post_plans(&clock).build(), &events).await;

    for key in [None, Some("key_nobody")] {
        let status = client.check(check(key)).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{key:?}");
        assert_eq!(status.message(), "identity required");
        assert!(status.get_details_retry_info().is_none());
        assert!(status.metadata().get("retry-after").is_none());
    }
    assert!(
        events
            .lock()
            .unwrap()
            .iter()
            .all(|event| *event == LimitEvent::MissingIdentity)
    );
}

#[tokio::test]
async fn a_method_above_the_burst_is_failed_precondition_without_retry_info() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let mut client = serve(post_plans(&clock).build(), &events).await;

    let watch = call(
        HealthCheckRequest {
            service: String::new(),
        },
        Some("key_ana"),
    );
    let status = client.watch(watch).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(status.message(), "request cost exceeds the tier's burst");
    assert!(status.get_details_retry_info().is_none());
    let failure = status
        .get_details_precondition_failure()
        .expect("PreconditionFailure");
    assert_eq!(failure.violations[0].r#type, "QUOTA");
    assert_eq!(failure.violations[0].subject, "tier:free");
    assert_eq!(
        failure.violations[0].description,
        "request cost 50 exceeds the tier's burst of 10"
    );
    assert!(status.metadata().get("retry-after").is_none());
    assert_eq!(meta(status.metadata(), "x-ratelimit-limit"), "10");
    assert!(events.lock().unwrap().iter().any(|event| matches!(
        event,
        LimitEvent::CostExceedsBurst {
            cost: 50,
            burst: 10,
            ..
        }
    )));

    // The store was not touched: the bucket is still full.
    let response = client.check(check(Some("key_ana"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "9");
}

#[tokio::test]
async fn each_method_is_charged_its_cost_and_streams_pass() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let mut client = serve(post_plans(&clock).build(), &events).await;

    let watch = call(
        HealthCheckRequest {
            service: String::new(),
        },
        Some("key_bea"),
    );
    let response = client.watch(watch).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-limit"), "100");
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "50");
    let mut stream = response.into_inner();
    let first: HealthCheckResponse = stream.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    drop(stream);

    let response = client.check(check(Some("key_bea"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "49");
}

#[tokio::test]
async fn the_inner_services_errors_pass_through_with_the_limit_metadata() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let mut client = serve(post_plans(&clock).build(), &events).await;

    // The health service answers NOT_FOUND for a service it does not know.
    let unknown = call(
        HealthCheckRequest {
            service: "no.such.Service".into(),
        },
        Some("key_ana"),
    );
    let status = client.check(unknown).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert_eq!(meta(status.metadata(), "x-ratelimit-remaining"), "9");
}

#[tokio::test]
async fn an_unknown_tier_denied_is_permission_denied() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let tiers = post_plans(&clock)
        .on_unknown_tier(OnUnknownTier::Deny)
        .build();
    let mut client = serve(tiers, &events).await;

    let status = client.check(check(Some("key_eva"))).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(status.message(), "unknown tier");
    assert!(status.get_details_retry_info().is_none());

    // With the default policy, the default tier's quota in her own bucket.
    let tiers = post_plans(&clock).build();
    let mut client = serve(tiers, &events).await;
    let response = client.check(check(Some("key_eva"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "9");
}

#[tokio::test]
async fn a_failing_store_is_unavailable_with_a_one_second_retry() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let storage = Arc::new(TimingOut::new("failing"));
    let tiers = post_plans(&clock)
        .storage(storage.clone())
        .on_storage_error(OnStorageError::Deny(StatusCode::SERVICE_UNAVAILABLE))
        .build();
    let mut client = serve(tiers, &events).await;

    let status = client.check(check(Some("key_ana"))).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), "rate limiter unavailable");
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)));
    assert_eq!(meta(status.metadata(), "retry-after"), "1");
    assert_eq!(storage.calls(), 1);

    // Fail open: the inner service answers, unlimited.
    let tiers = post_plans(&clock)
        .storage(storage.clone())
        .on_storage_error(OnStorageError::Allow)
        .build();
    let mut client = serve(tiers, &events).await;
    let response = client.check(check(Some("key_ana"))).await.unwrap();
    assert!(response.metadata().get("x-ratelimit-remaining").is_none());
}

/// The refusal statuses are what a client sees, not a transport error.
#[tokio::test]
async fn refusals_are_statuses_not_transport_errors() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let mut client = serve(post_plans(&clock).build(), &events).await;
    let status: Status = client.check(check(None)).await.unwrap_err();
    // A transport failure would be UNKNOWN / UNAVAILABLE with a source.
    assert_eq!(status.code(), Code::Unauthenticated);
    // The connection is still usable afterwards.
    let response = client.check(check(Some("key_ana"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "9");
}

#[tokio::test]
async fn the_layers_header_style_applies_to_the_metadata() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let mut client =
        serve_with(post_plans(&clock).build(), &events, HeaderStyle::Ietf)
            .await;

    let response = client.check(check(Some("key_ana"))).await.unwrap();
    let metadata = response.metadata();
    assert_eq!(meta(metadata, "ratelimit-policy"), "\"free\";q=10;w=60");
    assert_eq!(meta(metadata, "ratelimit"), "\"free\";r=9;t=6");
    assert!(metadata.get("x-ratelimit-remaining").is_none());

    for _ in 0..9 {
        client.check(check(Some("key_ana"))).await.unwrap();
    }
    let status = client.check(check(Some("key_ana"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(meta(status.metadata(), "retry-after"), "6");
    assert_eq!(meta(status.metadata(), "ratelimit"), "\"free\";r=0;t=6");
    let retry = status.get_details_retry_info().unwrap();
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(6)));
}

// ---------------------------------------------------------------------------
// Several limits in one decision, on gRPC.

const CHECK: &str = "/grpc.health.v1.Health/Check";

/// The tiers with a limit of 3 `Check`s a minute per user beside them.
async fn serve_with_a_check_limit(
    tiers: RateTier,
    events: &Events,
) -> HealthClient<Channel> {
    let layer = layer(tiers, events)
        .limit(
            Limit::new("checks", Quota::per_minute(3))
                .when(|call| call.uri.path() == CHECK),
        )
        .headers(HeaderStyle::Both);
    serve_layer(layer.grpc()).await
}

#[tokio::test]
async fn a_limit_of_its_own_refuses_with_its_name_and_charges_nothing() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let tiers = post_plans(&clock).build();
    let mut client = serve_with_a_check_limit(tiers.clone(), &events).await;

    for remaining in [2, 1, 0] {
        let response = client.check(check(Some("key_bea"))).await.unwrap();
        let metadata = response.metadata();
        // The most constraining limit: 3 checks, not 100 a minute.
        assert_eq!(meta(metadata, "x-ratelimit-limit"), "3");
        assert_eq!(
            meta(metadata, "x-ratelimit-remaining"),
            remaining.to_string()
        );
        assert_eq!(
            meta(metadata, "ratelimit-policy"),
            r#""pro";q=100;w=60, "checks";q=3;w=60"#
        );
    }
    for _ in 0..3 {
        let status = client.check(check(Some("key_bea"))).await.unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        let quota = status.get_details_quota_failure().expect("QuotaFailure");
        assert_eq!(quota.violations[0].subject, "limit:checks");
        let retry = status.get_details_retry_info().expect("RetryInfo");
        assert_eq!(retry.retry_delay, Some(Duration::from_secs(20)));
        assert_eq!(meta(status.metadata(), "retry-after"), "20");
        assert_eq!(meta(status.metadata(), "x-ratelimit-limit"), "3");
        assert_eq!(
            meta(status.metadata(), "ratelimit"),
            r#""pro";r=97;t=2, "checks";r=0;t=20"#
        );
    }
    // All or nothing: the tier paid for the three checks that passed.
    assert_eq!(tiers.peek("key_bea", "pro").await.unwrap().remaining, 97);
    // A method the limit does not cover: the tier alone.
    let watch = call(
        HealthCheckRequest {
            service: String::new(),
        },
        Some("key_bea"),
    );
    let response = client.watch(watch).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-limit"), "100");
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "47");
    drop(response);
    assert!(events.lock().unwrap().iter().any(|event| matches!(
        event,
        LimitEvent::Limited {
            tier: "pro",
            limit: "checks",
            ..
        }
    )));
}

#[tokio::test]
async fn the_plans_refusal_beside_a_limit_names_the_tier() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(2))
        .build();
    let mut client = serve_with_a_check_limit(tiers.clone(), &events).await;
    let ana = || check(Some("key_ana"));
    client.check(ana()).await.unwrap();
    client.check(ana()).await.unwrap();
    let status = client.check(ana()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "tier:free");
    assert_eq!(meta(status.metadata(), "retry-after"), "30");
    // The checks limit was not charged for the refusal: 1 left.
    clock.advance(Duration::from_secs(30));
    let response = client.check(ana()).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "0");
    let status = client.check(ana()).await.unwrap_err();
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "tier:free");
}

/// An async identity lookup that always fails.
struct DatabaseDown;

#[async_trait::async_trait]
impl TierIdentifier for DatabaseDown {
    async fn identify(
        &self,
        _parts: &http::request::Parts,
    ) -> Result<Option<TierIdentity<'static>>, IdentityError> {
        Err(IdentityError::new(std::io::Error::other("database down")))
    }
}

#[tokio::test]
async fn a_failed_identity_lookup_is_unavailable() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let layer =
        layer(post_plans(&clock).build(), &events).identifier(DatabaseDown);
    let mut client = serve_layer(layer.grpc()).await;
    let status = client.check(check(Some("key_ana"))).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)));
    assert_eq!(meta(status.metadata(), "retry-after"), "1");
    assert!(
        events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, LimitEvent::IdentityFailed { .. }))
    );
}

/// During an outage, a cost above the instance's share of the burst is
/// transient: UNAVAILABLE, never FAILED_PRECONDITION.
#[tokio::test]
async fn a_cost_above_the_local_share_is_unavailable_not_failed_precondition() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let storage = FallbackStorage::builder(Arc::new(TimingOut::new("down")))
        .clock(clock.clone())
        .local_share(4)
        .build();
    // Pro, 100 a minute shared by 4: a local burst of 25, below Watch's 50.
    let tiers = post_plans(&clock).storage(Arc::new(storage)).build();
    let mut client = serve(tiers, &events).await;
    let watch = call(
        HealthCheckRequest {
            service: String::new(),
        },
        Some("key_bea"),
    );
    let status = client.watch(watch).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.get_details_precondition_failure().is_none());
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)));
    // A check is decided locally, and says which limit applies: 25.
    let response = client.check(check(Some("key_bea"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-limit"), "25");
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "24");
}

// ---------------------------------------------------------------------------
// A customer's own quota, on gRPC.

/// The tiers, with ada on pro under her own quota while `ada` holds one
/// (the tier's otherwise), and eva on free under a window of her own: a
/// quota of another kind than the tier's rate, a mistake.
fn own_quota_layer(
    tiers: RateTier,
    events: &Events,
    ada: Arc<Mutex<Option<Quota>>>,
) -> GrpcTierLimitLayer {
    let sink = events.clone();
    TierLimitLayer::new(tiers)
        .identifier_fn(move |metadata| {
            let key = metadata.get("x-api-key")?.to_str().ok()?;
            Some(match key {
                "key_ada" => {
                    let identity = TierIdentity::new(key.to_owned(), "pro");
                    match *ada.lock().unwrap() {
                        Some(own) => identity.with_quota("pro", own),
                        None => identity,
                    }
                }
                "key_eva" => TierIdentity::new(key.to_owned(), "free")
                    .with_quota(
                        "free",
                        Window::new(5, Duration::from_secs(60)).unwrap(),
                    ),
                _ => TierIdentity::new(key.to_owned(), plan_of(key)?),
            })
        })
        .on_event(move |event| sink.lock().unwrap().push(event.clone()))
        .grpc()
}

#[tokio::test]
async fn a_customers_own_quota_decides_on_grpc() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let ada = Arc::new(Mutex::new(Some(Quota::per_minute(5))));
    let layer = own_quota_layer(post_plans(&clock).build(), &events, ada);
    let mut client = serve_layer(layer).await;

    // Her own 5 a minute, not pro's 100.
    for remaining in (0..5).rev() {
        let response = client.check(check(Some("key_ada"))).await.unwrap();
        let metadata = response.metadata();
        assert_eq!(meta(metadata, "x-ratelimit-limit"), "5");
        assert_eq!(
            meta(metadata, "x-ratelimit-remaining"),
            remaining.to_string()
        );
    }
    let status = client.check(check(Some("key_ada"))).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let retry = status.get_details_retry_info().expect("RetryInfo");
    assert_eq!(retry.retry_delay, Some(Duration::from_secs(12)));
    // Labelled by the tier, never by the customer.
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "tier:pro");
    assert_eq!(meta(status.metadata(), "x-ratelimit-limit"), "5");
    // Bea, on the same tier, has the tier's 100.
    let response = client.check(check(Some("key_bea"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-limit"), "100");
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "99");
}

#[tokio::test]
async fn a_changed_own_quota_keeps_what_was_spent_on_grpc() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let ada = Arc::new(Mutex::new(None));
    let layer =
        own_quota_layer(post_plans(&clock).build(), &events, ada.clone());
    let mut client = serve_layer(layer).await;
    // 60 of pro's 100 a minute: 36 s of the minute spent (0.6 s each).
    for _ in 0..60 {
        client.check(check(Some("key_ada"))).await.unwrap();
    }
    // Her own 500 a minute (0.12 s each): 24 s left, 200 requests; this
    // one takes one of them.
    *ada.lock().unwrap() = Some(Quota::per_minute(500));
    let response = client.check(check(Some("key_ada"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-limit"), "500");
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "199");
    // Back to the tier: the same bucket, read with the tier's quota.
    *ada.lock().unwrap() = None;
    let response = client.check(check(Some("key_ada"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-limit"), "100");
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "38");
}

#[tokio::test]
async fn an_own_quota_of_the_wrong_kind_is_internal_on_grpc() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let tiers = post_plans(&clock).build();
    let layer = own_quota_layer(tiers.clone(), &events, Arc::default());
    let mut client = serve_layer(layer).await;
    // Refused every time, never unlimited, and nothing retries it.
    for _ in 0..12 {
        let status = client.check(check(Some("key_eva"))).await.unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{status:?}");
        assert_eq!(status.message(), "invalid customer quota");
        assert!(status.get_details_retry_info().is_none());
    }
    // Nothing was charged: her tier's bucket is full.
    assert_eq!(tiers.peek("key_eva", "free").await.unwrap().remaining, 10);
}
