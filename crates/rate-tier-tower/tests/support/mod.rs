//! What the tests of tower-rate-tier share, in one place (each test binary
//! uses part of it):
//!
//! - [`fixtures`]: the 0.3 post's tiers, API keys and start time;
//! - [`http`]: a request through a `Router` or any service, its answer
//!   read back ([`http::Reply`]), and a sink for the events of a layer;
//! - [`scenarios`]: what every store must do through the limiter;
//! - [`stores`]: stores that fail, time out, or fail until told otherwise.
//!
//! Redis servers come from the workspace's `rate-tier-test-support` crate.
#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

pub mod fixtures;
pub mod http;
pub mod scenarios;
pub mod stores;
