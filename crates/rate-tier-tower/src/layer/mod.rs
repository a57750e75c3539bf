//! The Tower middleware: [`TierLimitLayer`] and its service [`TierLimit`].
//!
//! For each request the service finds the identity (header function or async
//! [`TierIdentifier`](crate::TierIdentifier)), the costs (the tier's
//! [`cost_fn`], or a [`tier_cost`] layer over it; each [`Limit`]'s), asks
//! the [`RateTier`](crate::RateTier) for one decision over the tier and every
//! limit that applies, and either calls the inner service, adding the
//! rate-limit headers to its response, or answers by itself without calling
//! it:
//!
//! | case | status | body |
//! |---|---|---|
//! | allowed | the inner service's | the inner service's |
//! | the tier's bucket empty | 429, `retry-after` rounded up | `{"error":"rate limit exceeded","tier":"free","retry_after":6}` |
//! | a limit's bucket empty | 429, the longest wait | `{"error":"rate limit exceeded","tier":"free","limit":"search","retry_after":20}` |
//! | cost above the burst | 403, no `retry-after`, store untouched | `{"error":"request cost exceeds the tier's burst",...}` |
//! | no identity, `OnMissing::Deny(s)` | `s` | `{"error":"identity required"}` |
//! | unknown tier, `OnUnknownTier::Deny` | 403 | `{"error":"unknown tier"}` |
//! | store failed, `OnStorageError::Deny(s)` | `s`, `retry-after: 1` | `{"error":"rate limiter unavailable"}` |
//! | identity lookup failed, `OnIdentityError::Deny(s)` | `s`, `retry-after: 1` | `{"error":"rate limiter unavailable"}` |
//! | cost function returned 0 | 500 | `{"error":"invalid request cost"}` |
//!
//! A refusal is a response, never an error: the inner service's error type
//! passes through untouched. The same service answers gRPC refusals as gRPC
//! statuses (`TierLimitLayer::grpc`, feature `grpc`).
//!
//! [`cost_fn`]: TierLimitLayer::cost_fn
//! [`Limit`]: crate::Limit

mod body;
mod config;
mod cost;
mod future;
#[cfg(feature = "grpc")]
mod grpc;
mod judge;
// tower-http's shape: `layer.rs` beside `service.rs`.
#[allow(clippy::module_inception)]
mod layer;
mod refusal;
mod response;
mod service;
mod settle;

pub use body::LimitBody;
pub use cost::{RouteCost, TierCost, TierCostLayer, tier_cost};
pub use future::ResponseFuture;
#[cfg(feature = "grpc")]
#[cfg_attr(docsrs, doc(cfg(feature = "grpc")))]
pub use grpc::{
    GrpcRefusal, GrpcTierLimit, GrpcTierLimitLayer, limited_status,
    limited_status_with,
};
pub use layer::TierLimitLayer;
pub use refusal::{HttpRefusal, Refusal, Refused};
pub use response::{
    HeaderStyle, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET, limited_response,
    limited_response_with,
};
pub use service::TierLimit;
