//! What observing the limiter costs: one request through `TierLimitLayer`
//! over a `tower::service_fn`, memory store, four ways in the same run:
//!
//! - `plain`: no observer, no tracing subscriber (the `tracing` feature is
//!   compiled in: this is its cost when nobody listens);
//! - `metrics`: `.observe(RateLimitMetrics)`, no subscriber;
//! - `tracing_info`: a `fmt` subscriber at `INFO` (the usual production
//!   level): the limiter's `DEBUG` span and event are filtered out;
//! - `tracing_debug`: a `fmt` subscriber at `DEBUG`, writing to a sink:
//!   the span and the event are built and formatted.
//!
//! `tracing/when_nobody_listens` times alone what the `tracing` feature adds
//! to a request when no subscriber is installed (the layer's level gate),
//! and `tracing/ungated_macros` what the span and `enabled!` macros would
//! cost without that gate (tracing's `log` feature is on in this build).
//!
//! `cargo bench -p tower-rate-tier --bench observe --features metrics,tracing -- --quick`
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::convert::Infallible;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderValue, Request, Response};
use support::hot::ready;
use tower::{Layer, Service, service_fn};
use tower_rate_tier::metrics::RateLimitMetrics;
use tower_rate_tier::metrics::prometheus_client::registry::Registry;
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
use tracing::Level;

/// Users the requests rotate over, so that the quota never runs out.
const USERS: usize = 1024;

fn layer() -> TierLimitLayer {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_second(1_000_000))
        .build();
    TierLimitLayer::new(tiers).identifier_fn(|headers| {
        let key = headers.get("x-api-key")?.to_str().ok()?;
        Some(TierIdentity::new(key, "free"))
    })
}

/// One request per iteration through `layer`, users in turn.
fn bench_layer(c: &mut Criterion, name: &str, layer: &TierLimitLayer) {
    let keys: Vec<HeaderValue> = (0..USERS)
        .map(|i| HeaderValue::from_str(&format!("user-{i:04}")).unwrap())
        .collect();
    let mut service = layer.layer(service_fn(|_: Request<()>| async {
        Ok::<_, Infallible>(Response::new(String::new()))
    }));
    let mut i = 0;
    c.bench_function(&format!("layer/one_request/{name}"), |b| {
        b.iter(|| {
            i = (i + 1) % USERS;
            let mut request = Request::new(());
            request.headers_mut().insert("x-api-key", keys[i].clone());
            let response = ready(service.call(request)).unwrap();
            assert_eq!(response.status(), 200);
            black_box(response)
        })
    });
}

fn observe(c: &mut Criterion) {
    // No subscriber has been installed yet: these run as in a service that
    // does not use tracing.
    c.bench_function("tracing/when_nobody_listens", |b| {
        b.iter(|| {
            use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
            black_box(
                Level::DEBUG <= STATIC_MAX_LEVEL
                    && Level::DEBUG <= LevelFilter::current(),
            )
        })
    });
    c.bench_function("tracing/ungated_macros", |b| {
        b.iter(|| {
            let span =
                tracing::debug_span!(target: "tower_rate_tier", "rate_limit");
            let entered = !span.is_disabled();
            let traced =
                tracing::enabled!(target: "tower_rate_tier", Level::DEBUG);
            black_box((entered, traced))
        })
    });
    bench_layer(c, "plain", &layer());

    let mut registry = Registry::default();
    let metrics = RateLimitMetrics::new(&mut registry);
    bench_layer(c, "metrics", &layer().observe(metrics));

    for (name, level) in [
        ("tracing_info", Level::INFO),
        ("tracing_debug", Level::DEBUG),
    ] {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::sink)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            bench_layer(c, name, &layer());
        });
    }
}

criterion_group!(benches, observe);
criterion_main!(benches);
