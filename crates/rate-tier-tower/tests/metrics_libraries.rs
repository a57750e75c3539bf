#![cfg_attr(
    not(all(
        feature = "metrics",
        any(feature = "metrics-facade", feature = "opentelemetry")
    )),
    allow(missing_docs)
)]
//! `FacadeMetrics` through the `metrics` facade's in-process recorder
//! (metrics-util's `DebuggingRecorder`), and `OtelMetrics` through the
//! OpenTelemetry SDK's in-memory exporter, each against `RateLimitMetrics`
//! on the same traffic: the same names (as a Prometheus exporter writes
//! them), labels and values, so that one dashboard reads any of them.
// Both sides of each comparison: an exporter library and our metrics.
#![cfg(all(
    feature = "metrics",
    any(feature = "metrics-facade", feature = "opentelemetry")
))]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use prometheus_parse::{Scrape, Value};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::metrics::RateLimitMetrics;
use tower_rate_tier::metrics::prometheus_client::encoding::text::encode;
use tower_rate_tier::metrics::prometheus_client::registry::Registry;
use tower_rate_tier::observe::Observer;
use tower_rate_tier::policy::OnUnknownTier;
use tower_rate_tier::{Quota, RateTier};

/// A sample: its name and its labels, sorted.
type Series = (String, Vec<(String, String)>);

/// The same traffic on a limiter observed by `observer`: passes, a
/// refusal, an unknown tier.
fn traffic(observer: impl Observer) {
    let clock = FakeClock::new();
    let limiter = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(2))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .on_unknown_tier(OnUnknownTier::UseDefault)
        .observe(observer)
        .build();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        for _ in 0..2 {
            assert!(limiter.check("ana", "free", 1).await.unwrap().is_ok());
        }
        assert!(limiter.check("ana", "free", 1).await.unwrap().is_err());
        assert!(limiter.check("bea", "pro", 1).await.unwrap().is_ok());
        assert!(limiter.check("eva", "gold", 1).await.unwrap().is_ok());
    });
}

/// The facade's counters and gauges, and its histograms' counts.
#[cfg(feature = "metrics-facade")]
fn facade() -> BTreeMap<Series, f64> {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tower_rate_tier::observe::FacadeMetrics;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || traffic(FacadeMetrics::new()));
    let mut series = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<(String, String)> = key
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        labels.sort();
        let (name, value) = match value {
            DebugValue::Counter(n) => (key.name().to_owned(), n as f64),
            DebugValue::Gauge(g) => (key.name().to_owned(), g.into_inner()),
            DebugValue::Histogram(values) => {
                (format!("{}_count", key.name()), values.len() as f64)
            }
        };
        series.insert((name, labels), value);
    }
    series
}

/// The Prometheus exposition of `RateLimitMetrics` on the same traffic.
fn prometheus() -> BTreeMap<Series, f64> {
    let mut registry = Registry::default();
    let metrics = RateLimitMetrics::new(&mut registry);
    traffic(metrics);
    let mut text = String::new();
    encode(&mut text, &registry).unwrap();
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let mut series = BTreeMap::new();
    for sample in scrape.samples {
        let mut labels: Vec<(String, String)> = sample
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.sort();
        let (name, value) = match sample.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => {
                (sample.metric.clone(), v)
            }
            Value::Histogram(buckets) => (
                format!("{}_count", sample.metric),
                buckets.last().map_or(0.0, |b| b.count),
            ),
            Value::Summary(_) => continue,
        };
        series.insert((name, labels), value);
    }
    series
}

/// Every series `recorded` holds, Prometheus exposes with the same value.
fn assert_exposed_alike(recorded: &BTreeMap<Series, f64>) {
    let prometheus = prometheus();
    assert!(!recorded.is_empty());
    for (series, value) in recorded {
        assert_eq!(
            prometheus.get(series),
            Some(value),
            "{series:?}: recorded {value}; Prometheus: {prometheus:#?}"
        );
    }
    let checks = |outcome: &str, tier: &str| {
        recorded.get(&(
            "rate_tier_checks_total".to_owned(),
            vec![
                ("outcome".to_owned(), outcome.to_owned()),
                ("tier".to_owned(), tier.to_owned()),
            ],
        ))
    };
    assert_eq!(
        checks("allowed", "free"),
        Some(&3.0),
        "ana twice, eva's default"
    );
    assert_eq!(checks("limited", "free"), Some(&1.0));
    assert_eq!(checks("allowed", "pro"), Some(&1.0));
    let unknown = (
        "rate_tier_unknown_tier_total".to_owned(),
        vec![("policy".to_owned(), "use_default".to_owned())],
    );
    assert_eq!(recorded.get(&unknown), Some(&1.0));
}

#[cfg(feature = "metrics-facade")]
#[test]
fn the_facade_records_what_the_prometheus_metrics_expose() {
    assert_exposed_alike(&facade());
}

/// The OpenTelemetry instruments' sums, gauges and histograms' counts,
/// under the names a Prometheus exporter gives them.
#[cfg(feature = "opentelemetry")]
fn otel() -> BTreeMap<Series, f64> {
    use opentelemetry::metrics::MeterProvider;
    use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
    use opentelemetry_sdk::metrics::{
        InMemoryMetricExporter, PeriodicReader, SdkMeterProvider,
    };
    use tower_rate_tier::observe::OtelMetrics;

    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    traffic(OtelMetrics::new(&provider.meter("test")));
    provider.force_flush().unwrap();
    let labels_of =
        |attributes: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
            let mut labels: Vec<(String, String)> = attributes
                .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                .collect();
            labels.sort();
            labels
        };
    let mut series = BTreeMap::new();
    let exported = exporter.get_finished_metrics().unwrap();
    // The last export holds every instrument's cumulative state.
    let last = exported.last().expect("an export");
    for metric in last.scope_metrics().flat_map(|scope| scope.metrics()) {
        let name = metric.name().replace('.', "_");
        match metric.data() {
            AggregatedMetrics::U64(MetricData::Sum(sum)) => {
                for point in sum.data_points() {
                    let labels = labels_of(&mut point.attributes());
                    series.insert(
                        (format!("{name}_total"), labels),
                        point.value() as f64,
                    );
                }
            }
            AggregatedMetrics::F64(MetricData::Histogram(histogram)) => {
                for point in histogram.data_points() {
                    let labels = labels_of(&mut point.attributes());
                    series.insert(
                        (format!("{name}_seconds_count"), labels),
                        point.count() as f64,
                    );
                }
            }
            AggregatedMetrics::I64(MetricData::Gauge(gauge)) => {
                for point in gauge.data_points() {
                    let labels = labels_of(&mut point.attributes());
                    series.insert((name.clone(), labels), point.value() as f64);
                }
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    series
}

#[cfg(feature = "opentelemetry")]
#[test]
fn opentelemetry_records_what_the_prometheus_metrics_expose() {
    assert_exposed_alike(&otel());
}
