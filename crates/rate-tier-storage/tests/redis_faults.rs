//! What the Redis store survives, with real processes: a connection that
//! goes silent, a client hammering past its limit, a Redis Cluster losing a
//! master. Each test runs servers of its own (rate-tier-test-support: a
//! local `redis-server` or a Docker container), never the shared one, and
//! the waits are the real network timeouts and failovers under test.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gcra_core::{Decision, Quota};
use rate_tier_storage::StorageExt;
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::key::cluster_slot;
use rate_tier_storage::{
    Adjust, BreakerState, BucketCheck, Charged, Decided, FallbackStorage,
    LimitName, REMEMBERED, RedisStorage, Storage, StorageEvent,
};
use rate_tier_test_support::{RedisCluster, RedisServer, TcpProxy};

async fn decide(
    store: &dyn Storage,
    name: &LimitName,
    user: &str,
    quota: Quota,
) -> Decided {
    let check = [BucketCheck::new(name, user, quota, 1).unwrap()];
    let mut out = [Decision::default()];
    store.check(&check, &mut out).await.unwrap()
}

/// `cmdstat_evalsha`'s calls on `server`.
fn evalsha_calls(server: &RedisServer) -> u64 {
    let stats = server.command(&["INFO", "commandstats"]).unwrap();
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// A connection whose peer goes silent (the proxy keeps its socket open and
/// forwards nothing, as after a lost VM or a partition) while a new path
/// exists: the store replaces it after a few timeouts, the breaker's probe
/// goes over the new one, and limits are shared through Redis again within
/// seconds. Before the replacement every call would time out until the
/// kernel gave up on the socket (about 15 minutes on Linux without a user
/// timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_replaced_and_limits_are_shared_again() {
    let server = RedisServer::start();
    let proxy = TcpProxy::start(server.addr());
    let redis = RedisStorage::from_url(&proxy.redis_url())
        .unwrap()
        .timeout(Duration::from_millis(50))
        .rebuild_after(2)
        .remember_refusals(false);
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let store = FallbackStorage::builder(Arc::new(redis.clone()))
        .failure_threshold(2)
        .cool_down(Duration::from_millis(200), Duration::from_millis(400))
        .build();
    store
        .subscribe(Arc::new(move |event: &StorageEvent| {
            sink.lock().unwrap().push(event.clone())
        }))
        .forever();
    // Another instance, straight to the server: what is shared.
    let other = RedisStorage::from_url(&server.url())
        .unwrap()
        .remember_refusals(false);
    let name = LimitName::new("free").unwrap();
    let quota = Quota::per_minute(1000);

    assert_eq!(decide(&store, &name, "warm", quota).await.by, "redis");
    proxy.freeze();
    let frozen = Instant::now();
    let mut answers = 0;
    let shared_again = loop {
        let decided = decide(&store, &name, "ana", quota).await;
        answers += 1;
        if decided.by == "redis" {
            break frozen.elapsed();
        }
        assert_eq!(decided.by, "fallback", "every check is answered");
        assert!(
            frozen.elapsed() < Duration::from_secs(10),
            "not shared again after 10 s: {:?}",
            events.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(redis.rebuilds() >= 1, "the silent connection was kept");
    assert!(
        shared_again < Duration::from_secs(3),
        "shared again only after {shared_again:?}"
    );
    assert!(answers > 1, "the silence was seen");
    assert_eq!(store.state(), BreakerState::Closed);
    let events = events.lock().unwrap().clone();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, StorageEvent::Reconnected { .. })),
        "{events:?}"
    );
    // Shared: what this instance charges, the other sees.
    let before = decide(&other, &name, "bea", quota).await;
    decide(&store, &name, "bea", quota).await;
    let after = decide(&other, &name, "bea", quota).await;
    let out_before = before.verdict.allowed;
    assert!(out_before && after.verdict.allowed);
    println!(
        "silent connection: shared again {:.0} ms after the freeze, {} checks answered meanwhile",
        shared_again.as_secs_f64() * 1000.0,
        answers
    );
}

/// A client hammering past its limit: after the first refusal, no call
/// reaches Redis until GCRA says the request could pass; a cheaper request
/// is sent; once the wait is over, the next request asks Redis again.
#[tokio::test]
async fn a_hammering_client_costs_no_redis_call_until_it_could_pass() {
    let server = RedisServer::start();
    let clock = FakeClock::at_us(1_000_000_000);
    let store = RedisStorage::from_url(&server.url())
        .unwrap()
        .clock(clock.clone());
    let name = LimitName::new("free").unwrap();
    let quota = Quota::per_minute(10);
    let check = |cost| {
        let check = [BucketCheck::new(&name, "mallory", quota, cost).unwrap()];
        let store = store.clone();
        async move {
            let mut out = [Decision::default()];
            let decided = store.check(&check, &mut out).await.unwrap();
            (decided, out[0])
        }
    };
    for _ in 0..5 {
        assert!(check(2).await.0.verdict.allowed);
    }
    let (refused, decision) = check(2).await;
    assert!(!refused.verdict.allowed);
    assert_eq!(refused.by, "redis");
    let wait = decision.retry_after_us;
    assert!(wait > 0);

    let before = evalsha_calls(&server);
    for i in 0..1000u64 {
        clock.advance(Duration::from_micros(wait / 2000));
        let (decided, decision) = check(2).await;
        assert!(!decided.verdict.allowed);
        assert_eq!(decided.by, REMEMBERED, "refusal {i}");
        assert!(decision.retry_after_us <= wait);
    }
    assert_eq!(
        evalsha_calls(&server),
        before,
        "a remembered refusal called Redis"
    );
    // A larger cost is refused for the same reason, from memory too.
    assert_eq!(check(3).await.0.by, REMEMBERED);
    // A cheaper request may fit: it is sent.
    let (cheaper, _) = check(1).await;
    assert_eq!(cheaper.by, "redis");
    assert_eq!(evalsha_calls(&server), before + 1);
    // The wait is over on the local clock: Redis is asked again (its own
    // clock did not move: it refuses, and the refusal is remembered anew).
    clock.advance(Duration::from_micros(wait));
    let (again, _) = check(2).await;
    assert_eq!(again.by, "redis");
    assert_eq!(check(2).await.0.by, REMEMBERED);
}

/// The user ids whose buckets live on the master that owns `slots`, and
/// on the others.
fn users_by_node(
    slots: &[std::ops::RangeInclusive<u16>],
    n: usize,
) -> (Vec<String>, Vec<String>) {
    let (mut on, mut off) = (Vec::new(), Vec::new());
    for i in 0.. {
        let user = format!("user-{i}");
        let slot = cluster_slot(&user, None);
        if slots.iter().any(|range| range.contains(&slot)) {
            if on.len() < n {
                on.push(user);
            }
        } else if off.len() < n {
            off.push(user);
        }
        if on.len() == n && off.len() == n {
            return (on, off);
        }
    }
    unreachable!()
}

/// A Redis Cluster of 3 masters and 3 replicas loses a master under load:
/// every check is answered (no error), only the users whose buckets live on
/// the lost master are decided locally (their node's breaker opens), the
/// others stay shared through their own masters, and once the replica is
/// promoted every user is shared again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_lost_master_sends_only_its_users_local_until_the_failover() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .unwrap();
    let redis = RedisStorage::from_cluster_urls(cluster.urls())
        .unwrap()
        .timeout(Duration::from_millis(100))
        .remember_refusals(false);
    let store = FallbackStorage::builder(Arc::new(redis.clone()))
        .failure_threshold(2)
        .cool_down(Duration::from_millis(200), Duration::from_millis(500))
        .build();
    let name = LimitName::new("free").unwrap();
    let quota = Quota::per_minute(100_000);
    // The slot map is read in the background.
    let started = Instant::now();
    let probe = BucketCheck::new(&name, "anyone", quota, 1).unwrap();
    while redis.failure_domain(&probe).is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "no slot map");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let (cluster, killed) = tokio::task::spawn_blocking(move || {
        let mut cluster = cluster;
        let killed = cluster.kill_master(0);
        (cluster, killed)
    })
    .await
    .unwrap();
    let (on_victim, elsewhere) = users_by_node(&killed.slots, 5);

    // Under load, every check is answered; the lost master's users go
    // local, the others stay shared through their own masters.
    let mut local_seen = false;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        for user in &on_victim {
            local_seen |=
                decide(&store, &name, user, quota).await.by == "fallback";
        }
        for user in &elsewhere {
            decide(&store, &name, user, quota).await;
        }
    }
    assert!(
        local_seen,
        "the lost master's users were never decided locally"
    );
    for user in &elsewhere {
        assert_eq!(
            decide(&store, &name, user, quota).await.by,
            "redis",
            "a healthy master's user went local"
        );
    }
    let open: Vec<_> = store
        .domain_states()
        .into_iter()
        .filter(|(_, state)| *state != BreakerState::Closed)
        .collect();
    assert_eq!(
        open.len(),
        1,
        "only the lost master's breaker opens: {open:?}"
    );
    assert!(
        open[0].0.ends_with(&format!(":{}", killed.port)),
        "{open:?}"
    );

    // The replica is promoted: every user is shared again.
    let killed_at = Instant::now();
    let (_cluster, failover) = tokio::task::spawn_blocking(move || {
        let failover = cluster.wait_for_failover(&killed);
        (cluster, failover)
    })
    .await
    .unwrap();
    let promoted = Instant::now();
    loop {
        let mut all = true;
        for user in &on_victim {
            all &= decide(&store, &name, user, quota).await.by == "redis";
        }
        if all {
            break;
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(10),
            "not shared again 10 s after the promotion"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "cluster: replica on port {} promoted {:.1} s after the wait began; \
         its users shared again {:.1} s after the promotion",
        failover.new_master,
        (promoted - killed_at).as_secs_f64(),
        promoted.elapsed().as_secs_f64()
    );
}

/// A partition (of `prefix`) whose buckets live in `slots`.
fn partition_in(
    slots: &[std::ops::RangeInclusive<u16>],
    prefix: &str,
) -> String {
    (0..)
        .map(|i| format!("{prefix}-{i}"))
        .find(|p| {
            let slot = cluster_slot(p, None);
            slots.iter().any(|range| range.contains(&slot))
        })
        .unwrap()
}

/// The slots of each master, master 0 first (it serves slot 0).
fn slots_by_master(
    cluster: &RedisCluster,
) -> Vec<Vec<std::ops::RangeInclusive<u16>>> {
    let mut masters: Vec<_> = cluster
        .topology()
        .unwrap()
        .into_iter()
        .filter(|n| n.master && !n.slots.is_empty())
        .collect();
    masters.sort_by_key(|n| n.slots.iter().map(|s| *s.start()).min());
    masters.into_iter().map(|n| n.slots).collect()
}

/// A cluster of three masters of its own, each master's slots, and a store
/// on it (100 ms timeout, every answer from Redis).
async fn three_masters() -> (
    RedisCluster,
    Vec<Vec<std::ops::RangeInclusive<u16>>>,
    RedisStorage,
) {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 0))
        .await
        .unwrap();
    let slots = slots_by_master(&cluster);
    let store = RedisStorage::from_cluster_urls(cluster.urls())
        .unwrap()
        .timeout(Duration::from_millis(100))
        .remember_refusals(false);
    (cluster, slots, store)
}

/// Waits until `store` knows the cluster's slot map.
async fn slot_map(store: &RedisStorage, name: &LimitName) {
    let started = Instant::now();
    let probe =
        BucketCheck::new(name, "anyone", Quota::per_minute(1), 1).unwrap();
    while store.failure_domain(&probe).is_none() {
        assert!(started.elapsed() < Duration::from_secs(10), "no slot map");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Regression: a decision over two slots whose second node stops answering.
/// The first slot was charged; the caller's timeout fires (or its future is
/// dropped) and it answers without Redis. The charge must not stay: the
/// decision finishes in a task of its own and refunds it. And a refusal by
/// the first slot stays a refusal when the read of the second one fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_decision_its_caller_gave_up_on_charges_nothing() {
    let (mut cluster, slots, store) = three_masters().await;
    let (plan, ip) = (
        LimitName::new("free").unwrap(),
        LimitName::new("ip").unwrap(),
    );
    slot_map(&store, &plan).await;
    let user = partition_in(&slots[1], "user");
    let address = partition_in(&slots[0], "addr");
    let quota = Quota::per_hour(10);
    let checks = [
        BucketCheck::new(&plan, &user, quota, 1).unwrap(),
        BucketCheck::new(&ip, &address, quota, 1).unwrap(),
    ];
    let peek = [BucketCheck::peek(&plan, &user, quota)];
    let remaining = |store: RedisStorage| async move {
        let mut out = [Decision::default()];
        store.check(&peek, &mut out).await.unwrap();
        out[0].remaining
    };
    // Both nodes answer: a decision charges both.
    let mut out = [Decision::default(); 2];
    assert!(
        store
            .check(&checks, &mut out)
            .await
            .unwrap()
            .verdict
            .allowed
    );
    assert_eq!(remaining(store.clone()).await, 9);

    // Master 0 (the address's) stops answering.
    let paused = cluster.master_index(0);
    cluster.node_mut(paused).pause();
    let timed_out = store.check(&checks, &mut out).await;
    assert!(timed_out.is_err(), "{timed_out:?}");
    // A caller that goes away early (its future dropped) too.
    let dropped = tokio::time::timeout(
        Duration::from_millis(5),
        store.check(&checks, &mut out),
    )
    .await;
    assert!(dropped.is_err(), "the check finished in 5 ms");
    // The tier's slot was charged by both, then refunded by both tasks.
    let started = Instant::now();
    loop {
        let left = remaining(store.clone()).await;
        if left == 9 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the plan keeps {} charges its callers never saw",
            9 - left
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The tier refuses (spent), and the address's node cannot be read:
    // still a refusal, never an error a fallback could answer as a pass.
    let spent = [BucketCheck::new(&plan, &user, quota, 9).unwrap()];
    assert!(
        store
            .check(&spent, &mut [Decision::default()])
            .await
            .unwrap()
            .verdict
            .allowed
    );
    let refused = store.check(&checks, &mut out).await.unwrap();
    assert_eq!(refused.verdict.refused_by, Some(0));
    cluster.node_mut(paused).resume();
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
}

/// Regression: losing the master of an address limit's slot must not open
/// the breakers of healthy masters too (a cross-slot failure counted
/// against every node in it would send every user local). Only the lost
/// node's breaker opens, and a decision over a healthy node's bucket and
/// the lost node's is mixed: the healthy bucket stays shared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_lost_address_master_keeps_every_plan_shared() {
    let (mut cluster, slots, redis) = three_masters().await;
    let store = FallbackStorage::builder(Arc::new(redis.clone()))
        .failure_threshold(2)
        .cool_down(Duration::from_secs(30), Duration::from_secs(30))
        .build();
    let (plan, ip) = (
        LimitName::new("free").unwrap(),
        LimitName::new("ip").unwrap(),
    );
    slot_map(&redis, &plan).await;
    let address = partition_in(&slots[0], "addr");
    let users: Vec<String> = (0..4)
        .map(|i| partition_in(&slots[1 + i % 2], &format!("user{i}")))
        .collect();
    let quota = Quota::per_hour(1000);
    let paused = cluster.master_index(0);
    cluster.node_mut(paused).pause();

    let mut last = None;
    for round in 0..6 {
        for user in &users {
            let checks = [
                BucketCheck::new(&plan, user, quota, 1).unwrap(),
                BucketCheck::new(&ip, &address, quota, 1).unwrap(),
            ];
            let mut out = [Decision::default(); 2];
            let decided = store.check(&checks, &mut out).await.unwrap();
            assert!(decided.verdict.allowed, "round {round}");
            last = Some(decided);
        }
    }
    let open: Vec<_> = store
        .domain_states()
        .into_iter()
        .filter(|(_, state)| *state != BreakerState::Closed)
        .collect();
    assert_eq!(
        open.len(),
        1,
        "only the lost master's breaker opens: {open:?}"
    );
    let last = last.unwrap();
    assert_eq!(
        (last.charged(0), last.charged(1)),
        (Charged::Primary, Charged::Local { share: 1 }),
        "the plan left the shared store"
    );
    // What the mixed decisions charged the tiers is in Redis.
    let mut out = [Decision::default()];
    let peek = [BucketCheck::peek(&plan, &users[0], quota)];
    redis.check(&peek, &mut out).await.unwrap();
    assert!(out[0].remaining <= 997, "{}", out[0].remaining);
    cluster.node_mut(paused).resume();
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .unwrap();
}

/// Regression: an instance's own refund forgets the refusal it remembered
/// for the bucket (else it stays refused from memory, with no Redis call,
/// while Redis holds a full bucket); and a refusal is remembered
/// under the bucket's real key, so that two limiters sharing one store with
/// different key secrets never answer each other's users from memory.
#[tokio::test]
async fn remembered_refusals_follow_refunds_and_key_secrets() {
    let server = RedisServer::start();
    let store = RedisStorage::from_url(&server.url()).unwrap();
    let tokens = LimitName::new("tokens").unwrap();
    let quota = Quota::per_hour(10);
    let (a, b) = (
        rate_tier_storage::key::KeySecret::new("service-a").unwrap(),
        rate_tier_storage::key::KeySecret::new("service-b").unwrap(),
    );
    let check = |secret| {
        [BucketCheck::new(&tokens, "ana", quota, 1)
            .unwrap()
            .key_secret(Some(secret))]
    };
    let mut out = [Decision::default()];
    for _ in 0..10 {
        assert!(
            store
                .check(&check(&a), &mut out)
                .await
                .unwrap()
                .verdict
                .allowed
        );
    }
    let refused = store.check(&check(&a), &mut out).await.unwrap();
    assert_eq!((refused.verdict.allowed, refused.by), (false, "redis"));
    assert_eq!(
        store.check(&check(&a), &mut out).await.unwrap().by,
        REMEMBERED
    );
    // The other service's Ana has a bucket of her own, full.
    let other = store.check(&check(&b), &mut out).await.unwrap();
    assert_eq!((other.verdict.allowed, other.by), (true, "redis"));

    // This instance refunds 5: its memory of the refusal goes with them.
    store
        .settle(&[check(&a)[0].settle(Adjust::Refund(5))])
        .await
        .unwrap();
    let after = store.check(&check(&a), &mut out).await.unwrap();
    assert_eq!((after.verdict.allowed, after.by), (true, "redis"));
    assert_eq!(out[0].remaining, 4);
}
