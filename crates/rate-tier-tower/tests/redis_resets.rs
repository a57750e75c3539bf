//! A reset, or a lifted ban, through one instance reaches the refusals
//! every other instance on the Redis remembers, within about a second: an
//! operator behind a load balancer cannot choose the instance.
//!
//! Real Redis (`cargo xtask test-redis`), real time: what is tested is how
//! soon another process's memory hears of a write, so each test waits at
//! most a second and a half.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_rate_tier::{Ban, LimitReason, Quota, RateTier, RedisStorage};

use rate_tier_test_support::{TEST_TIMEOUT, redis_url, unique};

/// An instance with its own Redis store (and so its own memory of
/// refusals), with bans when `ban` is set.
async fn instance(tier: &str, ban: bool) -> RateTier {
    let store = RedisStorage::from_url(&redis_url())
        .expect("TRT_REDIS_URL")
        .timeout(TEST_TIMEOUT);
    let builder = RateTier::builder()
        .tier(tier, Quota::per_minute(1))
        .storage(Arc::new(store));
    match ban {
        true => builder.ban(Ban::after(2, Duration::from_secs(60))).build(),
        false => builder.build(),
    }
}

/// How long after `since` the instance first lets `user` pass, polling
/// every 20 ms for at most 1.5 s.
async fn passes_after(tiers: &RateTier, tier: &str, user: &str) -> Duration {
    let since = Instant::now();
    while since.elapsed() < Duration::from_millis(1_500) {
        if tiers.check(user, tier, 1).await.unwrap().is_ok() {
            return since.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{user} still refused 1.5 s after the reset");
}

/// Lets the other instance's memory hear of the store first (its first
/// read of the resets), as a long-running instance has.
async fn settled() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn a_reset_through_one_instance_reaches_another_ones_memory_within_a_second()
 {
    let tier = unique("free");
    let (a, b) = (instance(&tier, false).await, instance(&tier, false).await);
    settled().await;
    assert!(a.check("ana", &tier, 1).await.unwrap().is_ok());
    // b is refused, and remembers it: its next answers come from memory.
    for _ in 0..3 {
        let refused = b.check("ana", &tier, 1).await.unwrap().unwrap_err();
        assert_eq!(refused.reason(), LimitReason::RateLimited);
    }
    a.reset("ana", &[]).await.unwrap();
    let after = passes_after(&b, &tier, "ana").await;
    assert!(after < Duration::from_millis(1_200), "{after:?}");
}

#[tokio::test]
async fn a_ban_lifted_through_one_instance_is_lifted_on_every_one() {
    let tier = unique("free");
    let (a, b) = (instance(&tier, true).await, instance(&tier, true).await);
    settled().await;
    assert!(a.check("eva", &tier, 1).await.unwrap().is_ok());
    for _ in 0..2 {
        let refused = a.check("eva", &tier, 1).await.unwrap().unwrap_err();
        assert_eq!(refused.reason(), LimitReason::RateLimited);
    }
    // Banned, on b too, which remembers it.
    for _ in 0..3 {
        let refused = b.check("eva", &tier, 1).await.unwrap().unwrap_err();
        assert_eq!(refused.reason(), LimitReason::Banned);
    }
    a.reset("eva", &[]).await.unwrap();
    let after = passes_after(&b, &tier, "eva").await;
    assert!(after < Duration::from_millis(1_200), "{after:?}");
}
