//! The 0.3 post's tiers and its "database" of API keys, on a fake clock.

use http::StatusCode;
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::{OnMissing, Quota, RateTier, RateTierBuilder};

/// 2026-10-02 13:17:14.25 UTC: a quarter second past a whole second, so that
/// every `x-ratelimit-reset` has to be rounded up.
pub const START_US: u64 = 1_790_947_094_250_000;

/// The 0.3 example's "database": two known tiers and one the limiter does
/// not know.
pub fn plan_of(api_key: &str) -> Option<&'static str> {
    match api_key {
        "key_ana" => Some("free"),
        "key_bea" => Some("pro"),
        "key_eva" => Some("gold"),
        _ => None,
    }
}

/// The 0.3 example's tiers: free 10/min, pro 100/min, default free, 401
/// without a key.
pub fn post_plans(clock: &FakeClock) -> RateTierBuilder {
    RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
}
