//! The layer for gRPC (tonic) servers: [`GrpcTierLimitLayer`].

use std::time::Duration;

use http::header::CONTENT_TYPE;
use http::{Response, StatusCode};
use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use super::layer::TierLimitLayer;
use super::refusal::{Refusal, Refused};
use super::response;
use super::service::TierLimit;
use crate::headers::HeaderStyle;
use crate::outcome::{LimitReason, Limited};

/// [`TierLimitLayer`] for gRPC servers: refusals are `tonic::Status`es
/// (`RESOURCE_EXHAUSTED` with `google.rpc.RetryInfo`, ...) instead of HTTP
/// error responses. Made with [`TierLimitLayer::grpc`].
///
/// It decides exactly as the [`TierLimitLayer`] it was made from (identity,
/// costs, limits, events, observer, header style): it is the same layer,
/// with [`GrpcRefusal`] as its refusal. Only the answer differs: a refused
/// call gets a trailers-only gRPC response (HTTP 200, `grpc-status`,
/// `grpc-message`, `grpc-status-details-bin`), which every gRPC client reads
/// as a `Status`.
///
/// | case | gRPC code | details (`google.rpc.*`) | metadata |
/// |---|---|---|---|
/// | allowed | the inner service's | the inner service's | the rate-limit headers added to the response headers |
/// | a bucket empty | `RESOURCE_EXHAUSTED` | `RetryInfo` (the exact wait, rounded up to the ms), `QuotaFailure` | `retry-after` (seconds, rounded up), the rate-limit headers |
/// | cost above the burst | `FAILED_PRECONDITION` | `PreconditionFailure` (type `QUOTA`), no `RetryInfo` | the limit (`x-ratelimit-limit`), no `retry-after` |
/// | unknown tier, `OnUnknownTier::Deny` | `PERMISSION_DENIED` | none | none |
/// | no identity, `OnMissing::Deny(s)` | `UNAUTHENTICATED` (`s` = 401 and any other), `PERMISSION_DENIED` (403), `INVALID_ARGUMENT` (400), `NOT_FOUND` (404) | none | none |
/// | store or identity lookup failed (`Deny`), or a cost above a fallback's local share | `UNAVAILABLE`, whatever the HTTP status | `RetryInfo` of 1 s | `retry-after: 1` |
/// | cost function returned 0, clock out of range | `INTERNAL` | none | none |
///
/// Why `FAILED_PRECONDITION` for a cost above the burst: no wait makes such a
/// call pass (HTTP answers 403), so it must not be `RESOURCE_EXHAUSTED`, the
/// code clients back off and retry on; and the gRPC status code guide says
/// `PERMISSION_DENIED` "must not be used for rejections caused by exhausting
/// some resource". `FAILED_PRECONDITION` is its code for "do not retry until
/// the system state has been explicitly fixed" (here: a bigger tier, or a
/// cheaper call). A cost above a fallback's local share during an outage is
/// transient, so it is `UNAVAILABLE`, never `FAILED_PRECONDITION`.
///
/// Identity comes from the metadata, which are the HTTP/2 headers, so
/// [`TierLimitLayer::identifier_fn`] works as is; a cost per method is a
/// [`TierLimitLayer::cost_fn`] on the path (`/package.Service/Method`), and
/// per-method [`Limit`](crate::Limit)s are `.when()` on the path.
///
/// ```
/// use http::StatusCode;
/// use tonic::transport::Server;
/// use tower_rate_tier::{OnMissing, Quota, RateTier, TierIdentity, TierLimitLayer};
///
/// fn plan_of(key: &str) -> Option<&'static str> {
///     match key {
///         "key_ana" => Some("free"),
///         "key_bea" => Some("pro"),
///         _ => None,
///     }
/// }
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
///         Some(TierIdentity::new(key, plan_of(key)?))
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
pub type GrpcTierLimitLayer = TierLimitLayer<GrpcRefusal>;

impl TierLimitLayer {
    /// The same limiter, identity, cost and limits for a gRPC (tonic)
    /// server: refusals become gRPC statuses. See
    /// [`GrpcTierLimitLayer`](GrpcTierLimitLayer).
    pub fn grpc(self) -> TierLimitLayer<GrpcRefusal> {
        self.answering()
    }
}

/// The service made by [`GrpcTierLimitLayer`].
pub type GrpcTierLimit<S> = TierLimit<S, GrpcRefusal>;

/// gRPC refusals: a trailers-only response carrying the `tonic::Status`
/// of [`GrpcTierLimitLayer`]'s table.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct GrpcRefusal;

impl<B: Default> Refusal<B> for GrpcRefusal {
    fn refuse(refused: Refused<'_>, style: HeaderStyle) -> Response<B> {
        refusal_status(refused, style).into_http()
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
    let subject = if limited.is_tier_limit() {
        format!("tier:{}", limited.tier())
    } else {
        format!("limit:{}", limited.limit_name())
    };
    match limited.reason() {
        LimitReason::RateLimited | LimitReason::Banned => {
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
                    "request cost {cost} exceeds the {}'s burst of {}",
                    if limited.is_tier_limit() {
                        "tier"
                    } else {
                        "limit"
                    },
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

/// The status of a refused request.
fn refusal_status(refused: Refused<'_>, style: HeaderStyle) -> Status {
    match refused {
        Refused::Limited(limited) => limited_status_with(limited, style),
        Refused::NoIdentity(status) => {
            Status::new(identity_code(status), "identity required")
        }
        Refused::Unavailable(_) => {
            let mut metadata = MetadataMap::new();
            metadata.insert("retry-after", MetadataValue::from_static("1"));
            Status::with_error_details_and_metadata(
                Code::Unavailable,
                "rate limiter unavailable",
                ErrorDetails::with_retry_info(Some(Duration::from_secs(1))),
                metadata,
            )
        }
        Refused::Invalid(message) => Status::new(Code::Internal, message),
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
    use crate::policy::OnUnknownTier;
    use crate::{Quota, RateTier};

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
        let status = refusal_status(Refused::Limited(&limited), style());
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
            refusal_status(Refused::Limited(&limited), HeaderStyle::Ietf);
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(meta(&status, "ratelimit-policy").is_some());
        assert!(meta(&status, "ratelimit").is_some());
        assert_eq!(meta(&status, "x-ratelimit-limit"), None);
        assert_eq!(meta(&status, "retry-after"), Some("1"));
    }

    #[tokio::test]
    async fn cost_above_burst_is_failed_precondition_without_retry() {
        let limited = refused(0, 4).await;
        let status = refusal_status(Refused::Limited(&limited), style());
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
        let status = refusal_status(Refused::Limited(&limited), style());
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
            let status = refusal_status(Refused::NoIdentity(http), style());
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
            let status = refusal_status(Refused::Unavailable(http), style());
            assert_eq!(status.code(), Code::Unavailable);
            let retry = status.get_details_retry_info().unwrap();
            assert_eq!(retry.retry_delay, Some(Duration::from_secs(1)));
            assert_eq!(meta(&status, "retry-after"), Some("1"));
        }
    }

    #[test]
    fn invalid_cost_and_clock_are_internal() {
        for message in
            ["invalid request cost", "rate limiter clock out of range"]
        {
            let status = refusal_status(Refused::Invalid(message), style());
            assert_eq!(status.code(), Code::Internal);
            assert_eq!(status.message(), message);
        }
    }

    #[tokio::test]
    async fn a_refusal_is_a_trailers_only_response() {
        let limited = refused(3, 1).await;
        let status = refusal_status(Refused::Limited(&limited), style());
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
