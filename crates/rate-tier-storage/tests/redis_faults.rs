//! What the Redis store survives, with real processes: a connection that
//! goes silent, a client hammering past its limit, a Redis Cluster losing a
//! master. Each test runs servers of its own (rate-tier-test-support: a
//! local `redis-server` or a Docker container), never the shared one, and
//! the waits are the real network timeouts and failovers under test.
#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gcra_core::{Decision, Quota};
use rate_tier_storage::clock::FakeClock;
use rate_tier_storage::key::cluster_slot;
use rate_tier_storage::{
    BreakerState, BucketCheck, Decided, FallbackStorage, LimitName, REMEMBERED,
    RedisStorage, Storage, StorageEvent,
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
