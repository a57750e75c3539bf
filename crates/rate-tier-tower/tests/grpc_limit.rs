//! The gRPC layer on a real tonic server over loopback, called by a real
//! tonic client: the standard health service (tonic-health, no codegen)
//! with the example server's plans (free 10/min, pro 100/min, default free,
//! UNAUTHENTICATED without a key) on a fake clock: exact numbers, no sleep.
//!
//! `Check` costs 1 and `Watch` 50 here: more than the free plan's burst,
//! less than pro's.
#![cfg(feature = "grpc")]
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
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
    LimitEvent, OnMissing, OnStorageError, OnUnknownTier, Quota, RateTier,
    RateTierBuilder, Storage, StorageError, TierIdentity, TierLimitLayer,
};

/// 2026-10-02 13:17:14.25 UTC: a quarter second past a whole second, so that
/// every `x-ratelimit-reset` has to be rounded up.
const START_US: u64 = 1_790_947_094_250_000;
const START_SECS: u64 = 1_790_947_094;

const WATCH: &str = "/grpc.health.v1.Health/Watch";

fn plan_of(api_key: &str) -> Option<&'static str> {
    match api_key {
        "key_ana" => Some("free"),
        "key_bea" => Some("pro"),
        "key_eva" => Some("gold"), // a plan the limiter does not know
        _ => None,
    }
}

fn plans(clock: &FakeClock) -> RateTierBuilder {
    RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
}

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
    let sink = events.clone();
    let layer = TierLimitLayer::new(tiers)
        .headers(headers)
        .identifier_fn(|metadata| {
            let key = metadata.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        })
        .cost_fn(|call| match call.uri.path() {
            WATCH => 50,
            _ => 1,
        })
        .on_event(move |event| sink.lock().unwrap().push(event.clone()))
        .grpc();
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
    let mut client = serve(plans(&clock).build(), &events).await;

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
        LimitEvent::Limited { user_id, tier, cost: 1, .. }
            if user_id == "key_ana" && tier == "free"
    )));

    // Another plan, another bucket.
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
    let mut client = serve(plans(&clock).build(), &events).await;

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
    let mut client = serve(plans(&clock).build(), &events).await;

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
    let mut client = serve(plans(&clock).build(), &events).await;

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
    let mut client = serve(plans(&clock).build(), &events).await;

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
    let tiers = plans(&clock).on_unknown_tier(OnUnknownTier::Deny).build();
    let mut client = serve(tiers, &events).await;

    let status = client.check(check(Some("key_eva"))).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert_eq!(status.message(), "unknown tier");
    assert!(status.get_details_retry_info().is_none());

    // With the default policy, the default plan's quota in her own bucket.
    let tiers = plans(&clock).build();
    let mut client = serve(tiers, &events).await;
    let response = client.check(check(Some("key_eva"))).await.unwrap();
    assert_eq!(meta(response.metadata(), "x-ratelimit-remaining"), "9");
}

/// A store that always times out.
#[derive(Debug)]
struct FailingStorage {
    calls: AtomicUsize,
}

#[async_trait::async_trait]
impl Storage for FailingStorage {
    async fn check(
        &self,
        _check: &rate_tier_storage::BucketCheck<'_>,
    ) -> Result<rate_tier_storage::Decision, StorageError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(StorageError::Timeout(Duration::from_millis(100)))
    }

    fn kind(&self) -> &'static str {
        "failing"
    }
}

#[tokio::test]
async fn a_failing_store_is_unavailable_with_a_one_second_retry() {
    let clock = FakeClock::at_us(START_US);
    let events = Events::default();
    let storage = Arc::new(FailingStorage {
        calls: AtomicUsize::new(0),
    });
    let tiers = plans(&clock)
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
    assert_eq!(storage.calls.load(Ordering::SeqCst), 1);

    // Fail open: the inner service answers, unlimited.
    let tiers = plans(&clock)
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
    let mut client = serve(plans(&clock).build(), &events).await;
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
        serve_with(plans(&clock).build(), &events, HeaderStyle::Ietf).await;

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
