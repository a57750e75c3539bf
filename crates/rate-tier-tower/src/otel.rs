//! The limiter's metrics as OpenTelemetry instruments.

use std::borrow::Cow;
use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram, Meter};

use crate::recorded::{self, Labels, Metric, Sink};

/// The limiter's metrics as OpenTelemetry instruments of a [`Meter`]: the
/// counters, histograms (seconds) and breaker gauge of
/// [`RateLimitMetrics`](crate::metrics::RateLimitMetrics), named so that
/// an exporter to Prometheus gives its names back (`rate_tier.checks`
/// becomes `rate_tier_checks_total`, `rate_tier.check.duration` in `s`
/// becomes `rate_tier_check_duration_seconds`), with the same labels as
/// attributes. Give it to
/// [`RateTierBuilder::observe`](crate::RateTierBuilder::observe), and to a
/// shaper's [`observe`](crate::shape::ShapeLayerBuilder::observe). Cheap to
/// clone; clones share the instruments.
///
/// ```
/// use opentelemetry::metrics::MeterProvider;
/// use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
/// use tower_rate_tier::observe::OtelMetrics;
/// use tower_rate_tier::{Quota, RateTier};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let exporter = InMemoryMetricExporter::default();
/// let provider = SdkMeterProvider::builder()
///     .with_reader(PeriodicReader::builder(exporter.clone()).build())
///     .build();
/// let limiter = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .observe(OtelMetrics::new(&provider.meter("my-api")))
///     .build();
/// limiter.check("ana", "free", 1).await.unwrap().unwrap();
/// provider.force_flush().unwrap();
/// let exported = exporter.get_finished_metrics().unwrap();
/// let names: Vec<String> = exported
///     .iter()
///     .flat_map(|r| r.scope_metrics())
///     .flat_map(|s| s.metrics())
///     .map(|m| m.name().to_owned())
///     .collect();
/// assert!(names.contains(&"rate_tier.checks".to_owned()), "{names:?}");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct OtelMetrics {
    inner: Arc<Instruments>,
}

#[derive(Debug)]
struct Instruments {
    counters: Vec<(Metric, Counter<u64>)>,
    histograms: Vec<(Metric, Histogram<f64>)>,
    breaker: Gauge<i64>,
}

/// Each counter: its metric and its OpenTelemetry name.
const COUNTERS: [(Metric, &str); 12] = [
    (Metric::Checks, "rate_tier.checks"),
    (Metric::UnknownTier, "rate_tier.unknown_tier"),
    (Metric::MissingIdentity, "rate_tier.missing_identity"),
    (Metric::StorageErrors, "rate_tier.storage_errors"),
    (Metric::ShadowLimited, "rate_tier.shadow_limited"),
    (Metric::Evictions, "rate_tier.evictions"),
    (Metric::FallbackDecisions, "rate_tier.fallback_decisions"),
    (Metric::BreakerTransitions, "rate_tier.breaker.transitions"),
    (Metric::Waits, "rate_tier.waits"),
    (Metric::NearLimit, "rate_tier.near_limit"),
    (Metric::WaitRefused, "rate_tier.wait_refused"),
    (Metric::ShapedCalls, "rate_tier.shaped.calls"),
];

/// Each histogram (in seconds): its metric and its OpenTelemetry name.
const HISTOGRAMS: [(Metric, &str); 3] = [
    (Metric::CheckDuration, "rate_tier.check.duration"),
    (Metric::WaitDuration, "rate_tier.wait"),
    (Metric::ShapedWait, "rate_tier.shaped.wait"),
];

impl OtelMetrics {
    /// The instruments, made with `meter`.
    pub fn new(meter: &Meter) -> Self {
        let counters = COUNTERS
            .iter()
            .map(|&(metric, name)| (metric, meter.u64_counter(name).build()))
            .collect();
        let histograms = HISTOGRAMS
            .iter()
            .map(|&(metric, name)| {
                (metric, meter.f64_histogram(name).with_unit("s").build())
            })
            .collect();
        let breaker = meter
            .i64_gauge("rate_tier.breaker.state")
            .with_description("0 closed, 1 half-open, 2 open")
            .build();
        OtelMetrics {
            inner: Arc::new(Instruments {
                counters,
                histograms,
                breaker,
            }),
        }
    }
}

fn attributes(labels: Labels<'_>) -> Vec<KeyValue> {
    labels
        .iter()
        .map(|&(key, value)| KeyValue::new(key, value))
        .collect()
}

impl Sink for OtelMetrics {
    fn add(&self, metric: Metric, labels: Labels<'_>) {
        if let Some((_, counter)) =
            self.inner.counters.iter().find(|(m, _)| *m == metric)
        {
            counter.add(1, &attributes(labels));
        }
    }

    fn record(&self, metric: Metric, seconds: f64, labels: Labels<'_>) {
        if let Some((_, histogram)) =
            self.inner.histograms.iter().find(|(m, _)| *m == metric)
        {
            histogram.record(seconds, &attributes(labels));
        }
    }

    fn breaker(&self, domain: Cow<'static, str>, state: i64) {
        self.inner
            .breaker
            .record(state, &[KeyValue::new("domain", domain.into_owned())]);
    }
}

recorded::observer_of_sink!(OtelMetrics);
