//! `/metrics`: envoyproxy/ratelimit's per-rule stats, and the store's
//! latency and breaker state, in the Prometheus text format.
//!
//! | metric | labels | what |
//! |---|---|---|
//! | `ratelimit_service_rate_limit_total_hits_total` | `domain`, `rule` | the cost of every descriptor that reached a limit |
//! | `ratelimit_service_rate_limit_over_limit_total` | `domain`, `rule` | the cost of those refused on their own (shadow ones included) |
//! | `ratelimit_service_rate_limit_near_limit_total` | `domain`, `rule` | the part of an allowed cost above `NEAR_LIMIT_RATIO` (0.8) of the limit |
//! | `ratelimit_service_rate_limit_within_limit_total` | `domain`, `rule` | the cost of those that passed on their own |
//! | `ratelimit_service_rate_limit_shadow_mode_total` | `domain`, `rule` | the cost of refusals that shadow mode let through |
//! | `ratelimit_service_should_rate_limit_total` | `transport` (`grpc`, `json`), `code` (`ok`, `over_limit`, `oversized`, `invalid_argument`, `unavailable`) | calls (`oversized`: beyond a [`RequestLimits`](crate::RequestLimits) bound, refused) |
//! | `ratelimit_service_domain_not_found_total` | | descriptors of requests for an unknown domain |
//! | `ratelimit_service_global_shadow_mode_total` | | refusals that `--shadow` let through |
//! | `ratelimit_service_config_load_total` | `result` (`success`, `error`, `kept_empty`) | config loads and reloads: `error` (invalid) and `kept_empty` (no config file found) keep the config in use |
//! | `ratelimit_service_config_domains` | | domains in the config in use |
//! | `ratelimit_service_store_latency_seconds` | `store` (`memory`, `redis`, `fallback`, ...) | time of each store decision |
//! | `ratelimit_service_breaker_state` | `domain` (`all`, or a Redis Cluster node) | 0 closed, 1 half-open, 2 open (a shared store with its fallback only) |
//!
//! `rule` is the rule's path below the domain as written in the config
//! (`remote_address`, `path_/api/*.method_GET`): never a request's value, so
//! the number of series is bounded by the config. A descriptor's own
//! `limit` override counts under `rule="override"`.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use rate_tier_storage::{BreakerState, FallbackStorage};

type Labels = Vec<(String, String)>;

fn latency_histogram() -> Histogram {
    // 25 µs to ~0.8 s.
    Histogram::new(exponential_buckets(0.000_025, 2.0, 16))
}

/// The counters of one rule, resolved once per config.
#[derive(Debug, Clone, Default)]
pub(crate) struct RuleStats {
    pub(crate) total_hits: Counter,
    pub(crate) over_limit: Counter,
    pub(crate) near_limit: Counter,
    pub(crate) within_limit: Counter,
    pub(crate) shadow_mode: Counter,
}

/// Every metric of the service, and the registry they are exposed from.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    total_hits: Family<Labels, Counter>,
    over_limit: Family<Labels, Counter>,
    near_limit: Family<Labels, Counter>,
    within_limit: Family<Labels, Counter>,
    shadow_mode: Family<Labels, Counter>,
    calls: Family<Labels, Counter>,
    pub(crate) domain_not_found: Counter,
    pub(crate) global_shadow: Counter,
    config_loads: Family<Labels, Counter>,
    config_domains: Gauge,
    store_latency: Family<Labels, Histogram, fn() -> Histogram>,
    breaker: Family<Labels, Gauge>,
    fallback: Option<FallbackStorage>,
}

impl Metrics {
    /// The service's metrics; `fallback` (Redis with its local fallback)
    /// adds the breakers' state.
    pub fn new(fallback: Option<FallbackStorage>) -> Metrics {
        let mut registry = Registry::default();
        let family = Family::<Labels, Counter>::default;
        let (total_hits, over_limit, near_limit, within_limit, shadow_mode) =
            (family(), family(), family(), family(), family());
        let calls = family();
        let config_loads = family();
        let domain_not_found = Counter::default();
        let global_shadow = Counter::default();
        let config_domains = Gauge::default();
        let store_latency: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        let breaker = Family::<Labels, Gauge>::default();
        let service = registry.sub_registry_with_prefix("ratelimit_service");
        for (name, help, metric) in [
            (
                "rate_limit_total_hits",
                "Cost of the descriptors that reached a limit",
                &total_hits,
            ),
            (
                "rate_limit_over_limit",
                "Cost refused by a limit (shadow included)",
                &over_limit,
            ),
            (
                "rate_limit_near_limit",
                "Allowed cost above 80% of the limit",
                &near_limit,
            ),
            (
                "rate_limit_within_limit",
                "Cost allowed by a limit",
                &within_limit,
            ),
            (
                "rate_limit_shadow_mode",
                "Cost a shadow rule let through",
                &shadow_mode,
            ),
            ("should_rate_limit", "ShouldRateLimit calls", &calls),
            ("config_load", "Config loads by result", &config_loads),
        ] {
            service.register(name, help, metric.clone());
        }
        service.register(
            "domain_not_found",
            "Descriptors of requests for an unknown domain",
            domain_not_found.clone(),
        );
        service.register(
            "global_shadow_mode",
            "Refusals that --shadow let through",
            global_shadow.clone(),
        );
        service.register(
            "config_domains",
            "Domains in the config in use",
            config_domains.clone(),
        );
        service.register(
            "store_latency_seconds",
            "Time of each store decision",
            store_latency.clone(),
        );
        service.register(
            "breaker_state",
            "Circuit breaker of the shared store: 0 closed, 1 half-open, 2 open",
            breaker.clone(),
        );
        Metrics {
            registry,
            total_hits,
            over_limit,
            near_limit,
            within_limit,
            shadow_mode,
            calls,
            domain_not_found,
            global_shadow,
            config_loads,
            config_domains,
            store_latency,
            breaker,
            fallback,
        }
    }

    /// The counters of the rule at `path` in `domain`.
    pub(crate) fn rule(&self, domain: &str, path: &str) -> RuleStats {
        let labels = vec![
            ("domain".to_owned(), domain.to_owned()),
            ("rule".to_owned(), path.to_owned()),
        ];
        RuleStats {
            total_hits: self.total_hits.get_or_create_owned(&labels),
            over_limit: self.over_limit.get_or_create_owned(&labels),
            near_limit: self.near_limit.get_or_create_owned(&labels),
            within_limit: self.within_limit.get_or_create_owned(&labels),
            shadow_mode: self.shadow_mode.get_or_create_owned(&labels),
        }
    }

    pub(crate) fn call(&self, transport: &'static str, code: &'static str) {
        self.calls
            .get_or_create(&vec![
                ("transport".to_owned(), transport.to_owned()),
                ("code".to_owned(), code.to_owned()),
            ])
            .inc();
    }

    fn config_load(&self, result: &str) {
        self.config_loads
            .get_or_create(&vec![("result".to_owned(), result.to_owned())])
            .inc();
    }

    pub(crate) fn config_loaded(&self, ok: bool, domains: usize) {
        self.config_load(if ok { "success" } else { "error" });
        if ok {
            self.config_domains
                .set(i64::try_from(domains).unwrap_or(i64::MAX));
        }
    }

    /// A reload found no config file and kept the config in use.
    pub(crate) fn config_kept_empty(&self) {
        self.config_load("kept_empty");
    }

    pub(crate) fn store_latency(&self, store: &'static str, took: Duration) {
        self.store_latency
            .get_or_create(&vec![("store".to_owned(), store.to_owned())])
            .observe(took.as_secs_f64());
    }

    /// The shared store's breaker, for a store with a local fallback.
    pub(crate) fn breaker(&self) -> Option<BreakerState> {
        self.fallback.as_ref().map(FallbackStorage::state)
    }

    /// The exposition, in the Prometheus text format.
    pub fn encode(&self) -> String {
        if let Some(fallback) = &self.fallback {
            let value = |state: BreakerState| match state {
                BreakerState::Closed => 0,
                BreakerState::HalfOpen => 1,
                _ => 2,
            };
            let domains = fallback.domain_states();
            if domains.is_empty() {
                self.breaker
                    .get_or_create(&vec![(
                        "domain".to_owned(),
                        "all".to_owned(),
                    )])
                    .set(value(fallback.state()));
            }
            for (domain, state) in domains {
                self.breaker
                    .get_or_create(&vec![(
                        "domain".to_owned(),
                        domain.to_string(),
                    )])
                    .set(value(state));
            }
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
