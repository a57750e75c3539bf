//! The example server's `/metrics`: not limited, and counting what the
//! 0.3 example's requests did, read back through a Prometheus text parser.
#![allow(clippy::unwrap_used)]

mod support;

use prometheus_parse::{LineInfo, Scrape, Value};
use support::Server;

/// The scalar value of `name{labels}` (exact label set), if present.
fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = scrape.samples.iter().filter(|s| {
        s.metric == name
            && s.labels.len() == labels.len()
            && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
    });
    let sample = found.next()?;
    assert!(found.next().is_none(), "{name}{labels:?} appears twice");
    match sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
        ref other => panic!("{name} is not a scalar: {other:?}"),
    }
}

fn scrape(server: &Server) -> Scrape {
    let response = server.get("/metrics", None);
    assert_eq!(response.status, 200, "{}", response.body);
    assert_eq!(
        response.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    // Not behind the limiter: no rate-limit headers.
    assert_eq!(response.header("x-ratelimit-limit"), None);
    assert!(response.body.ends_with("# EOF\n"), "{}", response.body);
    for line in response.body.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            matches!(LineInfo::parse(line), LineInfo::Sample { .. }),
            "not a sample line: {line:?}"
        );
    }
    Scrape::parse(response.body.lines().map(|l| Ok(l.to_owned()))).unwrap()
}

#[test]
fn metrics_count_the_posts_requests() {
    let server = Server::start(&[], &[]);

    for _ in 0..10 {
        assert_eq!(server.get("/data", Some("key_ana")).status, 200);
    }
    assert_eq!(server.get("/data", Some("key_ana")).status, 429);
    assert_eq!(server.get("/backup", Some("key_ana")).status, 403);
    assert_eq!(server.get("/data", Some("key_eva")).status, 200);
    assert_eq!(server.get("/data", None).status, 401);
    assert_eq!(server.get("/report", Some("key_bea")).status, 200);

    // Scraped twice without a key: never 401, never counted.
    for _ in 0..2 {
        let metrics = scrape(&server);
        let checks = |tier, outcome| {
            value(
                &metrics,
                "rate_tier_checks_total",
                &[("tier", tier), ("outcome", outcome)],
            )
        };
        assert_eq!(checks("free", "allowed"), Some(11.0)); // ana 10, eva 1
        assert_eq!(checks("free", "limited"), Some(1.0));
        assert_eq!(checks("free", "cost_exceeds_burst"), Some(1.0));
        assert_eq!(checks("none", "missing_identity"), Some(1.0));
        assert_eq!(checks("pro", "allowed"), Some(1.0));
        let total: f64 = metrics
            .samples
            .iter()
            .filter(|s| s.metric == "rate_tier_checks_total")
            .map(|s| match s.value {
                Value::Counter(v) | Value::Untyped(v) => v,
                _ => 0.0,
            })
            .sum();
        assert_eq!(total, 15.0);
        assert_eq!(
            value(
                &metrics,
                "rate_tier_unknown_tier_total",
                &[("policy", "use_default")]
            ),
            Some(1.0)
        );
        assert_eq!(
            value(&metrics, "rate_tier_missing_identity_total", &[]),
            Some(1.0)
        );
        // In memory, no breaker: none moved, none is anything but closed.
        assert!(
            metrics.samples.iter().all(|s| {
                s.metric != "rate_tier_breaker_transitions_total"
                    && (s.metric != "rate_tier_breaker_state"
                        || matches!(s.value, Value::Gauge(v) if v == 0.0))
            }),
            "a breaker moved"
        );
        // Each request once, by the store that decided: the memory store,
        // or none for the refusals decided before it (401, 403).
        let durations = |storage| {
            value(
                &metrics,
                "rate_tier_check_duration_seconds_count",
                &[("storage", storage)],
            )
        };
        assert_eq!(durations("memory"), Some(13.0));
        assert_eq!(durations("none"), Some(2.0));
    }
}
