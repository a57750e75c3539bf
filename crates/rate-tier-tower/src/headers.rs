//! The rate-limit headers, as one contract: the Tower layer writes them on
//! its responses and the standalone service (`rate-tier-service`) hands the
//! same ones to Envoy.
//!
//! - `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` (Unix
//!   seconds, rounded up, when the bucket is full again) of the most
//!   constraining limit, and `retry-after` (seconds, rounded up) on a
//!   refusal;
//! - `RateLimit-Policy` and `RateLimit` of draft-ietf-httpapi-ratelimit-headers-10,
//!   one item per limit, written by [`ietf_fields`].

use std::fmt::Write as _;
use std::str::FromStr;

use http::HeaderName;

pub use crate::outcome::ceil_secs;

/// `x-ratelimit-limit`: the burst of the most constraining limit.
pub const X_RATELIMIT_LIMIT: HeaderName =
    HeaderName::from_static("x-ratelimit-limit");
/// `x-ratelimit-remaining`: requests of cost 1 still allowed now.
pub const X_RATELIMIT_REMAINING: HeaderName =
    HeaderName::from_static("x-ratelimit-remaining");
/// `x-ratelimit-reset`: Unix seconds (rounded up) when the bucket is full
/// again; on a refusal by a window or a concurrency limit, when the request
/// may be retried ([`LimitState::reset_after`](crate::observe::LimitState::reset_after)).
pub const X_RATELIMIT_RESET: HeaderName =
    HeaderName::from_static("x-ratelimit-reset");

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT_POLICY: HeaderName =
    HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which rate-limit headers are written.
///
/// - `XRateLimit` (the layer's default, 0.3's): `x-ratelimit-limit`,
///   `x-ratelimit-remaining`, `x-ratelimit-reset` (Unix seconds).
/// - `Ietf`: the fields of draft-ietf-httpapi-ratelimit-headers-10, one
///   policy per limit of the decision, named after the tier (and each limit
///   of its own): `RateLimit-Policy: "free";q=10;w=60, "search";q=3;w=60`
///   (q: the burst; w: seconds for a full burst to come back) and
///   `RateLimit: "free";r=9;t=6, "search";r=2;t=20` (r: remaining; t:
///   seconds until the bucket is full again, or for the limit that refused
///   a 429 until the request may be retried, so `Retry-After` is never
///   earlier than `t`). No partition key is sent: it would reveal who the
///   user is to anything that sees the response.
/// - `Both`: all of them.
/// - `None` (the service's default): no rate-limit headers; a refusal still
///   says `retry-after`, the wait HTTP itself defines.
///
/// The `x-ratelimit-*` headers describe the most constraining limit: the
/// one with the least remaining, or the one that refused.
///
/// On a command line (`--headers`) it is one of `x`, `ietf`, `both`,
/// `none`:
///
/// ```
/// use tower_rate_tier::headers::HeaderStyle;
/// assert_eq!("ietf".parse::<HeaderStyle>(), Ok(HeaderStyle::Ietf));
/// assert_eq!("x".parse::<HeaderStyle>(), Ok(HeaderStyle::XRateLimit));
/// assert!("all".parse::<HeaderStyle>().is_err());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HeaderStyle {
    /// `x-ratelimit-*` only.
    #[default]
    XRateLimit,
    /// `RateLimit-Policy` and `RateLimit` only.
    Ietf,
    /// Both sets.
    Both,
    /// No rate-limit headers.
    None,
}

impl HeaderStyle {
    /// Whether the `x-ratelimit-*` headers are written.
    ///
    /// ```
    /// use tower_rate_tier::headers::HeaderStyle;
    /// assert!(HeaderStyle::Both.x() && !HeaderStyle::Ietf.x());
    /// ```
    pub fn x(self) -> bool {
        matches!(self, HeaderStyle::XRateLimit | HeaderStyle::Both)
    }

    /// Whether the IETF fields are written.
    ///
    /// ```
    /// use tower_rate_tier::headers::HeaderStyle;
    /// assert!(HeaderStyle::Both.ietf() && !HeaderStyle::None.ietf());
    /// ```
    pub fn ietf(self) -> bool {
        matches!(self, HeaderStyle::Ietf | HeaderStyle::Both)
    }
}

/// A `--headers` value that is none of `x`, `ietf`, `both`, `none`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--headers {0:?}: expected one of x, ietf, both, none")]
pub struct UnknownHeaderStyle(pub String);

impl FromStr for HeaderStyle {
    type Err = UnknownHeaderStyle;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "x" => Ok(HeaderStyle::XRateLimit),
            "ietf" => Ok(HeaderStyle::Ietf),
            "both" => Ok(HeaderStyle::Both),
            "none" => Ok(HeaderStyle::None),
            other => Err(UnknownHeaderStyle(other.to_owned())),
        }
    }
}

/// One limit as the IETF fields describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy<'a> {
    /// Its name: escaped as an sf-string, any byte outside printable ASCII
    /// written `?`.
    pub name: &'a str,
    /// `q`: requests of cost 1 a full bucket allows.
    pub quota: u64,
    /// `w`: seconds for a full quota to come back; 0 (a concurrency
    /// limit, which has no window) leaves it out.
    pub window_secs: u64,
    /// `r`: requests of cost 1 still allowed (0 for the refusing limit).
    pub remaining: u64,
    /// `t`: seconds until full again, or for the refusing limit the wait.
    pub reset_secs: u64,
}

/// The values of `RateLimit-Policy` and `RateLimit` for `policies`, in
/// order.
///
/// ```
/// use tower_rate_tier::headers::{Policy, ietf_fields};
/// let free = Policy { name: "free", quota: 10, window_secs: 60, remaining: 9, reset_secs: 6 };
/// let per_ip = Policy { name: "per \"ip\"", quota: 3, window_secs: 60, remaining: 0, reset_secs: 20 };
/// let (policy, state) = ietf_fields([free, per_ip]);
/// assert_eq!(policy, r#""free";q=10;w=60, "per \"ip\"";q=3;w=60"#);
/// assert_eq!(state, r#""free";r=9;t=6, "per \"ip\"";r=0;t=20"#);
/// ```
pub fn ietf_fields<'a>(
    policies: impl IntoIterator<Item = Policy<'a>>,
) -> (String, String) {
    let mut policy = String::new();
    let mut state = String::new();
    for item in policies {
        if !policy.is_empty() {
            policy.push_str(", ");
            state.push_str(", ");
        }
        push_sf_string(&mut policy, item.name);
        push_sf_string(&mut state, item.name);
        // Writing to a String cannot fail.
        let _ = write!(policy, ";q={}", item.quota);
        // A concurrency limit has no window: `w` is optional, so left out.
        if item.window_secs > 0 {
            let _ = write!(policy, ";w={}", item.window_secs);
        }
        let _ = write!(state, ";r={};t={}", item.remaining, item.reset_secs);
    }
    (policy, state)
}

/// `name` as an sf-string: quoted, `"` and `\` escaped, printable ASCII
/// only (a header value must stay one).
fn push_sf_string(out: &mut String, name: &str) {
    out.push('"');
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_outside_printable_ascii_stay_one_valid_header_value() {
        let odd = Policy {
            name: "é\n",
            quota: 1,
            window_secs: 1,
            remaining: 0,
            reset_secs: 1,
        };
        let (policy, state) = ietf_fields([odd]);
        assert_eq!(policy, "\"??\";q=1;w=1");
        assert!(http::HeaderValue::try_from(state).is_ok());
    }

    #[test]
    fn every_style_parses_from_its_name() {
        for (name, style) in [
            ("x", HeaderStyle::XRateLimit),
            ("ietf", HeaderStyle::Ietf),
            ("both", HeaderStyle::Both),
            ("none", HeaderStyle::None),
        ] {
            assert_eq!(name.parse::<HeaderStyle>(), Ok(style));
        }
        let unknown = "X".parse::<HeaderStyle>().unwrap_err();
        assert_eq!(
            unknown.to_string(),
            "--headers \"X\": expected one of x, ietf, both, none"
        );
    }
}
