//! `RateLimitMetrics` through the real layer on a fake clock: the 0.3 example's
//! cases (allowed, 429, 403 cost, unknown tier, 401), a store that times
//! out, and a fallback whose primary is down. Every assertion reads the
//! exposition text back through a Prometheus text parser.
#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use prometheus_parse::{LineInfo, Scrape, Value};
use support::fixtures::plan_of;
use support::stores::{Flaky, TimingOut};
use tower::{Layer, ServiceExt, service_fn};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::metrics::RateLimitMetrics;
use tower_rate_tier::metrics::prometheus_client::encoding::text::encode;
use tower_rate_tier::metrics::prometheus_client::registry::Registry;
use tower_rate_tier::{
    FallbackStorage, Limit, MemoryStorage, OnMissing, Quota, RateTier,
    TierIdentity, TierLimitLayer, policy::OnStorageError,
    policy::OnUnknownTier,
};

// ---------------------------------------------------------------------------
// The exposition, parsed.

struct Exposition {
    text: String,
    scrape: Scrape,
}

fn scrape(registry: &Registry) -> Exposition {
    let mut text = String::new();
    encode(&mut text, registry).unwrap();
    assert!(
        text.ends_with("# EOF\n"),
        "OpenMetrics text ends with # EOF"
    );
    // The parser skips what it cannot read: make sure nothing was skipped.
    for line in text.lines().filter(|line| !line.starts_with('#')) {
        assert!(
            matches!(LineInfo::parse(line), LineInfo::Sample { .. }),
            "not a sample line: {line:?}"
        );
    }
    let scrape =
        Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).unwrap();
    // Every family with a sample is documented (HELP), and prefixed.
    for sample in &scrape.samples {
        let family = ["_total", "_count", "_sum"]
            .iter()
            .find_map(|suffix| sample.metric.strip_suffix(suffix))
            .unwrap_or(&sample.metric);
        assert!(family.starts_with("rate_tier_"), "{family}");
        assert!(scrape.docs.contains_key(family), "no HELP for {family}");
    }
    Exposition { text, scrape }
}

fn labels_match(
    found: &HashMap<String, String>,
    wanted: &[(&str, &str)],
) -> bool {
    found.len() == wanted.len()
        && wanted
            .iter()
            .all(|(k, v)| found.get(*k).map(String::as_str) == Some(*v))
}

impl Exposition {
    /// The value of the one sample `name{labels}` (exact label set).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found =
            self.scrape.samples.iter().filter(|s| {
                s.metric == name && labels_match(&s.labels, labels)
            });
        let sample = found.next()?;
        assert!(found.next().is_none(), "{name}{labels:?} appears twice");
        match &sample.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(*v),
            other => panic!("{name} is not a scalar: {other:?}"),
        }
    }

    /// Observations in the histogram `name{labels}` (its `+Inf` bucket),
    /// checked against its `_count`.
    fn histogram_count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let sample = self
            .scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels_match(&s.labels, labels))
            .unwrap_or_else(|| panic!("no histogram {name}{labels:?}"));
        let Value::Histogram(buckets) = &sample.value else {
            panic!("{name} is not a histogram");
        };
        let last = buckets.last().unwrap();
        assert!(last.less_than.is_infinite());
        assert!(
            buckets.windows(2).all(|w| w[0].count <= w[1].count),
            "buckets are cumulative"
        );
        let count = self.value(&format!("{name}_count"), labels).unwrap();
        assert_eq!(last.count, count);
        count
    }

    /// Every `(labels, value)` of a metric, labels sorted, for whole-family
    /// comparisons.
    fn family(&self, name: &str) -> Vec<(String, f64)> {
        let mut all: Vec<_> = self
            .scrape
            .samples
            .iter()
            .filter(|s| s.metric == name)
            .map(|s| {
                let value = match s.value {
                    Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => {
                        v
                    }
                    _ => panic!("{name} is not a scalar"),
                };
                (s.labels.to_string(), value)
            })
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

impl Exposition {
    /// No breaker changed state: no transition, every state closed.
    fn assert_no_breaker_moved(&self) {
        assert_eq!(self.family("rate_tier_breaker_transitions_total"), vec![]);
        for (labels, state) in self.family("rate_tier_breaker_state") {
            assert_eq!(state, 0.0, "breaker {labels}");
        }
    }
}

fn family(expected: &[(&str, f64)]) -> Vec<(String, f64)> {
    let mut all: Vec<_> = expected
        .iter()
        .map(|(labels, v)| ((*labels).to_owned(), *v))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

// ---------------------------------------------------------------------------
// The layer, as in the 0.3 example.

/// The 0.3 example's layer, its checks observed by `metrics`.
fn post_layer(tiers: RateTier, metrics: &RateLimitMetrics) -> TierLimitLayer {
    plain_layer(tiers).observe(metrics.clone())
}

/// The 0.3 example's layer, for a limiter that is observed itself.
fn plain_layer(tiers: RateTier) -> TierLimitLayer {
    TierLimitLayer::new(tiers)
        .identifier_fn(|headers| {
            let key = headers.get("x-api-key")?.to_str().ok()?;
            Some(TierIdentity::new(key, plan_of(key)?))
        })
        .cost_fn(|req| match req.uri.path() {
            "/report" => 5,
            "/backup" => 50,
            _ => 1,
        })
}

async fn get(layer: &TierLimitLayer, path: &str, key: Option<&str>) -> u16 {
    let service = layer.layer(service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Response::new(String::from("ok")))
    }));
    let mut request = Request::builder().uri(path);
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let response = service
        .oneshot(request.body(String::new()).unwrap())
        .await
        .unwrap();
    response.status().as_u16()
}

fn registry_with_metrics() -> (Registry, RateLimitMetrics) {
    let mut registry = Registry::default();
    let metrics = RateLimitMetrics::new(&mut registry);
    (registry, metrics)
}

// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_posts_cases_are_counted_by_tier_and_outcome() {
    let (registry, metrics) = registry_with_metrics();
    let clock = FakeClock::new();
    let tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
        .build();
    let layer = post_layer(tiers, &metrics);

    for _ in 0..10 {
        assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    }
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 429);
    assert_eq!(get(&layer, "/backup", Some("key_ana")).await, 403);
    clock.advance(Duration::from_secs(6));
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    assert_eq!(get(&layer, "/data", Some("key_eva")).await, 200);
    assert_eq!(get(&layer, "/data", None).await, 401);
    assert_eq!(get(&layer, "/data", Some("key_nobody")).await, 401);
    assert_eq!(get(&layer, "/report", Some("key_bea")).await, 200);

    let metrics = scrape(&registry);
    assert_eq!(
        metrics.family("rate_tier_checks_total"),
        family(&[
            (r#"outcome="allowed",tier="free""#, 12.0), // 10 + 1 + eva's
            (r#"outcome="limited",tier="free""#, 1.0),
            (r#"outcome="cost_exceeds_burst",tier="free""#, 1.0),
            (r#"outcome="missing_identity",tier="none""#, 2.0),
            (r#"outcome="allowed",tier="pro""#, 1.0),
        ]),
        "{}",
        metrics.text
    );
    assert_eq!(
        metrics.value(
            "rate_tier_checks_total",
            &[("tier", "free"), ("outcome", "limited")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metrics.family("rate_tier_unknown_tier_total"),
        family(&[(r#"policy="use_default""#, 1.0)])
    );
    assert_eq!(
        metrics.value("rate_tier_missing_identity_total", &[]),
        Some(2.0)
    );
    // Every request above, one observation each: by the store that
    // decided, or "none" when no store was asked (401s, a cost above the
    // burst).
    assert_eq!(
        metrics.histogram_count(
            "rate_tier_check_duration_seconds",
            &[("storage", "memory")]
        ),
        14.0
    );
    assert_eq!(
        metrics.histogram_count(
            "rate_tier_check_duration_seconds",
            &[("storage", "none")]
        ),
        3.0
    );
    // Nothing failed, no breaker moved.
    assert_eq!(metrics.family("rate_tier_storage_errors_total"), vec![]);
    assert_eq!(metrics.family("rate_tier_fallback_decisions_total"), vec![]);
    metrics.assert_no_breaker_moved();
    // Never a client-sent tier name, never a user id.
    assert!(!metrics.text.contains("gold"), "{}", metrics.text);
    assert!(!metrics.text.contains("key_"), "{}", metrics.text);
}

#[tokio::test]
async fn unknown_tiers_are_counted_by_policy_not_by_name() {
    let (registry, metrics) = registry_with_metrics();
    // Two layers, one metrics: clones add up.
    let deny = post_layer(
        RateTier::builder()
            .clock(FakeClock::new())
            .tier("free", Quota::per_minute(10))
            .build(),
        &metrics,
    );
    let allow = post_layer(
        RateTier::builder()
            .clock(FakeClock::new())
            .tier("free", Quota::per_minute(10))
            .on_unknown_tier(OnUnknownTier::Allow)
            .build(),
        &metrics,
    );

    assert_eq!(get(&deny, "/data", Some("key_eva")).await, 403);
    assert_eq!(get(&deny, "/data", Some("key_eva")).await, 403);
    assert_eq!(get(&allow, "/data", Some("key_eva")).await, 200);

    let metrics = scrape(&registry);
    assert_eq!(
        metrics.family("rate_tier_checks_total"),
        family(&[
            (r#"outcome="unknown_tier_denied",tier="none""#, 2.0),
            (r#"outcome="unlimited",tier="none""#, 1.0),
        ])
    );
    assert_eq!(
        metrics.family("rate_tier_unknown_tier_total"),
        family(&[(r#"policy="deny""#, 2.0), (r#"policy="allow""#, 1.0)])
    );
    assert!(!metrics.text.contains("gold"), "{}", metrics.text);
}

#[tokio::test]
async fn storage_errors_are_counted_by_storage() {
    let (registry, metrics) = registry_with_metrics();
    let tiers = |policy| {
        RateTier::builder()
            .clock(FakeClock::new())
            .tier("free", Quota::per_minute(10))
            .storage(Arc::new(TimingOut::new("timing_out")))
            .on_storage_error(policy)
            .build()
    };
    let closed = post_layer(tiers(OnStorageError::default()), &metrics);
    let open = post_layer(tiers(OnStorageError::Allow), &metrics);

    for _ in 0..3 {
        assert_eq!(get(&closed, "/data", Some("key_ana")).await, 503);
    }
    for _ in 0..2 {
        assert_eq!(get(&open, "/data", Some("key_ana")).await, 200);
    }

    let metrics = scrape(&registry);
    assert_eq!(
        metrics.family("rate_tier_storage_errors_total"),
        family(&[(r#"storage="timing_out""#, 5.0)])
    );
    assert_eq!(
        metrics.family("rate_tier_checks_total"),
        family(&[
            (r#"outcome="storage_error",tier="none""#, 3.0),
            (r#"outcome="unlimited",tier="none""#, 2.0),
        ])
    );
    assert_eq!(
        metrics.histogram_count(
            "rate_tier_check_duration_seconds",
            &[("storage", "timing_out")]
        ),
        5.0
    );
}

#[tokio::test]
async fn the_fallback_and_its_breaker_are_counted() {
    let (registry, metrics) = registry_with_metrics();
    let registry = Arc::new(registry);
    let clock = FakeClock::new();
    // Each call to the primary records the breaker gauge as scraped then.
    let gauge_at_calls = Arc::new(Mutex::new(Vec::new()));
    let (seen, scraped) = (gauge_at_calls.clone(), registry.clone());
    let primary = Arc::new(Flaky::watched(
        MemoryStorage::builder().clock(clock.clone()).build(),
        move || seen.lock().unwrap().push(breaker(&scraped)),
    ));
    let fallback = FallbackStorage::builder(primary.clone())
        .clock(clock.clone())
        .failure_threshold(2)
        .cool_down(Duration::from_secs(1), Duration::from_secs(30))
        .build();
    // The store's events (the breaker) are the limiter's: observed there.
    let tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(3))
        .storage(Arc::new(fallback.clone()))
        .observe(metrics)
        .build();
    let layer = plain_layer(tiers);

    // Primary down: the first failure is decided locally, the second opens
    // the breaker; then the local store decides without asking the primary.
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    assert_eq!(breaker(&registry), 0.0);
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    assert_eq!(breaker(&registry), 2.0);
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 429);
    // Cool-down over: a probe fails (half-open, then open again, 2 s).
    clock.advance(Duration::from_secs(1));
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 429);
    assert_eq!(breaker(&registry), 2.0);
    // The primary is back: the next probe closes the breaker.
    primary.set_up(true);
    clock.advance(Duration::from_secs(2));
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);

    // Two probes saw the gauge at half-open (1); closed calls at 0.
    assert_eq!(
        *gauge_at_calls.lock().unwrap(),
        vec![0.0, 0.0, 1.0, 1.0, 0.0]
    );
    let metrics = scrape(&registry);
    assert_eq!(
        metrics.value("rate_tier_breaker_state", &[("domain", "all")]),
        Some(0.0)
    );
    assert_eq!(
        metrics.family("rate_tier_breaker_transitions_total"),
        family(&[
            (r#"to="open""#, 2.0),
            (r#"to="half_open""#, 2.0),
            (r#"to="closed""#, 1.0),
        ])
    );
    assert_eq!(
        metrics.family("rate_tier_fallback_decisions_total"),
        family(&[(r#"allowed="true""#, 3.0), (r#"allowed="false""#, 2.0)])
    );
    assert_eq!(
        metrics.family("rate_tier_checks_total"),
        family(&[
            (r#"outcome="allowed",tier="free""#, 5.0),
            (r#"outcome="limited",tier="free""#, 2.0),
        ])
    );
    // The fallback absorbed every failure: none reached the policy.
    assert_eq!(metrics.family("rate_tier_storage_errors_total"), vec![]);
    // Local decisions are filed under "fallback", at memory speed,
    // not under the primary's name; the primary decided the last two.
    assert_eq!(
        metrics.histogram_count(
            "rate_tier_check_duration_seconds",
            &[("storage", "fallback")]
        ),
        5.0
    );
    assert_eq!(
        metrics.histogram_count(
            "rate_tier_check_duration_seconds",
            &[("storage", "flaky")]
        ),
        2.0
    );
}

/// The breaker gauge of a single-node primary (domain `all`), 0 before any
/// transition.
fn breaker(registry: &Registry) -> f64 {
    scrape(registry)
        .value("rate_tier_breaker_state", &[("domain", "all")])
        .unwrap_or(0.0)
}

/// A limiter observed with `.observe(metrics)` and the 0.3 example's tiers.
fn observed_tiers(metrics: &RateLimitMetrics) -> RateTier {
    RateTier::builder()
        .clock(FakeClock::new())
        .tier("free", Quota::per_minute(10))
        .tier("pro", Quota::per_minute(100))
        .default_tier("free")
        .on_missing(OnMissing::Deny(StatusCode::UNAUTHORIZED))
        .observe(metrics.clone())
        .build()
}

#[tokio::test]
async fn a_shadow_limit_is_counted_exactly() {
    let (registry, metrics) = registry_with_metrics();
    let layer = plain_layer(observed_tiers(&metrics)).limit(
        Limit::new("trial", Quota::per_minute(2))
            .shadow()
            .when(|req| req.uri.path() == "/data"),
    );
    for _ in 0..10 {
        assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    }
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 429);
    let metrics = scrape(&registry);
    assert_eq!(
        metrics.family("rate_tier_checks_total"),
        family(&[
            (r#"outcome="allowed",tier="free""#, 2.0),
            (r#"outcome="shadow_limited",tier="free""#, 8.0),
            (r#"outcome="limited",tier="free""#, 1.0),
        ]),
        "{}",
        metrics.text
    );
    // The 11th request: refused by the tier, and the trial would have
    // refused it too.
    assert_eq!(
        metrics.family("rate_tier_shadow_limited_total"),
        family(&[(r#"limit="trial""#, 9.0)])
    );
}

#[tokio::test]
async fn shadow_mode_for_everything_is_counted_exactly() {
    let (registry, metrics) = registry_with_metrics();
    let layer = plain_layer(observed_tiers(&metrics)).shadow(true);
    for _ in 0..15 {
        assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    }
    for _ in 0..3 {
        assert_eq!(get(&layer, "/report", Some("key_bea")).await, 200);
    }
    let metrics = scrape(&registry);
    assert_eq!(
        metrics.family("rate_tier_checks_total"),
        family(&[
            (r#"outcome="allowed",tier="free""#, 10.0),
            (r#"outcome="shadow_limited",tier="free""#, 5.0),
            (r#"outcome="allowed",tier="pro""#, 3.0),
        ]),
        "{}",
        metrics.text
    );
    assert_eq!(
        metrics.family("rate_tier_shadow_limited_total"),
        family(&[(r#"limit="free""#, 5.0)])
    );
}

/// Observed on the limiter, every layer's checks and every direct check
/// are counted once.
#[tokio::test]
async fn a_limiter_observer_counts_every_layer_once() {
    let (registry, metrics) = registry_with_metrics();
    let tiers = observed_tiers(&metrics);
    let (a, b) = (plain_layer(tiers.clone()), plain_layer(tiers.clone()));
    assert_eq!(get(&a, "/data", Some("key_ana")).await, 200);
    assert_eq!(get(&b, "/data", Some("key_ana")).await, 200);
    assert_eq!(get(&b.clone(), "/data", None).await, 401);
    tiers.check("key_bea", "pro", 1).await.unwrap().unwrap();
    let metrics = scrape(&registry);
    assert_eq!(
        metrics.family("rate_tier_checks_total"),
        family(&[
            (r#"outcome="allowed",tier="free""#, 2.0),
            (r#"outcome="missing_identity",tier="none""#, 1.0),
            (r#"outcome="allowed",tier="pro""#, 1.0),
        ])
    );
    assert_eq!(
        metrics.value("rate_tier_missing_identity_total", &[]),
        Some(1.0)
    );
}

/// An identity lookup that always fails.
struct DatabaseDown;

#[async_trait::async_trait]
impl tower_rate_tier::TierIdentifier for DatabaseDown {
    async fn identify(
        &self,
        _parts: &http::request::Parts,
    ) -> Result<Option<TierIdentity<'static>>, tower_rate_tier::IdentityError>
    {
        Err(tower_rate_tier::IdentityError::new(std::io::Error::other(
            "database down",
        )))
    }
}

#[tokio::test]
async fn failed_identity_lookups_are_counted_apart_from_missing_identities() {
    let (registry, metrics) = registry_with_metrics();
    let layer = plain_layer(observed_tiers(&metrics)).identifier(DatabaseDown);
    for _ in 0..2 {
        assert_eq!(get(&layer, "/data", Some("key_ana")).await, 503);
    }
    let metrics = scrape(&registry);
    assert_eq!(
        metrics.family("rate_tier_checks_total"),
        family(&[(r#"outcome="identity_error",tier="none""#, 2.0)])
    );
    assert_eq!(
        metrics.value("rate_tier_missing_identity_total", &[]),
        Some(0.0)
    );
}
