//! `RateLimitMetrics` through the real layer on a fake clock: the post's
//! cases (allowed, 429, 403 cost, unknown tier, 401), a store that times
//! out, and a fallback whose primary is down. Every assertion reads the
//! exposition text back through a Prometheus text parser.
#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use prometheus_parse::{LineInfo, Scrape, Value};
use rate_tier_storage::{BucketCheck, Decision};
use tower::{Layer, ServiceExt, service_fn};
use tower_rate_tier::clock::FakeClock;
use tower_rate_tier::metrics::RateLimitMetrics;
use tower_rate_tier::metrics::prometheus_client::encoding::text::encode;
use tower_rate_tier::metrics::prometheus_client::registry::Registry;
use tower_rate_tier::{
    FallbackStorage, MemoryStorage, OnMissing, OnStorageError, OnUnknownTier,
    Quota, RateTier, Storage, StorageError, TierIdentity, TierLimitLayer,
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

fn family(expected: &[(&str, f64)]) -> Vec<(String, f64)> {
    let mut all: Vec<_> = expected
        .iter()
        .map(|(labels, v)| ((*labels).to_owned(), *v))
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

// ---------------------------------------------------------------------------
// The layer, as in the post.

fn plan_of(api_key: &str) -> Option<&'static str> {
    match api_key {
        "key_ana" => Some("free"),
        "key_bea" => Some("pro"),
        "key_eva" => Some("gold"), // not configured
        _ => None,
    }
}

fn post_layer(tiers: RateTier, metrics: &RateLimitMetrics) -> TierLimitLayer {
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
        .observe(metrics.clone())
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
    assert_eq!(
        metrics.histogram_count(
            "rate_tier_check_duration_seconds",
            &[("storage", "memory")]
        ),
        17.0 // every request above, one observation each
    );
    // Nothing failed, no breaker moved.
    assert_eq!(metrics.family("rate_tier_storage_errors_total"), vec![]);
    assert_eq!(metrics.family("rate_tier_fallback_decisions_total"), vec![]);
    assert_eq!(metrics.value("rate_tier_breaker_state", &[]), Some(0.0));
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

/// Every check times out.
#[derive(Debug)]
struct TimingOut;

#[async_trait::async_trait]
impl Storage for TimingOut {
    async fn check(
        &self,
        _check: &BucketCheck<'_>,
    ) -> Result<Decision, StorageError> {
        Err(StorageError::Timeout(Duration::from_millis(100)))
    }

    fn kind(&self) -> &'static str {
        "timing_out"
    }
}

#[tokio::test]
async fn storage_errors_are_counted_by_storage() {
    let (registry, metrics) = registry_with_metrics();
    let tiers = |policy| {
        RateTier::builder()
            .clock(FakeClock::new())
            .tier("free", Quota::per_minute(10))
            .storage(Arc::new(TimingOut))
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

/// A primary that is down until `up` is set; while it answers, a memory
/// store decides. Each call records the breaker gauge as scraped then.
#[derive(Debug)]
struct Flaky {
    up: AtomicBool,
    store: MemoryStorage,
    registry: Arc<Registry>,
    gauge_at_calls: Mutex<Vec<f64>>,
}

#[async_trait::async_trait]
impl Storage for Flaky {
    async fn check(
        &self,
        check: &BucketCheck<'_>,
    ) -> Result<Decision, StorageError> {
        let gauge = scrape(&self.registry)
            .value("rate_tier_breaker_state", &[])
            .unwrap();
        self.gauge_at_calls.lock().unwrap().push(gauge);
        if self.up.load(Ordering::SeqCst) {
            self.store.check(check).await
        } else {
            Err(StorageError::Timeout(Duration::from_millis(100)))
        }
    }

    fn kind(&self) -> &'static str {
        "flaky"
    }
}

#[tokio::test]
async fn the_fallback_and_its_breaker_are_counted() {
    let (registry, metrics) = registry_with_metrics();
    let registry = Arc::new(registry);
    let clock = FakeClock::new();
    let primary = Arc::new(Flaky {
        up: AtomicBool::new(false),
        store: MemoryStorage::builder().clock(clock.clone()).build(),
        registry: registry.clone(),
        gauge_at_calls: Mutex::new(Vec::new()),
    });
    let fallback = FallbackStorage::builder(primary.clone())
        .clock(clock.clone())
        .failure_threshold(2)
        .cool_down(Duration::from_secs(1), Duration::from_secs(30))
        .build();
    let tiers = RateTier::builder()
        .clock(clock.clone())
        .tier("free", Quota::per_minute(3))
        .storage(Arc::new(fallback.clone()))
        .build();
    let layer = post_layer(tiers, &metrics);
    let breaker = |registry: &Registry| {
        scrape(registry)
            .value("rate_tier_breaker_state", &[])
            .unwrap()
    };

    // Primary down: the first failure is decided locally, the second opens
    // the breaker; then the local store decides without asking the primary.
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    assert_eq!(breaker(&registry), 0.0);
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    assert_eq!(breaker(&registry), 1.0);
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 429);
    // Cool-down over: a probe fails (half-open, then open again, 2 s).
    clock.advance(Duration::from_secs(1));
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 429);
    assert_eq!(breaker(&registry), 1.0);
    // The primary is back: the next probe closes the breaker.
    primary.up.store(true, Ordering::SeqCst);
    clock.advance(Duration::from_secs(2));
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);
    assert_eq!(get(&layer, "/data", Some("key_ana")).await, 200);

    // Two probes saw the gauge at half-open (2); closed calls at 0.
    assert_eq!(
        *primary.gauge_at_calls.lock().unwrap(),
        vec![0.0, 0.0, 2.0, 2.0, 0.0]
    );
    let metrics = scrape(&registry);
    assert_eq!(metrics.value("rate_tier_breaker_state", &[]), Some(0.0));
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
    assert_eq!(
        metrics.histogram_count(
            "rate_tier_check_duration_seconds",
            &[("storage", "flaky")]
        ),
        7.0
    );
}
