//! Every semantic of the service over gRPC on Redis (with its fallback), and
//! two instances on one Redis sharing every limit exactly.
//!
//! Run with `cargo xtask test-redis -- -p rate-tier-service`: it starts a
//! throwaway redis-server and sets `TRT_REDIS_URL`. Without it these tests
//! fail; they never pass silently and never touch port 6379. Every test has
//! a domain of its own, so bucket names never collide.

#[macro_use]
mod support;

use support::*;

every_semantic!(Backend::Redis);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_every_limit_exactly() {
    let domain = unique("shared");
    let a =
        Svc::start_in(Backend::Redis.store(), &domain, SHARED, |_| {}).await;
    let b =
        Svc::start_in(Backend::Redis.store(), &domain, SHARED, |_| {}).await;

    // One limit: exactly 20 of 200 concurrent requests.
    let ok =
        concurrent_oks(&a, &b, 200, || vec![desc(&[("user", "ana")])]).await;
    assert_eq!(ok, 20);

    // Two limits as one decision: exactly 10 (the search limit), and the
    // tier charged exactly 10 times (never by a refused request).
    let ok = concurrent_oks(&a, &b, 100, || {
        vec![desc(&[("plan", "ana")]), desc(&[("search", "ana")])]
    })
    .await;
    assert_eq!(ok, 10);
    let plan = b.ask(vec![desc_hits(&[("plan", "ana")], 0)]).await;
    assert_eq!(plan.statuses[0].limit_remaining, 20);
    let plan = a.ask(vec![desc_hits(&[("plan", "ana")], 0)]).await;
    assert_eq!(
        plan.statuses[0].limit_remaining, 20,
        "both instances see one bucket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_reports_its_latency_and_breaker() {
    let dir = TempDir::new();
    let domain = unique("m");
    dir.write("c.yaml", &config(&domain, SHARED));
    let mut options = rate_tier_service::ServiceOptions::new(dir.path());
    options.grpc_addr = "127.0.0.1:0".parse().expect("addr");
    options.http_addr = "127.0.0.1:0".parse().expect("addr");
    options.store = rate_tier_service::StoreChoice::Redis(
        rate_tier_test_support::redis_url(),
    );
    options.redis_timeout = TEST_TIMEOUT;
    options.watch = false;
    let running = rate_tier_service::Service::start(options)
        .await
        .expect("starts");
    let mut client = client(running.grpc_addr()).await;
    let r = client
        .should_rate_limit(request(&domain, vec![desc(&[("user", "ana")])]))
        .await
        .expect("OK")
        .into_inner();
    assert_eq!(r.statuses[0].limit_remaining, 19);
    let metrics = http(running.http_addr(), "GET", "/metrics", b"").await.body;
    assert!(
        metrics.contains(
            "ratelimit_service_store_latency_seconds_count{store=\"redis\"} 1"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("ratelimit_service_breaker_state{domain=\"all\"} 0"),
        "{metrics}"
    );
    running.stop().await;
}
