//! `Storage::reset` on every store: a customer's rate, window and period
//! back to full, their concurrency slots left taken, another customer's
//! buckets untouched; and, concurrent with joint decisions over two of
//! their buckets, the set reset at once (the two never disagree after).
//!
//! The Redis, Redis Cluster and PostgreSQL cases need the servers of
//! `cargo xtask test-redis` / `test-cluster` (the variables they set); without
//! them they fail, never pass silently.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use rate_tier_storage::StorageExt;
use rate_tier_storage::{
    BucketCheck, Concurrency, Decision, LimitName, MemoryStorage, Period,
    PeriodUnit, Quota, Rule, Storage, Window,
};
use rate_tier_test_support::unique;

struct Names {
    plan: LimitName,
    login: LimitName,
    exports: LimitName,
    uploads: LimitName,
}

fn names() -> Names {
    Names {
        plan: LimitName::new(unique("pro")).unwrap(),
        login: LimitName::of_limit(unique("login")).unwrap(),
        exports: LimitName::of_limit(unique("exports")).unwrap(),
        uploads: LimitName::of_limit(unique("uploads")).unwrap(),
    }
}

/// The customer's four buckets, each of a kind, each spent by one request.
fn buckets<'a>(names: &'a Names, user: &'a str) -> [BucketCheck<'a>; 4] {
    let window: Rule =
        Window::new(1, Duration::from_secs(3600)).unwrap().into();
    let period: Rule = Period::new(1, PeriodUnit::Month, 0).unwrap().into();
    let slot: Rule = Concurrency::new(1).unwrap().into();
    [
        BucketCheck::new(&names.plan, user, Quota::per_hour(1), 1).unwrap(),
        BucketCheck::of_rule(&names.login, user, window, 1).unwrap(),
        BucketCheck::of_rule(&names.exports, user, period, 1).unwrap(),
        BucketCheck::of_rule(&names.uploads, user, slot, 1)
            .unwrap()
            .lease_id(7),
    ]
}

async fn passes(store: &dyn Storage, check: BucketCheck<'_>) -> bool {
    let mut out = [Decision::default()];
    store
        .check(&[check], &mut out)
        .await
        .unwrap()
        .verdict
        .allowed
}

/// Spends every bucket of ana and bea, resets ana's: hers pass again but
/// her slot, bea's stay spent.
async fn a_reset_refills_what_it_names(store: &dyn Storage) {
    let names = names();
    let (ana, bea) = (buckets(&names, "ana"), buckets(&names, "bea"));
    for check in ana.iter().chain(&bea) {
        assert!(passes(store, *check).await, "{:?}", check.name());
        assert!(!passes(store, *check).await, "{:?} spent", check.name());
    }
    store.reset(&ana).await.unwrap();
    for check in &ana[..3] {
        assert!(passes(store, *check).await, "{:?} reset", check.name());
    }
    assert!(!passes(store, ana[3]).await, "a slot in flight stays taken");
    for check in &bea {
        assert!(!passes(store, *check).await, "bea's {:?}", check.name());
    }
    // Nothing to reset is no error.
    store.reset(&[]).await.unwrap();
    store.release(&ana[3..]).await.unwrap();
}

/// Joint decisions over ana's tier and a limit of hers, at cost 1 each,
/// while the pair is reset now and then: each decision charges both or
/// neither, and a reset clears both, so the two remaining counts end equal.
async fn a_reset_of_a_set_is_one_instant(store: Arc<dyn Storage>) {
    let names = Arc::new(names());
    let mut tasks = Vec::new();
    for task in 0..4 {
        let (store, names) = (store.clone(), names.clone());
        tasks.push(tokio::spawn(async move {
            let pair = pair(&names);
            for i in 0..50 {
                if task == 0 && i % 10 == 5 {
                    store.reset(&pair).await.unwrap();
                } else {
                    let mut out = [Decision::default(); 2];
                    store.check(&pair, &mut out).await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let pair = pair(&names);
    let mut out = [Decision::default(); 2];
    store
        .check(&[pair[0].as_peek(), pair[1].as_peek()], &mut out)
        .await
        .unwrap();
    assert_eq!(out[0].remaining, out[1].remaining, "{out:?}");
}

fn pair(names: &Names) -> [BucketCheck<'_>; 2] {
    let quota = Quota::per_hour(1_000);
    [
        BucketCheck::new(&names.plan, "ana", quota, 1).unwrap(),
        BucketCheck::new(&names.login, "ana", quota, 1).unwrap(),
    ]
}

#[tokio::test]
async fn memory_resets_a_customers_buckets() {
    a_reset_refills_what_it_names(&MemoryStorage::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_resets_a_set_at_once() {
    a_reset_of_a_set_is_one_instant(Arc::new(MemoryStorage::new())).await;
}

#[tokio::test]
async fn a_fallback_resets_both_its_stores() {
    use rate_tier_storage::FallbackStorage;
    let store =
        FallbackStorage::builder(Arc::new(MemoryStorage::new())).build();
    a_reset_refills_what_it_names(&store).await;
}

#[cfg(feature = "redis")]
mod redis_stores {
    use super::*;
    use rate_tier_storage::RedisStorage;
    use rate_tier_test_support::{TEST_TIMEOUT, cluster_urls, redis_url};

    async fn single() -> RedisStorage {
        let conn = redis::Client::open(redis_url())
            .unwrap()
            .get_connection_manager()
            .await
            .expect(
                "TRT_REDIS_URL does not answer: is the test server running?",
            );
        RedisStorage::new(conn).timeout(TEST_TIMEOUT)
    }

    #[tokio::test]
    async fn redis_resets_a_customers_buckets() {
        a_reset_refills_what_it_names(&single().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn redis_resets_a_set_at_once() {
        a_reset_of_a_set_is_one_instant(Arc::new(single().await)).await;
    }

    #[tokio::test]
    async fn redis_cluster_resets_a_customers_buckets() {
        let store = RedisStorage::from_cluster_urls(cluster_urls(3))
            .unwrap()
            .timeout(TEST_TIMEOUT);
        a_reset_refills_what_it_names(&store).await;
    }
}

#[cfg(feature = "postgres")]
mod postgres_store {
    use super::*;
    use rate_tier_storage::PostgresStorage;
    use rate_tier_test_support::postgres_url;

    async fn store() -> PostgresStorage {
        let table = unique("trt_reset").replace('-', "_");
        let store = PostgresStorage::builder(&postgres_url())
            .unwrap()
            .table(&table)
            .unwrap()
            .timeout(Duration::from_secs(5))
            .build()
            .unwrap();
        store.migrate().await.unwrap();
        store
    }

    #[tokio::test]
    async fn postgres_resets_a_customers_buckets() {
        a_reset_refills_what_it_names(&store().await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn postgres_resets_a_set_at_once() {
        a_reset_of_a_set_is_one_instant(Arc::new(store().await)).await;
    }
}
