//! The standalone service's inputs: its YAML config, `ShouldRateLimit`
//! from raw protobuf bytes, `POST /json` bodies; and the layer's TOML tiers.

use std::sync::{Arc, LazyLock};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use prost::Message;
use rate_tier_service::config::Unit;
use rate_tier_service::decide::{Incoming, Oversized};
use rate_tier_service::wire::{self, WireRequest};
use rate_tier_service::{
    Config, DecideError, DecideOptions, Decider, Metrics, RequestLimits, json,
};
use rate_tier_storage::MemoryStorage;

use crate::now;

/// A config with every kind of rule: values, wildcards, nesting,
/// `unlimited`, `shadow_mode`, `replaces`, a limit of 0.
const RULES: &str = "\
domain: fuzz
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {name: api, unit: minute, requests_per_unit: 100}
  - key: path
    value: /free
    rate_limit: {unlimited: true, name: free}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10, name: generic}
    descriptors:
      - key: plan
        value: pro
        rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: vip
    rate_limit:
      unit: day
      requests_per_unit: 3
      replaces: [{name: generic}]
  - key: watch
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: never
    rate_limit: {unit: minute, requests_per_unit: 0}
";

/// Bounds small enough for fuzz inputs (a few KiB) to cross both.
const LIMITS: RequestLimits = RequestLimits {
    max_descriptors: 8,
    max_request_bytes: 1024,
};

static DECIDER: LazyLock<Decider> = LazyLock::new(|| {
    let config = match Config::from_yaml("fuzz.yaml", RULES) {
        Ok(config) => config,
        Err(error) => panic!("the fuzz config: {error}"),
    };
    Decider::new(
        config,
        Arc::new(MemoryStorage::new()),
        DecideOptions {
            limits: LIMITS,
            ..DecideOptions::default()
        },
        Arc::new(Metrics::new(None)),
    )
});

/// What a transport read of `data` (`read`, within [`LIMITS`]) against the
/// same bytes read whole (`whole`): within the bounds, the same request;
/// beyond one, a bound that holds; an error only for bytes that are not a
/// request. Then the answer: decided, or one refusal.
fn read_within_bounds<E: std::fmt::Debug>(
    data: &[u8],
    read: Result<Incoming, E>,
    whole: impl FnOnce() -> Result<RateLimitRequest, E>,
) {
    let incoming = match read {
        Ok(incoming) => incoming,
        Err(error) => {
            assert!(data.len() <= LIMITS.max_request_bytes);
            assert!(whole().is_err(), "refused, but reads whole: {error:?}");
            return;
        }
    };
    match &incoming {
        Incoming::Request(request) => {
            assert!(data.len() <= LIMITS.max_request_bytes);
            assert!(request.descriptors.len() <= LIMITS.max_descriptors);
            match whole() {
                Ok(whole) => assert_eq!(&whole, request),
                Err(error) => panic!("read, but not whole: {error:?}"),
            }
            decided(request);
        }
        Incoming::Oversized(Oversized::Bytes) => {
            assert!(data.len() > LIMITS.max_request_bytes);
            refused(&incoming);
        }
        Incoming::Oversized(Oversized::Descriptors) => {
            assert!(data.len() <= LIMITS.max_request_bytes);
            if let Ok(whole) = whole() {
                assert!(whole.descriptors.len() > LIMITS.max_descriptors);
            }
            refused(&incoming);
        }
    }
}

/// The answer to a request beyond a bound: one refusal, never an error.
fn refused(incoming: &Incoming) {
    match now(DECIDER.answer(incoming, "fuzz")) {
        Ok(response) => {
            assert_eq!(response.overall_code, Code::OverLimit as i32);
            assert_eq!(response.statuses.len(), 1);
            assert_eq!(response.statuses[0].code, Code::OverLimit as i32);
        }
        Err(error) => panic!("an error for an oversized request: {error}"),
    }
}

/// A decision of the service: never an error but for what only a broken
/// gateway sends, and one status per descriptor.
fn decided(request: &RateLimitRequest) {
    match now(DECIDER.decide(request, "fuzz")) {
        Ok(response) => {
            assert_eq!(response.statuses.len(), request.descriptors.len());
            let over = response
                .statuses
                .iter()
                .any(|s| s.code == Code::OverLimit as i32);
            if response.overall_code == Code::OverLimit as i32 {
                assert!(over, "refused with no descriptor over its limit");
            }
        }
        Err(DecideError::InvalidArgument(message)) => {
            let bad_unit = request.descriptors.iter().any(|d| {
                d.limit
                    .as_ref()
                    .is_some_and(|l| Unit::from_proto(l.unit).is_none())
            });
            assert!(
                request.domain.is_empty()
                    || request.descriptors.is_empty()
                    || bad_unit,
                "an error for a request a gateway's client may shape: {message}"
            );
        }
        Err(DecideError::Store(error)) => {
            panic!("the memory store failed: {error}")
        }
        Err(error) => panic!("{error}"),
    }
}

/// `ShouldRateLimit` from any bytes a gRPC client sends, read within the
/// bounds as the service reads it.
pub fn rls_request(data: &[u8]) {
    read_within_bounds(data, wire::read_request(data, LIMITS), || {
        WireRequest::decode(data).map(RateLimitRequest::from)
    });
}

/// `POST /json` from any body, read within the bounds as the service
/// reads it.
pub fn json_body(data: &[u8]) {
    read_within_bounds(data, json::read_request(data, LIMITS), || {
        json::parse_request(data)
    });
}

/// The service's YAML config: accepted, or an error naming the file.
pub fn service_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(error) = Config::from_yaml("fuzz.yaml", text) {
        let shown = error.to_string();
        assert!(shown.starts_with("fuzz.yaml"), "{shown}");
    }
}

/// The layer's TOML tiers: built, or an error.
pub fn plans_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(builder) = tower_rate_tier::Tiers::builder().from_toml(text) {
        let _ = builder.build();
    }
}
