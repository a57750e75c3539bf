//! The library's Grafana dashboard (`examples/grafana/tower-rate-tier.json`)
//! queries only what `RateLimitMetrics` exports: every query is checked
//! against scrapes of the example server's `/metrics` after traffic that
//! makes every family it charts appear.
#![allow(clippy::unwrap_used)]

mod support;

use serde_json::Value;
use support::{Server, free_port};

#[path = "../grafana/check.rs"]
mod check;

const PREFIXES: &[&str] = &["rate_tier_"];

fn dashboard() -> Value {
    let path =
        concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/tower-rate-tier.json");
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

fn scrape(server: &Server, into: &mut check::Exposed) {
    let response = server.get("/metrics", None);
    assert_eq!(response.status, 200, "{response:?}");
    into.add(&response.body).expect("a valid exposition");
}

/// Two servers' scrapes. In memory: allowed, refused, an unknown tier and
/// a request without a key. In shadow mode over a Redis nobody listens
/// on: shadow refusals, the local fallback's decisions and its breaker.
fn scrapes_after_traffic() -> check::Exposed {
    let mut exposed = check::Exposed::default();

    let memory = Server::start(&[], &[]);
    // free: 10 a minute.
    for _ in 0..10 {
        assert_eq!(memory.get("/data", Some("key_ana")).status, 200);
    }
    assert_eq!(memory.get("/data", Some("key_ana")).status, 429);
    assert_eq!(memory.get("/data", Some("key_eva")).status, 200);
    assert_eq!(memory.get("/data", None).status, 401);
    scrape(&memory, &mut exposed);

    let redis = format!("redis://127.0.0.1:{}/", free_port());
    let shadow = Server::start(&["--shadow", "--redis", &redis], &[]);
    for _ in 0..11 {
        assert_eq!(shadow.get("/data", Some("key_ana")).status, 200);
    }
    scrape(&shadow, &mut exposed);
    exposed
}

#[test]
fn every_query_names_what_the_library_exports() {
    let exposed = scrapes_after_traffic();
    let used = check::check(&dashboard(), PREFIXES, &exposed)
        .unwrap_or_else(|problems| panic!("{}", problems.join("\n")));
    eprintln!("the dashboard uses {used:#?}");

    // The check fails for a misspelt prefix, for a family's name without
    // the suffix Prometheus stores, and for a label the series lacks.
    for (from, to, problem) in [
        ("rate_tier_", "rate_teir_", "is not a metric of this binary"),
        (
            "rate_tier_checks_total",
            "rate_tier_checks",
            "`rate_tier_checks` is not in the scrape",
        ),
        (
            "by (le, storage)",
            "by (le, store)",
            "no metric of the query has the label `store`",
        ),
    ] {
        let text = dashboard().to_string().replace(from, to);
        let broken = serde_json::from_str(&text).unwrap();
        let problems = check::check(&broken, PREFIXES, &exposed)
            .expect_err("a broken dashboard fails the check");
        assert!(problems.iter().any(|p| p.contains(problem)), "{problems:?}");
    }
}
