#![cfg(feature = "redis")]
//! Two `RateTier`s ("two instances") on one Redis Cluster, each configured
//! with a different node, share one limit.
//!
//! Run with `cargo xtask test-cluster` (or `cargo xtask test`), which starts
//! a throwaway 3-master cluster and sets `TRT_REDIS_CLUSTER_URLS`. Without
//! it these tests fail: they never pass silently, and they never use the
//! shared Redis on port 6379. Every test name holds `cluster`, which is how
//! `cargo xtask test-cluster` selects them; each uses its own tier names.

use std::sync::Arc;
use std::time::Duration;

use tower_rate_tier::key::cluster_bucket_key;
use tower_rate_tier::{LimitReason, Quota, RateTier, RedisStorage};

#[path = "../../rate-tier-storage/tests/common/redis_env.rs"]
mod redis_env;
use redis_env::{TEST_TIMEOUT, concurrent_passes, unique};

/// Two nodes of `cargo xtask test-cluster`'s cluster.
fn cluster_urls() -> Vec<String> {
    redis_env::cluster_urls(2)
}

/// One instance of the post's service, configured with cluster node `node`
/// only: tiers `<tier>` (10/min) and `<tier>-pro` (100/min), default `<tier>`.
fn instance(tier: &str, node: usize) -> RateTier {
    let url = cluster_urls().swap_remove(node);
    let store = RedisStorage::from_cluster_urls([url])
        .expect("store")
        .timeout(TEST_TIMEOUT);
    RateTier::builder()
        .tier(tier, Quota::per_minute(10))
        .tier(format!("{tier}-pro"), Quota::per_minute(100))
        .default_tier(tier)
        .storage(Arc::new(store))
        .build()
}

#[tokio::test]
async fn cluster_two_instances_on_different_nodes_share_one_limit() {
    let tier = unique("free");
    let instances = [instance(&tier, 0), instance(&tier, 1)];
    assert_eq!(instances[0].storage().kind(), "redis");

    // As in the post: Ana alternates between two instances.
    for i in 1..=10_u64 {
        let info = instances[(i % 2) as usize]
            .check("key_ana", &tier, 1)
            .await
            .expect("storage")
            .unwrap_or_else(|l| panic!("request {i} refused: {l:?}"));
        assert_eq!(info.limit, 10);
        assert_eq!(info.remaining, 10 - i);
    }
    let limited = instances[1]
        .check("key_ana", &tier, 1)
        .await
        .expect("storage")
        .expect_err("the 11th request passed");
    assert_eq!(limited.reason(), LimitReason::RateLimited);
    assert_eq!(limited.retry_after_secs(), 6);
    assert!(limited.reset_after() <= Duration::from_secs(60));
    assert!(limited.reset_after() > Duration::from_secs(59));

    // The bucket is the cluster key, on exactly one node (the others
    // redirect with MOVED).
    let key = cluster_bucket_key(&tier, "key_ana", None);
    assert_eq!(
        key,
        format!("trt:{tier}:{{33d2315cbeb866b8b237240a98d605f2e6e41b8a}}")
    );
    let mut found = 0;
    for url in cluster_urls() {
        let mut conn = redis::Client::open(url.as_str())
            .expect("URL")
            .get_multiplexed_async_connection()
            .await
            .expect("node answers");
        let reply: redis::RedisResult<i64> =
            redis::cmd("EXISTS").arg(&key).query_async(&mut conn).await;
        match reply {
            Ok(n) => found += n,
            Err(e) => assert!(e.redirect_node().is_some(), "{url}: {e}"),
        }
    }
    assert_eq!(found, 1, "{key} is not on exactly one node");
}

/// `checks` concurrent checks of one user in `tier`, half through an
/// instance on node 0 and half through one on node 2: how many pass.
async fn passes(tier: &str, base: &str, checks: usize) -> usize {
    let (a, b) = (instance(base, 0), instance(base, 2));
    concurrent_passes(a, b, checks, |limiter| {
        let tier = tier.to_owned();
        async move {
            limiter
                .check("key_bea", &tier, 1)
                .await
                .expect("storage")
                .is_ok()
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_concurrent_checks_on_two_instances_pass_exactly_the_quota() {
    let base = unique("conc");
    assert_eq!(passes(&base, &base, 300).await, 10);
    let pro = format!("{base}-pro");
    assert_eq!(passes(&pro, &base, 300).await, 100);
}
