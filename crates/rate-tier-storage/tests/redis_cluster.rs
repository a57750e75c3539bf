//! `RedisStorage` on a real Redis Cluster.
//!
//! Run with `cargo xtask test-cluster` (or `cargo xtask test`), which starts
//! a throwaway 3-master cluster on free loopback ports and sets
//! `TRT_REDIS_CLUSTER_URLS` to its nodes' URLs. Without it the tests that
//! need the cluster fail: they never pass silently, and they never use the
//! shared Redis on port 6379. Every test name holds `cluster`, which is how
//! `cargo xtask test-cluster` selects them.
//!
//! Every test uses its own limit names, so the tests can run in parallel on
//! one cluster. Quotas are per hour where an exact count is checked.

mod redis_support;
use std::time::{Duration, Instant};

use rate_tier_storage::StorageExt;
use rate_tier_storage::key::{KeySecret, bucket_key, cluster_bucket_key};
use rate_tier_storage::{
    Adjust, BucketCheck, Decided, Decision, KeyLayout, LimitName, Quota,
    RedisStorage, Storage, StorageError,
};
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use sha1::{Digest, Sha1};

use redis_support::{cluster_conn, cluster_store, cluster_urls};

use rate_tier_test_support::{
    Monitor, TEST_TIMEOUT, concurrent_passes, unique,
};

const SECOND: u64 = 1_000_000;
const MINUTE: u64 = 60 * SECOND;

// ---------------------------------------------------------------------------
// Helpers

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

/// A limit name no other test uses.
fn limit(prefix: &str) -> LimitName {
    LimitName::new(unique(prefix)).expect("a valid name")
}

fn sha1_hex(data: &str) -> String {
    hex::encode(Sha1::digest(data.as_bytes()))
}

fn key(check: &BucketCheck<'_>) -> String {
    check.key(KeyLayout::Cluster)
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

/// A partition whose bucket under `name` is on node `node`.
async fn partition_on(
    nodes: &mut [MultiplexedConnection],
    name: &str,
    prefix: &str,
    node: usize,
) -> String {
    for n in 0..1000 {
        let candidate = format!("{prefix}-{n}");
        let key = cluster_bucket_key(name, &candidate, None);
        if owner_of(nodes, &key).await == node {
            return candidate;
        }
    }
    panic!("no partition of 1000 has a key on node {node}")
}

async fn scan(conn: &mut MultiplexedConnection, pattern: &str) -> Vec<String> {
    rate_tier_test_support::scan_keys(conn, pattern)
        .await
        .expect("SCAN")
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

/// A bucket's stored value and expiry, read through the cluster.
async fn stored(
    conn: &mut ClusterConnection,
    key: &str,
) -> (Option<String>, i64) {
    let value: Option<String> = redis::cmd("GET")
        .arg(key)
        .query_async(conn)
        .await
        .expect("GET");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("PTTL");
    (value, ttl)
}

/// One decision over `checks`, which every Redis decision answers alike.
async fn decide(
    store: &RedisStorage,
    checks: &[BucketCheck<'_>],
) -> (Decided, Vec<Decision>) {
    let mut out = vec![Decision::default(); checks.len()];
    let decided = store.check(checks, &mut out).await.expect("check");
    assert_eq!((decided.by, decided.now_us), ("redis", None));
    assert!(
        out.iter().all(|d| d.store.is_none()),
        "Redis stored the TATs"
    );
    (decided, out)
}

/// One check of one enforced bucket.
async fn check(store: &RedisStorage, check: &BucketCheck<'_>) -> Decision {
    let (decided, out) = decide(store, std::slice::from_ref(check)).await;
    assert_eq!(decided.verdict.allowed, out[0].allowed);
    out[0]
}

/// One check, its error included.
async fn check_once(
    store: &RedisStorage,
    check: BucketCheck<'_>,
) -> Result<Decision, StorageError> {
    let mut out = [Decision::default()];
    store.check(&[check], &mut out).await.map(|_| out[0])
}

/// `n` checks of one bucket alternating between `stores`: which passed.
async fn alternate(
    stores: &[&RedisStorage],
    check: &BucketCheck<'_>,
    n: usize,
) -> Vec<bool> {
    let mut passed = Vec::with_capacity(n);
    for i in 0..n {
        passed.push(self::check(stores[i % stores.len()], check).await.allowed);
    }
    passed
}

/// Whether a command run inside a script reads keys (`GET`, `MGET`): a
/// script reads each of its keys once per run.
fn is_read(command: &[String]) -> bool {
    command[0] == "get" || command[0] == "mget"
}

/// Asserts `value` is in `(expected - slack, expected]`.
#[track_caller]
fn about(value: u64, expected: u64, slack: u64, what: &str) {
    assert!(
        value <= expected && value + slack > expected,
        "{what}: {value}, expected {expected} (less at most {slack})"
    );
}

// ---------------------------------------------------------------------------
// One limit, shared across nodes

#[tokio::test]
async fn cluster_two_stores_seeded_with_different_nodes_share_one_limit() {
    let mut nodes = every_node().await;
    // A user whose bucket lives on node 2: neither store's seed owns it, so
    // both are routed there by redis-rs.
    let tier = limit("share");
    let user = partition_on(&mut nodes, tier.as_str(), "ana", 2).await;
    let (a, b) = (cluster_store(0).await, cluster_store(1).await);
    assert!(a.is_cluster() && b.is_cluster());
    let one = BucketCheck::new(&tier, &user, Quota::per_minute(10), 1).unwrap();

    let passed = alternate(&[&a, &b], &one, 11).await;
    assert_eq!(
        passed,
        [vec![true; 10], vec![false]].concat(),
        "10 of 11 checks must pass, the first ten"
    );

    let refused = check(&a, &one).await;
    assert!(!refused.allowed);
    assert_eq!(refused.remaining, 0);
    // Retry-After rounds up: 6 s, as in the 0.3 example.
    assert_eq!(refused.retry_after_us.div_ceil(SECOND), 6);
    about(refused.reset_after_us, MINUTE, SECOND, "reset_after_us");

    // The bucket is on node 2, under the cluster key, and nowhere else.
    let bucket = key(&one);
    for (index, node) in nodes.iter_mut().enumerate() {
        let keys = scan(node, &format!("trt:{tier}:*")).await;
        let expected = if index == 2 {
            vec![bucket.clone()]
        } else {
            vec![]
        };
        assert_eq!(keys, expected, "keys of tier {tier} on node {index}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_concurrent_checks_through_two_nodes_pass_exactly_the_quota() {
    for (quota, limit_count) in
        [(Quota::per_minute(10), 10), (Quota::per_hour(100), 100)]
    {
        let tier = limit("conc");
        let (a, b) = (cluster_store(0).await, cluster_store(1).await);
        let passed = concurrent_passes(a, b, 300, |store| {
            let tier = tier.clone();
            async move {
                let one = BucketCheck::new(&tier, "ana", quota, 1).unwrap();
                check(&store, &one).await.allowed
            }
        })
        .await;
        assert_eq!(passed, limit_count);
    }
}

#[tokio::test]
async fn cluster_store_from_urls_shares_with_one_built_by_hand() {
    // Lazy, seeded with every node, next to an eager one seeded with node 2.
    let lazy = RedisStorage::from_cluster_urls(cluster_urls())
        .expect("store")
        .timeout(TEST_TIMEOUT);
    let eager = cluster_store(2).await;
    let tier = limit("lazy");
    let one = BucketCheck::new(&tier, "bea", Quota::per_minute(10), 1).unwrap();
    let passed = alternate(&[&lazy, &eager], &one, 11).await;
    assert_eq!(passed, [vec![true; 10], vec![false]].concat());

    // A cost is charged atomically, as on a single node.
    let tier = limit("cost");
    let five =
        BucketCheck::new(&tier, "bea", Quota::per_minute(10), 5).unwrap();
    assert_eq!(check(&lazy, &five).await.remaining, 5);
    assert_eq!(check(&eager, &five).await.remaining, 0);
    assert!(!check(&lazy, &five).await.allowed);
}

// ---------------------------------------------------------------------------
// Several buckets of one user: one slot, one call

#[tokio::test]
async fn cluster_a_users_buckets_share_a_slot_and_are_decided_in_one_call() {
    let mut nodes = every_node().await;
    let marker = unique("slot1");
    let plan = LimitName::new(format!("{marker}-plan")).unwrap();
    let search = LimitName::new(format!("{marker}-search")).unwrap();
    let user = unique("user");
    let checks = [
        BucketCheck::new(&plan, &user, Quota::per_hour(10), 1).unwrap(),
        BucketCheck::new(&search, &user, Quota::per_hour(3), 1).unwrap(),
    ];
    let (plan_key, search_key) = (key(&checks[0]), key(&checks[1]));
    let slot = keyslot(&mut nodes[0], &plan_key).await;
    assert_eq!(keyslot(&mut nodes[0], &search_key).await, slot);
    let owner = owner_of(&mut nodes, &plan_key).await;
    let monitor = Monitor::start(&cluster_urls()[owner], &marker);

    // Two instances seeded with two nodes, one of them not the owner.
    let (a, b) = (
        cluster_store(owner).await,
        cluster_store((owner + 1) % 3).await,
    );
    for (i, left) in [(9, 2), (8, 1), (7, 0)].into_iter().enumerate() {
        let instance = if i % 2 == 0 { &a } else { &b };
        let (decided, out) = decide(instance, &checks).await;
        assert!(decided.verdict.allowed, "search {}", i + 1);
        assert_eq!((out[0].remaining, out[1].remaining), left);
    }
    for instance in [&b, &a] {
        let (decided, out) = decide(instance, &checks).await;
        assert_eq!(decided.verdict.refused_by, Some(1));
        about(decided.verdict.retry_after_us, 20 * MINUTE, SECOND, "retry");
        assert_eq!((out[0].allowed, out[0].remaining), (true, 7));
    }

    // Each decision was one script call holding both keys, run once on
    // the owner: both keys read by the same runs, five times each.
    let commands = monitor.client_commands();
    assert!(commands.len() >= 5, "{commands:?}");
    for command in &commands {
        assert!(
            command.contains(&plan_key) && command.contains(&search_key),
            "a call without both buckets: {command:?}"
        );
    }
    let reads = |key: &str| {
        monitor
            .script_commands()
            .iter()
            .filter(|c| is_read(c) && c.iter().any(|w| w == key))
            .count()
    };
    assert_eq!((reads(&plan_key), reads(&search_key)), (5, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_concurrent_joint_requests_pass_exactly_the_smaller_quota() {
    let (plan, search) = (limit("jplan"), limit("jsearch"));
    let (plan_quota, search_quota) =
        (Quota::per_hour(100), Quota::per_hour(10));
    let (a, b) = (cluster_store(0).await, cluster_store(2).await);
    let passed = concurrent_passes(a.clone(), b, 300, |store| {
        let (plan, search) = (plan.clone(), search.clone());
        async move {
            let checks = [
                BucketCheck::new(&plan, "ana", plan_quota, 1).unwrap(),
                BucketCheck::new(&search, "ana", search_quota, 1).unwrap(),
            ];
            decide(&store, &checks).await.0.verdict.allowed
        }
    })
    .await;
    assert_eq!(passed, 10);
    let peeks = [
        BucketCheck::peek(&plan, "ana", plan_quota),
        BucketCheck::peek(&search, "ana", search_quota),
    ];
    let (_, out) = decide(&a, &peeks).await;
    assert_eq!((out[0].remaining, out[1].remaining), (90, 0));
}

// ---------------------------------------------------------------------------
// Buckets of several slots: in order, refunded exactly

/// A tier and a `search` limit of one user (one slot), a limit per address
/// and a global one (a slot each), with quotas of 10, 3, 5 and 3 per hour.
struct Slots {
    names: [LimitName; 4],
    user: String,
}

const PLAN: usize = 0;
const SEARCH: usize = 1;
const IP: usize = 2;
const GLOBAL: usize = 3;

impl Slots {
    async fn new(nodes: &mut [MultiplexedConnection]) -> Slots {
        let names =
            [limit("plan"), limit("search"), limit("ip"), limit("global")];
        // A user whose slot is neither the address's nor the global one's.
        let mut user = unique("user");
        let others = [
            keyslot(
                &mut nodes[0],
                &cluster_bucket_key(names[IP].as_str(), "10.0.0.1", None),
            )
            .await,
            keyslot(
                &mut nodes[0],
                &cluster_bucket_key(names[GLOBAL].as_str(), "", None),
            )
            .await,
        ];
        assert_ne!(others[0], others[1], "the address and \"\" share a slot");
        while others.contains(
            &keyslot(
                &mut nodes[0],
                &cluster_bucket_key(names[PLAN].as_str(), &user, None),
            )
            .await,
        ) {
            user = unique("user");
        }
        Slots { names, user }
    }

    fn quota(which: usize) -> Quota {
        Quota::per_hour([10, 3, 5, 3][which])
    }

    fn partition(&self, which: usize) -> &str {
        match which {
            PLAN | SEARCH => &self.user,
            IP => "10.0.0.1",
            _ => "",
        }
    }

    fn bucket(&self, which: usize, cost: u32) -> BucketCheck<'_> {
        let quota = Self::quota(which);
        BucketCheck::new(&self.names[which], self.partition(which), quota, cost)
            .unwrap()
    }

    fn checks(&self, order: &[usize]) -> Vec<BucketCheck<'_>> {
        order.iter().map(|&which| self.bucket(which, 1)).collect()
    }
}

#[tokio::test]
async fn cluster_buckets_of_several_slots_are_refunded_exactly_when_a_later_slot_refuses()
 {
    let mut nodes = every_node().await;
    let slots = Slots::new(&mut nodes).await;
    let store = cluster_store(0).await;
    let mut conn = cluster_conn(1).await;
    // The tier has spent 3 (it has a TAT), the others nothing (no key),
    // and the global limit is spent.
    assert!(check(&store, &slots.bucket(PLAN, 3)).await.allowed);
    assert!(check(&store, &slots.bucket(GLOBAL, 3)).await.allowed);
    let keys: Vec<String> = (0..4).map(|w| key(&slots.bucket(w, 1))).collect();
    let mut before = Vec::new();
    for k in &keys {
        before.push(stored(&mut conn, k).await);
    }
    assert!(before[PLAN].0.is_some() && before[GLOBAL].0.is_some());
    assert!(before[SEARCH].0.is_none() && before[IP].0.is_none());

    // The refusing slot last, first, and in the middle.
    for order in [
        [PLAN, SEARCH, IP, GLOBAL],
        [GLOBAL, PLAN, SEARCH, IP],
        [IP, GLOBAL, PLAN, SEARCH],
    ] {
        let checks = slots.checks(&order);
        let (decided, out) = decide(&store, &checks).await;
        let at = order.iter().position(|&w| w == GLOBAL).unwrap();
        assert!(!decided.verdict.allowed, "{order:?}");
        assert_eq!(decided.verdict.refused_by, Some(at), "{order:?}");
        about(decided.verdict.retry_after_us, 20 * MINUTE, SECOND, "retry");
        // The others are reported as they stand, uncharged.
        for (i, &which) in order.iter().enumerate() {
            if which == GLOBAL {
                continue;
            }
            let full = u64::from(Slots::quota(which).burst());
            let left = if which == PLAN { full - 3 } else { full };
            assert_eq!(
                (out[i].allowed, out[i].remaining),
                (true, left),
                "{order:?}: bucket {which}"
            );
        }
        // And left exactly as they were: the tier's TAT to the µs, no key
        // where there was none.
        for (which, k) in keys.iter().enumerate() {
            let (value, ttl) = stored(&mut conn, k).await;
            assert_eq!(value, before[which].0, "{order:?}: bucket {which}");
            assert!(ttl <= before[which].1, "{order:?}: bucket {which}");
        }
    }

    // Nothing refusing: every slot charged.
    let fresh = limit("global2");
    let mut checks = slots.checks(&[PLAN, SEARCH, IP]);
    checks.push(BucketCheck::new(&fresh, "", Quota::per_hour(3), 1).unwrap());
    let (decided, out) = decide(&store, &checks).await;
    assert!(decided.verdict.allowed);
    let left: Vec<u64> = out.iter().map(|d| d.remaining).collect();
    assert_eq!(left, [6, 2, 4, 2]);
    for check in &checks {
        assert!(stored(&mut conn, &key(check)).await.0.is_some());
    }
}

#[tokio::test]
async fn cluster_a_refusal_across_slots_reports_the_longest_wait() {
    // The tier (10 per hour, 6 min to wait) and the global limit (3 per
    // hour, 20 min) both refuse: as in every store, the decision names the
    // longest wait, and each bucket's part says whether it refuses, even in
    // the slots read after the first refusal.
    let mut nodes = every_node().await;
    let slots = Slots::new(&mut nodes).await;
    let store = cluster_store(0).await;
    assert!(check(&store, &slots.bucket(PLAN, 10)).await.allowed);
    assert!(check(&store, &slots.bucket(GLOBAL, 3)).await.allowed);
    let (decided, out) = decide(&store, &slots.checks(&[PLAN, GLOBAL])).await;
    assert!(!out[0].allowed);
    assert!(
        !out[1].allowed,
        "the global limit refuses too: {:?}",
        out[1]
    );
    assert_eq!(decided.verdict.refused_by, Some(1));
    about(decided.verdict.retry_after_us, 20 * MINUTE, SECOND, "retry");
}

#[tokio::test]
async fn cluster_settles_and_peeks_of_several_slots_apply_to_each() {
    let mut nodes = every_node().await;
    let slots = Slots::new(&mut nodes).await;
    let store = cluster_store(1).await;
    let checks = slots.checks(&[PLAN, IP, GLOBAL]);
    assert!(decide(&store, &checks).await.0.verdict.allowed);
    store
        .settle(&[
            checks[0].settle(Adjust::Charge(4)),
            checks[1].settle(Adjust::Refund(1)),
            checks[2].settle(Adjust::Charge(1)),
        ])
        .await
        .expect("settle");
    let peeks: Vec<BucketCheck<'_>> = [PLAN, IP, GLOBAL]
        .iter()
        .map(|&w| {
            BucketCheck::peek(
                &slots.names[w],
                slots.partition(w),
                Slots::quota(w),
            )
        })
        .collect();
    let (decided, out) = decide(&store, &peeks).await;
    assert!(decided.verdict.allowed);
    let left: Vec<u64> = out.iter().map(|d| d.remaining).collect();
    assert_eq!(left, [5, 5, 1]);
    // The refund made the address's bucket full: its key is gone.
    let mut conn = cluster_conn(0).await;
    assert_eq!(stored(&mut conn, &key(&checks[1])).await.0, None);
}

// ---------------------------------------------------------------------------
// Failure domains

#[tokio::test]
async fn cluster_failure_domain_names_the_node_of_a_bucket() {
    // A fallback keeps a breaker per node (`Storage::failure_domain`), so
    // that one node down sends only its own buckets to the local store.
    let mut nodes = every_node().await;
    let store = cluster_store(0).await;
    let tier = limit("domain");
    let mut domains = Vec::new();
    for node in 0..3 {
        let user = partition_on(&mut nodes, tier.as_str(), "user", node).await;
        let one =
            BucketCheck::new(&tier, &user, Quota::per_minute(10), 1).unwrap();
        // Known once the slot map is: after a first check.
        check(&store, &one).await;
        let domain = store.failure_domain(&one);
        let address = cluster_urls()[node]
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();
        assert_eq!(
            domain.as_deref(),
            Some(address.as_str()),
            "the bucket of {user} is on node {node}"
        );
        domains.push(domain);
    }
    // The same node for every bucket of one user.
    let other = limit("domain-other");
    let user = partition_on(&mut nodes, tier.as_str(), "user", 1).await;
    let theirs =
        BucketCheck::new(&other, &user, Quota::per_minute(10), 1).unwrap();
    assert_eq!(store.failure_domain(&theirs), domains[1]);
}

// ---------------------------------------------------------------------------
// Keys and slots

#[tokio::test]
async fn cluster_key_lands_in_the_slot_of_its_hash_tag() {
    let store = cluster_store(0).await;
    let mut nodes = every_node().await;
    let tier = unique("slot");
    let other_tier = unique("slot-pro");
    let user = unique("user");
    let hash = sha1_hex(&user);

    let key = format!("trt:{tier}:{{{hash}}}");
    assert_eq!(cluster_bucket_key(&tier, &user, None), key);
    for tier in [&tier, &other_tier] {
        let name = LimitName::new(tier.clone()).unwrap();
        let one =
            BucketCheck::new(&name, &user, Quota::per_minute(10), 1).unwrap();
        assert!(check(&store, &one).await.allowed);
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
    let store = cluster_store(1).await;
    let mut nodes = every_node().await;
    let tier = unique("hmac");
    let user = unique("ana.secret.user");
    let secret = KeySecret::new(b"s3cret").expect("a secret");
    let name = LimitName::new(tier.clone()).unwrap();
    let one = BucketCheck::new(&name, &user, Quota::per_minute(10), 1)
        .unwrap()
        .key_secret(Some(&secret));
    assert!(check(&store, &one).await.allowed);

    let key = cluster_bucket_key(&tier, &user, Some(&secret));
    assert_eq!(self::key(&one), key);
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
    let store = cluster_store(0).await;
    let mut nodes = every_node().await;
    let tier = unique("spread");
    const USERS: usize = 60;
    for n in 0..USERS {
        let user = format!("spread-user-{n}");
        let name = LimitName::new(tier.clone()).unwrap();
        let one =
            BucketCheck::new(&name, &user, Quota::per_minute(10), 1).unwrap();
        assert!(check(&store, &one).await.allowed);
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
    let store = cluster_store(0).await;
    let mut nodes = every_node().await;
    let script_sha = sha1_hex(include_str!("../src/redis/gcra.lua"));
    let tier = unique("noscript");
    let name = LimitName::new(tier.clone()).unwrap();
    let one = BucketCheck::new(&name, "ana", Quota::per_minute(10), 1).unwrap();
    assert_eq!(check(&store, &one).await.remaining, 9);
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
    let decision = check(&store, &one).await;
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
    let other = cluster_store(2).await;
    assert_eq!(check(&other, &one).await.remaining, 7);

    // gcra_all.lua and gcra_settle.lua recover the same way.
    let search = LimitName::new(format!("{tier}-s")).unwrap();
    let both = [
        one,
        BucketCheck::new(&search, "ana", Quota::per_minute(10), 1).unwrap(),
    ];
    flush_scripts(&mut nodes).await;
    let (_, out) = decide(&other, &both).await;
    assert_eq!((out[0].remaining, out[1].remaining), (6, 9));
    flush_scripts(&mut nodes).await;
    other
        .settle(&[one.settle(Adjust::Refund(1))])
        .await
        .expect("settle after SCRIPT FLUSH");
    assert_eq!(check(&other, &one).await.remaining, 6);
}

async fn flush_scripts(nodes: &mut [MultiplexedConnection]) {
    for node in nodes {
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(node)
            .await
            .expect("SCRIPT FLUSH");
    }
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
    let free = LimitName::new("free").unwrap();
    let one = BucketCheck::new(&free, "ana", Quota::per_minute(10), 1).unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        let result = check_once(&store, one).await;
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
    let free = LimitName::new("free").unwrap();
    let one = BucketCheck::new(&free, "ana", Quota::per_minute(10), 1).unwrap();
    for _ in 0..2 {
        let started = Instant::now();
        let result = check_once(&store, one).await;
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
