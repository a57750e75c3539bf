//! A `RateLimitRequest` as it comes off the wire: its strings as bytes.
//!
//! A descriptor's value is often a request header that the gateway's client
//! chose, and Envoy forwards header bytes that are not UTF-8 (obs-text) as
//! they are. Decoded as the proto's `string`, such a request fails to decode
//! and the whole call is an error, which a gateway that fails open answers
//! by letting the request through, past every one of its limits. So the
//! request is decoded with bytes where the proto has strings, and each one
//! becomes a `String`: itself when it is UTF-8 (and does not start with
//! [`NOT_UTF8`]), otherwise [`NOT_UTF8`] followed by the hex of its bytes. Values are only ever matched against
//! the config (which is UTF-8, so such a value matches no value rule) and
//! hashed into a bucket's key, so distinct bytes stay distinct buckets.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use prost::Message;

use crate::decide::{Incoming, Oversized, RequestLimits};

/// What starts the text of a string that was not UTF-8 (then the hex of its
/// bytes): NUL, which no HTTP header and no config value holds. A UTF-8
/// string that starts with it is written as hex too, so that no two byte
/// strings ever share a text.
///
/// ```
/// use rate_tier_service::wire::{NOT_UTF8, text};
/// assert_eq!(text(b"10.0.0.1".to_vec()), "10.0.0.1");
/// assert_eq!(text(vec![0xff, 0x41]), format!("{NOT_UTF8}ff41"));
/// assert_eq!(text(b"\0ff".to_vec()), format!("{NOT_UTF8}006666"));
/// ```
pub const NOT_UTF8: char = '\0';

/// `bytes` as text: itself when UTF-8 not starting with [`NOT_UTF8`], else
/// [`NOT_UTF8`] and its hex.
pub fn text(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(text) if !text.starts_with(NOT_UTF8) => text,
        result => {
            let bytes = match result {
                Ok(text) => text.into_bytes(),
                Err(error) => error.into_bytes(),
            };
            let mut text = String::with_capacity(1 + 2 * bytes.len());
            text.push(NOT_UTF8);
            text.push_str(&hex::encode(bytes));
            text
        }
    }
}

/// `envoy.service.ratelimit.v3.RateLimitRequest`, strings as bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireRequest {
    /// `domain`.
    #[prost(bytes = "vec", tag = "1")]
    pub domain: Vec<u8>,
    /// `descriptors`.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<WireDescriptor>,
    /// `hits_addend`.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`, strings as
/// bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireDescriptor {
    /// `entries`.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<WireEntry>,
    /// `limit`.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// `hits_addend`.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    /// `is_negative_hits`.
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

/// A descriptor's entry, strings as bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireEntry {
    /// `key`.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// `value`.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// A descriptor skipped: an empty message takes no memory, so a `Vec` of
/// them counts descriptors without holding any.
#[derive(Clone, PartialEq, prost::Message)]
struct Skipped {}

/// A `RateLimitRequest` with its descriptors counted, not decoded (its
/// other fields skipped).
#[derive(Clone, PartialEq, prost::Message)]
struct Counted {
    #[prost(message, repeated, tag = "2")]
    descriptors: Vec<Skipped>,
}

/// Reads a `ShouldRateLimit` message within `limits`: its length first,
/// then its descriptors counted without decoding one (no memory per
/// descriptor); only a message within both bounds is decoded.
///
/// ```
/// use prost::Message;
/// use rate_tier_service::decide::{Incoming, Oversized};
/// use rate_tier_service::wire::{read_request, WireDescriptor, WireRequest};
/// use rate_tier_service::RequestLimits;
///
/// let limits = RequestLimits { max_descriptors: 2, max_request_bytes: 64 };
/// let message = |descriptors| WireRequest {
///     domain: b"edge".to_vec(),
///     descriptors: vec![WireDescriptor::default(); descriptors],
///     hits_addend: 0,
/// }.encode_to_vec();
/// let Incoming::Request(request) = read_request(&message(2), limits)? else { panic!() };
/// assert_eq!(request.descriptors.len(), 2);
/// assert_eq!(read_request(&message(3), limits)?, Incoming::Oversized(Oversized::Descriptors));
/// assert_eq!(read_request(&message(40), limits)?, Incoming::Oversized(Oversized::Bytes));
/// assert!(read_request(&[0x12], limits).is_err());
/// # Ok::<(), prost::DecodeError>(())
/// ```
///
/// # Errors
///
/// A message that is not a `RateLimitRequest` (for `INVALID_ARGUMENT`).
pub fn read_request(
    bytes: &[u8],
    limits: RequestLimits,
) -> Result<Incoming, prost::DecodeError> {
    if bytes.len() > limits.max_request_bytes {
        return Ok(Incoming::Oversized(Oversized::Bytes));
    }
    if Counted::decode(bytes)?.descriptors.len() > limits.max_descriptors {
        return Ok(Incoming::Oversized(Oversized::Descriptors));
    }
    let wire = WireRequest::decode(bytes)?;
    Ok(Incoming::Request(RateLimitRequest::from(wire)))
}

impl From<WireRequest> for RateLimitRequest {
    /// Every string through [`text`].
    ///
    /// ```
    /// use prost::Message;
    /// use rate_tier_service::wire::{WireDescriptor, WireEntry, WireRequest};
    /// use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    ///
    /// let wire = WireRequest {
    ///     domain: b"edge".to_vec(),
    ///     descriptors: vec![WireDescriptor {
    ///         entries: vec![WireEntry { key: b"path".to_vec(), value: vec![0xc3, 0x28] }],
    ///         ..Default::default()
    ///     }],
    ///     hits_addend: 2,
    /// };
    /// // The same bytes as Envoy's own message, when every string is UTF-8.
    /// let request = RateLimitRequest::from(wire.clone());
    /// assert_eq!(request.domain, "edge");
    /// assert_eq!(request.descriptors[0].entries[0].value, "\0c328");
    /// assert_eq!(request.hits_addend, 2);
    /// ```
    fn from(wire: WireRequest) -> Self {
        RateLimitRequest {
            domain: text(wire.domain),
            descriptors: wire
                .descriptors
                .into_iter()
                .map(|d| RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: text(e.key),
                            value: text(e.value),
                        })
                        .collect(),
                    limit: d.limit,
                    hits_addend: d.hits_addend,
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
            hits_addend: wire.hits_addend,
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::*;

    #[test]
    fn a_utf8_request_decodes_as_envoy_s_own_message() {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".into(),
                    value: "203.0.113.7".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 5,
                    unit: 2,
                }),
                hits_addend: Some(UInt64Value { value: 3 }),
                is_negative_hits: true,
            }],
            hits_addend: 7,
        };
        let bytes = request.encode_to_vec();
        let wire = WireRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(wire.encoded_len(), bytes.len());
        assert_eq!(RateLimitRequest::from(wire), request);
    }

    #[test]
    fn descriptors_are_counted_in_no_memory() {
        assert_eq!(std::mem::size_of::<Skipped>(), 0);
        let empty_descriptors = [0x12, 0x00].repeat(500_000);
        let counted = Counted::decode(empty_descriptors.as_slice()).unwrap();
        assert_eq!(counted.descriptors.len(), 500_000);
    }

    #[test]
    fn distinct_bytes_stay_distinct_and_never_pass_for_utf8() {
        let values =
            [vec![0xff], vec![0xfe], b"ff".to_vec(), vec![0, b'f', b'f']];
        let texts: Vec<String> = values.iter().cloned().map(text).collect();
        for (i, a) in texts.iter().enumerate() {
            for b in &texts[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
