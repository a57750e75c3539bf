//! `POST /json`: a `RateLimitRequest` in proto3 JSON, the
//! `RateLimitResponse` back in proto3 JSON.
//!
//! The mapping is the protobuf one, for the few messages involved (the
//! Envoy protos crate has no serde support):
//!
//! - field names in lowerCamelCase or as in the proto (`hitsAddend` or
//!   `hits_addend`); an unknown field is an error, and so is a field given
//!   twice under its two names;
//! - integers as JSON numbers or strings (`"5"`); `null` is the default;
//! - enums by name (`"MINUTE"`) or number (`2`);
//! - in the response, default values are left out, enums are names, a
//!   `Duration` is a string of seconds (`"42s"`).
//!
//! ```
//! use rate_tier_service::json;
//! let request = json::parse_request(br#"{"domain":"edge",
//!     "descriptors":[{"entries":[{"key":"k","value":"v"}],"hits_addend":"0"}]}"#)?;
//! assert_eq!(request.domain, "edge");
//! assert_eq!(request.descriptors[0].hits_addend.as_ref().map(|h| h.value), Some(0));
//!
//! let error = json::parse_request(br#"{"domain":"edge","descriptor":[]}"#).unwrap_err();
//! assert!(error.starts_with("unknown field `descriptor`"), "{error}");
//! # Ok::<(), String>(())
//! ```

use std::fmt;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, Visitor};
use serde_json::{Map, Value, json};

use crate::config::Unit;
use crate::decide::{Incoming, Oversized, RequestLimits};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename = "RateLimitRequest")]
struct JsonRequest {
    #[serde(default, deserialize_with = "text")]
    domain: String,
    #[serde(default, deserialize_with = "list")]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hitsAddend", deserialize_with = "uint32")]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default, deserialize_with = "list")]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonOverride>,
    #[serde(
        default,
        alias = "hitsAddend",
        deserialize_with = "wrapper_uint64"
    )]
    hits_addend: Option<u64>,
    #[serde(default, alias = "isNegativeHits", deserialize_with = "flag")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default, deserialize_with = "text")]
    key: String,
    #[serde(default, deserialize_with = "text")]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonOverride {
    #[serde(default, alias = "requestsPerUnit", deserialize_with = "uint32")]
    requests_per_unit: u32,
    #[serde(default, deserialize_with = "override_unit")]
    unit: i32,
}

fn text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

fn list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Vec<T>, D::Error> {
    Ok(Option::<Vec<T>>::deserialize(d)?.unwrap_or_default())
}

fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or_default())
}

/// An unsigned integer, as a number or a string; `None` for null.
struct Unsigned {
    max: u64,
    what: &'static str,
}

impl<'de> Visitor<'de> for Unsigned {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a {} (a number or a string of digits)", self.what)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        if v > self.max {
            return Err(E::custom(format_args!(
                "{v} is out of range for a {}",
                self.what
            )));
        }
        Ok(Some(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(E::custom(format_args!(
                "{v} is out of range for a {}",
                self.what
            ))),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        if v.fract() == 0.0 && v >= 0.0 && v <= self.max as f64 {
            // Integral and in range: exact.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            return Ok(Some(v as u64));
        }
        Err(E::custom(format_args!("{v} is not a {}", self.what)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        match v.parse::<u64>() {
            Ok(n) => self.visit_u64(n),
            Err(_) => {
                Err(E::custom(format_args!("{v:?} is not a {}", self.what)))
            }
        }
    }
}

fn uint32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = d.deserialize_any(Unsigned {
        max: u64::from(u32::MAX),
        what: "uint32",
    })?;
    Ok(v.map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX)))
}

fn wrapper_uint64<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    d.deserialize_any(Unsigned {
        max: u64::MAX,
        what: "uint64",
    })
}

/// `envoy.type.v3.RateLimitUnit` by name or number (7, WEEK, is read too:
/// upstream reads the override's unit by number).
fn override_unit<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    struct UnitVisitor;
    impl<'de> Visitor<'de> for UnitVisitor {
        type Value = i32;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(
                "a unit: SECOND, MINUTE, HOUR, DAY, MONTH, YEAR, or its number",
            )
        }

        fn visit_unit<E: de::Error>(self) -> Result<i32, E> {
            Ok(0)
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<i32, E> {
            i32::try_from(v).map_err(|_| {
                E::custom(format_args!("unit {v} is out of range"))
            })
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<i32, E> {
            i32::try_from(v).map_err(|_| {
                E::custom(format_args!("unit {v} is out of range"))
            })
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<i32, E> {
            if v == "UNKNOWN" {
                return Ok(0);
            }
            match Unit::ALL.into_iter().find(|u| u.name() == v) {
                Some(unit) => Ok(unit.proto()),
                None => Err(E::custom(format_args!("unknown unit {v:?}"))),
            }
        }
    }
    d.deserialize_any(UnitVisitor)
}

/// A request with its descriptors counted, not kept: a descriptor read as
/// [`IgnoredAny`] takes no memory. The fields of [`JsonRequest`], in its
/// order (serde also reads a struct from an array), the others skipped.
#[derive(Deserialize)]
#[serde(rename = "RateLimitRequest")]
struct Counted {
    #[serde(default, rename = "domain")]
    _domain: IgnoredAny,
    #[serde(default, deserialize_with = "count")]
    descriptors: usize,
    #[serde(default, rename = "hits_addend", alias = "hitsAddend")]
    _hits_addend: IgnoredAny,
}

fn count<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    Ok(Option::<Vec<IgnoredAny>>::deserialize(d)?.map_or(0, |v| v.len()))
}

/// Reads a `RateLimitRequest` from proto3 JSON within `limits`: the
/// body's length first, then its descriptors counted without keeping one;
/// only a body within both bounds is parsed ([`parse_request`]).
///
/// ```
/// use rate_tier_service::decide::{Incoming, Oversized};
/// use rate_tier_service::{RequestLimits, json};
/// let limits = RequestLimits { max_descriptors: 2, max_request_bytes: 80 };
/// let body = |descriptors: &str| format!(r#"{{"domain":"edge","descriptors":[{descriptors}]}}"#);
/// let Incoming::Request(request) = json::read_request(body("{},{}").as_bytes(), limits)? else {
///     panic!()
/// };
/// assert_eq!(request.descriptors.len(), 2);
/// let three = json::read_request(body("{},{},{}").as_bytes(), limits)?;
/// assert_eq!(three, Incoming::Oversized(Oversized::Descriptors));
/// let long = json::read_request(body(&["{}"; 40].join(",")).as_bytes(), limits)?;
/// assert_eq!(long, Incoming::Oversized(Oversized::Bytes));
/// # Ok::<(), String>(())
/// ```
///
/// # Errors
///
/// As [`parse_request`].
pub fn read_request(
    body: &[u8],
    limits: RequestLimits,
) -> Result<Incoming, String> {
    if body.len() > limits.max_request_bytes {
        return Ok(Incoming::Oversized(Oversized::Bytes));
    }
    let counted: Counted =
        serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if counted.descriptors > limits.max_descriptors {
        return Ok(Incoming::Oversized(Oversized::Descriptors));
    }
    parse_request(body).map(Incoming::Request)
}

/// Reads a `RateLimitRequest` from proto3 JSON, whatever its size (see
/// [`read_request`] for a body from a client).
///
/// # Errors
///
/// The reason, for a `400 Bad Request`: not JSON, an unknown field, a
/// value of the wrong type.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let request: JsonRequest =
        serde_json::from_slice(body).map_err(|e| e.to_string())?;
    Ok(RateLimitRequest {
        domain: request.domain,
        descriptors: request
            .descriptors
            .into_iter()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .entries
                    .into_iter()
                    .map(|e| Entry {
                        key: e.key,
                        value: e.value,
                    })
                    .collect(),
                limit: d.limit.map(|l| RateLimitOverride {
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit,
                }),
                hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                is_negative_hits: d.is_negative_hits,
            })
            .collect(),
        hits_addend: request.hits_addend,
    })
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

/// Writes a `RateLimitResponse` in proto3 JSON (defaults left out).
///
/// ```
/// use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
/// let mut response = RateLimitResponse::default();
/// response.overall_code = 2;
/// assert_eq!(rate_tier_service::json::write_response(&response), r#"{"overallCode":"OVER_LIMIT"}"#);
/// ```
pub fn write_response(response: &RateLimitResponse) -> String {
    let mut out = Map::new();
    if response.overall_code != 0 {
        out.insert(
            "overallCode".into(),
            code_name(response.overall_code).into(),
        );
    }
    if !response.statuses.is_empty() {
        let statuses = response
            .statuses
            .iter()
            .map(|s| {
                let mut status = Map::new();
                if s.code != 0 {
                    status.insert("code".into(), code_name(s.code).into());
                }
                if let Some(limit) = &s.current_limit {
                    let mut l = Map::new();
                    if !limit.name.is_empty() {
                        l.insert("name".into(), limit.name.clone().into());
                    }
                    if limit.requests_per_unit != 0 {
                        l.insert(
                            "requestsPerUnit".into(),
                            limit.requests_per_unit.into(),
                        );
                    }
                    if limit.unit != 0 {
                        let name = Unit::from_proto(limit.unit)
                            .map_or("UNKNOWN", Unit::name);
                        l.insert("unit".into(), name.into());
                    }
                    status.insert("currentLimit".into(), Value::Object(l));
                }
                if s.limit_remaining != 0 {
                    status.insert(
                        "limitRemaining".into(),
                        s.limit_remaining.into(),
                    );
                }
                if let Some(d) = &s.duration_until_reset {
                    let text = if d.nanos == 0 {
                        format!("{}s", d.seconds)
                    } else {
                        format!("{}.{:09}s", d.seconds, d.nanos)
                    };
                    status.insert("durationUntilReset".into(), text.into());
                }
                Value::Object(status)
            })
            .collect();
        out.insert("statuses".into(), Value::Array(statuses));
    }
    if !response.response_headers_to_add.is_empty() {
        let headers = response
            .response_headers_to_add
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    Value::Object(out).to_string()
}
