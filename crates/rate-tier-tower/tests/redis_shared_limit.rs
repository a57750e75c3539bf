//! Two `RateTier`s ("two instances") on one Redis share one limit.
//!
//! Run with `cargo xtask test-redis`, which starts a throwaway redis-server
//! and sets `TRT_REDIS_URL`. Without it these tests fail: they never pass
//! silently, and they never use the shared Redis on port 6379. Each test
//! uses its own tier names, so they can run in parallel on one server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rate_tier_storage::StorageExt;
use redis::aio::ConnectionManager;
use tower_rate_tier::storage::key::{KeySecret, bucket_key};
use tower_rate_tier::{
    Error, LimitReason, Quota, RateTier, RedisStorage, StorageError,
};

mod support;

use rate_tier_test_support::{
    TEST_TIMEOUT, concurrent_passes, redis_url, unique,
};

/// A new connection manager on the test server (connected now).
async fn connect() -> ConnectionManager {
    redis::Client::open(redis_url())
        .expect("valid URL")
        .get_connection_manager()
        .await
        .expect("TRT_REDIS_URL does not answer: is the test server running?")
}

/// One instance of the 0.3 example's service: tiers `<tier>` (10/min) and
/// `<tier>-pro` (100/min), default `<tier>`, its own Redis connection.
async fn instance(tier: &str) -> RateTier {
    RateTier::builder()
        .tier(tier, Quota::per_minute(10))
        .tier(format!("{tier}-pro"), Quota::per_minute(100))
        .default_tier(tier)
        .storage(Arc::new(
            RedisStorage::new(connect().await).timeout(TEST_TIMEOUT),
        ))
        .build()
}

async fn exists(conn: &mut ConnectionManager, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query_async::<i64>(conn)
        .await
        .expect("EXISTS")
        == 1
}

#[tokio::test]
async fn two_instances_share_one_limit() {
    let tier = unique("free");
    let instances = [instance(&tier).await, instance(&tier).await];
    assert_eq!(instances[0].storage().kind(), "redis");

    // As in the 0.3 example: Ana alternates between ports 3001 and 3000.
    for i in 1..=10_u64 {
        let limiter = &instances[(i % 2) as usize];
        let info = limiter
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
    assert_eq!(limited.limit(), 10);
    assert!(limited.reset_after() <= Duration::from_secs(60));
    assert!(limited.reset_after() > Duration::from_secs(59));

    // The bucket is the 0.3 example's key: trt:<tier>:sha1("key_ana").
    let mut conn = connect().await;
    let key = format!("trt:{tier}:33d2315cbeb866b8b237240a98d605f2e6e41b8a");
    assert!(exists(&mut conn, &key).await, "{key} is missing");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("PTTL");
    assert!(ttl > 59_000 && ttl <= 60_000, "PTTL {ttl}");
}

/// `checks` concurrent checks of one user in `tier`, half through each of
/// two instances: how many pass.
async fn passes(tier: &str, base: &str, checks: usize) -> usize {
    let (a, b) = (instance(base).await, instance(base).await);
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
async fn concurrent_checks_on_two_instances_pass_exactly_the_quota() {
    let base = unique("conc");
    assert_eq!(passes(&base, &base, 300).await, 10);
    let pro = format!("{base}-pro");
    assert_eq!(passes(&pro, &base, 300).await, 100);
}

#[tokio::test]
async fn cost_above_the_burst_is_refused_without_touching_redis() {
    let tier = unique("cost");
    let limiter = instance(&tier).await;
    let never = limiter
        .check("key_ana", &tier, 50)
        .await
        .expect("storage")
        .expect_err("a cost of 50 passed a burst of 10");
    assert_eq!(never.reason(), LimitReason::CostExceedsBurst { cost: 50 });
    assert!(!never.can_retry());
    let mut conn = connect().await;
    let key = bucket_key(&tier, "key_ana", None);
    assert!(!exists(&mut conn, &key).await, "{key} was written");

    let five = limiter
        .check("key_ana", &tier, 5)
        .await
        .expect("storage")
        .expect("a cost of 5");
    assert_eq!(five.remaining, 5);
    assert!(exists(&mut conn, &key).await);
}

#[tokio::test]
async fn key_secret_is_shared_by_instances_that_share_it() {
    let tier = unique("hmac");
    let with_secret = || async {
        RateTier::builder()
            .tier(tier.as_str(), Quota::per_minute(10))
            .key_secret("s3cret")
            .storage(Arc::new(
                RedisStorage::new(connect().await).timeout(TEST_TIMEOUT),
            ))
            .build()
    };
    let instances = [with_secret().await, with_secret().await];
    for i in 0..10 {
        let passed = instances[i % 2].check("key_eva", &tier, 1).await;
        assert!(matches!(passed, Ok(Ok(_))), "request {}: {passed:?}", i + 1);
    }
    let eleventh = instances[0].check("key_eva", &tier, 1).await;
    assert!(matches!(eleventh, Ok(Err(_))), "{eleventh:?}");

    let mut conn = connect().await;
    let hmac_key =
        bucket_key(&tier, "key_eva", Some(&KeySecret::new("s3cret").unwrap()));
    let sha1_key = bucket_key(&tier, "key_eva", None);
    assert!(exists(&mut conn, &hmac_key).await, "{hmac_key} is missing");
    assert!(!exists(&mut conn, &sha1_key).await, "{sha1_key} exists");
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_storage_timeout() {
    // Accepts connections and holds them, never answering.
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
    let store = RedisStorage::from_url(&format!("redis://127.0.0.1:{port}/"))
        .expect("store")
        .timeout(timeout);
    let limiter = RateTier::builder()
        .tier("free", Quota::per_minute(10))
        .storage(Arc::new(store))
        .build();

    for _ in 0..2 {
        let started = Instant::now();
        let result = limiter.check("key_ana", "free", 1).await;
        let took = started.elapsed();
        assert!(
            matches!(
                result,
                Err(Error::Storage(StorageError::Timeout(d))) if d == timeout
            ),
            "expected a storage timeout, got {result:?}"
        );
        assert!(took < Duration::from_secs(2), "took {took:?}");
    }
}
