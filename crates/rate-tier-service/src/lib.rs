//! A GCRA drop-in for [envoyproxy/ratelimit]: the standalone decision
//! service that Envoy, Istio, Envoy Gateway and Contour call
//! (`envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`), with the
//! same YAML config, on tower-rate-tier's storage: memory, Redis, or a Redis
//! Cluster, with a local fallback behind a circuit breaker.
//!
//! ```text
//! cargo run -p rate-tier-service -- --config examples/ratelimit
//! ```
//!
//! serves gRPC on 127.0.0.1:8081 (RLS v3 and `grpc.health.v1.Health`),
//! HTTP on 127.0.0.1:8080 (`POST /json`, `GET /healthcheck`,
//! `GET /metrics`) and the debug listener on 127.0.0.1:6070 (`GET
//! /rlconfig`). See [`cli`] for the flags and envoyproxy/ratelimit's
//! environment variables, which configure it as they configure that
//! service. SIGTERM drains: health says not serving at once, requests are
//! answered for `--drain` (5 s), then the listeners close
//! ([`Running::stop_serving`]).
//!
//! With `--admin ADDR --admin-token-file FILE`, an admin API on a listener
//! of its own (loopback unless an address is given), behind a bearer token:
//! `POST /admin/reset` puts a descriptor's buckets back to full,
//! `POST /admin/peek` reads what remains of them without charging, and
//! `GET /admin/rules` lists the rules in use. See [`admin`] for the JSON
//! shapes, the token and the logs.
//!
//! # What differs from envoyproxy/ratelimit, and why
//!
//! - **GCRA instead of fixed windows.** `requests_per_unit: R` per `unit` is
//!   R at once, then one every `unit / R`: no burst of 2R across a window
//!   edge (upstream's issue #32). `limit_remaining` is what GCRA allows now,
//!   and `duration_until_reset` the time until the bucket is full again
//!   (rounded up to whole seconds), not the end of a window.
//! - **All or nothing.** The descriptors of one request are one decision:
//!   if one refuses, none is charged (upstream charges every descriptor).
//!   See [`decide`].
//! - **A local fallback.** With `--redis` or `--redis-cluster`, a Redis that
//!   fails or is slow (100 ms) opens a circuit breaker and the instance
//!   limits on its own until Redis answers again (upstream answers with an
//!   error, and Envoy's `failure_mode_deny` decides).
//! - **No input a gateway's client controls turns a limit off.** Values of
//!   any length and bytes that are not UTF-8 are decided like any other
//!   ([`wire`]); a request beyond the bounds of [`RequestLimits`] is read
//!   no further than the bound and refused with one `OVER_LIMIT` status,
//!   never an error: a gateway that fails open lets a request through on an
//!   error.
//! - **Errors.** An empty domain or no descriptors (what only a broken
//!   gateway sends) is `INVALID_ARGUMENT` (upstream: `UNKNOWN`); a store
//!   failure is `UNAVAILABLE`; on `/json`, 400 and 503.
//! - **Config.** The same format, checked by the same rules with the same
//!   messages, plus the line; `quota_mode`, `detailed_metric`,
//!   `value_to_metric` and `metadata` are accepted and ignored (see
//!   [`config`]). The service does not start without a valid config
//!   (upstream starts and answers errors), nor with no config file at all;
//!   a reload that finds no config file keeps the config in use.
//!
//! # In a program
//!
//! The service is a library too: [`Service::start`] runs it on a Tokio
//! runtime (the addresses may be port 0), [`Decider`] decides without a
//! network, and [`client::RlsStorage`] is the other side: a
//! [`Storage`](rate_tier_storage::Storage) that asks an RLS server, for the
//! Tower layer.
//!
//! ```
//! use std::sync::Arc;
//! use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
//!     RateLimitDescriptor, rate_limit_descriptor::Entry,
//! };
//! use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
//! use rate_tier_service::{Config, DecideOptions, Decider, Metrics};
//! use rate_tier_storage::MemoryStorage;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = Config::from_yaml("rl.yaml", "
//! domain: edge
//! descriptors:
//!   - key: remote_address
//!     rate_limit: {unit: minute, requests_per_unit: 2}
//! ")?;
//! let decider = Decider::new(
//!     config,
//!     Arc::new(MemoryStorage::new()),
//!     DecideOptions::default(),
//!     Arc::new(Metrics::new(None)),
//! );
//! let request = RateLimitRequest {
//!     domain: "edge".into(),
//!     descriptors: vec![RateLimitDescriptor {
//!         entries: vec![Entry { key: "remote_address".into(), value: "10.0.0.1".into() }],
//!         ..Default::default()
//!     }],
//!     hits_addend: 0,
//! };
//! let first = decider.decide(&request, "doc").await?;
//! assert_eq!(first.overall_code, 1); // OK
//! assert_eq!(first.statuses[0].limit_remaining, 1);
//! decider.decide(&request, "doc").await?;
//! let third = decider.decide(&request, "doc").await?;
//! assert_eq!(third.overall_code, 2); // OVER_LIMIT
//! // 2 per minute: one comes back every 30 s; the bucket is full in 60 s.
//! assert_eq!(third.statuses[0].duration_until_reset.as_ref().map(|d| d.seconds), Some(60));
//! # Ok(()) }
//! ```
//!
//! [envoyproxy/ratelimit]: https://github.com/envoyproxy/ratelimit
#![warn(clippy::unwrap_used)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod admin;
pub mod cli;
pub mod client;
pub mod config;
mod debug;
pub mod decide;
pub mod grpc;
mod headers;
pub mod http;
pub mod json;
mod metrics;
mod reload;
pub mod runtime;
pub mod server;
mod status;
pub mod wire;

pub use admin::AdminOptions;
pub use config::{Config, ConfigError};
pub use decide::{
    DecideError, DecideOptions, Decider, Incoming, Oversized, RequestLimits,
};
pub use metrics::Metrics;
pub use server::{Running, Service, ServiceOptions, StartError, StoreChoice};

/// The Envoy protos this crate speaks (from the `envoy-types` crate).
pub use envoy_types;
