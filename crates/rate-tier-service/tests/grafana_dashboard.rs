//! The service's Grafana dashboard (`examples/grafana/rate-tier-service.json`)
//! queries only what the binary exports: every query is checked against a
//! scrape of the running binary, after traffic that makes every family it
//! charts appear (a refusal, a near-limit, a shadow refusal, a config load,
//! store latency, the breaker).

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Child, TempDir, eventually, http};

#[path = "../../../examples/grafana/check.rs"]
mod check;

const PREFIXES: &[&str] = &["ratelimit_service_"];

/// 5 a minute per address; `path` in shadow mode at 1 a minute.
const RULES: &str = concat!(
    "domain: shop\ndescriptors:\n",
    "  - key: remote_address\n",
    "    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    "  - key: path\n    shadow_mode: true\n",
    "    rate_limit: {unit: minute, requests_per_unit: 1}\n",
);

fn dashboard() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/grafana/rate-tier-service.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// A scrape of the binary after traffic, from the listener Prometheus
/// scrapes (`USE_PROMETHEUS`). Its Redis is a port nobody listens on: the
/// local fallback decides, and the breaker's state is exported.
async fn scrape_after_traffic() -> check::Exposed {
    let root = TempDir::new();
    root.write("ratelimit/config/config.yaml", RULES);
    let [web, grpc, debug, prometheus, redis] =
        [(); 5].map(|()| rate_tier_test_support::free_port());
    let mut command = support::binary();
    command
        .env_clear()
        .env("HOST", "127.0.0.1")
        .env("PORT", web.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", debug.to_string())
        .env("RUNTIME_ROOT", root.path())
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("REDIS_URL", format!("127.0.0.1:{redis}"))
        .env("USE_PROMETHEUS", "true")
        .env("PROMETHEUS_ADDR", format!("127.0.0.1:{prometheus}"))
        .env("LOG_LEVEL", "error");
    let child = Child::new(&mut command);
    for port in [web, prometheus] {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let up = eventually(Duration::from_secs(20), || async move {
            tokio::net::TcpStream::connect(addr).await.is_ok()
        })
        .await;
        assert!(up, "nothing listens on {port}: {}", child.stderr());
    }

    let web = SocketAddr::from(([127, 0, 0, 1], web));
    let body = json!({
        "domain": "shop",
        "descriptors": [
            {"entries": [{"key": "remote_address", "value": "10.0.0.1"}]},
            {"entries": [{"key": "path", "value": "/cart"}]},
        ],
    })
    .to_string();
    // 4 within the limit, the 5th near it, the 6th over it; the shadow
    // rule refuses from the 2nd on and lets them through.
    let mut codes = Vec::new();
    for _ in 0..6 {
        codes.push(http(web, "POST", "/json", body.as_bytes()).await.status);
    }
    assert_eq!(codes, [200, 200, 200, 200, 200, 429]);

    let metrics =
        http(([127, 0, 0, 1], prometheus).into(), "GET", "/metrics", b"").await;
    assert_eq!(metrics.status, 200, "{metrics:?}; {}", child.stop());
    let mut exposed = check::Exposed::default();
    exposed.add(&metrics.body).expect("a valid exposition");
    exposed
}

#[tokio::test]
async fn every_query_names_what_the_binary_exports() {
    let exposed = scrape_after_traffic().await;
    let used = check::check(&dashboard(), PREFIXES, &exposed)
        .unwrap_or_else(|problems| panic!("{}", problems.join("\n")));
    eprintln!("the dashboard uses {used:#?}");

    // The check fails for a misspelt prefix, for a family's name without
    // the suffix Prometheus stores, and for a label the series lacks.
    for (from, to, problem) in [
        (
            "ratelimit_service_",
            "ratelimit_servce_",
            "is not a metric of this binary",
        ),
        (
            "rate_limit_over_limit_total",
            "rate_limit_over_limit",
            "`ratelimit_service_rate_limit_over_limit` is not in the scrape",
        ),
        (
            "by (le, store)",
            "by (le, storage)",
            "no metric of the query has the label `storage`",
        ),
    ] {
        let text = dashboard().to_string().replace(from, to);
        let broken = serde_json::from_str(&text).expect("JSON");
        let problems = check::check(&broken, PREFIXES, &exposed)
            .expect_err("a broken dashboard fails the check");
        assert!(problems.iter().any(|p| p.contains(problem)), "{problems:?}");
    }
}
