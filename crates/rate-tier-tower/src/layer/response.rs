//! The responses the middleware writes, and its headers.

use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Response, StatusCode};

use crate::{LimitReason, Limited, RateLimitInfo};

/// `x-ratelimit-limit`: the tier's burst.
pub const X_RATELIMIT_LIMIT: HeaderName =
    HeaderName::from_static("x-ratelimit-limit");
/// `x-ratelimit-remaining`: requests of cost 1 still allowed now.
pub const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
/// `x-ratelimit-reset`: Unix seconds (rounded up) when the bucket is full again.
pub const X_RATELIMIT_RESET: HeaderName =
    HeaderName::from_static("x-ratelimit-reset");

pub(crate) fn insert_info_headers(
    headers: &mut HeaderMap,
    info: &RateLimitInfo,
) {
    headers.insert(X_RATELIMIT_LIMIT, HeaderValue::from(info.limit));
    headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(info.remaining));
    headers
        .insert(X_RATELIMIT_RESET, HeaderValue::from(info.reset_unix_secs()));
}

fn json<B: From<String>>(status: StatusCode, body: String) -> Response<B> {
    let mut response = Response::new(B::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub(crate) fn error<B: From<String>>(
    status: StatusCode,
    message: &str,
) -> Response<B> {
    // Messages are fixed strings of this crate: nothing to escape.
    json(status, format!("{{\"error\":\"{message}\"}}"))
}

pub(crate) fn unavailable<B: From<String>>(status: StatusCode) -> Response<B> {
    let mut response = error(status, "rate limiter unavailable");
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The response for a refused request, as the layer sends it: 429 with
/// `retry-after` (rounded up) and the `x-ratelimit-*` headers, or 403 when
/// no wait would help. For handlers that call
/// [`RateTier::check`](crate::RateTier::check) themselves.
///
/// ```
/// use tower_rate_tier::{Quota, RateTier, layer::limited_response};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = RateTier::builder().tier("free", Quota::per_minute(10)).build();
/// let never = limiter.check("ana", "free", 11).await.unwrap().unwrap_err();
/// let response: http::Response<String> = limited_response(&never);
/// assert_eq!(response.status(), 403);
/// assert!(response.headers().get("retry-after").is_none());
/// # }
/// ```
// Tier names are validated to `[A-Za-z0-9_.-]`: no JSON escaping needed.
pub fn limited_response<B: From<String>>(limited: &Limited) -> Response<B> {
    match limited.reason() {
        LimitReason::RateLimited => {
            let wait = limited.retry_after_secs();
            let mut response = json(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "{{\"error\":\"rate limit exceeded\",\"tier\":\"{}\",\"retry_after\":{wait}}}",
                    limited.tier()
                ),
            );
            let headers = response.headers_mut();
            headers.insert(RETRY_AFTER, HeaderValue::from(wait));
            headers
                .insert(X_RATELIMIT_LIMIT, HeaderValue::from(limited.limit()));
            headers.insert(X_RATELIMIT_REMAINING, HeaderValue::from(0u32));
            headers.insert(
                X_RATELIMIT_RESET,
                HeaderValue::from(limited.reset_unix_secs()),
            );
            response
        }
        LimitReason::CostExceedsBurst { cost } => {
            let mut response = json(
                StatusCode::FORBIDDEN,
                format!(
                    "{{\"error\":\"request cost exceeds the tier's burst\",\"tier\":\"{}\",\"cost\":{cost},\"burst\":{}}}",
                    limited.tier(),
                    limited.limit()
                ),
            );
            // The store was not read, so only the limit is known.
            response
                .headers_mut()
                .insert(X_RATELIMIT_LIMIT, HeaderValue::from(limited.limit()));
            response
        }
        LimitReason::UnknownTier => {
            error(StatusCode::FORBIDDEN, "unknown tier")
        }
    }
}
