//! The tests' Redis (`TRT_REDIS_URL`) and Redis Cluster
//! (`TRT_REDIS_CLUSTER_URLS`), both started by `cargo xtask test`:
//! connections, stores that take every answer from Redis itself (the
//! refusal memory has tests of its own), cluster connections seeded with
//! one node, as an instance configured with that one address, and
//! partitions that land in another hash slot.
#![allow(dead_code, unreachable_pub)]

use rate_tier_storage::RedisStorage;
use rate_tier_storage::key::cluster_slot;
use rate_tier_test_support::{TEST_TIMEOUT, redis_url};
use redis::aio::ConnectionManager;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

/// A connection to the tests' Redis.
pub async fn connect() -> ConnectionManager {
    redis::Client::open(redis_url())
        .expect("valid URL")
        .get_connection_manager()
        .await
        .expect("TRT_REDIS_URL does not answer: is the test server running?")
}

/// A store with its own connection, like a separate instance.
pub async fn store() -> RedisStorage {
    RedisStorage::new(connect().await)
        .timeout(TEST_TIMEOUT)
        .remember_refusals(false)
}

/// The three masters' URLs (from `cargo xtask test-cluster`).
pub fn cluster_urls() -> Vec<String> {
    rate_tier_test_support::cluster_urls(3)
}

/// A cluster connection seeded with node `node` only (connected now).
pub async fn cluster_conn(node: usize) -> ClusterConnection {
    let url = cluster_urls().swap_remove(node);
    ClusterClient::new(vec![url.as_str()])
        .expect("valid URL")
        .get_async_connection()
        .await
        .unwrap_or_else(|e| {
            panic!("the cluster node {url} does not answer: {e}")
        })
}

/// A store on [`cluster_conn`]`(node)`, remembering no refusals (each
/// call goes to Redis).
pub async fn cluster_store(node: usize) -> RedisStorage {
    RedisStorage::cluster(cluster_conn(node).await)
        .timeout(TEST_TIMEOUT)
        .remember_refusals(false)
}

/// A partition whose slot is not `slot`.
pub fn partition_off(slot: u16, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|p| cluster_slot(p, None) != slot)
        .expect("some partition lands in another slot")
}
