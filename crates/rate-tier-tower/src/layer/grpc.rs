//! The layer for gRPC (tonic) servers: [`GrpcTierLimitLayer`].

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{Request, Response, StatusCode};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};
use tower_layer::Layer;
use tower_service::Service;

use super::layer::Config;
use super::response;
use super::service::{BoxFuture, limit_then_call};
use super::{HeaderStyle, TierLimitLayer};
use crate::tier::Verdict;
use crate::{LimitReason, Limited, RateTier};

/// [`TierLimitLayer`] for gRPC servers: refusals are `tonic::Status`es
/// (`RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo`, ...) instead of HTTP
/// error responses.
///
/// Made with [`TierLimitLayer::grpc`]. Cheap to clone; clones share the
/// limiter's state.
///
/// It decides exactly as the [`TierLimitLayer`] it was made from (identity,
/// cost, tiers, events, observer, header style). Only the answer differs: a
/// refused call gets a trailers-only gRPC response (HTTP 200, `grpc-status`, `grpc-message`,
/// `grpc-status-details-bin`), which every gRPC client reads as a `Status`.
///
/// | case | gRPC code | details (`google.rpc.*`) | metadata |
/// |---|---|---|---|
/// | allowed | the inner service's | the inner service's | the rate-limit headers added to the response headers |
/// | bucket empty | `RESOURCE_EXHAUSTED` | `RetryInfo` (the exact wait, rounded up to the ms), `QuotaFailure` | `retry-after` (seconds, rounded up), the rate-limit headers |
/// | cost above the burst | `FAILED_PRECONDITION` | `PreconditionFailure` (type `QUOTA`), no `RetryInfo` | the limit (`x-ratelimit-limit`), no `retry-after` |
/// | unknown tier, `OnUnknownTier::Deny` | `PERMISSION_DENIED` | none | none |
/// | no identity, `OnMissing::Deny(s)` | `UNAUTHENTICATED` (`s` = 401 and any other), `PERMISSION_DENIED` (403), `INVALID_ARGUMENT` (400), `NOT_FOUND` (404) | none | none |
/// | store failed, `OnStorageError::Deny(_)` | `UNAVAILABLE`, whatever the HTTP status | `RetryInfo` of 1 s | `retry-after: 1` |
/// | cost function returned 0, clock out of range | `INTERNAL` | none | none |
///
/// Why `FAILED_PRECONDITION` for a cost above the burst: no wait makes such a
/// call pass (HTTP answers 403), so it must not be `RESOURCE_EXHAUSTED`, the
/// code clients back off and retry on; and the gRPC status code guide says
/// `PERMISSION_DENIED` "must not be used for rejections caused by exhausting
/// some resource". `FAILED_PRECONDITION` is its code for "do not retry until
/// the system state has been explicitly fixed" (here: a bigger plan, or a
/// cheaper call).
///
/// The rate-limit headers are those of the HTTP path, in the style chosen
/// with [`TierLimitLayer::headers`] (default: `x-ratelimit-limit`,
/// `x-ratelimit-remaining`, `x-ratelimit-reset`).
///
/// The inner service's error type passes through untouched: a refusal is a
/// response, never an error. An allowed call's
/// [`RateLimitInfo`](crate::RateLimitInfo) is in the request's extensions
/// (`tonic::Request::extensions`), as with HTTP.
///
/// Identity comes from the metadata, which are the HTTP/2 headers, so
/// [`TierLimitLayer::identifier_fn`] works as is; a cost per method is a
/// [`TierLimitLayer::cost_fn`] on the path (`/package.Service/Method`).
///
/// ```
/// use http::StatusCode;
/// use tonic::transport::Server;
/// use tower_rate_tier::{OnMissing, Quota, RateTier, TierIdentity, TierLimitLayer};
///
/// let tiers = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .tier("pro", Quota::per_minute(100))
///     .default_tier("free")
///     .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED)) // UNAUTHENTICATED
///     .build();
/// let layer = TierLimitLayer::new(tiers)
///     // gRPC metadata are HTTP/2 headers.
///     .identifier_fn(|metadata| {
///         let key = metadata.get("x-api-key")?.to_str().ok()?;
///         let plan = if key.starts_with("pro_") { "pro" } else { "free" };
///         Some(TierIdentity::new(key, plan))
///     })
///     .cost_fn(|call| match call.uri.path() {
///         "/grpc.health.v1.Health/Watch" => 5,
///         _ => 1,
///     })
///     .grpc();
///
/// let (_reporter, health) = tonic_health::server::health_reporter();
/// let router = Server::builder().layer(layer).add_service(health);
/// // router.serve(addr).await
/// # drop(router);
/// ```
#[derive(Clone)]
#[must_use]
pub struct GrpcTierLimitLayer {
    config: Arc<Config>,
}

impl TierLimitLayer {
    /// The same limiter, identity and cost for a gRPC (tonic) server:
    /// refusals become gRPC statuses. See [`GrpcTierLimitLayer`].
    pub fn grpc(self) -> GrpcTierLimitLayer {
        GrpcTierLimitLayer {
            config: self.config,
        }
    }
}

impl From<TierLimitLayer> for GrpcTierLimitLayer {
    fn from(layer: TierLimitLayer) -> Self {
        layer.grpc()
    }
}

impl GrpcTierLimitLayer {
    /// The limiter this layer applies.
    pub fn tiers(&self) -> &RateTier {
        &self.config.tiers
    }
}

impl fmt::Debug for GrpcTierLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcTierLimitLayer")
            .field("tiers", &self.config.tiers)
            .field("cost_fn", &self.config.cost.is_some())
            .field("on_event", &self.config.on_event.is_some())
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for GrpcTierLimitLayer {
    type Service = GrpcTierLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcTierLimit {
            inner,
            config: self.config.clone(),
        }
    }
}

/// The service made by [`GrpcTierLimitLayer`].
///
/// Clones share the limiter: the limit holds across every clone.
pub struct GrpcTierLimit<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S: Clone> Clone for GrpcTierLimit<S> {
    fn clone(&self) -> Self {
        GrpcTierLimit {
            inner: self.inner.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for GrpcTierLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GrpcTierLimit")
            .field("inner", &self.inner)
            .field("tiers", &self.config.tiers)
            .finish_non_exhaustive()
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for GrpcTierLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    // An empty body: a refusal is a trailers-only response.
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        // The clone is not ready; the one that was polled ready is taken.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        Box::pin(limit_then_call(config, inner, request, |refused, style| {
            refusal_status(&refused, style).into_http()
        }))
    }
}

/// The gRPC status for a refused request, as [`GrpcTierLimitLayer`] sends
/// it: `RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo` and `retry-after`
/// metadata, or `FAILED_PRECONDITION` / `PERMISSION_DENIED` when no wait
/// would help. For gRPC handlers that call
/// [`RateTier::check`](crate::RateTier::check) themselves.
///
/// ```
/// use tonic::Code;
/// use tonic_types::StatusExt;
/// use tower_rate_tier::{Quota, RateTier, layer::limited_status};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
/// limiter.check("ana", "free", 10).await.unwrap().unwrap();
/// let limited = limiter.check("ana", "free", 1).await.unwrap().unwrap_err();
/// let status = limited_status(&limited);
/// assert_eq!(status.code(), Code::ResourceExhausted);
/// assert!(status.get_details_retry_info().unwrap().retry_delay.is_some());
/// assert_eq!(status.metadata().get("retry-after").unwrap(), "6");
///
/// let never = limiter.check("ana", "free", 11).await.unwrap().unwrap_err();
/// let status = limited_status(&never);
/// assert_eq!(status.code(), Code::FailedPrecondition);
/// assert!(status.get_details_retry_info().is_none());
/// # }
/// ```
pub fn limited_status(limited: &Limited) -> Status {
    limited_status_with(limited, HeaderStyle::default())
}

/// [`limited_status`] with the chosen rate-limit metadata (the layer uses
/// its [`TierLimitLayer::headers`] style).
pub fn limited_status_with(limited: &Limited, style: HeaderStyle) -> Status {
    // The HTTP refusal's headers (retry-after, the rate-limit fields of
    // `style`) become the metadata: both protocols say the same.
    let http: Response<String> =
        response::limited_response_with(limited, style);
    let mut headers = http.into_parts().0.headers;
    headers.remove(CONTENT_TYPE);
    let metadata = MetadataMap::from_headers(headers);
    let subject = format!("tier:{}", limited.tier());
    match limited.reason() {
        LimitReason::RateLimited => {
            let mut details = ErrorDetails::with_retry_info(Some(ceil_millis(
                limited.retry_after(),
            )));
            details.add_quota_failure_violation(subject, "rate limit exceeded");
            Status::with_error_details_and_metadata(
                Code::ResourceExhausted,
                "rate limit exceeded",
                details,
                metadata,
            )
        }
        LimitReason::CostExceedsBurst { cost } => {
            let details = ErrorDetails::with_precondition_failure_violation(
                "QUOTA",
                subject,
                format!(
                    "request cost {cost} exceeds the tier's burst of {}",
                    limited.limit()
                ),
            );
            Status::with_error_details_and_metadata(
                Code::FailedPrecondition,
                "request cost exceeds the tier's burst",
                details,
                metadata,
            )
        }
        LimitReason::UnknownTier => Status::with_metadata(
            Code::PermissionDenied,
            "unknown tier",
            metadata,
        ),
    }
}

/// The status of a verdict that does not pass.
fn refusal_status(verdict: &Verdict, style: HeaderStyle) -> Status {
    match verdict {
        Verdict::Limited(limited) => limited_status_with(limited, style),
        Verdict::Denied(status) => {
            Status::new(identity_code(*status), "identity required")
        }
        Verdict::Unavailable(_) => {
            let mut metadata = MetadataMap::new();
            metadata.insert("retry-after", MetadataValue::from_static("1"));
            Status::with_error_details_and_metadata(
                Code::Unavailable,
                "rate limiter unavailable",
                ErrorDetails::with_retry_info(Some(Duration::from_secs(1))),
                metadata,
            )
        }
        Verdict::InvalidCost => {
            Status::new(Code::Internal, "invalid request cost")
        }
        Verdict::Invalid => {
            Status::new(Code::Internal, "rate limiter clock out of range")
        }
        // Passes: never refused (the service does not ask).
        Verdict::Allowed(_) | Verdict::Unlimited => {
            Status::new(Code::Internal, "rate limiter passed the request")
        }
    }
}

/// `OnMissing::Deny(status)` in gRPC terms: the request has no identity.
fn identity_code(status: StatusCode) -> Code {
    match status {
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::BAD_REQUEST => Code::InvalidArgument,
        StatusCode::NOT_FOUND => Code::NotFound,
        // 401, and any other status chosen for "identity required".
        _ => Code::Unauthenticated,
    }
}

/// A wait rounded up to whole milliseconds: a client that waits what it is
/// told passes.
fn ceil_millis(wait: Duration) -> Duration {
    let millis = wait.as_micros().div_ceil(1000);
    Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use crate::{OnUnknownTier, Quota};

    /// A refusal from a real limiter: `cost` after `spent` in 3/s.
    async fn refused(spent: u32, cost: u32) -> Limited {
        let limiter = RateTier::builder()
            .clock(FakeClock::at_us(1_500_000))
            .tier("free", Quota::per_second(3))
            .build();
        if spent > 0 {
            limiter.check("ana", "free", spent).await.unwrap().unwrap();
        }
        limiter
            .check("ana", "free", cost)
            .await
            .unwrap()
            .unwrap_err()
    }

    fn meta<'a>(status: &'a Status, name: &str) -> Option<&'a str> {
        status.metadata().get(name).map(|v| v.to_str().unwrap())
    }

    fn style() -> HeaderStyle {
        HeaderStyle::default()
    }

    #[tokio::test]
    async fn rate_limited_is_resource_exhausted_with_retry_info() {
        // 3/s: one request every 333_334 µs (rounded up).
        let limited = refused(3, 1).await;
        assert_eq!(limited.retry_after(), Duration::from_micros(333_334));
        let status = refusal_status(&Verdict::Limited(limited), style());
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert_eq!(status.message(), "rate limit exceeded");
        let retry = status.get_details_retry_info().unwrap();
        // Rounded up: a client that waits this long passes.
        assert_eq!(retry.retry_delay, Some(Duration::from_millis(334)));
        let quota = status.get_details_quota_failure().unwrap();
        assert_eq!(quota.violations[0].subject, "tier:free");
        assert_eq!(meta(&status, "retry-after"), Some("1"));
        assert_eq!(meta(&status, "x-ratelimit-limit"), Some("3"));
        assert_eq!(meta(&status, "x-ratelimit-remaining"), Some("0"));
        // Full again at 1.5 s + 999_999 µs, rounded up.
        assert_eq!(meta(&status, "x-ratelimit-reset"), Some("3"));
        assert_eq!(meta(&status, "content-type"), None);
    }

    #[tokio::test]
    async fn the_metadata_follow_the_header_style() {
        let limited = refused(3, 1).await;
        let status =
            refusal_status(&Verdict::Limited(limited), HeaderStyle::Ietf);
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(meta(&status, "ratelimit-policy").is_some());
        assert!(meta(&status, "ratelimit").is_some());
        assert_eq!(meta(&status, "x-ratelimit-limit"), None);
        assert_eq!(meta(&status, "retry-after"), Some("1"));
    }

    #[tokio::test]
    async fn cost_above_burst_is_failed_precondition_without_retry() {
        let limited = refused(0, 4).await;
        let status = refusal_status(&Verdict::Limited(limited), style());
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.get_details_retry_info().is_none());
        let failure = status.get_details_precondition_failure().unwrap();
        assert_eq!(failure.violations[0].r#type, "QUOTA");
        assert_eq!(failure.violations[0].subject, "tier:free");
        assert_eq!(
            failure.violations[0].description,
            "request cost 4 exceeds the tier's burst of 3"
        );
        assert_eq!(meta(&status, "retry-after"), None);
        assert_eq!(meta(&status, "x-ratelimit-limit"), Some("3"));
    }

    #[tokio::test]
    async fn unknown_tier_is_permission_denied() {
        let limiter = RateTier::builder()
            .tier("free", Quota::per_minute(10))
            .on_unknown_tier(OnUnknownTier::Deny)
            .build();
        let limited =
            limiter.check("ana", "gold", 1).await.unwrap().unwrap_err();
        let status = refusal_status(&Verdict::Limited(limited), style());
        assert_eq!(status.code(), Code::PermissionDenied);
        assert_eq!(status.message(), "unknown tier");
        assert!(status.details().is_empty());
        assert_eq!(meta(&status, "retry-after"), None);
    }

    #[test]
    fn missing_identity_follows_the_configured_status() {
        for (http, grpc) in [
            (StatusCode::UNAUTHORIZED, Code::Unauthenticated),
            (StatusCode::FORBIDDEN, Code::PermissionDenied),
            (StatusCode::BAD_REQUEST, Code::InvalidArgument),
            (StatusCode::NOT_FOUND, Code::NotFound),
            (StatusCode::PAYMENT_REQUIRED, Code::Unauthenticated),
        ] {
            let status = refusal_status(&Verdict::Denied(http), style());
            assert_eq!(status.code(), grpc, "{http}");
            assert_eq!(status.message(), "identity required");
            assert!(status.details().is_empty());
        }
    }

    #[test]
    fn storage_error_is_unavailable_with_one_second_retry() {
        for http in [
            StatusCode::SERVICE_UNAVAILABLE,
            StatusCode::TOO_MANY_REQUESTS,
        ] {
            let status = refusal_status(&Verdict::Unavailable(http), style());
            assert_eq!(status.code(), Code::Unavailable);
            let retry = status.get_details_retry_info().unwrap();
            assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)));
            assert_eq!(meta(&status, "retry-after"), Some("1"));
        }
    }

    #[test]
    fn invalid_cost_and_clock_are_internal() {
        for verdict in [Verdict::InvalidCost, Verdict::Invalid] {
            let status = refusal_status(&verdict, style());
            assert_eq!(status.code(), Code::Internal);
        }
    }

    #[tokio::test]
    async fn a_refusal_is_a_trailers_only_response() {
        let limited = refused(3, 1).await;
        let status = refusal_status(&Verdict::Limited(limited), style());
        let response: Response<String> = status.into_http();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.body().is_empty());
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(headers["retry-after"], "1");
        assert!(headers.contains_key("grpc-status-details-bin"));
    }

    #[test]
    fn waits_round_up_to_the_millisecond() {
        assert_eq!(
            ceil_millis(Duration::from_micros(1)),
            Duration::from_millis(1)
        );
        assert_eq!(ceil_millis(Duration::from_secs(6)), Duration::from_secs(6));
        assert_eq!(ceil_millis(Duration::ZERO), Duration::ZERO);
    }
}
