//! The responses the middleware writes, and its headers.

use std::cell::RefCell;
use std::sync::LazyLock;

use bytes::BytesMut;
use http::header::{CONTENT_TYPE, RETRY_AFTER};

use http::{HeaderMap, HeaderValue, Response, StatusCode};

pub use crate::headers::{
    HeaderStyle, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
use crate::headers::{Policy, ietf_fields};
use crate::outcome::{
    LimitReason, LimitState, Limited, RateLimitInfo, ceil_secs,
};

/// The headers whose last value each thread keeps, for [`number_of`]: a
/// tier's limit and the current second's reset repeat from one response to
/// the next.
#[derive(Clone, Copy)]
enum Kept {
    Limit = 0,
    Reset = 1,
}

/// `n` as a header value, the last one of its kind on this thread reused
/// when it is the same number: a shared clone, no digits to write.
fn number_of(kind: Kept, n: u64) -> HeaderValue {
    thread_local! {
        static LAST: RefCell<[Option<(u64, HeaderValue)>; 2]> =
            const { RefCell::new([None, None]) };
    }
    let kept = LAST.try_with(|last| {
        let mut last = last.try_borrow_mut().ok()?;
        let slot = last.get_mut(kind as usize)?;
        match slot {
            Some((kept, value)) if *kept == n => Some(value.clone()),
            _ => {
                let value = number(n);
                *slot = Some((n, value.clone()));
                Some(value)
            }
        }
    });
    kept.ok().flatten().unwrap_or_else(|| number(n))
}

/// A header value for `n`. Small numbers (limits, remaining counts, waits)
/// come from a table made once, so that most responses allocate nothing
/// for them.
fn number(n: u64) -> HeaderValue {
    const SMALL: usize = 1024;
    static TABLE: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
        // One string for the whole table, kept for the process's life.
        let digits: &'static str = Box::leak(
            (0..SMALL).map(|i| i.to_string()).collect::<String>().into(),
        );
        let mut table = Vec::with_capacity(SMALL);
        let mut rest = digits;
        for i in 0..SMALL {
            let width = i.checked_ilog10().map_or(1, |log| log as usize + 1);
            let (value, tail) = rest.split_at(width);
            table.push(HeaderValue::from_static(value));
            rest = tail;
        }
        table
    });
    usize::try_from(n)
        .ok()
        .and_then(|i| TABLE.get(i))
        .cloned()
        .unwrap_or_else(|| cut_number(n))
}

thread_local! {
    /// This thread's digits of recent header values, each value a slice of
    /// it: one allocation per few hundred values rather than one each
    /// (every response carries two or three numbers). A block lives as
    /// long as a value cut from it.
    static DIGITS: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// `n` as a header value cut from this thread's block of digits.
fn cut_number(n: u64) -> HeaderValue {
    const BLOCK: usize = 4096;
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = n;
    loop {
        start -= 1;
        // `rest % 10` is a digit: the cast keeps it whole.
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let digits = &digits[start..];
    let cut = DIGITS.try_with(|block| {
        let mut block = block.try_borrow_mut().ok()?;
        if block.capacity() < digits.len() {
            *block = BytesMut::with_capacity(BLOCK);
        }
        block.extend_from_slice(digits);
        HeaderValue::from_maybe_shared(block.split().freeze()).ok()
    });
    cut.ok().flatten().unwrap_or_else(|| HeaderValue::from(n))
}

/// The IETF fields for `limits`, in order. `t` is each bucket's time until
/// full; for the refusing limit of a 429 it is the wait (`wait`), so
/// `Retry-After` is never earlier than `t`.
fn insert_ietf(
    headers: &mut HeaderMap,
    limits: impl Iterator<Item = LimitState>,
    wait: Option<(&str, u64)>,
) {
    let (policy, state) = ietf_fields(limits.map(|limit| {
        let refusing = wait.filter(|&(name, _)| name == limit.name);
        Policy {
            name: limit.name,
            quota: u64::from(limit.limit),
            window_secs: ceil_secs(limit.window),
            remaining: if refusing.is_some() {
                0
            } else {
                limit.remaining
            },
            reset_secs: refusing
                .map_or_else(|| ceil_secs(limit.reset_after), |(_, wait)| wait),
        }
    }));
    if let Ok(policy) = HeaderValue::try_from(policy) {
        headers.insert(RATELIMIT_POLICY, policy);
    }
    if let Ok(state) = HeaderValue::try_from(state) {
        headers.insert(RATELIMIT, state);
    }
}

/// The rate-limit headers of a request that passed: `x-ratelimit-*` of the
/// most constraining limit, the IETF fields of every limit.
pub(crate) fn insert_info_headers(
    headers: &mut HeaderMap,
    info: &RateLimitInfo,
    style: HeaderStyle,
) {
    if style.x() {
        let limit = number_of(Kept::Limit, u64::from(info.limit));
        let reset = number_of(Kept::Reset, info.reset_unix_secs());
        headers.insert(X_RATELIMIT_LIMIT, limit);
        headers.insert(X_RATELIMIT_REMAINING, number(info.remaining));
        headers.insert(X_RATELIMIT_RESET, reset);
    }
    if style.ietf() {
        insert_ietf(headers, info.limits(), None);
    }
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
    limited_response_with(limited, HeaderStyle::XRateLimit)
}

/// [`limited_response`] with the chosen rate-limit headers.
///
/// ```
/// use tower_rate_tier::{Quota, RateTier, clock::FakeClock};
/// use tower_rate_tier::layer::{HeaderStyle, limited_response_with};
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let limiter = RateTier::builder()
///     .clock(FakeClock::new())
///     .tier("free", Quota::per_minute(10))
///     .build();
/// limiter.check("ana", "free", 10).await.unwrap().unwrap();
/// let limited = limiter.check("ana", "free", 1).await.unwrap().unwrap_err();
/// let response: http::Response<String> =
///     limited_response_with(&limited, HeaderStyle::Ietf);
/// assert_eq!(response.headers()["retry-after"], "6");
/// assert_eq!(response.headers()["ratelimit-policy"], "\"free\";q=10;w=60");
/// assert_eq!(response.headers()["ratelimit"], "\"free\";r=0;t=6");
/// assert!(response.headers().get("x-ratelimit-limit").is_none());
/// # }
/// ```
pub fn limited_response_with<B: From<String>>(
    limited: &Limited,
    style: HeaderStyle,
) -> Response<B> {
    // The tier's refusal keeps the 0.3 body; a limit of its own is named.
    let named = if limited.is_tier_limit() {
        String::new()
    } else {
        format!(",\"limit\":\"{}\"", limited.limit_name())
    };
    match limited.reason() {
        LimitReason::RateLimited | LimitReason::Banned => {
            let wait = limited.retry_after_secs();
            let banned = if limited.reason() == LimitReason::Banned {
                ",\"banned\":true"
            } else {
                ""
            };
            let mut response = json(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "{{\"error\":\"rate limit exceeded\",\"tier\":\"{}\"{named},\"retry_after\":{wait}{banned}}}",
                    limited.tier()
                ),
            );
            let headers = response.headers_mut();
            headers.insert(RETRY_AFTER, number(wait));
            if style.x() {
                headers.insert(
                    X_RATELIMIT_LIMIT,
                    number(u64::from(limited.limit())),
                );
                headers.insert(X_RATELIMIT_REMAINING, number(0));
                headers.insert(
                    X_RATELIMIT_RESET,
                    number(limited.reset_unix_secs()),
                );
            }
            if style.ietf() {
                insert_ietf(
                    headers,
                    limited.limits(),
                    Some((limited.limit_name(), wait)),
                );
            }
            response
        }
        LimitReason::CostExceedsBurst { cost } => {
            let what = if limited.is_tier_limit() {
                "tier"
            } else {
                "limit"
            };
            let mut response = json(
                StatusCode::FORBIDDEN,
                format!(
                    "{{\"error\":\"request cost exceeds the {what}'s burst\",\"tier\":\"{}\"{named},\"cost\":{cost},\"burst\":{}}}",
                    limited.tier(),
                    limited.limit()
                ),
            );
            // The store was not read, so only the limit is known.
            if style.x() {
                response.headers_mut().insert(
                    X_RATELIMIT_LIMIT,
                    number(u64::from(limited.limit())),
                );
            }
            response
        }
        LimitReason::UnknownTier => {
            error(StatusCode::FORBIDDEN, "unknown tier")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::number;

    #[test]
    fn numbers_from_the_table_and_beyond_it_read_the_same() {
        for n in [0, 1, 9, 10, 99, 100, 999, 1000, 1023, 1024, 1_790_947_155] {
            assert_eq!(number(n).to_str().unwrap(), n.to_string());
        }
        // Enough to fill several blocks of digits.
        let values: Vec<_> =
            (0..3000u64).map(|i| i * 1_000_003 + 1024).collect();
        let headers: Vec<_> = values.iter().map(|&n| number(n)).collect();
        for (n, header) in values.iter().zip(&headers) {
            assert_eq!(header.to_str().unwrap(), n.to_string());
        }
        assert_eq!(number(u64::MAX).to_str().unwrap(), u64::MAX.to_string());
    }
}
