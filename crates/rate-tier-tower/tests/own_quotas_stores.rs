#![cfg_attr(
    not(any(feature = "redis", feature = "postgres")),
    allow(missing_docs)
)]
#![cfg(any(feature = "redis", feature = "postgres"))]
//! A customer's own quota on Redis, a Redis Cluster and PostgreSQL,
//! through the direct API and the HTTP layer: it decides, a changed one
//! keeps what was spent, one of the wrong kind fails closed (never
//! unlimited), and a settlement is made under it.
//!
//! Run with `cargo xtask test-redis`, which starts a throwaway redis-server
//! and PostgreSQL and sets `TRT_REDIS_URL` and `TRT_POSTGRES_URL` (without
//! them these tests fail), and `cargo xtask test-cluster` for the Redis
//! Cluster's (`TRT_REDIS_CLUSTER_URLS`). Every test uses names of its own. Time is the
//! server's: no fake clock reaches it, so quotas are per hour, and the
//! milliseconds a test takes give back nothing a count could see.
#![allow(clippy::unwrap_used, missing_docs)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use rate_tier_test_support::unique;
use support::http::get_as;
use tower_rate_tier::{
    Error, Limit, LimitRequest, Quota, RateTier, Settle, TierIdentity,
    TierLimitLayer, Window, rules::Adjust,
};

/// The tier `tier` allows 10 an hour (one each 6 min).
fn plan() -> Quota {
    Quota::per_hour(10)
}

/// Ada's own quota for the tier decides, over the tier's; a limit's own
/// quota too; bea on the same tier has the tier's.
async fn the_own_quota_decides(tiers: &RateTier, tier: &str) {
    let own = |user| {
        LimitRequest::new(user, tier, 1)
            .quota(tier.to_owned(), Quota::per_hour(4))
    };
    for left in (0..4).rev() {
        let info = tiers.decide(&own("ada")).await.unwrap().unwrap();
        assert_eq!((info.limit, info.remaining), (4, left));
    }
    let refused = tiers.decide(&own("ada")).await.unwrap().unwrap_err();
    // Labelled by the tier; her 15 minutes a request.
    assert_eq!(refused.limit_name(), tier);
    assert_eq!(refused.retry_after_secs(), 15 * 60);
    let info = tiers.check("bea", tier, 1).await.unwrap().unwrap();
    assert_eq!((info.limit, info.remaining), (10, 9));

    let search = Limit::new(unique("search"), Quota::per_hour(2));
    let eve = LimitRequest::new("eve", tier, 1)
        .limit(&search, 1)
        .quota(search.name().to_owned(), Quota::per_hour(5));
    let mut passed = 0;
    for _ in 0..7 {
        passed += usize::from(tiers.decide(&eve).await.unwrap().is_ok());
    }
    assert_eq!(passed, 5, "eve's own 5 searches, not the limit's 2");
}

/// Cara spends 6 of the tier's 10 (36 min of the hour); under her own 50
/// an hour (72 s each) 24 min are left, 20 requests; back on the tier,
/// the same bucket read with the tier's quota.
async fn a_changed_quota_keeps_what_was_spent(tiers: &RateTier, tier: &str) {
    for _ in 0..6 {
        tiers.check("cara", tier, 1).await.unwrap().unwrap();
    }
    let own = LimitRequest::new("cara", tier, 1)
        .quota(tier.to_owned(), Quota::per_hour(50));
    let info = tiers.decide(&own).await.unwrap().unwrap();
    assert_eq!((info.limit, info.remaining), (50, 19));
    // 36 min + 72 s + 6 min spent: 16.8 min left, 2 whole requests.
    let info = tiers.check("cara", tier, 1).await.unwrap().unwrap();
    assert_eq!((info.limit, info.remaining), (10, 2));
}

/// A window in place of the tier's rate: the typed error, each time, and
/// nothing charged.
async fn an_own_quota_of_the_wrong_kind_fails_closed(
    tiers: &RateTier,
    tier: &str,
) {
    let window = Window::new(5, Duration::from_secs(3600)).unwrap();
    let request =
        LimitRequest::new("dan", tier, 1).quota(tier.to_owned(), window);
    for _ in 0..12 {
        let error = tiers.decide(&request).await.unwrap_err();
        assert!(
            matches!(error, Error::OwnQuota(ref name) if name == tier),
            "{error}"
        );
    }
    assert_eq!(tiers.peek("dan", tier).await.unwrap().remaining, 10);
}

/// Fay's own 100 tokens an hour (36 s each): 101 used are a debt of 100
/// of hers, an hour (not the limit's 6 min), and the next one waits.
async fn a_settlement_is_made_under_the_own_quota(
    tiers: &RateTier,
    tier: &str,
) {
    let tokens = Limit::new(unique("tokens"), Quota::per_hour(1000))
        .settle(Settle::from_header("x-tokens-used"));
    let request = LimitRequest::new("fay", tier, 1)
        .limit(&tokens, 1)
        .quota(tokens.name().to_owned(), Quota::per_hour(100));
    let info = tiers.decide(&request).await.unwrap().unwrap();
    tiers
        .settle("fay", &info, &tokens, Adjust::between(1, 101))
        .await
        .unwrap();
    // 36 s + 3600 s ahead, of 3600 s: 72 s until the next token.
    let refused = tiers.decide(&request).await.unwrap().unwrap_err();
    assert_eq!(refused.limit_name(), tokens.name());
    assert_eq!(refused.retry_after_secs(), 72);
}

/// Over HTTP: the identity carries ada's own 4 an hour; a window for eva
/// is a 500, every time.
async fn over_http(tiers: RateTier, tier: &str) {
    let plan = tier.to_owned();
    let layer = TierLimitLayer::new(tiers).identifier_fn(move |headers| {
        let key = headers.get("x-api-key")?.to_str().ok()?;
        let identity = TierIdentity::new(key.to_owned(), plan.clone());
        Some(match key {
            "key_ada" => identity.with_quota(plan.clone(), Quota::per_hour(4)),
            "key_eva" => identity.with_quota(
                plan.clone(),
                Window::new(5, Duration::from_secs(3600)).unwrap(),
            ),
            _ => identity,
        })
    });
    let app = Router::new()
        .route("/", axum::routing::get(|| async { "ok\n" }))
        .layer(layer);
    for left in (0..4).rev() {
        let r = get_as(&app, Some("key_ada"), "/").await;
        assert_eq!(
            (r.status, r.limit(), r.remaining()),
            (StatusCode::OK, 4, left)
        );
    }
    let r = get_as(&app, Some("key_ada"), "/").await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.retry_after(), 15 * 60);
    for _ in 0..12 {
        let r = get_as(&app, Some("key_eva"), "/").await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{r:?}");
    }
    let r = get_as(&app, Some("key_bea"), "/").await;
    assert_eq!((r.limit(), r.remaining()), (10, 9));
}

/// The scenarios above as tests on one store: `instance(tier)` builds a
/// limiter whose tier `tier` is on it (the module names the store).
macro_rules! on_store {
    () => {
        #[tokio::test]
        async fn the_own_quota_decides() {
            let tier = unique("pro");
            super::the_own_quota_decides(&instance(&tier).await, &tier).await;
        }

        #[tokio::test]
        async fn a_changed_quota_keeps_what_was_spent() {
            let tier = unique("pro");
            super::a_changed_quota_keeps_what_was_spent(
                &instance(&tier).await,
                &tier,
            )
            .await;
        }

        #[tokio::test]
        async fn an_own_quota_of_the_wrong_kind_fails_closed() {
            let tier = unique("pro");
            super::an_own_quota_of_the_wrong_kind_fails_closed(
                &instance(&tier).await,
                &tier,
            )
            .await;
        }

        #[tokio::test]
        async fn a_settlement_is_made_under_the_own_quota() {
            let tier = unique("pro");
            super::a_settlement_is_made_under_the_own_quota(
                &instance(&tier).await,
                &tier,
            )
            .await;
        }

        #[tokio::test]
        async fn over_http() {
            let tier = unique("pro");
            super::over_http(instance(&tier).await, &tier).await;
        }
    };
}

#[cfg(feature = "redis")]
mod on_redis {
    use super::*;
    use rate_tier_test_support::{TEST_TIMEOUT, redis_url};
    use tower_rate_tier::RedisStorage;

    /// A limiter whose tier `tier` is on its own Redis connection.
    async fn instance(tier: &str) -> RateTier {
        let connection = ::redis::Client::open(redis_url())
            .unwrap()
            .get_connection_manager()
            .await
            .expect(
                "TRT_REDIS_URL does not answer: is the test server running?",
            );
        RateTier::builder()
            .tier(tier, plan())
            .storage(Arc::new(
                RedisStorage::new(connection).timeout(TEST_TIMEOUT),
            ))
            .build()
    }

    on_store!();
}

/// On a Redis Cluster (`cargo xtask test-cluster`: the module's name puts
/// `cluster` in every test's name), through one node: the customer's
/// buckets share their hash tag.
#[cfg(feature = "redis")]
mod on_redis_cluster {
    use super::*;
    use rate_tier_test_support::{TEST_TIMEOUT, cluster_urls};
    use tower_rate_tier::RedisStorage;

    async fn instance(tier: &str) -> RateTier {
        let url = cluster_urls(1).swap_remove(0);
        let store = RedisStorage::from_cluster_urls([url])
            .expect("a cluster store")
            .timeout(TEST_TIMEOUT);
        RateTier::builder()
            .tier(tier, plan())
            .storage(Arc::new(store))
            .build()
    }

    on_store!();
}

#[cfg(feature = "postgres")]
mod on_postgres {
    use super::*;
    use rate_tier_test_support::{TEST_TIMEOUT, env};
    use tower_rate_tier::PostgresStorage;

    /// A limiter whose tier `tier` is on its own pool, the table migrated.
    async fn instance(tier: &str) -> RateTier {
        let store = PostgresStorage::builder(&env::postgres_url())
            .unwrap()
            .timeout(TEST_TIMEOUT)
            .build()
            .unwrap();
        store.migrate().await.unwrap();
        RateTier::builder()
            .tier(tier, plan())
            .storage(Arc::new(store))
            .build()
    }

    on_store!();
}
