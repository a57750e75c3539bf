//! The layer over a FallbackStorage whose primary is down: the local share.
#![allow(clippy::unwrap_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::{Router, routing::get};
use http::Request;
use tower::ServiceExt;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{
    FallbackStorage, Quota, RateTier, Storage, StorageError, TierIdentity,
    TierLimitLayer,
};

#[derive(Debug)]
struct Down;

#[async_trait::async_trait]
impl Storage for Down {
    async fn check(
        &self,
        _: &rate_tier_storage::BucketCheck<'_>,
    ) -> Result<gcra_core::Decision, StorageError> {
        Err(StorageError::Timeout(Duration::from_millis(100)))
    }
}

#[tokio::test]
async fn a_cost_above_the_local_share_is_403_not_500() {
    let clock = FakeClock::new();
    let storage = FallbackStorage::builder(Arc::new(Down))
        .clock(clock.clone())
        .local_share(2)
        .build();
    let tiers = RateTier::builder()
        .clock(clock)
        .tier("free", Quota::per_minute(10))
        .storage(Arc::new(storage))
        .build();
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        TierLimitLayer::new(tiers)
            .identifier_fn(|_| Some(TierIdentity::new("ana", "free")))
            .cost_fn(|req| if req.uri.path() == "/" { 6 } else { 1 }),
    );
    let response = app
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    // 10 per minute shared by 2 instances: a local burst of 5.
    assert_eq!(response.status(), 403);
    assert!(response.headers().get("retry-after").is_none());
    assert_eq!(response.headers()["x-ratelimit-limit"], "5");
}
