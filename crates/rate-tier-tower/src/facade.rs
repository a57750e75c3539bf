//! The limiter's metrics through the [`metrics`] facade: whatever recorder
//! the application installed (metrics-exporter-prometheus, StatsD, ...)
//! receives them.

use std::borrow::Cow;

use crate::recorded::{self, Labels, Metric, Sink};

/// The limiter's metrics through the [`metrics`] facade, under the names
/// and labels of [`RateLimitMetrics`](crate::metrics::RateLimitMetrics)'s
/// Prometheus ones (`rate_tier_checks_total{tier,outcome}`,
/// `rate_tier_check_duration_seconds{storage}`, `rate_tier_breaker_state{domain}`,
/// ...), so that one dashboard reads either. Give it to
/// [`RateTierBuilder::observe`](crate::RateTierBuilder::observe), and to a
/// shaper's [`observe`](crate::shape::ShapeLayerBuilder::observe) for
/// `rate_tier_shaped_calls_total{outcome}` and
/// `rate_tier_shaped_wait_seconds`.
///
/// Label values come from the configuration and fixed sets, never from a
/// request.
///
/// ```
/// use metrics_util::debugging::{DebugValue, DebuggingRecorder};
/// use tower_rate_tier::observe::FacadeMetrics;
/// use tower_rate_tier::{Quota, RateTier};
///
/// let recorder = DebuggingRecorder::new();
/// let snapshotter = recorder.snapshotter();
/// metrics::with_local_recorder(&recorder, || {
///     let limiter = RateTier::builder()
///         .tier("free", Quota::per_minute(1))
///         .observe(FacadeMetrics::new())
///         .build();
///     let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
///     runtime.block_on(async {
///         assert!(limiter.check("ana", "free", 1).await.unwrap().is_ok());
///         assert!(limiter.check("ana", "free", 1).await.unwrap().is_err());
///     });
/// });
/// let refused = snapshotter.snapshot().into_vec().into_iter().find(|(key, ..)| {
///     let key = key.key();
///     key.name() == "rate_tier_checks_total"
///         && key.labels().any(|l| l.key() == "outcome" && l.value() == "limited")
/// });
/// assert!(matches!(refused, Some((_, _, _, DebugValue::Counter(1)))));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct FacadeMetrics;

impl FacadeMetrics {
    /// The observer: it holds nothing, the recorder does.
    pub fn new() -> Self {
        FacadeMetrics
    }
}

recorded::observer_of_sink!(FacadeMetrics);

impl Sink for FacadeMetrics {
    fn add(&self, metric: Metric, labels: Labels<'_>) {
        metrics::counter!(metric.name(), labels_of(labels)).increment(1);
    }

    fn record(&self, metric: Metric, seconds: f64, labels: Labels<'_>) {
        metrics::histogram!(metric.name(), labels_of(labels)).record(seconds);
    }

    fn breaker(&self, domain: Cow<'static, str>, state: i64) {
        metrics::gauge!(Metric::BreakerState.name(), "domain" => domain)
            .set(state as f64);
    }
}

/// The facade's labels: every value is static, so none is copied.
fn labels_of(labels: Labels<'_>) -> Vec<metrics::Label> {
    labels
        .iter()
        .map(|&(key, value)| metrics::Label::from_static_parts(key, value))
        .collect()
}
