//! Prometheus metrics for the limiter, with [`prometheus-client`], the
//! official Prometheus client for Rust.
//!
//! [`RateLimitMetrics`] registers its metrics in your
//! [`Registry`] under the prefix `rate_tier_`, and is the [`Observer`] you
//! give the limiter with
//! [`RateTierBuilder::observe`](crate::RateTierBuilder::observe) (every
//! check of every layer, and the store's events, each counted once):
//!
//! | metric | type | labels | counts |
//! |---|---|---|---|
//! | `rate_tier_checks_total` | counter | `tier`, `outcome` | every request that reached the limiter; `outcome` is [`Outcome::as_str`](crate::observe::Outcome::as_str) (`shadow_limited`: passed, but a limit in shadow mode would have refused), `tier` the configured tier whose quota applied, or `none` |
//! | `rate_tier_check_duration_seconds` | histogram | `storage` | time spent deciding (identity, cost, store), 1 µs .. 100 ms buckets; `storage` is the store that decided (`memory`, `redis`, `fallback` for a fallback's local decisions) |
//! | `rate_tier_shadow_limited_total` | counter | `limit` | would-be refusals of limits in shadow mode, by limit |
//! | `rate_tier_unknown_tier_total` | counter | `policy` | requests with a tier that is not configured, by [`OnUnknownTier`](crate::policy::OnUnknownTier) policy (`use_default`, `deny`, `allow`) |
//! | `rate_tier_missing_identity_total` | counter | | requests without an identity, whatever [`OnMissing`](crate::OnMissing) did |
//! | `rate_tier_storage_errors_total` | counter | `storage` | store failures that reached the [`OnStorageError`](crate::policy::OnStorageError) policy |
//! | `rate_tier_fallback_decisions_total` | counter | `allowed` | checks decided by the local fallback of a [`FallbackStorage`](crate::FallbackStorage) (`true`, `false`) |
//! | `rate_tier_breaker_state` | gauge | `domain` | each circuit breaker: 0 closed, 1 half-open, 2 open; `domain` is `all`, or a Redis Cluster node |
//! | `rate_tier_breaker_transitions_total` | counter | `to` | changes of a breaker's state, by new state (`closed`, `open`, `half_open`) |
//! | `rate_tier_evictions_total` | counter | | buckets a full memory store forgot to make room |
//! | `rate_tier_waits_total` | counter | `tier` | requests that waited for their slot and were served ([`wait_up_to`](crate::RateTierBuilder::wait_up_to)) |
//! | `rate_tier_wait_seconds` | histogram | | how long each of them waited, 1 ms .. 60 s buckets |
//! | `rate_tier_near_limit_total` | counter | `tier`, `limit` | customers brought near the end of a limit ([`near_limit`](crate::RateTierBuilder::near_limit)), once per crossing |
//! | `rate_tier_wait_refused_total` | counter | `tier` | requests that would have waited longer than allowed, or found the waiting room full: refused |
//!
//! A [`ShapeLayer`](crate::shape::ShapeLayer)'s calls have [`ShapeMetrics`]:
//!
//! | metric | type | labels | counts |
//! |---|---|---|---|
//! | `rate_tier_shaped_calls_total` | counter | `outcome` | calls by outcome: `went` (at once), `waited`, `wait_too_long` (failed at once), `gave_back` (dropped while waiting) |
//! | `rate_tier_shaped_wait_seconds` | histogram | | how long each call that went waited, 1 ms .. 60 s buckets |
//!
//! Label values come from the configuration and from fixed sets, never from
//! a request: a client sending made-up tier names cannot grow the number of
//! series. (The tier a client claimed is in [`LimitEvent::UnknownTier`] for
//! logs; here it is counted, not labelled.)
//!
//! Create one `RateLimitMetrics` per registry and observe it on the limiter
//! (clones share the metrics): registering twice in the same registry
//! would expose each metric twice, and observing it on the limiter and on
//! a layer would count that layer's checks twice.
//!
//! With the `metrics` facade instead (metrics-exporter-prometheus, StatsD,
//! ...), the same names and labels come from `observe::FacadeMetrics`
//! (feature `metrics-facade`); with OpenTelemetry, from
//! `observe::OtelMetrics` (feature `opentelemetry`).
//!
//! [`prometheus-client`]: https://docs.rs/prometheus-client

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use rate_tier_storage::StorageEvent;

use crate::event::LimitEvent;
use crate::observe::{Checked, Observer};

/// The version of prometheus-client this crate encodes with: use its
/// `Registry` and `encoding::text::encode` to serve the metrics.
pub use prometheus_client;

/// The content type of the text that
/// [`prometheus_client::encoding::text::encode`] writes (OpenMetrics 1.0):
/// the `content-type` of a `/metrics` response.
pub const CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The prefix of every metric name (followed by `_`).
pub const PREFIX: &str = "rate_tier";

/// Upper bounds of the `rate_tier_check_duration_seconds` buckets: 1 µs
/// (an in-memory check) to 100 ms (the default Redis timeout), in steps of
/// 1, 2.5, 5.
pub const DURATION_BUCKETS: [f64; 16] = [
    0.000_001,
    0.000_002_5,
    0.000_005,
    0.000_01,
    0.000_025,
    0.000_05,
    0.000_1,
    0.000_25,
    0.000_5,
    0.001,
    0.002_5,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
];

/// Upper bounds of the wait histograms' buckets: 1 ms to 60 s.
pub const WAIT_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 15.0, 60.0,
];

fn wait_histogram() -> Histogram {
    Histogram::new(WAIT_BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    tier: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NearLabels {
    tier: &'static str,
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    tier: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StorageLabels {
    storage: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AllowedLabels {
    allowed: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    domain: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    limit: &'static str,
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

type DurationFamily = Family<StorageLabels, Histogram, fn() -> Histogram>;

#[derive(Debug)]
struct Metrics {
    checks: Family<CheckLabels, Counter>,
    check_duration: DurationFamily,
    unknown_tier: Family<PolicyLabels, Counter>,
    missing_identity: Counter,
    storage_errors: Family<StorageLabels, Counter>,
    fallback_decisions: Family<AllowedLabels, Counter>,
    breaker_state: Family<DomainLabels, Gauge>,
    breaker_transitions: Family<StateLabels, Counter>,
    shadow_limited: Family<LimitLabels, Counter>,
    evictions: Counter,
    waits: Family<TierLabels, Counter>,
    wait_duration: Histogram,
    wait_refused: Family<TierLabels, Counter>,
    near_limit: Family<NearLabels, Counter>,
}

/// The limiter's Prometheus metrics: an [`Observer`] for
/// [`TierLimitLayer::observe`](crate::TierLimitLayer::observe). See the
/// [module docs](self) for the metrics.
///
/// Cheap to clone; clones update the same metrics.
///
/// ```
/// use std::convert::Infallible;
///
/// use http::{Request, Response};
/// use tower::{Layer, ServiceExt, service_fn};
/// use tower_rate_tier::metrics::RateLimitMetrics;
/// use tower_rate_tier::metrics::prometheus_client::{encoding::text::encode, registry::Registry};
/// use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let mut registry = Registry::default();
/// let metrics = RateLimitMetrics::new(&mut registry);
///
/// let tiers = RateTier::builder()
///     .tier("free", Quota::per_minute(10))
///     .observe(metrics.clone())
///     .build();
/// let layer = TierLimitLayer::new(tiers)
///     .identifier_fn(|headers| {
///         let key = headers.get("x-api-key")?.to_str().ok()?;
///         Some(TierIdentity::new(key, "free"))
///     });
/// let service = layer.layer(service_fn(|_req: Request<String>| async {
///     Ok::<_, Infallible>(Response::new(String::from("data")))
/// }));
///
/// let request = Request::builder().header("x-api-key", "ana").body(String::new()).unwrap();
/// let response = service.oneshot(request).await.unwrap();
/// assert_eq!(response.status(), 200);
///
/// // What a `/metrics` route answers, with `metrics::CONTENT_TYPE`:
/// let mut text = String::new();
/// encode(&mut text, &registry).unwrap();
/// assert!(text.contains(r#"rate_tier_checks_total{tier="free",outcome="allowed"} 1"#));
/// assert!(text.contains(r#"rate_tier_check_duration_seconds_count{storage="memory"} 1"#));
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RateLimitMetrics {
    inner: Arc<Metrics>,
}

impl RateLimitMetrics {
    /// Creates the metrics and registers them in `registry`, under the
    /// prefix `rate_tier_`. Call it once per registry.
    pub fn new(registry: &mut Registry) -> Self {
        let metrics = Metrics {
            checks: Family::default(),
            check_duration: Family::new_with_constructor(duration_histogram),
            unknown_tier: Family::default(),
            missing_identity: Counter::default(),
            storage_errors: Family::default(),
            fallback_decisions: Family::default(),
            breaker_state: Family::default(),
            breaker_transitions: Family::default(),
            shadow_limited: Family::default(),
            evictions: Counter::default(),
            waits: Family::default(),
            wait_duration: wait_histogram(),
            wait_refused: Family::default(),
            near_limit: Family::default(),
        };
        let registry = registry.sub_registry_with_prefix(PREFIX);
        registry.register(
            "checks",
            "Requests checked by the rate limiter, by tier and outcome",
            metrics.checks.clone(),
        );
        registry.register_with_unit(
            "check_duration",
            "Time to decide one request (identity, cost, store), by storage",
            Unit::Seconds,
            metrics.check_duration.clone(),
        );
        registry.register(
            "unknown_tier",
            "Requests whose tier is not configured, by the policy applied",
            metrics.unknown_tier.clone(),
        );
        registry.register(
            "missing_identity",
            "Requests without an identity",
            metrics.missing_identity.clone(),
        );
        registry.register(
            "storage_errors",
            "Store failures (errors and timeouts) met by a check, by storage",
            metrics.storage_errors.clone(),
        );
        registry.register(
            "fallback_decisions",
            "Checks decided by the local fallback, by whether they were allowed",
            metrics.fallback_decisions.clone(),
        );
        registry.register(
            "breaker_state",
            "State of each storage circuit breaker: 0 closed, 1 half-open, 2 open",
            metrics.breaker_state.clone(),
        );
        registry.register(
            "breaker_transitions",
            "Changes of the storage circuit breakers' states, by new state",
            metrics.breaker_transitions.clone(),
        );
        registry.register(
            "shadow_limited",
            "Would-be refusals of limits in shadow mode, by limit",
            metrics.shadow_limited.clone(),
        );
        registry.register(
            "evictions",
            "Buckets a full memory store forgot to make room for new ones",
            metrics.evictions.clone(),
        );
        registry.register(
            "waits",
            "Requests that waited for their slot and were served, by tier",
            metrics.waits.clone(),
        );
        registry.register_with_unit(
            "wait",
            "How long requests waited for their slot",
            Unit::Seconds,
            metrics.wait_duration.clone(),
        );
        registry.register(
            "wait_refused",
            "Requests refused because they would have waited too long, or the waiting room was full, by tier",
            metrics.wait_refused.clone(),
        );
        registry.register(
            "near_limit",
            "Customers brought near the end of a limit, by tier and limit",
            metrics.near_limit.clone(),
        );
        RateLimitMetrics {
            inner: Arc::new(metrics),
        }
    }
}

impl Observer for RateLimitMetrics {
    fn checked(&self, check: &Checked) {
        let metrics = &*self.inner;
        metrics
            .checks
            .get_or_create(&CheckLabels {
                tier: check.tier.unwrap_or("none"),
                outcome: check.outcome.as_str(),
            })
            .inc();
        metrics
            .check_duration
            .get_or_create(&StorageLabels {
                storage: check.storage,
            })
            .observe(check.elapsed.as_secs_f64());
    }

    fn event(&self, event: &LimitEvent) {
        let metrics = &*self.inner;
        match event {
            LimitEvent::UnknownTier { policy, .. } => {
                metrics
                    .unknown_tier
                    .get_or_create(&PolicyLabels {
                        policy: policy.as_str(),
                    })
                    .inc();
            }
            LimitEvent::MissingIdentity => {
                metrics.missing_identity.inc();
            }
            LimitEvent::StorageError { storage, .. } => {
                metrics
                    .storage_errors
                    .get_or_create(&StorageLabels { storage })
                    .inc();
            }
            LimitEvent::ShadowLimited { limit, .. } => {
                metrics
                    .shadow_limited
                    .get_or_create(&LimitLabels { limit })
                    .inc();
            }
            LimitEvent::Storage(StorageEvent::Evicted { .. }) => {
                metrics.evictions.inc();
            }
            LimitEvent::Storage(StorageEvent::Fallback { allowed, .. }) => {
                metrics
                    .fallback_decisions
                    .get_or_create(&AllowedLabels {
                        allowed: if *allowed { "true" } else { "false" },
                    })
                    .inc();
            }
            LimitEvent::Storage(StorageEvent::Breaker {
                domain, to, ..
            }) => {
                let domain = domain.as_deref().unwrap_or("all").to_owned();
                metrics
                    .breaker_state
                    .get_or_create(&DomainLabels { domain })
                    .set(crate::recorded::breaker_value(*to));
                metrics
                    .breaker_transitions
                    .get_or_create(&StateLabels { to: to.as_str() })
                    .inc();
            }
            LimitEvent::Waited { tier, wait, .. } => {
                metrics.waits.get_or_create(&TierLabels { tier }).inc();
                metrics.wait_duration.observe(wait.as_secs_f64());
            }
            LimitEvent::NearLimit { tier, limit, .. } => {
                metrics
                    .near_limit
                    .get_or_create(&NearLabels { tier, limit })
                    .inc();
            }
            LimitEvent::WaitRefused { tier, .. } => {
                metrics
                    .wait_refused
                    .get_or_create(&TierLabels { tier })
                    .inc();
            }
            // Refusals are counted by `checked` (by outcome); new variants
            // are ignored until they get a metric.
            _ => {}
        }
    }
}

/// A [`ShapeLayer`](crate::shape::ShapeLayer)'s metrics (see the [module
/// docs](self)): give it to
/// [`ShapeLayerBuilder::observe`](crate::shape::ShapeLayerBuilder::observe).
/// Cheap to clone; clones update the same metrics.
///
/// ```
/// use std::time::Duration;
/// use tower_rate_tier::metrics::ShapeMetrics;
/// use tower_rate_tier::metrics::prometheus_client::{encoding::text::encode, registry::Registry};
/// use tower_rate_tier::{Observer, shape::ShapeEvent};
///
/// let mut registry = Registry::default();
/// let metrics = ShapeMetrics::new(&mut registry);
/// metrics.shaped(&ShapeEvent::Reserved { wait: Duration::from_millis(40) });
/// metrics.shaped(&ShapeEvent::WaitTooLong { wait: Duration::from_secs(90) });
/// let mut text = String::new();
/// encode(&mut text, &registry).unwrap();
/// assert!(text.contains(r#"rate_tier_shaped_calls_total{outcome="waited"} 1"#));
/// assert!(text.contains(r#"rate_tier_shaped_calls_total{outcome="wait_too_long"} 1"#));
/// assert!(text.contains("rate_tier_shaped_wait_seconds_count 1"));
/// ```
#[derive(Clone, Debug)]
pub struct ShapeMetrics {
    inner: Arc<Shaped>,
}

#[derive(Debug)]
struct Shaped {
    calls: Family<OutcomeLabels, Counter>,
    wait: Histogram,
}

impl ShapeMetrics {
    /// Creates the metrics and registers them in `registry`, under the
    /// prefix `rate_tier_`. Call it once per registry.
    pub fn new(registry: &mut Registry) -> Self {
        let shaped = Shaped {
            calls: Family::default(),
            wait: wait_histogram(),
        };
        let registry = registry.sub_registry_with_prefix(PREFIX);
        registry.register(
            "shaped_calls",
            "Outgoing calls through a shaper, by outcome",
            shaped.calls.clone(),
        );
        registry.register_with_unit(
            "shaped_wait",
            "How long outgoing calls waited for their slot",
            Unit::Seconds,
            shaped.wait.clone(),
        );
        ShapeMetrics {
            inner: Arc::new(shaped),
        }
    }
}

impl Observer for ShapeMetrics {
    fn shaped(&self, event: &crate::shape::ShapeEvent) {
        use crate::shape::ShapeEvent;
        let outcome = match event {
            ShapeEvent::Reserved { wait } => {
                self.inner.wait.observe(wait.as_secs_f64());
                if wait.is_zero() { "went" } else { "waited" }
            }
            ShapeEvent::WaitTooLong { .. } => "wait_too_long",
            ShapeEvent::GaveBack => "gave_back",
        };
        self.inner
            .calls
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}
