#![cfg(feature = "redis")]
//! `RedisStorage` on a real Redis Cluster.
//!
//! Run with `cargo xtask test-cluster` (or `cargo xtask test`), which starts
//! a throwaway 3-master cluster on free loopback ports and sets
//! `TRT_REDIS_CLUSTER_URLS` to its nodes' URLs. Without it the tests that
//! need the cluster fail: they never pass silently, and they never use the
//! shared Redis on port 6379. Every test name holds `cluster`, which is how
//! `cargo xtask test-cluster` selects them.
//!
//! Every test uses its own tier names, so the tests can run in parallel on
//! one cluster.

use std::time::{Duration, Instant};

use gcra_core::Quota;
use rate_tier_storage::key::{KeySecret, bucket_key, cluster_bucket_key};
use rate_tier_storage::{BucketCheck, RedisStorage, Storage, StorageError};
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use sha1::{Digest, Sha1};

#[path = "common/redis_env.rs"]
mod redis_env;
use redis_env::{TEST_TIMEOUT, concurrent_passes, unique};

/// The three masters of `cargo xtask test-cluster`.
fn cluster_urls() -> Vec<String> {
    redis_env::cluster_urls(3)
}

// ---------------------------------------------------------------------------
// Helpers

/// A cluster connection seeded with node `node` only (connected now).
async fn cluster_conn(node: usize) -> ClusterConnection {
    let url = cluster_urls().swap_remove(node);
    ClusterClient::new(vec![url.as_str()])
        .expect("valid URL")
        .get_async_connection()
        .await
        .unwrap_or_else(|e| {
            panic!("the cluster node {url} does not answer: {e}")
        })
}

/// A store whose connection knows only node `node` as its seed, like an
/// instance configured with that one address.
async fn store_seeded_with(node: usize) -> RedisStorage {
    RedisStorage::cluster(cluster_conn(node).await).timeout(TEST_TIMEOUT)
}

/// A plain (non-cluster) connection to node `node`: commands run on that
/// node only, and a key of another node's slot gets a `MOVED` error.
async fn node_conn(node: usize) -> MultiplexedConnection {
    let url = cluster_urls().swap_remove(node);
    redis::Client::open(url.as_str())
        .expect("valid URL")
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| {
            panic!("the cluster node {url} does not answer: {e}")
        })
}

/// Plain connections to every node, in the order of `TRT_REDIS_CLUSTER_URLS`.
async fn every_node() -> Vec<MultiplexedConnection> {
    let mut conns = Vec::new();
    for node in 0..cluster_urls().len() {
        conns.push(node_conn(node).await);
    }
    conns
}

fn sha1_hex(data: &str) -> String {
    hex::encode(Sha1::digest(data.as_bytes()))
}

/// `CLUSTER KEYSLOT`, computed by the server.
async fn keyslot(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(conn)
        .await
        .expect("CLUSTER KEYSLOT")
}

/// The index of the node that owns `key`'s slot: the one that answers
/// `EXISTS` on a plain connection instead of redirecting with `MOVED`.
async fn owner_of(nodes: &mut [MultiplexedConnection], key: &str) -> usize {
    let mut owners = Vec::new();
    for (index, conn) in nodes.iter_mut().enumerate() {
        let reply: redis::RedisResult<i64> =
            redis::cmd("EXISTS").arg(key).query_async(conn).await;
        match reply {
            Ok(_) => owners.push(index),
            Err(e) if e.redirect_node().is_some() => {}
            Err(e) => panic!("EXISTS {key} on node {index}: {e}"),
        }
    }
    assert_eq!(owners.len(), 1, "nodes that own {key}: {owners:?}");
    owners[0]
}

/// Every key on one node matching `pattern`, with SCAN (which a cluster
/// node runs on its own keys only).
async fn scan(conn: &mut MultiplexedConnection, pattern: &str) -> Vec<String> {
    let mut keys = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// How many times node `conn` has run `command` (lower case, e.g. `eval`),
/// from `INFO commandstats`.
async fn command_calls(conn: &mut MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.trim().strip_prefix(prefix.as_str()))
        .map_or(0, |rest| {
            rest.split(',')
                .next()
                .and_then(|n| n.parse().ok())
                .expect("calls")
        })
}

/// `n` checks of one bucket alternating between `stores`: which passed.
async fn alternate(
    stores: &[&RedisStorage],
    check: &BucketCheck<'_>,
    n: usize,
) -> Vec<bool> {
    let mut passed = Vec::with_capacity(n);
    for i in 0..n {
        let decision = stores[i % stores.len()]
            .check(check)
            .await
            .unwrap_or_else(|e| panic!("check {} failed: {e}", i + 1));
        assert_eq!(decision.store, None, "Redis has already stored the TAT");
        passed.push(decision.allowed);
    }
    passed
}

// ---------------------------------------------------------------------------
// One limit, shared across nodes

#[tokio::test]
async fn cluster_two_stores_seeded_with_different_nodes_share_one_limit() {
    let mut nodes = every_node().await;
    // A user whose bucket lives on node 2: neither store's seed owns it, so
    // both are routed there by redis-rs.
    let tier = unique("share");
    let mut user = None;
    for n in 0..1000 {
        let candidate = format!("ana-{n}");
        let key = cluster_bucket_key(&tier, &candidate, None);
        if owner_of(&mut nodes, &key).await == 2 {
            user = Some(candidate);
            break;
        }
    }
    let user = user.expect("no user of 1000 has a key on node 2");
    let (a, b) = (store_seeded_with(0).await, store_seeded_with(1).await);
    assert!(a.is_cluster() && b.is_cluster());
    let check = BucketCheck::new(&tier, &user, Quota::per_minute(10), 1);

    let passed = alternate(&[&a, &b], &check, 11).await;
    assert_eq!(
        passed,
        [vec![true; 10], vec![false]].concat(),
        "10 of 11 checks must pass, the first ten"
    );

    let refused = a.check(&check).await.expect("check");
    assert!(!refused.allowed);
    assert_eq!(refused.remaining, 0);
    // Retry-After rounds up: 6 s, as in the post.
    assert_eq!(refused.retry_after_us.div_ceil(1_000_000), 6);
    assert!(
        refused.reset_after_us > 59_000_000
            && refused.reset_after_us <= 60_000_000,
        "reset_after_us {}",
        refused.reset_after_us
    );

    // The bucket is on node 2, under the cluster key, and nowhere else.
    let key = cluster_bucket_key(&tier, &user, None);
    let on_owner: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut nodes[2])
        .await
        .expect("EXISTS on the owner");
    assert_eq!(on_owner, 1, "{key} is not on node 2");
    for (index, node) in nodes.iter_mut().enumerate() {
        let keys = scan(node, &format!("trt:{tier}:*")).await;
        let expected = if index == 2 {
            vec![key.clone()]
        } else {
            vec![]
        };
        assert_eq!(keys, expected, "keys of tier {tier} on node {index}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_concurrent_checks_through_two_nodes_pass_exactly_the_quota() {
    for (quota, limit) in
        [(Quota::per_minute(10), 10), (Quota::per_minute(100), 100)]
    {
        let tier = unique("conc");
        let (a, b) = (store_seeded_with(0).await, store_seeded_with(1).await);
        let passed = concurrent_passes(a, b, 300, |store| {
            let tier = tier.clone();
            async move {
                let check = BucketCheck::new(&tier, "ana", quota, 1);
                store.check(&check).await.expect("check").allowed
            }
        })
        .await;
        assert_eq!(passed, limit);
    }
}

#[tokio::test]
async fn cluster_store_from_urls_shares_with_one_built_by_hand() {
    // Lazy, seeded with every node, next to an eager one seeded with node 2.
    let lazy = RedisStorage::from_cluster_urls(cluster_urls())
        .expect("store")
        .timeout(TEST_TIMEOUT);
    let eager = store_seeded_with(2).await;
    let tier = unique("lazy");
    let check = BucketCheck::new(&tier, "bea", Quota::per_minute(10), 1);
    let passed = alternate(&[&lazy, &eager], &check, 11).await;
    assert_eq!(passed, [vec![true; 10], vec![false]].concat());

    // A cost is charged atomically, as on a single node.
    let tier = unique("cost");
    let five = BucketCheck::new(&tier, "bea", Quota::per_minute(10), 5);
    assert_eq!(lazy.check(&five).await.expect("check").remaining, 5);
    assert_eq!(eager.check(&five).await.expect("check").remaining, 0);
    assert!(!lazy.check(&five).await.expect("check").allowed);
}

// ---------------------------------------------------------------------------
// Keys and slots

#[tokio::test]
async fn cluster_key_lands_in_the_slot_of_its_hash_tag() {
    let store = store_seeded_with(0).await;
    let mut nodes = every_node().await;
    let tier = unique("slot");
    let other_tier = unique("slot-pro");
    let user = unique("user");
    let hash = sha1_hex(&user);

    let key = format!("trt:{tier}:{{{hash}}}");
    assert_eq!(cluster_bucket_key(&tier, &user, None), key);
    for tier in [&tier, &other_tier] {
        let check = BucketCheck::new(tier, &user, Quota::per_minute(10), 1);
        assert!(store.check(&check).await.expect("check").allowed);
    }

    // The slot is the tag's: the same for every tier of the user.
    let slot = keyslot(&mut nodes[0], &key).await;
    assert_eq!(slot, keyslot(&mut nodes[0], &hash).await);
    let other_key = cluster_bucket_key(&other_tier, &user, None);
    assert_eq!(keyslot(&mut nodes[0], &other_key).await, slot);
    // Without the tag (the single-node format) the two would differ.
    let (plain, plain_other) = (
        bucket_key(&tier, &user, None),
        bucket_key(&other_tier, &user, None),
    );
    assert_ne!(
        keyslot(&mut nodes[0], &plain).await,
        keyslot(&mut nodes[0], &plain_other).await,
        "(unlikely) the untagged keys share a slot by chance"
    );

    // Both buckets are on the slot's owner: a multi-key command on them
    // runs there without CROSSSLOT.
    let owner = owner_of(&mut nodes, &key).await;
    let both: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .arg(&other_key)
        .query_async(&mut nodes[owner])
        .await
        .expect("EXISTS of two keys on the owner");
    assert_eq!(both, 2);
    let in_slot: i64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query_async(&mut nodes[owner])
        .await
        .expect("COUNTKEYSINSLOT");
    assert!(in_slot >= 2, "{in_slot} keys in slot {slot}");

    // The value and expiry are those of a single node.
    let value: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut nodes[owner])
        .await
        .expect("GET");
    assert!(
        !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()),
        "stored value {value:?} is not an integer string"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut nodes[owner])
        .await
        .expect("PTTL");
    assert!(ttl > 5_000 && ttl <= 6_000, "PTTL {ttl}");
    // No key in the single-node format was written.
    let mut cluster = cluster_conn(1).await;
    let plain_exists: i64 = redis::cmd("EXISTS")
        .arg(&plain)
        .query_async(&mut cluster)
        .await
        .expect("EXISTS");
    assert_eq!(plain_exists, 0, "{plain} exists");
}

#[tokio::test]
async fn cluster_key_secret_makes_the_tag_an_hmac() {
    let store = store_seeded_with(1).await;
    let mut nodes = every_node().await;
    let tier = unique("hmac");
    let user = unique("ana.secret.user");
    let secret = KeySecret::new(b"s3cret");
    let check = BucketCheck::new(&tier, &user, Quota::per_minute(10), 1)
        .key_secret(Some(&secret));
    assert!(store.check(&check).await.expect("check").allowed);

    let key = cluster_bucket_key(&tier, &user, Some(&secret));
    assert_ne!(key, cluster_bucket_key(&tier, &user, None));
    let owner = owner_of(&mut nodes, &key).await;
    for (index, node) in nodes.iter_mut().enumerate() {
        let keys = scan(node, &format!("trt:{tier}:*")).await;
        let expected = if index == owner {
            vec![key.clone()]
        } else {
            vec![]
        };
        assert_eq!(keys, expected, "keys of tier {tier} on node {index}");
        assert!(keys.iter().all(|k| !k.contains(&user)));
    }
}

#[tokio::test]
async fn cluster_keys_of_many_users_spread_over_every_node() {
    let store = store_seeded_with(0).await;
    let mut nodes = every_node().await;
    let tier = unique("spread");
    const USERS: usize = 60;
    for n in 0..USERS {
        let user = format!("spread-user-{n}");
        let check = BucketCheck::new(&tier, &user, Quota::per_minute(10), 1);
        assert!(store.check(&check).await.expect("check").allowed);
    }
    let mut per_node = Vec::new();
    for node in &mut nodes {
        per_node.push(scan(node, &format!("trt:{tier}:*")).await.len());
    }
    assert_eq!(
        per_node.iter().sum::<usize>(),
        USERS,
        "keys per node: {per_node:?}"
    );
    // The tag is the user's hash, not the tier: one tier's users spread
    // over the whole cluster (with 60 users, every node gets some).
    assert!(
        per_node.iter().all(|&count| count > 0),
        "keys per node: {per_node:?}"
    );
}

// ---------------------------------------------------------------------------
// The script

#[tokio::test]
async fn cluster_script_flush_on_every_node_is_recovered_from() {
    let store = store_seeded_with(0).await;
    let mut nodes = every_node().await;
    let script_sha = sha1_hex(include_str!("../src/redis/gcra.lua"));
    let tier = unique("noscript");
    let check = BucketCheck::new(&tier, "ana", Quota::per_minute(10), 1);
    assert_eq!(store.check(&check).await.expect("check").remaining, 9);
    let key = cluster_bucket_key(&tier, "ana", None);
    let owner = owner_of(&mut nodes, &key).await;
    let evals_before = command_calls(&mut nodes[owner], "eval").await;

    for node in &mut nodes {
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(node)
            .await
            .expect("SCRIPT FLUSH");
    }
    let decision = store.check(&check).await.expect("check after SCRIPT FLUSH");
    assert!(decision.allowed);
    assert_eq!(decision.remaining, 8, "the bucket survived the flush");

    // The NOSCRIPT was answered with an EVAL on the key's node (not with a
    // SCRIPT LOAD sent to every node), which cached the script there.
    assert!(
        command_calls(&mut nodes[owner], "eval").await > evals_before,
        "no EVAL ran on the node of {key} after the flush"
    );
    let loaded: Vec<i64> = redis::cmd("SCRIPT")
        .arg("EXISTS")
        .arg(&script_sha)
        .query_async(&mut nodes[owner])
        .await
        .expect("SCRIPT EXISTS");
    assert_eq!(loaded, [1], "the script was loaded again on its node");

    // Flushed again: a store seeded with another node recovers the same way.
    for node in &mut nodes {
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(node)
            .await
            .expect("SCRIPT FLUSH");
    }
    let other = store_seeded_with(2).await;
    assert_eq!(other.check(&check).await.expect("check").remaining, 7);
}

// ---------------------------------------------------------------------------
// Connecting and timeouts (no cluster needed)

#[tokio::test]
async fn cluster_from_urls_does_not_wait_and_a_dead_cluster_fails_in_time() {
    // A port that was free a moment ago: connections are refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let timeout = Duration::from_millis(100);
    let started = Instant::now();
    let store =
        RedisStorage::from_cluster_urls([format!("redis://127.0.0.1:{port}/")])
            .expect("store")
            .timeout(timeout);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "from_cluster_urls waited for the cluster"
    );
    let check = BucketCheck::new("free", "ana", Quota::per_minute(10), 1);
    for _ in 0..3 {
        let started = Instant::now();
        let result = store.check(&check).await;
        let took = started.elapsed();
        assert!(
            matches!(
                result,
                Err(StorageError::Backend(_) | StorageError::Timeout(_))
            ),
            "{result:?}"
        );
        assert!(took < timeout + Duration::from_millis(200), "took {took:?}");
    }
}

#[tokio::test]
async fn cluster_silent_node_times_out() {
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let timeout = Duration::from_millis(50);
    let store =
        RedisStorage::from_cluster_urls([format!("redis://127.0.0.1:{port}/")])
            .expect("store")
            .timeout(timeout);
    let check = BucketCheck::new("free", "ana", Quota::per_minute(10), 1);
    for _ in 0..2 {
        let started = Instant::now();
        let result = store.check(&check).await;
        let took = started.elapsed();
        assert!(
            matches!(result, Err(StorageError::Timeout(d)) if d == timeout),
            "{result:?}"
        );
        assert!(took >= timeout && took < Duration::from_secs(1), "{took:?}");
    }
}

#[test]
fn cluster_from_urls_needs_a_runtime_and_a_url() {
    assert!(matches!(
        RedisStorage::from_cluster_urls(["redis://127.0.0.1:7000/"]),
        Err(StorageError::Backend(_))
    ));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let none: Vec<String> = Vec::new();
        assert!(matches!(
            RedisStorage::from_cluster_urls(none),
            Err(StorageError::Backend(_))
        ));
        assert!(matches!(
            RedisStorage::from_cluster_urls([
                "redis://127.0.0.1:7000/",
                "nope"
            ]),
            Err(StorageError::Backend(_))
        ));
        let store = RedisStorage::from_cluster_urls([
            "redis://:hunter2@127.0.0.1:7000/",
        ])
        .expect("store");
        let shown = format!("{store:?}");
        assert!(shown.contains("cluster: true"), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    });
}
