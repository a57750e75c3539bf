//! The RLS client ([`RlsStorage`]) against the service over real sockets:
//! as a store, under a Tower layer in an axum server, and inside a
//! `FallbackStorage` when the service is unreachable.

mod support;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use gcra_core::{Decision, Quota};
use rate_tier_service::client::RlsStorage;
use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    BreakerState, BucketCheck, FallbackStorage, LimitName,
};
use support::*;
use tower_rate_tier::{Limit, RateTier, TierIdentity, TierLimitLayer};

/// A service whose config knows the domain `api` and nothing else: the
/// client sends each quota as a `limit` override.
async fn service() -> Svc {
    Svc::start(&Backend::Memory, "  []\n", |_| {}).await
}

fn rls(svc: &Svc) -> RlsStorage {
    RlsStorage::connect_lazy(&format!("http://{}", svc.grpc()), &svc.domain)
        .expect("a valid URI")
        .timeout(TEST_TIMEOUT)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_storage_decides_through_the_service() {
    let svc = service().await;
    let store = rls(&svc);
    let free = LimitName::new("free").expect("name");
    let search = LimitName::new("search").expect("name");
    let mut out = [Decision::default()];

    for remaining in [2, 1, 0] {
        let check = [BucketCheck::new(&free, "ana", Quota::per_minute(3), 1)
            .expect("check")];
        let decided = store.check(&check, &mut out).await.expect("a decision");
        assert!(decided.verdict.allowed);
        assert_eq!(decided.by, "rls");
        assert_eq!(out[0].remaining, remaining);
    }
    let check =
        [BucketCheck::new(&free, "ana", Quota::per_minute(3), 1)
            .expect("check")];
    let refused = store.check(&check, &mut out).await.expect("a decision");
    assert!(!refused.verdict.allowed);
    assert_eq!(refused.verdict.refused_by, Some(0));
    // 3 per minute: the next one in 20 s (the service's reset, 60 s, less
    // the room of two more).
    assert_eq!(refused.verdict.retry_after_us, 20_000_000);

    // A peek charges nothing.
    let peek = [BucketCheck::peek(&free, "bea", Quota::per_minute(3))];
    store.check(&peek, &mut out).await.expect("a decision");
    store.check(&peek, &mut out).await.expect("a decision");
    assert_eq!(out[0].remaining, 3);

    // Several checks are one decision on this service: all or nothing.
    let mut two = [Decision::default(); 2];
    let both = |cost| {
        [
            BucketCheck::new(&free, "eva", Quota::per_minute(10), cost)
                .expect("check"),
            BucketCheck::new(&search, "eva", Quota::per_minute(1), 1)
                .expect("check"),
        ]
    };
    assert!(
        store
            .check(&both(1), &mut two)
            .await
            .expect("ok")
            .verdict
            .allowed
    );
    let refused = store.check(&both(1), &mut two).await.expect("ok");
    assert_eq!(refused.verdict.refused_by, Some(1));
    assert_eq!(two[0].remaining, 9, "the plan was not charged");

    // The partition is sent hashed: the service never sees `ana`.
    let descriptor = store.descriptor(&check[0]);
    assert_eq!(descriptor.entries[1].key, "partition");
    use sha1::Digest;
    assert_eq!(
        descriptor.entries[1].value,
        hex::encode(sha1::Sha1::digest(b"ana"))
    );
    assert!(
        store.settle(&[]).await.is_err(),
        "settle cannot be expressed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tower_layer_limits_through_the_service() {
    let svc = service().await;
    let store = FallbackStorage::builder(Arc::new(rls(&svc))).build();
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(3))
        .storage(Arc::new(store))
        .build();
    let layer = TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            headers
                .get("x-api-key")
                .and_then(|k| k.to_str().ok())
                .map(|key| TierIdentity::new(key, "free"))
        })
        .limit(
            Limit::new("search", Quota::per_minute(1))
                .when(|req| req.uri.path() == "/search"),
        );
    let app = Router::new()
        .route("/data", get(|| async { "data\n" }))
        .route("/search", get(|| async { "search\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let get = |path: &'static str| async move {
        http_with(addr, "GET", path, &[("x-api-key", "key_ana")], b"").await
    };
    let first = get("/search").await;
    assert_eq!(first.status, 200, "{first:?}");
    assert!(
        first.headers.contains("x-ratelimit-remaining: 0"),
        "{first:?}"
    );
    let second = get("/search").await;
    assert_eq!(
        second.status, 429,
        "the search limit, decided by the service"
    );
    assert!(second.body.contains("\"limit\":\"search\""), "{second:?}");
    // The refused search did not charge the tier: 2 of 3 are left.
    assert_eq!(get("/data").await.status, 200);
    assert_eq!(get("/data").await.status, 200);
    let third = get("/data").await;
    assert_eq!(third.status, 429, "{third:?}");
    assert!(third.headers.contains("retry-after: 20"), "{third:?}");
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_limits_while_the_service_is_unreachable() {
    let port = rate_tier_test_support::free_port();
    let rls =
        RlsStorage::connect_lazy(&format!("http://127.0.0.1:{port}"), "api")
            .expect("URI")
            .timeout(Duration::from_millis(200));
    let store = FallbackStorage::builder(Arc::new(rls))
        .failure_threshold(1)
        .cool_down(Duration::from_secs(60), Duration::from_secs(60))
        .build();
    let free = LimitName::new("free").expect("name");
    let mut out = [Decision::default()];
    let check =
        [BucketCheck::new(&free, "ana", Quota::per_minute(2), 1)
            .expect("check")];
    let decided = store
        .check(&check, &mut out)
        .await
        .expect("decided locally");
    assert_eq!(decided.by, "fallback");
    assert!(decided.verdict.allowed);
    assert_eq!(store.state(), BreakerState::Open);
    // Open: local at once, the same limit.
    let started = Instant::now();
    assert!(
        store
            .check(&check, &mut out)
            .await
            .expect("local")
            .verdict
            .allowed
    );
    assert!(
        !store
            .check(&check, &mut out)
            .await
            .expect("local")
            .verdict
            .allowed
    );
    assert!(
        started.elapsed() < Duration::from_millis(150),
        "no call to the service"
    );
}

/// Regression: the shadow checks must not be charged when the enforced call
/// refuses, and a failure of their call, after the enforced call charged,
/// must not fail the decision (a fallback would charge it again locally).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_checks_follow_the_decision_and_never_fail_it() {
    let svc = service().await;
    let store = rls(&svc);
    let (plan, search) = (
        LimitName::new("free").expect("name"),
        LimitName::new("search").expect("name"),
    );
    let both = [
        BucketCheck::new(&plan, "ana", Quota::per_minute(1), 1).expect("check"),
        BucketCheck::new(&search, "ana", Quota::per_minute(3), 1)
            .expect("check")
            .shadow(true),
    ];
    let mut out = [Decision::default(); 2];
    assert!(store.check(&both, &mut out).await.unwrap().verdict.allowed);
    assert_eq!(out[1].remaining, 2, "passed: the shadow limit is charged");
    let refused = store.check(&both, &mut out).await.unwrap();
    assert!(!refused.verdict.allowed);
    assert!(out[1].allowed, "it would have passed");
    let peek = [BucketCheck::peek(&search, "ana", Quota::per_minute(3))];
    let mut one = [Decision::default()];
    store.check(&peek, &mut one).await.unwrap();
    assert_eq!(
        one[0].remaining, 2,
        "a refused decision charged a shadow limit"
    );

    // A server whose answer to a shadow check fails.
    let fake = failing_shadow_server().await;
    let store = RlsStorage::connect_lazy(&format!("http://{fake}"), "api")
        .expect("URI")
        .timeout(TEST_TIMEOUT);
    let decided = store.check(&both, &mut out).await.expect("a decision");
    assert!(decided.verdict.allowed);
    assert!(out[1].allowed, "its part says it passed, state unknown");
}

/// An RLS server that answers OK to every descriptor, and UNAVAILABLE to a
/// call with a descriptor of the limit `search`.
async fn failing_shadow_server() -> std::net::SocketAddr {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        Code, DescriptorStatus,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
        RateLimitService, RateLimitServiceServer,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::{
        RateLimitRequest, RateLimitResponse,
    };

    struct Fake;
    #[tonic::async_trait]
    impl RateLimitService for Fake {
        async fn should_rate_limit(
            &self,
            request: tonic::Request<RateLimitRequest>,
        ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
            let request = request.into_inner();
            if request
                .descriptors
                .iter()
                .any(|d| d.entries.iter().any(|e| e.value == "search"))
            {
                return Err(tonic::Status::unavailable("down for shadows"));
            }
            Ok(tonic::Response::new(RateLimitResponse {
                overall_code: Code::Ok as i32,
                statuses: request
                    .descriptors
                    .iter()
                    .map(|_| DescriptorStatus {
                        code: Code::Ok as i32,
                        ..DescriptorStatus::default()
                    })
                    .collect(),
                ..RateLimitResponse::default()
            }))
        }
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(Fake))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(
                listener,
            )),
    );
    addr
}
