//! The rate-limit headers the service may ask Envoy to add
//! (`response_headers_to_add`), chosen with `--headers`.

use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;

/// Which headers go into `response_headers_to_add`.
///
/// - `None` (the default, as envoyproxy/ratelimit's
///   `LIMIT_RESPONSE_HEADERS_ENABLED=false`): none.
/// - `X`: `x-ratelimit-limit` (the rule's `requests_per_unit`),
///   `x-ratelimit-remaining`, `x-ratelimit-reset` (Unix seconds, rounded up,
///   when the bucket is full again) of the most constrained descriptor: the
///   one that refused, else the one with the least remaining. A refused
///   request also gets `retry-after` (seconds, rounded up). These are the
///   workspace's HTTP contract (the Tower layer writes the same).
/// - `Ietf`: `ratelimit-policy` and `ratelimit`
///   (draft-ietf-httpapi-ratelimit-headers-10), one item per limited
///   descriptor, named after the rule's `name` (or its path in the config):
///   `"per_ip";q=60;w=60` and `"per_ip";r=59;t=1`.
/// - `Both`.
///
/// ```
/// use rate_tier_service::HeaderMode;
/// assert_eq!("ietf".parse::<HeaderMode>(), Ok(HeaderMode::Ietf));
/// assert!("all".parse::<HeaderMode>().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HeaderMode {
    /// No headers.
    #[default]
    None,
    /// `x-ratelimit-*` (and `retry-after` when refused).
    X,
    /// The IETF fields.
    Ietf,
    /// Both.
    Both,
}

impl FromStr for HeaderMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(HeaderMode::None),
            "x" => Ok(HeaderMode::X),
            "ietf" => Ok(HeaderMode::Ietf),
            "both" => Ok(HeaderMode::Both),
            other => Err(format!(
                "--headers {other:?}: expected one of x, ietf, both, none"
            )),
        }
    }
}

impl HeaderMode {
    fn x(self) -> bool {
        matches!(self, HeaderMode::X | HeaderMode::Both)
    }

    fn ietf(self) -> bool {
        matches!(self, HeaderMode::Ietf | HeaderMode::Both)
    }
}

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

/// An sf-string's content: printable ASCII, `"` and `\` escaped.
fn sf_string(label: &str) -> String {
    let mut out = String::with_capacity(label.len());
    for c in label.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..HeaderValue::default()
    }
}

/// The headers of one response. `retry_secs` is the wait of a refused
/// request (rounded up), when there is one.
pub(crate) fn headers(
    mode: HeaderMode,
    limited: &[Limited<'_>],
    retry_secs: Option<u64>,
) -> Vec<HeaderValue> {
    let mut out = Vec::new();
    if mode == HeaderMode::None || limited.is_empty() {
        return out;
    }
    if mode.x() {
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
                "x-ratelimit-limit",
                most.requests_per_unit.to_string(),
            ));
            out.push(header("x-ratelimit-remaining", remaining.to_string()));
            out.push(header(
                "x-ratelimit-reset",
                now.saturating_add(most.reset_secs).to_string(),
            ));
        }
        if let Some(retry) = retry_secs {
            out.push(header("retry-after", retry.to_string()));
        }
    }
    if mode.ietf() {
        let mut policy = String::new();
        let mut state = String::new();
        for l in limited {
            let separator = if policy.is_empty() { "" } else { ", " };
            let name = sf_string(l.label);
            let (r, t) = match (l.passed, retry_secs) {
                (true, _) => (l.remaining, l.reset_secs),
                (false, Some(retry)) => (0, retry),
                (false, None) => (0, l.reset_secs),
            };
            policy.push_str(&format!(
                "{separator}\"{name}\";q={};w={}",
                l.requests_per_unit, l.window_secs
            ));
            state.push_str(&format!("{separator}\"{name}\";r={r};t={t}"));
        }
        out.push(header("ratelimit-policy", policy));
        out.push(header("ratelimit", state));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_valid_sf_strings() {
        assert_eq!(sf_string("a\"b\\c"), "a\\\"b\\\\c");
        assert_eq!(sf_string("é"), "?");
    }
}
