//! Plan-aware rate limiting for Tower services.
//!
//! A request is identified (API key, token, database lookup), mapped to a
//! plan ("tier"), charged a cost, and checked against that tier's quota
//! with GCRA. State lives in memory for one instance, or in Redis so that
//! every instance shares one limit.
//!
//! ```
//! use axum::{Router, routing::get};
//! use http::StatusCode;
//! use tower_rate_tier::{LimitEvent, OnMissing, Quota, RateTier, TierIdentity, TierLimitLayer};
//!
//! fn plan_of(api_key: &str) -> Option<&'static str> {
//!     match api_key {
//!         "key_ana" => Some("free"),
//!         "key_bea" => Some("pro"),
//!         _ => None,
//!     }
//! }
//!
//! let tiers = RateTier::builder()
//!     .tier("free", Quota::per_minute(10))
//!     .tier("pro", Quota::per_minute(100))
//!     .default_tier("free")
//!     .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
//!     .build();
//!
//! let layer = TierLimitLayer::new(tiers)
//!     .identifier_fn(|headers| {
//!         let key = headers.get("x-api-key")?.to_str().ok()?;
//!         Some(TierIdentity::new(key, plan_of(key)?))
//!     })
//!     .cost_fn(|req| match req.uri.path() {
//!         "/report" => 5,
//!         _ => 1,
//!     })
//!     .on_event(|event| {
//!         if let LimitEvent::UnknownTier { user_id, tier, .. } = event {
//!             eprintln!("unknown tier {tier:?} for {user_id}");
//!         }
//!     });
//!
//! let app: Router = Router::new()
//!     .route("/data", get(|| async { "data\n" }))
//!     .route("/report", get(|| async { "report\n" }))
//!     .layer(layer);
//! ```
//!
//! The layer works with any Tower service over `http` whose response body
//! can be built from a `String`: axum, hyper (`Full<Bytes>`), and others.
//! Without axum, with hyper's body type:
//!
//! ```
//! use http::{Request, Response};
//! use http_body_util::Full;
//! use hyper::body::Bytes;
//! use tower::{Layer, ServiceExt, service_fn};
//! use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(1)).build();
//! let layer = TierLimitLayer::new(tiers)
//!     .identifier_fn(|_| Some(TierIdentity::new("ana", "free")));
//! let service = layer.layer(service_fn(|_req: Request<()>| async {
//!     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from("hi"))))
//! }));
//!
//! let first = service.clone().oneshot(Request::new(())).await.unwrap();
//! assert_eq!(first.headers()["x-ratelimit-remaining"], "0");
//! let second = service.oneshot(Request::new(())).await.unwrap();
//! assert_eq!(second.status(), 429);
//! # }
//! ```
//!
//! # Safe defaults
//!
//! - An unknown tier never means unlimited: with a default tier, the default
//!   quota in the user's own bucket and a [`LimitEvent::UnknownTier`] per
//!   request; without one, 403. [`OnUnknownTier`] chooses explicitly.
//! - A request that can never pass (cost above the burst) gets 403, not 429,
//!   and does not touch the store.
//! - No identity: [`OnMissing`]; a store failure: [`OnStorageError`]
//!   (fail closed with 503 unless you choose otherwise).
//! - User ids never reach a shared store in clear: keys hold their SHA-1,
//!   or an HMAC with [`RateTierBuilder::key_secret`].
//! - `Retry-After` is rounded up: a client that waits what it is told passes.
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `redis` | `RedisStorage`: one limit shared by every instance through Redis |
//! | `identity-cache` | [`CachedIdentifier`]: caches async identity lookups with moka |
//! | `metrics` | [`metrics::RateLimitMetrics`]: Prometheus metrics (prometheus-client) for checks, latency, storage errors, fallback and breaker |
//! | `tracing` | `tracing` events (and a `DEBUG` span) on the decision path; next to free when no subscriber listens |
//! | `grpc` | [`GrpcTierLimitLayer`]: the layer for tonic gRPC servers; refusals are `RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo` |
//! | `plans-toml` | [`PlansBuilder::from_toml`]: plans from a TOML file, for hot reload |
#![warn(clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

#[cfg(feature = "identity-cache")]
mod cache;
mod event;
mod identity;
pub mod layer;
#[cfg(feature = "metrics")]
pub mod metrics;
mod observe;
mod plans;
mod tier;

/// Time sources: fast monotonic (the default), wall, and [`FakeClock`](clock::FakeClock) for tests.
pub mod clock {
    pub use rate_tier_storage::clock::*;
}

#[cfg(feature = "identity-cache")]
pub use cache::CachedIdentifier;
pub use event::LimitEvent;
pub use gcra_core::{Quota, QuotaError};
pub use identity::{TierIdentifier, TierIdentity};
#[cfg(feature = "grpc")]
pub use layer::{GrpcTierLimit, GrpcTierLimitLayer};
pub use layer::{TierLimit, TierLimitLayer, tier_cost};
pub use observe::{Checked, Observer, Outcome};
#[cfg(feature = "plans-toml")]
pub use plans::PlansError;
pub use plans::{Plans, PlansBuilder};
#[cfg(feature = "redis")]
pub use rate_tier_storage::RedisStorage;
pub use rate_tier_storage::fallback::{self, BreakerState};
pub use rate_tier_storage::{
    FallbackStorage, MemoryStorage, Storage, StorageError, StorageEvent, key,
};
pub use tier::{
    CheckFuture, ConfigError, Error, LimitReason, Limited, OnMissing,
    OnStorageError, OnUnknownTier, RateLimitInfo, RateTier, RateTierBuilder,
};
