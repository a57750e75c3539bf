//! The Tower middleware: [`TierLimitLayer`] and its service [`TierLimit`].
//!
//! For each request the service finds the identity (header function or async
//! [`TierIdentifier`](crate::TierIdentifier)), the cost ([`cost_fn`], or a
//! [`tier_cost`] layer placed outside it), asks the [`RateTier`](crate::RateTier)
//! and either calls the inner service, adding the `x-ratelimit-*` headers to
//! its response, or answers by itself without calling it:
//!
//! | case | status | body |
//! |---|---|---|
//! | allowed | the inner service's | the inner service's |
//! | bucket empty | 429, `retry-after` rounded up | `{"error":"rate limit exceeded","tier":"free","retry_after":6}` |
//! | cost above the burst | 403, no `retry-after`, store untouched | `{"error":"request cost exceeds the tier's burst",...}` |
//! | no identity, `OnMissing::Deny(s)` | `s` | `{"error":"identity required"}` |
//! | unknown tier, `OnUnknownTier::Deny` | 403 | `{"error":"unknown tier"}` |
//! | store failed, `OnStorageError::Deny(s)` | `s`, `retry-after: 1` | `{"error":"rate limiter unavailable"}` |
//! | cost function returned 0 | 500 | `{"error":"invalid request cost"}` |
//!
//! A refusal is a response, never an error: the inner service's error type
//! passes through untouched.
//!
//! [`cost_fn`]: TierLimitLayer::cost_fn

mod cost;
#[cfg(feature = "grpc")]
mod grpc;
mod judge;
// tower-http's shape: `layer.rs` beside `service.rs`.
#[allow(clippy::module_inception)]
mod layer;
mod response;
mod service;

pub use cost::{RouteCost, TierCost, TierCostLayer, tier_cost};
#[cfg(feature = "grpc")]
pub use grpc::{
    GrpcTierLimit, GrpcTierLimitLayer, limited_status, limited_status_with,
};
pub use layer::TierLimitLayer;
pub use response::{
    HeaderStyle, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET, limited_response,
    limited_response_with,
};
pub use service::TierLimit;
