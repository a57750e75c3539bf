//! The service on a Redis Cluster: two instances share every limit exactly.
//!
//! Run with `cargo xtask test-cluster -- -p rate-tier-service` (it sets
//! `TRT_REDIS_CLUSTER_URLS`); every test name contains `cluster`.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_two_instances_share_every_limit_exactly() {
    let domain = unique("cluster");
    let a =
        Svc::start_in(Backend::Cluster.store(), &domain, SHARED, |_| {}).await;
    let b =
        Svc::start_in(Backend::Cluster.store(), &domain, SHARED, |_| {}).await;
    let first =
        concurrent_oks(&a, &b, 200, || vec![desc(&[("user", "ana")])]).await;
    assert_eq!(first, 20, "exactly the limit");
    // Many users at once: each gets exactly its own 20 (their buckets are
    // spread over the nodes).
    for user in ["u1", "u2", "u3"] {
        assert_eq!(
            concurrent_oks(&a, &b, 60, || vec![desc(&[("user", user)])]).await,
            20
        );
    }
    // The tier and the search limit of one user share the user's slot (the
    // partition is the hash tag): one atomic decision, exact under
    // concurrency.
    let ok = concurrent_oks(&a, &b, 100, || {
        vec![desc(&[("plan", "ana")]), desc(&[("search", "ana")])]
    })
    .await;
    assert_eq!(ok, 10);
    let plan = b.ask(vec![desc_hits(&[("plan", "ana")], 0)]).await;
    assert_eq!(plan.statuses[0].limit_remaining, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_every_semantic() {
    support::semantics::every_semantic(&Backend::Cluster).await;
}
