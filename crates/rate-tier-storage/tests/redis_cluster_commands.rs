//! What a store on a Redis Cluster sends its nodes, counted with `INFO
//! commandstats`: a script's source only after a node answered
//! `NOSCRIPT` (an error of the script itself is the answer, not a reason
//! to send it whole), and a plain `ZREM` for the release of one limit's
//! few slots.
//!
//! Run with `cargo xtask test-cluster` (`TRT_REDIS_CLUSTER_URLS`).

mod redis_support;
use std::time::Duration;

use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    BucketCheck, Concurrency, Decision, LimitName, Quota, Rule,
};
use rate_tier_test_support::unique;
use redis_support::{cluster_store, cluster_urls};

/// The tests of this file count every node's commands: one at a time.
static COUNTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How many times the nodes ran each of `commands` (lower case), summed.
async fn calls(commands: &[&str]) -> Vec<u64> {
    let mut totals = vec![0; commands.len()];
    for url in cluster_urls() {
        let mut conn = node(&url).await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("INFO commandstats");
        for (total, command) in totals.iter_mut().zip(commands) {
            let prefix = format!("cmdstat_{command}:calls=");
            *total += info
                .lines()
                .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse::<u64>().expect("calls"));
        }
    }
    totals
}

/// Every node out of memory (`maxmemory` 1 byte) while it lives: writes,
/// a script's included, fail with `OOM`; restored on drop, even after a
/// failed assertion.
struct OutOfMemory;

impl OutOfMemory {
    async fn start() -> OutOfMemory {
        for url in cluster_urls() {
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg("1")
                .query_async(&mut node(&url).await)
                .await
                .expect("CONFIG SET maxmemory");
        }
        OutOfMemory
    }
}

/// A connection to the node at `url` alone.
async fn node(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .expect("valid URL")
        .get_multiplexed_async_connection()
        .await
        .expect("the node answers")
}

impl Drop for OutOfMemory {
    fn drop(&mut self) {
        for url in cluster_urls() {
            let mut conn = redis::Client::open(url.as_str())
                .expect("valid URL")
                .get_connection_with_timeout(Duration::from_secs(5))
                .expect("the node answers");
            let () = redis::cmd("CONFIG")
                .arg("SET")
                .arg("maxmemory")
                .arg("0")
                .query(&mut conn)
                .expect("CONFIG SET maxmemory 0");
        }
    }
}

#[tokio::test]
async fn cluster_a_script_error_is_the_answer_and_its_source_is_not_sent() {
    let _counting = COUNTING.lock().await;
    let store = cluster_store(0).await;
    let name = LimitName::new(unique("cscripterr")).unwrap();
    let check =
        [BucketCheck::new(&name, "eva", Quota::per_hour(10), 1).unwrap()];
    let mut out = [Decision::default()];
    // The node that owns the bucket has the script from now on.
    assert!(store.check(&check, &mut out).await.unwrap().verdict.allowed);

    let full = OutOfMemory::start().await;
    let before = calls(&["evalsha", "eval"]).await;
    let error = store.check(&check, &mut out).await.unwrap_err();
    assert!(error.to_string().contains("OOM"), "{error}");
    let after = calls(&["evalsha", "eval"]).await;
    drop(full);
    assert_eq!(
        (after[0] - before[0], after[1] - before[1]),
        (1, 0),
        "one EVALSHA, and no EVAL after its error"
    );
    assert!(store.check(&check, &mut out).await.unwrap().verdict.allowed);
}

#[tokio::test]
async fn cluster_a_release_of_one_limits_few_slots_is_one_zrem_and_no_script() {
    let _counting = COUNTING.lock().await;
    let store = cluster_store(0).await;
    let name = LimitName::of_limit(unique("czrem")).unwrap();
    let rule = Rule::from(Concurrency::new(4).unwrap());
    let slot = BucketCheck::of_rule(&name, "eva", rule, 2)
        .unwrap()
        .lease_id(7);
    let mut out = [Decision::default()];
    assert!(
        store
            .check(&[slot], &mut out)
            .await
            .unwrap()
            .verdict
            .allowed
    );

    let before = calls(&["zrem", "evalsha", "eval"]).await;
    store.release(&[slot]).await.unwrap();
    let after = calls(&["zrem", "evalsha", "eval"]).await;
    let sent: Vec<u64> =
        after.iter().zip(&before).map(|(a, b)| a - b).collect();
    assert_eq!(sent, [1, 0, 0], "ZREM, EVALSHA, EVAL");
    let peek = [slot.as_peek().lease_id(0)];
    store.check(&peek, &mut out).await.unwrap();
    assert_eq!(out[0].remaining, 4, "both slots given back");
}
