//! Axum glue for [tower-rate-tier](tower_rate_tier).
//!
//! - [`RateLimit`]: an extractor for the [`RateLimitInfo`] of the current
//!   request (what the limiter decided, e.g. the remaining quota).
//! - [`LimitRejection`]: a refusal as an axum response, for handlers that
//!   call [`RateTier::check`](tower_rate_tier::RateTier::check) themselves
//!   (429 with `retry-after`, or 403 when no wait helps).
//! - [`api_key`]: the common identity rule, "this header holds an API key,
//!   this function gives its tier", as one line.
//! - [`CONNECT_INFO`]: the connection's peer address for a limit per
//!   address ([`Limit::per_client_ip`](tower_rate_tier::Limit::per_client_ip))
//!   when no proxy stands in front of the service.
//! - [`status`]: a status page for the limiter, as a `Router` to mount
//!   behind the app's own authentication: each tier's allowed and refused
//!   checks over the last hour, the refusals per limit, the users nearest
//!   their limit, the store and the reloads of the tiers.
//!
//! ```
//! use axum::{Router, routing::get};
//! use rate_tier_axum::{RateLimit, api_key};
//! use tower_rate_tier::{Quota, RateTier, TierLimitLayer};
//!
//! fn plan_of(key: &str) -> Option<&'static str> {
//!     (key == "key_ana").then_some("free")
//! }
//!
//! async fn data(RateLimit(info): RateLimit) -> String {
//!     format!("data ({} left)\n", info.remaining)
//! }
//!
//! let tiers = RateTier::builder().tier("free", Quota::per_minute(10)).build();
//! let app: Router = Router::new()
//!     .route("/data", get(data))
//!     .layer(TierLimitLayer::new(tiers).identifier_fn(api_key("x-api-key", plan_of)));
//! ```
//!
//! Per-route cost: give the cost in
//! [`TierLimitLayer::cost_fn`](tower_rate_tier::TierLimitLayer::cost_fn),
//! or wrap a per-route limiter with
//! [`tier_cost`](tower_rate_tier::tier_cost), which only wraps a limiter
//! (anywhere else it does not compile) and is that limiter's alone: a
//! limiter nested inside charges its own cost.
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

use std::borrow::Cow;

pub mod status;

use axum::extract::{ConnectInfo, FromRequestParts, OptionalFromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tower_rate_tier::layer::limited_response;
use tower_rate_tier::{LimitReason, Limited, RateLimitInfo, TierIdentity};

/// Extracts the [`RateLimitInfo`] the limiter put on the request.
///
/// Rejects with [`MissingRateLimit`] (500) when the route is not behind a
/// [`TierLimitLayer`](tower_rate_tier::TierLimitLayer), or when the request
/// passed unchecked by an explicit policy (`OnUnknownTier::Allow`,
/// `OnStorageError::Allow`); use `Option<RateLimit>` to accept those.
#[derive(Debug, Clone)]
pub struct RateLimit(pub RateLimitInfo);

/// The rejection of [`RateLimit`]: no limit information on the request.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct MissingRateLimit;

impl MissingRateLimit {
    /// 500: a route expecting a limiter has none, a server bug.
    pub fn status(&self) -> StatusCode {
        StatusCode::INTERNAL_SERVER_ERROR
    }

    /// The response text.
    pub fn body_text(&self) -> &'static str {
        "no rate limit information: is this route behind TierLimitLayer?"
    }
}

impl IntoResponse for MissingRateLimit {
    fn into_response(self) -> Response {
        (self.status(), self.body_text()).into_response()
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RateLimit {
    type Rejection = MissingRateLimit;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<RateLimitInfo>()
            .cloned()
            .map(RateLimit)
            .ok_or(MissingRateLimit)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for RateLimit {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<RateLimitInfo>()
            .cloned()
            .map(RateLimit))
    }
}

/// A refusal from [`RateTier::check`](tower_rate_tier::RateTier::check), as
/// the same response the layer would give.
///
/// ```
/// use axum::response::IntoResponse;
/// use rate_tier_axum::LimitRejection;
/// use tower_rate_tier::{Quota, RateTier};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = RateTier::builder().tier("free", Quota::per_minute(1)).build();
/// limiter.check("ana", "free", 1).await.unwrap().unwrap();
/// let limited = limiter.check("ana", "free", 1).await.unwrap().unwrap_err();
/// let response = LimitRejection::from(limited).into_response();
/// assert_eq!(response.status(), 429);
/// assert_eq!(response.headers()["retry-after"], "60");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct LimitRejection(pub Limited);

impl From<Limited> for LimitRejection {
    fn from(limited: Limited) -> Self {
        LimitRejection(limited)
    }
}

impl LimitRejection {
    /// 429 when waiting helps, 403 when it never will.
    pub fn status(&self) -> StatusCode {
        match self.0.reason() {
            LimitReason::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::FORBIDDEN,
        }
    }
}

impl IntoResponse for LimitRejection {
    fn into_response(self) -> Response {
        limited_response(&self.0)
    }
}

/// An identity rule for `TierLimitLayer::identifier_fn`: the API key is in
/// `header`, and `plan_of` gives its tier (`None`: no identity).
///
/// A value that is not visible ASCII counts as no key.
///
/// ```
/// use axum::http::HeaderMap;
/// use rate_tier_axum::api_key;
///
/// let identify = api_key("x-api-key", |key| (key == "key_bea").then_some("pro"));
/// let mut headers = HeaderMap::new();
/// assert_eq!(identify(&headers), None);
/// headers.insert("x-api-key", "key_bea".parse().unwrap());
/// let who = identify(&headers).unwrap();
/// assert_eq!((who.user(), who.tier()), ("key_bea", "pro"));
/// ```
pub fn api_key<F, T>(
    header: &'static str,
    plan_of: F,
) -> impl Fn(&HeaderMap) -> Option<TierIdentity<'_>> + Send + Sync + 'static
where
    F: Fn(&str) -> Option<T> + Send + Sync + 'static,
    T: Into<Cow<'static, str>>,
{
    move |headers| {
        let key = headers.get(header)?.to_str().ok()?;
        let plan: Cow<'static, str> = plan_of(key)?.into();
        Some(TierIdentity::new(key, plan))
    }
}

/// The connection's peer, from axum's `ConnectInfo<SocketAddr>` (serve the
/// app with `into_make_service_with_connect_info::<SocketAddr>()`): the
/// client address for a limit per address when the service faces clients
/// directly. Behind a proxy, every request's peer is the proxy: read the
/// address it writes instead (see [`tower_rate_tier::client_ip`]). An app
/// served without it has no address to read: each request of a limit per
/// address is then answered 500, naming the fix in
/// [`LimitEvent::NoClientAddress`](tower_rate_tier::LimitEvent::NoClientAddress).
///
/// ```
/// use std::net::SocketAddr;
/// use axum::extract::ConnectInfo;
/// use axum::http::Request;
/// use rate_tier_axum::CONNECT_INFO;
///
/// let (mut parts, ()) = Request::get("/").body(()).unwrap().into_parts();
/// parts.extensions.insert(ConnectInfo("203.0.113.7:41000".parse::<SocketAddr>().unwrap()));
/// assert_eq!(CONNECT_INFO.partition(&parts), "203.0.113.7");
/// ```
pub const CONNECT_INFO: tower_rate_tier::client_ip::ClientIp =
    tower_rate_tier::client_ip::ClientIp::from_connection(
        "axum ConnectInfo",
        |parts| {
            parts
                .extensions
                .get::<ConnectInfo<std::net::SocketAddr>>()
                .map(|ConnectInfo(peer)| peer.ip())
        },
    );

// The README's examples, run as doctests so that they never drift.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The project README's programs, compiled (and the ones that need no
// server run) as doctests: a new app built from it compiles.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ProjectReadmeDoctests;
