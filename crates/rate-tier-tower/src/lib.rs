//! Tier-aware rate limiting for Tower services.
//!
//! A request is identified (API key, token, database lookup), mapped to a
//! tier ("tier"), charged a cost, and checked against that tier's quota
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
//! # Several limits, one decision
//!
//! A request's limits are its tier's and any [`Limit`]s of its own (per
//! endpoint, per address, per tenant, global), decided as one: every bucket
//! is charged or none is, so a refused request charges nothing, and the
//! refusal names the limit (`"limit":"search"` beside `"tier"`). A limit can
//! be in shadow mode (decided, counted, never refusing), peeked (read, not
//! charged: [`TierLimitLayer::peek_when`], [`RateTier::peek`]) and settled
//! (an estimate charged up front, the actual cost read from the response:
//! [`Settle`]).
//!
//! # Safe defaults
//!
//! - An unknown tier never means unlimited: with a default tier, the default
//!   quota in the user's own bucket and a [`LimitEvent::UnknownTier`] per
//!   request; without one, 403. [`OnUnknownTier`](crate::policy::OnUnknownTier) chooses explicitly.
//! - A request that can never pass (cost above a burst) gets 403, not 429,
//!   and does not touch the store.
//! - No identity: [`OnMissing`]; a failed identity lookup:
//!   [`OnIdentityError`](crate::policy::OnIdentityError); a store failure: [`OnStorageError`](crate::policy::OnStorageError) (both fail
//!   closed with 503 and `retry-after` unless you choose otherwise: a
//!   transient failure is never answered as a permanent refusal).
//! - User ids never reach a shared store in clear (keys hold their SHA-1,
//!   or an HMAC with [`RateTierBuilder::key_secret`]), nor a log: events
//!   carry them as [`UserId`]s, whose `Debug` is a keyed tag.
//! - `Retry-After` is rounded up: a client that waits what it is told passes.
//!
//! # A store of your own
//!
//! Every type a custom [`Storage`] needs is in [`storage`]: the contract,
//! its arguments ([`storage::BucketCheck`], [`storage::BucketSettle`]) and
//! answers ([`storage::Answer`], [`storage::Decided`]), and
//! [`storage::cells`], where two methods over a compare-and-swap store get
//! every kind of limit.
//!
//! # Feature flags
//!
//! | feature | enables |
//! |---|---|
//! | `redis` | `RedisStorage`: one limit shared by every instance through Redis or a Redis Cluster; the `redis` crate it takes connections of, re-exported |
//! | `postgres` | `PostgresStorage`: one limit shared by every instance through PostgreSQL, for services without Redis |
//! | `identity-cache` | `CachedIdentifier`: caches async identity lookups with moka |
//! | `metrics` | `metrics::RateLimitMetrics`: Prometheus metrics (prometheus-client) for checks, latency, storage errors, fallback, breakers, evictions, shadow refusals |
//! | `metrics-facade` | `observe::FacadeMetrics`: the same metrics through the `metrics` facade, to whatever recorder the application installed |
//! | `opentelemetry` | `observe::OtelMetrics`: the same metrics as OpenTelemetry instruments of a `Meter` |
//! | `tracing` | `tracing` events on the decision path; next to free when no subscriber listens |
//! | `grpc` | `GrpcTierLimitLayer`: the layer for tonic gRPC servers; refusals are `RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo` |
//! | `tiers-toml` | `TiersBuilder::from_toml`: tiers from a TOML file, for hot reload |
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod ban;
#[cfg(feature = "identity-cache")]
mod cache;
pub mod client_ip;
mod error;
mod event;
/// The future of [`RateTier::check`] and [`RateTier::decide`].
pub mod future {
    pub use crate::limiter::CheckFuture;
}
#[cfg(feature = "metrics-facade")]
mod facade;
pub mod headers;
mod identity;
pub mod layer;
mod limit;
mod limiter;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
pub mod observe;
#[cfg(feature = "opentelemetry")]
mod otel;
mod outcome;
pub mod policy;
#[cfg(any(
    feature = "metrics",
    feature = "metrics-facade",
    feature = "opentelemetry"
))]
#[cfg_attr(
    not(any(feature = "metrics-facade", feature = "opentelemetry")),
    allow(dead_code)
)]
mod recorded;
pub mod shape;
/// One tier checked without a future: [`RateTier::sync_tier`].
pub mod sync {
    pub use crate::limiter::{SyncAnswer, SyncTier};
}
mod tiers;

/// Time sources: fast monotonic (the default), wall, and [`FakeClock`](clock::FakeClock) for tests.
pub mod clock {
    pub use rate_tier_storage::clock::*;
}

/// The rules a limit can have, and their errors: [`Quota`] (a
/// rate), [`Window`], [`Period`],
/// [`Concurrency`], as one [`Rule`](crate::rules::Rule).
pub mod rules {
    pub use gcra_core::{
        Adjust, Concurrency, ConcurrencyError, Period, PeriodError, PeriodUnit,
        Quota, QuotaError, Window, WindowError,
    };
    pub use rate_tier_storage::{Rule, RuleKind};
}

/// What a store of your own needs: the [`Storage`]
/// contract, its arguments and answers, and the stores' events.
pub mod storage {
    pub use gcra_core::{Decision, Verdict};
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub use rate_tier_storage::PostgresStorageBuilder;
    pub use rate_tier_storage::cells;
    pub use rate_tier_storage::fallback::{self, BreakerState};
    pub use rate_tier_storage::{
        Adjustment, Answer, BucketCancel, BucketCheck, BucketSettle,
        Capabilities, Charged, Decided, LimitName, Mode, Storage, StorageError,
        StorageEvent, StorageExt, StorageListener, Subscription, key,
    };
    /// The `redis` crate that [`RedisStorage`](crate::RedisStorage) is built on: its connections
    /// (`redis::aio::ConnectionManager`, `redis::cluster_async::ClusterConnection`)
    /// without matching its version by hand.
    ///
    /// ```no_run
    /// use tower_rate_tier::{RateTier, Quota, RedisStorage, storage::redis};
    /// use std::sync::Arc;
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1/")?;
    /// let conn = redis::aio::ConnectionManager::new(client).await?;
    /// let limiter = RateTier::builder()
    ///     .tier("free", Quota::per_minute(10))
    ///     .storage(Arc::new(RedisStorage::new(conn)))
    ///     .build();
    /// # let _ = limiter; Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    #[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
    pub use redis;
}

pub use ban::Ban;
#[cfg(feature = "identity-cache")]
#[cfg_attr(docsrs, doc(cfg(feature = "identity-cache")))]
pub use cache::CachedIdentifier;
pub use error::{ConfigError, Error};
pub use event::LimitEvent;
pub use gcra_core::{Concurrency, Period, PeriodUnit, Quota, Window};
pub use identity::{
    IdentityError, OwnQuota, TierIdentifier, TierIdentity, UserId,
};
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub use layer::GrpcTierLimitLayer;
pub use layer::{TierLimitLayer, tier_cost};
pub use limit::{ActualCost, Limit, Settle, Usage};
pub use limiter::{LimitRequest, RateTier, RateTierBuilder};
pub use observe::Observer;
pub use outcome::{Admitted, LimitReason, Limited, RateLimitInfo};
pub use policy::OnMissing;
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use rate_tier_storage::PostgresStorage;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use rate_tier_storage::RedisStorage;
pub use rate_tier_storage::{
    FallbackStorage, MemoryStorage, Storage, StorageError,
};
#[cfg(feature = "tiers-toml")]
#[cfg_attr(docsrs, doc(cfg(feature = "tiers-toml")))]
pub use tiers::TiersError;
pub use tiers::{Tiers, TiersBuilder};

// The README's examples, run as doctests so that they never drift.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
