//! The standalone service's inputs: its YAML config, `ShouldRateLimit`
//! from raw protobuf bytes, `POST /json` bodies; and the layer's TOML plans.

use std::sync::{Arc, LazyLock};

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use prost::Message;
use rate_tier_service::config::Unit;
use rate_tier_service::wire::WireRequest;
use rate_tier_service::{
    Config, DecideError, DecideOptions, Decider, Metrics, json,
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

static DECIDER: LazyLock<Decider> = LazyLock::new(|| {
    let config = match Config::from_yaml("fuzz.yaml", RULES) {
        Ok(config) => config,
        Err(error) => panic!("the fuzz config: {error}"),
    };
    Decider::new(
        config,
        Arc::new(MemoryStorage::new()),
        DecideOptions::default(),
        Arc::new(Metrics::new(None)),
    )
});

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

/// `ShouldRateLimit` from any bytes a gRPC client sends.
pub fn rls_request(data: &[u8]) {
    if let Ok(wire) = WireRequest::decode(data) {
        decided(&RateLimitRequest::from(wire));
    }
}

/// `POST /json` from any body.
pub fn json_body(data: &[u8]) {
    if let Ok(request) = json::parse_request(data) {
        decided(&request);
    }
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

/// The layer's TOML plans: built, or an error.
pub fn plans_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(builder) = tower_rate_tier::Plans::builder().from_toml(text) {
        let _ = builder.build();
    }
}
