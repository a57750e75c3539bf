//! The three hello-world apps that the HTTP benchmarks compare: no layer,
//! `TierLimitLayer` on the memory store, and tower_governor's layer,
//! configured alike (http.rs serves them; instructions.rs calls them in
//! process).

use axum::Router;
use axum::routing::get;
use http::Request;
use tower_governor::GovernorLayer;
use tower_governor::errors::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};

pub(crate) const API_KEY: &str = "x-api-key";
/// A rate no load generator here reaches: nothing is ever refused.
pub(crate) const RATE: u32 = 1_000_000;

async fn hello() -> &'static str {
    "Hello, World!"
}

pub(crate) fn no_layer() -> Router {
    Router::new().route("/", get(hello))
}

pub(crate) fn with_tower_rate_tier() -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_second(RATE))
        .build();
    let layer = TierLimitLayer::new(tiers).identifier_fn(|headers| {
        let key = headers.get(API_KEY)?.to_str().ok()?;
        Some(TierIdentity::new(key, "free"))
    });
    no_layer().layer(layer)
}

/// tower_governor keyed by the same header, as its README's custom keys do.
#[derive(Clone)]
struct ApiKey;

impl KeyExtractor for ApiKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<String, GovernorError> {
        req.headers()
            .get(API_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

pub(crate) fn with_tower_governor() -> Router {
    // The same quota: 1 per µs, burst of a second's worth; `use_headers` so
    // that it also answers x-ratelimit-limit and -remaining, as ours does.
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1_000_000_000 / u64::from(RATE))
        .burst_size(RATE)
        .key_extractor(ApiKey)
        .use_headers()
        .finish()
        .unwrap();
    no_layer().layer(GovernorLayer::new(config))
}
