//! The bounds of a request: how much of one is read at all.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

/// The bounds of a request. A request beyond one is read no further than
/// the bound (its length is checked before anything is decoded, and its
/// descriptors are counted before any is decoded) and refused: answered
/// `OVER_LIMIT` with one status (HTTP 429 on `/json`), never with an
/// error, because a gateway that fails open (Envoy's `failure_mode_deny:
/// false`) lets a request through when its rate limit service answers an
/// error, past every one of its limits. Lengths of domains, keys and values
/// are not bounded (values are hashed into keys): only what the bounds
/// below say is.
///
/// ```
/// let limits = rate_tier_service::RequestLimits::default();
/// assert_eq!(limits.max_descriptors, 256);
/// assert_eq!(limits.max_request_bytes, 1024 * 1024);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Descriptors in one request (default 256; Envoy sends a handful, as
    /// many as its config's actions): each is a bucket of one decision.
    pub max_descriptors: usize,
    /// Bytes of the encoded request (default 1 MiB): the protobuf message
    /// on gRPC, the body on `/json`. At most
    /// [`DECODE_CAP_BYTES`](crate::grpc::DECODE_CAP_BYTES) is read at all.
    pub max_request_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 256,
            max_request_bytes: 1024 * 1024,
        }
    }
}

/// A request as a transport read it: within the [`RequestLimits`], or
/// beyond one of them and read no further.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// Within the bounds: decoded whole, to decide.
    Request(RateLimitRequest),
    /// Beyond a bound: nothing of it was kept; answered by
    /// [`Decider::oversized`](super::Decider::oversized).
    Oversized(Oversized),
}

/// The bound a request went beyond.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oversized {
    /// [`RequestLimits::max_request_bytes`].
    Bytes,
    /// [`RequestLimits::max_descriptors`].
    Descriptors,
}

impl Oversized {
    /// The bound, for a message.
    ///
    /// ```
    /// use rate_tier_service::{RequestLimits, decide::Oversized};
    /// let limits = RequestLimits::default();
    /// assert_eq!(Oversized::Descriptors.describe(&limits), "more than 256 descriptors");
    /// assert_eq!(Oversized::Bytes.describe(&limits), "more than 1048576 bytes");
    /// ```
    pub fn describe(self, limits: &RequestLimits) -> String {
        match self {
            Oversized::Bytes => {
                format!("more than {} bytes", limits.max_request_bytes)
            }
            Oversized::Descriptors => {
                format!("more than {} descriptors", limits.max_descriptors)
            }
        }
    }
}
