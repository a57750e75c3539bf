//! The rate-limit headers the service may ask Envoy to add
//! (`response_headers_to_add`), chosen with `--headers`: the workspace's
//! contract ([`tower_rate_tier::headers`]), the one the Tower layer writes.
//!
//! - `none` (the default, as envoyproxy/ratelimit's
//!   `LIMIT_RESPONSE_HEADERS_ENABLED=false`): none.
//! - `x`: `x-ratelimit-limit` (the rule's `requests_per_unit`),
//!   `x-ratelimit-remaining`, `x-ratelimit-reset` of the most constrained
//!   descriptor: the one that refused (the last, as upstream), else the one
//!   with the least remaining. A refused request also gets `retry-after`.
//! - `ietf`: `ratelimit-policy` and `ratelimit`, one item per limited
//!   descriptor, named after the rule's `name` (or its path in the config):
//!   `"per_ip";q=60;w=60` and `"per_ip";r=59;t=1`.
//! - `both`.

use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use http::HeaderName;
use tower_rate_tier::headers::{
    HeaderStyle, Policy, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT,
    X_RATELIMIT_REMAINING, X_RATELIMIT_RESET, ietf_fields,
};

/// One limited descriptor, as the headers see it.
#[derive(Debug)]
pub(crate) struct Limited<'a> {
    pub(crate) label: &'a str,
    pub(crate) requests_per_unit: u32,
    pub(crate) window_secs: u64,
    pub(crate) passed: bool,
    pub(crate) remaining: u64,
    pub(crate) reset_secs: u64,
}

fn header(key: &HeaderName, value: String) -> HeaderValue {
    HeaderValue {
        key: key.as_str().to_owned(),
        value,
        ..HeaderValue::default()
    }
}

/// The headers of one response. `retry_secs` is the wait of a refused
/// request (rounded up), when there is one.
pub(crate) fn headers(
    style: HeaderStyle,
    limited: &[Limited<'_>],
    retry_secs: Option<u64>,
) -> Vec<HeaderValue> {
    let mut out = Vec::new();
    if limited.is_empty() {
        return out;
    }
    if style.x() {
        // The last refusing one (as upstream), else the least remaining
        // (the first on a tie).
        let most = limited
            .iter()
            .rev()
            .find(|l| !l.passed)
            .or_else(|| limited.iter().min_by_key(|l| l.remaining));
        if let Some(most) = most {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let remaining = if most.passed { most.remaining } else { 0 };
            out.push(header(
                &X_RATELIMIT_LIMIT,
                most.requests_per_unit.to_string(),
            ));
            out.push(header(&X_RATELIMIT_REMAINING, remaining.to_string()));
            out.push(header(
                &X_RATELIMIT_RESET,
                now.saturating_add(most.reset_secs).to_string(),
            ));
        }
        if let Some(retry) = retry_secs {
            out.push(header(&http::header::RETRY_AFTER, retry.to_string()));
        }
    }
    if style.ietf() {
        let (policy, state) = ietf_fields(limited.iter().map(|l| {
            let (remaining, reset_secs) = match (l.passed, retry_secs) {
                (true, _) => (l.remaining, l.reset_secs),
                (false, Some(retry)) => (0, retry),
                (false, None) => (0, l.reset_secs),
            };
            Policy {
                name: l.label,
                quota: u64::from(l.requests_per_unit),
                window_secs: l.window_secs,
                remaining,
                reset_secs,
            }
        }));
        out.push(header(&RATELIMIT_POLICY, policy));
        out.push(header(&RATELIMIT, state));
    }
    out
}
